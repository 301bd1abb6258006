-- run_examples.lua -- the examples of doc/API.md are tests.
--
--   fuselab run_examples.lua API.md [LINE]
--
-- Every ```lua block of the file runs as a script in a fresh fuselab
-- process ($FUSELAB), in an empty temporary folder, and passes when it
-- exits with status 0.  A block followed directly by an ```output block
-- must also print exactly that (trailing blanks aside).  A block whose
-- preceding line is
--     <!-- example: skip (why) -->      is not run (it needs a GPU, ...);
--     <!-- example: pending -->         documents what is not built yet:
-- both are reported as TAP skips; a pending example is still tried, and
-- a note says when it has started to work, so the marker can go.
--
-- A last test checks that the reference misses nothing: every public
-- function of fl, every tensor method and every nn module is named in it.
-- Prints TAP, the plan last.  With LINE, only the example at that line.

local path, only = arg[1], tonumber(arg[2])
local fuselab = os.getenv("FUSELAB")
if not path or not fuselab then
  io.stderr:write("usage: FUSELAB=path/to/fuselab fuselab run_examples.lua API.md [LINE]\n")
  os.exit(2)
end
local name = path:match("[^/]*$")

local function q(s) return "'" .. s:gsub("'", "'\\''") .. "'" end

local function slurp(p)
  local f = io.open(p, "rb")
  if not f then return "" end
  local s = f:read("a")
  f:close()
  return s
end

-- Lines without trailing blanks, and no blank lines at the end.
local function tidy(s)
  s = s:gsub("[ \t]+\n", "\n"):gsub("[ \t]+$", "")
  return (s:gsub("\n+$", ""))
end

-- ---- extract ------------------------------------------------------------

