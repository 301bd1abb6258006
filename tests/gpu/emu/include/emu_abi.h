/*
** emu_abi.h -- what a kernel compiled for the emulator and the emulated
** runtime (libcudart shim) share: the current thread's coordinates and
** the few runtime calls device code makes.  C, so both the C runtime and
** the C++ kernel header include it.
** Invariant: emu_self and emu_dims describe the CUDA thread whose fiber
** is running; the scheduler sets them before every switch into a fiber.
*/
#ifndef FL_EMU_ABI_H
#define FL_EMU_ABI_H

#ifdef __cplusplus
extern "C" {
#endif

typedef struct emu_uint3 { unsigned x, y, z; } emu_uint3;

/* one CUDA thread as device code sees it */
typedef struct emu_thread_ids {
  emu_uint3 tid;      /* threadIdx */
  unsigned lane;      /* linear thread index % 32 */
} emu_thread_ids;

/* the launch as device code sees it */
typedef struct emu_launch_dims {
  emu_uint3 block;    /* blockIdx */
  emu_uint3 bdim;     /* blockDim */
  emu_uint3 gdim;     /* gridDim */
} emu_launch_dims;

extern emu_thread_ids *emu_self;
extern emu_launch_dims emu_dims;

/* __syncthreads() at source line `line` of the kernel's file */
void emu_syncthreads(int line);
/* a warp shuffle: mode 0 = idx (arg = source lane), 1 = up, 2 = down,
** 3 = xor (arg = delta / lane mask); the value travels as 64 bits */
unsigned long long emu_shfl(int line, unsigned mask, unsigned long long v, int mode,
                            int arg, int width);
/* a warp-collective operation (wmma::*_sync): every lane must arrive */
void emu_warp_sync(int line, const char *what);
/* device code found an error it cannot recover from in this launch */
void emu_fault(const char *fmt, ...);

#ifdef __cplusplus
}
#endif

#endif
