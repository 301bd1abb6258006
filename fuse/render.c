/*
** render.c -- expressions and literals shared by the code generators.
** Invariant: the text appended is a C (and CUDA) expression with no
** trailing context: callers may wrap it in anything.
*/
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "render.h"

void fk_float_literal(char *buf, size_t n, double v, int dbl) {
  size_t len;
  if (v != v) { snprintf(buf, n, "NAN"); return; }
  if (v > 1.7976931348623157e308) { snprintf(buf, n, "INFINITY"); return; }
  if (v < -1.7976931348623157e308) { snprintf(buf, n, "(-INFINITY)"); return; }
  snprintf(buf, n, dbl ? "%.17g" : "%.9g", v);
  len = strlen(buf);
  if (!strpbrk(buf, ".e")) snprintf(buf + len, n - len, ".0");
  len = strlen(buf);
  if (!dbl) snprintf(buf + len, n - len, "f");
  if (buf[0] == '-') {            /* keep "a - -1.0f" readable and valid */
    char t[64];
    snprintf(t, sizeof t, "(%s)", buf);
    snprintf(buf, n, "%s", t);
  }
}

/* An int64 literal of generated code; INT64_MIN has no literal form. */
static void int_literal(char *buf, size_t n, int64_t v) {
  if (v == INT64_MIN) snprintf(buf, n, "FL_I64_MIN");
  else if (v < 0) snprintf(buf, n, "(%lldLL)", (long long)v);
  else snprintf(buf, n, "%lldLL", (long long)v);
}

/* Render text (an op table expression): $k becomes v<arg k>; with ints
** (the int64 form), an operand that is not int64 (a bool's 0/1 float) is
** converted, so the expression computes in fl_i64 throughout; without, an
** int64 operand is converted to float (double with dbl).  k NULL: no
** conversions.  d, when given, names the float exp and erf the text's
** expf and erff become (the dialect's own). */
static void render_text(strbuf *b, const fk_kernel *k, const fk_instr *in,
                        const char *s, int dbl, int ints, const fk_dialect *d) {
  static const char *const fnames[][2] = {
    {"fabsf(", "fabs("}, {"fminf(", "fmin("}, {"fmaxf(", "fmax("}, {"fl_powf(", "pow("},
    {"expf(", "exp("}, {"logf(", "log("}, {"sqrtf(", "sqrt("}, {"tanhf(", "tanh("},
    {"erff(", "erf("}, {"sinf(", "sin("}, {"cosf(", "cos("}, {"fmodf(", "fmod("}};
  char lit[64];
  size_t f;
  while (*s) {
    if (s[0] == '$' && s[1] >= '0' && s[1] <= '2') {
      int a = in->arg[s[1] - '0'];
      if (ints && k && k->instr[a].dtype != FL_I64) strbuf_printf(b, "((fl_i64)v%d)", a);
      /* an int64 value in a float expression: C would divide integers */
      else if (!ints && k && k->instr[a].dtype == FL_I64) strbuf_printf(b, "((%s)v%d)", dbl ? "double" : "float", a);
      else strbuf_printf(b, "v%d", a);
      s += 2;
      continue;
    }
    /* a random op's stream position: the kernel's key, the start block of
    ** the step's rng access, and its counter step (the last argument) */
    if (s[0] == '$' && s[1] == 'r') {
      int c = in->arg[in->narg - 1];
      if (k) strbuf_printf(b, "rk, rs%d, v%d", k->instr[c].access, c);
      else strbuf_printf(b, "rk, rs, v%d", c);
      s += 2;
      continue;
    }
    if (s[0] == '$' && s[1] == 'i' && s[2] == '0') {
      int_literal(lit, sizeof lit, in->attrs.i[0]);
      strbuf_printf(b, "%s", lit);
      s += 3;
      continue;
    }
    if (s[0] == '$' && s[1] == 'f' && (s[2] == '0' || s[2] == '1')) {
      fk_float_literal(lit, sizeof lit, in->attrs.f[s[2] - '0'], dbl);
      strbuf_printf(b, "%s", lit);
      s += 3;
      continue;
    }
    if (!dbl && d) {             /* the dialect's own exp and erf */
      const char *own = strncmp(s, "expf(", 5) == 0   ? d->exp_fn
                        : strncmp(s, "erff(", 5) == 0 ? d->erf_fn
                                                      : NULL;
      if (own) {
        strbuf_printf(b, "%s(", own);
        s += 5;
        continue;
      }
    }
    if (dbl) {
      for (f = 0; f < sizeof fnames / sizeof fnames[0]; f++)
        if (strncmp(s, fnames[f][0], strlen(fnames[f][0])) == 0) break;
      if (f < sizeof fnames / sizeof fnames[0]) {
        strbuf_printf(b, "%s", fnames[f][1]);
        s += strlen(fnames[f][0]);
        continue;
      }
    }
    strbuf_printf(b, "%c", *s++);
  }
}

