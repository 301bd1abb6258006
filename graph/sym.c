/*
** sym.c -- symbolic sizes (Dynamo's SymInt): integer expressions over the
** sizes of a graph's dynamic input dims.
**
** A graph holds a table of expressions; entries 0..nsyms-1 are the
** variables (s0, s1...: one per dynamic input dim, in input order) and
** later entries combine earlier ones, so evaluating the table in order is
** always possible.  A node dim with sym[d] = k > 0 has the size of
** expression k-1, and an attribute slot with asym[j] = k > 0 (a reshape's
** target size, a narrow's length) takes the value of expression k-1.
** Entries are hash-consed (the same expression twice is one entry) and
** folded where the answer does not depend on a variable, so the sizes
** Lua compares for equality meet as one value.
**
** At run time ir_sym_bind reads the variables from the real inputs,
** evaluates the table and writes every symbolic slot into the node's
** attrs: the attrs then hold the values for these sizes, and every
** consumer of attrs (shape rules, kernels' index maps, extern steps) reads
** them as if they had been captured at these sizes.
*/
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ir.h"

/* Expression x; variables beyond the table (graphs built by hand with
** sym[] only) are implicit. */
static ir_sym sym_at(const ir_graph *g, int x) {
  ir_sym s;
  if (x < g->nsx) return g->sx[x];
  memset(&s, 0, sizeof s);
  s.op = SYM_VAR;
  s.c = x;
  return s;
}

static int push(ir_graph *g, const ir_sym *s, fl_err *e) {
  int i;
  if (g->nsx < g->nsyms && s->op != SYM_VAR) {   /* implicit variables first */
    ir_sym v = sym_at(g, g->nsx);
    if (push(g, &v, e) < 0) return FL_ENOMEM;
    return push(g, s, e);
  }
  for (i = 0; i < g->nsx; i++)
    if (g->sx[i].op == s->op && g->sx[i].a == s->a && g->sx[i].b == s->b && g->sx[i].c == s->c &&
        s->op != SYM_VAR)
      return i;
  if (g->nsx >= IR_MAX_SYMX)
    return err_set(e, FL_EUNSUPPORTED, "capture: more than %d size expressions", IR_MAX_SYMX);
  if (g->nsx >= g->capsx) {
    int cap = g->capsx ? g->capsx * 2 : 16;
    ir_sym *n = realloc(g->sx, (size_t)cap * sizeof *n);
    if (!n) return err_set(e, FL_ENOMEM, "capture: out of memory");
    g->sx = n;
    g->capsx = cap;
  }
  g->sx[g->nsx] = *s;
  return g->nsx++;
}

int ir_sym_var(ir_graph *g, int64_t hint, fl_err *e) {
  ir_sym s;
  int x;
  if (g->nsx != g->nsyms)
    return err_set(e, FL_EINVAL, "capture: size variables must come before expressions");
  memset(&s, 0, sizeof s);
  s.op = SYM_VAR;
  s.c = g->nsyms;
  s.hint = hint;
  if ((x = push(g, &s, e)) >= 0) g->nsyms++;
  return x;
}

int ir_sym_const(ir_graph *g, int64_t v, fl_err *e) {
  ir_sym s;
  memset(&s, 0, sizeof s);
  s.op = SYM_CONST;
  s.c = v;
  s.hint = v;
  return push(g, &s, e);
}

static int64_t floordiv(int64_t a, int64_t b) {
  int64_t q = a / b;
  return (a % b != 0 && ((a < 0) != (b < 0))) ? q - 1 : q;
}

static int64_t apply(ir_symop op, int64_t a, int64_t b) {
  switch (op) {
  case SYM_ADD: return (int64_t)((uint64_t)a + (uint64_t)b);
  case SYM_SUB: return (int64_t)((uint64_t)a - (uint64_t)b);
  case SYM_MUL: return (int64_t)((uint64_t)a * (uint64_t)b);
  case SYM_DIV: return floordiv(a, b);
  case SYM_MOD: return a - floordiv(a, b) * b;
  case SYM_MAX: return a > b ? a : b;
  case SYM_MIN: return a < b ? a : b;
  default: return 0;
  }
}

