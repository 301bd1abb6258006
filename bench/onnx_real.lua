-- onnx_real.lua -- real networks through fl.load_onnx, against onnxruntime.
--
--   python3 bench/onnx_models.py DIR          (a venv with onnx, onnxruntime)
--   python3 bench/onnx_models.py --retime DIR (onnxruntime timed again, this hour)
--   fuselab bench/onnx_real.lua DIR [NAME ... | --exports]
--
-- For every network DIR/NAME (model.onnx, input_K.npy, one per graph
-- input, onnxruntime's output_K.npy and times in ort.json): load it, run it eagerly and
-- compiled (backend cpu), compare every output with onnxruntime's, and
-- print load time, cold compile (first call), and steady times (median
-- and range of repeated calls) beside onnxruntime's.  The error shown is
-- normwise: max |ours - ort| / max |ort| over the output, the figure the
-- 1e-4 bound applies to (elementwise relative error means nothing on the
-- near-zero probabilities of a softmax).  Exits 1 when any output is off
-- by more than 1e-4 or any network fails to load or run.
--
-- --exports runs the networks `onnx_models.py DIR --exports` makes
-- (torchvision, GPT-2, BERT, U-Net, LSTM, GRU; by the dynamo exporter and,
-- as NAME_classic, the classic one).  Where DIR/NAME also has input2_K.npy
-- (another batch and sequence size) and onnxruntime's output2_K.npy, the
-- compiled module is called with those too, checked the same way, and the
-- "compiles" column shows its compile count after the first size -> after
-- the second: a dynamic axis must not compile again (a second compile, or
-- any recompile, fails the network).
local here = arg[0]:match("^(.*/)") or "./"
local median = dofile(here .. "stats.lua").median
local dir = arg[1] or error("usage: fuselab bench/onnx_real.lua DIR [NAME ...]")
local BOUND = 1e-4
local names = {}
for i = 2, #arg do names[#names + 1] = arg[i] end
if #names == 0 then
  names = {"bvlc_alexnet", "densenet121", "inception_v1", "inception_v2", "resnet50",
           "shufflenet", "squeezenet", "vgg19", "zfnet512", "torch_mlp", "torch_transformer"}
elseif names[1] == "--exports" then
  names = {}
  for _, n in ipairs{"resnet18", "mobilenet_v3_small", "efficientnet_b0", "convnext_tiny",
                     "vit_b_16", "gpt2", "bert", "unet", "lstm", "gru"} do
    names[#names + 1] = n
    names[#names + 1] = n .. "_classic"
  end
end

local function exists(p) local f = io.open(p) if f then f:close() return true end end

local function ort_times(d)
  local f = assert(io.open(d .. "/ort.json"))
  local s = f:read("a")
  f:close()
  local function num(k) return tonumber(s:match('"' .. k .. '": ([-%d%.eE+]+)')) end
  return num("load_s"), num("steady_s"), num("steady_q1_s"), num("steady_q3_s")
end

local function normwise(a, b)
  local d = (a - b):abs():amax():item()
  local m = b:abs():amax():item()
  return m > 0 and d / m or d
end

-- DIR/NAME/PREFIX_0.npy, PREFIX_1.npy, ... in order (none: an empty list)
local function arrays(d, prefix)
  local xs = {}
  while exists(string.format("%s/%s_%d.npy", d, prefix, #xs)) do
    xs[#xs + 1] = fl.load(string.format("%s/%s_%d.npy", d, prefix, #xs))
  end
  return xs
end

local function steady(f, xs, n)
  local ts = {}
  for i = 1, n do
    local t = fl.now()
    f(table.unpack(xs))
    ts[i] = fl.now() - t
  end
  return median(ts)
end

local bad = 0
print(string.format("%-26s %8s %8s %9s %22s %22s %9s %9s %9s", "network", "load s", "ort load",
                    "cold s", "eager ms (range)", "compiled ms (range)", "ort ms", "error",
                    "compiles"))
for _, name in ipairs(names) do
  local d = dir .. "/" .. name
  if not exists(d .. "/model.onnx") then
    print(string.format("%-26s missing (run bench/onnx_models.py %s)", name, dir))
    bad = bad + 1
    goto next
  end
  do
    local t0 = fl.now()
    local ok, m = pcall(fl.load_onnx, d .. "/model.onnx")
    local load = fl.now() - t0
    if not ok then
      print(string.format("%-26s load failed: %s", name, m))
      bad = bad + 1
      goto next
    end
    local xs, refs = arrays(d, "input"), arrays(d, "output")
    local xs2, refs2 = arrays(d, "input2"), arrays(d, "output2")
    local worst, compiles, again = 0, "-", false
    local function check(outs, how, want)
      for i, r in ipairs(want or refs) do
        local e = outs[i] and normwise(outs[i]:reshape(r.shape), r) or math.huge
        if e > worst then worst = e end
        if e > BOUND then
          print(string.format("  %s output %d: error %.3g > %g", how, i, e, BOUND))
        end
      end
    end
    local ok2, err = pcall(function()
      check({m(table.unpack(xs))}, "eager")
      local cm = fl.compile(m, {backend = "cpu"})
      local t = fl.now()
      local outs = {cm(table.unpack(xs))}
      local cold = fl.now() - t
      check(outs, "compiled")
      local n = 5
      local em, elo, ehi = steady(m, xs, n)
      local cmed, clo, chi = steady(cm, xs, n)
      if #xs2 > 0 then
        -- the other size: the same compiled module, no second compile
        local c1 = cm:stats().compiles
        check({m(table.unpack(xs2))}, "eager, second size", refs2)
        check({cm(table.unpack(xs2))}, "compiled, second size", refs2)
        local s = cm:stats()
        compiles = string.format("%d->%d", c1, s.compiles)
        if s.compiles > c1 or s.recompiles > 0 then
          print(string.format("  second size compiled again: %s",
                              s.recompile_reasons[1] or "a new graph"))
          again = true
        end
      end
      local ol, os_, oq1, oq3 = ort_times(d)
      print(string.format("%-26s %8.2f %8.2f %9.2f %8.1f (%5.1f-%5.1f) %8.1f (%5.1f-%5.1f) %9.1f %9.2g %9s",
                          name, load, ol, cold, em * 1e3, elo * 1e3, ehi * 1e3,
                          cmed * 1e3, clo * 1e3, chi * 1e3, os_ * 1e3, worst, compiles))
    end)
    if not ok2 then
      print(string.format("%-26s run failed: %s", name, err))
      bad = bad + 1
    elseif worst > BOUND or again then
      bad = bad + 1
    end
  end
  ::next::
end
print(bad == 0 and "all outputs within " .. BOUND .. " of onnxruntime's" or bad .. " network(s) failed")
os.exit(bad == 0 and 0 or 1)
