/*
** meta.c -- the REPL's `:` commands and their help texts.
**
** A line starting with ':' (but not '::', a Lua label) is a command, never
** Lua.  A command may be shortened to any unique prefix (`:h`, `:q`).
** Commands report their own mistakes and never end the session, except
** :quit.
*/
#include "config.h"

#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <lua.h>
#include <lauxlib.h>

#include "graph/file.h"
#include "graph/op.h"
#include "repl/repl.h"

const char *const repl_meta_names[] = {
  "help", "load", "time", "device", "draw", "memory", "projector", "quit", NULL
};

const char *const repl_help_topics[] = {
  "tensors", "ops", "train", "llm", "repl", "compile", "lesson", NULL
};

static const char overview[] =
  "Type Lua.  A line that is an expression prints its value (a trailing ;\n"
  "stops that); unfinished input continues on a ..> line.  Globals: fl\n"
  "(everything) and nn (modules).  Tab completes names, fields and methods.\n"
  "\n"
  "Commands (any unique prefix will do, e.g. :h, :q):\n"
  "  :help [topic]   this text, or help on a topic\n"
  "  :help NAME      a function, method or module, from doc/API.md\n"
  "                  (:help fl.zeros, :help x:reshape, :help stats; ? NAME too)\n"
  "  :load file      run a Lua file in this session\n"
  "  :load m.onnx [as NAME]  load a model into the global NAME, else model\n"
  "                  (model2, model3, ... when model already holds a value)\n"
  "  :time on|off    print the wall time each line takes (one run)\n"
  "  :time EXPR      run EXPR repeatedly: median, spread, noisy or not\n"
  "  :device         which devices fuselab can run on\n"
  "  :draw [file]    draw the last result (a Graph, Plan, Program or compiled\n"
  "                  function) to file (.svg .png .pdf .dot; fuselab-draw.svg)\n"
  "                  and open it ($FUSELAB_VIEWER, else xdg-open on a desktop)\n"
  "  :memory [expr]  bytes alive at each step of a Graph, Plan, Program or\n"
  "                  compiled function (the last result when no expr): each\n"
  "                  peak, op by op and fused, with the buffers alive there\n"
  "  :projector on|off  large type and lines in every picture (for a room)\n"
  "  :quit           leave (Ctrl-D on an empty line does too)\n"
  "\n"
  "Topics: tensors  ops  train  llm  repl  compile  lesson [N]     (:help tensors)\n";

static const char help_tensors[] =
  "Tensors\n"
  "  x = fl.tensor{{1,2},{3,4}}           from nested tables\n"
  "  fl.zeros(2,3)  fl.ones{2,3}  fl.full({2,3}, 7)  fl.arange(10)  fl.eye(3)\n"
  "  fl.rand(4,4)  fl.randn(4,4)          fl.manual_seed(0) makes them repeatable\n"
  "  options last: fl.zeros(2,3, {dtype=\"float16\", device=\"cuda\"})\n"
  "  dtypes: float32 (default) float16 bfloat16 int64 bool; devices: cpu cuda\n"
  "\n"
  "  x.shape  x.dtype  x.device  x:dim()  x:numel()  x:size(d)\n"
  "  x:item()  x:tolist()  print(x)       values, then [float32 tensor of size 2x3]\n"
  "  x:to(\"float16\")  x:to(\"cuda\")  x:cuda()  x:cpu()\n"
  "  x[i]  x[i] = v    the i-th slice along dim 1 (a number for 1-D), as in Torch7\n"
  "  dimensions are 1-based; -1 is the last\n"
  "\n"
  "  fl.save(x, \"x.npy\")  fl.load(\"x.npy\")    NumPy files, to and from PyTorch\n"
  "  fl.allclose(a, b, rtol, atol)   fl.now()   fl.synchronize()\n";

/* :help ops: the elementwise, compare and reduction lines are the op
** table's own rows (help_op_rows), so a row added to graph/ops.def is
** listed without an edit here; the rest names signatures. */
static const char help_ops_head[] =
  "Operations (methods, x:exp(), and most also as fl.exp(x))\n"
  "  operators    + - * / ^ % and unary -; numbers and tensors broadcast (NumPy rules)\n";
