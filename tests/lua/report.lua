-- report.lua -- fl.report(cm, path) as documented, with no options: the
-- kernel times, the second call and the steady state come from the calls
-- the compiled function already made; the go-live checklist is on the
-- page; a first call that found its kernels in the disk cache is "warm",
-- and the page has one break-even number, not two.
local t = require "tap"

local dir = os.getenv("TMPDIR") or "/tmp"
local cache = fl._mkdtemp()
local saved_cache = fl._cache_use_dir(cache)
local path = dir .. "/fl-report-test-" .. tostring(os.time()) .. ".html"

local function read(p) return assert(t.slurp(p)) end

local function count(s, pat)
  local n = 0
  for _ in s:gmatch(pat) do n = n + 1 end
  return n
end

-- the cells of the row whose first cell is `name`
local function row(html, name)
  local at = html:find(">" .. name, 1, true)
  if not at then return nil end
  return html:sub(at, (html:find("</tr>", at, true) or #html))
end

fl.manual_seed(3)
local model = fl.models.mlp{sizes = {16, 32, 4}}
local x = fl.randn(8, 16)

-- ---- a cold first call, then steady calls; the report runs nothing extra
local cm = fl.compile(model, {backend = "cpu"})
for _ = 1, 12 do cm(x) end
local rng = fl.get_rng_state()
fl.report(cm, path)
local after = fl.get_rng_state()
t.is(after.offset, rng.offset, "the report's checklist draws nothing the caller sees")
local html = read(path)

t.ok(html:find("first call: cold", 1, true), "the first call compiled: labelled cold")
local second = row(html, "second call")
t.ok(second and second:find("%d+%.?%d* [^<]-s</td>"), "the second call has a time: " .. tostring(second))
local steady = row(html, "steady state (median call)")
t.ok(steady and steady:find("%d+%.?%d* [^<]-s</td>"), "the steady state has a time")
t.ok(steady and steady:find("IQR", 1, true), "with its spread")
t.ok(steady and steady:find("the calls the function made", 1, true), "from the calls already made")
local eager = row(html, "eager (uncompiled)")
t.ok(eager and eager:find("%d+%.?%d* [^<]-s</td>"), "eager has a time (the checklist's)")

-- the kernel table: every kernel has a mean time
local ktab = html:match('id="kernels".-</table>') or ""
local dashes = count(ktab, '<td class="n">\xe2\x80\x94</td>')
t.is(dashes, 0, "no kernel time is a dash")
t.ok(ktab:find("[\xc2\xb5m]s</td>"), "kernel times are shown")

t.ok(html:find('id="checklist"', 1, true), "the go-live checklist is on the page")
t.ok(html:find("Recommendation:", 1, true), "with its recommendation")
t.ok(count(html, "pays for itself") + count(html, "does not pay for itself") == 1,
  "exactly one break-even sentence")
t.ok(not html:find("while the model still changes often", 1, true), "no boilerplate clause")

-- ---- a new compiled function whose kernels come from the disk cache
fl._cache_forget_memory()
local cm2 = fl.compile(model, {backend = "cpu"})
for _ = 1, 6 do cm2(x) end
t.ok(cm2:stats().disk_cache_hits >= 1, "the second compile loaded from disk")
fl.report(cm2, path, {checklist = false})
html = read(path)
t.ok(html:find("first call: warm", 1, true), "a disk-cache hit is labelled warm")
t.ok(not html:find("first call: cold", 1, true), "and never cold")
t.ok(not html:find('id="checklist"', 1, true), "checklist = false leaves the checklist out")
t.ok(not html:find("pays for itself after", 1, true), "no break-even from a warm first call")

-- ---- options
t.raises(function() fl.report(cm, path, {checklist = 5}) end,
  "option checklist must be true, false or the table fl.checklist returns", "checklist = 5")
local given = fl.checklist(model, {inputs = {x}, quiet = true, calls = 5})
fl.report(cm, path, {checklist = given, title = "Given checklist"})
html = read(path)
t.ok(html:find("<title>Given checklist</title>", 1, true), "title sets the page's title")
t.ok(html:find(given.recommendation:sub(1, 20), 1, true), "a given checklist is the one shown")

os.remove(path)
pcall(fl.cache_clear)
fl._cache_use_dir(saved_cache)
os.remove(cache)
t.done()
