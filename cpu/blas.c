/*
** blas.c -- the BLAS kernel pick (blas.h).  OpenBLAS built with
** DYNAMIC_ARCH chooses its kernels once, at load, from the CPU id (or
** OPENBLAS_CORETYPE); an id it does not know gets the generic SSE3 set.
** Its exported gotoblas_dynamic_quit / gotoblas_dynamic_init redo that
** choice, reading OPENBLAS_CORETYPE again, so the right set is chosen from
** the CPU's feature bits before any product runs.  Found by dlsym: any
** other BLAS (or an OpenBLAS without them) is left as it is, and so is
** OpenBLAS's choice with FUSELAB_BLAS_PICK=0 (to measure the difference).
*/
#include <dlfcn.h>
#ifdef _OPENMP
#include <omp.h>
#endif
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "blas.h"

static pthread_once_t once = PTHREAD_ONCE_INIT;
static cpu_blas_info info;

/* 2: AVX-512 kernels, 1: AVX2 + FMA, 0: older, by a core's name */
static int tier_of(const char *core) {
  static const char *const avx512[] = {"SkylakeX", "CooperLake", "SapphireRapids", NULL};
  static const char *const avx2[] = {"Haswell", "Zen", NULL};
  int i;
  for (i = 0; avx512[i]; i++) if (strcasecmp(core, avx512[i]) == 0) return 2;
  for (i = 0; avx2[i]; i++) if (strcasecmp(core, avx2[i]) == 0) return 1;
  return 0;
}

/* what the CPU can run, by its feature bits (the kernels' needs) */
static int cpu_tier(void) {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq"))
    return 2;
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return 1;
#endif
  return 0;
}

/* OpenBLAS's OpenMP build sizes its work for the threads it asked for; a
** dynamic team (OMP_DYNAMIC=true: libgomp trims it by the load average)
** starts fewer, and the first product never returns (Debian's 0.3.21).  So
** dynamic teams are turned off, with a word, before the first product. */
static void no_dynamic_teams(void) {
#ifdef _OPENMP
  if (omp_get_dynamic()) {
    omp_set_dynamic(0);
    fprintf(stderr, "fuselab: warning: OMP_DYNAMIC is turned off: OpenBLAS's OpenMP build waits "
            "forever for the threads a dynamic team does not start\n");
  }
#endif
}

static void pick(void) {
  char *(*corename)(void) = (char *(*)(void))dlsym(RTLD_DEFAULT, "openblas_get_corename");
  char *(*config)(void) = (char *(*)(void))dlsym(RTLD_DEFAULT, "openblas_get_config");
  void (*quit)(void) = (void (*)(void))dlsym(RTLD_DEFAULT, "gotoblas_dynamic_quit");
  void (*init)(void) = (void (*)(void))dlsym(RTLD_DEFAULT, "gotoblas_dynamic_init");
  static const char *const best[] = {NULL, "Haswell", "SkylakeX"};
  int have, want;
  no_dynamic_teams();
  if (!corename) {
    snprintf(info.why, sizeof info.why, "not OpenBLAS: its own kernel choice is kept");
    return;
  }
  if (config) snprintf(info.config, sizeof info.config, "%s", config());
  snprintf(info.core, sizeof info.core, "%s", corename());
  have = tier_of(info.core);
  want = cpu_tier();
  if (getenv("FUSELAB_BLAS_PICK") && strcmp(getenv("FUSELAB_BLAS_PICK"), "0") == 0) {
    snprintf(info.why, sizeof info.why, "FUSELAB_BLAS_PICK=0: OpenBLAS's own pick (%s) is kept", info.core);
    return;
  }
  if (have >= want) {
    snprintf(info.why, sizeof info.why, "%s kernels match what this CPU runs", info.core);
    return;
  }
  if (!quit || !init || !strstr(info.config, "DYNAMIC_ARCH")) {
    snprintf(info.why, sizeof info.why, "%s kernels, below what this CPU runs (%s), and this "
             "OpenBLAS cannot switch: set OPENBLAS_CORETYPE=%s", info.core, best[want], best[want]);
    return;
  }
  snprintf(info.was, sizeof info.was, "%s", info.core);
  setenv("OPENBLAS_CORETYPE", best[want], 1);
  quit();
  init();
  snprintf(info.core, sizeof info.core, "%s", corename());
  snprintf(info.why, sizeof info.why, "OpenBLAS picked %s kernels for this CPU; it runs %s ones "
           "(%s), so %s were selected", info.was, best[want], want == 2 ? "AVX-512" : "AVX2 and FMA",
           info.core);
}

void cpu_blas_pick(void) { pthread_once(&once, pick); }

void cpu_blas_get_info(cpu_blas_info *out) {
  cpu_blas_pick();
  *out = info;
}
