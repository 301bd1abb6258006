-- pipeline.lua -- fl.compile runs the pipeline the step-by-step API shows
-- (capture -> decompose -> optimize -> fuse): the same plans, kernel names
-- and traffic; conv + batch_norm folding in either pass order, with params
-- still bound by reference; fl.capture returns every result.
-- Compiled results are compared with eager ones (float32, rtol 1e-4,
-- atol 1e-5: folding and decomposing reorder the float operations).
local fl = fl or require "fuselab"
local t = require "tap"

local function close(a, b) return fl.allclose(a, b, 1e-4, 1e-5) end

fl.manual_seed(11)

-- The step-by-step route, quietly.
local function stepwise(fn, ...)
  return fl.capture(fn, ...):decompose{quiet = true}:optimize{quiet = true}:fuse()
end

-- A plan's kernels as comparable text: name, kind, traffic, fused nodes.
local function kernel_text(ks)
  local out = {}
  for i, k in ipairs(ks) do
    out[i] = ("%s %s %d [%s]"):format(k.name, k.kind, k.bytes, table.concat(k.nodes, ","))
  end
  return table.concat(out, "\n")
end

local function stats_text(p)
  local s = p:stats()
  return ("kernels %d ops %d bytes %d->%d buffers %d->%d peak %d->%d"):format(
    s.kernels, s.ops, s.bytes_before, s.bytes_after, s.buffers_before, s.buffers_after,
    s.peak_bytes_before, s.peak_bytes_after)
end

