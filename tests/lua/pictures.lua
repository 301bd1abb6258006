-- pictures.lua -- what a picture says, read from its Graphviz source:
-- kernel titles on a row of their own (the underscores of a name never
-- touch the line below), "graph N of M" apart from its label, a broadcast
-- coloured only when it re-reads something big, edges to collapsed nodes
-- drawn unlike fused intermediates and named in the legend, and the
-- projector scale.
local fl = fl or require "fuselab"
local t = require "tap"

fl.manual_seed(3)

local dir = t.tmpdir()
local function path(name) return dir .. "/" .. name end
-- the attribute list of graph node n<id> that carries its label
local function node_attrs(dot, id)
  return dot:match("%sn" .. id .. "%s+%[(.-)%];\n") or ""
end

local ELEM, BCAST = "#d8f0d8", "#fdf0c2"

-- kernel titles: a table row each, never a <br/> under the name
do
  local g = fl.capture(function(x) return (x * 2):relu():exp() end, fl.randn(8, 16))
  fl.draw(g:fuse(), path("k.dot"))
  local dot = t.slurp(path("k.dot"))
  local h = dot:match("%skh0%s+%[label=<(.-)>,") or ""
  t.ok(h:find("<tr><td><font point%-size=\"11\"><b>fused_mul_relu_exp_8x16</b></font></td></tr><tr><td>"),
       "the kernel's name sits in a table row of its own")
  t.ok(not h:find("<br/>", 1, true), "no line break under the kernel's name")
end

-- graph N of M: a separator the SVG keeps
do
  local function f(x)
    local y = x:relu()
    if y:sum():item() > 0 then return y * 2 end
    return y
  end
  local cm = fl.compile(f)
  cm(fl.randn(4, 4))
  fl.draw(cm, path("pieces.dot"))
  local dot = t.slurp(path("pieces.dot"))
  t.ok(dot:find("<b>graph 1 of 2</b>&#160;\xc2\xb7&#160;fused", 1, true),
       "\"graph 1 of 2\" and its label are kept apart by a no-break space and a dot")
end

-- broadcast: only when an operand of 16 KiB or more is re-read per slice
do
  -- x [2,4,128,128] + mask [128,128] (64 KiB re-read for each of 8 heads);
  -- x + rowv [2,4,128,1] (a per-row value, read once); a bias vector
  local x, mask = fl.randn(2, 4, 128, 128), fl.randn(128, 128)
  local rowv, bias = fl.randn(2, 4, 128, 1), fl.randn(128)
  local g = fl.capture(function(a, m, r, b) return a + m, a + r, a:sum(-1) + b end, x, mask, rowv, bias)
  fl.draw(g, path("bc.dot"), {edge_labels = false})
  local dot = t.slurp(path("bc.dot"))
  local ids = {}
  for id in tostring(g):gmatch("%%(%d+) = add%(") do ids[#ids + 1] = tonumber(id) end
  t.is(#ids, 3, "three adds captured")
  t.ok(node_attrs(dot, ids[1]):find("fillcolor=\"" .. BCAST .. "\"", 1, true),
       "a [128,128] mask added to every head is a broadcast")
  t.ok(node_attrs(dot, ids[2]):find("fillcolor=\"" .. ELEM .. "\"", 1, true),
       "a per-row value used along its row is elementwise")
  t.ok(node_attrs(dot, ids[3]):find("fillcolor=\"" .. ELEM .. "\"", 1, true),
       "a bias vector re-read along the rows is elementwise")
  t.ok(dot:find("broadcast (re-reads 16 KiB or more)", 1, true), "the legend states the rule")
  local m = fl.models.mlp{sizes = {64, 256, 64}}:eval()
  local gm = fl.capture(m, fl.randn(32, 64)):decompose{quiet = true}
  fl.draw(gm, path("mlp.dot"))
  t.ok(not t.slurp(path("mlp.dot")):find(BCAST, 1, true), "an MLP's bias adds are not drawn as broadcasts")
end

-- collapsed nodes: their edges are thick, grey, open-headed, in the legend
do
  local gpt = fl.models.transformer{vocab = 32, d = 16, heads = 2, layers = 6, seq = 8}:eval()
  local g = fl.capture(gpt, fl.tensor({{1, 2, 3}}, {dtype = "int64"}))
  local p = g:decompose{quiet = true}:optimize{quiet = true}:fuse()
  fl.draw(p, path("coll.dot"), {max_nodes = 60})
  local dot = t.slurp(path("coll.dot"))
  t.ok(dot:find("nodes collapsed", 1, true), "the GPT picture collapses repeated blocks")
  t.ok(dot:find("arrowhead=empty", 1, true) and dot:find("color=\"#a0a0a0\"", 1, true) and
       not dot:find("style=dotted", 1, true), "edges to collapsed nodes: thick grey, open arrowheads")
  t.ok(dot:find("edges into or out of collapsed nodes", 1, true) and
       dot:find("intermediate kept in the kernel", 1, true),
       "the legend tells collapsed edges from fused intermediates")
end

-- a plan that moves more than the captured graph says why on its picture
do
  local g = fl.capture(fl.models.mlp{sizes = {16, 32, 8}}:eval(), fl.randn(4, 16))
  fl.draw(g:decompose{quiet = true}:fuse(), path("why.dot"))
  t.ok(t.slurp(path("why.dot")):find("this plan moves", 1, true), "a single plan's picture says why it moves more")
end

-- projector scale
do
  local g = fl.capture(function(x) return x:exp() end, fl.randn(4))
  fl.draw(g, path("n.dot"))
  fl.draw(g, path("p.dot"), {scale = "projector"})
  fl.draw(g, path("s.dot"), {scale = 2})
  local n, p, s = t.slurp(path("n.dot")), t.slurp(path("p.dot")), t.slurp(path("s.dot"))
  t.ok(n:find("fontsize=10", 1, true) and p:find("fontsize=17.5", 1, true) and
       s:find("fontsize=20", 1, true), "scale sets the type size (projector: 1.75x)")
  t.ok(p:find("point-size=\"16\"", 1, true) or p:find("point-size=\"14\"", 1, true),
       "labels' own sizes scale too")
  t.raises(function() fl.draw(g, path("x.dot"), {scale = "huge"}) end,
           "draw: scale \"huge\" %(expected \"projector\", \"normal\" or a number from 0.25 to 4%)",
           "an unknown scale names the choices")
  t.raises(function() fl.draw(g, path("x.dot"), {scale = 9}) end, "from 0.25 to 4",
           "a scale out of range is refused")
end

t.done()
