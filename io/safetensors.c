/*
** safetensors.c -- safetensors reader and writer.
**
** Layout: u64 little-endian N, N bytes of JSON (an object; padded at the
** end with spaces), then the data region.  Each tensor's data_offsets
** [begin, end) are relative to the data region.
**
** Invariant of the reader: the header is parsed and every entry checked --
** dtype known, shape non-negative integers within FL_MAX_DIMS and
** FL_MAX_ALLOC, end - begin equal to the tensor's byte size, offsets inside
** the data region -- and the entries, sorted by offset, are proved to tile
** the data region exactly (no gap, no overlap, nothing left over) before
** any tensor is allocated.  So no byte is read that the file does not
** have, and the tensors together never need more memory than the file's
** size.  The JSON itself is parsed by cJSON, over a NUL-terminated copy of
** the header; control bytes, and NULs escaped as \u0000 (which cJSON
** would decode into an early end of the name), are refused before cJSON
** sees them, and a tensor name with an escaped control character after.
**
** Messages: "safetensors: tensor 'name': <what was wrong>" or
** "safetensors: <what was wrong>" when no single tensor is at fault;
** st_load and st_save put "<path>: " in front.
*/
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/types.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "graph/file.h"
#include "io/safetensors.h"

/* The dtypes fuselab holds, by their safetensors names; indexed by
** fl_dtype (the writer relies on that order). */
static const struct {
  const char *name;
  fl_dtype dtype;
} dtypes[] = {
  {"F32", FL_F32}, {"F16", FL_F16}, {"BF16", FL_BF16}, {"I64", FL_I64}, {"BOOL", FL_BOOL},
  {"F64", FL_F64},
};
#define NDTYPES ((int)(sizeof dtypes / sizeof dtypes[0]))

/* Valid in the format, but with no fuselab dtype: a clearer message than
** "unknown" for files made elsewhere. */
static const char *const foreign[] = {
  "I32", "I16", "I8", "U8", "U16", "U32", "U64",
  "F8_E4M3", "F8_E5M2", "F6_E2M3", "F6_E3M2", "F4", "E8M0", NULL
};

/* The largest integer a JSON number (a double in cJSON) holds exactly. */
#define JSON_MAX_INT 9007199254740992.0

/* What one validated header entry says. */
typedef struct entry {
  char *name;             /* owned copy of the key */
  fl_meta m;              /* dtype and shape */
  uint64_t begin, end;    /* data_offsets */
} entry;

static int host_little_endian(void) {
  const uint16_t one = 1;
  unsigned char c;
  memcpy(&c, &one, 1);
  return c == 1;
}

static uint64_t get_le64(const unsigned char *p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; i--) v = (v << 8) | p[i];
  return v;
}

static void put_le64(unsigned char *p, uint64_t v) {
  for (int i = 0; i < 8; i++) { p[i] = (unsigned char)(v & 0xff); v >>= 8; }
}

/* At most 48 bytes of a name for a message, unprintable bytes escaped:
** names come from files and end up on terminals. */
static const char *quote(const char *s, char *buf, size_t n) {
  size_t o = 0;
  for (size_t i = 0; s[i] && o + 5 < n; i++) {
    unsigned char c = (unsigned char)s[i];
    if (i == 48) { memcpy(buf + o, "...", 3); o += 3; break; }
    if (c >= 0x20 && c < 0x7f && c != '\\' && c != '\'') buf[o++] = (char)c;
    else o += (size_t)snprintf(buf + o, n - o, "\\x%02x", c);
  }
  buf[o] = '\0';
  return buf;
}

/* err_set with "tensor '<name>': " in front. */
static int terr(fl_err *e, int code, const char *name, const char *fmt, ...)
#ifdef __GNUC__
  __attribute__((format(printf, 4, 5)))
#endif
  ;
static int terr(fl_err *e, int code, const char *name, const char *fmt, ...) {
  char q[256], msg[FL_ERR_MSG];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  return err_set(e, code, "tensor '%s': %s", quote(name, q, sizeof q), msg);
}

static void free_entries(entry *v, size_t n) {
  if (!v) return;
  for (size_t i = 0; i < n; i++) free(v[i].name);
  free(v);
}

static void free_meta(st_meta *m, size_t n) {
  if (!m) return;
  for (size_t i = 0; i < n; i++) {
    free(m[i].key);
    free(m[i].value);
  }
  free(m);
}

void st_list_free(st_list *l) {
  if (!l) return;
  for (size_t i = 0; i < l->n; i++) {
    free(l->v[i].name);
    ten_release(&l->v[i].t);
  }
  free(l->v);
  free_meta(l->meta, l->nmeta);
  l->v = NULL;
  l->n = 0;
  l->meta = NULL;
  l->nmeta = 0;
}

