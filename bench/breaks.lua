-- bench/breaks.lua -- what one graph break costs a compiled function.
-- f has one data-dependent break (an item() feeding an if).  In one run,
-- at 64 elements and at a large size, it times three ways of running f:
--   eager     the Lua function itself;
--   compiled  fl.compile(f): two segments replayed each call (the Lua
--             body runs, each op is checked against the recorded segment,
--             the compiled segment runs at the break and at the end);
--   split     the same work split by hand into two fl.compile'd
--             functions without breaks, with the item() and the if in
--             plain Lua between them: "the compiled segments plus the Lua
--             between them", the floor for compiled.
-- Rounds alternate the three (so a noisy neighbour hits all of them); each
-- round times a batch of calls.  Prints the median per-call time, the
-- spread (min-max over rounds) and the ratios of medians.
-- Targets: compiled <= 2.5x eager at 64 elements; compiled ~ split at the
-- large size.  Run: build/fuselab bench/breaks.lua [large_n] [rounds]
local fl = fl or require "fuselab"

local LARGE = tonumber(arg and arg[1]) or (1 << 20)
local ROUNDS = tonumber(arg and arg[2]) or 15

local function f(x)
  local y = (x * 2):exp()
  if y:sum():item() > 0 then return y + 1 else return y - 1 end
end

local head = fl.compile(function(x) local y = (x * 2):exp(); return y, y:sum() end)
local plus = fl.compile(function(y) return y + 1 end)
local minus = fl.compile(function(y) return y - 1 end)
local function split(x)
  local y, s = head(x)
  if s:item() > 0 then return plus(y) else return minus(y) end
end

local function median(t)
  local s = {table.unpack(t)}
  table.sort(s)
  local n = #s
  return n % 2 == 1 and s[(n + 1) // 2] or (s[n // 2] + s[n // 2 + 1]) / 2
end

local function batch(fn, x, n)
  local t0 = fl.now()
  for _ = 1, n do fn(x) end
  return (fl.now() - t0) / n
end

local function run(n, calls)
  local x = fl.randn(n)
  local cm = fl.compile(f)
  local ways = {{"eager", f}, {"compiled", cm}, {"split", split}}
  for _, w in ipairs(ways) do
    assert(fl.allclose(w[2](x), f(x), 1e-5, 1e-5), w[1] .. " differs from eager")
    for _ = 1, math.max(3, calls // 10) do w[2](x) end    -- warm: compiles
  end
  local times = {{}, {}, {}}
  for _ = 1, ROUNDS do
    for i, w in ipairs(ways) do times[i][#times[i] + 1] = batch(w[2], x, calls) end
  end
  local s = cm:stats()
  print(("%d float32, %d rounds x %d calls (compiled: %d trace(s), %d call(s) replayed):"):format(
    n, ROUNDS, calls, s.traces, s.replays))
  local med = {}
  for i, w in ipairs(ways) do
    local t = times[i]
    med[i] = median(t)
    print(("  %-9s median %10.2f us   spread %10.2f - %10.2f us"):format(
      w[1], med[i] * 1e6, math.min(table.unpack(t)) * 1e6, math.max(table.unpack(t)) * 1e6))
  end
  print(("  compiled / eager %.2f   compiled / split %.2f"):format(med[2] / med[1], med[2] / med[3]))
end

print("one graph break (item() feeding an if): eager vs compiled vs split by hand")
run(64, 2000)
run(LARGE, math.max(3, (20 << 20) // LARGE))
