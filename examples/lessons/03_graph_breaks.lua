-- Lesson 03: graph breaks -- what breaks, what resumes, what to rewrite.
--
-- Claim (this lesson's; graph breaks and their resumption are
-- doc/DESIGN.md §2, fl.compile): capture turns the code into one whole
-- flow chart (originally "将分散的指令变成整体流程图") that the compiler
-- optimizes as a
-- whole.  Code that needs a concrete value in Lua (item() in an if)
-- cannot be drawn into the chart: the graph breaks into segments.  An
-- in-place update can be drawn: it becomes pure ops plus a write-back
-- into the tensor's storage at the graph's end (AOTAutograd's
-- functionalization); only a write the chart cannot express (through a
-- strided slice) still breaks.  fl.compile then works as Dynamo does: each segment is a
-- compiled graph with its own guards, and the Lua between them runs on
-- every call.  A later call does not trace again: the Lua body runs, each
-- op is checked against the recorded segment (same op, same inputs, same
-- shapes), and the compiled segment runs at the break.  Taking the other
-- side of the if records that segment once more (a recompile).  What a
-- break still costs: the Lua runs, and the segments fuse apart.  Next to
-- a transformer block that is small; on small tensors (the in-place
-- example) it is most of the time, and one graph wins it.
--
-- What it measures: a transformer block followed by a data-dependent
-- decision in Lua (a number read with item()): the graphs and the break
-- fl.explain finds, the segments fl.compile records and replays (traces,
-- replays, recompiles), and median times of eager, compiled-with-break
-- and the fl.where rewrite; then in-place writes: add_ on a tensor and
-- a fill_ through a narrow view (captured: one graph, its write-back in
-- the listing) against a fill_ through a strided slice (a break).
--
-- Run: fuselab examples/lessons/03_graph_breaks.lua   (about 5 s)

local fl = fl or require "fuselab"

fl.manual_seed(3)

local D, HEADS, VOCAB = 64, 4, 128
local block = nn.TransformerBlock(D, HEADS)
local head = nn.Linear(D, VOCAB)
-- inference: no autograd tape in the eager runs the compiled ones are timed against
block:requires_grad_(false)
head:requires_grad_(false)

-- 1. A block, then a decision in Lua: rescale the hidden state when its
-- mean magnitude is large.  item() hands Lua a number: graph break.
local function step(x)
  local h = block(x)                        -- segment 1: the block
  local m = h:abs():mean():item()           -- graph break here
  if m > 0.9 then h = h * (0.9 / m) end     -- Lua chooses a side
  return head(h):softmax(-1)                -- segment 2
end

-- The same as tensor ops: both sides are computed and fl.where picks.
local function step_where(x)
  local h = block(x)
  local m = h:abs():mean()
  h = fl.where(m:gt(0.9), h * (0.9 / m), h)
  return head(h):softmax(-1)
end

-- 2. In-place writes: captured where the graph can express them.
local last_row = fl.zeros(1, 64)            -- state the step keeps (a weight)
local function residual_inplace(x)
  local h = (x * 0.5):sigmoid()
  h:add_(x)                                 -- in place: captured
  h:narrow(2, 1, 8):fill_(0)                -- through a view: captured
  last_row:copy_(h:narrow(1, 1, 1))         -- into a weight: a write-back
  return h:relu()
end

local function residual_strided(x)
  local h = (x * 0.5):sigmoid()
  h:add_(x)
  h:slice(2, 1, 16, 2):fill_(0)             -- through a strided slice: a break
  last_row:copy_(h:narrow(1, 1, 1))
  return h:relu()
end

-- fl.explain without its printout: the numbers only.
local function explain(fn, x)
  local saved = print
  print = function() end
  local r = fl.explain(fn, x)
  print = saved
  return r
end

