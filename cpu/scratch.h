/*
** scratch.h -- each thread's scratch buffers, kept between calls
** (cpu/scratch.c says why).
*/
#ifndef FUSELAB_CPU_SCRATCH_H
#define FUSELAB_CPU_SCRATCH_H

#include <stddef.h>

/* slots a thread may hold at once (a pool's two buffers) */
#define CPU_SCRATCH_SLOTS 2
/* the largest buffer a slot keeps between calls (bytes) */
#define CPU_SCRATCH_KEEP ((size_t)4 << 20)

/* n bytes, 64-byte aligned, in the calling thread's slot (below
** CPU_SCRATCH_SLOTS), valid until that thread asks for the slot again;
** NULL where memory is short.  Hand it back with cpu_scratch_done. */
void *cpu_scratch(int slot, size_t n);
/* Frees p where it was allocated for its call alone. */
void cpu_scratch_done(int slot, void *p);

#endif