-- fl.compile against the step-by-step plan, and against eager.
local function same_pipeline(name, fn, ...)
  local cm = fl.compile(fn, {backend = "cpu"})
  local got = cm(...)
  local want = fn(...)
  t.ok(close(got, want), name .. ": compiled matches eager")
  local ref = stepwise(fn, ...)
  local plans = cm:plans()
  t.is(#plans, 1, name .. ": one compiled graph")
  t.is(kernel_text(cm:kernels()), kernel_text(ref:kernels()), name .. ": same kernels, names, bytes and nodes as step by step")
  t.is(stats_text(plans[1]), stats_text(ref), name .. ": same plan stats as step by step")
  t.is(#cm:graphs()[1]:ops(), #ref:graph():ops(), name .. ": cm:graphs() is the graph the plan was made from")
  return cm, ref
end

-- ---- CSE and the algebraic rules run inside fl.compile -------------------
local function twice(x) return (x * 1):exp() + (x * 1):exp() end
local x8 = fl.randn(8)
local cm = same_pipeline("elementwise", twice, x8)
local function count_exp(src) return select(2, src:gsub("expf%(", "")) end
local raw = fl.capture(twice, x8):fuse():codegen("cpu"):source()
-- with the preamble, so the counts compare whole sources
local whole = cm:code{preamble = true}
t.ok(count_exp(whole) < count_exp(raw), "compiled code computes exp fewer times than the unoptimized plan")
t.is(count_exp(whole), count_exp(stepwise(twice, x8):codegen("cpu"):source()), "as often as the step-by-step code")
t.is(cm:kernels()[1].name, "fused_exp_add_8", "one kernel: exp once, then the add (x * 1 and the second exp are gone)")

-- ---- models ------------------------------------------------------------
local mlp = fl.models.mlp{sizes = {16, 32, 8}, act = "gelu"}
local xm = fl.randn(4, 16)
local _, pm = same_pipeline("mlp", mlp, xm)
for _, k in ipairs(pm:kernels()) do
  t.ok(not k.name:find("^fused_mm_add_"), "mlp: matmul + bias is one linear call (" .. k.name .. ")")
end

local cnn = fl.models.cnn{channels = {3, 8, 16}, classes = 10, input = 16}
cnn:eval()
local xc = fl.randn(2, 3, 16, 16)
local cc = same_pipeline("cnn", cnn, xc)

local gpt = fl.models.transformer{vocab = 50, d = 32, heads = 4, layers = 2, seq = 8}
gpt:eval()
local ids = fl.tensor{{1, 7, 3, 9, 2, 4}, {5, 5, 0, 1, 8, 6}}
same_pipeline("transformer", gpt, ids)

-- compile cost: the passes are linear walks; reported, never failed on
do
  local g = fl.capture(gpt, ids)
  local best = math.huge
  for _ = 1, 5 do
    local t0 = fl.now()
    g:decompose{quiet = true}:optimize{quiet = true}
    best = math.min(best, fl.now() - t0)
  end
  t.diag(("transformer: decompose + optimize %.3f ms for %d ops"):format(best * 1e3, #g:ops()))
end

-- ---- conv + batch_norm folding -------------------------------------------
local function has_op(g, name)
  for _, o in ipairs(g:ops()) do if o == name then return true end end
  return false
end

-- Ops whose result has the conv output's shape: after folding only the
-- conv and the relu remain there.
local function ops_of_shape(g, ty)
  local out = {}
  for _, n in ipairs(g:nodes()) do
    if n.kind == "op" and n.type == ty then out[#out + 1] = n.op end
  end
  return table.concat(out, " ")
end

local gc = fl.capture(cnn, xc)
local want = cnn(xc)
for _, order in ipairs{"decompose first", "optimize first"} do
  local h
  if order == "decompose first" then h = gc:decompose{quiet = true}:optimize{quiet = true}
  else h = gc:optimize{quiet = true}:decompose{quiet = true} end
  t.ok(not has_op(h, "batch_norm"), "cnn, " .. order .. ": no batch_norm left")
  t.is(ops_of_shape(h, "float32[2,8,16,16]"), "conv2d relu", "cnn, " .. order .. ": the first block's activation sees only conv2d and relu")
  t.is(ops_of_shape(h, "float32[2,16,8,8]"), "conv2d relu", "cnn, " .. order .. ": the second block's too")
  t.ok(close(h:run(xc), want), "cnn, " .. order .. ": folded graph matches eager")
  t.ok(close(h:run_reference(xc), want), "cnn, " .. order .. ": and the reference interpreter")
end
do
  local names = {}
  for _, k in ipairs(cc:kernels()) do names[#names + 1] = k.name end
  names = table.concat(names, " ")
  t.ok(names:find("fused_conv2d_relu_2x8x16x16", 1, true) and names:find("fused_conv2d_relu_2x16x8x8", 1, true),
       "fl.compile(cnn): each conv kernel has only the relu as epilogue (batch norm folded)")
  t.ok(not names:find("rsqrt_mul_add_relu", 1, true), "no per-element batch-norm arithmetic on activations")
end

-- params stay bound by reference: the folded weights are computed in the
-- graph, so an in-place change after compilation is seen, without recompiling
do
  local bn, conv = cnn.modules[2], cnn.modules[1]
  local folded = gc:optimize{quiet = true}
  fl.no_grad(function()   -- parameters require grad
    bn.running_mean:add_(0.25)
    bn.running_var:mul_(2)
    bn.weight:mul_(-1.5)
    conv.weight:mul_(0.5)
    conv.bias:add_(1)
  end)
  local y = cc(xc)
  t.ok(close(y, cnn(xc)), "cnn: in-place changes to batch-norm statistics and conv weights are seen")
  t.is(cc:stats().compiles, 1, "cnn: without a recompile")
  t.ok(close(folded:run(xc), cnn(xc)), "cnn: a graph optimized before the change sees it too")
end

-- a conv whose result is smaller than its weights (a late layer at batch
-- 1): the batch norm scales the result per channel instead of the weights
-- on every run; still no batch_norm node, still bound by reference
do
  local m = nn.Sequential(nn.Conv2d(16, 32, 3, {padding = 1}), nn.BatchNorm2d(32), nn.ReLU())
  m:eval()
  local bn = m.modules[2]
  bn.running_mean:copy_(fl.randn(32) * 0.1)
  bn.running_var:copy_(fl.rand(32) + 0.5)
  fl.no_grad(bn.weight.copy_, bn.weight, fl.randn(32))   -- a parameter
  local x = fl.randn(1, 16, 2, 2)
  local g = fl.capture(m, x)
  local h, log = g:optimize{quiet = true}
  t.ok(not has_op(h, "batch_norm"), "small result: no batch_norm left")
  t.ok(log:find("result (per channel", 1, true), "small result: the log says the result is scaled")
  local cm = fl.compile(m)
  t.ok(close(cm(x), m(x)), "small result: compiled matches eager")
  bn.running_var:mul_(3)
  fl.no_grad(m.modules[1].weight.mul_, m.modules[1].weight, -0.5)
  t.ok(close(cm(x), m(x)), "small result: in-place changes are seen")
  t.is(cm:stats().compiles, 1, "small result: without a recompile")
end

-- a conv whose result is used elsewhere too is not folded (it would run twice)
do
  local c = nn.Conv2d(3, 4, 3, {padding = 1})
  local s = fl.randn(1, 4, 1, 1)
  local function f(x) local y = c(x) return y * s, y end
  local x = fl.randn(1, 3, 6, 6)
  local h = fl.capture(f, x):decompose{quiet = true}:optimize{quiet = true}
  local n = 0
  for _, o in ipairs(h:ops()) do if o == "conv2d" then n = n + 1 end end
  t.is(n, 1, "shared conv output: one conv2d, the scale not folded")
  local a, b = fl.compile(f, {backend = "cpu"})(x)
  local ea, eb = f(x)
  t.ok(close(a, ea) and close(b, eb), "shared conv output: compiled matches eager")
end

-- a per-channel scale and shift from params fold too (conv * s + t)
do
  local c = nn.Conv2d(2, 4, 3)
  local s, sh = fl.randn(4, 1, 1), fl.randn(4, 1, 1)
  local function f(x) return (c(x) * s + sh):relu() end
  local x = fl.randn(2, 2, 5, 5)
  local h = fl.capture(f, x):decompose{quiet = true}:optimize{quiet = true}
  t.is(ops_of_shape(h, "float32[2,4,3,3]"), "conv2d relu", "conv * s + t folds into the conv")
  local cf = fl.compile(f, {backend = "cpu"})
  t.ok(close(cf(x), f(x)), "and matches eager")
  s:mul_(3)
  t.ok(close(cf(x), f(x)), "an in-place change to the scale is seen")
end

-- dynamic shapes: the passes keep symbolic sizes
do
  local cd = fl.compile(mlp, {backend = "cpu", dynamic = true})
  local ok = true
  for _, b in ipairs{2, 3, 5} do
    local xb = fl.randn(b, 16)
    ok = ok and close(cd(xb), mlp(xb))
  end
  t.ok(ok, "mlp, dynamic: compiled matches eager for batch 2, 3, 5")
  t.is(cd:stats().compiles, 1, "mlp, dynamic: one compile")
  -- a reshape that is the identity only at the captured size stays
  local cr = fl.compile(function(x) return x:reshape(2, 4) * 2 end, {backend = "cpu", dynamic = true})
  t.is(table.concat(cr(fl.randn(2, 4)).shape, "x"), "2x4", "dynamic reshape: the captured size runs")
  t.raises(function() return cr(fl.randn(3, 4)) end, "reshape: shape %[2,4%] is invalid for input of size 12",
           "dynamic reshape: another size fails as in eager, not reshaped away")
end

-- ---- the CUDA code path: the lowered plans compile (NVRTC; running them
-- needs a device, which tests/lua/cuda.lua covers) --------------------------
do
  local _, why = fl.cuda_available()
  local built = why == nil or not why:find("built without CUDA", 1, true)
  local cases = {{"mlp", mlp, xm}, {"cnn", cnn, xc}, {"transformer", gpt, ids}}
  if not built then
    t.skip("built without CUDA", #cases)
  else
    for _, c in ipairs(cases) do
      local prog = fl._cuda_program(stepwise(c[2], c[3]))
      t.ok(prog:compile(), c[1] .. ": the lowered plan compiles for CUDA")
    end
  end
end

-- ---- fl.capture returns every result -------------------------------------
do
  local u = fl.randn(3)
  local w = fl.randn(3)
  local function f(x) return x + w, u, fl.full({2}, 4.5), x, w end
  local x = fl.randn(3)
  local g = fl.capture(f, x)
  local r = table.pack(g:run(x))
  local e = table.pack(f(x))
  t.is(r.n, 5, "capture: the graph returns all five results")
  t.is(#g:outputs(), 5, "capture: five outputs")
  local ok = true
  for i = 1, 5 do ok = ok and close(r[i], e[i]) end
  t.ok(ok, "capture: in order, with their values")
  t.ok(not tostring(g):find("return\n", 1, true) and tostring(g):find("return %%%d+, %%%d+, %%%d+, %%0, %%%d+"),
       "capture: the listing returns them")
  t.is(g:stats().params, 3, "capture: w (used and returned) is one param; u and the full are params")
  local p = fl.capture(function() return u end)
  t.is(#p:outputs(), 1, "capture: a function returning only an upvalue has one output")
  t.ok(close(p:run(), u), "capture: g:run returns it")
  u:add_(1)
  t.ok(close(p:run(), u), "capture: bound by reference")
  local cf = fl.compile(f, {backend = "cpu"})
  local c = table.pack(cf(x))
  ok = c.n == 5
  for i = 1, 5 do ok = ok and close(c[i], e[i]) end
  t.ok(ok, "compile: the same five results")
  local pr = table.pack(g:optimize{quiet = true}:fuse():codegen("cpu"):run(x))
  ok = pr.n == 5
  for i = 1, 5 do ok = ok and close(pr[i], e[i]) end
  t.ok(ok, "capture: the compiled graph returns them too")
  local n = fl.capture(function(x) return x * 2, 7, "s" end, x)
  t.is(#n:outputs(), 1, "capture: non-tensor results are not graph outputs")
end

-- g:diff: what a pass changed, by structure (ids shift as passes rebuild)
do
  local g = fl.capture(function(x) return (x:gelu() * 1 + 0):softmax(-1) end, fl.randn(2, 3))
  local d = g:decompose{quiet = true}
  local saved = print
  print = function() end
  local same = d:diff(d)
  local r = d:diff(d:optimize{quiet = true})
  print = saved
  t.ok(#same.added == 0 and #same.removed == 0 and same.kept == #d:nodes() - 1, "a graph against itself: nothing changed")
  local removed = table.concat(r.removed, "\n")
  t.ok(removed:find("mul%(%%%d+, %%%d+%)") and removed:find("const 1 : int64") and r.kept >= 8,
       "optimize's x * 1 shows as removed, the decomposed gelu as kept: " .. r.text)
end

t.done()
