/*
** roofline.c -- the machine's two peaks, measured once and cached, and
** each kernel placed under them (roofline.h).
** Invariant: a peak comes from a measurement on this machine, as it is set
** up now (CPU model, instruction set, threads, product path, version):
** from this process's memory, or from a cache file whose key and fields
** all say so; anything else is measured again.
*/
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#include <cblas.h>
#include <cjson/cJSON.h>
#include <xxhash.h>

#include "config.h"
#include "cache.h"
#include "measure.h"
#include "roofline.h"
#include "../cpu/blas.h"
#include "../cpu/mm.h"

#define ROOF_FORMAT "fuselab-roofline 1"
#define ROOF_EXT "roof"
/* The triad's three arrays together: at least four last-level caches, so
** at most a quarter of what it touches can be a cache hit, and at least
** this many MiB where the cache size is unknown or small. */
#define TRIAD_MIN_MIB 96.0
#define TRIAD_MAX_MIB 768.0
/* Time each measurement may take (seconds of timed runs after the
** warm-up), and how many runs a median is taken over. */
#define PHASE_BUDGET_S 0.35
#define MIN_RUNS 3
#define MAX_RUNS 9

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;

/* ---- what this machine is --------------------------------------------- */

typedef struct machine {
  char cpu[128];
  char isa[17];             /* XXH64 of the CPU's feature list, hex */
  char path_key[64];        /* "onednn", "blas:Haswell" */
  int threads;
} machine;

static roof_peaks memo;
static machine memo_m;           /* the machine memo was measured on */
static int have_memo;

static int omp_threads(void) {
#ifdef _OPENMP
  return omp_get_max_threads();
#else
  return 1;
#endif
}

/* The model name and feature list from /proc/cpuinfo (x86: "model name",
** "flags"; Arm: "Hardware" or "CPU part", "Features"). */
static void identify(machine *m) {
  FILE *f = fopen("/proc/cpuinfo", "r");
  char line[8192];
  XXH64_hash_t h = 0;
  int have_model = 0, have_flags = 0;
  memset(m, 0, sizeof *m);
  while (f && fgets(line, sizeof line, f) && !(have_model && have_flags)) {
    char *colon = strchr(line, ':'), *v;
    size_t n;
    if (!colon) continue;
    v = colon + 1;
    while (*v == ' ' || *v == '\t') v++;
    n = strlen(v);
    while (n && (v[n - 1] == '\n' || v[n - 1] == ' ')) v[--n] = '\0';
    if (!have_model && (strncmp(line, "model name", 10) == 0 || strncmp(line, "Hardware", 8) == 0 ||
                        strncmp(line, "CPU part", 8) == 0) && n) {
      snprintf(m->cpu, sizeof m->cpu, "%s", v);
      have_model = 1;
    } else if (!have_flags && (strncmp(line, "flags", 5) == 0 || strncmp(line, "Features", 8) == 0)) {
      h = XXH64(v, n, 0);
      have_flags = 1;
    }
  }
  if (f) fclose(f);
  if (!m->cpu[0]) snprintf(m->cpu, sizeof m->cpu, "unknown CPU");
  snprintf(m->isa, sizeof m->isa, "%016llx", (unsigned long long)h);
  m->threads = omp_threads();
  if (cpu_mm_enabled()) {
    snprintf(m->path_key, sizeof m->path_key, "onednn");
  } else {
    cpu_blas_info bi;
    cpu_blas_get_info(&bi);
    snprintf(m->path_key, sizeof m->path_key, "blas:%s", bi.core[0] ? bi.core : "?");
  }
}

static void cache_key(const machine *m, char hex[33]) {
  char threads[16];
  const char *parts[5];
  snprintf(threads, sizeof threads, "%d", m->threads);
  parts[0] = ROOF_FORMAT;
  parts[1] = m->cpu;
  parts[2] = m->isa;
  parts[3] = threads;
  parts[4] = m->path_key;
  cache_blob_key(parts, 5, hex);
}