static const char help_ops[] =
  "  composites   softmax(dim) log_softmax(dim) layer_norm(shape, w, b, eps)\n"
  "               rms_norm(shape, w, eps)\n"
  "  linear alg.  matmul (batched, broadcast)  fl.linear(x, w, b)\n"
  "               fl.matmul_int8(a, b, {a_type=, b_type=, a_zero=, b_zero=})\n"
  "  views        reshape view transpose permute unsqueeze squeeze expand narrow\n"
  "               slice(dim, start, stop, step) contiguous  fl.cat(list, dim)\n"
  "               flip(dims) fl.pad(x, pads, {mode=, value=}) fl.gather(x, dim, idx)\n"
  "  vision       fl.conv2d(x, w, b, {stride=, padding=, dilation=, groups=})\n"
  "               max_pool2d(k, {ceil_mode=, ...}) avg_pool2d(k, ...)\n"
  "               fl.batch_norm(x, mean, var, w, b, eps | {eps=, batch_stats=})\n"
  "  in place     copy_(y) fill_(v) zero_() add_(y) mul_(y)\n"
  "  other        fl.embedding(idx, weight)\n"
  "\n"
  "Modules (nn): Linear(i, o) ReLU GELU SiLU Tanh Sigmoid Softmax(dim)\n"
  "  LayerNorm(d) RMSNorm(d) Dropout(p) Embedding(n, d) Conv2d(ci, co, k)\n"
  "  BatchNorm2d(c) MaxPool2d AvgPool2d Flatten Sequential(...)\n"
  "  MultiheadAttention(d, heads) TransformerBlock(d, heads)\n"
  "  m(x) or m:forward(x); m:parameters()\n"
  "Semantics follow PyTorch (var is unbiased, gelu is exact): results can be\n"
  "checked against it.\n";

/* One group of op table rows a user can call (fl.<name> exists): "  label
** name name ...", wrapped at 80 columns under the label; `extra` ends the
** last line. */
static void op_group(lua_State *L, const char *label, int (*in_group)(fl_op), const char *extra) {
  int col = printf("  %-13s", label), op, first = 1, top = lua_gettop(L);
  lua_getglobal(L, "fl");
  for (op = 0; op < OP_COUNT; op++) {
    const char *name = op_name((fl_op)op);
    int bound;
    if (!in_group((fl_op)op)) continue;
    bound = lua_istable(L, top + 1) && lua_getfield(L, top + 1, name) != LUA_TNIL;
    lua_settop(L, top + 1);
    if (!bound) continue;
    if (!first && col + 1 + (int)strlen(name) > 80) {
      printf("\n  %-13s", "");
      col = 15;
      first = 1;
    }
    col += printf("%s%s", first ? "" : " ", name);
    first = 0;
  }
  lua_settop(L, top);
  if (extra) printf("%s%s", col + 2 + (int)strlen(extra) > 80 ? "\n               " : "  ", extra);
  printf("\n");
}

static int is_compare(fl_op op) { return op_info_of(op)->infer == infer_compare; }
static int is_elementwise(fl_op op) {
  const op_info *oi = op_info_of(op);
  return (oi->kind == OPK_ELEMWISE || oi->kind == OPK_BROADCAST) &&
         !(oi->flags & (OPF_RANDOM | OPF_COMPOSITE)) && !is_compare(op) && op != OP_TO && op != OP_WHERE;
}
static int is_reduction(fl_op op) {
  const op_info *oi = op_info_of(op);
  return oi->kind == OPK_REDUCTION && !(oi->flags & OPF_COMPOSITE);
}

static void help_op_rows(lua_State *L) {
  op_group(L, "elementwise", is_elementwise, "fl.where(c, a, b)");
  op_group(L, "compare", is_compare, NULL);
  op_group(L, "reductions", is_reduction, "(dim, keepdim)");
}

static const char help_train[] =
  "Training (PyTorch's names and formulas)\n"
  "  w = fl.randn(3, 4, {requires_grad = true})   or w:requires_grad_()\n"
  "  loss = fl.cross_entropy(m(x), y)   fl.mse_loss  fl.l1_loss  fl.nll_loss\n"
  "  loss:backward()   w.grad   w.grad = nil   loss.grad_fn   x:detach()\n"
  "  fl.no_grad(function() ... end)   fl.grad(outputs, inputs)\n"
  "  fl.grad(y, {x}, {create_graph = true})   gradients of gradients\n"
  "  fl.draw(loss, \"autograd.svg\")   what backward computes and keeps\n"
  "  (fl.backward_graph(loss) is that graph; FUSELAB_DEBUG=autograd times it)\n"
  "\n"
  "  opt = fl.optim.AdamW(m:parameters(), {lr = 1e-3})   SGD  Adam\n"
  "  opt:zero_grad()  loss:backward()  opt:step()\n"
  "  fl.optim.lr_scheduler.StepLR(opt, {step_size = 10})  CosineAnnealingLR\n"
  "  fl.nn.utils.clip_grad_norm_(m:parameters(), 1.0)\n"
  "  m:train()  m:eval()   BatchNorm2d and Dropout follow the mode\n"
  "  fl.save_checkpoint(path, {model = m, optimizer = opt})   load_checkpoint\n"
  "\n"
  "  Compiled: step = fl.compile(loss_fn); loss = step(x, y); loss:backward()\n"
  "    (a compiled forward and backward; step:stats().backward_graphs, step:training())\n"
  "  Step by step (AOTAutograd): j = fl.capture(loss_fn, x, y):joint()\n"
  "  fw, bw, info = j:partition{policy = \"mincut\"}   save_all  recompute_all\n"
  "  fl.draw(j, \"joint.svg\", {partition = \"mincut\"})   what is saved, recomputed\n"
  "A whole run: fuselab examples/train_digits.lua (98 % on handwritten digits);\n"
  "compiled training: lesson 09 (:help lesson 9).\n";

