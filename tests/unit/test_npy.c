/*
** test_npy.c -- the .npy reader and writer: round trips of every dtype and
** of odd shapes, the exact bytes NumPy writes, Fortran order, versions 2.0
** and 3.0, float64/int32 conversion, and malformed images, each of which
** must fail with a message saying what was wrong (checked through both
** npy_parse and npy_load, whose file path reads differently).
*/
#include <dirent.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include "io/npy.h"
#include "tap.h"

static char dir[256];   /* a fresh temp dir for the files of this run */

static const char *tmp_path(const char *name) {
  static char buf[4][512];
  static int k;
  k = (k + 1) % 4;
  snprintf(buf[k], sizeof buf[k], "%s/%s", dir, name);
  return buf[k];
}

static int write_file(const char *path, const void *p, size_t n) {
  FILE *f = fopen(path, "wb");
  if (!f) return -1;
  if (n && fwrite(p, 1, n, f) != n) { fclose(f); return -1; }
  return fclose(f);
}

/* Build a .npy image: magic, version, header text as given (no padding
** added), then n data bytes.  Returns the image length. */
static size_t image(unsigned char *buf, int major, const char *hdr,
                    const void *data, size_t n) {
  size_t h = strlen(hdr), o;
  memcpy(buf, "\x93NUMPY", 6);
  buf[6] = (unsigned char)major;
  buf[7] = 0;
  if (major == 1) {
    buf[8] = (unsigned char)(h & 0xff); buf[9] = (unsigned char)(h >> 8);
    o = 10;
  } else {
    for (int i = 0; i < 4; i++) buf[8 + i] = (unsigned char)(h >> (8 * i));
    o = 12;
  }
  memcpy(buf + o, hdr, h);
  if (n) memcpy(buf + o + h, data, n);
  return o + h + n;
}

static fl_tensor make(fl_dtype dt, int ndim, const int64_t *shape) {
  fl_tensor t;
  fl_meta m = {0};
  fl_err e = {0};
  m.dtype = dt;
  m.ndim = ndim;
  for (int i = 0; i < ndim; i++) m.shape[i] = shape[i];
  if (ten_empty(&t, &m, &e) != FL_OK) {
    printf("# ten_empty: %s\n", e.msg);
    exit(1);
  }
  return t;
}

static int same_shape(const fl_tensor *t, int ndim, const int64_t *shape) {
  if (t->m.ndim != ndim) return 0;
  for (int i = 0; i < ndim; i++)
    if (t->m.shape[i] != shape[i]) return 0;
  return 1;
}

/* Save t, load it back and compare dtype (want), shape and every value. */
static void round_trip(const char *what, const fl_tensor *t, fl_dtype want) {
  fl_tensor u;
  fl_err e = {0};
  const char *p = tmp_path("rt.npy");
  int64_t n = meta_numel(&t->m), bad = -1;
  int rc = npy_save(p, t, &e);
  if (!ok(rc == FL_OK, "%s: save", what)) { printf("#   %s\n", e.msg); return; }
  rc = npy_load(p, &u, &e);
  if (!ok(rc == FL_OK, "%s: load", what)) { printf("#   %s\n", e.msg); return; }
  for (int64_t i = 0; i < n && bad < 0; i++)
    if (ten_get(&u, i) != ten_get(t, i)) bad = i;
  ok(u.m.dtype == want && same_shape(&u, t->m.ndim, t->m.shape) && bad < 0 &&
     ten_is_contiguous(&u), "%s: dtype, shape and values survive", what);
  if (bad >= 0) printf("#   element %lld: %g vs %g\n", (long long)bad, ten_get(&u, bad), ten_get(t, bad));
  ten_release(&u);
}

