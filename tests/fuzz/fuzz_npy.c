/*
** fuzz_npy.c -- libFuzzer target for the .npy reader.  Any byte string
** must either parse into a tensor or fail with a message; the sanitizers
** the target is built with turn out-of-bounds reads, overflows, leaks and
** undefined behaviour into crashes.  Built and run by tests/fuzz/fuzz.sh.
*/
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "io/npy.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  fl_tensor t;
  fl_err e = {0};
  if (npy_parse(data, size, &t, &e) == FL_OK) {
    /* touch every byte so a short allocation shows up under ASan */
    const unsigned char *p = ten_data(&t);
    size_t n = (size_t)meta_numel(&t.m) * dtype_size(t.m.dtype);
    volatile unsigned char sink = 0;
    for (size_t i = 0; i < n; i++) sink ^= p[i];
    (void)sink;
    ten_release(&t);
  } else if (e.msg[0] == '\0' || t.st != NULL) {
    __builtin_trap();   /* a failure must say why and leave nothing behind */
  }
  return 0;
}
