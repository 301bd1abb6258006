/*
** cache_remote.c -- compiled kernels shared through Redis (cache_remote.h).
** Invariant: a payload leaves crem_get only when its HMAC under the team's
** secret covers its name and every byte, compared in constant time; no
** call here blocks for longer than the connect timeout plus, for each
** command, one deadline over all its writes and reads; no reply is read
** past the size the command can rightly get (a bulk string longer than
** asked for, or a line past REPLY_LINE_MAX, ends the read at once); and
** no text from the server reaches a message unescaped.  After the first
** failure the remote is dead for the process.
**
** hiredis makes the connection (and its timeout); the commands are
** written and their replies read here, over its socket: hiredis 0.14
** (Debian 12) has no bound on what its reader takes in, and its timeout
** is per read, so a server trickling a byte a second held a call for as
** long as it liked.
*/
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#include "config.h"
#include "../graph/env.h"
#include "../graph/err.h"
#include "cache_remote.h"
#include "cache_disk.h"

#ifdef HAVE_HIREDIS
#include <hiredis/hiredis.h>
#include <openssl/core_names.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/params.h>
#include "exec/measure.h"
#endif

#define MAGIC "FLRC1"
#define MAC_LEN 32
#define TTL_DEFAULT (30LL * 24 * 3600)
#define CAP_DEFAULT_MB 64.0
#define CONNECT_US 200000
#define COMMAND_S 2.0
/* the longest status or error line, or bulk string header, read */
#define REPLY_LINE_MAX 4096

enum { UNREAD, OFF, ON, DEAD };

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static int state = UNREAD, configured;
static char url[512], why[600];
static int64_t n_hits, n_miss, n_writes, n_rejected, n_errors;

static void warn(const char *fmt, const char *a, const char *b) {
  fprintf(stderr, "fuselab: warning: remote cache ");
  fprintf(stderr, fmt, a, b);
  fputc('\n', stderr);
}

#ifdef HAVE_HIREDIS
static int warned_reject;
static redisContext *ctx;
static char host[256], password[256];
static int port = 6379, db;
static unsigned char secret[4096];
static size_t secret_len;
static long long ttl = TTL_DEFAULT;
static int64_t cap;

/* The secret from the environment, else from its file: which must be a
** regular file of the user's that nobody else can read (checked on the
** mode bits, so it holds for root too); 0 or -1 with why[] set. */
static int read_secret(void) {
  const char *s = getenv("FUSELAB_REMOTE_CACHE_SECRET"), *f = getenv("FUSELAB_REMOTE_CACHE_SECRET_FILE");
  struct stat st;
  ssize_t got;
  int fd;
  if (s && *s) {
    secret_len = strlen(s) < sizeof secret ? strlen(s) : sizeof secret;
    memcpy(secret, s, secret_len);
    return 0;
  }
  if (!(f && *f)) {
    snprintf(why, sizeof why, "no secret: set FUSELAB_REMOTE_CACHE_SECRET or "
             "FUSELAB_REMOTE_CACHE_SECRET_FILE (entries are signed code; unsigned ones are never run)");
    return -1;
  }
  if ((fd = open(f, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC)) < 0) {
    snprintf(why, sizeof why, "cannot read FUSELAB_REMOTE_CACHE_SECRET_FILE %.300s: %s", f, strerror(errno));
    return -1;
  }
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_uid != geteuid() || (st.st_mode & 077)) {
    snprintf(why, sizeof why, "FUSELAB_REMOTE_CACHE_SECRET_FILE %.300s refused: it must be a regular "
             "file owned by you with mode 0600 or stricter (it is %04o)", f, (unsigned)(st.st_mode & 07777));
    close(fd);
    return -1;
  }
  got = read(fd, secret, sizeof secret);
  close(fd);
  while (got > 0 && (secret[got - 1] == '\n' || secret[got - 1] == '\r' || secret[got - 1] == ' ')) got--;
  if (got <= 0) {
    snprintf(why, sizeof why, "FUSELAB_REMOTE_CACHE_SECRET_FILE %.300s is empty", f);
    return -1;
  }
  secret_len = (size_t)got;
  return 0;
}

