/*
** mm.c -- products through oneDNN's matmul (mm.h).  Invariant: a layout
** (ranks, shapes, strides, bias, post-ops and their operands' layouts) is
** made into a primitive once; the entry keeps the primitive, its memory
** objects and its scratchpad, and a call only sets the data pointers and
** executes.  A layout oneDNN refuses is remembered as refused, so the
** caller's fallback costs no second attempt.  One lock covers lookup and
** execution: the memory objects are per entry, and the products run on
** every OpenMP thread anyway (the smallest on one, CPU_MM_PAR_MIN).
*/
#include "config.h"

#ifdef _OPENMP
#include <omp.h>
#endif
#include <pthread.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#include "../exec/measure.h"
#include "../graph/env.h"
#include "mm.h"

#ifdef HAVE_DNNL
#include <oneapi/dnnl/dnnl.h>

/* what makes two calls the same primitive: everything but the pointers */
typedef struct key {
  int nd, bias, npost;
  int64_t dims[3 + CPU_MM_MAXPOST][2][CPU_MM_MAXD];   /* a, b, dst, posts: shape, stride */
  int kind[CPU_MM_MAXPOST];
  float ab[CPU_MM_MAXPOST][2];
} key;

/* one primitive and what running it needs */
typedef struct prim {
  dnnl_primitive_t p;
  dnnl_memory_t mem[4 + CPU_MM_MAXPOST];  /* a, b, dst, bias, post operands */
  dnnl_memory_t scratch;
  void *scratch_buf;
  int nargs;
  dnnl_exec_arg_t args[6 + CPU_MM_MAXPOST];
} prim;

typedef struct entry {
  key k;                       /* first: the cache compares an entry's first bytes */
  int refused;                 /* oneDNN cannot make it: the caller falls back */
  prim plain;                  /* b laid out as the caller has it */
  /* the same product reading b in the layout oneDNN picks for it, for
  ** weights kept packed (packed_b); pack: 0 not tried, 1 made, -1 no
  ** layout better than the caller's, or refused */
  int pack;
  prim packed;
  dnnl_primitive_t reorder;    /* b -> its packed layout */
  dnnl_memory_t rfrom, rto;
  dnnl_memory_desc_t pmd;      /* that layout */
} entry;

#define NCACHE 256             /* layouts kept; past it the oldest goes */

/* A cache of primitives, one per key: products and convolutions each have
** one.  An entry's key is its first member (compared as bytes: keys are
** memset before they are filled); make fills the rest of a zeroed entry
** from the call (a refusal is remembered in the entry, not here), drop
** frees an entry and what it holds.  Past NCACHE entries the oldest goes:
** a ring, so an entry that is used often is made again all the same. */
typedef struct pcache {
  size_t keysize, entsize;
  void (*make)(void *en, const void *call);
  void (*drop)(void *en);
  void *en[NCACHE];
  uint64_t hash[NCACHE];
  int n, next_evict;
} pcache;

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static dnnl_engine_t engine;
static dnnl_stream_t stream;
static int state;              /* 0 not tried, 1 ready, -1 oneDNN unusable */
static int64_t ncalls, nposts, nreordered;       /* under lock */
static char last_impl[32];           /* the kernels of the last product made */

/* The entry of key k, made from call where there is none; NULL where
** memory is short.  Under lock. */
static void *pcache_get(pcache *c, const void *k, const void *call) {
  /* on every call: a byte-wise hash of a convolution's 224-byte key
  ** took 0.2 us of each (60 small convolutions: 143-145 -> 130-133 us) */
  uint64_t h = XXH3_64bits(k, c->keysize);
  void *en;
  int i;
  for (i = 0; i < c->n; i++)
    if (c->hash[i] == h && memcmp(c->en[i], k, c->keysize) == 0) return c->en[i];
  if (!(en = calloc(1, c->entsize))) return NULL;
  memcpy(en, k, c->keysize);
  c->make(en, call);
  if (c->n < NCACHE) i = c->n++;
  else {
    i = c->next_evict;
    c->drop(c->en[i]);
    c->next_evict = (c->next_evict + 1) % NCACHE;
  }
  c->en[i] = en;
  c->hash[i] = h;
  return en;
}

static void prim_free(prim *pr) {
  int i;
  if (pr->p) dnnl_primitive_destroy(pr->p);
  for (i = 0; i < 4 + CPU_MM_MAXPOST; i++)
    if (pr->mem[i]) dnnl_memory_destroy(pr->mem[i]);
  if (pr->scratch) dnnl_memory_destroy(pr->scratch);
  free(pr->scratch_buf);
  memset(pr, 0, sizeof *pr);
}

static void entry_free(void *p) {
  entry *en = p;
  if (!en) return;
  prim_free(&en->plain);
  prim_free(&en->packed);
  if (en->reorder) dnnl_primitive_destroy(en->reorder);
  if (en->rfrom) dnnl_memory_destroy(en->rfrom);
  if (en->rto) dnnl_memory_destroy(en->rto);
  free(en);
}

static int md_of(dnnl_memory_desc_t *md, int nd, const int64_t *shape, const int64_t *stride) {
  dnnl_dims_t d, s;
  int i;
  for (i = nd - 1; i >= 0; i--) {
    int j;
    d[i] = shape[i];
    s[i] = stride[i];
    if (shape[i] != 1) continue;
    /* a size-1 dim's stride means nothing; oneDNN wants one past the
    ** dims inside it */
    for (s[i] = 1, j = i + 1; j < nd; j++)
      if (d[j] * s[j] > s[i]) s[i] = d[j] * s[j];
  }
  return dnnl_memory_desc_init_by_strides(md, nd, d, dnnl_f32, s) == dnnl_success;
}

static dnnl_alg_kind_t eltwise_alg(int kind, float *alpha, float *beta) {
  *alpha = 0.0f; *beta = 0.0f;
  switch (kind) {
  case CPU_MM_RELU: return dnnl_eltwise_relu;
  case CPU_MM_GELU_TANH: return dnnl_eltwise_gelu_tanh;
  case CPU_MM_TANH: return dnnl_eltwise_tanh;
  case CPU_MM_SIGMOID: return dnnl_eltwise_logistic;
  case CPU_MM_SILU: *alpha = 1.0f; return dnnl_eltwise_swish;
  case CPU_MM_EXP: return dnnl_eltwise_exp;
  case CPU_MM_HARDSWISH: return dnnl_eltwise_hardswish;
  default: return dnnl_eltwise_linear;
  }
}

/* The [1, n, 1, 1] operand of a per-channel post-op. */
static int chan_md(dnnl_memory_desc_t *md, const cpu_mm_post *p) {
  dnnl_dims_t d = {1, p->src.shape[0], 1, 1};
  return dnnl_memory_desc_init_by_tag(md, 4, d, dnnl_f32, dnnl_abcd) == dnnl_success;
}

/* A call's post-ops, in order, appended to ops: post[sum] as oneDNN's sum
** (its operand put in dst first; -1: none), post[skip] left out (-1:
** none), a per-channel one reading a [1, C, 1, 1] operand, another binary
** one reading *bin[i], the rest elementwise.  The one place products,
** convolutions and the matmul form of 1x1s build them.  1 when done. */
static int posts_append(dnnl_post_ops_t ops, const cpu_mm_post *post, int n, int sum, int skip,
                        const dnnl_memory_desc_t *const *bin) {
  int i;
  for (i = 0; i < n; i++) {
    const cpu_mm_post *p = &post[i];
    dnnl_memory_desc_t cmd;
    dnnl_status_t s;
    if (i == skip) continue;
    if (i == sum) {
      s = dnnl_post_ops_append_sum(ops, 1.0f);
    } else if (p->kind == CPU_MM_ADD || p->kind == CPU_MM_MUL) {
      s = dnnl_post_ops_append_binary(ops, p->kind == CPU_MM_ADD ? dnnl_binary_add : dnnl_binary_mul, bin[i]);
    } else if (p->kind == CPU_MM_ADD_C || p->kind == CPU_MM_MUL_C) {
      /* a batch norm's scale and shift, one value per channel */
      if (!chan_md(&cmd, p)) return 0;
      s = dnnl_post_ops_append_binary(ops, p->kind == CPU_MM_ADD_C ? dnnl_binary_add : dnnl_binary_mul, &cmd);
    } else {
      float al, be;
      dnnl_alg_kind_t alg = eltwise_alg(p->kind, &al, &be);
      if (p->kind == CPU_MM_AFFINE) { al = p->alpha; be = p->beta; }
      s = dnnl_post_ops_append_eltwise(ops, 1.0f, alg, al, be);
    }
    if (s != dnnl_success) return 0;
  }
  return 1;
}

/* The scratchpad pd asks for, in a buffer of our own (*mem over *buf), as
** the next of args (*nargs of them); 0 when memory is short. */
static int scratch_make(const_dnnl_primitive_desc_t pd, dnnl_memory_t *mem, void **buf,
                        dnnl_exec_arg_t *args, int *nargs) {
  const dnnl_memory_desc_t *smd = dnnl_primitive_desc_query_md(pd, dnnl_query_scratchpad_md, 0);
  size_t n;
  if (!smd || !(n = dnnl_memory_desc_get_size(smd))) return 1;
  if (!(*buf = aligned_alloc(64, (n + 63) / 64 * 64))) return 0;
  if (dnnl_memory_create(mem, smd, engine, *buf) != dnnl_success) {
    *mem = NULL;
    return 0;
  }
  args[*nargs].arg = DNNL_ARG_SCRATCHPAD;
  args[(*nargs)++].memory = *mem;
  return 1;
}

/* What making a primitive takes, and leaves once it is made (NULLs ok). */
static void made_free(dnnl_primitive_desc_t pd, dnnl_post_ops_t ops, dnnl_primitive_attr_t attr) {
  if (pd) dnnl_primitive_desc_destroy(pd);
  if (ops) dnnl_post_ops_destroy(ops);
  if (attr) dnnl_primitive_attr_destroy(attr);
}

/* Make the primitive of the call m into pr; with any_b, b in the layout
** oneDNN picks, written to *chosen (and the caller's to *plain).  1 when
** made; on 0, what was made is left for prim_free. */
static int prim_make(prim *pr, const cpu_mm *m, int any_b, dnnl_memory_desc_t *plain,
                     dnnl_memory_desc_t *chosen) {
  dnnl_memory_desc_t amd, bmd, cmd, biasmd, pmd[CPU_MM_MAXPOST];
  const dnnl_memory_desc_t *bin[CPU_MM_MAXPOST];
  dnnl_matmul_desc_t desc;
  dnnl_primitive_attr_t attr = NULL;
  dnnl_post_ops_t ops = NULL;
  dnnl_primitive_desc_t pd = NULL;
  int nd = m->nd, i, ok = 0;
  if (!md_of(&amd, nd, m->a.shape, m->a.stride) || !md_of(&bmd, nd, m->b.shape, m->b.stride) ||
      !md_of(&cmd, nd, m->dst.shape, m->dst.stride))
    return 0;
  if (plain) *plain = bmd;
  if (any_b) {
    dnnl_dims_t bd;
    memcpy(bd, bmd.dims, sizeof bd);
    if (dnnl_memory_desc_init_by_tag(&bmd, nd, bd, dnnl_f32, dnnl_format_tag_any) != dnnl_success) return 0;
  }
  if (m->bias) {
    int64_t bs[CPU_MM_MAXD], bst[CPU_MM_MAXD];
    for (i = 0; i < nd; i++) { bs[i] = 1; bst[i] = 0; }
    bs[nd - 1] = m->dst.shape[nd - 1];
    bst[nd - 1] = 1;
    if (!md_of(&biasmd, nd, bs, bst)) return 0;
  }
  if (dnnl_matmul_desc_init(&desc, &amd, &bmd, m->bias ? &biasmd : NULL, &cmd) != dnnl_success) return 0;
  if (dnnl_primitive_attr_create(&attr) != dnnl_success) return 0;
  if (dnnl_primitive_attr_set_scratchpad_mode(attr, dnnl_scratchpad_mode_user) != dnnl_success) goto done;
  if (m->npost) {
    for (i = 0; i < m->npost; i++) {
      const cpu_mm_post *p = &m->post[i];
      bin[i] = &pmd[i];      /* an addend or factor, read with its strides */
      if ((p->kind == CPU_MM_ADD || p->kind == CPU_MM_MUL) && !md_of(&pmd[i], nd, p->src.shape, p->src.stride))
        goto done;
    }
    if (dnnl_post_ops_create(&ops) != dnnl_success || !posts_append(ops, m->post, m->npost, -1, -1, bin) ||
        dnnl_primitive_attr_set_post_ops(attr, ops) != dnnl_success)
      goto done;
  }
  if (dnnl_primitive_desc_create(&pd, &desc, attr, engine, NULL) != dnnl_success) { pd = NULL; goto done; }
  if (dnnl_primitive_create(&pr->p, pd) != dnnl_success) { pr->p = NULL; goto done; }
  if (any_b) *chosen = bmd = *dnnl_primitive_desc_query_md(pd, dnnl_query_weights_md, 0);
  {
    const char *impl = NULL;
    if (dnnl_primitive_desc_query(pd, dnnl_query_impl_info_str, 0, &impl) == dnnl_success && impl)
      snprintf(last_impl, sizeof last_impl, "%s", impl);
  }
#define MEM(slot, mdp, argid) do { \
    if (dnnl_memory_create(&pr->mem[slot], (mdp), engine, DNNL_MEMORY_NONE) != dnnl_success) { \
      pr->mem[slot] = NULL; goto done; } \
    pr->args[pr->nargs].arg = (argid); pr->args[pr->nargs++].memory = pr->mem[slot]; } while (0)
  MEM(0, &amd, DNNL_ARG_SRC);
  MEM(1, &bmd, DNNL_ARG_WEIGHTS);
  MEM(2, &cmd, DNNL_ARG_DST);
  if (m->bias) MEM(3, &biasmd, DNNL_ARG_BIAS);
  for (i = 0; i < m->npost; i++)
    if (m->post[i].kind == CPU_MM_ADD || m->post[i].kind == CPU_MM_MUL)
      MEM(4 + i, &pmd[i], DNNL_ARG_ATTR_MULTIPLE_POST_OP(i) | DNNL_ARG_SRC_1);
