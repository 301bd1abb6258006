-- onnx_real.lua -- real networks through fl.load_onnx, against onnxruntime.
--
--   python3 bench/onnx_models.py DIR          (a venv with onnx, onnxruntime)
--   python3 bench/onnx_models.py --retime DIR (onnxruntime timed again, this hour)
--   fuselab bench/onnx_real.lua DIR [NAME ...]
--
-- For every network DIR/NAME (model.onnx, input_0.npy, onnxruntime's
-- output_K.npy and times in ort.json): load it, run it eagerly and
-- compiled (backend cpu), compare every output with onnxruntime's, and
-- print load time, cold compile (first call), and steady times (median
-- and range of repeated calls) beside onnxruntime's.  The error shown is
-- normwise: max |ours - ort| / max |ort| over the output, the figure the
-- 1e-4 bound applies to (elementwise relative error means nothing on the
-- near-zero probabilities of a softmax).  Exits 1 when any output is off
-- by more than 1e-4 or any network fails to load or run.
local here = arg[0]:match("^(.*/)") or "./"
local median = dofile(here .. "stats.lua").median
local dir = arg[1] or error("usage: fuselab bench/onnx_real.lua DIR [NAME ...]")
local BOUND = 1e-4
local names = {}
for i = 2, #arg do names[#names + 1] = arg[i] end
if #names == 0 then
  names = {"bvlc_alexnet", "densenet121", "inception_v1", "inception_v2", "resnet50",
           "shufflenet", "squeezenet", "vgg19", "zfnet512", "torch_mlp", "torch_transformer"}
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

local function steady(f, x, n)
  local ts = {}
  for i = 1, n do
    local t = fl.now()
    f(x)
    ts[i] = fl.now() - t
  end
  return median(ts)
end

local bad = 0
print(string.format("%-18s %8s %8s %9s %22s %22s %9s %9s", "network", "load s", "ort load",
                    "cold s", "eager ms (range)", "compiled ms (range)", "ort ms", "error"))
for _, name in ipairs(names) do
  local d = dir .. "/" .. name
  if not exists(d .. "/model.onnx") then
    print(string.format("%-18s missing (run bench/onnx_models.py %s)", name, dir))
    bad = bad + 1
    goto next
  end
  do
    local t0 = fl.now()
    local ok, m = pcall(fl.load_onnx, d .. "/model.onnx")
    local load = fl.now() - t0
    if not ok then
      print(string.format("%-18s load failed: %s", name, m))
      bad = bad + 1
      goto next
    end
    local x = fl.load(d .. "/input_0.npy")
    local refs, k = {}, 0
    while exists(string.format("%s/output_%d.npy", d, k)) do
      refs[#refs + 1] = fl.load(string.format("%s/output_%d.npy", d, k))
      k = k + 1
    end
    local worst = 0
    local function check(outs, how)
      for i, r in ipairs(refs) do
        local e = outs[i] and normwise(outs[i]:reshape(r.shape), r) or math.huge
        if e > worst then worst = e end
        if e > BOUND then
          print(string.format("  %s output %d: error %.3g > %g", how, i, e, BOUND))
        end
      end
    end
    local ok2, err = pcall(function()
      check({m(x)}, "eager")
      local cm = fl.compile(m, {backend = "cpu"})
      local t = fl.now()
      local outs = {cm(x)}
      local cold = fl.now() - t
      check(outs, "compiled")
      local n = 5
      local em, elo, ehi = steady(m, x, n)
      local cmed, clo, chi = steady(cm, x, n)
      local ol, os_, oq1, oq3 = ort_times(d)
      print(string.format("%-18s %8.2f %8.2f %9.2f %8.1f (%5.1f-%5.1f) %8.1f (%5.1f-%5.1f) %9.1f %9.2g",
                          name, load, ol, cold, em * 1e3, elo * 1e3, ehi * 1e3,
                          cmed * 1e3, clo * 1e3, chi * 1e3, os_ * 1e3, worst))
    end)
    if not ok2 then
      print(string.format("%-18s run failed: %s", name, err))
      bad = bad + 1
    elseif worst > BOUND then
      bad = bad + 1
    end
  end
  ::next::
end
print(bad == 0 and "all outputs within " .. BOUND .. " of onnxruntime's" or bad .. " network(s) failed")
os.exit(bad == 0 and 0 or 1)
