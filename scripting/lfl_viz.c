/*
** lfl_viz.c -- pictures from Lua:
**   fl.draw(stage, "g.svg", opts)                 any stage; format from the extension
**   fl.draw_compare(before, after, "c.png", opts)  two stages side by side
** (fl.report is in lfl_report.c.)  A stage is whatever the pipeline hands a
** user: a Graph, a Plan, a Program (drawn as its plan), a compiled
** function (its graphs, as the pieces of one function when it had graph
** breaks), the table fl.explain returns, or a list of Graphs, Plans and
** Programs (side by side).
**
** Invariant: every C temporary made here (plan stages, stage arrays)
** belongs to one scratch userdata marked to-be-closed, so an error raised
** anywhere releases them as it unwinds.  Strings handed to the C layer are
** anchored in a `keep` table on the stack, so none is collected while C
** borrows it.
*/
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lfl_viz.h"
#include "cpu/backend.h"

#define SCRATCH_TYPE "fl.VizScratch"

/* ---- scratch: what C allocated for one call ---------------------------- */

static void scratch_release(lfl_viz_scratch *s) {
  int i;
  for (i = 0; i < s->nps; i++) viz_plan_stage_free(&s->ps[i]);
  free(s->ps);
  if (s->has_pr) viz_plan_report_free(&s->pr);
  for (i = 0; i < s->nmem; i++) free(s->mem[i]);
  free(s->mem);
  memset(s, 0, sizeof *s);
}

/* __gc and __close: idempotent (release leaves an empty scratch). */
static int scratch_gc(lua_State *L) {
  scratch_release((lfl_viz_scratch *)luaL_checkudata(L, 1, SCRATCH_TYPE));
  return 0;
}

/* Pushes a new scratch, to be closed when the calling C function returns
** or unwinds. */
lfl_viz_scratch *lfl_viz_scratch_new(lua_State *L) {
  lfl_viz_scratch *s = (lfl_viz_scratch *)lua_newuserdatauv(L, sizeof *s, 0);
  memset(s, 0, sizeof *s);
  luaL_setmetatable(L, SCRATCH_TYPE);
  lua_toclose(L, -1);
  return s;
}

/* Room for one more block, so a block made next is never lost. */
void lfl_viz_reserve(lua_State *L, lfl_viz_scratch *s, const char *what) {
  if (s->nmem == s->cmem) {
    int c = s->cmem ? 2 * s->cmem : 16;
    void **m = (void **)realloc(s->mem, (size_t)c * sizeof *m);
    if (!m) luaL_error(L, "%s: out of memory", what);
    s->mem = m;
    s->cmem = c;
  }
}

/* n zeroed bytes owned by the scratch. */
void *lfl_viz_alloc(lua_State *L, lfl_viz_scratch *s, size_t n, const char *what) {
  void *p;
  lfl_viz_reserve(L, s, what);
  p = calloc(1, n ? n : 1);
  if (!p) luaL_error(L, "%s: out of memory (%zu bytes)", what, n);
  s->mem[s->nmem++] = p;
  return p;
}

/* p as a drawable stage (kernels as clusters); the stage's arrays belong
** to the scratch, the plan stays borrowed. */
static viz_stage scratch_plan(lua_State *L, lfl_viz_scratch *s, const fuse_plan *p,
                              const char *what) {
  fl_err e;
  if (s->nps == s->cps) {
    int c = s->cps ? 2 * s->cps : 4;
    viz_plan_stage *ps = (viz_plan_stage *)realloc(s->ps, (size_t)c * sizeof *ps);
    if (!ps) luaL_error(L, "%s: out of memory", what);
    s->ps = ps;
    s->cps = c;
  }
  err_clear(&e);
  if (viz_plan_stage_init(&s->ps[s->nps], p, NULL, &e) != FL_OK) lfl_raise(L, what, &e);
  return s->ps[s->nps++].st;
}

