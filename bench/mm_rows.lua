-- mm_rows.lua -- products of a few rows (a classifier over two images, a
-- decoding step of a few sequences, squeeze-and-excitation's 1x1
-- convolutions over a 1x1 map): fuselab's own loop (cpu/mm_rows.c,
-- FUSELAB_MATMUL=rows; the default for linears only without AVX-512)
-- against oneDNN (FUSELAB_MATMUL=onednn), each in a fresh process, taken
-- in turns, so both see the same moment of a noisy
-- machine.  Per shape: a compiled fl.linear with its bias (se: the two
-- convolutions with their bias, relu and sigmoid), the best of 7 batches;
-- the table gives each setting's best over the rounds, oneDNN / fuselab
-- (> 1: the loop is faster), and the weights' bytes over the loop's time.
--   fuselab bench/mm_rows.lua [ROUNDS]        (default 3)
local shapes = {   -- rows, in, out; se: squeeze-and-excitation's two 1x1 convolutions over a
                   -- 1x1 map, in -> out -> in (MobileNetV3's last, EfficientNet-B0's)
  {2, 576, 1024}, {2, 1024, 1000}, {2, 1280, 1000}, {4, 768, 768}, {8, 768, 3072},
  {2, 4096, 4096}, {4, 4096, 4096}, {8, 4096, 4096},
  {2, 576, 144, se = true}, {2, 1152, 48, se = true}, {1, 576, 144, se = true},
}
local function name(s)
  return s.se and ("se %d x %d -> %d -> %d"):format(s[1], s[2], s[3], s[2]) or ("%d x %d -> %d"):format(s[1], s[2], s[3])
end

if arg[1] == "child" then
  local best_of_batches = dofile((arg[0]:match("^(.*/)") or "./") .. "stats.lua").best_of_batches
  for _, s in ipairs(shapes) do
    local M, K, N = table.unpack(s)
    local x, w, b = fl.randn(M, K), fl.randn(N, K) * 0.03, fl.randn(N)
    local f = fl.compile(function(x_) return fl.linear(x_, w, b) end)
    if s.se then
      local w1, w2, b2 = fl.randn(N, K, 1, 1) * 0.03, fl.randn(K, N, 1, 1) * 0.03, fl.randn(K)
      x = fl.randn(M, K, 1, 1)
      f = fl.compile(function(p) return fl.conv2d(fl.conv2d(p, w1, b):relu(), w2, b2):sigmoid() end)
    end
    print(("%s: %.6f"):format(name(s), best_of_batches(0.02, f, x) * 1e3))
  end
  return
end

local rounds = tonumber(arg[1]) or 3
local exe = os.getenv("FUSELAB") or arg[-1]
local modes = {{"fuselab's loop", "FUSELAB_MATMUL=rows "}, {"oneDNN", "FUSELAB_MATMUL=onednn "}}
local best = {{}, {}}
for _ = 1, rounds do
  for i, m in ipairs(modes) do
    local p = assert(io.popen(("%s%s %s child"):format(m[2], exe, arg[0])))
    for line in p:lines() do
      local key, ms = line:match("^(.-): ([%d.]+)$")
      if key then best[i][key] = math.min(best[i][key] or math.huge, tonumber(ms)) end
    end
    p:close()
  end
end
print(("%-26s %10s %10s %12s %10s"):format("rows x in -> out", "loop ms", "oneDNN ms", "oneDNN/loop", "loop GB/s"))
for _, s in ipairs(shapes) do
  local K, N = s[2], s[3]
  local a, o = best[1][name(s)], best[2][name(s)]
  if a and o then
    print(("%-26s %10.3f %10.3f %12.2f %10.1f"):format(name(s), a, o, o / a,
          (s.se and 2 or 1) * K * N * 4 / (a * 1e6)))
  end
end
print(("best of %d rounds, each a fresh process per setting, in turns"):format(rounds))
