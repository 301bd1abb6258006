/*
** cuda_program.c -- what the CUDA backend does that no other does
** (cuda_program.h): render with cuda_codegen.c, compile with NVRTC
** (through the cache), load the image, launch a kernel with its parameter
** block and grid (an extern step as a generated tiled kernel, or cuBLAS
** where max-autotune chose it), CUDA graphs for "reduce-overhead", and
** autotune.  Everything between kernels is the executor's (exec/).
** Invariant (the executor's, and): an extern kernel runs its epilogue in
** its store only when the epilogue's space is the anchor's output,
** element for element (checked at every launch), else the epilogue runs
** as its own kernel afterwards.
*/
#include "config.h"

#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_program.h"
#include "cublas.h"
#include "../exec/cache.h"
#include "../fuse/render.h"
#include "../graph/view.h"
#include "../graph/rng.h"

/* --- the backend's own state per program ------------------------------------- */

cuda_state *cuda_state_of(exec_program *pr) {
  cuda_state *cs = pr->priv;
  size_t nk = (size_t)(pr->plan->nkernels ? pr->plan->nkernels : 1);
  int k;
  if (cs) return cs;
  if (!(cs = calloc(1, sizeof *cs))) return NULL;
  cs->block = calloc(nk, sizeof *cs->block);
  cs->epis = calloc(nk, sizeof *cs->epis);
  if (!cs->block || !cs->epis) {
    free(cs->block); free(cs->epis); free(cs);
    return NULL;
  }
  for (k = 0; k < pr->plan->nkernels; k++) {
    const cuda_kinfo *in = EXEC_KINFO(pr, k);
    cs->block[k] = in->block;
    if (in->nbuf > cs->maxbuf) cs->maxbuf = in->nbuf;
  }
  pr->priv = cs;
  return cs;
}

static void drop_graph(exec_program *pr);

static void free_priv(exec_program *pr) {
  cuda_state *cs = pr->priv;
  if (!cs) return;
  drop_graph(pr);
  cuda_module_free(cs->mod);
  free(cs->block); free(cs->epis); free(cs->cublas); free(cs->pblock);
  free(cs);
  pr->priv = NULL;
}

/* --- renderer and compiler ------------------------------------------------------- */

static void preamble(strbuf *b, const fuse_plan *const *plans, int n) {
  int i, ext = 0;
  for (i = 0; i < n; i++) ext |= cuda_plan_has_extern(plans[i]);
  cuda_emit_preamble(b, ext);
}

static int render(strbuf *b, const fuse_plan *p, int k, const char *sym, void *kinfo,
                  const int64_t *known, fl_err *e) {
  (void)known;     /* CUDA kernels take their sizes as arguments */
  return cuda_emit_kernel(b, p, k, sym, kinfo, e);
}

/* NVRTC's image, counted: the programs of a batch share one */
typedef struct cuda_image { nvrtc_image img; int refs; } cuda_image;

static int compile(const char *head, const char *const *units, int nunits, void **image,
                   char **log, int *how, fl_err *e) {
  cuda_image *ci = calloc(1, sizeof *ci);
  strbuf src;
  int i, rc;
  if (!ci) return err_set(e, FL_ENOMEM, "compile(cuda): out of memory");
  /* one NVRTC program: the head once, then every unit */
  memset(&src, 0, sizeof src);
  strbuf_printf(&src, "%s", head);
  for (i = 0; i < nunits; i++) strbuf_printf(&src, "%s", units[i]);
  if (src.oom) { strbuf_free(&src); free(ci); return err_set(e, FL_ENOMEM, "compile(cuda): out of memory"); }
  rc = nvrtc_compile(src.p, "fuselab.cu", nvrtc_default_arch(), &ci->img, log, e);
  strbuf_free(&src);
  if (rc != FL_OK) { free(ci); return rc; }
  ci->refs = 1;
  *how = ci->img.how;
  *image = ci;
  return FL_OK;
}

static void *image_retain(void *img) {
  if (img) ((cuda_image *)img)->refs++;
  return img;
}

static void image_release(void *img) {
  cuda_image *ci = img;
  if (!ci || --ci->refs > 0) return;
  nvrtc_image_free(&ci->img);
  free(ci);
}

const nvrtc_image *cuda_program_image(const exec_program *pr) {
  return pr->image ? &((const cuda_image *)pr->image)->img : NULL;
}

const char *cuda_program_ptx(const exec_program *pr) {
  const nvrtc_image *img = cuda_program_image(pr);
  return img ? img->ptx : NULL;
}

/* --- runtime ---------------------------------------------------------------------- */

/* Load the image and find every kernel (needs a device). */
static int load(exec_program *pr, fl_err *e) {
  const nvrtc_image *img = cuda_program_image(pr);
  cuda_state *cs = cuda_state_of(pr);
  char esym[240];
  int k, rc;
  if (!cs) return err_set(e, FL_ENOMEM, "load(cuda): out of memory");
  if ((rc = cuda_rt_init(e)) != FL_OK) return rc;
  cuda_module_free(cs->mod);
  cs->mod = NULL;
  if ((rc = cuda_module_load(img->cubin ? img->cubin : (void *)img->ptx, &cs->mod, e)) != FL_OK)
    return rc;
  for (k = 0; k < pr->plan->nkernels && rc == FL_OK; k++) {
    const char *sym = pr->alias[k] ? pr->alias[k] : pr->syms[k];
    if (!pr->syms[k]) continue;
    rc = cuda_module_kernel(cs->mod, sym, &pr->fns[k], e);
    if (rc == FL_OK && ((cuda_kinfo *)EXEC_KINFO(pr, k))->epi) {
      snprintf(esym, sizeof esym, "%s_epi", sym);
      rc = cuda_module_kernel(cs->mod, esym, &cs->epis[k], e);
    }
  }
  return rc;
}

static int to_device(fl_tensor *dst, const fl_tensor *src, fl_err *e) {
  if (src->m.device == FL_DEV_CUDA) return cuda_contiguous(dst, src, e);
  return cuda_copy_to(dst, src, FL_DEV_CUDA, e);
}