/* The string on top of the stack, anchored in the table at keep (popped). */
const char *lfl_viz_keep(lua_State *L, int keep) {
  const char *p = lua_tostring(L, -1);
  lua_rawseti(L, keep, (lua_Integer)lua_rawlen(L, keep) + 1);
  return p;
}

/* The value's type as a user knows it: "fl.Plan", "number", "table". */
const char *lfl_viz_typeof(lua_State *L, int idx) {
  const char *name = NULL;
  if (luaL_getmetafield(L, idx, "__name") != LUA_TNIL) {
    if (lua_type(L, -1) == LUA_TSTRING) name = lua_tostring(L, -1);
    lua_pop(L, 1);  /* the metatable keeps the string alive */
  }
  return name ? name : luaL_typename(L, idx);
}

/* Raise e's message as `what`'s: the C layer says "draw: ..." and
** "report: ..." for every caller; fl.draw_compare wants its own name. */
int lfl_viz_raise(lua_State *L, const char *what, const fl_err *e) {
  const char *msg = e->msg;
  size_t n = strlen(what);
  if (strncmp(msg, what, n) == 0 && msg[n] == ':') return luaL_error(L, "%s", msg);
  if (strncmp(msg, "draw: ", 6) == 0) msg += 6;
  else if (strncmp(msg, "report: ", 8) == 0) msg += 8;
  return luaL_error(L, "%s: %s", what, msg[0] ? msg : "failed (no reason given)");
}

/* ---- options ----------------------------------------------------------- */

static const char *const draw_keys[] = {
  "rankdir", "title", "legend", "group_modules", "max_nodes", "edge_labels", "scale",
  "kernel", "around", "depth", "block", "weights", "leaves", "partition", NULL
};

/* "projector", "normal" or a number from 0.25 to 4: the picture's type and
** line size.  s is what the user gave (an option or $FUSELAB_DRAW_SCALE). */
static int parse_scale(const char *s, double *out) {
  char *end;
  double v;
  if (strcmp(s, "projector") == 0) { *out = VIZ_SCALE_PROJECTOR; return 1; }
  if (strcmp(s, "normal") == 0 || s[0] == '\0') { *out = 1.0; return 1; }
  v = strtod(s, &end);
  if (*end || !(v >= 0.25 && v <= 4)) return 0;
  *out = v;
  return 1;
}

/* The scale option at idx (a string or a number), else $FUSELAB_DRAW_SCALE
** (the REPL's :projector sets it), else 1. */
static double opt_scale(lua_State *L, int idx, const char *what) {
  double v = 1.0;
  const char *env = getenv("FUSELAB_DRAW_SCALE");
  int t = idx ? lua_getfield(L, idx, "scale") : LUA_TNIL;
  if (t == LUA_TNUMBER) {
    v = lua_tonumber(L, -1);
    if (!(v >= 0.25 && v <= 4))
      luaL_error(L, "%s: scale %s (expected \"projector\", \"normal\" or a number from 0.25 "
                 "to 4)", what, lua_tostring(L, -1));
  } else if (t == LUA_TSTRING) {
    if (!parse_scale(lua_tostring(L, -1), &v))
      luaL_error(L, "%s: scale \"%s\" (expected \"projector\", \"normal\" or a number from "
                 "0.25 to 4)", what, lua_tostring(L, -1));
  } else if (t != LUA_TNIL) {
    luaL_error(L, "%s: option scale must be a string or a number, got %s", what,
               lfl_viz_typeof(L, -1));
  } else if (env && !parse_scale(env, &v)) {
    v = 1.0;   /* a bad variable is ignored: it must not break every picture */
  }
  if (idx) lua_pop(L, 1);
  return v;
}

/* An integer option from lo to hi; def when absent. */
static int opt_int(lua_State *L, int idx, const char *key, int def, int lo, int hi, const char *what) {
  int v = def;
  if (lua_getfield(L, idx, key) != LUA_TNIL) {
    if (!lua_isinteger(L, -1) || lua_tointeger(L, -1) < lo || lua_tointeger(L, -1) > hi)
      luaL_error(L, "%s: option %s must be an integer from %d to %d, got %s", what, key, lo, hi,
                 luaL_tolstring(L, -1, NULL));
    v = (int)lua_tointeger(L, -1);
  }
  lua_pop(L, 1);
  return v;
}

