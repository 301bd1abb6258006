-- Lesson 08: a real network from ONNX, through the whole pipeline.
--
-- Claim (this lesson's; the pipeline is doc/DESIGN.md §1, models come in
-- through fl.load_onnx, §2): what the earlier lessons showed on small
-- functions holds on a network people really deploy.  ResNet-50 exported
-- to ONNX is captured into one graph, the passes simplify it (batch norm
-- folded into the convolutions), fusion cuts its kernel launches, its
-- memory traffic and its peak memory (never raising either: the seed's
-- third conclusion), and the compiled program gives the eager answer.
--
-- What it measures: ResNet-50 from ONNX (examples/models/resnet50.onnx:
-- the real architecture, 53 convolutions, weights made by a small seeded
-- generator in the file, which fuselab runs once at load; its output
-- depends on its input, so comparing compiled with eager can fail; see
-- examples/models/README).  Ops at each stage, kernels, bytes moved and peak
-- memory before and after fusion (one cost model: the captured graph run op
-- by op is the "before"; resnet50/memory.png draws both curves), the fusion decisions grouped by reason, pictures and a review
-- report written to resnet50/, and eager against compiled: the outputs
-- compared and both timed (medians with their spread).
--
-- Run: fuselab examples/lessons/08_real_network_from_onnx.lua   (about 15 s)

local fl = fl or require "fuselab"

local here = (arg and arg[0] or ""):match("^(.*)/[^/]*$") or "."
local path = here .. "/../models/resnet50.onnx"
if not io.open(path) then path = (os.getenv("FUSELAB_SRC") or ".") .. "/examples/models/resnet50.onnx" end

fl.manual_seed(8)
local m = fl.load_onnx(path)
print(m)
local x = fl.randn(1, 3, 224, 224)

-- 1. Capture: the module's forward runs once under the tracer.
local g = fl.capture(m, x)
local gs = g:stats()
print(("\n1. captured: one graph, no graph break: %d nodes = %d ops + %d inputs and weights")
  :format(gs.nodes, gs.ops, gs.inputs + gs.params + gs.consts))

-- 2. Passes: decompose the composites, then optimize (constants, batch
-- norm into the convolution weights, matmul + add into linear, dead code).
-- Each returns its log; quiet keeps the hundreds of lines off the screen.
local gd = g:decompose{quiet = true}
local go, log = gd:optimize{quiet = true}
local kinds = {}
for line in log:gmatch("[^\n]+") do
  local k = line:match("folded into conv2d's weights") and "batch norm / scale folded into a convolution's weights"
    or line:match("folded into conv2d's result") and "batch norm / scale applied to a convolution's (smaller) result"
    or line:match("= linear") and "matmul + bias made one linear"
    or line:match("dce") and "dead code removed" or "other simplifications"
  kinds[k] = (kinds[k] or 0) + 1
