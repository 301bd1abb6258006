/*
** tensor.c -- tensor metadata over reference-counted storage.
** Invariants: a storage's refs equals the number of tensors holding it,
** and its data is freed exactly when the last one lets go; every element
** a tensor's shape/strides/offset can address lies inside its storage;
** no size arithmetic reaches malloc before meta_check_size has proved it
** fits in FL_MAX_ALLOC.
*/
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "hostpool.h"
#include "tensor.h"

/* --- sizes --------------------------------------------------------------- */

/* Saturates at INT64_MAX instead of overflowing (the metadata may come
** straight from a user before meta_check_size has seen it). */
int64_t meta_numel(const fl_meta *m) {
  int64_t n = 1;
  int d;
  for (d = 0; d < m->ndim; d++) {
    int64_t s = m->shape[d];
    if (s <= 0) return 0;
    if (!sz_mul(n, s, &n)) n = INT64_MAX;
  }
  return n;
}

char *meta_shape_str(const fl_meta *m, char *buf, size_t n) {
  size_t used = 0;
  int d;
  if (!buf || n == 0) return buf;
  buf[0] = '\0';
  used += (size_t)snprintf(buf, n, "[");
  for (d = 0; d < m->ndim && used < n; d++)
    used += (size_t)snprintf(buf + used, n - used, "%s%lld", d ? "," : "",
                             (long long)m->shape[d]);
  if (used < n) snprintf(buf + used, n - used, "]");
  return buf;
}

int meta_same_shape(const fl_meta *a, const fl_meta *b) {
  int d;
  if (a->ndim != b->ndim) return 0;
  for (d = 0; d < a->ndim; d++)
    if (a->shape[d] != b->shape[d]) return 0;
  return 1;
}

/* "what: " or nothing, so ten_empty's messages read well after a caller's
** err_prefix */
static const char *sep(const char *what) { return (what && *what) ? ": " : ""; }

int meta_check_extent(const fl_meta *m, const char *what, fl_err *e) {
  char sh[160];
  double prod = 1.0;
  int64_t n = 1;
  int d, over = 0;
  if (!what) what = "";
  if (m->ndim < 0 || m->ndim > FL_MAX_DIMS)
    return err_set(e, FL_EINVAL, "%s%s%d dimensions, at most %d are supported",
                   what, sep(what), m->ndim, FL_MAX_DIMS);
  for (d = 0; d < m->ndim; d++)
    if (m->shape[d] < 0)
      return err_set(e, FL_EINVAL, "%s%snegative dimension %lld in shape %s",
                     what, sep(what), (long long)m->shape[d],
                     meta_shape_str(m, sh, sizeof sh));
  for (d = 0; d < m->ndim; d++) {
    int64_t s = m->shape[d] > 0 ? m->shape[d] : 1;
    prod *= (double)s;
    if (!sz_mul(n, s, &n) || n > FL_MAX_EXTENT) over = 1;
  }
  if (over)
    return err_set(e, FL_EINVAL, "%s%sshape %s is too large: its sizes "
                   "multiply to %.4g, at most 2^62 = %lld is supported",
                   what, sep(what), meta_shape_str(m, sh, sizeof sh), prod,
                   (long long)FL_MAX_EXTENT);
  return FL_OK;
}

int meta_check_size(const fl_meta *m, const char *what, fl_err *e) {
  double elems = 1.0;
  int64_t n;
  size_t bytes;
  int d;
  if (!what) what = "";
  if (m->dtype < 0 || m->dtype >= FL_NDTYPES)
    return err_set(e, FL_EINVAL, "%s%sunknown dtype %d", what, sep(what),
                   (int)m->dtype);
  if (m->ndim < 0 || m->ndim > FL_MAX_DIMS)
    return meta_check_extent(m, what, e);
  for (d = 0; d < m->ndim; d++) elems *= (double)m->shape[d];
  n = meta_numel(m);     /* saturates: INT64_MAX never fits below */
  for (d = 0; d < m->ndim; d++)
    if (m->shape[d] < 0) return meta_check_extent(m, what, e);
  if (!sz_bytes(n, dtype_size(m->dtype), &bytes))
    return err_set(e, FL_ENOMEM,
                   "%s%scannot allocate %.0f bytes (%g elements of %s)",
                   what, sep(what), elems * (double)dtype_size(m->dtype),
                   elems, dtype_name(m->dtype));
  return meta_check_extent(m, what, e);
}

