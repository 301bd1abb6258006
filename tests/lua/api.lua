-- api.lua -- the eager tensor API of DESIGN §2 end to end, values checked
-- against hand-computed results.  Runs as `fuselab tests/lua/api.lua` or,
-- from a stock interpreter, `lua5.4 -e 'fl=require"fuselab"' api.lua`.
local fl = fl or require "fuselab"
local t = require "tap"

local function sq(v) return math.sqrt(v) end

---------------------------------------------------------------------------
-- creation
---------------------------------------------------------------------------
do
  local x = fl.tensor{{1, 2, 3}, {4, 5, 6}}
  t.is(x.shape, {2, 3}, "tensor: shape from nesting")
  t.is(x.dtype, "int64", "tensor: Lua integers give int64 (as torch.tensor)")
  t.is(x:tolist(), {{1, 2, 3}, {4, 5, 6}}, "tensor: tolist round trip")
  t.is(fl.tensor{1.5, 2}.dtype, "float32", "tensor: any float gives float32")
  t.is(fl.tensor{true, false}.dtype, "bool", "tensor: booleans give bool")
  t.is(fl.tensor{true, false}:tolist(), {true, false}, "bool tolist gives booleans")
  t.is(fl.tensor({1, 2}, {dtype = "float16"}).dtype, "float16", "tensor: dtype option")
  t.is(fl.tensor(3.5).shape, {}, "tensor(number) is 0-d")
  t.is(fl.tensor(3.5):item(), 3.5, "0-d item")
  t.is(fl.tensor{}.shape, {0}, "tensor{} is empty 1-d")
  local big = math.maxinteger - 1
  t.is(fl.tensor{big}:item(), big, "int64 values stay exact beyond 2^53")
  local c = fl.tensor(x)
  c:fill_(0)
  t.is(x:sum():item(), 21, "tensor(t) copies")
end

do
  t.is(fl.zeros(2, 3).shape, {2, 3}, "zeros varargs")
  t.is(fl.zeros{2, 3}.shape, {2, 3}, "zeros table")
  t.is(fl.zeros(2, 3, {dtype = "int64"}).dtype, "int64", "zeros with options")
  t.is(fl.zeros({2}, {dtype = "bool"}):tolist(), {false, false}, "zeros bool")
  t.is(fl.zeros{dtype = "int64"}.shape, {}, "zeros{dtype=} alone is 0-d")
  t.is(fl.ones(2):tolist(), {1, 1}, "ones")
  t.is(fl.ones(2, {dtype = "float16"}).dtype, "float16", "ones float16")
  t.is(fl.full({2, 2}, 7):tolist(), {{7, 7}, {7, 7}}, "full")
  t.is(fl.full({2}, 7).dtype, "int64", "full: integer fill gives int64")
  t.is(fl.full({2}, 0.5).dtype, "float32", "full: float fill gives float32")
  t.is(fl.full(3, true):tolist(), {true, true, true}, "full: bool fill, size as number")
  t.is(fl.full({1}, 2.5, {dtype = "float16"}):tolist(), {2.5}, "full with dtype")
  t.is(fl.zeros().shape, {}, "zeros() is 0-d")
  t.is(fl.zeros(0, 3):numel(), 0, "zero-size tensor")
end

do
  t.is(fl.arange(4):tolist(), {0, 1, 2, 3}, "arange(n)")
  t.is(fl.arange(4).dtype, "int64", "arange of integers is int64")
  t.is(fl.arange(2, 5):tolist(), {2, 3, 4}, "arange(a, b)")
  t.is(fl.arange(10, 0, -3):tolist(), {10, 7, 4, 1}, "arange negative step")
  t.near(fl.arange(0, 1, 0.25), {0, 0.25, 0.5, 0.75}, "arange float step")
  t.is(fl.arange(0, 1, 0.25).dtype, "float32", "arange float is float32")
  t.is(fl.arange(3, {dtype = "float32"}).dtype, "float32", "arange dtype option")
  t.is(fl.arange(3, 3):numel(), 0, "empty arange")
  t.is(fl.eye(3):tolist(), {{1, 0, 0}, {0, 1, 0}, {0, 0, 1}}, "eye(n)")
  t.is(fl.eye(2, 3):tolist(), {{1, 0, 0}, {0, 1, 0}}, "eye(n, m)")