static int copy_into(fl_tensor *dst, const fl_tensor *src, fl_err *e) { return cuda_copy_into(dst, src, e); }
static int wait_stream(fl_err *e) { return cuda_sync(e); }
static int nargs(const exec_program *pr, int k) { return ((const cuda_kinfo *)EXEC_KINFO(pr, k))->narg; }

/* One launch as the kernels below see it. */
typedef struct run_ctx {
  exec_run *r;
  exec_program *pr;
  cuda_state *cs;
  const ir_graph *g;
  const fl_meta *metas;
  fl_tensor *vals;
  int64_t *args;        /* fk_nargs + extern slots */
  uint64_t *block;      /* the parameter block being built */
} run_ctx;

static int slot_of(const fk_kernel *k, int node) {
  int i;
  for (i = 0; i < k->nbufs; i++) if (k->bufs[i] == node) return i;
  return -1;
}

/* Operand `in` of the anchor when its views end in a reshape the strides
** cannot follow (the heads merged back, reshape(transpose(x))): the
** operand is made contiguous on the device, held as its node's value until
** its last use, and addressed from kernel buffer s's base.  Device
** pointers share one flat address space (unified virtual addressing on
** every 64-bit CUDA platform), and device blocks are 256-byte aligned, so
** the distance is a whole number of elements. */
static int copied_operand(run_ctx *c, const fk_kernel *k, int in, int s, fl_tensor *out,
                          int64_t *rel, fl_err *e) {
  int id = c->g->nodes[k->anchor].in[in], rc;
  size_t es = dtype_size(c->metas[id].dtype);
  ptrdiff_t d;
  err_clear(e);
  if ((rc = exec_value(c->r, id, 1, e)) != FL_OK) return rc;
  d = (const char *)ten_data(&c->vals[id]) - (const char *)ten_data(&c->vals[s]);
  if (d % (ptrdiff_t)es)
    return err_set(e, FL_EUNSUPPORTED, "%s: operand %d: copy not aligned to its elements",
                   k->name, in + 1);
  ten_share(out, &c->vals[id]);
  *rel = (int64_t)(d / (ptrdiff_t)es);
  return FL_OK;
}

/* Operand `in` of the anchor as a strided device view of its kernel
** buffer: the folded views replayed on metadata.  *rel gets the view's
** offset relative to the buffer's first element. */
static int anchor_operand(run_ctx *c, const fk_kernel *k, int in, fl_tensor *out, int64_t *rel,
                          fl_err *e) {
  const ir_graph *g = c->g;
  int chain[64], n = 0, s = g->nodes[k->anchor].in[in], rc, i;
  fl_tensor t, v;
  while (fk_is_view(g, s) && !c->pr->plan->stored[s] && slot_of(k, s) < 0 && n < 64) {
    chain[n++] = s;
    s = g->nodes[s].in[0];
  }
  if (slot_of(k, s) < 0) return err_set(e, FL_EUNSUPPORTED, "%s: operand %d has no buffer", k->name, in + 1);
  if ((rc = exec_value(c->r, s, 1, e)) != FL_OK) return rc;
  ten_share(&t, &c->vals[s]);
  for (i = n - 1; i >= 0; i--) {
    const ir_node *nd = &g->nodes[chain[i]];
    if (nd->op == OP_CONTIGUOUS) continue;     /* strides serve as they are */
    rc = view_apply(nd->op, &t, &nd->attrs, &c->metas[chain[i]], &v, e);
    ten_release(&t);
    if (rc == FL_EUNSUPPORTED) return copied_operand(c, k, in, s, out, rel, e);
    if (rc != FL_OK) return rc;
    t = v;
  }
  *rel = t.offset - c->vals[s].offset;
  *out = t;
  return FL_OK;
}

static int64_t numel_of(const fl_meta *m) { return meta_numel(m); }