/* ---- header ------------------------------------------------------------- */

/* A JSON number that is an exact non-negative integer. */
static int json_uint(const cJSON *j, uint64_t *out) {
  double v;
  if (!cJSON_IsNumber(j)) return 0;
  v = j->valuedouble;
  if (!isfinite(v) || v < 0 || v != floor(v) || v > JSON_MAX_INT) return 0;
  *out = (uint64_t)v;
  return 1;
}

static int parse_dtype(const char *name, const cJSON *j, fl_dtype *out, fl_err *e) {
  char q[128];
  if (!cJSON_IsString(j) || !j->valuestring)
    return terr(e, FL_EFORMAT, name, "'dtype' is not a string");
  for (int k = 0; k < NDTYPES; k++)
    if (strcmp(j->valuestring, dtypes[k].name) == 0) { *out = dtypes[k].dtype; return FL_OK; }
  for (int k = 0; foreign[k]; k++)
    if (strcmp(j->valuestring, foreign[k]) == 0)
      return terr(e, FL_EUNSUPPORTED, name, "dtype %s is not supported "
                  "(F32, F16, BF16, I64 and BOOL are)", foreign[k]);
  return terr(e, FL_EFORMAT, name, "unknown dtype '%s'", quote(j->valuestring, q, sizeof q));
}

/* Shape: a list of at most FL_MAX_DIMS non-negative integers whose
** product, in bytes, fits FL_MAX_ALLOC.  Zero dims count as 1 for the
** limit, so [0, 2^40, 2^40] cannot overflow later stride arithmetic. */
static int parse_shape(const char *name, const cJSON *j, fl_meta *m, fl_err *e) {
  int64_t limit, extent = 1;
  int nd = 0;
  const cJSON *d;
  char sh[256];
  if (!cJSON_IsArray(j)) return terr(e, FL_EFORMAT, name, "'shape' is not a list");
  cJSON_ArrayForEach(d, j) {
    uint64_t v;
    if (!json_uint(d, &v))
      return terr(e, FL_EFORMAT, name, "shape entry %d is not a non-negative integer", nd + 1);
    if (nd == FL_MAX_DIMS)
      return terr(e, FL_EUNSUPPORTED, name, "shape has %d dims (at most %d supported)",
                  cJSON_GetArraySize(j), FL_MAX_DIMS);
    m->shape[nd++] = (int64_t)v;
  }
  m->ndim = nd;
  limit = FL_MAX_ALLOC / (int64_t)dtype_size(m->dtype);
  for (int i = 0; i < nd; i++) {
    int64_t s = m->shape[i];
    if (s > 1 && extent > limit / s)
      return terr(e, FL_EFORMAT, name, "shape %s is too large (more than %lld bytes)",
                  meta_shape_str(m, sh, sizeof sh), (long long)FL_MAX_ALLOC);
    if (s > 1) extent *= s;
  }
  return FL_OK;
}

/* One tensor entry: {"dtype": ..., "shape": [...], "data_offsets": [b, e]}
** with offsets inside the data_len bytes of data and end - begin the
** tensor's byte size.  Other keys are ignored, as the format allows. */
static int parse_entry(const cJSON *j, uint64_t data_len, entry *out, fl_err *e) {
  const char *name = out->name;
  const cJSON *off;
  uint64_t nbytes;
  char sh[256];
  int rc;
  if (!cJSON_IsObject(j)) return terr(e, FL_EFORMAT, name, "entry is not an object");
  if (!cJSON_GetObjectItemCaseSensitive(j, "dtype"))
    return terr(e, FL_EFORMAT, name, "no 'dtype'");
  if (!cJSON_GetObjectItemCaseSensitive(j, "shape"))
    return terr(e, FL_EFORMAT, name, "no 'shape'");
  if (!(off = cJSON_GetObjectItemCaseSensitive(j, "data_offsets")))
    return terr(e, FL_EFORMAT, name, "no 'data_offsets'");
  out->m.device = FL_DEV_CPU;
  if ((rc = parse_dtype(name, cJSON_GetObjectItemCaseSensitive(j, "dtype"), &out->m.dtype, e)) != FL_OK)
    return rc;
  if ((rc = parse_shape(name, cJSON_GetObjectItemCaseSensitive(j, "shape"), &out->m, e)) != FL_OK)
    return rc;
  if (!cJSON_IsArray(off) || cJSON_GetArraySize(off) != 2 ||
      !json_uint(cJSON_GetArrayItem(off, 0), &out->begin) ||
      !json_uint(cJSON_GetArrayItem(off, 1), &out->end))
    return terr(e, FL_EFORMAT, name, "'data_offsets' is not a list of two "
                "non-negative integers");
  if (out->end < out->begin)
    return terr(e, FL_EFORMAT, name, "data_offsets [%llu, %llu] end before they begin",
                (unsigned long long)out->begin, (unsigned long long)out->end);
  if (out->end > data_len)
    return terr(e, FL_EFORMAT, name, "data_offsets [%llu, %llu] run past the end of "
                "the data (%llu bytes)", (unsigned long long)out->begin,
                (unsigned long long)out->end, (unsigned long long)data_len);
  nbytes = (uint64_t)meta_numel(&out->m) * dtype_size(out->m.dtype);
  if (out->end - out->begin != nbytes)
    return terr(e, FL_EFORMAT, name, "%s %s needs %llu bytes, data_offsets [%llu, %llu] "
                "hold %llu", dtypes[out->m.dtype].name, meta_shape_str(&out->m, sh, sizeof sh),
                (unsigned long long)nbytes, (unsigned long long)out->begin,
                (unsigned long long)out->end, (unsigned long long)(out->end - out->begin));
  return FL_OK;
}

