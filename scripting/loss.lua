-- loss.lua -- the losses of training, with PyTorch's names, options and
-- formulas: fl.cross_entropy, fl.nll_loss, fl.mse_loss, fl.l1_loss,
-- fl.binary_cross_entropy_with_logits, and the modules around them
-- (nn.CrossEntropyLoss, nn.NLLLoss, nn.MSELoss, nn.L1Loss,
-- nn.BCEWithLogitsLoss).  Embedded in the binary; lfl_nn.c runs it after
-- nn.lua, with the fl table.
--
-- Every loss is written with fl ops only: autograd differentiates it op
-- by op (no derivative of its own to get wrong), and under fl.compile it
-- is captured like any other code.  Class dims follow PyTorch's layout
-- (input [N, C, d...] or [C]; fuselab counts dims from 1, so the classes
-- are dim 2, or 1 for [C]); class ids are 0-based int64, as
-- fl.embedding's.

local fl = ...
local nn = fl.nn
local fmt = string.format

local shape_str, options = nn._util.shape_str, nn._util.options

local function desc(x) return x.dtype .. " " .. shape_str(x) end

local function check_float(x, role, what)
  if not fl.is_tensor(x) then error(fmt("%s: %s must be a tensor, got %s", what, role, type(x)), 0) end
  if not x.dtype:find("float") then
    error(fmt("%s: %s must be floating point, got %s", what, role, desc(x)), 0)
  end
end

local function check_reduction(r, what)
  r = r or "mean"
  if r ~= "mean" and r ~= "sum" and r ~= "none" then
    error(fmt("%s: reduction must be 'mean', 'sum' or 'none', got '%s'", what, tostring(r)), 0)
  end
  return r
end

local function reduce(loss, reduction)
  if reduction == "mean" then return loss:mean() end
  if reduction == "sum" then return loss:sum() end
  return loss
end

-- The class dim of an input: 2 for [N, C, d...], 1 for [C].
local function class_dim(input, what)
  if input:dim() == 0 then error(what .. ": input must have a class dim, got a scalar", 0) end
  return input:dim() == 1 and 1 or 2
end

-- A per-class weight [C] (or nil), checked, shaped to broadcast along the
-- class dim of an input of rank r.
local function class_weight(w, C, cdim, r, what)
  if w == nil then return nil end
  check_float(w, "weight", what)
  if w:dim() ~= 1 or w:size(1) ~= C then
    error(fmt("%s: weight must be [%d] (one per class), got %s", what, C, desc(w)), 0)
  end
  local shape = {}
  for d = 1, r do shape[d] = d == cdim and C or 1 end
  return w:reshape(shape)
end

