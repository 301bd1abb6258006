-- llm_decode.lua DIR eager|compiled PROMPT NEW -- fuselab's side of
-- bench/llm_decode.py: load the checkpoint in DIR, generate greedily once
-- to warm up (compiling when compiled), then once timed; prints RESULT and
-- a JSON object (prefill_ms, tps, tokens, first_ms, weight bytes, the
-- bandwidth decoding reads them at).
local dir, side, n_prompt, n_new = arg[1], arg[2], tonumber(arg[3] or 128), tonumber(arg[4] or 64)
local m = fl.models.load_pretrained(dir)
local s = m.spec
local prompt = {}
for i = 0, n_prompt - 1 do prompt[#prompt + 1] = (i * 7919 + 13) % s.vocab end
local opts = {max_new_tokens = n_new, stop = {}, compile = side == "compiled"}
local _, cold = m:generate(prompt, opts)
local out, st = m:generate(prompt, opts)
local bytes = 0
for _, p in ipairs(m:parameters()) do bytes = bytes + p:numel() * 4 end
local toks = {}
for i = n_prompt + 1, #out do toks[#toks + 1] = string.format("%d", out[i]) end
print(string.format('RESULT {"prefill_ms": %.3f, "tps": %.4f, "first_ms": %.3f, "weight_bytes": %d, '
                    .. '"gbs": %.3f, "step_compiles": %d, "tokens": [%s]}',
                    st.first_token_s * 1e3, st.tokens_per_s, cold.first_token_s * 1e3, bytes,
                    bytes * st.tokens_per_s / 1e9, st.step_compiles or 0, table.concat(toks, ", ")))
