-- onnx.lua -- fl.load_onnx: loading, printing, parameters, calling,
-- compiling (with the symbolic batch dim dynamic), capture, weights, and
-- the errors bad files must give.  The models are written by
-- tests/lua/onnx_proto.lua (a small protobuf writer), not by Python.
local t = require "tap"
local P = require "onnx_proto"

local function q(s) return "'" .. s:gsub("'", "'\\''") .. "'" end
local dir = t.tmpdir()
assert(os.execute("mkdir " .. q(dir .. "/sub")))
local function path(name) return dir .. "/" .. name end

-- ---- a good model ---------------------------------------------------------
local m = fl.load_onnx(P.write(path("mlp.onnx"), P.mlp()))
local text = tostring(m)
t.ok(text:find("opset 13", 1, true), "print shows the opset")
t.ok(text:find("x: float32 [N,4]", 1, true), "print shows the input with its symbolic dim")
t.ok(text:find("y: float32 [N,3]", 1, true), "print shows the output")
t.ok(text:find("MatMul x1", 1, true) and text:find("3 nodes", 1, true), "print shows op counts")
local params = m:named_parameters()
t.ok(params.W and params.b, "parameters are named by initializer")
t.is(#m:parameters(), 2, "two parameters")
t.is(params.W.shape[1], 4, "W is [4, 3]")

fl.manual_seed(1)
local x = fl.randn(2, 4)
local want = (fl.matmul(x, params.W) + params.b):relu()
t.ok(fl.allclose(m(x), want), "calling runs the graph")

local cm = fl.compile(m, {backend = "cpu"})
t.ok(fl.allclose(cm(x), want), "compiled (cpu) matches")
local x5 = fl.randn(5, 4)
t.ok(fl.allclose(cm(x5), (fl.matmul(x5, params.W) + params.b):relu()), "compiled, another batch size")
t.is(cm:stats().recompiles, 0, "the symbolic dim N is dynamic: no recompile for a new batch")
local ce = fl.compile(m, {backend = "eager"})
t.ok(fl.allclose(ce(x), want), "backend eager")

local g = fl.capture(m, x)
t.ok(tostring(g):find("matmul", 1, true), "fl.capture gives a graph with the matmul")

local wpath = path("mlp.safetensors")
fl.save_weights(m, wpath)
local m2 = fl.load_onnx(path("mlp.onnx"))
fl.no_grad(m2.W.fill_, m2.W, 0)   -- an initializer is a parameter: it requires grad
fl.load_weights(m2, wpath)
t.ok(fl.allclose(m2(x), want), "save_weights / load_weights by initializer names")

t.ok(pcall(fl.draw, g, path("g.dot")), "fl.draw of its graph")

local okr = pcall(fl.report, cm, path("review.html"))
t.ok(okr, "fl.report of the compiled model")
for _, mode in ipairs({"reduce-overhead", "max-autotune"}) do
  t.ok(fl.allclose(fl.compile(m, {backend = "cpu", mode = mode})(x), want), "mode " .. mode)
end
t.ok(fl.allclose(fl.compile(m, {backend = "cpu", fuse = false, dynamic = false})(x), want), "unfused, static")
t.is(fl.explain(m, x).op_count, 3, "fl.explain counts its ops")

-- ---- ONNX semantics the lowering must keep ------------------------------------
local function one_node(op, attrs, inputs, opset, inits)
  local vals = {}
  for i, v in ipairs(inputs) do vals[i] = {name = "i" .. i, dtype = v[1], dims = v[2]} end
  local names = {}
  for i = 1, #inputs do names[i] = "i" .. i end
  for _, init in ipairs(inits or {}) do names[#names + 1] = init.name end
  return fl.load_onnx(P.write(path(op .. ".onnx"), P.model{opset = opset or 13,
    nodes = {{op = op, inputs = names, outputs = {"y"}, name = "n", attrs = attrs}},
    inits = inits, inputs = vals, outputs = {{name = "y", dtype = "none"}}}))
end
local ia = fl.tensor({7, -7, 7, -7, 9223372036854775807, -9223372036854775807}, {dtype = "int64"})
local ib = fl.tensor({2, 2, -2, -2, 3, 7}, {dtype = "int64"})
local div = one_node("Div", nil, {{"int64", {6}}, {"int64", {6}}})
t.is(div(ia, ib):tolist(), {3, -3, -3, 3, 3074457345618258602, -1317624576693539401},
     "integer Div truncates toward zero, exactly at the int64 limits")
local pow = one_node("Pow", nil, {{"int64", {3}}, {"float", {3}}})
local pr = pow(fl.tensor({2, 3, 4}, {dtype = "int64"}), fl.tensor({2.0, 0.5, 3.0}))
t.ok(pr.dtype == "int64" and pr:tolist()[3] == 64 and pr:tolist()[2] == 1, "Pow(int, float) keeps the int type")
local sm = one_node("Softmax", {axis = 1}, {{"float", {2, 3, 4}}}, 11)
local xs = fl.randn(2, 3, 4)
t.ok(fl.allclose(sm(xs), xs:reshape(2, 12):softmax(2):reshape(2, 3, 4)), "Softmax before opset 13 flattens to 2-D")
local rs = one_node("Reshape", nil, {{"float", {2, 3, 4}}}, 13,
  {{name = "shape", dtype = "int64", dims = {3}, ints = {0, -1, 2}}})
t.is(rs(xs).shape, {2, 6, 2}, "Reshape with 0 and -1")
local sl = one_node("Slice", nil, {{"float", {2, 3, 4}}}, 13,
  {{name = "starts", dtype = "int64", dims = {1}, ints = {-3}}, {name = "ends", dtype = "int64", dims = {1}, ints = {1000}},
   {name = "axes", dtype = "int64", dims = {1}, ints = {2}}})
t.ok(fl.allclose(sl(xs), xs:narrow(3, 2, 3)), "Slice clamps like ONNX")
local gm = one_node("Gemm", {alpha = 0.5, beta = 2.0, transB = 1}, {{"float", {2, 3}}, {"float", {4, 3}}, {"float", {4}}})
local A, B, C = fl.randn(2, 3), fl.randn(4, 3), fl.randn(4)
t.ok(fl.allclose(gm(A, B, C), fl.matmul(A, B:transpose(1, 2)) * 0.5 + C * 2), "Gemm alpha, beta, transB")
local cv = one_node("Conv", {pads = {1, 1, 1, 1}}, {{"float", {1, 2, 5, 5}}, {"float", {3, 2, 3, 3}}})
local cx, cw = fl.randn(1, 2, 5, 5), fl.randn(3, 2, 3, 3)
t.ok(fl.allclose(fl.compile(cv, {backend = "cpu"})(cx, cw), fl.conv2d(cx, cw, nil, {padding = 1}), 1e-4, 1e-5),
     "Conv compiled")
-- asymmetric pads: the same as padding the input first, then no padding
local ca = one_node("Conv", {pads = {0, 0, 1, 1}}, {{"float", {1, 2, 5, 5}}, {"float", {3, 2, 3, 3}}})
t.ok(fl.allclose(ca(cx, cw), fl.conv2d(fl.pad(cx, {0, 0, 0, 0, 0, 0, 1, 1}), cw), 1e-4, 1e-5),
     "Conv with asymmetric pads is the padded input's convolution")
-- groups: the same as each group's convolution, concatenated
local cg = one_node("Conv", {group = 2}, {{"float", {1, 4, 5, 5}}, {"float", {6, 2, 3, 3}}})
local gx, gw = fl.randn(1, 4, 5, 5), fl.randn(6, 2, 3, 3)
local per = fl.cat({fl.conv2d(gx:narrow(2, 1, 2), gw:narrow(1, 1, 3)), fl.conv2d(gx:narrow(2, 3, 2), gw:narrow(1, 4, 3))}, 2)
t.ok(fl.allclose(cg(gx, gw), per, 1e-4, 1e-5), "Conv group=2 is the groups' convolutions side by side")
t.ok(fl.allclose(fl.compile(cg, {backend = "cpu"})(gx, gw), per, 1e-4, 1e-5), "Conv group=2 compiled")
-- Gather of one constant index: a view of that slice, no gather op in the
-- graph (ViT picks query, key and value so); negative from the end; out
-- of range an error naming the node
for _, c in ipairs{{2, 1}, {3, -1}, {1, 0}} do
  local g1 = one_node("Gather", {axis = c[1] - 1}, {{"float", {2, 3, 4}}}, 13,
    {{name = "idx", dtype = "int64", dims = {}, ints = {c[2]}}})
  local k = c[2] < 0 and xs.shape[c[1]] + c[2] + 1 or c[2] + 1
  local want = xs:narrow(c[1], k, 1):squeeze(c[1])
  local ex = fl.explain(g1, xs)
  t.ok(fl.allclose(g1(xs), want) and fl.allclose(fl.compile(g1, {backend = "cpu"})(xs), want) and
       not ex.op_counts.embedding, ("Gather of constant index %d along axis %d is a view of that slice, eager and compiled")
       :format(c[2], c[1] - 1))
end
t.raises(function() one_node("Gather", {axis = 1}, {{"float", {2, 3, 4}}}, 13,
  {{name = "idx", dtype = "int64", dims = {}, ints = {3}}})(xs) end, "node 'n' %(Gather, opset 13%): index 3 out of range",
  "Gather of a constant index out of range is an error naming the node")
-- Slice with a negative step: the flipped range
local sn = one_node("Slice", nil, {{"float", {2, 3, 4}}}, 13,
  {{name = "starts", dtype = "int64", dims = {1}, ints = {-1}}, {name = "ends", dtype = "int64", dims = {1}, ints = {-1000}},
   {name = "axes", dtype = "int64", dims = {1}, ints = {2}}, {name = "steps", dtype = "int64", dims = {1}, ints = {-2}}})
t.ok(fl.allclose(sn(xs), fl.cat({xs:narrow(3, 4, 1), xs:narrow(3, 2, 1)}, 3)), "Slice with step -2 from the end")
-- Pad (opset 13: pads as an input), reflect
local pd = one_node("Pad", {mode = "reflect"}, {{"float", {2, 3, 4}}}, 13,
  {{name = "pads", dtype = "int64", dims = {6}, ints = {0, 0, 1, 0, 0, 2}}})
local padded = pd(xs)
t.is(padded.shape, {2, 3, 7}, "Pad reflect: shape")
t.ok(fl.allclose(padded:narrow(3, 1, 1), xs:narrow(3, 2, 1)) and fl.allclose(padded:narrow(3, 7, 1), xs:narrow(3, 2, 1)),
     "Pad reflect mirrors without repeating the edge")
t.raises(function() one_node("Pad", {mode = "wrap"}, {{"float", {2, 3, 4}}}, 13,
  {{name = "pads", dtype = "int64", dims = {6}, ints = {0, 0, 1, 0, 0, 1}}})(xs) end,
  "mode 'wrap' %(from opset 19%)", "Pad's wrap mode is an error before opset 19")
-- the narrow integer types: held as int64, arithmetic wraps into their range
local function I(l) return fl.tensor(l, {dtype = "int64"}) end
local add8 = one_node("Add", nil, {{"uint8", {3}}, {"uint8", {3}}})
t.is(add8(I{200, 255, 1}, I{100, 1, 2}):tolist(), {44, 0, 3}, "uint8 Add wraps mod 256")
t.is(one_node("Sub", nil, {{"uint8", {2}}, {"uint8", {2}}})(I{1, 5}, I{2, 5}):tolist(), {255, 0}, "uint8 Sub wraps below 0")
t.is(one_node("Mul", nil, {{"int8", {3}}, {"int8", {3}}})(I{64, -128, 100}, I{2, -1, 3}):tolist(), {-128, -128, 44},
     "int8 Mul wraps into [-128, 127]")
t.is(one_node("Div", nil, {{"int32", {3}}, {"int32", {3}}})(I{-7, 7, -2147483648}, I{2, -2, -1}):tolist(),
     {-3, -3, -2147483648}, "int32 Div truncates; INT_MIN / -1 wraps")
t.is(one_node("Mul", nil, {{"uint32", {1}}, {"uint32", {1}}})(I{4294967295}, I{4294967295}):tolist(), {1},
     "uint32 Mul: the low 32 bits of the product")
t.is(one_node("Pow", nil, {{"int32", {2}}, {"int32", {2}}})(I{3, 2}, I{41, 31}):tolist(), {2069870691, -2147483648},
     "int32 Pow wraps (past int64 too)")
t.is(one_node("CumSum", nil, {{"int16", {3}}, {"int64", {}}})(I{32767, 1, 1}, fl.full({}, 0, {dtype = "int64"})):tolist(),
     {32767, -32768, -32767}, "int16 CumSum wraps")
-- a graph attribute where the op takes none: refused, not ignored
t.raises(function()
  one_node("Relu", {body = {graph = {nodes = {{op = "Identity", inputs = {"a"}, outputs = {"b"}}},
                                     inputs = {{name = "a", dtype = "float", dims = {2}}},
                                     outputs = {{name = "b", dtype = "float", dims = {2}}}}}},
           {{"float", {2}}})
end, "attribute 'body' of kind graph is unsupported", "a graph attribute on an op without subgraphs is refused")
t.raises(function() one_node("Add", nil, {{"int32", {2}}, {"int64", {2}}})(I{1, 2}, I{1, 2}) end,
         "inputs of dtypes int32 and int64", "int32 Add with an int64 operand is a model error")
-- uint64: its bit pattern in an int64; 2^64 - 1 reads as -1
local U1 = I{-1, 5}
t.is(one_node("Add", nil, {{"uint64", {2}}, {"uint64", {2}}})(U1, I{2, 1}):tolist(), {1, 6}, "uint64 Add wraps mod 2^64")
t.is(one_node("Less", nil, {{"uint64", {2}}, {"uint64", {2}}})(U1, I{3, 9}):tolist(), {false, true},
     "uint64 order: 2^64 - 1 is not less than 3")
t.is(one_node("Max", nil, {{"uint64", {2}}, {"uint64", {2}}})(U1, I{3, 9}):tolist(), {-1, 9}, "uint64 Max")
t.is(one_node("Div", nil, {{"uint64", {2}}, {"uint64", {2}}})(U1, I{3, 9}):tolist(), {0x5555555555555555, 0},
     "uint64 Div is unsigned (not int64's)")
t.is(one_node("Cast", {to = 1}, {{"uint64", {2}}})(I{-1, 3}):tolist(), {2.0 ^ 64, 3.0}, "Cast uint64 to float is unsigned")
t.is(one_node("Cast", {to = 2}, {{"float", {4}}})(fl.tensor{1.9, -1.0, 300.0, 255.0}):tolist(), {1, 255, 44, 255},
     "Cast float to uint8 truncates, then wraps")
t.is(one_node("Cast", {to = 3}, {{"int32", {2}}})(I{200, -129}):tolist(), {-56, 127}, "Cast int32 to int8 wraps")
t.is(one_node("Cast", {to = 13}, {{"float", {2}}})(fl.tensor{2.0 ^ 63, 7.0}):tolist(), {math.mininteger, 7},
     "Cast float to uint64 from 2^63 up")
-- bitwise ops against Lua's own on random patterns of every integer type
do
  local BITS = {int8 = 8, int16 = 16, int32 = 32, int64 = 64, uint8 = 8, uint16 = 16, uint32 = 32, uint64 = 64}
  local function wrapv(v, ty)
    local n = BITS[ty]
    if n == 64 then return v end
    v = v & ((1 << n) - 1)
    if ty:sub(1, 1) == "i" and v >= 1 << (n - 1) then v = v - (1 << n) end
    return v
  end
  local rng = 12345
  local function rand64()
    rng = rng * 6364136223846793005 + 1442695040888963407
    return rng ~ (rng >> 29)
  end
  local all_ok, shift_ok = true, true
  for ty in pairs(BITS) do
    local a, b, sh = {}, {}, {}
    for i = 1, 40 do
      a[i], b[i] = wrapv(rand64(), ty), wrapv(rand64(), ty)
      sh[i] = i <= 30 and (i - 1) * BITS[ty] // 29 or wrapv(rand64() % 200 - 100, ty)
      if ty:sub(1, 1) == "u" and sh[i] < 0 then sh[i] = wrapv(sh[i], ty) end
    end
    a[1], a[2], a[3] = wrapv(-1, ty), wrapv(1 << (BITS[ty] - 1), ty), 0
    local A, B, S = I(a), I(b), I(sh)
    local want = {BitwiseAnd = {}, BitwiseOr = {}, BitwiseXor = {}, BitwiseNot = {}, L = {}, R = {}}
    for i = 1, 40 do
      want.BitwiseAnd[i] = wrapv(a[i] & b[i], ty)
      want.BitwiseOr[i] = wrapv(a[i] | b[i], ty)
      want.BitwiseXor[i] = wrapv(a[i] ~ b[i], ty)
      want.BitwiseNot[i] = wrapv(~a[i], ty)
      local s, n, signed = sh[i], BITS[ty], ty:sub(1, 1) == "i"
      local inside = s >= 0 and s < n and not (not signed and n == 64 and s < 0)
      local u = n == 64 and a[i] or a[i] & ((1 << n) - 1)
      want.L[i] = inside and wrapv(u << s, ty) or 0
      if not inside then want.R[i] = (signed and a[i] < 0) and -1 or 0
      elseif signed then want.R[i] = s == 63 and (a[i] < 0 and -1 or 0) or a[i] // (1 << s)
      else want.R[i] = u >> s end
    end
    for _, op in ipairs({"BitwiseAnd", "BitwiseOr", "BitwiseXor"}) do
      local got = one_node(op, nil, {{ty, {40}}, {ty, {40}}}, 18)(A, B):tolist()
      for i = 1, 40 do if got[i] ~= want[op][i] then all_ok = false; t.diag(op .. " " .. ty .. " " .. i) end end
    end
    local got = one_node("BitwiseNot", nil, {{ty, {40}}}, 18)(A):tolist()
    for i = 1, 40 do if got[i] ~= want.BitwiseNot[i] then all_ok = false; t.diag("not " .. ty .. " " .. i) end end
    for _, d in ipairs({"LEFT", "RIGHT"}) do
      local gs = one_node("BitShift", {direction = d}, {{ty, {40}}, {ty, {40}}}, 28)(A, S):tolist()
      local w = d == "LEFT" and want.L or want.R
      for i = 1, 40 do
        if gs[i] ~= w[i] then shift_ok = false; t.diag(("%s %s %d: %d by %d gave %d, not %d"):format(d, ty, i, a[i], sh[i], gs[i], w[i])) end
      end
    end
  end
  t.ok(all_ok, "BitwiseAnd/Or/Xor/Not of every integer type match Lua's operators")
  t.ok(shift_ok, "BitShift of every integer type: in range, past the width and negative")
  t.raises(function() one_node("BitShift", {direction = "RIGHT"}, {{"int32", {2}}, {"int32", {2}}}, 11)(I{1, 2}, I{1, 1}) end,
           "unsigned types only before opset 28", "BitShift of a signed type before opset 28 is a model error")
  t.raises(function() one_node("BitShift", {direction = "UP"}, {{"uint8", {2}}, {"uint8", {2}}}, 11) end,
           "direction must be 'LEFT' or 'RIGHT'", "BitShift's direction is checked at load")
  t.raises(function() one_node("BitwiseAnd", nil, {{"float", {2}}, {"float", {2}}}, 18)(fl.ones(2), fl.ones(2)) end,
           "node 'n' %(BitwiseAnd, opset 18%): an input of dtype float %(integers only%)", "BitwiseAnd of floats is refused")
  t.raises(function() one_node("BitwiseOr", nil, {{"uint8", {2}}, {"int8", {2}}}, 18)(I{1, 2}, I{1, 2}) end,
           "inputs of dtypes uint8 and int8", "BitwiseOr of two types is a model error")
end
-- CumProd: exact on integers (wrapping), each option against a running product
do
  local ax = {{name = "ax", dtype = "int64", dims = {}, ints = {1}}}
  local xs7 = {3, -5, 7, 1000003, 2, -9, 11}
  local function running(l, ex, rev, wrapf)
    local n, out, acc = #l, {}, 1
    for j = 1, n do
      local i = rev and n + 1 - j or j
      if ex then out[i] = acc; acc = wrapf(acc * l[i]) else acc = wrapf(acc * l[i]); out[i] = acc end
    end
    return out
  end
  local function id(v) return v end
  local function w32(v) v = v & 0xffffffff; if v >= 1 << 31 then v = v - (1 << 32) end return v end
  for _, o in ipairs({{0, 0}, {1, 0}, {0, 1}, {1, 1}}) do
    local cp = one_node("CumProd", {exclusive = o[1], reverse = o[2]}, {{"int64", {2, 7}}}, 26, ax)
    local x2 = I{xs7, xs7}
    t.is(cp(x2):tolist()[2], running(xs7, o[1] == 1, o[2] == 1, id),
         ("CumProd int64 exclusive=%d reverse=%d: the running product, wrapping"):format(o[1], o[2]))
  end
  local cp32 = one_node("CumProd", nil, {{"int32", {7}}}, 26, {{name = "ax", dtype = "int64", dims = {}, ints = {0}}})
  t.is(cp32(I(xs7)):tolist(), running(xs7, false, false, w32), "CumProd int32 wraps into int32")
  local f = fl.tensor{1.5, -2.0, 0.5, 3.0, 1.25}
  local cpf = one_node("CumProd", nil, {{"float", {5}}}, 26, {{name = "ax", dtype = "int64", dims = {}, ints = {-1}}})
  t.is(cpf(f):tolist(), {1.5, -3.0, -1.5, -4.5, -5.625}, "CumProd float, negative axis")
  t.raises(function() one_node("CumProd", nil, {{"float", {5}}}, 26, {{name = "ax", dtype = "int64", dims = {}, ints = {1}}})(f) end,
           "axis 1 out of range", "CumProd's axis is checked")
end
-- control flow: subgraphs read outer values by name
do
  local function V(name, dtype) return {name = name, dtype = dtype or "none"} end
  -- If: y = cond ? x * k : x - k, k an outer value computed before the If
  local ifm = fl.load_onnx(P.write(path("if.onnx"), P.model{opset = 16,
    nodes = {{op = "Add", inputs = {"x", "x"}, outputs = {"k"}, name = "k"},
             {op = "If", inputs = {"c"}, outputs = {"y"}, name = "if", attrs = {
      then_branch = {graph = {nodes = {{op = "Mul", inputs = {"x", "k"}, outputs = {"t"}, name = "m"}},
                              outputs = {V"t"}}},
      else_branch = {graph = {nodes = {{op = "Sub", inputs = {"x", "k"}, outputs = {"e"}, name = "s"}},
                              outputs = {V"e"}}}}}},
    inputs = {{name = "c", dtype = "bool", dims = {}}, {name = "x", dims = {2}}}, outputs = {V"y"}}))
  local x2 = fl.tensor{1.0, 3.0}
  t.is(ifm(fl.ones({}, {dtype = "bool"}), x2):tolist(), {2.0, 18.0}, "If runs then_branch on true, reading outer values")
  t.is(ifm(fl.zeros({}, {dtype = "bool"}), x2):tolist(), {-1.0, -3.0}, "If runs else_branch on false")
  local cif = fl.compile(ifm, {backend = "cpu"})
  t.is(cif(fl.zeros({}, {dtype = "bool"}), x2):tolist(), {-1.0, -3.0}, "If under fl.compile (a graph break)")
  t.raises(function() fl.capture(ifm, fl.ones({}, {dtype = "bool"}), x2) end, "data%-dependent branch",
           "If's condition from an input is refused by one-graph capture")
  -- If on Equal over sizes (an expanded AffineGrid tests Size(size) == 4):
  -- a condition known at load, false taking else_branch, true then_branch
  local function branches()
    return {then_branch = {graph = {nodes = {{op = "Mul", inputs = {"x", "k"}, outputs = {"t"}, name = "m"}},
                                    outputs = {V"t"}}},
            else_branch = {graph = {nodes = {{op = "Sub", inputs = {"x", "k"}, outputs = {"e"}, name = "s"}},
                                    outputs = {V"e"}}}}
  end
  local sizeif = fl.load_onnx(P.write(path("if_size.onnx"), P.model{opset = 16,
    nodes = {{op = "Add", inputs = {"x", "x"}, outputs = {"k"}, name = "k"},
             {op = "Size", inputs = {"s"}, outputs = {"n"}, name = "size"},
             {op = "Equal", inputs = {"n", "four"}, outputs = {"c4"}, name = "eq4"},
             {op = "Equal", inputs = {"n", "three"}, outputs = {"c3"}, name = "eq3"},
             {op = "If", inputs = {"c4"}, outputs = {"y4"}, name = "if4", attrs = branches()},
             {op = "If", inputs = {"c3"}, outputs = {"y3"}, name = "if3", attrs = branches()}},
    inits = {{name = "four", dtype = "int64", dims = {}, ints = {4}},
             {name = "three", dtype = "int64", dims = {}, ints = {3}}},
    inputs = {{name = "x", dims = {2}}, {name = "s", dtype = "int64", dims = {3}}}, outputs = {V"y4", V"y3"}}))
  local s3 = fl.tensor({1, 2, 3}, {dtype = "int64"})
  local y4, y3 = sizeif(x2, s3)
  t.is({y4:tolist(), y3:tolist()}, {{-1.0, -3.0}, {2.0, 18.0}},
       "If on Equal(Size, n): else_branch when the sizes differ, then_branch when equal")
  local cy4, cy3 = fl.compile(sizeif, {backend = "cpu"})(x2, s3)
  t.is({cy4:tolist(), cy3:tolist()}, {{-1.0, -3.0}, {2.0, 18.0}}, "If on Equal(Size, n) under fl.compile")
  -- Loop: s = sum over i < M of (s + i) * 2, stopping when s > limit; a scan output of i
  local body = {graph = {
    inputs = {V("i", "int64"), V("cin", "bool"), V"s"},
    nodes = {{op = "Cast", inputs = {"i"}, outputs = {"fi"}, name = "ci", attrs = {to = 1}},
             {op = "Add", inputs = {"s", "fi"}, outputs = {"a"}, name = "a"},
             {op = "Mul", inputs = {"a", "two"}, outputs = {"s2"}, name = "m2"},
             {op = "Less", inputs = {"s2", "limit"}, outputs = {"cout"}, name = "lt"},
             {op = "Identity", inputs = {"fi"}, outputs = {"scan"}, name = "id"}},
    outputs = {V"cout", V"s2", V"scan"}}}
  local loop = fl.load_onnx(P.write(path("loop.onnx"), P.model{opset = 16,
    nodes = {{op = "Loop", inputs = {"M", "c", "s0"}, outputs = {"sf", "scans"}, name = "loop", attrs = {body = body}}},
    inits = {{name = "two", dims = {}, floats = {2.0}}},
    inputs = {{name = "M", dtype = "int64", dims = {}}, {name = "c", dtype = "bool", dims = {}},
              {name = "s0", dims = {}}, {name = "limit", dims = {}}},
    outputs = {V"sf", V"scans"}}))
  local function i0(v) return fl.full({}, v, {dtype = "int64"}) end
  local sf, scans = loop(i0(4), fl.ones({}, {dtype = "bool"}), fl.full({}, 1.0), fl.full({}, 1000.0))
  -- s: 1 -> 2 -> 6 -> 16 -> 38
  t.is(sf:item(), 38.0, "Loop runs M iterations, carrying its value")
  t.is(scans:tolist(), {0.0, 1.0, 2.0, 3.0}, "Loop stacks its scan output")
  sf, scans = loop(i0(10), fl.ones({}, {dtype = "bool"}), fl.full({}, 1.0), fl.full({}, 10.0))
  t.is({sf:item(), #scans:tolist()}, {16.0, 3}, "Loop stops when the body's condition is false")
  t.raises(function() loop(i0(0), fl.ones({}, {dtype = "bool"}), fl.full({}, 1.0), fl.full({}, 10.0)) end,
           "scan outputs of a Loop that runs no iteration is unsupported",
           "Loop of no iterations cannot shape its scan output")
  -- Scan: running sum over axis 1 of [2, 3], reversed, with the per-step sums
  local scan = fl.load_onnx(P.write(path("scan.onnx"), P.model{opset = 16,
    nodes = {{op = "Scan", inputs = {"s0", "xs"}, outputs = {"sf", "ys"}, name = "scan", attrs = {
      num_scan_inputs = 1, scan_input_axes = {1}, scan_input_directions = {1}, scan_output_axes = {-1},
      body = {graph = {inputs = {V"s", V"x"},
        nodes = {{op = "Add", inputs = {"s", "x"}, outputs = {"s2"}, name = "add"},
                 {op = "Identity", inputs = {"s2"}, outputs = {"y"}, name = "id"}},
        outputs = {V"s2", V"y"}}}}}},
    inputs = {{name = "s0", dims = {2}}, {name = "xs", dims = {2, 3}}}, outputs = {V"sf", V"ys"}}))
  local xs3 = fl.tensor({{1.0, 2.0, 3.0}, {10.0, 20.0, 30.0}})
  local ssf, ys = scan(fl.zeros(2), xs3)
  t.is(ssf:tolist(), {6.0, 60.0}, "Scan carries its state")
  t.is(ys:tolist(), {{3.0, 5.0, 6.0}, {30.0, 50.0, 60.0}}, "Scan: input reversed along axis 1, outputs along the last axis")
  t.is(fl.compile(scan, {backend = "cpu"})(fl.zeros(2), xs3):tolist()[1], 6.0, "Scan compiles (unrolled)")
  t.raises(function() fl.load_onnx(P.write(path("scanbad.onnx"), P.model{opset = 16,
    nodes = {{op = "Scan", inputs = {"s0", "xs"}, outputs = {"sf"}, name = "scan", attrs = {
      num_scan_inputs = 3, body = {graph = {inputs = {V"s"}, outputs = {V"s"}}}}}},
    inputs = {{name = "s0", dims = {2}}, {name = "xs", dims = {2, 3}}}, outputs = {V"sf"}})) end,
    "num_scan_inputs 3 for 2 inputs", "Scan's num_scan_inputs is checked at load")
  t.raises(function() fl.load_onnx(P.write(path("ifbad.onnx"), P.model{opset = 16,
    nodes = {{op = "If", inputs = {"c"}, outputs = {"y"}, name = "if", attrs = {
      then_branch = {graph = {nodes = {{op = "Neg", inputs = {"nowhere"}, outputs = {"t"}, name = "n"}}, outputs = {V"t"}}},
      else_branch = {graph = {outputs = {V"c"}}}}}},
    inputs = {{name = "c", dtype = "bool", dims = {}}}, outputs = {V"y"}})) end,
    "a value its subgraph reads 'nowhere' is not a graph input", "a subgraph reading an unknown name is refused at load")
end
-- 3-d pools (separable: a 2-d pool per depth slice, then along the depth)
-- against the windows counted out directly
do
  fl.manual_seed(3)
  local D, H, W = 4, 5, 3
  local x = fl.randn(1, 1, D, H, W)
  local xl = x:tolist()[1][1]
  local function ref(kind, k, s, pb, pe, include)
    local dims, out = {D, H, W}, {}
    local n = {}
    for i = 1, 3 do n[i] = (dims[i] + pb[i] + pe[i] - k[i]) // s[i] + 1 end
    for a = 1, n[1] do out[a] = {} for b = 1, n[2] do out[a][b] = {} for c = 1, n[3] do
      local best, sum, cnt = -math.huge, 0, 0
      for i = 0, k[1] - 1 do for j = 0, k[2] - 1 do for l = 0, k[3] - 1 do
        local p = {(a - 1) * s[1] - pb[1] + i + 1, (b - 1) * s[2] - pb[2] + j + 1, (c - 1) * s[3] - pb[3] + l + 1}
        if p[1] >= 1 and p[1] <= D and p[2] >= 1 and p[2] <= H and p[3] >= 1 and p[3] <= W then
          local v = xl[p[1]][p[2]][p[3]]
          best, sum, cnt = math.max(best, v), sum + v, cnt + 1
        end
      end end end
      out[a][b][c] = kind == "max" and best or sum / (include and k[1] * k[2] * k[3] or cnt)
    end end end
    return fl.tensor(out):reshape(1, 1, n[1], n[2], n[3])
  end
  local k, st, pads = {2, 3, 2}, {1, 2, 2}, {1, 1, 0, 0, 1, 1}
  for _, case in ipairs({{"MaxPool", "max", 0}, {"AveragePool", "avg", 0}, {"AveragePool", "avg", 1}}) do
    local m3 = one_node(case[1], {kernel_shape = k, strides = st, pads = pads, count_include_pad = case[1] == "AveragePool" and case[3] or nil},
                        {{"float", {1, 1, D, H, W}}}, 19)
    local want = ref(case[2], k, st, {1, 1, 0}, {0, 1, 1}, case[3] == 1)
    t.ok(fl.allclose(m3(x), want, 1e-5, 1e-6), ("3-d %s with pads (count_include_pad=%d) matches its windows"):format(case[1], case[3]))
  end
end
-- quantization: round half to even, saturate, per axis
do
  local ql = one_node("QuantizeLinear", nil, {{"float", {6}}, {"float", {}}, {"uint8", {}}}, 13)
  t.is(ql(fl.tensor{0.5, 1.5, 2.5, -1.0, 300.0, -7.5}, fl.full({}, 1.0), fl.full({}, 10, {dtype = "int64"})):tolist(),
       {10, 12, 12, 9, 255, 2}, "QuantizeLinear rounds half to even, adds the zero point, saturates")
  local qa = one_node("QuantizeLinear", {axis = 0}, {{"float", {2, 2}}, {"float", {2}}, {"int8", {2}}}, 13)
  t.is(qa(fl.tensor({{1.0, -1.0}, {4.0, -400.0}}), fl.tensor{0.5, 2.0}, I{0, 1}):tolist(), {{2, -2}, {3, -128}},
       "QuantizeLinear per axis, int8 saturating")
  local dq = one_node("DequantizeLinear", {axis = 1}, {{"uint8", {1, 2}}, {"float", {2}}, {"uint8", {2}}}, 13)
  t.is(dq(I{{10, 255}}, fl.tensor{0.5, 2.0}, I{10, 5}):tolist(), {{0.0, 500.0}}, "DequantizeLinear per axis")
  t.raises(function() one_node("QuantizeLinear", nil, {{"float", {1}}, {"float", {}}, {"float", {}}}, 13)(
             fl.tensor{1.0}, fl.full({}, 1.0), fl.full({}, 10.0)) end,
           "a zero point of dtype float32 is unsupported", "QuantizeLinear refuses a float zero point")
  local qm = one_node("QLinearMatMul", nil, {{"uint8", {1, 2}}, {"float", {}}, {"uint8", {}}, {"uint8", {2, 1}},
                      {"float", {}}, {"uint8", {}}, {"float", {}}, {"uint8", {}}}, 10)
  local one = fl.full({}, 1.0)
  local function u(v) return fl.full({}, v, {dtype = "int64"}) end
  -- (3-1)*(5-1) + (4-1)*(2-1) = 11, * 1 * 0.5 / 1 = 5.5 -> 6 (half to even), + 100
  t.is(qm(I{{3, 4}}, one, u(1), I{{5}, {2}}, fl.full({}, 0.5), u(1), one, u(100)):tolist(), {{106}},
       "QLinearMatMul: the integer product, rescaled, rounded half to even")
end
-- MatMulInteger, ConvInteger, QLinearConv against their definitions summed
-- here in Lua loops (zero points per tensor and per row/column/channel,
-- groups, pads, strides, dilations; QLinearConv's saturation and its ties
-- rounded to even); eager and compiled, the products on oneDNN's 8-bit
-- kernels (fl.matmul_int8)
do
  math.randomseed(11)
  local int8_calls = fl.blas_info().onednn_int8_calls
  local function rnd(shape, lo, hi, k)
    k = k or 1
    if k > #shape then return math.random(lo, hi) end
    local l = {}
    for i = 1, shape[k] do l[i] = rnd(shape, lo, hi, k + 1) end
    return l
  end
  local function both(m, ...)
    return m(...):tolist(), fl.compile(m, {backend = "cpu"})(...):tolist()
  end
  -- MatMulInteger: uint8 A less a zero point per row, int8 B less one per column
  local M, K, N = 3, 5, 4
  local A, B = rnd({M, K}, 0, 255), rnd({K, N}, -128, 127)
  local az, bz = rnd({M}, 0, 255), rnd({N}, -128, 127)
  local want = {}
  for i = 1, M do
    want[i] = {}
    for j = 1, N do
      local s = 0
      for k = 1, K do s = s + (A[i][k] - az[i]) * (B[k][j] - bz[j]) end
      want[i][j] = s
    end
  end
  local mi = one_node("MatMulInteger", nil, {{"uint8", {M, K}}, {"int8", {K, N}}, {"uint8", {M}}, {"int8", {N}}}, 10)
  local e, c = both(mi, I(A), I(B), I(az), I(bz))
  t.is(e, want, "MatMulInteger: zero points per row of A and per column of B")
  t.is(c, want, "... compiled")
  -- per tensor, and sums past 2^24 (exact: float64, not float32)
  local K2 = 2001
  local A2, B2 = rnd({2, K2}, 0, 255), rnd({K2, 2}, 0, 255)
  for k = 1, K2 do A2[1][k], B2[k][1] = 255, 255 end   -- (255 - 2) * 255 * 2001: odd, past 2^24
  local want2 = {}
  for i = 1, 2 do
    want2[i] = {}
    for j = 1, 2 do
      local s = 0
      for k = 1, K2 do s = s + (A2[i][k] - 2) * B2[k][j] end
      want2[i][j] = s
    end
  end
  local mi2 = one_node("MatMulInteger", nil, {{"uint8", {2, K2}}, {"uint8", {K2, 2}}, {"uint8", {}}}, 10)
  local e2, c2 = both(mi2, I(A2), I(B2), fl.full({}, 2, {dtype = "int64"}))
  t.is(e2, want2, "MatMulInteger: a per-tensor zero point, sums past 2^24 exact")
  t.is(c2, want2, "... compiled")
  t.raises(function() one_node("MatMulInteger", nil, {{"float", {1, 2}}, {"uint8", {2, 1}}}, 10)(fl.ones(1, 2), I{{1}, {2}}) end,
           "input A of dtype float32 %(int8 and uint8 only%) is unsupported", "MatMulInteger refuses a float input")

  -- the convolution of x by w (plain nested lists, zero points already
  -- taken) with ONNX's attributes, and its bias
  local function conv_ref(x, w, b, g, st, pb, pe, dl)
    local Nn, C, H, W = #x, #x[1], #x[1][1], #x[1][1][1]
    local Mo, Cg, kh, kw = #w, #w[1], #w[1][1], #w[1][1][1]
    local Ho = (H + pb[1] + pe[1] - dl[1] * (kh - 1) - 1) // st[1] + 1
    local Wo = (W + pb[2] + pe[2] - dl[2] * (kw - 1) - 1) // st[2] + 1
    local y = {}
    for n = 1, Nn do
      y[n] = {}
      for m = 1, Mo do
        y[n][m] = {}
        local grp = (m - 1) // (Mo // g)
        for oh = 1, Ho do
          y[n][m][oh] = {}
          for ow = 1, Wo do
            local s = b and b[m] or 0
            for ci = 1, Cg do
              for i = 1, kh do
                for j = 1, kw do
                  local h = (oh - 1) * st[1] - pb[1] + (i - 1) * dl[1] + 1
                  local ww = (ow - 1) * st[2] - pb[2] + (j - 1) * dl[2] + 1
                  if h >= 1 and h <= H and ww >= 1 and ww <= W then
                    s = s + x[n][grp * Cg + ci][h][ww] * w[m][ci][i][j]
                  end
                end
              end
            end
            y[n][m][oh][ow] = s
          end
        end
      end
    end
    return y
  end
  local function map(l, f, k)
    if type(l) ~= "table" then return f(l, k) end
    local r = {}
    for i, v in ipairs(l) do r[i] = map(v, f, k or i) end
    return r
  end
  -- ConvInteger: uint8 x (a zero point per tensor), int8 w (one per output
  -- channel), group 2, asymmetric pads, strides and dilations
  local X, Wt = rnd({2, 4, 6, 7}, 0, 255), rnd({6, 2, 3, 2}, -128, 127)
  local xz, wz = 131, rnd({6}, -128, 127)
  local attrs = {group = 2, pads = {1, 0, 2, 1}, strides = {2, 1}, dilations = {1, 2}}
  local xc = map(X, function(v) return v - xz end)
  local wc = {}
  for m = 1, 6 do wc[m] = map(Wt[m], function(v) return v - wz[m] end) end
  local wantc = conv_ref(xc, wc, nil, 2, {2, 1}, {1, 0}, {2, 1}, {1, 2})
  local ci = one_node("ConvInteger", attrs, {{"uint8", {2, 4, 6, 7}}, {"int8", {6, 2, 3, 2}}, {"uint8", {}}, {"int8", {6}}}, 10)
  local ec, cc = both(ci, I(X), I(Wt), fl.full({}, xz, {dtype = "int64"}), I(wz))
  t.is(ec, wantc, "ConvInteger: groups, pads, strides, dilations, zero points per tensor and per channel")
  t.is(cc, wantc, "... compiled")
  -- 1-d, auto_pad SAME_UPPER (1 pad at the start, 2 at the end), no zero points
  local X1, W1 = rnd({1, 2, 9}, -128, 127), rnd({3, 2, 4}, -128, 127)
  local x4, w4 = {}, {}
  for n = 1, 1 do x4[n] = {} for c = 1, 2 do x4[n][c] = {X1[n][c]} end end
  for m = 1, 3 do w4[m] = {} for c = 1, 2 do w4[m][c] = {W1[m][c]} end end
  local w1 = conv_ref(x4, w4, nil, 1, {1, 2}, {0, 1}, {0, 2}, {1, 1})
  for m = 1, 3 do w1[1][m] = w1[1][m][1] end
  local c1 = one_node("ConvInteger", {auto_pad = "SAME_UPPER", strides = {2}}, {{"int8", {1, 2, 9}}, {"int8", {3, 2, 4}}}, 10)
  local e1, cc1 = both(c1, I(X1), I(W1))
  t.is(e1, w1, "ConvInteger 1-d, auto_pad SAME_UPPER")
  t.is(cc1, w1, "... compiled")
  t.raises(function() one_node("ConvInteger", nil, {{"uint8", {1, 2, 3}}, {"uint8", {1, 2, 1}}, {"uint8", {2}}}, 10)(
             I{{{1, 2, 3}, {4, 5, 6}}}, I{{{1}, {2}}}, I{1, 2}) end,
           "x_zero_point of 2 values %(per tensor only%) is unsupported", "ConvInteger refuses a per-channel x_zero_point")

  -- QLinearConv: int8 x and w (w_scale and w_zero_point per output channel),
  -- an int32 bias, uint8 output; power-of-two scales, so that the products
  -- are exact and halves occur: they round to even
  local Xq, Wq = rnd({1, 4, 5, 5}, -20, 20), rnd({4, 2, 2, 3}, -8, 8)
  local xzq, wzq, bq = -3, rnd({4}, -5, 5), rnd({4}, -300, 300)
  local wsq = {1.0, 0.5, 2.0, 1 / 16}
  local xs, ys, yz = 0.5, 2.0, 128
  local xq = map(Xq, function(v) return v - xzq end)
  local wq = {}
  for m = 1, 4 do wq[m] = map(Wq[m], function(v) return v - wzq[m] end) end
  local acc = conv_ref(xq, wq, bq, 2, {1, 2}, {1, 1}, {0, 1}, {1, 1})
  local down, up, sat = 0, 0, 0      -- ties rounded down and up to even
  local function rint(v)
    local f = math.floor(v)
    local d = v - f
    if d == 0.5 then
      if f % 2 == 0 then down = down + 1; return f end
      up = up + 1; return f + 1
    end
    return d > 0.5 and f + 1 or f
  end
  local wantq = {}
  for n = 1, 1 do
    wantq[n] = {}
    for m = 1, 4 do
      wantq[n][m] = map(acc[n][m], function(s)
        local q = rint(s * (xs * wsq[m] / ys)) + yz
        if q < 0 or q > 255 then sat = sat + 1 end
        return math.max(0, math.min(255, q))
      end)
    end
  end
  t.ok(down > 0 and up > 0 and sat > 0,
       ("the QLinearConv case has ties down (%d) and up (%d) to even and saturates (%d)"):format(down, up, sat))
  local qc = one_node("QLinearConv", {group = 2, pads = {1, 1, 0, 1}, strides = {1, 2}},
    {{"int8", {1, 4, 5, 5}}, {"float", {}}, {"int8", {}}, {"int8", {4, 2, 2, 3}}, {"float", {4}}, {"int8", {4}},
     {"float", {}}, {"uint8", {}}, {"int32", {4}}}, 10)
  local eq, cq = both(qc, I(Xq), fl.full({}, xs), fl.full({}, xzq, {dtype = "int64"}), I(Wq), fl.tensor(wsq), I(wzq),
                      fl.full({}, ys), fl.full({}, yz, {dtype = "int64"}), I(bq))
  t.is(eq, wantq, "QLinearConv: per-channel w_scale and w_zero_point, bias, groups, pads; ties to even, saturated")
  t.is(cq, wantq, "... compiled")
  -- int8 output (y_zero_point's type) and per-tensor w scale and zero point
  local Xs, Ws = rnd({1, 1, 3, 3}, 0, 255), rnd({2, 1, 2, 2}, 0, 255)
  local acc2 = conv_ref(map(Xs, function(v) return v - 7 end), map(Ws, function(v) return v - 100 end), nil, 1,
                        {1, 1}, {0, 0}, {0, 0}, {1, 1})
  local want8 = map(acc2, function(s) return math.max(-128, math.min(127, rint(s * (0.5 * 0.25 / 8)) - 2)) end)
  local qc8 = one_node("QLinearConv", nil, {{"uint8", {1, 1, 3, 3}}, {"float", {}}, {"uint8", {}}, {"uint8", {2, 1, 2, 2}},
    {"float", {}}, {"uint8", {}}, {"float", {}}, {"int8", {}}}, 10)
  local e8, c8 = both(qc8, I(Xs), fl.full({}, 0.5), fl.full({}, 7, {dtype = "int64"}), I(Ws), fl.full({}, 0.25),
                      fl.full({}, 100, {dtype = "int64"}), fl.full({}, 8.0), fl.full({}, -2, {dtype = "int64"}))
  t.is(e8, want8, "QLinearConv: uint8 in, int8 out (y_zero_point's type), per-tensor scales")
  t.is(c8, want8, "... compiled")
  t.raises(function() one_node("QLinearConv", nil, {{"uint8", {1, 1, 2, 2, 2}}, {"float", {}}, {"uint8", {}}, {"uint8", {1, 1, 1, 1, 1}},
    {"float", {}}, {"uint8", {}}, {"float", {}}, {"uint8", {}}}, 10)(I{{{{{1, 2}, {3, 4}}, {{5, 6}, {7, 8}}}}}, fl.full({}, 1.0),
    fl.full({}, 0, {dtype = "int64"}), I{{{{{1}}}}}, fl.full({}, 1.0), fl.full({}, 0, {dtype = "int64"}), fl.full({}, 1.0),
    fl.full({}, 0, {dtype = "int64"})) end,
    "QLinearConv, opset 10%): a 3%-d convolution %(1%-d and 2%-d only%) is unsupported", "QLinearConv refuses a 3-d convolution")
  t.ok(fl.blas_info().onednn_int8_calls > int8_calls, ("their products ran on oneDNN's 8-bit kernels (%d calls)"):format(
    fl.blas_info().onednn_int8_calls - int8_calls))
  -- NonMaxSuppression (a graph break compiled): corners in either order,
  -- or centres (center_point_box 1); by hand: class 0 keeps box 3 (0.95),
  -- drops 0 and 1 (IoU 1 and 0.82 with it), keeps 2 and 4 (IoU 1/3); class
  -- 1, above 0.15 (not 0 nor 2), keeps 4 and 3 (IoU 1/3), drops 1 (IoU 0.43)
  local corners = {{{0, 0, 1, 1}, {0, 0.1, 1, 1.1}, {0, 10, 1, 11}, {1, 1, 0, 0}, {0, 0.5, 1, 1.5}}}
  local centres = {{{0.5, 0.5, 1, 1}, {0.6, 0.5, 1, 1}, {10.5, 0.5, 1, 1}, {0.5, 0.5, 1, 1}, {1.0, 0.5, 1, 1}}}
  local sc = fl.tensor{{{0.9, 0.75, 0.6, 0.95, 0.5}, {0.1, 0.2, 0.12, 0.4, 0.7}}}
  local function nms(cpb, bx, mx)
    local m = one_node("NonMaxSuppression", {center_point_box = cpb}, {{"float", {1, 5, 4}}, {"float", {1, 2, 5}},
      {"int64", {1}}, {"float", {1}}, {"float", {1}}}, 11)
    local args = {fl.tensor(bx), sc, I{mx}, fl.tensor{0.4}, fl.tensor{0.15}}
    return m(table.unpack(args)):tolist(), fl.compile(m, {backend = "cpu"})(table.unpack(args)):tolist()
  end
  local w3 = {{0, 0, 3}, {0, 0, 2}, {0, 0, 4}, {0, 1, 4}, {0, 1, 3}}
  local en, cn = nms(0, corners, 3)
  t.is(en, w3, "NonMaxSuppression: by score, IoU over the threshold suppressed, score threshold, per class")
  t.is(cn, w3, "... compiled (a graph break)")
  local ec2, cc2 = nms(1, centres, 2)
  local w2 = {{0, 0, 3}, {0, 0, 2}, {0, 1, 4}, {0, 1, 3}}
  t.is(ec2, w2, "NonMaxSuppression: center_point_box 1, max_output_boxes_per_class 2")
  t.is(cc2, w2, "... compiled")
  local e0 = nms(0, corners, 0)
  t.is(#e0, 0, "NonMaxSuppression: max_output_boxes_per_class 0 selects none")
end
-- the float8 and float4 types: held as float32, rounded by Cast as ONNX's
-- tables say (to nearest even, saturating or not), exact in the compiled graph
do
  local xs8 = fl.tensor{0.3, -2.75, 464, 470, 1e-3, -1e-9, 1e6, -math.huge, 0.017578125, 60000}
  local nan, inf = 0 / 0, math.huge
  local function same(a, b)
    for i = 1, #b do
      local x, y = a[i], b[i]
      if not (x == y and (x ~= 0 or 1 / x == 1 / y) or x ~= x and y ~= y) then return false end
    end
    return #a == #b
  end
  local cases = {
    {17, 1, {0.3125, -2.75, 448, 448, 0.001953125, -0.0, 448, -448, 0.017578125, 448}},
    {17, 0, {0.3125, -2.75, 448, nan, 0.001953125, -0.0, nan, nan, 0.017578125, nan}},
    {18, 1, {0.3125, -2.75, 240, 240, 0.0009765625, 0.0, 240, -240, 0.017578125, 240}},
    {18, 0, {0.3125, -2.75, nan, nan, 0.0009765625, 0.0, nan, nan, 0.017578125, nan}},
    {19, 1, {0.3125, -3.0, 448, 448, 0.0009765625, -0.0, 57344, -57344, 0.015625, 57344}},
    {19, 0, {0.3125, -3.0, 448, 448, 0.0009765625, -0.0, inf, -inf, 0.015625, 57344}},
    {20, 0, {0.3125, -3.0, 448, 448, 0.0009765625, 0.0, nan, nan, 0.015625, 57344}},
    {23, 1, {0.5, -3.0, 6, 6, 0.0, -0.0, 6, -6, 0.0, 6}},
  }
  local names = {[17] = "float8e4m3fn", [18] = "float8e4m3fnuz", [19] = "float8e5m2", [20] = "float8e5m2fnuz",
                 [23] = "float4e2m1"}
  for _, c in ipairs(cases) do
    local m = one_node("Cast", {to = c[1], saturate = c[2]}, {{"float", {10}}}, 19)
    t.ok(same(m(xs8):tolist(), c[3]), ("Cast float to %s, saturate=%d, as ONNX's tables"):format(names[c[1]], c[2]))
    if c[2] == 1 then
      t.ok(same(fl.compile(m, {backend = "cpu"})(xs8):tolist(), c[3]), ("Cast to %s compiled"):format(names[c[1]]))
    end
  end
  -- float8e8m0: powers of two, by round_mode
  local xe = fl.tensor{0.0, 0.124, 1.1, 1.5, 3.0, 2.0 ^ -130, 3e38, -4.0}
  for _, c in ipairs({{"up", 1, {2.0 ^ -127, 0.125, 2, 2, 4, 2.0 ^ -126, 2.0 ^ 127, 4}},
                      {"up", 0, {2.0 ^ -127, 0.125, 2, 2, 4, 2.0 ^ -126, nan, 4}},
                      {"down", 1, {2.0 ^ -127, 0.0625, 1, 1, 2, 2.0 ^ -127, 2.0 ^ 127, 4}},
                      {"nearest", 1, {2.0 ^ -127, 0.125, 1, 2, 4, 2.0 ^ -127, 2.0 ^ 127, 4}}}) do
    local m = one_node("Cast", {to = 24, saturate = c[2], round_mode = c[1]}, {{"float", {8}}}, 25)
    t.ok(same(m(xe):tolist(), c[3]), ("Cast float to float8e8m0, round_mode %s, saturate=%d"):format(c[1], c[2]))
  end
  -- stored codes decode exactly: E4M3FN 0x7e = 448, 0x7f NaN, 0x01 = 2^-9, 0x80 = -0
  local back = one_node("Cast", {to = 1}, {}, 19,
    {{name = "w", dtype = "float8e4m3fn", dims = {4}, raw = "\126\127\1\128"}})
  t.ok(same(back():tolist(), {448, nan, 2.0 ^ -9, -0.0}), "float8e4m3fn raw codes decode exactly")
  local fnuz = one_node("Cast", {to = 1}, {}, 19,
    {{name = "w", dtype = "float8e5m2fnuz", dims = {3}, int32s = {0x80, 0x7f, 0x01}}})
  t.ok(same(fnuz():tolist(), {nan, 57344, 2.0 ^ -17}), "float8e5m2fnuz codes in int32_data: 0x80 is NaN")
  local f4 = one_node("Identity", nil, {}, 19, {{name = "w", dtype = "float4e2m1", dims = {3}, raw = "\31\6"}})
  t.ok(same(f4():tolist(), {-6.0, 0.5, 4.0}), "float4e2m1 packed two to a byte, low nibble first")
  t.raises(function() one_node("Add", nil, {{"float8e4m3fn", {2}}, {"float8e4m3fn", {2}}}, 19) (fl.tensor{1.0, 2.0}, fl.tensor{1.0, 2.0}) end,
           "%(Add, opset 19%): .*float8e4m3fn.* is unsupported", "Add of float8 values is refused by name")
  t.raises(function() one_node("Cast", {to = 17, round_mode = "odd"}, {{"float", {1}}}, 25) end,
           "round_mode 'odd'", "Cast with a bad round_mode names it")
  local q8 = one_node("QuantizeLinear", nil, {{"float", {5}}, {"float", {}}, {"float8e4m3fn", {1}}}, 19)
  t.ok(same(q8(fl.tensor{0, 1, 2, 1e5, 200}, fl.full({}, 2.0), fl.zeros({1})):tolist(), {0, 0.5, 1, 448, 96}),
       "QuantizeLinear to float8e4m3fn saturates")
  -- a graph input holds float32 values rounded to its type
  t.ok(same(one_node("Identity", nil, {{"float8e5m2", {2}}}, 19)(fl.tensor{2.75, 1e9}):tolist(), {3.0, 57344}),
       "a float8e5m2 graph input is rounded to the type")
end
-- the 4- and 2-bit integer types: packed in the file, held as int64
do
  local i4 = one_node("Identity", nil, {}, 21, {{name = "w", dtype = "int4", dims = {3}, raw = "\143\7"}})
  t.is(i4():tolist(), {-1, -8, 7}, "int4 packed two to a byte, sign-extended, an odd count")
  local u2 = one_node("Identity", nil, {}, 21, {{name = "w", dtype = "uint2", dims = {5}, int32s = {0xe4, 0x02}}})
  t.is(u2():tolist(), {0, 1, 2, 3, 2}, "uint2 packed four to a byte in int32_data")
  t.raises(function() one_node("Identity", nil, {}, 21, {{name = "w", dtype = "int4", dims = {3}, raw = "\1"}}) end,
           "raw_data is 1 bytes, its dims and dtype need 2", "truncated packed int4 data")
  t.raises(function() one_node("Identity", nil, {}, 21, {{name = "w", dtype = "uint4", dims = {5}, int32s = {1, 2}}}) end,
           "uint4 data holds 2 packed bytes, its dims say 3", "too few packed uint4 bytes")
  t.is(one_node("Add", nil, {{"int4", {3}}, {"int4", {3}}}, 21)(I{7, -8, 3}, I{1, -1, 2}):tolist(), {-8, 7, 5},
       "int4 Add wraps into [-8, 7]")
  t.is(one_node("Cast", {to = 22}, {{"float", {5}}}, 21)(fl.tensor{-9, -8.5, 7.9, 8, 0 / 0}):tolist(), {0, -8, 7, 0, 0},
       "Cast float to int4 truncates; out of range gives 0, as ONNX's reference")
  t.is(one_node("Cast", {to = 26}, {{"int64", {4}}}, 21)(I{2, 3, -3, 1}):tolist(), {-2, -1, 1, 1},
       "Cast int64 to int2 wraps")
  local q4 = one_node("QuantizeLinear", {axis = 0}, {{"float", {2, 2}}, {"float", {2}}, {"int4", {2}}}, 21)
  t.is(q4(fl.tensor({{2.5, 30}, {-30, 6}}), fl.tensor{1.0, 2.0}, I{1, 1}):tolist(), {{3, 7}, {-8, 4}},
       "QuantizeLinear to int4 saturates to [-8, 7]")
  t.is(one_node("DequantizeLinear", nil, {{"uint2", {2}}, {"float", {}}}, 21)(I{3, 1}, fl.full({}, 0.5)):tolist(),
       {1.5, 0.5}, "DequantizeLinear of uint2")
end
local eq32 = one_node("Equal", nil, {{"int32", {2}}, {"int32", {2}}})
t.is(eq32(fl.tensor({1, 2}, {dtype = "int64"}), fl.tensor({1, 3}, {dtype = "int64"})):tolist(), {true, false},
     "int32 inputs compare exactly (held as int64)")

-- Shape -> Gather -> Mul -> Unsqueeze -> Concat -> Reshape (what exporters
-- write) stays symbolic: one compile serves every batch size, and the size
-- cast into data (Cast) is a graph value, not a constant
do
  local sm2 = fl.load_onnx(P.write(path("shape.onnx"), P.model{nodes = {
    {op = "Shape", inputs = {"x"}, outputs = {"s"}, name = "sh"},
    {op = "Gather", inputs = {"s", "zero"}, outputs = {"n"}, name = "g", attrs = {axis = 0}},
    {op = "Mul", inputs = {"n", "two"}, outputs = {"n2"}, name = "mul"},
    {op = "Unsqueeze", inputs = {"n2", "ax"}, outputs = {"n2u"}, name = "u"},
    {op = "Concat", inputs = {"n2u", "minus1"}, outputs = {"shp"}, name = "cat", attrs = {axis = 0}},
    {op = "Reshape", inputs = {"x", "shp"}, outputs = {"y"}, name = "r"},
    {op = "Cast", inputs = {"n2"}, outputs = {"nf"}, name = "c", attrs = {to = 1}},
    {op = "Mul", inputs = {"y", "nf"}, outputs = {"z"}, name = "scale"}},
    inits = {{name = "zero", dtype = "int64", dims = {}, ints = {0}}, {name = "two", dtype = "int64", dims = {}, ints = {2}},
             {name = "ax", dtype = "int64", dims = {1}, ints = {0}}, {name = "minus1", dtype = "int64", dims = {1}, ints = {-1}}},
    inputs = {{name = "x", dims = {"N", 6}}}, outputs = {{name = "z"}}}))
  local scm = fl.compile(sm2, {backend = "cpu"})
  local good = true
  for _, n in ipairs({2, 3, 5}) do
    local xx = fl.randn(n, 6)
    local y = scm(xx)
    good = good and y.shape[1] == 2 * n and fl.allclose(y, xx:reshape(2 * n, 3) * (2 * n))
  end
  t.ok(good, "shape arithmetic from Shape runs compiled for every batch size")
  t.is(scm:stats().compiles, 1, "... with one compile")
end

do
  local P2 = P
  local rz = fl.load_onnx(P2.write(path("resize.onnx"), P2.model{opset = 13, nodes = {
    {op = "Resize", inputs = {"x", "", "scales"}, outputs = {"y"}, name = "rz", attrs = {mode = "nearest"}}},
    inits = {{name = "scales", dims = {4}, floats = {1, 1, 2, 2}}},
    inputs = {{name = "x", dims = {1, 1, 2, 2}}}, outputs = {{name = "y"}}}))
  local rx = fl.tensor({{{{1, 2}, {3, 4}}}}, {dtype = "float32"})
  local want_r = {{{{1, 1, 2, 2}, {1, 1, 2, 2}, {3, 3, 4, 4}, {3, 3, 4, 4}}}}
  t.is(rz(rx):tolist(), want_r, "Resize nearest (half_pixel, round_prefer_floor) repeats pixels")
  t.is(fl.compile(rz, {backend = "cpu"})(rx):tolist(), want_r, "... compiled, its scales a constant")
  t.raises(function()
    fl.load_onnx(P2.write(path("resize_lin.onnx"), P2.model{opset = 13, nodes = {
      {op = "Resize", inputs = {"x", "", "scales"}, outputs = {"y"}, name = "rz",
       attrs = {mode = "linear", coordinate_transformation_mode = "tf_crop_and_resize"}}},
      inits = {{name = "scales", dims = {4}, floats = {1, 1, 2, 2}}},
      inputs = {{name = "x", dims = {1, 1, 2, 2}}}, outputs = {{name = "y"}}}))(rx)
  end, "node 'rz' %(Resize, opset 13%): roi of 0 values for 4 axes %(tf_crop_and_resize%)",
  "Resize tf_crop_and_resize without a roi: an error naming the node")
end

-- ---- batch compile (how the conformance runner compiles its cases) ----------------
do
  local ks = {}
  for i = 1, 3 do
    local xi = fl.randn(i + 1, 4)
    ks[i] = fl.capture(m, xi):decompose{quiet = true}:optimize{quiet = true}:fuse():codegen("cpu", "fl_t" .. i .. "_")
  end
  fl.compile_batch(ks)
  local good = true
  for i = 1, 3 do
    local xi = fl.randn(i + 1, 4)
    good = good and ks[i]:stats().compiled and fl.allclose(ks[i]:run(xi), m(xi))
  end
  t.ok(good, "fl.compile_batch compiles programs together, each runs")
  t.raises(function() fl.compile_batch({ks[1], "x"}) end, "element 2 is a string, expected a C program",
           "compile_batch: a non-program")
  local plan = fl.capture(m, x):fuse()
  t.raises(function() plan:codegen("cpu", "1bad") end, "prefix must be a C identifier", "codegen prefix checked")
  t.raises(function() plan:codegen("cpu", "a;b") end, "prefix must be a C identifier", "codegen prefix: no punctuation")
end

-- ---- errors at call ---------------------------------------------------------
t.raises(function() m(x, x) end, "expected 1 inputs", "wrong input count")
t.raises(function() m(fl.randn(2, 5)) end, "must be %[N,4%], got %[2,5%]", "wrong input shape")
t.raises(function() m(fl.zeros({2, 4}, {dtype = "int64"})) end, "must be float32", "wrong input dtype")

-- ---- bad files ------------------------------------------------------------------
local good = P.mlp()
local function load_bytes(name, s) return function() fl.load_onnx(P.write(path(name), s)) end end
t.raises(load_bytes("trunc.onnx", good:sub(1, #good // 2)), "truncated or malformed", "truncated file")
t.raises(load_bytes("junk.onnx", ("\255"):rep(64)), "truncated or malformed", "malformed protobuf")
t.raises(load_bytes("empty.onnx", ""), "empty file", "empty file")
t.raises(function() fl.load_onnx(path("missing.onnx")) end, "missing.onnx", "missing file")
t.raises(function() fl.load_onnx(dir) end, "only files are read", "a directory")
t.raises(load_bytes("noinit.onnx", P.mlp{inits = {{name = "b", dims = {3}, floats = {1, 2, 3}}}}),
         "node 'mm' %(MatMul%): input 'W' is not a graph input, an initializer or any node's output",
         "missing initializer")
t.raises(load_bytes("cycle.onnx", P.mlp{nodes = {
  {op = "Add", inputs = {"x", "c"}, outputs = {"a"}, name = "n1"},
  {op = "Relu", inputs = {"a"}, outputs = {"c"}, name = "n2"},
  {op = "Relu", inputs = {"a"}, outputs = {"y"}, name = "n3"}}}), "on a cycle", "cycle")
-- nodes out of order are sorted
local shuffled = fl.load_onnx(P.write(path("order.onnx"), P.mlp{nodes = {
  {op = "Relu", inputs = {"z"}, outputs = {"y"}, name = "relu"},
  {op = "Add", inputs = {"h", "b"}, outputs = {"z"}, name = "add"},
  {op = "MatMul", inputs = {"x", "W"}, outputs = {"h"}, name = "mm"}}}))
t.ok(fl.allclose(shuffled(x), want), "nodes out of order are sorted")
t.raises(load_bytes("absurd.onnx", P.mlp{inits = {{name = "W", dims = {1 << 40, 1 << 40}, floats = {}},
  {name = "b", dims = {3}, floats = {1, 2, 3}}}}), "tensor 'W'", "absurd dims")
t.raises(load_bytes("neg.onnx", P.mlp{inits = {{name = "W", dims = {-4, 3}, floats = {}},
  {name = "b", dims = {3}, floats = {1, 2, 3}}}}), "negative", "negative dim")
t.raises(load_bytes("count.onnx", P.mlp{inits = {{name = "W", dims = {4, 3}, floats = {1, 2}},
  {name = "b", dims = {3}, floats = {1, 2, 3}}}}), "holds 2 values, its dims say 12", "data count mismatch")
t.raises(load_bytes("raw.onnx", P.mlp{inits = {{name = "W", dims = {4, 3}, raw = ("\0"):rep(7)},
  {name = "b", dims = {3}, floats = {1, 2, 3}}}}), "raw_data is 7 bytes, its dims and dtype need 48",
  "raw_data size mismatch")
t.raises(load_bytes("opset.onnx", P.mlp{opset = 999}), "opset 999 of ai.onnx is unsupported", "unknown opset version")
t.raises(load_bytes("domain.onnx", P.model{nodes = {{op = "Foo", domain = "com.example", inputs = {"x"}, outputs = {"y"}, name = "f"}},
  inputs = {{name = "x", dims = {2}}}, outputs = {{name = "y"}}}), "domain 'com.example' is unsupported", "unknown domain")
t.raises(load_bytes("op.onnx", P.model{nodes = {{op = "Frobnicate", inputs = {"x"}, outputs = {"y"}, name = "f"}},
  inputs = {{name = "x", dims = {2}}}, outputs = {{name = "y"}}}),
  "onnx: node 'f' %(Frobnicate, opset 13%): op Frobnicate is unsupported", "unsupported op names node, op and opset")
t.raises(load_bytes("attr.onnx", P.model{opset = 9, nodes = {{op = "Upsample", inputs = {"x", "s"}, outputs = {"y"}, name = "c",
  attrs = {mode = "linear"}}},
  inputs = {{name = "x", dims = {1, 2, 3, 3}}, {name = "s", dims = {4}}}, outputs = {{name = "y"}}}),
  "node 'c' %(Upsample, opset 9%): mode 'linear' %(nearest only%) is unsupported", "unsupported attribute value")
t.raises(load_bytes("dtype.onnx", P.mlp{inits = {{name = "W", dims = {2}, dtype = "complex64", raw = ("\0"):rep(16)},
  {name = "b", dims = {3}, floats = {1, 2, 3}}}}), "dtype complex64 is unsupported", "unsupported dtype")
do
  -- double: a float64 graph, weights and arithmetic in double
  local third = string.pack("<d<d<d", 1 / 3, -2.5, 1e-300)
  local m = fl.load_onnx(P.write(path("double.onnx"), P.model{
    nodes = {{op = "Mul", inputs = {"x", "w"}, outputs = {"y"}, name = "m"}},
    inits = {{name = "w", dims = {3}, dtype = "double", raw = third}},
    inputs = {{name = "x", dims = {3}, dtype = "double"}}, outputs = {{name = "y", dtype = "double"}}}))
  local y = m(fl.tensor({3, 2, 1e300}, {dtype = "float64"}))
  t.ok(y.dtype == "float64" and y:tolist()[1] == 1 / 3 * 3 and y:tolist()[2] == -5 and
       math.abs(y:tolist()[3] - 1) < 1e-15, "ONNX double weights and inputs compute in double: " .. t.show(y:tolist()))
end
t.raises(load_bytes("dup.onnx", P.mlp{nodes = {
  {op = "Relu", inputs = {"x"}, outputs = {"y"}, name = "a"},
  {op = "Relu", inputs = {"x"}, outputs = {"y"}, name = "b"}}}), "produced twice", "a value produced twice")

t.raises(load_bytes("name.onnx", P.mlp{inits = {{name = "W", dims = {4, 3}, floats = {1,2,3,4,5,6,7,8,9,10,11,12}},
  {name = "b", dims = {3}, floats = {1, 2, 3}}, {name = "forward", dims = {3}, floats = {1, 2, 3}}}}), "initializer 'forward': a name the module itself uses",
  "an initializer named like a module method")

-- ---- external data ----------------------------------------------------------------
do
  local w = {}
  for i = 1, 12 do w[i] = string.pack("<f", (i % 5 - 2) * 0.25) end
  P.write(path("w.bin"), ("\0"):rep(8) .. table.concat(w))
  local function ext(loc, off, len)
    return P.mlp{inits = {{name = "W", dims = {4, 3}, external = {location = loc, offset = off, length = len}},
      {name = "b", dims = {3}, floats = {0.1, 0.2, 0.3}}}}
  end
  local me = fl.load_onnx(P.write(path("ext.onnx"), ext("w.bin", 8, 48)))
  t.ok(fl.allclose(me(x), want), "external data inside the model's folder")
  t.raises(load_bytes("ext_up.onnx", ext("../w.bin", 8)), "leaves the model's folder", "external data with ..")
  t.raises(load_bytes("ext_abs.onnx", ext("/etc/passwd")), "must be a relative path", "external data absolute path")
  os.execute("ln -sf /etc/passwd " .. q(path("link.bin")))
  t.raises(load_bytes("ext_link.onnx", ext("link.bin")), "through a symlink", "external data through an escaping symlink")
  t.raises(load_bytes("ext_off.onnx", ext("w.bin", 40)), "runs past the end", "external data offset past the end")
  t.raises(load_bytes("ext_len.onnx", ext("w.bin", 8, 12)), "length 12", "external data length mismatch")
end

-- ---- hostile files and the semantics of opsets 18 to 28 --------------------
do
  local function load(name, m) return fl.load_onnx(P.write(path(name), P.model(m))) end
  local function i64s(name, v) return {name = name, dims = {#v}, ints = v, dtype = "int64"} end
  local function range(s, l, d, out)
    return {opset = 13, nodes = {{op = "Range", inputs = {"s", "l", "d"}, outputs = {"y"}, name = "r"}},
      inits = {{name = "s", dims = {}, ints = {s}, dtype = "int64"}, {name = "l", dims = {}, ints = {l}, dtype = "int64"},
               {name = "d", dims = {}, ints = {d}, dtype = "int64"}},
      inputs = {}, outputs = {{name = "y", dtype = out or "int64"}}}
  end
  local t0 = fl.now()
  t.raises(function() load("range_huge.onnx", range(0, 3000000000, 1))() end,
           "node 'r' %(Range, opset 13%): Range of 3000000000 elements: more than one node may make",
           "an int64 Range of 3e9 elements is refused before it is built")
  t.ok(fl.now() - t0 < 5, "... at once, not after filling gigabytes")
  local r = load("range_ovf.onnx", range(math.mininteger, math.maxinteger, math.maxinteger // 2 + 1))()
  t.is(r:tolist(), {math.mininteger, math.mininteger + (1 << 62), 0, 1 << 62},
       "a Range whose span passes int64 counts as onnxruntime does (4 elements)")
  t.raises(function()
    load("range_fhuge.onnx", {opset = 13, nodes = {{op = "Range", inputs = {"s", "l", "d"}, outputs = {"y"}, name = "r"}},
      inits = {{name = "s", dims = {}, floats = {0}}, {name = "l", dims = {}, floats = {1e12}}, {name = "d", dims = {}, floats = {0.5}}},
      inputs = {}, outputs = {{name = "y"}}})()
  end, "a float Range of 1999999991808 elements", "a huge float Range is refused by a message that names its size")
  t.raises(function()
    load("d2s0.onnx", {opset = 13, nodes = {{op = "DepthToSpace", inputs = {"x"}, outputs = {"y"}, name = "d", attrs = {blocksize = 0}}},
      inputs = {{name = "x", dims = {1, 4, 2, 2}}}, outputs = {{name = "y"}}})
  end, "node 'd' %(DepthToSpace, opset 13%): blocksize 0 %(a positive integer%)", "DepthToSpace with a zero block")
  for _, nm in ipairs{"_nodes", "_consts", "_dynamic_dims", "_op_counts", "_op_order", "_params", "training"} do
    t.raises(function()
      load("res.onnx", {opset = 13, nodes = {{op = "Add", inputs = {"x", nm}, outputs = {"y"}, name = "a"}},
        inits = {{name = nm, dims = {2}, floats = {1, 2}}}, inputs = {{name = "x", dims = {2}}}, outputs = {{name = "y"}}})
    end, "initializer '" .. nm .. "': a name the module itself uses", "an initializer named " .. nm .. " is refused at load")
  end
  t0 = fl.now()
  t.raises(function()
    load("rz_huge.onnx", {opset = 13, nodes = {{op = "Resize", inputs = {"x", "", "scales"}, outputs = {"y"}, name = "rz", attrs = {mode = "nearest"}}},
      inits = {{name = "scales", dims = {4}, floats = {1, 1, 1e9, 1e9}}},
      inputs = {{name = "x", dims = {1, 1, 2, 2}}}, outputs = {{name = "y"}}})(fl.randn(1, 1, 2, 2))
  end, "Resize to a tensor of 4000000000000000000 elements: more than one node may make", "Resize by 1e9 is refused")
  t.ok(fl.now() - t0 < 5, "... at once")
  local ok, err = pcall(load, "esc.onnx", {opset = 13, nodes = {{op = "Foo\27]0;x\7", inputs = {"x"}, outputs = {"y"}, name = "n\27[2J"}},
    inputs = {{name = "x", dims = {2}}}, outputs = {{name = "y"}}})
  t.ok(not ok and not tostring(err):find("[\27\7]") and tostring(err):find("n\\x1b[2J", 1, true),
       "names from the file reach an error as text: no escape sequence gets through")
  local em = load("esc2.onnx", {opset = 13, name = "g\27[2J", nodes = {{op = "Relu", inputs = {"x\27]0;t\7"}, outputs = {"y"}, name = "r"}},
    inputs = {{name = "x\27]0;t\7", dims = {2}}}, outputs = {{name = "y"}}})
  t.ok(not tostring(em):find("[\27\7]") and tostring(em):find("x\\x1b]0;t\\x07", 1, true), "... and print(model)")
  local sl = load("slice_min.onnx", {opset = 13, nodes = {{op = "Slice", inputs = {"x", "s", "e", "a", "st"}, outputs = {"y"}, name = "sl"}},
    inits = {i64s("s", {-1}), i64s("e", {math.mininteger}), i64s("a", {1}), i64s("st", {math.mininteger})},
    inputs = {{name = "x", dims = {2, 3}}}, outputs = {{name = "y"}}})
  t.is(sl(fl.arange(6):reshape(2, 3):to("float32")):tolist(), {{2}, {5}}, "Slice with step INT64_MIN takes one element, as onnxruntime")
  local ge = load("ge.onnx", {opset = 13, nodes = {{op = "GatherElements", inputs = {"x", "i"}, outputs = {"y"}, name = "g", attrs = {axis = 1}}},
    inits = {{name = "i", dims = {2, 1}, ints = {0, 7}, dtype = "int64"}},
    inputs = {{name = "x", dims = {2, 3}}}, outputs = {{name = "y"}}})
  t.raises(function() ge(fl.randn(2, 3)) end, "node 'g' %(GatherElements, opset 13%): an index out of range %[%-3, 2%]",
           "GatherElements with an index out of range is an error, not a zero")
  local nl = load("nll.onnx", {opset = 13, nodes = {{op = "NegativeLogLikelihoodLoss", inputs = {"x", "t"}, outputs = {"y"}, name = "n"}},
    inputs = {{name = "x", dims = {2, 3}}, {name = "t", dims = {2}, dtype = "int64"}}, outputs = {{name = "y"}}})
  t.raises(function() nl(fl.randn(2, 3), fl.tensor({1, 3}, {dtype = "int64"})) end, "a target out of range %[0, 2%]",
           "NegativeLogLikelihoodLoss with a class out of range is an error")
  -- opset 18 on: the max of nothing is -inf; opset 28: Mod of floats floors
  local rm = load("rmax.onnx", {opset = 18, nodes = {{op = "ReduceMax", inputs = {"x", "ax"}, outputs = {"y"}, name = "m", attrs = {keepdims = 0}}},
    inits = {i64s("ax", {1})}, inputs = {{name = "x", dims = {2, 0}}}, outputs = {{name = "y"}}})
  t.is(rm(fl.zeros(2, 0)):tolist(), {-math.huge, -math.huge}, "ReduceMax over an empty set is -inf")
  local md = load("mod.onnx", {opset = 28, nodes = {{op = "Mod", inputs = {"a", "b"}, outputs = {"y"}, name = "m"}},
    inputs = {{name = "a", dims = {4}}, {name = "b", dims = {4}}}, outputs = {{name = "y"}}})
  t.is(md(fl.tensor{-7.5, 7.5, -7.5, 7.5}, fl.tensor{2.0, 2.0, -2.0, -2.0}):tolist(), {0.5, 1.5, -1.5, -0.5},
       "Mod of floats with fmod = 0 floors (opset 28), as Python's %")
  t.is(fl.compile(md, {backend = "cpu"})(fl.tensor{-7.5, 7.5, -7.5, 7.5}, fl.tensor{2.0, 2.0, -2.0, -2.0}):tolist(),
       {0.5, 1.5, -1.5, -0.5}, "... compiled")
end

-- ---- CumSum (transformers' decoder masks), its axis a constant input
do
  local cs = fl.load_onnx(P.write(path("cumsum.onnx"), P.model{opset = 14, nodes = {
    {op = "CumSum", inputs = {"x", "ax"}, outputs = {"y"}, name = "c", attrs = {exclusive = 1, reverse = 1}}},
    inits = {{name = "ax", dims = {}, ints = {-1}, dtype = "int64"}},
    inputs = {{name = "x", dims = {2, 3}}}, outputs = {{name = "y"}}}))
  local x = fl.tensor{{1.0, 2.0, 3.0}, {4.0, 5.0, 6.0}}
  t.is(cs(x):tolist(), {{5, 3, 0}, {11, 6, 0}}, "CumSum exclusive and reversed along the last axis")
  t.is(fl.compile(cs, {backend = "cpu"})(x):tolist(), {{5, 3, 0}, {11, 6, 0}}, "... compiled")
end

-- ---- Shape -> Gather -> Range (the exporters' position ids): symbolic under
-- capture, one compile for every size
do
  local sr = fl.load_onnx(P.write(path("symrange.onnx"), P.model{opset = 13, nodes = {
    {op = "Shape", inputs = {"x"}, outputs = {"s"}, name = "sh"},
    {op = "Gather", inputs = {"s", "zero"}, outputs = {"n"}, name = "g", attrs = {axis = 0}},
    {op = "Range", inputs = {"start", "n", "one"}, outputs = {"r"}, name = "rg"},
    {op = "Cast", inputs = {"r"}, outputs = {"rf"}, name = "c", attrs = {to = 1}},
    {op = "Unsqueeze", inputs = {"rf", "ax"}, outputs = {"ru"}, name = "u"},
    {op = "Add", inputs = {"x", "ru"}, outputs = {"y"}, name = "a"}},
    inits = {{name = "zero", dims = {}, ints = {0}, dtype = "int64"}, {name = "start", dims = {}, ints = {0}, dtype = "int64"},
             {name = "one", dims = {}, ints = {1}, dtype = "int64"}, {name = "ax", dims = {1}, ints = {1}, dtype = "int64"}},
    inputs = {{name = "x", dims = {"N", 4}}}, outputs = {{name = "y"}}}))
  local cm = fl.compile(sr, {backend = "cpu"})
  local good = true
  for _, n in ipairs{2, 3, 5, 9} do
    local x = fl.randn(n, 4)
    good = good and fl.allclose(cm(x), sr(x)) and fl.allclose(sr(x), x + fl.arange(n):to("float32"):unsqueeze(2))
  end
  t.ok(good, "a Range over a dim's size runs compiled for every size")
  t.is(cm:stats().compiles, 1, "... with one compile (the Range is symbolic)")
end

-- ---- Resize at opset 18 as exporters write it (antialias, keep_aspect_ratio_policy
-- at their defaults, axes), and linear mode
do
  local function rz(name, attrs, scales)
    return fl.load_onnx(P.write(path(name), P.model{opset = 18, nodes = {
      {op = "Resize", inputs = {"x", "", "scales"}, outputs = {"y"}, name = "rz", attrs = attrs}},
      inits = {{name = "scales", dims = {#scales}, floats = scales}},
      inputs = {{name = "x", dims = {1, 1, 2, 2}}}, outputs = {{name = "y"}}}))
  end
  local x = fl.tensor({{{{1, 2}, {3, 4}}}}, {dtype = "float32"})
  local near = rz("rz18.onnx", {mode = "nearest", antialias = 0, keep_aspect_ratio_policy = "stretch", axes = {2, 3}}, {2, 2})
  t.is(near(x):tolist(), {{{{1, 1, 2, 2}, {1, 1, 2, 2}, {3, 3, 4, 4}, {3, 3, 4, 4}}}},
       "Resize with opset 18's attributes at their defaults and axes = {2, 3}")
  local lin = rz("rzlin.onnx", {mode = "linear", coordinate_transformation_mode = "align_corners"}, {1, 1, 2, 2})
  local want = {{{{1, 4 / 3, 5 / 3, 2}, {5 / 3, 2, 7 / 3, 8 / 3}, {7 / 3, 8 / 3, 3, 10 / 3}, {3, 10 / 3, 11 / 3, 4}}}}
  t.ok(fl.allclose(lin(x), fl.tensor(want), 1e-6, 1e-6), "Resize linear, align_corners: bilinear values")
  t.ok(fl.allclose(fl.compile(lin, {backend = "cpu"})(x), fl.tensor(want), 1e-6, 1e-6), "... compiled")
  t.raises(function() rz("rzaa.onnx", {mode = "nearest", antialias = 1}, {1, 1, 0.5, 0.5}) end,
           "node 'rz' %(Resize, opset 18%): antialias = 1 in mode 'nearest'", "antialias = 1 in mode nearest: an error naming the node")
end

-- ---- ConvTranspose against its definition (each input element scattered
-- through the kernel), over random strides, pads, dilations, groups and
-- output paddings; eager and compiled
do
  math.randomseed(43)
  local function naive(x, w, st, pb, pe, dl, op, G)
    local N, Cin, H, W = table.unpack(x.shape)
    local _, Coutg, KH, KW = table.unpack(w.shape)
    local OH = st[1] * (H - 1) + op[1] + (KH - 1) * dl[1] + 1 - pb[1] - pe[1]
    local OW = st[2] * (W - 1) + op[2] + (KW - 1) * dl[2] + 1 - pb[2] - pe[2]
    local xs, ws = x:tolist(), w:tolist()
    local y = {}
    for n = 1, N do
      y[n] = {}
      for c = 1, Coutg * G do
        y[n][c] = {}
        for i = 1, OH do y[n][c][i] = {} for j = 1, OW do y[n][c][i][j] = 0 end end
      end
    end
    local Cing = Cin // G
    for n = 1, N do for ci = 1, Cin do
      local g = (ci - 1) // Cing
      for ih = 0, H - 1 do for iw = 0, W - 1 do
        for oc = 1, Coutg do for kh = 0, KH - 1 do for kw = 0, KW - 1 do
          local oh, ow = ih * st[1] - pb[1] + kh * dl[1], iw * st[2] - pb[2] + kw * dl[2]
          if oh >= 0 and oh < OH and ow >= 0 and ow < OW then
            local row = y[n][g * Coutg + oc][oh + 1]
            row[ow + 1] = row[ow + 1] + xs[n][ci][ih + 1][iw + 1] * ws[ci][oc][kh + 1][kw + 1]
          end
        end end end
      end end
    end end
    return fl.tensor(y)
  end
  local bad, cbad, cases = 0, 0, 0
  for c = 1, 24 do
    local G = ({1, 1, 2})[math.random(3)]
    local Cin, Coutg = G * math.random(1, 2), math.random(1, 3)
    local H, W = math.random(1, 4), math.random(1, 4)
    local KH, KW = math.random(1, 3), math.random(1, 3)
    local st, dl = {math.random(1, 3), math.random(1, 3)}, {math.random(1, 2), math.random(1, 2)}
    local op = {math.random(0, st[1] - 1), math.random(0, st[2] - 1)}
    op = {math.min(op[1], math.max(st[1], dl[1]) - 1), math.min(op[2], math.max(st[2], dl[2]) - 1)}
    local pb, pe = {math.random(0, KH - 1), math.random(0, KW - 1)}, {math.random(0, KH - 1), math.random(0, KW - 1)}
    local m = fl.load_onnx(P.write(path("ct.onnx"), P.model{opset = 11, nodes = {
      {op = "ConvTranspose", inputs = {"x", "w"}, outputs = {"y"}, name = "ct",
       attrs = {strides = st, dilations = dl, output_padding = op, group = G,
                pads = {pb[1], pb[2], pe[1], pe[2]}}}},
      inits = {{name = "w", dims = {Cin, Coutg, KH, KW}, floats = (function()
        local v = {} for i = 1, Cin * Coutg * KH * KW do v[i] = math.random() * 2 - 1 end return v end)()}},
      inputs = {{name = "x", dims = {1, Cin, H, W}}}, outputs = {{name = "y"}}}))
    local x = fl.randn(1, Cin, H, W)
    local want = naive(x, m.w, st, pb, pe, dl, op, G)
    local okr, y = pcall(m, x)
    if okr and y.shape[3] > 0 and y.shape[4] > 0 then
      cases = cases + 1
      if not fl.allclose(y, want, 1e-5, 1e-5) then bad = bad + 1 end
      if not fl.allclose(fl.compile(m, {backend = "cpu"})(x), want, 1e-5, 1e-5) then cbad = cbad + 1 end
    end
  end
  t.ok(cases >= 15 and bad == 0, ("ConvTranspose equals its definition eagerly (%d random cases, %d wrong)"):format(cases, bad))
  t.ok(cases >= 15 and cbad == 0, ("... and compiled (%d wrong)"):format(cbad))
end

-- ---- TopK (k rounds of argmax) and Einsum (broadcast, multiply, sum) against
-- their definitions, eager and compiled
do
  local tk = fl.load_onnx(P.write(path("topk.onnx"), P.model{opset = 11, nodes = {
    {op = "TopK", inputs = {"x", "k"}, outputs = {"v", "i"}, name = "t", attrs = {axis = 1, largest = 1}}},
    inits = {{name = "k", dims = {1}, ints = {3}, dtype = "int64"}},
    inputs = {{name = "x", dims = {2, 5}}}, outputs = {{name = "v"}, {name = "i", dtype = "int64"}}}))
  local x = fl.tensor{{1.0, 5.0, 3.0, 5.0, 2.0}, {-1.0, -2.0, 0.0, 7.0, 0.0}}
  for _, f in ipairs{tk, fl.compile(tk, {backend = "cpu"})} do
    local v, i = f(x)
    t.is({v:tolist(), i:tolist()}, {{{5, 5, 3}, {7, 0, 0}}, {{1, 3, 2}, {3, 2, 4}}},
         "TopK: the k largest, ties to the smaller index" .. (f == tk and "" or " (compiled)"))
  end
  local function ein(eqn, shapes, want_fn)
    local inputs, names, vals = {}, {}, {}
    for i, sh in ipairs(shapes) do
      names[i] = "x" .. i
      inputs[i] = {name = names[i], dims = sh}
      vals[i] = fl.randn(table.unpack(sh))
    end
    local m = fl.load_onnx(P.write(path("ein.onnx"), P.model{opset = 12, nodes = {
      {op = "Einsum", inputs = names, outputs = {"y"}, name = "e", attrs = {equation = eqn}}},
      inputs = inputs, outputs = {{name = "y"}}}))
    local want = want_fn(table.unpack(vals))
    local y, yc = m(table.unpack(vals)), fl.compile(m, {backend = "cpu"})(table.unpack(vals))
    t.ok(fl.allclose(y, want, 1e-5, 1e-5) and fl.allclose(yc, want, 1e-5, 1e-5) and
         #y.shape == #want.shape, "Einsum '" .. eqn .. "' eager and compiled")
  end
  ein("ij,jk->ik", {{3, 4}, {4, 5}}, function(a, b) return a:matmul(b) end)
  ein("ij,jk", {{3, 4}, {4, 5}}, function(a, b) return a:matmul(b) end)
  ein("ij->ji", {{3, 4}}, function(a) return a:transpose(1, 2) end)
  ein("ii->i", {{4, 4}}, function(a) return (a * fl.arange(4):reshape(4, 1):eq(fl.arange(4):reshape(1, 4)):to("float32")):sum(2) end)
  ein("ii", {{4, 4}}, function(a) return (a * fl.arange(4):reshape(4, 1):eq(fl.arange(4):reshape(1, 4)):to("float32")):sum() end)
  ein("...ij,...jk->...ik", {{2, 3, 4}, {2, 4, 5}}, function(a, b) return a:matmul(b) end)
  ein("bhqd,bhkd->bhqk", {{1, 2, 3, 4}, {1, 2, 5, 4}}, function(a, b) return a:matmul(b:transpose(3, 4)) end)
  ein("i,i->", {{6}, {6}}, function(a, b) return (a * b):sum() end)
  ein("ij->", {{3, 4}}, function(a) return a:sum() end)
end

-- ---- sequence_lens: a short sequence in a batch gives what it gives alone,
-- forward and backward (bidirectional), its padded steps zero
do
  math.randomseed(7)
  local function rnd(n) local v = {} for i = 1, n do v[i] = math.random() - 0.5 end return v end
  local I, Hd, S = 3, 4, 5
  for _, kind in ipairs{"GRU", "LSTM", "RNN"} do
    local NG = ({RNN = 1, GRU = 3, LSTM = 4})[kind]
    local function model(name, with_lens)
      local ins = {"x", "w", "r", "b", with_lens and "l" or ""}
      local inits = {{name = "w", dims = {2, NG * Hd, I}, floats = rnd(2 * NG * Hd * I)},
                     {name = "r", dims = {2, NG * Hd, Hd}, floats = rnd(2 * NG * Hd * Hd)},
                     {name = "b", dims = {2, 2 * NG * Hd}, floats = rnd(4 * NG * Hd)}}
      local inputs = {{name = "x", dims = with_lens and {S, 3, I} or {"T", 1, I}}}
      if with_lens then inputs[2] = {name = "l", dims = {3}, dtype = "int64"} end
      return P.model{opset = 14, nodes = {{op = kind, inputs = ins, outputs = {"y", "yh"}, name = "rnn",
        attrs = {hidden_size = Hd, direction = "bidirectional"}}}, inits = inits, inputs = inputs,
        outputs = {{name = "y"}, {name = "yh"}}}
    end
    math.randomseed(11)
    local batched = fl.load_onnx(P.write(path("rnn_b.onnx"), model("b", true)))
    math.randomseed(11)
    local alone = fl.load_onnx(P.write(path("rnn_a.onnx"), model("a", false)))
    local x = fl.randn(S, 3, I)
    local lens = {5, 2, 3}
    local y, yh = batched(x, fl.tensor(lens, {dtype = "int64"}))
    local good = true
    for b = 1, 3 do
      local ya, yha = alone(x:narrow(2, b, 1):narrow(1, 1, lens[b]):contiguous())
      good = good and fl.allclose(y:narrow(3, b, 1):narrow(1, 1, lens[b]), ya, 1e-5, 1e-6)
        and fl.allclose(yh:narrow(2, b, 1), yha, 1e-5, 1e-6)
      if lens[b] < S then good = good and y:narrow(3, b, 1):narrow(1, lens[b] + 1, S - lens[b]):abs():amax():item() == 0 end
    end
    t.ok(good, kind .. " bidirectional with sequence_lens: each sequence as it runs alone, padding zero")
  end
end

-- ---- an opset newer than the newest known loads, with one warning
do
  local f = P.write(path("op30.onnx"), P.model{opset = 30, nodes = {{op = "Relu", inputs = {"x"}, outputs = {"y"}, name = "r"}},
    inputs = {{name = "x", dims = {3}}}, outputs = {{name = "y"}}})
  local bin = os.getenv("FUSELAB") or "./fuselab"
  local pipe = io.popen(("%s -e 'print(fl.load_onnx(%q)(fl.tensor{-1.0, 0.0, 2.0}):tolist()[3])' 2>&1"):format(bin, f))
  local out = pipe:read("a")
  pipe:close()
  local _, nwarn = out:gsub("warning", "")
  t.ok(out:find("opset 30 is newer than 28, the newest fuselab knows", 1, true) and nwarn == 1 and out:find("\n2%.0\n"),
       "opset 30 loads and runs, with one warning naming the opsets")
  t.raises(function()
    fl.load_onnx(P.write(path("op3000.onnx"), P.model{opset = 3000, nodes = {{op = "Relu", inputs = {"x"}, outputs = {"y"}, name = "r"}},
      inputs = {{name = "x", dims = {3}}}, outputs = {{name = "y"}}}))
  end, "opset 3000 of ai.onnx is unsupported %(1 to 28 known%)", "an absurd opset is refused")
end

-- ---- Asinh, Acosh, Atanh: float32's precision near 0 too (their series there)
do
  local worst = 0
  for _, op in ipairs{"Asinh", "Atanh", "Acosh"} do
    local m = fl.load_onnx(P.write(path("inv.onnx"), P.model{opset = 13, nodes = {{op = op, inputs = {"x"}, outputs = {"y"}, name = "a"}},
      inputs = {{name = "x", dims = {6}}}, outputs = {{name = "y"}}}))
    local xs = op == "Acosh" and {1.5, 2.0, 10.0, 1.25, 3.0, 100.0} or {1e-6, -3e-3, 0.2, -0.7, 0.009, -0.0099}
    local ys = {m(fl.tensor(xs)):tolist(), fl.compile(m, {backend = "cpu"})(fl.tensor(xs)):tolist()}
    for i, v in ipairs(xs) do
      local want = op == "Asinh" and math.log(math.abs(v) + math.sqrt(v * v + 1)) * (v < 0 and -1 or 1)
        or op == "Atanh" and 0.5 * math.log((1 + v) / (1 - v)) or math.log(v + math.sqrt(v * v - 1))
      for _, y in ipairs(ys) do worst = math.max(worst, math.abs(y[i] - want) / math.abs(want)) end
    end
  end
  t.ok(worst < 1e-6, ("Asinh, Atanh, Acosh within 1e-6 relative, eager and compiled, near 0 too (worst %.1e)"):format(worst))
end

-- ---- NonZero, Compress, Unique (sizes from the data) and GridSample against
-- their definitions computed here in Lua; eager, and compiled (a graph break
-- for the first three)
do
  math.randomseed(5)
  local function load(name, m) return fl.load_onnx(P.write(path(name), P.model(m))) end
  local x = fl.tensor{{0.0, 2.0, 0.0, 1.0}, {3.0, 0.0, 0.0, 3.0}, {0.0, 2.0, 1.0, 0.0}}
  local nz = load("nz.onnx", {opset = 13, nodes = {{op = "NonZero", inputs = {"x"}, outputs = {"y"}, name = "n"}},
    inputs = {{name = "x", dims = {3, 4}}}, outputs = {{name = "y", dtype = "int64"}}})
  local want = {{0, 0, 1, 1, 2, 2}, {1, 3, 0, 3, 1, 2}}
  t.is(nz(x):tolist(), want, "NonZero: row-major coordinates of the nonzero elements")
  local cnz = fl.compile(nz, {backend = "cpu"})
  t.is(cnz(x):tolist(), want, "... compiled (a graph break where the values are read)")
  local x2 = fl.tensor{{1.0, 0.0}, {0.0, 0.0}, {0.0, 5.0}}
  local nz2 = load("nz2.onnx", {opset = 13, nodes = {{op = "NonZero", inputs = {"x"}, outputs = {"y"}, name = "n"}},
    inputs = {{name = "x", dims = {3, 2}}}, outputs = {{name = "y", dtype = "int64"}}})
  t.is(fl.compile(nz2, {backend = "cpu"})(x2):tolist(), {{0, 2}, {0, 1}}, "... on other data, another size")
  local cp = load("cp.onnx", {opset = 13, nodes = {{op = "Compress", inputs = {"x", "c"}, outputs = {"y"}, name = "c", attrs = {axis = 1}}},
    inputs = {{name = "x", dims = {3, 4}}, {name = "c", dims = {4}, dtype = "bool"}}, outputs = {{name = "y"}}})
  local c = fl.tensor({true, false, true, true}, {dtype = "bool"})
  t.is(cp(x, c):tolist(), {{0, 0, 1}, {3, 0, 3}, {0, 1, 0}}, "Compress along axis 1 keeps the columns marked")
  t.is(fl.compile(cp, {backend = "cpu"})(x, c):tolist(), {{0, 0, 1}, {3, 0, 3}, {0, 1, 0}}, "... compiled")
  local un = load("un.onnx", {opset = 13, nodes = {{op = "Unique", inputs = {"x"}, outputs = {"y", "i", "v", "n"}, name = "u", attrs = {sorted = 1}}},
    inputs = {{name = "x", dims = {3, 4}}}, outputs = {{name = "y"}, {name = "i", dtype = "int64"}, {name = "v", dtype = "int64"}, {name = "n", dtype = "int64"}}})
  -- by hand: the flattened values, their sorted distinct values, first
  -- index, inverse and counts
  local flat = {}
  for _, row in ipairs(x:tolist()) do for _, v in ipairs(row) do flat[#flat + 1] = v end end
  local first, distinct = {}, {}
  for i, v in ipairs(flat) do if not first[v] then first[v] = i - 1; distinct[#distinct + 1] = v end end
  table.sort(distinct)
  local pos, counts, inverse, idx = {}, {}, {}, {}
  for u, v in ipairs(distinct) do pos[v] = u - 1; counts[u] = 0; idx[u] = first[v] end
  for i, v in ipairs(flat) do inverse[i] = pos[v]; counts[pos[v] + 1] = counts[pos[v] + 1] + 1 end
  local y, i, v, n = un(x)
  t.is({y:tolist(), i:tolist(), v:tolist(), n:tolist()}, {distinct, idx, inverse, counts},
       "Unique (sorted): values, first indices, inverse indices and counts as computed by hand")
  local cy, ci, cv, cn = fl.compile(un, {backend = "cpu"})(x)
  t.is({cy:tolist(), ci:tolist(), cv:tolist(), cn:tolist()}, {distinct, idx, inverse, counts}, "... compiled")
  -- GridSample bilinear, zeros padding, align_corners 0: each output point
  -- by hand from its four neighbours
  local X = fl.randn(1, 2, 4, 5)
  local G = fl.rand(1, 3, 3, 2) * 2.4 - 1.2
  local gs = load("gs.onnx", {opset = 16, nodes = {{op = "GridSample", inputs = {"x", "g"}, outputs = {"y"}, name = "gs",
    attrs = {mode = "bilinear", padding_mode = "zeros", align_corners = 0}}},
    inputs = {{name = "x", dims = {1, 2, 4, 5}}, {name = "g", dims = {1, 3, 3, 2}}}, outputs = {{name = "y"}}})
  local xs, gv = X:tolist()[1], G:tolist()[1]
  local H, W = 4, 5
  local function px(ch, yy, xx)
    if yy < 0 or yy >= H or xx < 0 or xx >= W then return 0 end
    return xs[ch][yy + 1][xx + 1]
  end
  local ref = {{}, {}}
  for ch = 1, 2 do
    for a = 1, 3 do
      ref[ch][a] = {}
      for b = 1, 3 do
        local gx, gy = gv[a][b][1], gv[a][b][2]
        local fx, fy = ((gx + 1) * W - 1) / 2, ((gy + 1) * H - 1) / 2
        local x0, y0 = math.floor(fx), math.floor(fy)
        local wx, wy = fx - x0, fy - y0
        ref[ch][a][b] = px(ch, y0, x0) * (1 - wx) * (1 - wy) + px(ch, y0, x0 + 1) * wx * (1 - wy)
          + px(ch, y0 + 1, x0) * (1 - wx) * wy + px(ch, y0 + 1, x0 + 1) * wx * wy
      end
    end
  end
  local refT = fl.tensor({ref})
  t.ok(fl.allclose(gs(X, G), refT, 1e-5, 1e-5) and fl.allclose(fl.compile(gs, {backend = "cpu"})(X, G), refT, 1e-5, 1e-5),
       "GridSample bilinear with zero padding against its definition, eager and compiled")
end

-- ---- a dynamic batch through Pad, ConvTranspose and Resize (the exports of
-- a U-Net): one compile serves two batch sizes, against references built here
do
  local function load(name, m) return fl.load_onnx(P.write(path(name), P.model(m))) end
  local function twice(m, mk, ref, what, tol)
    local cm = fl.compile(m, {backend = "cpu"})
    local ok = true
    for _, n in ipairs({2, 3}) do
      local x = mk(n)
      ok = ok and fl.allclose(cm(x), ref(x), tol or 1e-5, tol or 1e-6)
    end
    local s = cm:stats()
    t.ok(ok and s.compiles == 1 and s.recompiles == 0 and s.graph_breaks == 0,
         what .. ": one compile for batches 2 and 3, equal to the reference"
         .. string.format(" (compiles %d, recompiles %d, breaks %d)", s.compiles, s.recompiles, s.graph_breaks))
  end
  -- Pad of the last dim: the batch keeps its symbol through the padding
  local pad = load("pad_dyn.onnx", {opset = 13, nodes = {{op = "Pad", inputs = {"x", "pads"}, outputs = {"y"}, name = "p"}},
    inits = {{name = "pads", dtype = "int64", dims = {6}, ints = {0, 0, 1, 0, 0, 2}}},
    inputs = {{name = "x", dims = {"N", 3, 4}}}, outputs = {{name = "y"}}})
  twice(pad, function(n) return fl.randn(n, 3, 4) end, function(x)
    local n = x.shape[1]
    return fl.cat({fl.zeros(n, 3, 1), x, fl.zeros(n, 3, 2)}, 3)
  end, "Pad with a dynamic batch")
  -- ConvTranspose, kernel 2 stride 2: each input pixel scattered into its
  -- own 2x2 block, y[n,o,2i+a,2j+b] = sum_c x[n,c,i,j] w[c,o,a,b] + b[o]
  local W, B = fl.randn(3, 2, 2, 2), fl.randn(2)
  local ct = load("convt_dyn.onnx", {opset = 17, nodes = {{op = "ConvTranspose", inputs = {"x", "w", "b"}, outputs = {"y"},
    name = "up", attrs = {kernel_shape = {2, 2}, strides = {2, 2}}}},
    inits = {{name = "w", dims = {3, 2, 2, 2}, floats = W:reshape({-1}):tolist()},
             {name = "b", dims = {2}, floats = B:tolist()}},
    inputs = {{name = "x", dims = {"N", 3, 4, 5}}}, outputs = {{name = "y"}}})
  twice(ct, function(n) return fl.randn(n, 3, 4, 5) end, function(x)
    local n = x.shape[1]
    local y = fl.matmul(x:permute({1, 3, 4, 2}):reshape({n * 20, 3}), W:reshape({3, 8}))   -- [n*4*5, o*a*b]
    y = y:reshape({n, 4, 5, 2, 2, 2}):permute({1, 4, 2, 5, 3, 6}):reshape({n, 2, 8, 10})
    return y + B:reshape({1, 2, 1, 1})
  end, "ConvTranspose stride 2 with a dynamic batch", 1e-4)
  -- Resize, nearest, scales [1, 1, 2, 2] from a Constant node: the batch
  -- (scale 1) is no resize, and the scales are read, not a graph break
  local rz = load("resize_dyn.onnx", {opset = 17, nodes = {
    {op = "Constant", inputs = {}, outputs = {"scales"}, name = "c",
     attrs = {value = {tensor = {dims = {4}, floats = {1, 1, 2, 2}}}}},
    {op = "Resize", inputs = {"x", "", "scales"}, outputs = {"y"}, name = "rz",
     attrs = {mode = "nearest", coordinate_transformation_mode = "asymmetric", nearest_mode = "floor"}}},
    inputs = {{name = "x", dims = {"N", 2, 3, 4}}}, outputs = {{name = "y"}}})
  twice(rz, function(n) return fl.randn(n, 2, 3, 4) end, function(x)
    local n = x.shape[1]
    return x:reshape({n, 2, 3, 1, 4, 1}):expand({n, 2, 3, 2, 4, 2}):reshape({n, 2, 6, 8})
  end, "Resize nearest x2 with a dynamic batch, scales from a Constant")
  -- the classic exporter's shape fix-up before an Expand (transformers'
  -- masks): Where(Equal(s, -1), ones, s) over s = Reshape(Shape(x), [-1]),
  -- the ones from ConstantOfShape: all sizes, so the batch stays dynamic
  local Y = fl.randn(1, 4)
  local ex = load("expand_dyn.onnx", {opset = 17, nodes = {
    {op = "Shape", inputs = {"x"}, outputs = {"s0"}, name = "shape"},
    {op = "Reshape", inputs = {"s0", "flat"}, outputs = {"s"}, name = "flatten"},
    {op = "Shape", inputs = {"s"}, outputs = {"n"}, name = "len"},
    {op = "ConstantOfShape", inputs = {"n"}, outputs = {"ones"}, name = "ones",
     attrs = {value = {tensor = {dtype = "int64", dims = {1}, ints = {1}}}}},
    {op = "Mul", inputs = {"ones", "minus1"}, outputs = {"neg"}, name = "neg"},
    {op = "Equal", inputs = {"s", "neg"}, outputs = {"c"}, name = "eq"},
    {op = "Where", inputs = {"c", "ones", "s"}, outputs = {"shp"}, name = "where"},
    {op = "Expand", inputs = {"yb", "shp"}, outputs = {"e"}, name = "expand"},
    {op = "Add", inputs = {"e", "x"}, outputs = {"y"}, name = "add"}},
    inits = {{name = "flat", dtype = "int64", dims = {1}, ints = {-1}},
             {name = "minus1", dtype = "int64", dims = {}, ints = {-1}},
             {name = "yb", dims = {1, 4}, floats = Y:reshape({-1}):tolist()}},
    inputs = {{name = "x", dims = {"N", 4}}}, outputs = {{name = "y"}}})
  twice(ex, function(n) return fl.randn(n, 4) end, function(x) return x + Y end,
        "Expand to Where(Equal(Reshape(Shape), -1), ConstantOfShape, ...) with a dynamic batch")
  -- Gather of index -1 along the dynamic dim: the last row, whatever the batch
  local ga = load("gather_dyn.onnx", {opset = 13, nodes = {{op = "Gather", inputs = {"x", "last"}, outputs = {"y"},
    name = "g", attrs = {axis = 0}}}, inits = {{name = "last", dtype = "int64", dims = {1}, ints = {-1}}},
    inputs = {{name = "x", dims = {"N", 3}}}, outputs = {{name = "y"}}})
  twice(ga, function(n) return fl.randn(n, 3) end, function(x) return x:narrow(1, x.shape[1], 1) end,
        "Gather of index -1 along a dynamic dim")
  -- RNN over [T, N, 3], hidden 2: h_t = tanh(x_t W^T + h_{t-1} R^T + Wb + Rb).
  -- One rnn op: the sequence length and the batch both stay dynamic (T 4
  -- then 5 with N 2 then 3)
  local RW, RR, RB = fl.randn(1, 2, 3), fl.randn(1, 2, 2), fl.randn(1, 4)
  local rnn = load("rnn_dyn.onnx", {opset = 14, nodes = {{op = "RNN", inputs = {"x", "W", "R", "B"}, outputs = {"y"},
    name = "rnn", attrs = {hidden_size = 2}}},
    inits = {{name = "W", dims = {1, 2, 3}, floats = RW:reshape({-1}):tolist()},
             {name = "R", dims = {1, 2, 2}, floats = RR:reshape({-1}):tolist()},
             {name = "B", dims = {1, 4}, floats = RB:reshape({-1}):tolist()}},
    inputs = {{name = "x", dims = {"T", "N", 3}}}, outputs = {{name = "y"}}})
  twice(rnn, function(n) return fl.randn(n + 2, n, 3) end, function(x)
    local n, h, ys = x.shape[2], nil, {}
    local W, R = RW:reshape({2, 3}), RR:reshape({2, 2})
    local b = RB:narrow(2, 1, 2) + RB:narrow(2, 3, 2)
    h = fl.zeros(n, 2)
    for k = 1, x.shape[1] do
      h = (fl.matmul(x:narrow(1, k, 1):reshape({n, 3}), W:transpose(1, 2)) + fl.matmul(h, R:transpose(1, 2)) + b):tanh()
      ys[k] = h:reshape({1, 1, n, 2})
    end
    return fl.cat(ys, 1)
  end, "RNN with a dynamic sequence length and batch (one rnn op)", 1e-4)
end

t.done()
