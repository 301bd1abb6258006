/*
** tokenizer.c -- byte-pair encoding as Hugging Face's `tokenizers` runs it
** (see tokenizer.h for what is read).  Encoding a text:
**   1. split it on the added tokens (leftmost, longest; lstrip/rstrip take
**      the whitespace beside them);
**   2. each other part: normalize, pre-tokenize into pieces;
**   3. each piece: its characters as symbols, merged pair by pair in the
**      order of the merges' ranks (a heap, so a long piece stays n log n);
**   4. the post-processor's template adds the special tokens.
** Decoding maps ids to token strings and runs the decoders over them.
*/
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define PCRE2_CODE_UNIT_WIDTH 8
#include <cjson/cJSON.h>
#include <pcre2.h>
#include <uninorm.h>
#include <unicase.h>
#include <unistr.h>
#include <xxhash.h>

#include "graph/file.h"
#include "io/tokenizer.h"

#define MAX_JSON ((uint64_t)512 << 20)   /* tokenizer files of the largest vocabularies are ~20 MB */
#define MAX_STEPS 16

/* GPT-2's pre-tokenizer regex (ByteLevel with use_regex). */
static const char GPT2_PATTERN[] =
  "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

/* ---- growable buffers ---------------------------------------------------- */

typedef struct sbuf { char *p; size_t n, cap; } sbuf;
typedef struct ibuf { int64_t *p; size_t n, cap; } ibuf;
typedef struct piece { char *s; size_t n; } piece;
typedef struct plist { piece *v; size_t n, cap; } plist;

static int grow(void **p, size_t *cap, size_t need, size_t size) {
  size_t c = *cap ? *cap : 16;
  void *q;
  if (need <= *cap) return 0;
  while (c < need) c *= 2;
  if (!(q = realloc(*p, c * size))) return -1;
  *p = q;
  *cap = c;
  return 0;
}

static int sb_add(sbuf *b, const char *s, size_t n) {
  if (grow((void **)&b->p, &b->cap, b->n + n + 1, 1)) return -1;
  memcpy(b->p + b->n, s, n);
  b->n += n;
  b->p[b->n] = 0;
  return 0;
}

static int ib_add(ibuf *b, int64_t v) {
  if (grow((void **)&b->p, &b->cap, b->n + 1, sizeof *b->p)) return -1;
  b->p[b->n++] = v;
  return 0;
}

static int pl_add(plist *l, const char *s, size_t n) {
  char *c;
  if (n == 0) return 0;                       /* empty pieces vanish, as in `tokenizers` */
  if (grow((void **)&l->v, &l->cap, l->n + 1, sizeof *l->v) || !(c = malloc(n + 1))) return -1;
  memcpy(c, s, n);
  c[n] = 0;
  l->v[l->n].s = c;
  l->v[l->n++].n = n;
  return 0;
}

static void pl_free(plist *l) {
  for (size_t i = 0; i < l->n; i++) free(l->v[i].s);
  free(l->v);
  memset(l, 0, sizeof *l);
}

/* ---- hash maps: token string -> id, (left, right) -> merge ---------------- */

typedef struct tmap { int32_t *slot; size_t cap; } tmap;   /* slots hold ids, -1 empty */
typedef struct merge { uint64_t key; int32_t rank, id; } merge;
typedef struct mmap_ { merge *slot; size_t cap; } mmap_;     /* key 0 is empty */

/* ---- the tokenizer -------------------------------------------------------- */

enum { N_NFC, N_NFKC, N_NFD, N_NFKD, N_PREPEND, N_REPLACE, N_LOWERCASE };
enum { P_SPLIT, P_BYTELEVEL, P_METASPACE };
enum { B_ISOLATED, B_REMOVED, B_MERGED_PREV, B_MERGED_NEXT, B_CONTIGUOUS };
enum { S_ALWAYS, S_FIRST, S_NEVER };
enum { D_BYTELEVEL, D_METASPACE, D_REPLACE, D_BYTEFALLBACK, D_FUSE, D_STRIP };

typedef struct step {
  int kind;
  char *a, *b;                 /* Prepend's text; Replace's pattern and content; Metaspace's replacement */
  pcre2_code *re;              /* Split's pattern */
  int behavior, invert, flag;  /* flag: ByteLevel add_prefix_space, Metaspace split, Strip's start */
  int scheme, stop;            /* Metaspace prepend_scheme; Strip's stop */
} step;

typedef struct added { char *s; size_t n; int32_t id; int special, lstrip, rstrip; } added;

struct tok_tokenizer {
  char **tok;                  /* id -> token string (NULL: unused id) */
  size_t *len;
  int64_t nvocab;
  unsigned char *special;      /* id -> 1 when special */
  tmap vocab;
  mmap_ merges;
  int64_t nmerges;
  int byte_fallback, ignore_merges, fuse_unk;
  int32_t unk;                 /* -1: none */
  step norm[MAX_STEPS], pre[MAX_STEPS], dec[MAX_STEPS];
  int nnorm, npre, ndec;
  added *add;
  size_t nadd;
  int32_t tmpl[MAX_STEPS];     /* post-processor: ids, -1 for the sequence */
  int ntmpl;
  int byte_level;
  char desc[160];
};

static uint64_t hash_str(const char *s, size_t n) { return XXH3_64bits(s, n); }

static int tmap_put(tok_tokenizer *t, int32_t id) {
  tmap *m = &t->vocab;
  size_t mask = m->cap - 1, i = hash_str(t->tok[id], t->len[id]) & mask;
  while (m->slot[i] >= 0) {
    int32_t o = m->slot[i];
    if (t->len[o] == t->len[id] && !memcmp(t->tok[o], t->tok[id], t->len[id])) return o;
    i = (i + 1) & mask;
  }
  m->slot[i] = id;
  return id;
}

static int32_t lookup(const tok_tokenizer *t, const char *s, size_t n) {
  const tmap *m = &t->vocab;
  size_t mask, i;
  if (!m->cap) return -1;
  mask = m->cap - 1;
  i = hash_str(s, n) & mask;
  while (m->slot[i] >= 0) {
    int32_t o = m->slot[i];
    if (t->len[o] == n && !memcmp(t->tok[o], s, n)) return o;
    i = (i + 1) & mask;
  }
  return -1;
}

static uint64_t pair_key(int32_t a, int32_t b) { return ((uint64_t)(uint32_t)a << 32 | (uint32_t)b) + 1; }

static const merge *merge_find(const tok_tokenizer *t, int32_t a, int32_t b) {
  const mmap_ *m = &t->merges;
  uint64_t k = pair_key(a, b);
  size_t mask, i;
  if (!m->cap) return NULL;
  mask = m->cap - 1;
  i = XXH3_64bits(&k, sizeof k) & mask;
  while (m->slot[i].key) {
    if (m->slot[i].key == k) return &m->slot[i];
    i = (i + 1) & mask;
  }
  return NULL;
}

/* ---- building the vocabulary and the merges -------------------------------- */

static int fmt_err(fl_err *e, int code, const char *file, const char *what) {
  char q[256];
  return err_set(e, code, "%s: %s", err_quote(file, q, sizeof q), what);
}

/* Set id's string (the vocabulary or an added token). */
static int set_token(tok_tokenizer *t, int64_t id, const char *s, size_t n) {
  char *c;
  if (t->tok[id]) {
    if (t->len[id] == n && !memcmp(t->tok[id], s, n)) return 0;
    return -2;                                 /* one id, two strings */
  }
  if (!(c = malloc(n + 1))) return -1;
  memcpy(c, s, n);
  c[n] = 0;
  t->tok[id] = c;
  t->len[id] = n;
  return 0;
}

/* Size the id arrays for ids below n. */
static int reserve_ids(tok_tokenizer *t, int64_t n) {
  if (n <= t->nvocab) return 0;
  char **tk = realloc(t->tok, (size_t)n * sizeof *tk);
  if (!tk) return -1;
  t->tok = tk;
  size_t *ln = realloc(t->len, (size_t)n * sizeof *ln);
  if (!ln) return -1;
  t->len = ln;
  unsigned char *sp = realloc(t->special, (size_t)n);
  if (!sp) return -1;
  t->special = sp;
  for (int64_t i = t->nvocab; i < n; i++) { tk[i] = NULL; ln[i] = 0; sp[i] = 0; }
  t->nvocab = n;
  return 0;
}

