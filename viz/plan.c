/*
** plan.c -- a fusion plan seen by the pictures and the report.  Numbers
** shown for a plan are always the plan's own (its stats, its buffers), so
** a picture, a report and p:stats() never disagree.
*/
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "viz/plan.h"
#include "viz/style.h"

static const char *kind_name(fk_kind k) {
  switch (k) {
  case FK_POINTWISE: return "pointwise";
  case FK_REDUCE: return "reduce";
  case FK_EXTERN: return "extern";
  }
  return "?";
}


/* owner[i]: the kernel computing node i; for a view no kernel computes,
** the one kernel every reader of it belongs to (-1 when readers differ or
** it is returned), so a view folded into one kernel is drawn inside it.
** Consumers have larger ids, so one backward pass settles every view. */
static void owners(const fuse_plan *p, int *owner, int *common) {
  const ir_graph *g = p->g;
  int i, k;
  for (i = 0; i < g->n; i++) common[i] = -2;  /* -2: no reader seen yet */
  for (i = 0; i < g->nout; i++) common[g->outputs[i]] = -1;
  for (i = g->n - 1; i >= 0; i--) {
    const ir_node *nd = &g->nodes[i];
    owner[i] = p->kernel_of[i];
    if (nd->kind != IR_OP) continue;
    if (owner[i] < 0 && fk_is_view(g, i)) owner[i] = common[i] >= 0 ? common[i] : -1;
    for (k = 0; k < nd->nin; k++) {
      int j = nd->in[k];
      if (j < 0) continue;
      common[j] = common[j] == -2 || common[j] == owner[i] ? owner[i] : -1;
    }
  }
}

int viz_plan_stage_init(viz_plan_stage *ps, const fuse_plan *p,
                        const double *times_ms, fl_err *e) {
  const ir_graph *g;
  int *owner = NULL, *common = NULL, i, k, at = 0;
  memset(ps, 0, sizeof *ps);
  if (!p || !p->g) return err_set(e, FL_EINVAL, "draw: no plan given");
  g = p->g;
  ps->kernels = calloc((size_t)(p->nkernels ? p->nkernels : 1), sizeof *ps->kernels);
  ps->ids = malloc((size_t)(g->n ? g->n : 1) * sizeof *ps->ids);
  owner = malloc((size_t)(g->n ? g->n : 1) * sizeof *owner);
  common = malloc((size_t)(g->n ? g->n : 1) * sizeof *common);
  if (!ps->kernels || !ps->ids || !owner || !common) {
    free(owner);
    free(common);
    viz_plan_stage_free(ps);
    return err_set(e, FL_ENOMEM, "draw: out of memory");
  }
  owners(p, owner, common);
  for (k = 0; k < p->nkernels; k++) {
    ps->kernels[k].nodes = ps->ids + at;
    for (i = 0; i < g->n; i++)
      if (p->kernel_of[i] == k) ps->ids[at++] = i;
    ps->kernels[k].nnodes = (int)(ps->ids + at - ps->kernels[k].nodes);
  }
  for (k = 0; k < p->nkernels; k++) {
    ps->kernels[k].views = ps->ids + at;
    for (i = 0; i < g->n; i++)
      if (p->kernel_of[i] < 0 && owner[i] == k) ps->ids[at++] = i;
    ps->kernels[k].nviews = (int)(ps->ids + at - ps->kernels[k].views);
  }
  free(owner);
  free(common);
  for (k = 0; k < p->nkernels; k++) {
    const fk_kernel *fk = &p->kernels[k];
    viz_kernel *vk = &ps->kernels[k];
    vk->name = fk->name;
    fuse_kernel_traffic(p->g, fk, &vk->bytes_read, &vk->bytes_written);
    if ((vk->in_place = fuse_cat_in_place(p, k)) != 0) vk->bytes_read = vk->bytes_written = 0;
    vk->time_ms = times_ms ? times_ms[k] : -1;
  }
  ps->st.g = g;
  ps->st.kernels = ps->kernels;
  ps->st.nkernels = p->nkernels;
  ps->st.label = p->opts.fuse ? "after fusion" : "unfused plan";
  ps->st.stored = p->stored;
  ps->st.has_stats = 1;
  ps->st.stat_kernels = p->stats.kernels;
  ps->st.stat_buffers = p->stats.buffers_after;
  ps->st.stat_bytes = p->stats.bytes_after;
  ps->st.note = p->stats.note[0] ? p->stats.note : NULL;
  return FL_OK;
}