#undef MEM
  ok = scratch_make(pd, &pr->scratch, &pr->scratch_buf, pr->args, &pr->nargs);
done:
  made_free(pd, ops, attr);
  return ok;
}

/* Make the primitive of en->k (the call m gives the layouts). */
static void entry_make(void *p, const void *call) {
  entry *en = p;
  en->refused = !prim_make(&en->plain, call, 0, NULL, NULL);
}

static void key_of(key *k, const cpu_mm *m) {
  const cpu_mm_arg *ops[3];
  int i, j;
  memset(k, 0, sizeof *k);
  k->nd = m->nd;
  k->bias = m->bias != NULL;
  k->npost = m->npost;
  ops[0] = &m->a; ops[1] = &m->b; ops[2] = &m->dst;
  for (i = 0; i < 3 + m->npost; i++) {
    const cpu_mm_arg *o = i < 3 ? ops[i] : &m->post[i - 3].src;
    if (i >= 3 && m->post[i - 3].kind != CPU_MM_ADD && m->post[i - 3].kind != CPU_MM_MUL) continue;
    for (j = 0; j < m->nd; j++) {
      k->dims[i][0][j] = o->shape[j];
      k->dims[i][1][j] = o->shape[j] == 1 ? 0 : o->stride[j];
    }
  }
  for (i = 0; i < m->npost; i++) {
    k->kind[i] = m->post[i].kind;
    if (m->post[i].kind == CPU_MM_AFFINE) {
      k->ab[i][0] = m->post[i].alpha;
      k->ab[i][1] = m->post[i].beta;
    }
  }
}

_Static_assert(offsetof(entry, k) == 0, "an entry's key comes first");
static pcache cache = {sizeof(key), sizeof(entry), entry_make, entry_free, {0}, {0}, 0, 0};

/* --- weights kept packed ----------------------------------------------
** A linear's weight is b read in place, [K, N] with strides (1, K), and a
** convolution's weights are oihw: every call, oneDNN's kernels copy them
** into their blocked layout first.  Where the same unchanged weight comes
** a second time, that copy is made once (a reorder into the layout the
** primitive picks) and kept, and the next calls read it (bench/packed.lua:
** each product 3-6 % faster).  A weight is known by its storage's id,
** never reused, and its version, which every in-place write moves on
** (ten_wrote): a changed weight is seen once again and packed again from
** its next call.  Activations are new storage every call, so they are only
** ever seen once.  One copy per weight, with its layout: every primitive
** that picks that layout reads it (products of any row count, a dynamic
** sequence length); one that picks another lays it out again for itself.
** A copy goes when its weight's storage is freed (the free hook).  The
** copies hold at most FUSELAB_PACK_MB MiB (default 256); weights past
** that are read in place: nothing is evicted, so a model larger than the
** bound cannot make every call pack again. */
typedef struct pslot {
  uint64_t id, version;        /* 0: free */
  const void *src;             /* the weight's element 0 (a view's offset) */
  dnnl_memory_desc_t from;     /* the layout it was read in: one storage is
                                  read as w and as w^T (a square linear's
                                  weight forward and in its gradient) */
  dnnl_memory_desc_t md;       /* buf's layout */
  void *buf;                   /* NULL: seen once */
} pslot;

#define NPACK 256
static pslot packs[NPACK];     /* under lock */
static int pack_next;          /* where the search for a free slot starts */
static int64_t pack_bytes, pack_calls, pack_made;   /* pack_made: copies made (reorders) */

static int64_t pack_limit(void) {
  static int64_t limit = -1;
  if (limit < 0) {
    limit = (int64_t)(env_number("FUSELAB_PACK_MB", 256, 1 << 30, 0, "megabytes") * 1048576.0);
  }
  return limit;
}

/* a copy's bytes in layout md, whole 64-byte lines */
static int64_t kept_bytes(const dnnl_memory_desc_t *md) {
  return (int64_t)((dnnl_memory_desc_get_size(md) + 63) / 64 * 64);
}

static void slot_drop_buf(pslot *s) {
  if (s->buf) pack_bytes -= kept_bytes(&s->md);
  free(s->buf);
  s->buf = NULL;
}

/* A kept weight's storage is freed (graph/tensor.c's free hook). */
static void packs_storage_freed(uint64_t id) {
  int i;
  pthread_mutex_lock(&lock);
  for (i = 0; i < NPACK; i++)
    if (packs[i].id == id) {
      slot_drop_buf(&packs[i]);
      packs[i].id = 0;
    }
  pthread_mutex_unlock(&lock);
}

/* A slot for a weight seen for the first time: a free one, else one only
** seen once, else (every slot holding a copy) the next in turn. */
static pslot *slot_new(void) {
  int i, k;
  for (k = 0; k < 2; k++)
    for (i = 0; i < NPACK; i++) {
      pslot *s = &packs[(pack_next + i) % NPACK];
      if (k == 0 ? s->id == 0 : s->buf == NULL) {
        pack_next = (pack_next + i + 1) % NPACK;
        return s;
      }
    }
  pack_next = (pack_next + 1) % NPACK;
  return &packs[pack_next];
}

/* The slot of the weight at src in st, read in layout from and packed
** into md, where it was seen so before with the values it has now; else
** it is recorded as seen once, and NULL.  A weight read two ways (a
** linear's forward reads w^T, its input's gradient w) has a slot for
** each: alternating steps of training do not pack it again and again.
** Under lock. */
static pslot *kept_find(fl_storage *st, const void *src, const dnnl_memory_desc_t *from,
                        const dnnl_memory_desc_t *md) {
  pslot *s = NULL;
  int i;
  if (!st || pack_limit() == 0) return NULL;
  for (i = 0; i < NPACK && !s; i++)
    if (packs[i].id == st->id && packs[i].src == src && dnnl_memory_desc_equal(&packs[i].from, from) &&
        dnnl_memory_desc_equal(&packs[i].md, md))
      s = &packs[i];
  if (s && s->version == st->version) return s;
  if (!s) s = slot_new();
  slot_drop_buf(s);
  s->id = st->id;
  s->version = st->version;
  s->src = src;
  s->from = *from;
  s->md = *md;
  return NULL;
}

/* Was the weight at src in st seen before, in any layout?  Else it is
** recorded (an activation is only ever seen once: no packed primitive is
** made for it).  Under lock. */
static int kept_seen(fl_storage *st, const void *src) {
  pslot *s;
  int i;
  if (!st || pack_limit() == 0) return 0;
  for (i = 0; i < NPACK; i++)
    if (packs[i].id == st->id && packs[i].src == src) return 1;
  s = slot_new();
  slot_drop_buf(s);
  memset(s, 0, sizeof *s);
  s->id = st->id;
  s->version = st->version;
  s->src = src;
  return 0;
}

/* s's weight in layout md, through reorder (from: the weight,
** set by the caller; to: set here to the copy) where the kept one has
** another layout or there is none yet; NULL past the bound or when memory
** is short.  Under lock. */
static void *kept_copy(pslot *s, fl_storage *st, const dnnl_memory_desc_t *md,
                       dnnl_primitive_t reorder, dnnl_memory_t from, dnnl_memory_t to) {
  dnnl_exec_arg_t a[2] = {{DNNL_ARG_FROM, from}, {DNNL_ARG_TO, to}};
  const dnnl_memory_desc_t *fmd;
  if (dnnl_memory_get_memory_desc(from, &fmd) != dnnl_success) return NULL;
  if (s->buf && dnnl_memory_desc_equal(&s->md, md) && dnnl_memory_desc_equal(&s->from, fmd)) {
    dnnl_memory_set_data_handle(to, s->buf);
    return s->buf;
  }
  slot_drop_buf(s);                       /* laid out for another primitive */
  if (pack_bytes + kept_bytes(md) > pack_limit() || !(s->buf = aligned_alloc(64, (size_t)kept_bytes(md))))
    return NULL;
  dnnl_memory_set_data_handle(to, s->buf);
  if (dnnl_primitive_execute(reorder, stream, 2, a) != dnnl_success ||
      dnnl_stream_wait(stream) != dnnl_success) {
    free(s->buf);
    s->buf = NULL;
    return NULL;
  }
  s->md = *md;
  s->from = *fmd;
  pack_bytes += kept_bytes(md);
  pack_made++;
  st->kept = 1;
  return s->buf;
}

/* Make en's packed primitive and the reorder into it; 0 where oneDNN's
** layout for b is not blocked, or it refuses.  Only a blocked layout (the
** brgemm kernels' BA16a64b where the CPU has AVX-512) is the copy the
** kernels would make anyway; where they are gemm:jit's (AVX2 only, an AMD
** EPYC under KVM), "any" is plain [K, N], which sgemm reads slower than a
** linear's own [N, K]^T (256x512 -> 2048: 7.4 against 4.6 ms). */
static int pack_make(entry *en, const cpu_mm *m) {
  dnnl_memory_desc_t plain, chosen;
  dnnl_primitive_desc_t rpd;
  en->pack = -1;
  if (!prim_make(&en->packed, m, 1, &plain, &chosen) ||     /* the caller's own is plain too */
      chosen.format_kind != dnnl_blocked || chosen.format_desc.blocking.inner_nblks == 0 ||
      dnnl_reorder_primitive_desc_create(&rpd, &plain, engine, &chosen, engine, NULL) != dnnl_success) {
    prim_free(&en->packed);
    return 0;
  }
  if (dnnl_primitive_create(&en->reorder, rpd) != dnnl_success) en->reorder = NULL;
  dnnl_primitive_desc_destroy(rpd);
  if (!en->reorder || dnnl_memory_create(&en->rfrom, &plain, engine, DNNL_MEMORY_NONE) != dnnl_success ||
      dnnl_memory_create(&en->rto, &chosen, engine, DNNL_MEMORY_NONE) != dnnl_success)
    return 0;                  /* entry_free releases what was made */
  en->pmd = chosen;
  en->pack = 1;
  return 1;
}

/* m's b packed for en, or NULL: run the plain primitive.  Under lock. */
static void *packed_b(entry *en, const cpu_mm *m) {
  const dnnl_memory_desc_t *from;
  pslot *s;
  if (!m->b_st || en->pack < 0) return NULL;
  /* a first product of its kind makes its packed primitive only for a
  ** weight seen before: one search of the slots in the steady state */
  if (!en->pack && (!kept_seen(m->b_st, m->b.p) || !pack_make(en, m))) return NULL;
  if (dnnl_memory_get_memory_desc(en->rfrom, &from) != dnnl_success ||
      !(s = kept_find(m->b_st, m->b.p, from, &en->pmd)))
    return NULL;
  dnnl_memory_set_data_handle(en->rfrom, (void *)m->b.p);
  return kept_copy(s, m->b_st, &en->pmd, en->reorder, en->rfrom, en->rto);
}

