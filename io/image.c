/*
** image.c -- encoded images to 8-bit pixels (see image.h).  JPEG, PNG,
** TIFF, WebP and JPEG 2000 go through the libraries Pillow itself uses
** (libjpeg, libpng, libtiff, libwebp, OpenJPEG) with their defaults; BMP
** and PNM are read here.  Each library is optional at build time: a
** format whose library is missing is FL_EUNSUPPORTED naming it.
**
** What Pillow's np.array(img) would give in a mode other than RGB or L
** (alpha, palettes with transparency, 16-bit gray, CMYK) is refused
** rather than guessed: ImageDecoder's outputs have 3 channels (1 for
** Grayscale).
*/
#ifdef HAVE_CONFIG_H
#include "config.h"
#endif

#include <limits.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "io/image.h"

#ifdef HAVE_LIBJPEG
#include <jpeglib.h>
#endif
#ifdef HAVE_LIBPNG
#include <png.h>
#endif
#ifdef HAVE_LIBTIFF
#include <tiffio.h>
#endif
#ifdef HAVE_LIBWEBP
#include <webp/decode.h>
#endif
#ifdef HAVE_LIBOPENJP2
#include <openjpeg.h>
#endif

enum { F_NONE, F_BMP, F_JPEG, F_JP2, F_J2K, F_PNG, F_PNM, F_TIFF, F_WEBP };

static int sniff(const unsigned char *b, size_t n) {
  if (n >= 3 && b[0] == 0xFF && b[1] == 0xD8 && b[2] == 0xFF) return F_JPEG;
  if (n >= 8 && memcmp(b, "\x89PNG\r\n\x1a\n", 8) == 0) return F_PNG;
  if (n >= 2 && b[0] == 'B' && b[1] == 'M') return F_BMP;
  if (n >= 2 && b[0] == 'P' && (b[1] == '5' || b[1] == '6')) return F_PNM;
  if (n >= 4 && (memcmp(b, "II*\0", 4) == 0 || memcmp(b, "MM\0*", 4) == 0)) return F_TIFF;
  if (n >= 12 && memcmp(b, "RIFF", 4) == 0 && memcmp(b + 8, "WEBP", 4) == 0) return F_WEBP;
  if (n >= 12 && memcmp(b, "\0\0\0\x0cjP  \r\n\x87\n", 12) == 0) return F_JP2;
  if (n >= 4 && memcmp(b, "\xff\x4f\xff\x51", 4) == 0) return F_J2K;
  return F_NONE;
}

static const char *const format_names[] = {
  NULL, "BMP", "JPEG", "JPEG 2000", "JPEG 2000", "PNG", "PNM", "TIFF", "WebP"
};

const char *image_format(const void *buf, size_t n) {
  return format_names[sniff((const unsigned char *)buf, n)];
}

/* Dimensions checked before any allocation: w * h * 4 (the widest
** buffer a decoder fills) within IMAGE_MAX_BYTES. */
static int check_size(const char *fmt, size_t w, size_t h, fl_err *e) {
  if (w == 0 || h == 0)
    return err_set(e, FL_EFORMAT, "%s: an empty image (%zu x %zu)", fmt, w, h);
  if (w > IMAGE_MAX_BYTES / 4 / h)
    return err_set(e, FL_EINVAL, "%s: %zu x %zu pixels is larger than the limit of %zu MiB decoded",
                   fmt, w, h, IMAGE_MAX_BYTES >> 20);
  return FL_OK;
}

/* The decoded pixels (c = 1 gray or 3 RGB, h * w * 3 bytes allocated) in
** the channels asked for.  Gray from RGB is Pillow's convert("L"): ITU-R
** 601-2 luma in 16-bit fixed point, rounded. */
static void finish(image *out, unsigned char *px, size_t h, size_t w, size_t c, image_pixels want) {
  size_t n = h * w, i;
  if (c == 3 && want == IMAGE_GRAY) {
    for (i = 0; i < n; i++) {
      const unsigned char *p = px + 3 * i;
      px[i] = (unsigned char)((p[0] * 19595u + p[1] * 38470u + p[2] * 7471u + 0x8000u) >> 16);
    }
    c = 1;
  } else if (c == 1 && want != IMAGE_GRAY) {
    for (i = n; i-- > 0;) px[3 * i] = px[3 * i + 1] = px[3 * i + 2] = px[i];
    c = 3;
  }
  if (want == IMAGE_BGR)
    for (i = 0; i < n; i++) {
      unsigned char t = px[3 * i];
      px[3 * i] = px[3 * i + 2];
      px[3 * i + 2] = t;
    }
  out->px = px;
  out->h = h;
  out->w = w;
  out->c = c;
}