/* Index every id's string; a string given two ids is malformed. */
static int index_vocab(tok_tokenizer *t, const char *file, fl_err *e) {
  size_t cap = 16;
  while (cap < (size_t)t->nvocab * 2) cap *= 2;
  free(t->vocab.slot);
  if (!(t->vocab.slot = malloc(cap * sizeof *t->vocab.slot)))
    return err_set(e, FL_ENOMEM, "tokenizer: out of memory for %lld tokens", (long long)t->nvocab);
  memset(t->vocab.slot, 0xff, cap * sizeof *t->vocab.slot);
  t->vocab.cap = cap;
  for (int64_t i = 0; i < t->nvocab; i++)
    if (t->tok[i] && tmap_put(t, (int32_t)i) != i) {
      char why[128];
      snprintf(why, sizeof why, "vocab: one token has ids %d and %lld",
               tmap_put(t, (int32_t)i), (long long)i);
      return fmt_err(e, FL_EFORMAT, file, why);
    }
  return FL_OK;
}

/* The vocabulary object {token: id}. */
static int read_vocab(tok_tokenizer *t, const cJSON *v, const char *file, fl_err *e) {
  const cJSON *it;
  int64_t top = 0;
  if (!cJSON_IsObject(v)) return fmt_err(e, FL_EFORMAT, file, "vocab: not an object of token: id");
  cJSON_ArrayForEach(it, v) {
    double d = it->valuedouble;
    if (!cJSON_IsNumber(it) || !(d >= 0 && d < TOK_MAX_VOCAB) || d != (double)(int64_t)d) {
      char why[200], q[64];
      snprintf(why, sizeof why, "vocab: token '%s' has id %s (ids are integers 0 to %d)",
               err_quote(it->string, q, sizeof q), cJSON_IsNumber(it) ? "out of range" : "not a number",
               TOK_MAX_VOCAB - 1);
      return fmt_err(e, FL_EFORMAT, file, why);
    }
    if ((int64_t)d + 1 > top) top = (int64_t)d + 1;
  }
  if (reserve_ids(t, top)) return err_set(e, FL_ENOMEM, "tokenizer: out of memory");
  cJSON_ArrayForEach(it, v) {
    int rc = set_token(t, (int64_t)it->valuedouble, it->string, strlen(it->string));
    if (rc == -1) return err_set(e, FL_ENOMEM, "tokenizer: out of memory");
    if (rc == -2) {
      char why[128];
      snprintf(why, sizeof why, "vocab: id %lld is given to two tokens", (long long)it->valuedouble);
      return fmt_err(e, FL_EFORMAT, file, why);
    }
  }
  return index_vocab(t, file, e);
}

/* Merge "a b" (or the pair a, b) of rank r. */
static int add_merge(tok_tokenizer *t, const char *a, size_t na, const char *b, size_t nb,
                     int64_t r, const char *file, fl_err *e) {
  char why[200], qa[64], qb[64];
  int32_t ia = lookup(t, a, na), ib = lookup(t, b, nb), id;
  sbuf cat = {0};
  if (ia < 0 || ib < 0) {
    snprintf(why, sizeof why, "merges: merge %lld names '%s', which is not in the vocabulary",
             (long long)r + 1, err_quote(ia < 0 ? a : b, qa, sizeof qa));
    return fmt_err(e, FL_EFORMAT, file, why);
  }
  if (sb_add(&cat, a, na) || sb_add(&cat, b, nb)) { free(cat.p); return err_set(e, FL_ENOMEM, "tokenizer: out of memory"); }
  id = lookup(t, cat.p, cat.n);
  free(cat.p);
  if (id < 0) {
    snprintf(why, sizeof why, "merges: merge %lld ('%s' '%s') makes a token not in the vocabulary",
             (long long)r + 1, err_quote(a, qa, sizeof qa), err_quote(b, qb, sizeof qb));
    return fmt_err(e, FL_EFORMAT, file, why);
  }
  {
    mmap_ *m = &t->merges;
    uint64_t k = pair_key(ia, ib);
    size_t mask = m->cap - 1, i = XXH3_64bits(&k, sizeof k) & mask;
    while (m->slot[i].key && m->slot[i].key != k) i = (i + 1) & mask;
    if (m->slot[i].key) return FL_OK;          /* a repeated merge keeps its first rank */
    m->slot[i].key = k;
    m->slot[i].rank = (int32_t)r;
    m->slot[i].id = id;
  }
  t->nmerges++;
  return FL_OK;
}

static int alloc_merges(tok_tokenizer *t, size_t n, fl_err *e) {
  size_t cap = 16;
  while (cap < n * 2) cap *= 2;
  if (!(t->merges.slot = calloc(cap, sizeof *t->merges.slot)))
    return err_set(e, FL_ENOMEM, "tokenizer: out of memory for %zu merges", n);
  t->merges.cap = cap;
  return FL_OK;
}

/* merges.txt: "#version" first, then "a b" per line. */
static int read_merges_txt(tok_tokenizer *t, const char *path, fl_err *e) {
  char *buf, *p;
  size_t n, lines = 1;
  int64_t r = 0;
  int rc;
  if ((rc = file_read_all(path, MAX_JSON, &buf, &n, e)) != FL_OK) return rc;
  for (size_t i = 0; i < n; i++) lines += buf[i] == '\n';
  if ((rc = alloc_merges(t, lines, e)) != FL_OK) { free(buf); return rc; }
  for (char *next = buf, *p_end = buf + n; next < p_end;) {
    size_t len = strcspn(next, "\n");
    char *sp;
    p = next;
    next += len + 1;                 /* the next line, before this one is cut */
    if (len && p[len - 1] == '\r') len--;
    if (!len || (r == 0 && !strncmp(p, "#version", 8))) continue;
    sp = memchr(p, ' ', len);
    if (!sp || sp == p || sp + 1 == p + len || memchr(sp + 1, ' ', (size_t)(p + len - sp - 1))) {
      char why[96];
      snprintf(why, sizeof why, "merges: line %lld is not two tokens separated by one space", (long long)r + 1);
      free(buf);
      return fmt_err(e, FL_EFORMAT, path, why);
    }
    *sp = 0;
    p[len] = 0;
    if ((rc = add_merge(t, p, (size_t)(sp - p), sp + 1, (size_t)(p + len - sp - 1), r++, path, e)) != FL_OK) {
      free(buf);
      return rc;
    }
  }
  free(buf);
  return FL_OK;
}

/* ---- parsing tokenizer.json's parts ---------------------------------------- */

static const char *jstr(const cJSON *o, const char *k) {
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
  return cJSON_IsString(v) ? v->valuestring : NULL;
}

static int jbool(const cJSON *o, const char *k, int dflt) {
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
  return cJSON_IsBool(v) ? cJSON_IsTrue(v) : dflt;
}

static int unsupported(fl_err *e, const char *file, const char *field, const char *what) {
  char why[256], q[96];
  snprintf(why, sizeof why, "%s: '%s' is unsupported", field, err_quote(what ? what : "(none)", q, sizeof q));
  return fmt_err(e, FL_EUNSUPPORTED, file, why);
}

static int compile_re(step *s, const char *pat, size_t n, int literal, const char *file, fl_err *e) {
  int code;
  PCRE2_SIZE off;
  s->re = pcre2_compile((PCRE2_SPTR)pat, n, PCRE2_UTF | PCRE2_UCP | (literal ? PCRE2_LITERAL : 0),
                        &code, &off, NULL);
  if (!s->re) {
    char msg[128], why[256];
    pcre2_get_error_message(code, (PCRE2_UCHAR *)msg, sizeof msg);
    snprintf(why, sizeof why, "pre_tokenizer: Split's regex does not compile at offset %zu: %s", (size_t)off, msg);
    return fmt_err(e, FL_EFORMAT, file, why);
  }
  (void)pcre2_jit_compile(s->re, PCRE2_JIT_COMPLETE);   /* an interpreter still runs it without JIT */
  return FL_OK;
}

