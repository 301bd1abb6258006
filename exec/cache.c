/*
** cache.c -- the compiled-kernel cache.
** Invariant: an object is loaded only from a file that proved itself
** without running anything: a regular file in a directory the user owns
** and nobody else can write (else a private temp directory stands in),
** owned by the user, not writable by others, whose appended seal names
** this key and whose checksum covers every byte; and what is loaded is
** that very file (through its verified fd: a hard link to it, made from
** the fd, in a private directory; the fd is then closed, so a live
** program holds no descriptor).  A file named <key>.so is
** absent or such an object, renamed into place only after the compiler
** succeeded within its time; anything else under that name is removed and
** rebuilt.  The in-memory table holds only objects some program holds.
*/
#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <pwd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/utsname.h>
#include <time.h>
#include <unistd.h>

#include <xxhash.h>

#include "config.h"
#include "cache.h"
#include "cache_disk.h"
#include "cache_remote.h"
#include "exec/measure.h"

#ifndef FL_CC_DEFAULT
#define FL_CC_DEFAULT "cc"
#endif

/* most compiler processes one program starts at once */
#define MAX_JOBS 8

/* For GCC, -O3 without its versioning of loops for unit strides: the
** generated kernels test for stride 1 themselves, so the copies GCC adds
** to the strided fallback loops only cost compile time (a transformer
** block's kernels: 1.36-1.50 s to compile at -O3, 0.79-0.86 s with it off,
** a [4096, 1024] softmax 2.04-2.13 ms either way; bench/RESULTS.md).
** Clang rejects the option, so it goes only to a compiler whose `-###`
** answers as GCC's does.  -pipe: the assembler reads the compiler's
** output as it comes, 2-6 % off a compile (a transformer block's kernels
** as one file on a Zen 4 core, means of 12: 0.42-0.43 -> 0.41-0.42 s).
** Not taken: --param vect-epilogues-nomask=0, 2-5 % off a compile but
** the [4096, 1024] softmax 2-4 % slower.  -fno-trapping-math: nothing here
** reads floating-point exception flags, and without it a select on a
** comparison (a ReLU's gradient, where) in a column reduction's loop is
** not if-converted, so the loop does not vectorize (ReLU's gradient with
** its bias's sum over [256, 2048]: 1.29 -> 0.2 ms); values are unchanged
** (NaN and infinities are kept: it is not -ffinite-math-only). */
#define FLAGS "-O3 -march=native -fopenmp -shared -fPIC -fno-math-errno -fno-trapping-math -pipe"
#define GCC_FLAGS " -fno-version-loops-for-strides"

struct cache_obj {
  char key[33];
  void *handle;
  int fd;                /* the verified file it was loaded through, kept
                            open only when loaded by its fd's name; or -1 */
  int refs;              /* holders; at 0 the object is unloaded */
  int in_table;          /* found by later requests for its key */
  cache_obj *next;
};

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static cache_obj *table;
static char dir[1024];   /* "" when no directory could be had at all */
static int dir_ready;
static char warning[2400];
static int64_t n_hits, n_disk, n_miss, n_fail, n_timeout, n_evict;
static void (*while_linking)(void);


void cache_while_linking(void (*fn)(void)) {
  pthread_mutex_lock(&lock);
  while_linking = fn;
  pthread_mutex_unlock(&lock);
}

/* the hook, once the last compiler step is running */
static void linking(void) {
  void (*fn)(void);
  pthread_mutex_lock(&lock);
  fn = while_linking;
  pthread_mutex_unlock(&lock);
  if (fn) fn();
}

const char *cache_compiler(void) {
  const char *cc = getenv("CC");
  return cc && *cc ? cc : FL_CC_DEFAULT;
}

/* glibc's libmvec: SIMD expf/logf/sinf/cosf/powf (2.22), tanhf (2.35;
** exp and erf are cpu/expf.h's and cpu/erff.h's, inlined).  The generated
** preamble declares what is there as `simd`, so loops with
** transcendentals vectorize (cpu/codegen.c). */
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

/* FLAGS and libmvec's level: what every compiler gets */
static const char *base_flags(void) {
  static char flags[256];
  if (!flags[0]) {
    int lv = mvec_level();
    if (lv) snprintf(flags, sizeof flags, "%s -DFL_MVEC=%d", FLAGS, lv);
    else snprintf(flags, sizeof flags, "%s", FLAGS);
  }
  return flags;
}

static int target_gcc(void);
static int target_avx512(void);

/* On Intel's AVX-512 parts GCC and Clang tune -march=native for 256-bit
** vectors (to spare Skylake-X's clock); the generated kernels' exp, erf
** and row passes are bound by arithmetic, and oneDNN's products run at 512
** bits anyway.  With 512-bit vectors, on a family 6 model 167 Xeon: a
** [4096, 1024] softmax 1.58-1.62 -> 1.36-1.48 ms, layer_norm 1.16 ->
** 1.05 ms, the 16M-float 9-op chain 4.39-4.42 -> 4.04-4.10 ms; products
** unchanged (bench/RESULTS.md). */
#define WIDE_FLAGS " -mprefer-vector-width=512"

static pthread_mutex_t flags_lock = PTHREAD_MUTEX_INITIALIZER;

const char *cache_flags(void) {
  static char v[4][256 + sizeof GCC_FLAGS + sizeof WIDE_FLAGS];
  int gcc = target_gcc(), wide = target_avx512();
  char *f = v[gcc * 2 + wide];
  pthread_mutex_lock(&flags_lock);
  if (!f[0]) snprintf(f, sizeof v[0], "%s%s%s", base_flags(), gcc ? GCC_FLAGS : "", wide ? WIDE_FLAGS : "");
  pthread_mutex_unlock(&flags_lock);
  return f;
}

