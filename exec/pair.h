/*
** pair.h -- a compiled training pair, AOTAutograd's CompiledFunction: one
** object with the forward and backward programs of a partitioned joint
** graph and what passes between them.  The forward returns the results,
** then the values it saves for the backward, then the new values of what
** it writes back; the backward takes the saved values (each a forward
** output, or a forward input it reads again), then -- seeded -- the
** gradient of the first result (the loss, or any value that needs one)
** and of each other result that needs one, and returns one gradient per
** leaf (a parameter, or an input that requires grad).  Either program may be either backend's: a binding runs a
** training call the same way for the CPU and the device.
*/
#ifndef FL_EXEC_PAIR_H
#define FL_EXEC_PAIR_H

#include "program.h"

typedef struct exec_pair {
  int refs;
  exec_program *fw, *bw;  /* one reference each */
  int nres;               /* the forward's results (the loss first) */
  int nsaved;             /* the backward's saved inputs */
  int *saved_in;          /* per saved value: the forward input it is, or -1:
                             the forward's next output after the results */
  int nsaved_out;         /* how many of them the forward returns */
  int seeded;             /* the backward takes the gradient of result 0
                             (any shape); 0: a scalar loss's, 1 */
  int ntan;               /* other results whose gradients it takes after
                             that one (seeded only) */
  int *tan;               /* their positions among the results */
} exec_pair;

/* A pair (refs 1) taking references to fw and bw; NULL with e set when
** the shapes of the two do not fit together. */
exec_pair *exec_pair_new(exec_program *fw, exec_program *bw, int nres, int nsaved,
                         const int *saved_in, int seeded, int ntan, const int *tan, fl_err *e);
exec_pair *exec_pair_ref(exec_pair *p);
void exec_pair_free(exec_pair *p);

/* The forward on in[fw's inputs]: outs[fw's outputs] as exec_program_run
** gives them, and saved[nsaved] new references to what the backward
** reads (inputs and outputs). */
int exec_pair_forward(exec_pair *p, const fl_tensor *const *in, fl_tensor *outs, fl_tensor *saved,
                      fl_err *e);
/* The backward on saved[nsaved] and, seeded, gout and tan[ntan]:
** gin[bw's outputs] get the gradients. */
int exec_pair_backward(exec_pair *p, const fl_tensor *saved, const fl_tensor *gout,
                       const fl_tensor *tan, fl_tensor *gin, fl_err *e);

#endif
