#!/usr/bin/python3
"""gen.py DIR -- write NumPy test cases for fuselab's eager ops into DIR.

For every op in graph/ops.def this writes random inputs and NumPy's
expected output as .npy files, several shapes per op (size-1 dims, odd
sizes such as 7 and 33, broadcasting, 0-dim, 0-size, strided views), and a
manifest DIR/cases.lua that check.lua runs.  Expected values are computed
in float64 from the very inputs written (after their rounding to float32
or float16), then cast to the result dtype.  The random stream has a fixed
seed, so every run writes the same files.

gen.py verify DIR N -- the other direction: check the .npy files that
check.lua saved with fl.save (DIR/saved/*.npy) load in NumPy with the
values recorded beside them; prints TAP lines numbered from N+1 and the
plan.

Run with Debian's /usr/bin/python3 (python3-numpy).

Tolerances (a value passes when |got - want| <= atol + rtol * |want|, NaN
matching NaN, infinities equal):
  EXACT  atol 0     rtol 0     int64/bool results, views, data movement
  EW     atol 1e-6  rtol 1e-5  float32 elementwise (libm float vs double)
  RED    atol 1e-4  rtol 1e-4  float32 reductions (float32 accumulation)
  MM     atol 1e-5  rtol 1e-4  matmul, linear, conv2d, norms, softmax
  F16    atol 1e-3  rtol 2e-3  float16 results (one float16 ulp is 2^-10)
  F64    atol 1e-12 rtol 1e-10 the float64 replay (below), every op

The float64 replay: every case whose result is float32 and whose float
inputs are float32 runs again with those inputs widened to float64 (exact)
against NumPy's float64 result itself, before any rounding to float32, so
float64 is checked op by op to double precision.  Cases whose expression
names a dtype, or whose reference is not plain float64 arithmetic (random
draws, float32 emulation), are left out of the replay.
"""

import math
import os
import re
import sys

import numpy as np

EXACT = (0.0, 0.0)
EW = (1e-6, 1e-5)
RED = (1e-4, 1e-4)
MM = (1e-5, 1e-4)
F16 = (1e-3, 2e-3)
F64 = (1e-12, 1e-10)

SEED = 20240607
rng = np.random.default_rng(SEED)
HERE = os.path.dirname(os.path.abspath(__file__))

cases = []
outdir = None
replay = []          # (op, expr, inputs, want in float64) for the float64 pass


# ---- inputs ---------------------------------------------------------------

def randn(*shape, dtype=np.float32, scale=1.0):
    return np.asarray(rng.standard_normal(shape) * scale).astype(dtype)


def positive(*shape, dtype=np.float32):
    """Inputs for log, sqrt, rsqrt, pow bases: in [0.1, 4)."""
    return np.asarray(rng.uniform(0.1, 4.0, shape)).astype(dtype)


def away_from_zero(*shape, dtype=np.float32):
    """Divisors: |x| in [0.5, 3), random sign."""
    mag = rng.uniform(0.5, 3.0, shape)
    return np.asarray(mag * rng.choice([-1.0, 1.0], shape)).astype(dtype)


def inside_unit(*shape, dtype=np.float32):
    """Inside (-1, 1): asin's and acos's domain."""
    return np.asarray(rng.uniform(-0.99, 0.99, shape)).astype(dtype)


def small_ints(*shape, lo=-2, hi=3, dtype=np.float32):
    """Integer-valued, so comparisons and argmax see ties."""
    return np.asarray(rng.integers(lo, hi, shape)).astype(dtype)


def ints(*shape, lo=-50, hi=50):
    return np.asarray(rng.integers(lo, hi, shape)).astype(np.int64)


def bools(*shape):
    return np.asarray(rng.integers(0, 2, shape)).astype(np.bool_)


def f64(x):
    return np.asarray(x).astype(np.float64) if np.asarray(x).dtype.kind == 'f' else np.asarray(x)


# ---- the case writer --------------------------------------------------------

def shape_str(a):
    return "[" + ",".join(str(d) for d in np.shape(a)) + "]"


def case(op, expr, inputs, want, tol, dtype=None, note=""):
    """One case: expr is Lua over the inputs named a, b, c... in order.

    want is NumPy's result (float64 or int/bool); it is cast to dtype (by
    default: float16 when an input is float16, else float32 for floating
    results; int/bool results unchanged).  Float16 results get the F16
    tolerance."""
    idx = len(cases) + 1
    names = []
    for k, x in enumerate(inputs):
        fn = "c%03d_%s.npy" % (idx, "abcdef"[k])
        np.save(os.path.join(outdir, fn), np.asarray(x))
        names.append(fn)
    want = np.asarray(want)
    if dtype is None:
        if want.dtype.kind == 'f':
            halfs = [x for x in inputs if np.asarray(x).dtype == np.float16]
            dtype = np.float16 if halfs else np.float32
        else:
            dtype = want.dtype
    if dtype == np.float16 and tol in (EW, MM, RED):
        tol = F16
    if (dtype == np.float32 and want.dtype == np.float64 and tol != EXACT and
            not re.search(r"float|int64|bool|rand|dropout", expr) and
            any(np.asarray(x).dtype == np.float32 for x in inputs) and
            all(np.asarray(x).dtype in (np.float32, np.int64, np.bool_) for x in inputs)):
        replay.append((op, expr, list(inputs), want.copy(), note))
    with np.errstate(all='ignore'):
        want = want.astype(dtype)
    wfn = "c%03d_want.npy" % idx
    np.save(os.path.join(outdir, wfn), want)
    short = {"float32": "f32", "float16": "f16", "int64": "i64", "bool": "bool", "float64": "f64"}
    desc = "%s with %s" % (expr, ", ".join(shape_str(x) + short[str(np.asarray(x).dtype)]
                                           for x in inputs))
    if note:
        desc += " (" + note + ")"
    cases.append(dict(op=op, expr=expr, inputs=names, want=wfn, atol=tol[0], rtol=tol[1],
                      name=desc))


def lua_str(s):
    return '"' + s.replace('\\', '\\\\').replace('"', '\\"') + '"'


def write_manifest():
    with open(os.path.join(outdir, "cases.lua"), "w") as f:
        f.write("-- generated by tests/numpy/gen.py (seed %d); one row per case\n" % SEED)
        f.write("return {\n")
        for c in cases:
            f.write("  { op = %s, name = %s, expr = %s, inputs = { %s }, want = %s, "
                    "atol = %r, rtol = %r },\n" % (
                        lua_str(c["op"]), lua_str(c["name"]), lua_str(c["expr"]),
                        ", ".join(lua_str(n) for n in c["inputs"]), lua_str(c["want"]),
                        c["atol"], c["rtol"]))
        f.write("}\n")


# ---- NumPy references (float64) ---------------------------------------------

erf = np.vectorize(math.erf, otypes=[np.float64])


def sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def gelu(x):
    return 0.5 * x * (1.0 + erf(x / math.sqrt(2.0)))


def gelu_tanh(x):
    return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3)))


def relu(x):
    return np.where(x < 0, np.zeros_like(x), x)   # keeps NaN, as PyTorch


def softmax(x, d):
    m = np.max(x, axis=d, keepdims=True)
    e = np.exp(x - m)
    return e / np.sum(e, axis=d, keepdims=True)


def log_softmax(x, d):
    m = np.max(x, axis=d, keepdims=True)
    return x - m - np.log(np.sum(np.exp(x - m), axis=d, keepdims=True))


def layer_norm(x, k, w=None, b=None, eps=1e-5):
    axes = tuple(range(x.ndim - k, x.ndim))
    mu = np.mean(x, axis=axes, keepdims=True)
    var = np.mean((x - mu) ** 2, axis=axes, keepdims=True)
    y = (x - mu) / np.sqrt(var + eps)
    if w is not None:
        y = y * w
    if b is not None:
        y = y + b
    return y


FLT_EPSILON = float(np.finfo(np.float32).eps)


def rms_norm(x, k, w=None, eps=FLT_EPSILON):
    axes = tuple(range(x.ndim - k, x.ndim))
    y = x / np.sqrt(np.mean(x * x, axis=axes, keepdims=True) + eps)
    return y * w if w is not None else y


