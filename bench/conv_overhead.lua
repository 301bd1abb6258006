-- conv_overhead.lua -- what one convolution layer costs fuselab beyond the
-- arithmetic: a compiled chain of eight layers fl.conv2d(h, w, b):relu()
-- of one small shape (7x7 maps of the CNNs' last stages, where the
-- arithmetic is small and a layer's fixed costs show), per layer, against
-- oneDNN's own loop on the same convolution (bench/conv_overhead.c,
-- benchdnn's way: one primitive executed again and again on buffers
-- already in its layouts).  Inside the chain every value stays in
-- oneDNN's blocked layout; the first layer's reorder in and the last's out
-- are the chain's, shared by its eight.  Best of 7 timed batches each; run
-- in the build directory:
--   make bench/conv_overhead && OMP_NUM_THREADS=2 ./fuselab ../bench/conv_overhead.lua
local best_of_batches = dofile((arg[0]:match("^(.*/)") or "./") .. "stats.lua").best_of_batches
local p = io.popen("./bench/conv_overhead")
local floor = {}
for line in p:lines() do
  local name, ms = line:match("^(.-)\t([%d.]+)$")
  if name then floor[name] = tonumber(ms) end
end
p:close()
if not next(floor) then error("run bench/conv_overhead first (make bench/conv_overhead, in build/)") end

local L = 8
local shapes = {      -- as bench/conv_overhead.c names them: name, channels, kernel, groups, map
  {"1x1 256->256 7x7", 256, 1, 1, 7}, {"1x1 512->512 7x7", 512, 1, 1, 7},
  {"3x3 512->512 7x7", 512, 3, 1, 7}, {"3x3 dw 576 7x7", 576, 3, 576, 7},
  {"1x1 64->64 14x14", 64, 1, 1, 14},
}
print(("%-20s %12s %12s %10s %8s"):format("layer", "oneDNN ms", "fuselab ms", "extra us", "ratio"))
print(("(fuselab: a compiled chain of %d layers, per layer; %s)"):format(L, fl.blas_info().conv))
for _, s in ipairs(shapes) do
  local name, c, k, g, hw = table.unpack(s)
  local x = fl.rand(1, c, hw, hw) - 0.5
  local ws, bs = {}, {}
  for i = 1, L do ws[i], bs[i] = (fl.rand(c, c // g, k, k) - 0.5) * 0.1, fl.rand(c) - 0.5 end
  local f = fl.compile(function(h)
    for i = 1, L do h = fl.conv2d(h, ws[i], bs[i], {padding = k // 2, groups = g}):relu() end
    return h
  end)
  local ms = best_of_batches(0.05, f, x) * 1e3 / L
  print(("%-20s %12.4f %12.4f %10.1f %8.2f"):format(name, floor[name], ms, (ms - floor[name]) * 1e3,
                                                     ms / floor[name]))
end
