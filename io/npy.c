/*
** npy.c -- NumPy .npy reader and writer (format versions 1.0, 2.0, 3.0).
**
** A .npy image is: the magic "\x93NUMPY", a major and minor version byte,
** a little-endian header length (2 bytes in 1.0, 4 in 2.0 and 3.0), the
** header -- a Python dict literal such as
**   {'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }
** padded with spaces and ended by '\n' -- and then the raw elements.
**
** Invariant of the reader: no byte is read before its offset has been
** checked against the image size, and nothing is allocated before the
** header is fully validated and the data length matches it exactly, so a
** hostile file can neither read out of bounds nor make us allocate what it
** does not contain.  The header is parsed by a small strict tokenizer, not
** evaluated: only the three keys NumPy writes, with the value kinds NumPy
** writes, are accepted.
**
** Messages: npy_parse says "npy: <what was wrong>"; npy_load says
** "load: <path>: <what was wrong>"; npy_save says "save: <path>: <why>".
*/
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <unistd.h>

#include "graph/file.h"
#include "io/npy.h"

/* Element encodings a file may hold.  The first four map one to one onto
** fuselab dtypes; float64 and int32 are converted on load (to float32 and
** int64), since NumPy's defaults make them the most common files around. */
typedef enum fkind {
  FK_F4,   /* '<f4' -> float32 */
  FK_F2,   /* '<f2' -> float16 */
  FK_I8,   /* '<i8' -> int64 */
  FK_B1,   /* '|b1' -> bool */
  FK_F8,   /* '<f8' -> float64 */
  FK_I4    /* '<i4' -> int64 (sign-extended) */
} fkind;

static const struct {
  const char *descr;  /* exactly as NumPy writes it */
  fkind kind;
  size_t size;        /* bytes per element in the file */
  fl_dtype dtype;     /* what the loaded tensor holds */
} kinds[] = {
  {"<f4", FK_F4, 4, FL_F32},
  {"<f2", FK_F2, 2, FL_F16},
  {"<i8", FK_I8, 8, FL_I64},
  {"|b1", FK_B1, 1, FL_BOOL},
  {"<f8", FK_F8, 8, FL_F64},
  {"<i4", FK_I4, 4, FL_I64},
};
#define NKINDS ((int)(sizeof kinds / sizeof kinds[0]))

/* What a validated header says. */
typedef struct header {
  int kind;                       /* index into kinds[] */
  int fortran;                    /* data is column-major */
  int ndim;
  int64_t shape[FL_MAX_DIMS];
  int64_t numel;
  uint64_t data_bytes;            /* exact byte length the data must have */
} header;

static const unsigned char magic[6] = {0x93, 'N', 'U', 'M', 'P', 'Y'};

/* Constant-folded by compilers; the fast paths copy raw bytes only when
** the host order matches the file's little-endian order. */
static int host_little_endian(void) {
  const uint16_t one = 1;
  unsigned char c;
  memcpy(&c, &one, 1);
  return c == 1;
}

static uint64_t get_le(const unsigned char *p, int nbytes) {
  uint64_t v = 0;
  for (int i = nbytes - 1; i >= 0; i--) v = (v << 8) | p[i];
  return v;
}

static void put_le(unsigned char *p, uint64_t v, int nbytes) {
  for (int i = 0; i < nbytes; i++) { p[i] = (unsigned char)(v & 0xff); v >>= 8; }
}

/* Copy at most 24 bytes of s into buf for a message, escaping anything
** unprintable: header bytes come from files and end up on terminals. */
static const char *quote(const char *s, size_t len, char *buf, size_t n) {
  size_t o = 0;
  for (size_t i = 0; i < len && o + 5 < n; i++) {
    unsigned char c = (unsigned char)s[i];
    if (i == 24) { memcpy(buf + o, "...", 3); o += 3; break; }
    if (c >= 0x20 && c < 0x7f && c != '\\') buf[o++] = (char)c;
    else o += (size_t)snprintf(buf + o, n - o, "\\x%02x", c);
  }
  buf[o] = '\0';
  return buf;
}

