-- blas.lua -- the BLAS kernel pick (cpu/blas.c): OpenBLAS's guess for a
-- CPU it does not know is emulated with OPENBLAS_CORETYPE=Prescott, as
-- Debian's 0.3.21 does on family 6 model 207; fuselab must then select the
-- kernels the CPU's feature bits allow, and products stay right.
local fl = fl or require "fuselab"
local t = require "tap"

local exe = os.getenv("FUSELAB") or arg[-1]
local flags = ""
local f = io.open("/proc/cpuinfo")
if f then flags = f:read("a"):match("\nflags%s*:%s*([^\n]*)") or ""; f:close() end
local function has(x) return (" " .. flags .. " "):find(" " .. x .. " ", 1, true) ~= nil end
local tier = (has("avx512f") and has("avx512bw") and has("avx512vl") and has("avx512dq")) and "SkylakeX"
             or (has("avx2") and has("fma")) and "Haswell" or nil

local info = fl.blas_info()
t.ok(type(info.why) == "string" and info.why ~= "", "fl.blas_info() says what was decided: " .. tostring(info.why))

local child = [[
local b = fl.blas_info()
local a, w = fl.randn(67, 45), fl.randn(45, 33)
local ok = fl.allclose(a:matmul(w), fl.capture(function(x, y) return x:matmul(y) end, a, w):run_reference(a, w), 1e-4, 1e-4)
print(b.core, b.was or "-", ok)
]]
local function run(env)
  local p = assert(io.popen(("%s %s -e %q 2>&1"):format(env, exe, child)))
  local out = p:read("a")
  p:close()
  return out:match("^(%S+)%s+(%S+)%s+(%S+)")
end

if info.config == "" then
  t.skip("the BLAS library is not OpenBLAS: " .. info.why, 3)
else
  local core, was, ok = run("OPENBLAS_CORETYPE=Prescott")
  if tier then
    t.is(core, tier, "OpenBLAS told Prescott on a CPU that runs " .. tier .. ": " .. tier .. " kernels selected")
    t.is(was, "Prescott", "and the replaced pick is reported")
  else
    t.is(core, "Prescott", "a CPU without AVX2: the generic kernels stay")
    t.is(was, "-", "nothing replaced")
  end
  t.is(ok, "true", "products match the reference after the pick")
  local kcore, kwas = run("OPENBLAS_CORETYPE=Prescott FUSELAB_BLAS_PICK=0")
  t.ok(kcore == "Prescott" and kwas == "-", "FUSELAB_BLAS_PICK=0 keeps OpenBLAS's own pick")
end

-- OMP_DYNAMIC=true: OpenBLAS's OpenMP build never returned from its first
-- product; fuselab turns dynamic teams off first, and says so.  (60 s is
-- for a hang, not for speed: the product takes milliseconds.)
do
  local p = assert(io.popen(("OMP_DYNAMIC=true timeout 60 %s -e %q 2>&1; echo rc=$?"):format(exe,
    "local a = fl.randn(64, 256):matmul(fl.randn(256, 256)); print('product', a.shape[1], a.shape[2])")))
  local out = p:read("a")
  p:close()
  t.ok(out:find("product\t64\t256", 1, false) and out:find("rc=0", 1, true), "OMP_DYNAMIC=true: the product returns: " .. out)
  t.ok(out:find("OMP_DYNAMIC is turned off", 1, true), "and a warning says dynamic teams are off")
end
t.done()
