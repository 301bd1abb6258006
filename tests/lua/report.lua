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

-- ---- the pass stepper: one step per stage, in order, each with the diff
-- g:diff prints for the same pair of graphs
local function steps(h)
  local out = {}
  for attrs in h:gmatch('<div class="step" (.-)>') do
    local st = {}
    for k, v in attrs:gmatch('data%-(%w+)="([^"]*)"') do st[k] = tonumber(v) or v:gsub("&#39;", "'") end
    out[#out + 1] = st
  end
  return out
end
local function names(list)
  local r = {}
  for i, st in ipairs(list) do r[i] = st.name end
  return table.concat(r, ", ")
end
-- g:diff's counts, its printing kept off the TAP stream
local function gdiff(a, b)
  local saved = print
  print = function() end
  local ok, d = pcall(a.diff, a, b)
  print = saved
  assert(ok, d)
  return d
end

local lin = nn.Linear(16, 8)
local function body(v) return (lin(v):gelu() * 1 + 0):sum(-1) end
local cs = fl.compile(body, {backend = "cpu"})
cs(x)
fl.report(cs, path, {checklist = false})
html = read(path)
local st = steps(html)
-- optimize one rewrite at a time (graph/pass.h's order), the rewrites
-- that change nothing named instead of shown
t.is(names(st), "capture, decompose, optimize/simplify, optimize/fold_linear, optimize/dce, fusion, code",
     "one step per stage and per rewrite that changes something, in order")
local RULES = {"fold_bn", "simplify", "fold_linear", "fold_scale", "const_fold", "cse", "dce"}
local g = fl.capture(body, x)
local gd = g:decompose{quiet = true}
local go = gd:optimize{quiet = true}
local shown, prev = {g, gd}, gd
for k = 1, #RULES do
  local gk = gd:optimize{quiet = true, rules = {table.unpack(RULES, 1, k)}}
  if tostring(gk) ~= tostring(prev) then shown[#shown + 1] = gk; prev = gk end
end
t.is(tostring(shown[#shown]), tostring(go), "all the rewrites together are g:optimize()")
for i = 2, #shown do
  local d = gdiff(shown[i - 1], shown[i])
  local s = st[i]
  t.ok(s and s.added == #d.added and s.removed == #d.removed,
    ("%s: %s added, %s removed as g:diff says (%d, %d)"):format(s and s.name or "?", s and s.added,
      s and s.removed, #d.added, #d.removed))
end
t.ok(st[3] and st[3].prev == 2 and st[3].gone, "optimize's first rewrite: its removed lines refer to decompose's listing")
t.ok(html:find("algebraic simplification (x*1, x+0", 1, true) and
     html:find("no change from fold_bn, fold_scale, const_fold, cse", 1, true),
     "each rewrite's step says what it does; the idle ones are named")
t.ok(html:find('<span class="a[^"]*">  %%%d+ = linear%('),
  "the linear optimize made is marked added")
t.is(count(html, '<pre class="ir"'), #st - 1, "each listing once: code is the code section's")
t.ok(not html:find("src%s*=%s*[\"']?%a*:?//") and not html:find("href%s*=%s*[\"']?%a*:?//") and
  not html:find("url%(") and
  not html:find("@import", 1, true), "no external references")

-- a pass that changes nothing says so
local ce = fl.compile(function(v) return v:exp() end, {backend = "cpu"})
ce(x)
fl.report(ce, path, {checklist = false})
html = read(path)
t.ok(html:find("decompose: no change; 1 ops", 1, true) and html:find("optimize: no change; 1 ops", 1, true),
  "decompose and optimize that change nothing say \"no change\"")
st = steps(html)
t.ok(st[2] and st[2].added == 0 and st[2].removed == 0 and not st[2].gone, "and mark nothing")

-- a plan: it does not know the stages it was made from
fl.report(go:fuse(), path, {checklist = false})
st = steps(read(path))
t.is(names(st), "the plan's graph, fusion, code", "a plan steps from its graph")


-- ---- the roofline in the kernel table: timed CPU kernels get their
-- GFLOP/s and share of the machine's roof (the same rule as k:profile),
-- a plan never timed gets no such columns
do
  local rp = dir .. "/fl_roof_" .. os.time() .. ".html"
  local f = function(a, b) return ((a:matmul(b)):relu() * 2):sum(-1) end
  local a, b = fl.randn(128, 256), fl.randn(256, 128)
  local cm = fl.compile(f)
  cm(a, b)
  fl.report(cm, rp, {inputs = {a, b}, checklist = false})
  local h = read(rp)
  local pk = fl.machine_peaks()
  t.ok(h:find("Roofline: this machine", 1, true) and h:find(("copies at %.1f GB/s"):format(pk.copy_gbs), 1, true),
       "a timed report states the machine's measured peaks over the kernel table")
  local pcts = {}
  for pct, bound in h:gmatch(">(%d+)%% %((%a+)%)</td>") do pcts[#pcts + 1] = {tonumber(pct), bound} end
  t.ok(#pcts >= 1 and pcts[1][1] >= 0 and pcts[1][1] < 1000 and (pcts[1][2] == "memory" or pcts[1][2] == "compute" or pcts[1][2] == "copy"),
       ("each timed kernel has its share of the roof (%d rows, first %s%% %s)"):format(#pcts,
         pcts[1] and pcts[1][1] or "?", pcts[1] and pcts[1][2] or "?"))
  os.remove(rp)
  fl.report(fl.capture(f, a, b):fuse(), rp)
  t.ok(not read(rp):find("of roof", 1, true), "a plan never timed has no roofline columns")
  os.remove(rp)
end
-- ---- the memory chart (fl.draw_memory's) in its own section
do
  local rp = dir .. "/fl_mem_" .. os.time() .. ".html"
  local g = fl.capture(function(a) return ((a * 2):exp() + a):sum(-1) end, fl.randn(64, 64))
  fl.report(g:fuse(), rp)
  local h = read(rp)
  local sec = h:match('<section id="memory">.-</section>') or ""
  t.ok(sec:find("<svg", 1, true) and sec:find("op by op", 1, true) and sec:find("fused", 1, true)
       and h:find('href="#memory"', 1, true), "the report has the memory chart, both curves named, and a link to it")
  os.remove(rp)
end
-- ---- a compiled training step: both halves of its pair drawn, with what
-- the forward keeps, and their code
do
  local rp = dir .. "/fl_train_" .. os.time() .. ".html"
  fl.manual_seed(3)
  local m = fl.nn.Sequential(fl.nn.Linear(8, 16), fl.nn.GELU(), fl.nn.Linear(16, 3))
  local opt = fl.optim.SGD(m:parameters(), {lr = 0.1})
  local step = fl.compile(function(x, y)
    opt:zero_grad()
    local loss = fl.cross_entropy(m(x), y)
    loss:backward()
    opt:step()
    return loss
  end)
  local x, y = fl.randn(5, 8), fl.tensor({0, 2, 1, 1, 0})
  for _ = 1, 3 do step(x, y) end
  fl.report(step, rp)
  local h = read(rp)
  local after = h:match('id="graph%-after".-</svg>') or ""
  t.ok(after:find("training pair 1: forward (keeps", 1, true) and after:find("training pair 1: backward", 1, true)
       and h:find("training pair 1: the backward", 1, true) and h:find("the forward keeps", 1, true),
       "a compiled training step's report draws its forward and its backward, says what the forward keeps, and has both programs")
  os.remove(rp)
end
os.remove(path)
pcall(fl.cache_clear)
fl._cache_use_dir(saved_cache)
os.remove(cache)
t.done()
