-- transcendental.lua -- the eager kernels of exp, log, tanh, sin, cos,
-- erf, sigmoid, silu, gelu (both forms), sqrt and rsqrt are vectorized
-- polynomials (cpu/eager_impl.h): here each is compared, over ~45000
-- inputs (a fine grid of [-10, 10], magnitudes from the subnormals to
-- 1e38 of both signs, 0, -0, the infinities, NaN, and past sin/cos's
-- reduction range), with the double-precision reference interpreter
-- (g:run_reference), in float32 ulps.  Tolerances: 0 for sqrt, 1 for
-- rsqrt, 2 for exp and log, 3 for the rest; gelu also passes within 1e-7
-- absolute, where its values are tiny (x < -5) and the reference itself,
-- 0.5 x (1 + erf(x / sqrt 2)) in double, cancels; silu within 1e-2
-- relative (or 1e-43, 70 units of the smallest subnormal) below x = -87,
-- where e^x is subnormal in float32 (8 bits left at x = -98; the kernel
-- before gave -0 there).  NaN must give NaN, infinities the reference's
-- values, and -0 stays -0 for the odd ones.  sigmoid reaches its
-- subnormals below x = -88.7 (1 / (1 + inf) gave 0).
local fl = fl or require "fuselab"
local t = require "tap"

local inputs = {0.0, -0.0, 1 / 0, -1 / 0, 0 / 0, 1.4e-45, -1.4e-45, 1e-40, -1e-40,
                1.17549435e-38, -1.17549435e-38, 3.4028234e38, -3.4028234e38,
                8191.9, 8192.1, -8192.1, 1e5, -1e5, 12345.678, 1e10, -1e20, 3e38}
