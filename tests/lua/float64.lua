-- float64.lua -- the float64 dtype: created, promoted, converted, saved,
-- differentiated and compiled, computed in double throughout.
--
-- Eager float64 runs the elementwise ops through the op table's double
-- scalar forms and every other op through its reference kernel
-- (cpu/eager.c); a compiled float64 op runs alone as an extern step of the
-- same kernels (fuse/plan.c: is_f64_node).  So compiled float64 results
-- must equal the reference interpreter's exactly (tolerance 0: any float32
-- rounding on the way shows as an error of 1e-8 or more), and graphs that
-- mix float32 and float64 within the float32 tolerance of the float32
-- parts (|got - want| <= 1e-5 + 1e-4 |want|).  NumPy checks every op's
-- float64 values separately (tests/numpy/gen.py, the float64 replay).
local fl = fl or require "fuselab"
local t = require "tap"

math.randomseed(20261206)

local function f64(...) return fl.randn(...):to("float64") end
local function maxerr(a, b) return (a:to("float64") - b:to("float64")):abs():amax():item() end

-- ---- the dtype --------------------------------------------------------------
do
  local x = fl.tensor({0.1, 0.2, 0.3}, {dtype = "float64"})
  t.is(x.dtype, "float64", "fl.tensor{..., dtype = 'float64'}")
  t.is(x:tolist()[1], 0.1, "a float64 element reads back exactly (0.1)")
  t.is((x * 3):tolist()[1], 0.30000000000000004, "arithmetic in double: 0.1 * 3")
  t.is(fl.tensor({0.1}):to("float64"):item(), 0.10000000149011612, "float32 0.1 widened exactly")
  t.is(x:sum():item(), 0.1 + 0.2 + 0.3, "a sum in double")
  t.is(fl.zeros(2, {dtype = "float64"}).dtype, "float64", "zeros")
  t.is(fl.ones(2, 3, {dtype = "float64"}):sum():item(), 6.0, "ones")
  t.is(fl.randn(4, {dtype = "float64"}).dtype, "float64", "randn")
  t.is(fl.rand(4, {dtype = "float64"}).dtype, "float64", "rand")
  t.is(fl.arange(5):to("float64"):mean():item(), 2.0, "int64 -> float64 -> mean")
  t.is(fl.tensor({2.5, -2.5}, {dtype = "float64"}):to("int64"):tolist()[2], -2, "float64 -> int64 truncates")
  t.is(fl.tensor({1e300}, {dtype = "float64"}):to("float32"):item(), math.huge, "1e300 -> float32 is inf")
  t.ok(tostring(x):find("float64 tensor of size 3", 1, true), "printing names the dtype")
  -- promotion, as PyTorch's
  local a, b = fl.randn(3), f64(3)
  t.is((a + b).dtype, "float64", "float32 + float64 tensors: float64")
  t.is((b * 2.5).dtype, "float64", "float64 + a Lua number stays float64")
  t.is((a + fl.tensor(1.0, {dtype = "float64"})).dtype, "float32", "a 0-dim float64 does not widen a float32 tensor")
  t.is((fl.arange(3) + fl.tensor(1.0, {dtype = "float64"})).dtype, "float64", "a 0-dim float64 lifts int64")
  t.is(fl.arange(3):to("float64"):lt(1.5):tolist()[2], true, "comparisons give bool")
  t.is(fl.matmul(f64(2, 3), fl.randn(3, 4):to("float64")).dtype, "float64", "matmul")
  t.is(fl.softmax(f64(2, 3), 2).dtype, "float64", "softmax")
end

