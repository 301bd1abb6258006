-- exact.lua -- int64 is exact, and eager and compiled code agree on the
-- edge values: overflow wraps (as PyTorch), integer powers with negative
-- exponents, float -> int64 of NaN and infinities, (-inf)^0.5 and the other
-- C99 special cases of pow whatever the element's position, Lua integers
-- in and out of int64 tensors.  Each compiled result must equal the eager
-- one bit for bit (NaN matching NaN).
local fl = fl or require "fuselab"
local t = require "tap"

local TS = 1733000000123456789           -- a nanosecond timestamp, > 2^53

local function i64(v) return fl.tensor(v, {dtype = "int64"}) end

-- same dtype, same shape, every element equal (NaN equal to NaN, -0 to -0)
local function same(a, b)
  if a.dtype ~= b.dtype or a:numel() ~= b:numel() then return false end
  local x, y = a:reshape(-1):tolist(), b:reshape(-1):tolist()
  for k = 1, #x do
    local p, q = x[k], y[k]
    if not (p == q or (p ~= p and q ~= q)) then return false end
    if math.type(p) ~= math.type(q) then return false end
    if p == 0 and type(p) == "number" and math.type(p) == "float" and 1 / p ~= 1 / q then return false end
  end
  return true
end

-- f run eagerly and compiled gives the same results, which are returned
local function agree(name, f, ...)
  local e = table.pack(f(...))
  local c = table.pack(fl.compile(f)(...))
  local good = e.n == c.n
  for k = 1, e.n do good = good and same(e[k], c[k]) end
  t.ok(good, name .. ": compiled equals eager")
  return table.unpack(e, 1, e.n)
end

-- ---- Lua integers in and out
local ts = i64{TS, -TS, math.maxinteger, math.mininteger}
t.is(ts:tolist()[1], TS, "fl.tensor keeps a timestamp exactly")
t.is(math.type(ts:tolist()[1]), "integer", "tolist gives Lua integers for int64")
t.is(i64{TS}:item(), TS, "item is exact")
t.ok(tostring(i64{TS}):find("1733000000123456789", 1, true), "printing is exact")
local g = fl.capture(function(x) return x + TS end, i64{0})
t.ok(tostring(g):find("const 1733000000123456789 : int64", 1, true),
     "a graph listing shows an int64 constant exactly")

-- ---- arithmetic beyond 2^53
local d = agree("(t + 1) - t", function(x) return (x + 1) - x end, ts)
t.is(d:tolist()[1], 1, "(t + 1) - t is 1 for a nanosecond timestamp")
local add, mul, neg, ab = agree("overflow", function(x)
  return x + 1, x * 2, -x, x:abs()
end, ts)
t.is(add:tolist()[3], math.mininteger, "INT64_MAX + 1 wraps to INT64_MIN, as PyTorch")
t.is(mul:tolist()[3], -2, "INT64_MAX * 2 wraps")
t.is(neg:tolist()[4], math.mininteger, "-INT64_MIN wraps to itself")
t.is(ab:tolist()[4], math.mininteger, "abs(INT64_MIN) wraps to itself")
local s, mx, am = agree("reductions", function(x) return x:sum(), x:amax(), x:argmax() end,
                       i64{TS, TS + 1, 5})
t.is(s:item(), 2 * TS + 6, "sum is exact")
t.is(mx:item(), TS + 1, "amax sees the last bit")
t.is(am:item(), 1, "argmax sees the last bit")   -- 0-based, as PyTorch
local lt, w = agree("compare and where", function(x, y)
  return x:lt(y), fl.where(x:lt(y), y, x)
end, i64{TS, TS}, i64{TS + 1, TS - 1})
t.is(lt:tolist()[1], true, "lt sees 1 ns at a timestamp")
t.is(w:tolist()[1], TS + 1, "where keeps every bit")
agree("maximum, minimum, clamp", function(x, y)
  return fl.maximum(x, y), fl.minimum(x, y), x:clamp(0, 1e30)
end, ts, i64{TS + 1, 0, 0, 0})

-- ---- fmod truncates, remainder floors; INT64_MIN by -1 does not trap
local q, r = agree("integer fmod and remainder", function(a, b) return fl.fmod(a, b), fl.remainder(a, b) end,
                   i64{-7, 7, -7, 7, TS, math.mininteger, math.mininteger},
                   i64{3, 3, -3, -3, 1000000007, -1, 7})
t.is(table.concat(q:tolist(), " "), ("-1 1 -1 1 %d 0 %d"):format(TS % 1000000007, math.fmod(math.mininteger, 7)),
     "fmod has the dividend's sign (C's %), exact beyond 2^53")
t.is(table.concat(r:tolist(), " "), ("2 1 -1 -2 %d 0 %d"):format(TS % 1000000007, math.mininteger % 7),
     "remainder has the divisor's sign (Lua's and Python's %)")
local ok, err = pcall(fl.fmod, i64{1, 2}, i64{1, 0})
t.ok(not ok and tostring(err):find("fmod: integer division by zero", 1, true),
     "an integer divisor of 0 is refused eagerly, as PyTorch")
local fq, fr = agree("float fmod and remainder", function(a, b) return a:fmod(b), a:remainder(b) end,
                     fl.tensor{-7.5, 7.5, -7.5, 7.5, 1e30, 0 / 0, 1}, fl.tensor{2, 2, -2, -2, 3, 1, 0})
