/*
** cuda_codegen.c -- readable CUDA C from kernel descriptions.
** Invariant: as in cpu/codegen.c, every value is computed in float32 with
** the op table's `expr` text (int64 values exactly, in fl_i64 with its
** `iexpr` text, sums wrapping in fl_u64), and rounded
** to its node's dtype exactly where the graph would have stored it, so a
** kernel gives the values the C one gives.  The expressions are the same
** text: CUDA spells expf, erff, tanhf, fminf... as C does; what differs is
** only the loop structure (threads and blocks instead of loops and
** OpenMP), the 16-bit types (cuda_fp16.h / cuda_bf16.h) and the
** reductions (warp shuffles).  Only identifiers this file makes and
** op-table text reach the source: no user-supplied string does.
*/
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_codegen.h"
#include "../fuse/render.h"

typedef struct gen {
  strbuf *b;
  const fuse_plan *p;
  const fk_kernel *k;
  int D;
  char *need;          /* scratch: steps needed inside the current loop */
  int anchor_val;      /* extern epilogue: the anchor's value replaces its
                          loads (a variable name "va"), else 0 */
  int any_stride_only; /* pointwise: only the any-stride loop (a rare
                          fallback kernel: half the compile time) */
} gen;

static const char *ctype(fl_dtype t) {
  switch (t) {
  case FL_F16: return "__half";
  case FL_BF16: return "__nv_bfloat16";
  case FL_I64: return "fl_i64";
  case FL_BOOL: return "fl_u8";
  default: return "float";
  }
}

/* the type a value is computed in */


static void ind(gen *g, int depth) { strbuf_printf(g->b, "%*s", 2 * depth, ""); }



/* how CUDA rounds to the 16-bit floats (preamble intrinsics) */
static const fk_dialect dialect = {"fl_rh(", ")", "fl_rb(", ")", NULL, NULL, NULL};


static void emit_recip(gen *g, int i, int depth) {
  const fk_kernel *k = g->k;
  int j;
  for (j = 0; j < k->ninstr; j++)
    if (fk_by_recip(g->k, &k->instr[j]) && k->instr[j].arg[1] == i) {
      ind(g, depth);
      strbuf_printf(g->b, "const float r%d = 1.0f / v%d;\n", i, i);
      return;
    }
}

/* Index of access a: "x<a>" in pointwise code (computed per element);
** in reduce code the row base b<a> plus the reduced dims' terms. */
static void index_expr(gen *g, int a, int inloop) {
  const fk_kernel *k = g->k;
  int d;
  if (k->kind != FK_REDUCE) { strbuf_printf(g->b, "x%d", a); return; }
  strbuf_printf(g->b, "b%d", a);
  if (!inloop) return;
  for (d = k->nkept; d < g->D; d++) strbuf_printf(g->b, " + j%d * s%d_%d", d, a, d);
}

static int is_anchor_load(const gen *g, const fk_instr *in) {
  return g->anchor_val && in->opc == FKI_LOAD && g->k->acc[in->access].node == g->k->anchor;
}

/* One step as a const declaration.  lane >= 0: the vector path, where
** unit-stride loads come from the lane arrays L<i>. */
static void emit_step(gen *g, int i, int depth, int inloop, int lane) {
  const fk_instr *in = &g->k->instr[i];
  const fk_access *ac;
  fl_dtype dt = in->dtype;
  ind(g, depth);
  switch (in->opc) {
  case FKI_LOAD:
    ac = &g->k->acc[in->access];
    strbuf_printf(g->b, "const %s v%d = ", fk_value_type(dt), i);
    if (is_anchor_load(g, in)) { strbuf_printf(g->b, "va;\n"); return; }
    if (ac->iota) {            /* the iota's element is its index */
      strbuf_printf(g->b, "(%s)(", fk_value_type(dt));
      if (lane) strbuf_printf(g->b, "o%d%s);\n", in->access, ac->inner == 1 ? " + j + l" : "");
      else {
        index_expr(g, in->access, inloop && (ac->full || g->k->kind != FK_REDUCE));
        strbuf_printf(g->b, ");\n");
      }
      return;
    }
    if (lane && ac->inner == 1) { strbuf_printf(g->b, "L%d[l];\n", i); return; }
    if (lane) { strbuf_printf(g->b, "fl_ld(p%d + o%d);\n", ac->buf, in->access); return; }
    strbuf_printf(g->b, "fl_ld(p%d + ", ac->buf);
    index_expr(g, in->access, inloop && (ac->full || g->k->kind != FK_REDUCE));
    strbuf_printf(g->b, ");\n");
    return;
  case FKI_CTR:
    /* the element's index in its random node, as if that were stored */
    ac = &g->k->acc[in->access];
    strbuf_printf(g->b, "const fl_i64 v%d = ", i);
    if (lane) strbuf_printf(g->b, "o%d%s;\n", in->access, ac->inner == 1 ? " + j + l" : "");
    else {
      index_expr(g, in->access, inloop && (ac->full || g->k->kind != FK_REDUCE));
      strbuf_printf(g->b, ";\n");
    }
    return;
  default:   /* reductions are combined by the stage's block reduction */
    fk_render_step(g->b, &dialect, g->k, i);
    return;
  }
}

static void emit_store(gen *g, int a, int depth, int inloop, int lane) {
  const fk_access *ac = &g->k->acc[a];
  ind(g, depth);
  if (lane) { strbuf_printf(g->b, "S%d[l] = v%d;\n", a, ac->value); return; }
  strbuf_printf(g->b, "fl_st(p%d + ", ac->buf);
  index_expr(g, a, inloop);
  strbuf_printf(g->b, ", v%d);\n", ac->value);
}

/* Mark the FULL steps a value needs (row values are already variables). */
static void mark(gen *g, int i) {
  const fk_instr *in = &g->k->instr[i];
  int a;
  if (g->need[i] || !in->full || in->opc == FKI_REDUCE) return;
  g->need[i] = 1;
  for (a = 0; a < in->narg; a++) mark(g, in->arg[a]);
}

/* --- pointwise ----------------------------------------------------------- */

/* The vector path applies when every unit-stride access is a 16/32-bit or
** bool buffer and no access walks the inner dim with another stride. */
static int vec_ok(gen *g) {
  const fk_kernel *k = g->k;
  int a;
  if (g->D == 0) return 0;
  for (a = 0; a < k->nacc; a++) {
    const fk_access *ac = &k->acc[a];
    fl_dtype dt = g->p->g->nodes[ac->node].meta.dtype;
    if (g->anchor_val && ac->node == k->anchor) return 0;
    if (ac->inner < 0) return 0;
    if (ac->store && ac->inner != 1) return 0;
    if (ac->inner == 1 && dt == FL_I64) return 0;
  }
  return 1;
}

