-- memory.lua -- tensor memory is known to Lua's collector (DESIGN §5): a
-- loop over a compiled model, a compiled program (k:run) or a graph (g:run)
-- uses about what the same loop run eagerly uses.  Each loop runs in its
-- own process, so its peak resident size (VmHWM) is its own; the plain
-- build also runs them under `ulimit -v` (3 GB), where outputs the
-- collector cannot see (100 x 40 MB) would run out of memory.
local fl = fl or require "fuselab"
local t = require "tap"

local exe = os.getenv("FUSELAB") or arg[-1]
local asan = os.getenv("FUSELAB_ASAN") == "1"
local dir = t.tmpdir()
local script = dir .. "/loop.lua"
local f = assert(io.open(script, "w"))
f:write([[
local mode = arg[1]
local x = fl.randn(1000, 10000)              -- 40 MB in, 40 MB out per call
local body = function(a) return a * 2 + 1 end
local run
if mode == "eager" then run = body
elseif mode == "compiled" then run = fl.compile(body)
else
  local g = fl.capture(body, x)
  local k = g:decompose():fuse():codegen("cpu")
  run = mode == "graph" and function(a) return g:run(a) end or function(a) return k:run(a) end
end
for _ = 1, 100 do local y = run(x) end
local hwm = io.open("/proc/self/status"):read("a"):match("VmHWM:%s*(%d+)")
print("peak_mb " .. math.floor(tonumber(hwm) / 1024))
]])
f:close()

local function peak(mode)
  local limit = asan and "" or "ulimit -v 3000000; "
  local p = io.popen(limit .. "'" .. exe .. "' '" .. script .. "' " .. mode .. " 2>&1")
  local out = p:read("a")
  p:close()
  return tonumber(out:match("peak_mb (%d+)")), out
end

local eager, out = peak("eager")
t.ok(eager ~= nil, "eager loop finishes" .. (eager and "" or (": " .. out)))
for _, mode in ipairs{"compiled", "k", "graph"} do
  local mb, why = peak(mode)
  t.ok(mb ~= nil, mode .. ": 100 calls with 40 MB outputs finish" ..
       (asan and "" or " under a 3 GB limit") .. (mb and "" or (": " .. why:sub(1, 300))))
  if mb and eager then
    t.ok(mb <= eager * 1.5 + 100, ("%s: peak %d MB, eager %d MB"):format(mode, mb, eager))
  else
    t.ok(false, mode .. ": peak compared with eager")
  end
end
t.done()
