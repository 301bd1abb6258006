/*
** lfl_report.c -- the review report from Lua:
**   fl.report(cm_or_plan, "review.html", opts)
** One self-contained HTML file (viz/report.h) filled from what Lua knows:
** for a Plan (or a Program, or a Graph planned here) its graphs before and
** after fusion, kernels, decisions, generated C; for a compiled function
** all of that for each of its graphs, plus guards, recompile reasons,
** graph breaks and timings from cm:stats(); with opts.inputs, warm,
** steady-state and eager times measured here; opts.checklist as
** fl.checklist returns it.
** Invariant: as in lfl_viz.c, every C temporary belongs to the call's
** to-be-closed scratch, every borrowed string to its keep table.
*/
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "lfl_viz.h"
#include "cpu/backend.h"
#include "exec/cache.h"
#include "exec/measure.h"
#include "exec/roofline.h"
#include "graph/pass.h"
#include "viz/report.h"
#include "viz/style.h"

#define MAX_CALLS 1000       /* timed calls per measurement */

static const char *const report_keys[] = {
  "rankdir", "title", "legend", "group_modules", "max_nodes", "edge_labels",
  "subtitle", "inputs", "calls", "checklist", NULL
};

/* ---- timings ------------------------------------------------------------- */

/* Calls the value at f (with the value at self first when self != 0) on
** the inputs listed at in; returns its wall time in ms.  Results are
** dropped; an error says which measurement failed. */
static double time_call(lua_State *L, int f, int self, int in, const char *which) {
  int top = lua_gettop(L), n, i;
  double t0, dt;
  lua_pushvalue(L, f);
  if (self) lua_pushvalue(L, self);
  n = (int)luaL_len(L, in);
  luaL_checkstack(L, n + 4, "report: too many inputs");
  for (i = 1; i <= n; i++) lua_geti(L, in, i);
  t0 = meas_now();
  if (lua_pcall(L, n + (self != 0), LUA_MULTRET, 0) != LUA_OK)
    luaL_error(L, "report: timing %s on opts.inputs failed: %s", which,
               luaL_tolstring(L, -1, NULL));
  dt = meas_now() - t0;
  lua_settop(L, top);
  return dt * 1e3;
}

/* `calls` timed calls (see time_call) summarized into *sum; returns the
** median (exec/measure.c: with its spread and noise). */
static double median_calls(lua_State *L, int f, int self, int in, int calls,
                           const char *which, meas_summary *sum) {
  double t[MAX_CALLS];
  meas_window w;
  int i;
  meas_begin(&w);
  for (i = 0; i < calls; i++) t[i] = time_call(L, f, self, in, which);
  meas_summarize(t, calls, &w, sum);
  return sum->median;
}

/* The method `name` of the value at idx pushed, then idx itself. */
static void push_method(lua_State *L, int idx, const char *name) {
  lua_getfield(L, idx, name);
  lua_pushvalue(L, idx);
}

/* ---- the report ----------------------------------------------------------- */

typedef struct rep {
  viz_report r;
  viz_kv summary[20];
  int nsum;
  int keep;
  lfl_viz_scratch *s;
  viz_opts o;
  /* CPU programs timed kernel by kernel while the steady-state calls ran:
  ** their kernels' mean times fill the kernel table */
  exec_program *timed[LFL_VIZ_MAX_STAGES];
  int ntimed;
  /* the steady state and eager as measured, for one verdict on the page */
  meas_summary steady, eager;
  int has_steady, has_eager;
  roof_peaks peaks;            /* r.peaks points here once measured */
  meas_summary ck_steady, ck_eager;   /* the checklist's pair, timed side by side */
  int has_ck;
  int first_warm;              /* the compiled function's first call loaded its kernels */
  viz_step *steps;             /* the pass stepper's, steps_cap of them */
  int nsteps, steps_cap;
} rep;

/* Per-kernel timing on for the program at idx (a CPU program; others are
** left alone) during the timed calls that follow; reset selects whether
** the counters start again (a program fl.compile already times keeps
** the means of the calls it made). */
static void profile_program(lua_State *L, rep *R, int idx, int reset) {
  exec_program *pr = lfl_toprogram(L, idx);
  fl_err e;
  if (!pr || R->ntimed >= LFL_VIZ_MAX_STAGES) return;
  err_clear(&e);
  if ((reset || !pr->profile) && exec_program_set_profile(pr, 1, &e) != FL_OK)
    lfl_viz_raise(L, "report", &e);
  R->timed[R->ntimed++] = pr;
}

/* Timing off again for the programs the report turned it on for (a
** program fl.compile times stays timed: `keep`). */
static void profile_off(rep *R, int keep) {
  int i;
  if (keep) return;
  for (i = 0; i < R->ntimed; i++) exec_program_set_profile(R->timed[i], 0, NULL);
}

/* A summary's text kept for the page: "0.12 ms (IQR ..., 20 runs)" and
** what measured it. */
static const char *summary_note(lua_State *L, rep *R, const meas_summary *s, const char *where) {
  char buf[256];
  meas_format(s, "ms", buf, sizeof buf);
  lua_pushfstring(L, "median %s%s%s", buf, where ? " \xc2\xb7 " : "", where ? where : "");
  return lfl_viz_keep(L, R->keep);
}

/* The mean time of each kernel of plan p per call (t[k]) and per launch
** (t[nkernels + k]), when a timed program ran it; else NULL (the table
** shows a dash).  A CPU program's times also set the machine's peaks, for
** the roofline columns. */
static const double *kernel_times(lua_State *L, rep *R, const fuse_plan *p) {
  double *t;
  int i, k;
  for (i = 0; i < R->ntimed; i++) {
    const exec_program *pr = R->timed[i];
    if (pr->plan != p || pr->profiled_runs == 0) continue;
    t = (double *)lfl_viz_alloc(L, R->s, (size_t)(2 * p->nkernels + 1) * sizeof *t, "report");
    for (k = 0; k < p->nkernels; k++) {
      int64_t ran = pr->kernel_ran ? pr->kernel_ran[k] : pr->profiled_runs;
      t[k] = pr->kernel_ms[k] / (double)pr->profiled_runs;
      t[p->nkernels + k] = ran > 0 ? pr->kernel_ms[k] / (double)ran : 0;
    }
    if (!R->r.peaks && strcmp(pr->be->name, "cpu") == 0 &&
        roof_machine_peaks(&R->peaks, 0, NULL) == FL_OK)
      R->r.peaks = &R->peaks;
    return t;
  }
  return NULL;
}

static void sum_add(lua_State *L, rep *R, const char *key, const char *fmt, ...) {
  char buf[320];
  va_list ap;
  if (R->nsum >= (int)(sizeof R->summary / sizeof R->summary[0])) return;
  va_start(ap, fmt);
  vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  lua_pushstring(L, buf);
  R->summary[R->nsum].key = key;
  R->summary[R->nsum].value = lfl_viz_keep(L, R->keep);
  R->nsum++;
}

static const char *bytes_str(lua_State *L, rep *R, int64_t b) {
  char buf[32];
  lua_pushstring(L, viz_bytes_str(b, buf, sizeof buf));
  return lfl_viz_keep(L, R->keep);
}

/* A scene of l as SVG text owned by the scratch. */
static const char *scene_svg(lua_State *L, rep *R, const lfl_viz_list *l) {
  viz_scene sc;
  fl_err e;
  char *svg = NULL;
  size_t len;
  lfl_viz_scene(&sc, l);
  lfl_viz_reserve(L, R->s, "report");
  err_clear(&e);
  if (viz_render_mem(&sc, "svg", &R->o, &svg, &len, &e) != FL_OK) lfl_viz_raise(L, "report", &e);
  R->s->mem[R->s->nmem++] = svg;
  return svg;
}

