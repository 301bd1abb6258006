-- cache.lua -- the compile cache trusts nothing another user could have
-- written: untrusted directories are refused, planted entries (objects,
-- FIFOs, symlinks) are never run, followed or blocked on, cache_clear
-- removes only its own files, the size cap holds, a hanging compiler is
-- killed, and the key follows the instruction set the compiler targets.
-- Most checks run a child fuselab with its own environment.
local t = require "tap"

local FUSELAB = os.getenv("FUSELAB") or "fuselab"
local base = fl._mkdtemp()

local function q(s) return "'" .. tostring(s):gsub("'", "'\\''") .. "'" end

local function sh(cmd)
  local p = io.popen(cmd .. " 2>&1")
  local out = p:read("a")
  local ok = p:close()
  return out, ok
end

local function write(path, text)
  local f = assert(io.open(path, "w"))
  f:write(text)
  f:close()
end

local read = t.slurp

local function exists(path) return os.execute("test -e " .. q(path)) == true end
local function is_file(path) return os.execute("test -f " .. q(path) .. " -a ! -L " .. q(path)) == true end

-- the child: one compiled function, its result and what the cache saw
local child = base .. "/child.lua"
write(child, [[
local f = fl.compile(function(x) return (x * 3 + 1):sum() end)
local r = f(fl.ones(5)):item()
local ci = fl.cache_info()
print("RESULT " .. r)
print("DIR " .. tostring(ci.dir))
print("MISSES " .. tostring(ci.misses))
print("DISK " .. tostring(ci.disk_hits))
print("TIMEOUTS " .. tostring(ci.timeouts))
print("FALLBACKS " .. tostring(f:stats().fallbacks))
print("LOG " .. (f:stats().compile_log or ""):gsub("\n", " "))
print("WARNING " .. tostring(ci.warning))
]])

-- run the child with env (a string of VAR=value words); its output and fields
local function run(env, timeout)
  local out = sh(("cd %s && timeout %d env %s %s %s"):format(q(base), timeout or 120, env, q(FUSELAB), q(child)))
  local r = {out = out}
  for k, v in out:gmatch("\n?(%u+) ([^\n]*)") do r[k] = v end
  r.result = tonumber(r.RESULT)
  return r
end

local function count(s, pat)
  local n = 0
  for _ in s:gmatch(pat) do n = n + 1 end
  return n
end

-- the <key>.so files in d
local function entries(d)
  local out = sh("ls " .. q(d))
  local keys = {}
  for k in out:gmatch("(%x+)%.so\n") do if #k == 32 then keys[#keys + 1] = k end end
  return keys
end

local root = sh("id -u"):match("^0") ~= nil