int fk_step_int(const fk_kernel *k, const fk_instr *in) {
  fl_dtype dt[3];
  int a;
  if (in->opc != FKI_ELEM) return 0;
  for (a = 0; a < in->narg && a < 3; a++) dt[a] = k->instr[in->arg[a]].dtype;
  return op_int_compute(in->op, dt, in->narg);
}

void fk_render_int_helpers(strbuf *b, const char *fn) {
  strbuf_printf(b,
    "/* int64 is exact: fl_i64 arithmetic, wrapping through fl_u64 where signed\n"
    "** overflow would be undefined (ops.def's iexpr) */\n"
    "#define FL_I64_MIN (-9223372036854775807LL - 1)\n"
    "#define FL_I64_MAX 9223372036854775807LL\n"
    "/* float -> int64: truncation; NaN, infinities and values out of range\n"
    "** give INT64_MIN, as x86 (and so PyTorch there) and eager do */\n"
    "%s fl_i64 fl_f2i(double v)\n"
    "{\n"
    "  return v >= -9223372036854775808.0 && v < 9223372036854775808.0 ? (fl_i64)v : FL_I64_MIN;\n"
    "}\n"
    "/* a negative exponent: 1 for base 1, +-1 for base -1, else 0 (PyTorch) */\n"
    "%s fl_i64 fl_ipow(fl_i64 b, fl_i64 e)\n"
    "{\n"
    "  fl_u64 r = 1, m = (fl_u64)b;\n"
    "  if (e < 0) return b == 1 ? 1 : b == -1 ? ((e & 1) ? -1 : 1) : 0;\n"
    "  for (; e > 0; e >>= 1) {\n"
    "    if (e & 1) r *= m;\n"
    "    m *= m;\n"
    "  }\n"
    "  return (fl_i64)r;\n"
    "}\n"
    "/* C's %% truncates; a divisor of 0 or -1 gives 0 where C would trap */\n"
    "%s fl_i64 fl_ifmod(fl_i64 a, fl_i64 b)\n"
    "{\n"
    "  return (b == 0 || b == -1) ? 0 : a %% b;\n"
    "}\n"
    "/* floored: the divisor's sign, as Python's %% */\n"
    "%s fl_i64 fl_irem(fl_i64 a, fl_i64 b)\n"
    "{\n"
    "  const fl_i64 r = fl_ifmod(a, b);\n"
    "  return (r != 0 && ((r < 0) != (b < 0))) ? r + b : r;\n"
    "}\n"
    "/* real bounds saturate to int64 and truncate; NaN or infinite: none */\n"
    "%s fl_i64 fl_iclamp(fl_i64 x, double lo, double hi)\n"
    "{\n"
    "  const fl_i64 l = !(lo > -9223372036854775808.0) ? FL_I64_MIN\n"
    "                   : lo >= 9223372036854775808.0 ? FL_I64_MAX : (fl_i64)lo;\n"
    "  const fl_i64 h = !(hi < 9223372036854775808.0) ? FL_I64_MAX\n"
    "                   : hi <= -9223372036854775808.0 ? FL_I64_MIN : (fl_i64)hi;\n"
    "  if (x < l) x = l;\n"
    "  return x > h ? h : x;\n"
    "}\n", fn, fn, fn, fn, fn);
}