/* redis://[:password@]host[:port][/db]; 0 or -1 with why[] set */
static int parse_url(const char *u) {
  const char *p = u + 8, *at, *end;
  size_t n;
  if (strncmp(u, "redis://", 8) != 0) {
    snprintf(why, sizeof why, "FUSELAB_REMOTE_CACHE is not a redis://[:password@]host[:port][/db] URL");
    return -1;
  }
  end = p + strcspn(p, "/");
  if ((at = memchr(p, '@', (size_t)(end - p)))) {
    const char *pw = memchr(p, ':', (size_t)(at - p));
    pw = pw ? pw + 1 : p;
    n = (size_t)(at - pw) < sizeof password ? (size_t)(at - pw) : sizeof password - 1;
    memcpy(password, pw, n);
    password[n] = '\0';
    p = at + 1;
  }
  n = strcspn(p, ":/");
  if (!n || n >= sizeof host) {
    snprintf(why, sizeof why, "FUSELAB_REMOTE_CACHE names no host");
    return -1;
  }
  memcpy(host, p, n);
  host[n] = '\0';
  p += n;
  if (*p == ':') {
    char *e;
    long v = strtol(p + 1, &e, 10);
    if (e == p + 1 || v <= 0 || v > 65535 || (*e && *e != '/')) {
      snprintf(why, sizeof why, "FUSELAB_REMOTE_CACHE has a bad port (expected 1-65535)");
      return -1;
    }
    port = (int)v;
    p = e;
  }
  if (*p == '/' && p[1]) db = atoi(p + 1);
  snprintf(url, sizeof url, "redis://%s:%d/%d", host, port, db);
  return 0;
}

static void read_env(void) {
  const char *u = getenv("FUSELAB_REMOTE_CACHE");
  double mb;
  char q[480];
  state = OFF;
  if (!(u && *u)) return;
  configured = 1;
  /* shown in warnings before the URL is parsed: never its password */
  if (strchr(u, '@') && strncmp(u, "redis://", 8) == 0)
    snprintf(url, sizeof url, "redis://...@%s", err_quote(strchr(u, '@') + 1, q, sizeof q));
  else snprintf(url, sizeof url, "%s", err_quote(u, q, sizeof q));
  ttl = (long long)env_number("FUSELAB_REMOTE_CACHE_TTL", (double)TTL_DEFAULT, 1e12,
                              ENV_WHOLE | ENV_ABOVE_ZERO, "seconds");
  /* Redis holds strings of at most 512 MB */
  mb = env_number("FUSELAB_REMOTE_CACHE_MAX_MB", CAP_DEFAULT_MB, 512, ENV_ABOVE_ZERO, "megabytes");
  cap = (int64_t)(mb * 1048576.0);
  if (cap < 1) cap = 1;
  if (parse_url(u) != 0 || read_secret() != 0) {
    warn("%s is off: %s", url, why);
    return;
  }
  state = ON;
}

/* ---- commands --------------------------------------------------------------
** One command: written whole, then its one reply read, all before one
** deadline (COMMAND_S after the command starts).  A reply: a status
** (+OK), an error (-ERR ...), an integer or a bulk string of at most
** max_bulk bytes; anything else (an array, a bulk string longer than the
** command can get, a line past REPLY_LINE_MAX, bytes after the reply) ends the
** read and, by the caller's fail(), the connection. */

typedef struct reply {
  char type;             /* '+' status, '-' error, ':' integer, '$' bulk string */
  char *str;             /* the text or the bytes, NUL-ended; NULL for a nil bulk */
  size_t len;            /* bytes at str */
} reply;

static void reply_free(reply *r) {
  free(r->str);
  r->str = NULL;
}

/* Wait for the socket to be ready for ev (POLLIN, POLLOUT) before the
** deadline: 0, or -1 with msg set. */
static int wait_ready(int fd, short ev, double deadline, char *msg, size_t n) {
  for (;;) {
    struct pollfd p = {fd, ev, 0};
    double left = deadline - meas_now();
    int rc;
    if (left <= 0) {
      snprintf(msg, n, "no complete answer within %g s", COMMAND_S);
      return -1;
    }
    rc = poll(&p, 1, (int)(left * 1000) + 1);
    if (rc > 0) return 0;
    if (rc < 0 && errno != EINTR) {
      snprintf(msg, n, "%s", strerror(errno));
      return -1;
    }
  }
}

