-- uninit.lua -- what skipping the zero-fill of compiled buffers saves: a
-- compiled softmax and layer_norm of [4096, 1024] float32, whose outputs
-- are fresh memory every call.  The same program runs in child processes,
-- alternating, with its buffers left as the allocator gives them (the
-- default) and with FUSELAB_POISON_UNINIT=1, which writes every byte once
-- more, as the zero-fill of calloc did.  Prints medians and ranges of the
-- per-call times and their ratio.
--   build/fuselab bench/uninit.lua [rounds]
local rounds = tonumber(arg and arg[1]) or 5
local exe = arg[-1] or "fuselab"

local child = [[
local x = fl.randn(4096, 1024)
local w, b = fl.ones(1024), fl.zeros(1024)
local fs = {softmax = function(a) return a:softmax(2) end,
            layer_norm = function(a) return a:layer_norm({1024}, w, b) end}
for _, name in ipairs{"softmax", "layer_norm"} do
  local cm = fl.compile(fs[name])
  cm(x)
  local best = math.huge
  for _ = 1, 5 do
    local t0 = fl.now()
    for _ = 1, 10 do cm(x) end
    best = math.min(best, (fl.now() - t0) / 10)
  end
  print(name, best * 1e3)
end
]]

local function run(poison)
  local p = assert(io.popen(("FUSELAB_POISON_UNINIT=%d %s -e %q"):format(poison, exe, child)))
  local out = {}
  for line in p:lines() do
    local name, ms = line:match("^(%S+)%s+(%S+)$")
    if name then out[name] = tonumber(ms) end
  end
  p:close()
  return out
end

local median = dofile((arg and arg[0] or ""):match("^(.-)[^/]*$") .. "stats.lua").median

local times = {softmax = {[0] = {}, [1] = {}}, layer_norm = {[0] = {}, [1] = {}}}
for _ = 1, rounds do
  for _, poison in ipairs{0, 1} do
    for name, ms in pairs(run(poison)) do table.insert(times[name][poison], ms) end
  end
end
print(("compiled [4096, 1024] float32, best of 5 x 10 calls per process, %d alternating rounds:"):format(rounds))
for _, name in ipairs{"softmax", "layer_norm"} do
  local m0, lo0, hi0 = median(times[name][0])
  local m1, lo1, hi1 = median(times[name][1])
  print(("  %-10s  no fill %.3f ms (%.3f-%.3f)   filled %.3f ms (%.3f-%.3f)   saves %.2fx"):format(
    name, m0, lo0, hi0, m1, lo1, hi1, m1 / m0))
end
