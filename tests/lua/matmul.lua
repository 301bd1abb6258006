-- matmul.lua -- float32 products through oneDNN (cpu/mm.c) against the
-- reference interpreter, eager and compiled: batched products in one call,
-- broadcast batch dims, transposed and strided operands, float16 and
-- bfloat16 operands (converted to float32 first), linear with and without
-- bias.  Tolerance: |x - ref| <= 1e-5 + 1e-5 * sqrt(K) * (|ref| + 1), the
-- float32 rounding of a K-term sum of unit-sized products in any order,
-- plus one unit of a float16 / bfloat16 result's rounding.
-- The same cases run again with FUSELAB_MATMUL=blas (sgemm) in a child.
local fl = fl or require "fuselab"
local t = require "tap"

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

if not blas_only then
  local exe = os.getenv("FUSELAB") or arg[-1]
  local script = arg and arg[0]
  local p = assert(io.popen(("FUSELAB_MATMUL=blas %s %s 2>&1"):format(exe, script)))
  local out = p:read("a")
  p:close()
  local fails = 0
  for line in out:gmatch("[^\n]+") do if line:match("^not ok") then fails = fails + 1; t.diag(line) end end
  t.ok(out:match("\nok") and fails == 0, "the same cases on sgemm (FUSELAB_MATMUL=blas): " .. fails .. " failed")
  t.ok(out:find("FUSELAB_MATMUL=blas", 1, true) ~= nil, "and fl.blas_info().matmul says so")
end
t.done()
