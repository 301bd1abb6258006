-- packed.lua -- what keeping a weight in oneDNN's blocked layout saves
-- (cpu/mm.c, packed_b): the linears of bench/torch_compile.lua's MLP,
-- block and GPT head, compiled, two copies of each weight side by side in
-- one process, calls alternating one by one.  One weight is kept packed;
-- the other has one row rewritten in place before each of its calls
-- (outside the timing), which moves its storage's version on, so oneDNN
-- reads it in place and copies it into its layout inside the call, as it
-- would without kept copies.  Per shape: the median and quartiles of the
-- single calls of each side, and the ratio of the medians (> 1: the kept
-- copy is faster).
--   OMP_NUM_THREADS=2 build/fuselab bench/packed.lua [calls]
local calls = tonumber(arg and arg[1]) or 200
local shapes = {
  {256, 512, 2048, true}, {256, 2048, 512, true},      -- the MLP
  {1024, 256, 256, true}, {1024, 256, 1024, true}, {1024, 1024, 256, true},   -- the block
  {1024, 256, 512, false},                             -- the GPT's head, no bias
}

local function quartiles(xs)
  table.sort(xs)
  local n = #xs
  return xs[(n + 1) // 2], xs[(n + 3) // 4], xs[(3 * n + 1) // 4]
end

local cpu = io.open("/proc/cpuinfo") and io.open("/proc/cpuinfo"):read("a"):match("model name%s*: ([^\n]*)")
print(("CPU: %s; %s; %d calls a side, alternating"):format(cpu or "?", fl.blas_info().matmul, calls))
print(("%-24s %24s %24s %7s"):format("linear M x K -> N", "read in place, ms", "kept packed, ms", "ratio"))
for _, s in ipairs(shapes) do
  local M, K, N = s[1], s[2], s[3]
  local x, b = fl.randn(M, K), s[4] and fl.randn(N) or nil
  local kept = fl.randn(N, K) * (1 / math.sqrt(K))
  local moved = kept:contiguous() * 1.0
  local fk = fl.compile(function(x) return fl.linear(x, kept, b) end)
  local fm = fl.compile(function(x) return fl.linear(x, moved, b) end)
  for _ = 1, 3 do fk(x); fm(x) end
  local p0 = fl.blas_info().packed_calls
  local tk, tm = {}, {}
  for i = 1, calls do
    local t0 = fl.now()
    fk(x)
    tk[i] = fl.now() - t0
    moved[1]:copy_(kept[1])          -- the same values, a new version
    t0 = fl.now()
    fm(x)
    tm[i] = fl.now() - t0
  end
  local packed = fl.blas_info().packed_calls - p0
  assert(packed == calls, ("expected %d calls on the kept copy, got %d"):format(calls, packed))
  local m0, a0, b0 = quartiles(tm)
  local m1, a1, b1 = quartiles(tk)
  print(("%-24s %8.3f (%.3f-%.3f) %8.3f (%.3f-%.3f) %7.3f"):format(
    ("%dx%d -> %d%s"):format(M, K, N, s[4] and "" or ", no bias"),
    m0 * 1e3, a0 * 1e3, b0 * 1e3, m1 * 1e3, a1 * 1e3, b1 * 1e3, m0 / m1))
end
