-- grouped_blocked.lua -- ShuffleNet's last-stage unit: a depthwise 3x3
-- whose result stays in blocks of 8 channels, then a grouped 1x1 (4
-- groups of 136) with a batch norm's scale and shift, a residual and a
-- relu, then a depthwise 3x3 again; the 1x1's own time (k:profile) as the
-- median of 300 calls.  What runs the 1x1 depends on FUSELAB_CONV:
--
--   fuselab bench/grouped_blocked.lua                     the fastest at the first call
--   FUSELAB_CONV=pointwise fuselab bench/grouped_blocked.lua   cpu/conv_pw.c on the blocks
--   FUSELAB_CONV=any fuselab bench/grouped_blocked.lua         oneDNN's grouped kernel
--
-- Run the settings in turns (each a fresh process): a shared machine's
-- speed moves between minutes.
local median = dofile((arg[0]:match("^(.*/)") or "./") .. "stats.lua").median
local shapes = {{544, 7}, {544, 14}, {272, 14}, {64, 28}}
print(string.format("FUSELAB_CONV=%s, conv_block %d", os.getenv("FUSELAB_CONV") or "(default)",
                    fl.blas_info().conv_block))
print(string.format("%-30s %10s %20s %s", "channels x map, 4 groups", "median us", "(range)", "blocked"))
for _, s in ipairs(shapes) do
  local C, H = s[1], s[2]
  local x = fl.randn(1, C, H, H)
  local wd, w, wd2 = fl.randn(C, 1, 3, 3) * 0.3, fl.randn(C, C // 4, 1, 1) * 0.05, fl.randn(C, 1, 3, 3) * 0.3
  local sc, sh = fl.rand(C, 1, 1) + 0.5, fl.randn(C, 1, 1) * 0.1
  local k = fl.capture(function(x_)
    local h = fl.conv2d(x_, wd, {padding = 1, groups = C})
    local y = (fl.conv2d(h, w, {groups = 4}) * sc + sh + h):relu()
    return fl.conv2d(y, wd2, {padding = 1, groups = C})
  end, x):fuse():codegen("cpu")
  local pb0 = fl.blas_info().pointwise_blocked
  for _ = 1, 20 do k:run(x) end
  local ts, at = {}, nil
  for i = 1, 300 do
    k:profile(false)
    k:profile(true)
    k:run(x)
    local p = k:profile()
    if not at then
      for j, e in ipairs(p) do
        if e.name:find("conv2d") and e.name:find("relu") then at = j end
      end
    end
    ts[i] = p[at].ms * 1e3
  end
  local m, lo, hi = median(ts)
  print(string.format("%-30s %10.1f %20s %s", ("%d x %dx%d"):format(C, H, H), m, ("(%.1f-%.1f)"):format(lo, hi),
                      fl.blas_info().pointwise_blocked > pb0 and "yes" or "no"))
end
