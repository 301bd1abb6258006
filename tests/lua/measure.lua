-- measure.lua -- fl.measure and fl.compare_times (DESIGN §4b): a time shown
-- is a median with its interquartile range, "noisy" when that range is
-- wide or other processes took CPU while it was measured, and a verdict
-- needs a margin above the noise.  The load test makes its own load (one
-- `yes`) and checks the flag, never a speed: it cannot fail on a slow
-- machine, only on a wrong flag.
local t = require "tap"

-- ---- summaries of given times: exact numbers
local m = fl.measure({5, 1, 4, 2, 3})
t.is(m.median_ms, 3, "the median of 1..5")
t.is(m.q1_ms, 2, "the first quartile")
t.is(m.q3_ms, 4, "the third quartile")
t.is(m.min_ms, 1, "the minimum")
t.is(m.max_ms, 5, "the maximum")
t.is(m.runs, 5, "five runs")
t.near(m.spread, 2 / 3, 1e-12, "spread = IQR / median")
t.is(m.noisy, true, "a spread of 67% is noisy")
t.ok(m.noise:find("spread 67%%"), "the noise says why: " .. m.noise)
t.ok(tostring(m):find("^3%.00 ms %(IQR 2%.00%-4%.00, 5 runs%) noisy"), "prints median, IQR, runs: " .. tostring(m))

local tight = fl.measure({1.00, 1.01, 0.99, 1.00, 1.02, 0.98})
t.is(tight.noisy, false, "a 2% spread of given times is not noisy")
t.is(tight.busy, false, "given times know no machine load")

-- ---- verdicts
local fast = fl.measure({1.00, 1.01, 0.99, 1.00})
local slow = fl.measure({2.00, 2.02, 1.98, 2.00})
local v = fl.compare_times(fast, slow, {names = {"compiled", "eager"}})
t.is(v.verdict, 1, "2x apart with tight spreads: a clear verdict")
t.is(v.faster, "compiled", "the faster one named")
t.near(v.ratio, 2, 1e-9, "ratio = b / a")
t.ok(v.text:find("compiled is 2.00x faster than eager", 1, true), v.text)
t.is(fl.compare_times(slow, fast).verdict, -1, "the other way round")

local near = fl.measure({1.03, 1.04, 1.02, 1.03})
local vn = fl.compare_times(fast, near, {names = {"a", "b"}})
t.is(vn.verdict, 0, "3% apart is within the 5% margin")
t.ok(vn.text:find("^no clear difference here"), vn.text)
t.is(vn.faster, nil, "no winner named")

-- a 7% difference clears 5% on quiet numbers, not 10% on noisy ones
local quiet_b = fl.measure({1.07, 1.07, 1.07, 1.07})
t.is(fl.compare_times(fast, quiet_b).verdict, 1, "7% apart, quiet: a verdict")
local noisy_a = {median_ms = 1.0, q1_ms = 0.99, q3_ms = 1.01, runs = 20, spread = 0.02, noisy = true, busy = true}
local vq = fl.compare_times(noisy_a, quiet_b)
t.is(vq.verdict, 0, "7% apart on a busy machine: no verdict")
t.near(vq.margin, 0.10, 1e-12, "the margin is doubled to 10% when noisy")

-- overlapping middle halves give no verdict whatever the medians say
local wide = fl.measure({0.5, 1.0, 2.0, 3.0, 3.5})
t.is(fl.compare_times(fast, wide).verdict, 0, "a wide IQR overlapping the other: no verdict")

-- ---- timing a function
local calls = 0
local r = fl.measure(function(a, b) calls = calls + a + b end, {args = {1, 2}, runs = 7, warmup = 2})
t.is(r.runs, 7, "seven timed runs")
t.is(calls, 27, "warm-up and timed runs all called with the args")
t.ok(r.median_ms >= 0 and r.q1_ms <= r.median_ms and r.median_ms <= r.q3_ms, "q1 <= median <= q3")
t.is(type(r.noisy), "boolean", "noisy is a flag")

t.raises(function() fl.measure(42) end, "measure: expected a function to time or a list of times", "not a function")
t.raises(function() fl.measure(print, {runs = 0}) end, "option runs must be an integer from 1", "runs 0")
t.raises(function() fl.measure(print, {rnus = 3}) end, "unknown option 'rnus'", "a misspelt option")
t.raises(function() fl.compare_times({}, fast) end, "compare_times: expected a timing", "not a timing")

