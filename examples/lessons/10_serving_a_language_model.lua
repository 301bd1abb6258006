-- Lesson 10: serving a language model -- prefill, decode, and what a
-- static cache and one compiled step buy.
--
-- Claim (doc/DESIGN.md, "language models"; the seed's opening: users of an
-- AI app complain of slow answers): generating text is two different
-- workloads.  The prefill runs the whole prompt through the model at once
-- (products of [T, d] by [d, d]: arithmetic); each decoded token runs it
-- again for one row, so every weight is read from memory to do two flops
-- with it -- decoding is bound by the bytes of the weights and by the
-- per-call overhead, not by arithmetic.  A KV cache keeps each layer's keys
-- and values so a token costs one row instead of the whole prefix; a
-- static cache (allocated once, written at a position given as a tensor)
-- lets one compiled decode step serve every position, where a cache that
-- grows would change shapes every token and recompile.
--
-- What it measures: a GPT-2-shaped model with random weights made here
-- (d 256, 4 layers, vocab 8000: 5 M parameters), or the checkpoint
-- FUSELAB_MODEL_DIR names (fl.models.load_pretrained: GPT-2 or Llama
-- family).  1. prefill against decode, tokens per second; 2. decoding's
-- bytes of weights per token against this machine's copy bandwidth (the
-- roofline's bound); 3. without a cache (the prefix recomputed every token)
-- against the static cache; 4. the decode step compiled: one compile for
-- every position, its time against eager's (medians with their spread),
-- greedy tokens equal to eager's; 5. prompts of changing lengths: the
-- prefill compiled once for all (the cache hit rate of the seed's
-- checklist); 6. the decode step's graph drawn, the cache writes visible.
--
-- Run: fuselab examples/lessons/10_serving_a_language_model.lua   (a few
-- seconds; FUSELAB_MODEL_DIR=dir to use a real checkpoint)

local fl = fl or require "fuselab"

local dir = os.getenv("FUSELAB_MODEL_DIR")
local m, tok
if dir and dir ~= "" then
  m, tok = fl.models.load_pretrained(dir)
else
  m = fl.models.gpt2{n_embd = 256, n_layer = 4, n_head = 4, vocab_size = 8000, n_positions = 256, seed = 1}
end
local s = m.spec
local weight_bytes = 0
for _, p in ipairs(m:parameters()) do weight_bytes = weight_bytes + p:numel() * 4 end
print(("The model: %s\n  %.1f M parameters, %.1f MB of float32 weights"):format(
  m:_head(), weight_bytes / 4e6, weight_bytes / 1e6))

local T, NEW = 64, 32
local prompt = {}
for i = 1, T do prompt[i] = (i * 7919 + 13) % s.vocab end
local ids = fl.tensor(prompt, {dtype = "int64"})

-- 1. Prefill and decode, eager, the same model.
m:generate(prompt, {max_new_tokens = 4, stop = {}})              -- warm the kernels
local _, st = m:generate(prompt, {max_new_tokens = NEW, stop = {}})
local prefill_tps = T / st.first_token_s
print(("1. prefill: %d tokens in %.1f ms = %.0f tokens/s; decode: %.1f tokens/s"):format(
  T, st.first_token_s * 1e3, prefill_tps, st.tokens_per_s))
print(("   a prompt token costs %.0fx less than a decoded one: the prefill reads each weight once"):format(
  prefill_tps / st.tokens_per_s))
print("   for all its tokens, decoding reads every weight for each token")

-- 2. The bound decoding cannot beat: the weights' bytes at the machine's
-- copy bandwidth (measured here, cached: fl.machine_peaks).
local peaks = fl.machine_peaks()
local bound = peaks.copy_gbs * 1e9 / weight_bytes
print(("2. this machine copies %.1f GB/s: reading %.1f MB of weights caps decoding at %.0f tokens/s;"):format(
  peaks.copy_gbs, weight_bytes / 1e6, bound))
print(("   eager decoding reaches %.0f %% of that bound (%.1f GB/s of weights)"):format(
  100 * st.tokens_per_s / bound, weight_bytes * st.tokens_per_s / 1e9))

