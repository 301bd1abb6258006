/*
** onnx.c -- the ONNX model reader.
**
** Invariant: a model handed out is closed and ordered.  Every node input
** names a graph input, an initializer or an earlier node's output (or is
** "", an omitted optional input); every value has one producer; every
** graph output is produced; every tensor's dims are non-negative, within
** FL_MAX_DIMS and FL_MAX_ALLOC, and its data (inline, raw or external)
** has exactly the size its dims and dtype say.  Nodes are sorted
** topologically (Kahn's algorithm, ready nodes taken in file order, so a
** sorted file keeps its order); a cycle is an error naming a node on it.
**
** protobuf-c does the wire format: it refuses truncated and malformed
** images, and it allocates only for what the image holds, so memory is
** bounded by a small multiple of the file's size.
**
** Messages: "onnx: node 'name' (Op): ...", "onnx: tensor 'name': ...",
** "onnx: ..."; onnx_load puts "<path>: " in front.
*/
#include <errno.h>
#include <stddef.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "graph/file.h"
#include "io/onnx.h"
#include "io/onnx.pb-c.h"

typedef Onnx__TensorProto TensorProto;

static const char *quote(const char *s, char *buf, size_t n) {
  return err_quote(s ? s : "", buf, n);
}

const char *onnx_dtype_name(int elem) {
  static const char *const names[] = {
    "undefined", "float", "uint8", "int8", "uint16", "int16", "int32", "int64", "string",
    "bool", "float16", "double", "uint32", "uint64", "complex64", "complex128", "bfloat16",
    "float8e4m3fn", "float8e4m3fnuz", "float8e5m2", "float8e5m2fnuz", "uint4", "int4",
    "float4e2m1", "float8e8m0", "uint2", "int2"
  };
  static char other[32];
  if (elem >= 0 && elem < (int)(sizeof names / sizeof names[0])) return names[elem];
  snprintf(other, sizeof other, "dtype %d", elem);
  return other;
}

/* The fuselab dtype an ONNX dtype is held in, or -1.  uint64 is held as
** its bit pattern (values from 2^63 read as negative int64): the loader
** marks it and takes it only where that pattern gives ONNX's answer. */
static int held_as(int elem, fl_dtype *dt) {
  switch (elem) {
  case ONNX_FLOAT: *dt = FL_F32; return 0;
  case ONNX_FLOAT16: *dt = FL_F16; return 0;
  case ONNX_BFLOAT16: *dt = FL_BF16; return 0;
  case ONNX_DOUBLE: *dt = FL_F64; return 0;
  case ONNX_BOOL: *dt = FL_BOOL; return 0;
  case ONNX_INT64: case ONNX_INT32: case ONNX_INT16: case ONNX_INT8:
  case ONNX_UINT64: case ONNX_UINT32: case ONNX_UINT16: case ONNX_UINT8:
  case ONNX_INT4: case ONNX_UINT4: case ONNX_INT2: case ONNX_UINT2:
    *dt = FL_I64; return 0;
  /* every value of the 8- and 4-bit float types is exact in float32 */
  case ONNX_FLOAT8E4M3FN: case ONNX_FLOAT8E4M3FNUZ: case ONNX_FLOAT8E5M2: case ONNX_FLOAT8E5M2FNUZ:
  case ONNX_FLOAT4E2M1: case ONNX_FLOAT8E8M0:
    *dt = FL_F32; return 0;
  default: return -1;
  }
}

/* Bits per element of elem in raw_data (0: not a fixed-size type held).
** The 4- and 2-bit types are packed, the first element in the lowest
** bits of the first byte; the last byte may hold unused bits. */
static size_t raw_bits(int elem) {
  switch (elem) {
  case ONNX_FLOAT: case ONNX_INT32: case ONNX_UINT32: return 32;
  case ONNX_INT64: case ONNX_UINT64: case ONNX_DOUBLE: return 64;
  case ONNX_FLOAT16: case ONNX_BFLOAT16: case ONNX_INT16: case ONNX_UINT16: return 16;
  case ONNX_BOOL: case ONNX_INT8: case ONNX_UINT8: return 8;
  case ONNX_FLOAT8E4M3FN: case ONNX_FLOAT8E4M3FNUZ: case ONNX_FLOAT8E5M2: case ONNX_FLOAT8E5M2FNUZ:
  case ONNX_FLOAT8E8M0: return 8;
  case ONNX_INT4: case ONNX_UINT4: case ONNX_FLOAT4E2M1: return 4;
  case ONNX_INT2: case ONNX_UINT2: return 2;
  default: return 0;
  }
}

/* Bytes n elements of elem take packed (raw_data, or int32_data entries
** of the packed types: one byte each). */
static size_t packed_bytes(int elem, int64_t n) {
  return ((size_t)n * raw_bits(elem) + 7) / 8;
}

/* The value of the code c (its low bits) of a float8/float4 type, as
** ONNX's tables define them: sign, exponent and mantissa fields; the FN
** types have no infinity, only E4M3FN's 0x7f/0xff is NaN; the FNUZ types
** have one NaN, 0x80, where negative zero would be; E8M0 is an exponent
** alone, 2^(c - 127), 0xff NaN. */
static float small_float(int elem, unsigned c) {
  int sign = 0, e, m, mbits, bias;
  double v;
  switch (elem) {
  case ONNX_FLOAT8E8M0:
    return c == 0xff ? NAN : (float)ldexp(1.0, (int)c - 127);
  case ONNX_FLOAT4E2M1:
    sign = c >> 3 & 1, e = c >> 1 & 3, m = c & 1, mbits = 1, bias = 1;
    break;
  case ONNX_FLOAT8E5M2: case ONNX_FLOAT8E5M2FNUZ:
    sign = c >> 7, e = c >> 2 & 31, m = c & 3, mbits = 2, bias = elem == ONNX_FLOAT8E5M2 ? 15 : 16;
    if (elem == ONNX_FLOAT8E5M2 && e == 31) return m ? NAN : sign ? -INFINITY : INFINITY;
    break;
  default:
    sign = c >> 7, e = c >> 3 & 15, m = c & 7, mbits = 3, bias = elem == ONNX_FLOAT8E4M3FN ? 7 : 8;
    if (elem == ONNX_FLOAT8E4M3FN && e == 15 && m == 7) return NAN;
    break;
  }
  if ((elem == ONNX_FLOAT8E4M3FNUZ || elem == ONNX_FLOAT8E5M2FNUZ) && c == 0x80) return NAN;
  /* subnormal: m * 2^(1 - bias - mbits); normal: (2^mbits + m) * 2^(e - bias - mbits) */
  v = e == 0 ? ldexp(m, 1 - bias - mbits) : ldexp((1 << mbits) + m, e - bias - mbits);
  return (float)(sign ? -v : v);
}

/* Element i of elem's packed 4- or 2-bit codes in p. */
static unsigned packed_code(const unsigned char *p, int elem, int64_t i) {
  if (raw_bits(elem) == 4) return p[i / 2] >> (4 * (i % 2)) & 0xf;
  return p[i / 4] >> (2 * (i % 4)) & 3;
}

/* Store the code c of a sub-byte or float8 type as element i of t. */
static void put_code(unsigned char *d, int elem, int64_t i, unsigned c) {
  int64_t x;
  switch (elem) {
  case ONNX_INT4: x = (int64_t)(c & 0xf) - (c & 8 ? 16 : 0); break;
  case ONNX_INT2: x = (int64_t)(c & 3) - (c & 2 ? 4 : 0); break;
  case ONNX_UINT4: case ONNX_UINT2: x = (int64_t)c; break;
  default: {
    float f = small_float(elem, c & 0xff);
    memcpy(d + 4 * i, &f, 4);
    return;
  }
  }
  memcpy(d + 8 * i, &x, 8);
}

static int is_coded(int elem) {
  return (elem >= ONNX_FLOAT8E4M3FN && elem <= ONNX_INT2);
}

