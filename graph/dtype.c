/*
** dtype.c -- element types, their 16-bit float encodings and PyTorch's
** type promotion.  Invariant: every conversion here is total -- any bit
** pattern loads, any double stores (NaN, infinities and out-of-range
** values included) without undefined behaviour, and the 16-bit formats
** round to nearest, ties to even, exactly as the hardware would.
*/
#include <float.h>
#include <math.h>
#include <string.h>

#include "dtype.h"

static const struct {
  const char *name;
  size_t size;
} info[FL_NDTYPES] = {
  [FL_F32] = {"float32", 4},
  [FL_F16] = {"float16", 2},
  [FL_BF16] = {"bfloat16", 2},
  [FL_I64] = {"int64", 8},
  [FL_BOOL] = {"bool", 1},
  [FL_F64] = {"float64", 8},
};

static int valid(fl_dtype t) { return t >= 0 && t < FL_NDTYPES; }

size_t dtype_size(fl_dtype t) { return valid(t) ? info[t].size : 0; }

const char *dtype_name(fl_dtype t) { return valid(t) ? info[t].name : "?"; }

int dtype_from_name(const char *name, fl_dtype *out) {
  int i;
  if (!name) return -1;
  for (i = 0; i < FL_NDTYPES; i++)
    if (strcmp(info[i].name, name) == 0) {
      if (out) *out = (fl_dtype)i;
      return 0;
    }
  return -1;
}

int dtype_is_float(fl_dtype t) {
  return t == FL_F32 || t == FL_F16 || t == FL_BF16 || t == FL_F64;
}

/* --- 16-bit floats ------------------------------------------------------ */

static uint32_t f2u(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
static float u2f(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }

float f16_to_f32(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000) << 16;
  uint32_t e = (h >> 10) & 0x1f, m = h & 0x3ff;
  if (e == 0) {
    /* zero or subnormal: m * 2^-24, exact in float */
    float v = (float)m * 0x1p-24f;
    return sign ? -v : v;
  }
  if (e == 31) return u2f(sign | 0x7f800000u | (m << 13));   /* inf, NaN */
  return u2f(sign | ((e + 112) << 23) | (m << 13));          /* rebias 15->127 */
}

uint16_t f32_to_f16(float f) {
  uint32_t x = f2u(f);
  uint32_t sign = (x >> 16) & 0x8000;
  uint32_t ax = x & 0x7fffffffu;
  uint32_t q, rem, halfway;
  if (ax >= 0x7f800000u) {
    if (ax > 0x7f800000u)   /* NaN: keep the top payload bits, force quiet */
      return (uint16_t)(sign | 0x7e00 | ((ax >> 13) & 0x3ff));
    return (uint16_t)(sign | 0x7c00);
  }
  /* 65520 is halfway between 65504 (max half) and 2^16: ties go to the even
  ** neighbour, which is infinity */
  if (ax >= 0x477ff000u) return (uint16_t)(sign | 0x7c00);
  if (ax < 0x38800000u) {
    /* below 2^-14: a half subnormal, in units of 2^-24.  2^-25 (the
    ** halfway point to the smallest subnormal) ties to zero. */
    uint32_t e = ax >> 23, m, shift;
    if (ax <= 0x33000000u) return (uint16_t)sign;
    m = (ax & 0x7fffffu) | 0x800000u;
    shift = 126 - e;                       /* 14..24 */
    q = m >> shift;
    rem = m & ((1u << shift) - 1);
    halfway = 1u << (shift - 1);
    if (rem > halfway || (rem == halfway && (q & 1))) q++;
    return (uint16_t)(sign | q);           /* q == 0x400 is the smallest normal */
  }
  /* normal: rebias the exponent, drop 13 mantissa bits; a carry out of the
  ** mantissa correctly bumps the exponent */
  ax -= 0x38000000u;
  q = ax >> 13;
  rem = ax & 0x1fff;
  if (rem > 0x1000 || (rem == 0x1000 && (q & 1))) q++;
  return (uint16_t)(sign | q);
}

float bf16_to_f32(uint16_t h) { return u2f((uint32_t)h << 16); }

uint16_t f32_to_bf16(float f) {
  uint32_t x = f2u(f);
  if ((x & 0x7fffffffu) > 0x7f800000u)     /* NaN: truncate, stay quiet */
    return (uint16_t)((x >> 16) | 0x40);
  /* adding 0x7fff plus the lowest kept bit rounds to nearest even; it
  ** carries into the exponent (and up to infinity) when it must */
  x += 0x7fffu + ((x >> 16) & 1);
  return (uint16_t)(x >> 16);
}

/* --- through double ------------------------------------------------------ */