-- 3. Without a cache every token recomputes the whole prefix.
local function no_cache(n)
  local seq = {table.unpack(prompt)}
  local t0 = fl.now()
  fl.no_grad(function()
    for _ = 1, n do
      local logits = m(fl.tensor(seq, {dtype = "int64"}))
      seq[#seq + 1] = logits[#seq]:argmax():item()
    end
  end)
  return n / (fl.now() - t0), seq
end
local nc_tps, nc_seq = no_cache(8)
local cached = m:generate(prompt, {max_new_tokens = 8, stop = {}})
local same = table.concat(nc_seq, ",") == table.concat(cached, ",")
print(("3. without a cache: %.1f tokens/s (the %d-token prefix recomputed each time); with the"):format(nc_tps, T))
print(("   static cache %.1f tokens/s, %.1fx; the same %s tokens"):format(st.tokens_per_s, st.tokens_per_s / nc_tps,
  same and "greedy" or "(NOT the same!)"))
assert(same, "the cached decoding differs from recomputing the prefix")

-- 4. One compiled decode step for every position.
local eager_out = m:generate(prompt, {max_new_tokens = NEW, stop = {}})
m:generate(prompt, {max_new_tokens = 4, stop = {}, compile = true})   -- compiles once
local comp_out, cst = m:generate(prompt, {max_new_tokens = NEW, stop = {}, compile = true})
local equal = table.concat(eager_out, ",") == table.concat(comp_out, ",")
print(("4. compiled: the decode step compiled %d time(s) for positions %d to %d; prefill %d"):format(
  cst.step_compiles, T, T + NEW - 1, cst.prefill_compiles))
print(("   decoding %.1f tokens/s (eager %.1f), %.0f %% of the bound; greedy tokens %s eager's"):format(
  cst.tokens_per_s, st.tokens_per_s, 100 * cst.tokens_per_s / bound, equal and "equal" or "DIFFER from"))
assert(equal, "compiled decoding differs from eager")
assert(cst.step_compiles == 1, "the decode step recompiled")
-- the per-token time, measured: medians with their spread
local step = m:decode_step(cst.cache_len, {compile = true})     -- the step generate ran
local cache = m:new_cache(cst.cache_len)
local one, at = fl.tensor({{prompt[1]}}, {dtype = "int64"}), fl.tensor({T}, {dtype = "int64"})
local te = fl.measure(function() fl.no_grad(function() m(one, at, cache) end) end, {runs = 20})
local tc = fl.measure(function() fl.no_grad(function() step(one, at) end) end, {runs = 20})
print(("   one decode step: eager %s, compiled %s"):format(tostring(te), tostring(tc)))
print("   " .. fl.compare_times(tc, te, {names = {"compiled", "eager"}}).text)

-- 5. Requests come with prompts of every length: with a symbolic length
-- the prefill compiles once and every later length is a cache hit.
local lengths = {5, 17, 33, 48, 64}
local compiles
for _, n in ipairs(lengths) do
  local _, ls = m:generate({table.unpack(prompt, 1, n)}, {max_new_tokens = 2, stop = {}, compile = true,
                                                          max_length = T + NEW})
  compiles = ls.prefill_compiles
end
print(("5. prompts of %s tokens: the prefill compiled %d time(s), %d of %d calls hit the cache"):format(
  table.concat(lengths, ", "), compiles, #lengths + 2 - compiles, #lengths + 2))

-- 6. The decode step's graph: the cache read and written in place.
os.execute("mkdir -p serving")
local small = fl.models.gpt2{n_embd = 32, n_layer = 1, n_head = 2, vocab_size = 64, n_positions = 16, seed = 2}
local sc = small:new_cache(16)
local g = fl.capture(function(id, pos) return small(id, pos, sc) end,
                     fl.tensor({{3}}, {dtype = "int64"}), fl.tensor({5}, {dtype = "int64"}))
local wb = g:writebacks()
print(("6. the decode step of a 1-layer model: %d nodes, %d in-place writes (the cache's keys and values)"):format(
  g:stats().nodes, #wb))
fl.draw(g, "serving/decode_step.svg", {title = "one decode step: the KV cache written in place"})
if tok then
  io.write("\nThe checkpoint's own words: ")
  fl.generate(m, tok, "The compiler", {max_new_tokens = 24, compile = true})
end
print("\nPicture written to serving/: decode_step.svg (the cache writes are the 'in place' arrows)")
