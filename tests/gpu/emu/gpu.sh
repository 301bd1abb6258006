#!/bin/sh
# gpu.sh -- tests/gpu/test_gpu (the GPU differential test) on the CUDA
# emulator, on fewer random graphs than on a GPU: FUSELAB_EMU_GRAPHS,
# default 40 (5 in the sanitized build).  TAP, test_gpu's own lines.
#
# Known fuselab failures are marked TODO (an expected failure): one line
# each below, "description prefix|the failure".  A line that starts to
# pass shows as an unexpected pass, which fails the suite: remove it then.
KNOWN=''

: "${FUSELAB:?FUSELAB must name the fuselab binary}"
b=$(dirname "$FUSELAB")
if [ "${FUSELAB_ASAN:-0}" = 1 ]; then graphs=${FUSELAB_EMU_GRAPHS:-5}; else graphs=${FUSELAB_EMU_GRAPHS:-40}; fi
FUSELAB_GPU_GRAPHS=$graphs "$b/tests/gpu/emu/run" "$b/tests/gpu/test_gpu" 2>&1 |
  awk -v known="$KNOWN" '
    BEGIN { n = split(known, k, "\n") }
    /^(not )?ok / {
      d = $0; sub(/^(not )?ok [0-9]+ - /, "", d)
      for (i = 1; i <= n; i++) {
        split(k[i], f, "|")
        if (index(d, f[1]) == 1) { $0 = $0 " # TODO known fuselab failure: " f[2]; break }
      }
    }
    { print }'
