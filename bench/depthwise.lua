-- depthwise.lua -- a depthwise convolution and its epilogue, one compiled
-- program per shape, the kernel's own time (k:profile) as the median of
-- 200 calls; what runs it depends on FUSELAB_CONV:
--
--   fuselab bench/depthwise.lua [blocked]                    cpu/conv_dw.c where timed faster (the default)
--   FUSELAB_CONV=any fuselab bench/depthwise.lua [blocked]   oneDNN's blocked kernel, reorders in and out
--   FUSELAB_CONV=plain fuselab bench/depthwise.lua           oneDNN on the plain layout
--
-- Plain: the convolution and its relu, each call writing a fresh output
-- (the program's result), the same for every setting; ShuffleNet's,
-- MobileNetV3's shapes and a large map.  blocked: its input a 1x1
-- convolution's result in the blocked layout (nChw8c / nChw16c), its
-- result read plain by a sigmoid and a mean over the map, as
-- EfficientNet's squeeze-and-excitation reads it; EfficientNet-B0's and
-- MobileNetV3's shapes at a batch of two.
local median = dofile((arg[0]:match("^(.*/)") or "./") .. "stats.lua").median
local blocked = arg[1] == "blocked"
local shapes = blocked and {{16, 56, 2, 3}, {32, 56, 1, 3}, {96, 56, 2, 3}, {144, 28, 1, 3}, {480, 7, 1, 5},
                            {672, 7, 1, 5}, {1152, 4, 1, 5}, {576, 4, 1, 5}}
                        or {{136, 28, 1, 3}, {112, 56, 2, 3}, {544, 7, 1, 3}, {576, 14, 1, 3}, {240, 7, 1, 5},
                            {96, 112, 1, 3}}
local N = blocked and 2 or 1
print(string.format("FUSELAB_CONV=%s, %s%s", os.getenv("FUSELAB_CONV") or "(default)", fl.blas_info().conv,
                    blocked and (", blocks of " .. (fl.blas_info().conv_block or 0)) or ""))
print(string.format("%-26s %10s %20s", "images x channels x map, k", "median us", "(range)"))
for _, s in ipairs(shapes) do
  local C, H, st, K = s[1], s[2], s[3], s[4]
  local x, w, b = fl.randn(N, C, H, H), fl.randn(C, 1, K, K), fl.randn(C)
  local opts = {padding = K // 2, stride = st, groups = C}
  local f, args, at = function(x_, w_, b_) return fl.conv2d(x_, w_, b_, opts):relu() end, {x, w, b}, 1
  if blocked then   -- the depthwise kernel comes after the 1x1's
    f = function(x_, w_, w1_) return fl.conv2d(fl.conv2d(x_, w1_):relu(), w_, opts):sigmoid():mean({3, 4}) end
    args, at = {x, w, fl.randn(C, C, 1, 1) * 0.1}, 2
  end
  local k = fl.capture(f, table.unpack(args)):fuse():codegen("cpu")
  for _ = 1, 20 do k:run(table.unpack(args)) end
  local ts = {}
  for i = 1, 200 do
    k:profile(false)
    k:profile(true)
    k:run(table.unpack(args))
    ts[i] = k:profile()[at].ms * 1e3
  end
  local m, lo, hi = median(ts)
  print(string.format("%-26s %10.1f %20s", ("%dx%dx%dx%d/%d, %dx%d"):format(N, C, H, H, st, K, K), m,
                      ("(%.1f-%.1f)"):format(lo, hi)))
end