/* ---- header tokenizer ------------------------------------------------- */

typedef enum tok {
  T_EOF,     /* end of the header text */
  T_PUNCT,   /* one of { } ( ) , : -- the character is in .c */
  T_STR,     /* 'text' or "text"; no escapes (NumPy never writes any) */
  T_INT,     /* decimal digits, optional leading '-', optional Python 2 'L' */
  T_NAME,    /* True, False or any other identifier (rejected later) */
  T_BAD      /* a character no Python literal of this grammar contains */
} tok;

typedef struct lexer {
  const char *s;   /* header text, not NUL-terminated */
  size_t n, pos;
  /* the current token */
  tok t;
  char c;          /* T_PUNCT: the character */
  size_t start;    /* offset of the token in the header */
  const char *text; size_t len;   /* T_STR contents, T_INT/T_NAME/T_BAD text */
} lexer;

static int is_space(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v';
}
static int is_digit(char c) { return c >= '0' && c <= '9'; }
static int is_ident(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || is_digit(c);
}

/* Advance to the next token.  An unterminated string is T_BAD. */
static void next(lexer *lx) {
  while (lx->pos < lx->n && is_space(lx->s[lx->pos])) lx->pos++;
  lx->start = lx->pos;
  lx->text = lx->s + lx->pos;
  lx->len = 0;
  if (lx->pos >= lx->n) { lx->t = T_EOF; return; }
  char c = lx->s[lx->pos];
  if (c != '\0' && strchr("{}(),:", c)) {
    lx->t = T_PUNCT; lx->c = c; lx->pos++; lx->len = 1;
  } else if (c == '\'' || c == '"') {
    size_t i = lx->pos + 1;
    while (i < lx->n && lx->s[i] != c && lx->s[i] != '\\' && lx->s[i] != '\n') i++;
    if (i >= lx->n || lx->s[i] != c) {
      lx->t = T_BAD; lx->len = i - lx->pos; lx->pos = i;
      return;
    }
    lx->t = T_STR; lx->text = lx->s + lx->pos + 1; lx->len = i - lx->pos - 1;
    lx->pos = i + 1;
  } else if (is_digit(c) || c == '-') {
    size_t i = lx->pos + 1;
    while (i < lx->n && is_ident(lx->s[i])) i++;
    lx->t = T_INT; lx->len = i - lx->pos; lx->pos = i;
  } else if (is_ident(c)) {
    size_t i = lx->pos + 1;
    while (i < lx->n && is_ident(lx->s[i])) i++;
    lx->t = T_NAME; lx->len = i - lx->pos; lx->pos = i;
  } else {
    lx->t = T_BAD; lx->len = 1; lx->pos++;
  }
}

/* Describe the current token for "expected X, found Y" messages. */
static const char *tok_desc(const lexer *lx, char *buf, size_t n) {
  char q[128];
  switch (lx->t) {
  case T_EOF: return "end of header";
  case T_PUNCT: snprintf(buf, n, "'%c'", lx->c); return buf;
  case T_STR: snprintf(buf, n, "string '%s'", quote(lx->text, lx->len, q, sizeof q)); return buf;
  default: snprintf(buf, n, "'%s'", quote(lx->text, lx->len, q, sizeof q)); return buf;
  }
}

static int expected(const lexer *lx, const char *what, fl_err *e) {
  char d[160];
  return err_set(e, FL_EFORMAT, "bad header: expected %s at header byte %zu, found %s",
                 what, lx->start, tok_desc(lx, d, sizeof d));
}

static int is_punct(const lexer *lx, char c) { return lx->t == T_PUNCT && lx->c == c; }

