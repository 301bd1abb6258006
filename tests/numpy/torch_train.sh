#!/bin/sh
# torch_train.sh -- training against PyTorch: fl_train.lua trains an
# MLP, a CNN with BatchNorm2d in training mode and a 2-layer GPT with
# fuselab's losses and optimizers (SGD with momentum, with Nesterov and
# weight decay, Adam, AdamW, AdamW with amsgrad) and writes every loss,
# gradient and parameter; torch_train.py does the same in PyTorch from the
# same weights and compares (rtol 1e-4, atol 1e-6 of the magnitude), with
# cross_entropy's options and the lr schedulers.  Needs a Python with
# torch: $FUSELAB_TORCH_PYTHON, else python3; skips without one (CI needs
# no PyTorch).  TAP.
#
# Environment: FUSELAB      the fuselab binary (default: ./fuselab)
#              FUSELAB_SRC  source tree (default: two levels above this file)
src=${FUSELAB_SRC:-$(cd "$(dirname "$0")/../.." && pwd)}
fuselab=${FUSELAB:-./fuselab}
py=
for c in "${FUSELAB_TORCH_PYTHON:-}" python3; do
  [ -n "$c" ] || continue
  if "$c" -c 'import torch' >/dev/null 2>&1; then py=$c; break; fi
done
if [ -z "$py" ]; then
  echo "1..0 # SKIP no Python with torch (set FUSELAB_TORCH_PYTHON)"
  exit 0
fi
if [ ! -x "$fuselab" ]; then
  echo "Bail out! no fuselab binary at $fuselab (set FUSELAB)"
  exit 1
fi
work=$(mktemp -d "${TMPDIR:-/tmp}/fl_torch_train.XXXXXX") || { echo "Bail out! no temp dir"; exit 1; }
trap 'rm -rf "$work"' EXIT
trap 'exit 130' INT TERM
if ! "$fuselab" "$src/tests/numpy/fl_train.lua" "$work" > "$work/fl.out" 2>&1; then
  echo "Bail out! tests/numpy/fl_train.lua failed"
  sed -e 's/^/# /' "$work/fl.out" | tail -20
  exit 1
fi
ver=$("$py" -c 'import torch; print(torch.__version__)')
echo "# against torch $ver ($py)"
"$py" "$src/tests/numpy/torch_train.py" "$work"
