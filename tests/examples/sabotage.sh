#!/bin/sh
# sabotage.sh -- the accuracy checks can fail.  A compiler that gets one
# generated kernel wrong (the first sqrtf in a program's source made 1%
# larger) is put in $CC, with a private kernel cache, and:
#   - lesson 08 (ResNet-50 from ONNX) must print "MORE than 1e-4: a bug"
#     and exit non-zero;
#   - fl.checklist on a function with a square root must report the
#     difference on its accuracy line and recommend eager because of it;
#   - with the real compiler the same checklist passes (the control).
# Each run must also have sabotaged at least one kernel (the wrapper's log),
# so a run that never compiled cannot pass for a detected failure.  TAP.
#
# Env: FUSELAB  the built binary; FUSELAB_SRC  the source tree.

: "${FUSELAB:?FUSELAB must name the fuselab binary}"
SRC=${FUSELAB_SRC:-$(cd "$(dirname "$0")/../.." && pwd)}
tmp=$(mktemp -d "${TMPDIR:-/tmp}/fl-sabotage.XXXXXX") || exit 1
trap 'rm -rf "$tmp"' EXIT
trap 'exit 1' INT TERM
real_cc=${CC:-cc}

cat >"$tmp/cc" <<CC
#!/bin/sh
for a in "\$@"; do
  case \$a in
    *.c) if grep -q 'sqrtf(' "\$a"; then
           sed -i '0,/sqrtf(/s//1.01f * sqrtf(/' "\$a" && echo "sabotaged \$a" >>"$tmp/log"
         fi ;;
  esac
done
exec $real_cc "\$@"
CC
chmod +x "$tmp/cc"

n=0
check() { # check DESCRIPTION CONDITION...
  n=$((n + 1))
  what=$1; shift
  if "$@"; then echo "ok $n - $what"; else echo "not ok $n - $what"; fi
}

# run NAME CC SCRIPT [ARGS]: in its own folder and cache; output in NAME.out
run() {
  name=$1 cc=$2; shift 2
  mkdir -p "$tmp/$name"
  : >"$tmp/log"
  (cd "$tmp/$name" && CC=$cc FUSELAB_CACHE_DIR="$tmp/$name/cache" \
     timeout -k 5 600 "$FUSELAB" "$@") >"$tmp/$name.out" 2>&1
  echo $? >"$tmp/$name.rc"
  cp "$tmp/log" "$tmp/$name.log"
}

echo "1..8"

run lesson "$tmp/cc" "$SRC/examples/lessons/08_real_network_from_onnx.lua"
check "lesson 08 under a sabotaged kernel: at least one kernel was sabotaged" test -s "$tmp/lesson.log"
check "lesson 08 under a sabotaged kernel: its accuracy line says so" \
  grep -q "MORE than 1e-4: a bug" "$tmp/lesson.out"
check "lesson 08 under a sabotaged kernel: it exits non-zero" test "$(cat "$tmp/lesson.rc")" -ne 0

cat >"$tmp/checklist.lua" <<'LUA'
local fl = fl or require "fuselab"
fl.manual_seed(1)
local f = function(x) return (x * x + 1):sqrt() * 2 + x:relu() end
fl.checklist(f, {inputs = {fl.randn(64, 64)}})
LUA
run checklist "$tmp/cc" "$tmp/checklist.lua"
check "checklist under a sabotaged kernel: at least one kernel was sabotaged" test -s "$tmp/checklist.log"
check "checklist under a sabotaged kernel: the accuracy line shows an error of about 1%" \
  grep -Eq "accuracy vs eager +max abs err [0-9.e+-]+, max rel err (0\.0[0-9]|[0-9.]+e-0[23])" "$tmp/checklist.out"
check "checklist under a sabotaged kernel: it recommends eager because results differ" \
  grep -q "recommendation: eager: compiled results differ from eager" "$tmp/checklist.out"

run control "$real_cc" "$tmp/checklist.lua"
check "checklist with the real compiler: no kernel sabotaged, it exits 0" \
  sh -c "test ! -s '$tmp/control.log' && test \"\$(cat '$tmp/control.rc')\" -eq 0"
check "checklist with the real compiler: accuracy within 1e-6 and no 'differ'" \
  sh -c "grep -Eq 'max rel err ([0-9.]+e-(0[7-9]|[1-9][0-9])|0)(,|\$| )' '$tmp/control.out' && ! grep -q 'results differ' '$tmp/control.out'"

[ -n "${VERBOSE:-}" ] && for f in lesson checklist control; do sed "s/^/# $f: /" "$tmp/$f.out"; done
exit 0