void fk_render_rng_helpers(strbuf *b, const char *fn) {
  strbuf_printf(b,
    "/* Philox4x32-10 as graph/rng.c: element i of a draw starting at block s\n"
    "** is word i%%4 of block s + i/4 under key k, so a kernel computes any\n"
    "** element alone and every backend draws the same numbers.  Words are\n"
    "** picked by selects, not an array index, so loops over them vectorize. */\n"
    "%s void fl_philox(fl_u64 block, fl_u64 key, unsigned *w0, unsigned *w1,\n"
    "                  unsigned *w2, unsigned *w3)\n"
    "{\n"
    "  unsigned c0 = (unsigned)block, c1 = (unsigned)(block >> 32), c2 = 0, c3 = 0;\n"
    "  unsigned k0 = (unsigned)key, k1 = (unsigned)(key >> 32);\n"
    "  for (int r = 0; r < 10; r++) {\n"
    "    const fl_u64 p0 = (fl_u64)0xD2511F53u * c0, p1 = (fl_u64)0xCD9E8D57u * c2;\n"
    "    const unsigned hi0 = (unsigned)(p0 >> 32), lo0 = (unsigned)p0;\n"
    "    const unsigned hi1 = (unsigned)(p1 >> 32), lo1 = (unsigned)p1;\n"
    "    c0 = hi1 ^ c1 ^ k0;\n"
    "    c1 = lo1;\n"
    "    c2 = hi0 ^ c3 ^ k1;\n"
    "    c3 = lo0;\n"
    "    k0 += 0x9E3779B9u;\n"
    "    k1 += 0xBB67AE85u;\n"
    "  }\n"
    "  *w0 = c0; *w1 = c1; *w2 = c2; *w3 = c3;\n"
    "}\n"
    "/* U[0,1) keeping `bits` significand bits: exact in the dtype, never 1 */\n"
    "%s float fl_rand_uniform(fl_u64 key, fl_u64 start, fl_i64 i, int bits)\n"
    "{\n"
    "  unsigned w0, w1, w2, w3;\n"
    "  fl_philox(start + (fl_u64)(i >> 2), key, &w0, &w1, &w2, &w3);\n"
    "  const int j = (int)(i & 3);\n"
    "  const unsigned w = j == 0 ? w0 : j == 1 ? w1 : j == 2 ? w2 : w3;\n"
    "  return (float)(w >> (32 - bits)) * (1.0f / (float)(1u << bits));\n"
    "}\n"
    "/* N(0,1): Box-Muller on the word pair of element i (words 0, 1 or 2, 3;\n"
    "** cos for the even element, sin for the odd), in double, rounded to\n"
    "** float32 */\n"
    "%s float fl_rand_normal(fl_u64 key, fl_u64 start, fl_i64 i)\n"
    "{\n"
    "  unsigned w0, w1, w2, w3;\n"
    "  fl_philox(start + (fl_u64)(i >> 2), key, &w0, &w1, &w2, &w3);\n"
    "  const int hi = (int)(i & 2);\n"
    "  const double u1 = ((double)(hi ? w2 : w0) + 1.0) * 0x1p-32;\n"
    "  const double u2 = (double)(hi ? w3 : w1) * 0x1p-32;\n"
    "  const double rad = sqrt(-2.0 * log(u1)), th = 0x1.921fb54442d18p+2 * u2;\n"
    "  return (float)((i & 1) ? rad * sin(th) : rad * cos(th));\n"
    "}\n", fn, fn, fn);
}

/* A kernel's text without comments and with its own name as "@": two
** kernels with the same key compile to the same code. */
char *fk_kernel_key(const char *text, const char *sym) {
  size_t n = strlen(text), i, o = 0, sl = strlen(sym);
  char *k = malloc(n + 1);
  if (!k) return NULL;
  for (i = 0; i < n;) {
    if (text[i] == '/' && text[i + 1] == '*') {
      const char *end = strstr(text + i + 2, "*/");
      i = end ? (size_t)(end - text) + 2 : n;
      continue;
    }
    if (strncmp(text + i, sym, sl) == 0) { k[o++] = '@'; i += sl; continue; }
    k[o++] = text[i++];
  }
  k[o] = '\0';
  return k;
}

int fk_by_recip(const fk_kernel *k, const fk_instr *in) {
  const fk_instr *d;
  if (k->kind != FK_REDUCE || in->opc != FKI_ELEM || in->op != OP_DIV || !in->full) return 0;
  d = &k->instr[in->arg[1]];
  return !d->full && d->dtype != FL_I64 && in->dtype != FL_I64 && k->instr[in->arg[0]].dtype != FL_I64;
}