/* A list of steps from one JSON part, a "Sequence" flattened. */
typedef int (*step_reader)(tok_tokenizer *t, const cJSON *o, const char *file, fl_err *e);

static int read_steps(tok_tokenizer *t, const cJSON *o, const char *seq_key, step_reader rd,
                      const char *file, fl_err *e) {
  const char *type;
  if (!o || cJSON_IsNull(o)) return FL_OK;
  type = jstr(o, "type");
  if (type && !strcmp(type, "Sequence")) {
    const cJSON *it;
    cJSON_ArrayForEach(it, cJSON_GetObjectItemCaseSensitive(o, seq_key)) {
      int rc = read_steps(t, it, seq_key, rd, file, e);
      if (rc != FL_OK) return rc;
    }
    return FL_OK;
  }
  return rd(t, o, file, e);
}

/* The next free step of a list of n (zeroed), its type read: a list
** full or a step without a type is refused, naming the field. */
static int new_step(step *list, int n, const cJSON *o, const char *field, const char *file,
                    step **out, const char **type, fl_err *e) {
  char why[96];
  if (n == MAX_STEPS) {
    snprintf(why, sizeof why, "%s: more than %d steps is unsupported", field, MAX_STEPS);
    return fmt_err(e, FL_EUNSUPPORTED, file, why);
  }
  *out = memset(&list[n], 0, sizeof list[n]);
  if (!(*type = jstr(o, "type"))) {
    snprintf(why, sizeof why, "%s: a step without a type", field);
    return fmt_err(e, FL_EFORMAT, file, why);
  }
  return FL_OK;
}

static int read_norm(tok_tokenizer *t, const cJSON *o, const char *file, fl_err *e) {
  const char *type;
  step *s;
  int rc = new_step(t->norm, t->nnorm, o, "normalizer", file, &s, &type, e);
  if (rc != FL_OK) return rc;
  if (!strcmp(type, "NFC")) s->kind = N_NFC;
  else if (!strcmp(type, "NFKC")) s->kind = N_NFKC;
  else if (!strcmp(type, "NFD")) s->kind = N_NFD;
  else if (!strcmp(type, "NFKD")) s->kind = N_NFKD;
  else if (!strcmp(type, "Lowercase")) s->kind = N_LOWERCASE;
  else if (!strcmp(type, "Prepend") && jstr(o, "prepend")) {
    s->kind = N_PREPEND;
    s->a = strdup(jstr(o, "prepend"));
  } else if (!strcmp(type, "Replace") && jstr(o, "content") &&
             jstr(cJSON_GetObjectItemCaseSensitive(o, "pattern"), "String")) {
    s->kind = N_REPLACE;
    s->a = strdup(jstr(cJSON_GetObjectItemCaseSensitive(o, "pattern"), "String"));
    s->b = strdup(jstr(o, "content"));
  } else return unsupported(e, file, "normalizer", type);
  t->nnorm++;
  return FL_OK;
}

static int read_split_behavior(const char *b) {
  static const char *names[] = {"Isolated", "Removed", "MergedWithPrevious", "MergedWithNext", "Contiguous"};
  for (int i = 0; i < 5; i++)
    if (b && !strcmp(b, names[i])) return i;
  return -1;
}

static int read_scheme(const cJSON *o) {
  const char *s = jstr(o, "prepend_scheme");
  if (!s) return jbool(o, "add_prefix_space", 1) ? S_ALWAYS : S_NEVER;   /* before the scheme existed */
  return !strcmp(s, "first") ? S_FIRST : !strcmp(s, "never") ? S_NEVER : !strcmp(s, "always") ? S_ALWAYS : -1;
}

static int read_pre(tok_tokenizer *t, const cJSON *o, const char *file, fl_err *e) {
  const char *type;
  step *s;
  int rc = new_step(t->pre, t->npre, o, "pre_tokenizer", file, &s, &type, e);
  if (rc != FL_OK) return rc;
  if (!strcmp(type, "ByteLevel")) {
    s->kind = P_BYTELEVEL;
    s->flag = jbool(o, "add_prefix_space", 0);
    t->byte_level = 1;
    if (jbool(o, "use_regex", 1)) {      /* GPT-2's regex, then the bytes as characters */
      int rc = compile_re(s, GPT2_PATTERN, PCRE2_ZERO_TERMINATED, 0, file, e);
      if (rc != FL_OK) return rc;
    }
  } else if (!strcmp(type, "Split")) {
    const cJSON *p = cJSON_GetObjectItemCaseSensitive(o, "pattern");
    const char *re = jstr(p, "Regex"), *lit = jstr(p, "String");
    int rc;
    s->kind = P_SPLIT;
    s->behavior = read_split_behavior(jstr(o, "behavior"));
    s->invert = jbool(o, "invert", 0);
    if (s->behavior < 0) return unsupported(e, file, "pre_tokenizer: Split's behavior", jstr(o, "behavior"));
    if (!re && !lit) return fmt_err(e, FL_EFORMAT, file, "pre_tokenizer: Split without a Regex or String pattern");
    if ((rc = compile_re(s, re ? re : lit, PCRE2_ZERO_TERMINATED, !re, file, e)) != FL_OK) return rc;
  } else if (!strcmp(type, "Metaspace")) {
    s->kind = P_METASPACE;
    s->a = strdup(jstr(o, "replacement") ? jstr(o, "replacement") : "\xe2\x96\x81");
    s->flag = jbool(o, "split", 1);
    if ((s->scheme = read_scheme(o)) < 0) return unsupported(e, file, "pre_tokenizer: Metaspace's prepend_scheme", jstr(o, "prepend_scheme"));
  } else return unsupported(e, file, "pre_tokenizer", type);
  t->npre++;
  return FL_OK;
}

static int read_dec(tok_tokenizer *t, const cJSON *o, const char *file, fl_err *e) {
  const char *type;
  step *s;
  int rc = new_step(t->dec, t->ndec, o, "decoder", file, &s, &type, e);
  if (rc != FL_OK) return rc;
  if (!strcmp(type, "ByteLevel")) s->kind = D_BYTELEVEL;
  else if (!strcmp(type, "ByteFallback")) s->kind = D_BYTEFALLBACK;
  else if (!strcmp(type, "Fuse")) s->kind = D_FUSE;
  else if (!strcmp(type, "Metaspace")) {
    s->kind = D_METASPACE;
    s->a = strdup(jstr(o, "replacement") ? jstr(o, "replacement") : "\xe2\x96\x81");
    if ((s->scheme = read_scheme(o)) < 0) return unsupported(e, file, "decoder: Metaspace's prepend_scheme", jstr(o, "prepend_scheme"));
  } else if (!strcmp(type, "Replace") && jstr(o, "content") &&
             jstr(cJSON_GetObjectItemCaseSensitive(o, "pattern"), "String")) {
    s->kind = D_REPLACE;
    s->a = strdup(jstr(cJSON_GetObjectItemCaseSensitive(o, "pattern"), "String"));
    s->b = strdup(jstr(o, "content"));
  } else if (!strcmp(type, "Strip") && jstr(o, "content")) {
    s->kind = D_STRIP;
    s->a = strdup(jstr(o, "content"));
    s->flag = cJSON_GetObjectItemCaseSensitive(o, "start") ? cJSON_GetObjectItemCaseSensitive(o, "start")->valueint : 0;
    s->stop = cJSON_GetObjectItemCaseSensitive(o, "stop") ? cJSON_GetObjectItemCaseSensitive(o, "stop")->valueint : 0;
  } else return unsupported(e, file, "decoder", type);
  t->ndec++;
  return FL_OK;
}

