-- viz.lua -- pictures and the review report from Lua: fl.draw of every
-- stage kind in every format (files checked by their signatures and,
-- for SVG, tag balance), kernel clusters and dashed edges agreeing with
-- the plan, fl.draw_compare, fl.report sections, bad input, an empty
-- graph, a 12-layer transformer drawn in good time.
-- Files go to a fresh directory, t.tmpdir().
local fl = fl or require "fuselab"
local t = require "tap"

fl.manual_seed(11)

local dir = t.tmpdir()
local function path(name) return dir .. "/" .. name end

-- ---- file checks ---------------------------------------------------------

local function png_ok(s)
  if not s or s:sub(1, 8) ~= "\137PNG\r\n\26\n" or s:sub(13, 16) ~= "IHDR" then return false end
  local w, h = string.unpack(">I4>I4", s, 17)
  return #s > 1000 and w >= 50 and h >= 50 and w < 40000 and h < 40000, w, h
end

local function pdf_ok(s) return s ~= nil and s:sub(1, 5) == "%PDF-" and #s > 500 end

-- Well-formed enough: every start tag closed in order, nothing left open,
-- comments, declarations and CDATA skipped.
local function xml_balanced(s)
  if not s then return false, "no file" end
  s = s:gsub("<!%-%-.-%-%->", ""):gsub("<!%[CDATA%[.-%]%]>", ""):gsub("<%?.-%?>", "")
       :gsub("<!.->", "")
  local stack = {}
  for close, name, rest in s:gmatch("<(/?)([%w_:%-]+)(.-)>") do
    if close == "/" then
      if stack[#stack] ~= name then return false, "</" .. name .. "> closes " .. tostring(stack[#stack]) end
      stack[#stack] = nil
    elseif rest:sub(-1) ~= "/" then
      stack[#stack + 1] = name
    end
  end
  return #stack == 0 and s:find("<svg") ~= nil, "left open: " .. table.concat(stack, " ")
end

local function count(s, pat)
  local n = 0
  for _ in s:gmatch(pat) do n = n + 1 end
  return n
end

-- DOT statements span lines (long attribute lists), so count edges by
-- whole statement: from "->" to the closing "];" (labels hold "]").
local function dot_edges(dot)
  local edges = {}
  for stmt in dot:gmatch("%->.-%];") do edges[#edges + 1] = stmt end
  return edges
end

local function dashed_count(dot)
  local n = 0
  for _, e in ipairs(dot_edges(dot)) do if e:find("dashed") then n = n + 1 end end
  return n
end

-- ---- the stages ------------------------------------------------------------

local mlp = fl.models.mlp{sizes = {16, 32, 8}}
local x = fl.randn(4, 16)
local g = fl.capture(mlp, x)
local p = g:fuse()
local k = p:codegen("cpu")

-- x @ W + b, relu, a transpose, a row sum, divide, exp, softmax: kernels
-- that keep intermediates in registers (the C tests' net, from Lua)
local W, b = fl.randn(16, 24), fl.randn(24)
local function net(x)
  local h = (x:matmul(W) + b):relu()
  local tr = h:transpose(1, 2)
  local s = tr:sum(2, true)
  return (tr / s):exp():softmax(2)
end
local gn = fl.capture(net, x)
local pn = gn:fuse()
local pu = gn:fuse{fuse = false}

-- a function with a graph break in the middle
local function broken(x)
  local h = (x * 2):relu()
  local m = h:sum():item()
  return (h - m):exp()
end
local cm = fl.compile(mlp, {backend = "cpu"})
cm(x)
local cb = fl.compile(broken, {backend = "cpu"})
cb(x)
local quiet_print = print
print = function() end   -- fl.explain prints its summary; keep TAP clean
local ex = fl.explain(broken, x)
print = quiet_print

local stages = {
  {"graph", g}, {"plan", p}, {"program", k}, {"compiled", cm},
  {"compiled with a break", cb}, {"explain table", ex}, {"list", {g, p}},
}

-- ---- every format from every stage kind -----------------------------------

for _, sk in ipairs(stages) do
  local name, st = sk[1], sk[2]
  local base = path(name:gsub("%W", "_"))
  t.is(fl.draw(st, base .. ".dot"), base .. ".dot", name .. ": draw returns the path")
  local dot = t.slurp(base .. ".dot") or ""
  t.ok(dot:find("^%s*digraph") and dot:find("}%s*$"), name .. ": .dot is a digraph")
  fl.draw(st, base .. ".svg")
  local svg = t.slurp(base .. ".svg")
  local okx, why = xml_balanced(svg)
  t.ok(okx, name .. ": .svg is well-formed (" .. why .. ")")
  t.ok(svg and svg:find("float32%[4,"), name .. ": .svg labels carry shapes")
  fl.draw(st, base .. ".png")
  local okp, w, h = png_ok(t.slurp(base .. ".png"))
  t.ok(okp, ("%s: .png signature and size (%sx%s)"):format(name, w, h))
  fl.draw(st, base .. ".pdf")
  t.ok(pdf_ok(t.slurp(base .. ".pdf")), name .. ": .pdf header")
end

-- the extension decides, in any case
fl.draw(p, path("upper.SVG"))
t.ok(xml_balanced(t.slurp(path("upper.SVG"))), "draw: .SVG is SVG too")

-- ---- what the pictures say -------------------------------------------------

-- (a name may come out as <cluster_k5>: agwrite asks aghtmlstr about the
-- names viz/render.c's id map allocates outside cgraph's string pool)
local function clusters(dot) return count(dot, "subgraph%s+[\"<]?cluster_k%d+[\">]?%s*{") end

fl.draw(p, path("mlp-plan.dot"))
t.is(clusters(t.slurp(path("mlp-plan.dot"))), p:stats().kernels, "mlp plan: kernel clusters = p:stats().kernels")
fl.draw(pn, path("net-plan.dot"))
local dotn = t.slurp(path("net-plan.dot"))
t.is(clusters(dotn), pn:stats().kernels, "net plan: kernel clusters = p:stats().kernels")
fl.draw(pu, path("net-unfused.dot"))
local dotu = t.slurp(path("net-unfused.dot"))
t.is(clusters(dotu), pu:stats().kernels, "unfused plan: kernel clusters = kernels")
t.is(dashed_count(dotu), 0, "unfused plan: nothing dashed")
fl.draw(gn, path("net-graph.dot"))
t.is(clusters(t.slurp(path("net-graph.dot"))), 0, "a plain graph has no kernel clusters")

-- Dashed edges: the C tests' rule.  A read of a value computed inside a
-- kernel (p:kernels() nodes) that the plan does not store: no reader
-- outside its kernel and not an output.  Reads go through views no
-- kernel computes to the value they view.
local VIEWS = {reshape = true, view = true, transpose = true, permute = true, unsqueeze = true,
               squeeze = true, expand = true, narrow = true}
local function removed_reads(plan, graph)
  local nodes = graph:nodes()
  local kof = {}
  for ki, kr in ipairs(plan:kernels()) do for _, id in ipairs(kr.nodes) do kof[id] = ki end end
  local function base_of(j)
    while j >= 0 and nodes[j + 1].kind == "op" and not kof[j] and VIEWS[nodes[j + 1].op] do
      j = nodes[j + 1].inputs[1]
    end
    return j
  end
  local stored = {}
  for _, id in ipairs(graph:outputs()) do stored[base_of(id)] = true end
  local reads = {}
  for _, nd in ipairs(nodes) do
    if nd.kind == "op" then
      local folded = not kof[nd.id] and VIEWS[nd.op]
      for _, j in ipairs(nd.inputs) do
        local bj = base_of(j)
        reads[#reads + 1] = bj
        -- a kernel reading it from outside needs it in memory
        if not folded and kof[bj] and kof[bj] ~= kof[nd.id] then stored[bj] = true end
      end
    end
  end
  local n = 0
  for _, bj in ipairs(reads) do if kof[bj] and not stored[bj] then n = n + 1 end end
  return n
end
local want = removed_reads(pn, gn)
t.diag(("net: %d kernels, %d reads of removed intermediates, %d dashed edges"):format(
  pn:stats().kernels, want, dashed_count(dotn)))
t.ok(want > 0, "the net plan removed intermediates")
t.is(dashed_count(dotn), want, "dashed edges = reads of intermediates the plan does not store")

-- pieces: the break is drawn as a cut with its reason
local cutdot = t.slurp(path("compiled_with_a_break.dot"))
t.ok(cutdot:find("item") and cutdot:find("graph break", 1, true), "compiled with a break: the cut names the break")
t.is(count(cutdot, "subgraph%s+[\"<]?cluster_s%d+[\">]?%s*{"), 2, "compiled with a break: two pieces")
local exdot = t.slurp(path("explain_table.dot"))
t.ok(exdot:find("item") ~= nil, "explain table: the cut names the break")

-- options
fl.draw(g, path("lr.dot"), {rankdir = "LR", title = "mlp <b>&", legend = false, edge_labels = false})
local lr = t.slurp(path("lr.dot"))
t.ok(lr:find("rankdir%s*=%s*\"?LR"), "rankdir=LR reaches the picture")
t.ok(lr:find("mlp &lt;b&gt;&amp;", 1, true), "the title is there, escaped")
t.ok(not lr:find("legend"), "legend=false drops the legend")

-- ---- draw_compare ------------------------------------------------------------

t.is(fl.draw_compare(g, p, path("cmp.png")), path("cmp.png"), "draw_compare: Graph vs Plan")
t.ok(png_ok(t.slurp(path("cmp.png"))), "draw_compare: png")
fl.draw_compare(pu, pn, path("cmp.svg"))
local cmp = t.slurp(path("cmp.svg"))
t.ok(xml_balanced(cmp), "draw_compare: Plan vs Plan svg well-formed")
t.ok(cmp:find(("%d kernels"):format(pu:stats().kernels)) and cmp:find(("%d kernels"):format(pn:stats().kernels)),
     "draw_compare: each side titled with its kernels")
t.ok(cmp:find("buffers") and cmp:find("moved"), "draw_compare: buffers and bytes moved on the titles")
fl.draw_compare(k, cm, path("cmp2.dot"))
t.ok(t.slurp(path("cmp2.dot")):find("cluster_s1"), "draw_compare: Program vs compiled function")
t.raises(function() fl.draw_compare(g, cb, path("c.svg")) end, "draw_compare: after is a fl.Compiled of 2 graphs",
         "draw_compare: a side with several graphs is refused")
t.raises(function() fl.draw_compare(g, 7, path("c.svg")) end, "draw_compare: cannot draw after, a number",
         "draw_compare: non-drawable side named")
t.raises(function() fl.draw_compare(g, p, path("c.gif")) end, "draw_compare: .*formats: %.dot %.svg %.png %.pdf",
         "draw_compare: unknown extension named as draw_compare's")

-- a function that recompiled: its versions side by side, not as pieces
local cr = fl.compile(function(v) return (v + 1):relu() end, {backend = "cpu", dynamic = false})
cr(fl.randn(2, 3))
cr(fl.randn(5, 3))
fl.draw(cr, path("recompiled.dot"))
local rdot = t.slurp(path("recompiled.dot"))
t.ok(rdot:find("graph 2 of 2", 1, true) and not rdot:find("graph break", 1, true),
     "recompiled: both versions drawn, no cut between them")

-- ---- bad input -------------------------------------------------------------------

t.raises(function() fl.draw(p, path("x.gif")) end, "unknown picture format.*%.dot %.svg %.png %.pdf",
         "unknown extension: the error lists the formats")
t.raises(function() fl.draw(p, path("noext")) end, "no extension", "no extension: said so")
t.raises(function() fl.draw(p, "/nonexistent/dir/x.svg") end, "/nonexistent/dir/x%.svg",
         "unwritable path: named")
t.raises(function() fl.draw(42, path("x.svg")) end, "cannot draw a number",
         "a number is not drawable")
t.raises(function() fl.draw(mlp, path("x.svg")) end, "fl%.capture%(model, x%)",
         "a module: says to capture it first")
t.raises(function() fl.draw(p, path("x.svg"), {colour = "red"}) end,
         "unknown option 'colour' %(expected rankdir, title, legend, group_modules, max_nodes",
         "bad option key: the known keys listed")
t.raises(function() fl.draw(p, path("x.svg"), {legend = "yes"}) end, "legend must be true or false",
         "option types checked: legend")
t.raises(function() fl.draw(p, path("x.svg"), {max_nodes = 0}) end, "max_nodes must be an integer",
         "option types checked: max_nodes")
t.raises(function() fl.draw(p, path("x.svg"), {rankdir = "XY"}) end, "rankdir \"XY\"",
         "rankdir checked")
t.raises(function() fl.draw(p, path("x.svg"), "LR") end, "options must be a table",
         "options must be a table")
t.raises(function() fl.draw(fl.compile(mlp), path("x.svg")) end, "has not run yet",
         "a compiled function not yet called: says to call it")
t.ok(not io.open(path("x.svg")), "failed draws leave no file behind")

-- ---- empty and large graphs --------------------------------------------------------

local ge = fl.capture(function(v) return v end, x)
fl.draw(ge, path("empty.svg"))
t.ok(xml_balanced(t.slurp(path("empty.svg"))), "empty graph: a valid SVG")
fl.draw(ge, path("empty.png"))
t.ok(png_ok(t.slurp(path("empty.png"))), "empty graph: a valid PNG")

local gpt = fl.models.transformer{vocab = 64, d = 32, heads = 4, layers = 12, seq = 16}
local ids = fl.tensor({{1, 2, 3, 4, 5, 6, 7, 8}}, {dtype = "int64"})
local gg = fl.capture(gpt, ids)
local t0 = fl.now()
fl.draw(gg, path("gpt.svg"), {group_modules = true})
local dt_svg = fl.now() - t0
t0 = fl.now()
fl.draw(gg, path("gpt.png"), {group_modules = true})
local dt_png = fl.now() - t0
local pg = gg:fuse()
t0 = fl.now()
fl.draw(pg, path("gpt-plan.svg"))
local dt_plan = fl.now() - t0
t.diag(("transformer, 12 layers, %d nodes: svg %.3f s, png %.3f s, fused plan svg %.3f s"):format(
  #gg:nodes(), dt_svg, dt_png, dt_plan))
t.ok(dt_svg < 10 and dt_png < 10 and dt_plan < 10, "a 12-layer transformer draws in seconds (design: < 2 s)")
local gsvg = t.slurp(path("gpt.svg"))
t.ok(xml_balanced(gsvg), "transformer: svg well-formed")
t.ok(gsvg:find("blocks.0.attn", 1, true), "group_modules: module clusters by path (blocks.0.attn)")
t.ok(gsvg:find("nodes collapsed", 1, true), "max_nodes: repeated blocks collapsed, and said so")
fl.draw(gg, path("gpt-all.dot"), {max_nodes = false})
t.ok(not t.slurp(path("gpt-all.dot")):find("nodes collapsed", 1, true), "max_nodes=false: nothing collapsed")

-- 5 000 nodes: renders, collapsed to the max_nodes rule
local function long(v)
  for _ = 1, 2500 do v = (v + 1):relu() end
  return v
end
local gl = fl.capture(long, fl.randn(2, 2))
t0 = fl.now()
fl.draw(gl, path("long.svg"), {max_nodes = 200})
t.diag(("%d-node graph: svg in %.3f s"):format(#gl:nodes(), fl.now() - t0))
local lsvg = t.slurp(path("long.svg"))
t.ok(xml_balanced(lsvg) and lsvg:find("nodes collapsed", 1, true), "5 000-node graph: renders, collapsed")
t.ok(count(lsvg, "class=\"node\"") < 400, "5 000-node graph: the picture stays within max_nodes")

-- ---- the report ---------------------------------------------------------------------

-- a parameter whose name is hostile markup (names come from table paths)
local P = {["</script><b>w"] = fl.randn(16, 8)}
local function hostile(v) return (v:matmul(P["</script><b>w"]) + 1):relu():softmax(2) end
local ch = fl.compile(hostile, {backend = "cpu"})
local checklist = {coverage = {supported = 4, total = 4, unsupported = {}}, cold_ms = 120.5,
                   steady_ms = 0.02, eager_ms = 0.05, break_even_calls = 4000, cache_hit_rate = 1,
                   recompiles = 0, max_abs_err = 1e-7, max_rel_err = 2e-7, fallbacks = 0,
                   recommendation = "stable inference: compile <it>"}
t.is(fl.report(ch, path("review.html"), {inputs = {x}, calls = 5, checklist = checklist}),
     path("review.html"), "report: compiled function, returns the path")
local html = t.slurp(path("review.html")) or ""
for _, id in ipairs{"summary", "graphs", "kernels", "decisions", "code", "guards", "breaks",
                    "timings", "checklist", "graph-before", "graph-after"} do
  t.ok(html:find('id="' .. id .. '"', 1, true), "report has #" .. id)
end
t.ok(count(html, "<svg") >= 2, "report: before and after SVGs inline")
t.ok(not html:lower():find("src%s*=%s*[\"']?https?://") and not html:lower():find("href%s*=%s*[\"']?https?://"),
     "report: no src/href to the network")
t.is(count(html, "</script>"), 1, "report: the hostile name never closes the script")
t.ok(html:find("&lt;/script&gt;&lt;b&gt;w", 1, true), "report: the hostile name shown escaped")
t.ok(html:find("compile &lt;it&gt;", 1, true), "report: the checklist's recommendation escaped")
t.ok(html:find("void", 1, true) and html:find('class="ln"', 1, true), "report: generated code with line numbers")
t.ok(html:find("120.5 ms", 1, true), "report: the checklist's cold compile")
t.ok(html:find("steady state", 1, true) and not html:find("steady state (median call)</th><td>\226\128\148", 1, true),
     "report: steady state measured")
t.ok(html:find("same tensor", 1, true), "report: guards listed")
local ktable = html:match('id="kernels".-</table>') or ""
-- a time cell is the only one with a unit of time (the roofline's GFLOP/s
-- and share of roof follow it when the machine's peaks are known)
local _, timed_ms = ktable:gsub('<td class="n">[%d.]+ ms</td>', "")
local _, timed_us = ktable:gsub('<td class="n">[%d.]+ \194\181s</td>', "")
local timed = timed_ms + timed_us
local _, krows = ktable:gsub("<tr><td class=\"n\">%d+</td>", "")
t.ok(krows >= 2 and timed == krows + 1, ("report: every kernel timed while the inputs ran (%d kernels; %d times with the total)"):format(krows, timed))

fl.report(cb, path("review-break.html"))
local hb = t.slurp(path("review-break.html")) or ""
t.ok(hb:find("item() needs a concrete value", 1, true), "report: the graph break's reason listed")
t.ok(hb:find("g2 ", 1, true), "report: kernels of both graphs, tagged with their graph")
t.ok(not (hb:match('id="kernels".-</table>') or ""):find("\226\128\148</td></tr>", 1, true),
     "report: without inputs, kernel times are the means of the calls already made (no dash)")

fl.report(p, path("plan.html"), {inputs = {x}, calls = 3, title = "plan <review>"})
local hp = t.slurp(path("plan.html")) or ""
t.ok(hp:find("plan &lt;review&gt;", 1, true), "report: a plan, with its title escaped")
t.ok(hp:find('id="code"', 1, true) and hp:find("fused_linear", 1, true), "report: a plan's code generated")
t.ok(count(hp, "<svg") >= 2, "report: a plan's graphs")
fl.report(gn, path("graph.html"))
t.ok((t.slurp(path("graph.html")) or ""):find("cluster_k0", 1, true), "report: a graph, planned for the report")
fl.report(k, path("program.html"))
t.ok((t.slurp(path("program.html")) or ""):find('id="kernels"', 1, true), "report: a program")

t.raises(function() fl.report(cm, "/nonexistent/dir/r.html") end, "/nonexistent/dir/r%.html",
         "report: unwritable path named")
t.raises(function() fl.report(3, path("r.html")) end, "cannot report on a number", "report: a number refused")
t.raises(function() fl.report(cm, path("r.html"), {imputs = {x}}) end, "unknown option 'imputs'",
         "report: bad option key")
t.raises(function() fl.report(cm, path("r.html"), {inputs = x}) end, "inputs must be a list",
         "report: inputs must be a list")
t.raises(function() fl.report(fl.compile(mlp), path("r.html")) end, "has not run yet",
         "report: a compiled function not yet called")
t.raises(function() fl.report(fl.compile(mlp), path("r.html"), {inputs = {fl.randn(3, 3)}}) end,
         "timing the compiled function on opts.inputs failed",
         "report: inputs of the wrong shape: the timing names what failed")

-- a piece of a big graph: one kernel, a node's neighbourhood, one block;
-- the weights box of a fused plan
do
  local gpt = fl.models.transformer{vocab = 64, d = 32, heads = 4, layers = 4, seq = 16}
  local g = fl.capture(gpt, (fl.rand(1, 8) * 64):to("int64"))
  local dir = t.tmpdir()
  fl.draw(g, dir .. "/b2.dot", {block = 2, leaves = "boxes"})
  local dot = t.slurp(dir .. "/b2.dot")
  t.ok(dot:find("blocks.2.attn.q_proj.weight", 1, true) and not dot:find("blocks.1.attn.q_proj.weight", 1, true)
       and dot:find("ops before this piece", 1, true) and dot:find("ops after", 1, true),
       "block = 2: block 2's nodes, the rest as two stubs")
  fl.draw(g, dir .. "/b2i.dot", {block = 2})
  local inl = t.slurp(dir .. "/b2i.dot")
  t.ok(inl:find("\xe2\x80\xa6q_proj.weight [32,32]", 1, true) and not inl:find("blocks.2.attn.q_proj.weight", 1, true)
       and #inl < #dot, "a piece draws the weights an op reads in its box, by their last two names")
  local p = g:decompose{quiet = true}:optimize{quiet = true}:fuse()
  fl.draw(p, dir .. "/k3.dot", {kernel = 3})
  local k3 = t.slurp(dir .. "/k3.dot")
  local ks = p:kernels()
  t.ok(k3:find("kh3", 1, true) and not k3:find("kh4 ", 1, true) and k3:find(ks[4].name, 1, true),
       "kernel = 3: that kernel's frame, no other")
  fl.draw(g, dir .. "/a.dot", {around = 20, depth = 1})
  local a = t.slurp(dir .. "/a.dot")
  t.ok(a:find("%%20") and a:find("a piece: %%20 and 1 step around it"), "around = 20: the node and its neighbours")
  t.raises(function() fl.draw(p, dir .. "/x.dot", {kernel = 999}) end, "no kernel named k999",
           "an unknown kernel is named")
  t.raises(function() fl.draw(g, dir .. "/x.dot", {block = 2, kernel = 1}) end, "give one of them",
           "two pieces at once are refused")
  local cnn = nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8), nn.ReLU()):eval()
  local cp = fl.capture(cnn, fl.randn(1, 3, 16, 16)):decompose{quiet = true}:optimize{quiet = true}:fuse()
  fl.draw(cp, dir .. "/w.dot")
  t.ok(t.slurp(dir .. "/w.dot"):find("computed from weights, once: %d+ ops"),
       "a batch norm folded into the convolution's weights: one 'computed from weights' box")
  fl.draw(cp, dir .. "/w2.dot", {weights = false})
  t.ok(not t.slurp(dir .. "/w2.dot"):find("computed from weights", 1, true), "weights = false: each kernel drawn")
end

t.done()
