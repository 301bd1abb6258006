#!/bin/sh
# repl.sh -- the fuselab binary from the outside: the command-line modes
# (script, -e, -i, stdin, --help, --version) here, the REPL on a terminal
# through a pseudo-terminal in drive.py.  Prints TAP, the plan last.
#
# Env: FUSELAB  the built binary; FUSELAB_SRC  the source tree.
# The terminal tests need Python 3 with pexpect (Debian: python3-pexpect).

: "${FUSELAB:?FUSELAB must name the fuselab binary}"
SRC=${FUSELAB_SRC:-$(cd "$(dirname "$0")/../.." && pwd)}
here=$SRC/tests/repl
tmp=$(mktemp -d "${TMPDIR:-/tmp}/fl-repl.XXXXXX") || exit 1
trap 'rm -rf "$tmp"' EXIT
trap 'exit 1' INT TERM
n=0

# check DESCRIPTION FUNCTION: ok when the function returns 0; what it
# printed becomes TAP comments when it fails.
check() {
  n=$((n + 1))
  if "$2" >"$tmp/why" 2>&1; then
    echo "ok $n - $1"
  else
    echo "not ok $n - $1"
    sed 's/^/# /' "$tmp/why"
  fi
}

# run ARGS...: fuselab with stdin from $tmp/in (empty unless set), stdout
# to $tmp/out, stderr to $tmp/err; sets $rc.
run() {
  [ -f "$tmp/in" ] || : >"$tmp/in"
  "$FUSELAB" "$@" <"$tmp/in" >"$tmp/out" 2>"$tmp/err"
  rc=$?
  rm -f "$tmp/in"
}

# has FILE TEXT: FILE holds TEXT (a fixed string); says what it held if not.
has() {
  grep -F -q -e "$2" "$1" && return 0
  echo "expected '$2' in $(basename "$1"):"
  cat "$1"
  return 1
}

status() {
  [ "$rc" -eq "$1" ] && return 0
  echo "exit status $rc, expected $1"
  echo "stderr:"; cat "$tmp/err"
  return 1
}

t_version() {
  want=$(sed -n 's/^AC_INIT(\[fuselab\], *\[\([^]]*\)\].*/\1/p' "$SRC/configure.ac")
  run --version && status 0 && has "$tmp/out" "fuselab $want" &&
    [ "$(wc -l <"$tmp/out")" -eq 1 ]
}

t_help() {
  run --help && status 0 && has "$tmp/out" "usage: fuselab" &&
    has "$tmp/out" "-e code" && has "$tmp/out" "fuselab/history" &&
    has "$tmp/out" "NO_COLOR"
}

t_badopt() {
  run --frobnicate; status 2 && has "$tmp/err" "unknown option '--frobnicate'"
}

t_e() {
  run -e 'print(1+1)' -e 'print(fl ~= nil, nn == fl.nn, require("fuselab") == fl)' &&
    status 0 && has "$tmp/out" "2" && has "$tmp/out" "true	true	true"
}

t_e_error() {
  run -e 'local function f() error("boom") end f()'
  status 1 && has "$tmp/err" "boom" && has "$tmp/err" "stack traceback:" &&
    has "$tmp/err" "in local 'f'"
}

t_script_args() {
  cat >"$tmp/s.lua" <<'EOF'
print(select("#", ...), ...)
print(arg[0]:match("s%.lua$") ~= nil, arg[1], arg[2], arg[-1] ~= nil)
EOF
  run "$tmp/s.lua" one "two words" && status 0 &&
    has "$tmp/out" "2	one	two words" && has "$tmp/out" "true	one	two words	true"
}

t_script_error() {
  printf 'local x = 1\nlocal function bad() error("script failed") end\nbad()\n' >"$tmp/e.lua"
  run "$tmp/e.lua"
  status 1 && has "$tmp/err" "fuselab: $tmp/e.lua:2: script failed" &&
    has "$tmp/err" "stack traceback:"
}

# an error inside a compiled function: one traceback, from the function's
# own frame to the script's, none of fuselab's tracing in between
t_compiled_error() {
  printf 'local cf = fl.compile(function(x) return x * 2 end)\ncf("bad")\n' >"$tmp/c.lua"
  run "$tmp/c.lua"
  status 1 && has "$tmp/err" "attempt to mul a 'string' with a 'number'" &&
    has "$tmp/err" "in metamethod 'mul'" && has "$tmp/err" "c.lua:2: in main chunk" &&
    [ "$(grep -c 'stack traceback:' "$tmp/err")" = 1 ] && ! grep -q 'compile.lua' "$tmp/err" ||
    { cat "$tmp/err"; return 1; }
}