static int by_name(const void *a, const void *b) {
  return strcmp(((const entry *)a)->name, ((const entry *)b)->name);
}

static int by_offset(const void *a, const void *b) {
  const entry *x = a, *y = b;
  if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
  if (x->end != y->end) return x->end < y->end ? -1 : 1;
  return strcmp(x->name, y->name);
}

/* Names unique; sorted by offset, the entries tile [0, data_len) exactly.
** Leaves v sorted by offset (file order). */
static int check_layout(entry *v, size_t n, uint64_t data_len, fl_err *e) {
  char q1[256], q2[256];
  uint64_t at = 0;
  if (n > 1) {   /* (qsort wants a real array) */
    qsort(v, n, sizeof *v, by_name);
    for (size_t i = 1; i < n; i++)
      if (strcmp(v[i - 1].name, v[i].name) == 0)
        return terr(e, FL_EFORMAT, v[i].name, "appears twice in the header");
    qsort(v, n, sizeof *v, by_offset);
  }
  for (size_t i = 0; i < n; i++) {
    if (v[i].begin > at)
      return err_set(e, FL_EFORMAT, "bytes [%llu, %llu) of the data belong to no tensor "
                     "(next is '%s')", (unsigned long long)at,
                     (unsigned long long)v[i].begin, quote(v[i].name, q1, sizeof q1));
    if (v[i].begin < at)
      return terr(e, FL_EFORMAT, v[i].name, "data_offsets [%llu, %llu] overlap tensor "
                  "'%s' [%llu, %llu]", (unsigned long long)v[i].begin,
                  (unsigned long long)v[i].end, quote(v[i - 1].name, q2, sizeof q2),
                  (unsigned long long)v[i - 1].begin, (unsigned long long)v[i - 1].end);
    at = v[i].end;
  }
  if (at != data_len)
    return err_set(e, FL_EFORMAT, "%llu bytes of data after the last tensor "
                   "(data is %llu bytes, tensors end at %llu)",
                   (unsigned long long)(data_len - at), (unsigned long long)data_len,
                   (unsigned long long)at);
  return FL_OK;
}

/* The header byte where a string holds an escaped NUL (\u0000), or -1.
** cJSON decodes it into a NUL that ends the C string, so a key
** "weight\u0000evil" would read as "weight": one file could name a
** tensor one thing here and another for every other reader. */
static long escaped_nul(const char *text, size_t len) {
  int in_string = 0;
  for (size_t i = 0; i < len; i++) {
    if (text[i] == '"') in_string = !in_string;
    else if (in_string && text[i] == '\\' && i + 1 < len) {
      if (text[i + 1] == 'u' && i + 6 <= len && memcmp(text + i + 2, "0000", 4) == 0) return (long)i;
      i++;   /* the escaped character, a quote or a backslash included */
    }
  }
  return -1;
}

/* The first control character in a tensor name (C0, DEL, or a C1
** control in UTF-8: U+0080..U+009F), or 0: such a name is no parameter's
** name, and would reach messages and terminals as a command. */
static int control_in(const char *name) {
  for (const unsigned char *p = (const unsigned char *)name; *p; p++) {
    if (*p < 0x20 || *p == 0x7f) return *p;
    if (p[0] == 0xc2 && p[1] >= 0x80 && p[1] <= 0x9f) return p[1];
  }
  return 0;
}