-- ---- under a background CPU load: flagged, whatever the machine's speed
local pid = io.popen("yes > /dev/null 2>&1 & echo $!"):read("l")
t.ok(pid and pid:match("^%d+$"), "a background load runs (pid " .. tostring(pid) .. ")")
local ok, loaded, cr = pcall(function()
  -- a busy loop of at least half a second: /proc/stat's ticks, not the load average
  local lm = fl.measure(function() local s = 0 for i = 1, 2e5 do s = s + i end return s end,
                        {runs = 1000, budget_s = 0.5})
  -- the checklist under the same load: its result carries the flag
  local cr = fl.checklist(function(x) return (x * 2 + 1):relu() end,
                          {inputs = {fl.randn(256, 256)}, calls = 40, quiet = true})
  return lm, cr
end)
os.execute("kill " .. pid)
t.ok(ok, "measured under load: " .. tostring(ok or loaded))
if ok then
  t.is(loaded.busy, true, ("the machine is busy: others used %s of %d cores"):format(
    tostring(loaded.others or loaded.stall), loaded.cores))
  t.is(loaded.noisy, true, "so the timing is noisy: " .. loaded.noise)
  t.ok(loaded.noise:find("machine busy"), "and says why: " .. loaded.noise)
  -- the same function timed twice under load is never declared faster
  -- than itself by more than the noise allows: a verdict there would be
  -- a flip; the margin is at least 10%
  local vv = fl.compare_times(loaded, loaded)
  t.is(vv.verdict, 0, "a timing against itself: no clear difference")
  t.ok(vv.margin >= 0.10, "a noisy verdict needs 10% at least")
  -- the checklist's timings ran while `yes` took a core: flagged, with
  -- the spreads kept for scripts
  t.is(cr.noisy, true, "the checklist under load says noisy: " .. tostring(cr.noise))
  t.is(type(cr.spreads.steady), "number", "the steady state's spread")
  t.is(type(cr.spreads.eager), "number", "eager's spread")
  t.ok(cr.timing.steady.q1_ms <= cr.steady_ms and cr.steady_ms <= cr.timing.steady.q3_ms,
    "steady_ms is the median of its timing")
end

-- FUSELAB_DEBUG=2: each cached run's time beside the median of the runs before it
do
  local exe = os.getenv("FUSELAB") or arg[-1]
  local code = "local cm = fl.compile(function(x) return (x * 2):relu() end); local x = fl.randn(8, 8); "
    .. "for _ = 1, 6 do cm(x) end"
  local p = assert(io.popen(("FUSELAB_DEBUG=2 %s -e %q 2>&1"):format(exe, code)))
  local out = p:read("a")
  p:close()
  t.ok(out:find("ms %(this run%)"), "FUSELAB_DEBUG=2 labels a run's own time")
  t.ok(out:find("earlier runs: median [%d.]+ ms %(IQR [%d.]+%-[%d.]+, %d+ runs%)"),
    "and gives the earlier runs' median with its IQR: " .. (out:match("[^\n]*earlier runs[^\n]*") or out))
end

