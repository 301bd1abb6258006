/*
** emu_nvrtc.c -- libnvrtc.so.13 for the emulator: "compiling" builds the
** source as host C++ with `-include cuda_emu.h` into a shared object, and
** the CUBIN handed back is that object's bytes behind a magic header
** (fuselab caches images on disk, so the image carries the code, not a
** path).  For each __global__ function the source gets an entry
** `__emu_entry_NAME(void **args)` calling it with its arguments, and
** `__emu_args_NAME[]` = {count, launch bound, each argument's size}: a
** function pointer alone does not say how to read the argument block.
** The version is 13.99 (13.98 with ASan-built kernels), so fuselab's
** cache never hands the emulator a real NVRTC's image or the reverse.
*/
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <ctype.h>
#include <fcntl.h>
#include <stdint.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <nvrtc.h>

#ifndef EMU_INCLUDE_DIR
#define EMU_INCLUDE_DIR "."
#endif
#ifndef EMU_HOOK_OBJ
#define EMU_HOOK_OBJ "emu_hook.o"
#endif
#define IMAGE_MAGIC "FLEMUSO1"

extern char **environ;

struct _nvrtcProgram {
  char *src, *name;
  int nh;
  char **hsrc, **hname;
  char *log, *image, *ptx;
  size_t image_n;
};

static const char *env_or(const char *name, const char *dflt) {
  const char *v = getenv(name);
  return v && *v ? v : dflt;
}

static int asan_kernels(void) { return atoi(env_or("FUSELAB_EMU_ASAN", "0")) > 0; }

nvrtcResult nvrtcVersion(int *major, int *minor) {
  *major = 13;
  *minor = asan_kernels() ? 98 : 99;
  return NVRTC_SUCCESS;
}

nvrtcResult nvrtcGetNumSupportedArchs(int *n) { *n = 1; return NVRTC_SUCCESS; }
nvrtcResult nvrtcGetSupportedArchs(int *a) { a[0] = 90; return NVRTC_SUCCESS; }

const char *nvrtcGetErrorString(nvrtcResult r) {
  switch (r) {
  case NVRTC_SUCCESS: return "NVRTC_SUCCESS";
  case NVRTC_ERROR_OUT_OF_MEMORY: return "NVRTC_ERROR_OUT_OF_MEMORY";
  case NVRTC_ERROR_PROGRAM_CREATION_FAILURE: return "NVRTC_ERROR_PROGRAM_CREATION_FAILURE";
  case NVRTC_ERROR_INVALID_INPUT: return "NVRTC_ERROR_INVALID_INPUT";
  case NVRTC_ERROR_INVALID_PROGRAM: return "NVRTC_ERROR_INVALID_PROGRAM";
  case NVRTC_ERROR_INVALID_OPTION: return "NVRTC_ERROR_INVALID_OPTION";
  case NVRTC_ERROR_COMPILATION: return "NVRTC_ERROR_COMPILATION";
  case NVRTC_ERROR_INTERNAL_ERROR: return "NVRTC_ERROR_INTERNAL_ERROR";
  default: return "NVRTC_ERROR (emulator: unknown code)";
  }
}

static char *dup0(const char *s) { return strdup(s ? s : ""); }

nvrtcResult nvrtcCreateProgram(nvrtcProgram *out, const char *src, const char *name, int nh,
                               const char *const *hsrc, const char *const *hname) {
  nvrtcProgram p;
  int i;
  if (!out || !src) return NVRTC_ERROR_INVALID_INPUT;
  if (!(p = calloc(1, sizeof *p))) return NVRTC_ERROR_OUT_OF_MEMORY;
  p->src = dup0(src);
  p->name = dup0(name ? name : "default_program");
  p->nh = nh > 0 ? nh : 0;
  p->hsrc = calloc(p->nh + 1, sizeof(char *));
  p->hname = calloc(p->nh + 1, sizeof(char *));
  for (i = 0; i < p->nh; i++) { p->hsrc[i] = dup0(hsrc[i]); p->hname[i] = dup0(hname[i]); }
  *out = p;
  return NVRTC_SUCCESS;
}

