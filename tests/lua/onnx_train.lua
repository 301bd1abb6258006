-- onnx_train.lua -- fl.load_onnx's training-mode and random ops:
-- BatchNormalization and Dropout in training, Bernoulli and the Random*
-- ops (drawn from fl's Philox stream), and the optimizers of the
-- ai.onnx.preview.training domain (Adagrad, Adam, Momentum).  Each is run
-- eagerly and compiled for the cpu backend against answers computed here in
-- plain Lua loops (double precision), or, for draws, against what the draw
-- promises: the values' set or range, their mean within a stated bound, a
-- seed that reproduces, compiled equal to eager.
local t = require "tap"
local P = require "onnx_proto"

local dir = t.tmpdir()
local nfile = 0
local TRAINING = "ai.onnx.preview.training"

-- A one-node model.  o.inputs: {{name, dtype, dims}}; o.outputs: names
-- (default {"y"}); o.node_inputs: the node's input names when they are not
-- the graph inputs ("" omits one); o.opset, o.domain: the one opset import;
-- o.also: a second import {domain, version}; o.node_domain: the node's.
local function model(op, o)
  local vals, names = {}, {}
  for i, v in ipairs(o.inputs) do vals[i] = {name = v[1], dtype = v[2], dims = v[3]}; names[i] = v[1] end
  local outs = {}
  for i, name in ipairs(o.outputs or {"y"}) do outs[i] = {name = name, dtype = "none"} end
  local bytes = P.model{opset = o.opset or 22, domain = o.domain,
    nodes = {{op = op, domain = o.node_domain, inputs = o.node_inputs or names, outputs = o.outputs or {"y"},
              name = "n", attrs = o.attrs}},
    inits = o.inits, inputs = vals, outputs = outs}
  if o.also then bytes = bytes .. P.bytes(8, P.bytes(1, o.also[1]) .. P.vint(2, o.also[2])) end
  nfile = nfile + 1
  return fl.load_onnx(P.write(dir .. "/m" .. nfile .. ".onnx", bytes))
end

local function flat(x) return x:reshape({-1}):tolist() end

-- Lists a and b equal within rtol * |b| + atol, element by element.
local function close(a, b, rtol, atol)
  if #a ~= #b then return false end
  for i = 1, #a do
    if not (math.abs(a[i] - b[i]) <= rtol * math.abs(b[i]) + atol) then return false end
  end
  return true
end

local function same(a, b) return fl.allclose(a, b, 0, 0) and a.dtype == b.dtype end

-- The model's outputs eagerly and compiled (cpu), each a packed list.
local function both(m, ...)
  local e = table.pack(m(...))
  local c = table.pack(fl.compile(m, {backend = "cpu"})(...))
  return e, c
end

fl.manual_seed(7)

-- ---- BatchNormalization, training_mode=1 -------------------------------------
-- y = (x - mean_b) / sqrt(var_b + eps) * scale + bias over every dim but
-- the channel (dim 2), var_b the population variance; the running
-- statistics m * momentum + stat * (1 - momentum).
local function bn_ref(x, sc, b, mean, var, eps, mom)
  local shape = x.shape
  local C = shape[2]
  local inner = 1
  for d = 3, #shape do inner = inner * shape[d] end
  local xs = flat(x)
  local sum, cnt = {}, {}
  for c = 1, C do sum[c], cnt[c] = 0, 0 end
  for i, v in ipairs(xs) do
    local c = (i - 1) // inner % C + 1
    sum[c], cnt[c] = sum[c] + v, cnt[c] + 1
  end
  local mu, sq = {}, {}
  for c = 1, C do mu[c] = sum[c] / cnt[c]; sq[c] = 0 end
  for i, v in ipairs(xs) do
    local c = (i - 1) // inner % C + 1
    sq[c] = sq[c] + (v - mu[c]) ^ 2
  end
  local y, rm, rv = {}, {}, {}
  local scl, bl, ml, vl = flat(sc), flat(b), flat(mean), flat(var)
  for i, v in ipairs(xs) do
    local c = (i - 1) // inner % C + 1
    y[i] = (v - mu[c]) / math.sqrt(sq[c] / cnt[c] + eps) * scl[c] + bl[c]
  end
  for c = 1, C do
    rm[c] = ml[c] * mom + mu[c] * (1 - mom)
    rv[c] = vl[c] * mom + sq[c] / cnt[c] * (1 - mom)
  end
  return y, rm, rv
end

for _, case in ipairs({
  {shape = {2, 3, 4, 5}, attrs = {training_mode = 1}, eps = 1e-5, mom = 0.9},
  {shape = {4, 2}, attrs = {training_mode = 1, epsilon = 0.01, momentum = 0.5}, eps = 0.01, mom = 0.5},
  {shape = {3, 5, 7}, attrs = {training_mode = 1, momentum = 0.0}, eps = 1e-5, mom = 0.0},
  {shape = {1, 4, 3, 2, 2}, attrs = {training_mode = 1, epsilon = 0.1}, eps = 0.1, mom = 0.9},
}) do
  local C = case.shape[2]
  local m = model("BatchNormalization", {opset = 15, attrs = case.attrs,
    inputs = {{"x", "float", case.shape}, {"s", "float", {C}}, {"b", "float", {C}}, {"mean", "float", {C}},
              {"var", "float", {C}}},
    outputs = {"y", "rm", "rv"}})
  local x = fl.randn(case.shape) * 3 + 1
  local sc, b, mean, var = fl.randn(C), fl.randn(C), fl.randn(C), fl.rand(C) + 0.5
  local y, rm, rv = bn_ref(x, sc, b, mean, var, case.eps, case.mom)
  local e, c = both(m, x, sc, b, mean, var)
  local tag = "[" .. table.concat(case.shape, ",") .. "]"
  for _, r in ipairs({{e, "eagerly"}, {c, "compiled"}}) do
    t.ok(close(flat(r[1][1]), y, 1e-5, 1e-5), "BatchNormalization training " .. tag .. ": y, " .. r[2])
    t.ok(close(flat(r[1][2]), rm, 1e-5, 1e-6), "BatchNormalization training " .. tag .. ": running mean, " .. r[2])
    t.ok(close(flat(r[1][3]), rv, 1e-5, 1e-6), "BatchNormalization training " .. tag .. ": running var, " .. r[2])
  end
end

do
  local ins = {{"x", "float", {2, 3}}, {"s", "float", {3}}, {"b", "float", {3}}, {"mean", "float", {3}},
               {"var", "float", {3}}}
  t.raises(function() model("BatchNormalization", {opset = 15, attrs = {training_mode = 2}, inputs = ins}) end,
           "training_mode 2 %(0 or 1%)", "BatchNormalization: training_mode 2 is refused")
  t.raises(function() model("BatchNormalization", {opset = 9, inputs = ins, outputs = {"y", "rm", "rv"}}) end,
           "the training outputs %(running mean/var%) before opset 14 is unsupported",
           "BatchNormalization: the training outputs before opset 14 stay unsupported")
  t.raises(function() model("BatchNormalization", {opset = 15, inputs = ins, outputs = {"y", "rm"}}) end,
           "output 2 %(running mean/var%) without training_mode=1",
           "BatchNormalization: running statistics without training_mode are an error")
  t.raises(function() model("BatchNormalization", {opset = 15, attrs = {training_mode = 1},
             inputs = {{"x", "float", {3}}, {"s", "float", {3}}, {"b", "float", {3}}, {"mean", "float", {3}},
                       {"var", "float", {3}}}, outputs = {"y", "rm", "rv"}})(fl.randn(3), fl.randn(3),
             fl.randn(3), fl.randn(3), fl.rand(3)) end,
           "input of 1 dims", "BatchNormalization training: a 1-d input is an error")
end

-- ---- Dropout, training_mode=1 -------------------------------------------------
local function dropout_model(attrs, opset)
  return model("Dropout", {opset = opset or 22, attrs = attrs,
    inputs = {{"x", "float", {"N"}}, {"r", "float", {}}, {"t", "bool", {}}}, outputs = {"y", "mask"}})
end
local TRUE, FALSE = fl.ones({}, {dtype = "bool"}), fl.zeros({}, {dtype = "bool"})
local function ratio(r) return fl.full({}, r * 1.0) end

do
  local m = dropout_model()
  local x = fl.randn(1000)
  local e, c = both(m, x, ratio(0), TRUE)
  t.ok(same(e[1], x) and same(c[1], x), "Dropout training, ratio 0: y is x, eagerly and compiled")
  t.ok(e[2].dtype == "bool" and e[2]:to("int64"):sum():item() == 1000 and same(c[2], e[2]),
       "Dropout training, ratio 0: the mask is all true, eagerly and compiled")
  e, c = both(m, x, ratio(0.5), FALSE)
  t.ok(same(e[1], x) and same(c[1], x) and e[2]:to("int64"):sum():item() == 1000,
       "Dropout with training_mode false: the identity and a mask of ones")

  -- n = 10^5 draws at ratio 0.3: the fraction dropped is 0.3 within 0.01
  -- (its standard deviation is 0.0015); every kept value is x / 0.7, in
  -- float32, and the mask says which
  local n = 100000
  local xs = fl.randn(n)
  for _, run in ipairs({{"eagerly", m}, {"compiled", fl.compile(m, {backend = "cpu"})}}) do
    local y, mask = run[2](xs, ratio(0.3), TRUE)
    local kept = mask:to("int64"):sum():item()
    t.ok(math.abs(1 - kept / n - 0.3) < 0.01, ("Dropout ratio 0.3, %s: %.4f of 10^5 dropped"):format(run[1], 1 - kept / n))
    local scaled = xs * fl.full({}, 1 / 0.7)
    local want = fl.where(mask, scaled, fl.zeros({}))
    t.ok(fl.allclose(y, want, 0, 0), "Dropout ratio 0.3, " .. run[1] .. ": y is x / 0.7 where the mask is true, else 0")
  end
  -- a dropped element is 0 however large x
  local y = m(fl.full({200}, 5.0), ratio(0.5), TRUE)
  local l, zeros, ok = flat(y), 0, true
  for _, v in ipairs(l) do
    if v == 0 then zeros = zeros + 1 elseif math.abs(v - 10) > 1e-6 then ok = false end
  end
  t.ok(ok and zeros > 50 and zeros < 150, "Dropout ratio 0.5: each value 0 or 2x (" .. zeros .. " of 200 dropped)")

  -- unseeded: the global stream, compiled and eager the same after
  -- fl.manual_seed; two calls draw anew
  local cm = fl.compile(m, {backend = "cpu"})
  fl.manual_seed(11)
  local a = m(xs, ratio(0.5), TRUE)
  fl.manual_seed(11)
  local b = cm(xs, ratio(0.5), TRUE)
  t.ok(same(a, b), "Dropout without a seed: compiled equals eager after fl.manual_seed")
  t.ok(not same(m(xs, ratio(0.5), TRUE), m(xs, ratio(0.5), TRUE)), "Dropout without a seed: each call draws anew")
  -- seeded: the same mask every call, eager and compiled, the stream untouched
  local ms = dropout_model({seed = 3.0})
  local s0 = fl.get_rng_state()
  local y1, k1 = ms(xs, ratio(0.5), TRUE)
  local s1 = fl.get_rng_state()
  local y2 = ms(xs, ratio(0.5), TRUE)
  local y3, k3 = fl.compile(ms, {backend = "cpu"})(xs, ratio(0.5), TRUE)
  t.ok(same(y1, y2) and same(y1, y3) and same(k1, k3), "Dropout with a seed: the same draw every call, eager and compiled")
  t.ok(s0.seed == s1.seed and s0.offset == s1.offset, "Dropout with a seed leaves the global stream as it was")
  fl.manual_seed(3)
  t.ok(same(k1, fl.rand(n):ge(fl.full({}, 0.5))), "Dropout seed 3: the mask is fl.manual_seed(3)'s first draw, >= ratio")
  t.ok(not same(dropout_model({seed = 4.0})(xs, ratio(0.5), TRUE), y1), "Dropout: another seed, another draw")

  t.raises(function() m(x, ratio(1), TRUE) end, "ratio 1%.0 outside %[0, 1%)", "Dropout: ratio 1 is an error")
  t.raises(function() m(x, ratio(-0.1), TRUE) end, "outside %[0, 1%)", "Dropout: a negative ratio is an error")
  local old = model("Dropout", {opset = 11, attrs = {ratio = 0.5}, inputs = {{"x", "float", {4}}}, outputs = {"y", "mask"}})
  local x4 = fl.randn(4)
  local oy, om = old(x4)
  t.ok(same(oy, x4) and om:to("int64"):sum():item() == 4, "Dropout before opset 12: the identity")
  t.raises(function() model("Dropout", {opset = 6, attrs = {is_test = 0}, inputs = {{"x", "float", {4}}}}) end,
           "Dropout in training %(is_test=0%) is unsupported", "Dropout: is_test=0 before opset 7 stays unsupported")
  local mi = model("Dropout", {inputs = {{"x", "int64", {4}}, {"r", "float", {}}, {"t", "bool", {}}}})
  t.raises(function() mi(fl.tensor({1, 2, 3, 4}, {dtype = "int64"}), ratio(0.5), TRUE) end,
           "an input of dtype int64 is unsupported", "Dropout training of integers is refused")
end

-- ---- Bernoulli ----------------------------------------------------------------
do
  local n = 100000
  local m = model("Bernoulli", {inputs = {{"p", "float", {"N"}}}})
  for _, p in ipairs({0.25, 0.9}) do
    local y = m(fl.full({n}, p))
    local ones = y:sum():item()
    local zeros_or_ones = y:eq(fl.zeros({})):to("int64"):sum():item() + ones
    t.ok(y.dtype == "float32" and zeros_or_ones == n, ("Bernoulli p=%g: float32 values in {0, 1}"):format(p))
    t.ok(math.abs(ones / n - p) < 0.01, ("Bernoulli p=%g: mean %.4f over 10^5 draws (within 0.01)"):format(p, ones / n))
  end
  -- probabilities 0 and 1 are certain
  local pl = {}
  for i = 1, 64 do pl[i] = i % 3 == 0 and 1 or 0 end
  local e, c = both(m, fl.tensor(pl, {dtype = "float32"}))
  t.is(flat(e[1]), pl, "Bernoulli of probabilities 0 and 1, eagerly")
  t.is(flat(c[1]), pl, "Bernoulli of probabilities 0 and 1, compiled")
  -- the dtype attribute
  for _, d in ipairs({{7, "int64"}, {9, "bool"}, {11, "float64"}, {10, "float16"}}) do
    local md = model("Bernoulli", {attrs = {dtype = d[1]}, inputs = {{"p", "float", {"N"}}}})
    local y = md(fl.tensor(pl, {dtype = "float32"}))
    local l = flat(y:to("float64"))
    t.ok(y.dtype == d[2] and close(l, pl, 0, 0), "Bernoulli dtype " .. d[2])
  end
  local md = model("Bernoulli", {inputs = {{"p", "double", {"N"}}}})
  local yd = md(fl.full({n}, 0.5, {dtype = "float64"}))
  t.ok(yd.dtype == "float64" and math.abs(yd:sum():item() / n - 0.5) < 0.01, "Bernoulli of doubles: double 0/1, mean 0.5")
  -- the seed: the same draw each call, eager and compiled, the global
  -- stream untouched; the draw is fl.manual_seed(seed)'s first, below p
  local ms = model("Bernoulli", {attrs = {seed = 5.0}, inputs = {{"p", "float", {"N"}}}})
  local p = fl.rand(1000)
  local s0 = fl.get_rng_state()
  local y1 = ms(p)
  local s1 = fl.get_rng_state()
  t.ok(s0.offset == s1.offset and s0.seed == s1.seed, "Bernoulli with a seed leaves the global stream as it was")
  t.ok(same(y1, ms(p)) and same(y1, fl.compile(ms, {backend = "cpu"})(p)),
       "Bernoulli with a seed: the same draw every call, eager and compiled")
  fl.manual_seed(5)
  t.ok(same(y1, fl.rand(1000):lt(p):to("float32")), "Bernoulli seed 5: fl.manual_seed(5)'s first draw below p")
  local mf = model("Bernoulli", {attrs = {seed = 5.5}, inputs = {{"p", "float", {"N"}}}})
  t.ok(same(mf(p), mf(p)) and not same(mf(p), y1), "Bernoulli: a fractional seed is its own stream, reproduced")
  -- unseeded: compiled equals eager after fl.manual_seed
  local cm = fl.compile(m, {backend = "cpu"})
  fl.manual_seed(9)
  local a = m(p)
  fl.manual_seed(9)
  t.ok(same(a, cm(p)), "Bernoulli without a seed: compiled equals eager after fl.manual_seed")
  t.raises(function() model("Bernoulli", {attrs = {dtype = 8}, inputs = {{"p", "float", {2}}}}) end,
           "dtype string is unsupported", "Bernoulli: dtype string is refused")
  local mi = model("Bernoulli", {inputs = {{"p", "int64", {2}}}})
  t.raises(function() mi(fl.tensor({0, 1}, {dtype = "int64"})) end, "dtype int64 is unsupported",
           "Bernoulli of integer probabilities is refused")
end

-- ---- RandomUniformLike, RandomUniform, RandomNormalLike, RandomNormal ---------
do
  local n = 100000
  -- U[-2, 3): mean 0.5 (its standard deviation 5/sqrt(12 n) = 0.0046,
  -- bound 0.03), variance 25/12 = 2.083 (bound 0.05)
  local m = model("RandomUniformLike", {attrs = {low = -2.0, high = 3.0}, inputs = {{"x", "float", {"N"}}}})
  for _, run in ipairs({{"eagerly", m}, {"compiled", fl.compile(m, {backend = "cpu"})}}) do
    local y = run[2](fl.zeros({n}))
    local mean = y:mean():item()
    local var = ((y - fl.full({}, mean)) ^ 2):mean():item()
    t.ok(y.dtype == "float32" and y.shape[1] == n, "RandomUniformLike, " .. run[1] .. ": the input's shape and dtype")
    t.ok(y:amin():item() >= -2 and y:amax():item() < 3, "RandomUniformLike, " .. run[1] .. ": values in [-2, 3)")
    t.ok(math.abs(mean - 0.5) < 0.03 and math.abs(var - 25 / 12) < 0.05,
         ("RandomUniformLike, %s: mean %.4f, variance %.4f over 10^5 draws"):format(run[1], mean, var))
  end
  local md = model("RandomUniformLike", {attrs = {dtype = 11, seed = 1.0}, inputs = {{"x", "float", {2, 3}}}})
  local y = md(fl.zeros(2, 3))
  t.ok(y.dtype == "float64" and y.shape[1] == 2 and y.shape[2] == 3, "RandomUniformLike dtype double: [2,3] float64")
  t.ok(same(y, md(fl.zeros(2, 3))) and same(y, fl.compile(md, {backend = "cpu"})(fl.zeros(2, 3))),
       "RandomUniformLike with a seed: the same values every call, eager and compiled")
  local m32 = model("RandomUniformLike", {attrs = {dtype = 1}, inputs = {{"x", "int32", {2, 2}}}})
  local u32 = m32(fl.zeros({2, 2}, {dtype = "int64"}))
  t.ok(u32.dtype == "float32" and u32.shape[1] == 2 and u32:amin():item() >= 0 and u32:amax():item() < 1,
       "RandomUniformLike of an int32 input with dtype float: its shape, values in [0, 1)")
  local m32n = model("RandomUniformLike", {inputs = {{"x", "int32", {2}}}})
  t.raises(function() m32n(fl.zeros({2}, {dtype = "int64"})) end, "random values of dtype int32 %(the input's%)",
           "RandomUniformLike of an int32 input without dtype is refused")
  local mi = model("RandomUniformLike", {inputs = {{"x", "int64", {3}}}})
  t.raises(function() mi(fl.tensor({1, 2, 3}, {dtype = "int64"})) end, "random values of dtype int64", "RandomUniformLike of an integer input without dtype is refused")
  t.raises(function() model("RandomUniformLike", {attrs = {low = 1.0, high = 1.0}, inputs = {{"x", "float", {3}}}}) end,
           "low 1%.0 not below high 1%.0", "RandomUniformLike: low must be below high")
  t.raises(function() model("RandomUniformLike", {attrs = {dtype = 7}, inputs = {{"x", "float", {3}}}}) end,
           "random values of dtype int64 is unsupported", "RandomUniformLike: dtype int64 is refused")

  local mu = model("RandomUniform", {attrs = {shape = {4, 5}, low = 10.0, high = 12.0}, inputs = {}})
  local u = mu()
  t.ok(u.dtype == "float32" and u.shape[1] == 4 and u.shape[2] == 5 and u:amin():item() >= 10 and u:amax():item() < 12,
       "RandomUniform: the shape attribute, values in [10, 12)")
  t.raises(function() model("RandomUniform", {inputs = {}}) end, "the shape attribute is required", "RandomUniform without shape")

  -- N(1.5, 2^2): mean within 0.03 (its standard deviation 0.0063), standard
  -- deviation within 0.03
  local mn = model("RandomNormalLike", {attrs = {mean = 1.5, scale = 2.0}, inputs = {{"x", "float", {"N"}}}})
  for _, run in ipairs({{"eagerly", mn}, {"compiled", fl.compile(mn, {backend = "cpu"})}}) do
    local z = run[2](fl.zeros({n}))
    local mean = z:mean():item()
    local sd = math.sqrt(((z - fl.full({}, mean)) ^ 2):mean():item())
    t.ok(math.abs(mean - 1.5) < 0.03 and math.abs(sd - 2) < 0.03,
         ("RandomNormalLike, %s: mean %.4f, sd %.4f over 10^5 draws"):format(run[1], mean, sd))
  end
  local mr = model("RandomNormal", {attrs = {shape = {3, 2}, seed = 2.0, dtype = 11}, inputs = {}})
  local r1 = mr()
  t.ok(r1.dtype == "float64" and r1.shape[1] == 3 and same(r1, mr()) and same(r1, fl.compile(mr, {backend = "cpu"})()),
       "RandomNormal with a seed and dtype double: the same values every call, eager and compiled")
end

-- ---- ai.onnx.preview.training ---------------------------------------------------
-- The optimizers' pseudo code in double, element by element.
local function adagrad_ref(a, R, T, x, g, h)
  local r = R / (1 + T * a.decay)
  local xn, hn = {}, {}
  for i = 1, #x do
    local gr = a.norm * x[i] + g[i]
    hn[i] = h[i] + gr * gr
    xn[i] = x[i] - r * gr / (math.sqrt(hn[i]) + a.eps)
  end
  return {xn, hn}
end
local function momentum_ref(a, R, T, x, g, v)
  local xn, vn = {}, {}
  local b = T > 0 and a.beta or 1
  for i = 1, #x do
    local gr = a.norm * x[i] + g[i]
    vn[i] = a.alpha * v[i] + b * gr
    xn[i] = a.mode == "standard" and x[i] - R * vn[i] or x[i] - R * (gr + a.alpha * vn[i])
  end
  return {xn, vn}
end
local function adam_ref(a, R, T, x, g, v, h)
  local xn, vn, hn = {}, {}, {}
  local r = T > 0 and R * math.sqrt(1 - a.beta ^ T) / (1 - a.alpha ^ T) or R
  for i = 1, #x do
    local gr = a.norm * x[i] + g[i]
    vn[i] = a.alpha * v[i] + (1 - a.alpha) * gr
    hn[i] = a.beta * h[i] + (1 - a.beta) * gr * gr
    xn[i] = (1 - a.post) * (x[i] - r * vn[i] / (math.sqrt(hn[i]) + a.eps))
  end
  return {xn, vn, hn}
end

-- The float32 value of a double (the attributes are stored as float32).
local function f32(v) return string.unpack("<f", string.pack("<f", v)) end

-- One optimizer over the tensors of shapes: inputs R, T, the Xs, Gs and
-- each state's; outputs the new Xs, then each new state's.
local function optimizer_case(op, attrs, ref_attrs, nstate, shapes, ref, T, R)
  local ins, outs = {{"R", "float", {}}, {"T", "int64", {}}}, {}
  local kinds = {"X", "G"}
  for k = 1, nstate do kinds[#kinds + 1] = "S" .. k end
  for _, kind in ipairs(kinds) do
    for i, s in ipairs(shapes) do ins[#ins + 1] = {kind .. i, "float", s} end
  end
  for k = 0, nstate do
    for i = 1, #shapes do outs[#outs + 1] = "out" .. k .. "_" .. i end
  end
  local m = model(op, {domain = TRAINING, opset = 1, node_domain = TRAINING, attrs = attrs, inputs = ins, outputs = outs})
  local args = {fl.full({}, R), fl.full({}, T, {dtype = "int64"})}
  for j, kind in ipairs(kinds) do
    for _, s in ipairs(shapes) do
      -- the squared-gradient states (Adagrad's H, Adam's second) are >= 0
      local v = fl.randn(s)
      if (op == "Adagrad" and j == 3) or (op == "Adam" and j == 4) then v = v:abs() end
      args[#args + 1] = v
    end
  end
  local want = {}
  for i = 1, #shapes do
    local lists = {}
    for j = 1, #kinds do lists[j] = flat(args[2 + (j - 1) * #shapes + i]) end
    local r = ref(ref_attrs, f32(R), T, table.unpack(lists))
    for k = 0, nstate do want[k * #shapes + i] = r[k + 1] end
  end
  local e, c = both(m, table.unpack(args))
  local ok_e, ok_c = e.n == #want and c.n == #want, e.n == #want and c.n == #want
  for i = 1, #want do
    ok_e = ok_e and close(flat(e[i]), want[i], 1e-5, 1e-6)
    ok_c = ok_c and close(flat(c[i]), want[i], 1e-5, 1e-6)
  end
  local tag = ("%s %s, T=%d, %d tensor(s)"):format(op, attrs.mode or "", T, #shapes)
  t.ok(ok_e, tag .. ": eagerly")
  t.ok(ok_c, tag .. ": compiled")
end

do
  local one, two = {{3}}, {{3}, {2, 4}}
  local ag = {decay_factor = 0.1, epsilon = 1e-5, norm_coefficient = 0.01}
  local agr = {decay = f32(0.1), eps = f32(1e-5), norm = f32(0.01)}
  for _, T in ipairs({0, 3}) do
    optimizer_case("Adagrad", ag, agr, 1, one, adagrad_ref, T, 0.1)
    optimizer_case("Adagrad", ag, agr, 1, two, adagrad_ref, T, 0.1)
  end
  optimizer_case("Adagrad", {}, {decay = 0, eps = f32(1e-6), norm = 0}, 1, two, adagrad_ref, 2, 0.5)
  for _, mode in ipairs({"standard", "nesterov"}) do
    local mo = {alpha = 0.9, beta = 0.3, mode = mode, norm_coefficient = 0.02}
    local mor = {alpha = f32(0.9), beta = f32(0.3), mode = mode, norm = f32(0.02)}
    for _, T in ipairs({0, 5}) do
      optimizer_case("Momentum", mo, mor, 1, two, momentum_ref, T, 0.05)
    end
    optimizer_case("Momentum", mo, mor, 1, one, momentum_ref, 1, 0.05)
  end
  local ad = {alpha = 0.8, beta = 0.95, epsilon = 1e-3, norm_coefficient = 0.01, norm_coefficient_post = 0.05}
  local adr = {alpha = f32(0.8), beta = f32(0.95), eps = f32(1e-3), norm = f32(0.01), post = f32(0.05)}
  for _, T in ipairs({0, 1, 4}) do
    optimizer_case("Adam", ad, adr, 2, two, adam_ref, T, 0.01)
  end
  optimizer_case("Adam", {}, {alpha = f32(0.9), beta = f32(0.999), eps = f32(1e-6), norm = 0, post = 0}, 2, one,
                 adam_ref, 3, 0.01)

  -- refusals and errors
  local ins = {{"R", "float", {}}, {"T", "int64", {}}, {"X", "float", {2}}, {"G", "float", {2}}, {"V", "float", {2}}}
  local function mo(attrs, o)
    o = o or {}
    local domain = o.domain
    if domain == nil then domain = TRAINING elseif domain == false then domain = nil end
    return model(o.op or "Momentum", {domain = domain, opset = o.opset or 1,
      node_domain = o.node_domain == nil and TRAINING or o.node_domain or nil, also = o.also,
      attrs = attrs, inputs = o.inputs or ins, outputs = o.outputs or {"Xn", "Vn"}})
  end
  local full = {alpha = 0.9, beta = 0.1, mode = "standard", norm_coefficient = 0.0}
  t.raises(function() mo({alpha = 0.9, beta = 0.1, norm_coefficient = 0.0}) end, "attribute 'mode' is required",
           "Momentum without mode is an error")
  t.raises(function() mo({alpha = 0.9, beta = 0.1, mode = "heavy", norm_coefficient = 0.0}) end,
           "mode 'heavy' %(standard or nesterov%)", "Momentum mode 'heavy' is an error")
  t.raises(function() mo(full, {inputs = {ins[1], ins[2], ins[3], ins[4]}}) end,
           "4 inputs %(expected R, T, then 3 per tensor updated%)", "Momentum with a state missing is an error")
  t.raises(function() mo(full, {outputs = {"a", "b", "c"}}) end, "3 outputs for 1 tensors", "Momentum with too many outputs")
  t.raises(function() mo({foo = 1}, {op = "Adam", inputs = {ins[1], ins[2], ins[3], ins[4], ins[5], ins[5]}}) end,
           "attribute 'foo' is unsupported", "Adam: an unknown attribute is refused")
  local bad_t = mo(full, {inputs = {ins[1], {"T", "float", {}}, ins[3], ins[4], ins[5]}})
  t.raises(function() bad_t(fl.full({}, 0.1), fl.full({}, 1.0), fl.randn(2), fl.randn(2), fl.randn(2)) end,
           "T must be int64, got float32", "Momentum: a float T is an error")
  local bad_r = mo(full, {inputs = {{"R", "float", {2}}, ins[2], ins[3], ins[4], ins[5]}})
  t.raises(function() bad_r(fl.randn(2), fl.full({}, 1, {dtype = "int64"}), fl.randn(2), fl.randn(2), fl.randn(2)) end,
           "R and T must hold one value each", "Momentum: an R of two values is an error")
  t.raises(function() mo({}, {op = "Gradient"}) end,
           "node 'n' %(Gradient, opset 1%): op Gradient %(the gradients of a graph's values, computed by the runtime%) is unsupported",
           "Gradient is refused by name")
  t.raises(function() mo({}, {op = "Sgd"}) end, "op Sgd of ai.onnx.preview.training is unsupported",
           "another op of the training domain is refused")
  t.raises(function() mo({}, {op = "Relu", node_domain = false, inputs = {ins[3]}, outputs = {"y"}}) end,
           "op Relu: the model imports no ai.onnx opset %(only ai.onnx.preview.training%) is unsupported",
           "an ai.onnx node in a model that imports only the training domain is refused")
  t.raises(function() mo(full, {domain = false, opset = 17}) end,
           "domain ai.onnx.preview.training, which the model does not import",
           "a training node without the domain's import is an error")
  t.raises(function() mo(full, {opset = 2}) end, "opset 2 of ai.onnx.preview.training is unsupported %(1 known%)",
           "version 2 of the training domain is refused")
  -- both imports: the optimizer next to ai.onnx ops
  local both_m = mo(full, {domain = false, opset = 17, also = {TRAINING, 1}})
  local x, g, v = fl.randn(2), fl.randn(2), fl.randn(2)
  local xn, vn = both_m(fl.full({}, 0.5), fl.full({}, 0, {dtype = "int64"}), x, g, v)
  local want = momentum_ref({alpha = f32(0.9), beta = f32(0.1), mode = "standard", norm = 0}, 0.5, 0, flat(x), flat(g), flat(v))
  t.ok(close(flat(xn), want[1], 1e-5, 1e-6) and close(flat(vn), want[2], 1e-5, 1e-6),
       "a model importing ai.onnx and the training domain runs Momentum")
  t.ok(tostring(both_m):find("opset 17", 1, true), "its opset is ai.onnx's")
end

-- ---- TfIdfVectorizer (integer tokens) --------------------------------------------
-- The reference as the spec words it: for each skip distance d (1 to
-- max_skip_count + 1) and each start, the n-grams x[s], x[s+d], ... of
-- every length from min to max (unigrams at d = 1 only) that lie in the
-- row, looked up in the pool (a repeated pool n-gram: its last index).
local function tfidf_ref(rows, a)
  local map, id = {}, 0
  for n = 1, #a.ngram_counts do
    local first, stop = a.ngram_counts[n], a.ngram_counts[n + 1] or #a.pool_int64s
    for k = first, stop - 1, n do
      id = id + 1
      map[table.concat(a.pool_int64s, ",", k + 1, k + n)] = {n = n, col = a.ngram_indexes[id]}
    end
  end
  local width = 0
  for _, i in ipairs(a.ngram_indexes) do width = math.max(width, i + 1) end
  local out = {}
  for b, row in ipairs(rows) do
    local cnt = {}
    for c = 1, width do cnt[c] = 0 end
    for d = 1, a.max_skip_count + 1 do
      for s0 = 1, #row do
        for n = (d == 1 and a.min_gram_length or math.max(2, a.min_gram_length)), a.max_gram_length do
          local last = s0 + (n - 1) * d
          if last <= #row then
            local toks = {}
            for j = 0, n - 1 do toks[#toks + 1] = row[s0 + j * d] end
            local hit = map[table.concat(toks, ",")]
            if hit and hit.n == n then cnt[hit.col + 1] = cnt[hit.col + 1] + 1 end
          end
        end
      end
    end
    for c = 1, width do
      local w = a.weights and a.weights.floats[c] or 1
      if a.mode == "IDF" then cnt[c] = cnt[c] > 0 and f32(w) or 0
      elseif a.mode == "TFIDF" then cnt[c] = cnt[c] * f32(w) end
    end
    out[b] = cnt
  end
  return out
end

do
  local function shuffle(n)
    local p = {}
    for i = 1, n do p[i] = i - 1 end
    for i = n, 2, -1 do
      local j = math.random(i)
      p[i], p[j] = p[j], p[i]
    end
    return p
  end
  math.randomseed(3)
  local cases = {
    {B = 3, C = 12, min = 1, max = 2, skip = 5, mode = "TF"},
    {B = 0, C = 9, min = 2, max = 3, skip = 2, mode = "TF"},
    {B = 2, C = 5, min = 1, max = 3, skip = 0, mode = "IDF", weights = true},
    {B = 4, C = 8, min = 1, max = 1, skip = 3, mode = "TFIDF", weights = true},
    {B = 2, C = 10, min = 2, max = 2, skip = 9, mode = "IDF"},
    {B = 0, C = 7, min = 1, max = 3, skip = 1, mode = "TFIDF", dtype = "int32"},
  }
  for ci, c in ipairs(cases) do
    -- tokens 0..4, so that n-grams recur; 3 unigrams, 3 bigrams, 2 trigrams
    -- (one bigram repeated: its last copy's index counts)
    local pool = {}
    for i = 1, 3 + 6 + 6 do pool[i] = math.random(0, 4) end
    pool[8], pool[9] = pool[4], pool[5]
    local a = {min_gram_length = c.min, max_gram_length = c.max, max_skip_count = c.skip, mode = c.mode,
               ngram_counts = {0, 3, 9}, ngram_indexes = shuffle(8), pool_int64s = pool}
    if c.weights then
      a.weights = {floats = {}}
      for i = 1, 8 do a.weights.floats[i] = math.random() * 2 end
    end
    local rows = {}
    for b = 1, math.max(c.B, 1) do
      rows[b] = {}
      for i = 1, c.C do rows[b][i] = math.random(0, 4) end
    end
    local dims = c.B == 0 and {c.C} or {c.B, c.C}
    local m = model("TfIdfVectorizer", {attrs = a, inputs = {{"x", c.dtype or "int64", dims}}})
    local x = fl.tensor(c.B == 0 and rows[1] or rows, {dtype = "int64"})
    local want = tfidf_ref(rows, a)
    local e, cc = both(m, x)
    local wl = {}
    for _, r in ipairs(want) do for _, v in ipairs(r) do wl[#wl + 1] = v end end
    local tag = ("TfIdfVectorizer %s, grams %d-%d, skips %d, [%s]%s"):format(c.mode, c.min, c.max, c.skip,
                table.concat(dims, ","), c.dtype and " int32" or "")
    local shape_ok = #e[1].shape == #dims and e[1].shape[#dims] == 8 and e[1].dtype == "float32"
    t.ok(shape_ok and close(flat(e[1]), wl, 1e-6, 0), tag .. ", eagerly")
    t.ok(close(flat(cc[1]), wl, 1e-6, 0), tag .. ", compiled")
  end
  local base = {min_gram_length = 1, max_gram_length = 2, max_skip_count = 0, mode = "TF",
                ngram_counts = {0, 2}, ngram_indexes = {0, 1, 2}, pool_int64s = {1, 2, 3, 4}}
  local function with(k, v)
    local a = {}
    for kk, vv in pairs(base) do a[kk] = vv end
    a[k] = v
    return a
  end
  local function tf(a, dtype, dims)
    return model("TfIdfVectorizer", {attrs = a, inputs = {{"x", dtype or "int64", dims or {4}}}})
  end
  local hand = tf(base)(fl.tensor({1, 3, 4, 1}, {dtype = "int64"}))
  t.is(flat(hand), {2, 0, 1}, "TfIdfVectorizer by hand: unigram 1 twice, bigram (3, 4) once")
  t.raises(function() tf(with("pool_strings", {strings = {"a"}})) end, "pool_strings %(string tokens%) is unsupported",
           "TfIdfVectorizer: string tokens stay unsupported")
  t.raises(function() tf(with("mode", "BM25")) end, "mode 'BM25' %(TF, IDF or TFIDF%)", "TfIdfVectorizer: an unknown mode")
  t.raises(function() tf(with("ngram_counts", {0, 3})) end, "1 pool values for 2%-grams",
           "TfIdfVectorizer: a pool segment not a multiple of its n")
  t.raises(function() tf(with("ngram_indexes", {0, 1})) end, "2 ngram_indexes for more n%-grams",
           "TfIdfVectorizer: too few ngram_indexes")
  t.raises(function() tf(with("weights", {floats = {1.0, 2.0}})) end, "2 weights for 3 output columns is unsupported",
           "TfIdfVectorizer: weights not one per output column")
  t.raises(function() tf(with("min_gram_length", 3)) end, "gram lengths 3 to 2", "TfIdfVectorizer: min above max")
  t.raises(function() tf(base, "float")(fl.randn(4)) end, "tokens of dtype float32 %(int32 and int64 only%) is unsupported",
           "TfIdfVectorizer: float tokens are refused")
  t.raises(function() tf(base, "int64", {2, 2, 2})(fl.zeros({2, 2, 2}, {dtype = "int64"})) end,
           "input of 3 dims %(1 or 2%)", "TfIdfVectorizer: a 3-d input is an error")
end

t.done()
