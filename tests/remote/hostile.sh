#!/bin/sh
# hostile.sh -- the shared compile cache against a server that speaks
# Redis's protocol and abuses it (fake_redis.py, on 127.0.0.1 only, gone
# by itself within a minute): a reply trickled a byte at a time must not
# hold a command past its 2 s in all; a reply larger than
# FUSELAB_REMOTE_CACHE_MAX_MB must not be received (the process must not
# grow by it); what the server says must reach the terminal escaped.
# Each case is one fuselab process compiling one function with a fresh
# local cache; compiles must work through all of it.  TAP.  Skipped when
# Python 3 is missing or fuselab was built without hiredis.
#
# Env: FUSELAB  the built binary; FUSELAB_SRC  the source tree.

: "${FUSELAB:?FUSELAB must name the fuselab binary}"
SRC=${FUSELAB_SRC:-$(cd "$(dirname "$0")/../.." && pwd)}
SERVER=$SRC/tests/remote/fake_redis.py

py=$(command -v python3 || true)
if [ -z "$py" ]; then echo "1..0 # SKIP python3 is not installed"; exit 0; fi
why=$(FUSELAB_REMOTE_CACHE=redis://127.0.0.1:1 FUSELAB_CACHE_DIR=$(mktemp -d) \
  "$FUSELAB" -e 'print(fl.cache_info().remote.why or "")' 2>/dev/null)
case $why in
  *"without hiredis"*) echo "1..0 # SKIP fuselab was built without hiredis"; exit 0 ;;
esac

tmp=$(mktemp -d "${TMPDIR:-/tmp}/fl-hostile.XXXXXX") || exit 1
: >"$tmp/allerr"
spid=
stop_server() {
  if [ -n "$spid" ]; then kill "$spid" 2>/dev/null; wait "$spid" 2>/dev/null; fi
  spid=
}
trap 'stop_server; rm -rf "$tmp"' EXIT
trap 'exit 1' INT TERM

# start MODE: fake_redis.py in MODE; $port once it listens
start() {
  stop_server
  rm -f "$tmp/port"
  "$py" "$SERVER" "$1" "$tmp/port" 60 2>"$tmp/server.err" &
  spid=$!
  i=0
  while [ ! -s "$tmp/port" ] && [ $i -lt 100 ]; do sleep 0.05; i=$((i + 1)); done
  port=$(cat "$tmp/port" 2>/dev/null)
}

export FUSELAB_REMOTE_CACHE_SECRET=team-secret-1
unset FUSELAB_REMOTE_CACHE_SECRET_FILE FUSELAB_REMOTE_CACHE_TTL FUSELAB_REMOTE_CACHE_MAX_MB FUSELAB_DEBUG

n=0
ok() { n=$((n + 1)); echo "ok $n - $1"; }
not_ok() { n=$((n + 1)); echo "not ok $n - $1"; }
check() { # check DESCRIPTION CONDITION...
  d=$1; shift
  if "$@"; then ok "$d"; else not_ok "$d"; echo "# result: $res ($secs s)"; echo "# stderr:"; sed 's/^/#   /' "$tmp/err"; fi
}