nvrtcResult nvrtcDestroyProgram(nvrtcProgram *pp) {
  nvrtcProgram p;
  int i;
  if (!pp || !(p = *pp)) return NVRTC_ERROR_INVALID_PROGRAM;
  for (i = 0; i < p->nh; i++) { free(p->hsrc[i]); free(p->hname[i]); }
  free(p->hsrc); free(p->hname);
  free(p->src); free(p->name); free(p->log); free(p->image); free(p->ptx);
  free(p);
  *pp = NULL;
  return NVRTC_SUCCESS;
}

/* --- a growable string ---------------------------------------------------------------- */
typedef struct sb { char *s; size_t n, cap; } sb;
static void sb_add(sb *b, const char *s, size_t n) {
  if (b->n + n + 1 > b->cap) {
    size_t c = (b->n + n + 1) * 2;
    char *t = realloc(b->s, c);
    if (!t) return;
    b->s = t;
    b->cap = c;
  }
  memcpy(b->s + b->n, s, n);
  b->n += n;
  b->s[b->n] = '\0';
}
static void sb_str(sb *b, const char *s) { sb_add(b, s, strlen(s)); }

/* --- the entry wrappers ------------------------------------------------------------------ */

/* past a comment or literal starting at s[i], else i */
static size_t skip_noncode(const char *s, size_t i) {
  if (s[i] == '/' && s[i + 1] == '/') { while (s[i] && s[i] != '\n') i++; return i; }
  if (s[i] == '/' && s[i + 1] == '*') {
    const char *e = strstr(s + i + 2, "*/");
    return e ? (size_t)(e - s) + 2 : strlen(s);
  }
  if (s[i] == '"' || s[i] == '\'') {
    char q = s[i++];
    while (s[i] && s[i] != q) { if (s[i] == '\\' && s[i + 1]) i++; i++; }
    return s[i] ? i + 1 : i;
  }
  return i;
}

static int ident_char(char c) { return isalnum((unsigned char)c) || c == '_'; }

