/*
** cache.c -- the compiled-kernel cache.
** Invariant: a file named <key>.so in the cache directory is either absent
** or a complete object compiled from the source with that key (it is
** renamed into place only after the compiler succeeded), and it is only
** used after it proves it: an ELF file as long as its header says, that
** loads, and whose embedded fl_cache_key equals the key.  Anything else is
** deleted and rebuilt.
*/
#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/utsname.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <elf.h>

#include <xxhash.h>

#include "config.h"
#include "cache.h"

#ifndef FL_CC_DEFAULT
#define FL_CC_DEFAULT "cc"
#endif

/* most compiler processes one program starts at once */
#define MAX_JOBS 8

#define FLAGS "-O3 -march=native -fopenmp -shared -fPIC -fno-math-errno"

struct cache_obj {
  char key[33];
  void *handle;
  int refs;              /* holders, the memory table counting as one */
  int in_table;
  cache_obj *next;
};

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static cache_obj *table;
static char dir[1024];
static int dir_ready;
static char warning[2400];
static int64_t n_hits, n_disk, n_miss, n_fail;
static unsigned tmp_counter;

const char *cache_compiler(void) {
  const char *cc = getenv("CC");
  return cc && *cc ? cc : FL_CC_DEFAULT;
}

/* glibc's libmvec: SIMD expf/logf/sinf/cosf/powf (2.22), tanhf/erff
** (2.35).  The generated preamble declares what is there as `simd`, so
** loops with transcendentals vectorize (cpu/codegen.c). */
static int mvec_level(void) {
  static int level = -1;
  void *h;
  if (level >= 0) return level;
  level = 0;
#if defined(__x86_64__)
  if ((h = dlopen("libmvec.so.1", RTLD_LAZY | RTLD_LOCAL))) {
    if (dlsym(h, "_ZGVdN8v_expf") && dlsym(h, "_ZGVeN16v_expf")) level = 1;
    if (level && dlsym(h, "_ZGVdN8v_tanhf") && dlsym(h, "_ZGVeN16v_tanhf")) level = 2;
    dlclose(h);
  }
#endif
  return level;
}

const char *cache_flags(void) {
  static char flags[256];
  if (!flags[0]) {
    int lv = mvec_level();
    if (lv) snprintf(flags, sizeof flags, "%s -DFL_MVEC=%d", FLAGS, lv);
    else snprintf(flags, sizeof flags, "%s", FLAGS);
  }
  return flags;
}

static const char *libs(void) { return mvec_level() ? "-lmvec -lm" : "-lm"; }

const char *cache_warning(void) { return warning[0] ? warning : NULL; }

/* mkdir -p with mode 0700 for what it creates */
static int mkdirs(const char *path) {
  char tmp[1024];
  size_t i, n = strlen(path);
  if (n >= sizeof tmp) return -1;
  memcpy(tmp, path, n + 1);
  for (i = 1; i <= n; i++) {
    if (tmp[i] != '/' && tmp[i] != '\0') continue;
    tmp[i] = '\0';
    if (mkdir(tmp, 0700) != 0 && errno != EEXIST) return -1;
    tmp[i] = path[i];
  }
  return 0;
}

/* Can we create files there?  Tries one. */
static int writable(const char *d) {
  char probe[1100];
  int fd;
  struct stat st;
  if (stat(d, &st) != 0 || !S_ISDIR(st.st_mode)) return 0;
  snprintf(probe, sizeof probe, "%s/.probe-XXXXXX", d);
  fd = mkstemp(probe);
  if (fd < 0) return 0;
  close(fd);
  unlink(probe);
  return 1;
}

