-- Lesson 02: capture and guards -- what makes a graph compile again.
--
-- Claim (this lesson's; capture is the first stage of the pipeline in
-- doc/DESIGN.md's opening paragraph and §2): capture, the stage PyTorch
-- calls Dynamo, turns scattered instructions into one flow chart, as a
-- secretary turns a meeting into minutes (originally "Dynamo 捕获",
-- "像秘书整理会议记录").  A chart is only
-- valid for what it was drawn from: the input shapes, the values read
-- while drawing it, the weights it points at.  fuselab writes these
-- assumptions down as guards; a call whose guards hold runs the chart
-- without running any Lua, a call that breaks one is captured again, and
-- the reason is recorded ("x.shape[1]: expected 4, got 8").
--
-- What it measures: the guards of one function, which changes recompile
-- (shape, a global number, rebinding a weight) and which do not (new
-- values, a weight changed in place), the cost of a cached call against
-- an eager one, and the cost of each recompile; then a module's field
-- (nn.Softmax's dim) as a guard, and a weight the function itself updates
-- in place, captured into the graph.
--
-- Run: fuselab examples/lessons/02_capture_and_guards.lua   (about 2 s)

local fl = fl or require "fuselab"

fl.manual_seed(2)

-- Globals and upvalues read during capture become guards.
scale = 2.0
local W = fl.randn(16, 16)

local function layer(x)
  return (x:matmul(W) * scale):relu()
end

local cm = fl.compile(layer)
local last = {compiles = 0, recompiles = 0, cache_hits = 0}

-- Cold means cold: the compiles below run in an empty kernel cache of the
-- lesson's own, so a rehearsal leaves the class's numbers as they were
-- (and the user's cache untouched); each line says where its kernels
-- came from.
local function lesson()

-- Calls cm once and prints what happened: a cache hit, or a compile and
-- why, with the time the call took (one run: a compile happens once) and
-- where its kernels came from.
local function step(what, x)
  local c0 = fl.cache_info()
  local t0 = fl.now()
  local y = cm(x)
  local ms = (fl.now() - t0) * 1e3
  local s = cm:stats()
  local outcome
  if s.compiles > last.compiles then
    local why = s.recompiles > last.recompiles and s.recompile_reasons[#s.recompile_reasons]
    outcome = (why and ("RECOMPILED: " .. why) or "compiled (first call)")
      .. " [" .. fl.cache_origins(c0) .. "]"
  else
    outcome = "cache hit"
  end
  print(("  %-36s %8.3f ms  %s"):format(what, ms, outcome))
  last = {compiles = s.compiles, recompiles = s.recompiles, cache_hits = s.cache_hits}
  assert(fl.allclose(y, layer(x), 1e-5, 1e-6), "compiled result differs from eager")
  return ms
end

print("cm = fl.compile(layer) where layer(x) = relu(x @ W * scale)\n")
local x4 = fl.randn(4, 16)
local first_ms = step("cm(x)            x: [4,16]", x4)
step("cm(x) again", x4)
step("cm(fresh values, same shape)", fl.randn(4, 16))

print("\nThe guards the cached graph checks on every call:")
for _, g in ipairs(cm:stats().guards) do print("  " .. g) end
print()

local recompile_ms = {}
recompile_ms[#recompile_ms + 1] = step("cm(x)            x: [8,16]", fl.randn(8, 16))
scale = 3.0
recompile_ms[#recompile_ms + 1] = step("scale = 3.0 (a global), cm(x)", fl.randn(8, 16))
W:mul_(0.5)
step("W:mul_(0.5) (in place), cm(x)", fl.randn(8, 16))
W = fl.randn(16, 16)
recompile_ms[#recompile_ms + 1] = step("W = fl.randn(16,16) (rebound), cm(x)", fl.randn(8, 16))

-- The price of a hit: guard checks plus the graph, against the Lua body.
local x8 = fl.randn(8, 16)
local eager_t = fl.measure(layer, {args = {x8}, runs = 300})
local cached_t = fl.measure(cm, {args = {x8}, runs = 300})
local eager_us, cached_us = eager_t.median_ms * 1e3, cached_t.median_ms * 1e3

local s = cm:stats()
local sum = 0
for _, ms in ipairs(recompile_ms) do sum = sum + ms end
print(("\n%d calls: %d compile(s), %d recompile(s), %d cache hit(s)."):format(
  s.calls, s.compiles, s.recompiles, s.cache_hits))
print("Recompile reasons, in order:")
for i, r in ipairs(s.recompile_reasons) do print(("  %d. %s"):format(i, r)) end
print(("\nMeasured: a cached call (guards + graph) takes %.1f us against %.1f us eager (medians; %s);"):format(
  cached_us, eager_us, fl.compare_times(cached_t, eager_t, {names = {"cached", "eager"}}).text))
print(("the first call took %.1f ms and a recompile %.1f ms on average: a broken guard costs"):format(
  first_ms, sum / #recompile_ms))
print(("about %.0f cached calls.  New values and in-place weight updates cost nothing."):format(
  (sum / #recompile_ms) * 1e3 / math.max(cached_us, 1e-3)))
end

fl.with_empty_cache(lesson)

-- A module's fields are read while tracing too: each is a guard, named by
-- its path.  And a write the function makes into a weight is captured:
-- the graph ends with a write-back into the weight's storage.
print("\nA module attribute is a guard: csm = fl.compile(nn.Softmax(2))")
local sm = nn.Softmax(2)
local csm = fl.compile(sm)
local xs = fl.randn(4, 16)
csm(xs)
sm.dim = 1
assert(fl.allclose(csm(xs), sm(xs), 1e-5, 1e-6), "compiled result differs from eager")
print(("  sm.dim = 1, csm(x): RECOMPILED: %s"):format(csm:stats().recompile_reasons[1]))

local seen = fl.zeros(1, 16)                  -- a running sum the function keeps
local function tally(x)
  seen:add_(x:sum(1, true))
  return x * 2
end
local ct = fl.compile(tally)
for _ = 1, 3 do ct(fl.ones(4, 16)) end
print(("  seen:add_(x:sum(1, true)) compiled: 3 calls, seen[1][1] = %g (eager gives 12), %d compile(s), %d break(s)"):format(
  seen[1][1], ct:stats().compiles, ct:stats().graph_breaks))
for line in tostring(ct:graphs()[1]):gmatch("[^\n]+") do
  if line:find("^  write") then print("  the graph ends with: " .. line:gsub("^%s+", "")) end
end
