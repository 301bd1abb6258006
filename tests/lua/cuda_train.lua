-- cuda_train.lua -- training on CUDA: a loss's joint graph partitioned,
-- its forward and backward generated as CUDA and run, against eager
-- autograd on the CPU (an MLP, a CNN with BatchNorm in training, a GPT
-- with dropout: the device draws the CPU's masks); eager autograd and
-- in-place writes on device tensors; fl.compile training a model moved
-- to the device, its optimizer's update compiled there, step for step
-- against the same training on the CPU.  Needs a device: on a machine
-- without one it runs on the CUDA emulator (tests/gpu/emu/lua.sh), else
-- it skips.
--
-- Tolerance: float32 sums reordered on the device, the GPU differential
-- test's: |got - want| <= 1e-4 + 2e-3 |want|.
local fl = fl or require "fuselab"
local t = require "tap"
local nn = fl.nn

local have, why = fl.cuda_available()
if not have then
  t.skip("no CUDA device (" .. tostring(why) .. "); the emulator runs this file", 1)
  t.done()
  return
end

local function close(a, b) return fl.allclose(a:cpu(), b:cpu(), 2e-3, 1e-4) end

-- fw and bw of f's joint graph on cuda; the gradients against eager's
local function check(name, m, f, args, seed)
  m:zero_grad(true)
  fl.manual_seed(seed)
  local loss = f(table.unpack(args))
  loss:backward()
  local want = {}
  for i, p in ipairs(m:parameters()) do want[i] = p.grad * 1 end
  m:zero_grad(true)
  fl.manual_seed(seed)
  local fw, bw, info = fl.capture(f, table.unpack(args)):joint():partition()
  local fwk, bwk = fw:fuse():codegen("cuda"), bw:fuse():codegen("cuda")
  fl.manual_seed(seed)
  local outs = table.pack(fwk:run(table.unpack(args)))
  local saved, k = {}, info.results + 1
  for i, s in ipairs(info.saved) do
    if s.input then saved[i] = args[s.input] else saved[i] = outs[k]; k = k + 1 end
  end
  local grads = table.pack(bwk:run(table.unpack(saved)))
  local ok = close(outs[1], loss) and grads.n == #want
  for i = 1, #want do ok = ok and grads[i] ~= nil and close(grads[i], want[i]) end
  t.ok(ok, ("%s: the forward and backward compiled for CUDA give eager's loss (%.6f) and %d gradients"):format(
       name, loss:item(), #want))
end

do
  fl.manual_seed(1)
  local m = nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 4))
  check("MLP with GELU", m, function(a, b) return fl.cross_entropy(m(a), b) end,
        {fl.randn(8, 16), (fl.rand(8) * 4):to("int64")}, 3)
end

do
  fl.manual_seed(2)
  local m = fl.models.cnn{channels = {3, 4, 8}, classes = 3, input = 8}
  m:train()
  check("CNN with BatchNorm in training", m, function(a, b) return fl.cross_entropy(m(a), b) end,
        {fl.randn(2, 3, 8, 8), fl.tensor({0, 2})}, 4)
end

do
  fl.manual_seed(3)
  local m = fl.models.transformer{vocab = 16, d = 16, heads = 2, layers = 1, seq = 8, dropout = 0.1}
  m:train()
  local ids = (fl.rand(2, 8) * 16):to("int64")
  check("GPT with dropout", m, function(a, b) return fl.cross_entropy(m(a):reshape(-1, 16), b:reshape(-1)) end,
        {ids, ids}, 5)
end

-- the optimizer's compiled update called with cuda copies of the
-- arguments it was compiled for on the CPU: one kernel per parameter
-- generated for CUDA, against the same call on the CPU
do
  fl.manual_seed(6)
  local ps = {fl.randn(8, 4):requires_grad_(), fl.randn(8):requires_grad_()}
  local opt = fl.optim.AdamW(ps, {lr = 1e-2, amsgrad = true})
  local step = fl.compile(function() opt:step() end)
  for _ = 1, 2 do
    for _, p in ipairs(ps) do p.grad = fl.randn(p.shape) end
    step()
  end
  local fn = opt:compiled()[1].fn
  local args = {fl.tensor({{-0.01, 0.9, 0.999}, {-0.02, 0.8, 0.999}})}
  for _, p in ipairs(ps) do
    local st = opt.state[p]
    for _, v in ipairs{p:detach(), fl.randn(p.shape), st.exp_avg, st.exp_avg_sq, st.max_exp_avg_sq} do
      args[#args + 1] = v * 1
    end
  end
  local dev = {}
  for i, a in ipairs(args) do dev[i] = a:to("cuda") end
  fn(table.unpack(args))
  fn(table.unpack(dev))
  local ok = true
  for i = 1, #args do ok = ok and close(dev[i], args[i]) end
  local s = fn:stats()
  t.ok(ok and s.compiles == 2 and s.kernels == 4,
       ("AdamW's compiled update on the device: parameters and state written as on the CPU "
        .. "(%d compiles, %d kernels: one per parameter in each)"):format(s.compiles, s.kernels))
end

-- eager autograd on the device: the tape records device ops, the
-- backward runs its graph there (one generated kernel per op), .grad
-- stays on the device and accumulates across backwards
do
  fl.manual_seed(7)
  local a, b = fl.randn(5, 3), fl.randn(3, 4)
  local ad, bd = a:cuda():requires_grad_(), b:cuda():requires_grad_()
  local ac, bc = a:requires_grad_(), b:requires_grad_()
  local function f(x, y) return ((x:matmul(y)):gelu() * 2 + x:sum(2, true)):softmax(2):log():sum() end
  f(ad, bd):backward()
  f(ac, bc):backward()
  local first = ad.grad.device == "cuda" and bd.grad.device == "cuda" and close(ad.grad, ac.grad)
                and close(bd.grad, bc.grad)
  f(ad, bd):backward()
  t.ok(first and close(ad.grad, ac.grad * 2) and close(bd.grad, bc.grad * 2),
       "eager backward on the device: gradients on cuda equal the CPU's, and accumulate")
  t.ok(f(ad, bd).grad_fn ~= nil and fl.no_grad(f, ad, bd).grad_fn == nil,
       "device ops record on the tape in grad mode only")
  t.raises(function() ad.grad = fl.zeros(5, 3) end, "the assigned gradient is on cpu, the tensor on cuda",
           "a gradient from the other device is refused")
end

-- rules that build constants of ones (avg_pool2d's window counts and
-- sums) build them on the device from the gradient: eager and compiled
do
  fl.manual_seed(11)
  local x = fl.randn(2, 3, 7, 6)
  local xd, xc = x:cuda():requires_grad_(), x * 1
  xc:requires_grad_()
  local function f(v)
    return (v:avg_pool2d(3, {stride = 2, padding = 1, ceil_mode = true, count_include_pad = false}) * 2):sum()
  end
  f(xd):backward()
  f(xc):backward()
  local eager = close(xd.grad, xc.grad)
  xd.grad = nil
  local cf = fl.compile(f)
  cf(xd):backward()
  t.ok(eager and cf:stats().backward_graphs == 1 and close(xd.grad, xc.grad),
       "avg_pool2d's backward on the device (padding, ceil mode, count_include_pad off), eager and compiled")
end

-- segments chained across a break on the device: the second segment's
-- compiled backward hands the activation's gradient to the first's
do
  fl.manual_seed(12)
  local m1, m2 = nn.Linear(6, 8), nn.Linear(8, 3)
  fl.manual_seed(12)
  local d1, d2 = nn.Linear(6, 8):cuda(), nn.Linear(8, 3):cuda()
  local function f(a1, a2)
    return function(x)
      local h = a1(x):tanh()
      if h:mean():item() > 10 then h = h * 0.5 end   -- a break
      return a2(h):pow(2):mean()
    end
  end
  local x = fl.randn(5, 6)
  f(m1, m2)(x):backward()
  local cf = fl.compile(f(d1, d2))
  cf(x:cuda()):backward()
  local s = cf:stats()
  t.ok(close(d1.weight.grad, m1.weight.grad) and close(d2.weight.grad, m2.weight.grad)
       and s.backward_graphs == 2 and s.backend == "cuda" and #s.training_eager == 0,
       "two segments across a break, compiled on the device, chain the gradient: the CPU's")
end

-- in-place writes into device tensors: broadcast, converted, from either
-- device; a non-contiguous destination is refused by name
do
  local u = fl.zeros(2, 3):cuda()
  u:copy_(fl.tensor({1, 2, 3}))
  local ok = u.device == "cuda" and fl.allclose(u:cpu(), fl.tensor({{1, 2, 3}, {1, 2, 3}}), 0, 0)
  u:add_(fl.ones(3):cuda()):mul_(2)
  ok = ok and fl.allclose(u:cpu(), fl.tensor({{4, 6, 8}, {4, 6, 8}}), 0, 0)
  u:fill_(2.5)
  ok = ok and fl.allclose(u:cpu(), fl.full({2, 3}, 2.5), 0, 0)
  u:zero_()
  ok = ok and fl.allclose(u:cpu(), fl.zeros(2, 3), 0, 0)
  local i = fl.zeros(3, {dtype = "int64"}):cuda()
  i:copy_(fl.tensor({1.7, 2.2, -3.9}):cuda())
  ok = ok and fl.allclose(i:cpu(), fl.tensor({1, 2, -3}), 0, 0)
  local r = fl.arange(6):to("float32")
  local rd = r:cuda()
  r:narrow(1, 2, 4):copy_(r:narrow(1, 1, 4) * 1)
  rd:narrow(1, 2, 4):copy_(rd:narrow(1, 1, 4))   -- overlapping: copied out first
  ok = ok and fl.allclose(rd:cpu(), r, 0, 0)
  local h = fl.zeros(3)
  h:copy_(fl.tensor({5, 6, 7}):cuda())
  t.ok(ok and fl.allclose(h, fl.tensor({5, 6, 7}), 0, 0),
       "copy_, fill_, zero_, add_ and mul_ write device tensors (broadcast, to int64, from an overlapping view, device to host)")
  local v = fl.zeros(3, 4):cuda():transpose(1, 2)
  t.raises(function() v:add_(1) end, "non%-contiguous tensor on cuda",
           "an in-place write into a non-contiguous device tensor is refused by name")
end

-- fl.compile training a model on the device: the loss's forward and
-- backward compiled for CUDA, the optimizer's update compiled there too,
-- step for step against eager training of the same model on the CPU.  A
-- parameter whose gradient is zero in exact arithmetic gets rounding
-- noise instead, whose sign AdamW turns into a full step either way: the
-- CNN trains with SGD (its conv biases feed a BatchNorm).  (A GPT's
-- forward and backward with dropout on the device are the third case
-- above; its whole training run here cost 11 s of the emulator's
-- compiles.)
local function train_both(name, make, data, opt, nsteps)
  local mc, md = make(), make():cuda()
  mc:train(); md:train()
  local args, dargs = data(), {}
  for i, a in ipairs(args) do dargs[i] = a:cuda() end
  local function loss_of(m) return function(a, b) return fl.cross_entropy(m(a):reshape(b:numel(), -1), b:reshape(-1)) end end
  local oc, od = opt(mc:parameters()), opt(md:parameters())
  local lossc, lossd = loss_of(mc), fl.compile(loss_of(md))
  local stepd = fl.compile(function() od:step() end)
  local losses = true
  for i = 1, nsteps do
    fl.manual_seed(100 + i)
    oc:zero_grad()
    local l = lossc(table.unpack(args))
    l:backward()
    oc:step()
    fl.manual_seed(100 + i)
    od:zero_grad()
    local ld = lossd(table.unpack(dargs))
    ld:backward()
    stepd()
    losses = losses and math.abs(l:item() - ld:item()) <= 1e-4 + 2e-3 * math.abs(l:item())
  end
  local same = true
  for k, v in pairs(mc:state_dict()) do
    local dv = md:state_dict()[k]
    same = same and dv.device == "cuda" and close(dv:to(v.dtype), v)
  end
  local s, kernels, updates = lossd:stats(), 0, true
  for _, c in ipairs(od:compiled()) do
    local us = c.fn:stats()
    updates = updates and us.backend == "cuda" and us.fallbacks == 0
    kernels = kernels + us.kernels
  end
  t.ok(losses and same, ("%s: %d compiled training steps on the device give the CPU's losses, "
       .. "parameters and buffers"):format(name, nsteps))
  t.ok(s.backend == "cuda" and s.compiles == 1 and s.backward_graphs == 1 and #s.training_eager == 0
       and s.training_calls == nsteps and updates and kernels == #md:parameters(),
       ("%s: one compile, its forward and backward and the optimizer's update (%d kernels, one per "
        .. "parameter) on cuda (%s)"):format(name, kernels, s.training_eager[1] or "nothing eager"))
end

train_both("MLP with GELU, AdamW", function()
  fl.manual_seed(8)
  return nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 4))
end, function() return {fl.randn(8, 16), (fl.rand(8) * 4):to("int64")} end,
  function(ps) return fl.optim.AdamW(ps, {lr = 1e-2}) end, 2)

train_both("CNN with BatchNorm, SGD with momentum", function()
  fl.manual_seed(9)
  return fl.models.cnn{channels = {3, 4, 8}, classes = 4, input = 8}
end, function() return {fl.randn(2, 3, 8, 8), fl.tensor({0, 2})} end,
  function(ps) return fl.optim.SGD(ps, {lr = 0.1, momentum = 0.9}) end, 2)

t.done()