static void choose_dir(void) {
  const char *env = getenv("FUSELAB_CACHE_DIR"), *xdg = getenv("XDG_CACHE_HOME");
  const char *home = getenv("HOME");
  char want[1024];
  if (env && *env) snprintf(want, sizeof want, "%s", env);
  else if (xdg && *xdg) snprintf(want, sizeof want, "%s/fuselab", xdg);
  else snprintf(want, sizeof want, "%s/.cache/fuselab", home && *home ? home : "/tmp");
  warning[0] = '\0';
  errno = 0;
  if (mkdirs(want) == 0 && writable(want)) {
    snprintf(dir, sizeof dir, "%s", want);
  } else {
    char why[128];
    snprintf(why, sizeof why, "%s", strerror(errno ? errno : EACCES));
    char tmpl[] = "/tmp/fuselab-cache-XXXXXX";
    char *t = mkdtemp(tmpl);
    snprintf(dir, sizeof dir, "%s", t ? t : "/tmp");
    snprintf(warning, sizeof warning, "cache: cannot use %s (%s); using the "
             "private directory %s for this process", want, why, dir);
  }
  dir_ready = 1;
}

void cache_reset_dir(void) {
  pthread_mutex_lock(&lock);
  dir_ready = 0;
  pthread_mutex_unlock(&lock);
}

/* What the key covers besides the source. */
static void machine(char *buf, size_t n) {
  struct utsname u;
  FILE *f = fopen("/proc/cpuinfo", "r");
  char line[256], model[200] = "";
  if (f) {
    while (fgets(line, sizeof line, f))
      if (strncmp(line, "model name", 10) == 0) {
        char *c = strchr(line, ':');
        if (c) snprintf(model, sizeof model, "%s", c + 1);
        break;
      }
    fclose(f);
  }
  if (uname(&u) != 0) snprintf(u.machine, sizeof u.machine, "?");
  snprintf(buf, n, "%s|%s", u.machine, model);
}

/* The key of head + units (hashed as one text, as the file holds it). */
static void make_key(const char *head, const char *const *units, int nunits, char *hex) {
  XXH3_state_t *st = XXH3_createState();
  char mach[512];
  XXH128_hash_t h;
  const char *cc = cache_compiler();
  int i;
  machine(mach, sizeof mach);
  XXH3_128bits_reset(st);
  XXH3_128bits_update(st, head, strlen(head));
  for (i = 0; i < nunits; i++) XXH3_128bits_update(st, units[i], strlen(units[i]));
  XXH3_128bits_update(st, "", 1);
  XXH3_128bits_update(st, cc, strlen(cc) + 1);
  XXH3_128bits_update(st, cache_flags(), strlen(cache_flags()) + 1);
  XXH3_128bits_update(st, mach, strlen(mach) + 1);
  XXH3_128bits_update(st, PACKAGE_VERSION, sizeof PACKAGE_VERSION);
  h = XXH3_128bits_digest(st);
  XXH3_freeState(st);
  snprintf(hex, 33, "%016llx%016llx", (unsigned long long)h.high64,
           (unsigned long long)h.low64);
}

/* An ELF shared object at least as long as its section table says. */
static int looks_complete(const char *path) {
  Elf64_Ehdr h;
  struct stat st;
  FILE *f = fopen(path, "rb");
  int ok;
  if (!f) return 0;
  ok = fread(&h, sizeof h, 1, f) == 1;
  fclose(f);
  if (!ok || memcmp(h.e_ident, ELFMAG, SELFMAG) != 0 || stat(path, &st) != 0) return 0;
  return (uint64_t)st.st_size >= h.e_shoff + (uint64_t)h.e_shnum * h.e_shentsize;
}

/* Load path and check its embedded key; NULL when it is not ours. */
static void *open_checked(const char *path, const char *key) {
  void *h;
  const char *k;
  if (!looks_complete(path)) return NULL;
  h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (!h) return NULL;
  k = dlsym(h, "fl_cache_key");
  if (!k || strcmp(k, key) != 0) { dlclose(h); return NULL; }
  return h;
}

static char *slurp(const char *path) {
  FILE *f = fopen(path, "rb");
  char *buf;
  long n;
  if (!f) return NULL;
  fseek(f, 0, SEEK_END);
  n = ftell(f);
  fseek(f, 0, SEEK_SET);
  buf = malloc((size_t)(n > 0 ? n : 0) + 1);
  if (buf) {
    size_t got = fread(buf, 1, (size_t)(n > 0 ? n : 0), f);
    buf[got] = '\0';
  }
  fclose(f);
  return buf;
}