-- Class-index targets: int64, shaped as the input without its class dim.
-- Their values are checked eagerly (under capture reading them would
-- break the graph; an id out of range then only picks no class).
local function check_target(input, target, cdim, ignore_index, what)
  if not fl.is_tensor(target) then error(fmt("%s: target must be a tensor, got %s", what, type(target)), 0) end
  if target.dtype ~= "int64" then
    error(fmt("%s: target must hold int64 class indices, got %s", what, desc(target)), 0)
  end
  local want = {}
  for d = 1, input:dim() do if d ~= cdim then want[#want + 1] = input:size(d) end end
  local ok = target:dim() == #want
  for d = 1, #want do ok = ok and fl.size_eq(target:size(d), want[d]) end
  if not ok then
    error(fmt("%s: target %s does not match input %s: expected %s", what, shape_str(target.shape),
              shape_str(input.shape), shape_str(want)), 0)
  end
  if fl._tracing() or target:numel() == 0 then return end
  local C = input:size(cdim)
  local kept = fl.where(target:ne(ignore_index), target, 0)
  local lo, hi = kept:amin():item(), kept:amax():item()
  if lo < 0 or hi >= C then
    error(fmt("%s: target %d is out of bounds (classes 0..%d%s)", what, lo < 0 and lo or hi, C - 1,
              ignore_index ~= -100 and fmt(", ignore_index %d", ignore_index) or ""), 0)
  end
end

-- What nll_loss and cross_entropy share: from log-probabilities logp and
-- class ids, the per-element loss -w[t] * logp[t] and the weight w[t]
-- (1 without weights), both 0 where the target is ignore_index.  The
-- class is picked by a one-hot mask (t == arange(C)) and a sum over the
-- class dim, so the gradient is the mask itself, scattered by autograd.
local function picked(logp, target, wb, cdim, ignore_index)
  local C = logp:size(cdim)
  local valid = target:ne(ignore_index)
  -- each element's class taken from its row of log-probabilities: the
  -- classes last, the rows flat, one gather (its gradient is index_add,
  -- linear in the size; a one-hot mask of all classes was not)
  local rows = logp
  if cdim ~= logp:dim() then
    local perm = {}
    for d = 1, logp:dim() do if d ~= cdim then perm[#perm + 1] = d end end
    perm[#perm + 1] = cdim
    rows = logp:permute(perm)
  end
  local M = target:numel()
  local t = fl.where(valid, target, 0):reshape(M)      -- an ignored id reads class 0
  local at = fl.arange(M, {device = logp.device}) * C + t
  local lp = fl.gather(rows:reshape(M * C), 1, at):reshape(target.shape)
  if wb then
    local w = fl.where(valid, fl.gather(wb:reshape(C), 1, t):reshape(target.shape), 0)
    return fl.where(valid, -(lp * w), 0), w, valid
  end
  return fl.where(valid, -lp, 0), valid:to(logp.dtype), valid
end

-- PyTorch's reduction of a weighted nll: the mean divides by the total
-- weight of the targets kept (their count without weights).
local function reduce_nll(loss, w, reduction)
  if reduction == "mean" then return loss:sum() / w:sum() end
  if reduction == "sum" then return loss:sum() end
  return loss
end

local function ignore_of(v, what)
  if v == nil then return -100 end
  local i = math.tointeger(v)
  if not i then error(fmt("%s: ignore_index must be an integer, got %s", what, tostring(v)), 0) end
  return i
end

-- fl.nll_loss(logp, target [, {weight=, ignore_index=-100, reduction="mean"}])
function fl.nll_loss(input, target, opts)
  local what = "nll_loss"
  opts = options(opts, {"weight", "ignore_index", "reduction"}, what)
  check_float(input, "input", what)
  local reduction = check_reduction(opts.reduction, what)
  local ignore = ignore_of(opts.ignore_index, what)
  local cdim = class_dim(input, what)
  check_target(input, target, cdim, ignore, what)
  local wb = class_weight(opts.weight, input:size(cdim), cdim, input:dim(), what)
  local loss, w = picked(input, target, wb, cdim, ignore)
  return reduce_nll(loss, w, reduction)
end

-- Class probabilities as the target (the input's shape): PyTorch's
-- cross_entropy_loss_prob_target.  The mean divides by the number of
-- elements without the class dim, whatever the weights.
local function cross_entropy_probs(logp, target, wb, cdim, ls, reduction, what)
  if not fl.size_eq(target:dim(), logp:dim()) then
    error(fmt("%s: float targets are class probabilities of the input's shape %s, got %s", what,
              shape_str(logp.shape), desc(target)), 0)
  end
  for d = 1, logp:dim() do
    if not fl.size_eq(target:size(d), logp:size(d)) then
      error(fmt("%s: float targets are class probabilities of the input's shape %s, got %s", what,
                shape_str(logp.shape), desc(target)), 0)
    end
  end
  local C = logp:size(cdim)
  if ls > 0 then target = target * (1 - ls) + ls / C end
  local x = logp * target
  if wb then x = x * wb end
  if reduction == "mean" then return -x:sum() / (logp:numel() / C) end
  if reduction == "sum" then return -x:sum() end
  return -x:sum(cdim)
end

-- fl.cross_entropy(logits, target [, {weight=, ignore_index=-100,
-- reduction="mean", label_smoothing=0}]): log_softmax over the class dim,
-- then nll_loss; with label smoothing PyTorch's mix
--   (1 - ls) * nll + ls / C * smooth,  smooth = -sum_c w_c logp_c
-- reduced as the nll is (the mean over the weight of the targets kept).
function fl.cross_entropy(input, target, opts)
  local what = "cross_entropy"
  opts = options(opts, {"weight", "ignore_index", "reduction", "label_smoothing"}, what)
  check_float(input, "input", what)
  local reduction = check_reduction(opts.reduction, what)
  local ls = opts.label_smoothing or 0
  if type(ls) ~= "number" or ls < 0 or ls > 1 then
    error(fmt("%s: label_smoothing must be a number in [0, 1], got %s", what, tostring(ls)), 0)
  end
  local cdim = class_dim(input, what)
  local C = input:size(cdim)
  local wb = class_weight(opts.weight, C, cdim, input:dim(), what)
  local logp = input:log_softmax(cdim)
  if fl.is_tensor(target) and target.dtype:find("float") then
    if opts.ignore_index ~= nil and opts.ignore_index >= 0 then
      error(what .. ": ignore_index is not supported for float (probability) targets", 0)
    end
    return cross_entropy_probs(logp, target, wb, cdim, ls, reduction, what)
  end
  local ignore = ignore_of(opts.ignore_index, what)
  check_target(input, target, cdim, ignore, what)
  local loss, w, valid = picked(logp, target, wb, cdim, ignore)
  local nll = reduce_nll(loss, w, reduction)
  if ls == 0 then return nll end
  local smooth = wb and -(logp * wb):sum(cdim) or -logp:sum(cdim)
  smooth = fl.where(valid, smooth, 0)
  if reduction == "mean" then smooth = smooth:sum() / w:sum()
  elseif reduction == "sum" then smooth = smooth:sum() end
  return nll * (1 - ls) + smooth * (ls / C)
end

-- The element-wise losses take input and target of one shape (a target
-- that broadcasts is computed as PyTorch does, which warns about it).
local function pointwise(name, f)
  fl[name] = function(input, target, opts)
    opts = options(opts, {"reduction"}, name)
    check_float(input, "input", name)
    check_float(target, "target", name)
    return reduce(f(input - target), check_reduction(opts.reduction, name))
  end
end

-- fl.mse_loss(input, target [, {reduction="mean"}]): (input - target)^2
pointwise("mse_loss", function(d) return d * d end)
-- fl.l1_loss(input, target [, {reduction="mean"}]): |input - target|
pointwise("l1_loss", function(d) return d:abs() end)

-- log(sigmoid(x)) as the log_softmax of the pair (x, 0): stable for any
-- x, and its derivative is log_softmax's exact one (sigmoid(-x)), with
-- no kink where a max or abs would put one.
local function log_sigmoid(x)
  local shape = {}
  for d = 1, x:dim() do shape[d] = x:size(d) end
  shape[#shape + 1] = 1
  local pair = fl.cat({x:unsqueeze(x:dim() + 1), fl.zeros(shape, {dtype = x.dtype, device = x.device})},
                     x:dim() + 1)
  return pair:log_softmax(x:dim() + 1):narrow(x:dim() + 1, 1, 1):squeeze(x:dim() + 1)
end

-- fl.binary_cross_entropy_with_logits(x, target [, {weight=, pos_weight=,
-- reduction="mean"}]): PyTorch's numerically stable form
--   (1 - t) * x - (1 + (pos_weight - 1) * t) * log_sigmoid(x)
-- times weight, which broadcasts (pos_weight along the last dim).
function fl.binary_cross_entropy_with_logits(input, target, opts)
  local what = "binary_cross_entropy_with_logits"
  opts = options(opts, {"weight", "pos_weight", "reduction"}, what)
  check_float(input, "input", what)
  check_float(target, "target", what)
  local reduction = check_reduction(opts.reduction, what)
  local shape_ok = input:dim() == target:dim()
  for d = 1, input:dim() do shape_ok = shape_ok and fl.size_eq(input:size(d), target:size(d)) end
  if not shape_ok then
    error(fmt("%s: target %s must have the input's shape %s", what, shape_str(target.shape),
              shape_str(input.shape)), 0)
  end
  local ls = log_sigmoid(input)
  if opts.pos_weight ~= nil then
    check_float(opts.pos_weight, "pos_weight", what)
    ls = ls * ((opts.pos_weight - 1) * target + 1)
  end
  local loss = (1 - target) * input - ls
  if opts.weight ~= nil then
    check_float(opts.weight, "weight", what)
    loss = loss * opts.weight
  end
  return reduce(loss, reduction)
end

-- ---------------------------------------------------------------------------
-- modules: the options kept, forward(input, target) calls the function;
-- weight and pos_weight are buffers, as in PyTorch (in the state_dict)
-- ---------------------------------------------------------------------------

local function loss_module(name, fn, keys, buffers)
  local cls = nn.class("nn." .. name)
  function cls:__init(opts)
    opts = options(opts, keys, "nn." .. name)
    self.opts = {}
    for _, k in ipairs(keys) do
      local v = opts[k]
      if buffers[k] and v ~= nil then self:register_buffer(k, v) else self[k] = v end
      self.opts[k] = v
    end
    self.reduction = check_reduction(opts.reduction, "nn." .. name)
  end
  function cls:_head()
    if self.reduction == "mean" then return "nn." .. name end
    return fmt("nn.%s(reduction=%s)", name, self.reduction)
  end
  function cls:forward(input, target)
    -- buffers may have been moved (m:to) since: read them from the module
    for k in pairs(buffers) do self.opts[k] = self[k] end
    return fn(input, target, self.opts)
  end
  nn[name] = cls
end

loss_module("CrossEntropyLoss", fl.cross_entropy, {"weight", "ignore_index", "reduction", "label_smoothing"},
            {weight = true})
loss_module("NLLLoss", fl.nll_loss, {"weight", "ignore_index", "reduction"}, {weight = true})
loss_module("MSELoss", fl.mse_loss, {"reduction"}, {})
loss_module("L1Loss", fl.l1_loss, {"reduction"}, {})
loss_module("BCEWithLogitsLoss", fl.binary_cross_entropy_with_logits, {"weight", "pos_weight", "reduction"},
            {weight = true, pos_weight = true})
