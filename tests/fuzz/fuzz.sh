#!/bin/sh
# fuzz.sh -- build the file readers' libFuzzer targets with ASan and UBSan
# and run each briefly over its seed corpus: the .npy reader over
# tests/fuzz/corpus, the safetensors reader over tests/fuzz/corpus_st, the
# ONNX reader (io/onnx.c over protobuf-c) over tests/fuzz/corpus_onnx, the
# tokenizer reader with its encoder and decoder (io/tokenizer.c over cJSON,
# PCRE2 and libunistring) over tests/fuzz/corpus_tok, the image decoders
# (io/image.c over libjpeg, libpng, libtiff, libwebp and OpenJPEG, those
# pkg-config finds) over tests/fuzz/corpus_img.
# TAP output: five tests, "fuzz npy", "fuzz safetensors", "fuzz onnx",
# "fuzz tokenizer" and "fuzz image",
# each failing on
# any crash, leak, sanitizer report or timeout.  They are skipped only when
# clang or its libFuzzer runtime is missing (Debian: clang and
# libclang-rt-14-dev).
#
# Environment: FUSELAB_SRC  source tree (default: two levels above this file)
#              CLANG        compiler (default: clang)
#              FUZZ_TIME    seconds of fuzzing per target (default: 20)
#              FUZZ_KEEP    keep the work dir (crash inputs, logs) when set

src=${FUSELAB_SRC:-$(cd "$(dirname "$0")/../.." && pwd)}
cc=${CLANG:-clang}
secs=${FUZZ_TIME:-20}
status=0

echo "1..5"

work=$(mktemp -d "${TMPDIR:-/tmp}/fuzz_npy.XXXXXX") || {
  echo "not ok 1 - fuzz npy # cannot create a temp dir"
  echo "not ok 2 - fuzz safetensors # cannot create a temp dir"
  echo "not ok 3 - fuzz onnx # cannot create a temp dir"
  echo "not ok 4 - fuzz tokenizer # cannot create a temp dir"
  echo "not ok 5 - fuzz image # cannot create a temp dir"
  exit 1
}
cleanup() { [ -n "$FUZZ_KEEP" ] || rm -rf "$work"; }
trap cleanup EXIT
trap 'exit 130' INT TERM

if ! command -v "$cc" >/dev/null 2>&1; then
  echo "ok 1 # SKIP clang with libFuzzer not available ($cc not found)"
  echo "ok 2 # SKIP clang with libFuzzer not available ($cc not found)"
  echo "ok 3 # SKIP clang with libFuzzer not available ($cc not found)"
  echo "ok 4 # SKIP clang with libFuzzer not available ($cc not found)"
  echo "ok 5 # SKIP clang with libFuzzer not available ($cc not found)"
  exit 0
fi

# The runtime check is a link of an empty target: only that failing means
# "not available"; a failure to build the real sources is a failure.
cat >"$work/probe.c" <<'EOF'
#include <stddef.h>
#include <stdint.h>
int LLVMFuzzerTestOneInput(const uint8_t *d, size_t n);
int LLVMFuzzerTestOneInput(const uint8_t *d, size_t n) { (void)d; (void)n; return 0; }
EOF
if ! "$cc" -fsanitize=fuzzer,address,undefined -o "$work/probe" "$work/probe.c" \
     >"$work/probe.log" 2>&1; then
  sed 's/^/# /' "$work/probe.log" | head -5
  echo "ok 1 # SKIP clang with libFuzzer not available"
  echo "ok 2 # SKIP clang with libFuzzer not available"
  echo "ok 3 # SKIP clang with libFuzzer not available"
  echo "ok 4 # SKIP clang with libFuzzer not available"
  echo "ok 5 # SKIP clang with libFuzzer not available"
  exit 0
fi

# fuzz_run N NAME DIR BIN DICT: run target BIN over DIR/corpus for $secs
# seconds and print its TAP line (the sanitizers' report when it fails);
# returns non-zero on any crash, leak or timeout.
fuzz_run() {
  ASAN_OPTIONS=detect_leaks=1:allocator_may_return_null=1 \
  UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
    "$4" -max_total_time="$secs" -max_len=4096 -timeout=10 \
      -rss_limit_mb=2048 -malloc_limit_mb=1024 -print_final_stats=1 \
      -dict="$5" -artifact_prefix="$3/" "$3/corpus" >"$3/run.log" 2>&1
  fr=$?
  runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$3/run.log")
  if [ "$fr" -eq 0 ]; then
    echo "ok $1 - fuzz $2 (${runs:-?} inputs in ${secs}s, no crash)"
    return 0
  fi
  grep -E 'ERROR|SUMMARY|runtime error|==[0-9]+==' "$3/run.log" | head -20 | sed 's/^/# /'
  tail -n 15 "$3/run.log" | sed 's/^/# /'
  echo "not ok $1 - fuzz $2 (libFuzzer exit $fr; FUZZ_KEEP=1 keeps $work)"
  return 1
}