static void test_round_trips(void) {
  int64_t s23[] = {2, 3}, s7[] = {7}, s35[] = {3, 5}, s4[] = {4}, s22[] = {2, 2};
  int64_t s0[] = {0}, s302[] = {3, 0, 2}, s8[] = {1, 1, 2, 1, 1, 1, 3, 1};
  fl_tensor t;

  t = make(FL_F32, 2, s23);
  for (int i = 0; i < 6; i++) ten_set(&t, i, i * 0.5 - 1.25);
  round_trip("float32 [2,3]", &t, FL_F32);
  ten_release(&t);

  t = make(FL_F64, 2, s23);
  for (int i = 0; i < 6; i++) ten_set(&t, i, (i - 2) * 0.1 + 1e-300 * i);
  round_trip("float64 [2,3]", &t, FL_F64);
  ten_release(&t);

  t = make(FL_F16, 1, s7);
  for (int i = 0; i < 7; i++) ten_set(&t, i, (i - 3) * 1.5);
  ten_set(&t, 6, 65504.0);
  round_trip("float16 [7]", &t, FL_F16);
  ten_release(&t);

  t = make(FL_BF16, 2, s35);
  for (int i = 0; i < 15; i++) ten_set(&t, i, (i - 7) * 0.25);
  round_trip("bfloat16 [3,5] loads as float32", &t, FL_F32);
  ten_release(&t);

  t = make(FL_I64, 1, s4);
  ((int64_t *)ten_data(&t))[0] = INT64_MIN + 1;
  ((int64_t *)ten_data(&t))[1] = -1;
  ((int64_t *)ten_data(&t))[2] = 0;
  ((int64_t *)ten_data(&t))[3] = ((int64_t)1 << 62) + 3;
  {
    fl_tensor u;
    fl_err e = {0};
    int rc = npy_save(tmp_path("i64.npy"), &t, &e);
    rc = rc ? rc : npy_load(tmp_path("i64.npy"), &u, &e);
    ok(rc == FL_OK && u.m.dtype == FL_I64 &&
       memcmp(ten_data(&u), ten_data(&t), 32) == 0, "int64 [4]: extreme values exact");
    if (rc == FL_OK) ten_release(&u);
  }
  ten_release(&t);

  t = make(FL_BOOL, 2, s22);
  ten_set(&t, 1, 1); ten_set(&t, 2, 1);
  round_trip("bool [2,2]", &t, FL_BOOL);
  ten_release(&t);

  t = make(FL_F32, 0, NULL);
  ten_set(&t, 0, 3.25);
  round_trip("0-dim float32", &t, FL_F32);
  ten_release(&t);

  t = make(FL_F32, 1, s0);
  round_trip("0-size [0]", &t, FL_F32);
  ten_release(&t);

  t = make(FL_I64, 3, s302);
  round_trip("0-size [3,0,2] int64", &t, FL_I64);
  ten_release(&t);

  t = make(FL_F32, 8, s8);
  for (int i = 0; i < 6; i++) ten_set(&t, i, i + 1);
  round_trip("8 dims", &t, FL_F32);
  ten_release(&t);
}

/* The writer must produce what NumPy writes, byte for byte. */
static void test_numpy_bytes(void) {
  static const char want[] =
    "\x93NUMPY\x01\x00v\x00{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }"
    "                                                          \n";
  int64_t s23[] = {2, 3}, s3[] = {3};
  fl_tensor t = make(FL_F32, 2, s23);
  fl_err e = {0};
  unsigned char buf[256];
  FILE *f;
  size_t n = 0;
  for (int i = 0; i < 6; i++) ten_set(&t, i, i);
  npy_save(tmp_path("np.npy"), &t, &e);
  if ((f = fopen(tmp_path("np.npy"), "rb"))) { n = fread(buf, 1, sizeof buf, f); fclose(f); }
  is_int(n, 128 + 24, "saved [2,3] float32 is 152 bytes, as NumPy's");
  ok(n >= 128 && memcmp(buf, want, 128) == 0, "header bytes equal NumPy's");
  ok(n == 152 && ((float *)(buf + 128))[5] == 5.0f, "data follows in C order");
  ten_release(&t);

  t = make(FL_BOOL, 1, s3);
  npy_save(tmp_path("b.npy"), &t, &e);
  n = 0;
  if ((f = fopen(tmp_path("b.npy"), "rb"))) { n = fread(buf, 1, sizeof buf, f); fclose(f); }
  ok(n == 131 && memcmp(buf + 10, "{'descr': '|b1', 'fortran_order': False, 'shape': (3,), }", 57) == 0,
     "1-dim bool header has '|b1' and (3,)");
  ten_release(&t);
}

