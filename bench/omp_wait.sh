#!/bin/sh
# bench/omp_wait.sh -- bench/omp_wait.lua under each OpenMP wait policy,
# first on the machine as it is, then with other processes keeping
# LOAD cores busy (default 1.5: N processes each busy 75 % of every 10 ms).
#   bench/omp_wait.sh [path/to/fuselab] [LOAD]
set -eu
fl=${1:-build/fuselab}
load=${2:-1.5}
here=$(dirname "$0")
policies="OMP_WAIT_POLICY=passive GOMP_SPINCOUNT=10000 OMP_WAIT_POLICY=active fuselab"
run() {
  for p in $policies; do
    if [ "$p" = fuselab ]; then   # the program chooses
      env -u OMP_WAIT_POLICY -u GOMP_SPINCOUNT "$fl" "$here/omp_wait.lua"
    else
      env -u OMP_WAIT_POLICY -u GOMP_SPINCOUNT "$p" "$fl" "$here/omp_wait.lua"
    fi
  done
}
echo "== idle"
run
echo "== $load cores kept busy by other processes"
n=$(python3 -c "import math; print(math.ceil($load / 0.75))")
pids=""
for _ in $(seq "$n"); do
  python3 -c "
import time
duty = $load / $n
while True:
    t = time.perf_counter()
    while time.perf_counter() - t < 0.01 * duty: pass
    time.sleep(0.01 * (1 - duty))
" &
  pids="$pids $!"
done
trap 'kill $pids 2>/dev/null' EXIT
sleep 1
run
