/*
** lfl_weights.c -- fl.save_weights(model, path) and fl.load_weights(model,
** path): a model's parameters and buffers, by their PyTorch names (its
** :state_dict()), to and from a safetensors file; and the file itself as
** tables, with its string metadata: fl.save_safetensors(tensors, path
** [, metadata]) and fl.load_safetensors(path) (what a training
** checkpoint is written with); fl.load_json(path), the JSON files that
** come with checkpoints (config.json, the shards' index).
**
** Loading is all or nothing: the file is read and every name, dtype and
** shape checked against the model before the first value is copied.
** Values are copied into the model's tensors in place, so anything bound
** to those tensors by reference (a compiled graph) sees the new values.
**
** C temporaries never outlive a Lua error: pointer arrays live in userdata
** and the list read from the file sits in a userdata whose __gc frees it.
*/
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "lfl.h"
#include "graph/autograd.h"
#include "graph/file.h"
#include "io/safetensors.h"

#define ST_GUARD "fl.safetensors_list"   /* metatable of the list guard */

/* Names listed in a mismatch message before "... and N more". */
#define MAX_LISTED 12

static int guard_gc(lua_State *L) {
  st_list_free((st_list *)luaL_checkudata(L, 1, ST_GUARD));
  return 0;
}

/* Push a userdata owning an empty st_list, freed when collected. */
static st_list *push_guard(lua_State *L) {
  st_list *l = (st_list *)lua_newuserdatauv(L, sizeof *l, 0);
  memset(l, 0, sizeof *l);
  if (luaL_newmetatable(L, ST_GUARD)) {
    lua_pushcfunction(L, guard_gc);
    lua_setfield(L, -2, "__gc");
  }
  lua_setmetatable(L, -2);
  return l;
}

