-- tokenizer.lua -- fl.tokenizer against Hugging Face's `tokenizers`: four
-- small BPE tokenizers in the layouts language models ship (GPT-2's
-- vocab.json + merges.txt, Llama 2's, Llama 3's and a Metaspace
-- tokenizer.json), trained and run by tests/llm/make_tok.py, whose ids and
-- decoded texts (tests/llm/data/tok/cases.lua) must come out exactly, for
-- ASCII, accents, composed and decomposed letters, CJK, emoji with joiners,
-- whitespace runs, special tokens inside text.  Then round trips, and bad
-- files and inputs: each a clear error naming the file and the field.
local t = require "tap"
local src = os.getenv("FUSELAB_SRC") or "."
local dir = src .. "/tests/llm/data/tok"
local cases = dofile(dir .. "/cases.lua")

-- ok, with the first few failures as diagnostics
local function all_ok(bad, name)
  for i = 1, math.min(#bad, 5) do t.diag(bad[i]) end
  t.ok(#bad == 0, name)
end

local function same(a, b)
  if #a ~= #b then return false end
  for i = 1, #a do if a[i] ~= b[i] then return false end end
  return true
end

for _, name in ipairs({"gpt2", "llama", "llama3", "metaspace"}) do
  local tok = fl.tokenizer(dir .. "/" .. name)
  local bad = {}
  for i, c in ipairs(cases[name]) do
    local ids, plain = tok:encode(c.text), tok:encode(c.text, {add_special_tokens = false})
    if not same(ids, c.ids) or not same(plain, c.ids_plain) then
      bad[#bad + 1] = string.format("case %d %q: got {%s}, HF {%s}", i, c.text:sub(1, 30),
                                    table.concat(ids, ","), table.concat(c.ids, ","))
    elseif tok:decode(ids) ~= c.decoded or tok:decode(plain) ~= c.decoded_plain then
      bad[#bad + 1] = string.format("case %d decoded %q, HF %q", i, tok:decode(ids), c.decoded)
    end
  end
  all_ok(bad, name .. ": ids and decoded text equal tokenizers' on " .. #cases[name] .. " texts")
  t.ok(tostring(tok):match("^fl.Tokenizer%(.*BPE, %d+ tokens"), name .. ": prints " .. tostring(tok))
end

-- round trips: decode(encode(s)) == s without the template's specials, for
-- the byte-level tokenizers (Llama 2's normalizer puts a space after each
-- special token, as it does in `tokenizers`: its decoded texts are checked
-- against theirs above)
do
  local texts = {}
  for _, c in ipairs(cases.gpt2) do texts[#texts + 1] = c.text end
  for _, name in ipairs({"gpt2", "llama3"}) do
    local tok, bad = fl.tokenizer(dir .. "/" .. name), {}
    for _, s in ipairs(texts) do
      local norm = name == "llama3" and s:gsub("e\204\129", "\195\169") or s   -- NFC composes e + U+0301
      local back = tok:decode(tok:encode(s, {add_special_tokens = false}))
      if back ~= norm then bad[#bad + 1] = string.format("%q -> %q", s, back) end
    end
    all_ok(bad, name .. ": decode(encode(s)) == s")
  end
end

-- the object: vocab_size, token_to_id, id_to_token, special tokens, tensors
do
  local tok = fl.tokenizer(dir .. "/gpt2")
  local eot = tok:token_to_id("<|endoftext|>")
  t.ok(eot ~= nil and tok:id_to_token(eot) == "<|endoftext|>", "gpt2: <|endoftext|> is id " .. tostring(eot))
  t.ok(tok:is_special(eot) and not tok:is_special(40), "gpt2: <|endoftext|> is special, 'H' is not")
  t.is(tok.vocab_size, #tok, "vocab_size equals #tok")
  local ids = tok:encode("Hello world<|endoftext|>")
  t.is(ids[#ids], eot, "<|endoftext|> in text encodes as its id")
  t.is(tok:decode(ids, {skip_special_tokens = true}), "Hello world", "skip_special_tokens leaves it out")
  t.is(tok:decode(fl.tensor(ids, {dtype = "int64"})), "Hello world<|endoftext|>", "decode takes an int64 tensor")
  t.is(tok:token_to_id("no such token"), nil, "token_to_id of an unknown string is nil")
  -- a piece of one character repeated 20000 times: merges run in n log n
  local t0 = fl.now()
  local long = tok:encode(string.rep("a", 20000))
  t.ok(tok:decode(long) == string.rep("a", 20000), "a 20000-character word round-trips")
  t.diag(string.format("20000-character word: %.1f ms", (fl.now() - t0) * 1e3))
end

-- bad inputs and files: clear errors naming the file and the field
do
  local tok = fl.tokenizer(dir .. "/llama")
  t.raises(function() tok:encode("bad \255 utf8") end, "not valid UTF%-8 %(byte 4%)", "invalid UTF-8 is refused, naming the byte")
  t.raises(function() tok:decode({1, 99999}) end, "id 99999 %(at 2%) is not in the vocabulary", "an id outside the vocabulary is refused")
  t.raises(function() tok:decode({1, 2.5}) end, "ids%[2%] is not an integer", "a fractional id is refused")
  local tmp = t.tmpdir()
  local function write(name, s) local f = assert(io.open(tmp .. "/" .. name, "wb")); f:write(s); f:close() end
  t.raises(function() fl.tokenizer(tmp) end, "has neither tokenizer.json nor vocab.json", "an empty directory says what it looked for")
  write("vocab.json", '{"a": 0, "b": 1, "ab": 2}')
  t.raises(function() fl.tokenizer(tmp) end, "merges.txt: No such file", "a missing merges file names it")
  write("merges.txt", "#version: 0.2\na b\nab c\n")
  t.raises(function() fl.tokenizer(tmp) end, "merges: merge 2 names 'c', which is not in the vocabulary", "a merge of unknown tokens names its line")
  write("vocab.json", '{"a": 0, "b": 1, "ab": 99999999999}')
  t.raises(function() fl.tokenizer(tmp) end, "vocab.json: vocab: token 'ab' has id out of range", "an absurd id is refused, naming the token")
  write("vocab.json", '{"a": 0, "b": 1, "ab": 4.4e77}')
  t.raises(function() fl.tokenizer(tmp) end, "token 'ab' has id out of range", "an id past every integer is refused (no conversion of it)")
  write("vocab.json", '{"a": 0, "b": 0}')
  t.raises(function() fl.tokenizer(tmp) end, "id 0 is given to two tokens", "two tokens with one id are refused")
  write("vocab.json", '{"a": 0, "b": 1')
  t.raises(function() fl.tokenizer(tmp) end, "vocab.json: not valid JSON", "truncated JSON is refused")
  write("tokenizer.json", '{"model": {"type": "WordPiece", "vocab": {}}}')
  t.raises(function() fl.tokenizer(tmp) end, "model: 'WordPiece' is unsupported", "another model kind is a clean refusal")
  write("tokenizer.json", '{"model": {"type": "BPE", "vocab": {"a": 0}, "merges": []}, "pre_tokenizer": {"type": "Split", "pattern": {"Regex": "(unclosed"}, "behavior": "Isolated"}}')
  t.raises(function() fl.tokenizer(tmp) end, "Split's regex does not compile", "a regex PCRE2 rejects names the field")
  write("tokenizer.json", '{"model": {"type": "BPE", "vocab": {"a": 0}, "merges": []}, "normalizer": {"type": "BertNormalizer"}}')
  t.raises(function() fl.tokenizer(tmp) end, "normalizer: 'BertNormalizer' is unsupported", "an unknown normalizer is a clean refusal")
  write("tokenizer.json", '{"model": {"type": "BPE", "vocab": {"a": 0}, "merges": []}}')
  local small = fl.tokenizer(tmp)
  t.raises(function() small:encode("ab") end, "U%+0062 is not in the vocabulary, which has no unk token", "an unknown character without unk names it")
end

t.done()