/* --- lifetime ---------------------------------------------------------------- */

static struct {
  void *(*alloc)(size_t);
  void *(*alloc_uninit)(size_t);
  void (*release)(void *);
  const char *(*name)(void);
} allocators[2];

void ten_set_allocator(fl_device d, void *(*alloc)(size_t nbytes),
                       void *(*alloc_uninit)(size_t nbytes),
                       void (*release)(void *data), const char *(*name)(void)) {
  if (d == FL_DEV_CPU || d == FL_DEV_CUDA) {
    allocators[d].alloc = alloc;
    allocators[d].alloc_uninit = alloc_uninit ? alloc_uninit : alloc;
    allocators[d].release = release;
    allocators[d].name = name;
  }
}

/* A small buffer from malloc's heap, on a 64-byte line from 64 bytes up:
** malloc's 16-byte alignment makes every 64-byte vector load or store of
** a kernel straddle two cache lines (a quarter slower, measured on a row
** scratch: cpu/codegen.c). */
static void *heap_alloc(size_t n, int zero) {
  void *p;
  if (n < 64) return zero ? calloc(1, n ? n : 1) : malloc(n ? n : 1);
  if (posix_memalign(&p, 64, n) != 0) return NULL;
  if (zero) memset(p, 0, n);
  return p;
}

/* Host storage: big buffers from the pool (their pages stay mapped from
** one call's outputs to the next), small ones from malloc's heap. */
static void *cpu_alloc(size_t n) {
  return n >= HOSTPOOL_MIN ? hostpool_alloc(n, 1) : heap_alloc(n, 1);
}

static void cpu_release(void *p, size_t n) {
  if (n >= HOSTPOOL_MIN) hostpool_free(p, n);
  else free(p);
}

int ten_poison_uninit(void) {
  static int poison = -1;
  if (poison < 0) {
    const char *v = getenv("FUSELAB_POISON_UNINIT");
    poison = v && *v && strcmp(v, "0") != 0;
  }
  return poison;
}

/* Host memory a kernel will overwrite whole: no zero-fill pass (calloc
** clears reused heap memory, an extra write of every byte of a call's
** outputs); poisoned for the tests (ten_poison_uninit). */
static void *cpu_alloc_uninit(size_t n) {
  void *p = n >= HOSTPOOL_MIN ? hostpool_alloc(n, 0) : heap_alloc(n, 0);
  if (p && ten_poison_uninit()) memset(p, 0xFF, n);
  return p;
}

static uint64_t storage_ids;   /* the last storage id handed out */
static void (*free_hook)(uint64_t id);

void ten_set_free_hook(void (*hook)(uint64_t id)) { free_hook = hook; }

/* Plain loads and stores, no locked add: ten_set calls this per element
** (the reference interpreter), and two threads writing one storage at
** once may lose one step but still leave it at a version no copy has. */
void ten_wrote(fl_tensor *t) {
  if (t && t->st)
    __atomic_store_n(&t->st->version, __atomic_load_n(&t->st->version, __ATOMIC_RELAXED) + 1,
                     __ATOMIC_RELAXED);
}

/* A storage record with one reference and a fresh id over data (NULL:
** set by the caller), or NULL when out of memory. */
static fl_storage *storage_new(void *data, size_t nbytes, fl_device dev) {
  fl_storage *st = calloc(1, sizeof *st);
  if (!st) return NULL;
  st->refs = 1;
  st->device = dev;
  st->nbytes = nbytes;
  st->data = data;
  st->id = __atomic_add_fetch(&storage_ids, 1, __ATOMIC_RELAXED);
  return st;
}

