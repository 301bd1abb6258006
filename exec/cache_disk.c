/*
** cache_disk.c -- the cache's files and processes (cache_disk.h).
** Invariant: nothing in the cache directory is read, loaded or followed
** unless the user owns it and nobody else can write it; a file this code
** creates is created exclusively (O_EXCL, never through a symlink) or in a
** private directory it made itself; and no process it starts outlives its
** deadline.
*/
#include <dirent.h>
#include <dlfcn.h>
#include <elf.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <xxhash.h>

#include "../graph/env.h"
#include "../graph/err.h"
#include "cache_disk.h"
#include "exec/measure.h"

/* ---- trusting a directory ----------------------------------------------- */

static int dir_ok(const struct stat *st, const char *what, char *why, size_t n) {
  if (!S_ISDIR(st->st_mode)) { snprintf(why, n, "%s is not a directory", what); return 0; }
  if (st->st_uid != geteuid()) {
    snprintf(why, n, "%s is owned by uid %ld, not by you", what, (long)st->st_uid);
    return 0;
  }
  if (st->st_mode & (S_IWGRP | S_IWOTH)) {
    snprintf(why, n, "%s is writable by %s (mode %03o)", what,
             st->st_mode & S_IWOTH ? "others" : "its group", (unsigned)(st->st_mode & 0777));
    return 0;
  }
  return 1;
}

int cdisk_trusted_dir(const char *path, char *why, size_t n) {
  struct stat st;
  char real[4096], *slash;
  int link;
  if (lstat(path, &st) != 0) { snprintf(why, n, "%s", strerror(errno)); return 0; }
  if ((link = S_ISLNK(st.st_mode)) && stat(path, &st) != 0) {
    snprintf(why, n, "a symlink to nowhere: %s", strerror(errno));
    return 0;
  }
  if (!dir_ok(&st, link ? "its target" : "it", why, n)) return 0;
  /* a parent anyone may write (without the sticky bit) lets them swap the
  ** directory for their own */
  if (!realpath(path, real)) { snprintf(why, n, "%s", strerror(errno)); return 0; }
  if ((slash = strrchr(real, '/')) && slash != real) {
    *slash = '\0';
    if (stat(real, &st) == 0 && (st.st_mode & S_IWOTH) && !(st.st_mode & S_ISVTX)) {
      snprintf(why, n, "its parent %s is writable by others", real);
      return 0;
    }
  }
  return 1;
}

int cdisk_mkdirs(const char *path) {
  char tmp[4096];
  size_t i, n = strlen(path);
  if (n >= sizeof tmp) { errno = ENAMETOOLONG; return -1; }
  memcpy(tmp, path, n + 1);
  for (i = 1; i <= n; i++) {
    if (tmp[i] != '/' && tmp[i] != '\0') continue;
    tmp[i] = '\0';
    if (mkdir(tmp, 0700) != 0 && errno != EEXIST) return -1;
    tmp[i] = path[i];
  }
  return 0;
}

/* private directories made by this process, removed at exit */
static char privates[4][1024];
static int nprivate;

static void remove_privates(void) {
  int i;
  for (i = 0; i < nprivate; i++) {
    DIR *d = opendir(privates[i]);
    struct dirent *de;
    char p[1400];
    while (d && (de = readdir(d))) {
      if (de->d_name[0] == '.' && (!de->d_name[1] || (de->d_name[1] == '.' && !de->d_name[2])))
        continue;
      if (snprintf(p, sizeof p, "%s/%s", privates[i], de->d_name) >= (int)sizeof p) continue;
      if (strncmp(de->d_name, "tmp-", 4) == 0) cdisk_rmtmp(p);
      else unlink(p);
    }
    if (d) closedir(d);
    rmdir(privates[i]);
  }
}

int cdisk_private_dir(char *out, size_t n) {
  const char *t = getenv("TMPDIR");
  char tmpl[1024];
  snprintf(tmpl, sizeof tmpl, "%s/fuselab-cache-XXXXXX", t && t[0] == '/' ? t : "/tmp");
  if (!mkdtemp(tmpl)) {
    snprintf(tmpl, sizeof tmpl, "/tmp/fuselab-cache-XXXXXX");
    if (!mkdtemp(tmpl)) return -1;
  }
  snprintf(out, n, "%s", tmpl);
  if (nprivate < 4) {
    if (nprivate == 0) atexit(remove_privates);
    snprintf(privates[nprivate++], sizeof privates[0], "%s", tmpl);
  }
  return 0;
}