# Only the reader and what it stands on: no config.h, no Lua.
if ! "$cc" -std=c11 -D_GNU_SOURCE -g -O1 -Wall -Wextra \
     -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined \
     -I"$src" -o "$work/fuzz_npy" \
     "$src/tests/fuzz/fuzz_npy.c" "$src/io/npy.c" "$src/graph/tensor.c" "$src/graph/hostpool.c" "$src/graph/env.c" \
     "$src/graph/dtype.c" "$src/graph/err.c" "$src/graph/file.c" -lm >"$work/build.log" 2>&1; then
  sed 's/^/# /' "$work/build.log" | tail -20
  echo "not ok 1 - fuzz npy # the target did not build"
  status=1
else

# libFuzzer adds what it finds to the first corpus dir: work on a copy so
# the source tree is never written.
mkdir "$work/corpus"
cp "$src"/tests/fuzz/corpus/* "$work/corpus/" 2>/dev/null

# Header tokens, so mutations reach the dict parser's corners quickly.
cat >"$work/npy.dict" <<'EOF'
"\x93NUMPY\x01\x00"
"\x93NUMPY\x02\x00"
"\x93NUMPY\x03\x00"
"{'descr': "
"'fortran_order': "
"'shape': "
"True"
"False"
"'<f4'"
"'<f2'"
"'<i8'"
"'|b1'"
"'<f8'"
"'<i4'"
"'>f4'"
"(1, 2, 3)"
"(0,)"
"()"
"-1"
"4294967296"
"9223372036854775807"
EOF

fuzz_run 1 npy "$work" "$work/fuzz_npy" "$work/npy.dict" || status=1
fi   # the npy target built

# ---- the safetensors reader (cJSON parses its header) -------------------
st="$work/st"
mkdir "$st"
cjson=$(pkg-config --cflags --libs libcjson 2>/dev/null || echo -lcjson)
# $cjson is a list of flags: split on purpose.
# shellcheck disable=SC2086
if ! "$cc" -std=c11 -D_GNU_SOURCE -g -O1 -Wall -Wextra \
     -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined \
     -I"$src" -o "$st/fuzz_safetensors" \
     "$src/tests/fuzz/fuzz_safetensors.c" "$src/io/safetensors.c" \
     "$src/graph/tensor.c" "$src/graph/hostpool.c" "$src/graph/env.c" "$src/graph/dtype.c" "$src/graph/err.c" \
     "$src/graph/file.c" $cjson -lm >"$st/build.log" 2>&1; then
  sed 's/^/# /' "$st/build.log" | tail -20
  echo "not ok 2 - fuzz safetensors # the target did not build"
  status=1
else

mkdir "$st/corpus"
cp "$src"/tests/fuzz/corpus_st/* "$st/corpus/" 2>/dev/null

# Header tokens: length prefixes, the keys, every dtype, offsets, numbers
# at the edges of what a double holds exactly.
cat >"$st/st.dict" <<'EOF'
"\x08\x00\x00\x00\x00\x00\x00\x00"
"\x40\x00\x00\x00\x00\x00\x00\x00"
"{\"w\":{"
"\"dtype\":"
"\"shape\":"
"\"data_offsets\":"
"\"__metadata__\":{\"format\":\"pt\"}"
"\"F32\""
"\"F16\""
"\"BF16\""
"\"I64\""
"\"BOOL\""
"\"F64\""
"[0,4]"
"[4,8]"
"[2,3]"
"[]"
"-1"
"1e308"
"9007199254740993"
"\\u0000"
EOF

fuzz_run 2 safetensors "$st" "$st/fuzz_safetensors" "$st/st.dict" || status=1
fi   # the safetensors target built

# ---- the ONNX reader (protobuf-c parses the wire format) ----------------
ox="$work/onnx"
mkdir "$ox" "$ox/io"
pbc=$(pkg-config --cflags --libs libprotobuf-c 2>/dev/null || echo -lprotobuf-c)
# the reader's wire code is generated at build time: generate it here too.
# $pbc is a list of flags: split on purpose.
# shellcheck disable=SC2086
if ! command -v protoc-c >/dev/null 2>&1 ||
   ! protoc-c --proto_path="$src/io" --c_out="$ox/io" "$src/io/onnx.proto" >"$ox/build.log" 2>&1 ||
   ! "$cc" -std=c11 -D_GNU_SOURCE -g -O1 -Wall \
     -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined \
     -I"$src" -I"$ox" -o "$ox/fuzz_onnx" \
     "$src/tests/fuzz/fuzz_onnx.c" "$src/io/onnx.c" "$ox/io/onnx.pb-c.c" \
     "$src/graph/tensor.c" "$src/graph/hostpool.c" "$src/graph/env.c" "$src/graph/dtype.c" "$src/graph/err.c" \
     "$src/graph/file.c" $pbc -lm >>"$ox/build.log" 2>&1; then
  sed 's/^/# /' "$ox/build.log" | tail -20
  echo "not ok 3 - fuzz onnx # the target did not build"
  exit 1
fi

mkdir "$ox/corpus"
cp "$src"/tests/fuzz/corpus_onnx/* "$ox/corpus/" 2>/dev/null

# Field keys of ModelProto, GraphProto, NodeProto and TensorProto, dtype
# codes, op names, varints at the edges.
cat >"$ox/onnx.dict" <<'EOF'
"\x08\x08"
"\x3a"
"\x42\x02\x10\x0d"
"\x0a"
"\x12"
"\x22"
"\x2a"
"\x5a"
"\x62"
"\x08\x01"
"\x08\x07"
"\x10\x01"
"\x10\x07"
"\x10\x06"
"\x10\x0b"
"\x4a"
"\x6a"
"\x70\x01"
"location"
"offset"
"length"
"MatMul"
"Reshape"
"Constant"
"\xff\xff\xff\xff\xff\xff\xff\xff\xff\x01"
"\x80\x80\x80\x80\x10"
EOF

fuzz_run 3 onnx "$ox" "$ox/fuzz_onnx" "$ox/onnx.dict" || status=1

# ---- the tokenizer reader, encoder and decoder ----------------------------
tk="$work/tok"
mkdir "$tk"
tkdeps=$(pkg-config --cflags --libs libcjson libpcre2-8 libxxhash 2>/dev/null || echo -lcjson -lpcre2-8 -lxxhash)
# $tkdeps is a list of flags: split on purpose.
# shellcheck disable=SC2086
if ! "$cc" -std=c11 -D_GNU_SOURCE -g -O1 -Wall -Wextra \
     -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined \
     -I"$src" -o "$tk/fuzz_tokenizer" \
     "$src/tests/fuzz/fuzz_tokenizer.c" "$src/io/tokenizer.c" "$src/graph/err.c" "$src/graph/file.c" \
     $tkdeps -lunistring -lm >"$tk/build.log" 2>&1; then
  sed 's/^/# /' "$tk/build.log" | tail -20
  echo "not ok 4 - fuzz tokenizer # the target did not build"
  exit 1
fi
mkdir "$tk/corpus"
cp "$src"/tests/fuzz/corpus_tok/* "$tk/corpus/" 2>/dev/null

# The format's keys and the values each step takes.
cat >"$tk/tok.dict" <<'EOF'
"\"model\":{\"type\":\"BPE\",\"vocab\":{"
"\"merges\":["
"\"byte_fallback\":true"
"\"ignore_merges\":true"
"\"unk_token\":"
"\"added_tokens\":[{\"id\":"
"\"content\":"
"\"special\":true"
"\"lstrip\":true"
"\"normalizer\":"
"\"pre_tokenizer\":"
"\"decoder\":"
"\"post_processor\":"
"{\"type\":\"Sequence\""
"{\"type\":\"ByteLevel\"}"
"{\"type\":\"Metaspace\"}"
"{\"type\":\"Split\",\"pattern\":{\"Regex\":\""
"\"behavior\":\"MergedWithNext\""
"\"behavior\":\"Contiguous\""
"\"invert\":true"
"{\"type\":\"NFKC\"}"
"\"<0x41>\""
"\\p{L}+"
"(?!\\S)"
EOF

fuzz_run 4 tokenizer "$tk" "$tk/fuzz_tokenizer" "$tk/tok.dict" || status=1

# ---- the image decoders ----------------------------------------------------
im="$work/img"
mkdir "$im"
# each library pkg-config finds, as configure builds them in
imdeps=""
for lib in libjpeg:LIBJPEG libpng:LIBPNG libtiff-4:LIBTIFF libwebp:LIBWEBP libopenjp2:LIBOPENJP2; do
  if pkg-config --exists "${lib%%:*}" 2>/dev/null; then
    imdeps="$imdeps -DHAVE_${lib##*:} $(pkg-config --cflags --libs "${lib%%:*}")"
  fi
done
# $imdeps is a list of flags: split on purpose.
# shellcheck disable=SC2086
if ! "$cc" -std=c11 -D_GNU_SOURCE -g -O1 -Wall -Wextra \
     -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined \
     -I"$src" -o "$im/fuzz_image" \
     "$src/tests/fuzz/fuzz_image.c" "$src/io/image.c" "$src/graph/err.c" \
     $imdeps -lm >"$im/build.log" 2>&1; then
  sed 's/^/# /' "$im/build.log" | tail -20
  echo "not ok 5 - fuzz image # the target did not build"
  exit 1
fi
mkdir "$im/corpus"
cp "$src"/tests/fuzz/corpus_img/* "$im/corpus/" 2>/dev/null

# Signatures and the header fields the decoders check first.
cat >"$im/img.dict" <<'EOF'
"\xff\xd8\xff"
"\xff\xc0"
"\xff\xda"
"\xff\xd9"
"\x89PNG\x0d\x0a\x1a\x0a"
"IHDR"
"IDAT"
"PLTE"
"tRNS"
"IEND"
"BM"
"P6"
"P5"
"255"
"II*\x00"
"MM\x00*"
"RIFF"
"WEBPVP8 "
"VP8L"
"VP8X"
"\x00\x00\x00\x0cjP  \x0d\x0a\x87\x0a"
"\xffO\xffQ"
"\xff\xff\xff\x7f"
"\x00\x00\x01\x00"
EOF

fuzz_run 5 image "$im" "$im/fuzz_image" "$im/img.dict" || status=1
exit "$status"
