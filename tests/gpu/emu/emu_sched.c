/*
** emu_sched.c -- CUDA threads as fibers, one block at a time.
** A thread runs until it reaches a collective (__syncthreads, a shuffle, a
** WMMA operation) or returns; when no thread can run, the collectives are
** resolved: a shuffle releases when every lane its mask names waits at
** that same shuffle, a barrier when every live thread of the block waits
** at the same one.  Anything else would hang or be undefined on a GPU,
** and fails the launch with a message naming kernel, block and threads.
** Invariant: a thread's stack is in use only from its start to its
** return; a returned thread's stack goes back to the pool at once, so a
** kernel without collectives runs on one stack, thread after thread.
** The switch is a few instructions of assembly on x86-64 (ucontext's
** swapcontext makes a system call per switch: 20x slower on reductions),
** ucontext elsewhere.
*/
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <cuda_runtime_api.h>

#include "emu.h"

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#define EMU_ASAN 1
#define STACK_SIZE (512 * 1024)
#else
#define EMU_ASAN 0
#define STACK_SIZE (64 * 1024)
#endif

#if !defined(__x86_64__)
#include <ucontext.h>
#endif

emu_thread_ids *emu_self;
emu_launch_dims emu_dims;

enum { T_NEW, T_READY, T_BAR, T_SHFL, T_WARP, T_DONE, T_FAULT };
static const char *const state_name[] = {"not started", "ready", "waiting at __syncthreads",
                                          "waiting at a shuffle", "waiting at a warp operation",
                                          "returned", "faulted"};

typedef struct stack { char *lo; size_t n; struct stack *next; } stack;

typedef struct thread {
  emu_thread_ids ids;
  unsigned lin;                /* linear index in the block */
  int state;
  int line;                    /* where it waits */
  const char *what;            /* the warp operation it waits at */
  unsigned mask;               /* the shuffle's mask */
  int mode, arg, width;        /* the shuffle */
  unsigned long long val, res; /* its value, what it receives */
  stack *st;
#if defined(__x86_64__)
  void *sp;
#else
  ucontext_t uc;
#endif
} thread;

static stack *pool;
static thread *th;
static size_t nth_cap;
static unsigned nth;
static thread *cur;
static void (*cur_entry)(void **);
static void **cur_args;
static const emu_kernel *cur_kernel;
static char *fault_msg;
static size_t fault_n;
static int failed;
static sigjmp_buf segv_jmp;
#if defined(__x86_64__)
static void *sched_sp;
#else
static ucontext_t sched_uc;
#endif
#if EMU_ASAN
static void *sched_fake;
static const void *sched_lo;
static size_t sched_n;
#endif

/* --- context switch ------------------------------------------------------------- */
#if defined(__x86_64__)
/* emu_switch(&save, to): pushes the callee-saved registers and the FPU
** control words, parks rsp in *save, and resumes the stack `to`. */
void emu_switch(void **save, void *to);
__asm__(".text\n"
        ".globl emu_switch\n"
        ".hidden emu_switch\n"
        ".type emu_switch,@function\n"
        "emu_switch:\n"
        "  pushq %rbp\n  pushq %rbx\n  pushq %r12\n  pushq %r13\n  pushq %r14\n  pushq %r15\n"
        "  subq $8, %rsp\n  stmxcsr (%rsp)\n  fnstcw 4(%rsp)\n"
        "  movq %rsp, (%rdi)\n  movq %rsi, %rsp\n"
        "  ldmxcsr (%rsp)\n  fldcw 4(%rsp)\n  addq $8, %rsp\n"
        "  popq %r15\n  popq %r14\n  popq %r13\n  popq %r12\n  popq %rbx\n  popq %rbp\n"
        "  ret\n"
        ".size emu_switch, .-emu_switch\n");
#endif

static void to_fiber(thread *t) {
#if EMU_ASAN
  __sanitizer_start_switch_fiber(&sched_fake, t->st->lo, t->st->n);
#endif
#if defined(__x86_64__)
  emu_switch(&sched_sp, t->sp);
#else
  swapcontext(&sched_uc, &t->uc);
#endif
#if EMU_ASAN
  __sanitizer_finish_switch_fiber(sched_fake, NULL, NULL);
#endif
}

/* back to the scheduler; a thread that is done never comes back */
static void to_sched(thread *t) {
#if EMU_ASAN
  void *fake = NULL;
  __sanitizer_start_switch_fiber(t->state == T_DONE || t->state == T_FAULT ? NULL : &fake,
                                 sched_lo, sched_n);
#endif
#if defined(__x86_64__)
  emu_switch(&t->sp, sched_sp);
#else
  swapcontext(&t->uc, &sched_uc);
#endif
#if EMU_ASAN
  __sanitizer_finish_switch_fiber(fake, NULL, NULL);
#endif
}

