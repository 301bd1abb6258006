-- output_reuse.lua -- how soon a loop of compiled calls that drops each
-- output stops writing into fresh pages (scripting/lfl_tensor.c's
-- collection interval, graph/hostpool.c's kept blocks).  The loop is
-- bench/torch_compile.lua's timing loop: `out = cf(x)`, no explicit
-- collection.  Per window of 10 calls: the page faults per call (minor
-- faults from /proc/self/stat, Linux only; the mmap that populates a
-- fresh block counts its pages as faults too) and the median ms of the
-- calls.  Workloads: the MLP 512-2048-512 of bench/torch_compile.py
-- (512 KiB output) and x * 2 + 1 over 64 KiB, 256 KiB and 1 MiB.
--   OMP_NUM_THREADS=2 build/fuselab bench/output_reuse.lua [windows]
local median = dofile((arg[0]:match("^(.*/)") or "./") .. "stats.lua").median
local windows = tonumber(arg and arg[1]) or 10

local function minflt()
  local f = io.open("/proc/self/stat")
  if not f then return nil end
  local l = f:read("a")
  f:close()
  -- field 10, after "pid (comm) state" and six more
  return tonumber(l:match("^%d+ %b() %S+ " .. ("%S+ "):rep(6) .. "(%d+)"))
end

local w1, b1 = fl.randn(2048, 512) * 0.04, fl.randn(2048) * 0.1
local w2, b2 = fl.randn(512, 2048) * 0.02, fl.randn(512) * 0.1
local cases = {
  {"MLP 512-2048-512, batch 256", function(x) return fl.linear(fl.gelu(fl.linear(x, w1, b1)), w2, b2) end,
   {256, 512}},
}
for _, kib in ipairs{64, 256, 1024} do
  cases[#cases + 1] = {("x * 2 + 1, %d KiB"):format(kib), function(x) return x * 2.0 + 1.0 end, {kib * 256}}
end

for _, c in ipairs(cases) do
  local cf = fl.compile(c[2])
  local x = fl.randn(table.unpack(c[3]))
  local out = cf(x)
  print(c[1])
  print(("  %-10s %14s %12s"):format("calls", "faults/call", "ms median"))
  for w = 1, windows do
    local ts, f0 = {}, minflt()
    for i = 1, 10 do
      local t0 = fl.now()
      out = cf(x)
      ts[i] = (fl.now() - t0) * 1e3
    end
    local f1 = minflt()
    print(("  %4d-%-5d %14s %12.3f"):format(w * 10 - 9, w * 10,
      f0 and ("%.1f"):format((f1 - f0) / 10) or "n/a", median(ts)))
  end
  out = nil
  collectgarbage()
end
