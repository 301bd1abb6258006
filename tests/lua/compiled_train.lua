-- compiled_train.lua -- fl.compile in training (AOTAutograd): a call in
-- grad mode whose inputs or parameters require grad runs a forward and a
-- backward compiled from the joint graph, and loss:backward() runs the
-- compiled backward (a CompiledFunctionBackward grad_fn).  Compiled
-- gradients against eager autograd's on an MLP, a CNN with BatchNorm in
-- training (its running statistics too) and a GPT; 20 optimizer steps
-- against 20 eager ones with one compile; gradients flowing through a
-- compiled call into eager code on both sides; a whole training step
-- (loss, backward, optimizer) inside fl.compile, one pair for the
-- segment that computes the loss; what trains eagerly and says why;
-- errors.
--
-- Tolerance: |compiled - eager| <= 1e-4 * max|eager| + 1e-6 for every
-- gradient (the same float32 arithmetic, fused and reordered); after 20
-- AdamW steps 1e-4 relative.
local fl = fl or require "fuselab"
local t = require "tap"
local nn = fl.nn

local function maxdiff(a, b) return (a - b):abs():amax():item() end
local function close(a, b, rtol)
  local scale = b:abs():amax():item()
  return maxdiff(a, b) <= (rtol or 1e-4) * scale + 1e-6, maxdiff(a, b), scale
end

-- the gradients of every parameter after f's loss, eager then compiled
local function grads_of(m, f, args, compiled)
  m:zero_grad(true)
  local fn = compiled or f
  local loss = fn(table.unpack(args))
  loss:backward()
  local g = {}
  for i, p in ipairs(m:parameters()) do g[i] = p.grad and (p.grad * 1) or false end
  m:zero_grad(true)
  return loss:item(), g
end

-- n calls of f and of its compiled cf: the same losses and gradients
local function calls_agree(m, f, cf, args, n)
  local ok = true
  for _ = 1, n do
    local le, ge = grads_of(m, f, args)
    local lc, gc = grads_of(m, f, args, cf)
    ok = ok and math.abs(le - lc) <= 1e-5
    for i = 1, #ge do ok = ok and gc[i] and close(gc[i], ge[i]) end
  end
  return ok
end

local function same_grads(name, m, f, args, rtol)
  local cf = fl.compile(f)
  local le, ge = grads_of(m, f, args)
  local lc, gc = grads_of(m, f, args, cf)
  local ok, worst = math.abs(le - lc) <= 1e-5 * math.max(1, math.abs(le)), 0
  for i = 1, #ge do
    if not gc[i] then ok = false
    else
      local good, d = close(gc[i], ge[i], rtol)
      ok = ok and good
      worst = math.max(worst, d)
    end
  end
  local s = cf:stats()
  t.ok(ok and s.backward_graphs == 1 and s.training_calls == 1,
       ("%s: compiled loss and every gradient equal eager's (loss %.6g vs %.6g, worst %.3g; " ..
        "%d backward graph, %d training call)"):format(name, lc, le, worst, s.backward_graphs,
        s.training_calls))
  return cf
end