/* Parse one integer token of a shape.  Negative values and values that
** do not fit an int64 are reported with the offending text. */
static int parse_dim(const lexer *lx, int64_t *out, fl_err *e) {
  char q[128];
  const char *s = lx->text;
  size_t len = lx->len, i = 0;
  int neg = 0;
  uint64_t v = 0;
  if (len > 0 && (s[len - 1] == 'L' || s[len - 1] == 'l')) len--;  /* Python 2 long */
  if (i < len && s[i] == '-') { neg = 1; i++; }
  if (i >= len) return expected(lx, "a dimension", e);
  if (s[i] == '0' && len - i > 1)
    return err_set(e, FL_EFORMAT, "bad header: bad dimension '%s' (leading zero)",
                   quote(lx->text, lx->len, q, sizeof q));
  for (; i < len; i++) {
    if (!is_digit(s[i]))
      return err_set(e, FL_EFORMAT, "bad header: bad dimension '%s'",
                     quote(lx->text, lx->len, q, sizeof q));
    if (v > ((uint64_t)INT64_MAX - (uint64_t)(s[i] - '0')) / 10)
      return err_set(e, FL_EFORMAT, "bad header: dimension '%s' is too large",
                     quote(lx->text, lx->len, q, sizeof q));
    v = v * 10 + (uint64_t)(s[i] - '0');
  }
  if (neg && v != 0)
    return err_set(e, FL_EFORMAT, "bad header: negative dimension %s in shape",
                   quote(lx->text, lx->len, q, sizeof q));
  *out = (int64_t)v;
  return FL_OK;
}

/* shape := '(' [ int (',' int)* [','] ] ')'; a single entry needs its
** comma, since Python reads "(3)" as the number 3. */
static int parse_shape(lexer *lx, header *h, fl_err *e) {
  int count = 0, rc, commas = 0;
  if (!is_punct(lx, '(')) return expected(lx, "a tuple for 'shape'", e);
  next(lx);
  while (!is_punct(lx, ')')) {
    int64_t d = 0;
    if (lx->t != T_INT) return expected(lx, "a dimension or ')'", e);
    if ((rc = parse_dim(lx, &d, e)) != FL_OK) return rc;
    if (count < FL_MAX_DIMS) h->shape[count] = d;
    count++;
    next(lx);
    if (is_punct(lx, ',')) { commas++; next(lx); }
    else if (!is_punct(lx, ')')) return expected(lx, "',' or ')' in shape", e);
  }
  if (count == 1 && commas == 0)
    return err_set(e, FL_EFORMAT, "bad header: 'shape' (%lld) is not a tuple "
                   "(a 1-dim shape is written (%lld,))",
                   (long long)h->shape[0], (long long)h->shape[0]);
  if (count > FL_MAX_DIMS)
    return err_set(e, FL_EFORMAT, "shape has %d dims (at most %d supported)",
                   count, FL_MAX_DIMS);
  h->ndim = count;
  next(lx);
  return FL_OK;
}

static int parse_descr(lexer *lx, header *h, fl_err *e) {
  char q[128];
  if (lx->t == T_BAD && lx->text[0] == '[')   /* a list of fields */
    return err_set(e, FL_EUNSUPPORTED, "structured arrays are not supported");
  if (lx->t != T_STR) return expected(lx, "a string for 'descr'", e);
  for (int k = 0; k < NKINDS; k++)
    if (lx->len == strlen(kinds[k].descr) && memcmp(lx->text, kinds[k].descr, lx->len) == 0) {
      h->kind = k;
      next(lx);
      return FL_OK;
    }
  quote(lx->text, lx->len, q, sizeof q);
  if (lx->len > 0 && lx->text[0] == '>')
    return err_set(e, FL_EUNSUPPORTED, "big-endian descr '%s' is not supported "
                   "(save with a '<' dtype, e.g. a.astype('<%s'))", q, q + 1);
  return err_set(e, FL_EUNSUPPORTED, "unsupported descr '%s' (expected '<f4', "
                 "'<f2', '<i8', '|b1', '<f8' or '<i4')", q);
}