static const char *kind_name(fk_kind k) {
  return k == FK_POINTWISE ? "pointwise" : k == FK_REDUCE ? "reduce" : "extern";
}

/* Graphs, kernels, decisions and summary numbers from the stages in l
** (what fl.compile made, in order).  One plan: exactly what the C layer
** reports for a plan.  Several: every kernel and decision, tagged with
** its graph, and the pictures of all graphs before and after. */
/* The memory chart of the first graph's plan (a report of several says
** which); a chart that cannot be made leaves the section out. */
static void fill_memory(lua_State *L, rep *R, const lfl_viz_list *l) {
  fl_err e;
  char *svg;
  if (l->n < 1 || !l->plan[0]) return;
  err_clear(&e);
  if (!(svg = lfl_memory_svg(L, l->plan[0], &e))) return;
  lua_pushstring(L, svg);
  free(svg);
  R->r.memory_svg = lfl_viz_keep(L, R->keep);
  lua_pushfstring(L, "op results alive at each step, op by op against fused%s",
                  l->n > 1 ? " (graph 1)" : "");
  R->r.memory_label = lfl_viz_keep(L, R->keep);
}

static void fill_stages(lua_State *L, rep *R, const lfl_viz_list *l) {
  viz_report *r = &R->r;
  fill_memory(L, R, l);
  lfl_viz_list before;
  viz_kernel_row *rows;
  viz_decision_row *dec;
  int i, k, nk = 0, nd = 0, kb = 0, bb = 0, ka = 0, ba = 0, nodes = 0, fused = 0;
  int64_t mb = 0, ma = 0, pb = 0, pa = 0;
  fl_err e;
  if (l->n == 1 && l->plan[0]) {
    err_clear(&e);
    if (viz_plan_report_fill(r, &R->s->pr, l->plan[0], kernel_times(L, R, l->plan[0]), &l->st[0], &R->o,
                             &e) != FL_OK)
      lfl_viz_raise(L, "report", &e);
    R->s->has_pr = 1;
    for (i = 0; i < r->nsummary && R->nsum < 20; i++) R->summary[R->nsum++] = r->summary[i];
    return;
  }
  lfl_viz_list_init(L, R->s, &before, "report");
  before.pieces = l->pieces;
  memcpy(before.br, l->br, LFL_VIZ_MAX_STAGES * sizeof *l->br);
  for (i = 0; i < l->n; i++) {
    const fuse_plan *p = l->plan[i];
    viz_stage st;
    int kk, bf;
    int64_t m;
    if (p) {
      viz_plan_baseline(&st, p);
      nk += p->nkernels;
      nd += p->ndec;
      if (p->stats.peak_bytes_before > pb) pb = p->stats.peak_bytes_before;
      if (p->stats.peak_bytes_after > pa) pa = p->stats.peak_bytes_after;
    } else {
      ir_opcost c;
      st = l->st[i];
      fuse_reference_cost(st.g, &c);   /* runs op by op: the same either side */
      if (c.peak_bytes > pb) pb = c.peak_bytes;
      if (c.peak_bytes > pa) pa = c.peak_bytes;
    }
    lfl_viz_add_stage(L, &before, &st, p, "report");
    viz_stage_numbers(&st, &kk, &bf, &m);
    kb += kk; bb += bf; mb += m;
    viz_stage_numbers(&l->st[i], &kk, &bf, &m);
    ka += kk; ba += bf; ma += m;
  }
  rows = (viz_kernel_row *)lfl_viz_alloc(L, R->s, (size_t)nk * sizeof *rows, "report");
  dec = (viz_decision_row *)lfl_viz_alloc(L, R->s, (size_t)nd * sizeof *dec, "report");
  nk = nd = 0;
  for (i = 0; i < l->n; i++) {
    const fuse_plan *p = l->plan[i];
    const double *times;
    if (!p) continue;
    nodes += p->stats.nodes;
    times = kernel_times(L, R, p);
    for (k = 0; k < p->nkernels; k++) {
      const viz_kernel *vk = &l->st[i].kernels[k];
      lua_pushfstring(L, "g%d %s", i + 1, vk->name);
      rows[nk].name = lfl_viz_keep(L, R->keep);
      rows[nk].kind = kind_name(p->kernels[k].kind);
      rows[nk].nodes = vk->nnodes;
      rows[nk].bytes_read = vk->bytes_read;
      rows[nk].bytes_written = vk->bytes_written;
      rows[nk].time_ms = times ? times[k] : vk->time_ms;
      rows[nk].launch_ms = times ? times[p->nkernels + k] : 0;
      rows[nk].flops = fuse_kernel_flops(p->g, &p->kernels[k]);
      nk++;
    }
    for (k = 0; k < p->ndec; k++) {
      const fuse_decision *d = &p->dec[k];
      char da[80], db[80];
      fk_describe(p->g, d->a, da, sizeof da);
      fk_describe(p->g, d->b, db, sizeof db);
      lua_pushfstring(L, "g%d %%%d %s", i + 1, d->a, da);
      dec[nd].a = lfl_viz_keep(L, R->keep);
      lua_pushfstring(L, "g%d %%%d %s", i + 1, d->b, db);
      dec[nd].b = lfl_viz_keep(L, R->keep);
      dec[nd].fused = d->fused;
      dec[nd].reason = d->reason;
      dec[nd].bytes_saved = d->bytes_saved;
      fused += d->fused != 0;
      nd++;
    }
  }
  r->kernels = rows;
  r->nkernels = nk;
  r->decisions = dec;
  r->ndecisions = nd;
  sum_add(L, R, "graphs", "%d", l->n);
  sum_add(L, R, "kernels", "%d \xe2\x86\x92 %d", kb, ka);
  sum_add(L, R, "buffers", "%d \xe2\x86\x92 %d", bb, ba);
  sum_add(L, R, "bytes moved", "%s \xe2\x86\x92 %s", bytes_str(L, R, mb), bytes_str(L, R, ma));
  /* graphs run one after another: the largest peak is the function's */
  sum_add(L, R, "peak memory", "%s \xe2\x86\x92 %s", bytes_str(L, R, pb), bytes_str(L, R, pa));
  sum_add(L, R, "ops", "%d", nodes);
  sum_add(L, R, "pairs fused", "%d of %d", fused, nd);
  r->before_svg = scene_svg(L, R, &before);
  r->after_svg = scene_svg(L, R, l);
  lua_pushfstring(L, "before fusion: %d graphs \xc2\xb7 %d kernels \xc2\xb7 %d buffers \xc2\xb7 %s moved",
                  l->n, kb, bb, bytes_str(L, R, mb));
  r->before_label = lfl_viz_keep(L, R->keep);
  lua_pushfstring(L, "after fusion: %d graphs \xc2\xb7 %d kernels \xc2\xb7 %d buffers \xc2\xb7 %s moved",
                  l->n, ka, ba, bytes_str(L, R, ma));
  r->after_label = lfl_viz_keep(L, R->keep);
}

/* The strings of the array at field `key` of the table at t, anchored;
** *n gets the count. */
static const char *const *string_list(lua_State *L, rep *R, int t, const char *key, int *n) {
  const char **v;
  lua_Integer i, m;
  *n = 0;
  if (lua_getfield(L, t, key) != LUA_TTABLE) {
    lua_pop(L, 1);
    return NULL;
  }
  m = luaL_len(L, -1);
  v = (const char **)lfl_viz_alloc(L, R->s, (size_t)m * sizeof *v, "report");
  for (i = 1; i <= m; i++) {
    lua_rawgeti(L, -1, i);
    v[*n] = lfl_viz_keep(L, R->keep);   /* numbers come out as text too */
    if (v[*n]) (*n)++;
  }
  lua_pop(L, 1);
  return v;
}