static const char help_llm[] =
  "Language models (GPT-2 and the Llama family)\n"
  "  m, tok = fl.models.load_pretrained(\"dir\")   config.json, safetensors, tokenizer\n"
  "  ids = tok:encode(\"Hello\")   tok:decode(ids)   fl.tokenizer(\"tokenizer.json\")\n"
  "  logits = m(fl.tensor(ids, {dtype = \"int64\"}))\n"
  "  out, st = m:generate(ids, {max_new_tokens = 32, temperature = 0.8, top_k = 40,\n"
  "                             top_p = 0.95, seed = 1, compile = true})\n"
  "  fl.generate(m, tok, \"The compiler\", {max_new_tokens = 40});   streams the text\n"
  "                 (it returns the text and the stats too: the ; keeps them unprinted)\n"
  "  fl.checklist(m, {prompt = \"...\", tok = tok})   should decoding be compiled?\n"
  "  m = fl.models.gpt2{}  fl.models.llama{}   the same models, random weights\n"
  "The KV cache is static: one compiled decode step serves every position\n"
  "(st.step_compiles), the prefill compiles once for every prompt length.\n"
  "Prefill against decode, bytes per token, what compiling buys: lesson 10.\n";

static const char help_repl_fmt[] =
  "The REPL\n"
  "  1 + 1          prints 2; several values print separated by tabs\n"
  "  x = f(y);      a trailing ; prints nothing\n"
  "  function f(x)  unfinished input continues on ..> lines\n"
  "  Tab            completes globals (pri), fields (fl.ze, x.sh) and methods\n"
  "                 (x:res, cm:st); inside a string, file names\n"
  "  ? NAME         doc/API.md's entry on a function or method (? x:sum)\n"
  "  long tables    print over lines; at most 4 levels, 32 entries a level,\n"
  "                 400 lines; a table inside itself shows as <cycle>\n"
  "  Up, Down, Ctrl-R   history, kept in %s\n"
  "  Ctrl-C         stops a running computation (Lua code at once, a C\n"
  "                 kernel when it returns; a third press quits); at the\n"
  "                 prompt, drops the line\n"
  "  Ctrl-D         leaves (on an empty line)\n"
  "Errors print a traceback; the session goes on.  A misspelt method, field\n"
  "or global ends with the nearest names: `...; did you mean decompose?`\n"
  "From the shell: fuselab file.lua args | -e code | -i file.lua | - (stdin);\n"
  "fuselab --help says more.\n";

static const char help_compile[] =
  "Compiling (torch.compile for Lua)\n"
  "  cm = fl.compile(fn_or_module, {backend=\"auto\"|\"cpu\"|\"cuda\"|\"eager\",\n"
  "                  mode=\"default\"|\"reduce-overhead\"|\"max-autotune\",\n"
  "                  dynamic=nil|true|false, fullgraph=false, fuse=true})\n"
  "  y = cm(x)         the first call captures, compiles and runs; later calls\n"
  "                    check the guards and run the cached kernels\n"
  "  cm:stats()  cm:explain()  cm:code()  cm:kernels()  cm:graphs()\n"
  "\n"
  "Step by step:\n"
  "  g = fl.capture(model, x)    print(g) lists the graph\n"
  "  g = g:decompose():optimize()\n"
  "  p = g:fuse{explain=true}    p:decisions() says what fused and why\n"
  "  k = p:codegen(\"cpu\")        print(k) shows the generated source\n"
  "  y = k:run(x)\n"
  "Pictures and numbers: fl.draw(p, \"p.svg\")  fl.report(cm, \"review.html\")\n"
  "  fl.checklist(fn, {inputs={x}})  fl.explain(fn, x)\n"
  "FUSELAB_DEBUG=1..5 in the environment traces kernels, fusion, source, IR.\n";

/* ---- :help lesson [N] ------------------------------------------------------
** The lessons are examples/lessons/NN_name.lua, each opening with a comment
** that states the claim it checks; the help is that comment, read from the
** file, so it never goes stale. */

/* The source tree this binary was built from (a build directory), else the
** installed copy: the first that exists, or NULL. */
static const char *lessons_dir(void) {
  static const char *const dirs[] = {
#ifdef FL_LESSONS_SRC_DIR
    FL_LESSONS_SRC_DIR,
#endif
#ifdef FL_LESSONS_DIR
    FL_LESSONS_DIR,
#endif
    NULL
  };
  struct stat st;
  int i;
  for (i = 0; dirs[i]; i++)
    if (stat(dirs[i], &st) == 0 && S_ISDIR(st.st_mode)) return dirs[i];
  return NULL;
}