/* The whole header: a dict with exactly the keys descr, fortran_order and
** shape, in any order, then only whitespace. */
static int parse_header(const char *text, size_t n, header *h, fl_err *e) {
  lexer lx = {0};
  int seen[3] = {0, 0, 0}, rc;
  static const char *const keys[3] = {"descr", "fortran_order", "shape"};
  char q[128];

  lx.s = text; lx.n = n;
  memset(h, 0, sizeof *h);
  next(&lx);
  if (!is_punct(&lx, '{')) return expected(&lx, "'{'", e);
  next(&lx);
  while (!is_punct(&lx, '}')) {
    int k;
    if (lx.t != T_STR) return expected(&lx, "a key string or '}'", e);
    for (k = 0; k < 3; k++)
      if (lx.len == strlen(keys[k]) && memcmp(lx.text, keys[k], lx.len) == 0) break;
    if (k == 3)
      return err_set(e, FL_EFORMAT, "bad header: unexpected key '%s'",
                     quote(lx.text, lx.len, q, sizeof q));
    if (seen[k]) return err_set(e, FL_EFORMAT, "bad header: key '%s' repeated", keys[k]);
    seen[k] = 1;
    next(&lx);
    if (!is_punct(&lx, ':')) return expected(&lx, "':' after the key", e);
    next(&lx);
    if (k == 0) rc = parse_descr(&lx, h, e);
    else if (k == 2) rc = parse_shape(&lx, h, e);
    else if (lx.t == T_NAME && lx.len == 4 && memcmp(lx.text, "True", 4) == 0) {
      h->fortran = 1; next(&lx); rc = FL_OK;
    } else if (lx.t == T_NAME && lx.len == 5 && memcmp(lx.text, "False", 5) == 0) {
      h->fortran = 0; next(&lx); rc = FL_OK;
    } else rc = expected(&lx, "True or False for 'fortran_order'", e);
    if (rc != FL_OK) return rc;
    if (is_punct(&lx, ',')) next(&lx);
    else if (!is_punct(&lx, '}')) return expected(&lx, "',' or '}'", e);
  }
  next(&lx);
  if (lx.t != T_EOF) return expected(&lx, "only padding after the dict", e);
  for (int k = 0; k < 3; k++)
    if (!seen[k]) return err_set(e, FL_EFORMAT, "bad header: no '%s' key", keys[k]);
  return FL_OK;
}

/* Element count and byte length, refusing anything whose file or tensor
** bytes pass FL_MAX_ALLOC.  Zero-size dims are counted as 1 for the limit
** so that a shape like (0, 2^62, 2^62) cannot overflow stride arithmetic
** later on even though it holds no elements. */
static int check_size(header *h, fl_err *e) {
  size_t fsize = kinds[h->kind].size, tsize = dtype_size(kinds[h->kind].dtype);
  size_t big = fsize > tsize ? fsize : tsize;
  int64_t limit = FL_MAX_ALLOC / (int64_t)big, extent = 1, numel = 1;
  for (int i = 0; i < h->ndim; i++) {
    int64_t d = h->shape[i];
    if (d > 1 && extent > limit / d) {
      char buf[256];
      fl_meta m = {0};
      m.ndim = h->ndim;
      memcpy(m.shape, h->shape, sizeof m.shape);
      return err_set(e, FL_EFORMAT, "shape %s is too large (more than %lld bytes)",
                     meta_shape_str(&m, buf, sizeof buf), (long long)FL_MAX_ALLOC);
    }
    if (d > 1) extent *= d;
    numel *= d;
  }
  h->numel = numel;
  h->data_bytes = (uint64_t)numel * fsize;
  return FL_OK;
}

