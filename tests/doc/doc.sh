#!/bin/sh
# doc.sh -- every runnable example of doc/API.md, each in a fresh fuselab
# process in an empty folder; TAP, one line per example (ok N - API.md:LINE).
# The work is done by run_examples.lua; this sets up where things are.
#
# Env: FUSELAB  the built binary; FUSELAB_SRC  the source tree.

: "${FUSELAB:?FUSELAB must name the fuselab binary}"
SRC=${FUSELAB_SRC:-$(cd "$(dirname "$0")/../.." && pwd)}
export FUSELAB FUSELAB_SRC="$SRC"
# A cache of its own: the examples clear it (fl.cache_clear), and other
# tests running at the same time count the entries of theirs.
tmp=$(mktemp -d "${TMPDIR:-/tmp}/fl-doc.XXXXXX") || exit 1
trap 'rm -rf "$tmp"' EXIT
trap 'exit 1' INT TERM
FUSELAB_CACHE_DIR=$tmp/cache
export FUSELAB_CACHE_DIR
"$FUSELAB" "$SRC/tests/doc/run_examples.lua" "$SRC/doc/API.md" "$@"
