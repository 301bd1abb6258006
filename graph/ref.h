/*
** ref.h -- the reference interpreter: the oracle every compiled and eager
** result is compared against.  Naive loops over logical indices, every
** value read and accumulated as double -- int64 values as int64, exactly;
** clarity over speed, always.
*/
#ifndef FL_REF_H
#define FL_REF_H

#include "op.h"

/* Infer the output, allocate it (contiguous) into *out, run the reference
** kernel.  On failure *out is left empty.  View ops return copies: the
** reference has value semantics only. */
int ref_apply(fl_op op, const fl_tensor *const *in, int nin,
              const op_attrs *a, fl_tensor *out, fl_err *e);

/* FL_OK when v lies in int8's range (uint8's when is_unsigned), else an
** error naming op, what and v: the check matmul_int8's reference and its
** kernel share. */
int ref_int8_range(fl_op op, int64_t v, int is_unsigned, const char *what, fl_err *e);

/* The scalar references of the elementwise rows of ops.def (double), and
** their int64 forms (exact, wrapping on overflow), declared from the
** table itself.  A row's NONE declares nothing: FL_IS_NONE(x) is 1 for
** the token NONE (pasted onto FL_PROBE_, it becomes "~, 1"), 0 for a
** function's name. */
#define FL_PROBE_NONE ~, 1
#define FL_SECOND_(a, b, ...) b
#define FL_SECOND(...) FL_SECOND_(__VA_ARGS__, 0, ~)
#define FL_IS_NONE(x) FL_SECOND(FL_PROBE_##x)
#define FL_WHEN_0(...) __VA_ARGS__
#define FL_WHEN_1(...)
#define FL_CAT_(a, b) a##b
#define FL_CAT(a, b) FL_CAT_(a, b)
#define FL_UNLESS_NONE(x, ...) FL_CAT(FL_WHEN_, FL_IS_NONE(x))(__VA_ARGS__)
#define OP(id, name, mn, mx, kind, flags, infer, ref, sc, expr, isc, iexpr, grad, saves) \
  FL_UNLESS_NONE(sc, double sc(const double *x, const op_attrs *a);)               \
  FL_UNLESS_NONE(isc, int64_t isc(const int64_t *x, const op_attrs *a);)
#include "ops.def"
#undef OP

#endif
