#!/bin/sh
# tokenizer_live.sh -- fl.tokenizer against PyPI `tokenizers` itself, live:
# tests/llm/tok_live.py draws 300 random texts (seed 1; FUSELAB_TOK_SEED picks another)
# and writes the ids tokenizers gives for the four tokenizers of
# tests/llm/data/tok; fuselab must give the same ids and decoded texts.
# The Python is FUSELAB_ONNX_NODE_PYTHON (the test venv setup.sh --test makes,
# with tokenizers); without one, or without tokenizers in it, a TAP skip.
: "${FUSELAB:=./fuselab}" "${FUSELAB_SRC:=..}"
. "$FUSELAB_SRC/tests/onnx/test_python.sh"
test_python "import tokenizers" tokenizers
tmp=$(mktemp -d "${TMPDIR:-/tmp}/fl-tok.XXXXXX") || exit 1
trap 'rm -rf "$tmp"' EXIT
seed=${FUSELAB_TOK_SEED:-1}
"$PY" "$FUSELAB_SRC/tests/llm/tok_live.py" "$tmp/cases.lua" 300 "$seed" >"$tmp/gen.log" 2>&1 || {
  echo "1..1"; echo "not ok 1 - tok_live.py wrote the cases"; sed 's/^/# /' "$tmp/gen.log"; exit 1; }
echo "# seed $seed (FUSELAB_TOK_SEED=$seed reproduces it)"
sed 's/^/# /' "$tmp/gen.log"
exec "$FUSELAB" -e "
local cases = dofile('$tmp/cases.lua')
local n, names = 0, {}
for name in pairs(cases) do names[#names + 1] = name end
table.sort(names)
print('1..' .. #names)
for _, name in ipairs(names) do
  local tok, bad = fl.tokenizer('$FUSELAB_SRC/tests/llm/data/tok/' .. name), {}
  for _, c in ipairs(cases[name]) do
    local ids = tok:encode(c.text)
    local same = #ids == #c.ids
    for i = 1, #ids do same = same and ids[i] == c.ids[i] end
    if not same then bad[#bad + 1] = string.format('%q: got {%s}, tokenizers {%s}', c.text, table.concat(ids, ','), table.concat(c.ids, ','))
    elseif tok:decode(ids) ~= c.decoded then bad[#bad + 1] = string.format('%q decoded %q, tokenizers %q', c.text, tok:decode(ids), c.decoded) end
  end
  n = n + 1
  for i = 1, math.min(#bad, 5) do print('# ' .. bad[i]) end
  print((#bad == 0 and 'ok ' or 'not ok ') .. n .. ' - ' .. name .. ': ' .. #cases[name] .. ' random texts, ids and decoded text equal tokenizers\' (' .. #bad .. ' differ)')
end
"
