#!/bin/sh
# mutations.sh -- the emulator's own test (test_emu.c), on the emulator.
b=$(dirname "$FUSELAB")
exec "$b/tests/gpu/emu/run" "$b/tests/gpu/emu/test_emu"
