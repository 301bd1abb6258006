-- tap.lua -- a tiny TAP producer for the Lua tests.
--   local t = require "tap"
--   t.ok(cond, name)  t.is(got, want, name)  t.near(got, want, tol, name)
--   t.raises(fn, pattern, name)  t.done()
--   t.slurp(path)  t.tmpdir()
-- Failures print the file:line of the assertion and what was got/wanted as
-- TAP diagnostics ("# ..."); done() prints the plan "1..N" last and exits
-- non-zero when anything failed.

local M = {}
local count, failed = 0, 0

-- The first caller outside this file (assertions may be tail calls).
local function where()
  for level = 2, 20 do
    local info = debug.getinfo(level, "Sl")
    if not info then break end
    if info.what ~= "C" and not info.short_src:find("tap%.lua$") then
      return info.short_src .. ":" .. (info.currentline or "?")
    end
  end
  return "?"
end

local function show(v)
  if type(v) == "string" then return string.format("%q", v) end
  if type(v) ~= "table" then return tostring(v) end
  local parts = {}
  for i = 1, #v do parts[i] = show(v[i]) end
  return "{" .. table.concat(parts, ", ") .. "}"
end
M.show = show

function M.diag(msg)
  for line in (tostring(msg) .. "\n"):gmatch("(.-)\n") do
    io.write("# ", line, "\n")
  end
end

local function result(pass, name, ...)
  count = count + 1
  io.write(pass and "ok " or "not ok ", count, " - ", name or "", "\n")
  if not pass then
    failed = failed + 1
    M.diag("at " .. where())
    for i = 1, select("#", ...) do M.diag(select(i, ...)) end
  end
  return pass
end

function M.ok(cond, name)
  return result(not not cond, name)
end

local function deep_equal(a, b)
  if type(a) ~= "table" or type(b) ~= "table" then return a == b end
  if #a ~= #b then return false end
  for k, v in pairs(a) do
    if not deep_equal(v, b[k]) then return false end
  end
  for k in pairs(b) do
    if a[k] == nil then return false end
  end
  return true
end

-- Equality; tables are compared element by element (nested lists).
function M.is(got, want, name)
  return result(deep_equal(got, want), name,
                "     got: " .. show(got), "  wanted: " .. show(want))
end

-- Numbers, or nested lists of numbers (a tensor is read with tolist), equal
-- within an absolute tolerance tol (default 1e-6); NaN matches NaN.
local function near_equal(a, b, tol)
  if type(a) == "number" and type(b) == "number" then
    return (a ~= a and b ~= b) or a == b or math.abs(a - b) <= tol
  end
  if type(a) ~= "table" or type(b) ~= "table" or #a ~= #b then return false end
  for i = 1, #a do
    if not near_equal(a[i], b[i], tol) then return false end
  end
  return true
end

function M.near(got, want, tol, name)
  if type(tol) == "string" then tol, name = nil, tol end
  tol = tol or 1e-6
  if type(got) == "userdata" and got.tolist then got = got:tolist() end
  if type(want) == "userdata" and want.tolist then want = want:tolist() end
  return result(near_equal(got, want, tol), name,
                "     got: " .. show(got), "  wanted: " .. show(want) ..
                " (tolerance " .. tol .. ")")
end

-- fn must raise an error whose message matches the Lua pattern.  Returns
-- the message, so a test can look further.
function M.raises(fn, pattern, name)
  local okay, err = pcall(fn)
  local msg = tostring(err)
  if okay then
    result(false, name, "no error raised", "  wanted an error matching: " .. pattern)
    return nil
  end
  result(msg:find(pattern) ~= nil, name,
         "   error: " .. msg, "  wanted: " .. pattern)
  return msg
end

function M.skip(reason, n)
  for _ = 1, n or 1 do
    count = count + 1
    io.write("ok ", count, " # SKIP ", reason, "\n")
  end
end

-- The whole content of the file at path, or nil and io.open's message.
function M.slurp(path)
  local f, err = io.open(path, "rb")
  if not f then return nil, err end
  local s = f:read("a")
  f:close()
  return s
end

-- A fresh directory (mode 0700) next to os.tmpname()'s files; done()
-- removes it with all it holds.  mkdir without -p: a name someone else
-- made between tmpname's remove and here fails instead of being shared.
local tmpdirs = {}
function M.tmpdir()
  local dir = os.tmpname()
  assert(not dir:find("'", 1, true), "tmpdir: a quote in " .. dir)
  os.remove(dir)
  assert(os.execute("mkdir -m 0700 '" .. dir .. "'"), "tmpdir: cannot make " .. dir)
  tmpdirs[#tmpdirs + 1] = dir
  return dir
end

function M.done()
  for _, dir in ipairs(tmpdirs) do os.execute("rm -rf '" .. dir .. "'") end
  tmpdirs = {}
  io.write("1..", count, "\n")
  io.flush()
  if failed > 0 then
    M.diag(failed .. " of " .. count .. " failed")
    os.exit(1)
  end
end

return M