static char *dup_str(const char *s) {
  return strdup(s ? s : "");
}

void onnx_tensor_free(onnx_tensor *t) {
  if (!t) return;
  free(t->name);
  ten_release(&t->t);
  memset(t, 0, sizeof *t);
}

/* ---- tensor data -------------------------------------------------------- */

static uint64_t le(const unsigned char *p, size_t n) {
  uint64_t v = 0;
  for (size_t i = n; i-- > 0;) v = v << 8 | p[i];
  return v;
}

/* Store element i of the raw little-endian bytes p (elem's layout) into
** the contiguous tensor t. */
static void put_raw(fl_tensor *t, int elem, const unsigned char *p, int64_t n) {
  unsigned char *d = ten_data(t);
  size_t w = raw_bits(elem) / 8;
  if (is_coded(elem)) {
    for (int64_t i = 0; i < n; i++)
      put_code(d, elem, i, raw_bits(elem) == 8 ? p[i] : packed_code(p, elem, i));
    return;
  }
  for (int64_t i = 0; i < n; i++, p += w) {
    uint64_t v = le(p, w);
    switch (elem) {
    case ONNX_FLOAT: { uint32_t u = (uint32_t)v; memcpy(d + 4 * i, &u, 4); break; }
    case ONNX_FLOAT16: case ONNX_BFLOAT16: { uint16_t u = (uint16_t)v; memcpy(d + 2 * i, &u, 2); break; }
    case ONNX_BOOL: d[i] = v != 0; break;
    case ONNX_DOUBLE: memcpy(d + 8 * i, &v, 8); break;
    default: {
      int64_t x;
      if (elem == ONNX_INT64) x = (int64_t)v;
      else if (elem == ONNX_INT32) x = (int32_t)(uint32_t)v;
      else if (elem == ONNX_INT16) x = (int16_t)(uint16_t)v;
      else if (elem == ONNX_INT8) x = (int8_t)(uint8_t)v;
      else x = (int64_t)v;                   /* the unsigned types */
      memcpy(d + 8 * i, &x, 8);
    }
    }
  }
}

/* Store the typed field values (onnx.proto's *_data) into t. */
/* The count of typed values p holds for elem. */
static size_t typed_count(const TensorProto *p, int elem) {
  /* the codes of the float8 types, one a value, and the bytes of the
  ** packed types are int32_data's entries */
  switch (elem) {
  case ONNX_FLOAT: return p->n_float_data;
  case ONNX_INT64: return p->n_int64_data;
  case ONNX_UINT32: case ONNX_UINT64: return p->n_uint64_data;
  case ONNX_DOUBLE: return p->n_double_data;
  default: return p->n_int32_data;
  }
}

/* Store the typed values (their count already checked) into t. */
static void put_typed(fl_tensor *t, const TensorProto *p, int elem, int64_t n) {
  unsigned char *d = ten_data(t);
  if (is_coded(elem)) {
    for (int64_t i = 0; i < n; i++) {
      unsigned c;
      if (raw_bits(elem) == 8) c = (unsigned)p->int32_data[i] & 0xff;
      else if (raw_bits(elem) == 4) c = (unsigned)p->int32_data[i / 2] >> (4 * (i % 2)) & 0xf;
      else c = (unsigned)p->int32_data[i / 4] >> (2 * (i % 4)) & 3;
      put_code(d, elem, i, c);
    }
    return;
  }
  for (int64_t i = 0; i < n; i++) {
    switch (elem) {
    case ONNX_FLOAT: memcpy(d + 4 * i, &p->float_data[i], 4); break;
    case ONNX_INT64: memcpy(d + 8 * i, &p->int64_data[i], 8); break;
    case ONNX_DOUBLE: memcpy(d + 8 * i, &p->double_data[i], 8); break;
    case ONNX_FLOAT16: case ONNX_BFLOAT16: {
      uint16_t u = (uint16_t)p->int32_data[i];
      memcpy(d + 2 * i, &u, 2);
      break;
    }
    case ONNX_BOOL: d[i] = p->int32_data[i] != 0; break;
    default: {
      int64_t x = elem == ONNX_UINT64 ? (int64_t)p->uint64_data[i]
                : elem == ONNX_UINT32 ? (int64_t)(uint32_t)p->uint64_data[i]
                : elem == ONNX_UINT16 ? (int64_t)(uint16_t)p->int32_data[i]
                : elem == ONNX_UINT8 ? (int64_t)(uint8_t)p->int32_data[i]
                : elem == ONNX_INT16 ? (int64_t)(int16_t)p->int32_data[i]
                : elem == ONNX_INT8 ? (int64_t)(int8_t)p->int32_data[i]
                : (int64_t)p->int32_data[i];
      memcpy(d + 8 * i, &x, 8);
    }
    }
  }
}

/* The file an external-data location names, inside dir only: a relative
** path without ".." parts, which after resolving symlinks is still under
** dir.  Returns a malloc'd path or NULL with e set. */
static char *resolve_external(const char *dir, const char *loc, const char *name, fl_err *e) {
  char q[256], q2[256], *full = NULL, *real = NULL, *rdir = NULL;
  const char *s;
  size_t n;
  if (!dir) {
    err_set(e, FL_EUNSUPPORTED, "tensor '%s': external data is unsupported for a model "
            "read from memory", quote(name, q, sizeof q));
    return NULL;
  }
  if (!loc[0] || loc[0] == '/') {
    err_set(e, FL_EFORMAT, "tensor '%s': external data location '%s' must be a relative path "
            "inside the model's folder", quote(name, q, sizeof q), quote(loc, q2, sizeof q2));
    return NULL;
  }
  for (s = loc; *s;) {               /* no ".." component */
    const char *end = strchr(s, '/');
    size_t len = end ? (size_t)(end - s) : strlen(s);
    if (len == 2 && s[0] == '.' && s[1] == '.') {
      err_set(e, FL_EFORMAT, "tensor '%s': external data location '%s' leaves the model's "
              "folder", quote(name, q, sizeof q), quote(loc, q2, sizeof q2));
      return NULL;
    }
    s += len + (end != NULL);
  }
  n = strlen(dir) + strlen(loc) + 2;
  if (!(full = malloc(n))) {
    err_set(e, FL_ENOMEM, "out of memory");
    return NULL;
  }
  snprintf(full, n, "%s/%s", dir, loc);
  rdir = realpath(dir, NULL);
  real = realpath(full, NULL);
  if (!rdir || !real) {
    err_set(e, FL_EIO, "tensor '%s': external data '%s': %s", quote(name, q, sizeof q),
            quote(loc, q2, sizeof q2), strerror(errno));
    goto fail;
  }
  n = strlen(rdir);
  if (strncmp(real, rdir, n) != 0 || (real[n] != '/' && !(n == 1 && rdir[0] == '/'))) {
    err_set(e, FL_EFORMAT, "tensor '%s': external data location '%s' leaves the model's "
            "folder (through a symlink)", quote(name, q, sizeof q), quote(loc, q2, sizeof q2));
    goto fail;
  }
  free(full);
  free(rdir);
  return real;
fail:
  free(full);
  free(rdir);
  free(real);
  return NULL;
}

static int parse_u64(const char *s, uint64_t *out) {
  char *end;
  unsigned long long v;
  if (!s || !*s || *s == '-' || *s == '+') return -1;
  errno = 0;
  v = strtoull(s, &end, 10);
  if (errno || *end) return -1;
  *out = v;
  return 0;
}