/* 'text' for the shell */
static void quote(char *out, size_t n, const char *s) {
  size_t i = 0;
  if (i + 1 < n) out[i++] = '\'';
  for (; *s && i + 5 < n; s++) {
    if (*s == '\'') { memcpy(out + i, "'\\''", 4); i += 4; }
    else out[i++] = *s;
  }
  if (i + 1 < n) out[i++] = '\'';
  out[i] = '\0';
}

static int write_file(const char *path, const char *head, const char *const *units,
                      const int *which, int n, const char *key, fl_err *e) {
  FILE *f = fopen(path, "w");
  int i;
  if (!f) return err_set(e, FL_EIO, "cache: cannot write %s: %s", path, strerror(errno));
  fputs(head, f);
  for (i = 0; i < n; i++) fputs(units[which ? which[i] : i], f);
  if (key)
    fprintf(f, "\n/* the cache key this object was built for */\n"
            "const char fl_cache_key[] = \"%s\";\n", key);
  if (fclose(f) != 0) { unlink(path); return err_set(e, FL_EIO, "cache: cannot write %s", path); }
  return FL_OK;
}

/* Start `sh -c cmd`; its pid, or -1. */
static pid_t spawn(const char *cmd) {
  extern char **environ;
  char *argv[] = {"sh", "-c", (char *)cmd, NULL};
  pid_t pid;
  return posix_spawn(&pid, "/bin/sh", NULL, NULL, argv, environ) == 0 ? pid : -1;
}

static int finished_ok(pid_t pid) {
  int st;
  if (pid < 0) return 0;
  while (waitpid(pid, &st, 0) < 0)
    if (errno != EINTR) return 0;
  return WIFEXITED(st) && WEXITSTATUS(st) == 0;
}

/* The compiler on `base`.c into `base`.o (or, link=1, straight into
** `base`.so), its output appended to `base`.log; the command, malloc'd. */
static char *cc_command(const char *base, int link, const char *inputs) {
  char qs[2500], qo[2500], ql[2500], path[1300];
  char *cmd;
  size_t n;
  snprintf(path, sizeof path, "%s.%s", base, link ? "so" : "o");
  quote(qo, sizeof qo, path);
  snprintf(path, sizeof path, "%s.c", base);
  quote(qs, sizeof qs, path);
  snprintf(path, sizeof path, "%s.log", base);
  quote(ql, sizeof ql, path);
  n = strlen(cache_compiler()) + strlen(cache_flags()) + strlen(qs) + strlen(qo) + strlen(ql) +
      (inputs ? strlen(inputs) : 0) + 64;
  if (!(cmd = malloc(n))) return NULL;
  if (inputs) snprintf(cmd, n, "%s %s -o %s %s %s >>%s 2>&1", cache_compiler(), cache_flags(), qo, inputs, libs(), ql);
  else if (link) snprintf(cmd, n, "%s %s -o %s %s %s >>%s 2>&1", cache_compiler(), cache_flags(), qo, qs, libs(), ql);
  else snprintf(cmd, n, "%s %s -c -o %s %s >>%s 2>&1", cache_compiler(), cache_flags(), qo, qs, ql);
  return cmd;
}

static int n_jobs(int nunits) {
  long c = sysconf(_SC_NPROCESSORS_ONLN);
  int j = c < 1 ? 1 : c > MAX_JOBS ? MAX_JOBS : (int)c;
  return j < nunits ? j : nunits < 1 ? 1 : nunits;
}

/* Deal the units into `jobs` parts of about equal text, each unit to the
** lightest part so far: part[u] for every unit. */
static void deal(const char *const *units, int nunits, int jobs, int *part) {
  size_t load[MAX_JOBS] = {0};
  int u, j, best;
  for (u = 0; u < nunits; u++) {
    for (best = 0, j = 1; j < jobs; j++) if (load[j] < load[best]) best = j;
    load[best] += strlen(units[u]) + 1;
    part[u] = best;
  }
}