/* ---- entries --------------------------------------------------------------- */

int cdisk_open_entry(const char *path, struct stat *st) {
  struct stat l;
  int fd;
  if (lstat(path, &l) != 0) return errno == ENOENT ? -1 : -2;
  if (!S_ISREG(l.st_mode)) return -2;      /* FIFO, device, symlink: never opened */
  fd = open(path, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0 && (errno == EMFILE || errno == ENFILE || errno == ENOMEM)) return -3;
  if (fd < 0) return errno == ENOENT ? -1 : -2;
  if (fstat(fd, st) != 0 || !S_ISREG(st->st_mode) || st->st_dev != l.st_dev ||
      st->st_ino != l.st_ino || st->st_uid != geteuid() || (st->st_mode & (S_IWGRP | S_IWOTH))) {
    close(fd);
    return -2;
  }
  return fd;
}

void cdisk_discard(const char *path) {
  struct stat l;
  if (lstat(path, &l) == 0 && !S_ISDIR(l.st_mode)) unlink(path);
}

/* The seal: "FLSO0001", the 32-digit key, the object's length (8 bytes,
** little endian), the XXH64 of its bytes.  The loader ignores bytes past
** the section headers, so the sealed file still loads as it was. */
#define SEAL_MAGIC "FLSO0001"
#define SEAL_SIZE (8 + 32 + 8 + 8)

void cdisk_put64(unsigned char *p, uint64_t v) {
  int i;
  for (i = 0; i < 8; i++) p[i] = (unsigned char)(v >> (8 * i));
}

uint64_t cdisk_get64(const unsigned char *p) {
  uint64_t v = 0;
  int i;
  for (i = 7; i >= 0; i--) v = v << 8 | p[i];
  return v;
}

/* XXH64 of the first len bytes of fd, and its ELF header; -1 on a short read */
static int hash_prefix(int fd, uint64_t len, uint64_t *sum, Elf64_Ehdr *eh) {
  static const size_t chunk = 1 << 16;
  unsigned char *buf = malloc(chunk);
  XXH64_state_t *st = XXH64_createState();
  uint64_t at = 0;
  int rc = 0;
  if (!buf || !st) rc = -1;
  else XXH64_reset(st, 0);
  while (rc == 0 && at < len) {
    size_t want = len - at < chunk ? (size_t)(len - at) : chunk;
    ssize_t got = pread(fd, buf, want, (off_t)at);
    if (got <= 0) { if (got < 0 && errno == EINTR) continue; rc = -1; break; }
    if (at == 0) {
      if ((size_t)got < sizeof *eh) { rc = -1; break; }
      memcpy(eh, buf, sizeof *eh);
    }
    XXH64_update(st, buf, (size_t)got);
    at += (uint64_t)got;
  }
  if (rc == 0) *sum = XXH64_digest(st);
  free(buf);
  if (st) XXH64_freeState(st);
  return rc;
}

int cdisk_verify_so(int fd, const struct stat *st, const char *key) {
  unsigned char t[SEAL_SIZE];
  uint64_t len, sum;
  Elf64_Ehdr eh;
  if (st->st_size < (off_t)(SEAL_SIZE + sizeof eh)) return 0;
  if (pread(fd, t, SEAL_SIZE, st->st_size - SEAL_SIZE) != SEAL_SIZE) return 0;
  if (memcmp(t, SEAL_MAGIC, 8) != 0 || memcmp(t + 8, key, 32) != 0) return 0;
  len = cdisk_get64(t + 40);
  if (len != (uint64_t)st->st_size - SEAL_SIZE) return 0;
  if (hash_prefix(fd, len, &sum, &eh) != 0 || sum != cdisk_get64(t + 48)) return 0;
  return memcmp(eh.e_ident, ELFMAG, SELFMAG) == 0 &&
         (uint64_t)eh.e_shoff + (uint64_t)eh.e_shnum * eh.e_shentsize <= len;
}

