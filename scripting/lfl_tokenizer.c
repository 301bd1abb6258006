/*
** lfl_tokenizer.c -- fl.tokenizer(path): a language model's tokenizer
** (io/tokenizer.c) as a Lua object with Hugging Face's method names:
**   tok:encode(text [, {add_special_tokens = true}]) -> {id, ...}
**   tok:decode(ids [, {skip_special_tokens = false}]) -> text
**   tok:token_to_id(s), tok:id_to_token(id), tok.vocab_size, #tok
** path is a tokenizer.json, or a directory holding one (else GPT-2's
** vocab.json + merges.txt, with tokenizer_config.json when present).
** Ids are 0-based as in every checkpoint; ids passed in may be a table or
** a 1-d int64 tensor.
*/
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "io/tokenizer.h"
#include "lfl.h"

#define TOK_TYPE "fl.Tokenizer"

typedef struct ltok { tok_tokenizer *t; } ltok;

static tok_tokenizer *checktok(lua_State *L, int idx) {
  ltok *u = (ltok *)luaL_checkudata(L, idx, TOK_TYPE);
  if (!u->t) luaL_error(L, "tokenizer: already freed");
  return u->t;
}

static int t_gc(lua_State *L) {
  ltok *u = (ltok *)luaL_checkudata(L, 1, TOK_TYPE);
  tok_free(u->t);
  u->t = NULL;
  return 0;
}

static int is_file(const char *p) {
  struct stat st;
  return stat(p, &st) == 0 && S_ISREG(st.st_mode);
}

static int is_dir(const char *p) {
  struct stat st;
  return stat(p, &st) == 0 && S_ISDIR(st.st_mode);
}

/* fl.tokenizer(path) */
static int l_tokenizer(lua_State *L) {
  const char *path = luaL_checkstring(L, 1);
  ltok *u = (ltok *)lua_newuserdatauv(L, sizeof *u, 0);
  fl_err e = {0};
  int rc;
  u->t = NULL;
  luaL_setmetatable(L, TOK_TYPE);
  if (is_dir(path)) {
    const char *json, *vocab, *merges, *cfg;
    lua_pushfstring(L, "%s/tokenizer.json", path);
    json = lua_tostring(L, -1);
    lua_pushfstring(L, "%s/vocab.json", path);
    vocab = lua_tostring(L, -1);
    lua_pushfstring(L, "%s/merges.txt", path);
    merges = lua_tostring(L, -1);
    lua_pushfstring(L, "%s/tokenizer_config.json", path);
    cfg = lua_tostring(L, -1);
    if (is_file(json)) rc = tok_load_json(json, &u->t, &e);
    else if (is_file(vocab) || is_file(merges)) rc = tok_load_bpe(vocab, merges, is_file(cfg) ? cfg : NULL, &u->t, &e);
    else {
      lua_pushfstring(L, "tokenizer: %s has neither tokenizer.json nor vocab.json + merges.txt", path);
      return lua_error(L);
    }
    lua_pop(L, 4);
  } else rc = tok_load_json(path, &u->t, &e);
  if (rc != FL_OK) return luaL_error(L, "tokenizer: %s", e.msg);
  return 1;
}

static int opt_flag(lua_State *L, int idx, const char *key, int dflt) {
  int v = dflt;
  if (lua_isnoneornil(L, idx)) return dflt;
  luaL_checktype(L, idx, LUA_TTABLE);
  if (lua_getfield(L, idx, key) != LUA_TNIL) v = lua_toboolean(L, -1);
  lua_pop(L, 1);
  return v;
}

static int t_encode(lua_State *L) {
  tok_tokenizer *t = checktok(L, 1);
  size_t n, nids;
  const char *s = luaL_checklstring(L, 2, &n);
  int64_t *ids;
  fl_err e = {0};
  if (tok_encode(t, s, n, opt_flag(L, 3, "add_special_tokens", 1), &ids, &nids, &e) != FL_OK)
    return luaL_error(L, "%s", e.msg);
  lua_createtable(L, (int)nids, 0);
  for (size_t i = 0; i < nids; i++) {
    lua_pushinteger(L, ids[i]);
    lua_rawseti(L, -2, (lua_Integer)i + 1);
  }
  free(ids);
  return 1;
}

