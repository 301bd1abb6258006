-- blas.lua -- what the BLAS kernel pick (cpu/blas.c) is worth: float32
-- products in child processes, alternating, with the pick (the default)
-- and with FUSELAB_BLAS_PICK=0 (OpenBLAS's own choice, which on CPUs it
-- does not know is its SSE3 "Prescott" set).  Prints GFLOP/s medians and
-- ranges and their ratio, and the kernels each side ran.
--   build/fuselab bench/blas.lua [rounds]
local rounds = tonumber(arg and arg[1]) or 5
local exe = arg[-1] or "fuselab"

local child = [[
local cases = {{1024, 1024, 1024}, {256, 2048, 512}, {128, 128, 64}}
print("core", fl.blas_info().core)
for _, c in ipairs(cases) do
  local M, K, N = c[1], c[2], c[3]
  local a, b = fl.randn(M, K), fl.randn(K, N)
  local reps = math.max(1, math.floor(2e9 / (2 * M * K * N)))
  a:matmul(b)
  local best = math.huge
  for _ = 1, 5 do
    local t0 = fl.now()
    for _ = 1, reps do a:matmul(b) end
    best = math.min(best, (fl.now() - t0) / reps)
  end
  print(("%dx%dx%d"):format(M, K, N), 2 * M * K * N / best / 1e9)
end
]]

local function run(pick)
  local p = assert(io.popen(("FUSELAB_BLAS_PICK=%d %s -e %q"):format(pick, exe, child)))
  local out = {}
  for line in p:lines() do
    local k, v = line:match("^(%S+)%s+(%S+)$")
    if k then out[k] = tonumber(v) or v end
  end
  p:close()
  return out
end

local median = dofile((arg and arg[0] or ""):match("^(.-)[^/]*$") .. "stats.lua").median

local names = {"1024x1024x1024", "256x2048x512", "128x128x64"}
local g, cores = {[0] = {}, [1] = {}}, {}
for _ = 1, rounds do
  for _, pick in ipairs{1, 0} do
    local o = run(pick)
    cores[pick] = o.core
    for _, n in ipairs(names) do
      g[pick][n] = g[pick][n] or {}
      table.insert(g[pick][n], o[n])
    end
  end
end
print(("float32 matmul GFLOP/s, best of 5 per process, %d alternating rounds; kernels: %s (picked) vs %s (OpenBLAS's own)"):format(
  rounds, tostring(cores[1]), tostring(cores[0])))
for _, n in ipairs(names) do
  local m1, lo1, hi1 = median(g[1][n])
  local m0, lo0, hi0 = median(g[0][n])
  print(("  %-15s picked %7.1f (%.1f-%.1f)   own %7.1f (%.1f-%.1f)   %.2fx"):format(n, m1, lo1, hi1, m0, lo0, hi0, m1 / m0))
end