int64_t ir_sym_hint(const ir_graph *g, int x) {
  return sym_at(g, x).hint;
}

int ir_sym_is_const(const ir_graph *g, int x, int64_t *v) {
  ir_sym s = sym_at(g, x);
  if (s.op != SYM_CONST) return 0;
  if (v) *v = s.c;
  return 1;
}

int ir_sym_op(ir_graph *g, ir_symop op, int a, int b, fl_err *e) {
  ir_sym s;
  int64_t va, vb;
  int ca = ir_sym_is_const(g, a, &va), cb = ir_sym_is_const(g, b, &vb);
  if ((op == SYM_DIV || op == SYM_MOD) && cb && vb == 0)
    return err_set(e, FL_EINVAL, "size arithmetic: division by zero");
  if (ca && cb) return ir_sym_const(g, apply(op, va, vb), e);
  /* identities that keep sizes recognisably equal (B*1 is B) */
  if (cb && vb == 0 && (op == SYM_ADD || op == SYM_SUB)) return a;
  if (ca && va == 0 && op == SYM_ADD) return b;
  if (cb && vb == 1 && (op == SYM_MUL || op == SYM_DIV)) return a;
  if (ca && va == 1 && op == SYM_MUL) return b;
  if (((ca && va == 0) || (cb && vb == 0)) && op == SYM_MUL) return ir_sym_const(g, 0, e);
  if (a == b && op == SYM_SUB) return ir_sym_const(g, 0, e);
  if (a == b && (op == SYM_MAX || op == SYM_MIN)) return a;
  /* commutative ops in one order, so s0*s1 and s1*s0 are one entry */
  if ((op == SYM_ADD || op == SYM_MUL || op == SYM_MAX || op == SYM_MIN) &&
      (cb ? !ca || a > b : !ca && a > b)) {   /* constants first: 2*s0 */
    int t = a; a = b; b = t;
  }
  memset(&s, 0, sizeof s);
  s.op = op;
  s.a = a;
  s.b = b;
  s.hint = apply(op, ir_sym_hint(g, a), ir_sym_hint(g, b));
  return push(g, &s, e);
}

int ir_sym_eval(const ir_graph *g, const int64_t *vars, int64_t *vals, fl_err *e) {
  int i, n = g->nsx > g->nsyms ? g->nsx : g->nsyms;
  for (i = 0; i < n; i++) {
    ir_sym s = sym_at(g, i);
    switch (s.op) {
    case SYM_VAR: vals[i] = vars[s.c]; break;
    case SYM_CONST: vals[i] = s.c; break;
    default:
      if ((s.op == SYM_DIV || s.op == SYM_MOD) && vals[s.b] == 0)
        return err_set(e, FL_EINVAL, "run: size expression divides by zero at these sizes");
      vals[i] = apply(s.op, vals[s.a], vals[s.b]);
    }
  }
  return FL_OK;
}

/* "s0", "s0*s1", "(s0+1)//2" into buf at *len. */
static void str_at(const ir_graph *g, int x, char *buf, size_t n, size_t *len, int paren) {
  static const char *ops[] = {"", "", "+", "-", "*", "//", "%", "max", "min"};
  ir_sym s = sym_at(g, x);
  int w;
  if (*len >= n) return;
  switch (s.op) {
  case SYM_VAR: w = snprintf(buf + *len, n - *len, "s%lld", (long long)s.c); break;
  case SYM_CONST: w = snprintf(buf + *len, n - *len, "%lld", (long long)s.c); break;
  case SYM_MAX: case SYM_MIN:
    w = snprintf(buf + *len, n - *len, "%s(", ops[s.op]);
    *len += w > 0 ? (size_t)w : 0;
    str_at(g, s.a, buf, n, len, 0);
    if (*len < n) *len += (size_t)snprintf(buf + *len, n - *len, ",");
    str_at(g, s.b, buf, n, len, 0);
    w = *len < n ? snprintf(buf + *len, n - *len, ")") : 0;
    break;
  default:
    if (s.op == SYM_SUB && sym_at(g, s.a).op == SYM_CONST && sym_at(g, s.a).c == 0) {
      w = snprintf(buf + *len, n - *len, "-");          /* -s0, not 0-s0 */
      *len += w > 0 ? (size_t)w : 0;
      str_at(g, s.b, buf, n, len, 1);
      return;
    }
    w = paren ? snprintf(buf + *len, n - *len, "(") : 0;
    *len += w > 0 ? (size_t)w : 0;
    str_at(g, s.a, buf, n, len, 1);
    if (*len < n) *len += (size_t)snprintf(buf + *len, n - *len, "%s", ops[s.op]);
    str_at(g, s.b, buf, n, len, 1);
    w = paren && *len < n ? snprintf(buf + *len, n - *len, ")") : 0;
  }
  *len += w > 0 ? (size_t)w : 0;
  if (*len > n) *len = n;
}

