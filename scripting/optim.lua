-- optim.lua -- fl.optim: the optimizers SGD, Adam and AdamW with PyTorch's
-- updates, term for term those of torch/optim's single-tensor ("for-loop")
-- implementations; their param_groups and state_dict in PyTorch's
-- layout; the schedulers fl.optim.lr_scheduler.StepLR and
-- CosineAnnealingLR; and fl.nn.utils.clip_grad_norm_.  Embedded in the
-- binary; lfl_nn.c runs it after nn.lua and loss.lua, with the fl table
-- (checkpoint.lua saves and loads what it keeps).
--
-- An optimizer changes the parameters in place, under fl.no_grad (a step
-- is no part of any gradient's history), so a module's tensors stay the
-- same objects: a compiled function bound to them sees the new values.

local fl = ...
local nn = fl.nn
local optim = {}
local lr_scheduler = {}
fl.optim, optim.lr_scheduler = optim, lr_scheduler
nn.utils = nn.utils or {}

local fmt = string.format

-- ---------------------------------------------------------------------------
-- helpers
-- ---------------------------------------------------------------------------

local shape_str, same_shape = nn._util.shape_str, nn._util.same_shape

-- A new tensor with t's values (PyTorch's clone).
local function clone(t)
  return fl.zeros(t.shape, {dtype = t.dtype, device = t.device}):copy_(t)
end

-- v rounded to float32 (what a float32 kernel computes with)
local function f32(v) return (string.unpack("<f", string.pack("<f", v))) end

local function zeros_like(t) return fl.zeros(t.shape, {dtype = t.dtype, device = t.device}) end

