-- int8.lua -- the 8-bit product (fl.matmul_int8, oneDNN's u8 x s8 kernels
-- with B split where its values need it) against the float64 product the
-- ONNX loader used before it (exact too), and the float32 one for scale,
-- on the shapes of a quantized BERT-base layer (batch 1, 128 tokens).
-- Rounds alternate the three; prints medians with their range and the
-- ratios of medians.
--   build/fuselab bench/int8.lua [rounds]
local median = dofile((arg and arg[0] or ""):match("^(.-)[^/]*$") .. "stats.lua").median
local rounds = tonumber(arg and arg[1]) or 15

local function ints(m, n, lo, hi)
  local v = {}
  for i = 1, m * n do v[i] = math.random(lo, hi) end
  return fl.tensor(v, {dtype = "int64"}):reshape(m, n)
end

math.randomseed(1)
print(("CPU: %s"):format(fl.blas_info().matmul))
for _, s in ipairs{{128, 768, 768}, {128, 768, 3072}, {128, 3072, 768}} do
  local M, K, N = s[1], s[2], s[3]
  local a = ints(M, K, 0, 255)
  local cases = {
    {"int8 (B in -64..64: one product)", ints(K, N, -64, 64)},
    {"int8 (B full range: two)", ints(K, N, -128, 127)},
  }
  local a64, a32 = a:to("float64"), a:to("float32")
  local b64, b32 = cases[2][2]:to("float64"), cases[2][2]:to("float32")
  local za = fl.full({}, 128, {dtype = "int64"})
  local runs = {
    function() return fl.matmul_int8(a, cases[1][2], {a_type = "uint8", a_zero = za}) end,
    function() return fl.matmul_int8(a, cases[2][2], {a_type = "uint8", a_zero = za}) end,
    function() return fl.matmul(a64 - 128, b64) end,
    function() return fl.matmul(a32, b32) end,
  }
  local names = {cases[1][1], cases[2][1], "float64 (exact, the old way)", "float32 (not exact)"}
  local t = {{}, {}, {}, {}}
  for _, f in ipairs(runs) do f() end
  for _ = 1, rounds do
    for i, f in ipairs(runs) do
      local t0 = fl.now()
      f()
      t[i][#t[i] + 1] = (fl.now() - t0) * 1e3
    end
  end
  print(("%dx%dx%d:"):format(M, K, N))
  local med = {}
  for i = 1, #runs do
    local m, lo, hi = median(t[i])
    med[i] = m
    print(("  %-34s %8.2f ms  (%.2f-%.2f)"):format(names[i], m, lo, hi))
  end
  print(("  float64 / int8 two products: %.2fx; float64 / int8 one: %.2fx"):format(med[3] / med[2], med[3] / med[1]))
end