static int opt_bool(lua_State *L, int idx, const char *key, int def, const char *what) {
  int v = def;
  int t = lua_getfield(L, idx, key);
  if (t == LUA_TBOOLEAN) v = lua_toboolean(L, -1);
  else if (t != LUA_TNIL)
    luaL_error(L, "%s: option %s must be true or false, got %s", what, key, lfl_viz_typeof(L, -1));
  lua_pop(L, 1);
  return v;
}

/* A string option, borrowed from the options table (which stays on the
** stack for the call); NULL when absent. */
const char *lfl_viz_opt_str(lua_State *L, int idx, const char *key, const char *what) {
  const char *v = NULL;
  int t = lua_getfield(L, idx, key);
  if (t == LUA_TSTRING) v = lua_tostring(L, -1);
  else if (t != LUA_TNIL)
    luaL_error(L, "%s: option %s must be a string, got %s", what, key, lfl_viz_typeof(L, -1));
  lua_pop(L, 1);
  return v;
}

/* The picture options of the table at idx (nil: the defaults). */
void lfl_viz_opts(lua_State *L, int idx, viz_opts *o, const char *const *keys,
                       const char *what) {
  viz_opts_init(o);
  if (lua_isnoneornil(L, idx)) {
    o->scale = opt_scale(L, 0, what);
    return;
  }
  if (!lua_istable(L, idx))
    luaL_error(L, "%s: options must be a table, got %s", what, lfl_viz_typeof(L, idx));
  lfl_checkkeys(L, idx, keys, what);
  o->scale = opt_scale(L, idx, what);
  o->rankdir = lfl_viz_opt_str(L, idx, "rankdir", what);
  if (!o->rankdir) o->rankdir = "TB";
  else if (strcmp(o->rankdir, "TB") != 0 && strcmp(o->rankdir, "LR") != 0)
    luaL_error(L, "%s: rankdir \"%s\" (expected \"TB\" or \"LR\")", what, o->rankdir);
  o->title = lfl_viz_opt_str(L, idx, "title", what);
  o->legend = opt_bool(L, idx, "legend", o->legend, what);
  o->group_modules = opt_bool(L, idx, "group_modules", o->group_modules, what);
  o->edge_labels = opt_bool(L, idx, "edge_labels", o->edge_labels, what);
  lua_getfield(L, idx, "max_nodes");
  if (lua_type(L, -1) == LUA_TBOOLEAN && !lua_toboolean(L, -1))
    o->max_nodes = -1;                  /* false: never collapse */
  else if (!lua_isnil(L, -1)) {
    if (!lua_isinteger(L, -1) || lua_tointeger(L, -1) < 1 || lua_tointeger(L, -1) > 1000000)
      luaL_error(L, "%s: max_nodes must be an integer from 1 to 1000000 (or false: never "
                 "collapse), got %s", what, luaL_tolstring(L, -1, NULL));
    o->max_nodes = (int)lua_tointeger(L, -1);
  }
  lua_pop(L, 1);
  /* a piece of a big graph: one kernel, a node's neighbourhood, a block */
  if (lua_getfield(L, idx, "kernel") == LUA_TNUMBER && lua_isinteger(L, -1)) {
    static char kname[32];                      /* k15: read before the next call */
    snprintf(kname, sizeof kname, "k%lld", (long long)lua_tointeger(L, -1));
    o->focus_kernel = kname;
  } else {
    o->focus_kernel = lfl_viz_opt_str(L, idx, "kernel", what);
  }
  lua_pop(L, 1);
  o->focus_around = opt_int(L, idx, "around", -1, 0, 100000000, what);
  o->focus_depth = opt_int(L, idx, "depth", 2, 0, 1000, what);
  o->focus_block = opt_int(L, idx, "block", -1, 0, 100000000, what);
  o->weights_box = opt_bool(L, idx, "weights", 1, what) ? 1 : 0;
  {
    const char *lv = lfl_viz_opt_str(L, idx, "leaves", what);
    if (lv && strcmp(lv, "inline") != 0 && strcmp(lv, "boxes") != 0)
      luaL_error(L, "%s: leaves \"%s\" (expected \"inline\" or \"boxes\")", what, lv);
    o->inline_leaves = !lv ? -1 : lv[0] == 'i';
  }
  o->partition = lfl_viz_opt_str(L, idx, "partition", what);
  if (!!o->focus_kernel + (o->focus_around >= 0) + (o->focus_block >= 0) > 1)
    luaL_error(L, "%s: kernel=, around= and block= each draw a piece: give one of them", what);
}

