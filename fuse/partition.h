/*
** partition.h -- a joint graph (graph/joint.h) split into the forward
** graph training runs first and the backward graph it runs after, as
** AOTAutograd's partitioners do.  What crosses from one to the other are
** the saved values: the forward returns them after its results, the
** backward takes them as its inputs, in the same order (then the joint
** graph's tangents, if it has any), and returns the gradients in the
** joint graph's order.  Three policies:
**   PART_SAVE_ALL       every forward value the backward reads is saved
**                       (eager autograd's choice)
**   PART_RECOMPUTE_ALL  only the graph's inputs are saved; the backward
**                       recomputes every forward op it needs (activation
**                       checkpointing)
**   PART_MINCUT         a minimum cut over bytes (igraph's max-flow):
**                       products, convolutions, pools, random draws and
**                       reductions of large inputs are never recomputed;
**                       cheap pointwise chains are, when saving their
**                       inputs costs fewer bytes than saving them
** Bytes are the cost model's (fuse/memplan.c).  Parameters and constants
** are never saved: both graphs hold them.
*/
#ifndef FL_PARTITION_H
#define FL_PARTITION_H

#include "../graph/ir.h"

typedef enum part_policy { PART_MINCUT, PART_SAVE_ALL, PART_RECOMPUTE_ALL } part_policy;

typedef struct part_saved {
  int node;                 /* the joint graph's node */
  int64_t bytes;
  char why[128];
} part_saved;

typedef struct part_recomputed {
  int node;                 /* the joint graph's forward op */
  char reason[256];
} part_recomputed;

typedef struct part_info {
  part_saved *saved;        /* in the backward's input order */
  int nsaved;
  part_recomputed *rec;     /* forward ops the backward runs again */
  int nrec;
  int64_t saved_bytes;      /* what the forward keeps for the backward */
  int64_t eager_saved_bytes;/* the same under PART_SAVE_ALL */
} part_info;

/* Splits joint graph j under policy pol into *fw and *bw (new graphs,
** owned by the caller) and fills info (part_info_free).  FL_OK, or an
** error with e filled (j not a joint graph, out of memory). */
int fuse_partition(const ir_graph *j, part_policy pol, ir_graph **fw, ir_graph **bw,
                   part_info *info, fl_err *e);
void part_info_free(part_info *info);

#endif