static int read_post(tok_tokenizer *t, const cJSON *o, const char *file, fl_err *e) {
  const char *type = jstr(o, "type");
  const cJSON *it, *specials;
  if (!type) return fmt_err(e, FL_EFORMAT, file, "post_processor: a step without a type");
  if (!strcmp(type, "ByteLevel")) return FL_OK;   /* it trims offsets only; ids are unchanged */
  if (strcmp(type, "TemplateProcessing")) return unsupported(e, file, "post_processor", type);
  specials = cJSON_GetObjectItemCaseSensitive(o, "special_tokens");
  t->ntmpl = 0;
  cJSON_ArrayForEach(it, cJSON_GetObjectItemCaseSensitive(o, "single")) {
    const cJSON *sp = cJSON_GetObjectItemCaseSensitive(it, "SpecialToken");
    if (t->ntmpl == MAX_STEPS) return fmt_err(e, FL_EUNSUPPORTED, file, "post_processor: a template of more than 16 items is unsupported");
    if (cJSON_GetObjectItemCaseSensitive(it, "Sequence")) { t->tmpl[t->ntmpl++] = -1; continue; }
    if (!sp || !jstr(sp, "id")) return fmt_err(e, FL_EFORMAT, file, "post_processor: a template item neither Sequence nor SpecialToken");
    const cJSON *def = cJSON_GetObjectItemCaseSensitive(specials, jstr(sp, "id"));
    const cJSON *ids = cJSON_GetObjectItemCaseSensitive(def, "ids"), *id;
    if (cJSON_GetArraySize(ids) < 1) return fmt_err(e, FL_EFORMAT, file, "post_processor: a special token of the template has no ids");
    cJSON_ArrayForEach(id, ids) {
      if (!cJSON_IsNumber(id) || id->valuedouble < 0 || id->valuedouble >= (double)t->nvocab)
        return fmt_err(e, FL_EFORMAT, file, "post_processor: a special token's id is outside the vocabulary");
      if (t->ntmpl == MAX_STEPS) return fmt_err(e, FL_EUNSUPPORTED, file, "post_processor: a template of more than 16 items is unsupported");
      t->tmpl[t->ntmpl++] = (int32_t)id->valuedouble;
    }
  }
  return FL_OK;
}

static int read_post_steps(tok_tokenizer *t, const cJSON *o, const char *file, fl_err *e) {
  return read_steps(t, o, "processors", read_post, file, e);
}

/* The added tokens: given ids beyond the model's vocabulary or in it. */
static int read_added(tok_tokenizer *t, const cJSON *list, const char *file, fl_err *e) {
  const cJSON *it;
  int64_t top = t->nvocab;
  size_t n = (size_t)cJSON_GetArraySize(list);
  if (!n) return FL_OK;
  cJSON_ArrayForEach(it, list) {
    const cJSON *id = cJSON_GetObjectItemCaseSensitive(it, "id");
    const char *c = jstr(it, "content");
    if (!c || !c[0] || !cJSON_IsNumber(id) || id->valuedouble < 0 || id->valuedouble >= TOK_MAX_VOCAB ||
        id->valuedouble != (double)(int64_t)id->valuedouble)
      return fmt_err(e, FL_EFORMAT, file, "added_tokens: an entry without content or with an id that is not 0 to 4194303");
    if (jbool(it, "single_word", 0)) return unsupported(e, file, "added_tokens: single_word", c);
    if ((int64_t)id->valuedouble + 1 > top) top = (int64_t)id->valuedouble + 1;
  }
  if (reserve_ids(t, top) || !(t->add = calloc(n, sizeof *t->add))) return err_set(e, FL_ENOMEM, "tokenizer: out of memory");
  cJSON_ArrayForEach(it, list) {
    added *a = &t->add[t->nadd];
    int64_t id = (int64_t)cJSON_GetObjectItemCaseSensitive(it, "id")->valuedouble;
    const char *c = jstr(it, "content");
    int rc = set_token(t, id, c, strlen(c));
    if (rc == -1) return err_set(e, FL_ENOMEM, "tokenizer: out of memory");
    if (rc == -2) {
      char why[160], q[64];
      snprintf(why, sizeof why, "added_tokens: '%s' has id %lld, which the vocabulary gives another token",
               err_quote(c, q, sizeof q), (long long)id);
      return fmt_err(e, FL_EFORMAT, file, why);
    }
    if (!(a->s = strdup(c))) return err_set(e, FL_ENOMEM, "tokenizer: out of memory");
    a->n = strlen(c);
    a->id = (int32_t)id;
    a->special = jbool(it, "special", 0);
    a->lstrip = jbool(it, "lstrip", 0);
    a->rstrip = jbool(it, "rstrip", 0);
    t->special[id] = (unsigned char)a->special;
    t->nadd++;
  }
  return index_vocab(t, file, e);
}

static void describe(tok_tokenizer *t) {
  size_t nspec = 0;
  for (size_t i = 0; i < t->nadd; i++) nspec += t->add[i].special;
  snprintf(t->desc, sizeof t->desc, "%sBPE, %lld tokens, %lld merges, %zu special",
           t->byte_level ? "byte-level " : "", (long long)t->nvocab, (long long)t->nmerges, nspec);
}

static tok_tokenizer *tok_new(void) {
  tok_tokenizer *t = calloc(1, sizeof *t);
  if (t) t->unk = -1;
  return t;
}

/* ---- loading ------------------------------------------------------------- */

static int parse_json(const char *text, size_t n, const char *path, cJSON **out, fl_err *e) {
  if (!(*out = cJSON_ParseWithLength(text, n))) return fmt_err(e, FL_EFORMAT, path, "not valid JSON");
  return FL_OK;
}

static int read_json(const char *path, cJSON **out, fl_err *e) {
  char *buf;
  size_t n;
  int rc = file_read_all(path, MAX_JSON, &buf, &n, e);
  if (rc != FL_OK) return rc;
  rc = parse_json(buf, n, path, out, e);
  free(buf);
  return rc;
}

int tok_load_bpe(const char *vocab_path, const char *merges_path, const char *config_path,
                 tok_tokenizer **out, fl_err *e) {
  tok_tokenizer *t = tok_new();
  cJSON *vocab = NULL, *cfg = NULL;
  int rc;
  *out = NULL;
  if (!t) return err_set(e, FL_ENOMEM, "tokenizer: out of memory");
  if ((rc = read_json(vocab_path, &vocab, e)) != FL_OK ||
      (rc = read_vocab(t, vocab, vocab_path, e)) != FL_OK ||
      (rc = read_merges_txt(t, merges_path, e)) != FL_OK) goto fail;
  if (config_path && (rc = read_json(config_path, &cfg, e)) != FL_OK) goto fail;
  {
    /* GPT-2's pre-tokenizer and decoder; its special tokens from the config
    ** ({"id": {"content": ..., "special": ...}}) or <|endoftext|> */
    cJSON *pre = cJSON_Parse("{\"type\":\"ByteLevel\",\"add_prefix_space\":false}");
    cJSON *list = cJSON_CreateArray();
    const cJSON *dec = cJSON_GetObjectItemCaseSensitive(cfg, "added_tokens_decoder"), *it;
    if (!pre || !list) { cJSON_Delete(pre); cJSON_Delete(list); rc = err_set(e, FL_ENOMEM, "tokenizer: out of memory"); goto fail; }
    if (cfg && jbool(cfg, "add_prefix_space", 0)) cJSON_ReplaceItemInObject(pre, "add_prefix_space", cJSON_CreateTrue());
    rc = read_pre(t, pre, vocab_path, e);
    cJSON_Delete(pre);
    t->dec[t->ndec++].kind = D_BYTELEVEL;
    if (dec) {
      cJSON_ArrayForEach(it, dec) {
        cJSON *a = cJSON_Duplicate(it, 1);
        char *end;
        long long id = strtoll(it->string, &end, 10);
        if (!a || *end) { cJSON_Delete(a); continue; }
        cJSON_DeleteItemFromObject(a, "id");
        cJSON_AddNumberToObject(a, "id", (double)id);
        cJSON_AddItemToArray(list, a);
      }
    } else {
      int32_t eot = lookup(t, "<|endoftext|>", 13);
      if (eot >= 0) {
        cJSON *a = cJSON_CreateObject();
        cJSON_AddStringToObject(a, "content", "<|endoftext|>");
        cJSON_AddNumberToObject(a, "id", eot);
        cJSON_AddTrueToObject(a, "special");
        cJSON_AddItemToArray(list, a);
      }
    }
    if (rc == FL_OK) rc = read_added(t, list, config_path ? config_path : vocab_path, e);
    cJSON_Delete(list);
    if (rc != FL_OK) goto fail;
  }
  describe(t);
  cJSON_Delete(vocab);
  cJSON_Delete(cfg);
  *out = t;
  return FL_OK;
fail:
  cJSON_Delete(vocab);
  cJSON_Delete(cfg);
  tok_free(t);
  return rc;
}