static const char *libs(void) { return mvec_level() ? "-lmvec -lm" : "-lm"; }

const char *cache_warning(void) { return warning[0] ? warning : NULL; }


/* Where the cache lives, trusted the way ssh trusts ~/.ssh: a directory
** someone else owns or can write is not used (they could plant objects
** that we would load); with no home at all there is no shared guess (a
** /tmp path anyone could create first) but a private directory. */
static void choose_dir(void) {
  const char *env = getenv("FUSELAB_CACHE_DIR"), *xdg = getenv("XDG_CACHE_HOME");
  const char *home = getenv("HOME");
  char want[1024] = "", why[600] = "";
  static int shown;
  if (!(home && *home)) {
    struct passwd *pw = getpwuid(geteuid());
    home = pw && pw->pw_dir && pw->pw_dir[0] == '/' ? pw->pw_dir : NULL;
  }
  if (env && *env) snprintf(want, sizeof want, "%s", env);
  else if (xdg && *xdg) snprintf(want, sizeof want, "%s/fuselab", xdg);
  else if (home) snprintf(want, sizeof want, "%s/.cache/fuselab", home);
  warning[0] = dir[0] = '\0';
  if (!want[0]) {
    snprintf(why, sizeof why, "no home directory ($HOME unset, none in the password database)");
  } else if (cdisk_mkdirs(want) != 0) {
    snprintf(why, sizeof why, "%s", strerror(errno));
  } else if (cdisk_trusted_dir(want, why, sizeof why)) {
    char probe[1200];
    int fd;
    if (!realpath(want, dir)) snprintf(dir, sizeof dir, "%s", want);
    snprintf(probe, sizeof probe, "%s/.probe-XXXXXX", dir);
    if ((fd = mkstemp(probe)) >= 0) {
      close(fd);
      unlink(probe);
    } else {
      snprintf(why, sizeof why, "%s", strerror(errno));
      dir[0] = '\0';
    }
  }
  if (!dir[0]) {
    if (cdisk_private_dir(dir, sizeof dir) != 0) dir[0] = '\0';
    snprintf(warning, sizeof warning, "cache: cannot use %s (%s); using the private directory %s "
             "for this process", want[0] ? want : "a cache directory", why,
             dir[0] ? dir : "(none: every kernel is compiled afresh)");
    if (!shown++) fprintf(stderr, "fuselab: warning: %s\n", warning);
  }
  dir_ready = 1;
}

void cache_reset_dir(void) {
  pthread_mutex_lock(&lock);
  dir_ready = 0;
  pthread_mutex_unlock(&lock);
}

/* The directory in use, chosen on first need; 0 or an error. */
static int get_dir(char *out, size_t n, fl_err *e) {
  pthread_mutex_lock(&lock);
  if (!dir_ready) choose_dir();
  snprintf(out, n, "%s", dir);
  pthread_mutex_unlock(&lock);
  if (!out[0]) return err_set(e, FL_EIO, "cache: no directory to compile in (%s)", warning);
  return FL_OK;
}

/* ---- the target --------------------------------------------------------
** What -march=native means is decided by the compiler on this host: two
** hosts with the same CPU model name may have other instruction sets (a
** VM hides AVX-512, microcode turns TSX off), and an object built for one
** dies with SIGILL on the other.  So the key holds what the compiler
** reports it will target (`-###`): GCC's -march=<cpu> and every -m<feature>
** flag, Clang's -target-cpu and -target-feature.  Asked once per compiler
** and process, under the compile timeout. */

static pthread_mutex_t target_lock = PTHREAD_MUTEX_INITIALIZER;
static char target_cc[512], target[8192];
static int target_is_gcc;          /* the -### answer was GCC's */

/* the flags naming the target in `cc -###` output, space-separated */
static void target_flags(const char *out, char *buf, size_t n) {
  const char *line = out;
  size_t used = 0;
  buf[0] = '\0';
  while (line && *line) {
    const char *eol = strchr(line, '\n');
    size_t len = eol ? (size_t)(eol - line) : strlen(line);
    /* GCC echoes the options as given (-march=native) in this line */
    if (strncmp(line, "COLLECT_GCC_OPTIONS", 19) != 0) {
      char tok[256], prev[256] = "";
      size_t i = 0;
      while (i < len) {
        size_t k = 0;
        while (i < len && (line[i] == ' ' || line[i] == '\t')) i++;
        while (i < len && line[i] != ' ' && line[i] != '\t') {
          if (line[i] != '"' && k + 1 < sizeof tok) tok[k++] = line[i];
          i++;
        }
        tok[k] = '\0';
        if (!k) continue;
        int keep = (strncmp(tok, "-m", 2) == 0 && ((tok[2] >= 'a' && tok[2] <= 'z') || tok[2] == '6' || tok[2] == '3')
                    && strcmp(tok, "-march=native") != 0 && strcmp(tok, "-mtune=native") != 0) ||
                   strcmp(prev, "-target-cpu") == 0 || strcmp(prev, "-target-feature") == 0 ||
                   strcmp(prev, "-tune-cpu") == 0;
        if (keep && used + k + 2 < n) {
          if (strcmp(prev, "-target-cpu") == 0) used += (size_t)snprintf(buf + used, n - used, "%starget-cpu=", used ? " " : "");
          else if (used) buf[used++] = ' ';
          memcpy(buf + used, tok, k + 1);
          used += k;
        }
        snprintf(prev, sizeof prev, "%s", tok);
      }
    }
    line = eol ? eol + 1 : NULL;
  }
}