/* ---- stages ------------------------------------------------------------- */

void lfl_viz_list_init(lua_State *L, lfl_viz_scratch *s, lfl_viz_list *l, const char *what) {
  l->st = (viz_stage *)lfl_viz_alloc(L, s, LFL_VIZ_MAX_STAGES * sizeof *l->st, what);
  l->plan = (const fuse_plan **)lfl_viz_alloc(L, s, LFL_VIZ_MAX_STAGES * sizeof *l->plan, what);
  l->br = (viz_break *)lfl_viz_alloc(L, s, LFL_VIZ_MAX_STAGES * sizeof *l->br, what);
  l->n = 0;
  l->pieces = 0;
}

void lfl_viz_add_stage(lua_State *L, lfl_viz_list *l, const viz_stage *st, const fuse_plan *p,
                      const char *what) {
  if (l->n >= LFL_VIZ_MAX_STAGES) luaL_error(L, "%s: more than %d graphs in one picture", what, LFL_VIZ_MAX_STAGES);
  l->plan[l->n] = p;
  l->st[l->n++] = *st;
}

static void add_graph(lua_State *L, lfl_viz_list *l, const ir_graph *g, const char *label,
                      const char *what) {
  viz_stage st;
  memset(&st, 0, sizeof st);
  st.g = g;
  st.label = label;
  lfl_viz_add_stage(L, l, &st, NULL, what);
}

/* Where pr keeps values in a blocked layout (its backend's layout hook;
** the cpu's nChw8c between convolutions): the kernels writing one and the
** values they write name it, so a picture shows where layouts change. */
static void program_layouts(lua_State *L, lfl_viz_scratch *s, viz_stage *st, viz_kernel *kn,
                            const exec_program *pr, const char *what) {
  const fuse_plan *p = pr->plan;
  const char **lay = NULL;
  char buf[128], *name;
  int k, j;
  if (!pr->be->layout || p->g != st->g) return;
  for (k = 0; k < p->nkernels; k++) {
    const fk_kernel *kr = &p->kernels[k];
    size_t n;
    if (!pr->be->layout(pr, k, buf, sizeof buf)) continue;
    n = strcspn(buf, " ");          /* "nChw8c (blocks of 8 channels, ...)" */
    if (!lay) lay = (const char **)lfl_viz_alloc(L, s, (size_t)p->g->n * sizeof *lay, what);
    name = (char *)lfl_viz_alloc(L, s, n + 1, what);
    memcpy(name, buf, n);
    kn[k].layout = name;
    for (j = kr->nin; j < kr->nbufs; j++) lay[kr->bufs[j]] = name;
  }
  /* and where blocks end: a kernel reading one and writing plain */
  for (k = 0; lay && k < p->nkernels; k++)
    for (j = 0; !kn[k].layout && j < p->kernels[k].nin; j++)
      if (lay[p->kernels[k].bufs[j]]) kn[k].layout = "nchw (out of blocks)";
  st->layout = lay;
}

void lfl_viz_add_plan(lua_State *L, lfl_viz_scratch *s, lfl_viz_list *l, const fuse_plan *p,
                     const exec_program *pr, const char *label, const char *what) {
  viz_stage st = scratch_plan(L, s, p, what);
  if (pr) program_layouts(L, s, &st, s->ps[s->nps - 1].kernels, pr, what);
  if (label) st.label = label;
  lfl_viz_add_stage(L, l, &st, p, what);
}

