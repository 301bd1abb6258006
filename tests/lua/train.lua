-- train.lua -- the training half: losses against their closed forms (and
-- their gradients against the hand-derived ones), each optimizer's update
-- against its formula computed here in double for 3 steps, the lr
-- schedulers' sequences, clip_grad_norm_, state_dict and checkpoint round
-- trips, BatchNorm2d's training statistics, zero_grad, a small MLP that
-- learns, and the errors.
local fl = fl or require "fuselab"
local t = require "tap"
local nn = fl.nn

fl.manual_seed(3)

local function flat(v, out)
  out = out or {}
  if type(v) == "userdata" then v = v:tolist() end
  if type(v) == "table" then for i = 1, #v do flat(v[i], out) end else out[#out + 1] = v end
  return out
end

-- got (tensor or nested list) equal to want within rtol relative to each
-- element's magnitude (atol for elements near 0).
local function close(got, want, rtol, atol, name)
  local g, w = flat(got), flat(want)
  local worst, at = 0, nil
  local ok = #g == #w
  for i = 1, math.min(#g, #w) do
    local err = math.abs(g[i] - w[i])
    local allowed = atol + rtol * math.abs(w[i])
    if not (err <= allowed) then
      ok = false
      if err ~= err or err > worst then worst, at = err, i end
    end
  end
  return t.ok(ok, name) or t.diag(("  %d vs %d values; worst element %s: got %s, want %s"):format(
    #g, #w, tostring(at), tostring(at and g[at]), tostring(at and w[at])))
end

local function T(v) return fl.tensor(v) end
local function ids(v) return fl.tensor(v, {dtype = "int64"}) end

-- reference math in double, on nested Lua lists
local function logsumexp(row)
  local m = -math.huge
  for _, v in ipairs(row) do m = math.max(m, v) end
  local s = 0
  for _, v in ipairs(row) do s = s + math.exp(v - m) end
  return m + math.log(s)
end
local function log_softmax(row)
  local l, out = logsumexp(row), {}
  for i, v in ipairs(row) do out[i] = v - l end
  return out
end
local function sigmoid(x) return 1 / (1 + math.exp(-x)) end

---------------------------------------------------------------------------
-- cross_entropy and nll_loss
---------------------------------------------------------------------------
local X = {{1.0, 2.0, 0.5, -1.0}, {0.3, -0.2, 2.5, 0.0}, {-1.5, 0.7, 0.1, 1.2}}
local Y = {0, 2, 3}
local N, C = 3, 4

do
  local x = fl.tensor(X, {requires_grad = true})
  local loss = fl.cross_entropy(x, ids(Y))
  local want = 0
  for i = 1, N do want = want + logsumexp(X[i]) - X[i][Y[i] + 1] end
  close(loss, want / N, 1e-6, 0, "cross_entropy: mean of logsumexp(x) - x[t]")
  loss:backward()
  -- the gradient: (softmax - onehot) / N
  local g = {}
  for i = 1, N do
    local lp = log_softmax(X[i])
    g[i] = {}
    for c = 1, C do g[i][c] = (math.exp(lp[c]) - (c == Y[i] + 1 and 1 or 0)) / N end
  end
  close(x.grad, g, 1e-5, 1e-7, "cross_entropy backward: (softmax - onehot) / N")

  local none = fl.cross_entropy(T(X), ids(Y), {reduction = "none"})
  local per = {}
  for i = 1, N do per[i] = logsumexp(X[i]) - X[i][Y[i] + 1] end
  close(none, per, 1e-6, 0, "reduction none: one loss per row")
  close(fl.cross_entropy(T(X), ids(Y), {reduction = "sum"}), per[1] + per[2] + per[3], 1e-6, 0,
        "reduction sum")

  -- class weights: the mean divides by the weight of the targets
  local w = {0.5, 1.0, 2.0, 3.0}
  local num, den = 0, 0
  for i = 1, N do
    num = num + w[Y[i] + 1] * per[i]
    den = den + w[Y[i] + 1]
  end
  close(fl.cross_entropy(T(X), ids(Y), {weight = T(w)}), num / den, 1e-6, 0,
        "weight: sum(w[t] * loss) / sum(w[t])")

  -- ignore_index: the row is left out of the sum and the count
  close(fl.cross_entropy(T(X), ids({0, -100, 3})), (per[1] + per[3]) / 2, 1e-6, 0,
        "ignore_index -100: mean over the targets kept")
  close(fl.cross_entropy(T(X), ids({0, 2, 3}), {ignore_index = 0}), (per[2] + per[3]) / 2, 1e-6, 0,
        "ignore_index = 0 (a real class id)")
  close(fl.cross_entropy(T(X), ids({0, -100, 3}), {reduction = "none"}), {per[1], 0, per[3]}, 1e-6, 0,
        "ignore_index with reduction none: 0 there")
  local xi = fl.tensor(X, {requires_grad = true})
  fl.cross_entropy(xi, ids({0, -100, 3})):backward()
  close(xi.grad:narrow(1, 2, 1), {{0, 0, 0, 0}}, 0, 0, "an ignored row gets no gradient")

  -- label smoothing, PyTorch's mix: (1 - ls) * nll + ls / C * mean(-sum_c logp)
  local ls = 0.2
  local smooth = 0
  for i = 1, N do
    local lp = log_softmax(X[i])
    for c = 1, C do smooth = smooth - lp[c] end
  end
  local nll = (per[1] + per[2] + per[3]) / N
  close(fl.cross_entropy(T(X), ids(Y), {label_smoothing = ls}), (1 - ls) * nll + ls / C * smooth / N,
        1e-6, 0, "label_smoothing 0.2")
  -- with weights and an ignored row: both terms divide by the targets' weight
  local tgt = {0, -100, 3}
  local nw, sw, wsum = 0, 0, 0
  for i = 1, N do
    if tgt[i] ~= -100 then
      local lp = log_softmax(X[i])
      nw = nw - w[tgt[i] + 1] * lp[tgt[i] + 1]
      for c = 1, C do sw = sw - w[c] * lp[c] end
      wsum = wsum + w[tgt[i] + 1]
    end
  end
  close(fl.cross_entropy(T(X), ids(tgt), {label_smoothing = ls, weight = T(w)}),
        (1 - ls) * nw / wsum + ls / C * sw / wsum, 1e-6, 0, "label_smoothing with weight and ignore_index")
  local xs = fl.tensor(X, {requires_grad = true})
  fl.cross_entropy(xs, ids(Y), {label_smoothing = ls}):backward()
  local gs = {}
  for i = 1, N do
    local lp = log_softmax(X[i])
    gs[i] = {}
    for c = 1, C do
      local q = (1 - ls) * (c == Y[i] + 1 and 1 or 0) + ls / C
      gs[i][c] = (math.exp(lp[c]) - q) / N
    end
  end
  close(xs.grad, gs, 1e-5, 1e-7, "label smoothing backward: (softmax - smoothed onehot) / N")

  -- probabilities as targets
  local P = {{0.1, 0.2, 0.3, 0.4}, {1, 0, 0, 0}, {0.25, 0.25, 0.25, 0.25}}
  local pw = 0
  for i = 1, N do
    local lp = log_softmax(X[i])
    for c = 1, C do pw = pw - P[i][c] * lp[c] end
  end
  close(fl.cross_entropy(T(X), T(P)), pw / N, 1e-6, 0, "class probabilities as the target")

  -- [N, C, d]: the class dim is dim 2; [C] with a 0-d target
  local x3 = fl.randn(2, 3, 5)
  local y3 = fl.tensor({{0, 1, 2, 1, 0}, {2, 2, 1, 0, 1}}, {dtype = "int64"})
  local flat2 = fl.cross_entropy(x3:permute(1, 3, 2):reshape(10, 3), y3:reshape(10))
  close(fl.cross_entropy(x3, y3), flat2:item(), 1e-6, 0, "[N, C, d]: the same as [N*d, C]")
  local lp1 = log_softmax(X[1])
  close(fl.cross_entropy(T(X[1]), ids(2)), -lp1[3], 1e-6, 0, "[C] logits with a 0-d target")

  local lp = fl.tensor(X):log_softmax(2)
  close(fl.nll_loss(lp, ids(Y)), fl.cross_entropy(T(X), ids(Y)):item(), 1e-6, 0,
        "nll_loss(log_softmax(x)) is cross_entropy(x)")
  close(fl.nll_loss(lp, ids(Y), {weight = T(w), reduction = "sum"}), num, 1e-6, 0, "nll_loss weight, sum")

  local ce = nn.CrossEntropyLoss{label_smoothing = ls}
  t.is(tostring(ce), "nn.CrossEntropyLoss", "print CrossEntropyLoss")
  close(ce(T(X), ids(Y)), (1 - ls) * nll + ls / C * smooth / N, 1e-6, 0, "nn.CrossEntropyLoss keeps its options")
  local cw = nn.CrossEntropyLoss{weight = T(w)}
  local _, bnames = cw:named_buffers()
  t.is(bnames, {"weight"}, "nn.CrossEntropyLoss: weight is a buffer, as in PyTorch")
end

---------------------------------------------------------------------------
-- mse, l1, binary cross-entropy with logits
---------------------------------------------------------------------------
do
  local a, b = {{1.0, -2.0, 3.5}, {0.25, 0.0, -1.0}}, {{0.5, -1.0, 3.0}, {1.0, 0.0, 1.0}}
  local x = fl.tensor(a, {requires_grad = true})
  local loss = fl.mse_loss(x, T(b))
  local s, g, s1, g1 = 0, {}, 0, {}
  for i = 1, 2 do
    g[i], g1[i] = {}, {}
    for j = 1, 3 do
      local d = a[i][j] - b[i][j]
      s = s + d * d
      s1 = s1 + math.abs(d)
      g[i][j] = 2 * d / 6
      g1[i][j] = (d > 0 and 1 or d < 0 and -1 or 0) / 6
    end
  end
  close(loss, s / 6, 1e-6, 0, "mse_loss: mean of (x - y)^2")
  loss:backward()
  close(x.grad, g, 1e-6, 1e-7, "mse_loss backward: 2 (x - y) / n")
  close(nn.MSELoss{reduction = "sum"}(T(a), T(b)), s, 1e-6, 0, "nn.MSELoss sum")
  local x1 = fl.tensor(a, {requires_grad = true})
  local l1 = fl.l1_loss(x1, T(b))
  close(l1, s1 / 6, 1e-6, 0, "l1_loss: mean of |x - y|")
  l1:backward()
  close(x1.grad, g1, 1e-6, 1e-7, "l1_loss backward: sign(x - y) / n (0 where equal)")

  -- BCE with logits: max(x, 0) - x t + log(1 + exp(-|x|)), with pos_weight
  -- (1 - t) x + (1 + (pw - 1) t) log(1 + exp(-x))
  local z = {-30.0, -2.0, 0.0, 0.5, 3.0, 40.0}
  local y = {0.0, 1.0, 1.0, 0.0, 0.3, 1.0}
  local pw = {2.0, 0.5, 1.0, 3.0, 1.5, 2.0}
  local want, wantp, grad = 0, 0, {}
  for i = 1, 6 do
    local softplus = math.max(-z[i], 0) + math.log(1 + math.exp(-math.abs(z[i])))
    want = want + math.max(z[i], 0) - z[i] * y[i] + math.log(1 + math.exp(-math.abs(z[i])))
    wantp = wantp + (1 - y[i]) * z[i] + (1 + (pw[i] - 1) * y[i]) * softplus
    grad[i] = (sigmoid(z[i]) - y[i]) / 6
  end
  local xz = fl.tensor(z, {requires_grad = true})
  local bce = fl.binary_cross_entropy_with_logits(xz, T(y))
  close(bce, want / 6, 1e-6, 0, "binary_cross_entropy_with_logits: stable at -30 and 40")
  bce:backward()
  close(xz.grad, grad, 1e-6, 1e-8, "its backward: (sigmoid(x) - t) / n, 0.5 - t at x = 0")
  close(fl.binary_cross_entropy_with_logits(T(z), T(y), {pos_weight = T(pw), reduction = "sum"}), wantp,
        1e-6, 0, "pos_weight")
  close(nn.BCEWithLogitsLoss{weight = T({1.0, 1.0, 1.0, 1.0, 1.0, 2.0})}(T(z), T(y)),
        (want + math.max(z[6], 0) - z[6] * y[6] + math.log(1 + math.exp(-40))) / 6, 1e-6, 0,
        "nn.BCEWithLogitsLoss weight")
  close(nn.L1Loss()(T(a), T(b)), s1 / 6, 1e-6, 0, "nn.L1Loss")
  close(nn.NLLLoss()(fl.tensor(X):log_softmax(2), ids(Y)), fl.cross_entropy(T(X), ids(Y)):item(), 1e-6, 0,
        "nn.NLLLoss")
end

---------------------------------------------------------------------------
-- loss errors: each names the function and what was wrong
---------------------------------------------------------------------------
t.raises(function() fl.cross_entropy(T(X), fl.tensor({0, 1, 2}, {dtype = "bool"})) end,
         "^cross_entropy: target must hold int64 class indices, got bool %[3%]", "cross_entropy: target dtype")
t.raises(function() fl.cross_entropy(T(X), T({0.0, 1.0, 2.0})) end,
         "^cross_entropy: float targets are class probabilities of the input's shape %[3,4%]",
         "cross_entropy: a float target of another shape")
t.raises(function() fl.cross_entropy(T(X), ids({0, 4, 1})) end,
         "^cross_entropy: target 4 is out of bounds %(classes 0..3%)", "cross_entropy: class id too large")
t.raises(function() fl.nll_loss(T(X), ids({0, -1, 1})) end,
         "^nll_loss: target %-1 is out of bounds", "nll_loss: a negative class id")
t.raises(function() fl.cross_entropy(T(X), ids({0, 1})) end,
         "^cross_entropy: target %[2%] does not match input %[3,4%]: expected %[3%]", "cross_entropy: target shape")
t.raises(function() fl.cross_entropy(T(X), ids(Y), {reduce = "sum"}) end,
         "^cross_entropy: unknown option 'reduce'", "cross_entropy: unknown option")
t.raises(function() fl.cross_entropy(T(X), ids(Y), {reduction = "avg"}) end,
         "^cross_entropy: reduction must be 'mean', 'sum' or 'none', got 'avg'", "cross_entropy: reduction")
t.raises(function() fl.cross_entropy(T(X), ids(Y), {label_smoothing = 1.5}) end,
         "^cross_entropy: label_smoothing must be a number in %[0, 1%]", "cross_entropy: label_smoothing")
t.raises(function() fl.cross_entropy(T(X), ids(Y), {weight = T({1.0, 2.0})}) end,
         "^cross_entropy: weight must be %[4%]", "cross_entropy: weight size")
t.raises(function() fl.mse_loss(T({1.0}), ids({1})) end,
         "^mse_loss: target must be floating point, got int64 %[1%]", "mse_loss: an int64 target")
t.raises(function() fl.binary_cross_entropy_with_logits(T({1.0, 2.0}), T({1.0})) end,
         "^binary_cross_entropy_with_logits: target %[1%] must have the input's shape %[2%]",
         "binary_cross_entropy_with_logits: shapes")

---------------------------------------------------------------------------
-- optimizers: 3 steps against the formulas, in double here
---------------------------------------------------------------------------
local P0 = {0.5, -1.25, 2.0}
local G = {{0.1, -0.4, 0.25}, {-0.3, 0.2, 0.05}, {0.02, 0.6, -0.15}}

-- Run opt over one parameter for 3 steps, the gradient of step k set to
-- G[k] by hand (no loss: the update alone is tested); the values after each.
local function run3(make)
  local p = fl.tensor(P0, {requires_grad = true})
  local opt = make({p})
  local after = {}
  for k = 1, 3 do
    p.grad = fl.tensor(G[k])
    opt:step()
    after[k] = p:tolist()
  end
  return after, opt, p
end

local function sgd_ref(o)
  local p, buf, out = {table.unpack(P0)}, nil, {}
  for k = 1, 3 do
    local g = {}
    for i = 1, 3 do
      g[i] = G[k][i]
      if o.maximize then g[i] = -g[i] end
      g[i] = g[i] + (o.weight_decay or 0) * p[i]
    end
    local m = o.momentum or 0
    if m ~= 0 then
      if buf == nil then buf = {table.unpack(g)}
      else for i = 1, 3 do buf[i] = m * buf[i] + (1 - (o.dampening or 0)) * g[i] end end
      for i = 1, 3 do g[i] = o.nesterov and g[i] + m * buf[i] or buf[i] end
    end
    for i = 1, 3 do p[i] = p[i] - o.lr * g[i] end
    out[k] = {table.unpack(p)}
  end
  return out
end

local function adam_ref(o, decoupled)
  local b1, b2 = (o.betas or {0.9, 0.999})[1], (o.betas or {0.9, 0.999})[2]
  local eps, wd = o.eps or 1e-8, o.weight_decay or (decoupled and 1e-2 or 0)
  local p, m, v, vmax, out = {table.unpack(P0)}, {0, 0, 0}, {0, 0, 0}, {0, 0, 0}, {}
  for k = 1, 3 do
    for i = 1, 3 do
      local g = G[k][i]
      if o.maximize then g = -g end
      if decoupled then p[i] = p[i] * (1 - o.lr * wd) else g = g + wd * p[i] end
      m[i] = b1 * m[i] + (1 - b1) * g
      v[i] = b2 * v[i] + (1 - b2) * g * g
      vmax[i] = math.max(vmax[i], v[i])
      local vv = o.amsgrad and vmax[i] or v[i]
      local denom = math.sqrt(vv) / math.sqrt(1 - b2 ^ k) + eps
      p[i] = p[i] - o.lr / (1 - b1 ^ k) * m[i] / denom
    end
    out[k] = {table.unpack(p)}
  end
  return out
end

local sgd_cases = {
  {lr = 0.1},
  {lr = 0.1, momentum = 0.9},
  {lr = 0.05, momentum = 0.8, dampening = 0.3},
  {lr = 0.1, momentum = 0.9, nesterov = true, weight_decay = 0.01},
  {lr = 0.1, momentum = 0.5, maximize = true},
}
for _, o in ipairs(sgd_cases) do
  local keys = {}
  for k, v in pairs(o) do keys[#keys + 1] = k .. "=" .. tostring(v) end
  table.sort(keys)
  close(run3(function(ps) return fl.optim.SGD(ps, o) end), sgd_ref(o), 1e-6, 1e-9,
        "SGD{" .. table.concat(keys, ", ") .. "}: 3 steps as the formula")
end
local adam_cases = {
  {lr = 0.1},
  {lr = 0.05, betas = {0.8, 0.99}, eps = 1e-6, weight_decay = 0.1},
  {lr = 0.1, amsgrad = true},
  {lr = 0.1, maximize = true, weight_decay = 0.05},
}
for _, o in ipairs(adam_cases) do
  local keys = {}
  for k, v in pairs(o) do keys[#keys + 1] = k .. "=" .. (type(v) == "table" and table.concat(v, "/") or tostring(v)) end
  table.sort(keys)
  close(run3(function(ps) return fl.optim.Adam(ps, o) end), adam_ref(o, false), 1e-6, 1e-9,
        "Adam{" .. table.concat(keys, ", ") .. "}: 3 steps as the formula")
  close(run3(function(ps) return fl.optim.AdamW(ps, o) end), adam_ref(o, true), 1e-6, 1e-9,
        "AdamW{" .. table.concat(keys, ", ") .. "}: 3 steps, weight decay decoupled")
end

do
  local _, opt = run3(function(ps) return fl.optim.Adam(ps, {lr = 0.1, amsgrad = true}) end)
  local sd = opt:state_dict()
  t.is(sd.state[0].step, 3, "Adam's state: step counted per parameter")
  t.ok(fl.is_tensor(sd.state[0].exp_avg) and fl.is_tensor(sd.state[0].exp_avg_sq) and
       fl.is_tensor(sd.state[0].max_exp_avg_sq), "Adam's state: exp_avg, exp_avg_sq, max_exp_avg_sq")
  t.is(sd.param_groups[1].params, {0}, "state_dict: param_groups list parameters by number from 0")
  t.is(sd.param_groups[1].betas, {0.9, 0.999}, "state_dict: the group's options")
end

-- parameter groups, an lr changed between steps, a parameter without grad
do
  local a = fl.tensor({1.0, 2.0}, {requires_grad = true})
  local b = fl.tensor({3.0}, {requires_grad = true})
  local c = fl.tensor({5.0}, {requires_grad = true})
  local opt = fl.optim.SGD({{params = {a}}, {params = {b, c}, lr = 0.5}}, {lr = 0.1, momentum = 0.9})
  t.is(#opt.param_groups, 2, "two parameter groups")
  t.is(opt.param_groups[2].momentum, 0.9, "a group takes the optimizer's options it does not set")
  a.grad, b.grad = fl.tensor({1.0, 1.0}), fl.tensor({2.0})
  opt:step()
  close(a, {0.9, 1.9}, 1e-6, 0, "group 1: lr 0.1")
  close(b, {2.0}, 1e-6, 0, "group 2: its own lr 0.5")
  t.is(c:tolist(), {5.0}, "a parameter without .grad is not changed")
  t.is(opt.state[c], nil, "... and gets no state")
  opt.param_groups[1].lr = 1.0
  opt:step()
  close(a, {0.9 - 1.9, 1.9 - 1.9}, 1e-6, 1e-7, "lr changed through param_groups: the next step uses it")
  opt:zero_grad()
  t.ok(a.grad == nil and b.grad == nil, "zero_grad: every .grad is nil (set_to_none)")
  a.grad = fl.tensor({1.0, 2.0})
  opt:zero_grad(false)
  t.is(a.grad:tolist(), {0.0, 0.0}, "zero_grad(false): zeroed in place")
  local loss = opt:step(function() return (a * a):sum() end)
  t.near(loss:item(), (0.9 - 1.9) ^ 2, 1e-6, "step(closure) returns the closure's loss")
end

---------------------------------------------------------------------------
-- state_dict: a fresh optimizer loaded from it continues identically
---------------------------------------------------------------------------
do
  local function grads(k) return {fl.tensor({0.1 * k, -0.2}), fl.tensor({{0.3, -0.1 * k}})} end
  local function params() return {fl.tensor({1.0, 2.0}, {requires_grad = true}),
                                  fl.tensor({{-1.0, 0.5}}, {requires_grad = true})} end
  for _, make in ipairs({
    function(ps) return fl.optim.Adam(ps, {lr = 0.01, amsgrad = true}) end,
    function(ps) return fl.optim.SGD(ps, {lr = 0.1, momentum = 0.9, nesterov = true}) end,
    function(ps) return fl.optim.AdamW(ps, {lr = 0.01}) end}) do
    local pa = params()
    local a = make(pa)
    for k = 1, 2 do
      local g = grads(k)
      pa[1].grad, pa[2].grad = g[1], g[2]
      a:step()
    end
    local pb = params()
    fl.no_grad(function() pb[1]:copy_(pa[1]); pb[2]:copy_(pa[2]) end)
    local b = make(pb)
    b:load_state_dict(a:state_dict())
    for k = 3, 4 do
      local g = grads(k)
      pa[1].grad, pa[2].grad = g[1], g[2]
      pb[1].grad, pb[2].grad = g[1], g[2]
      a:step()
      b:step()
    end
    t.ok(fl.allclose(pa[1], pb[1], 0, 0) and fl.allclose(pa[2], pb[2], 0, 0),
         getmetatable(a).__name .. ": loaded from state_dict, continues identically")
  end
  local a = fl.optim.Adam({fl.tensor({1.0}, {requires_grad = true})})
  t.raises(function() a:load_state_dict(fl.optim.Adam({fl.ones(1, {requires_grad = true}),
                                                       fl.ones(1, {requires_grad = true})}):state_dict()) end,
           "^fl.optim.Adam:load_state_dict: parameter group 1 has 2 parameter%(s%) in the state, 1",
           "load_state_dict: another parameter count")
end

---------------------------------------------------------------------------
-- lr schedulers: PyTorch's recursive forms against the closed forms
---------------------------------------------------------------------------
do
  local opt = fl.optim.SGD({fl.zeros(1, {requires_grad = true})}, {lr = 0.5})
  local s = fl.optim.lr_scheduler.StepLR(opt, {step_size = 3, gamma = 0.5})
  local seq, want = {}, {}
  for e = 0, 9 do
    seq[#seq + 1] = s:get_last_lr()[1]
    want[#want + 1] = 0.5 * 0.5 ^ (e // 3)
    s:step()
  end
  close(seq, want, 1e-15, 0, "StepLR: lr * gamma every step_size epochs")
  t.is(opt.param_groups[1].lr, s:get_last_lr()[1], "StepLR sets the optimizer's lr")
  t.is(opt.param_groups[1].initial_lr, 0.5, "the group keeps initial_lr")

  local opt2 = fl.optim.Adam({fl.zeros(1, {requires_grad = true})}, {lr = 0.1})
  local cs = fl.optim.lr_scheduler.CosineAnnealingLR(opt2, {T_max = 5, eta_min = 0.01})
  local cseq, cwant = {}, {}
  for e = 0, 13 do
    cseq[#cseq + 1] = cs:get_last_lr()[1]
    cwant[#cwant + 1] = 0.01 + (0.1 - 0.01) * (1 + math.cos(math.pi * e / 5)) / 2
    cs:step()
  end
  close(cseq, cwant, 1e-12, 1e-15, "CosineAnnealingLR: the cosine from lr to eta_min and back up")
  t.raises(function() fl.optim.lr_scheduler.StepLR(opt, {step_size = 0}) end,
           "^fl.optim.lr_scheduler.StepLR: step_size must be an integer >= 1, got 0", "StepLR: step_size")
  t.raises(function() fl.optim.lr_scheduler.CosineAnnealingLR(opt, {tmax = 3}) end,
           "^fl.optim.lr_scheduler.CosineAnnealingLR: unknown option 'tmax'", "CosineAnnealingLR: unknown option")
end

---------------------------------------------------------------------------
-- clip_grad_norm_
---------------------------------------------------------------------------
do
  local a = fl.zeros(2, {requires_grad = true})
  local b = fl.zeros(2, 2, {requires_grad = true})
  local c = fl.zeros(1, {requires_grad = true})
  a.grad, b.grad = fl.tensor({3.0, 0.0}), fl.tensor({{0.0, 4.0}, {0.0, 12.0}})
  local total = fl.nn.utils.clip_grad_norm_({a, b, c}, 2.6)
  close(total, 13, 1e-6, 0, "clip_grad_norm_: the norm of all the gradients together")
  local coef = 2.6 / (13 + 1e-6)
  close(a.grad, {3 * coef, 0}, 1e-6, 0, "... each scaled by max_norm / (total + 1e-6)")
  close(b.grad, {{0, 4 * coef}, {0, 12 * coef}}, 1e-6, 0, "... all of them")
  t.is(c.grad, nil, "a parameter without .grad is skipped")
  local before = b.grad:tolist()
  close(fl.nn.utils.clip_grad_norm_({a, b}, 100), 2.6, 1e-6, 0, "below max_norm: the norm")
  close(b.grad, before, 1e-6, 0, "... and the gradients unchanged (the factor clamped to 1)")
  close(fl.nn.utils.clip_grad_norm_({a, b}, 1, {norm_type = "inf"}), 12 * coef, 1e-6, 0, "norm_type inf: the largest |g|")
  t.is(fl.nn.utils.clip_grad_norm_({c}, 1), 0.0, "no gradients: 0")
end

---------------------------------------------------------------------------
-- modules: parameters require grad, buffers do not; zero_grad
---------------------------------------------------------------------------
do
  local m = fl.models.cnn{channels = {1, 2}, classes = 3, input = 4}
  local map, names = m:named_parameters()
  t.is(names, {"0.weight", "0.bias", "1.weight", "1.bias", "5.weight", "5.bias"}, "cnn: PyTorch's names")
  local all = true
  for _, n in ipairs(names) do all = all and map[n].requires_grad and map[n].is_leaf end
  t.ok(all, "every parameter is a leaf that requires grad")
  local bmap, bnames = m:named_buffers()
  local none = true
  for _, n in ipairs(bnames) do none = none and not bmap[n].requires_grad end
  t.ok(none and #bnames == 3, "buffers do not")
  local loss = fl.cross_entropy(m(fl.randn(2, 1, 4, 4)), ids({0, 2}))
  loss:backward()
  t.ok(m:parameters()[1].grad ~= nil, "backward reaches the first conv's weight")
  m:zero_grad()
  local cleared = true
  for _, p in ipairs(m:parameters()) do cleared = cleared and p.grad == nil end
  t.ok(cleared, "m:zero_grad(): every .grad is nil")
  m:requires_grad_(false)
  t.ok(not m:parameters()[1].requires_grad, "m:requires_grad_(false) freezes every parameter")
  local l = nn.Linear(2, 3)
  l.bias:requires_grad_(false)
  l:to("float16")
  t.ok(l.weight.dtype == "float16" and l.weight.requires_grad and l.weight.is_leaf and
       not l.bias.requires_grad, "m:to(dtype): parameters stay leaves that require grad, a frozen one frozen")
  t.raises(function() fl.no_grad(function() nn.Linear(2, 2).weight:add_(1) end); nn.Linear(2, 2).weight:add_(1) end,
           "add_: .*requires grad", "a parameter changes in place only under no_grad")
end

---------------------------------------------------------------------------
-- BatchNorm2d in training mode
---------------------------------------------------------------------------
do
  local Cn, Nn, H, W = 2, 3, 2, 2
  local bn = nn.BatchNorm2d(Cn)
  t.ok(bn.training, "a fresh module is in training mode")
  local rm, rv = {0, 0}, {1, 1}
  local xs = {}
  for k = 1, 3 do
    local x = fl.randn(Nn, Cn, H, W) * k + k
    xs[k] = x
    bn(x)
    local v = x:tolist()
    for c = 1, Cn do
      local s, n = 0, Nn * H * W
      for i = 1, Nn do for h = 1, H do for w = 1, W do s = s + v[i][c][h][w] end end end
      local mean = s / n
      local ss = 0
      for i = 1, Nn do for h = 1, H do for w = 1, W do ss = ss + (v[i][c][h][w] - mean) ^ 2 end end end
      rm[c] = 0.9 * rm[c] + 0.1 * mean
      rv[c] = 0.9 * rv[c] + 0.1 * ss / (n - 1)
    end
  end
  close(bn.running_mean, rm, 1e-5, 1e-7, "BatchNorm2d: running_mean after 3 batches, momentum 0.1")
  close(bn.running_var, rv, 1e-5, 1e-7, "BatchNorm2d: running_var after 3 batches, unbiased")
  t.is(bn.num_batches_tracked:item(), 3, "num_batches_tracked counts the batches")

  -- momentum = false: the cumulative average
  local cum = nn.BatchNorm2d(Cn, {momentum = false})
  for k = 1, 3 do cum(xs[k]) end
  local m3 = (xs[1]:mean({1, 3, 4}) + xs[2]:mean({1, 3, 4}) + xs[3]:mean({1, 3, 4})) / 3
  close(cum.running_mean, m3, 1e-5, 1e-7, "momentum = false: running_mean is the plain average")

  -- the output, and the input's gradient through mean and var:
  -- dx = w / sqrt(var + eps) * (dy - mean(dy) - xhat * mean(dy * xhat))
  local x = fl.randn(Nn, Cn, H, W, {requires_grad = true})
  local r = fl.randn(Nn, Cn, H, W)
  local y = bn(x)
  local mean = x:detach():mean({1, 3, 4}, true)
  local var = x:detach():var({1, 3, 4}, {correction = 0, keepdim = true})
  local xhat = (x:detach() - mean) / (var + 1e-5):sqrt()
  close(y, xhat, 1e-5, 1e-6, "training: normalized by the batch's mean and biased variance")
  ;(y * r):sum():backward()
  local dx = (r - r:mean({1, 3, 4}, true) - xhat * (r * xhat):mean({1, 3, 4}, true)) / (var + 1e-5):sqrt()
  close(x.grad, dx, 1e-4, 1e-6, "training: the input's gradient through the batch statistics")
  close(bn.weight.grad, (r * xhat):sum({1, 3, 4}), 1e-5, 1e-6, "training: weight's gradient")

  bn:eval()
  local before = bn.running_mean:tolist()
  local ye = bn(x:detach())
  t.is(bn.running_mean:tolist(), before, "eval: the running statistics stay")
  local want = (x:detach() - bn.running_mean:reshape(1, Cn, 1, 1)) /
               (bn.running_var:reshape(1, Cn, 1, 1) + 1e-5):sqrt()
  close(ye, want, 1e-5, 1e-6, "eval: normalized by the running statistics")
  t.raises(function() nn.BatchNorm2d(2)(fl.randn(1, 2, 1, 1)) end,
           "expected more than 1 value per channel when training", "BatchNorm2d: one value per channel")
  t.raises(function() nn.BatchNorm2d(2, {momentum = 2}) end,
           "^nn.BatchNorm2d: momentum must be a number in %[0, 1%] or false", "BatchNorm2d: momentum")
  -- training's batch_norm says its statistics are the batch's: the tape
  -- holds batch_norm alone, not mean and var as ops of their own
  local yt = nn.BatchNorm2d(Cn)(fl.randn(Nn, Cn, H, W, {requires_grad = true}))
  t.is(yt.grad_fn.name, "BatchNormBackward", "training: batch_norm is the recorded op")
  local listing = tostring(fl.backward_graph(yt:sum()))
  local _, sums = listing:gsub("= sum%(", "")
  t.ok(sums == 2 and not listing:find("mean%(") and not listing:find("var%("),
       "training: batch_norm's gradient sums twice, never recomputing mean or var")
  local xb, z3 = fl.randn(2, 3, 2, 2), fl.zeros(3)
  t.raises(function() fl.batch_norm(xb, z3, z3 + 1, nil, nil, {batch_stats = 1}) end,
           "batch_norm: batch_stats must be a boolean, got number", "batch_norm: batch_stats of the wrong type")
  t.raises(function() fl.batch_norm(xb, z3, z3 + 1, nil, nil, {epsilon = 1}) end,
           "batch_norm: unknown option 'epsilon' %(expected eps, batch_stats%)", "batch_norm: an unknown option")
  t.raises(function() fl.batch_norm(xb, z3, z3 + 1, nil, nil, {eps = "a"}) end,
           "batch_norm: eps must be a number, got string", "batch_norm: eps of the wrong type")

  local d = nn.Dropout(0.5)
  local ones = fl.ones(1000)
  t.ok(d(ones):eq(0):to("float32"):sum():item() > 300, "Dropout in training zeroes")
  d:eval()
  t.ok(fl.allclose(d(ones), ones), "Dropout in eval is the identity")
end

---------------------------------------------------------------------------
-- checkpoints through a file, and safetensors metadata
---------------------------------------------------------------------------
local dir = t.tmpdir()
do
  local path = dir .. "/meta.safetensors"
  fl.save_safetensors({a = fl.ones(2), b = fl.arange(3)}, path, {note = "hello", lr = "0.001"})
  local ts, meta, names = fl.load_safetensors(path)
  t.is(meta, {note = "hello", lr = "0.001", format = "pt"}, "save_safetensors: metadata round trip")
  t.is(names, {"a", "b"}, "load_safetensors: the names in file order")
  t.ok(fl.allclose(ts.b, fl.arange(3)), "load_safetensors: the tensors")
  t.raises(function() fl.save_safetensors({a = fl.ones(1)}, path, {n = 1}) end,
           "save_safetensors: metadata must map strings to strings", "save_safetensors: a number in metadata")

  local function setup()
    fl.manual_seed(11)
    local m = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2))
    local opt = fl.optim.AdamW(m, {lr = 0.01, amsgrad = true})
    local s = fl.optim.lr_scheduler.CosineAnnealingLR(opt, {T_max = 4})
    return m, opt, s
  end
  local x = fl.randn(5, 3)
  local y = ids({0, 1, 1, 0, 1})
  local function train(m, opt, s, steps)
    for _ = 1, steps do
      opt:zero_grad()
      fl.cross_entropy(m(x), y):backward()
      opt:step()
      s:step()
    end
  end
  local m, opt, s = setup()
  train(m, opt, s, 3)
  local ck = dir .. "/ck.safetensors"
  fl.save_checkpoint(ck, {model = m, optimizer = opt, scheduler = s, extra = {epoch = 3}})
  local _, meta2 = fl.load_safetensors(ck)
  t.is(meta2["optimizer.state.0.step"], "3", "checkpoint: step in the metadata")
  t.ok(meta2["optimizer.param_groups.0.lr"] == string.format("%.17g", opt.param_groups[1].lr) or
       tonumber(meta2["optimizer.param_groups.0.lr"]) == opt.param_groups[1].lr, "checkpoint: lr in the metadata, exact")
  local m2, opt2, s2 = setup()
  fl.manual_seed(99)
  local extra = fl.load_checkpoint(ck, {model = m2, optimizer = opt2, scheduler = s2})
  t.is(extra, {epoch = 3}, "load_checkpoint returns extra")
  t.is(s2:get_last_lr(), s:get_last_lr(), "the scheduler resumes where it was")
  train(m, opt, s, 2)
  train(m2, opt2, s2, 2)
  local p1, p2 = m:parameters(), m2:parameters()
  local same = true
  for i = 1, #p1 do same = same and fl.allclose(p1[i], p2[i], 0, 0) end
  t.ok(same, "checkpoint: model, optimizer and scheduler continue identically")
  t.raises(function() fl.load_checkpoint(ck, {model = nn.Linear(3, 4)}) end,
           "^load_checkpoint: .* does not match the model", "load_checkpoint: another model")
  t.raises(function() fl.load_checkpoint(ck, {optimizer = fl.optim.SGD(m2)}) end,
           "holds the state of an fl.optim.AdamW, not of an fl.optim.SGD", "load_checkpoint: another optimizer")
  t.raises(function() fl.load_checkpoint(path, {model = m2}) end,
           "is not a checkpoint", "load_checkpoint: plain weights")
end

---------------------------------------------------------------------------
-- a small MLP learns; optimizer errors
---------------------------------------------------------------------------
do
  fl.manual_seed(5)
  local m = fl.models.mlp{sizes = {4, 16, 3}}
  local x = fl.randn(32, 4)
  local y = x:argmax(2):reshape(32)          -- the largest of the first three features... roughly
  y = fl.where(y:gt(2), 2, y)
  local opt = fl.optim.Adam(m, {lr = 0.02})
  local first, last
  for step = 1, 50 do
    opt:zero_grad()
    local loss = fl.cross_entropy(m(x), y)
    loss:backward()
    opt:step()
    if step == 1 then first = loss:item() end
    last = loss:item()
  end
  t.ok(last < 0.5 * first, ("an MLP trained 50 steps with Adam: loss %.3f -> %.3f"):format(first, last))
end

do
  local p = {fl.zeros(1, {requires_grad = true})}
  t.raises(function() fl.optim.SGD(p, {lr = -1}) end, "^fl.optim.SGD: invalid learning rate: %-1", "SGD: a negative lr")
  t.raises(function() fl.optim.SGD(p, {lr = 0.1, momentun = 0.9}) end,
           "^fl.optim.SGD: unknown option 'momentun'", "SGD: an unknown option")
  t.raises(function() fl.optim.SGD(p, {nesterov = true}) end,
           "^fl.optim.SGD: Nesterov momentum requires a momentum and zero dampening", "SGD: nesterov without momentum")
  t.raises(function() fl.optim.Adam(p, {betas = {0.9, 1.0}}) end,
           "^fl.optim.Adam: invalid beta parameter at index 1: 1", "Adam: beta2 = 1")
  t.raises(function() fl.optim.AdamW(p, {eps = -1}) end, "^fl.optim.AdamW: invalid epsilon value: %-1", "AdamW: eps")
  t.raises(function() fl.optim.Adam({}) end, "^fl.optim.Adam: got an empty parameter list", "Adam: no parameters")
  t.raises(function() fl.optim.SGD({p[1] * 2}) end, "is not a leaf", "SGD: a computed tensor")
  t.raises(function() fl.optim.SGD({{params = p}, {params = p}}) end,
           "params%[1%] is already in parameter group 1", "SGD: a parameter in two groups")
  t.raises(function() fl.optim.SGD({{params = p, lr = 0.1, mom = 1}}) end,
           "unknown option 'mom' in a parameter group", "SGD: an unknown option in a group")
end

-- the fused update (one pass, float32 contiguous parameters) and the same
-- formula as tensor ops (taken for a strided parameter) agree exactly
do
  local function run(make_opt, strided)
    fl.manual_seed(5)
    local base = fl.randn(6, 5)
    local p = base
    if strided then
      p = fl.zeros(5, 6):transpose(1, 2)
      p:copy_(base)
    end
    p:requires_grad_()
    local opt = make_opt({p})
    for _ = 1, 3 do
      opt:zero_grad()
      local l = (p * p * fl.arange(5):to("float32"):reshape(1, 5)):sum() + p:sin():sum()
      l:backward()
      opt:step()
    end
    return p:detach():contiguous()
  end
  local cases = {
    {"Adam with weight decay", function(ps) return fl.optim.Adam(ps, {lr = 0.01, weight_decay = 0.1}) end},
    {"AdamW amsgrad, beta1 0.4", function(ps)
      return fl.optim.AdamW(ps, {lr = 0.01, amsgrad = true, betas = {0.4, 0.99}})
    end},
    {"SGD nesterov", function(ps)
      return fl.optim.SGD(ps, {lr = 0.05, momentum = 0.9, nesterov = true, weight_decay = 0.01})
    end},
    {"SGD maximize", function(ps) return fl.optim.SGD(ps, {lr = 0.05, maximize = true}) end},
    {"Adam maximize", function(ps) return fl.optim.Adam(ps, {lr = 0.05, maximize = true}) end},
  }
  for _, c in ipairs(cases) do
    local d = (run(c[2], false) - run(c[2], true)):abs():amax():item()
    t.is(d, 0.0, c[1] .. ": the fused step equals the step as tensor ops")
  end
end

---------------------------------------------------------------------------
-- gradient accumulation: forward, backward, forward again.  A square
-- weight is read as w forward and as w^T by its input's gradient; the
-- copy oneDNN keeps in its own layout must be the one of each reading
-- (the second forward once read the gradient's copy: wrong values)
---------------------------------------------------------------------------
do
  for _, d in ipairs{16, 64} do
    fl.manual_seed(7)
    local m = nn.Sequential(nn.Linear(d, d), nn.Tanh(), nn.Linear(d, d))
    local x = fl.randn(8, d)
    local y1 = m(x)
    local ref = fl.no_grad(function() return y1 + 0 end)
    y1:sum():backward()
    local w = m:named_parameters()["0.weight"]
    local g1 = w.grad + 0
    local y2 = m(x)
    t.ok(fl.allclose(y2, ref, 0, 0), ("Linear(%d, %d): the forward after a backward is the same"):format(d, d))
    y2:sum():backward()
    t.ok(fl.allclose(w.grad, g1 * 2, 1e-6, 1e-6),
         ("Linear(%d, %d): a second backward accumulates the same gradient"):format(d, d))
  end
end

t.done()
