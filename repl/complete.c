/*
** complete.c -- Tab completion for the REPL.
**
** The word under the cursor is a path (`fl.nn.Li`, `x:res`, `pri`): the
** part before the last '.' or ':' is looked up from the globals, and the
** candidates are the string keys of the value found, then of each __index
** table up its metatable chain (so modules and strings complete their
** methods).  Userdata whose __index is a function (tensors compute their
** fields) list their methods in the metatable's `methods` table and
** the fields they compute in its `__fields` array.
** The same walk gives suggest.c the names a misspelt one could have been.
** All Lua work happens in one protected call: completion never raises,
** and a failure means no candidates.  Inside a string literal, and after
** `:load`, file names are completed instead.
*/
#include "config.h"

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <readline/readline.h>

#include <lua.h>
#include <lauxlib.h>

#include "repl/repl.h"

/* How far up a chain of metatables to look (cycles end here too). */
#define MAX_DEPTH 8

static lua_State *cL;

/* A candidate: the whole word as it will be typed. */
struct cand {
  char *word;    /* malloc'd */
  int callable;  /* a function, or has __call: a lone one gets its '(' */
};

/* The candidates of the current completion. */
static struct cand *cands;
static int ncands, capcands;

static const char *const keywords[] = {
  "and", "break", "do", "else", "elseif", "end", "false", "for",
  "function", "goto", "if", "in", "local", "nil", "not", "or", "repeat",
  "return", "then", "true", "until", "while", NULL
};

static void clear(void) {
  int i;
  for (i = 0; i < ncands; i++) free(cands[i].word);
  ncands = 0;
}

/* Keep head + name (head is the typed path with its separator). */
static void add(const char *head, size_t hlen, const char *name, size_t nlen,
                int callable) {
  char *s;
  if (ncands == capcands) {
    int cap = capcands ? 2 * capcands : 64;
    struct cand *v = realloc(cands, (size_t)cap * sizeof *v);
    if (v == NULL) return;
    cands = v;
    capcands = cap;
  }
  if ((s = malloc(hlen + nlen + 1)) == NULL) return;
  memcpy(s, head, hlen);
  memcpy(s + hlen, name, nlen);
  s[hlen + nlen] = '\0';
  cands[ncands].word = s;
  cands[ncands++].callable = callable;
}

static int is_ident(const char *s, size_t len) {
  size_t i;
  if (len == 0 || !(isalpha((unsigned char)s[0]) || s[0] == '_')) return 0;
  for (i = 1; i < len; i++)
    if (!(isalnum((unsigned char)s[i]) || s[i] == '_')) return 0;
  return 1;
}

static int is_callable(lua_State *L, int idx) {
  int t = lua_type(L, idx), r;
  if (t == LUA_TFUNCTION) return 1;
  if (t != LUA_TTABLE && t != LUA_TUSERDATA) return 0;
  if (!lua_getmetatable(L, idx)) return 0;
  lua_pushliteral(L, "__call");
  r = lua_rawget(L, -2) != LUA_TNIL;
  lua_pop(L, 2);
  return r;
}

/* What to look for, and how to write what is found. */
struct want {
  const char *head;   /* the text before the name, separator included */
  size_t hlen;
  const char *prefix; /* the start of the name typed so far */
  size_t plen;
  int methods;        /* after ':' only callables make sense */
  repl_name_fn each;  /* when set, found names go here, not to cands */
  void *ud;           /* each's own argument */
};

/* A name found: a candidate to complete, or one handed to w->each. */
static void found(const struct want *w, const char *name, size_t nlen, int callable) {
  if (w->each) w->each(w->ud, name, nlen);
  else add(w->head, w->hlen, name, nlen, callable);
}

