-- costmodel.lua -- one cost model in every view.  For an MLP, a
-- transformer block, a CNN and a GPT with repeated blocks, the bytes moved
-- and the peak memory read the same in p:stats(), the plan listing,
-- p:kernels(), the picture clusters, the compare picture (whose "before"
-- is the captured graph run op by op, g:stats()) and the report; the
-- compiled plan never moves more than the captured graph.  Then the
-- fusion decisions: in graph order, none "already in one kernel", and a
-- residual add refused as a matmul epilogue for the reduction it joined.
local fl = fl or require "fuselab"
local t = require "tap"

fl.manual_seed(5)

local dir = t.tmpdir()
local function path(name) return dir .. "/" .. name end

-- fuse_bytes_str's format: three significant digits at most
local function human(b)
  if b < 1024 then return ("%d B"):format(b) end
  local units, v, u = {"B", "KiB", "MiB", "GiB", "TiB"}, b, 1
  while v >= 1024 and u < 5 do v = v / 1024; u = u + 1 end
  if v >= 100 or v == math.floor(v) then return ("%.0f %s"):format(v, units[u]) end
  if v >= 10 then return ("%.1f %s"):format(v, units[u]) end
  return ("%.2g %s"):format(v, units[u])
end

-- "1.5 KiB" back to bytes (for sums of cluster labels: each is rounded)
local function parse(s)
  local v, u = s:match("^([%d.]+) (%a+)$")
  local mul = {B = 1, KiB = 1024, MiB = 1024 ^ 2, GiB = 1024 ^ 3}
  return tonumber(v) * mul[u]
end

local models = {
  {"mlp", fl.models.mlp{sizes = {64, 256, 64}}:eval(), fl.randn(32, 64)},
  {"transformer block", nn.TransformerBlock(64, 4):eval(), fl.randn(2, 16, 64)},
  {"cnn", fl.models.cnn{channels = {3, 8, 16}, classes = 10, input = 16}:eval(),
   fl.randn(2, 3, 16, 16)},
  {"gpt", fl.models.transformer{vocab = 64, d = 32, heads = 2, layers = 3, seq = 16}:eval(),
   fl.tensor({{1, 2, 3, 4, 5, 6, 7, 8}}, {dtype = "int64"})},
}

