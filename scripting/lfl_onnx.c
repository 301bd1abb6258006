/*
** lfl_onnx.c -- ONNX files as Lua values: the parsed model (io/onnx.c) as
** plain tables and tensors, for scripting/onnx.lua to lower onto fl ops.
**
**   fl._onnx_read(path) -> {name=, producer=, ir_version=, opset=,
**       training_opset= (ai.onnx.preview.training's, 0 when not imported),
**       preview_opset= (ai.onnx.preview's, 0 when not imported),
**       ml_opset= (ai.onnx.ml's, 0 when not imported),
**       inputs={{name=, dtype=, dims={3, -1}, dim_names={[2]="N"}}, ...},
**       outputs={...}, initializers={{name=, dtype=, tensor=}, ...},
**       nodes={{name=, op=, domain=, inputs={...}, outputs={...}, implicit={...},
**               attrs={name=value}, kinds={name="ints"}}, ...}, free={}}
**   a graph attribute is a table of the graph's fields (name= to free=):
**   free lists the names of enclosing scopes its nodes read, and a node's
**   implicit the names its subgraphs read
**   fl._onnx_tensor(path) -> tensor, dtype   (one TensorProto file)
**   fl._onnx_data(path, kind) -> value, dtype (a file of kind "tensor",
**       "sequence" or "optional"): a tensor, an array of tensors, or for
**   an optional nil (empty) or either
**   a value's kind is "tensor", "sequence" or "optional" (inner= what an
**   optional holds, "tensor" or "sequence"); dtype its tensors'
**   fl._onnx_image(bytes, pixel_format) -> pixels | nil, why, kind
**       (ImageDecoder, io/image.c): bytes a 1-d int64 tensor of byte
**   values (a uint8 tensor as the loader holds it), pixel_format "RGB",
**   "BGR" or "Grayscale"; pixels an int64 [H, W, C] tensor.  An image
**   that cannot be decoded is nil, the reason, and kind "unsupported"
**   (valid, but not by this build) or "invalid"; reading the bytes of a
**   lazy tensor is a graph break (an error under fl.capture)
**
** dtype is ONNX's name ("float", "int32"): a widened integer type keeps its
** own name though its tensor is int64.  The parsed model sits in a
** userdata whose __gc frees it, so a raise while pushing leaks nothing;
** each tensor's storage moves into its userdata.
*/
#include <stdlib.h>
#include <string.h>

#include "lfl.h"
#include "io/image.h"
#include "io/onnx.h"
#include "scripting/onnx_lua.h"   /* static const unsigned char onnx_lua[] */

#define MODEL_GUARD "fl.onnx_model"

static int guard_gc(lua_State *L) {
  onnx_model_free((onnx_model *)luaL_checkudata(L, 1, MODEL_GUARD));
  return 0;
}

static void push_tensor(lua_State *L, onnx_tensor *t) {
  lfl_pushmoved(L, &t->t);
}

static const char *value_kind(int k) {
  return k == ONNX_KIND_SEQUENCE ? "sequence" : k == ONNX_KIND_OPTIONAL ? "optional"
       : k == ONNX_KIND_TENSOR ? "tensor" : "unknown";
}

static void push_value(lua_State *L, const onnx_value *v) {
  lua_createtable(L, 0, 6);
  lua_pushstring(L, v->name);
  lua_setfield(L, -2, "name");
  lua_pushstring(L, value_kind(v->kind));
  lua_setfield(L, -2, "kind");
  if (v->kind == ONNX_KIND_OPTIONAL) {
    lua_pushstring(L, value_kind(v->inner));
    lua_setfield(L, -2, "inner");
  }
  lua_pushstring(L, v->elem ? onnx_dtype_name(v->elem) : "unknown");
  lua_setfield(L, -2, "dtype");
  if (v->ndim >= 0) {
    lua_createtable(L, v->ndim, 0);
    for (int i = 0; i < v->ndim; i++) {
      lua_pushinteger(L, v->dims[i]);
      lua_rawseti(L, -2, i + 1);
    }
    lua_setfield(L, -2, "dims");
  }
  lua_newtable(L);
  for (int i = 0; i < FL_MAX_DIMS; i++)
    if (v->dim_names[i]) {
      lua_pushstring(L, v->dim_names[i]);
      lua_rawseti(L, -2, i + 1);
    }
  lua_setfield(L, -2, "dim_names");
}