static int read_model(tok_tokenizer *t, const cJSON *m, const char *file, fl_err *e) {
  const char *type = jstr(m, "type"), *unk;
  const cJSON *merges, *it;
  int64_t r = 0;
  int rc;
  if (!m) return fmt_err(e, FL_EFORMAT, file, "model: missing");
  if (!type && cJSON_GetObjectItemCaseSensitive(m, "merges")) type = "BPE";   /* older files name no type */
  if (!type || strcmp(type, "BPE")) return unsupported(e, file, "model", type);
  if (jstr(m, "continuing_subword_prefix") || jstr(m, "end_of_word_suffix"))
    return unsupported(e, file, "model: continuing_subword_prefix or end_of_word_suffix", "set");
  if (cJSON_IsNumber(cJSON_GetObjectItemCaseSensitive(m, "dropout")) &&
      cJSON_GetObjectItemCaseSensitive(m, "dropout")->valuedouble > 0)
    return unsupported(e, file, "model: dropout", "above 0");
  if ((rc = read_vocab(t, cJSON_GetObjectItemCaseSensitive(m, "vocab"), file, e)) != FL_OK) return rc;
  t->byte_fallback = jbool(m, "byte_fallback", 0);
  t->ignore_merges = jbool(m, "ignore_merges", 0);
  t->fuse_unk = jbool(m, "fuse_unk", 0);
  if ((unk = jstr(m, "unk_token")) && (t->unk = lookup(t, unk, strlen(unk))) < 0)
    return fmt_err(e, FL_EFORMAT, file, "model: unk_token is not in the vocabulary");
  merges = cJSON_GetObjectItemCaseSensitive(m, "merges");
  if (!cJSON_IsArray(merges)) return fmt_err(e, FL_EFORMAT, file, "model: merges is not a list");
  if ((rc = alloc_merges(t, (size_t)cJSON_GetArraySize(merges), e)) != FL_OK) return rc;
  cJSON_ArrayForEach(it, merges) {
    const char *a, *b;
    size_t na, nb;
    if (cJSON_IsString(it)) {                       /* "a b" */
      const char *sp = strchr(it->valuestring, ' ');
      if (!sp || strchr(sp + 1, ' ')) return fmt_err(e, FL_EFORMAT, file, "model: a merge is not two tokens separated by one space");
      a = it->valuestring; na = (size_t)(sp - a); b = sp + 1; nb = strlen(b);
    } else if (cJSON_GetArraySize(it) == 2 && cJSON_IsString(cJSON_GetArrayItem(it, 0)) &&
               cJSON_IsString(cJSON_GetArrayItem(it, 1))) {   /* ["a", "b"] */
      a = cJSON_GetArrayItem(it, 0)->valuestring; na = strlen(a);
      b = cJSON_GetArrayItem(it, 1)->valuestring; nb = strlen(b);
    } else return fmt_err(e, FL_EFORMAT, file, "model: a merge is neither \"a b\" nor [\"a\", \"b\"]");
    if ((rc = add_merge(t, a, na, b, nb, r++, file, e)) != FL_OK) return rc;
  }
  return FL_OK;
}

int tok_load_json(const char *path, tok_tokenizer **out, fl_err *e) {
  char *buf;
  size_t n;
  int rc;
  *out = NULL;
  if ((rc = file_read_all(path, MAX_JSON, &buf, &n, e)) != FL_OK) return rc;
  rc = tok_parse_json(buf, n, path, out, e);
  free(buf);
  return rc;
}

int tok_parse_json(const char *text, size_t n, const char *path, tok_tokenizer **out, fl_err *e) {
  tok_tokenizer *t = tok_new();
  cJSON *j = NULL;
  int rc;
  *out = NULL;
  if (!t) return err_set(e, FL_ENOMEM, "tokenizer: out of memory");
  if ((rc = parse_json(text, n, path, &j, e)) != FL_OK) goto fail;
  if ((rc = read_model(t, cJSON_GetObjectItemCaseSensitive(j, "model"), path, e)) != FL_OK ||
      (rc = read_added(t, cJSON_GetObjectItemCaseSensitive(j, "added_tokens"), path, e)) != FL_OK ||
      (rc = read_steps(t, cJSON_GetObjectItemCaseSensitive(j, "normalizer"), "normalizers", read_norm, path, e)) != FL_OK ||
      (rc = read_steps(t, cJSON_GetObjectItemCaseSensitive(j, "pre_tokenizer"), "pretokenizers", read_pre, path, e)) != FL_OK ||
      (rc = read_steps(t, cJSON_GetObjectItemCaseSensitive(j, "decoder"), "decoders", read_dec, path, e)) != FL_OK ||
      (rc = read_post_steps(t, cJSON_GetObjectItemCaseSensitive(j, "post_processor"), path, e)) != FL_OK)
    goto fail;
  describe(t);
  cJSON_Delete(j);
  *out = t;
  return FL_OK;
fail:
  cJSON_Delete(j);
  tok_free(t);
  return rc;
}

static void free_steps(step *s, int n) {
  for (int i = 0; i < n; i++) {
    free(s[i].a);
    free(s[i].b);
    if (s[i].re) pcre2_code_free(s[i].re);
  }
}

void tok_free(tok_tokenizer *t) {
  if (!t) return;
  for (int64_t i = 0; i < t->nvocab; i++) free(t->tok[i]);
  free(t->tok);
  free(t->len);
  free(t->special);
  free(t->vocab.slot);
  free(t->merges.slot);
  /* the slot past the last step too: a step refused half read (its
  ** strings set, then a field found wrong) is not counted */
  free_steps(t->norm, t->nnorm < MAX_STEPS ? t->nnorm + 1 : MAX_STEPS);
  free_steps(t->pre, t->npre < MAX_STEPS ? t->npre + 1 : MAX_STEPS);
  free_steps(t->dec, t->ndec < MAX_STEPS ? t->ndec + 1 : MAX_STEPS);
  for (size_t i = 0; i < t->nadd; i++) free(t->add[i].s);
  free(t->add);
  free(t);
}

/* ---- encoding ------------------------------------------------------------ */

/* GPT-2's table of bytes as printable characters: the printable Latin-1
** bytes stand for themselves, the others (space, controls, ...) for
** U+0100 on, in byte order. */
static uint32_t byte_char(unsigned b) {
  static uint32_t map[256];
  static int ready;
  if (!ready) {
    uint32_t next = 256;
    for (unsigned i = 0; i < 256; i++)
      map[i] = ((i >= '!' && i <= '~') || (i >= 0xA1 && i <= 0xAC) || (i >= 0xAE)) ? i : next++;
    ready = 1;
  }
  return map[b];
}

/* The byte a character stands for, -1 when none. */
static int char_byte(uint32_t c) {
  if (c < 256 && byte_char(c) == c) return (int)c;
  if (c >= 256 && c < 256 + 68)
    for (unsigned i = 0; i < 256; i++)
      if (byte_char(i) == c) return (int)i;
  return -1;
}