/* What kind of stage the value at idx is (LFL_VIZ_NONE: not drawable). */
int lfl_viz_kind(lua_State *L, int idx) {
  int k = LFL_VIZ_NONE;
  if (luaL_testudata(L, idx, "fl.Graph")) return LFL_VIZ_GRAPH;
  if (luaL_testudata(L, idx, "fl.Plan")) return LFL_VIZ_PLAN;
  if (luaL_testudata(L, idx, "fl.Program")) return LFL_VIZ_PROGRAM;
  if (luaL_testudata(L, idx, "fl.Compiled")) return LFL_VIZ_COMPILED;
  if (!lua_istable(L, idx)) return LFL_VIZ_NONE;
  if (lua_getfield(L, idx, "graphs") == LUA_TTABLE) k = LFL_VIZ_EXPLAIN;
  lua_pop(L, 1);
  if (k == LFL_VIZ_NONE && lua_rawlen(L, idx) > 0) k = LFL_VIZ_LIST;
  return k;
}

/* The program at idx, or NULL for a Plan. */
static const exec_program *program_at(lua_State *L, int idx) {
  return luaL_testudata(L, idx, "fl.Program") ? lfl_toprogram(L, idx) : NULL;
}

/* The plan of a Plan or Program at idx. */
const fuse_plan *lfl_viz_plan_at(lua_State *L, int idx, const char *what) {
  if (luaL_testudata(L, idx, "fl.Plan")) {
    const fuse_plan *p = lfl_toplan(L, idx);
    if (!p) luaL_error(L, "%s: the plan has been released", what);
    return p;
  } else {
    const exec_program *pr = lfl_toprogram(L, idx);
    if (!pr) luaL_error(L, "%s: the program has been released", what);
    return pr->plan;
  }
}

/* One break between pieces, from a {reason=, where=} table (or a generic
** one when the function recorded fewer breaks than it has cuts). */
static void set_break(lua_State *L, int keep, viz_break *b, int reasons, lua_Integer k) {
  b->reason = "graph break";
  b->where = NULL;
  if (reasons && lua_rawgeti(L, reasons, k) == LUA_TTABLE) {
    if (lua_getfield(L, -1, "reason") == LUA_TSTRING) b->reason = lfl_viz_keep(L, keep);
    else lua_pop(L, 1);
    if (lua_getfield(L, -1, "where") == LUA_TSTRING) b->where = lfl_viz_keep(L, keep);
    else lua_pop(L, 1);
  }
  if (reasons) lua_pop(L, 1);
}

/* The breaks between the last n stages of l from the reasons array at
** `reasons` (0: none known).  A function's breaks come in program order,
** so the first n - 1 fall between its n pieces. */
static void set_pieces(lua_State *L, int keep, lfl_viz_list *l, int first, int reasons) {
  int i;
  for (i = first; i + 1 < l->n; i++) set_break(L, keep, &l->br[i], reasons, i - first + 1);
  l->pieces = l->n - first > 1;
}

