-- joint.lua -- the joint forward+backward graph (g:joint) and its
-- partitions (j:partition): the joint graph's gradients equal eager
-- autograd's; every policy's forward then backward gives the same loss and
-- gradients, run op by op, by the reference interpreter and compiled;
-- mincut saves strictly fewer bytes than save_all where a pointwise op
-- sits between products, recompute_all only the inputs; bad input is
-- named.  Tolerances: the joint graph runs the eager kernels on the same
-- values as eager autograd (rtol 1e-5, atol 1e-6); the reference
-- interpreter and compiled kernels differ from them by float32 rounding
-- order (rtol 1e-4, atol 1e-5).
local t = require "tap"
local nn = fl.nn

local function close(a, b, rtol, atol, what)
  local ok = fl.allclose(a, b, rtol, atol)
  t.ok(ok, what)
  if not ok then t.diag(("max |a - b| = %g"):format((a - b):abs():amax():item())) end
end

-- eager autograd: the loss and the gradients of the leaves, in the
-- order the joint graph returns them (graph order of first use)
local function eager(loss_fn, params, ...)
  for _, p in ipairs(params) do p.grad = nil end
  local l = loss_fn(...)
  l:backward()
  local gs = {}
  for i, p in ipairs(params) do gs[i] = p.grad end
  return l, gs
end