/* The anchor's own arguments (cuda_codegen.h's slots) into X. */
static int extern_args(run_ctx *c, const fk_kernel *k, int64_t *X, fl_err *e) {
  const ir_node *an = &c->g->nodes[k->anchor];
  const fl_meta *om = &c->metas[k->anchor];
  int64_t *Y = X + CUX_OP, rel[CUDA_CAT_MAX];
  fl_tensor op[CUDA_CAT_MAX];
  op_win2d wg;
  int i, d, rc = FL_OK, nop = an->nin < CUDA_CAT_MAX ? an->nin : CUDA_CAT_MAX;
  memset(op, 0, sizeof op);
  for (i = 0; i < nop && rc == FL_OK; i++)
    if (an->in[i] >= 0) rc = anchor_operand(c, k, i, &op[i], &rel[i], e);
  if (rc != FL_OK) goto done;
  X[CUX_TOTAL] = numel_of(om);
  switch (an->op) {
  case OP_MATMUL: case OP_LINEAR: {
    const fl_tensor *A = &op[0], *B = &op[1];
    int lin = an->op == OP_LINEAR, nba, nbb, nbd;
    int64_t M, K, N, cnt = 1;
    if (A->m.ndim == 1) { M = 1; K = A->m.shape[0]; Y[CUM_SAM] = 0; Y[CUM_SAK] = A->stride[0]; nba = 0; }
    else {
      M = A->m.shape[A->m.ndim - 2]; K = A->m.shape[A->m.ndim - 1];
      Y[CUM_SAM] = A->stride[A->m.ndim - 2]; Y[CUM_SAK] = A->stride[A->m.ndim - 1];
      nba = A->m.ndim - 2;
    }
    if (lin) {
      if (B->m.ndim == 1) { N = 1; Y[CUM_SBK] = B->stride[0]; Y[CUM_SBN] = 0; }
      else { N = B->m.shape[0]; Y[CUM_SBK] = B->stride[1]; Y[CUM_SBN] = B->stride[0]; }
      nbb = 0;
    } else if (B->m.ndim == 1) { N = 1; Y[CUM_SBK] = B->stride[0]; Y[CUM_SBN] = 0; nbb = 0; }
    else {
      N = B->m.shape[B->m.ndim - 1];
      Y[CUM_SBK] = B->stride[B->m.ndim - 2]; Y[CUM_SBN] = B->stride[B->m.ndim - 1];
      nbb = B->m.ndim - 2;
    }
    nbd = nba > nbb ? nba : nbb;
    if (nbd > 6) { rc = err_set(e, FL_EUNSUPPORTED, "%s: more than 6 batch dims", k->name); goto done; }
    for (d = 0; d < nbd; d++) {
      int da = d - (nbd - nba), db = d - (nbd - nbb);
      int64_t sa = da >= 0 ? A->m.shape[da] : 1, sb = db >= 0 ? B->m.shape[db] : 1;
      Y[CUM_BSIZE + d] = sa == 1 ? sb : sa;
      Y[CUM_BSA + d] = da >= 0 && sa != 1 ? A->stride[da] : 0;
      Y[CUM_BSB + d] = db >= 0 && sb != 1 ? B->stride[db] : 0;
      cnt *= Y[CUM_BSIZE + d];
    }
    Y[CUM_B] = cnt; Y[CUM_M] = M; Y[CUM_N] = N; Y[CUM_K] = K; Y[CUM_NBD] = nbd;
    Y[CUM_OA] = rel[0]; Y[CUM_OB] = rel[1];
    Y[CUM_HASBIAS] = lin && an->nin > 2 && an->in[2] >= 0;
    if (Y[CUM_HASBIAS]) {
      Y[CUM_SBIAS] = op[2].m.ndim ? op[2].stride[op[2].m.ndim - 1] : 0;
      Y[CUM_OBIAS] = rel[2];
    }
    if (cnt * M * N != X[CUX_TOTAL])
      rc = err_set(e, FL_EUNSUPPORTED, "%s: %lld x %lld x %lld results for %lld outputs", k->name,
                   (long long)cnt, (long long)M, (long long)N, (long long)X[CUX_TOTAL]);
    break;
  }
  case OP_CONV2D: {
    const fl_tensor *x = &op[0], *w = &op[1];
    int b3 = x->m.ndim == 3;
    Y[CUC_N] = b3 ? 1 : x->m.shape[0];
    Y[CUC_C] = x->m.shape[b3 ? 0 : 1]; Y[CUC_H] = x->m.shape[b3 ? 1 : 2]; Y[CUC_W] = x->m.shape[b3 ? 2 : 3];
    Y[CUC_CO] = w->m.shape[0]; Y[CUC_KH] = w->m.shape[2]; Y[CUC_KW] = w->m.shape[3];
    Y[CUC_OH] = om->shape[om->ndim - 2]; Y[CUC_OW] = om->shape[om->ndim - 1];
    op_win2d_of(OP_CONV2D, &an->attrs, w->m.shape[2], w->m.shape[3], &wg);
    Y[CUC_SH] = wg.sh; Y[CUC_SW] = wg.sw;
    Y[CUC_PH] = wg.pt; Y[CUC_PW] = wg.pl; Y[CUC_PB] = wg.pb; Y[CUC_PR] = wg.pr;
    Y[CUC_DH] = wg.dh; Y[CUC_DW] = wg.dw; Y[CUC_G] = wg.groups;
    Y[CUC_XS] = b3 ? 0 : x->stride[0];
    for (d = 0; d < 3; d++) Y[CUC_XS + 1 + d] = x->stride[d + (b3 ? 0 : 1)];
    Y[CUC_XO] = rel[0];
    for (d = 0; d < 4; d++) Y[CUC_WS + d] = w->stride[d];
    Y[CUC_WO] = rel[1];
    Y[CUC_HASBIAS] = an->nin > 2 && an->in[2] >= 0;
    if (Y[CUC_HASBIAS]) { Y[CUC_SBIAS] = op[2].m.ndim ? op[2].stride[0] : 0; Y[CUC_OBIAS] = rel[2]; }
    break;
  }
  case OP_MAX_POOL2D: case OP_AVG_POOL2D: case OP_MAX_POOL2D_BACKWARD: {
    int back = an->op == OP_MAX_POOL2D_BACKWARD;
    const fl_tensor *x = &op[back];
    const fl_meta *pm = back ? &op[0].m : om;  /* the pool's output */
    int b3 = x->m.ndim == 3;
    Y[CUP_C] = x->m.shape[b3 ? 0 : 1]; Y[CUP_H] = x->m.shape[b3 ? 1 : 2]; Y[CUP_W] = x->m.shape[b3 ? 2 : 3];
    Y[CUP_OH] = pm->shape[pm->ndim - 2]; Y[CUP_OW] = pm->shape[pm->ndim - 1];
    op_win2d_of(back ? OP_MAX_POOL2D : an->op, &an->attrs, 0, 0, &wg);
    Y[CUP_KH] = wg.kh; Y[CUP_KW] = wg.kw; Y[CUP_SH] = wg.sh; Y[CUP_SW] = wg.sw;
    Y[CUP_PH] = wg.pt; Y[CUP_PW] = wg.pl; Y[CUP_PB] = wg.pb; Y[CUP_PR] = wg.pr;
    Y[CUP_DH] = wg.dh; Y[CUP_DW] = wg.dw; Y[CUP_CIP] = wg.count_include_pad;
    Y[CUP_XS] = b3 ? 0 : x->stride[0];
    for (d = 0; d < 3; d++) Y[CUP_XS + 1 + d] = x->stride[d + (b3 ? 0 : 1)];
    Y[CUP_XO] = rel[back];
    if (back) {
      for (d = 0; d < 4; d++) Y[CUP_GS + d] = op[0].stride[d];
      Y[CUP_GO] = rel[0];
    }
    break;
  }
  case OP_EMBEDDING: {
    const fl_tensor *ix = &op[0], *w = &op[1];
    Y[CUE_V] = w->m.shape[0]; Y[CUE_D] = w->m.shape[1];
    Y[CUE_SWV] = w->stride[0]; Y[CUE_SWD] = w->stride[1]; Y[CUE_OW] = rel[1];
    Y[CUE_ND] = ix->m.ndim;
    for (d = 0; d < ix->m.ndim; d++) { Y[CUE_ISIZE + d] = ix->m.shape[d]; Y[CUE_ISTR + d] = ix->stride[d]; }
    Y[CUE_IO] = rel[0];
    break;
  }
  case OP_PAD: {
    const fl_tensor *x = &op[0];
    memset(Y, 0, CUD_COUNT * sizeof *Y);
    Y[CUD_ND] = om->ndim; Y[CUD_MODE] = an->attrs.i[8]; Y[CUD_XO] = rel[0];
    for (d = 0; d < om->ndim; d++) {
      int64_t b = an->attrs.dims[d], f = an->attrs.i[d];
      Y[CUD_OSIZE + d] = om->shape[d];
      Y[CUD_XSTR + d] = x->stride[d];
      Y[CUD_CROP + d] = b < 0 ? -b : 0;
      Y[CUD_BEFORE + d] = b > 0 ? b : 0;
      Y[CUD_M + d] = x->m.shape[d] - (b < 0 ? -b : 0) - (f < 0 ? -f : 0);
    }
    break;
  }
  case OP_CUMSUM: {
    const fl_tensor *x = &op[0];
    int dim = (int)an->attrs.i[0];
    memset(Y, 0, CUS_COUNT * sizeof *Y);
    Y[CUS_LEN] = x->m.ndim ? x->m.shape[dim] : 1;
    Y[CUS_INNER] = 1;
    for (d = dim + 1; d < x->m.ndim; d++) Y[CUS_INNER] *= x->m.shape[d];
    Y[CUS_LINES] = Y[CUS_LEN] ? X[CUX_TOTAL] / Y[CUS_LEN] : 0;
    Y[CUS_XO] = rel[0]; Y[CUS_EXCL] = an->attrs.i[1] != 0; Y[CUS_REV] = an->attrs.i[2] != 0;
    Y[CUS_ND] = x->m.ndim; Y[CUS_DIM] = dim;
    for (d = 0; d < x->m.ndim; d++) {
      /* the line's start: its coordinate along dim is 0 */
      Y[CUS_SIZE + d] = x->m.shape[d];
      Y[CUS_XSTR + d] = x->stride[d];
    }
    break;
  }
  case OP_FLIP: {
    const fl_tensor *x = &op[0];
    memset(Y, 0, CUF_COUNT * sizeof *Y);
    Y[CUF_ND] = om->ndim; Y[CUF_XO] = rel[0];
    for (d = 0; d < om->ndim; d++) {
      Y[CUF_OSIZE + d] = om->shape[d];
      Y[CUF_XSTR + d] = x->stride[d];
    }
    for (i = 0; i < an->attrs.ndims; i++) {
      int fd = (int)an->attrs.dims[i];
      if (x->m.shape[fd] > 0) Y[CUF_XO] += (x->m.shape[fd] - 1) * x->stride[fd];
      Y[CUF_XSTR + fd] = -x->stride[fd];
    }
    break;
  }
  case OP_INDEX_ADD: {
    const fl_tensor *s = &op[0], *ix = &op[1];
    Y[CUI_A] = s->m.shape[0]; Y[CUI_I] = s->m.shape[1]; Y[CUI_R] = s->m.shape[2];
    Y[CUI_N] = an->attrs.i[0];
    for (d = 0; d < 3; d++) Y[CUI_SS + d] = s->stride[d];
    Y[CUI_SO] = rel[0];
    Y[CUI_IS] = ix->stride[0];
    Y[CUI_IO] = rel[1];
    break;
  }
  case OP_GATHER: {
    const fl_tensor *x = &op[0], *ix = &op[1];
    int dim = (int)an->attrs.i[0], ni = ix->m.ndim, j = 0;
    memset(Y, 0, CUG_COUNT * sizeof *Y);
    Y[CUG_ND] = om->ndim; Y[CUG_XO] = rel[0]; Y[CUG_IO] = rel[1];
    Y[CUG_SIZE] = x->m.shape[dim]; Y[CUG_XDSTR] = x->stride[dim];
    for (d = 0; d < om->ndim; d++) Y[CUG_OSIZE + d] = om->shape[d];
    for (d = 0; d < dim; d++, j++) Y[CUG_XSTR + j] = x->stride[d];
    for (d = 0; d < ni; d++, j++) Y[CUG_ISTR + j] = ix->stride[d];
    for (d = dim + 1; d < x->m.ndim; d++, j++) Y[CUG_XSTR + j] = x->stride[d];
    break;
  }
  case OP_MATMUL_INT8: {
    const fl_tensor *A = &op[0], *B = &op[1];
    int nd = om->ndim, nb = nd - 2;
    memset(Y, 0, CUQ_COUNT * sizeof *Y);
    Y[CUQ_ND] = nd; Y[CUQ_K] = A->m.shape[nd - 1];
    Y[CUQ_AO] = rel[0]; Y[CUQ_BO] = rel[1];
    Y[CUQ_AU] = an->attrs.i[0] != 0; Y[CUQ_BU] = an->attrs.i[1] != 0;
    for (d = 0; d < nd; d++) {
      Y[CUQ_OSIZE + d] = om->shape[d];
      Y[CUQ_ASTR + d] = A->stride[d];
    }
    /* a 2-d B is the same for every batch: its batch strides stay 0 */
    for (d = 0; d < 2; d++) Y[CUQ_BSTR + nb + d] = B->stride[B->m.ndim - 2 + d];
    if (B->m.ndim == nd)
      for (d = 0; d < nb; d++) Y[CUQ_BSTR + d] = B->stride[d];
    for (i = 2; i < 4 && i < nop; i++)
      if (an->in[i] >= 0) {
        Y[CUQ_HASZA + i - 2] = 1;
        Y[CUQ_ZAO + i - 2] = rel[i];
        Y[CUQ_ZAS + i - 2] = meta_numel(&op[i].m) == 1 ? 0 : op[i].stride[0];
      }
    break;
  }
  case OP_RNN: {
    /* X [T, B, I], R [D, G*H, H]; each input's strides and offset */
    memset(Y, 0, CUR_COUNT * sizeof *Y);
    Y[CUR_T] = op[0].m.shape[0]; Y[CUR_B] = op[0].m.shape[1]; Y[CUR_I] = op[0].m.shape[2];
    Y[CUR_H] = op[2].m.shape[2];
    if (Y[CUR_H] > CUDA_RNN_HMAX) {
      rc = err_set(e, FL_EUNSUPPORTED, "%s: rnn's hidden size %lld is beyond the CUDA kernel's %d",
                   k->name, (long long)Y[CUR_H], CUDA_RNN_HMAX);
      break;
    }
    for (i = 0; i < nop && i < 8; i++) {
      int64_t *I = Y + CUR_OPS + i * CUR_PER;
      if (an->in[i] < 0) continue;
      for (d = 0; d < op[i].m.ndim && d < 3; d++) I[d] = op[i].stride[d];
      I[3] = rel[i];
    }
    break;
  }
  case OP_CAT: {
    int dim = (int)an->attrs.i[0];
    Y[CUT_ND] = om->ndim; Y[CUT_DIM] = dim;
    for (d = 0; d < om->ndim; d++) Y[CUT_OSIZE + d] = om->shape[d];
    for (i = 0; i < nop; i++) {
      int64_t *I = Y + CUT_IN + i * CUT_PER;
      const fl_tensor *t = &op[i];
      if (an->in[i] < 0 || t->m.ndim != om->ndim) continue;   /* an empty 1-d input: extent 0 */
      I[0] = t->m.shape[dim];
      I[1] = rel[i];
      for (d = 0; d < t->m.ndim; d++) I[2 + d] = t->stride[d];
    }
    break;
  }
  default:
    rc = err_set(e, FL_EUNSUPPORTED, "%s: %s has no CUDA lowering yet", k->name, op_name(an->op));
  }
done:
  for (i = 0; i < CUDA_CAT_MAX; i++) ten_release(&op[i]);
  return rc;
}