t_script_missing() {
  run "$tmp/no-such-file.lua"
  status 1 && has "$tmp/err" "cannot open"
}

t_pipe() {
  printf 'local a = 20\nprint(a + 22)\n' >"$tmp/in"
  run && status 0 && has "$tmp/out" "42" || return 1
  if grep -q -e 'fl> ' -e '\.\.> ' "$tmp/out" "$tmp/err"; then
    echo "a prompt was printed for piped input"; return 1
  fi
}

t_pipe_error() {
  printf 'print("before")\nerror("piped")\nprint("after")\n' >"$tmp/in"
  run; status 1 && has "$tmp/out" "before" && has "$tmp/err" "piped" || return 1
  ! grep -q after "$tmp/out" || { echo "ran past the error"; return 1; }
}

t_dash() {
  printf 'print("from stdin", ...)\n' >"$tmp/in"
  run - x y && status 0 && has "$tmp/out" "from stdin	x	y"
}

t_dash_syntax() {
  printf 'print(1\n' >"$tmp/in"
  run -; status 1 && has "$tmp/err" "stdin:"
}

t_i_piped() {
  # -i with a pipe: line by line like the REPL, without prompts
  printf '1+1\nfunction f(a)\n  return a * 3\nend\nf(14)\nerror("oops")\n"still", "here";\n"still", "here"\n:frob\n{3, 4, n = "x", {5}}\n' >"$tmp/in"
  run -i && status 0 && has "$tmp/out" "2" && has "$tmp/out" "42" &&
    has "$tmp/out" '{3, 4, {5}, n = "x"}' &&
    has "$tmp/out" "still	here" && has "$tmp/err" "oops" &&
    has "$tmp/err" "unknown command ':frob'" || return 1
  [ "$(grep -c still "$tmp/out")" -eq 1 ] || { echo "; did not suppress"; return 1; }
  if grep -q -e 'fl> ' -e '\.\.> ' "$tmp/out"; then echo "prompt printed"; return 1; fi
}

t_i_escape() {
  # strings in a listed table (names read from files, say) show escaped:
  # a terminal never receives their control characters
  printf '{["\\27[31m"] = "a\\27]0;t\\7", "x\\ty"}\n' >"$tmp/in"
  run -i && status 0 && has "$tmp/out" '{"x\x09y", ["\x1b[31m"] = "a\x1b]0;t\x07"}' || return 1
  if grep -q "$(printf '\033')" "$tmp/out"; then echo "raw ESC printed"; return 1; fi
}

t_no_colour_pipe() {
  # not a terminal: never colour, even with an error
  printf 'error("x")\n' >"$tmp/in"
  run -i
  if grep -q "$(printf '\033')" "$tmp/out" "$tmp/err"; then
    echo "escape codes written to a pipe"; return 1
  fi
}

t_help_every_name() {
  # every fl.* and nn.* name and every method of a tensor, compiled
  # function, graph, plan, program and module has an entry in doc/API.md
  # (compiled into the binary) that :help finds
  cat >"$tmp/names.lua" <<'EOF'
local seen = {}
local function add(s) if not s:match("[.:]_") and not seen[s] then seen[s] = true; print(":help " .. s) end end
local function keys(prefix, t) for k in pairs(t or {}) do if type(k) == "string" then add(prefix .. k) end end end
keys("fl.", fl); keys("nn.", nn)
local x = fl.ones(2, 2)
keys("x:", getmetatable(x).methods)
local cm = fl.compile(function(a) return a + 1 end); cm(x)
keys("cm:", getmetatable(cm).methods)
local g = fl.capture(function(a) return a + 1 end, x)
local p = g:fuse()
keys("g:", getmetatable(g).__index); keys("p:", getmetatable(p).__index)
keys("k:", getmetatable(p:codegen("cpu")).__index)
local mt = getmetatable(nn.Linear(2, 2))
while mt and type(mt.__index) == "table" do
  for k, v in pairs(mt.__index) do if type(v) == "function" then add("m:" .. k) end end
  mt = getmetatable(mt.__index)
end
EOF
  FUSELAB_CACHE_DIR=$tmp/cache "$FUSELAB" "$tmp/names.lua" >"$tmp/in" 2>"$tmp/err" || { cat "$tmp/err"; return 1; }
  [ "$(wc -l <"$tmp/in")" -gt 150 ] || { echo "only $(wc -l <"$tmp/in") names"; return 1; }
  cp "$tmp/in" "$tmp/asked"
  run -i && status 0 || return 1
  if grep -q "^no help on" "$tmp/out"; then grep "^no help on" "$tmp/out"; return 1; fi
  [ "$(grep -c 'doc/API.md:[0-9]' "$tmp/out")" -ge "$(wc -l <"$tmp/asked")" ] ||
    { echo "fewer entries than names asked"; return 1; }
}

