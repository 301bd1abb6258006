-- fl_train.lua DIR -- the fuselab half of torch_train.sh: trains small
-- models and writes into DIR, as safetensors, everything torch_train.py
-- compares with PyTorch doing the same from the same start:
--   <model>_init   the model's state_dict before anything ran
--   <model>_data   the inputs and the class targets
--   <model>_grad   every parameter's gradient of the first loss (the loss
--                  in the metadata)
--   <model>_<opt>  the state_dict after 5 steps of optimizer <opt> (the
--                  5 losses in the metadata)
--   ce_<case>      a cross-entropy case: logits, targets, options, the
--                  loss and the logits' gradient
--   sched          the lr sequences of StepLR and CosineAnnealingLR
-- Run as: fuselab fl_train.lua DIR

local fl = rawget(_G, "fl") or require "fuselab"
local nn = fl.nn
local dir = (...) or (arg and arg[1])
if not dir then
  io.stderr:write("usage: fuselab fl_train.lua DIR\n")
  os.exit(2)
end

local function num(v) return string.format("%.17g", v) end

-- Class ids in [0, n): uniform floats scaled and truncated.
local function classes(shape, n)
  return (fl.rand(shape) * n):to("int64"):clamp(0, n - 1)
end

-- The optimizers compared, by name; torch_train.py builds the same.
local optimizers = {
  {"sgd_momentum", function(m) return fl.optim.SGD(m, {lr = 0.1, momentum = 0.9}) end},
  {"sgd_nesterov_wd", function(m)
    return fl.optim.SGD(m, {lr = 0.05, momentum = 0.9, nesterov = true, weight_decay = 0.01})
  end},
  {"adam", function(m) return fl.optim.Adam(m, {lr = 0.01}) end},
  {"adamw", function(m) return fl.optim.AdamW(m, {lr = 0.01, weight_decay = 0.1}) end},
  {"adamw_amsgrad", function(m) return fl.optim.AdamW(m, {lr = 0.01, betas = {0.8, 0.99}, amsgrad = true}) end},
}

-- One model: its start, its first gradient, and 5 steps of each optimizer
-- from that same start.  loss(m, data) gives the loss.
local function run(name, make, data, loss)
  fl.manual_seed(1)
  local m = make()
  local init = dir .. "/" .. name .. "_init.safetensors"
  fl.save_weights(m, init)
  fl.save_safetensors(data, dir .. "/" .. name .. "_data.safetensors")
  local l = loss(m, data)
  l:backward()
  local grads, map = {}, m:named_parameters()
  for k, p in pairs(map) do grads[k] = p.grad end
  fl.save_safetensors(grads, dir .. "/" .. name .. "_grad.safetensors", {loss = num(l:item())})
  for _, o in ipairs(optimizers) do
    local mo = make()
    fl.load_weights(mo, init)
    local opt = o[2](mo)
    local losses = {}
    for step = 1, 5 do
      opt:zero_grad()
      local ls = loss(mo, data)
      ls:backward()
      opt:step()
      losses[step] = num(ls:item())
    end
    fl.save_safetensors(mo, dir .. "/" .. name .. "_" .. o[1] .. ".safetensors",
                        {losses = table.concat(losses, ",")})
  end
end

-- (a) an MLP: Linear - ReLU - Linear, cross-entropy
fl.manual_seed(100)
run("mlp", function() return fl.models.mlp{sizes = {6, 16, 5}} end,
    {x = fl.randn(8, 6), y = classes({8}, 5)},
    function(m, d) return fl.cross_entropy(m(d.x), d.y) end)