/* A compiled function's graphs, each as its fused plan when it has one
** (matched by fingerprint: the plan holds a copy of the graph) or as the
** plain graph (it runs on the eager kernels).  Several graphs are the
** pieces of one function when it had graph breaks and never recompiled;
** otherwise they are the versions recompilation made, side by side. */
static void collect_compiled(lua_State *L, lfl_viz_scratch *s, int keep, int idx, lfl_viz_list *l,
                             const char *what) {
  int top = lua_gettop(L), state, graphs, plans, programs, stats, reasons, first = l->n;
  lua_Integer ng, np, i, j, nbreaks, recompiles;
  char (*fp)[33];
  char hex[33];
  lua_getfield(L, idx, "state");
  state = lua_gettop(L);
  luaL_checktype(L, state, LUA_TTABLE);
  lua_getfield(L, state, "graphs");
  graphs = lua_gettop(L);
  lua_getfield(L, state, "plans");
  plans = lua_gettop(L);
  programs = lua_getfield(L, state, "programs") == LUA_TTABLE ? lua_gettop(L) : 0;
  lua_getfield(L, state, "stats");
  stats = lua_gettop(L);
  if (!lua_istable(L, graphs) || !lua_istable(L, plans) || !lua_istable(L, stats))
    luaL_error(L, "%s: the compiled function's state is incomplete", what);
  ng = luaL_len(L, graphs);
  np = luaL_len(L, plans);
  if (ng == 0) {
    lua_getfield(L, idx, "calls");
    if (lua_tointeger(L, -1) == 0)
      luaL_error(L, "%s: the compiled function has not run yet, so there is no graph: "
                 "call it once first", what);
    luaL_error(L, "%s: the compiled function captured no graph (backend \"eager\", or "
               "no tensor operation)", what);
  }
  fp = (char (*)[33])lfl_viz_alloc(L, s, (size_t)(np ? np : 1) * sizeof *fp, what);
  for (j = 0; j < np; j++) {
    const fuse_plan *p;
    lua_rawgeti(L, plans, j + 1);
    p = lfl_toplan(L, -1);
    if (p) ir_fingerprint(p->g, fp[j]);
    else fp[j][0] = '\0';
    lua_pop(L, 1);
  }
  lua_getfield(L, stats, "break_reasons");
  reasons = lua_istable(L, -1) ? lua_gettop(L) : 0;
  nbreaks = reasons ? luaL_len(L, reasons) : 0;
  lua_getfield(L, stats, "recompiles");
  recompiles = lua_tointeger(L, -1);
  lua_pop(L, 1);
  for (i = 0; i < ng; i++) {
    const fuse_plan *p = NULL;
    const exec_program *pr = NULL;
    const char *label = NULL;
    const ir_graph *g;
    lua_rawgeti(L, graphs, i + 1);
    g = lfl_checkgraph(L, -1);
    ir_fingerprint(g, hex);
    for (j = 0; j < np && !p; j++)
      if (strcmp(fp[j], hex) == 0) {
        lua_rawgeti(L, plans, j + 1);
        p = lfl_toplan(L, -1);
        lua_pop(L, 1);
        if (programs) {     /* the program built from it, same index */
          lua_rawgeti(L, programs, j + 1);
          pr = program_at(L, -1);
          lua_pop(L, 1);
        }
      }
    if (ng > 1 && nbreaks > 0 && recompiles == 0) {
      lua_pushstring(L, p ? "fused" : "runs on the eager kernels");
      label = lfl_viz_keep(L, keep);
    } else if (ng > 1) {
      lua_pushfstring(L, "graph %d of %d%s", (int)(i + 1), (int)ng, p ? "" : " (eager kernels)");
      label = lfl_viz_keep(L, keep);
    } else if (!p) {
      lua_pushstring(L, "runs on the eager kernels");
      label = lfl_viz_keep(L, keep);
    }
    if (p) lfl_viz_add_plan(L, s, l, p, pr, label, what);
    else add_graph(L, l, g, label, what);
    lua_pop(L, 1);
  }
  if (nbreaks > 0 && recompiles == 0) set_pieces(L, keep, l, first, reasons);
  lua_settop(L, top);
}