static int start(void) {
  if (state) return state > 0;
  state = -1;
  if (dnnl_engine_create(&engine, dnnl_cpu, 0) != dnnl_success) return 0;
  if (dnnl_stream_create(&stream, engine, dnnl_stream_default_flags) != dnnl_success) return 0;
  ten_set_free_hook(packs_storage_freed);
  state = 1;
  return 1;
}

/* Take the lock and find (or make) the entry of key k in c into *en; op
** names the call in errors.  On FL_OK the lock stays held for the caller
** to run the entry and let go; on an error it is released. */
static int locked_entry(pcache *c, const void *k, const void *call, const char *op, void **en,
                        fl_err *e) {
  pthread_mutex_lock(&lock);
  if (!start()) {
    pthread_mutex_unlock(&lock);
    return err_set(e, FL_EUNSUPPORTED, "%s: oneDNN has no CPU engine here", op);
  }
  if (!(*en = pcache_get(c, k, call))) {
    pthread_mutex_unlock(&lock);
    return err_set(e, FL_ENOMEM, "%s: cannot allocate a primitive cache entry", op);
  }
  return FL_OK;
}

/* Does oneDNN run its AVX-512 kernels here?  Asked once. */
static int avx512(void) {
  static int v = -1;
  if (v < 0) v = (dnnl_get_effective_cpu_isa() & dnnl_cpu_isa_avx512_core) == dnnl_cpu_isa_avx512_core;
  return v;
}

/* FUSELAB_MATMUL: 0 blas (oneDNN off), 1 the default, 2 onednn (no
** product on cpu/mm_rows.c), 3 rows (linears of a few rows on it whatever
** the CPU) */
static int mm_mode(void) {
  static int mode = -1;
  if (mode < 0) {
    const char *v = getenv("FUSELAB_MATMUL");
    mode = v && strcmp(v, "blas") == 0 ? 0 : v && strcmp(v, "onednn") == 0 ? 2
         : v && strcmp(v, "rows") == 0 ? 3 : 1;
  }
  return mode;
}

/* A linear of M rows on cpu/mm_rows.c: by default of 2 to 8 where
** oneDNN's kernels are AVX2's, of 2 only with AVX-512.  There its general
** product is no longer the slow one on weights in cache (an AMD EPYC of
** family 25 model 17, bench/mm_rows.lua: 2 rows even, 4 and 8 rows 1.2-2x
** faster than the loop), but it reads a weight from memory at 26 GB/s
** where the loop reads 43 (2 x 4096 -> 4096: 2.6 ms against 1.6), as a
** classifier's weight comes after the rest of a network: EfficientNet-B0's
** 2 x 1280 -> 1000 0.22-0.25 ms against the loop's 0.16-0.17 (onnxruntime
** 0.17), MobileNetV3's 2 x 1024 -> 1000 0.08-0.10 against 0.06-0.10.  With
** 4 rows the two are even from memory, with 8 oneDNN is twice as fast. */
static int rows_linear(int64_t M) {
  if (M < 2) return 0;
  return mm_mode() == 3 || (mm_mode() == 1 && (!avx512() || M == 2));
}

int cpu_mm_enabled(void) {
  return mm_mode() > 0;
}

/* Products of fewer multiply-adds run on one thread: oneDNN would start
** its team for them all the same, and waking a sleeping thread costs more
** than such a product (on a VM just after an idle spell, a tiny ONNX
** transformer's eager call took 4-5 ms instead of 0.4).  Two threads gain
** from about 2^20 (bench/RESULTS.md, "Small products on one thread"):
** CPU_MM_PAR_MIN (mm.h). */

static int64_t macs(const cpu_mm *m) {
  int64_t n = m->a.shape[m->nd - 1];     /* K */
  int d;
  for (d = 0; d < m->nd; d++) n *= m->dst.shape[d];
  return n;
}

/* Operand k of m: 0 a, 1 dst, 2 b, 3.. the posts' srcs. */
static const cpu_mm_arg *mm_arg(const cpu_mm *m, int k) {
  return k == 0 ? &m->a : k == 1 ? &m->dst : k == 2 ? &m->b : &m->post[k - 3].src;
}

/* A product whose b is one matrix for every batch (a linear's weight) may
** take the dims of a's rows -- its batch dims and M -- in any order: each
** row meets b alone.  Where a's rows are strided, e.g. a view that swaps
** batch and sequence ([L, N, E] of an [N, L, E] tensor, as PyTorch's
** multi-head attention reads its input), oneDNN would run L products of N
** rows, reading b L times: ViT-B/16's query-key-value product as 197
** products of 2 rows.  So those dims are ordered by a's strides, largest
** first, and merged where a, dst and every post's src nest, into *c;
** 1 where that makes M larger, else 0 (m is then run as it is). */
static int rows_canon(const cpu_mm *m, cpu_mm *c) {
  int nd = m->nd, r[CPU_MM_MAXD], nr = 0, q = -1, i, j, k, d;
  if (nd < 3) return 0;
  for (d = 0; d < nd - 2; d++)
    if (m->b.shape[d] != 1 || m->a.shape[d] != m->dst.shape[d]) return 0;
  for (d = 0; d < nd - 1; d++)
    if (m->dst.shape[d] != 1) r[nr++] = d;
  for (i = 1; i < nr; i++)                  /* a's strides descending */
    for (j = i; j > 0 && m->a.stride[r[j - 1]] < m->a.stride[r[j]]; j--) {
      int t = r[j]; r[j] = r[j - 1]; r[j - 1] = t;
    }
  *c = *m;
  for (i = 0; i < nr; i++) {                /* row dim d joins new dim q, or opens q + 1 */
    int merge = q >= 0;
    d = r[i];
    for (k = 0; k < 3 + m->npost && merge; k++) {
      const cpu_mm_arg *x = mm_arg(m, k), *n = mm_arg(c, k);
      if (k == 2 || (k > 2 && m->post[k - 3].kind != CPU_MM_ADD && m->post[k - 3].kind != CPU_MM_MUL)) continue;
      merge = x->shape[d] == 1 ? n->shape[q] == 1 :
              n->shape[q] != 1 && n->stride[q] == x->stride[d] * x->shape[d];
    }
    if (merge) q--;                         /* reopen q below, folding d into it */
    q++;
    for (k = 0; k < 3 + m->npost; k++) {
      const cpu_mm_arg *x = mm_arg(m, k);
      cpu_mm_arg *n = (cpu_mm_arg *)mm_arg(c, k);
      if (k == 2) continue;
      n->shape[q] = merge ? n->shape[q] * x->shape[d] : x->shape[d];
      n->stride[q] = x->shape[d] == 1 ? 0 : x->stride[d];
    }
  }
  if (q < 0 || c->dst.shape[q] <= m->dst.shape[nd - 2]) return 0;
  c->nd = q + 2;
  for (k = 0; k < 3 + m->npost; k++) {      /* the last two dims of b, the last of the rest */
    const cpu_mm_arg *x = mm_arg(m, k);
    cpu_mm_arg *n = (cpu_mm_arg *)mm_arg(c, k);
    for (d = k == 2 ? 2 : 1; d >= 1; d--) {
      n->shape[c->nd - d] = x->shape[nd - d];
      n->stride[c->nd - d] = x->stride[nd - d];
    }
  }
  for (d = 0; d < c->nd - 2; d++) { c->b.shape[d] = 1; c->b.stride[d] = 0; }
  return 1;
}

int cpu_mm_run(const cpu_mm *m0, fl_err *e) {
  key k;
  entry *en;
  void *p;
  cpu_mm mc, mr;
  const cpu_mm *m = m0;
  int i, rc = FL_OK, threads = 0, reordered = 0;
  if (!cpu_mm_enabled())
    return err_set(e, FL_EUNSUPPORTED, "matmul: oneDNN is turned off (FUSELAB_MATMUL=blas)");
  if (m->nd < 2 || m->nd > CPU_MM_MAXD || m->npost > CPU_MM_MAXPOST)
    return err_set(e, FL_EUNSUPPORTED, "matmul: rank %d or %d post-ops are beyond oneDNN's path",
                   m->nd, m->npost);
  for (i = 0; i < m0->npost; i++)
    if (m0->post[i].kind == CPU_MM_ADD_C || m0->post[i].kind == CPU_MM_MUL_C)
      return err_set(e, FL_EUNSUPPORTED, "matmul: per-channel post-ops are a convolution's");
  for (i = 0; i < m0->npost; i++)
    if (m0->post[i].like_dst) {
      if (m == m0) { mc = *m0; m = &mc; }
      memcpy(mc.post[i].src.shape, m0->dst.shape, sizeof mc.post[i].src.shape);
      memcpy(mc.post[i].src.stride, m0->dst.stride, sizeof mc.post[i].src.stride);
    }
  if ((reordered = rows_canon(m, &mr))) m = &mr;
  if (rows_linear(m->dst.shape[m->nd - 2]) && cpu_mm_rows(m) == FL_OK) return FL_OK;
  key_of(&k, m);
#ifdef _OPENMP
  /* a primitive made for one thread (brgemm sizes its work when made) and
  ** run on one: the same key always gets the same count */
  if (macs(m) < CPU_MM_PAR_MIN && (threads = omp_get_max_threads()) > 1) omp_set_num_threads(1);
#endif
  if ((rc = locked_entry(&cache, &k, m, "matmul", &p, e)) != FL_OK) goto out;
  en = p;
  if (en->refused) {
    rc = err_set(e, FL_EUNSUPPORTED, "matmul: oneDNN refuses this layout");
  } else {
    void *pb = packed_b(en, m);
    prim *pr = pb ? &en->packed : &en->plain;
    dnnl_memory_set_data_handle(pr->mem[0], (void *)m->a.p);
    dnnl_memory_set_data_handle(pr->mem[1], pb ? pb : (void *)m->b.p);
    dnnl_memory_set_data_handle(pr->mem[2], m->dst.p ? (void *)m->dst.p : NULL);
    if (m->bias) dnnl_memory_set_data_handle(pr->mem[3], (void *)m->bias);
    for (i = 0; i < m->npost; i++)
      if (pr->mem[4 + i]) dnnl_memory_set_data_handle(pr->mem[4 + i], (void *)m->post[i].src.p);
    if (dnnl_primitive_execute(pr->p, stream, pr->nargs, pr->args) != dnnl_success ||
        dnnl_stream_wait(stream) != dnnl_success)
      rc = err_set(e, FL_EUNSUPPORTED, "matmul: oneDNN failed to run a product");
    else {
      ncalls++;
      nposts += m->npost > 0;
      nreordered += reordered;
      pack_calls += pb != NULL;
    }
  }
  pthread_mutex_unlock(&lock);
out:
#ifdef _OPENMP
  if (threads > 1) omp_set_num_threads(threads);
#endif
  return rc;
}

/* oneDNN's first product in a process generates its kernels and starts
** its thread team: 17-25 ms on a Zen 4 core (gemm:jit), paid by a
** program's first call.  A small product run where a core would idle
** anyway (exec/cache.c calls this while the compiler links) takes that
** off the first call.  Once per process; nothing is counted, cached or
** named (fl.blas_info() still names the program's own kernels). */
void cpu_mm_warm(void) {
  static int done;
  enum { M = 64, K = 128, N = 64 };
  char impl[sizeof last_impl];
  float *buf = NULL;
  prim pr;
  cpu_mm m;
  memset(&pr, 0, sizeof pr);
  memset(&m, 0, sizeof m);
  pthread_mutex_lock(&lock);
  if (done || !cpu_mm_enabled() || !start() || !(buf = calloc(M * K + K * N + M * N + N, sizeof *buf)))
    goto out;
  done = 1;
  m.nd = 2;
  m.a.shape[0] = M; m.a.shape[1] = K; m.a.stride[0] = K; m.a.stride[1] = 1;
  m.b.shape[0] = K; m.b.shape[1] = N; m.b.stride[0] = 1; m.b.stride[1] = K;   /* a linear's weight */
  m.dst.shape[0] = M; m.dst.shape[1] = N; m.dst.stride[0] = N; m.dst.stride[1] = 1;
  m.bias = buf;
  memcpy(impl, last_impl, sizeof impl);
  if (prim_make(&pr, &m, 0, NULL, NULL)) {
    dnnl_memory_set_data_handle(pr.mem[0], buf + N);
    dnnl_memory_set_data_handle(pr.mem[1], buf + N + M * K);
    dnnl_memory_set_data_handle(pr.mem[2], buf + N + M * K + K * N);
    dnnl_memory_set_data_handle(pr.mem[3], buf);
    if (dnnl_primitive_execute(pr.p, stream, pr.nargs, pr.args) == dnnl_success) dnnl_stream_wait(stream);
  }
  memcpy(last_impl, impl, sizeof impl);
out:
  prim_free(&pr);
  pthread_mutex_unlock(&lock);
  free(buf);
}