/* Read the external data of p (nbytes expected) into a new buffer *out,
** allocated only once the file is known to hold that many bytes. */
static int read_external(const TensorProto *p, const char *dir, const char *name,
                         unsigned char **out, size_t nbytes, fl_err *e) {
  unsigned char *buf;
  const char *loc = NULL;
  uint64_t off = 0, len = nbytes, size;
  int have_len = 0, fd, rc = FL_OK;
  char q[256], q2[128], *path;
  size_t done = 0;
  for (size_t i = 0; i < p->n_external_data; i++) {
    const char *k = p->external_data[i]->key ? p->external_data[i]->key : "";
    const char *v = p->external_data[i]->value ? p->external_data[i]->value : "";
    if (strcmp(k, "location") == 0) loc = v;
    else if (strcmp(k, "offset") == 0) {
      if (parse_u64(v, &off))
        return err_set(e, FL_EFORMAT, "tensor '%s': external data offset '%s' is not a "
                       "non-negative integer", quote(name, q, sizeof q), quote(v, q2, sizeof q2));
    } else if (strcmp(k, "length") == 0) {
      if (parse_u64(v, &len))
        return err_set(e, FL_EFORMAT, "tensor '%s': external data length '%s' is not a "
                       "non-negative integer", quote(name, q, sizeof q), quote(v, q2, sizeof q2));
      have_len = 1;
    }
  }
  if (!loc) return err_set(e, FL_EFORMAT, "tensor '%s': external data without a location",
                           quote(name, q, sizeof q));
  if (have_len && len != nbytes)
    return err_set(e, FL_EFORMAT, "tensor '%s': external data length %llu, its dims and dtype "
                   "need %zu bytes", quote(name, q, sizeof q), (unsigned long long)len, nbytes);
  if (!(path = resolve_external(dir, loc, name, e))) return e ? e->code : FL_EFORMAT;
  if ((rc = file_open_read(path, &fd, &size, e)) != FL_OK) {
    free(path);
    return err_prefix(e, "tensor '%s': external data", quote(name, q, sizeof q));
  }
  free(path);
  if (off > size || nbytes > size - off) {
    close(fd);
    return err_set(e, FL_EFORMAT, "tensor '%s': external data [%llu, +%zu) runs past the end "
                   "of its %llu-byte file", quote(name, q, sizeof q), (unsigned long long)off,
                   nbytes, (unsigned long long)size);
  }
  if (!(buf = malloc(nbytes ? nbytes : 1))) {
    close(fd);
    return err_set(e, FL_ENOMEM, "tensor '%s': out of memory (%zu bytes)",
                   quote(name, q, sizeof q), nbytes);
  }
  while (done < nbytes) {
    ssize_t r = pread(fd, (char *)buf + done, nbytes - done, (off_t)(off + done));
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) {
      rc = err_set(e, FL_EIO, "tensor '%s': external data: %s", quote(name, q, sizeof q),
                   r < 0 ? strerror(errno) : "file shrank while reading");
      break;
    }
    done += (size_t)r;
  }
  close(fd);
  if (rc != FL_OK) free(buf);
  else *out = buf;
  return rc;
}

/* Turn one TensorProto into *out (name from the proto). */
static int tensor_from_proto(const TensorProto *p, const char *dir, onnx_tensor *out, fl_err *e) {
  const char *name = p->name ? p->name : "";
  char q[256];
  fl_meta m;
  fl_dtype dt;
  int elem = p->has_data_type ? p->data_type : 0, rc;
  unsigned char *ext = NULL;
  int64_t n = 1;
  size_t nbytes;
  memset(out, 0, sizeof *out);
  memset(&m, 0, sizeof m);
  if (held_as(elem, &dt) != 0)
    return err_set(e, FL_EUNSUPPORTED, "tensor '%s': dtype %s is unsupported (fuselab holds "
                   "float, float16, bfloat16, double, int64, bool and, widened to int64, the "
                   "smaller integer types; the float8 and float4 types as float)", quote(name, q, sizeof q), onnx_dtype_name(elem));
  if (p->segment)
    return err_set(e, FL_EUNSUPPORTED, "tensor '%s': segmented tensors are unsupported",
                   quote(name, q, sizeof q));
  if (p->n_dims > FL_MAX_DIMS)
    return err_set(e, FL_EUNSUPPORTED, "tensor '%s': %zu dims, fuselab supports at most %d",
                   quote(name, q, sizeof q), p->n_dims, FL_MAX_DIMS);
  m.dtype = dt;
  m.ndim = (int)p->n_dims;
  for (size_t i = 0; i < p->n_dims; i++) {
    if (p->dims[i] < 0)
      return err_set(e, FL_EFORMAT, "tensor '%s': dim %zu is negative (%lld)",
                     quote(name, q, sizeof q), i, (long long)p->dims[i]);
    m.shape[i] = p->dims[i];
  }
  if ((rc = meta_check_size(&m, "tensor", e)) != FL_OK)
    return err_prefix(e, "tensor '%s'", quote(name, q, sizeof q));
  n = meta_numel(&m);
  nbytes = packed_bytes(elem, n);
  if (p->has_data_location && p->data_location == ONNX__TENSOR_PROTO__DATA_LOCATION__EXTERNAL) {
    if (p->has_raw_data && p->raw_data.len)
      return err_set(e, FL_EFORMAT, "tensor '%s': both raw and external data",
                     quote(name, q, sizeof q));
  } else if (p->has_raw_data) {
    if (p->raw_data.len != nbytes)
      return err_set(e, FL_EFORMAT, "tensor '%s': raw_data is %zu bytes, its dims and dtype "
                     "need %zu", quote(name, q, sizeof q), p->raw_data.len, nbytes);
  }
  /* the data is there, in the right amount, before anything is
  ** allocated: a tensor never takes more memory than its bytes in a file */
  if (p->has_data_location && p->data_location == ONNX__TENSOR_PROTO__DATA_LOCATION__EXTERNAL) {
    if ((rc = read_external(p, dir, name, &ext, nbytes, e)) != FL_OK) return rc;
  } else if (!p->has_raw_data && raw_bits(elem) < 8
             && (uint64_t)typed_count(p, elem) != (uint64_t)packed_bytes(elem, n)) {
    return err_set(e, FL_EFORMAT, "tensor '%s': %s data holds %zu packed bytes, its dims "
                   "say %zu", quote(name, q, sizeof q), onnx_dtype_name(elem),
                   typed_count(p, elem), packed_bytes(elem, n));
  } else if (!p->has_raw_data && raw_bits(elem) >= 8
             && (uint64_t)typed_count(p, elem) != (uint64_t)n) {
    return err_set(e, FL_EFORMAT, "tensor '%s': %s data holds %zu values, its dims say %lld",
                   quote(name, q, sizeof q), onnx_dtype_name(elem), typed_count(p, elem),
                   (long long)n);
  }
  if ((rc = ten_empty(&out->t, &m, e)) != FL_OK) {
    free(ext);
    return err_prefix(e, "tensor '%s'", quote(name, q, sizeof q));
  }
  out->elem = elem;
  if (!(out->name = dup_str(name))) {
    free(ext);
    ten_release(&out->t);
    return err_set(e, FL_ENOMEM, "out of memory");
  }
  if (ext) put_raw(&out->t, elem, ext, n);
  else if (p->has_raw_data) put_raw(&out->t, elem, p->raw_data.data, n);
  else put_typed(&out->t, p, elem, n);
  free(ext);
  return FL_OK;
}

/* ---- names: a sorted index of value name -> producer -------------------- */

typedef struct name_ent {
  const char *name;
  int producer;      /* node index, or -1 for a graph input / initializer */
} name_ent;

static int by_name(const void *a, const void *b) {
  return strcmp(((const name_ent *)a)->name, ((const name_ent *)b)->name);
}

static const name_ent *lookup(const name_ent *v, size_t n, const char *name) {
  name_ent key = {name, 0};
  return bsearch(&key, v, n, sizeof *v, by_name);
}

/* ---- the model ---------------------------------------------------------- */

static void value_free(onnx_value *v) {
  free(v->name);
  for (int i = 0; i < FL_MAX_DIMS; i++) free(v->dim_names[i]);
}

static void attr_free(onnx_attr *a) {
  free(a->name);
  free(a->s);
  free(a->ints);
  free(a->floats);
  if (a->strings)
    for (size_t i = 0; i < a->n; i++) free(a->strings[i]);
  free(a->strings);
  if (a->t) onnx_tensor_free(a->t);
  free(a->t);
  if (a->g) onnx_model_free(a->g);
  free(a->g);
  if (a->ty) value_free(a->ty);
  free(a->ty);
}