/* ---- the cache file ------------------------------------------------------
** JSON: {"format", "version", "cpu", "isa", "threads", "product_key",
** "copy_gbs", "copy_spread", "copy_runs", "copy_mib", "product_gflops",
** "product_spread", "product_runs", "product_n", "product_path", "noisy",
** "noise", "tries", "measured_at"}.  The blob around it (cache.h) checks it is
** whole; the fields say it is this machine's. */

static char *to_json(const roof_peaks *p, const machine *m) {
  cJSON *o = cJSON_CreateObject();
  char *s;
  if (!o) return NULL;
  cJSON_AddStringToObject(o, "format", ROOF_FORMAT);
  cJSON_AddStringToObject(o, "version", PACKAGE_VERSION);
  cJSON_AddStringToObject(o, "cpu", m->cpu);
  cJSON_AddStringToObject(o, "isa", m->isa);
  cJSON_AddNumberToObject(o, "threads", m->threads);
  cJSON_AddStringToObject(o, "product_key", m->path_key);
  cJSON_AddNumberToObject(o, "copy_gbs", p->copy_gbs);
  cJSON_AddNumberToObject(o, "copy_spread", p->copy_spread);
  cJSON_AddNumberToObject(o, "copy_runs", p->copy_runs);
  cJSON_AddNumberToObject(o, "copy_mib", p->copy_mib);
  cJSON_AddNumberToObject(o, "product_gflops", p->product_gflops);
  cJSON_AddNumberToObject(o, "product_spread", p->product_spread);
  cJSON_AddNumberToObject(o, "product_runs", p->product_runs);
  cJSON_AddNumberToObject(o, "product_n", p->product_n);
  cJSON_AddStringToObject(o, "product_path", p->product_path);
  cJSON_AddBoolToObject(o, "noisy", p->noisy);
  cJSON_AddNumberToObject(o, "tries", p->tries);
  cJSON_AddStringToObject(o, "noise", p->noise);
  cJSON_AddNumberToObject(o, "measured_at", (double)time(NULL));
  s = cJSON_PrintUnformatted(o);
  cJSON_Delete(o);
  return s;
}

static int str_is(const cJSON *o, const char *key, const char *want) {
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
  return cJSON_IsString(v) && strcmp(v->valuestring, want) == 0;
}

/* A number field within [lo, hi], else NAN. */
static double num(const cJSON *o, const char *key, double lo, double hi) {
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
  if (!cJSON_IsNumber(v) || !isfinite(v->valuedouble) || v->valuedouble < lo || v->valuedouble > hi)
    return NAN;
  return v->valuedouble;
}

static void str_field(const cJSON *o, const char *key, char *out, size_t n) {
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
  snprintf(out, n, "%s", cJSON_IsString(v) ? v->valuestring : "");
}

/* 1 when text is this machine's peaks (out filled), else 0. */
static int from_json(const char *text, const machine *m, roof_peaks *out) {
  cJSON *o = cJSON_Parse(text);
  roof_peaks p;
  int ok;
  if (!o) return 0;
  memset(&p, 0, sizeof p);
  ok = cJSON_IsObject(o) && str_is(o, "format", ROOF_FORMAT) &&
       str_is(o, "version", PACKAGE_VERSION) && str_is(o, "cpu", m->cpu) &&
       str_is(o, "isa", m->isa) && str_is(o, "product_key", m->path_key) &&
       num(o, "threads", 1, 1e6) == (double)m->threads;
  if (ok) {
    p.copy_gbs = num(o, "copy_gbs", 1e-3, 1e6);
    p.copy_spread = num(o, "copy_spread", 0, 1e3);
    p.copy_runs = (int)num(o, "copy_runs", 1, 1e6);
    p.copy_mib = num(o, "copy_mib", 0, 1e7);
    p.product_gflops = num(o, "product_gflops", 1e-3, 1e9);
    p.product_spread = num(o, "product_spread", 0, 1e3);
    p.product_runs = (int)num(o, "product_runs", 1, 1e6);
    p.product_n = (int)num(o, "product_n", 1, 1e6);
    p.tries = (int)num(o, "tries", 1, 1e6);
    ok = isfinite(p.copy_gbs) && isfinite(p.product_gflops) && isfinite(p.copy_spread) &&
         isfinite(p.product_spread) && isfinite(p.copy_mib) && p.copy_runs > 0 &&
         p.product_runs > 0 && p.product_n > 0 && p.tries > 0 &&
         cJSON_IsBool(cJSON_GetObjectItemCaseSensitive(o, "noisy"));
  }
  if (ok) {
    p.noisy = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(o, "noisy"));
    str_field(o, "noise", p.noise, sizeof p.noise);
    str_field(o, "product_path", p.product_path, sizeof p.product_path);
    snprintf(p.cpu, sizeof p.cpu, "%s", m->cpu);
    p.threads = m->threads;
    *out = p;
  }
  cJSON_Delete(o);
  return ok;
}

