#!/usr/bin/env python3
"""gen_node.py -- ONNX's current backend node tests, written as data.

  python3 tests/onnx/gen_node.py OUTDIR

Needs the PyPI package onnx (setup.sh --test installs the version
tests/onnx/current.sh names in a virtual environment outside the tree).
Each case the onnx package defines in onnx.backend.test.case.node becomes
OUTDIR/<case>/model.onnx and test_data_set_<i>/{input,output}_<j>.pb, the
layout of Debian's libonnx-testdata, so tests/onnx/runner.lua reads both.
Prints the onnx version, its newest opset and the number of cases.
"""
import os
import sys

import onnx
from onnx import numpy_helper
from onnx.backend.test.case import node


def main(out):
    n = 0
    for case in node.collect_testcases(None):
        d = os.path.join(out, case.name)
        os.makedirs(d, exist_ok=True)
        with open(os.path.join(d, "model.onnx"), "wb") as f:
            f.write(case.model.SerializeToString())
        g = case.model.graph
        for i, (inputs, outputs) in enumerate(case.data_sets or []):
            ds = os.path.join(d, "test_data_set_%d" % i)
            os.makedirs(ds, exist_ok=True)
            for kind, values, decl in (("input", inputs, g.input), ("output", outputs, g.output)):
                for j, x in enumerate(values):
                    ty = decl[j].type
                    if ty.HasField("optional_type"):
                        # an OptionalProto (empty when x is None)
                        t = numpy_helper.from_optional(x, decl[j].name)
                    elif ty.HasField("sequence_type"):
                        t = numpy_helper.from_list(list(x), decl[j].name)
                    elif isinstance(x, onnx.TensorProto):      # stored as is (bfloat16, float8)
                        t = onnx.TensorProto()
                        t.CopyFrom(x)
                        t.name = decl[j].name
                    else:
                        try:
                            t = numpy_helper.from_array(x, decl[j].name)
                        except Exception:
                            # maps have no tensor form: such a case keeps
                            # fewer files and the runner refuses it
                            continue
                    with open(os.path.join(ds, "%s_%d.pb" % (kind, j)), "wb") as f:
                        f.write(t.SerializeToString())
        n += 1
    print("onnx %s, opset %d: %d cases" % (onnx.__version__, onnx.defs.onnx_opset_version(), n))


if __name__ == "__main__":
    main(sys.argv[1])