/* Magic, version and header length.  The first avail bytes of the image
** are at p; the whole image is total bytes long.  *hstart and *hend are the
** offsets of the header text and of the first data byte. */
static int parse_prefix(const unsigned char *p, size_t avail, uint64_t total,
                        size_t *hstart, size_t *hend, fl_err *e) {
  size_t lenbytes;
  uint64_t hlen;
  if (avail == 0) return err_set(e, FL_EFORMAT, "not a .npy file (empty)");
  if (avail < sizeof magic || memcmp(p, magic, sizeof magic) != 0) {
    if (avail < sizeof magic && memcmp(p, magic, avail) == 0)
      return err_set(e, FL_EFORMAT, "truncated file (%zu bytes, not even a .npy magic)", avail);
    return err_set(e, FL_EFORMAT, "not a .npy file (bad magic)");
  }
  if (avail < 8) return err_set(e, FL_EFORMAT, "truncated header (file is %zu bytes)", avail);
  if (p[6] < 1 || p[6] > 3 || p[7] != 0)
    return err_set(e, FL_EFORMAT, "unsupported .npy version %u.%u (1.0, 2.0, 3.0 are known)",
                   p[6], p[7]);
  lenbytes = p[6] == 1 ? 2 : 4;
  if (avail < 8 + lenbytes)
    return err_set(e, FL_EFORMAT, "truncated header (file is %zu bytes)", avail);
  hlen = get_le(p + 8, (int)lenbytes);
  *hstart = 8 + lenbytes;
  if (hlen > total - *hstart)
    return err_set(e, FL_EFORMAT, "header length %llu runs past the end of the file "
                   "(%llu bytes after the length field)", (unsigned long long)hlen,
                   (unsigned long long)(total - *hstart));
  *hend = *hstart + (size_t)hlen;
  return FL_OK;
}

/* ---- data decoding ------------------------------------------------------ */

/* Store file element src (kind k, little-endian) into tensor memory dst. */
static void decode_one(int k, const unsigned char *src, unsigned char *dst) {
  switch (kinds[k].kind) {
  case FK_F4: { uint32_t u = (uint32_t)get_le(src, 4); memcpy(dst, &u, 4); break; }
  case FK_F2: { uint16_t u = (uint16_t)get_le(src, 2); memcpy(dst, &u, 2); break; }
  case FK_I8: case FK_F8: { uint64_t u = get_le(src, 8); memcpy(dst, &u, 8); break; }
  case FK_B1: *dst = *src != 0; break;
  case FK_I4: {
    uint32_t u = (uint32_t)get_le(src, 4);
    int64_t v = (int32_t)u;   /* sign-extends: values fit, the cast is exact */
    memcpy(dst, &v, 8);
    break;
  }
  }
}

/* Fill out (allocated, C-contiguous) from data laid out as h says.
** Fortran-ordered data is walked in file order with an odometer over the
** dims (dim 0 fastest) that tracks the C-order destination offset. */
static void decode(const header *h, const unsigned char *data, fl_tensor *out) {
  int k = h->kind;
  size_t fsize = kinds[k].size, tsize = dtype_size(out->m.dtype);
  unsigned char *dst = ten_data(out);
  if (h->numel == 0) return;
  if (!h->fortran || h->ndim < 2) {
    if (host_little_endian() && (kinds[k].kind == FK_F4 || kinds[k].kind == FK_F2 ||
                                 kinds[k].kind == FK_I8 || kinds[k].kind == FK_F8)) {
      memcpy(dst, data, (size_t)h->data_bytes);
    } else {
      for (int64_t i = 0; i < h->numel; i++)
        decode_one(k, data + (size_t)i * fsize, dst + (size_t)i * tsize);
    }
    return;
  }
  int64_t idx[FL_MAX_DIMS] = {0}, cstride[FL_MAX_DIMS], off = 0;
  cstride[h->ndim - 1] = 1;
  for (int d = h->ndim - 2; d >= 0; d--) cstride[d] = cstride[d + 1] * h->shape[d + 1];
  for (int64_t i = 0; i < h->numel; i++) {
    decode_one(k, data + (size_t)i * fsize, dst + (size_t)off * tsize);
    for (int d = 0; d < h->ndim; d++) {
      idx[d]++;
      off += cstride[d];
      if (idx[d] < h->shape[d]) break;
      off -= idx[d] * cstride[d];
      idx[d] = 0;
    }
  }
}