/* Is the epilogue's space the anchor's output, read element for element? */
static int epilogue_fits(const fk_kernel *k, const int64_t *args, int64_t total) {
  int D = k->nkept + k->nred, a, d;
  int64_t cs[FL_MAX_DIMS], n = 1;
  for (d = D - 1; d >= 0; d--) { cs[d] = n; n *= args[d]; }
  if (n != total) return 0;
  for (a = 0; a < k->nacc; a++) {
    const int64_t *st = args + D + a * (D + 1);
    if (k->acc[a].node != k->anchor || k->acc[a].store) continue;
    if (st[D] != 0) return 0;
    for (d = 0; d < D; d++)
      if (args[d] > 1 && st[d] != cs[d]) return 0;
  }
  return 1;
}

/* Whether a value the epilogue stores shares memory with an operand of
** the call.  The plan frees an operand only the call reads before the
** epilogue's stores (fuse/memplan.c), so one may take its slot, or a
** write-back its leaf: fused into the product, the epilogue would write it
** while other blocks still read it.  Run apart, after the product, it
** may. */
static int epilogue_overwrites_operand(const run_ctx *c, const fk_kernel *k) {
  int a, j, nin = c->g->nodes[k->anchor].nin;
  for (j = 0; j < nin; j++) {
    int b = cuda_operand_slot(c->pr->plan, k, j);
    const fl_tensor *op;
    if (b < 0) continue;
    op = &c->vals[k->bufs[b]];
    for (a = 0; a < k->nacc; a++) {
      const fl_tensor *v = &c->vals[k->acc[a].node];
      if (k->acc[a].store && k->acc[a].node != k->anchor && v->st && v->st == op->st) return 1;
    }
  }
  return 0;
}