static void part_name(char *out, size_t n, const char *base, int j, const char *ext) {
  if (j < 0) snprintf(out, n, "%s.%s", base, ext);
  else snprintf(out, n, "%s.%d.%s", base, j, ext);
}

/* Run the compiler on head + units into dir/<key>.so through temp files.
** One unit or one CPU: one compiler run.  Otherwise the units are dealt
** into one translation unit per CPU (each starting with head), compiled
** at the same time and linked: a program's kernels compile in parallel. */
static int compile_to(const char *head, const char *const *units, int nunits, const char *key,
                      const char *final, char **log, fl_err *e) {
  char base[1100], path[1300], csrc[1100], part[1200];
  char *cmd = NULL, *inputs = NULL;
  int *where = NULL, *mine = NULL, jobs = n_jobs(nunits), j, u, n, ok = 1, rc = FL_OK;
  pid_t pid[MAX_JOBS];
  unsigned c;
  pthread_mutex_lock(&lock);
  c = ++tmp_counter;
  pthread_mutex_unlock(&lock);
  snprintf(base, sizeof base, "%s/tmp-%s-%ld-%u", dir, key, (long)getpid(), c);
  part_name(path, sizeof path, base, -1, "c");
  /* the whole source: compiled when one part, kept beside the object */
  if ((rc = write_file(path, head, units, NULL, nunits, key, e)) != FL_OK) return rc;
  if (jobs > 1) {
    where = malloc((size_t)nunits * sizeof *where);
    mine = malloc((size_t)nunits * sizeof *mine);
    inputs = malloc((size_t)jobs * (sizeof path * 2 + 8) + 1);
    if (!where || !mine || !inputs) { rc = err_set(e, FL_ENOMEM, "cache: out of memory"); goto out; }
    deal(units, nunits, jobs, where);
    inputs[0] = '\0';
    for (j = 0; j < jobs; j++) {
      char q[2700];
      for (n = 0, u = 0; u < nunits; u++) if (where[u] == j) mine[n++] = u;
      part_name(path, sizeof path, base, j, "c");
      if ((rc = write_file(path, head, units, mine, n, j == 0 ? key : NULL, e)) != FL_OK) {
        while (--j >= 0) finished_ok(pid[j]);     /* the parts started: done before cleaning */
        goto out;
      }
      snprintf(part, sizeof part, "%s.%d", base, j);
      pid[j] = (cmd = cc_command(part, 0, NULL)) ? spawn(cmd) : -1;
      free(cmd);
      cmd = NULL;
      part_name(path, sizeof path, base, j, "o");
      quote(q, sizeof q, path);
      strcat(strcat(inputs, q), " ");
    }
    for (j = 0; j < jobs; j++) ok &= finished_ok(pid[j]);
    ok = ok && (cmd = cc_command(base, 1, inputs)) && finished_ok(spawn(cmd));
    for (j = 0; j < jobs; j++) {       /* the parts' output, in order, into the log */
      char *pl;
      FILE *f;
      part_name(path, sizeof path, base, j, "log");
      if ((pl = slurp(path)) && pl[0]) {
        part_name(path, sizeof path, base, -1, "log");
        if ((f = fopen(path, "a"))) { fputs(pl, f); fclose(f); }
      }
      free(pl);
    }
  } else {
    ok = (cmd = cc_command(base, 1, NULL)) && finished_ok(spawn(cmd));
  }
  part_name(path, sizeof path, base, -1, "log");
  if (log) *log = slurp(path);
  part_name(path, sizeof path, base, -1, "so");
  if (!ok || !looks_complete(path)) {
    rc = err_set(e, FL_ECOMPILE, "compile: %s failed; its output is in the program's compile log",
                 cache_compiler());
  } else if (rename(path, final) != 0) {
    rc = err_set(e, FL_EIO, "cache: cannot rename %s to %s: %s", path, final, strerror(errno));
  } else {
    part_name(path, sizeof path, base, -1, "c");
    snprintf(csrc, sizeof csrc, "%s/%s.c", dir, key);
    rename(path, csrc);
  }
out:
  free(cmd);
  free(inputs);
  free(where);
  free(mine);
  for (j = -1; j < jobs; j++) {
    static const char *const ext[] = {"c", "o", "log", "so"};
    int x;
    for (x = 0; x < 4; x++) {
      part_name(path, sizeof path, base, j, ext[x]);
      unlink(path);
    }
  }
  return rc;
}