void cpu_mm_counts(int64_t *calls, int64_t *with_posts, int64_t *reordered) {
  pthread_mutex_lock(&lock);
  *calls = ncalls;
  *with_posts = nposts;
  *reordered = nreordered;
  pthread_mutex_unlock(&lock);
}

void cpu_mm_pack_info(int64_t *calls, int64_t *weights, int64_t *bytes, int64_t *made) {
  int i;
  pthread_mutex_lock(&lock);
  *calls = pack_calls;
  *made = pack_made;
  *bytes = pack_bytes;
  for (*weights = 0, i = 0; i < NPACK; i++) *weights += packs[i].buf != NULL;
  pthread_mutex_unlock(&lock);
}

const char *cpu_mm_describe(void) {
  static char buf[224];
  const dnnl_version_t *v = dnnl_version();
  const char *rows = mm_mode() == 2 ? "; FUSELAB_MATMUL=onednn: every product there"
                   : rows_linear(8) ? "; linears of 2 to 8 rows on fuselab's own loop"
                   : "; linears of 2 rows and squeeze-and-excitation's 1x1s on fuselab's own loop";
  if (!cpu_mm_enabled()) return "OpenBLAS sgemm (FUSELAB_MATMUL=blas)";
  pthread_mutex_lock(&lock);
  if (last_impl[0])
    snprintf(buf, sizeof buf, "oneDNN %d.%d.%d matmul, %s kernels (chosen by the CPU's features)%s",
             v->major, v->minor, v->patch, last_impl, rows);
  else
    snprintf(buf, sizeof buf, "oneDNN %d.%d.%d matmul (kernels chosen by the CPU's features)%s",
             v->major, v->minor, v->patch, rows);
  pthread_mutex_unlock(&lock);
  return buf;
}

/* --- convolutions ---------------------------------------------------------
** Same invariant as products: one primitive per key, kept with its memory
** objects.  oneDNN picks its own (blocked) layouts for the fast kernels
** (format "any"); where a layout it picked is not the caller's plain
** nchw / oihw, the entry keeps a buffer of that layout and the reorder
** into it (src, weights) or out of it (dst), run on every call: the
** weights may change between calls, so their reorder is never skipped. */

typedef struct ckey {
  int64_t d[18];               /* cpu_conv's sizes and attributes, in order */
  int bias, npost, plain;     /* plain: conv_mode */
  int xblk, yblk, nhwc_ok;
  int in_y;                    /* a residual in y itself: fewer of fuselab's loops fit */
  int kind[CPU_MM_MAXPOST];
  float ab[CPU_MM_MAXPOST][2];
} ckey;

typedef struct cside {
  dnnl_memory_t user, inner;   /* inner: NULL when oneDNN reads the caller's */
  dnnl_primitive_t reorder;
  void *buf;
  int lu, li;                  /* src, dst: user's and inner layout as
                                  cpu_relayout names them, -1 for others
                                  (oneDNN's reorder runs then) */
} cside;

typedef struct centry {
  ckey k;                      /* first, as in entry */
  int refused;
  int dw;                      /* run by cpu_conv_dw (cpu/conv_dw.c), no primitive */
  int pw;                      /* run by cpu_conv_pw (cpu/conv_pw.c), no primitive */
  dnnl_primitive_t prim;
  cside side[3];               /* src, weights, dst */
  dnnl_memory_t bias, post[CPU_MM_MAXPOST];
  int sum1;                    /* 1 + the residual add run as a sum, or 0 */
  int mm;                      /* run as a batched matmul (centry_make_mm) */
  int tail;                    /* its post-ops from here on run after it
                                  (cpu_conv_posts); npost: none */
  int y_nhwc;                  /* the primitive writes channels last, and
                                  the call may leave y so (may_nhwc) */
  dnnl_memory_t sum_src;       /* that residual, laid out as the caller's y */
  dnnl_primitive_t sum_reorder;   /* into side[2].inner, where there is one */
  dnnl_memory_t scratch;
  void *scratch_buf;
  int nargs;
  dnnl_exec_arg_t args[6 + CPU_MM_MAXPOST];
} centry;

static int64_t nconvs, nconv_posts, nconv_mms, nblk_reads, nblk_writes, nnhwc; /* under lock */
static int64_t nunblocked;           /* atomic: cpu_unblock_nchw runs unlocked */
static int64_t ndw, ndws, npw, npwb; /* atomic: run by cpu_conv_dw (of them on a shuffle),
                                        cpu_conv_pw (on blocks) */
static int conv_mode = -1;           /* 0 blas, 1 oneDNN on plain layouts, 3 on its
                                        own, 2 the fastest per shape, 4 that with
                                        the matmul form wherever it applies, 5
                                        that with cpu_conv_dw wherever it fits,
                                        6 that with cpu_conv_pw */

static void centry_clear(centry *en) {
  int i;
  if (en->prim) dnnl_primitive_destroy(en->prim);
  for (i = 0; i < 3; i++) {
    if (en->side[i].user) dnnl_memory_destroy(en->side[i].user);
    if (en->side[i].inner) dnnl_memory_destroy(en->side[i].inner);
    if (en->side[i].reorder) dnnl_primitive_destroy(en->side[i].reorder);
    free(en->side[i].buf);
  }
  if (en->bias) dnnl_memory_destroy(en->bias);
  for (i = 0; i < CPU_MM_MAXPOST; i++)
    if (en->post[i]) dnnl_memory_destroy(en->post[i]);
  if (en->sum_src) dnnl_memory_destroy(en->sum_src);
  if (en->sum_reorder) dnnl_primitive_destroy(en->sum_reorder);
  if (en->scratch) dnnl_memory_destroy(en->scratch);
  free(en->scratch_buf);
  memset(&en->prim, 0, sizeof *en - offsetof(centry, prim));
}

static int side_make(cside *s, const dnnl_memory_desc_t *plain, const dnnl_memory_desc_t *chosen,
                     int into) {
  dnnl_primitive_desc_t rpd;
  size_t n;
  dnnl_status_t st;
  s->lu = s->li = -1;
  if (dnnl_memory_create(&s->user, plain, engine, DNNL_MEMORY_NONE) != dnnl_success) {
    s->user = NULL;
    return 0;
  }
  if (dnnl_memory_desc_equal(plain, chosen)) return 1;
  n = dnnl_memory_desc_get_size(chosen);
  if (!(s->buf = aligned_alloc(64, (n + 63) / 64 * 64 + 64))) return 0;
  if (dnnl_memory_create(&s->inner, chosen, engine, s->buf) != dnnl_success) {
    s->inner = NULL;
    return 0;
  }
  if (into) st = dnnl_reorder_primitive_desc_create(&rpd, plain, engine, chosen, engine, NULL);
  else st = dnnl_reorder_primitive_desc_create(&rpd, chosen, engine, plain, engine, NULL);
  if (st != dnnl_success) return 0;
  st = dnnl_primitive_create(&s->reorder, rpd);
  dnnl_primitive_desc_destroy(rpd);
  if (st != dnnl_success) { s->reorder = NULL; return 0; }
  return 1;
}

static dnnl_format_tag_t blk_tag(int b) {
  return b == 16 ? dnnl_nChw16c : b == 8 ? dnnl_nChw8c : b == CPU_NHWC ? dnnl_nhwc : dnnl_nchw;
}

/* md's layout as cpu_relayout names it: 0 plain, CPU_NHWC, 8 or 16 (the
** channels whole blocks of them); -1 for any other. */
static int md_layout(const dnnl_memory_desc_t *md) {
  static const int ls[4] = {0, CPU_NHWC, 8, 16};
  dnnl_memory_desc_t t;
  int i;
  if (md->ndims != 4 || md->data_type != dnnl_f32) return -1;
  for (i = 0; i < 4; i++)
    if ((ls[i] != 8 && ls[i] != 16) || md->dims[1] % ls[i] == 0)
      if (dnnl_memory_desc_init_by_tag(&t, 4, md->dims, dnnl_f32, blk_tag(ls[i])) == dnnl_success &&
          dnnl_memory_desc_equal(&t, md))
        return ls[i];
  return -1;
}

/* An activation's side (src or dst): both layouts named, where it has an
** inner one. */
static void side_layouts(cside *s) {
  const dnnl_memory_desc_t *u, *in;
  s->lu = s->li = -1;
  if (s->inner && dnnl_memory_get_memory_desc(s->user, &u) == dnnl_success &&
      dnnl_memory_get_memory_desc(s->inner, &in) == dnnl_success) {
    s->lu = md_layout(u);
    s->li = md_layout(in);
  }
}

static int exec2(dnnl_primitive_t p, dnnl_memory_t from, dnnl_memory_t to);

/* Side s's reorder, into its inner layout (into) or out of it, from the
** n x c x hw value at x to y: cpu_relayout where it names both layouts. */
static int side_reorder(const cside *s, int into, const float *x, float *y, int64_t n, int64_t c, int64_t hw) {
  if (s->lu < 0 || s->li < 0)
    return into ? exec2(s->reorder, s->user, s->inner) : exec2(s->reorder, s->inner, s->user);
  cpu_relayout(x, into ? s->lu : s->li, y, into ? s->li : s->lu, n, c, hw);
  return 1;
}

/* May c's y be left channels last?  The caller allows it (wrote), and no
** post-op reads a tensor (a residual, a gate: laid out as the caller's
** y). */
static int may_nhwc(const cpu_conv *c) {
  int i;
  for (i = 0; i < c->npost && c->wrote; i++)
    if (c->post[i].kind == CPU_MM_ADD || c->post[i].kind == CPU_MM_MUL) return 0;
  return c->wrote != NULL;
}

