-- Lesson 04: fusion and memory traffic.
--
-- Claim (this lesson's; how bytes are counted is doc/DESIGN.md §4b):
-- operator fusion markedly lowers memory traffic and the memory the
-- intermediates take (originally "算子融合能显著降低内存占用").  Like a
-- courier who delivers every parcel for one building in a single trip, a
-- fused kernel reads its inputs once and writes its result once, where
-- unfused ops each read and write a whole tensor: every step goes to
-- memory on its own, a fused chain goes once.
--
-- What it measures: one chain of elementwise ops ending in a row
-- reduction, planned twice -- fuse=false (one kernel per op, the
-- baseline) and fused -- and compiled both ways: kernels, bytes moved
-- and peak intermediate memory from the plans (p:stats()), and the
-- measured time of each program, with its effective bandwidth, and of
-- eager execution.  Eager runs each op as its own vectorized loop over
-- the whole tensor (tanh and sigmoid included: bench/transcendental), so
-- what the fused program gains over it is the traffic, the temporaries
-- and the per-op dispatch that fusion removes, not faster arithmetic.
--
-- Then one block of a small GPT, fused, drawn for a projector (gpt_block.png).
--
-- Run: fuselab examples/lessons/04_fusion_and_memory.lua   (about 6 s)

local fl = fl or require "fuselab"

fl.manual_seed(4)

-- A layer-norm-like body: centre, scale, squash, then a sum per row.
local function body(x, y)
  local c = x - y
  local h = (c * 0.5 + 1):tanh() * c
  return (h:sigmoid() + y):sum(-1)
end

local rows, cols = 1024, 1024               -- 4 MiB per float32 tensor
local x, y = fl.randn(rows, cols), fl.randn(rows, cols)

local g = fl.capture(body, x, y)
print("The captured graph:")
print(g)
g = g:decompose():optimize()

local unfused = g:fuse{fuse = false}
print("\nFused, with the planner's reasons:")
local fused = g:fuse{explain = true}

-- The median of 20 runs with its spread (fl.measure).
local function timed(prog)
  return fl.measure(function() prog:run(x, y) end, {runs = 20})
end

local ku, kf = unfused:codegen("cpu"), fused:codegen("cpu")
ku:compile()
kf:compile()
assert(fl.allclose(ku:run(x, y), body(x, y), 1e-4, 1e-4), "unfused program differs from eager")
assert(fl.allclose(kf:run(x, y), body(x, y), 1e-4, 1e-4), "fused program differs from eager")
local mu, mf = timed(ku), timed(kf)
local me = fl.measure(body, {args = {x, y}, runs = 10})
local tu, tf, te = mu.median_ms, mf.median_ms, me.median_ms

local su, sf = unfused:stats(), fused:stats()
local MiB, KiB = 1024 * 1024, 1024
print(("\n%-10s %8s %12s %16s %10s %10s"):format("", "kernels", "traffic MiB", "peak temps KiB", "ms", "GB/s"))
print(("%-10s %8s %12s %16s %10.3f %10s"):format("eager", "-", "-", "-", te, "-"))
print(("%-10s %8d %12.2f %16.1f %10.3f %10.1f"):format("unfused", su.kernels, su.bytes_after / MiB,
  su.peak_bytes_after / KiB, tu, su.bytes_after / (tu * 1e-3) / 1e9))
print(("%-10s %8d %12.2f %16.1f %10.3f %10.1f"):format("fused", sf.kernels, sf.bytes_after / MiB,
  sf.peak_bytes_after / KiB, tf, sf.bytes_after / (tf * 1e-3) / 1e9))

print(("\nMeasured: fusion cut memory traffic %.1fx (%.1f -> %.1f MiB) and peak temporary memory"):format(
  su.bytes_after / sf.bytes_after, su.bytes_after / MiB, sf.bytes_after / MiB))
print(("%.1f MiB -> %.1f KiB.  Times are medians:"):format(su.peak_bytes_after / MiB, sf.peak_bytes_after / KiB))
print(("  fused against unfused: %s;"):format(fl.compare_times(mf, mu, {names = {"fused", "unfused"}}).text))
print(("  fused against eager:   %s."):format(fl.compare_times(mf, me, {names = {"fused", "eager"}}).text))
if mu.noisy or mf.noisy or me.noisy then
  print("  (noisy: " .. (mf.noisy and mf.noise or mu.noisy and mu.noise or me.noise) .. ")")
end
print("(GB/s is the plan's traffic over the measured time: the unfused program")
print("moves more bytes, so it can show more GB/s and still take longer.)")

-- The same on a model people know: one transformer block of a small GPT,
-- fused, drawn for the back of the room (the rest of the model as two
-- labelled stubs; the weights and constants an op reads are lines in its
-- box).  Look at gpt_block.png: each frame is one kernel.
local gpt = fl.models.transformer{vocab = 64, d = 64, heads = 4, layers = 2, seq = 64}
local gp = fl.capture(gpt, fl.zeros({1, 32}, {dtype = "int64"})):decompose{quiet = true}:optimize{quiet = true}:fuse()
fl.draw(gp, "gpt_block.png", {block = 1, scale = "projector", title = "GPT block 1 (of blocks 0 and 1), fused"})
local gs = gp:stats()
print(("\nA 2-layer GPT (d 64, 32 tokens): %d kernels where its captured graph run op by op launches %d;"):format(
  gs.kernels, gs.kernels_before))
print(("bytes moved %.1f -> %.1f KiB.  gpt_block.png shows block 1 fused, for a projector."):format(
  gs.bytes_before / KiB, gs.bytes_after / KiB))
