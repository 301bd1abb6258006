-- Lesson 09: training, compiled as AOTAutograd compiles it.
--
-- Claim (doc/DESIGN.md §3, "Step by step"): compiled training is the same
-- training.  The forward and the backward of a loss are one joint graph
-- whose backward half is the op table's derivative rules, and its
-- gradients are eager autograd's; the partitioner then decides what the
-- forward keeps for the backward -- eager autograd keeps every value a
-- rule reads, a minimum cut keeps fewer bytes by recomputing cheap
-- pointwise ops -- and a model trained with the compiled halves follows
-- the eager loss curve step for step.
--
-- What it measures: an MLP 64-128-10 with GELU on the UCI handwritten
-- digits (examples/data), trained for 3 epochs eagerly and again, from
-- the same weights, with a step compiled from its joint graph; the two
-- loss curves compared (they can differ: a wrong rule or a wrong cut
-- would show) and the test accuracy after each; the bytes each policy
-- saves and what mincut recomputes and why; both steps timed (medians
-- with their spread); the joint graph drawn into training/.  Then a small
-- GPT's joint graph: what its backward needs and what a cut saves.  Last,
-- the same training through fl.compile of the loss, in one line; and the
-- whole step, optimizer too, in one fl.compile.
--
-- Run: fuselab examples/lessons/09_training.lua   (about 10 s; the first
-- run compiles the kernels)

local fl = fl or require "fuselab"
local nn = fl.nn

local here = (arg and arg[0] or ""):match("^(.*)/[^/]*$") or "."
local data = here .. "/../data"
if not io.open(data .. "/digits.lua") then data = (os.getenv("FUSELAB_SRC") or ".") .. "/examples/data" end
local Xtr, Ytr, Xte, Yte = dofile(data .. "/digits.lua")(data)
local B = 64
local nbatch = Xtr.shape[1] // B          -- full batches: one shape, one compile

local function model_at_start()
  fl.manual_seed(9)
  return nn.Sequential(nn.Linear(64, 128), nn.GELU(), nn.Linear(128, 10))
end
local function accuracy(m)
  return fl.no_grad(function() return m(Xte):argmax(2):eq(Yte):to("float32"):mean():item() end)
end

-- 1. Eager training: forward, cross-entropy, backward, AdamW.
local function train(m, step, epochs)
  local opt = fl.optim.AdamW(m:parameters(), {lr = 3e-3})
  local curve = {}
  for _ = 1, epochs do
    local total = 0
    for b = 0, nbatch - 1 do
      local x, y = Xtr:narrow(1, b * B + 1, B), Ytr:narrow(1, b * B + 1, B)
      opt:zero_grad()
      total = total + step(m, x, y):item()
      opt:step()
    end
    curve[#curve + 1] = total / nbatch
  end
  return curve
end
local function eager_step(m, x, y)
  local loss = fl.cross_entropy(m(x), y)
  loss:backward()
  return loss
end
local me = model_at_start()
local curve_e = train(me, eager_step, 3)
print(("1. eager: %d steps of %d images; loss per epoch %s; test accuracy %.1f %%"):format(
  3 * nbatch, B, table.concat((function() local s = {} for i, v in ipairs(curve_e) do s[i] = ("%.4f"):format(v) end return s end)(), " "),
  100 * accuracy(me)))

-- 2. The joint graph: the loss captured once, its backward appended from
-- each op's derivative rule (graph/ops.def's grad column).
local mj = model_at_start()
local x0, y0 = Xtr:narrow(1, 1, B), Ytr:narrow(1, 1, B)
local loss_fn = function(a, b) return fl.cross_entropy(mj(a), b) end
local j = fl.capture(loss_fn, x0, y0):joint()
local outs = table.pack(j:run(x0, y0))
local l = loss_fn(x0, y0)
l:backward()
local worst = 0
for i, p in ipairs(mj:parameters()) do
  worst = math.max(worst, (outs[1 + i] - p.grad):abs():amax():item() / p.grad:abs():amax():item())
end
print(("2. joint graph: %d nodes; it returns the loss and %d gradients, which differ from"):format(
  j:stats().nodes, outs.n - 1))