/* The primitive of c, in oneDNN's layouts (any) or the caller's (plain). */
static int centry_make(centry *en, const cpu_conv *c, int any) {
  dnnl_memory_desc_t xmd, wmd, ymd, bmd, xa, wa, ya;
  dnnl_dims_t xd, wd, yd, bd, st, di, pl, pr;
  dnnl_convolution_desc_t desc;
  dnnl_primitive_attr_t attr = NULL;
  dnnl_post_ops_t ops = NULL;
  dnnl_primitive_desc_t pd = NULL;
  int64_t G = c->groups;
  int i, ok = 0;
  xd[0] = c->n; xd[1] = c->c; xd[2] = c->h; xd[3] = c->w;
  yd[0] = c->n; yd[1] = c->co; yd[2] = c->oh; yd[3] = c->ow;
  if (G > 1) { wd[0] = G; wd[1] = c->co / G; wd[2] = c->c / G; wd[3] = c->kh; wd[4] = c->kw; }
  else { wd[0] = c->co; wd[1] = c->c; wd[2] = c->kh; wd[3] = c->kw; }
  bd[0] = c->co;
  st[0] = c->sh; st[1] = c->sw;
  di[0] = c->dh - 1; di[1] = c->dw - 1;          /* oneDNN counts the holes */
  pl[0] = c->pt; pl[1] = c->pl; pr[0] = c->pb; pr[1] = c->pr;
  if (dnnl_memory_desc_init_by_tag(&xmd, 4, xd, dnnl_f32, blk_tag(c->xblk)) != dnnl_success ||
      dnnl_memory_desc_init_by_tag(&ymd, 4, yd, dnnl_f32, blk_tag(c->yblk)) != dnnl_success ||
      dnnl_memory_desc_init_by_tag(&wmd, G > 1 ? 5 : 4, wd, dnnl_f32, G > 1 ? dnnl_goihw : dnnl_oihw) != dnnl_success ||
      dnnl_memory_desc_init_by_tag(&bmd, 1, bd, dnnl_f32, dnnl_x) != dnnl_success)
    return 0;
  if (any) {
    if (dnnl_memory_desc_init_by_tag(&xa, 4, xd, dnnl_f32, dnnl_format_tag_any) != dnnl_success ||
        dnnl_memory_desc_init_by_tag(&ya, 4, yd, dnnl_f32, dnnl_format_tag_any) != dnnl_success ||
        dnnl_memory_desc_init_by_tag(&wa, G > 1 ? 5 : 4, wd, dnnl_f32, dnnl_format_tag_any) != dnnl_success)
      return 0;
  } else {
    xa = xmd; ya = ymd; wa = wmd;
    /* x left channels last by the convolution before (CPU_NHWC): read in
    ** blocks after a reorder, what that one would have written before */
    if (c->xblk == CPU_NHWC &&
        dnnl_memory_desc_init_by_tag(&xa, 4, xd, dnnl_f32, blk_tag(cpu_conv_block() ? cpu_conv_block() : 16))
        != dnnl_success)
      return 0;
    /* blocked x or y: the kernels that read them want blocked weights,
    ** which are reordered once and kept (kept_find) */
    if ((c->xblk || c->yblk) &&
        dnnl_memory_desc_init_by_tag(&wa, G > 1 ? 5 : 4, wd, dnnl_f32, dnnl_format_tag_any) != dnnl_success)
      return 0;
  }
  if (dnnl_dilated_convolution_forward_desc_init(&desc, dnnl_forward_inference, dnnl_convolution_direct,
                                                 &xa, &wa, c->bias ? &bmd : NULL, &ya, st, di, pl, pr)
      != dnnl_success)
    return 0;
  if (dnnl_primitive_attr_create(&attr) != dnnl_success) return 0;
  if (dnnl_primitive_attr_set_scratchpad_mode(attr, dnnl_scratchpad_mode_user) != dnnl_success) goto done;
  if (c->npost) {
    /* a residual add as oneDNN's sum: the residual is put in dst first
    ** (in dst's layout), which every kernel reads fast; a binary add
    ** reading the plain layout runs a slow generic loop in the gemm
    ** kernels (7 ms for a 0.1 ms grouped 1x1, ShuffleNet's) and is
    ** refused by most blocked ones.  Other addends and factors are read
    ** as the caller's y is laid out. */
    const dnnl_memory_desc_t *bin[CPU_MM_MAXPOST];
    int sum = cpu_conv_sum_post(c->post, c->npost);
    for (i = 0; i < c->npost; i++) bin[i] = &ymd;
    if (dnnl_post_ops_create(&ops) != dnnl_success || !posts_append(ops, c->post, c->npost, sum, -1, bin) ||
        dnnl_primitive_attr_set_post_ops(attr, ops) != dnnl_success)
      goto done;
    en->sum1 = sum + 1;
  }
  if (dnnl_primitive_desc_create(&pd, &desc, attr, engine, NULL) != dnnl_success) { pd = NULL; goto done; }
  if (c->xblk || c->yblk) {
    /* oneDNN's reference loops, where no kernel reads these layouts
    ** together (blocked x, plain y): 98 s for one of VGG-19's convs,
    ** where the same on plain layouts takes 20 ms */
    const char *impl = NULL;
    if (dnnl_primitive_desc_query(pd, dnnl_query_impl_info_str, 0, &impl) != dnnl_success || !impl ||
        strncmp(impl, "ref", 3) == 0)
      goto done;
  }
  if (dnnl_primitive_create(&en->prim, pd) != dnnl_success) { en->prim = NULL; goto done; }
  if (!side_make(&en->side[0], &xmd, dnnl_primitive_desc_query_md(pd, dnnl_query_src_md, 0), 1) ||
      !side_make(&en->side[1], &wmd, dnnl_primitive_desc_query_md(pd, dnnl_query_weights_md, 0), 1) ||
      !side_make(&en->side[2], &ymd, dnnl_primitive_desc_query_md(pd, dnnl_query_dst_md, 0), 0))
    goto done;
  side_layouts(&en->side[0]);
  side_layouts(&en->side[2]);
  if (may_nhwc(c) && en->side[2].inner) {
    /* the kernel writes channels last (brgconv), which the next
    ** convolution reads as it is: the reorder out is left out of the
    ** calls, and of the first call's timing too, which times what the
    ** calls run.  The reader's own pick, made on the value channels
    ** last, pays a reorder into blocks where it wants them.  Timed with
    ** the reorder, the blocked kernel won where the two were close and
    ** the depthwise convolution after it read blocks: EfficientNet-B0's
    ** 3x3 and 5x5 over 480 and 672 channels of 7 x 7 took 0.015-0.030
    ** ms, 0.011-0.024 on the channels last values (bench/RESULTS.md) */
    dnnl_memory_desc_t nmd;
    en->y_nhwc = dnnl_memory_desc_init_by_tag(&nmd, 4, yd, dnnl_f32, dnnl_nhwc) == dnnl_success &&
                 dnnl_memory_desc_equal(&nmd, dnnl_primitive_desc_query_md(pd, dnnl_query_dst_md, 0));
  }
#define ARG(id, mem) do { en->args[en->nargs].arg = (id); en->args[en->nargs++].memory = (mem); } while (0)
#define SIDE(i) (en->side[i].inner ? en->side[i].inner : en->side[i].user)
  ARG(DNNL_ARG_SRC, SIDE(0));
  ARG(DNNL_ARG_WEIGHTS, SIDE(1));
  ARG(DNNL_ARG_DST, SIDE(2));
#undef SIDE
  if (c->bias) {
    if (dnnl_memory_create(&en->bias, &bmd, engine, DNNL_MEMORY_NONE) != dnnl_success) { en->bias = NULL; goto done; }
    ARG(DNNL_ARG_BIAS, en->bias);
  }
  if (en->sum1) {
    /* the residual in its own layout, reordered into dst's where they
    ** differ: a copy either way */
    dnnl_primitive_desc_t rpd;
    dnnl_status_t rs;
    dnnl_memory_desc_t rmd;
    const dnnl_memory_desc_t *to = en->side[2].inner ? dnnl_primitive_desc_query_md(pd, dnnl_query_dst_md, 0)
                                                     : &ymd;
    if (dnnl_memory_desc_init_by_tag(&rmd, 4, yd, dnnl_f32, blk_tag(c->post[en->sum1 - 1].blk)) != dnnl_success)
      goto done;
    if (dnnl_memory_create(&en->sum_src, &rmd, engine, DNNL_MEMORY_NONE) != dnnl_success) {
      en->sum_src = NULL;
      goto done;
    }
    if (!dnnl_memory_desc_equal(&rmd, to)) {
      if (dnnl_reorder_primitive_desc_create(&rpd, &rmd, engine, to, engine, NULL) != dnnl_success)
        goto done;
      rs = dnnl_primitive_create(&en->sum_reorder, rpd);
      dnnl_primitive_desc_destroy(rpd);
      if (rs != dnnl_success) { en->sum_reorder = NULL; goto done; }
    }
  }
  for (i = 0; i < c->npost; i++) {
    dnnl_memory_desc_t cmd;
    if ((c->post[i].kind == CPU_MM_ADD_C || c->post[i].kind == CPU_MM_MUL_C) && chan_md(&cmd, &c->post[i])) {
      if (dnnl_memory_create(&en->post[i], &cmd, engine, DNNL_MEMORY_NONE) != dnnl_success) {
        en->post[i] = NULL;
        goto done;
      }
      ARG(DNNL_ARG_ATTR_MULTIPLE_POST_OP(i) | DNNL_ARG_SRC_1, en->post[i]);
    }
  }
  for (i = 0; i < c->npost; i++)
    if ((c->post[i].kind == CPU_MM_ADD || c->post[i].kind == CPU_MM_MUL) && i != en->sum1 - 1) {
      if (dnnl_memory_create(&en->post[i], &ymd, engine, DNNL_MEMORY_NONE) != dnnl_success) {
        en->post[i] = NULL;
        goto done;
      }
      ARG(DNNL_ARG_ATTR_MULTIPLE_POST_OP(i) | DNNL_ARG_SRC_1, en->post[i]);
    }
#undef ARG
  ok = scratch_make(pd, &en->scratch, &en->scratch_buf, en->args, &en->nargs);
done:
  made_free(pd, ops, attr);
  if (!ok) centry_clear(en);
  return ok;
}

/* A 1x1 convolution (stride 1, no padding) is one product per image and
** group, y[n, g] = w[g] @ x[n, g] over [channels, h * w]: one batched
** matmul reading every operand in place.  oneDNN 2.6's own convolution
** runs it with an epilogue on its gemm kernels, slowly where a group's
** channels are not a multiple of its block (ShuffleNet's 4 groups of 34
** and 68 on AVX2: 0.5-0.65 ms at 11-14 GFLOP/s; as a matmul 0.07-0.08 ms;
** bench/RESULTS.md).  Without groups or an epilogue its kernels do well,
** and the form is not tried (one candidate fewer to time).  The matmul's
** bias is per column, so the bias (per row here) and a leading residual
** add are written into y first and read back by a sum post-op; later
** post-ops must be elementwise up to the first per-channel one (*tail),
** which with all after it runs over y once the product is done.  0 where
** that does not hold or oneDNN refuses; centry_pick times it against the
** convolutions. */
static int mm_form(const cpu_conv *c, int *tail) {
  int i;
  if (c->xblk || c->yblk || (c->npost && c->post[0].blk))   /* plain layouts only */
    return 0;
  if (c->c / c->groups < 2 || (c->groups == 1 && !c->npost) || c->kh != 1 || c->kw != 1 ||
      c->sh != 1 || c->sw != 1 || c->pt || c->pl || c->pb || c->pr || c->oh != c->h || c->ow != c->w)
    return 0;
  for (*tail = 0; *tail < c->npost; ++*tail)
    if (c->post[*tail].kind == CPU_MM_ADD_C || c->post[*tail].kind == CPU_MM_MUL_C) break;
  for (i = 0; i < *tail; i++)
    if ((c->post[i].kind == CPU_MM_ADD && i > 0) || c->post[i].kind == CPU_MM_MUL) return 0;
  return 1;
}

static int centry_make_mm(centry *en, const cpu_conv *c) {
  int64_t G = c->groups, CG = c->c / G, OG = c->co / G, P = c->h * c->w;
  int64_t wd[4] = {1, G, OG, CG}, ws[4] = {0, OG * CG, CG, 1};
  int64_t xd[4] = {c->n, G, CG, P}, xs[4] = {c->c * P, CG * P, P, 1};
  int64_t yd[4] = {c->n, G, OG, P}, ys[4] = {c->co * P, OG * P, P, 1};
  dnnl_memory_desc_t wmd, xmd, ymd;
  dnnl_matmul_desc_t desc;
  dnnl_primitive_attr_t attr = NULL;
  dnnl_post_ops_t ops = NULL;
  dnnl_primitive_desc_t pd = NULL;
  int i, ok = 0;
  if (!mm_form(c, &en->tail) || !md_of(&wmd, 4, wd, ws) || !md_of(&xmd, 4, xd, xs) || !md_of(&ymd, 4, yd, ys) ||
      dnnl_matmul_desc_init(&desc, &wmd, &xmd, NULL, &ymd) != dnnl_success ||
      dnnl_primitive_attr_create(&attr) != dnnl_success)
    return 0;
  if (dnnl_primitive_attr_set_scratchpad_mode(attr, dnnl_scratchpad_mode_user) != dnnl_success ||
      dnnl_post_ops_create(&ops) != dnnl_success)
    goto done;
  /* y holds bias + the leading residual when the product runs: a sum
  ** first, then the elementwise rest up to the first per-channel one (a
  ** batch norm's scale and shift: per row here, which a matmul's binary
  ** post-op reads slowly if at all); that one and all after it run over
  ** y afterwards, while it is in cache (cpu_conv_posts) */
  if (c->npost && c->post[0].kind == CPU_MM_ADD) en->sum1 = 1;
  if ((c->bias || en->sum1) && dnnl_post_ops_append_sum(ops, 1.0f) != dnnl_success) goto done;
  if (!posts_append(ops, c->post, en->tail, -1, en->sum1 - 1, NULL)) goto done;
  if (dnnl_primitive_attr_set_post_ops(attr, ops) != dnnl_success ||
      dnnl_primitive_desc_create(&pd, &desc, attr, engine, NULL) != dnnl_success) {
    pd = NULL;
    goto done;
  }
  {
    const char *impl = NULL;    /* oneDNN's reference loops: the convolution does better */
    if (dnnl_primitive_desc_query(pd, dnnl_query_impl_info_str, 0, &impl) != dnnl_success || !impl ||
        strncmp(impl, "ref", 3) == 0)
      goto done;
  }
  if (dnnl_primitive_create(&en->prim, pd) != dnnl_success) { en->prim = NULL; goto done; }
  {
    const dnnl_memory_desc_t *md[3] = {&xmd, &wmd, &ymd};   /* side 0 x, 1 w, 2 y */
    for (i = 0; i < 3; i++)
      if (dnnl_memory_create(&en->side[i].user, md[i], engine, DNNL_MEMORY_NONE) != dnnl_success) {
        en->side[i].user = NULL;
        goto done;
      }
  }
#define ARG(id, mem) do { en->args[en->nargs].arg = (id); en->args[en->nargs++].memory = (mem); } while (0)
  ARG(DNNL_ARG_SRC, en->side[1].user);       /* w: the product's left side */
  ARG(DNNL_ARG_WEIGHTS, en->side[0].user);   /* x */
  ARG(DNNL_ARG_DST, en->side[2].user);
#undef ARG
  en->mm = ok = scratch_make(pd, &en->scratch, &en->scratch_buf, en->args, &en->nargs);
done:
  made_free(pd, ops, attr);
  if (!ok) centry_clear(en);
  return ok;
}