-- ---- untrusted directories ------------------------------------------------
for _, case in ipairs{{"0770", "its group"}, {"0703", "others"}} do
  local d = base .. "/open" .. case[1]
  os.execute(("mkdir -p %s && chmod %s %s"):format(q(d), case[1], q(d)))
  local r = run("FUSELAB_CACHE_DIR=" .. q(d))
  t.is(r.result, 20, "mode " .. case[1] .. ": the right answer")
  t.ok(r.DIR and r.DIR ~= d and r.DIR:find("fuselab%-cache%-"), "mode " .. case[1] .. ": a private dir is used: " .. tostring(r.DIR))
  t.ok(r.WARNING and r.WARNING:find(d, 1, true) and r.WARNING:find(case[2], 1, true),
       "mode " .. case[1] .. ": cache_info().warning says why: " .. tostring(r.WARNING))
  t.is(count(r.out, "fuselab: warning: cache:"), 1, "mode " .. case[1] .. ": warned once on stderr")
  t.is(#entries(d), 0, "mode " .. case[1] .. ": nothing written there")
end

-- (root passes every permission check, so only ownership refuses here)
if root then
  local d = base .. "/nobodys"
  os.execute(("mkdir -p %s && chmod 0700 %s && chown nobody %s"):format(q(d), q(d), q(d)))
  local r = run("FUSELAB_CACHE_DIR=" .. q(d))
  t.is(r.result, 20, "owned by nobody: the right answer")
  t.ok(r.DIR and r.DIR ~= d, "owned by nobody: refused, " .. tostring(r.DIR) .. " used")
  t.ok(r.WARNING and r.WARNING:find("not by you", 1, true), "owned by nobody: " .. tostring(r.WARNING))
  t.is(#entries(d), 0, "owned by nobody: nothing written there")
  -- a symlink to a trusted dir is fine; one to nobody's dir is not
  local good, link1, link2 = base .. "/good", base .. "/link-good", base .. "/link-bad"
  os.execute(("mkdir -p %s && chmod 0700 %s && ln -s %s %s && ln -s %s %s"):format(
    q(good), q(good), q(good), q(link1), q(d), q(link2)))
  t.is(run("FUSELAB_CACHE_DIR=" .. q(link1)).DIR, good, "a symlink to a trusted dir: its target is used")
  t.ok((run("FUSELAB_CACHE_DIR=" .. q(link2)).WARNING or ""):find("target", 1, true), "a symlink to nobody's dir: refused")
else
  t.ok(true, "# SKIP chown to nobody needs root")
end

-- no HOME (cron, systemd, docker exec): never the guessable /tmp/.cache/fuselab
do
  local out = sh(("env -u HOME -u XDG_CACHE_HOME -u FUSELAB_CACHE_DIR %s -e %s"):format(
    q(FUSELAB), q("print('DIR ' .. fl.cache_info().dir)")))
  local d = out:match("DIR ([^\n]*)")
  t.ok(d and d ~= "/tmp/.cache/fuselab" and not d:find("^/tmp/%.cache"),
       "HOME unset: the password database's home or a private dir: " .. tostring(d))
end

-- ---- planted entries --------------------------------------------------------
local d = base .. "/cache"
os.execute("mkdir -m 0700 " .. q(d))
local env = "FUSELAB_CACHE_DIR=" .. q(d)
local first = run(env)
t.is(first.result, 20, "a fresh cache: the right answer")
local key = entries(d)[1]
t.ok(key, "the entry is named by its key: " .. tostring(key))
key = key or ("0"):rep(32)
local so = d .. "/" .. key .. ".so"

-- an object whose constructor writes a marker, with the right key inside
do
  local marker, src = base .. "/marker", base .. "/evil.c"
  write(src, ([[
#include <stdio.h>
const char fl_cache_key[] = "%s";
__attribute__((constructor)) static void planted(void) {
  FILE *f = fopen("%s", "w");
  if (f) { fputs("ran", f); fclose(f); }
}
]]):format(key, marker))
  local out, ok = sh(("cc -shared -fPIC -o %s %s"):format(q(so), q(src)))
  t.ok(ok, "a planted object is built " .. out)
  local r = run(env)
  t.is(r.result, 20, "planted object: the right answer")
  t.ok(not exists(marker), "planted object: its constructor never ran")
  t.is(r.MISSES, "1", "planted object: rebuilt")
end

-- a FIFO at the entry's path: no reader blocks on it
do
  os.execute(("rm -f %s && mkfifo %s"):format(q(so), q(so)))
  local t0 = fl.now()
  local r = run(env, 60)
  t.is(r.result, 20, "FIFO at the entry: the right answer, no hang")
  t.ok(is_file(so), "FIFO at the entry: replaced by the object")
  t.ok(fl.now() - t0 < 60, "FIFO at the entry: did not wait for a writer")
end

-- symlinks at the entry and at the temp names the old code used
do
  local victim = base .. "/precious"
  write(victim, "precious")
  os.execute(("rm -f %s && ln -s %s %s"):format(q(so), q(victim), q(so)))
  local r = run(env)
  t.is(r.result, 20, "symlink at the entry: the right answer")
  t.is(read(victim), "precious", "symlink at the entry: its target untouched")
  t.ok(is_file(so), "symlink at the entry: replaced by the object, not followed")
  -- the pid is the shell's, which exec hands to fuselab
  os.execute("rm -f " .. q(so))
  local plant = ""
  for _, ext in ipairs{"c", "so", "log", "o"} do
    plant = plant .. ("ln -s %s %s/tmp-%s-$$-1.%s; "):format(q(victim), q(d), key, ext)
  end
  sh(("cd %s && %s sh -c %s"):format(q(base), env,
     q(plant .. "exec " .. q(FUSELAB) .. " " .. q(child) .. " >/dev/null")))
  t.is(read(victim), "precious", "symlinks at temp names: never written through")
  os.execute(("rm -f %s/tmp-*"):format(q(d)))
end

-- a disk hit makes the entry recently used
do
  os.execute(("touch -d '2 days ago' %s"):format(q(so)))
  local r = run(env)
  t.is(r.DISK, "1", "a second process loads from disk")
  local age = tonumber((sh(("echo $(( $(date +%%s) - $(stat -c %%Y %s) ))"):format(q(so))))) or 1e9
  t.ok(age < 3600, "a disk hit touches the entry (age " .. age .. " s)")
end

-- ---- the key follows the target's instruction set ----------------------
do
  local ci = fl.cache_info()
  ci.target = ci.target or ""
  t.ok(#ci.target > 0 and not ci.target:find("native"),
       "cache_info().target is expanded: " .. tostring(ci.target):sub(1, 80))
  -- the same $CC and flags, but a compiler that targets less than the CPU
  local wrap = base .. "/cc-wrap"
  write(wrap, '#!/bin/sh\nif [ -n "$FAKE_ISA" ]; then exec cc "$@" -mno-avx; else exec cc "$@"; fi\n')
  os.execute("chmod +x " .. q(wrap))
  local d2 = base .. "/isa"
  os.execute("mkdir -m 0700 " .. q(d2))
  local e2 = "FUSELAB_CACHE_DIR=" .. q(d2) .. " CC=" .. q(wrap)
  local a = run(e2)
  local b = run(e2 .. " FAKE_ISA=1")
  if ci.target:find("^cpu%-features") then
    t.ok(true, "# SKIP the compiler does not report its target")
  else
    t.ok(a.result == 20 and b.result == 20 and b.MISSES == "1" and b.DISK == "0",
         "another instruction set: a new key, not the other host's object")
  end
end

-- ---- GCC's own option only for GCC ----------------------------------------
do
  -- GCC's answer to -### carries COLLECT_GCC_OPTIONS; a compiler that
  -- answers otherwise (Clang) must not get -fno-version-loops-for-strides
  local ci = fl.cache_info()
  local gcc = sh("cc -### -x c -c /dev/null -o /dev/null 2>&1"):find("COLLECT_GCC_OPTIONS", 1, true) ~= nil
  if gcc then
    t.ok(ci.flags:find("-fno-version-loops-for-strides", 1, true) ~= nil, "GCC gets its option: " .. ci.flags)
  else
    t.ok(true, "# SKIP cc is not GCC")
  end
  local other = base .. "/cc-other"
  write(other, '#!/bin/sh\nfor a in "$@"; do case "$a" in -###) echo "\\"-target-cpu\\" \\"x86-64\\""; exit 0;; ' ..
               '-fno-version-loops-for-strides) echo "unknown argument: $a" >&2; exit 1;; esac; done\nexec cc "$@"\n')
  os.execute("chmod +x " .. q(other))
  local d3 = base .. "/other"
  os.execute("mkdir -m 0700 " .. q(d3))
  local r = run("FUSELAB_CACHE_DIR=" .. q(d3) .. " CC=" .. q(other))
  t.ok(r.result == 20 and r.MISSES == "1" and r.FALLBACKS == "0",
       "a compiler that is not GCC compiles without GCC's option (fallbacks " .. tostring(r.FALLBACKS) .. ")")
end

-- ---- 512-bit vectors where the target has AVX-512 ---------------------------
do
  local ci = fl.cache_info()
  local wide = "-mprefer-vector-width=512"
  local has = ci.target:find("%-mavx512f") or ci.target:find("%+avx512f")
  t.is(ci.flags:find(wide, 1, true) ~= nil, has ~= nil,
       "512-bit vectors exactly when the target has AVX-512F: " .. ci.flags)
  -- what compilers answering for other targets get
  for i, c in ipairs{
    {'"-target-cpu" "skylake-avx512" "-target-feature" "+avx512f"', true, "Clang's +avx512f"},
    {'"-target-cpu" "x86-64" "-target-feature" "-avx512f"', false, "Clang's -avx512f"},
    {'cc1 -march=znver2 -mavx2 -mno-avx512f', false, "GCC's -mno-avx512f"},
    {'cc1 -march=znver4 -mavx2 -mavx512f -mavx512vl', true, "GCC's -mavx512f"},
  } do
    local cc = base .. "/cc-isa" .. i
    write(cc, "#!/bin/sh\nfor a in \"$@\"; do case \"$a\" in -###) echo '" .. c[1] .. "'; exit 0;; esac; done\nexec cc \"$@\"\n")
    os.execute("chmod +x " .. q(cc))
    local flags = sh(("CC=%s %s -e %s"):format(q(cc), q(FUSELAB), q("io.write(fl.cache_info().flags)")))
    t.is(flags:find(wide, 1, true) ~= nil, c[2], c[3] .. ": " .. flags)
  end
end

-- ---- cache_clear: only fuselab's files ------------------------------------
do
  for _, name in ipairs{"notes.c", "other.so", "README"} do write(d .. "/" .. name, "mine") end
  os.execute(("mkdir -m 0700 %s/tmp-1-abcdef %s/tmp-999999999-abcdef && touch -d '3 hours ago' %s/tmp-999999999-abcdef"):format(q(d), q(d), q(d)))
  local out = sh(("%s %s -e %s"):format(env, q(FUSELAB), q("fl.cache_clear()")))
  t.is(out, "", "cache_clear runs")
  t.ok(exists(d .. "/notes.c") and exists(d .. "/other.so") and exists(d .. "/README"),
       "cache_clear leaves other files alone")
  t.ok(not exists(so) and not exists(d .. "/" .. key .. ".c"), "cache_clear removes the entries")
  t.ok(exists(d .. "/tmp-1-abcdef"), "cache_clear leaves a live process's temp dir")
  t.ok(not exists(d .. "/tmp-999999999-abcdef"), "cache_clear removes a dead process's old temp dir")
end

-- ---- the size cap ---------------------------------------------------------
do
  local d3 = base .. "/capped"
  os.execute("mkdir -m 0700 " .. q(d3))
  -- four old entries of 300 KB (1.2 MB), the oldest first to go
  for i, age in ipairs{4, 3, 2, 1} do
    local f = ("%s/%s.so"):format(d3, (tostring(i)):rep(32))
    os.execute(("head -c 307200 /dev/zero > %s && touch -d '%d hours ago' %s"):format(q(f), age, q(f)))
  end
  write(d3 .. "/zz-foreign.bin", ("x"):rep(600000))
  local r = run("FUSELAB_CACHE_DIR=" .. q(d3) .. " FUSELAB_CACHE_MAX_MB=1")
  t.is(r.result, 20, "capped: the right answer")
  local total = tonumber((sh(("cd %s && cat [0-9a-f]*.* | wc -c"):format(q(d3))):match("%d+"))) or 1e9
  t.ok(total <= 1048576, "FUSELAB_CACHE_MAX_MB=1 keeps the entries under 1 MB: " .. total)
  t.ok(not exists(d3 .. "/" .. ("1"):rep(32) .. ".so"), "the least recently used went first")
  t.ok(exists(d3 .. "/" .. ("4"):rep(32) .. ".so"), "the most recent old entry stays")
  t.is(#entries(d3) >= 2, true, "the new entry stays")
  t.ok(exists(d3 .. "/zz-foreign.bin"), "a foreign file is neither counted nor removed")
end

-- ---- numbers in the environment: read strictly, never silently as others --
do
  -- fuselab -e code with one variable set; what it printed, and stderr
  local function with(var, value, code)
    return sh(("env %s=%s %s -e %s"):format(var, q(value), q(FUSELAB), q(code)))
  end
  local function one(out) return (out:gsub("\n", " | ")) end
  local cap = "io.write('CAP ', fl.cache_info().max_bytes, ' ', fl.cache_info().max_bytes, '\\n')"
  local out = with("FUSELAB_CACHE_MAX_MB", "0.1", cap)
  t.is(out, "CAP 104857 104857\n", "FUSELAB_CACHE_MAX_MB=0.1 is a tenth of a MB, with no warning")
  out = with("FUSELAB_CACHE_MAX_MB", " 3 ", cap)
  t.is(out, "CAP 3145728 3145728\n", "blanks around the number are allowed")
  for _, bad in ipairs{"abc", "0", "-5", "1e3", "0x10", "2G", "1.2.3", "inf", "nan", ""} do
    out = with("FUSELAB_CACHE_MAX_MB", bad, cap)
    if bad == "" then
      t.is(out, "CAP 2147483648 2147483648\n", "FUSELAB_CACHE_MAX_MB empty: the default, no warning")
    else
      t.ok(out:find("CAP 2147483648 2147483648", 1, true) and count(out, "warning") == 1 and
           out:find('warning: FUSELAB_CACHE_MAX_MB="' .. bad .. '" is not a number of megabytes above 0; ' ..
                    "using 2048 megabytes", 1, true),
           ("FUSELAB_CACHE_MAX_MB=%s: the default, with one warning naming the variable and value: %s"):format(bad, one(out)))
    end
  end
  out = with("FUSELAB_CACHE_MAX_MB", "\27]0;x\7", cap)
  t.ok(out:find('FUSELAB_CACHE_MAX_MB="\\x1b]0;x\\x07"', 1, true) and not out:find("\27", 1, true),
       "a value with control characters is escaped in the warning: " .. one(out))
  out = with("FUSELAB_COMPILE_TIMEOUT", "soon", "local f = fl.compile(function(x) return x + 1 end) f(fl.ones(2))")
  t.ok(count(out, "warning") == 1 and out:find('FUSELAB_COMPILE_TIMEOUT="soon" is not a number of seconds ' ..
       "above 0; using 120 seconds", 1, true), "FUSELAB_COMPILE_TIMEOUT=soon: one warning: " .. one(out))
  out = with("FUSELAB_COMPILE_TIMEOUT", "0.5e", "local f = fl.compile(function(x) return x + 1 end) f(fl.ones(2))")
  t.ok(out:find('FUSELAB_COMPILE_TIMEOUT="0.5e"', 1, true), "FUSELAB_COMPILE_TIMEOUT=0.5e is not a number: " .. one(out))
  out = with("FUSELAB_HOST_POOL_MB", "lots", "io.write('LIMIT ', fl.host_pool_info().limit, '\\n')")
  t.ok(out:find('FUSELAB_HOST_POOL_MB="lots" is not a number of megabytes; using', 1, true),
       "FUSELAB_HOST_POOL_MB=lots: a warning: " .. one(out))
  out = with("FUSELAB_PACK_MB", "x", "local a = fl.randn(64, 64) local _ = a:matmul(a)")
  t.ok(out:find('FUSELAB_PACK_MB="x" is not a number of megabytes; using 256 megabytes', 1, true),
       "FUSELAB_PACK_MB=x: a warning: " .. one(out))
end

-- ---- live programs hold no file descriptor ----------------------------------
do
  local d5 = base .. "/fds"
  os.execute("mkdir -m 0700 " .. q(d5))
  -- a child under a low descriptor limit: 40 distinct programs kept alive
  -- (each used to hold its object's fd: past the limit, every compile fell
  -- back, blamed on the compiler), then the same from the disk cache
  local many = base .. "/many.lua"
  write(many, [[
local pid = io.open("/proc/self/stat"):read("l"):match("^%d+")
local function fds()
  local p, n = io.popen("ls /proc/" .. pid .. "/fd"), 0
  for _ in p:lines() do n = n + 1 end
  p:close()
  return n
end
local keep, falls, x = {}, 0, fl.ones(3)
local before = fds()
for i = 1, 40 do
  local c = i
  local cm = fl.compile(function(a) return a * c + c end)
  if cm(x):sum():item() ~= 6 * c then falls = falls + 100 end
  falls = falls + cm:stats().fallbacks
  keep[i] = cm
end
print("FALLS " .. falls)
print("GREW " .. fds() - before)
]])
  local function live()
    local out = sh(("ulimit -n 32 && FUSELAB_CACHE_DIR=%s timeout 300 %s %s"):format(q(d5), q(FUSELAB), q(many)))
    return out, tonumber(out:match("FALLS (%d+)")), tonumber(out:match("GREW (%-?%d+)"))
  end
  local out, falls, grew = live()
  t.ok(falls == 0 and not out:find("warning", 1, true),
       "40 live compiled programs under `ulimit -n 32`: none falls back: " .. out:gsub("\n", " | "))
  t.ok(grew and grew <= 2, "... and they hold no descriptors (open fds grew by " .. tostring(grew) .. ")")
  out, falls, grew = live()
  t.ok(falls == 0 and grew and grew <= 2 and not out:find("warning", 1, true),
       "the same 40 loaded from the disk cache: none falls back, no descriptors held: " .. out:gsub("\n", " | "))
  local tmps = sh("find " .. q(d5) .. " -maxdepth 1 -name 'tmp-*'")
  t.is(tmps, "", "no temp directories are left behind by the loads")

  -- every descriptor taken by the program itself: the compile falls back
  -- naming the real cause, and a sound cache entry is kept, not removed
  local full = base .. "/full.lua"
  write(full, [[
local x = fl.ones(3)
local warm = fl.compile(function(a) return a * 2 + 1 end)
warm(x)
warm = nil
collectgarbage(); collectgarbage()
local held = {}
while true do
  local f = io.open("/dev/null")
  if not f then break end
  held[#held + 1] = f
end
local p = fl.capture(function(a) return a * 5 - 1 end, x):fuse():codegen("cpu")
local ok, log, cause = p:try_compile()
print("OK " .. tostring(ok))
print("CAUSE " .. tostring(cause))
print("LOG " .. tostring(log):gsub("\n", " "))
local again = fl.compile(function(a) return a * 2 + 1 end)
print(("AGAIN %g %d"):format(again(x):sum():item(), again:stats().fallbacks))
for _, f in ipairs(held) do f:close() end
held = nil
collectgarbage()
again = fl.compile(function(a) return a * 2 + 1 end)
print(("AFTER %g %d %d"):format(again(x):sum():item(), again:stats().fallbacks, again:stats().disk_cache_hits))
]])
  local d6 = base .. "/full"
  os.execute("mkdir -m 0700 " .. q(d6))
  out = sh(("ulimit -n 32 && FUSELAB_CACHE_DIR=%s timeout 300 %s %s"):format(q(d6), q(FUSELAB), q(full)))
  local cause = out:match("CAUSE ([^\n]*)") or ""
  t.ok(out:find("OK false", 1, true) and cause:find("too many open files", 1, true) and
       cause:find("limit of 32", 1, true) and cause:find("the compiler is not at fault", 1, true),
       "no descriptor left: try_compile's cause says too many open files: " .. cause)
  t.ok((out:match("LOG ([^\n]*)") or ""):find("too many open files", 1, true) and not out:find("cc failed", 1, true),
       "... so does the compile log, and nothing blames the compiler")
  t.ok(out:find("AGAIN 9 ", 1, true), "... a graph whose object is on disk still runs (eagerly or not): " .. out:gsub("\n", " | "))
  t.ok(out:find("warning: compile: too many open files", 1, true) and
       not out:find("compiling the generated C failed", 1, true), "... the warning names the cause")
  t.ok(out:find("AFTER 9 0 1", 1, true),
       "... its entry was kept, and loads from disk once descriptors are free again: " .. out:gsub("\n", " | "))
end

-- ---- a compiler that hangs ------------------------------------------------
do
  local slow, pids = base .. "/cc-slow", base .. "/slow-pids"
  write(slow, "#!/bin/sh\necho $$ >> " .. q(pids) .. "\nexec sleep 200\n")
  os.execute("chmod +x " .. q(slow))
  local d4 = base .. "/slow"
  os.execute("mkdir -m 0700 " .. q(d4))
  local t0 = fl.now()
  local r = run("FUSELAB_CACHE_DIR=" .. q(d4) .. " CC=" .. q(slow) .. " FUSELAB_COMPILE_TIMEOUT=1", 190)
  local took = fl.now() - t0
  t.is(r.result, 20, "hanging compiler: eager fallback, the right answer")
  t.ok(took < 100, ("hanging compiler: killed at the timeout (%.1f s)"):format(took))
  t.is(count(r.out, "fuselab: warning: compiling"), 1, "hanging compiler: one warning")
  t.is(r.FALLBACKS, "1", "hanging compiler: counted as a fallback")
  t.ok(tonumber(r.TIMEOUTS) and tonumber(r.TIMEOUTS) >= 1, "hanging compiler: cache_info().timeouts " .. tostring(r.TIMEOUTS))
  t.ok(r.LOG and r.LOG:find("FUSELAB_COMPILE_TIMEOUT", 1, true), "hanging compiler: the log names the timeout")
  local alive = 0
  for pid in (read(pids) or ""):gmatch("%d+") do
    -- (a zombie is dead: only its new parent has not reaped it yet)
    local st = sh("ps -o stat= -p " .. pid)
    if st:find("%u") and not st:find("^%s*Z") then alive = alive + 1 end
  end
  t.is(alive, 0, "hanging compiler: no process of it is left")
end

-- ---- objects no program holds are unloaded ----------------------------------
do
  local old = fl._cache_use_dir(d)
  collectgarbage()
  local before = fl.cache_info().loaded
  t.is(math.type(before), "integer", "cache_info().loaded counts the objects in memory")
  before = before or 0
  do
    local f = fl.compile(function(x) return x * 7 - 2 end)
    t.near(f(fl.ones(3)):sum():item(), 15, 1e-6, "in-process compile")
    t.is(fl.cache_info().loaded, before + 1, "while held: in memory")
  end
  collectgarbage(); collectgarbage()
  t.is(fl.cache_info().loaded, before, "once no program holds it: unloaded")
  fl._cache_use_dir(old)
end

os.execute("chmod -R u+rwX " .. q(base) .. "; rm -rf " .. q(base))
t.done()