static int alloc_out(const header *h, fl_tensor *out, fl_err *e) {
  fl_meta m = {0};
  m.dtype = kinds[h->kind].dtype;
  m.device = FL_DEV_CPU;
  m.ndim = h->ndim;
  memcpy(m.shape, h->shape, sizeof m.shape);
  return ten_empty(out, &m, e);
}

/* Parse a whole image into *out; bare messages (callers add context). */
static int parse_image(const unsigned char *p, size_t n, fl_tensor *out, fl_err *e) {
  size_t hstart, hend;
  header h;
  int rc;
  if ((rc = parse_prefix(p, n, n, &hstart, &hend, e)) != FL_OK) return rc;
  if ((rc = parse_header((const char *)p + hstart, hend - hstart, &h, e)) != FL_OK) return rc;
  if ((rc = check_size(&h, e)) != FL_OK) return rc;
  if (n - hend < h.data_bytes)
    return err_set(e, FL_EFORMAT, "truncated data (expected %llu bytes, found %zu)",
                   (unsigned long long)h.data_bytes, n - hend);
  if (n - hend > h.data_bytes)
    return err_set(e, FL_EFORMAT, "%llu bytes of trailing garbage after the data "
                   "(expected %llu bytes, found %zu)",
                   (unsigned long long)(n - hend - h.data_bytes),
                   (unsigned long long)h.data_bytes, n - hend);
  if ((rc = alloc_out(&h, out, e)) != FL_OK) return rc;
  decode(&h, p + hend, out);
  return FL_OK;
}

/* On success *out holds a new reference the caller releases; on failure
** *out is empty. */
int npy_parse(const void *buf, size_t n, fl_tensor *out, fl_err *e) {
  int rc;
  memset(out, 0, sizeof *out);
  if (!buf && n) return err_set(e, FL_EINVAL, "npy: no buffer");
  rc = parse_image(buf ? buf : "", n, out, e);
  if (rc != FL_OK) { ten_release(out); err_prefix(e, "npy"); }
  return rc;
}

/* ---- files --------------------------------------------------------------- */

/* Read n bytes at offset off; *got tells how many came before the end. */
static int read_at(int fd, void *buf, size_t n, uint64_t off, size_t *got, fl_err *e) {
  size_t done = 0;
  while (done < n) {
    ssize_t r = pread(fd, (char *)buf + done, n - done, (off_t)(off + done));
    if (r == 0) break;
    if (r < 0) {
      if (errno == EINTR) continue;
      return err_set(e, FL_EIO, "%s", strerror(errno));
    }
    done += (size_t)r;
  }
  *got = done;
  return FL_OK;
}