/* The "__metadata__" object's entries, copied; every value a string. */
static int parse_meta(const cJSON *it, st_meta **out, size_t *count, fl_err *e) {
  const cJSON *kv;
  st_meta *m;
  size_t n = 0, cap;
  if (!cJSON_IsObject(it)) return err_set(e, FL_EFORMAT, "'__metadata__' is not an object");
  cJSON_ArrayForEach(kv, it)
    if (!cJSON_IsString(kv)) {
      char q[256];
      return err_set(e, FL_EFORMAT, "'__metadata__' value of '%s' is not a string",
                     quote(kv->string ? kv->string : "", q, sizeof q));
    }
  cap = (size_t)cJSON_GetArraySize(it);
  if (!cap) return FL_OK;
  if (!(m = calloc(cap, sizeof *m))) return err_set(e, FL_ENOMEM, "out of memory (metadata)");
  cJSON_ArrayForEach(kv, it) {
    if (n == cap) break;
    m[n].key = strdup(kv->string ? kv->string : "");
    m[n].value = strdup(kv->valuestring);
    n++;
    if (!m[n - 1].key || !m[n - 1].value) {
      free_meta(m, n);
      return err_set(e, FL_ENOMEM, "out of memory (metadata)");
    }
  }
  free_meta(*out, *count);   /* a second "__metadata__": the last one counts */
  *out = m;
  *count = n;
  return FL_OK;
}

/* Parse and validate the header text (len bytes at text, NUL at
** text[len]) for a data region of data_len bytes.  On success *out is an
** array of *count entries sorted by offset and *meta an array of *nmeta
** metadata entries, both owned by the caller. */
static int parse_header(const char *text, size_t len, uint64_t data_len,
                        entry **out, size_t *count, st_meta **meta, size_t *nmeta,
                        fl_err *e) {
  const char *end = NULL;
  cJSON *root, *it;
  entry *v = NULL;
  size_t n = 0, cap;
  long at;
  int rc = FL_OK, c;

  *out = NULL;
  *count = 0;
  *meta = NULL;
  *nmeta = 0;
  for (size_t i = 0; i < len; i++) {
    unsigned char c = (unsigned char)text[i];
    if (c < 0x20 && c != '\t' && c != '\n' && c != '\r')
      return err_set(e, FL_EFORMAT, "control byte 0x%02x at header byte %zu", c, i);
  }
  if ((at = escaped_nul(text, len)) >= 0)
    return err_set(e, FL_EFORMAT, "a string holds an escaped NUL (\\u0000) at header byte %ld; "
                   "names with NUL bytes are refused", at);
  root = cJSON_ParseWithLengthOpts(text, len, &end, 0);
  if (!root) {
    size_t at = end && end >= text && end <= text + len ? (size_t)(end - text) : 0;
    return err_set(e, FL_EFORMAT, "header is not valid JSON (error near header byte %zu "
                   "of %zu)", at, len);
  }
  /* cJSON stops right after the value; only whitespace (the format pads
  ** with spaces) may follow */
  for (size_t i = end ? (size_t)(end - text) : len; i < len; i++)
    if (text[i] != ' ' && text[i] != '\t' && text[i] != '\n' && text[i] != '\r') {
      rc = err_set(e, FL_EFORMAT, "unexpected text after the header's JSON (header byte %zu)", i);
      goto done;
    }
  if (!cJSON_IsObject(root)) {
    rc = err_set(e, FL_EFORMAT, "header is not a JSON object");
    goto done;
  }
  cap = (size_t)cJSON_GetArraySize(root);
  if (cap && !(v = calloc(cap, sizeof *v))) {
    rc = err_set(e, FL_ENOMEM, "out of memory (%zu header entries)", cap);
    goto done;
  }
  cJSON_ArrayForEach(it, root) {
    if (!it->string) continue;   /* cJSON gives every object member a key */
    if (strcmp(it->string, "__metadata__") == 0) {
      if ((rc = parse_meta(it, meta, nmeta, e)) != FL_OK) goto done;
      continue;
    }
    if ((c = control_in(it->string))) {
      rc = terr(e, FL_EFORMAT, it->string, "the name holds a control character (0x%02x); "
                "such names are refused", c);
      goto done;
    }
    if (!(v[n].name = strdup(it->string))) {
      rc = err_set(e, FL_ENOMEM, "out of memory (a tensor name)");
      goto done;
    }
    n++;
    if ((rc = parse_entry(it, data_len, &v[n - 1], e)) != FL_OK) goto done;
  }
  if ((rc = check_layout(v, n, data_len, e)) != FL_OK) goto done;
  *out = v;
  *count = n;
  v = NULL;
done:
  free_entries(v, n);
  if (rc != FL_OK) {
    free_meta(*meta, *nmeta);
    *meta = NULL;
    *nmeta = 0;
  }
  cJSON_Delete(root);
  return rc;
}

/* ---- data ----------------------------------------------------------------- */