/* All n bytes at p written before the deadline; 0 or -1 with msg set.
** MSG_NOSIGNAL: a peer that has gone is an error here, not SIGPIPE. */
static int send_all(int fd, const char *p, size_t n, double deadline, char *msg, size_t mn) {
  while (n > 0) {
    ssize_t k;
    if (wait_ready(fd, POLLOUT, deadline, msg, mn) != 0) return -1;
    k = send(fd, p, n, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) continue;
    if (k <= 0) {
      snprintf(msg, mn, "cannot send: %s", k < 0 ? strerror(errno) : "connection closed");
      return -1;
    }
    p += k;
    n -= (size_t)k;
  }
  return 0;
}

/* Up to n bytes into buf, waiting no later than the deadline: how many
** (at least 1), or -1 with msg set (the peer closed, an error, time). */
static ssize_t recv_some(int fd, char *buf, size_t n, double deadline, char *msg, size_t mn) {
  for (;;) {
    ssize_t k;
    if (wait_ready(fd, POLLIN, deadline, msg, mn) != 0) return -1;
    k = recv(fd, buf, n, MSG_DONTWAIT);
    if (k > 0) return k;
    if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) continue;
    snprintf(msg, mn, "%s", k == 0 ? "the server closed the connection" : strerror(errno));
    return -1;
  }
}

/* s[0..n) as a decimal integer (an optional '-'); 0 or -1. */
static int parse_int(const char *s, size_t n, long long *out) {
  long long v = 0;
  size_t i = s[0] == '-';
  if (n == i || n - i > 18) return -1;
  for (; i < n; i++) {
    if (s[i] < '0' || s[i] > '9') return -1;
    v = v * 10 + (s[i] - '0');
  }
  *out = s[0] == '-' ? -v : v;
  return 0;
}

/* The command argv[0..argc) in Redis's protocol, malloc'd, *n bytes. */
static char *format_command(int argc, const char **argv, const size_t *lens, size_t *n) {
  size_t total = 32, at;
  char *buf;
  int i;
  for (i = 0; i < argc; i++) total += lens[i] + 32;
  if (!(buf = malloc(total))) return NULL;
  at = (size_t)snprintf(buf, total, "*%d\r\n", argc);
  for (i = 0; i < argc; i++) {
    at += (size_t)snprintf(buf + at, total - at, "$%zu\r\n", lens[i]);
    memcpy(buf + at, argv[i], lens[i]);
    at += lens[i];
    memcpy(buf + at, "\r\n", 2);
    at += 2;
  }
  *n = at;
  return buf;
}