void viz_plan_stage_free(viz_plan_stage *ps) {
  free(ps->kernels);
  free(ps->ids);
  memset(ps, 0, sizeof *ps);
}

/* The plan's graph drawn one op per kernel, with the numbers of its
** "before": the captured graph run op by op (the plan's stats). */
void viz_plan_baseline(viz_stage *st, const fuse_plan *p) {
  memset(st, 0, sizeof *st);
  st->g = p->g;
  st->label = "before fusion";
  st->has_stats = 1;
  st->stat_kernels = p->stats.kernels_before;
  st->stat_buffers = p->stats.buffers_before;
  st->stat_bytes = p->stats.bytes_before;
}

int viz_draw_plan(const fuse_plan *p, const char *path, const viz_opts *o, fl_err *e) {
  viz_plan_stage ps;
  int rc = viz_plan_stage_init(&ps, p, NULL, e);
  if (rc) return rc;
  rc = viz_draw_stage(&ps.st, path, o, e);
  viz_plan_stage_free(&ps);
  return rc;
}

int viz_draw_plan_compare(const fuse_plan *p, const char *path,
                          const viz_opts *o, fl_err *e) {
  viz_plan_stage ps;
  viz_stage before;
  int rc = viz_plan_stage_init(&ps, p, NULL, e);
  if (rc) return rc;
  viz_plan_baseline(&before, p);
  rc = viz_draw_compare(&before, &ps.st, path, o, e);
  viz_plan_stage_free(&ps);
  return rc;
}

/* "%3 sum over dim 1" */
static void describe(const ir_graph *g, int id, char *buf, size_t n) {
  char d[80];
  if (id < 0 || id >= g->n) {
    snprintf(buf, n, "?");
    return;
  }
  fk_describe(g, id, d, sizeof d);
  snprintf(buf, n, "%%%d %s", id, d);
}

static void arrow(char *buf, size_t n, const char *a, const char *b) {
  snprintf(buf, n, "%s \xe2\x86\x92 %s", a, b);
}