/* Appends the stages the value at idx stands for to l. */
void lfl_viz_collect(lua_State *L, lfl_viz_scratch *s, int keep, int idx, lfl_viz_list *l,
                    const char *what) {
  int first = l->n, top = lua_gettop(L), kind = lfl_viz_kind(L, idx);
  lua_Integer i, n;
  idx = lua_absindex(L, idx);
  switch (kind) {
  case LFL_VIZ_GRAPH:
    add_graph(L, l, lfl_checkgraph(L, idx), NULL, what);
    break;
  case LFL_VIZ_PLAN: case LFL_VIZ_PROGRAM:
    lfl_viz_add_plan(L, s, l, lfl_viz_plan_at(L, idx, what), program_at(L, idx), NULL, what);
    break;
  case LFL_VIZ_COMPILED:
    collect_compiled(L, s, keep, idx, l, what);
    break;
  case LFL_VIZ_EXPLAIN:   /* fl.explain's table: its graphs are the pieces */
    lua_getfield(L, idx, "graphs");
    n = luaL_len(L, -1);
    if (n == 0) luaL_error(L, "%s: fl.explain found no graph to draw", what);
    for (i = 1; i <= n; i++) {
      if (lua_rawgeti(L, -1, i) != LUA_TUSERDATA || !luaL_testudata(L, -1, "fl.Graph"))
        luaL_error(L, "%s: explain table: graphs[%d] is a %s, not a Graph", what, (int)i,
                   lfl_viz_typeof(L, -1));
      add_graph(L, l, lfl_checkgraph(L, -1), NULL, what);
      lua_pop(L, 1);
    }
    lua_getfield(L, idx, "break_reasons");
    set_pieces(L, keep, l, first, lua_istable(L, -1) ? lua_gettop(L) : 0);
    break;
  case LFL_VIZ_LIST:      /* {g, p, ...}: side by side */
    n = (lua_Integer)lua_rawlen(L, idx);
    for (i = 1; i <= n; i++) {
      int k;
      lua_rawgeti(L, idx, i);
      k = lfl_viz_kind(L, -1);
      if (k != LFL_VIZ_GRAPH && k != LFL_VIZ_PLAN && k != LFL_VIZ_PROGRAM)
        luaL_error(L, "%s: list item %d is a %s (expected a Graph, Plan or Program)", what,
                   (int)i, lfl_viz_typeof(L, -1));
      if (k == LFL_VIZ_GRAPH) add_graph(L, l, lfl_checkgraph(L, -1), NULL, what);
      else lfl_viz_add_plan(L, s, l, lfl_viz_plan_at(L, -1, what), program_at(L, -1), NULL, what);
      lua_pop(L, 1);
    }
    break;
  default:
    if (lfl_ag_push_graph(L, idx)) {     /* a tensor's tape: its backward graph */
      lua_pushvalue(L, -1);
      luaL_ref(L, keep);
      add_graph(L, l, lfl_checkgraph(L, -1), NULL, what);
      break;
    }
    luaL_error(L, "%s: cannot draw a %s (expected a Graph, Plan, Program, compiled "
               "function, a tensor with a grad_fn or the table fl.explain returns%s)",
               what, lfl_viz_typeof(L, idx),
               lua_istable(L, idx) ? "; a module is drawn from its graph: "
               "fl.draw(fl.capture(model, x), path)" : "");
  }
  lua_settop(L, top);
}

void lfl_viz_scene(viz_scene *sc, const lfl_viz_list *l) {
  memset(sc, 0, sizeof *sc);
  sc->stages = l->st;
  sc->nstages = l->n;
  sc->breaks = l->pieces ? l->br : NULL;
  sc->compare = !l->pieces && l->n > 1;
}

/* fl.draw(stage, path [, opts]) -> path */
static int l_draw(lua_State *L) {
  const char *path = luaL_checkstring(L, 2);
  viz_opts o;
  viz_scene sc;
  lfl_viz_list l;
  lfl_viz_scratch *s;
  fl_err e;
  int keep;
  lua_settop(L, 3);
  lfl_viz_opts(L, 3, &o, draw_keys, "draw");
  lua_newtable(L);
  keep = lua_gettop(L);
  s = lfl_viz_scratch_new(L);
  lfl_viz_list_init(L, s, &l, "draw");
  lfl_viz_collect(L, s, keep, 1, &l, "draw");
  lfl_viz_scene(&sc, &l);
  err_clear(&e);
  if (viz_render_file(&sc, path, &o, &e) != FL_OK) return lfl_raise(L, "draw", &e);
  lua_pushvalue(L, 2);
  return 1;
}