-- the fuselab binary (which runs this test) chooses how OpenMP's idle
-- threads wait unless the user did (repl/main.c): a short spin on a quiet
-- machine, sleeping at once on a busy one, and says which and why
do
  local pol, spin = os.getenv("OMP_WAIT_POLICY"), os.getenv("GOMP_SPINCOUNT")
  t.ok(pol ~= nil or spin ~= nil, "a wait policy is set: " .. tostring(pol) .. " " .. tostring(spin))
  local exe = os.getenv("FUSELAB") or arg[-1]
  local function child(env)
    local p = assert(io.popen(("env -u OMP_WAIT_POLICY -u GOMP_SPINCOUNT -u FUSELAB_OMP_WAIT %s %s -e %q 2>&1"):format(
      env, exe, 'print(os.getenv("OMP_WAIT_POLICY"), os.getenv("GOMP_SPINCOUNT")); print(fl.blas_info().threads)')))
    local out = p:read("a")
    p:close()
    return out
  end
  for _ = 1, 3 do
    local out = child("")
    local p2, s2, why = out:match("^(%S+)\t(%S+)\n([^\n]*)")
    local used = why and tonumber(why:match("other processes used ([%d.]+) cores"))
    t.ok(used ~= nil, "the choice names the load it saw: " .. out)
    if used then
      -- the verdict is taken from the load before it is rounded to two
      -- places: at a printed 0.50 either verdict is right
      local busy = why:find("machine busy at start") ~= nil
      t.ok(busy and used >= 0.495 or not busy and used <= 0.505,
        "busy means half a core or more (" .. used .. " cores): " .. why)
      t.ok(p2 == (busy and "passive" or "nil") and s2 == (busy and "nil" or "10000"),
        "the variables follow the load (" .. used .. " cores): " .. p2 .. " " .. s2)
      t.ok(why:find(busy and "^OMP_WAIT_POLICY=passive: idle threads sleep at once; machine busy at start"
                         or "^GOMP_SPINCOUNT=10000: idle threads spin briefly, then sleep; machine quiet at start"),
        "blas_info().threads says which and why: " .. why)
    end
  end
  -- a process that takes a whole core makes the machine busy
  local p = assert(io.popen(("sh -c 'yes > /dev/null & y=$!; sleep 0.3; %s %s -e %q; kill $y' 2>&1"):format(
    "env -u OMP_WAIT_POLICY -u GOMP_SPINCOUNT -u FUSELAB_OMP_WAIT", exe, "print(fl.blas_info().threads)")))
  local out = p:read("a")
  p:close()
  t.ok(out:find("^OMP_WAIT_POLICY=passive: idle threads sleep at once; machine busy at start %(other processes used [%d.]+ cores%)"),
    "beside a busy loop the binary sleeps its idle threads: " .. out)
  out = child("OMP_WAIT_POLICY=active")
  t.ok(out == "active\tnil\nOMP_WAIT_POLICY=active: set by you\n", "the user's own policy is kept: " .. out)
  out = child("GOMP_SPINCOUNT=500 FUSELAB_OMP_WAIT='GOMP_SPINCOUNT=10000: stale'")
  t.ok(out == "nil\t500\nGOMP_SPINCOUNT=500: set by you\n", "a stale reason is not shown: " .. out)
  -- the generated loops start threads from 8192 elements where idle ones
  -- spin, from 32768 where they sleep (cpu/codegen.c, cpu_par_min): a
  -- value the loader writes into the library, not its source, so the
  -- second process (the other policy, the same cache directory) loads the
  -- first one's build from disk, and both give the same answer
  local dir = os.tmpname()
  os.remove(dir)
  local prog = 'local x = fl.arange(24000):reshape(2, 12000) / 7000; '
    .. 'local cm = fl.compile(function(a) return (a:sin() * 2):relu():sum(1) end, {backend = "cpu"}); '
    .. 'local y = cm(x); print(fl.blas_info().par_min, cm:stats().disk_cache_hits, '
    .. 'cm:code{preamble = true}:find("int64_t fl_par_min = 32768;", 1, true) ~= nil, '
    .. '(y - (x:sin() * 2):relu():sum(1)):abs():amax():item())'
  local function par(env)
    local p = assert(io.popen(("env -u OMP_WAIT_POLICY -u GOMP_SPINCOUNT -u FUSELAB_OMP_WAIT FUSELAB_CACHE_DIR=%s %s %s -e %q 2>&1")
      :format(dir, env, exe, prog)))
    local o = p:read("a")
    p:close()
    return o
  end
  local spin, sleep = par("GOMP_SPINCOUNT=10000"), par("OMP_WAIT_POLICY=passive")
  local ns, hs, ps, es = spin:match("^(%d+)\t(%d+)\t(%a+)\t(%S+)\n$")
  local np, hp, pp, ep = sleep:match("^(%d+)\t(%d+)\t(%a+)\t(%S+)\n$")
  t.ok(ns == "8192" and np == "32768", "a generated loop's threshold follows the wait policy: spin " .. spin ..
       ", sleep " .. sleep)
  t.ok(ps == "true" and pp == "true" and hs == "0" and tonumber(hp or "") and tonumber(hp) >= 1,
       "from the library, not its source: the second process loaded the first one's build (disk hits " ..
       tostring(hs) .. ", " .. tostring(hp) .. ")")
  t.ok(tonumber(es) and tonumber(es) < 1e-3 and tonumber(ep) and tonumber(ep) < 1e-3,
       "and both agree with eager: " .. tostring(es) .. " " .. tostring(ep))
  os.execute("rm -rf '" .. dir .. "'")
end

-- the break-even count: one definition (the checklist's and the report's)
t.is(fl._break_even(10, 2, 1), 9, "cold 10 ms, eager 2, steady 1: 9 calls (1 cold + 8 steady = 18 ms = 9 eager)")
t.is(fl._break_even(1.5, 2, 1), 1, "a cold call no slower than eager pays at once")
t.is(fl._break_even(10, 1, 1), nil, "no faster: never")

-- one clock: meas_now (exec/measure.c) is the only reader of the monotonic
-- clock among the sources the binary and its benches link
do
  local src = os.getenv("FUSELAB_SRC") or "."
  local p = io.popen("cd '" .. src .. "' && grep -l 'CLOCK_MONOTONIC' " ..
                     "graph/*.c cpu/*.c gpu/*.c fuse/*.c exec/*.c io/*.c scripting/*.c " ..
                     "bench/eager.c bench/fusion.c bench/transcendental.c bench/gpu.c 2>/dev/null")
  local files = p:read("a")
  p:close()
  t.is(files, "exec/measure.c\n", "one clock: only exec/measure.c reads CLOCK_MONOTONIC")
end

t.done()