/* Bring file-order (little-endian) elements in t's storage into host
** order; bools are normalized to 0/1 as a cast would. */
static void to_host(fl_tensor *t) {
  size_t esz = dtype_size(t->m.dtype), n = (size_t)meta_numel(&t->m);
  unsigned char *p = ten_data(t);
  if (t->m.dtype == FL_BOOL) {
    for (size_t i = 0; i < n; i++) p[i] = p[i] != 0;
    return;
  }
  if (host_little_endian()) return;
  for (size_t i = 0; i < n; i++, p += esz)
    for (size_t a = 0, b = esz - 1; a < b; a++, b--) {
      unsigned char c = p[a]; p[a] = p[b]; p[b] = c;
    }
}

/* Where tensor bytes come from: an image in memory or a file descriptor. */
typedef struct source {
  const unsigned char *buf;   /* whole image, or NULL for fd */
  int fd;
  uint64_t data_start;        /* offset of the data region in the image */
  const fl_tensor *map;       /* the file mapped (st_load_mapped), or NULL */
} source;

static int read_at(int fd, void *buf, size_t n, uint64_t off, fl_err *e) {
  size_t done = 0;
  while (done < n) {
    ssize_t r = pread(fd, (char *)buf + done, n - done, (off_t)(off + done));
    if (r == 0) return err_set(e, FL_EIO, "file shrank while reading");
    if (r < 0) {
      if (errno == EINTR) continue;
      return err_set(e, FL_EIO, "%s", strerror(errno));
    }
    done += (size_t)r;
  }
  return FL_OK;
}

/* Allocate and fill every tensor of the validated entries v (ownership of
** the names moves into *out). */
static int materialize(entry *v, size_t n, const source *src, st_list *out, fl_err *e) {
  char q[256];
  int rc;
  if (n && !(out->v = calloc(n, sizeof *out->v)))
    return err_set(e, FL_ENOMEM, "out of memory (%zu tensors)", n);
  for (size_t i = 0; i < n; i++) {
    st_tensor *s = &out->v[i];
    size_t nbytes = (size_t)(v[i].end - v[i].begin);
    s->name = v[i].name;
    v[i].name = NULL;
    out->n = i + 1;
    if (src->map && host_little_endian() &&
        (src->data_start + v[i].begin) % dtype_size(v[i].m.dtype) == 0) {
      /* a view of the mapping: the file's bytes are the tensor's */
      ten_share(&s->t, src->map);
      s->t.m = v[i].m;
      ten_set_contiguous_strides(&s->t);
      s->t.offset = (int64_t)((src->data_start + v[i].begin) / dtype_size(v[i].m.dtype));
      continue;
    }
    if ((rc = ten_empty(&s->t, &v[i].m, e)) != FL_OK)
      return err_prefix(e, "tensor '%s'", quote(s->name, q, sizeof q));
    if (nbytes == 0) continue;
    if (src->buf) memcpy(ten_data(&s->t), src->buf + src->data_start + v[i].begin, nbytes);
    else if ((rc = read_at(src->fd, ten_data(&s->t), nbytes, src->data_start + v[i].begin, e)) != FL_OK)
      return err_prefix(e, "tensor '%s'", quote(s->name, q, sizeof q));
    to_host(&s->t);
  }
  return FL_OK;
}

/* The header length from the first 8 bytes (avail of them present),
** checked against the total image size before anything is allocated. */
static int check_prefix(const unsigned char *first8, size_t avail, uint64_t total,
                        uint64_t *hlen, fl_err *e) {
  if (avail < 8)
    return err_set(e, FL_EFORMAT, "file is %zu bytes, too short for the 8-byte header length",
                   avail);
  *hlen = get_le64(first8);
  if (*hlen > total - 8)
    return err_set(e, FL_EFORMAT, "header length %llu runs past the end of the file "
                   "(%llu bytes after the length)", (unsigned long long)*hlen,
                   (unsigned long long)(total - 8));
  if (*hlen > ST_MAX_HEADER)
    return err_set(e, FL_EFORMAT, "header length %llu is over the %u-byte limit",
                   (unsigned long long)*hlen, ST_MAX_HEADER);
  if (*hlen < 2)
    return err_set(e, FL_EFORMAT, "header length %llu is too short for a JSON object",
                   (unsigned long long)*hlen);
  return FL_OK;
}

/* Common body of st_parse and st_load once the header text is in memory. */
static int load_body(const char *text, uint64_t hlen, uint64_t total, const source *src,
                     st_list *out, fl_err *e) {
  entry *v = NULL;
  size_t n = 0;
  int rc = parse_header(text, (size_t)hlen, total - 8 - hlen, &v, &n, &out->meta,
                        &out->nmeta, e);
  if (rc == FL_OK) rc = materialize(v, n, src, out, e);
  free_entries(v, n);
  if (rc != FL_OK) st_list_free(out);
  return rc;
}

