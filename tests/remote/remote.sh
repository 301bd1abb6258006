#!/bin/sh
# remote.sh -- the shared compile cache against a real Redis (redis-server,
# started here on 127.0.0.1 at a free port, no persistence).  Each "machine"
# is a fuselab process running worker.lua with a fresh, empty local cache
# directory; TAP.  Skipped when redis-server is not installed or fuselab was
# built without hiredis.  Times are reported, and asserted only against a
# generous bound (10 s) that tells "bounded" from "hung".
#
# Env: FUSELAB  the built binary; FUSELAB_SRC  the source tree.

: "${FUSELAB:?FUSELAB must name the fuselab binary}"
SRC=${FUSELAB_SRC:-$(cd "$(dirname "$0")/../.." && pwd)}
WORKER=$SRC/tests/remote/worker.lua

if ! command -v redis-server >/dev/null 2>&1 || ! command -v redis-cli >/dev/null 2>&1; then
  echo "1..0 # SKIP redis-server is not installed (Debian redis-server)"
  exit 0
fi
why=$(FUSELAB_REMOTE_CACHE=redis://127.0.0.1:1 FUSELAB_CACHE_DIR=$(mktemp -d) \
  "$FUSELAB" -e 'print(fl.cache_info().remote.why or "")' 2>/dev/null)
case $why in
  *"without hiredis"*) echo "1..0 # SKIP fuselab was built without hiredis"; exit 0 ;;
esac

tmp=$(mktemp -d "${TMPDIR:-/tmp}/fl-remote.XXXXXX") || exit 1
: >"$tmp/allerr"
rpid=
stop_redis() {
  if [ -n "$rpid" ]; then kill -CONT "$rpid" 2>/dev/null; kill -9 "$rpid" 2>/dev/null; wait "$rpid" 2>/dev/null; fi
  rpid=
}
trap 'stop_redis; rm -rf "$tmp"' EXIT
trap 'exit 1' INT TERM

# redis-server on $port in the background; 0 when it answers PING
start_redis() {
  redis-server --port "$port" --bind 127.0.0.1 --save '' --appendonly no --daemonize no \
    --dir "$tmp" >"$tmp/redis.log" 2>&1 &
  rpid=$!
  i=0
  while [ $i -lt 50 ]; do
    [ "$(redis-cli -p "$port" ping 2>/dev/null)" = PONG ] && return 0
    kill -0 "$rpid" 2>/dev/null || break
    sleep 0.1
    i=$((i + 1))
  done
  stop_redis
  return 1
}
port=$((20000 + $$ % 20000))
tries=0
until start_redis; do
  tries=$((tries + 1))
  if [ $tries -ge 20 ]; then echo "1..0 # SKIP no free port for redis-server"; exit 0; fi
  port=$((port + 97))
done
rcli() { redis-cli -p "$port" "$@"; }

export FUSELAB_REMOTE_CACHE=redis://127.0.0.1:$port FUSELAB_REMOTE_CACHE_SECRET=team-secret-1
unset FUSELAB_REMOTE_CACHE_SECRET_FILE FUSELAB_REMOTE_CACHE_TTL FUSELAB_REMOTE_CACHE_MAX_MB FUSELAB_DEBUG

n=0
ok() { n=$((n + 1)); echo "ok $n - $1"; }
not_ok() { n=$((n + 1)); echo "not ok $n - $1"; }
check() { # check DESCRIPTION CONDITION...
  d=$1; shift
  if "$@"; then ok "$d"; else not_ok "$d"; echo "# result: $res"; echo "# stderr:"; sed 's/^/#   /' "$tmp/err"; fi
}

# machine NAME [env assignments...]: one worker in a fresh cache directory;
# $res is its RESULT line, $tmp/err its stderr, $secs its wall time
machine() {
  name=$1; shift
  rm -rf "$tmp/$name"
  t0=$(date +%s%N)
  res=$(env FUSELAB_CACHE_DIR="$tmp/$name" "$@" "$FUSELAB" "$WORKER" 2>"$tmp/err" | grep '^RESULT')
  t1=$(date +%s%N)
  cat "$tmp/err" >>"$tmp/allerr"
  secs=$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.2f", (b - a) / 1e9 }')
}
field() { echo "$res" | tr ' ' '\n' | sed -n "s/^$1=//p"; }
is() { [ "$(field "$1")" = "$2" ]; }
warnings() { grep -c 'warning: remote cache' "$tmp/err"; }
under10() { awk -v s="$secs" 'BEGIN { exit !(s < 10) }'; }

# machine A compiles and writes; B, with an empty local cache, compiles nothing
machine A
kernels=$(field misses)
check "machine A compiles its $kernels kernels cold and writes them" \
  sh -c "[ '$kernels' -ge 3 ] && [ '$(field writes)' = '$kernels' ] && [ '$(field ok)' = true ] && [ '$(warnings)' = 0 ]"
machine B
check "machine B (empty local cache) gets all $kernels from Redis and compiles nothing" \
  sh -c "[ '$(field misses)' = 0 ] && [ '$(field rhits)' = '$kernels' ] && [ '$(field stats_remote)' = '$kernels' ] && [ '$(field ok)' = true ]"