-- Keys of opts must be among allowed: catches typos ("momentun").
local function check_keys(opts, allowed, what, where)
  for k in pairs(opts) do
    if allowed[k] == nil then
      local names = {}
      for n in pairs(allowed) do names[#names + 1] = n end
      table.sort(names)
      error(fmt("%s: unknown option '%s'%s (expected %s)", what, tostring(k), where or "",
                table.concat(names, ", ")), 0)
    end
  end
end

-- A number check with PyTorch's message ("invalid learning rate: -1").
local function check_number(v, ok, label, what)
  if type(v) ~= "number" or not ok(v) then
    error(fmt("%s: invalid %s: %s", what, label, tostring(v)), 0)
  end
end

local function nonneg(v) return v >= 0 end

-- The parameters an optimizer is given: a module (its parameters()), a
-- tensor, a list of tensors, or a list of groups {params = ..., lr = ...}.
local function tensor_list(params, what)
  if nn.is_module(params) then return params:parameters() end
  if fl.is_tensor(params) then return {params} end
  if type(params) ~= "table" then
    error(fmt("%s: params must be a module, a tensor, a list of tensors or a list of "
              .. "parameter groups, got %s", what, type(params)), 0)
  end
  return params
end

-- ---------------------------------------------------------------------------
-- Optimizer: what every optimizer shares
-- ---------------------------------------------------------------------------

local Optimizer = {}
Optimizer.__index = Optimizer
optim.Optimizer = Optimizer

-- A new optimizer class: name ("fl.optim.SGD"), its defaults (every
-- option it takes, with its default value), a check of a group's options,
-- the eager update of one parameter and the compiled one (see "the
-- compiled step" below).
local function optimizer_class(name, defaults, check, update, compiled)
  local cls = setmetatable({__name = name, defaults = defaults, _check = check, _update = update,
                            _compiled_update = compiled},
                           {__index = Optimizer})
  cls.__index = cls
  cls.__tostring = Optimizer.__tostring
  return cls
end

local function new_optimizer(cls, params, opts)
  local what = cls.__name
  if opts ~= nil and type(opts) ~= "table" then
    error(fmt("%s: expected an options table, got %s", what, type(opts)), 0)
  end
  opts = opts or {}
  check_keys(opts, cls.defaults, what)
  local self = setmetatable({param_groups = {}, state = {}, defaults = {}}, cls)
  for k, v in pairs(cls.defaults) do self.defaults[k] = v end
  for k, v in pairs(opts) do self.defaults[k] = v end
  cls._check(self.defaults, what)
  local list = tensor_list(params, what)
  if #list == 0 then error(what .. ": got an empty parameter list", 0) end
  if fl.is_tensor(list[1]) then list = {{params = list}} end
  for _, g in ipairs(list) do self:add_param_group(g) end
  return self
end

-- opt:add_param_group{params = ..., lr = ...}: a group's options default
-- to the optimizer's; a tensor in two groups is an error, as in PyTorch.
function Optimizer:add_param_group(group)
  local what = self.__name .. ":add_param_group"
  if type(group) ~= "table" or fl.is_tensor(group) or group.params == nil then
    error(what .. ": a parameter group is a table {params = {...}, option = value, ...}", 0)
  end
  local allowed = {params = true, initial_lr = true}
  for k in pairs(self.defaults) do allowed[k] = true end
  check_keys(group, allowed, what, " in a parameter group")
  local g = {}
  for k, v in pairs(self.defaults) do g[k] = v end
  for k, v in pairs(group) do g[k] = v end
  if type(g.betas) == "table" then g.betas = {g.betas[1], g.betas[2]} end
  local ps = tensor_list(group.params, what)
  g.params = {}
  for i, p in ipairs(ps) do
    if not fl.is_tensor(p) then
      error(fmt("%s: params[%d] is a %s; an optimizer can only optimize tensors", what, i, type(p)), 0)
    end
    if not p.is_leaf then
      error(fmt("%s: params[%d] %s is not a leaf (it was computed from other tensors); "
                .. "optimize the tensors it comes from, or x:detach():requires_grad_()", what, i,
                shape_str(p)), 0)
    end
    for gi, other in ipairs(self.param_groups) do
      for _, q in ipairs(other.params) do
        if q == p then
          error(fmt("%s: params[%d] is already in parameter group %d", what, i, gi), 0)
        end
      end
    end
    g.params[i] = p
  end
  self._check(g, self.__name)
  self.param_groups[#self.param_groups + 1] = g
  return self
end

function Optimizer.__tostring(self)
  local lines = {self.__name .. " ("}
  for i, g in ipairs(self.param_groups) do
    local keys = {}
    for k in pairs(g) do if k ~= "params" then keys[#keys + 1] = k end end
    table.sort(keys)
    lines[#lines + 1] = fmt("Parameter Group %d", i - 1)
    for _, k in ipairs(keys) do
      local v = g[k]
      if type(v) == "table" then v = "(" .. table.concat(v, ", ") .. ")" end
      lines[#lines + 1] = fmt("    %s: %s", k, tostring(v))
    end
  end
  lines[#lines + 1] = ")"
  return table.concat(lines, "\n")
end

-- opt:zero_grad([set_to_none]): every parameter's .grad set to nil
-- (PyTorch's default), or zeroed in place with false.
function Optimizer:zero_grad(set_to_none)
  if fl._dry_capture then return end       -- fl.compile's dry capture runs nothing
  for _, g in ipairs(self.param_groups) do
    for _, p in ipairs(g.params) do
      if set_to_none == false then
        local grad = p.grad
        if grad and grad.requires_grad then   -- a history (create_graph): detached first
          grad = grad:detach()
          p.grad = grad
        end
        if grad then grad:zero_() end
      else
        p.grad = nil
      end
    end
  end
end

-- opt:step([closure]): one update of every parameter that has a .grad
-- (the others are skipped, their state untouched), in place under
-- fl.no_grad.  A closure is called first, with grad mode on, and what it
-- returns (the loss) is returned.
function Optimizer:step(closure)
  local loss
  if closure ~= nil then loss = fl.enable_grad(closure) end
  if fl._tracing() then
    -- inside fl.compile (or fl.capture): a graph break (each call's .grad
    -- is new: a graph cannot hold it), then the compiled update, which
    -- reads them as arguments; outside any trace.  fl.compile's dry
    -- capture of a training function runs nothing.
    fl._break_optimizer()
    if not fl._dry_capture then fl._untraced(fl.no_grad, function() self:_step_compiled() end) end
    return loss
  end
  fl.no_grad(function()
    for _, g in ipairs(self.param_groups) do
      for _, p in ipairs(g.params) do
        local grad = p.grad
        if grad ~= nil then self:_step_eager(p, g, grad) end
      end
    end
  end)
  return loss
end

-- One parameter's eager update.  grad is a handle of our own on p.grad
-- (each read of p.grad makes one): its hold on the gradient's memory goes
-- now, not at the next collection, so that once zero_grad lets the
-- gradient go the next backward reuses that memory.
function Optimizer:_step_eager(p, g, grad)
  local st = self.state[p]
  if st == nil then
    st = {}
    self.state[p] = st
  end
  self._update(p, grad, st, g)
  fl._drop(grad)
end

-- ---------------------------------------------------------------------------
-- the compiled step: opt:step() inside fl.compile
-- ---------------------------------------------------------------------------
-- Each parameter group's update is one fl.compile'd function of the
-- group's per-step scalars, then every parameter, its gradient and its
-- state tensors: it writes the new values into them (captured writes,
-- which the fusion planner stores in place from the kernel that computes
-- them: no copy), one fused kernel per parameter.  The step count never
-- reaches the graph as a constant: what depends on it (lr / (1 -
-- beta1^step), sqrt(1 - beta2^step)) is computed in double in Lua, as the
-- eager update computes it, and passed rounded to float32 in a tensor, so
-- a growing step count and a scheduler's lr never recompile.  The other
-- hyperparameters are the function's constants: changing one builds
-- another function.  A parameter's first step (its state made) runs
-- eagerly, as does a group whose update will not compile.
--
-- A class's compiled update is {ready = function(st, g) (the state is
-- made), scalars = function(st, g) (a list of numbers per parameter),
-- state = function(st, g) (its state tensors, in place order), names =
-- function(g) (theirs), body =
-- function(g) -> function(p, grad, s, state...) -> the new p and state...
-- (s: the parameter's scalars as a list of 0-d tensors)}.

local COMPILED_KEEP = 8        -- compiled updates kept per part of a group (hyperparameter sets)
local COMPILED_ARGS = 64       -- arguments of one compiled update (lfl_compile.c's entries)

-- The function a group's compiled update traces: n parameters, each with
-- the state tensors named in names, after a [n, c] tensor of scalars.  Its
-- arguments are named (p1, p1_grad, p1_exp_avg, ...) for cm:code().
local function group_update(body, n, names, c)
  local k = #names
  local function update(sc, ...)
    local a = {...}
    for i = 0, n - 1 do
      local base = i * (k + 2)
      local p, grad = a[base + 1], a[base + 2]
      local row = sc:narrow(1, i + 1, 1):reshape{c}
      local s = {}
      for j = 1, c do s[j] = row:narrow(1, j, 1):reshape{} end
      local state = {}
      for j = 1, k do state[j] = a[base + 2 + j] end
      local new = {body(p, grad, s, table.unpack(state))}
      p:copy_(new[1])
      for j = 1, k do state[j]:copy_(new[j + 1]) end
    end
  end
  -- (a Lua function passes at most ~250 values: a larger group's
  -- arguments keep their positional names)
  if n * (k + 2) > 120 then return update end
  local params = {}
  for i = 1, n do
    params[#params + 1] = ("p%d, p%d_grad"):format(i, i)
    for _, nm in ipairs(names) do params[#params + 1] = ("p%d_%s"):format(i, nm) end
  end
  params = table.concat(params, ", ")
  return assert(load(("local update = ...; return function(scalars, %s) return update(scalars, %s) end")
                     :format(params, params), "=optimizer update"))(update)
end

-- The group's hyperparameters other than lr, as a key.
local function constants_key(g, list)
  local parts = {}
  for k, v in pairs(g) do
    if k ~= "params" and k ~= "lr" and k ~= "initial_lr" then
      if type(v) == "table" then v = table.concat(v, ",") end
      parts[#parts + 1] = k .. "=" .. tostring(v)
    end
  end
  table.sort(parts)
  local ids = {}
  for i, p in ipairs(list) do ids[i] = tostring(fl._tensor_key(p)) end
  return table.concat(parts, ";") .. "|" .. table.concat(ids, ",")
end

-- One compiled update of the parameters in list (part ci of group g,
-- ready), their gradients' handles in grads (see _step_eager).
function Optimizer:_run_compiled(gi, ci, g, list, grads)
  local cu = self._compiled_update
  local rows, args = {}, {}
  for i, p in ipairs(list) do
    local st = self.state[p]
    rows[#rows + 1] = cu.scalars(st, g)
    args[#args + 1] = p
    args[#args + 1] = grads[i]
    for _, t in ipairs(cu.state(st, g)) do args[#args + 1] = t end
  end
  local parts = self._compiled[gi] or {}
  self._compiled[gi] = parts
  local per = parts[ci] or {keys = {}, fns = {}}
  parts[ci] = per
  local key = constants_key(g, list)
  local fn = per.fns[key]
  if fn == nil then
    if #per.keys >= COMPILED_KEEP then per.fns[table.remove(per.keys, 1)] = nil end
    fn = fl.compile(group_update(cu.body(g), #list, cu.names(g), #rows[1]))
    per.fns[key] = fn
    per.keys[#per.keys + 1] = key
  end
  local scalars = fl.tensor(rows, {dtype = list[1].dtype, device = list[1].device})
  fn(scalars, table.unpack(args))
  fl._drop(scalars, table.unpack(grads))    -- our handles (see _step_eager)
  for _, p in ipairs(list) do
    local st = self.state[p]
    if st.step ~= nil then st.step = st.step + 1 end
  end
end

function Optimizer:_step_compiled()
  local cu = self._compiled_update
  self._compiled = self._compiled or {}
  for gi, g in ipairs(self.param_groups) do
    local list, grads, ci = {}, {}, 1
    -- a large group in parts of at most COMPILED_ARGS arguments
    local per = cu and (COMPILED_ARGS - 1) // (#cu.names(g) + 2)
    for _, p in ipairs(g.params) do
      local grad = p.grad
      if grad ~= nil then
        local st = self.state[p]
        if cu == nil or st == nil or not cu.ready(st, g) then
          self:_step_eager(p, g, grad)          -- its first step: the state made
        else
          list[#list + 1], grads[#list + 1] = p, grad
          if #list == per then
            self:_run_compiled(gi, ci, g, list, grads)
            list, grads, ci = {}, {}, ci + 1
          end
        end
      end
    end
    if #list > 0 then self:_run_compiled(gi, ci, g, list, grads) end
  end
end

-- opt:compiled() -> the compiled updates its steps inside fl.compile ran,
-- {{group = i, part = j, fn = compiled function}...}, a group of many
-- parameters in parts: their cm:stats(), cm:code().
function Optimizer:compiled()
  local out = {}
  for gi = 1, #self.param_groups do
    for ci, per in ipairs((self._compiled or {})[gi] or {}) do
      for _, key in ipairs(per.keys) do out[#out + 1] = {group = gi, part = ci, fn = per.fns[key]} end
    end
  end
  return out
end

-- Group options are plain values; betas is a pair to copy.
local function copy_value(v)
  if type(v) == "table" then
    local c = {}
    for k, x in pairs(v) do c[k] = x end
    return c
  end
  return v
end

-- opt:state_dict(): PyTorch's layout.  Parameters are numbered from 0 in
-- the order of the groups; state[i] holds parameter i's state (its
-- tensors themselves, not copies, as PyTorch's does; step a number),
-- param_groups[g] the group's options and params = the list of its
-- parameters' numbers.
function Optimizer:state_dict()
  local index, n, groups, state = {}, 0, {}, {}
  for gi, g in ipairs(self.param_groups) do
    local pg = {}
    for k, v in pairs(g) do if k ~= "params" then pg[k] = copy_value(v) end end
    pg.params = {}
    for j, p in ipairs(g.params) do
      if index[p] == nil then
        index[p] = n
        n = n + 1
      end
      pg.params[j] = index[p]
    end
    groups[gi] = pg
  end
  for p, st in pairs(self.state) do
    if index[p] ~= nil then
      local s = {}
      for k, v in pairs(st) do s[k] = v end
      state[index[p]] = s
    end
  end
  return {state = state, param_groups = groups}
end

-- opt:load_state_dict(sd): the groups' options and every parameter's
-- state from sd, matched by position.  State tensors are copied (two
-- optimizers never share a buffer) and must have their parameter's shape.
function Optimizer:load_state_dict(sd)
  local what = self.__name .. ":load_state_dict"
  if type(sd) ~= "table" or type(sd.param_groups) ~= "table" or type(sd.state) ~= "table" then
    error(what .. ": expected a table {state = ..., param_groups = ...} from state_dict()", 0)
  end
  local groups = self.param_groups
  if #sd.param_groups ~= #groups then
    error(fmt("%s: the state has %d parameter group(s), the optimizer %d", what, #sd.param_groups,
              #groups), 0)
  end
  local by_index = {}
  for gi, g in ipairs(groups) do
    local saved = sd.param_groups[gi]
    if type(saved.params) ~= "table" or #saved.params ~= #g.params then
      error(fmt("%s: parameter group %d has %d parameter(s) in the state, %d in the optimizer", what,
                gi, type(saved.params) == "table" and #saved.params or 0, #g.params), 0)
    end
    for j, p in ipairs(g.params) do by_index[saved.params[j]] = p end
  end
  -- every check before anything changes
  local allowed = {params = true, initial_lr = true}
  for k in pairs(self.defaults) do allowed[k] = true end
  for gi = 1, #groups do check_keys(sd.param_groups[gi], allowed, what, fmt(" in parameter group %d", gi)) end
  for i, st in pairs(sd.state) do
    local p = by_index[i]
    if p == nil then error(fmt("%s: state for parameter %s, which no group lists", what, tostring(i)), 0) end
    for k, v in pairs(st) do
      if fl.is_tensor(v) and not same_shape(v, p) then
        error(fmt("%s: state %s.%s is %s, its parameter %s", what, tostring(i), k, shape_str(v),
                  shape_str(p)), 0)
      end
    end
  end
  self.state = {}
  for i, st in pairs(sd.state) do
    local p, s = by_index[i], {}
    for k, v in pairs(st) do
      if fl.is_tensor(v) then
        s[k] = fl.no_grad(function() return clone(v:to(p.dtype)) end)
      else
        s[k] = v
      end
    end
    self.state[p] = s
  end
  for gi, g in ipairs(groups) do
    for k, v in pairs(sd.param_groups[gi]) do
      if k ~= "params" then g[k] = copy_value(v) end
    end
  end
end

-- ---------------------------------------------------------------------------
-- SGD
-- ---------------------------------------------------------------------------

local function check_sgd(g, what)
  check_number(g.lr, nonneg, "learning rate", what)
  check_number(g.momentum, nonneg, "momentum value", what)
  check_number(g.dampening, function() return true end, "dampening value", what)
  check_number(g.weight_decay, nonneg, "weight_decay value", what)
  if g.nesterov and (g.momentum <= 0 or g.dampening ~= 0) then
    error(what .. ": Nesterov momentum requires a momentum and zero dampening", 0)
  end
end

-- torch.optim.sgd._single_tensor_sgd, term for term:
--   g = grad (+ weight_decay * p);  buf = g at the first step, else
--   momentum * buf + (1 - dampening) * g;  g = g + momentum * buf
--   (nesterov) or buf;  p = p - lr * g
local function sgd_update(p, grad, st, g)
  -- float32 on the CPU: one fused pass (cpu/optim.c), the same arithmetic
  local first = g.momentum ~= 0 and st.momentum_buffer == nil
  if first then st.momentum_buffer = zeros_like(p) end
  if fl._sgd_step(p, grad, g.momentum ~= 0 and st.momentum_buffer or nil,
                  {lr = g.lr, momentum = g.momentum, dampening = g.dampening,
                   weight_decay = g.weight_decay, nesterov = g.nesterov,
                   maximize = g.maximize, first = first}) then
    return
  end
  if first then st.momentum_buffer = nil end
  if g.maximize then grad = -grad end
  if g.weight_decay ~= 0 then grad = grad + p * g.weight_decay end
  if g.momentum ~= 0 then
    local buf = st.momentum_buffer
    if buf == nil then
      buf = clone(grad)
      st.momentum_buffer = buf
    else
      buf:mul_(g.momentum):add_(grad * (1 - g.dampening))
    end
    if g.nesterov then grad = grad + buf * g.momentum else grad = buf end
  end
  p:add_(grad * -g.lr)
end

-- the same update as tensor ops, for the compiled step
local sgd_compiled = {
  ready = function(st, g) return g.momentum == 0 or st.momentum_buffer ~= nil end,
  scalars = function(_, g) return {-g.lr} end,
  state = function(st, g) return g.momentum ~= 0 and {st.momentum_buffer} or {} end,
  names = function(g) return g.momentum ~= 0 and {"momentum_buffer"} or {} end,
  body = function(g)
    local mom, damp, wd = g.momentum, 1 - g.dampening, g.weight_decay
    local nesterov, maximize = g.nesterov, g.maximize
    return function(p, grad, s, buf)
      if maximize then grad = -grad end
      if wd ~= 0 then grad = grad + p * wd end
      if buf then
        buf = buf * mom + grad * damp
        grad = nesterov and grad + buf * mom or buf
      end
      return p + s[1] * grad, buf
    end
  end,
}

local SGD = optimizer_class("fl.optim.SGD",
  {lr = 1e-3, momentum = 0, dampening = 0, weight_decay = 0, nesterov = false, maximize = false},
  check_sgd, sgd_update, sgd_compiled)

-- fl.optim.SGD(params [, {lr=1e-3, momentum=0, dampening=0,
-- weight_decay=0, nesterov=false, maximize=false}])
function optim.SGD(params, opts) return new_optimizer(SGD, params, opts) end

-- ---------------------------------------------------------------------------
-- Adam and AdamW
-- ---------------------------------------------------------------------------

local function check_adam(g, what)
  check_number(g.lr, nonneg, "learning rate", what)
  check_number(g.eps, nonneg, "epsilon value", what)
  if type(g.betas) ~= "table" or #g.betas ~= 2 then
    error(fmt("%s: betas must be a pair {beta1, beta2}, got %s", what, tostring(g.betas)), 0)
  end
  for i = 1, 2 do
    check_number(g.betas[i], function(b) return b >= 0 and b < 1 end,
                 fmt("beta parameter at index %d", i - 1), what)
  end
  check_number(g.weight_decay, nonneg, "weight_decay value", what)
end

-- torch.optim.adam._single_tensor_adam, term for term (AdamW is the same
-- with decoupled_weight_decay):
--   step += 1;  p *= 1 - lr * wd (decoupled) or g = g + wd * p
--   m = lerp(m, g, 1 - beta1);  v = beta2 * v + (1 - beta2) * g * g
--   vmax = max(vmax, v) (amsgrad);  denom = sqrt(v or vmax) / sqrt(1 - beta2^step) + eps
--   p = p - lr / (1 - beta1^step) * m / denom
-- The bias corrections are computed in double from the step count, as
-- PyTorch computes them in Python.
local function adam_update(p, grad, st, g)
  if st.step == nil then
    st.step = 0
    st.exp_avg = zeros_like(p)
    st.exp_avg_sq = zeros_like(p)
    if g.amsgrad then st.max_exp_avg_sq = zeros_like(p) end
  end
  st.step = st.step + 1
  local lr, beta1, beta2 = g.lr, g.betas[1], g.betas[2]
  if g.amsgrad and st.max_exp_avg_sq == nil then st.max_exp_avg_sq = zeros_like(p) end
  -- float32 on the CPU: one fused pass (cpu/optim.c), the same arithmetic
  if fl._adam_step(p, grad, st.exp_avg, st.exp_avg_sq, g.amsgrad and st.max_exp_avg_sq or nil,
                   {lr = lr, beta1 = beta1, beta2 = beta2, eps = g.eps, weight_decay = g.weight_decay,
                    decoupled = g.decoupled_weight_decay, maximize = g.maximize, step = st.step}) then
    return
  end
  if g.maximize then grad = -grad end       -- (the fused pass negates its own)
  if g.weight_decay ~= 0 then
    if g.decoupled_weight_decay then p:mul_(1 - lr * g.weight_decay)
    else grad = grad + p * g.weight_decay end
  end
  local m, v = st.exp_avg, st.exp_avg_sq
  -- lerp(m, grad, w) as PyTorch's kernel: the weight a float32, and 1 - w
  -- taken in float32 too
  local w = f32(1 - beta1)
  if w < 0.5 then m:add_((grad - m) * w) else m:copy_(grad - (grad - m) * f32(1 - w)) end
  v:mul_(beta2):add_(grad * (1 - beta2) * grad)
  local bias_correction1 = 1 - beta1 ^ st.step
  local bias_correction2 = 1 - beta2 ^ st.step
  local step_size = lr / bias_correction1
  local bias_correction2_sqrt = bias_correction2 ^ 0.5
  if g.amsgrad then
    if st.max_exp_avg_sq == nil then st.max_exp_avg_sq = zeros_like(p) end
    st.max_exp_avg_sq:copy_(fl.maximum(st.max_exp_avg_sq, v))
    v = st.max_exp_avg_sq
  end
  local denom = v:sqrt() / bias_correction2_sqrt + g.eps
  p:add_(m * -step_size / denom)              -- addcdiv's order: (value * m) / denom
end

-- the same update as tensor ops, for the compiled step: the scalars are
-- -lr / (1 - beta1^step), sqrt(1 - beta2^step) and 1 - lr * weight_decay,
-- in double as cpu/optim.c computes them, for the step about to be taken
local adam_compiled = {
  ready = function(st, g) return st.step ~= nil and (not g.amsgrad or st.max_exp_avg_sq ~= nil) end,
  scalars = function(st, g)
    local step = st.step + 1
    return {-(g.lr / (1 - g.betas[1] ^ step)), math.sqrt(1 - g.betas[2] ^ step),
            1 - g.lr * g.weight_decay}
  end,
  state = function(st, g)
    return g.amsgrad and {st.exp_avg, st.exp_avg_sq, st.max_exp_avg_sq} or {st.exp_avg, st.exp_avg_sq}
  end,
  names = function(g)
    return g.amsgrad and {"exp_avg", "exp_avg_sq", "max_exp_avg_sq"} or {"exp_avg", "exp_avg_sq"}
  end,
  body = function(g)
    local w, b2, cb2, eps = f32(1 - g.betas[1]), g.betas[2], 1 - g.betas[2], g.eps
    local wd, amsgrad, maximize = g.weight_decay, g.amsgrad, g.maximize
    local decoupled = g.decoupled_weight_decay
    return function(p, grad, s, m, v, vmax)
      if maximize then grad = -grad end
      if wd ~= 0 then
        if decoupled then p = p * s[3] else grad = grad + p * wd end
      end
      if w < 0.5 then m = m + (grad - m) * w else m = grad - (grad - m) * f32(1 - w) end
      v = v * b2 + grad * cb2 * grad
      local vi = v
      if amsgrad then
        vmax = fl.maximum(vmax, v)
        vi = vmax
      end
      return p + s[1] * m / (vi:sqrt() / s[2] + eps), m, v, vmax
    end
  end,
}

local Adam = optimizer_class("fl.optim.Adam",
  {lr = 1e-3, betas = {0.9, 0.999}, eps = 1e-8, weight_decay = 0, amsgrad = false, maximize = false,
   decoupled_weight_decay = false},
  check_adam, adam_update, adam_compiled)

local AdamW = optimizer_class("fl.optim.AdamW",
  {lr = 1e-3, betas = {0.9, 0.999}, eps = 1e-8, weight_decay = 1e-2, amsgrad = false, maximize = false,
   decoupled_weight_decay = true},
  function(g, what)
    if g.decoupled_weight_decay ~= true then
      error(what .. ": decoupled_weight_decay is what AdamW is; use fl.optim.Adam for the other", 0)
    end
    check_adam(g, what)
  end, adam_update, adam_compiled)

-- fl.optim.Adam(params [, {lr=1e-3, betas={0.9, 0.999}, eps=1e-8,
-- weight_decay=0, amsgrad=false, maximize=false, decoupled_weight_decay=false}])
function optim.Adam(params, opts) return new_optimizer(Adam, params, opts) end

-- fl.optim.AdamW(params [, {... weight_decay=1e-2}]): Adam with the weight
-- decay decoupled from the gradient (p *= 1 - lr * weight_decay first).
function optim.AdamW(params, opts) return new_optimizer(AdamW, params, opts) end

-- ---------------------------------------------------------------------------
-- learning-rate schedulers
-- ---------------------------------------------------------------------------

local Scheduler = {}
Scheduler.__index = Scheduler

local function lrs_of(opt)
  local l = {}
  for i, g in ipairs(opt.param_groups) do l[i] = g.lr end
  return l
end

-- PyTorch's LRScheduler.__init__: initial_lr remembered in each group
-- (base_lrs), then one step to epoch 0.  last_epoch > -1 resumes, which
-- needs the groups' initial_lr (a loaded optimizer state has them).
local function new_scheduler(self, opt, last_epoch, what)
  if getmetatable(opt) == nil or getmetatable(opt).__name == nil or opt.param_groups == nil then
    error(what .. ": expected an optimizer (fl.optim.SGD, Adam, AdamW)", 0)
  end
  last_epoch = last_epoch or -1
  if math.tointeger(last_epoch) == nil or last_epoch < -1 then
    error(fmt("%s: last_epoch must be an integer >= -1, got %s", what, tostring(last_epoch)), 0)
  end
  for i, g in ipairs(opt.param_groups) do
    if last_epoch == -1 then
      if g.initial_lr == nil then g.initial_lr = g.lr end
    elseif g.initial_lr == nil then
      error(fmt("%s: param_groups[%d] has no initial_lr, needed to resume with last_epoch %d "
                .. "(load the optimizer's state first)", what, i, last_epoch), 0)
    end
  end
  self.optimizer, self.last_epoch, self._step_count = opt, last_epoch, 0
  self.base_lrs = {}
  for i, g in ipairs(opt.param_groups) do self.base_lrs[i] = g.initial_lr end
  self._is_initial = true
  self:step()
  self._is_initial = false
  return self
end

-- sched:step([epoch]): the next epoch's learning rates, written into the
-- optimizer's groups, computed from the current ones as PyTorch's
-- get_lr does; with an epoch (deprecated in PyTorch), the closed form
-- at that epoch.
function Scheduler:step(epoch)
  self._step_count = self._step_count + 1
  local lrs
  if epoch == nil then
    self.last_epoch = self.last_epoch + 1
    lrs = self:get_lr()
  else
    self.last_epoch = epoch
    lrs = self:_closed_form()
  end
  for i, g in ipairs(self.optimizer.param_groups) do g.lr = lrs[i] end
  self._last_lr = lrs_of(self.optimizer)
end

-- sched:get_last_lr(): the learning rates the last step set, a list (one
-- per group), a copy.
function Scheduler:get_last_lr()
  local l = {}
  for i, v in ipairs(self._last_lr) do l[i] = v end
  return l
end

-- The scheduler's state: every field but the optimizer (PyTorch's).
function Scheduler:state_dict()
  local sd = {}
  for k, v in pairs(self) do
    if k ~= "optimizer" and k ~= "_is_initial" then sd[k] = copy_value(v) end
  end
  return sd
end

function Scheduler:load_state_dict(sd)
  for k, v in pairs(sd) do
    if k ~= "optimizer" then self[k] = copy_value(v) end
  end
end

local function scheduler_class(name)
  local cls = setmetatable({__name = name}, {__index = Scheduler})
  cls.__index = cls
  return cls
end

local function check_opts(opts, allowed, what) nn._util.options(opts, allowed, what, true) end

-- StepLR: lr times gamma every step_size epochs.
local StepLR = scheduler_class("fl.optim.lr_scheduler.StepLR")

function StepLR:get_lr()
  if self.last_epoch == 0 or self.last_epoch % self.step_size ~= 0 then
    return lrs_of(self.optimizer)
  end
  local l = {}
  for i, g in ipairs(self.optimizer.param_groups) do l[i] = g.lr * self.gamma end
  return l
end

function StepLR:_closed_form()
  local l = {}
  for i, base in ipairs(self.base_lrs) do l[i] = base * self.gamma ^ (self.last_epoch // self.step_size) end
  return l
end

-- fl.optim.lr_scheduler.StepLR(opt, {step_size= [, gamma=0.1] [, last_epoch=-1]})
function lr_scheduler.StepLR(opt, opts)
  local what = "fl.optim.lr_scheduler.StepLR"
  check_opts(opts, {"step_size", "gamma", "last_epoch"}, what)
  local step_size = math.tointeger(opts.step_size)
  if step_size == nil or step_size < 1 then
    error(fmt("%s: step_size must be an integer >= 1, got %s", what, tostring(opts.step_size)), 0)
  end
  local gamma = opts.gamma or 0.1
  check_number(gamma, function() return true end, "gamma", what)
  return new_scheduler(setmetatable({step_size = step_size, gamma = gamma}, StepLR), opt,
                       opts.last_epoch, what)
end

-- CosineAnnealingLR: PyTorch's recursive form of
--   eta_min + (base_lr - eta_min) * (1 + cos(pi * epoch / T_max)) / 2
-- (each step from the current lr, so a changed lr carries on), which
-- keeps going past T_max (the cosine rises again).
local Cosine = scheduler_class("fl.optim.lr_scheduler.CosineAnnealingLR")

function Cosine:get_lr()
  local e, T, eta = self.last_epoch, self.T_max, self.eta_min
  local l = {}
  for i, g in ipairs(self.optimizer.param_groups) do
    local base = self.base_lrs[i]
    if self._is_initial then
      l[i] = g.lr
    elseif self._step_count == 1 and e > 0 then
      l[i] = eta + (base - eta) * (1 + math.cos(e * math.pi / T)) / 2
    elseif (e - 1 - T) % (2 * T) == 0 then
      l[i] = g.lr + (base - eta) * (1 - math.cos(math.pi / T)) / 2
    else
      l[i] = (1 + math.cos(math.pi * e / T)) / (1 + math.cos(math.pi * (e - 1) / T)) * (g.lr - eta) + eta
    end
  end
  return l
end

function Cosine:_closed_form()
  local l = {}
  for i, base in ipairs(self.base_lrs) do
    l[i] = self.eta_min + (base - self.eta_min) * (1 + math.cos(math.pi * self.last_epoch / self.T_max)) / 2
  end
  return l
end

-- fl.optim.lr_scheduler.CosineAnnealingLR(opt, {T_max= [, eta_min=0] [, last_epoch=-1]})
function lr_scheduler.CosineAnnealingLR(opt, opts)
  local what = "fl.optim.lr_scheduler.CosineAnnealingLR"
  check_opts(opts, {"T_max", "eta_min", "last_epoch"}, what)
  local T = math.tointeger(opts.T_max)
  if T == nil or T < 1 then
    error(fmt("%s: T_max must be an integer >= 1, got %s", what, tostring(opts.T_max)), 0)
  end
  local eta = opts.eta_min or 0
  check_number(eta, function() return true end, "eta_min", what)
  return new_scheduler(setmetatable({T_max = T, eta_min = eta}, Cosine), opt, opts.last_epoch, what)
end

-- ---------------------------------------------------------------------------
-- gradient clipping
-- ---------------------------------------------------------------------------

-- The p-norm of a tensor as a 0-d tensor (vector_norm), p > 0 or inf.
local function vector_norm(x, p)
  if p == math.huge then return x:abs():amax() end
  if p == 2 then return (x * x):sum():sqrt() end
  if p == 1 then return x:abs():sum() end
  return (x:abs() ^ p):sum() ^ (1 / p)
end

-- fl.nn.utils.clip_grad_norm_(params, max_norm [, {norm_type=2,
-- error_if_nonfinite=false}]) -> the total norm, a number.  PyTorch's:
-- the norm of every .grad's norm, then each .grad scaled in place by
-- min(max_norm / (total + 1e-6), 1), computed as float32 tensors.
function nn.utils.clip_grad_norm_(params, max_norm, opts)
  local what = "clip_grad_norm_"
  if opts ~= nil then check_opts(opts, {"norm_type", "error_if_nonfinite"}, what) end
  opts = opts or {}
  check_number(max_norm, function() return true end, "max_norm", what)
  local p = opts.norm_type or 2
  if p == "inf" then p = math.huge end
  if type(p) ~= "number" or not (p > 0) then
    error(fmt("%s: norm_type must be a number > 0 or 'inf', got %s", what, tostring(opts.norm_type)), 0)
  end
  local grads = {}
  for _, t in ipairs(tensor_list(params, what)) do
    local g = t.grad
    if g ~= nil then grads[#grads + 1] = g end
  end
  if #grads == 0 then return 0.0 end
  return fl.no_grad(function()
    local norms = {}
    for i, g in ipairs(grads) do norms[i] = vector_norm(g, p):to("float32"):reshape(1) end
    local total = vector_norm(fl.cat(norms, 1), p)
    local t = total:item()
    if opts.error_if_nonfinite and (t ~= t or t == math.huge or t == -math.huge) then
      error(fmt("%s: the total norm of order %s of the gradients is non-finite (%s), so it cannot "
                .. "be clipped", what, tostring(p), tostring(t)), 0)
    end
    local coef = (fl.full({}, max_norm) / (total + 1e-6)):clamp{max = 1.0}
    for _, g in ipairs(grads) do g:mul_(coef:to(g.dtype)) end
    fl._drop(table.unpack(grads))   -- our handles (see Optimizer:_step_eager)
    return t
  end)
end

return optim
