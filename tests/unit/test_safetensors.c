/*
** test_safetensors.c -- the safetensors reader and writer: round trips of
** every dtype (scalars, empty and strided tensors too), the exact layout
** written (sorted names, 8-byte alignment, metadata), and malformed
** images, each of which must fail with the message saying what was wrong
** and naming the tensor at fault, leaving nothing allocated.
*/
#include <dirent.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include "io/safetensors.h"
#include "tap.h"

static char dir[256];   /* a fresh temp dir for the files of this run */

static const char *tmp_path(const char *name) {
  static char buf[4][512];
  static int k;
  k = (k + 1) % 4;
  snprintf(buf[k], sizeof buf[k], "%s/%s", dir, name);
  return buf[k];
}

/* A safetensors file by hand: the 8-byte length, the header, the data. */
static void write_st(const char *path, const char *header, const char *data, size_t n) {
  FILE *f = fopen(path, "wb");
  size_t h = strlen(header);
  unsigned char len[8] = {(unsigned char)h, (unsigned char)(h >> 8)};
  if (!f) return;
  fwrite(len, 1, 8, f);
  fwrite(header, 1, h, f);
  fwrite(data, 1, n, f);
  fclose(f);
}

static unsigned char *read_all(const char *path, size_t *n) {
  FILE *f = fopen(path, "rb");
  unsigned char *b;
  long len;
  if (!f) return NULL;
  fseek(f, 0, SEEK_END);
  len = ftell(f);
  fseek(f, 0, SEEK_SET);
  b = malloc((size_t)len + 1);
  if (b && fread(b, 1, (size_t)len, f) != (size_t)len) { free(b); b = NULL; }
  fclose(f);
  *n = (size_t)len;
  return b;
}

static fl_tensor make(fl_dtype dt, int ndim, const int64_t *shape) {
  fl_tensor t;
  fl_meta m = {0};
  fl_err e = {0};
  m.dtype = dt;
  m.ndim = ndim;
  for (int i = 0; i < ndim; i++) m.shape[i] = shape[i];
  if (ten_empty(&t, &m, &e) != FL_OK) printf("Bail out! %s\n", e.msg);
  return t;
}

static int same_values(const fl_tensor *a, const fl_tensor *b) {
  int64_t n = meta_numel(&a->m);
  if (a->m.dtype != b->m.dtype || !meta_same_shape(&a->m, &b->m)) return 0;
  for (int64_t i = 0; i < n; i++) {
    double x = ten_get(a, i), y = ten_get(b, i);
    if (!(x == y || (x != x && y != y))) return 0;
  }
  return 1;
}

static const st_tensor *find(const st_list *l, const char *name) {
  for (size_t i = 0; i < l->n; i++)
    if (strcmp(l->v[i].name, name) == 0) return &l->v[i];
  return NULL;
}