for _, m in ipairs(models) do
  local name, model, x = m[1], m[2], m[3]
  local g = fl.capture(model, x)
  local p = g:decompose{quiet = true}:optimize{quiet = true}:fuse()
  local s, gs = p:stats(), g:stats()
  -- the "before" is the captured graph op by op
  t.is(s.bytes_before, gs.bytes, name .. ": plan's before = the captured graph's bytes")
  t.is(s.peak_bytes_before, gs.peak_bytes, name .. ": plan's peak before = the captured graph's")
  t.ok(s.bytes_after <= s.bytes_before,
       ("%s: fused moves no more than op by op (%d <= %d)"):format(name, s.bytes_after, s.bytes_before))
  t.ok(s.peak_bytes_after <= s.peak_bytes_before,
       ("%s: fused needs no more memory at its peak than op by op (%d <= %d)"):format(name, s.peak_bytes_after, s.peak_bytes_before))
  -- p:kernels() and the listing
  local sum = 0
  for _, k in ipairs(p:kernels()) do sum = sum + k.bytes end
  t.is(sum, s.bytes_after, name .. ": p:kernels() bytes add up to bytes_after")
  local listing = tostring(p)
  t.ok(listing:find("traffic " .. human(s.bytes_before) .. " -> " .. human(s.bytes_after), 1, true) and
       listing:find("peak " .. human(s.peak_bytes_before) .. " -> " .. human(s.peak_bytes_after), 1, true),
       name .. ": the listing shows the same traffic and peak")
  -- each cluster of the picture shows its kernel's bytes
  fl.draw(p, path(name .. ".dot"), {max_nodes = false, weights = false})   -- every kernel framed
  local dot = t.slurp(path(name .. ".dot"))
  local agree, n = true, 0
  for i, k in ipairs(p:kernels()) do
    local r, w = dot:match("%skh" .. (i - 1) .. "%s+%[label=<[^\n]-read ([%d.]+ %a+) \xc2\xb7 wrote ([%d.]+ %a+)")
    n = n + 1
    -- each label has two or three significant digits
    if not r or math.abs(parse(r) + parse(w) - k.bytes) > 0.03 * k.bytes then agree = false end
  end
  t.ok(agree and n > 0, name .. ": every cluster's read + wrote is its kernel's bytes")
  -- the compare picture: before from the captured graph, after from the plan
  fl.draw_compare(g, p, path(name .. "-cmp.dot"))
  local cmp = t.slurp(path(name .. "-cmp.dot"))
  t.ok(cmp:find(human(s.bytes_before) .. " moved", 1, true) and
       cmp:find(human(s.bytes_after) .. " moved", 1, true),
       name .. ": the compare picture shows the same bytes before and after")
  -- the report
  fl.report(p, path(name .. ".html"))
  local html = t.slurp(path(name .. ".html"))
  local arrow = " \xe2\x86\x92 "
  t.ok(html:find(human(s.bytes_before) .. arrow .. human(s.bytes_after), 1, true) and
       html:find(human(s.peak_bytes_before) .. arrow .. human(s.peak_bytes_after), 1, true),
       name .. ": the report's bytes moved and peak memory are the plan's")
  -- the compiled function: its plan, cm:kernels(), cm:explain(), its report
  local cm = fl.compile(model)
  cm(x)
  local cs = cm:plans()[1]:stats()
  t.is({cs.bytes_before, cs.bytes_after, cs.peak_bytes_before, cs.peak_bytes_after},
       {s.bytes_before, s.bytes_after, s.peak_bytes_before, s.peak_bytes_after},
       name .. ": fl.compile plans what decompose, optimize, fuse plan")
  local ksum = 0
  for _, k in ipairs(cm:kernels()) do ksum = ksum + k.bytes end
  t.is(ksum, s.bytes_after, name .. ": cm:kernels() bytes add up to the plan's")
  local said, print0 = {}, print
  print = function(v) said[#said + 1] = tostring(v) end
  cm:explain()
  print = print0
  said = table.concat(said, "\n")
  t.ok(said:find("bytes moved " .. human(s.bytes_before) .. " -> " .. human(s.bytes_after) ..
                 ", peak memory " .. human(s.peak_bytes_before) .. " -> " .. human(s.peak_bytes_after), 1, true),
       name .. ": cm:explain() says the same bytes and peak")
  fl.report(cm, path(name .. "-cm.html"))
  html = t.slurp(path(name .. "-cm.html"))
  t.ok(html:find(human(s.bytes_before) .. arrow .. human(s.bytes_after), 1, true) and
       html:find(human(s.peak_bytes_before) .. arrow .. human(s.peak_bytes_after), 1, true),
       name .. ": the compiled function's report says the same")
end

-- decompose() splits linear into matmul + add; fuse plans it as the
-- linear it was (the bias added by the library call), and says so.  A
-- plan that moves more than the captured graph says why: fusion off on
-- the decomposed graph runs every primitive as its own kernel.
do
  local model = fl.models.mlp{sizes = {64, 256, 64}}:eval()
  local g = fl.capture(model, fl.randn(32, 64))
  local p = g:decompose{quiet = true}:fuse()
  local s = p:stats()
  t.ok(s.bytes_after <= s.bytes_before and s.note == nil and
       tostring(p):find("planned as linear %(ids of the graph given%):\n%%%d+ add: matmul%(x, transpose%(w%)%) %+ b = linear%(x, w, b%)"),
       ("decomposed, not optimized: planned as linear, no more bytes (%d <= %d)"):format(s.bytes_after, s.bytes_before))
  local q = g:decompose{quiet = true}:fuse{fuse = false}
  s = q:stats()
  t.ok(s.bytes_after > s.bytes_before and s.note and s.note:find("fusion is off", 1, true) and
       tostring(q):find("note: this plan moves", 1, true),
       "decomposed, fusion off: the plan says why it moves more")
  fl.draw_compare(g, q, path("note.dot"))
  t.ok(t.slurp(path("note.dot")):find("fusion is off", 1, true), "the compare picture says why too")
end

-- the invariant: for every pass order a student can call and fl.compile,
-- the fused plan moves no more bytes and needs no more memory at its peak
-- than the captured graph op by op
do
  local orders = require "pass_orders"
  for _, m in ipairs(models) do
    local name, model, x = m[1], m[2], m[3]
    local bad = orders.check(fl.capture(model, x))
    local cm = fl.compile(model)
    cm(x)
    bad[#bad + 1] = orders.worse("fl.compile", cm:plans()[1]:stats())
    t.ok(#bad == 0, name .. ": every pass order and fl.compile move no more bytes and peak no higher " ..
         "than the captured graph op by op" .. (#bad > 0 and " (" .. table.concat(bad, "; ") .. ")" or ""))
  end
end

-- an epilogue is stored over its product only when it reads it element
-- for element: one that transposes the product (a square one, the same
-- shape) must keep its own buffer, as a graph output and as an
-- intermediate; one that does read it so computes the same values in the
-- product's memory.  Compiled against eager, 1e-4 relative.
do
  local bad = {}
  for _, n in ipairs{16, 33} do
    local w, b, x = fl.randn(n, n), fl.randn(n), fl.randn(n, n)
    local fs = {
      {"transposed, an output", function(x) return fl.matmul(x, w):transpose(1, 2) + 1 end},
      {"transposed, then a product", function(x) return fl.matmul(fl.relu(fl.matmul(x, w):transpose(1, 2) + 1), w) end},
      {"in place", function(x) return fl.matmul(fl.relu(fl.matmul(x, w) + b), w) end},
      {"in place, an output", function(x) return fl.relu(fl.matmul(x, w) + b) * 2 end},
    }
    for _, f in ipairs(fs) do
      local want, got = f[2](x), fl.capture(f[2], x):fuse():codegen("cpu"):run(x)
      if not fl.allclose(got, want, 1e-4, 1e-4) then bad[#bad + 1] = ("%s, %d"):format(f[1], n) end
    end
  end
  t.ok(#bad == 0, "epilogues over their product or not, as they read it: compiled equals eager" ..
       (#bad > 0 and " (not: " .. table.concat(bad, "; ") .. ")" or ""))
end

-- the same for a training step: the joint graph, and its forward and
-- backward as each policy splits them (an MLP with GELU, a GPT, a CNN
-- with BatchNorm in training)
do
  local orders = require "pass_orders"
  fl.manual_seed(3)
  local mlp = nn.Sequential(nn.Linear(64, 256), nn.GELU(), nn.Linear(256, 10))
  local gpt = fl.models.transformer{vocab = 64, d = 32, heads = 2, layers = 2, seq = 16}:eval()
  local cnn = fl.models.cnn{channels = {3, 8, 16}, classes = 10, input = 16}
  local cases = {
    {"MLP", mlp, fl.randn(32, 64), (fl.rand(32) * 10):to("int64"), 10},
    {"GPT", gpt, (fl.rand(2, 16) * 64):to("int64"), (fl.rand(2, 16) * 64):to("int64"), 64},
    {"CNN", cnn, fl.randn(4, 3, 16, 16), (fl.rand(4) * 10):to("int64"), 10},
  }
  for _, c in ipairs(cases) do
    local m, V = c[2], c[5]
    local j = fl.capture(function(a, b) return fl.cross_entropy(m(a):reshape(-1, V), b:reshape(-1)) end,
                         c[3], c[4]):joint()
    local bad = {}
    for _, b in ipairs(orders.check(j)) do bad[#bad + 1] = "joint " .. b end
    for _, pol in ipairs{"save_all", "mincut", "recompute_all"} do
      local fw, bw = j:partition{policy = pol}
      for _, half in ipairs{{"forward", fw}, {"backward", bw}} do
        for _, b in ipairs(orders.check(half[2])) do bad[#bad + 1] = pol .. " " .. half[1] .. " " .. b end
      end
    end
    t.ok(#bad == 0, c[1] .. " training step: the joint graph and every policy's forward and backward " ..
         "keep the promise in every pass order" .. (#bad > 0 and " (" .. table.concat(bad, "; ") .. ")" or ""))
  end
end

-- a fusion that would raise the peak above the captured graph's is not
-- taken, and its decision says so with both peaks: the subtraction after
-- a sum over the batch, fused with it, would write the result while the
-- normalized input is still alive (op by op that input dies first)
do
  local function f(x, y)
    local s = fl.rms_norm(x, {1023}):sum(1)
    return s - y, fl.softmax(s, 1)
  end
  local x, y = fl.randn(3, 1023), fl.randn(1)
  local g = fl.capture(f, x, y)
  local p = g:fuse()
  local s = p:stats()
  local said
  for _, d in ipairs(p:decisions()) do
    if d.memory and not d.fused and d.bytes_saved == 0 and
       d.reason:find("the plan with it needs [%d.]+ %a+ at its peak %(while k%d+ [%w_]+ runs%), " ..
                     "above the captured graph's [%d.]+ %a+; without it, [%d.]+ %a+") then
      said = d
    end
  end
  t.ok(said and s.peak_bytes_after <= s.peak_bytes_before,
       ("a fusion that raises the peak is refused with both peaks (%s); peak %d -> %d"):format(
         said and said.reason or "no such decision", s.peak_bytes_before, s.peak_bytes_after))
  local a, b = p:codegen("cpu"):run(x, y)
  local wa, wb = g:run_reference(x, y)
  t.ok(fl.allclose(a, wa, 1e-4, 1e-4) and fl.allclose(b, wb, 1e-4, 1e-6),
       "the plan without that fusion still computes the graph (1e-4 relative)")
end

-- decisions: graph order, no non-decisions, the true reason for a
-- residual add that joined a layer_norm first
do
  local g = fl.capture(nn.TransformerBlock(64, 4):eval(), fl.randn(2, 16, 64))
  local p = g:decompose{quiet = true}:optimize{quiet = true}:fuse()
  local ds = p:decisions()
  local ordered, already, wrong, named = true, false, false, false
  for i, d in ipairs(ds) do
    if i > 1 and (d.b < ds[i - 1].b or (d.b == ds[i - 1].b and d.a < ds[i - 1].a)) then ordered = false end
    if d.reason:find("already in one kernel", 1, true) then already = true end
    if d.reason:find("a reduction cannot be the epilogue", 1, true) then wrong = true end
    if d.reason:find("%(add%) already runs in one kernel with the reduction %%%d+ %(mean") then named = true end
  end
  t.ok(#ds > 10 and ordered, "decisions are listed in graph order (by consumer)")
  t.ok(not already, "no pair already in one kernel is listed as a decision")
  t.ok(not wrong and named, "a residual add is refused for the reduction it joined, named")
  -- fuse{explain=true} prints the listing with its decisions
  local listing, print0 = {}, print
  print = function(s) listing[#listing + 1] = tostring(s) end
  g:decompose{quiet = true}:optimize{quiet = true}:fuse{explain = true}
  print = print0
  listing = table.concat(listing, "\n")
  t.ok(listing:find("decisions:", 1, true) and listing:find("\n  fused %3 (mean", 1, true) and
       not listing:find("fused%s+fused"), "the explain listing says each decision once, not \"fused fused\"")
end

-- ---- one count, one sum.  Nodes, ops and kernels as doc/API.md's
-- "Counting" defines them, checked against independent paths: the
-- planned graph op by op is a plan with fusion off; what the bytes line
-- says by cause adds up and names the planned graph's own traffic.
do
  local src = os.getenv("FUSELAB_SRC") or "."
  local m = fl.load_onnx(src .. "/examples/models/resnet50.onnx")
  local g = fl.capture(m, fl.randn(1, 3, 224, 224))
  local gs = g:stats()
  t.is(gs.nodes, gs.ops + gs.inputs + gs.params + gs.consts, "ResNet-50: nodes = ops + inputs + weights + constants")
  local views = 0
  for _, nd in ipairs(g:nodes()) do
    if nd.kind == "op" and nd.view then views = views + 1 end
  end
  local go = g:decompose{quiet = true}:optimize{quiet = true}
  local p = go:fuse()
  local s = p:stats()
  t.is(s.kernels_before, gs.ops - views, "ResNet-50: kernels before = its ops less its views")
  local view_outputs = 0
  for _, id in ipairs(g:outputs()) do if g:nodes()[id + 1].view then view_outputs = view_outputs + 1 end end
  t.is(s.kernels_before + view_outputs, #g:fuse{fuse = false}:kernels(),
       "ResNet-50: a plan with fusion off launches the kernels before, plus a copy per output that is a view")
  t.is(s.nodes, go:stats().nodes, "p:stats().nodes counts its graph's nodes as g:stats() does")
  t.is(s.ops, go:stats().ops, "p:stats().ops counts its graph's ops as g:stats() does")
  t.is(s.kernels, #p:kernels(), "p:stats().kernels = #p:kernels()")
end
for _, case in ipairs{
  {"tour model, decompose():fuse()", function(g) return g:decompose{quiet = true} end},
  {"tour model, decompose():optimize():fuse()", function(g) return g:decompose{quiet = true}:optimize{quiet = true} end},
  {"tour model, fuse()", function(g) return g end},
} do
  local nn = fl.nn
  fl.manual_seed(0)
  local model = nn.Sequential(nn.Linear(64, 256), nn.GELU(), nn.Linear(256, 64), nn.LayerNorm(64))
  local gp = case[2](fl.capture(model, fl.randn(64, 64)))
  local p = gp:fuse()
  local s = p:stats()
  local by = s.bytes_saved_by
  local sum = 0
  for _, d in ipairs(p:decisions()) do if d.fused then sum = sum + d.bytes_saved end end
  t.is(by.decisions, sum, case[1] .. ": by cause, decisions = the fused decisions' bytes_saved summed")
  -- fuse plans a decomposed linear as linear, as optimize's fold_linear does
  local planned = tostring(p):find("planned as linear", 1, true) and
                  gp:optimize{rules = {"fold_linear", "dce"}, quiet = true} or gp
  t.is(by.passes, planned:fuse{fuse = false}:stats().bytes_after - s.bytes_before,
       case[1] .. ": by cause, passes = the planned graph op by op less the captured graph's bytes")
  t.is(by.decisions + by.shared_reads - by.passes, s.bytes_before - s.bytes_after,
       case[1] .. ": the causes add up to the bytes line")
  local listing = tostring(p)
  if by.decisions ~= s.bytes_before - s.bytes_after then
    t.ok(by.text and listing:find("bytes saved, by cause: " .. by.text, 1, true),
         case[1] .. ": the decisions do not sum to the bytes line, and the listing says why")
    local html = path("causes.html")
    fl.report(p, html)
    local f = assert(io.open(html)); local doc = f:read("a"); f:close()
    t.ok(doc:find("bytes saved, by cause", 1, true), case[1] .. ": so does the report's summary")
  else
    t.ok(not by.text and not listing:find("by cause", 1, true), case[1] .. ": the decisions sum to the bytes line, nothing to explain")
  end
end

t.done()