static void node_free(onnx_node *nd) {
  free(nd->name);
  free(nd->op_type);
  free(nd->domain);
  for (int i = 0; i < nd->nin; i++) free(nd->in[i]);
  for (int i = 0; i < nd->nout; i++) free(nd->out[i]);
  free(nd->in);
  free(nd->out);
  for (int i = 0; i < nd->nattr; i++) attr_free(&nd->attr[i]);
  free(nd->attr);
  for (int i = 0; i < nd->nimplicit; i++) free(nd->implicit[i]);
  free(nd->implicit);
}

void onnx_model_free(onnx_model *m) {
  if (!m) return;
  free(m->name);
  free(m->producer);
  for (int i = 0; i < m->nin; i++) value_free(&m->in[i]);
  for (int i = 0; i < m->nout; i++) value_free(&m->out[i]);
  for (int i = 0; i < m->ninit; i++) onnx_tensor_free(&m->init[i]);
  for (int i = 0; i < m->nnode; i++) node_free(&m->node[i]);
  free(m->in);
  free(m->out);
  free(m->init);
  free(m->node);
  for (int i = 0; i < m->nfree; i++) free(m->free_names[i]);
  free(m->free_names);
  memset(m, 0, sizeof *m);
}

/* The kind of ty (a tensor, a sequence of tensors, an optional of either)
** into v: kind, inner and elem; a tensor's shape is read by the caller.
** Returns the tensor type to read a shape from (NULL: none). */
static int kind_from_proto(const Onnx__TypeProto *ty, onnx_value *v, const char *what,
                           const char *name, const Onnx__TypeProto__Tensor **tensor, fl_err *e) {
  char q[256];
  *tensor = NULL;
  v->kind = ONNX_KIND_TENSOR;
  v->inner = -1;
  if (ty->value_case == ONNX__TYPE_PROTO__VALUE_OPTIONAL_TYPE) {
    v->kind = ONNX_KIND_OPTIONAL;
    ty = ty->optional_type ? ty->optional_type->elem_type : NULL;
    if (!ty) return FL_OK;
  }
  if (ty->value_case == ONNX__TYPE_PROTO__VALUE_SEQUENCE_TYPE) {
    if (v->kind == ONNX_KIND_OPTIONAL) v->inner = ONNX_KIND_SEQUENCE;
    else v->kind = ONNX_KIND_SEQUENCE;
    ty = ty->sequence_type ? ty->sequence_type->elem_type : NULL;
    if (!ty) return FL_OK;
    if (ty->value_case != ONNX__TYPE_PROTO__VALUE_TENSOR_TYPE)
      return err_set(e, FL_EUNSUPPORTED, "%s '%s': sequences of anything but tensors are "
                     "unsupported", what, quote(name, q, sizeof q));
    if (ty->tensor_type->has_elem_type) v->elem = ty->tensor_type->elem_type;
    return FL_OK;
  }
  if (ty->value_case != ONNX__TYPE_PROTO__VALUE_TENSOR_TYPE)
    return err_set(e, FL_EUNSUPPORTED, "%s '%s': maps and sparse tensors are unsupported "
                   "(tensors, sequences of tensors and optionals of either)", what,
                   quote(name, q, sizeof q));
  if (ty->tensor_type->has_elem_type) v->elem = ty->tensor_type->elem_type;
  if (v->kind == ONNX_KIND_OPTIONAL) v->inner = ONNX_KIND_TENSOR;
  else *tensor = ty->tensor_type;
  return FL_OK;
}

static int value_from_proto(const Onnx__ValueInfoProto *p, onnx_value *v, const char *what,
                            fl_err *e) {
  char q[256], w[32];
  const Onnx__TypeProto *ty = p->type;
  const Onnx__TypeProto__Tensor *tt;
  int rc;
  memset(v, 0, sizeof *v);
  v->ndim = -1;
  v->inner = -1;
  if (!p->name || !p->name[0])
    return err_set(e, FL_EFORMAT, "a graph %s has no name", what);
  if (!(v->name = dup_str(p->name))) return err_set(e, FL_ENOMEM, "out of memory");
  if (!ty) return FL_OK;
  snprintf(w, sizeof w, "graph %s", what);
  if ((rc = kind_from_proto(ty, v, w, p->name, &tt, e)) != FL_OK || !tt) return rc;
  if (tt->shape) {
    const Onnx__TensorShapeProto *s = tt->shape;
    if (s->n_dim > FL_MAX_DIMS)
      return err_set(e, FL_EUNSUPPORTED, "graph %s '%s': %zu dims, fuselab supports at most %d",
                     what, quote(p->name, q, sizeof q), s->n_dim, FL_MAX_DIMS);
    v->ndim = (int)s->n_dim;
    for (size_t i = 0; i < s->n_dim; i++) {
      const Onnx__TensorShapeProto__Dimension *d = s->dim[i];
      v->dims[i] = -1;
      if (d->value_case == ONNX__TENSOR_SHAPE_PROTO__DIMENSION__VALUE_DIM_VALUE) {
        if (d->dim_value < 0 || d->dim_value > FL_MAX_EXTENT)
          return err_set(e, FL_EFORMAT, "graph %s '%s': dim %zu is %lld", what,
                         quote(p->name, q, sizeof q), i, (long long)d->dim_value);
        v->dims[i] = d->dim_value;
      } else if (d->value_case == ONNX__TENSOR_SHAPE_PROTO__DIMENSION__VALUE_DIM_PARAM &&
                 d->dim_param && d->dim_param[0]) {
        if (!(v->dim_names[i] = dup_str(d->dim_param)))
          return err_set(e, FL_ENOMEM, "out of memory");
      }
    }
  }
  return FL_OK;
}

/* Subgraphs nest at most this deep (a crafted file cannot exhaust the
** stack). */
#define ONNX_MAX_DEPTH 8

static int graph_from_proto(const Onnx__GraphProto *g, const char *dir, onnx_model *m,
                            int depth, fl_err *e);

/* Add name to the list *v of *n names unless it is there. */
static int add_name(char ***v, int *n, const char *name, fl_err *e) {
  char **grown;
  for (int i = 0; i < *n; i++)
    if (strcmp((*v)[i], name) == 0) return FL_OK;
  if (!(grown = realloc(*v, ((size_t)*n + 1) * sizeof *grown)))
    return err_set(e, FL_ENOMEM, "out of memory");
  *v = grown;
  if (!(grown[*n] = dup_str(name))) return err_set(e, FL_ENOMEM, "out of memory");
  (*n)++;
  return FL_OK;
}

