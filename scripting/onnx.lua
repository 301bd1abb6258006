-- onnx.lua -- fl.load_onnx: an ONNX model (read by io/onnx.c through
-- fl._onnx_read) as an nn module whose forward runs the graph's nodes on fl
-- ops.  Embedded like nn.lua; lfl_onnx.c runs this chunk with the fl table.
--
-- THE table: OPS maps an ONNX op type to a lowering, called once per node
-- at load time as lower(node, attrs, opset); it checks every attribute it
-- is given and returns run(ins) -> outputs, which forward calls with the
-- node's input values.  What a lowering cannot run exactly (an op, an
-- attribute value, a dtype) raises, at load where it can be seen then,
-- "onnx: node 'NAME' (Op, opset N): ... unsupported": never a wrong answer.
--
-- Values flowing between nodes are fl tensors, or "host" integer vectors
-- (what Shape, Size and small int64 constants make): {host=true, v={...},
-- scalar=bool}, whose elements may be symbolic sizes under capture, so
-- the Shape -> Gather -> Concat -> Reshape chains exporters write stay
-- sizes and never become graph data.  Integer constants of the smaller ONNX
-- types (int32...) are held widened to int64 and marked {wide="int32"}:
-- they may serve as indices and sizes, not as arithmetic operands.  The
-- float8 and float4 types are held as float32 (each of their values is
-- exact there), marked the same way ({wide="float8e4m3fn"}).
--
-- Lua allows a chunk 200 locals: a section whose helpers no later one
-- uses is a do-block, so that they go out of scope at its end.

local fl = ...
local nn = fl.nn
local fmt = string.format

local OPS = {}
fl._onnx_ops = OPS
local WIDE   -- the narrow integer types (below)
local narrow_cast   -- a cast to or from them (below)
local SMALLF        -- the float8 and float4 types (below)
local small_cast    -- a cast to or from them (below)
local lower_node, run_nodes   -- a graph's nodes (below: subgraphs use them too)
local QUANT_RANGE   -- the integer types' ranges (below)
-- tensors whose values are known before the call (initializers, Constant
-- nodes): their values may be read under capture
local CONST = setmetatable({}, {__mode = "k"})

-- ---------------------------------------------------------------------------
-- errors
-- ---------------------------------------------------------------------------

-- A name from the file as text: control bytes (an escape sequence could
-- retitle or clear the reader's terminal) shown as \xNN.
local function clean(s)
  return (tostring(s):gsub("[%c\127]", function(c) return fmt("\\x%02x", c:byte()) end))
end

local function node_error(node, msg, ...)
  error(fmt("onnx: node '%s' (%s, opset %d): ", clean(node.name), clean(node.op), node.opset) .. fmt(msg, ...), 0)
end

-- The most elements one node may make (a Range, a Resize): past it a
-- crafted file would take minutes and gigabytes before failing.
local MAX_ELEMS = 1 << 31
local function check_count(node, n, what)
  if n > MAX_ELEMS then
    node_error(node, "%s of %.0f elements: more than one node may make (2^31)", what, n)
  end
end

local function unsupported(node, msg, ...)
  node_error(node, msg .. " is unsupported", ...)
end

-- ONNX dtype names <-> fuselab's
local FL_DTYPE = {float = "float32", float16 = "float16", bfloat16 = "bfloat16", double = "float64",
  int64 = "int64", bool = "bool"}
local ONNX_DTYPE = {float32 = "float", float16 = "float16", bfloat16 = "bfloat16", float64 = "double",
  int64 = "int64", bool = "bool"}
-- TensorProto.DataType codes (Cast's "to")
local DTYPE_CODE = {[1] = "float", [2] = "uint8", [3] = "int8", [4] = "uint16", [5] = "int16",
  [6] = "int32", [7] = "int64", [8] = "string", [9] = "bool", [10] = "float16", [11] = "double",
  [12] = "uint32", [13] = "uint64", [14] = "complex64", [15] = "complex128", [16] = "bfloat16",
  [17] = "float8e4m3fn", [18] = "float8e4m3fnuz", [19] = "float8e5m2", [20] = "float8e5m2fnuz",
  [21] = "uint4", [22] = "int4", [23] = "float4e2m1", [24] = "float8e8m0", [25] = "uint2", [26] = "int2"}
fl._onnx_fl_dtype = FL_DTYPE

-- ---------------------------------------------------------------------------
-- values
-- ---------------------------------------------------------------------------

local is_tensor = fl.is_tensor

local function host(v, scalar) return {host = true, v = v, scalar = scalar} end

-- A host vector from a small int64 tensor with concrete values.
local function host_of_tensor(t)
  if t:dim() > 1 then return nil end
  local l = t:tolist()
  if t:dim() == 0 then return host({l}, true) end
  return host(l, false)
end

-- A size as a 0-d int64 tensor: a symbolic one (under capture) as a graph
-- value 0 + s0, so it stays symbolic where fl.full would need a number.
local function size_value(n)
  if type(n) == "number" then return fl.full({}, n, {dtype = "int64"}) end
  return fl.zeros({}, {dtype = "int64"}) + n
end

-- A size as a plain number: a symbolic one is specialized to its value in
-- this call (that size only; the other dims stay dynamic, and the compiled
-- graph guards it).  For sizes that count the steps of a Lua loop.
local function static_size(n)
  if type(n) == "number" then return n end
  return math.tointeger(n / 1)        -- true division specializes (lfl_sym.c)
end

-- The value as an fl tensor (host vectors are made into int64 tensors,
-- host bools, below, into bool tensors).
local function T(node, v, what)
  if v == nil then node_error(node, "%s is missing", what or "an input") end
  if is_tensor(v) then return v end
  if v.hostbool then
    local l = {}
    for i, b in ipairs(v.v) do l[i] = b and 1 or 0 end
    local t = #l == 0 and fl.zeros({0}, {dtype = "int64"}) or fl.tensor(l, {dtype = "int64"})
    return (v.scalar and t:reshape({}) or t):to("bool")
  end
  if v.wide then unsupported(node, "%s of dtype %s in arithmetic", what or "an input", v.wide) end
  if v.seq or v.opt then node_error(node, "%s is %s, not a tensor", what or "an input", v.seq and "a sequence" or "an optional") end
  if v.host then
    local vals, sym = v.v, false
    for _, x in ipairs(vals) do sym = sym or type(x) ~= "number" end
    if sym then
      -- symbolic sizes become graph values (0 + s0), staying symbolic
      local parts = {}
      for i, x in ipairs(vals) do
        parts[i] = (fl.zeros({}, {dtype = "int64"}) + x):reshape({1})
      end
      if v.scalar then return parts[1]:reshape({}) end
      return #parts == 1 and parts[1] or fl.cat(parts, 1)
    end
    if v.scalar then return fl.full({}, vals[1], {dtype = "int64"}) end
    if #vals == 0 then return fl.zeros({0}, {dtype = "int64"}) end
    return fl.tensor(vals, {dtype = "int64"})
  end
  node_error(node, "%s is not a tensor", what or "an input")
end

-- The integer list a value holds (a shape, axes, indices): from a host
-- vector, a widened constant or an int64 tensor with concrete values.
-- The values of tensor t that sizes or axes need, under capture too: there
-- reading them is a graph break (fl.compile runs the graph so far, then
-- goes on with the values: Dynamo's break on .tolist()), which one graph
-- (fl.capture) cannot take: that is the "unsupported" the message names.
local function concrete(node, t, what, kind)
  if t:dim() > 1 then node_error(node, "%s must be 0-d or 1-d", what) end
  local ok, l = pcall(t.tolist, t)
  if not ok then
    if not fl._tracing() then error(l, 0) end
    unsupported(node, "%s computed from graph inputs under capture (a data-dependent %s)", what, kind)
  end
  return t:dim() == 0 and host({l}, true) or host(l, false)
end

local function ints(node, v, what)
  if v == nil then return nil end
  if not is_tensor(v) and (v.seq or v.opt) then node_error(node, "%s must be a tensor", what) end
  if is_tensor(v) then
    if v.dtype ~= "int64" then node_error(node, "%s must be int64, got %s", what, v.dtype) end
    local h = concrete(node, v, what, "shape")
    return h.v, h.scalar
  end
  if v.wide then
    if SMALLF[v.wide] then node_error(node, "%s must be int64, got %s", what, v.wide) end
    -- a constant's values are known; one computed from inputs is data
    local h = v.const and host_of_tensor(v.t) or concrete(node, v.t, what, "shape")
    return h.v, h.scalar
  end
  if v.hostbool then node_error(node, "%s must be int64, got bool", what) end
  return v.v, v.scalar
end

-- A number from a host value, a constant, or (eagerly only) a tensor.
local function number(node, v, what)
  if not is_tensor(v) then return ints(node, v, what)[1] end
  if v:numel() ~= 1 then node_error(node, "%s must hold one value", what) end
  if fl._tracing() then return concrete(node, v:reshape({-1}), what, "value").v[1] end
  return v:reshape({}):item()
end

local function dtype_of(v)
  if is_tensor(v) then return v.dtype end
  if v.seq or v.opt then return v.seq and "sequence" or "optional" end
  if v.wide then return v.wide end
  if v.hostbool then return "bool" end
  return "int64"
end

local function attr(attrs, name, default)
  local v = attrs[name]
  if v == nil then return default end
  return v
end

-- Check that the node sets no attribute outside `known` (name -> true).
-- The first unknown attribute by name: the same message every run (pairs
-- has no order).
local function known_attrs(node, attrs, known)
  local bad
  for k in pairs(attrs) do
    if not known[k] and (bad == nil or k < bad) then bad = k end
  end
  if bad then unsupported(node, "attribute '%s'", bad) end
end

local function set(...)
  local s = {}
  for _, k in ipairs({...}) do s[k] = true end
  return s
end

-- 0-based ONNX axis -> 1-based fl dim for a rank-r tensor (checked).
local function axis(node, a, r, what)
  a = math.tointeger(a)
  if not a or a < -r or a >= math.max(r, 1) then
    node_error(node, "%s %s out of range for a %d-d input", what or "axis", tostring(a), r)
  end
  if a < 0 then a = a + r end
  return a + 1
end

local function shape_of(x) return x.shape end

local function prod(list, i, j)
  local p = 1
  for k = i, j do p = p * list[k] end
  return p
end

-- ---------------------------------------------------------------------------
-- elementwise
-- ---------------------------------------------------------------------------

local FLOAT = {float32 = true, float64 = true, float16 = true, bfloat16 = true}

local function need_float(node, x, what)
  if not FLOAT[x.dtype] then unsupported(node, "%s of dtype %s", what or "an input", x.dtype) end
end

-- Equality of two sizes, when it is known: plain numbers compared, and a
-- symbolic size (at least 2) is no negative number (the -1 that classic
-- exports test a shape for); nil for what only a guard could answer.
local function size_equal(x, y)
  if type(x) == "number" and type(y) == "number" then return x == y end
  local n = type(x) == "number" and x or type(y) == "number" and y or nil
  if n and n < 0 then return false end
  return nil
end

-- Arithmetic on two size vectors stays on sizes (symbolic ones too):
-- NumPy broadcasting of a 1-element side; nil when it cannot.  "eq" gives
-- a host bool vector {hostbool=true, v={...}}: no size, only a Where's
-- condition over sizes (T makes it a bool tensor anywhere else).
local function host_binary(a, b, op)
  if is_tensor(a) or is_tensor(b) or not a.host or not b.host then return nil end
  local na, nb = #a.v, #b.v
  if na ~= nb and na ~= 1 and nb ~= 1 then return nil end
  local out = {}
  for i = 1, math.max(na, nb) do
    local x, y = a.v[na == 1 and 1 or i], b.v[nb == 1 and 1 or i]
    local r
    if op == "add" then r = x + y
    elseif op == "sub" then r = x - y
    elseif op == "mul" then r = x * y
    elseif op == "div" then
      -- truncation: plain numbers exactly; a size (>= 0) over a positive number
      if math.type(x) == "integer" and math.type(y) == "integer" then
        if y == 0 then return nil end
        r = x // y
        if r < 0 and r * y ~= x then r = r + 1 end
      elseif math.type(y) == "integer" and y > 0 then r = x // y
      else return nil end
    elseif op == "eq" then
      r = size_equal(x, y)
      if r == nil then return nil end
    end
    out[i] = r
  end
  if op == "eq" then return {hostbool = true, v = out, scalar = a.scalar and b.scalar} end
  return host(out, a.scalar and b.scalar)
end

-- binary ops: ONNX has no type promotion, both inputs share a type
local function binary(fn, float_only, hop)
  return function(node, attrs, opset)
    known_attrs(node, attrs, set("broadcast", "axis"))
    if attrs.axis ~= nil and attr(attrs, "broadcast", 0) == 1 then
      unsupported(node, "legacy broadcast with axis")
    end
    return function(ins)
      local h = hop and host_binary(ins[1], ins[2], hop)
      if h then return {h} end
      local a, b = T(node, ins[1], "input A"), T(node, ins[2], "input B")
      if a.dtype ~= b.dtype then
        node_error(node, "inputs of dtypes %s and %s (ONNX needs one type)", a.dtype, b.dtype)
      end
      if float_only then need_float(node, a) end
      return {fn(a, b)}
    end
  end
end

OPS.Add = binary(function(a, b) return a + b end, false, "add")
OPS.Sub = binary(function(a, b) return a - b end, false, "sub")
OPS.Mul = binary(function(a, b) return a * b end, false, "mul")

-- Integer division truncates toward zero (C, not Python).  The float
-- quotient of huge int64 values is off by many units, so it is refined:
-- each round divides the exact integer remainder again (2^24 times
-- smaller each time), then one last step fixes the truncation.
local function int_div(a, b)
  local q = (a:to("float32") / b:to("float32")):to("int64")
  for _ = 1, 3 do
    local r = a - q * b
    q = q + (r:to("float32") / b:to("float32")):to("int64")
  end
  local r = a - q * b
  -- r must have a's sign (or be 0) and |r| < |b|
  local one = fl.full({}, 1, {dtype = "int64"})
  local zero = fl.full({}, 0, {dtype = "int64"})
  local sb = fl.where(b:lt(zero), -one, one)
  local sa = fl.where(a:lt(zero), -one, one)
  local absr, absb = fl.where(r:lt(zero), -r, r), fl.where(b:lt(zero), -b, b)
  local wrong_sign = (r:ne(zero)):to("int64") * (fl.where(r:lt(zero), -one, one):ne(sa)):to("int64")
  -- too big in magnitude: step toward; wrong sign: step back
  q = q + fl.where(absr:ge(absb), sa * sb, zero) - wrong_sign * sa * sb
  return q
end

OPS.Div = binary(function(a, b)
  if a.dtype == "int64" then return int_div(a, b) end
  return a / b
end, false, "div")

OPS.Pow = function(node, attrs)
  known_attrs(node, attrs, {})
  return function(ins)
    local x, y = T(node, ins[1], "input X"), T(node, ins[2], "input Y")
    if x.dtype == "bool" or y.dtype == "bool" then unsupported(node, "Pow of bools") end
    local r = fl.pow(x, y)
    -- the result has the base's type (Pow(int, float) stays int)
    if r.dtype ~= x.dtype then r = r:to(x.dtype) end
    return {r}
  end
end

local function variadic(fn, mean)
  return function(node, attrs)
    known_attrs(node, attrs, {})
    return function(ins)
      local acc = T(node, ins[1])
      for i = 2, #ins do
        local b = T(node, ins[i])
        if b.dtype ~= acc.dtype then node_error(node, "inputs of dtypes %s and %s", acc.dtype, b.dtype) end
        acc = fn(acc, b)
      end
      if mean then
        need_float(node, acc)
        acc = acc / fl.full({}, #ins, {dtype = acc.dtype})
      elseif #ins == 1 then
        acc = acc + fl.zeros({}, {dtype = acc.dtype})   -- a new value, as ONNX's output is
      end
      return {acc}
    end
  end
end

OPS.Max = variadic(fl.maximum)
OPS.Min = variadic(fl.minimum)
OPS.Sum = variadic(function(a, b) return a + b end)
OPS.Mean = variadic(function(a, b) return a + b end, true)

local function compare(method, hop)
  return binary(function(a, b) return a[method](a, b) end, false, hop)
end
OPS.Equal = compare("eq", "eq")
OPS.Less = compare("lt")
OPS.LessOrEqual = compare("le")
OPS.Greater = compare("gt")
OPS.GreaterOrEqual = compare("ge")

local function logical(fn)
  return function(node, attrs)
    known_attrs(node, attrs, {})
    return function(ins)
      local a = T(node, ins[1])
      local b = ins[2] and T(node, ins[2])
      if a.dtype ~= "bool" or (b and b.dtype ~= "bool") then node_error(node, "expected bool inputs") end
      return {fn(a:to("int64"), b and b:to("int64"))}
    end
  end
end
OPS.Not = logical(function(a) return a:eq(fl.zeros({}, {dtype = "int64"})) end)
OPS.And = logical(function(a, b) return (a + b):eq(fl.full({}, 2, {dtype = "int64"})) end)
OPS.Or = logical(function(a, b) return (a + b):gt(fl.zeros({}, {dtype = "int64"})) end)
OPS.Xor = logical(function(a, b) return (a + b):eq(fl.ones({}, {dtype = "int64"})) end)

-- Where over sizes (a host bool condition, size vectors): picked here,
-- each element of the three broadcast from a 1-element side, so the
-- shape a classic export fixes up (Where(Equal(s, -1), 1, s)) stays sizes.
local function host_where(c, a, b)
  if is_tensor(c) or not c.hostbool or is_tensor(a) or is_tensor(b) or not a.host or not b.host then
    return nil
  end
  local n = math.max(#c.v, #a.v, #b.v)
  for _, v in ipairs({c, a, b}) do if #v.v ~= n and #v.v ~= 1 then return nil end end
  local out = {}
  for i = 1, n do
    local k = function(v) return v.v[#v.v == 1 and 1 or i] end
    if k(c) then out[i] = k(a) else out[i] = k(b) end
  end
  return host(out, c.scalar and a.scalar and b.scalar)
end

OPS.Where = function(node, attrs)
  known_attrs(node, attrs, {})
  return function(ins)
    local h = host_where(ins[1], ins[2], ins[3])
    if h then return {h} end
    local c, a, b = T(node, ins[1]), T(node, ins[2]), T(node, ins[3])
    if c.dtype ~= "bool" then node_error(node, "condition must be bool, got %s", c.dtype) end
    if a.dtype ~= b.dtype then node_error(node, "inputs of dtypes %s and %s", a.dtype, b.dtype) end
    return {fl.where(c, a, b)}
  end
end

-- unary ops: fn(x, attrs) with the attributes' defaults filled
local function unary(fn, params, float_only)
  params = params or {}
  local known = {}
  for k in pairs(params) do known[k] = true end
  return function(node, attrs)
    known_attrs(node, attrs, known)
    local p = {}
    for k, d in pairs(params) do p[k] = attr(attrs, k, d) end
    return function(ins)
      local x = T(node, ins[1], "input X")
      if float_only ~= false then need_float(node, x) end
      return {fn(x, p)}
    end
  end
end

local function scalar(x, v) return fl.full({}, v, {dtype = x.dtype}) end
local function clip_lo(x) return fl.maximum(x, scalar(x, 0)) end   -- clip(x, 0, inf)
local function clip_hi(x) return fl.minimum(x, scalar(x, 0)) end   -- clip(x, -inf, 0)

OPS.Relu = unary(function(x) return x:relu() end, nil, false)
OPS.Sigmoid = unary(function(x) return x:sigmoid() end)
OPS.Tanh = unary(function(x) return x:tanh() end)
OPS.Exp = unary(function(x) return x:exp() end)
OPS.Log = unary(function(x) return x:log() end)
OPS.Sqrt = unary(function(x) return x:sqrt() end)
OPS.Abs = unary(function(x) return x:abs() end, nil, false)
OPS.Neg = unary(function(x) return -x end, nil, false)
OPS.Erf = unary(function(x) return x:erf() end)
OPS.Sin = unary(function(x) return x:sin() end)
OPS.Cos = unary(function(x) return x:cos() end)
OPS.Tan = unary(function(x) return x:sin() / x:cos() end)
OPS.Asin = unary(function(x) return x:asin() end)
OPS.Acos = unary(function(x) return x:acos() end)
OPS.Atan = unary(function(x) return x:atan() end)
OPS.Sinh = unary(function(x) return (x:exp() - (-x):exp()) / scalar(x, 2) end)
OPS.Cosh = unary(function(x) return (x:exp() + (-x):exp()) / scalar(x, 2) end)
-- The inverse hyperbolic functions from log and sqrt; near 0, where the
-- log of a number close to 1 keeps few of its digits, their odd series to
-- x^5 (the next term is below 1e-14 of x there).
local function small(x, series, other)
  return fl.where(x:abs():lt(scalar(x, 0.01)), series, other)
end
OPS.Asinh = unary(function(x)
  local a = x:abs()
  local y = (a + (a * a + scalar(x, 1)):sqrt()):log()
  local x2 = x * x
  return small(x, x * (scalar(x, 1) - x2 * (scalar(x, 1 / 6) - x2 * scalar(x, 3 / 40))),
               fl.where(x:lt(scalar(x, 0)), -y, y))
end)
OPS.Acosh = unary(function(x) return (x + (x * x - scalar(x, 1)):sqrt()):log() end)
OPS.Atanh = unary(function(x)
  local x2 = x * x
  return small(x, x * (scalar(x, 1) + x2 * (scalar(x, 1 / 3) + x2 * scalar(x, 1 / 5))),
               ((scalar(x, 1) + x) / (scalar(x, 1) - x)):log() * scalar(x, 0.5))
end)
OPS.Reciprocal = unary(function(x) return scalar(x, 1) / x end)
OPS.Softsign = unary(function(x) return x / (x:abs() + scalar(x, 1)) end)
OPS.Softplus = unary(function(x) return (x:exp() + scalar(x, 1)):log() end)
OPS.Elu = unary(function(x, p)
  return clip_lo(x) + (clip_hi(x):exp() - scalar(x, 1)) * scalar(x, p.alpha)
end, {alpha = 1.0})
OPS.Celu = unary(function(x, p)
  return clip_lo(x) + clip_hi(scalar(x, p.alpha) * ((x / scalar(x, p.alpha)):exp() - scalar(x, 1)))
end, {alpha = 1.0})
OPS.Selu = unary(function(x, p)
  return (clip_lo(x) + (clip_hi(x):exp() - scalar(x, 1)) * scalar(x, p.alpha)) * scalar(x, p.gamma)
end, {alpha = 1.67326319217681884765625, gamma = 1.05070102214813232421875})
OPS.LeakyRelu = unary(function(x, p)
  return clip_lo(x) + clip_hi(x) * scalar(x, p.alpha)
end, {alpha = 0.01})
OPS.ThresholdedRelu = unary(function(x, p)
  return fl.where(x:gt(scalar(x, p.alpha)), x, scalar(x, 0))
end, {alpha = 1.0})
-- numbers, not scalar tensors: constants of the graph, which a
-- convolution's fused epilogue can take (hardswish, cpu/backend.c)
OPS.HardSigmoid = unary(function(x, p)
  return (x * p.alpha + p.beta):clamp(0, 1)
end, {alpha = 0.2, beta = 0.5})
OPS.HardSwish = unary(function(x)
  return x * (x / 6.0 + 0.5):clamp(0, 1)
end)
OPS.Mish = unary(function(x) return x * (x:exp() + scalar(x, 1)):log():tanh() end)
OPS.Sign = unary(function(x)
  return x:gt(scalar(x, 0)):to(x.dtype) - x:lt(scalar(x, 0)):to(x.dtype)
end, nil, false)
OPS.IsNaN = unary(function(x) return x:ne(x) end)
OPS.IsInf = unary(function(x, p)
  local pos = x:eq(scalar(x, math.huge))
  local neg = x:eq(scalar(x, -math.huge))
  if p.detect_positive ~= 0 and p.detect_negative ~= 0 then
    return (pos:to("int64") + neg:to("int64")):gt(fl.zeros({}, {dtype = "int64"}))
  elseif p.detect_positive ~= 0 then return pos
  elseif p.detect_negative ~= 0 then return neg end
  return fl.zeros(x.shape, {dtype = "bool"})
end, {detect_positive = 1, detect_negative = 1})

OPS.Gelu = function(node, attrs)
  known_attrs(node, attrs, set("approximate"))
  local approx = attr(attrs, "approximate", "none")
  if approx ~= "none" and approx ~= "tanh" then node_error(node, "approximate '%s'", approx) end
  return function(ins)
    local x = T(node, ins[1])
    need_float(node, x)
    return {approx == "tanh" and x:gelu("tanh") or x:gelu()}
  end
end

OPS.PRelu = function(node, attrs)
  known_attrs(node, attrs, {})
  return function(ins)
    local x, s = T(node, ins[1]), T(node, ins[2])
    need_float(node, x)
    return {fl.where(x:lt(scalar(x, 0)), x * s, x)}
  end
end

OPS.Identity = function(node, attrs)
  known_attrs(node, attrs, {})
  return function(ins) return {ins[1]} end
end

-- ---- random draws ---------------------------------------------------------
-- fl's Philox stream (graph/rng.c) makes every value.  A node with a seed
-- attribute draws from the stream of that seed, from its start, and leaves
-- the global stream as it was: the same values at every call, eagerly and
-- compiled (under capture they are drawn once, a constant of the graph), as
-- ONNX's reference draws them afresh from RandomState(seed) at each call.
-- Without a seed a node draws from the global stream (fl.manual_seed): new
-- values at every call, a random op under capture, compiled and eager
-- giving the same numbers from the same state.  Numpy's generator, which
-- made the stored outputs of ONNX's test cases, is not reproduced.

-- The Philox key of an ONNX seed (a float): an integral seed is the key
-- fl.manual_seed takes; another keeps its float32 bits, above 2^32.
local function seed_key(seed)
  local i = math.tointeger(seed)
  if i then return i end
  return string.unpack("<I4", string.pack("<f", seed)) | (1 << 32)
end

-- U[0,1) (normal: N(0,1)) values of shape and dtype (a floating one).
local function draw(node, shape, dtype, seed, normal)
  if not FLOAT[dtype] then unsupported(node, "random values of dtype %s", dtype) end
  local fn = normal and fl.randn or fl.rand
  if seed == nil then return fn(shape, {dtype = dtype}) end
  -- values drawn now: a symbolic size (under capture) is specialized to
  -- this call's
  local sizes = {}
  for i, n in ipairs(shape) do sizes[i] = static_size(n) end
  local key = seed_key(seed)
  return fl._untraced(function()
    local state = fl.get_rng_state()
    fl.manual_seed(key)
    local ok, u = pcall(fn, sizes, {dtype = dtype})
    fl.set_rng_state(state)
    if not ok then error(u, 0) end
    return u
  end)
end

-- A 0-d bool or integer input (Dropout's training_mode) as a Lua boolean.
local function flag(node, v, what)
  if not is_tensor(v) and v.hostbool then return v.v[1] end
  local t = T(node, v, what)
  if t:numel() ~= 1 then node_error(node, "%s must hold one value", what) end
  if t.dtype == "bool" then t = t:to("int64") end
  return number(node, t, what) ~= 0
end

-- Dropout: in inference (no training_mode, or 0) the identity and a mask
-- of ones.  In training each element is kept where its U[0,1) value is at
-- least ratio (ONNX's reference: uniform >= ratio) and scaled by
-- 1/(1 - ratio); the mask says which were kept.
OPS.Dropout = function(node, attrs, opset)
  known_attrs(node, attrs, set("ratio", "is_test", "seed"))
  if opset < 7 and attr(attrs, "is_test", 0) == 0 then unsupported(node, "Dropout in training (is_test=0)") end
  local seed = attrs.seed
  return function(ins)
    local x = T(node, ins[1])
    local keep = fl.ones(x.shape, {dtype = "bool"})
    -- before opset 12 Dropout is always the identity (ratio an attribute)
    if opset < 12 or ins[3] == nil or not flag(node, ins[3], "training_mode") then return {x, keep} end
    need_float(node, x)
    local ratio = ins[2] ~= nil and number(node, ins[2], "ratio") or 0.5
    if not (ratio >= 0 and ratio < 1) then node_error(node, "ratio %s outside [0, 1)", tostring(ratio)) end
    if ratio == 0 then return {x, keep} end
    local mask = draw(node, x.shape, "float32", seed):ge(fl.full({}, ratio))
    return {fl.where(mask, x * scalar(x, 1 / (1 - ratio)), fl.zeros({}, {dtype = x.dtype})), mask}
  end
end

-- The dtype attribute of a random op: a floating one, or (default) def.
local function random_dtype(node, attrs, def)
  if attrs.dtype == nil then return def end
  local to = DTYPE_CODE[attrs.dtype]
  if not to then node_error(node, "dtype %s", tostring(attrs.dtype)) end
  local dt = FL_DTYPE[to]
  if not dt or not FLOAT[dt] then unsupported(node, "random values of dtype %s", to) end
  return dt
end

-- RandomUniform[Like], U[low, high), and RandomNormal[Like], N(mean,
-- scale^2), in the dtype and shape of the attributes or of the input (only
-- its shape and dtype are read, a widened integer's too).  A uniform value
-- that rounds up to high (low + (high - low) * u rounded to the dtype, with
-- odds below 2^-23 a value) becomes low, as if the interval wrapped around:
-- the range stays the one promised.
local function random_op(like, normal)
  local pa, qa = normal and "mean" or "low", normal and "scale" or "high"
  return function(node, attrs)
    known_attrs(node, attrs, set("dtype", pa, qa, "seed", like and "dtype" or "shape"))
    local p, q = attr(attrs, pa, 0.0), attr(attrs, qa, 1.0)
    if not normal and not (p < q) then node_error(node, "low %s not below high %s", tostring(p), tostring(q)) end
    local shape = not like and attrs.shape
    if not like and type(shape) ~= "table" then node_error(node, "the shape attribute is required") end
    local fixed = random_dtype(node, attrs, not like and "float32" or nil)
    return function(ins)
      local dt, sh = fixed, shape
      if like then
        local v = ins[1]
        local x = not is_tensor(v) and v.wide and v.t or T(node, v)
        dt, sh = fixed or x.dtype, x.shape
        if not fixed and not FLOAT[dtype_of(v)] then
          unsupported(node, "random values of dtype %s (the input's)", dtype_of(v))
        end
      end
      local u = draw(node, sh, dt, attrs.seed, normal)
      if p == 0 and q == 1 then return {u} end
      if normal then return {scalar(u, p) + u * scalar(u, q)} end
      local y = scalar(u, p) + u * scalar(u, q - p)
      return {fl.where(y:ge(scalar(u, q)), scalar(u, p), y)}
    end
  end
end
OPS.RandomUniformLike = random_op(true, false)
OPS.RandomUniform = random_op(false, false)
OPS.RandomNormalLike = random_op(true, true)
OPS.RandomNormal = random_op(false, true)

OPS.Clip = function(node, attrs, opset)
  if opset < 11 then
    known_attrs(node, attrs, set("min", "max"))
    local lo, hi = attr(attrs, "min", -math.huge), attr(attrs, "max", math.huge)
    return function(ins)
      local x = T(node, ins[1])
      need_float(node, x)
      return {fl.minimum(fl.maximum(x, scalar(x, lo)), scalar(x, hi))}
    end
  end
  known_attrs(node, attrs, {})
  return function(ins)
    local x = T(node, ins[1])
    if x.dtype == "bool" then unsupported(node, "Clip of bools") end
    if ins[2] ~= nil then x = fl.maximum(x, T(node, ins[2], "min")) end
    if ins[3] ~= nil then x = fl.minimum(x, T(node, ins[3], "max")) end
    if ins[2] == nil and ins[3] == nil then x = x + fl.zeros({}, {dtype = x.dtype}) end
    return {x}
  end
end

-- float64 to bfloat16, rounded once to nearest even.  Through float32 it
-- rounds twice, which differs only where the float32 value y lands on a
-- midpoint of two bfloat16 values and x is not y: then x's side of y
-- decides.  y is a midpoint when y - b (b: y rounded) is half a step, so
-- that b + 2 (y - b) is a bfloat16 value too (exact in float64); past the
-- largest finite value the midpoint rounds to infinity, the other side
-- being that largest value.  d (optional, int64): the sign of the exact
-- value less x, where x is itself a rounding (of an integer): a midpoint
-- x then goes d's way.
local function f64_to_bf16(x, d)
  local f64 = function(v) return fl.full({}, v, {dtype = "float64"}) end
  local y = x:to("float32")
  local b = y:to("bfloat16")
  local yd, bd = y:to("float64"), b:to("float64")
  local r = yd - bd
  local other = bd + r * f64(2)
  local tie = r:ne(f64(0)):to("int64") * other:to("float32"):to("bfloat16"):to("float64"):eq(other):to("int64")
  local big = 2.0 ^ 128 - 2.0 ^ 120                         -- the largest finite bfloat16
  local top = bd:abs():eq(f64(math.huge)):to("int64") * yd:abs():eq(f64(2.0 ^ 128 - 2.0 ^ 119)):to("int64")
  other = fl.where(top:ne(size_value(0)), fl.where(yd:lt(f64(0)), f64(-big), f64(big)), other)
  tie = (tie + top):ne(size_value(0))
  local above, off = x:gt(yd), x:ne(yd)
  if d then
    local zero = size_value(0)
    above = fl.where(x:eq(yd), d:gt(zero), above)
    off = fl.where(x:eq(yd), d:ne(zero), off)
  end
  local hi, lo = fl.maximum(bd, other), fl.minimum(bd, other)
  local fixed = fl.where(above, hi, lo)
  local wrong = tie:to("int64") * off:to("int64")
  return fl.where(wrong:ne(size_value(0)), fixed:to("bfloat16"), b)
end

-- int64 values (or uint64 patterns) to bfloat16, rounded once: to float64
-- (exact below 2^53), and the sign of what that rounding left, for
-- f64_to_bf16.  A uint64 from 2^63 up is halved first, as u64_float does
-- (the bit shifted out makes the half odd, so the rounding sees it), and
-- the float doubled.  Where the float is 2^63 or 2^64 (no midpoint) the
-- remainder is not needed.
local function int_to_bf16(t, unsigned)
  local zero, one = size_value(0), size_value(1)
  local function sign(v) return fl.where(v:gt(zero), one, fl.where(v:lt(zero), -one, zero)) end
  local x = t:to("float64")
  local inside = x:abs():lt(fl.full({}, 2.0 ^ 63, {dtype = "float64"}))
  local d = sign(fl.where(inside, t - fl.where(inside, x, fl.zeros({}, {dtype = "float64"})):to("int64"), zero))
  if unsigned then
    local neg = t:lt(zero)
    local half = int_div(t + size_value(math.mininteger), size_value(2)) + size_value(1 << 62)   -- u >> 1
    local odd = t:remainder(size_value(2))
    local sticky = fl.where(half:remainder(size_value(2)):eq(zero), odd, zero)
    local xh = (half + sticky):to("float64")
    local in_h = xh:lt(fl.full({}, 2.0 ^ 63, {dtype = "float64"}))
    local rem = half - fl.where(in_h, xh, fl.zeros({}, {dtype = "float64"})):to("int64")
    local dh = fl.where(rem:eq(zero), sign(odd), sign(rem))      -- u / 2 - xh: rem + odd / 2
    x = fl.where(neg, xh * fl.full({}, 2, {dtype = "float64"}), x)
    d = fl.where(neg, fl.where(in_h, dh, zero), d)
  end
  return f64_to_bf16(x, d)
end

local function cast_to(node, v, to, opts)
  if SMALLF[to] or not is_tensor(v) and SMALLF[v.wide or ""] then return small_cast(node, v, to, opts or {}) end
  -- integers to bfloat16: rounded once, as the reference (fuselab's own
  -- conversion goes through float32)
  if to == "bfloat16" and (not is_tensor(v) and v.wide and not SMALLF[v.wide] or dtype_of(v) == "int64") then
    if not is_tensor(v) and v.wide then return int_to_bf16(v.t, v.wide == "uint64") end
    return int_to_bf16(T(node, v), false)
  end
  if WIDE[to] or not is_tensor(v) and v.wide == "uint64" then return narrow_cast(node, v, to) end
  local target = FL_DTYPE[to]
  if not target then unsupported(node, "casting to %s", to) end
  if not is_tensor(v) and v.wide then
    -- widened integers are exact as int64; to another type they convert
    return v.t:to(target)
  end
  if not is_tensor(v) and v.host and target == "int64" then return v end
  local x = T(node, v)
  -- To bfloat16 the spec only says "rounded" (saturate and round_mode
  -- apply to the float8 types alone), for every opset; the reference
  -- rounds to nearest even (ml_dtypes), as fuselab does: exact from
  -- float32 and float16 (float16 widens to float32 exactly); from float64
  -- once, as the reference (f64_to_bf16).  (ONNX 1.12's reference
  -- truncated: no opset asks for that.)
  if target == "bfloat16" and x.dtype == "float64" then return f64_to_bf16(x) end
  if x.dtype == target then return x end
  return x:to(target)
end

-- saturate (opset 19 on) and round_mode (opset 24 on) only change casts
-- to the float8 types
local function cast_opts(node, attrs)
  local sat, mode = attr(attrs, "saturate", 1), attr(attrs, "round_mode", "up")
  if sat ~= 0 and sat ~= 1 then node_error(node, "saturate %s (0 or 1)", tostring(sat)) end
  if mode ~= "up" and mode ~= "down" and mode ~= "nearest" then
    node_error(node, "round_mode '%s' (up, down or nearest)", clean(mode))
  end
  return {saturate = sat == 1, round_mode = mode}
end

OPS.Cast = function(node, attrs)
  known_attrs(node, attrs, set("to", "saturate", "round_mode"))
  -- before opset 6 "to" was a name ("FLOAT")
  local to = DTYPE_CODE[attrs.to] or (type(attrs.to) == "string" and attrs.to:lower()) or tostring(attrs.to)
  if not FL_DTYPE[to] and not WIDE[to] and not SMALLF[to] then unsupported(node, "casting to %s", to) end
  local opts = cast_opts(node, attrs)
  return function(ins) return {cast_to(node, ins[1], to, opts)} end
end

OPS.CastLike = function(node, attrs)
  known_attrs(node, attrs, set("saturate", "round_mode"))
  local opts = cast_opts(node, attrs)
  return function(ins)
    local like = ins[2]
    if like == nil then node_error(node, "target_type is missing") end
    local to = ONNX_DTYPE[dtype_of(like)] or dtype_of(like)
    return {cast_to(node, ins[1], to, opts)}
  end
end

-- Bernoulli: 1 where a U[0,1) value (in the input's dtype) is below the
-- input's probability, so 1 with probability p as the spec says, cast to
-- dtype (default the input's).  Drawn as the random ops above draw.
OPS.Bernoulli = function(node, attrs)
  known_attrs(node, attrs, set("dtype", "seed"))
  local to = attrs.dtype and DTYPE_CODE[attrs.dtype]
  if attrs.dtype and not to then node_error(node, "dtype %s", tostring(attrs.dtype)) end
  if to and not FL_DTYPE[to] and not WIDE[to] then unsupported(node, "dtype %s", to) end
  return function(ins)
    local p = T(node, ins[1])
    need_float(node, p)
    local hit = draw(node, p.shape, p.dtype, attrs.seed):lt(p)
    return {cast_to(node, hit, to or ONNX_DTYPE[p.dtype])}
  end
end

-- ---------------------------------------------------------------------------
-- reductions, softmax, normalization
-- ---------------------------------------------------------------------------

-- The 1-based dims of `axes` (nil: all) for a rank-r tensor.
local function reduce_dims(node, axes, r)
  local dims = {}
  if axes == nil then
    for d = 1, r do dims[d] = d end
  else
    for i, a in ipairs(axes) do dims[i] = axis(node, a, r, "axis") end
  end
  return dims
end

-- bools: the reduction takes bools (ReduceMax and ReduceMin, opset 20): as
-- 0 and 1 in int64, the result back to bool by > 0 (an empty set's int64
-- identity, the lowest or highest int64, gives false or true)
local function reduce(fn, pre, float_only, bools)
  return function(node, attrs, opset, axes_input_from)
    known_attrs(node, attrs, set("axes", "keepdims", "noop_with_empty_axes"))
    local keep = attr(attrs, "keepdims", 1) ~= 0
    local noop = attr(attrs, "noop_with_empty_axes", 0) ~= 0
    local from_input = opset >= (axes_input_from or 18)
    if from_input and attrs.axes ~= nil then node_error(node, "axes as an attribute (an input since opset %d)", axes_input_from or 18) end
    return function(ins)
      local x = T(node, ins[1], "input data")
      if float_only then need_float(node, x) end
      local axes = attrs.axes
      if from_input and ins[2] ~= nil then axes = ints(node, ins[2], "axes") end
      if axes ~= nil and #axes == 0 then axes = nil end
      if axes == nil and noop then return {pre and pre(x) or x} end
      if x.dtype == "bool" and not bools then unsupported(node, "reducing bools") end
      local dims = reduce_dims(node, axes, x:dim())
      local y = pre and pre(x) or x
      if x.dtype == "bool" then
        y = y:to("int64")
        return {fn(y, x:dim() > 0 and dims or nil, keep):gt(fl.full({}, 0, {dtype = "int64"}))}
      end
      if x:dim() == 0 then return {fn(y, nil, keep)} end
      return {fn(y, dims, keep)}
    end
  end
end

local function red(method)
  return function(y, dims, keep)
    if dims == nil then return y[method](y) end
    return y[method](y, dims, keep)
  end
end

OPS.ReduceSum = function(node, attrs, opset) return reduce(red("sum"))(node, attrs, opset, 13) end
OPS.ReduceMean = reduce(red("mean"))
-- The max of an empty set is -inf, the min +inf (ONNX: the identity of the
-- reduction; the dtype's lowest or highest for integers), where amax and
-- amin refuse to reduce a dim of size 0.
local function red_or_identity(method, identity, int_identity)
  local f = red(method)
  return function(y, dims, keep)
    local reduced, empty = {}, false
    for _, d in ipairs(dims or {}) do
      reduced[d] = true
      empty = empty or y.shape[d] == 0
    end
    if not empty then return f(y, dims, keep) end
    local s = {}
    for k, n in ipairs(y.shape) do
      if not reduced[k] then s[#s + 1] = n elseif keep then s[#s + 1] = 1 end
    end
    return fl.full(s, y.dtype == "int64" and int_identity or identity, {dtype = y.dtype})
  end
end

OPS.ReduceMax = reduce(red_or_identity("amax", -math.huge, math.mininteger), nil, nil, true)
OPS.ReduceMin = reduce(red_or_identity("amin", math.huge, math.maxinteger), nil, nil, true)
OPS.ReduceSumSquare = reduce(red("sum"), function(x) return x * x end)
OPS.ReduceL1 = reduce(red("sum"), function(x) return x:abs() end)
OPS.ReduceL2 = function(node, attrs, opset)
  local r = reduce(red("sum"), function(x) return x * x end, true)(node, attrs, opset)
  return function(ins) return {r(ins)[1]:sqrt()} end
end
OPS.ReduceLogSum = function(node, attrs, opset)
  local r = reduce(red("sum"), nil, true)(node, attrs, opset)
  return function(ins) return {r(ins)[1]:log()} end
end
-- The product as exp(sum(log|x|)) with the sign of the count of negatives:
-- there is no product reduction among fuselab's ops, and this stays within
-- a few float ulps of it (a zero gives exp(-inf) = 0); integers are refused
-- (they must be exact).
OPS.ReduceProd = function(node, attrs, opset)
  return reduce(function(y, dims, keep)
    local mag = (dims and y:abs():log():sum(dims, keep) or y:abs():log()):exp()
    local neg = y:lt(scalar(y, 0)):to("float32")
    local odd = fl.remainder(dims and neg:sum(dims, keep) or neg, fl.full({}, 2.0)):eq(fl.full({}, 1.0))
    return fl.where(odd, -mag, mag)
  end, nil, true)(node, attrs, opset)
end
OPS.ReduceLogSumExp = function(node, attrs, opset)
  local r = reduce(red("sum"), function(x) return x:exp() end, true)(node, attrs, opset)
  return function(ins) return {r(ins)[1]:log()} end
end

local function arg_reduce(negate)
  return function(node, attrs)
    known_attrs(node, attrs, set("axis", "keepdims", "select_last_index"))
    if attr(attrs, "select_last_index", 0) ~= 0 then unsupported(node, "select_last_index=1") end
    local keep = attr(attrs, "keepdims", 1) ~= 0
    return function(ins)
      local x = T(node, ins[1])
      if negate then need_float(node, x, "ArgMin's input") end
      if x.dtype == "bool" then unsupported(node, "arg reduction of bools") end
      local d = axis(node, attr(attrs, "axis", 0), x:dim())
      if negate then x = -x end
      return {x:argmax(d, keep)}
    end
  end
end
OPS.ArgMax = arg_reduce(false)
OPS.ArgMin = arg_reduce(true)

local function softmax(method)
  return function(node, attrs, opset)
    known_attrs(node, attrs, set("axis"))
    local ax = attr(attrs, "axis", opset >= 13 and -1 or 1)
    return function(ins)
      local x = T(node, ins[1])
      need_float(node, x)
      local r = x:dim()
      if r == 0 then node_error(node, "a 0-d input") end
      local d = axis(node, ax, r)
      if opset >= 13 then return {x[method](x, d)} end
      -- before opset 13: the input is seen as 2-D [prod(:axis), prod(axis:)]
      local s = shape_of(x)
      local y = x:reshape({prod(s, 1, d - 1), prod(s, d, r)})
      return {y[method](y, 2):reshape(s)}
    end
  end
end
OPS.Softmax = softmax("softmax")
OPS.LogSoftmax = softmax("log_softmax")

-- the channel-broadcast shape [1, C, 1, ...] of a rank-r input
local function channel_view(v, r)
  local s = {1, v.shape[1]}
  for _ = 3, r do s[#s + 1] = 1 end
  return v:reshape(s)
end

-- BatchNormalization.  In training (training_mode=1, opset 14 on) y is
-- normalized by the batch's own statistics over every dim but the channel
-- (the variance the population one, as ONNX's reference), and the outputs
-- running_mean/running_var blend the inputs with them:
-- input * momentum + current * (1 - momentum).
OPS.BatchNormalization = function(node, attrs, opset)
  known_attrs(node, attrs, set("epsilon", "momentum", "training_mode", "spatial", "is_test",
                              "consumed_inputs"))
  local training = attr(attrs, "training_mode", 0)
  if training ~= 0 and training ~= 1 then node_error(node, "training_mode %s (0 or 1)", tostring(training)) end
  if training == 1 and opset < 14 then node_error(node, "training_mode before opset 14") end
  if attr(attrs, "spatial", 1) ~= 1 then unsupported(node, "spatial=0") end
  if opset < 7 and attr(attrs, "is_test", 0) == 0 then unsupported(node, "is_test=0 (training)") end
  for i = 2, #node.outputs do
    if node.outputs[i] ~= "" and training == 0 then
      if opset >= 14 then node_error(node, "output %d (running mean/var) without training_mode=1", i) end
      unsupported(node, "the training outputs (running mean/var) before opset 14")
    end
  end
  local eps = attr(attrs, "epsilon", 1e-5)
  local momentum = attr(attrs, "momentum", 0.9)
  return function(ins)
    local x, sc, b, mean, var = T(node, ins[1]), T(node, ins[2]), T(node, ins[3]), T(node, ins[4]), T(node, ins[5])
    need_float(node, x)
    local r = x:dim()
    if r < 2 then node_error(node, "input of %d dims (expected [N, C, ...])", r) end
    if training == 0 then
      local y = (x - channel_view(mean, r)) / (channel_view(var, r) + scalar(var, eps)):sqrt()
      return {y * channel_view(sc, r) + channel_view(b, r)}
    end
    need_float(node, mean, "running mean")
    need_float(node, var, "running variance")
    -- the statistics in float32 at least (a float16 sum of many would drift)
    local xs = (x.dtype == "float16" or x.dtype == "bfloat16") and x:to("float32") or x
    local dims = {1}
    for d = 3, r do dims[#dims + 1] = d end
    local m = xs:mean(dims, true)
    local c = xs - m
    local v = (c * c):mean(dims, true)
    local y = c / (v + scalar(v, eps)):sqrt()
    if y.dtype ~= x.dtype then y = y:to(x.dtype) end
    y = y * channel_view(sc, r) + channel_view(b, r)
    local function run(old, cur)
      cur = cur:reshape({-1})
      if cur.dtype ~= old.dtype then cur = cur:to(old.dtype) end
      return old * scalar(old, momentum) + cur * scalar(old, 1 - momentum)
    end
    return {y, run(mean, m), run(var, v)}
  end
end

OPS.InstanceNormalization = function(node, attrs)
  known_attrs(node, attrs, set("epsilon"))
  local eps = attr(attrs, "epsilon", 1e-5)
  return function(ins)
    local x, sc, b = T(node, ins[1]), T(node, ins[2]), T(node, ins[3])
    need_float(node, x)
    local r = x:dim()
    local dims = {}
    for d = 3, r do dims[#dims + 1] = d end
    if #dims == 0 then node_error(node, "input of %d dims", r) end
    local mean = x:mean(dims, true)
    local var = ((x - mean) * (x - mean)):mean(dims, true)
    local y = (x - mean) / (var + scalar(x, eps)):sqrt()
    return {y * channel_view(sc, r) + channel_view(b, r)}
  end
end

OPS.LayerNormalization = function(node, attrs)
  known_attrs(node, attrs, set("axis", "epsilon", "stash_type"))
  if attr(attrs, "stash_type", 1) ~= 1 then unsupported(node, "stash_type %d", attrs.stash_type) end
  local eps = attr(attrs, "epsilon", 1e-5)
  return function(ins)
    local x, w, b = T(node, ins[1]), ins[2] and T(node, ins[2]), ins[3] and T(node, ins[3])
    need_float(node, x)
    local r = x:dim()
    local d = axis(node, attr(attrs, "axis", -1), r)
    local xs = x.dtype == "float32" and x or x:to("float32")
    local dims = {}
    for k = d, r do dims[#dims + 1] = k end
    local mean = xs:mean(dims, true)
    local c = xs - mean
    local inv = fl.full({}, 1.0) / ((c * c):mean(dims, true) + fl.full({}, eps)):sqrt()
    local y = c * inv
    if y.dtype ~= x.dtype then y = y:to(x.dtype) end
    if w then y = y * w end
    if b then y = y + b end
    -- Mean and InvStdDev (float32, the stash type), reduced dims kept
    return {y, mean, inv}
  end
end

-- RMSNormalization (opset 23) as its function body: x over the root mean
-- square of the dims from axis on (+ epsilon), computed in float32 (the
-- stash type), then cast back and scaled.
OPS.RMSNormalization = function(node, attrs)
  known_attrs(node, attrs, set("axis", "epsilon", "stash_type"))
  if attr(attrs, "stash_type", 1) ~= 1 then unsupported(node, "stash_type %d", attrs.stash_type) end
  local eps = attr(attrs, "epsilon", 1e-5)
  return function(ins)
    local x, scale = T(node, ins[1]), T(node, ins[2], "scale")
    need_float(node, x)
    local r = x:dim()
    local d = axis(node, attr(attrs, "axis", -1), r)
    local xs = x.dtype == "float32" and x or x:to("float32")
    local dims = {}
    for k = d, r do dims[#dims + 1] = k end
    local y = xs / ((xs * xs):mean(dims, true) + fl.full({}, eps)):sqrt()
    if y.dtype ~= x.dtype then y = y:to(x.dtype) end
    return {y * scale}
  end
end

-- Attention (opsets 23 to 25) as ONNX's reference computes it: heads split
-- from 3-d inputs, the cache concatenated, grouped-query heads repeated
-- (h0 h0 h1 h1), Q and K each scaled by sqrt(scale), softcap, one additive
-- bias from the mask, the causal frontier (bottom-right: key j for query i
-- when j <= i + offset, offset the past length or nonpad - q length), the
-- sliding window and the padding; a softmax whose fully masked rows are 0,
-- not NaN.  Outputs Y, present_key, present_value, qk_matmul_output.
OPS.Attention = function(node, attrs, opset)
  known_attrs(node, attrs, set("is_causal", "kv_num_heads", "q_num_heads", "qk_matmul_output_mode",
                               "scale", "softcap", "softmax_precision", "left_window_size",
                               "right_window_size"))
  local causal = attr(attrs, "is_causal", 0) ~= 0
  local mode = attr(attrs, "qk_matmul_output_mode", 0)
  local softcap = attr(attrs, "softcap", 0)
  local left, right = attr(attrs, "left_window_size", -1), attr(attrs, "right_window_size", -1)
  local precision = attrs.softmax_precision and FL_DTYPE[DTYPE_CODE[attrs.softmax_precision]]
  if attrs.softmax_precision and not precision then
    unsupported(node, "softmax_precision %s", tostring(attrs.softmax_precision))
  end
  local NEG = -math.huge
  return function(ins)
    local q, k, v = T(node, ins[1], "Q"), T(node, ins[2], "K"), T(node, ins[3], "V")
    local mask, pk, pv = ins[4] and T(node, ins[4], "attn_mask"), ins[5] and T(node, ins[5], "past_key"),
      ins[6] and T(node, ins[6], "past_value")
    local nonpad = ins[7] and T(node, ins[7], "nonpad_kv_seqlen")
    need_float(node, q)
    if (pk == nil) ~= (pv == nil) then node_error(node, "past_key and past_value go together") end
    if nonpad and pk then node_error(node, "nonpad_kv_seqlen with a past cache") end
    local three = q:dim() == 3
    if three then
      local qh, kh = attrs.q_num_heads, attrs.kv_num_heads
      if not qh or not kh then node_error(node, "3-d inputs need q_num_heads and kv_num_heads") end
      local function heads(x, h)
        local b, s, hid = table.unpack(x.shape)
        return x:reshape({b, s, h, hid // h}):permute({1, 3, 2, 4})
      end
      q, k, v = heads(q, qh), heads(k, kh), heads(v, kh)
    elseif q:dim() ~= 4 then
      node_error(node, "Q of %d dims (3 or 4)", q:dim())
    end
    local sc = attrs.scale or 1 / math.sqrt(q.shape[4])
    sc = scalar(q, math.sqrt(sc))
    if pk then k, v = fl.cat({pk, k}, 3), fl.cat({pv, v}, 3) end
    local present_k, present_v = k, v
    local B, H, S, L = q.shape[1], q.shape[2], q.shape[3], k.shape[3]
    -- the additive bias, [.., S, L]
    local zero, ninf = scalar(q, 0), scalar(q, NEG)
    local bias = fl.zeros({S, L}, {dtype = q.dtype})
    if mask then
      local pad = L - mask.shape[mask:dim()]
      if pad > 0 then
        local pads = {}
        for d = 1, 2 * mask:dim() do pads[d] = 0 end
        pads[2 * mask:dim()] = pad                          -- after the last dim
        mask = mask.dtype == "bool" and fl.pad(mask:to("int64"), pads):to("bool")
          or fl.pad(mask, pads, {value = NEG})
      end
      if mask.dtype == "bool" then mask = fl.where(mask, zero, ninf) end
      bias = bias + mask
    end
    local offset
    if nonpad and not pk then offset = nonpad:reshape({-1, 1, 1, 1}) - S
    else offset = pk and pk.shape[3] or 0 end
    local i = fl.arange(S):reshape({S, 1})
    local j = fl.arange(L):reshape({1, L})
    local pos = i + offset                  -- [S,1], or [B,1,S,1] per batch
    if causal then bias = bias + fl.where(j:le(pos), zero, ninf) end
    if left >= 0 or right >= 0 then
      local diff = pos - j
      local ok = fl.ones(diff.shape, {dtype = "bool"})
      if left >= 0 then ok = ok * diff:le(left) end
      if right >= 0 then ok = ok * (-diff):le(right) end
      bias = bias + fl.where(ok, zero, ninf)
    end
    if nonpad then
      bias = bias + fl.where(fl.arange(L):reshape({1, 1, 1, L}):lt(nonpad:reshape({-1, 1, 1, 1})), zero, ninf)
    end
    local kh = k.shape[2]
    if H ~= kh then
      if H % kh ~= 0 then node_error(node, "%d query heads over %d key heads", H, kh) end
      local rep = H // kh
      local function repeat_heads(x)
        local b, h, s, d = table.unpack(x.shape)
        return x:reshape({b, h, 1, s, d}):expand({b, h, rep, s, d}):reshape({b, h * rep, s, d})
      end
      k, v = repeat_heads(k), repeat_heads(v)
    end
    local qk = (q * sc):matmul((k * sc):transpose(3, 4))
    if softcap > 0 then qk = (qk / scalar(qk, softcap)):tanh() * scalar(qk, softcap) end
    local qk_out = qk
    local x = qk + bias
    if mode == 2 then qk_out = x end
    if precision and precision ~= x.dtype then x = x:to(precision) end
    -- softmax with fully masked rows 0: decided on the bias, as ONNX does
    local m = x:amax(x:dim(), true)
    local safe = fl.where(m:eq(scalar(m, NEG)), scalar(m, 0), m)
    local e = (x - safe):exp()
    local s = e:sum(x:dim(), true)
    local p = e / fl.where(s:eq(scalar(s, 0)), scalar(s, 1), s)
    local masked = bias:amax(bias:dim(), true):eq(scalar(bias, NEG))
    p = fl.where(masked, scalar(p, 0), p)
    if mode == 3 then qk_out = p end
    p = p:to(q.dtype)
    local y = p:matmul(v)
    if three then y = y:permute({1, 3, 2, 4}):reshape({B, S, -1}) end
    return {y, present_k, present_v, qk_out:to(q.dtype)}
  end
end

-- RotaryEmbedding (opset 23) as its reference: the first rotary_embedding_dim
-- features of each head turned by the angle the caches give its position
-- (halves, or even and odd features when interleaved); the rest as is.
OPS.RotaryEmbedding = function(node, attrs)
  known_attrs(node, attrs, set("interleaved", "rotary_embedding_dim", "num_heads"))
  local interleaved = attr(attrs, "interleaved", 0) ~= 0
  return function(ins)
    local x, cos, sin = T(node, ins[1], "input"), T(node, ins[2], "cos_cache"), T(node, ins[3], "sin_cache")
    local pos = ins[4] and T(node, ins[4], "position_ids")
    need_float(node, x)
    local shape = x.shape
    if x:dim() == 4 then
      x = x:permute({1, 3, 2, 4})                 -- [batch, seq, heads, head_size]
    elseif x:dim() == 3 then
      local h = attrs.num_heads
      if not h or h < 1 then node_error(node, "a 3-d input needs num_heads") end
      x = x:reshape({shape[1], shape[2], h, shape[3] // h})
    else
      node_error(node, "input of %d dims (3 or 4)", x:dim())
    end
    local hs = x.shape[4]
    local rd = attr(attrs, "rotary_embedding_dim", 0)
    if rd == 0 then rd = hs end
    if rd % 2 ~= 0 or rd > hs then node_error(node, "rotary_embedding_dim %d for heads of %d", rd, hs) end
    if pos then cos, sin = fl.embedding(pos, cos), fl.embedding(pos, sin) end
    if cos.shape[cos:dim()] ~= rd // 2 then
      node_error(node, "cos_cache's last dim %d, not rotary_embedding_dim / 2 = %d", cos.shape[cos:dim()], rd // 2)
    end
    cos, sin = cos:unsqueeze(3), sin:unsqueeze(3)  -- [batch, seq, 1, rd/2]
    local xr = x:narrow(4, 1, rd)
    local x1, x2
    if interleaved then x1, x2 = xr:slice(4, 1, rd, 2), xr:slice(4, 2, rd, 2)
    else x1, x2 = xr:narrow(4, 1, rd // 2), xr:narrow(4, rd // 2 + 1, rd // 2) end
    local re, im = cos * x1 - sin * x2, sin * x1 + cos * x2
    local rot = interleaved and fl.cat({re:unsqueeze(5), im:unsqueeze(5)}, 5):reshape(xr.shape)
      or fl.cat({re, im}, 4)
    local y = rd < hs and fl.cat({rot, x:narrow(4, rd + 1, hs - rd)}, 4) or rot
    if #shape == 3 then return {y:reshape(shape)} end
    return {y:permute({1, 3, 2, 4})}
  end
end

-- LRN: x / (bias + alpha / size * sum of squares over a channel window)^beta.
-- The window sum is an average pool (zeros counted, so sum = avg * size)
-- over x^2 seen as [N, 1, C, H*W]; an even size pads one side more, which
-- the pool cannot.
OPS.LRN = function(node, attrs)
  known_attrs(node, attrs, set("alpha", "beta", "bias", "size"))
  local size = attrs.size
  if not size then node_error(node, "attribute 'size' is required") end
  if size % 2 == 0 then unsupported(node, "an even size (%d: asymmetric window)", size) end
  local alpha, beta, bias = attr(attrs, "alpha", 1e-4), attr(attrs, "beta", 0.75), attr(attrs, "bias", 1.0)
  return function(ins)
    local x = T(node, ins[1])
    need_float(node, x)
    if x:dim() ~= 4 then unsupported(node, "a %d-d input (4-d only)", x:dim()) end
    local s = x.shape
    local sq = (x * x):reshape({s[1], 1, s[2], s[3] * s[4]})
    local sum = sq:avg_pool2d({size, 1}, {stride = {1, 1}, padding = {(size - 1) // 2, 0}}) * scalar(x, size)
    sum = sum:reshape(s)
    return {x / (scalar(x, bias) + sum * scalar(x, alpha / size)) ^ scalar(x, beta)}
  end
end

-- ---------------------------------------------------------------------------
-- linear algebra, convolution, pooling
-- ---------------------------------------------------------------------------

OPS.MatMul = function(node, attrs)
  known_attrs(node, attrs, {})
  return function(ins)
    local a, b = T(node, ins[1]), T(node, ins[2])
    need_float(node, a)
    return {fl.matmul(a, b)}
  end
end

OPS.Gemm = function(node, attrs, opset)
  known_attrs(node, attrs, set("alpha", "beta", "transA", "transB", "broadcast"))
  local alpha, beta = attr(attrs, "alpha", 1.0), attr(attrs, "beta", 1.0)
  local ta, tb = attr(attrs, "transA", 0) ~= 0, attr(attrs, "transB", 0) ~= 0
  return function(ins)
    local a, b = T(node, ins[1]), T(node, ins[2])
    need_float(node, a)
    if ta then a = a:transpose(1, 2) end
    if tb then b = b:transpose(1, 2) end
    local y = fl.matmul(a, b)
    if alpha ~= 1 then y = y * scalar(y, alpha) end
    if ins[3] ~= nil then
      local c = T(node, ins[3])
      if beta ~= 1 then c = c * scalar(c, beta) end
      y = y + c
    end
    return {y}
  end
end

-- Det: the determinant of each n x n matrix in the last two dims, as
-- NumPy's (LAPACK's LU).  Here LU with partial pivoting, unrolled over
-- the n columns, in float64 (rounded once to the type at the end): the
-- row of the largest |pivot| swaps into place (a sign flip when it moves),
-- the rows below lose their multiple of it, and the determinant is the
-- product of the pivots.  A zero pivot column makes it 0 (the division
-- then uses 1, so no NaN spreads).  n up to DET_MAX (the graph grows as n).
local DET_MAX = 64
OPS.Det = function(node, attrs)
  known_attrs(node, attrs, {})
  return function(ins)
    local x = T(node, ins[1], "X")
    need_float(node, x)
    local r = x:dim()
    if r < 2 then node_error(node, "an input of rank %d (at least 2: [..., n, n])", r) end
    local n = x.shape[r]
    if type(n) ~= "number" or type(x.shape[r - 1]) ~= "number" then unsupported(node, "a matrix of symbolic size") end
    if x.shape[r - 1] ~= n then node_error(node, "matrices of %d x %d (square only)", x.shape[r - 1], n) end
    if n > DET_MAX then unsupported(node, "matrices of %d x %d (%d x %d at most)", n, n, DET_MAX, DET_MAX) end
    local batch = {}
    for d = 1, r - 2 do batch[d] = x.shape[d] end
    local a = x:to("float64")
    local det = fl.ones(batch, {dtype = "float64"})
    local rows = fl.arange(n):reshape({n, 1})                     -- row numbers, 0-based
    local zero, one = fl.zeros({}, {dtype = "float64"}), fl.ones({}, {dtype = "float64"})
    for j = 1, n do
      local col = a:narrow(r, j, 1)                               -- [..., n, 1]
      -- the pivot row: the largest |value| at or below row j
      local p = col:narrow(r - 1, j, n - j + 1):abs():argmax(r - 1, true) + size_value(j - 1)   -- [..., 1, 1]
      local at_p, at_j = rows:eq(p), rows:eq(size_value(j - 1))          -- [..., n, 1]
      local row_p = fl.where(at_p, a, zero):sum(r - 1, true)      -- [..., 1, n]
      local row_j = a:narrow(r - 1, j, 1)
      a = fl.where(at_j, row_p, fl.where(at_p, row_j, a))
      local piv = row_p:narrow(r, j, 1)                           -- [..., 1, 1]
      det = det * fl.where(p:eq(size_value(j - 1)), piv, -piv):reshape(batch)
      local safe = fl.where(piv:eq(zero), one, piv)
      local below = rows:gt(size_value(j - 1))
      local f = fl.where(below, a:narrow(r, j, 1) / safe, zero)   -- [..., n, 1]
      a = a - f * row_p
    end
    return {det:to(x.dtype)}
  end
end

-- Spatial attributes of a conv/pool node for `nsp` spatial dims: strides,
-- pads at the start and at the end of each dim, dilations.  auto_pad SAME
-- puts the odd pixel at the end (SAME_UPPER) or the start (SAME_LOWER).
local function spatial(node, attrs, nsp, kshape, in_shape)
  local strides = attr(attrs, "strides", nil) or {}
  local pads = attr(attrs, "pads", nil)
  local dil = attr(attrs, "dilations", nil) or {}
  local auto = attr(attrs, "auto_pad", "NOTSET")
  for i = 1, nsp do
    strides[i] = strides[i] or 1
    dil[i] = dil[i] or 1
  end
  local pb, pe = {}, {}
  if auto == "NOTSET" then
    pads = pads or {}
    for i = 1, nsp do pb[i], pe[i] = pads[i] or 0, pads[i + nsp] or 0 end
  elseif auto == "VALID" then
    for i = 1, nsp do pb[i], pe[i] = 0, 0 end
  elseif auto == "SAME_UPPER" or auto == "SAME_LOWER" then
    for i = 1, nsp do
      local n = math.tointeger(in_shape[2 + i])
      if not n then unsupported(node, "auto_pad %s over a dynamic size", auto) end
      local out = (n + strides[i] - 1) // strides[i]
      local total = math.max(0, (out - 1) * strides[i] + (kshape[i] - 1) * dil[i] + 1 - n)
      local small = total // 2
      if auto == "SAME_UPPER" then pb[i], pe[i] = small, total - small
      else pb[i], pe[i] = total - small, small end
    end
  else
    node_error(node, "auto_pad '%s'", auto)
  end
  return strides, pb, pe, dil
end

-- The 2-d window options of fl.conv2d and the pools from spatial()'s
-- lists; a 1-d window is a 2-d one of height 1.
local function window2d(nsp, strides, pb, pe, dil)
  if nsp == 1 then
    return {1, strides[1]}, {0, pb[1], 0, pe[1]}, {1, dil[1]}
  end
  return strides, {pb[1], pb[2], pe[1], pe[2]}, dil
end

-- A Conv node's convolution of x by w (and bias b): its attributes, 1-d
-- and 2-d (ConvInteger and QLinearConv use it too).
-- The 2-d window (strides, pads, dilations) of a Conv-like node's x of
-- rank r (3 or 4) by weight w, checked against its kernel_shape.
local function conv_window(node, attrs, x, w, r)
  local k = {}
  for i = 3, w:dim() do k[#k + 1] = w.shape[i] end
  for i, v in ipairs(attrs.kernel_shape or {}) do
    if v ~= k[i] then node_error(node, "kernel_shape %s does not match the weight", table.concat(attrs.kernel_shape, ",")) end
  end
  return window2d(r - 2, spatial(node, attrs, r - 2, k, x.shape))
end

local function conv_nd(node, attrs, x, w, b)
  local groups = attr(attrs, "group", 1)
  local r = x:dim()
  if r ~= 3 and r ~= 4 then unsupported(node, "a %d-d convolution (1-d and 2-d only)", r - 2) end
  local ss, pp, dd = conv_window(node, attrs, x, w, r)
  local opts = {stride = ss, padding = pp, dilation = dd, groups = groups}
  if r == 3 then
    return fl.conv2d(x:unsqueeze(3), w:unsqueeze(3), b, opts):squeeze(3)
  end
  return fl.conv2d(x, w, b, opts)
end

OPS.Conv = function(node, attrs)
  known_attrs(node, attrs, set("auto_pad", "dilations", "group", "kernel_shape", "pads", "strides"))
  return function(ins)
    local x, w = T(node, ins[1]), T(node, ins[2])
    local b = ins[3] ~= nil and T(node, ins[3]) or nil
    need_float(node, x)
    return {conv_nd(node, attrs, x, w, b)}
  end
end

-- A 3-d convolution at stride 1 and no padding (x padded already) from
-- fl.conv2d: per depth tap t, the 2-d convolution of every depth slice it
-- meets (the depths as batch) by the weight's slice t, summed over the taps.
local function conv3d_taps(x, w, b, dil, groups)
  local N, C, D, H, W = table.unpack(x.shape)
  local Co, kd = w.shape[1], w.shape[3]
  local Do = D - (kd - 1) * dil[1]
  local y
  for t = 0, kd - 1 do
    local xs = x:narrow(3, 1 + t * dil[1], Do):permute({1, 3, 2, 4, 5}):reshape({N * Do, C, H, W})
    local yt = fl.conv2d(xs, w:narrow(3, t + 1, 1):squeeze(3), nil,
                         {stride = {1, 1}, padding = {0, 0, 0, 0}, dilation = {dil[2], dil[3]}, groups = groups})
    y = y and y + yt or yt
  end
  y = y:reshape({N, Do, Co, y.shape[3], y.shape[4]}):permute({1, 3, 2, 4, 5})
  if b then y = y + b:reshape({1, Co, 1, 1, 1}) end
  return y:contiguous()
end

-- ConvTranspose as the convolution it is the gradient of: the input with
-- stride - 1 zeros between its elements, padded by dilation x (k - 1) less
-- the transposed pads (a negative pad crops), convolved at stride 1 with
-- the weight flipped and its in and out channels swapped within each group.
OPS.ConvTranspose = function(node, attrs)
  known_attrs(node, attrs, set("auto_pad", "dilations", "group", "kernel_shape", "output_padding",
                              "output_shape", "pads", "strides"))
  local groups = attr(attrs, "group", 1)
  return function(ins)
    local x, w = T(node, ins[1]), T(node, ins[2])
    local b = ins[3] ~= nil and T(node, ins[3]) or nil
    need_float(node, x)
    local r = x:dim()
    if r < 3 or r > 5 then unsupported(node, "a %d-d transposed convolution (1-d, 2-d and 3-d only)", r - 2) end
    local nsp = r - 2
    if w:dim() ~= r then node_error(node, "weight of %d dims for input of %d", w:dim(), r) end
    local Cin, Coutg = w.shape[1], w.shape[2]
    if x.shape[2] ~= Cin or Cin % groups ~= 0 then node_error(node, "%s input channels for a weight of %d", tostring(x.shape[2]), Cin) end
    -- copies: the 1-d case below extends them, and the node's attributes
    -- must stay as they are for the next call
    local k, s, d, op = {}, {table.unpack(attr(attrs, "strides", {}))}, {table.unpack(attr(attrs, "dilations", {}))},
      {table.unpack(attr(attrs, "output_padding", {}))}
    local pads, auto, oshape = attrs.pads or {}, attr(attrs, "auto_pad", "NOTSET"), attrs.output_shape
    local pb, pe = {}, {}
    for i = 1, nsp do
      k[i], s[i], d[i], op[i] = w.shape[2 + i], s[i] or 1, d[i] or 1, op[i] or 0
      local n = x.shape[2 + i]
      if type(n) ~= "number" then unsupported(node, "a transposed convolution over a dynamic size") end
      local full = s[i] * (n - 1) + op[i] + (k[i] - 1) * d[i] + 1
      if oshape or auto == "SAME_UPPER" or auto == "SAME_LOWER" then
        local want = oshape and oshape[#oshape - nsp + i] or n * s[i]
        local total = full - want          -- negative: the output grows (pads below 0)
        local half = total // 2
        if auto == "SAME_UPPER" then pb[i], pe[i] = half, total - half
        else pb[i], pe[i] = total - half, half end
      elseif auto == "NOTSET" or auto == "VALID" then
        pb[i], pe[i] = auto == "VALID" and 0 or (pads[i] or 0), auto == "VALID" and 0 or (pads[i + nsp] or 0)
      else
        node_error(node, "auto_pad '%s'", auto)
      end
    end
    if nsp == 3 then
      -- the same steps in 3-d: zeros between the elements along each dim,
      -- the pads, then the flipped weight at stride 1 (conv3d_taps)
      local N, C, D, H, W = table.unpack(x.shape)
      if s[1] > 1 or s[2] > 1 or s[3] > 1 then
        x = x:reshape({N, C, D, 1, H, 1, W, 1})
        x = fl.pad(x, {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, s[1] - 1, 0, s[2] - 1, 0, s[3] - 1})
        x = x:reshape({N, C, D * s[1], H * s[2], W * s[3]}):narrow(3, 1, (D - 1) * s[1] + 1)
          :narrow(4, 1, (H - 1) * s[2] + 1):narrow(5, 1, (W - 1) * s[3] + 1)
      end
      local padv = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0}
      for i = 1, 3 do
        padv[2 + i] = (k[i] - 1) * d[i] - pb[i]
        padv[5 + 2 + i] = (k[i] - 1) * d[i] - pe[i] + op[i]
      end
      x = fl.pad(x, padv)
      local G, Cing = groups, Cin // groups
      local wt = w:reshape({G, Cing, Coutg, k[1], k[2], k[3]}):permute({1, 3, 2, 4, 5, 6})
        :reshape({G * Coutg, Cing, k[1], k[2], k[3]}):flip({3, 4, 5})
      return {conv3d_taps(x, wt, b, d, G)}
    end
    if nsp == 1 then
      x, w = x:unsqueeze(3), w:unsqueeze(3)
      table.insert(k, 1, 1); table.insert(s, 1, 1); table.insert(d, 1, 1); table.insert(op, 1, 0)
      table.insert(pb, 1, 0); table.insert(pe, 1, 0)
    end
    -- zeros between the elements: [N, C, H, 1, W, 1] padded to s, then folded
    local N, C, H, W = table.unpack(x.shape)
    if s[1] > 1 or s[2] > 1 then
      x = x:reshape({N, C, H, 1, W, 1})
      x = fl.pad(x, {0, 0, 0, 0, 0, 0, 0, 0, 0, s[1] - 1, 0, s[2] - 1})
      x = x:reshape({N, C, H * s[1], W * s[2]}):narrow(3, 1, (H - 1) * s[1] + 1):narrow(4, 1, (W - 1) * s[2] + 1)
    end
    local padv = {}
    for i = 1, 2 do
      padv[2 + i] = (k[i] - 1) * d[i] - pb[i]
      padv[4 + 2 + i] = (k[i] - 1) * d[i] - pe[i] + op[i]
    end
    padv[1], padv[2], padv[5], padv[6] = 0, 0, 0, 0
    x = fl.pad(x, padv)
    -- weight [Cin, Cout/g, kh, kw] -> [Cout, Cin/g, kh, kw], flipped
    local G, Cing = groups, Cin // groups
    local wt = w:reshape({G, Cing, Coutg, k[1], k[2]}):permute({1, 3, 2, 4, 5})
      :reshape({G * Coutg, Cing, k[1], k[2]}):flip({3, 4})
    local y = fl.conv2d(x, wt, b, {stride = {1, 1}, padding = {0, 0, 0, 0}, dilation = d, groups = G})
    if nsp == 1 then y = y:squeeze(3) end
    return {y}
  end
end

-- MaxPool's Indices: per output, the flat index in x (n, c and the
-- spatial position, row-major; storage_order 1 puts the first spatial dim
-- fastest) of the first tap in window order that holds the max y, as
-- ONNX's reference scans.  Each tap's source position per output is known
-- from the shapes: the taps' values are one gather from each plane, the
-- first equal to y one min over the taps, and its position a pick among
-- the taps' constants by a one-hot mask.
local function max_pool_indices(node, x, y, k, strides, pb, dil, order)
  local r = x:dim()
  for _, n in ipairs(x.shape) do
    if type(n) ~= "number" then unsupported(node, "the Indices output over a dynamic size") end
  end
  local N, C = x.shape[1], x.shape[2]
  local nin, nout, P, O, K = {}, {}, 1, 1, 1
  for i = 1, r - 2 do
    nin[i], nout[i] = x.shape[2 + i], y.shape[2 + i]
    P, O, K = P * nin[i], O * nout[i], K * k[i]
  end
  check_count(node, K * O * N * C, "MaxPool's taps")
  -- the place value of each spatial dim in a plane's flat index
  local place, pl = {}, 1
  if order == 1 then
    for i = 1, r - 2 do place[i], pl = pl, pl * nin[i] end
  else
    for i = r - 2, 1, -1 do place[i], pl = pl, pl * nin[i] end
  end
  local src, flat, valid = {}, {}, {}       -- [K][O]: row-major source, stored index, in range
  local o_at, t_at = {}, {}
  for t = 0, K - 1 do
    -- tap t's offsets, window order (the last dim fastest)
    local rem = t
    for i = r - 2, 1, -1 do t_at[i] = rem % k[i]; rem = rem // k[i] end
    local s_row, f_row, v_row = {}, {}, {}
    for o = 0, O - 1 do
      local remo = o
      for i = r - 2, 1, -1 do o_at[i] = remo % nout[i]; remo = remo // nout[i] end
      local ok, sflat, fflat = true, 0, 0
      for i = 1, r - 2 do
        local q = o_at[i] * strides[i] - pb[i] + t_at[i] * dil[i]
        if q < 0 or q >= nin[i] then ok = false break end
        sflat = sflat * nin[i] + q
        fflat = fflat + q * place[i]
      end
      s_row[o + 1], f_row[o + 1], v_row[o + 1] = ok and sflat or 0, ok and fflat or 0, ok
    end
    src[t + 1], flat[t + 1], valid[t + 1] = s_row, f_row, v_row
  end
  local xs = x:reshape({N, C, P})
  local ys = y:reshape({N, C, 1, O})
  local v = fl.gather(xs, 3, fl.tensor(src, {dtype = "int64"})):reshape({N, C, K, O})
  local hit = fl.where(fl.tensor(valid, {dtype = "bool"}):reshape({1, 1, K, O}), v:eq(ys), fl.full({}, false))
  local kk = fl.arange(K):reshape({1, 1, K, 1})
  local first = fl.where(hit, kk, fl.full({}, K, {dtype = "int64"})):amin(3, true)      -- [N, C, 1, O]
  local at = fl.where(first:eq(kk), fl.tensor(flat, {dtype = "int64"}):reshape({1, 1, K, O}),
                      fl.zeros({}, {dtype = "int64"})):sum(3)                          -- [N, C, O]
  local plane = fl.arange(N * C):reshape({N, C, 1}) * fl.full({}, P, {dtype = "int64"})
  return (at + plane):reshape(y.shape)
end

-- Col2Im (PyTorch's fold): block k of column l summed into the image at
-- block l's corner + k x dilation - pads.  That is a transposed
-- convolution: the columns as a [N, C x K, blocks...] grid, grouped by
-- channel, by a one-hot weight (column channel c K + k feeds channel c at
-- tap k), the image's rows past the last block (fewer than a stride) as
-- output_padding.
OPS.Col2Im = function(node, attrs)
  known_attrs(node, attrs, set("dilations", "pads", "strides"))
  return function(ins)
    local x = T(node, ins[1])
    need_float(node, x)
    local img, blk = ints(node, ins[2], "image_shape"), ints(node, ins[3], "block_shape")
    local nsp = #img
    if #blk ~= nsp then node_error(node, "image_shape of %d dims and block_shape of %d", nsp, #blk) end
    if nsp < 1 or nsp > 3 then unsupported(node, "a %d-d image (1-d, 2-d and 3-d only)", nsp) end
    if x:dim() ~= 3 then node_error(node, "input of %d dims (expected [N, C x block size, L])", x:dim()) end
    local s, d, pads = {table.unpack(attr(attrs, "strides", {}))}, {table.unpack(attr(attrs, "dilations", {}))},
      attr(attrs, "pads", {})
    local K, L, grid, op = 1, 1, {}, {}
    for i = 1, nsp do
      s[i], d[i] = s[i] or 1, d[i] or 1
      local len = img[i] + (pads[i] or 0) + (pads[nsp + i] or 0) - (blk[i] - 1) * d[i] - 1
      if blk[i] < 1 or len < 0 then node_error(node, "block %d over an image of %d", blk[i], img[i]) end
      grid[i], op[i] = len // s[i] + 1, len % s[i]
      K, L = K * blk[i], L * grid[i]
    end
    local CK, n = x.shape[2], x.shape[3]
    if type(CK) ~= "number" or CK % K ~= 0 then node_error(node, "%s input channels for blocks of %d", tostring(CK), K) end
    if n ~= L then node_error(node, "%s columns for %d blocks", tostring(n), L) end
    local C = CK // K
    local eye = {}
    for i = 1, K * K do eye[i] = (i - 1) // K == (i - 1) % K and 1.0 or 0.0 end
    local wshape = {K, 1}
    for i = 1, nsp do wshape[2 + i] = blk[i] end
    local w = fl.tensor(eye):to(x.dtype):reshape(wshape)
    if C > 1 then
      local rep = {C, K, 1}
      for i = 1, nsp do rep[3 + i] = blk[i] end
      local full = {C * K, 1}
      for i = 1, nsp do full[2 + i] = blk[i] end
      w = w:unsqueeze(1):expand(rep):reshape(full)
    end
    local xs = {x.shape[1], CK}
    for i = 1, nsp do xs[2 + i] = grid[i] end
    return OPS.ConvTranspose(node, {strides = s, dilations = d, pads = pads, output_padding = op, group = C})(
      {x:reshape(xs), w})
  end
end

local pool2d
local function pool(kind)
  return function(node, attrs)
    known_attrs(node, attrs, set("auto_pad", "ceil_mode", "count_include_pad", "dilations",
                                "kernel_shape", "pads", "storage_order", "strides", kind == "lp" and "p" or nil))
    local order = attr(attrs, "storage_order", 0)
    if order ~= 0 and order ~= 1 then node_error(node, "storage_order %s", tostring(order)) end
    local want_idx = kind == "max" and node.outputs[2] and node.outputs[2] ~= ""
    local k = attrs.kernel_shape
    if not k then node_error(node, "attribute 'kernel_shape' is required") end
    local function self_pool(x, kk, ss, pp, dd, as) return pool2d(node, attrs, as or kind, x, kk, ss, pp, dd) end
    local function pool_nd(x, strides, pb, pe, dil)
      local r = x:dim()
      if r == 5 then
        -- a 3-d pool is separable: the 2-d pool of each depth slice, then
        -- a pool along the depth (a window's valid elements, which an
        -- average without the padding counts, are a box: its count is the
        -- product of the two pools' counts); an Lp pool is the p-th root
        -- of the window sums of |x|^p, summed the same way
        local N, C, D, H, W = table.unpack(x.shape)
        for _, n in ipairs(x.shape) do
          if type(n) ~= "number" then unsupported(node, "a 3-d pool over a dynamic size") end
        end
        local as = kind == "lp" and "sum" or nil
        local pw = attr(attrs, "p", 2)
        if kind == "lp" then x = x:abs():pow(pw) end
        local y = self_pool(x:reshape({N, C * D, H, W}), {k[2], k[3]}, {strides[2], strides[3]},
                            {pb[2], pb[3], pe[2], pe[3]}, {dil[2], dil[3]}, as)
        local H2, W2 = y.shape[3], y.shape[4]
        y = self_pool(y:reshape({N, C, D, H2 * W2}), {k[1], 1}, {strides[1], 1}, {pb[1], 0, pe[1], 0}, {dil[1], 1}, as)
        y = y:reshape({N, C, y.shape[3], H2, W2})
        if kind == "lp" then y = y:pow(1 / pw) end
        return y
      end
      local kk = r == 3 and {1, k[1]} or k
      local ss, pp, dd = window2d(r - 2, strides, pb, pe, dil)
      if r == 3 then x = x:unsqueeze(3) end
      local y = self_pool(x, kk, ss, pp, dd)
      if r == 3 then y = y:squeeze(3) end
      return y
    end
    return function(ins)
      local x = T(node, ins[1])
      need_float(node, x)
      local r = x:dim()
      if r < 3 or r > 5 or #k ~= r - 2 then unsupported(node, "a %d-d pool (1-d, 2-d and 3-d only)", r - 2) end
      local strides, pb, pe, dil = spatial(node, attrs, r - 2, k, x.shape)
      for i = 1, r - 2 do
        local span = (k[i] - 1) * dil[i] + 1
        if pb[i] >= span or pe[i] >= span then
          unsupported(node, "pads as large as the kernel (%d, %d of %d)", pb[i], pe[i], span)
        end
      end
      local y = pool_nd(x, strides, pb, pe, dil)
      if want_idx then return {y, max_pool_indices(node, x, y, k, strides, pb, dil, order)} end
      return {y}
    end
  end
end

-- Windows fl's average pool does not take (dilated), and plain window
-- sums: the sum over each window of 4-d x as a convolution by ones, one
-- channel at a time (groups = C), zero padded, the end padded further for
-- ceil_mode's last window; and per dim, each output's count of the taps
-- an average divides by: those inside the input, or with include
-- (count_include_pad) inside the input and its pads, as ONNX's reference
-- counts them (ceil_mode's extra end is no pad).
local function window_sum(node, x, kk, ss, pp, dd, ceil, include)
  local C = x.shape[2]
  if type(C) ~= "number" then unsupported(node, "a dilated pool over a dynamic channel count") end
  local pads, counts = {pp[1], pp[2], pp[3], pp[4]}, {}
  for i = 1, 2 do
    local n = x.shape[2 + i]
    if type(n) ~= "number" then unsupported(node, "a dilated pool over a dynamic size") end
    local pb, pe = pp[i], pp[2 + i]
    local span = (kk[i] - 1) * dd[i] + 1
    local len = n + pb + pe - span
    if len < 0 then node_error(node, "a window of %d over %d padded by %d, %d", span, n, pb, pe) end
    local out = len // ss[i] + 1
    if ceil and len % ss[i] ~= 0 then
      out = out + 1
      -- the last window starts inside the input or its start pad
      if (out - 1) * ss[i] >= n + pb then out = out - 1 end
    end
    pads[2 + i] = math.max(pe, (out - 1) * ss[i] + span - n - pb)
    local c = {}
    for o = 0, out - 1 do
      local m = 0
      for j = 0, kk[i] - 1 do
        local q = o * ss[i] - pb + j * dd[i]
        if (q >= 0 and q < n) or (include and q >= -pb and q < n + pe) then m = m + 1 end
      end
      c[o + 1] = m
    end
    counts[i] = c
  end
  local w = fl.ones({C, 1, kk[1], kk[2]}, {dtype = x.dtype})
  return fl.conv2d(x, w, nil, {stride = ss, padding = pads, dilation = dd, groups = C}), counts
end

-- the 2-d pool of kind over 4-d x (window2d's strides, pads and dilations);
-- kind "sum" is the plain window sum (a 3-d Lp pool's parts)
function pool2d(node, attrs, kind, x, kk, ss, pp, dd)
  local ceil = attr(attrs, "ceil_mode", 0) ~= 0
  local dilated = dd[1] ~= 1 or dd[2] ~= 1
  if kind == "sum" then return (window_sum(node, x, kk, ss, pp, dd, ceil, false)) end
  if kind == "max" then
    return x:max_pool2d(kk, {stride = ss, padding = pp, dilation = dd, ceil_mode = ceil})
  elseif kind == "lp" then
    -- (sum of |x|^p over the window)^(1/p): an average pool counting the
    -- zero padding, times the window's size
    local pw = attr(attrs, "p", 2)
    if dilated then return window_sum(node, x:abs():pow(pw), kk, ss, pp, dd, ceil, false):pow(1 / pw) end
    local s = x:abs():pow(pw):avg_pool2d(kk, {stride = ss, padding = pp, ceil_mode = ceil,
                                             count_include_pad = true})
    return (s * scalar(s, kk[1] * kk[2])):pow(1 / pw)
  end
  local include = attr(attrs, "count_include_pad", 0) ~= 0
  if dilated then
    local sum, c = window_sum(node, x, kk, ss, pp, dd, ceil, include)
    local n = {}
    for i, ch in ipairs(c[1]) do
      n[i] = {}
      for j, cw in ipairs(c[2]) do n[i][j] = ch * cw end
    end
    if #c[1] == 0 or #c[2] == 0 then return sum end
    return sum / fl.tensor(n, {dtype = "float32"}):to(x.dtype)
  end
  return x:avg_pool2d(kk, {stride = ss, padding = pp, ceil_mode = ceil, count_include_pad = include})
end
OPS.MaxPool = pool("max")
OPS.AveragePool = pool("avg")
OPS.LpPool = pool("lp")

-- MaxUnpool: each value of x put at the flat index its I names in a zero
-- tensor of the unpooled shape ((n - 1) x stride - pads + kernel per
-- spatial dim), as ONNX's reference puts them (a later value at the same
-- index wins); a larger output_shape keeps that tensor at its start, zeros
-- after it, as the reference (and ONNX's test) place it.  With no scatter
-- op among fuselab's, the values land by a one-hot mask [U, P] (U values,
-- P positions), as ScatterND's do: the last value landing on each
-- position found by a max over the mask, then one gather.
OPS.MaxUnpool = function(node, attrs)
  known_attrs(node, attrs, set("kernel_shape", "pads", "strides"))
  local k = attrs.kernel_shape
  if not k then node_error(node, "attribute 'kernel_shape' is required") end
  return function(ins)
    local x, idx = T(node, ins[1]), T(node, ins[2], "indices")
    if idx.dtype ~= "int64" then node_error(node, "indices of dtype %s", idx.dtype) end
    local r = x:dim()
    if r ~= #k + 2 then node_error(node, "input of %d dims for a %d-d kernel", r, #k) end
    if idx:dim() ~= r then node_error(node, "indices of another shape than the input") end
    for d = 1, r do
      if type(x.shape[d]) ~= "number" then unsupported(node, "unpooling a dynamic size") end
      if idx.shape[d] ~= x.shape[d] then node_error(node, "indices of another shape than the input") end
    end
    local s, pads = attr(attrs, "strides", {}), attr(attrs, "pads", {})
    local shape, P = {x.shape[1], x.shape[2]}, x.shape[1] * x.shape[2]
    for i = 1, #k do
      local n = (x.shape[2 + i] - 1) * (s[i] or 1) - ((pads[i] or 0) + (pads[#k + i] or 0)) + k[i]
      if n < 0 then node_error(node, "an unpooled size of %d", n) end
      shape[2 + i], P = n, P * n
    end
    local U = x:numel()
    check_count(node, U * P, "MaxUnpool's mask")
    if not fl._tracing() and U > 0 then          -- as check_indices (below) refuses them
      local bad = idx:lt(fl.zeros({}, {dtype = "int64"})):to("int64") + idx:ge(fl.full({}, P, {dtype = "int64"})):to("int64")
      if bad:sum():item() > 0 then node_error(node, "an index out of range [0, %d]", P - 1) end
    end
    local xf, it = x:reshape({U}), idx:reshape({U, 1})
    local last = fl.where(it:eq(fl.arange(P):reshape({1, P})), fl.arange(U):reshape({U, 1}),
                          fl.full({}, -1, {dtype = "int64"})):amax(1)              -- [P]
    local hit = last:ge(fl.zeros({}, {dtype = "int64"}))
    local v = fl.gather(xf, 1, fl.where(hit, last, fl.zeros({}, {dtype = "int64"})))
    local y = fl.where(hit, v, fl.zeros({}, {dtype = x.dtype})):reshape(shape)
    if ins[3] ~= nil then
      local os = ints(node, ins[3], "output_shape")
      if #os ~= r then node_error(node, "output_shape of %d dims for input of %d", #os, r) end
      local pv, grow = {}, false
      for d = 1, r do
        if os[d] < shape[d] then
          node_error(node, "output_shape %s smaller than the unpooled shape %s",
                     table.concat(os, ","), table.concat(shape, ","))
        end
        pv[d], pv[r + d] = 0, os[d] - shape[d]
        grow = grow or os[d] > shape[d]
      end
      if grow then y = fl.pad(y, pv) end
    end
    return {y}
  end
end

local function global_pool(method)
  return function(node, attrs)
    known_attrs(node, attrs, {})
    return function(ins)
      local x = T(node, ins[1])
      need_float(node, x)
      local dims = {}
      for d = 3, x:dim() do dims[#dims + 1] = d end
      if #dims == 0 then node_error(node, "input of %d dims", x:dim()) end
      return {x[method](x, dims, true)}
    end
  end
end
OPS.GlobalAveragePool = global_pool("mean")
OPS.GlobalMaxPool = global_pool("amax")
OPS.GlobalLpPool = function(node, attrs)
  known_attrs(node, attrs, set("p"))
  local pw = attr(attrs, "p", 2)
  return function(ins)
    local x = T(node, ins[1])
    need_float(node, x)
    local dims = {}
    for d = 3, x:dim() do dims[#dims + 1] = d end
    if #dims == 0 then node_error(node, "input of %d dims", x:dim()) end
    return {x:abs():pow(pw):sum(dims, true):pow(1 / pw)}
  end
end

-- ---------------------------------------------------------------------------
-- shapes and data movement
-- ---------------------------------------------------------------------------
do   -- (this section's helpers are its own)

OPS.Constant = function(node, attrs)
  local n = 0
  for _ in pairs(attrs) do n = n + 1 end
  if n ~= 1 then node_error(node, "expected exactly one value attribute") end
  local value
  if attrs.value then
    local a = attrs.value
    value = FL_DTYPE[a.dtype] and a.tensor or {wide = a.dtype, t = a.tensor, const = true}
    -- a small int64 constant is a size vector (shapes, axes, indices)
    if a.dtype == "int64" and a.tensor:dim() <= 1 and a.tensor:numel() <= 64 then
      value = host_of_tensor(a.tensor)
    end
  elseif attrs.value_float then value = fl.full({}, attrs.value_float)
  elseif attrs.value_floats then
    value = #attrs.value_floats > 0 and fl.tensor(attrs.value_floats, {dtype = "float32"}) or fl.zeros({0})
  elseif attrs.value_int then value = host({attrs.value_int}, true)
  elseif attrs.value_ints then value = host(attrs.value_ints, false)
  else
    local k = next(attrs)
    unsupported(node, "attribute '%s'", k)
  end
  node.const = value
  return function()
    if is_tensor(value) then CONST[value] = true end
    return {value}
  end
end

OPS.Shape = function(node, attrs)
  known_attrs(node, attrs, set("start", "end"))
  return function(ins)
    local v = ins[1]
    local s = is_tensor(v) and v.shape or (v.wide and v.t.shape) or (v.scalar and {} or {#v.v})
    local r = #s
    local function clampi(a) if a < 0 then a = a + r end return math.max(0, math.min(r, a)) end
    local a = clampi(attr(attrs, "start", 0))
    local e = attrs["end"] and clampi(attrs["end"]) or r
    local out = {}
    for i = a + 1, e do out[#out + 1] = s[i] end
    return {host(out, false)}
  end
end

OPS.Size = function(node, attrs)
  known_attrs(node, attrs, {})
  return function(ins)
    local x = ins[1]
    local s = is_tensor(x) and x.shape or (x.wide and x.t.shape) or (x.scalar and {} or {#x.v})
    return {host({prod(s, 1, #s)}, true)}
  end
end

OPS.ConstantOfShape = function(node, attrs)
  known_attrs(node, attrs, set("value"))
  local v = attrs.value
  local dtype, value = "float32", 0
  local wide
  if v then
    dtype = FL_DTYPE[v.dtype]
    if not dtype and WIDE[v.dtype] then dtype, wide = "int64", v.dtype end
    if not dtype then unsupported(node, "a value of dtype %s", v.dtype) end
    if v.tensor:numel() ~= 1 then node_error(node, "value must hold one element") end
    value = v.tensor:reshape({}):item()
  end
  return function(ins)
    local shape = ints(node, ins[1], "shape")
    for _, n in ipairs(shape) do
      if type(n) == "number" and n < 0 then node_error(node, "negative size %d", n) end
    end
    if dtype == "bool" then
      return {value and fl.ones(shape, {dtype = "bool"}) or fl.zeros(shape, {dtype = "bool"})}
    end
    if dtype == "int64" and not wide and #shape <= 1 and math.type(shape[1] or 0) == "integer"
        and (shape[1] or 1) <= 64 then
      -- a small int64 vector is sizes, as a small int64 Constant is (the
      -- ones a classic export puts in place of a shape's -1)
      local out = {}
      for i = 1, shape[1] or 1 do out[i] = value end
      return {host(out, #shape == 0)}
    end
    local y = fl.full(shape, value, {dtype = dtype})
    if wide then return {{wide = wide, t = y}} end
    return {y}
  end
end

OPS.Reshape = function(node, attrs, opset)
  known_attrs(node, attrs, set("allowzero", "shape"))
  local allowzero = attr(attrs, "allowzero", 0) ~= 0
  return function(ins)
    local shape = opset < 5 and attrs.shape or ints(node, ins[2], "shape")
    local v = ins[1]
    if v ~= nil and not is_tensor(v) and v.host then
      -- a size vector made 1-D or 0-d (exporters flatten a product of
      -- sizes so): it stays sizes, symbolic ones too, not graph data
      local n, want = #v.v, shape[1]
      if want == 0 and not allowzero and not v.scalar then want = n end   -- 0 copies the dim
      if #shape == 1 and (want == n or want == -1) then
        return {host(v.v, false)}
      elseif #shape == 0 and n == 1 then
        return {host(v.v, true)}
      end
    end
    local x = T(node, v)
    local s, out = x.shape, {}
    for i, n in ipairs(shape) do
      if n == 0 and not allowzero then
        if s[i] == nil then node_error(node, "0 at position %d copies a dim the input lacks", i) end
        out[i] = s[i]
      else
        out[i] = n
      end
    end
    return {x:reshape(out)}
  end
end

OPS.Flatten = function(node, attrs)
  known_attrs(node, attrs, set("axis"))
  return function(ins)
    local x = T(node, ins[1])
    local r = x:dim()
    local a = attr(attrs, "axis", 1)
    if a < -r or a > r then node_error(node, "axis %d out of range for a %d-d input", a, r) end
    if a < 0 then a = a + r end
    local s = x.shape
    return {x:reshape({prod(s, 1, a), prod(s, a + 1, r)})}
  end
end

-- Host vectors pass through the shape ops that only rearrange them.
local function host_unsqueeze(v, axes)
  if v.scalar and #axes == 1 and (axes[1] == 0 or axes[1] == -1) then return host(v.v, false) end
  return nil
end

OPS.Unsqueeze = function(node, attrs, opset)
  known_attrs(node, attrs, set("axes"))
  return function(ins)
    local axes = opset < 13 and attrs.axes or ints(node, ins[2], "axes")
    if not axes then node_error(node, "axes are required") end
    if not is_tensor(ins[1]) and ins[1].host then
      local h = host_unsqueeze(ins[1], axes)
      if h then return {h} end
    end
    local x = T(node, ins[1])
    local r = x:dim() + #axes
    local norm = {}
    for i, a in ipairs(axes) do norm[i] = axis(node, a, r) end
    table.sort(norm)
    for i = 2, #norm do
      if norm[i] == norm[i - 1] then node_error(node, "axis repeated") end
    end
    for _, d in ipairs(norm) do x = x:unsqueeze(d) end
    return {x}
  end
end

OPS.Squeeze = function(node, attrs, opset)
  known_attrs(node, attrs, set("axes"))
  return function(ins)
    local axes = opset < 13 and attrs.axes or (ins[2] ~= nil and ints(node, ins[2], "axes") or nil)
    local v = ins[1]
    if not is_tensor(v) and v.host and not v.scalar and #v.v == 1 and (axes == nil or #axes == 1) then
      return {host(v.v, true)}
    end
    local x = T(node, v)
    if axes == nil or #axes == 0 then
      local s, out = x.shape, {}
      for _, n in ipairs(s) do if n ~= 1 then out[#out + 1] = n end end
      return {x:reshape(out)}
    end
    local norm = {}
    for i, a in ipairs(axes) do
      norm[i] = axis(node, a, x:dim())
      if x.shape[norm[i]] ~= 1 then node_error(node, "dim %d has size %s, not 1", a, tostring(x.shape[norm[i]])) end
    end
    table.sort(norm, function(p, q) return p > q end)
    for _, d in ipairs(norm) do x = x:squeeze(d) end
    return {x}
  end
end

OPS.Transpose = function(node, attrs)
  known_attrs(node, attrs, set("perm"))
  return function(ins)
    local x = T(node, ins[1])
    local r = x:dim()
    local perm = {}
    if attrs.perm then
      if #attrs.perm ~= r then node_error(node, "perm of %d entries for a %d-d input", #attrs.perm, r) end
      for i, p in ipairs(attrs.perm) do perm[i] = axis(node, p, r, "perm entry") end
    else
      for i = 1, r do perm[i] = r + 1 - i end
    end
    if r == 0 then return {x} end
    return {x:permute(perm)}
  end
end

OPS.Concat = function(node, attrs, opset)
  known_attrs(node, attrs, set("axis"))
  if attrs.axis == nil then
    if opset >= 4 then node_error(node, "attribute 'axis' is required") end
    attrs.axis = 1                     -- its default before opset 4
  end
  return function(ins)
    local all_host = true
    for _, v in ipairs(ins) do
      if is_tensor(v) or not v.host or v.scalar then all_host = false end
    end
    if all_host and (attrs.axis == 0 or attrs.axis == -1) then
      local out = {}
      for _, v in ipairs(ins) do for _, n in ipairs(v.v) do out[#out + 1] = n end end
      return {host(out, false)}
    end
    local list = {}
    for _, v in ipairs(ins) do
      local t = T(node, v)
      if t:dim() == 0 then node_error(node, "a 0-d input") end
      list[#list + 1] = t
    end
    local d = axis(node, attrs.axis, list[1]:dim())
    -- empty inputs join as nothing
    local keep = {}
    for _, t in ipairs(list) do if t.shape[d] ~= 0 or #list == 1 then keep[#keep + 1] = t end end
    if #keep == 0 then keep = {list[1]} end
    if #keep == 1 then return {keep[1] + fl.zeros({}, {dtype = keep[1].dtype})} end
    return {fl.cat(keep, d)}
  end
end

OPS.Split = function(node, attrs, opset)
  known_attrs(node, attrs, set("axis", "split", "num_outputs"))
  return function(ins)
    local x = T(node, ins[1])
    local d = axis(node, attr(attrs, "axis", 0), x:dim())
    local n = x.shape[d]
    local split = opset < 13 and attrs.split or (ins[2] ~= nil and ints(node, ins[2], "split") or nil)
    local nout = #node.outputs
    if not split then
      split = {}
      if attrs.num_outputs then
        local chunk = -(-n // attrs.num_outputs)
        local left = n
        for i = 1, attrs.num_outputs do split[i] = math.min(chunk, left); left = left - split[i] end
      else
        if n % nout ~= 0 then node_error(node, "dim of size %d does not split into %d", n, nout) end
        for i = 1, nout do split[i] = n // nout end
      end
    end
    local outs, start = {}, 1
    for i, len in ipairs(split) do
      outs[i] = x:narrow(d, start, len)
      start = start + len
    end
    if start - 1 ~= n then node_error(node, "split sizes sum to %d, the dim is %d", start - 1, n) end
    return outs
  end
end

-- Slice with ONNX's clamping: negative starts/ends count from the end,
-- then both are clamped to [0, dim].
OPS.Slice = function(node, attrs, opset)
  known_attrs(node, attrs, set("starts", "ends", "axes"))
  return function(ins)
    local starts, ends, axes, steps
    if opset < 10 then
      starts, ends, axes = attrs.starts, attrs.ends, attrs.axes
    else
      starts, ends = ints(node, ins[2], "starts"), ints(node, ins[3], "ends")
      axes = ins[4] ~= nil and ints(node, ins[4], "axes") or nil
      steps = ins[5] ~= nil and ints(node, ins[5], "steps") or nil
    end
    local v = ins[1]
    local hv = not is_tensor(v) and v.host and not v.scalar
    local x = hv and nil or T(node, v)
    local r = hv and 1 or x:dim()
    local shape = hv and {#v.v} or x.shape
    local out_host = hv and {table.unpack(v.v)} or nil
    for i = 1, #starts do
      local d = axes and axis(node, axes[i], r) or i
      local n = shape[d]
      local st = steps and steps[i] or 1
      if st == 0 then node_error(node, "a step of 0") end
      -- a step longer than the dim takes one element whatever its size;
      -- clamped, -INT64_MIN never overflows below
      if type(n) == "number" then st = math.max(-(n + 1), math.min(n + 1, st)) end
      -- ONNX's clamping: [0, n] going forward, [-1, n-1] going back
      local lo, hi = st > 0 and 0 or -1, st > 0 and n or n - 1
      local function clampi(a)
        if a < 0 then a = a + n end
        return math.max(lo, math.min(hi, a))
      end
      local s, e = clampi(starts[i]), clampi(ends[i])
      local count = st > 0 and math.max(0, (e - s + st - 1) // st) or math.max(0, (s - e - st - 1) // -st)
      if hv then
        local o = {}
        for k = 0, count - 1 do o[#o + 1] = out_host[s + k * st + 1] end
        out_host = o
      elseif count == 0 then
        x = x:narrow(d, 1, 0)
      elseif st == 1 then
        x = x:narrow(d, s + 1, count)
      else
        -- x:slice is 1-based with an inclusive stop
        x = x:slice(d, s + 1, s + (count - 1) * st + 1, st)
      end
    end
    if hv then return {host(out_host, false)} end
    return {x}
  end
end

-- Pad mode 'wrap' (opset 19), NumPy's: element j of a dim of size n padded
-- by b before is x[(j - b) mod n], so a pad may pass n (the data repeats).
-- NumPy (the reference) takes no negative pads in this mode.
local function pad_wrap(node, x, pads)
  local r = x:dim()
  for d = 1, r do
    local b, e, n = pads[d], pads[d + r], x.shape[d]
    if b < 0 or e < 0 then unsupported(node, "negative pads in mode 'wrap'") end
    if b + e > 0 then
      if type(n) ~= "number" then unsupported(node, "mode 'wrap' over a symbolic size") end
      if n == 0 then node_error(node, "mode 'wrap' pads dim %d of size 0", d) end
      local idx = {}
      for j = 0, b + n + e - 1 do idx[j + 1] = (j - b) % n end
      x = fl.gather(x, d, fl.tensor(idx, {dtype = "int64"}))
    end
  end
  return x
end

-- Pad: pads {begin_1..begin_r, end_1..end_r} (negative crops), as
-- fl.pad takes them; from opset 11 pads and the value are inputs, from 18
-- the axes they apply to too.
OPS.Pad = function(node, attrs, opset)
  known_attrs(node, attrs, set("mode", "pads", "value"))
  local mode = attr(attrs, "mode", "constant")
  if mode == "wrap" and opset < 19 then node_error(node, "mode 'wrap' (from opset 19)") end
  if mode ~= "constant" and mode ~= "reflect" and mode ~= "edge" and mode ~= "wrap" then
    unsupported(node, "mode '%s'", mode)
  end
  return function(ins)
    local x = T(node, ins[1])
    local r = x:dim()
    local pads, value
    if opset < 11 then
      pads, value = attrs.pads, attr(attrs, "value", 0.0)
      if not pads then node_error(node, "attribute 'pads' is required") end
    else
      pads = ints(node, ins[2], "pads")
      value = ins[3] ~= nil and number(node, ins[3], "constant_value") or 0
    end
    if ins[4] ~= nil then
      local axes, full = ints(node, ins[4], "axes"), {}
      if #pads ~= 2 * #axes then node_error(node, "%d pads for %d axes", #pads, #axes) end
      for k = 1, 2 * r do full[k] = 0 end
      for i, a in ipairs(axes) do
        local d = axis(node, a, r)
        full[d], full[d + r] = pads[i], pads[i + #axes]
      end
      pads = full
    end
    if #pads ~= 2 * r then node_error(node, "%d pads for a %d-d input", #pads, r) end
    if mode == "wrap" then return {pad_wrap(node, x, pads)} end
    if x.dtype == "int64" then value = math.tointeger(value) or unsupported(node, "a fractional value for int64") end
    return {fl.pad(x, pads, mode == "constant" and {value = value} or {mode = mode})}
  end
end

-- bidirectional broadcast of two shapes
local function broadcast(node, a, b)
  local r = math.max(#a, #b)
  local out = {}
  for i = 1, r do
    local x, y = a[#a - r + i] or 1, b[#b - r + i] or 1
    if x == 1 then out[i] = y
    elseif y == 1 or x == y then out[i] = x
    else node_error(node, "shapes do not broadcast (%s vs %s)", tostring(x), tostring(y)) end
  end
  return out
end

OPS.Expand = function(node, attrs)
  known_attrs(node, attrs, {})
  return function(ins)
    local x = T(node, ins[1])
    local shape = ints(node, ins[2], "shape")
    local out = broadcast(node, x.shape, shape)
    return {x:expand(out):contiguous()}
  end
end

OPS.Tile = function(node, attrs)
  known_attrs(node, attrs, {})
  return function(ins)
    local x = T(node, ins[1])
    local reps = ints(node, ins[2], "repeats")
    local r = x:dim()
    if #reps ~= r then node_error(node, "%d repeats for a %d-d input", #reps, r) end
    local s = x.shape
    local mid, big, final = {}, {}, {}
    for i = 1, r do
      mid[2 * i - 1], mid[2 * i] = 1, s[i]
      big[2 * i - 1], big[2 * i] = reps[i], s[i]
      final[i] = reps[i] * s[i]
    end
    return {x:reshape(mid):expand(big):contiguous():reshape(final)}
  end
end

-- Gather: along axis, through fl.embedding (rows of a 2-D table) with the
-- gathered axis moved to the front.  Negative indices count from the end.
OPS.Gather = function(node, attrs)
  known_attrs(node, attrs, set("axis"))
  return function(ins)
    local data, idx = ins[1], ins[2]
    local a = attr(attrs, "axis", 0)
    if not is_tensor(data) and data.host and not data.scalar and (a == 0 or a == -1) then
      local iv, iscalar = ints(node, idx, "indices")
      local out = {}
      for i, k in ipairs(iv) do
        if k < 0 then k = k + #data.v end
        if k < 0 or k >= #data.v then node_error(node, "index %d out of range", iv[i]) end
        out[i] = data.v[k + 1]
      end
      return {host(out, iscalar)}
    end
    local x = T(node, data)
    local r = x:dim()
    local d = axis(node, a, r)
    local n = x.shape[d]
    local it
    if is_tensor(idx) then
      it = idx
    else
      local iv, iscalar = ints(node, idx, "indices")
      -- one constant index: a view of that slice (a select), not a gather
      -- (ViT's query, key and value picked from one [3, ...] tensor)
      if iscalar and math.type(n) == "integer" then
        local k = iv[1] < 0 and iv[1] + n or iv[1]
        if k < 0 or k >= n then node_error(node, "index %d out of range for a dim of %d", iv[1], n) end
        return {x:narrow(d, k + 1, 1):squeeze(d)}
      end
      it = iscalar and fl.full({}, iv[1], {dtype = "int64"}) or (#iv > 0 and fl.tensor(iv, {dtype = "int64"}) or fl.zeros({0}, {dtype = "int64"}))
      if not iscalar and not is_tensor(idx) and idx.wide then it = idx.t end
    end
    if it.dtype ~= "int64" then node_error(node, "indices of dtype %s", it.dtype) end
    it = fl.where(it:lt(fl.zeros({}, {dtype = "int64"})), it + size_value(n), it)
    -- move axis d to the front, flatten the rest
    local perm = {d}
    for k = 1, r do if k ~= d then perm[#perm + 1] = k end end
    local xt = r > 1 and x:permute(perm):contiguous() or x
    local rest = {}
    for k = 2, r do rest[#rest + 1] = xt.shape[k] end
    local table2d = xt:reshape({n, prod(rest, 1, #rest)})
    local g = fl.embedding(it, table2d)            -- idx.shape .. [prod(rest)]
    local gs = {}
    for _, k in ipairs(it.shape) do gs[#gs + 1] = k end
    for _, k in ipairs(rest) do gs[#gs + 1] = k end
    g = g:reshape(gs)
    -- back: data.shape[:d] + idx.shape + data.shape[d+1:]
    local q = it:dim()
    local back = {}
    for k = 1, d - 1 do back[#back + 1] = q + k end
    for k = 1, q do back[#back + 1] = k end
    for k = d, r - 1 do back[#back + 1] = q + k end
    if #back > 1 then g = g:permute(back) end
    return {g}
  end
end

OPS.Range = function(node, attrs)
  -- stash_type (opset 27): the precision the values are computed in; they
  -- are computed in double here and rounded once, at least as exact
  known_attrs(node, attrs, set("stash_type"))
  return function(ins)
    local dt = dtype_of(ins[1])
    if FLOAT[dt] then
      -- start + i * delta, i < ceil((limit - start) / delta), as NumPy's
      -- arange counts (in double, rounded once to the type)
      local s, l, d = number(node, ins[1], "start"), number(node, ins[2], "limit"), number(node, ins[3], "delta")
      if d == 0 then node_error(node, "delta is 0") end
      local n = math.max(0, math.ceil((l - s) / d))
      if n > 1 << 24 then node_error(node, "a float Range of %.0f elements (2^24 at most: float32 counts exactly to there)", n) end
      local out = {}
      for i = 0, n - 1 do out[#out + 1] = s + i * d end
      if n == 0 then return {fl.zeros({0}, {dtype = dt})} end
      return {fl.tensor(out, {dtype = "float32"}):to(dt)}
    end
    -- int16 and int32 (held as int64) count as int64 does: every element
    -- lies between start and limit, inside the type
    if dt ~= "int64" and dt ~= "int32" and dt ~= "int16" then unsupported(node, "Range of dtype %s", dt) end
    for i = 2, 3 do
      if dtype_of(ins[i]) ~= dt then node_error(node, "inputs of dtypes %s and %s", dt, dtype_of(ins[i])) end
    end
    local s, l, d = ints(node, ins[1], "start")[1], ints(node, ins[2], "limit")[1], ints(node, ins[3], "delta")[1]
    if dt ~= "int64" then
      if d == 0 then node_error(node, "delta is 0") end
      local n = math.max(0, -(-(l - s) // d))
      check_count(node, n, "Range")
      local y = n == 0 and fl.zeros({0}, {dtype = "int64"}) or fl.arange(s, s + n * d, d, {dtype = "int64"})
      return {{wide = dt, t = y}}
    end
    if type(s) ~= "number" or type(l) ~= "number" or type(d) ~= "number" then
      -- a limit from an input's shape under capture (the exporters' Shape ->
      -- Gather -> Range): a symbolic arange, one compile for every size
      if type(s) ~= "number" or d ~= 1 then
        unsupported(node, "a Range over a symbolic size with a start or step not constant 0..n, 1")
      end
      local r = fl.arange(l - s)
      return {s ~= 0 and r + fl.full({}, s, {dtype = "int64"}) or r}
    end
    if d == 0 then node_error(node, "delta is 0") end
    local out = {}
    -- l - s may pass int64 (INT64_MIN to INT64_MAX): count in double then,
    -- the elements themselves all lie between s and l
    local n
    if (l >= s) == (l - s >= 0) then n = math.max(0, -(-(l - s) // d))
    else n = math.max(0, math.ceil(((l + 0.0) - (s + 0.0)) / d)) end
    check_count(node, n, "Range")
    n = math.tointeger(n)
    -- a long range is data (an index vector), not a size vector: a tensor,
    -- not a Lua table of millions of numbers
    if n > 4096 then return {fl.arange(s, l, d, {dtype = "int64"})} end
    for i = 0, n - 1 do out[#out + 1] = s + i * d end
    return {host(out, false)}
  end
end

end
-- ---------------------------------------------------------------------------
-- composed from the above: losses, index ops, rounding, rearrangements
-- ---------------------------------------------------------------------------

-- arange(n) laid along dim d (1-based) of a rank-r shape: [1, .., n, .., 1]
local function iota(n, d, r)
  local s = {}
  for k = 1, r do s[k] = 1 end
  s[d] = n
  return fl.arange(n):reshape(s)
end

local i64 = size_value


-- loss[n, d..] = -x[n, target, d..] * weight[target], 0 where target is
-- ignore_index; the class picked by a one-hot mask over dim 2 (a sum of
-- one value and zeros: exact).
-- Eagerly, an index outside [lo, hi] (other than ign) is an error, as in
-- onnxruntime, not a row of zeros; a compiled kernel cannot stop, and
-- gives the zeros (doc/API.md).
local function check_indices(node, idx, lo, hi, what, ign)
  if fl._tracing() or idx:numel() == 0 then return end
  local bad = idx:lt(i64(lo)):to("int64") + idx:gt(i64(hi)):to("int64")
  if ign then bad = bad * idx:ne(i64(ign)):to("int64") end
  if bad:sum():item() > 0 then
    node_error(node, "%s out of range [%d, %d]", what, lo, hi)
  end
end

local function nll(node, x, tgt, w, red, ign)
  if tgt.dtype ~= "int64" then node_error(node, "target must be int64, got %s", tgt.dtype) end
  local r = x:dim()
  if r < 2 then node_error(node, "input of %d dims (expected [N, C, ...])", r) end
  local C = x.shape[2]
  if type(C) == "number" then check_indices(node, tgt, 0, C - 1, "a target", ign) end
  local mask = iota(C, 2, r):eq(tgt:unsqueeze(2))
  local zero = scalar(x, 0)
  local loss = -fl.where(mask, x, zero):sum(2)
  local wt
  if w then wt = fl.where(mask, channel_view(w, r), zero):sum(2) end
  if ign then
    local valid = tgt:ne(i64(ign))
    wt = wt and fl.where(valid, wt, zero) or valid:to(x.dtype)
  end
  if wt then loss = loss * wt end
  if red == "none" then return loss end
  if red == "sum" then return loss:sum() end
  if wt then return loss:sum() / wt:sum() end
  return loss:mean()
end

local function loss_attrs(node, attrs)
  known_attrs(node, attrs, set("reduction", "ignore_index"))
  local red = attr(attrs, "reduction", "mean")
  if red ~= "none" and red ~= "sum" and red ~= "mean" then node_error(node, "reduction '%s'", red) end
  return red, attrs.ignore_index
end

OPS.NegativeLogLikelihoodLoss = function(node, attrs)
  local red, ign = loss_attrs(node, attrs)
  return function(ins)
    local x = T(node, ins[1], "input")
    need_float(node, x)
    return {nll(node, x, T(node, ins[2], "target"), ins[3] ~= nil and T(node, ins[3], "weight") or nil, red, ign)}
  end
end

OPS.SoftmaxCrossEntropyLoss = function(node, attrs)
  local red, ign = loss_attrs(node, attrs)
  return function(ins)
    local x = T(node, ins[1], "scores")
    need_float(node, x)
    if x:dim() < 2 then node_error(node, "scores of %d dims (expected [N, C, ...])", x:dim()) end
    local lp = x:log_softmax(2)
    return {nll(node, lp, T(node, ins[2], "labels"), ins[3] ~= nil and T(node, ins[3], "weights") or nil, red, ign), lp}
  end
end

-- out[.., i, ..] = data[.., idx[.., i, ..], ..] along axis: a one-hot
-- mask over a new dim after the axis, summed away.
OPS.GatherElements = function(node, attrs)
  known_attrs(node, attrs, set("axis"))
  return function(ins)
    local iv = ins[2]
    if iv ~= nil and not is_tensor(iv) and iv.wide then iv = iv.t end   -- narrow indices are exact
    local x, idx = T(node, ins[1], "data"), T(node, iv, "indices")
    if idx.dtype ~= "int64" then node_error(node, "indices of dtype %s", idx.dtype) end
    local r = x:dim()
    if idx:dim() ~= r then node_error(node, "indices of rank %d for data of rank %d", idx:dim(), r) end
    local d = axis(node, attr(attrs, "axis", 0), r)
    local n = x.shape[d]
    for k = 1, r do
      if k ~= d and idx.shape[k] ~= x.shape[k] then
        if idx.shape[k] > x.shape[k] then node_error(node, "indices dim %d larger than data's", k) end
        x = x:narrow(k, 1, idx.shape[k])
      end
    end
    if type(n) == "number" then check_indices(node, idx, -n, n - 1, "an index") end
    local it = fl.where(idx:lt(i64(0)), idx + i64(n), idx)
    local dt = x.dtype
    if dt == "bool" then x = x:to("int64") end
    local mask = it:unsqueeze(d + 1):eq(iota(n, d + 1, r + 1))
    local out = fl.where(mask, x:unsqueeze(d), fl.zeros({}, {dtype = x.dtype})):sum(d + 1)
    if dt == "bool" then out = out:to("bool") end
    return {out}
  end
end

OPS.Trilu = function(node, attrs)
  known_attrs(node, attrs, set("upper"))
  local upper = attr(attrs, "upper", 1) ~= 0
  return function(ins)
    local x = T(node, ins[1])
    local k = ins[2] ~= nil and number(node, ins[2], "k") or 0
    local r = x:dim()
    if r < 2 then node_error(node, "input of %d dims", r) end
    local diff = iota(x.shape[r], r, r) - iota(x.shape[r - 1], r - 1, r)   -- col - row
    local keep = upper and diff:ge(i64(k)) or diff:le(i64(k))
    return {fl.where(keep, x, fl.zeros({}, {dtype = x.dtype}))}
  end
end

OPS.Hardmax = function(node, attrs, opset)
  known_attrs(node, attrs, set("axis"))
  local ax = attr(attrs, "axis", opset >= 13 and -1 or 1)
  return function(ins)
    local x = T(node, ins[1])
    need_float(node, x)
    local r = x:dim()
    local d = axis(node, ax, r)
    local s = x.shape
    local y = x
    if opset < 13 then y = x:reshape({prod(s, 1, d - 1), prod(s, d, r)}); d = 2 end
    local hot = iota(y.shape[d], d, y:dim()):eq(y:argmax(d, true)):to(x.dtype)
    return {hot:reshape(s)}
  end
end

-- select_last_index=1: the largest position holding the extreme (NaN
-- counts as the extreme, as NumPy's argmax of the reversed array has it).
local function arg_last(x, d, keep, method)
  local m = x[method](x, d, true)
  local hit = x:eq(m):to("int64") + (x:ne(x):to("int64") * m:ne(m):to("int64"))
  local pos = fl.where(hit:gt(i64(0)), iota(x.shape[d], d, x:dim()), i64(-1))
  return pos:amax(d, keep)
end

local function arg_reduce2(which)
  local base = arg_reduce(which == "amin")
  return function(node, attrs, opset)
    if attr(attrs, "select_last_index", 0) == 0 then return base(node, attrs, opset) end
    known_attrs(node, attrs, set("axis", "keepdims", "select_last_index"))
    local keep = attr(attrs, "keepdims", 1) ~= 0
    return function(ins)
      local x = T(node, ins[1])
      if x.dtype == "bool" then unsupported(node, "arg reduction of bools") end
      return {arg_last(x, axis(node, attr(attrs, "axis", 0), x:dim()), keep, which)}
    end
  end
end
OPS.ArgMax = arg_reduce2("amax")
OPS.ArgMin = arg_reduce2("amin")

-- floor/ceil/round: below 2^23 through a truncation to int64, above it
-- (and NaN, infinities) every float32 is already whole.  Half-precision
-- inputs go through float32, where they are exact.
local function rounding(fn)
  return unary(function(x)
    local dt = x.dtype
    local xf = dt == "float32" and x or x:to("float32")
    local small = xf:abs():lt(fl.full({}, 8388608.0))
    local t = xf:to("int64"):to("float32")
    local y = fl.where(small, fn(xf, t), xf)
    return dt == "float32" and y or y:to(dt)
  end)
end
local function floor_of(x, t) return t - t:gt(x):to("float32") end
OPS.Floor = rounding(floor_of)

-- GridSample (opsets 16 to 22; 2-d and 3-d) as ONNX's reference: each
-- output point's normalized position denormalized per dim (align_corners:
-- the corner pixels' centres at -1 and 1), out-of-range positions clamped
-- (border) or reflected (reflection), then the nearest pixel (rounded half
-- to even, as PyTorch) or the 2^r corners around it weighted (linear); a
-- pixel outside is 0 (zeros), the edge (border) or reflected again.  The
-- pixels are gathered from the input flattened to [N x pixels, C].  Cubic:
-- the 4^r pixels at floor - 1 .. floor + 2 per dim, weighted by Keys'
-- cubic convolution (A = -0.75); there border clamps only a position past
-- the borders, as the reference does (linear cannot tell the difference).
OPS.GridSample = function(node, attrs, opset)
  known_attrs(node, attrs, set("align_corners", "mode", "padding_mode"))
  local align = attr(attrs, "align_corners", 0) ~= 0
  local mode = attr(attrs, "mode", opset < 20 and "bilinear" or "linear")
  if mode == "bilinear" then mode = "linear" elseif mode == "bicubic" then mode = "cubic" end
  if mode ~= "linear" and mode ~= "nearest" and mode ~= "cubic" then node_error(node, "mode '%s'", mode) end
  local pad = attr(attrs, "padding_mode", "zeros")
  if pad ~= "zeros" and pad ~= "border" and pad ~= "reflection" then node_error(node, "padding_mode '%s'", pad) end
  local function floor(x) return floor_of(x, x:to("int64"):to("float32")) end
  local function reflect(v, lo, hi)                   -- lo, hi numbers; v float32
    local rng = hi - lo
    if rng <= 0 then return fl.full(v.shape, lo) end
    local function fold(dx, near, far)                -- dx >= 0 past the near edge (numbers)
      local sgn = fl.full({}, far > near and 1.0 or -1.0)
      local n = floor(dx / fl.full({}, rng))
      local r = dx - n * fl.full({}, rng)
      local even = fl.remainder(n, fl.full({}, 2.0)):eq(fl.full({}, 0.0))
      return fl.where(even, fl.full({}, near) + r * sgn, fl.full({}, far) - r * sgn)
    end
    local below = v:lt(fl.full({}, lo))
    local above = v:gt(fl.full({}, hi))
    local b = fold(fl.full({}, lo) - v, lo, hi)
    local a = fold(v - fl.full({}, hi), hi, lo)
    return fl.where(below, b, fl.where(above, a, v))
  end
  return function(ins)
    local x, grid = T(node, ins[1], "X"), T(node, ins[2], "grid")
    need_float(node, x)
    local r = x:dim() - 2
    if r ~= 2 and r ~= 3 then unsupported(node, "a %d-d sample (2-d and 3-d only)", r) end
    if grid:dim() ~= r + 2 or grid.shape[r + 2] ~= r then node_error(node, "grid of shape [%s]", table.concat(grid.shape, ",")) end
    local N, C = x.shape[1], x.shape[2]
    local dims, npix = {}, 1
    for i = 1, r do
      dims[i] = x.shape[2 + i]
      if type(dims[i]) ~= "number" then unsupported(node, "a dynamic input size") end
      npix = npix * dims[i]
    end
    local g = grid:to("float32")
    local outs = {}
    for i = 2, r + 1 do outs[#outs + 1] = grid.shape[i] end
    -- per input dim i (the grid's last axis runs x, y, z: reversed)
    local coord = {}
    for i = 1, r do
      local d = dims[i]
      local nrm = g:narrow(r + 2, r - i + 1, 1):squeeze(r + 2)
      local c = align and (nrm + fl.full({}, 1.0)) * fl.full({}, (d - 1) / 2)
        or ((nrm + fl.full({}, 1.0)) * fl.full({}, d) - fl.full({}, 1.0)) / fl.full({}, 2.0)
      if mode == "nearest" then                           -- round half to even
        local f = floor(c)
        local diff = c - f
        local odd = fl.remainder(f, fl.full({}, 2.0)):ne(fl.full({}, 0.0))
        local up = diff:gt(fl.full({}, 0.5)):to("int64") + diff:eq(fl.full({}, 0.5)):to("int64") * odd:to("int64")
        c = f + up:gt(i64(0)):to("float32")
      end
      local lo, hi = align and 0 or -0.5, align and d - 1 or d - 0.5
      if pad == "border" and mode == "cubic" then
        local cl = c:clamp(0, d - 1)
        c = fl.where(c:lt(fl.full({}, lo)), cl, fl.where(c:gt(fl.full({}, hi)), cl, c))
      elseif pad == "border" then c = c:clamp(0, d - 1)
      elseif pad == "reflection" then c = reflect(c, lo, hi) end
      coord[i] = {c = c, lo = lo, hi = hi}
    end
    local flat = x:reshape({N, C, npix}):permute({1, 3, 2}):reshape({N * npix, C})
    local nbase = fl.arange(N):reshape(#outs == 2 and {N, 1, 1} or {N, 1, 1, 1}) * i64(npix)
    -- the pixel at integer positions idx[i] (float32 tensors), weight w
    local function pixel(idx)
      local lin, ok = nil, nil
      for i = 1, r do
        local d, v = dims[i], idx[i]
        if pad == "reflection" then v = floor(reflect(v, coord[i].lo, coord[i].hi)) end
        local inside = v:ge(fl.full({}, 0.0)) * v:le(fl.full({}, d - 1))
        ok = ok and ok * inside or inside
        local vi = v:clamp(0, d - 1):to("int64")
        lin = lin and lin * i64(d) + vi or vi
      end
      local rows = fl.embedding((nbase + lin):reshape({-1}), flat)   -- [N x points, C]
      local s = {N}
      for _, o in ipairs(outs) do s[#s + 1] = o end
      s[#s + 1] = C
      local val = rows:reshape(s)
      if pad == "zeros" then val = val * ok:to(x.dtype):unsqueeze(r + 2) end
      return val
    end
    local y
    if mode == "nearest" then
      local idx = {}
      for i = 1, r do idx[i] = coord[i].c end
      y = pixel(idx)
    elseif mode == "cubic" then
      local A = -0.75
      local f, w = {}, {}
      local function k(v) return fl.full({}, v) end
      for i = 1, r do
        f[i] = floor(coord[i].c)
        local t = coord[i].c - f[i]
        local t1, u, u1 = t + k(1), k(1) - t, k(2) - t
        w[i] = {((t1 * k(A) - k(5 * A)) * t1 + k(8 * A)) * t1 - k(4 * A),
                ((t * k(A + 2) - k(A + 3)) * t) * t + k(1),
                ((u * k(A + 2) - k(A + 3)) * u) * u + k(1),
                ((u1 * k(A) - k(5 * A)) * u1 + k(8 * A)) * u1 - k(4 * A)}
      end
      for tap = 0, (1 << (2 * r)) - 1 do
        local idx, wt = {}, nil
        for i = 1, r do
          local o = (tap >> (2 * (r - i))) & 3                -- 0..3: floor - 1 .. floor + 2
          idx[i] = f[i] + k(o - 1)
          wt = wt and wt * w[i][o + 1] or w[i][o + 1]
        end
        local v = pixel(idx) * wt:to(x.dtype):unsqueeze(r + 2)
        y = y and y + v or v
      end
    else
      local f, w = {}, {}
      for i = 1, r do
        f[i] = floor(coord[i].c)
        w[i] = coord[i].c - f[i]
      end
      for corner = 0, (1 << r) - 1 do
        local idx, wt = {}, nil
        for i = 1, r do
          local bit = (corner >> (r - i)) & 1
          idx[i] = bit == 1 and f[i] + fl.full({}, 1.0) or f[i]
          local wi = bit == 1 and w[i] or fl.full({}, 1.0) - w[i]
          wt = wt and wt * wi or wi
        end
        local v = pixel(idx) * wt:to(x.dtype):unsqueeze(r + 2)
        y = y and y + v or v
      end
    end
    -- [N, out..., C] -> [N, C, out...]
    local perm = {1, r + 2}
    for i = 2, r + 1 do perm[#perm + 1] = i end
    return {y:permute(perm):contiguous()}
  end
end
-- RoiAlign (opsets 10 to 22) as ONNX's reference computes it: each roi's
-- bins split into a grid of sample points (sampling_ratio per side, or
-- ceil(roi size / bins) when 0), each point bilinear over its four pixels
-- (a point past -1 or the far edge weighs nothing; one past the last pixel
-- takes it), then per bin the average over the grid, or in max mode the
-- largest of the points' four weighted pixels (the reference's rule, not
-- the max of interpolated values).  Every roi's grid is as large as the
-- largest one, the points past its own masked off; the pixels are
-- gathered from X flattened to [N x H x W, C].  An adaptive grid's size
-- comes from the rois' values: a graph break under fl.compile.
OPS.RoiAlign = function(node, attrs, opset)
  known_attrs(node, attrs, set("coordinate_transformation_mode", "mode", "output_height", "output_width",
                              "sampling_ratio", "spatial_scale"))
  local ctm = attr(attrs, "coordinate_transformation_mode", opset < 16 and "output_half_pixel" or "half_pixel")
  if ctm ~= "half_pixel" and ctm ~= "output_half_pixel" then node_error(node, "coordinate_transformation_mode '%s'", ctm) end
  local mode = attr(attrs, "mode", "avg")
  if mode ~= "avg" and mode ~= "max" then node_error(node, "mode '%s'", mode) end
  local OH, OW = attr(attrs, "output_height", 1), attr(attrs, "output_width", 1)
  local sr, scale = attr(attrs, "sampling_ratio", 0), attr(attrs, "spatial_scale", 1.0)
  if OH < 1 or OW < 1 or sr < 0 then node_error(node, "output %dx%d, sampling_ratio %d", OH, OW, sr) end
  local half = ctm == "half_pixel"
  local function k(v) return fl.full({}, v) end
  local function floor(x) return floor_of(x, x:to("int64"):to("float32")) end
  return function(ins)
    local x, rois, bi = T(node, ins[1], "X"), T(node, ins[2], "rois"), T(node, ins[3], "batch_indices")
    need_float(node, x)
    if x:dim() ~= 4 then node_error(node, "X of %d dims (expected [N, C, H, W])", x:dim()) end
    if rois:dim() ~= 2 or rois.shape[2] ~= 4 then node_error(node, "rois of shape [%s] (expected [R, 4])", table.concat(rois.shape, ",")) end
    if bi.dtype ~= "int64" or bi:dim() ~= 1 or bi.shape[1] ~= rois.shape[1] then
      node_error(node, "batch_indices must be int64 [%s]", tostring(rois.shape[1]))
    end
    local N, C, H, W = table.unpack(x.shape)
    for _, n in ipairs(x.shape) do
      if type(n) ~= "number" then unsupported(node, "a dynamic input size") end
    end
    local R = rois.shape[1]
    if type(R) ~= "number" then unsupported(node, "a dynamic number of rois") end
    if not fl._tracing() and R > 0 then
      local bad = bi:lt(i64(0)):to("int64") + bi:ge(i64(N)):to("int64")
      if bad:sum():item() > 0 then node_error(node, "a batch index out of range [0, %d]", N - 1) end
    end
    local rf = rois:to("float32") * k(scale) - k(half and 0.5 or 0.0)
    local function col(j) return rf:narrow(2, j, 1) end                 -- [R, 1]
    local sw, sh = col(1), col(2)
    local rw, rh = col(3) - sw, col(4) - sh
    if not half then rw, rh = fl.maximum(rw, k(1.0)), fl.maximum(rh, k(1.0)) end
    local bh, bw = rh / k(OH), rw / k(OW)
    -- the grid per roi: a tensor, and the largest (a number)
    local gh, gw, GH, GW
    if sr > 0 then
      gh, gw, GH, GW = fl.full({R, 1}, sr + 0.0), fl.full({R, 1}, sr + 0.0), sr, sr
    else
      local function ceil(v) local f = floor(v) return f + f:lt(v):to("float32") end
      gh, gw = ceil(rh / k(OH)), ceil(rw / k(OW))
      local ok, l = pcall(function() return fl.cat({gh:amax():reshape({1}), gw:amax():reshape({1})}, 1):tolist() end)
      if not ok then
        if not fl._tracing() then error(l, 0) end
        unsupported(node, "sampling_ratio 0: grid sizes computed from graph inputs under capture (a data-dependent shape)")
      end
      GH, GW = math.max(math.tointeger(l[1]) or 0, 1), math.max(math.tointeger(l[2]) or 0, 1)
      check_count(node, R * OH * GH * OW * GW * C, "RoiAlign's samples")
    end
    -- sample coordinates along one side: [R, bins, grid]; their pixels
    -- and weights, zero for a point past -1 or the far edge
    local function side(start, bin, g, bins, G, n)
      local b = fl.arange(bins):to("float32"):reshape({1, bins, 1})
      local i = fl.arange(G):to("float32"):reshape({1, 1, G})
      local st, bn, gg = start:reshape({-1, 1, 1}), bin:reshape({-1, 1, 1}), g:reshape({-1, 1, 1})
      local v = st + b * bn + (i + k(0.5)) * bn / gg
      local valid = v:ge(k(-1.0)):to("float32") * v:le(k(n)):to("float32")
      v = fl.maximum(v, k(0.0))
      local lo = floor(v)
      local last = lo:ge(k(n - 1))
      lo = fl.where(last, k(n - 1), lo)
      v = fl.where(last, lo, v)
      local hi = fl.where(last, lo, lo + k(1.0))
      local l = v - lo
      local inside = i:lt(gg)                                           -- within this roi's grid
      return {lo:to("int64"), hi:to("int64")}, {(k(1.0) - l) * valid, l * valid}, inside
    end
    local yi, yw, yin = side(sh, bh, gh, OH, GH, H)                       -- [R, OH, GH]
    local xi, xw, xin = side(sw, bw, gw, OW, GW, W)                       -- [R, OW, GW]
    local flat = x:permute({1, 3, 4, 2}):reshape({N * H * W, C})
    local base = (bi * i64(H * W)):reshape({R, 1, 1, 1, 1})
    local acc
    for a = 1, 2 do
      for b = 1, 2 do
        local idx = base + yi[a]:reshape({R, OH, GH, 1, 1}) * i64(W) + xi[b]:reshape({R, 1, 1, OW, GW})
        local v = fl.embedding(idx:reshape({-1}), flat):reshape({R, OH, GH, OW, GW, C})
        local w = (yw[a]:reshape({R, OH, GH, 1, 1}) * xw[b]:reshape({R, 1, 1, OW, GW})):to(x.dtype)
        local t = v * w:reshape({R, OH, GH, OW, GW, 1})
        if mode == "avg" then acc = acc and acc + t or t
        else acc = acc and fl.maximum(acc, t) or t end
      end
    end
    local inside = yin:reshape({R, 1, GH, 1, 1}):to("int64") * xin:reshape({R, 1, 1, 1, GW}):to("int64")
    inside = inside:gt(i64(0)):unsqueeze(6)                               -- [R, 1, GH, 1, GW, 1]
    local y
    if mode == "avg" then
      local count = fl.maximum(gh * gw, k(1.0)):to(x.dtype)
      y = fl.where(inside, acc, fl.zeros({}, {dtype = x.dtype})):sum({3, 5}) / count:reshape({-1, 1, 1, 1})
    else
      -- no point at all (an empty grid): 0, as the reference starts from
      local m = fl.where(inside, acc, fl.full({}, -math.huge, {dtype = x.dtype})):amax({3, 5})
      local any = inside:to("int64"):sum({3, 5}):gt(i64(0))
      y = fl.where(any, m, fl.zeros({}, {dtype = x.dtype}))
    end
    return {y:permute({1, 4, 2, 3}):contiguous()}                         -- [R, C, OH, OW]
  end
end

-- DeformConv (opsets 19 and 22; 2-d): each output position's kernel taps
-- moved by their offsets (per offset group) and sampled bilinearly, a
-- pixel outside the input 0 (the reference samples with GridSample,
-- align_corners and zero padding: the same), times the mask; then the
-- convolution of those samples, a grouped 1x1 fl.conv2d over the taps as
-- channels.  The samples are gathered from X flattened to [N x offset
-- groups x H x W, channels per offset group].
OPS.DeformConv = function(node, attrs)
  known_attrs(node, attrs, set("dilations", "group", "kernel_shape", "offset_group", "pads", "strides"))
  local G, OG = attr(attrs, "group", 1), attr(attrs, "offset_group", 1)
  local function k(v) return fl.full({}, v) end
  local function floor(x) return floor_of(x, x:to("int64"):to("float32")) end
  return function(ins)
    local x, w, off = T(node, ins[1], "X"), T(node, ins[2], "W"), T(node, ins[3], "offset")
    local b = ins[4] ~= nil and T(node, ins[4], "B") or nil
    local mask = ins[5] ~= nil and T(node, ins[5], "mask") or nil
    need_float(node, x)
    if x:dim() ~= 4 then unsupported(node, "a %d-d deformable convolution (2-d only)", x:dim() - 2) end
    for _, v in ipairs({x, w, off}) do
      for _, n in ipairs(v.shape) do
        if type(n) ~= "number" then unsupported(node, "a dynamic size") end
      end
    end
    local N, C, H, W = table.unpack(x.shape)
    local OC, Cpg, KH, KW = table.unpack(w.shape)
    if attrs.kernel_shape and (attrs.kernel_shape[1] ~= KH or attrs.kernel_shape[2] ~= KW) then
      node_error(node, "kernel_shape %s does not match the weight", table.concat(attrs.kernel_shape, ","))
    end
    if C ~= Cpg * G or OC % G ~= 0 then node_error(node, "%d input channels, a weight [%d, %d, ...] in %d groups", C, OC, Cpg, G) end
    if C % OG ~= 0 then node_error(node, "%d input channels in %d offset groups", C, OG) end
    local K = KH * KW
    local s, d, pads = attr(attrs, "strides", {}), attr(attrs, "dilations", {}), attr(attrs, "pads", {})
    local sh, sw, dh, dw = s[1] or 1, s[2] or 1, d[1] or 1, d[2] or 1
    local OH = (H + (pads[1] or 0) + (pads[3] or 0) - (KH - 1) * dh - 1) // sh + 1
    local OW = (W + (pads[2] or 0) + (pads[4] or 0) - (KW - 1) * dw - 1) // sw + 1
    if off:dim() ~= 4 or off.shape[1] ~= N or off.shape[2] ~= OG * K * 2 or off.shape[3] ~= OH or off.shape[4] ~= OW then
      node_error(node, "offset of shape [%s] (expected [%d, %d, %d, %d])", table.concat(off.shape, ","), N, OG * K * 2, OH, OW)
    end
    if mask and (mask:dim() ~= 4 or mask.shape[2] ~= OG * K or mask.shape[3] ~= OH or mask.shape[4] ~= OW) then
      node_error(node, "mask of shape [%s] (expected [%d, %d, %d, %d])", table.concat(mask.shape, ","), N, OG * K, OH, OW)
    end
    -- the taps' positions: [N, OG, KH, KW, OH, OW]
    local o = off:to("float32"):reshape({N, OG, KH, KW, 2, OH, OW})
    local oy, ox = o:narrow(5, 1, 1):squeeze(5), o:narrow(5, 2, 1):squeeze(5)
    local base_y = (fl.arange(KH):reshape({1, 1, KH, 1, 1, 1}) * i64(dh)
      + fl.arange(OH):reshape({1, 1, 1, 1, OH, 1}) * i64(sh)):to("float32") - k(pads[1] or 0)
    local base_x = (fl.arange(KW):reshape({1, 1, 1, KW, 1, 1}) * i64(dw)
      + fl.arange(OW):reshape({1, 1, 1, 1, 1, OW}) * i64(sw)):to("float32") - k(pads[2] or 0)
    local py, px = base_y + oy, base_x + ox
    local fy, fx = floor(py), floor(px)
    local ly, lx = py - fy, px - fx
    local Cg = C // OG
    local flat = x:reshape({N, OG, Cg, H, W}):permute({1, 2, 4, 5, 3}):reshape({N * OG * H * W, Cg})
    local plane = (fl.arange(N * OG) * i64(H * W)):reshape({N, OG, 1, 1, 1, 1})
    local samp
    for a = 0, 1 do
      for c = 0, 1 do
        local yy, xx = fy + k(a), fx + k(c)
        local inside = yy:ge(k(0.0)):to("float32") * yy:le(k(H - 1)):to("float32")
          * xx:ge(k(0.0)):to("float32") * xx:le(k(W - 1)):to("float32")
        local wt = (a == 1 and ly or k(1.0) - ly) * (c == 1 and lx or k(1.0) - lx) * inside
        local idx = plane + yy:clamp(0, H - 1):to("int64") * i64(W) + xx:clamp(0, W - 1):to("int64")
        local v = fl.embedding(idx:reshape({-1}), flat):reshape({N, OG, KH, KW, OH, OW, Cg})
        local t = v * wt:to(x.dtype):unsqueeze(7)
        samp = samp and samp + t or t
      end
    end
    if mask then samp = samp * mask:reshape({N, OG, KH, KW, OH, OW}):to(x.dtype):unsqueeze(7) end
    -- [N, OG, KH, KW, OH, OW, Cg] -> [N, C x K, OH, OW] (channel major, taps minor)
    samp = samp:permute({1, 2, 7, 3, 4, 5, 6}):reshape({N, C * K, OH, OW})
    return {fl.conv2d(samp, w:reshape({OC, Cpg * K, 1, 1}), b,
                      {stride = {1, 1}, padding = {0, 0, 0, 0}, dilation = {1, 1}, groups = G})}
  end
end

OPS.Ceil = rounding(function(x, t) return t + t:lt(x):to("float32") end)
OPS.Round = rounding(function(x, t)
  local f = floor_of(x, t)
  local diff = x - f
  local half = fl.full({}, 0.5)
  local fh = f * half
  local odd = (fh - floor_of(fh, fh:to("int64"):to("float32"))):gt(fl.zeros({}))
  local up = diff:gt(half):to("int64") + (diff:eq(half):to("int64") * odd:to("int64"))
  return f + up:gt(i64(0)):to("float32")
end)

-- Ops whose output size depends on the input's values (NonZero, Compress,
-- Unique) read those values (a graph break under fl.compile, as Dynamo's
-- on nonzero(); refused by fl.capture's one graph) and compute in Lua.
local function data_values(node, t, what)
  local ok, l = pcall(function() return t:reshape({-1}):tolist() end)
  if not ok then
    if not fl._tracing() then error(l, 0) end
    unsupported(node, "%s: an output size computed from graph inputs under capture (from their values)", what)
  end
  return l
end

-- the rows of x (moved to the front along d) picked by the 0-based idx list
local function take_along(x, d, idx)
  local r = x:dim()
  local perm = {d}
  for k = 1, r do if k ~= d then perm[#perm + 1] = k end end
  local xt = x:permute(perm):contiguous()
  local rest = {}
  for k = 2, r do rest[#rest + 1] = xt.shape[k] end
  local it = #idx > 0 and fl.tensor(idx, {dtype = "int64"}) or fl.zeros({0}, {dtype = "int64"})
  local g = fl.embedding(it, xt:reshape({xt.shape[1], prod(rest, 1, #rest)}))
  local gs = {#idx}
  for _, k in ipairs(rest) do gs[#gs + 1] = k end
  g = g:reshape(gs)
  local back = {}
  for k = 2, d do back[#back + 1] = k end
  back[#back + 1] = 1
  for k = d + 1, r do back[#back + 1] = k end
  return (r > 1 and g:permute(back) or g):contiguous()
end

OPS.NonZero = function(node, attrs)
  known_attrs(node, attrs, {})
  return function(ins)
    local x = T(node, ins[1])
    local shape, r = x.shape, x:dim()
    if r == 0 then unsupported(node, "a 0-d input") end
    local vals = data_values(node, x, "NonZero")
    local rows = {}
    for d = 1, r do rows[d] = {} end
    for i, v in ipairs(vals) do
      if v ~= 0 and v ~= false then                  -- its row-major coordinates
        local rem = i - 1
        for d = r, 1, -1 do
          rows[d][#rows[d] + 1] = rem % shape[d]
          rem = rem // shape[d]
        end
      end
    end
    if #rows[1] == 0 then return {fl.zeros({r, 0}, {dtype = "int64"})} end
    return {fl.tensor(rows, {dtype = "int64"})}
  end
end

OPS.Compress = function(node, attrs)
  known_attrs(node, attrs, set("axis"))
  return function(ins)
    local x, c = T(node, ins[1]), T(node, ins[2], "condition")
    local keep = data_values(node, c, "Compress")
    if attrs.axis == nil then x = x:reshape({-1}) end
    local d = attrs.axis and axis(node, attrs.axis, x:dim()) or 1
    local idx = {}
    for i, v in ipairs(keep) do
      if i > x.shape[d] then break end
      if v ~= 0 and v ~= false then idx[#idx + 1] = i - 1 end
    end
    return {take_along(x, d, idx)}
  end
end

-- Unique: the distinct values (or slices along axis), sorted or in the
-- order they first appear, with the first index of each, the index of
-- each input element's unique value, and the counts.
OPS.Unique = function(node, attrs)
  known_attrs(node, attrs, set("axis", "sorted"))
  local sorted = attr(attrs, "sorted", 1) ~= 0
  return function(ins)
    local x = T(node, ins[1])
    local flat = attrs.axis == nil
    local xs = flat and x:reshape({-1}) or x
    local d = flat and 1 or axis(node, attrs.axis, x:dim())
    local n = xs.shape[d]
    -- each slice along d as a row
    local perm = {d}
    for k = 1, xs:dim() do if k ~= d then perm[#perm + 1] = k end end
    local moved = xs:permute(perm):contiguous():reshape({n, -1})
    local vals = data_values(node, moved, "Unique")
    local w = n > 0 and #vals // n or 0
    local function slice(i) return table.pack(table.unpack(vals, (i - 1) * w + 1, i * w)) end
    local function key(s) return table.concat(s, ",", 1, s.n) end
    local first, order, inverse, counts = {}, {}, {}, {}
    for i = 1, n do
      local k = key(slice(i))
      if not first[k] then first[k] = i; order[#order + 1] = i end
    end
    if sorted then
      table.sort(order, function(a, b)
        local sa, sb = slice(a), slice(b)
        for j = 1, sa.n do if sa[j] ~= sb[j] then return sa[j] < sb[j] end end
        return false
      end)
    end
    local pos = {}
    for u, i in ipairs(order) do pos[key(slice(i))] = u - 1; counts[u] = 0 end
    for i = 1, n do
      local u = pos[key(slice(i))]
      inverse[i] = u
      counts[u + 1] = counts[u + 1] + 1
    end
    local idx = {}
    for u, i in ipairs(order) do idx[u] = i - 1 end
    local y = take_along(xs, d, idx)
    local function ivec(v) return #v > 0 and fl.tensor(v, {dtype = "int64"}) or fl.zeros({0}, {dtype = "int64"}) end
    return {y, ivec(idx), ivec(inverse), ivec(counts)}
  end
end

-- ImageDecoder (opset 20): encoded image bytes (uint8, 1-d) to [H, W, C]
-- uint8 pixels, decoded in C (io/image.c) by the libraries Pillow uses,
-- as ONNX's reference does.  The output's shape comes from the bytes: they
-- are read as values, a graph break under fl.compile (as NonZero's),
-- which one graph (fl.capture) cannot take.
OPS.ImageDecoder = function(node, attrs)
  known_attrs(node, attrs, set("pixel_format"))
  local pf = attr(attrs, "pixel_format", "RGB")
  if pf ~= "RGB" and pf ~= "BGR" and pf ~= "Grayscale" then
    node_error(node, "pixel_format must be RGB, BGR or Grayscale, got '%s'", clean(pf))
  end
  return function(ins)
    local v = ins[1]
    if v == nil then node_error(node, "the encoded image is missing") end
    if dtype_of(v) ~= "uint8" then node_error(node, "the encoded image must be uint8, got %s", dtype_of(v)) end
    local t = v.t
    if t:dim() ~= 1 then node_error(node, "the encoded image must be 1-d, got %d-d", t:dim()) end
    local ok, px, why, kind = pcall(fl._onnx_image, t, pf)
    if not ok then
      if not fl._tracing() then error(px, 0) end
      unsupported(node, "image bytes computed from graph inputs under capture (a data-dependent shape)")
    end
    if px == nil then
      if kind == "unsupported" then unsupported(node, "%s", why) end
      node_error(node, "%s", why)
    end
    return {{wide = "uint8", t = px}}
  end
end

-- Swish (opset 24) and SwiGLU (opset 28): x sigmoid(alpha x), the latter
-- gating B with it.
OPS.Swish = unary(function(x, p)
  return p.alpha == 1 and x:silu() or x * (x * scalar(x, p.alpha)):sigmoid()
end, {alpha = 1.0})
OPS.SwiGLU = function(node, attrs)
  known_attrs(node, attrs, set("alpha"))
  local alpha = attr(attrs, "alpha", 1.0)
  return function(ins)
    local a, b = T(node, ins[1], "A"), T(node, ins[2], "B")
    need_float(node, a)
    if #a.shape ~= #b.shape then node_error(node, "A and B of other shapes") end
    for i = 1, #a.shape do if a.shape[i] ~= b.shape[i] then node_error(node, "A and B of other shapes") end end
    local g = alpha == 1 and a:silu() or a * (a * scalar(a, alpha)):sigmoid()
    return {g * b}
  end
end

-- LpNormalization: x over its L1 or L2 norm along axis (0 where the norm is).
OPS.LpNormalization = function(node, attrs)
  known_attrs(node, attrs, set("axis", "p"))
  local p = attr(attrs, "p", 2)
  if p ~= 1 and p ~= 2 then node_error(node, "p = %s (1 or 2)", tostring(p)) end
  return function(ins)
    local x = T(node, ins[1])
    need_float(node, x)
    local d = axis(node, attr(attrs, "axis", -1), x:dim())
    local n = p == 1 and x:abs():sum(d, true) or (x * x):sum(d, true):sqrt()
    local zero = n:eq(scalar(n, 0))
    return {fl.where(zero, scalar(x, 0), x / fl.where(zero, scalar(n, 1), n))}
  end
end

-- CenterCropPad (opset 18): each listed axis cropped to its centre or
-- zero-padded around it (an odd difference: the extra element after).
OPS.CenterCropPad = function(node, attrs)
  known_attrs(node, attrs, set("axes"))
  return function(ins)
    local x = T(node, ins[1], "input_data")
    local shape = ints(node, ins[2], "shape")
    local r = x:dim()
    local axes = attrs.axes or {}
    if #axes == 0 then for d = 1, r do axes[d] = d - 1 end end
    if #shape ~= #axes then node_error(node, "%d sizes for %d axes", #shape, #axes) end
    for i, a in ipairs(axes) do
      local d = axis(node, a, r)
      local n, want = x.shape[d], shape[i]
      if type(n) ~= "number" then unsupported(node, "a dynamic dim") end
      if want < n then
        x = x:narrow(d, (n - want) // 2 + 1, want)
      elseif want > n then
        local pads = {}
        for k = 1, 2 * r do pads[k] = 0 end
        pads[d], pads[r + d] = (want - n) // 2, want - n - (want - n) // 2
        x = fl.pad(x, pads)
      end
    end
    return {x:contiguous()}
  end
end

-- ReverseSequence: the first len[b] steps of each batch entry reversed,
-- the rest copied (a gather along time per entry, its indices computed).
OPS.ReverseSequence = function(node, attrs)
  known_attrs(node, attrs, set("batch_axis", "time_axis"))
  return function(ins)
    local x = T(node, ins[1])
    local lv = ins[2]
    if lv ~= nil and not is_tensor(lv) and lv.wide then lv = lv.t end
    local lens = T(node, lv, "sequence_lens")
    local r = x:dim()
    local ba, ta = axis(node, attr(attrs, "batch_axis", 1), r), axis(node, attr(attrs, "time_axis", 0), r)
    if ba == ta or (ba > 2 or ta > 2) then node_error(node, "batch_axis and time_axis must be 0 and 1") end
    local xt = ta == 1 and x or x:transpose(1, 2)        -- [time, batch, ...]
    local T_, B = xt.shape[1], xt.shape[2]
    local t = fl.arange(T_):reshape({T_, 1})
    local l = lens:reshape({1, B})
    local src = fl.where(t:lt(l), l - t - i64(1), t)     -- [time, batch]
    local rest = xt:numel() // (T_ * B)
    local flat = xt:reshape({T_ * B, rest})
    local idx = src * i64(B) + fl.arange(B):reshape({1, B})
    local y = fl.embedding(idx:reshape({-1}), flat):reshape(xt.shape)
    return {ta == 1 and y or y:transpose(1, 2):contiguous()}
  end
end

-- AffineGrid (opset 20): each output position's normalized coordinates
-- (align_corners: the corner pixels' centres at -1 and 1) through theta,
-- [N, H, W, 2] (x, y) or [N, D, H, W, 3].
OPS.AffineGrid = function(node, attrs)
  known_attrs(node, attrs, set("align_corners"))
  local align = attr(attrs, "align_corners", 0) ~= 0
  return function(ins)
    local theta = T(node, ins[1], "theta")
    need_float(node, theta)
    local size = ints(node, ins[2], "size")
    local r = #size - 2
    if r ~= 2 and r ~= 3 then node_error(node, "size of %d values (4 or 5)", #size) end
    local N = size[1]
    local function lin(n)                                -- n normalized positions
      if n == 1 then return fl.zeros({1}) end
      local k = fl.arange(n):to("float32")
      if align then return k * fl.full({}, 2 / (n - 1)) - fl.full({}, 1.0) end
      return (k * fl.full({}, 2.0) + fl.full({}, 1.0)) / fl.full({}, n) - fl.full({}, 1.0)
    end
    -- base [pts, r + 1]: (x, y[, z], 1), x the fastest (the last spatial dim)
    local spatial = {}
    for i = 1, r do spatial[i] = size[2 + i] end
    local cols, pts = {}, 1
    for _, n in ipairs(spatial) do pts = pts * n end
    for c = 1, r do                                      -- c = 1: x (the last dim)
      local d = r - c + 1
      local shape = {}
      for i = 1, r do shape[i] = i == d and spatial[i] or 1 end
      cols[c] = lin(spatial[d]):reshape(shape):expand(spatial):reshape({pts, 1})
    end
    cols[r + 1] = fl.ones({pts, 1})
    local base = fl.cat(cols, 2):to(theta.dtype)         -- [pts, r + 1]
    local g = base:unsqueeze(1):matmul(theta:transpose(2, 3))   -- [N, pts, r]
    local out = {N}
    for _, n in ipairs(spatial) do out[#out + 1] = n end
    out[#out + 1] = r
    return {g:reshape(out)}
  end
end

OPS.Shrink = unary(function(x, p)
  local lo, hi = scalar(x, -p.lambd), scalar(x, p.lambd)
  return fl.where(x:lt(lo), x + scalar(x, p.bias), fl.where(x:gt(hi), x - scalar(x, p.bias), scalar(x, 0)))
end, {lambd = 0.5, bias = 0.0})

OPS.Mod = function(node, attrs)
  known_attrs(node, attrs, set("fmod"))
  local fmod = attr(attrs, "fmod", 0) ~= 0
  return function(ins)
    local a, b = T(node, ins[1]), T(node, ins[2])
    if a.dtype ~= b.dtype then node_error(node, "operands of %s and %s", a.dtype, b.dtype) end
    if fmod then return {fl.fmod(a, b)} end               -- truncated: a's sign
    return {fl.remainder(a, b)}                           -- floored: b's sign (floats too, as opset 28 says)
  end
end

OPS.DepthToSpace = function(node, attrs)
  known_attrs(node, attrs, set("blocksize", "mode"))
  local b, mode = attrs.blocksize, attr(attrs, "mode", "DCR")
  if not b then node_error(node, "attribute 'blocksize' is required") end
  if math.type(b) ~= "integer" or b < 1 then node_error(node, "blocksize %s (a positive integer)", tostring(b)) end
  if mode ~= "DCR" and mode ~= "CRD" then node_error(node, "mode '%s'", mode) end
  return function(ins)
    local x = T(node, ins[1])
    if x:dim() ~= 4 then node_error(node, "input of %d dims", x:dim()) end
    local N, C, H, W = table.unpack(x.shape)
    if C % (b * b) ~= 0 then node_error(node, "channels %d not divisible by %d", C, b * b) end
    local c = C // (b * b)
    local y
    if mode == "DCR" then y = x:reshape({N, b, b, c, H, W}):permute({1, 4, 5, 2, 6, 3})
    else y = x:reshape({N, c, b, b, H, W}):permute({1, 2, 5, 3, 6, 4}) end
    return {y:contiguous():reshape({N, c, H * b, W * b})}
  end
end

OPS.SpaceToDepth = function(node, attrs)
  known_attrs(node, attrs, set("blocksize", "mode"))
  local b, mode = attrs.blocksize, attr(attrs, "mode", "DCR")   -- mode: opset 28, DCR before
  if not b then node_error(node, "attribute 'blocksize' is required") end
  if math.type(b) ~= "integer" or b < 1 then node_error(node, "blocksize %s (a positive integer)", tostring(b)) end
  if mode ~= "DCR" and mode ~= "CRD" then node_error(node, "mode '%s'", mode) end
  return function(ins)
    local x = T(node, ins[1])
    if x:dim() ~= 4 then node_error(node, "input of %d dims", x:dim()) end
    local N, C, H, W = table.unpack(x.shape)
    if H % b ~= 0 or W % b ~= 0 then node_error(node, "spatial dims not divisible by %d", b) end
    -- DCR: channel (bh, bw, c); CRD: channel (c, bh, bw)
    local y = x:reshape({N, C, H // b, b, W // b, b}):permute(mode == "DCR" and {1, 4, 6, 2, 3, 5} or {1, 2, 4, 6, 3, 5})
    return {y:contiguous():reshape({N, C * b * b, H // b, W // b})}
  end
end

OPS.OneHot = function(node, attrs)
  known_attrs(node, attrs, set("axis"))
  return function(ins)
    local iv = ins[1]
    if iv ~= nil and not is_tensor(iv) and iv.wide and iv.wide ~= "uint64" then iv = iv.t end   -- exact
    local idx, vals = T(node, iv, "indices"), T(node, ins[3], "values")
    local depth = math.tointeger(number(node, ins[2], "depth") // 1)
    if not depth or depth < 1 then node_error(node, "depth must be a positive integer") end
    if vals:numel() ~= 2 then node_error(node, "values must hold [off, on]") end
    -- cast as the spec says (truncation; NaN and values past int64 give
    -- INT64_MIN, which matches no class, eagerly and compiled alike)
    if idx.dtype ~= "int64" then idx = idx:to("int64") end
    local r = idx:dim() + 1
    local d = axis(node, attr(attrs, "axis", -1), r)
    local it = fl.where(idx:lt(i64(0)), idx + i64(depth), idx):unsqueeze(d)
    local off, on = vals:narrow(1, 1, 1):reshape({}), vals:narrow(1, 2, 1):reshape({})
    return {fl.where(iota(depth, d, r):eq(it), on, off)}
  end
end

OPS.MeanVarianceNormalization = function(node, attrs)
  known_attrs(node, attrs, set("axes"))
  local axes = attr(attrs, "axes", {0, 2, 3})
  return function(ins)
    local x = T(node, ins[1])
    need_float(node, x)
    local dims = reduce_dims(node, axes, x:dim())
    local mean = x:mean(dims, true)
    local var = (x * x):mean(dims, true) - mean * mean
    return {(x - mean) / (var:sqrt() + scalar(x, 1e-9))}
  end
end

-- Windows: w[n] = sum_k a_k cos(2 pi k n / N), N = size (periodic) or
-- size - 1 (symmetric), computed in double and rounded once.
local function window(coeffs)
  return function(node, attrs)
    known_attrs(node, attrs, set("output_datatype", "periodic"))
    local to = DTYPE_CODE[attr(attrs, "output_datatype", 1)]
    local dt = FL_DTYPE[to]
    if not dt or not FLOAT[dt] then unsupported(node, "output_datatype %s", tostring(to)) end
    local periodic = attr(attrs, "periodic", 1) ~= 0
    return function(ins)
      local size = math.tointeger(number(node, ins[1], "size"))
      if not size or size < 0 or size > 1 << 24 then node_error(node, "size must be a count") end
      if size == 0 then return {fl.zeros({0}, {dtype = dt})} end
      local N = periodic and size or size - 1
      local out = {}
      for n = 0, size - 1 do
        local v = 0
        for k, a in ipairs(coeffs) do v = v + a * math.cos(2 * math.pi * (k - 1) * n / N) end
        out[#out + 1] = N == 0 and 1 or v
      end
      return {fl.tensor(out, {dtype = "float32"}):to(dt)}
    end
  end
end
OPS.HannWindow = window({0.5, -0.5})
OPS.HammingWindow = window({25 / 46, -21 / 46})
OPS.BlackmanWindow = window({0.42, -0.5, 0.08})

-- DFT as products with cos and sin matrices built here in double (the
-- angle 2 pi (n k mod L) / L reduced exactly first) and rounded once, not
-- as an FFT: a matmul compiles with no new kernel and takes any length
-- (no radix cases), and each output is one dot product, in the input's
-- precision (float32 for the narrower floats, float64 for float64).  A
-- float32 sum errs by up to n * eps times the inputs' scale where an FFT
-- errs by log n * eps: at the lengths models transform (frames of a few
-- hundred samples) that is within 1e-5 of the scale.  The products in
-- float64 would be exact but ten times slower and, compiled, unfused
-- library steps.  The tests hold float32 to 1e-6 relative + 1e-6 (inputs
-- of scale 3, lengths to 12) against a direct sum in double, float64 to
-- 1e-12.  An FFT
-- would be n log n where this is n^2, which matters only for long
-- signals: the matrices are capped.
local DFT_MAX = 1 << 24

-- c[n][k] = w(n) cos(2 pi n k / L), s[n][k] = w(n) sin(2 pi n k / L), for
-- n < rows, k < cols, as [rows, cols] tensors of dtype dt.
local function dft_matrices(node, rows, cols, L, dt, w)
  if rows * cols > DFT_MAX then
    unsupported(node, "a DFT of %d x %d points (its matrices past 2^24 elements)", rows, cols)
  end
  local c, s = {}, {}
  for n = 0, rows - 1 do
    local a = w(n)
    for k = 0, cols - 1 do
      local th = 2 * math.pi * ((n * k) % L) / L
      c[#c + 1], s[#s + 1] = a * math.cos(th), a * math.sin(th)
    end
  end
  return fl.tensor(c, {dtype = dt}):reshape({rows, cols}), fl.tensor(s, {dtype = dt}):reshape({rows, cols})
end

-- The DFT of x ([..., 1] real or [..., 2] complex) along dim d (1-based,
-- not the last) at length L: forward, inverse (1/L), onesided forward (the
-- L // 2 + 1 first bins of a real signal) or onesided inverse (a real
-- signal of length L from the L // 2 + 1 first bins of a Hermitian
-- spectrum, the others being their conjugates: each bin but 0 and L/2
-- counts twice, and their imaginary parts drop out).
local function dft(node, x, d, L, inverse, onesided)
  need_float(node, x)
  local r = x:dim()
  local C = x.shape[r]
  if C ~= 1 and C ~= 2 then node_error(node, "the last dim must be 1 (real) or 2 (complex), got %s", tostring(C)) end
  if onesided and not inverse and C == 2 then node_error(node, "a onesided forward DFT takes a real input") end
  if onesided and inverse and C == 1 then node_error(node, "a onesided inverse DFT takes a complex input") end
  if math.type(L) ~= "integer" or L < 1 then node_error(node, "dft_length %s (at least 1)", tostring(L)) end
  local dt = x.dtype
  local wdt = dt == "float64" and "float64" or "float32"
  if dt ~= wdt then x = x:to(wdt) end
  local function part(i) return x:narrow(r, i, 1):squeeze(r):transpose(d, r - 1) end
  local xr, xi = part(1), C == 2 and part(2) or nil
  local N = static_size(xr.shape[r - 1])
  local rows, cols, w = math.min(N, L), L, function() return 1 end
  if inverse and onesided then
    rows = math.min(N, L // 2 + 1)
    w = function(k) return (k == 0 or 2 * k == L) and 1 / L or 2 / L end
  elseif inverse then
    w = function() return 1 / L end
  elseif onesided then
    cols = L // 2 + 1
  end
  if rows == 0 then unsupported(node, "a DFT of an empty signal") end
  local cm, sm = dft_matrices(node, rows, cols, L, wdt, w)
  local lead = {}
  for i = 1, r - 2 do lead[i] = xr.shape[i] end
  local function mm(v, m)
    if N > rows then v = v:narrow(r - 1, 1, rows) end
    local out = {table.unpack(lead)}
    out[#out + 1] = cols
    return v:reshape({-1, rows}):matmul(m):reshape(out)
  end
  local yr, yi
  if inverse then      -- (xr + i xi)(cos + i sin)
    yr = mm(xr, cm)
    if xi then yr = yr - mm(xi, sm) end
    if not onesided then yi = mm(xr, sm) + (xi and mm(xi, cm) or 0) end
  else                 -- (xr + i xi)(cos - i sin)
    yr, yi = mm(xr, cm), -mm(xr, sm)
    if xi then yr, yi = yr + mm(xi, sm), yi + mm(xi, cm) end
  end
  local function back(y) return y:transpose(d, r - 1):unsqueeze(r) end
  local y = yi and fl.cat({back(yr), back(yi)}, r) or back(yr)
  return y:to(dt)
end

OPS.DFT = function(node, attrs, opset)
  known_attrs(node, attrs, opset < 20 and set("axis", "inverse", "onesided") or set("inverse", "onesided"))
  local inverse, onesided = attr(attrs, "inverse", 0) ~= 0, attr(attrs, "onesided", 0) ~= 0
  return function(ins)
    local x = T(node, ins[1], "input")
    local r = x:dim()
    local a = opset < 20 and attr(attrs, "axis", 1) or -2
    if opset >= 20 and ins[3] ~= nil then a = number(node, ins[3], "axis") end
    a = math.tointeger(a)
    if a and a < 0 then a = a + r end
    if not a or a < 0 or a > r - 2 then
      node_error(node, "axis %s out of range for a %d-d input (not the last dim)", tostring(a), r)
    end
    local N = x.shape[a + 1]
    local L
    if ins[2] ~= nil then L = math.tointeger(number(node, ins[2], "dft_length"))
    else L = static_size(N); if inverse and onesided then L = 2 * (L - 1) end end
    return {dft(node, x, a + 1, L, inverse, onesided)}
  end
end

-- STFT: the frames (frame_step apart) gathered into [batch, frames,
-- frame_length, 1 or 2], weighted by the window, each transformed as DFT.
OPS.STFT = function(node, attrs)
  known_attrs(node, attrs, set("onesided"))
  local onesided = attr(attrs, "onesided", 1) ~= 0
  return function(ins)
    local x = T(node, ins[1], "signal")
    need_float(node, x)
    if x:dim() ~= 3 then node_error(node, "signal of %d dims ([batch, length, 1 or 2] expected)", x:dim()) end
    local n = static_size(x.shape[2])
    local step = math.tointeger(number(node, ins[2], "frame_step"))
    local win = ins[3] ~= nil and T(node, ins[3], "window") or nil
    local len = ins[4] ~= nil and math.tointeger(number(node, ins[4], "frame_length")) or nil
    if win then
      if win:dim() ~= 1 then node_error(node, "window of %d dims (1 expected)", win:dim()) end
      local wl = static_size(win.shape[1])
      if len and len ~= wl then node_error(node, "a window of %d for frame_length %d", wl, len) end
      len = wl
    end
    len = len or n
    if not step or step < 1 then node_error(node, "frame_step %s (at least 1)", tostring(step)) end
    if not len or len < 1 or len > n then
      node_error(node, "frame_length %s for a signal of %d", tostring(len), n)
    end
    local frames = (n - len) // step + 1
    check_count(node, frames * len, "frames")
    local idx = {}
    for f = 0, frames - 1 do
      for j = 0, len - 1 do idx[#idx + 1] = f * step + j end
    end
    local C = x.shape[3]
    local fr = take_along(x, 2, idx):reshape({x.shape[1], frames, len, C})
    if win then
      if win.dtype ~= x.dtype then node_error(node, "a window of dtype %s for a %s signal", win.dtype, x.dtype) end
      fr = fr * win:reshape({1, 1, len, 1})
    end
    return {dft(node, fr, 3, len, false, onesided)}
  end
end

-- log1p and expm1 near full precision (Lua has neither): log(u) or
-- exp(x) - 1 corrected by the rounding 1 + x or exp(x) made (Goldberg's
-- and Kahan's forms).
local function log1p(x)
  local u = 1 + x
  if u == 1 then return x end
  return math.log(u) * x / (u - 1)
end
local function expm1(x)
  local u = math.exp(x)
  if u == 1 then return x end
  if u - 1 == -1 then return -1 end
  return (u - 1) * x / math.log(u)
end

-- MelWeightMatrix as ONNX's reference computes it: num_mel_bins + 2 band
-- edges spaced evenly in mel (the step being the range over their count),
-- each rounded down to a spectrogram bin; band i rises from edge i to edge
-- i + 1 and falls to edge i + 2, peaking at 1.
OPS.MelWeightMatrix = function(node, attrs)
  known_attrs(node, attrs, set("output_datatype"))
  local to = DTYPE_CODE[attr(attrs, "output_datatype", 1)]
  local dt = FL_DTYPE[to]
  if not dt or not FLOAT[dt] then unsupported(node, "output_datatype %s", tostring(to)) end
  return function(ins)
    local nmel = math.tointeger(number(node, ins[1], "num_mel_bins"))
    local L = math.tointeger(number(node, ins[2], "dft_length"))
    local rate = number(node, ins[3], "sample_rate")
    local lo, hi = number(node, ins[4], "lower_edge_hertz"), number(node, ins[5], "upper_edge_hertz")
    if not nmel or nmel < 1 then node_error(node, "num_mel_bins %s (at least 1)", tostring(nmel)) end
    if not L or L < 1 then node_error(node, "dft_length %s (at least 1)", tostring(L)) end
    if not (rate > 0) then node_error(node, "sample_rate %s (positive)", tostring(rate)) end
    if not (lo >= 0 and hi > lo) then node_error(node, "edges %s and %s Hz (0 <= lower < upper)", lo, hi) end
    local nspec = L // 2 + 1
    check_count(node, nspec * nmel, "a matrix")
    local ln10 = math.log(10)
    local mlo, mhi = 2595 * log1p(lo / 700) / ln10, 2595 * log1p(hi / 700) / ln10
    local mstep = (mhi - mlo) / (nmel + 2)
    local edge = {}
    for i = 0, nmel + 1 do
      local hz = 700 * expm1((i * mstep + mlo) / 2595 * ln10)
      edge[i] = math.tointeger(((L + 1) * hz) // rate)
      if not edge[i] or edge[i] >= nspec then
        node_error(node, "a mel band edge at %s Hz past the %d spectrogram bins", hz, nspec)
      end
    end
    local out = {}
    for j = 1, nspec * nmel do out[j] = 0 end
    local function put(j, i, v) out[j * nmel + i + 1] = v end
    for i = 0, nmel - 1 do
      local a, c, b = edge[i], edge[i + 1], edge[i + 2]
      if c == a then put(c, i, 1)
      else for j = a, c do put(j, i, (j - a) / (c - a)) end end
      if b > c then for j = c, b - 1 do put(j, i, (b - j) / (b - c)) end end
    end
    return {fl.tensor(out, {dtype = "float64"}):reshape({nspec, nmel}):to(dt)}
  end
end

-- LinearAttention (opset 27) as its recurrence, one step per token in
-- float32 (ONNX's reference accumulates there whatever the inputs' type):
-- the state S [B, H_kv, d_k, d_v] decays by exp(g_t) (gated), takes the
-- delta correction v_t <- beta_t (v_t - S^T k_t) (delta), adds k_t v_t^T,
-- and each query head reads scale * q_t^T S of its KV head (query head h
-- reads KV head h // (H_q / H_kv)).  The steps unroll under capture, as a
-- Scan's do; chunk_size (a tuning hint for chunked kernels) changes nothing.
local LINEAR_RULES = {linear = {}, gated = {gate = true}, delta = {delta = true},
  gated_delta = {gate = true, delta = true}}
OPS.LinearAttention = function(node, attrs)
  known_attrs(node, attrs, set("chunk_size", "kv_num_heads", "q_num_heads", "scale", "update_rule"))
  local rname = attr(attrs, "update_rule", "gated_delta")
  local rule = LINEAR_RULES[rname]
  if not rule then unsupported(node, "update_rule '%s'", clean(rname)) end
  local hq, hkv = attrs.q_num_heads, attrs.kv_num_heads
  if math.type(hq) ~= "integer" or math.type(hkv) ~= "integer" then
    node_error(node, "q_num_heads and kv_num_heads are required")
  end
  if hq < 1 or hkv < 1 or hq % hkv ~= 0 then
    node_error(node, "q_num_heads %d is not a positive multiple of kv_num_heads %d", hq, hkv)
  end
  local G = hq // hkv
  return function(ins)
    local q, k, v = T(node, ins[1], "query"), T(node, ins[2], "key"), T(node, ins[3], "value")
    local past = ins[4] ~= nil and T(node, ins[4], "past_state") or nil
    local decay = ins[5] ~= nil and T(node, ins[5], "decay") or nil
    local beta = ins[6] ~= nil and T(node, ins[6], "beta") or nil
    need_float(node, q)
    for _, p in ipairs({{q, "query"}, {k, "key"}, {v, "value"}, {decay, "decay"}, {beta, "beta"}}) do
      local x, what = p[1], p[2]
      if x and x:dim() ~= 3 then node_error(node, "%s of %d dims (3 expected)", what, x:dim()) end
      if x and x.dtype ~= q.dtype then node_error(node, "%s of dtype %s for a %s query", what, x.dtype, q.dtype) end
    end
    if rule.gate and not decay then node_error(node, "update_rule '%s' needs decay", rname) end
    if not rule.gate and decay then node_error(node, "update_rule '%s' takes no decay", rname) end
    if rule.delta and not beta then node_error(node, "update_rule '%s' needs beta", rname) end
    if not rule.delta and beta then node_error(node, "update_rule '%s' takes no beta", rname) end
    local B, Tn = q.shape[1], static_size(q.shape[2])
    local qd, kd, vd = static_size(q.shape[3]), static_size(k.shape[3]), static_size(v.shape[3])
    if qd % hq ~= 0 or vd % hkv ~= 0 then
      node_error(node, "query of %d or value of %d features over %d or %d heads", qd, vd, hq, hkv)
    end
    local dk, dv = qd // hq, vd // hkv
    if kd ~= hkv * dk then node_error(node, "key of %d features for %d heads of %d", kd, hkv, dk) end
    for _, x in ipairs({k, v, decay or k, beta or k}) do
      if size_equal(x.shape[1], B) == false or size_equal(x.shape[2], Tn) == false then
        node_error(node, "inputs of different batch or sequence sizes")
      end
    end
    local f = function(x) return x:to("float32") end
    local qs = f(q):reshape({B, Tn, hkv, G, dk})
    local ks, vs = f(k):reshape({B, Tn, hkv, dk, 1}), f(v):reshape({B, Tn, hkv, 1, dv})
    local gs, bs
    if decay then
      local n = static_size(decay.shape[3])
      if n ~= hkv and n ~= hkv * dk then
        node_error(node, "decay of %d features (kv_num_heads %d or kv_num_heads * d_k %d)", n, hkv, hkv * dk)
      end
      gs = f(decay):reshape({B, Tn, hkv, n // hkv, 1}):exp()
    end
    if beta then
      local n = static_size(beta.shape[3])
      if n ~= hkv and n ~= 1 then node_error(node, "beta of %d features (kv_num_heads %d or 1)", n, hkv) end
      bs = f(beta):reshape({B, Tn, n, 1, 1})
    end
    local S
    if past then
      local want = {B, hkv, dk, dv}
      for i = 1, 4 do
        if past:dim() ~= 4 or size_equal(past.shape[i], want[i]) == false then
          node_error(node, "past_state of shape [%s] ([B, %d, %d, %d] expected)",
                     table.concat(past.shape, ","), hkv, dk, dv)
        end
      end
      S = f(past)
    else
      S = fl.zeros({B, hkv, dk, dv}, {dtype = "float32"})
    end
    local sc = attr(attrs, "scale", 0)
    if sc == 0 then sc = 1 / math.sqrt(dk) end
    local outs = {}
    local function at(x, t) return x:narrow(2, t, 1):squeeze(2) end
    for t = 1, Tn do
      local kt, vt = at(ks, t), at(vs, t)                     -- [B, H_kv, d_k, 1], [B, H_kv, 1, d_v]
      if gs then S = S * at(gs, t) end
      if bs then vt = at(bs, t) * (vt - kt:transpose(3, 4):matmul(S)) end
      S = S + kt * vt
      -- [B, H_kv, G, d_k] @ [B, H_kv, d_k, d_v]: the G query heads of each KV head
      outs[t] = (at(qs, t):matmul(S) * sc):reshape({B, 1, hq * dv})
    end
    local y = Tn == 1 and outs[1] or fl.cat(outs, 2)
    return {y:to(q.dtype), S:to(past and past.dtype or q.dtype)}
  end
end

-- CausalConvWithState (opset 27): a depthwise causal conv1d over the input
-- after the carried k - 1 positions (zeros without past_state), as k
-- shifted products (k is small: the short convs of Mamba and Gated
-- DeltaNet), in float32 for narrower floats, then an optional SiLU; the
-- present state is the last k - 1 positions of that padded sequence.
OPS.CausalConvWithState = function(node, attrs)
  known_attrs(node, attrs, set("activation"))
  local act = attr(attrs, "activation", "none")
  if act ~= "none" and act ~= "silu" and act ~= "swish" then unsupported(node, "activation '%s'", clean(act)) end
  return function(ins)
    local x, w = T(node, ins[1], "input"), T(node, ins[2], "weight")
    local b = ins[3] ~= nil and T(node, ins[3], "bias") or nil
    local past = ins[4] ~= nil and T(node, ins[4], "past_state") or nil
    need_float(node, x)
    if x:dim() ~= 3 then node_error(node, "input of %d dims ([batch, channels, length] expected)", x:dim()) end
    if w:dim() ~= 3 or size_equal(w.shape[2], 1) == false or size_equal(w.shape[1], x.shape[2]) == false then
      node_error(node, "weight of shape [%s] ([channels, 1, k] expected)", table.concat(w.shape, ","))
    end
    local B, C, L = x.shape[1], x.shape[2], x.shape[3]
    local k = static_size(w.shape[3])
    if k < 1 then node_error(node, "a kernel of size 0") end
    if b and (b:dim() ~= 1 or size_equal(b.shape[1], C) == false) then
      node_error(node, "bias of shape [%s] ([channels] expected)", table.concat(b.shape, ","))
    end
    for _, p in ipairs({{w, "weight"}, {b, "bias"}, {past, "past_state"}}) do
      if p[1] and p[1].dtype ~= x.dtype then node_error(node, "%s of dtype %s for a %s input", p[2], p[1].dtype, x.dtype) end
    end
    if past then
      local want = {B, C, k - 1}
      for i = 1, 3 do
        if past:dim() ~= 3 or size_equal(past.shape[i], want[i]) == false then
          node_error(node, "past_state of shape [%s] ([batch, channels, %d] expected)", table.concat(past.shape, ","), k - 1)
        end
      end
    end
    local padded = x
    if k > 1 then padded = fl.cat({past or fl.zeros({B, C, k - 1}, {dtype = x.dtype}), x}, 3) end
    local wdt = x.dtype == "float64" and "float64" or "float32"
    local p32, w32 = padded:to(wdt), w:to(wdt)
    local y = b and b:to(wdt):reshape({1, C, 1}) or nil
    for j = 1, k do
      local term = p32:narrow(3, j, L) * w32:narrow(3, j, 1):reshape({1, C, 1})
      y = y and y + term or term
    end
    if act ~= "none" then
      -- ONNX's reference rounds the conv to the input's dtype before the SiLU
      y = y:to(x.dtype):to(wdt)
      y = y * y:sigmoid()
    end
    local state = k > 1 and padded:narrow(3, static_size(padded.shape[3]) - k + 2, k - 1)
      or fl.zeros({B, C, 0}, {dtype = x.dtype})
    return {y:to(x.dtype), state}
  end
end

OPS.EyeLike = function(node, attrs)
  known_attrs(node, attrs, set("dtype", "k"))
  local k = attr(attrs, "k", 0)
  local to = attrs.dtype and DTYPE_CODE[attrs.dtype]
  if to and not FL_DTYPE[to] and not WIDE[to] then unsupported(node, "dtype %s", to) end
  return function(ins)
    local v = ins[1]
    local x = is_tensor(v) and v or (v.wide and v.t) or T(node, v)
    local want = to or (not is_tensor(v) and v.wide) or ONNX_DTYPE[x.dtype]
    if x:dim() ~= 2 then node_error(node, "input of %d dims (2 expected)", x:dim()) end
    local diag = (iota(x.shape[2], 2, 2) - iota(x.shape[1], 1, 2)):eq(i64(k))
    local dt = FL_DTYPE[want] or "int64"
    local y = diag:to(dt)
    if WIDE[want] then return {{wide = want, t = y}} end
    return {y}
  end
end

-- GatherND with batch_dims 0: the last dim of indices addresses data's
-- first dims; as one row index into data seen as [prod(those), rest].
-- RNN, GRU and LSTM as ONNX defines them.  Most run as one rnn op
-- (fl.rnn: every step in one extern step, the sequence length symbolic
-- under capture).  The op's activations take no alpha or beta, so a node
-- that sets activation_alpha/beta or names an activation the op lacks
-- (HardSigmoid, LeakyRelu, Affine) is unrolled here instead, one time step
-- after another (under capture the sequence length is then made static): gates from the
-- packed weights (RNN i; GRU z r h; LSTM i o f c), each direction's own
-- weights, a sequence_lens mask that keeps a finished sequence's state and
-- zeros its outputs, clip on the gate inputs, peepholes, layout 1.
local RNN_ACT = {
  Sigmoid = function(x) return x:sigmoid() end,
  Tanh = function(x) return x:tanh() end,
  Relu = function(x) return x:relu() end,
  Softsign = function(x) return x / (x:abs() + scalar(x, 1)) end,
  Softplus = function(x) return (x:exp() + scalar(x, 1)):log() end,
  HardSigmoid = function(x, a, b) return (x * scalar(x, a or 0.2) + scalar(x, b or 0.5)):clamp(0, 1) end,
  LeakyRelu = function(x, a) return fl.where(x:lt(scalar(x, 0)), x * scalar(x, a or 0.01), x) end,
  Affine = function(x, a, b) return x * scalar(x, a or 1) + scalar(x, b or 0) end,
}

-- the activations the rnn op has (graph/op.c's names)
local RNN_OP_ACT = {Sigmoid = true, Tanh = true, Relu = true, Softsign = true, Softplus = true}

local function recurrent(kind)
  local NG = ({RNN = 1, GRU = 3, LSTM = 4})[kind]
  local DEFAULT = ({RNN = {"Tanh"}, GRU = {"Sigmoid", "Tanh"}, LSTM = {"Sigmoid", "Tanh", "Tanh"}})[kind]
  return function(node, attrs)
    known_attrs(node, attrs, set("activation_alpha", "activation_beta", "activations", "clip", "direction",
                                "hidden_size", "input_forget", "layout", "linear_before_reset"))
    local dir = attr(attrs, "direction", "forward")
    if dir ~= "forward" and dir ~= "reverse" and dir ~= "bidirectional" then node_error(node, "direction '%s'", dir) end
    local nd = dir == "bidirectional" and 2 or 1
    if attr(attrs, "input_forget", 0) ~= 0 then unsupported(node, "input_forget = 1") end
    local lbr = attr(attrs, "linear_before_reset", 0) ~= 0
    local layout = attr(attrs, "layout", 0)
    local clip = attrs.clip
    local names = attrs.activations or {}
    -- the rnn op expresses the node unless an activation is one it lacks
    -- or has parameters
    local as_op = not attrs.activation_alpha and not attrs.activation_beta
    for k = 1, nd * #DEFAULT do
      local nm = names[k] or DEFAULT[(k - 1) % #DEFAULT + 1]
      if not RNN_OP_ACT[nm] then as_op = false end
    end
    local acts = {}
    for d = 1, nd do
      for g = 1, #DEFAULT do
        local k = (d - 1) * #DEFAULT + g
        local nm = names[k] or DEFAULT[g]
        local f = RNN_ACT[nm]
        if not f then unsupported(node, "activation %s", tostring(nm)) end
        local a, b = attrs.activation_alpha and attrs.activation_alpha[k], attrs.activation_beta and attrs.activation_beta[k]
        acts[k] = function(x) return f(x, a, b) end
      end
    end
    local function fused(ins)
      local X, W, R = T(node, ins[1], "X"), T(node, ins[2], "W"), T(node, ins[3], "R")
      need_float(node, X)
      if attrs.hidden_size and R:dim() == 3 and attrs.hidden_size ~= R.shape[3] then
        node_error(node, "hidden_size %d, R of %s", attrs.hidden_size, tostring(R.shape[3]))
      end
      local lv = ins[5]
      if lv ~= nil and not is_tensor(lv) and lv.wide then lv = lv.t end   -- int32 lengths are exact
      local lens = lv and T(node, lv, "sequence_lens")
      if lens and lens.dtype ~= "int64" then lens = lens:to("int64") end
      local h0 = ins[6] and T(node, ins[6], "initial_h")
      local c0 = kind == "LSTM" and ins[7] and T(node, ins[7], "initial_c")
      if layout == 1 then                                 -- the op takes layout 0
        X = X:transpose(1, 2)
        h0 = h0 and h0:transpose(1, 2)
        c0 = c0 and c0:transpose(1, 2)
      end
      local act
      if attrs.activations then
        act = {}
        for k = 1, nd * #DEFAULT do act[k] = names[k] or DEFAULT[(k - 1) % #DEFAULT + 1] end
      end
      local y, yh, yc = fl.rnn(X, W, R, {
        cell = kind:lower(), direction = dir, bias = ins[4] and T(node, ins[4], "B"),
        sequence_lens = lens, initial_h = h0, initial_c = c0 or nil,
        peepholes = kind == "LSTM" and ins[8] and T(node, ins[8], "P") or nil,
        clip = attrs.clip, linear_before_reset = lbr, activations = act})
      if layout == 1 then
        y = y:permute({3, 1, 2, 4})
        yh, yc = yh:transpose(1, 2), yc and yc:transpose(1, 2)
      end
      return {y, yh, yc}
    end
    if as_op then return fused end
    return function(ins)
      local X, W, R = T(node, ins[1], "X"), T(node, ins[2], "W"), T(node, ins[3], "R")
      need_float(node, X)
      if layout == 1 then X = X:transpose(1, 2) end         -- [seq, batch, input]
      -- the steps unroll: a dynamic sequence length is made static here
      -- (a new length compiles again), the batch stays dynamic
      local S, B = static_size(X.shape[1]), X.shape[2]
      local H = R.shape[3]
      if attrs.hidden_size and attrs.hidden_size ~= H then node_error(node, "hidden_size %d, R of %d", attrs.hidden_size, H) end
      local Bias = ins[4] and T(node, ins[4], "B")
      local lv = ins[5]
      if lv ~= nil and not is_tensor(lv) and lv.wide then lv = lv.t end   -- int32 lengths are exact
      local lens = lv and T(node, lv, "sequence_lens")
      local h0 = ins[6] and T(node, ins[6], "initial_h")
      local c0 = kind == "LSTM" and ins[7] and T(node, ins[7], "initial_c")
      local P = kind == "LSTM" and ins[8] and T(node, ins[8], "P")
      if layout == 1 then
        h0 = h0 and h0:transpose(1, 2)
        c0 = c0 and c0:transpose(1, 2)
      end
      local zero = fl.zeros({B, H}, {dtype = X.dtype})
      local Y, Yh, Yc = {}, {}, {}
      for d = 1, nd do
        local reverse = dir == "reverse" or d == 2
        local Wd, Rd = W:narrow(1, d, 1):squeeze(1), R:narrow(1, d, 1):squeeze(1)
        local function gate(M, g) return M:narrow(1, (g - 1) * H + 1, H) end
        local function bias(part, g)                     -- part 0: Wb, 1: Rb
          if not Bias then return nil end
          return Bias:narrow(1, d, 1):squeeze(1):narrow(1, part * NG * H + (g - 1) * H + 1, H)
        end
        local function act(g, x) return acts[(d - 1) * #DEFAULT + g](x) end
        local function clipped(x) return clip and x:clamp(-clip, clip) or x end
        local h = h0 and h0:narrow(1, d, 1):squeeze(1) or zero
        local c = c0 and c0:narrow(1, d, 1):squeeze(1) or zero
        local xw = {}                                    -- X W^T per gate, all steps at once
        for g = 1, NG do
          xw[g] = X:matmul(gate(Wd, g):transpose(1, 2))
          local wb = bias(0, g)
          if wb then xw[g] = xw[g] + wb end
        end
        local out = {}
        for step = 1, S do
          local t = reverse and S - step + 1 or step
          local function pre(g, hh)
            local v = xw[g]:narrow(1, t, 1):squeeze(1) + hh:matmul(gate(Rd, g):transpose(1, 2))
            local rb = bias(1, g)
            return rb and v + rb or v
          end
          local hn, cn
          if kind == "RNN" then
            hn = act(1, clipped(pre(1, h)))
          elseif kind == "GRU" then
            local z = act(1, clipped(pre(1, h)))
            local r = act(1, clipped(pre(2, h)))
            local hh
            if lbr then
              local rh = h:matmul(gate(Rd, 3):transpose(1, 2))
              local rb = bias(1, 3)
              if rb then rh = rh + rb end
              local xv = xw[3]:narrow(1, t, 1):squeeze(1)
              hh = act(2, clipped(xv + r * rh))
            else
              hh = act(2, clipped(pre(3, r * h)))
            end
            hn = (scalar(z, 1) - z) * hh + z * h
          else
            local p = P and P:narrow(1, d, 1):squeeze(1)
            local function peep(k, cc) return p and p:narrow(1, (k - 1) * H + 1, H) * cc or nil end
            local vi, vf = pre(1, h), pre(3, h)
            if p then vi, vf = vi + peep(1, c), vf + peep(3, c) end
            local i, f = act(1, clipped(vi)), act(1, clipped(vf))
            local g = act(2, clipped(pre(4, h)))
            cn = f * c + i * g
            local vo = pre(2, h)
            if p then vo = vo + peep(2, cn) end
            local o = act(1, clipped(vo))
            hn = o * act(3, cn)
          end
          if lens then                                    -- a finished sequence keeps its state
            local live = lens:reshape({B, 1}):gt(fl.full({}, t - 1, {dtype = "int64"}))
            hn = fl.where(live, hn, h)
            if cn then cn = fl.where(live, cn, c) end
            out[t] = fl.where(live, hn, zero)
          else
            out[t] = hn
          end
          h, c = hn, cn or c
        end
        Y[d] = fl.stack and fl.stack(out, 1) or fl.cat((function()
          local u = {}
          for k = 1, S do u[k] = out[k]:unsqueeze(1) end
          return u
        end)(), 1)
        Yh[d], Yc[d] = h:unsqueeze(1), c:unsqueeze(1)
      end
      local y = fl.cat((function()
        local u = {}
        for d = 1, nd do u[d] = Y[d]:unsqueeze(2) end
        return u
      end)(), 2)                                          -- [seq, dirs, batch, hidden]
      local yh, yc = fl.cat(Yh, 1), fl.cat(Yc, 1)
      if layout == 1 then
        y = y:permute({3, 1, 2, 4})
        yh, yc = yh:transpose(1, 2), yc:transpose(1, 2)
      end
      return {y, yh, kind == "LSTM" and yc or nil}
    end
  end
end
OPS.RNN = recurrent("RNN")
OPS.GRU = recurrent("GRU")
OPS.LSTM = recurrent("LSTM")

-- TopK by k rounds of argmax (no sort among fuselab's ops): each round
-- takes the first largest that is left (ties go to the smaller index, as
-- ONNX asks) and sets it below everything; smallest is the largest of -x.
-- k is a constant (the exporters' k).  A value equal to the sentinel (-inf,
-- or int64's lowest) may be chosen twice.
OPS.TopK = function(node, attrs, opset)
  known_attrs(node, attrs, set("axis", "largest", "sorted"))
  local largest = attr(attrs, "largest", 1) ~= 0
  return function(ins)
    local x = T(node, ins[1])
    local k = opset < 10 and attrs.k or ints(node, ins[2], "K")[1]
    local d = axis(node, attr(attrs, "axis", -1), x:dim())
    local n = x.shape[d]
    if math.type(k) ~= "integer" or k < 0 or (type(n) == "number" and k > n) then
      node_error(node, "K = %s for a dim of %s", tostring(k), tostring(n))
    end
    if x.dtype == "bool" then unsupported(node, "TopK of bools") end
    local cur = largest and x or -x
    local low = fl.full({}, x.dtype == "int64" and math.mininteger or -math.huge, {dtype = x.dtype})
    local zero = fl.full({}, 0, {dtype = x.dtype})
    local pos = iota(n, d, x:dim())
    local vals, idxs = {}, {}
    for i = 1, k do
      local a = cur:argmax(d, true)
      local hit = pos:eq(a)
      vals[i] = fl.where(hit, x, zero):sum(d, true)
      idxs[i] = a
      cur = fl.where(hit, low, cur)
    end
    if k == 0 then
      local s = {table.unpack(x.shape)}
      s[d] = 0
      return {fl.zeros(s, {dtype = x.dtype}), fl.zeros(s, {dtype = "int64"})}
    end
    return {fl.cat(vals, d), fl.cat(idxs, d)}
  end
end

-- Einsum by broadcasting: each operand's letters laid along one order of
-- every letter (the output's first), a letter repeated within an operand
-- reduced to its diagonal, the operands multiplied, the letters not in the
-- output summed.  "..." stands for the same leading dims in each operand.
OPS.Einsum = function(node, attrs)
  known_attrs(node, attrs, set("equation"))
  local eq = attrs.equation
  if type(eq) ~= "string" then node_error(node, "attribute 'equation' is required") end
  eq = eq:gsub("%s", "")
  local lhs, rhs = eq:match("^([^%-]*)%->(.*)$")
  if not lhs then lhs = eq end
  local terms = {}
  for term in (lhs .. ","):gmatch("([^,]*),") do terms[#terms + 1] = term end
  return function(ins)
    if #ins ~= #terms then node_error(node, "%d operands for %d terms", #ins, #terms) end
    local ELL = "ABCDEFGHIJ"                          -- the letters "..." stands for
    local nell = 0
    local subs = {}
    for i, term in ipairs(terms) do
      local x = T(node, ins[i])
      local letters = term:gsub("%.%.%.", "")
      if #letters > x:dim() then node_error(node, "term '%s' for an input of %d dims", term, x:dim()) end
      if term:find("...", 1, true) then nell = math.max(nell, x:dim() - #letters) end
      subs[i] = {x = x, term = term}
    end
    local sizes, order, seen = {}, {}, {}
    for _, s in ipairs(subs) do
      local e = s.x:dim() - #(s.term:gsub("%.%.%.", ""))
      local ell = ELL:sub(nell - e + 1, nell)        -- right-aligned, as broadcasting
      s.letters = s.term:gsub("%.%.%.", ell)
      for j = 1, #s.letters do
        local c = s.letters:sub(j, j)
        if not c:match("[%a]") then node_error(node, "equation '%s'", eq) end
        local n = s.x.shape[j]
        if sizes[c] == nil or sizes[c] == 1 then sizes[c] = n
        elseif n ~= 1 and n ~= sizes[c] then node_error(node, "letter %s of sizes %s and %s", c, tostring(sizes[c]), tostring(n)) end
      end
    end
    local out
    if rhs then out = rhs:gsub("%.%.%.", ELL:sub(1, nell))
    else
      local count = {}
      for _, s in ipairs(subs) do for c in s.letters:gmatch(".") do count[c] = (count[c] or 0) + 1 end end
      local once = {}
      for c, n in pairs(count) do if n == 1 and not ELL:find(c, 1, true) then once[#once + 1] = c end end
      table.sort(once)
      out = ELL:sub(1, nell) .. table.concat(once)
    end
    for c in out:gmatch(".") do
      if not sizes[c] then node_error(node, "output letter %s in no input", c) end
      order[#order + 1] = c; seen[c] = #order
    end
    local nout = #order
    for _, s in ipairs(subs) do
      for c in s.letters:gmatch(".") do
        if not seen[c] then order[#order + 1] = c; seen[c] = #order end
      end
    end
    local prodt
    for _, s in ipairs(subs) do
      local x, letters = s.x, s.letters
      -- a repeated letter: its diagonal (x times the identity, one copy summed)
      local j = 1
      while j <= #letters do
        local c = letters:sub(j, j)
        local k2 = letters:find(c, j + 1, true)
        if k2 then
          local n = x.shape[j]
          local r = x:dim()
          local eye = iota(n, j, r):eq(iota(n, k2, r)):to(x.dtype)
          x = (x * eye):sum(k2)
          letters = letters:sub(1, k2 - 1) .. letters:sub(k2 + 1)
        else
          j = j + 1
        end
      end
      -- lay its letters along the common order, size 1 where absent
      local perm, shape = {}, {}
      local where = {}
      for q = 1, #letters do where[letters:sub(q, q)] = q end
      for _, c in ipairs(order) do if where[c] then perm[#perm + 1] = where[c] end end
      if #perm > 0 then x = x:permute(perm) end
      local q = 0
      for _, c in ipairs(order) do
        if where[c] then q = q + 1; shape[#shape + 1] = x.shape[q] else shape[#shape + 1] = 1 end
      end
      x = x:reshape(shape)
      prodt = prodt and prodt * x or x
    end
    local dims = {}
    for q = nout + 1, #order do dims[#dims + 1] = q end
    local y = #dims > 0 and prodt:sum(dims) or prodt
    if nout == 0 and y:dim() > 0 then y = y:reshape({}) end
    return {y}
  end
end

-- CumSum: the axis is an input (a constant in every export: transformers'
-- decoder masks count positions with it).
OPS.CumSum = function(node, attrs)
  known_attrs(node, attrs, set("exclusive", "reverse"))
  local ex, rev = attr(attrs, "exclusive", 0) ~= 0, attr(attrs, "reverse", 0) ~= 0
  return function(ins)
    local x = T(node, ins[1])
    local a = ints(node, ins[2], "axis")
    if #a ~= 1 then node_error(node, "axis must hold one value") end
    return {x:cumsum(axis(node, a[1], x:dim()), {exclusive = ex, reverse = rev})}
  end
end

-- CumProd (opset 26): the running product along the axis, in log2(n)
-- steps (each multiplies by the partial products 2^k places before, ones
-- past the start: Hillis and Steele's scan).  Integers are exact (a
-- wrapping product does not depend on the order); floats round in
-- another order than one running product, within an ulp or so per step.
OPS.CumProd = function(node, attrs)
  known_attrs(node, attrs, set("exclusive", "reverse"))
  local ex, rev = attr(attrs, "exclusive", 0) ~= 0, attr(attrs, "reverse", 0) ~= 0
  return function(ins)
    local x = T(node, ins[1])
    if x.dtype == "bool" then node_error(node, "an input of dtype bool") end
    local a = ints(node, ins[2], "axis")
    if #a ~= 1 then node_error(node, "axis must hold one value") end
    local r = x:dim()
    local d = axis(node, a[1], r)
    local n = x.shape[d]
    if type(n) ~= "number" then unsupported(node, "a product along a dynamic size") end
    local one = x.dtype == "int64" and 1 or 1.0
    -- y moved `by` places along d, ones coming in at the start
    local function shifted(y, by)
      local pads = {}
      for k = 1, 2 * r do pads[k] = 0 end
      pads[d], pads[d + r] = by, -by
      return fl.pad(y, pads, {value = one})
    end
    local y = rev and x:flip({d}) or x
    if ex and n > 0 then y = shifted(y, 1) end
    local step = 1
    while step < n do
      y = y * shifted(y, step)
      step = step * 2
    end
    if rev then y = y:flip({d}) end
    return {y}
  end
end

-- GroupNormalization (opsets 18 and 21): the channels in num_groups groups,
-- each normalized over its channels and the spatial dims (in float32, the
-- stash type), then a per-channel scale and bias (opset 18's scale and bias
-- are per group, repeated over its channels).
OPS.GroupNormalization = function(node, attrs, opset)
  known_attrs(node, attrs, set("epsilon", "num_groups", "stash_type"))
  if attr(attrs, "stash_type", 1) ~= 1 then unsupported(node, "stash_type %d", attrs.stash_type) end
  local eps, G = attr(attrs, "epsilon", 1e-5), attrs.num_groups
  if math.type(G) ~= "integer" or G < 1 then node_error(node, "num_groups %s (a positive integer)", tostring(G)) end
  return function(ins)
    local x, scale, bias = T(node, ins[1]), T(node, ins[2], "scale"), T(node, ins[3], "bias")
    need_float(node, x)
    local s = x.shape
    if #s < 3 then node_error(node, "input of %d dims (N, C, ...)", #s) end
    local N, C = s[1], s[2]
    if C % G ~= 0 then node_error(node, "%d channels in %d groups", C, G) end
    local xs = (x.dtype == "float32" and x or x:to("float32")):reshape({N, G, -1})
    local mean = xs:mean(3, true)
    local c = xs - mean
    local y = (c / ((c * c):mean(3, true) + fl.full({}, eps)):sqrt()):reshape(s)
    if y.dtype ~= x.dtype then y = y:to(x.dtype) end
    if opset < 21 then                                    -- per group: repeat over its channels
      scale = scale:reshape({G, 1}):expand({G, C // G}):reshape({C})
      bias = bias:reshape({G, 1}):expand({G, C // G}):reshape({C})
    end
    local cs = {C}
    for _ = 3, #s do cs[#cs + 1] = 1 end
    return {y * scale:reshape(cs) + bias:reshape(cs)}
  end
end

-- Scatters as one-hot masks (no scatter op among fuselab's): hit[p] says
-- some update lands on position p, and the updates landing there combine
-- by the reduction: none (a duplicate index sums, where ONNX leaves the
-- order open), add, max, min, mul.  mul has no product reduction to use:
-- it multiplies the updates in one at a time, in their order (the
-- reference's, so a float product rounds as its does), up to MUL_UPDATES.
-- u: the updates [U, R], x: the data [P, R], m: the mask, [U, P] (update
-- row k lands on row p) or [U, P, R] (element (k, q) lands on (p, q)).
local MUL_UPDATES = 1024
local function scatter_combine(node, x, m, u, reduction)
  local mu = m:dim() == 2 and m:unsqueeze(3) or m        -- [U, P, 1 or R]
  local hit = mu:to("int64"):sum(1):gt(i64(0))           -- [P, 1 or R]
  if reduction == "none" or reduction == "add" then
    local dt = x.dtype == "bool" and "int64" or x.dtype
    local s = fl.where(mu, u:unsqueeze(2):to(dt), fl.full({}, 0, {dtype = dt})):sum(1)   -- [P, R]
    if reduction == "add" then return (x:to(dt) + s):to(x.dtype) end
    return fl.where(hit, s:to(x.dtype), x)
  elseif reduction == "max" or reduction == "min" then
    local big = reduction == "max" and -math.huge or math.huge
    if x.dtype == "int64" then big = reduction == "max" and math.mininteger or math.maxinteger end
    local e = fl.where(mu, u:unsqueeze(2), fl.full({}, big, {dtype = x.dtype}))
    local v = reduction == "max" and e:amax(1) or e:amin(1)
    return fl.where(hit, reduction == "max" and fl.maximum(x, v) or fl.minimum(x, v), x)
  elseif reduction == "mul" then
    local U = mu.shape[1]
    if type(U) ~= "number" or U > MUL_UPDATES then
      unsupported(node, "reduction 'mul' of %s updates (%d at most)", tostring(U), MUL_UPDATES)
    end
    local dt = x.dtype == "bool" and "int64" or x.dtype   -- a product of bools is their AND
    local y, uu = x:to(dt), u:to(dt)
    for k = 1, U do
      y = fl.where(mu:narrow(1, k, 1):squeeze(1), y * uu:narrow(1, k, 1), y)
    end
    return x.dtype == "bool" and y:ne(i64(0)) or y
  end
  unsupported(node, "reduction '%s'", reduction)
end

OPS.ScatterElements = function(node, attrs)
  known_attrs(node, attrs, set("axis", "reduction"))
  local reduction = attr(attrs, "reduction", "none")
  return function(ins)
    local x, idx, upd = T(node, ins[1], "data"), T(node, ins[2], "indices"), T(node, ins[3], "updates")
    local r = x:dim()
    local d = axis(node, attr(attrs, "axis", 0), r)
    if idx.dtype ~= "int64" then node_error(node, "indices of dtype %s", idx.dtype) end
    if idx:dim() ~= r or upd:dim() ~= r then node_error(node, "indices and updates of the data's rank") end
    for k = 1, r do
      if idx.shape[k] ~= upd.shape[k] then node_error(node, "indices and updates of other shapes") end
      if k ~= d and idx.shape[k] ~= x.shape[k] then unsupported(node, "indices narrower than the data off the axis") end
    end
    local n = x.shape[d]
    if type(n) == "number" then check_indices(node, idx, -n, n - 1, "an index") end
    local it = fl.where(idx:lt(i64(0)), idx + i64(n), idx)
    -- the axis first, the other dims as one: data [n, R], updates [U, R]
    local perm = {d}
    for k = 1, r do if k ~= d then perm[#perm + 1] = k end end
    local xt, ut, itt = x:permute(perm):contiguous(), upd:permute(perm):contiguous(), it:permute(perm):contiguous()
    local R = xt:numel() // n
    local U = ut.shape[1]
    -- update (k, q) lands on (it[k, q], q): per column q, a mask [U, n]
    local m = itt:reshape({U, R}):unsqueeze(2):eq(fl.arange(n):reshape({1, n, 1}))   -- [U, n, R]
    local y = scatter_combine(node, xt:reshape({n, R}), m, ut:reshape({U, R}), reduction)
    local back = {}
    for k = 2, d do back[#back + 1] = k end
    back[#back + 1] = 1
    for k = d + 1, r do back[#back + 1] = k end
    return {y:reshape(xt.shape):permute(back):contiguous()}
  end
end

OPS.Scatter = OPS.ScatterElements          -- its name before opset 11

OPS.ScatterND = function(node, attrs)
  known_attrs(node, attrs, set("reduction"))
  local reduction = attr(attrs, "reduction", "none")
  return function(ins)
    local x, idx, upd = T(node, ins[1], "data"), T(node, ins[2], "indices"), T(node, ins[3], "updates")
    if idx.dtype ~= "int64" then node_error(node, "indices of dtype %s", idx.dtype) end
    local r, q = x:dim(), idx:dim()
    local k = idx.shape[q]
    if type(k) ~= "number" or k < 1 or k > r then node_error(node, "index tuples of %s for data of rank %d", tostring(k), r) end
    -- the first k dims of the data as one of P positions, the rest as R
    local P, R, lin = 1, 1, nil
    for t = 1, k do
      local n = x.shape[t]
      local it = idx:narrow(q, t, 1):squeeze(q)
      if type(n) == "number" then check_indices(node, it, -n, n - 1, "an index") end
      it = fl.where(it:lt(i64(0)), it + i64(n), it)
      lin = lin and lin * i64(n) + it or it
      P = P * n
    end
    for t = k + 1, r do R = R * x.shape[t] end
    local U = lin:numel()
    local m = lin:reshape({U, 1}):eq(fl.arange(P):reshape({1, P}))                 -- [U, P]
    local y = scatter_combine(node, x:reshape({P, R}), m, upd:reshape({U, R}), reduction)
    return {y:reshape(x.shape)}
  end
end

-- TensorScatter (opset 24): a KV cache update.  past [B, ..., M, ...] (M
-- along axis), update [B, ..., S, ...]: the S rows of batch b land at
-- write_indices[b] + s along the axis (mod M in mode circular).  Each cache
-- row reads the update row it receives, if any: s = c - w (mod M when
-- circular), kept where 0 <= s < S.  write_indices out of the op's
-- contract (negative, or past M - S when linear, which the reference
-- refuses) drop the rows that miss the cache.
OPS.TensorScatter = function(node, attrs)
  known_attrs(node, attrs, set("mode", "axis"))
  local mode = attr(attrs, "mode", "linear")
  if mode ~= "linear" and mode ~= "circular" then node_error(node, "mode '%s' (linear or circular)", clean(tostring(mode))) end
  return function(ins)
    local past, upd = T(node, ins[1], "past_cache"), T(node, ins[2], "update")
    local r = past:dim()
    if r < 2 then node_error(node, "a past_cache of rank %d (at least 2)", r) end
    local ax = axis(node, attr(attrs, "axis", -2), r)
    if ax == 1 then node_error(node, "axis 0 (the batch dim)") end
    if upd:dim() ~= r or upd.dtype ~= past.dtype then node_error(node, "update must have past_cache's rank and dtype") end
    for d = 1, r do
      if d ~= ax and upd.shape[d] ~= past.shape[d] then node_error(node, "update and past_cache differ in dim %d", d) end
    end
    local B, M, S = past.shape[1], past.shape[ax], upd.shape[ax]
    if type(M) ~= "number" or type(S) ~= "number" then unsupported(node, "a symbolic sequence length") end
    if S > M then node_error(node, "an update of %d rows for a cache of %d", S, M) end
    if S == 0 then return {past} end
    local w
    if ins[3] ~= nil then
      w = T(node, ins[3], "write_indices")
      if w.dtype ~= "int64" or w:dim() ~= 1 or w.shape[1] ~= B then node_error(node, "write_indices must be int64 [batch]") end
    else
      w = fl.zeros({B}, {dtype = "int64"})
    end
    local P, R = prod(past.shape, 2, ax - 1), prod(past.shape, ax + 1, r)
    local s = fl.arange(M):reshape({1, M}) - w:reshape({B, 1})    -- [B, M]
    if mode == "circular" then s = s:remainder(i64(M)) end
    local hit = s:ge(i64(0)):to("int64") * s:lt(i64(S)):to("int64")
    hit = hit:ne(i64(0))
    s = fl.where(hit, s, i64(0))
    -- row (b, p, s) of the update as [B * P * S, R]
    local lin = (fl.arange(B):reshape({B, 1, 1}) * i64(P) + fl.arange(P):reshape({1, P, 1})) * i64(S)
                + s:reshape({B, 1, M})                             -- [B, P, M]
    local u = upd:reshape({B * P * S, R})
    local dt = past.dtype
    if dt == "bool" then u = u:to("int64") end
    local g = fl.embedding(lin, u)                                -- [B, P, M, R]
    if dt == "bool" then g = g:ne(i64(0)) end
    local y = fl.where(hit:reshape({B, 1, M, 1}), g, past:reshape({B, P, M, R}))
    return {y:reshape(past.shape)}
  end
end

-- GatherND; with batch_dims b the first b dims of data and indices are
-- one batch (shared), and each batch's index tuples address its own
-- slice: the tuple's linear index is offset by its batch's P positions.
OPS.GatherND = function(node, attrs)
  known_attrs(node, attrs, set("batch_dims"))
  local b = attr(attrs, "batch_dims", 0)
  if math.type(b) ~= "integer" or b < 0 then node_error(node, "batch_dims %s (a non-negative integer)", tostring(b)) end
  return function(ins)
    local iv = ins[2]
    if iv ~= nil and not is_tensor(iv) and iv.wide then iv = iv.t end
    local x, idx = T(node, ins[1], "data"), T(node, iv, "indices")
    if idx.dtype ~= "int64" then node_error(node, "indices of dtype %s", idx.dtype) end
    local q, r = idx:dim(), x:dim()
    if b >= q or b >= r then node_error(node, "batch_dims %d for indices of rank %d and data of rank %d", b, q, r) end
    local k = idx.shape[q]
    if q < 1 or type(k) ~= "number" or k > r - b then
      node_error(node, "indices address %s dims of a %d-d input (%d of them batch dims)", tostring(k), r, b)
    end
    for j = 1, b do
      if idx.shape[j] ~= x.shape[j] then node_error(node, "batch dim %d of indices and data differ", j) end
    end
    local lin = nil
    for j = 1, k do
      local n = x.shape[b + j]
      local ij = idx:narrow(q, j, 1):squeeze(q)
      ij = fl.where(ij:lt(i64(0)), ij + i64(n), ij)
      lin = lin and (lin * i64(n) + ij) or ij
    end
    local rest = {}
    for j = b + k + 1, r do rest[#rest + 1] = x.shape[j] end
    local B, P = prod(x.shape, 1, b), prod(x.shape, b + 1, b + k)
    if b > 0 then
      -- the batch of each tuple: arange(B) over the batch dims of lin
      local bs = {B}
      for _ = b + 1, q - 1 do bs[#bs + 1] = 1 end
      local lead = {}
      for j = 1, q - 1 do lead[j] = idx.shape[j] end
      lin = (lin:reshape({B, table.unpack(lead, b + 1, q - 1)}) + fl.arange(B):reshape(bs) * i64(P)):reshape(lead)
    end
    local dt = x.dtype
    local xt = x:reshape({B * P, prod(rest, 1, #rest)})
    if dt == "bool" then xt = xt:to("int64") end
    local g = fl.embedding(lin, xt)
    local shape = {}
    for j = 1, q - 1 do shape[#shape + 1] = idx.shape[j] end
    for _, n in ipairs(rest) do shape[#shape + 1] = n end
    g = g:reshape(shape)
    if dt == "bool" then g = g:to("bool") end
    return {g}
  end
end

-- Resize (and Upsample): each output position's source index, per axis,
-- as ONNX's reference computes it (in double: the coordinate
-- transformation, then the rounding mode, then the edge clamp), gathered
-- axis by axis; linear and cubic modes (antialiased too) gather a few
-- rows per output and weigh them (resize_nearest below).  Scales, sizes
-- and roi computed from graph inputs are read as values: a graph break
-- under fl.compile.

-- The float list a constant holds (scales, roi), or a computed one's
-- values (eagerly, or through a graph break).
local function floats(node, v, what)
  if v == nil then return nil end
  if not is_tensor(v) then return (ints(node, v, what)) end
  if v:numel() == 0 then return {} end   -- an empty input: "not given"
  -- read as it is (scales and roi are 1-D): a reshape first would be a
  -- new value under capture, whose elements are no longer known.  Values
  -- computed from graph inputs are a graph break under fl.compile (as
  -- concrete's), which one graph (fl.capture) cannot take.
  local ok, l = pcall(v.tolist, v)
  if not ok then
    if not fl._tracing() then error(l, 0) end
    unsupported(node, "%s computed from graph inputs under capture (a data-dependent shape)", what)
  end
  if type(l) ~= "table" then return {l} end
  if v:dim() > 1 then l = v:reshape({-1}):tolist() end
  return l
end

-- Output position o's coordinate in the input (ONNX's
-- coordinate_transformation_mode).  The resized length is n_in x scale
-- before rounding, as ONNX's reference takes it (a scale of 0.6 over 4
-- aligns corners over 2.4, not 2).
local function resize_coord(node, o, n_in, n_out, scale, coord, roi)
  local len = n_in * scale
  if coord == "tf_crop_and_resize" then
    -- roi = {start, end} of this axis, as fractions of n_in - 1
    local x = len == 1 and (roi[2] - roi[1]) * (n_in - 1) / 2 or o * (roi[2] - roi[1]) * (n_in - 1) / (len - 1)
    return x + roi[1] * (n_in - 1)
  elseif coord == "half_pixel" then return (o + 0.5) / scale - 0.5
  elseif coord == "asymmetric" then return o / scale
  elseif coord == "pytorch_half_pixel" then return len > 1 and (o + 0.5) / scale - 0.5 or 0
  elseif coord == "tf_half_pixel_for_nn" then return (o + 0.5) / scale
  elseif coord == "align_corners" then return len == 1 and 0 or o * (n_in - 1) / (len - 1)
  elseif coord == "half_pixel_symmetric" then
    local offset = n_in / 2 * (1 - n_out / (n_in * scale))
    return offset + (o + 0.5) / scale - 0.5
  end
  unsupported(node, "coordinate_transformation_mode '%s'", coord)
end

local function nearest_index(node, o, n_in, n_out, scale, coord, mode, roi)
  local x = resize_coord(node, o, n_in, n_out, scale, coord, roi)
  local f = math.floor(x)
  local i
  if x == f then i = f
  else
    local r = x - f
    local left
    if mode == "round_prefer_floor" then left = r <= 0.5
    elseif mode == "round_prefer_ceil" then left = r < 0.5
    elseif mode == "floor" then left = true
    elseif mode == "ceil" then left = false
    else unsupported(node, "nearest_mode '%s'", mode) end
    i = left and f or f + 1
  end
  return math.max(0, math.min(n_in - 1, math.tointeger(i) or i))
end

-- Cubic convolution weights (Keys, coefficient A) of the taps at offsets
-- -1, 0, 1, 2 from floor(x), t = x - floor(x).
local function cubic_weights(t, A)
  local function near(s) return ((A + 2) * s - (A + 3)) * s * s + 1 end          -- |s| <= 1
  local function far(s) return ((A * s - 5 * A) * s + 8 * A) * s - 4 * A end     -- 1 < |s| < 2
  return {far(t + 1), near(t), near(1 - t), far(2 - t)}
end

-- Antialiased taps (downscaling by scale < 1): the linear or cubic filter
-- widened by 1 / scale, so every input row under it counts, and its
-- weights normalized to sum 1 (ONNX's antialias = 1).  The taps around
-- coordinate c are f + i for i in [start, 1 - start], f the row left of c
-- (c - 1 at an integer c, as ONNX's reference picks its window), each
-- weighted by the filter at (f + i - c) x scale.
local function antialias_taps(c, scale, interp, A)
  local s = math.min(scale, 1)
  local reach = interp == "cubic" and 2 or 1
  local start = math.floor(-reach / s) + 1
  local f = math.floor(c)
  if f == c then f = c - 1 end
  local idx, ws, sum = {}, {}, 0
  for i = start, 1 - start do
    local x = math.abs((f + i - c) * s)
    local w
    if interp == "linear" then w = math.max(0, 1 - x)
    elseif x <= 1 then w = ((A + 2) * x - (A + 3)) * x * x + 1
    elseif x < 2 then w = ((A * x - 5 * A) * x + 8 * A) * x - 4 * A
    else w = 0 end
    idx[#idx + 1], ws[#ws + 1], sum = f + i, w, sum + w
  end
  for k = 1, #ws do ws[k] = ws[k] / sum end
  return idx, ws
end

-- Resizing one dim at a time: the dim moved to the front, its input rows
-- gathered by index, one row per output for nearest (mode, the rounding),
-- two or four with weights for linear and cubic (interp): rows past the
-- edge repeat it, as ONNX's reference pads, or with exclude they weigh
-- nothing and the rest are renormalized.  opt: roi (2 x rank fractions)
-- and extrapolation (the value of outputs whose coordinate falls outside
-- the input) for tf_crop_and_resize, antialias for linear and cubic.
local function resize_nearest(node, x, scales, sizes, coord, mode, interp, A, exclude, opt)
  opt = opt or {}
  local r = x:dim()
  local y = x
  local total = 1.0
  for d = 1, r do
    local n = sizes and sizes[d] or (type(x.shape[d]) == "number" and math.floor(x.shape[d] * scales[d]) or 1)
    if type(n) ~= "number" then n = 1 end        -- a dynamic dim kept (below)
    total = total * math.max(n, 0)
    check_count(node, n, "Resize to a dim")
  end
  check_count(node, total, "Resize to a tensor")
  for d = 1, r do
    local n_in = x.shape[d]
    -- a dynamic dim (the batch) kept at its size is no resize: skipped, as
    -- the static path below skips it, so the dim stays dynamic
    local roi = opt.roi and {opt.roi[d], opt.roi[r + d]}
    local whole = not roi or (roi[1] == 0 and roi[2] == 1)
    local kept = type(n_in) ~= "number" and whole and (sizes and sizes[d] == n_in or not sizes and scales[d] == 1)
    if type(n_in) ~= "number" and not kept then unsupported(node, "resizing a dynamic dim") end
    if kept then goto next_dim end
    local n_out, scale
    if sizes then
      n_out = math.tointeger(sizes[d])
      scale = scales and scales[d] or n_out / n_in       -- both: a kept aspect ratio
    else
      scale = scales[d]
      n_out = math.floor(n_in * scale)
    end
    if not n_out or n_out < 0 then node_error(node, "output size of dim %d", d) end
    if n_out ~= n_in or scale ~= 1 or not whole then
      local ntap = interp == "cubic" and 4 or interp == "linear" and 2 or 1
      if opt.antialias and interp ~= "nearest" then
        ntap = #antialias_taps(0.5, scale, interp, A)
      end
      local taps, outside, any_outside = {}, {}, false
      for k = 1, ntap do taps[k] = {idx = {}, w = {}} end
      for o = 0, n_out - 1 do
        if coord == "tf_crop_and_resize" then
          local c = resize_coord(node, o, n_in, n_out, scale, coord, roi)
          outside[o + 1] = c < 0 or c > n_in - 1
          any_outside = any_outside or outside[o + 1]
        end
        if interp == "nearest" then
          taps[1].idx[o + 1] = nearest_index(node, o, n_in, n_out, scale, coord, mode, roi)
        else
          local c = resize_coord(node, o, n_in, n_out, scale, coord, roi)
          local f = math.floor(c)
          local is, ws
          if opt.antialias then is, ws = antialias_taps(c, scale, interp, A)
          else
            ws = interp == "linear" and {1 - (c - f), c - f} or cubic_weights(c - f, A)
            local first = interp == "linear" and f or f - 1
            is = {}
            for k = 1, ntap do is[k] = first + k - 1 end
          end
          local sum = 0
          for k = 1, ntap do
            local i = is[k]
            if exclude and (i < 0 or i > n_in - 1) then ws[k] = 0 end
            sum = sum + ws[k]
            taps[k].idx[o + 1] = math.max(0, math.min(n_in - 1, i))
          end
          for k = 1, ntap do taps[k].w[o + 1] = exclude and sum ~= 0 and ws[k] / sum or ws[k] end
        end
      end
      local wshape = {}                                 -- a tap's weights along d
      for k = 1, r do wshape[k] = k == d and n_out or 1 end
      local g
      for k = 1, ntap do
        local gk = take_along(y, d, taps[k].idx)
        if interp ~= "nearest" and n_out > 0 then
          gk = gk * fl.tensor(taps[k].w, {dtype = "float32"}):to(x.dtype):reshape(wshape)
        end
        g = g and g + gk or gk
      end
      if any_outside then
        -- tf_crop_and_resize's outputs outside the input: the extrapolation
        -- value, which the later dims then interpolate as ONNX's reference does
        local m = fl.tensor(outside, {dtype = "bool"}):reshape(wshape)
        g = fl.where(m, fl.full({}, opt.extrapolation):to(x.dtype), g)
      end
      y = g
    end
    ::next_dim::
  end
  return y:contiguous()
end

OPS.Resize = function(node, attrs, opset)
  known_attrs(node, attrs, set("mode", "coordinate_transformation_mode", "nearest_mode",
                              "cubic_coeff_a", "exclude_outside", "extrapolation_value",
                              "antialias", "keep_aspect_ratio_policy", "axes"))
  local antialias = attr(attrs, "antialias", 0) ~= 0
  local policy = attr(attrs, "keep_aspect_ratio_policy", "stretch")
  if policy ~= "stretch" and policy ~= "not_larger" and policy ~= "not_smaller" then
    node_error(node, "keep_aspect_ratio_policy '%s'", policy)
  end
  local mode = attr(attrs, "mode", "nearest")
  if mode ~= "nearest" and mode ~= "linear" and mode ~= "cubic" then node_error(node, "mode '%s'", mode) end
  if antialias and mode == "nearest" then node_error(node, "antialias = 1 in mode 'nearest'") end
  local A, exclude = attr(attrs, "cubic_coeff_a", -0.75), attr(attrs, "exclude_outside", 0) ~= 0
  local coord = attr(attrs, "coordinate_transformation_mode", opset < 11 and "asymmetric" or "half_pixel")
  local crop = coord == "tf_crop_and_resize"
  if crop and opset < 11 then node_error(node, "coordinate_transformation_mode '%s' before opset 11", coord) end
  local nmode = attr(attrs, "nearest_mode", opset < 11 and "floor" or "round_prefer_floor")
  return function(ins)
    local x = T(node, ins[1])
    local scales, sizes
    if opset < 11 then scales = floats(node, ins[2], "scales")
    else
      if ins[3] ~= nil then scales = floats(node, ins[3], "scales") end
      if scales and #scales == 0 then scales = nil end
      if ins[4] ~= nil then sizes = (ints(node, ins[4], "sizes")) end
    end
    if not scales and not sizes then node_error(node, "neither scales nor sizes") end
    if attrs.axes then
      -- scales or sizes for the listed axes only: the others keep their size
      local full = {}
      for d = 1, x:dim() do full[d] = scales and 1.0 or x.shape[d] end
      local given = scales or sizes
      if #given ~= #attrs.axes then node_error(node, "%d scales or sizes for %d axes", #given, #attrs.axes) end
      for i, a in ipairs(attrs.axes) do full[axis(node, a, x:dim())] = given[i] end
      if scales then scales = full else sizes = full end
    end
    if (scales and #scales or #sizes) ~= x:dim() then node_error(node, "scales or sizes for another rank") end
    local roi
    if crop then
      roi = ins[2] ~= nil and floats(node, ins[2], "roi") or {}
      local n = attrs.axes and #attrs.axes or x:dim()
      if #roi ~= 2 * n then node_error(node, "roi of %d values for %d axes (tf_crop_and_resize)", #roi, n) end
      if attrs.axes then
        -- the listed axes' starts, then their ends; the others whole
        local full = {}
        for d = 1, x:dim() do full[d], full[x:dim() + d] = 0.0, 1.0 end
        for i, a in ipairs(attrs.axes) do
          local d = axis(node, a, x:dim())
          full[d], full[x:dim() + d] = roi[i], roi[n + i]
        end
        roi = full
      end
    end
    if sizes and policy ~= "stretch" then
      -- one scale for the given axes, the smallest (not_larger) or largest
      -- (not_smaller) of theirs, each size rounded from it (half to even)
      local pick
      local axes = {}
      sizes = {table.unpack(sizes)}                    -- a constant's own table: not ours to change
      for i, a in ipairs(attrs.axes or {}) do axes[axis(node, a, x:dim())] = true end
      for d = 1, x:dim() do
        if not attrs.axes or axes[d] then
          local s = sizes[d] / x.shape[d]
          if not pick or (policy == "not_larger" and s < pick) or (policy == "not_smaller" and s > pick) then pick = s end
        end
      end
      scales = {}
      for d = 1, x:dim() do
        if not attrs.axes or axes[d] then
          local v = pick * x.shape[d]
          local f = math.floor(v)
          local n = (v - f > 0.5 or (v - f == 0.5 and f % 2 == 1)) and f + 1 or f
          sizes[d], scales[d] = n, pick
        else
          scales[d] = 1.0
        end
      end
    end
    if mode ~= "nearest" then need_float(node, x) end
    return {resize_nearest(node, x, scales, sizes, coord, nmode, mode, A, exclude,
      {roi = roi, extrapolation = attr(attrs, "extrapolation_value", 0.0), antialias = antialias})}
  end
end

OPS.Upsample = function(node, attrs, opset)
  known_attrs(node, attrs, set("mode", "scales", "width_scale", "height_scale"))
  local mode = attr(attrs, "mode", "nearest")
  if mode ~= "nearest" then unsupported(node, "mode '%s' (nearest only)", mode) end
  if opset < 7 then unsupported(node, "Upsample before opset 7") end
  return function(ins)
    local x = T(node, ins[1])
    local scales = opset < 9 and attrs.scales or floats(node, ins[2], "scales")
    if #scales ~= x:dim() then node_error(node, "scales for another rank") end
    return {resize_nearest(node, x, scales, nil, "asymmetric", "floor", "nearest")}
  end
end

-- ---------------------------------------------------------------------------
-- the narrow integer types
-- ---------------------------------------------------------------------------

-- int8..int32 and uint8..uint32 values are held widened to int64, uint64
-- values as their int64 bit pattern (2^63 and up read as negative).  The
-- widened values are exact where no result can leave the type's range:
-- comparisons, max/min, arg reductions and the ops that only move values.
-- Those ops take them (and give them back marked with their type); the
-- order of uint64 values is that of their patterns with the top bit
-- flipped, so the ordering ops flip them on the way in and out.
-- Arithmetic runs on int64 and wraps the result into the type's range
-- (below): the low bits of a sum, difference or product do not depend on
-- the bits above them, so that is the type's own wrap-around.  Every
-- other op refuses them (T).
WIDE = {int8 = true, int16 = true, int32 = true, uint8 = true, uint16 = true, uint32 = true, uint64 = true,
  int4 = true, uint4 = true, int2 = true, uint2 = true}
local INT_BITS = {int8 = 8, int16 = 16, int32 = 32, int64 = 64, uint8 = 8, uint16 = 16, uint32 = 32, uint64 = 64,
  int4 = 4, uint4 = 4, int2 = 2, uint2 = 2}
local UNSIGNED = {uint8 = true, uint16 = true, uint32 = true, uint64 = true, uint4 = true, uint2 = true}
-- the float8 and float4 types, held as float32: only the ops that move
-- values (opts.moves below) take them, as ONNX's own op types allow
SMALLF = {float8e4m3fn = true, float8e4m3fnuz = true, float8e5m2 = true, float8e5m2fnuz = true,
  float4e2m1 = true, float8e8m0 = true}

-- int64 values into type dt's range, as its two's complement wraps them
QUANT_RANGE = {uint8 = {0, 255}, int8 = {-128, 127}, uint16 = {0, 65535}, int16 = {-32768, 32767},
  uint4 = {0, 15}, int4 = {-8, 7}, uint2 = {0, 3}, int2 = {-2, 1}}

local function wrap(t, dt)
  local n = INT_BITS[dt]
  if n == 64 then return t end
  if UNSIGNED[dt] then return t:remainder(i64(1 << n)) end
  local h = 1 << (n - 1)
  return (t + i64(h)):remainder(i64(1 << n)) - i64(h)
end

-- uint64 patterns <-> int64 values in the same order (its own inverse)
local function flip(t) return t + i64(math.mininteger) end
local function flip_u64(t, tag) if tag == "uint64" then return flip(t) end return t end

-- OPS[op] (opts.ops[op] for another domain's table) with the inputs at
-- positions `data` (nil: all) unwrapped; with
-- opts.keep, its int64 results (those at opts.outs, nil: all) are marked
-- with their type again.  opts.pre(t, tag) and opts.post(t, tag) map the
-- unwrapped inputs and the results; opts.same: every input at `data` must
-- hold the one narrow type (arithmetic: an int64 beside an int32 is a
-- model error, not a widening); opts.refuse: the types it cannot take.
local function takes_wide(op, data, opts)
  opts = opts or {}
  local ops = opts.ops or OPS
  local lower = ops[op]
  local at = data and {} or nil
  for _, i in ipairs(data or {}) do at[i] = true end
  local outs = opts.outs and set(table.unpack(opts.outs)) or nil
  ops[op] = function(node, attrs, opset)
    local run = lower(node, attrs, opset)
    return function(ins)
      local tag
      local un = {}
      for i, v in pairs(ins) do
        if (not at or at[i]) and not is_tensor(v) and v.wide then
          if tag and tag ~= v.wide then node_error(node, "inputs of dtypes %s and %s", tag, v.wide) end
          tag = v.wide
          un[i] = v.t
        else
          un[i] = v
        end
      end
      if tag and (opts.refuse and opts.refuse[tag] or SMALLF[tag] and not opts.moves) then
        unsupported(node, "an input of dtype %s", tag)
      end
      if tag and (opts.same or not opts.keep) then
        -- a mix of a narrow type and a held type is a model error
        for i, v in pairs(un) do
          if (not at or at[i]) and ins[i] == v and (opts.same or is_tensor(v) and v.dtype ~= "int64") then
            node_error(node, "inputs of dtypes %s and %s", tag, dtype_of(v))
          end
        end
      end
      if tag and opts.pre then
        for i, v in pairs(un) do
          if (not at or at[i]) and ins[i] ~= v then un[i] = opts.pre(v, tag) end
        end
      end
      local res = run(un)
      if tag and opts.keep then
        for i, o in ipairs(res) do
          if (not outs or outs[i]) and is_tensor(o) then
            if opts.post then o = opts.post(o, tag) end
            if o.dtype == "int64" then res[i] = {wide = tag, t = o} end
          end
        end
      end
      return res
    end
  end
end

-- comparisons and the ordering ops
local ORDER = {pre = flip_u64, post = flip_u64}
for _, op in ipairs({"Less", "LessOrEqual", "Greater", "GreaterOrEqual", "ArgMax", "ArgMin"}) do
  takes_wide(op, nil, ORDER)
end
takes_wide("Equal")
for _, op in ipairs({"Max", "Min", "Clip"}) do takes_wide(op, nil, {keep = true, pre = flip_u64, post = flip_u64}) end
for _, op in ipairs({"ReduceMax", "ReduceMin"}) do
  takes_wide(op, {1}, {keep = true, pre = flip_u64, post = flip_u64})
end
takes_wide("TopK", {1}, {keep = true, outs = {1}, pre = flip_u64, post = flip_u64})
-- Mod's results lie between its operands' values (a uint64 from 2^63 up is
-- a negative int64, whose remainder differs: uint64 has its own, below)
takes_wide("Mod", nil, {keep = true, refuse = set("uint64")})
-- the ops that only move values
takes_wide("Concat", nil, {keep = true, moves = true})
for _, op in ipairs({"Identity", "Reshape", "Transpose", "Squeeze", "Unsqueeze", "Flatten", "Split",
                     "Slice", "Gather", "GatherElements", "Expand", "Tile", "DepthToSpace",
                     "SpaceToDepth", "Trilu", "GatherND"}) do
  takes_wide(op, {1}, {keep = true, moves = true})
end
takes_wide("Where", {2, 3}, {keep = true, moves = true})
takes_wide("TensorScatter", {1, 2}, {keep = true, moves = true})
takes_wide("Pad", {1, 3}, {keep = true})
takes_wide("OneHot", {3}, {keep = true})
-- a max pool compares and moves: the values <= 32 bits are exact in float64
takes_wide("MaxPool", {1}, {keep = true, refuse = set("uint64"),
  pre = function(t) return t:to("float64") end,
  post = function(t) return t:to("int64") end})

-- Arithmetic, wrapped into the type's range.  Division truncates as C's
-- does (int_div), and only INT_MIN / -1 leaves the range (it wraps to
-- INT_MIN, as NumPy's does); a uint64 from 2^63 up would divide as a
-- negative number, so uint64 division has its own (below), and Abs of
-- one is refused.
local ARITH = {keep = true, same = true, post = wrap}
for _, op in ipairs({"Add", "Sub", "Mul", "Sum", "Neg"}) do takes_wide(op, nil, ARITH) end
takes_wide("Div", nil, {keep = true, same = true, post = wrap, refuse = set("uint64")})
takes_wide("Abs", nil, {keep = true, same = true, post = wrap, refuse = set("uint64")})

-- a >> 1 of uint64 patterns, non-negative
local function u64_half(a)
  local neg = a:lt(i64(0))
  return int_div(fl.where(neg, flip(a), a), i64(2)) + fl.where(neg, i64(1 << 62), i64(0))
end

-- The quotient and remainder of uint64 patterns, over their whole range.
-- A divisor from 2^63 up goes into a at most once.  A smaller one divides
-- a >> 1 (a non-negative int64) exactly; twice that quotient leaves a
-- remainder below 2b, so below 2^64, which one step brings below b.  A
-- zero divisor gives 0 and 0, as NumPy's (ONNX leaves it undefined).
local function u64_divmod(a, b)
  local zero, one = i64(0), i64(1)
  local big, none = b:lt(zero), b:eq(zero)
  local bs = fl.where(big, one, fl.where(none, one, b))
  local q = int_div(u64_half(a), bs) * i64(2)
  local r = a - q * bs                                    -- wraps as the patterns do
  local over = flip(r):ge(flip(bs))
  q = q + over:to("int64")
  r = r - fl.where(over, bs, zero)
  local once = flip(a):ge(flip(b))
  q = fl.where(big, once:to("int64"), q)
  r = fl.where(big, fl.where(once, a - b, a), r)
  return fl.where(none, zero, q), fl.where(none, zero, r)
end

-- Div and Mod of uint64 values (both operands uint64), ahead of the
-- signed lowering, which refuses them; Mod's two modes agree on unsigned
-- values.
for op, which in pairs({Div = 1, Mod = 2}) do
  local lower = OPS[op]
  OPS[op] = function(node, attrs, opset)
    local run = lower(node, attrs, opset)
    return function(ins)
      local a, b = ins[1], ins[2]
      local ua = a ~= nil and not is_tensor(a) and a.wide == "uint64"
      local ub = b ~= nil and not is_tensor(b) and b.wide == "uint64"
      if not ua and not ub then return run(ins) end
      if not (ua and ub) then node_error(node, "inputs of dtypes %s and %s", dtype_of(a), dtype_of(b)) end
      return {{wide = "uint64", t = select(which, u64_divmod(a.t, b.t))}}
    end
  end
end
takes_wide("CumSum", {1}, ARITH)
takes_wide("CumProd", {1}, ARITH)
takes_wide("ReduceSum", {1}, ARITH)

-- uint64 patterns as floats of dtype dt, rounded once as a direct
-- conversion would: one from 2^63 up is halved (a logical shift keeping a
-- sticky low bit, so the rounding sees the bit shifted out), converted,
-- and doubled (exact).
local function u64_float(t, dt)
  local half = int_div(flip(t), i64(2)) + i64(1 << 62)
  local sticky = t:remainder(i64(4)):eq(i64(1)):to("int64")
  local big = (half + sticky):to(dt) * fl.full({}, 2, {dtype = dt})
  return fl.where(t:lt(i64(0)), big, t:to(dt))
end

-- Cast to a narrow type (to) or from uint64: an integer is wrapped into
-- the type's range, as NumPy's astype does; a float truncates toward zero
-- first (ONNX leaves a value out of range undefined); a uint64 converts as
-- the unsigned value it is.
function narrow_cast(node, v, to)
  if not is_tensor(v) and v.wide then
    local from, t = v.wide, v.t
    if WIDE[to] then return {wide = to, t = wrap(t, to)} end
    if to == "int64" then return t end
    local target = FL_DTYPE[to]
    if not target then unsupported(node, "casting to %s", to) end
    if from == "uint64" and FLOAT[target] then return u64_float(t, target) end
    return t:to(target)
  end
  local x = T(node, v)
  local t
  if FLOAT[x.dtype] and INT_BITS[to] < 8 then
    -- a float truncates toward zero; outside the 4- and 2-bit types' range
    -- (undefined in ONNX) it gives 0, as ONNX's reference does
    local lo, hi = QUANT_RANGE[to][1], QUANT_RANGE[to][2]
    t = fl.where(x:abs():lt(fl.full({}, 16, {dtype = x.dtype})), x, fl.zeros({}, {dtype = x.dtype})):to("int64")
    return {wide = to, t = fl.where(t:lt(i64(lo)), i64(0), fl.where(t:gt(i64(hi)), i64(0), t))}
  elseif FLOAT[x.dtype] and to == "uint64" then
    -- from 2^63 up a float is past int64: shift it down by 2^63 first
    local top = fl.full({}, 2.0 ^ 63, {dtype = x.dtype})
    local big = x:ge(top)
    t = fl.where(big, flip(fl.where(big, x - top, x):to("int64")), x:to("int64"))
  else
    t = x.dtype == "int64" and x or x:to("int64")
  end
  return {wide = to, t = wrap(t, to)}
end

-- Pow: X and Y may be of different types.  An integer X raises on int64
-- (wrapping, as repeated products do) and wraps into X's type; a narrow Y
-- is an exponent of its value.
do
  local lower = OPS.Pow
  OPS.Pow = function(node, attrs, opset)
    local run = lower(node, attrs, opset)
    return function(ins)
      local x, y = ins[1], ins[2]
      local tag = x ~= nil and not is_tensor(x) and x.wide or nil
      if tag == "uint64" then unsupported(node, "Pow of uint64 values") end
      if y ~= nil and not is_tensor(y) and y.wide then
        if y.wide == "uint64" then
          local xt = T(node, tag and x.t or x, "input X")
          if not FLOAT[xt.dtype] then unsupported(node, "an integer to a uint64 power") end
          y = u64_float(y.t, xt.dtype)
        else
          y = y.t
        end
      end
      local r = run({tag and x.t or x, y})[1]
      if tag then return {{wide = tag, t = wrap(r, tag)}} end
      return {r}
    end
  end
end

-- ---------------------------------------------------------------------------
-- bitwise ops on the integer types
-- ---------------------------------------------------------------------------
do   -- (this section's helpers are its own)

-- The integer inputs of a bitwise node as int64 tensors, and the one
-- ONNX type they share (a narrow type's name, or int64).
local function int_operands(node, ins, n)
  local tag, out = nil, {}
  for i = 1, n do
    local v = ins[i]
    if v == nil then node_error(node, "input %d is missing", i) end
    local dt = dtype_of(v)
    if not INT_BITS[dt] then node_error(node, "an input of dtype %s (integers only)", ONNX_DTYPE[dt] or dt) end
    if tag and tag ~= dt then node_error(node, "inputs of dtypes %s and %s", tag, dt) end
    tag = dt
    out[i] = (not is_tensor(v) and v.wide) and v.t or T(node, v)
  end
  return tag, table.unpack(out, 1, n)
end

local function tagged(t, tag)
  if tag == "int64" then return t end
  return {wide = tag, t = wrap(t, tag)}
end

-- the low n bits of int64 values, as a non-negative number (all 64: the pattern)
local function low_bits(t, n)
  if n == 64 then return t end
  return t:remainder(i64(1 << n))
end

-- a AND b over their low n bits.  fuselab has no bitwise op: bit k of x
-- is the difference of x mod 2^(k+1) and x mod 2^k (floored remainders,
-- the low bits of the two's complement pattern), 0 or 2^k, and the bits
-- set in both are summed back (for k = 63 the difference is x minus its
-- low 63 bits, INT64_MIN or 0, and the sum wraps as the pattern does).
local function bit_and(a, b, n)
  local zero = i64(0)
  -- x mod 2^(k+1); 2^63 is past int64: x mod 2^63 is x with its top bit cleared
  local function low(x, k)
    if k < 62 then return x:remainder(i64(1 << (k + 1))) end
    if k == 62 then return fl.where(x:lt(zero), flip(x), x) end
    return x
  end
  local acc, la, lb = zero, zero, zero
  for k = 0, n - 1 do
    local ha, hb = low(a, k), low(b, k)
    acc = acc + fl.where((ha - la):ne(zero), hb - lb, zero)
    la, lb = ha, hb
  end
  return acc
end

-- OR and XOR from AND: a + b = (a XOR b) + 2 (a AND b), exactly in
-- wrapping arithmetic
local BITWISE = {
  BitwiseAnd = function(a, b, n) return bit_and(a, b, n) end,
  BitwiseOr = function(a, b, n) return a + b - bit_and(a, b, n) end,
  BitwiseXor = function(a, b, n) return a + b - bit_and(a, b, n) * i64(2) end,
}
for op, fn in pairs(BITWISE) do
  OPS[op] = function(node, attrs)
    known_attrs(node, attrs, {})
    return function(ins)
      local tag, a, b = int_operands(node, ins, 2)
      local n = INT_BITS[tag]
      return {tagged(fn(low_bits(a, n), low_bits(b, n), n), tag)}
    end
  end
end

-- NOT x is -1 - x in two's complement, wrapped into the type
OPS.BitwiseNot = function(node, attrs)
  known_attrs(node, attrs, {})
  return function(ins)
    local tag, x = int_operands(node, ins, 1)
    return {tagged(i64(-1) - x, tag)}
  end
end

-- floor(x / 2^s) for s in [0, 62]: x less its low s bits divides exactly
local function shift_right(x, s)
  local p = fl.pow(i64(2), s)
  return int_div(x - x:remainder(p), p)
end

-- BitShift: the unsigned types from opset 11, the signed ones from 28.  A
-- shift by Y outside [0, bits) gives what the sign fill alone gives (-1
-- for a negative X shifted right, else 0), as opset 28 defines it and
-- NumPy does (before, the unsigned types' were left undefined).  Left is
-- a product by 2^Y, wrapped; right a floored quotient, for uint64 of the
-- value with its top bit cleared, that bit's 2^(63-Y) added back.
OPS.BitShift = function(node, attrs, opset)
  known_attrs(node, attrs, set("direction"))
  local dir = attrs.direction
  if dir ~= "LEFT" and dir ~= "RIGHT" then
    node_error(node, "direction must be 'LEFT' or 'RIGHT', got '%s'", clean(tostring(dir)))
  end
  return function(ins)
    local tag, x, y = int_operands(node, ins, 2)
    if not UNSIGNED[tag] and opset < 28 then
      node_error(node, "a shift of %s values (unsigned types only before opset 28)", tag)
    end
    local n, zero = INT_BITS[tag], i64(0)
    local ok = y:ge(zero):to("int64") * y:lt(i64(n)):to("int64")
    ok = ok:ne(zero)
    local s = fl.where(ok, y, zero)
    local neg = x:lt(zero)
    if dir == "LEFT" then
      return {tagged(fl.where(ok, x * fl.pow(i64(2), s), zero), tag)}
    end
    local s62 = fl.minimum(s, i64(62))
    local r
    if tag == "uint64" then
      local hi = shift_right(fl.where(neg, flip(x), x), s62)
      r = hi + fl.where(neg, fl.pow(i64(2), i64(63) - s62), zero)
      r = fl.where(s:eq(i64(63)), neg:to("int64"), r)
      r = fl.where(ok, r, zero)
    else
      local fill = fl.where(neg, i64(-1), zero)
      local inside = (ok:to("int64") * s:lt(i64(63)):to("int64")):ne(zero)
      r = fl.where(inside, shift_right(x, s62), fill)
    end
    return {tagged(r, tag)}
  end
end

-- BitCast (opset 26): the bits of one type read as another of the same
-- width.  fuselab has no such op, so the bits go through their value: a
-- pattern (an int64: the n low bits, all 64 for the 64-bit types) is
-- taken from the input and read as the target.  Integers and bools give
-- their two's complement bits; floats are taken apart exactly in float64:
-- sign, exponent by halving or doubling in steps of 2^512 .. 2^1 (each
-- step exact), significand.  A NaN's payload and sign are not values, so
-- a NaN input is refused (its values are read: a graph break under
-- fl.compile); a NaN pattern read as a float gives a NaN.
local FLOAT_BITS = {float32 = {8, 23}, float64 = {11, 52}, float16 = {5, 10}, bfloat16 = {8, 7}}
local BITCAST_WIDTH = {bool = 8, float32 = 32, float64 = 64, float16 = 16, bfloat16 = 16}
for k, v in pairs(INT_BITS) do BITCAST_WIDTH[k] = v end

local function f64c(v) return fl.full({}, v, {dtype = "float64"}) end

-- x * 2^k for a float64 tensor k of integers in [-1074, 1023], exactly
-- where the result is representable: the steps go down (or up) toward it
local function scale2(x, k)
  for _, step in ipairs({1024, 512, 256, 128, 64, 32, 16, 8, 4, 2, 1}) do
    if step < 1024 then
      local up = k:ge(f64c(step))
      x = fl.where(up, x * f64c(2.0 ^ step), x)
      k = fl.where(up, k - f64c(step), k)
    end
    local down = k:le(f64c(-step))
    x = fl.where(down, x * f64c(2.0 ^ -step), x)
    k = fl.where(down, k + f64c(step), k)
  end
  return x
end

-- the bit pattern of float tensor x (no NaN) in format {E, M}
local function float_bits(x, fmt)
  local E, M = fmt[1], fmt[2]
  local bias = (1 << (E - 1)) - 1
  local a = x:to("float64")
  local zero = f64c(0)
  local neg = fl.where(a:eq(zero), (f64c(1) / a):lt(zero), a:lt(zero))
  a = a:abs()
  local inf = a:eq(f64c(math.huge))
  local s = fl.where(inf, f64c(1), fl.where(a:eq(zero), f64c(1), a))   -- finite, non-zero
  -- e = floor(log2 s), s into [1, 2)
  local e = zero
  if E == 11 then                                           -- float64 subnormals
    local tiny = s:lt(f64c(2.0 ^ -1000))
    s = fl.where(tiny, s * f64c(2.0 ^ 1000), s)
    e = fl.where(tiny, f64c(-1000), e)
  end
  for _, step in ipairs({512, 256, 128, 64, 32, 16, 8, 4, 2, 1}) do
    local big = s:ge(f64c(2.0 ^ step))
    s = fl.where(big, s * f64c(2.0 ^ -step), s)
    e = fl.where(big, e + f64c(step), e)
    local small = s:lt(f64c(2.0 ^ (1 - step)))
    s = fl.where(small, s * f64c(2.0 ^ step), s)
    e = fl.where(small, e - f64c(step), e)
  end
  local emin = 1 - bias
  local sub = e:lt(f64c(emin))
  -- subnormal: a / 2^(emin - M), in two exact steps (2^1074 is past float64)
  local msub = a * f64c(2.0 ^ M) * f64c(2.0 ^ (-emin))
  local mant = fl.where(sub, msub, (s - f64c(1)) * f64c(2.0 ^ M))
  local field = fl.where(sub, zero, e + f64c(bias))
  mant = fl.where(a:eq(zero), zero, fl.where(inf, zero, mant))
  field = fl.where(a:eq(zero), zero, fl.where(inf, f64c((1 << E) - 1), field))
  local n = 1 + E + M
  local sign = n == 64 and i64(math.mininteger) or i64(1 << (n - 1))
  return field:to("int64") * i64(1 << M) + mant:to("int64") + fl.where(neg, sign, i64(0))
end

-- the float of format {E, M} (as dtype dt) whose pattern is p (an int64)
local function bits_float(p, fmt, dt)
  local E, M = fmt[1], fmt[2]
  local n, bias = 1 + E + M, (1 << (E - 1)) - 1
  local neg, q
  if n == 64 then neg, q = p:lt(i64(0)), fl.where(p:lt(i64(0)), flip(p), p)
  else
    neg = p:ge(i64(1 << (n - 1)))
    q = p - fl.where(neg, i64(1 << (n - 1)), i64(0))
  end
  local mant = q:remainder(i64(1 << M))
  local field = (q - mant):to("float64") * f64c(2.0 ^ -M)   -- exact: few significant bits
  local m = mant:to("float64")
  local zero = f64c(0)
  local normal = scale2(m + f64c(2.0 ^ M), field - f64c(bias + M))
  local subnormal = m * f64c(2.0 ^ (1 - bias)) * f64c(2.0 ^ -M)
  local top = field:eq(f64c((1 << E) - 1))
  local v = fl.where(field:eq(zero), subnormal, normal)
  v = fl.where(top, fl.where(m:eq(zero), f64c(math.huge), f64c(0 / 0)), v)
  v = fl.where(neg, -v, v)
  return v:to(dt)
end

OPS.BitCast = function(node, attrs)
  known_attrs(node, attrs, set("to"))
  local to = DTYPE_CODE[attrs.to]
  if not to then node_error(node, "attribute 'to' is required (a TensorProto data type)") end
  local target = FL_DTYPE[to] or to
  if not BITCAST_WIDTH[target] then unsupported(node, "BitCast to %s", to) end
  return function(ins)
    local v = ins[1]
    if v == nil then node_error(node, "input is missing") end
    local from = dtype_of(v)
    if not BITCAST_WIDTH[from] then unsupported(node, "BitCast from %s", ONNX_DTYPE[from] or from) end
    if BITCAST_WIDTH[from] ~= BITCAST_WIDTH[target] then
      node_error(node, "BitCast from %s (%d bits) to %s (%d bits)", ONNX_DTYPE[from] or from, BITCAST_WIDTH[from],
                 to, BITCAST_WIDTH[target])
    end
    if from == target then return {v} end
    local p
    if FLOAT_BITS[from] then
      local x = T(node, v)
      local nan = x:ne(x):to("int64"):sum()
      local ok, has = pcall(nan.tolist, nan)
      if not ok then
        if not fl._tracing() then error(has, 0) end
        unsupported(node, "a NaN check of floats computed from graph inputs under capture (a data-dependent refusal)")
      end
      if has > 0 then unsupported(node, "BitCast of a NaN (its payload and sign bits are not kept)") end
      p = float_bits(x, FLOAT_BITS[from])
    elseif from == "bool" then
      p = T(node, v):to("int64")
    else
      local _, t = int_operands(node, {v}, 1)
      p = low_bits(t, INT_BITS[from])
    end
    if FLOAT_BITS[target] then return {bits_float(p, FLOAT_BITS[target], target)} end
    if target == "bool" then return {p:ne(i64(0))} end
    return {tagged(p, target)}
  end
end

end
-- ---------------------------------------------------------------------------
-- quantization (the integer types, in float arithmetic as ONNX's reference)
-- ---------------------------------------------------------------------------


-- float values rounded half to even (NumPy's rint) as int64; the values
-- are clamped well inside 2^23 first, where every step is exact
local function rint64(x)
  local t = x:to("int64")                                   -- toward zero
  local f = t - x:lt(t:to(x.dtype)):to("int64")            -- floor
  local diff = x - f:to(x.dtype)
  local half = fl.full({}, 0.5, {dtype = x.dtype})
  local odd = f:remainder(i64(2)):eq(i64(1)):to("int64")
  return f + diff:gt(half):to("int64") + diff:eq(half):to("int64") * odd
end

-- ---------------------------------------------------------------------------
-- the float8 and float4 types
-- ---------------------------------------------------------------------------
do   -- (this section's helpers are its own)

-- Their values are held as float32 (every one is exact there).  A value
-- rounds to one of them as ONNX's tables say: to nearest, ties to even,
-- at the type's mantissa width (m bits; a subnormal's quantum below 2^emin);
-- past max it saturates, or (saturate = 0) becomes Inf or NaN; the FNUZ
-- types have no negative zero; float4e2m1 has neither Inf nor NaN and
-- always saturates (NaN gives -0, as ONNX's reference).
local SMALL = {
  float8e4m3fn = {m = 3, emin = -6, emax = 8, max = 448, over = 0 / 0, negzero = true},
  float8e4m3fnuz = {m = 3, emin = -7, emax = 7, max = 240, over = 0 / 0},
  float8e5m2 = {m = 2, emin = -14, emax = 15, max = 57344, over = math.huge, negzero = true},
  float8e5m2fnuz = {m = 2, emin = -15, emax = 15, max = 57344, over = 0 / 0},
  float4e2m1 = {m = 1, emin = 0, emax = 2, max = 6, always_saturate = true, negzero = true, nan = -0.0},
}

-- float tensor x (float32 or float64) rounded to type `to`, as float32
local function round_small(x, to, saturate)
  local f, dt = SMALL[to], x.dtype
  local function c(v) return fl.full({}, v, {dtype = dt}) end
  local nan = x:ne(x)
  -- past 2^(emax+2) every value overflows alike: bounded, |x| / q stays a
  -- small integer that rint64 rounds exactly
  local a = fl.where(nan, c(0), fl.minimum(x:abs(), c(2.0 ^ (f.emax + 2))))
  -- q: the quantum of a's binade (a power of two: the division is exact)
  local q = c(2.0 ^ (f.emin - f.m))
  for k = f.emin + 1, f.emax do q = fl.where(a:ge(c(2.0 ^ k)), c(2.0 ^ (k - f.m)), q) end
  local r = rint64(a / q):to(dt) * q
  if saturate or f.always_saturate then r = fl.minimum(r, c(f.max))
  else r = fl.where(r:gt(c(f.max)), c(f.over), r) end
  local y = fl.where(x:lt(c(0)), -r, r)
  -- a zero keeps x's sign (x * 0) where the type has a negative zero
  y = fl.where(r:eq(c(0)), f.negzero and x * c(0) or c(0), y)
  y = fl.where(nan, c(f.nan or 0 / 0), y)
  return dt == "float32" and y or y:to("float32")
end

-- float32 tensor x to float8e8m0 (a power of two, 2^-127 to 2^127, or
-- NaN), as ONNX's reference: from the exponent field E of x's float32
-- pattern (the sign ignored; 0 for zero and subnormals), rounded up
-- where the mantissa is not zero (round_mode up), to nearest with ties
-- up (nearest; E = 0 rounds up only past the half), or not (down); with
-- saturate, E = 254 never rounds up; Inf and NaN give NaN.  The fields
-- come from exact scalings by powers of two (fuselab has no bit ops).
local function to_e8m0(x, saturate, mode)
  local function c(v) return fl.full({}, v) end
  local yes, no = fl.ones({}, {dtype = "bool"}), fl.zeros({}, {dtype = "bool"})
  local function land(p, q) return fl.where(p, q, no) end
  local function lor(p, q) return fl.where(p, yes, q) end
  local a = x:abs()
  local special = lor(a:ne(a), a:eq(c(math.huge)))
  a = fl.where(special, c(1), a)
  local normal = a:ge(c(2.0 ^ -126))
  -- s = a / 2^e in [1, 2) for a normal a
  local s, e = a, fl.zeros(a.shape)
  for _, b in ipairs({64, 32, 16, 8, 4, 2, 1}) do
    local big = s:ge(c(2.0 ^ b))
    s, e = fl.where(big, s * c(2.0 ^ -b), s), fl.where(big, e + c(b), e)
  end
  for _, b in ipairs({64, 64, 32, 16, 8, 4, 2, 1}) do
    local small = land(s:lt(c(2.0 ^ (1 - b))), normal)
    s, e = fl.where(small, s * c(2.0 ^ b), s), fl.where(small, e - c(b), e)
  end
  -- the mantissa field as a fraction in [0, 1)
  local frac = fl.where(normal, s - c(1), a * c(2.0 ^ 126))
  local up
  if mode == "up" then up = frac:gt(c(0))
  elseif mode == "nearest" then
    local g = frac:ge(c(0.5))
    local rest = fl.where(g, frac - c(0.5), frac)
    up = land(g, lor(rest:gt(c(0)), normal))
  else up = fl.zeros(a.shape, {dtype = "bool"}) end
  local top = land(normal, e:eq(c(127)))           -- E = 254
  if saturate then up = fl.where(top, no, up) end
  -- 2^e exactly (a / s), 2^-127 for E = 0; doubled where it rounds up
  local p = fl.where(normal, a / s, c(2.0 ^ -127))
  local y = fl.where(up, p * c(2), p)
  y = fl.where(land(up, top), c(0 / 0), y)        -- E = 255
  return fl.where(special, c(0 / 0), y)
end

-- Cast to or from the float8 and float4 types.  From them the float32
-- values convert as any float32 does (to bfloat16 too: at most 3 mantissa
-- bits, exact); to them a value rounds once, from its own float type (a
-- float16 or bfloat16 widened to float32 first, exactly), an integer
-- from float64 (float32 for float8e8m0, as ONNX's reference converts).
function small_cast(node, v, to, opts)
  local from = not is_tensor(v) and SMALLF[v.wide or ""] and v.wide
  local x
  if from then
    x = v.t
    if not SMALLF[to] then
      if to == "bfloat16" then return x:to("bfloat16") end
      return cast_to(node, x, to)
    end
  elseif not is_tensor(v) and v.wide then
    x = v.wide == "uint64" and narrow_cast(node, v, "double") or v.t:to("float64")
  else
    x = T(node, v)
    if x.dtype ~= "float32" and x.dtype ~= "float64" then x = x:to(x.dtype == "int64" and "float64" or "float32") end
  end
  local sat = opts.saturate ~= false
  if to == "float8e8m0" then
    return {wide = to, t = to_e8m0(x.dtype == "float32" and x or x:to("float32"), sat, opts.round_mode or "up")}
  end
  return {wide = to, t = round_small(x, to, sat)}
end

-- A scale or zero point p laid along dim d of x: one value as is, a 1-d one
-- index by index along d, a blocked one (block > 0, x's rank) each value
-- repeated block times along d.
local function along(node, p, x, d, block, what)
  local r = x:dim()
  if block > 0 then
    if p:dim() ~= r then node_error(node, "a blocked %s of %d dims for a %d-d input", what, p:dim(), r) end
    local big, flat = {}, {}
    for i = 1, r do big[#big + 1] = p.shape[i]; flat[i] = p.shape[i] end
    table.insert(big, d + 1, block)
    flat[d] = p.shape[d] * block
    if type(flat[d]) ~= "number" or flat[d] < x.shape[d] or p.shape[d] * block - x.shape[d] >= block then
      node_error(node, "a blocked %s of %s blocks of %d along a dim of %s", what, tostring(p.shape[d]), block,
                 tostring(x.shape[d]))
    end
    return p:unsqueeze(d + 1):expand(big):contiguous():reshape(flat):narrow(d, 1, x.shape[d])
  end
  if p:numel() == 1 and p:dim() <= 1 then return p:reshape({}) end
  if p:dim() ~= 1 or p.shape[1] ~= x.shape[d] then
    node_error(node, "a %s of %d values for a dim of %s", what, p:numel(), tostring(x.shape[d]))
  end
  local s = {}
  for i = 1, r do s[i] = 1 end
  s[d] = x.shape[d]
  return p:reshape(s)
end

-- the dim a per-axis scale lies along (none needed for a scalar scale)
local function quant_dim(node, attrs, x, scale, block)
  if block == 0 and scale:numel() == 1 and scale:dim() <= 1 then return 1 end
  return axis(node, attr(attrs, "axis", 1), x:dim())
end

-- a narrow zero point's tensor, checked against the type it must have
local function zero_point(node, v, want)
  if v == nil then return nil end
  if is_tensor(v) or not v.wide then unsupported(node, "a zero point of dtype %s", dtype_of(v)) end
  if want and v.wide ~= want then node_error(node, "a zero point of dtype %s for %s", v.wide, want) end
  return v.t
end

-- round(x / scale) + zero point, saturated to the type's range
local function quantize(x, s, zt, tag)
  local lo, hi = QUANT_RANGE[tag][1], QUANT_RANGE[tag][2]
  -- the quotient rounded once to x's type, as a division there is: through
  -- float64, so that a compiled kernel's reciprocal product (one float64
  -- ulp off) cannot move it across a half that rint then rounds
  local q = (x:to("float64") / s:to("float64")):to(x.dtype)
  -- past the range's width the saturated result is the same
  local w = hi - lo + 1
  q = fl.minimum(fl.maximum(q, fl.full({}, -w, {dtype = q.dtype})), fl.full({}, w, {dtype = q.dtype}))
  local y = rint64(q)
  if zt then y = y + zt end
  return fl.minimum(fl.maximum(y, i64(lo)), i64(hi))
end

OPS.QuantizeLinear = function(node, attrs, opset)
  known_attrs(node, attrs, set("axis", "saturate", "block_size", "output_dtype", "precision"))
  local block = attr(attrs, "block_size", 0)
  local out = attrs.output_dtype and attrs.output_dtype ~= 0 and (DTYPE_CODE[attrs.output_dtype] or tostring(attrs.output_dtype))
  if out and not QUANT_RANGE[out] and not SMALL[out] then unsupported(node, "quantizing to %s", out) end
  local sat = attr(attrs, "saturate", 1) ~= 0
  local prec = attrs.precision and attrs.precision ~= 0 and DTYPE_CODE[attrs.precision]
  if attrs.precision and attrs.precision ~= 0 and not FLOAT[FL_DTYPE[prec] or ""] then
    unsupported(node, "precision %s", tostring(prec or attrs.precision))
  end
  return function(ins)
    local x, scale = T(node, ins[1], "x"), T(node, ins[2], "y_scale")
    need_float(node, x)
    need_float(node, scale, "y_scale")
    local zt = zero_point(node, ins[3], out)
    local tag = ins[3] ~= nil and ins[3].wide or out or "uint8"
    if not QUANT_RANGE[tag] and not SMALL[tag] then unsupported(node, "quantizing to %s", tag) end
    local d = quant_dim(node, attrs, x, scale, block)
    local s = along(node, scale, x, d, block, "scale")
    local dt = prec and FL_DTYPE[prec] or x.dtype
    if s.dtype ~= dt then s = s:to(dt) end
    if x.dtype ~= dt then x = x:to(dt) end
    if SMALL[tag] then
      -- ONNX's formula, x / scale + zero point rounded once to the type
      -- (saturating unless saturate = 0): the reference's answer for a zero
      -- point of 0, the only one exporters write (it ignores a float8 one)
      local q = (x:to("float64") / s:to("float64")):to(x.dtype)
      if zt then q = q + along(node, zt, x, d, block, "zero point"):to(q.dtype) end
      return {{wide = tag, t = round_small(q.dtype == "float64" and q or q:to("float32"), tag, sat)}}
    end
    return {{wide = tag, t = quantize(x, s, zt and along(node, zt, x, d, block, "zero point"), tag)}}
  end
end

OPS.DequantizeLinear = function(node, attrs, opset)
  known_attrs(node, attrs, set("axis", "block_size", "output_dtype"))
  local block = attr(attrs, "block_size", 0)
  local out = attrs.output_dtype and attrs.output_dtype ~= 0 and DTYPE_CODE[attrs.output_dtype]
  if attrs.output_dtype and attrs.output_dtype ~= 0 and not FLOAT[FL_DTYPE[out] or ""] then
    unsupported(node, "output_dtype %s", tostring(out or attrs.output_dtype))
  end
  return function(ins)
    local xv, scale = ins[1], T(node, ins[2], "x_scale")
    if xv == nil or is_tensor(xv) or not xv.wide or xv.wide == "uint64" then
      unsupported(node, "dequantizing %s", xv and dtype_of(xv) or "nothing")
    end
    need_float(node, scale, "x_scale")
    local x = xv.t
    local zt = zero_point(node, ins[3], xv.wide)
    local d = quant_dim(node, attrs, x, scale, block)
    -- in float32, as ONNX's reference, then the scale's type
    local dx = x:to("float32")
    if zt then dx = dx - along(node, zt, x, d, block, "zero point"):to("float32") end
    local s = along(node, scale, x, d, block, "scale")
    local y = dx * (s.dtype == "float32" and s or s:to("float32"))
    local want = out and FL_DTYPE[out] or scale.dtype
    return {y.dtype == want and y or y:to(want)}
  end
end

-- DynamicQuantizeLinear: uint8 over the range of x and 0 (scale 1 when that
-- range is empty), the zero point rounded after clamping, as the reference
OPS.DynamicQuantizeLinear = function(node, attrs)
  known_attrs(node, attrs, {})
  return function(ins)
    local x = T(node, ins[1], "x")
    if x.dtype ~= "float32" then unsupported(node, "an input of dtype %s (float32 only)", x.dtype) end
    local zero = fl.zeros({})
    local hi, lo = fl.maximum(x:amax(), zero), fl.minimum(x:amin(), zero)
    local scale = fl.where(hi:eq(lo), fl.full({}, 1.0), hi - lo) / fl.full({}, 255.0)
    local zp = fl.minimum(fl.maximum(zero - lo / scale, zero), fl.full({}, 255.0))
    local zpi = rint64(zp)
    return {{wide = "uint8", t = quantize(x, scale, zpi, "uint8")}, scale, {wide = "uint8", t = zpi}}
  end
end

-- The exact product of two int8/uint8 values {wide=, t=} less their zero
-- points (nil, one value, or one per row of a / column of b), as int64:
-- one fl.matmul_int8 (oneDNN's 8-bit product, cpu/eager_int8.c), batch
-- dims broadcast by views, 1-d operands as numpy's matmul takes them.  nil
-- where the zero points have another shape: the caller's float64 way.
local EIGHT_BIT = set("int8", "uint8")
local function int8_matmul(node, a, b, zav, zbv)
  local ta, tb = a.t, b.t
  local za, zb = zero_point(node, zav, a.wide), zero_point(node, zbv, b.wide)
  local function fits(z, n) return z == nil or z:numel() == 1 and z:dim() <= 1 or z:dim() == 1 and z.shape[1] == n end
  local va, vb = ta:dim() == 1, tb:dim() == 1
  if va then ta = ta:reshape(1, ta.shape[1]) end
  if vb then tb = tb:reshape(tb.shape[1], 1) end
  local ra, rb = ta:dim(), tb:dim()
  if va and za and za:numel() ~= 1 or vb and zb and zb:numel() ~= 1 or
     not fits(za, ta.shape[ra - 1]) or not fits(zb, tb.shape[rb]) then
    return nil
  end
  if ta.shape[ra] ~= tb.shape[rb - 1] then
    node_error(node, "inner dimensions differ: %s @ %s", table.concat(a.t.shape, "x"), table.concat(b.t.shape, "x"))
  end
  if rb > 2 or ra < rb then
    local nb = math.max(ra, rb) - 2
    local batch = {}
    for i = 1, nb do
      local x = ta.shape[ra - 2 - nb + i] or 1
      local y = tb.shape[rb - 2 - nb + i] or 1
      if x ~= y and x ~= 1 and y ~= 1 then node_error(node, "batch dims of %s and %s do not broadcast", table.concat(a.t.shape, "x"), table.concat(b.t.shape, "x")) end
      batch[i] = x == 1 and y or x
    end
    local function grow(t, r)
      local shape = {table.unpack(batch)}
      shape[nb + 1], shape[nb + 2] = t.shape[r - 1], t.shape[r]
      return t:expand(table.unpack(shape))
    end
    ta = grow(ta, ra)
    if rb > 2 then tb = grow(tb, rb) end
  end
  local y = fl.matmul_int8(ta, tb, {a_type = a.wide, b_type = b.wide,
                                    a_zero = za and za:reshape(za:numel() == 1 and {} or {za:numel()}),
                                    b_zero = zb and zb:reshape(zb:numel() == 1 and {} or {zb:numel()})})
  if va then y = y:squeeze(y:dim() - 1) end
  if vb then y = y:squeeze(y:dim()) end
  return y
end

-- QLinearMatMul: the integer product of the inputs less their zero points
-- (exact in float64), times a_scale * b_scale / y_scale (in the scales'
-- type, as the reference), requantized.  Per-tensor scales only.
OPS.QLinearMatMul = function(node, attrs)
  known_attrs(node, attrs, {})
  return function(ins)
    local function q(i, what)
      local v = ins[i]
      if v == nil or is_tensor(v) or not QUANT_RANGE[v.wide or ""] then
        unsupported(node, "%s of dtype %s", what, v and dtype_of(v) or "none")
      end
      return v
    end
    local function scalar_of(i, what)
      local s = T(node, ins[i], what)
      need_float(node, s, what)
      if s:numel() ~= 1 then unsupported(node, "a %s of %d values (per-tensor only)", what, s:numel()) end
      return s:reshape({})
    end
    local a, b = q(1, "input a"), q(4, "input b")
    local c = EIGHT_BIT[a.wide] and EIGHT_BIT[b.wide] and int8_matmul(node, a, b, ins[3], ins[6])
    local function centred(v, zi)
      local t = v.t
      if ins[zi] ~= nil then
        local z = zero_point(node, ins[zi], v.wide)
        if z:numel() ~= 1 then unsupported(node, "a zero point of %d values (per-tensor only)", z:numel()) end
        t = t - z:reshape({})
      end
      return t:to("float64")
    end
    c = c and c:to("float64") or fl.matmul(centred(a, 3), centred(b, 6))
    local f = scalar_of(2, "a_scale") * scalar_of(5, "b_scale") / scalar_of(7, "y_scale")
    local y = c * f:to("float64")
    local tag = a.wide
    if ins[8] ~= nil then
      local z = zero_point(node, ins[8])
      tag = ins[8].wide
      y = y + z:reshape({}):to("float64")
    end
    local lo, hi = QUANT_RANGE[tag][1], QUANT_RANGE[tag][2]
    local w = hi - lo + 1
    y = fl.minimum(fl.maximum(y, fl.full({}, -w, {dtype = "float64"})), fl.full({}, 2 * w, {dtype = "float64"}))
    return {{wide = tag, t = fl.minimum(fl.maximum(rint64(y), i64(lo)), i64(hi))}}
  end
end

-- MatMulInteger, ConvInteger and QLinearConv sum products of int8/uint8
-- values less their zero points in float64: fl.conv2d takes floating
-- inputs only, and float64 holds every integer up to 2^53 exactly, in the
-- eager kernels and the compiled ones alike (float32 only up to 2^24, which
-- a sum of 256 products of 255 x 255 already passes).  The int32 results
-- are then exact, wrapped as int32 arithmetic wraps.

-- an int8 or uint8 input of these ops
local function int8_in(node, v, what)
  if v == nil or is_tensor(v) or (v.wide ~= "int8" and v.wide ~= "uint8") then
    unsupported(node, "%s of dtype %s (int8 and uint8 only)", what, v and dtype_of(v) or "none")
  end
  return v
end

-- v's values less its zero point zv (of v's type): one value, or (d given)
-- one per index along dim d of v; as float64
local function centred64(node, v, zv, d, what)
  local t = v.t:to("float64")
  if zv == nil then return t end
  local z = zero_point(node, zv, v.wide)
  if not (z:numel() == 1 and z:dim() <= 1) and not d then
    unsupported(node, "%s of %d values (per tensor only)", what, z:numel())
  end
  if d and z:dim() > 1 then unsupported(node, "%s of %d dims (one value, or 1-d)", what, z:dim()) end
  return t - (d and along(node, z, t, d, 0, what) or z:reshape({})):to("float64")
end

OPS.MatMulInteger = function(node, attrs)
  known_attrs(node, attrs, {})
  return function(ins)
    local a, b = int8_in(node, ins[1], "input A"), int8_in(node, ins[2], "input B")
    local y = int8_matmul(node, a, b, ins[3], ins[4])
    if y then return {{wide = "int32", t = wrap(y, "int32")}} end
    local ra, rb = a.t:dim(), b.t:dim()
    -- a 1-d zero point: one per row of A, one per column of B
    local ta = centred64(node, a, ins[3], ra >= 2 and ra - 1 or nil, "a_zero_point")
    local tb = centred64(node, b, ins[4], rb >= 2 and rb or nil, "b_zero_point")
    return {{wide = "int32", t = wrap(fl.matmul(ta, tb):to("int64"), "int32")}}
  end
end

local CONV_ATTRS = set("auto_pad", "dilations", "group", "kernel_shape", "pads", "strides")

-- ConvInteger's and QLinearConv's sums through fl.matmul_int8 (oneDNN's
-- 8-bit product): x padded with its zero point (a pad then adds nothing
-- once centred, as ONNX counts pads), unfolded into patches [N, OH*OW,
-- C/g*kh*kw] by one strided slice per kernel tap, times each group's
-- weight [C/g*kh*kw, Co/g] less its zero points (per tensor or per output
-- channel).  int64 [N, Co, OH(, OW)]; nil where the zero points have
-- another shape or the convolution is not 1-d or 2-d (the caller's
-- float64 way).
local function int8_conv(node, attrs, x, w, zxv, zwv)
  local tx, tw = x.t, w.t
  local r = tx:dim()
  local zx, zw = zero_point(node, zxv, x.wide), zero_point(node, zwv, w.wide)
  if r ~= 3 and r ~= 4 or tw:dim() ~= r or zx and zx:numel() ~= 1 or
     zw and not (zw:numel() == 1 or zw:dim() == 1 and zw.shape[1] == tw.shape[1]) then
    return nil
  end
  local ss, pp, dd = conv_window(node, attrs, tx, tw, r)
  if r == 3 then tx, tw = tx:unsqueeze(3), tw:unsqueeze(3) end
  local N, C, H, W = table.unpack(tx.shape)
  local Co, Cg, kh, kw = table.unpack(tw.shape)
  local groups = attr(attrs, "group", 1)
  if groups < 1 or C ~= Cg * groups or Co % groups ~= 0 then
    node_error(node, "x of %d channels, w of %d per group, %d groups", C, Cg, groups)
  end
  local pads = {0, 0, pp[1], pp[2], 0, 0, pp[3], pp[4]}
  if zx then   -- the pads hold the zero point
    tx = fl.pad(tx - zx:reshape({}), pads) + zx:reshape({})
  else
    tx = fl.pad(tx, pads)
  end
  local OH = (H + pp[1] + pp[3] - dd[1] * (kh - 1) - 1) // ss[1] + 1
  local OW = (W + pp[2] + pp[4] - dd[2] * (kw - 1) - 1) // ss[2] + 1
  if OH < 1 or OW < 1 then node_error(node, "an output of %dx%d pixels", OH, OW) end
  local taps = {}
  for i = 0, kh - 1 do
    for j = 0, kw - 1 do
      local v = tx:slice(3, i * dd[1] + 1, i * dd[1] + ss[1] * (OH - 1) + 1, ss[1])
      taps[#taps + 1] = v:slice(4, j * dd[2] + 1, j * dd[2] + ss[2] * (OW - 1) + 1, ss[2]):unsqueeze(3)
    end
  end
  local patches = fl.cat(taps, 3)                     -- [N, C, kh*kw, OH, OW]
  local cog, ys = Co // groups, {}
  for g = 0, groups - 1 do
    local pg = patches:narrow(2, g * Cg + 1, Cg):reshape(N, Cg * kh * kw, OH * OW):transpose(2, 3)
    local wg = tw:narrow(1, g * cog + 1, cog):reshape(cog, Cg * kh * kw):transpose(1, 2)
    local zb = zw and (zw:numel() == 1 and zw:reshape({}) or zw:narrow(1, g * cog + 1, cog))
    ys[#ys + 1] = fl.matmul_int8(pg, wg:contiguous(), {a_type = x.wide, b_type = w.wide,
                                 a_zero = zx and zx:reshape({}), b_zero = zb}):transpose(2, 3)
  end
  local y = (#ys == 1 and ys[1] or fl.cat(ys, 2)):reshape(N, Co, OH, OW)
  return r == 3 and y:squeeze(3) or y
end

-- ConvInteger: x less its zero point (per tensor; the pads count as zero
-- points), w less its own (per tensor or per output channel), as Conv
OPS.ConvInteger = function(node, attrs)
  known_attrs(node, attrs, CONV_ATTRS)
  return function(ins)
    local x, w = int8_in(node, ins[1], "input x"), int8_in(node, ins[2], "input w")
    local y = int8_conv(node, attrs, x, w, ins[3], ins[4])
    if y then return {{wide = "int32", t = wrap(y, "int32")}} end
    local tx = centred64(node, x, ins[3], nil, "x_zero_point")
    local tw = centred64(node, w, ins[4], 1, "w_zero_point")
    return {{wide = "int32", t = wrap(conv_nd(node, attrs, tx, tw):to("int64"), "int32")}}
  end
end

-- QLinearConv: ConvInteger's sum plus the int32 bias, times x_scale *
-- w_scale / y_scale (in the scales' type, as the reference; w_scale per
-- tensor or per output channel) in float64, plus y_zero_point, saturated to
-- its type (x's without one) and rounded half to even
OPS.QLinearConv = function(node, attrs)
  known_attrs(node, attrs, CONV_ATTRS)
  return function(ins)
    local x, w = int8_in(node, ins[1], "input x"), int8_in(node, ins[4], "input w")
    local b
    if ins[9] ~= nil then
      local bv = ins[9]
      if is_tensor(bv) or bv.wide ~= "int32" then unsupported(node, "a bias B of dtype %s (int32 only)", dtype_of(bv)) end
      b = bv.t
    end
    local c = int8_conv(node, attrs, x, w, ins[3], ins[6])
    if c then
      c = b and c + along(node, b, c, 2, 0, "bias B") or c
      c = c:to("float64")
    else
      local tx = centred64(node, x, ins[3], nil, "x_zero_point")
      local tw = centred64(node, w, ins[6], 1, "w_zero_point")
      c = conv_nd(node, attrs, tx, tw, b and b:to("float64"))
    end
    local function scale(i, what, per_channel)
      local s = T(node, ins[i], what)
      need_float(node, s, what)
      if s:numel() == 1 and s:dim() <= 1 then return s:reshape({}) end
      if not per_channel then unsupported(node, "%s of %d values (per tensor only)", what, s:numel()) end
      return along(node, s, c, 2, 0, what)
    end
    local f = scale(2, "x_scale") * scale(5, "w_scale", true) / scale(7, "y_scale")
    local y = c * f:to("float64")
    local tag = x.wide
    if ins[8] ~= nil then
      local z = zero_point(node, ins[8])
      tag = ins[8].wide
      if tag ~= "int8" and tag ~= "uint8" then unsupported(node, "a y_zero_point of dtype %s (int8 and uint8 only)", tag) end
      if z:numel() ~= 1 then unsupported(node, "a y_zero_point of %d values (per tensor only)", z:numel()) end
      y = y + z:reshape({}):to("float64")
    end
    local lo, hi = QUANT_RANGE[tag][1], QUANT_RANGE[tag][2]
    local wd = hi - lo + 1
    y = fl.minimum(fl.maximum(y, fl.full({}, -wd, {dtype = "float64"})), fl.full({}, 2 * wd, {dtype = "float64"}))
    return {{wide = tag, t = fl.minimum(fl.maximum(rint64(y), i64(lo)), i64(hi))}}
  end
end

-- NonMaxSuppression: per batch and class, the boxes above score_threshold
-- (all without one) by score, highest first (the lower index first among
-- equal scores), each kept unless its IoU with one kept before passes
-- iou_threshold, at most max_output_boxes_per_class (0 without one) kept.
-- Its output's size depends on the values: computed in Lua from them (a
-- graph break under fl.compile, as NonZero), in float32 arithmetic for
-- float32 boxes as the reference.
OPS.NonMaxSuppression = function(node, attrs)
  known_attrs(node, attrs, set("center_point_box"))
  local cpb = attr(attrs, "center_point_box", 0)
  if cpb ~= 0 and cpb ~= 1 then node_error(node, "center_point_box %s (0 or 1)", tostring(cpb)) end
  return function(ins)
    local boxes, scores = T(node, ins[1], "boxes"), T(node, ins[2], "scores")
    need_float(node, boxes, "boxes")
    need_float(node, scores, "scores")
    if boxes:dim() ~= 3 or boxes.shape[3] ~= 4 then node_error(node, "boxes of shape %s (not [batches, boxes, 4])", table.concat(boxes.shape, ",")) end
    if scores:dim() ~= 3 or scores.shape[1] ~= boxes.shape[1] or scores.shape[3] ~= boxes.shape[2] then
      node_error(node, "scores of shape %s for boxes of shape %s", table.concat(scores.shape, ","), table.concat(boxes.shape, ","))
    end
    local function one(i, what)
      if ins[i] == nil then return nil end
      local t = T(node, ins[i], what)
      if t:numel() == 0 then return nil end
      if t:numel() ~= 1 then node_error(node, "a %s of %d values (one)", what, t:numel()) end
      return data_values(node, t, "NonMaxSuppression")[1]
    end
    local maxout = math.max(one(3, "max_output_boxes_per_class") or 0, 0)
    local iou_t = one(4, "iou_threshold") or 0
    local score_t = one(5, "score_threshold")
    local bv = data_values(node, boxes, "NonMaxSuppression")
    local sv = data_values(node, scores, "NonMaxSuppression")
    local r = boxes.dtype == "float32" and function(v) return (string.unpack("<f", string.pack("<f", v))) end
              or boxes.dtype == "float64" and function(v) return v end
    if not r then unsupported(node, "boxes of dtype %s (float32 and float64 only)", boxes.dtype) end
    local B, C, N = static_size(scores.shape[1]), static_size(scores.shape[2]), static_size(scores.shape[3])
    -- box i's min and max along x and y (0-based box, within batch bi)
    local function extent(bi, i)
      local o = (bi * N + i) * 4
      local a1, a2, a3, a4 = bv[o + 1], bv[o + 2], bv[o + 3], bv[o + 4]
      if cpb == 0 then            -- [y1, x1, y2, x2], either corner first
        return math.min(a2, a4), math.max(a2, a4), math.min(a1, a3), math.max(a1, a3)
      end
      local hw, hh = r(a3 / 2), r(a4 / 2)  -- [x_center, y_center, width, height]
      return r(a1 - hw), r(a1 + hw), r(a2 - hh), r(a2 + hh)
    end
    local function suppress(bi, i, j)
      local ax0, ax1, ay0, ay1 = extent(bi, i)
      local bx0, bx1, by0, by1 = extent(bi, j)
      local ix0, ix1 = math.max(ax0, bx0), math.min(ax1, bx1)
      if ix1 <= ix0 then return false end
      local iy0, iy1 = math.max(ay0, by0), math.min(ay1, by1)
      if iy1 <= iy0 then return false end
      local inter = r(r(ix1 - ix0) * r(iy1 - iy0))
      if inter <= 0 then return false end
      local a1 = r(r(ax1 - ax0) * r(ay1 - ay0))
      local a2 = r(r(bx1 - bx0) * r(by1 - by0))
      local union = r(r(a1 + a2) - inter)
      if a1 <= 0 or a2 <= 0 or union <= 0 then return false end
      return r(inter / union) > iou_t
    end
    local rows = {{}, {}, {}}
    for bi = 0, B - 1 do
      for ci = 0, C - 1 do
        local cand = {}
        for i = 0, N - 1 do
          local s = sv[(bi * C + ci) * N + i + 1]
          if score_t == nil or s > score_t then cand[#cand + 1] = {s = s, i = i} end
        end
        table.sort(cand, function(p, q) return p.s > q.s or (p.s == q.s and p.i < q.i) end)
        local kept = {}
        for _, c in ipairs(cand) do
          if #kept >= maxout then break end
          local ok = true
          for _, k in ipairs(kept) do
            if suppress(bi, c.i, k) then ok = false; break end
          end
          if ok then
            kept[#kept + 1] = c.i
            rows[1][#rows[1] + 1], rows[2][#rows[2] + 1], rows[3][#rows[3] + 1] = bi, ci, c.i
          end
        end
      end
    end
    if #rows[1] == 0 then return {fl.zeros({0, 3}, {dtype = "int64"})} end
    return {fl.tensor(rows, {dtype = "int64"}):transpose(1, 2):contiguous()}
  end
end

end
-- ---------------------------------------------------------------------------
-- text features
-- ---------------------------------------------------------------------------
do   -- (this section's helpers are its own)

-- TfIdfVectorizer over integer tokens.  The pool holds the n-grams (the
-- segment starting at ngram_counts[n] those of n tokens), numbered in pool
-- order; the k-th counts into output column ngram_indexes[k] (a pool
-- n-gram given twice counts where its last copy says, as ONNX's
-- reference).  An n-gram of n tokens taken every d-th token (d - 1
-- skipped, d up to max_skip_count + 1) counts once per start; unigrams
-- only at d = 1, and n only from min_gram_length to max_gram_length.
-- Counted without reading the tokens: for each (n, d), the n shifted
-- views of X compared with every pool n-gram of that size at once
-- ([B, starts, K]), their product summed over the starts, then summed
-- into the output columns by a 0/1 matrix.  TF gives the counts, IDF the
-- weight (or 1) where a count is positive, TFIDF count * weight; the
-- weights are per output column, as ONNX's reference and onnxruntime
-- index them.
OPS.TfIdfVectorizer = function(node, attrs)
  known_attrs(node, attrs, set("max_gram_length", "max_skip_count", "min_gram_length", "mode",
                               "ngram_counts", "ngram_indexes", "pool_int64s", "pool_strings", "weights"))
  if attrs.pool_strings ~= nil then unsupported(node, "pool_strings (string tokens)") end
  local pool, counts, indexes = attrs.pool_int64s, attrs.ngram_counts, attrs.ngram_indexes
  if type(pool) ~= "table" then node_error(node, "the pool_int64s attribute is required") end
  if type(counts) ~= "table" or type(indexes) ~= "table" then
    node_error(node, "the ngram_counts and ngram_indexes attributes are required")
  end
  local lo, hi = attr(attrs, "min_gram_length", nil), attr(attrs, "max_gram_length", nil)
  local skips, mode = attr(attrs, "max_skip_count", nil), attr(attrs, "mode", nil)
  if lo == nil or hi == nil or skips == nil or mode == nil then
    node_error(node, "the attributes min_gram_length, max_gram_length, max_skip_count and mode are required")
  end
  if lo < 1 or hi < lo then node_error(node, "gram lengths %d to %d", lo, hi) end
  if skips < 0 then node_error(node, "max_skip_count %d", skips) end
  if mode ~= "TF" and mode ~= "IDF" and mode ~= "TFIDF" then node_error(node, "mode '%s' (TF, IDF or TFIDF)", clean(mode)) end
  local width = 0
  for _, i in ipairs(indexes) do
    if i < 0 then node_error(node, "ngram_indexes holds %d", i) end
    width = math.max(width, i + 1)
  end
  local weights = attrs.weights
  if weights ~= nil and #weights ~= width then
    unsupported(node, "%d weights for %d output columns", #weights, width)
  end
  -- the pool's n-grams by size: key -> output column (the last copy's)
  local grams, id = {}, 0
  for n = 1, #counts do
    local first, stop = counts[n], counts[n + 1] or #pool
    if first < 0 or stop < first or stop > #pool then node_error(node, "ngram_counts %s", table.concat(counts, ",")) end
    if (stop - first) % n ~= 0 then node_error(node, "%d pool values for %d-grams", stop - first, n) end
    for k = first, stop - 1, n do
      id = id + 1
      if id > #indexes then node_error(node, "%d ngram_indexes for more n-grams", #indexes) end
      if n >= lo and n <= hi then
        grams[n] = grams[n] or {keys = {}, order = {}}
        local key = table.concat(pool, ",", k + 1, k + n)
        if not grams[n].keys[key] then grams[n].order[#grams[n].order + 1] = {k = k, key = key} end
        grams[n].keys[key] = indexes[id]
      end
    end
  end
  if id ~= #indexes then node_error(node, "%d ngram_indexes for %d n-grams", #indexes, id) end
  -- per size: the tokens of each n-gram by position ([K] each) and the
  -- [K, width] 0/1 matrix of its output column
  local sizes = {}
  for n = lo, math.min(hi, #counts) do
    local g = grams[n]
    if g then
      local tok, onehot = {}, {}
      for j = 1, n do tok[j] = {} end
      for i, e in ipairs(g.order) do
        for j = 1, n do tok[j][i] = pool[e.k + j] end
        local row = {}
        for c = 1, width do row[c] = 0 end
        row[g.keys[e.key] + 1] = 1
        onehot[i] = row
      end
      sizes[#sizes + 1] = {n = n, tok = tok, onehot = onehot}
    end
  end
  return function(ins)
    local v = ins[1]
    local dt = dtype_of(v)
    if dt ~= "int64" and dt ~= "int32" then unsupported(node, "tokens of dtype %s (int32 and int64 only)", dt) end
    local x = not is_tensor(v) and v.wide and v.t or T(node, v)
    local r = x:dim()
    if r ~= 1 and r ~= 2 then node_error(node, "input of %d dims (1 or 2)", r) end
    local xb = r == 1 and x:unsqueeze(1) or x
    local C = static_size(xb.shape[2])
    local y = nil
    for _, sz in ipairs(sizes) do
      local cnt = nil
      for d = 1, skips + 1 do
        local starts = C - (sz.n - 1) * d
        if starts <= 0 or (sz.n == 1 and d > 1) then break end
        local hit = nil
        for j = 1, sz.n do
          local tok = fl.tensor(sz.tok[j], {dtype = "int64"})
          local eq = xb:narrow(2, 1 + (j - 1) * d, starts):unsqueeze(3):eq(tok):to("float32")
          hit = hit and hit * eq or eq
        end
        local c = hit:sum(2)
        cnt = cnt and cnt + c or c
      end
      if cnt then
        local part = fl.matmul(cnt, fl.tensor(sz.onehot, {dtype = "float32"}))
        y = y and y + part or part
      end
    end
    if y == nil then y = fl.zeros({xb.shape[1], width}) end
    if mode ~= "TF" then
      local w = weights and fl.tensor(weights, {dtype = "float32"})
      if mode == "IDF" then y = y:gt(fl.zeros({})):to("float32") end
      if w then y = y * w end
    end
    if r == 1 then y = y:reshape({width}) end
    return {y}
  end
end

end
-- ---------------------------------------------------------------------------
-- ai.onnx.preview.training: the optimizers
-- ---------------------------------------------------------------------------

-- The ops of that domain, lowered as OPS's are.  Only these load; the
-- domain's opset is the model's import of it (1, the only version).
local TRAINING_DOMAIN = "ai.onnx.preview.training"
local TRAINING_OPS = {}
-- ai.onnx.preview likewise (its ops, FlexAttention, are lowered with the
-- control flow below: their attributes hold subgraphs)
local PREVIEW_DOMAIN = "ai.onnx.preview"
local PREVIEW_OPS = {}
-- ai.onnx.ml likewise (its section is below the optimizers)
local ML_DOMAIN = "ai.onnx.ml"
local ML_OPS = {}
-- the domains beside ai.onnx whose ops load, in the order messages name
-- them, and the model's import of each (0: not imported), set as a load
-- starts
local DOMAINS = {
  {name = TRAINING_DOMAIN, ops = TRAINING_OPS, opset = 0, field = "training_opset"},
  {name = PREVIEW_DOMAIN, ops = PREVIEW_OPS, opset = 0, field = "preview_opset"},
  {name = ML_DOMAIN, ops = ML_OPS, opset = 0, field = "ml_opset"},
}

-- One iteration of an optimizer, as its schema's pseudo code, applied to
-- each of the n tensors it updates.  Inputs: R (the learning rate), T (the
-- update count), then the n X, the n G and the n of each of nstate states;
-- outputs the n new X, then the n of each new state.  step(c, x, g,
-- states) computes one tensor's update in x's dtype, with c.R, c.T (T as
-- x's dtype) and c.started (T > 0, a bool tensor: the spec's branches on
-- T become a where, so T may be a value of the call).
local function optimizer(nstate, known, setup, step)
  return function(node, attrs)
    known_attrs(node, attrs, known)
    local cfg = setup(node, attrs)
    local nin, per = #node.inputs, 2 + nstate
    if nin < 2 + per or (nin - 2) % per ~= 0 then
      node_error(node, "%d inputs (expected R, T, then %d per tensor updated)", nin, per)
    end
    local n = (nin - 2) // per
    if #node.outputs > n * (1 + nstate) then
      node_error(node, "%d outputs for %d tensors (at most %d)", #node.outputs, n, n * (1 + nstate))
    end
    return function(ins)
      local R, t = T(node, ins[1], "R"), T(node, ins[2], "T")
      need_float(node, R, "R")
      if t.dtype ~= "int64" then node_error(node, "T must be int64, got %s", t.dtype) end
      if R:numel() ~= 1 or t:numel() ~= 1 then node_error(node, "R and T must hold one value each") end
      R, t = R:reshape({}), t:reshape({})
      local started = t:gt(fl.zeros({}, {dtype = "int64"}))
      local outs = {}
      for i = 1, n do
        local x = T(node, ins[2 + i], "X")
        need_float(node, x, "X")
        local g, states = T(node, ins[2 + n + i], "G"), {}
        for k = 1, nstate do states[k] = T(node, ins[2 + (1 + k) * n + i], "a state") end
        for _, v in ipairs({g, table.unpack(states)}) do
          if v.dtype ~= x.dtype then node_error(node, "inputs of dtypes %s and %s", x.dtype, v.dtype) end
        end
        local c = {R = R.dtype == x.dtype and R or R:to(x.dtype), T = t:to(x.dtype), started = started}
        for k, v in pairs(cfg) do c[k] = v end
        local res = step(c, x, g, states)
        outs[i] = res[1]
        for k = 1, nstate do outs[k * n + i] = res[1 + k] end
      end
      return outs
    end
  end
end

local function need_attr(node, attrs, name)
  if attrs[name] == nil then node_error(node, "attribute '%s' is required", name) end
  return attrs[name]
end

-- Adagrad: r = R / (1 + T * decay_factor); G_reg = norm_coefficient * X + G;
-- H_new = H + G_reg^2; X_new = X - r * G_reg / (sqrt(H_new) + epsilon).
TRAINING_OPS.Adagrad = optimizer(1, set("decay_factor", "epsilon", "norm_coefficient"),
  function(_, attrs)
    return {decay = attr(attrs, "decay_factor", 0.0), eps = attr(attrs, "epsilon", 1e-6),
            norm = attr(attrs, "norm_coefficient", 0.0)}
  end,
  function(c, x, g, st)
    local r = c.R / (scalar(x, 1) + c.T * scalar(x, c.decay))
    local gr = x * scalar(x, c.norm) + g
    local h = st[1] + gr * gr
    return {x - r * gr / (h:sqrt() + scalar(x, c.eps)), h}
  end)

-- Momentum, standard or Nesterov's: G_reg = norm_coefficient * X + G;
-- V_new = alpha * V + (T > 0 ? beta : 1) * G_reg; X_new = X - R * V_new
-- (standard) or X - R * (G_reg + alpha * V_new) (nesterov).
TRAINING_OPS.Momentum = optimizer(1, set("alpha", "beta", "mode", "norm_coefficient"),
  function(node, attrs)
    local c = {alpha = need_attr(node, attrs, "alpha"), beta = need_attr(node, attrs, "beta"),
               mode = need_attr(node, attrs, "mode"), norm = need_attr(node, attrs, "norm_coefficient")}
    if c.mode ~= "standard" and c.mode ~= "nesterov" then
      node_error(node, "mode '%s' (standard or nesterov)", clean(tostring(c.mode)))
    end
    return c
  end,
  function(c, x, g, st)
    local gr = x * scalar(x, c.norm) + g
    local b = fl.where(c.started, scalar(x, c.beta), scalar(x, 1))
    local v = st[1] * scalar(x, c.alpha) + b * gr
    if c.mode == "standard" then return {x - c.R * v, v} end
    return {x - c.R * (gr + v * scalar(x, c.alpha)), v}
  end)

-- Adam: G_reg = norm_coefficient * X + G; V_new = alpha * V + (1 - alpha) *
-- G_reg; H_new = beta * H + (1 - beta) * G_reg^2; R_adj = T > 0 ? R *
-- sqrt(1 - beta^T) / (1 - alpha^T) : R; X_new = (1 - norm_coefficient_post)
-- * (X - R_adj * V_new / (sqrt(H_new) + epsilon)).
TRAINING_OPS.Adam = optimizer(2, set("alpha", "beta", "epsilon", "norm_coefficient", "norm_coefficient_post"),
  function(_, attrs)
    return {alpha = attr(attrs, "alpha", 0.9), beta = attr(attrs, "beta", 0.999),
            eps = attr(attrs, "epsilon", 1e-6), norm = attr(attrs, "norm_coefficient", 0.0),
            post = attr(attrs, "norm_coefficient_post", 0.0)}
  end,
  function(c, x, g, st)
    local gr = x * scalar(x, c.norm) + g
    local v = st[1] * scalar(x, c.alpha) + gr * scalar(x, 1 - c.alpha)
    local h = st[2] * scalar(x, c.beta) + gr * gr * scalar(x, 1 - c.beta)
    local one = scalar(x, 1)
    local corrected = c.R * (one - fl.pow(scalar(x, c.beta), c.T)):sqrt() / (one - fl.pow(scalar(x, c.alpha), c.T))
    local r = fl.where(c.started, corrected, c.R)
    local xn = x - r * v / (h:sqrt() + scalar(x, c.eps))
    if c.post ~= 0 then xn = xn * scalar(x, 1 - c.post) end
    return {xn, v, h}
  end)

TRAINING_OPS.Gradient = function(node)
  unsupported(node, "op Gradient (the gradients of a graph's values, computed by the runtime)")
end

-- ---------------------------------------------------------------------------
-- nodes, subgraphs and control flow
-- ---------------------------------------------------------------------------

-- ---------------------------------------------------------------------------
-- ai.onnx.ml: the classical machine-learning ops, as tensor ops (they
-- compile with the rest of the graph)
-- ---------------------------------------------------------------------------
do   -- (this section's helpers are its own)

-- a tensor attribute's values as an fl tensor of the given dtype
local function tensor_attr(node, attrs, name, dtype)
  local a = attrs[name]
  if a == nil then return nil end
  if type(a) ~= "table" or not a.tensor then node_error(node, "attribute %s must be a tensor", name) end
  return a.tensor:to(dtype)
end

-- Binarizer: 1 where x > threshold, else 0, in x's type
ML_OPS.Binarizer = function(node, attrs)
  known_attrs(node, attrs, set("threshold"))
  local th = attr(attrs, "threshold", 0.0)
  return function(ins)
    local t = T(node, ins[1], "X")
    return {t:gt(fl.full({}, th, {dtype = t.dtype == "int64" and "float64" or t.dtype})):to(t.dtype)}
  end
end
takes_wide("Binarizer", {1}, {keep = true, refuse = set("uint64"), ops = ML_OPS})

-- ArrayFeatureExtractor: x[..., y] along the last dim, y's values (any
-- shape) flattened; a 1-d x gives [1, n], as the reference
ML_OPS.ArrayFeatureExtractor = function(node, attrs)
  known_attrs(node, attrs, {})
  return function(ins)
    local x, y = T(node, ins[1], "X"), T(node, ins[2], "Y")
    if y.dtype ~= "int64" then node_error(node, "Y of dtype %s (int64 indices)", y.dtype) end
    local t = fl.gather(x, x:dim(), y:reshape(-1))
    return {x:dim() == 1 and t:reshape(1, y:numel()) or t}
  end
end
takes_wide("ArrayFeatureExtractor", {1}, {keep = true, moves = true, ops = ML_OPS})

-- TreeEnsemble (opset 5) without walking a tree per sample: every node's
-- test is computed for every sample at once (x's feature gathered, then
-- compared by the node's mode; a NaN passes where the node's missing
-- values track true, and NEQ's test), and
-- each root-to-leaf path of each tree is a column whose sample reaches
-- that leaf when all its tests go its way: S @ A counts them (A: +1 for a
-- test the path needs true, -1 for one it needs false).  The leaves
-- reached are summed per target in float64 (one matrix product), or their
-- min or max taken.  post_transform NONE, SOFTMAX and LOGISTIC.
local MODES = {[0] = "le", "lt", "ge", "gt", "eq", "ne", "member"}
local AGGREGATE = {[0] = "average", "sum", "min", "max"}
local POST = {[0] = "none", "softmax", "logistic"}
local PATHS_MAX = 1 << 20

ML_OPS.TreeEnsemble = function(node, attrs)
  known_attrs(node, attrs, set("aggregate_function", "leaf_targetids", "leaf_weights", "membership_values",
    "n_targets", "nodes_falseleafs", "nodes_falsenodeids", "nodes_featureids", "nodes_hitrates",
    "nodes_missing_value_tracks_true", "nodes_modes", "nodes_splits", "nodes_trueleafs", "nodes_truenodeids",
    "post_transform", "tree_roots"))
  local agg = AGGREGATE[attr(attrs, "aggregate_function", 1)]
  local post = POST[attr(attrs, "post_transform", 0)]
  if not agg then node_error(node, "aggregate_function %s", tostring(attrs.aggregate_function)) end
  if not post then unsupported(node, "post_transform %s (NONE, SOFTMAX and LOGISTIC only)", tostring(attrs.post_transform)) end
  local ntargets = attrs.n_targets
  if math.type(ntargets) ~= "integer" or ntargets < 1 then node_error(node, "n_targets must be a positive integer") end
  local function list(name)
    local v = attrs[name]
    if v == nil then node_error(node, "attribute %s is missing", name) end
    return v
  end
  local ttrue, tfalse = list("nodes_truenodeids"), list("nodes_falsenodeids")
  local ltrue, lfalse = list("nodes_trueleafs"), list("nodes_falseleafs")
  local feats, roots, targets = list("nodes_featureids"), list("tree_roots"), list("leaf_targetids")
  local nn = #feats
  if nn == 0 or #roots == 0 then node_error(node, "an ensemble of %d nodes and %d trees", nn, #roots) end
  local modes = tensor_attr(node, attrs, "nodes_modes", "int64")
  modes = modes and modes:tolist() or {}
  local mtt = {}
  for i = 1, nn do mtt[i] = (attrs.nodes_missing_value_tracks_true or {})[i] or 0 end
  local splits = tensor_attr(node, attrs, "nodes_splits", "float64")
  local weights = tensor_attr(node, attrs, "leaf_weights", "float64")
  if not splits or not weights then node_error(node, "nodes_splits and leaf_weights are required") end
  splits, weights = splits:tolist(), weights:tolist()
  for _, l in ipairs{ttrue, tfalse, ltrue, lfalse, modes, splits} do
    if #l ~= nn then node_error(node, "the nodes_* attributes differ in length (%d features, %d)", nn, #l) end
  end
  if #weights ~= #targets then node_error(node, "%d leaf_weights for %d leaf_targetids", #weights, #targets) end
  for i = 1, nn do
    if not MODES[modes[i]] then node_error(node, "node %d: mode %s", i - 1, tostring(modes[i])) end
  end
  -- the member sets, in node order, each ended by a NaN
  local members, mnode = {}, {}
  do
    local mv = tensor_attr(node, attrs, "membership_values", "float64")
    mv = mv and mv:tolist() or {}
    local at = 1
    for i = 1, nn do
      if MODES[modes[i]] == "member" then
        if at > #mv then node_error(node, "membership_values ends before node %d's set", i - 1) end
        while at <= #mv and mv[at] == mv[at] do
          members[#members + 1], mnode[#mnode + 1] = mv[at], i
          at = at + 1
        end
        at = at + 1
      end
    end
  end
  -- every path: its leaf and the tests it needs ({node, true?})
  local paths = {}
  local function leaf(i)
    if math.type(i) ~= "integer" or i < 0 or i >= #weights then node_error(node, "leaf %s out of range", tostring(i)) end
    return i + 1
  end
  local function walk(n, need, depth)
    if math.type(n) ~= "integer" or n < 0 or n >= nn then node_error(node, "node id %s out of range", tostring(n)) end
    if depth > nn then node_error(node, "the trees have a cycle through node %d", n) end
    for _, side in ipairs{true, false} do
      local id = side and ttrue[n + 1] or tfalse[n + 1]
      local is_leaf = (side and ltrue[n + 1] or lfalse[n + 1]) ~= 0
      local nd = {table.unpack(need)}
      nd[#nd + 1] = {n + 1, side}
      if is_leaf then
        if #paths >= PATHS_MAX then unsupported(node, "trees of more than %d paths", PATHS_MAX) end
        paths[#paths + 1] = {leaf = leaf(id), need = nd}
      else
        walk(id, nd, depth + 1)
      end
    end
  end
  for _, r in ipairs(roots) do
    if math.type(r) ~= "integer" or r < 0 or r >= nn then node_error(node, "tree root %s out of range", tostring(r)) end
    if ltrue[r + 1] ~= 0 and lfalse[r + 1] ~= 0 and ttrue[r + 1] == tfalse[r + 1] then
      paths[#paths + 1] = {leaf = leaf(r), need = {}}   -- a tree that is one leaf (the reference's reading)
    else
      walk(r, {}, 0)
    end
  end
  for _, t in ipairs(targets) do
    if math.type(t) ~= "integer" or t < 0 or t >= ntargets then node_error(node, "leaf target %s out of range", tostring(t)) end
  end
  -- the constants every call reads, made once here: A [nodes, paths], and
  -- per path the tests it needs false (offs) and in all (needs)
  local np = #paths
  local function f64(l, ...) return fl.tensor(l, {dtype = "float64"}):reshape(...) end
  local A, offs, needs = {}, {}, {}
  for i = 1, nn * np do A[i] = 0 end
  for p, path in ipairs(paths) do
    offs[p] = 0
    for _, q in ipairs(path.need) do
      A[(q[1] - 1) * np + p] = q[2] and 1 or -1
      if not q[2] then offs[p] = offs[p] + 1 end
    end
    needs[p] = #path.need      -- S @ A + (tests needed false) = all of them
  end
  local At, offt, needt = f64(A, nn, np), f64(offs, np), f64(needs, np)
  local featt = fl.tensor(feats, {dtype = "int64"})
  local splitt = f64(splits, nn)
  local mtt_t = fl.tensor(mtt, {dtype = "int64"}):ne(fl.zeros({}, {dtype = "int64"}))
  local is_mode = {}                 -- [nodes] bool per mode code
  do
    local modet = fl.tensor(modes, {dtype = "int64"})
    for code in pairs(MODES) do is_mode[code] = modet:eq(fl.full({}, code, {dtype = "int64"})) end
  end
  local mfeatt, membert, intot
  if #members > 0 then
    local mfeat, into = {}, {}
    for j, n in ipairs(mnode) do mfeat[j] = feats[n] end
    for j = 1, #members * nn do into[j] = 0 end
    for j, n in ipairs(mnode) do into[(j - 1) * nn + n] = 1 end
    mfeatt, membert, intot = fl.tensor(mfeat, {dtype = "int64"}), f64(members, #members), f64(into, #members, nn)
  end
  -- what the reached leaves give: W [paths, targets] (sum, average), or
  -- each path's weight and, per target, which paths are its (min, max)
  local Wt, wlt, of_target = nil, nil, {}
  local big = agg == "min" and math.huge or -math.huge
  if agg == "sum" or agg == "average" then
    local W = {}
    for p = 1, np do
      for t = 0, ntargets - 1 do W[(p - 1) * ntargets + t + 1] = 0 end
      local l = paths[p].leaf
      W[(p - 1) * ntargets + targets[l] + 1] = agg == "average" and weights[l] / #roots or weights[l]
    end
    Wt = f64(W, np, ntargets)
  else
    local wl = {}
    for p = 1, np do wl[p] = weights[paths[p].leaf] end
    wlt = f64(wl, 1, np)
    for t = 0, ntargets - 1 do
      local m = {}
      for p = 1, np do m[p] = targets[paths[p].leaf] == t and 1 or 0 end
      of_target[t + 1] = f64(m, 1, np):gt(fl.zeros({}, {dtype = "float64"}))
    end
  end
  return function(ins)
    local x = T(node, ins[1], "X")
    need_float(node, x, "X")
    if x:dim() ~= 2 then node_error(node, "X of %d dims (expected [N, features])", x:dim()) end
    for _, f in ipairs(feats) do
      if math.type(f) ~= "integer" or f < 0 or f >= x.shape[2] then
        node_error(node, "feature %s of X's %s", tostring(f), tostring(x.shape[2]))
      end
    end
    local dt = x.dtype
    local xf = fl.gather(x, 2, featt)                               -- [N, nodes]
    local sp = splitt:to(dt)
    local tests = {le = xf:le(sp), lt = xf:lt(sp), ge = xf:ge(sp), gt = xf:gt(sp), eq = xf:eq(sp), ne = xf:ne(sp)}
    local s = fl.zeros(x.shape[1], nn, {dtype = "bool"})
    for code, name in pairs(MODES) do
      if name ~= "member" then s = fl.where(is_mode[code], tests[name], s) end
    end
    if mfeatt then
      local hit = fl.gather(x, 2, mfeatt):eq(membert:to(dt)):to("float64")   -- [N, members]
      s = fl.where(is_mode[6], fl.matmul(hit, intot):gt(fl.zeros({}, {dtype = "float64"})), s)
    end
    -- NaN: the test (false, but true for NEQ) or the missing value's branch
    local miss = fl.where(xf:ne(xf), mtt_t, fl.zeros({}, {dtype = "bool"}))
    s = fl.where(miss, miss, s)
    local reached = (fl.matmul(s:to("float64"), At) + offt):eq(needt)   -- [N, paths]
    local y
    if Wt then
      y = fl.matmul(reached:to("float64"), Wt)
    else
      local none = fl.full({}, big, {dtype = "float64"})
      local vals = fl.where(reached, wlt, none)
      local cols = {}
      for t = 1, ntargets do
        local v = fl.where(of_target[t], vals, none)
        cols[t] = agg == "min" and v:amin(2, true) or v:amax(2, true)
      end
      y = fl.cat(cols, 2)
      -- no leaf of a target reached: the reference's starting value, the
      -- type's largest (min) or lowest (max) finite value
      local lim = dt == "float64" and 1.7976931348623157e308 or 3.4028234663852886e38
      y = fl.where(y:eq(none), fl.full({}, agg == "min" and lim or -lim, {dtype = "float64"}), y)
    end
    y = y:to(dt)
    if post == "softmax" then y = y:softmax(2) elseif post == "logistic" then y = y:sigmoid() end
    return {y}
  end
end

end
-- ops whose attributes may hold a subgraph (FlexAttention: ai.onnx.preview's)
local SUBGRAPH_OPS = set("If", "Loop", "Scan", "SequenceMap", "FlexAttention")

-- Lower one node (at load).  The names its subgraphs read from enclosing
-- scopes (node.implicit) become inputs after its own, so the loop below
-- reads them as it reads any input; node.nin counts its own.
function lower_node(node, opset)
  node.opset = opset
  if node.name == "" then node.name = node.outputs[1] or "?" end
  local lower = OPS[node.op]
  local dom, only
  for _, d in ipairs(DOMAINS) do
    if node.domain == d.name then dom = d end
    if d.opset > 0 then only = only or d.name end
  end
  if dom then
    -- its subgraphs' ai.onnx nodes take the model's ai.onnx opset
    node.opset, node.onnx_opset = dom.opset, opset
    if dom.opset == 0 then node_error(node, "domain %s, which the model does not import", dom.name) end
    lower = dom.ops[node.op]
    if not lower then unsupported(node, "op %s of %s", clean(node.op), dom.name) end
  elseif opset == 0 then
    unsupported(node, "op %s: the model imports no ai.onnx opset (only %s)", clean(node.op), only)
  end
  if not lower then unsupported(node, "op %s", clean(node.op)) end
  for k, kind in pairs(node.kinds or {}) do
    if kind == "other" or kind == "graph" and not SUBGRAPH_OPS[node.op] then
      unsupported(node, "attribute '%s' of kind %s", clean(k), kind)
    end
  end
  node.nin = #node.inputs
  node.run = lower(node, node.attrs, node.opset)
  for _, name in ipairs(node.implicit or {}) do node.inputs[#node.inputs + 1] = name end
end

-- Run sorted nodes over env (value name -> value), adding their outputs.
function run_nodes(nodes, env)
  for _, node in ipairs(nodes) do
    local ins = {}
    for i, name in ipairs(node.inputs) do
      if name ~= "" then
        local v = env[name]
        if v == nil then node_error(node, "input '%s' has no value", name) end
        ins[i] = v
      end
    end
    local outs = node.run(ins)
    for i, name in ipairs(node.outputs) do
      if name ~= "" then
        if outs[i] == nil then unsupported(node, "output %d", i) end
        env[name] = outs[i]
      end
    end
  end
end

-- A subgraph attribute lowered: run(inputs, outer) -> its outputs, where
-- inputs are its graph inputs' values in order and outer maps the names it
-- reads from enclosing scopes to their values.  Its nodes take the opset
-- given (that of node's, when none is).
local function lower_graph(node, g, what, opset)
  if type(g) ~= "table" or not g.nodes then node_error(node, "attribute '%s' must be a graph", what) end
  local consts = {}
  for _, init in ipairs(g.initializers) do
    local t = init.tensor
    if FL_DTYPE[init.dtype] then
      consts[init.name] = (t.dtype == "int64" and t:dim() <= 1 and t:numel() <= 64) and host_of_tensor(t) or t
      CONST[t] = true
    else
      consts[init.name] = {wide = init.dtype, t = t, const = true}
    end
  end
  for _, n in ipairs(g.nodes) do lower_node(n, opset or node.opset) end
  return function(inputs, outer)
    local env = {}
    for k, v in pairs(outer) do env[k] = v end
    for k, v in pairs(consts) do env[k] = v end
    for i, v in ipairs(g.inputs) do env[v.name] = inputs[i] end
    run_nodes(g.nodes, env)
    local res = {}
    for i, v in ipairs(g.outputs) do
      res[i] = env[v.name]
      if res[i] == nil then node_error(node, "%s: output '%s' has no value", what, clean(v.name)) end
    end
    return res
  end
end

-- The values a node's subgraphs read, by name (its inputs past node.nin).
local function outer_values(node, ins)
  local outer = {}
  for i, name in ipairs(node.implicit or {}) do outer[name] = ins[node.nin + i] end
  return outer
end

-- A one-element bool (or integer) value as a Lua boolean: a data-dependent
-- branch, which one graph cannot hold (fl.compile breaks the graph there).
-- A host value is known already: sizes hold numbers (nonzero is true), a
-- host bool (Equal over sizes) Lua booleans, false being false.
local function truth(node, v, what)
  if not is_tensor(v) then
    if v.seq or v.opt then node_error(node, "%s must be a tensor", what) end
    if v.wide then v = v.t
    else
      if #v.v ~= 1 then node_error(node, "%s must hold one value", what) end
      if v.hostbool then return v.v[1] == true end
      return v.v[1] ~= 0
    end
  end
  if v:numel() ~= 1 then node_error(node, "%s must hold one value", what) end
  local x = v:reshape({-1})
  if x.dtype ~= "bool" then x = x:ne(fl.zeros({}, {dtype = x.dtype})) end
  return concrete(node, x, what, "branch").v[1]
end

local function bool_value(b)
  return b and fl.ones({}, {dtype = "bool"}) or fl.zeros({}, {dtype = "bool"})
end

-- fn on a value's tensor, keeping a narrow type's mark
local function on_value(node, v, fn)
  if not is_tensor(v) and v.wide then return {wide = v.wide, t = fn(v.t)} end
  return fn(T(node, v))
end

-- values (one per step, of one shape) stacked along a new dim d (1-based)
local function stack(node, vals, d, what)
  local first = vals[1]
  local wide = not is_tensor(first) and first.wide
  local parts = {}
  for i, v in ipairs(vals) do
    if (not is_tensor(v) and v.wide) ~= wide then node_error(node, "%s changes its dtype between steps", what) end
    local t = wide and v.t or T(node, v)
    if i > 1 and #t.shape ~= #parts[1].shape - 1 then node_error(node, "%s changes its rank between steps", what) end
    parts[i] = t:unsqueeze(d)
  end
  local ok, y = pcall(fl.cat, parts, d)
  if not ok then node_error(node, "%s changes its shape between steps", what) end
  return wide and {wide = wide, t = y} or y
end

-- If: the branch the condition picks, run eagerly (a data-dependent
-- condition is a graph break under fl.compile).
OPS.If = function(node, attrs)
  known_attrs(node, attrs, set("then_branch", "else_branch"))
  local yes = lower_graph(node, attrs.then_branch, "then_branch")
  local no = lower_graph(node, attrs.else_branch, "else_branch")
  return function(ins)
    local c = ins[1]
    if c == nil then node_error(node, "the condition is missing") end
    return (truth(node, c, "the condition") and yes or no)({}, outer_values(node, ins))
  end
end

-- Loop: the body run while the trip count M (if given) is not reached and
-- its condition holds; the loop-carried values go round, the scan outputs
-- are stacked along a new first dim.
OPS.Loop = function(node, attrs)
  known_attrs(node, attrs, set("body"))
  local g = attrs.body
  local body = lower_graph(node, g, "body")
  local nstate = node.nin - 2
  local nscan = #g.outputs - 1 - nstate
  if nstate < 0 or #g.inputs ~= nstate + 2 or nscan < 0 then
    node_error(node, "a body of %d inputs and %d outputs for %d loop-carried values", #g.inputs, #g.outputs,
               math.max(nstate, 0))
  end
  return function(ins)
    local outer = outer_values(node, ins)
    local M = ins[1] ~= nil and number(node, ins[1], "M") or nil
    local cond = true
    if ins[2] ~= nil then cond = truth(node, ins[2], "cond") end
    if M == nil and ins[2] == nil then unsupported(node, "a Loop with neither M nor cond (it never ends)") end
    local state, scans = {}, {}
    for k = 1, nstate do state[k] = ins[2 + k] end
    for j = 1, nscan do scans[j] = {} end
    local i = 0
    while (M == nil or i < M) and cond do
      local outs = body({host({i}, true), bool_value(cond), table.unpack(state, 1, nstate)}, outer)
      cond = truth(node, outs[1], "the body's condition")
      for k = 1, nstate do state[k] = outs[1 + k] end
      for j = 1, nscan do scans[j][i + 1] = outs[1 + nstate + j] end
      i = i + 1
    end
    local res = {table.unpack(state, 1, nstate)}
    for j = 1, nscan do
      if i == 0 then unsupported(node, "scan outputs of a Loop that runs no iteration") end
      res[nstate + j] = stack(node, scans[j], 1, "scan output " .. j)
    end
    return res
  end
end

-- One Scan run of n steps: the body once per step along each scan input's
-- axis (from the end where its direction is 1), the state values going
-- round, the scan outputs stacked along their axes (reversed where their
-- direction is 1).  The step count is a size: under capture the loop
-- unrolls into one graph.
local function scan_run(node, body, outer, state, xs, axes, n, in_dirs, out_axes, out_dirs, k)
  local nstate, m = #state, #xs
  if n == 0 and k > 0 then unsupported(node, "scan outputs of a Scan over no step") end
  local scans = {}
  for j = 1, k do scans[j] = {} end
  for step = 1, n do
    local slices = {}
    for j = 1, m do
      local at = (in_dirs[j] or 0) ~= 0 and n + 1 - step or step
      slices[j] = on_value(node, xs[j], function(t) return t:narrow(axes[j], at, 1):squeeze(axes[j]) end)
    end
    local args = {table.unpack(state, 1, nstate)}
    for j = 1, m do args[nstate + j] = slices[j] end
    local outs = body(args, outer)
    for s = 1, nstate do state[s] = outs[s] end
    for j = 1, k do scans[j][step] = outs[nstate + j] end
  end
  local res = {table.unpack(state, 1, nstate)}
  for j = 1, k do
    local l = scans[j]
    if (out_dirs[j] or 0) ~= 0 then
      local r = {}
      for i = 1, n do r[i] = l[n + 1 - i] end
      l = r
    end
    local first = l[1]
    local r0 = (not is_tensor(first) and first.wide) and first.t:dim() or T(node, first):dim()
    res[nstate + j] = stack(node, l, axis(node, out_axes[j] or 0, r0 + 1, "scan output axis"), "scan output " .. j)
  end
  return res
end

-- The tensor of a value, a narrow type's included (its mark dropped).
local function raw(node, v, what) return (not is_tensor(v) and v and v.wide) and v.t or T(node, v, what) end

-- Scan before opset 9: every state and scan input has a batch dim first,
-- the scan inputs their steps along dim 1, and sequence_lens (optional)
-- the steps each batch entry takes.  A run per batch entry over its own
-- steps (the body sees no batch dim), the results stacked back along dim
-- 1; the scan outputs past an entry's length are zeros (ONNX leaves them
-- undefined).  The lengths are data: a graph break under fl.compile.
local function scan8(node, attrs, body, g)
  local m = attrs.num_scan_inputs
  local nin = node.nin - 1
  if math.type(m) ~= "integer" or m < 1 or m > nin then
    node_error(node, "num_scan_inputs %s for %d inputs", tostring(m), nin)
  end
  local nstate = nin - m
  local k = #g.outputs - nstate
  if #g.inputs ~= nin or k < 0 then
    node_error(node, "a body of %d inputs and %d outputs for %d inputs", #g.inputs, #g.outputs, nin)
  end
  local dirs = attr(attrs, "directions", {})
  if #dirs ~= 0 and #dirs ~= m then node_error(node, "directions holds %d values for %d", #dirs, m) end
  return function(ins)
    local outer = outer_values(node, ins)
    local first = raw(node, ins[1 + nstate + 1], "scan input 1")
    if first:dim() < 2 then node_error(node, "scan inputs need a batch and a sequence dim") end
    local nb, n = static_size(first.shape[1]), first.shape[2]
    if type(n) ~= "number" then unsupported(node, "a Scan over a dynamic size") end
    for i = 2, 1 + nin do
      local t = raw(node, ins[i], i - 1 <= nstate and "initial state" or "scan input")
      if t:dim() < 1 or size_equal(t.shape[1], nb) == false then
        node_error(node, "input %d of batch size %s for %d", i - 1, tostring(t.shape[1]), nb)
      end
      if i - 1 > nstate and (t:dim() < 2 or t.shape[2] ~= n) then
        node_error(node, "scan inputs of different sequence lengths")
      end
    end
    local lens
    if ins[1] ~= nil then
      lens = ints(node, ins[1], "sequence_lens")
      if #lens ~= nb then node_error(node, "sequence_lens of %d values for a batch of %d", #lens, nb) end
      for _, l in ipairs(lens) do
        if l < 0 or l > n then node_error(node, "sequence length %d outside [0, %d]", l, n) end
      end
    end
    local per = {}
    for b = 1, nb do
      local len = lens and lens[b] or n
      local function entry(v) return on_value(node, v, function(t) return t:narrow(1, b, 1):squeeze(1) end) end
      local state, xs, axes = {}, {}, {}
      for s = 1, nstate do state[s] = entry(ins[1 + s]) end
      for j = 1, m do
        xs[j] = on_value(node, entry(ins[1 + nstate + j]), function(t) return t:narrow(1, 1, len) end)
        axes[j] = 1
      end
      local res = scan_run(node, body, outer, state, xs, axes, len, dirs, {}, {}, k)
      for j = 1, k do
        local v = res[nstate + j]
        if len < n then
          if not is_tensor(v) and v.wide then unsupported(node, "padding scan outputs of dtype %s", v.wide) end
          local t = T(node, v)
          local shape = {n - len}
          for d = 2, t:dim() do shape[d] = t.shape[d] end
          res[nstate + j] = fl.cat({t, fl.zeros(shape, {dtype = t.dtype})}, 1)
        end
      end
      per[b] = res
    end
    local res = {}
    for i = 1, nstate + k do
      local vals = {}
      for b = 1, nb do vals[b] = per[b][i] end
      res[i] = stack(node, vals, 1, i <= nstate and "state " .. i or "scan output " .. (i - nstate))
    end
    return res
  end
end

-- Scan (opset 9 on): one run over the scan inputs' axes, no batch dim.
OPS.Scan = function(node, attrs, opset)
  if opset < 9 then
    known_attrs(node, attrs, set("body", "num_scan_inputs", "directions"))
    return scan8(node, attrs, lower_graph(node, attrs.body, "body"), attrs.body)
  end
  known_attrs(node, attrs, set("body", "num_scan_inputs", "scan_input_axes", "scan_input_directions",
                               "scan_output_axes", "scan_output_directions"))
  local g = attrs.body
  local body = lower_graph(node, g, "body")
  local m = attrs.num_scan_inputs
  if math.type(m) ~= "integer" or m < 1 or m > node.nin then
    node_error(node, "num_scan_inputs %s for %d inputs", tostring(m), node.nin)
  end
  local nstate = node.nin - m
  local k = #g.outputs - nstate
  if #g.inputs ~= node.nin or k < 0 then
    node_error(node, "a body of %d inputs and %d outputs for %d inputs", #g.inputs, #g.outputs, node.nin)
  end
  local in_axes, in_dirs = attr(attrs, "scan_input_axes", {}), attr(attrs, "scan_input_directions", {})
  local out_axes, out_dirs = attr(attrs, "scan_output_axes", {}), attr(attrs, "scan_output_directions", {})
  for _, l in ipairs({{in_axes, m, "scan_input_axes"}, {in_dirs, m, "scan_input_directions"},
                      {out_axes, k, "scan_output_axes"}, {out_dirs, k, "scan_output_directions"}}) do
    if #l[1] ~= 0 and #l[1] ~= l[2] then node_error(node, "%s holds %d values for %d", l[3], #l[1], l[2]) end
  end
  return function(ins)
    local outer = outer_values(node, ins)
    local xs, axes, n = {}, {}, nil
    for j = 1, m do
      local v = ins[nstate + j]
      local t = raw(node, v, "scan input " .. j)
      axes[j] = axis(node, in_axes[j] or 0, t:dim(), "scan input axis")
      local len = t.shape[axes[j]]
      if type(len) ~= "number" then unsupported(node, "a Scan over a dynamic size") end
      if n and len ~= n then node_error(node, "scan inputs of lengths %d and %d", n, len) end
      n, xs[j] = len, v
    end
    local state = {}
    for s = 1, nstate do state[s] = ins[s] end
    return scan_run(node, body, outer, state, xs, axes, n, in_dirs, out_axes, out_dirs, k)
  end
end

-- ---------------------------------------------------------------------------
-- sequences and optionals
-- ---------------------------------------------------------------------------

-- A sequence is {seq=true, dtype=, [1..n]=values}: an ordered list of
-- values as any node makes them (tensors, host vectors, narrow-marked
-- tensors), dtype the ONNX name its elements have (nil: not known, an
-- empty sequence of a graph input).  An optional is {opt=true, v=value},
-- v a tensor value or a sequence, nil when empty.  Both are Lua-level:
-- under fl.compile the tensors they hold are graph values like any other.
-- No op changes a sequence it is given: each makes a new one.
local function onnx_dtype(v) return ONNX_DTYPE[dtype_of(v)] or dtype_of(v) end

local function is_seq(v) return type(v) == "table" and v.seq == true end
local function is_opt(v) return type(v) == "table" and v.opt == true end

local function sequence(vals, dtype)
  vals.seq, vals.dtype = true, dtype
  return vals
end

local function the_seq(node, v, what)
  if v == nil then node_error(node, "%s is missing", what) end
  if not is_seq(v) then node_error(node, "%s must be a sequence", what) end
  return v
end

-- A tensor value for a sequence of dtype dt (nil: any).
local function element(node, v, dt, what)
  if v == nil then node_error(node, "%s is missing", what) end
  if is_seq(v) or is_opt(v) then node_error(node, "%s must be a tensor", what) end
  local got = onnx_dtype(v)
  if dt and got ~= dt then node_error(node, "%s of dtype %s for a sequence of %s", what, got, dt) end
  return v
end

-- The element count of a sequence as a copy of its values (1-based).
local function copy_seq(s)
  local out = {}
  for i = 1, #s do out[i] = s[i] end
  return out
end

-- A position (0-based, negative from the back) in [-n, hi], as 1-based.
local function position(node, v, n, hi, what)
  local p = number(node, v, what or "position")
  if math.type(p) ~= "integer" then node_error(node, "position %s is not an integer", tostring(p)) end
  if p < -n or p > hi then
    node_error(node, "position %d out of range for a sequence of %d tensors ([%d, %d])", p, n, -n, hi)
  end
  if p < 0 then p = p + n end
  return p + 1
end

local function check_position(node, v)
  if v ~= nil and not is_seq(v) and not is_opt(v) then
    local dt = dtype_of(v)
    if dt ~= "int64" and dt ~= "int32" then node_error(node, "position must be int32 or int64, got %s", dt) end
  end
end

OPS.SequenceEmpty = function(node, attrs)
  known_attrs(node, attrs, set("dtype"))
  local name = DTYPE_CODE[attr(attrs, "dtype", 1)]
  if not name or not (FL_DTYPE[name] or WIDE[name] or SMALLF[name]) then
    unsupported(node, "a sequence of dtype %s", name or tostring(attrs.dtype))
  end
  return function() return {sequence({}, name)} end
end

OPS.SequenceConstruct = function(node, attrs)
  known_attrs(node, attrs, {})
  return function(ins)
    if node.nin < 1 then node_error(node, "no inputs (SequenceEmpty makes an empty sequence)") end
    local dt = onnx_dtype(element(node, ins[1], nil, "input 1"))
    local out = {}
    for i = 1, node.nin do out[i] = element(node, ins[i], dt, "input " .. i) end
    return {sequence(out, dt)}
  end
end

OPS.SequenceInsert = function(node, attrs)
  known_attrs(node, attrs, {})
  return function(ins)
    local s = the_seq(node, ins[1], "input_sequence")
    local x = element(node, ins[2], s.dtype, "the tensor")
    check_position(node, ins[3])
    local at = ins[3] ~= nil and position(node, ins[3], #s, #s) or #s + 1
    local out = copy_seq(s)
    table.insert(out, at, x)
    return {sequence(out, s.dtype or onnx_dtype(x))}
  end
end

OPS.SequenceErase = function(node, attrs)
  known_attrs(node, attrs, {})
  return function(ins)
    local s = the_seq(node, ins[1], "input_sequence")
    check_position(node, ins[2])
    if #s == 0 then node_error(node, "erasing from an empty sequence") end
    local at = ins[2] ~= nil and position(node, ins[2], #s, #s - 1) or #s
    local out = copy_seq(s)
    table.remove(out, at)
    return {sequence(out, s.dtype)}
  end
end

OPS.SequenceAt = function(node, attrs)
  known_attrs(node, attrs, {})
  return function(ins)
    local s = the_seq(node, ins[1], "input_sequence")
    if ins[2] == nil then node_error(node, "position is missing") end
    check_position(node, ins[2])
    return {s[position(node, ins[2], #s, #s - 1)]}
  end
end

OPS.SequenceLength = function(node, attrs)
  known_attrs(node, attrs, {})
  return function(ins) return {host({#the_seq(node, ins[1], "input_sequence")}, true)} end
end

-- SplitToSequence: chunks of split[i] along axis (1-D split), of split
-- each with a smaller last one (a scalar), or of 1 each, the axis kept
-- unless keepdims=0 (only without split).
OPS.SplitToSequence = function(node, attrs)
  known_attrs(node, attrs, set("axis", "keepdims"))
  local keep = attr(attrs, "keepdims", 1)
  if keep ~= 0 and keep ~= 1 then node_error(node, "keepdims %s (0 or 1)", tostring(keep)) end
  return function(ins)
    local v = element(node, ins[1], nil, "input")
    local t = (not is_tensor(v) and v.wide) and v.t or T(node, v, "input")
    local d = axis(node, attr(attrs, "axis", 0), t:dim())
    local n = static_size(t.shape[d])
    local sizes = {}
    local sv, scalar = nil, true
    if ins[2] ~= nil then sv, scalar = ints(node, ins[2], "split") end
    if sv and not scalar then
      local sum = 0
      for i, k in ipairs(sv) do
        if math.type(k) ~= "integer" or k < 0 then node_error(node, "split size %s", tostring(k)) end
        sizes[i], sum = k, sum + k
      end
      if sum ~= n then node_error(node, "split sizes sum to %d, the dim is %d", sum, n) end
    else
      local k = sv and sv[1] or 1
      if math.type(k) ~= "integer" or k < 1 then node_error(node, "split %s (must be positive)", tostring(k)) end
      check_count(node, n // k, "a sequence")
      for at = 0, n - 1, k do sizes[#sizes + 1] = math.min(k, n - at) end
    end
    local squeeze = ins[2] == nil and keep == 0
    local out, start = {}, 1
    for i, len in ipairs(sizes) do
      out[i] = on_value(node, v, function(x)
        local c = x:narrow(d, start, len)
        return squeeze and c:squeeze(d) or c
      end)
      start = start + len
    end
    return {sequence(out, onnx_dtype(v))}
  end
end

-- ConcatFromSequence: the elements concatenated along axis, or stacked
-- along a new one (new_axis=1).
OPS.ConcatFromSequence = function(node, attrs)
  known_attrs(node, attrs, set("axis", "new_axis"))
  if attrs.axis == nil then node_error(node, "attribute 'axis' is required") end
  local new = attr(attrs, "new_axis", 0)
  if new ~= 0 and new ~= 1 then node_error(node, "new_axis %s (0 or 1)", tostring(new)) end
  return function(ins)
    local s = the_seq(node, ins[1], "input_sequence")
    if #s == 0 then node_error(node, "concatenating an empty sequence") end
    local wide = not is_tensor(s[1]) and s[1].wide
    local parts = {}
    for i = 1, #s do parts[i] = wide and s[i].t or T(node, s[i], "element " .. i) end
    local r = parts[1]:dim()
    for i = 2, #parts do
      if parts[i]:dim() ~= r then node_error(node, "elements of ranks %d and %d", r, parts[i]:dim()) end
    end
    local d = axis(node, attrs.axis, r + new, "axis")
    if new == 1 then
      for i, p in ipairs(parts) do parts[i] = p:unsqueeze(d) end
    end
    local ok, y = pcall(fl.cat, parts, d)
    if not ok then node_error(node, "elements of shapes that do not concatenate along axis %d", attrs.axis) end
    return {wide and {wide = wide, t = y} or y}
  end
end

-- SequenceMap: the body once per element of the first input (a
-- sequence), given the element at that position of each sequence input
-- and each tensor input whole; output j is the sequence of the body's
-- output j.
OPS.SequenceMap = function(node, attrs)
  known_attrs(node, attrs, set("body"))
  local g = attrs.body
  local body = lower_graph(node, g, "body")
  if #g.inputs ~= node.nin or #g.outputs ~= #node.outputs then
    node_error(node, "a body of %d inputs and %d outputs for %d inputs and %d outputs", #g.inputs,
               #g.outputs, node.nin, #node.outputs)
  end
  return function(ins)
    local outer = outer_values(node, ins)
    local n = #the_seq(node, ins[1], "input_sequence")
    for k = 2, node.nin do
      if ins[k] == nil then node_error(node, "input %d is missing", k) end
      if is_seq(ins[k]) and #ins[k] ~= n then
        node_error(node, "input %d is a sequence of %d tensors, the first of %d", k, #ins[k], n)
      end
    end
    local res = {}
    for j = 1, #node.outputs do res[j] = {} end
    for i = 1, n do
      local args = {}
      for k = 1, node.nin do args[k] = is_seq(ins[k]) and ins[k][i] or ins[k] end
      local outs = body(args, outer)
      for j = 1, #node.outputs do res[j][i] = element(node, outs[j], nil, "body output " .. j) end
    end
    for j = 1, #node.outputs do
      local dt = res[j][1] and onnx_dtype(res[j][1])
      local want = g.outputs[j].dtype
      if not dt and want ~= "unknown" then dt = want end
      res[j] = sequence(res[j], dt)
    end
    return res
  end
end

-- FlexAttention (ai.onnx.preview, opset 1) as its reference: each K/V
-- head shared by a contiguous group of query heads (h0 h0 h1 h1), Q and K
-- each scaled by sqrt(scale) (rounded to float32, as the reference does)
-- and multiplied in their dtype; the scores then in softmax_precision
-- (float32 for 16-bit inputs, else theirs) through score_mod, a plain
-- softmax over the keys (a row all -inf is NaN, as there), prob_mod, and
-- the product with V in that precision, cast back.  A modifier is a
-- subgraph of one [B, Hq, L, S] input and output, run once on the whole
-- tensor: its ops are the one graph's, never a loop over elements.
PREVIEW_OPS.FlexAttention = function(node, attrs)
  known_attrs(node, attrs, set("scale", "score_mod", "prob_mod", "softmax_precision"))
  local mods = {}
  for _, name in ipairs({"score_mod", "prob_mod"}) do
    local g = attrs[name]
    if g ~= nil then
      mods[name] = lower_graph(node, g, name, node.onnx_opset)
      if #g.inputs ~= 1 or #g.outputs ~= 1 then
        node_error(node, "%s: a graph of %d inputs and %d outputs (1 and 1)", name, #g.inputs, #g.outputs)
      end
    end
  end
  local precision = attrs.softmax_precision
  if precision ~= nil then
    precision = math.type(precision) == "integer" and FL_DTYPE[DTYPE_CODE[precision]]
    if not FLOAT[precision] then unsupported(node, "softmax_precision %s", tostring(attrs.softmax_precision)) end
  end
  local sc = attrs.scale
  if sc ~= nil and type(sc) ~= "number" then node_error(node, "attribute 'scale' must be a float") end
  if node.nin ~= 3 or #node.outputs ~= 1 then
    node_error(node, "%d inputs and %d outputs (Q, K, V and Y)", node.nin, #node.outputs)
  end
  return function(ins)
    local outer = outer_values(node, ins)
    local q, k, v = T(node, ins[1], "Q"), T(node, ins[2], "K"), T(node, ins[3], "V")
    need_float(node, q, "Q")
    for _, x in ipairs({{k, "K"}, {v, "V"}}) do
      if x[1].dtype ~= q.dtype then node_error(node, "%s of dtype %s, Q of %s", x[2], x[1].dtype, q.dtype) end
    end
    for _, x in ipairs({{q, "Q"}, {k, "K"}, {v, "V"}}) do
      if x[1]:dim() ~= 4 then node_error(node, "%s of %d dims (4)", x[2], x[1]:dim()) end
    end
    local function same(a, b, what)
      if size_equal(a, b) == false then node_error(node, "%s differ (%s and %s)", what, tostring(a), tostring(b)) end
    end
    local E = q.shape[4]
    same(q.shape[1], k.shape[1], "the batch sizes of Q and K")
    same(k.shape[1], v.shape[1], "the batch sizes of K and V")
    same(k.shape[2], v.shape[2], "the head counts of K and V")
    same(k.shape[3], v.shape[3], "the sequence lengths of K and V")
    same(E, k.shape[4], "the head sizes of Q and K")
    local hq, hkv = static_size(q.shape[2]), static_size(k.shape[2])
    if hq ~= hkv then
      if hkv < 1 or hq % hkv ~= 0 then node_error(node, "%d query heads over %d key heads", hq, hkv) end
      local rep = hq // hkv
      local function repeat_heads(x)
        local b, h, s, d = table.unpack(x.shape)
        return x:reshape({b, h, 1, s, d}):expand({b, h, rep, s, d}):reshape({b, h * rep, s, d})
      end
      k, v = repeat_heads(k), repeat_heads(v)
    end
    local function f32(n) return (string.unpack("f", string.pack("f", n))) end
    local s = scalar(q, f32(math.sqrt(f32(sc or 1 / math.sqrt(static_size(E))))))
    local x = (q * s):matmul((k * s):transpose(3, 4))
    local cdt = precision or ((q.dtype == "float16" or q.dtype == "bfloat16") and "float32" or q.dtype)
    if x.dtype ~= cdt then x = x:to(cdt) end
    local function modify(name, y)
      if not mods[name] then return y end
      local out = T(node, mods[name]({y}, outer)[1], name .. "'s output")
      if out:dim() ~= 4 then node_error(node, "%s's output of %d dims (4)", name, out:dim()) end
      for d = 1, 4 do same(out.shape[d], y.shape[d], name .. "'s input and output dims " .. d) end
      need_float(node, out, name .. "'s output")
      return out.dtype == cdt and out or out:to(cdt)
    end
    x = modify("score_mod", x)
    local e = (x - x:amax(4, true)):exp()
    local p = modify("prob_mod", e / e:sum(4, true))
    local y = p:matmul(v.dtype == cdt and v or v:to(cdt))
    return {y.dtype == v.dtype and y or y:to(v.dtype)}
  end
end

-- Optional: its input wrapped, or (no input) an empty optional of the
-- type the attribute gives.
OPS.Optional = function(node, attrs)
  known_attrs(node, attrs, set("type"))
  local ty = attrs.type
  if ty ~= nil and (type(ty) ~= "table" or ty.kind == nil) then node_error(node, "attribute 'type' must be a type") end
  if ty and ty.kind == "optional" then unsupported(node, "an optional of an optional") end
  return function(ins)
    if node.nin >= 1 and ins[1] ~= nil then
      if is_opt(ins[1]) then unsupported(node, "an optional of an optional") end
      return {{opt = true, v = ins[1]}}
    end
    if not ty then node_error(node, "neither an input nor attribute 'type'") end
    return {{opt = true}}
  end
end

-- OptionalHasElement: an optional's presence; a tensor or a sequence (from
-- opset 18) has one, an omitted input none.
OPS.OptionalHasElement = function(node, attrs)
  known_attrs(node, attrs, {})
  return function(ins)
    local v = ins[1]
    if is_opt(v) then return {bool_value(v.v ~= nil)} end
    return {bool_value(v ~= nil)}
  end
end

-- OptionalGetElement: an optional's value (an error when empty); a tensor
-- or a sequence (from opset 18) is itself.
OPS.OptionalGetElement = function(node, attrs)
  known_attrs(node, attrs, {})
  return function(ins)
    local v = ins[1]
    if v == nil then node_error(node, "the input is missing") end
    if not is_opt(v) then return {v} end
    if v.v == nil then node_error(node, "the optional is empty") end
    return {v.v}
  end
end

-- ---------------------------------------------------------------------------
-- the module
-- ---------------------------------------------------------------------------

local Model = nn.class("onnx.Model")

local function shape_text(v)
  if not v.dims then return "?" end
  local s = {}
  for i, d in ipairs(v.dims) do s[i] = v.dim_names[i] and clean(v.dim_names[i]) or (d >= 0 and tostring(d) or "?") end
  return "[" .. table.concat(s, ",") .. "]"
end

local OPTIONS = {}

-- The fields a Model (and nn.Module) keeps on itself: a weight of the same
-- name from the file would be overwritten by them, or overwrite them.
local RESERVED = set("onnx_path", "onnx_name", "opset", "producer", "inputs", "outputs", "training",
                     "_path", "_params", "_buffers", "_children", "_consts", "_dynamic_dims", "_nodes",
                     "_op_counts", "_op_order", "_folded")
-- An ONNX file is an inference model: its weights are parameters (named,
-- listed, saved and loaded as any module's) that require no grad, so eager
-- calls record no tape; m:requires_grad_() makes them trainable.
local function inference_parameter(self, name, t)
  self:register_parameter(name, t)
  local p = self[name]
  if fl.is_tensor(p) and p.requires_grad then p:requires_grad_(false) end
end

local function own_name(self, name)
  return RESERVED[name] or Model[name] ~= nil or rawget(self, name) ~= nil
end

function Model:__init(g, path)
  self.onnx_path = path
  self.onnx_name = g.name
  self.opset = g.opset
  if g.opset > g.max_opset then
    -- every op below is still lowered (an unknown one fails the load)
    io.stderr:write(fmt("fuselab: warning: %s: opset %d is newer than %d, the newest fuselab knows; "
                        .. "its ops load with opset %d's semantics\n", clean(path), g.opset,
                        g.max_opset, g.max_opset))
  end
  self.producer = g.producer
  self.inputs, self.outputs = g.inputs, g.outputs
  local consts = {}
  for _, init in ipairs(g.initializers) do
    -- initializers are fields of the module, by their names
    if own_name(self, init.name) then
      error(fmt("onnx: initializer '%s': a name the module itself uses (unsupported)", clean(init.name)), 0)
    end
    if FL_DTYPE[init.dtype] then
      if FLOAT[init.tensor.dtype] then inference_parameter(self, init.name, init.tensor)
      else self:register_buffer(init.name, init.tensor) end
    else
      consts[init.name] = {wide = init.dtype, t = init.tensor, const = true}
    end
  end
  self._consts = consts
  for _, v in ipairs(g.inputs) do
    -- a sequence's or optional's element type may be left open
    if not FL_DTYPE[v.dtype] and not WIDE[v.dtype] and not SMALLF[v.dtype]
       and not (v.kind ~= "tensor" and v.dtype == "unknown") then
      error(fmt("onnx: graph input '%s': dtype %s is unsupported", clean(v.name), clean(v.dtype)), 0)
    end
  end
  for _, v in ipairs(g.outputs) do
    if v.dtype ~= "unknown" and not FL_DTYPE[v.dtype] and not WIDE[v.dtype] and not SMALLF[v.dtype] then
      error(fmt("onnx: graph output '%s': dtype %s is unsupported", clean(v.name), clean(v.dtype)), 0)
    end
  end
  -- symbolic dims: dynamic under fl.compile (compile.lua reads _dynamic_dims)
  local dyn = {}
  for i, v in ipairs(g.inputs) do
    for d in pairs(v.dim_names) do dyn[i] = dyn[i] or {}; dyn[i][d] = true end
  end
  self._dynamic_dims = dyn
  -- lower every node now: an unsupported op fails the load
  local counts, order = {}, {}
  for _, d in ipairs(DOMAINS) do d.opset = g[d.field] or 0 end
  for _, node in ipairs(g.nodes) do lower_node(node, g.opset) end
  self._nodes = g.nodes
  self:_fold(consts)
  for _, node in ipairs(self._nodes) do
    if not counts[node.op] then counts[node.op] = 0; order[#order + 1] = node.op end
    counts[node.op] = counts[node.op] + 1
  end
  self._op_counts, self._op_order = counts, order
end

-- ops whose value is not a function of their inputs: never folded
local RANDOM = set("RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike",
                   "Multinomial", "Bernoulli", "Dropout")

-- Input-free subgraphs (Constant -> Range -> ... -> Reshape: weights a file
-- generates rather than stores, shapes computed from constants) run once
-- here, as onnxruntime's constant folding does, and what the rest of the
-- graph reads from them becomes the module's weights: a call reads them like
-- any initializer, a capture sees parameters instead of hundreds of ops
-- rebuilding them on every call.  Nothing that reads an initializer is
-- folded (fl.load_weights may change it), nor a random draw.
function Model:_fold(consts)
  local known = {}
  for k, v in pairs(consts) do known[k] = v end
  local folded, by = {}, {}
  for _, node in ipairs(self._nodes) do
    local ins, ok = {}, not RANDOM[node.op] and node.op ~= "Constant"
    for i, name in ipairs(node.inputs) do
      if ok and name ~= "" then
        ins[i] = known[name]
        if ins[i] == nil then ok = false end
      end
    end
    if node.op == "Constant" or ok then
      local outs = node.run(ins)
      for i, name in ipairs(node.outputs) do
        if name ~= "" then known[name] = outs[i]; by[name] = node end
      end
      folded[node] = true
    end
  end
  -- a Constant read by the rest stays a Constant (its value is known to the
  -- optimizer; a weight is bound by reference); the rest folded is dropped
  local read = {}
  for _, node in ipairs(self._nodes) do
    if not folded[node] then
      for _, name in ipairs(node.inputs) do
        read[name] = true
        if by[name] and by[name].op == "Constant" then folded[by[name]] = nil end
      end
    end
  end
  local keep, n = {}, 0
  for _, node in ipairs(self._nodes) do
    if folded[node] == nil then keep[#keep + 1] = node else n = n + 1 end
  end
  if n == 0 then return end
  for _, v in ipairs(self.outputs) do read[v.name] = true end
  for name in pairs(read) do
    local v = known[name]
    if v ~= nil and consts[name] == nil and folded[by[name]] ~= nil then
      if own_name(self, name) then
        error(fmt("onnx: folded value '%s': a name the module itself uses (unsupported)", clean(name)), 0)
      end
      if not is_tensor(v) then consts[name] = v
      elseif FLOAT[v.dtype] then inference_parameter(self, name, v)
      else self:register_buffer(name, v) end
    end
  end
  self._nodes, self._folded = keep, n
end

function Model:_head()
  return fmt("onnx.Model(%s)", self.onnx_name ~= "" and self.onnx_name or "?")
end

function Model.__tostring(self)
  local lines = {fmt("onnx.Model '%s' (opset %d%s)", clean(self.onnx_name), self.opset,
                     self.producer ~= "" and (", from " .. clean(self.producer)) or "")}
  local function vals(title, list)
    lines[#lines + 1] = "  " .. title .. ":"
    for _, v in ipairs(list) do
      local ty = fmt("%s %s", FL_DTYPE[v.dtype] or clean(v.dtype), shape_text(v))
      if v.kind == "sequence" then ty = fmt("sequence of %s", FL_DTYPE[v.dtype] or clean(v.dtype))
      elseif v.kind == "optional" then
        ty = fmt("optional %s%s", v.inner == "sequence" and "sequence of " or "", FL_DTYPE[v.dtype] or clean(v.dtype))
      end
      lines[#lines + 1] = fmt("    %s: %s", clean(v.name), ty)
    end
  end
  vals("inputs", self.inputs)
  vals("outputs", self.outputs)
  local ops = {}
  local order = {table.unpack(self._op_order)}
  table.sort(order, function(a, b)
    local ca, cb = self._op_counts[a], self._op_counts[b]
    if ca ~= cb then return ca > cb end
    return a < b
  end)
  for _, op in ipairs(order) do ops[#ops + 1] = fmt("%s x%d", clean(op), self._op_counts[op]) end
  lines[#lines + 1] = fmt("  %d nodes: %s", #self._nodes, table.concat(ops, ", "))
  if self._folded then
    lines[#lines + 1] = fmt("  %d nodes without inputs folded at load into the weights below", self._folded)
  end
  lines[#lines + 1] = fmt("  %d parameters (%d elements)", #self:parameters(), self:nparameters())
  return table.concat(lines, "\n")
end

-- Graph input i (declared v): the tensor x checked against its dtype and
-- shape (what names it in messages), as the nodes read it.
local function input_tensor(self, i, v, x, what)
  if not is_tensor(x) then
    error(fmt("onnx.Model: input %d ('%s')%s must be a tensor, got %s", i, clean(v.name), what, type(x)), 0)
  end
  local want = FL_DTYPE[v.dtype] or (WIDE[v.dtype] and "int64") or (SMALLF[v.dtype] and "float32")
  if want and x.dtype ~= want then
    error(fmt("onnx.Model: input %d ('%s')%s must be %s%s, got %s", i, clean(v.name), what, want,
              (WIDE[v.dtype] or SMALLF[v.dtype]) and (" (holding " .. v.dtype .. " values)") or "", x.dtype), 0)
  end
  if v.dims then
    local ok = #x.shape == #v.dims
    for d = 1, ok and #v.dims or 0 do
      if v.dims[d] >= 0 and not v.dim_names[d] and x.shape[d] ~= v.dims[d] then ok = false end
    end
    if not ok then
      error(fmt("onnx.Model: input %d ('%s') must be %s, got [%s]", i, clean(v.name), shape_text(v),
                table.concat(x.shape, ",")), 0)
    end
  end
  if SMALLF[v.dtype] then
    -- float32 values rounded to the type, as a saturating Cast would
    x = small_cast({name = v.name, op = "input", opset = self.opset}, x, v.dtype, {}).t
  end
  return (WIDE[v.dtype] or SMALLF[v.dtype]) and {wide = v.dtype, t = x} or x
end

-- A sequence input: a Lua array of tensors (no holes, no other keys).
local function input_sequence(self, i, v, l, what)
  if type(l) ~= "table" or is_tensor(l) then
    error(fmt("onnx.Model: input %d ('%s')%s must be a table (array) of tensors, got %s", i, clean(v.name),
              what, is_tensor(l) and "a tensor" or type(l)), 0)
  end
  local n = #l
  for k in pairs(l) do
    if math.type(k) ~= "integer" or k < 1 or k > n then
      error(fmt("onnx.Model: input %d ('%s')%s must be an array of tensors (key %s)", i, clean(v.name), what,
                clean(tostring(k))), 0)
    end
  end
  local out = {}
  for k = 1, n do out[k] = input_tensor(self, i, v, l[k], fmt("%s element %d", what, k)) end
  return sequence(out, v.dtype ~= "unknown" and v.dtype or (out[1] and onnx_dtype(out[1])) or nil)
end

-- Graph input i of any kind, as the nodes read it: a sequence from an
-- array of tensors, an optional from nil, a tensor or an array.
local function input_value(self, i, v, x)
  if v.kind == "sequence" then return input_sequence(self, i, v, x, "") end
  if v.kind ~= "optional" then return input_tensor(self, i, v, x, "") end
  if x == nil then return {opt = true} end
  if v.inner ~= "tensor" and not is_tensor(x) then return {opt = true, v = input_sequence(self, i, v, x, "")} end
  if v.inner == "sequence" then
    error(fmt("onnx.Model: input %d ('%s') must be nil or a table (array) of tensors, got a tensor", i,
              clean(v.name)), 0)
  end
  return {opt = true, v = input_tensor(self, i, v, x, "")}
end

-- What the call returns for graph output v holding r: a tensor, an array
-- of tensors for a sequence, nil or either for an optional.
local function output_value(self, v, r)
  if is_opt(r) then
    if v.kind ~= "optional" then
      error(fmt("onnx: output '%s': computed an optional, the model declares a %s", clean(v.name), v.kind), 0)
    end
    if r.v == nil then return nil end
    r = r.v
  end
  if is_seq(r) then
    if v.kind == "tensor" or v.kind == "optional" and v.inner == "tensor" then
      error(fmt("onnx: output '%s': computed a sequence, the model declares a tensor", clean(v.name)), 0)
    end
    local out = {}
    for k = 1, #r do out[k] = output_value(self, {name = v.name, kind = "tensor", dtype = v.dtype}, r[k]) end
    return out
  end
  if v.kind == "sequence" or v.kind == "optional" and v.inner == "sequence" then
    error(fmt("onnx: output '%s': computed a tensor, the model declares a sequence", clean(v.name)), 0)
  end
  local wide = not is_tensor(r) and r.wide
  if not is_tensor(r) then
    if r.wide then r = r.t else r = T({name = v.name, op = "output", opset = self.opset}, r) end
  end
  local got = wide or ONNX_DTYPE[r.dtype]
  if v.dtype ~= "unknown" and got ~= v.dtype then
    error(fmt("onnx: output '%s': computed %s, the model declares %s", clean(v.name), got, v.dtype), 0)
  end
  return r
end

function Model:forward(...)
  local args = table.pack(...)
  -- trailing optional inputs may be left out (nil)
  local need = #self.inputs
  while need > 0 and self.inputs[need].kind == "optional" and args.n < need do need = need - 1 end
  if args.n ~= #self.inputs and args.n ~= need then
    error(fmt("onnx.Model: expected %d inputs (%s), got %d", #self.inputs,
              table.concat((function()
                local t = {}
                for i, v in ipairs(self.inputs) do t[i] = clean(v.name) end
                return t
              end)(), ", "), args.n), 0)
  end
  local env = {}
  for k, v in pairs(self._consts) do env[k] = v end
  for _, n in ipairs(self._params) do env[n] = self[n]; CONST[self[n]] = true end
  for _, n in ipairs(self._buffers) do
    local t = self[n]
    env[n] = (t.dtype == "int64" and t:numel() <= 64) and host_of_tensor(t) or t
    CONST[t] = true
  end
  local held = false
  for i, v in ipairs(self.inputs) do
    env[v.name] = input_value(self, i, v, args[i])
    held = held or v.kind ~= "tensor"
  end
  -- the tensors a sequence or optional input holds are no arguments of a
  -- compiled graph (fl.compile guards a table by identity, not by what it
  -- holds): a graph break here makes every call run this Lua again, so
  -- each call reads the tensors it is given
  if held and fl._tracing() and not pcall(fl.graph_break) then
    error("onnx.Model: sequence and optional inputs under fl.capture are unsupported (their tensors are "
          .. "no graph inputs; fl.compile takes a graph break there)", 0)
  end
  run_nodes(self._nodes, env)
  local res = {}
  for i, v in ipairs(self.outputs) do res[i] = output_value(self, v, env[v.name]) end
  return table.unpack(res, 1, #self.outputs)
end

-- fl.load_onnx(path [, opts]): the model at path as a module.
function fl.load_onnx(path, opts)
  if type(path) ~= "string" then error("load_onnx: expected a path, got " .. type(path), 2) end
  if opts ~= nil then
    if type(opts) ~= "table" then error("load_onnx: expected an options table, got " .. type(opts), 2) end
    for k in pairs(opts) do
      if not OPTIONS[k] then error(fmt("load_onnx: unknown option '%s'", tostring(k)), 2) end
    end
  end
  local g = fl._onnx_read(path)
  return Model(g, path):eval()
end

-- fl.load_onnx_value(path, kind): one file of ONNX test data of kind
-- "tensor" (a TensorProto), "sequence" (a SequenceProto: an array of
-- tensors) or "optional" (an OptionalProto: nil, a tensor or an array),
-- and the ONNX dtype of its tensors.
function fl.load_onnx_value(path, kind)
  if type(path) ~= "string" then error("load_onnx_value: expected a path, got " .. type(path), 2) end
  if kind ~= "tensor" and kind ~= "sequence" and kind ~= "optional" then
    error("load_onnx_value: kind must be \"tensor\", \"sequence\" or \"optional\", got " .. tostring(kind), 2)
  end
  return fl._onnx_data(path, kind)
end

-- fl.load_onnx_tensor(path): one TensorProto file (ONNX test data) as a
-- tensor, and its ONNX dtype name.
function fl.load_onnx_tensor(path)
  local t, dtype = fl._onnx_tensor(path)
  return t, dtype
end
