/*
** file.c -- reading and replacing files without surprises.
**
** Invariants: a reader never opens anything but a regular file (stat
** first, then open with O_NONBLOCK so that a FIFO swapped in between
** cannot block, then fstat again); a writer never opens the path it
** replaces -- it creates a fresh temp file beside the target with
** O_CREAT|O_EXCL|O_NOFOLLOW (so a name planted in advance, symlink or
** not, is skipped, never written through) and renames it over the target
** only when every byte is written, and only while the target is still a
** regular file or absent.
*/
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <time.h>
#include <unistd.h>

#include "file.h"

/* Symlinks followed before giving up, as the kernel's own limit. */
#define MAX_LINKS 40

/* What a non-regular file is, for "<path>: is a FIFO (named pipe)...". */
static const char *kind_of(mode_t m) {
  if (S_ISDIR(m)) return "a directory";
  if (S_ISFIFO(m)) return "a FIFO (named pipe)";
  if (S_ISCHR(m)) return "a character device";
  if (S_ISBLK(m)) return "a block device";
  if (S_ISSOCK(m)) return "a socket";
  if (S_ISLNK(m)) return "a symbolic link";
  return "not a regular file";
}

/* "<path>: " in front of a message: the path escaped, since it may come
** from a file or hold anything a user typed. */
static int path_err(fl_err *e, int code, const char *path, const char *why) {
  char q[512];
  return err_set(e, code, "%s: %s", err_quote(path, q, sizeof q), why);
}

static int not_regular(fl_err *e, const char *path, mode_t m, const char *doing) {
  char why[160];
  snprintf(why, sizeof why, "is %s, not a regular file (%s)", kind_of(m), doing);
  return path_err(e, FL_EIO, path, why);
}

int file_open_read(const char *path, int *fd, uint64_t *size, fl_err *e) {
  struct stat st;
  int f, flags;
  *fd = -1;
  *size = 0;
  if (!path || !path[0]) return err_set(e, FL_EINVAL, "no file name given");
  /* stat before open: opening a device can have effects of its own */
  if (stat(path, &st) != 0) return path_err(e, FL_EIO, path, strerror(errno));
  if (!S_ISREG(st.st_mode)) return not_regular(e, path, st.st_mode, "only files are read");
  if ((f = open(path, O_RDONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC)) < 0)
    return path_err(e, FL_EIO, path, strerror(errno));
  if (fstat(f, &st) != 0) {
    int err = errno;
    close(f);
    return path_err(e, FL_EIO, path, strerror(err));
  }
  if (!S_ISREG(st.st_mode)) {   /* swapped since the stat */
    close(f);
    return not_regular(e, path, st.st_mode, "only files are read");
  }
  if ((flags = fcntl(f, F_GETFL)) != -1) (void)fcntl(f, F_SETFL, flags & ~O_NONBLOCK);
  *fd = f;
  *size = (uint64_t)st.st_size;
  return FL_OK;
}

int file_read_all(const char *path, uint64_t max, char **buf, size_t *n, fl_err *e) {
  int fd, rc;
  uint64_t size, got = 0;
  char *b;
  *buf = NULL;
  *n = 0;
  if ((rc = file_open_read(path, &fd, &size, e)) != FL_OK) return rc;
  if (size > max) {
    char why[128];
    close(fd);
    snprintf(why, sizeof why, "%llu bytes, more than the %llu read for this kind of file",
             (unsigned long long)size, (unsigned long long)max);
    return path_err(e, FL_EFORMAT, path, why);
  }
  if (!(b = malloc((size_t)size + 1))) {
    close(fd);
    return err_set(e, FL_ENOMEM, "out of memory reading %llu bytes", (unsigned long long)size);
  }
  while (got < size) {
    ssize_t r = read(fd, b + got, (size_t)(size - got));
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) {   /* shrunk while read, or an I/O error */
      int err = r < 0 ? errno : EIO;
      close(fd);
      free(b);
      return path_err(e, FL_EIO, path, r < 0 ? strerror(err) : "shorter than its size (changed while read)");
    }
    got += (uint64_t)r;
  }
  close(fd);
  b[size] = 0;
  *buf = b;
  *n = (size_t)size;
  return FL_OK;
}