static int attr_from_proto(const Onnx__AttributeProto *p, const char *dir, onnx_attr *a,
                           int depth, fl_err *e) {
  char q[256];
  memset(a, 0, sizeof *a);
  if (!(a->name = dup_str(p->name))) return err_set(e, FL_ENOMEM, "out of memory");
  if (p->ref_attr_name && p->ref_attr_name[0])
    return err_set(e, FL_EUNSUPPORTED, "attribute '%s': references to function attributes are "
                   "unsupported", quote(p->name, q, sizeof q));
  switch (p->has_type ? p->type : 0) {
  case ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__FLOAT:
    a->kind = ONNX_ATTR_FLOAT;
    a->f = p->f;
    break;
  case ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__INT:
    a->kind = ONNX_ATTR_INT;
    a->i = p->i;
    break;
  case ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__STRING:
    a->kind = ONNX_ATTR_STRING;
    if (p->s.len && memchr(p->s.data, 0, p->s.len))
      return err_set(e, FL_EFORMAT, "attribute '%s': string holds a NUL byte",
                     quote(p->name, q, sizeof q));
    if (!(a->s = strndup(p->s.len ? (const char *)p->s.data : "", p->s.len)))
      return err_set(e, FL_ENOMEM, "out of memory");
    break;
  case ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__TENSOR:
    a->kind = ONNX_ATTR_TENSOR;
    if (!p->t) return err_set(e, FL_EFORMAT, "attribute '%s': tensor missing",
                              quote(p->name, q, sizeof q));
    if (!(a->t = calloc(1, sizeof *a->t))) return err_set(e, FL_ENOMEM, "out of memory");
    if (tensor_from_proto(p->t, dir, a->t, e) != FL_OK)
      return err_prefix(e, "attribute '%s'", quote(p->name, q, sizeof q));
    break;
  case ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__GRAPH:
    a->kind = ONNX_ATTR_GRAPH;
    if (!p->g) return err_set(e, FL_EFORMAT, "attribute '%s': graph missing",
                              quote(p->name, q, sizeof q));
    if (depth + 1 > ONNX_MAX_DEPTH)
      return err_set(e, FL_EUNSUPPORTED, "attribute '%s': subgraphs nested more than %d deep "
                     "are unsupported", quote(p->name, q, sizeof q), ONNX_MAX_DEPTH);
    if (!(a->g = calloc(1, sizeof *a->g))) return err_set(e, FL_ENOMEM, "out of memory");
    if (graph_from_proto(p->g, dir, a->g, depth + 1, e) != FL_OK)
      return err_prefix(e, "attribute '%s'", quote(p->name, q, sizeof q));
    break;
  case ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__FLOATS:
    a->kind = ONNX_ATTR_FLOATS;
    a->n = p->n_floats;
    if (!(a->floats = calloc(a->n ? a->n : 1, sizeof *a->floats)))
      return err_set(e, FL_ENOMEM, "out of memory");
    for (size_t i = 0; i < a->n; i++) a->floats[i] = p->floats[i];
    break;
  case ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__INTS:
    a->kind = ONNX_ATTR_INTS;
    a->n = p->n_ints;
    if (!(a->ints = calloc(a->n ? a->n : 1, sizeof *a->ints)))
      return err_set(e, FL_ENOMEM, "out of memory");
    if (a->n) memcpy(a->ints, p->ints, a->n * sizeof *a->ints);
    break;
  case ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__STRINGS:
    a->kind = ONNX_ATTR_STRINGS;
    if (!(a->strings = calloc(p->n_strings ? p->n_strings : 1, sizeof *a->strings)))
      return err_set(e, FL_ENOMEM, "out of memory");
    for (size_t i = 0; i < p->n_strings; i++) {
      if (p->strings[i].len && memchr(p->strings[i].data, 0, p->strings[i].len))
        return err_set(e, FL_EFORMAT, "attribute '%s': string holds a NUL byte",
                       quote(p->name, q, sizeof q));
      if (!(a->strings[i] = strndup(p->strings[i].len ? (const char *)p->strings[i].data : "",
                                    p->strings[i].len)))
        return err_set(e, FL_ENOMEM, "out of memory");
      a->n = i + 1;
    }
    break;
  case ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__TYPE_PROTO: {
    const Onnx__TypeProto__Tensor *tt;
    a->kind = ONNX_ATTR_TYPE;
    if (!p->tp) return err_set(e, FL_EFORMAT, "attribute '%s': type missing",
                               quote(p->name, q, sizeof q));
    if (!(a->ty = calloc(1, sizeof *a->ty)) || !(a->ty->name = dup_str("")))
      return err_set(e, FL_ENOMEM, "out of memory");
    a->ty->ndim = -1;
    if (kind_from_proto(p->tp, a->ty, "attribute", p->name, &tt, e) != FL_OK) return e ? e->code : FL_EUNSUPPORTED;
    break;
  }
  default:
    a->kind = ONNX_ATTR_OTHER;
    break;
  }
  return FL_OK;
}

static char **dup_names(char *const *v, size_t n, fl_err *e) {
  char **out = calloc(n ? n : 1, sizeof *out);
  if (!out) {
    err_set(e, FL_ENOMEM, "out of memory");
    return NULL;
  }
  for (size_t i = 0; i < n; i++)
    if (!(out[i] = dup_str(v[i]))) {
      while (i-- > 0) free(out[i]);
      free(out);
      err_set(e, FL_ENOMEM, "out of memory");
      return NULL;
    }
  return out;
}

static int node_from_proto(const Onnx__NodeProto *p, const char *dir, onnx_node *nd, int depth,
                           fl_err *e) {
  char q[256], q2[128];
  memset(nd, 0, sizeof *nd);
  if (p->n_input > INT_MAX || p->n_output > INT_MAX || p->n_attribute > INT_MAX)
    return err_set(e, FL_EFORMAT, "node with too many inputs or outputs");
  if (!(nd->name = dup_str(p->name)) || !(nd->op_type = dup_str(p->op_type)) ||
      !(nd->domain = dup_str(p->domain)))
    return err_set(e, FL_ENOMEM, "out of memory");
  if (!nd->op_type[0])
    return err_set(e, FL_EFORMAT, "node '%s' has no op_type", quote(nd->name, q, sizeof q));
  if (!(nd->in = dup_names(p->input, p->n_input, e))) return e ? e->code : FL_ENOMEM;
  nd->nin = (int)p->n_input;
  if (!(nd->out = dup_names(p->output, p->n_output, e))) return e ? e->code : FL_ENOMEM;
  nd->nout = (int)p->n_output;
  if (!(nd->attr = calloc(p->n_attribute ? p->n_attribute : 1, sizeof *nd->attr)))
    return err_set(e, FL_ENOMEM, "out of memory");
  for (size_t i = 0; i < p->n_attribute; i++) {
    nd->nattr = (int)i + 1;
    if (attr_from_proto(p->attribute[i], dir, &nd->attr[i], depth, e) != FL_OK)
      return err_prefix(e, "node '%s' (%s)", quote(nd->name, q, sizeof q),
                        quote(nd->op_type, q2, sizeof q2));
    /* what a subgraph reads from outside is an input of its node */
    for (int j = 0; nd->attr[i].g && j < nd->attr[i].g->nfree; j++)
      if (add_name(&nd->implicit, &nd->nimplicit, nd->attr[i].g->free_names[j], e) != FL_OK)
        return e ? e->code : FL_ENOMEM;
  }
  return FL_OK;
}

/* Input j of node nd, its explicit inputs first, then the names its
** subgraphs read. */
static const char *node_input(const onnx_node *nd, int j) {
  return j < nd->nin ? nd->in[j] : nd->implicit[j - nd->nin];
}