-- ---- models ----------------------------------------------------------------------
do
  fl.manual_seed(1)
  local m = nn.Sequential(nn.Linear(32, 64), nn.GELU(), nn.Linear(64, 10))
  local x, y = fl.randn(16, 32), (fl.rand(16) * 10):to("int64")
  local cf = same_grads("MLP with GELU", m, function(a, b) return fl.cross_entropy(m(a), b) end, {x, y})
  local s = cf:stats()
  t.ok(s.backward_kernels > 0 and s.saved_bytes > 0 and s.recomputed >= 1 and s.backward_ms > 0,
       ("stats: %d backward kernels, %d saved bytes, %d recomputed op(s), %.3f ms in backward"):format(
       s.backward_kernels, s.saved_bytes, s.recomputed, s.backward_ms))
  local pair = cf:training()[1]
  t.ok(pair and pair.bw:stats().kernels == s.backward_kernels and
       pair.partition.saved_bytes == s.saved_bytes and pair.partition.saved_bytes < pair.partition.eager_saved_bytes,
       ("cm:training(): the pair's plans and partition (mincut saves %d of save_all's %d bytes)"):format(
       pair and pair.partition.saved_bytes or -1, pair and pair.partition.eager_saved_bytes or -1))
  local l = cf(x, y)
  t.ok(tostring(l.grad_fn):find("CompiledFunctionBackward", 1, true), "the loss's grad_fn: " .. tostring(l.grad_fn))
  t.is(l.grad_fn.name, "CompiledFunctionBackward", "grad_fn.name")
  t.is(#l.grad_fn.next_functions, 4, "next_functions: one per parameter")
  local code = cf:code()
  t.ok(code:find("training pair 1: the forward", 1, true) and code:find("training pair 1: the backward", 1, true),
       "cm:code() shows the training pair's forward and backward programs")
  local html = t.slurp(fl.report(cf, t.tmpdir() .. "/train.html"))
  t.ok(html and html:find("forward/backward pair", 1, true) and html:find("training pair 1: the backward", 1, true),
       "the HTML report says what the training pair keeps and recomputes, and shows its code")
  fl.no_grad(function()
    local r = cf(x, y)
    t.ok(not r.requires_grad, "under fl.no_grad the inference graph runs (no history)")
  end)
  t.is(cf:stats().training_calls, 2, "and that call did not train")
end

do
  fl.manual_seed(2)
  local m = fl.models.cnn{channels = {3, 8, 16}, classes = 5, input = 16}
  m:train()
  local x, y = fl.randn(4, 3, 16, 16), (fl.rand(4) * 5):to("int64")
  local f = function(a, b) return fl.cross_entropy(m(a), b) end
  -- running statistics: one eager step and one compiled step from the same start
  local bufs = m:named_buffers()
  local bn = {}
  for name, b in pairs(bufs) do
    if name:find("running_mean$") and not bn.running_mean then
      bn.running_mean, bn.running_var = b, bufs[name:gsub("running_mean$", "running_var")]
    end
  end
  local rm0, rv0 = bn.running_mean * 1, bn.running_var * 1
  same_grads("CNN with BatchNorm in training", m, f, {x, y})
  local cf = fl.compile(f)
  bn.running_mean:copy_(rm0); bn.running_var:copy_(rv0)
  f(x, y)
  local me, ve = bn.running_mean * 1, bn.running_var * 1
  bn.running_mean:copy_(rm0); bn.running_var:copy_(rv0)
  cf(x, y)
  t.ok(close(bn.running_mean, me) and close(bn.running_var, ve),
       "BatchNorm's running statistics move as in eager training (compiled forward's write-backs)")
  t.ok(maxdiff(bn.running_mean, rm0) > 0, "and they did move")
end

do
  fl.manual_seed(3)
  local m = fl.models.transformer{vocab = 64, d = 32, heads = 2, layers = 2, seq = 16}
  m:eval()   -- no dropout: a joint graph cannot replay the forward's mask yet
  local x, y = (fl.rand(2, 16) * 64):to("int64"), (fl.rand(2, 16) * 64):to("int64")
  same_grads("2-layer GPT", m, function(a, b) return fl.cross_entropy(m(a):reshape(-1, 64), b:reshape(-1)) end,
             {x, y}, 2e-4)
end

-- ---- dropout in training: the same mask for the same seed ---------------------------
do
  local function grads(m, fn, args, seed)
    m:zero_grad(true)
    fl.manual_seed(seed)
    local l = fn(table.unpack(args))
    l:backward()
    local g = {}
    for i, p in ipairs(m:parameters()) do g[i] = p.grad * 1 end
    return l:item(), g
  end
  local function check(name, m, f, args)
    local cf = fl.compile(f)
    local le, ge = grads(m, f, args, 21)
    local lc, gc = grads(m, cf, args, 21)
    local _, g2 = grads(m, cf, args, 22)
    local ok, differs = math.abs(le - lc) <= 1e-5 * math.max(1, math.abs(le)), false
    for i = 1, #ge do
      ok = ok and close(gc[i], ge[i], 2e-4)
      differs = differs or maxdiff(g2[i], ge[i]) > 1e-4
    end
    t.ok(ok and differs and cf:stats().backward_graphs == 1 and #cf:stats().training_eager == 0,
         ("%s: compiled training draws eager's masks for the same seed (loss %.6g vs %.6g), " ..
          "other masks for another seed"):format(name, lc, le))
  end
  local m = nn.Sequential(nn.Linear(8, 32), nn.Dropout(0.3), nn.GELU(), nn.Linear(32, 3))
  m:train()
  check("MLP with dropout", m, function(a, b) return fl.cross_entropy(m(a), b) end,
        {fl.randn(6, 8), fl.tensor({0, 2, 1, 1, 0, 2})})
  fl.manual_seed(8)
  local gpt = fl.models.transformer{vocab = 32, d = 16, heads = 2, layers = 2, seq = 8, dropout = 0.1}
  gpt:train()
  local ids = (fl.rand(2, 8) * 32):to("int64")
  check("GPT with dropout", gpt, function(a, b) return fl.cross_entropy(gpt(a):reshape(-1, 32), b:reshape(-1)) end,
        {ids, ids})
end

-- ---- 20 optimizer steps ------------------------------------------------------------
do
  local function train(compiled)
    fl.manual_seed(4)
    local m = nn.Sequential(nn.Linear(16, 32), nn.Tanh(), nn.Linear(32, 3))
    local opt = fl.optim.AdamW(m:parameters(), {lr = 1e-2})
    local f = function(a, b) return fl.cross_entropy(m(a), b) end
    local step = compiled and fl.compile(f) or f
    local x, y = fl.randn(8, 16), (fl.rand(8) * 3):to("int64")
    local losses = {}
    for i = 1, 20 do
      opt:zero_grad()
      local l = step(x, y)
      l:backward()
      opt:step()
      losses[i] = l:item()
    end
    return m, losses, compiled and step:stats()
  end
  local me, le = train(false)
  local mc, lc, s = train(true)
  local ok = true
  for i, p in ipairs(me:parameters()) do ok = ok and close(mc:parameters()[i], p, 1e-4) end
  t.ok(ok, ("20 AdamW steps: compiled parameters equal eager's (last loss %.6f vs %.6f)"):format(lc[20], le[20]))
  t.ok(lc[20] < lc[1], "and the loss went down")
  t.ok(s.backward_graphs == 1 and s.training_calls == 20,
       ("one forward/backward pair for all 20 steps (%d backward graph(s), %d recompile(s))"):format(
       s.backward_graphs, s.recompiles))
end

-- ---- gradients through a compiled call, both ways ----------------------------------
do
  fl.manual_seed(5)
  local a = nn.Linear(6, 8)
  local m = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 1))
  local x = fl.randn(5, 6)
  local inner = function(h) return m(h):pow(2):mean() end
  local ci = fl.compile(inner)
  local function run(fn)
    a:zero_grad(true); m:zero_grad(true)
    local h = fl.tanh(a(x))            -- eager, before the compiled call
    local l = fn(h) * 3 + 1            -- eager, after it
    l:backward()
    local g = {}
    for _, p in ipairs(a:parameters()) do g[#g + 1] = p.grad * 1 end
    for _, p in ipairs(m:parameters()) do g[#g + 1] = p.grad * 1 end
    return g
  end
  local ge, gc = run(inner), run(ci)
  local ok = #gc == #ge
  for i = 1, #ge do ok = ok and close(gc[i], ge[i]) end
  t.ok(ok, "an input that requires grad (made eagerly) and eager ops after the compiled loss: " ..
           "gradients reach both modules as in eager")
  -- an input leaf
  local xl = fl.randn(5, 8):requires_grad_()
  local l = ci(xl)
  l:backward()
  local gx = xl.grad * 1
  xl.grad = nil
  inner(xl):backward()
  t.ok(close(gx, xl.grad), "an input leaf's gradient equals eager's")
  -- a seed other than 1 scales the gradients
  m:zero_grad(true)
  ci(xl):backward(fl.tensor(2.5))
  local g2 = m:parameters()[1].grad * 1
  m:zero_grad(true)
  ci(xl):backward()
  t.ok(close(g2, m:parameters()[1].grad * 2.5), "backward(2.5) scales every gradient by 2.5")
end

-- ---- what trains eagerly, and errors ------------------------------------------------
do
  local m = nn.Linear(4, 3)
  local x = fl.randn(2, 4)
  local cf = fl.compile(function(a) return m(a):relu() end)   -- not a scalar loss
  local y = cf(x)
  t.ok(not y.requires_grad and cf:stats().backward_graphs == 0 and
       tostring(cf:stats().training_note):find("not a loss"),
       "a function that does not return a loss keeps the inference path, and says why: " ..
       tostring(cf:stats().training_note))
  t.raises(function() y:sum():backward() end, "does not return a loss",
           "backward through its result says what compiled training compiles")
  local cb = fl.compile(function(a)
    local h = m(a)
    if h:sum():item() > 1e9 then h = h * 2 end   -- a graph break
    return h:sum()
  end)
  m:zero_grad(true)
  m(x):sum():backward()
  local want = m.weight.grad * 1
  for i = 1, 3 do
    m:zero_grad(true)
    local lb = cb(x)
    lb:backward()
    local sb = cb:stats()
    t.ok(lb.requires_grad and close(m.weight.grad, want) and sb.backward_graphs == 2 and
         #sb.training_eager == 0,
         ("graph breaks, call %d: an activation crosses the break, and the two segments' compiled "
          .. "pairs chain its gradient: eager's (%d pairs, %s)"):format(
         i, sb.backward_graphs, tostring(sb.training_eager[1] or "nothing eager")))
  end
  fl.no_grad(function()
    t.ok(not cb(x).requires_grad, "graph breaks: under fl.no_grad the compiled inference path")
  end)
  m:zero_grad(true)
  local cl = fl.compile(function(a) return m(a):sum() end)
  local l = cl(x)
  l:backward()
  t.raises(function() l:backward() end, "freed by an earlier backward",
           "a second backward through the compiled function without retain_graph is an error")
  m:zero_grad(true)
  local l2 = cl(x)
  l2:backward(nil, {retain_graph = true})
  local g1 = m.weight.grad * 1
  l2:backward()
  t.ok(close(m.weight.grad, g1 * 2), "with retain_graph a second backward accumulates")
  t.raises(function() fl.grad(cl(x), {m.weight}, {create_graph = true}) end,
           "create_graph through a compiled function",
           "create_graph through a compiled function says it is not supported yet")
end

-- fl.grad through a compiled function: through its call, its other
-- results' tangents and eager code beside it, equal to eager's, and no
-- parameter's .grad written
do
  fl.manual_seed(5)
  local m = nn.Sequential(nn.Linear(4, 8), nn.GELU(), nn.Linear(8, 3))
  local x, y, T = fl.randn(5, 4), fl.tensor({0, 2, 1, 1, 0}), fl.randn(5, 3)
  local f = function(a, b) local out = m(a); return fl.cross_entropy(out, b), out end
  local cf = fl.compile(f)
  local ps = m:parameters()
  m:zero_grad(true)
  local worst, ok = 0, true
  for _ = 1, 2 do
    local want, got = {}, {}
    for k, fn in ipairs{f, cf} do
      local l, out = fn(x, y)
      local gs = fl.grad(l * 2 + (out * T):sum() + ps[1]:sum(), ps)
      for i = 1, #ps do (k == 1 and want or got)[i] = gs[i] end
    end
    for i = 1, #ps do
      local good, d = close(got[i], want[i])
      ok = ok and good
      worst = math.max(worst, d)
    end
  end
  local untouched = true
  for _, p in ipairs(ps) do untouched = untouched and p.grad == nil end
  t.ok(ok and untouched and cf:stats().backward_graphs == 1,
       ("fl.grad through a compiled function: eager's gradients (max diff %.2g), no .grad written"):format(worst))
end

-- ONNX-loaded networks made trainable: their initializers require grad
do
  local src = os.getenv("FUSELAB_SRC") or ".."
  for _, c in ipairs{{"mlp.onnx", {3, 4}}, {"conv.onnx", {1, 1, 5, 7}}} do
    local m = fl.load_onnx(src .. "/tests/fuzz/corpus_onnx/" .. c[1])
    m:requires_grad_(true)
    local x = fl.randn(table.unpack(c[2]))
    local cf = same_grads("ONNX " .. c[1] .. " made trainable", m, function(a) return m(a):pow(2):mean() end, {x})
    t.ok(#m:parameters() > 0 and cf:stats().backward_graphs == 1,
         ("ONNX %s: its %d initializer(s) get compiled gradients"):format(c[1], #m:parameters()))
  end
end

-- the same entry, another requires_grad pattern: a second pair
do
  local m = nn.Linear(5, 3)
  local f = function(a, b) return fl.cross_entropy(m(a), b) end
  local cf = fl.compile(f)
  local x, y = fl.randn(4, 5), fl.tensor({0, 1, 2, 0})
  cf(x, y):backward()
  local xl = x:detach():requires_grad_()
  m:zero_grad(true)
  cf(xl, y):backward()
  local gx = xl.grad * 1
  xl.grad = nil
  m:zero_grad(true)
  f(xl, y):backward()
  t.ok(close(gx, xl.grad) and cf:stats().backward_graphs == 2,
       ("an input that now requires grad: a second forward/backward pair (%d), the input's gradient eager's"):format(
       cf:stats().backward_graphs))
end

-- an argument the loss does not use (nor its backward)
do
  local m = nn.Linear(3, 2)
  local f = function(a, unused, b) return fl.cross_entropy(m(a), b) end
  local cf = fl.compile(f)
  local x, y = fl.randn(4, 3), fl.tensor({0, 1, 1, 0})
  local _, ge = grads_of(m, f, {x, fl.randn(5), y})
  local _, gc = grads_of(m, f, {x, fl.randn(5), y}, cf)
  t.ok(close(gc[1], ge[1]) and close(gc[2], ge[2]) and cf:stats().backward_graphs == 1,
       "a tensor argument the loss does not read: the backward does not take it")
end

-- a weight the forward reads as w^T and the backward as w is packed once
-- in each layout: steps with unchanged weights make no copy
do
  local m = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 64))
  local x, y = fl.randn(32, 64), (fl.rand(32) * 64):to("int64")
  local cf = fl.compile(function(a, b) return fl.cross_entropy(m(a), b) end)
  for _ = 1, 3 do cf(x, y):backward() end
  local before = fl.blas_info()
  for _ = 1, 5 do cf(x, y):backward() end
  local after = fl.blas_info()
  -- oneDNN's sgemm kernels (a CPU without AVX-512) read the weights in
  -- place and keep no copy (tests/lua/matmul.lua): then none is read
  local keeps = not after.matmul:match(", gemm:")
  t.ok(after.packed_made == before.packed_made and
       (after.packed_calls > before.packed_calls) == (keeps and after.matmul:match("oneDNN") ~= nil),
       ("5 more steps, weights unchanged: %d copies made, %d products read a kept copy (%s)"):format(
       after.packed_made - before.packed_made, after.packed_calls - before.packed_calls, after.matmul))
  m:zero_grad(true)
end

-- ---- compiled training across graph breaks ----------------------------------------
-- a whole training step inside fl.compile: zero_grad, the loss, its
-- backward and the optimizer's step.  Breaks at backward() and at the step;
-- the segment that computes the loss trains as a compiled pair, the step
-- runs its compiled update.  20 steps against eager's.  (The CNN steps
-- with SGD: a convolution's bias before BatchNorm has a gradient of zero
-- up to rounding, which Adam's normalization would blow up to lr.)
local function full_step_case(name, make, data, steps, optimizer)
  local function train(compiled)
    fl.manual_seed(21)
    local m = make()
    local opt = optimizer(m:parameters())
    local f = function(a, b)
      opt:zero_grad()
      local loss = fl.cross_entropy(m(a), b)
      loss:backward()
      opt:step()
      return loss
    end
    local step = compiled and fl.compile(f) or f
    local x, y = data()
    local losses = {}
    for i = 1, steps do losses[i] = step(x, y):item() end
    return m, losses, step
  end
  local me, le = train(false)
  local mc, lc, step = train(true)
  local worst, lworst = 0, 0
  for i, p in ipairs(me:parameters()) do worst = math.max(worst, maxdiff(mc:parameters()[i], p)) end
  for i = 1, steps do lworst = math.max(lworst, math.abs(lc[i] - le[i])) end
  local s = step:stats()
  t.ok(worst <= 1e-4 and lworst <= 1e-4 and s.backward_graphs == 1 and s.training_calls == steps and
       s.graph_breaks == 2 and #s.training_eager == 0,
       ("%s: %d steps of zero_grad, loss, backward and the optimizer inside fl.compile equal eager's "
        .. "(parameters within %.3g, losses within %.3g); %d pair, %d training calls, %d breaks"):format(
       name, steps, worst, lworst, s.backward_graphs, s.training_calls, s.graph_breaks))
  return me, mc, step
end

do
  full_step_case("MLP", function() return nn.Sequential(nn.Linear(12, 32), nn.GELU(), nn.Linear(32, 4)) end,
    function() return fl.randn(16, 12), fl.tensor({0, 1, 2, 3, 0, 1, 2, 3, 0, 1, 2, 3, 0, 1, 2, 3}) end, 20,
    function(ps) return fl.optim.AdamW(ps, {lr = 1e-2}) end)
  local me, mc = full_step_case("CNN with BatchNorm in training", function()
      local m = fl.models.cnn{channels = {3, 4, 8}, classes = 3, input = 8}
      m:train()
      return m
    end, function() return fl.randn(4, 3, 8, 8), fl.tensor({0, 2, 1, 1}) end, 6,
    function(ps) return fl.optim.SGD(ps, {lr = 0.05, momentum = 0.9}) end)
  local worst = 0
  local be, bc = me:state_dict(), mc:state_dict()
  for k, v in pairs(be) do
    if k:find("running") then worst = math.max(worst, maxdiff(bc[k], v)) end
  end
  t.ok(worst <= 1e-5, ("the BatchNorm running statistics after 6 compiled steps equal eager's (%.3g)"):format(worst))
end

-- steady compiled steps reuse their memory: the backward's gradients go
-- straight to the parameters (no copy), and the optimizer lets go of its
-- handles on them and the forward of its handles on the saved values, so
-- zero_grad and the backward free them at once, not at the next
-- collection (before: 30 fresh 4 MiB-class mappings in 10 steps, each
-- page faulted in again)
do
  fl.manual_seed(23)
  local m = nn.Sequential(nn.Linear(512, 1024), nn.ReLU(), nn.Linear(1024, 256))
  local opt = fl.optim.AdamW(m:parameters(), {lr = 1e-3})
  local step = fl.compile(function(a, b)
    opt:zero_grad()
    local l = fl.cross_entropy(m(a), b)
    l:backward()
    opt:step()
    return l
  end)
  local x, y = fl.randn(128, 512), (fl.rand(128) * 256):to("int64")
  for _ = 1, 4 do step(x, y) end
  local h0 = fl.host_pool_info()
  for _ = 1, 10 do step(x, y) end
  local h1 = fl.host_pool_info()
  t.ok(h1.limit == 0 or h1.maps - h0.maps <= 2,
       ("10 steady compiled steps map %d fresh host buffers (%d reused)%s"):format(h1.maps - h0.maps,
       h1.reuses - h0.reuses, h1.limit == 0 and "; no pool in this build" or ""))
end

-- a module's fields changed between calls of a compiled whole step (a
-- dropout's p, then eval()): the replay diverges and records again from
-- the matched prefix, whose parameters still get their gradients (the
-- rebuilt prefix once lost their requires_grad: no gradient for the first
-- layer, its weights never moved)
do
  local function run(compiled)
    fl.manual_seed(25)
    local drop = nn.Dropout(0.2)
    local m = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), drop, nn.Linear(16, 3))
    m:train()
    local opt = fl.optim.SGD(m:parameters(), {lr = 0.1})
    local f = function(a, b)
      opt:zero_grad()
      local l = fl.cross_entropy(m(a), b)
      l:backward()
      opt:step()
      return l
    end
    local step = compiled and fl.compile(f) or f
    fl.manual_seed(26)
    local x, y = fl.randn(6, 8), fl.tensor({0, 1, 2, 0, 1, 2})
    local losses = {}
    for i = 1, 6 do
      if i == 3 then drop.p = 0.5 end
      if i == 5 then m:eval() end
      losses[i] = step(x, y):item()
    end
    return losses, m
  end
  local le, me = run(false)
  local lc, mc = run(true)
  local worst = 0
  for i = 1, 6 do worst = math.max(worst, math.abs(lc[i] - le[i])) end
  for i, p in ipairs(me:parameters()) do worst = math.max(worst, maxdiff(mc:parameters()[i], p)) end
  t.ok(worst <= 1e-5, ("a dropout's p changed, then eval(), between compiled whole steps: losses and "
       .. "parameters equal eager's (worst %.3g)"):format(worst))