static unsigned cap_grid(int64_t want) {
  int64_t cap = (int64_t)(cuda_sm_count() > 0 ? cuda_sm_count() : 80) * 32;
  if (want < 1) want = 1;
  return (unsigned)(want < cap ? want : cap);
}

/* The parameter block is the buffer addresses (already in c->block) then
** the int64 arguments: fl_params<NB, NA>'s layout. */
static int launch(run_ctx *c, void *fn, const cuda_kinfo *in, const unsigned grid[3],
                  unsigned block, fl_err *e) {
  memcpy(c->block + in->nbuf, c->args, (size_t)in->narg * sizeof(int64_t));
  return cuda_launch(fn, grid, block, c->block, (size_t)(in->nbuf + in->narg) * 8, e);
}

/* Extern kernel k's product (matmul, linear without bias; float32, at
** most one batch dim) on cuBLAS, into the anchor's buffer.  X holds the
** slots extern_args filled.  FL_EUNSUPPORTED: not a product cuBLAS can do
** here, the caller launches the generated kernel. */
static int cublas_step(run_ctx *c, const fk_kernel *k, const int64_t *X, fl_err *e) {
  const ir_graph *g = c->g;
  const ir_node *an = &g->nodes[k->anchor];
  const int64_t *Y = X + CUX_OP;
  int sa, sb;
  cublas_operand A, B;
  if ((an->op != OP_MATMUL && an->op != OP_LINEAR) || Y[CUM_HASBIAS] || Y[CUM_NBD] > 1 ||
      c->metas[k->anchor].dtype != FL_F32 || g->nodes[an->in[0]].meta.dtype != FL_F32 ||
      g->nodes[an->in[1]].meta.dtype != FL_F32)
    return err_set(e, FL_EUNSUPPORTED, "%s: not a product cuBLAS runs here", k->name);
  sa = cuda_operand_slot(c->pr->plan, k, 0);
  sb = cuda_operand_slot(c->pr->plan, k, 1);
  if (sa < 0 || sb < 0) return err_set(e, FL_EUNSUPPORTED, "%s: operand without a buffer", k->name);
  A.p = (const float *)(uintptr_t)c->block[sa] + Y[CUM_OA];
  A.srow = Y[CUM_SAM]; A.scol = Y[CUM_SAK]; A.sbatch = Y[CUM_NBD] ? Y[CUM_BSA] : 0;
  B.p = (const float *)(uintptr_t)c->block[sb] + Y[CUM_OB];
  B.srow = Y[CUM_SBK]; B.scol = Y[CUM_SBN]; B.sbatch = Y[CUM_NBD] ? Y[CUM_BSB] : 0;
  return cublas_matmul(Y[CUM_B], Y[CUM_M], Y[CUM_N], Y[CUM_K], A, B,
                       (float *)ten_data(&c->vals[k->anchor]), e);
}