/* Names starting with '_' (_G, _VERSION, private fields) are shown only
** when the typed prefix starts with '_' too, to keep lists short. */
static void from_table(lua_State *L, int idx, const struct want *w) {
  idx = lua_absindex(L, idx);
  lua_pushnil(L);
  while (lua_next(L, idx)) {
    if (lua_type(L, -2) == LUA_TSTRING) {
      size_t kl;
      const char *k = lua_tolstring(L, -2, &kl);
      if (kl >= w->plen && memcmp(k, w->prefix, w->plen) == 0 &&
          is_ident(k, kl) && (k[0] != '_' || w->plen > 0)) {
        int callable = is_callable(L, -1);
        if (!w->methods || callable) found(w, k, kl, callable);
      }
    }
    lua_pop(L, 1);
  }
}

/* The metatable at idx lists in __fields the names its __index function
** computes (x.shape, cm.calls): they complete as fields. */
static void from_fields(lua_State *L, int idx, const struct want *w) {
  lua_Integer i;
  idx = lua_absindex(L, idx);
  lua_pushliteral(L, "__fields");
  if (lua_rawget(L, idx) == LUA_TTABLE) {
    for (i = 1; lua_rawgeti(L, -1, i) == LUA_TSTRING; i++) {
      size_t kl;
      const char *k = lua_tolstring(L, -1, &kl);
      if (kl >= w->plen && memcmp(k, w->prefix, w->plen) == 0 && is_ident(k, kl))
        found(w, k, kl, 0);
      lua_pop(L, 1);
    }
    lua_pop(L, 1);
  }
  lua_pop(L, 1);
}

/* The names the metatable at idx gives the values it governs: its
** __index table's keys, then those up that table's own metatable chain;
** where __index is a function (tensors compute their fields), the
** metatable's `methods` table and its __fields list. */
static void from_meta(lua_State *L, int idx, const struct want *w) {
  int depth;
  lua_pushvalue(L, idx);
  for (depth = 0; depth < MAX_DEPTH; depth++) {
    lua_pushliteral(L, "__index");
    if (lua_rawget(L, -2) == LUA_TTABLE) {  /* mt, __index */
      from_table(L, -1, w);
      if (!lua_getmetatable(L, -1)) {
        lua_pop(L, 1);
        break;
      }
      lua_replace(L, -3);                    /* __index's mt, __index */
      lua_pop(L, 1);
      continue;
    }
    lua_pop(L, 1);
    lua_pushliteral(L, "methods");
    if (lua_rawget(L, -2) == LUA_TTABLE) from_table(L, -1, w);
    lua_pop(L, 1);
    if (!w->methods) from_fields(L, -1, w);
    break;
  }
  lua_pop(L, 1);
}

/* The keys of the value at idx, then what its metatable gives it. */
static void from_value(lua_State *L, int idx, const struct want *w) {
  idx = lua_absindex(L, idx);
  if (lua_type(L, idx) == LUA_TTABLE) from_table(L, idx, w);
  if (lua_getmetatable(L, idx)) {
    from_meta(L, -1, w);
    lua_pop(L, 1);
  }
}

void repl_names_of(lua_State *L, int idx, int methods, int type,
                   repl_name_fn each, void *ud) {
  struct want w;
  memset(&w, 0, sizeof w);
  w.head = w.prefix = "";
  w.methods = methods;
  w.each = each;
  w.ud = ud;
  if (type) from_meta(L, idx, &w);
  else from_value(L, idx, &w);
}

/* Protected: collect the candidates for the word (light userdata 1). */
static int collect(lua_State *L) {
  const char *word = lua_touserdata(L, 1);
  const char *sep = NULL, *p, *s;
  struct want w;
  memset(&w, 0, sizeof w);
  for (p = word; *p; p++)
    if (*p == '.' || *p == ':') sep = p;
  lua_pushglobaltable(L);
  if (sep == NULL) {
    int i;
    w.head = word; w.hlen = 0; w.prefix = word; w.plen = strlen(word);
    w.methods = 0;
    for (i = 0; keywords[i]; i++)
      if (strncmp(keywords[i], word, w.plen) == 0)
        add("", 0, keywords[i], strlen(keywords[i]), 0);
    from_value(L, -1, &w);
    return 0;
  }
  /* walk the path a.b.c before the separator: names and dots only */
  for (s = word; s < sep; s = p + 1) {
    for (p = s; p < sep && *p != '.'; p++) {}
    if (!is_ident(s, (size_t)(p - s))) return 0;
    if (lua_type(L, -1) != LUA_TTABLE && lua_type(L, -1) != LUA_TUSERDATA &&
        lua_type(L, -1) != LUA_TSTRING)
      return 0;
    lua_pushlstring(L, s, (size_t)(p - s));
    lua_gettable(L, -2);  /* may run an __index function: protected here */
    lua_remove(L, -2);
    if (p == sep) break;
  }
  w.head = word; w.hlen = (size_t)(sep - word) + 1;
  w.prefix = sep + 1; w.plen = strlen(sep + 1);
  w.methods = *sep == ':';
  from_value(L, -1, &w);
  return 0;
}

