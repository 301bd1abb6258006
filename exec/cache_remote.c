/*
** cache_remote.c -- compiled kernels shared through Redis (cache_remote.h).
** Invariant: a payload leaves crem_get only when its HMAC under the team's
** secret covers its name and every byte, compared in constant time; and
** no call here blocks for longer than the connect or command timeout,
** after whose first failure the remote is dead for the process.
*/
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#include "config.h"
#include "cache_remote.h"
#include "cache_disk.h"

#ifdef HAVE_HIREDIS
#include <hiredis/hiredis.h>
#include <openssl/core_names.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/params.h>
#endif

#define MAGIC "FLRC1"
#define MAC_LEN 32
#define TTL_DEFAULT (30LL * 24 * 3600)
#define CAP_DEFAULT_MB 64.0
#define CONNECT_US 200000
#define COMMAND_S 2

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
  const char *u = getenv("FUSELAB_REMOTE_CACHE"), *t = getenv("FUSELAB_REMOTE_CACHE_TTL");
  const char *m = getenv("FUSELAB_REMOTE_CACHE_MAX_MB");
  double mb = m && *m ? atof(m) : CAP_DEFAULT_MB;
  state = OFF;
  if (!(u && *u)) return;
  configured = 1;
  /* shown in warnings before the URL is parsed: never its password */
  if (strchr(u, '@') && strncmp(u, "redis://", 8) == 0) snprintf(url, sizeof url, "redis://...@%.480s", strchr(u, '@') + 1);
  else snprintf(url, sizeof url, "%.500s", u);
  if (t && *t && atoll(t) > 0) ttl = atoll(t);
  /* Redis holds strings of at most 512 MB */
  if (!(mb > 0)) mb = CAP_DEFAULT_MB;
  cap = (int64_t)((mb < 512 ? mb : 512) * 1048576.0);
  if (parse_url(u) != 0 || read_secret() != 0) {
    warn("%s is off: %s", url, why);
    return;
  }
  state = ON;
}

/* Once a peer has gone, a write would raise SIGPIPE, whose default is to
** end the process: the signal is held while hiredis talks and a pending
** one is taken back. */
static redisReply *command(int argc, const char **argv, const size_t *lens) {
  sigset_t pipe, old;
  struct timespec zero = {0, 0};
  redisReply *r;
  sigemptyset(&pipe);
  sigaddset(&pipe, SIGPIPE);
  pthread_sigmask(SIG_BLOCK, &pipe, &old);
  r = redisCommandArgv(ctx, argc, argv, lens);
  while (sigtimedwait(&pipe, NULL, &zero) > 0) {}
  pthread_sigmask(SIG_SETMASK, &old, NULL);
  return r;
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
  redisReply *r = command(argc, argv, lens);
  char msg[600];
  if (r && r->type != REDIS_REPLY_ERROR) { freeReplyObject(r); return 0; }
  snprintf(msg, sizeof msg, "%s: %.500s", name, r ? r->str : ctx->errstr);
  if (r) freeReplyObject(r);
  fail(msg);
  return -1;
}

/* The connection, made on first need; 0 or -1 (dead).  Under the lock. */
static int connected(void) {
  struct timeval ct = {0, CONNECT_US}, cmd = {COMMAND_S, 0};
  char msg[600], dbs[16];
  if (state != ON) return -1;
  if (ctx) return 0;
  ctx = redisConnectWithTimeout(host, port, ct);
  if (!ctx || ctx->err) {
    snprintf(msg, sizeof msg, "cannot connect: %s", ctx ? ctx->errstr : "out of memory");
    fail(msg);
    return -1;
  }
  if (redisSetTimeout(ctx, cmd) != REDIS_OK) { fail("cannot set the command timeout"); return -1; }
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
  redisReply *r;
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
  if (!(r = command(4, argv, lens))) { fail(ctx->errstr[0] ? ctx->errstr : "no answer"); goto out; }
  if (r->type == REDIS_REPLY_ERROR && strncmp(r->str, "WRONGTYPE", 9) == 0) {
    reject(name, "not a string value");
  } else if (r->type != REDIS_REPLY_STRING) {
    char msg[600];
    snprintf(msg, sizeof msg, "GETRANGE: %.500s", r->type == REDIS_REPLY_ERROR ? r->str : "unexpected reply");
    fail(msg);
  } else if ((len = r->len) == 0) {
    n_miss++;
  } else if (len > head + (size_t)cap + MAC_LEN) {
    reject(name, "larger than FUSELAB_REMOTE_CACHE_MAX_MB");
  } else if (v = (const unsigned char *)r->str, len < head + MAC_LEN || memcmp(v, MAGIC, 5) != 0 ||
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
  freeReplyObject(r);
out:
  pthread_mutex_unlock(&lock);
  return got;
}

void crem_put(const char *name, const void *data, size_t n) {
  char rkey[300], ex[32];
  const char *argv[5];
  size_t lens[5], nl = strlen(name), head = 5 + 1 + nl + 8;
  unsigned char *v;
  redisReply *r;
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
    if (!(r = command(5, argv, lens))) {
      fail(ctx->errstr[0] ? ctx->errstr : "no answer");
    } else {
      /* "OOM command not allowed" and other refusals: Redis is full or
      ** misconfigured, which more tries would not mend */
      if (r->type == REDIS_REPLY_ERROR) {
        char msg[600];
        snprintf(msg, sizeof msg, "SET: %.500s", r->str);
        fail(msg);
      } else {
        n_writes++;
      }
      freeReplyObject(r);
    }
  }
  pthread_mutex_unlock(&lock);
  free(v);
}

#else /* no hiredis: the variable only says so */

static void read_env(void) {
  const char *u = getenv("FUSELAB_REMOTE_CACHE");
  state = OFF;
  if (!(u && *u)) return;
  configured = 1;
  snprintf(url, sizeof url, "%.500s", u);
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