# :load of a FIFO or a device: refused at once, naming the path and what
# it is (a read would block the REPL where Ctrl-C cannot reach it);
# under `timeout`, so a regression fails instead of hanging the suite
t_load_fifo() {
  mkfifo "$tmp/f.lua" || return 1
  printf ':load %s\n:load /dev/zero\nprint("after")\n' "$tmp/f.lua" >"$tmp/in"
  timeout 20 "$FUSELAB" -i <"$tmp/in" >"$tmp/out" 2>"$tmp/err"
  rc=$?
  rm -f "$tmp/f.lua"
  [ "$rc" -ne 124 ] || { echo "timed out: :load blocked"; return 1; }
  has "$tmp/err" "cannot open $tmp/f.lua: is a FIFO (named pipe), not a regular file" &&
    has "$tmp/err" "cannot open /dev/zero: is a character device, not a regular file" &&
    has "$tmp/out" "after"
}

# :load still reads what luaL_loadfile read: a '#!' first line skipped
# with line numbers kept, and a missing file named
t_load_file() {
  printf '#!/usr/bin/env fuselab\nloaded = 41\nerror("at line three")\n' >"$tmp/l.lua"
  printf ':load %s\nprint(loaded + 1)\n:load %s\n' "$tmp/l.lua" "$tmp/none.lua" >"$tmp/in"
  run -i && status 0 && has "$tmp/out" "42" && has "$tmp/err" "l.lua:3: at line three" &&
    has "$tmp/err" "cannot open $tmp/none.lua: No such file or directory"
}

# a misspelt method, field or global: the error ends with the nearest
# names of the receiver (else of fuselab's objects, or the globals), the
# names Tab completes; nothing is added when no name is close, or when the
# name is right and only its value nil
t_did_you_mean() {
  cat >"$tmp/in" <<'EOF'
g = fl.capture(function(x) return x:exp() end, fl.randn(3))
g:decompse()
nn.Linaer(2, 3)
fl.nn.Linaer.new()
fl.compil(print)
x = fl.randn(3)
x.shpe[1]
x:resahpe(3, 1)
m = nn.Linear(2, 3)
m:forwrd(x)
m.wieght + 1
cm = fl.compile(function(a) return a + 1 end)
cm:stat()
p = g:fuse()
p:codegn("cpu")
p:codegen("cpu"):rnu(x)
prnt(1)
x:decompse()
t = {}
t:frobnicate()
x.grad.data
EOF
  run -i && status 0 || return 1
  grep '^stdin:1: attempt' "$tmp/err" >"$tmp/said"
  cat >"$tmp/want" <<'EOF'
stdin:1: attempt to call a nil value (method 'decompse'); did you mean decompose?
stdin:1: attempt to call a nil value (field 'Linaer'); did you mean Linear?
stdin:1: attempt to index a nil value (field 'Linaer'); did you mean Linear?
stdin:1: attempt to call a nil value (field 'compil'); did you mean compile?
stdin:1: attempt to index a nil value (field 'shpe'); did you mean shape?
stdin:1: attempt to call a nil value (method 'resahpe'); did you mean reshape?
stdin:1: attempt to call a nil value (method 'forwrd'); did you mean forward?
stdin:1: attempt to perform arithmetic on a nil value (field 'wieght'); did you mean weight?
stdin:1: attempt to call a nil value (method 'stat'); did you mean stats?
stdin:1: attempt to call a nil value (method 'codegn'); did you mean codegen?
stdin:1: attempt to call a nil value (method 'rnu'); did you mean run?
stdin:1: attempt to call a nil value (global 'prnt'); did you mean print?
stdin:1: attempt to call a nil value (method 'decompse')
stdin:1: attempt to call a nil value (method 'frobnicate')
stdin:1: attempt to index a nil value (field 'grad')
EOF
  diff "$tmp/want" "$tmp/said"
}