/* A transposed view (non-contiguous) saves in its logical C order. */
static void test_strided_save(void) {
  int64_t s23[] = {2, 3}, s32[] = {3, 2};
  fl_tensor t = make(FL_F32, 2, s23), v, u;
  fl_err e = {0};
  int rc;
  for (int i = 0; i < 6; i++) ten_set(&t, i, i);   /* [[0,1,2],[3,4,5]] */
  ten_share(&v, &t);
  v.m.shape[0] = 3; v.m.shape[1] = 2;
  v.stride[0] = 1; v.stride[1] = 3;
  rc = npy_save(tmp_path("tr.npy"), &v, &e);
  rc = rc ? rc : npy_load(tmp_path("tr.npy"), &u, &e);
  ok(rc == FL_OK && same_shape(&u, 2, s32) && ten_get(&u, 1) == 3 && ten_get(&u, 2) == 1 &&
     ten_get(&u, 5) == 5, "transposed view saves as [[0,3],[1,4],[2,5]]");
  if (rc == FL_OK) ten_release(&u);
  else printf("#   %s\n", e.msg);
  ten_release(&v);
  ten_release(&t);
}

static const char F4_23[] = "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }";

/* Images built by hand: what NumPy and other writers produce. */
static void test_parse_variants(void) {
  unsigned char img[1024];
  float f6[6] = {0, 1, 2, 3, 4, 5};
  fl_tensor t;
  fl_err e = {0};
  size_t n;
  int rc;

  n = image(img, 2, F4_23, f6, sizeof f6);
  rc = npy_parse(img, n, &t, &e);
  ok(rc == FL_OK && t.m.ndim == 2 && ten_get(&t, 4) == 4, "version 2.0 header");
  if (rc == FL_OK) ten_release(&t);

  n = image(img, 3, F4_23, f6, sizeof f6);
  rc = npy_parse(img, n, &t, &e);
  ok(rc == FL_OK && ten_get(&t, 5) == 5, "version 3.0 header");
  if (rc == FL_OK) ten_release(&t);

  /* Fortran order: the file holds columns; the tensor must be C order.
  ** Column-major [[0,1,2],[3,4,5]] is 0 3 1 4 2 5. */
  {
    float fo[6] = {0, 3, 1, 4, 2, 5};
    n = image(img, 1, "{'descr': '<f4', 'fortran_order': True, 'shape': (2, 3), }\n", fo, sizeof fo);
    rc = npy_parse(img, n, &t, &e);
    int good = rc == FL_OK && ten_is_contiguous(&t);
    for (int i = 0; good && i < 6; i++) good = ten_get(&t, i) == i;
    ok(good, "Fortran order [2,3] loads C-contiguous with the right values");
    if (rc == FL_OK) ten_release(&t);
  }
  /* Fortran order, 3 dims, int32 converted to int64: element (i,j,k) of
  ** shape (2,3,4) sits at i + 2j + 6k in the file; value = 100i+10j+k-50 */
  {
    int32_t d[24];
    for (int i = 0; i < 2; i++)
      for (int j = 0; j < 3; j++)
        for (int k = 0; k < 4; k++) d[i + 2 * j + 6 * k] = 100 * i + 10 * j + k - 50;
    n = image(img, 1, "{'descr': '<i4', 'fortran_order': True, 'shape': (2, 3, 4), }", d, sizeof d);
    rc = npy_parse(img, n, &t, &e);
    int good = rc == FL_OK && t.m.dtype == FL_I64;
    for (int i = 0; good && i < 24; i++)
      good = ten_get(&t, i) == 100 * (i / 12) + 10 * (i / 4 % 3) + i % 4 - 50;
    ok(good, "Fortran order [2,3,4] int32 -> C-order int64 (negatives sign-extended)");
    if (rc == FL_OK) ten_release(&t);
    if (rc != FL_OK) printf("#   %s\n", e.msg);
  }
  /* float64 stays float64, every bit */
  {
    double d[3] = {0.1, -2.5, 1e300};
    n = image(img, 1, "{'descr': '<f8', 'fortran_order': False, 'shape': (3,), }", d, sizeof d);
    rc = npy_parse(img, n, &t, &e);
    ok(rc == FL_OK && t.m.dtype == FL_F64 && ten_get(&t, 0) == 0.1 &&
       ten_get(&t, 1) == -2.5 && ten_get(&t, 2) == 1e300, "float64 -> float64, exact");
    if (rc == FL_OK) ten_release(&t);
  }
  /* what other writers do: keys reordered, double quotes, no trailing
  ** comma, newlines inside the dict, Python 2 long suffixes */
  n = image(img, 1, " {\"shape\" :(2 ,3L),\n 'fortran_order':False ,\"descr\":'<f4'}  \n", f6, sizeof f6);
  rc = npy_parse(img, n, &t, &e);
  ok(rc == FL_OK && same_shape(&t, 2, (int64_t[]){2, 3}) && ten_get(&t, 3) == 3,
     "reordered keys, double quotes, whitespace, 3L");
  if (rc == FL_OK) ten_release(&t); else printf("#   %s\n", e.msg);

  /* bool bytes other than 0/1 still mean true, stored as 1 */
  {
    unsigned char b[3] = {0, 2, 255};
    n = image(img, 1, "{'descr': '|b1', 'fortran_order': False, 'shape': (3,), }", b, 3);
    rc = npy_parse(img, n, &t, &e);
    ok(rc == FL_OK && ((unsigned char *)ten_data(&t))[1] == 1 &&
       ((unsigned char *)ten_data(&t))[2] == 1, "bool bytes normalized to 0/1");
    if (rc == FL_OK) ten_release(&t);
  }
  /* a valid image cut short anywhere must fail cleanly */
  {
    int all = 1;
    n = image(img, 1, F4_23, f6, sizeof f6);
    for (size_t k = 0; k < n; k++) {
      fl_err e2 = {0};
      if (npy_parse(img, k, &t, &e2) == FL_OK || t.st != NULL || e2.msg[0] == '\0') {
        all = 0;
        printf("#   prefix of %zu bytes: rc ok or no message\n", k);
      }
    }
    ok(all, "every proper prefix of a valid image is rejected with a message");
  }
}