/* *t is overwritten, never released: the caller owns what it held.  On
** success *t holds the only reference to a fresh storage, zero-filled
** when zero is set. */
static int alloc_storage(fl_tensor *t, const fl_meta *m, int zero, fl_err *e) {
  void *(*alloc)(size_t) = zero ? cpu_alloc : cpu_alloc_uninit;
  fl_storage *st;
  size_t nbytes;
  int rc;
  memset(t, 0, sizeof *t);
  if ((rc = meta_check_size(m, NULL, e)) != FL_OK) return rc;
  if (!sz_bytes(meta_numel(m), dtype_size(m->dtype), &nbytes))
    return err_set(e, FL_ENOMEM, "cannot allocate %lld elements of %s",
                   (long long)meta_numel(m), dtype_name(m->dtype));
  if (m->device != FL_DEV_CPU && m->device != FL_DEV_CUDA)
    return err_set(e, FL_EINVAL, "unknown device %d", (int)m->device);
  if (allocators[m->device].alloc)
    alloc = zero ? allocators[m->device].alloc : allocators[m->device].alloc_uninit;
  else if (m->device != FL_DEV_CPU)
    return err_set(e, FL_ENODEV, "no CUDA device: cannot allocate %zu bytes "
                   "there", nbytes);
  if (!(st = storage_new(NULL, nbytes, m->device)))
    return err_set(e, FL_ENOMEM, "cannot allocate %zu bytes", sizeof *st);
  st->data = alloc(nbytes);
  if (!st->data && m->device != FL_DEV_CPU) {
    free(st);
    return err_set(e, FL_ENOMEM, "out of device memory on %s: cannot allocate %zu bytes "
                   "(%.1f MiB, %lld elements of %s)",
                   allocators[m->device].name ? allocators[m->device].name() : "cuda",
                   nbytes, (double)nbytes / 1048576.0, (long long)meta_numel(m),
                   dtype_name(m->dtype));
  }
  if (!st->data) {
    free(st);
    return err_set(e, FL_ENOMEM, "cannot allocate %zu bytes (%lld elements of %s)",
                   nbytes, (long long)meta_numel(m), dtype_name(m->dtype));
  }
  t->m = *m;
  t->offset = 0;
  t->st = st;
  ten_set_contiguous_strides(t);
  return FL_OK;
}

int ten_empty(fl_tensor *t, const fl_meta *m, fl_err *e) { return alloc_storage(t, m, 1, e); }

int ten_mapped(fl_tensor *t, void *base, size_t len, void *data, size_t nbytes, fl_err *e) {
  fl_storage *st = storage_new(data, nbytes, FL_DEV_CPU);
  memset(t, 0, sizeof *t);
  if (!st) return err_set(e, FL_ENOMEM, "cannot allocate %zu bytes", sizeof *st);
  st->map_base = base;
  st->map_len = len;
  t->m.ndim = 1;
  t->m.shape[0] = (int64_t)nbytes;
  t->m.dtype = FL_BOOL;         /* one byte per element */
  t->m.device = FL_DEV_CPU;
  t->st = st;
  ten_set_contiguous_strides(t);
  return FL_OK;
}
int ten_uninit(fl_tensor *t, const fl_meta *m, fl_err *e) { return alloc_storage(t, m, 0, e); }

void ten_release(fl_tensor *t) {
  if (!t) return;
  if (t->st && --t->st->refs <= 0) {
    fl_storage *st = t->st;
    if (st->kept && free_hook) free_hook(st->id);
    if (st->map_base) {
      munmap(st->map_base, st->map_len);
      free(st);
      memset(t, 0, sizeof *t);
      return;
    }
    /* device memory without a registered release is leaked rather than
    ** handed to free(), which would crash */
    if ((st->device == FL_DEV_CPU || st->device == FL_DEV_CUDA) &&
        allocators[st->device].release)
      allocators[st->device].release(st->data);
    else if (st->device == FL_DEV_CPU) cpu_release(st->data, st->nbytes);
    free(st);
  }
  memset(t, 0, sizeof *t);
}

/* dst is overwritten, not released; it ends holding its own reference.
** dst == src is allowed and adds a reference. */
void ten_share(fl_tensor *dst, const fl_tensor *src) {
  if (dst != src) *dst = *src;
  if (dst->st) dst->st->refs++;
}

/* Within FL_MAX_EXTENT the products are exact; metadata no check has
** seen saturates rather than overflowing (its strides are never used to
** address memory: nothing of that size was allocated). */
void ten_set_contiguous_strides(fl_tensor *t) {
  int64_t s = 1;
  int d;
  for (d = t->m.ndim - 1; d >= 0; d--) {
    t->stride[d] = s;
    if (!sz_mul(s, t->m.shape[d] > 0 ? t->m.shape[d] : 1, &s)) s = INT64_MAX;
  }
}

/* --- queries --------------------------------------------------------------- */