static const char *field_str(lua_State *L, rep *R, int t, const char *key) {
  if (lua_getfield(L, t, key) == LUA_TSTRING) return lfl_viz_keep(L, R->keep);
  lua_pop(L, 1);
  return NULL;
}

static double field_num(lua_State *L, int t, const char *key, double def) {
  double v = def;
  if (lua_getfield(L, t, key) == LUA_TNUMBER) v = lua_tonumber(L, -1);
  lua_pop(L, 1);
  return v;
}

/* ---- the pass stepper ------------------------------------------------------ */

#define STEP_GRAPHS 8        /* graphs of a compiled function stepped through */

/* The graph passes a compiled function's graphs went through, named as
** the stepper shows them. */
static viz_step *step_new(lua_State *L, rep *R, const char *prefix, const char *name) {
  viz_step *st;
  if (!R->steps) {
    R->steps_cap = 4 * STEP_GRAPHS + 2;
    R->steps = (viz_step *)lfl_viz_alloc(L, R->s, (size_t)R->steps_cap * sizeof *R->steps, "report");
  }
  if (R->nsteps >= R->steps_cap) return NULL;
  st = &R->steps[R->nsteps++];
  memset(st, 0, sizeof *st);
  lua_pushfstring(L, "%s%s", prefix, name);
  st->name = lfl_viz_keep(L, R->keep);
  st->prev = -1;
  st->added = st->removed = st->changed = -1;
  return st;
}

static int op_count(lua_State *L, int g) {
  int n;
  push_method(L, g, "ops");
  lua_call(L, 1, 1);
  n = (int)luaL_len(L, -1);
  lua_pop(L, 1);
  return n;
}

/* `method` of the graph at g with {quiet = true}: pushes the new graph
** and its log. */
static void run_pass(lua_State *L, int g, const char *method) {
  push_method(L, g, method);
  lua_createtable(L, 0, 1);
  lua_pushboolean(L, 1);
  lua_setfield(L, -2, "quiet");
  lua_call(L, 2, 2);
}

static int count_lines(const char *s) {
  int n = 1;
  for (; *s; s++) n += *s == '\n';
  return n;
}

/* The length of the array at field key of the table at t. */
static int field_len(lua_State *L, int t, const char *key) {
  int n;
  lua_getfield(L, t, key);
  n = lua_istable(L, -1) ? (int)luaL_len(L, -1) : 0;
  lua_pop(L, 1);
  return n;
}

/* n pairs from the array of tables at field key of d (fields a, b of each),
** in a block owned by the scratch. */
static const int *diff_pairs(lua_State *L, rep *R, int d, const char *key, const char *a,
                             const char *b, int *n) {
  int *v, i;
  *n = field_len(L, d, key);
  v = (int *)lfl_viz_alloc(L, R->s, (size_t)(*n ? *n : 1) * 2 * sizeof *v, "report");
  lua_getfield(L, d, key);
  for (i = 0; i < *n; i++) {
    lua_rawgeti(L, -1, i + 1);
    v[2 * i] = (int)field_num(L, lua_gettop(L), a, 0);
    v[2 * i + 1] = (int)field_num(L, lua_gettop(L), b, 0);
    lua_pop(L, 1);
  }
  lua_pop(L, 1);
  return v;
}

/* A step showing the graph at g: its listing, and with a previous graph
** (at pg, shown by the step before) what fl._graph_diff says changed,
** the same diff g:diff prints. */
static viz_step *step_graph(lua_State *L, rep *R, const char *prefix, const char *name, int g, int pg,
                            const char *what) {
  viz_step *st = step_new(L, R, prefix, name);
  int ops, d, nl;
  if (!st) return NULL;
  luaL_tolstring(L, g, NULL);
  st->listing = lfl_viz_keep(L, R->keep);
  ops = op_count(L, g);
  if (!pg) {
    lua_pushfstring(L, "%s: %d ops%s", st->name, ops, what ? what : "");
    st->summary = lfl_viz_keep(L, R->keep);
    return st;
  }
  st->prev = R->nsteps - 2;
  lua_getfield(L, LUA_REGISTRYINDEX, LFL_LIB_KEY);
  lua_getfield(L, -1, "_graph_diff");
  lua_remove(L, -2);
  lua_pushvalue(L, pg);
  lua_pushvalue(L, g);
  lua_call(L, 2, 1);
  d = lua_gettop(L);
  lua_pushvalue(L, d);
  lfl_viz_keep(L, R->keep);   /* anchors nothing the page borrows; keeps the stack flat */
  st->added = field_len(L, d, "added");
  st->removed = field_len(L, d, "removed");
  st->gone = diff_pairs(L, R, d, "gone", "line", "after", &st->ngone);
  st->was = diff_pairs(L, R, d, "changed", "new", "old", &st->nwas);
  nl = count_lines(st->listing);
  st->mark = (char *)lfl_viz_alloc(L, R->s, (size_t)nl, "report");
  st->nmark = nl;
  st->changed = 0;
  lua_getfield(L, d, "marks");
  lua_pushnil(L);
  while (lua_next(L, -2)) {
    lua_Integer line = lua_tointeger(L, -2);
    const char *m = lua_tostring(L, -1);
    if (line >= 1 && line <= nl && m) {
      ((char *)st->mark)[line - 1] = m[0];
      st->changed += m[0] == VIZ_LINE_CHANGED;
    }
    lua_pop(L, 1);
  }
  lua_pop(L, 1);
  lua_getfield(L, d, "moved");
  if (lua_toboolean(L, -1)) st->changed--;   /* the return line: not a node */
  lua_pop(L, 1);
  if (st->added == 0 && st->removed == 0)
    lua_pushfstring(L, "%s: no change; %d ops", st->name, ops);
  else
    lua_pushfstring(L, "%s: %d node%s removed, %d added (%d of them changed: the same op with new "
                    "inputs); %d \xe2\x86\x92 %d ops", st->name, st->removed, st->removed == 1 ? "" : "s",
                    st->added, st->changed, op_count(L, pg), ops);
  st->summary = lfl_viz_keep(L, R->keep);
  lua_settop(L, d - 1);
  return st;
}

/* What each of optimize's rewrites does (graph/pass.h's order). */
static const char *const rule_says[PASS_NRULES] = {
  "batch norm folded into the convolution before it",
  "algebraic simplification (x*1, x+0, double transpose, ...)",
  "matmul(x, transpose(w)) + b made one linear",
  "per-channel scale or shift folded into the convolution before it",
  "ops over constants computed now (constant folding)",
  "repeated ops merged (common subexpressions)",
  "unused nodes removed (dead code)",
};

/* g:optimize{rules = the first n rules, quiet = true}: graph and log on the stack */
static void run_rules(lua_State *L, int g, int n) {
  int k;
  push_method(L, g, "optimize");
  lua_createtable(L, 0, 2);
  lua_pushboolean(L, 1);
  lua_setfield(L, -2, "quiet");
  lua_createtable(L, n, 0);
  for (k = 0; k < n; k++) {
    lua_pushstring(L, pass_rule_names[k]);
    lua_rawseti(L, -2, k + 1);
  }
  lua_setfield(L, -2, "rules");
  lua_call(L, 2, 2);
}