/* One malformed image: npy_parse must say "npy: <why>", npy_load must
** say "load: <path>: <why>", and both must leave the output empty. */
static void bad(const char *what, const void *img, size_t n, const char *why) {
  fl_tensor t;
  fl_err e = {0};
  char want[1200];
  const char *p = tmp_path("bad.npy");
  int rc;
  memset(&t, 0x5a, sizeof t);
  rc = npy_parse(img, n, &t, &e);
  snprintf(want, sizeof want, "npy: %s", why);
  if (!ok(rc != FL_OK && t.st == NULL && strcmp(e.msg, want) == 0, "malformed: %s", what))
    printf("#   rc %d\n#   got  \"%s\"\n#   want \"%s\"\n", rc, e.msg, want);
  write_file(p, img, n);
  err_clear(&e);
  rc = npy_load(p, &t, &e);
  snprintf(want, sizeof want, "load: %s: %s", p, why);
  if (!ok(rc != FL_OK && t.st == NULL && strcmp(e.msg, want) == 0, "malformed file: %s", what))
    printf("#   rc %d\n#   got  \"%s\"\n#   want \"%s\"\n", rc, e.msg, want);
}

/* bad() for an image with a version-1 header text and n data bytes */
static void bad_hdr(const char *what, const char *hdr, size_t ndata, const char *why) {
  unsigned char img[1024], data[128] = {0};
  bad(what, img, image(img, 1, hdr, data, ndata), why);
}

