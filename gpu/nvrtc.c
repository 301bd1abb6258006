/*
** nvrtc.c -- NVRTC compiles, cached.
** Invariant: an image handed out was compiled from exactly the source and
** options its key covers (source, NVRTC version, options, architecture,
** fuselab version): the memory table and the disk blobs are both indexed
** by that key, and a disk blob that fails its checksum is rebuilt.
*/
#include "config.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_check.h"
#include "nvrtc.h"
#include "cuda_rt.h"
#include "../exec/cache.h"
#include "../exec/measure.h"

#ifndef FL_CUDA_INCLUDE
#define FL_CUDA_INCLUDE "/usr/local/cuda/include"
#endif

#define BLOB_EXT "cubin"

/* images kept in memory, newest first */
typedef struct entry {
  char key[33];
  nvrtc_image img;
  struct entry *next;
} entry;

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static entry *table;

static char *dupn(const void *p, size_t n) {
  char *d = malloc(n + 1);
  if (d) { if (n) memcpy(d, p, n); d[n] = '\0'; }
  return d;
}

int nvrtc_available(fl_err *e) {
  int a, b;
  return CUDA_CHECK(e, "nvrtc", nvrtcVersion(&a, &b)) == FL_OK;
}

const char *nvrtc_version_str(void) {
  static char v[32];
  int a = 0, b = 0;
  if (!v[0]) {
    if (nvrtcVersion(&a, &b) == NVRTC_SUCCESS) snprintf(v, sizeof v, "%d.%d", a, b);
    else snprintf(v, sizeof v, "?");
  }
  return v;
}

int nvrtc_default_arch(void) {
  int cc = cuda_device_cc();
  return cc > 0 ? cc : 90;
}

/* sm_XX when this NVRTC can make a CUBIN for arch, else compute_YY for
** the newest YY <= arch it knows (PTX the driver compiles). */
static void arch_flag(int arch, char *out, size_t n) {
  int num = 0, list[64], i, best = 0;
  if (nvrtcGetNumSupportedArchs(&num) == NVRTC_SUCCESS && num > 0 && num <= 64 &&
      nvrtcGetSupportedArchs(list) == NVRTC_SUCCESS) {
    for (i = 0; i < num; i++) {
      if (list[i] == arch) { snprintf(out, n, "sm_%d", arch % 1000); return; }
      if (list[i] < arch && list[i] > best) best = list[i];
    }
    if (best) { snprintf(out, n, "compute_%d", best % 1000); return; }
  }
  snprintf(out, n, "sm_%d", arch % 1000);
}

void nvrtc_image_free(nvrtc_image *img) {
  if (!img) return;
  free(img->ptx);
  free(img->cubin);
  free(img->log);
  memset(img, 0, sizeof *img);
}

static int copy_image(nvrtc_image *dst, const nvrtc_image *src) {
  *dst = *src;
  dst->ptx = dupn(src->ptx, src->ptx_n);
  dst->cubin = src->cubin ? dupn(src->cubin, src->cubin_n) : NULL;
  dst->log = dupn(src->log ? src->log : "", src->log ? strlen(src->log) : 0);
  if (!dst->ptx || (src->cubin && !dst->cubin) || !dst->log) {
    nvrtc_image_free(dst);
    return FL_ENOMEM;
  }
  return FL_OK;
}

/* blob payload: arch, then sizes and bytes of PTX, CUBIN and log */
static char *pack(const nvrtc_image *img, size_t *n) {
  size_t ln = strlen(img->log), at = 0;
  uint64_t sz[3] = {img->ptx_n, img->cubin_n, ln};
  char *b;
  *n = 16 + sizeof sz + img->ptx_n + img->cubin_n + ln;
  if (!(b = malloc(*n))) return NULL;
  memset(b, 0, 16);
  memcpy(b, img->arch, strlen(img->arch) < 15 ? strlen(img->arch) : 15);
  at = 16;
  memcpy(b + at, sz, sizeof sz); at += sizeof sz;
  memcpy(b + at, img->ptx, img->ptx_n); at += img->ptx_n;
  if (img->cubin_n) memcpy(b + at, img->cubin, img->cubin_n);
  at += img->cubin_n;
  memcpy(b + at, img->log, ln);
  return b;
}

