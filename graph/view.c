/*
** view.c -- the strides that let view ops share their input's storage.
** Invariant: a view addresses exactly the elements its input addresses
** (or a subset, for narrow; or repeats, for expand), so element k of the
** view in row-major order is the element the op's definition names;
** nothing here copies or allocates data.
*/
#include <string.h>

#include "view.h"

/* PyTorch's computeStride: strides for viewing (oldshape, oldstride) as
** newshape without a copy, or 0 when some new dim would have to span two
** memory chunks that are not evenly spaced (e.g. flattening a transpose).
** The old dims are walked from the innermost out, split into chunks that
** are contiguous among themselves; each chunk must be covered exactly by
** consecutive new dims. */
static int compute_stride(const fl_meta *om, const int64_t *ostride,
                          const fl_meta *nm, int64_t *nstride) {
  int64_t numel = meta_numel(om), chunk_base, tensor_numel = 1, view_numel = 1;
  int view_d = nm->ndim - 1, tensor_d, d;
  if (numel == 0) {
    /* nothing is addressed: any strides do, contiguous ones read best */
    int64_t s = 1;
    for (d = nm->ndim - 1; d >= 0; d--) {
      nstride[d] = s;
      s *= nm->shape[d] > 0 ? nm->shape[d] : 1;
    }
    return 1;
  }
  chunk_base = om->ndim ? ostride[om->ndim - 1] : 1;
  for (tensor_d = om->ndim - 1; tensor_d >= 0; tensor_d--) {
    tensor_numel *= om->shape[tensor_d];
    if (tensor_d == 0 ||
        (om->shape[tensor_d - 1] != 1 &&
         ostride[tensor_d - 1] != tensor_numel * chunk_base)) {
      while (view_d >= 0 &&
             (view_numel < tensor_numel || nm->shape[view_d] == 1)) {
        nstride[view_d] = view_numel * chunk_base;
        view_numel *= nm->shape[view_d];
        view_d--;
      }
      if (view_numel != tensor_numel) return 0;
      if (tensor_d > 0) {
        chunk_base = ostride[tensor_d - 1];
        tensor_numel = 1;
        view_numel = 1;
      }
    }
  }
  /* leftover new dims can only be size 1 (a 0-dim input viewed as [1,1]) */
  for (; view_d >= 0; view_d--) {
    if (nm->shape[view_d] != 1) return 0;
    nstride[view_d] = 1;
  }
  return 1;
}

