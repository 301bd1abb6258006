/*
** show.c -- how the REPL prints results.
**
** Values print as tostring gives them, tab-separated, one line per
** evaluated chunk; only plain tables (no __tostring, no __name) are spelt
** out.  A table that fits the line prints on it, {2, 3} or {calls = 3,
** ...}; a longer one prints over lines, one entry a line, indented by
** nesting, the = of a table's string keys aligned (as Torch7's trepl
** does), coloured on a colour terminal.  Everything is bounded so a
** cyclic or huge table prints a few screens, never forever: SHOW_DEPTH
** levels ({...} below), SHOW_ITEMS entries a level ("... (N more)"),
** SHOW_LINES lines in all, strings cut at SHOW_STRING bytes with their
** length said, and a table met again inside itself prints as <cycle>.
*/
#include "config.h"

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <unistd.h>

#include <lua.h>
#include <lauxlib.h>

#include "graph/err.h"
#include "repl/repl.h"

#define SHOW_DEPTH   4    /* nesting levels spelt out */
#define SHOW_ITEMS   32   /* entries of one table */
#define SHOW_LINES   400  /* lines of one multi-line table */
#define SHOW_STRING  160  /* bytes of a string inside a table */

/* Colours of a multi-line or one-line table on a colour terminal. */
#define C_STRING  "\033[32m"   /* green */
#define C_NUMBER  "\033[36m"   /* cyan */
#define C_OTHER   "\033[35m"   /* booleans, nil, functions: magenta */
#define C_OBJECT  "\033[33m"   /* tensors and other fuselab objects */

static int show_colour;  /* set by repl_show_init */

void repl_show_init(int colour) { show_colour = colour; }

/* How a table is being written: where, in colour or not, and what is on
** the path from the top (for cycles) and how many lines are out. */
struct out {
  FILE *f;
  int colour;
  int width;            /* columns of the line */
  int lines, cut, noted; /* lines written; SHOW_LINES reached; said so */
  const void *path[SHOW_DEPTH + 1];
  int npath;
};

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

/* A string as a Lua literal, "a\"b\n": control characters and bytes
** that are not UTF-8 text escaped (\x1b), since a name read from a file
** can hold a terminal command.  Runs go through err_quote_n in pieces cut
** between UTF-8 sequences. */
static void show_string(const char *s, size_t len, FILE *f) {
  char buf[4 * 72 + 8];
  size_t i = 0, full = len;
  if (len > SHOW_STRING) {  /* cut between UTF-8 sequences */
    len = SHOW_STRING;
    while (len > 0 && ((unsigned char)s[len] & 0xc0) == 0x80) len--;
  }
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
  if (full > len) fprintf(f, "... (%zu bytes)", full);
}


/* Writes s in colour c when the output is coloured. */
static void paint(struct out *o, const char *c, const char *s, size_t len) {
  if (o->colour) fputs(c, o->f);
  fwrite(s, 1, len, o->f);
  if (o->colour) fputs(REPL_RESET, o->f);
}

