-- nn.lua -- the nn modules and fl.models: printing, parameters and their
-- names, shapes through every module, values where they are easy to
-- compute, training and eval mode, containers, errors, and the
-- fl.save_weights / fl.load_weights round trip with every error case.
local fl = fl or require "fuselab"
local t = require "tap"
local nn = fl.nn

local function shape(x) return x.shape end
local function numel(list)
  local n = 0
  for _, p in ipairs(list) do n = n + p:numel() end
  return n
end
local function max_abs(x) return x:abs():amax():item() end
local function farange(n) return fl.arange(n):to("float32") end

fl.manual_seed(7)

---------------------------------------------------------------------------
-- printing (Torch7's layout)
---------------------------------------------------------------------------
t.is(tostring(nn.Linear(10, 20)), "nn.Linear(10 -> 20)", "print Linear")
t.is(tostring(nn.Linear(10, 20, false)), "nn.Linear(10 -> 20) without bias", "print Linear without bias")
t.is(tostring(nn.Linear(3, 4, {bias = false})), "nn.Linear(3 -> 4) without bias", "Linear {bias=false}")
t.is(tostring(nn.ReLU()), "nn.ReLU", "print ReLU")
t.is(tostring(nn.GELU()), "nn.GELU", "print GELU")
t.is(tostring(nn.GELU{approximate = "tanh"}), "nn.GELU(approximate=tanh)", "print GELU tanh")
t.is(tostring(nn.Softmax(2)), "nn.Softmax(dim=2)", "print Softmax")
t.is(tostring(nn.LayerNorm(32)), "nn.LayerNorm(32)", "print LayerNorm")
t.is(tostring(nn.LayerNorm({4, 8}, {eps = 1e-6})), "nn.LayerNorm(4x8, eps=1e-06)", "print LayerNorm shape, eps")
t.is(tostring(nn.RMSNorm(16)), "nn.RMSNorm(16)", "print RMSNorm")
t.is(tostring(nn.Dropout(0.1)), "nn.Dropout(0.1)", "print Dropout")
t.is(tostring(nn.Embedding(50, 32)), "nn.Embedding(50, 32)", "print Embedding")
t.is(tostring(nn.Conv2d(3, 8, 3)), "nn.Conv2d(3 -> 8, 3x3)", "print Conv2d, defaults")
t.is(tostring(nn.Conv2d(3, 8, 3, {padding = 1})), "nn.Conv2d(3 -> 8, 3x3, 1,1, 1,1)", "print Conv2d padding")
t.is(tostring(nn.Conv2d(3, 8, {5, 3}, {stride = 2, bias = false})),
     "nn.Conv2d(3 -> 8, 5x3, 2,2) without bias", "print Conv2d stride, no bias")
t.is(tostring(nn.BatchNorm2d(8)), "nn.BatchNorm2d(8)", "print BatchNorm2d")
t.is(tostring(nn.MaxPool2d(2)), "nn.MaxPool2d(2x2, 2,2)", "print MaxPool2d")
t.is(tostring(nn.AvgPool2d(3, {stride = 1, padding = 1})), "nn.AvgPool2d(3x3, 1,1, 1,1)", "print AvgPool2d")
t.is(tostring(nn.Flatten()), "nn.Flatten", "print Flatten")
t.is(tostring(nn.Linear), "nn.Linear", "print a class")
t.is(tostring(nn.Sequential(nn.Linear(10, 20), nn.ReLU(), nn.Sequential(nn.Linear(20, 2), nn.Tanh))),
     table.concat({
       "nn.Sequential {",
       "  [input -> (1) -> (2) -> (3) -> output]",
       "  (1): nn.Linear(10 -> 20)",
       "  (2): nn.ReLU",
       "  (3): nn.Sequential {",
       "    [input -> (1) -> (2) -> output]",
       "    (1): nn.Linear(20 -> 2)",
       "    (2): nn.Tanh",
       "  }",
       "}"}, "\n"), "print nested Sequential, numbered and indented")
t.is(tostring(nn.MultiheadAttention(8, 2, {causal = true})),
     table.concat({
       "nn.MultiheadAttention(8, heads=2, causal) {",
       "  (q_proj): nn.Linear(8 -> 8)",
       "  (k_proj): nn.Linear(8 -> 8)",
       "  (v_proj): nn.Linear(8 -> 8)",
       "  (out_proj): nn.Linear(8 -> 8)",
       "}"}, "\n"), "print MultiheadAttention with named children")
t.ok(tostring(nn.TransformerBlock(8, 2)):find("^nn.TransformerBlock%(8, heads=2%) {\n  %(ln1%): nn.LayerNorm%(8%)"),
     "print TransformerBlock")

---------------------------------------------------------------------------
-- parameters: lists, names (PyTorch's), counts, initialization
---------------------------------------------------------------------------
do
  local l = nn.Linear(10, 20)
  t.is(shape(l.weight), {20, 10}, "Linear weight is [out, in]")
  t.is(shape(l.bias), {20}, "Linear bias is [out]")
  t.is(#l:parameters(), 2, "Linear: two parameters")
  t.is(l:nparameters(), 220, "Linear: 220 elements")
  local map, names = l:named_parameters()
  t.is(names, {"weight", "bias"}, "Linear: names in order")
  t.ok(map.weight == l.weight, "named_parameters gives the tensors themselves")
  local bound = 1 / math.sqrt(10)
  t.ok(max_abs(l.weight) <= bound and max_abs(l.bias) <= bound, "Linear init within 1/sqrt(in)")
  t.ok(max_abs(l.weight) > bound / 2, "Linear init spreads over the bound")
  t.is(#nn.Linear(3, 4, false):parameters(), 1, "Linear without bias: one parameter")
end

do
  local e = nn.Embedding(1000, 16)
  local w = e.weight
  local mean = w:mean():item()
  local var = w:var():item()
  t.ok(math.abs(mean) < 0.05 and math.abs(var - 1) < 0.1, "Embedding init N(0, 1)")
  local ln = nn.LayerNorm(6)
  t.is(ln.weight:tolist(), {1, 1, 1, 1, 1, 1}, "LayerNorm weight ones")
  t.is(ln.bias:tolist(), {0, 0, 0, 0, 0, 0}, "LayerNorm bias zeros")
  t.is(#nn.LayerNorm(6, {affine = false}):parameters(), 0, "LayerNorm affine=false: no parameters")
  local c = nn.Conv2d(3, 8, 3)
  t.is(shape(c.weight), {8, 3, 3, 3}, "Conv2d weight [co, ci, kh, kw]")
  t.ok(max_abs(c.weight) <= 1 / math.sqrt(27), "Conv2d init within 1/sqrt(ci*kh*kw)")
  local bn = nn.BatchNorm2d(4)
  t.is(#bn:parameters(), 2, "BatchNorm2d: weight and bias are parameters")
  local bufs, bnames = bn:named_buffers()
  t.is(bnames, {"running_mean", "running_var", "num_batches_tracked"}, "BatchNorm2d buffers")
  t.is(bufs.running_var:tolist(), {1, 1, 1, 1}, "running_var starts at ones")
  t.is(bufs.num_batches_tracked.dtype, "int64", "num_batches_tracked is int64")
end

do
  local m = fl.models.mlp{sizes = {16, 32, 32, 4}, act = "gelu"}
  local _, names = m:named_parameters()
  t.is(names, {"0.weight", "0.bias", "2.weight", "2.bias", "4.weight", "4.bias"}, "mlp: PyTorch names")
  t.is(m:nparameters(), 1732, "mlp: 1732 parameters (as PyTorch counts)")
  t.is(tostring(m.modules[2]), "nn.GELU", "mlp: activation between layers")
  t.is(#m, 5, "mlp: five modules (no activation after the last)")
end

do
  local g = fl.models.transformer{vocab = 50, d = 32, heads = 4, layers = 2, seq = 8}
  local map, names = g:named_parameters()
  t.is(#names, 37, "transformer: 37 parameter tensors")
  t.is(g:nparameters(), 28928, "transformer: 28928 parameters (as PyTorch counts)")
  t.is({names[1], names[2], names[3], names[5], names[16], names[#names]},
       {"tok_emb.weight", "pos_emb.weight", "blocks.0.ln1.weight", "blocks.0.attn.q_proj.weight",
        "blocks.0.mlp.0.bias", "head.weight"}, "transformer: names")
  t.ok(map["blocks.1.attn.q_proj.weight"] == g.blocks.modules[2].attn.q_proj.weight,
       "transformer: names reach the tensors")
  t.is(g.blocks.modules[2].attn.q_proj._path, "blocks.1.attn.q_proj", "_path of a nested module")
  t.is(g._path, "", "_path of the root")
  t.is(g.blocks._path, "blocks", "_path of a child")
  local p = g:parameters()
  t.is(#p, 37, "parameters() lists them")
  t.ok(p[1] == g.tok_emb.weight, "parameters() in name order")
end

do
  local c = fl.models.cnn{channels = {3, 4, 8}, classes = 5, input = 8}
  t.is(c:nparameters(), 597, "cnn: 597 parameters (as PyTorch counts)")
  local _, names = c:state_dict()
  t.is(#names, 16, "cnn: 16 entries in the state (parameters and buffers)")
  t.is({names[1], names[5], names[7], names[#names]},
       {"0.weight", "1.running_mean", "1.num_batches_tracked", "9.bias"}, "cnn: state names")
  t.is(tostring(c.modules[1]), "nn.Conv2d(3 -> 4, 3x3, 1,1, 1,1)", "cnn: conv 3x3 padding 1")
end

do -- tied weights are listed once, as PyTorch does
  local a = nn.Linear(4, 4)
  local s = nn.Sequential(a, a)
  t.is(#s:parameters(), 2, "a module used twice: its parameters once")
  local _, names = s:state_dict()
  t.is(#names, 4, "state_dict keeps both names")
end

---------------------------------------------------------------------------
-- shapes through every module, and values
---------------------------------------------------------------------------
do
  local x = fl.randn(2, 5, 10)
  t.is(shape(nn.Linear(10, 3)(x)), {2, 5, 3}, "Linear on [2,5,10]")
  for _, name in ipairs({"ReLU", "GELU", "SiLU", "Tanh", "Sigmoid"}) do
    t.is(shape(nn[name]()(x)), {2, 5, 10}, name .. " keeps the shape")
  end
  t.is(shape(nn.Softmax()(x)), {2, 5, 10}, "Softmax keeps the shape")
  t.is(shape(nn.LayerNorm(10)(x)), {2, 5, 10}, "LayerNorm keeps the shape")
  t.is(shape(nn.LayerNorm({5, 10})(x)), {2, 5, 10}, "LayerNorm over two dims")
  t.is(shape(nn.RMSNorm(10)(x)), {2, 5, 10}, "RMSNorm keeps the shape")
  t.is(shape(nn.Dropout(0.5)(x)), {2, 5, 10}, "Dropout keeps the shape")
  t.is(shape(nn.Embedding(20, 4)(fl.arange(6):reshape(2, 3))), {2, 3, 4}, "Embedding [2,3] -> [2,3,4]")
  local img = fl.randn(2, 3, 8, 8)
  t.is(shape(nn.Conv2d(3, 6, 3)(img)), {2, 6, 6, 6}, "Conv2d no padding")
  t.is(shape(nn.Conv2d(3, 6, 3, {padding = 1, stride = 2})(img)), {2, 6, 4, 4}, "Conv2d stride 2 padding 1")
  t.is(shape(nn.BatchNorm2d(3)(img)), {2, 3, 8, 8}, "BatchNorm2d keeps the shape")
  t.is(shape(nn.MaxPool2d(2)(img)), {2, 3, 4, 4}, "MaxPool2d 2")
  t.is(shape(nn.AvgPool2d(3, {stride = 1, padding = 1})(img)), {2, 3, 8, 8}, "AvgPool2d 3/1/1")
  t.is(shape(nn.Flatten()(img)), {2, 192}, "Flatten [2,3,8,8] -> [2,192]")
  t.is(shape(nn.Flatten(1, 2)(img)), {6, 8, 8}, "Flatten(1, 2)")
  t.is(shape(nn.MultiheadAttention(10, 2)(x)), {2, 5, 10}, "MultiheadAttention [B,T,d]")
  t.is(shape(nn.MultiheadAttention(10, 2)(fl.randn(5, 10))), {5, 10}, "MultiheadAttention [T,d]")
  t.is(shape(nn.MultiheadAttention(10, 5)(x, fl.randn(2, 7, 10))), {2, 5, 10}, "cross-attention, 7 keys")
  t.is(shape(nn.TransformerBlock(10, 2)(x)), {2, 5, 10}, "TransformerBlock keeps the shape")
  local g = fl.models.transformer{vocab = 50, d = 16, heads = 2, layers = 1, seq = 8}
  t.is(shape(g(fl.arange(10):reshape(2, 5))), {2, 5, 50}, "transformer [2,5] -> logits [2,5,50]")
  t.is(shape(g(fl.arange(8))), {8, 50}, "transformer [8] -> [8,50]")
  local c = fl.models.cnn{channels = {3, 4, 8}, classes = 5, input = {8, 12}}
  t.is(shape(c(fl.randn(2, 3, 8, 12))), {2, 5}, "cnn on 8x12 -> [2,5]")
end

do
  local l = nn.Linear(3, 2)
  fl.no_grad(function()                           -- parameters require grad
    l.weight:copy_(farange(6):reshape(2, 3))      -- {{0,1,2},{3,4,5}}
    l.bias:copy_(fl.ones(2))
  end)
  local x = farange(3):reshape(1, 3)              -- {{0,1,2}}
  t.near(l(x), {{6, 15}}, 1e-6, "Linear: x W^T + b")
  t.near(l:forward(x), l(x), 0, "m:forward(x) is m(x)")
  t.near(nn.ReLU()(farange(5) - 2), {0, 0, 0, 1, 2}, 0, "ReLU values")
  local s = nn.Softmax(-1)(fl.randn(3, 4)):sum(-1)
  t.near(s, {1, 1, 1}, 1e-6, "Softmax rows sum to 1")
  local ln = nn.LayerNorm(4)(fl.randn(3, 4) * 5 + 2)
  t.near(ln:mean(-1), {0, 0, 0}, 1e-5, "LayerNorm: zero mean")
  local emb = nn.Embedding(4, 2)
  fl.no_grad(emb.weight.copy_, emb.weight, farange(8):reshape(4, 2))
  t.near(emb(fl.arange(4):narrow(1, 3, 2)), {{4, 5}, {6, 7}}, 0, "Embedding picks rows (0-based ids)")
end

do -- causal attention: position i sees only tokens 1..i
  fl.manual_seed(3)
  local attn = nn.MultiheadAttention(8, 2, {causal = true})
  local x = fl.randn(1, 4, 8)
  local y1 = attn(x)
  local x2 = x:contiguous() * 1
  x2:narrow(2, 4, 1):copy_(fl.randn(1, 1, 8))     -- change the last token only
  local y2 = attn(x2)
  t.near(y2:narrow(2, 1, 3), y1:narrow(2, 1, 3), 1e-6, "causal: earlier positions ignore a later token")
  t.ok(max_abs(y2:narrow(2, 4, 1) - y1:narrow(2, 4, 1)) > 1e-4, "causal: the changed position moves")
  local full = nn.MultiheadAttention(8, 2)
  fl.no_grad(function()
    for _, name in ipairs({"q_proj", "k_proj", "v_proj", "out_proj"}) do
      full[name].weight:copy_(attn[name].weight)
      full[name].bias:copy_(attn[name].bias)
    end
  end)
  t.ok(max_abs(full(x2):narrow(2, 1, 3) - y1:narrow(2, 1, 3)) > 1e-4,
       "not causal: every position sees the change")
  t.is(nn.causal_mask(3):tolist(), {{0, -math.huge, -math.huge}, {0, 0, -math.huge}, {0, 0, 0}},
       "the additive causal mask")
end

---------------------------------------------------------------------------
-- training and eval mode
---------------------------------------------------------------------------
do
  local m = nn.Sequential(nn.Linear(4, 4), nn.Dropout(0.5), nn.Sequential(nn.Dropout(0.2)))
  t.ok(m.training and m.modules[2].training, "modules start in training mode (as PyTorch)")
  t.ok(m:eval() == m, "eval() returns the module")
  t.ok(not m.training and not m.modules[2].training and not m.modules[3].modules[1].training,
       "eval() reaches every descendant")
  m:train()
  t.ok(m.modules[3].modules[1].training, "train() reaches every descendant")
  local d = nn.Dropout(0.5)
  local x = fl.ones(1000)
  local y = d(x)
  local zeros = (y:eq(0)):to("float32"):sum():item()
  t.ok(zeros > 400 and zeros < 600, "Dropout(0.5) in training zeroes about half (" .. zeros .. ")")
  t.near(y:amax():item(), 2, 1e-6, "Dropout scales the kept values by 1/(1-p)")
  d:eval()
  t.near(d(x), x, 0, "Dropout in eval is the identity")
  t.near(nn.Dropout(0)(x):sum():item(), 1000, 0, "Dropout(0) is the identity")
  t.near(nn.Dropout(1)(x):sum():item(), 0, 0, "Dropout(1) zeroes everything")
  local bn = nn.BatchNorm2d(2)
  bn.running_mean:copy_(fl.full({2}, 1.0))
  bn.running_var:copy_(fl.full({2}, 4.0))
  local img = fl.full({1, 2, 2, 2}, 3.0)
  bn:eval()
  t.near(bn(img):amax():item(), (3 - 1) / math.sqrt(4 + 1e-5), 1e-5,
         "BatchNorm2d in eval: (x - running_mean) / sqrt(running_var + eps)")
  t.near(bn.running_mean, {1, 1}, 0, "BatchNorm2d in eval: the running statistics stay")
  bn:train()
  t.near(bn(img):abs():amax():item(), 0, 1e-6, "BatchNorm2d in training: the batch's own statistics")
  t.near(bn.running_mean, {1.2, 1.2}, 1e-6, "BatchNorm2d in training: the running mean moves by momentum 0.1")
end

---------------------------------------------------------------------------
-- containers and user modules
---------------------------------------------------------------------------
do
  local s = nn.Sequential()
  t.ok(s:add(nn.Linear(4, 3)) == s, "add returns the container")
  s:add(nn.ReLU):add(nn.Linear(3, 2))
  t.is(#s, 3, "#seq counts the children")
  t.is(tostring(s:get(2)), "nn.ReLU", "add(class) makes an instance")
  t.is(s.modules[3]._path, "2", "a child's path is its PyTorch name")
  local outer = nn.Sequential(nn.Linear(2, 4), s)
  t.is(s.modules[3]._path, "1.2", "paths follow when a container is nested later")
  local _, names = outer:named_parameters()
  t.is(names, {"0.weight", "0.bias", "1.0.weight", "1.0.bias", "1.2.weight", "1.2.bias"},
       "nested Sequential names")
  t.is(shape(outer(fl.randn(5, 2))), {5, 2}, "nested Sequential runs")
  t.raises(function() s:add(42) end, "nn.Sequential:add: expected a module, got number",
           "add(non-module) names what it got")
  t.raises(function() nn.Sequential(nn.Linear(2, 2), {}) end, "expected a module, got a table",
           "Sequential(..., {}) refuses a plain table")
end

do -- a module written by a user
  local Net = nn.class("Net")
  function Net:__init(d)
    self:add_module("fc", nn.Linear(d, d))
    self:register_parameter("scale", fl.ones(d))
    self:register_buffer("shift", fl.zeros(d))
  end
  function Net:forward(x) return self.fc(x) * self.scale + self.shift end
  local n = Net(3)
  t.ok(nn.is_module(n), "nn.class makes modules")
  t.is(tostring(n), "Net {\n  (fc): nn.Linear(3 -> 3)\n}", "user module prints its children")
  local _, names = n:state_dict()
  t.is(names, {"scale", "shift", "fc.weight", "fc.bias"}, "state order: own parameters, buffers, children")
  t.is(shape(n(fl.randn(2, 3))), {2, 3}, "user module runs")
  t.raises(function() nn.Module.forward(n) end, "forward is not implemented", "base forward raises")
  local seen = {}
  nn._call_hook = function(m, ...)
    seen[#seen + 1] = m._path
    return m:forward(...)
  end
  n(fl.randn(1, 3))
  nn._call_hook = nil
  t.is(seen, {"", "fc"}, "nn._call_hook sees every module call with its path")
end

---------------------------------------------------------------------------
-- errors
---------------------------------------------------------------------------
t.raises(function() nn.Linear(10, 20)(fl.randn(4, 7)) end,
         "^nn%.Linear%(10 %-> 20%): input %[4,7%] has 7 features in its last dim, expected 10$",
         "Linear: wrong width names the sizes")
t.raises(function() fl.models.mlp{sizes = {4, 8, 2}}(fl.randn(3, 5)) end,
         "nn%.Linear%(4 %-> 8%) at 0: input %[3,5%]", "error names the module's path")
t.raises(function() nn.Linear(4, 2)("x") end, "expected the input to be a tensor, got string",
         "Linear: not a tensor")
t.raises(function() nn.Linear(4.5, 2) end, "nn.Linear: in_features: expected an integer, got 4.5",
         "Linear: non-integer size")
t.raises(function() nn.Linear(4, -1) end, "out_features: expected an integer >= 0, got %-1",
         "Linear: negative size")
t.raises(function() nn.Linear(4, 2, {bais = false}) end, "nn.Linear: unknown option 'bais' %(expected bias%)",
         "option typos are caught")
t.raises(function() nn.Conv2d(3, 8, 3)(fl.randn(1, 4, 8, 8)) end,
         "nn.Conv2d%(3 %-> 8, 3x3%): input %[1,4,8,8%]: expected %[N, 3, H, W%]", "Conv2d: wrong channels")
t.raises(function() nn.BatchNorm2d(3)(fl.randn(2, 3)) end, "input %[2,3%]: expected %[N, 3, H, W%]",
         "BatchNorm2d: not 4-d")
t.raises(function() nn.LayerNorm(8)(fl.randn(2, 4)) end,
         "nn.LayerNorm%(8%): input %[2,4%] does not end in the normalized shape %[8%]", "LayerNorm: wrong size")
t.raises(function() nn.MultiheadAttention(10, 3) end, "d 10 is not divisible by heads 3", "MHA: heads")
t.raises(function() nn.MultiheadAttention(10, 2)(fl.randn(2, 5, 8)) end,
         "input %[2,5,8%]: expected %[B, T, 10%] or %[T, 10%]", "MHA: wrong width")
t.raises(function() nn.MultiheadAttention(4, 2, {causal = true})(fl.randn(1, 2, 4), fl.randn(1, 3, 4)) end,
         "causal attention needs as many queries as keys %(2 vs 3%)", "MHA: causal cross-attention")
t.raises(function() nn.GELU{approximate = "fast"} end, "approximate must be 'none' or 'tanh', got 'fast'",
         "GELU: approximate")
t.raises(function() nn.Dropout(1.5) end, "p must be a probability in %[0, 1%], got 1.5", "Dropout: p")
t.raises(function() nn.Flatten(3)(fl.randn(2, 2)) end, "dims 3..%-1 out of range for a 2%-d input",
         "Flatten: dims")
t.raises(function() fl.models.mlp{sizes = {4}} end, "sizes must list at least an input and an output size",
         "mlp: too few sizes")
t.raises(function() fl.models.mlp{sizes = {4, 2}, act = "swish"} end, "unknown act 'swish'", "mlp: act")
t.raises(function() fl.models.cnn{channels = {3, 4, 4, 4}, input = 4} end,
         "input 4x4 is too small for 3 pooling blocks", "cnn: input too small")
t.raises(function() fl.models.transformer{vocab = 10, d = 8, heads = 4, layers = 1, seq = 4}(fl.arange(6)) end,
         "sequence of 6 tokens is longer than seq=4", "transformer: too long")
t.raises(function() fl.models.transformer{vocab = 10, d = 10, heads = 4, seq = 4} end,
         "d 10 is not divisible by heads 4", "transformer: heads")
t.raises(function() fl.models.transformer{vocab = 10, d = 8, seq = 4, layer = 2} end,
         "unknown option 'layer'", "transformer: option typo")

---------------------------------------------------------------------------
-- fl.save_weights / fl.load_weights
---------------------------------------------------------------------------
local tmp = os.tmpname()
local function path(name) return tmp .. "." .. name .. ".safetensors" end
local made = {}
local function file(name) made[#made + 1] = path(name); return path(name) end

do
  local a = fl.models.mlp{sizes = {4, 8, 2}}
  local b = fl.models.mlp{sizes = {4, 8, 2}}
  local x = fl.randn(3, 4)
  t.ok(max_abs(a(x) - b(x)) > 1e-3, "two fresh models differ")
  fl.save_weights(a, file("mlp"))
  local w = b.modules[1].weight                  -- held across the load
  t.ok(fl.load_weights(b, path("mlp")) == b, "load_weights returns the model")
  t.near(b(x), a(x), 0, "round trip: identical outputs")
  t.ok(b.modules[1].weight == w, "the model keeps its tensors")
  t.near(w, a.modules[1].weight, 0, "values copied in place (references see them)")

  -- every dtype survives, including the int64 buffer
  local c = fl.models.cnn{channels = {1, 2}, classes = 3, input = 4}
  c.modules[2].num_batches_tracked:fill_(12)
  c.modules[2].running_var:copy_(fl.full({2}, 3.5))
  fl.save_weights(c, file("cnn"))
  local c2 = fl.models.cnn{channels = {1, 2}, classes = 3, input = 4}
  fl.load_weights(c2, path("cnn"))
  t.is(c2.modules[2].num_batches_tracked:item(), 12, "int64 buffer round trip")
  t.is(c2.modules[2].running_var:tolist(), {3.5, 3.5}, "buffers round trip")

  -- a plain table of tensors works too
  fl.save_weights({alpha = fl.ones(2), beta = fl.zeros(3, {dtype = "float16"}),
                   mask = fl.zeros({2}, {dtype = "bool"})}, file("plain"))
  local dst = {alpha = fl.zeros(2), beta = fl.ones(3, {dtype = "float16"}),
               mask = fl.ones({2}, {dtype = "bool"})}
  fl.load_weights(dst, path("plain"))
  t.is({dst.alpha:tolist(), dst.beta:tolist(), dst.mask:tolist()}, {{1, 1}, {0, 0, 0}, {false, false}},
       "plain table of tensors: float32, float16 and bool round trip")
end

do -- errors, each naming the tensor or the file
  local m = fl.models.mlp{sizes = {4, 8, 2}}
  fl.save_weights(m, file("good"))
  t.raises(function() fl.load_weights(m, path("missing")) end,
           "load_weights: .*missing%.safetensors: No such file or directory", "missing file")
  t.raises(function() fl.load_weights(fl.models.mlp{sizes = {5, 8, 2}}, path("good")) end,
           "load_weights: 0%.weight: shape %[8,4%] in file, %[8,5%] in model$", "shape mismatch names the tensor")
  local g = fl.models.transformer{vocab = 10, d = 8, heads = 2, layers = 1, seq = 4}
  fl.save_weights(g, file("gpt8"))
  t.raises(function() fl.load_weights(fl.models.transformer{vocab = 10, d = 4, heads = 2, layers = 1, seq = 4},
                                      path("gpt8")) end,
           "load_weights: tok_emb.weight: shape %[10,8%] in file, %[10,4%] in model", "transformer shape mismatch")
  t.raises(function() fl.load_weights(fl.models.mlp{sizes = {4, 8, 8, 2}}, path("good")) end,
           "does not match the model: 2 missing in the file %(4%.weight, 4%.bias%)$", "missing names listed")
  t.raises(function() fl.load_weights(fl.models.mlp{sizes = {4, 2}}, path("good")) end,
           "does not match the model: 2 unexpected in the file %(2%.bias, 2%.weight%)$", "unexpected names listed")
  t.raises(function() fl.load_weights(fl.models.cnn{channels = {1, 2}, classes = 3, input = 4}, path("good")) end,
           "%d+ missing in the file %(.*%); %d+ unexpected in the file", "both kinds listed")
  local half = fl.models.mlp{sizes = {4, 8, 2}}
  half.modules[1].weight = half.modules[1].weight:to("float16")
  t.raises(function() fl.load_weights(half, path("good")) end,
           "load_weights: 0%.weight: dtype float32 in file, float16 in model$", "dtype mismatch names the tensor")

  -- all or nothing: a mismatch in the last tensor leaves the first alone
  local partial = fl.models.mlp{sizes = {4, 8, 2}}
  partial.modules[3].bias = fl.zeros(3)
  local before = partial.modules[1].weight:contiguous() * 1
  t.raises(function() fl.load_weights(partial, path("good")) end, "2%.bias: shape %[2%] in file, %[3%] in model",
           "last tensor mismatched")
  t.near(partial.modules[1].weight, before, 0, "a failed load changes nothing")

  -- a corrupt file
  local f = assert(io.open(file("corrupt"), "wb"))
  f:write(string.pack("<I8", 1000), "{}")
  f:close()
  t.raises(function() fl.load_weights(m, path("corrupt")) end,
           "load_weights: .*corrupt%.safetensors: safetensors: header length 1000 runs past the end of the file",
           "corrupt file: the reader's message")
  f = assert(io.open(file("badshape"), "wb"))
  local hdr = '{"0.weight":{"dtype":"F32","shape":[8,4],"data_offsets":[0,64]}}'
  f:write(string.pack("<I8", #hdr), hdr, string.rep("\0", 64))
  f:close()
  t.raises(function() fl.load_weights(m, path("badshape")) end,
           "safetensors: tensor '0%.weight': F32 %[8,4%] needs 128 bytes, data_offsets %[0, 64%] hold 64",
           "malformed entry: names the tensor")

  t.raises(function() fl.load_weights(42, path("good")) end,
           "load_weights: expected an nn module or a table of tensors, got number", "load: not a model")
  t.raises(function() fl.save_weights(m) end, "bad argument #2 to 'save_weights'", "save: no path")
  t.raises(function() fl.save_weights(m, "/nonexistent-dir/x.safetensors") end,
           "save_weights: /nonexistent%-dir/x%.safetensors: No such file or directory", "save: unwritable path")
  t.raises(function() fl.save_weights({w = 3}, file("bad")) end,
           "save_weights: w: the model holds a number, not a tensor", "save: a non-tensor entry")
  t.raises(function() fl.save_weights({[1] = fl.ones(1)}, file("bad")) end,
           "must have string keys, found a number key", "save: a non-string key")
  local broken = fl.models.mlp{sizes = {4, 8, 2}}
  broken.modules[1].bias = "oops"
  t.raises(function() fl.load_weights(broken, path("good")) end, "0%.bias: the model holds a string, not a tensor",
           "load: a non-tensor in the model")
end

for _, p in ipairs(made) do os.remove(p) end
os.remove(tmp)

t.done()