/* The directory part of p with its slash ("a/b" -> "a/", "/b" -> "/"),
** "" when p has none: what a name in p's directory is appended to. */
static char *dir_prefix(const char *p) {
  const char *slash = strrchr(p, '/');
  return strndup(p, slash ? (size_t)(slash - p + 1) : 0);
}

/* prefix + name as a new string. */
static char *concat(const char *prefix, const char *name) {
  size_t a = strlen(prefix), b = strlen(name);
  char *s = malloc(a + b + 1);
  if (!s) return NULL;
  memcpy(s, prefix, a);
  memcpy(s + a, name, b + 1);
  return s;
}

/* The target of symlink `link`, a relative one taken from the link's
** directory. */
static char *read_link(const char *link, const char *path, fl_err *e) {
  size_t cap = 256;
  for (;;) {
    char *buf = malloc(cap), *dir, *out;
    ssize_t n;
    if (!buf) { err_set(e, FL_ENOMEM, "out of memory (a link of %zu bytes)", cap); return NULL; }
    if ((n = readlink(link, buf, cap)) < 0) {
      path_err(e, FL_EIO, path, strerror(errno));
      free(buf);
      return NULL;
    }
    if ((size_t)n < cap) {
      buf[n] = '\0';
      dir = buf[0] == '/' ? strdup("") : dir_prefix(link);
      out = dir ? concat(dir, buf) : NULL;
      free(dir);
      free(buf);
      if (!out) err_set(e, FL_ENOMEM, "out of memory (a link target)");
      return out;
    }
    free(buf);
    if (cap > 1 << 20) { path_err(e, FL_EIO, path, strerror(ENAMETOOLONG)); return NULL; }
    cap *= 2;
  }
}

/* Follow path's symlinks to what a write should replace; *st and *exists
** describe it.  A link another user owns in a sticky, world-writable
** directory (/tmp) is not followed, as the kernel refuses it to open()
** (fs.protected_symlinks): it is the way to make someone overwrite their
** own files. */
static char *resolve(const char *path, struct stat *st, int *exists, fl_err *e) {
  char *cur = strdup(path);
  if (!cur) { err_set(e, FL_ENOMEM, "out of memory (a path)"); return NULL; }
  for (int hops = 0;; hops++) {
    char *next;
    struct stat dir;
    if (lstat(cur, st) != 0) {
      if (errno == ENOENT) { *exists = 0; return cur; }
      path_err(e, FL_EIO, path, strerror(errno));
      free(cur);
      return NULL;
    }
    if (!S_ISLNK(st->st_mode)) { *exists = 1; return cur; }
    if (hops == MAX_LINKS) {
      path_err(e, FL_EIO, path, strerror(ELOOP));
      free(cur);
      return NULL;
    }
    {
      char *d = dir_prefix(cur);
      int ok = d && stat(d[0] ? d : ".", &dir) == 0;
      free(d);
      if (ok && (dir.st_mode & S_ISVTX) && (dir.st_mode & S_IWOTH) &&
          st->st_uid != geteuid() && st->st_uid != dir.st_uid) {
        path_err(e, FL_EIO, path, "is a symbolic link another user owns in a shared "
                 "sticky directory; not following it");
        free(cur);
        return NULL;
      }
    }
    next = read_link(cur, path, e);
    free(cur);
    if (!next) return NULL;
    cur = next;
  }
}