/* Check names and order: every input made before use, one producer per
** value; then sort the nodes (Kahn, file order among ready nodes).  In a
** subgraph (sub) a name made nowhere in it comes from an enclosing scope:
** it is listed in m->free_names, for its node to read. */
static int check_and_sort(onnx_model *m, int sub, fl_err *e) {
  size_t nn = 0, cap = (size_t)m->nin + (size_t)m->ninit, k;
  name_ent *v;
  int *indeg = NULL, *start = NULL, *edges = NULL, *queue = NULL, rc = FL_OK;
  size_t nedge = 0, head = 0, tail = 0;
  onnx_node *sorted = NULL;
  char q[256], q2[256], q3[128];
  for (int i = 0; i < m->nnode; i++) cap += (size_t)m->node[i].nout;
  if (!(v = calloc(cap ? cap : 1, sizeof *v))) return err_set(e, FL_ENOMEM, "out of memory");
  for (int i = 0; i < m->ninit; i++) v[nn++] = (name_ent){m->init[i].name, -1};
  for (int i = 0; i < m->nin; i++) v[nn++] = (name_ent){m->in[i].name, -1};
  for (int i = 0; i < m->nnode; i++)
    for (int j = 0; j < m->node[i].nout; j++)
      if (m->node[i].out[j][0]) v[nn++] = (name_ent){m->node[i].out[j], i};
  qsort(v, nn, sizeof *v, by_name);
  for (k = 1; k < nn; k++)
    if (strcmp(v[k].name, v[k - 1].name) == 0) {
      const name_ent *a = &v[k - 1], *b = &v[k];
      if (a->producer < 0 && b->producer < 0) continue;   /* input given a default */
      rc = err_set(e, FL_EFORMAT, "value '%s' is produced twice%s%s%s",
                   quote(v[k].name, q, sizeof q),
                   b->producer >= 0 ? " (by node '" : "",
                   b->producer >= 0 ? quote(m->node[b->producer].name, q2, sizeof q2) : "",
                   b->producer >= 0 ? "')" : "");
      goto done;
    }
  indeg = calloc((size_t)m->nnode + 1, sizeof *indeg);
  start = calloc((size_t)m->nnode + 2, sizeof *start);
  queue = calloc((size_t)m->nnode + 1, sizeof *queue);
  if (!indeg || !start || !queue) { rc = err_set(e, FL_ENOMEM, "out of memory"); goto done; }
  /* inputs: known? counted per producer for the edge lists */
  for (int i = 0; i < m->nnode; i++) {
    const onnx_node *nd = &m->node[i];
    for (int j = 0; j < nd->nin + nd->nimplicit; j++) {
      const name_ent *f;
      const char *in = node_input(nd, j);
      if (!in[0]) continue;
      if (!(f = lookup(v, nn, in))) {
        if (sub) {
          if ((rc = add_name(&m->free_names, &m->nfree, in, e)) != FL_OK) goto done;
          continue;
        }
        rc = err_set(e, FL_EFORMAT, "node '%s' (%s): %s '%s' is not a graph input, an "
                     "initializer or any node's output", quote(nd->name, q, sizeof q),
                     quote(nd->op_type, q3, sizeof q3),
                     j < nd->nin ? "input" : "a value its subgraph reads", quote(in, q2, sizeof q2));
        goto done;
      }
      if (f->producer >= 0) {
        indeg[i]++;
        start[f->producer + 1]++;
        nedge++;
      }
    }
  }
  for (int i = 0; i < m->nnode; i++) start[i + 1] += start[i];
  if (!(edges = calloc(nedge ? nedge : 1, sizeof *edges))) {
    rc = err_set(e, FL_ENOMEM, "out of memory");
    goto done;
  }
  {
    int *fill = calloc((size_t)m->nnode + 1, sizeof *fill);
    if (!fill) { rc = err_set(e, FL_ENOMEM, "out of memory"); goto done; }
    for (int i = 0; i < m->nnode; i++)
      for (int j = 0; j < m->node[i].nin + m->node[i].nimplicit; j++) {
        const char *in = node_input(&m->node[i], j);
        const name_ent *f = in[0] ? lookup(v, nn, in) : NULL;
        if (f && f->producer >= 0) edges[start[f->producer] + fill[f->producer]++] = i;
      }
    free(fill);
  }
  for (int i = 0; i < m->nnode; i++)
    if (indeg[i] == 0) queue[tail++] = i;
  while (head < tail) {
    int i = queue[head++];
    for (int k2 = start[i]; k2 < start[i + 1]; k2++)
      if (--indeg[edges[k2]] == 0) queue[tail++] = edges[k2];
  }
  if (tail < (size_t)m->nnode) {
    for (int i = 0; i < m->nnode; i++)
      if (indeg[i] > 0) {
        rc = err_set(e, FL_EFORMAT, "node '%s' (%s) is on a cycle: the graph has no order",
                     quote(m->node[i].name, q, sizeof q), quote(m->node[i].op_type, q3, sizeof q3));
        break;
      }
    goto done;
  }
  for (int i = 0; i < m->nout; i++)
    if (!lookup(v, nn, m->out[i].name)) {
      if (sub) {
        if ((rc = add_name(&m->free_names, &m->nfree, m->out[i].name, e)) != FL_OK) goto done;
        continue;
      }
      rc = err_set(e, FL_EFORMAT, "graph output '%s' is not produced by any node",
                   quote(m->out[i].name, q, sizeof q));
      goto done;
    }
  if (!(sorted = calloc((size_t)m->nnode + 1, sizeof *sorted))) {
    rc = err_set(e, FL_ENOMEM, "out of memory");
    goto done;
  }
  for (int i = 0; i < m->nnode; i++) sorted[i] = m->node[queue[i]];
  free(m->node);
  m->node = sorted;
done:
  free(v);
  free(indeg);
  free(start);
  free(edges);
  free(queue);
  return rc;
}

/* Where m keeps its import of domain d, one of those beside ai.onnx whose
** ops load (*max its newest version when max is given); NULL for others. */
static int64_t *domain_opset(onnx_model *m, const char *d, int *max) {
  static const struct { const char *name; int max; size_t at; } known[] = {
    {ONNX_TRAINING_DOMAIN, ONNX_MAX_TRAINING_OPSET, offsetof(onnx_model, training_opset)},
    {ONNX_PREVIEW_DOMAIN, ONNX_MAX_PREVIEW_OPSET, offsetof(onnx_model, preview_opset)},
    {ONNX_ML_DOMAIN, ONNX_MAX_ML_OPSET, offsetof(onnx_model, ml_opset)},
  };
  size_t i;
  for (i = 0; i < sizeof known / sizeof *known; i++)
    if (strcmp(d, known[i].name) == 0) {
      if (max) *max = known[i].max;
      return (int64_t *)((char *)m + known[i].at);
    }
  return NULL;
}

static int model_from_proto(const Onnx__ModelProto *p, const char *dir, onnx_model *m,
                            fl_err *e) {
  const Onnx__GraphProto *g = p->graph;
  char q[256];
  int have_opset = 0;
  if (!g) return err_set(e, FL_EFORMAT, "the model has no graph");
  m->ir_version = p->has_ir_version ? p->ir_version : 0;
  for (size_t i = 0; i < p->n_opset_import; i++) {
    const char *d = p->opset_import[i]->domain ? p->opset_import[i]->domain : "";
    int64_t ver = p->opset_import[i]->has_version ? p->opset_import[i]->version : 0;
    int64_t *at;
    int max;
    if ((at = domain_opset(m, d, &max))) {
      if (ver < 1 || ver > max) {
        if (max == 1)
          return err_set(e, FL_EUNSUPPORTED, "opset %lld of %s is unsupported (1 known)", (long long)ver,
                         quote(d, q, sizeof q));
        return err_set(e, FL_EUNSUPPORTED, "opset %lld of %s is unsupported (1 to %d known)",
                       (long long)ver, quote(d, q, sizeof q), max);
      }
      *at = ver;
      continue;
    }
    if (d[0] && strcmp(d, "ai.onnx") != 0) continue;   /* judged where a node uses it */
    if (ver < 1 || ver > ONNX_ABSURD_OPSET)
      return err_set(e, FL_EUNSUPPORTED, "opset %lld of ai.onnx is unsupported (1 to %d known)",
                     (long long)ver, ONNX_MAX_OPSET);
    m->opset = ver;
    have_opset = 1;
  }
  /* a model of another domain's ops alone (optimizers, previews, ML)
  ** imports no ai.onnx: its ai.onnx nodes, if any, are refused where they
  ** are lowered */
  if (!have_opset && !m->training_opset && !m->preview_opset && !m->ml_opset) {
    if (p->n_opset_import)
      return err_set(e, FL_EUNSUPPORTED, "the model imports no ai.onnx opset (only '%s'): "
                     "unsupported domain", quote(p->opset_import[0]->domain, q, sizeof q));
    return err_set(e, FL_EFORMAT, "the model imports no opset");
  }
  {
    size_t n = strlen(p->producer_name ? p->producer_name : "") +
               strlen(p->producer_version ? p->producer_version : "") + 2;
    if (!(m->producer = malloc(n))) return err_set(e, FL_ENOMEM, "out of memory");
    snprintf(m->producer, n, "%s%s%s", p->producer_name ? p->producer_name : "",
             p->producer_version && p->producer_version[0] ? " " : "",
             p->producer_version ? p->producer_version : "");
  }
  return graph_from_proto(g, dir, m, 0, e);
}