/* n floats from src to dst on every thread: a residual put into a
** convolution's dst for its sum (ResNet-50's 3.2 MB at 56x56: 66 us on
** one thread of an AMD EPYC, 34 on two, where the second waited) */
static void copy_par(void *dst, const float *src, int64_t n) {
  int64_t q, chunk = 1 << 16;
#pragma omp parallel for schedule(static) if (n >= (1 << 18))
  for (q = 0; q < n; q += chunk)
    memcpy((float *)dst + q, src + q, (size_t)(n - q < chunk ? n - q : chunk) * sizeof *src);
}

/* y = bias per channel + the leading residual (either may be absent): what
** the matmul form's sum post-op reads. */
static void mm_prefill(const cpu_conv *c, const float *res) {
  int64_t P = c->oh * c->ow, plane;
#pragma omp parallel for schedule(static) if (c->n * c->co * P >= (1 << 18))
  for (plane = 0; plane < c->n * c->co; plane++) {
    float *y = c->y + plane * P, b = c->bias ? c->bias[plane % c->co] : 0.0f;
    const float *r = res ? res + plane * P : NULL;
    int64_t i;
    if (r) for (i = 0; i < P; i++) y[i] = r[i] + b;
    else for (i = 0; i < P; i++) y[i] = b;
  }
}

int cpu_conv_enabled(void) {
  if (conv_mode < 0) {
    const char *v = getenv("FUSELAB_CONV");
    conv_mode = !v ? 2 : strcmp(v, "blas") == 0 ? 0 : strcmp(v, "plain") == 0 ? 1
              : strcmp(v, "any") == 0 ? 3 : strcmp(v, "matmul") == 0 ? 4
              : strcmp(v, "depthwise") == 0 ? 5 : strcmp(v, "pointwise") == 0 ? 6 : 2;
  }
  return conv_mode > 0;
}

int cpu_conv_block(void) {
  static int b = -1;
  if (b < 0) {
    const char *v = getenv("FUSELAB_LAYOUT");
    b = !cpu_conv_enabled() || conv_mode == 1 || (v && strcmp(v, "plain") == 0) ? 0
      : v && strcmp(v, "nChw8c") == 0 ? 8 : v && strcmp(v, "nChw16c") == 0 ? 16
      : avx512() ? 16 : 8;
  }
  return b;
}

static int exec2(dnnl_primitive_t p, dnnl_memory_t from, dnnl_memory_t to) {
  dnnl_exec_arg_t a[2];
  a[0].arg = DNNL_ARG_FROM; a[0].memory = from;
  a[1].arg = DNNL_ARG_TO; a[1].memory = to;
  return dnnl_primitive_execute(p, stream, 2, a) == dnnl_success;
}

/* c's weights (en's side[1].user, set by the caller) in en's layout for
** them: their kept copy, made once (kept_find); NULL where there is none,
** and en's own buffer is the reorder's target. */
static void *kept_weights(centry *en, const cpu_conv *c) {
  const dnnl_memory_desc_t *md, *from;
  void *kw = NULL;
  pslot *s = dnnl_memory_get_memory_desc(en->side[1].inner, &md) == dnnl_success &&
             dnnl_memory_get_memory_desc(en->side[1].user, &from) == dnnl_success
             ? kept_find(c->w_st, c->wt, from, md) : NULL;
  if (s) kw = kept_copy(s, c->w_st, md, en->side[1].reorder, en->side[1].user, en->side[1].inner);
  if (!kw) dnnl_memory_set_data_handle(en->side[1].inner, en->side[1].buf);
  return kw;
}

/* Run en on c's data: the reorders in, the convolution, the reorder out;
** with keep 1, weights read before with the same values come from their
** kept copy (kept_find), not reordered again; with keep 2 (timing a
** candidate) they are taken as the last run left them in en's own
** buffer. */
static int centry_exec(centry *en, const cpu_conv *c, int keep) {
  int i, ok = 1, nhwc;
  void *kw = NULL;
  if (en->mm) {
    dnnl_memory_set_data_handle(en->side[0].user, (void *)c->x);
    dnnl_memory_set_data_handle(en->side[1].user, (void *)c->wt);
    dnnl_memory_set_data_handle(en->side[2].user, c->y);
    if (c->bias || en->sum1) mm_prefill(c, en->sum1 ? c->post[0].src.p : NULL);
    ok = dnnl_primitive_execute(en->prim, stream, en->nargs, en->args) == dnnl_success;
    ok = dnnl_stream_wait(stream) == dnnl_success && ok;
    if (ok && en->tail < c->npost) cpu_conv_posts(c, en->tail);
    return ok;
  }
  dnnl_memory_set_data_handle(en->side[0].user, (void *)c->x);
  dnnl_memory_set_data_handle(en->side[1].user, (void *)c->wt);
  dnnl_memory_set_data_handle(en->side[2].user, c->y);
  if (c->bias) dnnl_memory_set_data_handle(en->bias, (void *)c->bias);
  for (i = 0; i < c->npost; i++)
    if (en->post[i]) dnnl_memory_set_data_handle(en->post[i], (void *)c->post[i].src.p);
  if (keep == 1 && en->side[1].inner) kw = kept_weights(en, c);
  if (en->side[0].inner) ok = side_reorder(&en->side[0], 1, c->x, en->side[0].buf, c->n, c->c, c->h * c->w);
  if (ok && en->side[1].inner && !kw && keep != 2)
    ok = exec2(en->side[1].reorder, en->side[1].user, en->side[1].inner);
  if (en->sum1) {
    const float *r = c->post[en->sum1 - 1].src.p;
    dnnl_memory_set_data_handle(en->sum_src, (void *)r);
    if (en->sum_reorder)
      ok = ok && exec2(en->sum_reorder, en->sum_src, en->side[2].inner ? en->side[2].inner : en->side[2].user);
    else if ((en->side[2].inner ? en->side[2].buf : (void *)c->y) != (const void *)r)
      /* already in dst's layout: the user's y, or the inner buffer (and
      ** nothing to copy where y was stored over it: fuse/plan.c) */
      copy_par(en->side[2].inner ? en->side[2].buf : (void *)c->y, r, c->n * c->co * c->oh * c->ow);
  }
  nhwc = en->y_nhwc;                   /* written channels last into y itself */
  if (nhwc) dnnl_memory_set_data_handle(en->side[2].inner, c->y);
  ok = ok && dnnl_primitive_execute(en->prim, stream, en->nargs, en->args) == dnnl_success;
  if (ok && en->side[2].inner && !nhwc)
    ok = side_reorder(&en->side[2], 0, en->side[2].buf, c->y, c->n, c->co, c->oh * c->ow);
  ok = dnnl_stream_wait(stream) == dnnl_success && ok;
  if (nhwc) {
    dnnl_memory_set_data_handle(en->side[2].inner, en->side[2].buf);
    if (ok && keep == 1) *c->wrote = CPU_NHWC;
  }
  pack_calls += ok && kw;
  return ok;
}

/* cpu/conv_pw.c on blocks reads its weights packed gOIhw8i8o: en's
** side[1] is the reorder into that layout.  1 when made (nothing to make
** on plain layouts). */
static int pw_make(centry *en, const cpu_conv *c) {
  dnnl_memory_desc_t wmd, pmd;
  dnnl_dims_t wd;
  if (!c->xblk && !c->yblk) return 1;
  wd[0] = c->groups; wd[1] = c->co / c->groups; wd[2] = c->c / c->groups; wd[3] = 1; wd[4] = 1;
  return dnnl_memory_desc_init_by_tag(&wmd, 5, wd, dnnl_f32, dnnl_goihw) == dnnl_success &&
         dnnl_memory_desc_init_by_tag(&pmd, 5, wd, dnnl_f32, dnnl_gOIhw8i8o) == dnnl_success &&
         side_make(&en->side[1], &wmd, &pmd, 1) && en->side[1].inner;
}

/* Run c on cpu/conv_pw.c; on blocks its weights packed as centry_exec's
** are (keep: the same), 1 when done. */
static int pw_exec(centry *en, const cpu_conv *c, int keep) {
  cpu_conv b = *c;
  void *kw = NULL;
  if (!c->xblk && !c->yblk) return cpu_conv_pw(c) == FL_OK;
  dnnl_memory_set_data_handle(en->side[1].user, (void *)c->wt);
  if (keep == 1) kw = kept_weights(en, c);
  if (!kw && keep != 2 && (!exec2(en->side[1].reorder, en->side[1].user, en->side[1].inner) ||
                           dnnl_stream_wait(stream) != dnnl_success))
    return 0;
  b.wpk = kw ? kw : en->side[1].buf;
  pack_calls += kw != NULL;
  return cpu_conv_pw(&b) == FL_OK;
}

/* One timed run of a candidate (en, NULL: cpu_conv_dw, or with pw
** cpu_conv_pw through en) as later calls
** will run it: weights that can be kept (read in place from a tensor's
** storage) are reordered once,
** by the run that touches the buffers, not in every timed one.  Timing
** their reorder too made the blocked kernels lose where they win from
** the second call on (ResNet-50's 3x3 over 512 channels of 7x7: oneDNN's
** gemm on plain layouts kept at 2.0 ms where the blocked kernel takes
** 1.3, the 9.4 MB weight reorder timed with it). */
static double exec_seconds(centry *en, const cpu_conv *c, int pw) {
  double t0 = meas_now();
  if (!(pw ? pw_exec(en, c, c->w_st ? 2 : 0) : en ? centry_exec(en, c, c->w_st ? 2 : 0) : cpu_conv_dw(c) == FL_OK))
    return 1e30;
  return meas_now() - t0;
}

/* The first residual add or product that follows a per-channel post-op,
** when only elementwise post-ops come after it; else npost. */
static int conv_tail(const cpu_conv *c) {
  int i, chan = 0, at = c->npost;
  for (i = 0; i < c->npost; i++) {
    cpu_mm_pkind k = c->post[i].kind;
    if (k == CPU_MM_ADD_C || k == CPU_MM_MUL_C) {
      if (at < c->npost) return c->npost;
      chan = 1;
    } else if ((k == CPU_MM_ADD || k == CPU_MM_MUL) && chan && at == c->npost) {
      if (c->post[i].blk) return c->npost;
      at = i;
    }
  }
  return at;
}

/* cpu/conv_pw.c is a candidate for c (by default, and with
** FUSELAB_CONV=pointwise). */
static int pw_allowed(const cpu_conv *c) {
  return (conv_mode == 2 || conv_mode == 6) && cpu_conv_pw_fits(c);
}

