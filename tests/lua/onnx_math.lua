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

-- m(...) eagerly and compiled, each result handed to check(y, name)
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
math.randomseed(7)    -- the data drawn in Lua too: every run the same

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
  -- float64 rounds once: through float32 it would round twice where the
  -- float32 value is a midpoint.  By hand: ties either way of 1 + 2^-8,
  -- the midpoint past the largest finite value (2^128 - 2^119), one in the
  -- subnormals (2^-134)
  local c64 = one_node("Cast", {to = 16}, {{"double", {"N"}}}, 13)
  local hand = {1 + 2^-8 + 2^-40, -(1 + 2^-8 + 2^-40), 1 + 2^-8 - 2^-40, 1 + 2^-8, 1 + 3 * 2^-8,
    1 + 3 * 2^-8 - 2^-40, 2^128 - 2^119, 2^128 - 2^119 - 2^90, 2^128 - 2^119 + 2^90, -(2^128 - 2^119 - 2^90),
    2^-134 + 2^-160, 2^-134, 2^-134 - 2^-160, 3 * 2^-134 - 2^-170, 1e300, 0.0, -0.0}
  both(c64, {fl.tensor(hand, {dtype = "float64"})}, function(y, name)
    t.is(patterns(y), {0x3F81, 0xBF81, 0x3F80, 0x3F80, 0x3F82, 0x3F81, 0x7F80, 0x7F7F, 0x7F80, 0xFF7F,
                       1, 0, 0, 1, 0x7F80, 0, 0x8000}, name)
  end, "Cast float64 -> bfloat16 rounds once, by hand")
  -- random values against the nearest of the candidates around x, by
  -- exact differences (ties to the even pattern)
  local function rne64(v)
    if v ~= v then return "nan" end
    local a = math.abs(v)
    local sign = (v < 0 or 1 / v < 0) and 0x8000 or 0
    local p = f32bits(a) >> 16          -- near a (a's float32 rounding, truncated)
    local best, bestd
    for c = math.max(p - 1, 0), math.min(p + 1, 0x7F80) do
      local cv = c == 0x7F80 and 2.0 ^ 128 or from_bits(c << 16)   -- the rounding bound for infinity
      local d = math.abs(a - cv)
      if not bestd or d < bestd or (d == bestd and c % 2 == 0) then best, bestd = c, d end
    end
    return best | sign
  end
  t.is({rne64(1 + 2^-8 + 2^-40), rne64(1 + 2^-8), rne64(2^128 - 2^119 - 2^90)}, {0x3F81, 0x3F80, 0x7F7F},
       "the candidate rounding by hand")
  local vals = {}
  for i = 1, 300 do
    local k = math.random(4)
    local m = 1 + math.random(0, 127) / 128 + 2^-8                  -- on a bfloat16 midpoint...
    if k == 1 then m = m + 2^-30 elseif k == 2 then m = m - 2^-30 elseif k == 3 then m = m + (math.random() - 0.5) * 2^-20 end
    vals[i] = (math.random(2) == 1 and -1 or 1) * m * 2.0 ^ math.random(-140, 126)
  end
  local want = {}
  for i, v in ipairs(vals) do want[i] = rne64(v) end
  both(c64, {fl.tensor(vals, {dtype = "float64"})}, function(y, name) t.is(patterns(y), want, name) end,
       "Cast float64 -> bfloat16 near midpoints, random")
  -- integers round once too (2^24 + 2^16 + 1 is past the midpoint
  -- 2^24 + 2^16, where float32 would put it): the nearest multiple of the
  -- step, in exact integer arithmetic (u: unsigned, as uint64 patterns)
  local function rne_int(v, unsigned)
    local neg = not unsigned and v < 0
    local a = neg and -v or v
    if a == 0 then return 0 end
    local e = 63
    while e > 0 and (a >> e) == 0 do e = e - 1 end
    if e <= 7 then return f32bits(a + 0.0) >> 16 | (neg and 0x8000 or 0) end
    local step = 1 << (e - 7)
    local lo = a & ~(step - 1)
    local below, above = a - lo, step - (a - lo)
    local r = lo
    if math.ult(above, below) or (above == below and (lo // step) % 2 == 1) then r = lo + step end
    local bits
    if r == 0 and lo ~= 0 then bits = 0x5F80                        -- 2^64
    else bits = f32bits(math.ult(r, 0) and r + 0.0 or (r >> 1) * 2.0 + (r & 1)) >> 16 end
    return bits | (neg and 0x8000 or 0)
  end
  t.is({rne_int((1 << 24) + (1 << 16) + 1), rne_int((1 << 24) + (1 << 16)), rne_int(-1 - (1 << 40) - (1 << 32))},
       {0x4B81, 0x4B80, 0xD381}, "the integer rounding by hand")
  local ivals = {(1 << 24) + (1 << 16) + 1, (1 << 40) + (1 << 32) + 1, -((1 << 40) + (1 << 32) + 1), 0, 1, -1, 255, 257,
    math.maxinteger, math.mininteger, (1 << 62) + (1 << 54), (1 << 62) + (1 << 54) + 1, (1 << 53) + (1 << 45) + 1}
  for i = 1, 60 do
    local e = math.random(9, 62)
    local m = (math.random(0, 255) * 2 + 1) << (e - 8)                -- a midpoint at 2^e
    ivals[#ivals + 1] = (m + math.random(-1, 1)) * (math.random(2) == 1 and -1 or 1)
  end
  local wi = {}
  for i, v in ipairs(ivals) do wi[i] = rne_int(v) end
  both(one_node("Cast", {to = 16}, {{"int64", {"N"}}}, 13), {fl.tensor(ivals, {dtype = "int64"})},
       function(y, name) t.is(patterns(y), wi, name) end, "Cast int64 -> bfloat16 rounds once")
  local i32 = {}
  for i, v in ipairs(ivals) do i32[i] = ((v + (1 << 31)) % (1 << 32)) - (1 << 31) end
  local w32 = {}
  for i, v in ipairs(i32) do w32[i] = rne_int(v) end
  both(one_node("Cast", {to = 16}, {{"int32", {"N"}}}, 13), {fl.tensor(i32, {dtype = "int64"})},
       function(y, name) t.is(patterns(y), w32, name) end, "Cast int32 -> bfloat16 rounds once")
  local u64 = {-1, math.mininteger, math.mininteger + (1 << 55) + 1, -(1 << 55) - 1, (1 << 40) + (1 << 32) + 1}
  for i = 1, 40 do u64[#u64 + 1] = math.mininteger + ((math.random(0, 255) * 2 + 1) << 55) + math.random(-1, 1) end
  local wu = {}
  for i, v in ipairs(u64) do wu[i] = rne_int(v, true) end
  both(one_node("Cast", {to = 16}, {{"uint64", {"N"}}}, 13), {fl.tensor(u64, {dtype = "int64"})},
       function(y, name) t.is(patterns(y), wu, name) end, "Cast uint64 -> bfloat16 rounds once")
end

-- ---- Div and Mod of uint64, over the whole range ------------------------------
do
  -- uint64 values travel as their int64 bit patterns.  The answer by
  -- long division, one bit at a time (r's top bit carried out of the shift)
  local function udivmod(n, d)
    local q, r = 0, 0
    for i = 63, 0, -1 do
      local carry = r < 0
      r = (r << 1) | ((n >> i) & 1)
      if carry or not math.ult(r, d) then r = r - d; q = q | (1 << i) end
    end
    return q, r
  end
  t.is({udivmod(-1, 3)}, {0x5555555555555555, 0}, "long division: (2^64 - 1) / 3")
  t.is({udivmod(-1, 10)}, {1844674407370955161, 5}, "long division: (2^64 - 1) / 10")
  t.is({udivmod(-2, -1)}, {0, -2}, "long division: a smaller divisor above 2^63")
  math.randomseed(11)
  local function pick(k)
    local kind = math.random(4)
    if kind == 1 then return math.random(0) end                      -- any 64-bit pattern
    if kind == 2 then return math.random(1, 1000) end
    if kind == 3 then return math.random(0) >> math.random(1, 62) end
    return math.mininteger + math.random(0, 1 << 40) * (k or 1)       -- just above 2^63
  end
  local div = one_node("Div", nil, {{"uint64", {"N"}}, {"uint64", {"N"}}}, 14)
  local mod0 = one_node("Mod", nil, {{"uint64", {"N"}}, {"uint64", {"N"}}}, 13)
  local mod1 = one_node("Mod", {fmod = 1}, {{"uint64", {"N"}}, {"uint64", {"N"}}}, 13)
  for _, n in ipairs({1, 9, 200}) do
    local as, bs, qs, rs = {}, {}, {}, {}
    for i = 1, n do
      as[i], bs[i] = pick(), pick()
      if bs[i] == 0 then bs[i] = 7 end
      if i % 5 == 0 then bs[i] = as[i] end                            -- quotient exactly 1
      qs[i], rs[i] = udivmod(as[i], bs[i])
    end
    local a, b = fl.tensor(as, {dtype = "int64"}), fl.tensor(bs, {dtype = "int64"})
    both(div, {a, b}, function(y, name) t.is(y:tolist(), qs, name) end, "Div uint64, " .. n .. " values")
    both(mod0, {a, b}, function(y, name) t.is(y:tolist(), rs, name) end, "Mod uint64, " .. n .. " values")
    both(mod1, {a, b}, function(y, name) t.is(y:tolist(), rs, name) end, "Mod uint64 fmod=1, " .. n .. " values")
  end
  -- hand values: 2^64 - 1 by 3 and by 2^63 + 1, 2^63 by 2, 5 by 2^64 - 1
  local a = fl.tensor({-1, -1, math.mininteger, 5}, {dtype = "int64"})
  local b = fl.tensor({3, math.mininteger + 1, 2, -1}, {dtype = "int64"})
  both(div, {a, b}, function(y, name) t.is(y:tolist(), {0x5555555555555555, 1, 1 << 62, 0}, name) end,
       "Div uint64, hand values")
  both(mod0, {a, b}, function(y, name) t.is(y:tolist(), {0, math.maxinteger - 1, 0, 5}, name) end,
       "Mod uint64, hand values")
  -- broadcast: a [2, 3] by b [3]
  local db = one_node("Div", nil, {{"uint64", {2, 3}}, {"uint64", {3}}}, 14)
  local a2 = fl.tensor({{-1, 100, math.mininteger}, {7, -7, 12345678901234}}, {dtype = "int64"})
  local b2 = fl.tensor({-3, 7, 1000}, {dtype = "int64"})
  local want = {}
  for i, row in ipairs(a2:tolist()) do
    want[i] = {}
    for j, v in ipairs(row) do want[i][j] = (udivmod(v, b2:tolist()[j])) end
  end
  both(db, {a2, b2}, function(y, name) t.is(y:tolist(), want, name) end, "Div uint64 broadcast")
  -- a zero divisor gives 0, as NumPy's (the ONNX reference)
  both(div, {fl.tensor({5, -1}, {dtype = "int64"}), fl.tensor({0, 0}, {dtype = "int64"})},
       function(y, name) t.is(y:tolist(), {0, 0}, name) end, "Div uint64 by zero")
  local mixed = one_node("Div", nil, {{"uint64", {2}}, {"int64", {2}}}, 14)
  t.raises(function() mixed(fl.tensor({1, 2}, {dtype = "int64"}), fl.tensor({1, 2}, {dtype = "int64"})) end,
           "inputs of dtypes uint64 and int64", "Div of uint64 by int64 is a model error")
end

-- ---- Range of int32 and int16 --------------------------------------------------
do
  local function lua_range(s, l, d)
    local out = {}
    local v = s
    while (d > 0 and v < l) or (d < 0 and v > l) do out[#out + 1] = v; v = v + d end
    return out
  end
  for _, dt in ipairs({"int32", "int16"}) do
    local m = one_node("Range", nil, {{dt, {}}, {dt, {}}, {dt, {}}}, 11)
    for _, c in ipairs({{10, 6, -3}, {1, 20, 4}, {-5, 5, 1}, {3, 3, 1}, {5, 1, 2}, {-30000, 30000, 7001},
                        {2147483000, 2147483647, 300}}) do
      if dt == "int32" or math.abs(c[1]) < 32768 and math.abs(c[2]) < 32768 then
        local args = {}
        for i = 1, 3 do args[i] = fl.tensor(c[i], {dtype = "int64"}) end
        both(m, args, function(y, name) t.is(y:tolist(), lua_range(c[1], c[2], c[3]), name) end,
             ("Range %s (%d, %d, %d)"):format(dt, c[1], c[2], c[3]))
      end
    end
  end
  local m = one_node("Range", nil, {{"int32", {}}, {"int32", {}}, {"int32", {}}}, 11)
  local z = fl.tensor(0, {dtype = "int64"})
  t.raises(function() m(z, fl.tensor(5, {dtype = "int64"}), z) end, "delta is 0", "Range int32: delta 0")
  local mixed = one_node("Range", nil, {{"int32", {}}, {"int64", {}}, {"int32", {}}}, 11)
  t.raises(function() mixed(z, fl.tensor(5, {dtype = "int64"}), fl.tensor(1, {dtype = "int64"})) end,
           "inputs of dtypes int32 and int64", "Range of mixed dtypes is a model error")
  local u8 = one_node("Range", nil, {{"uint8", {}}, {"uint8", {}}, {"uint8", {}}}, 11)
  t.raises(function() u8(z, fl.tensor(5, {dtype = "int64"}), fl.tensor(1, {dtype = "int64"})) end,
           "Range of dtype uint8 is unsupported", "Range of uint8 (not an ONNX type of Range) is refused")
end

-- ---- ReduceMax and ReduceMin of bools ------------------------------------------
do
  -- any / all over the dims in `red` (a set, 1-based) of a row-major list
  local function reduce_bools(vals, shape, red, is_max)
    local oshape, out = {}, {}
    for d, n in ipairs(shape) do oshape[d] = red[d] and 1 or n end
    local on = 1
    for _, n in ipairs(oshape) do on = on * n end
    for i = 1, on do out[i] = not is_max end
    local idx = {}
    for d = 1, #shape do idx[d] = 0 end
    for i = 1, #vals do
      local o = 0
      for d = 1, #shape do o = o * oshape[d] + (red[d] and 0 or idx[d]) end
      if is_max then out[o + 1] = out[o + 1] or vals[i] else out[o + 1] = out[o + 1] and vals[i] end
      for d = #shape, 1, -1 do
        idx[d] = idx[d] + 1
        if idx[d] < shape[d] then break end
        idx[d] = 0
      end
    end
    return out, oshape
  end
  for _, op in ipairs({"ReduceMax", "ReduceMin"}) do
    local is_max = op == "ReduceMax"
    for _, case in ipairs({{{4}, {0}}, {{3, 5}, {1}}, {{3, 5}, {0, 1}}, {{2, 3, 4}, {-1}}, {{2, 3, 4}, {0, 2}},
                           {{2, 3, 4}, nil}}) do
      local shape, axes = case[1], case[2]
      for _, keep in ipairs({0, 1}) do
        local ins = {{"bool", shape}}
        local inits
        if axes then inits = {{name = "axes", dtype = "int64", dims = {#axes}, ints = axes}} end
        local m = one_node(op, {keepdims = keep}, ins, 20, 1, inits)
        for _, density in ipairs({0.2, 0.5, 0.9}) do
          local x = fl.rand(table.unpack(shape)):lt(density)
          local red = {}
          for _, a in ipairs(axes or {}) do red[(a < 0 and a + #shape or a) + 1] = true end
          if not axes then for d = 1, #shape do red[d] = true end end
          local want, oshape = reduce_bools(flat(x), shape, red, is_max)
          if keep == 0 then
            local s2 = {}
            for d, n in ipairs(oshape) do if not red[d] then s2[#s2 + 1] = n end end
            oshape = s2
          end
          both(m, {x}, function(y, name)
            t.ok(y.dtype == "bool", name .. ": bool")
            t.is({flat(y), y.shape}, {want, oshape}, name)
          end, ("%s bools %s axes %s keepdims %d density %.1f"):format(op, table.concat(shape, "x"),
             axes and table.concat(axes, ",") or "all", keep, density))
        end
      end
    end
    -- the empty set: false for max, true for min (the identities)
    local m = one_node(op, {keepdims = 1}, {{"bool", {2, 0, 4}}}, 20, 1,
                       {{name = "axes", dtype = "int64", dims = {1}, ints = {1}}})
    both(m, {fl.zeros(2, 0, 4, {dtype = "bool"})}, function(y, name)
      local w = {}
      for i = 1, 8 do w[i] = not is_max end
      t.is({flat(y), y.shape}, {w, {2, 1, 4}}, name)
    end, op .. " bools over an empty dim")
  end
  t.raises(function() one_node("ReduceSum", nil, {{"bool", {3}}}, 13)(fl.tensor({true, false, true})) end,
           "reducing bools is unsupported", "ReduceSum of bools stays refused")
end

-- ---- Pad mode 'wrap' -----------------------------------------------------------
do
  -- Pad (opset 19, mode wrap) of an input of rank r, pads an input, axes
  -- an initializer when given
  local function pad_model(r, with_axes, dt)
    local dims, names, inits = {}, {"i1", "i2"}, nil
    for d = 1, r do dims[d] = "d" .. d end
    if with_axes then
      inits = {{name = "axes", dtype = "int64", dims = {#with_axes}, ints = with_axes}}
      names = {"i1", "i2", "", "axes"}
    end
    serial = serial + 1
    return fl.load_onnx(P.write(path("pad" .. serial .. ".onnx"), P.model{opset = 19,
      nodes = {{op = "Pad", inputs = names, outputs = {"y1"}, name = "n", attrs = {mode = "wrap"}}},
      inits = inits,
      inputs = {{name = "i1", dtype = dt or "float", dims = dims},
                {name = "i2", dtype = "int64", dims = {2 * #(with_axes or dims)}}},
      outputs = {{name = "y1", dtype = "none"}}}))
  end
  -- hand values, NumPy's documentation example
  local m1 = pad_model(1)
  both(m1, {fl.tensor({1, 2, 3, 4, 5}, {dtype = "float32"}), fl.tensor({2, 3}, {dtype = "int64"})},
       function(y, name) t.is(y:tolist(), {4, 5, 1, 2, 3, 4, 5, 1, 2, 3}, name) end, "Pad wrap 1-d by hand")
  both(m1, {fl.tensor({1, 2}, {dtype = "float32"}), fl.tensor({5, 0}, {dtype = "int64"})},
       function(y, name) t.is(y:tolist(), {2, 1, 2, 1, 2, 1, 2}, name) end, "Pad wrap past the size")
  -- against a plain loop over the output
  local function want_wrap(x, shape, pads)
    local r = #shape
    local oshape, out = {}, {}
    for d = 1, r do oshape[d] = pads[d] + shape[d] + pads[d + r] end
    local on = 1
    for d = 1, r do on = on * oshape[d] end
    for o = 0, on - 1 do
      local rem, src = o, 0
      local coords = {}
      for d = r, 1, -1 do coords[d] = rem % oshape[d]; rem = rem // oshape[d] end
      for d = 1, r do
        local j = coords[d] - pads[d]
        while j < 0 do j = j + shape[d] end
        while j >= shape[d] do j = j - shape[d] end
        src = src * shape[d] + j
      end
      out[o + 1] = x[src + 1]
    end
    return out, oshape
  end
  for _, case in ipairs({{{3, 4}, {1, 2, 0, 3}}, {{2, 3, 4}, {0, 1, 2, 1, 0, 5}}, {{5}, {0, 7}}, {{2, 2}, {0, 0, 0, 0}}}) do
    local shape, pads = case[1], case[2]
    local m = pad_model(#shape)
    for _, dt in ipairs({"float32", "int64"}) do
      local x = (fl.randn(table.unpack(shape)) * 10):to(dt)
      local want, oshape = want_wrap(flat(x), shape, pads)
      local mm = dt == "int64" and pad_model(#shape, nil, "int64") or m
      both(mm, {x, fl.tensor(pads, {dtype = "int64"})}, function(y, name)
        t.is({flat(y), y.shape}, {want, oshape}, name)
      end, ("Pad wrap %s %s pads %s"):format(dt, table.concat(shape, "x"), table.concat(pads, ",")))
    end
  end
  -- with axes (opset 18's input): pads of dim 2 only
  local ma = pad_model(2, {-1})
  local x = fl.randn(3, 4)
  local want, oshape = want_wrap(flat(x), {3, 4}, {0, 3, 0, 2})
  both(ma, {x, fl.tensor({3, 2}, {dtype = "int64"})}, function(y, name) t.is({flat(y), y.shape}, {want, oshape}, name) end,
       "Pad wrap with axes")
  t.raises(function() m1(fl.tensor({1, 2, 3}, {dtype = "float32"}), fl.tensor({-1, 2}, {dtype = "int64"})) end,
           "negative pads in mode 'wrap' is unsupported", "Pad wrap: negative pads refused")
  t.raises(function() m1(fl.zeros(0), fl.tensor({1, 1}, {dtype = "int64"})) end,
           "mode 'wrap' pads dim 1 of size 0", "Pad wrap of an empty dim is an error")
  t.raises(function()
    fl.load_onnx(P.write(path("padold.onnx"), P.model{opset = 18,
      nodes = {{op = "Pad", inputs = {"i1", "i2"}, outputs = {"y1"}, name = "n", attrs = {mode = "wrap"}}},
      inputs = {{name = "i1", dtype = "float", dims = {3}}, {name = "i2", dtype = "int64", dims = {2}}},
      outputs = {{name = "y1", dtype = "none"}}}))(fl.zeros(3), fl.tensor({1, 1}, {dtype = "int64"}))
  end, "mode 'wrap' %(from opset 19%)", "Pad wrap before opset 19 is an error")
end

-- ---- ScatterElements and ScatterND with reduction 'mul' ------------------------
do
  local function f32(v) return (string.unpack("<f", string.pack("<f", v))) end
  local function strides(shape)
    local st, acc = {}, 1
    for d = #shape, 1, -1 do st[d] = acc; acc = acc * shape[d] end
    return st
  end
  -- the reference's loop: each update in row-major order multiplies in
  local function want_elements(x, shape, idx, ishape, upd, axis, round)
    local out = {table.unpack(x)}
    local st, ist = strides(shape), strides(ishape)
    local n = 1
    for _, v in ipairs(ishape) do n = n * v end
    for i = 0, n - 1 do
      local o = 0
      for d = 1, #ishape do
        local c = (i // ist[d]) % ishape[d]
        if d == axis then c = idx[i + 1] % shape[d] end
        o = o + c * st[d]
      end
      out[o + 1] = round(out[o + 1] * upd[i + 1])
    end
    return out
  end
  local ident = function(v) return v end
  for _, case in ipairs({{{5}, {8}, 1}, {{3, 4}, {6, 4}, 1}, {{3, 4}, {3, 7}, 2}, {{2, 3, 4}, {2, 5, 4}, 2},
                         {{2, 3, 4}, {2, 3, 9}, -1}}) do
    local shape, ishape, ax = case[1], case[2], case[3]
    local axis = ax < 0 and ax + #shape + 1 or ax
    for _, dt in ipairs({"float", "int64"}) do
      local m = one_node("ScatterElements", {axis = axis - 1, reduction = "mul"},
                         {{dt, shape}, {"int64", ishape}, {dt, ishape}}, 18)
      local n = 1
      for _, v in ipairs(ishape) do n = n * v end
      local idx = {}
      for i = 1, n do idx[i] = math.random(0, shape[axis] - 1) - (i % 3 == 0 and shape[axis] or 0) end
      local x, u
      if dt == "float" then x, u = fl.randn(table.unpack(shape)) * 2, fl.randn(table.unpack(ishape)) * 2
      else
        x = (fl.rand(table.unpack(shape)) * 7 - 3):to("int64")
        u = (fl.rand(table.unpack(ishape)) * 5 - 2):to("int64")
      end
      local it = fl.tensor(idx, {dtype = "int64"}):reshape(ishape)
      local want = want_elements(flat(x), shape, idx, ishape, flat(u), axis, dt == "float" and f32 or ident)
      both(m, {x, it, u}, function(y, name) t.is(flat(y), want, name) end,
           ("ScatterElements mul %s data %s indices %s axis %d"):format(dt, table.concat(shape, "x"),
           table.concat(ishape, "x"), ax))
    end
  end
  -- by hand: duplicates multiply in
  local m = one_node("ScatterElements", {axis = 1, reduction = "mul"}, {{"float", {1, 5}}, {"int64", {1, 2}}, {"float", {1, 2}}}, 18)
  both(m, {fl.tensor({{1, 2, 3, 4, 5}}, {dtype = "float32"}), fl.tensor({{1, 1}}, {dtype = "int64"}),
           fl.tensor({{1.1, 2.1}}, {dtype = "float32"})},
       function(y, name) t.near(y, {{1, f32(f32(2 * f32(1.1)) * f32(2.1)), 3, 4, 5}}, 1e-6, name) end,
       "ScatterElements mul, ONNX's example")
  -- bools: the product is AND
  local mb = one_node("ScatterElements", {axis = 0, reduction = "mul"}, {{"bool", {4}}, {"int64", {3}}, {"bool", {3}}}, 18)
  both(mb, {fl.tensor({true, true, false, true}), fl.tensor({0, 0, 3}, {dtype = "int64"}), fl.tensor({true, false, true})},
       function(y, name) t.is(y:tolist(), {false, true, false, true}, name) end, "ScatterElements mul of bools")

  -- ScatterND: index tuples into the leading dims, slices multiplied in order
  local function want_nd(x, shape, idx, k, U, upd, round)
    local out = {table.unpack(x)}
    local st = strides(shape)
    local R = 1
    for d = k + 1, #shape do R = R * shape[d] end
    for i = 0, U - 1 do
      local o = 0
      for d = 1, k do o = o + (idx[i * k + d] % shape[d]) * st[d] end
      for j = 0, R - 1 do out[o + j + 1] = round(out[o + j + 1] * upd[i * R + j + 1]) end
    end
    return out
  end
  for _, case in ipairs({{{4, 3}, {5, 1}}, {{4, 3}, {6, 2}}, {{2, 3, 4}, {2, 3, 1}}, {{2, 3, 4}, {7, 2}}}) do
    local shape, ishape = case[1], case[2]
    local k, U = ishape[#ishape], 1
    for d = 1, #ishape - 1 do U = U * ishape[d] end
    local ushape = {}
    for d = 1, #ishape - 1 do ushape[#ushape + 1] = ishape[d] end
    for d = k + 1, #shape do ushape[#ushape + 1] = shape[d] end
    for _, dt in ipairs({"float", "int64"}) do
      local m = one_node("ScatterND", {reduction = "mul"}, {{dt, shape}, {"int64", ishape}, {dt, ushape}}, 18)
      local idx = {}
      for i = 0, U - 1 do
        for d = 1, k do idx[i * k + d] = math.random(0, shape[d] - 1) - (i % 2 == 1 and shape[d] or 0) end
      end
      local x, u
      if dt == "float" then x, u = fl.randn(table.unpack(shape)) * 2, fl.randn(table.unpack(ushape)) * 2
      else
        x = (fl.rand(table.unpack(shape)) * 7 - 3):to("int64")
        u = (fl.rand(table.unpack(ushape)) * 5 - 2):to("int64")
      end
      local want = want_nd(flat(x), shape, idx, k, U, flat(u), dt == "float" and f32 or ident)
      both(m, {x, fl.tensor(idx, {dtype = "int64"}):reshape(ishape), u}, function(y, name) t.is(flat(y), want, name) end,
           ("ScatterND mul %s data %s indices %s"):format(dt, table.concat(shape, "x"), table.concat(ishape, "x")))
    end
  end
  local big = one_node("ScatterND", {reduction = "mul"}, {{"float", {4}}, {"int64", {1025, 1}}, {"float", {1025}}}, 18)
  t.raises(function() big(fl.ones(4), fl.zeros(1025, 1, {dtype = "int64"}), fl.ones(1025)) end,
           "reduction 'mul' of 1025 updates %(1024 at most%) is unsupported", "ScatterND mul of too many updates refused")
end

-- ---- GatherND with batch_dims ---------------------------------------------------
do
  -- out[batch, i, rest] = data[batch, idx[batch, i, :], rest], by loops
  local function want_gnd(x, shape, idx, ishape, b)
    local q, r = #ishape, #shape
    local k = ishape[q]
    local R = 1
    for d = b + k + 1, r do R = R * shape[d] end
    local T = 1                               -- tuples
    for d = 1, q - 1 do T = T * ishape[d] end
    local per_batch = 1                       -- tuples in one batch
    for d = b + 1, q - 1 do per_batch = per_batch * ishape[d] end
    local bsize = 1                           -- data elements in one batch
    for d = b + 1, r do bsize = bsize * shape[d] end
    local out = {}
    for t0 = 0, T - 1 do
      local batch = t0 // per_batch
      local off = batch * bsize
      local st = bsize
      for j = 1, k do
        st = st // shape[b + j]
        off = off + (idx[t0 * k + j] % shape[b + j]) * st
      end
      for e = 0, R - 1 do out[#out + 1] = x[off + e + 1] end
    end
    local oshape = {}
    for d = 1, q - 1 do oshape[#oshape + 1] = ishape[d] end
    for d = b + k + 1, r do oshape[#oshape + 1] = shape[d] end
    return out, oshape
  end
  -- ONNX's example: batch_dims 1
  local m = one_node("GatherND", {batch_dims = 1}, {{"float", {2, 2, 2}}, {"int64", {2, 1}}}, 13)
  both(m, {fl.tensor({{{0, 1}, {2, 3}}, {{4, 5}, {6, 7}}}, {dtype = "float32"}), fl.tensor({{1}, {0}}, {dtype = "int64"})},
       function(y, name) t.is(y:tolist(), {{2, 3}, {4, 5}}, name) end, "GatherND batch_dims 1, ONNX's example")
  for _, case in ipairs({{{3, 4, 5}, {3, 2, 1}, 1}, {{3, 4, 5}, {3, 2}, 1}, {{2, 3, 4, 5}, {2, 3, 6, 1}, 2},
                         {{2, 3, 4, 5}, {2, 3, 2}, 2}, {{2, 3, 4, 5}, {2, 7, 3}, 1}, {{4, 6}, {4, 3, 1}, 1},
                         {{2, 3, 4}, {2, 5, 2}, 0}}) do
    local shape, ishape, b = case[1], case[2], case[3]
    for _, dt in ipairs({"float", "int64"}) do
      local mm = one_node("GatherND", {batch_dims = b}, {{dt, shape}, {"int64", ishape}}, 13)
      local k = ishape[#ishape]
      local idx, n = {}, 1
      for d = 1, #ishape - 1 do n = n * ishape[d] end
      for i = 0, n - 1 do
        for j = 1, k do
          local size = shape[b + j]
          idx[i * k + j] = math.random(0, size - 1) - (math.random(2) == 1 and size or 0)
        end
      end
      local x = dt == "float" and fl.randn(table.unpack(shape)) or (fl.rand(table.unpack(shape)) * 100):to("int64")
      local want, oshape = want_gnd(flat(x), shape, idx, ishape, b)
      both(mm, {x, fl.tensor(idx, {dtype = "int64"}):reshape(ishape)}, function(y, name)
        t.is({flat(y), y.shape}, {want, oshape}, name)
      end, ("GatherND %s data %s indices %s batch_dims %d"):format(dt, table.concat(shape, "x"),
         table.concat(ishape, "x"), b))
    end
  end
  local bad = one_node("GatherND", {batch_dims = 2}, {{"float", {2, 3}}, {"int64", {2, 3, 1}}}, 13)
  t.raises(function() bad(fl.zeros(2, 3), fl.zeros(2, 3, 1, {dtype = "int64"})) end,
           "batch_dims 2 for indices of rank 3 and data of rank 2", "GatherND: batch_dims too large")
  local mism = one_node("GatherND", {batch_dims = 1}, {{"float", {2, 3}}, {"int64", {3, 1}}}, 13)
  t.raises(function() mism(fl.zeros(2, 3), fl.zeros(3, 1, {dtype = "int64"})) end,
           "batch dim 1 of indices and data differ", "GatherND: batch dims must agree")
end

-- ---- Det ------------------------------------------------------------------------
do
  -- the Leibniz sum over permutations, in double: independent of any LU
  local function leibniz(m, n)
    local total = 0
    local perm, used = {}, {}
    local function walk(i, sign)
      if i > n then
        local p = sign
        for r = 1, n do p = p * m[(r - 1) * n + perm[r]] end
        total = total + p
        return
      end
      for c = 1, n do
        if not used[c] then
          -- the sign flips once for every unused column left of c
          local inv = 0
          for c2 = 1, c - 1 do if not used[c2] then inv = inv + 1 end end
          used[c], perm[i] = true, c
          walk(i + 1, inv % 2 == 0 and sign or -sign)
          used[c] = false
        end
      end
    end
    walk(1, 1)
    return total
  end
  t.is(leibniz({1, 2, 3, 4}, 2), -2, "Leibniz by hand: 2 x 2")
  t.is(leibniz({2, 0, 0, 0, 3, 0, 0, 0, 4}, 3), 24, "Leibniz by hand: diagonal")
  t.is(leibniz({0, 1, 0, 1, 0, 0, 0, 0, 1}, 3), -1, "Leibniz by hand: a swap")
  local function dets(x, shape)
    local r = #shape
    local n = shape[r]
    local vals, out = flat(x), {}
    local count = #vals // math.max(1, n * n)
    if n == 0 then count = 1; for d = 1, r - 2 do count = count * shape[d] end end
    for b = 0, count - 1 do
      local m = {}
      for i = 1, n * n do m[i] = vals[b * n * n + i] end
      out[b + 1] = leibniz(m, n)
    end
    return out
  end
  for _, shape in ipairs({{2, 2}, {3, 3}, {4, 3, 3}, {2, 3, 4, 4}, {5, 5}, {1, 1}, {2, 1, 1}, {3, 0, 0}, {0, 2, 2}}) do
    local m = one_node("Det", nil, {{"float", shape}}, 11)
    local x = fl.randn(table.unpack(shape))
    local want = dets(x, shape)
    local bshape = {}
    for d = 1, #shape - 2 do bshape[d] = shape[d] end
    both(m, {x}, function(y, name)
      t.is(y.shape, bshape, name .. ": shape")
      near(y, want, 1e-5, 1e-6, name)
    end, "Det float32 " .. table.concat(shape, "x"))
  end
  -- singular: a zero column gives 0 exactly; pivots that need swapping
  local m3 = one_node("Det", nil, {{"float", {3, 3, 3}}}, 11)
  local xs = fl.tensor({{{1, 0, 2}, {3, 0, 4}, {5, 0, 6}},       -- zero column
                        {{0, 2, 1}, {3, 1, 1}, {1, 0, 0}},       -- a zero first pivot
                        {{1e-8, 1, 0}, {1, 1, 0}, {0, 0, 2}}},   -- a tiny one
                       {dtype = "float32"})
  both(m3, {xs}, function(y, name) near(y, dets(xs, {3, 3, 3}), 1e-6, 0, name) end, "Det singular and pivoting")
  -- float64, n = 10, a determinant known by construction: P (L U), L unit
  -- lower, U upper with the diagonal d: det = sign(P) * prod(d)
  local n = 10
  local L, U = {}, {}
  for i = 1, n do
    L[i], U[i] = {}, {}
    for j = 1, n do
      L[i][j] = i == j and 1 or (j < i and math.random() - 0.5 or 0)
      U[i][j] = j > i and math.random() - 0.5 or 0
    end
  end
  local d, want = {}, 1
  for i = 1, n do d[i] = 0.5 + math.random(); U[i][i] = d[i]; want = want * d[i] end
  local A = {}
  for i = 1, n do
    A[i] = {}
    for j = 1, n do
      local acc = 0
      for k = 1, n do acc = acc + L[i][k] * U[k][j] end
      A[i][j] = acc
    end
  end
  A[1], A[4] = A[4], A[1]                                          -- one swap: sign -1
  local m64 = one_node("Det", nil, {{"double", {n, n}}}, 11)
  both(m64, {fl.tensor(A, {dtype = "float64"})}, function(y, name) near(y, {-want}, 1e-10, 0, name) end,
       "Det float64 10 x 10, known by construction")
  local sq = one_node("Det", nil, {{"float", {2, 3}}}, 11)
  t.raises(function() sq(fl.zeros(2, 3)) end, "matrices of 2 x 3 %(square only%)", "Det of a non-square matrix")
  local big = one_node("Det", nil, {{"float", {65, 65}}}, 11)
  t.raises(function() big(fl.zeros(65, 65)) end, "matrices of 65 x 65 %(64 x 64 at most%) is unsupported",
           "Det of a matrix past 64 x 64 refused")
  local iz = one_node("Det", nil, {{"int64", {2, 2}}}, 11)
  t.raises(function() iz(fl.zeros(2, 2, {dtype = "int64"})) end, "dtype int64 is unsupported", "Det of integers refused")
end

-- ---- TensorScatter ----------------------------------------------------------------
do
  -- the spec's pseudocode, over flat lists
  local function want_ts(past, shape, upd, ushape, w, axis, circular)
    local out = {table.unpack(past)}
    local r = #shape
    local function strides(sh)
      local st, acc = {}, 1
      for d = r, 1, -1 do st[d] = acc; acc = acc * sh[d] end
      return st
    end
    local pst, ust = strides(shape), strides(ushape)
    local n = 1
    for _, v in ipairs(ushape) do n = n * v end
    for i = 0, n - 1 do
      local po, b, seq = 0, nil, nil
      for d = 1, r do
        local c = (i // ust[d]) % ushape[d]
        if d == 1 then b = c end
        if d == axis then
          seq = w[b + 1] + c
          if circular then seq = seq % shape[axis] end
          c = seq
        end
        po = po + c * pst[d]
      end
      out[po + 1] = upd[i + 1]
    end
    return out
  end
  for _, case in ipairs({{{2, 1, 4, 5}, -2, 1}, {{3, 4, 5}, 1, 2}, {{2, 3, 6, 2}, 2, 4}, {{2, 5}, 1, 3},
                         {{2, 3, 4}, -1, 4}, {{1, 2, 3}, -2, 1}}) do
    local shape, ax, S = case[1], case[2], case[3]
    local axis = ax < 0 and ax + #shape + 1 or ax + 1
    local M = shape[axis]
    local ushape = {table.unpack(shape)}
    ushape[axis] = S
    for _, mode in ipairs({"linear", "circular"}) do
      for _, dt in ipairs({"float", "int64", "int32"}) do
        local with_w = dt ~= "int32"
        local ins = {{dt, shape}, {dt, ushape}}
        if with_w then ins[3] = {"int64", {shape[1]}} end
        local m = one_node("TensorScatter", {mode = mode, axis = ax}, ins, 24)
        local w = {}
        for b = 1, shape[1] do
          w[b] = with_w and (mode == "linear" and math.random(0, M - S) or math.random(0, 2 * M)) or 0
        end
        local past, upd
        if dt == "float" then past, upd = fl.randn(table.unpack(shape)), fl.randn(table.unpack(ushape))
        else
          past = (fl.rand(table.unpack(shape)) * 100):to("int64")
          upd = (fl.rand(table.unpack(ushape)) * 100 + 100):to("int64")
        end
        local want = want_ts(flat(past), shape, flat(upd), ushape, w, axis, mode == "circular")
        local args = {past, upd}
        if with_w then args[3] = fl.tensor(w, {dtype = "int64"}) end
        both(m, args, function(y, name) t.is({flat(y), y.shape}, {want, shape}, name) end,
             ("TensorScatter %s %s past %s update %s axis %d write %s"):format(mode, dt, table.concat(shape, "x"),
             table.concat(ushape, "x"), ax, table.concat(w, ",")))
      end
    end
  end
  -- by hand: circular wraps past the end
  local m = one_node("TensorScatter", {mode = "circular"}, {{"float", {1, 4, 1}}, {"float", {1, 3, 1}}, {"int64", {1}}}, 24)
  both(m, {fl.tensor({{{0}, {1}, {2}, {3}}}, {dtype = "float32"}), fl.tensor({{{7}, {8}, {9}}}, {dtype = "float32"}),
           fl.tensor({3}, {dtype = "int64"})},
       function(y, name) t.is(flat(y), {8, 9, 2, 7}, name) end, "TensorScatter circular by hand")
  local bad = one_node("TensorScatter", {axis = 0}, {{"float", {2, 3}}, {"float", {2, 3}}}, 24)
  t.raises(function() bad(fl.zeros(2, 3), fl.zeros(2, 3)) end, "axis 0 %(the batch dim%)", "TensorScatter: axis 0 refused")
  local long = one_node("TensorScatter", nil, {{"float", {2, 3, 2}}, {"float", {2, 4, 2}}}, 24)
  t.raises(function() long(fl.zeros(2, 3, 2), fl.zeros(2, 4, 2)) end, "an update of 4 rows for a cache of 3",
           "TensorScatter: an update longer than the cache")
  t.raises(function() one_node("TensorScatter", {mode = "ring"}, {{"float", {2, 3}}, {"float", {2, 1}}}, 24) end,
           "mode 'ring' %(linear or circular%)", "TensorScatter: unknown mode")
end

-- ---- OneHot with depth from a graph input, compiled (a graph break) -------------
do
  local function want_oh(idx, depth, axis, ishape, off, on)
    -- output shape: ishape with depth inserted at axis (0-based, -1 = last)
    local r = #ishape + 1
    local a = axis < 0 and axis + r or axis
    local oshape = {}
    for d = 1, a do oshape[d] = ishape[d] end
    oshape[a + 1] = depth
    for d = a + 1, #ishape do oshape[d + 1] = ishape[d] end
    local out, n = {}, 1
    for _, v in ipairs(oshape) do n = n * v end
    local st, acc = {}, 1
    for d = r, 1, -1 do st[d] = acc; acc = acc * oshape[d] end
    for o = 0, n - 1 do
      local c, src = nil, 0
      local coords = {}
      for d = 1, r do coords[d] = (o // st[d]) % oshape[d] end
      c = coords[a + 1]
      local ic = {}
      for d = 1, r do if d ~= a + 1 then ic[#ic + 1] = coords[d] end end
      for d = 1, #ic do src = src * ishape[d] + ic[d] end
      local v = idx[src + 1]
      v = v < 0 and math.ceil(v) or math.floor(v)         -- cast to int64: truncation
      if v < 0 then v = v + depth end
      out[o + 1] = v == c and on or off
    end
    return out, oshape
  end
  for _, case in ipairs({{"float", {2, 2}, 1, "float"}, {"int64", {3}, -1, "float"}, {"int64", {2, 3}, 0, "int64"},
                         {"float", {4}, -1, "int64"}}) do
    local idt, ishape, axis, ddt = case[1], case[2], case[3], case[4]
    local m = one_node("OneHot", {axis = axis}, {{idt, ishape}, {ddt, {}}, {"float", {2}}}, 11)
    local c = fl.compile(m, {backend = "cpu"})
    for _, depth in ipairs({5, 3, 7}) do
      local n = 1
      for _, v in ipairs(ishape) do n = n * v end
      local iv = {}
      for i = 1, n do iv[i] = math.random(-depth - 1, depth) + (idt == "float" and 0.5 or 0) end
      local idx = fl.tensor(iv, {dtype = idt == "float" and "float32" or "int64"}):reshape(ishape)
      local dv = fl.tensor(ddt == "float" and depth + 0.0 or depth, {dtype = ddt == "float" and "float32" or "int64"})
      local vals = fl.tensor({-1.5, 2.25}, {dtype = "float32"})
      local want, oshape = want_oh(iv, depth, axis, ishape, -1.5, 2.25)
      local name = ("OneHot %s indices %s axis %d depth %d (%s)"):format(idt, table.concat(ishape, "x"), axis, depth, ddt)
      local ye = m(idx, dv, vals)
      t.is({flat(ye), ye.shape}, {want, oshape}, name .. " (eager)")
      local yc = c(idx, dv, vals)
      t.is({flat(yc), yc.shape}, {want, oshape}, name .. " (compiled)")
    end
  end
  -- one graph (fl.capture) cannot read the depth: a clean refusal
  local m = one_node("OneHot", nil, {{"int64", {3}}, {"int64", {}}, {"float", {2}}}, 11)
  t.raises(function() fl.capture(m, fl.tensor({0, 1, 2}, {dtype = "int64"}), fl.tensor(4, {dtype = "int64"}),
                                 fl.tensor({0, 1}, {dtype = "float32"})) end,
           "depth computed from graph inputs under capture %(a data%-dependent value%) is unsupported",
           "OneHot under fl.capture: depth from an input refused")
  -- NaN and huge float indices match no class
  local mf = one_node("OneHot", nil, {{"float", {3}}, {"int64", {}}, {"float", {2}}}, 11)
  local y = fl.compile(mf, {backend = "cpu"})(fl.tensor({0 / 0, 1e30, -1e30}, {dtype = "float32"}),
                                              fl.tensor(3, {dtype = "int64"}), fl.tensor({0, 1}, {dtype = "float32"}))
  t.is(flat(y), {0, 0, 0, 0, 0, 0, 0, 0, 0}, "OneHot compiled: NaN and out-of-range float indices match nothing")
end

-- ---- BitCast ------------------------------------------------------------------------
do
  -- expected values by string.pack / unpack (the machine's own bits), and
  -- for the 16-bit floats by the formula
  local function sx(v, n) v = v & ((1 << n) - 1); if v >= 1 << (n - 1) then v = v - (1 << n) end return v end
  local function half(p, E, M)
    local bias = (1 << (E - 1)) - 1
    local s, e, m = p >> (E + M), (p >> M) & ((1 << E) - 1), p & ((1 << M) - 1)
    local v
    if e == 0 then v = m * 2.0 ^ (1 - bias - M)
    elseif e == (1 << E) - 1 then v = m == 0 and math.huge or 0 / 0
    else v = (1 + m / 2.0 ^ M) * 2.0 ^ (e - bias) end
    return s == 1 and -v or v
  end
  local function is_nan_pattern(p, E, M) return ((p >> M) & ((1 << E) - 1)) == (1 << E) - 1 and (p & ((1 << M) - 1)) ~= 0 end
  local edge32 = {0, 0x80000000, 1, 0x807FFFFF, 0x00800000, 0x7F7FFFFF, 0xFF7FFFFF, 0x7F800000, 0xFF800000,
    0x3F800000, 0xC0200000, 0x007FFFFF, 0x00400001}
  local edge64 = {0, math.mininteger, 1, 0x000FFFFFFFFFFFFF, 0x0010000000000000, 0x7FEFFFFFFFFFFFFF,
    0x7FF0000000000000, -0x10000000000000, 0x3FF0000000000000, -4611686018427387904, 0x0008000000000001}
  local function patterns(n, E, M, edges, count)
    local out = {}
    for _, v in ipairs(edges) do out[#out + 1] = v end
    while #out < count do
      local p = n == 64 and math.random(0) or math.random(0) & ((1 << n) - 1)
      if not is_nan_pattern(n == 64 and p or p, E, M) then out[#out + 1] = p end
    end
    return out
  end
  -- float32 <-> int32 / uint32
  local p32 = patterns(32, 8, 23, edge32, 64)
  local f32v, i32v, u32v = {}, {}, {}
  for i, p in ipairs(p32) do
    f32v[i] = (string.unpack("<f", string.pack("<I4", p)))
    i32v[i], u32v[i] = sx(p, 32), p
  end
  local x32 = fl.tensor(f32v, {dtype = "float32"})
  both(one_node("BitCast", {to = 6}, {{"float", {"N"}}}, 26), {x32}, function(y, name) t.is(y:tolist(), i32v, name) end,
       "BitCast float32 -> int32")
  both(one_node("BitCast", {to = 12}, {{"float", {"N"}}}, 26), {x32}, function(y, name) t.is(y:tolist(), u32v, name) end,
       "BitCast float32 -> uint32")
  for _, c in ipairs({{"int32", i32v}, {"uint32", u32v}}) do
    both(one_node("BitCast", {to = 1}, {{c[1], {"N"}}}, 26), {fl.tensor(c[2], {dtype = "int64"})}, function(y, name)
      t.ok(y.dtype == "float32", name .. ": dtype")
      local got, okb = flat(y), true
      for i, v in ipairs(got) do
        if string.pack("<f", v) ~= string.pack("<f", f32v[i]) then
          okb = false; t.diag(("element %d: %.9g, wanted %.9g"):format(i, v, f32v[i])); break
        end
      end
      t.ok(okb, name .. ": bit for bit (signed zeros, subnormals, infinities)")
    end, "BitCast " .. c[1] .. " -> float32")
  end
  -- float64 <-> int64 / uint64
  local p64 = patterns(64, 11, 52, edge64, 64)
  local f64v = {}
  for i, p in ipairs(p64) do f64v[i] = (string.unpack("<d", string.pack("<i8", p))) end
  local x64 = fl.tensor(f64v, {dtype = "float64"})
  both(one_node("BitCast", {to = 7}, {{"double", {"N"}}}, 26), {x64}, function(y, name) t.is(y:tolist(), p64, name) end,
       "BitCast float64 -> int64")
  both(one_node("BitCast", {to = 13}, {{"double", {"N"}}}, 26), {x64}, function(y, name) t.is(y:tolist(), p64, name) end,
       "BitCast float64 -> uint64")
  for _, c in ipairs({{"int64", 7}, {"uint64", 13}}) do
    both(one_node("BitCast", {to = 11}, {{c[1], {"N"}}}, 26), {fl.tensor(p64, {dtype = "int64"})}, function(y, name)
      local got, okb = flat(y), true
      for i, v in ipairs(got) do
        if string.pack("<d", v) ~= string.pack("<d", f64v[i]) then
          okb = false; t.diag(("element %d: %.17g, wanted %.17g"):format(i, v, f64v[i])); break
        end
      end
      t.ok(okb, name)
    end, "BitCast " .. c[1] .. " -> float64, bit for bit")
  end
  -- float16 and bfloat16 <-> int16 / uint16
  for _, f in ipairs({{"float16", 10, 5, 10}, {"bfloat16", 16, 8, 7}}) do
    local dt, code, E, M = f[1], f[2], f[3], f[4]
    local ps = patterns(16, E, M, {0, 0x8000, 1, 0x8001, (1 << (E + M)) - (1 << M), 0xFFFF - ((1 << M) - 1) - (1 << M)}, 64)
    local vals, i16, u16 = {}, {}, {}
    for i, p in ipairs(ps) do vals[i], i16[i], u16[i] = half(p, E, M), sx(p, 16), p end
    local x = fl.tensor(vals, {dtype = "float64"}):to(dt)    -- exact: each value is one of the type's
    both(one_node("BitCast", {to = 5}, {{code, {"N"}}}, 26), {x}, function(y, name) t.is(y:tolist(), i16, name) end,
         "BitCast " .. dt .. " -> int16")
    both(one_node("BitCast", {to = 4}, {{code, {"N"}}}, 26), {x}, function(y, name) t.is(y:tolist(), u16, name) end,
         "BitCast " .. dt .. " -> uint16")
    both(one_node("BitCast", {to = code}, {{"int16", {"N"}}}, 26), {fl.tensor(i16, {dtype = "int64"})}, function(y, name)
      t.ok(y.dtype == dt, name .. ": dtype")
      local got, okb = flat(y:to("float64")), true
      for i, v in ipairs(got) do
        if string.pack("<d", v) ~= string.pack("<d", vals[i]) then
          okb = false; t.diag(("element %d: %.9g, wanted %.9g"):format(i, v, vals[i])); break
        end
      end
      t.ok(okb, name)
    end, "BitCast int16 -> " .. dt)
  end
  -- float16 <-> bfloat16: 1.0 in float16 (0x3C00) is 1.875 * 2^-7 in bfloat16... by the formula
  both(one_node("BitCast", {to = 16}, {{"float16", {2}}}, 26), {fl.tensor({1.0, -2.0}, {dtype = "float16"})},
       function(y, name) t.is(flat(y:to("float64")), {half(0x3C00, 8, 7), half(0xC000, 8, 7)}, name) end,
       "BitCast float16 -> bfloat16")
  -- integers and bools
  local function ints_case(from, to, code, vals, want)
    both(one_node("BitCast", {to = code}, {{from, {#vals}}}, 26),
         {from == "bool" and fl.tensor(vals) or fl.tensor(vals, {dtype = "int64"})},
         function(y, name) t.is(y:tolist(), want, name) end, ("BitCast %s -> %s"):format(from, to))
  end
  ints_case("int8", "uint8", 2, {-1, -128, 127, 0, -77}, {255, 128, 127, 0, 179})
  ints_case("uint8", "int8", 3, {255, 128, 127, 0, 179}, {-1, -128, 127, 0, -77})
  ints_case("uint16", "int16", 5, {1, 32768, 65535, 40000}, {1, -32768, -1, 40000 - 65536})
  ints_case("int32", "uint32", 12, {-1, math.mininteger >> 32, 2147483647}, {4294967295, 2147483648, 2147483647})
  ints_case("int64", "uint64", 13, {-1, math.mininteger, 5}, {-1, math.mininteger, 5})
  ints_case("bool", "uint8", 2, {true, false, true}, {1, 0, 1})
  ints_case("bool", "int8", 3, {true, false}, {1, 0})
  ints_case("uint8", "bool", 9, {0, 1, 0}, {false, true, false})
  ints_case("int4", "uint4", 21, {-1, -8, 7, 0}, {15, 8, 7, 0})
  -- refusals and errors
  local nan = one_node("BitCast", {to = 6}, {{"float", {3}}}, 26)
  t.raises(function() nan(fl.tensor({1, 0 / 0, 2}, {dtype = "float32"})) end,
           "BitCast of a NaN %(its payload and sign bits are not kept%) is unsupported", "BitCast of a NaN refused (eager)")
  t.raises(function() fl.compile(nan, {backend = "cpu"})(fl.tensor({1, 0 / 0, 2}, {dtype = "float32"})) end,
           "BitCast of a NaN", "BitCast of a NaN refused (compiled)")
  t.raises(function() fl.capture(nan, fl.tensor({1, 3, 2}, {dtype = "float32"})) end,
           "computed from graph inputs under capture", "BitCast of floats under fl.capture refused")
  -- a NaN pattern read as a float is a NaN
  both(one_node("BitCast", {to = 1}, {{"int32", {2}}}, 26), {fl.tensor({0x7FC00000, sx(0xFF800001, 32)}, {dtype = "int64"})},
       function(y, name) local v = flat(y); t.ok(v[1] ~= v[1] and v[2] ~= v[2], name) end, "BitCast of NaN patterns to float32")
  local wide = one_node("BitCast", {to = 7}, {{"float", {2}}}, 26)
  t.raises(function() wide(fl.zeros(2)) end, "BitCast from float %(32 bits%) to int64 %(64 bits%)", "BitCast across widths")
  t.raises(function() one_node("BitCast", {to = 8}, {{"float", {2}}}, 26) end, "BitCast to string is unsupported",
           "BitCast to string refused")
end

t.done()