static int by_string(const void *a, const void *b) {
  return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* Push the model's state: a table name -> tensor and the list of names in
** order.  A module gives them through :state_dict(); a plain table of
** tensors is taken as the map itself, its names sorted. */
static void push_state(lua_State *L, int model, const char *what) {
  model = lua_absindex(L, model);
  if (lua_type(L, model) != LUA_TTABLE)
    luaL_error(L, "%s: expected an nn module or a table of tensors, got %s", what,
               luaL_typename(L, model));
  if (lua_getfield(L, model, "state_dict") == LUA_TFUNCTION) {
    lua_pushvalue(L, model);
    lua_call(L, 1, 2);
    if (!lua_istable(L, -2) || !lua_istable(L, -1))
      luaL_error(L, "%s: the model's state_dict() did not return a map and a list of names",
                 what);
    return;
  }
  lua_pop(L, 1);
  {
    lua_Integer n = 0, i;
    const char **keys;
    lua_pushvalue(L, model);                  /* the map */
    lua_newtable(L);                          /* the names */
    lua_pushnil(L);
    while (lua_next(L, model)) {
      lua_pop(L, 1);
      if (lua_type(L, -1) != LUA_TSTRING)
        luaL_error(L, "%s: a table of tensors must have string keys, found a %s key", what,
                   luaL_typename(L, -1));
      lua_pushvalue(L, -1);
      lua_rawseti(L, -3, ++n);
    }
    /* sort the names (a userdata array: nothing leaks if this raises) */
    keys = (const char **)lua_newuserdatauv(L, (size_t)(n ? n : 1) * sizeof *keys, 0);
    for (i = 1; i <= n; i++) {
      lua_rawgeti(L, -2, i);
      keys[i - 1] = lua_tostring(L, -1);      /* anchored by the names table */
      lua_pop(L, 1);
    }
    qsort(keys, (size_t)n, sizeof *keys, by_string);
    for (i = 1; i <= n; i++) {
      lua_pushstring(L, keys[i - 1]);
      lua_rawseti(L, -3, i);
    }
    lua_pop(L, 1);
  }
}

/* The model's tensor called `name` (map at index map), pushed; raises when
** the entry is not a tensor. */
static fl_tensor *push_model_tensor(lua_State *L, int map, const char *name, const char *what) {
  fl_tensor *t;
  char q[256];
  lua_getfield(L, map, name);
  if ((t = lfl_totensor(L, -1)) == NULL)
    luaL_error(L, "%s: %s: the model holds a %s, not a tensor", what, err_quote(name, q, sizeof q),
               luaL_typename(L, -1));
  return t;
}

/* The metadata table at idx (string keys and values; nil: none) as two
** arrays of nmeta strings in userdata, anchored by the table.  Keys are
** sorted, so the same table always writes the same header. */
static size_t push_meta(lua_State *L, int idx, const char ***keys, const char ***values,
                        const char *what) {
  size_t n = 0, i;
  idx = lua_absindex(L, idx);
  if (lua_isnoneornil(L, idx)) {
    *keys = *values = NULL;
    return 0;
  }
  if (!lua_istable(L, idx)) luaL_error(L, "%s: metadata must be a table of strings, got %s", what,
                                       luaL_typename(L, idx));
  lua_pushnil(L);
  while (lua_next(L, idx)) {
    size_t len;
    if (lua_type(L, -2) != LUA_TSTRING || lua_type(L, -1) != LUA_TSTRING)
      luaL_error(L, "%s: metadata must map strings to strings, found %s = %s", what,
                 luaL_typename(L, -2), luaL_typename(L, -1));
    lua_tolstring(L, -1, &len);
    if (strlen(lua_tostring(L, -1)) != len)
      luaL_error(L, "%s: metadata '%s' holds a NUL byte", what, lua_tostring(L, -2));
    n++;
    lua_pop(L, 1);
  }
  *keys = (const char **)lua_newuserdatauv(L, (n ? 2 * n : 1) * sizeof **keys, 0);
  i = 0;
  lua_pushnil(L);
  while (lua_next(L, idx)) {
    (*keys)[i++] = lua_tostring(L, -2);       /* anchored by the table */
    lua_pop(L, 1);
  }
  qsort(*keys, n, sizeof **keys, by_string);
  *values = *keys + n;
  for (i = 0; i < n; i++) {
    lua_getfield(L, idx, (*keys)[i]);
    (*values)[i] = lua_tostring(L, -1);       /* anchored by the table */
    lua_pop(L, 1);
  }
  return n;
}

/* fl.save_weights(model, path) and fl.save_safetensors(tensors, path [,
** metadata]): every tensor of the state, by name (meta: the stack index
** of the metadata table, 0 for none). */
static int save_state(lua_State *L, int meta, const char *what) {
  const char *path = luaL_checkstring(L, 2);
  const char **names, **keys = NULL, **values = NULL;
  const fl_tensor **ts;
  lua_Integer n, i;
  size_t nmeta = 0;
  int map, list, keep;
  fl_err e;

  lua_settop(L, 3);
  push_state(L, 1, what);
  map = 4;
  list = 5;
  if (meta) nmeta = push_meta(L, meta, &keys, &values, what);
  n = (lua_Integer)lua_rawlen(L, list);
  names = (const char **)lua_newuserdatauv(L, (size_t)(n ? n : 1) * sizeof *names, 0);
  ts = (const fl_tensor **)lua_newuserdatauv(L, (size_t)(n ? n : 1) * sizeof *ts, 0);
  lua_createtable(L, (int)n, 0);              /* keeps the tensors written */
  keep = lua_gettop(L);
  for (i = 1; i <= n; i++) {
    fl_tensor *t;
    if (lua_rawgeti(L, list, i) != LUA_TSTRING)
      return luaL_error(L, "%s: name %I of the state is not a string", what, i);
    names[i - 1] = lua_tostring(L, -1);       /* anchored by the list */
    lua_pop(L, 1);
    t = push_model_tensor(L, map, names[i - 1], what);
    if (t->m.device != FL_DEV_CPU) {          /* write a CPU copy */
      lua_getfield(L, -1, "cpu");
      lua_insert(L, -2);
      lua_call(L, 1, 1);
      t = lfl_checktensor(L, -1);
    }
    ts[i - 1] = t;
    lua_rawseti(L, keep, i);
  }
  err_clear(&e);
  if (st_save_meta(path, names, ts, (size_t)n, keys, values, nmeta, &e) != FL_OK)
    return luaL_error(L, "%s: %s", what, e.msg);
  return 0;
}

static int l_save_weights(lua_State *L) {
  lua_settop(L, 2);
  return save_state(L, 0, "save_weights");
}

static int l_save_safetensors(lua_State *L) { return save_state(L, 3, "save_safetensors"); }

/* fl.load_safetensors(path [, {map = true}]) -> tensors (name -> tensor), metadata (key ->
** string), names (in the file's data order). */
static int l_load_safetensors(lua_State *L) {
  const char *path = luaL_checkstring(L, 1);
  int map = 0;
  st_list *l;
  fl_err e;
  if (!lua_isnoneornil(L, 2)) {
    luaL_checktype(L, 2, LUA_TTABLE);
    lua_pushnil(L);
    while (lua_next(L, 2)) {
      if (lua_type(L, -2) != LUA_TSTRING || strcmp(lua_tostring(L, -2), "map") != 0)
        return luaL_error(L, "load_safetensors: unknown option '%s' (expected map)", luaL_tolstring(L, -2, NULL));
      lua_pop(L, 1);
    }
    lua_getfield(L, 2, "map");
    map = lua_toboolean(L, -1);
    lua_pop(L, 1);
  }
  lua_settop(L, 1);
  l = push_guard(L);
  err_clear(&e);
  if ((map ? st_load_mapped(path, l, &e) : st_load(path, l, &e)) != FL_OK)
    return luaL_error(L, "load_safetensors: %s", e.msg);
  lua_createtable(L, 0, (int)l->n);
  lua_createtable(L, 0, (int)l->nmeta);
  lua_createtable(L, (int)l->n, 0);
  for (size_t k = 0; k < l->n; k++) {
    fl_tensor *t = lfl_newtensor(L);
    *t = l->v[k].t;
    memset(&l->v[k].t, 0, sizeof l->v[k].t);
    if (t->st && !t->st->map_base) lfl_account(L, t->st->nbytes);   /* a mapping is the file's pages */
    lua_setfield(L, -4, l->v[k].name);
    lua_pushstring(L, l->v[k].name);
    lua_rawseti(L, -2, (lua_Integer)k + 1);
  }
  for (size_t k = 0; k < l->nmeta; k++) {
    lua_pushstring(L, l->meta[k].value);
    lua_setfield(L, -3, l->meta[k].key);
  }
  return 3;
}

/* Call copy_ (the function under the two values on top) with grad mode
** off: a parameter requires grad, and a load is no step of its history
** (PyTorch's load_state_dict copies under no_grad too).  Grad mode is
** restored whatever happens. */
static void copy_no_grad(lua_State *L) {
  int was = ag_grad_enabled(), rc;
  ag_set_grad_enabled(0);
  rc = lua_pcall(L, 2, 0, 0);
  ag_set_grad_enabled(was);
  if (rc != LUA_OK) lua_error(L);
}

/* Append up to MAX_LISTED names of the list at idx for which present(name)
** in the table at other is false; returns how many there were. */
static int list_absent(lua_State *L, luaL_Buffer *b, int list, int other) {
  lua_Integer n = (lua_Integer)lua_rawlen(L, list), i;
  int count = 0;
  for (i = 1; i <= n; i++) {
    int absent;
    lua_rawgeti(L, list, i);
    lua_pushvalue(L, -1);
    absent = lua_rawget(L, other) == LUA_TNIL;
    lua_pop(L, 1);
    if (absent) {
      if (count < MAX_LISTED) {
        char q[256];
        const char *s = lua_tostring(L, -1);
        lua_pop(L, 1);
        if (count) luaL_addstring(b, ", ");
        /* names from a file reach the terminal escaped */
        luaL_addstring(b, err_quote(s, q, sizeof q));   /* s anchored by the list */
      } else {
        lua_pop(L, 1);
      }
      count++;
    } else {
      lua_pop(L, 1);
    }
  }
  if (count > MAX_LISTED) {
    lua_pushfstring(L, " ... and %d more", count - MAX_LISTED);
    luaL_addvalue(b);
  }
  return count;
}

/* Count names of list at idx absent from the table at other. */
static int count_absent(lua_State *L, int list, int other) {
  lua_Integer n = (lua_Integer)lua_rawlen(L, list), i;
  int count = 0;
  for (i = 1; i <= n; i++) {
    lua_rawgeti(L, list, i);
    count += lua_rawget(L, other) == LUA_TNIL;
    lua_pop(L, 1);
  }
  return count;
}

/* Raise naming the missing and the unexpected tensors, if any. */
static void check_names(lua_State *L, const char *path, int map, int names, int fmap,
                        int fnames) {
  int missing = count_absent(L, names, fmap), unexpected = count_absent(L, fnames, map);
  luaL_Buffer b;
  char q[512];
  if (!missing && !unexpected) return;
  luaL_buffinit(L, &b);
  lua_pushfstring(L, "load_weights: %s does not match the model: ", err_quote(path, q, sizeof q));
  luaL_addvalue(&b);
  if (missing) {
    lua_pushfstring(L, "%d missing in the file (", missing);
    luaL_addvalue(&b);
    list_absent(L, &b, names, fmap);
    luaL_addstring(&b, unexpected ? "); " : ")");
  }
  if (unexpected) {
    lua_pushfstring(L, "%d unexpected in the file (", unexpected);
    luaL_addvalue(&b);
    list_absent(L, &b, fnames, map);
    luaL_addstring(&b, ")");
  }
  luaL_pushresult(&b);
  lua_error(L);
}

/* fl.load_weights(model, path): fill the model's parameters and buffers
** from the file, in place; returns the model. */
static int l_load_weights(lua_State *L) {
  const char *path = luaL_checkstring(L, 2);
  st_list *l;
  lua_Integer n, i;
  int map, names, fmap, fnames;
  fl_err e;

  lua_settop(L, 2);
  push_state(L, 1, "load_weights");
  map = 3;
  names = 4;
  l = push_guard(L);
  err_clear(&e);
  if (st_load(path, l, &e) != FL_OK) return luaL_error(L, "load_weights: %s", e.msg);

  /* the file's tensors become userdata (the guard keeps only the names) */
  lua_createtable(L, 0, (int)l->n);
  fmap = lua_gettop(L);
  lua_createtable(L, (int)l->n, 0);
  fnames = fmap + 1;
  for (size_t k = 0; k < l->n; k++) {
    fl_tensor *t = lfl_newtensor(L);
    *t = l->v[k].t;
    memset(&l->v[k].t, 0, sizeof l->v[k].t);
    if (t->st) lfl_account(L, t->st->nbytes);
    lua_setfield(L, fmap, l->v[k].name);
    lua_pushstring(L, l->v[k].name);
    lua_rawseti(L, fnames, (lua_Integer)k + 1);
  }

  check_names(L, path, map, names, fmap, fnames);

  /* every dtype and shape before any value moves */
  n = (lua_Integer)lua_rawlen(L, names);
  for (i = 1; i <= n; i++) {
    char s1[160], s2[160], q[256];
    const char *name;
    fl_tensor *t, *f;
    lua_rawgeti(L, names, i);
    name = lua_tostring(L, -1);
    t = push_model_tensor(L, map, name, "load_weights");
    lua_getfield(L, fmap, name);
    f = lfl_checktensor(L, -1);
    if (!meta_same_shape(&f->m, &t->m))
      return luaL_error(L, "load_weights: %s: shape %s in file, %s in model",
                        err_quote(name, q, sizeof q), meta_shape_str(&f->m, s1, sizeof s1),
                        meta_shape_str(&t->m, s2, sizeof s2));
    if (f->m.dtype != t->m.dtype)
      return luaL_error(L, "load_weights: %s: dtype %s in file, %s in model",
                        err_quote(name, q, sizeof q),
                        dtype_name(f->m.dtype), dtype_name(t->m.dtype));
    lua_pop(L, 3);
  }

  /* in place, through the tensor's own copy_ (any device) */
  for (i = 1; i <= n; i++) {
    const char *name;
    lua_rawgeti(L, names, i);
    name = lua_tostring(L, -1);
    push_model_tensor(L, map, name, "load_weights");
    lua_getfield(L, -1, "copy_");
    lua_insert(L, -2);
    lua_getfield(L, fmap, name);
    copy_no_grad(L);
    lua_pop(L, 1);
  }
  lua_pushvalue(L, 1);
  return 1;
}

/* A JSON value as Lua: objects and arrays as tables (arrays from 1),
** integral numbers as integers, null as nil (absent, as Lua can hold it). */
static void push_json(lua_State *L, const cJSON *j) {
  luaL_checkstack(L, 3, "load_json: nested too deep");
  if (cJSON_IsObject(j) || cJSON_IsArray(j)) {
    const cJSON *it;
    lua_Integer i = 1;
    lua_newtable(L);
    cJSON_ArrayForEach(it, j) {
      if (cJSON_IsObject(j) && cJSON_IsNull(it)) continue;
      push_json(L, it);
      if (cJSON_IsObject(j)) lua_setfield(L, -2, it->string);
      else lua_rawseti(L, -2, i++);
    }
  } else if (cJSON_IsString(j)) lua_pushstring(L, j->valuestring);
  else if (cJSON_IsBool(j)) lua_pushboolean(L, cJSON_IsTrue(j));
  else if (cJSON_IsNumber(j)) {
    double d = j->valuedouble;
    if (d == (double)(lua_Integer)d && d > -9.0e15 && d < 9.0e15) lua_pushinteger(L, (lua_Integer)d);
    else lua_pushnumber(L, d);
  } else lua_pushboolean(L, 0);          /* null inside an array keeps its place */
}

/* fl.load_json(path) -> value (files up to 64 MiB). */
static int l_load_json(lua_State *L) {
  const char *path = luaL_checkstring(L, 1);
  char *buf, q[256];
  size_t n;
  cJSON *j;
  fl_err e = {0};
  if (file_read_all(path, (uint64_t)64 << 20, &buf, &n, &e) != FL_OK) return luaL_error(L, "load_json: %s", e.msg);
  j = cJSON_ParseWithLength(buf, n);
  if (!j) {
    size_t at = (size_t)(cJSON_GetErrorPtr() ? cJSON_GetErrorPtr() - buf : 0);
    free(buf);
    return luaL_error(L, "load_json: %s: not valid JSON (near byte %d)", err_quote(path, q, sizeof q), (int)at);
  }
  free(buf);
  push_json(L, j);                       /* cJSON nests at most 1000 deep: the stack holds it */
  cJSON_Delete(j);
  return 1;
}

static const luaL_Reg weight_funcs[] = {
  {"load_json", l_load_json},
  {"save_weights", l_save_weights},
  {"load_weights", l_load_weights},
  {"save_safetensors", l_save_safetensors},
  {"load_safetensors", l_load_safetensors},
  {NULL, NULL}
};

/* Register fl.save_weights, fl.load_weights, fl.save_safetensors and
** fl.load_safetensors in the table at fl_index. */
int lfl_open_weights(lua_State *L, int fl_index) {
  fl_index = lua_absindex(L, fl_index);
  lua_pushvalue(L, fl_index);
  luaL_setfuncs(L, weight_funcs, 0);
  lua_pop(L, 1);
  return 0;
}
