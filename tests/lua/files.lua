-- files.lua -- what fl.save, fl.save_weights, fl.draw and fl.report do to
-- what is already at a path, and what fl.load and fl.load_weights accept:
-- a regular file is replaced atomically and keeps its mode, a symlink is
-- written through, anything else (FIFO, device, directory) is refused and
-- left alone; only regular files are read, so a FIFO or /dev/zero fails
-- at once; names from a file reach messages and terminals escaped.
--
-- Anything that could block (a FIFO, /dev/zero) runs in a child fuselab
-- under `timeout`, so a regression fails the test instead of hanging it.
-- The suite runs as root in CI: nothing here relies on permissions root
-- would bypass.
local t = require "tap"

local function sh(cmd)
  local ok = os.execute(cmd)
  return ok == true
end

local function read_cmd(cmd)
  local p = assert(io.popen(cmd))
  local s = p:read("a")
  p:close()
  return s
end

local function q(s) return "'" .. s:gsub("'", "'\\''") .. "'" end

local dir = t.tmpdir()
local function path(name) return dir .. "/" .. name end
local function mode(p) return read_cmd("stat -c %a " .. q(p)):match("%d+") end

-- A child fuselab running code under a time limit; returns its output
-- (stdout and stderr) and whether it ended before the limit.
local fuselab = os.getenv("FUSELAB") or arg[-1] or "fuselab"
local function child(code)
  local out = read_cmd("timeout 60 " .. q(fuselab) .. " -e " .. q(code) .. " 2>&1; echo \"rc=$?\"")
  return out, not out:find("rc=124", 1, true)
end

local x = fl.arange(6, {dtype = "float32"}):reshape(2, 3)

do -- a FIFO is neither replaced nor read, and nothing blocks
  local fifo = path("fifo")
  assert(sh("mkfifo " .. q(fifo)))
  local ok, err = pcall(fl.save, x, fifo)
  t.ok(not ok and err:find("is a FIFO (named pipe), not a regular file", 1, true),
       "fl.save over a FIFO fails: " .. tostring(err))
  t.ok(sh("test -p " .. q(fifo)), "... and the FIFO is still there")
  ok, err = pcall(fl.save_weights, {w = x}, fifo)
  t.ok(not ok and err:find("save_weights: " .. fifo .. ": is a FIFO", 1, true),
       "fl.save_weights over a FIFO fails: " .. tostring(err))
  t.ok(sh("test -p " .. q(fifo)), "... and the FIFO is still there")
  local out, done = child("print(pcall(fl.load, " .. string.format("%q", fifo) .. "))")
  t.ok(done and out:find("false\tload: " .. fifo .. ": is a FIFO", 1, true),
       "fl.load of a FIFO fails at once: " .. out)
  out, done = child("print(pcall(fl.load_weights, {w = fl.ones(1)}, " ..
                    string.format("%q", fifo) .. "))")
  t.ok(done and out:find("false\tload_weights: " .. fifo .. ": is a FIFO", 1, true),
       "fl.load_weights of a FIFO fails at once: " .. out)
  -- the pictures replace files the same way (fopen("w") used to block here)
  local pic = path("pic.dot")
  assert(sh("mkfifo " .. q(pic)))
  out, done = child("local g = fl.capture(function(a) return a + 1 end, fl.ones(2)) " ..
                    "print(pcall(fl.draw, g, " .. string.format("%q", pic) .. ")) " ..
                    "print(pcall(fl.report, g, " .. string.format("%q", fifo) .. "))")
  t.ok(done and out:find("false\tdraw: " .. pic .. ": is a FIFO", 1, true),
       "fl.draw over a FIFO fails at once: " .. out)
  t.ok(done and out:find("false\treport: " .. fifo .. ": is a FIFO", 1, true),
       "fl.report over a FIFO fails at once")
  t.ok(sh("test -p " .. q(pic)) and sh("test -p " .. q(fifo)), "... and both FIFOs are still there")
  -- ONNX: the model file, and the external data file a model names
  out, done = child("print(pcall(fl.load_onnx, " .. string.format("%q", fifo) .. "))")
  t.ok(done and out:find("false\tload_onnx: " .. fifo .. ": is a FIFO", 1, true),
       "fl.load_onnx of a FIFO fails at once: " .. out)
  local P = require "onnx_proto"
  local ext = path("ext.onnx")
  P.write(ext, P.mlp{inits = {{name = "W", dims = {4, 3}, external = {location = "fifo", length = 48}},
                              {name = "b", dims = {3}, floats = {0.1, 0.2, 0.3}}}})
  out, done = child("print(pcall(fl.load_onnx, " .. string.format("%q", ext) .. "))")
  t.ok(done and out:find("external data: " .. fifo .. ": is a FIFO", 1, true),
       "fl.load_onnx of a model whose external data is a FIFO fails at once: " .. out)
  os.remove(ext)
  os.remove(fifo)
  os.remove(pic)
