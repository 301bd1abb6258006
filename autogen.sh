#!/bin/sh
# Regenerate the build system (configure, Makefile.in) from configure.ac.
set -e
cd "$(dirname "$0")"
mkdir -p build-aux m4
autoreconf -fi
cp -f "$(automake --print-libdir)/tap-driver.sh" build-aux/