char *ir_sym_str(const ir_graph *g, int x, char *buf, size_t n) {
  size_t len = 0;
  if (n) buf[0] = '\0';
  str_at(g, x, buf, n, &len, 0);
  return buf;
}

/* The slot j of attrs: dims[0..FL_MAX_DIMS), then i[0..6). */
static int64_t *slot(op_attrs *a, int j) {
  return j < FL_MAX_DIMS ? &a->dims[j] : &a->i[j - FL_MAX_DIMS];
}

int ir_sym_vars(const ir_graph *g, const fl_meta *const *in, int64_t *vars) {
  int i, k, d, seen = 0;
  for (i = 0; i < g->nsyms; i++) vars[i] = ir_sym_hint(g, i);
  for (i = 0, k = 0; i < g->n && k < g->ninputs; i++) {
    const ir_node *nd = &g->nodes[i];
    if (nd->kind != IR_INPUT) continue;
    k++;
    for (d = 0; d < nd->meta.ndim && d < in[nd->index]->ndim; d++) {
      int s = nd->sym[d] - 1;
      if (s >= 0 && s < g->nsyms && sym_at(g, s).op == SYM_VAR) {
        vars[sym_at(g, s).c] = in[nd->index]->shape[d];
        seen++;
      }
    }
  }
  return seen;
}

int ir_sym_bind(const ir_graph *cg, const fl_meta *const *in, fl_err *e) {
  ir_graph *g = (ir_graph *)cg;      /* attrs are a cache of the expressions */
  int64_t vars[IR_MAX_SYMX], vals[IR_MAX_SYMX];
  int i, j, rc;
  if (!g->has_asym) return FL_OK;
  ir_sym_vars(g, in, vars);
  if ((rc = ir_sym_eval(g, vars, vals, e)) != FL_OK) return rc;
  for (i = 0; i < g->n; i++) {
    ir_node *nd = &g->nodes[i];
    if (nd->kind != IR_OP) continue;
    for (j = 0; j < IR_NASYM; j++)
      if (nd->asym[j] > 0) *slot(&nd->attrs, j) = vals[nd->asym[j] - 1];
  }
  return FL_OK;
}

int ir_sym_set_attrs(ir_graph *g, int id, const int *asym) {
  ir_node *nd = &g->nodes[id];
  int j, any = 0;
  for (j = 0; j < IR_NASYM; j++) any |= (nd->asym[j] = asym[j]) > 0;
  g->has_asym |= any;
  return any;
}

void ir_sym_uses(const ir_graph *g, int x, unsigned char *used) {
  ir_sym s;
  if (x < 0) return;
  s = sym_at(g, x);
  switch (s.op) {
  case SYM_VAR: used[s.c] = 1; break;
  case SYM_CONST: break;
  default: ir_sym_uses(g, s.a, used); ir_sym_uses(g, s.b, used);
  }
}

int ir_sym_numel(ir_graph *g, const ir_node *x, fl_err *e) {
  int d, p = -1;
  for (d = 0; d < x->meta.ndim; d++) {
    int f = x->sym[d] ? x->sym[d] - 1 : ir_sym_const(g, x->meta.shape[d], e);
    if (f < 0) return f;
    if ((p = p < 0 ? f : ir_sym_op(g, SYM_MUL, p, f, e)) < 0) return p;
  }
  return p < 0 ? ir_sym_const(g, 1, e) : p;
}