local lines = {}
do
  local f = assert(io.open(path, "rb"))
  for l in f:lines() do lines[#lines + 1] = l end
  f:close()
end

-- Reads the fenced block opening at line i; returns its body and the
-- line after the closing fence.
local function block(i)
  local body = {}
  local j = i + 1
  while j <= #lines and not lines[j]:match("^```%s*$") do
    body[#body + 1] = lines[j]
    j = j + 1
  end
  if j > #lines then error(("%s:%d: unclosed code block"):format(name, i), 0) end
  return table.concat(body, "\n") .. "\n", j + 1
end

local examples = {}
do
  local i, prev = 1, nil
  while i <= #lines do
    local l = lines[i]
    if l:match("^```lua%s*$") then
      local ex = {line = i}
      ex.mark, ex.why = (prev or ""):match("^<!%-%-%s*example:%s*(%a+)%s*(.-)%s*%-%->")
      ex.code, i = block(i)
      local k = i
      while k <= #lines and lines[k]:match("^%s*$") do k = k + 1 end
      if k <= #lines and lines[k]:match("^```output%s*$") then
        ex.want, i = block(k)
      end
      examples[#examples + 1] = ex
      prev = nil
    elseif l:match("^```") then      -- another language: skip it whole
      local _
      _, i = block(i)
      prev = nil
    else
      if not l:match("^%s*$") then prev = l end
      i = i + 1
    end
  end
end

-- ---- run --------------------------------------------------------------------

local has_timeout = os.execute("command -v timeout >/dev/null 2>&1")

-- Runs one example; returns ok and, when not, what went wrong.
local function run(ex, limit)
  local p = io.popen("mktemp -d \"${TMPDIR:-/tmp}/fl-example.XXXXXX\"")
  local dir = p:read("l")
  p:close()
  if not dir or dir == "" then return false, "mktemp failed" end
  local f = assert(io.open(dir .. "/example.lua", "wb"))
  f:write(ex.code)
  f:close()
  local cmd = ("cd %s && %s%s example.lua >out 2>err </dev/null"):format(
    q(dir), has_timeout and ("timeout " .. limit .. " ") or "", q(fuselab))
  local ok, how, code = os.execute(cmd)
  local out, err = slurp(dir .. "/out"), slurp(dir .. "/err")
  os.execute("rm -rf " .. q(dir))
  if not ok then
    local why = how == "exit" and ("exit status " .. code) or ("killed by signal " .. code)
    if how == "exit" and code == 124 and has_timeout then why = "timed out after " .. limit .. " s" end
    return false, why .. "\n" .. err .. (out ~= "" and ("stdout:\n" .. out) or "")
  end
  if ex.want and tidy(out) ~= tidy(ex.want) then
    return false, "printed:\n" .. tidy(out) .. "\nexpected:\n" .. tidy(ex.want) .. "\n" .. err
  end
  return true
end

local n, failed = 0, 0
local function tap(ok, desc, why)
  n = n + 1
  print(("%s %d - %s"):format(ok and "ok" or "not ok", n, desc))
  if not ok then
    failed = failed + 1
    for l in (why or ""):gmatch("[^\n]+") do print("# " .. l) end
  end
  io.stdout:flush()
end

local counts = {run = 0, pending = 0, skip = 0}
for _, ex in ipairs(examples) do
  if not only or ex.line == only then
    local where = ("%s:%d"):format(name, ex.line)
    if ex.mark == "skip" then
      counts.skip = counts.skip + 1
      tap(true, ("%s # SKIP %s"):format(where, ex.why ~= "" and ex.why or "marked skip"))
    elseif ex.mark == "pending" then
      counts.pending = counts.pending + 1
      local works = run(ex, 30)
      tap(true, ("%s # SKIP pending%s"):format(where,
        works and " (it runs now: remove the marker)" or ": not built yet"))
    elseif ex.mark then
      tap(false, where, ("unknown example marker '%s' (expected skip or pending)"):format(ex.mark))
    else
      counts.run = counts.run + 1
      local ok, why = run(ex, 120)
      tap(ok, where, why)
    end
  end
end

-- ---- coverage: everything public is in the reference ------------------------

if not only then
  local text = table.concat(lines, "\n")
  local function mentioned(pat) return text:find(pat) ~= nil end
  -- a heading may name a group of methods: "#### Unary: `abs neg exp ...`"
  local in_heading = {}
  for _, l in ipairs(lines) do
    if l:match("^#") then for w in l:gmatch("[%a_][%w_]*") do in_heading[w] = true end end
  end
  local function method_documented(k)
    return in_heading[k] or mentioned(":" .. k .. "%f[^%w_]")
  end
  local missing = {}
  -- helpers of the implementation (leading _) and plain data are not API
  local not_api = {Tensor = true, version = true, nn = true, models = true}
  for k, v in pairs(fl) do
    if type(k) == "string" and not k:match("^_") and not not_api[k] and
       not mentioned("fl%." .. k .. "%f[^%w_]") and
       not (fl.Tensor[k] and method_documented(k)) then
      missing[#missing + 1] = "fl." .. k
    end
  end
  for k in pairs(fl.models) do
    if not mentioned("fl%.models%." .. k .. "%f[^%w_]") then missing[#missing + 1] = "fl.models." .. k end
  end
  for k in pairs(fl.Tensor) do
    if type(k) == "string" and not k:match("^_") and
       not method_documented(k) and not mentioned("fl%." .. k .. "%f[^%w_]") then
      missing[#missing + 1] = "x:" .. k
    end
  end
  for k, v in pairs(fl.nn) do
    -- module classes are the tables with a name of the form nn.X
    if type(k) == "string" and k:match("^%u") and k ~= "Module" and
       not mentioned("nn%." .. k .. "%f[^%w_]") then
      missing[#missing + 1] = "nn." .. k
    end
  end
  table.sort(missing)
  tap(#missing == 0, name .. " names every public function, method and module",
      "not in the reference: " .. table.concat(missing, ", "))
end

print(("# %d examples run, %d pending, %d skipped"):format(counts.run, counts.pending, counts.skip))
print("1.." .. n)
os.exit(failed == 0 and 0 or 1)