/* One __global__ function's wrapper, from the text after `__global__`;
** returns where the scan continues. */
static size_t one_entry(const char *s, size_t i, sb *out, sb *names) {
  char name[200] = "", bound[32] = "0";
  size_t j, a0, depth;
  char line[1000];
  sb call = {0}, sizes = {0};
  int nargs = 0;
  for (;;) {
    while (s[i] && isspace((unsigned char)s[i])) i++;
    if (!s[i]) return i;
    if (s[i] == '(') break;
    if (ident_char(s[i])) {
      j = i;
      while (ident_char(s[j])) j++;
      if (j - i == 17 && strncmp(s + i, "__launch_bounds__", 17) == 0) {
        while (s[j] && s[j] != '(') j++;
        if (s[j]) j++;
        while (isspace((unsigned char)s[j])) j++;
        i = j;
        while (isdigit((unsigned char)s[j])) j++;
        if (j > i && j - i < sizeof bound) { memcpy(bound, s + i, j - i); bound[j - i] = '\0'; }
        while (s[j] && s[j] != ')') j++;
        i = s[j] ? j + 1 : j;
        continue;
      }
      if (j - i < sizeof name) { memcpy(name, s + i, j - i); name[j - i] = '\0'; }
      i = j;
      continue;
    }
    i++;   /* '*', '&', '<' of a return type: not ours to judge */
  }
  /* a declaration seen twice gets one wrapper */
  snprintf(line, sizeof line, " %s ", name);
  if (!name[0] || (names->s && strstr(names->s, line))) return i + 1;
  sb_str(names, line);
  /* the parameters, split at top-level commas */
  a0 = ++i;
  depth = 0;
  for (; s[i]; i++) {
    size_t k = skip_noncode(s, i);
    if (k != i) { i = k - 1; continue; }
    if (s[i] == '(' || s[i] == '<' || s[i] == '[' || s[i] == '{') depth++;
    else if ((s[i] == ')' || s[i] == '>' || s[i] == ']' || s[i] == '}') && depth > 0) depth--;
    else if ((s[i] == ')' && depth == 0) || (s[i] == ',' && depth == 0)) {
      size_t e = i, b;
      while (e > a0 && isspace((unsigned char)s[e - 1])) e--;
      b = e;
      while (b > a0 && ident_char(s[b - 1])) b--;
      if (e > a0 && !(e - a0 == 4 && strncmp(s + a0, "void", 4) == 0)) {
        char t[600];
        size_t tn = b - a0 < sizeof t - 1 ? b - a0 : sizeof t - 1;
        memcpy(t, s + a0, tn);
        t[tn] = '\0';
        snprintf(line, sizeof line, "%s*(%s *)a[%d]", nargs ? ", " : "", t, nargs);
        sb_str(&call, line);
        snprintf(line, sizeof line, ", sizeof(%s)", t);
        sb_str(&sizes, line);
        nargs++;
      }
      a0 = i + 1;
      if (s[i] == ')') break;
    }
  }
  snprintf(line, sizeof line, "extern \"C\" void __emu_entry_%s(void **a)\n{\n  (void)a;\n  %s(", name, name);
  sb_str(out, line);
  if (call.s) sb_str(out, call.s);
  sb_str(out, ");\n}\n");
  snprintf(line, sizeof line, "extern \"C\" const unsigned long __emu_args_%s[] = {%d, %s", name, nargs, bound);
  sb_str(out, line);
  if (sizes.s) sb_str(out, sizes.s);
  sb_str(out, ", 0};\n");
  free(call.s);
  free(sizes.s);
  return i;
}

static void entries(const char *s, sb *out, sb *names) {
  size_t i = 0;
  sb_str(out, "\n/* the emulator's entries */\n"
              "extern \"C\" {\n"
              "extern char __start_emu_shared[] __attribute__((weak, visibility(\"hidden\")));\n"
              "extern char __stop_emu_shared[] __attribute__((weak, visibility(\"hidden\")));\n"
              "void __emu_shared_range(char **b, char **e)\n"
              "{\n  *b = __start_emu_shared;\n  *e = __stop_emu_shared;\n}\n}\n");
  while (s[i]) {
    size_t k = skip_noncode(s, i);
    if (k != i) { i = k; continue; }
    if (strncmp(s + i, "__global__", 10) == 0 && (i == 0 || !ident_char(s[i - 1])) &&
        !ident_char(s[i + 10])) {
      i = one_entry(s, i + 10, out, names);
      continue;
    }
    i++;
  }
}

/* --- mutations, for the tests ------------------------------------------------------------------ */

/* FUSELAB_EMU_MUTATE="OLD=>NEW" (\n for a newline) replaces every OLD in
** each source before it is compiled: tests plant a bug in fuselab's real
** generated code and check the emulator catches it.  The result is
** cached under the unmutated source's key, so such a test uses a cache
** folder of its own. */
static void unescape(char *s) {
  char *o = s;
  for (; *s; s++) {
    if (s[0] == '\\' && s[1] == 'n') { *o++ = '\n'; s++; }
    else *o++ = *s;
  }
  *o = '\0';
}

static char *mutate(const char *src) {
  const char *spec = getenv("FUSELAB_EMU_MUTATE"), *at, *hit;
  char *old, *new, *sep;
  sb out = {0};
  if (!spec || !*spec || !(old = strdup(spec))) return NULL;
  if (!(sep = strstr(old, "=>"))) { free(old); return NULL; }
  *sep = '\0';
  new = sep + 2;
  unescape(old);
  unescape(new);
  for (at = src; *old && (hit = strstr(at, old)); at = hit + strlen(old)) {
    sb_add(&out, at, (size_t)(hit - at));
    sb_str(&out, new);
  }
  sb_str(&out, at);
  free(old);
  return out.s;
}

