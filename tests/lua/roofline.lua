-- roofline.lua -- the machine's peaks are measured once and cached under
-- the cache's trust rules (a damaged or foreign file is measured again, a
-- directory others can write is refused), every kernel's flops come from
-- the one cost model, k:profile() places it under the roofs, and
-- fl.draw_roofline draws the chart or says clearly why it cannot.  No
-- assertion depends on how fast this machine is: only wide bounds.
-- The cache checks run a child fuselab with its own cache directory.
local t = require "tap"

local FUSELAB = os.getenv("FUSELAB") or "fuselab"
local base = fl._mkdtemp()

local function q(s) return "'" .. tostring(s):gsub("'", "'\\''") .. "'" end

local function sh(cmd)
  local p = io.popen(cmd .. " 2>&1")
  local out = p:read("a")
  p:close()
  return out
end

local function write(path, text)
  local f = assert(io.open(path, "wb"))
  f:write(text)
  f:close()
end

local read = t.slurp

-- the .roof files in d
local function roofs(d)
  local out, files = sh("ls " .. q(d)), {}
  for k in out:gmatch("(%x+)%.roof\n") do if #k == 32 then files[#files + 1] = d .. "/" .. k .. ".roof" end end
  return files
end

local child = base .. "/peaks.lua"
write(child, [[
local p = fl.machine_peaks()
for _, k in ipairs{"copy_gbs", "product_gflops", "cpu", "threads", "from_cache", "warning",
                   "measure_s", "product_path", "noisy", "tries"} do
  print(k:upper() .. " " .. tostring(p[k]))
end
]])

-- the child with cache directory d (and more VAR=value words); its fields
local function run(d, env)
  local out = sh(("cd %s && timeout 120 env FUSELAB_CACHE_DIR=%s %s %s %s"):format(
    q(base), q(d), env or "", q(FUSELAB), q(child)))
  local r = {out = out}
  for k, v in out:gmatch("\n?([%u_]+) ([^\n]*)") do r[k] = v end
  r.copy, r.product = tonumber(r.COPY_GBS), tonumber(r.PRODUCT_GFLOPS)
  return r
end

