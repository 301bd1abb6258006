-- onnx_math.lua -- ONNX ops of elementwise math, types and indexing:
-- each one-node model run eagerly and compiled (cpu) against answers
-- computed here in plain Lua, plus the refusals that remain.  The
-- primitive ops some of them need (asin, acos, atan) are checked here
-- too, with their gradients against finite differences.
local t = require "tap"
local P = require "onnx_proto"

local dir = t.tmpdir()
local function path(name) return dir .. "/" .. name end

local serial = 0
-- a model of one node; inputs {{dtype, dims}, ...}, outputs named y1.. (n of them)
local function one_node(op, attrs, inputs, opset, nout, inits)
  local vals, names, outs = {}, {}, {}
  for i, v in ipairs(inputs) do
    if v then
      vals[#vals + 1] = {name = "i" .. i, dtype = v[1], dims = v[2]}
      names[i] = "i" .. i
    else
      names[i] = ""   -- an omitted optional input
    end
  end
  for _, init in ipairs(inits or {}) do names[#names + 1] = init.name end
  for i = 1, nout or 1 do outs[i] = {name = "y" .. i, dtype = "none"} end
  local onames = {}
  for i, o in ipairs(outs) do onames[i] = o.name end
  serial = serial + 1
  return fl.load_onnx(P.write(path(op .. serial .. ".onnx"), P.model{opset = opset or 13,
    nodes = {{op = op, inputs = names, outputs = onames, name = "n", attrs = attrs}},
    inits = inits, inputs = vals, outputs = outs}))
end

-- m(...) eagerly and compiled, each compared with want (a table) by cmp
local function both(m, args, check, name)
  check(m(table.unpack(args)), name .. " (eager)")
  check(fl.compile(m, {backend = "cpu"})(table.unpack(args)), name .. " (compiled)")
end

-- relative + absolute closeness of two flat lists
local function close(got, want, rel, abs)
  if #got ~= #want then return false, ("%d values, wanted %d"):format(#got, #want) end
  for i = 1, #got do
    local g, w = got[i], want[i]
    if not (g == w or (g ~= g and w ~= w) or math.abs(g - w) <= abs + rel * math.abs(w)) then
      return false, ("element %d: got %.9g, wanted %.9g"):format(i, g, w)
    end
  end
  return true
end
local function flat(x)
  local out = {}
  local function walk(v)
    if type(v) == "table" then for _, e in ipairs(v) do walk(e) end else out[#out + 1] = v end
  end
  walk(x:tolist())
  return out
end
local function near(got, want, rel, abs, name)
  local ok, why = close(flat(got), want, rel, abs)
  t.ok(ok, name)
  if not ok then t.diag(why) end
end

fl.manual_seed(7)

-- ---- asin, acos, atan: the primitives and the ONNX ops ------------------------
do
  local fns = {asin = math.asin, acos = math.acos, atan = math.atan}
  for _, shape in ipairs({{7}, {3, 5}, {2, 3, 4}}) do
    local x = fl.rand(table.unpack(shape)) * 1.98 - 0.99   -- inside (-1, 1)
    local xs = flat(x)
    for _, op in ipairs({"asin", "acos", "atan"}) do
      local want = {}
      for i, v in ipairs(xs) do want[i] = fns[op](v) end
      near(x[op](x), want, 1e-6, 1e-6, op .. " eager " .. #shape .. "-d")
      near(fl[op](x), want, 1e-6, 1e-6, "fl." .. op .. " " .. #shape .. "-d")
      near(fl.compile(function(a) return a[op](a) * 1 end, {backend = "cpu"})(x), want,
           1e-6, 1e-6, op .. " compiled " .. #shape .. "-d")
      local onnx = op:sub(1, 1):upper() .. op:sub(2)
      local m = one_node(onnx, nil, {{"float", shape}}, 7)
      both(m, {x}, function(y, name) near(y, want, 1e-6, 1e-6, name) end, onnx .. " " .. #shape .. "-d")
    end
  end
  -- outside [-1, 1] asin and acos give NaN; atan is defined everywhere
  local out = fl.tensor({-2, 1.5, 30})
  near(out:asin(), {0 / 0, 0 / 0, 0 / 0}, 0, 0, "asin outside [-1, 1] is NaN")
  near(out:acos(), {0 / 0, 0 / 0, 0 / 0}, 0, 0, "acos outside [-1, 1] is NaN")
  near(out:atan(), {math.atan(-2), math.atan(1.5), math.atan(30)}, 1e-6, 1e-7, "atan of large values")
  near(fl.tensor({-0.5, 0.25}, {dtype = "float64"}):asin(), {math.asin(-0.5), math.asin(0.25)}, 1e-15, 0,
       "asin in float64")
  local ia = fl.tensor({1, 0}, {dtype = "int64"}):asin()
  t.ok(ia.dtype == "float32", "asin of integers computes in float32, as sin")
  near(ia, {math.pi / 2, 0}, 1e-6, 0, "asin of integers")
  t.raises(function() one_node("Asin", nil, {{"int64", {2}}}, 7)(fl.tensor({1, 0}, {dtype = "int64"})) end,
           "dtype int64 is unsupported", "ONNX Asin of int64 is refused")

  -- gradients against central differences, in float64
  for _, op in ipairs({"asin", "acos", "atan"}) do
    local x = fl.tensor({-0.9, -0.3, 0, 0.4, 0.8}, {dtype = "float64", requires_grad = true})
    local y = x[op](x)
    y:sum():backward()
    local g, xs, fd = flat(x.grad), flat(x), {}
    for i, v in ipairs(xs) do
      local h = 1e-6
      fd[i] = (fns[op](v + h) - fns[op](v - h)) / (2 * h)
    end
    local ok, why = close(g, fd, 1e-6, 1e-8)
    t.ok(ok, op .. " gradient matches finite differences")
    if not ok then t.diag(why) end
    -- and through a compiled training step
    local x2 = fl.tensor(xs, {dtype = "float64", requires_grad = true})
    local step = fl.compile(function(a) local l = a[op](a):sum(); l:backward(); return l end, {backend = "cpu"})
    step(x2)
    ok, why = close(flat(x2.grad), fd, 1e-6, 1e-8)
    t.ok(ok, op .. " gradient compiled")
    if not ok then t.diag(why) end
  end
end

-- ---- Cast and CastLike to bfloat16: round to nearest, ties to even ------------
do
  local function f32bits(v) return string.unpack("<I4", string.pack("<f", v)) end
  -- the bfloat16 pattern of a float32 value, by hand
  local function rne(v)
    if v ~= v then return "nan" end
    local b = f32bits(v)
    return (b + 0x7FFF + ((b >> 16) & 1)) >> 16
  end
  local function patterns(y)
    local out = {}
    for i, v in ipairs(flat(y:to("float32"))) do out[i] = v ~= v and "nan" or f32bits(v) >> 16 end
    return out
  end
  local function want_of(xs) local w = {} for i, v in ipairs(xs) do w[i] = rne(v) end return w end
  local function from_bits(b) return (string.unpack("<f", string.pack("<I4", b))) end
  -- ties both ways, just above and below them, the largest finite value
  -- and the ties past it, subnormals, signed zeros, infinities, NaN
  local tricky = {1 + 2^-8, 1 + 3 * 2^-8, 1 + 2^-8 + 2^-23, 1 + 2^-8 - 2^-23, -(1 + 2^-8), -(1 + 3 * 2^-8),
    from_bits(0x7F7F7FFF), from_bits(0x7F7F8000), from_bits(0x7F7FFFFF), -from_bits(0x7F7F8000),
    from_bits(0x00008000), from_bits(0x00018000), from_bits(0x00000001), from_bits(0x80007FFF),
    0.0, -0.0, 1 / 0, -1 / 0, 0 / 0, 0.47892547, 0.49968487, 65504, 1e-40, 3e38}
  for _, opset in ipairs({13, 19, 25}) do
    local cast = one_node("Cast", {to = 16}, {{"float", {"N"}}}, opset)
    local x = fl.tensor(tricky)
    local want = want_of(flat(x))
    both(cast, {x}, function(y, name)
      t.ok(y.dtype == "bfloat16", name .. ": dtype")
      t.is(patterns(y), want, name)
    end, "Cast float32 -> bfloat16, opset " .. opset .. ", edge values")
    local r = fl.randn(4, 33) * 100
    both(cast, {r:reshape(r:numel())}, function(y, name) t.is(patterns(y), want_of(flat(r)), name) end,
         "Cast float32 -> bfloat16, opset " .. opset .. ", random values")
  end
  local like = one_node("CastLike", nil, {{"float", {3, 8}}, {16, {1}}}, 19)
  local x = fl.randn(3, 8) * 3
  both(like, {x, fl.zeros(1, {dtype = "bfloat16"})}, function(y, name)
    t.ok(y.dtype == "bfloat16" and y.shape[1] == 3 and y.shape[2] == 8, name .. ": dtype and shape")
    t.is(patterns(y), want_of(flat(x)), name)
  end, "CastLike float32 -> bfloat16")
  -- float16 widens to float32 exactly, then rounds once: 1 + 2^-8 is a tie
  local h = fl.tensor({1 + 2^-8, 1 + 3 * 2^-8, 1 + 2^-10, 65504, -2.5e-7, 0.333251953125}):to("float16")
  local c16 = one_node("Cast", {to = 16}, {{"float16", {6}}}, 13)
  both(c16, {h}, function(y, name) t.is(patterns(y), want_of(flat(h:to("float32"))), name) end,
       "Cast float16 -> bfloat16")
  t.is(want_of({1 + 2^-8, 1 + 3 * 2^-8}), {0x3F80, 0x3F82}, "the hand rounding: ties go to even")
  local c64 = one_node("Cast", {to = 16}, {{"double", {2}}}, 13)
  t.raises(function() c64(fl.tensor({1, 2}, {dtype = "float64"})) end,
           "casting float64 to bfloat16 %(fuselab rounds through float32, twice%) is unsupported",
           "Cast float64 -> bfloat16 is refused")
end

t.done()
