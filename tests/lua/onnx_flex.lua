-- onnx_flex.lua -- fl.load_onnx's FlexAttention (the ai.onnx.preview
-- domain): one-node models, with and without the score_mod and prob_mod
-- subgraphs, grouped-query heads, a scale, float16, bfloat16 and float64, run
-- eagerly and compiled for the cpu backend (fullgraph: the subgraphs are
-- ops of the one graph) against attention computed here in plain Lua
-- loops (double precision); then what is refused or an error.
local t = require "tap"
local P = require "onnx_proto"

local dir = t.tmpdir()
local nfile = 0
local PREVIEW = "ai.onnx.preview"

-- A one-node FlexAttention model.  o.inputs: {{name, dtype, dims}}
-- (default Q, K, V); o.attrs: the node's; o.op, o.node_domain: another op
-- or domain (false: the default one); o.imports: the imports beyond the
-- first {domain, version} (default ai.onnx 26 and ai.onnx.preview 1).
local function model(o)
  local vals, names = {}, {}
  for i, v in ipairs(o.inputs) do vals[i] = {name = v[1], dtype = v[2], dims = v[3]}; names[i] = v[1] end
  local node_domain = o.node_domain
  if node_domain == nil then node_domain = PREVIEW elseif node_domain == false then node_domain = nil end
  local imports = o.imports or {{false, 26}, {PREVIEW, 1}}
  local first = imports[1]
  local bytes = P.model{opset = first[2], domain = first[1] or nil,
    nodes = {{op = o.op or "FlexAttention", domain = node_domain, inputs = o.node_inputs or {"Q", "K", "V"},
              outputs = {"Y"}, name = "n", attrs = o.attrs}},
    inputs = vals, outputs = {{name = "Y", dtype = "none"}}}
  for i = 2, #imports do
    local d = imports[i]
    bytes = bytes .. P.bytes(8, (d[1] and P.bytes(1, d[1]) or "") .. P.vint(2, d[2]))
  end
  nfile = nfile + 1
  return fl.load_onnx(P.write(dir .. "/m" .. nfile .. ".onnx", bytes))
end

local function flat(x) return x:reshape({-1}):tolist() end

-- Lists a and b equal within rtol * |b| + atol, element by element (NaN
-- where b has NaN).
local function close(a, b, rtol, atol)
  if #a ~= #b then return false end
  for i = 1, #a do
    if b[i] ~= b[i] then
      if a[i] == a[i] then return false end
    elseif not (math.abs(a[i] - b[i]) <= rtol * math.abs(b[i]) + atol) then return false end
  end
  return true
end

-- Attention in double, element by element: q [B,Hq,L,E], k [B,Hkv,S,E],
-- v [B,Hkv,S,Ev] as flat lists; query head h reads K/V head
-- (h-1) // (Hq/Hkv) + 1; score_mod(s, b, h, i, j) and prob_mod(p, b, h,
-- i, j) act on each element (1-based indices).  Returns Y flat.
local function ref(q, k, v, dims, scale, score_mod, prob_mod)
  local B, Hq, L, E, Hkv, S, Ev = table.unpack(dims)
  local group = Hq // Hkv
  local y = {}
  for b = 1, B do
    for h = 1, Hq do
      local hk = (h - 1) // group + 1
      for i = 1, L do
        local s = {}
        for j = 1, S do
          local acc = 0
          for e = 1, E do
            acc = acc + q[(((b - 1) * Hq + h - 1) * L + i - 1) * E + e] * k[(((b - 1) * Hkv + hk - 1) * S + j - 1) * E + e]
          end
          s[j] = acc * scale
          if score_mod then s[j] = score_mod(s[j], b, h, i, j) end
        end
        local m = -math.huge
        for j = 1, S do m = math.max(m, s[j]) end
        local sum, p = 0, {}
        for j = 1, S do p[j] = math.exp(s[j] - m); sum = sum + p[j] end
        for j = 1, S do
          p[j] = p[j] / sum
          if prob_mod then p[j] = prob_mod(p[j], b, h, i, j) end
        end
        for e = 1, Ev do
          local acc = 0
          for j = 1, S do acc = acc + p[j] * v[(((b - 1) * Hkv + hk - 1) * S + j - 1) * Ev + e] end
          y[(((b - 1) * Hq + h - 1) * L + i - 1) * Ev + e] = acc
        end
      end
    end
  end
  return y
