-- onnx_ml.lua -- fl.load_onnx's ai.onnx.ml ops: Binarizer,
-- ArrayFeatureExtractor and TreeEnsemble (opset 5), eagerly and compiled
-- for the cpu backend, against answers computed here in plain Lua: a tree
-- walked node by node per sample, as ONNX's reference walks it (the
-- loader instead tests every node of every sample at once and counts the
-- tests along each root-to-leaf path).  Random forests cover every node
-- mode, set membership, NaN with and without the missing branch, the four
-- aggregates, several trees and targets, and post transforms; malformed
-- trees are refused by name.
local t = require "tap"
local P = require "onnx_proto"

local dir = t.tmpdir()
local nfile = 0
local ML = "ai.onnx.ml"
local NAN = 0 / 0

-- a one-node ai.onnx.ml model of the given opset
local function model(op, inputs, attrs, opset)
  local vals, names = {}, {}
  for i, v in ipairs(inputs) do vals[i] = {name = v[1], dtype = v[2], dims = v[3]}; names[i] = v[1] end
  local bytes = P.model{opset = opset, domain = ML,
    nodes = {{op = op, domain = ML, inputs = names, outputs = {"y"}, name = "n", attrs = attrs}},
    inputs = vals, outputs = {{name = "y", dtype = "none"}}}
  nfile = nfile + 1
  return fl.load_onnx(P.write(dir .. "/m" .. nfile .. ".onnx", bytes))
end

