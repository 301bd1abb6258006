#!/bin/sh
# onnx_turns.sh -- onnxruntime and fuselab binaries in turns, each call a
# fresh process, on the networks bench/onnx_models.py wrote.
#
#   VENV_PYTHON=/path/to/venv/bin/python sh bench/onnx_turns.sh DIR ROUNDS BIN... -- NAME...
#
# For each network and round: onnxruntime's median steady call (2 threads,
# 30 calls after 10 warm-up ones), then each fuselab binary's
# (bench/onnx_steady.lua), one process after the other, so that every
# binary meets the same minutes of a shared machine.  Prints one line per
# round: the medians in ms and onnxruntime's time over each binary's (> 1:
# fuselab faster).  OMP_NUM_THREADS is 2 for everyone.  STAT=min takes each
# process's fastest call instead of its median: on a host whose speed moves
# by a third within seconds (other guests), the fastest call is the one
# least disturbed, for every contestant alike.  CALLS (default 30) is how
# many calls each fuselab process times (bench/onnx_segments.py's stages
# want 100).
set -e
here=$(dirname "$0")
dir=$1; rounds=$2; shift 2
bins=""
while [ $# -gt 0 ] && [ "$1" != "--" ]; do bins="$bins $1"; shift; done
[ "$1" = "--" ] && shift
if [ -z "$dir" ] || [ -z "$rounds" ] || [ -z "$bins" ] || [ $# -eq 0 ] || [ -z "$VENV_PYTHON" ]; then
  echo "usage: VENV_PYTHON=python sh bench/onnx_turns.sh DIR ROUNDS BIN... -- NAME..." >&2
  exit 2
fi
export OMP_NUM_THREADS=2
for name in "$@"; do
  r=0
  while [ $r -lt "$rounds" ]; do
    r=$((r + 1))
    ort=$("$VENV_PYTHON" - "$dir/$name" <<'PY'
import sys, time, glob, numpy as np, onnxruntime as ort
d = sys.argv[1]
so = ort.SessionOptions(); so.intra_op_num_threads = 2
s = ort.InferenceSession(d + "/model.onnx", so, providers=["CPUExecutionProvider"])
feed = {i.name: np.load("%s/input_%d.npy" % (d, k)) for k, i in enumerate(s.get_inputs())}
for _ in range(10): s.run(None, feed)
ts = []
for _ in range(30):
    t = time.perf_counter(); s.run(None, feed); ts.append(time.perf_counter() - t)
ts.sort(); print("%.3f %.3f" % (ts[14] * 1e3, ts[0] * 1e3))
PY
)
    if [ "${STAT:-median}" = min ]; then ort=${ort#* }; col=3; else ort=${ort% *}; col=2; fi
    line=$(printf "%-28s ort %8s" "$name" "$ort")
    for b in $bins; do
      ms=$("$b" "$here/onnx_steady.lua" "$dir" "$name" "${CALLS:-30}" | awk -v c="$col" '{print $c}')
      line="$line $(printf "  %s %8s (%.2f)" "$(basename "$(dirname "$(dirname "$b")")")" "$ms" "$(echo "$ort $ms" | awk '{print $1 / $2}')")"
    done
    echo "$line"
  done
done