/* FUSELAB_DEBUG=2 and up: each shape's candidates, their best times and
** the one kept, on stderr (a first call's choice, which varies with the
** load at that moment). */
static void pick_trace(const cpu_conv *c, const int *made, const double *best, int pick) {
  static const char *const name[5] = {"oneDNN in its layouts", "oneDNN in these", "as a matmul",
                                      "cpu/conv_dw.c", "cpu/conv_pw.c"};
  const char *d = getenv("FUSELAB_DEBUG");
  int i;
  if (!d || atoi(d) < 2) return;
  fprintf(stderr, "fuselab: conv2d %lldx%lldx%lldx%lld -> %lld, %lldx%lld stride %lld, groups %lld, blocks %s in, "
          "%d out%s, %d post-ops:", (long long)c->n, (long long)c->c, (long long)c->h, (long long)c->w,
          (long long)c->co, (long long)c->kh, (long long)c->kw, (long long)c->sh, (long long)c->groups,
          c->xblk == CPU_NHWC ? "nhwc" : c->xblk == 16 ? "16" : c->xblk == 8 ? "8" : "0", c->yblk,
          may_nhwc(c) ? " (or nhwc)" : "", c->npost);
  for (i = 0, d = ""; i < 5; i++)
    if (made[i]) {
      if (best[i] < 1e30) fprintf(stderr, "%s %s %.3f ms", d, name[i], best[i] * 1e3);
      else fprintf(stderr, "%s %s (untimed)", d, name[i]);
      if (i == pick) fprintf(stderr, " (kept)");
      d = ",";
    }
  fputc('\n', stderr);
}

/* Make en's primitive.  oneDNN's own (blocked) layouts make the fast
** kernels, but their reorders in and out cost more than they save on some
** shapes (a 1x1 conv over many channels: bench/conv_libs.lua), and a
** 1x1 may be faster still as a matmul (centry_make_mm); so each
** that can be made is, and the fastest on c's own data is kept (a
** convolution reads only its inputs: running it again changes nothing):
** one run each to touch the buffers, then the best of runs taken in
** turns: two each, and up to eight while those of the candidates within
** twice the fastest add up to under 2 ms (a
** ShuffleNet-sized conv takes 0.06 ms, where one run's noise decides),
** but one where the fastest takes 4 ms or more: a few percent of noise
** there, and each run more is the first call's (VGG-19's took 0.99 s
** with one, 1.37 with two).  Each is the whole answer where the others
** are refused (a post-op oneDNN cannot read across layouts).
** FUSELAB_CONV=plain / any keeps one of oneDNN's convolutions,
** FUSELAB_CONV=matmul the matmul form wherever it can be made,
** FUSELAB_CONV=depthwise cpu/conv_dw.c wherever it fits,
** FUSELAB_CONV=pointwise cpu/conv_pw.c. */
static int centry_pick(centry *en, const cpu_conv *c0) {
  centry cand[5];                                   /* 3: none; 4: cpu_conv_pw's weights */
  double best[5], tot[5], spent, fast;
  int made[5], alive[5], n, i, r, pick = -1, timed = conv_mode == 2 || conv_mode >= 4;
  /* a residual after per-channel post-ops: oneDNN's convolutions would
  ** need it split off (cpu_conv_run), the matmul form and cpu/conv_pw.c
  ** take it whole */
  int whole = conv_tail(c0) < c0->npost, sum = cpu_conv_sum_post(c0->post, c0->npost);
  int64_t ny = c0->n * c0->co * c0->oh * c0->ow;
  float *res = NULL;                                /* the residual, where it lies in y */
  cpu_conv cc = *c0;
  const cpu_conv *c = &cc;
  /* a residual its sum adds may lie in y (stored over: fuse/plan.c): the
  ** timed runs would each add to what the last one wrote, so they read a
  ** copy, and y has the residual back for the call that follows */
  if (sum >= 0 && c0->post[sum].src.p == c0->y) {
    if (!(res = malloc((size_t)ny * sizeof *res))) return 0;
    memcpy(res, c0->y, (size_t)ny * sizeof *res);
    cc.post[sum].src.p = res;
  }
  memset(cand, 0, sizeof cand);
  if (conv_mode == 5 && cpu_conv_dw_fits(c0)) {     /* FUSELAB_CONV=depthwise: no choice */
    en->dw = 1;
    free(res);
    return 1;
  }
  if (conv_mode == 6 && cpu_conv_pw_fits(c0)) {     /* FUSELAB_CONV=pointwise */
    if (pw_make(en, c)) {
      en->pw = 1;
      free(res);
      return 1;
    }
    centry_clear(en);                                /* no memory for its weights: the rest */
  }
  made[2] = timed && centry_make_mm(&cand[2], c);
  made[0] = !whole && conv_mode != 1 && !(conv_mode == 4 && made[2]) && centry_make(&cand[0], c, 1);
  made[1] = !whole && conv_mode != 3 && !(conv_mode == 4 && made[2]) && centry_make(&cand[1], c, 0);
  /* 3: a depthwise one on fuselab's loop (cpu/conv_dw.c), faster where
  ** plain values around it would cost oneDNN's blocked kernel a reorder in
  ** and out, slower on small maps of many channels (bench/RESULTS.md) */
  made[3] = timed && cpu_conv_dw_fits(c0);   /* c0: they refuse a residual in y */
  /* 4: a 1x1 on fuselab's loop (cpu/conv_pw.c), its epilogue in
  ** the same pass */
  made[4] = pw_allowed(c0) && pw_make(&cand[4], c);
  n = made[0] + made[1] + made[2] + made[3] + made[4];
  for (i = 0; i < 5; i++) {
    best[i] = 1e30;
    if (made[i] && n > 1) {                          /* touch the buffers */
      if (i < 3) centry_exec(&cand[i], c, 0);
      else made[i] = i == 3 ? cpu_conv_dw(c) == FL_OK : pw_exec(&cand[i], c, 0);
    }
  }
  for (i = 0; i < 5; i++) {
    alive[i] = made[i];
    tot[i] = 0;
  }
  for (r = 0, spent = 0, fast = 1e30;
       n > 1 && (r < 1 || (r < 2 && fast < 4e-3) || (r < 8 && spent < 2e-3)); r++) {
    for (i = 0; i < 5; i++)
      if (alive[i]) {
        double t = exec_seconds(i != 3 ? &cand[i] : NULL, c, i == 4);
        tot[i] += t;
        if (t < best[i]) best[i] = t;
        if (t < fast) fast = t;
      }
    /* one whose best of two is more than twice the fastest cannot win:
    ** its time leaves the budget and its runs go to the close ones
    ** (ShuffleNet's grouped 1x1 over 544 channels: oneDNN's 3.6 ms on
    ** plain layouts left one more round for three candidates near 0.2
    ** ms); not after one, which a busy moment can slow 40-fold */
    for (i = 0, spent = 0; i < 5; i++) {
      if (r >= 1 && alive[i] && best[i] > 2 * fast) alive[i] = 0;
      if (alive[i]) spent += tot[i];
    }
  }
  for (i = 0; i < 5; i++)
    if (made[i] && (pick < 0 || best[i] < best[pick])) pick = i;
  pick_trace(c, made, best, pick);
  for (i = 0; i < 5; i++)
    if (i != pick) centry_clear(&cand[i]);
  if (pick >= 0 && pick != 3) memcpy(&en->prim, &cand[pick].prim, sizeof *en - offsetof(centry, prim));
  en->dw = pick == 3;
  en->pw = pick == 4;
  if (res) {
    memcpy(c0->y, res, (size_t)ny * sizeof *res);
    free(res);
  }
  return pick >= 0;
}

static void centry_make_cached(void *en, const void *call) {
  ((centry *)en)->refused = !centry_pick(en, call);
}

static void centry_free(void *en) {
  centry_clear(en);
  free(en);
}

_Static_assert(offsetof(centry, k) == 0, "an entry's key comes first");
static pcache ccache = {sizeof(ckey), sizeof(centry), centry_make_cached, centry_free, {0}, {0}, 0, 0};

/* A 1x1 convolution over a 1x1 map (squeeze-and-excitation's two
** products, a classifier written as a convolution) of at most
** CPU_MM_ROWS_MAX images is a product of that many rows by a
** linear's weight ([co, c] rows): cpu/mm_rows.c, where oneDNN's
** convolution costs tens of microseconds for a few thousand
** multiply-adds.  Per-channel post-ops become a row broadcast to every
** image.  Over one pixel, blocks of channels (nChw8c) are the plain
** layout where the channels are whole blocks.  1 when run. */
static int conv_as_rows(const cpu_conv *c) {
  cpu_mm m;
  int i;
  if ((mm_mode() != 1 && mm_mode() != 3) || c->h != 1 || c->w != 1 || c->oh != 1 || c->ow != 1 ||
      c->kh != 1 || c->kw != 1 || c->groups != 1 || (c->xblk && c->c % c->xblk) || (c->yblk && c->co % c->yblk) || c->pt || c->pl ||
      c->pb || c->pr || c->n > CPU_MM_ROWS_MAX)
    return 0;
  memset(&m, 0, sizeof m);
  m.nd = 2;
  m.a.p = c->x, m.a.shape[0] = c->n, m.a.shape[1] = c->c, m.a.stride[0] = c->c, m.a.stride[1] = 1;
  m.b.p = c->wt, m.b.shape[0] = c->c, m.b.shape[1] = c->co, m.b.stride[0] = 1, m.b.stride[1] = c->c;
  m.dst.p = c->y, m.dst.shape[0] = c->n, m.dst.shape[1] = c->co, m.dst.stride[0] = c->co, m.dst.stride[1] = 1;
  m.bias = c->bias;
  m.npost = c->npost;
  for (i = 0; i < c->npost; i++) {
    cpu_mm_post *po = &m.post[i];
    *po = c->post[i];
    if (po->kind == CPU_MM_ADD_C || po->kind == CPU_MM_MUL_C) {
      po->kind = po->kind == CPU_MM_ADD_C ? CPU_MM_ADD : CPU_MM_MUL;
      po->src.shape[0] = 1, po->src.shape[1] = c->post[i].src.shape[0] == 1 ? 1 : c->co;
      po->src.stride[0] = 0, po->src.stride[1] = 1;
    } else if (po->kind == CPU_MM_ADD || po->kind == CPU_MM_MUL) {
      if (po->blk && c->co % po->blk) return 0;
      po->src.shape[0] = c->n, po->src.shape[1] = c->co, po->src.stride[0] = c->co, po->src.stride[1] = 1;
    }
  }
  return cpu_mm_rows(&m) == FL_OK;
}

