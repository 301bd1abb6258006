-- mm_rows.lua -- linears of a few rows (a classifier over two images, a
-- decoding step of a few sequences): fuselab's own loop (cpu/mm_rows.c,
-- the default) against oneDNN's product (FUSELAB_MATMUL=onednn), each in
-- a fresh process, taken in turns, so both see the same moment of a noisy
-- machine.  Per shape: a compiled fl.linear with its bias, the best of 7
-- batches; the table gives each setting's best over the rounds and
-- oneDNN / fuselab (> 1: the loop is faster), and the weight's bytes over
-- the loop's time.
--   fuselab bench/mm_rows.lua [ROUNDS]        (default 3)
local shapes = {   -- rows, in, out
  {2, 576, 1024}, {2, 1024, 1000}, {2, 1280, 1000}, {4, 768, 768}, {8, 768, 3072},
  {2, 4096, 4096}, {4, 4096, 4096}, {8, 4096, 4096},
}

if arg[1] == "child" then
  for _, s in ipairs(shapes) do
    local M, K, N = table.unpack(s)
    local x, w, b = fl.randn(M, K), fl.randn(N, K) * 0.03, fl.randn(N)
    local f = fl.compile(function(x_) return fl.linear(x_, w, b) end)
    f(x); f(x)
    local t0 = fl.now()
    f(x)
    local reps = math.floor(0.02 / math.max(fl.now() - t0, 1e-7)) + 1
    local best = math.huge
    for _ = 1, 7 do
      t0 = fl.now()
      for _ = 1, reps do f(x) end
      best = math.min(best, (fl.now() - t0) / reps)
    end
    print(("%d %d %d %.6f"):format(M, K, N, best * 1e3))
  end
  return
end

local rounds = tonumber(arg[1]) or 3
local exe = os.getenv("FUSELAB") or arg[-1]
local modes = {{"fuselab's loop", ""}, {"oneDNN", "FUSELAB_MATMUL=onednn "}}
local best = {{}, {}}
for _ = 1, rounds do
  for i, m in ipairs(modes) do
    local p = assert(io.popen(("%s%s %s child"):format(m[2], exe, arg[0])))
    for line in p:lines() do
      local M, K, N, ms = line:match("^(%d+) (%d+) (%d+) ([%d.]+)$")
      if M then
        local key = M .. " " .. K .. " " .. N
        best[i][key] = math.min(best[i][key] or math.huge, tonumber(ms))
      end
    end
    p:close()
  end
end
print(("%-18s %12s %12s %14s %10s"):format("rows x in -> out", "loop ms", "oneDNN ms", "oneDNN/loop", "loop GB/s"))
for _, s in ipairs(shapes) do
  local M, K, N = table.unpack(s)
  local key = M .. " " .. K .. " " .. N
  local a, o = best[1][key], best[2][key]
  if a and o then
    print(("%-18s %12.3f %12.3f %14.2f %10.1f"):format(("%d x %d -> %d"):format(M, K, N), a, o, o / a,
          K * N * 4 / (a * 1e6)))
  end
end
print(("best of %d rounds, each a fresh process per setting, in turns"):format(rounds))
