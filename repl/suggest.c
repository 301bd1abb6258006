/*
** suggest.c -- "did you mean decompose?" after an error that names a
** misspelt method, field or global.
**
** Lua says which name was nil (`attempt to call a nil value (method
** 'decompse')`); the names it could have been are the ones Tab completion
** offers (complete.c enumerates them, so there is one source of names):
** for a method call, those of the receiver when the erroring frame still
** holds it; else those of fuselab's objects -- every metatable fuselab
** registers (fl.Tensor, fl.Graph, fl.Plan, fl.Program, fl.Compiled, ...),
** the fl table, the tables in it (fl.nn, fl.models) and their classes;
** for a global, the globals.  A suggestion is made only when a name is
** close (a couple of edits, or the typed name is the start of it) and no
** name is exactly the one typed (then the name was right and its value
** nil, as an unset x.grad).  Otherwise the message is left as it was.
*/
#include "config.h"

#include <ctype.h>
#include <stdio.h>
#include <string.h>

#include <lua.h>
#include <lauxlib.h>

#include "repl/repl.h"

#define WORD_MAX 64    /* longer names are neither matched nor offered */
#define NBEST 3        /* names offered at most */

/* --- distance ------------------------------------------------------------ */

int repl_distance(const char *a, const char *b) {
  int d[3][WORD_MAX + 1], i, j, la = (int)strlen(a), lb = (int)strlen(b);
  if (la > WORD_MAX || lb > WORD_MAX) return 1000;
  for (j = 0; j <= lb; j++) d[0][j] = 2 * j;
  for (i = 1; i <= la; i++) {
    int *row = d[i % 3], *up = d[(i - 1) % 3], *up2 = d[(i - 2 + 3) % 3];
    row[0] = 2 * i;
    for (j = 1; j <= lb; j++) {
      int ca = (unsigned char)a[i - 1], cb = (unsigned char)b[j - 1];
      int c = up[j - 1] + (ca == cb ? 0 : tolower(ca) == tolower(cb) ? 1 : 2);
      if (up[j] + 2 < c) c = up[j] + 2;
      if (row[j - 1] + 2 < c) c = row[j - 1] + 2;
      /* "Linaer" for "Linear": one swap, not two substitutions */
      if (i > 1 && j > 1 && ca != cb &&
          tolower(ca) == tolower((unsigned char)b[j - 2]) &&
          tolower((unsigned char)a[i - 2]) == tolower(cb) && up2[j - 2] + 2 < c)
        c = up2[j - 2] + 2;
      row[j] = c;
    }
  }
  return d[la % 3][lb];
}

/* --- the closest names --------------------------------------------------- */

/* The name looked for and the closest seen so far. */
struct near {
  const char *kind;            /* "method", "field" or "global" */
  lua_Debug *ar;               /* the frame that raised the error, or NULL */
  const char *name;            /* as typed */
  size_t len;
  int limit;                   /* the largest distance still close */
  int exact;                   /* some name is exactly the typed one */
  int nbest;
  int cost[NBEST];             /* ascending */
  char best[NBEST][WORD_MAX + 1];
};

/* How far a name may be and still be offered, in half steps: a name of
** one or two letters only by its case, of three or four by one edit, a
** longer one by two (more would offer `mm` for `x`). */
static int limit_for(size_t len) {
  return len <= 2 ? 1 : len <= 4 ? 2 : 4;
}

/* repl_name_fn: weigh one name. */
static void consider(void *ud, const char *s, size_t len) {
  struct near *n = ud;
  char name[WORD_MAX + 1];
  int cost, i, k;
  if (len > WORD_MAX) return;
  memcpy(name, s, len);
  name[len] = '\0';
  if (len == n->len && memcmp(s, n->name, len) == 0) {
    n->exact = 1;
    return;
  }
  cost = repl_distance(n->name, name);
  /* typed too short: `decomp` for decompose */
  if (cost > n->limit && n->len >= 4 && len > n->len && memcmp(s, n->name, n->len) == 0)
    cost = n->limit;
  if (cost > n->limit) return;
  for (i = 0; i < n->nbest; i++)
    if (strcmp(n->best[i], name) == 0) return;   /* found twice */
  /* keep the NBEST cheapest, ties in the order of the alphabet */
  for (i = n->nbest; i > 0 && (n->cost[i - 1] > cost ||
       (n->cost[i - 1] == cost && strcmp(n->best[i - 1], name) > 0)); i--) {}
  if (i >= NBEST) return;
  for (k = n->nbest < NBEST ? n->nbest : NBEST - 1; k > i; k--) {
    n->cost[k] = n->cost[k - 1];
    memcpy(n->best[k], n->best[k - 1], sizeof n->best[k]);
  }
  n->cost[i] = cost;
  memcpy(n->best[i], name, len + 1);
  if (n->nbest < NBEST) n->nbest++;
}

