-- matmul.lua -- float32 products through oneDNN (cpu/mm.c) against the
-- reference interpreter, eager and compiled: batched products in one call,
-- broadcast batch dims, transposed and strided operands (one weight over
-- rows taken in another order), float16 and
-- bfloat16 operands (converted to float32 first), linear with and without
-- bias.  Tolerance: |x - ref| <= 1e-5 + 1e-5 * sqrt(K) * (|ref| + 1), the
-- float32 rounding of a K-term sum of unit-sized products in any order,
-- plus one unit of a float16 / bfloat16 result's rounding.
-- The same cases run again with FUSELAB_MATMUL=blas (sgemm) and with
-- FUSELAB_MATMUL=onednn (no product on cpu/mm_rows.c) in children.
local fl = fl or require "fuselab"
local t = require "tap"
local C = require "compare"

local blas_only = os.getenv("FUSELAB_MATMUL") == "blas"
local info = fl.blas_info().matmul
t.ok(type(info) == "string" and info ~= "", "fl.blas_info().matmul says what products run on: " .. tostring(info))

-- a float16 or bfloat16 result adds one unit in the last place of its
-- own rounding (the two sides may round a tie differently)
local ulp = {float16 = 2 ^ -10, bfloat16 = 2 ^ -7}
local function close(x, ref, K)
  local tol = 1e-5 * math.sqrt(K) + (ulp[ref.dtype] or 0)
  return fl.allclose(x:to("float32"), ref:to("float32"), tol, 1e-5 + tol)
end

local function check(name, f, K, ...)
  local args = {...}
  local ref = fl.capture(f, ...):run_reference(...)
  t.ok(close(f(...), ref, K), name .. ": eager")
  local cf = fl.compile(f)
  t.ok(close(cf(...), ref, K), name .. ": compiled")
  t.ok(close(cf(table.unpack(args)), ref, K), name .. ": compiled, second call")
end

