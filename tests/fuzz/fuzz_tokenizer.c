/*
** fuzz_tokenizer.c -- libFuzzer target for the tokenizer reader and its
** encoder and decoder (io/tokenizer.c).  Any byte string must either load
** as a tokenizer.json or fail with a message; a tokenizer that loads must
** encode a fixed set of texts (and the input itself when it is UTF-8) and
** decode every id it gives, the decoded text valid UTF-8.  The sanitizers
** turn out-of-bounds accesses, leaks and undefined behaviour (in our code,
** in cJSON and in PCRE2's matching of the file's own regexes) into
** crashes.  Built and run by tests/fuzz/fuzz.sh.
*/
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <unistr.h>

#include "io/tokenizer.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void round_trip(const tok_tokenizer *t, const char *s, size_t n) {
  int64_t *ids;
  size_t nids, len;
  char *back;
  fl_err e = {0};
  if (tok_encode(t, s, n, 1, &ids, &nids, &e) != FL_OK) {
    if (e.msg[0] == '\0') __builtin_trap();
    return;
  }
  for (size_t i = 0; i < nids; i++)
    if (ids[i] < 0 || ids[i] >= tok_vocab_size(t)) __builtin_trap();   /* an id outside the vocabulary */
  if (tok_decode(t, ids, nids, 0, &back, &len, &e) == FL_OK) {
    if (u8_check((const uint8_t *)back, len) != NULL) __builtin_trap();
    free(back);
  } else if (e.msg[0] == '\0') {
    __builtin_trap();
  }
  free(ids);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  static const char *texts[] = {"", "Hello world", "  a  b\t\n", "naïve café 数据 🎉", "<s>x</s><|endoftext|>"};
  tok_tokenizer *t;
  fl_err e = {0};
  if (tok_parse_json((const char *)data, size, "fuzz.json", &t, &e) != FL_OK) {
    if (e.msg[0] == '\0' || t != NULL) __builtin_trap();   /* a failure must say why */
    return 0;
  }
  for (size_t i = 0; i < sizeof texts / sizeof *texts; i++) round_trip(t, texts[i], strlen(texts[i]));
  if (u8_check(data, size) == NULL) round_trip(t, (const char *)data, size);
  tok_free(t);
  return 0;
}