static int unpack(const char *b, size_t n, nvrtc_image *img) {
  uint64_t sz[3];
  size_t at = 16 + sizeof sz;
  memset(img, 0, sizeof *img);
  if (n < at) return -1;
  memcpy(img->arch, b, 15);
  memcpy(sz, b + 16, sizeof sz);
  if (sz[0] > n || sz[1] > n || sz[2] > n || at + sz[0] + sz[1] + sz[2] != n) return -1;
  img->ptx = dupn(b + at, (size_t)sz[0]);
  img->ptx_n = (size_t)sz[0];
  at += (size_t)sz[0];
  if (sz[1]) img->cubin = dupn(b + at, (size_t)sz[1]);
  img->cubin_n = (size_t)sz[1];
  at += (size_t)sz[1];
  img->log = dupn(b + at, (size_t)sz[2]);
  if (!img->ptx || !img->log || (sz[1] && !img->cubin)) { nvrtc_image_free(img); return -1; }
  return 0;
}

static void remember(const char *key, const nvrtc_image *img) {
  entry *en = calloc(1, sizeof *en);
  if (!en) return;
  if (copy_image(&en->img, img) != FL_OK) { free(en); return; }
  memcpy(en->key, key, 33);
  pthread_mutex_lock(&lock);
  en->next = table;
  table = en;
  pthread_mutex_unlock(&lock);
}

/* Keep a failing source beside the cache, for reading. */
static void keep_failed(const char *key, const char *source) {
  fl_err e;
  (void)cache_put_blob(key, "failed.cu", source, strlen(source), &e);
}