/* A whole image of n bytes in memory; map: the mapping it lies in (its
** tensors become views of it), or NULL to copy them out. */
static int parse_image(const unsigned char *p, size_t n, const fl_tensor *map, st_list *out, fl_err *e) {
  uint64_t hlen;
  char *text;
  source src = {0};
  int rc;
  if ((rc = check_prefix(p, n, n, &hlen, e)) != FL_OK) return rc;
  if (!(text = malloc((size_t)hlen + 1)))
    return err_set(e, FL_ENOMEM, "out of memory (%llu-byte header)", (unsigned long long)hlen);
  memcpy(text, p + 8, (size_t)hlen);
  text[hlen] = '\0';
  src.buf = p;
  src.fd = -1;
  src.data_start = 8 + hlen;
  src.map = map;
  rc = load_body(text, hlen, n, &src, out, e);
  free(text);
  return rc;
}

int st_parse(const void *buf, size_t n, st_list *out, fl_err *e) {
  int rc;
  memset(out, 0, sizeof *out);
  if (!buf && n) return err_set(e, FL_EINVAL, "safetensors: no buffer");
  if ((rc = parse_image(buf, n, NULL, out, e)) != FL_OK) err_prefix(e, "safetensors");
  return rc;
}

int st_load(const char *path, st_list *out, fl_err *e) {
  unsigned char pre[8];
  uint64_t hlen = 0, total;
  char *text = NULL, q[512];
  source src = {0};
  int fd, rc;
  memset(out, 0, sizeof *out);
  if (!path) return err_set(e, FL_EINVAL, "no path");
  /* a regular file only: its size bounds the header and every tensor */
  if ((rc = file_open_read(path, &fd, &total, e)) != FL_OK) return rc;
  if (total >= 8 && (rc = read_at(fd, pre, 8, 0, e)) != FL_OK) goto fail;
  if ((rc = check_prefix(pre, total < 8 ? (size_t)total : 8, total, &hlen, e)) != FL_OK)
    goto fail;
  if (!(text = malloc((size_t)hlen + 1))) {
    rc = err_set(e, FL_ENOMEM, "out of memory (%llu-byte header)", (unsigned long long)hlen);
    goto fail;
  }
  if ((rc = read_at(fd, text, (size_t)hlen, 8, e)) != FL_OK) goto fail;
  text[hlen] = '\0';
  src.fd = fd;
  src.data_start = 8 + hlen;
  rc = load_body(text, hlen, total, &src, out, e);
fail:
  if (rc != FL_OK) err_prefix(e, "%s: safetensors", err_quote(path, q, sizeof q));
  free(text);
  close(fd);
  return rc;
}

int st_load_mapped(const char *path, st_list *out, fl_err *e) {
  unsigned char *base;
  uint64_t total;
  char q[512];
  fl_tensor map = {0};
  int fd, rc;
  memset(out, 0, sizeof *out);
  if (!path) return err_set(e, FL_EINVAL, "no path");
  if ((rc = file_open_read(path, &fd, &total, e)) != FL_OK) return rc;
  if (total < 8 || total > SIZE_MAX) {
    close(fd);
    return st_load(path, out, e);        /* its messages for a short file */
  }
  /* private: writes to a weight (an optimizer's) stay in this process */
  base = mmap(NULL, (size_t)total, PROT_READ | PROT_WRITE, MAP_PRIVATE, fd, 0);
  close(fd);
  if (base == MAP_FAILED) return st_load(path, out, e);
  if ((rc = ten_mapped(&map, base, (size_t)total, base, (size_t)total, e)) != FL_OK) munmap(base, (size_t)total);
  else rc = parse_image(base, (size_t)total, &map, out, e);
  if (rc != FL_OK) err_prefix(e, "%s: safetensors", err_quote(path, q, sizeof q));
  ten_release(&map);                     /* the tensors hold the mapping now */
  return rc;
}

/* ---- writer ---------------------------------------------------------------- */

/* Write contiguous c's elements little-endian. */
static int write_data(int fd, const fl_tensor *c) {
  size_t esz = dtype_size(c->m.dtype), n = (size_t)meta_numel(&c->m);
  const unsigned char *src = ten_data(c);
  unsigned char chunk[1 << 14];
  size_t k = 0;
  if (n == 0) return 0;
  if (host_little_endian() || esz == 1) return file_write_fd(fd, src, n * esz);
  for (size_t i = 0; i < n; i++, src += esz) {
    for (size_t b = 0; b < esz; b++) chunk[k + b] = src[esz - 1 - b];
    k += esz;
    if (k + esz > sizeof chunk) {
      if (file_write_fd(fd, chunk, k) != 0) return -1;
      k = 0;
    }
  }
  return k ? file_write_fd(fd, chunk, k) : 0;
}