# one compiled function, checked against eager; the peak resident size
CODE='local f = fl.compile(function(x) return (x * 2 + 1):relu() end)
local x = fl.randn(8, 16)
local ok = fl.allclose(f(x), (x * 2 + 1):relu())
local r = fl.cache_info().remote or {}
local hwm = 0
for l in io.lines("/proc/self/status") do hwm = tonumber(l:match("^VmHWM:%s*(%d+)")) or hwm end
print(("RESULT ok=%s writes=%d rhits=%d errors=%d hwm_mb=%d"):format(tostring(ok),
  r.writes or -1, r.hits or -1, r.errors or -1, hwm // 1024))'

# machine NAME [env assignments...]: $res its RESULT line, $tmp/err its
# stderr, $secs its wall time
machine() {
  name=$1; shift
  rm -rf "$tmp/$name"
  t0=$(date +%s%N)
  res=$(env FUSELAB_CACHE_DIR="$tmp/$name" FUSELAB_REMOTE_CACHE="redis://127.0.0.1:$port" "$@" \
    timeout 30 "$FUSELAB" -e "$CODE" 2>"$tmp/err" | grep '^RESULT')
  t1=$(date +%s%N)
  cat "$tmp/err" >>"$tmp/allerr"
  secs=$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.2f", (b - a) / 1e9 }')
}
field() { echo "$res" | tr ' ' '\n' | sed -n "s/^$1=//p"; }
is() { [ "$(field "$1")" = "$2" ]; }
warned() { [ "$(grep -c 'warning: remote cache' "$tmp/err")" = 1 ] && grep -q -F -e "$1" "$tmp/err"; }
under() { awk -v s="$secs" -v m="$1" 'BEGIN { exit !(s < m) }'; }
# the peak resident size at most $1 MB above the honest run's
grew_under() { [ "$(field hwm_mb)" -le $((base_mb + $1)) ]; }
clean_text() { ! LC_ALL=C grep -q "$(printf '[\033\007\233]')" "$tmp/err"; }

# an honest server: the protocol as written here works both ways
start honest
machine A
check "honest server: machine A compiles and writes its entry" \
  sh -c "[ '$(field ok)' = true ] && [ '$(field writes)' = 1 ] && [ '$(field errors)' = 0 ] && ! grep -q warning '$tmp/err'"
base_mb=$(field hwm_mb)
machine B
check "honest server: machine B gets it from there" \
  sh -c "[ '$(field ok)' = true ] && [ '$(field rhits)' = 1 ] && [ '$(field errors)' = 0 ]"
: "${base_mb:=0}"

# the numbers that tune it are read strictly: a bad one is warned about,
# naming the variable and value, and the default used
machine A2 FUSELAB_REMOTE_CACHE_MAX_MB=lots FUSELAB_REMOTE_CACHE_TTL=1.5
check "FUSELAB_REMOTE_CACHE_MAX_MB=lots and _TTL=1.5: a warning for each, the defaults used" \
  sh -c "[ '$(field ok)' = true ] && [ '$(field rhits)' = 1 ] && [ '$(field errors)' = 0 ] &&
    grep -q -F 'FUSELAB_REMOTE_CACHE_MAX_MB=\"lots\" is not a number of megabytes above 0; using 64 megabytes' '$tmp/err' &&
    grep -q -F 'FUSELAB_REMOTE_CACHE_TTL=\"1.5\" is not a whole number of seconds above 0; using 2592000 seconds' '$tmp/err'"
machine A3 FUSELAB_REMOTE_CACHE_MAX_MB=4096
check "FUSELAB_REMOTE_CACHE_MAX_MB=4096: Redis's 512 MB used, with a warning" \
  sh -c "[ '$(field ok)' = true ] && [ '$(field rhits)' = 1 ] &&
    grep -q -F 'FUSELAB_REMOTE_CACHE_MAX_MB=\"4096\" is more than the most it can be; using 512 megabytes' '$tmp/err'"

# a reply trickled a byte every 0.5 s: each read would come in time, the
# command as a whole must not (it used to take the 16 s the server chose)
start trickle
machine C
echo "# trickled reply: the run took $secs s (one deadline of 2 s per command)"
check "trickled reply: compiles work, one warning, the command gave up at its deadline" \
  sh -c "[ '$(field ok)' = true ] && [ '$(field errors)' = 1 ]"
check "... warned as a late answer" warned "no complete answer within 2 s"
check "... in bounded time ($secs s < 6 s)" under 6

# a reply larger than the cap: not received (the process used to grow by
# it, 300 MB here)
start huge
machine D FUSELAB_REMOTE_CACHE_MAX_MB=1
echo "# 300 MB reply: peak resident $(field hwm_mb) MB, honest run $base_mb MB"
check "300 MB bulk reply, cap 1 MB: compiles work, one warning naming the size" \
  sh -c "[ '$(field ok)' = true ] && [ '$(field errors)' = 1 ] && grep -q 'a reply of 314572800 bytes, more than' '$tmp/err'"
check "... the process did not grow by it (peak $(field hwm_mb) MB, honest $base_mb MB)" grew_under 64
check "... at once ($secs s < 6 s)" under 6
start endless
machine E FUSELAB_REMOTE_CACHE_MAX_MB=1
check "a status line that never ends: read no further than its limit" \
  sh -c "[ '$(field ok)' = true ] && [ '$(field errors)' = 1 ] && grep -q 'a reply line longer than 4096 bytes' '$tmp/err'"
check "... the process did not grow by it (peak $(field hwm_mb) MB, honest $base_mb MB)" grew_under 64
start array
machine F
check "an array of 2^31 elements where a string belongs: refused unread" \
  sh -c "[ '$(field ok)' = true ] && [ '$(field errors)' = 1 ] && grep -q 'an unexpected reply' '$tmp/err'"
check "... the process did not grow by it" grew_under 64
start extra
machine G
check "bytes after a reply that no command asked for: the connection is dropped" \
  sh -c "[ '$(field ok)' = true ] && [ '$(field errors)' = 1 ] && grep -q 'bytes after the reply' '$tmp/err'"

# what the server says reaches the terminal escaped
start error
machine H
check "an error reply with terminal commands: one warning, its text escaped" \
  sh -c "[ '$(field ok)' = true ] && [ '$(field errors)' = 1 ] && grep -q -F 'GETRANGE: ERR \\x1b[2J\\x1b]0;pwned\\x07 \\x9b31m bad' '$tmp/err'"
check "... no raw ESC, BEL or CSI byte on stderr" clean_text
machine I FUSELAB_REMOTE_CACHE="redis://:pw@127.0.0.1:$port"
check "... the same for AUTH's error" \
  sh -c "[ '$(field ok)' = true ] && grep -q -F 'AUTH: ERR \\x1b[2J' '$tmp/err'"
check "... no raw ESC, BEL or CSI byte on stderr" clean_text
stop_server

if grep -q 'Sanitizer\|runtime error' "$tmp/allerr"; then
  not_ok "no sanitizer reports"; sed 's/^/#   /' "$tmp/allerr"
else
  ok "no sanitizer reports"
fi

echo "1..$n"