/* optimize one rewrite at a time: step k is optimize with its first k
** rules (the last is g:optimize() itself), shown against the step before,
** so each rewrite's own changes are marked; the rules that change nothing
** are named under the last step instead of a step each. */
static void steps_optimize(lua_State *L, rep *R, const char *prefix, int d) {
  int k, shown = d, idle = 0;
  char name[48];
  const char *unused[PASS_NRULES];
  viz_step *last = NULL;
  for (k = 1; k <= PASS_NRULES; k++) {
    int o, changed;
    run_rules(L, d, k);
    lua_pop(L, 1);
    o = lua_gettop(L);
    luaL_tolstring(L, o, NULL);
    luaL_tolstring(L, shown, NULL);
    changed = strcmp(lua_tostring(L, -1), lua_tostring(L, -2)) != 0;
    lua_pop(L, 2);
    if (!changed) {
      unused[idle++] = pass_rule_names[k - 1];
      lua_pop(L, 1);
      continue;
    }
    snprintf(name, sizeof name, "optimize/%s", pass_rule_names[k - 1]);
    last = step_graph(L, R, prefix, name, o, shown, NULL);
    if (last) {
      const char **note = (const char **)lfl_viz_alloc(L, R->s, 2 * sizeof *note, "report");
      note[0] = rule_says[k - 1];
      last->notes = note;
      last->nnotes = 1;
    }
    if (shown != d) lua_remove(L, shown);
    shown = lua_gettop(L);
  }
  if (shown == d) {                    /* nothing to rewrite: one step */
    last = step_graph(L, R, prefix, "optimize", d, d, NULL);
    idle = 0;
  }
  if (last && idle) {
    luaL_Buffer b;
    const char **note = (const char **)lfl_viz_alloc(L, R->s, 2 * sizeof *note, "report");
    luaL_buffinit(L, &b);
    luaL_addstring(&b, "no change from ");
    for (k = 0; k < idle; k++) {
      if (k) luaL_addstring(&b, ", ");
      luaL_addstring(&b, unused[k]);
    }
    luaL_pushresult(&b);
    note[0] = last->nnotes ? last->notes[0] : NULL;
    note[last->nnotes ? 1 : 0] = lfl_viz_keep(L, R->keep);
    last->notes = note;
    last->nnotes = last->nnotes ? 2 : 1;
  }
  if (shown != d) lua_remove(L, shown);
}

/* The captured graph at g, decomposed and optimized as fl.compile does
** (graph/pass.c: the same graphs every time), decompose one step,
** optimize one step per rewrite. */
static void steps_passes(lua_State *L, rep *R, const char *prefix, int g) {
  int d;
  step_graph(L, R, prefix, "capture", g, 0, " (the function as traced)");
  run_pass(L, g, "decompose");
  lua_pop(L, 1);
  d = lua_gettop(L);
  step_graph(L, R, prefix, "decompose", d, g, NULL);
  steps_optimize(L, R, prefix, d);
  lua_remove(L, d);
}

/* The plan's kernels: the text print(p) gives. */
static void step_fusion(lua_State *L, rep *R, const char *prefix, int plan, const fuse_plan *p) {
  viz_step *st = step_new(L, R, prefix, "fusion");
  int i, fused = 0;
  if (!st) return;
  for (i = 0; i < p->ndec; i++) fused += p->dec[i].fused != 0;
  luaL_tolstring(L, plan, NULL);
  st->listing = lfl_viz_keep(L, R->keep);
  lua_pushfstring(L, "%s: %d ops in %d kernel%s, where the captured graph runs %d; %d of %d candidate "
                  "pairs fused; bytes moved %s \xe2\x86\x92 %s", st->name, p->stats.nodes, p->nkernels,
                  p->nkernels == 1 ? "" : "s", p->stats.kernels_before, fused, p->ndec,
                  bytes_str(L, R, p->stats.bytes_before), bytes_str(L, R, p->stats.bytes_after));
  st->summary = lfl_viz_keep(L, R->keep);
}

/* The generated code is on the page once, in its own section. */
static void step_code(lua_State *L, rep *R) {
  viz_step *st;
  if (!R->r.code || !*R->r.code || !(st = step_new(L, R, "", "code"))) return;
  st->ref = "code";
  lua_pushfstring(L, "code: %d lines of generated %s", count_lines(R->r.code),
                  R->r.code_lang ? R->r.code_lang : "source");
  st->summary = lfl_viz_keep(L, R->keep);
}

/* The plan (at plan) of the graph with fingerprint fp among the plans in
** the array at plans, pushed; 0 (nothing pushed) when none. */
static int plan_of(lua_State *L, int plans, const char *fp) {
  lua_Integer j, n = luaL_len(L, plans);
  char hex[33];
  for (j = 1; j <= n; j++) {
    const fuse_plan *p;
    lua_rawgeti(L, plans, j);
    p = lfl_toplan(L, -1);
    if (p) {
      ir_fingerprint(p->g, hex);
      if (strcmp(hex, fp) == 0) return lua_gettop(L);
    }
    lua_pop(L, 1);
  }
  return 0;
}

/* A compiled function's graphs, each from its capture: the captured graph
** is the one a fast-path entry of cm keeps (its first user value), found
** by what decompose and optimize make of it; a graph with no entry (a
** function whose Lua runs each call) is stepped from the graph as
** compiled. */
static void steps_compiled(lua_State *L, rep *R, int state) {
  int top = lua_gettop(L), graphs, plans, found;
  lua_Integer i, n, ng;
  char hex[33];
  lua_getfield(L, state, "graphs");
  graphs = lua_gettop(L);
  lua_getfield(L, state, "plans");
  plans = lua_gettop(L);
  if (!lua_istable(L, graphs) || !lua_istable(L, plans)) { lua_settop(L, top); return; }
  lua_newtable(L);   /* fingerprint of the compiled graph -> the captured one */
  found = lua_gettop(L);
  if (lua_getfield(L, state, "entries") == LUA_TTABLE) {
    n = luaL_len(L, -1);
    for (i = 1; i <= n; i++) {
      lua_rawgeti(L, -1, i);
      if (lua_type(L, -1) == LUA_TUSERDATA && lua_getiuservalue(L, -1, 1) == LUA_TUSERDATA &&
          luaL_testudata(L, -1, "fl.Graph")) {
        int g = lua_gettop(L);
        run_pass(L, g, "decompose");
        lua_pop(L, 1);
        run_pass(L, lua_gettop(L), "optimize");
        lua_pop(L, 1);
        ir_fingerprint(lfl_checkgraph(L, -1), hex);
        lua_pushvalue(L, g);
        lua_setfield(L, found, hex);
        lua_settop(L, g);
      }
      lua_pop(L, 2);
    }
  }
  lua_pop(L, 1);
  ng = luaL_len(L, graphs);
  for (i = 1; i <= ng && i <= STEP_GRAPHS; i++) {
    char prefix[32];
    int cg, plan;
    lua_rawgeti(L, graphs, i);
    cg = lua_gettop(L);
    if (!luaL_testudata(L, cg, "fl.Graph")) { lua_settop(L, found); continue; }
    ir_fingerprint(lfl_checkgraph(L, cg), hex);
    if (ng > 1) snprintf(prefix, sizeof prefix, "graph %d: ", (int)i);
    else prefix[0] = '\0';
    if (lua_getfield(L, found, hex) == LUA_TUSERDATA) steps_passes(L, R, prefix, lua_gettop(L));
    else step_graph(L, R, prefix, "graph as compiled", cg, 0,
                    " (decomposed and optimized: the captured graph is kept only when the function "
                    "runs without its Lua)");
    if ((plan = plan_of(L, plans, hex))) step_fusion(L, R, prefix, plan, lfl_toplan(L, plan));
    lua_settop(L, found);
  }
  step_code(L, R);
  lua_settop(L, top);
}

/* A Plan, a Program or a Graph: a plan does not know the stages it was
** made from, so the steps start at its graph. */
static void steps_plan(lua_State *L, rep *R, int plan, int kind) {
  int top = lua_gettop(L);
  push_method(L, plan, "graph");
  lua_call(L, 1, 1);
  step_graph(L, R, "", kind == LFL_VIZ_GRAPH ? "graph" : "the plan's graph", lua_gettop(L), 0,
             kind == LFL_VIZ_GRAPH ? " (as given: the report fuses it without other passes)"
                                   : " (a plan does not keep the stages it was made from)");
  step_fusion(L, R, "", plan, lfl_toplan(L, plan));
  step_code(L, R);
  lua_settop(L, top);
}

