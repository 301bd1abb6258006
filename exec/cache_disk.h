/*
** cache_disk.h -- the file-system half of the kernel cache (cache.c):
** which directory may be trusted, how an entry is opened and proved before
** anything in it runs, private temp directories, the compiler's processes
** under a deadline, the target the compiler really builds for, and the
** size cap.  Internal to exec/; callers use cache.h.
*/
#ifndef FL_EXEC_CACHE_DISK_H
#define FL_EXEC_CACHE_DISK_H

#include <stddef.h>
#include <stdint.h>
#include <sys/stat.h>
#include <sys/types.h>

/* 1 when path (after one symlink, whose target must pass too) is a
** directory owned by the user, writable by nobody else, in a parent that
** others cannot rename it out of; else 0 and why[] says what failed. */
int cdisk_trusted_dir(const char *path, char *why, size_t n);
/* mkdir -p, every directory it creates mode 0700; 0 or -1 (errno). */
int cdisk_mkdirs(const char *path);
/* A fresh private directory (mkdtemp, mode 0700) under $TMPDIR or /tmp;
** 0 or -1.  Removed with its entries when the process exits. */
int cdisk_private_dir(char *out, size_t n);

/* The regular file at path, owned by the user and writable by nobody
** else, opened O_RDONLY|O_NOFOLLOW|O_NONBLOCK|O_CLOEXEC (a FIFO or
** device is never opened, so nothing blocks): its fd, *st filled; -1 when
** nothing is there; -2 when something else is (see cdisk_discard); -3
** when it could not be opened for want of descriptors or memory (errno
** says which): nothing is known about it, so it must not be discarded. */
int cdisk_open_entry(const char *path, struct stat *st);
/* EMFILE or ENFILE when the process cannot open one more file now (its
** own limit, RLIMIT_NOFILE, or the system's), checked by opening one; 0
** when it can. */
int cdisk_out_of_fds(void);
/* Remove what is at path unless it is a directory (unlink never follows a
** symlink, so a planted link's target is untouched). */
void cdisk_discard(const char *path);
/* 1 when the open object file carries the seal for key: the trailer
** cdisk_seal_so appended, its length, and the checksum of every byte
** before it; the file is only read. */
int cdisk_verify_so(int fd, const struct stat *st, const char *key);
/* Append the seal for key to the object at path (the compiler's output in
** a private directory) and make it mode 0700; 0 or -1. */
int cdisk_seal_so(const char *path, const char *key);
/* 8 bytes little endian, as the seal and the remote entries store sizes. */
void cdisk_put64(unsigned char *p, uint64_t v);
uint64_t cdisk_get64(const unsigned char *p);
/* dlopen the very file behind fd (so what loads is what was verified);
** NULL on failure (errno and dlerror say why).  Through a hard link to it
** made from /proc/self/fd/N, under a name never used before in this
** process, in a private directory of dir (the file's own file system),
** removed once loaded: *held = 0, and fd may be closed at once.  The
** loader hands an object already loaded to whoever asks for its name, so
** a reused name would get a later request the wrong object.  Where no
** link can be made (the file has no name left, the file system has no
** links): by the name /proc/self/fd/N, *held = 1, and fd must stay open
** while the object may be loaded (cache.c keeps it). */
void *cdisk_dlopen_fd(int fd, const char *dir, const char *key, int *held);

/* Exclusive creation: O_CREAT|O_EXCL|O_NOFOLLOW, mode 0600; fd or -1. */
int cdisk_create(const char *path);
/* A private temp directory dir/tmp-<pid>-XXXXXX (mode 0700); 0 or -1. */
int cdisk_tmpdir(const char *dir, char *out, size_t n);
/* Remove a temp directory made by cdisk_tmpdir and the files in it. */
void cdisk_rmtmp(const char *tmp);
/* 1 when dir/name is fuselab's temp file or directory, left by a process
** that is gone, and older than timeout seconds. */
int cdisk_stale_tmp(const char *dir, const char *name, double timeout);
/* 1 when name is <32 hex digits>.<ext> (ext NULL: any extension). */
int cdisk_entry_name(const char *name, const char *ext);

/* $FUSELAB_COMPILE_TIMEOUT in seconds, fractions allowed (default 120;
** anything but a number above 0 is warned about, then the default). */
double cdisk_timeout(void);
/* Compilers being waited on are killed once fl_interrupt is set (the
** REPL's Ctrl-C: the compiler's own process group is out of the
** terminal's reach). */
/* `sh -c cmd` in its own process group, stdin /dev/null, stdout and
** stderr to out_fd when out_fd >= 0; its pid or -1. */
pid_t cdisk_spawn(const char *cmd, int out_fd);
enum { CDISK_DONE = 0, CDISK_TIMEOUT = 1, CDISK_INTR = 2 };
/* Wait for pids[0..n) (-1 entries count as failed) until deadline (a
** meas_now() time, exec/measure.h).  ok[i] = exited with status 0.  Past
** the deadline, or when interrupted, every process group still running is
** killed with SIGKILL and reaped.  A CDISK_ code.  note, when not NULL,
** is the progress line of a long wait (below). */
typedef struct cdisk_note cdisk_note;
int cdisk_wait(const pid_t *pids, int n, int *ok, double deadline, cdisk_note *note);
/* A compile that takes longer than a second says so on a terminal: one
** line on stderr ("compiling 12 kernels with cc: 2.5 s"), redrawn while
** the wait goes on and erased at cdisk_note_done.  Never into a log or a
** pipe (stderr must be a tty), and FUSELAB_PROGRESS=0 turns it off. */
struct cdisk_note { const char *what; double t0, drawn; int shown; };
void cdisk_note_done(cdisk_note *note);
/* Run cmd (as cdisk_spawn) and collect its output, at most n-1 bytes,
** NUL-terminated; 1 when it exited 0 within timeout seconds. */
int cdisk_capture(const char *cmd, char *buf, size_t n, double timeout);

/* $FUSELAB_CACHE_MAX_MB in bytes, fractions of a MB allowed (default
** 2048 MB; anything but a number above 0 is warned about, then the
** default). */
int64_t cdisk_cap(void);
/* While the entries in dir (files <key>.<ext> owned by the user) take more
** than cap bytes, remove the least recently used key's files, never those
** of keep; the number of keys removed. */
int cdisk_evict(const char *dir, int64_t cap, const char *keep);

#endif