def conv2d(x, w, b=None, stride=(1, 1), padding=(0, 0)):
    """Direct convolution (cross-correlation, as PyTorch): one strided
    slice of the zero-padded input per kernel tap."""
    n, c, h, wd = x.shape
    co, ci, kh, kw = w.shape
    sh, sw = stride
    ph, pw = padding
    xp = np.zeros((n, c, h + 2 * ph, wd + 2 * pw))
    xp[:, :, ph:ph + h, pw:pw + wd] = x
    oh = (h + 2 * ph - kh) // sh + 1
    ow = (wd + 2 * pw - kw) // sw + 1
    out = np.zeros((n, co, oh, ow))
    for i in range(kh):
        for j in range(kw):
            win = xp[:, :, i:i + sh * (oh - 1) + 1:sh, j:j + sw * (ow - 1) + 1:sw]
            out += np.einsum('nchw,oc->nohw', win, w[:, :, i, j])
    if b is not None:
        out += b.reshape(1, co, 1, 1)
    return out


def pool2d(x, k, stride=None, padding=0, kind="max"):
    """PyTorch max_pool2d / avg_pool2d (count_include_pad=True, floor)."""
    kh = kw = k
    sh = sw = stride or k
    ph = pw = padding
    n, c, h, w = x.shape
    fill = -np.inf if kind == "max" else 0.0
    xp = np.full((n, c, h + 2 * ph, w + 2 * pw), fill)
    xp[:, :, ph:ph + h, pw:pw + w] = x
    oh = (h + 2 * ph - kh) // sh + 1
    ow = (w + 2 * pw - kw) // sw + 1
    acc = np.full((n, c, oh, ow), fill)
    for i in range(kh):
        for j in range(kw):
            win = xp[:, :, i:i + sh * (oh - 1) + 1:sh, j:j + sw * (ow - 1) + 1:sw]
            acc = np.maximum(acc, win) if kind == "max" else acc + win
    return acc if kind == "max" else acc / (kh * kw)


def pads4(p):
    """n, (h, w) or (top, left, bottom, right) -> (top, left, bottom, right)."""
    if isinstance(p, int):
        return (p, p, p, p)
    if len(p) == 2:
        return (p[0], p[1], p[0], p[1])
    return tuple(p)


def conv2d_ext(x, w, b=None, stride=(1, 1), pads=0, dilation=(1, 1), groups=1):
    """conv2d with groups, dilation and pads (top, left, bottom, right): per
    group, one strided slice of the zero-padded input per (dilated) tap."""
    n, c, h, wd = x.shape
    co, cg, kh, kw = w.shape
    sh, sw = stride
    pt, pl, pb, pr = pads4(pads)
    dh, dw = dilation
    xp = np.zeros((n, c, h + pt + pb, wd + pl + pr))
    xp[:, :, pt:pt + h, pl:pl + wd] = x
    oh = (h + pt + pb - dh * (kh - 1) - 1) // sh + 1
    ow = (wd + pl + pr - dw * (kw - 1) - 1) // sw + 1
    og = co // groups
    out = np.zeros((n, co, oh, ow))
    for g in range(groups):
        xs = xp[:, g * cg:(g + 1) * cg]
        for i in range(kh):
            for j in range(kw):
                win = xs[:, :, i * dh:i * dh + sh * (oh - 1) + 1:sh, j * dw:j * dw + sw * (ow - 1) + 1:sw]
                out[:, g * og:(g + 1) * og] += np.einsum('nchw,oc->nohw', win, w[g * og:(g + 1) * og, :, i, j])
    if b is not None:
        out += b.reshape(1, co, 1, 1)
    return out