static int run_kernel(run_ctx *c, int ki, fl_err *e) {
  exec_program *pr = c->pr;
  cuda_state *cs = c->cs;
  const ir_graph *g = c->g;
  const fk_kernel *k = &pr->plan->kernels[ki];
  const cuda_kinfo *in = EXEC_KINFO(pr, ki);
  int i, rc, D = k->nkept + k->nred, ea = fk_nargs(k);
  unsigned grid[3] = {1, 1, 1}, bs = (unsigned)(cs->block[ki] ? cs->block[ki] : 256);
  int64_t work = 1;
  if (!in->emitted) return FL_OK;
  if (!pr->fns[ki]) return err_set(e, FL_EUNSUPPORTED, "%s: no generated code", k->name);
  /* what the kernel writes */
  for (i = 0; i < k->nacc; i++) {
    int id = k->acc[i].node;
    if (!k->acc[i].store || c->vals[id].st) continue;
    if ((rc = exec_buffer(c->r, id, &c->vals[id], e)) != FL_OK) return rc;
  }
  if (k->kind == FK_EXTERN && !c->vals[k->anchor].st && (rc = exec_buffer(c->r, k->anchor, &c->vals[k->anchor], e)) != FL_OK)
    return rc;
  /* what it reads: buffers (views made contiguous; an extern's operands
  ** keep their own base buffers and strides) */
  for (i = 0; i < k->nbufs; i++) {
    int id = k->bufs[i];
    if ((rc = exec_value(c->r, id, 1, e)) != FL_OK) return rc;
    c->block[i] = (uint64_t)(uintptr_t)ten_data(&c->vals[id]);
  }
  if (k->kind == FK_EXTERN) {
    int64_t *X = c->args + ea, total;
    const ir_node *an = &g->nodes[k->anchor];
    if ((rc = extern_args(c, k, X, e)) != FL_OK) return rc;
    total = X[CUX_TOTAL];
    X[CUX_FUSE] = k->nnodes > 0 && epilogue_fits(k, c->args, total) && !epilogue_overwrites_operand(c, k);
    X[CUX_KEEP] = k->nnodes == 0 || pr->plan->last_use[k->anchor] != ki || !X[CUX_FUSE];
    if (total == 0) return FL_OK;
    /* max-autotune's pick: the product on cuBLAS into the anchor's buffer,
    ** then the epilogue kernel; a layout cuBLAS cannot take keeps ours */
    if (cs->cublas && cs->cublas[ki]) {
      if ((rc = cublas_step(c, k, X, e)) == FL_OK) {
        X[CUX_FUSE] = 0;
        goto epilogue;
      }
      if (rc != FL_EUNSUPPORTED) return rc;
      err_clear(e);
    }
    if (X[CUX_FUSE]) cs->fused_epilogues++;
    if (an->op == OP_MATMUL || an->op == OP_LINEAR) {
      const int64_t *Y = X + CUX_OP;
      int64_t tn = (Y[CUM_N] + 63) / 64, tm = (Y[CUM_M] + 63) / 64, nb = Y[CUM_B];
      grid[0] = (unsigned)(tn < 65535 ? tn : 65535);
      grid[1] = (unsigned)(tm < 65535 ? tm : 65535);
      grid[2] = (unsigned)(nb < 65535 ? nb : 65535);
      bs = 256;   /* the matmul templates assume 256 threads */
    } else if (an->op == OP_RNN) {
      /* a block per (direction, batch row): rnn's output is [S+T, D, B, H] */
      const fl_meta *om = &c->metas[k->anchor];
      grid[0] = cap_grid(om->shape[1] * om->shape[2]);
      bs = 256;
    } else {
      grid[0] = cap_grid((total + 255) / 256);
      bs = 256;
    }
    if ((rc = launch(c, pr->fns[ki], in, grid, bs, e)) != FL_OK) return rc;
  epilogue:
    if (k->nnodes == 0 || X[CUX_FUSE]) return FL_OK;
    /* the epilogue on its own, reading the anchor's buffer */
    for (i = 0; i < D - 1; i++) work *= c->args[i];
    work *= D ? c->args[D - 1] : 1;
    grid[0] = cap_grid((work + 255) / 256);
    grid[1] = grid[2] = 1;
    return launch(c, cs->epis[ki], in, grid, 256, e);
  }
  if (k->kind == FK_REDUCE) {
    int64_t rows = 1, nr = 1;
    for (i = 0; i < k->nkept; i++) rows *= c->args[i];
    for (i = k->nkept; i < D; i++) nr *= c->args[i];
    if (rows == 0) return FL_OK;
    /* threads: the row's length rounded up to warps, at most the chosen */
    {
      unsigned t = 32;
      while ((int64_t)t < nr && t < bs) t *= 2;
      bs = t;
    }
    grid[0] = (unsigned)(rows < (1 << 24) ? rows : (1 << 24));
    return launch(c, pr->fns[ki], in, grid, bs, e);
  }
  for (i = 0; i < D; i++) work *= c->args[i];
  if (work == 0) return FL_OK;
  grid[0] = cap_grid((in->vec ? (work + 3) / 4 : work) / bs + 1);
  return launch(c, pr->fns[ki], in, grid, bs, e);
}