int cdisk_seal_so(const char *path, const char *key) {
  unsigned char t[SEAL_SIZE];
  struct stat st;
  uint64_t sum;
  Elf64_Ehdr eh;
  int fd = open(path, O_RDWR | O_NOFOLLOW | O_CLOEXEC), rc = -1;
  if (fd < 0) return -1;
  if (fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && st.st_uid == geteuid() &&
      hash_prefix(fd, (uint64_t)st.st_size, &sum, &eh) == 0 &&
      memcmp(eh.e_ident, ELFMAG, SELFMAG) == 0) {
    memcpy(t, SEAL_MAGIC, 8);
    memcpy(t + 8, key, 32);
    cdisk_put64(t + 40, (uint64_t)st.st_size);
    cdisk_put64(t + 48, sum);
    if (pwrite(fd, t, SEAL_SIZE, st.st_size) == SEAL_SIZE && fchmod(fd, 0700) == 0) rc = 0;
  }
  if (close(fd) != 0) rc = -1;
  return rc;
}

int cdisk_out_of_fds(void) {
  int fd = open("/", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd >= 0) {
    close(fd);
    return 0;
  }
  return errno == EMFILE || errno == ENFILE ? errno : 0;
}

void *cdisk_dlopen_fd(int fd, const char *dir, const char *key, int *held) {
  static unsigned long loads;     /* makes every name new */
  char proc[64], tmp[1200], name[1300];
  void *h;
  int err;
  snprintf(proc, sizeof proc, "/proc/self/fd/%d", fd);
  *held = 0;
  if (dir && cdisk_tmpdir(dir, tmp, sizeof tmp) == 0) {
    snprintf(name, sizeof name, "%s/%lu-%.32s.so", tmp, __atomic_fetch_add(&loads, 1, __ATOMIC_RELAXED), key);
    /* AT_SYMLINK_FOLLOW: a link to the open file itself, never to
    ** whatever its path names now */
    if (linkat(AT_FDCWD, proc, AT_FDCWD, name, AT_SYMLINK_FOLLOW) == 0) {
      h = dlopen(name, RTLD_NOW | RTLD_LOCAL);
      err = errno;
      unlink(name);
      rmdir(tmp);
      errno = err;
      return h;
    }
    rmdir(tmp);
  }
  *held = 1;
  return dlopen(proc, RTLD_NOW | RTLD_LOCAL);
}

/* ---- temp files -------------------------------------------------------- */