/* Every dtype, plus a 0-dim scalar, an empty tensor and a 4-d one. */
static void test_round_trip(void) {
  static const int64_t s23[2] = {2, 3}, s0[2] = {0, 5}, s4[4] = {2, 1, 3, 2};
  const char *names[8] = {"w.f32", "a.f16", "m.bf16", "idx", "mask", "scalar", "empty", "deep"};
  fl_tensor t[8];
  const fl_tensor *tp[8];
  st_list l;
  fl_err e = {0};
  unsigned char *img;
  size_t n;
  uint64_t hlen = 0;

  t[0] = make(FL_F32, 2, s23);
  t[1] = make(FL_F16, 2, s23);
  t[2] = make(FL_BF16, 2, s23);
  t[3] = make(FL_I64, 2, s23);
  t[4] = make(FL_BOOL, 2, s23);
  t[5] = make(FL_F32, 0, NULL);
  t[6] = make(FL_F32, 2, s0);
  t[7] = make(FL_F64, 4, s4);   /* float64: values no float32 holds */
  for (int i = 0; i < 6; i++) {
    ten_set(&t[0], i, i == 5 ? -1.0 / 0.0 : 1.5 * i - 2.25);
    ten_set(&t[1], i, 0.5 * i - 1);
    ten_set(&t[2], i, i == 4 ? 0.0 / 0.0 : 3.0 * i);
    ten_set(&t[3], i, i == 2 ? -9007199254740993.0 : i * 1000000007.0);
    ten_set(&t[4], i, i % 2);
  }
  /* beyond double's exact integers: int64 must survive bit for bit */
  ((int64_t *)ten_data(&t[3]))[5] = INT64_MIN;
  ten_set(&t[5], 0, 42.5);
  for (int i = 0; i < 12; i++) ten_set(&t[7], i, i * 0.1);
  for (int i = 0; i < 8; i++) tp[i] = &t[i];

  ok(st_save(tmp_path("all.safetensors"), names, tp, 8, &e) == FL_OK,
     "save every dtype%s%s", e.msg[0] ? ": " : "", e.msg);
  ok(st_load(tmp_path("all.safetensors"), &l, &e) == FL_OK, "load it back %s", e.msg);
  is_int((long long)l.n, 8, "eight tensors");
  for (int i = 0; i < 8; i++) {
    const st_tensor *s = find(&l, names[i]);
    ok(s && same_values(&s->t, &t[i]), "%s: dtype, shape and values survive", names[i]);
  }
  {
    const st_tensor *s = find(&l, "idx");
    ok(s && ((int64_t *)ten_data(&s->t))[5] == INT64_MIN, "int64 exact (INT64_MIN)");
  }
  st_list_free(&l);
  ok(l.n == 0 && l.v == NULL, "st_list_free clears the list");
  st_list_free(&l);
  st_list_free(NULL);

  /* the layout on disk */
  img = read_all(tmp_path("all.safetensors"), &n);
  if (img) {
    for (int i = 7; i >= 0; i--) hlen = (hlen << 8) | img[i];
    img[n] = '\0';
    ok((8 + hlen) % 8 == 0, "data starts 8-byte aligned (header %llu bytes)",
       (unsigned long long)hlen);
    ok(img[8] == '{' && (img[8 + hlen - 1] == ' ' || img[8 + hlen - 1] == '}'),
       "header is a JSON object, padded with spaces");
    ok(strstr((char *)img + 8, "\"__metadata__\":{\"format\":\"pt\"}") != NULL,
       "metadata {\"format\": \"pt\"}");
    {
      char *a = strstr((char *)img + 8, "\"a.f16\""), *d = strstr((char *)img + 8, "\"deep\""),
           *w = strstr((char *)img + 8, "\"w.f32\"");
      ok(a && d && w && a < d && d < w, "names sorted in the header");
    }
    ok(strstr((char *)img + 8, "\"a.f16\":{\"dtype\":\"F16\",\"shape\":[2,3],"
              "\"data_offsets\":[0,12]}") != NULL, "first entry exactly as expected");
    ok(st_parse(img, n, &l, &e) == FL_OK && l.n == 8, "st_parse reads the same image");
    ok(l.n && strcmp(l.v[0].name, "a.f16") == 0, "list is in file (offset) order");
    st_list_free(&l);
    free(img);
  }
  for (int i = 0; i < 8; i++) ten_release(&t[i]);
}

/* A transposed (non-contiguous) view is written in logical order. */
static void test_strided(void) {
  static const int64_t s[2] = {2, 3};
  fl_tensor a = make(FL_F32, 2, s), v;
  const fl_tensor *tp[1] = {&v};
  const char *names[1] = {"t"};
  st_list l;
  fl_err e = {0};
  for (int i = 0; i < 6; i++) ten_set(&a, i, i);
  ten_share(&v, &a);
  v.m.shape[0] = 3; v.m.shape[1] = 2;
  v.stride[0] = 1; v.stride[1] = 3;
  ok(st_save(tmp_path("t.safetensors"), names, tp, 1, &e) == FL_OK, "save a transposed view");
  ok(st_load(tmp_path("t.safetensors"), &l, &e) == FL_OK, "load it");
  if (l.n == 1) {
    double want[6] = {0, 3, 1, 4, 2, 5}, got[6];
    for (int i = 0; i < 6; i++) got[i] = ten_get(&l.v[0].t, i);
    ok(memcmp(want, got, sizeof want) == 0 && l.v[0].t.m.shape[0] == 3,
       "values in logical (transposed) order");
  }
  st_list_free(&l);
  ten_release(&v);
  ten_release(&a);
}