static const char *kind_name(onnx_attr_kind k) {
  switch (k) {
  case ONNX_ATTR_FLOAT: return "float";
  case ONNX_ATTR_INT: return "int";
  case ONNX_ATTR_STRING: return "string";
  case ONNX_ATTR_TENSOR: return "tensor";
  case ONNX_ATTR_GRAPH: return "graph";
  case ONNX_ATTR_FLOATS: return "floats";
  case ONNX_ATTR_INTS: return "ints";
  case ONNX_ATTR_STRINGS: return "strings";
  case ONNX_ATTR_TYPE: return "type";
  default: return "other";
  }
}

static void push_graph(lua_State *L, onnx_model *m);
static void push_graph_fields(lua_State *L, onnx_model *m);

static void push_attr(lua_State *L, onnx_attr *a) {
  switch (a->kind) {
  case ONNX_ATTR_FLOAT: lua_pushnumber(L, a->f); break;
  case ONNX_ATTR_INT: lua_pushinteger(L, a->i); break;
  case ONNX_ATTR_STRING: lua_pushstring(L, a->s); break;
  case ONNX_ATTR_TENSOR:
    lua_createtable(L, 0, 2);
    push_tensor(L, a->t);
    lua_setfield(L, -2, "tensor");
    lua_pushstring(L, onnx_dtype_name(a->t->elem));
    lua_setfield(L, -2, "dtype");
    break;
  case ONNX_ATTR_GRAPH: push_graph(L, a->g); break;
  case ONNX_ATTR_TYPE: push_value(L, a->ty); break;
  case ONNX_ATTR_FLOATS:
  case ONNX_ATTR_INTS:
  case ONNX_ATTR_STRINGS:
    lua_createtable(L, (int)a->n, 0);
    for (size_t i = 0; i < a->n; i++) {
      if (a->kind == ONNX_ATTR_FLOATS) lua_pushnumber(L, a->floats[i]);
      else if (a->kind == ONNX_ATTR_INTS) lua_pushinteger(L, a->ints[i]);
      else lua_pushstring(L, a->strings[i]);
      lua_rawseti(L, -2, (lua_Integer)i + 1);
    }
    break;
  default: lua_pushboolean(L, 1); break;
  }
}

static void push_names(lua_State *L, char **v, int n) {
  lua_createtable(L, n, 0);
  for (int i = 0; i < n; i++) {
    lua_pushstring(L, v[i]);
    lua_rawseti(L, -2, i + 1);
  }
}

static void push_node(lua_State *L, onnx_node *nd) {
  lua_createtable(L, 0, 8);
  lua_pushstring(L, nd->name);
  lua_setfield(L, -2, "name");
  lua_pushstring(L, nd->op_type);
  lua_setfield(L, -2, "op");
  lua_pushstring(L, nd->domain);
  lua_setfield(L, -2, "domain");
  push_names(L, nd->in, nd->nin);
  lua_setfield(L, -2, "inputs");
  push_names(L, nd->out, nd->nout);
  lua_setfield(L, -2, "outputs");
  push_names(L, nd->implicit, nd->nimplicit);
  lua_setfield(L, -2, "implicit");
  lua_newtable(L);
  lua_newtable(L);
  for (int i = 0; i < nd->nattr; i++) {
    push_attr(L, &nd->attr[i]);
    lua_setfield(L, -3, nd->attr[i].name);
    lua_pushstring(L, kind_name(nd->attr[i].kind));
    lua_setfield(L, -2, nd->attr[i].name);
  }
  lua_setfield(L, -3, "kinds");
  lua_setfield(L, -2, "attrs");
}

