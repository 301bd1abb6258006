/*
** tensor.h -- tensor metadata over reference-counted storage.
** A tensor is a small value (shape, strides, offset) plus one counted
** reference to its storage; views share storage and differ only in the
** metadata.  Strides and offset are in elements, not bytes.
*/
#ifndef FL_TENSOR_H
#define FL_TENSOR_H

#include <stdint.h>
#include <stddef.h>

#include "dtype.h"
#include "err.h"
#include "size.h"

#define FL_MAX_DIMS 8

typedef enum fl_device { FL_DEV_CPU, FL_DEV_CUDA } fl_device;

/* What shape inference and the graph know of a value: no data. */
typedef struct fl_meta {
  fl_dtype dtype;
  fl_device device;
  int ndim;                        /* 0 for a scalar */
  int wrapped;                     /* a Lua number made a 0-dim tensor:
                                      weakest in type promotion */
  int64_t shape[FL_MAX_DIMS];
} fl_meta;

typedef struct fl_storage {
  int refs;            /* tensors (and buffers) holding this storage */
  fl_device device;
  size_t nbytes;
  void *data;          /* owned; freed with the last reference */
  uint64_t id;         /* unique in the process, never reused */
  uint64_t version;    /* counts in-place writes (ten_wrote) */
  int kept;            /* something derived from it is kept elsewhere: the
                          free hook hears when it goes (ten_set_free_hook) */
  void *map_base;      /* a file mapped (ten_mapped): unmapped, not freed */
  size_t map_len;
} fl_storage;

typedef struct fl_tensor {
  fl_meta m;
  int64_t stride[FL_MAX_DIMS];     /* elements */
  int64_t offset;                  /* elements from st->data */
  fl_storage *st;                  /* one counted reference, or NULL */
} fl_tensor;

/* --- sizes ------------------------------------------------------------ */
int64_t meta_numel(const fl_meta *m);
/* "[2,3]" (or "[]" for a scalar) into buf; returns buf */
char *meta_shape_str(const fl_meta *m, char *buf, size_t n);
int meta_same_shape(const fl_meta *a, const fl_meta *b);
/* Checks every dim is >= 0 and the sizes multiply (a 0 counting as 1) to
** at most FL_MAX_EXTENT: what every tensor, view or not, must satisfy.
** The message names what (e.g. "expand") and the shape. */
int meta_check_extent(const fl_meta *m, const char *what, fl_err *e);
/* meta_check_extent, and the element count and byte size fit in
** FL_MAX_ALLOC; the message names what (e.g. "zeros") and the size. */
int meta_check_size(const fl_meta *m, const char *what, fl_err *e);

/* --- lifetime --------------------------------------------------------- */
/* Allocate a contiguous tensor of the given metadata into *t (whose old
** contents are not released).  Data is zero-filled.  On failure *t is left
** empty (st == NULL) and e names the byte size. */
int ten_empty(fl_tensor *t, const fl_meta *m, fl_err *e);
/* The same without the zero-fill, for memory a kernel overwrites whole
** (every eager and compiled kernel's output, copies). */
int ten_uninit(fl_tensor *t, const fl_meta *m, fl_err *e);
/* A CPU storage over nbytes at data inside the mapping [base, base + len)
** (mmap'ed by the caller), which it then owns: the last reference unmaps
** it.  *t is a 1-d uint8 tensor over the whole storage, for views to share
** (ten_share, then set meta, strides and offset). */
int ten_mapped(fl_tensor *t, void *base, size_t len, void *data, size_t nbytes, fl_err *e);
/* 1 when FUSELAB_POISON_UNINIT is set (the test suite sets it): every
** device's ten_uninit memory is then filled with 0xFF bytes, NaN as float,
** so a kernel that leaves an element unwritten gives a wrong answer. */
int ten_poison_uninit(void);
/* Drop t's storage reference and clear it; accepts an empty tensor. */
void ten_release(fl_tensor *t);
/* *dst becomes another reference to src's storage, same metadata. */
void ten_share(fl_tensor *dst, const fl_tensor *src);
/* How a backend's device memory is obtained (alloc: zero-filled, for
** ten_empty; alloc_uninit: as it comes, for ten_uninit, NULL to use alloc;
** both NULL on failure) and given back, and the device's name for an
** out-of-memory message; CPU storage uses hostpool.c and malloc unless
** replaced.  Storage of a device with no allocator cannot be created. */
void ten_set_allocator(fl_device d, void *(*alloc)(size_t nbytes),
                       void *(*alloc_uninit)(size_t nbytes),
                       void (*release)(void *data), const char *(*name)(void));
/* Fill contiguous strides for t->m (does not touch storage). */
void ten_set_contiguous_strides(fl_tensor *t);

/* --- queries ---------------------------------------------------------- */
int ten_is_contiguous(const fl_tensor *t);
/* Pointer to element 0 (storage data + offset) */
void *ten_data(const fl_tensor *t);
/* Byte address of the element at logical row-major index i. */
void *ten_elem_ptr(const fl_tensor *t, int64_t i);
/* Element at logical row-major index i, through double (slow; oracle). */
double ten_get(const fl_tensor *t, int64_t i);
void ten_set(fl_tensor *t, int64_t i, double v);
/* The same as an exact integer (int64 values beyond 2^53 stay whole). */
int64_t ten_get_i64(const fl_tensor *t, int64_t i);
void ten_set_i64(fl_tensor *t, int64_t i, int64_t v);

/* t's values are about to change in place: its storage's version moves
** on, so what was derived from the old values (a product's packed copy
** of a weight, cpu/mm.c) is not used again.  Every in-place writer calls
** it: the Lua methods (copy_, fill_, zero_, add_ and the rest, slice
** assignment), ten_copy, ten_fill, ten_set, ten_set_i64 themselves, and
** the executor for the buffers it keeps from call to call and for a
** caller's tensor it writes a result into (exec/program.c). */
void ten_wrote(fl_tensor *t);
/* hook(id) runs as a storage whose kept flag is set is freed (one hook:
** products' packed weights, cpu/mm.c). */
void ten_set_free_hook(void (*hook)(uint64_t id));

/* --- data movement ---------------------------------------------------- */
/* Copy src into dst elementwise, converting dtype; src must broadcast to
** dst's shape.  Works for any strides on both sides. */
int ten_copy(fl_tensor *dst, const fl_tensor *src, fl_err *e);
/* *out = a contiguous tensor with src's values: a shared reference when
** src is already contiguous, else a fresh copy. */
int ten_contiguous(fl_tensor *out, const fl_tensor *src, fl_err *e);
/* Fill every element of t with v (converted to t's dtype). */
void ten_fill(fl_tensor *t, double v);

/* --- views (no copy; the result shares storage) ----------------------- */
/* View src with strides such that it broadcasts to shape (ndim dims).
** Broadcast dims get stride 0. */
int ten_broadcast_to(fl_tensor *out, const fl_tensor *src, int ndim,
                     const int64_t *shape, fl_err *e);

#endif
