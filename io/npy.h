/*
** npy.h -- NumPy .npy files (format versions 1.0-3.0), so tensors move to
** and from NumPy and PyTorch.  float32, float16, int64 and bool, little
** endian; C or Fortran order on load; always C order on save.  bfloat16
** (which NumPy lacks) is saved as float32.
*/
#ifndef FL_NPY_H
#define FL_NPY_H

#include "graph/tensor.h"

/* Parse a whole .npy image of n bytes into a new contiguous tensor *out.
** Every header field and the data length are checked; a malformed or
** truncated image is FL_EFORMAT with a message saying what was wrong. */
int npy_parse(const void *buf, size_t n, fl_tensor *out, fl_err *e);
/* npy_parse for a file: a regular file only (a FIFO or device is
** FL_EIO at once), the header read and checked against the file's size
** before any data.  Messages read "load: <path>: <why>". */
int npy_load(const char *path, fl_tensor *out, fl_err *e);
/* Write t (any strides) to path, replacing a regular file atomically and
** keeping its mode; a symlink is written through; a FIFO, device or
** directory at path is refused (file_create).  "save: <path>: <why>". */
int npy_save(const char *path, const fl_tensor *t, fl_err *e);

#endif
