/*
** cache.h -- compiled kernels on disk and in memory (DESIGN §4).
** Key: XXH3-128 of the source, the compiler, its flags, the target it
** really builds for (what -march=native expands to, cache_target), the
** machine and the fuselab version.  Disk entries are <key>.so in the cache
** directory ($FUSELAB_CACHE_DIR, else $XDG_CACHE_HOME/fuselab, else
** ~/.cache/fuselab, else the password database's home; what it creates is
** mode 0700).  Trusted like ssh's ~/.ssh: a directory not owned by the user
** or writable by group/others is refused and a private temp directory
** stands in (cache_warning).  An entry is used only when it is a regular
** file owned by the user, not writable by others, whose appended seal
** names its key and checksums every byte, all checked before it is
** loaded, and what loads is the file that was checked.  Compiles run in a
** private temp directory under $FUSELAB_COMPILE_TIMEOUT seconds (default
** 120) and are renamed into place whole; the directory is kept under
** $FUSELAB_CACHE_MAX_MB (default 2048), least recently used first.  Loaded
** objects are shared while some program holds them, so asking again for a
** held source costs a hash; the last release unloads.  Between disk and
** compiler sits the team's shared cache on Redis when
** $FUSELAB_REMOTE_CACHE is set (cache_remote.h): an entry from there is
** written to disk as a sealed entry and loaded by the same checks; what
** is compiled is sent there.
*/
#ifndef FL_EXEC_CACHE_H
#define FL_EXEC_CACHE_H

#include <stdint.h>

#include "../graph/err.h"

/* A loaded shared object, counted: every holder releases it. */
typedef struct cache_obj cache_obj;

enum { CACHE_COMPILED = 0, CACHE_DISK = 1, CACHE_MEMORY = 2, CACHE_REMOTE = 3 };

typedef struct cache_info {
  char dir[1024];        /* the directory in use */
  int64_t entries;       /* compiled objects on disk */
  int64_t bytes;         /* their size */
  int64_t hits;          /* requests served from memory */
  int64_t disk_hits;     /* requests served from disk */
  int64_t misses;        /* requests that ran the compiler */
  int64_t failures;      /* compiler runs that failed (timeouts included) */
  int64_t timeouts;      /* compiler runs killed at FUSELAB_COMPILE_TIMEOUT */
  int64_t evictions;     /* keys removed to stay under the size cap */
  int64_t loaded;        /* objects in memory that requests can find */
  int64_t max_bytes;     /* the size cap */
  /* the shared cache (cache_remote.h); all zero when not configured */
  struct {
    int configured;      /* FUSELAB_REMOTE_CACHE is set */
    int enabled;         /* on, and no failure so far */
    char url[512];       /* without its password */
    char why[600];       /* configured but not enabled: why */
    int64_t hits;        /* requests served from Redis */
    int64_t misses;      /* asked, absent */
    int64_t writes;      /* compiled objects stored */
    int64_t rejected;    /* entries refused (signature, size, seal) */
    int64_t errors;      /* failures that turned it off (at most 1) */
  } remote;
} cache_info;

/* Compile source (or find it) and load it.  A compiler that runs past the
** timeout is killed: FL_ECOMPILE naming the timeout (the log says so too);
** Ctrl-C (fl_interrupt, graph/err.h) stops it as well: FL_EINTR.  On success *out is a new
** reference the caller releases with cache_release, *how says where it came
** from.  On FL_ECOMPILE, *log (when log is not NULL) is the compiler's
** output, malloc'd and owned by the caller; also on success when it
** compiled (warnings).  Thread-safe. */
int cache_load(const char *source, cache_obj **out, char **log, int *how,
               fl_err *e);
/* The same for source = head + units[0] + ... + units[nunits-1] (same
** key): on a miss the units are compiled as separate translation units,
** each after head, on as many compiler processes at once as there are CPUs
** (up to 8), and linked into one object.  A unit must not refer to a
** static in another unit. */
int cache_load_units(const char *head, const char *const *units, int nunits, cache_obj **out,
                     char **log, int *how, fl_err *e);
/* fn (or NULL) is called once per compile while the compiler links its
** parts (or compiles its only part): work a program's first run would do
** anyway, done while a core would otherwise idle. */
void cache_while_linking(void (*fn)(void));
/* Address of a symbol in the object, NULL when absent. */
void *cache_sym(cache_obj *o, const char *name);
cache_obj *cache_retain(cache_obj *o);
/* Drops one reference; the object is unloaded with the last.  NULL ok. */
void cache_release(cache_obj *o);

/* The compiler command ($CC, else the configured default) and flags
** (GCC's one more than another compiler's: exec/cache.c). */
const char *cache_compiler(void);
const char *cache_flags(void);
/* The target flags the compiler reports for cache_flags on this host
** (GCC: -march=<cpu> -m<feature>...; Clang: target-cpu=, +<feature>...;
** else a hash of the CPU's feature list); never "native". */
const char *cache_target(void);

int cache_get_info(cache_info *out, fl_err *e);
/* Remove fuselab's entries from disk (<key>.so, <key>.c, blobs that carry
** their key; other files stay) and temp directories of processes that are
** gone and older than the compile timeout, and forget the loaded objects
** (those still held by programs stay loaded until released). */
int cache_clear(fl_err *e);
/* Forget loaded objects only: the next request goes to disk, as a new
** process would. */
void cache_forget_memory(void);
/* Non-NULL when the cache directory could not be used and a private temp
** directory stands in (the text says which and why); shown once by
** callers. */
const char *cache_warning(void);
/* Re-read the environment for the directory (tests change it). */
void cache_reset_dir(void);

/* --- blobs: compiled images of other compilers (NVRTC's PTX/CUBIN) ------
** Same directory, same rules: the caller's key covers what made the blob
** (source, compiler, flags, architecture, fuselab version); the file
** <key>.<ext> carries the key and a checksum and is written to a temp file
** created exclusively and renamed; it is read only when a regular file
** owned by the user, not writable by others; a corrupt or foreign one is
** deleted and counts as absent. */
/* XXH3-128 over the NUL-terminated parts and the fuselab version. */
void cache_blob_key(const char *const *parts, int nparts, char hex[33]);
/* 1 and *data (malloc'd, the caller frees) when present and whole, else 0. */
int cache_get_blob(const char *key, const char *ext, void **data, size_t *n);
int cache_put_blob(const char *key, const char *ext, const void *data, size_t n, fl_err *e);
/* The same through the team's shared cache too (FUSELAB_REMOTE_CACHE,
** Redis name "<key>.<ext>"): a blob missing on disk is asked of Redis,
** checked (signed, cache_remote.h) and written to disk; *how is
** CACHE_DISK or CACHE_REMOTE.  put stores it on disk and in Redis. */
int cache_get_blob_shared(const char *key, const char *ext, void **data, size_t *n, int *how);
int cache_put_blob_shared(const char *key, const char *ext, const void *data, size_t n, fl_err *e);
/* Remove every <key>.<ext> blob; the count removed. */
int cache_clear_blobs(const char *ext);
/* Number and bytes of <key>.<ext> blobs on disk. */
void cache_count_blobs(const char *ext, int64_t *entries, int64_t *bytes);

#endif