/* Size-1 dims may have any stride and an empty tensor is contiguous, as in
** PyTorch: neither changes which bytes hold which element. */
int ten_is_contiguous(const fl_tensor *t) {
  int64_t expect = 1;
  int d;
  if (meta_numel(&t->m) == 0) return 1;
  for (d = t->m.ndim - 1; d >= 0; d--) {
    if (t->m.shape[d] == 1) continue;
    if (t->stride[d] != expect) return 0;
    expect *= t->m.shape[d];
  }
  return 1;
}

void *ten_data(const fl_tensor *t) {
  if (!t->st || !t->st->data) return NULL;
  return (char *)t->st->data + t->offset * (int64_t)dtype_size(t->m.dtype);
}

void *ten_elem_ptr(const fl_tensor *t, int64_t i) {
  int64_t off = t->offset;
  int d;
  for (d = t->m.ndim - 1; d >= 0; d--) {
    int64_t s = t->m.shape[d];
    if (s <= 0) return NULL;
    off += (i % s) * t->stride[d];
    i /= s;
  }
  return (char *)t->st->data + off * (int64_t)dtype_size(t->m.dtype);
}

double ten_get(const fl_tensor *t, int64_t i) {
  return dtype_load(t->m.dtype, ten_elem_ptr(t, i));
}

void ten_set(fl_tensor *t, int64_t i, double v) {
  ten_wrote(t);
  dtype_store(t->m.dtype, ten_elem_ptr(t, i), v);
}

int64_t ten_get_i64(const fl_tensor *t, int64_t i) {
  return dtype_load_i64(t->m.dtype, ten_elem_ptr(t, i));
}

void ten_set_i64(fl_tensor *t, int64_t i, int64_t v) {
  ten_wrote(t);
  dtype_store_i64(t->m.dtype, ten_elem_ptr(t, i), v);
}

/* --- strided loops ------------------------------------------------------------ */

/* Two tensors' worth of strides over one shape, with adjacent dims merged
** wherever both operands are contiguous across them, so the innermost row
** is as long as possible. */
typedef struct loop2 {
  int nd;
  int64_t shape[FL_MAX_DIMS];
  int64_t sa[FL_MAX_DIMS], sb[FL_MAX_DIMS];
} loop2;

static void loop_init(loop2 *l, const fl_meta *m, const int64_t *sa,
                      const int64_t *sb) {
  int d;
  l->nd = 0;
  for (d = 0; d < m->ndim; d++) {
    if (m->shape[d] == 1) continue;            /* contributes nothing */
    if (l->nd > 0) {
      int k = l->nd - 1;
      if (l->sa[k] == sa[d] * m->shape[d] && l->sb[k] == sb[d] * m->shape[d]) {
        l->shape[k] *= m->shape[d];
        l->sa[k] = sa[d];
        l->sb[k] = sb[d];
        continue;
      }
    }
    l->shape[l->nd] = m->shape[d];
    l->sa[l->nd] = sa[d];
    l->sb[l->nd] = sb[d];
    l->nd++;
  }
  if (l->nd == 0) {   /* a scalar or all size-1: one row of one element */
    l->nd = 1;
    l->shape[0] = 1;
    l->sa[0] = l->sb[0] = 0;
  }
}

typedef void (*row_fn)(char *a, int64_t sa, const char *b, int64_t sb,
                       int64_t n, const void *ctx);

/* Calls row(a, b) for each innermost row; strides here are in bytes. */
static void loop_run(const loop2 *l, char *a, const char *b, row_fn row,
                     const void *ctx) {
  int64_t idx[FL_MAX_DIMS] = {0};
  int last = l->nd - 1, d;
  for (;;) {
    row(a, l->sa[last], b, l->sb[last], l->shape[last], ctx);
    for (d = last - 1; d >= 0; d--) {
      a += l->sa[d];
      b += l->sb[d];
      if (++idx[d] < l->shape[d]) break;
      a -= l->sa[d] * l->shape[d];
      b -= l->sb[d] * l->shape[d];
      idx[d] = 0;
    }
    if (d < 0) return;
  }
}

typedef struct conv_ctx { fl_dtype to, from; } conv_ctx;

#define COPY_ROW(T)                                                         \
  for (i = 0; i < n; i++)                                                   \
    *(T *)(void *)(a + i * sa) = *(const T *)(const void *)(b + i * sb)