end

-- a break before the loss in a segment that needs no gradient, the loss
-- returned and backpropagated outside; under fl.no_grad no history
do
  fl.manual_seed(22)
  local m = nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 2))
  local f = function(a, b)
    local scale = a:abs():amax():item()       -- a break; a needs no gradient
    return fl.cross_entropy(m(a / scale), b)
  end
  local x, y = fl.randn(5, 6), fl.tensor({0, 1, 1, 0, 1})
  local cf = fl.compile(f)
  local ok = calls_agree(m, f, cf, {x, y}, 3)
  local s = cf:stats()
  t.ok(ok and s.backward_graphs == 1 and s.training_calls == 3 and #s.training_eager == 0,
       ("a break in a segment without gradients: the loss's segment trains compiled, 3 calls "
        .. "with eager's gradients (%d pair)"):format(s.backward_graphs))
  fl.no_grad(function()
    local l = cf(x, y)
    t.ok(not l.requires_grad and math.abs(l:item() - f(x, y):item()) <= 1e-5,
         "the same function under fl.no_grad: its loss without a history")
  end)
end

-- a loss returned with an activation, in one graph and with a break while
-- the activation is alive: gradients through both (the loss scaled, the
-- activation weighted, either alone) reach the parameters as eager's, the
-- activation's through the joint graph's tangents
do
  for _, brk in ipairs{false, true} do
    fl.manual_seed(24)
    local m = nn.Sequential(nn.Linear(4, 8), nn.GELU(), nn.Linear(8, 3))
    local f = function(a, b)
      local out = m(a)
      local loss = fl.cross_entropy(out, b)
      if brk and loss:item() < 0 then loss = loss * 2 end   -- a break while out is alive
      return loss, out
    end
    local x, y, T = fl.randn(5, 4), fl.tensor({0, 2, 1, 1, 0}), fl.randn(5, 3)
    local cf = fl.compile(f)
    local what = brk and "a break while the activation is alive" or "one graph"
    local ways = {
      {"3 * loss + sum(out * T)", function(l, out) return l * 3 + (out * T):sum() end},
      {"sum(out * T) alone", function(_, out) return (out * T):sum() end},
      {"loss alone", function(l) return l end},
    }
    for _, w in ipairs(ways) do
      local worst, ok = 0, true
      for _ = 1, 2 do
        local got = {}
        for k, fn in ipairs{f, cf} do
          m:zero_grad(true)
          local l, out = fn(x, y)
          w[2](l, out):backward()
          got[k] = {}
          for i, p in ipairs(m:parameters()) do got[k][i] = p.grad and p.grad * 1 or false end
        end
        for i = 1, #got[1] do
          local good, d = close(got[2][i], got[1][i])
          ok = ok and good
          worst = math.max(worst, d)
        end
      end
      t.ok(ok and cf:stats().backward_graphs == 1 and #cf:stats().training_eager == 0,
           ("%s, backward of %s: compiled gradients are eager's (max diff %.2g), one pair"):format(what, w[1], worst))
    end
    m:zero_grad(true)
  end
