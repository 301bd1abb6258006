-- onnx_seq.lua -- ONNX sequences and optionals in fl.load_onnx: the
-- sequence and optional ops, sequences through If and Loop, graph inputs
-- and outputs of those kinds (an array of tensors, nil), eagerly and
-- compiled, against answers computed here in plain Lua; the errors bad
-- positions, bad values and hostile test data files give.
local t = require "tap"
local P = require "onnx_proto"

local dir = t.tmpdir()
local nfile = 0
local function load(m)
  nfile = nfile + 1
  return fl.load_onnx(P.write(("%s/m%d.onnx"):format(dir, nfile), P.model(m)))
end
local function cpu(m) return fl.compile(m, {backend = "cpu"}) end

fl.manual_seed(7)

-- plain-Lua views of tensors: flat values and shapes
local function flat(x) return x:reshape({-1}):tolist() end
-- |a - b| <= atol + rtol |b| elementwise, shapes equal
local RTOL, ATOL = 1e-5, 1e-6
local function same(a, b)
  if not fl.is_tensor(a) or a.dtype ~= b.dtype or #a.shape ~= #b.shape then return false end
  for d = 1, #a.shape do if a.shape[d] ~= b.shape[d] then return false end end
  local x, y = flat(a), flat(b)
  for i = 1, #y do
    if math.abs(x[i] - y[i]) > ATOL + RTOL * math.abs(y[i]) then return false end
  end
  return true
end
local function same_seq(r, want)
  if type(r) ~= "table" or fl.is_tensor(r) or #r ~= #want then return false end
  for i = 1, #want do if not same(r[i], want[i]) then return false end end
  return true
end

-- A tensor of the given shape from a plain Lua array of values (row-major)
local function from(vals, shape, dtype)
  if #vals == 0 then return fl.zeros(shape, {dtype = dtype or "float32"}) end
  return fl.tensor(vals, {dtype = dtype or "float32"}):reshape(shape)
end