-- ---- precision: what float32 cannot hold ------------------------------------
do
  -- a Lua number beside a float64 tensor is used in double (PyTorch's
  -- Python float): 0.1 is not float32's 0.10000000149
  local one = fl.ones(4, {dtype = "float64"})
  t.is((one * 0.1):tolist()[1], 0.1, "float64 * 0.1 uses the number in double")
  t.is((0.1 + one - one):tolist()[2], (0.1 + 1) - 1, "0.1 + 1 - 1 as Lua computes it")
  t.is(fl.where(one:gt(0), 0.1, one):tolist()[3], 0.1, "fl.where's number operands too")
  t.is((fl.ones(2) * 0.1):tolist()[1], 0.10000000149011612, "beside float32 a number is float32's")
  -- a long sum of 0.1 in double: 1e5 * 0.1 to 1e-9
  local s = fl.full({100000}, 0.1, {dtype = "float64"}):sum():item()
  t.ok(math.abs(s - 10000) < 1e-6, ("sum of 100000 x 0.1 = %.12g"):format(s))
  -- the variance of values 1e-8 apart around 1: 1e-16 in double, 0 in float32
  local x = fl.tensor({1e-8, 2e-8, 3e-8}, {dtype = "float64"}) + 1
  local v64, v32 = x:var():item(), x:to("float32"):var():item()
  t.ok(math.abs(v64 - 1e-16) < 1e-22, ("var of 1 + 1e-8 k in double: %.10g"):format(v64))
  t.ok(v32 == 0, "and float32 cannot tell them apart (the check can fail)")
end

-- ---- compiled: equal to the reference interpreter ---------------------------
local function ref_and_compiled(name, f, args, exact)
  local g = fl.capture(f, table.unpack(args))
  local want = table.pack(g:run_reference(table.unpack(args)))
  local p = g:decompose{quiet = true}:optimize{quiet = true}:fuse()
  local got = table.pack(p:codegen("cpu"):run(table.unpack(args)))
  local eager = table.pack(f(table.unpack(args)))
  local worst, worst_e = 0, 0
  for i = 1, want.n do
    if got[i].dtype ~= want[i].dtype then
      t.ok(false, ("%s: output %d is %s, want %s"):format(name, i, got[i].dtype, want[i].dtype))
      return
    end
    worst = math.max(worst, maxerr(got[i], want[i]))
    worst_e = math.max(worst_e, maxerr(eager[i], want[i]))
  end
  if exact then
    t.ok(worst == 0 and worst_e == 0, ("%s: compiled and eager equal the reference exactly " ..
         "(max err %.3g, %.3g)"):format(name, worst, worst_e))
  else
    local ok = true
    for i = 1, want.n do ok = ok and fl.allclose(got[i], want[i], 1e-4, 1e-5) end
    t.ok(ok, ("%s: within float32's tolerance of the reference (max err %.3g)"):format(name, worst))
  end
  return p
end

local cases = {
  {"mlp tanh", function(x, w1, w2) return fl.tanh(x:matmul(w1)):matmul(w2) end,
   function(n) return {f64(n, 8), f64(8, 16), f64(16, 3)} end},
  {"softmax(gelu(x) * 2 + 1)", function(x) return fl.softmax(fl.gelu(x) * 2 + 1, 2) end,
   function(n) return {f64(n, 7)} end},
  {"layer_norm then sum over rows", function(x, w, b) return fl.layer_norm(x, {5}, w, b):sum(1) end,
   function(n) return {f64(n, 5), f64(5), f64(5)} end},
  {"transposed views and broadcasting", function(x, y) return (x:transpose(1, 2) * y):exp():amax(2) end,
   function(n) return {f64(6, n), f64(n, 1)} end},
  {"conv2d + relu + max_pool", function(x, w)
     return fl.max_pool2d(fl.relu(fl.conv2d(x, w, nil, {padding = 1})), 2) end,
   function(n) return {f64(1, 2, n + 3, n + 3), f64(3, 2, 3, 3)} end},
  {"log_softmax, cumsum, where", function(x)
     local l = fl.log_softmax(x, 2)
     return fl.where(x:gt(0), l, fl.cumsum(x, 2)) end,
   function(n) return {f64(n, 4)} end},
  {"reductions: var, mean, amin", function(x) return x:var(2) + x:mean(1):sum() - x:amin() end,
   function(n) return {f64(n, 9)} end},
}
for _, c in ipairs(cases) do
  for _, n in ipairs{1, 3, 17} do
    ref_and_compiled(("%s, n = %d"):format(c[1], n), c[2], c[3](n), true)
  end
end