/* Device values of params and consts: consts uploaded once, params every
** run (they are bound by reference: in-place changes must be seen), into
** the same device buffers, so a captured graph sees them too. */
static int launch_kernel(exec_run *r, int ki, fl_err *e) {
  run_ctx c;
  cuda_state *cs = cuda_state_of(r->pr);
  size_t need;
  if (!cs) return err_set(e, FL_ENOMEM, "run: out of memory");
  /* buffer addresses, then the int64 arguments (fl_params) */
  need = (size_t)cs->maxbuf + (size_t)r->pr->maxargs;
  if (cs->npblock < need) {
    free(cs->pblock);
    if (!(cs->pblock = calloc(need, sizeof *cs->pblock))) {
      cs->npblock = 0;
      return err_set(e, FL_ENOMEM, "run: out of memory");
    }
    cs->npblock = need;
  }
  c.r = r;
  c.pr = r->pr;
  c.cs = cs;
  c.g = r->g;
  c.metas = r->metas;
  c.vals = r->vals;
  c.args = r->args;
  c.block = cs->pblock;
  return run_kernel(&c, ki, e);
}

const exec_backend cuda_backend = {
  "cuda", FL_DEV_CUDA, sizeof(cuda_kinfo),
  preamble, render,
  compile, image_retain, image_release,
  load, to_device, copy_into, launch_kernel, wait_stream, nargs, free_priv, NULL, NULL, cuda_program_run, NULL
};

/* --- CUDA graphs ("reduce-overhead") ---------------------------------------------- */

static void drop_graph(exec_program *pr) {
  cuda_state *cs = pr->priv;
  const ir_graph *g = pr->plan->g;
  int i;
  if (!cs) return;
  cuda_graph_free(cs->graph);
  cs->graph = NULL;
  if (cs->gin) for (i = 0; i < g->ninputs; i++) ten_release(&cs->gin[i]);
  if (cs->gout) for (i = 0; i < g->nout; i++) ten_release(&cs->gout[i]);
  if (cs->ghold) for (i = 0; i < g->n; i++) ten_release(&cs->ghold[i]);
  free(cs->gin); free(cs->gout); free(cs->ghold);
  cs->gin = cs->gout = cs->ghold = NULL;
}

/* Capture the program for these inputs' shapes: static input buffers, one
** plain run (it allocates everything), then the captured run, which holds
** every buffer its launches address until the graph goes. */
static int capture(exec_program *pr, cuda_state *cs, const fl_tensor *const *inputs, int n,
                   fl_err *e) {
  const ir_graph *g = pr->plan->g;
  const fl_tensor *gi[256];
  fl_tensor *warm;
  int i, rc = FL_OK, r2;
  drop_graph(pr);
  if (n > 256) return err_set(e, FL_EUNSUPPORTED, "run: too many inputs for a CUDA graph");
  cs->gin = calloc((size_t)(n ? n : 1), sizeof *cs->gin);
  cs->gout = calloc((size_t)(g->nout ? g->nout : 1), sizeof *cs->gout);
  cs->ghold = calloc((size_t)(g->n ? g->n : 1), sizeof *cs->ghold);
  warm = calloc((size_t)(g->nout ? g->nout : 1), sizeof *warm);
  if (!cs->gin || !cs->gout || !cs->ghold || !warm) {
    free(warm);
    drop_graph(pr);
    return err_set(e, FL_ENOMEM, "run: out of memory");
  }
  for (i = 0; i < n && rc == FL_OK; i++) {
    rc = to_device(&cs->gin[i], inputs[i], e);
    gi[i] = &cs->gin[i];
  }
  if (rc == FL_OK) rc = exec_program_run_flags(pr, gi, n, warm, 0, NULL, e);
  for (i = 0; i < g->nout && rc == FL_OK; i++) {
    fl_meta m = warm[i].m;
    m.device = FL_DEV_CUDA;
    rc = ten_empty(&cs->gout[i], &m, e);
  }
  for (i = 0; i < g->nout; i++) ten_release(&warm[i]);
  free(warm);
  if (rc == FL_OK && (rc = cuda_sync(e)) == FL_OK && (rc = cuda_capture_begin(e)) == FL_OK) {
    rc = exec_program_run_flags(pr, gi, n, cs->gout, EXEC_INTO | EXEC_CAPTURE, cs->ghold, e);
    r2 = cuda_capture_end(&cs->graph, e);
    if (rc == FL_OK) rc = r2;
  }
  if (rc != FL_OK) drop_graph(pr);
  return rc;
}

static int same_shapes(const cuda_state *cs, const fl_tensor *const *inputs, int n) {
  int i;
  if (!cs->graph) return 0;
  for (i = 0; i < n; i++)
    if (!meta_same_shape(&cs->gin[i].m, &inputs[i]->m) || cs->gin[i].m.dtype != inputs[i]->m.dtype)
      return 0;
  return 1;
}

static int run_graph(exec_program *pr, cuda_state *cs, const fl_tensor *const *inputs, int n,
                     fl_tensor *outs, fl_err *e) {
  const ir_graph *g = pr->plan->g;
  int i, rc;
  if (n != g->ninputs) return err_set(e, FL_EINVAL, "run: expected %d input(s), got %d", g->ninputs, n);
  if (!same_shapes(cs, inputs, n) && (rc = capture(pr, cs, inputs, n, e)) != FL_OK) return rc;
  /* inputs into the graph's static buffers (a device input is copied on
  ** the device), weights rebound (none copied once resident), replay */
  for (i = 0; i < n; i++) {
    fl_tensor t;
    if (inputs[i]->m.device == FL_DEV_CUDA) rc = cuda_contiguous(&t, inputs[i], e);
    else rc = ten_contiguous(&t, inputs[i], e);
    if (rc == FL_OK) rc = cuda_copy_into(&cs->gin[i], &t, e);
    ten_release(&t);
    if (rc != FL_OK) return rc;
  }
  if ((rc = exec_bind_leaves(pr, e)) != FL_OK) return rc;
  if ((rc = cuda_graph_replay(cs->graph, e)) != FL_OK) return rc;
  /* results are fresh tensors: the static outputs are rewritten next call */
  for (i = 0; i < g->nout && rc == FL_OK; i++) rc = cuda_copy_to(&outs[i], &cs->gout[i], FL_DEV_CUDA, e);
  if (rc != FL_OK) for (i = 0; i < g->nout; i++) ten_release(&outs[i]);
  if (rc == FL_OK) { pr->runs++; cs->replays++; }
  return rc;
}

