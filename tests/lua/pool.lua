-- pool.lua -- the float pooling kernels' paths (cpu/eager_linalg.c), each
-- against the reference interpreter, eagerly and compiled for the CPU:
--   * stride-1 max pools, run on groups of planes copied into -inf
--     borders, one flat loop per tap: kernels 1-5, dilation 1-3,
--     symmetric and asymmetric pads, planes of 1 to 40 columns, 7x7
--     planes as GoogLeNet's last pools;
--   * every other max pool, row by row (interior columns without checks);
--   * averages, summed in double POOL_BLOCK (256) columns at a time: rows
--     of 600 and 1000 columns cross the block edge;
--   * a single plane ([1, 1, C, H*W], a channel pooling as LRN decomposes
--     to), split by rows over the threads.
-- NaN is placed at corners, borders and the interior: a window holding one
-- gives NaN, and so does the reference; -inf and +inf are kept.
-- Tolerances: max pools exactly (NaN where the reference has NaN); averages
-- within 1e-6 relative + 1e-7 (double sums of at most 25 floats rounded
-- once, the order of the sum aside).
local fl = fl or require "fuselab"
local t = require "tap"

math.randomseed(20261202)
local R = math.random

local function isnan(v) return v ~= v end

-- 0 when got (a tensor) equals want elementwise within the tolerance
local function mismatches(got, want, exact)
  local a, b = got:reshape(-1):tolist(), want:reshape(-1):tolist()
  if #a ~= #b then return math.huge end
  local n = 0
  for i = 1, #a do
    local x, y = a[i], b[i]
    local ok
    if isnan(y) or isnan(x) then ok = isnan(x) and isnan(y)
    elseif exact or y == math.huge or y == -math.huge then ok = x == y
    else ok = math.abs(x - y) <= 1e-6 * math.abs(y) + 1e-7 end
    if not ok then n = n + 1 end
  end
  return n
end

-- x with NaN, +inf and -inf written at a few places (corners included)
local function spiked(shape)
  local x = fl.rand(table.unpack(shape)) * 2 - 1
  local v = x:reshape(-1):tolist()
  local n = #v
  local W = shape[4]
  local at = {1, W, n, n - W + 1}
  for _ = 1, 3 do at[#at + 1] = R(n) end
  for i, p in ipairs(at) do v[p] = ({0 / 0, 1 / 0, -1 / 0})[i % 3 + 1] end
  return fl.tensor(v):reshape(table.unpack(shape))
end

local cases = {}
local function add(what, shape, fn, exact, nan)
  cases[#cases + 1] = {what = what, x = nan and spiked(shape) or (fl.rand(table.unpack(shape)) * 2 - 1),
                       fn = fn, exact = exact}
end

-- "same" stride-1 max pools: pl + pr = (k - 1) * d keeps the width
for _, k in ipairs{1, 2, 3, 5} do
  for _, d in ipairs{1, 2, 3} do
    local span = (k - 1) * d
    local pl, pt = R(0, span), R(0, span)
    local pr, pb = span - pl, span - pt
    local H, W = R(1, 12) + span, ({1, 3, 17, 40})[R(4)] + span
    local opts = {stride = 1, padding = {pt, pl, pb, pr}, dilation = d}
    add(("same max k%d d%d pads %d,%d,%d,%d on [3,5,%d,%d]"):format(k, d, pt, pl, pb, pr, H, W),
        {3, 5, H, W}, function(a) return a:max_pool2d(k, opts) end, true, true)
  end
end
-- fewer rows than the window
add("same max k5 d1 on [2,3,3,9]", {2, 3, 3, 9},
    function(a) return a:max_pool2d(5, {stride = 1, padding = 2}) end, true, true)
-- other max pools: strides, dilation, ceil_mode
for i = 1, 8 do
  local k, s, d = {R(3), R(3)}, {R(3), R(3)}, {R(2), R(2)}
  local ek = {(k[1] - 1) * d[1] + 1, (k[2] - 1) * d[2] + 1}
  local p = {R(0, ek[1] // 2), R(0, ek[2] // 2)}
  local H, W = R(ek[1], ek[1] + 20), R(ek[2], ek[2] + 60)
  local opts = {stride = s, padding = p, dilation = d, ceil_mode = i % 2 == 0}
  add(("max k%d,%d s%d,%d d%d,%d p%d,%d%s on [2,3,%d,%d]"):format(k[1], k[2], s[1], s[2], d[1], d[2],
      p[1], p[2], opts.ceil_mode and " ceil" or "", H, W), {2, 3, H, W},
      function(a) return a:max_pool2d(k, opts) end, true, true)
end
-- averages over rows longer than one block of sums
for _, c in ipairs{{600, 1, 3, 1, false}, {1000, 2, 3, 1, true}, {600, 1, 5, 2, false}, {257, 3, 2, 0, true}} do
  local W, s, k, p, cip = c[1], c[2], c[3], c[4], c[5]
  local opts = {stride = s, padding = p, count_include_pad = cip}
  add(("avg k%d s%d p%d%s on [1,2,4,%d]"):format(k, s, p, cip and " count_include_pad" or "", W),
      {1, 2, 4, W}, function(a) return a:avg_pool2d(k, opts) end, false, false)
end
-- a single plane: rows split over the threads (max and avg)
add("avg k5x1 p2,0 on one plane [1,1,64,3025]", {1, 1, 64, 3025},
    function(a) return a:avg_pool2d({5, 1}, {stride = 1, padding = {2, 0}}) end, false, false)
add("max k3 s1 p1 on one plane [1,1,50,700]", {1, 1, 50, 700},
    function(a) return a:max_pool2d(3, {stride = 1, padding = 1}) end, true, true)
add("max k3 s1 p1 on [1,832,7,7] (GoogLeNet's)", {1, 832, 7, 7},
    function(a) return a:max_pool2d(3, {stride = 1, padding = 1}) end, true, true)
add("max k3 s2 on [1,64,111,111] (AlexNet's)", {1, 64, 111, 111},
    function(a) return a:max_pool2d(3, {stride = 2}) end, true, true)

local bad = {eager = {}, cpu = {}}
for _, c in ipairs(cases) do
  local g = fl.capture(c.fn, c.x)
  local want = g:run_reference(c.x)
  local e = mismatches(c.fn(c.x), want, c.exact)
  local k = mismatches(fl.compile(c.fn)(c.x), want, c.exact)
  if e > 0 then bad.eager[#bad.eager + 1] = ("%s: %d off"):format(c.what, e) end
  if k > 0 then bad.cpu[#bad.cpu + 1] = ("%s: %d off"):format(c.what, k) end
end
for _, s in ipairs(bad.eager) do t.diag("eager " .. s) end
for _, s in ipairs(bad.cpu) do t.diag("compiled " .. s) end
t.is(#bad.eager, 0, #cases .. " pools (NaN and infinities among the inputs): eager matches the reference")
t.is(#bad.cpu, 0, #cases .. " pools: compiled for the CPU matches the reference")

t.done()