-- a partition's forward, then its backward on what the forward saved
local function run_split(fw, bw, info, nres, run, inputs, nwb)
  local outs = table.pack(fw[run](fw, table.unpack(inputs)))
  local args, k = {}, nres + 1
  for _, s in ipairs(info.saved) do
    if s.node < #inputs then args[#args + 1] = inputs[s.node + 1]
    else args[#args + 1] = outs[k]; k = k + 1 end
  end
  -- (a graph run op by op also returns its write-backs' new values)
  t.ok(k - 1 == outs.n or k - 1 + (nwb or 0) == outs.n,
       "the forward returns its results, then exactly the saved values")
  return outs[1], table.pack(bw[run](bw, table.unpack(args)))
end

-- compiled: p:codegen("cpu"):run
local function compiled(g)
  local k = g:fuse():codegen("cpu")
  return {run = function(_, ...) return k:run(...) end}
end

local function check_model(name, loss_fn, params, inputs, opts)
  opts = opts or {}
  local l, gs = eager(loss_fn, params, table.unpack(inputs))
  local g = fl.capture(loss_fn, table.unpack(inputs))
  local j = g:joint()
  local outs = table.pack(j:run(table.unpack(inputs)))
  t.is(outs.n, 1 + #params, name .. ": the joint graph returns the loss and one gradient per parameter")
  close(outs[1], l, 1e-5, 1e-6, name .. ": the joint graph's loss is eager's")
  for i, p in ipairs(params) do
    close(outs[1 + i], gs[i], 1e-5, 1e-6, ("%s: the joint graph's gradient %d %s is eager autograd's"):format(name, i, t.show(p.shape)))
  end
  local saved = {}
  for _, pol in ipairs{"save_all", "mincut", "recompute_all"} do
    local fw, bw, info = j:partition{policy = pol}
    saved[pol] = info
    t.is(info.policy, pol, name .. ": info names the policy")
    local total = 0
    for _, s in ipairs(info.saved) do total = total + s.bytes end
    t.is(total, info.saved_bytes, name .. " " .. pol .. ": saved_bytes is the sum of what info.saved lists")
    for _, run in ipairs{"run", "run_reference"} do
      local tol = run == "run" and {1e-5, 1e-6} or {1e-4, 1e-5}
      local loss, grads = run_split(fw, bw, info, 1, run, inputs, #fw:writebacks())
      close(loss, l, tol[1], tol[2], ("%s %s %s: the forward's loss"):format(name, pol, run))
      local all = grads.n == #params
      for i = 1, #params do all = all and fl.allclose(grads[i], gs[i], tol[1], tol[2]) end
      t.ok(all, ("%s %s %s: the backward's %d gradients equal eager autograd's"):format(name, pol, run, #params))
    end
    if not opts.no_compile then
      local loss, grads = run_split(compiled(fw), compiled(bw), info, 1, "run", inputs, #fw:writebacks())
      close(loss, l, 1e-4, 1e-5, ("%s %s: compiled forward's loss"):format(name, pol))
      local all = grads.n == #params
      for i = 1, #params do all = all and fl.allclose(grads[i], gs[i], 1e-4, 1e-5) end
      t.ok(all, ("%s %s: the compiled backward's gradients equal eager autograd's"):format(name, pol))
    end
  end
  t.is(saved.save_all.saved_bytes, saved.mincut.eager_saved_bytes, name .. ": eager_saved_bytes is save_all's")
  t.ok(saved.mincut.saved_bytes <= saved.save_all.saved_bytes,
       ("%s: mincut saves %d B, at most save_all's %d"):format(name, saved.mincut.saved_bytes, saved.save_all.saved_bytes))
  local inputs_only = true
  for _, s in ipairs(saved.recompute_all.saved) do inputs_only = inputs_only and s.node < #inputs end
  t.ok(inputs_only and #saved.recompute_all.recomputed > 0, name .. ": recompute_all saves only inputs and recomputes")
  return j, saved
end

fl.manual_seed(3)

-- an MLP with GELU: the pointwise op between two products is recomputed
do
  local m = nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 4))
  local x, y = fl.randn(5, 8), (fl.rand(5) * 4):to("int64")
  local _, saved = check_model("MLP with GELU", function(a, b) return fl.cross_entropy(m(a), b) end,
                               m:parameters(), {x, y})
  t.ok(saved.mincut.saved_bytes < saved.save_all.saved_bytes,
       ("MLP with GELU: mincut saves strictly fewer bytes (%d) than save_all (%d)"):format(
         saved.mincut.saved_bytes, saved.save_all.saved_bytes))
  local gelu = false
  for _, r in ipairs(saved.mincut.recomputed) do gelu = gelu or r.op == "gelu" end
  t.ok(gelu, "MLP with GELU: mincut recomputes the gelu and says so")
  local product = false
  for _, s in ipairs(saved.mincut.saved) do product = product or s.why:find("product") ~= nil end
  t.ok(product, "MLP with GELU: mincut saves the product before the gelu, saying a product is never recomputed")
end

-- a 2-layer GPT (eval mode: no dropout), cross-entropy over the tokens
do
  local m = fl.models.transformer{vocab = 32, d = 16, heads = 2, layers = 2, seq = 8}
  m:eval()
  local ids, tgt = (fl.rand(2, 8) * 32):to("int64"), (fl.rand(2, 8) * 32):to("int64")
  local _, saved = check_model("GPT", function(a, b) return fl.cross_entropy(m(a):reshape(-1, 32), b:reshape(-1)) end,
                               m:parameters(), {ids, tgt})
  t.ok(saved.mincut.saved_bytes < saved.save_all.saved_bytes,
       ("GPT: mincut saves strictly fewer bytes (%d) than save_all (%d)"):format(
         saved.mincut.saved_bytes, saved.save_all.saved_bytes))
end

-- a CNN with BatchNorm in training: the running statistics are
-- write-backs the forward keeps; x's gradient through batch_stats
do
  local m = fl.models.cnn{channels = {3, 4, 8}, classes = 5, input = 8}
  local x, y = fl.randn(4, 3, 8, 8), (fl.rand(4) * 5):to("int64")
  local _, bufs = m:named_buffers()
  local rm = m:named_buffers()[bufs[1]]
  local rm0 = rm + 0
  check_model("CNN with BatchNorm (training)", function(a, b) return fl.cross_entropy(m(a), b) end,
              m:parameters(), {x, y})
  t.ok(not fl.allclose(rm, rm0, 0, 0), "CNN: the forward runs move the running statistics (" .. bufs[1] .. ")")
end

-- an input that requires grad gets its gradient too
do
  local w = fl.randn(4, 3, {requires_grad = true})
  local x = fl.randn(2, 4, {requires_grad = true})
  local f = function(a) return (a:matmul(w)):tanh():sum() end
  local g = fl.capture(f, x)
  local j = g:joint()
  local outs = table.pack(j:run(x))
  local l = f(x)
  l:backward()
  t.is(outs.n, 3, "input and parameter that require grad: two gradients")
  close(outs[2], x.grad, 1e-5, 1e-6, "the input's gradient")
  close(outs[3], w.grad, 1e-5, 1e-6, "the parameter's gradient")
end

-- tangents: a loss returned with an activation (and the activation twice),
-- the gradient reaching each an input of the backward, after the saved
-- values; every policy, eager kernels, reference and compiled, equals
-- eager autograd's d(s * loss + sum(h * T1) + sum(h * T2))/dW
do
  local m = nn.Sequential(nn.Linear(6, 8), nn.GELU(), nn.Linear(8, 3))
  local x, y = fl.randn(4, 6), (fl.rand(4) * 3):to("int64")
  local w1 = m:parameters()[1]
  local f = function(a, b)
    local h = m(a)
    return fl.cross_entropy(h, b), h, w1:sum(), h
  end
  local s, T1, T2 = fl.tensor(0.7), fl.randn(4, 3), fl.randn(4, 3)
  local params = m:parameters()
  for _, p in ipairs(params) do p.grad = nil end
  local l, h, _, h2 = f(x, y)
  local wsum = select(3, f(x, y))
  ;(l * s + (h * T1):sum() + (h2 * T2):sum() + wsum * 2):backward()
  local want = {}
  for i, p in ipairs(params) do want[i] = p.grad end
  t.raises(function() fl.capture(f, x, y):joint{tangent = true} end, "unknown option 'tangent'",
           "joint: an unknown option is named")
  local j = fl.capture(f, x, y):joint{tangents = true}
  local tangents = {s, T1, fl.tensor(2.0), T2}
  for _, pol in ipairs{"save_all", "mincut", "recompute_all"} do
    local fw, bw, info = j:partition{policy = pol}
    t.is(table.concat(info.tangents, ","), "1,2,3,4",
         pol .. ": a tangent for the loss and each other result that needs a gradient")
    for _, run in ipairs{"run", "run_reference", "compiled"} do
      local tol = run == "run" and {1e-5, 1e-6} or {1e-4, 1e-5}
      local F, B = fw, bw
      if run == "compiled" then F, B, run = compiled(fw), compiled(bw), "run" end
      local outs = table.pack(F[run](F, x, y))
      local args, k = {}, info.results + 1
      for _, sv in ipairs(info.saved) do
        if sv.input then args[#args + 1] = ({x, y})[sv.input] else args[#args + 1] = outs[k]; k = k + 1 end
      end
      for _, tn in ipairs(tangents) do args[#args + 1] = tn end
      local grads = table.pack(B[run](B, table.unpack(args)))
      local all = grads.n == #params
      for i = 1, #params do all = all and fl.allclose(grads[i], want[i], tol[1], tol[2]) end
      t.ok(all, ("tangents, %s, %s: the backward's %d gradients equal eager autograd's"):format(
           pol, F == fw and run or "compiled", #params))
    end
  end
  local sig = tostring(j):match("^[^\n]*")
  t.ok(sig:find("float32[] gradient of the loss", 1, true) and sig:find("float32[4,3] gradient of result 4", 1, true),
       "the joint graph's signature names its tangents: " .. sig)
end

-- the picture: two halves, the saved values on the cut, recomputed ops
do
  local m = nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 4))
  local x, y = fl.randn(5, 8), (fl.rand(5) * 4):to("int64")
  local j = fl.capture(function(a, b) return fl.cross_entropy(m(a), b) end, x, y):joint()
  local dir = t.tmpdir()
  local all = t.slurp(fl.draw(j, dir .. "/joint.dot"))
  local cut = t.slurp(fl.draw(j, dir .. "/mincut.dot", {partition = "mincut"}))
  t.ok(all:find("#dcebfa", 1, true) and all:find("#fde4cc", 1, true), "joint picture: forward and backward in two colours")
  t.ok(all:find("grad of m.0.weight", 1, true), "joint picture: each gradient output named for its parameter")
  t.ok(all:find("saved [5,16] 320 B", 1, true) and all:find("saved: kept from forward to backward", 1, true),
       "joint picture: the saved values marked on the edges that cross, with their bytes, and in the legend")
  local _, n_all = all:gsub("saved %[", "")
  local _, n_cut = cut:gsub("saved %[", "")
  t.ok(cut:find("recomputed by the backward", 1, true) and n_cut < n_all,
       ("joint picture, mincut: recomputed ops marked, fewer saved edges (%d) than eager's (%d)"):format(n_cut, n_all))
  t.raises(function() fl.draw(j, dir .. "/x.dot", {partition = "greedy"}) end,
           "draw: partition \"greedy\" %(expected mincut", "joint picture: an unknown policy")
  t.raises(function() fl.draw(fl.capture(m, x), dir .. "/x.dot", {partition = "mincut"}) end,
           "draw: partition= is for a joint graph", "partition= on a graph that is not a joint graph")
  -- two policies side by side, each side's saved bytes in its heading
  local _, _, sa = j:partition{policy = "save_all"}
  local _, _, mc = j:partition{policy = "mincut"}
  local both = t.slurp(fl.draw_compare(j, j, dir .. "/policies.dot", {partition = {"save_all", "mincut"}}))
  local B = fl._bytes_str
  t.ok(both:find("partition save_all: the forward keeps " .. B(sa.saved_bytes), 1, true) and
       both:find(("partition mincut: the forward keeps %s for the backward · %d ops recomputed"):format(
         B(mc.saved_bytes), #mc.recomputed), 1, true),
       ("draw_compare of save_all and mincut: each side says what it keeps (%s, %s) and recomputes"):format(
       B(sa.saved_bytes), B(mc.saved_bytes)))
  t.raises(function() fl.draw_compare(j, j, dir .. "/x.dot", {partition = {"mincut"}}) end,
           "two policy names", "draw_compare: a partition list needs both sides")
end

-- bad input
do
  local m = nn.Linear(3, 2)
  local x = fl.randn(4, 3)
  t.raises(function() fl.capture(m, x):joint() end,
           "joint: the graph's first result must be a float scalar %(the loss%), got float32%[4,2%]",
           "joint of a non-scalar result")
  local frozen = nn.Linear(3, 2)
  frozen:requires_grad_(false)
  t.raises(function() fl.capture(function(a) return frozen(a):sum() end, x):joint() end,
           "joint: no input or parameter of the graph requires grad", "joint without a leaf that requires grad")
  local g = fl.capture(function(a) return m(a):sum() end, x)
  t.raises(function() g:partition() end, "partition: not a joint graph %(make one with g:joint%(%)%)",
           "partition of a graph that is not a joint graph")
  t.raises(function() g:joint():partition{policy = "greedy"} end,
           "partition: unknown policy greedy %(expected mincut, save_all or recompute_all%)", "an unknown policy")
  t.raises(function() g:joint():partition{policy = 3} end, "partition: unknown policy 3 %(expected", "a policy of the wrong type")
  t.raises(function() g:joint():partition{polcy = "mincut"} end, "partition: unknown option 'polcy'", "an unknown option")
  -- dropout in training: the forward's mask is a value of the joint graph
  -- (x * dropout(ones)), the gradients eager autograd's for the same seed
  local d = nn.Sequential(nn.Linear(3, 3), nn.Dropout(0.5), nn.Linear(3, 2))
  local xd = fl.randn(6, 3)
  local fd = function(a) return d(a):pow(2):sum() end
  fl.manual_seed(11)
  fd(xd):backward()
  local want = {}
  for i, p in ipairs(d:parameters()) do want[i] = p.grad * 1; p.grad = nil end
  fl.manual_seed(11)
  local jd = fl.capture(fd, xd):joint()
  fl.manual_seed(11)
  local outs = table.pack(jd:run(xd))
  local okd, masked = true, false
  for i = 1, #want do okd = okd and (outs[1 + i] - want[i]):abs():amax():item() <= 1e-5 end
  for _, op in ipairs(jd:ops()) do masked = masked or op == "dropout" end
  t.ok(okd and masked, "dropout in training: the joint graph's gradients are eager's for the same seed")
  -- the session goes on: a joint graph still builds
  t.ok(g:joint():partition() ~= nil, "after the errors a partition still builds")
end

t.done()