int fk_exp_shifted(const fk_kernel *k, const fk_instr *in) {
  const fk_instr *sub, *m;
  if (k->kind != FK_REDUCE || in->opc != FKI_ELEM || in->op != OP_EXP || in->dtype != FL_F32) return 0;
  sub = &k->instr[in->arg[0]];
  if (sub->opc != FKI_ELEM || sub->op != OP_SUB || sub->dtype != FL_F32) return 0;
  m = &k->instr[sub->arg[1]];
  return m->opc == FKI_REDUCE && m->red == FKR_MAX && m->arg[0] == sub->arg[0];
}

void fk_render_value(strbuf *b, const fk_dialect *d, const fk_kernel *k,
                     const fk_instr *in, int dbl) {
  fl_dtype dt = in->dtype;
  const char *close = "";
  int ints = fk_step_int(k, in);
  /* only graph values are rounded: inner steps of a composite stay float */
  if (dt == FL_BOOL) { strbuf_printf(b, "(float)(("); close = ") != 0)"; }
  else if (dt == FL_I64) { if (!ints) { strbuf_printf(b, "fl_f2i("); close = ")"; } }
  else if (dt == FL_F16 && in->node >= 0) { strbuf_printf(b, "%s", d->f16_open); close = d->f16_close; }
  else if (dt == FL_BF16 && in->node >= 0) { strbuf_printf(b, "%s", d->bf16_open); close = d->bf16_close; }
  if (fk_by_recip(k, in)) {
    strbuf_printf(b, "(v%d * r%d)", in->arg[0], in->arg[1]);
  } else if (!dbl && d->exp_shifted_fn && fk_exp_shifted(k, in)) {
    strbuf_printf(b, "%s(v%d)", d->exp_shifted_fn, in->arg[0]);
  } else if (ints) {
    /* an integer to a float type rounds once, to float32, as eager does */
    if (dt != FL_I64 && dt != FL_BOOL) strbuf_printf(b, "(float)");
    strbuf_printf(b, "(");
    render_text(b, k, in, op_info_of(in->op)->iexpr, 1, 1, NULL);
    strbuf_printf(b, ")");
  } else {
    render_text(b, k, in, op_info_of(in->op)->expr, dbl, 0, d);
  }
  strbuf_printf(b, "%s", close);
}

void fk_render_node_line(strbuf *b, const ir_graph *g, int id) {
  const ir_node *nd = &g->nodes[id];
  char ty[128], desc[96];
  int i;
  ir_type_str(g, id, ty, sizeof ty);
  fk_describe(g, id, desc, sizeof desc);
  strbuf_printf(b, "**   %%%d = %s(", id, op_name(nd->op));
  for (i = 0; i < nd->nin; i++) {
    if (nd->in[i] < 0) strbuf_printf(b, "%sNone", i ? ", " : "");
    else strbuf_printf(b, "%s%%%d", i ? ", " : "", nd->in[i]);
  }
  strbuf_printf(b, ") : %s", ty);
  if (strcmp(desc, op_name(nd->op))) strbuf_printf(b, "    (%s)", desc);
  strbuf_printf(b, "\n");
}

const char *fk_value_type(fl_dtype t) { return t == FL_I64 ? "fl_i64" : "float"; }

int fk_render_step(strbuf *b, const fk_dialect *d, const fk_kernel *k, int i) {
  const fk_instr *in = &k->instr[i];
  int dbl = in->dtype == FL_I64;
  char lit[64];
  switch (in->opc) {
  case FKI_CONST:
    if (in->dtype == FL_I64) int_literal(lit, sizeof lit, in->ivalue);
    else fk_float_literal(lit, sizeof lit, in->value, dbl);
    strbuf_printf(b, "const %s v%d = %s;\n", fk_value_type(in->dtype), i, lit);
    return 1;
  case FKI_NRED:
    strbuf_printf(b, "const float v%d = (float)nr;\n", i);
    return 1;
  case FKI_ELEM:
    strbuf_printf(b, "const %s v%d = ", fk_value_type(in->dtype), i);
    fk_render_value(b, d, k, in, dbl);
    strbuf_printf(b, ";\n");
    return 1;
  default:
    return 0;
  }
}