int nvrtc_compile(const char *source, const char *name, int arch, nvrtc_image *img,
                  char **log, fl_err *e) {
  char archf[16], opt_arch[64], opt_inc[1100], key[33], cc[32];
  const char *opts[5];
  const char *parts[7];
  nvrtcProgram prog = NULL;
  nvrtcResult crc;
  double t0 = meas_now() * 1e3;
  entry *en;
  void *blob;
  size_t bn, ln = 0;
  int rc = FL_OK, how;
  memset(img, 0, sizeof *img);
  if (log) *log = NULL;
  arch_flag(arch, archf, sizeof archf);
  snprintf(opt_arch, sizeof opt_arch, "--gpu-architecture=%s", archf);
  snprintf(opt_inc, sizeof opt_inc, "-I%s", FL_CUDA_INCLUDE);
  opts[0] = opt_arch;
  opts[1] = "-default-device";
  opts[2] = "--std=c++17";
  opts[3] = opt_inc;
  /* NVVM's optimizer on one thread per CPU: programs with several matmul
  ** kernels compile in about 2/3 of the time on 2 CPUs (an NVRTC without
  ** the option is retried without it) */
  opts[4] = "--split-compile=0";
  snprintf(cc, sizeof cc, "nvrtc %s", nvrtc_version_str());
  parts[0] = source; parts[1] = cc; parts[2] = opts[0]; parts[3] = opts[1];
  parts[4] = opts[2]; parts[5] = opts[3]; parts[6] = opts[4];
  cache_blob_key(parts, 7, key);
  /* memory, then disk, then the shared cache (FUSELAB_REMOTE_CACHE) */
  pthread_mutex_lock(&lock);
  for (en = table; en; en = en->next)
    if (strcmp(en->key, key) == 0) break;
  if (en) rc = copy_image(img, &en->img);
  pthread_mutex_unlock(&lock);
  if (en) {
    if (rc != FL_OK) return err_set(e, FL_ENOMEM, "nvrtc: out of memory");
    img->how = CACHE_MEMORY;
    img->ms = meas_now() * 1e3 - t0;
    return FL_OK;
  }
  if (cache_get_blob_shared(key, BLOB_EXT, &blob, &bn, &how)) {
    int bad = unpack(blob, bn, img);
    free(blob);
    if (!bad) {
      img->how = how;
      remember(key, img);
      img->ms = meas_now() * 1e3 - t0;
      return FL_OK;
    }
  }
  /* compile */
  if ((rc = CUDA_CHECK(e, "nvrtc", nvrtcCreateProgram(&prog, source, name, 0, NULL, NULL))) != FL_OK)
    return rc;
  crc = nvrtcCompileProgram(prog, 5, opts);
  if (crc == NVRTC_ERROR_INVALID_OPTION) {
    nvrtcDestroyProgram(&prog);
    if ((rc = CUDA_CHECK(e, "nvrtc", nvrtcCreateProgram(&prog, source, name, 0, NULL, NULL))) != FL_OK)
      return rc;
    crc = nvrtcCompileProgram(prog, 4, opts);
  }
  if (nvrtcGetProgramLogSize(prog, &ln) == NVRTC_SUCCESS && (img->log = malloc(ln + 1))) {
    if (nvrtcGetProgramLog(prog, img->log) != NVRTC_SUCCESS) img->log[0] = '\0';
    img->log[ln] = '\0';
  }
  if (!img->log) img->log = dupn("", 0);
  if (crc != NVRTC_SUCCESS) {
    rc = err_set(e, FL_ECOMPILE, "nvrtc: %s: compiling %s for %s failed; NVRTC's log:\n%s",
                 nvrtcGetErrorString(crc), name, archf, img->log ? img->log : "");
    if (log) { *log = img->log; img->log = NULL; }
    keep_failed(key, source);
    goto fail;
  }
  if ((rc = CUDA_CHECK(e, "nvrtc", nvrtcGetPTXSize(prog, &img->ptx_n))) != FL_OK) goto fail;
  if (!(img->ptx = malloc(img->ptx_n + 1))) { rc = err_set(e, FL_ENOMEM, "nvrtc: out of memory"); goto fail; }
  if ((rc = CUDA_CHECK(e, "nvrtc", nvrtcGetPTX(prog, img->ptx))) != FL_OK) goto fail;
  img->ptx[img->ptx_n] = '\0';
  if (strncmp(archf, "sm_", 3) == 0) {
    if ((rc = CUDA_CHECK(e, "nvrtc", nvrtcGetCUBINSize(prog, &img->cubin_n))) != FL_OK) goto fail;
    if (!(img->cubin = malloc(img->cubin_n ? img->cubin_n : 1))) {
      rc = err_set(e, FL_ENOMEM, "nvrtc: out of memory");
      goto fail;
    }
    if ((rc = CUDA_CHECK(e, "nvrtc", nvrtcGetCUBIN(prog, img->cubin))) != FL_OK) goto fail;
  }
  nvrtcDestroyProgram(&prog);
  snprintf(img->arch, sizeof img->arch, "%s", archf);
  img->how = CACHE_COMPILED;
  {
    char *b = pack(img, &bn);
    fl_err ignore;
    /* a cache that cannot be written costs speed, not correctness */
    if (b) (void)cache_put_blob_shared(key, BLOB_EXT, b, bn, &ignore);
    free(b);
  }
  remember(key, img);
  img->ms = meas_now() * 1e3 - t0;
  return FL_OK;
fail:
  if (prog) nvrtcDestroyProgram(&prog);
  nvrtc_image_free(img);
  return rc;
}

void nvrtc_forget_memory(void) {
  entry *en, *next;
  pthread_mutex_lock(&lock);
  en = table;
  table = NULL;
  pthread_mutex_unlock(&lock);
  for (; en; en = next) {
    next = en->next;
    nvrtc_image_free(&en->img);
    free(en);
  }
}

int nvrtc_cache_clear(void) {
  nvrtc_forget_memory();
  return cache_clear_blobs(BLOB_EXT) + cache_clear_blobs("failed.cu");
}

void nvrtc_cache_count(int64_t *entries, int64_t *bytes) {
  cache_count_blobs(BLOB_EXT, entries, bytes);
}
