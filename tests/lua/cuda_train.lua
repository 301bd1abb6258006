-- cuda_train.lua -- compiled training's programs on CUDA: a loss's joint
-- graph partitioned, its forward and backward generated as CUDA and run,
-- against eager autograd on the CPU (an MLP, a CNN with BatchNorm in
-- training, a GPT with dropout: the device draws the CPU's masks).  Needs a device: on a machine without one it runs on the CUDA
-- emulator (tests/gpu/emu/lua.sh), else it skips.
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

-- the optimizer's compiled update on the device (autograd, and so an
-- optimizer's parameters, live on the CPU: the update it compiled there is
-- called with cuda copies of its arguments, one kernel per parameter
-- generated for CUDA, against the same call on the CPU)
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

t.done()
