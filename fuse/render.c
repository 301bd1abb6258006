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

void fk_render_expr(strbuf *b, const fk_instr *in, int dbl) {
  static const char *const fnames[][2] = {
    {"fabsf(", "fabs("}, {"fminf(", "fmin("}, {"fmaxf(", "fmax("}, {"powf(", "pow("},
    {"expf(", "exp("}, {"logf(", "log("}, {"sqrtf(", "sqrt("}, {"tanhf(", "tanh("},
    {"erff(", "erf("}, {"sinf(", "sin("}, {"cosf(", "cos("}};
  const char *s = op_info_of(in->op)->expr;
  char lit[64];
  size_t f;
  while (*s) {
    if (s[0] == '$' && s[1] >= '0' && s[1] <= '2') {
      strbuf_printf(b, "v%d", in->arg[s[1] - '0']);
      s += 2;
      continue;
    }
    if (s[0] == '$' && s[1] == 'f' && (s[2] == '0' || s[2] == '1')) {
      fk_float_literal(lit, sizeof lit, in->attrs.f[s[2] - '0'], dbl);
      strbuf_printf(b, "%s", lit);
      s += 3;
      continue;
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

void fk_render_value(strbuf *b, const fk_dialect *d, const fk_kernel *k,
                     const fk_instr *in, int dbl) {
  fl_dtype dt = in->dtype;
  const char *close = "";
  /* only graph values are rounded: inner steps of a composite stay float */
  if (dt == FL_BOOL) { strbuf_printf(b, "(float)(("); close = ") != 0)"; }
  else if (dt == FL_I64) { strbuf_printf(b, "trunc("); close = ")"; }
  else if (dt == FL_F16 && in->node >= 0) { strbuf_printf(b, "%s", d->f16_open); close = d->f16_close; }
  else if (dt == FL_BF16 && in->node >= 0) { strbuf_printf(b, "%s", d->bf16_open); close = d->bf16_close; }
  if (fk_by_recip(k, in)) strbuf_printf(b, "(v%d * r%d)", in->arg[0], in->arg[1]);
  else fk_render_expr(b, in, dbl);
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

const char *fk_value_type(fl_dtype t) { return t == FL_I64 ? "double" : "float"; }

int fk_render_step(strbuf *b, const fk_dialect *d, const fk_kernel *k, int i) {
  const fk_instr *in = &k->instr[i];
  int dbl = in->dtype == FL_I64;
  char lit[64];
  switch (in->opc) {
  case FKI_CONST:
    fk_float_literal(lit, sizeof lit, in->value, dbl);
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