/* The ids at idx (a table of integers or a 1-d int64 tensor) as a new array. */
static int64_t *read_ids(lua_State *L, int idx, size_t *n) {
  int64_t *ids;
  if (lfl_istensor(L, idx)) {
    lua_getfield(L, idx, "tolist");
    lua_pushvalue(L, idx);
    lua_call(L, 1, 1);
    lua_replace(L, idx);
  }
  luaL_argexpected(L, lua_type(L, idx) == LUA_TTABLE, idx, "table of ids or int64 tensor");
  *n = (size_t)lua_rawlen(L, idx);
  ids = (int64_t *)lua_newuserdatauv(L, (*n ? *n : 1) * sizeof *ids, 0);   /* freed by the collector */
  for (size_t i = 0; i < *n; i++) {
    int ok;
    lua_rawgeti(L, idx, (lua_Integer)i + 1);
    ids[i] = (int64_t)lua_tointegerx(L, -1, &ok);
    if (!ok) luaL_error(L, "decode: ids[%d] is not an integer", (int)i + 1);
    lua_pop(L, 1);
  }
  return ids;
}

static int t_decode(lua_State *L) {
  tok_tokenizer *t = checktok(L, 1);
  size_t n, len;
  int64_t *ids;
  char *s;
  fl_err e = {0};
  lua_settop(L, 3);                    /* the options stay at 3 above read_ids' buffer */
  ids = read_ids(L, 2, &n);
  if (tok_decode(t, ids, n, opt_flag(L, 3, "skip_special_tokens", 0), &s, &len, &e) != FL_OK)
    return luaL_error(L, "%s", e.msg);
  lua_pushlstring(L, s, len);
  free(s);
  return 1;
}

static int t_token_to_id(lua_State *L) {
  size_t n;
  tok_tokenizer *t = checktok(L, 1);
  const char *s = luaL_checklstring(L, 2, &n);
  int64_t id = tok_token_to_id(t, s, n);
  if (id < 0) lua_pushnil(L);
  else lua_pushinteger(L, id);
  return 1;
}

static int t_id_to_token(lua_State *L) {
  tok_tokenizer *t = checktok(L, 1);
  const char *s = tok_id_to_token(t, luaL_checkinteger(L, 2));
  if (s) lua_pushstring(L, s);
  else lua_pushnil(L);
  return 1;
}

static int t_is_special(lua_State *L) {
  lua_pushboolean(L, tok_is_special(checktok(L, 1), luaL_checkinteger(L, 2)));
  return 1;
}

static int t_len(lua_State *L) {
  lua_pushinteger(L, tok_vocab_size(checktok(L, 1)));
  return 1;
}

static int t_tostring(lua_State *L) {
  lua_pushfstring(L, "fl.Tokenizer(%s)", tok_describe(checktok(L, 1)));
  return 1;
}

static const luaL_Reg methods[] = {
  {"encode", t_encode}, {"decode", t_decode}, {"token_to_id", t_token_to_id},
  {"id_to_token", t_id_to_token}, {"is_special", t_is_special}, {NULL, NULL}
};

static int t_index(lua_State *L) {
  const char *k = luaL_checkstring(L, 2);
  if (!strcmp(k, "vocab_size")) return t_len(L);
  lua_getmetatable(L, 1);
  lua_getfield(L, -1, "methods");
  lua_getfield(L, -1, k);
  return 1;
}

void lfl_open_tokenizer(lua_State *L, int lib) {
  lib = lua_absindex(L, lib);
  luaL_newmetatable(L, TOK_TYPE);
  lua_pushcfunction(L, t_gc);
  lua_setfield(L, -2, "__gc");
  lua_pushcfunction(L, t_len);
  lua_setfield(L, -2, "__len");
  lua_pushcfunction(L, t_tostring);
  lua_setfield(L, -2, "__tostring");
  lua_pushcfunction(L, t_index);
  lua_setfield(L, -2, "__index");
  luaL_newlib(L, methods);
  lua_setfield(L, -2, "methods");
  lua_pop(L, 1);
  lua_pushcfunction(L, l_tokenizer);
  lua_setfield(L, lib, "tokenizer");
}