/* A value that is not a plain table: strings quoted, a many-line
** __tostring (a tensor) replaced by its last line when that is a
** "[float32 tensor of size 2x3]" summary, else by <type name>. */
static void show_item(lua_State *L, int idx, struct out *o) {
  size_t len;
  const char *s, *nl;
  int t = lua_type(L, idx);
  idx = lua_absindex(L, idx);
  if (t == LUA_TSTRING) {
    s = lua_tolstring(L, idx, &len);
    if (o->colour) fputs(C_STRING, o->f);
    show_string(s, len, o->f);
    if (o->colour) fputs(REPL_RESET, o->f);
    return;
  }
  s = luaL_tolstring(L, idx, &len);
  if ((nl = memchr(s, '\n', len)) != NULL) {
    const char *last = s + len;
    while (last > s && last[-1] == '\n') last--;
    while (last > s && last[-1] != '\n') last--;
    if (last < s + len && *last == '[' && s[len - 1] == ']' && len - (size_t)(last - s) < 200)
      paint(o, C_OBJECT, last, len - (size_t)(last - s));
    else {
      char name[128];
      int mt = luaL_getmetafield(L, idx, "__name");
      snprintf(name, sizeof name, "<%s>",
               mt == LUA_TSTRING ? lua_tostring(L, -1) : luaL_typename(L, idx));
      if (mt != LUA_TNIL) lua_pop(L, 1);
      paint(o, C_OBJECT, name, strlen(name));
    }
  }
  else {
    char q[4 * 200 + 8];  /* a __tostring's text is quoted: it may come from a file */
    const char *c = t == LUA_TNUMBER ? C_NUMBER
                  : (t == LUA_TTABLE || t == LUA_TUSERDATA) && luaL_getmetafield(L, idx, "__name") != LUA_TNIL
                    ? (lua_pop(L, 1), C_OBJECT) : C_OTHER;
    err_quote_n(s, len < 200 ? len : 200, q, sizeof q);
    paint(o, c, q, strlen(q));
  }
  lua_pop(L, 1);
}

