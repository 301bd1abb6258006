/*
** file.h -- opening files safely: the one way fuselab reads a data file
** and the one way it writes one (fl.save, fl.save_weights, fl.draw,
** fl.report).
**
** Reading takes regular files only: a FIFO, device or directory is an
** error before anything blocks or is read, so `fl.load("/dev/zero")`
** fails at once instead of reading until memory runs out.
**
** Writing replaces a regular file atomically: the data goes to a new
** temp file beside it, which is renamed over it when complete, so a
** reader sees the old file or the new one, never half of one.  The new
** file keeps the old one's permission bits (and, where allowed, owner and
** group); a new path gets 0666 & ~umask, as open() would give it.  A
** symlink is followed and its target replaced (the link stays a link).
** Anything else at the path -- FIFO, device, directory, socket -- is
** refused: renaming over it would silently replace it with a regular
** file.
*/
#ifndef FL_FILE_H
#define FL_FILE_H

#include <stddef.h>
#include <stdint.h>

#include "err.h"

/* Open path for reading.  On success *fd is an open descriptor (blocking,
** close-on-exec) the caller closes and *size the file's size.  Messages
** read "<path>: <why>", the path escaped. */
int file_open_read(const char *path, int *fd, uint64_t *size, fl_err *e);

/* Read a whole regular file of at most max bytes into a new buffer (NUL
** appended, not counted in *n; free it).  A larger file is FL_EFORMAT
** naming the limit. */
int file_read_all(const char *path, uint64_t max, char **buf, size_t *n, fl_err *e);

/* A file being written in place of another. */
typedef struct file_out {
  int fd;         /* the temp file, open for writing; -1 when closed */
  char *path;     /* the path as given (for messages) */
  char *target;   /* what is replaced: path with its symlinks followed */
  char *tmp;      /* the temp file, in target's directory; NULL once gone */
} file_out;

/* Start writing path: check what is there and create the temp file.  On
** success the caller writes to w->fd (or with file_write) and ends with
** file_commit or file_abort; on failure nothing is left to free.
** Messages read "<path>: <why>". */
int file_create(file_out *w, const char *path, fl_err *e);

/* Write all n bytes of buf to w's temp file. */
int file_write(file_out *w, const void *buf, size_t n, fl_err *e);

/* Write all n bytes of buf to fd (again after EINTR): 0, or -1 with errno
** set, for writers that word their own messages. */
int file_write_fd(int fd, const void *buf, size_t n);

/* Close the temp file and rename it over the target.  w is released
** either way (after a failure the temp file is removed). */
int file_commit(file_out *w, fl_err *e);

/* Close and remove the temp file, leaving the target as it was; w is
** released.  Accepts a released w. */
void file_abort(file_out *w);

#endif