/* An image: 8-byte length, header text as given, then n data bytes. */
static size_t image(unsigned char *buf, const char *hdr, const void *data, size_t n) {
  size_t h = strlen(hdr);
  for (int i = 0; i < 8; i++) buf[i] = (unsigned char)((uint64_t)h >> (8 * i));
  memcpy(buf + 8, hdr, h);
  if (n) memcpy(buf + 8 + h, data, n);
  return 8 + h + n;
}

static void expect_fail(const void *img, size_t n, int code, const char *want, const char *name) {
  st_list l = {(st_tensor *)1, 99};
  fl_err e = {0};
  int rc = st_parse(img, n, &l, &e);
  if (!ok(rc == code && strstr(e.msg, want) && l.n == 0 && l.v == NULL, "%s", name))
    printf("#   rc %d, message \"%s\"\n#   wanted code %d and \"%s\"\n", rc, e.msg, code, want);
}

static void test_parse_variants(void) {
  unsigned char buf[512];
  const float data[3] = {1, 2, 3};
  st_list l;
  fl_err e = {0};
  size_t n;
  n = image(buf, "{\"__metadata__\": {\"a\": \"b\"}, \"x\": {\"dtype\": \"F32\", "
            "\"shape\": [3], \"data_offsets\": [0, 12], \"extra\": 1}}\n\t   ", data, 12);
  ok(st_parse(buf, n, &l, &e) == FL_OK && l.n == 1 && ten_get(&l.v[0].t, 2) == 3.0,
     "metadata, unknown keys and trailing whitespace accepted %s", e.msg);
  st_list_free(&l);
  n = image(buf, "{}", NULL, 0);
  ok(st_parse(buf, n, &l, &e) == FL_OK && l.n == 0, "an empty file of weights");
  n = image(buf, "{\"b\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[0,0]},"
            "\"a\":{\"dtype\":\"BOOL\",\"shape\":[2],\"data_offsets\":[0,2]}}",
            "\x00\x07", 2);
  ok(st_parse(buf, n, &l, &e) == FL_OK && l.n == 2, "a zero-size tensor sharing an offset");
  if (l.n == 2) {
    const st_tensor *a = find(&l, "a");
    ok(a && ten_get(&a->t, 0) == 0 && ten_get(&a->t, 1) == 1, "bool bytes normalized to 0/1");
  }
  st_list_free(&l);
}