check "B's entries are on its local disk now (a rerun hits disk)" \
  sh -c "env FUSELAB_CACHE_DIR='$tmp/B' '$FUSELAB' '$WORKER' 2>/dev/null | grep -q 'misses=0 disk=$kernels'"

# tampering: one value with bytes appended, one with a byte changed
set -- $(rcli --scan --pattern 'fuselab:*')
rcli APPEND "$1" "xx" >/dev/null
rcli SETRANGE "$2" 200 "Z" >/dev/null
machine C
check "an extended and an altered entry are rejected and rebuilt, with correct results" \
  sh -c "[ '$(field rejected)' = 2 ] && [ '$(field misses)' = 2 ] && [ '$(field rhits)' = $((kernels - 2)) ] && [ '$(field ok)' = true ]"
check "... warned about once" [ "$(warnings)" = 1 ]
machine D
check "the rebuilt entries replaced the bad ones (the next machine hits all)" \
  sh -c "[ '$(field rhits)' = '$kernels' ] && [ '$(field rejected)' = 0 ]"

# another team's secret
machine E FUSELAB_REMOTE_CACHE_SECRET=another-secret
check "entries signed with another secret are rejected and rebuilt, correctly" \
  sh -c "[ '$(field rejected)' = '$kernels' ] && [ '$(field misses)' = '$kernels' ] && [ '$(field ok)' = true ] && [ '$(warnings)' = 1 ]"
machine F
check "... and the first team's machines reject E's entries in turn" \
  sh -c "[ '$(field rejected)' = '$kernels' ] && [ '$(field writes)' = '$kernels' ] && [ '$(field ok)' = true ]"

# an entry larger than the reader's cap
machine G FUSELAB_REMOTE_CACHE_MAX_MB=0.001
check "entries over FUSELAB_REMOTE_CACHE_MAX_MB are rejected, rebuilt, not written" \
  sh -c "[ '$(field rejected)' = '$kernels' ] && [ '$(field misses)' = '$kernels' ] && [ '$(field writes)' = 0 ] && [ '$(field ok)' = true ] && [ '$(warnings)' = 1 ]"

# the secret file must be the user's, mode 0600 or stricter (mode bits
# are checked, not access(): root passes access() on any file)
printf 'team-secret-1\n' >"$tmp/secret"
chmod 0644 "$tmp/secret"
machine H FUSELAB_REMOTE_CACHE_SECRET= FUSELAB_REMOTE_CACHE_SECRET_FILE="$tmp/secret"
check "a secret file of mode 0644 is refused: remote off, one warning, compiles work" \
  sh -c "[ '$(field enabled)' = false ] && [ '$(field misses)' = '$kernels' ] && [ '$(field ok)' = true ] && [ '$(warnings)' = 1 ] && grep -q 0600 '$tmp/err'"
chmod 0600 "$tmp/secret"
machine I FUSELAB_REMOTE_CACHE_SECRET= FUSELAB_REMOTE_CACHE_SECRET_FILE="$tmp/secret"
check "the same file at mode 0600 is used (a trailing newline is not part of the secret)" \
  sh -c "[ '$(field rhits)' = '$kernels' ] && [ '$(field rejected)' = 0 ]"
if [ "$(id -u)" = 0 ] && id nobody >/dev/null 2>&1; then
  chown nobody "$tmp/secret"
  machine J FUSELAB_REMOTE_CACHE_SECRET= FUSELAB_REMOTE_CACHE_SECRET_FILE="$tmp/secret"
  check "a secret file owned by someone else is refused, also for root" \
    sh -c "[ '$(field enabled)' = false ] && [ '$(field ok)' = true ] && [ '$(warnings)' = 1 ]"
else
  ok "# SKIP the foreign-owner case needs root to chown the file"
fi
machine K FUSELAB_REMOTE_CACHE_SECRET=
check "no secret at all: remote off with one warning, compiles work" \
  sh -c "[ '$(field enabled)' = false ] && [ '$(field misses)' = '$kernels' ] && [ '$(field ok)' = true ] && [ '$(warnings)' = 1 ]"

# a Redis password in the URL: used for AUTH, never shown
rcli CONFIG SET requirepass 'pw-hidden-1' >/dev/null
machine L FUSELAB_REMOTE_CACHE="redis://:pw-hidden-1@127.0.0.1:$port/0"
check "redis://:password@host:port authenticates (the entries are read)" \
  sh -c "[ '$(field rhits)' = '$kernels' ] && [ '$(field errors)' = 0 ] && [ '$(field ok)' = true ]"
machine M FUSELAB_REMOTE_CACHE="redis://:pw-wrong-2@127.0.0.1:$port"
check "a wrong password: one warning, local only, and the password is not printed" \
  sh -c "[ '$(field errors)' = 1 ] && [ '$(warnings)' = 1 ] && [ '$(field ok)' = true ] && ! grep -q pw-wrong '$tmp/err'"