/* The raw field k of the table at idx pushed; its type. */
static int rawfield(lua_State *L, int idx, const char *k) {
  idx = lua_absindex(L, idx);
  lua_pushstring(L, k);
  return lua_rawget(L, idx);
}

/* Every name of fuselab's objects: the metatables it registers (their
** names start "fl."), the fl table, the tables in it (fl.nn, fl.models)
** and what those hold (nn's classes, with their bases' methods). */
static void fuselab_names(lua_State *L, int methods, struct near *n) {
  lua_pushnil(L);
  while (lua_next(L, LUA_REGISTRYINDEX)) {
    if (lua_type(L, -2) == LUA_TSTRING && lua_type(L, -1) == LUA_TTABLE &&
        strncmp(lua_tostring(L, -2), "fl.", 3) == 0)
      repl_names_of(L, -1, methods, 1, consider, n);
    lua_pop(L, 1);
  }
  lua_pushglobaltable(L);
  if (rawfield(L, -1, "fl") == LUA_TTABLE) {
    repl_names_of(L, -1, methods, 0, consider, n);
    lua_pushnil(L);
    while (lua_next(L, -2)) {                 /* fl.nn, fl.models, ... */
      if (lua_type(L, -1) == LUA_TTABLE && lua_type(L, -2) == LUA_TSTRING &&
          lua_tostring(L, -2)[0] != '_') {
        repl_names_of(L, -1, methods, 0, consider, n);
        lua_pushnil(L);
        while (lua_next(L, -2)) {             /* nn.Linear, ... */
          if (lua_type(L, -1) == LUA_TTABLE)
            repl_names_of(L, -1, methods, 0, consider, n);
          lua_pop(L, 1);
        }
      }
      lua_pop(L, 1);
    }
  }
  lua_pop(L, 2);
}

/* An nn module (nn.lua's is_module): a table whose metatable is a class,
** one with a __typename. */
static int is_module(lua_State *L, int idx) {
  int r = 0;
  idx = lua_absindex(L, idx);
  if (lua_type(L, idx) != LUA_TTABLE || !lua_getmetatable(L, idx)) return 0;
  if (!lua_rawequal(L, -1, idx)) {
    r = rawfield(L, -1, "__typename") != LUA_TNIL;
    lua_pop(L, 1);
  }
  lua_pop(L, 1);
  return r;
}

/* A module's fields are its own (m.weight, m.bias), not its class's: the
** modules the erroring frame holds, and the global ones, are weighed too. */
static void module_names(lua_State *L, struct near *n) {
  const char *local;
  int i;
  for (i = 1; n->ar && (local = lua_getlocal(L, n->ar, i)) != NULL; i++) {
    if (is_module(L, -1)) repl_names_of(L, -1, 0, 0, consider, n);
    lua_pop(L, 1);
  }
  lua_pushglobaltable(L);
  lua_pushnil(L);
  while (lua_next(L, -2)) {
    if (is_module(L, -1)) repl_names_of(L, -1, 0, 0, consider, n);
    lua_pop(L, 1);
  }
  lua_pop(L, 1);
}

/* The receiver of a failed method call, pushed; returns how many values
** were pushed (none when it cannot be told).  For `obj:name(...)` the
** frame's stack holds the looked-up method (nil) in one temporary and obj
** in the next.  Other pairs like it may be pending arguments of an outer
** call (`f(nil, t, obj:name())`) or arguments of this one: every pair is
** pushed (MAX_RECEIVERS at most), and the names of all are weighed. */
#define MAX_RECEIVERS 4

static int receivers(lua_State *L, struct near *n) {
  const char *local;
  int i, prev_nil = 0, found = 0;
  for (i = 1; n->ar && found < MAX_RECEIVERS && (local = lua_getlocal(L, n->ar, i)) != NULL; i++) {
    int temp = local[0] == '(', t = lua_type(L, -1);
    if (temp && prev_nil && (t == LUA_TTABLE || t == LUA_TUSERDATA || t == LUA_TSTRING)) found++;
    else lua_pop(L, 1);
    prev_nil = temp && t == LUA_TNIL;
  }
  return found;
}

