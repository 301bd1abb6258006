#!/bin/sh
# numpy.sh -- every eager op compared with NumPy on random inputs, and
# NumPy reading what fl.save wrote.  gen.py (Debian's python3-numpy) writes
# inputs, expected outputs and a manifest into a temp dir; check.lua runs
# the cases with the fuselab binary; `gen.py verify` loads fuselab's saved
# files in NumPy.  TAP output; the tolerances are stated in gen.py.
#
# Environment: FUSELAB       the fuselab binary (default: ./fuselab)
#              FUSELAB_SRC   source tree (default: two levels above this file)
#              NUMPY_PYTHON  a Python with numpy (default: /usr/bin/python3,
#                            Debian's; another python3 on PATH may lack it)
#              NUMPY_KEEP    keep the work dir when set

src=${FUSELAB_SRC:-$(cd "$(dirname "$0")/../.." && pwd)}
fuselab=${FUSELAB:-./fuselab}
py=${NUMPY_PYTHON:-/usr/bin/python3}

if ! "$py" -c 'import numpy' >/dev/null 2>&1; then
  echo "1..0 # SKIP numpy not importable by $py"
  exit 0
fi
if [ ! -x "$fuselab" ]; then
  echo "Bail out! no fuselab binary at $fuselab (set FUSELAB)"
  exit 1
fi

work=$(mktemp -d "${TMPDIR:-/tmp}/fl_numpy.XXXXXX") || {
  echo "Bail out! cannot create a temp dir"
  exit 1
}
cleanup() { [ -n "$NUMPY_KEEP" ] || rm -rf "$work"; }
trap cleanup EXIT
trap 'exit 130' INT TERM

if ! "$py" "$src/tests/numpy/gen.py" "$work" 2>"$work/gen.err"; then
  sed 's/^/# /' "$work/gen.err"
  echo "Bail out! tests/numpy/gen.py failed"
  exit 1
fi
mkdir "$work/saved"

# Output goes through a file so a crash part-way is still counted.
"$fuselab" "$src/tests/numpy/check.lua" "$work" >"$work/check.out" 2>&1
rc=$?
cat "$work/check.out"
n=$(grep -cE '^(not )?ok ' "$work/check.out")
if [ "$rc" -ne 0 ] || [ ! -f "$work/ntests" ]; then
  n=$((n + 1))
  echo "not ok $n - check.lua ran to the end (exit status $rc)"
fi

"$py" "$src/tests/numpy/gen.py" verify "$work" "$n"
