-- matmul_int8.lua -- fl.matmul_int8, the exact product of 8-bit values
-- held in int64 tensors (ONNX's MatMulInteger and QLinearMatMul): eager
-- (oneDNN's u8 x s8 product with its operands rewritten, cpu/eager_int8.c)
-- against sums computed here in plain Lua integers, over random shapes,
-- every type pair, zero points, a batched and a shared B, strided views,
-- and the extremes whose pair sums overflow 16 bits; compiled (C) equal to
-- eager; bad input refused by name; on CUDA (the emulator in make check)
-- equal to eager.
local fl = fl or require "fuselab"
local t = require "tap"

local RANGE = {int8 = {-128, 127}, uint8 = {0, 255}}

-- an int64 tensor of shape with values of type ty: random, or (extreme)
-- the type's ends alternating
local function values(shape, ty, extreme)
  local lo, hi = RANGE[ty][1], RANGE[ty][2]
  local n = 1
  for _, s in ipairs(shape) do n = n * s end
  local v = {}
  for i = 1, n do v[i] = extreme and (i % 3 == 0 and lo or hi) or math.random(lo, hi) end
  return v, fl.tensor(v, {dtype = "int64"}):reshape(table.unpack(shape))
end

-- the oracle: sum over k of (a - za)(b - zb), Lua integers, row-major
local function oracle(av, bv, batch, M, K, N, b_batched, za, zb)
  local out = {}
  for bt = 0, batch - 1 do
    local bo = b_batched and bt * K * N or 0
    for m = 0, M - 1 do
      local zam = za and (#za == 1 and za[1] or za[m + 1]) or 0
      for n = 0, N - 1 do
        local zbn = zb and (#zb == 1 and zb[1] or zb[n + 1]) or 0
        local s = 0
        for k = 0, K - 1 do
          s = s + (av[(bt * M + m) * K + k + 1] - zam) * (bv[bo + k * N + n + 1] - zbn)
        end
        out[#out + 1] = s
      end
    end
  end
  return out
end

local function same(y, want)
  local got = y:reshape(-1):tolist()
  if #got ~= #want then return false, ("%d values, expected %d"):format(#got, #want) end
  for i = 1, #want do
    if got[i] ~= want[i] then return false, ("value %d: %d, expected %d"):format(i, got[i], want[i]) end
  end
  return true
end

local calls0 = fl.blas_info().onednn_int8_calls

math.randomseed(7)
local types = {"int8", "uint8"}
local cases, bad, compiled_bad = 0, {}, {}
for trial = 1, 60 do
  local at, bt = types[math.random(2)], types[math.random(2)]
  local batch = trial % 3 == 0 and math.random(1, 3) or 1
  local M, K, N = math.random(1, 9), math.random(0, 3) == 0 and math.random(64, 300) or math.random(0, 40), math.random(1, 11)
  local b_batched = batch > 1 and trial % 2 == 0
  local extreme = trial % 4 == 1
  local ashape = batch > 1 and {batch, M, K} or {M, K}
  local bshape = b_batched and {batch, K, N} or {K, N}
  local av, a = values(ashape, at, extreme)
  local bv, b = values(bshape, bt, extreme)
  local opts = {a_type = at, b_type = bt}
  local za, zb
  if trial % 5 >= 2 then
    za, opts.a_zero = values(trial % 2 == 0 and {M} or {}, at)
    zb, opts.b_zero = values(trial % 3 == 0 and {N} or {}, bt)
  end
  local want = oracle(av, bv, batch, M, K, N, b_batched, za, zb)
  local ok, why = same(fl.matmul_int8(a, b, opts), want)
  local what = ("%s[%s] x %s[%s]%s%s"):format(at, table.concat(ashape, ","), bt, table.concat(bshape, ","),
    za and " with zero points" or "", extreme and " (extremes)" or "")
  cases = cases + 1
  if not ok then bad[#bad + 1] = what .. ": " .. why end
  if trial <= 20 then   -- a compile of its own: one shape each, no recompile limit
    local f = fl.compile(function(x, y) return fl.matmul_int8(x, y, opts) end)
    ok, why = same(f(a, b), want)
    local st = f:stats()
    if st.compiles ~= 1 or st.fallbacks ~= 0 or st.kernels < 1 then ok, why = false, "not compiled" end
    if not ok then compiled_bad[#compiled_bad + 1] = what .. ": " .. why end
  end
end
t.ok(#bad == 0, ("eager equals plain-Lua integer sums in %d random cases%s"):format(cases,
  #bad > 0 and ": " .. bad[1] or ""))
t.ok(#compiled_bad == 0, ("compiled (C) equals them in the first 20%s"):format(#compiled_bad > 0 and ": " .. compiled_bad[1] or ""))
t.ok(fl.blas_info().onednn_int8_calls > calls0, ("the products ran on oneDNN's int8 kernels (%d calls)"):format(
  fl.blas_info().onednn_int8_calls - calls0))

-- a transposed A (a strided view) and a B expanded over a batch
do
  local av, a = values({5, 3}, "uint8")
  local bv, b = values({5, 4}, "int8")
  local at = a:transpose(1, 2)                        -- [3, 5], strided
  local tv = {}
  for m = 0, 2 do for k = 0, 4 do tv[#tv + 1] = av[k * 3 + m + 1] end end
  t.ok(same(fl.matmul_int8(at, b, {a_type = "uint8"}), oracle(tv, bv, 1, 3, 5, 4, false)),
    "a transposed (strided) A reads its own values")
  local be = b:reshape(1, 5, 4):expand(2, 5, 4)
  local a2v, a2 = values({2, 3, 5}, "int8")
  t.ok(same(fl.matmul_int8(a2, be), oracle(a2v, bv, 2, 3, 5, 4, false)), "an expanded (stride 0) B is shared by every batch")
end

-- K past what an int32 sum of oneDNN's would hold: the int64 loop
do
  local K = 100000
  local av, a = values({1, K}, "uint8", true)
  local bv, b = values({K, 1}, "uint8", true)
  t.ok(same(fl.matmul_int8(a, b, {a_type = "uint8", b_type = "uint8"}), oracle(av, bv, 1, 1, K, 1, false)),
    "K = 100000 of extremes: exact (the int64 loop)")
end

-- bad input: named, nothing crashes
do
  local a = fl.tensor({1, 2, 3, 4}, {dtype = "int64"}):reshape(2, 2)
  local function refuses(want, ...)
    local ok, err = pcall(fl.matmul_int8, ...)
    t.ok(not ok and tostring(err):find(want, 1, true) ~= nil, "refused: " .. tostring(err))
  end
  refuses("B holds 300, outside uint8's range 0..255", a, fl.tensor({300, 1, 2, 3}, {dtype = "int64"}):reshape(2, 2), {b_type = "uint8"})
  refuses("A holds -1, outside uint8's range", fl.tensor({-1, 1, 2, 3}, {dtype = "int64"}):reshape(2, 2), a, {a_type = "uint8"})
  refuses("za holds 200, outside int8's range", a, a, {a_zero = fl.tensor({200}, {dtype = "int64"})})
  refuses("A must be int64", a:to("float32"), a)
  refuses("inner dimensions differ", a, fl.tensor({1, 2, 3}, {dtype = "int64"}):reshape(3, 1))
  refuses("zero point zb must be one value or [2]", a, a, {b_zero = fl.tensor({1, 2, 3}, {dtype = "int64"})})
  refuses("matmul_int8: a_type int4 (int8 or uint8)", a, a, {a_type = "int4"})
  refuses("unknown option", a, a, {a_typ = "int8"})
  t.ok(same(fl.matmul_int8(a, a), {7, 10, 15, 22}), "the REPL's state goes on after the refusals")
end

-- CUDA (on the emulator in make check): equal to eager
local have = fl.cuda_available()
if have then
  local g = fl.compile(function(a, b, za, zb) return fl.matmul_int8(a, b, {a_type = "uint8", a_zero = za, b_zero = zb}) end,
                       {backend = "cuda"})
  local bad_cuda = 0
  for trial = 1, 6 do
    local M, K, N = math.random(1, 7), math.random(1, 70), math.random(1, 9)
    local _, a = values({2, M, K}, "uint8", trial == 1)
    local _, b = values(trial % 2 == 0 and {2, K, N} or {K, N}, "int8", trial == 1)
    local _, za = values({M}, "uint8")
    local _, zb = values({}, "int8")
    local want = fl.matmul_int8(a, b, {a_type = "uint8", a_zero = za, b_zero = zb})
    local y = g(a:cuda(), b:cuda(), za:cuda(), zb:cuda())
    if y.device ~= "cuda" or not same(y:cpu(), want:reshape(-1):tolist()) then bad_cuda = bad_cuda + 1 end
  end
  t.ok(bad_cuda == 0, ("compiled for CUDA equals eager in 6 cases (%d differ)"):format(bad_cuda))
else
  t.skip("no CUDA device: the emulator runs the CUDA cases", 1)
end

t.done()