static void test_malformed(void) {
  unsigned char img[256];
  size_t n;

  bad("empty file", "", 0, "not a .npy file (empty)");
  bad("bad magic", "\x93NUMPZ\x01\x00\x00\x00", 10, "not a .npy file (bad magic)");
  bad("a text file", "hello world\n", 12, "not a .npy file (bad magic)");
  bad("truncated magic", "\x93NU", 3, "truncated file (3 bytes, not even a .npy magic)");
  bad("truncated header length", "\x93NUMPY\x01\x00\x10", 9, "truncated header (file is 9 bytes)");
  bad("version 4.0", "\x93NUMPY\x04\x00\x00\x00", 10,
      "unsupported .npy version 4.0 (1.0, 2.0, 3.0 are known)");
  n = image(img, 1, F4_23, NULL, 0);
  img[8] = 200;   /* header length 200 in a file of 69 bytes */
  bad("header length past EOF", img, n, "header length 200 runs past the end of the file "
      "(59 bytes after the length field)");
  n = image(img, 2, F4_23, NULL, 0);
  img[11] = 0x80;   /* 2 GiB header length in version 2.0 */
  bad("v2 header length past EOF", img, n, "header length 2147483707 runs past the end of "
      "the file (59 bytes after the length field)");

  bad_hdr("not a dict", "['descr', '<f4']", 0,
          "bad header: expected '{' at header byte 0, found '['");
  bad_hdr("missing colon", "{'descr' '<f4', 'fortran_order': False, 'shape': (2,), }", 0,
          "bad header: expected ':' after the key at header byte 9, found string '<f4'");
  bad_hdr("missing comma", "{'descr': '<f4' 'fortran_order': False, 'shape': (2,), }", 0,
          "bad header: expected ',' or '}' at header byte 16, found string 'fortran_order'");
  bad_hdr("unclosed dict", "{'descr': '<f4', 'fortran_order': False, 'shape': (2,), ", 0,
          "bad header: expected a key string or '}' at header byte 56, found end of header");
  bad_hdr("unterminated string", "{'descr': '<f4}", 0,
          "bad header: expected a string for 'descr' at header byte 10, found ''<f4}'");
  bad_hdr("junk after dict", "{'descr': '<f4', 'fortran_order': False, 'shape': (), } x", 4,
          "bad header: expected only padding after the dict at header byte 56, found 'x'");
  bad_hdr("missing key", "{'descr': '<f4', 'fortran_order': False}", 0,
          "bad header: no 'shape' key");
  bad_hdr("unknown key", "{'descr': '<f4', 'fortran_order': False, 'shape': (), 'x': 1}", 4,
          "bad header: unexpected key 'x'");
  bad_hdr("repeated key", "{'descr': '<f4', 'descr': '<f4', 'fortran_order': False, 'shape': ()}", 4,
          "bad header: key 'descr' repeated");
  bad_hdr("fortran_order not a bool", "{'descr': '<f4', 'fortran_order': 0, 'shape': ()}", 4,
          "bad header: expected True or False for 'fortran_order' at header byte 34, found '0'");
  bad_hdr("unknown descr", "{'descr': '<c8', 'fortran_order': False, 'shape': (2,), }", 16,
          "unsupported descr '<c8' (expected '<f4', '<f2', '<i8', '|b1', '<f8' or '<i4')");
  bad_hdr("big-endian descr", "{'descr': '>f4', 'fortran_order': False, 'shape': (2,), }", 8,
          "big-endian descr '>f4' is not supported (save with a '<' dtype, e.g. a.astype('<f4'))");
  bad_hdr("structured descr", "{'descr': [('a', '<f4')], 'fortran_order': False, 'shape': (2,), }", 8,
          "structured arrays are not supported");
  bad_hdr("shape not a tuple", "{'descr': '<f4', 'fortran_order': False, 'shape': 3, }", 12,
          "bad header: expected a tuple for 'shape' at header byte 50, found '3'");
  bad_hdr("shape (3) without comma", "{'descr': '<f4', 'fortran_order': False, 'shape': (3), }", 12,
          "bad header: 'shape' (3) is not a tuple (a 1-dim shape is written (3,))");
  bad_hdr("negative dimension", "{'descr': '<f4', 'fortran_order': False, 'shape': (2, -3), }", 0,
          "bad header: negative dimension -3 in shape");
  bad_hdr("float dimension", "{'descr': '<f4', 'fortran_order': False, 'shape': (2.5,), }", 0,
          "bad header: expected ',' or ')' in shape at header byte 52, found '.'");
  bad_hdr("too many dims", "{'descr': '<f4', 'fortran_order': False, 'shape': (1,1,1,1,1,1,1,1,1), }", 4,
          "shape has 9 dims (at most 8 supported)");
  bad_hdr("dimension past int64", "{'descr': '<f4', 'fortran_order': False, 'shape': (99999999999999999999,), }", 0,
          "bad header: dimension '99999999999999999999' is too large");
  bad_hdr("element count overflows", "{'descr': '<i8', 'fortran_order': False, 'shape': (4294967296, 4294967296), }", 0,
          "shape [4294967296,4294967296] is too large (more than 1099511627776 bytes)");
  bad_hdr("huge dims beside a zero", "{'descr': '<f4', 'fortran_order': False, 'shape': (0, 4294967296, 4294967296), }", 0,
          "shape [0,4294967296,4294967296] is too large (more than 1099511627776 bytes)");
  bad_hdr("truncated data", "{'descr': '<f4', 'fortran_order': False, 'shape': (4, 6), }", 40,
          "truncated data (expected 96 bytes, found 40)");
  bad_hdr("trailing garbage", "{'descr': '<f4', 'fortran_order': False, 'shape': (2,), }", 12,
          "4 bytes of trailing garbage after the data (expected 8 bytes, found 12)");
  bad_hdr("0-dim with no data", "{'descr': '<i8', 'fortran_order': False, 'shape': (), }", 0,
          "truncated data (expected 8 bytes, found 0)");
  bad_hdr("control bytes are escaped", "{'descr': '\x01\x7f', 'fortran_order': False, 'shape': (), }", 0,
          "unsupported descr '\\x01\\x7f' (expected '<f4', '<f2', '<i8', '|b1', '<f8' or '<i4')");
}