/* --- compiling ------------------------------------------------------------------------------ */

static int write_file(const char *path, const char *s, size_t n) {
  FILE *f = fopen(path, "wb");
  int ok;
  if (!f) return -1;
  ok = fwrite(s, 1, n, f) == n;
  return fclose(f) == 0 && ok ? 0 : -1;
}

static char *read_file(const char *path, size_t *n) {
  FILE *f = fopen(path, "rb");
  char *b = NULL;
  long sz;
  if (!f) return NULL;
  if (fseek(f, 0, SEEK_END) == 0 && (sz = ftell(f)) >= 0 && fseek(f, 0, SEEK_SET) == 0 &&
      (b = malloc((size_t)sz + 1))) {
    *n = fread(b, 1, (size_t)sz, f);
    b[*n] = '\0';
  }
  fclose(f);
  return b;
}

/* argv run with stdout and stderr appended to log; its exit status */
static int run(char *const *argv, const char *log) {
  posix_spawn_file_actions_t fa;
  pid_t pid;
  int st = -1;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 1, log, O_WRONLY | O_CREAT | O_APPEND, 0600);
  posix_spawn_file_actions_adddup2(&fa, 1, 2);
  if (posix_spawnp(&pid, argv[0], &fa, NULL, argv, environ) != 0) {
    posix_spawn_file_actions_destroy(&fa);
    return -1;
  }
  posix_spawn_file_actions_destroy(&fa);
  if (waitpid(pid, &st, 0) < 0) return -1;
  return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static void rm_dir(const char *dir, nvrtcProgram p) {
  char path[4200];
  int i;
  static const char *const files[] = {"k.cu.cpp", "k.o", "k.so", "log"};
  if (atoi(env_or("FUSELAB_EMU_KEEP", "0")) > 0) {
    fprintf(stderr, "fuselab emu: kept %s\n", dir);
    return;
  }
  for (i = 0; i < 4; i++) { snprintf(path, sizeof path, "%s/%s", dir, files[i]); unlink(path); }
  for (i = 0; i < p->nh; i++) { snprintf(path, sizeof path, "%s/%s", dir, p->hname[i]); unlink(path); }
  rmdir(dir);
}

static int known_option(const char *o, char *def, size_t dn) {
  static const char *const plain[] = {"-default-device", "--std=c++17", "-std=c++17", "--std=c++14",
    "-std=c++14", "--std=c++20", "-std=c++20", "-lineinfo", "--generate-line-info", "-G",
    "--device-debug", "-use_fast_math", "--use_fast_math", "-w", "--disable-warnings",
    "--extra-device-vectorization", "-dopt=on", "--dopt=on", "-rdc=false",
    "--relocatable-device-code=false", NULL};
  int i;
  def[0] = '\0';
  for (i = 0; plain[i]; i++)
    if (strcmp(o, plain[i]) == 0) return 1;
  if (strncmp(o, "--gpu-architecture=", 19) == 0 || strncmp(o, "-arch=", 6) == 0) {
    const char *a = strchr(o, '=') + 1;
    return strcmp(a, "sm_90") == 0 || strcmp(a, "compute_90") == 0;
  }
  if (strncmp(o, "--split-compile=", 16) == 0 || strncmp(o, "--fmad=", 7) == 0 ||
      strncmp(o, "-fmad=", 6) == 0 || strncmp(o, "--maxrregcount=", 15) == 0 ||
      strncmp(o, "-maxrregcount=", 14) == 0 || strncmp(o, "-I", 2) == 0 ||
      strncmp(o, "--include-path=", 15) == 0)
    return 1;   /* the real toolkit's include path is not ours: dropped */
  if (strncmp(o, "-D", 2) == 0 || strncmp(o, "--define-macro=", 15) == 0) {
    snprintf(def, dn, "-D%s", o[1] == 'D' ? o + 2 : o + 15);
    return 1;
  }
  return 0;
}