static int l_onnx_read(lua_State *L) {
  const char *path = luaL_checkstring(L, 1);
  onnx_model *m = (onnx_model *)lua_newuserdatauv(L, sizeof *m, 0);
  fl_err e;
  memset(m, 0, sizeof *m);
  if (luaL_newmetatable(L, MODEL_GUARD)) {
    lua_pushcfunction(L, guard_gc);
    lua_setfield(L, -2, "__gc");
  }
  lua_setmetatable(L, -2);
  err_clear(&e);
  if (onnx_load(path, m, &e) != FL_OK) {
    lua_pushfstring(L, "load_onnx: %s", e.msg);
    return lua_error(L);
  }
  lua_createtable(L, 0, 11);
  lua_pushstring(L, m->producer);
  lua_setfield(L, -2, "producer");
  lua_pushinteger(L, m->ir_version);
  lua_setfield(L, -2, "ir_version");
  lua_pushinteger(L, m->opset);
  lua_setfield(L, -2, "opset");
  lua_pushinteger(L, ONNX_MAX_OPSET);
  lua_setfield(L, -2, "max_opset");
  lua_pushinteger(L, m->training_opset);
  lua_setfield(L, -2, "training_opset");
  lua_pushinteger(L, m->preview_opset);
  lua_setfield(L, -2, "preview_opset");
  lua_pushinteger(L, m->ml_opset);
  lua_setfield(L, -2, "ml_opset");
  push_graph_fields(L, m);
  onnx_model_free(m);
  return 1;
}

/* The graph's fields of the table on the stack's top: name, inputs,
** outputs, initializers, nodes (and, for a subgraph, free: the names of
** enclosing scopes it reads). */
static void push_graph_fields(lua_State *L, onnx_model *m) {
  lua_pushstring(L, m->name);
  lua_setfield(L, -2, "name");
  push_names(L, m->free_names, m->nfree);
  lua_setfield(L, -2, "free");
  lua_createtable(L, m->nin, 0);
  for (int i = 0; i < m->nin; i++) {
    push_value(L, &m->in[i]);
    lua_rawseti(L, -2, i + 1);
  }
  lua_setfield(L, -2, "inputs");
  lua_createtable(L, m->nout, 0);
  for (int i = 0; i < m->nout; i++) {
    push_value(L, &m->out[i]);
    lua_rawseti(L, -2, i + 1);
  }
  lua_setfield(L, -2, "outputs");
  lua_createtable(L, m->ninit, 0);
  for (int i = 0; i < m->ninit; i++) {
    lua_createtable(L, 0, 3);
    lua_pushstring(L, m->init[i].name);
    lua_setfield(L, -2, "name");
    lua_pushstring(L, onnx_dtype_name(m->init[i].elem));
    lua_setfield(L, -2, "dtype");
    push_tensor(L, &m->init[i]);
    lua_setfield(L, -2, "tensor");
    lua_rawseti(L, -2, i + 1);
  }
  lua_setfield(L, -2, "initializers");
  lua_createtable(L, m->nnode, 0);
  for (int i = 0; i < m->nnode; i++) {
    push_node(L, &m->node[i]);
    lua_rawseti(L, -2, i + 1);
  }
  lua_setfield(L, -2, "nodes");
}

static void push_graph(lua_State *L, onnx_model *m) {
  lua_createtable(L, 0, 6);
  push_graph_fields(L, m);
}

static int l_onnx_tensor(lua_State *L) {
  const char *path = luaL_checkstring(L, 1);
  onnx_tensor ot;
  fl_err e;
  err_clear(&e);
  if (onnx_tensor_load(path, &ot, &e) != FL_OK) {
    lua_pushfstring(L, "load_onnx_tensor: %s", e.msg);
    return lua_error(L);
  }
  lfl_pushmoved(L, &ot.t);
  lua_pushstring(L, onnx_dtype_name(ot.elem));
  lua_pushstring(L, ot.name);
  onnx_tensor_free(&ot);
  return 3;
}

#define DATA_GUARD "fl.onnx_data"

static int data_gc(lua_State *L) {
  onnx_data_free((onnx_data *)luaL_checkudata(L, 1, DATA_GUARD));
  return 0;
}

static int l_onnx_data(lua_State *L) {
  static const char *const kinds[] = {"tensor", "sequence", "optional", NULL};
  const char *path = luaL_checkstring(L, 1);
  int kind = luaL_checkoption(L, 2, NULL, kinds);
  onnx_data *d = (onnx_data *)lua_newuserdatauv(L, sizeof *d, 0);
  fl_err e;
  memset(d, 0, sizeof *d);
  if (luaL_newmetatable(L, DATA_GUARD)) {
    lua_pushcfunction(L, data_gc);
    lua_setfield(L, -2, "__gc");
  }
  lua_setmetatable(L, -2);
  err_clear(&e);
  if (onnx_data_load(path, kind, d, &e) != FL_OK) {
    lua_pushfstring(L, "load_onnx_data: %s", e.msg);
    return lua_error(L);
  }
  if (!d->has) {
    lua_pushnil(L);
    lua_pushstring(L, "unknown");
  } else if (d->inner == ONNX_KIND_TENSOR) {
    lua_pushstring(L, onnx_dtype_name(d->t[0].elem));
    push_tensor(L, &d->t[0]);
    lua_insert(L, -2);
  } else {
    lua_createtable(L, (int)d->n, 0);
    for (size_t i = 0; i < d->n; i++) {
      push_tensor(L, &d->t[i]);
      lua_rawseti(L, -2, (lua_Integer)i + 1);
    }
    lua_pushstring(L, d->n ? onnx_dtype_name(d->t[0].elem) : "unknown");
  }
  onnx_data_free(d);
  return 2;
}