static void pw_steps(gen *g, int depth, int lane) {
  const fk_kernel *k = g->k;
  int i, a;
  for (i = 0; i < k->ninstr; i++) emit_step(g, i, depth, 1, lane);
  for (a = 0; a < k->nacc; a++) if (k->acc[a].store) emit_store(g, a, depth, 1, lane);
}

/* "x<a> = o<a> + c0 * s<a>_0 + ..." for every access, from the flat
** element index in `flat` decomposed row-major over the D dims */
static void pw_coords(gen *g, const char *flat, int depth) {
  const fk_kernel *k = g->k;
  int d, a, D = g->D;
  ind(g, depth);
  strbuf_printf(g->b, "fl_i64 r = %s;\n", flat);
  for (d = D - 1; d >= 0; d--) {
    ind(g, depth);
    if (d > 0) strbuf_printf(g->b, "const fl_i64 c%d = fl_divmod(r, n%d);\n", d, d);
    else strbuf_printf(g->b, "const fl_i64 c0 = r;\n");
  }
  if (D == 0) { ind(g, depth); strbuf_printf(g->b, "(void)r;\n"); }
  for (a = 0; a < k->nacc; a++) {
    if (g->anchor_val && k->acc[a].node == k->anchor && !k->acc[a].store) continue;
    ind(g, depth);
    strbuf_printf(g->b, "const fl_i64 x%d = o%d", a, a);
    for (d = 0; d < D; d++) strbuf_printf(g->b, " + c%d * s%d_%d", d, a, d);
    strbuf_printf(g->b, ";\n");
  }
}

static void emit_pointwise(gen *g, int *vec) {
  const fk_kernel *k = g->k;
  int d, a, i, D = g->D, n = 0, v;
  *vec = 0;
  if (D == 0) {
    strbuf_printf(g->b, "  if (blockIdx.x != 0 || threadIdx.x != 0) return;\n");
    for (a = 0; a < k->nacc; a++) strbuf_printf(g->b, "  const fl_i64 x%d = o%d;\n", a, a);
    pw_steps(g, 1, 0);
    return;
  }
  strbuf_printf(g->b, "  const fl_i64 outer = 1");
  for (d = 0; d < D - 1; d++) strbuf_printf(g->b, " * n%d", d);
  strbuf_printf(g->b, ";\n");
  strbuf_printf(g->b, "  const fl_i64 start = (fl_i64)blockIdx.x * blockDim.x + threadIdx.x;\n");
  strbuf_printf(g->b, "  const fl_i64 step = (fl_i64)gridDim.x * blockDim.x;\n");
  if (g->any_stride_only) goto any_stride;
  /* the contiguous fast path: one flat dim, strides as the plan saw them */
  strbuf_printf(g->b, "  if (outer == 1");
  for (a = 0; a < k->nacc; a++) {
    if (k->acc[a].inner < 0 || (g->anchor_val && k->acc[a].node == k->anchor && !k->acc[a].store))
      continue;
    strbuf_printf(g->b, " && s%d_%d == %d", a, D - 1, k->acc[a].inner);
  }
  strbuf_printf(g->b, ") {\n");
  v = vec_ok(g);
  if (v) {
    *vec = 1;
    strbuf_printf(g->b, "    /* 4-wide loads and stores where every address allows */\n");
    strbuf_printf(g->b, "    const bool vec = true");
    for (a = 0; a < k->nacc; a++)
      if (k->acc[a].inner == 1 && !k->acc[a].rng && !k->acc[a].iota)
        strbuf_printf(g->b, " && fl_al4(p%d + o%d)", k->acc[a].buf, a);
    strbuf_printf(g->b, ";\n");
    strbuf_printf(g->b, "    const fl_i64 nq = vec ? n%d / 4 : 0;\n", D - 1);
    strbuf_printf(g->b, "    for (fl_i64 q = start; q < nq; q += step) {\n");
    strbuf_printf(g->b, "      const fl_i64 j = q * 4;\n");
    for (i = 0; i < k->ninstr; i++) {
      const fk_instr *in = &k->instr[i];
      if (in->opc != FKI_LOAD || k->acc[in->access].inner != 1 || k->acc[in->access].iota) continue;
      strbuf_printf(g->b, "      float L%d[4];\n", i);
      strbuf_printf(g->b, "      fl_ld4(L%d, p%d + o%d + j);\n", i, k->acc[in->access].buf, in->access);
    }
    for (a = 0; a < k->nacc; a++)
      if (k->acc[a].store) strbuf_printf(g->b, "      float S%d[4];\n", a);
    strbuf_printf(g->b, "#pragma unroll\n");
    strbuf_printf(g->b, "      for (int l = 0; l < 4; l++) {\n");
    pw_steps(g, 4, 1);
    strbuf_printf(g->b, "      }\n");
    for (a = 0; a < k->nacc; a++)
      if (k->acc[a].store) strbuf_printf(g->b, "      fl_st4(p%d + o%d + j, S%d);\n", k->acc[a].buf, a, a);
    strbuf_printf(g->b, "    }\n");
    strbuf_printf(g->b, "    for (fl_i64 j = nq * 4 + start; j < n%d; j += step) {\n", D - 1);
  } else {
    strbuf_printf(g->b, "    for (fl_i64 j = start; j < n%d; j += step) {\n", D - 1);
  }
  for (a = 0; a < k->nacc; a++) {
    if (g->anchor_val && k->acc[a].node == k->anchor && !k->acc[a].store) continue;
    strbuf_printf(g->b, "      const fl_i64 x%d = o%d", a, a);
    if (k->acc[a].inner == 1) strbuf_printf(g->b, " + j");
    else if (k->acc[a].inner < 0) strbuf_printf(g->b, " + j * s%d_%d", a, D - 1);
    strbuf_printf(g->b, ";\n");
    n++;
  }
  pw_steps(g, 3, 0);
  strbuf_printf(g->b, "    }\n");
  strbuf_printf(g->b, "    return;\n  }\n");
any_stride:
  strbuf_printf(g->b, "  /* any strides: the flat index decomposed over the dims */\n");
  strbuf_printf(g->b, "  const fl_i64 total = outer * n%d;\n", D - 1);
  strbuf_printf(g->b, "  for (fl_i64 i = start; i < total; i += step) {\n");
  pw_coords(g, "i", 2);
  pw_steps(g, 2, 0);
  strbuf_printf(g->b, "  }\n");
  (void)n;
}

/* --- reduce ---------------------------------------------------------------- */

/* exhaustive (no default): a new accumulator kind fails -Wswitch here
** rather than become a min */
static const char *red_op(fk_red r) {
  switch (r) {
  case FKR_SUM: return "fl_sum()";
  case FKR_MAX: return "fl_max()";
  case FKR_MIN: return "fl_min()";
  case FKR_ARGMAX: break;            /* its own block reduction */
  }
  return NULL;
}