/* Fills path with lesson n's file (dir/NN_*.lua); 0 when there is none. */
static int lesson_path(const char *dir, long n, char *path, size_t size) {
  DIR *d = opendir(dir);
  struct dirent *de;
  char prefix[16];
  int found = 0;
  if (!d || n < 1 || n > 99) {
    if (d) closedir(d);
    return 0;
  }
  snprintf(prefix, sizeof prefix, "%02ld_", n);
  while (!found && (de = readdir(d)) != NULL) {
    size_t len = strlen(de->d_name);
    if (strncmp(de->d_name, prefix, 3) == 0 && len > 7 &&
        strcmp(de->d_name + len - 4, ".lua") == 0) {
      snprintf(path, size, "%s/%s", dir, de->d_name);
      found = 1;
    }
  }
  closedir(d);
  return found;
}

/* Prints the leading "--" lines of the file at path without the dashes;
** with title_only, only the first, after its "Lesson NN: ". */
static void lesson_header(const char *path, int title_only) {
  FILE *f = fopen(path, "r");
  char line[512];
  if (!f) {
    fprintf(stderr, "cannot read %s\n", path);
    return;
  }
  while (fgets(line, sizeof line, f) && strncmp(line, "--", 2) == 0) {
    const char *text = line + 2 + (line[2] == ' ');
    if (title_only) {
      const char *colon = strstr(text, ": ");
      fputs(colon ? colon + 2 : text, stdout);
      break;
    }
    fputs(*text ? text : "\n", stdout);
  }
  fclose(f);
}

/* arg: "" (list the lessons) or the lesson's number. */
static void lesson(const char *arg) {
  const char *dir = lessons_dir();
  char path[4096], *end;
  long n;
  if (!dir) {
    fputs("the lessons are not installed with this build (examples/lessons/ in the "
          "source tree)\n", stderr);
    return;
  }
  arg += strspn(arg, " \t");
  if (*arg == '\0') {
    puts("Lessons (:help lesson N shows one; each runs in under 30 s on a CPU):");
    for (n = 1; n <= 99; n++)
      if (lesson_path(dir, n, path, sizeof path)) {
        printf("  %2ld  ", n);
        lesson_header(path, 1);
      }
    return;
  }
  n = strtol(arg, &end, 10);
  if (end == arg || *end != '\0' || !lesson_path(dir, n, path, sizeof path)) {
    fprintf(stderr, "no lesson '%s' (:help lesson lists them)\n", arg);
    return;
  }
  lesson_header(path, 0);
  printf("\nRun it:  fuselab %s\n  or here:  :load %s\n", path, path);
}

/* "lesson", "lessons", "lesson 3", "lesson3": the text after the word, or
** NULL when topic is another one. */
static const char *lesson_topic(const char *topic) {
  if (strncmp(topic, "lesson", 6) != 0) return NULL;
  topic += 6;
  if (*topic == 's') topic++;
  if (*topic != '\0' && *topic != ' ' && *topic != '\t' && (*topic < '0' || *topic > '9'))
    return NULL;
  return topic;
}

static void help_name(const char *name);

static void help(struct repl *r, const char *topic) {
  if (topic[0] == '\0') fputs(overview, stdout);
  else if (strcmp(topic, "tensors") == 0) fputs(help_tensors, stdout);
  else if (strcmp(topic, "ops") == 0) {
    fputs(help_ops_head, stdout);
    help_op_rows(r->L);
    fputs(help_ops, stdout);
  }
  else if (strcmp(topic, "train") == 0) fputs(help_train, stdout);
  else if (strcmp(topic, "llm") == 0) fputs(help_llm, stdout);
  else if (strcmp(topic, "repl") == 0) {
    char *h = r->history ? NULL : repl_history_path();
    const char *where = r->history ? r->history : h;
    printf(help_repl_fmt, where ? where : "(nowhere: HOME is unset)");
    free(h);
  }
  else if (strcmp(topic, "compile") == 0) {
    int top = lua_gettop(r->L);
    fputs(help_compile, stdout);
    /* the contract runs ahead of the code while the pipeline is built */
    lua_getglobal(r->L, "fl");
    if (lua_type(r->L, -1) == LUA_TTABLE &&
        lua_getfield(r->L, -1, "compile") == LUA_TNIL)
      fputs("(fl.compile is not in this build yet.)\n", stdout);
    lua_settop(r->L, top);
  }
  else if (lesson_topic(topic)) lesson(lesson_topic(topic));
  else help_name(topic);
}

/* :help NAME for a function, method or module (apidoc.c); when nothing
** documents the name, the topics and the nearest names. */
static void help_name(const char *arg) {
  char name[256];
  int i;
  snprintf(name, sizeof name, "%.*s", (int)strcspn(arg, " \t("), arg);  /* x:sum(1) */
  if (repl_apidoc(name)) return;
  printf("no help on '%s'; topics:", name);
  for (i = 0; repl_help_topics[i]; i++) printf(" %s", repl_help_topics[i]);
  putchar('\n');
  repl_apidoc_suggest(name);
}

void repl_help_line(struct repl *r, const char *line) {
  line += strspn(line + 1, " \t") + 1;
  if (*line == '\0') help(r, "");
  else help_name(line);
  fflush(stdout);
}