/* Replace every occurrence of pat in s by rep (a new string). */
static int replace_all(const char *s, size_t n, const char *pat, const char *rep, sbuf *out) {
  size_t np = strlen(pat), nr = strlen(rep);
  out->n = 0;
  if (sb_add(out, "", 0)) return -1;
  for (size_t i = 0; i < n;) {
    if (np && i + np <= n && !memcmp(s + i, pat, np)) {
      if (sb_add(out, rep, nr)) return -1;
      i += np;
    } else {
      if (sb_add(out, s + i, 1)) return -1;
      i++;
    }
  }
  return 0;
}

static int normalize(const tok_tokenizer *t, const char *s, size_t n, sbuf *out, fl_err *e) {
  out->n = 0;
  if (sb_add(out, s, n)) return err_set(e, FL_ENOMEM, "tokenizer: out of memory");
  for (int i = 0; i < t->nnorm; i++) {
    const step *st = &t->norm[i];
    sbuf nb = {0};
    if (st->kind == N_PREPEND) {
      if (out->n && (sb_add(&nb, st->a, strlen(st->a)) || sb_add(&nb, out->p, out->n))) goto oom;
      if (!out->n) continue;       /* an empty text stays empty */
    } else if (st->kind == N_REPLACE) {
      if (replace_all(out->p, out->n, st->a, st->b, &nb)) goto oom;
    } else {
      size_t len = 0;
      uint8_t *r;
      if (st->kind == N_LOWERCASE) r = u8_tolower((const uint8_t *)out->p, out->n, NULL, NULL, NULL, &len);
      else r = u8_normalize(st->kind == N_NFC ? UNINORM_NFC : st->kind == N_NFKC ? UNINORM_NFKC :
                            st->kind == N_NFD ? UNINORM_NFD : UNINORM_NFKD,
                            (const uint8_t *)out->p, out->n, NULL, &len);
      if (!r || sb_add(&nb, (const char *)r, len)) { free(r); goto oom; }
      free(r);
    }
    free(out->p);
    *out = nb;
    continue;
  oom:
    free(nb.p);
    return err_set(e, FL_ENOMEM, "tokenizer: out of memory");
  }
  return FL_OK;
}

/* Split s by re's matches, keeping them as behavior says. */
static int split_re(const step *st, const char *s, size_t n, plist *out) {
  pcre2_match_data *md = pcre2_match_data_create_from_pattern(st->re, NULL);
  size_t at = 0, last = 0, pend = 0, base = out->n;   /* pend: a match waiting to join the next piece */
  int have_pend = 0, rc = 0;
  typedef struct { size_t a, b; int m; } span;
  span *sp = NULL;
  size_t nsp = 0, cap = 0;
  if (!md) return -1;
  while (at <= n) {
    int r = pcre2_match(st->re, (PCRE2_SPTR)s, n, at, 0, md, NULL);
    PCRE2_SIZE *ov;
    size_t a, b;
    if (r < 0) break;
    ov = pcre2_get_ovector_pointer(md);
    a = ov[0]; b = ov[1];
    if (a > last) {
      if (grow((void **)&sp, &cap, nsp + 1, sizeof *sp)) { rc = -1; goto done; }
      sp[nsp++] = (span){last, a, 0};
    }
    if (b > a) {
      if (grow((void **)&sp, &cap, nsp + 1, sizeof *sp)) { rc = -1; goto done; }
      sp[nsp++] = (span){a, b, 1};
      at = last = b;
    } else {                            /* an empty match: step over one character */
      at = b + 1;
      while (at < n && ((unsigned char)s[at] & 0xC0) == 0x80) at++;
      if (at > n) break;
    }
  }
  if (last < n) {
    if (grow((void **)&sp, &cap, nsp + 1, sizeof *sp)) { rc = -1; goto done; }
    sp[nsp++] = (span){last, n, 0};
  }
  for (size_t i = 0; i < nsp; i++) {
    int m = sp[i].m ^ st->invert;
    size_t a = sp[i].a, b = sp[i].b;
    switch (st->behavior) {
    case B_REMOVED: if (!m && pl_add(out, s + a, b - a)) rc = -1; break;
    case B_ISOLATED: if (pl_add(out, s + a, b - a)) rc = -1; break;
    case B_MERGED_PREV:      /* a match ends the piece before it */
      if (m && out->n > base) {
        piece *p = &out->v[out->n - 1];
        char *q = realloc(p->s, p->n + (b - a) + 1);
        if (!q) { rc = -1; break; }
        memcpy(q + p->n, s + a, b - a);
        p->s = q; p->n += b - a; q[p->n] = 0;
      } else if (pl_add(out, s + a, b - a)) rc = -1;
      break;
    case B_MERGED_NEXT:      /* a match starts the piece after it */
      if (m) { if (!have_pend) pend = a; have_pend = 1; }
      else {
        size_t from = have_pend ? pend : a;
        if (pl_add(out, s + from, b - from)) rc = -1;
        have_pend = 0;
      }
      break;
    case B_CONTIGUOUS:       /* consecutive matches are one piece */
      if (m && i + 1 < nsp && (sp[i + 1].m ^ st->invert)) { sp[i + 1].a = a; break; }
      if (pl_add(out, s + a, b - a)) rc = -1;
      break;
    }
    if (rc) goto done;
  }
  if (have_pend && pl_add(out, s + pend, n - pend)) rc = -1;
done:
  free(sp);
  pcre2_match_data_free(md);
  return rc;
}

/* Run the pre-tokenizers over one normalized part; first: it begins the text. */
static int pre_tokenize(const tok_tokenizer *t, const char *s, size_t n, int first, plist *out, fl_err *e) {
  plist cur = {0};
  if (pl_add(&cur, s, n)) goto oom;
  for (int k = 0; k < t->npre; k++) {
    const step *st = &t->pre[k];
    plist next = {0};
    for (size_t i = 0; i < cur.n; i++) {
      const char *p = cur.v[i].s;
      size_t pn = cur.v[i].n;
      sbuf b = {0};
      if (st->kind == P_SPLIT) {
        if (split_re(st, p, pn, &next)) goto oom_next;
        continue;
      }
      if (st->kind == P_METASPACE) {
        int lead = st->scheme == S_ALWAYS || (st->scheme == S_FIRST && first && i == 0);
        if (replace_all(p, pn, " ", st->a, &b)) goto oom_b;
        if (lead && strncmp(b.p, st->a, strlen(st->a))) {
          sbuf c = {0};
          if (sb_add(&c, st->a, strlen(st->a)) || sb_add(&c, b.p, b.n)) { free(c.p); goto oom_b; }
          free(b.p);
          b = c;
        }
        if (!st->flag) { if (pl_add(&next, b.p, b.n)) goto oom_b; }
        else {                           /* each piece starts at a replacement */
          size_t rl = strlen(st->a), from = 0;
          for (size_t j = 1; j + rl <= b.n; j++)
            if (!memcmp(b.p + j, st->a, rl)) {
              if (pl_add(&next, b.p + from, j - from)) goto oom_b;
              from = j;
            }
          if (pl_add(&next, b.p + from, b.n - from)) goto oom_b;
        }
        free(b.p);
        continue;
      }
      /* ByteLevel: a leading space, GPT-2's regex, the bytes as characters */
      {
        plist parts = {0};
        if (st->flag && p[0] != ' ') {
          if (sb_add(&b, " ", 1) || sb_add(&b, p, pn)) goto oom_b;
        } else if (sb_add(&b, p, pn)) goto oom_b;
        if (st->re) { if (split_re(st, b.p, b.n, &parts)) { pl_free(&parts); goto oom_b; } }
        else if (pl_add(&parts, b.p, b.n)) { pl_free(&parts); goto oom_b; }
        for (size_t j = 0; j < parts.n; j++) {
          sbuf m = {0};
          for (size_t q = 0; q < parts.v[j].n; q++) {
            uint8_t u[4];
            int l = u8_uctomb(u, byte_char((unsigned char)parts.v[j].s[q]), 4);
            if (sb_add(&m, (const char *)u, (size_t)l)) { free(m.p); pl_free(&parts); goto oom_b; }
          }
          if (pl_add(&next, m.p, m.n)) { free(m.p); pl_free(&parts); goto oom_b; }
          free(m.p);
        }
        pl_free(&parts);
        free(b.p);
        continue;
      }
    oom_b:
      free(b.p);
    oom_next:
      pl_free(&next);
      goto oom;
    }
    pl_free(&cur);
    cur = next;
  }
  *out = cur;
  return FL_OK;
oom:
  pl_free(&cur);
  return err_set(e, FL_ENOMEM, "tokenizer: out of memory");
}