-- a graph that mixes float32 (fused, generated C) with float64 (extern steps)
do
  local f = function(x, y)
    local a = fl.tanh(x * 2 + 1):sum(2)           -- float32, one fused kernel
    local b = (a:to("float64") * y):exp()          -- float64
    return b, fl.relu(x) * 3                       -- a float64 and a float32 output
  end
  local args = {fl.randn(5, 6), f64(5)}
  ref_and_compiled("float32 and float64 in one graph", f, args, false)
  local g = fl.capture(f, table.unpack(args))
  local p = g:fuse()
  local f64node = {}
  for _, nd in ipairs(g:nodes()) do if nd.type:find("^float64") then f64node[nd.id] = true end end
  local fused32, alone64, said = false, next(f64node) ~= nil, false
  for _, k in ipairs(p:kernels()) do
    local any64 = false
    for _, id in ipairs(k.nodes) do any64 = any64 or f64node[id] end
    if #k.nodes > 1 and not any64 then fused32 = true end
    if any64 and (#k.nodes ~= 1 or k.kind ~= "extern") then alone64 = false end
  end
  for _, d in ipairs(p:decisions()) do
    if not d.fused and d.reason:find("float64") then said = true end
  end
  t.ok(fused32, "the float32 part still fuses")
  t.ok(said, "a float64 op's refusal says why (float64 runs op by op in double)")
  t.ok(alone64, "float64 ops run alone")
end

-- fl.compile: one compile for every size, results equal eager's exactly
do
  local f = function(x, w) return fl.softmax(x:matmul(w), 2):sum(1) end
  local cf = fl.compile(f, {dynamic = true})
  local w = f64(8, 4)
  local worst = 0
  for _, n in ipairs{2, 5, 11, 32} do
    local x = f64(n, 8)
    worst = math.max(worst, maxerr(cf(x, w), f(x, w)))
  end
  t.is(worst, 0, "fl.compile of float64 equals eager at four sizes")
  t.is(cf:stats().compiles, 1, "with one compile")
end

-- ---- autograd ------------------------------------------------------------------
do
  local x = f64(3, 4):requires_grad_()
  local w = f64(4, 2):requires_grad_()
  local y = fl.tanh(x:matmul(w)):pow(2):sum()
  y:backward()
  t.is(x.grad.dtype, "float64", "gradients of float64 leaves are float64")
  -- d/dw sum(tanh(xw)^2) = x^T (2 tanh(xw) (1 - tanh^2(xw))), in double
  local th = fl.tanh(x:detach():matmul(w:detach()))
  local want = x:detach():transpose(1, 2):matmul(th * 2 * (1 - th * th))
  t.ok(maxerr(w.grad, want) < 1e-14, ("the gradient equals its closed form to 1e-14 (%.3g)"):format(
    maxerr(w.grad, want)))
  -- central differences at h = 1e-6 in double: agreement to 1e-8
  local xl = x:detach()
  local function loss(wv) return fl.tanh(xl:matmul(wv)):pow(2):sum():item() end
  local wl, g, worst = w:detach(), w.grad:reshape(-1):tolist(), 0
  for i = 1, 8 do
    local e = fl.zeros(8, {dtype = "float64"})
    e[i] = 1e-6
    local d = (loss(wl + e:reshape(4, 2)) - loss(wl - e:reshape(4, 2))) / 2e-6
    worst = math.max(worst, math.abs(d - g[i]))
  end
  t.ok(worst < 1e-8, ("central differences agree to 1e-8 (%.3g)"):format(worst))
end

-- ---- files -----------------------------------------------------------------------
do
  local dir = os.tmpname()
  os.remove(dir)
  local x = fl.tensor({0.1, 1e-300, -1e300, 1 / 3}, {dtype = "float64"}):reshape(2, 2)
  fl.save(x, dir .. ".npy")
  local y = fl.load(dir .. ".npy")
  t.ok(y.dtype == "float64" and maxerr(x, y) == 0, "fl.save / fl.load of float64 is exact ('<f8')")
  os.remove(dir .. ".npy")
  fl.save_safetensors({w = x}, dir .. ".safetensors")
  local back = fl.load_safetensors(dir .. ".safetensors")
  t.ok(back.w.dtype == "float64" and maxerr(back.w, x) == 0, "safetensors F64 round trip is exact")
  os.remove(dir .. ".safetensors")
end

t.done()
