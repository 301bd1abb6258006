/*
** fuzz_onnx.c -- libFuzzer target for the ONNX reader.  Any byte string
** must either parse into a closed, ordered model (and, read as one
** TensorProto, into a tensor; as a SequenceProto or OptionalProto, into
** their tensors) or fail with a message and leave nothing behind; the sanitizers turn out-of-bounds reads, overflows, leaks and
** undefined behaviour (ours and protobuf-c's) into crashes.  No folder is
** given, so external data is refused without touching the file system.
** Built and run by tests/fuzz/fuzz.sh.
*/
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "io/onnx.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static unsigned char touch(const fl_tensor *t) {
  /* every byte, so a short allocation shows up under ASan */
  const unsigned char *p = ten_data(t);
  size_t n = (size_t)meta_numel(&t->m) * dtype_size(t->m.dtype);
  unsigned char s = 0;
  for (size_t k = 0; k < n; k++) s ^= p[k];
  return s;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  onnx_model m;
  onnx_tensor t;
  fl_err e = {0};
  volatile unsigned char sink = 0;
  if (onnx_parse(data, size, NULL, &m, &e) == FL_OK) {
    for (int i = 0; i < m.ninit; i++) sink ^= touch(&m.init[i].t);
    for (int i = 0; i < m.nnode; i++) {
      sink ^= (unsigned char)strlen(m.node[i].op_type);
      for (int j = 0; j < m.node[i].nin; j++) sink ^= (unsigned char)strlen(m.node[i].in[j]);
      for (int j = 0; j < m.node[i].nattr; j++)
        if (m.node[i].attr[j].t) sink ^= touch(&m.node[i].attr[j].t->t);
    }
    onnx_model_free(&m);
  } else if (e.msg[0] == '\0' || m.node != NULL || m.nnode != 0 || m.init != NULL) {
    __builtin_trap();   /* a failure must say why and leave nothing behind */
  }
  err_clear(&e);
  if (onnx_tensor_parse(data, size, &t, &e) == FL_OK) {
    sink ^= touch(&t.t);
    onnx_tensor_free(&t);
  } else if (e.msg[0] == '\0' || t.t.st != NULL) {
    __builtin_trap();
  }
  for (int kind = ONNX_KIND_SEQUENCE; kind <= ONNX_KIND_OPTIONAL; kind++) {
    onnx_data d;
    err_clear(&e);
    if (onnx_data_parse(data, size, kind, &d, &e) == FL_OK) {
      for (size_t i = 0; i < d.n; i++) sink ^= touch(&d.t[i].t);
      onnx_data_free(&d);
    } else if (e.msg[0] == '\0' || d.t != NULL || d.n != 0) {
      __builtin_trap();
    }
  }
  (void)sink;
  return 0;
}