/* ---- measuring ------------------------------------------------------------ */

static volatile float sink;

/* The last-level cache's size: sysfs first (a VM's CPUID, which the C
** library's answer comes from, may claim a whole host's cache), then the
** C library; 0 when neither knows. */
static double llc_bytes(void) {
  double best = 0;
  int i, best_level = 0;
  long v = -1;
  for (i = 0; i < 10; i++) {
    char path[96], buf[32];
    FILE *f;
    int level = 0;
    double size = 0;
    char unit = 0;
    snprintf(path, sizeof path, "/sys/devices/system/cpu/cpu0/cache/index%d/level", i);
    if (!(f = fopen(path, "r"))) continue;
    if (fscanf(f, "%d", &level) != 1) level = 0;
    fclose(f);
    snprintf(path, sizeof path, "/sys/devices/system/cpu/cpu0/cache/index%d/size", i);
    if (!(f = fopen(path, "r"))) continue;
    if (fgets(buf, sizeof buf, f) && sscanf(buf, "%lf%c", &size, &unit) >= 1)
      size *= unit == 'K' ? 1024.0 : unit == 'M' ? 1048576.0 : unit == 'G' ? 1073741824.0 : 1.0;
    fclose(f);
    if (level > best_level && size > 0) {
      best_level = level;
      best = size;
    }
  }
  if (best > 0) return best;
#ifdef _SC_LEVEL3_CACHE_SIZE
  v = sysconf(_SC_LEVEL3_CACHE_SIZE);
  if (v <= 0) v = sysconf(_SC_LEVEL2_CACHE_SIZE);
#endif
  return v > 0 ? (double)v : 0;
}

static void triad(float *restrict a, const float *restrict b, const float *restrict c, int64_t n) {
  int64_t i;
#pragma omp parallel for simd schedule(static)
  for (i = 0; i < n; i++) a[i] = b[i] + 3.0f * c[i];
}

/* Pages are touched first by the threads, in the schedule, that will
** stream them (on a NUMA machine each lands near its thread). */
static void first_touch(float *a, float *b, float *c, int64_t n) {
  int64_t i;
#pragma omp parallel for schedule(static)
  for (i = 0; i < n; i++) {
    a[i] = 0.0f;
    b[i] = 1.0f;
    c[i] = 2.0f;
  }
}

/* Runs fn until the budget or MAX_RUNS (at least MIN_RUNS) and
** summarizes the times (ms). */
typedef void (*timed_fn)(void *arg);

static void time_runs(timed_fn fn, void *arg, meas_summary *s) {
  double t[MAX_RUNS], start = meas_now();
  meas_window w;
  int n = 0;
  meas_begin(&w);
  while (n < MAX_RUNS && (n < MIN_RUNS || meas_now() - start < PHASE_BUDGET_S)) {
    double t0 = meas_now();
    fn(arg);
    t[n++] = (meas_now() - t0) * 1e3;
  }
  meas_summarize(t, n, &w, s);
}

typedef struct triad_arg { float *a, *b, *c; int64_t n; } triad_arg;

