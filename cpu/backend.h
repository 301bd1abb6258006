/*
** backend.h -- the C backend of the executor (exec/program.h): kernels
** rendered as C (codegen.c), compiled by $CC through exec/cache.c and
** dlopen'd, run on the CPU; extern steps (products, convolutions) through
** the eager kernels, into their planned buffers.
*/
#ifndef FL_CPU_BACKEND_H
#define FL_CPU_BACKEND_H

#include "../exec/program.h"

extern const exec_backend cpu_backend;

/* The C kernel's signature: buf[i] is the data of the kernel's i-th buffer,
** arg what fk_bind computed. */
typedef void (*cpu_kernel_fn)(void **buf, const int64_t *arg);

#endif