/* fl.draw_compare(before, after, path [, opts]) -> path: each side one
** stage, titled with its kernels, buffers and bytes moved. */
static int l_draw_compare(lua_State *L) {
  static const char *const side[2] = {"before", "after"};
  const char *path = luaL_checkstring(L, 3);
  viz_opts o;
  lfl_viz_list l;
  lfl_viz_scratch *s;
  fl_err e;
  const char *pol[2] = {NULL, NULL};
  int keep, i;
  lua_settop(L, 4);
  lua_newtable(L);
  keep = lua_gettop(L);
  /* partition = {"save_all", "mincut"}: one policy per side (a joint graph
  ** each); the options are read without it */
  if (lua_istable(L, 4) && lua_getfield(L, 4, "partition") == LUA_TTABLE) {
    lua_pushvalue(L, 4);
    lua_rawseti(L, keep, 1);               /* the strings stay anchored */
    for (i = 0; i < 2; i++) {
      if (lua_rawgeti(L, -1, i + 1) != LUA_TSTRING)
        luaL_error(L, "draw_compare: partition = {before's, after's}: two policy names "
                   "(mincut, save_all or recompute_all)");
      pol[i] = lua_tostring(L, -1);
      lua_pop(L, 1);
    }
    lua_pop(L, 1);
    lua_newtable(L);                        /* opts without partition */
    lua_pushnil(L);
    while (lua_next(L, 4)) {
      if (!(lua_type(L, -2) == LUA_TSTRING && strcmp(lua_tostring(L, -2), "partition") == 0)) {
        lua_pushvalue(L, -2);
        lua_insert(L, -2);
        lua_rawset(L, -4);
      } else {
        lua_pop(L, 1);
      }
    }
    lua_replace(L, 4);
  } else if (lua_istable(L, 4)) {
    lua_pop(L, 1);
  }
  lfl_viz_opts(L, 4, &o, draw_keys, "draw_compare");
  s = lfl_viz_scratch_new(L);
  lfl_viz_list_init(L, s, &l, "draw_compare");
  for (i = 0; i < 2; i++) {
    int n0 = l.n;
    if (lfl_viz_kind(L, i + 1) == LFL_VIZ_NONE)
      luaL_error(L, "draw_compare: cannot draw %s, a %s (expected a Graph, Plan, Program or "
                 "compiled function)", side[i], lfl_viz_typeof(L, i + 1));
    lfl_viz_collect(L, s, keep, i + 1, &l, "draw_compare");
    if (l.n - n0 != 1)
      luaL_error(L, "draw_compare: %s is a %s of %d graphs: compare one at a time (cm:plans()[i])",
                 side[i], lfl_viz_typeof(L, i + 1), l.n - n0);
  }
  for (i = 0; i < 2; i++)
    if ((l.st[i].partition = pol[i]) != NULL && !l.st[i].label) l.st[i].label = "joint graph";
  err_clear(&e);
  if (viz_draw_compare(&l.st[0], &l.st[1], path, &o, &e) != FL_OK)
    return lfl_viz_raise(L, "draw_compare", &e);
  lua_pushvalue(L, 3);
  return 1;
}

static const luaL_Reg viz_funcs[] = {
  {"draw", l_draw}, {"draw_compare", l_draw_compare}, {"report", lfl_viz_report},
  {NULL, NULL}
};

/* fl.draw_memory and p:memory (lfl_memory.c) */
void lfl_open_memory(lua_State *L, int lib);

void lfl_open_viz(lua_State *L, int lib) {
  lib = lua_absindex(L, lib);
  if (luaL_newmetatable(L, SCRATCH_TYPE)) {
    lua_pushcfunction(L, scratch_gc);
    lua_setfield(L, -2, "__gc");
    lua_pushcfunction(L, scratch_gc);
    lua_setfield(L, -2, "__close");
  }
  lua_pop(L, 1);
  lua_pushvalue(L, lib);
  luaL_setfuncs(L, viz_funcs, 0);
  lua_pop(L, 1);
  lfl_open_memory(L, lib);
}
