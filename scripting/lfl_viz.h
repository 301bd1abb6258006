/*
** lfl_viz.h -- what fl.draw (lfl_viz.c) and fl.report (lfl_report.c)
** share: the scratch that owns a call's C temporaries, the stages a Lua
** value stands for, and the picture options.
**
** Conventions: every function that can fail raises a Lua error naming
** `what` ("draw", "report"...); what it allocated is the scratch's, which
** is to-be-closed, so raising never leaks.  Strings handed to the C layer
** are anchored in a `keep` table on the stack (lfl_viz_keep).
*/
#ifndef LFL_VIZ_H
#define LFL_VIZ_H

#include "lfl.h"
#include "fuse/plan.h"
#include "viz/draw.h"
#include "exec/program.h"
#include "viz/plan.h"

#define LFL_VIZ_MAX_STAGES 256   /* graphs in one picture */

/* What C allocated for one call; freed when the call returns or unwinds. */
typedef struct lfl_viz_scratch {
  viz_plan_stage *ps;        /* initialised plan stages */
  int nps, cps;
  viz_plan_report pr;        /* a report filled from one plan */
  int has_pr;                /* pr is filled (and freed with the rest) */
  void **mem;                /* malloc'd blocks: arrays, SVG text */
  int nmem, cmem;
} lfl_viz_scratch;

/* The stages one Lua value stands for. */
typedef struct lfl_viz_list {
  viz_stage *st;             /* LFL_VIZ_MAX_STAGES of them */
  const fuse_plan **plan;    /* per stage: its plan, NULL for a plain graph */
  viz_break *br;             /* br[i] between stage i and i + 1 */
  int n;
  int pieces;                /* the stages are pieces of one function */
} lfl_viz_list;

/* Kinds of drawable values (lfl_viz_kind). */
enum { LFL_VIZ_NONE, LFL_VIZ_GRAPH, LFL_VIZ_PLAN, LFL_VIZ_PROGRAM, LFL_VIZ_COMPILED,
       LFL_VIZ_EXPLAIN, LFL_VIZ_LIST };

/* Pushes a new scratch, closed when the calling C function returns. */
lfl_viz_scratch *lfl_viz_scratch_new(lua_State *L);
/* Room for one more block, so a block the C layer makes next is kept. */
void lfl_viz_reserve(lua_State *L, lfl_viz_scratch *s, const char *what);
/* n zeroed bytes owned by the scratch. */
void *lfl_viz_alloc(lua_State *L, lfl_viz_scratch *s, size_t n, const char *what);
/* The string on top of the stack, anchored in the table at keep (popped). */
const char *lfl_viz_keep(lua_State *L, int keep);
/* The value's type as a user knows it: "fl.Plan", "number". */
const char *lfl_viz_typeof(lua_State *L, int idx);
/* Raises e's message as what's (the C layer names itself "draw"). */
int lfl_viz_raise(lua_State *L, const char *what, const fl_err *e);
/* Picture options from the table at idx (nil: defaults); keys allowed. */
void lfl_viz_opts(lua_State *L, int idx, viz_opts *o, const char *const *keys,
                  const char *what);
/* A string option borrowed from the table at idx, or NULL. */
const char *lfl_viz_opt_str(lua_State *L, int idx, const char *key, const char *what);

void lfl_viz_list_init(lua_State *L, lfl_viz_scratch *s, lfl_viz_list *l, const char *what);
void lfl_viz_add_stage(lua_State *L, lfl_viz_list *l, const viz_stage *st, const fuse_plan *p,
                       const char *what);
/* p as a stage with its kernels (label NULL: the plan's own); pr, p's
** program or NULL, adds where values are kept in a blocked layout. */
void lfl_viz_add_plan(lua_State *L, lfl_viz_scratch *s, lfl_viz_list *l, const fuse_plan *p,
                      const exec_program *pr, const char *label, const char *what);
/* What kind of stage the value at idx is (LFL_VIZ_NONE: not drawable). */
int lfl_viz_kind(lua_State *L, int idx);
/* The plan of the Plan or Program at idx. */
const fuse_plan *lfl_viz_plan_at(lua_State *L, int idx, const char *what);
/* Appends the stages the value at idx stands for (raises when none). */
void lfl_viz_collect(lua_State *L, lfl_viz_scratch *s, int keep, int idx, lfl_viz_list *l,
                     const char *what);
/* A scene of l: pieces with their breaks, else side by side. */
void lfl_viz_scene(viz_scene *sc, const lfl_viz_list *l);

/* fl.report(cm_or_plan, path [, opts]) (lfl_report.c). */
int lfl_viz_report(lua_State *L);

#endif
