-- compile_debug.lua -- FUSELAB_COMPILE_DEBUG=DIR (DESIGN §4, like
-- TORCH_COMPILE_DEBUG): per compiled graph a folder with the graph, the IR
-- after each pass, the plan with its decisions, the host program and the
-- kernels, the timings and the review report.  DIR is made mode 0700; a
-- DIR another user can write, or owned by another user, is refused with a
-- warning (the compile cache's check).  Runs as root in CI: root passes
-- every permission check of the file system, so the refusals tested here
-- are fuselab's own checks (mode bits, owner), not the kernel's.
local t = require "tap"

local exe = os.getenv("FUSELAB") or arg[-1]
local base = fl._mkdtemp()

local function sh(s) return "'" .. s:gsub("'", "'\\''") .. "'" end

-- runs a two-graph function (a graph break) with FUSELAB_COMPILE_DEBUG=dir;
-- returns stderr
local function run(dir)
  local err = base .. "/err.txt"
  local code = "local cm = fl.compile(function(x) local y = (x * 2):relu(); "
    .. "local s = y:sum():item(); return (y + s):exp() end); cm(fl.randn(4, 8)); cm(fl.randn(4, 8))"
  os.execute(("FUSELAB_COMPILE_DEBUG=%s %s -e %s >/dev/null 2>%s"):format(sh(dir), sh(exe), sh(code), sh(err)))
  local f = io.open(err)
  local s = f and f:read("a") or ""
  if f then f:close() end
  return s
end

local function ls(dir)
  local out = {}
  local p = io.popen("ls -1 " .. sh(dir) .. " 2>/dev/null")
  for l in p:lines() do out[#out + 1] = l end
  p:close()
  return out
end

local function mode(path)
  local p = io.popen("stat -c %a " .. sh(path))
  local m = p:read("l")
  p:close()
  return m
end

-- ---- a new folder: made 0700, one run folder, one folder per graph
local dir = base .. "/debug"
local err = run(dir)
t.ok(not err:find("fuselab: warning", 1, true), "no warning: " .. err)
t.is(mode(dir), "700", "DIR is made mode 0700")
local runs = ls(dir)
t.is(#runs, 1, "one run folder: " .. table.concat(runs, " "))
local rundir = dir .. "/" .. (runs[1] or "")
t.ok((runs[1] or ""):find("^run_%d+_%d+_pid%d+$"), "named by time and pid: " .. tostring(runs[1]))
t.is(mode(rundir), "700", "the run folder is 0700")
local graphs = ls(rundir)
t.is(#graphs, 2, "a folder for each of the two graphs: " .. table.concat(graphs, " "))
local want = {"01_captured.txt", "02_decomposed.txt", "03_optimized.txt", "04_plan.txt",
              "05_host_program.txt", "06_kernels.c", "07_timings.txt", "08_report.html"}
for _, g in ipairs(graphs) do
  local files = ls(rundir .. "/" .. g)
  t.is(files, want, g .. " has every stage")
end
local g1 = rundir .. "/" .. (graphs[1] or "")
local function read(p) return t.slurp(p) or "" end
t.ok(read(g1 .. "/01_captured.txt"):find("mul", 1, true), "the captured graph")
t.ok(read(g1 .. "/04_plan.txt"):find("fused   %2 -> %3", 1, true), "the plan's decisions")
t.ok(read(g1 .. "/05_host_program.txt"):find("call(x: float32[4,8]):", 1, true), "the host program")
t.ok(read(g1 .. "/06_kernels.c"):find("#include", 1, true), "the kernels' whole source")
t.ok(read(g1 .. "/07_timings.txt"):find("compile %(or load%)%s+[%d.]+ ms"), "the timings of each stage")
t.ok(read(g1 .. "/08_report.html"):find("<html", 1, true), "the review report")

-- ---- refused: writable by others, owned by someone else
local open = base .. "/open"
os.execute("mkdir -m 777 " .. sh(open))
err = run(open)
t.ok(err:find("FUSELAB_COMPILE_DEBUG: .- is not safe to write to: it is writable by others"), "a 0777 DIR is refused: " .. err)
t.is(#ls(open), 0, "and nothing is written there")

local foreign = base .. "/foreign"
os.execute("mkdir -m 700 " .. sh(foreign))
local chowned = os.execute("chown nobody " .. sh(foreign) .. " 2>/dev/null")
if chowned then
  err = run(foreign)
  t.ok(err:find("is owned by uid %d+, not by you"), "a DIR owned by another user is refused: " .. err)
  t.is(#ls(foreign), 0, "and nothing is written there")
else
  t.skip("chown needs root (CI runs as root)", 2)
end

os.execute("rm -rf " .. sh(base))
t.done()