int cache_load(const char *source, cache_obj **out, char **log, int *how, fl_err *e) {
  return cache_load_units("", &source, 1, out, log, how, e);
}

int cache_load_units(const char *head, const char *const *units, int nunits, cache_obj **out,
                     char **log, int *how, fl_err *e) {
  char key[33], path[1100];
  cache_obj *o;
  void *h;
  int rc, dummy;
  if (!how) how = &dummy;
  if (log) *log = NULL;
  *out = NULL;
  make_key(head, units, nunits, key);
  pthread_mutex_lock(&lock);
  if (!dir_ready) choose_dir();
  for (o = table; o; o = o->next)
    if (strcmp(o->key, key) == 0) {
      o->refs++;
      n_hits++;
      pthread_mutex_unlock(&lock);
      *out = o;
      *how = CACHE_MEMORY;
      if (getenv("FUSELAB_DEBUG") && atoi(getenv("FUSELAB_DEBUG")) >= 1)
        fprintf(stderr, "fuselab: kernel cache hit (memory) %s\n", key);
      return FL_OK;
    }
  snprintf(path, sizeof path, "%s/%s.so", dir, key);
  pthread_mutex_unlock(&lock);
  h = open_checked(path, key);
  *how = CACHE_DISK;
  if (!h) {
    if (access(path, F_OK) == 0) unlink(path);   /* corrupt or foreign */
    if ((rc = compile_to(head, units, nunits, key, path, log, e)) != FL_OK) {
      pthread_mutex_lock(&lock);
      n_fail++;
      pthread_mutex_unlock(&lock);
      return rc;
    }
    if (!(h = open_checked(path, key))) {
      const char *de = dlerror();
      return err_set(e, FL_ECOMPILE, "compile: cannot load %s: %s", path, de ? de : "bad object");
    }
    *how = CACHE_COMPILED;
  }
  if (!(o = calloc(1, sizeof *o))) {
    dlclose(h);
    return err_set(e, FL_ENOMEM, "cache: out of memory");
  }
  memcpy(o->key, key, sizeof key);
  o->handle = h;
  o->refs = 2;
  o->in_table = 1;
  pthread_mutex_lock(&lock);
  o->next = table;
  table = o;
  if (*how == CACHE_DISK) n_disk++; else n_miss++;
  pthread_mutex_unlock(&lock);
  if (getenv("FUSELAB_DEBUG") && atoi(getenv("FUSELAB_DEBUG")) >= 1)
    fprintf(stderr, "fuselab: kernel cache %s %s\n",
            *how == CACHE_DISK ? "hit (disk)" : "miss (compiled)", key);
  *out = o;
  return FL_OK;
}

void *cache_sym(cache_obj *o, const char *name) {
  return o && o->handle ? dlsym(o->handle, name) : NULL;
}

cache_obj *cache_retain(cache_obj *o) {
  if (!o) return NULL;
  pthread_mutex_lock(&lock);
  o->refs++;
  pthread_mutex_unlock(&lock);
  return o;
}

void cache_release(cache_obj *o) {
  int last;
  if (!o) return;
  pthread_mutex_lock(&lock);
  last = --o->refs == 0;
  pthread_mutex_unlock(&lock);
  if (last) {
    dlclose(o->handle);
    free(o);
  }
}