/* A regular file: read and validate the header first, compare the data
** length with the file size, then read the data straight into the tensor
** (one copy of a large file in memory, not two). */
static int load_regular(int fd, uint64_t fsz, fl_tensor *out, fl_err *e) {
  unsigned char pre[12], *hbuf = NULL, *tmp = NULL;
  size_t got, hstart, hend, pn = fsz < sizeof pre ? (size_t)fsz : sizeof pre;
  header h;
  int rc;

  if ((rc = read_at(fd, pre, pn, 0, &got, e)) != FL_OK) return rc;
  if (got != pn) return err_set(e, FL_EIO, "file shrank while reading");
  if ((rc = parse_prefix(pre, pn, fsz, &hstart, &hend, e)) != FL_OK) return rc;
  if (!(hbuf = malloc(hend - hstart + 1)))
    return err_set(e, FL_ENOMEM, "out of memory reading a %zu-byte header", hend - hstart);
  if ((rc = read_at(fd, hbuf, hend - hstart, hstart, &got, e)) != FL_OK) goto done;
  if (got != hend - hstart) { rc = err_set(e, FL_EIO, "file shrank while reading"); goto done; }
  if ((rc = parse_header((const char *)hbuf, hend - hstart, &h, e)) != FL_OK) goto done;
  if ((rc = check_size(&h, e)) != FL_OK) goto done;
  if (fsz - hend != h.data_bytes) {
    if (fsz - hend < h.data_bytes)
      rc = err_set(e, FL_EFORMAT, "truncated data (expected %llu bytes, found %llu)",
                   (unsigned long long)h.data_bytes, (unsigned long long)(fsz - hend));
    else
      rc = err_set(e, FL_EFORMAT, "%llu bytes of trailing garbage after the data "
                   "(expected %llu bytes, found %llu)",
                   (unsigned long long)(fsz - hend - h.data_bytes),
                   (unsigned long long)h.data_bytes, (unsigned long long)(fsz - hend));
    goto done;
  }
  if ((rc = alloc_out(&h, out, e)) != FL_OK) goto done;
  if (h.numel > 0) {
    int direct = host_little_endian() && !(h.fortran && h.ndim >= 2) &&
                 (kinds[h.kind].kind == FK_F4 || kinds[h.kind].kind == FK_F2 ||
                  kinds[h.kind].kind == FK_I8 || kinds[h.kind].kind == FK_F8);
    unsigned char *dst = direct ? ten_data(out) : (tmp = malloc((size_t)h.data_bytes));
    if (!dst) {
      rc = err_set(e, FL_ENOMEM, "out of memory (%llu bytes)", (unsigned long long)h.data_bytes);
      goto done;
    }
    if ((rc = read_at(fd, dst, (size_t)h.data_bytes, hend, &got, e)) != FL_OK) goto done;
    if (got != h.data_bytes) { rc = err_set(e, FL_EIO, "file shrank while reading"); goto done; }
    if (!direct) decode(&h, tmp, out);
  }
done:
  free(hbuf);
  free(tmp);
  return rc;
}

/* On success *out holds a new reference the caller releases; on failure
** *out is empty and e says "load: <path>: <why>".  Only a regular file is
** read (a FIFO or /dev/zero would block or never end), and its size
** bounds what the header may ask for. */
int npy_load(const char *path, fl_tensor *out, fl_err *e) {
  char q[512];
  uint64_t size;
  int fd, rc;
  memset(out, 0, sizeof *out);
  if (!path) return err_set(e, FL_EINVAL, "load: no path");
  if ((rc = file_open_read(path, &fd, &size, e)) != FL_OK) return err_prefix(e, "load");
  rc = load_regular(fd, size, out, e);
  close(fd);
  if (rc != FL_OK) {
    ten_release(out);
    err_prefix(e, "load: %s", err_quote(path, q, sizeof q));
  }
  return rc;
}

/* The header NumPy itself would write, padded so the data starts on a
** 64-byte boundary; returns its length (always version 1.0: eight dims
** never need more than 65535 header bytes). */
static size_t make_header(const fl_tensor *t, const char *descr, char *buf, size_t cap) {
  char shape[FL_MAX_DIMS * 24 + 8];
  size_t o = 0, total;
  shape[0] = '\0';
  for (int i = 0; i < t->m.ndim; i++)
    o += (size_t)snprintf(shape + o, sizeof shape - o, "%s%lld", i ? ", " : "",
                          (long long)t->m.shape[i]);
  if (t->m.ndim == 1) snprintf(shape + o, sizeof shape - o, ",");
  o = (size_t)snprintf(buf + 10, cap - 10,
                       "{'descr': '%s', 'fortran_order': False, 'shape': (%s), }",
                       descr, shape);
  total = 10 + o + 1;
  total = (total + 63) / 64 * 64;
  memset(buf + 10 + o, ' ', total - 10 - o - 1);
  buf[total - 1] = '\n';
  memcpy(buf, magic, 6);
  buf[6] = 1; buf[7] = 0;
  put_le((unsigned char *)buf + 8, total - 10, 2);
  return total;
}

