/*
** image.h -- encoded images (BMP, JPEG, JPEG 2000, PNG, PNM, TIFF, WebP)
** decoded to 8-bit pixels, for ONNX's ImageDecoder.  The format is found
** from the bytes' signature alone.  The pixels are those Pillow gives
** (ONNX's reference decodes with it): the same libraries with their
** defaults, and Pillow's own conversion to grayscale.
**
** The bytes are untrusted: every header field is checked, the decoded
** size is bounded (IMAGE_MAX_BYTES) before anything is allocated, and a
** library's error ends the decode with a message, never the process.
*/
#ifndef FL_IMAGE_H
#define FL_IMAGE_H

#include <stddef.h>

#include "graph/err.h"

/* The largest decoded image, H * W * 4 bytes (the widest buffer a
** decoder fills): 256 MiB, e.g. 8192 x 8192 RGBA. */
#define IMAGE_MAX_BYTES ((size_t)1 << 28)

typedef enum image_pixels {
  IMAGE_RGB,    /* [H, W, 3] */
  IMAGE_BGR,    /* [H, W, 3], channels reversed */
  IMAGE_GRAY    /* [H, W, 1]: Pillow's convert("L") of the RGB image */
} image_pixels;

typedef struct image {
  unsigned char *px;   /* h * w * c bytes, row-major; free() it */
  size_t h, w, c;
} image;

/* Decode the n bytes at buf into *out.  FL_EFORMAT: not an image of a
** known signature, or malformed or truncated (the message says which);
** FL_EUNSUPPORTED: a valid image this build cannot decode as Pillow
** would (its library not built in, alpha, 16-bit gray, palettes...);
** FL_EINVAL: larger than IMAGE_MAX_BYTES.  On failure out->px is NULL. */
int image_decode(const void *buf, size_t n, image_pixels want, image *out, fl_err *e);
/* "JPEG", "PNG"... of the n bytes at buf by signature, or NULL. */
const char *image_format(const void *buf, size_t n);

#endif