/* A global name Lua accepts: letters, digits and '_', and not a keyword
** (`NAME = nil` compiles; compiled only, never run). */
static int global_name(lua_State *L, const char *name) {
  const char *p;
  int ok;
  if (!(isalpha((unsigned char)name[0]) || name[0] == '_')) return 0;
  for (p = name; *p; p++)
    if (!(isalnum((unsigned char)*p) || *p == '_')) return 0;
  lua_pushfstring(L, "%s = nil", name);
  ok = luaL_loadstring(L, lua_tostring(L, -1)) == LUA_OK;
  lua_pop(L, 2);
  return ok;
}

/* Whether the global name holds a value (read raw: no __index runs). */
static int global_set(lua_State *L, const char *name) {
  int set;
  lua_pushglobaltable(L);
  lua_pushstring(L, name);
  set = lua_rawget(L, -2) != LUA_TNIL;
  lua_pop(L, 2);
  return set;
}

/* A model file: fl.load_onnx(path), bound to a global and printed as a
** result is.  The global is name when one was given (`:load m.onnx as
** net`), else `model`; a value `model` already holds is never replaced
** silently: the model goes to the first free of model2, model3, ... and
** the REPL says so. */
static void load_onnx(struct repl *r, const char *path, const char *name) {
  lua_State *L = r->L;
  char bound[64];
  int status, n, replaced = 0;
  lua_getglobal(L, "fl");
  if (lua_type(L, -1) != LUA_TTABLE || lua_getfield(L, -1, "load_onnx") != LUA_TFUNCTION) {
    lua_settop(L, 0);
    fputs(":load: fl.load_onnx is not available\n", stderr);
    return;
  }
  lua_remove(L, -2);
  lua_pushstring(L, path);
  status = repl_docall(L, 1, 1);
  if (status == LUA_OK) {
    if (name) {
      snprintf(bound, sizeof bound, "%s", name);
      replaced = global_set(L, bound);
    } else {
      snprintf(bound, sizeof bound, "model");
      for (n = 2; global_set(L, bound) && n < 10000; n++)
        snprintf(bound, sizeof bound, "model%d", n);
    }
    lua_pushglobaltable(L);
    lua_pushstring(L, bound);
    lua_pushvalue(L, -3);
    lua_rawset(L, -3);
    lua_pop(L, 1);
    printf("%s =\n", bound);
    fflush(stdout);
    /* printed through tostring, as results are */
    lua_getglobal(L, "print");
    lua_insert(L, -2);
    status = repl_docall(L, 1, 0);
    if (name && replaced)
      printf("bound to %s, replacing the value it held\n", bound);
    else if (name || strcmp(bound, "model") == 0)
      printf("bound to %s\n", bound);
    else
      printf("bound to %s: model already holds a value (:load FILE as NAME picks the name)\n",
             bound);
  }
  repl_report(L, status, r->colour_err);
  lua_settop(L, 0);
}

/* The Lua file at path compiled onto the stack, as luaL_loadfile would
** (a UTF-8 BOM and a first line starting with '#' skipped, that line
** still counted), but read only from a regular file: a FIFO or a device
** would block the REPL in a read that Ctrl-C cannot end.  The check and
** the read go through one descriptor (graph/file.h), so nothing swapped in
** between is read either.  A status and the chunk or the message. */
static int load_file(lua_State *L, const char *path) {
  fl_err e;
  uint64_t size;
  size_t got = 0, skip = 0;
  char *buf;
  int fd, status;
  err_clear(&e);
  if (file_open_read(path, &fd, &size, &e) != FL_OK) {
    lua_pushfstring(L, "cannot open %s", e.msg);
    return LUA_ERRFILE;
  }
  if (size > (uint64_t)1 << 30 || !(buf = malloc((size_t)size + 1))) {
    close(fd);
    lua_pushfstring(L, "cannot open %s: too large to read (%I bytes)", path, (lua_Integer)size);
    return LUA_ERRFILE;
  }
  while (got < size) {
    ssize_t k = read(fd, buf + got, (size_t)size - got);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) break;                /* shrank since: what is there */
    got += (size_t)k;
  }
  close(fd);
  if (got >= 3 && memcmp(buf, "\xef\xbb\xbf", 3) == 0) skip = 3;
  if (got > skip && buf[skip] == '#') {
    /* the '#' line becomes an empty one: line numbers stay right */
    while (skip < got && buf[skip] != '\n') skip++;
  }
  lua_pushfstring(L, "@%s", path);
  status = luaL_loadbufferx(L, buf + skip, got - skip, lua_tostring(L, -1), NULL);
  lua_remove(L, -2);
  free(buf);
  return status;
}