end

do -- devices: a null device is never replaced, /dev/zero never read
  -- As root (CI) the null device is a node of our own, so a regression
  -- replaces that and not the system's /dev/null; anyone else cannot
  -- replace /dev/null at all (/dev is not theirs), so it is safe there.
  local null = path("null.dot")
  if not sh("mknod " .. q(null) .. " c 1 3 2>/dev/null") then null = "/dev/null" end
  local ok, err = pcall(fl.save, x, null)
  t.is(err, "save: " .. null .. ": is a character device, not a regular file " ..
       "(refusing to replace it)", "fl.save over a null device is refused")
  t.ok(not ok and sh("test -c " .. q(null)), "... and it is still a device")
  ok, err = pcall(fl.save_weights, {w = x}, null)
  t.ok(not ok and err:find("is a character device", 1, true) and sh("test -c " .. q(null)),
       "fl.save_weights over a null device is refused: " .. tostring(err))
  local g = fl.capture(function(a) return a + 1 end, fl.ones(2))
  ok, err = pcall(fl.draw, g, null)
  t.ok(not ok and err:find("is a character device", 1, true) and sh("test -c " .. q(null)),
       "fl.draw over a null device is refused: " .. tostring(err))
  if null ~= "/dev/null" then os.remove(null) end
  local out, done = child('print(pcall(fl.load, "/dev/zero"))')
  t.ok(done and out:find("load: /dev/zero: is a character device, not a regular file", 1, true),
       "fl.load of /dev/zero fails at once: " .. out)
  out, done = child('print(pcall(fl.load_weights, {w = fl.ones(1)}, "/dev/zero"))')
  t.ok(done and out:find("load_weights: /dev/zero: is a character device", 1, true),
       "fl.load_weights of /dev/zero fails at once: " .. out)
  out, done = child('print(pcall(fl.load_onnx, "/dev/zero"))')
  t.ok(done and out:find("/dev/zero: is a character device, not a regular file", 1, true),
       "fl.load_onnx of /dev/zero fails at once: " .. out)
end

do -- a directory is refused and left empty
  local d = path("sub")
  assert(sh("mkdir " .. q(d)))
  local ok, err = pcall(fl.save, x, d)
  t.ok(not ok and err:find("is a directory, not a regular file", 1, true),
       "fl.save over a directory fails: " .. tostring(err))
  ok, err = pcall(fl.save_weights, {w = x}, d)
  t.ok(not ok and err:find("is a directory", 1, true), "fl.save_weights too: " .. tostring(err))
  t.is(read_cmd("ls -A " .. q(d)), "", "... and the directory is still empty")
  os.remove(d)
end

do -- a file's mode survives being saved over
  for _, c in ipairs{{"x.npy", fl.save, x}, {"w.safetensors", fl.save_weights, {w = x}}} do
    local p = path(c[1])
    assert(sh("echo old > " .. q(p) .. " && chmod 600 " .. q(p)))
    c[2](c[3], p)
    t.is(mode(p), "600", c[1] .. ": a 0600 file stays 0600")
    assert(sh("chmod 640 " .. q(p)))
    c[2](c[3], p)
    t.is(mode(p), "640", c[1] .. ": a 0640 file stays 0640")
    os.remove(p)
  end
  local p = path("new.npy")
  fl.save(x, p)
  local want = string.format("%o", 0x1b6 & ~tonumber(read_cmd("umask"), 8))
  t.is(mode(p), want, "a new file gets 0666 & ~umask")
  os.remove(p)
end

do -- through a symlink: the target is replaced, the link stays a link
  local target, link = path("target.npy"), path("link.npy")
  assert(sh("echo old > " .. q(target) .. " && chmod 600 " .. q(target) ..
            " && ln -s target.npy " .. q(link)))
  fl.save(x, link)
  t.ok(sh("test -L " .. q(link)), "fl.save through a link keeps the link")
  t.is(fl.load(target):tolist(), x:tolist(), "... writes the target")
  t.is(mode(target), "600", "... and keeps the target's mode")
  local wt, wl = path("w.safetensors"), path("wl.safetensors")
  assert(sh("echo old > " .. q(wt) .. " && ln -s w.safetensors " .. q(wl)))
  fl.save_weights({w = x}, wl)
  local m = {w = fl.zeros(2, 3)}
  fl.load_weights(m, wt)
  t.ok(sh("test -L " .. q(wl)) and fl.allclose(m.w, x), "fl.save_weights through a link")
  for _, f in ipairs{target, link, wt, wl} do os.remove(f) end