int cdisk_create(const char *path) {
  return open(path, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
}

int cdisk_tmpdir(const char *dir, char *out, size_t n) {
  char t[1200];
  snprintf(t, sizeof t, "%s/tmp-%ld-XXXXXX", dir, (long)getpid());
  if (!mkdtemp(t)) return -1;
  snprintf(out, n, "%s", t);
  return 0;
}

void cdisk_rmtmp(const char *tmp) {
  DIR *d = opendir(tmp);
  struct dirent *de;
  char p[1400];
  struct stat st;
  if (!d) { unlink(tmp); return; }      /* a temp file, not a directory */
  while ((de = readdir(d))) {
    snprintf(p, sizeof p, "%s/%s", tmp, de->d_name);
    if (lstat(p, &st) == 0 && !S_ISDIR(st.st_mode)) unlink(p);
  }
  closedir(d);
  rmdir(tmp);
}

int cdisk_stale_tmp(const char *dir, const char *name, double timeout) {
  char p[1400], *end;
  struct stat st;
  long pid;
  if (strncmp(name, "tmp-", 4) != 0) return 0;
  pid = strtol(name + 4, &end, 10);
  if (end == name + 4 || *end != '-' || strlen(end + 1) != 6 || pid <= 0) return 0;
  snprintf(p, sizeof p, "%s/%s", dir, name);
  if (lstat(p, &st) != 0 || st.st_uid != geteuid() || !(S_ISDIR(st.st_mode) || S_ISREG(st.st_mode)))
    return 0;
  if (difftime(time(NULL), st.st_mtime) <= timeout) return 0;
  /* still running (maybe with a longer timeout of its own): not ours to touch */
  if ((pid_t)pid == getpid() || kill((pid_t)pid, 0) == 0 || errno == EPERM) return 0;
  return 1;
}

int cdisk_entry_name(const char *name, const char *ext) {
  int i;
  for (i = 0; i < 32; i++)
    if (!((name[i] >= '0' && name[i] <= '9') || (name[i] >= 'a' && name[i] <= 'f'))) return 0;
  if (name[32] != '.' || !name[33]) return 0;
  if (ext) return strcmp(name + 33, ext) == 0;
  for (i = 33; name[i]; i++)
    if (!((name[i] >= 'a' && name[i] <= 'z') || (name[i] >= '0' && name[i] <= '9') || name[i] == '.'))
      return 0;
  return 1;
}

/* ---- processes under a deadline ------------------------------------------ */

double cdisk_timeout(void) {
  return env_number("FUSELAB_COMPILE_TIMEOUT", 120, 1e6, ENV_ABOVE_ZERO, "seconds");
}

pid_t cdisk_spawn(const char *cmd, int out_fd) {
  extern char **environ;
  char *argv[] = {"sh", "-c", (char *)cmd, NULL};
  posix_spawn_file_actions_t fa;
  posix_spawnattr_t at;
  sigset_t none;
  pid_t pid;
  int rc;
  posix_spawn_file_actions_init(&fa);
  posix_spawnattr_init(&at);
  posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
  if (out_fd >= 0) {
    posix_spawn_file_actions_adddup2(&fa, out_fd, 1);
    posix_spawn_file_actions_adddup2(&fa, out_fd, 2);
  }
  /* its own process group, so a timeout kills the compiler's children too */
  sigemptyset(&none);
  posix_spawnattr_setflags(&at, POSIX_SPAWN_SETPGROUP | POSIX_SPAWN_SETSIGMASK);
  posix_spawnattr_setpgroup(&at, 0);
  posix_spawnattr_setsigmask(&at, &none);
  rc = posix_spawn(&pid, "/bin/sh", &fa, &at, argv, environ);
  posix_spawn_file_actions_destroy(&fa);
  posix_spawnattr_destroy(&at);
  return rc == 0 ? pid : -1;
}

static void note_draw(cdisk_note *note) {
  double now = meas_now();
  const char *off = getenv("FUSELAB_PROGRESS");
  if (!note || now - note->t0 < 1.0 || now - note->drawn < 0.25) return;
  if ((off && strcmp(off, "0") == 0) || !isatty(2)) return;
  fprintf(stderr, "\r%s: %.1f s", note->what, now - note->t0);
  fflush(stderr);
  note->drawn = now;
  note->shown = 1;
}

void cdisk_note_done(cdisk_note *note) {
  if (note && note->shown) {
    fputs("\r\033[K", stderr);
    fflush(stderr);
    note->shown = 0;
  }
}

int cdisk_wait(const pid_t *pids, int n, int *ok, double deadline, cdisk_note *note) {
  int left = 0, i, st, why = CDISK_DONE;
  long nap = 200000;                   /* ns, doubling to 5 ms */
  int done[64];
  if (n > 64) n = 64;
  for (i = 0; i < n; i++) {
    ok[i] = 0;
    done[i] = pids[i] < 0;
    left += !done[i];
  }
  while (left > 0) {
    for (i = 0; i < n; i++) {
      pid_t r;
      if (done[i]) continue;
      r = waitpid(pids[i], &st, WNOHANG);
      if (r == pids[i] || (r < 0 && errno != EINTR)) {
        done[i] = 1;
        left--;
        ok[i] = r == pids[i] && WIFEXITED(st) && WEXITSTATUS(st) == 0;
      }
    }
    if (left == 0) break;
    if (fl_interrupt) why = CDISK_INTR;
    else if (meas_now() >= deadline) why = CDISK_TIMEOUT;
    if (why != CDISK_DONE) {
      for (i = 0; i < n; i++)
        if (!done[i]) {
          kill(-pids[i], SIGKILL);
          kill(pids[i], SIGKILL);
          while (waitpid(pids[i], &st, 0) < 0 && errno == EINTR) {}
        }
      return why;
    }
    {
      struct timespec ts = {0, nap};
      nanosleep(&ts, NULL);
      if (nap < 5000000) nap *= 2;
    }
    note_draw(note);
  }
  return CDISK_DONE;
}

int cdisk_capture(const char *cmd, char *buf, size_t n, double timeout) {
  int p[2], ok = 0, why;
  size_t got = 0;
  double deadline = meas_now() + timeout;
  pid_t pid;
  buf[0] = '\0';
  if (pipe2(p, O_CLOEXEC) != 0) return 0;
  pid = cdisk_spawn(cmd, p[1]);
  close(p[1]);
  if (pid < 0) { close(p[0]); return 0; }
  for (;;) {
    struct pollfd pf = {p[0], POLLIN, 0};
    int ms = (int)((deadline - meas_now()) * 1e3);
    ssize_t r;
    char sink[512];
    if (ms <= 0 || fl_interrupt) break;
    if (poll(&pf, 1, ms < 100 ? ms : 100) < 0 && errno != EINTR) break;
    if (!(pf.revents & (POLLIN | POLLHUP))) continue;
    if (got + 1 < n) r = read(p[0], buf + got, n - 1 - got);
    else r = read(p[0], sink, sizeof sink);    /* drained, so it does not block */
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) break;
    if (got + 1 < n) got += (size_t)r;
  }
  buf[got] = '\0';
  close(p[0]);
  why = cdisk_wait(&pid, 1, &ok, deadline, NULL);
  return why == CDISK_DONE && ok;
}