/* Protected: the closest names for n (light userdata 1). */
static int collect(lua_State *L) {
  struct near *n = lua_touserdata(L, 1);
  int i, top = lua_gettop(L), methods = strcmp(n->kind, "method") == 0;
  luaL_checkstack(L, MAX_RECEIVERS + 24, NULL);   /* the walks nest a few deep */
  if (strcmp(n->kind, "global") == 0) {
    lua_pushglobaltable(L);
    repl_names_of(L, -1, 0, 0, consider, n);
  }
  else if (methods && receivers(L, n) > 0) {
    for (i = top + 1; i <= lua_gettop(L); i++) repl_names_of(L, i, 1, 0, consider, n);
  }
  else {
    fuselab_names(L, methods, n);
    if (!methods) module_names(L, n);
  }
  return 0;
}

/* --- the message --------------------------------------------------------- */

/* From the first line of msg, ending "a nil value (method 'name')": the
** kind and the name, copied; 0 when the line is not such a message. */
static int nil_name(const char *msg, char *kind, size_t ksize, char *name, size_t nsize) {
  static const char *const kinds[] = {"method", "field", "global"};
  static const char nil[] = "a nil value (";
  size_t first = strcspn(msg, "\n"), i;
  const char *open = NULL, *p, *q;
  for (p = msg; p + 1 < msg + first; p++)
    if (p[0] == ' ' && p[1] == '(') open = p + 2;
  if (open == NULL || first < 2 || memcmp(msg + first - 2, "')", 2) != 0 ||
      (size_t)(open - msg) < sizeof nil - 1 || memcmp(open - (sizeof nil - 1), nil, sizeof nil - 1) != 0)
    return 0;
  for (i = 0; i < sizeof kinds / sizeof *kinds; i++) {
    size_t kl = strlen(kinds[i]);
    if (strncmp(open, kinds[i], kl) == 0 && strncmp(open + kl, " '", 2) == 0) break;
  }
  if (i == sizeof kinds / sizeof *kinds) return 0;
  p = open + strlen(kinds[i]) + 2;
  q = msg + first - 2;
  if (q <= p || (size_t)(q - p) >= nsize) return 0;
  snprintf(kind, ksize, "%s", kinds[i]);
  snprintf(name, nsize, "%.*s", (int)(q - p), p);
  return 1;
}

/* The frame at level, into ar, when it is a Lua function's and the
** message's position is its current line: the one that raised msg. */
static int raised_in(lua_State *L, const char *msg, int level, lua_Debug *ar) {
  char where[300];
  if (!lua_getstack(L, level, ar) || !lua_getinfo(L, "Sl", ar) || strcmp(ar->what, "C") == 0)
    return 0;
  snprintf(where, sizeof where, "%s:%d:", ar->short_src, ar->currentline);
  return strncmp(msg, where, strlen(where)) == 0;
}

int repl_did_you_mean(lua_State *L, const char *msg, int level) {
  struct near n;
  lua_Debug ar;
  char kind[16], name[WORD_MAX + 1];
  size_t first;
  int top = lua_gettop(L), i;
  if (!nil_name(msg, kind, sizeof kind, name, sizeof name) || !lua_checkstack(L, 2 * NBEST + 4))
    return 0;
  memset(&n, 0, sizeof n);
  n.kind = kind;
  n.name = name;
  n.len = strlen(name);
  n.limit = limit_for(n.len);
  /* a message that carries its own traceback was raised elsewhere */
  if (!strstr(msg, "\nstack traceback:\n") && raised_in(L, msg, level, &ar)) n.ar = &ar;
  lua_pushcfunction(L, collect);
  lua_pushlightuserdata(L, &n);
  if (lua_pcall(L, 1, 0, 0) != LUA_OK || n.exact || n.nbest == 0) {
    lua_settop(L, top);
    return 0;
  }
  /* only the closest: "Linear", not "Linear or linear" */
  while (n.nbest > 1 && n.cost[n.nbest - 1] > n.cost[0]) n.nbest--;
  first = strcspn(msg, "\n");
  lua_pushlstring(L, msg, first);
  lua_pushliteral(L, "; did you mean ");
  for (i = 0; i < n.nbest; i++) {
    if (i > 0) lua_pushstring(L, i == n.nbest - 1 ? " or " : ", ");
    lua_pushstring(L, n.best[i]);
  }
  lua_pushfstring(L, "?%s", msg + first);
  lua_concat(L, lua_gettop(L) - top);
  return 1;
}
