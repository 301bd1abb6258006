/*
** cache_remote.h -- the shared tier of the kernel cache: Redis (DESIGN §4
** "remote cache").  $FUSELAB_REMOTE_CACHE=redis://[:password@]host[:port][/db]
** turns it on; cache.c asks it after a disk miss and gives it what it
** compiled.  An entry is code that will run on every machine that takes
** it, so each one is signed: the value of Redis key "fuselab:<name>" is
**   "FLRC1", the name's length (1 byte), the name, the payload's length
**   (8 bytes, little endian), the payload, HMAC-SHA256(secret, name || payload)
** under the team's secret ($FUSELAB_REMOTE_CACHE_SECRET, else the file
** $FUSELAB_REMOTE_CACHE_SECRET_FILE: a regular file of the user's, mode
** 0600 or stricter).  Anything else is rejected, counted and warned about
** once.  Connects in at most 200 ms, every command is written and
** answered within 2 s in all (however the server trickles its bytes);
** any failure warns once and turns the remote off for the rest of the
** process: never a hang, never a failed compile.  Entries live
** $FUSELAB_REMOTE_CACHE_TTL seconds (default 30 days); one larger than
** $FUSELAB_REMOTE_CACHE_MAX_MB (default 64) is neither written nor read,
** and a reply larger than that is not received: reading stops at its
** header.  What the server says reaches warnings escaped.
** With the variable unset nothing here connects or allocates.  Internal to
** exec/; thread-safe.
*/
#ifndef FL_EXEC_CACHE_REMOTE_H
#define FL_EXEC_CACHE_REMOTE_H

#include <stddef.h>
#include <stdint.h>

typedef struct crem_info {
  int configured;        /* FUSELAB_REMOTE_CACHE is set */
  int enabled;           /* usable now (not off, not dead) */
  char url[512];         /* the URL, password left out */
  char why[600];         /* when configured but not enabled: why */
  int64_t hits, misses, writes, rejected, errors;
} crem_info;

/* 1 when the remote is configured and usable (reads the environment
** once; never connects). */
int crem_enabled(void);
/* 1 and *data (malloc'd, *n bytes; the caller frees) when Redis holds a
** valid entry for name; else 0 (absent, rejected, off or failed). */
int crem_get(const char *name, void **data, size_t *n);
/* Store data under name (best effort: failures are counted and warned). */
void crem_put(const char *name, const void *data, size_t n);
/* What became of an entry crem_get returned: why NULL, it was used (a
** hit); else its payload did not prove itself (cache.c's seal and key
** checks) and it is rejected like a bad signature. */
void crem_verdict(const char *name, const char *why);
void crem_get_info(crem_info *out);

#endif
