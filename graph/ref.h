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

/* Scalar references of the elementwise rows of ops.def. */
double sc_copy(const double *x, const op_attrs *a);
double sc_abs(const double *x, const op_attrs *a);
double sc_neg(const double *x, const op_attrs *a);
double sc_exp(const double *x, const op_attrs *a);
double sc_log(const double *x, const op_attrs *a);
double sc_sqrt(const double *x, const op_attrs *a);
double sc_rsqrt(const double *x, const op_attrs *a);
double sc_sin(const double *x, const op_attrs *a);
double sc_cos(const double *x, const op_attrs *a);
double sc_tanh(const double *x, const op_attrs *a);
double sc_sigmoid(const double *x, const op_attrs *a);
double sc_relu(const double *x, const op_attrs *a);
double sc_gelu(const double *x, const op_attrs *a);
double sc_gelu_tanh(const double *x, const op_attrs *a);
double sc_silu(const double *x, const op_attrs *a);
double sc_erf(const double *x, const op_attrs *a);
double sc_clamp(const double *x, const op_attrs *a);
double sc_add(const double *x, const op_attrs *a);
double sc_sub(const double *x, const op_attrs *a);
double sc_mul(const double *x, const op_attrs *a);
double sc_div(const double *x, const op_attrs *a);
double sc_pow(const double *x, const op_attrs *a);
double sc_fmod(const double *x, const op_attrs *a);
double sc_remainder(const double *x, const op_attrs *a);
double sc_maximum(const double *x, const op_attrs *a);
double sc_minimum(const double *x, const op_attrs *a);
double sc_eq(const double *x, const op_attrs *a);
double sc_ne(const double *x, const op_attrs *a);
double sc_lt(const double *x, const op_attrs *a);
double sc_le(const double *x, const op_attrs *a);
double sc_gt(const double *x, const op_attrs *a);
double sc_ge(const double *x, const op_attrs *a);
double sc_where(const double *x, const op_attrs *a);

/* The int64 forms (ops.def's iscalar): exact, wrapping on overflow. */
int64_t isc_copy(const int64_t *x, const op_attrs *a);
int64_t isc_abs(const int64_t *x, const op_attrs *a);
int64_t isc_neg(const int64_t *x, const op_attrs *a);
int64_t isc_relu(const int64_t *x, const op_attrs *a);
int64_t isc_clamp(const int64_t *x, const op_attrs *a);
int64_t isc_add(const int64_t *x, const op_attrs *a);
int64_t isc_sub(const int64_t *x, const op_attrs *a);
int64_t isc_mul(const int64_t *x, const op_attrs *a);
int64_t isc_pow(const int64_t *x, const op_attrs *a);
int64_t isc_maximum(const int64_t *x, const op_attrs *a);
int64_t isc_fmod(const int64_t *x, const op_attrs *a);
int64_t isc_remainder(const int64_t *x, const op_attrs *a);
int64_t isc_minimum(const int64_t *x, const op_attrs *a);
int64_t isc_eq(const int64_t *x, const op_attrs *a);
int64_t isc_ne(const int64_t *x, const op_attrs *a);
int64_t isc_lt(const int64_t *x, const op_attrs *a);
int64_t isc_le(const int64_t *x, const op_attrs *a);
int64_t isc_gt(const int64_t *x, const op_attrs *a);
int64_t isc_ge(const int64_t *x, const op_attrs *a);
int64_t isc_where(const int64_t *x, const op_attrs *a);

#endif
