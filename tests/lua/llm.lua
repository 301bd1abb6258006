-- llm.lua -- language models against Hugging Face transformers: a tiny
-- random GPT-2 (float32, sharded), a Llama (bfloat16, grouped-query heads)
-- a Qwen2 (float16, q/k/v biases, tied head, rope_parameters of
-- transformers 5), a Mistral (a sliding window of 6 positions, one
-- key/value head) and a Llama with Llama 3.1's rope scaling, saved by
-- tests/llm/make_models.py with save_pretrained.
-- Checked: last-position logits within 1e-4 of the largest logit (plus
-- 1e-5) and the sum of all logits within 1e-5 relative, for prompts of 1,
-- 5, 17 and 40 tokens; greedy decoding equal to transformers' generate for
-- 64 tokens, eager and compiled; the compiled decode step compiled once for
-- every position and the prefill once for every prompt length; the cached
-- forward equal to the uncached one; sampling; the names round-trip through
-- fl.save_weights; bad checkpoints are clear errors naming file and field.
local t = require "tap"
local src = os.getenv("FUSELAB_SRC") or "."
local dir = src .. "/tests/llm/data/models"
local ref = dofile(dir .. "/ref.lua")

local function ids(list) return fl.tensor(list, {dtype = "int64"}) end

local function maxdiff(a, b)
  local d = 0
  for i = 1, #a do d = math.max(d, math.abs(a[i] - b[i])) end
  return d
end

