/*
** show.c -- how the REPL prints results.
**
** Values print as tostring gives them, tab-separated, one line per
** evaluated chunk; only plain tables (no __tostring, no __name) are spelt
** out as {2, 3} or {calls = 3, ...}, bounded in depth and length so a
** cyclic or huge table prints a few lines, never forever.
*/
#include "config.h"

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <lua.h>
#include <lauxlib.h>

#include "graph/err.h"
#include "repl/repl.h"

/* How much of a plain table is shown: nesting levels, entries per level. */
#define SHOW_DEPTH  3
#define SHOW_ITEMS  32

/* A table with no __tostring and no __name of its own: `x.shape` or
** `cm:stats()` are more use as {2, 3} than as "table: 0x55d0c3a0". */
static int plain_table(lua_State *L, int idx) {
  int plain;
  if (lua_type(L, idx) != LUA_TTABLE) return 0;
  if (!lua_getmetatable(L, idx)) return 1;
  plain = lua_getfield(L, -1, "__tostring") == LUA_TNIL &&
          lua_getfield(L, -2, "__name") == LUA_TNIL;
  lua_pop(L, plain ? 3 : 2);
  return plain;
}

/* A Lua name, so the key prints as name = rather than ["name"] = (a
** keyword passes too: the reader loses nothing). */
static int is_name(const char *s) {
  if (!(isalpha((unsigned char)*s) || *s == '_')) return 0;
  while (*++s)
    if (!(isalnum((unsigned char)*s) || *s == '_')) return 0;
  return 1;
}

static void show(lua_State *L, int idx, int depth, FILE *f);

/* A string as a Lua literal, "a\"b\n": control characters and bytes
** that are not UTF-8 text escaped (\x1b), since a name read from a file
** can hold a terminal command.  Runs go through err_quote_n in pieces cut
** between UTF-8 sequences. */
static void show_string(const char *s, size_t len, FILE *f) {
  char buf[4 * 72 + 8];
  size_t i = 0;
  fputc('"', f);
  while (i < len) {
    size_t j = i;
    if (s[i] == '"') { fputs("\\\"", f); i++; continue; }
    if (s[i] == '\n') { fputs("\\n", f); i++; continue; }
    while (j < len && j - i < 64 && s[j] != '"' && s[j] != '\n') j++;
    while (j < len && j - i < 72 && ((unsigned char)s[j] & 0xc0) == 0x80) j++;
    fputs(err_quote_n(s + i, j - i, buf, sizeof buf), f);
    i = j;
  }
  fputc('"', f);
}

/* A value inside a table: strings quoted, a many-line __tostring (a
** tensor) replaced by its type name. */
static void show_item(lua_State *L, int idx, int depth, FILE *f) {
  size_t len;
  const char *s;
  idx = lua_absindex(L, idx);
  if (plain_table(L, idx)) { show(L, idx, depth, f); return; }
  if (lua_type(L, idx) == LUA_TSTRING) {
    s = lua_tolstring(L, idx, &len);
    show_string(s, len, f);
    return;
  }
  s = luaL_tolstring(L, idx, &len);
  if (memchr(s, '\n', len) != NULL) {
    int t = luaL_getmetafield(L, idx, "__name");
    fprintf(f, "<%s>", t == LUA_TSTRING ? lua_tostring(L, -1) : luaL_typename(L, idx));
    if (t != LUA_TNIL) lua_pop(L, 1);
  }
  else fwrite(s, 1, len, f);
  lua_pop(L, 1);
}

static int cmp_keys(const void *a, const void *b) {
  return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* {1, 2, name = "x", [true] = 3}: the sequence, then string keys sorted
** (hash order changes from run to run), then any other keys. */
static void show(lua_State *L, int idx, int depth, FILE *f) {
  const char *keys[SHOW_ITEMS];
  lua_Integer i, len;
  int n = 0, nk = 0, k, skipped = 0;
  idx = lua_absindex(L, idx);
  if (depth >= SHOW_DEPTH) { fputs("{...}", f); return; }
  luaL_checkstack(L, 8, "nested too deep to print");
  fputc('{', f);
  for (len = 0; lua_rawgeti(L, idx, len + 1) != LUA_TNIL; len++) {
    if (n++ > 0) fputs(", ", f);
    if (n > SHOW_ITEMS) { fputs("...", f); lua_pop(L, 1); goto done; }
    show_item(L, -1, depth + 1, f);
    lua_pop(L, 1);
  }
  lua_pop(L, 1);
  lua_pushnil(L);
  while (lua_next(L, idx)) {  /* string keys, kept to sort */
    lua_pop(L, 1);
    if (lua_type(L, -1) == LUA_TSTRING) {
      if (nk < SHOW_ITEMS) keys[nk++] = lua_tostring(L, -1);  /* anchored */
      else skipped = 1;
    }
  }
  qsort(keys, (size_t)nk, sizeof *keys, cmp_keys);
  for (k = 0; k < nk; k++) {
    if (n++ > 0) fputs(", ", f);
    if (n > SHOW_ITEMS) { fputs("...", f); goto done; }
    if (is_name(keys[k])) fprintf(f, "%s = ", keys[k]);
    else { lua_pushstring(L, keys[k]); fputc('[', f); show_item(L, -1, depth + 1, f); fputs("] = ", f); lua_pop(L, 1); }
    lua_pushstring(L, keys[k]);
    lua_rawget(L, idx);
    show_item(L, -1, depth + 1, f);
    lua_pop(L, 1);
  }
  if (skipped) { fputs(", ...", f); goto done; }
  lua_pushnil(L);
  while (lua_next(L, idx)) {  /* the rest: numbers past the sequence... */
    if (lua_type(L, -2) == LUA_TSTRING ||
        (lua_isinteger(L, -2) && (i = lua_tointeger(L, -2)) >= 1 && i <= len)) {
      lua_pop(L, 1);
      continue;
    }
    if (n++ > 0) fputs(", ", f);
    if (n > SHOW_ITEMS) { fputs("...", f); lua_pop(L, 2); goto done; }
    fputc('[', f);
    show_item(L, -2, depth + 1, f);
    fputs("] = ", f);
    show_item(L, -1, depth + 1, f);
    lua_pop(L, 1);
  }
done:
  fputc('}', f);
}

int repl_print(lua_State *L) {
  int i, n = lua_gettop(L);
  for (i = 1; i <= n; i++) {
    size_t len;
    const char *s;
    if (i > 1) fputc('\t', stdout);
    if (plain_table(L, i)) { show(L, i, 0, stdout); continue; }
    s = luaL_tolstring(L, i, &len);
    fwrite(s, 1, len, stdout);
    lua_pop(L, 1);
  }
  fputc('\n', stdout);
  fflush(stdout);
  return 0;
}