int file_create(file_out *w, const char *path, fl_err *e) {
  static unsigned counter;
  struct stat st;
  int exists = 0;
  size_t tlen;
  mode_t mode = 0;
  char *dir;
  const char *base;

  memset(w, 0, sizeof *w);
  w->fd = -1;
  if (!path || !path[0]) return err_set(e, FL_EINVAL, "no file name given");
  if (!(w->path = strdup(path))) return err_set(e, FL_ENOMEM, "out of memory (a path)");
  if (!(w->target = resolve(path, &st, &exists, e))) goto fail;
  if (exists) {
    if (!S_ISREG(st.st_mode)) {
      not_regular(e, path, st.st_mode, "refusing to replace it");
      goto fail;
    }
    /* replacing needs only the directory's permission; ask for the file's
    ** too, as writing into it would (root passes, as it would there) */
    if (faccessat(AT_FDCWD, w->target, W_OK, AT_EACCESS) != 0) {
      path_err(e, FL_EIO, path, strerror(errno));
      goto fail;
    }
    /* setuid/setgid bits are dropped, as any write by a non-owner does */
    mode = st.st_mode & 0777;
  }
  /* ".<name>.tmp.<pid>.<n>.<x>" beside the target (the name cut to 100
  ** bytes, so a long one still fits NAME_MAX) */
  dir = dir_prefix(w->target);
  base = strrchr(w->target, '/') ? strrchr(w->target, '/') + 1 : w->target;
  tlen = (dir ? strlen(dir) : 0) + 100 + 64;
  if (!dir || !(w->tmp = malloc(tlen))) {
    free(dir);
    err_set(e, FL_ENOMEM, "out of memory (a path)");
    goto fail;
  }
  /* a fresh, hard to guess name each try; O_EXCL|O_NOFOLLOW skip over
  ** anything already there, a planted symlink included */
  for (int tries = 0; tries < 100; tries++) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    snprintf(w->tmp, tlen, "%s.%.100s.tmp.%ld.%u.%lx", dir, base, (long)getpid(), counter++,
             (unsigned long)ts.tv_nsec * 2654435761u + (unsigned long)tries);
    w->fd = open(w->tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0666);
    if (w->fd >= 0 || errno != EEXIST) break;
  }
  free(dir);
  if (w->fd < 0) {
    path_err(e, FL_EIO, path, strerror(errno));
    free(w->tmp);
    w->tmp = NULL;
    goto fail;
  }
  if (exists) {
    /* keep the owner and group where we may (root, or a group we are in);
    ** where the group cannot be kept, ours gets no more than others had */
    if ((st.st_uid != geteuid() || st.st_gid != getegid()) &&
        fchown(w->fd, st.st_uid, st.st_gid) != 0 &&
        fchown(w->fd, (uid_t)-1, st.st_gid) != 0)
      mode = (mode & ~(mode_t)S_IRWXG) | ((mode & S_IRWXO) << 3);
    if (fchmod(w->fd, mode) != 0) {
      path_err(e, FL_EIO, path, strerror(errno));
      file_abort(w);
      return FL_EIO;
    }
  }
  return FL_OK;
fail:
  free(w->path);
  free(w->target);
  memset(w, 0, sizeof *w);
  w->fd = -1;
  return e ? e->code : FL_EIO;
}

int file_write_fd(int fd, const void *buf, size_t n) {
  const char *p = buf;
  while (n > 0) {
    ssize_t k = write(fd, p, n);
    if (k < 0) {
      if (errno == EINTR) continue;
      return -1;
    }
    p += k;
    n -= (size_t)k;
  }
  return 0;
}

int file_write(file_out *w, const void *buf, size_t n, fl_err *e) {
  char why[160];
  if (file_write_fd(w->fd, buf, n) == 0) return FL_OK;
  snprintf(why, sizeof why, "write failed: %s", strerror(errno));
  return path_err(e, FL_EIO, w->path, why);
}

static void release(file_out *w) {
  free(w->path);
  free(w->target);
  free(w->tmp);
  memset(w, 0, sizeof *w);
  w->fd = -1;
}

int file_commit(file_out *w, fl_err *e) {
  struct stat st;
  char why[160];
  int rc = FL_OK;
  if (close(w->fd) != 0) {
    snprintf(why, sizeof why, "write failed: %s", strerror(errno));
    rc = path_err(e, FL_EIO, w->path, why);
  }
  w->fd = -1;
  /* what is there may have changed while we wrote: look once more */
  if (rc == FL_OK && lstat(w->target, &st) == 0 && !S_ISREG(st.st_mode))
    rc = not_regular(e, w->path, st.st_mode, "refusing to replace it");
  if (rc == FL_OK && rename(w->tmp, w->target) != 0)
    rc = path_err(e, FL_EIO, w->path, strerror(errno));
  if (rc != FL_OK) unlink(w->tmp);
  release(w);
  return rc;
}

void file_abort(file_out *w) {
  if (!w) return;
  if (w->fd >= 0) close(w->fd);
  if (w->tmp) unlink(w->tmp);
  release(w);
}