/* When the compiler cannot say (not GCC or Clang): the CPU's own feature
** list, which is what -march=native reads anyway. */
static void cpu_flags(char *buf, size_t n) {
  FILE *f = fopen("/proc/cpuinfo", "r");
  char line[8192];
  XXH64_hash_t h = 0;
  if (f) {
    while (fgets(line, sizeof line, f))
      if (strncmp(line, "flags", 5) == 0 || strncmp(line, "Features", 8) == 0) {
        h = XXH64(line, strlen(line), 0);
        break;
      }
    fclose(f);
  }
  snprintf(buf, n, "cpu-features=%016llx", (unsigned long long)h);
}

static void get_target(char *out, size_t n) {
  const char *cc = cache_compiler();
  pthread_mutex_lock(&target_lock);
  if (strcmp(target_cc, cc) != 0 || !target[0]) {
    size_t cap = 1 << 16;
    char *cmd = malloc(strlen(cc) + strlen(base_flags()) + 64), *buf = malloc(cap);
    target[0] = '\0';
    target_is_gcc = 0;
    if (cmd && buf) {
      sprintf(cmd, "%s %s -### -x c -c /dev/null -o /dev/null", cc, base_flags());
      /* the exit status does not matter: -### only prints */
      buf[0] = '\0';
      cdisk_capture(cmd, buf, cap, cdisk_timeout());
      target_flags(buf, target, sizeof target);
      target_is_gcc = strstr(buf, "COLLECT_GCC_OPTIONS") != NULL;
    }
    if (!target[0]) cpu_flags(target, sizeof target);
    free(cmd);
    free(buf);
    /* an interrupted answer is not kept: the next compile asks again */
    snprintf(target_cc, sizeof target_cc, "%s", fl_interrupt ? "" : cc);
  }
  snprintf(out, n, "%s", target);
  pthread_mutex_unlock(&target_lock);
}

static int target_gcc(void) {
  int gcc;
  get_target(NULL, 0);
  pthread_mutex_lock(&target_lock);
  gcc = target_is_gcc;
  pthread_mutex_unlock(&target_lock);
  return gcc;
}

/* the compiler targets AVX-512F: a target token -mavx512f (GCC) or
** +avx512f (Clang) */
static int target_avx512(void) {
  char tg[sizeof target], *tok, *save = NULL;
  get_target(tg, sizeof tg);
  for (tok = strtok_r(tg, " ", &save); tok; tok = strtok_r(NULL, " ", &save))
    if (strcmp(tok, "-mavx512f") == 0 || strcmp(tok, "+avx512f") == 0) return 1;
  return 0;
}

const char *cache_target(void) {
  static char copy[sizeof target];
  get_target(copy, sizeof copy);
  return copy;
}

/* The key of head + units (hashed as one text, as the file holds it). */
static void make_key(const char *head, const char *const *units, int nunits, char *hex) {
  XXH3_state_t *st = XXH3_createState();
  char tg[sizeof target];
  struct utsname u;
  XXH128_hash_t h;
  const char *cc = cache_compiler();
  int i;
  get_target(tg, sizeof tg);
  if (uname(&u) != 0) snprintf(u.machine, sizeof u.machine, "?");
  XXH3_128bits_reset(st);
  XXH3_128bits_update(st, head, strlen(head));
  for (i = 0; i < nunits; i++) XXH3_128bits_update(st, units[i], strlen(units[i]));
  XXH3_128bits_update(st, "", 1);
  XXH3_128bits_update(st, cc, strlen(cc) + 1);
  XXH3_128bits_update(st, cache_flags(), strlen(cache_flags()) + 1);
  XXH3_128bits_update(st, u.machine, strlen(u.machine) + 1);
  XXH3_128bits_update(st, tg, strlen(tg) + 1);
  XXH3_128bits_update(st, PACKAGE_VERSION, sizeof PACKAGE_VERSION);
  h = XXH3_128bits_digest(st);
  XXH3_freeState(st);
  snprintf(hex, 33, "%016llx%016llx", (unsigned long long)h.high64,
           (unsigned long long)h.low64);
}