end
print(("2. after decompose: %d ops; after optimize: %d ops:"):format(gd:stats().ops, go:stats().ops))
local by_count = {}
for k in pairs(kinds) do by_count[#by_count + 1] = k end
table.sort(by_count, function(a, b) return kinds[a] > kinds[b] or (kinds[a] == kinds[b] and a < b) end)
for _, k in ipairs(by_count) do print(("   %5d  %s"):format(kinds[k], k)) end
print("   optimize adds ops: the folded weights are computed in the graph from the")
print("   parameters, which stay bound by reference (a weight changed in place is seen);")
print("   a compiled program computes them once and keeps them until a weight changes,")
print("   memory the plan holds from its first step; where a conv's result is smaller")
print("   than its weights, the result is scaled instead")

-- 3. Fusion, with the planner's reason for every pair it looked at.
local p = go:fuse()
local s = p:stats()
local MiB = 1024 * 1024
print(("3. fused: %d kernels, where the captured graph run op by op launches %d"):format(s.kernels, s.kernels_before))
print(("   (its %d ops less %d views, which move no data);"):format(gs.ops, gs.ops - s.kernels_before))
print(("   bytes moved %.1f MiB -> %.1f MiB (%.0f%% less), peak memory %.1f -> %.1f MiB"):format(
  s.bytes_before / MiB, s.bytes_after / MiB, 100 * (1 - s.bytes_after / s.bytes_before),
  s.peak_bytes_before / MiB, s.peak_bytes_after / MiB))
if s.note then print("   note: " .. s.note:sub(1, 240) .. (#s.note > 240 and " ..." or "")) end
-- Fusion never costs memory (doc/DESIGN.md): the planner frees an extern's
-- operands once its call has read them, stores an epilogue over the
-- product it reads (a conv's residual add and ReLU need no buffer of their
-- own), orders kernels to lower the peak and takes back a fusion that
-- would raise it.  p:memory() has both curves; fl.draw_memory draws them.
assert(s.bytes_after <= s.bytes_before and s.peak_bytes_after <= s.peak_bytes_before,
       "fusion made ResNet-50 move more bytes or need more memory")
local taken_back = 0
for _, d in ipairs(p:decisions()) do if d.memory then taken_back = taken_back + 1 end end
print("   both go down: epilogues stored over their convolution's product, operands freed")
print(("   as soon as a convolution has read them; %d fusion%s taken back for memory"):format(
  taken_back, taken_back == 1 and "" or "s"))
os.execute("mkdir -p resnet50")
fl.draw_memory(p, "resnet50/memory.png")

local groups, order = {}, {}
for _, d in ipairs(p:decisions()) do
  -- the reason without node numbers and shapes: one line per kind
  local r = d.reason:gsub("%%%d+ %b()", "%%N"):gsub("%%%d+", "%%N"):gsub(" %b()", "")
  if not groups[r] then groups[r] = 0; order[#order + 1] = r end
  groups[r] = groups[r] + 1
end
table.sort(order, function(a, b) return groups[a] > groups[b] end)
print("   decisions, by reason:")
for i = 1, math.min(#order, 8) do print(("   %5d  %s"):format(groups[order[i]], order[i])) end

-- 4. Pictures and the review report, in resnet50/ (repeated blocks fold
-- into "N nodes collapsed" boxes past max_nodes).
fl.draw(g, "resnet50/captured.svg", {title = "ResNet-50 as captured"})
fl.draw(p, "resnet50/fused.svg", {title = "ResNet-50 fused"})
-- On a projector the whole network is unreadable: draw one kernel, the
-- first convolution that takes its residual sum and ReLU as epilogues,
-- large enough for the back of the room (the rest of the network as two
-- labelled stubs; the batch-norm folding computed once is one box in
-- fused.svg)
local piece
for i, k in ipairs(p:kernels()) do
  if not piece and k.name:find("conv2d_add_relu", 1, true) then piece = i - 1 end
end
if piece then
  fl.draw(p, "resnet50/one_kernel.png", {kernel = piece, scale = "projector",
                                          title = ("ResNet-50, kernel k%d"):format(piece)})
end
local cm = fl.compile(m, {backend = "cpu"})
local t0 = fl.now()
local _, yc = cm(x)          -- the outputs: class probabilities, logits
local cold = fl.now() - t0
local _, ye = m(x)
print(("\n4. compiled (first call %.2f s: capture, passes, fusion, code, compiler);"):format(cold))
-- the check means something only if the logits depend on the image
local _, y2 = m(fl.randn(1, 3, 224, 224))
local spread = (y2 - ye):abs():amax():item() / ye:abs():amax():item()
local diff = (yc - ye):abs():amax():item() / ye:abs():amax():item()
print(("   another image moves the logits by up to %.2g of their largest (eager)"):format(spread))
print(("   compiled against eager: max |difference| / max |logit| = %.2g %s"):format(
  diff, diff <= 1e-4 and "(within 1e-4)" or "(MORE than 1e-4: a bug)"))
assert(diff <= 1e-4, "the compiled ResNet-50 differs from eager")

-- 5. Time: medians with their spread; a verdict only above the noise.
local te = fl.measure(m, {args = {x}, runs = 5})
local tc = fl.measure(cm, {args = {x}, runs = 5})
print(("5. eager %s, compiled %s"):format(tostring(te), tostring(tc)))
print("   " .. fl.compare_times(tc, te, {names = {"compiled", "eager"}}).text)
fl.report(cm, "resnet50/review.html", {checklist = false, title = "ResNet-50 from ONNX"})
print("\nPictures and report written to resnet50/: captured.svg, fused.svg, memory.png, one_kernel.png (for a projector), review.html")