/* *out is overwritten (not released) and ends holding its own reference
** to in's storage; on failure it is left empty. */
int view_apply(fl_op op, const fl_tensor *in, const op_attrs *a,
               const fl_meta *outm, fl_tensor *out, fl_err *e) {
  fl_tensor r;
  char sa[160], sb[160];
  int d, k, nd = in->m.ndim;
  r = *in;
  r.m = *outm;
  r.m.dtype = in->m.dtype;     /* a view never reinterprets bytes */
  r.m.device = in->m.device;
  r.m.wrapped = 0;
  switch (op) {
  case OP_RESHAPE:
  case OP_VIEW:
    if (meta_numel(outm) != meta_numel(&in->m)) break;
    if (ten_is_contiguous(in)) {
      ten_set_contiguous_strides(&r);
    } else if (!compute_stride(&in->m, in->stride, outm, r.stride)) {
      memset(out, 0, sizeof *out);
      if (op == OP_VIEW)
        return err_set(e, FL_EUNSUPPORTED,
                       "view: size is not compatible with input tensor's size "
                       "and stride (at least one dimension spans across two "
                       "contiguous subspaces): input %s cannot be viewed as %s; "
                       "use reshape instead",
                       meta_shape_str(&in->m, sa, sizeof sa),
                       meta_shape_str(outm, sb, sizeof sb));
      return err_set(e, FL_EUNSUPPORTED,
                     "reshape: input %s cannot be viewed as %s without a copy",
                     meta_shape_str(&in->m, sa, sizeof sa),
                     meta_shape_str(outm, sb, sizeof sb));
    }
    ten_share(out, &r);
    return FL_OK;
  case OP_TRANSPOSE: {
    int64_t i0 = a->i[0], i1 = a->i[1], t;
    if (nd == 0 && i0 == 0 && i1 == 0) { ten_share(out, &r); return FL_OK; }
    if (i0 < 0 || i0 >= nd || i1 < 0 || i1 >= nd || outm->ndim != nd ||
        outm->shape[i0] != in->m.shape[i1] || outm->shape[i1] != in->m.shape[i0])
      break;
    t = r.stride[i0]; r.stride[i0] = r.stride[i1]; r.stride[i1] = t;
    ten_share(out, &r);
    return FL_OK;
  }
  case OP_PERMUTE:
    if (a->ndims != nd || outm->ndim != nd) break;
    for (d = 0; d < nd; d++) {
      if (a->dims[d] < 0 || a->dims[d] >= nd ||
          outm->shape[d] != in->m.shape[a->dims[d]])
        goto bad;
      r.stride[d] = in->stride[a->dims[d]];
    }
    ten_share(out, &r);
    return FL_OK;
  case OP_UNSQUEEZE: {
    int64_t u = a->i[0];
    if (u < 0 || u > nd || nd + 1 > FL_MAX_DIMS) break;
    for (d = 0, k = 0; d <= nd; d++) {
      if (d == u) {
        /* the stride a size-1 dim would have in place: irrelevant to
        ** addressing, but it keeps contiguous inputs contiguous-looking */
        if (u == nd || !sz_mul(in->m.shape[u], in->stride[u], &r.stride[d]))
          r.stride[d] = 1;
      } else
        r.stride[d] = in->stride[k++];
    }
    ten_share(out, &r);
    return FL_OK;
  }
  case OP_SQUEEZE:
    for (d = 0, k = 0; d < nd; d++) {
      int drop = in->m.shape[d] == 1 && (!a->i[1] || a->i[0] == d);
      if (drop) continue;
      if (k >= outm->ndim) goto bad;
      r.stride[k++] = in->stride[d];
    }
    if (k != outm->ndim) break;
    ten_share(out, &r);
    return FL_OK;
  case OP_EXPAND: {
    int lead = outm->ndim - nd;
    if (lead < 0) break;
    for (d = 0; d < outm->ndim; d++) {
      int sd = d - lead;
      if (sd < 0) r.stride[d] = 0;
      else if (in->m.shape[sd] == outm->shape[d]) r.stride[d] = in->stride[sd];
      else if (in->m.shape[sd] == 1) r.stride[d] = 0;
      else goto bad;
    }
    ten_share(out, &r);
    return FL_OK;
  }
  case OP_NARROW: {
    int64_t dim = a->i[0], start = a->i[1], len = a->i[2];
    if (dim < 0 || dim >= nd || start < 0 || len < 0 ||
        start > in->m.shape[dim] || len > in->m.shape[dim] - start)
      break;
    /* an empty result keeps the offset in range of the storage; one with
    ** elements addresses them inside it, so the sum cannot overflow */
    if (meta_numel(outm) > 0) r.offset = in->offset + start * in->stride[dim];
    ten_share(out, &r);
    return FL_OK;
  }
  case OP_SLICE: {
    int64_t dim = a->i[0], start = a->i[1], len = a->i[2], step = a->i[3];
    if (dim < 0 || dim >= nd || start < 0 || len < 0 || step < 1 ||
        start > in->m.shape[dim] || (len > 0 && (len - 1) > (in->m.shape[dim] - 1 - start) / step))
      break;
    if (meta_numel(outm) > 0) r.offset = in->offset + start * in->stride[dim];
    if (len > 1) r.stride[dim] = in->stride[dim] * step;   /* in range: inside the storage */
    ten_share(out, &r);
    return FL_OK;
  }
  default:
    memset(out, 0, sizeof *out);
    return err_set(e, FL_EINVAL, "%s: not a view op", op_name(op));
  }
bad:
  memset(out, 0, sizeof *out);
  return err_set(e, FL_EINVAL, "%s: output %s does not match input %s",
                 op_name(op), meta_shape_str(outm, sa, sizeof sa),
                 meta_shape_str(&in->m, sb, sizeof sb));
}