/* Now, as a reader of the report wants it: "2024-05-01 14:03". */
static void stamp(char *buf, size_t n) {
  time_t t = time(NULL);
  struct tm tm;
  if (!localtime_r(&t, &tm) || !strftime(buf, n, "%Y-%m-%d %H:%M", &tm)) snprintf(buf, n, "?");
}

/* What a compiled function compiles, for titles: a module's type or a
** function's definition site. */
static const char *fn_name(lua_State *L, rep *R, int fn) {
  if (lua_type(L, fn) == LUA_TFUNCTION) {
    lua_Debug ar;
    lua_pushvalue(L, fn);
    lua_getinfo(L, ">S", &ar);
    if (ar.what && strcmp(ar.what, "C") == 0) lua_pushstring(L, "a C function");
    else lua_pushfstring(L, "function at %s:%d", ar.short_src, ar.linedefined);
  } else if (lua_type(L, fn) == LUA_TTABLE && lua_getfield(L, fn, "__typename") == LUA_TSTRING) {
    /* the module's class name ("nn.Sequential"), from its __typename */
  } else {
    if (lua_type(L, fn) == LUA_TTABLE) lua_pop(L, 1);
    lua_pushstring(L, lfl_viz_typeof(L, fn));
  }
  return lfl_viz_keep(L, R->keep);
}

/* Compiled training's pairs (state.train_pairs at pairs) after the
** inference graphs: each forward and backward plan a stage of its own,
** its heading saying what the forward keeps for the backward. */
static void add_training_pairs(lua_State *L, rep *R, int pairs, lfl_viz_list *l) {
  lua_Integer i, n = luaL_len(L, pairs);
  int top = lua_gettop(L);
  for (i = 1; i <= n && l->n + 2 <= LFL_VIZ_MAX_STAGES; i++) {
    const fuse_plan *fw, *bw;
    char saved[32];
    lua_rawgeti(L, pairs, i);
    lua_getfield(L, -1, "fw");
    lua_getfield(L, -2, "bw");
    lua_getfield(L, -3, "partition");
    fw = lfl_toplan(L, -3);
    bw = lfl_toplan(L, -2);
    fuse_bytes_str((int64_t)(lua_istable(L, -1) ? field_num(L, lua_gettop(L), "saved_bytes", 0) : 0),
                   saved, sizeof saved);
    if (fw) {
      lua_pushfstring(L, "training pair %d: forward (keeps %s for the backward)", (int)i, saved);
      lfl_viz_add_plan(L, R->s, l, fw, NULL, lfl_viz_keep(L, R->keep), "report");
    }
    if (bw) {
      lua_pushfstring(L, "training pair %d: backward", (int)i);
      lfl_viz_add_plan(L, R->s, l, bw, NULL, lfl_viz_keep(L, R->keep), "report");
    }
    lua_settop(L, top);
  }
}

/* A compiled function: timings (when opts.inputs), then its graphs and
** plans, generated code, guards, recompiles and breaks from cm:stats(). */
static void report_compiled(lua_State *L, rep *R, int cm, int inputs, int calls) {
  viz_report *r = &R->r;
  lfl_viz_list l;
  int top = lua_gettop(L), state, stats, fn, nb, i;
  viz_break_row *br;
  const char *backend;
  char when[32];
  lua_getfield(L, cm, "state");
  state = lua_gettop(L);
  luaL_checktype(L, state, LUA_TTABLE);
  lua_getfield(L, state, "fn");
  fn = lua_gettop(L);
  if (inputs) {
    lua_getfield(L, cm, "calls");
    if (lua_tointeger(L, -1) == 0) time_call(L, cm, 0, inputs, "the compiled function");
    lua_pop(L, 1);
    time_call(L, cm, 0, inputs, "the compiled function");
    lua_getfield(L, state, "programs");
    if (lua_istable(L, -1)) {
      lua_Integer j, np = luaL_len(L, -1);
      for (j = 1; j <= np; j++) {
        lua_rawgeti(L, -1, j);
        profile_program(L, R, lua_gettop(L), 1);
        lua_pop(L, 1);
      }
    }
    lua_pop(L, 1);
    median_calls(L, cm, 0, inputs, calls, "the compiled function", &R->steady);
    R->has_steady = 1;
    profile_off(R, 1);
    time_call(L, fn, 0, inputs, "the eager function");   /* its caches warm */
    median_calls(L, fn, 0, inputs, calls, "the eager function", &R->eager);
    R->has_eager = 1;
  } else {
    /* the programs fl.compile made time their kernels on every call:
    ** their means fill the kernel table */
    lua_getfield(L, state, "programs");
    if (lua_istable(L, -1)) {
      lua_Integer j, np = luaL_len(L, -1);
      for (j = 1; j <= np; j++) {
        lua_rawgeti(L, -1, j);
        profile_program(L, R, lua_gettop(L), 0);
        lua_pop(L, 1);
      }
    }
    lua_pop(L, 1);
  }
  push_method(L, cm, "stats");
  lua_call(L, 1, 1);
  stats = lua_gettop(L);
  lua_pushvalue(L, stats);
  lfl_viz_keep(L, R->keep);   /* anchors the table: only its strings matter */
  lua_getfield(L, cm, "calls");
  if (lua_tointeger(L, -1) == 0)
    luaL_error(L, "report: the compiled function has not run yet: call it once, or pass "
               "{inputs = {...}} to have the report call it");
  lua_pop(L, 1);
  lua_getfield(L, state, "graphs");
  lua_getfield(L, state, "train_pairs");
  if (luaL_len(L, -2) > 0 || (lua_istable(L, -1) && luaL_len(L, -1) > 0)) {
    lfl_viz_list_init(L, R->s, &l, "report");
    if (luaL_len(L, -2) > 0) lfl_viz_collect(L, R->s, R->keep, cm, &l, "report");
    if (lua_istable(L, -1)) add_training_pairs(L, R, lua_gettop(L), &l);
    fill_stages(L, R, &l);
  }
  lua_pop(L, 2);
  sum_add(L, R, "calls", "%d", (int)field_num(L, stats, "calls", 0));
  sum_add(L, R, "compiles", "%d (%d recompile%s)", (int)field_num(L, stats, "compiles", 0),
          (int)field_num(L, stats, "recompiles", 0),
          field_num(L, stats, "recompiles", 0) == 1 ? "" : "s");
  sum_add(L, R, "graph breaks", "%d", (int)field_num(L, stats, "graph_breaks", 0));
  if (field_num(L, stats, "remote_cache_hits", 0) > 0)
    sum_add(L, R, "cache hits", "%d (%d from disk, %d from remote)", (int)field_num(L, stats, "cache_hits", 0),
            (int)field_num(L, stats, "disk_cache_hits", 0), (int)field_num(L, stats, "remote_cache_hits", 0));
  else
    sum_add(L, R, "cache hits", "%d (%d from disk)", (int)field_num(L, stats, "cache_hits", 0),
            (int)field_num(L, stats, "disk_cache_hits", 0));
  sum_add(L, R, "fallbacks", "%d", (int)field_num(L, stats, "fallbacks", 0));
  sum_add(L, R, "compile time", "%.1f ms", field_num(L, stats, "compile_ms", 0));
  if (field_num(L, stats, "backward_graphs", 0) > 0) {
    /* compiled training: the pairs' code is in the code section */
    char saved[32];
    fuse_bytes_str((int64_t)field_num(L, stats, "saved_bytes", 0), saved, sizeof saved);
    sum_add(L, R, "training", "%d forward/backward pair%s, %d training call%s: the forward keeps %s "
            "for the backward, which recomputes %d op%s and ran %.1f ms in all (%d kernel%s)",
            (int)field_num(L, stats, "backward_graphs", 0),
            field_num(L, stats, "backward_graphs", 0) == 1 ? "" : "s",
            (int)field_num(L, stats, "training_calls", 0),
            field_num(L, stats, "training_calls", 0) == 1 ? "" : "s", saved,
            (int)field_num(L, stats, "recomputed", 0), field_num(L, stats, "recomputed", 0) == 1 ? "" : "s",
            field_num(L, stats, "backward_ms", 0), (int)field_num(L, stats, "backward_kernels", 0),
            field_num(L, stats, "backward_kernels", 0) == 1 ? "" : "s");
  }
  /* the calls the function made: first, second, the median of the rest */
  lua_getfield(L, stats, "first_call_warm");
  R->first_warm = lua_toboolean(L, -1);
  lua_pop(L, 1);
  if (lua_getfield(L, stats, "timings") == LUA_TTABLE) {
    int tm = lua_gettop(L);
    r->cold_ms = field_num(L, tm, "first_ms", -1);
    r->warm_ms = field_num(L, tm, "second_ms", -1);
    if (r->cold_ms >= 0) {
      r->cold_label = R->first_warm ? "first call: warm (capture, kernels already compiled: from a cache, run)"
                                    : "first call: cold (capture + compile + run)";
      r->timing_notes[0] = R->first_warm ? "one run \xc2\xb7 no compiler ran: the kernels were "
                                           "in the disk cache (or already loaded)" : "one run";
    }
    if (r->warm_ms >= 0) r->timing_notes[1] = "one run";
    if (!R->has_steady && lua_getfield(L, tm, "steady") == LUA_TTABLE) {
      lfl_to_summary(L, -1, &R->steady, "report");
      R->has_steady = R->steady.n > 0;
      lua_pop(L, 1);
    }
    if (r->cold_ms < 0) r->cold_ms = field_num(L, stats, "first_call_ms", -1);
  }
  lua_pop(L, 1);
  if (R->has_steady)
    r->timing_notes[2] = summary_note(L, R, &R->steady, inputs ? "calls made by the report"
                                                                : "the calls the function made");
  if (R->has_eager) r->timing_notes[3] = summary_note(L, R, &R->eager, "calls made by the report");
  if (R->has_steady) r->steady_ms = R->steady.median;
  if (R->has_eager) r->eager_ms = R->eager.median;
  lua_getfield(L, cm, "code");
  lua_pushvalue(L, cm);
  lua_call(L, 1, 1);
  if (lua_type(L, -1) == LUA_TSTRING && lua_rawlen(L, -1) > 0) r->code = lfl_viz_keep(L, R->keep);
  else lua_pop(L, 1);
  r->code_lang = "C";
  steps_compiled(L, R, state);
  r->guards = string_list(L, R, stats, "guards", &r->nguards);
  r->recompiles = string_list(L, R, stats, "recompile_reasons", &r->nrecompiles);
  if (lua_getfield(L, stats, "break_reasons") == LUA_TTABLE) {
    nb = (int)luaL_len(L, -1);
    br = (viz_break_row *)lfl_viz_alloc(L, R->s, (size_t)nb * sizeof *br, "report");
    for (i = 0; i < nb; i++) {
      lua_rawgeti(L, -1, i + 1);
      if (lua_istable(L, -1)) {
        int b = lua_gettop(L);
        br[i].reason = field_str(L, R, b, "reason");
        br[i].hint = field_str(L, R, b, "hint");
        br[i].where = field_str(L, R, b, "where");
      }
      if (!br[i].reason) br[i].reason = "graph break";
      lua_pop(L, 1);
    }
    r->breaks = br;
    r->nbreaks = nb;
  }
  lua_pop(L, 1);
  stamp(when, sizeof when);
  backend = field_str(L, R, stats, "backend");
  lua_pushfstring(L, "fl.compile(%s) \xc2\xb7 backend %s \xc2\xb7 %s", fn_name(L, R, fn),
                  backend ? backend : "cpu", when);
  r->subtitle = lfl_viz_keep(L, R->keep);
  if (!r->title) {
    lua_pushfstring(L, "Review: %s", fn_name(L, R, fn));
    r->title = lfl_viz_keep(L, R->keep);
  }
  lua_settop(L, top);
}

