-- bench/remote_cache.lua -- what the shared compile cache on Redis saves a
-- second machine.  Starts its own redis-server on 127.0.0.1 (no
-- persistence), then per round: Redis emptied; "machine 1" (a new fuselab
-- process, an empty local cache, the remote on) makes the first call of a
-- 2-layer GPT cold: capture, generate, compile, store in Redis;
-- "machine 2" (another new process, another empty local cache) makes the
-- same first call, its kernels coming from Redis.  Each time is the
-- process's own first call (fl.compile and the call, kernels loaded),
-- not process start-up.  Prints the median of each with its spread
-- (min-max over rounds) and the ratio of medians.  Target: >= 4x.  For
-- scale, machine 2 then makes the first call once more in a new process,
-- from its local disk (where the Redis entry was put).
-- Run: build/fuselab bench/remote_cache.lua [rounds]
local fl = fl or require "fuselab"

local function first_call()
  local gpt = fl.models.transformer{vocab = 512, d = 256, heads = 4, layers = 2, seq = 64}
  local toks = {}
  for i = 1, 64 do toks[i] = (i * 37) % 512 end
  local ids = fl.tensor({toks})
  local t0 = fl.now()
  local cm = fl.compile(gpt, {backend = "cpu"})
  local out = cm(ids)
  local ms = (fl.now() - t0) * 1000
  local ci = fl.cache_info()
  local r = ci.remote or {}
  print(("MACHINE ms=%.1f compiled=%d remote_hits=%d writes=%d sum=%.6g"):format(
    ms, ci.misses, r.hits or -1, r.writes or -1, out:sum():item()))
end

if arg[1] == "--machine" then first_call() return end

local rounds = tonumber(arg[1]) or 5
local exe = arg[-1] or "fuselab"
local function sh(cmd)
  local p = assert(io.popen(cmd))
  local s = p:read("a")
  p:close()
  return s
end
local tmp = sh("mktemp -d /tmp/fl-bench-remote.XXXXXX"):gsub("%s+$", "")
local port = 20000 + math.floor(fl.now() * 1000) % 20000
local pid = sh(("redis-server --port %d --bind 127.0.0.1 --save '' --appendonly no --daemonize no " ..
  "--dir %s >%s/redis.log 2>&1 & echo $!"):format(port, tmp, tmp)):gsub("%s+$", "")
for _ = 1, 50 do
  if sh(("redis-cli -p %d ping 2>/dev/null"):format(port)):find("PONG") then break end
  os.execute("sleep 0.1")
end
local env = ("FUSELAB_REMOTE_CACHE=redis://127.0.0.1:%d FUSELAB_REMOTE_CACHE_SECRET=bench-secret"):format(port)
local function machine(name, keep)
  if not keep then os.execute(("rm -rf %s/%s"):format(tmp, name)) end
  local out = sh(("env %s FUSELAB_CACHE_DIR=%s/%s %s %s --machine 2>&1"):format(env, tmp, name, exe, arg[0]))
  local ms = tonumber(out:match("MACHINE ms=([%d.]+)"))
  if not ms then error("machine " .. name .. " failed:\n" .. out) end
  return ms, out:match("MACHINE (.-)\n")
end
local cold, warm, disk = {}, {}, {}
local ok, err = pcall(function()
  for i = 1, rounds do
    sh(("redis-cli -p %d FLUSHALL"):format(port))
    local c, cl = machine("m1")
    local w, wl = machine("m2")
    local d, dl = machine("m2", true)
    cold[i], warm[i], disk[i] = c, w, d
    print(("round %d: machine 1 %s\n         machine 2 %s\n         again     %s"):format(i, cl, wl, dl))
  end
end)
os.execute("kill " .. pid)
os.execute("rm -rf " .. tmp)
if not ok then error(err, 0) end
local function stats(t)
  local s = {}
  for i, v in ipairs(t) do s[i] = v end
  table.sort(s)
  local n = #s
  local med = n % 2 == 1 and s[(n + 1) // 2] or (s[n // 2] + s[n // 2 + 1]) / 2
  return med, s[1], s[n]
end
local cm, cmin, cmax = stats(cold)
local wm, wmin, wmax = stats(warm)
local dm, dmin, dmax = stats(disk)
print(("2-layer GPT (d=256, 4 heads, seq=64, vocab=512), first call, %d rounds:"):format(rounds))
print(("  machine 1, cold (compiles, stores in Redis)   %8.1f ms  (%.1f-%.1f)"):format(cm, cmin, cmax))
print(("  machine 2, warm from Redis (fresh local cache) %7.1f ms  (%.1f-%.1f)"):format(wm, wmin, wmax))
print(("  machine 2 again, warm from its local disk  %10.1f ms  (%.1f-%.1f)"):format(dm, dmin, dmax))
print(("  ratio of medians %.1fx (target >= 4x)%s"):format(cm / wm,
  wmax >= cmin and "  [noisy: the spreads overlap]" or ""))
