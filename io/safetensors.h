/*
** safetensors.h -- the safetensors weight format (Hugging Face), so model
** weights move to and from PyTorch.  A file is an 8-byte little-endian
** header length N, N bytes of JSON
**   {"name": {"dtype": "F32", "shape": [2, 3], "data_offsets": [0, 24]},
**    ..., "__metadata__": {"key": "value"}}
** then the tensors' bytes (little endian, C order), offsets relative to the
** end of the header.  Supported dtypes: F32, F16, BF16, I64, BOOL.
*/
#ifndef FL_SAFETENSORS_H
#define FL_SAFETENSORS_H

#include "graph/tensor.h"

/* Largest header accepted (the reference implementation's limit too). */
#define ST_MAX_HEADER 100000000u

/* One named tensor of a file. */
typedef struct st_tensor {
  char *name;      /* owned by the list; NUL-terminated */
  fl_tensor t;     /* one storage reference, owned by the list */
} st_tensor;

/* One "__metadata__" entry (string to string). */
typedef struct st_meta {
  char *key;       /* owned by the list; NUL-terminated */
  char *value;     /* owned by the list; NUL-terminated */
} st_meta;

/* What a file holds, in file order of the data (ascending offsets), and
** its metadata in header order. */
typedef struct st_list {
  st_tensor *v;    /* owned */
  size_t n;
  st_meta *meta;   /* owned */
  size_t nmeta;
} st_list;

/* Release every name, tensor and metadata entry of l and clear it;
** accepts NULL and an empty list. */
void st_list_free(st_list *l);

/* Parse a whole image of n bytes.  On success *out owns the tensors (free
** with st_list_free); on failure *out is empty and e says
** "safetensors: <what was wrong>", naming the tensor when one is at fault.
** Every offset, length, dtype and shape is checked before anything is
** allocated, so a hostile image cannot make us read out of bounds or
** allocate more than it contains. */
int st_parse(const void *buf, size_t n, st_list *out, fl_err *e);

/* st_parse for a file; messages read "<path>: safetensors: ...".  A
** regular file only (a FIFO or device fails at once); the header is read
** first, checked against the file's size, then each tensor straight into
** its storage. */
int st_load(const char *path, st_list *out, fl_err *e);

/* st_load with the file mapped (private, copy on write) instead of read:
** each tensor whose bytes are aligned for its dtype is a view of the
** mapping, the others are copied; the mapping goes with the last view.
** Pages are read when first touched.  A file truncated by someone else
** while mapped makes those reads fault (SIGBUS): map only files you
** control (a downloaded checkpoint); st_load reads them all at once. */
int st_load_mapped(const char *path, st_list *out, fl_err *e);

/* Write n tensors under their names (both only read; any strides, CPU
** tensors) to path, sorted by name, the header padded with spaces so the
** data starts 8-byte aligned, "__metadata__" {"format": "pt"}.  Duplicate
** or empty names are FL_EINVAL.  The file appears complete or not at all
** (temp file in the same directory, then rename: file_create, which keeps
** a replaced file's mode, writes through a symlink and refuses a FIFO,
** device or directory at path). */
int st_save(const char *path, const char *const *names,
            const fl_tensor *const *tensors, size_t n, fl_err *e);

/* st_save with nmeta metadata entries keys[i] = values[i] (only read)
** beside "format": "pt" (a "format" key given replaces it).  Empty or
** duplicate keys are FL_EINVAL. */
int st_save_meta(const char *path, const char *const *names,
                 const fl_tensor *const *tensors, size_t n, const char *const *keys,
                 const char *const *values, size_t nmeta, fl_err *e);

/* st_save of a whole list (e.g. one st_load returned), its metadata too. */
int st_save_list(const char *path, const st_list *l, fl_err *e);

#endif