/* A Plan, a Program or a Graph (planned here with the default options):
** the plan's sections, its generated C (generated here when needed) and,
** with opts.inputs, the program's timings against the graph run on the
** eager kernels. */
static void report_plan(lua_State *L, rep *R, int idx, int kind, int inputs, int calls) {
  viz_report *r = &R->r;
  lfl_viz_list l;
  const fuse_plan *p;
  exec_program *pr = NULL;
  int top = lua_gettop(L), plan = idx, prog = 0;
  char when[32];
  if (kind == LFL_VIZ_GRAPH) {
    push_method(L, idx, "fuse");
    lua_call(L, 1, 1);
    plan = lua_gettop(L);
  }
  if (kind == LFL_VIZ_PROGRAM) {
    prog = idx;
    pr = lfl_toprogram(L, idx);
    if (!pr) luaL_error(L, "report: the program has been released");
    push_method(L, prog, "plan");
    lua_call(L, 1, 1);
    plan = lua_gettop(L);
  } else {
    push_method(L, plan, "codegen");
    lua_pushstring(L, "cpu");
    if (lua_pcall(L, 2, 1, 0) == LUA_OK) {
      prog = lua_gettop(L);
      pr = lfl_toprogram(L, prog);
    } else {
      lua_pop(L, 1);   /* no code section; the rest of the report stands */
    }
  }
  p = lfl_viz_plan_at(L, plan, "report");
  if (inputs && prog) {
    double t0 = meas_now(), compile_ms;
    int g;
    if (!pr->image) {
      push_method(L, prog, "compile");
      lua_call(L, 1, 0);
    }
    compile_ms = (meas_now() - t0) * 1e3;
    lua_getfield(L, prog, "run");
    r->cold_ms = compile_ms + time_call(L, lua_gettop(L), prog, inputs, "the program");
    r->warm_ms = time_call(L, lua_gettop(L), prog, inputs, "the program");
    if (pr->how != CACHE_COMPILED) r->cold_label = "first run: warm (kernels loaded from the cache)";
    profile_program(L, R, prog, 1);
    r->steady_ms = median_calls(L, lua_gettop(L), prog, inputs, calls, "the program", &R->steady);
    R->has_steady = 1;
    r->timing_notes[2] = summary_note(L, R, &R->steady, NULL);
    profile_off(R, 0);
    push_method(L, plan, "graph");
    lua_call(L, 1, 1);
    g = lua_gettop(L);
    lua_getfield(L, g, "run");
    time_call(L, lua_gettop(L), g, inputs, "the graph on the eager kernels");
    r->eager_ms = median_calls(L, lua_gettop(L), g, inputs, calls,
                               "the graph on the eager kernels", &R->eager);
    R->has_eager = 1;
    r->timing_notes[3] = summary_note(L, R, &R->eager, "the graph run op by op");
  }
  lfl_viz_list_init(L, R->s, &l, "report");
  lfl_viz_add_plan(L, R->s, &l, p, pr, NULL, "report");
  fill_stages(L, R, &l);
  if (pr) {
    r->code = exec_program_source(pr);
    r->code_lang = "C";
  }
  steps_plan(L, R, plan, kind);
  stamp(when, sizeof when);
  lua_pushfstring(L, "%s of %d ops in %d kernel%s \xc2\xb7 %s",
                  kind == LFL_VIZ_PROGRAM ? "program" : "fusion plan", p->stats.nodes, p->nkernels,
                  p->nkernels == 1 ? "" : "s", when);
  r->subtitle = lfl_viz_keep(L, R->keep);
  if (!r->title) {
    lua_pushfstring(L, "Review: fusion plan (%d ops \xe2\x86\x92 %d kernel%s)",
                    p->stats.nodes, p->nkernels, p->nkernels == 1 ? "" : "s");
    r->title = lfl_viz_keep(L, R->keep);
  }
  lua_settop(L, top);
}