static int has_random(const ir_graph *g) {
  int i;
  for (i = 0; i < g->n; i++)
    if (g->nodes[i].kind == IR_OP && rng_op(g->nodes[i].op)) return 1;
  return 0;
}

int cuda_program_run(exec_program *pr, const fl_tensor *const *inputs, int ninputs,
                     fl_tensor *outs, fl_err *e) {
  cuda_state *cs;
  int rc;
  if ((rc = cuda_rt_init(e)) != FL_OK) return rc;
  if (!(cs = cuda_state_of(pr))) return err_set(e, FL_ENOMEM, "run: out of memory");
  /* a replayed CUDA graph would repeat its captured draws: a program with
  ** random nodes launches its kernels one by one, each run drawing anew */
  if (cs->mode == CUDA_MODE_GRAPH && !has_random(pr->plan->g))
    return run_graph(pr, cs, inputs, ninputs, outs, e);
  return exec_program_run_flags(pr, inputs, ninputs, outs, 0, NULL, e);
}

int cuda_program_set_mode(exec_program *pr, int mode) {
  cuda_state *cs = cuda_state_of(pr);
  if (!cs) return FL_ENOMEM;
  if (cs->mode != mode) drop_graph(pr);
  cs->mode = mode;
  return FL_OK;
}

/* --- max-autotune ------------------------------------------------------------------ */

/* Best of 3 timed runs after a warm-up, in ms. */
static int time_runs(exec_program *pr, const fl_tensor *const *inputs, int ninputs,
                     fl_tensor *outs, double *best, fl_err *e) {
  const ir_graph *g = pr->plan->g;
  int r, i, rc;
  *best = 1e30;
  for (r = 0; r < 4; r++) {
    double ms;
    if ((rc = cuda_timer_start(e)) != FL_OK) return rc;
    rc = exec_program_run_flags(pr, inputs, ninputs, outs, 0, NULL, e);
    for (i = 0; i < g->nout; i++) ten_release(&outs[i]);
    if (rc != FL_OK) return rc;
    if ((rc = cuda_timer_stop(&ms, e)) != FL_OK) return rc;
    if (r > 0 && ms < *best) *best = ms;
  }
  return FL_OK;
}

/* The products on cuBLAS (then their epilogue kernels) against ours,
** timed on the inputs: the faster is kept, and said in note. */
static int tune_cublas(exec_program *pr, cuda_state *cs, const fl_tensor *const *inputs,
                       int ninputs, fl_tensor *outs, double ours, char *note, size_t n, fl_err *e) {
  double theirs;
  int k, any = 0, rc;
  fl_err why;
  for (k = 0; k < pr->plan->nkernels; k++) {
    const ir_node *an = &pr->plan->g->nodes[pr->plan->kernels[k].anchor];
    any |= pr->plan->kernels[k].kind == FK_EXTERN && (an->op == OP_MATMUL || an->op == OP_LINEAR);
  }
  if (!any) return FL_OK;
  err_clear(&why);
  if (!cublas_ready(&why)) {
    snprintf(note, n, "; products: ours (%s)", why.msg);
    return FL_OK;
  }
  free(cs->cublas);
  if (!(cs->cublas = malloc((size_t)pr->plan->nkernels))) return err_set(e, FL_ENOMEM, "autotune: out of memory");
  memset(cs->cublas, 1, (size_t)pr->plan->nkernels);
  if ((rc = time_runs(pr, inputs, ninputs, outs, &theirs, e)) != FL_OK) {
    free(cs->cublas);
    cs->cublas = NULL;
    return rc;
  }
  snprintf(note, n, "; products: ours %.4f ms, cuBLAS %.4f ms -> %s", ours, theirs,
           theirs < ours ? "cuBLAS" : "ours");
  if (theirs >= ours) {
    free(cs->cublas);
    cs->cublas = NULL;
  }
  return FL_OK;
}

int cuda_program_autotune(exec_program *pr, const fl_tensor *const *inputs, int ninputs, fl_err *e) {
  static const int choices[] = {128, 256, 512};
  const ir_graph *g = pr->plan->g;
  cuda_state *cs = cuda_state_of(pr);
  double best = 1e30, t[3];
  int c, k, rc, n, pick = 1, mode;
  fl_tensor *outs = calloc((size_t)(g->nout ? g->nout : 1), sizeof *outs);
  if (!outs || !cs) { free(outs); return err_set(e, FL_ENOMEM, "autotune: out of memory"); }
  mode = cs->mode;
  cs->mode = CUDA_MODE_DEFAULT;
  drop_graph(pr);              /* a captured graph has the old choices baked in */
  free(cs->cublas);            /* and an earlier pick must not skew the timings */
  cs->cublas = NULL;
  for (c = 0; c < 3; c++) {
    for (k = 0; k < pr->plan->nkernels; k++)
      if (pr->plan->kernels[k].kind != FK_EXTERN) cs->block[k] = choices[c];
    if ((rc = time_runs(pr, inputs, ninputs, outs, &t[c], e)) != FL_OK) goto fail;
    if (t[c] < best) { best = t[c]; pick = c; }
  }
  for (k = 0; k < pr->plan->nkernels; k++)
    if (pr->plan->kernels[k].kind != FK_EXTERN) cs->block[k] = choices[pick];
  n = snprintf(cs->tune, sizeof cs->tune, "threads per block: 128 %.4f ms, 256 %.4f ms, 512 %.4f ms -> %d",
               t[0], t[1], t[2], choices[pick]);
  rc = tune_cublas(pr, cs, inputs, ninputs, outs, best, cs->tune + n, sizeof cs->tune - (size_t)n, e);
fail:
  cs->mode = mode;
  free(outs);
  return rc;
}