/* A heap entry: the pair starting at symbol pos, of this rank. */
typedef struct cand { int32_t rank, pos, left, right; } cand;

static int cand_less(const cand *a, const cand *b) {
  return a->rank < b->rank || (a->rank == b->rank && a->pos < b->pos);
}

static int heap_push(cand **h, size_t *n, size_t *cap, cand c) {
  size_t i;
  if (grow((void **)h, cap, *n + 1, sizeof **h)) return -1;
  i = (*n)++;
  while (i > 0 && cand_less(&c, &(*h)[(i - 1) / 2])) { (*h)[i] = (*h)[(i - 1) / 2]; i = (i - 1) / 2; }
  (*h)[i] = c;
  return 0;
}

static cand heap_pop(cand *h, size_t *n) {
  cand top = h[0], last = h[--(*n)];
  size_t i = 0;
  for (;;) {
    size_t c = 2 * i + 1;
    if (c >= *n) break;
    if (c + 1 < *n && cand_less(&h[c + 1], &h[c])) c++;
    if (!cand_less(&h[c], &last)) break;
    h[i] = h[c];
    i = c;
  }
  if (*n) h[i] = last;
  return top;
}

/* One piece's ids: its characters (bytes as <0xXX> or unk when unknown),
** then the merges, lowest rank first, leftmost among equals. */
static int bpe_piece(const tok_tokenizer *t, const char *s, size_t n, ibuf *out, fl_err *e) {
  int32_t *id = NULL, *prev = NULL, *next = NULL;
  size_t m = 0, hn = 0, hcap = 0;
  cand *heap = NULL;
  int32_t whole;
  int rc = FL_OK;
  if (t->ignore_merges && (whole = lookup(t, s, n)) >= 0)
    return ib_add(out, whole) ? err_set(e, FL_ENOMEM, "tokenizer: out of memory") : FL_OK;
  if (!(id = malloc(n * 4 * sizeof *id))) return err_set(e, FL_ENOMEM, "tokenizer: out of memory");
  for (size_t i = 0; i < n;) {
    ucs4_t c;
    int l = u8_mbtouc(&c, (const uint8_t *)s + i, n - i);
    int32_t v = lookup(t, s + i, (size_t)l);
    if (v < 0 && t->byte_fallback) {
      int32_t bytes[4];
      int ok = 1;
      for (int k = 0; k < l && ok; k++) {
        char hex[8];
        snprintf(hex, sizeof hex, "<0x%02X>", (unsigned char)s[i + k]);
        ok = (bytes[k] = lookup(t, hex, 6)) >= 0;
      }
      if (ok) { for (int k = 0; k < l; k++) id[m++] = bytes[k]; i += (size_t)l; continue; }
    }
    if (v < 0) {
      if (t->unk < 0) {
        char why[96];
        snprintf(why, sizeof why, "encode: character U+%04X is not in the vocabulary, which has no unk token", c);
        free(id);
        return err_set(e, FL_EINVAL, "%s", why);
      }
      v = t->unk;
      if (t->fuse_unk && m && id[m - 1] == t->unk) { i += (size_t)l; continue; }
    }
    id[m++] = v;
    i += (size_t)l;
  }
  if (!(prev = malloc(m * sizeof *prev)) || !(next = malloc(m * sizeof *next))) goto oom;
  for (size_t i = 0; i < m; i++) { prev[i] = (int32_t)i - 1; next[i] = i + 1 < m ? (int32_t)i + 1 : -1; }
  for (size_t i = 0; i + 1 < m; i++) {
    const merge *g = merge_find(t, id[i], id[i + 1]);
    if (g && heap_push(&heap, &hn, &hcap, (cand){g->rank, (int32_t)i, id[i], id[i + 1]})) goto oom;
  }
  while (hn) {
    cand c = heap_pop(heap, &hn);
    int32_t r = next[c.pos];
    const merge *g;
    /* stale: the left symbol was merged away or changed, or its right neighbour did */
    if (id[c.pos] != c.left || r < 0 || id[r] != c.right) continue;
    g = merge_find(t, c.left, c.right);
    id[c.pos] = g->id;
    id[r] = -1;
    next[c.pos] = next[r];
    if (next[r] >= 0) prev[next[r]] = c.pos;
    if (prev[c.pos] >= 0 && (g = merge_find(t, id[prev[c.pos]], id[c.pos])) &&
        heap_push(&heap, &hn, &hcap, (cand){g->rank, prev[c.pos], id[prev[c.pos]], id[c.pos]})) goto oom;
    if (next[c.pos] >= 0 && (g = merge_find(t, id[c.pos], id[next[c.pos]])) &&
        heap_push(&heap, &hn, &hcap, (cand){g->rank, c.pos, id[c.pos], id[next[c.pos]]})) goto oom;
  }
  for (int32_t i = m ? 0 : -1; i >= 0; i = next[i])
    if (ib_add(out, id[i])) goto oom;
  goto done;
oom:
  rc = err_set(e, FL_ENOMEM, "tokenizer: out of memory");
done:
  free(id); free(prev); free(next); free(heap);
  return rc;
}

static int is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f'; }

/* The added token starting at s[i] (longest), or NULL. */
static const added *added_at(const tok_tokenizer *t, const char *s, size_t n, size_t i) {
  const added *best = NULL;
  for (size_t k = 0; k < t->nadd; k++) {
    const added *a = &t->add[k];
    if (a->n <= n - i && (!best || a->n > best->n) && s[i] == a->s[0] && !memcmp(s + i, a->s, a->n)) best = a;
  }
  return best;
}

/* One part between added tokens: normalize, pre-tokenize, BPE. */
static int encode_part(const tok_tokenizer *t, const char *s, size_t n, int first, ibuf *out, fl_err *e) {
  sbuf norm = {0};
  plist pieces = {0};
  int rc;
  if (!n) return FL_OK;
  if ((rc = normalize(t, s, n, &norm, e)) != FL_OK ||
      (rc = pre_tokenize(t, norm.p, norm.n, first, &pieces, e)) != FL_OK) goto done;
  for (size_t i = 0; i < pieces.n && rc == FL_OK; i++) rc = bpe_piece(t, pieces.v[i].s, pieces.v[i].n, out, e);
done:
  free(norm.p);
  pl_free(&pieces);
  return rc;
}

int tok_encode(const tok_tokenizer *t, const char *s, size_t n, int add_special,
               int64_t **ids, size_t *nids, fl_err *e) {
  ibuf seq = {0}, res = {0};
  const uint8_t *bad = u8_check((const uint8_t *)s, n);
  size_t start = 0, i = 0;
  int rc = FL_OK;
  *ids = NULL;
  *nids = 0;
  if (bad) return err_set(e, FL_EINVAL, "encode: the text is not valid UTF-8 (byte %zu)", (size_t)(bad - (const uint8_t *)s));
  while (i < n && rc == FL_OK) {
    const added *a = t->nadd ? added_at(t, s, n, i) : NULL;
    size_t end;
    if (!a) { i++; continue; }
    end = i;
    if (a->lstrip) while (end > start && is_space(s[end - 1])) end--;
    rc = encode_part(t, s + start, end - start, start == 0, &seq, e);
    if (rc == FL_OK && ib_add(&seq, a->id)) rc = err_set(e, FL_ENOMEM, "tokenizer: out of memory");
    i += a->n;
    if (a->rstrip) while (i < n && is_space(s[i])) i++;
    start = i;
  }
  if (rc == FL_OK) rc = encode_part(t, s + start, n - start, start == 0, &seq, e);
  if (rc != FL_OK) { free(seq.p); return rc; }
  if (!add_special || !t->ntmpl) { *ids = seq.p; *nids = seq.n; return FL_OK; }
  for (int k = 0; k < t->ntmpl; k++) {
    if (t->tmpl[k] >= 0) { if (ib_add(&res, t->tmpl[k])) goto oom; }
    else for (size_t j = 0; j < seq.n; j++) if (ib_add(&res, seq.p[j])) goto oom;
  }
  free(seq.p);
  *ids = res.p ? res.p : calloc(1, sizeof *res.p);
  *nids = res.n;
  return FL_OK;
oom:
  free(seq.p); free(res.p);
  return err_set(e, FL_ENOMEM, "tokenizer: out of memory");
}