static unsigned char *alloc_px(const char *fmt, size_t h, size_t w, fl_err *e) {
  unsigned char *px = (unsigned char *)malloc(h * w * 3);
  if (!px) err_set(e, FL_ENOMEM, "%s: out of memory for %zu x %zu pixels", fmt, w, h);
  return px;
}

/* ---------------------------------------------------------------------- */
/* BMP: uncompressed 24- and 32-bit (BGR, BGRX), as Pillow's "RGB" mode    */
/* ---------------------------------------------------------------------- */

static uint32_t le32(const unsigned char *p) {
  return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static int dec_bmp(const unsigned char *b, size_t n, image_pixels want, image *out, fl_err *e) {
  uint32_t off, hsz, comp;
  int32_t iw, ih;
  unsigned bpp;
  size_t w, h, stride, bytes, y, x;
  int rc;
  unsigned char *px;
  if (n < 14 + 40) return err_set(e, FL_EFORMAT, "BMP: truncated header (%zu bytes)", n);
  off = le32(b + 10);
  hsz = le32(b + 14);
  if (hsz != 40 && hsz != 52 && hsz != 56 && hsz != 108 && hsz != 124)
    return err_set(e, FL_EUNSUPPORTED, "BMP: a %u-byte info header (only Windows BMP 3 to 5 are read)", (unsigned)hsz);
  iw = (int32_t)le32(b + 18);
  ih = (int32_t)le32(b + 22);
  bpp = (unsigned)b[28] | (unsigned)b[29] << 8;
  comp = le32(b + 30);
  if ((b[26] | b[27] << 8) != 1) return err_set(e, FL_EFORMAT, "BMP: planes must be 1");
  if (comp != 0 || (bpp != 24 && bpp != 32))
    return err_set(e, FL_EUNSUPPORTED, "BMP: %u bits per pixel, compression %u (only uncompressed 24 and 32 bits are read)",
                   bpp, (unsigned)comp);
  if (iw <= 0 || ih == 0 || ih == INT32_MIN)
    return err_set(e, FL_EFORMAT, "BMP: bad dimensions %ld x %ld", (long)iw, (long)ih);
  w = (size_t)iw;
  h = ih < 0 ? (size_t)-(int64_t)ih : (size_t)ih;
  if ((rc = check_size("BMP", w, h, e)) != FL_OK) return rc;
  stride = (w * bpp / 8 + 3) & ~(size_t)3;
  bytes = stride * h;
  if (off < 14 + hsz || off > n || n - off < bytes)
    return err_set(e, FL_EFORMAT, "BMP: pixel data truncated or out of bounds (offset %u, %zu bytes needed, %zu in the file)",
                   (unsigned)off, bytes, n);
  if (!(px = alloc_px("BMP", h, w, e))) return e->code;
  for (y = 0; y < h; y++) {
    /* rows are stored bottom-up unless the height is negative */
    const unsigned char *row = b + off + stride * (ih > 0 ? h - 1 - y : y);
    unsigned char *o = px + 3 * w * y;
    for (x = 0; x < w; x++) {
      const unsigned char *p = row + x * (bpp / 8);
      o[3 * x] = p[2];
      o[3 * x + 1] = p[1];
      o[3 * x + 2] = p[0];
    }
  }
  finish(out, px, h, w, 3, want);
  return FL_OK;
}

/* ---------------------------------------------------------------------- */
/* PNM: binary P5 (gray) and P6 (RGB) with maxval 255                     */
/* ---------------------------------------------------------------------- */

/* The next header number after whitespace and comments, or -1. */
static long pnm_num(const unsigned char *b, size_t n, size_t *pos) {
  long v = 0;
  int digits = 0;
  for (;;) {
    if (*pos >= n) return -1;
    if (b[*pos] == '#') {
      while (*pos < n && b[*pos] != '\n' && b[*pos] != '\r') (*pos)++;
    } else if (b[*pos] == ' ' || b[*pos] == '\t' || b[*pos] == '\n' || b[*pos] == '\r'
               || b[*pos] == '\v' || b[*pos] == '\f') {
      (*pos)++;
    } else {
      break;
    }
  }
  while (*pos < n && b[*pos] >= '0' && b[*pos] <= '9') {
    if (v > 100000000) return -1;
    v = v * 10 + (b[*pos] - '0');
    (*pos)++;
    digits++;
  }
  return digits ? v : -1;
}

static int dec_pnm(const unsigned char *b, size_t n, image_pixels want, image *out, fl_err *e) {
  size_t pos = 2, c = b[1] == '6' ? 3 : 1, w, h, bytes;
  long iw, ih, maxval;
  int rc;
  unsigned char *px;
  iw = pnm_num(b, n, &pos);
  ih = pnm_num(b, n, &pos);
  maxval = pnm_num(b, n, &pos);
  if (iw < 0 || ih < 0 || maxval < 0 || pos >= n)
    return err_set(e, FL_EFORMAT, "PNM: malformed or truncated header");
  if (maxval != 255)
    return err_set(e, FL_EUNSUPPORTED, "PNM: maxval %ld (only 255 is read)", maxval);
  pos++;   /* the one whitespace character before the pixels */
  w = (size_t)iw;
  h = (size_t)ih;
  if ((rc = check_size("PNM", w, h, e)) != FL_OK) return rc;
  bytes = w * h * c;
  if (n - pos < bytes)
    return err_set(e, FL_EFORMAT, "PNM: pixel data truncated (%zu bytes needed, %zu left)", bytes, n - pos);
  if (!(px = alloc_px("PNM", h, w, e))) return e->code;
  memcpy(px, b + pos, bytes);
  finish(out, px, h, w, c, want);
  return FL_OK;
}

/* ---------------------------------------------------------------------- */
/* JPEG (libjpeg): islow DCT, fancy upsampling, as Pillow decodes          */
/* ---------------------------------------------------------------------- */

#ifdef HAVE_LIBJPEG
struct jpeg_fail {
  struct jpeg_error_mgr pub;
  jmp_buf jb;
  char msg[JMSG_LENGTH_MAX];
};

static void jpeg_fail_exit(j_common_ptr ci) {
  struct jpeg_fail *f = (struct jpeg_fail *)ci->err;
  (*ci->err->format_message)(ci, f->msg);
  longjmp(f->jb, 1);
}

/* A warning is corrupt data libjpeg papers over: a truncated scan decodes
** as gray (Pillow refuses those files: "image file is truncated"), stray
** bytes before a marker are skipped (Pillow decodes on).  Either way the
** pixels are suspect, so any warning is an error here. */
static void jpeg_fail_emit(j_common_ptr ci, int level) {
  if (level < 0) jpeg_fail_exit(ci);
}

static int dec_jpeg(const unsigned char *b, size_t n, image_pixels want, image *out, fl_err *e) {
  struct jpeg_decompress_struct ci;
  struct jpeg_fail f;
  unsigned char *volatile px = NULL;
  size_t w, h, c;
  int rc;
  ci.err = jpeg_std_error(&f.pub);
  f.pub.error_exit = jpeg_fail_exit;
  f.pub.emit_message = jpeg_fail_emit;
  f.msg[0] = '\0';
  if (setjmp(f.jb)) {
    jpeg_destroy_decompress(&ci);
    free(px);
    return err_set(e, FL_EFORMAT, "JPEG: %s", f.msg);
  }
  jpeg_create_decompress(&ci);
  /* a progressive image's coefficients are held whole: bound them too */
  ci.mem->max_memory_to_use = 2 * (long)IMAGE_MAX_BYTES;
  jpeg_mem_src(&ci, b, (unsigned long)n);
  if (jpeg_read_header(&ci, TRUE) != JPEG_HEADER_OK) {
    jpeg_destroy_decompress(&ci);
    return err_set(e, FL_EFORMAT, "JPEG: no image in the stream");
  }
  if (ci.jpeg_color_space == JCS_CMYK || ci.jpeg_color_space == JCS_YCCK) {
    jpeg_destroy_decompress(&ci);
    return err_set(e, FL_EUNSUPPORTED, "JPEG: CMYK images (Pillow's mode CMYK has 4 channels)");
  }
  c = ci.num_components == 1 ? 1 : 3;
  ci.out_color_space = c == 1 ? JCS_GRAYSCALE : JCS_RGB;
  ci.dct_method = JDCT_ISLOW;
  ci.do_fancy_upsampling = TRUE;
  w = ci.image_width;
  h = ci.image_height;
  if ((rc = check_size("JPEG", w, h, e)) != FL_OK) {
    jpeg_destroy_decompress(&ci);
    return rc;
  }
  jpeg_start_decompress(&ci);
  if (ci.output_width != w || ci.output_height != h || (size_t)ci.output_components != c) {
    jpeg_destroy_decompress(&ci);
    return err_set(e, FL_EFORMAT, "JPEG: unexpected output geometry");
  }
  if (!(px = alloc_px("JPEG", h, w, e))) {
    jpeg_destroy_decompress(&ci);
    return e->code;
  }
  while (ci.output_scanline < ci.output_height) {
    JSAMPROW row = px + (size_t)ci.output_scanline * w * c;
    jpeg_read_scanlines(&ci, &row, 1);
  }
  jpeg_finish_decompress(&ci);
  jpeg_destroy_decompress(&ci);
  finish(out, px, h, w, c, want);
  return FL_OK;
}
#endif

/* ---------------------------------------------------------------------- */
/* PNG (libpng)                                                           */
/* ---------------------------------------------------------------------- */

#ifdef HAVE_LIBPNG
struct png_src {
  const unsigned char *b;
  size_t n, pos;
  char msg[512];
  char warn[200];   /* the first warning: libpng's cause of an invalid header */
};

static void png_src_read(png_structp png, png_bytep data, size_t len) {
  struct png_src *s = (struct png_src *)png_get_io_ptr(png);
  if (s->n - s->pos < len) png_error(png, "truncated data");
  memcpy(data, s->b + s->pos, len);
  s->pos += len;
}

static void png_src_error(png_structp png, png_const_charp msg) {
  struct png_src *s = (struct png_src *)png_get_error_ptr(png);
  if (s->warn[0]) snprintf(s->msg, sizeof s->msg, "%s (%s)", msg, s->warn);
  else snprintf(s->msg, sizeof s->msg, "%s", msg);
  png_longjmp(png, 1);
}

static void png_src_warning(png_structp png, png_const_charp msg) {
  struct png_src *s = (struct png_src *)png_get_error_ptr(png);
  if (!s->warn[0]) snprintf(s->warn, sizeof s->warn, "%s", msg);
}

static int dec_png(const unsigned char *b, size_t n, image_pixels want, image *out, fl_err *e) {
  struct png_src s = {b, n, 0, "", ""};
  png_structp png;
  png_infop info = NULL;
  unsigned char *volatile px = NULL;
  png_bytep *volatile rows = NULL;
  png_uint_32 pw, ph;
  int depth, ctype;
  size_t w, h, c, y;
  volatile int rc = FL_OK;
  png = png_create_read_struct(PNG_LIBPNG_VER_STRING, &s, png_src_error, png_src_warning);
  if (!png || !(info = png_create_info_struct(png))) {
    png_destroy_read_struct(&png, NULL, NULL);
    return err_set(e, FL_ENOMEM, "PNG: out of memory");
  }
  if (setjmp(png_jmpbuf(png))) {
    png_destroy_read_struct(&png, &info, NULL);
    free(px);
    free(rows);
    return rc != FL_OK ? rc : err_set(e, FL_EFORMAT, "PNG: %s", s.msg);
  }
  png_set_read_fn(png, &s, png_src_read);
  /* checked again below; this stops libpng before its own allocations */
  png_set_user_limits(png, 1u << 24, 1u << 24);
  png_read_info(png, info);
  png_get_IHDR(png, info, &pw, &ph, &depth, &ctype, NULL, NULL, NULL);
  w = pw;
  h = ph;
  if ((ctype & PNG_COLOR_MASK_ALPHA) || png_get_valid(png, info, PNG_INFO_tRNS)) {
    rc = err_set(e, FL_EUNSUPPORTED, "PNG: an alpha channel or transparency (Pillow's mode RGBA has 4 channels)");
    png_longjmp(png, 1);
  }
  if (ctype == PNG_COLOR_TYPE_GRAY && depth == 16) {
    rc = err_set(e, FL_EUNSUPPORTED, "PNG: 16-bit gray (Pillow's mode I;16 is not 8-bit)");
    png_longjmp(png, 1);
  }
  if ((rc = check_size("PNG", w, h, e)) != FL_OK) png_longjmp(png, 1);
  if (ctype == PNG_COLOR_TYPE_PALETTE) png_set_palette_to_rgb(png);
  if (ctype == PNG_COLOR_TYPE_GRAY && depth < 8) png_set_expand_gray_1_2_4_to_8(png);
  if (depth == 16) png_set_strip_16(png);   /* the high byte, as Pillow's RGB;16B */
  png_set_interlace_handling(png);
  png_read_update_info(png, info);
  c = ctype == PNG_COLOR_TYPE_GRAY ? 1 : 3;
  if (png_get_rowbytes(png, info) != w * c) {
    rc = err_set(e, FL_EFORMAT, "PNG: unexpected row size");
    png_longjmp(png, 1);
  }
  if (!(px = alloc_px("PNG", h, w, e)) || !(rows = (png_bytep *)malloc(h * sizeof *rows))) {
    rc = err_set(e, FL_ENOMEM, "PNG: out of memory for %zu x %zu pixels", w, h);
    png_longjmp(png, 1);
  }
  for (y = 0; y < h; y++) rows[y] = px + y * w * c;
  png_read_image(png, rows);
  png_read_end(png, NULL);
  png_destroy_read_struct(&png, &info, NULL);
  free(rows);
  finish(out, px, h, w, c, want);
  return FL_OK;
}
#endif

/* ---------------------------------------------------------------------- */
/* TIFF (libtiff): 8-bit RGB or gray, any compression libtiff reads        */
/* ---------------------------------------------------------------------- */

#ifdef HAVE_LIBTIFF
struct tiff_src {
  const unsigned char *b;
  size_t n, pos;
};

static _Thread_local char tiff_msg[256];

static void tiff_error(const char *module, const char *fmt, va_list ap) {
  (void)module;
  vsnprintf(tiff_msg, sizeof tiff_msg, fmt, ap);
}

static void tiff_warning(const char *module, const char *fmt, va_list ap) {
  (void)module;
  (void)fmt;
  (void)ap;
}

static tmsize_t tiff_read(thandle_t h, void *buf, tmsize_t len) {
  struct tiff_src *s = (struct tiff_src *)h;
  size_t k = s->n - s->pos;
  if (len < 0) return -1;
  if ((size_t)len < k) k = (size_t)len;
  memcpy(buf, s->b + s->pos, k);
  s->pos += k;
  return (tmsize_t)k;
}

static tmsize_t tiff_write(thandle_t h, void *buf, tmsize_t len) {
  (void)h;
  (void)buf;
  (void)len;
  return -1;
}

static toff_t tiff_seek(thandle_t h, toff_t off, int whence) {
  struct tiff_src *s = (struct tiff_src *)h;
  uint64_t base = whence == SEEK_CUR ? s->pos : whence == SEEK_END ? s->n : 0;
  if (off > UINT64_MAX - base || base + off > s->n) return (toff_t)-1;
  s->pos = (size_t)(base + off);
  return s->pos;
}

static int tiff_close(thandle_t h) {
  (void)h;
  return 0;
}

static toff_t tiff_size(thandle_t h) {
  return ((struct tiff_src *)h)->n;
}

static int tiff_map(thandle_t h, void **base, toff_t *size) {
  (void)h;
  (void)base;
  (void)size;
  return 0;
}

static void tiff_unmap(thandle_t h, void *base, toff_t size) {
  (void)h;
  (void)base;
  (void)size;
}

static int dec_tiff(const unsigned char *b, size_t n, image_pixels want, image *out, fl_err *e) {
  struct tiff_src s = {b, n, 0};
  TIFF *t;
  uint32_t tw = 0, th = 0, *raster;
  uint16_t bps = 0, spp = 0, photo = 0, orient = 0, extra = 0, *extra_kinds;
  size_t w, h, c, i;
  int rc;
  unsigned char *px;
  TIFFSetErrorHandler(tiff_error);
  TIFFSetWarningHandler(tiff_warning);
  tiff_msg[0] = '\0';
  t = TIFFClientOpen("image", "rm", (thandle_t)&s, tiff_read, tiff_write, tiff_seek, tiff_close,
                     tiff_size, tiff_map, tiff_unmap);
  if (!t) return err_set(e, FL_EFORMAT, "TIFF: %s", tiff_msg[0] ? tiff_msg : "unreadable header");
  TIFFGetField(t, TIFFTAG_IMAGEWIDTH, &tw);
  TIFFGetField(t, TIFFTAG_IMAGELENGTH, &th);
  TIFFGetFieldDefaulted(t, TIFFTAG_BITSPERSAMPLE, &bps);
  TIFFGetFieldDefaulted(t, TIFFTAG_SAMPLESPERPIXEL, &spp);
  TIFFGetFieldDefaulted(t, TIFFTAG_ORIENTATION, &orient);
  TIFFGetFieldDefaulted(t, TIFFTAG_EXTRASAMPLES, &extra, &extra_kinds);
  if (!TIFFGetField(t, TIFFTAG_PHOTOMETRIC, &photo)) photo = 0xFFFF;
  if (bps != 8 || extra != 0 || !((photo == PHOTOMETRIC_RGB && spp == 3) || (photo == PHOTOMETRIC_MINISBLACK && spp == 1))) {
    TIFFClose(t);
    return err_set(e, FL_EUNSUPPORTED, "TIFF: photometric %u, %u samples of %u bits (only 8-bit RGB and gray are read)",
                   (unsigned)photo, (unsigned)spp, (unsigned)bps);
  }
  /* Pillow's pixels are as stored; libtiff would turn other orientations */
  if (orient != ORIENTATION_TOPLEFT) {
    TIFFClose(t);
    return err_set(e, FL_EUNSUPPORTED, "TIFF: orientation %u (only top-left is read)", (unsigned)orient);
  }
  w = tw;
  h = th;
  if ((rc = check_size("TIFF", w, h, e)) != FL_OK) {
    TIFFClose(t);
    return rc;
  }
  c = spp == 3 ? 3 : 1;
  if (!(raster = (uint32_t *)malloc(w * h * sizeof *raster))) {
    TIFFClose(t);
    return err_set(e, FL_ENOMEM, "TIFF: out of memory for %zu x %zu pixels", w, h);
  }
  if (!TIFFReadRGBAImageOriented(t, tw, th, raster, ORIENTATION_TOPLEFT, 1)) {
    free(raster);
    TIFFClose(t);
    return err_set(e, FL_EFORMAT, "TIFF: %s", tiff_msg[0] ? tiff_msg : "undecodable image data");
  }
  TIFFClose(t);
  if (!(px = alloc_px("TIFF", h, w, e))) {
    free(raster);
    return e->code;
  }
  for (i = 0; i < w * h; i++) {
    if (c == 3) {
      px[3 * i] = (unsigned char)TIFFGetR(raster[i]);
      px[3 * i + 1] = (unsigned char)TIFFGetG(raster[i]);
      px[3 * i + 2] = (unsigned char)TIFFGetB(raster[i]);
    } else {
      px[i] = (unsigned char)TIFFGetR(raster[i]);
    }
  }
  free(raster);
  finish(out, px, h, w, c, want);
  return FL_OK;
}
#endif

/* ---------------------------------------------------------------------- */
/* WebP (libwebp): still images without alpha                             */
/* ---------------------------------------------------------------------- */

#ifdef HAVE_LIBWEBP
static int dec_webp(const unsigned char *b, size_t n, image_pixels want, image *out, fl_err *e) {
  WebPBitstreamFeatures f;
  size_t w, h;
  int rc;
  unsigned char *px;
  if (WebPGetFeatures(b, n, &f) != VP8_STATUS_OK)
    return err_set(e, FL_EFORMAT, "WebP: malformed or truncated header");
  if (f.has_animation) return err_set(e, FL_EUNSUPPORTED, "WebP: animations");
  if (f.has_alpha) return err_set(e, FL_EUNSUPPORTED, "WebP: an alpha channel (Pillow's mode RGBA has 4 channels)");
  if (f.width <= 0 || f.height <= 0) return err_set(e, FL_EFORMAT, "WebP: bad dimensions");
  w = (size_t)f.width;
  h = (size_t)f.height;
  if ((rc = check_size("WebP", w, h, e)) != FL_OK) return rc;
  if (!(px = alloc_px("WebP", h, w, e))) return e->code;
  if (!WebPDecodeRGBInto(b, n, px, h * w * 3, (int)(w * 3))) {
    free(px);
    return err_set(e, FL_EFORMAT, "WebP: malformed or truncated image data");
  }
  finish(out, px, h, w, 3, want);
  return FL_OK;
}
#endif

/* ---------------------------------------------------------------------- */
/* JPEG 2000 (OpenJPEG): JP2 and raw codestreams, 8-bit RGB or gray        */
/* ---------------------------------------------------------------------- */

#ifdef HAVE_LIBOPENJP2
struct jp2_src {
  const unsigned char *b;
  size_t n, pos;
};

static OPJ_SIZE_T jp2_read(void *buf, OPJ_SIZE_T len, void *user) {
  struct jp2_src *s = (struct jp2_src *)user;
  size_t k = s->n - s->pos;
  if (k == 0) return (OPJ_SIZE_T)-1;
  if (len < k) k = len;
  memcpy(buf, s->b + s->pos, k);
  s->pos += k;
  return k;
}

static OPJ_OFF_T jp2_skip(OPJ_OFF_T len, void *user) {
  struct jp2_src *s = (struct jp2_src *)user;
  if (len < 0 || (uint64_t)len > s->n - s->pos) return -1;
  s->pos += (size_t)len;
  return len;
}

static OPJ_BOOL jp2_seek(OPJ_OFF_T to, void *user) {
  struct jp2_src *s = (struct jp2_src *)user;
  if (to < 0 || (uint64_t)to > s->n) return OPJ_FALSE;
  s->pos = (size_t)to;
  return OPJ_TRUE;
}

static void jp2_error(const char *msg, void *user) {
  char *m = (char *)user;
  size_t k;
  if (m[0]) return;   /* the first error is the cause */
  snprintf(m, 256, "%s", msg);
  k = strlen(m);
  while (k > 0 && (m[k - 1] == '\n' || m[k - 1] == '\r')) m[--k] = '\0';
}

static void jp2_quiet(const char *msg, void *user) {
  (void)msg;
  (void)user;
}

static int dec_jp2(const unsigned char *b, size_t n, int jp2, image_pixels want, image *out, fl_err *e) {
  struct jp2_src s = {b, n, 0};
  char msg[256] = "";
  opj_dparameters_t par;
  opj_codec_t *codec;
  opj_stream_t *st;
  opj_image_t *img = NULL;
  size_t w = 0, h = 0, c = 0, i, k;
  int rc = FL_OK;
  unsigned char *px = NULL;
  if (!(st = opj_stream_create(OPJ_J2K_STREAM_CHUNK_SIZE, OPJ_TRUE)))
    return err_set(e, FL_ENOMEM, "JPEG 2000: out of memory");
  opj_stream_set_read_function(st, jp2_read);
  opj_stream_set_skip_function(st, jp2_skip);
  opj_stream_set_seek_function(st, jp2_seek);
  opj_stream_set_user_data(st, &s, NULL);
  opj_stream_set_user_data_length(st, n);
  if (!(codec = opj_create_decompress(jp2 ? OPJ_CODEC_JP2 : OPJ_CODEC_J2K))) {
    opj_stream_destroy(st);
    return err_set(e, FL_ENOMEM, "JPEG 2000: out of memory");
  }
  opj_set_error_handler(codec, jp2_error, msg);
  opj_set_warning_handler(codec, jp2_quiet, NULL);
  opj_set_info_handler(codec, jp2_quiet, NULL);
  opj_set_default_decoder_parameters(&par);
  if (!opj_setup_decoder(codec, &par) || !opj_read_header(st, codec, &img)) {
    rc = err_set(e, FL_EFORMAT, "JPEG 2000: %s", msg[0] ? msg : "malformed header");
    goto done;
  }
  if (img->x1 <= img->x0 || img->y1 <= img->y0) {
    rc = err_set(e, FL_EFORMAT, "JPEG 2000: an empty image");
    goto done;
  }
  w = img->x1 - img->x0;
  h = img->y1 - img->y0;
  if ((rc = check_size("JPEG 2000", w, h, e)) != FL_OK) goto done;
  c = img->numcomps;
  if ((c != 1 && c != 3) || img->color_space == OPJ_CLRSPC_SYCC || img->color_space == OPJ_CLRSPC_CMYK
      || img->color_space == OPJ_CLRSPC_EYCC) {
    rc = err_set(e, FL_EUNSUPPORTED, "JPEG 2000: %zu components in color space %d (only RGB and gray are read)",
                 c, (int)img->color_space);
    goto done;
  }
  for (k = 0; k < c; k++)
    if (img->comps[k].prec != 8 || img->comps[k].sgnd || img->comps[k].dx != 1 || img->comps[k].dy != 1) {
      rc = err_set(e, FL_EUNSUPPORTED, "JPEG 2000: component %zu is not 8-bit unsigned at full resolution", k);
      goto done;
    }
  if (!opj_decode(codec, st, img) || !opj_end_decompress(codec, st)) {
    rc = err_set(e, FL_EFORMAT, "JPEG 2000: %s", msg[0] ? msg : "malformed image data");
    goto done;
  }
  for (k = 0; k < c; k++)
    if (!img->comps[k].data || img->comps[k].w != w || img->comps[k].h != h) {
      rc = err_set(e, FL_EFORMAT, "JPEG 2000: component %zu has no data or the wrong size", k);
      goto done;
    }
  if (!(px = alloc_px("JPEG 2000", h, w, e))) {
    rc = e->code;
    goto done;
  }
  for (i = 0; i < w * h; i++)
    for (k = 0; k < c; k++) {
      OPJ_INT32 v = img->comps[k].data[i];
      px[c * i + k] = (unsigned char)(v < 0 ? 0 : v > 255 ? 255 : v);
    }
done:
  opj_image_destroy(img);
  opj_destroy_codec(codec);
  opj_stream_destroy(st);
  if (rc != FL_OK) return rc;
  finish(out, px, h, w, c, want);
  return FL_OK;
}
#endif

/* ---------------------------------------------------------------------- */

int image_decode(const void *buf, size_t n, image_pixels want, image *out, fl_err *e) {
  const unsigned char *b = (const unsigned char *)buf;
  memset(out, 0, sizeof *out);
  switch (sniff(b, n)) {
  case F_BMP: return dec_bmp(b, n, want, out, e);
  case F_PNM: return dec_pnm(b, n, want, out, e);
#ifdef HAVE_LIBJPEG
  case F_JPEG: return dec_jpeg(b, n, want, out, e);
#else
  case F_JPEG: return err_set(e, FL_EUNSUPPORTED, "JPEG: this build has no libjpeg");
#endif
#ifdef HAVE_LIBPNG
  case F_PNG: return dec_png(b, n, want, out, e);
#else
  case F_PNG: return err_set(e, FL_EUNSUPPORTED, "PNG: this build has no libpng");
#endif
#ifdef HAVE_LIBTIFF
  case F_TIFF: return dec_tiff(b, n, want, out, e);
#else
  case F_TIFF: return err_set(e, FL_EUNSUPPORTED, "TIFF: this build has no libtiff");
#endif
#ifdef HAVE_LIBWEBP
  case F_WEBP: return dec_webp(b, n, want, out, e);
#else
  case F_WEBP: return err_set(e, FL_EUNSUPPORTED, "WebP: this build has no libwebp");
#endif
#ifdef HAVE_LIBOPENJP2
  case F_JP2: return dec_jp2(b, n, 1, want, out, e);
  case F_J2K: return dec_jp2(b, n, 0, want, out, e);
#else
  case F_JP2:
  case F_J2K: return err_set(e, FL_EUNSUPPORTED, "JPEG 2000: this build has no OpenJPEG");
#endif
  default:
    return err_set(e, FL_EFORMAT, "not an image of a known format (BMP, JPEG, JPEG 2000, PNG, PNM, TIFF, WebP)");
  }
}