-- The slice [lo, hi] (1-based, inclusive) along dim d of x, by plain Lua
-- index arithmetic over its flat values (no fl op).
local function lua_slice(x, d, lo, hi, squeeze)
  local shape, v = x.shape, flat(x)
  local outer, inner = 1, 1
  for k = 1, d - 1 do outer = outer * shape[k] end
  for k = d + 1, #shape do inner = inner * shape[k] end
  local out = {}
  for o = 0, outer - 1 do
    for i = lo, hi do
      for j = 0, inner - 1 do out[#out + 1] = v[(o * shape[d] + (i - 1)) * inner + j + 1] end
    end
  end
  local s = {}
  for k = 1, #shape do s[k] = shape[k] end
  s[d] = hi - lo + 1
  if squeeze then table.remove(s, d) end
  return from(out, s, x.dtype)
end

local SEQF = {name = "s", kind = "sequence", dtype = "float"}
local function val(name, dtype, dims) return {name = name, dtype = dtype or "float", dims = dims} end
local function seqv(name, dtype) return {name = name, kind = "sequence", dtype = dtype or "float"} end

-- ---- SequenceConstruct, SequenceAt, SequenceLength ---------------------------
do
  local m = load{opset = 13, inputs = {val("a", "float", {"N", 3}), val("b", "float", {"M", 3}), val("p", "int64", {})},
    nodes = {{op = "SequenceConstruct", inputs = {"a", "b", "a"}, outputs = {"s"}, name = "mk"},
             {op = "SequenceAt", inputs = {"s", "p"}, outputs = {"y"}, name = "at"},
             {op = "SequenceLength", inputs = {"s"}, outputs = {"n"}, name = "len"}},
    outputs = {val("y"), val("n", "int64", {})}}
  local cm = cpu(m)
  for _, sh in ipairs({{2, 5}, {1, 4}, {3, 1}}) do
    local a, b = fl.randn(sh[1], 3), fl.randn(sh[2], 3)
    local list = {a, b, a}
    for _, p in ipairs({0, 1, 2, -1, -2, -3}) do
      local want = list[p >= 0 and p + 1 or p + 4]
      local pt = fl.full({}, p, {dtype = "int64"})
      local y, n = m(a, b, pt)
      local cy, cn = cm(a, b, pt)
      t.ok(same(y, want) and n:item() == 3, ("SequenceAt %d of [%d,%d,%d] rows (eager)"):format(p, sh[1], sh[2], sh[1]))
      t.ok(same(cy, want) and cn:item() == 3, ("SequenceAt %d compiled"):format(p))
    end
  end
  for _, p in ipairs({3, -4}) do
    t.raises(function() m(fl.randn(2, 3), fl.randn(2, 3), fl.full({}, p, {dtype = "int64"})) end,
      "node 'at' %(SequenceAt, opset 13%): position " .. tostring(p):gsub("%-", "%%-") .. " out of range for a sequence of 3 tensors %(%[%-3, 2%]%)",
      "SequenceAt position " .. p .. " out of range: an error naming the node")
  end
  t.raises(function() cm(fl.randn(2, 3), fl.randn(2, 3), fl.full({}, 5, {dtype = "int64"})) end,
    "node 'at' %(SequenceAt, opset 13%): position 5 out of range", "compiled: the same error")
end

-- ---- a sequence graph input and output: SequenceInsert, SequenceErase --------
do
  -- s -> insert x at p -> erase at q: both positions inputs
  local m = load{opset = 13, inputs = {seqv("s"), val("x", "float", {"N"}), val("p", "int64", {}), val("q", "int64", {})},
    nodes = {{op = "SequenceInsert", inputs = {"s", "x", "p"}, outputs = {"s1"}, name = "ins"},
             {op = "SequenceErase", inputs = {"s1", "q"}, outputs = {"s2"}, name = "del"},
             {op = "SequenceInsert", inputs = {"s2", "x"}, outputs = {"s3"}, name = "push"},
             {op = "SequenceErase", inputs = {"s3"}, outputs = {"s4"}, name = "pop"}},
    outputs = {seqv("s1"), seqv("s2"), seqv("s4")}}
  local cm = cpu(m)
  for _, n in ipairs({0, 1, 3}) do
    local s = {}
    for i = 1, n do s[i] = fl.randn(i + 1) end
    local x = fl.randn(4)
    for p = -n, n do
      for _, q in ipairs({0, -1, n}) do
        -- the expected lists: plain table moves on the same tensors
        local w1 = {}
        local at = (p < 0 and p + n or p) + 1
        for i = 1, n do w1[#w1 + 1] = s[i] end
        table.insert(w1, at, x)
        local qq = (q < 0 and q + n + 1 or q) + 1
        local w2 = {}
        for i = 1, #w1 do if i ~= qq then w2[#w2 + 1] = w1[i] end end
        local pt, qt = fl.full({}, p, {dtype = "int64"}), fl.full({}, q, {dtype = "int64"})
        local r1, r2, r4 = m(s, x, pt, qt)
        local c1, c2, c4 = cm(s, x, pt, qt)
        local tag = ("insert at %d, erase at %d, of %d tensors"):format(p, q, n)
        t.ok(same_seq(r1, w1) and same_seq(r2, w2) and same_seq(r4, w2), tag .. " (eager)")
        t.ok(same_seq(c1, w1) and same_seq(c2, w2) and same_seq(c4, w2), tag .. " (compiled)")
      end
    end
  end
  local s = {fl.randn(2), fl.randn(3)}
  local x, z = fl.randn(4), fl.full({}, 0, {dtype = "int64"})
  t.raises(function() m(s, x, fl.full({}, 3, {dtype = "int64"}), z) end,
    "node 'ins' %(SequenceInsert, opset 13%): position 3 out of range for a sequence of 2 tensors %(%[%-2, 2%]%)",
    "SequenceInsert past the end: an error naming the node")
  t.raises(function() m(s, x, z, fl.full({}, 3, {dtype = "int64"})) end,
    "node 'del' %(SequenceErase, opset 13%): position 3 out of range for a sequence of 3 tensors %(%[%-3, 2%]%)",
    "SequenceErase past the end: an error naming the node")
  t.raises(function() m(s, x, z, fl.full({}, -4, {dtype = "int64"})) end,
    "node 'del' %(SequenceErase, opset 13%): position %-4 out of range", "SequenceErase before the front")
  -- the graph input's kind and dtype are checked
  t.raises(function() m(fl.randn(2), x, z, z) end,
    "input 1 %('s'%) must be a table %(array%) of tensors, got a tensor", "a tensor for a sequence input")
  t.raises(function() m({fl.randn(2), fl.randn(2):to("float64")}, x, z, z) end,
    "input 1 %('s'%) element 2 must be float32, got float64", "a sequence element of the wrong dtype")
  t.raises(function() m({fl.randn(2), nil, fl.randn(2)}, x, z, z) end,
    "input 1 %('s'%) .*must be", "a sequence with a hole: refused")
  -- one table given twice, its tensor replaced between the calls: each
  -- compiled call reads the tensors it is given
  local function ft(l) return fl.tensor(l):to("float32") end
  local tab = {ft({1, 2}), ft({3, 4, 5})}
  local c1 = cm(tab, x, z, fl.full({}, 1, {dtype = "int64"}))
  tab[2] = ft({9, 8, 7})
  local c2 = cm(tab, x, z, fl.full({}, 1, {dtype = "int64"}))
  t.ok(same(c1[3], ft({3, 4, 5})) and same(c2[3], ft({9, 8, 7})),
       "compiled: a sequence table changed between calls gives the new tensors")
end

-- a sequence input read by a tensor result only, at a constant position:
-- one graph but for the break at the input
do
  local m = load{opset = 13, inputs = {seqv("s"), val("q", "int64", {})},
    inits = {{name = "p", dtype = "int64", dims = {}, ints = {0}}},
    nodes = {{op = "SequenceAt", inputs = {"s", "p"}, outputs = {"e"}, name = "at"},
             {op = "Mul", inputs = {"e", "e"}, outputs = {"y"}, name = "sq"}},
    outputs = {val("y")}}
  local cm = cpu(m)
  local z = fl.full({}, 0, {dtype = "int64"})
  local function ft(l) return fl.tensor(l):to("float32") end
  local tab = {ft({1, 2, 3})}
  local a = cm(tab, z)
  tab[1] = ft({4, 5, 6})
  local b = cm(tab, z)
  local c = cm({ft({-1, 0.5, 2})}, z)
  t.ok(same(a, ft({1, 4, 9})) and same(b, ft({16, 25, 36})) and same(c, ft({1, 0.25, 4})),
       "compiled: a tensor result of a sequence input follows the table's contents")
  t.ok(cm:stats().graph_breaks >= 1, "compiled: a graph break at the sequence input")
  t.raises(function() fl.capture(m, {ft({1, 2})}, z) end,
    "^onnx.Model: sequence and optional inputs under fl.capture are unsupported", "fl.capture refuses a sequence input")
end

-- ---- SplitToSequence and ConcatFromSequence -----------------------------------
do
  local cases = {
    -- {shape, axis, split (nil | scalar | list), keepdims}
    {{5, 3}, 0, nil, 1}, {{5, 3}, 1, nil, 0}, {{4, 6}, 1, 4, 1}, {{7, 2}, 0, 3, 0},
    {{2, 3, 5}, 2, {1, 0, 4}, 0}, {{6}, -1, {6}, 1}, {{3, 4}, -2, 2, 1},
  }
  for _, c in ipairs(cases) do
    local shape, ax, split, keep = c[1], c[2], c[3], c[4]
    local inputs, names = {val("x", "float", shape)}, {"x"}
    local inits
    if split then
      names[2] = "split"
      inits = {{name = "split", dtype = "int64", dims = type(split) == "table" and {#split} or {},
                ints = type(split) == "table" and split or {split}}}
    end
    local m = load{opset = 13, inputs = inputs, inits = inits,
      nodes = {{op = "SplitToSequence", inputs = names, outputs = {"s"}, name = "split",
                attrs = {axis = ax, keepdims = keep}},
               -- squeezed chunks stack back (new_axis=1), kept ones concatenate
               {op = "ConcatFromSequence", inputs = {"s"}, outputs = {"y"}, name = "cat",
                attrs = {axis = ax, new_axis = (split == nil and keep == 0) and 1 or 0}}},
      outputs = {seqv("s"), val("y")}}
    local cm = cpu(m)
    local x = fl.randn(table.unpack(shape))
    local d = (ax < 0 and ax + #shape or ax) + 1
    local n = shape[d]
    local sizes = {}
    if type(split) == "table" then sizes = split
    else
      local k = split or 1
      local at = 0
      while at < n do sizes[#sizes + 1] = math.min(k, n - at); at = at + k end
    end
    local want, lo = {}, 1
    for i, k in ipairs(sizes) do
      want[i] = lua_slice(x, d, lo, lo + k - 1, split == nil and keep == 0)
      lo = lo + k
    end
    local tag = ("SplitToSequence of [%s] axis %d split %s keepdims %d"):format(table.concat(shape, ","), ax,
      type(split) == "table" and ("{" .. table.concat(split, ",") .. "}") or tostring(split), keep)
    local s, y = m(x)
    local cs, cy = cm(x)
    t.ok(same_seq(s, want), tag .. " (eager)")
    t.ok(same_seq(cs, want), tag .. " (compiled)")
    t.ok(same(y, x) and same(cy, x), tag .. ": ConcatFromSequence joins it back, eager and compiled")
  end
  -- stacking: new_axis=1 at every axis, against plain Lua indexing
  for _, ax in ipairs({0, 1, 2, -1, -3}) do
    local m = load{opset = 13, inputs = {val("a", "float", {2, 3}), val("b", "float", {2, 3})},
      nodes = {{op = "SequenceConstruct", inputs = {"a", "b", "a"}, outputs = {"s"}, name = "mk"},
               {op = "ConcatFromSequence", inputs = {"s"}, outputs = {"y"}, name = "stack",
                attrs = {axis = ax, new_axis = 1}}},
      outputs = {val("y")}}
    local a, b = fl.randn(2, 3), fl.randn(2, 3)
    local d = (ax < 0 and ax + 3 or ax) + 1
    local src = {flat(a), flat(b), flat(a)}
    local shape = {2, 3}
    table.insert(shape, d, 3)
    local out = {}
    for i = 1, shape[1] do
      for j = 1, shape[2] do
        for k = 1, shape[3] do
          local idx = {i, j, k}
          local which = idx[d]
          table.remove(idx, d)
          out[#out + 1] = src[which][(idx[1] - 1) * 3 + idx[2]]
        end
      end
    end
    local want = from(out, shape)
    t.ok(same(m(a, b), want) and same(cpu(m)(a, b), want),
         ("ConcatFromSequence new_axis=1 axis %d: a stack, eager and compiled"):format(ax))
  end
  local bad = load{opset = 13, inputs = {val("a", "float", {2, 3}), val("b", "float", {2, 4})},
    nodes = {{op = "SequenceConstruct", inputs = {"a", "b"}, outputs = {"s"}, name = "mk"},
             {op = "ConcatFromSequence", inputs = {"s"}, outputs = {"y"}, name = "cat", attrs = {axis = 0}}},
    outputs = {val("y")}}
  t.raises(function() bad(fl.randn(2, 3), fl.randn(2, 4)) end,
    "node 'cat' %(ConcatFromSequence, opset 13%): elements of shapes that do not concatenate along axis 0",
    "ConcatFromSequence of mismatched shapes")
  -- (input-free: folded, so it fails at load)
  t.raises(function()
    load{opset = 13, inputs = {val("a", "float", {2})},
      nodes = {{op = "SequenceEmpty", outputs = {"s"}, name = "e"},
               {op = "ConcatFromSequence", inputs = {"s"}, outputs = {"y"}, name = "cat", attrs = {axis = 0}},
               {op = "Add", inputs = {"y", "a"}, outputs = {"z"}, name = "add"}},
      outputs = {val("z")}}
  end, "node 'cat' %(ConcatFromSequence, opset 13%): concatenating an empty sequence",
    "ConcatFromSequence of an empty sequence")
  local empty = load{opset = 13, inputs = {seqv("s")},
    nodes = {{op = "ConcatFromSequence", inputs = {"s"}, outputs = {"y"}, name = "cat", attrs = {axis = 0}}},
    outputs = {val("y")}}
  t.raises(function() empty({}) end, "node 'cat' %(ConcatFromSequence, opset 13%): concatenating an empty sequence",
    "ConcatFromSequence of an empty sequence input")
  t.raises(function()
    load{opset = 13, inputs = {seqv("s")},
      nodes = {{op = "ConcatFromSequence", inputs = {"s"}, outputs = {"y"}, name = "cat"}}, outputs = {val("y")}}
  end, "node 'cat' %(ConcatFromSequence, opset 13%): attribute 'axis' is required", "ConcatFromSequence without axis")
  t.raises(function()
    load{opset = 13, inputs = {val("x", "float", {2})},
      nodes = {{op = "SplitToSequence", inputs = {"x"}, outputs = {"s"}, name = "sp", attrs = {keepdims = 2}}},
      outputs = {seqv("s")}}
  end, "node 'sp' %(SplitToSequence, opset 13%): keepdims 2 %(0 or 1%)", "SplitToSequence keepdims 2")
  local sp = load{opset = 13, inputs = {val("x", "float", {5}), val("k", "int64", {2})},
    nodes = {{op = "SplitToSequence", inputs = {"x", "k"}, outputs = {"s"}, name = "sp"}}, outputs = {seqv("s")}}
  t.raises(function() sp(fl.randn(5), fl.tensor({2, 2}, {dtype = "int64"})) end,
    "node 'sp' %(SplitToSequence, opset 13%): split sizes sum to 4, the dim is 5", "SplitToSequence sizes not summing")
end

-- ---- SequenceMap ----------------------------------------------------------------
do
  -- body (x, w) -> (x + w, Shape(x)): a sequence and a tensor broadcast to
  -- every step; a second sequence input steps along with the first
  local body = {name = "body", inputs = {val("x", "float"), val("w", "float")},
    nodes = {{op = "Add", inputs = {"x", "w"}, outputs = {"y"}, name = "add"},
             {op = "Shape", inputs = {"x"}, outputs = {"sh"}, name = "shape"}},
    outputs = {val("y"), val("sh", "int64")}}
  local m1 = load{opset = 17, inputs = {seqv("s"), val("w", "float", {3})},
    nodes = {{op = "SequenceMap", inputs = {"s", "w"}, outputs = {"ys", "shapes"}, name = "map", attrs = {body = {graph = body}}}},
    outputs = {seqv("ys"), seqv("shapes", "int64")}}
  local m2 = load{opset = 17, inputs = {seqv("s"), seqv("w")},
    nodes = {{op = "SequenceMap", inputs = {"s", "w"}, outputs = {"ys", "shapes"}, name = "map", attrs = {body = {graph = body}}}},
    outputs = {seqv("ys"), seqv("shapes", "int64")}}
  local c1, c2 = cpu(m1), cpu(m2)
  for _, n in ipairs({1, 2, 4}) do
    local s, ws, w = {}, {}, fl.randn(3)
    for i = 1, n do s[i] = fl.randn(i, 3); ws[i] = fl.randn(3) end
    local want1, want2, shapes = {}, {}, {}
    for i = 1, n do
      -- x + w by plain Lua over the rows
      local xv, wv, wiv = flat(s[i]), flat(w), flat(ws[i])
      local a, b = {}, {}
      for k = 1, #xv do a[k] = xv[k] + wv[(k - 1) % 3 + 1]; b[k] = xv[k] + wiv[(k - 1) % 3 + 1] end
      want1[i], want2[i] = from(a, {i, 3}), from(b, {i, 3})
      shapes[i] = fl.tensor({i, 3}, {dtype = "int64"})
    end
    for _, r in ipairs({{m1, "eager"}, {c1, "compiled"}}) do
      local ys, sh = r[1](s, w)
      t.ok(same_seq(ys, want1) and same_seq(sh, shapes),
           ("SequenceMap over %d tensors with a tensor input (%s)"):format(n, r[2]))
    end
    for _, r in ipairs({{m2, "eager"}, {c2, "compiled"}}) do
      local ys, sh = r[1](s, ws)
      t.ok(same_seq(ys, want2) and same_seq(sh, shapes),
           ("SequenceMap over two sequences of %d (%s)"):format(n, r[2]))
    end
  end
  t.raises(function() m2({fl.randn(1, 3), fl.randn(1, 3)}, {fl.randn(3)}) end,
    "node 'map' %(SequenceMap, opset 17%): input 2 is a sequence of 1 tensors, the first of 2",
    "SequenceMap over sequences of different lengths")
  local ys, sh = m1({}, fl.randn(3))
  t.ok(#ys == 0 and #sh == 0, "SequenceMap over an empty sequence: empty sequences")
end

-- ---- Optional, OptionalHasElement, OptionalGetElement ---------------------------
do
  local optf = {name = "o", kind = "optional", dtype = "float"}
  local opts = {name = "o", kind = "optional", inner = "sequence", dtype = "float"}
  local m = load{opset = 18, inputs = {optf},
    nodes = {{op = "OptionalHasElement", inputs = {"o"}, outputs = {"h"}, name = "has"},
             {op = "Identity", inputs = {"o"}, outputs = {"o2"}, name = "id"}},
    outputs = {val("h", "bool", {}), {name = "o2", kind = "optional", dtype = "float"}}}
  local cm = cpu(m)
  local x = fl.randn(2, 3)
  for _, r in ipairs({{m, "eager"}, {cm, "compiled"}}) do
    local h, o = r[1](x)
    t.ok(h:item() == true and same(o, x), "OptionalHasElement of a tensor given: true, Identity passes it (" .. r[2] .. ")")
    local h2, o2 = r[1](nil)
    t.ok(h2:item() == false and o2 == nil, "OptionalHasElement of nil: false, Identity gives nil (" .. r[2] .. ")")
    local h3, o3 = r[1]()
    t.ok(h3:item() == false and o3 == nil, "an optional input left out is empty (" .. r[2] .. ")")
  end
  t.raises(function() m({x}) end, "input 1 %('o'%) must be a tensor, got table", "an array for an optional tensor input: refused")
  local g = load{opset = 18, inputs = {opts},
    nodes = {{op = "OptionalGetElement", inputs = {"o"}, outputs = {"s"}, name = "get"},
             {op = "SequenceLength", inputs = {"s"}, outputs = {"n"}, name = "len"}},
    outputs = {seqv("s"), val("n", "int64", {})}}
  local cg = cpu(g)
  for _, r in ipairs({{g, "eager"}, {cg, "compiled"}}) do
    local s, n = r[1]({x, x * 2})
    t.ok(same_seq(s, {x, x * 2}) and n:item() == 2, "OptionalGetElement of an optional sequence (" .. r[2] .. ")")
  end
  t.raises(function() g(nil) end, "node 'get' %(OptionalGetElement, opset 18%): the optional is empty",
    "OptionalGetElement of an empty optional: an error naming the node")
  t.raises(function() g(x) end, "input 1 %('o'%) must be nil or a table %(array%) of tensors, got a tensor",
    "a tensor for an optional sequence input: refused")
  -- Optional wraps; empty with a type; HasElement of a tensor (opset 18)
  -- and of a missing input
  local w = load{opset = 18, inputs = {val("x", "float", {"N"})},
    nodes = {{op = "Optional", inputs = {"x"}, outputs = {"o"}, name = "wrap"},
             {op = "OptionalGetElement", inputs = {"o"}, outputs = {"y"}, name = "get"},
             {op = "Optional", outputs = {"e"}, name = "none", attrs = {type = {type = {dtype = "float"}}}},
             {op = "OptionalHasElement", inputs = {"e"}, outputs = {"he"}, name = "has_e"},
             {op = "OptionalHasElement", inputs = {"x"}, outputs = {"hx"}, name = "has_x"},
             {op = "OptionalHasElement", inputs = {""}, outputs = {"hn"}, name = "has_n"},
             {op = "OptionalGetElement", inputs = {"x"}, outputs = {"gx"}, name = "get_x"}},
    outputs = {val("y"), {name = "e", kind = "optional", dtype = "float"}, val("he", "bool", {}),
               val("hx", "bool", {}), val("hn", "bool", {}), val("gx")}}
  local cw = cpu(w)
  for _, r in ipairs({{w, "eager"}, {cw, "compiled"}}) do
    for _, n in ipairs({1, 4}) do
      local v = fl.randn(n)
      local y, e, he, hx, hn, gx = r[1](v)
      t.ok(same(y, v) and e == nil and he:item() == false and hx:item() == true and hn:item() == false
           and same(gx, v), ("Optional, OptionalHasElement, OptionalGetElement on a [%d] tensor (%s)"):format(n, r[2]))
    end
  end
end

-- ---- sequences through If and Loop -----------------------------------------------
do
  -- Loop: the sequence state grows by x[0:i+1] each step; a scan output
  -- of each step's length
  local body = {name = "body", inputs = {val("i", "int64", {}), val("c", "bool", {}), seqv("s_in")},
    nodes = {{op = "Identity", inputs = {"c"}, outputs = {"c_out"}, name = "cond"},
             {op = "Add", inputs = {"i", "one"}, outputs = {"end"}, name = "end"},
             {op = "Unsqueeze", inputs = {"end", "zero"}, outputs = {"end1"}, name = "unsq"},
             {op = "Slice", inputs = {"x", "zero", "end1"}, outputs = {"part"}, name = "slice"},
             {op = "SequenceInsert", inputs = {"s_in", "part"}, outputs = {"s_out"}, name = "push"},
             {op = "SequenceLength", inputs = {"s_out"}, outputs = {"len"}, name = "len"}},
    inits = {{name = "one", dtype = "int64", dims = {}, ints = {1}}, {name = "zero", dtype = "int64", dims = {1}, ints = {0}}},
    outputs = {val("c_out", "bool", {}), seqv("s_out"), val("len", "int64", {})}}
  local m = load{opset = 13, inputs = {val("M", "int64", {}), val("x", "float", {5}), seqv("s0")},
    inits = {{name = "T", dtype = "bool", dims = {}, int32s = {1}}},
    nodes = {{op = "Loop", inputs = {"M", "T", "s0"}, outputs = {"s", "lens"}, name = "loop", attrs = {body = {graph = body}}}},
    outputs = {seqv("s"), val("lens", "int64", {"K"})}}
  local cm = cpu(m)
  local x = fl.randn(5)
  local xv = flat(x)
  for _, steps in ipairs({0, 1, 3, 5}) do
    for _, s0 in ipairs({{}, {fl.randn(2)}}) do
      local want, lens = {}, {}
      for i = 1, #s0 do want[i] = s0[i] end
      for i = 1, steps do
        local part = {}
        for k = 1, i do part[k] = xv[k] end
        want[#want + 1] = from(part, {i})
        lens[i] = #want
      end
      local M = fl.full({}, steps, {dtype = "int64"})
      for _, r in ipairs({{m, "eager"}, {cm, "compiled"}}) do
        local ok, s, l = pcall(r[1], M, x, s0)
        if steps == 0 then
          t.ok(not ok and tostring(s):find("scan outputs of a Loop that runs no iteration is unsupported", 1, true),
               "Loop of no step with a scan output: refused (" .. r[2] .. ")")
        else
          t.ok(ok and same_seq(s, want) and same(l, fl.tensor(lens, {dtype = "int64"})),
               ("Loop carrying a sequence of %d, %d steps (%s)"):format(#s0, steps, r[2]))
        end
      end
    end
  end
  -- If: each branch makes a sequence (and an optional) of its own
  local yes = {name = "yes", outputs = {seqv("a"), {name = "oa", kind = "optional", inner = "sequence", dtype = "float"}},
    nodes = {{op = "SequenceConstruct", inputs = {"x", "x"}, outputs = {"a"}, name = "two"},
             {op = "Optional", inputs = {"a"}, outputs = {"oa"}, name = "wrap"}}}
  local no = {name = "no", outputs = {seqv("b"), {name = "ob", kind = "optional", inner = "sequence", dtype = "float"}},
    nodes = {{op = "SplitToSequence", inputs = {"x"}, outputs = {"b"}, name = "split", attrs = {keepdims = 0}},
             {op = "Optional", outputs = {"ob"}, name = "none", attrs = {type = {type = {kind = "sequence", dtype = "float"}}}}}}
  local mi = load{opset = 15, inputs = {val("c", "bool", {}), val("x", "float", {3})},
    nodes = {{op = "If", inputs = {"c"}, outputs = {"s", "o"}, name = "if", attrs = {then_branch = {graph = yes}, else_branch = {graph = no}}}},
    outputs = {seqv("s"), {name = "o", kind = "optional", inner = "sequence", dtype = "float"}}}
  local ci = cpu(mi)
  local xv3 = fl.randn(3)
  local v = flat(xv3)
  for _, r in ipairs({{mi, "eager"}, {ci, "compiled"}}) do
    local s, o = r[1](fl.tensor({true}, {dtype = "bool"}):reshape({}), xv3)
    t.ok(same_seq(s, {xv3, xv3}) and same_seq(o, {xv3, xv3}), "If: the then branch's sequence and optional (" .. r[2] .. ")")
    local s2, o2 = r[1](fl.tensor({false}, {dtype = "bool"}):reshape({}), xv3)
    t.ok(same_seq(s2, {from({v[1]}, {}), from({v[2]}, {}), from({v[3]}, {})}) and o2 == nil,
         "If: the else branch's split and empty optional (" .. r[2] .. ")")
  end
end

-- ---- narrow integer elements keep their type -----------------------------------
do
  local m = load{opset = 13, inputs = {seqv("s", "int32")},
    nodes = {{op = "SequenceAt", inputs = {"s", "p"}, outputs = {"e"}, name = "at"},
             {op = "SequenceInsert", inputs = {"s", "e"}, outputs = {"s2"}, name = "push"},
             {op = "ConcatFromSequence", inputs = {"s2"}, outputs = {"y"}, name = "cat", attrs = {axis = 0}}},
    inits = {{name = "p", dtype = "int32", dims = {}, int32s = {-1}}},
    outputs = {seqv("s2", "int32"), val("y", "int32", {"K"})}}
  local a, b = fl.tensor({1, -2}, {dtype = "int64"}), fl.tensor({2147483647}, {dtype = "int64"})
  local s2, y = m({a, b})
  t.ok(#s2 == 3 and s2[3]:tolist()[1] == 2147483647 and s2[3].dtype == "int64", "int32 elements: SequenceAt with an int32 position")
  t.is(y:tolist(), {1, -2, 2147483647, 2147483647}, "int32 elements concatenated, their values exact")
  t.raises(function() m({a:to("float32")}) end, "must be int64 %(holding int32 values%)", "an int32 sequence takes int64 tensors")
  local mix = load{opset = 13, inputs = {seqv("s"), val("i", "int64", {1})},
    nodes = {{op = "SequenceInsert", inputs = {"s", "i"}, outputs = {"s2"}, name = "push"}}, outputs = {seqv("s2")}}
  t.raises(function() mix({fl.randn(1)}, fl.tensor({1}, {dtype = "int64"})) end,
    "node 'push' %(SequenceInsert, opset 13%): the tensor of dtype int64 for a sequence of float",
    "SequenceInsert of another dtype: an error naming the node")
end

-- ---- a sequence where a tensor is needed, and unsupported types ------------------
do
  local m = load{opset = 13, inputs = {seqv("s")},
    nodes = {{op = "Relu", inputs = {"s"}, outputs = {"y"}, name = "relu"}}, outputs = {val("y")}}
  t.raises(function() m({fl.randn(2)}) end, "node 'relu' %(Relu, opset 13%): input X is a sequence, not a tensor",
    "a sequence given to a tensor op: an error naming the node")
  -- where sizes, axes, a condition or a dtype are read: refused, never
  -- taken for an absent input
  local sl = load{opset = 13, inputs = {val("x", "float", {4}), seqv("s", "int64")},
    inits = {{name = "st", dtype = "int64", dims = {1}, ints = {1}}, {name = "en", dtype = "int64", dims = {1}, ints = {3}}},
    nodes = {{op = "Slice", inputs = {"x", "st", "en", "s"}, outputs = {"y"}, name = "slice"}}, outputs = {val("y")}}
  t.raises(function() sl(fl.randn(4), {fl.tensor({0}, {dtype = "int64"})}) end,
    "node 'slice' %(Slice, opset 13%): axes must be a tensor", "a sequence as Slice's axes: an error")
  local cl = load{opset = 15, inputs = {val("x", "float", {4}), seqv("s", "int64")},
    nodes = {{op = "CastLike", inputs = {"x", "s"}, outputs = {"y"}, name = "cast"}}, outputs = {val("y", "none")}}
  t.raises(function() cl(fl.randn(4), {fl.tensor({0}, {dtype = "int64"})}) end,
    "node 'cast' %(CastLike, opset 15%): casting to sequence is unsupported", "a sequence as CastLike's target: refused")
  local yes = {name = "yes", outputs = {val("a")}, nodes = {{op = "Identity", inputs = {"x"}, outputs = {"a"}}}}
  local ci = load{opset = 13, inputs = {seqv("c", "bool"), val("x", "float", {2})},
    nodes = {{op = "If", inputs = {"c"}, outputs = {"y"}, name = "if", attrs = {then_branch = {graph = yes}, else_branch = {graph = yes}}}},
    outputs = {val("y")}}
  t.raises(function() ci({fl.ones({}, {dtype = "bool"})}, fl.randn(2)) end,
    "node 'if' %(If, opset 13%): the condition must be a tensor", "a sequence as If's condition: an error")
  t.raises(function()
    load{opset = 13, inputs = {{name = "m", kind = "map", dtype = "float"}},
      nodes = {{op = "Identity", inputs = {"m"}, outputs = {"y"}}}, outputs = {val("y")}}
  end, "graph input 'm': maps and sparse tensors are unsupported", "a map input: refused at load")
  local txt = tostring(load{opset = 13, inputs = {seqv("s")},
    nodes = {{op = "Identity", inputs = {"s"}, outputs = {"y"}}}, outputs = {seqv("y")}})
  t.ok(txt:find("s: sequence of float32", 1, true), "print shows a sequence input")
end

-- ---- test data files: sequences and optionals, hostile ones ----------------------
do
  local function write(name, s) return P.write(dir .. "/" .. name, s) end
  local s, dt = fl.load_onnx_value(write("seq.pb", P.sequence{
    {dtype = "float", dims = {2}, floats = {1, 2}}, {dtype = "float", dims = {1, 3}, floats = {3, 4, 5}}}), "sequence")
  t.ok(#s == 2 and dt == "float" and same(s[1], fl.tensor({1, 2}):to("float32"))
       and same(s[2], fl.tensor({{3, 4, 5}}):to("float32")),
       "a SequenceProto file: an array of tensors")
  local e = fl.load_onnx_value(write("seq0.pb", P.sequence{}), "sequence")
  t.ok(type(e) == "table" and #e == 0, "an empty SequenceProto: an empty array")
  local o = fl.load_onnx_value(write("opt0.pb", P.optional{}), "optional")
  t.ok(o == nil, "an empty OptionalProto: nil")
  local ot = fl.load_onnx_value(write("opt1.pb", P.optional{tensor = {dtype = "int32", dims = {2}, int32s = {7, -7}}}), "optional")
  t.ok(fl.is_tensor(ot) and ot.dtype == "int64" and ot:tolist()[2] == -7, "an OptionalProto of an int32 tensor")
  local os_ = fl.load_onnx_value(write("opt2.pb", P.optional{sequence = {{dtype = "float", dims = {1}, floats = {9}}}}), "optional")
  t.ok(type(os_) == "table" and #os_ == 1 and os_[1]:item() == 9, "an OptionalProto of a sequence")
  -- a huge count of (empty) elements: refused before they are unpacked
  local huge = P.vint(2, 1) .. string.rep(P.bytes(3, ""), (1 << 20) + 1)
  t.raises(function() fl.load_onnx_value(write("huge.pb", huge), "sequence") end,
    "1048577 sequence or optional elements: more than 1048576 are unsupported", "a sequence of 2^20+1 elements: refused")
  t.raises(function() fl.load_onnx_value(write("hugeo.pb", P.vint(2, 3) .. P.bytes(5, huge)), "optional") end,
    "1048578 sequence or optional elements: more than 1048576 are unsupported", "an optional of such a sequence: refused")
  -- the same count split over two copies of the optional's sequence
  -- (protobuf merges them into one)
  local half = P.vint(2, 1) .. string.rep(P.bytes(3, ""), (1 << 19) + 1)
  t.raises(function() fl.load_onnx_value(write("halves.pb", P.vint(2, 3) .. P.bytes(5, half) .. P.bytes(5, half)), "optional") end,
    "1048580 sequence or optional elements: more than 1048576 are unsupported", "a huge sequence split over two fields: refused")
  -- nesting: a sequence of sequences is refused; nested past 8 levels it
  -- is refused before unpacking (the unpacker recurses per level)
  local nested = P.sequence{{dtype = "float", dims = {1}, floats = {1}}}
  t.raises(function() fl.load_onnx_value(write("nest1.pb", P.vint(2, 3) .. P.bytes(5, nested)), "sequence") end,
    "sequence: elements other than tensors are unsupported", "a sequence of sequences: refused")
  local deep = nested
  for _ = 1, 9 do deep = P.bytes(5, deep) end
  t.raises(function() fl.load_onnx_value(write("deep.pb", deep), "sequence") end,
    "sequences and optionals nested more than 8 deep are unsupported", "sequences nested 9 deep: refused")
  -- an element whose dims promise more data than it holds
  t.raises(function()
    fl.load_onnx_value(write("short.pb", P.vint(2, 1) .. P.bytes(3, P.tensor{dtype = "float", dims = {1000000000}, floats = {1}})), "sequence")
  end, "sequence element 0: tensor '': float data holds 1 values, its dims say 1000000000",
    "an element with too little data: refused, naming the element")
  t.raises(function()
    fl.load_onnx_value(write("mixed.pb", P.sequence{{dtype = "float", dims = {1}, floats = {1}},
                                                    {dtype = "int64", dims = {1}, ints = {1}}}), "sequence")
  end, "sequence: elements of dtypes float and int64", "a sequence of mixed dtypes: refused")
  local f = io.open(dir .. "/seq.pb", "rb"); local full = f:read("a"); f:close()
  t.raises(function() fl.load_onnx_value(write("trunc.pb", full:sub(1, #full - 3)), "sequence") end,
    "not a valid SequenceProto %(truncated or malformed protobuf%)", "a truncated SequenceProto: refused")
  t.raises(function() fl.load_onnx_value(dir .. "/seq.pb", "map") end, "kind must be", "a kind other than the three")
end

t.done()