end

do -- a header may not ask for more bytes than the file holds
  local p = path("liar.npy")
  local hdr = "{'descr': '<f4', 'fortran_order': False, 'shape': (100000000000,), }"
  hdr = hdr .. string.rep(" ", 63 - (10 + #hdr) % 64) .. "\n"
  local f = assert(io.open(p, "wb"))
  f:write("\x93NUMPY\x01\x00", string.pack("<I2", #hdr), hdr, "abcd")
  f:close()
  local ok, err = pcall(fl.load, p)
  t.ok(not ok and err:find("truncated data (expected 400000000000 bytes, found 4)", 1, true),
       "a .npy header for 4e11 bytes over 4 bytes: " .. tostring(err))
  local json = '{"w":{"dtype":"F32","shape":[100000000000],"data_offsets":[0,400000000000]}}'
  f = assert(io.open(p, "wb"))
  f:write(string.pack("<I8", #json), json, "abcd")
  f:close()
  ok, err = pcall(fl.load_weights, {w = fl.ones(1)}, p)
  t.ok(not ok and err:find("run past the end of the data (4 bytes)", 1, true),
       "a safetensors header for 4e11 bytes over 4 bytes: " .. tostring(err))
  f = assert(io.open(p, "wb"))
  f:write(string.pack("<I8", 1 << 40), "{}")
  f:close()
  ok, err = pcall(fl.load_weights, {w = fl.ones(1)}, p)
  t.ok(not ok and err:find("header length 1099511627776 runs past the end of the file", 1, true),
       "a safetensors header length past the end: " .. tostring(err))
  os.remove(p)
end

do -- names from a file reach messages escaped
  local p = path("evil.safetensors")
  -- a tensor name with a terminal command (\u001b, escaped in the JSON):
  -- refused, and the message shows it escaped
  local function raw(name_json)
    local json = '{"' .. name_json .. '":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}'
    local f = assert(io.open(p, "wb"))
    f:write(string.pack("<I8", #json), json, string.pack("<f", 1))
    f:close()
  end
  raw("\\u001b[31mred")
  local ok, err = pcall(fl.load_weights, {w = fl.ones(1)}, p)
  t.ok(not ok and not err:find("\27", 1, true), "no raw ESC in the message: " .. tostring(err))
  t.ok(err:find("tensor '\\x1b[31mred': the name holds a control character (0x1b)", 1, true),
       "... the name shows as \\x1b[31mred: " .. tostring(err))
  ok, err = pcall(fl.save_weights, {["\27[31mred"] = fl.ones(1)}, p)
  t.ok(not ok and not err:find("\27", 1, true) and err:find("\\x1b[31mred': the name holds a control", 1, true),
       "fl.save_weights refuses to write such a name: " .. tostring(err))
  -- other UTF-8 text passes; a byte that is not UTF-8 is escaped, and a
  -- C1 control (U+009B, a one-char CSI) is refused
  fl.save_weights({["poids_é\xff"] = fl.ones(1)}, p)
  ok, err = pcall(fl.load_weights, {w = fl.ones(1)}, p)
  t.ok(not ok and err:find("1 unexpected in the file (poids_é\\xff)", 1, true),
       "UTF-8 names pass, stray bytes are escaped: " .. tostring(err))
  local m = {["poids_é\xff"] = fl.ones(2)}
  ok, err = pcall(fl.load_weights, m, p)
  t.ok(not ok and err:find("load_weights: poids_é\\xff: shape [1] in file, [2] in model", 1, true),
       "... and in a shape mismatch: " .. tostring(err))
  raw("poids\\u009b")
  ok, err = pcall(fl.load_weights, {w = fl.ones(1)}, p)
  t.ok(not ok and err:find("tensor 'poids\\xc2\\x9b': the name holds a control character (0x9b)", 1, true),
       "a C1 control in a name is refused, escaped: " .. tostring(err))
  raw("weight\\u0000evil")
  ok, err = pcall(fl.load_weights, {weight = fl.zeros(1)}, p)
  t.ok(not ok and err:find("load_weights: " .. p .. ": safetensors: a string holds an escaped NUL", 1, true),
       "a NUL inside a name (\"weight\\u0000evil\") is refused, naming the file: " .. tostring(err))
  local evil = path("\27]0;title\7.npy")
  ok, err = pcall(fl.load, evil)
  t.ok(not ok and not err:find("\27", 1, true) and err:find("\\x1b]0;title\\x07.npy", 1, true),
       "a path with terminal codes is escaped in messages: " .. tostring(err))
  os.remove(p)
end

do -- nothing left behind: no temp files from any of the saves
  t.is(read_cmd("ls -A " .. q(dir)), "", "no temp files left in the directory")
end

t.done()