/* double -> float without relying on out-of-range conversion behaviour:
** values past FLT_MAX round to FLT_MAX up to the halfway point to 2^128,
** beyond it to infinity. */
static float to_float(double v) {
  double a = fabs(v);
  if (isnan(v) || a <= FLT_MAX) return (float)v;
  if (a < 0x1.ffffffp127) return v < 0 ? -FLT_MAX : FLT_MAX;
  return v < 0 ? -INFINITY : INFINITY;
}

double dtype_load(fl_dtype t, const void *p) {
  switch (t) {
  case FL_F32: { float f; memcpy(&f, p, 4); return f; }
  case FL_F16: { uint16_t h; memcpy(&h, p, 2); return f16_to_f32(h); }
  case FL_BF16: { uint16_t h; memcpy(&h, p, 2); return bf16_to_f32(h); }
  case FL_I64: { int64_t i; memcpy(&i, p, 8); return (double)i; }
  case FL_BOOL: return *(const unsigned char *)p != 0;
  case FL_F64: { double d; memcpy(&d, p, 8); return d; }
  default: return 0.0;
  }
}

void dtype_store(fl_dtype t, void *p, double v) {
  switch (t) {
  case FL_F32: { float f = to_float(v); memcpy(p, &f, 4); break; }
  case FL_F16: { uint16_t h = f32_to_f16(to_float(v)); memcpy(p, &h, 2); break; }
  case FL_BF16: { uint16_t h = f32_to_bf16(to_float(v)); memcpy(p, &h, 2); break; }
  case FL_I64: { int64_t i = dtype_f2i(v); memcpy(p, &i, 8); break; }
  case FL_BOOL: *(unsigned char *)p = (v != 0.0); break;  /* NaN != 0: true */
  case FL_F64: memcpy(p, &v, 8); break;
  default: break;
  }
}

int64_t dtype_f2i(double v) {
  /* the range test is false for NaN too */
  if (!(v >= -0x1p63 && v < 0x1p63)) return INT64_MIN;
  return (int64_t)v;
}

int64_t dtype_load_i64(fl_dtype t, const void *p) {
  switch (t) {
  case FL_I64: { int64_t i; memcpy(&i, p, 8); return i; }
  case FL_BOOL: return *(const unsigned char *)p != 0;
  default: return dtype_f2i(dtype_load(t, p));
  }
}

void dtype_store_i64(fl_dtype t, void *p, int64_t v) {
  switch (t) {
  case FL_I64: memcpy(p, &v, 8); break;
  case FL_BOOL: *(unsigned char *)p = v != 0; break;
  case FL_F32: { float f = (float)v; memcpy(p, &f, 4); break; }
  case FL_F64: { double d = (double)v; memcpy(p, &d, 8); break; }
  /* through float32, as the generated code and eager round */
  case FL_F16: { uint16_t h = f32_to_f16((float)v); memcpy(p, &h, 2); break; }
  case FL_BF16: { uint16_t h = f32_to_bf16((float)v); memcpy(p, &h, 2); break; }
  default: break;
  }
}

/* --- promotion ------------------------------------------------------------ */

enum { UNDEF = -1 };

static int category(int t) {
  return t == UNDEF ? -1 : t == FL_BOOL ? 0 : t == FL_I64 ? 1 : 2;
}

/* The lattice of two concrete types: bool < int64 < floats; among floats
** float64 wins, and two different narrower floats meet at float32. */
static int promote2(int a, int b) {
  if (a == UNDEF) return b;
  if (b == UNDEF || a == b) return a;
  if (category(a) != category(b)) return category(a) > category(b) ? a : b;
  if (a == FL_F64 || b == FL_F64) return FL_F64;
  return FL_F32;   /* float16 with bfloat16, or either with float32 */
}

/* PyTorch's combine_categories: the stronger-priority result wins unless
** the weaker one is of a higher category (a float scalar with an int
** tensor), in which case they promote. */
static int combine(int higher, int lower) {
  if (higher == UNDEF) return lower;
  if (category(higher) == 2) return higher;
  if (higher == FL_BOOL || category(lower) > category(higher))
    return promote2(higher, lower);
  return higher;
}

/* A wrapped Lua number contributes only its category, at the default
** width: floats as float32, integers as int64. */
static int wrapped_type(fl_dtype t) {
  return dtype_is_float(t) ? FL_F32 : t;
}

fl_dtype dtype_promote(fl_dtype a, int a_dimless, int a_wrapped,
                       fl_dtype b, int b_dimless, int b_wrapped) {
  int dim = UNDEF, zero = UNDEF, wrap = UNDEF, r;
  if (a_wrapped) wrap = promote2(wrap, wrapped_type(a));
  else if (a_dimless) zero = promote2(zero, a);
  else dim = promote2(dim, a);
  if (b_wrapped) wrap = promote2(wrap, wrapped_type(b));
  else if (b_dimless) zero = promote2(zero, b);
  else dim = promote2(dim, b);
  r = combine(dim, combine(zero, wrap));
  return r == UNDEF ? FL_F32 : (fl_dtype)r;
}