nvrtcResult nvrtcCompileProgram(nvrtcProgram p, int nopt, const char *const *opts) {
  char dir[4096], src[4200], obj[4200], so[4200], log[4200], inc[4200], defs[16][300];
  const char *tmp = env_or("TMPDIR", "/tmp");
  const char *cxx = env_or("FUSELAB_EMU_CXX", "g++");
  const char *opt = env_or("FUSELAB_EMU_OPT", "-O1");
  const char *hook = env_or("FUSELAB_EMU_HOOK", EMU_HOOK_OBJ);
  char *argv[64];
  int i, na = 0, nd = 0, rc;
  sb text = {0}, names = {0};
  nvrtcResult r = NVRTC_SUCCESS;
  size_t n = 0;
  if (!p) return NVRTC_ERROR_INVALID_PROGRAM;
  free(p->log); free(p->image); free(p->ptx);
  p->log = p->image = p->ptx = NULL;
  for (i = 0; i < nopt; i++) {
    char d[300];
    if (!known_option(opts[i], d, sizeof d)) {
      size_t ln = strlen(opts[i]) + 80;
      if ((p->log = malloc(ln))) snprintf(p->log, ln, "emulator: unrecognized or unsupported option %s\n", opts[i]);
      return NVRTC_ERROR_INVALID_OPTION;
    }
    if (d[0] && nd < 16) snprintf(defs[nd++], sizeof defs[0], "%s", d);
  }
  snprintf(dir, sizeof dir, "%s/fuselab-emu-XXXXXX", tmp);
  if (!mkdtemp(dir)) { p->log = strdup("emulator: cannot make a temporary directory\n"); return NVRTC_ERROR_INTERNAL_ERROR; }
  snprintf(src, sizeof src, "%s/k.cu.cpp", dir);
  snprintf(obj, sizeof obj, "%s/k.o", dir);
  snprintf(so, sizeof so, "%s/k.so", dir);
  snprintf(log, sizeof log, "%s/log", dir);
  snprintf(inc, sizeof inc, "-I%s", env_or("FUSELAB_EMU_INCLUDE", EMU_INCLUDE_DIR));
  for (i = 0; i < p->nh; i++) {
    char hp[4200];
    snprintf(hp, sizeof hp, "%s/%s", dir, p->hname[i]);
    write_file(hp, p->hsrc[i], strlen(p->hsrc[i]));
  }
  sb_str(&text, "#line 1 \"");
  sb_str(&text, p->name);
  sb_str(&text, "\"\n");
  {
    char *m = mutate(p->src);
    sb_str(&text, m ? m : p->src);
    entries(m ? m : p->src, &text, &names);
    free(m);
  }
  if (!text.s || write_file(src, text.s, text.n) != 0) {
    p->log = strdup("emulator: cannot write the source\n");
    r = NVRTC_ERROR_INTERNAL_ERROR;
    goto out;
  }
  /* compile: alignment checks on (they report through emu_hook.o) */
  argv[na++] = (char *)cxx;
  argv[na++] = "-std=c++17";
  argv[na++] = (char *)opt;
  argv[na++] = "-fPIC";
  argv[na++] = "-fno-strict-aliasing";
  argv[na++] = "-fsanitize=alignment";
  argv[na++] = "-fno-sanitize-recover=alignment";
  if (asan_kernels()) { argv[na++] = "-fsanitize=address"; argv[na++] = "-fno-omit-frame-pointer"; }
  argv[na++] = inc;
  argv[na++] = "-I";
  argv[na++] = dir;
  argv[na++] = "-include";
  argv[na++] = "cuda_emu.h";
  for (i = 0; i < nd; i++) argv[na++] = defs[i];
  argv[na++] = "-c";
  argv[na++] = src;
  argv[na++] = "-o";
  argv[na++] = obj;
  argv[na] = NULL;
  rc = run(argv, log);
  if (rc == 0) {
    /* link: no libubsan (emu_hook.o has the handlers), symbols bound inside */
    na = 0;
    argv[na++] = (char *)cxx;
    argv[na++] = "-shared";
    argv[na++] = "-Wl,-Bsymbolic";
    if (asan_kernels()) argv[na++] = "-fsanitize=address";
    argv[na++] = "-o";
    argv[na++] = so;
    argv[na++] = obj;
    argv[na++] = (char *)hook;
    argv[na] = NULL;
    rc = run(argv, log);
  }
  p->log = read_file(log, &n);
  if (!p->log) p->log = strdup("");
  if (rc != 0) { r = NVRTC_ERROR_COMPILATION; goto out; }
  {
    size_t sn = 0;
    char *bytes = read_file(so, &sn);
    uint64_t n64 = sn;
    if (!bytes || !(p->image = malloc(16 + sn))) {
      free(bytes);
      r = NVRTC_ERROR_OUT_OF_MEMORY;
      goto out;
    }
    memcpy(p->image, IMAGE_MAGIC, 8);
    memcpy(p->image + 8, &n64, 8);
    memcpy(p->image + 16, bytes, sn);
    p->image_n = 16 + sn;
    free(bytes);
  }
  /* the "PTX": what was compiled, for reading */
  {
    sb ptx = {0};
    const char *at = names.s;
    sb_str(&ptx, "// fuselab emu: no PTX; its kernels, then the host C++ compiled with -include cuda_emu.h\n");
    while (at && *at) {
      const char *e;
      while (*at == ' ') at++;
      if (!*at || !(e = strchr(at, ' '))) break;
      sb_str(&ptx, "// .entry ");
      sb_add(&ptx, at, (size_t)(e - at));
      sb_str(&ptx, "\n");
      at = e;
    }
    sb_str(&ptx, text.s);
    p->ptx = ptx.s;
  }
out:
  free(text.s);
  free(names.s);
  rm_dir(dir, p);
  return r;
}

