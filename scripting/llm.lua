-- llm.lua -- language models as people download them: GPT-2 and the Llama
-- family (Llama, Mistral, Qwen2), their checkpoints, and decoding with a
-- static KV cache.
--
--   m, tok = fl.models.load_pretrained(dir)   config.json, safetensors
--                                              (sharded or not), tokenizer
--   m = fl.models.gpt2{...} / fl.models.llama{...}   random weights
--   m(ids) -> logits [B, T, vocab]
--   m:generate(ids, {max_new_tokens, temperature, top_k, top_p, seed, stop,
--                    compile, mode}) -> ids, stats
--   fl.generate(m, tok, "prompt", opts) streams the text as it is made
--
-- Parameter names are the checkpoint's (transformer.h.0.attn.c_attn.weight,
-- model.layers.0.self_attn.q_proj.weight): fl.save_weights round-trips.
--
-- Decoding follows gpt-fast: the cache is [B, kv_heads, L, head_dim] per
-- layer, allocated once for the longest sequence; every call writes its
-- keys and values at the positions it is given (a tensor, so one compiled
-- decode step serves every position) and attends over the whole cache with
-- a mask from those positions.  Captured, the write is
-- `cache:copy_(fl.where(slot, k, cache))`, an in-place update the plan
-- stores into the cache itself, row by row (plan_inplace); eagerly, the
-- rows are copied where they go.
local fl = ...
local nn, models = fl.nn, fl.models
local class, options, shape_str = nn.class, nn._util.options, nn._util.shape_str
local fmt = string.format

-- ---------------------------------------------------------------------------
-- the two architectures: the names and shapes of their parameters
-- ---------------------------------------------------------------------------

local function need(cfg, key, what, default)
  local v = cfg[key]
  if v == nil then v = default end
  if math.type(v) ~= "integer" or v < 1 then
    error(fmt("%s: field '%s' is %s (a positive integer is needed)", what, key, tostring(v)), 0)
  end
  return v
end

-- The rotary embedding's inverse frequencies theta^(-2i/hd), i < hd/2, as
-- transformers computes them (rope_parameters in transformers 5, top-level
-- rope_theta and rope_scaling before): "default"; "linear" divides them by
-- factor; "llama3" (Llama 3.1 and later) divides the low frequencies by
-- factor, keeps the high ones and interpolates between.  A Lua list.
local function rope_frequencies(c, hd, what)
  local rp = type(c.rope_parameters) == "table" and c.rope_parameters or c.rope_scaling or {}
  local theta = rp.rope_theta or c.rope_theta or 10000.0
  local kind = rp.rope_type or rp.type or "default"
  if hd % 2 ~= 0 then error(fmt("%s: head_dim %d is odd (rotary embeddings pair dims)", what, hd), 0) end
  if (rp.partial_rotary_factor or c.partial_rotary_factor or 1) ~= 1 then
    error(what .. ": partial_rotary_factor is unsupported (the whole head rotates)", 0)
  end
  local function num(k)
    if type(rp[k]) ~= "number" or rp[k] <= 0 then
      error(fmt("%s: rope type '%s' needs a positive '%s'", what, kind, k), 0)
    end
    return rp[k]
  end
  local inv = {}
  for i = 0, hd // 2 - 1 do inv[i + 1] = 1 / theta ^ (2 * i / hd) end
  if kind == "linear" then
    local f = num("factor")
    for i = 1, #inv do inv[i] = inv[i] / f end
  elseif kind == "llama3" then
    local f, lo, hi = num("factor"), num("low_freq_factor"), num("high_freq_factor")
    local old = num("original_max_position_embeddings")
    for i = 1, #inv do
      local wavelen = 2 * math.pi / inv[i]
      if wavelen > old / lo then inv[i] = inv[i] / f
      elseif wavelen >= old / hi then
        local smooth = (old / wavelen - lo) / (hi - lo)
        inv[i] = (1 - smooth) * inv[i] / f + smooth * inv[i]
      end
    end
  elseif kind ~= "default" then
    error(fmt("%s: rope type '%s' is unsupported (default, linear and llama3)", what, tostring(kind)), 0)
  end
  return inv
end

-- cfg as config.json spells it -> the sizes the modules use, checked.
local ARCH = {}