static void triad_once(void *p) {
  triad_arg *t = p;
  triad(t->a, t->b, t->c, t->n);
  sink = t->a[t->n / 2];
}

/* Three 64-byte-aligned float arrays of bytes each, or none (FL_ENOMEM,
** naming the measurement). */
static int alloc3(float **a, float **b, float **c, size_t bytes, const char *what, fl_err *e) {
  *a = aligned_alloc(64, bytes);
  *b = aligned_alloc(64, bytes);
  *c = aligned_alloc(64, bytes);
  if (*a && *b && *c) return FL_OK;
  free(*a); free(*b); free(*c);
  *a = *b = *c = NULL;
  return err_set(e, FL_ENOMEM, "machine_peaks: cannot allocate 3 x %.0f MiB for the %s "
                 "measurement", (double)bytes / 1048576.0, what);
}

static int measure_copy(roof_peaks *p, meas_summary *s, fl_err *e) {
  double total = 4.0 * llc_bytes();
  triad_arg t;
  size_t bytes;
  if (total < TRIAD_MIN_MIB * 1048576.0) total = TRIAD_MIN_MIB * 1048576.0;
  if (total > TRIAD_MAX_MIB * 1048576.0) total = TRIAD_MAX_MIB * 1048576.0;
  t.n = (int64_t)(total / 3.0 / sizeof(float)) / 64 * 64;
  bytes = (size_t)t.n * sizeof(float);
  if (alloc3(&t.a, &t.b, &t.c, bytes, "bandwidth", e) != FL_OK) return e->code;
  first_touch(t.a, t.b, t.c, t.n);
  triad_once(&t);                                  /* threads up, pages mapped */
  time_runs(triad_once, &t, s);
  free(t.a); free(t.b); free(t.c);
  p->copy_mib = 3.0 * (double)bytes / 1048576.0;
  p->copy_runs = s->n;
  p->copy_spread = s->spread;
  /* bytes read + written per pass, as the cost model counts a kernel's */
  p->copy_gbs = s->median > 0 ? 3.0 * (double)bytes / (s->median * 1e6) : 0;
  return FL_OK;
}

typedef struct mm_arg { float *a, *b, *c; int n; int onednn; } mm_arg;

/* One n x n x n product by the path compiled products take: oneDNN's
** matmul where it is on (cpu/mm.h), else sgemm; oneDNN refusing falls
** back to sgemm for good, as the eager matmul does. */
static void product_once(void *p) {
  mm_arg *m = p;
  if (m->onednn) {
    cpu_mm mm;
    fl_err e;
    memset(&mm, 0, sizeof mm);
    mm.nd = 2;
    mm.a.p = m->a; mm.b.p = m->b; mm.dst.p = m->c;
    mm.a.shape[0] = mm.a.shape[1] = mm.b.shape[0] = mm.b.shape[1] = m->n;
    mm.dst.shape[0] = mm.dst.shape[1] = m->n;
    mm.a.stride[0] = mm.b.stride[0] = mm.dst.stride[0] = m->n;
    mm.a.stride[1] = mm.b.stride[1] = mm.dst.stride[1] = 1;
    err_clear(&e);
    if (cpu_mm_run(&mm, &e) == FL_OK) {
      sink = m->c[0];
      return;
    }
    m->onednn = 0;
  }
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, m->n, m->n, m->n, 1.0f, m->a, m->n,
              m->b, m->n, 0.0f, m->c, m->n);
  sink = m->c[0];
}

/* "oneDNN brg:avx512_core" from cpu_mm_describe's sentence. */
static void product_path(const mm_arg *m, char *out, size_t n) {
  if (m->onednn) {
    const char *d = cpu_mm_describe(), *k = strstr(d, "matmul, "), *end = k ? strstr(k, " kernels") : NULL;
    if (k && end) snprintf(out, n, "oneDNN %.*s", (int)(end - k - 8), k + 8);
    else snprintf(out, n, "oneDNN");
  } else {
    cpu_blas_info bi;
    cpu_blas_get_info(&bi);
    if (bi.core[0]) snprintf(out, n, "OpenBLAS sgemm (%s kernels)", bi.core);
    else snprintf(out, n, "BLAS sgemm");
  }
}