/* the value type of a reduction's accumulator: a sum of int64 values wraps
** around in fl_u64 (signed overflow would be undefined) */
static const char *acc_type(gen *g, const fk_instr *in) {
  fl_dtype dt = g->k->instr[in->arg[0]].dtype;
  if (in->red == FKR_SUM && dt == FL_I64) return "fl_u64";
  return fk_value_type(dt);
}

/* the shared slots for a type (fl_shl holds argmax's indices) */
static const char *shared_of(const char *t) {
  if (strcmp(t, "double") == 0) return "fl_shd";
  if (strcmp(t, "fl_i64") == 0) return "fl_shi";
  if (strcmp(t, "fl_u64") == 0) return "fl_shu";
  return "fl_shf";
}

/* a max/min accumulator's identity: integers have no infinity */
static const char *red_identity(const char *t, fk_red r) {
  int ints = strcmp(t, "fl_i64") == 0 || strcmp(t, "fl_u64") == 0;
  if (r == FKR_SUM) return "0";
  if (r == FKR_MAX) return ints ? "FL_I64_MIN" : "-INFINITY";
  return ints ? "FL_I64_MAX" : "INFINITY";
}

/* a pass over the reduced elements of the row: stage > 0 accumulates that
** stage's reductions, stage 0 computes and stores the FULL outputs */
static void reduce_pass(gen *g, int stage) {
  const fk_kernel *k = g->k;
  int i, d, a, nk = k->nkept, D = g->D;
  memset(g->need, 0, (size_t)k->ninstr);
  for (i = 0; i < k->ninstr; i++) {
    const fk_instr *in = &k->instr[i];
    if (stage && in->opc == FKI_REDUCE && in->stage == stage) mark(g, in->arg[0]);
  }
  if (!stage)
    for (a = 0; a < k->nacc; a++)
      if (k->acc[a].store && k->acc[a].full) mark(g, k->acc[a].value);
  for (i = 0; i < k->ninstr && stage; i++) {
    const fk_instr *in = &k->instr[i];
    const char *t = acc_type(g, in);
    if (in->opc != FKI_REDUCE || in->stage != stage) continue;
    switch (in->red) {
    case FKR_SUM: strbuf_printf(g->b, "    %s acc%d = 0;\n", t, i); break;
    case FKR_MAX: case FKR_MIN:
      strbuf_printf(g->b, "    %s acc%d = %s;\n", t, i, red_identity(t, in->red));
      break;
    case FKR_ARGMAX: strbuf_printf(g->b, "    %s acc%d = 0;\n    fl_i64 arg%d = -1;\n", t, i, i); break;
    }
  }
  strbuf_printf(g->b, "    for (fl_i64 f = threadIdx.x; f < nr; f += blockDim.x) {\n");
  if (D - nk == 1) {
    strbuf_printf(g->b, "      const fl_i64 j%d = f;\n", nk);
  } else if (D > nk) {
    /* merged to the inner dim by fk_bind when the row is contiguous */
    strbuf_printf(g->b, "      fl_i64 j%d", nk);
    for (d = nk + 1; d < D; d++) strbuf_printf(g->b, ", j%d", d);
    strbuf_printf(g->b, ";\n      if (nr == n%d) {\n", D - 1);
    for (d = nk; d < D - 1; d++) strbuf_printf(g->b, "        j%d = 0;\n", d);
    strbuf_printf(g->b, "        j%d = f;\n      } else {\n        fl_i64 t = f;\n", D - 1);
    for (d = D - 1; d > nk; d--) strbuf_printf(g->b, "        j%d = fl_divmod(t, n%d);\n", d, d);
    strbuf_printf(g->b, "        j%d = t;\n      }\n", nk);
  }
  for (i = 0; i < k->ninstr; i++)
    if (g->need[i]) emit_step(g, i, 3, 1, 0);
  for (i = 0; i < k->ninstr && stage; i++) {
    const fk_instr *in = &k->instr[i];
    int x = in->arg[0];
    if (in->opc != FKI_REDUCE || in->stage != stage) continue;
    if (in->red == FKR_SUM) strbuf_printf(g->b, "      acc%d += v%d;\n", i, x);
    else if (in->red == FKR_ARGMAX) strbuf_printf(g->b, "      fl_argmax_step(acc%d, arg%d, v%d, f);\n", i, i, x);
    else strbuf_printf(g->b, "      acc%d = %s(acc%d, v%d);\n", i, red_op(in->red), i, x);
  }
  if (!stage)
    for (a = 0; a < k->nacc; a++)
      if (k->acc[a].store && k->acc[a].full) emit_store(g, a, 3, 1, 0);
  strbuf_printf(g->b, "    }\n");
  for (i = 0; i < k->ninstr && stage; i++) {
    const fk_instr *in = &k->instr[i];
    const char *t = acc_type(g, in);
    if (in->opc != FKI_REDUCE || in->stage != stage) continue;
    if (in->red == FKR_ARGMAX) {
      strbuf_printf(g->b, "    const %s v%d = (%s)fl_block_argmax(acc%d, arg%d, %s, fl_shl);\n",
                    fk_value_type(in->dtype), i, fk_value_type(in->dtype), i, i, shared_of(t));
    } else {
      strbuf_printf(g->b, "    const %s v%d = (%s)fl_block_reduce(acc%d, %s, %s, (%s)%s);\n",
                    fk_value_type(in->dtype), i, fk_value_type(in->dtype), i, shared_of(t), red_op(in->red), t,
                    red_identity(t, in->red));
    }
    emit_recip(g, i, 2);
  }
}

static void emit_row_steps(gen *g, int stage) {
  const fk_kernel *k = g->k;
  int i;
  for (i = 0; i < k->ninstr; i++) {
    const fk_instr *in = &k->instr[i];
    if (in->full || in->opc == FKI_REDUCE || in->stage != stage) continue;
    emit_step(g, i, 2, 0, 0);
    emit_recip(g, i, 2);
  }
}

/* some reduction of k accumulates int64 values (its shared slots) */
static int int_reduce(const fk_kernel *k) {
  int i;
  for (i = 0; i < k->ninstr; i++)
    if (k->instr[i].opc == FKI_REDUCE && k->instr[i].dtype == FL_I64 &&
        k->instr[k->instr[i].arg[0]].dtype == FL_I64)
      return 1;
  return 0;
}

