-- pool.lua -- the pools the ImageNet networks run (batch 1), eager
-- fl.max_pool2d / fl.avg_pool2d (the same kernels a compiled graph calls
-- as extern steps): median and range of 9 timed batches of 10 calls each.
--   OMP_NUM_THREADS=2 build/fuselab bench/pool.lua
local median = dofile((arg[0]:match("^(.*/)") or "./") .. "stats.lua").median

local cases = {
  {"max 3x3/2 [1,64,111,111] (AlexNet, SqueezeNet)", {1, 64, 111, 111}, "max_pool2d", 3, {stride = 2}},
  {"max 3x3/2 ceil [1,64,112,112] (ResNet-50)", {1, 64, 112, 112}, "max_pool2d", 3,
   {stride = 2, padding = 1}},
  {"max 3x3/1 pad 1 [1,256,27,27] (Inception branch)", {1, 256, 27, 27}, "max_pool2d", 3,
   {stride = 1, padding = 1}},
  {"max 3x3/2 ceil [1,192,56,56] (Inception)", {1, 192, 56, 56}, "max_pool2d", 3,
   {stride = 2, ceil_mode = true}},
  {"avg 5x1 pad 2,0 [1,1,192,3025] (LRN's sum)", {1, 1, 192, 3025}, "avg_pool2d", {5, 1},
   {stride = 1, padding = {2, 0}}},
  {"avg 3x3/2 pad 1 [1,240,28,28] (ShuffleNet)", {1, 240, 28, 28}, "avg_pool2d", 3,
   {stride = 2, padding = 1}},
  {"max 3x3/2 pad 1 [1,24,112,112] (ShuffleNet)", {1, 24, 112, 112}, "max_pool2d", 3,
   {stride = 2, padding = 1}},
  {"avg 3x3/2 pad 1 [1,24,56,56] (ShuffleNet)", {1, 24, 56, 56}, "avg_pool2d", 3,
   {stride = 2, padding = 1}},
}

print(("%-52s %22s"):format("pool", "ms median (range)"))
for _, c in ipairs(cases) do
  local x = fl.randn(table.unpack(c[2]))
  local f = function() return x[c[3]](x, c[4], c[5]) end
  for _ = 1, 3 do f() end
  local ts = {}
  for r = 1, 9 do
    local t0 = fl.now()
    for _ = 1, 10 do f() end
    ts[r] = (fl.now() - t0) / 10 * 1e3
  end
  local m, lo, hi = median(ts)
  print(("%-52s %8.3f (%.3f-%.3f)"):format(c[1], m, lo, hi))
end