# the same message handler serves scripts: the suggestion there too, the
# traceback after it
t_did_you_mean_script() {
  printf 'local g = fl.capture(function(x) return x:exp() end, fl.randn(3))\nlocal function f()\n  return g:optimise()\nend\nf()\n' >"$tmp/d.lua"
  run "$tmp/d.lua"
  status 1 &&
    has "$tmp/err" "d.lua:3: attempt to call a nil value (method 'optimise'); did you mean optimize?" &&
    has "$tmp/err" "stack traceback:" && has "$tmp/err" "in local 'f'"
}

# :load model.onnx says which global it bound and never replaces one
# silently: model, then model2 while model holds a value; `as NAME` names it
t_load_onnx_binds() {
  o=$SRC/tests/fuzz/corpus_onnx/mlp.onnx
  printf ':load %s\nm1 = model\n:load %s\nprint(model == m1, model2 ~= nil and model2 ~= m1)\n:load %s as net\nprint(net ~= nil)\n:load %s as net\n:load %s as end\n:load %s as x\n' \
    "$o" "$o" "$o" "$o" "$o" "$tmp/l.lua" >"$tmp/in"
  run -i && status 0 && has "$tmp/out" "bound to model" &&
    has "$tmp/out" "bound to model2: model already holds a value" &&
    has "$tmp/out" "true	true" && has "$tmp/out" "bound to net" &&
    has "$tmp/out" "bound to net, replacing the value it held" &&
    has "$tmp/err" "'end' is not a name a global can have" &&
    has "$tmp/err" "only a model (.onnx) is bound to a name" &&
    [ "$(grep -c '^model2* =$' "$tmp/out")" -eq 2 ] || { cat "$tmp/out"; return 1; }
}

check "--version prints the configured version" t_version
check "--help describes options, history file and NO_COLOR" t_help
check "an unknown option exits 2 with a message" t_badopt
check "-e runs code; fl, nn = fl.nn and require \"fuselab\" are set" t_e
check "-e error: traceback on stderr, exit 1" t_e_error
check "script with args: arg table and ..." t_script_args
check "script error: message, traceback, exit 1" t_script_error
check "error in a compiled function: one traceback, the user's frames" t_compiled_error
check "missing script: exit 1" t_script_missing
check "piped stdin runs as a script, no prompts" t_pipe
check "piped stdin error: exit 1, nothing after it runs" t_pipe_error
check "- reads the script from stdin, with args" t_dash
check "- with a syntax error exits 1" t_dash_syntax
check "-i with piped input: REPL semantics, tables spelt out, no prompts" t_i_piped
check "no colour codes written to pipes" t_no_colour_pipe
check "-i: control characters in listed strings are escaped" t_i_escape
check ":load of a FIFO or a device fails at once, naming what it is" t_load_fifo
check ":load skips a '#!' line, keeps line numbers, names a missing file" t_load_file
check ":help NAME finds every fl.*, nn.* name and every method" t_help_every_name
check "a misspelt method, field or global: 'did you mean' the nearest name" t_did_you_mean
check "a script's misspelt method gets the suggestion too" t_did_you_mean_script
check ":load model.onnx says which global it bound; model2 when model is taken" t_load_onnx_binds

# the terminal tests, numbered on from here
py=
for p in /usr/bin/python3 python3; do
  if "$p" -c 'import pexpect' >/dev/null 2>&1; then py=$p; break; fi
done
[ -n "$py" ] || py=$(command -v python3 || true)
if [ -n "$py" ]; then
  "$py" "$here/drive.py" $((n + 1)) >"$tmp/tap" 2>&1
  sed -n '/^\(not \)\{0,1\}ok /p; /^#/p' "$tmp/tap"
  # anything else (a crash in the driver itself) fails the run
  if grep -v -q -e '^ok ' -e '^not ok ' -e '^#' "$tmp/tap"; then
    n=$((n + $(grep -c -e '^ok ' -e '^not ok ' "$tmp/tap") + 1))
    echo "not ok $n - drive.py ran cleanly"
    grep -v -e '^ok ' -e '^not ok ' -e '^#' "$tmp/tap" | sed 's/^/# /'
  else
    n=$((n + $(grep -c -e '^ok ' -e '^not ok ' "$tmp/tap")))
  fi
else
  n=$((n + 1))
  echo "ok $n # SKIP python3 missing: terminal tests not run"
fi
echo "1..$n"