static void emit_reduce(gen *g) {
  const fk_kernel *k = g->k;
  int i, d, a, s, nstages = 0, fullstores = 0, rowstores = 0;
  for (i = 0; i < k->ninstr; i++)
    if (k->instr[i].opc == FKI_REDUCE && k->instr[i].stage > nstages) nstages = k->instr[i].stage;
  for (a = 0; a < k->nacc; a++) {
    fullstores |= k->acc[a].store && k->acc[a].full;
    rowstores |= k->acc[a].store && !k->acc[a].full;
  }
  strbuf_printf(g->b, "  __shared__ float fl_shf[32];\n  __shared__ double fl_shd[32];\n"
                "  __shared__ fl_i64 fl_shl[32];\n");
  if (int_reduce(k))
    strbuf_printf(g->b, "  __shared__ fl_i64 fl_shi[32];\n  __shared__ fl_u64 fl_shu[32];\n");
  strbuf_printf(g->b, "  const fl_i64 rows = 1");
  for (d = 0; d < k->nkept; d++) strbuf_printf(g->b, " * n%d", d);
  strbuf_printf(g->b, ";\n  const fl_i64 nr = 1");
  for (d = k->nkept; d < g->D; d++) strbuf_printf(g->b, " * n%d", d);
  strbuf_printf(g->b, ";\n");
  strbuf_printf(g->b, "  /* one block per row */\n");
  strbuf_printf(g->b, "  for (fl_i64 row = blockIdx.x; row < rows; row += gridDim.x) {\n");
  strbuf_printf(g->b, "    fl_i64 rest = row;\n");
  for (d = k->nkept - 1; d >= 0; d--) {
    if (d > 0) strbuf_printf(g->b, "    const fl_i64 i%d = fl_divmod(rest, n%d);\n", d, d);
    else strbuf_printf(g->b, "    const fl_i64 i0 = rest;\n");
  }
  if (k->nkept == 0) strbuf_printf(g->b, "    (void)rest;\n");
  for (a = 0; a < k->nacc; a++) {
    strbuf_printf(g->b, "    const fl_i64 b%d = o%d", a, a);
    for (d = 0; d < k->nkept; d++) strbuf_printf(g->b, " + i%d * s%d_%d", d, a, d);
    strbuf_printf(g->b, ";\n");
  }
  emit_row_steps(g, 0);
  for (s = 1; s <= nstages; s++) {
    strbuf_printf(g->b, "    /* stage %d: a pass over the row, then the block combines */\n", s);
    reduce_pass(g, s);
    emit_row_steps(g, s);
  }
  if (fullstores) {
    strbuf_printf(g->b, "    /* the stores */\n");
    reduce_pass(g, 0);
  }
  if (rowstores) {
    strbuf_printf(g->b, "    if (threadIdx.x == 0) {\n");
    for (a = 0; a < k->nacc; a++)
      if (k->acc[a].store && !k->acc[a].full) emit_store(g, a, 3, 0, 0);
    strbuf_printf(g->b, "    }\n");
  }
  /* the next row reuses the shared slots */
  strbuf_printf(g->b, "    __syncthreads();\n");
  strbuf_printf(g->b, "  }\n");
}

/* --- kernels --------------------------------------------------------------- */

static void node_line(gen *g, int id) { fk_render_node_line(g->b, g->p->g, id); }

/* typed buffer pointers, sizes and the accesses' strides and offsets */
static void emit_args(gen *g, int nbuf) {
  const fk_kernel *k = g->k;
  const fuse_plan *p = g->p;
  int i, a, d;
  for (i = 0; i < k->nbufs; i++) {
    const ir_node *nd = &p->g->nodes[k->bufs[i]];
    int written = 0;
    for (a = 0; a < k->nacc; a++) written |= k->acc[a].store && k->acc[a].buf == i;
    if (k->kind == FK_EXTERN && k->bufs[i] == k->anchor) written = 1;
    strbuf_printf(g->b, "  %s%s *__restrict__ p%d = (%s%s *)P.buf[%d];   /* %%%d */\n",
                  written ? "" : "const ", ctype(nd->meta.dtype), i, written ? "" : "const ",
                  ctype(nd->meta.dtype), i, k->bufs[i]);
  }
  (void)nbuf;
  for (d = 0; d < g->D; d++) strbuf_printf(g->b, "  const fl_i64 n%d = P.arg[%d];\n", d, d);
  for (a = 0; a < k->nacc; a++) {
    const int base = g->D + a * (g->D + 1);
    strbuf_printf(g->b, "  /* %s %%%d */\n", k->acc[a].store ? "store" : k->acc[a].rng ?
                  "stream position of" : "load", k->acc[a].node);
    for (d = 0; d < g->D; d++)
      strbuf_printf(g->b, "  const fl_i64 s%d_%d = P.arg[%d];\n", a, d, base + d);
    strbuf_printf(g->b, "  const fl_i64 o%d = P.arg[%d];\n", a, base + g->D);
  }
  if (k->nrng) {
    int r = 0;
    strbuf_printf(g->b, "  /* the Philox key and each random node's start block, this run's */\n");
    strbuf_printf(g->b, "  const fl_u64 rk = (fl_u64)P.arg[%d];\n", fk_rng_arg(k));
    for (a = 0; a < k->nacc; a++)
      if (k->acc[a].rng)
        strbuf_printf(g->b, "  const fl_u64 rs%d = (fl_u64)P.arg[%d];   /* %%%d */\n", a,
                      fk_rng_arg(k) + 1 + r++, k->acc[a].node);
  }
}

static void header(gen *g, int kidx, const char *what) {
  const fk_kernel *k = g->k;
  int i;
  strbuf_printf(g->b, "/* k%d: %s (%s)\n", kidx, k->name, what);
  if (k->kind == FK_EXTERN) {
    strbuf_printf(g->b, "** the extern step:\n");
    node_line(g, k->anchor);
    if (k->nnodes) strbuf_printf(g->b, "** its epilogue fuses:\n");
  } else {
    strbuf_printf(g->b, "** fuses:\n");
  }
  for (i = 0; i < k->nnodes; i++) node_line(g, k->nodes[i]);
  strbuf_printf(g->b, "*/\n");
}

static int slot_of(const fk_kernel *k, int node) {
  int i;
  for (i = 0; i < k->nbufs; i++) if (k->bufs[i] == node) return i;
  return -1;
}

/* the buffer an anchor input reads: its views are folded into strides */
int cuda_operand_slot(const fuse_plan *p, const fk_kernel *k, int in) {
  const ir_graph *g = p->g;
  int s = g->nodes[k->anchor].in[in];
  if (s < 0) return -1;
  while (fk_is_view(g, s) && !p->stored[s] && slot_of(k, s) < 0) s = g->nodes[s].in[0];
  return slot_of(k, s);
}

/* The anchor's value type: float; for int64 results the exact one where
** the op is integer arithmetic (products and sums wrap through fl_u64,
** the max pool compares fl_i64), double elsewhere (an embedding's
** out-of-range NaN becomes FL_I64_MIN through fl_f2i). */
static const char *anchor_acc(const fuse_plan *p, const fk_kernel *k) {
  const ir_node *an = &p->g->nodes[k->anchor];
  if (an->meta.dtype != FL_I64) return "float";
  switch (an->op) {
  case OP_MATMUL: case OP_LINEAR: case OP_CONV2D: case OP_CUMSUM: return "fl_u64";
  case OP_MAX_POOL2D: case OP_AVG_POOL2D: case OP_PAD: case OP_FLIP: case OP_GATHER:
    return "fl_i64";
  default: return "double";
  }
}