t.is(table.concat(fq:tolist(), " ", 1, 4), "-1.5 1.5 -1.5 1.5", "float fmod: the dividend's sign")
t.is(table.concat(fr:tolist(), " ", 1, 4), "0.5 1.5 -1.5 -0.5", "float remainder: the divisor's sign")
t.ok(fr:tolist()[6] ~= fr:tolist()[6] and fq:tolist()[7] ~= fq:tolist()[7], "NaN in, or a divisor of 0: NaN")

-- ---- integer powers
local p = agree("integer pow with negative tensor exponents", function(b, e) return b ^ e end,
                i64{1, -1, -1, 2, 0, 3}, i64{-1, -3, -2, -1, -2, 41})
t.is(p:tolist()[1], 1, "1 ^ -1 = 1")
t.is(p:tolist()[2], -1, "(-1) ^ -3 = -1")
t.is(p:tolist()[3], 1, "(-1) ^ -2 = 1")
t.is(p:tolist()[4], 0, "2 ^ -1 = 0 (PyTorch's integer result)")
local r = 1
for _ = 1, 41 do r = r * 3 end   -- Lua integers wrap around too
t.is(p:tolist()[6], r, "3 ^ 41 wraps as int64")
t.raises(function() return ts ^ -1 end, "pow: integers to negative integer powers are not allowed",
         "a negative Lua integer exponent is refused eagerly")
t.raises(function() return fl.compile(function(x) return x ^ -2 end)(ts) end,
         "pow: integers to negative integer powers are not allowed",
         "and compiled")

-- ---- float -> int64
local f2i = agree("float -> int64", function(x) return x:to("int64") end,
                  fl.tensor{0 / 0, 1 / 0, -1 / 0, 1e30, -7.9, 7.9})
t.is(table.concat(f2i:tolist(), " "),
     ("%d %d %d %d -7 7"):format(math.mininteger, math.mininteger, math.mininteger, math.mininteger),
     "NaN, infinities and out of range give INT64_MIN (x86's and PyTorch's answer there)")

-- ---- pow's special cases, in every lane: 19 elements put some in vector
-- lanes and some in the scalar remainder of a loop
local base = {}
for k = 1, 19 do base[k] = ({-1 / 0, -0.0, -2, 1 / 0, 0.0})[k % 5 + 1] end
local bx = fl.tensor(base)
local half = agree("pow special cases", function(x)
  return x ^ 0.5, x ^ 3.0, x ^ -0.5, x ^ -1.0, x ^ 2.0, x ^ 0.0, x ^ fl.full({19}, 0.5)
end, bx)
local hl = half:tolist()
local ok_inf = true
for k = 1, 19 do if base[k] == -1 / 0 and hl[k] ~= 1 / 0 then ok_inf = false end end
t.ok(ok_inf, "(-inf) ^ 0.5 is +inf (C99) at every position")
-- the same with the exponent a tensor of one element, read from memory as
-- LRN's is: the vectorized loop (the operand read once before it) must give
-- C99's answers too: odd and even integers, 2^25 (even), NaN, halves
do
  local es = {fl.tensor(3.0), fl.tensor(-1.0), fl.tensor(2.0), fl.tensor(0.5), fl.tensor(-0.5),
              fl.tensor(33554432.0), fl.tensor(0 / 0), fl.tensor{5.0}}
  local wide = {}
  for k = 1, 37 do wide[k] = ({-1 / 0, -0.0, -2, 1 / 0, 0.0, 0 / 0, 4.0})[k % 7 + 1] end
  agree("pow special cases, exponent loaded", function(x)
    local out = {}
    for i, e in ipairs(es) do out[i] = x ^ e end
    return table.unpack(out)
  end, fl.tensor(wide))
end

-- ---- integer products: exact and wrapping in eager, the oracle and compiled code
do
  local a = i64{{TS, 3037000500, 1}, {-TS, 2, math.maxinteger}}
  local b = i64{{1, 2}, {3037000500, 1}, {2, math.mininteger}}
  local want11 = TS + 3037000500 * 3037000500 + 2          -- Lua integers wrap too
  local mm = agree("int64 matmul", function(x, y) return x:matmul(y) end, a, b)
  t.is(mm:tolist()[1][1], want11, "int64 matmul is exact and wraps like Lua integers")
  t.is(mm:tolist()[2][2], -2 * TS + 2 + math.maxinteger * math.mininteger, "every element")
  local g = fl.capture(function(x, y) return x:matmul(y) end, a, b)
  t.ok(same(g:run_reference(a, b), mm), "the reference interpreter agrees")
  local w, bias = i64{{1, TS, 0}, {0, 1, 1}}, i64{TS, -1}
  local lin = agree("int64 linear", function(x) return fl.linear(x, w, bias) end, a)
  t.is(lin:tolist()[1][1], TS + TS * 3037000500 + TS, "int64 linear is exact, bias included")
  local gl = fl.capture(function(x) return fl.linear(x, w, bias) end, a)
  t.ok(same(gl:run_reference(a), lin), "the reference interpreter agrees on linear")
end

-- ---- max_pool2d of an int64 image compares every bit
do
  local img = i64{{{{TS, TS + 1}, {TS - 1, -TS}}}}
  local mp = agree("int64 max_pool2d", function(x) return fl.max_pool2d(x, 2) end, img)
  t.is(mp:reshape(-1):tolist()[1], TS + 1, "int64 max_pool2d sees the last bit")
  local g = fl.capture(function(x) return fl.max_pool2d(x, 2) end, img)
  t.ok(same(g:run_reference(img), mp), "the reference interpreter agrees on max_pool2d")
end

t.done()
