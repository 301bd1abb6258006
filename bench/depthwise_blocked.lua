-- depthwise_blocked.lua -- a depthwise convolution whose input comes in the
-- blocked layout (a 1x1 convolution before it writes nChw8c / nChw16c)
-- and whose result goes plain to an elementwise reader (a sigmoid and a
-- mean over the map, as EfficientNet's squeeze-and-excitation reads it);
-- the depthwise kernel's own time (k:profile) as the median of 200 calls.
--
--   fuselab bench/depthwise_blocked.lua                   cpu/conv_dw.c where timed faster (the default)
--   FUSELAB_CONV=any fuselab bench/depthwise_blocked.lua  oneDNN's blocked kernel, its result reordered
--
-- Shapes: EfficientNet-B0's and MobileNetV3's at a batch of two.
local median = dofile((arg[0]:match("^(.*/)") or "./") .. "stats.lua").median
local shapes = {{16, 56, 2, 3}, {32, 56, 1, 3}, {96, 56, 2, 3}, {144, 28, 1, 3}, {480, 7, 1, 5},
                {672, 7, 1, 5}, {1152, 4, 1, 5}, {576, 4, 1, 5}}
print(string.format("FUSELAB_CONV=%s, blocks of %d", os.getenv("FUSELAB_CONV") or "(default)",
                    fl.blas_info().conv_block or 0))
print(string.format("%-26s %10s %20s", "images x channels x map", "median us", "(range)"))
for _, s in ipairs(shapes) do
  local C, H, st, K = table.unpack(s)
  local x, w1, w = fl.randn(2, C, H, H), fl.randn(C, C, 1, 1) * 0.1, fl.randn(C, 1, K, K)
  local k = fl.capture(function(x_, w1_, w_)
    local a = fl.conv2d(x_, w1_):relu()
    return fl.conv2d(a, w_, {padding = K // 2, stride = st, groups = C}):sigmoid():mean({3, 4})
  end, x, w1, w):fuse():codegen("cpu")
  for _ = 1, 20 do k:run(x, w1, w) end
  local ts = {}
  for i = 1, 200 do
    k:profile(false)
    k:profile(true)
    k:run(x, w1, w)
    ts[i] = k:profile()[2].ms * 1e3    -- the kernel after the 1x1's: the depthwise one
  end
  local m, lo, hi = median(ts)
  print(string.format("%-26s %10.1f %20s", ("2x%dx%dx%d/%d, %dx%d"):format(C, H, H, st, K, K), m,
                      ("(%.1f-%.1f)"):format(lo, hi)))
end