/* Send the command and read its reply into *r (max_bulk: the longest
** bulk string it can rightly get): 0, or -1 with msg set (escaped: it
** may quote the server). */
static int command(int argc, const char **argv, const size_t *lens, size_t max_bulk,
                   reply *r, char *msg, size_t mn) {
  double deadline = meas_now() + COMMAND_S;
  char line[REPLY_LINE_MAX + 2], q[64];
  size_t have = 0, end, cmdlen;
  long long len;
  char *cmd = format_command(argc, argv, lens, &cmdlen), *nl;
  int fd = ctx->fd, rc;
  memset(r, 0, sizeof *r);
  if (!cmd) {
    snprintf(msg, mn, "out of memory (a %s command)", argv[0]);
    return -1;
  }
  rc = send_all(fd, cmd, cmdlen, deadline, msg, mn);
  free(cmd);
  if (rc != 0) return -1;
  /* the first line: the type, then the text, the integer or the length */
  while (!(have >= 2 && (nl = memmem(line, have, "\r\n", 2)))) {
    ssize_t k;
    if (have == sizeof line) {
      snprintf(msg, mn, "a reply line longer than %d bytes", REPLY_LINE_MAX);
      return -1;
    }
    if ((k = recv_some(fd, line + have, sizeof line - have, deadline, msg, mn)) < 0) return -1;
    have += (size_t)k;
  }
  end = (size_t)(nl - line);
  r->type = line[0];
  if (end == 0 || !memchr("+-:$", line[0], 4)) {
    snprintf(msg, mn, "an unexpected reply (type '%s')", err_quote_n(line, end ? 1 : 0, q, sizeof q));
    return -1;
  }
  if (r->type != '$') {
    if (have != end + 2) {
      snprintf(msg, mn, "bytes after the reply");
      return -1;
    }
    if (!(r->str = malloc(end))) {
      snprintf(msg, mn, "out of memory");
      return -1;
    }
    memcpy(r->str, line + 1, end - 1);
    r->str[end - 1] = '\0';
    r->len = end - 1;
    return 0;
  }
  if (parse_int(line + 1, end - 1, &len) != 0 || len < -1) {
    snprintf(msg, mn, "a bulk string of unreadable length '%s'", err_quote_n(line + 1, end - 1, q, sizeof q));
    return -1;
  }
  if (len == -1) {                    /* nil */
    if (have != end + 2) {
      snprintf(msg, mn, "bytes after the reply");
      return -1;
    }
    return 0;
  }
  /* the cap, on what is received: a longer string is never read */
  if ((unsigned long long)len > max_bulk) {
    snprintf(msg, mn, "a reply of %lld bytes, more than the %zu it can be (FUSELAB_REMOTE_CACHE_MAX_MB); "
             "not read", len, max_bulk);
    return -1;
  }
  if (!(r->str = malloc((size_t)len + 2))) {
    snprintf(msg, mn, "out of memory (a reply of %lld bytes)", len);
    return -1;
  }
  r->len = (size_t)len;
  have -= end + 2;                    /* what came after the line */
  if (have > r->len + 2) {
    snprintf(msg, mn, "bytes after the reply");
    reply_free(r);
    return -1;
  }
  memcpy(r->str, line + end + 2, have);
  while (have < r->len + 2) {
    ssize_t k = recv_some(fd, r->str + have, r->len + 2 - have, deadline, msg, mn);
    if (k < 0) {
      reply_free(r);
      return -1;
    }
    have += (size_t)k;
  }
  if (memcmp(r->str + r->len, "\r\n", 2) != 0) {
    snprintf(msg, mn, "a bulk string not ended by CRLF");
    reply_free(r);
    return -1;
  }
  r->str[r->len] = '\0';
  return 0;
}

/* The server's error text, escaped, for a message. */
static const char *server_text(const reply *r, char *buf, size_t n) {
  return err_quote_n(r->str ? r->str : "", r->str ? r->len : 0, buf, n);
}

/* The first failure: one warning, the remote dead for the process. */
static void fail(const char *what) {
  n_errors++;
  snprintf(why, sizeof why, "%.590s", what);
  warn("%s: %s; using the local cache only for the rest of this process", url, what);
  if (ctx) redisFree(ctx);
  ctx = NULL;
  state = DEAD;
}

/* A command that must not fail (AUTH, SELECT): 0, or failed */
static int simple(int argc, const char **argv, const char *name) {
  size_t lens[2] = {argc > 0 ? strlen(argv[0]) : 0, argc > 1 ? strlen(argv[1]) : 0};
  char msg[600], why_[400], text[400];
  reply r;
  if (command(argc, argv, lens, 0, &r, why_, sizeof why_) != 0) {
    snprintf(msg, sizeof msg, "%s: %s", name, why_);
    fail(msg);
    return -1;
  }
  if (r.type != '-') { reply_free(&r); return 0; }
  snprintf(msg, sizeof msg, "%s: %s", name, server_text(&r, text, sizeof text));
  reply_free(&r);
  fail(msg);
  return -1;
}

/* The connection, made on first need; 0 or -1 (dead).  Under the lock. */
static int connected(void) {
  struct timeval ct = {0, CONNECT_US};
  char msg[600], dbs[16], q[300];
  if (state != ON) return -1;
  if (ctx) return 0;
  ctx = redisConnectWithTimeout(host, port, ct);
  if (!ctx || ctx->err) {
    snprintf(msg, sizeof msg, "cannot connect: %s", ctx ? err_quote(ctx->errstr, q, sizeof q) : "out of memory");
    fail(msg);
    return -1;
  }
  if (password[0] && simple(2, (const char *[]){"AUTH", password}, "AUTH") != 0) return -1;
  snprintf(dbs, sizeof dbs, "%d", db);
  if (db && simple(2, (const char *[]){"SELECT", dbs}, "SELECT") != 0) return -1;
  return 0;
}