redis-cli -p "$port" -a 'pw-hidden-1' --no-auth-warning CONFIG SET requirepass '' >/dev/null

# two machines writing the same keys at once, then a third reading
rcli FLUSHALL >/dev/null
rm -rf "$tmp/P" "$tmp/Q"
env FUSELAB_CACHE_DIR="$tmp/P" "$FUSELAB" "$WORKER" >"$tmp/P.out" 2>&1 &
p1=$!
env FUSELAB_CACHE_DIR="$tmp/Q" "$FUSELAB" "$WORKER" >"$tmp/Q.out" 2>&1 &
p2=$!
wait $p1; wait $p2
check "two machines compiling and writing the same keys at once are both correct" \
  sh -c "grep -q 'RESULT ok=true' '$tmp/P.out' && grep -q 'RESULT ok=true' '$tmp/Q.out' && ! grep -q warning '$tmp/P.out' '$tmp/Q.out'"
machine R
check "... and a third machine reads valid entries for every kernel" \
  sh -c "[ '$(field rhits)' = '$kernels' ] && [ '$(field rejected)' = 0 ] && [ '$(field misses)' = 0 ] && [ '$(field ok)' = true ]"

# NVRTC images (cuda backend) travel the same way, on a GPU or the emulator
emu="$(dirname "$FUSELAB")/tests/gpu/emu/run"
if [ -x "$emu" ] && "$emu" "$FUSELAB" -e 'os.exit(fl.cuda_available() and 0 or 1)' >/dev/null 2>&1; then
  rcli FLUSHALL >/dev/null
  machine GA WORKER_BACKEND=cuda "$emu"
  check "cuda: machine A compiles its NVRTC images and writes them" \
    sh -c "[ '$(field writes)' = 3 ] && [ '$(field rhits)' = 0 ] && [ '$(field ok)' = true ]"
  machine GB WORKER_BACKEND=cuda "$emu"
  check "cuda: machine B gets all 3 images from Redis (how = \"remote\")" \
    sh -c "[ '$(field rhits)' = 3 ] && [ '$(field stats_remote)' = 3 ] && [ '$(field writes)' = 0 ] && [ '$(field ok)' = true ]"
  set -- $(rcli --scan --pattern 'fuselab:*.cubin')
  rcli APPEND "$1" "xx" >/dev/null
  machine GC WORKER_BACKEND=cuda "$emu"
  check "cuda: an extended image is rejected and rebuilt" \
    sh -c "[ '$(field rejected)' = 1 ] && [ '$(field rhits)' = 2 ] && [ '$(field ok)' = true ] && [ '$(warnings)' = 1 ]"
else
  ok "# SKIP cuda: neither a GPU nor the CUDA emulator in this build"
fi

# Redis full: every write refused with OOM
rcli FLUSHALL >/dev/null
rcli CONFIG SET maxmemory 1 >/dev/null
machine O
rcli CONFIG SET maxmemory 0 >/dev/null
check "Redis full (OOM on SET): compiles work, one warning naming OOM, local only after it" \
  sh -c "[ '$(field ok)' = true ] && [ '$(field errors)' = 1 ] && [ '$(field writes)' = 0 ] && [ '$(warnings)' = 1 ] && grep -q OOM '$tmp/err'"

# Redis stopped (SIGSTOP: it accepts connections, answers nothing)
kill -STOP "$rpid"
machine S
kill -CONT "$rpid"
echo "# Redis not answering: the run took $secs s (command timeout 2 s)"
check "Redis not answering: compiles work, one warning, bounded time ($secs s)" \
  sh -c "[ '$(field ok)' = true ] && [ '$(field errors)' = 1 ] && [ '$(warnings)' = 1 ] && [ '$(field misses)' = '$kernels' ]"
check "... under 10 s: it never hangs" under10

# Redis killed mid-run (after the first kernel)
rcli FLUSHALL >/dev/null
machine T WORKER_KILL="$rpid"
wait "$rpid" 2>/dev/null
rpid=
echo "# Redis killed mid-run: the run took $secs s"
check "Redis killed mid-run: compiles work, exactly one warning" \
  sh -c "[ '$(field ok)' = true ] && [ '$(field errors)' = 1 ] && [ '$(warnings)' = 1 ] && [ '$(field misses)' = '$kernels' ]"
check "... under 10 s: it never hangs" under10

# a Redis that never started (nothing listens on the port)
machine U
echo "# Redis never started: the run took $secs s (connect timeout 0.2 s)"
check "Redis never started: compiles work, exactly one warning" \
  sh -c "[ '$(field ok)' = true ] && [ '$(field errors)' = 1 ] && [ '$(warnings)' = 1 ] && [ '$(field enabled)' = false ]"
check "... under 10 s: it never hangs" under10

cat "$tmp/P.out" "$tmp/Q.out" >>"$tmp/allerr"
if grep -q 'Sanitizer\|runtime error' "$tmp/allerr"; then
  not_ok "no sanitizer reports"; sed 's/^/#   /' "$tmp/allerr"
else
  ok "no sanitizer reports"
fi

echo "1..$n"