fl.manual_seed(7)
local mm = function(a, b) return a:matmul(b) end
local mmT = function(a, b) return a:matmul(b:transpose(-2, -1)) end
local shapes = {
  {{67, 45}, {45, 33}}, {{1, 5}, {5, 1}}, {{3, 1}, {1, 4}}, {{128, 64}, {64, 128}},
  {{2, 3, 17, 9}, {9, 11}},            -- batch folded into rows
  {{8, 128, 64}, {8, 64, 128}},        -- attention-sized, all heads in one call
  {{2, 4, 128, 64}, {2, 4, 64, 32}},
  {{2, 1, 5, 6}, {1, 3, 6, 7}},        -- broadcast batch dims both ways
  {{5, 6}, {4, 6, 3}},                 -- a 2-d left operand against a batch
  {{3, 2, 5, 6}, {6, 2}},
  {{7}, {7, 3}}, {{4, 7}, {7}}, {{2, 3, 7}, {7}},   -- 1-d operands
}
for _, s in ipairs(shapes) do
  local a, b = fl.randn(table.unpack(s[1])), fl.randn(table.unpack(s[2]))
  local K = s[1][#s[1]]
  check(("matmul %s @ %s"):format(table.concat(s[1], "x"), table.concat(s[2], "x")), mm, K, a, b)
end
-- transposed operands: q @ k^T as attention writes it, and a^T @ b
local q, k = fl.randn(2, 4, 128, 64), fl.randn(2, 4, 128, 64)
check("q @ k^T [2,4,128,64]", mmT, 64, q, k)
check("a^T @ b", function(a, b) return a:transpose(1, 2):matmul(b) end, 40, fl.randn(40, 30), fl.randn(40, 20))
check("a^T @ b^T, batched", function(a, b) return a:transpose(-2, -1):matmul(b:transpose(-2, -1)) end, 9,
      fl.randn(3, 9, 5), fl.randn(3, 7, 9))
-- per-head views of one [B, T, H, D] tensor: strided batch dims, no copy
check("heads as strided views", function(x, y)
  local a = x:reshape(2, 16, 4, 8):transpose(2, 3)
  local b = y:reshape(2, 16, 4, 8):transpose(2, 3)
  return a:matmul(b:transpose(-2, -1))
end, 8, fl.randn(2, 16, 32), fl.randn(2, 16, 32))
-- expanded (stride-0) batch operands
check("expanded batch operand", function(a, b) return a:expand(4, 6, 5):matmul(b) end, 5,
      fl.randn(1, 6, 5), fl.randn(4, 5, 3))
-- narrow dtypes are converted to float32 first
for _, dt in ipairs{"float16", "bfloat16"} do
  local a, b = fl.randn(3, 20, 24):to(dt), fl.randn(24, 10):to(dt)
  check("matmul " .. dt, mm, 24, a, b)
  check("linear " .. dt, function(x, w, bb) return fl.linear(x, w, bb) end, 24,
        fl.randn(6, 24):to(dt), fl.randn(12, 24):to(dt), fl.randn(12):to(dt))
end
-- linear with and without bias, 2-d and 3-d inputs, a transposed weight
local lin = function(x, w, b) return fl.linear(x, w, b) end
local lin0 = function(x, w) return fl.linear(x, w) end
for _, s in ipairs{{{64, 128}, 256}, {{5, 7, 32}, 16}, {{1, 3}, 1}, {{9, 1}, 4}} do
  local x = fl.randn(table.unpack(s[1]))
  local IN = s[1][#s[1]]
  local w, b = fl.randn(s[2], IN), fl.randn(s[2])
  check(("linear %s -> %d"):format(table.concat(s[1], "x"), s[2]), lin, IN, x, w, b)
  check(("linear %s -> %d, no bias"):format(table.concat(s[1], "x"), s[2]), lin0, IN, x, w)
end
check("linear with a transposed weight", function(x, wt, b) return fl.linear(x, wt:transpose(1, 2), b) end, 24,
      fl.randn(10, 24), fl.randn(24, 12), fl.randn(12))
-- an empty sum still writes zeros, a reused buffer included
check("K = 0", mm, 1, fl.randn(3, 0), fl.randn(0, 4))

-- Epilogues inside the library call (oneDNN post-ops, cpu/backend.c):
-- compiled against the reference; `fused` says whether the product must
-- have carried post-ops on both compiled calls (fl.blas_info().onednn_posts)
-- or must have fallen back to the generated epilogue (the product's value
-- read elsewhere, a broadcast residual, a division, too many steps, and
-- GELU's erf form, faster generated).
local function posts() return fl.blas_info().onednn_posts end
local function check_post(name, fused, f, K, ...)
  local ref = fl.capture(f, ...):run_reference(...)
  local cf = fl.compile(f)
  local p0 = posts()
  local a = cf(...)
  local b = cf(...)
  local dp = posts() - p0
  t.ok(close(a, ref, K) and close(b, ref, K), name .. ": compiled matches the reference")
  if not blas_only then
    if fused then t.ok(dp >= 2, name .. ": the epilogue ran inside the product (" .. dp .. " calls)")
    else t.is(dp, 0, name .. ": the generated epilogue ran") end
  end
end
local x, w, bb = fl.randn(12, 24), fl.randn(40, 24), fl.randn(40)
local res, res3 = fl.randn(12, 40), fl.randn(3, 12, 40)
local L = function(x, w, b) return fl.linear(x, w, b) end
for _, c in ipairs{
  {"relu", function(v) return fl.relu(v) end},
  {"gelu", function(v) return fl.gelu(v) end, false},
  {"gelu tanh", function(v) return fl.gelu(v, "tanh") end},
  {"tanh", function(v) return v:tanh() end},
  {"sigmoid", function(v) return v:sigmoid() end},
  {"silu", function(v) return fl.silu(v) end},
  {"exp", function(v) return (v * 0.1):exp() end},
  {"* c", function(v) return v * 0.125 end},
  {"+ c", function(v) return v + 3 end},
  {"- c", function(v) return v - 2 end},
  {"c - v", function(v) return 1 - v end},
  {"gelu, * c, + c", function(v) return fl.gelu(v) * 0.5 + 1 end, false},
  {"gelu tanh, * c, + c", function(v) return fl.gelu(v, "tanh") * 0.5 + 1 end},
} do
  check_post("linear then " .. c[1], c[3] ~= false, function(x, w, b) return c[2](L(x, w, b)) end, 24, x, w, bb)
end
check_post("residual + gelu(linear)", false, function(x, w, b, r) return r + fl.gelu(L(x, w, b)) end, 24, x, w, bb, res)
check_post("residual + gelu tanh(linear)", true, function(x, w, b, r) return r + fl.gelu(L(x, w, b), "tanh") end, 24,
           x, w, bb, res)
check_post("linear * gate", true, function(x, w, b, r) return L(x, w, b) * r end, 24, x, w, bb, res)
check_post("relu(linear + residual)", true, function(x, w, b, r) return fl.relu(L(x, w, b) + r) end, 24, x, w, bb, res)
check_post("no bias, relu", true, function(x, w) return fl.relu(fl.linear(x, w)) end, 24, x, w)
check_post("attention scores * scale", true, function(q, k) return q:matmul(k:transpose(-2, -1)) * 0.125 end, 64,
           fl.randn(2, 4, 32, 64), fl.randn(2, 4, 32, 64))
check_post("batched matmul + residual", true, function(a, b, r) return a:matmul(b) + r end, 9,
           fl.randn(3, 5, 9), fl.randn(3, 9, 7), fl.randn(3, 5, 7))
-- falls back: each of these must still be right
check_post("product read twice", false, function(x, w, b) local v = L(x, w, b); return fl.relu(v) + v * 2 end, 24, x, w, bb)
check_post("product also returned", false, function(x, w, b) local v = L(x, w, b); return v, fl.relu(v) end, 24, x, w, bb)
check_post("broadcast residual", false, function(x, w, b, r) return L(x, w, b) + r end, 24, x, w, bb, res3)
check_post("row-vector add", false, function(x, w, b, r) return L(x, w) + r end, 24, x, w, bb, fl.randn(40))
check_post("division", false, function(x, w, b) return L(x, w, b) / 3 end, 24, x, w, bb)
check_post("relu then five constants (one affine step)", true, function(x, w, b)
  return ((((fl.relu(L(x, w, b)) + 1) * 2) - 3) * 0.5) + 4
end, 24, x, w, bb)
-- oneDNN 2.6 gives every linear post-op the first one's constants: two
-- affine steps apart stay in the generated epilogue
check_post("affine, relu, affine", false, function(x, w, b) return fl.relu(L(x, w, b) * 0.5) + 1 end, 24, x, w, bb)
check_post("five activations", false, function(x, w, b)
  return fl.relu(fl.relu(L(x, w, b)):tanh():sigmoid():exp())
end, 24, x, w, bb)
check_post("residual then gate", true, function(x, w, b, r, g) return (L(x, w, b) + r) * g end, 24, x, w, bb, res,
           fl.randn(12, 40))
check_post("an operand computed in the epilogue", false, function(x, w, b, r) return L(x, w, b) + r * 2 end, 24,
           x, w, bb, res)
do   -- symbolic batch: one compiled graph for several sizes
  local cf = fl.compile(function(x, w, b, r) return r + fl.gelu(L(x, w, b)) end, {dynamic = true})
  for _, n in ipairs{5, 9, 16} do
    local xi, ri = fl.randn(n, 24), fl.randn(n, 40)
    local f = function(x, w, b, r) return r + fl.gelu(L(x, w, b)) end
    local ref = fl.capture(f, xi, w, bb, ri):run_reference(xi, w, bb, ri)
    t.ok(close(cf(xi, w, bb, ri), ref, 24), "dynamic batch " .. n .. ": residual + gelu(linear)")
  end
end

-- Products of a few rows (2 to 8: cpu/mm_rows.c, fuselab's own loop where
-- the weight is a linear's [N, K] rows): random row counts, widths with
-- and without a tail of 8, columns off its tiles, each with a bias or not
-- and an epilogue inside (an activation, an affine step, a residual or a
-- gate of the result's shape), eager and compiled against the reference,
-- and counted as run there; a weight laid out [K, N], a batch of two and
-- nine rows are oneDNN's.  FUSELAB_MATMUL=onednn keeps every product there;
-- with AVX-512 the default keeps those of 3 rows and more (the loop only
-- wins there on AVX2), and the child run with FUSELAB_MATMUL=rows takes
-- the loop for all.
local rows_loop = info:find("linears of 2 to 8 rows on fuselab's own loop", 1, true) ~= nil
local two_rows = info:find("linears of 2 rows and squeeze-and-excitation's 1x1s on fuselab's own loop", 1, true) ~= nil
do
  local function rows() return fl.blas_info().row_products end
  local function hsw(v) return v * (v / 6.0 + 0.5):clamp(0, 1) end
  local epis = {
    {"none", function(v) return v end},
    {"relu", function(v) return fl.relu(v) end},
    {"gelu tanh", function(v) return fl.gelu(v, "tanh") end},
    {"hardswish", hsw},
    {"silu", function(v) return fl.silu(v) end},
    {"* c + c", function(v) return v * 0.5 + 0.25 end},
    {"+ residual", function(v, r) return v + r end},
    {"* gate", function(v, r) return v * r end},
  }
  local nbad, ran, cases, wrong = 0, 0, 0, {}
  for i = 1, 32 do
    local M = 2 + (i - 1) % 7
    local K = ({1, 3, 7, 8, 9, 16, 31, 64, 100, 257})[math.random(10)]
    local N = math.random(1, 150)
    local e = epis[1 + (i - 1) % #epis]
    local bias = i % 3 ~= 0
    local x, w, b, r = fl.randn(M, K), fl.randn(N, K), fl.randn(N), fl.randn(M, N)
    local f = bias and function(x_, w_, b_, r_) return e[2](fl.linear(x_, w_, b_), r_) end
                   or function(x_, w_, b_, r_) return e[2](fl.linear(x_, w_), r_) end
    local ref = fl.capture(f, x, w, b, r):run_reference(x, w, b, r)
    local r0 = rows()
    local cf = fl.compile(f)
    local ok = close(cf(x, w, b, r), ref, K) and close(cf(x, w, b, r), ref, K) and close(f(x, w, b, r), ref, K)
    cases = cases + 1
    local on_loop = rows() - r0 >= 3
    if on_loop then ran = ran + 1 end
    if on_loop ~= (rows_loop or (two_rows and M == 2)) then wrong[#wrong + 1] = M .. " rows" end
    if not ok then
      nbad = nbad + 1
      t.diag(("%d rows, %d -> %d, %s, bias %s: max err %g"):format(M, K, N, e[1], tostring(bias),
             (cf(x, w, b, r) - ref):abs():amax():item()))
    end
  end
  t.is(nbad, 0, cases .. " linears of 2 to 8 rows with their epilogues match the reference")
  local why = os.getenv("FUSELAB_MATMUL")
  t.is(#wrong, 0, (rows_loop and "each" or two_rows and "those of 2 rows (" .. ran .. ")" or "none") ..
       " ran on cpu/mm_rows.c, eager and compiled" .. (why and ", FUSELAB_MATMUL=" .. why or "") ..
       "; the others on oneDNN (wrong: " .. table.concat(wrong, ", ") .. ")")
  -- oneDNN's: a [K, N] weight, a batch of two products, nine rows, a
  -- one-row product; and a linear over a [1, 3, K] input, whose batch dim
  -- of 1 is no batch
  local r0 = rows()
  check("3 rows, a [K, N] weight", mm, 40, fl.randn(3, 40), fl.randn(40, 21))
  check("two products of 3 rows", mmT, 40, fl.randn(2, 3, 40), fl.randn(2, 21, 40))
  check("9 rows", lin, 40, fl.randn(9, 40), fl.randn(21, 40), fl.randn(21))
  check("1 row", lin, 40, fl.randn(1, 40), fl.randn(21, 40), fl.randn(21))
  t.is(rows() - r0, 0, "none of those ran on cpu/mm_rows.c")
  r0 = rows()
  check("a linear over [1, 3, 40]", lin, 40, fl.randn(1, 3, 40), fl.randn(21, 40), fl.randn(21))
  if rows_loop then
    t.ok(rows() - r0 >= 3, "a linear over [1, 3, 40] ran on cpu/mm_rows.c")
  end
end

-- Weights kept in oneDNN's layout (cpu/mm.c, packed_b): from a weight's
-- second use on, products read a packed copy.  Every call is checked
-- against the reference with the weight's values of that moment, through
-- each way of writing a weight in place (bound by reference, DESIGN), on
-- a view of a larger tensor written through its base, and on new weights
-- that may reuse a freed one's address.
local function packed() return fl.blas_info().packed_calls end
local function gemm_kernels() return fl.blas_info().matmul:match(", gemm:") ~= nil end
local function check_calls(name, f, K, n, ...)
  local ref = fl.capture(f, ...):run_reference(...)
  local cf = fl.compile(f)
  local good = true
  for _ = 1, n do good = good and close(cf(...), ref, K) and close(f(...), ref, K) end
  t.ok(good, name .. ": " .. n .. " compiled and eager calls match the reference")
end
do
  local xp, wp, bp = fl.randn(33, 129), fl.randn(67, 129), fl.randn(67)
  local w2, w3 = fl.randn(512, 256), fl.randn(128, 256)   -- alive until the counts are read
  local p0 = packed()
  check_calls("linear 33x129 -> 67", L, 129, 3, xp, wp, bp)
  check_calls("linear 256 -> 512, no bias", function(x, w) return fl.linear(x, w) end, 256, 3,
              fl.randn(64, 256), w2)
  check_calls("gelu tanh(linear) + residual", function(x, w, b, r) return r + fl.gelu(L(x, w, b), "tanh") end,
              256, 3, fl.randn(64, 256), w3, fl.randn(128), fl.randn(64, 128))
  if not blas_only and gemm_kernels() then
    -- oneDNN's sgemm kernels (a CPU without AVX-512) read [K, N] slower
    -- than a linear's own layout: nothing is kept for them
    t.ok(packed() - p0 == 0 and fl.blas_info().packed_weights == 0,
         "gemm:jit products keep no copy of their weights (" .. (packed() - p0) .. " calls read one)")
  elseif not blas_only then
    t.ok(packed() - p0 >= 8, "weights used again read the packed copy (" .. (packed() - p0) .. " calls)")
    local bi = fl.blas_info()
    t.ok(bi.packed_weights >= 3 and bi.packed_bytes >= 4 * (67 * 129 + 512 * 256 + 128 * 256),
         ("fl.blas_info() counts the copies: %d weights, %d bytes"):format(bi.packed_weights, bi.packed_bytes))
    -- a weight's copy goes with it
    w2, w3 = nil, nil
    collectgarbage()
    local after = fl.blas_info()
    t.ok(after.packed_bytes <= bi.packed_bytes - 4 * (512 * 256 + 128 * 256),
         ("two weights freed: their copies go too (%d -> %d bytes)"):format(bi.packed_bytes, after.packed_bytes))
  end
  -- every in-place write is seen: the next call reads the new values
  local f = function(x) return fl.linear(x, wp, bp) end
  local cf = fl.compile(f)
  for _, c in ipairs{
    {"w:mul_(-1.5)", function() wp:mul_(-1.5) end},
    {"w:add_(y)", function() wp:add_(fl.randn(67, 129)) end},
    {"w:copy_(y)", function() wp:copy_(fl.randn(67, 129)) end},
    {"w:fill_(0.25)", function() wp:fill_(0.25) end},
    {"w:zero_()", function() wp:zero_() end},
    {"w[3] = y", function() wp[3] = fl.randn(129) end},
    {"w[5] = 2", function() wp[5] = 2 end},
    {"w:div_(3)", function() wp:div_(3) end},
  } do
    cf(xp); cf(xp)                     -- packed by now
    c[2]()
    local ref = fl.capture(f, xp):run_reference(xp)
    local a, b, e = cf(xp), cf(xp), f(xp)
    t.ok(close(a, ref, 129) and close(b, ref, 129) and close(e, ref, 129),
         "after " .. c[1] .. ": compiled (twice) and eager read the new weight")
  end
  -- a weight that is a view: written through the tensor it views
  local base = fl.randn(2, 67, 129)
  local wv = base[2]
  local fv = function(x) return fl.linear(x, wv, bp) end
  local cfv = fl.compile(fv)
  cfv(xp); cfv(xp)
  base:mul_(0.5)
  local ref = fl.capture(fv, xp):run_reference(xp)
  t.ok(close(cfv(xp), ref, 129) and close(cfv(xp), ref, 129), "a weight viewing another tensor: writes to that tensor are seen")
  -- new weights, some at freed weights' addresses: never another's copy
  local good = true
  for i = 1, 12 do
    local wi = fl.full({67, 129}, i * 0.01)
    local g = function(x) return fl.linear(x, wi) end
    local r = fl.capture(g, xp):run_reference(xp)
    for _ = 1, 3 do good = good and close(g(xp), r, 129) end
    wi = nil
    collectgarbage()
  end
  t.ok(good, "12 weights made and dropped in turn: each call reads its own")
  -- a weight computed inside the compiled graph (a batch norm folded into
  -- it, a scale given per call) lives in a buffer the program keeps from
  -- call to call and rewrites: each call reads that call's values
  local ws, cs = fl.randn(96, 64), fl.randn(8, 3, 3, 3)
  local gs = function(x, s) return fl.linear(x, ws * s) end
  local gc = function(x, s) return fl.conv2d(x, cs * s, nil, {padding = 1}) end
  local cgs, cgc = fl.compile(gs), fl.compile(gc)
  local xs, xc = fl.randn(20, 64), fl.randn(2, 3, 9, 9)
  good = true
  for _, v in ipairs{1, 1, 2, 2, 2, -3, 0.5, 0.5} do
    local sv, sc = fl.full({96, 1}, v), fl.full({8, 1, 1, 1}, v)
    good = good and close(cgs(xs, sv), fl.capture(gs, xs, sv):run_reference(xs, sv), 64)
           and close(cgc(xc, sc), fl.capture(gc, xc, sc):run_reference(xc, sc), 27)
  end
  t.ok(good, "weights computed in the graph, scaled anew each call: linear and conv read each call's values")
  -- one copy per weight, whatever the row count (a dynamic batch)
  local wd = fl.randn(96, 64)
  local gd = function(x) return fl.linear(x, wd) end
  local cgd = fl.compile(gd, {dynamic = true})
  local before = fl.blas_info().packed_bytes
  good = true
  for _, n in ipairs{5, 17, 33, 5, 64} do
    local xn = fl.randn(n, 64)
    local r = fl.capture(gd, xn):run_reference(xn)
    for _ = 1, 3 do good = good and close(cgd(xn), r, 64) end
  end
  local grew = fl.blas_info().packed_bytes - before
  t.ok(good, "a weight read by products of 5, 17, 33 and 64 rows: right every call")
  if not blas_only then
    t.ok(grew <= 2 * 4 * 96 * 64, ("and kept once, not once per row count (%d bytes more)"):format(grew))
  end
end
do   -- FUSELAB_PACK_MB bounds the copies; 0 turns them off
  local exe = os.getenv("FUSELAB") or arg[-1]
  local code = [[local x = fl.randn(16, 256); local ws = {}
for i = 1, 6 do ws[i] = fl.randn(512, 256) end
local ok = true
for r = 1, 3 do for i = 1, 6 do
  local y, z = fl.linear(x, ws[i]), x:matmul(ws[i]:transpose(1, 2))
  ok = ok and fl.allclose(y, z, 1e-4, 1e-4)
end end
local b = fl.blas_info()
print(("packed %d %d %d %s"):format(b.packed_calls, b.packed_weights, b.packed_bytes, tostring(ok)))]]
  local function child(env)
    local p = assert(io.popen(("%s %s -e '%s' 2>&1"):format(env, exe, code)))
    local out = p:read("a")
    p:close()
    local c, w, by, ok = out:match("packed (%d+) (%d+) (%d+) (%a+)")
    return tonumber(c), tonumber(w), tonumber(by), ok == "true", out
  end
  if not blas_only then
    local c, w, by, ok, out = child("FUSELAB_PACK_MB=1")
    t.ok(ok and c and (c > 0 or gemm_kernels()) and by <= 1048576 and w <= 2,
         ("FUSELAB_PACK_MB=1: at most 1 MiB kept (%s calls, %s weights, %s bytes), right values"):format(c, w, by))
    if not ok then t.diag(out) end
    c, w, by, ok, out = child("FUSELAB_PACK_MB=0")
    t.ok(ok and c == 0 and w == 0 and by == 0, "FUSELAB_PACK_MB=0: no copies kept, right values")
    if not ok then t.diag(out) end
  end
end

-- One weight for every batch, rows of a strided (cpu/mm.c, rows_canon):
-- [L, N, E] read from an [N, L, E] tensor, as PyTorch's multi-head
-- attention reads its input, and a 4-d permutation of the rows, with a
-- bias, a residual laid out as the result, one broadcast over a batch
-- dim, and an activation inside the call; random sizes, eager and
-- compiled against the reference.  Each runs as fewer products of more
-- rows (fl.blas_info().reordered_products counts every call); a weight of
-- one matrix per batch, or rows already in order, keeps its products.
do
  local function reordered() return fl.blas_info().reordered_products end
  local cases = {
    {"x^T @ w", function(x, w) return x:transpose(1, 2):matmul(w) end},
    {"relu(x^T @ w + b)", function(x, w, b) return fl.relu(x:transpose(1, 2):matmul(w) + b) end},
    {"x^T @ w + b + r", function(x, w, b, r) return x:transpose(1, 2):matmul(w) + b + r end},
    {"x^T @ w + a residual broadcast over the batch", function(x, w, b, r, r1)
      return x:transpose(1, 2):matmul(w) + r1 end},
  }
  local nbad, counted, calls = 0, true, 0
  for i = 1, 12 do
    local N, L, E, O = math.random(2, 4), math.random(9, 40), math.random(1, 70), math.random(1, 50)
    local c = cases[1 + (i - 1) % #cases]
    local args = {fl.randn(N, L, E), fl.randn(E, O), fl.randn(O), fl.randn(L, N, O), fl.randn(L, 1, O)}
    local ref = fl.capture(c[2], table.unpack(args)):run_reference(table.unpack(args))
    local r0 = reordered()
    local cf = fl.compile(c[2])
    local ok = close(c[2](table.unpack(args)), ref, E) and close(cf(table.unpack(args)), ref, E) and
               close(cf(table.unpack(args)), ref, E)
    calls = calls + reordered() - r0
    counted = counted and reordered() - r0 >= 2
    if not ok then
      nbad = nbad + 1
      t.diag(("%s, N %d L %d E %d O %d: max err %g"):format(c[1], N, L, E, O,
             (cf(table.unpack(args)) - ref):abs():amax():item()))
    end
  end
  t.is(nbad, 0, "12 products with a's rows [L, N] of an [N, L] tensor match the reference, eager and compiled")
  check("rows of [5, 2, 3] permuted from [2, 3, 5]", function(x, w, b)
    return x:permute(3, 1, 2, 4):matmul(w) + b end, 16, fl.randn(2, 3, 5, 16), fl.randn(16, 8), fl.randn(8))
  if not blas_only then
    t.ok(counted, "each of them took a's rows in another order, compiled twice (" .. calls .. " products)")
    local r0 = reordered()
    check("a weight per batch", function(x, w) return x:transpose(1, 2):matmul(w) end, 24,
          fl.randn(3, 20, 24), fl.randn(20, 24, 7))
    check("rows in order", function(x, w) return x:matmul(w) end, 24, fl.randn(20, 3, 24), fl.randn(24, 7))
    t.is(reordered() - r0, 0, "a weight per batch, or rows in order, keeps its products")
  end
end

-- attention putting its heads back, a @ v then [b,h,t,d] -> [b,t,h*d]:
-- compiled code writes the product in the transposed order so the reshape
-- is a view (cpu/backend.c); where the layout must stay (two readers, a
-- transpose of the last dims, sgemm) the result is the same
do
  local function merged(b, h, tq, hd)
    return function(a, v) return a:matmul(v):transpose(1, 2):reshape(b, tq, h * hd) end
  end
  for _, s in ipairs{{8, 4, 128, 64}, {2, 3, 17, 5}, {1, 1, 1, 1}, {3, 2, 33, 16}, {1, 5, 7, 3}} do
    local b, h, tq, hd = table.unpack(s)
    check(("heads merged after a @ v, %dx%dx%dx%d"):format(b, h, tq, hd), merged(b, h, tq, hd), tq,
          fl.randn(b, h, tq, tq), fl.randn(b, h, tq, hd))
  end
  local a, v = fl.randn(2, 3, 9, 9), fl.randn(2, 3, 9, 4)
  check("heads merged, the product read twice", function(x, y)
    local o = x:matmul(y)
    return o:transpose(1, 2):reshape(2, 9, 12) + o:sum()
  end, 9, a, v)
  check("last dims transposed, then reshaped", function(x, y)
    return x:matmul(y):transpose(2, 3):reshape(2, 3, 36)
  end, 9, a, v)
  check("heads merged, then a linear", function(x, y, w)
    return fl.linear(x:matmul(y):transpose(1, 2):reshape(2, 9, 12), w)
  end, 12, a, v, fl.randn(5, 12))
  -- the copy it saves: 1 MiB each call, from the host pool
  if not blas_only and os.getenv("FUSELAB_ASAN") ~= "1" then
    local w = fl.randn(4, 256)
    local cf = fl.compile(function(x, y)
      return fl.linear(x:matmul(y):transpose(1, 2):reshape(8, 128, 256), w)
    end)
    local x, y = fl.randn(8, 4, 128, 128), fl.randn(8, 4, 128, 64)
    cf(x, y); cf(x, y)
    local p0 = fl.host_pool_info()
    for _ = 1, 10 do cf(x, y) end
    local p1 = fl.host_pool_info()
    t.is(p1.reuses - p0.reuses + p1.maps - p0.maps, 0,
         "heads merged from a 1 MiB product: 10 compiled calls take no pool block (no copy)")
  end
end

if not blas_only and os.getenv("FUSELAB_MATMUL") ~= "onednn" then
  C.rerun("FUSELAB_MATMUL=blas", "sgemm", "FUSELAB_MATMUL=blas", "matmul")
  C.rerun("FUSELAB_MATMUL=onednn", "oneDNN for every product", "FUSELAB_MATMUL=onednn", "matmul")
  if not rows_loop then
    C.rerun("FUSELAB_MATMUL=rows", "linears of a few rows on cpu/mm_rows.c",
            "linears of 2 to 8 rows on fuselab's own loop", "matmul")
  end
end
t.done()