static int count_entries(const char *d) {
  DIR *dp = opendir(d);
  struct dirent *de;
  int n = 0;
  if (!dp) return -1;
  while ((de = readdir(dp)))
    if (strcmp(de->d_name, ".") && strcmp(de->d_name, "..")) n++;
  closedir(dp);
  return n;
}

/* File-level errors name the path and the system's reason. */
static void test_file_errors(void) {
  int64_t s2[] = {2};
  fl_tensor t = make(FL_F32, 1, s2), u;
  fl_err e = {0};
  char want[1024];
  int rc;

  rc = npy_load(tmp_path("missing.npy"), &u, &e);
  snprintf(want, sizeof want, "load: %s: No such file or directory", tmp_path("missing.npy"));
  ok(rc == FL_EIO && u.st == NULL, "load of a missing file fails");
  is_str(e.msg, want, "... naming the path and strerror");

  rc = npy_load(dir, &u, &e);
  snprintf(want, sizeof want, "load: %s: is a directory, not a regular file "
           "(only files are read)", dir);
  ok(rc == FL_EIO, "load of a directory fails");
  is_str(e.msg, want, "... saying what is there");

  rc = npy_save("/nonexistent-fuselab-dir/x.npy", &t, &e);
  ok(rc == FL_EIO, "save into a missing directory fails");
  is_str(e.msg, "save: /nonexistent-fuselab-dir/x.npy: No such file or directory",
         "... naming the path and strerror");

  mkdir(tmp_path("sub"), 0700);
  {
    char sub[512];
    snprintf(sub, sizeof sub, "%s", tmp_path("sub"));
    rc = npy_save(sub, &t, &e);
    snprintf(want, sizeof want, "save: %s: is a directory, not a regular file "
             "(refusing to replace it)", sub);
    ok(rc == FL_EIO, "save over a directory fails");
    is_str(e.msg, want, "... saying what is there");
    is_int(count_entries(sub), 0, "... and leaves the directory empty");
  }
  {
    int before = count_entries(dir);
    rc = npy_save(tmp_path("ok.npy"), &t, &e);
    ok(rc == FL_OK && count_entries(dir) == before + 1, "a good save leaves no temp file");
    rc = npy_save(tmp_path("ok.npy"), &t, &e);
    ok(rc == FL_OK && count_entries(dir) == before + 1, "saving over an existing file replaces it");
  }

  /* a pipe is not a file: refused at once, nothing read from it (the
  ** write end stays open, so reading it would block: alarm ends that) */
  {
    int fds[2];
    char path[64];
    alarm(60);
    if (pipe(fds) == 0) {
      ssize_t w = write(fds[1], "\x93NUMPY", 6);
      snprintf(path, sizeof path, "/dev/fd/%d", fds[0]);
      rc = npy_load(path, &u, &e);
      ok(w == 6 && rc == FL_EIO && strstr(e.msg, "is a FIFO (named pipe), not a regular file"),
         "load from a pipe is refused (%s)", e.msg);
      close(fds[0]);
      close(fds[1]);
    } else {
      ok(0, "pipe()");
    }
    alarm(0);
  }
  ten_release(&t);
}

