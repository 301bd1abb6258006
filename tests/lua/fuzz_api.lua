-- fuzz_api.lua -- random calls of the tensor API with hostile arguments:
-- sizes huge (2^31, 2^53, 2^62, 2^63), negative, NaN, inf, fractional or
-- not numbers; views of views (expand, transpose, narrow, permute,
-- unsqueeze, squeeze, reshape, view); empty tensors; every dtype; in-place
-- writes through such views under fl.compile and fl.capture.  Each call
-- runs under pcall and must either return or raise a Lua error string that
-- names the op (DESIGN §5); the process must survive it (the sanitized
-- build runs the same calls under ASan and UBSan).
--
-- Seeded and reproducible: the suite always runs seed 1 (a build lands or
-- fails on the same calls every time); FUSELAB_FUZZ_SEED=n runs another
-- seed and FUSELAB_FUZZ_SEED=time a new one each run (both printed first), FUSELAB_FUZZ_CALLS=n sets how many calls it makes, and
-- FUSELAB_FUZZ_VERBOSE=1 prints each call before it runs (the last line
-- printed before a crash is the call that crashed).  A time bound may end
-- the run early: it says how many calls ran and never fails for that.
--
-- The calls must not ask for real memory by the gigabyte (a sanitizer's
-- allocator hands out 100 GB lazily and the process then dies touching
-- it), so an op that computes is called only on tensors whose sizes
-- multiply to at most SMALL (results stay under 2^24 elements) or to at
-- least 2^41 (the checks refuse those before allocating anything, or the
-- result is empty); views, printing and queries take any tensor.
local fl = fl or require "fuselab"
local t = require "tap"

io.stdout:setvbuf("line")
local asan = os.getenv("FUSELAB_ASAN") == "1"
local seed_env = os.getenv("FUSELAB_FUZZ_SEED")
local seed = seed_env == "time" and os.time() % 1000000 or tonumber(seed_env or "") or 1
local max_calls = tonumber(os.getenv("FUSELAB_FUZZ_CALLS") or "") or 300000
local verbose = os.getenv("FUSELAB_FUZZ_VERBOSE") == "1"
local budget = asan and 30 or 20          -- seconds of calls at most
t.diag(("seed %d (FUSELAB_FUZZ_SEED=%d replays this run)"):format(seed, seed))
math.randomseed(seed)
fl.manual_seed(seed)