/* The graph g (the model's, depth 0, or a subgraph nested depth deep)
** into m: its values, initializers and sorted nodes. */
static int graph_from_proto(const Onnx__GraphProto *g, const char *dir, onnx_model *m,
                            int depth, fl_err *e) {
  char q[256], q2[128], q3[128];
  int rc;
  if (!(m->name = dup_str(g->name))) return err_set(e, FL_ENOMEM, "out of memory");
  if (g->n_sparse_initializer)
    return err_set(e, FL_EUNSUPPORTED, "sparse initializers are unsupported");
  if (g->n_initializer > INT_MAX || g->n_input > INT_MAX || g->n_output > INT_MAX ||
      g->n_node > INT_MAX)
    return err_set(e, FL_EFORMAT, "graph too large");
  if (!(m->init = calloc(g->n_initializer + 1, sizeof *m->init)) ||
      !(m->in = calloc(g->n_input + 1, sizeof *m->in)) ||
      !(m->out = calloc(g->n_output + 1, sizeof *m->out)) ||
      !(m->node = calloc(g->n_node + 1, sizeof *m->node)))
    return err_set(e, FL_ENOMEM, "out of memory");
  for (size_t i = 0; i < g->n_initializer; i++) {
    if (!g->initializer[i]->name || !g->initializer[i]->name[0])
      return err_set(e, FL_EFORMAT, "initializer %zu has no name", i);
    if ((rc = tensor_from_proto(g->initializer[i], dir, &m->init[i], e)) != FL_OK) return rc;
    m->ninit = (int)i + 1;
  }
  /* graph inputs that are initializers too (IR < 4 lists them) are
  ** weights with a default, not inputs of the call */
  for (size_t i = 0; i < g->n_input; i++) {
    int is_init = 0;
    for (int j = 0; j < m->ninit && !is_init; j++)
      is_init = g->input[i]->name && strcmp(g->input[i]->name, m->init[j].name) == 0;
    if (is_init) continue;
    if ((rc = value_from_proto(g->input[i], &m->in[m->nin], "input", e)) != FL_OK) {
      value_free(&m->in[m->nin]);
      return rc;
    }
    m->nin++;
  }
  for (size_t i = 0; i < g->n_output; i++) {
    if ((rc = value_from_proto(g->output[i], &m->out[i], "output", e)) != FL_OK) {
      value_free(&m->out[i]);
      return rc;
    }
    m->nout = (int)i + 1;
  }
  for (size_t i = 0; i < g->n_node; i++) {
    onnx_node *nd = &m->node[i];
    rc = node_from_proto(g->node[i], dir, nd, depth, e);
    m->nnode = (int)i + 1;
    if (rc != FL_OK) return rc;
    if (nd->domain[0] && strcmp(nd->domain, "ai.onnx") != 0 && !domain_opset(m, nd->domain, NULL))
      return err_set(e, FL_EUNSUPPORTED, "node '%s' (%s): domain '%s' is unsupported (only "
                     "ai.onnx, " ONNX_ML_DOMAIN ", " ONNX_PREVIEW_DOMAIN " and " ONNX_TRAINING_DOMAIN ")",
                     quote(nd->name, q, sizeof q),
                     quote(nd->op_type, q2, sizeof q2), quote(nd->domain, q3, sizeof q3));
  }
  if (m->nout == 0) return err_set(e, FL_EFORMAT, "the graph has no outputs");
  return check_and_sort(m, depth > 0, e);
}

int onnx_parse(const void *buf, size_t n, const char *dir, onnx_model *m, fl_err *e) {
  Onnx__ModelProto *p;
  int rc;
  memset(m, 0, sizeof *m);
  if (!buf && n) return err_set(e, FL_EINVAL, "onnx: no buffer");
  if (n == 0) return err_set(e, FL_EFORMAT, "onnx: empty file");
  if (!(p = onnx__model_proto__unpack(NULL, n, buf)))
    return err_set(e, FL_EFORMAT, "onnx: not a valid ONNX model (truncated or malformed "
                   "protobuf)");
  rc = model_from_proto(p, dir, m, e);
  onnx__model_proto__free_unpacked(p, NULL);
  if (rc != FL_OK) {
    onnx_model_free(m);
    err_prefix(e, "onnx");
  }
  return rc;
}

/* The whole of a regular file, at most limit bytes, into a new buffer. */
static int read_all(const char *path, uint64_t limit, unsigned char **out, size_t *n, fl_err *e) {
  uint64_t size;
  size_t done = 0;
  int fd, rc;
  *out = NULL;
  *n = 0;
  if ((rc = file_open_read(path, &fd, &size, e)) != FL_OK) return rc;
  if (size > limit) {
    close(fd);
    return err_set(e, FL_EFORMAT, "%llu bytes, over the %llu-byte limit",
                   (unsigned long long)size, (unsigned long long)limit);
  }
  if (!(*out = malloc(size ? (size_t)size : 1))) {
    close(fd);
    return err_set(e, FL_ENOMEM, "out of memory (%llu bytes)", (unsigned long long)size);
  }
  while (done < size) {
    ssize_t r = read(fd, *out + done, (size_t)size - done);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) {
      rc = err_set(e, FL_EIO, "%s", r < 0 ? strerror(errno) : "file shrank while reading");
      free(*out);
      *out = NULL;
      close(fd);
      return rc;
    }
    done += (size_t)r;
  }
  close(fd);
  *n = done;
  return FL_OK;
}

int onnx_load(const char *path, onnx_model *m, fl_err *e) {
  unsigned char *buf;
  size_t n;
  char q[512], *dir;
  const char *slash;
  int rc;
  memset(m, 0, sizeof *m);
  if (!path) return err_set(e, FL_EINVAL, "no path");
  if ((rc = read_all(path, ONNX_MAX_FILE, &buf, &n, e)) != FL_OK) {
    if (strncmp(e ? e->msg : "", path, strlen(path)) != 0)
      err_prefix(e, "%s", err_quote(path, q, sizeof q));
    return rc;
  }
  slash = strrchr(path, '/');
  dir = slash ? strndup(path, (size_t)(slash - path) + (slash == path)) : strdup(".");
  if (!dir) {
    free(buf);
    return err_set(e, FL_ENOMEM, "out of memory");
  }
  rc = onnx_parse(buf, n, dir, m, e);
  free(buf);
  free(dir);
  if (rc != FL_OK) err_prefix(e, "%s", err_quote(path, q, sizeof q));
  return rc;
}

int onnx_tensor_parse(const void *buf, size_t n, onnx_tensor *t, fl_err *e) {
  TensorProto *p;
  int rc;
  memset(t, 0, sizeof *t);
  if (!buf && n) return err_set(e, FL_EINVAL, "onnx: no buffer");
  if (!(p = onnx__tensor_proto__unpack(NULL, n, buf)))
    return err_set(e, FL_EFORMAT, "onnx: not a valid TensorProto (truncated or malformed "
                   "protobuf)");
  rc = tensor_from_proto(p, NULL, t, e);
  onnx__tensor_proto__free_unpacked(p, NULL);
  if (rc != FL_OK) err_prefix(e, "onnx");
  return rc;
}

int onnx_tensor_load(const char *path, onnx_tensor *t, fl_err *e) {
  unsigned char *buf;
  size_t n;
  char q[512];
  int rc;
  memset(t, 0, sizeof *t);
  if ((rc = read_all(path, ONNX_MAX_FILE, &buf, &n, e)) != FL_OK) {
    if (strncmp(e ? e->msg : "", path, strlen(path)) != 0)
      err_prefix(e, "%s", err_quote(path, q, sizeof q));
    return rc;
  }
  rc = onnx_tensor_parse(buf, n, t, e);
  free(buf);
  if (rc != FL_OK) err_prefix(e, "%s", err_quote(path, q, sizeof q));
  return rc;
}

