/*
** rng.h -- the random stream behind fl.rand/fl.randn.  Philox4x32-10,
** counter based: the same seed gives the same numbers on every backend
** and every machine (values are generated on the host).
*/
#ifndef FL_RNG_H
#define FL_RNG_H

#include <stdint.h>
#include "tensor.h"

void rng_seed(uint64_t seed);
/* Fill t (contiguous, any float dtype) with U[0,1) or N(0,1) values,
** advancing the global stream. */
void rng_uniform(fl_tensor *t);
void rng_normal(fl_tensor *t);

#endif