/* ---- decoding ------------------------------------------------------------ */

/* b's bytes as UTF-8, each maximal invalid part one U+FFFD (as Rust's
** from_utf8_lossy, which `tokenizers` uses). */
static int utf8_lossy(const char *s, size_t n, sbuf *out) {
  for (size_t i = 0; i < n;) {
    ucs4_t c;
    const uint8_t *p = (const uint8_t *)s + i;
    int l = u8_mbtoucr(&c, p, n - i);
    if (l > 0) { if (sb_add(out, s + i, (size_t)l)) return -1; i += (size_t)l; continue; }
    {
      /* how many bytes of a valid prefix the lead byte allows */
      unsigned b0 = p[0];
      size_t need = b0 >= 0xF0 && b0 <= 0xF4 ? 4 : b0 >= 0xE0 && b0 <= 0xEF ? 3 : b0 >= 0xC2 && b0 <= 0xDF ? 2 : 1;
      size_t k = 1;
      while (k < need && i + k < n) {
        unsigned b = p[k];
        unsigned lo = 0x80, hi = 0xBF;
        if (k == 1) {
          if (b0 == 0xE0) lo = 0xA0; else if (b0 == 0xED) hi = 0x9F;
          else if (b0 == 0xF0) lo = 0x90; else if (b0 == 0xF4) hi = 0x8F;
        }
        if (b < lo || b > hi) break;
        k++;
      }
      if (sb_add(out, "\xEF\xBF\xBD", 3)) return -1;
      i += k;
    }
  }
  return 0;
}

/* Tokens as a list of strings the decoders rewrite in turn. */
static int run_decoders(const tok_tokenizer *t, plist *toks, sbuf *out) {
  for (int k = 0; k < t->ndec; k++) {
    const step *st = &t->dec[k];
    plist next = {0};
    sbuf b = {0};
    if (st->kind == D_FUSE || st->kind == D_BYTELEVEL) {
      for (size_t i = 0; i < toks->n; i++)
        if (sb_add(&b, toks->v[i].s, toks->v[i].n)) goto oom;
      if (st->kind == D_BYTELEVEL) {        /* characters back to the bytes they stand for */
        sbuf raw = {0}, fixed = {0};
        for (size_t i = 0; i < b.n;) {
          ucs4_t c;
          int l = u8_mbtouc(&c, (const uint8_t *)b.p + i, b.n - i);
          int by = char_byte(c);
          char one = (char)by;
          if (by >= 0 ? sb_add(&raw, &one, 1) : sb_add(&raw, b.p + i, (size_t)l)) { free(raw.p); goto oom; }
          i += (size_t)l;
        }
        if (utf8_lossy(raw.p ? raw.p : "", raw.n, &fixed) || sb_add(&fixed, "", 0)) { free(raw.p); free(fixed.p); goto oom; }
        free(raw.p);
        free(b.p);
        b = fixed;
      }
      if (pl_add(&next, b.p, b.n)) goto oom;
    } else if (st->kind == D_BYTEFALLBACK) {
      for (size_t i = 0; i < toks->n;) {
        sbuf raw = {0};
        size_t j = i;
        for (; j < toks->n; j++) {
          unsigned v;
          char one, tail;
          if (toks->v[j].n != 6 || sscanf(toks->v[j].s, "<0x%2X%c", &v, &tail) != 2 || tail != '>') break;
          one = (char)v;
          if (sb_add(&raw, &one, 1)) { free(raw.p); goto oom; }
        }
        if (j == i) { if (pl_add(&next, toks->v[i].s, toks->v[i].n)) goto oom; i++; continue; }
        if (u8_check((const uint8_t *)raw.p, raw.n) == NULL) {
          if (pl_add(&next, raw.p, raw.n)) { free(raw.p); goto oom; }
        } else for (size_t q = i; q < j; q++)      /* invalid: one U+FFFD per byte, as `tokenizers` */
          if (pl_add(&next, "\xEF\xBF\xBD", 3)) { free(raw.p); goto oom; }
        free(raw.p);
        i = j;
      }
    } else {
      for (size_t i = 0; i < toks->n; i++) {
        const char *p = toks->v[i].s;
        size_t pn = toks->v[i].n;
        b.n = 0;
        if (st->kind == D_REPLACE || st->kind == D_METASPACE) {
          if (replace_all(p, pn, st->a, st->kind == D_REPLACE ? st->b : " ", &b)) goto oom;
          if (st->kind == D_METASPACE && i == 0 && st->scheme != S_NEVER && b.n && b.p[0] == ' ') {
            memmove(b.p, b.p + 1, b.n);
            b.n--;
          }
        } else {                            /* Strip: up to start leading, stop trailing */
          size_t cl = strlen(st->a), a0 = 0, a1 = pn;
          for (int q = 0; q < st->flag && a0 + cl <= a1 && !memcmp(p + a0, st->a, cl); q++) a0 += cl;
          for (int q = 0; q < st->stop && a1 >= a0 + cl && !memcmp(p + a1 - cl, st->a, cl); q++) a1 -= cl;
          if (sb_add(&b, p + a0, a1 - a0)) goto oom;
        }
        /* pl_add drops empty strings, which is what the decoders do too */
        if (b.n && pl_add(&next, b.p, b.n)) goto oom;
      }
    }
    free(b.p);
    pl_free(toks);
    *toks = next;
    continue;
  oom:
    free(b.p);
    pl_free(&next);
    return -1;
  }
  out->n = 0;
  if (sb_add(out, "", 0)) return -1;
  for (size_t i = 0; i < toks->n; i++)
    if (sb_add(out, toks->v[i].s, toks->v[i].n)) return -1;
  return 0;
}

int tok_decode(const tok_tokenizer *t, const int64_t *ids, size_t n, int skip_special,
               char **s, size_t *len, fl_err *e) {
  plist toks = {0};
  sbuf out = {0}, fixed = {0};
  *s = NULL;
  *len = 0;
  for (size_t i = 0; i < n; i++) {
    if (ids[i] < 0 || ids[i] >= t->nvocab || !t->tok[ids[i]]) {
      pl_free(&toks);
      return err_set(e, FL_EINVAL, "decode: id %lld (at %zu) is not in the vocabulary (0 to %lld)",
                     (long long)ids[i], i + 1, (long long)t->nvocab - 1);
    }
    if (skip_special && t->special[ids[i]]) continue;
    if (pl_add(&toks, t->tok[ids[i]], t->len[ids[i]])) goto oom;
  }
  if (run_decoders(t, &toks, &out) || utf8_lossy(out.p, out.n, &fixed) || sb_add(&fixed, "", 0)) goto oom;
  pl_free(&toks);
  free(out.p);
  *s = fixed.p;
  *len = fixed.n;
  return FL_OK;
oom:
  pl_free(&toks);
  free(out.p);
  free(fixed.p);
  return err_set(e, FL_ENOMEM, "tokenizer: out of memory");
}

int64_t tok_vocab_size(const tok_tokenizer *t) { return t->nvocab; }

const char *tok_id_to_token(const tok_tokenizer *t, int64_t id) {
  return id >= 0 && id < t->nvocab ? t->tok[id] : NULL;
}

int64_t tok_token_to_id(const tok_tokenizer *t, const char *s, size_t n) { return lookup(t, s, n); }

int tok_is_special(const tok_tokenizer *t, int64_t id) { return id >= 0 && id < t->nvocab && t->special[id]; }

const char *tok_describe(const tok_tokenizer *t) { return t->desc; }