/* ---- test data: sequences and optionals --------------------------------- */

void onnx_data_free(onnx_data *d) {
  if (!d) return;
  for (size_t i = 0; i < d->n; i++) onnx_tensor_free(&d->t[i]);
  free(d->t);
  memset(d, 0, sizeof *d);
}

/* A varint at *p (below end) into *v; -1 past the end or over 10 bytes. */
static int wire_varint(const unsigned char **p, const unsigned char *end, uint64_t *v) {
  *v = 0;
  for (int s = 0; s < 70 && *p < end; s += 7) {
    unsigned char b = *(*p)++;
    *v |= (uint64_t)(b & 0x7f) << s;
    if (!(b & 0x80)) return 0;
  }
  return -1;
}

/* The elements (fields 3 to 7: tensors, sparse tensors, sequences, maps,
** optionals) a SequenceProto or OptionalProto image [p, p+n) holds, at
** every level (its sequences, field 5, and optionals, field 7, are these
** messages again), added to *count.  Reads the wire format only,
** allocating nothing: protobuf-c would allocate a message for each, and
** recurse once per level, before anything here could check them.
** -1: malformed (the unpacking then says so); -2: nested deeper than
** ONNX_MAX_DEPTH. */
static int wire_count(const unsigned char *p, size_t n, int depth, size_t *count) {
  const unsigned char *end = p + n;
  if (depth > ONNX_MAX_DEPTH) return -2;
  while (p < end) {
    uint64_t key, len;
    if (wire_varint(&p, end, &key)) return -1;
    if (key >> 3 >= 3 && key >> 3 <= 7) (*count)++;
    switch (key & 7) {
    case 0: if (wire_varint(&p, end, &len)) return -1; break;
    case 1: if ((size_t)(end - p) < 8) return -1; p += 8; break;
    case 5: if ((size_t)(end - p) < 4) return -1; p += 4; break;
    case 2: {
      int rc;
      if (wire_varint(&p, end, &len) || len > (uint64_t)(end - p)) return -1;
      if ((key >> 3 == 5 || key >> 3 == 7) && (rc = wire_count(p, (size_t)len, depth + 1, count)) != 0)
        return rc;
      p += len;
      break;
    }
    default: return -1;
    }
  }
  return 0;
}

/* A SequenceProto's tensors into d (its count checked by the caller). */
static int sequence_from_proto(const Onnx__SequenceProto *p, onnx_data *d, fl_err *e) {
  int elem = p->has_elem_type ? p->elem_type : 0;
  if (p->n_sparse_tensor_values || p->n_sequence_values || p->n_optional_values ||
      (elem && elem != ONNX__SEQUENCE_PROTO__DATA_TYPE__TENSOR))
    return err_set(e, FL_EUNSUPPORTED, "sequence: elements other than tensors are unsupported");
  if (!(d->t = calloc(p->n_tensor_values ? p->n_tensor_values : 1, sizeof *d->t)))
    return err_set(e, FL_ENOMEM, "out of memory");
  for (size_t i = 0; i < p->n_tensor_values; i++) {
    int rc = tensor_from_proto(p->tensor_values[i], NULL, &d->t[i], e);
    if (rc != FL_OK) return err_prefix(e, "sequence element %zu", i);
    d->n = i + 1;
    if (d->t[i].elem != d->t[0].elem)
      return err_set(e, FL_EFORMAT, "sequence: elements of dtypes %s and %s",
                     onnx_dtype_name(d->t[0].elem), onnx_dtype_name(d->t[i].elem));
  }
  return FL_OK;
}

int onnx_data_parse(const void *buf, size_t n, int kind, onnx_data *d, fl_err *e) {
  size_t count = 0;
  int rc = FL_OK;
  memset(d, 0, sizeof *d);
  d->kind = kind;
  d->inner = -1;
  if (!buf && n) return err_set(e, FL_EINVAL, "onnx: no buffer");
  if (kind == ONNX_KIND_TENSOR) {
    d->has = 1;
    d->inner = ONNX_KIND_TENSOR;
    if (!(d->t = calloc(1, sizeof *d->t))) return err_set(e, FL_ENOMEM, "onnx: out of memory");
    if ((rc = onnx_tensor_parse(buf, n, d->t, e)) != FL_OK) {
      onnx_data_free(d);
      return rc;
    }
    d->n = 1;
    return FL_OK;
  }
  /* the number of elements before protobuf-c allocates a pointer and a
  ** message for each (an empty one takes two bytes of the file) */
  if (wire_count(buf, n, 0, &count) == -2)
    return err_set(e, FL_EUNSUPPORTED, "onnx: sequences and optionals nested more than %d deep "
                   "are unsupported", ONNX_MAX_DEPTH);
  if (count > ONNX_MAX_SEQUENCE)
    return err_set(e, FL_EUNSUPPORTED, "onnx: %zu sequence or optional elements: more than %d are "
                   "unsupported", count, ONNX_MAX_SEQUENCE);
  if (kind == ONNX_KIND_SEQUENCE) {
    Onnx__SequenceProto *p = onnx__sequence_proto__unpack(NULL, n, buf);
    if (!p) return err_set(e, FL_EFORMAT, "onnx: not a valid SequenceProto (truncated or "
                           "malformed protobuf)");
    d->has = 1;
    d->inner = ONNX_KIND_SEQUENCE;
    rc = sequence_from_proto(p, d, e);
    onnx__sequence_proto__free_unpacked(p, NULL);
  } else if (kind == ONNX_KIND_OPTIONAL) {
    Onnx__OptionalProto *p = onnx__optional_proto__unpack(NULL, n, buf);
    int elem;
    if (!p) return err_set(e, FL_EFORMAT, "onnx: not a valid OptionalProto (truncated or "
                           "malformed protobuf)");
    elem = p->has_elem_type ? p->elem_type : 0;
    if (p->sparse_tensor_value || p->optional_value ||
        (elem && elem != ONNX__OPTIONAL_PROTO__DATA_TYPE__TENSOR &&
         elem != ONNX__OPTIONAL_PROTO__DATA_TYPE__SEQUENCE)) {
      rc = err_set(e, FL_EUNSUPPORTED, "optional: contents other than a tensor or a sequence "
                   "are unsupported");
    } else if (p->tensor_value && p->sequence_value) {
      rc = err_set(e, FL_EFORMAT, "optional: holds both a tensor and a sequence");
    } else if (p->tensor_value) {
      d->has = 1;
      d->inner = ONNX_KIND_TENSOR;
      if (!(d->t = calloc(1, sizeof *d->t))) rc = err_set(e, FL_ENOMEM, "out of memory");
      else if ((rc = tensor_from_proto(p->tensor_value, NULL, d->t, e)) == FL_OK) d->n = 1;
    } else if (p->sequence_value) {
      d->has = 1;
      d->inner = ONNX_KIND_SEQUENCE;
      rc = sequence_from_proto(p->sequence_value, d, e);
    }
    onnx__optional_proto__free_unpacked(p, NULL);
  } else {
    return err_set(e, FL_EINVAL, "onnx: value kind %d", kind);
  }
  if (rc != FL_OK) {
    onnx_data_free(d);
    err_prefix(e, "onnx");
  }
  return rc;
}

int onnx_data_load(const char *path, int kind, onnx_data *d, fl_err *e) {
  unsigned char *buf;
  size_t n;
  char q[512];
  int rc;
  memset(d, 0, sizeof *d);
  if ((rc = read_all(path, ONNX_MAX_FILE, &buf, &n, e)) != FL_OK) {
    if (strncmp(e ? e->msg : "", path, strlen(path)) != 0)
      err_prefix(e, "%s", err_quote(path, q, sizeof q));
    return rc;
  }
  rc = onnx_data_parse(buf, n, kind, d, e);
  free(buf);
  if (rc != FL_OK) {
    onnx_data_free(d);
    err_prefix(e, "%s", err_quote(path, q, sizeof q));
  }
  return rc;
}