/* The checklist rows of a table as fl.checklist returns it; its times
** fill the timings the report did not measure itself. */
static void fill_checklist(lua_State *L, rep *R, int c) {
  viz_report *r = &R->r;
  viz_check_row *rows = (viz_check_row *)lfl_viz_alloc(L, R->s, 10 * sizeof *rows, "report");
  int n = 0;
  double cold = field_num(L, c, "cold_ms", -1), steady = field_num(L, c, "steady_ms", -1);
  double eager = field_num(L, c, "eager_ms", -1), v;
  if (lua_getfield(L, c, "coverage") == LUA_TTABLE) {
    int cov = lua_gettop(L);
    int sup = (int)field_num(L, cov, "supported", 0), tot = (int)field_num(L, cov, "total", 0);
    char buf[256];
    size_t at = (size_t)snprintf(buf, sizeof buf, "%d/%d", sup, tot);
    if (lua_getfield(L, cov, "unsupported") == LUA_TTABLE && luaL_len(L, -1) > 0) {
      lua_Integer i, m = luaL_len(L, -1);
      for (i = 1; i <= m && at < sizeof buf; i++) {
        lua_rawgeti(L, -1, i);
        at += (size_t)snprintf(buf + at, sizeof buf - at, "%s%s", i == 1 ? " (not supported: " : ", ",
                               lua_isstring(L, -1) ? lua_tostring(L, -1) : "?");
        lua_pop(L, 1);
      }
      if (at < sizeof buf) snprintf(buf + at, sizeof buf - at, ")");
    }
    lua_pop(L, 1);
    lua_pushstring(L, buf);
    rows[n].item = "operator coverage";
    rows[n].value = lfl_viz_keep(L, R->keep);
    rows[n++].verdict = sup == tot ? 1 : -1;
  }
  lua_pop(L, 1);
  if (cold >= 0) {
    char buf[64];
    snprintf(buf, sizeof buf, "%.1f ms", cold);
    lua_pushstring(L, buf);
    rows[n].item = "first call (cold: an empty cache, the compiler runs)";
    rows[n].value = lfl_viz_keep(L, R->keep);
    rows[n++].verdict = 0;
  }
  if (steady >= 0 && eager >= 0) {
    char buf[320];
    int v = steady < eager ? 1 : -1;
    const char *why = NULL;
    if (lua_getfield(L, c, "verdict") == LUA_TTABLE) {
      v = (int)field_num(L, lua_gettop(L), "verdict", v);
      why = field_str(L, R, lua_gettop(L), "text");
    }
    lua_pop(L, 1);
    snprintf(buf, sizeof buf, "%.3f ms compiled vs %.3f ms eager (medians)%s%s", steady, eager,
             why ? ": " : "", why ? why : "");
    lua_pushstring(L, buf);
    rows[n].item = "steady state";
    rows[n].value = lfl_viz_keep(L, R->keep);
    rows[n++].verdict = v;
  }
  {
    char buf[200];
    int t = lua_getfield(L, c, "break_even_calls");
    v = t == LUA_TNUMBER ? lua_tonumber(L, -1) : -1;
    if (t != LUA_TNUMBER || v != v || v > 1e15) snprintf(buf, sizeof buf, "never: compiled is not clearly faster");
    else snprintf(buf, sizeof buf, "%.0f call%s", v, v == 1 ? "" : "s");
    lua_pushstring(L, buf);
    rows[n].item = "calls to break even";
    rows[n].value = lfl_viz_keep(L, R->keep);
    rows[n++].verdict = v < 0 || v != v || v > 1e15 ? -1 : 0;
    /* the page's one break-even number: the checklist's, as it is the
    ** one measured from a cold compile */
    if (v < 0 || v != v || v > 1e15)
      snprintf(buf, sizeof buf, "Compilation does not pay for itself here (the go-live checklist below: "
               "compiled calls are not clearly faster than eager).");
    else
      snprintf(buf, sizeof buf, "Compilation pays for itself after %.0f call%s (the go-live checklist "
               "below: a cold compile of %.0f ms against the steady state).", v, v == 1 ? "" : "s", cold);
    lua_pushstring(L, buf);
    r->break_even = lfl_viz_keep(L, R->keep);
    lua_pop(L, 1);
  }
  lua_getfield(L, c, "cache_hit_rate_measured");
  if (lua_isboolean(L, -1) && !lua_toboolean(L, -1)) {
    /* one input called again always hits: not a rate to show */
    lua_pushliteral(L, "not measured (one input: shapes = {...} sweeps changing ones)");
    rows[n].item = "cache hit rate";
    rows[n].value = lfl_viz_keep(L, R->keep);
    rows[n++].verdict = 0;
  } else if ((v = field_num(L, c, "cache_hit_rate", -1)) >= 0) {
    char buf[32];
    snprintf(buf, sizeof buf, "%.0f%%", v <= 1 ? v * 100 : v);
    lua_pushstring(L, buf);
    rows[n].item = "cache hit rate";
    rows[n].value = lfl_viz_keep(L, R->keep);
    rows[n++].verdict = (v <= 1 ? v : v / 100) >= 0.9 ? 1 : (v <= 1 ? v : v / 100) < 0.5 ? -1 : 0;
  }
  lua_pop(L, 1);
  if ((v = field_num(L, c, "recompiles", -1)) >= 0) {
    lua_pushfstring(L, "%d", (int)v);
    rows[n].item = "recompiles";
    rows[n].value = lfl_viz_keep(L, R->keep);
    rows[n++].verdict = v == 0 ? 1 : 0;
  }
  if ((v = field_num(L, c, "max_abs_err", -1)) >= 0) {
    char buf[96];
    double rel = field_num(L, c, "max_rel_err", -1);
    if (rel >= 0) snprintf(buf, sizeof buf, "max abs err %.2g, max rel err %.2g", v, rel);
    else snprintf(buf, sizeof buf, "max abs err %.2g", v);
    lua_pushstring(L, buf);
    rows[n].item = "accuracy vs eager";
    rows[n].value = lfl_viz_keep(L, R->keep);
    rows[n++].verdict = (rel >= 0 ? rel : v) <= 1e-3 ? 1 : -1;
  }
  if ((v = field_num(L, c, "fallbacks", -1)) >= 0) {
    lua_pushfstring(L, "%d", (int)v);
    rows[n].item = "fallbacks to eager";
    rows[n].value = lfl_viz_keep(L, R->keep);
    rows[n++].verdict = v == 0 ? 1 : -1;
  }
  r->checklist = rows;
  r->nchecklist = n;
  r->recommendation = field_str(L, R, c, "recommendation");
  if (r->cold_ms < 0 && cold >= 0) r->cold_ms = cold;
  /* times the report did not measure come from the checklist's, with
  ** their spreads */
  if (lua_getfield(L, c, "timing") == LUA_TTABLE) {
    int tm = lua_gettop(L);
    if (lua_getfield(L, tm, "steady") == LUA_TTABLE && lua_getfield(L, tm, "eager") == LUA_TTABLE) {
      lfl_to_summary(L, -2, &R->ck_steady, "report");
      lfl_to_summary(L, -1, &R->ck_eager, "report");
      R->has_ck = 1;
    }
    lua_settop(L, tm);
    if (!R->has_steady && lua_getfield(L, tm, "steady") == LUA_TTABLE) {
      lfl_to_summary(L, -1, &R->steady, "report");
      R->has_steady = 1;
      r->timing_notes[2] = summary_note(L, R, &R->steady, "measured by the go-live checklist");
    }
    lua_settop(L, tm);
    if (!R->has_eager && lua_getfield(L, tm, "eager") == LUA_TTABLE) {
      lfl_to_summary(L, -1, &R->eager, "report");
      R->has_eager = 1;
      r->timing_notes[3] = summary_note(L, R, &R->eager, "measured by the go-live checklist");
    }
    lua_settop(L, tm);
  }
  lua_pop(L, 1);
  if (r->steady_ms < 0 && steady >= 0) r->steady_ms = R->has_steady ? R->steady.median : steady;
  if (r->eager_ms < 0 && eager >= 0) r->eager_ms = R->has_eager ? R->eager.median : eager;
}