int viz_plan_report_fill(viz_report *r, viz_plan_report *pr, const fuse_plan *p,
                         const double *times_ms, const viz_stage *layouts, const viz_opts *o,
                         fl_err *e) {
  const fuse_stats *s;
  char a[32], b[32];
  int i, k, rc, kb, bb;
  int64_t mb;
  memset(pr, 0, sizeof *pr);
  rc = viz_plan_stage_init(&pr->after, p, times_ms, e);
  if (rc) return rc;
  if (layouts && layouts->layout && layouts->g == p->g) {   /* a program's blocked values */
    pr->after.st.layout = layouts->layout;
    for (k = 0; k < p->nkernels; k++) pr->after.kernels[k].layout = layouts->kernels[k].layout;
  }
  s = &p->stats;
  viz_plan_baseline(&pr->before, p);
  pr->rows = calloc((size_t)(p->nkernels ? p->nkernels : 1), sizeof *pr->rows);
  pr->dec = calloc((size_t)(p->ndec ? p->ndec : 1), sizeof *pr->dec);
  pr->names = calloc((size_t)(p->ndec ? 2 * p->ndec : 1), sizeof *pr->names);
  if (!pr->rows || !pr->dec || !pr->names) {
    viz_plan_report_free(pr);
    return err_set(e, FL_ENOMEM, "report: out of memory");
  }
  for (k = 0; k < p->nkernels; k++) {
    const viz_kernel *vk = &pr->after.kernels[k];
    pr->rows[k].name = vk->name;
    pr->rows[k].kind = kind_name(p->kernels[k].kind);
    pr->rows[k].nodes = vk->nnodes;
    pr->rows[k].bytes_read = vk->bytes_read;
    pr->rows[k].bytes_written = vk->bytes_written;
    pr->rows[k].time_ms = vk->time_ms;
    pr->rows[k].launch_ms = times_ms && times_ms[p->nkernels + k] > 0 ? times_ms[p->nkernels + k] : 0;
    pr->rows[k].flops = fuse_kernel_flops(p->g, &p->kernels[k]);
  }
  for (i = 0; i < p->ndec; i++) {
    const fuse_decision *d = &p->dec[i];
    describe(p->g, d->a, pr->names[2 * i], sizeof pr->names[0]);
    describe(p->g, d->b, pr->names[2 * i + 1], sizeof pr->names[0]);
    pr->dec[i].a = pr->names[2 * i];
    pr->dec[i].b = pr->names[2 * i + 1];
    pr->dec[i].fused = d->fused;
    pr->dec[i].reason = d->reason;
    pr->dec[i].bytes_saved = d->bytes_saved;
  }
  viz_stage_numbers(&pr->before, &kb, &bb, &mb);
  snprintf(pr->values[0], sizeof pr->values[0], "%d \xe2\x86\x92 %d", kb, s->kernels);
  snprintf(pr->values[1], sizeof pr->values[1], "%d \xe2\x86\x92 %d", s->buffers_before, s->buffers_after);
  arrow(pr->values[2], sizeof pr->values[2], viz_bytes_str(s->bytes_before, a, sizeof a),
        viz_bytes_str(s->bytes_after, b, sizeof b));
  arrow(pr->values[3], sizeof pr->values[3], viz_bytes_str(s->peak_bytes_before, a, sizeof a),
        viz_bytes_str(s->peak_bytes_after, b, sizeof b));
  snprintf(pr->values[4], sizeof pr->values[4], "%d", s->nodes);
  {
    int fused = 0;
    for (i = 0; i < p->ndec; i++) fused += p->dec[i].fused != 0;
    snprintf(pr->values[5], sizeof pr->values[5], "%d of %d", fused, p->ndec);
  }
  pr->summary[0].key = "kernels";
  pr->summary[1].key = "buffers";
  pr->summary[2].key = "bytes moved";
  pr->summary[3].key = "peak memory";
  pr->summary[4].key = "ops";
  pr->summary[5].key = "pairs fused";
  /* the decisions' "saves" sum to the bytes line, or this row says why not */
  pr->summary[6].key = "bytes saved, by cause";
  fuse_bytes_causes(s, pr->values[6], sizeof pr->values[6]);
  for (i = 0; i < 7; i++) pr->summary[i].value = pr->values[i];
  snprintf(pr->before_label, sizeof pr->before_label,
           "before fusion: %d kernels \xc2\xb7 %d buffers \xc2\xb7 %s moved", kb, bb,
           viz_bytes_str(mb, a, sizeof a));
  snprintf(pr->after_label, sizeof pr->after_label,
           "after fusion: %d kernels \xc2\xb7 %d buffers \xc2\xb7 %s moved", s->kernels,
           s->buffers_after, viz_bytes_str(s->bytes_after, b, sizeof b));
  rc = viz_stage_svg(&pr->before, o, &pr->before_svg, e);
  if (rc == FL_OK) rc = viz_stage_svg(&pr->after.st, o, &pr->after_svg, e);
  if (rc) {
    viz_plan_report_free(pr);
    return rc;
  }
  r->summary = pr->summary;
  r->nsummary = pr->values[6][0] ? 7 : 6;
  r->before_svg = pr->before_svg;
  r->before_label = pr->before_label;
  r->after_svg = pr->after_svg;
  r->after_label = pr->after_label;
  r->kernels = pr->rows;
  r->nkernels = p->nkernels;
  r->decisions = pr->dec;
  r->ndecisions = p->ndec;
  return FL_OK;
}

void viz_plan_report_free(viz_plan_report *pr) {
  viz_plan_stage_free(&pr->after);
  free(pr->rows);
  free(pr->dec);
  free(pr->names);
  free(pr->before_svg);
  free(pr->after_svg);
  memset(pr, 0, sizeof *pr);
}