def win_out(n, k, s, pb, pe, d, ceil_mode):
    """PyTorch's pooling_output_shape with pads pb (begin) and pe (end)."""
    span = n + pb + pe - d * (k - 1) - 1
    o = (-(-span // s) if ceil_mode else span // s) + 1
    if ceil_mode and (o - 1) * s >= n + pb:
        o -= 1
    return o


def pool2d_ext(x, k, stride=None, pads=0, dilation=(1, 1), ceil_mode=False,
               count_include_pad=True, kind="max"):
    """PyTorch/ONNX max_pool2d and avg_pool2d with pads (top, left, bottom,
    right), dilation (max), ceil_mode and count_include_pad (avg): taps
    outside the input are -inf (max) or 0 (avg); the avg divisor counts the
    taps inside the padded input, or inside the input only."""
    kh, kw = (k, k) if isinstance(k, int) else k
    sh, sw = stride or (kh, kw)
    pt, pl, pb, pr = pads4(pads)
    dh, dw = dilation
    n, c, h, w = x.shape
    oh = win_out(h, kh, sh, pt, pb, dh, ceil_mode)
    ow = win_out(w, kw, sw, pl, pr, dw, ceil_mode)
    # room for ceil-mode windows that run past the end padding
    H = pt + max(h + pb, (oh - 1) * sh + (kh - 1) * dh + 1 - pt)
    W = pl + max(w + pr, (ow - 1) * sw + (kw - 1) * dw + 1 - pl)
    fill = -np.inf if kind == "max" else 0.0
    xp = np.full((n, c, H, W), fill)
    xp[:, :, pt:pt + h, pl:pl + w] = x
    inside = np.zeros((H, W))
    inside[pt:pt + h, pl:pl + w] = 1
    padded = np.zeros((H, W))
    padded[:pt + h + pb, :pl + w + pr] = 1
    acc = np.full((n, c, oh, ow), fill)
    cnt_in = np.zeros((oh, ow))
    cnt_pad = np.zeros((oh, ow))
    for i in range(kh):
        for j in range(kw):
            sl = (slice(i * dh, i * dh + sh * (oh - 1) + 1, sh), slice(j * dw, j * dw + sw * (ow - 1) + 1, sw))
            win = xp[(slice(None), slice(None)) + sl]
            acc = np.maximum(acc, win) if kind == "max" else acc + win
            cnt_in += inside[sl]
            cnt_pad += padded[sl]
    if kind == "max":
        return acc
    return acc / (cnt_pad if count_include_pad else cnt_in)


torch_checked = 0


def torch_agrees(what, want, fn):
    """Where the Python running gen.py has PyTorch (NUMPY_PYTHON=a venv's),
    NumPy's result must equal PyTorch's: gen.py stops otherwise."""
    try:
        import torch
    except ImportError:
        return
    global torch_checked
    torch_checked += 1
    got = fn(torch).double().numpy()
    if got.shape != want.shape or not np.allclose(got, want, rtol=1e-5, atol=1e-6):
        raise SystemExit("gen.py: NumPy and PyTorch differ on %s (max err %s)" %
                         (what, np.max(np.abs(got - want)) if got.shape == want.shape else got.shape))


def batch_norm(x, mean, var, w=None, b=None, eps=1e-5):
    shp = (1, -1) + (1,) * (x.ndim - 2)
    y = (x - mean.reshape(shp)) / np.sqrt(var.reshape(shp) + eps)
    if w is not None:
        y = y * w.reshape(shp)
    if b is not None:
        y = y + b.reshape(shp)
    return y


# ---- the cases ---------------------------------------------------------------

UNARY = [
    # (op in ops.def, Lua method call, reference, input maker)
    ("abs", "a:abs()", np.abs, randn),
    ("neg", "a:neg()", np.negative, randn),
    ("exp", "a:exp()", np.exp, lambda *s, **k: randn(*s, scale=2.0, **k)),
    ("log", "a:log()", np.log, positive),
    ("sqrt", "a:sqrt()", np.sqrt, positive),
    ("rsqrt", "a:rsqrt()", lambda x: 1.0 / np.sqrt(x), positive),
    ("sin", "a:sin()", np.sin, lambda *s, **k: randn(*s, scale=3.0, **k)),
    ("cos", "a:cos()", np.cos, lambda *s, **k: randn(*s, scale=3.0, **k)),
    ("asin", "a:asin()", np.arcsin, inside_unit),
    ("acos", "a:acos()", np.arccos, inside_unit),
    ("atan", "a:atan()", np.arctan, lambda *s, **k: randn(*s, scale=3.0, **k)),
    ("tanh", "a:tanh()", np.tanh, lambda *s, **k: randn(*s, scale=2.0, **k)),
    ("sigmoid", "a:sigmoid()", sigmoid, lambda *s, **k: randn(*s, scale=4.0, **k)),
    ("relu", "a:relu()", relu, randn),
    ("gelu", "a:gelu()", gelu, lambda *s, **k: randn(*s, scale=2.0, **k)),
    ("gelu_tanh", 'a:gelu{approximate="tanh"}', gelu_tanh, lambda *s, **k: randn(*s, scale=2.0, **k)),
    ("silu", "a:silu()", lambda x: x * sigmoid(x), lambda *s, **k: randn(*s, scale=3.0, **k)),
    ("erf", "a:erf()", erf, lambda *s, **k: randn(*s, scale=1.5, **k)),
    ("clamp", "a:clamp(-0.5, 0.75)", lambda x: np.clip(x, -0.5, 0.75), randn),
]

UNARY_SHAPES = [(7,), (1,), (33, 17), (2, 1, 3, 1), (), (0, 3), (4099,)]


def gen_unary():
    for op, expr, ref, make in UNARY:
        for shp in UNARY_SHAPES:
            a = make(*shp)
            case(op, expr, [a], ref(f64(a)), EW)
        # a strided (transposed) input and float16
        a = make(5, 7)
        case(op, expr.replace("a:", "a:transpose(1, 2):", 1), [a], ref(f64(a).T), EW,
             note="strided input")
        a = make(33, dtype=np.float16)
        case(op, expr, [a], ref(f64(a)), F16)
    # clamp with one bound only, and an int64 input
    a = randn(33)
    case("clamp", "a:clamp(nil, 0.25)", [a], np.minimum(f64(a), 0.25), EW)
    case("clamp", "a:clamp(-0.25)", [a], np.maximum(f64(a), -0.25), EW)
    a = ints(17)
    case("clamp", "a:clamp(-10, 10)", [a], np.clip(a, -10, 10), EXACT)
    case("abs", "a:abs()", [a], np.abs(a), EXACT)
    case("neg", "a:neg()", [a], -a, EXACT)
    case("relu", "a:relu()", [a], np.maximum(a, 0), EXACT)
    # integer fmod truncates (C), remainder floors (Python): every sign pair
    b = np.where(ints(17, lo=-9, hi=9) >= 0, ints(17, lo=1, hi=9), ints(17, lo=-9, hi=-1))
    case("fmod", "a:fmod(b)", [a, b], np.fmod(a, b), EXACT)
    case("remainder", "a:remainder(b)", [a, b], np.remainder(a, b), EXACT)
    # NaN and infinities go through as PyTorch lets them
    a = np.array([np.nan, -np.inf, np.inf, -1.0, 0.0, 2.0, np.nan], np.float32)
    case("relu", "a:relu()", [a], relu(f64(a)), EW, note="nan, inf")
    case("exp", "a:exp()", [a], np.exp(f64(a)), EW, note="nan, inf")
    case("tanh", "a:tanh()", [a], np.tanh(f64(a)), EW, note="nan, inf")
    case("sigmoid", "a:sigmoid()", [a], sigmoid(f64(a)), EW, note="nan, inf")
    # "to": casts (float -> int64 truncates toward zero, as PyTorch)
    a = randn(3, 11, scale=4.0)
    case("to", 'a:to("float16")', [a], f64(a), F16, dtype=np.float16)
    case("to", 'a:to("int64")', [a], np.trunc(f64(a)).astype(np.int64), EXACT)
    b = small_ints(9)
    case("to", 'a:to("bool")', [b], b != 0, EXACT)
    i = ints(6)
    case("to", 'a:to("float32")', [i], i.astype(np.float64), EXACT)
    h = randn(8, dtype=np.float16)
    case("to", 'a:to("float32")', [h], f64(h), EXACT, dtype=np.float32)
    # bfloat16 has no .npy type: round trip through it (8 significant bits)
    a = randn(19)
    bf = (a.view(np.uint32) + 0x7FFF + ((a.view(np.uint32) >> 16) & 1)) & 0xFFFF0000
    case("to", 'a:to("bfloat16"):to("float32")', [a], bf.view(np.float32).astype(np.float64),
         EXACT, note="round to nearest even")


BINARY = [
    ("add", "a:add(b)", np.add, randn, randn),
    ("sub", "a:sub(b)", np.subtract, randn, randn),
    ("mul", "a:mul(b)", np.multiply, randn, randn),
    ("div", "a:div(b)", np.divide, randn, away_from_zero),
    ("pow", "a:pow(b)", np.power, positive, lambda *s, **k: randn(*s, scale=0.8, **k)),
    ("maximum", "a:maximum(b)", np.maximum, randn, randn),
    ("minimum", "a:minimum(b)", np.minimum, randn, randn),
    ("fmod", "a:fmod(b)", np.fmod, lambda *s, **k: randn(*s, scale=4, **k), away_from_zero),
    ("remainder", "a:remainder(b)", np.remainder, lambda *s, **k: randn(*s, scale=4, **k), away_from_zero),
]

# (shape a, shape b): equal, trailing broadcast, both sides broadcast,
# size-1 against larger, a 0-dim tensor, odd sizes.
BINARY_SHAPES = [((7,), (7,)), ((33, 17), (17,)), ((4, 1, 5), (3, 1)), ((1,), (2, 3)),
                 ((), (3, 4)), ((2, 3, 1), (1, 1, 7)), ((1025,), (1025,))]

COMPARE = [("eq", np.equal), ("ne", np.not_equal), ("lt", np.less), ("le", np.less_equal),
           ("gt", np.greater), ("ge", np.greater_equal)]


def gen_binary():
    for op, expr, ref, ma, mb in BINARY:
        for sa, sb in BINARY_SHAPES:
            a, b = ma(*sa), mb(*sb)
            case(op, expr, [a, b], ref(f64(a), f64(b)), EW)
        a, b = ma(6, 5), mb(5, 6)
        case(op, expr.replace("b)", "b:transpose(1, 2))"), [a, b], ref(f64(a), f64(b).T), EW,
             note="strided operand")
        a, b = ma(33, dtype=np.float16), mb(33, dtype=np.float16)
        case(op, expr, [a, b], ref(f64(a), f64(b)), F16)
    # Lua operators, numbers as weak scalars
    a, b = randn(3, 5), away_from_zero(5)
    case("add", "a + b", [a, b], f64(a) + f64(b), EW)
    case("sub", "a - b", [a, b], f64(a) - f64(b), EW)
    case("mul", "a * b", [a, b], f64(a) * f64(b), EW)
    case("div", "a / b", [a, b], f64(a) / f64(b), EW)
    case("neg", "-a", [a], -f64(a), EW)
    case("add", "a + 2.5", [a], f64(a) + 2.5, EW)
    case("mul", "3 * a", [a], 3 * f64(a), EW)
    case("sub", "2 - a", [a], 2 - f64(a), EW)
    case("div", "a / 4", [a], f64(a) / 4, EW)
    p = positive(4, 3)
    case("pow", "a ^ 2", [p], f64(p) ** 2, EW)
    case("pow", "a ^ 0.5", [p], f64(p) ** 0.5, EW)
    e = randn(3, scale=0.8)
    case("pow", "a ^ b", [p, e], f64(p) ** f64(e), EW)
    # int64: exact arithmetic; true division and float operands promote
    i, j = ints(4, 6), ints(6, lo=1, hi=9)
    case("add", "a + b", [i, j], i + j, EXACT)
    case("sub", "a:sub(b)", [i, j], i - j, EXACT)
    case("mul", "a * b", [i, j], i * j, EXACT)
    case("div", "a / b", [i, j], i / j, EW, dtype=np.float32, note="int64 true division")
    case("pow", "a ^ 2", [i], i ** 2, EXACT)
    case("maximum", "a:maximum(b)", [i, j], np.maximum(i, j), EXACT)
    case("add", "a + 2.5", [i], i + 2.5, EW, dtype=np.float32, note="int64 + float number")
    x = randn(6)
    case("add", "a + b", [i, x], i + f64(x), EW, dtype=np.float32, note="int64 + float32")
    # NaN propagation of maximum/minimum
    a = np.array([np.nan, 1.0, -2.0, np.nan], np.float32)
    b = np.array([0.0, np.nan, 3.0, np.nan], np.float32)
    case("maximum", "a:maximum(b)", [a, b], np.maximum(f64(a), f64(b)), EW, note="nan")
    case("minimum", "a:minimum(b)", [a, b], np.minimum(f64(a), f64(b)), EW, note="nan")

    for op, ref in COMPARE:
        for sa, sb in BINARY_SHAPES[:6]:
            a, b = small_ints(*sa), small_ints(*sb)
            case(op, "a:%s(b)" % op, [a, b], ref(a, b), EXACT)
        i, x = ints(5, lo=-2, hi=3), small_ints(3, 1)
        case(op, "a:%s(b)" % op, [i, x], ref(i, x), EXACT, note="int64 vs float32")
        a = small_ints(2, 7)
        case(op, "a:%s(0)" % op, [a], ref(a, 0), EXACT, note="number")
    a = np.array([np.nan, 1.0, np.nan], np.float32)
    b = np.array([np.nan, np.nan, 1.0], np.float32)
    case("eq", "a:eq(b)", [a, b], a == b, EXACT, note="nan")
    case("ne", "a:ne(b)", [a, b], a != b, EXACT, note="nan")

    # where: condition, then and else broadcast together
    c, a, b = bools(3, 1), randn(1, 4), randn(3, 4)
    case("where", "fl.where(a, b, c)", [c, a, b], np.where(c, f64(a), f64(b)), EXACT)
    c, a, b = bools(2, 3, 5), randn(5), randn(2, 1, 5)
    case("where", "fl.where(a, b, c)", [c, a, b], np.where(c, f64(a), f64(b)), EXACT)
    c, a, b = bools(), randn(7), randn(7)
    case("where", "fl.where(a, b, c)", [c, a, b], np.where(c, f64(a), f64(b)), EXACT)
    a, b = randn(33, 17), randn(33, 17)
    case("where", "fl.where(a:gt(0), a, b)", [a, b], np.where(a > 0, f64(a), f64(b)), EXACT)
    case("where", "fl.where(a:gt(0), a, 0)", [a], np.where(a > 0, f64(a), 0.0), EXACT)
    i, j = ints(4), ints(4)
    case("where", "fl.where(a:lt(b), a, b)", [i, j], np.where(i < j, i, j), EXACT)


def gen_reductions():
    # (Lua call, numpy axis, keepdims); dims in Lua are 1-based
    for shp in [(7,), (33, 17), (2, 3, 5), (1, 1), (4, 1, 6)]:
        a = randn(*shp)
        nd = len(shp)
        calls = [("()", None, False), ("(1)", 0, False), ("(-1, true)", nd - 1, True)]
        if nd >= 2:
            calls.append(("(2)", 1, False))
        if nd == 3:
            calls.append(("({1, 3})", (0, 2), False))
            calls.append(("({-1, 2}, true)", (2, 1), True))
        for args, ax, kd in calls:
            x = f64(a)
            case("sum", "a:sum%s" % args, [a], np.sum(x, axis=ax, keepdims=kd), RED)
            case("mean", "a:mean%s" % args, [a], np.mean(x, axis=ax, keepdims=kd), RED)
            case("amax", "a:amax%s" % args, [a], np.amax(x, axis=ax, keepdims=kd), EXACT)
            case("amin", "a:amin%s" % args, [a], np.amin(x, axis=ax, keepdims=kd), EXACT)
        # var: unbiased by default; correction=0 is the population variance
        with np.errstate(all='ignore'):
            for args, ax, kd in calls:
                n = a.size if ax is None else np.prod([shp[k] for k in np.atleast_1d(ax)])
                if n < 2:
                    continue   # n - 1 = 0: PyTorch gives nan/inf, not worth pinning
                sep = ", " if args != "()" else ""
                case("var", "a:var%s" % args, [a], np.var(f64(a), axis=ax, keepdims=kd, ddof=1), RED)
                corr = args[:-1] + sep + "{correction=0})"
                case("var", "a:var%s" % corr, [a], np.var(f64(a), axis=ax, keepdims=kd), RED)
        # argmax: 0-based indices (NumPy's); no dim = over the flattened tensor
        case("argmax", "a:argmax()", [a], np.argmax(a), EXACT)
        case("argmax", "a:argmax(1)", [a], np.argmax(a, axis=0), EXACT)
        case("argmax", "a:argmax(-1, true)", [a], np.expand_dims(np.argmax(a, axis=-1), -1), EXACT)
    # ties: the first maximum wins, as in PyTorch and NumPy
    a = small_ints(6, 9, lo=0, hi=3)
    case("argmax", "a:argmax(2)", [a], np.argmax(a, axis=1), EXACT, note="ties")
    case("argmax", "a:argmax(1)", [a], np.argmax(a, axis=0), EXACT, note="ties")
    # a big row, odd length, for the vectorized paths
    a = randn(3, 4099)
    case("sum", "a:sum(2)", [a], np.sum(f64(a), axis=1), RED)
    case("mean", "a:mean(-1)", [a], np.mean(f64(a), axis=1), RED)
    case("amax", "a:amax(2)", [a], np.amax(a, axis=1), EXACT)
    case("var", "a:var(2)", [a], np.var(f64(a), axis=1, ddof=1), RED)
    case("argmax", "a:argmax(2)", [a], np.argmax(a, axis=1), EXACT)
    # strided input
    a = randn(5, 9)
    case("sum", "a:transpose(1, 2):sum(2)", [a], np.sum(f64(a).T, axis=1), RED, note="strided")
    case("amin", "a:transpose(1, 2):amin(1)", [a], np.amin(a.T, axis=0), EXACT, note="strided")
    # integer and bool inputs
    i = ints(4, 7)
    case("sum", "a:sum(2)", [i], np.sum(i, axis=1), EXACT)
    case("sum", "a:sum()", [i], np.sum(i), EXACT)
    case("amax", "a:amax(1)", [i], np.amax(i, axis=0), EXACT)
    case("amin", "a:amin()", [i], np.amin(i), EXACT)
    case("argmax", "a:argmax(2)", [i], np.argmax(i, axis=1), EXACT)
    c = bools(5, 6)
    case("sum", "a:sum(1)", [c], np.sum(c, axis=0).astype(np.int64), EXACT, note="bool counts")
    # float16: computed in float32, result float16
    h = randn(4, 33, dtype=np.float16)
    case("sum", "a:sum(2)", [h], np.sum(f64(h), axis=1), F16)
    case("mean", "a:mean(2)", [h], np.mean(f64(h), axis=1), F16)
    # sum over an empty dim is 0
    z = randn(0, 3)
    case("sum", "a:sum(1)", [z], np.zeros(3), EXACT, note="empty dim")


def gen_composites():
    for shp, dims in [((7,), [-1]), ((33, 17), [1, -1]), ((2, 3, 5), [2, 3]), ((1, 1), [-1]),
                      ((4, 1, 6), [2])]:
        a = randn(*shp, scale=3.0)
        for d in dims:
            ax = d - 1 if d > 0 else d
            case("softmax", "a:softmax(%d)" % d, [a], softmax(f64(a), ax), MM)
            case("log_softmax", "a:log_softmax(%d)" % d, [a], log_softmax(f64(a), ax), MM)
    a = randn(4, 9, scale=40.0)   # large logits: needs the max subtraction
    case("softmax", "a:softmax(-1)", [a], softmax(f64(a), -1), MM, note="large logits")
    case("log_softmax", "a:log_softmax(-1)", [a], log_softmax(f64(a), -1), MM, note="large logits")
    a = randn(6, 5)
    case("softmax", "a:transpose(1, 2):softmax(-1)", [a], softmax(f64(a).T, -1), MM, note="strided")
    h = randn(3, 33, dtype=np.float16)
    case("softmax", "a:softmax(-1)", [h], softmax(f64(h), -1), F16)

    x, w, b = randn(4, 7, scale=2.0), randn(7), randn(7)
    case("layer_norm", "a:layer_norm({7}, b, c)", [x, w, b], layer_norm(f64(x), 1, f64(w), f64(b)), MM)
    case("layer_norm", "a:layer_norm({7})", [x], layer_norm(f64(x), 1), MM)
    case("layer_norm", "a:layer_norm({7}, b)", [x, w], layer_norm(f64(x), 1, f64(w)), MM)
    case("layer_norm", "a:layer_norm({7}, b, c, 1e-3)", [x, w, b],
         layer_norm(f64(x), 1, f64(w), f64(b), 1e-3), MM)
    x, w, b = randn(2, 3, 33) + 5, randn(3, 33), randn(3, 33)
    case("layer_norm", "a:layer_norm({3, 33}, b, c)", [x, w, b],
         layer_norm(f64(x), 2, f64(w), f64(b)), MM, note="offset mean")
    x = randn(5, 1)
    case("layer_norm", "a:layer_norm({1})", [x], layer_norm(f64(x), 1), MM, note="size-1: zeros")

    x, w = randn(4, 7, scale=2.0), randn(7)
    case("rms_norm", "a:rms_norm({7}, b)", [x, w], rms_norm(f64(x), 1, f64(w)), MM)
    case("rms_norm", "a:rms_norm({7})", [x], rms_norm(f64(x), 1), MM)
    case("rms_norm", "a:rms_norm({7}, nil, 1e-2)", [x], rms_norm(f64(x), 1, eps=1e-2), MM)
    x, w = randn(2, 3, 33), randn(3, 33)
    case("rms_norm", "a:rms_norm({3, 33}, b)", [x, w], rms_norm(f64(x), 2, f64(w)), MM)
    x = randn(1, 1)
    case("rms_norm", "a:rms_norm({1})", [x], rms_norm(f64(x), 1), MM)


def gen_linalg():
    for sa, sb in [((3, 5), (5, 4)), ((7,), (7,)), ((7,), (7, 3)), ((3, 7), (7,)),
                   ((2, 3, 5), (5, 4)), ((2, 1, 3, 5), (4, 5, 6)), ((1, 1), (1, 1)),
                   ((33, 17), (17, 9)), ((5,), (3, 5, 2)), ((3, 1, 4), (1, 4, 2)),
                   ((65, 129), (129, 33))]:
        a, b = randn(*sa), randn(*sb)
        case("matmul", "a:matmul(b)", [a, b], np.matmul(f64(a), f64(b)), MM)
    a, b = randn(5, 3), randn(4, 5)
    case("matmul", "a:transpose(1, 2):matmul(b:transpose(1, 2))", [a, b],
         f64(a).T @ f64(b).T, MM, note="both transposed")
    h, g = randn(8, 16, dtype=np.float16), randn(16, 4, dtype=np.float16)
    case("matmul", "a:matmul(b)", [h, g], f64(h) @ f64(g), F16)

    x, w, b = randn(4, 5), randn(3, 5), randn(3)
    case("linear", "fl.linear(a, b, c)", [x, w, b], f64(x) @ f64(w).T + f64(b), MM)
    case("linear", "fl.linear(a, b)", [x, w], f64(x) @ f64(w).T, MM)
    x, w, b = randn(2, 3, 33), randn(7, 33), randn(7)
    case("linear", "fl.linear(a, b, c)", [x, w, b], f64(x) @ f64(w).T + f64(b), MM)
    x, w, b = randn(1, 1), randn(1, 1), randn(1)
    case("linear", "fl.linear(a, b, c)", [x, w, b], f64(x) @ f64(w).T + f64(b), MM)
    x, w = randn(7, 33), randn(1, 33)
    case("linear", "fl.linear(a, b)", [x, w], f64(x) @ f64(w).T, MM)
    x, w, b = randn(5), randn(1, 5), randn(1)
    case("linear", "fl.linear(a, b, c)", [x, w, b], f64(w) @ f64(x) + f64(b), MM, note="1-D input")


def gen_views():
    a = randn(3, 4)
    case("reshape", "a:reshape(2, 6)", [a], a.reshape(2, 6), EXACT)
    case("reshape", "a:reshape(-1)", [a], a.reshape(-1), EXACT)
    case("reshape", "a:reshape(4, 1, -1)", [a], a.reshape(4, 1, -1), EXACT)
    case("reshape", "a:reshape{2, 2, 3}", [a], a.reshape(2, 2, 3), EXACT)
    case("reshape", "a:transpose(1, 2):reshape(12)", [a], a.T.reshape(12), EXACT, note="copy")
    s = randn()
    case("reshape", "a:reshape(1, 1)", [s], s.reshape(1, 1), EXACT)
    case("view", "a:view(6, 2)", [a], a.reshape(6, 2), EXACT)
    case("view", "a:view(-1, 3)", [a], a.reshape(-1, 3), EXACT)
    b = randn(2, 3, 5)
    case("transpose", "a:transpose(1, 2)", [b], b.transpose(1, 0, 2), EXACT)
    case("transpose", "a:transpose(1, -1)", [b], b.transpose(2, 1, 0), EXACT)
    case("transpose", "a:transpose(2, 2)", [b], b, EXACT)
    case("permute", "a:permute(3, 1, 2)", [b], b.transpose(2, 0, 1), EXACT)
    case("permute", "a:permute{2, 3, 1}", [b], b.transpose(1, 2, 0), EXACT)
    case("permute", "a:permute(3, 1, 2):contiguous()", [b], b.transpose(2, 0, 1), EXACT)
    case("contiguous", "a:transpose(1, 3):contiguous()", [b], b.transpose(2, 1, 0), EXACT)
    case("contiguous", "a:contiguous()", [b], b, EXACT)
    case("unsqueeze", "a:unsqueeze(1)", [b], b[None], EXACT)
    case("unsqueeze", "a:unsqueeze(-1)", [b], b[..., None], EXACT)
    case("unsqueeze", "a:unsqueeze(3)", [b], np.expand_dims(b, 2), EXACT)
    case("unsqueeze", "a:unsqueeze(1)", [s], s[None], EXACT)
    c = randn(1, 3, 1, 4)
    case("squeeze", "a:squeeze()", [c], c.squeeze(), EXACT)
    case("squeeze", "a:squeeze(1)", [c], c.squeeze(0), EXACT)
    case("squeeze", "a:squeeze(-2)", [c], c.squeeze(2), EXACT)
    case("squeeze", "a:squeeze(2)", [c], c, EXACT, note="not size 1: unchanged")
    d = randn(3, 1)
    case("expand", "a:expand(3, 4)", [d], np.broadcast_to(d, (3, 4)), EXACT)
    case("expand", "a:expand(2, -1, 5)", [d], np.broadcast_to(d, (2, 3, 5)), EXACT)
    case("expand", "a:expand(2, 3, 5):contiguous()", [d], np.broadcast_to(d, (2, 3, 5)), EXACT)
    case("expand", "a:expand(4, 7)", [s], np.broadcast_to(s, (4, 7)), EXACT)
    e = randn(4, 9)
    case("narrow", "a:narrow(2, 3, 4)", [e], e[:, 2:6], EXACT)   # start is 1-based
    case("narrow", "a:narrow(1, 1, 1)", [e], e[0:1], EXACT)
    case("narrow", "a:narrow(-1, 9, 1)", [e], e[:, 8:9], EXACT)
    case("narrow", "a:narrow(2, 4, 0)", [e], e[:, 3:3], EXACT, note="empty")
    case("narrow", "a:narrow(2, 2, 5):exp()", [e], np.exp(f64(e[:, 1:6])), EW, note="op on a view")
    # the same views over more shapes: size-1 dims, odd sizes, 4-D
    for shp in [(1, 7), (33, 1, 2), (2, 3, 5, 1), (7,)]:
        x = randn(*shp)
        nd = len(shp)
        case("transpose", "a:transpose(1, -1)", [x], np.swapaxes(x, 0, -1), EXACT)
        perm = list(range(nd))[::-1]
        case("permute", "a:permute(%s)" % ", ".join(str(p + 1) for p in perm), [x],
             x.transpose(perm), EXACT)
        case("reshape", "a:reshape(-1)", [x], x.reshape(-1), EXACT)
        case("reshape", "a:transpose(1, -1):reshape(-1)", [x], np.swapaxes(x, 0, -1).reshape(-1),
             EXACT, note="copy")
        case("view", "a:view(%d, -1)" % shp[0], [x], x.reshape(shp[0], -1), EXACT)
        case("unsqueeze", "a:unsqueeze(2)", [x], np.expand_dims(x, 1), EXACT)
        case("squeeze", "a:squeeze()", [x], x.squeeze(), EXACT)
        big = tuple(3 if d == 1 else d for d in shp)
        case("expand", "a:expand(%s)" % ", ".join(map(str, big)), [x], np.broadcast_to(x, big), EXACT)
        case("narrow", "a:narrow(1, %d, 1)" % shp[0], [x], x[shp[0] - 1:shp[0]], EXACT)
        case("contiguous", "a:transpose(1, -1):contiguous()", [x], np.swapaxes(x, 0, -1), EXACT)
    i = ints(2, 3)
    case("transpose", "a:transpose(1, 2)", [i], i.T, EXACT)
    case("expand", "a:expand(2, 2, 3)", [i], np.broadcast_to(i, (2, 2, 3)), EXACT)

    x, y, z = randn(2, 3), randn(4, 3), randn(1, 3)
    case("cat", "fl.cat({a, b, c}, 1)", [x, y, z], np.concatenate([x, y, z], 0), EXACT)
    x, y = randn(2, 3, 4), randn(2, 3, 7)
    case("cat", "fl.cat({a, b}, -1)", [x, y], np.concatenate([x, y], -1), EXACT)
    case("cat", "fl.cat({a, b}, 3)", [x, y], np.concatenate([x, y], 2), EXACT)
    x, y = randn(5), randn(33)
    case("cat", "fl.cat({a, b}, 1)", [x, y], np.concatenate([x, y]), EXACT)
    x, y = randn(2, 5), randn(0, 5)
    case("cat", "fl.cat({a, b}, 1)", [x, y], np.concatenate([x, y]), EXACT, note="0-size piece")
    x = randn(3, 2)
    case("cat", "fl.cat({a}, 2)", [x], x, EXACT)
    x, y = randn(3, 2), randn(2, 3)
    case("cat", "fl.cat({a, b:transpose(1, 2)}, 2)", [x, y], np.concatenate([x, y.T], 1), EXACT,
         note="strided piece")
    i, j = ints(2, 2), ints(3, 2)
    case("cat", "fl.cat({a, b}, 1)", [i, j], np.concatenate([i, j]), EXACT)


def gen_vision():
    x, w, b = randn(2, 3, 7, 9), randn(4, 3, 3, 3), randn(4)
    case("conv2d", "fl.conv2d(a, b, c)", [x, w, b], conv2d(f64(x), f64(w), f64(b)), MM)
    case("conv2d", "fl.conv2d(a, b, c, {stride=2, padding=1})", [x, w, b],
         conv2d(f64(x), f64(w), f64(b), (2, 2), (1, 1)), MM)
    case("conv2d", "fl.conv2d(a, b)", [x, w], conv2d(f64(x), f64(w)), MM)
    case("conv2d", "fl.conv2d(a, b, nil, {padding=1})", [x, w],
         conv2d(f64(x), f64(w), None, (1, 1), (1, 1)), MM)
    case("conv2d", "fl.conv2d(a, b, c, {stride={2, 1}, padding={0, 2}})", [x, w, b],
         conv2d(f64(x), f64(w), f64(b), (2, 1), (0, 2)), MM)
    x, w, b = randn(1, 1, 5, 5), randn(1, 1, 5, 5), randn(1)
    case("conv2d", "fl.conv2d(a, b, c)", [x, w, b], conv2d(f64(x), f64(w), f64(b)), MM, note="1x1 out")
    x, w, b = randn(3, 8, 6, 6), randn(5, 8, 1, 1), randn(5)
    case("conv2d", "fl.conv2d(a, b, c)", [x, w, b], conv2d(f64(x), f64(w), f64(b)), MM, note="1x1 kernel")
    x, w = randn(1, 2, 33, 17), randn(3, 2, 3, 5)
    case("conv2d", "fl.conv2d(a, b, nil, {stride=3, padding=1})", [x, w],
         conv2d(f64(x), f64(w), None, (3, 3), (1, 1)), MM, note="odd sizes")

    for shp in [(2, 3, 8, 9), (1, 2, 7, 7), (1, 1, 1, 1)]:
        x = randn(*shp)
        for k, opts, st, pd in [(1, "", None, 0), (2, "", None, 0), (3, ", {stride=2, padding=1}", 2, 1),
                                (3, ", {stride=1}", 1, 0)]:
            if k > shp[2] + 2 * pd or k > shp[3] + 2 * pd:
                continue
            case("max_pool2d", "a:max_pool2d(%d%s)" % (k, opts), [x],
                 pool2d(f64(x), k, st, pd, "max"), EXACT)
            case("avg_pool2d", "a:avg_pool2d(%d%s)" % (k, opts), [x],
                 pool2d(f64(x), k, st, pd, "avg"), MM)

    x, m, v = randn(2, 3, 5, 4), randn(3), positive(3)
    w, b = randn(3), randn(3)
    case("batch_norm", "fl.batch_norm(a, b, c, d, e)", [x, m, v, w, b],
         batch_norm(f64(x), f64(m), f64(v), f64(w), f64(b)), MM)
    case("batch_norm", "fl.batch_norm(a, b, c)", [x, m, v], batch_norm(f64(x), f64(m), f64(v)), MM)
    case("batch_norm", "fl.batch_norm(a, b, c, d, e, 1e-3)", [x, m, v, w, b],
         batch_norm(f64(x), f64(m), f64(v), f64(w), f64(b), 1e-3), MM)
    x, m, v, w, b = randn(4, 7), randn(7), positive(7), randn(7), randn(7)
    case("batch_norm", "fl.batch_norm(a, b, c, d, e)", [x, m, v, w, b],
         batch_norm(f64(x), f64(m), f64(v), f64(w), f64(b)), MM, note="[N,C]")

    wt = randn(10, 6)
    for idx in [rng.integers(0, 10, (2, 5)), rng.integers(0, 10, (7,)), np.array(9),
                np.array([0, 0, 9, 9, 3])]:
        idx = idx.astype(np.int64)
        case("embedding", "fl.embedding(a, b)", [idx, wt], wt[idx], EXACT)


# ---- every op of the table must have a case ------------------------------------

def ops_in_table():
    path = os.path.join(os.environ.get("FUSELAB_SRC", os.path.join(HERE, "..", "..")),
                        "graph", "ops.def")
    with open(path) as f:
        return re.findall(r'^OP\(\s*\w+\s*,\s*"(\w+)"', f.read(), re.M)


# ---- random ops: their values are fuselab's Philox stream (checked draw for
# draw against eager in tests/lua/random.lua); here what NumPy can say about
# any draw: the range of rand, randn's finite tails, dropout's p = 0 and 1,
# and that every dropout output is 0 or x / (1 - p)

def gen_random():
    n = 4099
    case("rand", "fl.rand(%d):ge(0):to('int64') + fl.rand(%d):lt(1):to('int64')" % (n, n), [],
         np.full(n, 2, dtype=np.int64), EXACT, note="every draw in [0, 1)")
    case("rand", "fl.rand(33, 17, {dtype='float16'}):lt(1)", [], np.ones((33, 17), dtype=bool), EXACT,
         note="float16 draws below 1")
    case("randn", "fl.randn(%d):abs():lt(9)" % n, [], np.ones(n, dtype=bool), EXACT,
         note="no draw beyond 9 sigma")
    x = randn(33, 17)
    x[x == 0] = 1.0
    case("dropout", "fl.dropout(a, 0)", [x], x, EXACT, note="p = 0 keeps x")
    case("dropout", "fl.dropout(a, 1)", [x], np.zeros_like(x), EXACT, note="p = 1 zeroes all")
    case("dropout", "fl.dropout(a, 0.5, false)", [x], x, EXACT, note="not training: x")
    case("dropout", "(function(d) return d:eq(0):to('int64') + d:eq(a * 2):to('int64') end)"
         "(fl.dropout(a, 0.5))", [x], np.ones(x.shape, dtype=np.int64), EXACT,
         note="each element 0 or 2x")


def lua_pads(p):
    return str(p) if isinstance(p, int) else "{" + ", ".join(str(v) for v in p) + "}"


def gen_vision_ext():
    """Grouped, dilated, asymmetrically padded convolutions; pools with
    ceil_mode, count_include_pad, asymmetric pads and dilation."""
    convs = [  # x, w, stride, pads, dilation, groups, bias
        ((2, 4, 9, 8), (6, 2, 3, 3), (1, 1), 1, (1, 1), 2, True),
        ((1, 6, 7, 7), (6, 1, 3, 3), (2, 2), 1, (1, 1), 6, True),
        ((1, 3, 6, 6), (6, 1, 3, 3), (1, 1), 0, (1, 1), 3, False),
        ((1, 3, 11, 10), (4, 3, 3, 3), (1, 1), 2, (2, 2), 1, True),
        ((2, 4, 9, 11), (4, 2, 3, 2), (1, 2), (1, 0, 2, 3), (2, 3), 2, True),
        ((1, 3, 8, 8), (5, 3, 3, 3), (2, 2), (0, 0, 1, 1), (1, 1), 1, True),
        ((1, 24, 5, 5), (24, 8, 1, 1), (1, 1), 0, (1, 1), 3, False),
        ((1, 2, 5, 6), (3, 2, 1, 1), (1, 1), (1, 1, 0, 0), (1, 1), 1, True),
        ((1, 4, 12, 9), (8, 1, 5, 5), (3, 2), (2, 1, 2, 1), (1, 2), 4, True),
    ]
    for xs, ws, st, pd, dl, g, bias in convs:
        x, w, b = randn(*xs), randn(*ws), randn(ws[0])
        want = conv2d_ext(f64(x), f64(w), f64(b) if bias else None, st, pd, dl, g)
        t, l, bo, r = pads4(pd)
        torch_agrees("conv2d %s %s" % (xs, ws), want, lambda torch: torch.nn.functional.conv2d(
            torch.nn.functional.pad(torch.from_numpy(x), (l, r, t, bo)), torch.from_numpy(w),
            torch.from_numpy(b) if bias else None, st, 0, dl, g))
        opts = "{stride={%d, %d}, padding=%s, dilation={%d, %d}, groups=%d}" % (
            st + (lua_pads(pd),) + dl + (g,))
        if bias:
            case("conv2d", "fl.conv2d(a, b, c, %s)" % opts, [x, w, b], want, MM)
        else:
            case("conv2d", "fl.conv2d(a, b, %s)" % opts, [x, w], want, MM)

    pools = [  # kind, x, k, stride, pads, dilation, ceil_mode, count_include_pad
        ("max", (2, 3, 7, 9), 3, (2, 2), 0, (1, 1), True, True),
        ("max", (2, 3, 7, 9), 3, (2, 2), 1, (1, 1), True, True),
        ("max", (1, 2, 7, 7), 2, (2, 2), 0, (1, 1), True, True),
        ("max", (1, 2, 9, 8), 3, (1, 2), 2, (2, 2), False, True),
        ("max", (1, 2, 9, 8), 3, (2, 1), 1, (2, 1), True, True),
        ("max", (1, 2, 6, 6), 3, (2, 2), (0, 0, 1, 1), (1, 1), False, True),
        ("max", (1, 2, 6, 7), 3, (2, 2), (2, 1, 0, 2), (1, 1), True, True),
        ("max", (1, 1, 3, 3), 3, (1, 1), (2, 2, 2, 2), (1, 1), False, True),
        ("avg", (2, 3, 7, 9), 3, (2, 2), 1, (1, 1), False, False),
        ("avg", (2, 3, 7, 9), 3, (2, 2), 1, (1, 1), True, True),
        ("avg", (2, 3, 7, 9), 3, (2, 2), 1, (1, 1), True, False),
        ("avg", (1, 2, 7, 7), 2, (2, 2), 0, (1, 1), True, True),
        ("avg", (1, 2, 8, 8), 3, (3, 3), 1, (1, 1), True, True),
        ("avg", (1, 2, 6, 7), 3, (2, 2), (1, 0, 0, 1), (1, 1), False, True),
        ("avg", (1, 2, 6, 7), 3, (2, 2), (1, 0, 0, 1), (1, 1), True, False),
        ("avg", (1, 2, 5, 5), 3, (1, 1), (2, 2, 2, 2), (1, 1), False, False),
        ("avg", (1, 2, 5, 5), 3, (1, 1), (2, 2, 2, 2), (1, 1), True, True),
    ]
    for kind, xs, k, st, pd, dl, cm, cip in pools:
        x = randn(*xs)
        want = pool2d_ext(f64(x), k, st, pd, dl, cm, cip, kind)
        t, l, bo, r = pads4(pd)
        if t == l == bo == r and 2 * t <= k:   # what PyTorch's own pools accept
            if kind == "max":
                torch_agrees("max_pool2d %s" % (xs,), want, lambda torch: torch.nn.functional.max_pool2d(
                    torch.from_numpy(x), k, st, t, dl, cm))
            else:
                torch_agrees("avg_pool2d %s" % (xs,), want, lambda torch: torch.nn.functional.avg_pool2d(
                    torch.from_numpy(x), k, st, t, cm, cip))
        opts = "stride={%d, %d}, padding=%s, ceil_mode=%s" % (st + (lua_pads(pd), "true" if cm else "false"))
        if kind == "max":
            opts += ", dilation={%d, %d}" % dl
        else:
            opts += ", count_include_pad=%s" % ("true" if cip else "false")
        case(kind + "_pool2d", "a:%s_pool2d(%d, {%s})" % (kind, k, opts), [x], want,
             EXACT if kind == "max" else MM)


def np_pad(x, pads, mode="constant", value=0.0):
    """ONNX-order pads (befores, then afters): negative ones crop first."""
    n = x.ndim
    sl = tuple(slice(max(0, -pads[d]), x.shape[d] - max(0, -pads[n + d])) for d in range(n))
    y = x[sl]
    width = [(max(0, pads[d]), max(0, pads[n + d])) for d in range(n)]
    if mode == "constant":
        return np.pad(y, width, mode="constant", constant_values=value)
    return np.pad(y, width, mode=mode)


def gen_movement():
    """slice (both signs of step), pad (three modes, crops), flip, gather."""
    x = randn(4, 5, 6)
    for expr, want in [("a:slice(2, 1, -1, 2)", x[:, 0::2]), ("a:slice(3, 2, 5)", x[:, :, 1:5]),
                       ("a:slice(3, -1, 1, -2)", x[:, :, ::-2]), ("a:slice(1, 3, 2, -1)", x[2:0:-1]),
                       ("a:slice(2, 4, 2)", x[:, 3:2]), ("a:slice(1, -100, 100, 3)", x[::3]),
                       ("a:slice(2, 5, -9, -3)", x[:, 4::-3])]:
        case("slice", expr, [x], want, EXACT)
    i = ints(3, 7)
    case("slice", "a:slice(2, 2, 7, 2)", [i], i[:, 1:7:2], EXACT)
    case("slice", "a:slice(2, 6, 1, -1)", [i], i[:, 5::-1], EXACT, note="reversed")
    for pads, mode, value in [((1, 0, 2, 0, 2, 1), "constant", 0.0), ((0, -1, 1, 1, 0, -2), "constant", -2.5),
                              ((2, 1, 3, 1, 3, 2), "reflect", 0.0), ((-1, 2, 0, 2, 0, 4), "edge", 0.0),
                              ((0, 0, -2, 0, -1, 3), "reflect", 0.0)]:
        opts = "{mode=%r}" % mode if mode != "constant" else "{value=%r}" % value
        expr = "fl.pad(a, {%s}, %s)" % (", ".join(str(p) for p in pads), opts.replace("'", '"'))
        case("pad", expr, [x], np_pad(f64(x), pads, mode, value), EXACT)
    case("pad", "fl.pad(a, {1, -2, 0, 3}, {value=7})", [i], np_pad(i, (1, -2, 0, 3), "constant", 7), EXACT)
    case("pad", "fl.pad(a, {2, 1, 2, 2}, {mode=\"reflect\"})", [i], np_pad(i, (2, 1, 2, 2), "reflect"), EXACT)
    case("flip", "a:flip(1)", [x], np.flip(x, 0), EXACT)
    case("flip", "a:flip{-1, 2}", [x], np.flip(x, (2, 1)), EXACT)
    case("flip", "fl.flip(a, {1, 2})", [i], np.flip(i, (0, 1)), EXACT)
    case("cumsum", "a:cumsum(2)", [x], np.cumsum(f64(x), 1), MM)
    case("cumsum", "fl.cumsum(a, 3, {exclusive=true})", [x], np.cumsum(f64(x), 2) - f64(x), MM)
    case("cumsum", "fl.cumsum(a, 1, {reverse=true})", [x], np.flip(np.cumsum(np.flip(f64(x), 0), 0), 0), MM)
    case("cumsum", "a:cumsum(2)", [i], np.cumsum(i, 1), EXACT)
    idx = rng.integers(-5, 5, (2, 3)).astype(np.int64)
    case("gather", "fl.gather(a, 2, b)", [x, idx], np.take(x, idx, axis=1), EXACT)
    idx = rng.integers(-4, 4, (5,)).astype(np.int64)
    case("gather", "fl.gather(a, 1, b)", [x, idx], np.take(x, idx, axis=0), EXACT)
    case("gather", "fl.gather(a, -1, b)", [i, np.array(-2, dtype=np.int64)], np.take(i, -2, axis=1), EXACT,
         note="a 0-d index")


def np_max_pool_backward(x, g, k, s, p):
    """PyTorch's max_pool2d gradient: each window's onto the element its
    kernel picks scanning row by row (`v > max or isnan(v)` from the
    window's first element: the first largest, the last NaN)."""
    out = np.zeros(x.shape, np.float64)
    N, C, H, W = x.shape
    for n in range(N):
        for c in range(C):
            for oh in range(g.shape[2]):
                for ow in range(g.shape[3]):
                    pick, mx = None, None
                    for kh in range(k):
                        for kw in range(k):
                            ih, iw = oh * s - p + kh, ow * s - p + kw
                            if 0 <= ih < H and 0 <= iw < W:
                                v = x[n, c, ih, iw]
                                if pick is None or v > mx or np.isnan(v):
                                    pick, mx = (ih, iw), v
                    out[n, c, pick[0], pick[1]] += g[n, c, oh, ow]
    return out


def gen_recurrent():
    """rnn (fl.rnn): ONNX's LSTM and GRU cells over [T, B, I], NumPy's
    float64 from the operator's equations; y, then y_h."""
    sig = lambda v: 1 / (1 + np.exp(-v))

    def run(cell, x, w, r, b, reverse=False):
        T, B, _ = x.shape
        H = r.shape[2]
        x, w, r, b = (v.astype(np.float64) for v in (x, w, r, b))
        h, c = np.zeros((B, H)), np.zeros((B, H))
        ys = [None] * T
        for s in range(T):
            t = T - 1 - s if reverse else s
            gx = x[t] @ w[0].T + b[0, :w.shape[1]]
            gr = h @ r[0].T + b[0, w.shape[1]:]
            if cell == "lstm":
                i, o, f, g = (gx + gr).reshape(B, 4, H).transpose(1, 0, 2)
                c = sig(f) * c + sig(i) * np.tanh(g)
                h = sig(o) * np.tanh(c)
            else:
                z = sig(gx[:, :H] + gr[:, :H])
                rr = sig(gx[:, H:2 * H] + gr[:, H:2 * H])
                cand = np.tanh(gx[:, 2 * H:] + (rr * h) @ r[0, 2 * H:].T + b[0, w.shape[1] + 2 * H:])
                h = (1 - z) * cand + z * h
            ys[t] = h
        return np.stack(ys)[:, None], h[None]

    for cell, G, rev in (("lstm", 4, False), ("gru", 3, True)):
        x, w, r, b = randn(6, 3, 5), randn(1, G * 4, 5, scale=0.5), randn(1, G * 4, 4, scale=0.5), \
            randn(1, 2 * G * 4, scale=0.5)
        y, yh = run(cell, x, w, r, b, rev)
        opts = "{cell = '%s', bias = d%s}" % (cell, ", direction = 'reverse'" if rev else "")
        case("rnn", "(fl.rnn(a, b, c, %s))" % opts, [x, w, r, b], y, MM, note=cell + ": y")
        case("rnn", "select(2, fl.rnn(a, b, c, %s))" % opts, [x, w, r, b], yh, MM, note=cell + ": y_h")


def gen_backward():
    """The ops backward graphs use, reached through backward (they have no
    Lua name): max_pool2d_backward, index_add."""
    x = np.maximum(randn(2, 3, 7, 6), 0)          # relu'd: windows of tied zeros
    x[0, 0, 2, 2] = np.nan
    g = randn(2, 3, 4, 3)
    expr = ("(function() local v = a:detach():requires_grad_();"
            " (v:max_pool2d(3, {stride = 2, padding = 1}) * b):sum():backward();"
            " return v.grad end)()")
    case("max_pool2d_backward", expr, [x, g], np_max_pool_backward(f64(x), f64(g), 3, 2, 1), RED)
    w = randn(6, 4)
    idx = rng.integers(-6, 6, (3, 5)).astype(np.int64)
    up = randn(3, 5, 4)
    want = np.zeros((6, 4))
    np.add.at(want, idx % 6, f64(up))
    expr = ("(function() local v = a:detach():requires_grad_();"
            " (fl.embedding(b % 6, v) * c):sum():backward();"
            " return v.grad end)()")
    case("index_add", expr, [w, idx, up], want, RED, note="repeated ids accumulate")


def gen_int8():
    """matmul_int8 (fl.matmul_int8): NumPy's int64 product of the 8-bit
    values less their zero points, exactly; the extremes whose 16-bit pair
    sums saturate without VNNI, a shared and a batched B."""
    for at, bt in (("uint8", "int8"), ("int8", "uint8"), ("int8", "int8"), ("uint8", "uint8")):
        lo = {"int8": -128, "uint8": 0}
        a = rng.integers(lo[at], lo[at] + 256, (2, 5, 67)).astype(np.int64)
        b = rng.integers(lo[bt], lo[bt] + 256, (67, 9)).astype(np.int64)
        za = rng.integers(lo[at], lo[at] + 256, (5,)).astype(np.int64)
        zb = rng.integers(lo[bt], lo[bt] + 256, ()).astype(np.int64)
        opts = "{a_type = '%s', b_type = '%s'}" % (at, bt)
        case("matmul_int8", "fl.matmul_int8(a, b, %s)" % opts, [a, b], np.matmul(a, b), EXACT, note=at + " x " + bt)
        opts_z = "{a_type = '%s', b_type = '%s', a_zero = c, b_zero = d}" % (at, bt)
        case("matmul_int8", "fl.matmul_int8(a, b, %s)" % opts_z, [a, b, za, zb],
             np.matmul(a - za[:, None], b - zb), EXACT, note=at + " x " + bt + ", zero points")
    a = np.full((3, 64), 255, np.int64)
    b = np.where(np.arange(64 * 4).reshape(64, 4) % 2 == 0, -128, 127).astype(np.int64)
    case("matmul_int8", "fl.matmul_int8(a, b, {a_type = 'uint8'})", [a, b], np.matmul(a, b), EXACT,
         note="extremes")
    a = rng.integers(-128, 128, (3, 4, 20)).astype(np.int64)
    b = rng.integers(-128, 128, (3, 20, 6)).astype(np.int64)
    case("matmul_int8", "fl.matmul_int8(a, b)", [a, b], np.matmul(a, b), EXACT, note="batched B")


def generate(d):
    global outdir
    outdir = d
    os.makedirs(d, exist_ok=True)
    gen_unary()
    gen_binary()
    gen_reductions()
    gen_composites()
    gen_linalg()
    gen_views()
    gen_vision()
    gen_random()
    gen_vision_ext()
    gen_movement()
    gen_backward()
    gen_recurrent()
    gen_int8()
    for op, expr, inputs, want, note in list(replay):
        wide = [np.asarray(x).astype(np.float64) if np.asarray(x).dtype == np.float32 else x
                for x in inputs]
        case(op, expr, wide, want, F64, dtype=np.float64, note="float64" + (", " + note if note else ""))
    write_manifest()
    if torch_checked:
        sys.stderr.write("gen.py: %d conv2d and pool cases equal PyTorch's\n" % torch_checked)
    missing = sorted(set(ops_in_table()) - {c["op"] for c in cases})
    if missing:
        sys.stderr.write("gen.py: no NumPy case for op(s): %s\n" % ", ".join(missing))
        return 1
    return 0


# ---- the other direction: NumPy reads what fuselab saved ------------------------

def verify(d, start):
    """check.lua saved DIR/saved/NAME.npy with fl.save and wrote
    DIR/saved/NAME.txt holding the dtype, shape and values it saved."""
    sd = os.path.join(d, "saved")
    names = sorted(n[:-4] for n in os.listdir(sd) if n.endswith(".npy")) if os.path.isdir(sd) else []
    n = start
    if not names:
        n += 1
        print("not ok %d - NumPy reads fl.save files: none were saved" % n)
    for name in names:
        n += 1
        try:
            arr = np.load(os.path.join(sd, name + ".npy"), allow_pickle=False)
            with open(os.path.join(sd, name + ".txt")) as f:
                dtype, shape, values = f.read().split("\n")[:3]
            shape = tuple(int(s) for s in shape.split()) if shape.strip() else ()
            conv = int if dtype in ("int64", "bool") else float
            want = np.array([conv(v) for v in values.split()],
                            dtype=np.int64 if conv is int else np.float64)
            problems = []
            if str(arr.dtype) != dtype:
                problems.append("dtype %s, want %s" % (arr.dtype, dtype))
            if arr.shape != shape:
                problems.append("shape %s, want %s" % (arr.shape, shape))
            elif not np.array_equal(arr.astype(want.dtype).ravel(), want,
                                    equal_nan=want.dtype.kind == 'f'):
                problems.append("values differ")
            if not arr.flags.c_contiguous:
                problems.append("not C order")
            if problems:
                print("not ok %d - NumPy reads fl.save %s # %s" % (n, name, "; ".join(problems)))
            else:
                print("ok %d - NumPy reads fl.save %s (%s %s)" % (n, name, dtype, list(shape)))
        except Exception as ex:   # a malformed file is a failure, not a crash
            print("not ok %d - NumPy reads fl.save %s # %s" % (n, name, ex))
    print("1..%d" % n)
    return 0


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "verify":
        sys.exit(verify(sys.argv[2], int(sys.argv[3])))
    if len(sys.argv) != 2:
        sys.stderr.write("usage: gen.py DIR | gen.py verify DIR N\n")
        sys.exit(2)
    sys.exit(generate(sys.argv[1]))
