-- memory.lua -- bytes moved and peak memory, captured graph op by op
-- against fused, for the teaching models and the ImageNet networks: the
-- numbers behind "fusion never costs memory" (doc/DESIGN.md), in one run.
--
--   fuselab bench/memory.lua [DIR]
--
-- DIR holds the networks as bench/onnx_models.py writes them
-- (DIR/NAME/model.onnx), or ONNX's light test models
-- (DIR/light_NAME.onnx, PyPI onnx's onnx/backend/test/data/light); without
-- DIR only the teaching models and examples/models/resnet50.onnx run.
-- "fused" is fl.compile's plan (decompose, optimize, fuse); "worst order"
-- is the largest after/before of the five pass orders a student can call.
-- Planning only: nothing here is timed, so the numbers are the same on any
-- machine.
local here = arg[0]:match("^(.*/)") or "./"
local dir = arg[1]
fl.manual_seed(5)

local function exists(p) local f = io.open(p) if f then f:close() return true end end

local models = {
  {"MLP 64-256-64 (batch 32)", fl.models.mlp{sizes = {64, 256, 64}}:eval(), {fl.randn(32, 64)}},
  {"transformer block (64, 4 heads; 2x16)", nn.TransformerBlock(64, 4):eval(), {fl.randn(2, 16, 64)}},
  {"CNN (3-16-32, 2x3x32x32)", fl.models.cnn{channels = {3, 16, 32}}:eval(), {fl.randn(2, 3, 32, 32)}},
  {"2-layer GPT (d 64; 8 tokens)", fl.models.transformer{vocab = 64, d = 64, heads = 2, layers = 2, seq = 16}:eval(),
   {fl.tensor({{1, 2, 3, 4, 5, 6, 7, 8}}, {dtype = "int64"})}},
}
local nets = {"bvlc_alexnet", "densenet121", "inception_v1", "inception_v2", "resnet50",
              "shufflenet", "squeezenet", "vgg19", "zfnet512"}
local found = false
for _, name in ipairs(nets) do
  local p = dir and (exists(dir .. "/" .. name .. "/model.onnx") and dir .. "/" .. name .. "/model.onnx" or
                     exists(dir .. "/light_" .. name .. ".onnx") and dir .. "/light_" .. name .. ".onnx")
  if p then
    found = true
    models[#models + 1] = {name .. " (1x3x224x224)", fl.load_onnx(p), {fl.randn(1, 3, 224, 224)}}
  end
end
if not found then
  models[#models + 1] = {"ResNet-50 (examples/models, 1x3x224x224)",
                         fl.load_onnx(here .. "../examples/models/resnet50.onnx"), {fl.randn(1, 3, 224, 224)}}
end

local orders = {
  function(g) return g:fuse() end,
  function(g) return g:decompose{quiet = true}:fuse() end,
  function(g) return g:optimize{quiet = true}:fuse() end,
  function(g) return g:decompose{quiet = true}:optimize{quiet = true}:fuse() end,
  function(g) return g:optimize{quiet = true}:decompose{quiet = true}:fuse() end,
}
local function mib(b) return b >= 2 ^ 20 and ("%.2f MiB"):format(b / 2 ^ 20) or ("%.1f KiB"):format(b / 1024) end

print("| model | bytes moved, op by op -> fused | peak, op by op -> fused | worst order: bytes, peak (after/before) |")
print("|---|---|---|---|")
local bad = 0
for _, m in ipairs(models) do
  local g = fl.capture(m[2], table.unpack(m[3]))
  local s = orders[4](g):stats()
  local wb, wp = 0, 0
  for _, o in ipairs(orders) do
    local t = o(g):stats()
    wb = math.max(wb, t.bytes_after / t.bytes_before)
    wp = math.max(wp, t.peak_bytes_after / t.peak_bytes_before)
  end
  if wb > 1 or wp > 1 then bad = bad + 1 end
  print(("| %s | %s -> %s (%.2f) | %s -> %s (%.2f) | %.2f, %.2f |"):format(m[1], mib(s.bytes_before), mib(s.bytes_after),
        s.bytes_after / s.bytes_before, mib(s.peak_bytes_before), mib(s.peak_bytes_after),
        s.peak_bytes_after / s.peak_bytes_before, wb, wp))
end
print(("\n%d of %d models move more or peak higher after fusion in some pass order"):format(bad, #models))
os.exit(bad == 0 and 0 or 1)
