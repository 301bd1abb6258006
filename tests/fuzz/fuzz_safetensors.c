/*
** fuzz_safetensors.c -- libFuzzer target for the safetensors reader.  Any
** byte string must either parse into named tensors or fail with a message
** and leave the list empty; the sanitizers the target is built with turn
** out-of-bounds reads, overflows, leaks and undefined behaviour (in our
** code and in cJSON's parse of the header) into crashes.  Built and run by
** tests/fuzz/fuzz.sh.
*/
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "io/safetensors.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  st_list l;
  fl_err e = {0};
  if (st_parse(data, size, &l, &e) == FL_OK) {
    volatile unsigned char sink = 0;
    for (size_t i = 0; i < l.n; i++) {
      /* touch every byte so a short allocation shows up under ASan */
      const unsigned char *p = ten_data(&l.v[i].t);
      size_t n = (size_t)meta_numel(&l.v[i].t.m) * dtype_size(l.v[i].t.m.dtype);
      for (size_t k = 0; k < n; k++) sink ^= p[k];
      sink ^= (unsigned char)strlen(l.v[i].name);
    }
    (void)sink;
    st_list_free(&l);
  } else if (e.msg[0] == '\0' || l.v != NULL || l.n != 0) {
    __builtin_trap();   /* a failure must say why and leave nothing behind */
  }
  return 0;
}