local loaded = {}
for _, name in ipairs({"gpt2", "llama", "qwen2", "mistral", "llama31"}) do
  local m, tok = fl.models.load_pretrained(dir .. "/" .. name)
  loaded[name] = {m, tok}
  t.ok(tok ~= nil, name .. ": the tokenizer comes with the model: " .. tostring(tok))
  for _, c in ipairs(ref[name]) do
    local logits = m(ids(c.prompt))
    local d = maxdiff(logits[#c.prompt]:tolist(), c.last)
    local sum = logits:sum():item()
    t.ok(d <= 1e-4 * c.absmax + 1e-5 and math.abs(sum - c.sum) <= 1e-5 * math.abs(c.sum) + 1e-3,
         string.format("%s: %d-token prompt: logits equal transformers' (max diff %.2g of %.3g, sum %.6g vs %.6g)",
                       name, #c.prompt, d, c.absmax, sum, c.sum))
  end
  local g = ref[name].greedy
  for _, compile in ipairs({false, true}) do
    -- the cache the run will use starts as noise: a row it reads without
    -- writing it first (an earlier run's left there) shows
    local _, cache = m:decode_step(128, {compile = compile})
    for i = 1, #cache.k do
      cache.k[i]:copy_(fl.randn(table.unpack(cache.k[i].shape)) * 100)
      cache.v[i]:copy_(fl.randn(table.unpack(cache.v[i].shape)) * 100)
    end
    local out, st = m:generate(g.prompt, {max_new_tokens = 64, stop = {}, compile = compile})
    local bad = 0
    for i = 1, 64 do if out[#g.prompt + i] ~= g.tokens[i] then bad = bad + 1 end end
    t.ok(bad == 0 and #out == #g.prompt + 64,
         string.format("%s: 64 greedy tokens equal transformers' generate (%s; %d differ)", name,
                       compile and "compiled" or "eager", bad))
    if compile then
      t.is(st.step_compiles, 1, name .. ": the decode step compiled once for 63 positions")
    end
  end
end

-- one compile of the prefill for every prompt length, one decode step for all
do
  local m = loaded.llama[1]
  local last
  for _, n in ipairs({3, 7, 12, 20}) do
    local p = {}
    for i = 1, n do p[i] = (i * 37) % 800 end
    local _, st = m:generate(p, {max_new_tokens = 4, stop = {}, compile = true, max_length = 40})
    last = st
  end
  t.is(last.prefill_compiles, 1, "prefill compiled once for prompts of 3, 7, 12 and 20 tokens")
  t.is(last.step_compiles, 1, "the decode step compiled once for all of them")
end

-- 256 tokens from one compiled step (the cache rounded up to 384 positions)
do
  local m = fl.models.gpt2{n_embd = 16, n_layer = 1, n_head = 2, vocab_size = 50, n_positions = 512, seed = 3}
  local a = m:generate({1, 2, 3}, {max_new_tokens = 256, stop = {}})
  local b, st = m:generate({1, 2, 3}, {max_new_tokens = 256, stop = {}, compile = true, mode = "reduce-overhead"})
  t.is(b, a, "256 compiled greedy tokens equal eager's")
  t.ok(st.step_compiles == 1 and st.cache_len == 384,
       string.format("one compile for 255 decode steps (%d), a cache of %d", st.step_compiles, st.cache_len))
end

-- the cache: prefill then one token at a time gives the uncached logits
for _, name in ipairs({"gpt2", "llama", "mistral"}) do
  local m = loaded[name][1]
  fl.manual_seed(3)
  local seq = {}
  for i = 1, 24 do seq[i] = (i * i * 13 + 5) % 700 end
  local full = m(ids(seq))
  local cache = m:new_cache(32)
  local pre = m:forward(ids({table.unpack(seq, 1, 10)}):reshape(1, 10), fl.arange(10), cache)
  local d = maxdiff(pre[1]:reshape(-1):tolist(), full:narrow(1, 1, 10):reshape(-1):tolist())
  for i = 11, 24 do
    local one = m:forward(ids({{seq[i]}}), ids({i - 1}), cache)
    d = math.max(d, maxdiff(one:reshape(-1):tolist(), full[i]:tolist()))
  end
  t.ok(d < 1e-4, string.format("%s: prefill of 10 then 14 cached steps equal the uncached forward (max diff %.2g)", name, d))
end

-- sampling: a seed repeats, top_k = 1 is greedy, temperature spreads
do
  local m = loaded.gpt2[1]
  local p = {40, 280, 322}
  local a = m:generate(p, {max_new_tokens = 20, stop = {}, temperature = 8.0, seed = 7})
  local b = m:generate(p, {max_new_tokens = 20, stop = {}, temperature = 8.0, seed = 7})
  local c = m:generate(p, {max_new_tokens = 20, stop = {}, temperature = 8.0, seed = 8})
  local greedy = m:generate(p, {max_new_tokens = 20, stop = {}})
  local k1 = m:generate(p, {max_new_tokens = 20, stop = {}, temperature = 0.7, top_k = 1, seed = 3})
  local p1 = m:generate(p, {max_new_tokens = 20, stop = {}, temperature = 0.7, top_p = 1e-9, seed = 3})
  t.is(a, b, "the same seed samples the same tokens")
  t.ok(t.show(a) ~= t.show(c), "another seed samples others")
  t.is(k1, greedy, "top_k = 1 is greedy")
  t.is(p1, greedy, "a tiny top_p keeps only the most likely token")
  local stopped = m:generate(p, {max_new_tokens = 20, stop = greedy[5]})
  local first = 4
  while greedy[first] ~= greedy[5] do first = first + 1 end
  t.is(#stopped, first, "generation stops at the first stop token")
end

-- streaming through the tokenizer
do
  local m, tok = loaded.gpt2[1], loaded.gpt2[2]
  local written = {}
  local old = io.write
  io.write = function(...) for _, s in ipairs({...}) do written[#written + 1] = s end end
  local ok, text = pcall(fl.generate, m, tok, "Hello world", {max_new_tokens = 12, stop = {}})
  io.write = old
  t.ok(ok, "fl.generate runs: " .. tostring(text))
  local prompt = tok:encode("Hello world")
  local want = tok:decode({table.unpack(m:generate(prompt, {max_new_tokens = 12, stop = {}}), #prompt + 1)})
  t.is(table.concat(written):gsub("\n$", ""), want, "fl.generate streams the decoded new text")
  t.is(text, want, "and returns it")
  -- a stop string ends the text before it, and the generation with it
  local s = want:sub(5, 7)
  local cut, st = fl.generate(m, tok, "Hello world", {max_new_tokens = 12, stop = {s}, stream = false})
  t.is(cut, want:sub(1, want:find(s, 1, true) - 1), string.format("a stop string %q ends the text before it", s))
  t.ok(st.new_tokens < 12, "and the generation (" .. st.new_tokens .. " tokens)")
end

-- names are the checkpoint's: save_weights writes them, a fresh model loads them
do
  local m = loaded.llama[1]
  local sd = m:state_dict()
  local file = fl.load_safetensors(dir .. "/llama/model.safetensors")
  local missing = {}
  for n in pairs(file) do if not sd[n] then missing[#missing + 1] = n end end
  for n in pairs(sd) do if not file[n] then missing[#missing + 1] = n end end
  t.is(#missing, 0, "llama: the module's names are the checkpoint's " .. table.concat(missing, " "))
  local tmp = t.tmpdir()
  fl.save_weights(m, tmp .. "/w.safetensors")
  local m2 = fl.models.load_pretrained(dir .. "/llama")
  for _, p in ipairs(m2:parameters()) do p:zero_() end
  fl.load_weights(m2, tmp .. "/w.safetensors")
  t.ok(fl.allclose(m(ids({1, 2, 3})), m2(ids({1, 2, 3})), 0, 0), "fl.save_weights and fl.load_weights round-trip")
end

-- random-weight models of the same classes
do
  local g = fl.models.gpt2{n_embd = 16, n_layer = 1, n_head = 2, vocab_size = 50, n_positions = 16}
  local l = fl.models.llama{hidden_size = 16, num_hidden_layers = 1, num_attention_heads = 4, num_key_value_heads = 1,
                            intermediate_size = 24, vocab_size = 50, max_position_embeddings = 16}
  t.is(g(ids({1, 2, 3})).shape, {3, 50}, "fl.models.gpt2{...}: logits [T, vocab]")
  t.is(l(ids({{1, 2}, {3, 4}})).shape, {2, 2, 50}, "fl.models.llama{...}: logits [B, T, vocab]")
  t.raises(function() g:generate({1, 2}, {max_new_tokens = 20}) end, "exceed the cache of 16", "past the positions is refused")
  t.raises(function() g:generate({1, 99}, {max_new_tokens = 2}) end, "ids%[2%] = 99 is not a token id", "an id past the vocabulary is refused")
  t.raises(function() g(fl.tensor({1.5})) end, "expected an int64 tensor", "float ids are refused")
end

-- the decoding checklist: every field measured, the recommendation decided
do
  local m, tok = loaded.gpt2[1], loaded.gpt2[2]
  local r = fl.checklist(m, {prompt = "Hello, world! How are you?", tok = tok, max_new_tokens = 8, quiet = true,
                             lengths = {2, 5}})
  t.is(r.tokens_equal, 8, "checklist: compiled greedy tokens equal eager's")
  t.ok(r.prefill_compiles == 1 and r.step_compiles == 1, "checklist: one compile each over the sweep")
  t.ok(r.cache_hit_rate > 0.7, string.format("checklist: cache hit rate %.2f", r.cache_hit_rate))
  t.ok(r.ttft_cold_ms > 0 and r.ttft_warm_ms > 0 and r.ttft_eager_ms > 0, "checklist: the three first-token times")
  t.ok(r.tokens_per_s_eager > 0 and r.tokens_per_s_compiled > 0 and r.step_eager.runs > 0, "checklist: steady decoding timed")
  local L = #tok:encode("Hello, world! How are you?") + 8
  t.is(r.kv_cache_bytes, 2 * 2 * 4 * L * 8 * 4, "checklist: KV cache bytes (2 layers, keys and values, 4 heads of 8, float32)")
  t.ok(r.decision == "compile" or r.decision == "eager", "checklist: a decision: " .. r.recommendation)
  t.raises(function() fl.checklist(m, {prompt = "x", max_new_tokens = 4}) end, "a text prompt needs tok", "a text prompt without its tokenizer")
end

-- bad checkpoints: each names the file and the field, and nothing loads
do
  local tmp = t.tmpdir()
  local function copy(from, to)
    os.execute(string.format("rm -rf '%s' && cp -r '%s' '%s'", to, from, to))
  end
  local function write(path, s) local f = assert(io.open(path, "wb")); f:write(s); f:close() end
  local function edit(path, fn) local s = t.slurp(path); write(path, fn(s)) end
  local d = tmp .. "/m"
  copy(dir .. "/llama", d)
  edit(d .. "/config.json", function(s) return (s:gsub("LlamaForCausalLM", "FalconForCausalLM")) end)
  t.raises(function() fl.models.load_pretrained(d) end, "config.json: architecture 'FalconForCausalLM' is unsupported", "an unknown architecture")
  copy(dir .. "/llama", d)
  edit(d .. "/config.json", function(s) return (s:gsub('"intermediate_size": 64', '"intermediate_size": 65')) end)
  t.raises(function() fl.models.load_pretrained(d) end, "model.safetensors: tensor 'model.layers.0.mlp.gate_proj.weight' is %[64,32%], the config says %[65,32%]",
           "a tensor whose shape disagrees with the config")
  copy(dir .. "/llama", d)
  edit(d .. "/config.json", function(s) return (s:gsub('"num_hidden_layers": 2', '"num_hidden_layers": 3')) end)
  t.raises(function() fl.models.load_pretrained(d) end, "tensor 'model.layers.2.input_layernorm.weight' is missing", "a missing tensor")
  copy(dir .. "/llama31", d)
  edit(d .. "/config.json", function(s) return (s:gsub('"llama3"', '"yarn"')) end)
  t.raises(function() fl.models.load_pretrained(d) end, "rope type 'yarn' is unsupported %(default, linear and llama3%)", "a rope type not read")
  copy(dir .. "/llama31", d)
  edit(d .. "/config.json", function(s) return (s:gsub('"low_freq_factor": 1.0,', '')) end)
  t.raises(function() fl.models.load_pretrained(d) end, "rope type 'llama3' needs a positive 'low_freq_factor'", "a rope parameter missing")
  copy(dir .. "/llama", d)
  edit(d .. "/config.json", function(s) return (s:gsub('"hidden_size": 32', '"hidden_size": -32')) end)
  t.raises(function() fl.models.load_pretrained(d) end, "field 'hidden_size' is %-32", "a negative size")
  copy(dir .. "/llama", d)
  edit(d .. "/model.safetensors", function(s) return s:sub(1, #s - 100) end)
  t.raises(function() fl.models.load_pretrained(d) end, "model.safetensors: safetensors: .*", "a truncated safetensors file")
  copy(dir .. "/llama", d)
  local header = '{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}}'
  write(d .. "/model.safetensors", string.pack("<I8", #header) .. header .. string.rep("\0", 12))
  t.raises(function() fl.models.load_pretrained(d) end, "model.safetensors: safetensors: .*overlap", "overlapping tensors in a safetensors file")
  copy(dir .. "/gpt2", d)
  edit(d .. "/model.safetensors.index.json", function(s) return (s:gsub("model%-00003%-of%-00003", "model-00009-of-00003")) end)
  t.raises(function() fl.models.load_pretrained(d) end, "model%-00009%-of%-00003.safetensors: No such file", "an index naming a missing shard")
  copy(dir .. "/gpt2", d)
  edit(d .. "/model.safetensors.index.json", function(s) return (s:gsub('"model%-00003%-of%-00003.safetensors"', '"../../etc/passwd"', 1)) end)
  t.raises(function() fl.models.load_pretrained(d) end, "is not a file name in the directory", "an index naming a path outside the directory")
  copy(dir .. "/gpt2", d)
  os.remove(d .. "/merges.txt")
  t.raises(function() fl.models.load_pretrained(d) end, "merges.txt: No such file", "a missing merges file")
  t.raises(function() fl.models.load_pretrained(tmp .. "/none") end, "config.json: no such file", "a directory without a config")
end

t.done()
