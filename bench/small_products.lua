-- small_products.lua -- what a product of few multiply-adds costs on one
-- thread and on the OpenMP team, and an eager model's calls just after
-- the process sat idle (cpu/mm.c runs products under 2^19 multiply-adds
-- on one thread).
--
--   OMP_NUM_THREADS=2 fuselab bench/small_products.lua [ONNX_DIR]
--
-- Part 1: linears of growing size, each call timed alone with some Lua
-- work between calls (as an eager model has), median and 90th percentile
-- of 200 calls.  Part 2, with ONNX_DIR (a model.onnx and input_0.npy, such
-- as bench/onnx_models.py's torch_transformer): 16 eager and 16 compiled
-- calls, then after 0.4 s of sleep 16 more of each, each call's time.
local function pct(ts, p) table.sort(ts) return ts[math.max(1, math.floor(#ts * p))] end

print("linear (M x K -> N)      multiply-adds    median     p90")
for _, s in ipairs{{8, 64, 64}, {32, 64, 64}, {32, 64, 128}, {32, 64, 192}, {64, 128, 128}, {64, 256, 256},
                   {128, 256, 256}, {256, 256, 512}} do
  local M, K, N = s[1], s[2], s[3]
  local x, w = fl.randn(M, K), fl.randn(N, K)
  for _ = 1, 20 do fl.linear(x, w) end
  local ts = {}
  for r = 1, 200 do
    local t0 = fl.now()
    fl.linear(x, w)
    ts[r] = fl.now() - t0
    local a = 0
    for j = 1, 2000 do a = a + j end
  end
  local med = pct(ts, 0.5)
  print(("%4d x %4d -> %4d  %12d  %7.1f us %7.1f us"):format(M, K, N, M * K * N, med * 1e6, pct(ts, 0.9) * 1e6))
end

if arg[1] then
  local m = fl.load_onnx(arg[1] .. "/model.onnx")
  local x = fl.load(arg[1] .. "/input_0.npy")
  local cm = fl.compile(m, {backend = "cpu"})
  local function calls(what, f)
    local line = {}
    for i = 1, 16 do
      local t0 = fl.now()
      f(x)
      line[i] = ("%.2f"):format((fl.now() - t0) * 1e3)
    end
    print(what, table.concat(line, " "))
  end
  for _ = 1, 5 do m(x); cm(x) end
  calls("eager ms, warm         ", m)
  calls("compiled ms, warm      ", cm)
  os.execute("sleep 0.4")
  calls("compiled ms, after idle", cm)
  os.execute("sleep 0.4")
  calls("eager ms, after idle   ", m)
end