static void test_malformed(void) {
  unsigned char buf[1024];
  const float data[4] = {1, 2, 3, 4};
  size_t n;

  memset(buf, 0, sizeof buf);
  expect_fail(buf, 0, FL_EFORMAT, "safetensors: file is 0 bytes, too short", "empty image");
  expect_fail("\x01\x02\x03", 3, FL_EFORMAT, "too short for the 8-byte header length",
              "3-byte image");
  n = image(buf, "{}", NULL, 0);
  buf[0] = 200;
  expect_fail(buf, n, FL_EFORMAT, "header length 200 runs past the end of the file "
              "(2 bytes after the length)", "header length > file");
  memset(buf, 0xff, 8);
  expect_fail(buf, n, FL_EFORMAT, "header length 18446744073709551615 runs past",
              "header length 2^64-1");
  n = image(buf, " ", NULL, 0);
  expect_fail(buf, n, FL_EFORMAT, "too short for a JSON object", "1-byte header");
  n = image(buf, "{\"x\": {\"dtype\": \"F32\",}", NULL, 0);
  expect_fail(buf, n, FL_EFORMAT, "header is not valid JSON (error near header byte",
              "invalid JSON");
  n = image(buf, "[1, 2, 3]", NULL, 0);
  expect_fail(buf, n, FL_EFORMAT, "header is not a JSON object", "header is a list");
  n = image(buf, "{} {}", NULL, 0);
  expect_fail(buf, n, FL_EFORMAT, "unexpected text after the header's JSON (header byte 3)",
              "two JSON values");
  n = image(buf, "{\"x\": {}}  ", NULL, 0);
  buf[8 + 9] = '\0';
  expect_fail(buf, n, FL_EFORMAT, "control byte 0x00 at header byte 9", "NUL in the header");
  /* an escaped NUL would end the name early: "weight\u0000evil" read as
  ** "weight" here, as something else by other readers */
  n = image(buf, "{\"weight\\u0000evil\": {\"dtype\": \"F32\", \"shape\": [1], "
            "\"data_offsets\": [0, 4]}}", data, 4);
  expect_fail(buf, n, FL_EFORMAT, "a string holds an escaped NUL (\\u0000) at header byte 8",
              "an escaped NUL inside a tensor name");
  n = image(buf, "{\"__metadata__\": {\"k\": \"v\\u0000\"}}", NULL, 0);
  expect_fail(buf, n, FL_EFORMAT, "escaped NUL", "an escaped NUL in a metadata value");
  n = image(buf, "{\"a\\\\u0000\": {\"dtype\": \"F32\", \"shape\": [1], "
            "\"data_offsets\": [0, 4]}}", data, 4);
  {
    st_list l;
    fl_err e = {0};
    ok(st_parse(buf, n, &l, &e) == FL_OK && l.n == 1 && strcmp(l.v[0].name, "a\\u0000") == 0,
       "an escaped backslash before u0000 is text, not a NUL %s", e.msg);
    st_list_free(&l);
  }
  n = image(buf, "{\"w\\u0007\": {\"dtype\": \"F32\", \"shape\": [1], "
            "\"data_offsets\": [0, 4]}}", data, 4);
  expect_fail(buf, n, FL_EFORMAT, "tensor 'w\\x07': the name holds a control character (0x07)",
              "an escaped BEL in a tensor name");
  n = image(buf, "{\"w\\u007f\": {\"dtype\": \"F32\", \"shape\": [1], "
            "\"data_offsets\": [0, 4]}}", data, 4);
  expect_fail(buf, n, FL_EFORMAT, "control character (0x7f)", "DEL in a tensor name");
  n = image(buf, "{\"w\\u009b\": {\"dtype\": \"F32\", \"shape\": [1], "
            "\"data_offsets\": [0, 4]}}", data, 4);
  expect_fail(buf, n, FL_EFORMAT, "control character (0x9b)", "a C1 control (CSI) in a tensor name");
  n = image(buf, "{\"w\\u00e9\": {\"dtype\": \"F32\", \"shape\": [1], "
            "\"data_offsets\": [0, 4]}}", data, 4);
  {
    st_list l;
    fl_err e = {0};
    ok(st_parse(buf, n, &l, &e) == FL_OK && l.n == 1 && strcmp(l.v[0].name, "w\xc3\xa9") == 0,
       "a name in other UTF-8 text (\\u00e9) is kept %s", e.msg);
    st_list_free(&l);
  }
  n = image(buf, "{\"w\": {\"dtype\": \"Q8\", \"shape\": [1], \"data_offsets\": [0, 1]}}",
            data, 1);
  expect_fail(buf, n, FL_EFORMAT, "safetensors: tensor 'w': unknown dtype 'Q8'", "unknown dtype");
  n = image(buf, "{\"w\": {\"dtype\": \"U16\", \"shape\": [1], \"data_offsets\": [0, 2]}}",
            data, 2);
  expect_fail(buf, n, FL_EUNSUPPORTED, "tensor 'w': dtype U16 is not supported",
              "U16 (valid, unsupported)");
  n = image(buf, "{\"w\": {\"dtype\": 3, \"shape\": [1], \"data_offsets\": [0, 4]}}", data, 4);
  expect_fail(buf, n, FL_EFORMAT, "tensor 'w': 'dtype' is not a string", "dtype not a string");
  n = image(buf, "{\"w\": {\"dtype\": \"F32\", \"shape\": [-1], \"data_offsets\": [0, 4]}}",
            data, 4);
  expect_fail(buf, n, FL_EFORMAT, "tensor 'w': shape entry 1 is not a non-negative integer",
              "negative dim");
  n = image(buf, "{\"w\": {\"dtype\": \"F32\", \"shape\": [2, 1.5], \"data_offsets\": [0, 4]}}",
            data, 4);
  expect_fail(buf, n, FL_EFORMAT, "tensor 'w': shape entry 2 is not a non-negative integer",
              "fractional dim");
  n = image(buf, "{\"w\": {\"dtype\": \"F32\", \"shape\": \"3\", \"data_offsets\": [0, 4]}}",
            data, 4);
  expect_fail(buf, n, FL_EFORMAT, "tensor 'w': 'shape' is not a list", "shape not a list");
  n = image(buf, "{\"w\": {\"dtype\": \"F32\", \"shape\": [1,1,1,1,1,1,1,1,1], "
            "\"data_offsets\": [0, 4]}}", data, 4);
  expect_fail(buf, n, FL_EUNSUPPORTED, "tensor 'w': shape has 9 dims (at most 8 supported)",
              "9 dims");
  n = image(buf, "{\"w\": {\"dtype\": \"F32\", \"shape\": [4503599627370496, 4503599627370496], "
            "\"data_offsets\": [0, 4]}}", data, 4);
  expect_fail(buf, n, FL_EFORMAT, "tensor 'w': shape [4503599627370496,4503599627370496] "
              "is too large", "shape overflows");
  n = image(buf, "{\"w\": {\"dtype\": \"F32\", \"shape\": [0, 4503599627370496, 4503599627370496], "
            "\"data_offsets\": [0, 0]}}", NULL, 0);
  expect_fail(buf, n, FL_EFORMAT, "is too large", "empty but huge shape");
  n = image(buf, "{\"w\": {\"dtype\": \"F32\", \"shape\": [3]}}", data, 12);
  expect_fail(buf, n, FL_EFORMAT, "tensor 'w': no 'data_offsets'", "missing data_offsets");
  n = image(buf, "{\"w\": {\"shape\": [3], \"data_offsets\": [0, 12]}}", data, 12);
  expect_fail(buf, n, FL_EFORMAT, "tensor 'w': no 'dtype'", "missing dtype");
  n = image(buf, "{\"w\": [1, 2]}", NULL, 0);
  expect_fail(buf, n, FL_EFORMAT, "tensor 'w': entry is not an object", "entry not an object");
  n = image(buf, "{\"w\": {\"dtype\": \"F32\", \"shape\": [3], \"data_offsets\": [0]}}",
            data, 12);
  expect_fail(buf, n, FL_EFORMAT, "tensor 'w': 'data_offsets' is not a list of two",
              "one offset");
  n = image(buf, "{\"w\": {\"dtype\": \"F32\", \"shape\": [3], \"data_offsets\": [0, 1e300]}}",
            data, 12);
  expect_fail(buf, n, FL_EFORMAT, "'data_offsets' is not a list of two non-negative integers",
              "offset 1e300");
  n = image(buf, "{\"w\": {\"dtype\": \"F32\", \"shape\": [3], \"data_offsets\": [12, 0]}}",
            data, 12);
  expect_fail(buf, n, FL_EFORMAT, "tensor 'w': data_offsets [12, 0] end before they begin",
              "reversed offsets");
  n = image(buf, "{\"w\": {\"dtype\": \"F32\", \"shape\": [3], \"data_offsets\": [0, 8]}}",
            data, 8);
  expect_fail(buf, n, FL_EFORMAT, "tensor 'w': F32 [3] needs 12 bytes, data_offsets [0, 8] hold 8",
              "length does not match the shape");
  n = image(buf, "{\"w\": {\"dtype\": \"F32\", \"shape\": [3], \"data_offsets\": [4, 16]}}",
            data, 12);
  expect_fail(buf, n, FL_EFORMAT, "tensor 'w': data_offsets [4, 16] run past the end of the data "
              "(12 bytes)", "out of bounds");
  n = image(buf, "{\"a\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [0, 8]},"
            "\"b\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [4, 12]}}", data, 12);
  expect_fail(buf, n, FL_EFORMAT, "tensor 'b': data_offsets [4, 12] overlap tensor 'a' [0, 8]",
              "overlap");
  n = image(buf, "{\"a\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [0, 4]},"
            "\"b\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [8, 12]}}", data, 12);
  expect_fail(buf, n, FL_EFORMAT, "bytes [4, 8) of the data belong to no tensor (next is 'b')",
              "gap");
  n = image(buf, "{\"a\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [0, 4]}}",
            data, 16);
  expect_fail(buf, n, FL_EFORMAT, "12 bytes of data after the last tensor", "trailing data");
  n = image(buf, "{\"a\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [0, 4]},"
            "\"a\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [4, 8]}}", data, 8);
  expect_fail(buf, n, FL_EFORMAT, "tensor 'a': appears twice in the header", "duplicate name");
  n = image(buf, "{\"__metadata__\": {\"k\": 1}}", NULL, 0);
  expect_fail(buf, n, FL_EFORMAT, "'__metadata__' value of 'k' is not a string",
              "metadata value not a string");
  n = image(buf, "{\"__metadata__\": [1]}", NULL, 0);
  expect_fail(buf, n, FL_EFORMAT, "'__metadata__' is not an object", "metadata not an object");
  n = image(buf, "{\"b\\\\ad'\": {\"dtype\": \"Q\", \"shape\": [], \"data_offsets\": [0, 0]}}",
            NULL, 0);
  expect_fail(buf, n, FL_EFORMAT, "tensor 'b\\x5cad\\x27': unknown dtype",
              "a backslash and a quote in a name are escaped in the message");
  n = image(buf, "{\"b\\u001bad'\": {\"dtype\": \"Q\", \"shape\": [], \"data_offsets\": [0, 0]}}",
            NULL, 0);
  expect_fail(buf, n, FL_EFORMAT, "tensor 'b\\x1bad\\x27': the name holds a control character",
              "an ESC in a name: refused, escaped in the message");
}