end

do
  fl.manual_seed(42)
  local a = fl.rand(3, 4)
  local n1 = fl.randn(100)
  fl.manual_seed(42)
  local b = fl.rand(3, 4)
  local n2 = fl.randn(100)
  t.is(a:tolist(), b:tolist(), "manual_seed: rand reproducible")
  t.is(n1:tolist(), n2:tolist(), "manual_seed: randn reproducible")
  t.ok(not fl.allclose(fl.rand(3, 4), b), "the stream advances")
  t.ok(a:amin():item() >= 0 and a:amax():item() < 1, "rand in [0, 1)")
  fl.manual_seed(1)
  local r = fl.randn(20000)
  t.near(r:mean():item(), 0, 0.05, "randn mean ~ 0")
  t.near(r:var():item(), 1, 0.05, "randn var ~ 1")
  t.is(fl.rand(2, {dtype = "float16"}).dtype, "float16", "rand float16")
end

---------------------------------------------------------------------------
-- fields and queries
---------------------------------------------------------------------------
do
  local x = fl.zeros(2, 3, 4)
  t.is(x.shape, {2, 3, 4}, "x.shape")
  t.is(x.dtype, "float32", "default dtype float32")
  t.is(x.device, "cpu", "x.device")
  t.is(x:dim(), 3, "dim")
  t.is(x:numel(), 24, "numel")
  t.is(x:size(1), 2, "size(1) is the first dim")
  t.is(x:size(-1), 4, "size(-1) is the last dim")
  t.is(x:size(-3), 2, "size(-3)")
  t.is(x:size(), {2, 3, 4}, "size() is the shape")
  t.is(#x, 2, "#x is the first dim")
  t.is(fl.tensor{{5}}:item(), 5, "item of a 1x1 tensor")
  t.is(fl.tensor(2):tolist(), 2, "tolist of 0-d is a number")
  t.ok(fl.is_tensor(x) and not fl.is_tensor({}), "fl.is_tensor")
  t.is(type(fl.nn), "table", "fl.nn placeholder")
  t.is(type(fl.Tensor.exp), "function", "fl.Tensor method table")
  t.is(type(getmetatable(x).methods.sum), "function", "metatable.methods")
  t.is(getmetatable(x).__name, "fl.Tensor", "__name")
end

---------------------------------------------------------------------------
-- printing
---------------------------------------------------------------------------
do
  t.is(tostring(fl.tensor{{1, 2, 3}, {4, 5, 6}}),
       " 1 2 3\n 4 5 6\n[int64 tensor of size 2x3]", "tostring int64 2-d")
  t.is(tostring(fl.tensor{{1.5, -2}, {3, 4}}),
       "  1.5000 -2.0000\n  3.0000  4.0000\n[float32 tensor of size 2x2]",
       "tostring float 2-d: one width, 4 decimals")
  t.is(tostring(fl.ones(2, 3)), " 1 1 1\n 1 1 1\n[float32 tensor of size 2x3]",
       "integral floats print as integers (Torch7)")
  t.is(tostring(fl.tensor{10, 200}), "  10\n 200\n[int64 tensor of size 2]",
       "1-d prints a column, right-aligned")
  t.is(tostring(fl.tensor(3.5)), "3.5000\n[float32 tensor of size (scalar)]",
       "0-d tostring")
  t.is(tostring(fl.tensor{true, false}), "  true\n false\n[bool tensor of size 2]",
       "bool tostring")
  t.is(tostring(fl.zeros(0, 3)), "[float32 tensor of size 0x3]", "empty tostring")
  t.is(tostring(fl.tensor{1e-6, 1}), " 1.0000e-06\n 1.0000e+00\n[float32 tensor of size 2]",
       "wide ranges print in scientific notation")
  local s3 = tostring(fl.arange(8):reshape(2, 2, 2))
  t.is(s3, "(1,.,.) =\n 0 1\n 2 3\n\n(2,.,.) =\n 4 5\n 6 7\n[int64 tensor of size 2x2x2]",
       "3-d prints one matrix per leading index, 1-based")
  local big = tostring(fl.zeros(100, 100))
  t.ok(big:find("...", 1, true), "large tensors are summarized with ...")
  local lines = select(2, big:gsub("\n", ""))
  t.ok(lines < 12, "summary stays short (" .. lines .. " lines)")
  t.ok(big:find("%[float32 tensor of size 100x100%]$"), "summary footer")
  t.is(tostring(fl.tensor{0/0, 1/0, -1/0, 0.5}),
       "    nan\n    inf\n   -inf\n 0.5000\n[float32 tensor of size 4]", "nan and inf")
end

---------------------------------------------------------------------------
-- elementwise
---------------------------------------------------------------------------
do
  local v = {-1, -0.5, 0.5, 1}
  local x = fl.tensor(v)
  local function map(f) local r = {} for i, a in ipairs(v) do r[i] = f(a) end return r end
  local function sigmoid(a) return 1 / (1 + math.exp(-a)) end
  t.near(x:abs(), map(math.abs), "abs")
  t.near(x:neg(), map(function(a) return -a end), "neg")
  t.near(x:exp(), map(math.exp), 1e-6, "exp")
  t.near(x:abs():log(), map(function(a) return math.log(math.abs(a)) end), 1e-6, "log")
  t.near(x:abs():sqrt(), map(function(a) return sq(math.abs(a)) end), 1e-6, "sqrt")
  t.near(x:abs():rsqrt(), map(function(a) return 1 / sq(math.abs(a)) end), 1e-6, "rsqrt")
  t.near(x:sin(), map(math.sin), 1e-6, "sin")
  t.near(x:cos(), map(math.cos), 1e-6, "cos")
  t.near(x:tanh(), map(function(a) return (math.exp(2*a) - 1) / (math.exp(2*a) + 1) end), 1e-6, "tanh")
  t.near(x:sigmoid(), map(sigmoid), 1e-6, "sigmoid")
  t.near(x:relu(), {0, 0, 0.5, 1}, "relu")
  t.near(x:silu(), map(function(a) return a * sigmoid(a) end), 1e-6, "silu")
  -- erf and the exact gelu from tables (Abramowitz-Stegun values)
  t.near(x:erf(), {-0.8427007929, -0.5204998778, 0.5204998778, 0.8427007929}, 1e-6, "erf")
  t.near(x:gelu(), {-0.1586552539, -0.1542687270, 0.3457312730, 0.8413447461}, 1e-6, "gelu (erf form)")
  local function gelu_tanh(a)
    local u = 0.7978845608028654 * (a + 0.044715 * a * a * a)
    local th = (math.exp(2*u) - 1) / (math.exp(2*u) + 1)
    return 0.5 * a * (1 + th)
  end
  t.near(x:gelu{approximate = "tanh"}, map(gelu_tanh), 1e-6, "gelu tanh approximation")
  t.near(fl.exp(x), x:exp(), "function form fl.exp")
  t.near(fl.relu(x), {0, 0, 0.5, 1}, "function form fl.relu")
  t.near(x:clamp(-0.6, 0.6), {-0.6, -0.5, 0.5, 0.6}, "clamp(lo, hi)")
  t.near(x:clamp{min = 0}, {0, 0, 0.5, 1}, "clamp{min=}")
  t.near(x:clamp(nil, 0), {-1, -0.5, 0, 0}, "clamp(nil, hi)")
  t.near(-x, {1, 0.5, -0.5, -1}, "unary minus")
end

do
  local a = fl.tensor{{1, 2, 3}, {4, 5, 6}}:to("float32")
  local b = fl.tensor{10, 20, 30}:to("float32")
  t.near(a + b, {{11, 22, 33}, {14, 25, 36}}, "add broadcasts a row")
  t.near(a - 1, {{0, 1, 2}, {3, 4, 5}}, "tensor - number")
  t.near(1 - a, {{0, -1, -2}, {-3, -4, -5}}, "number - tensor")
  t.near(a * 2, {{2, 4, 6}, {8, 10, 12}}, "tensor * number")
  t.near(6 / a, {{6, 3, 2}, {1.5, 1.2, 1}}, "number / tensor")
  t.near(a ^ 2, {{1, 4, 9}, {16, 25, 36}}, "tensor ^ number")
  t.near(2 ^ fl.tensor{1.0, 3.0}, {2, 8}, "number ^ tensor")
  t.near(a:mul(b), {{10, 40, 90}, {40, 100, 180}}, "mul method")
  t.near(fl.sub(b, a), {{9, 18, 27}, {6, 15, 24}}, "fl.sub")
  t.near(fl.add(2, b), {12, 22, 32}, "fl.add(number, tensor)")
  t.near(a:div(b), {{0.1, 0.1, 0.1}, {0.4, 0.25, 0.2}}, 1e-6, "div")
  t.near(a:pow(b:div(10)), {{1, 4, 27}, {4, 25, 216}}, 1e-4, "pow")
  local col = fl.tensor{{1.0}, {2.0}}
  local row = fl.tensor{{10.0, 20.0, 30.0}}
  t.near(col + row, {{11, 21, 31}, {12, 22, 32}}, "2x1 + 1x3 broadcasts to 2x3")
  t.near(a:maximum(fl.tensor{3.0, 3.0, 3.0}), {{3, 3, 3}, {4, 5, 6}}, "maximum")
  t.near(a:minimum(3), {{1, 2, 3}, {3, 3, 3}}, "minimum with a number")
  t.is(a:eq(fl.tensor{1, 5, 0}):tolist(), {{true, false, false}, {false, true, false}}, "eq")
  t.is(a:ne(2):tolist(), {{true, false, true}, {true, true, true}}, "ne")
  t.is(a:lt(3):tolist(), {{true, true, false}, {false, false, false}}, "lt")
  t.is(a:le(3):tolist(), {{true, true, true}, {false, false, false}}, "le")
  t.is(a:gt(4):tolist(), {{false, false, false}, {false, true, true}}, "gt")
  t.is(a:ge(4).dtype, "bool", "comparisons give bool")
  t.near(fl.where(a:gt(3), a, 0), {{0, 0, 0}, {4, 5, 6}}, "where with a number")
  t.near(fl.where(fl.tensor{true, false}, fl.tensor{1.0, 2.0}, fl.tensor{-1.0, -2.0}),
         {1, -2}, "where")
end

do -- type promotion, as PyTorch
  local i = fl.tensor{1, 2, 3}
  t.is((i + 1).dtype, "int64", "int64 + integer stays int64")
  t.is((i + 1):tolist(), {2, 3, 4}, "int64 + integer values")
  t.is((i + 1.5).dtype, "float32", "int64 + float number gives float32")
  t.near(i + 1.5, {2.5, 3.5, 4.5}, "int64 + float values")
  t.is((fl.tensor{7} / fl.tensor{2}).dtype, "float32", "int / int is float")
  t.near(fl.tensor{7} / fl.tensor{2}, {3.5}, "int / int is true division")
  t.is((fl.ones(2, {dtype = "float16"}) * 2.5).dtype, "float16",
       "float16 * number stays float16 (wrapped numbers are weakest)")
  t.is((i * fl.ones(3)).dtype, "float32", "int64 * float32 tensor gives float32")
  t.is((fl.ones(1, {dtype = "float16"}) + fl.ones(1, {dtype = "bfloat16"})).dtype,
       "float32", "float16 + bfloat16 gives float32")
  t.is((fl.tensor(2) * fl.ones(2, {dtype = "float16"})).dtype, "float16",
       "0-d int64 tensor with float16 gives float16")
end

---------------------------------------------------------------------------
-- reductions and composites
---------------------------------------------------------------------------
do
  local x = fl.tensor{{1.0, 2.0, 3.0}, {4.0, 6.0, 8.0}}
  t.near(x:sum():item(), 24, "sum of all")
  t.near(x:sum(1), {5, 8, 11}, "sum over dim 1 (1-based)")
  t.near(x:sum(2), {6, 18}, "sum over dim 2")
  t.near(x:sum(-1), {6, 18}, "sum over dim -1")
  t.near(x:sum({1, 2}):item(), 24, "sum over a table of dims")
  t.is(x:sum(2, true).shape, {2, 1}, "keepdim keeps a size-1 dim")
  t.is(x:sum{dim = 1, keepdim = true}.shape, {1, 3}, "options table form")
  t.near(x:mean(2), {2, 6}, "mean")
  t.near(x:amax(1), {4, 6, 8}, "amax")
  t.near(x:amin(-1), {1, 4}, "amin")
  t.near(x:var(2), {1, 4}, 1e-6, "var is unbiased by default")
  t.near(x:var(2, {correction = 0}), {2 / 3, 8 / 3}, 1e-6, "var{correction=0}")
  t.near(x:var{dim = 2, correction = 0}, {2 / 3, 8 / 3}, 1e-6, "var options only")
  t.is(x:argmax(2):tolist(), {2, 2}, "argmax values are 0-based indices")
  t.is(x:argmax():item(), 5, "argmax over all is a flat index")
  t.is(fl.tensor{1, 2, 3}:sum().dtype, "int64", "sum of int64 stays int64")
  t.is(fl.sum(x, 1):tolist(), x:sum(1):tolist(), "fl.sum function form")

  local s = fl.tensor{{1.0, 2.0, 3.0}}:softmax(-1)
  local e1, e2, e3 = math.exp(1), math.exp(2), math.exp(3)
  local z = e1 + e2 + e3
  t.near(s, {{e1 / z, e2 / z, e3 / z}}, 1e-6, "softmax(-1)")
  t.near(fl.tensor{{1.0, 2.0, 3.0}}:log_softmax(2),
         {{1 - math.log(z), 2 - math.log(z), 3 - math.log(z)}}, 1e-5, "log_softmax(2)")
  t.near(fl.softmax(fl.tensor{{1.0}, {1.0}}, 1), {{0.5}, {0.5}}, "fl.softmax over dim 1")

  local sd = sq(2 / 3 + 1e-5)
  t.near(x:layer_norm({3}), {{-1 / sd, 0, 1 / sd}, {-2 / sq(8/3 + 1e-5), 0, 2 / sq(8/3 + 1e-5)}},
         1e-5, "layer_norm over the last dim")
  local w, b = fl.tensor{1.0, 2.0, 3.0}, fl.tensor{0.5, 0.5, 0.5}
  t.near(x:layer_norm({3}, w, b):narrow(1, 1, 1),
         {{-1 / sd + 0.5, 0.5, 3 / sd + 0.5}}, 1e-5, "layer_norm with weight and bias")
  t.near(x:layer_norm({2, 3}, nil, nil, 0):mean():item(), 0, 1e-6, "layer_norm over 2 dims")
  local r = sq((1 + 4 + 9) / 3 + 1e-6)
  t.near(fl.tensor{1.0, 2.0, 3.0}:rms_norm({3}, nil, 1e-6), {1 / r, 2 / r, 3 / r}, 1e-5, "rms_norm")
  t.near(fl.tensor{1.0, 2.0, 3.0}:rms_norm(3, w, 1e-6), {1 / r, 4 / r, 9 / r}, 1e-5,
         "rms_norm with weight, shape as a number")
end

---------------------------------------------------------------------------
-- linear algebra
---------------------------------------------------------------------------
do
  local a = fl.tensor{{1.0, 2.0, 3.0}, {4.0, 5.0, 6.0}}
  local b = fl.tensor{{1.0, 0.0}, {0.0, 1.0}, {1.0, 1.0}}
  t.near(a:matmul(b), {{4, 5}, {10, 11}}, "matmul 2x3 @ 3x2")
  t.near(fl.matmul(a, b), {{4, 5}, {10, 11}}, "fl.matmul")
  local batch = fl.cat({a:unsqueeze(1), (a * 2):unsqueeze(1)}, 1)
  t.is(batch.shape, {2, 2, 3}, "stacked batch")
  t.near(batch:matmul(b), {{{4, 5}, {10, 11}}, {{8, 10}, {20, 22}}}, "batched matmul broadcasts b")
  local w = fl.tensor{{1.0, 0.0}, {0.0, 1.0}, {1.0, 1.0}}
  t.near(fl.linear(fl.tensor{{1.0, 2.0}}, w, fl.tensor{0.0, 0.0, 1.0}), {{1, 2, 4}},
         "linear: x @ w^T + b, w is [out, in]")
  t.near(fl.linear(fl.tensor{{1.0, 2.0}}, w), {{1, 2, 3}}, "linear without bias")
end

---------------------------------------------------------------------------
-- views and data movement
---------------------------------------------------------------------------
do
  local x = fl.arange(6)
  t.is(x:reshape(2, 3):tolist(), {{0, 1, 2}, {3, 4, 5}}, "reshape varargs")
  t.is(x:reshape{3, -1}.shape, {3, 2}, "reshape table with -1")
  t.is(x:view(2, 3).shape, {2, 3}, "view")
  local m = x:reshape(2, 3)
  t.is(m:transpose(1, 2):tolist(), {{0, 3}, {1, 4}, {2, 5}}, "transpose(1, 2)")
  t.is(m:transpose(-1, -2).shape, {3, 2}, "transpose negative dims")
  local c = fl.arange(24):reshape(2, 3, 4)
  t.is(c:permute(3, 1, 2).shape, {4, 2, 3}, "permute varargs")
  -- out[i][j][k] = c[j][k][i]
  t.is(c:permute{3, 1, 2}:contiguous():reshape(-1):narrow(1, 1, 4):tolist(), {0, 4, 8, 12},
       "permute values")
  t.is(m:unsqueeze(1).shape, {1, 2, 3}, "unsqueeze(1)")
  t.is(m:unsqueeze(-1).shape, {2, 3, 1}, "unsqueeze(-1) appends")
  t.is(m:unsqueeze(3).shape, {2, 3, 1}, "unsqueeze(n+1) appends")
  t.is(fl.zeros(1, 2, 1):squeeze().shape, {2}, "squeeze()")
  t.is(fl.zeros(1, 2, 1):squeeze(1).shape, {2, 1}, "squeeze(1)")
  t.is(fl.tensor{{1}, {2}}:expand(2, 3):tolist(), {{1, 1, 1}, {2, 2, 2}}, "expand")
  t.is(fl.tensor{{1}, {2}}:expand{-1, 2}.shape, {2, 2}, "expand -1 keeps")
  t.is(m:narrow(2, 2, 2):tolist(), {{1, 2}, {4, 5}}, "narrow: start is 1-based")
  t.is(m:narrow(2, -1, 1):tolist(), {{2}, {5}}, "narrow: negative start")
  t.ok(m:transpose(1, 2):contiguous():view(6), "contiguous then view")
  t.is(fl.cat({m, m}, 1).shape, {4, 3}, "cat dim 1")
  t.is(fl.cat({m, m}, -1):tolist(), {{0, 1, 2, 0, 1, 2}, {3, 4, 5, 3, 4, 5}}, "cat dim -1")
  t.is(fl.cat({fl.tensor{1}, fl.tensor{2, 3}}):tolist(), {1, 2, 3}, "cat default dim 1")
  local many = {}
  for i = 1, 100 do many[i] = fl.tensor{i} end
  t.is(fl.cat(many):sum():item(), 5050, "cat of 100 tensors")
  local wt = fl.tensor{{1.0, 2.0}, {3.0, 4.0}, {5.0, 6.0}}
  t.near(fl.embedding(fl.tensor{2, 0}, wt), {{5, 6}, {1, 2}}, "embedding: 0-based rows")
  t.is(fl.embedding(fl.tensor{{1, 1}}, wt).shape, {1, 2, 2}, "embedding keeps index shape")
end

do -- views share storage with their base
  local x = fl.zeros(2, 3)
  x:narrow(1, 2, 1):fill_(7)
  t.is(x:tolist(), {{0, 0, 0}, {7, 7, 7}}, "filling a narrow view changes the base")
  local v = x:view(6)
  v:copy_(fl.arange(6))
  t.is(x:tolist(), {{0, 1, 2}, {3, 4, 5}}, "copy_ into a view changes the base")
  x:transpose(1, 2):mul_(10)
  t.is(x:tolist(), {{0, 10, 20}, {30, 40, 50}}, "in-place on a transposed view")
  local r = x:reshape(3, 2)
  r:zero_()
  t.is(x:sum():item(), 0.0, "reshape of a contiguous tensor is a view")
end

do -- in place
  local x = fl.ones(2, 2)
  t.ok(rawequal(x:add_(fl.tensor{1.0, 2.0}), x), "add_ returns x")
  t.is(x:tolist(), {{2, 3}, {2, 3}}, "add_ broadcasts y into x")
  x:mul_(2)
  t.is(x:tolist(), {{4, 6}, {4, 6}}, "mul_ with a number")
  x:sub_(1):div_(fl.tensor{3.0, 5.0})
  t.is(x:tolist(), {{1, 1}, {1, 1}}, "sub_ and div_")
  x:fill_(2.5)
  t.is(x:tolist(), {{2.5, 2.5}, {2.5, 2.5}}, "fill_")
  x:zero_()
  t.is(x:tolist(), {{0, 0}, {0, 0}}, "zero_")
  x:copy_(fl.tensor{{1, 2}, {3, 4}})
  t.is(x:tolist(), {{1, 2}, {3, 4}}, "copy_ converts int64 into float32")
  t.is(x.dtype, "float32", "copy_ keeps the destination dtype")
  local i = fl.tensor{1, 2}
  i:add_(1)
  t.is(i:tolist(), {2, 3}, "int64 add_ integer")
end

do -- dtype and device moves
  local x = fl.tensor{1.5, -2.7, 0}
  t.is(x:to("float16").dtype, "float16", "to float16")
  t.near(x:to("float16"), {1.5, -2.69921875, 0}, 1e-6, "float16 rounding")
  t.near(x:to("bfloat16"), {1.5, -2.703125, 0}, 1e-6, "bfloat16 rounding")
  t.is(x:to("int64"):tolist(), {1, -2, 0}, "to int64 truncates toward zero")
  t.is(x:to("bool"):tolist(), {true, true, false}, "to bool tests != 0")
  t.ok(rawequal(x:to("float32"), x), "to the same dtype returns x")
  t.ok(rawequal(x:cpu(), x), "cpu() of a cpu tensor returns x")
  t.ok(rawequal(x:to("cpu"), x), "to('cpu') returns x")
  t.is(x:to{dtype = "int64"}.dtype, "int64", "to{dtype=}")
end

do -- pooling, convolution, batch norm
  local x = fl.arange(16, {dtype = "float32"}):reshape(1, 1, 4, 4)
  t.near(x:max_pool2d(2), {{{{5, 7}, {13, 15}}}}, "max_pool2d(2)")
  t.near(x:avg_pool2d(2), {{{{2.5, 4.5}, {10.5, 12.5}}}}, "avg_pool2d(2)")
  t.is(x:max_pool2d(2, {stride = 1}).shape, {1, 1, 3, 3}, "pool stride option")
  t.is(x:max_pool2d({2, 2}, {stride = {2, 2}, padding = 1}).shape, {1, 1, 3, 3},
       "pool pairs and padding")
  t.near(fl.max_pool2d(x, 4), {{{{15}}}}, "fl.max_pool2d")

  local img = fl.arange(9, {dtype = "float32"}):reshape(1, 1, 3, 3)
  local w = fl.ones(1, 1, 2, 2)
  t.near(fl.conv2d(img, w), {{{{8, 12}, {20, 24}}}}, "conv2d")
  t.near(fl.conv2d(img, w, fl.tensor{1.0}), {{{{9, 13}, {21, 25}}}}, "conv2d with bias")
  t.near(fl.conv2d(img, w, nil, {stride = 2, padding = 1}), {{{{0, 3}, {9, 24}}}},
         "conv2d stride 2 padding 1")
  t.near(fl.conv2d(img, w, {stride = {1, 2}}), {{{{8}, {20}}}}, "conv2d options in the bias slot")

  local bx = fl.tensor{{{{1.0}}, {{2.0}}}}
  t.near(fl.batch_norm(bx, fl.tensor{0.0, 1.0}, fl.tensor{1.0, 4.0},
                       fl.tensor{1.0, 2.0}, fl.tensor{0.0, 1.0}, 0),
         {{{{1}}, {{2}}}}, "batch_norm (inference)")
  t.near(fl.batch_norm(bx, fl.tensor{0.0, 1.0}, fl.tensor{1.0, 4.0}),
         {{{{1 / sq(1 + 1e-5)}}, {{1 / sq(4 + 1e-5)}}}}, 1e-6, "batch_norm default eps, no affine")
end

---------------------------------------------------------------------------
-- comparison, timing, files
---------------------------------------------------------------------------
do
  local a = fl.tensor{1.0, 2.0}
  t.ok(fl.allclose(a, fl.tensor{1.0, 2.0 + 1e-6}), "allclose within rtol")
  t.ok(not fl.allclose(a, fl.tensor{1.0, 2.1}), "allclose detects a difference")
  t.ok(fl.allclose(a, fl.tensor{1.0, 2.1}, 0, 0.2), "allclose atol positional")
  t.ok(fl.allclose(a, fl.tensor{1.0, 2.1}, {atol = 0.2}), "allclose options")
  t.ok(fl.allclose(fl.ones(2, 2), fl.tensor{1.0}), "allclose broadcasts")
  t.ok(not fl.allclose(fl.tensor{0/0}, fl.tensor{0/0}), "NaN is never close")
  t.ok(fl.allclose(fl.tensor{1/0}, fl.tensor{1/0}), "inf is close to inf")
  t.ok(not fl.allclose(fl.tensor{1/0}, fl.tensor{-1/0}), "inf is not close to -inf")
  t.ok(not fl.allclose(fl.tensor{1}, fl.tensor{1/0}), "a number is not close to inf")
  t.ok(fl.allclose(fl.tensor{0/0, 1}, fl.tensor{0/0, 1}, {equal_nan = true}), "equal_nan: NaN is close to NaN")
  t.ok(not fl.allclose(fl.tensor{0/0}, fl.tensor{1}, {equal_nan = true}), "equal_nan: NaN is not close to 1")
  local ts = fl.tensor({1733000000123456789}, {dtype = "int64"})
  t.ok(not fl.allclose(ts, ts + 1, 0, 0), "int64 allclose sees 1 ns at a timestamp")
  t.ok(fl.allclose(ts, ts + 1, 0, 1), "int64 allclose within atol 1")
end

do
  local t0 = fl.now()
  t.is(math.type(t0), "float", "fl.now is a float")
  local s = 0
  for i = 1, 1e5 do s = s + i end
  local t1 = fl.now()
  t.ok(t1 > t0, "fl.now advances")
  local prev, mono = fl.now(), true
  for _ = 1, 1000 do
    local n = fl.now()
    if n < prev then mono = false end
    prev = n
  end
  t.ok(mono, "fl.now is monotonic")
  t.is(select("#", fl.synchronize()), 0, "synchronize is a no-op on cpu")
end

do -- save/load round trip of every dtype
  local dir = t.tmpdir()
  local cases = {
    {"float32", {{1.5, -2.25}, {3, 4}}},
    {"float16", {{1.5, -2.25}, {65504, 0}}},
    {"bfloat16", {{1.5, -2.25}, {256, 0}}},
    {"int64", {{1, -2}, {math.maxinteger, math.mininteger}}},
    {"bool", {{true, false}, {false, true}}},
  }
  for _, c in ipairs(cases) do
    local dtype, values = c[1], c[2]
    local x = fl.tensor(values, {dtype = dtype})
    local path = dir .. "/" .. dtype .. ".npy"
    fl.save(x, path)
    local y = fl.load(path)
    t.is(y:tolist(), values, "save/load values: " .. dtype)
    -- NumPy has no bfloat16: it is saved as float32
    t.is(y.dtype, dtype == "bfloat16" and "float32" or dtype, "save/load dtype: " .. dtype)
  end
  local x = fl.arange(6, {dtype = "float32"}):reshape(2, 3):transpose(1, 2)
  fl.save(x, dir .. "/t.npy")
  t.is(fl.load(dir .. "/t.npy"):tolist(), {{0, 3}, {1, 4}, {2, 5}}, "save of a non-contiguous view")
  fl.save(fl.tensor(2.5), dir .. "/s.npy")
  t.is(fl.load(dir .. "/s.npy").shape, {}, "0-d round trip")
end

do -- large temporaries are collected, not piled up
  local x = fl.zeros(1024, 1024)           -- 4 MiB
  for _ = 1, 200 do local _ = x + 1 end     -- 800 MiB if never collected
  t.ok(true, "a loop of large temporaries runs")
end

t.done()