/* The `out` lambda: store the anchor's result (when kept or unfused) and
** run the epilogue at the same flat index (when fused). */
static void emit_out_lambda(gen *g, int ea) {
  const fk_kernel *k = g->k;
  const fuse_plan *p = g->p;
  fl_dtype adt = p->g->nodes[k->anchor].meta.dtype;
  int as = slot_of(k, k->anchor);
  strbuf_printf(g->b, "  const fl_i64 *X = P.arg + %d;\n", ea);
  strbuf_printf(g->b, "  const bool fuse = X[%d] != 0, keep = X[%d] != 0;\n", CUX_FUSE, CUX_KEEP);
  strbuf_printf(g->b, "  auto out = [&](fl_i64 f, %s acc) {\n", anchor_acc(p, k));
  strbuf_printf(g->b, "    if (keep || !fuse) fl_st(p%d + f, acc);\n", as);
  if (k->nnodes == 0) {
    strbuf_printf(g->b, "    (void)fuse;\n  };\n");
    return;
  }
  strbuf_printf(g->b, "    if (!fuse) return;\n");
  strbuf_printf(g->b, "    /* the epilogue at the same element: the anchor's value as its\n"
                "    ** buffer would hold it, then the fused steps */\n");
  strbuf_printf(g->b, "    const %s va = %s(acc)%s;\n", fk_value_type(adt),
                adt == FL_F16 ? "fl_rh(" : adt == FL_BF16 ? "fl_rb(" : adt == FL_BOOL ? "(float)((" : "",
                adt == FL_F16 || adt == FL_BF16 ? ")" : adt == FL_BOOL ? " != 0))" : "");
  g->anchor_val = 1;
  pw_coords(g, "f", 2);
  pw_steps(g, 2, 0);
  g->anchor_val = 0;
  strbuf_printf(g->b, "  };\n");
}