/* ---- the size cap ---------------------------------------------------------- */

int64_t cdisk_cap(void) {
  /* fractions are sizes too: 0.5 is 512 KiB (at least a byte) */
  double mb = env_number("FUSELAB_CACHE_MAX_MB", 2048, 1e9, ENV_ABOVE_ZERO, "megabytes");
  int64_t bytes = (int64_t)(mb * 1048576.0);
  return bytes > 0 ? bytes : 1;
}

typedef struct efile { char name[64]; int64_t size; time_t mtime; } efile;
typedef struct eunit { int first, last; int64_t size; time_t mtime; } eunit;

static int by_name(const void *a, const void *b) {
  return strcmp(((const efile *)a)->name, ((const efile *)b)->name);
}

static int by_age(const void *a, const void *b) {
  const eunit *x = a, *y = b;
  return x->mtime < y->mtime ? -1 : x->mtime > y->mtime;
}

int cdisk_evict(const char *dir, int64_t cap, const char *keep) {
  DIR *d = opendir(dir);
  struct dirent *de;
  efile *f = NULL;
  eunit *u = NULL;
  int nf = 0, cf = 0, nu = 0, i, removed = 0;
  int64_t total = 0;
  if (!d) return 0;
  while ((de = readdir(d))) {
    char p[1400];
    struct stat st;
    if (!cdisk_entry_name(de->d_name, NULL) || strlen(de->d_name) >= sizeof f->name) continue;
    snprintf(p, sizeof p, "%s/%s", dir, de->d_name);
    if (lstat(p, &st) != 0 || !S_ISREG(st.st_mode) || st.st_uid != geteuid()) continue;
    if (nf == cf) {
      efile *g = realloc(f, (size_t)(cf = cf ? 2 * cf : 64) * sizeof *f);
      if (!g) break;
      f = g;
    }
    snprintf(f[nf].name, sizeof f[nf].name, "%s", de->d_name);
    f[nf].size = (int64_t)st.st_blocks * 512 > st.st_size ? (int64_t)st.st_blocks * 512 : st.st_size;
    f[nf].mtime = st.st_mtime;
    total += f[nf++].size;
  }
  closedir(d);
  if (total <= cap || !nf || !(u = malloc((size_t)nf * sizeof *u))) goto out;
  /* one unit per key: its object, its source and blobs go together, as
  ** recent as the most recently used of them */
  qsort(f, (size_t)nf, sizeof *f, by_name);
  for (i = 0; i < nf; i++) {
    if (nu && strncmp(f[u[nu - 1].first].name, f[i].name, 32) == 0) {
      eunit *x = &u[nu - 1];
      x->last = i;
      x->size += f[i].size;
      if (f[i].mtime > x->mtime) x->mtime = f[i].mtime;
    } else {
      u[nu].first = u[nu].last = i;
      u[nu].size = f[i].size;
      u[nu++].mtime = f[i].mtime;
    }
  }
  qsort(u, (size_t)nu, sizeof *u, by_age);
  for (i = 0; i < nu && total > cap; i++) {
    int j;
    if (keep && strncmp(f[u[i].first].name, keep, 32) == 0) continue;
    for (j = u[i].first; j <= u[i].last; j++) {
      char p[1400];
      snprintf(p, sizeof p, "%s/%s", dir, f[j].name);
      unlink(p);
    }
    total -= u[i].size;
    removed++;
  }
out:
  free(f);
  free(u);
  return removed;
}