#define IMAGE_GUARD "fl.onnx_image"

static int image_gc(lua_State *L) {
  image *im = (image *)luaL_checkudata(L, 1, IMAGE_GUARD);
  free(im->px);
  im->px = NULL;
  return 0;
}

static int l_onnx_image(lua_State *L) {
  static const char *const formats[] = {"RGB", "BGR", "Grayscale", NULL};
  static const image_pixels want[] = {IMAGE_RGB, IMAGE_BGR, IMAGE_GRAY};
  const fl_tensor *t = lfl_readable(L, 1, "ImageDecoder");
  int f = luaL_checkoption(L, 2, "RGB", formats);
  int64_t n, i;
  unsigned char *bytes;
  image *im;
  fl_tensor *o;
  fl_meta m = {0};
  fl_err e;
  if (t->m.dtype != FL_I64 || t->m.ndim != 1)
    return luaL_error(L, "_onnx_image: expected a 1-d int64 tensor of byte values");
  n = t->m.shape[0];
  bytes = (unsigned char *)lua_newuserdatauv(L, n ? (size_t)n : 1, 0);   /* freed by the collector */
  for (i = 0; i < n; i++) {
    int64_t v = *(const int64_t *)ten_elem_ptr(t, i);
    if (v < 0 || v > 255) return luaL_error(L, "_onnx_image: byte %I is %I, not in [0, 255]", (lua_Integer)i, (lua_Integer)v);
    bytes[i] = (unsigned char)v;
  }
  /* the pixels belong to a guard until they are copied into the tensor,
  ** so a raise in between leaks nothing */
  im = (image *)lua_newuserdatauv(L, sizeof *im, 0);
  memset(im, 0, sizeof *im);
  if (luaL_newmetatable(L, IMAGE_GUARD)) {
    lua_pushcfunction(L, image_gc);
    lua_setfield(L, -2, "__gc");
  }
  lua_setmetatable(L, -2);
  err_clear(&e);
  if (image_decode(bytes, (size_t)n, want[f], im, &e) != FL_OK) {
    lua_pushnil(L);
    lua_pushstring(L, e.msg);
    lua_pushstring(L, e.code == FL_EUNSUPPORTED ? "unsupported" : "invalid");
    return 3;
  }
  m.dtype = FL_I64;
  m.device = FL_DEV_CPU;
  m.ndim = 3;
  m.shape[0] = (int64_t)im->h;
  m.shape[1] = (int64_t)im->w;
  m.shape[2] = (int64_t)im->c;
  o = lfl_pushempty(L, &m, "ImageDecoder");
  {
    int64_t *dst = (int64_t *)ten_data(o);
    size_t k, total = im->h * im->w * im->c;
    for (k = 0; k < total; k++) dst[k] = im->px[k];
  }
  free(im->px);
  im->px = NULL;
  return 1;
}

static const luaL_Reg onnx_funcs[] = {
  {"_onnx_read", l_onnx_read},
  {"_onnx_tensor", l_onnx_tensor},
  {"_onnx_data", l_onnx_data},
  {"_onnx_image", l_onnx_image},
  {NULL, NULL}
};

void lfl_open_onnx(lua_State *L, int lib) {
  lib = lua_absindex(L, lib);
  lua_pushvalue(L, lib);
  luaL_setfuncs(L, onnx_funcs, 0);
  lua_pop(L, 1);
  /* the Lua half: fl.load_onnx and the op table */
  if (luaL_loadbuffer(L, (const char *)onnx_lua, sizeof onnx_lua, "=onnx.lua") != LUA_OK)
    lua_error(L);
  lua_pushvalue(L, lib);
  lua_call(L, 1, 0);
}