/* rnn (ops.def): one block per (direction, batch row), grid-stride over
** them; the steps in order, each thread some hidden units: their gates
** from x_t (W, the biases) and h_{t-1} (R), in float whatever the
** dtypes, as cpu/eager_rnn.c computes them (the biases summed first, then
** added to x_t W^T, then the recurrent product).  h and c live in shared
** memory (h double-buffered: every unit reads all of h_{t-1}); GRU without
** linear_before_reset first computes r * h_{t-1} for every unit.  A step
** past the row's sequence_lens keeps the state and writes zeros to Y. */
static void emit_rnn(gen *g) {
  const fk_kernel *k = g->k;
  const fuse_plan *p = g->p;
  const ir_node *an = &p->g->nodes[k->anchor];
  op_rnn c;
  int i, sl[8], S, D;
  char lit[64];
  op_rnn_of(&an->attrs, &c);
  S = c.states; D = c.dirs;
  for (i = 0; i < 8; i++) sl[i] = i < an->nin && an->in[i] >= 0 ? cuda_operand_slot(p, k, i) : -1;
  strbuf_printf(g->b, "  /* %s, %s%s */\n", c.cell == OP_RNN_CELL_RNN ? "RNN" : c.cell == OP_RNN_CELL_GRU ?
                "GRU" : "LSTM", D == 2 ? "bidirectional" : c.reverse ? "reverse" : "forward",
                c.lbr ? ", linear_before_reset" : "");
  strbuf_printf(g->b, "  const fl_i64 *Q = X + %d;\n", CUX_OP);
  strbuf_printf(g->b, "  const fl_i64 nT = Q[%d], nB = Q[%d], nI = Q[%d], nH = Q[%d];\n", CUR_T, CUR_B, CUR_I,
                CUR_H);
  for (i = 0; i < 8; i++) {
    if (sl[i] < 0) continue;
    strbuf_printf(g->b, "  const fl_i64 *A%d = Q + %d;   /* input %d: strides, offset */\n", i,
                  CUR_OPS + i * CUR_PER, i + 1);
  }
  strbuf_printf(g->b, "  __shared__ float fl_rh0[%d], fl_rh1[%d], fl_rc[%d];\n", CUDA_RNN_HMAX,
                CUDA_RNN_HMAX, CUDA_RNN_HMAX);
  if (c.clip_on) {
    fk_float_literal(lit, sizeof lit, (double)(float)c.clip, 0);
    strbuf_printf(g->b, "  const float ck = %s;\n", lit);
    strbuf_printf(g->b, "  auto clip = [&](float v) -> float { return v != v ? v : v < -ck ? -ck : v > ck ? ck : v; };\n");
  } else {
    strbuf_printf(g->b, "  auto clip = [&](float v) -> float { return v; };\n");
  }
  strbuf_printf(g->b, "  for (fl_i64 row = blockIdx.x; row < %d * nB; row += gridDim.x) {\n", D);
  strbuf_printf(g->b, "    const fl_i64 d = row / nB, b = row %% nB;\n");
  strbuf_printf(g->b, "    const bool rev = %s;\n", D == 2 ? "d == 1" : c.reverse ? "true" : "false");
  strbuf_printf(g->b, "    const int af = d ? %d : %d, ag = d ? %d : %d, ah = d ? %d : %d;\n", c.act[1][0],
                c.act[0][0], c.act[1][1], c.act[0][1], c.act[1][2], c.act[0][2]);
  strbuf_printf(g->b, "    (void)ag; (void)ah;\n");
  if (sl[4] >= 0)
    strbuf_printf(g->b, "    const fl_i64 len = (fl_i64)fl_ld(p%d + A4[3] + b * A4[0]);\n", sl[4]);
  else
    strbuf_printf(g->b, "    const fl_i64 len = nT;\n");
  strbuf_printf(g->b, "    float *h = fl_rh0, *hn = fl_rh1;\n");
  strbuf_printf(g->b, "    for (fl_i64 j = threadIdx.x; j < nH; j += blockDim.x) {\n");
  if (sl[5] >= 0)
    strbuf_printf(g->b, "      h[j] = fl_ld(p%d + A5[3] + d * A5[0] + b * A5[1] + j * A5[2]);\n", sl[5]);
  else
    strbuf_printf(g->b, "      h[j] = 0.0f;\n");
  if (sl[6] >= 0 && c.cell == OP_RNN_CELL_LSTM)
    strbuf_printf(g->b, "      fl_rc[j] = fl_ld(p%d + A6[3] + d * A6[0] + b * A6[1] + j * A6[2]);\n", sl[6]);
  else
    strbuf_printf(g->b, "      fl_rc[j] = 0.0f;\n");
  strbuf_printf(g->b, "    }\n    __syncthreads();\n");
  /* gate row q of this direction: x_t W^T plus the biases; the recurrent
  ** product of a state vector v */
  strbuf_printf(g->b, "    for (fl_i64 s = 0; s < nT; s++) {\n");
  strbuf_printf(g->b, "      const fl_i64 t = rev ? nT - 1 - s : s;\n");
  strbuf_printf(g->b, "      const fl_i64 yo = ((%d + t) * %d + d) * nB * nH + b * nH;\n", S, D);
  strbuf_printf(g->b, "      if (!(t < len)) {   /* past the row's length: zeros, the state kept */\n");
  strbuf_printf(g->b, "        for (fl_i64 j = threadIdx.x; j < nH; j += blockDim.x) out(yo + j, 0.0f);\n");
  strbuf_printf(g->b, "        continue;\n      }\n");
  strbuf_printf(g->b, "      auto xw = [&](fl_i64 q, bool rbias) -> float {\n");
  strbuf_printf(g->b, "        float a = 0.0f;\n");
  strbuf_printf(g->b, "        for (fl_i64 i = 0; i < nI; i++)\n");
  strbuf_printf(g->b, "          a += fl_ld(p%d + A0[3] + t * A0[0] + b * A0[1] + i * A0[2]) *\n", sl[0]);
  strbuf_printf(g->b, "               fl_ld(p%d + A1[3] + d * A1[0] + q * A1[1] + i * A1[2]);\n", sl[1]);
  if (sl[3] >= 0) {
    strbuf_printf(g->b, "        const float wb = fl_ld(p%d + A3[3] + d * A3[0] + q * A3[1]);\n", sl[3]);
    strbuf_printf(g->b, "        const float rb = fl_ld(p%d + A3[3] + d * A3[0] + (%d * nH + q) * A3[1]);\n",
                  sl[3], c.gates);
    strbuf_printf(g->b, "        return a + (rbias ? wb + rb : wb + 0.0f);\n");
  } else {
    strbuf_printf(g->b, "        (void)rbias;\n        return a + 0.0f;\n");
  }
  strbuf_printf(g->b, "      };\n");
  strbuf_printf(g->b, "      auto hr = [&](fl_i64 q, const float *v) -> float {\n");
  strbuf_printf(g->b, "        float a = 0.0f;\n");
  strbuf_printf(g->b, "        for (fl_i64 i = 0; i < nH; i++) a += v[i] * fl_ld(p%d + A2[3] + d * A2[0] + q * A2[1] + i * A2[2]);\n",
                sl[2]);
  strbuf_printf(g->b, "        return a;\n      };\n");
  switch (c.cell) {
  case OP_RNN_CELL_RNN:
    strbuf_printf(g->b, "      for (fl_i64 j = threadIdx.x; j < nH; j += blockDim.x)\n");
    strbuf_printf(g->b, "        hn[j] = fl_rnn_act(af, clip(xw(j, true) + hr(j, h)));\n");
    break;
  case OP_RNN_CELL_GRU:
    if (!c.lbr) {
      /* r * h_{t-1} of every unit first: the candidate's product reads it */
      strbuf_printf(g->b, "      for (fl_i64 j = threadIdx.x; j < nH; j += blockDim.x)\n");
      strbuf_printf(g->b, "        fl_rc[j] = fl_rnn_act(af, clip(xw(nH + j, true) + hr(nH + j, h))) * h[j];\n");
      strbuf_printf(g->b, "      __syncthreads();\n");
    }
    strbuf_printf(g->b, "      for (fl_i64 j = threadIdx.x; j < nH; j += blockDim.x) {\n");
    strbuf_printf(g->b, "        const float z = fl_rnn_act(af, clip(xw(j, true) + hr(j, h)));\n");
    if (c.lbr) {
      strbuf_printf(g->b, "        const float r = fl_rnn_act(af, clip(xw(nH + j, true) + hr(nH + j, h)));\n");
      if (sl[3] >= 0)
        strbuf_printf(g->b, "        const float rb = fl_ld(p%d + A3[3] + d * A3[0] + (5 * nH + j) * A3[1]);\n", sl[3]);
      else
        strbuf_printf(g->b, "        const float rb = 0.0f;\n");
      strbuf_printf(g->b, "        const float hh = fl_rnn_act(ag, clip(xw(2 * nH + j, false) + r * (hr(2 * nH + j, h) + rb)));\n");
    } else {
      strbuf_printf(g->b, "        const float hh = fl_rnn_act(ag, clip(xw(2 * nH + j, true) + hr(2 * nH + j, fl_rc)));\n");
    }
    strbuf_printf(g->b, "        hn[j] = (1.0f - z) * hh + z * h[j];\n      }\n");
    break;
  default:   /* LSTM: gates i o f c; c in place (each unit reads only its own) */
    strbuf_printf(g->b, "      for (fl_i64 j = threadIdx.x; j < nH; j += blockDim.x) {\n");
    if (sl[7] >= 0) {
      strbuf_printf(g->b, "        const float pi = fl_ld(p%d + A7[3] + d * A7[0] + j * A7[1]);\n", sl[7]);
      strbuf_printf(g->b, "        const float po = fl_ld(p%d + A7[3] + d * A7[0] + (nH + j) * A7[1]);\n", sl[7]);
      strbuf_printf(g->b, "        const float pf = fl_ld(p%d + A7[3] + d * A7[0] + (2 * nH + j) * A7[1]);\n", sl[7]);
    } else {
      strbuf_printf(g->b, "        const float pi = 0.0f, po = 0.0f, pf = 0.0f;\n");
    }
    strbuf_printf(g->b, "        const float cc = fl_rc[j];\n");
    strbuf_printf(g->b, "        const float gi = fl_rnn_act(af, clip(xw(j, true) + hr(j, h) + pi * cc));\n");
    strbuf_printf(g->b, "        const float gf = fl_rnn_act(af, clip(xw(2 * nH + j, true) + hr(2 * nH + j, h) + pf * cc));\n");
    strbuf_printf(g->b, "        const float gc = fl_rnn_act(ag, clip(xw(3 * nH + j, true) + hr(3 * nH + j, h)));\n");
    strbuf_printf(g->b, "        const float cn = gf * cc + gi * gc;\n");
    strbuf_printf(g->b, "        const float go = fl_rnn_act(af, clip(xw(nH + j, true) + hr(nH + j, h) + po * cn));\n");
    strbuf_printf(g->b, "        fl_rc[j] = cn;\n");
    strbuf_printf(g->b, "        hn[j] = go * fl_rnn_act(ah, cn);\n      }\n");
    break;
  }
  strbuf_printf(g->b, "      __syncthreads();\n");
  strbuf_printf(g->b, "      { float *u = h; h = hn; hn = u; }\n");
  strbuf_printf(g->b, "      for (fl_i64 j = threadIdx.x; j < nH; j += blockDim.x) out(yo + j, h[j]);\n");
  strbuf_printf(g->b, "    }\n");
  strbuf_printf(g->b, "    /* Y_h%s */\n", S == 2 ? ", Y_c" : "");
  strbuf_printf(g->b, "    for (fl_i64 j = threadIdx.x; j < nH; j += blockDim.x) {\n");
  strbuf_printf(g->b, "      out(d * nB * nH + b * nH + j, h[j]);\n");
  if (S == 2) strbuf_printf(g->b, "      out((%d + d) * nB * nH + b * nH + j, fl_rc[j]);\n", D);
  strbuf_printf(g->b, "    }\n");
  strbuf_printf(g->b, "    __syncthreads();   /* the next row reuses the state */\n");
  strbuf_printf(g->b, "  }\n");
}