static int measure_product(roof_peaks *p, meas_summary *s, fl_err *e) {
  mm_arg m;
  size_t i, bytes;
  double t0, once;
  m.n = 1024;
  m.onednn = cpu_mm_enabled();
  cpu_blas_pick();
  for (;;) {
    bytes = (size_t)m.n * (size_t)m.n * sizeof(float);
    if (alloc3(&m.a, &m.b, &m.c, bytes, "product", e) != FL_OK) return e->code;
    for (i = 0; i < (size_t)m.n * (size_t)m.n; i++) {
      m.a[i] = (float)(i % 7) * 0.25f;
      m.b[i] = (float)(i % 5) * 0.5f;
    }
    product_once(&m);                          /* kernels chosen, threads up */
    t0 = meas_now();
    product_once(&m);
    once = meas_now() - t0;
    /* a machine this fast finishes 1024^3 in a few ms: timer and start-up
    ** costs would show, so a larger product (still within the budget) */
    if (once >= 0.004 || m.n >= 4096) break;
    free(m.a); free(m.b); free(m.c);
    m.n *= 2;
  }
  time_runs(product_once, &m, s);
  free(m.a); free(m.b); free(m.c);
  p->product_n = m.n;
  p->product_runs = s->n;
  p->product_spread = s->spread;
  p->product_gflops = s->median > 0 ? 2.0 * (double)m.n * m.n * m.n / (s->median * 1e6) : 0;
  product_path(&m, p->product_path, sizeof p->product_path);
  return FL_OK;
}

static int measure(roof_peaks *p, const machine *m, fl_err *e) {
  meas_summary sc, sp;
  char why[160];
  double t0 = meas_now();
  int rc;
  memset(p, 0, sizeof *p);
  if ((rc = measure_copy(p, &sc, e)) != FL_OK || (rc = measure_product(p, &sp, e)) != FL_OK)
    return rc;
  p->noisy = sc.noisy || sp.noisy;
  if (sc.noisy) snprintf(p->noise, sizeof p->noise, "bandwidth: %s", meas_noise_reason(&sc, why, sizeof why));
  if (sp.noisy)
    snprintf(p->noise + strlen(p->noise), sizeof p->noise - strlen(p->noise), "%sproduct: %s",
             sc.noisy ? "; " : "", meas_noise_reason(&sp, why, sizeof why));
  snprintf(p->cpu, sizeof p->cpu, "%s", m->cpu);
  p->threads = m->threads;
  p->measure_s = meas_now() - t0;
  if (!(p->copy_gbs > 0) || !(p->product_gflops > 0))
    return err_set(e, FL_EINVAL, "machine_peaks: the measurement gave no time (a clock that "
                   "does not move?)");
  return FL_OK;
}

/* ---- the peaks --------------------------------------------------------- */