static void fiber_main(void) {
  thread *t = cur;
#if EMU_ASAN
  __sanitizer_finish_switch_fiber(NULL, &sched_lo, &sched_n);
#endif
  cur_entry(cur_args);
  t->state = T_DONE;
  to_sched(t);
  abort();   /* a returned thread is never resumed */
}

static stack *stack_get(void) {
  stack *s = pool;
  if (s) { pool = s->next; return s; }
  if (!(s = malloc(sizeof *s))) return NULL;
  s->n = STACK_SIZE;
  /* a guard page below: a kernel overflowing its stack faults */
  s->lo = mmap(NULL, s->n + 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (s->lo == MAP_FAILED) { free(s); return NULL; }
  mprotect(s->lo, 4096, PROT_NONE);
  s->lo += 4096;
  return s;
}

static void stack_put(stack *s) {
#if EMU_ASAN
  /* a thread abandoned mid-kernel leaves its frames' poison behind */
  ASAN_UNPOISON_MEMORY_REGION(s->lo, s->n);
#endif
  s->next = pool;
  pool = s;
}

static int start(thread *t) {
  if (!(t->st = stack_get())) return -1;
#if defined(__x86_64__)
  {
    uint64_t *sp = (uint64_t *)(((uintptr_t)t->st->lo + t->st->n) & ~(uintptr_t)15);
    int i;
    *--sp = 0;                         /* fiber_main's return address: none */
    *--sp = (uint64_t)(uintptr_t)fiber_main;
    for (i = 0; i < 6; i++) *--sp = 0; /* rbp rbx r12 r13 r14 r15 */
    *--sp = 0x0000037f00001f80ull;     /* default MXCSR and x87 control word */
    t->sp = sp;
  }
#else
  getcontext(&t->uc);
  t->uc.uc_stack.ss_sp = t->st->lo;
  t->uc.uc_stack.ss_size = t->st->n;
  t->uc.uc_link = NULL;
  makecontext(&t->uc, fiber_main, 0);
#endif
  t->state = T_READY;
  return 0;
}

/* --- errors ---------------------------------------------------------------------- */

static void fail(const char *fmt, ...) {
  va_list ap;
  int at;
  if (failed) return;
  failed = 1;
  at = snprintf(fault_msg, fault_n, "kernel %s, block (%u,%u,%u): ", cur_kernel->name,
                emu_dims.block.x, emu_dims.block.y, emu_dims.block.z);
  if (at < 0 || (size_t)at >= fault_n) return;
  va_start(ap, fmt);
  vsnprintf(fault_msg + at, fault_n - at, fmt, ap);
  va_end(ap);
}

static const char *tid_str(const thread *t, char *b, size_t n) {
  snprintf(b, n, "thread (%u,%u,%u)", t->ids.tid.x, t->ids.tid.y, t->ids.tid.z);
  return b;
}

static void where(const thread *t, char *b, size_t n) {
  char tb[64];
  if (t->state == T_BAR || t->state == T_SHFL)
    snprintf(b, n, "%s is %s at line %d", tid_str(t, tb, sizeof tb), state_name[t->state], t->line);
  else if (t->state == T_WARP)
    snprintf(b, n, "%s is waiting at %s", tid_str(t, tb, sizeof tb), t->what);
  else
    snprintf(b, n, "%s has %s", tid_str(t, tb, sizeof tb), state_name[t->state]);
}

void emu_fault(const char *fmt, ...) {
  char b[400];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(b, sizeof b, fmt, ap);
  va_end(ap);
  if (!cur) { fprintf(stderr, "fuselab emu: %s\n", b); return; }
  {
    char tb[64];
    fail("%s: %s", tid_str(cur, tb, sizeof tb), b);
  }
  cur->state = T_FAULT;
  to_sched(cur);
  abort();
}

/* --- the collectives, called by device code ---------------------------------------- */

void emu_syncthreads(int line) {
  thread *t = cur;
  t->state = T_BAR;
  t->line = line;
  to_sched(t);
}

unsigned long long emu_shfl(int line, unsigned mask, unsigned long long v, int mode, int arg,
                            int width) {
  thread *t = cur;
  t->state = T_SHFL;
  t->line = line;
  t->mask = mask;
  t->val = v;
  t->mode = mode;
  t->arg = arg;
  t->width = width;
  to_sched(t);
  return t->res;
}

void emu_warp_sync(int line, const char *what) {
  thread *t = cur;
  t->state = T_WARP;
  t->line = line;
  t->what = what;
  to_sched(t);
}

/* The lane whose value lane l (warp-relative) of a shuffle receives. */
static unsigned shfl_source(const thread *t, unsigned l) {
  const unsigned w = t->width > 0 && t->width <= 32 ? (unsigned)t->width : 32;
  const unsigned base = l & ~(w - 1);
  switch (t->mode) {
  case 0: return base + ((unsigned)t->arg & (w - 1));
  case 1: return l - base >= (unsigned)t->arg ? l - (unsigned)t->arg : l;
  case 2: return l + (unsigned)t->arg < base + w ? l + (unsigned)t->arg : l;
  default: { unsigned s = l ^ (unsigned)t->arg; return s < base + w ? s : l; }
  }
}

/* Releases the warp collectives that can complete: 1 if some did, 0 if
** none waits, -1 on an error. */
static int resolve_warps(void) {
  unsigned w, l, any = 0;
  char b1[160], b2[160];
  for (w = 0; w * 32 < nth; w++) {
    thread *W = th + w * 32, *f = NULL;
    const unsigned nl = nth - w * 32 < 32 ? nth - w * 32 : 32;
    for (l = 0; l < nl && !f; l++)
      if (W[l].state == T_SHFL || W[l].state == T_WARP) f = &W[l];
    if (!f) continue;
    if (f->state == T_WARP) {
      /* WMMA and __syncwarp: the whole warp, at the same operation */
      for (l = 0; l < nl; l++)
        if (W[l].state != T_WARP || W[l].line != f->line || W[l].what != f->what) {
          where(f, b1, sizeof b1);
          where(&W[l], b2, sizeof b2);
          fail("warp %u diverges at a warp-collective operation: %s, but %s", w, b1, b2);
          return -1;
        }
      for (l = 0; l < nl; l++) W[l].state = T_READY;
      any = 1;
      continue;
    }
    /* a shuffle: the lanes of its mask, at the same shuffle */
    for (l = 0; l < 32; l++) {
      thread *t;
      if (!(f->mask >> l & 1)) continue;
      if (l >= nl) {
        fail("warp %u: shuffle at line %d names lane %u in mask 0x%08x, but the block has %u "
             "threads (blockDim must fill the warps the mask names)", w, f->line, l, f->mask, nth);
        return -1;
      }
      t = &W[l];
      if (t->state != T_SHFL || t->line != f->line || t->mask != f->mask) {
        where(f, b1, sizeof b1);
        where(t, b2, sizeof b2);
        fail("warp %u diverges at a shuffle (mask 0x%08x): %s, but %s", w, f->mask, b1, b2);
        return -1;
      }
    }
    for (l = 0; l < nl; l++) {
      thread *t = &W[l];
      unsigned s;
      if (!(f->mask >> l & 1)) continue;
      s = shfl_source(t, l);
      if (!(f->mask >> s & 1)) {
        fail("warp %u: shuffle at line %d: lane %u reads lane %u, which is not in mask 0x%08x",
             w, f->line, l, s, f->mask);
        return -1;
      }
      t->res = W[s].val;
    }
    for (l = 0; l < nl; l++)
      if (f->mask >> l & 1) W[l].state = T_READY;
    any = 1;
  }
  return any ? 1 : 0;
}

/* After a pass in which no thread could run: 1 when something was
** released, 0 when the block is done, -1 on an error. */
static int resolve(void) {
  unsigned i, nbar = 0;
  thread *b = NULL, *d = NULL;
  char b1[160], b2[160];
  int r = resolve_warps();
  if (r) return r;
  for (i = 0; i < nth; i++) {
    if (th[i].state == T_BAR) { nbar++; if (!b) b = &th[i]; }
    else if (th[i].state == T_DONE && !d) d = &th[i];
  }
  if (!nbar) return 0;
  if (d) {
    where(b, b1, sizeof b1);
    where(d, b2, sizeof b2);
    fail("__syncthreads divergence: %s, but %s (every thread of the block must reach it)", b1, b2);
    return -1;
  }
  for (i = 0; i < nth; i++)
    if (th[i].line != b->line) {
      where(b, b1, sizeof b1);
      where(&th[i], b2, sizeof b2);
      fail("__syncthreads divergence: %s, but %s", b1, b2);
      return -1;
    }
  for (i = 0; i < nth; i++) th[i].state = T_READY;
  return 1;
}

/* --- blocks and the grid ------------------------------------------------------------- */

static void segv(int sig, siginfo_t *si, void *uc) {
  (void)uc;
  fail("%s at address %p%s", sig == SIGBUS ? "bus error" : "invalid memory access", si->si_addr,
       cur ? "" : " (outside device code)");
  siglongjmp(segv_jmp, 1);
}

/* a permutation of 0..n-1 for an order */
static void permute(unsigned *p, unsigned n, int order, uint64_t salt) {
  unsigned i;
  uint64_t s = (uint64_t)order * 0x9e3779b97f4a7c15ull ^ salt;
  for (i = 0; i < n; i++) p[i] = order == 1 ? n - 1 - i : i;
  if (order < 2) return;
  for (i = n; i > 1; i--) {
    unsigned j;
    s ^= s << 13; s ^= s >> 7; s ^= s << 17;
    j = (unsigned)(s % i);
    { unsigned t = p[i - 1]; p[i - 1] = p[j]; p[j] = t; }
  }
}

static void release_stacks(void) {
  unsigned i;
  for (i = 0; i < nth; i++)
    if (th[i].st) { stack_put(th[i].st); th[i].st = NULL; }
}

static int run_block(const unsigned *perm, char *sh0, char *sh1) {
  unsigned o;
  if (sh1 > sh0) memset(sh0, 0xff, (size_t)(sh1 - sh0));   /* NaN, as uninitialized */
  for (o = 0; o < nth; o++) { th[o].state = T_NEW; th[o].st = NULL; }
  for (;;) {
    int r;
    for (o = 0; o < nth; o++) {
      thread *t = &th[perm[o]];
      if (t->state == T_NEW && start(t) != 0) {
        fail("cannot allocate a thread stack");
        break;
      }
      if (t->state != T_READY) continue;
      cur = t;
      emu_self = &t->ids;
      to_fiber(t);
      cur = NULL;
      if (t->state == T_DONE) { stack_put(t->st); t->st = NULL; }
      if (failed) break;
    }
    if (failed) break;
    if ((r = resolve()) < 0) break;
    if (r == 0) return 0;
  }
  release_stacks();
  return -1;
}

int emu_run_grid(const emu_kernel *k, const unsigned grid[3], const unsigned block[3],
                 void **args, int order, char *msg, size_t n) {
  const unsigned nb = grid[0] * grid[1] * grid[2];
  unsigned *bperm = NULL, *tperm = NULL, i;
  char *sh0 = NULL, *sh1 = NULL;
  struct sigaction sa, old_segv, old_bus;
  static char altstack[64 * 1024];
  stack_t ss = {0}, old_ss;
  int rc = 0;
  nth = block[0] * block[1] * block[2];
  if (nth > nth_cap) {
    thread *t = realloc(th, nth * sizeof *t);
    if (!t) { snprintf(msg, n, "out of memory"); return cudaErrorMemoryAllocation; }
    th = t;
    nth_cap = nth;
  }
  if (!(bperm = malloc(nb * sizeof *bperm)) || !(tperm = malloc(nth * sizeof *tperm))) {
    free(bperm);
    snprintf(msg, n, "out of memory");
    return cudaErrorMemoryAllocation;
  }
  permute(bperm, nb, order, 1);
  permute(tperm, nth, order, 2);
  memset(th, 0, nth * sizeof *th);
  for (i = 0; i < nth; i++) {
    th[i].lin = i;
    th[i].ids.tid.x = i % block[0];
    th[i].ids.tid.y = i / block[0] % block[1];
    th[i].ids.tid.z = i / (block[0] * block[1]);
    th[i].ids.lane = i % 32;
  }
  if (k->shared) k->shared(&sh0, &sh1);
  cur_kernel = k;
  cur_entry = k->entry;
  cur_args = args;
  fault_msg = msg;
  fault_n = n;
  failed = 0;
  emu_dims.bdim.x = block[0]; emu_dims.bdim.y = block[1]; emu_dims.bdim.z = block[2];
  emu_dims.gdim.x = grid[0]; emu_dims.gdim.y = grid[1]; emu_dims.gdim.z = grid[2];
  /* a wild pointer in a kernel fails the launch instead of the process
  ** (ASan has its own handler, and reports better) */
  if (!EMU_ASAN) {
    ss.ss_sp = altstack;
    ss.ss_size = sizeof altstack;
    sigaltstack(&ss, &old_ss);
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = segv;
    sa.sa_flags = SA_SIGINFO | SA_ONSTACK;
    sigaction(SIGSEGV, &sa, &old_segv);
    sigaction(SIGBUS, &sa, &old_bus);
  }
  if (sigsetjmp(segv_jmp, 1)) {
    cur = NULL;
    release_stacks();
    rc = cudaErrorIllegalAddress;
    goto done;
  }
  for (i = 0; i < nb; i++) {
    const unsigned b = bperm[i];
    emu_dims.block.x = b % grid[0];
    emu_dims.block.y = b / grid[0] % grid[1];
    emu_dims.block.z = b / (grid[0] * grid[1]);
    if (run_block(tperm, sh0, sh1) != 0) { rc = cudaErrorLaunchFailure; break; }
  }
done:
  if (!EMU_ASAN) {
    sigaction(SIGSEGV, &old_segv, NULL);
    sigaction(SIGBUS, &old_bus, NULL);
    sigaltstack(&old_ss, NULL);
  }
  emu_self = NULL;
  free(bperm);
  free(tperm);
  return rc;
}