static int emit_extern(gen *g, const char *sym, int kidx, cuda_kinfo *info, fl_err *e) {
  const fk_kernel *k = g->k;
  const fuse_plan *p = g->p;
  const ir_node *an = &p->g->nodes[k->anchor];
  int ea = fk_nargs(k), nx = CUX_OP, i, s0, s1, s2;
  const char *acc = anchor_acc(p, k);
  char what[64];
  switch (an->op) {
  case OP_MATMUL: case OP_LINEAR: nx += CUM_COUNT; break;
  case OP_CONV2D: nx += CUC_COUNT; break;
  case OP_MAX_POOL2D: case OP_AVG_POOL2D: case OP_MAX_POOL2D_BACKWARD: nx += CUP_COUNT; break;
  case OP_EMBEDDING: nx += CUE_COUNT; break;
  case OP_PAD: nx += CUD_COUNT; break;
  case OP_FLIP: nx += CUF_COUNT; break;
  case OP_GATHER: nx += CUG_COUNT; break;
  case OP_INDEX_ADD: nx += CUI_COUNT; break;
  case OP_CUMSUM: nx += CUS_COUNT; break;
  case OP_RNN: nx += CUR_COUNT; break;
  case OP_MATMUL_INT8: nx += CUQ_COUNT; break;
  case OP_CAT:
    if (an->nin > CUDA_CAT_MAX)
      return err_set(e, FL_EUNSUPPORTED, "codegen(cuda): cat of %d inputs has no CUDA "
                     "lowering yet (at most %d)", an->nin, CUDA_CAT_MAX);
    nx += CUT_COUNT;
    break;
  default:
    return err_set(e, FL_EUNSUPPORTED, "codegen(cuda): %s has no CUDA lowering yet", op_name(an->op));
  }
  for (i = 0; i < an->nin; i++)
    if (an->in[i] >= 0 && cuda_operand_slot(p, k, i) < 0)
      return err_set(e, FL_EUNSUPPORTED, "codegen(cuda): %s: input %d is not a buffer of the kernel",
                     k->name, i + 1);
  info->nxarg = nx;
  info->narg = ea + nx;
  info->block = 256;
  snprintf(what, sizeof what, "%s%s", op_name(an->op), k->nnodes ? " with its epilogue in the store" : "");
  header(g, kidx, what);
  strbuf_printf(g->b, "extern \"C\" __global__ void __launch_bounds__(256) %s(const fl_params<%d, %d> P)\n{\n",
                sym, info->nbuf, info->narg);
  emit_args(g, info->nbuf);
  emit_out_lambda(g, ea);
  s0 = cuda_operand_slot(p, k, 0);
  s1 = an->nin > 1 ? cuda_operand_slot(p, k, 1) : -1;
  s2 = an->nin > 2 ? cuda_operand_slot(p, k, 2) : -1;
  switch (an->op) {
  case OP_MATMUL: case OP_LINEAR: {
    fl_dtype dt = p->g->nodes[k->bufs[s0]].meta.dtype;
    /* no bias: A's pointer stands in, never read (X[CUM_HASBIAS] is 0) */
    int sb = s2 >= 0 ? s2 : s0;
    if (dt == FL_F16 || dt == FL_BF16) {
      info->wmma = 1;
      strbuf_printf(g->b, "#if __CUDA_ARCH__ >= %d\n", dt == FL_F16 ? 700 : 800);
      strbuf_printf(g->b, "  fl_gemm_wmma(p%d, p%d, p%d, X + %d, out);\n", s0, s1, sb, CUX_OP);
      strbuf_printf(g->b, "#else\n");
    }
    strbuf_printf(g->b, "  fl_gemm<%s>(p%d, p%d, p%d, X + %d, out);\n", acc, s0, s1, sb, CUX_OP);
    if (dt == FL_F16 || dt == FL_BF16) strbuf_printf(g->b, "#endif\n");
    break;
  }
  case OP_CONV2D:
    if (s2 >= 0)
      strbuf_printf(g->b, "  fl_conv2d<%s>(p%d, p%d, p%d, X + %d, X[%d], out);\n", acc, s0, s1, s2,
                    CUX_OP, CUX_TOTAL);
    else
      strbuf_printf(g->b, "  fl_conv2d<%s>(p%d, p%d, (decltype(p%d))nullptr, X + %d, X[%d], out);\n",
                    acc, s0, s1, s1, CUX_OP, CUX_TOTAL);
    break;
  case OP_MAX_POOL2D: case OP_AVG_POOL2D:
    strbuf_printf(g->b, "  fl_pool2d<%s>(p%d, X + %d, X[%d], %d, out);\n", acc, s0, CUX_OP, CUX_TOTAL,
                  an->op == OP_AVG_POOL2D);
    break;
  case OP_MAX_POOL2D_BACKWARD:
    strbuf_printf(g->b, "  fl_max_pool2d_backward<%s>(p%d, p%d, X + %d, X[%d], out);\n", acc, s0, s1,
                  CUX_OP, CUX_TOTAL);
    break;
  case OP_EMBEDDING:
    strbuf_printf(g->b, "  fl_embedding(p%d, p%d, X + %d, X[%d], out);\n", s0, s1, CUX_OP, CUX_TOTAL);
    break;
  case OP_PAD: {
    /* the constant as a literal of the accumulator's type */
    char lit[64];
    if (!strcmp(acc, "fl_i64")) {
      if (an->attrs.i[9] == INT64_MIN) snprintf(lit, sizeof lit, "FL_I64_MIN");
      else snprintf(lit, sizeof lit, "(fl_i64)(%lldLL)", (long long)an->attrs.i[9]);
    } else {
      fk_float_literal(lit, sizeof lit, an->attrs.f[0], 0);
    }
    strbuf_printf(g->b, "  fl_pad<%s>(p%d, X + %d, X[%d], (%s)%s, out);\n", acc, s0, CUX_OP, CUX_TOTAL,
                  acc, lit);
    break;
  }
  case OP_CUMSUM:
    /* floats sum in double, as eager and the oracle do */
    strbuf_printf(g->b, "  fl_cumsum<%s>(p%d, X + %d, out);\n", strcmp(acc, "float") ? acc : "double",
                  s0, CUX_OP);
    break;
  case OP_FLIP:
    strbuf_printf(g->b, "  fl_strided<%s>(p%d, X + %d, X[%d], out);\n", acc, s0, CUX_OP, CUX_TOTAL);
    break;
  case OP_INDEX_ADD:
    strbuf_printf(g->b, "  fl_index_add<%s>(p%d, p%d, X + %d, X[%d], out);\n", acc, s0, s1, CUX_OP,
                  CUX_TOTAL);
    break;
  case OP_GATHER:
    strbuf_printf(g->b, "  fl_gather<%s>(p%d, p%d, X + %d, X[%d], out);\n", acc, s0, s1, CUX_OP, CUX_TOTAL);
    break;
  case OP_RNN: emit_rnn(g); break;
  case OP_MATMUL_INT8: {
    /* an absent zero point: A's pointer stands in, never read */
    int sza = an->nin > 2 ? cuda_operand_slot(p, k, 2) : -1, szb = an->nin > 3 ? cuda_operand_slot(p, k, 3) : -1;
    strbuf_printf(g->b, "  fl_matmul_int8(p%d, p%d, p%d, p%d, X + %d, X[%d], out);\n", s0, s1,
                  sza >= 0 ? sza : s0, szb >= 0 ? szb : s0, CUX_OP, CUX_TOTAL);
    break;
  }
  case OP_CAT: {
    /* the input an element comes from: the first whose extent along dim
    ** holds the coordinate */
    strbuf_printf(g->b, "  const fl_i64 *T = X + %d;\n", CUX_OP);
    strbuf_printf(g->b, "  const int nd = (int)T[%d], dim = (int)T[%d];\n", CUT_ND, CUT_DIM);
    strbuf_printf(g->b, "  for (fl_i64 f = (fl_i64)blockIdx.x * blockDim.x + threadIdx.x; f < X[%d];\n"
                  "       f += (fl_i64)gridDim.x * blockDim.x) {\n", CUX_TOTAL);
    strbuf_printf(g->b, "    fl_i64 c[%d], r = f;\n", FL_MAX_DIMS);
    strbuf_printf(g->b, "    for (int d = nd - 1; d >= 0; d--) c[d] = fl_divmod(r, T[%d + d]);\n", CUT_OSIZE);
    strbuf_printf(g->b, "    int q = 0;\n");
    strbuf_printf(g->b, "    while (q < %d - 1 && c[dim] >= T[%d + q * %d]) {\n      c[dim] -= T[%d + q * %d];\n"
                  "      q++;\n    }\n", an->nin, CUT_IN, CUT_PER, CUT_IN, CUT_PER);
    strbuf_printf(g->b, "    const fl_i64 *I = T + %d + q * %d;\n", CUT_IN, CUT_PER);
    strbuf_printf(g->b, "    fl_i64 at = I[1];\n    for (int d = 0; d < nd; d++) at += c[d] * I[2 + d];\n");
    strbuf_printf(g->b, "    %s v = 0;\n    switch (q) {\n", acc);
    for (i = 0; i < an->nin; i++) {
      int s = cuda_operand_slot(p, k, i);
      if (s < 0) continue;
      strbuf_printf(g->b, "    case %d: v = fl_ld(p%d + at); break;\n", i, s);
    }
    strbuf_printf(g->b, "    default: break;\n    }\n    out(f, v);\n  }\n");
    break;
  }
  default:
    break;
  }
  strbuf_printf(g->b, "}\n\n");
  return 1;
}