static void copy_row(char *a, int64_t sa, const char *b, int64_t sb, int64_t n,
                     const void *vctx) {
  const conv_ctx *c = vctx;
  int64_t i;
  if (c->to == c->from) {
    size_t es = dtype_size(c->to);
    /* a run of elements on both sides (a transposed head's rows): memcpy
    ** moves it in vectors, where the strided loop below cannot */
    if (sa == (int64_t)es && sb == (int64_t)es) { memcpy(a, b, (size_t)n * es); return; }
    switch (es) {
    case 1: COPY_ROW(uint8_t); return;
    case 2: COPY_ROW(uint16_t); return;
    case 4: COPY_ROW(uint32_t); return;
    default: COPY_ROW(uint64_t); return;
    }
  }
  /* the common float conversions directly; everything else through double,
  ** which is exact for every value our types hold except huge int64s */
  if (c->from == FL_F32 && c->to == FL_F16) {
    for (i = 0; i < n; i++) {
      float f; uint16_t h;
      memcpy(&f, b + i * sb, 4);
      h = f32_to_f16(f);
      memcpy(a + i * sa, &h, 2);
    }
  } else if (c->from == FL_F16 && c->to == FL_F32) {
    for (i = 0; i < n; i++) {
      uint16_t h; float f;
      memcpy(&h, b + i * sb, 2);
      f = f16_to_f32(h);
      memcpy(a + i * sa, &f, 4);
    }
  } else {
    for (i = 0; i < n; i++)
      dtype_store(c->to, a + i * sa, dtype_load(c->from, b + i * sb));
  }
}

/* --- data movement ----------------------------------------------------------- */

int ten_broadcast_to(fl_tensor *out, const fl_tensor *src, int ndim,
                     const int64_t *shape, fl_err *e) {
  fl_tensor r;
  int d, lead;
  char a[160], b[160];
  fl_meta want;
  memset(&want, 0, sizeof want);
  want.ndim = ndim < 0 ? 0 : ndim > FL_MAX_DIMS ? FL_MAX_DIMS : ndim;
  for (d = 0; d < want.ndim; d++) want.shape[d] = shape[d];
  if (ndim < src->m.ndim || ndim > FL_MAX_DIMS)
    return err_set(e, FL_EINVAL, "broadcast_to: cannot broadcast %s to %s",
                   meta_shape_str(&src->m, a, sizeof a),
                   meta_shape_str(&want, b, sizeof b));
  r = *src;
  r.m.ndim = ndim;
  lead = ndim - src->m.ndim;
  for (d = 0; d < ndim; d++) {
    int sd = d - lead;
    r.m.shape[d] = shape[d];
    if (shape[d] < 0)
      return err_set(e, FL_EINVAL, "broadcast_to: negative size in target %s",
                     meta_shape_str(&want, b, sizeof b));
    if (sd < 0) r.stride[d] = 0;
    else if (src->m.shape[sd] == shape[d]) r.stride[d] = src->stride[sd];
    else if (src->m.shape[sd] == 1) r.stride[d] = 0;
    else
      return err_set(e, FL_EINVAL, "broadcast_to: cannot broadcast %s to %s "
                     "(size %lld vs %lld)", meta_shape_str(&src->m, a, sizeof a),
                     meta_shape_str(&want, b, sizeof b),
                     (long long)src->m.shape[sd], (long long)shape[d]);
  }
  r.m.wrapped = 0;
  ten_share(out, &r);   /* out may be src itself: r was built first */
  return FL_OK;
}