/* The whole file at path (in a private directory), malloc'd; NULL if none. */
static char *slurp(const char *path) {
  int fd = open(path, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
  struct stat st;
  char *buf = NULL;
  size_t got = 0;
  if (fd < 0) return NULL;
  if (fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && (buf = malloc((size_t)st.st_size + 1))) {
    ssize_t r;
    while (got < (size_t)st.st_size && (r = read(fd, buf + got, (size_t)st.st_size - got)) > 0)
      got += (size_t)r;
    buf[got] = '\0';
  }
  close(fd);
  return buf;
}

/* Append text to *log (malloc'd; NULL log: nothing). */
static void log_add(char **log, const char *text) {
  size_t a, b = strlen(text);
  char *n;
  if (!log) return;
  a = *log ? strlen(*log) : 0;
  if (!(n = realloc(*log, a + b + 1))) return;
  memcpy(n + a, text, b + 1);
  *log = n;
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

/* Write head + the chosen units (+ the key) to a file created here. */
static int write_file(const char *path, const char *head, const char *const *units,
                      const int *which, int n, const char *key, fl_err *e) {
  int fd = cdisk_create(path), i;
  FILE *f = fd >= 0 ? fdopen(fd, "w") : NULL;
  if (!f) {
    if (fd >= 0) close(fd);
    return err_set(e, FL_EIO, "cache: cannot create %s: %s", path, strerror(errno));
  }
  fputs(head, f);
  for (i = 0; i < n; i++) fputs(units[which ? which[i] : i], f);
  if (key)
    fprintf(f, "\n/* the cache key this object was built for */\n"
            "const char fl_cache_key[] = \"%s\";\n", key);
  if (fclose(f) != 0) { unlink(path); return err_set(e, FL_EIO, "cache: cannot write %s", path); }
  return FL_OK;
}

/* The compiler on src into out (object when link is 0), output appended
** to logp; inputs (quoted .o files) replace src when given.  Malloc'd. */
static char *cc_command(const char *out, const char *src, int link, const char *inputs,
                        const char *logp) {
  char qs[2500], qo[2500], ql[2500];
  char *cmd;
  size_t n;
  quote(qo, sizeof qo, out);
  quote(qs, sizeof qs, src ? src : "");
  quote(ql, sizeof ql, logp);
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

/* Deal the units into `jobs` parts of about equal text, the longest
** first, each to the lightest part so far: part[u] for every unit; len
** is room for nunits lengths.  (In their own order, a transformer block's
** five kernels split 410 / 270 ms of compiling; longest first, about
** even.) */
static void deal(const char *const *units, int nunits, int jobs, int *part, size_t *len) {
  size_t load[MAX_JOBS] = {0};
  int k, u, j, next, best;
  for (u = 0; u < nunits; u++) {
    part[u] = -1;
    len[u] = strlen(units[u]) + 1;
  }
  for (k = 0; k < nunits; k++) {
    for (next = -1, u = 0; u < nunits; u++)
      if (part[u] < 0 && (next < 0 || len[u] > len[next])) next = u;
    for (best = 0, j = 1; j < jobs; j++) if (load[j] < load[best]) best = j;
    load[best] += len[next];
    part[next] = best;
  }
}


/* Run the compiler on head + units in a private temp directory of the
** cache dir cd, seal the object and rename it to final (the source beside
** it as <key>.c).  On success *fd is the sealed object, opened and
** verified (it stays valid even when the rename failed).  One unit or one
** CPU: one compiler run.  Otherwise the units are dealt into one
** translation unit per CPU (each starting with head), compiled at the same
** time and linked.  The whole compile runs under the compile timeout: past
** it every compiler process is killed. */
static int compile_to(const char *cd, const char *head, const char *const *units, int nunits,
                      const char *key, const char *final, char **log, int *fd, fl_err *e) {
  char tmp[1100], src[1200], so[1200], logp[1200], path[1300], part[1300];
  char *cmd = NULL, *inputs = NULL;
  int *where = NULL, *mine = NULL, jobs = n_jobs(nunits), j, u, n, rc = FL_OK, why = CDISK_DONE;
  size_t *len = NULL;
  int ok[MAX_JOBS + 1];
  pid_t pid[MAX_JOBS];
  double limit = cdisk_timeout(), deadline = meas_now() + limit;
  char what[160];
  cdisk_note note = {what, meas_now(), 0, 0};
  struct stat st;
  *fd = -1;
  {
    const char *cc = cache_compiler(), *slash = strrchr(cc, '/');
    snprintf(what, sizeof what, "compiling %d kernel%s with %s", nunits, nunits == 1 ? "" : "s",
             slash && !strchr(slash, ' ') ? slash + 1 : cc);
  }
  if (cdisk_tmpdir(cd, tmp, sizeof tmp) != 0)
    return err_set(e, FL_EIO, "cache: cannot make a temp directory in %s: %s", cd, strerror(errno));
  snprintf(src, sizeof src, "%s/all.c", tmp);
  snprintf(so, sizeof so, "%s/all.so", tmp);
  snprintf(logp, sizeof logp, "%s/all.log", tmp);
  /* the whole source: compiled when one part, kept beside the object */
  if ((rc = write_file(src, head, units, NULL, nunits, key, e)) != FL_OK) goto out;
  if (jobs > 1) {
    where = malloc((size_t)nunits * sizeof *where);
    mine = malloc((size_t)nunits * sizeof *mine);
    len = malloc((size_t)nunits * sizeof *len);
    inputs = malloc((size_t)jobs * (sizeof path * 2 + 8) + 1);
    if (!where || !mine || !len || !inputs) { rc = err_set(e, FL_ENOMEM, "cache: out of memory"); goto out; }
    deal(units, nunits, jobs, where, len);
    inputs[0] = '\0';
    for (j = 0; j < jobs; j++) pid[j] = -1;
    for (j = 0; j < jobs; j++) {
      char q[2700], plog[1300];
      for (n = 0, u = 0; u < nunits; u++) if (where[u] == j) mine[n++] = u;
      snprintf(part, sizeof part, "%s/p%d.c", tmp, j);
      if ((rc = write_file(part, head, units, mine, n, j == 0 ? key : NULL, e)) != FL_OK) {
        cdisk_wait(pid, j, ok, 0, NULL);   /* a past deadline: the parts started are killed */
        goto out;
      }
      snprintf(path, sizeof path, "%s/p%d.o", tmp, j);
      snprintf(plog, sizeof plog, "%s/p%d.log", tmp, j);
      pid[j] = (cmd = cc_command(path, part, 0, NULL, plog)) ? cdisk_spawn(cmd, -1) : -1;
      free(cmd);
      cmd = NULL;
      quote(q, sizeof q, path);
      strcat(strcat(inputs, q), " ");
    }
    why = cdisk_wait(pid, jobs, ok, deadline, &note);
    for (j = 0; j < jobs; j++) ok[MAX_JOBS] = j == 0 ? ok[0] : ok[MAX_JOBS] && ok[j];
    if (why == CDISK_DONE && ok[MAX_JOBS] && (cmd = cc_command(so, NULL, 1, inputs, logp))) {
      if ((pid[0] = cdisk_spawn(cmd, -1)) > 0) linking();
      why = cdisk_wait(pid, 1, ok, deadline, &note);
    } else {
      ok[0] = 0;
    }
    for (j = 0; j < jobs; j++) {       /* the parts' output, in order, into the log */
      char *pl;
      snprintf(path, sizeof path, "%s/p%d.log", tmp, j);
      if ((pl = slurp(path)) && pl[0]) log_add(log, pl);
      free(pl);
    }
  } else {
    pid[0] = (cmd = cc_command(so, src, 1, NULL, logp)) ? cdisk_spawn(cmd, -1) : -1;
    if (pid[0] > 0) linking();
    why = cdisk_wait(pid, 1, ok, deadline, &note);
  }
  cdisk_note_done(&note);
  if (log) {
    char *l = slurp(logp);
    if (l) log_add(log, l);
    free(l);
  }
  if (why == CDISK_TIMEOUT) {
    char msg[600];
    snprintf(msg, sizeof msg, "compile: %s did not finish within %g s (FUSELAB_COMPILE_TIMEOUT); "
             "it was killed", cache_compiler(), limit);
    log_add(log, msg);
    log_add(log, "\n");
    pthread_mutex_lock(&lock);
    n_timeout++;
    pthread_mutex_unlock(&lock);
    rc = err_set(e, FL_ECOMPILE, "%s", msg);
  } else if (why == CDISK_INTR) {
    rc = err_set(e, FL_EINTR, "compile: interrupted; %s was stopped", cache_compiler());
  } else if (!ok[0] || cdisk_seal_so(so, key) != 0 || (*fd = cdisk_open_entry(so, &st)) < 0 ||
             !cdisk_verify_so(*fd, &st, key)) {
    if (*fd >= 0) close(*fd);
    *fd = -1;
    rc = err_set(e, FL_ECOMPILE, "compile: %s failed; its output is in the program's compile log",
                 cache_compiler());
  } else {
    /* a failed rename (a directory in the way) keeps the object uncached */
    if (rename(so, final) == 0) {
      snprintf(path, sizeof path, "%s/%s.c", cd, key);
      rename(src, path);
    }
  }
out:
  free(cmd);
  free(inputs);
  free(where);
  free(mine);
  free(len);
  cdisk_rmtmp(tmp);
  return rc;
}

/* An object that could not be loaded through a link of its own
** (cdisk_dlopen_fd) is loaded by the name /proc/self/fd/N of its verified
** fd, and the loader hands an object already known by a name to whoever
** asks for that name: so that fd stays open while its object may be
** loaded, also after our dlclose when another handle keeps the object
** (kept here and closed once the loader no longer knows it).  An fd that
** never named an object is closed at once. */
static pthread_mutex_t fd_lock = PTHREAD_MUTEX_INITIALIZER;
static int *held_fds, nheld, capheld;

static void unload(void *h, int fd) {
  int i;
  if (h) dlclose(h);
  pthread_mutex_lock(&fd_lock);
  if (fd >= 0 && nheld == capheld) {
    int *g = realloc(held_fds, (size_t)(capheld = capheld ? 2 * capheld : 16) * sizeof *g);
    if (g) held_fds = g;
    else capheld = nheld;
  }
  /* no room to track it: left open, so never reused */
  if (fd >= 0 && nheld < capheld) held_fds[nheld++] = fd;
  for (i = 0; i < nheld; i++) {
    char name[64];
    void *still;
    snprintf(name, sizeof name, "/proc/self/fd/%d", held_fds[i]);
    if ((still = dlopen(name, RTLD_LAZY | RTLD_NOLOAD))) { dlclose(still); continue; }
    close(held_fds[i]);
    held_fds[i--] = held_fds[--nheld];
  }
  pthread_mutex_unlock(&fd_lock);
}

/* The verified object at path in cd, loaded (*fd its file, *held as
** cdisk_dlopen_fd says): NULL when absent or not ours (removed then, to be
** rebuilt), or when it could not be tried for want of descriptors (kept).
** A hit makes the entry recently used. */
static void *load_entry(const char *cd, const char *path, const char *key, int *fd, int *held) {
  struct stat st;
  void *h = NULL;
  int verified = 0;
  *fd = cdisk_open_entry(path, &st);
  if (*fd == -1 || *fd == -3) {
    *fd = -1;
    return NULL;
  }
  if (*fd >= 0 && (verified = cdisk_verify_so(*fd, &st, key)) && (h = cdisk_dlopen_fd(*fd, cd, key, held))) {
    futimens(*fd, NULL);
    return h;
  }
  if (*fd >= 0) close(*fd);
  *fd = -1;
  /* a sound entry that could not be loaded for want of descriptors stays */
  if (!(verified && cdisk_out_of_fds())) cdisk_discard(path);   /* corrupt, foreign, or not a file at all */
  return NULL;
}

static int full_write(int fd, const void *buf, size_t n);

/* After a disk miss: the entry from Redis, written to a temp file in cd,
** proved by the same seal as a disk entry, renamed to path and loaded (*fd
** its file); NULL when Redis has none or it does not prove itself
** (rejected, then rebuilt by the caller). */
static void *remote_entry(const char *cd, const char *key, const char *path, int *fd, int *held) {
  char tmp[1200];
  const char *k, *bad = NULL;
  struct stat st;
  void *data, *h = NULL;
  size_t n;
  int w;
  *fd = -1;
  if (!crem_get(key, &data, &n)) return NULL;
  snprintf(tmp, sizeof tmp, "%s/tmp-%ld-XXXXXX", cd, (long)getpid());
  if ((w = mkostemp(tmp, O_CLOEXEC)) < 0) {        /* O_CREAT|O_EXCL: never through a link */
    free(data);
    return NULL;                                  /* a local problem: compiled, not counted */
  }
  w = full_write(w, data, n) && fchmod(w, 0700) == 0 ? (close(w) == 0) : (close(w), 0);
  free(data);
  if (!w || (*fd = cdisk_open_entry(tmp, &st)) < 0) {
    if (*fd >= 0) close(*fd);
    *fd = -1;
    unlink(tmp);
    return NULL;
  }
  if (!cdisk_verify_so(*fd, &st, key)) bad = "not an object sealed for its key";
  else if (!(h = cdisk_dlopen_fd(*fd, cd, key, held))) bad = cdisk_out_of_fds() ? NULL : "does not load";
  else if (!(k = dlsym(h, "fl_cache_key")) || strcmp(k, key) != 0) bad = "built for another key";
  if (bad || !h) {
    if (h) unload(h, *fd);
    else close(*fd);
    *fd = -1;
    unlink(tmp);
    if (bad) crem_verdict(key, bad);   /* (no verdict when it could not be tried) */
    return NULL;
  }
  if (rename(tmp, path) != 0) unlink(tmp);        /* loaded all the same, just not kept */
  crem_verdict(key, NULL);
  return h;
}

/* A compiled object, sealed, to Redis (the file behind fd, read whole). */
static void publish(const char *key, int fd) {
  struct stat st;
  char *buf;
  if (!crem_enabled() || fstat(fd, &st) != 0 || st.st_size <= 0) return;
  if (!(buf = malloc((size_t)st.st_size))) return;
  if (pread(fd, buf, (size_t)st.st_size, 0) == st.st_size) crem_put(key, buf, (size_t)st.st_size);
  free(buf);
}

/* The error when a compile or a load failed for want of file descriptors
** (err: EMFILE or ENFILE), whatever step noticed first: it names the
** limit and what to do, since the compiler is not at fault. */
static int no_fds(fl_err *e, int err, const char *what) {
  struct rlimit rl;
  char lim[64] = "";
  if (err == EMFILE && getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY)
    snprintf(lim, sizeof lim, " of %llu", (unsigned long long)rl.rlim_cur);
  if (err == ENFILE)
    err_set(e, FL_EIO, "compile: too many open files in the system (ENFILE), so %s; the compiler "
            "is not at fault", what);
  else
    err_set(e, FL_EIO, "compile: too many open files: this process is at its limit%s (ulimit -n, "
            "RLIMIT_NOFILE), so %s; the compiler is not at fault: close files the program holds, "
            "or raise the limit", lim, what);
  return FL_EIO;
}

int cache_load(const char *source, cache_obj **out, char **log, int *how, fl_err *e) {
  return cache_load_units("", &source, 1, out, log, how, e);
}

static int debug_level(void) {
  const char *d = getenv("FUSELAB_DEBUG");
  return d ? atoi(d) : 0;
}

int cache_load_units(const char *head, const char *const *units, int nunits, cache_obj **out,
                     char **log, int *how, fl_err *e) {
  char key[33], path[1100], cd[1024];
  const char *k;
  cache_obj *o;
  void *h;
  int rc, dummy, fd, held = 1, err;
  if (!how) how = &dummy;
  if (log) *log = NULL;
  *out = NULL;
  fl_interrupt = 0;                /* a press before this compile was for the Lua code */
  if ((rc = get_dir(cd, sizeof cd, e)) != FL_OK) return rc;
  make_key(head, units, nunits, key);
  pthread_mutex_lock(&lock);
  for (o = table; o; o = o->next)
    if (strcmp(o->key, key) == 0) {
      o->refs++;
      n_hits++;
      pthread_mutex_unlock(&lock);
      *out = o;
      *how = CACHE_MEMORY;
      if (debug_level() >= 1) fprintf(stderr, "fuselab: kernel cache hit (memory) %s\n", key);
      return FL_OK;
    }
  pthread_mutex_unlock(&lock);
  snprintf(path, sizeof path, "%s/%s.so", cd, key);
  *how = CACHE_DISK;
  if (!(h = load_entry(cd, path, key, &fd, &held)) && (h = remote_entry(cd, key, path, &fd, &held))) {
    *how = CACHE_REMOTE;
    rc = cdisk_evict(cd, cdisk_cap(), key);
    pthread_mutex_lock(&lock);
    n_evict += rc;
    pthread_mutex_unlock(&lock);
  } else if (!h) {
    if ((rc = compile_to(cd, head, units, nunits, key, path, log, &fd, e)) != FL_OK) {
      /* files it could not open, the compiler it could not start: not
      ** the compiler's failure, and no message of its would say so */
      if (rc != FL_EINTR && (err = cdisk_out_of_fds())) return no_fds(e, err, "nothing could be compiled");
      pthread_mutex_lock(&lock);
      n_fail++;
      pthread_mutex_unlock(&lock);
      return rc;
    }
    if (!(h = cdisk_dlopen_fd(fd, cd, key, &held))) {
      const char *de = dlerror();
      close(fd);
      if ((err = cdisk_out_of_fds())) return no_fds(e, err, "the compiled kernels could not be loaded");
      return err_set(e, FL_ECOMPILE, "compile: cannot load %s: %s", path, de ? de : "bad object");
    }
    *how = CACHE_COMPILED;
    publish(key, fd);
    rc = cdisk_evict(cd, cdisk_cap(), key);
    pthread_mutex_lock(&lock);
    n_evict += rc;
    pthread_mutex_unlock(&lock);
  }
  /* the seal said so; the object agrees (else the seal was forged) */
  k = dlsym(h, "fl_cache_key");
  if (!k || strcmp(k, key) != 0) {
    unload(h, fd);
    cdisk_discard(path);
    return err_set(e, FL_ECOMPILE, "compile: %s was built for another key", path);
  }
  if (!(o = calloc(1, sizeof *o))) {
    unload(h, fd);
    return err_set(e, FL_ENOMEM, "cache: out of memory");
  }
  /* loaded through a link of its own: the loader needs the fd no more */
  if (!held) {
    close(fd);
    fd = -1;
  }
  memcpy(o->key, key, sizeof key);
  o->handle = h;
  o->fd = fd;
  o->refs = 1;
  o->in_table = 1;
  pthread_mutex_lock(&lock);
  o->next = table;
  table = o;
  if (*how == CACHE_DISK) n_disk++;
  else if (*how == CACHE_COMPILED) n_miss++;
  pthread_mutex_unlock(&lock);
  if (debug_level() >= 1)
    fprintf(stderr, "fuselab: kernel cache %s %s\n",
            *how == CACHE_DISK ? "hit (disk)" : *how == CACHE_REMOTE ? "hit (remote)" : "miss (compiled)",
            key);
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

/* unlinks o from the table; under the lock */
static void untable(cache_obj *o) {
  cache_obj **p;
  if (!o->in_table) return;
  for (p = &table; *p; p = &(*p)->next)
    if (*p == o) { *p = o->next; break; }
  o->in_table = 0;
}

void cache_release(cache_obj *o) {
  int last;
  if (!o) return;
  pthread_mutex_lock(&lock);
  if ((last = --o->refs == 0)) untable(o);
  pthread_mutex_unlock(&lock);
  if (last) {
    unload(o->handle, o->fd);
    free(o);
  }
}

void cache_forget_memory(void) {
  cache_obj *o, *next;
  pthread_mutex_lock(&lock);
  for (o = table; o; o = next) {
    next = o->next;
    o->in_table = 0;
  }
  table = NULL;
  pthread_mutex_unlock(&lock);
}

/* Number and bytes of the regular <key>.<ext> files in cd, added to *n
** and *bytes. */
static void count_entries(const char *cd, const char *ext, int64_t *n, int64_t *bytes) {
  DIR *d;
  struct dirent *de;
  if (!(d = opendir(cd))) return;
  while ((de = readdir(d))) {
    char p[1400];
    struct stat st;
    if (!cdisk_entry_name(de->d_name, ext)) continue;
    snprintf(p, sizeof p, "%s/%s", cd, de->d_name);
    if (lstat(p, &st) == 0 && S_ISREG(st.st_mode)) { (*n)++; *bytes += st.st_size; }
  }
  closedir(d);
}

int cache_get_info(cache_info *out, fl_err *e) {
  cache_obj *o;
  (void)e;
  memset(out, 0, sizeof *out);
  pthread_mutex_lock(&lock);
  if (!dir_ready) choose_dir();
  snprintf(out->dir, sizeof out->dir, "%s", dir);
  out->hits = n_hits; out->disk_hits = n_disk; out->misses = n_miss; out->failures = n_fail;
  out->timeouts = n_timeout; out->evictions = n_evict;
  for (o = table; o; o = o->next) out->loaded++;
  pthread_mutex_unlock(&lock);
  out->max_bytes = cdisk_cap();
  {
    crem_info ri;
    crem_get_info(&ri);
    out->remote.configured = ri.configured;
    out->remote.enabled = ri.enabled;
    snprintf(out->remote.url, sizeof out->remote.url, "%s", ri.url);
    snprintf(out->remote.why, sizeof out->remote.why, "%s", ri.why);
    out->remote.hits = ri.hits; out->remote.misses = ri.misses; out->remote.writes = ri.writes;
    out->remote.rejected = ri.rejected; out->remote.errors = ri.errors;
  }
  if (out->dir[0]) count_entries(out->dir, "so", &out->entries, &out->bytes);
  return FL_OK;
}

#define BLOB_MAGIC "FLBLOB1\n"

/* fuselab's own: <key>.so, <key>.c, a blob that names its key inside */
static int ours(const char *cd, const char *name) {
  char p[1400], head[40];
  struct stat st;
  int fd, yes;
  if (cdisk_entry_name(name, "so") || cdisk_entry_name(name, "c")) return 1;
  if (!cdisk_entry_name(name, NULL)) return 0;
  snprintf(p, sizeof p, "%s/%s", cd, name);
  if ((fd = cdisk_open_entry(p, &st)) < 0) return 0;
  yes = read(fd, head, sizeof head) == (ssize_t)sizeof head && memcmp(head, BLOB_MAGIC, 8) == 0 &&
        memcmp(head + 8, name, 32) == 0;
  close(fd);
  return yes;
}

int cache_clear(fl_err *e) {
  DIR *d;
  struct dirent *de;
  char cd[1024];
  double limit = cdisk_timeout();
  int rc;
  if ((rc = get_dir(cd, sizeof cd, e)) != FL_OK) return rc;
  cache_forget_memory();
  if (!(d = opendir(cd))) return err_set(e, FL_EIO, "cache: cannot open %s: %s", cd, strerror(errno));
  while ((de = readdir(d))) {
    char p[1400];
    snprintf(p, sizeof p, "%s/%s", cd, de->d_name);
    if (ours(cd, de->d_name)) cdisk_discard(p);
    else if (cdisk_stale_tmp(cd, de->d_name, limit)) cdisk_rmtmp(p);
  }
  closedir(d);
  return FL_OK;
}

/* --- blobs ----------------------------------------------------------------
** File layout: "FLBLOB1\n", the 32-digit key, the payload size (8 bytes,
** little endian), the payload, then its XXH64.  Anything else is not ours. */

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

static int full_read(int fd, void *buf, size_t n) {
  size_t got = 0;
  while (got < n) {
    ssize_t r = read(fd, (char *)buf + got, n - got);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return 0;
    got += (size_t)r;
  }
  return 1;
}

int cache_get_blob(const char *key, const char *ext, void **data, size_t *n) {
  char path[1200], head[8 + 32], cd[1024];
  unsigned char sz[8], sum[8];
  uint64_t len = 0, want;
  void *buf = NULL;
  struct stat st;
  int i, ok = 0, fd;
  *data = NULL;
  *n = 0;
  if (get_dir(cd, sizeof cd, NULL) != FL_OK) return 0;
  snprintf(path, sizeof path, "%s/%s.%s", cd, key, ext);
  /* absent, or not to be checked now (no descriptor left): kept, a miss */
  if ((fd = cdisk_open_entry(path, &st)) == -1 || fd == -3) return 0;
  if (fd >= 0 && full_read(fd, head, sizeof head) && memcmp(head, BLOB_MAGIC, 8) == 0 &&
      memcmp(head + 8, key, 32) == 0 && full_read(fd, sz, 8)) {
    for (i = 7; i >= 0; i--) len = len << 8 | sz[i];
    if (len + 56 == (uint64_t)st.st_size && (buf = malloc((size_t)len + 1)) &&
        full_read(fd, buf, (size_t)len) && full_read(fd, sum, 8)) {
      want = XXH64(buf, (size_t)len, 0);
      ok = 1;
      for (i = 0; i < 8; i++) ok &= sum[i] == (unsigned char)(want >> (8 * i));
    }
  }
  if (ok) futimens(fd, NULL);
  if (fd >= 0) close(fd);
  if (!ok) {
    free(buf);
    cdisk_discard(path);       /* corrupt or foreign: rebuilt by the caller */
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

static int full_write(int fd, const void *buf, size_t n) {
  size_t put = 0;
  while (put < n) {
    ssize_t r = write(fd, (const char *)buf + put, n - put);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return 0;
    put += (size_t)r;
  }
  return 1;
}

int cache_put_blob(const char *key, const char *ext, const void *data, size_t n, fl_err *e) {
  char path[1200], tmp[1300], cd[1024];
  unsigned char sz[8], sum[8];
  uint64_t h = XXH64(data, n, 0);
  int i, bad, fd, rc;
  if ((rc = get_dir(cd, sizeof cd, e)) != FL_OK) return rc;
  snprintf(path, sizeof path, "%s/%s.%s", cd, key, ext);
  snprintf(tmp, sizeof tmp, "%s/tmp-%ld-XXXXXX", cd, (long)getpid());
  for (i = 0; i < 8; i++) {
    sz[i] = (unsigned char)((uint64_t)n >> (8 * i));
    sum[i] = (unsigned char)(h >> (8 * i));
  }
  if ((fd = mkostemp(tmp, O_CLOEXEC)) < 0)     /* O_CREAT|O_EXCL: never through a link */
    return err_set(e, FL_EIO, "cache: cannot create a temp file in %s: %s", cd, strerror(errno));
  bad = !full_write(fd, BLOB_MAGIC, 8) || !full_write(fd, key, 32) || !full_write(fd, sz, 8) ||
        !full_write(fd, data, n) || !full_write(fd, sum, 8) || fchmod(fd, 0600) != 0;
  bad |= close(fd) != 0;
  if (bad || rename(tmp, path) != 0) {
    unlink(tmp);
    return err_set(e, FL_EIO, "cache: cannot write %s", path);
  }
  rc = cdisk_evict(cd, cdisk_cap(), key);
  pthread_mutex_lock(&lock);
  n_evict += rc;
  pthread_mutex_unlock(&lock);
  return FL_OK;
}

int cache_get_blob_shared(const char *key, const char *ext, void **data, size_t *n, int *how) {
  char name[64];
  *how = CACHE_DISK;
  if (cache_get_blob(key, ext, data, n)) return 1;
  snprintf(name, sizeof name, "%.32s.%.20s", key, ext);
  if (!crem_get(name, data, n)) return 0;
  /* the signature held; the caller unpacks and checks the image itself */
  crem_verdict(name, NULL);
  (void)cache_put_blob(key, ext, *data, *n, NULL);
  *how = CACHE_REMOTE;
  if (debug_level() >= 1) fprintf(stderr, "fuselab: kernel cache hit (remote) %s\n", name);
  return 1;
}

int cache_put_blob_shared(const char *key, const char *ext, const void *data, size_t n, fl_err *e) {
  char name[64];
  int rc = cache_put_blob(key, ext, data, n, e);
  snprintf(name, sizeof name, "%.32s.%.20s", key, ext);
  crem_put(name, data, n);
  return rc;
}

int cache_clear_blobs(const char *ext) {
  DIR *d;
  struct dirent *de;
  char cd[1024];
  int count = 0;
  if (get_dir(cd, sizeof cd, NULL) != FL_OK || !(d = opendir(cd))) return 0;
  while ((de = readdir(d))) {
    char p[1400];
    if (!cdisk_entry_name(de->d_name, ext)) continue;
    snprintf(p, sizeof p, "%s/%s", cd, de->d_name);
    if (unlink(p) == 0) count++;
  }
  closedir(d);
  return count;
}

void cache_count_blobs(const char *ext, int64_t *entries, int64_t *bytes) {
  char cd[1024];
  *entries = *bytes = 0;
  if (get_dir(cd, sizeof cd, NULL) == FL_OK) count_entries(cd, ext, entries, bytes);
}