for i = -10000, 10000 do inputs[#inputs + 1] = i / 1000 end
local m = 1e-38
while m < 1e38 do
  inputs[#inputs + 1] = m
  inputs[#inputs + 1] = -m * 1.37
  m = m * 1.0035
end
local x = fl.tensor(inputs)

-- float32 bits, ordered so that neighbours differ by 1 (-0 and 0 meet)
local function ord(v)
  local b = string.unpack("<i4", string.pack("<f", v))
  if b < 0 then b = -0x80000000 - b end
  return b
end

local function isnan(v) return v ~= v end

-- tol: ulps; also(x, got, want): another way to pass, for the ranges
-- the header names; odd: f(-0) must be -0; run: what computes fn (fn
-- itself, eagerly, unless given)
local function check(name, fn, tol, also, odd, run)
  local got = (run or fn)(x):tolist()
  local g = fl.capture(fn, x)
  local want = g:run_reference(x):tolist()
  local worst, wi, bad, nbad = 0, nil, nil, 0
  for i = 1, #inputs do
    local a, b = got[i], want[i]
    local ok
    if isnan(b) or isnan(a) then ok = isnan(a) and isnan(b)
    elseif b == math.huge or b == -math.huge or a == math.huge or a == -math.huge then ok = a == b
    else
      local d = math.abs(ord(a) - ord(b))
      if d > worst then worst, wi = d, i end
      ok = d <= tol or (also ~= nil and also(inputs[i], a, b))
    end
    if not ok then
      nbad = nbad + 1
      bad = bad or ("x = %.9g: got %.9g, reference %.9g"):format(inputs[i], a, b)
    end
  end
  t.ok(nbad == 0, ("%s: within %d ulps of the reference%s (worst %d ulps, at x = %.6g)"):format(
    name, tol, also and ", or as the header says" or "", worst, wi and inputs[wi] or 0))
  if nbad > 0 then t.diag(("%d inputs off, first: %s"):format(nbad, bad)) end
  if odd then
    local z = fn(fl.tensor{-0.0}):tolist()[1]
    t.ok(z == 0 and 1 / z == -1 / 0, name .. "(-0) is -0")
  end
end

check("exp", function(a) return a:exp() end, 2)
check("log", function(a) return a:log() end, 2)
check("tanh", function(a) return a:tanh() end, 3, nil, true)
check("sin", function(a) return a:sin() end, 3, nil, true)
check("cos", function(a) return a:cos() end, 3)
check("erf", function(a) return a:erf() end, 2, nil, true)
check("sigmoid", function(a) return a:sigmoid() end, 3)
local function tiny(_, a, b) return math.abs(a - b) <= 1e-7 end
-- silu below x = -87, where e^x is subnormal (the header)
local function silu_low(v, a, b) return v < -87 and math.abs(a - b) <= 1e-2 * math.abs(b) + 1e-43 end
check("silu", function(a) return a:silu() end, 3, silu_low)
check("gelu", function(a) return a:gelu() end, 3, tiny)
-- compiled gelu is the decomposed 0.5 x (1 + erf(x / sqrt 2)) in float32
-- (the eager kernel computes 1 + erf as erfc where x < 0): for x < 0
-- the sum cancels: erf's error (1.3 ulp of 1, 7.8e-8) times |x| / 2, and the
-- products' own roundings, stay within 5e-8 |x| absolute
local function cancels(v, a, b) return v < 0 and math.abs(a - b) <= 5e-8 * math.abs(v) end
check("gelu tanh", function(a) return a:gelu{approximate = "tanh"} end, 3, tiny)
check("sqrt", function(a) return a:sqrt() end, 0)
check("rsqrt", function(a) return a:rsqrt() end, 1)

-- compiled C kernels: exp and erf and what is built on them call the
-- same polynomials (cpu/expf.h, cpu/erff.h), inlined, never libmvec's
for _, c in ipairs{{"exp", function(a) return a:exp() end, 2},
                   {"erf", function(a) return a:erf() end, 2},
                   {"sigmoid", function(a) return a:sigmoid() end, 3},
                   {"silu", function(a) return a:silu() end, 3, silu_low},
                   {"gelu", function(a) return a:gelu() end, 3, cancels}} do
  check("compiled " .. c[1], c[2], c[3], c[4], nil, fl.compile(c[2]))
end
do
  -- a causal mask's -inf scores: exactly 0 after the softmax, compiled as eagerly
  local s = fl.tensor{{0.5, -1 / 0, 2.0, -1 / 0}, {-1 / 0, -1 / 0, 1.0, -3.0}}
  local f = function(a) return (a * 0.125):softmax(-1) end
  local y = fl.compile(f)(s):tolist()
  t.ok(y[1][2] == 0 and y[1][4] == 0 and y[2][1] == 0 and y[2][2] == 0, "compiled softmax: -inf scores give 0")
  t.ok(fl.allclose(fl.tensor(y), f(s), 1e-6, 0), "and the rest as eager within 1e-6")
end

do
  -- exp(a - max(a)) compiles to cpu/expf.h's shifted exp (one scale factor,
  -- no overflow path): a grid of [-110, 0] by 1/1000 with 0 as the row's
  -- max, -inf, and a second row holding a NaN.  Within 1 ulp of the
  -- reference where e^x is normal (x >= -87.33); 0 or below 2^-126 under it.
  local row = {0.0, -1 / 0, -1e30}
  for i = -110000, 0 do row[#row + 1] = i / 1000 end
  local nan_row = {}
  for i = 1, #row do nan_row[i] = row[i] end
  nan_row[7] = 0 / 0
  local a = fl.tensor{row, nan_row}
  local f = function(v) return (v - v:amax(-1, true)):exp() end
  local cf = fl.compile(f)
  t.ok(cf(a) and cf:code():find("fl_expf_shifted(", 1, true), "exp of a value minus its row's max uses the shifted exp")
  local got, want = cf(a):tolist(), fl.capture(f, a):run_reference(a):tolist()
  local nbad, bad, worst = 0, nil, 0
  for i = 1, #row do
    local g, w, ok = got[1][i], want[1][i], nil
    if w >= 2 ^ -126 then
      local d = math.abs(ord(g) - ord(w))
      worst = math.max(worst, d)
      ok = d <= 1
    else
      ok = g >= 0 and g < 2 ^ -126
    end
    if not ok then nbad, bad = nbad + 1, bad or ("x = %.9g: got %.9g, reference %.9g"):format(row[i], g, w) end
  end
  t.ok(nbad == 0, ("compiled exp(x - max): within 1 ulp where normal, under 2^-126 elsewhere (worst %d ulps)"):format(worst))
  if nbad > 0 then t.diag(("%d inputs off, first: %s"):format(nbad, bad)) end
  local allnan = true
  for i = 1, #row do allnan = allnan and isnan(got[2][i]) end
  t.ok(allnan, "a row with a NaN: NaN throughout, as the reference")
  -- the softmax itself, rows of 3 to 2000 scores spread over [-120, 40]
  local good = true
  for _, n in ipairs{3, 17, 100, 2000} do
    local s = fl.rand(7, n) * 160 - 120
    local g = function(v) return v:softmax(-1) end
    good = good and fl.allclose(fl.compile(g)(s), fl.capture(g, s):run_reference(s), 1e-6, 1e-37)
  end
  t.ok(good, "compiled softmax over [-120, 40] scores: the reference within 1e-6 relative")
end

-- a strided input goes through the same kernels (on a gathered copy)
local xs = fl.tensor(inputs):narrow(1, 23, 20000):reshape(100, 200):transpose(1, 2)
t.ok(fl.allclose(xs:tanh(), xs:contiguous():tanh(), 0, 0), "tanh of a transposed view")
t.ok(fl.allclose(xs:sin(), xs:contiguous():sin(), 0, 0), "sin of a transposed view")

t.done()
