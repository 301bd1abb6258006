-- compiled_optim.lua -- the optimizer compiled: opt:step() inside
-- fl.compile runs, per parameter group, one compiled update that writes
-- every parameter and its state in place (one fused kernel per
-- parameter, stored in place: no write-back copy), with the step count
-- and the learning rate passed as values (no recompile as they change),
-- equal to the eager step.
--
-- Tolerance: the compiled kernels may contract a multiply and an add into
-- one rounding where the eager pass rounds twice: after 20 steps from the
-- same gradients (fixed, so that no difference feeds back through a loss)
-- every parameter and state value within 4e-6 of eager's (values of
-- order 1).  Sabotage: an update that skips the momentum term, or a step
-- count baked into the graph, is off by 1e-2 or more.
local fl = fl or require "fuselab"
local t = require "tap"
local nn = fl.nn

local function maxdiff(a, b) return (a - b):abs():amax():item() end

-- n steps of opt (made by mk from the params) with the same gradients
-- each run: eagerly, or through fl.compile(function() opt:step() end)
local function run(mk, compiled, n, shapes)
  fl.manual_seed(3)
  local ps = {}
  for i, sh in ipairs(shapes) do ps[i] = fl.randn(sh):requires_grad_() end
  local opt = mk(ps)
  local step = function() opt:step() end
  if compiled then step = fl.compile(step) end
  fl.manual_seed(4)
  for _ = 1, n do
    for _, p in ipairs(ps) do p.grad = fl.randn(p.shape) * 0.1 end
    step()
  end
  return ps, opt, step
end

local SHAPES = {{24, 16}, {24}, {5, 24}, {3, 4, 5}}
local CASES = {
  {"SGD", function(ps) return fl.optim.SGD(ps, {lr = 0.1}) end},
  {"SGD momentum, nesterov, weight decay", function(ps)
    return fl.optim.SGD(ps, {lr = 0.05, momentum = 0.9, nesterov = true, weight_decay = 1e-2}) end},
  {"SGD momentum, dampening, maximize", function(ps)
    return fl.optim.SGD(ps, {lr = 0.05, momentum = 0.8, dampening = 0.3, maximize = true}) end},
  {"Adam", function(ps) return fl.optim.Adam(ps, {lr = 1e-2}) end},
  {"Adam, weight decay", function(ps) return fl.optim.Adam(ps, {lr = 1e-2, weight_decay = 0.1}) end},
  {"AdamW amsgrad", function(ps) return fl.optim.AdamW(ps, {lr = 1e-2, amsgrad = true}) end},
  {"AdamW beta1 0.3, maximize", function(ps)
    return fl.optim.AdamW(ps, {lr = 1e-2, betas = {0.3, 0.99}, maximize = true}) end},
}

