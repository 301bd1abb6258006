/*
** joint.h -- the joint forward+backward graph of a captured loss, as
** AOTAutograd traces it: the forward's nodes, then the derivative rules of
** the op table (grad.h) applied to them in reverse, in one graph.  Its
** outputs are the forward's results, then the gradient of every leaf (input
** or parameter) that required grad when captured, then the forward's
** write-backs; joint_nres says where the gradients start.  The partitioner
** (fuse/partition.h) splits it into a forward and a backward graph.
*/
#ifndef FL_JOINT_H
#define FL_JOINT_H

#include "ir.h"

/* The joint graph of g, whose first result must be a float scalar (the
** loss; its gradient is 1).  With tangents, the gradient reaching each
** result that needs one (the loss, and every other float result computed
** from a leaf that requires grad) is an input of the joint graph instead,
** a tangent, as AOTAutograd's joint takes them: its backward serves a
** function whose several results each carry a gradient.  A dropout(x)
** becomes x * dropout(ones): its mask is a forward value the backward
** reads.  NULL with e filled: no leaf requires grad, a loss that is not a
** scalar, symbolic sizes. */
ir_graph *ir_joint(const ir_graph *g, int tangents, fl_err *e);

/* Whether node i of joint graph j is one of its tangents. */
int ir_joint_is_tangent(const ir_graph *j, int i);

/* fwd[i] = 1 for the nodes of j's forward half: those its results and
** write-backs need.  j is a joint graph (joint_nres > 0). */
void ir_joint_forward(const ir_graph *j, char *fwd);

#endif
