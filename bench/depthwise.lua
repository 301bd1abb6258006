-- depthwise.lua -- a depthwise convolution and its relu, one compiled
-- program per shape, the kernel's own time (k:profile) as the median of
-- 200 calls; what runs it depends on FUSELAB_CONV:
--
--   fuselab bench/depthwise.lua                      cpu/conv_dw.c (the default)
--   FUSELAB_CONV=any fuselab bench/depthwise.lua     oneDNN's blocked kernel, reorders in and out
--   FUSELAB_CONV=plain fuselab bench/depthwise.lua   oneDNN on the plain layout
--
-- Each call also writes a fresh output (the program's result), the same
-- for every setting.  Shapes: ShuffleNet's, MobileNetV3's and a large map.
local median = dofile((arg[0]:match("^(.*/)") or "./") .. "stats.lua").median
local shapes = {{136, 28, 1, 3}, {112, 56, 2, 3}, {544, 7, 1, 3}, {576, 14, 1, 3}, {240, 7, 1, 5},
                {96, 112, 1, 3}}
print(string.format("FUSELAB_CONV=%s, %s", os.getenv("FUSELAB_CONV") or "(default)", fl.blas_info().conv))
print(string.format("%-22s %10s %20s", "channels x map, k", "median us", "(range)"))
for _, s in ipairs(shapes) do
  local C, H, st, K = s[1], s[2], s[3], s[4]
  local x, w, b = fl.randn(1, C, H, H), fl.randn(C, 1, K, K), fl.randn(C)
  local k = fl.capture(function(x_, w_, b_)
    return fl.conv2d(x_, w_, b_, {padding = K // 2, stride = st, groups = C}):relu()
  end, x, w, b):fuse():codegen("cpu")
  for _ = 1, 20 do k:run(x, w, b) end
  local ts = {}
  for i = 1, 200 do
    k:profile(false)
    k:profile(true)
    k:run(x, w, b)
    ts[i] = k:profile()[1].ms * 1e3
  end
  local m, lo, hi = median(ts)
  print(string.format("%-22s %10.1f %20s", ("%d x %dx%d/%d, %dx%d"):format(C, H, H, st, K, K), m,
                      ("(%.1f-%.1f)"):format(lo, hi)))
end