static int cmp(const void *a, const void *b) {
  return strcmp(((const struct cand *)a)->word, ((const struct cand *)b)->word);
}

/* Sort and drop repeats (a method found in a class and in its base; qsort
** is not stable, so either copy may stay: they name the same thing). */
static void finish(void) {
  int i, j;
  qsort(cands, (size_t)ncands, sizeof *cands, cmp);
  for (i = j = 0; i < ncands; i++) {
    if (j > 0 && strcmp(cands[j - 1].word, cands[i].word) == 0) {
      free(cands[i].word);
      continue;
    }
    cands[j++] = cands[i];
  }
  ncands = j;
}

/* Hands readline the candidates; a lone callable gets its '(' typed for
** it, as the next thing to type after a function name is its call. */
static char *generator(const char *text, int state) {
  static int next;
  const struct cand *c;
  char *s;
  size_t n;
  (void)text;
  if (state == 0) next = 0;
  if (next >= ncands) return NULL;
  c = &cands[next++];
  n = strlen(c->word);
  if ((s = malloc(n + 2)) == NULL) return NULL;
  memcpy(s, c->word, n + 1);
  if (ncands == 1 && c->callable) { s[n] = '('; s[n + 1] = '\0'; }
  return s;
}

/* Ctrl-C is blocked while readline works, so an __index that never
** returns would hang the prompt: completion gets a budget instead. */
#define BUDGET 1000000  /* Lua instructions */

static void over_budget(lua_State *L, lua_Debug *ar) {
  (void)ar;
  luaL_error(L, "completion took too long");
}

static void complete_lua(const char *text) {
  int top = lua_gettop(cL);
  lua_Hook hook = lua_gethook(cL);  /* the user's, put back after */
  int mask = lua_gethookmask(cL), count = lua_gethookcount(cL);
  clear();
  lua_sethook(cL, over_budget, LUA_MASKCOUNT, BUDGET);
  lua_pushcfunction(cL, collect);
  lua_pushlightuserdata(cL, (void *)text);
  lua_pcall(cL, 1, 0, 0);  /* an error leaves what was found so far */
  lua_sethook(cL, hook, mask, count);
  lua_settop(cL, top);
  finish();
}

/* Is position end of line inside a quoted string?  (One line is enough:
** quotes do not span lines in Lua.) */
static int in_string(const char *s, int end) {
  char q = 0;
  int i;
  for (i = 0; i < end && s[i]; i++) {
    if (q) {
      if (s[i] == '\\' && i + 1 < end) i++;
      else if (s[i] == q) q = 0;
    }
    else if (s[i] == '"' || s[i] == '\'') q = s[i];
    else if (s[i] == '-' && s[i + 1] == '-') return 0;  /* a comment */
  }
  return q != 0;
}

/* The command named by the first word of a `:` line (a unique prefix is
** enough, as meta.c accepts), or NULL. */
static const char *meta_command(const char *line) {
  const char *found = NULL;
  size_t n = strcspn(line + 1, " \t");
  int i;
  for (i = 0; repl_meta_names[i]; i++) {
    if (strncmp(repl_meta_names[i], line + 1, n) != 0) continue;
    if (strlen(repl_meta_names[i]) == n) return repl_meta_names[i];
    if (found) return NULL;
    found = repl_meta_names[i];
  }
  return found;
}