nvrtcResult nvrtcGetProgramLogSize(nvrtcProgram p, size_t *n) {
  if (!p) return NVRTC_ERROR_INVALID_PROGRAM;
  *n = (p->log ? strlen(p->log) : 0) + 1;
  return NVRTC_SUCCESS;
}

nvrtcResult nvrtcGetProgramLog(nvrtcProgram p, char *log) {
  if (!p) return NVRTC_ERROR_INVALID_PROGRAM;
  strcpy(log, p->log ? p->log : "");
  return NVRTC_SUCCESS;
}

nvrtcResult nvrtcGetPTXSize(nvrtcProgram p, size_t *n) {
  if (!p || !p->ptx) return NVRTC_ERROR_INVALID_PROGRAM;
  *n = strlen(p->ptx) + 1;
  return NVRTC_SUCCESS;
}

nvrtcResult nvrtcGetPTX(nvrtcProgram p, char *ptx) {
  if (!p || !p->ptx) return NVRTC_ERROR_INVALID_PROGRAM;
  memcpy(ptx, p->ptx, strlen(p->ptx) + 1);
  return NVRTC_SUCCESS;
}

nvrtcResult nvrtcGetCUBINSize(nvrtcProgram p, size_t *n) {
  if (!p || !p->image) return NVRTC_ERROR_INVALID_PROGRAM;
  *n = p->image_n;
  return NVRTC_SUCCESS;
}

nvrtcResult nvrtcGetCUBIN(nvrtcProgram p, char *cubin) {
  if (!p || !p->image) return NVRTC_ERROR_INVALID_PROGRAM;
  memcpy(cubin, p->image, p->image_n);
  return NVRTC_SUCCESS;
}