int roof_machine_peaks(roof_peaks *out, int remeasure, fl_err *e) {
  machine m;
  char key[33], *text;
  void *data = NULL;
  size_t n = 0;
  roof_peaks p, old;
  int rc = FL_OK, have_old = 0;
  pthread_mutex_lock(&lock);
  identify(&m);
  /* memory: valid while the machine is set up as it was measured (the
  ** thread count can change within a process) */
  if (!remeasure && have_memo && memcmp(&memo_m, &m, sizeof m) == 0) {
    p = memo;
    p.from_cache = 1;
    p.measure_s = 0;
    goto done;
  }
  cache_key(&m, key);
  if (!remeasure && cache_get_blob(key, ROOF_EXT, &data, &n)) {
    have_old = from_json((const char *)data, &m, &old);
    free(data);
    if (have_old && (!old.noisy || old.tries >= ROOF_NOISY_TRIES)) {
      p = old;
      p.from_cache = 1;
      goto keep;
    }
  }
  if ((rc = measure(&p, &m, e)) != FL_OK) goto out;
  p.from_cache = 0;
  p.tries = 1;
  if (have_old) {
    /* busy then: each peak the better of the two, whether busy now or
    ** not (other work only slows a run down: a quiet run that came out
    ** lower was still slowed by something); measured again next time,
    ** while busy, until the tries are spent */
    p.tries = old.tries + 1;
    if (old.copy_gbs > p.copy_gbs) {
      p.copy_gbs = old.copy_gbs;
      p.copy_spread = old.copy_spread;
      p.copy_runs = old.copy_runs;
    }
    if (old.product_gflops > p.product_gflops) {
      p.product_gflops = old.product_gflops;
      p.product_spread = old.product_spread;
      p.product_runs = old.product_runs;
      p.product_n = old.product_n;
    }
  }
  /* a cache that cannot be written costs a measurement next time, no more */
  if ((text = to_json(&p, &m))) {
    (void)cache_put_blob(key, ROOF_EXT, text, strlen(text), NULL);
    cJSON_free(text);
  }
keep:
  memo = p;
  memo_m = m;
  have_memo = 1;
done:
  p.warning = cache_warning();
  *out = p;
out:
  pthread_mutex_unlock(&lock);
  return rc;
}

double roof_ridge(const roof_peaks *pk) {
  return pk->copy_gbs > 0 ? pk->product_gflops / pk->copy_gbs : 0;
}

double roof_attainable(const roof_peaks *pk, double intensity) {
  double bw = intensity * pk->copy_gbs;
  return bw < pk->product_gflops ? bw : pk->product_gflops;
}

const char *roof_bound_name(int bound) { return bound == ROOF_COMPUTE ? "compute" : "memory"; }

/* ---- kernels ---------------------------------------------------------------- */

void roof_kernel_at(const exec_program *pr, int k, double ms, const roof_peaks *pk,
                    roof_kernel *out) {
  const fk_kernel *kr = &pr->plan->kernels[k];
  roof_kernel_of(kr->name, fuse_kernel_flops(pr->plan->g, kr), kr->bytes, ms, pk, out);
}

void roof_kernel_of(const char *name, int64_t flops, int64_t bytes, double ms,
                    const roof_peaks *pk, roof_kernel *out) {
  memset(out, 0, sizeof *out);
  out->name = name;
  out->flops = flops;
  out->bytes = bytes;
  out->intensity = out->bytes > 0 ? (double)out->flops / (double)out->bytes : 0;
  out->bound = out->intensity >= roof_ridge(pk) && out->flops > 0 ? ROOF_COMPUTE : ROOF_MEMORY;
  out->attainable = roof_attainable(pk, out->intensity);
  out->ms = ms > 0 ? ms : 0;
  out->timed = ms > 0;
  if (!out->timed) return;
  out->gflops = (double)out->flops / (ms * 1e6);
  out->gbps = (double)out->bytes / (ms * 1e6);
  /* with no flops the roof is the bandwidth itself: the same share a
  ** memory-bound kernel's flops have of intensity x bandwidth */
  if (out->flops > 0 && out->attainable > 0) out->roof_pct = 100.0 * out->gflops / out->attainable;
  else if (pk->copy_gbs > 0) out->roof_pct = 100.0 * out->gbps / pk->copy_gbs;
}

int roof_program(const exec_program *pr, const roof_peaks *pk, roof_kernel *out, fl_err *e) {
  int k;
  if (!pr->kernel_ms || pr->profiled_runs <= 0)
    return err_set(e, FL_EINVAL, "roofline: the program has no kernel times: it was never run "
                   "with profiling on (k:profile(true), then k:run(...))");
  for (k = 0; k < pr->plan->nkernels; k++) {
    int64_t ran = pr->kernel_ran ? pr->kernel_ran[k] : pr->profiled_runs;
    roof_kernel_at(pr, k, ran > 0 ? pr->kernel_ms[k] / (double)ran : 0, pk, &out[k]);
  }
  return FL_OK;
}