-- Medians (and interquartile ranges) in us of each function in fns, rounds
-- interleaved so a noisy neighbour slows all of them alike; each is
-- fl.measure's summary of its rounds (.t, in ms), which says when it is noisy.
local function timings(fns, x, rounds, calls)
  local t = {}
  for i, f in ipairs(fns) do
    t[i] = {}
    for _ = 1, 3 do f(x) end                -- warm: compiles happen here
  end
  for _ = 1, rounds do
    for i, f in ipairs(fns) do
      local t0 = fl.now()
      for _ = 1, calls do f(x) end
      t[i][#t[i] + 1] = (fl.now() - t0) / calls * 1e3
    end
  end
  local out = {}
  for i = 1, #fns do
    local m = fl.measure(t[i])
    out[i] = {t = m, med = m.median_ms * 1e3, lo = m.q1_ms * 1e3, hi = m.q3_ms * 1e3}
  end
  return out
end

local function close(a, b) return fl.allclose(a, b, 1e-4, 1e-5) end

-- ---- 1. the transformer step --------------------------------------------
local x = fl.randn(2, 16, D)                -- batch 2, 16 tokens
local loud = x * 3                          -- a larger hidden state: the other side
print("== a TransformerBlock, then item() in an if  ->  fl.where")
local e1, e2 = explain(step, x), explain(step_where, x)
for _, b in ipairs(e1.break_reasons) do
  print(("  break: %s\n    at %s\n    hint: %s"):format(b.reason, b.where, b.hint))
end
print(("  fl.explain: %d graphs, %d break, %d ops before; %d graph, %d breaks after"):format(
  e1.graph_count, e1.graph_break_count, e1.op_count, e2.graph_count, e2.graph_break_count))

local cm, cw = fl.compile(step), fl.compile(step_where)
local function counts(what)
  local s = cm:stats()
  print(("  %-34s traces %d  compiles %d  replays %2d  recompiles %d  segment hits %2d"):format(
    what, s.traces, s.compiles, s.replays, s.recompiles, s.cache_hits))
end
assert(close(cm(x), step(x)), "compiled step differs from eager")
counts("first call (traced, 2 segments):")
for _ = 1, 5 do assert(close(cm(x), step(x)), "replayed step differs from eager") end
counts("5 more calls (replayed):")
assert(close(cm(loud), step(loud)), "the other side differs from eager")
counts("the other side of the if:")
for _, input in ipairs{x, loud, x, loud} do
  assert(close(cm(input), step(input)), "compiled step differs from eager")
  assert(close(cw(input), step_where(input)), "the rewrite differs from eager")
  assert(close(step(input), step_where(input)), "the rewrite changes the result")
end
counts("both sides again (no trace):")
local s = cm:stats()
print("  recompiled because: " .. tostring(s.recompile_reasons[1]))

local tm = timings({step, cm, cw}, x, 15, 10)
print(("  %-26s %12s %22s"):format("median of 15 x 10 calls", "us per call", "spread (IQR)"))
for i, name in ipairs{"eager", "compiled, 1 break", "compiled fl.where rewrite"} do
  print(("  %-26s %12.1f %10.1f - %9.1f"):format(name, tm[i].med, tm[i].lo, tm[i].hi))
end
print(("  compiled with the break against eager: %s"):format(
  fl.compare_times(tm[2].t, tm[1].t, {names = {"compiled with the break", "eager"}}).text))
print(("  the rewrite against eager: %s"):format(
  fl.compare_times(tm[3].t, tm[1].t, {names = {"the rewrite", "eager"}}).text))
print(("  the rewrite against the break: %s\n"):format(
  fl.compare_times(tm[3].t, tm[2].t, {names = {"the rewrite", "the version with the break"}}).text))

-- ---- 2. in-place writes -----------------------------------------------------
print("== h:add_(x); h:narrow(2, 1, 8):fill_(0)   against   h:slice(2, 1, 16, 2):fill_(0)")
local v = fl.randn(64, 64)
local r1, r2 = explain(residual_inplace, v), explain(residual_strided, v)
print(("  narrow view: %d graph(s), %d break(s); the graph ends with its write-back:"):format(
  r1.graph_count, r1.graph_break_count))
for line in tostring(fl.capture(residual_inplace, v)):gmatch("[^\n]+") do
  if line:find("^  write") then print("   " .. line) end
end
for _, b in ipairs(r2.break_reasons) do
  print(("  strided slice: break: %s\n    at %s\n    hint: %s"):format(b.reason, b.where, b.hint))
end
local c1, c2 = fl.compile(residual_inplace), fl.compile(residual_strided)
assert(close(c1(v), residual_inplace(v)) and close(c2(v), residual_strided(v)), "compiled differs from eager")
local tr = timings({residual_inplace, c1, c2}, v, 9, 20)
print(("  %-14s %8s %8s %9s %22s"):format("", "graphs", "breaks", "kernels", "median us per call"))
print(("  %-14s %8d %8d %9d %22.1f"):format("narrow view", r1.graph_count, r1.graph_break_count, c1:stats().kernels, tr[2].med))
print(("  %-14s %8d %8d %9d %22.1f"):format("strided slice", r2.graph_count, r2.graph_break_count, c2:stats().kernels, tr[3].med))
print(("  (eager: %.1f us); one graph against the break: %s\n"):format(tr[1].med,
  fl.compare_times(tr[2].t, tr[3].t, {names = {"the captured write", "the break"}}).text))

-- the conclusion follows the verdict: a share of the time only when the
-- difference is beyond the noise
local vw = fl.compare_times(tm[3].t, tm[2].t, {names = {"the fl.where rewrite", "the version with the break"}})
print(("Measured: the block's break splits it into %d compiled segments; after the first call of each side, "
  .. "calls replay them without tracing (%d traces in %d calls); the fl.where rewrite is one graph: %s."):format(
  e1.graph_count, cm:stats().traces, cm:stats().calls, vw.text))
