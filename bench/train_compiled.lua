-- train_compiled.lua -- a training step compiled by hand from the joint
-- graph (g:joint(), j:partition, each half fused and compiled for the CPU)
-- against fuselab's eager step (forward, cross-entropy, backward, AdamW),
-- same weights and data, in one process, alternating which runs first.
--   build/fuselab bench/train_compiled.lua [mlp|cnn|gpt] [policy] [rounds]
-- Prints per round the median step of 10 after two warm-up steps, the
-- last losses of both (equal: the same kernels in the same order) and the
-- saved bytes of the policy against eager autograd's.
local name, policy, rounds = arg[1] or "mlp", arg[2] or "mincut", tonumber(arg[3]) or 3
local nn = fl.nn
local models = {
  mlp = function() return nn.Sequential(nn.Linear(512, 2048), nn.ReLU(), nn.Linear(2048, 512)) end,
  cnn = function() return fl.models.cnn{channels = {3, 16, 32}, classes = 10, input = 32} end,
  -- no dropout: the same model as the eager bench
  gpt = function()
    local m = fl.models.transformer{vocab = 512, d = 128, heads = 4, layers = 2, seq = 64}
    m:eval()
    return m
  end,
}
assert(models[name], "usage: train_compiled.lua [mlp|cnn|gpt] [mincut|save_all|recompute_all] [rounds]")
fl.manual_seed(1)
local x, y
if name == "mlp" then x, y = fl.randn(256, 512), (fl.rand(256) * 512):to("int64")
elseif name == "cnn" then x, y = fl.randn(32, 3, 32, 32), (fl.rand(32) * 10):to("int64")
else x, y = (fl.rand(16, 64) * 512):to("int64"), (fl.rand(16, 64) * 512):to("int64") end

local function loss_of(m)
  if name == "gpt" then return function(a, b) return fl.cross_entropy(m(a):reshape(-1, 512), b:reshape(-1)) end end
  return function(a, b) return fl.cross_entropy(m(a), b) end
end

local function run(compiled, steps)
  fl.manual_seed(2)
  local m = models[name]()
  local f, params = loss_of(m), m:parameters()
  local opt = fl.optim.AdamW(params, {lr = 1e-3})
  local fwk, bwk, info, step
  if compiled then
    local t0 = fl.now()
    local fw, bw
    fw, bw, info = fl.capture(f, x, y):joint():partition{policy = policy}
    fwk, bwk = fw:fuse():codegen("cpu"), bw:fuse():codegen("cpu")
    info.compile_ms = (fl.now() - t0) * 1e3
    -- the backward takes the saved graph inputs, then what the forward saved
    step = function()
      local outs = table.pack(fwk:run(x, y))
      local args, k = {}, 2
      for _, s in ipairs(info.saved) do
        if s.node < 2 then args[#args + 1] = ({x, y})[s.node + 1] else args[#args + 1] = outs[k]; k = k + 1 end
      end
      local grads = table.pack(bwk:run(table.unpack(args)))
      for i, p in ipairs(params) do p.grad = grads[i] end
      return outs[1]
    end
  else
    step = function() local l = f(x, y); l:backward(); return l end
  end
  local times, loss = {}, nil
  for i = 1, steps + 2 do
    local t0 = fl.now()
    opt:zero_grad()
    loss = step()
    opt:step()
    loss = loss:item()
    if i > 2 then times[#times + 1] = (fl.now() - t0) * 1e3 end
  end
  return fl.measure(times).median_ms, loss, info
end

for r = 1, rounds do
  local first = r % 2 == 1
  local te, le, tc, lc, info
  if first then te, le = run(false, 10); tc, lc, info = run(true, 10)
  else tc, lc, info = run(true, 10); te, le = run(false, 10) end
  print(("%s %s round %d: eager %.2f ms, compiled %.2f ms, eager/compiled %.2f; losses %.6f %.6f; "
         .. "saved %d B (eager autograd %d B), compile %.0f ms"):format(
         name, policy, r, te, tc, te / tc, le, lc, info.saved_bytes, info.eager_saved_bytes, info.compile_ms))
end
