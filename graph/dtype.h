/*
** dtype.h -- element types.  float16 and bfloat16 are stored as 16-bit
** patterns and computed in float32 (or double in the reference); float64
** is computed in double.
*/
#ifndef FL_DTYPE_H
#define FL_DTYPE_H

#include <stddef.h>
#include <stdint.h>

typedef enum fl_dtype {
  FL_F32,   /* "float32", the default */
  FL_F16,   /* "float16", IEEE half */
  FL_BF16,  /* "bfloat16", top half of a float32 */
  FL_I64,   /* "int64" */
  FL_BOOL,  /* "bool", one byte, 0 or 1 */
  FL_F64,   /* "float64": computed in double everywhere (eager through the
               reference kernels, compiled as one library call per op) */
  FL_NDTYPES
} fl_dtype;

size_t dtype_size(fl_dtype t);
const char *dtype_name(fl_dtype t);
/* 0 and *out set when name is a known dtype, else -1 */
int dtype_from_name(const char *name, fl_dtype *out);
int dtype_is_float(fl_dtype t);

/* Round-to-nearest-even conversions; NaN and infinities preserved. */
float f16_to_f32(uint16_t h);
uint16_t f32_to_f16(float f);
float bf16_to_f32(uint16_t h);
uint16_t f32_to_bf16(float f);

/* Read / write one element of type t at p through double (the reference
** interpreter's currency for floats).  Storing to int64 converts as
** dtype_f2i does, to bool tests != 0, as a PyTorch cast does. */
double dtype_load(fl_dtype t, const void *p);
void dtype_store(fl_dtype t, void *p, double v);

/* The same through int64, exact for int64 and bool (integer arithmetic
** never goes through double).  Loading a float converts as dtype_f2i;
** storing to a float rounds the integer once, to nearest. */
int64_t dtype_load_i64(fl_dtype t, const void *p);
void dtype_store_i64(fl_dtype t, void *p, int64_t v);

/* float -> int64 as every backend does it: truncate toward zero; NaN,
** infinities and values outside int64 give INT64_MIN (what x86's
** conversion instruction, and so PyTorch on x86, returns), never
** undefined behaviour. */
int64_t dtype_f2i(double v);

/* PyTorch's type promotion for an op over two operands.  dimless marks a
** 0-dim operand, wrapped a Lua number (weakest of all). */
fl_dtype dtype_promote(fl_dtype a, int a_dimless, int a_wrapped,
                       fl_dtype b, int b_dimless, int b_wrapped);

#endif
