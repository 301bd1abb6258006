#!/bin/sh
# examples.sh -- the guided tour and every lesson run with the built
# fuselab, each in an empty folder; a test fails on a non-zero exit (a Lua
# error is one), on printing nothing, or on a hang (ten times its class
# budget: the tour 60 s, a lesson 30 s).  A run past its class budget but
# not hung passes with a note: a busy machine or the sanitizer build is
# slow, and a test must not fail for that (bench/ measures speed).  The tour's
# closing list must name every lesson file, and Makefile.am must install
# each.  Then :help lesson N must
# show each lesson's header, and the lessons may cite only files that ship.
# TAP, one line per run.
#
# Env: FUSELAB  the built binary; FUSELAB_SRC  the source tree.

: "${FUSELAB:?FUSELAB must name the fuselab binary}"
SRC=${FUSELAB_SRC:-$(cd "$(dirname "$0")/../.." && pwd)}
tmp=$(mktemp -d "${TMPDIR:-/tmp}/fl-examples.XXXXXX") || exit 1
trap 'rm -rf "$tmp"' EXIT
trap 'exit 1' INT TERM

lessons=$(ls "$SRC"/examples/lessons/[0-9][0-9]_*.lua 2>/dev/null)
nlessons=$(printf '%s\n' $lessons | grep -c .)
n=0
failed=0

now() { date +%s.%N; }

# run NAME BUDGET FILE [ARGS]: one TAP line for one script.
run() {
  name=$1 budget=$2 file=$3
  shift 3
  n=$((n + 1))
  dir=$tmp/run$n
  mkdir -p "$dir"
  t0=$(now)
  (cd "$dir" && exec timeout -k 5 $((budget * 10)) "$FUSELAB" "$file" "$@") >"$dir/out" 2>"$dir/err"
  rc=$?
  secs=$(awk -v a="$t0" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }')
  why=
  if [ $rc -eq 124 ] || [ $rc -eq 137 ]; then why="hung: over ten times its budget of $budget s"
  elif [ $rc -ne 0 ]; then why="exit status $rc"
  elif [ ! -s "$dir/out" ]; then why="printed nothing"
  fi
  if [ -z "$why" ]; then
    echo "ok $n - $name ($secs s of $budget s)"
    awk -v s="$secs" -v b="$budget" 'BEGIN { exit !(s > b) }' &&
      echo "# $name: $secs s, past its class budget of $budget s on this machine"
  else
    failed=$((failed + 1))
    echo "not ok $n - $name: $why ($secs s)"
    tail -n 20 "$dir/err" | sed 's/^/# /'
    tail -n 10 "$dir/out" | sed 's/^/# out: /'
  fi
}

run "tour" 60 "$SRC/examples/tour.lua" fuselab-tour
# the tour names its folder and writes the listings there
n=$((n + 1))
if [ -s "$tmp/run1/fuselab-tour/graph.txt" ] && [ -s "$tmp/run1/fuselab-tour/kernels.c" ] &&
   grep -q "written to fuselab-tour/" "$tmp/run1/out"; then
  echo "ok $n - the tour wrote its folder fuselab-tour/"
else
  failed=$((failed + 1))
  echo "not ok $n - the tour wrote its folder fuselab-tour/"
fi

# the tour ends with every lesson there is: a lesson added to the folder
# is listed without editing the tour
n=$((n + 1))
unlisted=
for f in $lessons; do
  grep -q -F "  $(basename "$f")" "$tmp/run1/out" || unlisted="$unlisted $(basename "$f")"
done
if [ -n "$lessons" ] && [ -z "$unlisted" ]; then
  echo "ok $n - the tour lists every lesson in examples/lessons"
else
  failed=$((failed + 1))
  echo "not ok $n - the tour lists every lesson in examples/lessons"
  echo "# not in the tour's list:$unlisted"
fi

# every lesson is installed (Makefile.am's lessons_DATA), so an installed
# fuselab's :help lesson N knows it too
n=$((n + 1))
uninstalled=
sed -n '/^lessons_DATA *=/,/[^\\]$/p' "$SRC/Makefile.am" >"$tmp/installed" 2>/dev/null
for f in $lessons; do
  grep -q "examples/lessons/$(basename "$f")" "$tmp/installed" ||
    uninstalled="$uninstalled $(basename "$f")"
done
if [ -f "$SRC/Makefile.am" ] && [ -z "$uninstalled" ]; then
  echo "ok $n - Makefile.am installs every lesson"
else
  failed=$((failed + 1))
  echo "not ok $n - Makefile.am installs every lesson"
  echo "# not in lessons_DATA:$uninstalled"
fi

for f in $lessons; do
  base=$(basename "$f" .lua)
  num=${base%%_*}
  run "lesson $num ($(echo "${base#*_}" | tr _ ' '))" 30 "$f"
done

# training on real data: exits non-zero below 95 % held-out accuracy
run "train_digits (autograd, cross-entropy, AdamW)" 10 "$SRC/examples/train_digits.lua"

# :help lesson N shows the header of lesson N
for f in $lessons; do
  base=$(basename "$f" .lua)
  num=${base%%_*}
  n=$((n + 1))
  out=$(printf ':help lesson %d\n' "$((1$num - 100))" | "$FUSELAB" -i 2>&1)
  if printf '%s\n' "$out" | grep -q "^Lesson $num: " &&
     printf '%s\n' "$out" | grep -q "Run it:  fuselab .*$base.lua"; then
    echo "ok $n - :help lesson $((1$num - 100)) shows lesson $num"
  else
    failed=$((failed + 1))
    echo "not ok $n - :help lesson $((1$num - 100)) shows lesson $num"
    printf '%s\n' "$out" | head -n 5 | sed 's/^/# /'
  fi
done

# the lessons cite only what ships: the doc/*.md files they name exist,
# and no lesson points at a file outside the project (a SEED.txt)
n=$((n + 1))
missing=
for doc in $(cat $lessons "$SRC/examples/tour.lua" | grep -o 'doc/[A-Za-z_]*\.md' | sort -u); do
  [ -f "$SRC/$doc" ] || missing="$missing $doc"
done
outside=$(grep -l 'SEED\.txt' $lessons "$SRC/examples/tour.lua" "$SRC"/scripting/*.lua 2>/dev/null)
if [ -z "$missing" ] && [ -z "$outside" ]; then
  echo "ok $n - the lessons cite only files that ship"
else
  failed=$((failed + 1))
  echo "not ok $n - the lessons cite only files that ship"
  [ -z "$missing" ] || echo "# cited, not in the tree:$missing"
  [ -z "$outside" ] || echo "# cite SEED.txt: $outside"
fi

if [ "$nlessons" -lt 7 ]; then
  n=$((n + 1))
  failed=$((failed + 1))
  echo "not ok $n - seven lessons in examples/lessons (found $nlessons)"
fi
echo "1..$n"
[ $failed -eq 0 ]