void cache_forget_memory(void) {
  cache_obj *o, *next, *dead = NULL;
  pthread_mutex_lock(&lock);
  for (o = table; o; o = next) {
    next = o->next;
    o->in_table = 0;
    if (--o->refs == 0) { o->next = dead; dead = o; }
  }
  table = NULL;
  pthread_mutex_unlock(&lock);
  for (o = dead; o; o = next) {
    next = o->next;
    dlclose(o->handle);
    free(o);
  }
}

static int ends_with(const char *s, const char *suf) {
  size_t a = strlen(s), b = strlen(suf);
  return a >= b && strcmp(s + a - b, suf) == 0;
}

int cache_get_info(cache_info *out, fl_err *e) {
  DIR *d;
  struct dirent *de;
  (void)e;
  memset(out, 0, sizeof *out);
  pthread_mutex_lock(&lock);
  if (!dir_ready) choose_dir();
  snprintf(out->dir, sizeof out->dir, "%s", dir);
  out->hits = n_hits; out->disk_hits = n_disk; out->misses = n_miss; out->failures = n_fail;
  pthread_mutex_unlock(&lock);
  if (!(d = opendir(out->dir))) return FL_OK;
  while ((de = readdir(d))) {
    char p[1400];
    struct stat st;
    if (!ends_with(de->d_name, ".so") || strncmp(de->d_name, "tmp-", 4) == 0) continue;
    snprintf(p, sizeof p, "%s/%s", out->dir, de->d_name);
    if (stat(p, &st) == 0) { out->entries++; out->bytes += st.st_size; }
  }
  closedir(d);
  return FL_OK;
}

int cache_clear(fl_err *e) {
  DIR *d;
  struct dirent *de;
  char cd[1024];
  pthread_mutex_lock(&lock);
  if (!dir_ready) choose_dir();
  snprintf(cd, sizeof cd, "%s", dir);
  pthread_mutex_unlock(&lock);
  cache_forget_memory();
  if (!(d = opendir(cd))) return err_set(e, FL_EIO, "cache: cannot open %s: %s", cd, strerror(errno));
  while ((de = readdir(d))) {
    char p[1400];
    if (!ends_with(de->d_name, ".so") && !ends_with(de->d_name, ".c")) continue;
    snprintf(p, sizeof p, "%s/%s", cd, de->d_name);
    unlink(p);
  }
  closedir(d);
  return FL_OK;
}

/* --- blobs ----------------------------------------------------------------
** File layout: "FLBLOB1\n", the 32-digit key, the payload size (8 bytes,
** little endian), the payload, then its XXH64.  Anything else is not ours. */

#define BLOB_MAGIC "FLBLOB1\n"

void cache_blob_key(const char *const *parts, int nparts, char hex[33]) {
  XXH3_state_t *st = XXH3_createState();
  XXH128_hash_t h;
  int i;
  XXH3_128bits_reset(st);
  for (i = 0; i < nparts; i++) XXH3_128bits_update(st, parts[i], strlen(parts[i]) + 1);
  XXH3_128bits_update(st, PACKAGE_VERSION, sizeof PACKAGE_VERSION);
  h = XXH3_128bits_digest(st);
  XXH3_freeState(st);
  snprintf(hex, 33, "%016llx%016llx", (unsigned long long)h.high64,
           (unsigned long long)h.low64);
}

static void blob_path(char *out, size_t n, const char *key, const char *ext) {
  pthread_mutex_lock(&lock);
  if (!dir_ready) choose_dir();
  snprintf(out, n, "%s/%s.%s", dir, key, ext);
  pthread_mutex_unlock(&lock);
}