/* "FILE as NAME": the length of FILE (blanks before "as" dropped) and
** NAME copied; 0 when arg does not end that way. */
static int split_as(const char *arg, size_t *flen, char *name, size_t size) {
  size_t n = strlen(arg), i = n, j;
  while (i > 0 && (isalnum((unsigned char)arg[i - 1]) || arg[i - 1] == '_')) i--;
  if (i == n || n - i >= size || i < 4) return 0;
  j = i;
  if (arg[j - 1] != ' ' && arg[j - 1] != '\t') return 0;
  while (j > 0 && (arg[j - 1] == ' ' || arg[j - 1] == '\t')) j--;
  if (j < 3 || strncmp(arg + j - 2, "as", 2) != 0 ||
      (arg[j - 3] != ' ' && arg[j - 3] != '\t'))
    return 0;
  snprintf(name, size, "%s", arg + i);
  for (j -= 2; j > 0 && (arg[j - 1] == ' ' || arg[j - 1] == '\t'); j--) {}
  *flen = j;
  return 1;
}

/* Runs the file in this state, like dofile but with a traceback and
** Ctrl-C; what it returns is dropped.  A .onnx file is a model instead:
** bound to a global (load_onnx says which) and printed. */
static void load(struct repl *r, const char *arg) {
  lua_State *L = r->L;
  char path[4096], name[64];
  size_t n = strlen(arg);
  const char *home = getenv("HOME");
  int status, named = 0;
  if (n == 0) {
    fputs("usage: :load file.lua | :load model.onnx [as NAME]\n", stderr);
    return;
  }
  named = split_as(arg, &n, name, sizeof name);
  /* a name with spaces may be quoted */
  if (n >= 2 && (arg[0] == '"' || arg[0] == '\'') && arg[n - 1] == arg[0]) {
    arg++;
    n -= 2;
  }
  if (arg[0] == '~' && arg[1] == '/' && home)
    snprintf(path, sizeof path, "%s%.*s", home, (int)n - 1, arg + 1);
  else
    snprintf(path, sizeof path, "%.*s", (int)n, arg);
  n = strlen(path);
  if (n > 5 && strcmp(path + n - 5, ".onnx") == 0) {
    if (named && !global_name(L, name)) {
      fprintf(stderr, ":load %s as %s: '%s' is not a name a global can have\n", path, name, name);
      return;
    }
    load_onnx(r, path, named ? name : NULL);
    return;
  }
  if (named) {
    fprintf(stderr, ":load %s as %s: only a model (.onnx) is bound to a name; a Lua "
            "file sets its own globals\n", path, name);
    return;
  }
  status = load_file(L, path);
  if (status == LUA_OK) status = repl_docall(L, 0, 0);
  repl_report(L, status, r->colour_err);
}

/* :time EXPR -- runs the expression (or statement) repeatedly through
** fl.measure and prints its median, interquartile range and, when the
** runs spread or the machine was busy, that it is noisy (DESIGN §4b). */
static void time_expr(struct repl *r, const char *code) {
  lua_State *L = r->L;
  int top = lua_gettop(L), status;
  lua_pushfstring(L, "return %s", code);
  status = luaL_loadbuffer(L, lua_tostring(L, -1), lua_rawlen(L, -1), "=:time");
  if (status != LUA_OK) {
    lua_pop(L, 1);
    status = luaL_loadbuffer(L, code, strlen(code), "=:time");
  }
  if (status == LUA_OK) {
    int f = lua_gettop(L);
    if (lua_getglobal(L, "fl") == LUA_TTABLE && lua_getfield(L, -1, "measure") == LUA_TFUNCTION) {
      lua_pushvalue(L, f);
      status = repl_docall(L, 1, 1);
      if (status == LUA_OK) {
        printf("%stime %s%s\n", r->colour ? REPL_DIM : "", luaL_tolstring(L, -1, NULL),
               r->colour ? REPL_RESET : "");
        fflush(stdout);
      }
    } else {
      fprintf(stderr, ":time EXPR needs fl.measure, and fl has none here\n");
    }
  }
  repl_report(L, status, r->colour_err);
  lua_settop(L, top);
}

static void timing(struct repl *r, const char *arg) {
  if (strcmp(arg, "on") == 0) r->timing = 1;
  else if (strcmp(arg, "off") == 0) r->timing = 0;
  else if (arg[0] != '\0') {
    time_expr(r, arg);
    return;
  }
  printf("timing is %s%s\n", r->timing ? "on" : "off",
         r->timing ? " (each line runs once: its time is one run; :time EXPR gives a median)" : "");
}

/* CUDA is known through fl.cuda_available() when the bindings have it:
** it returns a boolean and, optionally, a reason or a device name. */
static void device(struct repl *r) {
  lua_State *L = r->L;
  int top = lua_gettop(L);
  long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
  printf("cpu   yes (%ld core%s)\n", ncpu, ncpu == 1 ? "" : "s");
  lua_getglobal(L, "fl");
  if (lua_type(L, -1) != LUA_TTABLE ||
      lua_getfield(L, -1, "cuda_available") != LUA_TFUNCTION) {
    puts("cuda  no (this build has no CUDA support: cpu only)");
  }
  else if (repl_docall(L, 0, 2) != LUA_OK) {
    printf("cuda  unknown: %s\n", lua_tostring(L, -1));
  }
  else {
    const char *why = lua_tostring(L, -1);
    int yes = lua_toboolean(L, -2);
    printf("cuda  %s%s%s%s\n", yes ? "yes" : "no", why ? " (" : "",
           why ? why : "", why ? ")" : "");
  }
  lua_settop(L, top);
}