end

-- ---- the partition option ------------------------------------------------------------
do
  fl.manual_seed(6)
  local m = nn.Sequential(nn.Linear(8, 32), nn.GELU(), nn.Linear(32, 2))
  local x, y = fl.randn(4, 8), fl.tensor({0, 1, 1, 0})
  local f = function(a, b) return fl.cross_entropy(m(a), b) end
  local _, ge = grads_of(m, f, {x, y})
  local saved = {}
  for _, pol in ipairs{"mincut", "save_all", "recompute_all"} do
    local cf = fl.compile(f, {partition = pol})
    local _, gc = grads_of(m, f, {x, y}, cf)
    local ok = true
    for i = 1, #ge do ok = ok and gc[i] and close(gc[i], ge[i]) end
    saved[pol] = cf:stats().saved_bytes
    t.ok(ok and cf:training()[1].partition.policy == pol,
         ("partition = %s: the same gradients, %d bytes saved"):format(pol, saved[pol]))
  end
  t.ok(saved.mincut < saved.save_all, ("mincut saves fewer bytes than save_all (%d < %d)"):format(
       saved.mincut, saved.save_all))
  t.raises(function() fl.compile(f, {partition = "some"}) end, "partition must be one of mincut, save_all, recompute_all",
           "an unknown partition policy is an error naming the choices")