ARCH.gpt2 = {
  read = function(c, what)
    local d = need(c, "n_embd", what)
    local s = {arch = "gpt2", d = d, layers = need(c, "n_layer", what), heads = need(c, "n_head", what),
               vocab = need(c, "vocab_size", what), positions = need(c, "n_positions", what, c.n_ctx or 1024),
               eps = c.layer_norm_epsilon or 1e-5, inner = c.n_inner or 4 * d,
               act = c.activation_function or "gelu_new", tied = c.tie_word_embeddings ~= false}
    if d % s.heads ~= 0 then error(fmt("%s: n_embd %d is not divisible by n_head %d", what, d, s.heads), 0) end
    local acts = {gelu_new = true, gelu_pytorch_tanh = true, gelu = true, relu = true}
    if not acts[s.act] then error(fmt("%s: activation_function '%s' is unsupported (gelu_new, gelu, relu)", what, s.act), 0) end
    if c.scale_attn_by_inverse_layer_idx or c.scale_attn_weights == false then
      error(what .. ": scale_attn_by_inverse_layer_idx or scale_attn_weights=false is unsupported", 0)
    end
    s.head_dim, s.kv_heads = d // s.heads, s.heads
    return s
  end,
  params = function(s)
    local d, p = s.d, {}
    local function add(name, shape) p[#p + 1] = {name, shape} end
    add("transformer.wte.weight", {s.vocab, d})
    add("transformer.wpe.weight", {s.positions, d})
    for i = 0, s.layers - 1 do
      local h = "transformer.h." .. i .. "."
      add(h .. "ln_1.weight", {d}); add(h .. "ln_1.bias", {d})
      add(h .. "attn.c_attn.weight", {d, 3 * d}); add(h .. "attn.c_attn.bias", {3 * d})
      add(h .. "attn.c_proj.weight", {d, d}); add(h .. "attn.c_proj.bias", {d})
      add(h .. "ln_2.weight", {d}); add(h .. "ln_2.bias", {d})
      add(h .. "mlp.c_fc.weight", {d, s.inner}); add(h .. "mlp.c_fc.bias", {s.inner})
      add(h .. "mlp.c_proj.weight", {s.inner, d}); add(h .. "mlp.c_proj.bias", {d})
    end
    add("transformer.ln_f.weight", {d}); add("transformer.ln_f.bias", {d})
    if not s.tied then add("lm_head.weight", {s.vocab, d}) end
    return p
  end,
  -- buffers older GPT-2 files carry (the causal mask): read and dropped
  ignored = {"%.attn%.bias$", "%.attn%.masked_bias$"},
}

ARCH.llama = {
  read = function(c, what)
    local d = need(c, "hidden_size", what)
    local heads = need(c, "num_attention_heads", what)
    local s = {arch = "llama", d = d, layers = need(c, "num_hidden_layers", what), heads = heads,
               kv_heads = need(c, "num_key_value_heads", what, heads), vocab = need(c, "vocab_size", what),
               inner = need(c, "intermediate_size", what), positions = need(c, "max_position_embeddings", what, 2048),
               eps = c.rms_norm_eps or 1e-6, tied = c.tie_word_embeddings == true,
               qkv_bias = c.attention_bias == true or c.model_type == "qwen2", mlp_bias = c.mlp_bias == true,
               windows = {}}
    s.head_dim = need(c, "head_dim", what, d // heads)
    s.inv_freq = rope_frequencies(c, s.head_dim, what)
    -- sliding windows: per layer (layer_types) or for all (Mistral's sliding_window)
    for i = 1, s.layers do
      local lt = type(c.layer_types) == "table" and c.layer_types[i]
      if (lt == "sliding_attention" or (not lt and c.use_sliding_window ~= false)) and c.sliding_window then
        s.windows[i] = need(c, "sliding_window", what)
      end
    end
    if heads % s.kv_heads ~= 0 then
      error(fmt("%s: num_attention_heads %d is not a multiple of num_key_value_heads %d", what, heads, s.kv_heads), 0)
    end
    if (c.hidden_act or "silu") ~= "silu" then error(fmt("%s: hidden_act '%s' is unsupported (silu)", what, c.hidden_act), 0) end
    return s
  end,
  params = function(s)
    local d, hd, p = s.d, s.head_dim, {}
    local function add(name, shape) p[#p + 1] = {name, shape} end
    add("model.embed_tokens.weight", {s.vocab, d})
    for i = 0, s.layers - 1 do
      local l = "model.layers." .. i .. "."
      add(l .. "input_layernorm.weight", {d})
      for _, x in ipairs({{"q", s.heads}, {"k", s.kv_heads}, {"v", s.kv_heads}}) do
        add(l .. "self_attn." .. x[1] .. "_proj.weight", {x[2] * hd, d})
        if s.qkv_bias then add(l .. "self_attn." .. x[1] .. "_proj.bias", {x[2] * hd}) end
      end
      add(l .. "self_attn.o_proj.weight", {d, s.heads * hd})
      add(l .. "post_attention_layernorm.weight", {d})
      add(l .. "mlp.gate_proj.weight", {s.inner, d}); add(l .. "mlp.up_proj.weight", {s.inner, d})
      add(l .. "mlp.down_proj.weight", {d, s.inner})
      if s.mlp_bias then
        add(l .. "mlp.gate_proj.bias", {s.inner}); add(l .. "mlp.up_proj.bias", {s.inner})
        add(l .. "mlp.down_proj.bias", {d})
      end
    end
    add("model.norm.weight", {d})
    if not s.tied then add("lm_head.weight", {s.vocab, d}) end
    return p
  end,
  ignored = {"rotary_emb%.inv_freq$"},
}

local ARCHITECTURES = {
  GPT2LMHeadModel = "gpt2", LlamaForCausalLM = "llama", MistralForCausalLM = "llama",
  Qwen2ForCausalLM = "llama",
}

-- ---------------------------------------------------------------------------
-- modules: each holds the checkpoint's tensors under the checkpoint's names
-- ---------------------------------------------------------------------------

-- A leaf module whose parameters come from W (name -> tensor) at prefix.
local Weights = class("fl.llm.Weights")
function Weights:__init(W, prefix, names)
  for _, n in ipairs(names) do
    local t = W[prefix .. n]
    if t ~= nil then self:register_parameter(n, t) end
  end
end

-- A projection as nn.Linear reads it ([out, in]) or as GPT-2's Conv1D
-- stores it ([in, out]: read transposed, no copy).
local Proj = class("fl.llm.Proj", Weights)
function Proj:__init(W, prefix, conv1d)
  Weights.__init(self, W, prefix, {"weight", "bias"})
  self.conv1d = conv1d
end
function Proj:_head()
  local s = self.weight.shape
  local i, o = s[1], s[2]
  if not self.conv1d then i, o = o, i end
  return fmt("%s(%d -> %d)", self.conv1d and "Conv1D" or "Linear", i, o)
end
function Proj:forward(x)
  local w = self.conv1d and self.weight:transpose(1, 2) or self.weight
  return fl.linear(x, w, self.bias)
end

local Norm = class("fl.llm.Norm", Weights)
function Norm:__init(W, prefix, eps, rms)
  Weights.__init(self, W, prefix, {"weight", "bias"})
  self.eps, self.rms = eps, rms
end
function Norm:_head() return fmt("%s(%d, eps=%g)", self.rms and "RMSNorm" or "LayerNorm", self.weight.shape[1], self.eps) end
function Norm:forward(x)
  local d = {self.weight.shape[1]}
  if self.rms then return x:rms_norm(d, self.weight, self.eps) end
  return x:layer_norm(d, self.weight, self.bias, self.eps)
end

local Embed = class("fl.llm.Embedding", Weights)
function Embed:__init(W, prefix) Weights.__init(self, W, prefix, {"weight"}) end
function Embed:_head() return fmt("Embedding(%d, %d)", self.weight.shape[1], self.weight.shape[2]) end
function Embed:forward(ids) return fl.embedding(ids, self.weight) end

-- Children named 0, 1, ... (the checkpoint's h.0, layers.0).
local List = class("fl.llm.ModuleList")
function List:__init(mods) for i, m in ipairs(mods) do self:add_module(tostring(i - 1), m) end end
function List:_head() return fmt("ModuleList(%d)", #self._children) end

-- A size known to be 1 (a symbolic size compares unequal to a number).
local function size_one(n) return n == 1 end

-- Attention over the cache (or over the keys themselves without one).
-- q [B, H, T, hd]; k, v [B, Hkv, T, hd]; pos int64 [T], the positions of
-- the T tokens.  With a cache, k and v are written at pos first and every
-- key of the cache is attended to where its position is <= the query's
-- (and within the window); without, key j of the call is, where pos[j] <=
-- pos[i].  Grouped-query heads: q is viewed as [B, Hkv, H/Hkv, T, hd].
local function attend(q, k, v, pos, cache, layer, window)
  local B, H, T, hd = q.shape[1], q.shape[2], q.shape[3], q.shape[4]
  local Hkv = k.shape[2]
  local keys, vals, kpos = k, v, pos
  if cache then
    local L = cache.len
    local kc, vc = cache.k[layer], cache.v[layer]
    local lpos = fl.arange(L, {device = q.device})
    local first = not fl._tracing() and pos:numel() > 0 and pos[1]      -- x[i] of a 1-d tensor: a number
    if first and pos[pos:numel()] == first + pos:numel() - 1 then
      -- eager, consecutive positions: the rows copied where they go
      kc:narrow(3, first + 1, T):copy_(k)
      vc:narrow(3, first + 1, T):copy_(v)
    else
      local slot = lpos:reshape(L, 1):eq(pos:reshape(1, T))             -- [L, T]: slot l takes token t
      if size_one(T) then
        kc:copy_(fl.where(slot, k, kc))                                  -- [L, 1] against [B, Hkv, L, hd]
        vc:copy_(fl.where(slot, v, vc))
      else
        local onehot = slot:to("float32")
        local written = onehot:sum(2, true):gt(0)                        -- [L, 1]
        kc:copy_(fl.where(written, onehot:matmul(k), kc))
        vc:copy_(fl.where(written, onehot:matmul(v), vc))
      end
    end
    keys, vals, kpos = kc, vc, lpos
  end
  local qp, kp = pos:reshape(-1, 1), kpos:reshape(1, -1)               -- [T, 1], [1, Lk]
  local mask = fl.where(kp:le(qp), 0.0, -math.huge)                    -- [T, Lk]
  if window then mask = mask + fl.where(kp:gt(qp - window), 0.0, -math.huge) end
  local rep = H // Hkv
  local qg = q:reshape(B, Hkv, rep, T, hd)
  local scores = qg:matmul(keys:unsqueeze(3):transpose(4, 5)) * (1 / math.sqrt(hd)) + mask
  local out = scores:softmax(-1):matmul(vals:unsqueeze(3))            -- [B, Hkv, rep, T, hd]
  return out:reshape(B, H, T, hd)
end

-- [B, T, heads * hd] -> [B, heads, T, hd]
local function split_heads(x, heads, hd)
  local B, T = x.shape[1], x.shape[2]
  return x:reshape(B, T, heads, hd):transpose(2, 3)
end

local function merge_heads(x)
  local B, H, T, hd = x.shape[1], x.shape[2], x.shape[3], x.shape[4]
  return x:transpose(2, 3):reshape(B, T, H * hd)
end

-- GPT-2 ----------------------------------------------------------------------

local GPT2Attn = class("fl.llm.GPT2Attention")
function GPT2Attn:__init(W, p, s)
  self.s = s
  self:add_module("c_attn", Proj(W, p .. "c_attn.", true))
  self:add_module("c_proj", Proj(W, p .. "c_proj.", true))
end
function GPT2Attn:_head() return fmt("GPT2Attention(%d, heads=%d)", self.s.d, self.s.heads) end
function GPT2Attn:forward(x, pos, cache, layer)
  local s = self.s
  local qkv = self.c_attn(x)
  local d = s.d
  local q = split_heads(qkv:narrow(3, 1, d), s.heads, s.head_dim)
  local k = split_heads(qkv:narrow(3, d + 1, d), s.heads, s.head_dim)
  local v = split_heads(qkv:narrow(3, 2 * d + 1, d), s.heads, s.head_dim)
  return self.c_proj(merge_heads(attend(q, k, v, pos, cache, layer)))
end

local GPT2MLP = class("fl.llm.GPT2MLP")
function GPT2MLP:__init(W, p, s)
  self.act = s.act
  self:add_module("c_fc", Proj(W, p .. "c_fc.", true))
  self:add_module("c_proj", Proj(W, p .. "c_proj.", true))
end
function GPT2MLP:_head() return "GPT2MLP(" .. self.act .. ")" end
function GPT2MLP:forward(x)
  local h = self.c_fc(x)
  if self.act == "relu" then h = h:relu()
  elseif self.act == "gelu" then h = h:gelu()
  else h = h:gelu{approximate = "tanh"} end
  return self.c_proj(h)
end

local GPT2Block = class("fl.llm.GPT2Block")
function GPT2Block:__init(W, p, s)
  self:add_module("ln_1", Norm(W, p .. "ln_1.", s.eps))
  self:add_module("attn", GPT2Attn(W, p .. "attn.", s))
  self:add_module("ln_2", Norm(W, p .. "ln_2.", s.eps))
  self:add_module("mlp", GPT2MLP(W, p .. "mlp.", s))
end
function GPT2Block:_head() return "GPT2Block" end
function GPT2Block:forward(x, pos, cache, layer)
  x = x + self.attn(self.ln_1(x), pos, cache, layer)
  return x + self.mlp(self.ln_2(x))
end

local GPT2Body = class("fl.llm.GPT2Model")
function GPT2Body:__init(W, s)
  self:add_module("wte", Embed(W, "transformer.wte."))
  self:add_module("wpe", Embed(W, "transformer.wpe."))
  local blocks = {}
  for i = 0, s.layers - 1 do blocks[#blocks + 1] = GPT2Block(W, "transformer.h." .. i .. ".", s) end
  self:add_module("h", List(blocks))
  self:add_module("ln_f", Norm(W, "transformer.ln_f.", s.eps))
end
function GPT2Body:_head() return "GPT2Model" end
function GPT2Body:forward(ids, pos, cache)
  local x = self.wte(ids) + self.wpe(pos)
  for i = 0, #self.h._children - 1 do x = self.h[tostring(i)](x, pos, cache, i + 1) end
  return self.ln_f(x)
end

-- Llama ------------------------------------------------------------------------

-- Rotary embeddings as HF's Llama: the inverse frequencies (a constant of
-- the model) times the position (float32), cos and sin repeated over both
-- halves, and x * cos + rotate_half(x) * sin with rotate_half(x) = cat(-x2, x1).
local function rotary(x, pos, s)
  local half = x.shape[4] // 2
  s.inv_t = s.inv_t or fl.tensor(s.inv_freq)
  local inv = s.inv_t.device == x.device and s.inv_t or s.inv_t:to(x.device)
  local ang = pos:to("float32"):reshape(-1, 1) * inv:reshape(1, half)        -- [T, half]
  ang = fl.cat({ang, ang}, 2)
  local x1, x2 = x:narrow(4, 1, half), x:narrow(4, half + 1, half)
  return x * ang:cos() + fl.cat({-x2, x1}, 4) * ang:sin()
end

local LlamaAttn = class("fl.llm.LlamaAttention")
function LlamaAttn:__init(W, p, s)
  self.s = s
  for _, n in ipairs({"q_proj", "k_proj", "v_proj", "o_proj"}) do self:add_module(n, Proj(W, p .. n .. ".")) end
end
function LlamaAttn:_head()
  return fmt("LlamaAttention(%d, heads=%d, kv_heads=%d)", self.s.d, self.s.heads, self.s.kv_heads)
end
function LlamaAttn:forward(x, pos, cache, layer)
  local s = self.s
  local q = rotary(split_heads(self.q_proj(x), s.heads, s.head_dim), pos, s)
  local k = rotary(split_heads(self.k_proj(x), s.kv_heads, s.head_dim), pos, s)
  local v = split_heads(self.v_proj(x), s.kv_heads, s.head_dim)
  return self.o_proj(merge_heads(attend(q, k, v, pos, cache, layer, s.windows[layer])))
end

local LlamaMLP = class("fl.llm.LlamaMLP")
function LlamaMLP:__init(W, p)
  for _, n in ipairs({"gate_proj", "up_proj", "down_proj"}) do self:add_module(n, Proj(W, p .. n .. ".")) end
end
function LlamaMLP:_head() return "LlamaMLP(SwiGLU)" end
function LlamaMLP:forward(x) return self.down_proj(self.gate_proj(x):silu() * self.up_proj(x)) end

local LlamaLayer = class("fl.llm.LlamaDecoderLayer")
function LlamaLayer:__init(W, p, s)
  self:add_module("input_layernorm", Norm(W, p .. "input_layernorm.", s.eps, true))
  self:add_module("self_attn", LlamaAttn(W, p .. "self_attn.", s))
  self:add_module("post_attention_layernorm", Norm(W, p .. "post_attention_layernorm.", s.eps, true))
  self:add_module("mlp", LlamaMLP(W, p .. "mlp."))
end
function LlamaLayer:_head() return "LlamaDecoderLayer" end
function LlamaLayer:forward(x, pos, cache, layer)
  x = x + self.self_attn(self.input_layernorm(x), pos, cache, layer)
  return x + self.mlp(self.post_attention_layernorm(x))
end

local LlamaBody = class("fl.llm.LlamaModel")
function LlamaBody:__init(W, s)
  self:add_module("embed_tokens", Embed(W, "model.embed_tokens."))
  local layers = {}
  for i = 0, s.layers - 1 do layers[#layers + 1] = LlamaLayer(W, "model.layers." .. i .. ".", s) end
  self:add_module("layers", List(layers))
  self:add_module("norm", Norm(W, "model.norm.", s.eps, true))
end
function LlamaBody:_head() return "LlamaModel" end
function LlamaBody:forward(ids, pos, cache)
  local x = self.embed_tokens(ids)
  for i = 0, #self.layers._children - 1 do x = self.layers[tostring(i)](x, pos, cache, i + 1) end
  return self.norm(x)
end

-- The causal LM: the body and the head (tied to the token embedding or its
-- own lm_head.weight).
local LM = class("fl.models.CausalLM")

function LM:__init(s, W)
  self.spec = s
  if s.arch == "gpt2" then self:add_module("transformer", GPT2Body(W, s))
  else self:add_module("model", LlamaBody(W, s)) end
  if not s.tied then self:add_module("lm_head", Weights(W, "lm_head.", {"weight"})) end
  self:eval()
end

function LM:_head()
  local s = self.spec
  return fmt("%s(vocab=%d, d=%d, layers=%d, heads=%d%s, positions=%d%s)", s.arch == "gpt2" and "GPT2LMHeadModel"
             or (s.class or "LlamaForCausalLM"), s.vocab, s.d, s.layers, s.heads,
             s.kv_heads ~= s.heads and (", kv_heads=" .. s.kv_heads) or "", s.positions, s.tied and ", tied" or "")
end

function LM:_head_weight()
  if not self.spec.tied then return self.lm_head.weight end
  return self.spec.arch == "gpt2" and self.transformer.wte.weight or self.model.embed_tokens.weight
end

-- m(ids [, pos [, cache]]): ids int64 [B, T] or [T]; pos int64 [T] (default
-- 0 .. T-1); cache from m:new_cache(L).  Returns logits [B, T, vocab].
function LM:forward(ids, pos, cache)
  if not fl.is_tensor(ids) or ids.dtype ~= "int64" or (ids:dim() ~= 1 and ids:dim() ~= 2) then
    self:error("token ids: expected an int64 tensor [B, T] or [T], got %s",
               fl.is_tensor(ids) and (ids.dtype .. " " .. shape_str(ids)) or type(ids))
  end
  local unbatched = ids:dim() == 1
  if unbatched then ids = ids:unsqueeze(1) end
  local T = ids.shape[2]
  local dev = self:_head_weight().device                 -- ids and positions go where the weights are
  if ids.device ~= dev then ids = ids:to(dev) end
  if pos and pos.device ~= dev then pos = pos:to(dev) end
  pos = pos or fl.arange(T, {device = dev})
  local body = self.transformer or self.model
  local h = body(ids, pos, cache)
  local logits = fl.linear(h, self:_head_weight())
  if unbatched then logits = logits:squeeze(1) end
  return logits
end

-- A static cache for sequences of up to L tokens (batch B): per layer
-- keys and values [B, kv_heads, L, head_dim], zeros.
function LM:new_cache(L, B)
  local s = self.spec
  B = B or 1
  if math.type(L) ~= "integer" or L < 1 or L > s.positions then
    error(fmt("new_cache: length %s is not 1 to the model's %d positions", tostring(L), s.positions), 0)
  end
  -- in host memory: device tensors take no in-place writes yet, so with
  -- m:cuda() a compiled step copies the cache to the device and back
  local c = {len = L, batch = B, k = {}, v = {}}
  for i = 1, s.layers do
    c.k[i] = fl.zeros(B, s.kv_heads, L, s.head_dim)
    c.v[i] = fl.zeros(B, s.kv_heads, L, s.head_dim)
  end
  c.bytes = 2 * s.layers * B * s.kv_heads * L * s.head_dim * 4
  return c
end

-- ---------------------------------------------------------------------------
-- generation
-- ---------------------------------------------------------------------------

-- A seeded generator of uniform numbers in [0, 1) (splitmix64), so a seed
-- gives the same text whatever else used math.random.
local function rng(seed)
  local state = seed
  return function()
    state = state + 0x9E3779B97F4A7C15
    local z = state
    z = (z ~ (z >> 30)) * 0xBF58476D1CE4E5B9
    z = (z ~ (z >> 27)) * 0x94D049BB133111EB
    z = z ~ (z >> 31)
    return (z >> 11) * (1.0 / 9007199254740992.0)
  end
end

-- The next token from the logits [vocab] of the last position: argmax
-- without a temperature, else a draw from softmax(logits / temperature)
-- kept to the top_k most likely and to the smallest set whose probability
-- reaches top_p (HF's order: temperature, top_k, top_p).
local function pick(logits, o, draw)
  if not o.temperature or o.temperature == 0 then return logits:argmax():item() end
  local l = logits:tolist()
  local idx = {}
  for i = 1, #l do idx[i] = i end
  table.sort(idx, function(a, b) return l[a] > l[b] or (l[a] == l[b] and a < b) end)
  local n = o.top_k and math.min(o.top_k, #idx) or #idx
  local top, p, sum = l[idx[1]] / o.temperature, {}, 0
  for i = 1, n do
    p[i] = math.exp(l[idx[i]] / o.temperature - top)
    sum = sum + p[i]
  end
  if o.top_p and o.top_p < 1 then
    local acc, keep = 0, n
    for i = 1, n do
      acc = acc + p[i] / sum
      if acc >= o.top_p then keep = i; break end
    end
    n, sum = keep, 0
    for i = 1, n do sum = sum + p[i] end
  end
  local u, acc = draw() * sum, 0
  for i = 1, n do
    acc = acc + p[i]
    if u < acc then return idx[i] - 1 end
  end
  return idx[n] - 1
end

local function id_list(ids, what)
  if fl.is_tensor(ids) then
    if ids.dtype ~= "int64" or ids:numel() < 1 or (ids:dim() == 2 and ids.shape[1] ~= 1) or ids:dim() > 2 then
      error(fmt("%s: ids: expected int64 [T] or [1, T] with T >= 1, got %s %s", what, ids.dtype, shape_str(ids)), 0)
    end
    ids = ids:reshape(-1):tolist()
  end
  if type(ids) ~= "table" or #ids == 0 then error(what .. ": ids: expected a non-empty list of token ids", 0) end
  return ids
end

local function stop_set(stop, default)
  local set = {}
  if stop == nil then stop = default end
  if type(stop) == "number" then stop = {stop} end
  for _, v in ipairs(stop or {}) do set[v] = true end
  return set
end

-- The model's cache of length L, made on first use and kept.
function LM:_cache(L)
  self._caches = self._caches or {}
  local cache = self._caches[L] or self:new_cache(L)
  self._caches[L] = cache
  return cache
end

-- m:decode_step(L [, {compile =, mode =}]) -> step, cache: the function
-- generate calls for each token, step(id [1, 1], pos [1]) -> logits
-- [1, 1, vocab], over the model's cache of length L (compiled once when
-- compile is set), and that cache.
function LM:decode_step(L, opts)
  local o = options(opts, {"compile", "mode", "backend"}, "decode_step")
  local r = self:_runners(self:_cache(L), o)
  return r.step, r.cache
end

-- The compiled (or eager) prefill and decode step over one cache.
function LM:_runners(cache, o)
  local key = (o.compile and "c" or "e") .. (o.mode or "") .. (o.backend or "") .. cache.len
  self._run = self._run or {}
  local r = self._run[key]
  if r then return r end
  local function prefill(ids, pos) return self:forward(ids, pos, cache) end
  local function step(id, pos) return self:forward(id, pos, cache) end
  r = {cache = cache}
  if o.compile then
    r.prefill = fl.compile(prefill, {dynamic = true, backend = o.backend})
    r.step = fl.compile(step, {mode = o.mode, backend = o.backend})
  else
    r.prefill, r.step = prefill, step
  end
  self._run[key] = r
  return r
end

-- m:generate(ids, opts) -> all ids (prompt then new), stats.
function LM:generate(ids, opts)
  local o = options(opts, {"max_new_tokens", "temperature", "top_k", "top_p", "seed", "stop", "compile", "mode",
                           "backend", "max_length", "on_token"}, "generate")
  local s = self.spec
  ids = id_list(ids, "generate")
  local new = o.max_new_tokens or 32
  -- the cache's length rounded up to 128 positions: requests of other
  -- lengths then share one cache and one compiled step
  local L = o.max_length or math.min(s.positions, 128 * math.ceil((#ids + new) / 128))
  if #ids + new > L then
    error(fmt("generate: %d prompt tokens and %d new ones exceed the cache of %d (the model has %d positions)",
              #ids, new, L, s.positions), 0)
  end
  for i, v in ipairs(ids) do
    if math.type(v) ~= "integer" or v < 0 or v >= s.vocab then
      error(fmt("generate: ids[%d] = %s is not a token id (0 to %d)", i, tostring(v), s.vocab - 1), 0)
    end
  end
  local r = self:_runners(self:_cache(L), o)
  local stop = stop_set(o.stop, self.eos_token_id)
  local draw = rng(o.seed or 0)
  local out = {}
  for i, v in ipairs(ids) do out[i] = v end
  local stats = {prompt_tokens = #ids, cache_bytes = r.cache.bytes, cache_len = L}
  fl.no_grad(function()
    local t0 = fl.now()
    local T = #ids
    local logits = r.prefill(fl.tensor(ids, {dtype = "int64"}):reshape(1, T), fl.arange(T))
    local nxt = pick(logits[1][T], o, draw)
    stats.first_token_s = fl.now() - t0
    -- steady decoding is timed from the second step: the first one's call
    -- compiles when compiling (reported as step_first_s)
    local made, steady_from = 0, nil
    while true do
      out[#out + 1] = nxt
      made = made + 1
      local go_on = not o.on_token or o.on_token(nxt, out) ~= false     -- false: the caller stops here
      if made >= new or stop[nxt] or not go_on then break end
      local pos = #out - 1
      local ts = fl.now()
      logits = r.step(fl.tensor({{nxt}}, {dtype = "int64"}), fl.tensor({pos}, {dtype = "int64"}))
      nxt = pick(logits[1][1], o, draw)
      if not steady_from then stats.step_first_s, steady_from = fl.now() - ts, {fl.now(), made} end
    end
    stats.new_tokens = made
    if steady_from and made > steady_from[2] then
      stats.decode_s = fl.now() - steady_from[1]
      stats.tokens_per_s = (made - steady_from[2]) / stats.decode_s
    end
  end)
  if o.compile then
    stats.prefill_compiles = r.prefill:stats().compiles
    stats.step_compiles = r.step:stats().compiles
  end
  return out, stats
end

-- fl.generate(m, tok, prompt, opts): the prompt's continuation, written to
-- io.write as it is produced (opts.stream = false: silent); returns the
-- new text and the stats.  A token that ends inside a UTF-8 character is
-- held until the character is whole.
function fl.generate(m, tok, prompt, opts)
  opts = opts or {}
  if type(prompt) ~= "string" then error("fl.generate: prompt must be a string", 0) end
  local ids = tok:encode(prompt)
  local start, shown, text, cut = #ids, "", "", nil
  local g, strs = {}, {}
  for k, v in pairs(opts) do if k ~= "stream" then g[k] = v end end
  local stream = opts.stream ~= false
  -- stop: ids for m:generate, strings looked for in the text
  if opts.stop ~= nil then
    local ids_stop = {}
    for _, v in ipairs(type(opts.stop) == "table" and opts.stop or {opts.stop}) do
      if type(v) == "string" then strs[#strs + 1] = v else ids_stop[#ids_stop + 1] = v end
    end
    g.stop = ids_stop
    if #ids_stop == 0 and #strs > 0 then g.stop = nil end   -- strings only: the model's eos still ends it
  end
  local function decoded(all)
    local new = {}
    for i = start + 1, #all do new[#new + 1] = all[i] end
    local t = tok:decode(new, {skip_special_tokens = true})
    for _, s in ipairs(strs) do
      local at = t:find(s, 1, true)
      if at and (not cut or at < cut) then cut = at end
    end
    return cut and t:sub(1, cut - 1) or t
  end
  g.on_token = function(_, all)
    text = decoded(all)
    if not text:find("\239\191\189$") and #text > #shown then
      if stream then io.write(text:sub(#shown + 1)); io.flush() end
      shown = text
    end
    if cut then return false end
  end
  local _, stats = m:generate(ids, g)
  if stream then io.write(text:sub(#shown + 1), "\n") end
  return text, stats
end

-- ---------------------------------------------------------------------------
-- building and loading
-- ---------------------------------------------------------------------------

-- A model is loaded for inference: its parameters require no grad until
-- m:requires_grad_() (as an ONNX model's), so eager calls record no tape.
local function build(s, W)
  local m = LM(s, W)
  m:requires_grad_(false)
  m.config = s.config
  m.eos_token_id = s.eos
  return m
end

-- Random weights of the spec's names and shapes (for lessons and benches).
local function random_weights(s, seed)
  fl.manual_seed(seed or 0)
  local W = {}
  for _, p in ipairs(ARCH[s.arch].params(s)) do
    local name, shape = p[1], p[2]
    if (name:find("norm") or name:find("%.ln_")) and name:find("weight$") then W[name] = fl.ones(table.unpack(shape))
    elseif #shape == 1 then W[name] = fl.zeros(table.unpack(shape))
    else W[name] = fl.randn(table.unpack(shape)):mul_(0.02) end   -- GPT-2's and Llama's initializer_range
  end
  return W
end

local function from_config(arch, cfg, what)
  local s = ARCH[arch].read(cfg, what)
  s.config = cfg
  s.eos = cfg.eos_token_id
  return s
end

-- fl.models.gpt2{n_embd=, n_layer=, n_head=, vocab_size=, n_positions=, ...}
-- and fl.models.llama{hidden_size=, ...}: config.json's fields, random weights.
function models.gpt2(cfg)
  cfg = cfg or {}
  local c = {n_embd = 768, n_layer = 12, n_head = 12, vocab_size = 50257, n_positions = 1024}
  for k, v in pairs(cfg) do if k ~= "seed" then c[k] = v end end
  return build(from_config("gpt2", c, "fl.models.gpt2"), random_weights(from_config("gpt2", c, "fl.models.gpt2"), cfg.seed))
end

function models.llama(cfg)
  cfg = cfg or {}
  local c = {hidden_size = 768, num_hidden_layers = 12, num_attention_heads = 12, num_key_value_heads = 4,
             intermediate_size = 2048, vocab_size = 32000, max_position_embeddings = 2048}
  for k, v in pairs(cfg) do if k ~= "seed" then c[k] = v end end
  local s = from_config("llama", c, "fl.models.llama")
  return build(s, random_weights(s, cfg.seed))
end

local function exists(path)
  local f = io.open(path, "rb")
  if f then f:close() end
  return f ~= nil
end

-- name -> tensor from model.safetensors or the shards an index names.
local function read_tensors(dir)
  local single = dir .. "/model.safetensors"
  local index = dir .. "/model.safetensors.index.json"
  if exists(index) then
    local idx = fl.load_json(index)
    if type(idx) ~= "table" or type(idx.weight_map) ~= "table" then
      error(fmt("load_pretrained: %s: field 'weight_map' is missing", index), 0)
    end
    local files, order, W, from = {}, {}, {}, {}
    for name, file in pairs(idx.weight_map) do
      if type(file) ~= "string" or file:find("/") or file:find("^%.") then
        error(fmt("load_pretrained: %s: weight_map[%q] is not a file name in the directory", index, name), 0)
      end
      if not files[file] then files[file] = {}; order[#order + 1] = file end
      files[file][name] = true
    end
    table.sort(order)
    for _, file in ipairs(order) do
      local t = fl.load_safetensors(dir .. "/" .. file, {map = true})
      for name, v in pairs(t) do
        if from[name] then
          error(fmt("load_pretrained: tensor '%s' is in both %s and %s", name, from[name], file), 0)
        end
        if not files[file][name] then
          error(fmt("load_pretrained: %s/%s holds '%s', which the index puts elsewhere", dir, file, name), 0)
        end
        W[name], from[name] = v, file
      end
      for name in pairs(files[file]) do
        if not t[name] then error(fmt("load_pretrained: %s/%s lacks '%s', which the index puts there", dir, file, name), 0) end
      end
    end
    return W, "model.safetensors.index.json"
  elseif exists(single) then
    return (fl.load_safetensors(single, {map = true})), "model.safetensors"
  end
  error(fmt("load_pretrained: %s has neither model.safetensors nor model.safetensors.index.json", dir), 0)
end

-- fl.models.load_pretrained(dir) -> model, tokenizer (nil without files).
function models.load_pretrained(dir, opts)
  options(opts, {}, "load_pretrained")
  if type(dir) ~= "string" then error("load_pretrained: expected a directory name", 0) end
  local cpath = dir .. "/config.json"
  if not exists(cpath) then error(fmt("load_pretrained: %s: no such file", cpath), 0) end
  local cfg = fl.load_json(cpath)
  local archs = type(cfg) == "table" and cfg.architectures
  local name = type(archs) == "table" and archs[1]
  local arch = ARCHITECTURES[name]
  if not arch then
    error(fmt("load_pretrained: %s: architecture '%s' is unsupported (GPT2LMHeadModel, LlamaForCausalLM, "
              .. "MistralForCausalLM, Qwen2ForCausalLM)", cpath, tostring(name)), 0)
  end
  local s = from_config(arch, cfg, cpath)
  s.class = name
  if exists(dir .. "/generation_config.json") then
    local gc = fl.load_json(dir .. "/generation_config.json")
    if type(gc) == "table" and gc.eos_token_id ~= nil then s.eos = gc.eos_token_id end
  end
  local raw, file = read_tensors(dir)
  local want, W = ARCH[arch].params(s), {}
  local known = {}
  for _, p in ipairs(want) do
    local n, shape = p[1], p[2]
    known[n] = true
    local t = raw[n]
    if t == nil then error(fmt("load_pretrained: %s/%s: tensor '%s' is missing", dir, file, n), 0) end
    local ok = t:dim() == #shape
    for i = 1, #shape do ok = ok and t.shape[i] == shape[i] end
    if not ok then
      error(fmt("load_pretrained: %s/%s: tensor '%s' is %s, the config says [%s]", dir, file, n, shape_str(t),
                table.concat(shape, ",")), 0)
    end
    if t.dtype ~= "float32" and t.dtype ~= "float16" and t.dtype ~= "bfloat16" then
      error(fmt("load_pretrained: %s/%s: tensor '%s' is %s (float32, float16 or bfloat16)", dir, file, n, t.dtype), 0)
    end
    -- float32 weights are the file's pages (mapped, copy on write); half
    -- precision ones are widened once: every product accumulates in float32
    W[n] = t.dtype == "float32" and t or t:to("float32")
  end
  for n in pairs(raw) do
    local skip = known[n] or (s.tied and n == "lm_head.weight")
    for _, pat in ipairs(ARCH[arch].ignored) do skip = skip or n:find(pat) ~= nil end
    if not skip then error(fmt("load_pretrained: %s/%s: tensor '%s' is not part of %s", dir, file, n, name), 0) end
  end
  local m = build(s, W)
  local tok
  if exists(dir .. "/tokenizer.json") or exists(dir .. "/vocab.json") then tok = fl.tokenizer(dir) end
  return m, tok
end

-- ---------------------------------------------------------------------------
-- the go-live checklist of a language model
-- ---------------------------------------------------------------------------

-- fl.checklist(m, {prompt = ids or text [, tok =] [, max_new_tokens = 32]
-- [, lengths = {...}] [, quiet =] [, name =]}): should decoding this model
-- be compiled?  Time to the first token (eager, compiled cold from an
-- empty cache, compiled warm as a new process finds it), one decode step
-- eager and compiled (medians, spreads, a verdict), compiles across prompts
-- of several lengths (the cache hit rate), greedy tokens against eager's,
-- the KV cache's bytes; then a recommendation with the numbers.
local LM_OPTIONS = {"prompt", "tok", "max_new_tokens", "lengths", "quiet", "name"}

function fl._checklist_lm(m, opts)
  local o = options(opts, LM_OPTIONS, "checklist")
  local s = m.spec
  local prompt = o.prompt
  if type(prompt) == "string" then
    if not o.tok then error("checklist: a text prompt needs tok = the model's tokenizer", 0) end
    prompt = o.tok:encode(prompt)
  end
  prompt = id_list(prompt, "checklist")
  local new = o.max_new_tokens or 32
  local L = math.min(s.positions, #prompt + new)
  if #prompt + new > s.positions then error(fmt("checklist: the prompt and %d new tokens exceed the model's %d positions", new, s.positions), 0) end
  local gopts = {max_new_tokens = new, stop = {}, max_length = L}
  local function gen(compile)
    local g = {}
    for k, v in pairs(gopts) do g[k] = v end
    g.compile = compile
    return m:generate(prompt, g)
  end
  local r = {weight_bytes = 0}
  for _, p in ipairs(m:parameters()) do r.weight_bytes = r.weight_bytes + p:numel() * 4 end
  -- eager first: its tokens are the reference
  gen(false)
  local eager_ids, est = gen(false)
  r.ttft_eager_ms = est.first_token_s * 1e3
  -- compiled from an empty cache (cold), then as a new process would (warm)
  m._run = nil
  local comp_ids, cold = fl.with_empty_cache(function() return gen(true) end)
  r.ttft_cold_ms = (cold.first_token_s + (cold.step_first_s or 0)) * 1e3
  m._run = nil
  local _, warm = gen(true)
  r.ttft_warm_ms = (warm.first_token_s + (warm.step_first_s or 0)) * 1e3
  comp_ids = select(1, gen(true))
  local same = 0
  while same < new and eager_ids[#prompt + same + 1] == comp_ids[#prompt + same + 1] do same = same + 1 end
  r.tokens_equal, r.new_tokens = same, new
  -- one decode step, eager and compiled, at the last position
  local step = m:decode_step(L, {compile = true})
  local id, at = fl.tensor({{prompt[#prompt]}}, {dtype = "int64"}), fl.tensor({#prompt}, {dtype = "int64"})
  local scratch = m:new_cache(L)
  local te = fl.measure(function() m(id, at, scratch) end, {runs = 20})
  local tc = fl.measure(function() step(id, at) end, {runs = 20})
  r.step_eager, r.step_compiled = te, tc
  r.tokens_per_s_eager, r.tokens_per_s_compiled = 1e3 / te.median_ms, 1e3 / tc.median_ms
  r.verdict = fl.compare_times(tc, te, {names = {"compiled", "eager"}})
  r.noisy = te.noisy or tc.noisy
  -- prompts of changing lengths: the prefill's compiles
  local lengths = o.lengths or {math.max(1, #prompt // 4), math.max(1, #prompt // 2), #prompt}
  local calls = 0
  for _, n in ipairs(lengths) do
    if n > #prompt then error(fmt("checklist: length %d is longer than the prompt (%d tokens)", n, #prompt), 0) end
    local g = {max_new_tokens = 2, stop = {}, max_length = L, compile = true}
    local _, ls = m:generate({table.unpack(prompt, 1, n)}, g)
    calls = calls + 1
    r.prefill_compiles, r.step_compiles = ls.prefill_compiles, ls.step_compiles
  end
  calls = calls + 3                                -- the cold, warm and check runs above
  r.calls, r.cache_hit_rate = calls, 1 - r.prefill_compiles / calls
  r.kv_cache_bytes = select(2, m:decode_step(L, {compile = true})).bytes
  r.bound_tokens_per_s = fl.machine_peaks().copy_gbs * 1e9 / r.weight_bytes
  -- the recommendation
  if same < new then
    r.decision = "eager"
    r.recommendation = fmt("do not compile: the compiled greedy tokens leave eager's after %d of %d", same, new)
  elseif r.verdict.verdict == 1 then
    r.decision = "compile"
    r.recommendation = fmt("compile the decode step (%s) and the prefill with dynamic lengths (%d compile for %d prompts); "
                           .. "the first token costs %.0f ms cold, %.0f ms warm", r.verdict.text, r.prefill_compiles,
                           #lengths, r.ttft_cold_ms, r.ttft_warm_ms)
  else
    r.decision = "eager"
    r.recommendation = fmt("no clear gain from compiling here (%s): decoding is bound by reading %.0f MB of weights "
                           .. "per token (%.0f tokens/s at this machine's copy bandwidth)", r.verdict.text,
                           r.weight_bytes / 1e6, r.bound_tokens_per_s)
  end
  if not o.quiet then
    local line = function(f, ...) print(fmt(f, ...)) end
    line("checklist: %s", o.name or m:_head())
    line("  time to first token: eager %.1f ms; compiled cold %.1f ms (compiling), warm %.1f ms (from the cache)",
         r.ttft_eager_ms, r.ttft_cold_ms, r.ttft_warm_ms)
    line("  one decode step: eager %s; compiled %s", tostring(te), tostring(tc))
    line("    = %.1f and %.1f tokens/s; reading the weights once per token caps it at %.0f", r.tokens_per_s_eager,
         r.tokens_per_s_compiled, r.bound_tokens_per_s)
    line("  compiles: prefill %d, decode step %d over %d calls (prompts of %s tokens): cache hit rate %.0f%%",
         r.prefill_compiles, r.step_compiles, calls, table.concat(lengths, ", "), 100 * r.cache_hit_rate)
    line("  accuracy: %d of %d greedy tokens equal eager's", same, new)
    line("  memory: KV cache %.2f MB for %d positions; weights %.1f MB", r.kv_cache_bytes / 1e6, L, r.weight_bytes / 1e6)
    line("  recommendation: %s", r.recommendation)
  end
  return r
end