/* The last value a line returned (not nil), kept in the registry for
** :draw; the REPL calls this for every line that returns something. */
#define LAST_KEY "fuselab.repl.last"

void repl_remember(lua_State *L, int idx) {
  if (lua_isnil(L, idx)) return;
  lua_pushvalue(L, idx);
  lua_setfield(L, LUA_REGISTRYINDEX, LAST_KEY);
}

/* True when an executable named prog is on $PATH. */
static int on_path(const char *prog) {
  const char *path = getenv("PATH"), *p;
  char f[4096];
  if (!path) return 0;
  for (p = path; *p;) {
    size_t n = strcspn(p, ":");
    snprintf(f, sizeof f, "%.*s/%s", (int)(n ? n : 1), n ? p : ".", prog);
    if (access(f, X_OK) == 0) return 1;
    p += n;
    if (*p == ':') p++;
  }
  return 0;
}

/* Opens path in a picture viewer without waiting for it: $FUSELAB_VIEWER
** (a command; "" or "none": never), else xdg-open where a desktop is
** (DISPLAY or WAYLAND_DISPLAY), else nothing, silently: a headless machine
** or a test has no viewer and :draw must not fail there.  The viewer runs
** in a grandchild in its own session with no terminal, so it neither
** blocks the REPL nor leaves a zombie, and its chatter stays off screen. */
static void open_viewer(const char *path) {
  const char *v = getenv("FUSELAB_VIEWER");
  char script[1024];
  pid_t pid;
  if (v) {
    if (!v[0] || strcmp(v, "none") == 0) return;
    /* the command is the user's own; the path goes in as $1, unquoted never */
    snprintf(script, sizeof script, "exec %s \"$1\"", v);
  } else if ((getenv("DISPLAY") || getenv("WAYLAND_DISPLAY")) && on_path("xdg-open")) {
    snprintf(script, sizeof script, "exec xdg-open \"$1\"");
  } else {
    return;
  }
  fflush(stdout);
  fflush(stderr);
  pid = fork();
  if (pid < 0) return;
  if (pid == 0) {
    int fd;
    setsid();
    if (fork() != 0) _exit(0);
    fd = open("/dev/null", O_RDWR);
    if (fd >= 0) {
      dup2(fd, 0);
      dup2(fd, 1);
      dup2(fd, 2);
      if (fd > 2) close(fd);
    }
    execl("/bin/sh", "sh", "-c", script, "sh", path, (char *)NULL);
    _exit(127);
  }
  waitpid(pid, NULL, 0);
}

/* :projector on|off -- every later picture in large type (or normal):
** sets $FUSELAB_DRAW_SCALE, which fl.draw reads when no scale is given. */
static void projector(const char *arg) {
  if (strcmp(arg, "on") == 0) {
    setenv("FUSELAB_DRAW_SCALE", "projector", 1);
    puts("pictures now drawn for a projector (large type and lines); :projector off to undo");
  } else if (strcmp(arg, "off") == 0) {
    unsetenv("FUSELAB_DRAW_SCALE");
    puts("pictures now drawn at normal size");
  } else if (arg[0] == '\0') {
    const char *s = getenv("FUSELAB_DRAW_SCALE");
    printf("projector %s\n", s && strcmp(s, "projector") == 0 ? "on" : "off");
  } else {
    fprintf(stderr, ":projector %s: expected on or off\n", arg);
  }
}