-- ---- peaks, measured once --------------------------------------------------
local d1 = base .. "/cache1"
os.execute("mkdir -m 0700 " .. q(d1))
local r1 = run(d1, "OMP_NUM_THREADS=2")
t.is(r1.FROM_CACHE, "false", "a fresh cache: measured")
t.ok(r1.copy and r1.copy > 0.1 and r1.copy < 1e4, "bandwidth plausible (GB/s): " .. tostring(r1.COPY_GBS))
t.ok(r1.product and r1.product > 0.1 and r1.product < 1e6, "product peak plausible (GFLOP/s): " .. tostring(r1.PRODUCT_GFLOPS))
t.ok(r1.CPU and #r1.CPU > 0 and r1.THREADS == "2", "CPU and threads named: " .. tostring(r1.CPU) .. ", " .. tostring(r1.THREADS))
t.ok(tonumber(r1.MEASURE_S) and tonumber(r1.MEASURE_S) < 10, "measured within seconds: " .. tostring(r1.MEASURE_S))
local files = roofs(d1)
t.is(#files, 1, "one cache file written")
t.ok(read(files[1] or ""):find('"copy_gbs":', 1, true), "the entry holds the numbers (JSON)")

-- a quiet measurement is final; one made on a busy machine is measured
-- again by the next processes (at most 3 in all), each peak the best seen
local last, r2, runs = r1, nil, 0
repeat
  r2 = run(d1, "OMP_NUM_THREADS=2")
  runs = runs + 1
  if r2.FROM_CACHE == "false" then
    t.is(last.NOISY, "true", "measured again only after a noisy measurement (try " .. tostring(r2.TRIES) .. ")")
    t.ok(r2.copy >= last.copy * (1 - 1e-9) and r2.product >= last.product * (1 - 1e-9),
         "each peak the best of the tries")
    last = r2
  end
until r2.FROM_CACHE == "true" or runs > 3
t.is(r2.FROM_CACHE, "true", "a later process: from the cache (after " .. runs .. " run(s))")
t.near(r2.copy, last.copy, 1e-9 * last.copy, "the cached bandwidth")
t.near(r2.product, last.product, 1e-9 * last.product, "the cached product peak")
t.is(tonumber(r2.MEASURE_S), 0, "nothing measured")

-- another thread count is another machine set-up: its own entry
local r3 = run(d1, "OMP_NUM_THREADS=1")
t.is(r3.FROM_CACHE, "false", "another thread count: measured again")
t.is(r3.THREADS, "1", "with its thread count")
local all = roofs(d1)
t.is(#all, 2, "a second entry beside the first")

-- a foreign entry (the 1-thread file under the 2-thread name) is ignored
local one
for _, f in ipairs(all) do if f ~= files[1] then one = f end end
write(files[1], read(one))
local r4 = run(d1, "OMP_NUM_THREADS=2")
t.is(r4.FROM_CACHE, "false", "a foreign entry: measured again")
t.is(r4.THREADS, "2", "the foreign entry's numbers are not used")

-- a damaged entry is ignored, measured again and rewritten whole
local good = read(files[1])
write(files[1], good:sub(1, 60) .. "garbage" .. good:sub(68))
local r5 = run(d1, "OMP_NUM_THREADS=2")
t.is(r5.FROM_CACHE, "false", "a damaged entry: measured again")
local now = read(files[1])
t.ok(now:find('"copy_gbs":', 1, true) and not now:find("garbage", 1, true), "and rewritten whole")
write(files[1], "{}")
t.is(run(d1, "OMP_NUM_THREADS=2").FROM_CACHE, "false", "a truncated entry: measured again")

-- a directory others can write is refused, with a warning that says so
local open = base .. "/open"
os.execute(("mkdir %s && chmod 0777 %s"):format(q(open), q(open)))
local r7 = run(open, "OMP_NUM_THREADS=2")
t.is(r7.FROM_CACHE, "false", "untrusted directory: measured")
t.ok(r7.copy and r7.copy > 0, "untrusted directory: still a bandwidth")
t.ok(r7.WARNING and r7.WARNING:find(open, 1, true) and r7.WARNING:find("writable by others", 1, true),
     "the warning names the directory and why: " .. tostring(r7.WARNING))
t.ok(r7.out:find("fuselab: warning: cache: cannot use", 1, true), "warned on stderr")
t.is(#roofs(open), 0, "nothing written into it")

-- ---- in this process ------------------------------------------------------
local pk = fl.machine_peaks()
local pk2 = fl.machine_peaks()
t.is(pk2.from_cache, true, "second call in a process: no measurement")
t.is(pk2.copy_gbs, pk.copy_gbs, "same numbers")
t.near(pk.ridge, pk.product_gflops / pk.copy_gbs, 1e-9 * pk.ridge, "ridge = peak / bandwidth")
t.raises(function() fl.machine_peaks{frob = true} end, "machine_peaks: unknown option 'frob'", "unknown option")
t.raises(function() fl.machine_peaks(5) end, "machine_peaks: expected an options table", "not a table")
t.raises(function() fl.machine_peaks{remeasure = 1} end, "remeasure must be true or false", "remeasure type")

-- ---- flops per kernel -----------------------------------------------------
local function profiled(f, ...)
  local k = fl.capture(f, ...):fuse():codegen("cpu")
  k:profile(true)
  for _ = 1, 3 do k:run(...) end
  return k, k:profile()
end

local M, K, N = 48, 96, 32
local a, b = fl.randn(M, K), fl.randn(K, N)
local km, pm = profiled(function(a, b) return a:matmul(b) end, a, b)
t.is(#pm, 1, "matmul: one kernel")
t.is(pm[1].flops, 2 * M * N * K, "matmul: 2 M N K flops")
t.is(pm[1].bytes, (M * K + K * N + M * N) * 4, "matmul: bytes from the cost model")
t.near(pm[1].intensity, pm[1].flops / pm[1].bytes, 1e-9, "matmul: intensity = flops / bytes")
t.is(pm[1].bound, pm[1].intensity >= pk.ridge and "compute" or "memory", "matmul: bound by the ridge")
t.near(pm[1].gflops, pm[1].flops / (pm[1].ms * 1e6), 1e-6 * pm[1].gflops + 1e-12, "matmul: gflops = flops / time")
t.ok(pm[1].roof_pct > 0, "matmul: a share of its roof: " .. pm[1].roof_pct)

local R, C = 64, 80
local ke, pe = profiled(function(x) return (x * 2 + 1):relu() end, fl.randn(R, C))
t.is(#pe, 1, "elementwise chain: one kernel")
t.is(pe[1].flops, 3 * R * C, "elementwise chain: 1 flop per element per op")
t.is(pe[1].bytes, 2 * R * C * 4, "elementwise chain: read once, written once")

-- with a reduction: one flop per element it reads
local kr, pr = profiled(function(x) return (x * 3):sum(-1) end, fl.randn(R, C))
t.is(pr[1].flops, 2 * R * C, "mul then sum: 2 flops per input element")

-- large enough to stream from memory: memory-bound, near its roof
local big = fl.randn(4096, 2048)
local kb, pb = profiled(function(x) return (x * 2 + 1):relu() end, big)
t.is(pb[1].bound, "memory", "a large elementwise kernel is memory-bound")
-- (two measurements, the kernel's and the roof's, each as fast as the
-- machine was at the time: a busy machine measured 155 %; the bound
-- catches a unit slip, a factor of 10 or 100, not noise)
t.ok(pb[1].roof_pct > 0 and pb[1].roof_pct < 1000, "its share of the roof within bounds: " .. pb[1].roof_pct)
big = nil

-- ---- the picture -----------------------------------------------------------
local x = fl.randn(128, 96)
local k3 = fl.capture(function(x) return (x - x:amax(2, true)):exp() end, x):fuse{fuse = false}:codegen("cpu")
k3:profile(true)
for _ = 1, 3 do k3:run(x) end
local p3 = k3:profile()
local png, svg, dot = base .. "/r.png", base .. "/r.svg", base .. "/r.dot"
t.is(fl.draw_roofline(k3, png), png, "png: returns the path")
t.is(read(png):sub(1, 8), "\137PNG\r\n\26\n", "png: a PNG file")
fl.draw_roofline(k3, svg)
local text = read(svg)
t.ok(text:find("<svg", 1, true), "svg: an SVG file")
local missing = {}
for _, r in ipairs(p3) do if not text:find(r.name, 1, true) then missing[#missing + 1] = r.name end end
t.is(#missing, 0, "svg: every kernel's name: missing " .. table.concat(missing, ", "))
t.ok(text:find(pk.cpu, 1, true), "svg: the CPU in the title")
t.ok(text:find("GB/s", 1, true) and text:find("GFLOP/s", 1, true), "svg: both roofs labelled")
fl.draw_roofline(k3, dot)
t.ok(read(dot):find("neato -n", 1, true) and read(dot):find('pos="', 1, true), "dot: pinned positions")

local cm = fl.compile(function(x) return (x * 2):relu():sum(-1) end)
cm(x); cm(x)
local cpng = base .. "/cm.png"
t.is(fl.draw_roofline(cm, cpng), cpng, "compiled function: drawn")
t.is(read(cpng):sub(1, 4), "\137PNG", "compiled function: a PNG")

-- ---- errors ----------------------------------------------------------------
t.raises(function() fl.draw_roofline(42, base .. "/e.png") end,
         "draw_roofline: expected a compiled function %(fl.compile%) or a CPU Program", "not a program")
t.raises(function() fl.draw_roofline(fl.capture(function(x) return x + 1 end, x), base .. "/e.png") end,
         "expected a compiled function.*got fl.Graph", "a graph is not a program")
t.raises(function() fl.draw_roofline(fl.compile(function(x) return x + 1 end), base .. "/e.png") end,
         "draw_roofline: the compiled function has not run yet", "a compiled function never called")
local fresh = fl.capture(function(x) return x * 2 end, x):fuse():codegen("cpu")
t.raises(function() fl.draw_roofline(fresh, base .. "/e.png") end,
         "draw_roofline: the program has no kernel times: it was never run with profiling on", "never profiled")
fresh:run(x)
t.raises(function() fl.draw_roofline(fresh, base .. "/e.png") end, "no kernel times", "run, but not profiled")
fresh:profile(true)
t.raises(function() fl.draw_roofline(fresh, base .. "/e.png") end, "no kernel times", "profiled, but not run since")
t.raises(function() fl.draw_roofline(k3, base .. "/no/such/dir/r.png") end,
         "draw_roofline: .*no/such/dir/r%.png", "an unwritable path names itself")
t.raises(function() fl.draw_roofline(k3, base .. "/r.gif") end,
         "draw_roofline: .*unknown picture format \"%.gif\"", "an unknown format")
t.raises(function() fl.draw_roofline(k3) end, "string expected", "no path")
t.ok(not io.open(base .. "/e.png"), "no file left by a failed call")

-- ---- FUSELAB_DEBUG=2 -------------------------------------------------------
local dbg = base .. "/debug.lua"
write(dbg, "local cm = fl.compile(function(x) return (x * 2 + 1):relu() end)\n" ..
           "local x = fl.randn(64, 64)\ncm(x)\ncm(x)\n")
local out = sh(("cd %s && env FUSELAB_CACHE_DIR=%s FUSELAB_DEBUG=2 %s %s"):format(q(base), q(d1), q(FUSELAB), q(dbg)))
t.ok(out:find("GFLOP/s", 1, true) and out:find("%% of roof %(memory%)"), "FUSELAB_DEBUG=2: GFLOP/s and % of roof per kernel")

os.execute("rm -rf " .. q(base))
t.done()