int cpu_conv_run(const cpu_conv *c, fl_err *e) {
  ckey k;
  centry *en;
  void *p;
  int i, rc = FL_OK;
  if (!cpu_conv_enabled())
    return err_set(e, FL_EUNSUPPORTED, "conv2d: oneDNN is turned off (FUSELAB_CONV=blas)");
  if (c->npost > CPU_MM_MAXPOST || c->groups < 1 || c->n * c->c * c->h * c->w <= 0 ||
      c->co * c->oh * c->ow <= 0 || c->kh * c->kw <= 0 || c->c % c->groups || c->co % c->groups)
    return err_set(e, FL_EUNSUPPORTED, "conv2d: these sizes are beyond oneDNN's path");
  for (i = 0; i < c->npost; i++)
    if ((c->post[i].kind == CPU_MM_ADD || c->post[i].kind == CPU_MM_MUL) && !c->post[i].like_dst)
      return err_set(e, FL_EUNSUPPORTED, "conv2d: a post-op operand not laid out as the result");
  if (c->xoff) {      /* planes where a shuffle left them: fuselab's loop alone reads them */
    if (conv_mode == 1 || conv_mode == 3 || !cpu_conv_dw_fits(c))   /* FUSELAB_CONV=plain, any: oneDNN's */
      return err_set(e, FL_EUNSUPPORTED, "conv2d: shuffled planes, not a depthwise loop's");
    if ((rc = cpu_conv_dw(c)) != FL_OK) return err_set(e, rc, "conv2d: out of memory for a depthwise scratch");
    __atomic_fetch_add(&ndw, 1, __ATOMIC_RELAXED);
    __atomic_fetch_add(&ndws, 1, __ATOMIC_RELAXED);
    return FL_OK;
  }
  if (conv_as_rows(c)) return FL_OK;
  memset(&k, 0, sizeof k);
  k.d[0] = c->n; k.d[1] = c->c; k.d[2] = c->h; k.d[3] = c->w; k.d[4] = c->co; k.d[5] = c->kh;
  k.d[6] = c->kw; k.d[7] = c->oh; k.d[8] = c->ow; k.d[9] = c->groups; k.d[10] = c->sh;
  k.d[11] = c->sw; k.d[12] = c->dh; k.d[13] = c->dw; k.d[14] = c->pt; k.d[15] = c->pl;
  k.d[16] = c->pb; k.d[17] = c->pr;
  k.bias = c->bias != NULL;
  k.npost = c->npost;
  k.plain = conv_mode;
  k.xblk = c->xblk;
  k.yblk = c->yblk;
  k.nhwc_ok = may_nhwc(c);
  k.in_y = cpu_conv_post_in_y(c);
  for (i = 0; i < c->npost; i++) {
    k.kind[i] = c->post[i].kind;
    if (c->post[i].kind == CPU_MM_AFFINE) { k.ab[i][0] = c->post[i].alpha; k.ab[i][1] = c->post[i].beta; }
    if (c->post[i].kind == CPU_MM_ADD) k.ab[i][0] = (float)c->post[i].blk;
    if (c->post[i].kind == CPU_MM_ADD_C || c->post[i].kind == CPU_MM_MUL_C) {
      if (c->post[i].src.shape[0] != 1 && c->post[i].src.shape[0] != c->co)
        return err_set(e, FL_EUNSUPPORTED, "conv2d: a per-channel post-op of %lld values for %lld channels",
                       (long long)c->post[i].src.shape[0], (long long)c->co);
      k.ab[i][0] = (float)c->post[i].src.shape[0];
    }
  }
  /* a residual add (or a product) after per-channel post-ops (a batch
  ** norm's, ResNet's late blocks): no oneDNN kernel takes it as its sum,
  ** and as a binary post-op it runs a slow generic loop where it is taken
  ** at all; so the call runs the post-ops before it, and it and the
  ** elementwise rest run over y after, one pass while y is in cache, in
  ** whatever layout y has (each operand is laid out as y is) */
  if ((i = conv_tail(c)) < c->npost && !pw_allowed(c)) {
    cpu_conv head = *c;
    head.npost = i;
    head.wrote = NULL;                 /* the rest reads y in yblk's layout */
    if ((rc = cpu_conv_run(&head, e)) == FL_OK) cpu_conv_posts(c, i);
    return rc;
  }
  if ((rc = locked_entry(&ccache, &k, c, "conv2d", &p, e)) != FL_OK) return rc;
  en = p;
  if (en->refused) {
    rc = err_set(e, FL_EUNSUPPORTED, "conv2d: oneDNN refuses this convolution");
  } else if (en->dw) {
    if ((rc = cpu_conv_dw(c)) != FL_OK) rc = err_set(e, rc, "conv2d: out of memory for a depthwise scratch");
    else __atomic_fetch_add(&ndw, 1, __ATOMIC_RELAXED);
  } else if (en->pw) {
    if (!pw_exec(en, c, 1)) {
      rc = err_set(e, FL_ENOMEM, "conv2d: out of memory for a pointwise convolution");
    } else {
      __atomic_fetch_add(&npw, 1, __ATOMIC_RELAXED);
      if (c->xblk || c->yblk) __atomic_fetch_add(&npwb, 1, __ATOMIC_RELAXED);
    }
  } else if (!centry_exec(en, c, 1)) {
    rc = err_set(e, FL_EUNSUPPORTED, "conv2d: oneDNN failed to run a convolution");
  } else {
    nconvs++;
    nconv_posts += c->npost > 0;
    nconv_mms += en->mm;
    nblk_reads += c->xblk > 0;
    nblk_writes += c->yblk > 0;
    nnhwc += c->wrote && *c->wrote == CPU_NHWC;
  }
  pthread_mutex_unlock(&lock);
  return rc;
}

void cpu_conv_counts(int64_t *calls, int64_t *with_posts, int64_t *as_matmul) {
  pthread_mutex_lock(&lock);
  *calls = nconvs;
  *with_posts = nconv_posts;
  *as_matmul = nconv_mms;
  pthread_mutex_unlock(&lock);
}

static void block_counts(int64_t *reads, int64_t *writes, int64_t *nhwc) {
  pthread_mutex_lock(&lock);
  *reads = nblk_reads;
  *writes = nblk_writes;
  *nhwc = nnhwc;
  pthread_mutex_unlock(&lock);
}

/* --- 8-bit products ---------------------------------------------------
** The same invariant: one primitive per (batch, M, K, N, B's batching),
** kept with its memory objects. */

typedef struct ikey {
  int64_t batch, m, k, n;
  int b_batched;
} ikey;

typedef struct ientry {
  ikey k;                      /* first, as in entry */
  int refused;
  prim pr;                     /* mem: a, b, c */
} ientry;

static int64_t nint8;          /* under lock */

static void ientry_make(void *p, const void *call) {
  ientry *en = p;
  const ikey *k = &en->k;
  dnnl_memory_desc_t amd, bmd, cmd;
  dnnl_matmul_desc_t desc;
  dnnl_primitive_desc_t pd = NULL;
  dnnl_dims_t ad = {k->batch, k->m, k->k}, bd = {k->b_batched ? k->batch : 1, k->k, k->n},
              cd = {k->batch, k->m, k->n};
  const dnnl_memory_desc_t *mds[3] = {&amd, &bmd, &cmd};
  int i, ok = 0;
  (void)call;
  if (dnnl_memory_desc_init_by_tag(&amd, 3, ad, dnnl_u8, dnnl_abc) == dnnl_success &&
      dnnl_memory_desc_init_by_tag(&bmd, 3, bd, dnnl_s8, dnnl_abc) == dnnl_success &&
      dnnl_memory_desc_init_by_tag(&cmd, 3, cd, dnnl_s32, dnnl_abc) == dnnl_success &&
      dnnl_matmul_desc_init(&desc, &amd, &bmd, NULL, &cmd) == dnnl_success &&
      dnnl_primitive_desc_create(&pd, &desc, NULL, engine, NULL) == dnnl_success &&
      dnnl_primitive_create(&en->pr.p, pd) == dnnl_success) {
    static const int argk[3] = {DNNL_ARG_SRC, DNNL_ARG_WEIGHTS, DNNL_ARG_DST};
    ok = 1;
    for (i = 0; i < 3 && ok; i++) {
      ok = dnnl_memory_create(&en->pr.mem[i], mds[i], engine, DNNL_MEMORY_NONE) == dnnl_success;
      en->pr.args[i].arg = argk[i];
      en->pr.args[i].memory = en->pr.mem[i];
    }
    en->pr.nargs = 3;
    ok = ok && scratch_make(pd, &en->pr.scratch, &en->pr.scratch_buf, en->pr.args, &en->pr.nargs);
  }
  if (pd) dnnl_primitive_desc_destroy(pd);
  if (!ok) {
    prim_free(&en->pr);
    en->refused = 1;
  }
}

static void ientry_free(void *p) {
  ientry *en = p;
  if (!en) return;
  prim_free(&en->pr);
  free(en);
}

static pcache icache = {sizeof(ikey), sizeof(ientry), ientry_make, ientry_free, {0}, {0}, 0, 0};

int cpu_mm_int8(int64_t batch, int64_t m, int64_t k, int64_t n, const uint8_t *a, const int8_t *b,
                int b_batched, int32_t *c, fl_err *e) {
  ikey key;
  ientry *en;
  void *p;
  int rc;
  if (!cpu_mm_enabled())
    return err_set(e, FL_EUNSUPPORTED, "matmul_int8: oneDNN is turned off (FUSELAB_MATMUL=blas)");
  memset(&key, 0, sizeof key);
  key.batch = batch; key.m = m; key.k = k; key.n = n;
  key.b_batched = b_batched;
  if ((rc = locked_entry(&icache, &key, NULL, "matmul_int8", &p, e)) != FL_OK) return rc;
  en = p;
  if (en->refused) {
    rc = err_set(e, FL_EUNSUPPORTED, "matmul_int8: oneDNN refuses this product");
  } else {
    dnnl_memory_set_data_handle(en->pr.mem[0], (void *)a);
    dnnl_memory_set_data_handle(en->pr.mem[1], (void *)b);
    dnnl_memory_set_data_handle(en->pr.mem[2], c);
    if (dnnl_primitive_execute(en->pr.p, stream, en->pr.nargs, en->pr.args) != dnnl_success ||
        dnnl_stream_wait(stream) != dnnl_success)
      rc = err_set(e, FL_EUNSUPPORTED, "matmul_int8: oneDNN failed to run a product");
    else
      nint8++;
  }
  pthread_mutex_unlock(&lock);
  return rc;
}

int64_t cpu_mm_int8_calls(void) {
  int64_t n;
  pthread_mutex_lock(&lock);
  n = nint8;
  pthread_mutex_unlock(&lock);
  return n;
}

#else /* no oneDNN in this build */

int cpu_mm_int8(int64_t batch, int64_t m, int64_t k, int64_t n, const uint8_t *a, const int8_t *b,
                int b_batched, int32_t *c, fl_err *e) {
  (void)batch; (void)m; (void)k; (void)n; (void)a; (void)b; (void)b_batched; (void)c;
  return err_set(e, FL_EUNSUPPORTED, "matmul_int8: built without oneDNN");
}

int64_t cpu_mm_int8_calls(void) { return 0; }

int cpu_mm_enabled(void) { return 0; }

int cpu_mm_run(const cpu_mm *m, fl_err *e) {
  (void)m;
  return err_set(e, FL_EUNSUPPORTED, "matmul: built without oneDNN");
}

void cpu_mm_warm(void) {}
void cpu_mm_counts(int64_t *calls, int64_t *with_posts, int64_t *reordered) {
  *calls = *with_posts = *reordered = 0;
}
void cpu_mm_pack_info(int64_t *calls, int64_t *weights, int64_t *bytes, int64_t *made) {
  *calls = *weights = *bytes = *made = 0;
}

const char *cpu_mm_describe(void) { return "OpenBLAS sgemm (built without oneDNN)"; }

int cpu_conv_enabled(void) { return 0; }
int cpu_conv_block(void) { return 0; }

int cpu_conv_run(const cpu_conv *c, fl_err *e) {
  (void)c;
  return err_set(e, FL_EUNSUPPORTED, "conv2d: built without oneDNN");
}

void cpu_conv_counts(int64_t *calls, int64_t *with_posts, int64_t *as_matmul) {
  *calls = *with_posts = *as_matmul = 0;
}

static int64_t nunblocked, ndw, ndws, npw, npwb;
static void block_counts(int64_t *reads, int64_t *writes, int64_t *nhwc) { *reads = *writes = *nhwc = 0; }

#endif

int64_t cpu_conv_dw_calls(void) {
  return __atomic_load_n(&ndw, __ATOMIC_RELAXED);
}

int64_t cpu_conv_dw_shuffled(void) {
  return __atomic_load_n(&ndws, __ATOMIC_RELAXED);
}

void cpu_conv_pw_counts(int64_t *calls, int64_t *on_blocks) {
  *calls = __atomic_load_n(&npw, __ATOMIC_RELAXED);
  *on_blocks = __atomic_load_n(&npwb, __ATOMIC_RELAXED);
}

void cpu_conv_block_counts(int64_t *reads, int64_t *writes, int64_t *unblocked, int64_t *nhwc) {
  block_counts(reads, writes, nhwc);
  *unblocked = __atomic_load_n(&nunblocked, __ATOMIC_RELAXED);
}

/* cpu_relayout into plain, counted (cpu_conv_block_counts' unblocked) */
void cpu_unblock_nchw(const float *x, float *y, int64_t n, int64_t c, int64_t hw, int b) {
  __atomic_fetch_add(&nunblocked, 1, __ATOMIC_RELAXED);
  cpu_relayout(x, b, y, 0, n, c, hw);
}

/* oneDNN 2.6's kernels refuse a sum after a binary post-op: a residual
** after a per-channel one is a binary add, read in y's layout. */
int cpu_conv_sum_post(const cpu_mm_post *post, int npost) {
  int i;
  for (i = 0; i < npost; i++) {
    if (post[i].kind == CPU_MM_ADD_C || post[i].kind == CPU_MM_MUL_C) return -1;
    if (post[i].kind == CPU_MM_ADD) return i;
  }
  return -1;
}