end

-- no tape left behind: 50 compiled steps free what they record
do
  local m = nn.Linear(6, 2)
  local cf = fl.compile(function(a) return m(a):pow(2):mean() end)
  local x = fl.randn(3, 6)
  for _ = 1, 3 do cf(x):backward() end
  collectgarbage(); collectgarbage()
  local before = fl._autograd_live()
  for _ = 1, 50 do cf(x):backward() end
  m.weight.grad, m.bias.grad = nil, nil
  collectgarbage(); collectgarbage()
  t.ok(fl._autograd_live() <= before, ("50 compiled steps leave no tape alive (%d fns before, %d after)"):format(
       before, fl._autograd_live()))
end

-- ---- segments chained across breaks -----------------------------------------------
-- Activations cross two breaks (a branch on a value, a print of one), an
-- argument requires grad from the third call on: every segment with
-- values that need gradients is a compiled pair whose backward hands the
-- gradients of its inputs on to the segment they came from (or to the
-- argument's .grad), as eager's tape does.  Five calls, fresh random
-- data each, against eager's gradients.
do
  fl.manual_seed(31)
  local m1, m2, m3 = nn.Linear(6, 8), nn.Linear(8, 8), nn.Linear(8, 3)
  local ms = {m1, m2, m3}
  local function f(a, b)
    local h = m1(a):tanh()
    if h:mean():item() > 10 then h = h * 0.5 end         -- break 1
    local u = m2(h):gelu() * b
    local note = ("%.3f"):format(u:abs():amax():item())  -- break 2
    return (m3(u + h):pow(2)):mean() + (#note > 0 and 0 or 1), u:sum()
  end
  local cf = fl.compile(f)
  local worst, calls = 0, 5
  for i = 1, calls do
    local a, b = fl.randn(5, 6), fl.rand(5, 8)
    if i >= 3 then a:requires_grad_() end
    for _, m in ipairs(ms) do m:zero_grad(true) end
    local l, s2 = f(a, b)
    local total = l + s2 * 0.1
    total:backward()
    local want = {}
    for _, m in ipairs(ms) do want[#want + 1] = m.weight.grad * 1; want[#want + 1] = m.bias.grad * 1 end
    local wa = a.requires_grad and a.grad * 1
    a.grad = nil
    for _, m in ipairs(ms) do m:zero_grad(true) end
    local lc, sc = cf(a, b)
    local totalc = lc + sc * 0.1
    totalc:backward()
    local k = 0
    local function diff(g, w) return g and maxdiff(g, w) or math.huge end   -- none reached it: wrong
    for _, m in ipairs(ms) do
      k = k + 1; worst = math.max(worst, diff(m.weight.grad, want[k]))
      k = k + 1; worst = math.max(worst, diff(m.bias.grad, want[k]))
    end
    worst = math.max(worst, math.abs(lc:item() - l:item()))
    if wa then worst = math.max(worst, diff(a.grad, wa)) end
  end
  local s = cf:stats()
  t.ok(worst <= 1e-5 and s.graph_breaks == 2 and #s.training_eager == 0 and s.backward_graphs >= 3,
       ("segments chained across two breaks, an argument requiring grad from the third call: %d calls "
        .. "give eager's losses and gradients (within %.3g); %d compiled pairs, %d pair runs"):format(
       calls, worst, s.backward_graphs, s.training_calls))
  -- under fl.no_grad the same segments run their forwards, no history
  local ln = fl.no_grad(function() return cf(fl.randn(5, 6), fl.rand(5, 8)) end)
  t.ok(not ln.requires_grad, "under fl.no_grad a chained function's result has no history")
end

t.done()