/* What is at a path decides how a save treats it: a regular file is
** replaced atomically with its mode kept, a symlink is followed to the
** file it names, anything else is refused and left alone; a load reads
** regular files only, so a FIFO or device never blocks it or fills memory.
** (alarm: before the fix a FIFO blocked the load forever.) */
static void test_file_kinds(void) {
  int64_t s2[] = {2};
  fl_tensor t = make(FL_F32, 1, s2), u;
  fl_err e = {0};
  struct stat st;
  char p[512], q[512], want[1024];
  int rc;

  ten_set(&t, 0, 7);
  ten_set(&t, 1, 1);
  alarm(60);
  /* a FIFO: no save over it, no load from it, and neither blocks */
  snprintf(p, sizeof p, "%s", tmp_path("fifo"));
  if (mkfifo(p, 0600) == 0) {
    rc = npy_save(p, &t, &e);
    snprintf(want, sizeof want, "save: %s: is a FIFO (named pipe), not a regular file "
             "(refusing to replace it)", p);
    ok(rc == FL_EIO, "save over a FIFO fails");
    is_str(e.msg, want, "... saying what is there");
    ok(lstat(p, &st) == 0 && S_ISFIFO(st.st_mode), "... and the FIFO is still a FIFO");
    rc = npy_load(p, &u, &e);
    snprintf(want, sizeof want, "load: %s: is a FIFO (named pipe), not a regular file "
             "(only files are read)", p);
    ok(rc == FL_EIO && u.st == NULL, "load of a FIFO fails without blocking");
    is_str(e.msg, want, "... saying what is there");
  } else {
    ok(0, "mkfifo %s", p);
  }

  /* devices: a null device is never replaced, /dev/zero never read.  As
  ** root (CI) the null device is a node of our own, so a regression
  ** replaces that, not the system's /dev/null; others cannot replace
  ** /dev/null anyway (/dev is not theirs). */
  snprintf(p, sizeof p, "%s", tmp_path("null"));
  if (mknod(p, S_IFCHR | 0666, makedev(1, 3)) != 0) snprintf(p, sizeof p, "/dev/null");
  if (stat(p, &st) == 0 && S_ISCHR(st.st_mode)) {
    rc = npy_save(p, &t, &e);
    snprintf(want, sizeof want, "save: %s: is a character device, not a regular file "
             "(refusing to replace it)", p);
    is_str(e.msg, want, "save over a null device is refused");
    ok(rc == FL_EIO && lstat(p, &st) == 0 && S_ISCHR(st.st_mode),
       "... and it is still a device");
  }
  if (strcmp(p, "/dev/null") != 0) unlink(p);
  if (stat("/dev/zero", &st) == 0 && S_ISCHR(st.st_mode)) {
    rc = npy_load("/dev/zero", &u, &e);
    ok(rc == FL_EIO && u.st == NULL, "load of /dev/zero fails at once");
    is_str(e.msg, "load: /dev/zero: is a character device, not a regular file "
           "(only files are read)", "... saying what it is");
  }
  alarm(0);

  /* a 0600 file stays 0600 (the rename used to leave 0666 & ~umask) */
  snprintf(p, sizeof p, "%s", tmp_path("private.npy"));
  ok(write_file(p, "old", 3) == 0 && chmod(p, 0600) == 0, "a 0600 file");
  ok(npy_save(p, &t, &e) == FL_OK, "... is saved over (%s)", e.msg);
  ok(stat(p, &st) == 0 && (st.st_mode & 07777) == 0600, "... and keeps mode 0600 (%o)",
     (unsigned)(st.st_mode & 07777));
  rc = chmod(p, 0640) == 0 && npy_save(p, &t, &e) == FL_OK && stat(p, &st) == 0;
  ok(rc && (st.st_mode & 07777) == 0640, "a 0640 file keeps 0640 (%o)",
     (unsigned)(st.st_mode & 07777));
  ok(npy_load(p, &u, &e) == FL_OK && ten_get(&u, 1) == 1, "... and holds the new data");
  ten_release(&u);

  /* a new file gets 0666 & ~umask, as open() would give it */
  {
    mode_t old = umask(027);
    snprintf(p, sizeof p, "%s", tmp_path("fresh.npy"));
    rc = npy_save(p, &t, &e);
    umask(old);
    ok(rc == FL_OK && stat(p, &st) == 0 && (st.st_mode & 07777) == 0640,
       "a new file under umask 027 is 0640 (%o)", (unsigned)(st.st_mode & 07777));
  }

  /* through a symlink: the target is replaced, the link stays a link */
  snprintf(p, sizeof p, "%s", tmp_path("target.npy"));
  snprintf(q, sizeof q, "%s", tmp_path("link.npy"));
  ok(write_file(p, "old", 3) == 0 && chmod(p, 0600) == 0 && symlink("target.npy", q) == 0,
     "a symlink to a 0600 file");
  ok(npy_save(q, &t, &e) == FL_OK, "... is saved through (%s)", e.msg);
  ok(lstat(q, &st) == 0 && S_ISLNK(st.st_mode), "... the link is still a link");
  ok(stat(p, &st) == 0 && S_ISREG(st.st_mode) && (st.st_mode & 07777) == 0600 &&
     st.st_size > 3, "... the target holds the data and keeps 0600");
  ok(npy_load(q, &u, &e) == FL_OK && ten_get(&u, 0) == 7, "... and loads back through the link");
  ten_release(&u);
  /* a dangling link creates what it names, as open(O_CREAT) would */
  snprintf(p, sizeof p, "%s", tmp_path("made.npy"));
  snprintf(q, sizeof q, "%s", tmp_path("dangling.npy"));
  ok(symlink("made.npy", q) == 0 && npy_save(q, &t, &e) == FL_OK && lstat(q, &st) == 0 &&
     S_ISLNK(st.st_mode) && stat(p, &st) == 0 && S_ISREG(st.st_mode),
     "saving through a dangling link creates its target");
  /* a link to a FIFO is refused like the FIFO */
  snprintf(q, sizeof q, "%s", tmp_path("to_fifo"));
  ok(symlink("fifo", q) == 0 && npy_save(q, &t, &e) == FL_EIO &&
     strstr(e.msg, "is a FIFO (named pipe)"), "a link to a FIFO is refused (%s)", e.msg);

  /* someone else's link in a sticky shared dir (/tmp) is not followed:
  ** the kernel refuses it to open() too (fs.protected_symlinks).  Needs
  ** root to make a link owned by another user. */
  if (geteuid() == 0) {
    char sticky[256];
    snprintf(sticky, sizeof sticky, "%s", tmp_path("sticky"));
    snprintf(p, sizeof p, "%s/victim.npy", sticky);
    snprintf(q, sizeof q, "%s/planted.npy", sticky);
    ok(mkdir(sticky, 0700) == 0 && chmod(sticky, 01777) == 0 && write_file(p, "old", 3) == 0 &&
       symlink("victim.npy", q) == 0 && lchown(q, 65534, 65534) == 0, "a link owned by nobody in a "
       "sticky dir");
    rc = npy_save(q, &t, &e);
    ok(rc == FL_EIO && strstr(e.msg, "is a symbolic link another user owns"),
       "... is not followed (%s)", e.msg);
    ok(stat(p, &st) == 0 && st.st_size == 3, "... and its target is untouched");
    unlink(p);
    unlink(q);
    rmdir(sticky);
  } else {
    ok(1, "# SKIP a link owned by another user needs root");
  }

  /* a header asking for more data than the file has: refused before
  ** anything that size is allocated */
  {
    unsigned char img[256];
    size_t n = image(img, 1, "{'descr': '<f4', 'fortran_order': False, 'shape': (100000000000,), }",
                     "abcd", 4);
    snprintf(p, sizeof p, "%s", tmp_path("liar.npy"));
    ok(write_file(p, img, n) == 0, "a header for 4e11 bytes over 4 bytes of data");
    rc = npy_load(p, &u, &e);
    ok(rc == FL_EFORMAT && u.st == NULL && strstr(e.msg, "truncated data (expected 400000000000 "
       "bytes, found 4)"), "... is a truncated-data error (%s)", e.msg);
    n = image(img, 1, F4_23, "abcd", 4);
    img[8] = 0xff; img[9] = 0xff;   /* header length 65535 */
    ok(write_file(p, img, n) == 0 && npy_load(p, &u, &e) == FL_EFORMAT &&
       strstr(e.msg, "header length 65535 runs past the end of the file"),
       "a header length past the end is refused (%s)", e.msg);
  }

  /* no temp file left behind by any of it */
  {
    DIR *dp = opendir(dir);
    struct dirent *de;
    int temps = 0;
    while (dp && (de = readdir(dp))) temps += strstr(de->d_name, ".tmp.") != NULL;
    if (dp) closedir(dp);
    is_int(temps, 0, "no temp files left behind");
  }
  ten_release(&t);
}

static void cleanup(void) {
  DIR *dp = opendir(dir);
  struct dirent *de;
  char p[1024];
  if (!dp) return;
  while ((de = readdir(dp))) {
    if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, "..")) continue;
    snprintf(p, sizeof p, "%s/%s", dir, de->d_name);
    if (rmdir(p) != 0) unlink(p);
  }
  closedir(dp);
  rmdir(dir);
}

int main(void) {
  const char *base = getenv("TMPDIR");
  snprintf(dir, sizeof dir, "%s/test_npy.XXXXXX", base && *base ? base : "/tmp");
  if (!mkdtemp(dir)) { printf("Bail out! mkdtemp %s failed\n", dir); return 1; }
  test_round_trips();
  test_numpy_bytes();
  test_strided_save();
  test_parse_variants();
  test_malformed();
  test_file_errors();
  test_file_kinds();
  cleanup();
  return tap_done();
}