static int active(void) {
  int on;
  pthread_mutex_lock(&lock);
  if (state == UNREAD) read_env();
  on = state == ON;
  pthread_mutex_unlock(&lock);
  return on;
}

static int mac(const char *name, const void *data, size_t n, unsigned char out[MAC_LEN]) {
  EVP_MAC *m = EVP_MAC_fetch(NULL, "HMAC", NULL);
  EVP_MAC_CTX *c = m ? EVP_MAC_CTX_new(m) : NULL;
  OSSL_PARAM params[2];
  size_t len = 0;
  int ok;
  params[0] = OSSL_PARAM_construct_utf8_string(OSSL_MAC_PARAM_DIGEST, (char *)"SHA256", 0);
  params[1] = OSSL_PARAM_construct_end();
  ok = c && EVP_MAC_init(c, secret, secret_len, params) &&
       EVP_MAC_update(c, (const unsigned char *)name, strlen(name)) &&
       EVP_MAC_update(c, data, n) && EVP_MAC_final(c, out, &len, MAC_LEN) && len == MAC_LEN;
  EVP_MAC_CTX_free(c);
  EVP_MAC_free(m);
  return ok ? 0 : -1;
}

/* Under the lock: count a rejection, the first one warned about. */
static void reject(const char *name, const char *what) {
  n_rejected++;
  if (!warned_reject++)
    fprintf(stderr, "fuselab: warning: remote cache %s: rejected the entry for %s (%s); it is "
            "rebuilt here (later rejections are counted in fl.cache_info().remote.rejected)\n",
            url, name, what);
}


int crem_get(const char *name, void **data, size_t *n) {
  char rkey[300], range[32];
  const char *argv[4];
  size_t lens[4], nl = strlen(name), head = 5 + 1 + nl + 8, len;
  const unsigned char *v;
  unsigned char want[MAC_LEN];
  char msg[600], text[400];
  reply r;
  uint64_t plen;
  int got = 0;
  *data = NULL;
  *n = 0;
  if (!active() || nl > 255) return 0;
  snprintf(rkey, sizeof rkey, "fuselab:%s", name);
  /* at most one byte past the largest valid value: an oversized entry is
  ** known without being fetched whole */
  snprintf(range, sizeof range, "%lld", (long long)(head + (size_t)cap + MAC_LEN));
  argv[0] = "GETRANGE"; argv[1] = rkey; argv[2] = "0"; argv[3] = range;
  pthread_mutex_lock(&lock);
  if (connected() != 0) goto out;
  for (int i = 0; i < 4; i++) lens[i] = strlen(argv[i]);
  /* GETRANGE's end is inclusive: one byte past the range asked is
  ** already more than Redis may answer */
  if (command(4, argv, lens, head + (size_t)cap + MAC_LEN + 1, &r, text, sizeof text) != 0) {
    snprintf(msg, sizeof msg, "GETRANGE: %s", text);
    fail(msg);
    goto out;
  }
  if (r.type == '-' && strncmp(r.str, "WRONGTYPE", 9) == 0) {
    reject(name, "not a string value");
  } else if (r.type != '$' || !r.str) {
    snprintf(msg, sizeof msg, "GETRANGE: %s", r.type == '-' ? server_text(&r, text, sizeof text) : "unexpected reply");
    fail(msg);
  } else if ((len = r.len) == 0) {
    n_miss++;
  } else if (len > head + (size_t)cap + MAC_LEN) {
    reject(name, "larger than FUSELAB_REMOTE_CACHE_MAX_MB");
  } else if (v = (const unsigned char *)r.str, len < head + MAC_LEN || memcmp(v, MAGIC, 5) != 0 ||
             v[5] != nl || memcmp(v + 6, name, nl) != 0) {
    reject(name, "not a fuselab entry for this key");
  } else if ((plen = cdisk_get64(v + 6 + nl)) != len - head - MAC_LEN) {
    reject(name, "truncated or extended");
  } else if (mac(name, v + head, (size_t)plen, want) != 0 ||
             CRYPTO_memcmp(want, v + head + plen, MAC_LEN) != 0) {
    reject(name, "bad signature: another secret, or altered");
  } else if ((*data = malloc((size_t)plen + 1))) {   /* NUL-ended, as cache_get_blob's */
    memcpy(*data, v + head, (size_t)plen);
    ((char *)*data)[plen] = '\0';
    *n = (size_t)plen;
    got = 1;
  }
  reply_free(&r);
out:
  pthread_mutex_unlock(&lock);
  return got;
}