/* Takes no ownership.  When dst and src share storage in different layouts
** src is first copied aside, so an overlapping copy reads the old values. */
int ten_copy(fl_tensor *dst, const fl_tensor *src, fl_err *e) {
  fl_tensor b, tmp;
  loop2 l;
  conv_ctx c;
  int64_t n, sa[FL_MAX_DIMS], sb[FL_MAX_DIMS];
  int64_t ea, eb;
  int d, rc;
  if ((dst->st && dst->st->device != FL_DEV_CPU) ||
      (src->st && src->st->device != FL_DEV_CPU))
    return err_set(e, FL_EUNSUPPORTED, "copy_: only CPU tensors are copied here");
  /* writing through a broadcast view would store many values into one
  ** element; PyTorch refuses it too */
  for (d = 0; d < dst->m.ndim; d++)
    if (dst->stride[d] == 0 && dst->m.shape[d] > 1)
      return err_set(e, FL_EINVAL, "copy_: the destination is an expanded "
                     "view (several of its elements share one memory "
                     "location); make it contiguous first");
  if ((rc = ten_broadcast_to(&b, src, dst->m.ndim, dst->m.shape, e)) != FL_OK) {
    err_prefix(e, "copy_");
    return rc;
  }
  n = meta_numel(&dst->m);
  if (n == 0) { ten_release(&b); return FL_OK; }
  if (!dst->st || !b.st) {
    ten_release(&b);
    return err_set(e, FL_EINVAL, "copy_: tensor has no storage");
  }
  ten_wrote(dst);
  memset(&tmp, 0, sizeof tmp);
  if (dst->st == b.st) {
    int same = dst->offset == b.offset && dst->m.dtype == b.m.dtype;
    for (d = 0; same && d < dst->m.ndim; d++)
      same = dst->m.shape[d] == 1 || dst->stride[d] == b.stride[d];
    if (same) { ten_release(&b); return FL_OK; }
    rc = ten_uninit(&tmp, &b.m, e);
    if (rc == FL_OK) rc = ten_copy(&tmp, &b, e);
    ten_release(&b);
    if (rc != FL_OK) { ten_release(&tmp); return err_prefix(e, "copy_"); }
    ten_share(&b, &tmp);
    ten_release(&tmp);
  }
  if (dst->m.dtype == b.m.dtype && ten_is_contiguous(dst) &&
      ten_is_contiguous(&b)) {
    memcpy(ten_data(dst), ten_data(&b), (size_t)n * dtype_size(dst->m.dtype));
    ten_release(&b);
    return FL_OK;
  }
  ea = (int64_t)dtype_size(dst->m.dtype);
  eb = (int64_t)dtype_size(b.m.dtype);
  for (d = 0; d < dst->m.ndim; d++) {
    sa[d] = dst->stride[d] * ea;
    sb[d] = b.stride[d] * eb;
  }
  /* merging needs element strides to compare extents; bytes scale both
  ** sides equally, so merging on byte strides is the same test */
  loop_init(&l, &dst->m, sa, sb);
  c.to = dst->m.dtype;
  c.from = b.m.dtype;
  loop_run(&l, ten_data(dst), ten_data(&b), copy_row, &c);
  ten_release(&b);
  return FL_OK;
}

/* *out is overwritten (not released) and ends with its own reference. */
int ten_contiguous(fl_tensor *out, const fl_tensor *src, fl_err *e) {
  fl_tensor r;
  int rc;
  if (ten_is_contiguous(src)) {
    r = *src;
    ten_set_contiguous_strides(&r);   /* normalize strides of size-1 dims */
    ten_share(out, &r);
    return FL_OK;
  }
  if ((rc = ten_uninit(&r, &src->m, e)) != FL_OK) {   /* the copy writes it all */
    memset(out, 0, sizeof *out);
    return rc;
  }
  if ((rc = ten_copy(&r, src, e)) != FL_OK) {
    ten_release(&r);
    memset(out, 0, sizeof *out);
    return rc;
  }
  *out = r;
  return FL_OK;
}

static void fill_row(char *a, int64_t sa, const char *b, int64_t sb, int64_t n,
                     const void *ctx) {
  size_t size = *(const size_t *)ctx;
  int64_t i;
  (void)sb;
  for (i = 0; i < n; i++) memcpy(a + i * sa, b, size);
}

/* CPU tensors only; a tensor without storage or elements is left alone. */
void ten_fill(fl_tensor *t, double v) {
  unsigned char pat[8];
  int64_t sa[FL_MAX_DIMS], sb[FL_MAX_DIMS] = {0};
  size_t size = dtype_size(t->m.dtype);
  loop2 l;
  int d;
  if (!t->st || !t->st->data || t->st->device != FL_DEV_CPU ||
      meta_numel(&t->m) == 0)
    return;
  ten_wrote(t);
  dtype_store(t->m.dtype, pat, v);
  for (d = 0; d < t->m.ndim; d++) sa[d] = t->stride[d] * (int64_t)size;
  loop_init(&l, &t->m, sa, sb);
  loop_run(&l, ten_data(t), (const char *)pat, fill_row, &size);
}