/* A tensor to write: its name and where it is in the caller's arrays. */
typedef struct slot {
  const char *name;
  size_t i;
} slot;

static int by_slot_name(const void *a, const void *b) {
  return strcmp(((const slot *)a)->name, ((const slot *)b)->name);
}

/* The JSON header for the tensors in slot order, padded with spaces so
** that 8 + length is a multiple of 8 (the data then starts aligned).
** *json is malloc'd; the caller frees it. */
static int make_header(const fl_tensor *const *ts, const slot *sl, size_t n,
                       const char *const *keys, const char *const *values, size_t nmeta,
                       char **json, size_t *len, fl_err *e) {
  cJSON *root = cJSON_CreateObject(), *meta = NULL;
  uint64_t at = 0;
  char *text = NULL, *padded;
  size_t tl, pl;
  int ok = root && (meta = cJSON_AddObjectToObject(root, "__metadata__")) != NULL, fmt = 0;
  for (size_t i = 0; ok && i < nmeta; i++) {
    ok = cJSON_AddStringToObject(meta, keys[i], values[i]) != NULL;
    fmt = fmt || strcmp(keys[i], "format") == 0;
  }
  if (ok && !fmt) ok = cJSON_AddStringToObject(meta, "format", "pt") != NULL;
  for (size_t i = 0; ok && i < n; i++) {
    const fl_tensor *t = ts[sl[i].i];
    uint64_t nb = (uint64_t)meta_numel(&t->m) * dtype_size(t->m.dtype);
    cJSON *ent = cJSON_AddObjectToObject(root, sl[i].name), *shape = NULL, *off = NULL;
    ok = ent && cJSON_AddStringToObject(ent, "dtype", dtypes[t->m.dtype].name) &&
         (shape = cJSON_AddArrayToObject(ent, "shape")) != NULL &&
         (off = cJSON_AddArrayToObject(ent, "data_offsets")) != NULL;
    for (int d = 0; ok && d < t->m.ndim; d++)
      ok = cJSON_AddItemToArray(shape, cJSON_CreateNumber((double)t->m.shape[d]));
    if (ok) ok = cJSON_AddItemToArray(off, cJSON_CreateNumber((double)at));
    if (ok) ok = cJSON_AddItemToArray(off, cJSON_CreateNumber((double)(at + nb)));
    at += nb;
  }
  if (ok) ok = (text = cJSON_PrintUnformatted(root)) != NULL;
  cJSON_Delete(root);
  if (!ok) return err_set(e, FL_ENOMEM, "out of memory building the header");
  tl = strlen(text);
  pl = (8 + tl + 7) / 8 * 8 - 8;
  if (!(padded = malloc(pl))) {
    cJSON_free(text);
    return err_set(e, FL_ENOMEM, "out of memory (%zu-byte header)", pl);
  }
  memcpy(padded, text, tl);
  memset(padded + tl, ' ', pl - tl);
  cJSON_free(text);
  *json = padded;
  *len = pl;
  return FL_OK;
}

/* Check the arguments and fill sl in name order.  Messages are bare. */
static int check_save(const char *const *names, const fl_tensor *const *ts, size_t n,
                      slot *sl, fl_err *e) {
  char q[256];
  int c;
  for (size_t i = 0; i < n; i++) {
    const fl_tensor *t = ts[i];
    if (!names[i] || !names[i][0])
      return err_set(e, FL_EINVAL, "tensor %zu has an empty name", i + 1);
    if (strcmp(names[i], "__metadata__") == 0)
      return err_set(e, FL_EINVAL, "'__metadata__' cannot name a tensor");
    if ((c = control_in(names[i])))   /* the reader would refuse the file */
      return terr(e, FL_EINVAL, names[i], "the name holds a control character (0x%02x); "
                  "such names are refused", c);
    if (!t || (int)t->m.dtype < 0 || t->m.dtype >= FL_NDTYPES || t->m.ndim < 0 ||
        t->m.ndim > FL_MAX_DIMS)
      return terr(e, FL_EINVAL, names[i], "not a valid tensor");
    if (t->m.device != FL_DEV_CPU)
      return terr(e, FL_EUNSUPPORTED, names[i], "tensor is not on the cpu (move it first)");
    if (meta_numel(&t->m) > 0 && !t->st)
      return terr(e, FL_EINVAL, names[i], "tensor has no storage");
    sl[i].name = names[i];
    sl[i].i = i;
  }
  if (n > 1) qsort(sl, n, sizeof *sl, by_slot_name);
  for (size_t i = 1; i < n; i++)
    if (strcmp(sl[i - 1].name, sl[i].name) == 0)
      return err_set(e, FL_EINVAL, "name '%s' given twice", quote(sl[i].name, q, sizeof q));
  return FL_OK;
}

