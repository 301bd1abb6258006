/*
** fuzz_image.c -- libFuzzer target for the image decoders (io/image.c over
** libjpeg, libpng, libtiff, libwebp and OpenJPEG).  The first byte picks
** the pixel format, the rest is the encoded image.  Any byte string must
** either decode into h * w * c pixels within the size limit or fail with a
** message; the sanitizers turn out-of-bounds reads, overflows, leaks and
** undefined behaviour into crashes.  Built and run by tests/fuzz/fuzz.sh.
*/
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include "io/image.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  image im;
  fl_err e = {0};
  if (size < 1) return 0;
  if (image_decode(data + 1, size - 1, (image_pixels)(data[0] % 3), &im, &e) == FL_OK) {
    size_t n = im.h * im.w * im.c;
    volatile unsigned char sink = 0;
    if (!im.px || n == 0 || n > IMAGE_MAX_BYTES || (im.c != 1 && im.c != 3)) __builtin_trap();
    for (size_t i = 0; i < n; i++) sink ^= im.px[i];   /* a short allocation shows under ASan */
    (void)sink;
    free(im.px);
  } else if (e.msg[0] == '\0' || im.px != NULL) {
    __builtin_trap();   /* a failure must say why and leave nothing behind */
  }
  return 0;
}