-- (b) a CNN: Conv2d - BatchNorm2d (training) - ReLU - MaxPool2d, then
-- Conv2d - ReLU - MaxPool2d, Flatten - Linear; its state_dict carries the
-- running statistics.  The conv before the batch norm has no bias, as
-- usual: the normalization subtracts it again, so its gradient would be 0
-- in exact arithmetic and rounding noise in float32, which Adam scales up
-- to whole steps of arbitrary sign (in PyTorch as here).
fl.manual_seed(200)
run("cnn", function()
      return nn.Sequential(nn.Conv2d(3, 4, 3, {padding = 1, bias = false}), nn.BatchNorm2d(4), nn.ReLU(),
                           nn.MaxPool2d(2), nn.Conv2d(4, 6, 3, {padding = 1}), nn.ReLU(), nn.MaxPool2d(2),
                           nn.Flatten(), nn.Linear(6 * 2 * 2, 5))
    end,
    {x = fl.randn(4, 3, 8, 8), y = classes({4}, 5)},
    function(m, d) return fl.cross_entropy(m(d.x), d.y) end)

-- (c) a 2-layer GPT, next-token cross-entropy
fl.manual_seed(300)
local V, T = 13, 8
local tokens = classes({2, T + 1}, V)
run("gpt", function() return fl.models.transformer{vocab = V, d = 16, heads = 2, layers = 2, seq = T} end,
    {idx = tokens:narrow(2, 1, T):contiguous(), tgt = tokens:narrow(2, 2, T):contiguous()},
    function(m, d)
      local logits = m(d.idx)
      return fl.cross_entropy(logits:reshape(2 * T, V), d.tgt:reshape(2 * T))
    end)

-- cross_entropy's options, each case's loss and the logits' gradient
fl.manual_seed(400)
local function ce_case(name, x, y, opts, extra)
  local xg = x:detach():requires_grad_()
  local l = fl.cross_entropy(xg, y, opts)
  local seed = l:dim() == 0 and nil or fl.randn(l.shape)
  if seed then l:backward(seed) else l:backward() end
  local ts = {x = x, y = y, grad = xg.grad, loss = l:detach()}
  if seed then ts.seed = seed end
  if opts.weight then ts.weight = opts.weight end
  local meta = {}
  for k, v in pairs(opts) do if not fl.is_tensor(v) then meta[k] = tostring(v) end end
  for k, v in pairs(extra or {}) do meta[k] = v end
  fl.save_safetensors(ts, dir .. "/ce_" .. name .. ".safetensors", meta)
end
local logits = fl.randn(7, 5) * 2
local tgt = fl.tensor({0, 4, -100, 2, 2, 1, -100}, {dtype = "int64"})
ce_case("ignore", logits, tgt, {})
ce_case("ignore_smooth", logits, tgt, {label_smoothing = 0.1})
ce_case("weight_smooth_ignore2", logits, fl.tensor({0, 4, 2, 2, 3, 1, 2}, {dtype = "int64"}),
        {weight = fl.rand(5) + 0.5, label_smoothing = 0.25, ignore_index = 2})
ce_case("sum_smooth", logits, tgt, {reduction = "sum", label_smoothing = 0.3})
ce_case("none_weight", logits, tgt, {reduction = "none", weight = fl.rand(5) + 0.5})
ce_case("nd", fl.randn(2, 4, 3, 2), classes({2, 3, 2}, 4), {label_smoothing = 0.05})
ce_case("probs_smooth", logits, fl.randn(7, 5):softmax(2), {label_smoothing = 0.2})

-- the schedulers' lr sequences, 12 steps each
local function lrs(make)
  local opt = fl.optim.SGD({fl.zeros(1, {requires_grad = true})}, {lr = 0.3})
  local s = make(opt)
  local seq = {}
  for _ = 1, 12 do
    seq[#seq + 1] = num(s:get_last_lr()[1])
    s:step()
  end
  return table.concat(seq, ",")
end
fl.save_safetensors({}, dir .. "/sched.safetensors", {
  step = lrs(function(o) return fl.optim.lr_scheduler.StepLR(o, {step_size = 3, gamma = 0.5}) end),
  cosine = lrs(function(o) return fl.optim.lr_scheduler.CosineAnnealingLR(o, {T_max = 5, eta_min = 0.01}) end),
})
print("fl_train.lua: wrote " .. dir)