/* Header and data into the open temp file fd.  Messages are bare. */
static int write_file(int fd, const fl_tensor *const *ts, const slot *sl, size_t n,
                      const char *json, size_t hlen, fl_err *e) {
  unsigned char lenbuf[8];
  put_le64(lenbuf, hlen);
  if (file_write_fd(fd, lenbuf, 8) != 0 || file_write_fd(fd, json, hlen) != 0)
    return err_set(e, FL_EIO, "write failed: %s", strerror(errno));
  for (size_t i = 0; i < n; i++) {
    fl_tensor c = {0};
    int failed;
    if (meta_numel(&ts[sl[i].i]->m) == 0) continue;
    if (ten_contiguous(&c, ts[sl[i].i], e) != FL_OK) return e ? e->code : FL_ENOMEM;
    failed = write_data(fd, &c) != 0;
    ten_release(&c);
    if (failed) return err_set(e, FL_EIO, "write failed: %s", strerror(errno));
  }
  return FL_OK;
}

/* Metadata keys: non-empty, once each; values any string. */
static int check_meta(const char *const *keys, const char *const *values, size_t nmeta,
                      fl_err *e) {
  char q[256];
  for (size_t i = 0; i < nmeta; i++) {
    if (!keys[i] || !keys[i][0]) return err_set(e, FL_EINVAL, "metadata key %zu is empty", i + 1);
    if (!values[i])
      return err_set(e, FL_EINVAL, "metadata '%s' has no value", quote(keys[i], q, sizeof q));
    for (size_t j = 0; j < i; j++)
      if (strcmp(keys[i], keys[j]) == 0)
        return err_set(e, FL_EINVAL, "metadata key '%s' given twice", quote(keys[i], q, sizeof q));
  }
  return FL_OK;
}

int st_save(const char *path, const char *const *names, const fl_tensor *const *ts,
            size_t n, fl_err *e) {
  return st_save_meta(path, names, ts, n, NULL, NULL, 0, e);
}

int st_save_meta(const char *path, const char *const *names, const fl_tensor *const *ts,
                 size_t n, const char *const *keys, const char *const *values, size_t nmeta,
                 fl_err *e) {
  slot *sl = NULL;
  size_t hlen = 0;
  char *json = NULL, q[512];
  file_out w;
  int rc;

  if (!path) return err_set(e, FL_EINVAL, "no path");
  if (!(sl = malloc((n ? n : 1) * sizeof *sl))) {
    rc = err_set(e, FL_ENOMEM, "out of memory (%zu tensors)", n);
    goto done;
  }
  if ((rc = check_save(names, ts, n, sl, e)) != FL_OK) goto done;
  if ((rc = check_meta(keys, values, nmeta, e)) != FL_OK) goto done;
  if ((rc = make_header(ts, sl, n, keys, values, nmeta, &json, &hlen, e)) != FL_OK) goto done;
  /* file_create's messages name the path themselves */
  if ((rc = file_create(&w, path, e)) != FL_OK) goto out;
  if ((rc = write_file(w.fd, ts, sl, n, json, hlen, e)) != FL_OK) {
    file_abort(&w);
    goto done;
  }
  if ((rc = file_commit(&w, e)) != FL_OK) goto out;
done:
  if (rc != FL_OK) err_prefix(e, "%s", err_quote(path, q, sizeof q));
out:
  free(sl);
  free(json);
  return rc;
}

int st_save_list(const char *path, const st_list *l, fl_err *e) {
  const char **names, **keys;
  const fl_tensor **ts;
  int rc;
  size_t n = l ? l->n : 0, nm = l ? l->nmeta : 0;
  names = malloc((n ? n : 1) * sizeof *names);
  ts = malloc((n ? n : 1) * sizeof *ts);
  keys = malloc((nm ? 2 * nm : 1) * sizeof *keys);
  if (!names || !ts || !keys) {
    free(names);
    free(ts);
    free(keys);
    return err_set(e, FL_ENOMEM, "%s: out of memory (%zu tensors)", path ? path : "?", n);
  }
  for (size_t i = 0; i < n; i++) {
    names[i] = l->v[i].name;
    ts[i] = &l->v[i].t;
  }
  for (size_t i = 0; i < nm; i++) {
    keys[i] = l->meta[i].key;
    keys[nm + i] = l->meta[i].value;
  }
  rc = st_save_meta(path, names, ts, n, keys, keys + nm, nm, e);
  free(names);
  free(ts);
  free(keys);
  return rc;
}