/* Write the elements of contiguous c (already in memory order) as
** little-endian data of descr's type; bfloat16 is widened to float32. */
static int write_data(int fd, const fl_tensor *c, int64_t numel) {
  const unsigned char *src = ten_data(c);
  size_t esz = dtype_size(c->m.dtype);
  if (numel == 0) return 0;
  if (c->m.dtype != FL_BF16 && (host_little_endian() || esz == 1))
    return file_write_fd(fd, src, (size_t)numel * esz);
  unsigned char chunk[1 << 14];
  size_t osz = c->m.dtype == FL_BF16 ? 4 : esz, per = sizeof chunk / osz, k = 0;
  for (int64_t i = 0; i < numel; i++) {
    const unsigned char *p = src + (size_t)i * esz;
    if (c->m.dtype == FL_BF16) {
      uint16_t b; float f; uint32_t u;
      memcpy(&b, p, 2);
      f = bf16_to_f32(b);
      memcpy(&u, &f, 4);
      put_le(chunk + k * osz, u, 4);
    } else if (esz == 8) {
      uint64_t u; memcpy(&u, p, 8); put_le(chunk + k * osz, u, 8);
    } else if (esz == 4) {
      uint32_t u; memcpy(&u, p, 4); put_le(chunk + k * osz, u, 4);
    } else {
      uint16_t u; memcpy(&u, p, 2); put_le(chunk + k * osz, u, 2);
    }
    if (++k == per) {
      if (file_write_fd(fd, chunk, k * osz) != 0) return -1;
      k = 0;
    }
  }
  return k ? file_write_fd(fd, chunk, k * osz) : 0;
}

/* t is only read (any strides; a non-contiguous t is copied first).  The
** file appears under path complete or not at all (file_create: a temp
** file beside it, renamed over it; a FIFO, device or directory there is
** refused). */
int npy_save(const char *path, const fl_tensor *t, fl_err *e) {
  static const char *const descr[FL_NDTYPES] = {"<f4", "<f2", "<f4", "<i8", "|b1", "<f8"};
  char hdr[512], q[512];
  fl_tensor c = {0};
  file_out w;
  int64_t numel;
  size_t hlen;
  int rc;

  if (!path) return err_set(e, FL_EINVAL, "save: no path");
  err_quote(path, q, sizeof q);
  if (!t || (int)t->m.dtype < 0 || t->m.dtype >= FL_NDTYPES || t->m.ndim < 0 ||
      t->m.ndim > FL_MAX_DIMS)
    return err_set(e, FL_EINVAL, "save: %s: not a valid tensor", q);
  if (t->m.device != FL_DEV_CPU)
    return err_set(e, FL_EUNSUPPORTED, "save: %s: tensor is on %s (move it to the cpu first)",
                   q, t->m.device == FL_DEV_CUDA ? "cuda" : "another device");
  numel = meta_numel(&t->m);
  if (numel > 0 && !t->st) return err_set(e, FL_EINVAL, "save: %s: tensor has no storage", q);
  if (numel > 0 && (rc = ten_contiguous(&c, t, e)) != FL_OK)
    return err_prefix(e, "save: %s", q);

  hlen = make_header(t, descr[t->m.dtype], hdr, sizeof hdr);
  if ((rc = file_create(&w, path, e)) != FL_OK) {
    ten_release(&c);
    return err_prefix(e, "save");
  }
  if ((rc = file_write(&w, hdr, hlen, e)) != FL_OK) goto fail;
  if (write_data(w.fd, &c, numel) != 0) {
    rc = err_set(e, FL_EIO, "%s: write failed: %s", q, strerror(errno));
    goto fail;
  }
  rc = file_commit(&w, e);
  ten_release(&c);
  return rc == FL_OK ? FL_OK : err_prefix(e, "save");
fail:
  file_abort(&w);
  ten_release(&c);
  return err_prefix(e, "save");
}