static void test_files(void) {
  static const int64_t s[1] = {2};
  fl_tensor a = make(FL_F32, 1, s);
  const fl_tensor *tp[2] = {&a, &a};
  const char *names[2] = {"x", "x"}, *empty[1] = {""}, *meta[1] = {"__metadata__"};
  st_list l;
  fl_err e = {0};
  FILE *f;
  DIR *dp;
  struct dirent *de;
  int temps = 0;

  ok(st_load(tmp_path("nope.safetensors"), &l, &e) == FL_EIO && strstr(e.msg, "nope.safetensors: "
     "No such file or directory"), "missing file names the path (%s)", e.msg);
  ok(st_load(dir, &l, &e) == FL_EIO && strstr(e.msg, "is a directory, not a regular file"),
     "a directory (%s)", e.msg);
  /* only regular files are read: a FIFO would block, /dev/zero never end
  ** (the alarm turns a regression into a failure, not a hang) */
  alarm(60);
  ok(mkfifo(tmp_path("fifo"), 0600) == 0 && st_load(tmp_path("fifo"), &l, &e) == FL_EIO &&
     strstr(e.msg, "fifo: is a FIFO (named pipe), not a regular file"), "a FIFO (%s)", e.msg);
  ok(st_save(tmp_path("fifo"), names, tp, 1, &e) == FL_EIO &&
     strstr(e.msg, "fifo: is a FIFO (named pipe), not a regular file (refusing to replace it)"),
     "no save over a FIFO (%s)", e.msg);
  ok(st_load("/dev/zero", &l, &e) == FL_EIO &&
     strstr(e.msg, "/dev/zero: is a character device, not a regular file"), "/dev/zero (%s)", e.msg);
  {
    /* as root a null device of our own: a regression must not replace
    ** the system's /dev/null (others cannot replace it anyway) */
    char null[512];
    struct stat sb;
    snprintf(null, sizeof null, "%s", tmp_path("null"));
    if (mknod(null, S_IFCHR | 0666, makedev(1, 3)) != 0) snprintf(null, sizeof null, "/dev/null");
    ok(st_save(null, names, tp, 1, &e) == FL_EIO && strstr(e.msg, "null: is a character device") &&
       lstat(null, &sb) == 0 && S_ISCHR(sb.st_mode), "no save over a null device (%s)", e.msg);
    if (strcmp(null, "/dev/null") != 0) unlink(null);
  }
  alarm(0);
  unlink(tmp_path("fifo"));
  /* a key holding a terminal command is escaped in messages */
  write_st(tmp_path("esc.safetensors"),
           "{\"\\u001b[31m\":{\"dtype\":\"F64\",\"shape\":[],\"data_offsets\":[0,8]}}",
           "\0\0\0\0\0\0\0\0", 8);
  ok(st_load(tmp_path("esc.safetensors"), &l, &e) == FL_EFORMAT &&
     strstr(e.msg, "tensor '\\x1b[31m': the name holds a control character (0x1b)") &&
     !strchr(e.msg, 0x1b) && l.n == 0, "an ESC in a key is refused, and escaped in the message (%s)", e.msg);
  /* the file that named a tensor "weight" for us and "weight\0evil" for
  ** others: refused whole, the message naming the file */
  write_st(tmp_path("nul.safetensors"),
           "{\"weight\\u0000evil\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}",
           "\0\0\x80\x3f", 4);
  ok(st_load(tmp_path("nul.safetensors"), &l, &e) == FL_EFORMAT &&
     strstr(e.msg, "nul.safetensors: safetensors: a string holds an escaped NUL") && l.n == 0 && !l.v,
     "st_load refuses a NUL escaped in a name, naming the file, nothing loaded (%s)", e.msg);
  f = fopen(tmp_path("bad.safetensors"), "wb");
  if (f) { fwrite("\x10\0\0\0\0\0\0\0{\"w\":{}}", 1, 16, f); fclose(f); }
  ok(st_load(tmp_path("bad.safetensors"), &l, &e) == FL_EFORMAT &&
     strstr(e.msg, "bad.safetensors: safetensors: header length 16 runs past"),
     "st_load: path then the reader's message (%s)", e.msg);
  f = fopen(tmp_path("bad2.safetensors"), "wb");
  if (f) { fwrite("\x08\0\0\0\0\0\0\0{\"w\":{}}", 1, 16, f); fclose(f); }
  ok(st_load(tmp_path("bad2.safetensors"), &l, &e) == FL_EFORMAT &&
     strstr(e.msg, "bad2.safetensors: safetensors: tensor 'w': no 'dtype'"),
     "st_load names the tensor (%s)", e.msg);

  ok(st_save(tmp_path("d.safetensors"), names, tp, 2, &e) == FL_EINVAL &&
     strstr(e.msg, "name 'x' given twice"), "save: duplicate names (%s)", e.msg);
  ok(st_save(tmp_path("d.safetensors"), empty, tp, 1, &e) == FL_EINVAL &&
     strstr(e.msg, "empty name"), "save: empty name (%s)", e.msg);
  ok(st_save(tmp_path("d.safetensors"), meta, tp, 1, &e) == FL_EINVAL &&
     strstr(e.msg, "'__metadata__' cannot name a tensor"), "save: reserved name (%s)", e.msg);
  ok(st_save(tmp_path("no/such/dir.safetensors"), names, tp, 1, &e) == FL_EIO &&
     strstr(e.msg, "no/such/dir.safetensors: No such file"), "save: missing dir (%s)", e.msg);
  ok(st_save(tmp_path("ok.safetensors"), names, tp, 1, &e) == FL_OK, "save one tensor");
  ok(access(tmp_path("d.safetensors"), F_OK) != 0, "a failed save leaves no file");
  if ((dp = opendir(dir)) != NULL) {
    while ((de = readdir(dp)) != NULL) temps += strstr(de->d_name, ".tmp.") != NULL;
    closedir(dp);
  }
  is_int(temps, 0, "no temp files left behind");
  ten_release(&a);
}

static void cleanup(void) {
  DIR *dp = opendir(dir);
  struct dirent *de;
  if (!dp) return;
  while ((de = readdir(dp)) != NULL) {
    if (strcmp(de->d_name, ".") == 0 || strcmp(de->d_name, "..") == 0) continue;
    unlink(tmp_path(de->d_name));
  }
  closedir(dp);
  rmdir(dir);
}

int main(void) {
  const char *base = getenv("TMPDIR");
  snprintf(dir, sizeof dir, "%s/test_st.XXXXXX", base && *base ? base : "/tmp");
  if (!mkdtemp(dir)) { printf("Bail out! mkdtemp %s failed\n", dir); return 1; }
  test_round_trip();
  test_strided();
  test_parse_variants();
  test_malformed();
  test_files();
  cleanup();
  return tap_done();
}
