-- onnx_proto.lua -- a tiny protobuf writer for ONNX models, so tests build
-- the models they load (and the malformed ones they must refuse) without
-- Python.  Field numbers are onnx.proto's.  Used by tests/lua/onnx.lua and
-- to write the fuzz seeds (tests/fuzz/corpus_onnx).

local M = {}

local function varint(n)
  local out = {}
  repeat
    local b = n & 0x7f
    n = n >> 7                  -- logical shift: negatives take 10 bytes
    if n ~= 0 then b = b | 0x80 end
    out[#out + 1] = string.char(b)
  until n == 0
  return table.concat(out)
end

local function key(f, wt) return varint(f << 3 | wt) end
local function vint(f, n) return key(f, 0) .. varint(n) end
local function bytes(f, s) return key(f, 2) .. varint(#s) .. s end
local function f32(f, x) return key(f, 5) .. string.pack("<f", x) end
M.varint, M.vint, M.bytes = varint, vint, bytes

local DTYPE = {float = 1, uint8 = 2, int8 = 3, uint16 = 4, int16 = 5, int32 = 6, int64 = 7, bool = 9,
  float16 = 10, double = 11, uint32 = 12, uint64 = 13, complex64 = 14, float8e4m3fn = 17,
  float8e4m3fnuz = 18, float8e5m2 = 19, float8e5m2fnuz = 20, uint4 = 21, int4 = 22, float4e2m1 = 23,
  float8e8m0 = 24, uint2 = 25, int2 = 26}
M.DTYPE = DTYPE

-- TensorProto: {name=, dtype=, dims={...}, floats={...} | ints={...} | int32s={...} | raw=,
-- external={location=, offset=, length=}}
function M.tensor(t)
  local s = {}
  for _, d in ipairs(t.dims or {}) do s[#s + 1] = vint(1, d) end
  s[#s + 1] = vint(2, DTYPE[t.dtype or "float"] or t.dtype)
  if t.floats then
    local p = {}
    for i, x in ipairs(t.floats) do p[i] = string.pack("<f", x) end
    s[#s + 1] = bytes(4, table.concat(p))
  end
  if t.ints then
    local p = {}
    for i, x in ipairs(t.ints) do p[i] = varint(x) end
    s[#s + 1] = bytes(7, table.concat(p))
  end
  if t.int32s then   -- int32_data: the narrow types' values, the float8 and packed types' codes
    local p = {}
    for i, x in ipairs(t.int32s) do p[i] = varint(x) end
    s[#s + 1] = bytes(5, table.concat(p))
  end
  if t.name then s[#s + 1] = bytes(8, t.name) end
  if t.raw then s[#s + 1] = bytes(9, t.raw) end
  if t.external then
    for _, k in ipairs({"location", "offset", "length"}) do
      if t.external[k] then
        s[#s + 1] = bytes(13, bytes(1, k) .. bytes(2, tostring(t.external[k])))
      end
    end
    s[#s + 1] = vint(14, 1)
  end
  return table.concat(s)
end

local graph
-- AttributeProto from a Lua value: integer, float, string, {ints}, tensor,
-- graph ({graph = {nodes=, inputs=, outputs=, inits=}}), {floats = {...}},
-- {strings = {...}}, type ({type = M.type's})
local function attribute(name, v)
  local s = bytes(1, name)
  if type(v) == "table" and v.graph then return s .. bytes(6, graph(v.graph)) .. vint(20, 5) end
  if math.type(v) == "integer" then return s .. vint(3, v) .. vint(20, 2) end
  if type(v) == "number" then return s .. f32(2, v) .. vint(20, 1) end
  if type(v) == "string" then return s .. bytes(4, v) .. vint(20, 3) end
  if v.tensor then return s .. bytes(5, M.tensor(v.tensor)) .. vint(20, 4) end
  if v.floats then
    local p = {}
    for i, x in ipairs(v.floats) do p[i] = string.pack("<f", x) end
    return s .. bytes(7, table.concat(p)) .. vint(20, 6)
  end
  if v.strings then
    local p = {}
    for i, x in ipairs(v.strings) do p[i] = bytes(9, x) end
    return s .. table.concat(p) .. vint(20, 8)
  end
  if v.type then return s .. bytes(14, M.type(v.type)) .. vint(20, 13) end
  local p = {}
  for i, x in ipairs(v) do p[i] = varint(x) end
  return s .. bytes(8, table.concat(p)) .. vint(20, 7)
end

-- NodeProto: {op=, inputs={...}, outputs={...}, name=, domain=, attrs={k=v}}
function M.node(n)
  local s = {}
  for _, i in ipairs(n.inputs or {}) do s[#s + 1] = bytes(1, i) end
  for _, o in ipairs(n.outputs or {}) do s[#s + 1] = bytes(2, o) end
  if n.name then s[#s + 1] = bytes(3, n.name) end
  s[#s + 1] = bytes(4, n.op)
  local names = {}
  for k in pairs(n.attrs or {}) do names[#names + 1] = k end
  table.sort(names)
  for _, k in ipairs(names) do s[#s + 1] = bytes(5, attribute(k, n.attrs[k])) end
  if n.domain then s[#s + 1] = bytes(7, n.domain) end
  return table.concat(s)
end

-- TypeProto: {dtype=, dims=} a tensor; kind="sequence" a sequence of
-- such tensors; kind="optional" an optional of one (inner="sequence": of
-- a sequence of them); kind="map" a map (int64 keys)
function M.type(v)
  local dims = {}
  for _, d in ipairs(v.dims or {}) do
    dims[#dims + 1] = bytes(1, type(d) == "string" and bytes(2, d) or vint(1, d))
  end
  -- dtype "none": no elem_type (the type left to the reader)
  local tt = v.dtype == "none" and "" or vint(1, DTYPE[v.dtype or "float"] or v.dtype)
  if v.dims then tt = tt .. bytes(2, table.concat(dims)) end
  local ty = bytes(1, tt)
  if v.kind == "map" then return bytes(5, vint(1, 7) .. bytes(2, ty)) end
  if v.kind == "sequence" or v.inner == "sequence" then ty = bytes(4, bytes(1, ty)) end
  if v.kind == "optional" then ty = bytes(9, bytes(1, ty)) end
  return ty
end

-- ValueInfoProto: {name=, dtype=, dims={4, "N"}} (and M.type's kind, inner)
function M.value(v)
  return bytes(1, v.name) .. bytes(2, M.type(v))
end

-- SequenceProto of TensorProtos ({tensor tables}); OptionalProto of one
-- ({tensor=} or {sequence={...}}, {} empty)
function M.sequence(list)
  local s = {vint(2, 1)}
  for _, t in ipairs(list) do s[#s + 1] = bytes(3, M.tensor(t)) end
  return table.concat(s)
end
function M.optional(o)
  if o.tensor then return vint(2, 1) .. bytes(3, M.tensor(o.tensor)) end
  if o.sequence then return vint(2, 3) .. bytes(5, M.sequence(o.sequence)) end
  return ""
end

-- ModelProto: {name=, opset=, domain=, nodes={...}, inputs={...},
-- outputs={...}, inits={...}}
-- GraphProto: {name=, nodes={...}, inputs={...}, outputs={...}, inits={...}}
function graph(m)
  local g = {}
  for _, n in ipairs(m.nodes or {}) do g[#g + 1] = bytes(1, M.node(n)) end
  g[#g + 1] = bytes(2, m.name or "test")
  for _, t in ipairs(m.inits or {}) do g[#g + 1] = bytes(5, M.tensor(t)) end
  for _, v in ipairs(m.inputs or {}) do g[#g + 1] = bytes(11, M.value(v)) end
  for _, v in ipairs(m.outputs or {}) do g[#g + 1] = bytes(12, M.value(v)) end
  return table.concat(g)
end
M.graph = graph

function M.model(m)
  local g = {graph(m)}
  local opset = bytes(8, (m.domain and bytes(1, m.domain) or "") .. vint(2, m.opset or 13))
  return vint(1, 8) .. bytes(2, "fuselab-test") .. bytes(7, table.concat(g)) .. opset
end

function M.write(path, s)
  local f = assert(io.open(path, "wb"))
  f:write(s)
  f:close()
  return path
end

-- The test model: y = relu(x @ W + b), x [N, 4] with N symbolic.
function M.mlp(opts)
  opts = opts or {}
  local w, b = {}, {}
  for i = 1, 12 do w[i] = (i % 5 - 2) * 0.25 end
  for i = 1, 3 do b[i] = i * 0.1 end
  return M.model{
    name = "mlp", opset = opts.opset or 13,
    nodes = opts.nodes or {
      {op = "MatMul", inputs = {"x", "W"}, outputs = {"h"}, name = "mm"},
      {op = "Add", inputs = {"h", "b"}, outputs = {"z"}, name = "add"},
      {op = "Relu", inputs = {"z"}, outputs = {"y"}, name = "relu"},
    },
    inits = opts.inits or {
      {name = "W", dims = {4, 3}, floats = w},
      {name = "b", dims = {3}, floats = b},
    },
    inputs = {{name = "x", dims = {"N", 4}}},
    outputs = {{name = "y", dims = {"N", 3}}},
  }
end

return M