for _, c in ipairs(CASES) do
  local name, mk = c[1], c[2]
  local pe, oe = run(mk, false, 20, SHAPES)
  local pc, oc, step = run(mk, true, 20, SHAPES)
  local worst = 0
  for i = 1, #pe do
    worst = math.max(worst, maxdiff(pc[i], pe[i]))
    for k, v in pairs(oe.state[pe[i]]) do
      if fl.is_tensor(v) then worst = math.max(worst, maxdiff(oc.state[pc[i]][k], v))
      elseif v ~= oc.state[pc[i]][k] then worst = math.huge end
    end
  end
  local u = oc:compiled()
  local us = u[1] and u[1].fn:stats() or {}
  t.ok(worst <= 4e-6 and #u == 1 and us.compiles == 1 and us.kernels == #SHAPES and
       us.calls == 19,
       ("%s: 20 compiled steps equal eager's (worst %.3g); one update compiled once, %s kernels "
        .. "for %d parameters, %s calls (the first step eager)"):format(name, worst,
        tostring(us.kernels), #SHAPES, tostring(us.calls)))
  local code = u[1] and u[1].fn:code() or ""
  t.ok(not code:find("copy_(", 1, true) and select(2, code:gsub("stored in place by k", "")) >= #SHAPES,
       name .. ": every parameter and state value is stored in place by the kernel that computes it")
  local s = step:stats()
  t.ok(s.graph_breaks == 1 and s.break_reasons[1].reason:find("optimizer's step", 1, true)
       and s.break_reasons[1].where:find("compiled_optim.lua:", 1, true),
       name .. ": the step is a graph break of the calling function, with its reason, at the caller's line ("
       .. tostring(s.break_reasons[1].where) .. ")")
end

-- a scheduler's learning rate and the step count are values, not constants
do
  local ps = {fl.randn{6, 3}:requires_grad_()}
  local opt = fl.optim.Adam(ps, {lr = 0.1})
  local sched = fl.optim.lr_scheduler.StepLR(opt, {step_size = 1, gamma = 0.5})
  local step = fl.compile(function() opt:step() end)
  local ref = {ps[1]:detach() * 1}
  local eopt = fl.optim.Adam({ref[1]:requires_grad_()}, {lr = 0.1})
  local esched = fl.optim.lr_scheduler.StepLR(eopt, {step_size = 1, gamma = 0.5})
  for _ = 1, 12 do
    local g = fl.randn{6, 3}
    ps[1].grad, ref[1].grad = g, g * 1
    step(); sched:step()
    eopt:step(); esched:step()
  end
  local us = opt:compiled()[1].fn:stats()
  t.ok(us.compiles == 1 and us.calls == 11 and maxdiff(ps[1], ref[1]) <= 4e-6,
       ("12 steps, lr halved every step: one compile (%d), equal to eager (%.3g)"):format(
       us.compiles, maxdiff(ps[1], ref[1])))
  opt.param_groups[1].betas = {0.5, 0.9}
  ps[1].grad = fl.randn{6, 3}
  step()
  t.ok(#opt:compiled() == 2, "another beta: another compiled update, the first one kept")
end

-- parameters without a gradient are skipped, their state untouched; a
-- strided gradient is read where it is
do
  local a, b = fl.randn{4, 4}:requires_grad_(), fl.randn{4}:requires_grad_()
  local opt = fl.optim.SGD({a, b}, {lr = 0.1, momentum = 0.9})
  local step = fl.compile(function() opt:step() end)
  a.grad, b.grad = fl.ones{4, 4}, fl.ones{4}
  step()
  local b_before, buf_before = b * 1, opt.state[b].momentum_buffer * 1
  local g = fl.randn{4, 4}
  local a_before, abuf = a * 1, opt.state[a].momentum_buffer * 1
  a.grad, b.grad = g:transpose(1, 2), nil
  step()
  local want_buf = abuf * 0.9 + g:transpose(1, 2)
  t.ok(maxdiff(b, b_before) == 0 and maxdiff(opt.state[b].momentum_buffer, buf_before) == 0 and
       maxdiff(opt.state[a].momentum_buffer, want_buf) <= 1e-6 and
       maxdiff(a, a_before - want_buf * 0.1) <= 1e-6,
       "a parameter without .grad keeps its value and state; a transposed gradient is read as it is")
end

-- a group of 40 parameters: updated in parts of at most 64 arguments,
-- each compiled once, equal to eager
do
  local shapes = {}
  for i = 1, 40 do shapes[i] = {i % 5 + 1, 3} end
  local mk = function(ps) return fl.optim.AdamW(ps, {lr = 1e-2}) end
  local pe = run(mk, false, 6, shapes)
  local pc, oc = run(mk, true, 6, shapes)
  local worst = 0
  for i = 1, #pe do worst = math.max(worst, maxdiff(pc[i], pe[i])) end
  local u, calls = oc:compiled(), 0
  for _, c in ipairs(u) do calls = calls + c.fn:stats().calls end
  t.ok(#u == 3 and u[3].part == 3 and calls == 15 and worst <= 4e-6,
       ("40 parameters: %d compiled parts, %d calls in 5 steps, equal to eager (%.3g)"):format(#u, calls, worst))
end

-- (a whole training step with the compiled update inside fl.compile:
-- compiled_train.lua)

t.done()