/* The page's verdict (steady against eager, a margin above the noise)
** and, without a checklist, its break-even sentence. */
static void verdict(lua_State *L, rep *R) {
  viz_report *r = &R->r;
  const meas_summary *st = &R->steady, *ea = &R->eager;
  double ratio, margin;
  char buf[400], why[160];
  int v;
  size_t at;
  /* one verdict, from two timings taken side by side: the checklist's
  ** when it ran (its compiled and eager calls alternate with nothing
  ** between), else the report's own */
  if (R->has_ck) { st = &R->ck_steady; ea = &R->ck_eager; }
  else if (!R->has_steady || !R->has_eager) return;
  v = meas_verdict(st, ea, &ratio, &margin);
  if (v > 0)
    snprintf(buf, sizeof buf, "Steady state runs %.2f\xc3\x97 faster than eager (medians, beyond the "
             "%.0f%% the noise allows).", ratio, margin * 100);
  else if (v < 0)
    snprintf(buf, sizeof buf, "Steady state is slower than eager: %.2f\xc3\x97 its time (medians).", 1 / ratio);
  else
    snprintf(buf, sizeof buf, "No clear difference here between the steady state and eager "
             "(%.2f\xc3\x97, within the %.0f%% the noise allows).", ratio, margin * 100);
  at = strlen(buf);
  if (R->has_ck && at < sizeof buf)
    snprintf(buf + at, sizeof buf - at, " (The go-live checklist's steady state and eager, timed one "
             "after the other.)");
  at = strlen(buf);
  if ((st->noisy || ea->noisy) && at < sizeof buf)
    snprintf(buf + at, sizeof buf - at, " Noisy: %s.", meas_noise_reason(st->noisy ? st : ea, why, sizeof why));
  lua_pushstring(L, buf);
  r->verdict = lfl_viz_keep(L, R->keep);
  if (r->break_even) return;
  if (v <= 0) snprintf(buf, sizeof buf, "Compilation does not pay for itself here.");
  else if (R->first_warm)
    snprintf(buf, sizeof buf, "The first call was warm (no compiler ran: its kernels came from a cache): the calls "
             "a cold compile needs to pay for itself are the go-live checklist's to count.");
  else if (r->cold_ms >= 0) {
    double calls = meas_break_even(r->cold_ms, r->eager_ms, r->steady_ms);
    snprintf(buf, sizeof buf, "Compilation pays for itself after %.0f call%s.", calls, calls == 1 ? "" : "s");
  } else return;
  lua_pushstring(L, buf);
  r->break_even = lfl_viz_keep(L, R->keep);
}

/* The go-live checklist of the compiled function at cm, run on inputs
** like its last call's (fl._report_checklist, checklist.lua); pushes its
** table, or nil and a note on why it could not run. */
static int run_checklist(lua_State *L, int cm) {
  lua_getfield(L, LUA_REGISTRYINDEX, LFL_LIB_KEY);
  lua_getfield(L, -1, "_report_checklist");
  lua_remove(L, -2);
  lua_pushvalue(L, cm);
  if (lua_pcall(L, 1, 2, 0) != LUA_OK) {
    lua_pushnil(L);
    lua_insert(L, -2);
  }
  return lua_istable(L, -2);
}

/* fl.report(cm_or_plan, path [, opts]) -> path */
int lfl_viz_report(lua_State *L) {
  const char *path = luaL_checkstring(L, 2);
  rep R;
  fl_err e;
  int kind, inputs = 0, checklist = 0, calls = 10, no_checklist = 0;
  lua_settop(L, 3);
  memset(&R, 0, sizeof R);
  lfl_viz_opts(L, 3, &R.o, report_keys, "report");
  viz_report_init(&R.r);
  if (lua_istable(L, 3)) {
    R.r.title = lfl_viz_opt_str(L, 3, "title", "report");
    R.r.subtitle = lfl_viz_opt_str(L, 3, "subtitle", "report");
    R.o.title = NULL;   /* the report's title, not the pictures' */
    switch (lua_getfield(L, 3, "inputs")) {
    case LUA_TNIL: lua_pop(L, 1); break;
    case LUA_TTABLE: inputs = lua_gettop(L); break;
    default: luaL_error(L, "report: option inputs must be a list of the function's arguments, "
                        "got %s", lfl_viz_typeof(L, -1));
    }
    switch (lua_getfield(L, 3, "checklist")) {
    case LUA_TNIL: lua_pop(L, 1); break;
    case LUA_TTABLE: checklist = lua_gettop(L); break;
    case LUA_TBOOLEAN: no_checklist = !lua_toboolean(L, -1); lua_pop(L, 1); break;
    default: luaL_error(L, "report: option checklist must be true, false or the table fl.checklist "
                        "returns, got %s", lfl_viz_typeof(L, -1));
    }
    if (lua_getfield(L, 3, "calls") != LUA_TNIL) {
      if (!lua_isinteger(L, -1) || lua_tointeger(L, -1) < 1 || lua_tointeger(L, -1) > MAX_CALLS)
        luaL_error(L, "report: option calls must be an integer from 1 to %d, got %s", MAX_CALLS,
                   luaL_tolstring(L, -1, NULL));
      calls = (int)lua_tointeger(L, -1);
    }
    lua_pop(L, 1);
  }
  lua_newtable(L);
  R.keep = lua_gettop(L);
  R.s = lfl_viz_scratch_new(L);
  kind = lfl_viz_kind(L, 1);
  if (kind == LFL_VIZ_COMPILED) report_compiled(L, &R, 1, inputs, calls);
  else if (kind == LFL_VIZ_PLAN || kind == LFL_VIZ_PROGRAM || kind == LFL_VIZ_GRAPH)
    report_plan(L, &R, 1, kind, inputs, calls);
  else
    luaL_error(L, "report: cannot report on a %s (expected a compiled function, a Plan, "
               "a Program or a Graph)", lfl_viz_typeof(L, 1));
  if (!checklist && !no_checklist && kind == LFL_VIZ_COMPILED) {
    /* the checklist belongs on the page: run on inputs like the last call's */
    if (run_checklist(L, 1)) {
      lua_pop(L, 1);
      checklist = lua_gettop(L);
    } else {
      R.r.recommendation = lua_pushfstring(L, "The go-live checklist could not run here: %s",
                                           lua_isstring(L, -1) ? lua_tostring(L, -1) : "no reason given");
      lfl_viz_keep(L, R.keep);
    }
  }
  if (checklist) fill_checklist(L, &R, checklist);
  verdict(L, &R);
  R.r.summary = R.summary;
  R.r.nsummary = R.nsum;
  R.r.steps = R.steps;
  R.r.nsteps = R.nsteps;
  err_clear(&e);
  if (viz_report_write(&R.r, path, &e) != FL_OK) return lfl_viz_raise(L, "report", &e);
  lua_pushvalue(L, 2);
  return 1;
}