int cache_get_blob(const char *key, const char *ext, void **data, size_t *n) {
  char path[1200], head[8 + 32];
  unsigned char sz[8], sum[8];
  uint64_t len = 0, want;
  void *buf = NULL;
  FILE *f;
  int i, ok = 0;
  *data = NULL;
  *n = 0;
  blob_path(path, sizeof path, key, ext);
  if (!(f = fopen(path, "rb"))) return 0;
  if (fread(head, 1, sizeof head, f) == sizeof head && memcmp(head, BLOB_MAGIC, 8) == 0 &&
      memcmp(head + 8, key, 32) == 0 && fread(sz, 1, 8, f) == 8) {
    for (i = 7; i >= 0; i--) len = len << 8 | sz[i];
    if (len < ((uint64_t)1 << 32) && (buf = malloc((size_t)len + 1)) &&
        fread(buf, 1, (size_t)len, f) == len && fread(sum, 1, 8, f) == 8) {
      want = XXH64(buf, (size_t)len, 0);
      ok = 1;
      for (i = 0; i < 8; i++) ok &= sum[i] == (unsigned char)(want >> (8 * i));
    }
  }
  fclose(f);
  if (!ok) {
    free(buf);
    unlink(path);       /* corrupt or foreign: rebuilt by the caller */
    return 0;
  }
  ((char *)buf)[len] = '\0';
  *data = buf;
  *n = (size_t)len;
  pthread_mutex_lock(&lock);
  n_disk++;
  pthread_mutex_unlock(&lock);
  return 1;
}

int cache_put_blob(const char *key, const char *ext, const void *data, size_t n, fl_err *e) {
  char path[1200], tmp[1300];
  unsigned char sz[8], sum[8];
  uint64_t h = XXH64(data, n, 0);
  unsigned c;
  FILE *f;
  int i, bad;
  blob_path(path, sizeof path, key, ext);
  pthread_mutex_lock(&lock);
  c = ++tmp_counter;
  pthread_mutex_unlock(&lock);
  snprintf(tmp, sizeof tmp, "%s.tmp-%ld-%u", path, (long)getpid(), c);
  for (i = 0; i < 8; i++) {
    sz[i] = (unsigned char)((uint64_t)n >> (8 * i));
    sum[i] = (unsigned char)(h >> (8 * i));
  }
  if (!(f = fopen(tmp, "wb")))
    return err_set(e, FL_EIO, "cache: cannot write %s: %s", tmp, strerror(errno));
  bad = fwrite(BLOB_MAGIC, 1, 8, f) != 8 || fwrite(key, 1, 32, f) != 32 ||
        fwrite(sz, 1, 8, f) != 8 || fwrite(data, 1, n, f) != n || fwrite(sum, 1, 8, f) != 8;
  bad |= fclose(f) != 0;
  if (bad || rename(tmp, path) != 0) {
    unlink(tmp);
    return err_set(e, FL_EIO, "cache: cannot write %s", path);
  }
  return FL_OK;
}

int cache_clear_blobs(const char *ext) {
  DIR *d;
  struct dirent *de;
  char cd[1024], suf[64];
  int count = 0;
  pthread_mutex_lock(&lock);
  if (!dir_ready) choose_dir();
  snprintf(cd, sizeof cd, "%s", dir);
  pthread_mutex_unlock(&lock);
  snprintf(suf, sizeof suf, ".%s", ext);
  if (!(d = opendir(cd))) return 0;
  while ((de = readdir(d))) {
    char p[1400];
    if (!ends_with(de->d_name, suf)) continue;
    snprintf(p, sizeof p, "%s/%s", cd, de->d_name);
    if (unlink(p) == 0) count++;
  }
  closedir(d);
  return count;
}

void cache_count_blobs(const char *ext, int64_t *entries, int64_t *bytes) {
  DIR *d;
  struct dirent *de;
  char cd[1024], suf[64];
  *entries = *bytes = 0;
  pthread_mutex_lock(&lock);
  if (!dir_ready) choose_dir();
  snprintf(cd, sizeof cd, "%s", dir);
  pthread_mutex_unlock(&lock);
  snprintf(suf, sizeof suf, ".%s", ext);
  if (!(d = opendir(cd))) return;
  while ((de = readdir(d))) {
    char p[1400];
    struct stat st;
    if (!ends_with(de->d_name, suf)) continue;
    snprintf(p, sizeof p, "%s/%s", cd, de->d_name);
    if (stat(p, &st) == 0) { (*entries)++; *bytes += st.st_size; }
  }
  closedir(d);
}