/* :draw [file] -- fl.draw(last result, file); says where the picture went,
** or why the last result cannot be drawn. */
static void draw(struct repl *r, const char *arg) {
  static const char *const drawable[] = {"fl.Graph", "fl.Plan", "fl.Program", "fl.Compiled"};
  lua_State *L = r->L;
  int top = lua_gettop(L), i, ok = 0, status;
  size_t n = strlen(arg);
  char path[4096], cwd[4096];
  const char *home = getenv("HOME"), *type;
  if (n >= 2 && (arg[0] == '"' || arg[0] == '\'') && arg[n - 1] == arg[0]) {
    arg++;
    n -= 2;
  }
  if (n == 0) snprintf(path, sizeof path, "fuselab-draw.svg");
  else if (arg[0] == '~' && arg[1] == '/' && home)
    snprintf(path, sizeof path, "%s%.*s", home, (int)n - 1, arg + 1);
  else snprintf(path, sizeof path, "%.*s", (int)n, arg);
  lua_getfield(L, LUA_REGISTRYINDEX, LAST_KEY);
  if (lua_isnil(L, -1)) {
    fputs(":draw draws the last result, and no line has returned one yet: type the\n"
          "name of a Graph, Plan, Program or compiled function (e.g. `p`), then :draw\n",
          stderr);
    lua_settop(L, top);
    return;
  }
  for (i = 0; i < 4 && !ok; i++) ok = luaL_testudata(L, -1, drawable[i]) != NULL;
  if (!ok && lua_istable(L, -1)) {   /* the table fl.explain returns */
    ok = lua_getfield(L, -1, "graphs") == LUA_TTABLE;
    lua_pop(L, 1);
  }
  if (!ok) {
    type = luaL_getmetafield(L, -1, "__name") == LUA_TSTRING ? lua_tostring(L, -1)
                                                               : luaL_typename(L, -1);
    fprintf(stderr, "cannot draw the last result, a %s: :draw draws a Graph, Plan, Program "
            "or compiled function (type its name first, then :draw)\n", type);
    lua_settop(L, top);
    return;
  }
  type = luaL_getmetafield(L, -1, "__name") == LUA_TSTRING ? lua_tostring(L, -1) : "value";
  lua_getglobal(L, "fl");
  if (!lua_istable(L, -1) || lua_getfield(L, -1, "draw") != LUA_TFUNCTION) {
    fputs("fl.draw is not in this build\n", stderr);
    lua_settop(L, top);
    return;
  }
  lua_pushvalue(L, top + 1);
  lua_pushstring(L, path);
  status = repl_docall(L, 2, 0);
  if (status == LUA_OK) {
    if (path[0] != '/' && getcwd(cwd, sizeof cwd))
      printf("drew the last result (%s) to %s/%s\n", type, cwd, path);
    else
      printf("drew the last result (%s) to %s\n", type, path);
    open_viewer(path);
  }
  repl_report(L, status, r->colour_err);
  lua_settop(L, top);
}

/* :memory [expr] -- fl._memory_text(expr's value, or the last result):
** the peaks op by op and fused, the buffers alive at each, and the steps
** near them (fl.draw_memory draws the same). */
static void memory(struct repl *r, const char *arg) {
  lua_State *L = r->L;
  int top = lua_gettop(L), status;
  lua_getglobal(L, "fl");
  if (!lua_istable(L, -1) || lua_getfield(L, -1, "_memory_text") != LUA_TFUNCTION) {
    fputs("fl.draw_memory is not in this build\n", stderr);
    lua_settop(L, top);
    return;
  }
  if (arg[0] == '\0') {
    lua_getfield(L, LUA_REGISTRYINDEX, LAST_KEY);
    if (lua_isnil(L, -1)) {
      fputs(":memory counts the last result, and no line has returned one yet: type\n"
            ":memory p (a Graph, Plan, Program or compiled function), or its name first\n",
            stderr);
      lua_settop(L, top);
      return;
    }
  } else {
    lua_pushfstring(L, "return %s", arg);
    status = luaL_loadbuffer(L, lua_tostring(L, -1), lua_rawlen(L, -1), "=:memory");
    lua_remove(L, -2);
    if (status == LUA_OK) status = repl_docall(L, 0, 1);
    if (status != LUA_OK) {
      repl_report(L, status, r->colour_err);
      lua_settop(L, top);
      return;
    }
  }
  lua_pushinteger(L, 12);
  status = repl_docall(L, 2, 1);
  if (status == LUA_OK) fputs(lua_tostring(L, -1), stdout);
  repl_report(L, status, r->colour_err);
  lua_settop(L, top);
}

/* The command named by the first word of line, by exact name or unique
** prefix; NULL after saying what is wrong. */
static const char *lookup(const char *word, size_t n) {
  const char *found = NULL;
  int i;
  for (i = 0; n > 0 && repl_meta_names[i]; i++) {
    if (strncmp(repl_meta_names[i], word, n) != 0) continue;
    if (strlen(repl_meta_names[i]) == n) return repl_meta_names[i];
    if (found) {
      fprintf(stderr, "':%.*s' is ambiguous (try :help)\n", (int)n, word);
      return NULL;
    }
    found = repl_meta_names[i];
  }
  if (found == NULL)
    fprintf(stderr, "unknown command ':%.*s' (try :help)\n", (int)n, word);
  return found;
}

void repl_meta(struct repl *r, const char *line) {
  const char *word = line + 1, *arg, *cmd;
  char buf[1024];
  size_t n = strcspn(word, " \t"), an;
  arg = word + n;
  arg += strspn(arg, " \t");
  an = strlen(arg);
  while (an > 0 && (arg[an - 1] == ' ' || arg[an - 1] == '\t')) an--;
  snprintf(buf, sizeof buf, "%.*s", (int)an, arg);
  if ((cmd = lookup(word, n)) == NULL) return;
  if (strcmp(cmd, "help") == 0) help(r, buf);
  else if (strcmp(cmd, "load") == 0) load(r, buf);
  else if (strcmp(cmd, "time") == 0) timing(r, buf);
  else if (strcmp(cmd, "device") == 0) device(r);
  else if (strcmp(cmd, "draw") == 0) draw(r, buf);
  else if (strcmp(cmd, "memory") == 0) memory(r, buf);
  else if (strcmp(cmd, "projector") == 0) projector(buf);
  else if (strcmp(cmd, "quit") == 0) r->quit = 1;
  fflush(stdout);
}
