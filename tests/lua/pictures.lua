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
  fl.draw(g:decompose{quiet = true}:fuse{fuse = false}, path("why.dot"))
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

-- Projector: the smallest text inside a node, in pixels, when the picture
-- is shown 1920 pixels wide (a PNG narrower than that is shown as it is).
-- The SVG gives the sizes in points and the width they scale with; the
-- PNG's header its pixel width.
local function png_width(file)
  local f = assert(io.open(file, "rb")); local h = f:read(24); f:close()
  return (string.unpack(">I4", h, 17))
end
local function smallest_node_px(svg_file, png_file)
  local svg = t.slurp(svg_file)
  local wpt = tonumber(svg:match('<svg width="([%d.]+)pt"'))
  local px = math.min(1920, png_width(png_file)) / wpt
  local smallest = math.huge
  for body in svg:gmatch('<g id="[^"]*" class="node">(.-)</g>') do
    for fs in body:gmatch('font%-size="([%d.]+)"') do smallest = math.min(smallest, tonumber(fs) * px) end
  end
  return smallest, wpt
end
do
  local src = os.getenv("FUSELAB_SRC") or "."
  local gpt = fl.models.transformer{vocab = 64, d = 64, heads = 4, layers = 2, seq = 64}
  local gp = fl.capture(gpt, fl.zeros({1, 32}, {dtype = "int64"})):decompose{quiet = true}:optimize{quiet = true}:fuse()
  local m = fl.load_onnx(src .. "/examples/models/resnet50.onnx")
  local rp = fl.capture(m, fl.randn(1, 3, 224, 224)):decompose{quiet = true}:optimize{quiet = true}:fuse()
  local piece
  for i, k in ipairs(rp:kernels()) do
    if not piece and k.name:find("conv2d_add_relu", 1, true) then piece = i - 1 end
  end
  for _, c in ipairs{{"lesson 04's GPT block", gp, {block = 1}}, {"lesson 08's ResNet-50 kernel", rp, {kernel = piece}}} do
    for _, ext in ipairs{"svg", "png"} do
      local o = {scale = "projector", title = c[1]}
      for k, v in pairs(c[3]) do o[k] = v end
      fl.draw(c[2], path("proj." .. ext), o)
    end
    local px, wpt = smallest_node_px(path("proj.svg"), path("proj.png"))
    t.ok(px >= 14, ("%s at projector scale: node text at least 14 px on a 1920-px-wide screen (%.1f px; %d pt wide)")
         :format(c[1], px, wpt))
  end
  -- the same GPT block with every weight a box of its own is too wide: the
  -- check above can fail
  fl.draw(gp, path("boxes.svg"), {block = 1, scale = "projector", leaves = "boxes"})
  fl.draw(gp, path("boxes.png"), {block = 1, scale = "projector", leaves = "boxes"})
  local px = smallest_node_px(path("boxes.svg"), path("boxes.png"))
  t.ok(px < 14, ("leaves = \"boxes\": the weights beside their readers make the block too wide (%.1f px)"):format(px))
  t.raises(function() fl.draw(gp, path("x.svg"), {leaves = "hidden"}) end,
           'draw: leaves "hidden" %(expected "inline" or "boxes"%)', "an unknown leaves= names the choices")
end

t.done()