void crem_put(const char *name, const void *data, size_t n) {
  char rkey[300], ex[32];
  const char *argv[5];
  size_t lens[5], nl = strlen(name), head = 5 + 1 + nl + 8;
  unsigned char *v;
  char msg[600], text[400];
  reply r;
  if (!active() || nl > 255 || (int64_t)n > cap) return;
  if (!(v = malloc(head + n + MAC_LEN))) return;
  memcpy(v, MAGIC, 5);
  v[5] = (unsigned char)nl;
  memcpy(v + 6, name, nl);
  cdisk_put64(v + 6 + nl, n);
  memcpy(v + head, data, n);
  snprintf(rkey, sizeof rkey, "fuselab:%s", name);
  snprintf(ex, sizeof ex, "%lld", ttl);
  argv[0] = "SET"; argv[1] = rkey; argv[2] = (const char *)v; argv[3] = "EX"; argv[4] = ex;
  lens[0] = 3; lens[1] = strlen(rkey); lens[2] = head + n + MAC_LEN; lens[3] = 2; lens[4] = strlen(ex);
  pthread_mutex_lock(&lock);
  if (mac(name, data, n, v + head + n) != 0) {
    fail("cannot compute HMAC-SHA256 (libcrypto)");
  } else if (connected() == 0) {
    if (command(5, argv, lens, 0, &r, text, sizeof text) != 0) {
      snprintf(msg, sizeof msg, "SET: %s", text);
      fail(msg);
    } else {
      /* "OOM command not allowed" and other refusals: Redis is full or
      ** misconfigured, which more tries would not mend */
      if (r.type == '-') {
        snprintf(msg, sizeof msg, "SET: %s", server_text(&r, text, sizeof text));
        fail(msg);
      } else {
        n_writes++;
      }
      reply_free(&r);
    }
  }
  pthread_mutex_unlock(&lock);
  free(v);
}

#else /* no hiredis: the variable only says so */

static void read_env(void) {
  const char *u = getenv("FUSELAB_REMOTE_CACHE");
  char q[480];
  state = OFF;
  if (!(u && *u)) return;
  configured = 1;
  snprintf(url, sizeof url, "%s", err_quote(u, q, sizeof q));
  snprintf(why, sizeof why, "this fuselab was built without hiredis (install libhiredis-dev and "
           "libssl-dev, then configure again)");
  warn("%s is off: %s", url, why);
}

static int active(void) {
  pthread_mutex_lock(&lock);
  if (state == UNREAD) read_env();
  pthread_mutex_unlock(&lock);
  return 0;
}

static void reject(const char *name, const char *what) { (void)name; (void)what; n_rejected++; }

int crem_get(const char *name, void **data, size_t *n) {
  (void)name;
  *data = NULL;
  *n = 0;
  return active();
}

void crem_put(const char *name, const void *data, size_t n) {
  (void)name; (void)data; (void)n;
  active();
}
#endif

int crem_enabled(void) { return active(); }

void crem_verdict(const char *name, const char *what) {
  pthread_mutex_lock(&lock);
  if (what) reject(name, what);
  else n_hits++;
  pthread_mutex_unlock(&lock);
}

void crem_get_info(crem_info *out) {
  memset(out, 0, sizeof *out);
  active();
  pthread_mutex_lock(&lock);
  out->configured = configured;
  out->enabled = state == ON;
  snprintf(out->url, sizeof out->url, "%s", url);
  if (configured && state != ON) snprintf(out->why, sizeof out->why, "%s", why);
  out->hits = n_hits; out->misses = n_miss; out->writes = n_writes;
  out->rejected = n_rejected; out->errors = n_errors;
  pthread_mutex_unlock(&lock);
}
