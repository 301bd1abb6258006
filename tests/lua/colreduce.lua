-- colreduce.lua -- reductions over dims outer to their rows (a bias's
-- gradient: [B, N] summed over B) run the column loop of the C code
-- generator (cpu/codegen.c): rows innermost, FL_COLB at a time.  Each case
-- is compiled with fixed sizes (the strides known: only the column loop is
-- written) and run against the reference interpreter, over sizes around
-- the tile (1, 15, 16, 17, 63, 64, 65, 300 rows), several reduced dims,
-- every reduction kind the loop takes, fused producers and stores, NaN,
-- int64, and a transposed view.  Tolerances: float sums accumulate in
-- double as the reference does (rtol 1e-6, atol 1e-6); max, min and int64
-- are exact.  Where the row loop runs (its sums float partials of up to
-- 4096 elements) and where float32 elementwise arithmetic cancels (a
-- softmax's gradient, b - exp(a) r near 0), 1e-5.
local t = require "tap"

fl.manual_seed(11)

-- equal within tol (relative and absolute), NaN where the other is NaN
local function same(a, b, tol)
  if t.show(a.shape) ~= t.show(b.shape) then return false end
  local x, y = a:to("float32"):reshape(-1):tolist(), b:to("float32"):reshape(-1):tolist()
  for i = 1, #x do
    if x[i] ~= x[i] or y[i] ~= y[i] then
      if (x[i] ~= x[i]) ~= (y[i] ~= y[i]) then return false end
    elseif math.abs(x[i] - y[i]) > tol + tol * math.abs(y[i]) then
      return false
    end
  end
  return true
end

local function check(name, fn, inputs, opts)
  opts = opts or {}
  local g = fl.capture(fn, table.unpack(inputs))
  local k = g:fuse():codegen("cpu")
  local src = tostring(k)
  local uses = src:find("a column reduction", 1, true) ~= nil
  if opts.cols ~= nil then
    t.is(uses, opts.cols, name .. (opts.cols and ": runs the column loop" or ": runs row by row"))
  end
  local got = table.pack(k:run(table.unpack(inputs)))
  local want = table.pack(g:run_reference(table.unpack(inputs)))
  local ok = got.n == want.n
  for i = 1, want.n do
    local tol = opts.exact and 0 or opts.tol or 1e-6
    ok = ok and same(got[i], want[i], tol)
  end
  t.ok(ok, name .. ": compiled equals the reference")
  if not ok then
    for i = 1, want.n do t.diag(("output %d: max |diff| %.3g"):format(i, (got[i]:to("float32") - want[i]:to("float32")):abs():amax():item())) end
  end
end

-- a training step's column reductions: a ReLU's gradient (a select on a
-- comparison) stored with its bias's sum, in one pass; a softmax's
-- gradient, its row sums broadcast along the rows, with the sum of its
-- columns (a row-broadcast operand no longer sends it row by row)
do
  local function one_pass(name, fn, inputs)
    local g = fl.capture(fn, table.unpack(inputs))
    local src = tostring(g:fuse():codegen("cpu"))
    t.ok(src:find("a column reduction", 1, true) and not src:find("pass 2: the stores", 1, true),
         name .. ": the column loop stores in the pass that sums")
    check(name, fn, inputs, {tol = 1e-5})
  end
  for _, B in ipairs{7, 64, 65} do
    local x, gy = fl.randn(B, 70), fl.randn(B, 70)
    one_pass(("ReLU's gradient and its bias's sum, [%d, 70]"):format(B),
             function(a, b) local d = fl.where(a:le(0), 0, b); return d, d:sum(1) end, {x, gy})
    local y, s = fl.randn(B, 70), fl.randn(B, 1)
    one_pass(("a softmax's gradient with its column sums, [%d, 70]"):format(B),
             function(a, r, b) local d = b - a:exp() * r; return d, d:sum(1) end, {y, s, gy})
  end
end

-- a column sum of [B, N] for B, N around the tile
for _, N in ipairs{15, 16, 17, 64, 65, 300} do
  for _, B in ipairs{1, 7, 33} do
    check(("sum over dim 1 of [%d, %d]"):format(B, N), function(x) return x:sum(1) end,
          {fl.randn(B, N)}, {cols = N >= 16 and B > 1})
  end
end

-- every reduction kind, kept and not
do
  local x = fl.randn(40, 70)
  check("mean over dim 1, keepdim", function(a) return a:mean(1, true) end, {x}, {cols = true})
  check("amax over dim 1", function(a) return a:amax(1) end, {x}, {cols = true, exact = true})
  check("amin over dim 1", function(a) return a:amin(1) end, {x}, {cols = true, exact = true})
  check("var over dim 1 (two passes)", function(a) return a:var(1) end, {x}, {cols = true})
  -- (softmax keeps exp(x - max) in a row scratch between its passes: row by row)
  check("softmax over dim 1", function(a) return a:softmax(1) end, {x})
  check("log_softmax over dim 1", function(a) return a:log_softmax(1) end, {x})
end

-- NaN: a column's max is NaN where one of its elements is
do
  local v = fl.randn(20, 32):tolist()
  v[5][3], v[1][30] = 0 / 0, 0 / 0
  local x = fl.tensor(v)
  check("amax over dim 1 with NaN in two columns", function(a) return a:amax(1) end, {x},
        {cols = true, exact = true})
  check("sum over dim 1 with NaN", function(a) return a:sum(1) end, {x}, {cols = true})
end

-- several reduced and kept dims
do
  local x = fl.randn(6, 5, 48)
  check("sum over dims 1 and 2 of [6, 5, 48]", function(a) return a:sum({1, 2}) end, {x}, {cols = true})
  check("sum over dim 2 of [6, 5, 48] (rows [6, 48])", function(a) return a:sum(2) end, {x}, {cols = true})
  check("mean over dim 1 of [6, 5, 48], keepdim", function(a) return a:mean(1, true) end, {x}, {cols = true})
  check("sum over the last dim stays row by row", function(a) return a:sum(3) end, {x}, {cols = false, tol = 1e-5})
end

-- fused producers, a stored elementwise result beside the sum (a bias's
-- gradient next to the masked gradient), a transposed view, int64
do
  local x, y = fl.randn(64, 100), fl.randn(64, 100)
  check("where(x <= 0, 0, y) stored, and its sum over dim 1", function(a, b)
    local m = fl.where(a:le(0), 0.0, b)
    return m, m:sum(1)
  end, {x, y}, {cols = true})
  check("(x * 2 + 1):sum(1)", function(a) return (a * 2 + 1):sum(1) end, {x}, {cols = true})
  check("a transposed view summed over its last dim", function(a) return a:transpose(1, 2):sum(2) end,
        {fl.randn(100, 64)}, {cols = true})
  local i = (fl.rand(50, 20) * 1000):to("int64")
  check("int64 sum over dim 1", function(a) return a:sum(1) end, {i}, {cols = true, exact = true})
  check("int64 amax over dim 1", function(a) return a:amax(1) end, {i}, {cols = true, exact = true})
end

-- symbolic sizes: the strides are read at run time, and the kernel picks
-- the column loop or the row loop by them (one compile for all sizes)
do
  local f = function(a) return (a * 2):sum(1) end
  local cm = fl.compile(f, {backend = "cpu", dynamic = true})
  for _, shape in ipairs{{40, 70}, {3, 17}, {65, 16}, {2, 5}, {64, 300}} do
    local x = fl.randn(shape[1], shape[2])
    t.ok(same(cm(x), f(x), 1e-5), ("dynamic sizes [%d, %d]: compiled equals eager"):format(shape[1], shape[2]))
    local xt = fl.randn(shape[2], shape[1]):transpose(1, 2)
    t.ok(same(cm(xt), f(xt), 1e-5), ("dynamic sizes, a transposed [%d, %d]: compiled equals eager"):format(shape[1], shape[2]))
  end
  local code = cm:code()
  t.ok(code:find("a column reduction", 1, true) and code:find("} else {", 1, true),
       "dynamic sizes: both loops written, the strides choose")
end

-- the row loop (a reduction over the last dims) stores a value needing no
-- reduction's result in the pass that computes it: squeeze-and-
-- excitation's SiLU beside its mean over each channel's map has one pass,
-- no row scratch and no pass of stores; a softmax stored beside the exp it
-- divides stores the exp in pass 2 and the quotient in its own pass 3
do
  local function passes(name, fn, inputs, want_stores)
    local g = fl.capture(fn, table.unpack(inputs))
    local src = tostring(g:fuse():codegen("cpu"))
    local stores = src:match("pass %d: the stores") ~= nil
    t.ok(not src:find("a column reduction", 1, true) and stores == want_stores and
         (want_stores or not src:find("row scratch", 1, true)),
         name .. (want_stores and ": a pass of stores after the sums" or ": one pass, no row scratch"))
    check(name, fn, inputs, {tol = 1e-5})
  end
  for _, s in ipairs{{2, 96, 1}, {2, 40, 4}, {1, 24, 7}, {2, 16, 14}, {2, 8, 28}} do
    local x = fl.randn(s[1], s[2], s[3], s[3]) * 4
    passes(("SiLU stored with its mean over [%d, %d, %d, %d]'s maps"):format(s[1], s[2], s[3], s[3]),
           function(a) local y = a:silu(); return y, y:mean({3, 4}, true) end, {x}, false)
    passes(("ReLU stored with its max over [%d, %d, %d, %d]'s maps"):format(s[1], s[2], s[3], s[3]),
           function(a) local y = a:relu(); return y, y:amax({3, 4}) end, {x}, false)
  end
  local x = fl.randn(33, 70)
  passes("exp stored beside a softmax of it (stages 0 and 2)",
         function(a) local e = (a - a:amax(2, true)):exp(); return a * 2, e / e:sum(2, true) end, {x}, true)
  -- a value of stage 1 stored in pass 2: x - mean beside the variance
  passes("x - mean stored beside its mean square, [6, 5, 14] over dims 2 and 3",
         function(a) local d = a - a:mean({2, 3}, true); return d, (d * d):mean({2, 3}) end,
         {fl.randn(6, 5, 14)}, false)
  -- but over one dim that graph output is the store a large call streams
  -- past the caches, in a pass of its own
  passes("x - mean over the last dim: the streamed store keeps its pass",
         function(a) local d = a - a:mean(2, true); return d, (d * d):mean(2) end, {x}, true)
  local cm = fl.compile(function(a) local y = a:silu(); return y, y:mean({3, 4}, true) end,
                        {backend = "cpu", dynamic = true})
  for _, s in ipairs{{2, 40, 4}, {1, 7, 9}, {3, 5, 1}} do
    local a = fl.randn(s[1], s[2], s[3], s[3]) * 4
    local y, m = cm(a)
    t.ok(same(y, a:silu(), 1e-6) and same(m, a:silu():mean({3, 4}, true), 1e-5),
         ("dynamic sizes [%d, %d, %d, %d]: SiLU and its mean stored in one pass equal eager"):format(
           s[1], s[2], s[3], s[3]))
  end
end

t.done()