local R = math.random
local function pick(list) return list[R(#list)] end

local SMALL = 256
local ABSURD = 2.0^41
local DTYPES = {"float32", "float16", "bfloat16", "int64", "bool"}

---------------------------------------------------------------------------
-- hostile values
---------------------------------------------------------------------------
local TINY = {0, 1, 1, 2, 2, 3, 4}
local HUGE = {2^31, (1 << 31) - 1, 1 << 32, 2^53, 2^53 + 2, 1 << 62, 2^62,
              2^63, math.maxinteger, math.mininteger, -(1 << 62), 1e300}
local BAD = {-1, -1, -2, -3, 0 / 0, 1 / 0, -1 / 0, 0.5, 2.5, -0.0, 1e-300}
local ODD = {"2", true, {}, fl.ones(1), print}

-- a size (or start, length, padding...): mostly small, often hostile
local function size_arg()
  local r = R()
  if r < 0.55 then return pick(TINY)
  elseif r < 0.8 then return pick(HUGE)
  elseif r < 0.95 then return pick(BAD)
  else return pick(ODD) end
end

-- a dim: 1-based, negative from the end, or wrong
local function dim_arg()
  local r = R()
  if r < 0.7 then return pick{1, 1, 2, 2, 3, -1, -1, -2} end
  return pick{0, 4, 5, 9, -9, 1 << 31, math.mininteger, 1.5, 0 / 0, "1", true}
end

-- a Lua number as an operand
local function number_arg()
  return pick{0, 1, -1, 2, 0.5, -3, 1 / 0, -1 / 0, 0 / 0, 2^63, math.maxinteger,
              math.mininteger, 1e-300, 3.25}
end

-- The sizes multiplied with a 0 counting as 1: what the size limits look
-- at.  nil when some size is not a plain count (the call fails before
-- anything is allocated).
local function extent_of(sizes)
  local p = 1.0
  for _, s in ipairs(sizes) do
    if math.type(s) == nil or s ~= s or s < 0 or s ~= math.floor(s) or s >= 2^63 then
      return nil
    end
    if s > 0 then p = p * s end
  end
  return p
end

local function allocation_ok(sizes)
  local e = extent_of(sizes)
  return e == nil or e <= SMALL or e >= ABSURD
end

local function extent(x)
  return extent_of(x.shape) or math.huge
end

-- may an op that computes take x?  A huge empty tensor gives an empty
-- result or one past 2^41 elements (refused), except where padding makes
-- elements out of nothing: conv2d and the pools of [2^33,256,0,1].
local function computable(x, pads)
  if not fl.is_tensor(x) then return true end
  local e = extent(x)
  if pads and e >= ABSURD and x:numel() == 0 then return false end
  return e <= SMALL or e >= ABSURD
end

---------------------------------------------------------------------------
-- tensors: small bases of every dtype, and views of them
---------------------------------------------------------------------------
local function small_shape()
  local s = {}
  for i = 1, R(0, 4) do s[i] = pick(TINY) end
  return s
end

local function base()
  local shape, dt = small_shape(), pick(DTYPES)
  local maker = R(6)
  local ok, x = pcall(function()
    if maker == 1 then return fl.zeros(shape, {dtype = dt})
    elseif maker == 2 then return fl.ones(shape, {dtype = dt})
    elseif maker == 3 then return fl.randn(shape):to(dt)
    elseif maker == 4 then return fl.rand(shape):to(dt)
    elseif maker == 5 then return fl.full(shape, number_arg(), {dtype = dt})
    else
      local n = extent_of(shape) or 1
      local z = 1
      for _, s in ipairs(shape) do if s == 0 then z = 0 end end
      return fl.arange(n * z):reshape(shape):to(dt)
    end
  end)
  if ok then return x end
  return fl.ones(2, 3)
end

-- results go back into the pool; big views also into their own, which
-- small results would otherwise crowd out
local pool, big = {}, {fl.ones(1):expand(1 << 62), fl.zeros(0, 1 << 62)}
for i = 1, 24 do pool[i] = base() end
local function any_tensor()
  local r = R()
  if r < 0.15 then return base() end
  if r < 0.35 then return big[R(#big)] end
  return pool[R(#pool)]
end
local function keep(v)
  if not fl.is_tensor(v) then return end
  pool[R(#pool)] = v
  if extent(v) > SMALL then
    if #big < 16 then big[#big + 1] = v else big[R(#big)] = v end
  end
end

local function sizes_list(n)
  local s = {}
  for i = 1, n do s[i] = size_arg() end
  return s
end

---------------------------------------------------------------------------
-- the calls: each returns the names its error may name and a function
---------------------------------------------------------------------------
-- x:name(...) as a REPL line writes it, so an argument error can say
-- which method it was ("bad argument #2 to 'narrow'")
local callers = {}
local function method(name, ...)
  local args = table.pack(...)
  local f = callers[name]
  if not f then
    f = assert(load("local x = ... return function(...) return x:" .. name .. "(...) end"))
    callers[name] = f
  end
  return function(x) return f(x)(table.unpack(args, 1, args.n)) end
end

local UNARY = {"abs", "neg", "exp", "log", "sqrt", "rsqrt", "sin", "cos", "tanh",
               "sigmoid", "relu", "gelu", "silu", "erf", "contiguous"}
local BINARY = {"add", "sub", "mul", "div", "pow", "maximum", "minimum", "eq",
                "ne", "lt", "le", "gt", "ge"}
local REDUCE = {"sum", "mean", "amax", "amin", "var", "argmax"}
local OPERATORS = {
  add = function(a, b) return a + b end, sub = function(a, b) return a - b end,
  mul = function(a, b) return a * b end, div = function(a, b) return a / b end,
  pow = function(a, b) return a ^ b end,
}

-- light calls take any tensor (views, queries, printing); heavy ones only
-- computable tensors.  Each entry: function(x) -> names, fn, heavy, args
local calls = {
  -- creation with hostile sizes
  function()
    local n = R(0, 3)
    local s = sizes_list(n)
    if not allocation_ok(s) then s = small_shape() end
    local which = pick{"zeros", "ones", "rand", "randn"}
    return {which}, function() return fl[which](s, {dtype = pick(DTYPES)}) end
  end,
  function()
    local a, b = size_arg(), size_arg()
    if not allocation_ok{a} or not allocation_ok{b} or not allocation_ok{a, b} then a, b = 2, 3 end
    return {"eye"}, function() return fl.eye(a, b) end
  end,
  function()
    local a, b, s = size_arg(), size_arg(), pick{1, -1, 0.5, 1e-300, 0 / 0, 2^62, 0}
    -- arange reads the leading numbers: (n), (a, b) or (a, b, step)
    local n = 0
    if type(a) == "number" then
      if type(b) ~= "number" then n = a
      elseif type(s) ~= "number" or s == 0 then n = b - a
      else n = (b - a) / s end
    end
    n = math.abs(n)
    if n == n and n > SMALL and n < ABSURD then a, b, s = 0, 5, 1 end
    return {"arange"}, function() return fl.arange(a, b, s) end
  end,
  function()
    local s = sizes_list(R(0, 2))
    if not allocation_ok(s) then s = {2} end
    return {"full"}, function() return fl.full(s, number_arg()) end
  end,
  -- views: any tensor
  function(x) return {"expand"}, method("expand", table.unpack(sizes_list(R(0, 4)))) end,
  function(x) return {"expand"}, method("expand", sizes_list(R(0, 3))) end,
  function(x) return {"transpose"}, method("transpose", dim_arg(), dim_arg()) end,
  function(x)
    local p = {}
    for i = 1, x:dim() + pick{0, 0, 0, 1, -1} do p[i] = i end
    for i = #p, 2, -1 do local j = R(i) p[i], p[j] = p[j], p[i] end
    if R() < 0.2 and #p > 0 then p[R(#p)] = dim_arg() end
    return {"permute"}, method("permute", table.unpack(p))
  end,
  function(x) return {"unsqueeze"}, method("unsqueeze", dim_arg()) end,
  function(x) return {"squeeze"}, method("squeeze", R() < 0.3 and dim_arg() or nil) end,
  function(x) return {"narrow"}, method("narrow", dim_arg(), size_arg(), size_arg()) end,
  function(x) return {"narrow"}, method("narrow", dim_arg(), pick{-1, -2, 1}, pick{0, 1, 2}) end,
  function(x) return {"view"}, method("view", table.unpack(sizes_list(R(0, 3)))) end,
  function(x)
    local n = x:numel()
    return {"view"}, method("view", pick{{n}, {-1}, {1, -1}, {-1, 1, 1}, {n, 1}})
  end,
  -- queries and printing: any tensor
  function(x) return {"numel"}, method("numel") end,
  function(x) return {"dim"}, method("dim") end,
  function(x) return {"size"}, method("size", R() < 0.3 and nil or dim_arg()) end,
  function(x) return {"shape"}, function() return x.shape, x.dtype, x.device end end,
  function(x) return {"tostring"}, function() return tostring(x) end end,
  function(x) return {"item"}, method("item") end,
  function(x) return {"tolist"}, method("tolist") end,
  function(x) return {"is_tensor"}, function() return fl.is_tensor(x) end end,
  -- computing: computable tensors only
  function(x) local op = pick(UNARY) return {op}, method(op), true end,
  function(x)
    return {"gelu", "gelu_tanh"}, method("gelu", pick{{approximate = "tanh"}, {approximate = "no"}}), true
  end,
  function(x) return {"clamp"}, method("clamp", number_arg(), number_arg()), true end,
  function(x)
    local op, y = pick(BINARY), R() < 0.5 and any_tensor() or number_arg()
    return {op}, method(op, y), true, y
  end,
  function(x)
    local op, y = pick{"add", "sub", "mul", "div", "pow"}, R() < 0.5 and any_tensor() or number_arg()
    local f = OPERATORS[op]
    if R() < 0.5 then return {op}, function() return f(x, y) end, true, y end
    return {op}, function() return f(y, x) end, true, y
  end,
  function(x) return {"neg"}, function() return -x end, true end,
  function(x)
    local c, y = any_tensor(), any_tensor()
    return {"where"}, function() return fl.where(c, x, y) end, true, c, y
  end,
  function(x)
    local op = pick(REDUCE)
    local r = R(4)
    if r == 1 then return {op}, method(op), true end
    if r == 2 then return {op}, method(op, dim_arg()), true end
    if r == 3 then return {op}, method(op, dim_arg(), R() < 0.5), true end
    return {op}, method(op, dim_arg(), true, op == "var" and {correction = pick{0, 1, 2.5}} or nil), true
  end,
  function(x) local op = pick{"softmax", "log_softmax"} return {op}, method(op, dim_arg()), true end,
  function(x) local y = any_tensor() return {"matmul"}, method("matmul", y), true, y end,
  function(x)
    local w, b = any_tensor(), R() < 0.5 and any_tensor() or nil
    return {"linear"}, function() return fl.linear(x, w, b) end, true, w, b
  end,
  function(x)
    local list = {x}
    for i = 2, R(1, 4) do list[i] = any_tensor() end
    local d = R() < 0.3 and dim_arg() or nil
    return {"cat"}, function() return fl.cat(list, d) end, true, table.unpack(list)
  end,
  function(x)
    local w = any_tensor()
    return {"embedding"}, function() return fl.embedding(x, w) end, true, w
  end,
  function(x)
    local w = any_tensor()
    local o = {stride = pick{1, 2, 0, -1, 2^31, 1.5}, padding = pick{0, 1, 3, -1, 2^31, 2^62, 0 / 0}}
    return {"conv2d"}, function() return fl.conv2d(x, w, nil, o) end, true, w
  end,
  function(x)
    local op = pick{"max_pool2d", "avg_pool2d"}
    local k = pick{1, 2, 3, 0, -1, 2^31, 2^62, {1, 2}, 1.5}
    local o = {stride = pick{1, 2, 2^31}, padding = pick{0, 1, 2^31}}
    return {op}, method(op, k, o), true
  end,
  function(x)
    local s = {}
    for i = 1, R(1, 2) do s[i] = pick{1, 2, 3, 0, -1, 2^62} end
    local op = pick{"layer_norm", "rms_norm"}
    return {op}, method(op, s), true
  end,
  function(x)
    local m, v = any_tensor(), any_tensor()
    return {"batch_norm"}, function() return fl.batch_norm(x, m, v) end, true, m, v
  end,
  function(x) return {"reshape"}, method("reshape", table.unpack(sizes_list(R(0, 3)))), true end,
  function(x)
    return {"reshape"}, method("reshape", pick{{-1}, {1, -1}, {x:numel(), 1}, {-1, -1}}), true
  end,
  function(x) local d = pick(DTYPES) return {"to"}, method("to", d), true end,
  function(x)
    local y = R() < 0.7 and any_tensor() or number_arg()
    return {"allclose"}, function() return fl.allclose(x, y) end, true, y
  end,
  function(x)
    local op = pick{"copy_", "add_", "sub_", "mul_", "div_"}
    local y = R() < 0.7 and any_tensor() or number_arg()
    return {op, op:sub(1, -2)}, method(op, y), true, y
  end,
  function(x) return {"fill_"}, method("fill_", number_arg()), true end,
  -- autograd: a tape over hostile tensors, then backward with a hostile
  -- gradient (any shape, any dtype, none for a non-scalar), a second
  -- backward, fl.grad with an unrelated input, .grad assigned garbage
  function(x)
    local op, y = pick{"exp", "tanh", "relu", "sum", "mean", "amax", "softmax", "matmul", "mul"},
                  any_tensor()
    local g = R() < 0.5 and any_tensor() or nil
    local retain, again = R() < 0.5, R() < 0.3
    return {"backward", "requires_grad_", op, "detach"}, function()
      local v = x:detach():requires_grad_()
      local z
      if op == "softmax" then z = v:softmax(pick{1, -1})
      elseif op == "matmul" or op == "mul" then z = v[op](v, y)
      else z = v[op](v) end
      z:backward(g, {retain_graph = retain})
      if again then z:backward(g) end
      return v.grad
    end, true, y, g
  end,
  function(x)
    local y, g = any_tensor(), pick{any_tensor(), 3, "x", false}
    return {"grad", "requires_grad_", "mul"}, function()
      local v = x:detach():requires_grad_()
      local r = fl.grad((v * y):sum(), {v, y}, {allow_unused = R() < 0.5})
      v.grad = g
      return r
    end, true, y
  end,
  function(x) return {"zero_"}, method("zero_"), true end,
  -- in-place writes captured (fl.compile, fl.capture) through a view made
  -- with hostile arguments: the graph gets the write and its write-back
  function(x)
    local op = pick{"copy_", "add_", "sub_", "mul_", "div_", "fill_"}
    local y = (op == "fill_" or R() < 0.3) and number_arg() or any_tensor()
    local view, d, s, l = pick{"narrow", "transpose", "self"}, dim_arg(), size_arg(), size_arg()
    local body = function(v)
      local w = view == "narrow" and v:narrow(d, s, l) or view == "transpose" and v:transpose(d, 1) or v
      w[op](w, y)
      return v * 1
    end
    local how = pick{"compile", "capture"}
    -- a captured copy_ converts y's dtype with a recorded `to`, whose size
    -- check may be the one that refuses
    return {op, op:sub(1, -2), view, "capture", "compile", "graph", "to"}, function(v)
      if how == "compile" then return fl.compile(body)(v) end
      return fl.capture(body, v)
    end, true, fl.is_tensor(y) and y or nil
  end,
}

-- what a call shows in verbose mode and in failure messages
local function show(v)
  if fl.is_tensor(v) then
    return ("%s%s"):format(v.dtype, t.show(v.shape))
  end
  return t.show(v)
end

---------------------------------------------------------------------------
-- the run
---------------------------------------------------------------------------
local start = fl.now()
local ran, raised, skipped, bad = 0, 0, 0, 0
local counts = {}
local slowest, slow_call = 0, "none"
local on_huge, returned = 0, 0
for call = 1, max_calls do
  if fl.now() - start > budget then break end
  local x = any_tensor()
  local names, fn, heavy, a1, a2, a3, a4 = calls[R(#calls)](x)
  local args = {x, a1, a2, a3, a4}
  local go = true
  if heavy then
    local pads = names[1] == "conv2d" or names[1]:find("pool2d") ~= nil
    for i = 1, 5 do if not computable(args[i], pads) then go = false end end
  end
  if go and names[1] == "tolist" then
    -- past 2^26 Lua values tolist refuses; below that a big one is slow
    local e = extent(x)
    go = e <= SMALL or e > 2^27
  end
  if not go then
    skipped = skipped + 1
  else
    if verbose then
      io.stderr:write(("call %d: %s on %s\n"):format(call, names[1], show(x)))
    end
    if extent(x) >= ABSURD then on_huge = on_huge + 1 end
    local t0 = fl.now()
    local ok, res = pcall(fn, x)
    local dt = fl.now() - t0
    if dt > slowest then slowest, slow_call = dt, ("%s on %s"):format(names[1], show(x)) end
    ran = ran + 1
    counts[names[1]] = (counts[names[1]] or 0) + 1
    if ok then
      returned = returned + 1
      keep(res)
    else
      raised = raised + 1
      local named = false
      if type(res) == "string" then
        for _, n in ipairs(names) do
          if res:find(n, 1, true) then named = true end
        end
      end
      if not named or res:find("no reason given", 1, true) then
        bad = bad + 1
        if bad <= 10 then
          t.diag(("call %d (%s on %s): the error does not name the op: %s")
                 :format(call, names[1], show(x), show(res)))
        end
      end
    end
  end
  if call % 200 == 0 then collectgarbage() end
end

local ops = 0
for _ in pairs(counts) do ops = ops + 1 end
t.diag(("%d calls of %d functions ran in %.1f s: %d returned, %d raised an "
        .. "error; %d were on views of 2^41 elements or more, %d skipped as too "
        .. "big to compute on"):format(ran, ops, fl.now() - start, returned, raised,
                                       on_huge, skipped))
t.diag(("the slowest call took %.2f s: %s"):format(slowest, slow_call))
t.ok(ran > 0, "the fuzzer made calls")
t.is(bad, 0, "every error is a string naming its op")
local okay, v = pcall(function() return (fl.ones(2, 2) + 1):sum():item() end)
t.ok(okay and v == 8, "the session still computes after every call")
t.done()