static void complete_words(const char *const *words, const char *head,
                           const char *text) {
  size_t hl = strlen(head), tl = strlen(text) - hl;
  int i;
  clear();
  for (i = 0; words[i]; i++)
    if (strncmp(words[i], text + hl, tl) == 0)
      add(head, hl, words[i], strlen(words[i]), 0);
  finish();
}

/* After :help and ?: the topics and every name doc/API.md documents. */
static void complete_help(const char *text) {
  const char *const *api = repl_apidoc_names();
  size_t tl = strlen(text);
  int i;
  clear();
  for (i = 0; repl_help_topics[i]; i++)
    if (strncmp(repl_help_topics[i], text, tl) == 0)
      add("", 0, repl_help_topics[i], strlen(repl_help_topics[i]), 0);
  for (i = 0; api && api[i]; i++)
    if (strncmp(api[i], text, tl) == 0) add("", 0, api[i], strlen(api[i]), 0);
  finish();
}

static char **attempt(const char *text, int start, int end) {
  (void)end;
  rl_attempted_completion_over = 1;  /* no file names in the middle of code */
  if (rl_line_buffer[0] == '?') {  /* ? NAME */
    complete_help(text);
    return rl_completion_matches(text, generator);
  }
  if (rl_line_buffer[0] == ':' && rl_line_buffer[1] != ':') {
    if (start == 0) {  /* the command itself */
      complete_words(repl_meta_names, ":", text);
    }
    else {
      const char *cmd = meta_command(rl_line_buffer);
      if (cmd && strcmp(cmd, "load") == 0) {
        rl_attempted_completion_over = 0;
        return NULL;
      }
      if (cmd && strcmp(cmd, "help") == 0) complete_help(text);
      else if (cmd && strcmp(cmd, "time") == 0) {
        static const char *const onoff[] = {"on", "off", NULL};
        complete_words(onoff, "", text);
      }
      else clear();
    }
    return rl_completion_matches(text, generator);
  }
  if (in_string(rl_line_buffer, start)) {
    rl_attempted_completion_over = 0;  /* readline's file names */
    rl_completion_suppress_append = 1;   /* no space before the quote */
    return NULL;
  }
  rl_completion_append_character = '\0';
  complete_lua(text);
  return rl_completion_matches(text, generator);
}

/* List candidates by their last part only (`zeros`, not `fl.zeros`). */
static void display(char **matches, int n, int maxlen) {
  char **v = malloc((size_t)(n + 2) * sizeof *v);
  int i;
  (void)maxlen;
  if (v == NULL) return;
  maxlen = 0;
  for (i = 0; i <= n; i++) {
    const char *s = matches[i], *p;
    for (p = s; *p; p++)
      if ((*p == '.' || *p == ':') && p[1] != '\0') s = p + 1;
    v[i] = (char *)s;
    if (i > 0 && (int)strlen(s) > maxlen) maxlen = (int)strlen(s);
  }
  v[n + 1] = NULL;
  rl_display_match_list(v, n, maxlen);
  rl_forced_update_display();
  free(v);
}

/* Where words start: in Lua, at operators and brackets ('.' and ':' join
** a path); in a file name (in a string, after :load), only at a quote or
** a blank, since '/', '-', '.' and '~' belong to the name. */
static char *word_breaks(void) {
  static char lua[] = " \t\n\"'`@$><=;|&{}()[],+-*/%^~#";
  static char meta[] = " \t?";
  static char str[] = "\"'";
  if ((rl_line_buffer[0] == ':' && rl_line_buffer[1] != ':') || rl_line_buffer[0] == '?')
    return meta;
  return in_string(rl_line_buffer, rl_point) ? str : lua;
}

void repl_complete_init(lua_State *L) {
  cL = L;
  rl_attempted_completion_function = attempt;
  rl_completion_display_matches_hook = display;
  rl_completion_word_break_hook = word_breaks;
}