end

-- The float32 value of a double (attributes are stored as float32).
local function f32(v) return string.unpack("<f", string.pack("<f", v)) end

local function shape_of(x)
  local s = {}
  for d = 1, x:dim() do s[d] = x.shape[d] end
  return s
end

-- One case: a model over Q [B,Hq,L,E], K [B,Hkv,S,E], V [B,Hkv,S,Ev] of
-- dtype (ONNX name; bfloat16 by its code, 16: onnx_proto has no name for
-- it), checked eagerly and compiled (one graph) against ref.
-- o.attrs, o.scale (the reference's), o.score_mod, o.prob_mod (Lua
-- functions), o.extra: {{name, dtype, dims, tensor}} inputs after V that
-- the subgraphs read by name; o.rtol, o.atol.
local function case(tag, dtype, dims, o)
  local B, Hq, L, E, Hkv, S, Ev = table.unpack(dims)
  local fdt = ({float = "float32", double = "float64", float16 = "float16", [16] = "bfloat16"})[dtype]
  local ins = {{"Q", dtype, {B, Hq, L, E}}, {"K", dtype, {B, Hkv, S, E}}, {"V", dtype, {B, Hkv, S, Ev}}}
  local args = {fl.randn({B, Hq, L, E}):to(fdt), fl.randn({B, Hkv, S, E}):to(fdt), fl.randn({B, Hkv, S, Ev}):to(fdt)}
  for _, x in ipairs(o.extra or {}) do ins[#ins + 1] = {x[1], x[2], x[3]}; args[#args + 1] = x[4] end
  local m = model{inputs = ins, attrs = o.attrs}
  -- the scale as the reference applies it: Q and K each times its square
  -- root, rounded to float32
  local sc = f32(math.sqrt(f32(o.scale or 1 / math.sqrt(E)))) ^ 2
  local want = ref(flat(args[1]), flat(args[2]), flat(args[3]), dims, sc, o.score_mod, o.prob_mod)
  local e = m(table.unpack(args))
  local c = fl.compile(m, {backend = "cpu", fullgraph = true})(table.unpack(args))
  local rtol, atol = o.rtol or 1e-5, o.atol or 1e-5
  local good_shape = table.concat(shape_of(e), ",") == table.concat({B, Hq, L, Ev}, ",")
  t.ok(good_shape and e.dtype == fdt and close(flat(e), want, rtol, atol), tag .. ": eagerly")
  t.ok(c.dtype == fdt and close(flat(c), want, rtol, atol), tag .. ": compiled as one graph")
end

-- subgraphs: {graph = {nodes=, inputs=, outputs=, inits=}} of one input
-- "s" and one output "o" [B,H,L,S] (symbolic dims, as exporters write)
local function sub(nodes, inits, dtype)
  local dims = {"B", "H", "L", "S"}
  return {graph = {name = "mod", nodes = nodes, inits = inits,
    inputs = {{name = "s", dtype = dtype or "float", dims = dims}},
    outputs = {{name = "o", dtype = dtype or "float", dims = dims}}}}
end
local function node(op, inputs, outputs, attrs) return {op = op, inputs = inputs, outputs = outputs, attrs = attrs} end
local function ints(name, v) return {name = name, dtype = "int64", dims = {#v}, ints = v} end
local function float(name, v) return {name = name, dtype = "float", dims = {}, floats = {v}} end

-- causal: positions j > i masked (-inf), the indices built from the
-- scores' shape (Shape, Gather, Range) and broadcast
local causal = sub({
  node("Shape", {"s"}, {"shape"}),
  node("Gather", {"shape", "two"}, {"L"}, {axis = 0}),
  node("Gather", {"shape", "three"}, {"S"}, {axis = 0}),
  node("Range", {"zero", "L", "one"}, {"qr"}),
  node("Reshape", {"qr", "qshape"}, {"qi"}),
  node("Range", {"zero", "S", "one"}, {"kr"}),
  node("Reshape", {"kr", "kshape"}, {"ki"}),
  node("GreaterOrEqual", {"qi", "ki"}, {"keep"}),
  node("Where", {"keep", "s", "ninf"}, {"o"})},
  {{name = "zero", dtype = "int64", dims = {}, ints = {0}}, {name = "one", dtype = "int64", dims = {}, ints = {1}},
   {name = "two", dtype = "int64", dims = {}, ints = {2}}, {name = "three", dtype = "int64", dims = {}, ints = {3}},
   ints("qshape", {1, 1, -1, 1}), ints("kshape", {1, 1, 1, -1}), float("ninf", -math.huge)})
local function causal_ref(s, _, _, i, j) return j <= i and s or -math.huge end

-- soft cap: cap * tanh(s / cap)
local softcap = sub({node("Div", {"s", "cap"}, {"d"}), node("Tanh", {"d"}, {"th"}), node("Mul", {"th", "cap"}, {"o"})},
                    {float("cap", 2.0)})
local function softcap_ref(s) return 2 * math.tanh(s / 2) end

-- prob_mod: p^2 * 0.5 (no longer summing to 1, as the spec allows)
local square_half = sub({node("Mul", {"s", "s"}, {"sq"}), node("Mul", {"sq", "half"}, {"o"})}, {float("half", 0.5)})
local function square_half_ref(p) return p * p * 0.5 end

-- score_mod reading the enclosing graph's input "bias" [L, S] by name
local add_bias = sub({node("Add", {"s", "bias"}, {"o"})})

fl.manual_seed(11)

do
  -- B, Hq, L, E, Hkv, S, Ev
  local d = {2, 2, 3, 4, 2, 5, 6}
  case("FlexAttention float32, L 3, S 5, head sizes 4 and 6", "float", d, {})
  case("scale 0.3", "float", d, {attrs = {scale = 0.3}, scale = 0.3})
  case("grouped-query heads (4 over 2)", "float", {1, 4, 3, 4, 2, 5, 4}, {})
  case("grouped-query heads (6 over 3), scale 0.5", "float", {2, 6, 2, 3, 3, 4, 2},
       {attrs = {scale = 0.5}, scale = 0.5})
  case("one K/V head for four query heads", "float", {1, 4, 2, 4, 1, 3, 4}, {})
  local sq = {1, 2, 4, 8, 2, 4, 8}
  case("score_mod: causal mask from the scores' shape", "float", sq, {attrs = {score_mod = causal}, score_mod = causal_ref})
  case("score_mod: soft cap", "float", d, {attrs = {score_mod = softcap}, score_mod = softcap_ref})
  case("prob_mod: p^2 / 2", "float", d, {attrs = {prob_mod = square_half}, prob_mod = square_half_ref})
  case("score_mod and prob_mod, grouped-query heads, scale 0.25", "float", {2, 4, 4, 4, 2, 4, 3},
       {attrs = {score_mod = causal, prob_mod = square_half, scale = 0.25}, scale = 0.25,
        score_mod = causal_ref, prob_mod = square_half_ref})
  local bias = fl.randn({3, 5})
  local bl = flat(bias)
  case("score_mod reading a graph input by name", "float", d,
       {attrs = {score_mod = add_bias}, extra = {{"bias", "float", {3, 5}, bias}},
        score_mod = function(s, _, _, i, j) return s + bl[(i - 1) * 5 + j] end})
  case("float64", "double", d, {rtol = 1e-12, atol = 1e-12})
  case("float64, score_mod soft cap (a float64 subgraph)", "double", d,
       {attrs = {score_mod = sub(softcap.graph.nodes, {{name = "cap", dtype = "double", dims = {}, raw = string.pack("<d", 2)}}, "double")},
        score_mod = softcap_ref, rtol = 1e-12, atol = 1e-12})
  case("float64, scale 0.3 (its square root rounded to float32, as the reference)", "double", d,
       {attrs = {scale = 0.3}, scale = 0.3, rtol = 1e-12, atol = 1e-12})
  case("float16 (softmax in float32)", "float16", d, {rtol = 5e-3, atol = 5e-3})
  case("float16, causal score_mod over float32 scores, grouped-query heads", "float16", {1, 4, 4, 8, 2, 4, 8},
       {attrs = {score_mod = causal}, score_mod = causal_ref, rtol = 5e-3, atol = 5e-3})
  case("bfloat16 (softmax in float32)", 16, d, {rtol = 3e-2, atol = 3e-2})
  case("float32, softmax_precision double", "float", d, {attrs = {softmax_precision = 11}})
end

-- a fully masked row is NaN, as the reference's softmax gives
do
  local all = sub({node("Mul", {"s", "zero"}, {"z"}), node("Add", {"z", "ninf"}, {"o"})},
                  {float("zero", 0), float("ninf", -math.huge)})
  local m = model{inputs = {{"Q", "float", {1, 1, 2, 2}}, {"K", "float", {1, 1, 3, 2}}, {"V", "float", {1, 1, 3, 2}}},
                  attrs = {score_mod = all}}
  local y = m(fl.randn({1, 1, 2, 2}), fl.randn({1, 1, 3, 2}), fl.randn({1, 1, 3, 2}))
  local nan = true
  for _, x in ipairs(flat(y)) do nan = nan and x ~= x end
  t.ok(nan, "every score -inf: NaN, as the reference")
end

-- a symbolic batch: one compile serves two sizes (2 and 3: a size 1 is
-- specialized)
do
  local m = model{inputs = {{"Q", "float", {"N", 2, 3, 4}}, {"K", "float", {"N", 2, 5, 4}}, {"V", "float", {"N", 2, 5, 4}}},
                  attrs = {score_mod = softcap}}
  local cm = fl.compile(m, {backend = "cpu"})
  local ok = true
  for _, n in ipairs({2, 3}) do
    local q, k, v = fl.randn({n, 2, 3, 4}), fl.randn({n, 2, 5, 4}), fl.randn({n, 2, 5, 4})
    local want = ref(flat(q), flat(k), flat(v), {n, 2, 3, 4, 2, 5, 4}, 0.5, softcap_ref)
    ok = ok and close(flat(cm(q, k, v)), want, 1e-5, 1e-5) and close(flat(m(q, k, v)), want, 1e-5, 1e-5)
  end
  t.ok(ok, "a symbolic batch (2, then 3): eagerly and compiled")
  t.is(cm:stats().recompiles, 0, "one compile for both batch sizes")
end

-- refusals and errors
do
  local qkv = {{"Q", "float", {1, 2, 3, 4}}, {"K", "float", {1, 2, 3, 4}}, {"V", "float", {1, 2, 3, 4}}}
  t.raises(function() model{inputs = qkv, op = "FlexAttn"} end,
           "node 'n' %(FlexAttn, opset 1%): op FlexAttn of ai.onnx.preview is unsupported",
           "another op of the preview domain is refused naming the op and the domain")
  t.raises(function() model{inputs = qkv, attrs = {is_causal = 1}} end, "attribute 'is_causal' is unsupported",
           "an unknown attribute is refused")
  t.raises(function() model{inputs = qkv, attrs = {softmax_precision = 7}} end, "softmax_precision 7 is unsupported",
           "softmax_precision int64 is refused")
  t.raises(function() model{inputs = qkv, attrs = {score_mod = 3}} end, "attribute 'score_mod' must be a graph",
           "a score_mod that is no graph is an error")
  local two_out = {graph = {name = "mod", nodes = {node("Identity", {"s"}, {"o"}), node("Identity", {"s"}, {"o2"})},
    inputs = {{name = "s", dtype = "float"}}, outputs = {{name = "o", dtype = "float"}, {name = "o2", dtype = "float"}}}}
  t.raises(function() model{inputs = qkv, attrs = {prob_mod = two_out}} end,
           "prob_mod: a graph of 1 inputs and 2 outputs %(1 and 1%)", "a prob_mod of two outputs is an error")
  local bad_mod = sub({node("FooBar", {"s"}, {"o"})})
  t.raises(function() model{inputs = qkv, attrs = {score_mod = bad_mod}} end, "op FooBar is unsupported",
           "an unknown op inside score_mod is refused")
  t.raises(function() model{inputs = qkv, imports = {{false, 26}}} end,
           "domain ai.onnx.preview, which the model does not import",
           "a preview node without the domain's import is an error")
  t.raises(function() model{inputs = qkv, imports = {{false, 26}, {PREVIEW, 2}}} end,
           "opset 2 of ai.onnx.preview is unsupported %(1 known%)", "version 2 of the preview domain is refused")
  t.raises(function() model{inputs = qkv, node_domain = "com.example"} end,
           "domain 'com.example' is unsupported %(only ai.onnx, ai.onnx.ml, ai.onnx.preview and ai.onnx.preview.training%)",
           "an unknown domain is still refused")
  t.raises(function() model{inputs = qkv, node_domain = false} end, "op FlexAttention is unsupported",
           "FlexAttention of the default domain is refused")
  t.raises(function() model{inputs = qkv, attrs = {score_mod = causal}, imports = {{PREVIEW, 1}}} end,
           "op Shape: the model imports no ai.onnx opset %(only ai.onnx.preview%) is unsupported",
           "a subgraph's ai.onnx ops in a model importing only the preview domain are refused")
  -- the preview domain alone: FlexAttention without subgraphs loads
  local alone = model{inputs = qkv, imports = {{PREVIEW, 1}}}
  local q, k, v = fl.randn({1, 2, 3, 4}), fl.randn({1, 2, 3, 4}), fl.randn({1, 2, 3, 4})
  t.ok(close(flat(alone(q, k, v)), ref(flat(q), flat(k), flat(v), {1, 2, 3, 4, 2, 3, 4}, 0.5), 1e-5, 1e-5),
       "a model importing only the preview domain runs FlexAttention")
  t.is(alone.opset, 0, "its ai.onnx opset is 0")
  local gqa = model{inputs = {{"Q", "float", {1, 3, 2, 4}}, {"K", "float", {1, 2, 2, 4}}, {"V", "float", {1, 2, 2, 4}}}}
  t.raises(function() gqa(fl.randn({1, 3, 2, 4}), fl.randn({1, 2, 2, 4}), fl.randn({1, 2, 2, 4})) end,
           "3 query heads over 2 key heads", "query heads not a multiple of the K/V heads are an error")
  local r3 = model{inputs = {{"Q", "float", {2, 3, 4}}, {"K", "float", {2, 3, 4}}, {"V", "float", {2, 3, 4}}}}
  t.raises(function() r3(fl.randn({2, 3, 4}), fl.randn({2, 3, 4}), fl.randn({2, 3, 4})) end, "Q of 3 dims %(4%)",
           "rank-3 inputs are an error")
  local hs = model{inputs = {{"Q", "float", {1, 2, 3, 4}}, {"K", "float", {1, 2, 3, 5}}, {"V", "float", {1, 2, 3, 4}}}}
  t.raises(function() hs(fl.randn({1, 2, 3, 4}), fl.randn({1, 2, 3, 5}), fl.randn({1, 2, 3, 4})) end,
           "the head sizes of Q and K differ %(4 and 5%)", "Q and K of different head sizes are an error")
  local i64 = model{inputs = {{"Q", "int64", {1, 1, 2, 2}}, {"K", "int64", {1, 1, 2, 2}}, {"V", "int64", {1, 1, 2, 2}}}}
  local z = fl.zeros({1, 1, 2, 2}, {dtype = "int64"})
  t.raises(function() i64(z, z, z) end, "Q of dtype int64 is unsupported", "int64 inputs are refused")
end

t.done()