print(("   eager autograd's by at most %.1g of their largest (the same rules, the same kernels)"):format(worst))
assert(worst <= 1e-5, "the joint graph's gradients differ from eager autograd's")

-- 3. What the forward keeps for the backward, three ways.
print("3. partitions: the bytes the forward keeps for the backward")
local parts = {}
for _, policy in ipairs{"save_all", "mincut", "recompute_all"} do
  local fw, bw, info = j:partition{policy = policy}
  parts[policy] = {fw = fw, bw = bw, info = info}
  print(("   %-14s saves %6d B in %d values, recomputes %2d ops"):format(
    policy, info.saved_bytes, #info.saved, #info.recomputed))
end
local cut = parts.mincut.info
for _, s in ipairs(cut.saved) do print(("     mincut keeps %-28s %6d B: %s"):format(s.name, s.bytes, s.why)) end
for i = 1, math.min(3, #cut.recomputed) do print("     and recomputes " .. cut.recomputed[i].reason) end
assert(cut.saved_bytes < parts.save_all.info.saved_bytes, "mincut keeps no fewer bytes than save_all")
os.execute("mkdir -p training")
fl.draw(j, "training/joint.svg", {title = "the joint graph: what eager autograd keeps"})
fl.draw(j, "training/joint_mincut.svg", {partition = "mincut", title = "the minimum cut: kept, recomputed"})

-- 4. Train again from the same weights with the halves compiled: the
-- forward returns the loss and what it saved, the backward takes the
-- saved values and returns the gradients.
local fwk, bwk = parts.mincut.fw:fuse():codegen("cpu"), parts.mincut.bw:fuse():codegen("cpu")
local mc = model_at_start()
-- the captured graph reads the parameters of mj by reference: copy mc's
-- start into them and train mj's through the compiled step
local mcp, mjp = mc:parameters(), mj:parameters()
fl.no_grad(function() for i, p in ipairs(mjp) do p:copy_(mcp[i]) end end)
local function compiled_step(_, x, y)
  local o = table.pack(fwk:run(x, y))
  local args, k = {}, 2
  for _, s in ipairs(cut.saved) do
    if s.node < 2 then args[#args + 1] = ({x, y})[s.node + 1] else args[#args + 1] = o[k]; k = k + 1 end
  end
  local grads = table.pack(bwk:run(table.unpack(args)))
  for i, p in ipairs(mjp) do p.grad = grads[i] end
  return o[1]
end
local curve_c = train(mj, compiled_step, 3)
local gap = 0
for i = 1, #curve_e do gap = math.max(gap, math.abs(curve_c[i] - curve_e[i])) end
print(("4. compiled (mincut): loss per epoch %s; test accuracy %.1f %%"):format(
  table.concat((function() local s = {} for i, v in ipairs(curve_c) do s[i] = ("%.4f"):format(v) end return s end)(), " "),
  100 * accuracy(mj)))
print(("   largest difference from the eager curve: %.2g"):format(gap))
assert(gap <= 1e-5, "the compiled training's loss curve left the eager one")

-- 5. Time one step each way: medians with their spread.
local xb, yb = Xtr:narrow(1, 1, B), Ytr:narrow(1, 1, B)
local te = fl.measure(function() eager_step(me, xb, yb) end, {runs = 30})
local tc = fl.measure(function() compiled_step(mj, xb, yb) end, {runs = 30})
print(("5. a step without the optimizer: eager %s, compiled %s"):format(tostring(te), tostring(tc)))
print("   " .. fl.compare_times(tc, te, {names = {"compiled", "eager"}}).text)

-- 6. A small GPT (without dropout: a dropout's mask is one more saved
-- value, drawn by the forward): what its backward needs.
fl.manual_seed(9)
local gpt = fl.models.transformer{vocab = 32, d = 32, heads = 2, layers = 2, seq = 16}
local ids = (fl.rand(4, 16) * 32):to("int64")
local jg = fl.capture(function(a, b) return fl.cross_entropy(gpt(a):reshape(-1, 32), b:reshape(-1)) end,
                      ids, ids):joint()
local sa, mc2 = select(3, jg:partition{policy = "save_all"}), select(3, jg:partition{policy = "mincut"})
print(("6. a 2-layer GPT: eager autograd would keep %d B; a minimum cut keeps %d B (%.0f %% less),"):format(
  sa.saved_bytes, mc2.saved_bytes, 100 * (1 - mc2.saved_bytes / sa.saved_bytes)))
local kinds, seen = {}, {}
for _, r in ipairs(mc2.recomputed) do
  if not seen[r.op] then seen[r.op] = true; kinds[#kinds + 1] = r.op end
end
print(("   recomputing %d cheap ops in the backward: %s"):format(#mc2.recomputed, table.concat(kinds, " ")))
-- 7. All of sections 2 to 4 in one line, as torch.compile does it: fl.compile
-- of the loss.  In grad mode, with parameters that require grad, the call
-- runs the compiled forward, and loss:backward() the compiled backward.
local mf = model_at_start()
local loss_of = fl.compile(function(x, y) return fl.cross_entropy(mf(x), y) end)
local curve_f = train(mf, function(_, x, y)
  local loss = loss_of(x, y)
  loss:backward()
  return loss
end, 3)
local gap_f, sf = 0, loss_of:stats()
for i = 1, #curve_e do gap_f = math.max(gap_f, math.abs(curve_f[i] - curve_e[i])) end
print(("7. fl.compile of the loss: loss per epoch %s; test accuracy %.1f %%"):format(
  table.concat((function() local s = {} for i, v in ipairs(curve_f) do s[i] = ("%.4f"):format(v) end return s end)(), " "),
  100 * accuracy(mf)))
print(("   %d compiled steps, %d forward/backward pair; its backward: %d kernels, the forward keeps %d B;"):format(
  sf.training_calls, sf.backward_graphs, sf.backward_kernels, sf.saved_bytes))
print(("   largest difference from the eager curve: %.2g"):format(gap_f))
assert(gap_f <= 1e-5 and sf.backward_graphs == 1, "fl.compile's training left the eager curve")

-- 8. The whole step in one fl.compile, the optimizer too.  backward() and
-- opt:step() are graph breaks: the segment that computes the loss runs
-- its compiled pair, and the step its compiled update, one kernel per
-- parameter that writes the weight and Adam's two averages in place.  Its
-- kernels round a multiply-add once where the eager update rounds twice,
-- so the curve moves off eager's by a few float32 units.
local mw = model_at_start()
local optw = fl.optim.AdamW(mw:parameters(), {lr = 3e-3})
local whole = fl.compile(function(x, y)
  optw:zero_grad()
  local loss = fl.cross_entropy(mw(x), y)
  loss:backward()
  optw:step()
  return loss
end)
local curve_w = {}
for _ = 1, 3 do
  local total = 0
  for b = 0, nbatch - 1 do
    total = total + whole(Xtr:narrow(1, b * B + 1, B), Ytr:narrow(1, b * B + 1, B)):item()
  end
  curve_w[#curve_w + 1] = total / nbatch
end
local gap_w, sw = 0, whole:stats()
for i = 1, #curve_e do gap_w = math.max(gap_w, math.abs(curve_w[i] - curve_e[i])) end
local upd = optw:compiled()[1].fn:stats()
print(("8. the whole step compiled: loss per epoch %s; test accuracy %.1f %%"):format(
  table.concat((function() local s = {} for i, v in ipairs(curve_w) do s[i] = ("%.4f"):format(v) end return s end)(), " "),
  100 * accuracy(mw)))
print(("   %d graph breaks (%s; %s), %d pair, an update of %d kernels for %d parameters run %d times;"):format(
  sw.graph_breaks, sw.break_reasons[1].reason, sw.break_reasons[2].reason, sw.backward_graphs, upd.kernels,
  #mw:parameters(), upd.calls))
print(("   largest difference from the eager curve: %.2g"):format(gap_w))
assert(gap_w <= 1e-6 and sw.backward_graphs == 1 and upd.compiles == 1, "the whole compiled step left the eager curve")

print("\nPictures written to training/: joint.svg (what eager keeps), joint_mincut.svg (the cut)")