static int cmp_keys(const void *a, const void *b) {
  return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* The entries of the table at idx in the order they print: the sequence
** 1..n, the string keys sorted (hash order changes from run to run), then
** the other keys.  Pushes a Lua array of the first SHOW_ITEMS keys;
** returns how many entries there are in all (*seq: the sequence's). */
static lua_Integer entries(lua_State *L, int idx, lua_Integer *seq) {
  lua_Integer n, total, k, nstr = 0, i;
  const char **strs;
  int order;
  idx = lua_absindex(L, idx);
  for (n = 0; lua_rawgeti(L, idx, n + 1) != LUA_TNIL; n++) lua_pop(L, 1);
  lua_pop(L, 1);
  *seq = n;
  total = n;
  lua_pushnil(L);
  while (lua_next(L, idx)) {
    lua_pop(L, 1);
    if (lua_type(L, -1) == LUA_TSTRING) nstr++;
    else if (!(lua_isinteger(L, -1) && (i = lua_tointeger(L, -1)) >= 1 && i <= n)) total++;
  }
  total += nstr;
  /* every string key, to sort: a buffer Lua collects, so an error leaks nothing */
  strs = lua_newuserdatauv(L, (size_t)(nstr > 0 ? nstr : 1) * sizeof *strs, 0);
  k = 0;
  lua_pushnil(L);
  while (lua_next(L, idx)) {
    lua_pop(L, 1);
    if (lua_type(L, -1) == LUA_TSTRING && k < nstr) strs[k++] = lua_tostring(L, -1);  /* anchored by the table */
  }
  qsort(strs, (size_t)k, sizeof *strs, cmp_keys);
  lua_createtable(L, SHOW_ITEMS, 0);
  order = lua_gettop(L);
  for (i = 1, k = 0; i <= n && i <= SHOW_ITEMS; i++) {
    lua_pushinteger(L, i);
    lua_rawseti(L, order, ++k);
  }
  for (i = 0; i < nstr && k < SHOW_ITEMS; i++) {
    lua_pushstring(L, strs[i]);
    lua_rawseti(L, order, ++k);
  }
  lua_pushnil(L);
  while (k < SHOW_ITEMS && lua_next(L, idx)) {
    lua_pop(L, 1);
    if (lua_type(L, -1) == LUA_TSTRING ||
        (lua_isinteger(L, -1) && (i = lua_tointeger(L, -1)) >= 1 && i <= n))
      continue;
    lua_pushvalue(L, -1);
    lua_rawseti(L, order, ++k);
  }
  if (k >= SHOW_ITEMS) lua_settop(L, order);  /* lua_next's key, if it stopped early */
  lua_remove(L, order - 1);  /* the string buffer */
  return total;
}

static void show_table(lua_State *L, int idx, struct out *o, int col, int depth);

/* The key at -2, as it prints before " = " (nothing for the sequence). */
static void show_key(lua_State *L, struct out *o, lua_Integer seq) {
  lua_Integer i;
  if (lua_isinteger(L, -2) && (i = lua_tointeger(L, -2)) >= 1 && i <= seq) return;
  if (lua_type(L, -2) == LUA_TSTRING && is_name(lua_tostring(L, -2))) {
    fputs(lua_tostring(L, -2), o->f);
    fputs(" = ", o->f);
    return;
  }
  fputc('[', o->f);
  if (plain_table(L, -2)) fputs("{...}", o->f);
  else show_item(L, -2, o);
  fputs("] = ", o->f);
}

static void show_value(lua_State *L, int idx, struct out *o, int col, int depth) {
  if (plain_table(L, idx)) show_table(L, idx, o, col, depth);
  else show_item(L, idx, o);
}

static int on_path(const struct out *o, const void *p) {
  int i;
  for (i = 0; i < o->npath; i++)
    if (o->path[i] == p) return 1;
  return 0;
}

/* {1, 2, name = "x", [true] = 3} on one line. */
static void show_line(lua_State *L, int idx, struct out *o, int depth) {
  lua_Integer seq, total, k, n;
  const void *self = lua_topointer(L, idx);
  idx = lua_absindex(L, idx);
  if (on_path(o, self)) { fputs("<cycle>", o->f); return; }
  if (depth >= SHOW_DEPTH) { fputs("{...}", o->f); return; }
  luaL_checkstack(L, 8, "nested too deep to print");
  total = entries(L, idx, &seq);
  n = (lua_Integer)lua_rawlen(L, -1);
  o->path[o->npath++] = self;
  fputc('{', o->f);
  for (k = 1; k <= n; k++) {
    if (k > 1) fputs(", ", o->f);
    lua_rawgeti(L, -1, k);
    lua_pushvalue(L, -1);
    lua_rawget(L, idx);
    show_key(L, o, seq);
    if (plain_table(L, -1)) show_line(L, -1, o, depth + 1);
    else show_item(L, -1, o);
    lua_pop(L, 2);
  }
  if (total > n) fputs(n > 0 ? ", ..." : "...", o->f);
  fputc('}', o->f);
  o->npath--;
  lua_pop(L, 1);
}

/* Columns the text takes (UTF-8 sequences count one). */
static int columns(const char *s, size_t len) {
  size_t i;
  int n = 0;
  for (i = 0; i < len; i++) n += ((unsigned char)s[i] & 0xc0) != 0x80;
  return n;
}

/* Columns show_item takes for the value at idx. */
static int item_width(lua_State *L, int idx) {
  char *text = NULL;
  size_t len = 0;
  int w = 0;
  FILE *m = open_memstream(&text, &len);
  if (m != NULL) {
    struct out o;
    memset(&o, 0, sizeof o);
    o.f = m;
    show_item(L, idx, &o);
    fclose(m);
    w = columns(text, len);
    free(text);
  }
  return w;
}

static void newline(struct out *o, int indent) {
  fputc('\n', o->f);
  if (++o->lines >= SHOW_LINES) o->cut = 1;
  fprintf(o->f, "%*s", indent, "");
}

/* The table at idx, starting at column col: on the line when it fits,
** else one entry a line, indented by nesting. */
static void show_table(lua_State *L, int idx, struct out *o, int col, int depth) {
  lua_Integer seq, total, k, n;
  const void *self = lua_topointer(L, idx);
  char *text = NULL;
  size_t len = 0;
  int keyw = 0, indent = 2 * depth, packed = 0, at = 0;
  FILE *m;
  idx = lua_absindex(L, idx);
  if (o->cut) return;
  /* first, as one line, measured without colour */
  if ((m = open_memstream(&text, &len)) != NULL) {
    struct out w = *o;
    w.f = m;
    w.colour = 0;
    show_line(L, idx, &w, depth);
    fclose(m);
    if (col + columns(text, len) + (depth > 0) <= o->width || on_path(o, self) || depth >= SHOW_DEPTH) {
      if (o->colour) show_line(L, idx, o, depth);
      else fwrite(text, 1, len, o->f);
      free(text);
      return;
    }
    free(text);
  }
  luaL_checkstack(L, 8, "nested too deep to print");
  total = entries(L, idx, &seq);
  n = (lua_Integer)lua_rawlen(L, -1);
  for (k = 1; k <= n; k++) {  /* the width of the longest name key, for the = */
    lua_rawgeti(L, -1, k);
    if (lua_type(L, -1) == LUA_TSTRING && is_name(lua_tostring(L, -1))) {
      int w = (int)lua_rawlen(L, -1);
      if (w > keyw && w <= 24) keyw = w;
    }
    lua_pop(L, 1);
  }
  o->path[o->npath++] = self;
  fputc('{', o->f);
  for (k = 1; k <= n && !o->cut; k++) {
    int c = indent + 2;
    lua_rawgeti(L, -1, k);
    lua_pushvalue(L, -1);
    lua_rawget(L, idx);
    if (lua_isinteger(L, -2) && lua_tointeger(L, -2) <= seq && !plain_table(L, -1)) {
      /* numbers and such of the sequence share lines, as many as fit */
      int w = item_width(L, -1);
      if (k > 1 && packed && at + 1 + w + 1 <= o->width) {
        fputc(' ', o->f);
        at += 1 + w + 1;
      }
      else {
        newline(o, indent + 2);
        at = indent + 2 + w + 1;
      }
      packed = 1;
      show_item(L, -1, o);
      fputc(',', o->f);
      lua_pop(L, 2);
      continue;
    }
    packed = 0;
    newline(o, indent + 2);
    if (lua_type(L, -2) == LUA_TSTRING && is_name(lua_tostring(L, -2))) {
      int w = (int)lua_rawlen(L, -2);
      fprintf(o->f, "%s%*s = ", lua_tostring(L, -2), w < keyw ? keyw - w : 0, "");
      c += (w > keyw ? w : keyw) + 3;
    }
    else if (!(lua_isinteger(L, -2) && lua_tointeger(L, -2) >= 1 && lua_tointeger(L, -2) <= seq)) {
      show_key(L, o, seq);
      c += 8;  /* about: a rare key */
    }
    show_value(L, -1, o, c, depth + 1);
    fputc(',', o->f);
    lua_pop(L, 2);
  }
  if (o->cut && !o->noted) {  /* said once, at the innermost table */
    o->noted = 1;
    newline(o, indent + 2);
    fprintf(o->f, "... (cut at %d lines)", SHOW_LINES);
  }
  else if (total > n && !o->cut) {
    newline(o, indent + 2);
    fprintf(o->f, "... (%lld more)", (long long)(total - n));
  }
  newline(o, indent);
  fputc('}', o->f);
  o->npath--;
  lua_pop(L, 1);
}

/* Columns of the terminal stdout is, else 80 (a pipe gets the same
** layout every time). */
static int screen_width(void) {
  struct winsize ws;
  if (isatty(STDOUT_FILENO) && ioctl(STDOUT_FILENO, TIOCGWINSZ, &ws) == 0 && ws.ws_col >= 20)
    return ws.ws_col;
  return 80;
}

int repl_print(lua_State *L) {
  int i, n = lua_gettop(L);
  for (i = 1; i <= n; i++) {
    size_t len;
    const char *s;
    if (i > 1) fputc('\t', stdout);
    if (plain_table(L, i)) {
      struct out o;
      memset(&o, 0, sizeof o);
      o.f = stdout;
      o.colour = show_colour;
      o.width = screen_width();
      show_table(L, i, &o, 0, 0);
      continue;
    }
    s = luaL_tolstring(L, i, &len);
    fwrite(s, 1, len, stdout);
    lua_pop(L, 1);
  }
  fputc('\n', stdout);
  fflush(stdout);
  return 0;
}
