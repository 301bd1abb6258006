-- autograd.lua -- every derivative rule of the op table (graph/grad.c)
-- against finite differences, some against closed forms, and the tape's
-- bookkeeping and errors (graph/autograd.c, scripting/lfl_autograd.c).
--
-- The file runs twice: in float32 (below), and in float64 through
-- autograd64.lua (AUTOGRAD_DTYPE = "float64": every case's data, the same
-- check at H = 1e-3, ULPS = 2^-50, TOL = 1e-9, PyTorch's gradcheck in
-- double; the sections about float32 and float16 themselves run once).
--
-- Finite differences, in float32, directional:
-- per case f(x) = sum(op(x, ...) * R) with a fixed random R, summed in Lua
-- doubles from the float32 outputs; per input x a random direction V
-- (uniform in [-1, 1]) and a step s = H * max(RMS of x, 1/4), H = 2e-2
-- (distinct() inputs and cases near jumps: H times a fixed scale).  f is
-- evaluated at x +- s V and x +- s/2 V; d1 and d2 are those steps as
-- float32 rounded them (half the difference of the two points, read
-- back), and n1, n2 the halves of f's differences.  Richardson's
-- combination cancels the cubic (truncation) terms of both central
-- differences: n1 - 8 n2 = <grad, d1 - 8 d2> + O(s^5).  So
--   numeric   n = (n1 - 8 n2) / (-3 s)
--   analytic  a = <x.grad, d1 - 8 d2> / (-3 s)       (~ <x.grad, V>)
--   |a - n| <= TOL * (S + |n|) + E
-- with S = sum |x.grad * (d1 - 8 d2)| / 3s (the size of a's terms) and E =
-- ULPS * (sum |out * R| at the four points, weighted as n1 - 8 n2) / 3s:
-- the rounding of f's float32 outputs, ULPS = 2^-21 (4 units in the last
-- place) of each term.  TOL = 1e-5.  What is left after the cancellation
-- is that rounding, which is what bounds the check: over 40 seeds of the
-- data the worst |a - n| is under a quarter of the bound (the "worst" line
-- says it for this run), and the bound comes to 1e-4 to 1e-3 of the
-- gradient's size (a rule constant off by 2e-4 to 1e-3 fails: erf's
-- 2/sqrt(pi), sqrt's 2).  Inputs stay away from kinks by more than the step
-- (relu and abs at 0, clamp at its bounds, max ties, fmod's jumps); ties,
-- NaN and the values at kinks are checked against PyTorch's closed forms.
--
-- Closed forms computed here (exp, mul, sum, mean, matmul, to, dropout,
-- pow at 0, amax/maximum ties, pools, embedding, gather) must agree to
-- CLOSE = 1e-5 relative: |got - want| <= 1e-5 * max(|want|, 1).
--
-- Coverage: ops.def ($FUSELAB_SRC/graph/ops.def) is read, and every op
-- with a derivative rule must appear on the tape of a passing case (ops
-- are read off grad_fn and next_functions, not claimed by the case);
-- every op marked gr_none must give a result that does not require grad.
local fl = fl or require "fuselab"
local t = require "tap"

local DT = rawget(_G, "AUTOGRAD_DTYPE") or "float32"
local F64 = DT == "float64"
local H, TOL, ULPS, CLOSE = 2e-2, 1e-5, 2^-21, 1e-5
if F64 then H, TOL, ULPS, CLOSE = 1e-3, 1e-9, 2^-50, 1e-12 end

-- the data are fixed; FUSELAB_AUTOGRAD_SEED draws others (every seed must pass)
math.randomseed(tonumber(os.getenv("FUSELAB_AUTOGRAD_SEED") or "") or 20261205)

---------------------------------------------------------------------------
-- data, drawn in Lua (math.random with a fixed seed): every value known
---------------------------------------------------------------------------
local function numel(shape)
  local n = 1
  for _, s in ipairs(shape) do n = n * s end
  return n
end
local function from(shape, gen, dtype)
  local n, v = numel(shape), {}
  for i = 1, n do v[i] = gen(i) end
  local x = fl.tensor(v, {dtype = dtype or DT})
  if #v == 0 then x = fl.zeros(0) end
  if #shape == 0 then return x:reshape() end
  return x:reshape(table.unpack(shape))
end
local function normal()
  local u1, u2 = 1 - math.random(), math.random()
  return math.sqrt(-2 * math.log(u1)) * math.cos(2 * math.pi * u2)
end
local function N(shape, scale) return from(shape, function() return normal() * (scale or 1) end) end
local function U(shape, lo, hi)
  return from(shape, function() return lo + (hi - lo) * math.random() end)
end
-- normal values at least m from 0 (relu, abs: no kink within a step)
local function away(shape, m)
  return from(shape, function()
    local v = normal()
    return v < 0 and v - m or v + m
  end)
end
-- distinct values k * step in shuffled order (max and min without near
-- ties: any two differ by step); check() steps them by H at most, whatever
-- their RMS, so no two can swap places
local fixed_scale = setmetatable({}, {__mode = "k"})
local function distinct(shape, step)
  local n, v = numel(shape), {}
  for i = 1, n do v[i] = (i - (n + 1) / 2) * (step or 0.1) end
  for i = n, 2, -1 do
    local j = math.random(i)
    v[i], v[j] = v[j], v[i]
  end
  local x = from(shape, function(i) return v[i] end)
  fixed_scale[x] = 1
  return x
end
local function idx(shape, list) return fl.tensor(list):reshape(table.unpack(shape)) end
local function F(list) return fl.tensor(list, {dtype = DT}) end

local function flat(x) return x:contiguous():reshape(-1):tolist() end
local function dot(a, b)
  local s = 0
  for i = 1, #a do s = s + a[i] * b[i] end
  return s
end

---------------------------------------------------------------------------
-- coverage: the ops on a result's tape
---------------------------------------------------------------------------
local covered = {}
-- every fn reachable from fn (a grad_fn userdata is made per access, so
-- there is nothing to dedupe by: the tapes here are small trees)
local function walk(fn, budget)
  budget = budget or {n = 10000}
  if not fn or budget.n <= 0 then return end
  budget.n = budget.n - 1
  if fn.op then covered[fn.op] = true end
  for _, nx in ipairs(fn.next_functions or {}) do
    if nx then walk(nx, budget) end
  end
end
local function cover(y, ok)
  local before = {}
  for k in pairs(covered) do before[k] = true end
  walk(y.grad_fn)
  if not ok then     -- a failing case covers nothing
    for k in pairs(covered) do if not before[k] then covered[k] = nil end end
  end
end

---------------------------------------------------------------------------
-- the finite-difference check
---------------------------------------------------------------------------
local ncases, worst = 0, {ratio = 0}

-- An input that takes no gradient (indices, masks, constants).
local function const(x) return {const = x} end

-- check(name, fn, inputs [, opts]): fn(inputs...) must be a float tensor;
-- every float input not wrapped in const() requires grad.  opts.scale:
-- the step's scale instead of the input's RMS.
local function check(name, fn, inputs, opts)
  opts = opts or {}
  ncases = ncases + 1
  local base, leaf, wants = {}, {}, {}
  for k, v in ipairs(inputs) do
    if type(v) == "table" and v.const ~= nil then
      base[k], leaf[k] = v.const, v.const
    elseif type(v) == "userdata" and (v.dtype == "float32" or v.dtype == "float16" or
                                      v.dtype == "float64") then
      base[k] = v
      leaf[k] = v:detach():requires_grad_()
      wants[#wants + 1] = k
    else
      base[k], leaf[k] = v, v
    end
  end
  local ok, y = pcall(fn, table.unpack(leaf, 1, #inputs))
  if not ok then t.ok(false, name .. ": forward: " .. tostring(y)) return end
  if not y.requires_grad then t.ok(false, name .. ": the result requires grad") return end
  local R = N(y.shape)
  local Rl = flat(R)
  local okb, err = pcall(function() y:backward(R) end)
  if not okb then
    t.ok(false, name .. ": backward: " .. tostring(err))
    return
  end
  local function f(args)
    return fl.no_grad(function()
      local out = flat(fn(table.unpack(args, 1, #inputs)))
      local s, m = 0, 0
      for i = 1, #out do s = s + out[i] * Rl[i]; m = m + math.abs(out[i] * Rl[i]) end
      return s, m
    end)
  end
  local pass, msgs = true, {}
  for _, k in ipairs(wants) do
    local x, g = base[k], leaf[k].grad
    if not g then
      pass = false
      msgs[#msgs + 1] = "input " .. k .. ": no gradient"
    elseif t.show(g.shape) ~= t.show(x.shape) or g.dtype ~= x.dtype then
      pass = false
      msgs[#msgs + 1] = ("input %d: gradient %s%s for %s%s"):format(k, g.dtype,
        t.show(g.shape), x.dtype, t.show(x.shape))
    elseif x:numel() > 0 then
      local xl = flat(x)
      local rms = math.sqrt(dot(xl, xl) / #xl)
      local s = H * (opts.scale or fixed_scale[x] or math.max(rms, 0.25))
      local V = U(x.shape, -1, 1)
      local args = {table.unpack(base, 1, #inputs)}
      -- one step of size s and one of s/2: d1, d2 are the steps as
      -- rounded (half the difference of x + step and x - step, read back)
      local gl, d, fsum, fabs = flat(g), {}, {}, 0
      for j, h in ipairs{s, s / 2} do
        local xp, xm = fl.no_grad(function() return x + V * h, x - V * h end)
        local pl, ml = flat(xp), flat(xm)
        d[j] = {}
        for i = 1, #pl do d[j][i] = (pl[i] - ml[i]) / 2 end
        args[k] = xp
        local fp, mp = f(args)
        args[k] = xm
        local fm, mm = f(args)
        fsum[j] = (fp - fm) / 2
        fabs = fabs + (j == 1 and 1 or 8) * (mp + mm) / 2
      end
      -- Richardson: the cubic terms of the two central differences cancel
      -- in n1 - 8 n2 (d2 = d1 / 2), leaving <g, d1 - 8 d2> + O(s^5)
      local a, S = 0, 0
      for i = 1, #gl do
        local e = d[1][i] - 8 * d[2][i]
        a = a + gl[i] * e
        S = S + math.abs(gl[i] * e)
      end
      local n = (fsum[1] - 8 * fsum[2]) / (-3 * s)
      a, S = a / (-3 * s), S / (3 * s)
      local E = fabs * ULPS / (3 * s)
      local bound = TOL * (S + math.abs(n)) + E
      local err = math.abs(a - n)
      if err / bound > worst.ratio then worst = {ratio = err / bound, name = name .. " input " .. k} end
      if not (err <= bound) then
        pass = false
        msgs[#msgs + 1] = ("input %d: analytic %.7g, numeric %.7g (|diff| %.3g > %.3g)"):format(
          k, a, n, err, bound)
      end
    end
  end
  if #wants == 0 then pass, msgs[1] = false, "no input takes a gradient" end
  cover(y, pass)
  t.ok(pass, name)
  for _, m in ipairs(msgs) do t.diag(m) end
end

local function isfloat(v)
  return type(v) == "userdata" and (v.dtype == "float32" or v.dtype == "float16" or v.dtype == "float64")
end

-- Elementwise |got - want| <= CLOSE * max(|want|, 1) over nested lists.
local function close_lists(got, want, msgs, where)
  if type(want) == "number" then
    if type(got) ~= "number" or not (got == want or (got ~= got and want ~= want) or
                                     math.abs(got - want) <= CLOSE * math.max(math.abs(want), 1)) then
      msgs[#msgs + 1] = ("%s: got %s, want %.9g"):format(where, tostring(got), want)
      return false
    end
    return true
  end
  if type(got) ~= "table" or #got ~= #want then
    msgs[#msgs + 1] = where .. ": shapes differ"
    return false
  end
  local okay = true
  for i = 1, #want do
    if not close_lists(got[i], want[i], msgs, where .. "[" .. i .. "]") then okay = false end
    if #msgs > 4 then return false end
  end
  return okay
end

local function flatten(v, out)
  out = out or {}
  if type(v) ~= "table" then out[#out + 1] = v return out end
  for _, e in ipairs(v) do flatten(e, out) end
  return out
end

-- closed(name, fn, inputs, want [, seed]): backward of fn(leaves...) with
-- seed (default ones), then input k's gradient must be want[k] (a tensor
-- or nested list; false: no gradient).
local function closed(name, fn, inputs, want, seed)
  ncases = ncases + 1
  local leaf = {}
  for k, v in ipairs(inputs) do
    if type(v) == "table" and v.const ~= nil then leaf[k] = v.const
    elseif isfloat(v) then leaf[k] = v:detach():requires_grad_()
    else leaf[k] = v end
  end
  local ok, y = pcall(fn, table.unpack(leaf, 1, #inputs))
  if not ok then t.ok(false, name .. ": forward: " .. tostring(y)) return end
  local okb, err = pcall(function() y:backward(seed or fl.ones(table.unpack(y.shape)):to(y.dtype)) end)
  if not okb then t.ok(false, name .. ": backward: " .. tostring(err)) return end
  local msgs, pass = {}, true
  for k = 1, #inputs do
    local w = want[k]
    if w ~= nil then
      local g = isfloat(leaf[k]) and leaf[k].grad or nil
      if w == false then
        if g then pass = false; msgs[#msgs + 1] = "input " .. k .. ": unexpected gradient" end
      elseif not g then
        pass = false
        msgs[#msgs + 1] = "input " .. k .. ": no gradient"
      else
        if type(w) == "userdata" then
          if t.show(w.shape) ~= t.show(g.shape) then
            pass = false
            msgs[#msgs + 1] = ("input %d: shape %s, want %s"):format(k, t.show(g.shape), t.show(w.shape))
          end
          if w.dtype ~= g.dtype then
            pass = false
            msgs[#msgs + 1] = ("input %d: dtype %s, want %s"):format(k, g.dtype, w.dtype)
          end
          w = flat(w)
        end
        if not close_lists(flat(g), flatten(w), msgs, "input " .. k) then pass = false end
      end
    end
  end
  cover(y, pass)
  t.ok(pass, name)
  for _, m in ipairs(msgs) do t.diag(m) end
  return leaf, y
end

-- Empty tensors: backward runs and every input gets a gradient of its own
-- shape (zero-size, or zeros when only the output is empty).
local function empty(name, fn, inputs)
  ncases = ncases + 1
  local leaf = {}
  for k, v in ipairs(inputs) do
    if type(v) == "table" and v.const ~= nil then leaf[k] = v.const
    elseif isfloat(v) then leaf[k] = v:detach():requires_grad_()
    else leaf[k] = v end
  end
  local ok, err = pcall(function()
    local y = fn(table.unpack(leaf, 1, #inputs))
    y:backward(fl.ones(table.unpack(y.shape)))
    for k, v in ipairs(leaf) do
      if isfloat(inputs[k]) then
        local g = v.grad
        assert(g, "input " .. k .. " has no gradient")
        assert(t.show(g.shape) == t.show(v.shape), ("input %d: gradient shape %s for %s"):format(
          k, t.show(g.shape), t.show(v.shape)))
        if y:numel() == 0 and g:numel() > 0 then
          assert(g:abs():sum():item() == 0, "input " .. k .. ": nonzero gradient")
        end
      end
    end
    cover(y, true)
  end)
  t.ok(ok, name)
  if not ok then t.diag(tostring(err)) end
end

---------------------------------------------------------------------------
-- elementwise, one input
---------------------------------------------------------------------------
do
  local pos = function() return U({3, 4}, 0.5, 2) end
  local unary = {
    {"abs", function(x) return x:abs() end, function() return away({3, 4}, 0.1) end},
    {"neg", function(x) return -x end},
    {"exp", function(x) return x:exp() end},
    {"log", function(x) return x:log() end, pos},
    {"sqrt", function(x) return x:sqrt() end, pos},
    {"rsqrt", function(x) return x:rsqrt() end, pos},
    {"sin", function(x) return x:sin() end},
    {"cos", function(x) return x:cos() end},
    {"asin", function(x) return x:asin() end, function() return U({3, 4}, -0.8, 0.8) end},
    {"acos", function(x) return x:acos() end, function() return U({3, 4}, -0.8, 0.8) end},
    {"atan", function(x) return x:atan() end},
    {"tanh", function(x) return x:tanh() end},
    {"sigmoid", function(x) return x:sigmoid() end},
    {"relu", function(x) return x:relu() end, function() return away({3, 4}, 0.1) end},
    {"gelu", function(x) return x:gelu() end},
    {"gelu tanh", function(x) return fl.gelu(x, {approximate = "tanh"}) end},
    {"silu", function(x) return x:silu() end},
    {"erf", function(x) return x:erf() end},
  }
  for _, u in ipairs(unary) do
    local make = u[3] or function() return N({3, 4}) end
    check(u[1], u[2], {make()})
    -- a transposed (non-contiguous) view as the input
    check(u[1] .. " of a transposed view", function(x) return u[2](x:transpose(1, 2)) end, {make()})
  end
  check("exp of a 0-d tensor", function(x) return x:exp() end, {N({})})
  check("0-d: expand, unsqueeze, cumsum", function(x) return fl.cumsum(x:unsqueeze(1), 1) * x:expand(3) end, {N({})})
  -- clamp: values at least 0.1 from either bound
  local function off_bounds(lo, hi)
    return from({4, 5}, function()
      local v
      repeat v = normal() * 1.5 until math.abs(v - lo) > 0.1 and math.abs(v - hi) > 0.1
      return v
    end)
  end
  check("clamp(lo, hi)", function(x) return x:clamp(-0.5, 0.7) end, {off_bounds(-0.5, 0.7)})
  check("clamp{min}", function(x) return x:clamp{min = -0.3} end, {off_bounds(-0.3, 1e9)})
  check("clamp{max}", function(x) return x:clamp{max = 0.2} end, {off_bounds(-1e9, 0.2)})
  -- at the bounds the gradient passes (PyTorch: lo <= x <= hi)
  closed("clamp at its bounds", function(x) return x:clamp(-1, 1) end,
         {F{-2, -1, 0, 1, 2}}, {{0, 1, 1, 1, 0}})
  closed("relu at 0 passes nothing", function(x) return x:relu() end,
         {F{-1, 0, 2}}, {{0, 0, 1}})
  closed("abs at 0 is 0", function(x) return x:abs() end,
         {F{-3, 0, 2}}, {{-1, 0, 1}})
  -- NaN as PyTorch: relu keeps NaN and passes its gradient (zero only
  -- where the result <= 0); abs and clamp give it none
  local nan = 0 / 0
  closed("relu passes a NaN's gradient", function(x) return x:relu() end, {F{nan, -1, 2}}, {{1, 0, 1}})
  closed("abs gives a NaN no gradient", function(x) return x:abs() end, {F{nan, -1}}, {{0, -1}})
  closed("clamp gives a NaN no gradient", function(x) return x:clamp(-1, 1) end, {F{nan, 0.5}}, {{0, 1}})

  -- closed form: exp
  local x, R = N({3, 5}), N({3, 5})
  local xl, Rl, want = flat(x), flat(R), {}
  for i = 1, #xl do want[i] = Rl[i] * math.exp(xl[i]) end
  closed("exp: grad = g * exp(x)", function(a) return a:exp():reshape(-1) end, {x}, {want},
         R:reshape(-1))
end

---------------------------------------------------------------------------
-- elementwise over broadcast operands
---------------------------------------------------------------------------
do
  local pos = function(shape) return U(shape, 0.5, 2) end
  local function nz(shape) return away(shape, 0.5) end
  local binary = {
    {"add", function(a, b) return a + b end, N, N},
    {"sub", function(a, b) return a - b end, N, N},
    {"mul", function(a, b) return a * b end, N, N},
    {"div", function(a, b) return a / b end, N, nz},
    {"pow", function(a, b) return a ^ b end, pos, function(s) return U(s, -1.5, 2) end},
    {"maximum", fl.maximum, distinct, distinct},
    {"minimum", fl.minimum, distinct, distinct},
  }
  for _, c in ipairs(binary) do
    local name, f, ma, mb = c[1], c[2], c[3], c[4]
    check(name, f, {ma({3, 4}), mb({3, 4})})
    check(name .. ", both operands broadcast", f, {ma({3, 1}), mb({1, 4})})
    check(name .. ", leading dims broadcast", f, {ma({2, 3, 4}), mb({4})})
    check(name .. ", a 0-d operand", f, {ma({}), mb({3, 4})})
    check(name .. ", transposed view operands", function(a, b) return f(a:transpose(1, 2), b) end,
          {ma({4, 3}), mb({3, 4})})
    check(name .. ", expanded view operand", function(a, b) return f(a:expand(3, 4), b) end,
          {ma({1, 4}), mb({3, 4})})
    check(name .. ", one operand without grad", f, {ma({3, 4}), const(mb({3, 4}))})
  end
  -- maximum and minimum against a constant: distinct from it by >= 0.05
  check("maximum with a broadcast constant", function(a) return fl.maximum(a, F{0}) end,
        {distinct({3, 4})})
  -- Lua numbers on either side (wrapped scalars)
  check("add number", function(a) return a + 2.5 end, {N({3, 4})})
  check("number - x", function(a) return 2.5 - a end, {N({3, 4})})
  check("number * x", function(a) return 2.5 * a end, {N({3, 4})})
  check("number / x", function(a) return 2.5 / a end, {nz({3, 4})})
  check("x / number", function(a) return a / 3 end, {N({3, 4})})
  check("pow: scalar exponent 3 (negative bases)", function(a) return a ^ 3 end, {N({3, 4})})
  check("pow: scalar exponent 2.5", function(a) return a ^ 2.5 end, {pos({3, 4})})
  check("pow: scalar exponent -0.5", function(a) return a ^ -0.5 end, {pos({3, 4})})
  check("pow: scalar base, tensor exponent", function(b) return 1.7 ^ b end, {N({3, 4})})
  check("pow: broadcast base and exponent", function(a, b) return a ^ b end,
        {pos({3, 1}), U({1, 4}, -1, 2)})

  -- fmod and remainder: x = y (k + frac), frac in [0.2, 0.8]: both sides
  -- of x / y stay off the integers where they jump
  local function divisor(shape)
    return from(shape, function()
      return (math.random() < 0.5 and -1 or 1) * (0.7 + 0.8 * math.random())
    end)
  end
  -- x [3, 4] over y of shape yshape (broadcast to x's)
  local function dividend(y)
    local yl, xs = flat(y:expand(3, 4)), {}
    for i = 1, #yl do xs[i] = yl[i] * (math.random(-3, 3) + 0.2 + 0.6 * math.random()) end
    return F(xs):reshape(3, 4)
  end
  for _, name in ipairs{"fmod", "remainder"} do
    local y = divisor({3, 4})
    check(name, fl[name], {dividend(y), y}, {scale = 1})
    y = divisor({1, 4})
    check(name .. ", broadcast divisor", fl[name], {dividend(y), y}, {scale = 1})
    check(name .. " by a number", function(a) return fl[name](a, 0.75) end,
          {F{0.3, -0.3, 1.2, -1.0, 2.05, -2.05}}, {scale = 1})
  end

  -- where: cond without grad, the branches broadcast
  local cond = idx({3, 4}, {1, 0, 0, 1, 1, 1, 0, 0, 0, 1, 0, 1}):gt(0)
  check("where", fl.where, {const(cond), N({3, 4}), N({3, 4})})
  check("where, broadcast branches", fl.where, {const(cond:narrow(1, 1, 1)), N({3, 1}), N({4})})
  check("where with a number branch", function(a) return fl.where(cond, a, 0.5) end, {N({3, 4})})

  -- closed forms
  local a, b, R = N({3, 4}), N({4}), N({3, 4})
  local al, bl, Rl = a:tolist(), b:tolist(), R:tolist()
  local ga, gb = {}, {0, 0, 0, 0}
  for i = 1, 3 do
    ga[i] = {}
    for j = 1, 4 do
      ga[i][j] = Rl[i][j] * bl[j]
      gb[j] = gb[j] + Rl[i][j] * al[i][j]
    end
  end
  closed("mul: grads g * b and sum over the broadcast dim of g * a", function(x, y) return x * y end,
         {a, b}, {ga, gb}, R)
  -- ties: PyTorch splits the gradient evenly
  closed("maximum: ties split the gradient", fl.maximum, {F{1, 2, 3}, F{1, 5, 3}},
         {{0.5, 0, 0.5}, {0.5, 1, 0.5}})
  closed("minimum: ties split the gradient", fl.minimum, {F{1, 2, 3}, F{1, 5, 3}},
         {{0.5, 1, 0.5}, {0.5, 0, 0.5}})
  closed("maximum: a broadcast tie", fl.maximum, {F{2, 1, 3}, F{2}}, {{0.5, 0, 1}, {1.5}})
  -- a NaN on either side: neither is less, both get the whole gradient
  closed("maximum with NaN", fl.maximum, {F{0 / 0, 1, 2}, F{1, 0 / 0, 2}}, {{1, 1, 0.5}, {1, 1, 0.5}})
  closed("minimum with NaN", fl.minimum, {F{0 / 0, 1, 2}, F{1, 0 / 0, 2}}, {{1, 1, 0.5}, {1, 1, 0.5}})
  -- pow at base 0 (PyTorch): d/dx is 0 where the exponent is 0; d/dy is 0
  -- where the base is 0 and the exponent >= 0
  closed("pow at base 0", function(x, y) return x ^ y end,
         {F{0, 0, 0, 2, 0}, F{2, 0, 1, 0, 3}}, {{0, 0, 1, 0, 0}, {0, 0, 0, math.log(2), 0}})
  closed("pow at base 0, scalar exponents", function(x) return x ^ 2 + x ^ 0 end,
         {F{0, 1.5}}, {{0, 3}})
end

---------------------------------------------------------------------------
-- reductions
---------------------------------------------------------------------------
do
  local function forms(name, f, make)
    check(name .. " of all", function(x) return f(x) end, {make({3, 4})})
    check(name .. " dim 1", function(x) return f(x, 1) end, {make({3, 4})})
    check(name .. " dim 2 keepdim", function(x) return f(x, 2, true) end, {make({3, 4})})
    check(name .. " dims {1, 3}", function(x) return f(x, {1, 3}) end, {make({2, 3, 4})})
    check(name .. " dims {2, 3} keepdim", function(x) return f(x, {2, 3}, true) end, {make({2, 3, 4})})
    check(name .. " dim -1 of a transposed view", function(x) return f(x:transpose(1, 2), -1) end,
          {make({4, 3})})
    check(name .. " of all, keepdim", function(x) return f(x, {1, 2}, true) end, {make({3, 4})})
    check(name .. " of a 0-d tensor", function(x) return f(x) end, {make({})})
  end
  forms("sum", function(x, ...) return x:sum(...) end, N)
  forms("mean", function(x, ...) return x:mean(...) end, N)
  forms("amax", function(x, ...) return x:amax(...) end, distinct)
  forms("amin", function(x, ...) return x:amin(...) end, distinct)
  for _, corr in ipairs{0, 1} do
    local function var(x, d, keep)
      return x:var(d, keep or false, {correction = corr})
    end
    check("var correction " .. corr .. " of all", function(x) return x:var({correction = corr}) end, {N({3, 4})})
    check("var correction " .. corr .. " dim 1", function(x) return var(x, 1) end, {N({3, 4})})
    check("var correction " .. corr .. " dim 2 keepdim", function(x) return var(x, 2, true) end, {N({3, 4})})
    check("var correction " .. corr .. " dims {1, 3}", function(x) return var(x, {1, 3}) end, {N({2, 3, 4})})
    check("var correction " .. corr .. " of a transposed view",
          function(x) return var(x:transpose(1, 2), 2) end, {N({4, 3})})
  end
  check("var unbiased = false", function(x) return x:var(2, {unbiased = false}) end, {N({3, 4})})

  -- closed forms: sum broadcasts g back; amax/amin ties share it evenly
  local R = N({3})
  local Rl = R:tolist()
  closed("sum: grad = g broadcast over the summed dim", function(x) return x:sum(2) end,
         {N({3, 4})}, {{Rl[1], Rl[1], Rl[1], Rl[1], Rl[2], Rl[2], Rl[2], Rl[2],
                        Rl[3], Rl[3], Rl[3], Rl[3]}}, R)
  closed("mean: grad = g / n", function(x) return x:mean(1) end, {N({4, 2})},
         {{0.25, 0.25, 0.25, 0.25, 0.25, 0.25, 0.25, 0.25}})
  local tie = F{{1, 3, 3}, {2, 2, 2}}
  closed("amax: ties share evenly", function(x) return x:amax(2) end, {tie},
         {{{0, 0.5, 0.5}, {1 / 3, 1 / 3, 1 / 3}}})
  closed("amax of all: ties share evenly", function(x) return x:amax() end, {tie},
         {{{0, 0.5, 0.5}, {0, 0, 0}}})
  closed("amin: ties share evenly, keepdim", function(x) return x:amin(1, true) end, {F{{1, 3, 2}, {1, 2, 2}}},
         {{{0.5, 0, 0.5}, {0.5, 1, 0.5}}})
end

---------------------------------------------------------------------------
-- softmax, log_softmax, norms
---------------------------------------------------------------------------
do
  for _, name in ipairs{"softmax", "log_softmax"} do
    for d = 1, 3 do
      check(name .. " dim " .. d, function(x) return x[name](x, d) end, {N({2, 3, 4})})
    end
    check(name .. " dim -1", function(x) return x[name](x, -1) end, {N({3, 5})})
    check(name .. " of a transposed view", function(x) return x[name](x:transpose(1, 2), 2) end,
          {N({4, 3})})
  end
  check("layer_norm with weight and bias", function(x, w, b) return x:layer_norm(4, w, b) end,
        {N({2, 3, 4}), N({4}), N({4})})
  check("layer_norm over 2 dims with weight and bias", function(x, w, b) return x:layer_norm({3, 4}, w, b) end,
        {N({2, 3, 4}), N({3, 4}), N({3, 4})})
  check("layer_norm with weight only", function(x, w) return x:layer_norm(4, w) end,
        {N({3, 4}), N({4})})
  check("layer_norm without weight or bias", function(x) return x:layer_norm(5) end, {N({3, 5})})
  check("layer_norm with bias only", function(x, b) return fl.layer_norm(x, 4, nil, b) end,
        {N({3, 4}), N({4})})
  check("layer_norm, weight without grad", function(x, w, b) return x:layer_norm(4, w, b) end,
        {N({3, 4}), const(N({4})), N({4})})
  check("layer_norm of a transposed view, eps 0.1", function(x, w) return x:transpose(1, 2):layer_norm(3, w, nil, 0.1) end,
        {N({3, 4}), N({3})})
  check("rms_norm with weight", function(x, w) return x:rms_norm(4, w) end, {N({2, 3, 4}), N({4})})
  check("rms_norm over 2 dims with weight", function(x, w) return x:rms_norm({3, 4}, w) end,
        {N({2, 3, 4}), N({3, 4})})
  check("rms_norm without weight", function(x) return x:rms_norm(5) end, {N({3, 5})})
  check("rms_norm of a transposed view, eps 0.1", function(x) return x:transpose(1, 2):rms_norm(3, nil, 0.1) end,
        {N({3, 4})})
  -- batch_norm: every input requires grad (mean and var as plain inputs)
  local function bn_inputs(shape, C)
    return {N(shape), N({C}), U({C}, 0.5, 2), N({C}), N({C})}
  end
  check("batch_norm: x, mean, var, weight, bias", fl.batch_norm, bn_inputs({3, 2, 2, 3}, 2))
  check("batch_norm of [N, C]", fl.batch_norm, bn_inputs({4, 3}, 3))
  check("batch_norm of [N, C, L], eps 0.1", function(x, m, v, w, b) return fl.batch_norm(x, m, v, w, b, 0.1) end,
        bn_inputs({2, 3, 4}, 3))
  check("batch_norm without weight and bias", fl.batch_norm, {N({2, 3, 2, 2}), N({3}), U({3}, 0.5, 2)})
  check("batch_norm with bias, no weight", function(x, m, v, b) return fl.batch_norm(x, m, v, nil, b) end,
        {N({4, 3}), N({3}), U({3}, 0.5, 2), N({3})})
  check("batch_norm with weight, no bias", fl.batch_norm, {N({2, 3, 2, 2}), N({3}), U({3}, 0.5, 2), N({3})})
  check("batch_norm, statistics without grad", fl.batch_norm,
        {N({2, 3, 2, 2}), const(N({3})), const(U({3}, 0.5, 2)), N({3}), N({3})})
  -- training mode: mean and var computed from x differentiate through
  check("batch_norm with batch statistics", function(x, w, b)
    return fl.batch_norm(x, x:mean({1, 3, 4}), x:var({1, 3, 4}, {correction = 0}), w, b)
  end, {N({3, 2, 2, 3}), N({2}), N({2})})
  -- batch_stats: the statistics detached, x's gradient carrying theirs
  -- (nn.BatchNorm2d's training form); finite differences recompute them
  local function stats_bn(dims, opts)
    return function(x, w, b)
      local xd = x:detach()
      return fl.batch_norm(x, xd:mean(dims), xd:var(dims, {correction = 0}), w, b,
                           {eps = opts and opts.eps, batch_stats = true})
    end
  end
  check("batch_norm with batch_stats", stats_bn({1, 3, 4}), {N({3, 2, 2, 3}), N({2}), N({2})})
  check("batch_norm with batch_stats of [N, C], eps 0.1", stats_bn({1}, {eps = 0.1}),
        {N({5, 3}), N({3}), N({3})})
  check("batch_norm with batch_stats of [N, C, L], weight only", stats_bn({1, 3}),
        {N({2, 3, 4}), N({3})})
  check("batch_norm with batch_stats, no weight or bias", stats_bn({1, 3, 4}), {N({2, 3, 2, 2})})
  check("batch_norm with batch_stats of a shifted input", function(x, w, b)
    return stats_bn({1, 3, 4})(x + 10, w, b)
  end, {N({4, 2, 3, 3}), N({2}), N({2})})
end

---------------------------------------------------------------------------
-- products
---------------------------------------------------------------------------
do
  local mm = function(a, b) return a:matmul(b) end
  check("matmul 2-d", mm, {N({3, 4}), N({4, 5})})
  check("matmul 1-d @ 2-d", mm, {N({4}), N({4, 5})})
  check("matmul 2-d @ 1-d", mm, {N({3, 4}), N({4})})
  check("matmul 1-d @ 1-d (dot)", mm, {N({4}), N({4})})
  check("matmul 3-d @ 1-d", mm, {N({2, 3, 4}), N({4})})
  check("matmul 1-d @ 3-d", mm, {N({3}), N({2, 3, 4})})
  check("matmul batched", mm, {N({2, 3, 4}), N({2, 4, 5})})
  check("matmul batched broadcast", mm, {N({2, 1, 3, 4}), N({3, 4, 5})})
  check("matmul 2-d @ batched", mm, {N({3, 4}), N({2, 4, 5})})
  check("matmul of transposed views", function(a, b) return a:transpose(1, 2):matmul(b:transpose(1, 2)) end,
        {N({4, 3}), N({5, 4})})
  check("matmul of an expanded batch", function(a, b) return a:expand(2, 3, 4):matmul(b) end,
        {N({1, 3, 4}), N({2, 4, 2})})
  check("matmul, right operand without grad", mm, {N({3, 4}), const(N({4, 5}))})
  -- closed form: dA = g b^T, dB = a^T g
  local a, b, R = N({3, 4}), N({4, 2}), N({3, 2})
  local al, bl, Rl = a:tolist(), b:tolist(), R:tolist()
  local ga, gb = {}, {}
  for i = 1, 3 do
    ga[i] = {}
    for k = 1, 4 do
      local s = 0
      for j = 1, 2 do s = s + Rl[i][j] * bl[k][j] end
      ga[i][k] = s
    end
  end
  for k = 1, 4 do
    gb[k] = {}
    for j = 1, 2 do
      local s = 0
      for i = 1, 3 do s = s + al[i][k] * Rl[i][j] end
      gb[k][j] = s
    end
  end
  closed("matmul: grads g @ b^T and a^T @ g", mm, {a, b}, {ga, gb}, R)

  check("linear with bias", fl.linear, {N({4, 3}), N({5, 3}), N({5})})
  check("linear without bias", fl.linear, {N({4, 3}), N({5, 3})})
  check("linear of a 1-d input", fl.linear, {N({3}), N({5, 3}), N({5})})
  check("linear of a 3-d input", fl.linear, {N({2, 3, 3}), N({4, 3}), N({4})})
  check("linear of a transposed view", function(x, w, b) return fl.linear(x:transpose(1, 2), w, b) end,
        {N({3, 4}), N({5, 3}), N({5})})
  check("linear, a transposed weight view", function(x, w) return fl.linear(x, w:transpose(1, 2)) end,
        {N({4, 3}), N({3, 5})})
  check("linear of a 1-d input to 1 output", fl.linear, {N({3}), N({1, 3})})
  check("linear, only the weight requires grad", fl.linear, {const(N({4, 3})), N({5, 3}), const(N({5}))})
end

---------------------------------------------------------------------------
-- convolution and pools
---------------------------------------------------------------------------
do
  local function conv(opts) return function(x, w, b) return fl.conv2d(x, w, b, opts) end end
  check("conv2d", conv(), {N({2, 3, 5, 5}), N({4, 3, 3, 3}), N({4})})
  check("conv2d without bias", conv(), {N({1, 2, 4, 5}), N({3, 2, 2, 3})})
  check("conv2d stride 2", conv{stride = 2}, {N({1, 2, 7, 6}), N({3, 2, 3, 3}), N({3})})
  check("conv2d stride {2, 3}, the floor dropping columns", conv{stride = {2, 3}},
        {N({1, 2, 8, 9}), N({2, 2, 3, 2}), N({2})})
  check("conv2d padding 1", conv{padding = 1}, {N({1, 2, 4, 4}), N({2, 2, 3, 3}), N({2})})
  check("conv2d asymmetric padding {1, 0, 2, 1}", conv{padding = {1, 0, 2, 1}},
        {N({1, 2, 4, 5}), N({2, 2, 3, 3}), N({2})})
  check("conv2d dilation 2", conv{dilation = 2}, {N({1, 2, 7, 7}), N({2, 2, 3, 3}), N({2})})
  check("conv2d dilation {2, 1}, stride 2, padding 1", conv{dilation = {2, 1}, stride = 2, padding = 1},
        {N({2, 2, 7, 6}), N({3, 2, 3, 2}), N({3})})
  check("conv2d groups 2", conv{groups = 2}, {N({2, 4, 5, 5}), N({6, 2, 3, 3}), N({6})})
  check("conv2d depthwise (groups = C)", conv{groups = 3, padding = 1}, {N({2, 3, 4, 4}), N({3, 1, 3, 3}), N({3})})
  check("conv2d depthwise, 2 filters per channel, stride 2", conv{groups = 3, stride = 2},
        {N({1, 3, 6, 5}), N({6, 1, 2, 2}), N({6})})
  check("conv2d groups 2, stride 2, dilation {2, 1}, padding {1, 0, 2, 1}",
        conv{groups = 2, stride = 2, dilation = {2, 1}, padding = {1, 0, 2, 1}},
        {N({2, 4, 7, 6}), N({4, 2, 3, 2}), N({4})})
  check("conv2d of a permuted (channels-last) view", function(x, w) return fl.conv2d(x:permute(1, 4, 2, 3), w) end,
        {N({1, 4, 4, 2}), N({3, 2, 3, 3})})
  check("conv2d, weight only", conv{stride = 2, padding = 1}, {const(N({2, 2, 5, 5})), N({3, 2, 3, 3})})
  check("conv2d 1x1 kernel larger than stride skips", conv{stride = 3}, {N({1, 2, 7, 7}), N({2, 2, 1, 1})})
  check("conv2d padding wider than the kernel", conv{padding = 2}, {N({1, 2, 3, 3}), N({2, 2, 1, 1}), N({2})})
  check("conv2d padding {2, 0, 1, 3} wider than the kernel, stride 2", conv{padding = {2, 0, 1, 3}, stride = 2},
        {N({1, 2, 4, 3}), N({2, 2, 2, 1})})

  -- pools: distinct values, no near ties in a window
  local function mp(k, opts) return function(x) return x:max_pool2d(k, opts) end end
  check("max_pool2d 2", mp(2), {distinct({2, 2, 4, 4})})
  check("max_pool2d 3 stride 2 padding 1", mp(3, {stride = 2, padding = 1}), {distinct({1, 2, 7, 7})})
  check("max_pool2d 3 stride 2, odd size", mp(3, {stride = 2}), {distinct({1, 2, 6, 7})})
  check("max_pool2d 2 ceil_mode", mp(2, {ceil_mode = true}), {distinct({1, 2, 5, 5})})
  check("max_pool2d 3 stride 2 padding 1 ceil_mode", mp(3, {stride = 2, padding = 1, ceil_mode = true}),
        {distinct({1, 2, 6, 6})})
  check("max_pool2d dilation 2", mp(2, {dilation = 2}), {distinct({1, 2, 6, 6})})
  check("max_pool2d {2, 3} dilation {2, 1} stride 1", mp({2, 3}, {dilation = {2, 1}, stride = 1}),
        {distinct({1, 1, 5, 6})})
  check("max_pool2d asymmetric padding {1, 0, 0, 1}", mp(2, {padding = {1, 0, 0, 1}}), {distinct({1, 2, 5, 5})})
  check("max_pool2d overlapping windows (stride 1)", mp(3, {stride = 1}), {distinct({1, 1, 5, 5})})
  check("max_pool2d 3 padding 1 over a 2x2 input", mp(3, {padding = 1}), {distinct({1, 2, 2, 2})})
  check("max_pool2d {3, 2} stride {2, 1} dilation {1, 2} padding {1, 0, 1, 1} ceil_mode",
        mp({3, 2}, {stride = {2, 1}, dilation = {1, 2}, padding = {1, 0, 1, 1}, ceil_mode = true}),
        {distinct({2, 1, 6, 5})})
  check("max_pool2d of a transposed view", function(x) return x:transpose(3, 4):max_pool2d(2) end,
        {distinct({1, 2, 4, 6})})
  -- ties: the first largest element in the window (row by row) takes it
  closed("max_pool2d: a tie goes to the first in the window",
         function(x) return x:max_pool2d(2) end,
         {F{1, 5, 5, 2, 5, 5, 0, 0}:reshape(1, 1, 2, 4)},
         {{0, 1, 1, 0, 0, 0, 0, 0}})
  -- a NaN window (max_pool2d keeps NaN): PyTorch's kernel takes each NaN
  -- it meets, so the window's last NaN gets the gradient
  closed("max_pool2d: a NaN window's gradient goes to its last NaN",
         function(x) return x:max_pool2d(2, {stride = 1}) end,
         {F{0 / 0, 2, 0 / 0, 1, 3, 0 / 0, 7, 7}:reshape(1, 1, 2, 4)}, {{0, 0, 1, 0, 0, 2, 0, 0}})
  closed("max_pool2d: NaN windows that tile the input (stride = kernel)",
         function(x) return x:max_pool2d(2) end,
         {F{0 / 0, 2, 5, 0 / 0, 3, 0 / 0, 7, 0 / 0}:reshape(1, 1, 2, 4)}, {{0, 0, 0, 0, 0, 1, 0, 1}})
  closed("max_pool2d: ties in windows that tile the input, 3x3", function(x) return x:max_pool2d(3) end,
         {F{1, 9, 9, 4, 0, 0, 0, 0, 9, 4, 4, 4, 4, 4, 4, 4, 4, 4}:reshape(1, 1, 3, 6)},
         {{0, 1, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}})
  closed("max_pool2d: overlapping windows accumulate", function(x) return x:max_pool2d(2, {stride = 1}) end,
         {F{0, 0, 0, 0, 9, 0, 0, 0, 0}:reshape(1, 1, 3, 3)}, {{0, 0, 0, 0, 4, 0, 0, 0, 0}})

  local function ap(k, opts) return function(x) return x:avg_pool2d(k, opts) end end
  check("avg_pool2d 2", ap(2), {N({2, 2, 4, 4})})
  check("avg_pool2d 3 stride 2 padding 1", ap(3, {stride = 2, padding = 1}), {N({1, 2, 7, 7})})
  check("avg_pool2d 3 stride 2 padding 1, count_include_pad false",
        ap(3, {stride = 2, padding = 1, count_include_pad = false}), {N({1, 2, 7, 7})})
  check("avg_pool2d 2 ceil_mode", ap(2, {ceil_mode = true}), {N({1, 2, 5, 5})})
  check("avg_pool2d 3 stride 2 padding 1 ceil_mode", ap(3, {stride = 2, padding = 1, ceil_mode = true}),
        {N({1, 2, 6, 6})})
  check("avg_pool2d 3 stride 2 padding 1 ceil_mode, count_include_pad false",
        ap(3, {stride = 2, padding = 1, ceil_mode = true, count_include_pad = false}), {N({1, 2, 6, 6})})
  check("avg_pool2d {2, 3} stride {1, 2}", ap({2, 3}, {stride = {1, 2}}), {N({1, 2, 4, 7})})
  check("avg_pool2d asymmetric padding {1, 0, 0, 1}", ap(2, {padding = {1, 0, 0, 1}}), {N({1, 2, 5, 5})})
  check("avg_pool2d asymmetric padding, count_include_pad false",
        ap(2, {padding = {1, 0, 0, 1}, count_include_pad = false}), {N({1, 2, 5, 5})})
  check("avg_pool2d 3 stride 2 padding 1 ceil_mode over a 2x2 input",
        ap(3, {stride = 2, padding = 1, ceil_mode = true}), {N({1, 2, 2, 2})})
  check("avg_pool2d {3, 2} stride {2, 1} padding {1, 0, 1, 1} ceil_mode, count_include_pad false",
        ap({3, 2}, {stride = {2, 1}, padding = {1, 0, 1, 1}, ceil_mode = true, count_include_pad = false}),
        {N({2, 1, 6, 5})})
  check("avg_pool2d {3, 2} stride {2, 1} padding {1, 0, 1, 1} ceil_mode",
        ap({3, 2}, {stride = {2, 1}, padding = {1, 0, 1, 1}, ceil_mode = true}), {N({2, 1, 6, 5})})
  check("avg_pool2d of a transposed view", function(x) return x:transpose(3, 4):avg_pool2d(2) end,
        {N({1, 2, 4, 6})})
  closed("avg_pool2d: grad = g / 4 in each window", ap(2), {N({1, 1, 2, 4})},
         {{0.25, 0.25, 0.25, 0.25, 0.25, 0.25, 0.25, 0.25}})
end

---------------------------------------------------------------------------
-- views and data movement
---------------------------------------------------------------------------
do
  check("reshape", function(x) return x:reshape(4, 3) * x:reshape(4, 3) end, {N({2, 6})})
  check("reshape of a transposed view (a copy)", function(x) return x:transpose(1, 2):reshape(-1):exp() end,
        {N({3, 4})})
  check("view", function(x) return x:view(3, 2, 2):exp() end, {N({3, 4})})
  check("transpose", function(x) return x:transpose(1, 3):exp() end, {N({2, 3, 4})})
  check("permute", function(x) return x:permute(3, 1, 2):exp() end, {N({2, 3, 4})})
  check("unsqueeze", function(x) return x:unsqueeze(2):exp() end, {N({3, 4})})
  check("unsqueeze -1", function(x, y) return x:unsqueeze(-1) * y end, {N({3, 4}), N({3, 4, 2})})
  check("squeeze (all size-1 dims)", function(x) return x:squeeze():exp() end, {N({3, 1, 4, 1})})
  check("squeeze(2)", function(x) return x:squeeze(2):exp() end, {N({3, 1, 4})})
  check("expand: new leading dims and size-1 dims", function(x) return x:expand(2, 3, 4):exp() end,
        {N({3, 1})})
  check("expand with -1", function(x) return x:expand(-1, 5) * 2 end, {N({3, 1})})
  check("narrow", function(x) return x:narrow(2, 2, 2):exp() end, {N({3, 4})})
  check("narrow from the end", function(x) return x:narrow(1, -2, 2):exp() end, {N({3, 4})})
  check("narrow of a transposed view", function(x) return x:transpose(1, 2):narrow(1, 2, 2):exp() end,
        {N({3, 4})})
  check("contiguous of a transposed view", function(x) return x:transpose(1, 2):contiguous():exp() end,
        {N({3, 4})})
  check("slice step 1", function(x) return x:slice(2, 2, 4):exp() end, {N({3, 5})})
  check("slice step 2", function(x) return x:slice(2, 1, -1, 2):exp() end, {N({3, 6})})
  check("slice step 3, a ragged tail", function(x) return x:slice(1, 2, 7, 3):exp() end, {N({8, 2})})
  check("slice step 2 of a transposed view", function(x) return x:transpose(1, 2):slice(1, 2, -1, 2):exp() end,
        {N({3, 7})})
  check("slice negative step (slice, then flip)", function(x) return x:slice(2, -1, 1, -2):exp() end, {N({3, 6})})
  check("flip one dim", function(x) return x:flip(2):exp() end, {N({3, 4})})
  check("flip two dims", function(x) return x:flip{1, 3} * x end, {N({2, 3, 4})})
  check("pad (constant 0)", function(x) return fl.pad(x, {1, 0, 2, 3}):exp() end, {N({3, 4})})
  check("pad with a value", function(x) return fl.pad(x, {0, 1, 1, 0}, {value = 2}):exp() end, {N({3, 4})})
  check("pad, negative pads crop", function(x) return fl.pad(x, {-1, 0, 0, -2}):exp() end, {N({3, 5})})
  check("pad, crop and pad in one dim", function(x) return fl.pad(x, {-1, 2, 2, -1}):exp() end, {N({3, 5})})
  for _, mode in ipairs{"reflect", "edge"} do
    local o = {mode = mode}
    check("pad " .. mode, function(x) return fl.pad(x, {2, 1, 1, 3}, o):exp() end, {N({4, 5})})
    check("pad " .. mode .. ", one dim, one side", function(x) return fl.pad(x, {0, 3, 0, 0}, o):exp() end, {N({2, 4})})
    check("pad " .. mode .. " after a crop", function(x) return fl.pad(x, {-1, 2, 1, -2}, o):exp() end, {N({4, 6})})
    check("pad " .. mode .. " of 3 dims", function(x) return fl.pad(x, {1, 0, 2, 0, 1, 1}, o):exp() end, {N({2, 3, 4})})
    check("pad " .. mode .. " of a transposed view", function(x) return fl.pad(x:transpose(1, 2), {1, 1, 2, 0}, o):exp() end,
          {N({4, 3})})
  end
  -- closed forms (PyTorch's reflect and replicate pads give the same)
  closed("pad reflect: strips fold back onto the elements they copied",
         function(x) return fl.pad(x, {2, 3}, {mode = "reflect"}) end, {F{1, 2, 3, 4}}, {{12, 14, 13, 6}},
         F{1, 2, 3, 4, 5, 6, 7, 8, 9})
  closed("pad edge: strips sum onto the end elements",
         function(x) return fl.pad(x, {2, 3}, {mode = "edge"}) end, {F{1, 2, 3, 4}}, {{6, 4, 5, 30}},
         F{1, 2, 3, 4, 5, 6, 7, 8, 9})
  closed("pad edge after a crop", function(x) return fl.pad(x, {-1, 2}, {mode = "edge"}) end,
         {F{1, 2, 3, 4}}, {{0, 1, 2, 12}}, F{1, 2, 3, 4, 5})
  check("pad of a transposed view", function(x) return fl.pad(x:transpose(1, 2), {1, 1, 1, 1}):exp() end,
        {N({3, 4})})
  check("cat of three, dim 1", function(a, b, c) return fl.cat({a, b, c}):exp() end,
        {N({2, 3}), N({1, 3}), N({3, 3})})
  check("cat, the middle input without grad, dim 2", function(a, b, c) return fl.cat({a, b, c}, 2):exp() end,
        {N({2, 3}), const(N({2, 1})), N({2, 2})})
  check("cat of the same tensor twice", function(a) return fl.cat({a, a * 2}, -1):exp() end, {N({2, 3})})
  check("cat of views", function(a, b) return fl.cat({a:transpose(1, 2), b:narrow(1, 1, 2)}, 2):exp() end,
        {N({3, 2}), N({3, 2})})
  check("cumsum", function(x) return fl.cumsum(x, 2) end, {N({3, 4})})
  check("cumsum dim 1", function(x) return x:cumsum(1) end, {N({3, 4})})
  check("cumsum exclusive", function(x) return fl.cumsum(x, 2, {exclusive = true}) end, {N({3, 4})})
  check("cumsum reverse", function(x) return fl.cumsum(x, 2, {reverse = true}) end, {N({3, 4})})
  check("cumsum exclusive reverse", function(x) return fl.cumsum(x, 1, {exclusive = true, reverse = true}) end,
        {N({3, 4})})
  check("cumsum of a transposed view", function(x) return fl.cumsum(x:transpose(1, 2), 2) end, {N({3, 4})})
  -- embedding and gather: repeated indices accumulate, negative count from the end
  check("embedding, repeated indices", function(w) return fl.embedding(idx({2, 3}, {0, 2, 0, 4, 2, 2}), w) end,
        {N({5, 3})})
  check("gather dim 1, repeated and negative indices", function(x) return fl.gather(x, 1, idx({4}, {0, -1, 3, 0})) end,
        {N({4, 3})})
  check("gather dim 2, 2-d indices", function(x) return fl.gather(x, 2, idx({2, 2}, {1, -3, 1, 0})) end,
        {N({2, 3, 2})})
  check("gather, 0-d index", function(x) return fl.gather(x, 2, fl.tensor(2)) end, {N({3, 4})})
  check("gather of a transposed view", function(x) return fl.gather(x:transpose(1, 2), 1, idx({3}, {1, 1, 0})) end,
        {N({3, 4})})
  closed("embedding: rows accumulate per index", function(w) return fl.embedding(idx({4}, {1, 1, 0, 1}), w) end,
         {N({3, 2})}, {{1, 1, 3, 3, 0, 0}})
  closed("gather: negative indices accumulate with their positive twin",
         function(x) return fl.gather(x, 1, idx({3}, {-1, 2, 0})) end, {N({3})}, {{1, 0, 2}})
end

---------------------------------------------------------------------------
-- to, dropout
---------------------------------------------------------------------------
do
  if F64 then
    local x, R = N({3, 4}), N({3, 4}):to("float32")
    closed("to float32 from float64: the gradient comes back as float64", function(a) return a:to("float32") end,
           {x}, {R:to("float64")}, R)
  else
    local x, R = N({3, 4}), N({3, 4}):to("float16")
    closed("to float16: the gradient comes back as float32", function(a) return a:to("float16") end,
           {x}, {R:to("float32")}, R)
    local h, R32 = N({3, 4}):to("float16"), N({3, 4})
    closed("to float32 from float16: a float16 gradient", function(a) return a:to("float32") end,
           {h}, {R32:to("float16")}, R32)
  end

  local p = 0.4
  local leaf, y = closed("dropout: runs", function(a) return fl.dropout(a, p) end, {away({8, 16}, 0.1)}, {})
  if leaf then
    local mask = fl.no_grad(function() return y:ne(0):to(DT) / (1 - p) end)
    local g = leaf[1].grad
    t.ok(g and t.show(g.shape) == t.show(leaf[1].shape), "dropout: gradient shape")
    t.ok(g and (g - mask):abs():amax():item() < CLOSE, "dropout: grad = (y ~= 0) / (1 - p), the forward's mask")
    local kept = mask:ne(0):sum():item()
    t.ok(kept > 0 and kept < 128, "dropout: some kept, some dropped (" .. kept .. " of 128)")
  end
  check("dropout p = 0 is the identity", function(a) return fl.dropout(a, 0) end, {N({3, 4})})
end

---------------------------------------------------------------------------
-- empty tensors: backward runs, gradients have the inputs' (zero) sizes
---------------------------------------------------------------------------
do
  local Z = function(...) return fl.zeros(...) end
  local cases = {
    {"exp", function(x) return x:exp() end, {Z(0, 3)}},
    {"relu", function(x) return x:relu() end, {Z(2, 0)}},
    {"clamp", function(x) return x:clamp(0, 1) end, {Z(0)}},
    {"add, broadcast", function(a, b) return a + b end, {Z(0, 3), Z(1, 3)}},
    {"mul, broadcast", function(a, b) return a * b end, {Z(0, 1), Z(4)}},
    {"pow", function(a, b) return a ^ b end, {Z(0, 2), Z(0, 2)}},
    {"maximum", fl.maximum, {Z(3, 0), Z(3, 0)}},
    {"where", function(a, b) return fl.where(fl.zeros(0, 2, {dtype = "bool"}), a, b) end, {Z(0, 2), Z(2)}},
    {"sum of all", function(x) return x:sum() end, {Z(0, 3)}},
    {"sum over the empty dim", function(x) return x:sum(2) end, {Z(3, 0)}},
    {"sum keeping the empty dim", function(x) return x:sum(2, true) end, {Z(0, 3)}},
    {"mean over a full dim", function(x) return x:mean(2) end, {Z(0, 3)}},
    {"amax over a full dim", function(x) return x:amax(2) end, {Z(0, 3)}},
    {"var over a full dim", function(x) return x:var(2) end, {Z(0, 3)}},
    {"softmax", function(x) return x:softmax(2) end, {Z(0, 4)}},
    {"log_softmax", function(x) return x:log_softmax(1) end, {Z(0, 4)}},
    {"layer_norm", function(x, w, b) return x:layer_norm(4, w, b) end, {Z(0, 4), Z(4), Z(4)}},
    {"rms_norm", function(x, w) return x:rms_norm(4, w) end, {Z(0, 4), Z(4)}},
    {"matmul [2, 0] @ [0, 3]", function(a, b) return a:matmul(b) end, {Z(2, 0), Z(0, 3)}},
    {"matmul [0, 4] @ [4, 3]", function(a, b) return a:matmul(b) end, {Z(0, 4), Z(4, 3)}},
    {"matmul batched, empty batch", function(a, b) return a:matmul(b) end, {Z(0, 2, 3), Z(3, 4)}},
    {"linear of no rows", fl.linear, {Z(0, 3), Z(4, 3), Z(4)}},
    {"conv2d of an empty batch", function(x, w, b) return fl.conv2d(x, w, b) end, {Z(0, 2, 4, 4), Z(3, 2, 3, 3), Z(3)}},
    {"max_pool2d of an empty batch", function(x) return x:max_pool2d(2) end, {Z(0, 2, 4, 4)}},
    {"avg_pool2d of an empty batch", function(x) return x:avg_pool2d(2) end, {Z(0, 2, 4, 4)}},
    {"batch_norm of an empty batch", fl.batch_norm, {Z(0, 3, 2, 2), Z(3), fl.ones(3), Z(3), Z(3)}},
    {"reshape", function(x) return x:reshape(3, 0) end, {Z(0, 3)}},
    {"transpose", function(x) return x:transpose(1, 2) end, {Z(0, 3)}},
    {"expand", function(x) return x:expand(0, 3) end, {Z(1, 3)}},
    {"narrow to nothing", function(x) return x:narrow(2, 2, 0) end, {Z(3, 4)}},
    {"slice to nothing", function(x) return x:slice(1, 3, 2) end, {Z(3, 4)}},
    {"cat with an empty piece", function(a, b) return fl.cat({a, b}) end, {Z(0, 3), fl.ones(2, 3)}},
    {"cumsum", function(x) return fl.cumsum(x, 2) end, {Z(3, 0)}},
    {"pad of an empty tensor", function(x) return fl.pad(x, {0, 1, 0, 1}) end, {Z(0, 2)}},
    {"pad edge, another dim empty", function(x) return fl.pad(x, {0, 1, 0, 1}, {mode = "edge"}) end, {Z(0, 2)}},
    {"flip", function(x) return x:flip(1) end, {Z(0, 2)}},
    {"gather with no indices", function(x) return fl.gather(x, 1, fl.zeros(0, {dtype = "int64"})) end, {Z(3, 2)}},
    {"embedding with no indices", function(w) return fl.embedding(fl.zeros(0, {dtype = "int64"}), w) end, {Z(3, 2)}},
    {"dropout", function(x) return fl.dropout(x, 0.5) end, {Z(0, 3)}},
  }
  for _, c in ipairs(cases) do empty("empty: " .. c[1], c[2], c[3]) end
end

-- (float16 and the tape's bookkeeping: once, in the float32 run)
if not F64 then
---------------------------------------------------------------------------
-- float16: the rules keep the gradient's dtype (constants are weak
-- scalars, masks and one-hots are cast to it): float16 gradients close to
-- float32's
---------------------------------------------------------------------------
do
  local cases = {
    {"mul, broadcast", function(a, b) return a * b end, {N({3, 4}), N({4})}},
    {"div", function(a, b) return a / b end, {N({3, 4}), away({3, 4}, 0.5)}},
    {"sigmoid", function(x) return x:sigmoid() end, {N({3, 4})}},
    {"gelu tanh", function(x) return fl.gelu(x, "tanh") end, {N({3, 4})}},
    {"clamp", function(x) return x:clamp(-0.5, 0.5) end, {N({3, 4})}},
    {"amax", function(x) return x:amax(2) end, {distinct({3, 4})}},
    {"var", function(x) return x:var(2) end, {N({3, 4})}},
    {"softmax", function(x) return x:softmax(2) end, {N({3, 4})}},
    {"layer_norm", function(x, w, b) return x:layer_norm(4, w, b) end, {N({3, 4}), N({4}), N({4})}},
    {"rms_norm", function(x, w) return x:rms_norm(4, w) end, {N({3, 4}), N({4})}},
    {"matmul", function(a, b) return a:matmul(b) end, {N({3, 4}), N({4, 2})}},
    {"linear", fl.linear, {N({3, 4}), N({2, 4}), N({2})}},
    {"conv2d", function(x, w) return fl.conv2d(x, w, nil, {stride = 2, padding = 1}) end,
     {N({1, 2, 5, 5}), N({3, 2, 3, 3})}},
    {"max_pool2d", function(x) return x:max_pool2d(2) end, {distinct({1, 1, 4, 4})}},
    {"avg_pool2d", function(x) return x:avg_pool2d(3, {stride = 2, padding = 1, count_include_pad = false}) end,
     {N({1, 1, 5, 5})}},
    {"batch_norm", fl.batch_norm, {N({2, 3, 2, 2}), N({3}), U({3}, 0.5, 2), N({3}), N({3})}},
    {"embedding", function(w) return fl.embedding(idx({3}, {1, 0, 1}), w) end, {N({3, 2})}},
    {"gather", function(x) return fl.gather(x, 2, idx({2}, {-1, 0})) end, {N({3, 4})}},
    {"cumsum", function(x) return fl.cumsum(x, 2, {reverse = true}) end, {N({3, 4})}},
    {"pad", function(x) return fl.pad(x, {1, -1, 0, 2}) end, {N({3, 4})}},
    {"pad reflect", function(x) return fl.pad(x, {1, -1, 0, 2}, {mode = "reflect"}) end, {N({3, 4})}},
    {"slice step 2", function(x) return x:slice(2, 1, -1, 2) end, {N({3, 5})}},
    {"where", function(a, b) return fl.where(a:gt(0), a, b) end, {N({3, 4}), N({4})}},
    {"pow", function(a, b) return a ^ b end, {U({3, 4}, 0.5, 2), U({3, 4}, -1, 2)}},
  }
  for _, c in ipairs(cases) do
    local name, f, ins = "float16 " .. c[1], c[2], c[3]
    ncases = ncases + 1
    local okay, err = pcall(function()
      local R = N(f(table.unpack(ins)).shape)
      local grads = {}
      for _, dt in ipairs{"float32", "float16"} do
        local leaf = {}
        for k, v in ipairs(ins) do leaf[k] = v:to(dt):detach():requires_grad_() end
        local y = f(table.unpack(leaf))
        assert(y.dtype == dt, "result dtype " .. y.dtype)
        y:backward(R:to(dt))
        grads[dt] = leaf
        cover(y, true)
      end
      for k = 1, #ins do
        local g16, g32 = grads.float16[k].grad, grads.float32[k].grad
        assert(g16 and g16.dtype == "float16", "input " .. k .. ": a float16 gradient")
        local d = (g16:to("float32") - g32):abs():amax():item()
        local m = g32:abs():amax():item()
        assert(d <= 2e-2 * math.max(m, 1), ("input %d: float16 off by %.3g (max %.3g)"):format(k, d, m))
      end
    end)
    t.ok(okay, name)
    if not okay then t.diag(tostring(err)) end
  end
  -- mixed dtypes: a float16 operand of a float32 op gets a float16 gradient
  closed("mixed float16 * float32: each gradient in its input's dtype", function(a, b) return a * b end,
         {F{1, 2}:to("float16"), F{3, 4}}, {F{3, 4}:to("float16"), F{1, 2}})
end

---------------------------------------------------------------------------
-- the tape: retain_graph, accumulation, in-place changes, errors
---------------------------------------------------------------------------
do
  local function leaf(list) return F(list):requires_grad_() end

  -- a second backward through saved values needs retain_graph
  local x = leaf{1, 2, 3}
  local y = (x * x):sum()
  y:backward({retain_graph = true})
  t.is(x.grad:tolist(), {2, 4, 6}, "backward: x.grad = 2x")
  y:backward()
  t.is(x.grad:tolist(), {4, 8, 12}, "retain_graph: a second backward runs, x.grad accumulates (doubles)")
  t.raises(function() y:backward() end, "mul's saved values were freed by an earlier backward.*retain_graph",
           "a third backward (the second without retain_graph): an error naming the op")
  t.ok(tostring(y.grad_fn.next_functions[1]):find("^<MulBackward: .*, saved values freed>$"),
       "mul's grad_fn says its saved values were freed")
  -- ops that save nothing run backward again
  local s = (x + 1):sum()
  s:backward()
  s:backward()
  t.is(x.grad:tolist(), {6, 10, 14}, "add and sum save nothing: backward twice without retain_graph")
  t.ok(not tostring(s.grad_fn):find("freed", 1, true), "sum's grad_fn: nothing freed (it saved nothing)")
  x.grad = nil
  t.is(x.grad, nil, "x.grad = nil clears it")
  y = (x * 3):sum()
  y:backward(F(2))
  t.is(x.grad:tolist(), {6, 6, 6}, "backward(g) of a 0-d result with a 0-d gradient")

  -- in-place changes of what backward needs
  x = leaf{1, 2, 3}
  y = x:sin():sum()
  fl.no_grad(function() x:mul_(2) end)
  t.raises(function() y:backward() end, "sin's input 1 float32%[3%] was modified in place",
           "in-place change of a saved input under no_grad: backward names the op and the input")
  local a = F{1, 2, 3}
  local z = (a * leaf{1, 1, 1}):sum()
  a:add_(1)
  t.raises(function() z:backward() end, "mul's input 1 .*modified in place",
           "in-place change of a saved input that does not require grad")
  local big = F{1, 2, 3, 4}
  z = (big:narrow(1, 2, 2) * leaf{1, 1}):sum()
  fl.no_grad(function() big:narrow(1, 1, 1):fill_(0) end)
  t.raises(function() z:backward() end, "mul's input 1 .*modified in place",
           "in-place change through another view of a saved input's storage")
  local e = leaf{0, 1}
  local ey = e:exp()
  local ez = ey:sum()
  fl.no_grad(function() ey:fill_(0) end)
  t.raises(function() ez:backward() end, "exp's output .*modified in place", "in-place change of a saved output")
  e = leaf{0, 1}
  ez = e:exp():sum()
  fl.no_grad(function() e:mul_(2) end)
  ez:backward()
  t.near(e.grad:tolist(), {1, math.exp(1)}, 1e-6, "exp saves its output only: changing its input is fine")
  t.raises(function() leaf{1}:add_(1) end, "add_: a leaf tensor that requires grad cannot change in place while grad mode is on",
           "in-place op on a leaf requiring grad outside no_grad")
  t.raises(function() (leaf{1} * 2):mul_(2) end, "mul_: an in%-place change of a tensor that requires grad",
           "in-place op on a result requiring grad")
  t.raises(function() F{1}:copy_(leaf{2}) end, "copy_: writing a value that requires grad",
           "copy_ of a value requiring grad into one that does not")
  local w = leaf{1, 2}
  fl.no_grad(function() w:sub_(1) end)
  t.is(w:tolist(), {0, 1}, "in-place op on a leaf inside no_grad (an optimizer step)")

  -- requires_grad
  t.raises(function() fl.tensor{1, 2}:requires_grad_() end,
           "only floating%-point tensors can require gradients %(this one is int64%)",
           "requires_grad on an int64 tensor")
  t.raises(function() local i = fl.tensor{1}; i.requires_grad = true end, "int64", "x.requires_grad = true on int64")
  t.raises(function() fl.zeros(2, {dtype = "int64", requires_grad = true}) end, "int64",
           "zeros{dtype = int64, requires_grad = true}")
  t.raises(function() (leaf{1} * 2).requires_grad = false end, "only a leaf's requires_grad can be turned off",
           "requires_grad = false on a non-leaf")
  t.ok(leaf{1}:requires_grad_(false).requires_grad == false, "requires_grad_(false) on a leaf")

  -- backward's errors
  t.raises(function() (leaf{1, 2} * 2):backward() end, "the output has shape %[2%]: backward%(%) without a gradient",
           "backward of a non-scalar without a gradient")
  t.raises(function() F{1}:backward() end, "does not require grad", "backward of a tensor that does not require grad")
  t.raises(function() (leaf{1, 2} * 2):backward(F{1, 2, 3}) end, "the gradient's shape %[3%] differs from the output's %[2%]",
           "backward with a gradient of the wrong shape")
  t.raises(function() (leaf{1, 2} * 2):backward(fl.tensor{1, 2}) end, "the gradient must be floating point",
           "backward with an int64 gradient")
  local g = leaf{1, 2}
  t.raises(function() g.grad = F{1, 2, 3} end, "grad: assigned gradient float32%[3%] differs from the tensor's float32%[2%]",
           "x.grad = a wrong shape")
  t.raises(function() g.grad = fl.tensor{1, 2} end, "differs", "x.grad = a wrong dtype")
  g.grad = F{5, 6}
  ;(g * 1):sum():backward()
  t.is(g.grad:tolist(), {6, 7}, "x.grad = t, then backward accumulates into it")
  t.raises(function() (leaf{1} * 2):backward(nil, {create_grap = true}) end, "create_grap",
           "backward: an unknown option is named")

  -- a leaf is its own root
  local r = leaf{1, 2}
  r:backward(F{3, 4})
  t.is(r.grad:tolist(), {3, 4}, "backward of a leaf: its grad is the seed")
  -- a seed that is a transposed view, changed after backward
  local m = N({3, 2}):requires_grad_()
  local seed = F{{1, 2, 3}, {4, 5, 6}}
  m:exp():backward(seed:transpose(1, 2))
  local want = fl.no_grad(function() return m:exp() * seed:transpose(1, 2) end):tolist()
  fl.no_grad(function() seed:fill_(0) end)
  t.near(m.grad:tolist(), want, 1e-5, "a non-contiguous seed; the gradient kept does not share its storage")

  -- fl.grad
  local p, q = leaf{1, 2}, leaf{3, 4}
  local out = (p * q):sum()
  local gs = fl.grad(out, {p, q}, {retain_graph = true})
  t.is({gs[1]:tolist(), gs[2]:tolist()}, {{3, 4}, {1, 2}}, "fl.grad: the gradients, as a list")
  t.is(p.grad, nil, "fl.grad leaves .grad alone")
  local u = leaf{7}
  t.raises(function() fl.grad(out, {p, u}, {retain_graph = true}) end,
           "inputs%[2%] was not used to compute the outputs %(pass allow_unused", "fl.grad: an unused input")
  gs = fl.grad(out, {u, p}, {allow_unused = true, retain_graph = true})
  t.ok(gs[1] == false and gs[2]:tolist()[2] == 4, "fl.grad allow_unused: false for the unused input")
  gs = fl.grad({p * 2, q:sum()}, {p, q}, {grad_outputs = {F{1, 10}, F(3)}})
  t.is({gs[1]:tolist(), gs[2]:tolist()}, {{2, 20}, {3, 3}}, "fl.grad: several outputs with grad_outputs")
  local mid = p * q
  gs = fl.grad(mid:sum() * 2, {mid})
  t.is(gs[1]:tolist(), {2, 2}, "fl.grad with respect to an intermediate")
  t.raises(function() fl.grad((p * 2):sum(), {F{1}}) end, "inputs%[1%] does not require grad",
           "fl.grad: an input that does not require grad")

  -- grad mode
  t.ok(fl.is_grad_enabled(), "grad mode on by default")
  local okay = pcall(fl.no_grad, function() error("inside") end)
  t.ok(not okay and fl.is_grad_enabled(), "fl.no_grad restores grad mode after an error inside it")
  local nx = leaf{1, 2}
  local ny = fl.no_grad(function() return nx * 2 end)
  t.ok(not ny.requires_grad and ny.grad_fn == nil, "outputs made under fl.no_grad do not require grad")
  local ey2 = fl.no_grad(function() return fl.enable_grad(function() return nx * 2 end) end)
  t.ok(ey2.requires_grad, "fl.enable_grad inside fl.no_grad records again")
  t.ok(fl.is_grad_enabled(), "grad mode back on after nested no_grad/enable_grad")

  -- detach, retain_grad, grad_fn, is_leaf
  local dx = leaf{1, 2, 3}
  local d = dx:detach()
  t.ok(not d.requires_grad and d.is_leaf, "detach() does not require grad")
  fl.no_grad(function() d:fill_(5) end)
  t.is(dx:tolist(), {5, 5, 5}, "detach() shares storage")
  local h = dx * 2
  h:retain_grad()
  t.ok(not h.is_leaf, "a result is not a leaf")
  ;(h * h):sum():backward()
  t.is(h.grad and h.grad:tolist(), {20, 20, 20}, "retain_grad() on a non-leaf keeps its .grad")
  local nr = dx * 3
  ;(nr * 1):sum():backward()
  t.is(nr.grad, nil, "a non-leaf without retain_grad keeps no .grad")
  local gf = (leaf{1, 2} * F{3, 4}).grad_fn
  t.is(tostring(gf), "<MulBackward: mul(float32[2], float32[2] no grad) -> float32[2]>", "grad_fn prints op, inputs, result")
  t.is(gf.name, "MulBackward", "grad_fn.name")
  t.is(tostring(leaf{1}:log_softmax(1).grad_fn.name), "LogSoftmaxBackward", "grad_fn.name of log_softmax")
  t.ok(tostring(gf.next_functions[1]):find("^<AccumulateGrad of float32%[2%]>"), "next_functions: the leaf's AccumulateGrad")
  t.is(gf.next_functions[2], false, "next_functions: false for an input without grad")
  t.is(leaf{1}.grad_fn, nil, "a leaf has no grad_fn")

  -- dropout: the same mask forward and backward, p = 1 drops everything
  local dp = leaf{1, 2, 3, 4}
  fl.dropout(dp, 1):sum():backward()
  t.is(dp.grad:tolist(), {0, 0, 0, 0}, "dropout p = 1: zero gradient")
  local dt = fl.dropout(leaf{1, 2}, 0.5, false)
  t.ok(dt.is_leaf, "dropout with training = false returns the input itself")
end

end
---------------------------------------------------------------------------
-- ops without a derivative: their results never require grad
---------------------------------------------------------------------------
local nondiff = {
  eq = function(x) return x:eq(x) end,
  ne = function(x) return x:ne(0) end,
  lt = function(x) return x:lt(x * 2) end,
  le = function(x) return fl.le(x, 1) end,
  gt = function(x) return x:gt(0) end,
  ge = function(x) return x:ge(x) end,
  argmax = function(x) return x:argmax(2) end,
  rand = function() return fl.rand(3, 4) end,
  randn = function() return fl.randn(3, 4) end,
  -- an integer product: its inputs are int64, which never require grad
  matmul_int8 = function() return fl.matmul_int8(fl.ones(2, 3, {dtype = "int64"}), fl.ones(3, 2, {dtype = "int64"})) end,
  -- no Lua name: it is what max_pool2d's backward graph runs, its result
  -- the gradient, which requires no grad
  max_pool2d_backward = function(x)
    local v = x:detach():reshape(1, 1, 3, 4):requires_grad_()
    local y = v:max_pool2d(2):sum()
    assert(tostring(fl.backward_graph(y)):find("max_pool2d_backward", 1, true))
    y:backward()
    return v.grad
  end,
  -- no Lua name either: the gradient of embedding and gather
  index_add = function(x)
    local w = x:detach():requires_grad_()
    local y = fl.embedding(fl.tensor{2, 0, 2}, w):sum()
    assert(tostring(fl.backward_graph(y)):find("index_add", 1, true))
    y:backward()
    return w.grad
  end,
}
do
  local x = N({3, 4}):requires_grad_()
  for name, f in pairs(nondiff) do
    local y = f(x)
    t.ok(not y.requires_grad and y.grad_fn == nil, name .. ": the result does not require grad")
  end
  t.ok(fl.rand(3, {requires_grad = true}).requires_grad, "rand{requires_grad = true} makes a leaf")
  t.ok(fl.randn(3, {requires_grad = true}).is_leaf, "randn{requires_grad = true} is a leaf")
end

---------------------------------------------------------------------------
-- ops whose rule is an error by design: their results require grad (so a
-- gradient through them is not a silent zero) and backward names them
---------------------------------------------------------------------------
local refused = {
  rnn = function(x)
    local w = x:detach():reshape(1, 4, 3):requires_grad_()
    local y = fl.rnn(fl.randn(2, 1, 3):to(x.dtype), w, fl.randn(1, 4, 1):to(x.dtype))   -- autograd64: float64
    t.ok(y.requires_grad, "rnn: the result requires grad")
    return function() y:sum():backward() end
  end,
}
do
  local x = N({3, 4})
  for name, f in pairs(refused) do
    t.raises(f(x), name .. " has no derivative", name .. ": backward through it is an error naming it")
  end
end

---------------------------------------------------------------------------
-- coverage: every row of ops.def with a rule was on a passing case's tape
---------------------------------------------------------------------------
do
  local src = os.getenv("FUSELAB_SRC") or "."
  local text = t.slurp(src .. "/graph/ops.def")
  t.ok(text, "ops.def readable at $FUSELAB_SRC/graph/ops.def")
  local rows, missing, nd_missing = 0, {}, {}
  for line in (text or ""):gmatch("[^\n]+") do
    local name = line:match('^OP%(%s*[%w_]+%s*,%s*"([%w_]+)"')
    if name then
      rows = rows + 1
      local grad = line:match(",%s*([%w_]+)%s*,%s*[%w_|]+%s*%)%s*$")
      if grad == "gr_none" then
        if not nondiff[name] then nd_missing[#nd_missing + 1] = name end
      elseif not grad then
        missing[#missing + 1] = name .. " (no grad column)"
      elseif not covered[name] and not refused[name] then
        missing[#missing + 1] = name
      end
    end
  end
  t.ok(rows > 60, "ops.def: " .. rows .. " ops read")
  t.is(missing, {}, "every differentiable op has a passing gradient check")
  t.is(nd_missing, {}, "every op without a derivative is checked to give no grad")
end
-- a backward graph compiled: max_pool2d's gradient over overlapping
-- windows as C code equals eager backward's
do
  fl.manual_seed(4)
  local x = fl.randn(2, 3, 9, 7):relu():requires_grad_()
  local y = (x:max_pool2d({3, 3}, {stride = 2, padding = 1}) * fl.randn(2, 3, 5, 4)):sum()
  local out = fl.backward_graph(y):fuse():codegen("cpu"):run()
  y:backward()
  t.ok(fl.allclose(out, x.grad, 1e-6, 1e-7), "max_pool2d's backward graph compiled to C equals eager backward")
  local w = fl.randn(7, 5, {requires_grad = true})
  local e = (fl.embedding(fl.tensor{{3, 1, 3}, {0, 3, 6}}, w) * fl.randn(2, 3, 5)):sum()
  local gw = fl.backward_graph(e):fuse():codegen("cpu"):run()
  e:backward()
  t.ok(fl.allclose(gw, w.grad, 1e-6, 1e-7), "embedding's backward graph compiled to C: repeated ids add up")
end

-- a backward graph keeps only the saved values its rules read: linear's
-- weight serves x's gradient alone, so without one it is not kept
do
  local x, w = fl.randn(3, 4), fl.randn(2, 4, {requires_grad = true})
  local listing = tostring(fl.backward_graph(fl.linear(x, w):sum()))
  t.ok(listing:find("saved by linear: input 1", 1, true) and
       not listing:find("saved by linear: input 2", 1, true),
       "the backward graph keeps x for w's gradient, not w")
end

-- the outputs named for their parameters
do
  local m = fl.nn.Sequential(fl.nn.Linear(4, 3), fl.nn.ReLU(), fl.nn.Linear(3, 2))
  local y = m(fl.randn(5, 4)):sum()
  local g = fl.backward_graph(y, {params = m})
  local names = {}
  for _, n in ipairs(g:nodes()) do if n.name then names[n.name] = true end end
  t.ok(names["grad of 0.weight"] and names["grad of 2.bias"], "fl.backward_graph{params = m} names each gradient")
  t.raises(function() fl.backward_graph(y, {params = 5}) end, "params must be a module",
           "params of the wrong type: an error naming it")
end

---------------------------------------------------------------------------
-- gradients of gradients: create_graph = true (PyTorch's double backward)
---------------------------------------------------------------------------
-- Elementwise closed forms: h = d/dx sum(f'(x)) = f''(x), computed by
-- fl.grad twice in float32, within D2TOL = 2e-6 of max(|f''|, 1).  Mixed
-- ops: the Hessian times a direction v, H v, by fl.grad twice, against a
-- central second difference of the same function written in Lua doubles
-- (step 1e-4: truncation and rounding both near 1e-8), within HTOL = 1e-5
-- of the largest |H v| entry.  A tiny MLP's H v and the gradient penalty's
-- gradient against central differences (Richardson) of fuselab's own
-- float32 first gradients, within FDTOL = 2e-4 of their size.
do
  local D2TOL, HTOL, FDTOL = 2e-6, 1e-5, 2e-4
  local function flat(x) return x:reshape(x:numel()):tolist() end
  local function leafv(v, shape)
    local x = fl.tensor(v, {dtype = "float32"})
    if shape then x = x:reshape(table.unpack(shape)) end
    return x:requires_grad_()
  end
  local function maxabs(l)
    local m = 0
    for _, v in ipairs(l) do m = math.max(m, math.abs(v)) end
    return m
  end
  -- |got - want| <= tol * scale elementwise; the worst ratio in the name
  local function close(got, want, tol, scale, name)
    local worst, at = 0, 0
    for i = 1, #want do
      local r = math.abs(got[i] - want[i]) / (tol * scale)
      if not (r <= worst) then worst, at = r, i end
    end
    return t.ok(#got == #want and worst <= 1, name, ("worst at %d: got %s, want %s"):format(
      at, tostring(got[at]), tostring(want[at])))
  end

  -- fn() under pcall: an error is a failure of name, and the rest runs
  local function guard(name, fn)
    local ok, err = pcall(fn)
    if not ok then t.ok(false, name, tostring(err)) end
  end

  local xs = {-1.7, -0.8, -0.3, 0.2, 0.9, 1.6}
  -- f, then f'' in Lua doubles
  local function phi(v) return math.exp(-v * v / 2) / math.sqrt(2 * math.pi) end
  local function sig(v) return 1 / (1 + math.exp(-v)) end
  local elementwise = {
    {"x^3 (x:pow(3))", function(x) return x:pow(3) end, function(v) return 6 * v end},
    {"x*x*x", function(x) return x * x * x end, function(v) return 6 * v end},
    {"sin", function(x) return x:sin() end, function(v) return -math.sin(v) end},
    {"cos", function(x) return x:cos() end, function(v) return -math.cos(v) end},
    {"exp", function(x) return x:exp() end, function(v) return math.exp(v) end},
    {"tanh", function(x) return x:tanh() end,
     function(v) local th = math.tanh(v); return -2 * th * (1 - th * th) end},
    {"sigmoid", function(x) return x:sigmoid() end,
     function(v) local s = sig(v); return s * (1 - s) * (1 - 2 * s) end},
    {"gelu", function(x) return x:gelu() end, function(v) return phi(v) * (2 - v * v) end},
    {"log", function(x) return (x * x + 1):log() end,
     function(v) return (2 - 2 * v * v) / (1 + v * v) ^ 2 end},
    {"sqrt", function(x) return (x * x + 1):sqrt() end, function(v) return (1 + v * v) ^ -1.5 end},
    {"div", function(x) return 1 / (x * x + 1) end,
     function(v) return (6 * v * v - 2) / (1 + v * v) ^ 3 end},
  }
  for _, c in ipairs(elementwise) do
    local name = c[1] .. ": fl.grad twice gives f''"
    guard(name, function()
      local x = leafv(xs)
      local g = fl.grad(c[2](x):sum(), {x}, {create_graph = true})[1]
      local h = fl.grad(g:sum(), {x})[1]
      local want = {}
      for i, v in ipairs(xs) do want[i] = c[3](v) end
      close(flat(h), want, D2TOL, math.max(maxabs(want), 1), name)
    end)
  end

  -- mixed partials of sum(x x y): d/dx = 2 x y, d/dy = x^2
  guard("mixed partials", function()
    local x, y = leafv{0.5, -1.5, 2.0}, leafv{1.25, 0.75, -0.5}
    local gx, gy = table.unpack(fl.grad((x * x * y):sum(), {x, y}, {create_graph = true}))
    local hxx, hxy = table.unpack(fl.grad(gx:sum(), {x, y}))
    local hyx = fl.grad(gy:sum(), {x, y}, {allow_unused = true})
    close(flat(hxx), {2.5, 1.5, -1.0}, D2TOL, 4, "x*x*y: d2/dx2 = 2y")
    close(flat(hxy), {1.0, -3.0, 4.0}, D2TOL, 4, "x*x*y: d2/dxdy = 2x")
    close(flat(hyx[1]), {1.0, -3.0, 4.0}, D2TOL, 4, "x*x*y: d2/dydx = 2x, the other order")
    t.ok(hyx[2] == false, "x*x*y: d2/dy2 is unused (x^2 does not depend on y)")
  end)

  -- H v by fl.grad twice against a second difference in Lua doubles.
  -- spec: {name, fuselab f(...) -> scalar, Lua f(list of flat lists) ->
  -- number, inputs {values, shape}}
  local function hvp_case(name, ffl, flua, inputs)
    guard(name .. ": H v by fl.grad twice", function()
      local leaves, V, vl = {}, {}, {}
      for k, inp in ipairs(inputs) do
        leaves[k] = leafv(inp[1], inp[2])
        vl[k] = {}
        for i = 1, #inp[1] do vl[k][i] = math.random() * 2 - 1 end
        V[k] = fl.tensor(vl[k]):reshape(table.unpack(inp[2]))
      end
      local gs = fl.grad(ffl(table.unpack(leaves)), leaves, {create_graph = true})
      local dot
      for k = 1, #leaves do
        local d = (gs[k] * V[k]):sum()
        dot = dot and dot + d or d
      end
      local hv = fl.grad(dot, leaves, {allow_unused = true})
      local eps = 1e-4
      local function at(sv, k, i, se)   -- f at x + sv eps v + se eps e_ki
        local args = {}
        for kk, inp in ipairs(inputs) do
          args[kk] = {}
          for ii, v in ipairs(inp[1]) do
            args[kk][ii] = v + sv * eps * vl[kk][ii] + ((kk == k and ii == i) and se * eps or 0)
          end
        end
        return flua(args, inputs)
      end
      local got, want = {}, {}
      for k, inp in ipairs(inputs) do
        local h = hv[k] and flat(hv[k]) or {}
        for i = 1, #inp[1] do
          got[#got + 1] = h[i] or 0
          want[#want + 1] = (at(1, k, i, 1) - at(1, k, i, -1) - at(-1, k, i, 1) + at(-1, k, i, -1))
                            / (4 * eps * eps)
        end
      end
      close(got, want, HTOL, maxabs(want), name .. ": H v by fl.grad twice")
    end)
  end
  local function rnd(n, lo, hi)
    local l = {}
    for i = 1, n do l[i] = (lo or -1) + ((hi or 1) - (lo or -1)) * math.random() end
    return l
  end

  -- softmax and log_softmax over rows of [2, 4], weighted by R
  local R = rnd(8)
  local function softmax_rows(x, log)
    local out = {}
    for r = 0, 1 do
      local m, s = -math.huge, 0
      for c = 1, 4 do m = math.max(m, x[r * 4 + c]) end
      for c = 1, 4 do s = s + math.exp(x[r * 4 + c] - m) end
      for c = 1, 4 do
        out[r * 4 + c] = log and x[r * 4 + c] - m - math.log(s) or math.exp(x[r * 4 + c] - m) / s
      end
    end
    return out
  end
  local function wsum(l, w)
    local s = 0
    for i = 1, #l do s = s + l[i] * w[i] end
    return s
  end
  local Rt = fl.tensor(R):reshape(2, 4)
  hvp_case("softmax", function(x) return (x:softmax(2) * Rt):sum() end,
           function(a) return wsum(softmax_rows(a[1]), R) end, {{rnd(8, -2, 2), {2, 4}}})
  hvp_case("log_softmax", function(x) return (x:log_softmax(2) * Rt):sum() end,
           function(a) return wsum(softmax_rows(a[1], true), R) end, {{rnd(8, -2, 2), {2, 4}}})
  -- the product of log_softmax's output with itself: its Hessian is not
  -- a multiple of the seed's
  hvp_case("log_softmax squared", function(x) local y = x:log_softmax(2); return (y * y * Rt):sum() end,
           function(a)
             local y = softmax_rows(a[1], true)
             for i = 1, #y do y[i] = y[i] * y[i] end
             return wsum(y, R)
           end, {{rnd(8, -2, 2), {2, 4}}})

  -- layer_norm over the last dim of [2, 4], with weight and bias
  hvp_case("layer_norm", function(x, w, b) return (x:layer_norm({4}, w, b) * Rt):sum() end,
           function(a)
             local x, w, b, out = a[1], a[2], a[3], {}
             for r = 0, 1 do
               local mu, var = 0, 0
               for c = 1, 4 do mu = mu + x[r * 4 + c] / 4 end
               for c = 1, 4 do var = var + (x[r * 4 + c] - mu) ^ 2 / 4 end
               for c = 1, 4 do
                 out[r * 4 + c] = (x[r * 4 + c] - mu) / math.sqrt(var + 1e-5) * w[c] + b[c]
               end
             end
             return wsum(out, R)
           end, {{rnd(8, -2, 2), {2, 4}}, {rnd(4, 0.5, 1.5), {4}}, {rnd(4), {4}}})

  -- matmul [2, 3] x [3, 2], the product squared (bilinear alone has no
  -- diagonal blocks)
  local R4 = rnd(4)
  local R4t = fl.tensor(R4):reshape(2, 2)
  hvp_case("matmul", function(a, b) local p = a:matmul(b); return (p * p * R4t):sum() end,
           function(a)
             local A, B, s = a[1], a[2], 0
             for i = 0, 1 do
               for j = 0, 1 do
                 local p = 0
                 for k = 0, 2 do p = p + A[i * 3 + k + 1] * B[k * 2 + j + 1] end
                 s = s + p * p * R4[i * 2 + j + 1]
               end
             end
             return s
           end, {{rnd(6), {2, 3}}, {rnd(6), {3, 2}}})

  -- sum, mean and broadcasting: y = (x * b):sum(2) over x [2, 3], b [3];
  -- f = sum(y^2 w) + mean(x x) sum(b)
  local W2 = {0.7, -1.3}
  local W2t = fl.tensor(W2)
  hvp_case("sum, mean, broadcasting", function(x, b)
             local y = (x * b):sum(2)
             return (y * y * W2t):sum() + (x * x):mean() * b:sum()
           end,
           function(a)
             local x, b, s, sq = a[1], a[2], 0, 0
             for r = 0, 1 do
               local y = 0
               for c = 1, 3 do y = y + x[r * 3 + c] * b[c] end
               s = s + y * y * W2[r + 1]
             end
             for i = 1, 6 do sq = sq + x[i] * x[i] / 6 end
             return s + sq * (b[1] + b[2] + b[3])
           end, {{rnd(6), {2, 3}}, {rnd(3), {3}}})

  -- a view chain: reshape [2, 6] -> [3, 4], transpose, narrow 2 of 4 rows
  -- (1-based start 2), then y^3 weighted
  local R6 = rnd(6)
  local R6t = fl.tensor(R6):reshape(2, 3)
  hvp_case("reshape, transpose, narrow", function(x)
             local y = x:reshape(3, 4):transpose(1, 2):narrow(1, 2, 2)
             return (y * y * y * R6t):sum()
           end,
           function(a)
             local x, s = a[1], 0
             -- y[i][j] (i in 1..2, j in 1..3) = x as [3,4] at [j][i + 1]
             for i = 1, 2 do
               for j = 1, 3 do
                 local v = x[(j - 1) * 4 + (i + 1)]
                 s = s + v * v * v * R6[(i - 1) * 3 + j]
               end
             end
             return s
           end, {{rnd(12), {2, 6}}})

  -- pow with a tensor exponent: both partials and the mixed one
  hvp_case("pow(x, y)", function(x, y) return (x:pow(y) * R4t):sum() end,
           function(a)
             local s = 0
             for i = 1, 4 do s = s + a[1][i] ^ a[2][i] * R4[i] end
             return s
           end, {{rnd(4, 0.5, 2), {2, 2}}, {rnd(4, -1.5, 2.5), {2, 2}}})

  -- a small MLP (tanh): H v of its loss with respect to its parameters by
  -- fl.grad twice, against a central difference of its first gradient
  -- (fl.grad once, at the parameters moved by +- s v, Richardson)
  guard("a tanh MLP", function()
    fl.manual_seed(11)
    local X, T = fl.randn(5, 3), fl.randn(5, 2)
    local P0 = {fl.randn(4, 3) * 0.8, fl.randn(4) * 0.3, fl.randn(2, 4) * 0.8, fl.randn(2) * 0.3}
    local V = {fl.randn(4, 3), fl.randn(4), fl.randn(2, 4), fl.randn(2)}
    local function loss(p)
      local h = fl.linear(X, p[1], p[2]):tanh()
      local o = fl.linear(h, p[3], p[4])
      return ((o - T) * (o - T)):mean()
    end
    local function params(s)
      local p = {}
      for k = 1, 4 do p[k] = (P0[k] + V[k] * s):detach():requires_grad_() end
      return p
    end
    local p = params(0)
    local gs = fl.grad(loss(p), p, {create_graph = true})
    local dot = (gs[1] * V[1]):sum() + (gs[2] * V[2]):sum() + (gs[3] * V[3]):sum() + (gs[4] * V[4]):sum()
    local hv = fl.grad(dot, p)
    local function grads(s)
      local q = params(s)
      local g = fl.grad(loss(q), q)
      local l = {}
      for k = 1, 4 do for _, v in ipairs(flat(g[k])) do l[#l + 1] = v end end
      return l
    end
    local s = 2e-2
    local gp, gm, gp2, gm2 = grads(s), grads(-s), grads(s / 2), grads(-s / 2)
    local want, got = {}, {}
    for i = 1, #gp do
      local d1, d2 = (gp[i] - gm[i]) / (2 * s), (gp2[i] - gm2[i]) / s
      want[i] = (4 * d2 - d1) / 3
    end
    for k = 1, 4 do for _, v in ipairs(flat(hv[k])) do got[#got + 1] = v end end
    close(got, want, FDTOL, maxabs(want), "a tanh MLP: H v by fl.grad twice matches differences of its gradient")
  end)

  -- the gradient penalty (WGAN-GP): the mean of (|grad_x D(x)| - 1)^2 over
  -- a batch, backward into D's parameters, against central differences of
  -- the penalty along a random direction of the parameters
  guard("gradient penalty", function()
    fl.manual_seed(12)
    local X = fl.randn(6, 3)
    local P0 = {fl.randn(5, 3) * 0.7, fl.randn(5) * 0.3, fl.randn(1, 5) * 0.7, fl.randn(1) * 0.3}
    local V = {fl.randn(5, 3), fl.randn(5), fl.randn(1, 5), fl.randn(1)}
    local function penalty(p, create)
      local x = X:detach():requires_grad_()
      local d = fl.linear(fl.linear(x, p[1], p[2]):tanh(), p[3], p[4])
      local gx = fl.grad(d:sum(), {x}, {create_graph = create})[1]
      local norm = (gx * gx):sum(2):sqrt()
      return ((norm - 1) * (norm - 1)):mean()
    end
    local p = {}
    for k = 1, 4 do p[k] = P0[k]:detach():requires_grad_() end
    local pen = penalty(p, true)
    t.ok(pen.grad_fn ~= nil, "gradient penalty: the penalty has a grad_fn")
    pen:backward()
    t.ok(p[1].grad and p[2].grad and p[3].grad and p[4].grad == nil,
         "gradient penalty: W1, b1, W2 get gradients; b2 does not reach the input gradient")
    local analytic = 0
    for k = 1, 3 do analytic = analytic + (p[k].grad * V[k]):sum():item() end
    local function at(s)
      local q = {}
      for k = 1, 4 do q[k] = (P0[k] + V[k] * s):detach():requires_grad_() end
      return penalty(q, false):item()
    end
    local s = 2e-2
    local d1, d2 = (at(s) - at(-s)) / (2 * s), (at(s / 2) - at(-s / 2)) / s
    local numeric = (4 * d2 - d1) / 3
    t.ok(math.abs(analytic - numeric) <= FDTOL * math.max(math.abs(numeric), 1e-2),
         ("gradient penalty: its gradient matches differences (%.6g vs %.6g)"):format(analytic, numeric))
  end)

  -- backward{create_graph = true}: x.grad has a history, and its backward
  -- adds the second derivative into x.grad
  guard("backward{create_graph}", function()
    local x = leafv{0.3, -1.1, 2.0}
    x:sin():sum():backward({create_graph = true})
    local g = x.grad
    t.ok(g.grad_fn ~= nil and g.requires_grad, "backward{create_graph}: x.grad has a grad_fn")
    close(flat(g), {math.cos(0.3), math.cos(-1.1), math.cos(2.0)}, D2TOL, 1, "backward{create_graph}: x.grad = cos x")
    x.grad:sum():backward()
    close(flat(x.grad), {math.cos(0.3) - math.sin(0.3), math.cos(-1.1) - math.sin(-1.1),
                         math.cos(2.0) - math.sin(2.0)}, D2TOL, 1,
          "x.grad:sum():backward() adds the second derivative: cos x - sin x")
    t.ok(x.grad.grad_fn == nil, "a backward without create_graph leaves x.grad without history")
    -- two create_graph backwards: the sum is recorded
    local z = leafv{0.5, 1.5}
    local y = (z * z * z):sum()
    y:backward({create_graph = true})
    y:backward({create_graph = true})     -- retain_graph defaults to create_graph
    t.is(flat(z.grad), {1.5, 13.5}, "two backward{create_graph}: x.grad accumulates 2 * 3x^2")
    t.is(z.grad.grad_fn.name, "AddBackward", "the accumulation is recorded (grad + new)")
    local h = fl.grad(z.grad:sum(), {z})[1]
    t.is(flat(h), {6, 18}, "the accumulated x.grad differentiates to 2 * 6x")
    z.grad = nil
  end)

  -- without create_graph nothing changes
  guard("without create_graph", function()
    local x = leafv{1, 2}
    local g = fl.grad((x * x):sum(), {x})[1]
    t.ok(g.grad_fn == nil and not g.requires_grad, "fl.grad without create_graph: no grad_fn")
    local gf = fl.grad((x * x):sum(), {x}, {create_graph = false})[1]
    t.ok(gf.grad_fn == nil, "create_graph = false: no grad_fn")
    ;(x * x):sum():backward()
    t.ok(x.grad.grad_fn == nil and not x.grad.requires_grad, "backward without create_graph: x.grad has no history")
    -- a constant gradient (linear in x) has no history either
    local c = fl.grad((x * 3):sum(), {x}, {create_graph = true})[1]
    t.ok(c.grad_fn == nil and not c.requires_grad, "create_graph of a gradient that depends on nothing: no history")
  end)

  -- create_graph under fl.no_grad records all the same (as PyTorch's engine)
  guard("create_graph under fl.no_grad", function()
    local x = leafv{1, 2}
    local y = (x * x * x):sum()
    local g = fl.no_grad(function() return fl.grad(y, {x}, {create_graph = true})[1] end)
    t.ok(g.requires_grad, "create_graph inside fl.no_grad still records")
    -- retain_graph defaults to true with create_graph, false stays honoured
    local g2 = fl.grad(y, {x}, {create_graph = true, retain_graph = false})[1]
    t.is(flat(g2), {3, 12}, "create_graph with retain_graph = false")
    t.raises(function() y:backward() end, "freed", "retain_graph = false frees the saved values")
    t.raises(function() fl.grad(g2:sum(), {x}) end, "freed",
             "and the gradient of that gradient then needs them")
  end)

  -- a seed that requires grad: the gradient is differentiable in it
  guard("a seed that requires grad", function()
    local x, v = leafv{1, 2, 3}, leafv{0.5, -1, 2}
    local g = fl.grad((x * x):sum(), {x}, {grad_outputs = {fl.ones(1):sum() * 1}, create_graph = true})[1]
    t.is(flat(g), {2, 4, 6}, "a seed without history")
    local gv = fl.grad(x * x, {x}, {grad_outputs = {v}, create_graph = true})[1]
    t.is(flat(fl.grad(gv:sum(), {v})[1]), {2, 4, 6}, "d/dv of (2 x v) is 2x: the seed's history is kept")
    local pass = fl.grad(x + 1, {x}, {grad_outputs = {v}, create_graph = true})[1]
    t.ok(pass.grad_fn ~= nil and not pass.is_leaf, "a seed passed through unchanged: a view of it, not the leaf itself")
    t.is(flat(fl.grad((pass * pass):sum(), {v})[1]), {1, -2, 4}, "its gradient reaches the seed")
    local v64 = fl.tensor({1, 1, 1}, {dtype = "float16"}):requires_grad_()
    local g16 = fl.grad(x * x, {x}, {grad_outputs = {v64}, create_graph = true})[1]
    t.ok(g16.requires_grad and fl.grad(g16:sum(), {v64})[1] ~= nil,
         "a seed of another dtype is cast by a recorded op")
  end)

  -- dropout's mask is a constant of the double backward
  guard("dropout", function()
    fl.manual_seed(3)
    local x = leafv(rnd(16, 0.5, 1.5))
    local y = fl.dropout(x, 0.5, true)
    local g = fl.grad((y * y * y):sum(), {x}, {create_graph = true})[1]
    local h = flat(fl.grad(g:sum(), {x})[1])
    local xv, yv, want = flat(x), flat(y), {}
    for i = 1, #xv do
      local m = yv[i] / xv[i]
      want[i] = 6 * m * m * m * xv[i]
    end
    close(h, want, D2TOL, maxabs(want), "dropout: d2/dx2 of sum(dropout(x)^3) = 6 m^3 x")
  end)

  -- an op whose gradient has no derivative here: a clear error, and the
  -- session goes on
  guard("an op without a derivative", function()
    local w = leafv(rnd(6), {3, 2})
    local e = fl.embedding(fl.tensor{0, 2, 2}, w)
    local gw = fl.grad((e * e):sum(), {w}, {create_graph = true})[1]
    t.ok(gw.requires_grad, "embedding's weight gradient is recorded (index_add)")
    t.raises(function() fl.grad(gw:sum(), {w}) end, "index_add has no derivative",
             "the gradient of that gradient: an error naming index_add")
    local x = leafv{1, 2}
    t.is(flat(fl.grad((x * x):sum(), {x})[1]), {2, 4}, "and the session goes on")
  end)

  -- zero_grad(false) of a gradient with a history
  guard("zero_grad(false)", function()
    local m = fl.nn.Linear(2, 1)
    m(fl.ones(1, 2)):pow(2):sum():backward({create_graph = true})
    t.ok(m.weight.grad.requires_grad, "backward{create_graph} through a module: weight.grad has a history")
    m:zero_grad(false)
    t.ok(m.weight.grad ~= nil and m.weight.grad:abs():sum():item() == 0 and not m.weight.grad.requires_grad,
         "m:zero_grad(false) zeroes it, detached")
  end)

  -- nothing leaks: the cycle x.grad -> its history -> x is cut when x goes
  do
    collectgarbage()
    collectgarbage()
    local live = fl._autograd_live()
    do
      local x = leafv{1, 2, 3}
      x:tanh():sum():backward({create_graph = true})
      local g = fl.grad(x.grad:sum(), {x}, {create_graph = true})[1]
      local h = fl.grad(g:sum(), {x})[1]
    end
    collectgarbage()
    collectgarbage()
    t.is(fl._autograd_live(), live, "backward{create_graph} and fl.grad thrice: the tape is freed after")
  end
end

t.diag(("worst finite-difference error: %.3g of its bound (%s)"):format(worst.ratio, worst.name or "-"))
t.diag(ncases .. " cases")
t.done()
