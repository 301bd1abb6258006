-- conv_libs.lua -- float32 conv2d (eager fl.conv2d) on ResNet- and
-- ShuffleNet-like shapes through each path, in child processes (the path
-- is read from FUSELAB_CONV once per process): im2col + OpenBLAS sgemm
-- (FUSELAB_CONV=blas), oneDNN on the plain nchw/oihw layouts
-- (FUSELAB_CONV=plain), oneDNN on its own layouts with reorders
-- (FUSELAB_CONV=any), 1x1s as one batched matmul
-- (FUSELAB_CONV=matmul; the others as the default) and the default, the
-- fastest of those per shape (measured when the shape is first seen).
-- Prints the best time of 5 rounds per shape in ms and the ratios of
-- sgemm's time to the others'.
--   build/fuselab bench/conv_libs.lua
local exe = arg[-1] or "fuselab"

local child = [[
local cases = {
  {"3x3 64->64 56x56 pad 1", {1, 64, 56, 56}, {64, 64, 3, 3}, {padding = 1}},
  {"1x1 256->64 56x56", {1, 256, 56, 56}, {64, 256, 1, 1}, {}},
  {"7x7/2 3->64 224x224 pad 3", {1, 3, 224, 224}, {64, 3, 7, 7}, {stride = 2, padding = 3}},
  {"3x3 dw 240 28x28 pad 1", {1, 240, 28, 28}, {240, 1, 3, 3}, {padding = 1, groups = 240}},
  {"1x1 g3 240->240 28x28", {1, 240, 28, 28}, {240, 80, 1, 1}, {groups = 3}},
  {"1x1 g4 136->136 28x28", {1, 136, 28, 28}, {136, 34, 1, 1}, {groups = 4}},
  {"1x1 g4 272->272 14x14", {1, 272, 14, 14}, {272, 68, 1, 1}, {groups = 4}},
}
for i, c in ipairs(cases) do
  local x, w, b = fl.randn(table.unpack(c[2])), fl.randn(table.unpack(c[3])), fl.randn(c[3][1])
  fl.conv2d(x, w, b, c[4])
  local reps = 1
  local t0 = fl.now()
  fl.conv2d(x, w, b, c[4])
  reps = math.max(1, math.floor(0.2 / math.max(fl.now() - t0, 1e-6)))
  local best = math.huge
  for _ = 1, 5 do
    t0 = fl.now()
    for _ = 1, reps do fl.conv2d(x, w, b, c[4]) end
    best = math.min(best, (fl.now() - t0) / reps)
  end
  print(i, best * 1e3)
end
print("conv", fl.blas_info().conv)
]]

local names = {"3x3 64->64 56x56 pad 1", "1x1 256->64 56x56", "7x7/2 3->64 224x224 pad 3",
               "3x3 dw 240 28x28 pad 1", "1x1 g3 240->240 28x28", "1x1 g4 136->136 28x28",
               "1x1 g4 272->272 14x14"}
local script = os.tmpname()
do
  local f = assert(io.open(script, "w"))
  f:write(child)
  f:close()
end
local function run(mode)
  local p = assert(io.popen(("FUSELAB_CONV=%s %s %s"):format(mode, exe, script)))
  local out = {}
  for line in p:lines() do
    local k, v = line:match("^(%S+)%s+(.+)$")
    if k then out[tonumber(k) or k] = tonumber(v) or v end
  end
  p:close()
  return out
end
local blas, plain, any, mm, pick = run("blas"), run("plain"), run("any"), run("matmul"), run("")
os.remove(script)
print(("%-26s %7s %7s %7s %7s %7s %6s %6s %6s %6s"):format("ms, batch 1", "sgemm", "nchw", "any", "matmul",
                                                           "picked", "x nchw", "x any", "x mm", "x pick"))
for i, n in ipairs(names) do
  print(("%-26s %7.3f %7.3f %7.3f %7.3f %7.3f %6.2f %6.2f %6.2f %6.2f"):format(n, blas[i], plain[i], any[i],
        mm[i], pick[i], blas[i] / plain[i], blas[i] / any[i], blas[i] / mm[i], blas[i] / pick[i]))
end
print("threads " .. (os.getenv("OMP_NUM_THREADS") or "default"))
