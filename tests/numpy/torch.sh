#!/bin/sh
# torch.sh -- the NumPy definitions gen.py checks fuselab against (grouped,
# dilated, asymmetrically padded convolutions; pools with ceil_mode,
# count_include_pad, dilation) equal PyTorch's own conv2d, max_pool2d and
# avg_pool2d (rtol 1e-5, atol 1e-6) where a Python with torch and numpy is
# found: $FUSELAB_TORCH_PYTHON, else python3.
# Skips without one: CI needs no PyTorch.  TAP.
src=${FUSELAB_SRC:-$(cd "$(dirname "$0")/../.." && pwd)}
py=
for c in "${FUSELAB_TORCH_PYTHON:-}" python3; do
  [ -n "$c" ] || continue
  if "$c" -c 'import torch, numpy' >/dev/null 2>&1; then py=$c; break; fi
done
if [ -z "$py" ]; then
  echo "1..0 # SKIP no Python with torch and numpy (set FUSELAB_TORCH_PYTHON)"
  exit 0
fi
work=$(mktemp -d "${TMPDIR:-/tmp}/fl_torch.XXXXXX") || { echo "Bail out! no temp dir"; exit 1; }
trap 'rm -rf "$work"' EXIT
echo "1..1"
ver=$("$py" -c 'import torch; print(torch.__version__)')
if "$py" "$src/tests/numpy/gen.py" "$work" > "$work/out" 2> "$work/err" &&
   grep -q "cases equal PyTorch's" "$work/err"; then
  echo "ok 1 - $(grep "cases equal" "$work/err" | sed 's/^gen.py: //') (torch $ver)"
else
  echo "not ok 1 - NumPy's conv2d and pool definitions against PyTorch $ver"
  sed -e 's/^/# /' "$work/err" | tail -20
fi