int cuda_plan_has_extern(const fuse_plan *p) {
  int k, f = 0;
  for (k = 0; k < p->nkernels; k++) {
    const fk_kernel *kk = &p->kernels[k];
    const ir_node *an;
    if (kk->kind != FK_EXTERN) continue;
    f |= CUDA_PRE_EXTERN;
    an = &p->g->nodes[kk->anchor];
    if ((an->op == OP_MATMUL || an->op == OP_LINEAR) && an->nin > 0 && an->in[0] >= 0) {
      fl_dtype dt = p->g->nodes[an->in[0]].meta.dtype;
      if (dt == FL_F16 || dt == FL_BF16) f |= CUDA_PRE_WMMA;
    }
  }
  return f;
}

int cuda_emit_kernel(strbuf *b, const fuse_plan *p, int kidx, const char *sym,
                     cuda_kinfo *info, fl_err *e) {
  const fk_kernel *k = &p->kernels[kidx];
  char need[4096], esym[240];
  gen g;
  int rc;
  memset(info, 0, sizeof *info);
  info->kind = k->kind;
  if (k->kind != FK_EXTERN && k->nnodes == 0) return 0;
  if (k->ninstr > (int)sizeof need)
    return err_set(e, FL_EUNSUPPORTED, "codegen(cuda): %s has %d steps: more than %d is unsupported",
                   k->name, k->ninstr, (int)sizeof need);
  for (rc = 0; rc <= k->nbufs; rc++) {
    int id = rc < k->nbufs ? k->bufs[rc] : k->anchor;
    if (id >= 0 && p->g->nodes[id].meta.dtype == FL_F64)
      return err_set(e, FL_EUNSUPPORTED, "codegen(cuda): %s works in float64, unsupported on "
                     "the device (the CPU runs it: eager, or compiled for the cpu)", k->name);
  }
  memset(&g, 0, sizeof g);
  g.b = b; g.p = p; g.k = k; g.D = k->nkept + k->nred; g.need = need;
  info->nbuf = k->nbufs > 0 ? k->nbufs : 1;
  info->narg = fk_nargs(k) > 0 ? fk_nargs(k) : 1;
  info->emitted = 1;
  if (k->kind == FK_EXTERN) {
    if ((rc = emit_extern(&g, sym, kidx, info, e)) < 0) return rc;
    if (k->nnodes == 0) return 1;
    /* the same epilogue as a kernel of its own, for when its space is not
    ** the anchor's (the runtime checks at each launch): a fallback, so
    ** only the any-stride loop, which is quicker to compile */
    info->epi = 1;
    g.any_stride_only = 1;
    snprintf(esym, sizeof esym, "%s_epi", sym);
    strbuf_printf(b, "/* k%d: %s (the epilogue alone, after the extern step) */\n", kidx, k->name);
    strbuf_printf(b, "extern \"C\" __global__ void __launch_bounds__(512) %s(const fl_params<%d, %d> P)\n{\n",
                  esym, info->nbuf, info->narg);
    emit_args(&g, info->nbuf);
    emit_pointwise(&g, &rc);
    strbuf_printf(b, "}\n\n");
    return 1;
  }
  header(&g, kidx, k->kind == FK_REDUCE ? "reduce" : "pointwise");
  strbuf_printf(b, "extern \"C\" __global__ void __launch_bounds__(512) %s(const fl_params<%d, %d> P)\n{\n",
                sym, info->nbuf, info->narg);
  emit_args(&g, info->nbuf);
  if (k->kind == FK_REDUCE) {
    info->block = 256;
    emit_reduce(&g);
  } else {
    info->block = 256;
    emit_pointwise(&g, &info->vec);
  }
  strbuf_printf(b, "}\n\n");
  return 1;
}