local function doubles(l)
  local p = {}
  for i, x in ipairs(l) do p[i] = string.pack("<d", x) end
  return {tensor = {dtype = "double", dims = {#l}, raw = table.concat(p)}}
end

-- lists equal within rtol (NaN equal to NaN)
local function close(a, b, rtol)
  if #a ~= #b then return false, ("%d values, expected %d"):format(#a, #b) end
  for i = 1, #a do
    local x, y = a[i], b[i]
    if not (x == y or x ~= x and y ~= y or math.abs(x - y) <= rtol * math.abs(y)) then
      return false, ("value %d: %s, expected %s"):format(i, x, y)
    end
  end
  return true
end

local function both(m, ...)
  return m(...):reshape(-1):tolist(), fl.compile(m, {backend = "cpu"})(...):reshape(-1):tolist()
end

-- ---- the domain ------------------------------------------------------------------
t.raises(function() model("Imputer", {{"x", "float", {2}}}, nil, 1) end, "op Imputer of ai.onnx.ml is unsupported",
         "an op of ai.onnx.ml the loader lacks is refused naming the op and the domain")
t.raises(function() model("Binarizer", {{"x", "float", {2}}}, nil, 6) end, "opset 6 of ai.onnx.ml is unsupported %(1 to 5 known%)",
         "an ai.onnx.ml opset past 5 is refused")

-- ---- Binarizer -----------------------------------------------------------------
do
  local x = {-1, 0.5, 0.5000001, 2, NAN, 0.4999, 1e30, -1e30}
  local want = {}
  for i, v in ipairs(x) do want[i] = v > 0.5 and 1 or 0 end
  for _, dt in ipairs{"float", "double"} do
    local m = model("Binarizer", {{"x", dt, {2, 4}}}, {threshold = 0.5}, 1)
    local e, c = both(m, fl.tensor(x, {dtype = dt == "float" and "float32" or "float64"}):reshape(2, 4))
    t.ok(close(e, want, 0) and close(c, want, 0), "Binarizer " .. dt .. ": 1 above the threshold, 0 at it, below it and for NaN")
  end
  local m = model("Binarizer", {{"x", "int64", {3}}}, {threshold = 1.0}, 1)
  local e, c = both(m, fl.tensor({0, 1, 2}, {dtype = "int64"}))
  t.ok(close(e, {0, 0, 1}, 0) and close(c, {0, 0, 1}, 0), "Binarizer int64")
  m = model("Binarizer", {{"x", "int32", {3}}}, {threshold = 1.0}, 1)
  e, c = both(m, fl.tensor({-7, 1, 2}, {dtype = "int64"}))
  t.ok(close(e, {0, 0, 1}, 0) and close(c, {0, 0, 1}, 0), "Binarizer int32 (held widened)")
end

-- ---- ArrayFeatureExtractor -------------------------------------------------------------
do
  local m = model("ArrayFeatureExtractor", {{"x", "float", {2, 3, 4}}, {"idx", "int64", {1, 3}}}, nil, 1)
  local xs = {}
  for i = 1, 24 do xs[i] = i end
  local x = fl.tensor(xs, {dtype = "float32"}):reshape(2, 3, 4)
  local y = fl.tensor({3, 0, -1}, {dtype = "int64"}):reshape(1, 3)
  local want = {}
  for r = 0, 5 do
    for _, k in ipairs{3, 0, 3} do want[#want + 1] = xs[r * 4 + k + 1] end
  end
  local e, c = both(m, x, y)
  t.ok(close(e, want, 0) and close(c, want, 0), "ArrayFeatureExtractor: indices along the last dim, -1 the last")
  local m1 = model("ArrayFeatureExtractor", {{"x", "float", {5}}, {"idx", "int64", {2}}}, nil, 1)
  local y1 = m1(fl.tensor({1, 2, 3, 4, 5}, {dtype = "float32"}), fl.tensor({4, 1}, {dtype = "int64"}))
  t.ok(y1.shape[1] == 1 and y1.shape[2] == 2 and close(y1:reshape(-1):tolist(), {5, 2}, 0),
       "ArrayFeatureExtractor of a 1-d x gives [1, n]")
  local mi = model("ArrayFeatureExtractor", {{"x", "int32", {2, 3}}, {"idx", "int64", {2}}}, nil, 1)
  local ei, ci = both(mi, fl.tensor({1, -2, 3, 4, 5, -6}, {dtype = "int64"}):reshape(2, 3), fl.tensor({2, 1}, {dtype = "int64"}))
  t.ok(close(ei, {3, -2, -6, 5}, 0) and close(ci, {3, -2, -6, 5}, 0), "ArrayFeatureExtractor int32 (held widened)")
  t.raises(function() m1(fl.tensor({1, 2, 3, 4, 5}, {dtype = "float32"}), fl.tensor({5, 1}, {dtype = "int64"})) end,
           "index 5 out of range", "ArrayFeatureExtractor: an index past the end is refused")
end

-- ---- TreeEnsemble ---------------------------------------------------------------------------------

-- the reference's walk: node n's test on sample x (NaN: false, NEQ true,
-- or the missing branch where it tracks true)
local function test(f, n, x)
  local v, s, mode = x[f.feats[n] + 1], f.splits[n], f.modes[n]
  local r
  if mode == 0 then r = v <= s elseif mode == 1 then r = v < s elseif mode == 2 then r = v >= s
  elseif mode == 3 then r = v > s elseif mode == 4 then r = v == s elseif mode == 5 then r = v ~= s
  else r = f.sets[n][v] == true end
  return r or (f.mtt[n] == 1 and v ~= v)
end

local function predict(f, x, dt)
  local out = {}
  -- MIN and MAX start from the type's largest and lowest finite values
  local big = dt == "double" and 1.7976931348623157e308 or 3.4028234663852886e38
  local init = f.agg == 2 and big or f.agg == 3 and -big or 0
  for k = 1, f.ntargets do out[k] = init end
  for _, r in ipairs(f.roots) do
    local n, leaf = r + 1, nil
    while not leaf do
      local side = test(f, n, x)
      local id = side and f.ttrue[n] or f.tfalse[n]
      if (side and f.ltrue[n] or f.lfalse[n]) == 1 then leaf = id + 1 else n = id + 1 end
    end
    local w, k = f.weights[leaf], f.targets[leaf] + 1
    if f.agg == 0 then out[k] = out[k] + w / #f.roots
    elseif f.agg == 1 then out[k] = out[k] + w
    elseif f.agg == 2 then out[k] = math.min(out[k], w)
    else out[k] = math.max(out[k], w) end
  end
  if f.post == 1 then
    local mx, sum = -math.huge, 0
    for k = 1, #out do mx = math.max(mx, out[k]) end
    for k = 1, #out do out[k] = math.exp(out[k] - mx); sum = sum + out[k] end
    for k = 1, #out do out[k] = out[k] / sum end
  elseif f.post == 2 then
    for k = 1, #out do out[k] = 1 / (1 + math.exp(-out[k])) end
  end
  return out
end

-- a random forest over nf features: trees of depth up to 4, every mode
local function forest(nf, ntrees, ntargets)
  local f = {feats = {}, splits = {}, modes = {}, mtt = {}, ttrue = {}, tfalse = {}, ltrue = {}, lfalse = {},
             weights = {}, targets = {}, roots = {}, sets = {}, members = {}, ntargets = ntargets}
  local function new_leaf()
    f.weights[#f.weights + 1] = math.random(-40, 40) / 4
    f.targets[#f.targets + 1] = math.random(0, ntargets - 1)
    return #f.weights - 1
  end
  local function new_node(depth)
    local n = #f.feats + 1
    f.feats[n] = math.random(0, nf - 1)
    f.modes[n] = math.random(0, 6)
    f.splits[n] = f.modes[n] == 6 and NAN or math.random(-3, 3) / 2
    f.mtt[n] = math.random(0, 1)
    if f.modes[n] == 6 then
      f.sets[n] = {}
      for _ = 1, math.random(1, 3) do
        local v = math.random(-3, 3) / 2
        if not f.sets[n][v] then f.sets[n][v] = true; f.members[#f.members + 1] = v end
      end
      f.members[#f.members + 1] = NAN
    end
    for _, side in ipairs{"true", "false"} do
      if depth >= 3 or math.random() < 0.3 then
        f["l" .. side][n], f["t" .. side][n] = 1, new_leaf()
      else
        f["l" .. side][n], f["t" .. side][n] = 0, 0
        f["t" .. side][n] = new_node(depth + 1) - 1
      end
    end
    return n
  end
  for _ = 1, ntrees do f.roots[#f.roots + 1] = new_node(0) - 1 end
  return f
end

local function load_forest(f, dt)
  local modes = {}
  for i, m in ipairs(f.modes) do modes[i] = m end
  local splits = dt == "double" and doubles(f.splits) or {tensor = {dtype = "float", dims = {#f.splits}, floats = f.splits}}
  local weights = dt == "double" and doubles(f.weights) or {tensor = {dtype = "float", dims = {#f.weights}, floats = f.weights}}
  local attrs = {
    aggregate_function = f.agg, post_transform = f.post, n_targets = f.ntargets, tree_roots = f.roots,
    nodes_featureids = f.feats, nodes_modes = {tensor = {dtype = "uint8", dims = {#modes}, int32s = modes}},
    nodes_splits = splits, nodes_truenodeids = f.ttrue, nodes_falsenodeids = f.tfalse,
    nodes_trueleafs = f.ltrue, nodes_falseleafs = f.lfalse, nodes_missing_value_tracks_true = f.mtt,
    leaf_targetids = f.targets, leaf_weights = weights,
  }
  if #f.members > 0 then
    attrs.membership_values = dt == "double" and doubles(f.members) or
      {tensor = {dtype = "float", dims = {#f.members}, floats = f.members}}
  end
  return model("TreeEnsemble", {{"x", dt, {"N", 3}}}, attrs, 5)
end

math.randomseed(5)
local bad, compiled_bad, ncase = {}, {}, 0
for trial = 1, 24 do
  local f = forest(3, math.random(1, 4), math.random(1, 3))
  f.agg, f.post = (trial - 1) % 4, trial % 6 == 0 and 1 or trial % 6 == 3 and 2 or 0
  local dt = trial % 2 == 0 and "double" or "float"
  local m = load_forest(f, dt)
  local xs, rows = {}, {}
  for r = 1, 40 do
    local row = {}
    for k = 1, 3 do
      row[k] = math.random() < 0.1 and NAN or math.random(-4, 4) / 2   -- on the splits and the members too
      xs[#xs + 1] = row[k]
    end
    rows[r] = row
  end
  local want = {}
  for _, row in ipairs(rows) do
    for _, v in ipairs(predict(f, row, dt)) do want[#want + 1] = v end
  end
  local x = fl.tensor(xs, {dtype = dt == "double" and "float64" or "float32"}):reshape(40, 3)
  local e, c = both(m, x)
  local rtol = dt == "double" and 1e-12 or 1e-6
  local what = ("trial %d (%d trees, %d targets, aggregate %d, post %d, %s)"):format(trial, #f.roots, f.ntargets,
    f.agg, f.post, dt)
  local ok, why = close(e, want, rtol)
  if not ok then bad[#bad + 1] = what .. ": " .. why end
  ok, why = close(c, want, rtol)
  if not ok then compiled_bad[#compiled_bad + 1] = what .. ": " .. why end
  ncase = ncase + 1
end
t.ok(#bad == 0, ("TreeEnsemble equals a walk of each tree in %d random forests (every mode, sets, NaN, the four aggregates)%s"):format(
  ncase, #bad > 0 and ": " .. bad[1] or ""))
t.ok(#compiled_bad == 0, "... compiled" .. (#compiled_bad > 0 and ": " .. compiled_bad[1] or ""))

-- malformed trees: refused by name
do
  local function f1()
    return {feats = {0}, splits = {0.5}, modes = {0}, mtt = {0}, ttrue = {0}, tfalse = {1}, ltrue = {1}, lfalse = {1},
            weights = {1, 2}, targets = {0, 0}, roots = {0}, members = {}, ntargets = 1, agg = 1, post = 0}
  end
  local f = f1()
  f.ltrue, f.ttrue = {0}, {0}
  t.raises(function() load_forest(f, "float") end, "the trees have a cycle through node 0", "TreeEnsemble: a cycle is refused")
  f = f1()
  f.tfalse = {7}
  t.raises(function() load_forest(f, "float") end, "leaf 7 out of range", "TreeEnsemble: a leaf past the weights is refused")
  f = f1()
  f.targets = {0, 3}
  t.raises(function() load_forest(f, "float") end, "leaf target 3 out of range", "TreeEnsemble: a target past n_targets is refused")
  f = f1()
  f.post = 4
  t.raises(function() load_forest(f, "float") end, "post_transform 4 %(NONE, SOFTMAX and LOGISTIC only%) is unsupported",
           "TreeEnsemble: PROBIT is a clean refusal")
  f = f1()
  f.feats = {5}
  t.raises(function() load_forest(f, "float")(fl.zeros(2, 3)) end, "feature 5 of X's 3", "TreeEnsemble: a feature past X's is refused")
  local m = load_forest(f1(), "float")
  local y = m(fl.tensor({0.25, 9, 9, 0.75, 9, 9}):reshape(2, 3))
  t.ok(close(y:reshape(-1):tolist(), {1, 2}, 0), "TreeEnsemble: the REPL goes on after the refusals (one node, two leaves)")
end

t.done()
