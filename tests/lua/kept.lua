-- kept.lua -- values computed from weights alone (exec/program.c,
-- find_kept): a batch norm folded into its convolution's weights runs on
-- the first call and again only when a weight is written in place or the
-- input shapes change.  Every call is checked against the reference
-- interpreter with the weights' values of that moment; the launch counts
-- (k:stats().kept_runs, .kept_skips) must be exactly what the writes call
-- for.  Values a caller receives (outputs, views of them) and random ones
-- are never kept.  The file runs again in a child with FUSELAB_KEEP=0
-- (every kernel launched on every call), where nothing may be kept.
--
-- Tolerance: |got - want| <= 1e-5 + 1e-4 |want| (float32 convolutions of
-- a few hundred products and a folded batch norm against the double
-- reference, about 1e-6 off; a stale weight is off by 1e-1 or more).
local fl = fl or require "fuselab"
local t = require "tap"

local RTOL, ATOL = 1e-4, 1e-5
local off = os.getenv("FUSELAB_KEEP") == "0"

math.randomseed(20261204)
local R = math.random

local function close(a, b)
  return a ~= nil and fl.allclose(a, b, RTOL, ATOL)
end

local function maxerr(a, b) return (a - b):abs():amax():item() end

local function program(f, ...)
  return fl.capture(f, ...):decompose():optimize():fuse():codegen("cpu")
end

-- conv + batch norm (eval) + relu, random shapes: each write of a weight in
-- place is seen by the next call, compiled (the program and fl.compile)
-- and eager alike
do
  local nbad, ncase = 0, 0
  local counts_ok = true
  for case = 1, 4 do
    local ci, co, k = R(1, 6), R(2, 9), ({1, 3})[R(2)]
    local conv = nn.Conv2d(ci, co, k, {padding = k // 2})
    local bn = nn.BatchNorm2d(co)
    bn:eval()
    fl.no_grad(function()   -- parameters require grad
      bn.running_mean:copy_(fl.randn(co))
      bn.running_var:copy_(fl.rand(co) + 0.5)
      bn.weight:copy_(fl.randn(co))
      bn.bias:copy_(fl.randn(co))
    end)
    local f = function(x) return fl.relu(bn(conv(x))) end
    -- maps larger than the weights: keeping the folded weights fits the
    -- plan's peak (the budget case is below)
    local x = fl.randn(R(1, 2), ci, R(10, 16), R(10, 16))
    local kp = program(f, x)
    local cf = fl.compile(f, {backend = "cpu"})
    local writes = 0
    local steps = {
      false, false,
      function() fl.no_grad(bn.weight.mul_, bn.weight, -0.5) end,   -- a parameter
      false,
      function() bn.running_var:add_(0.25) end,
      function() bn.running_mean:copy_(fl.randn(co)) end,
      false, false,
      function() fl.no_grad(function() conv.weight[1] = fl.randn(ci, k, k) end) end,
      function() fl.no_grad(conv.bias.mul_, conv.bias, 2) end,
      false,
      function() fl.no_grad(bn.bias.fill_, bn.bias, 0.125) end,
    }
    for i, step in ipairs(steps) do
      if step then step(); writes = writes + 1 end
      local want = fl.capture(f, x):run_reference(x)
      local got, comp, eager = kp:run(x), cf(x), f(x)
      ncase = ncase + 1
      if not (close(got, want) and close(comp, want) and close(eager, want)) then
        nbad = nbad + 1
        t.diag(("case %d step %d: max err %g / %g / %g"):format(case, i, maxerr(got, want),
               maxerr(comp, want), maxerr(eager, want)))
      end
    end
    local s = kp:stats()
    local nk = off and 0 or s.kept
    if off then
      counts_ok = counts_ok and s.kept == 0 and s.kept_runs == 0 and s.kept_skips == 0
    else
      -- the first call and one call after each write launch them; the rest reuse
      counts_ok = counts_ok and s.kept >= 1 and s.kept_runs == nk * (writes + 1) and
                  s.kept_skips == nk * (#steps - writes - 1)
    end
    if not counts_ok then
      t.diag(("case %d: kept %d, runs %d, skips %d; %d calls, %d writes"):format(case, s.kept,
             s.kept_runs, s.kept_skips, #steps, writes))
    end
  end
  t.is(nbad, 0, ncase .. " calls of conv + batch norm + relu, weights written in place between " ..
       "some: compiled and eager match the reference")
  if off then
    t.ok(counts_ok, "FUSELAB_KEEP=0: nothing kept, every kernel launched every call")
  else
    t.ok(counts_ok, "the folded weights' kernels ran on the first call and after each write only")
  end
end

-- the listing says which kernels run only when weights change
if not off then
  local conv, bn = nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4)
  bn:eval()
  local kp = program(function(x) return bn(conv(x)) end, fl.randn(1, 3, 8, 8))
  local code = kp:code()
  t.ok(code:find("if weights_changed:", 1, true) and code:find("kept between calls:", 1, true) and
       code:find("extern conv2d%(x, kept%d+"), "the host program shows the kept kernels and values")
end

-- kept values are memory held between calls: a 4 MiB product of weights
-- kept through a later 1 MiB chain would raise the plan's peak above the
-- captured graph's, so it is computed on every call instead (and freed
-- after its reader), with the same results
if not off then
  local w = fl.randn(1024, 1024)
  local f = function(x, y) return x:matmul(w * 2), (y + 1) * 3 end
  local x, y = fl.randn(1, 1024), fl.randn(512, 512)
  local p = fl.capture(f, x, y):fuse()
  local kp = p:codegen("cpu")
  local a, b = kp:run(x, y)
  local a2 = kp:run(x, y)
  local s = p:stats()
  t.ok(kp:stats().kept == 0 and close(a, x:matmul(w * 2)) and close(a2, a) and close(b, (y + 1) * 3) and
       s.peak_bytes_after <= s.peak_bytes_before,
       ("a 4 MiB value from weights that would raise the peak is not kept (%d kept; peak %d -> %d)"):format(
         kp:stats().kept, s.peak_bytes_before, s.peak_bytes_after))
  -- small enough to fit: kept, and held in the plan's memory from the start
  local w2 = fl.randn(16, 1024)
  local g = function(x, y) return x:matmul((w2 * 2):transpose(1, 2)), (y + 1) * 3 end
  local p2 = fl.capture(g, x, y):fuse()
  local kp2 = p2:codegen("cpu")
  kp2:run(x, y); kp2:run(x, y)
  local m = p2:memory()
  t.ok(kp2:stats().kept == 1 and m.after[1].bytes >= 16 * 1024 * 4,
       ("a 64 KiB value from weights is kept, and the memory picture holds it from the first step (%d B)"):format(m.after[1].bytes))
end

-- a value the caller receives is never kept: written in place by the
-- caller, it must not change the next call's result
do
  local w = fl.randn(4, 6)
  local f = function(x) local w2 = w * 2; return x + w2, w2, (w * 3):reshape(6, 4) end
  local x = fl.randn(4, 6)
  local kp = program(f, x)
  local good = true
  for i = 1, 3 do
    local a, b, c = kp:run(x)
    good = good and close(a, x + w * 2) and close(b, w * 2) and close(c, (w * 3):reshape(6, 4))
    b:add_(100); c:mul_(-7)
  end
  t.ok(good and kp:stats().kept == 0,
       "outputs computed from weights alone (and views of them) are fresh on every call (" ..
       kp:stats().kept .. " kept)")
end

-- random values are drawn anew on every call, never kept
do
  local w = fl.randn(5, 5)
  local f = function(x) return fl.linear(x, w * fl.rand(5, 5)) end
  local x = fl.randn(3, 5)
  local kp = program(f, x)
  fl.manual_seed(7)
  local a1, a2 = kp:run(x), kp:run(x)
  fl.manual_seed(7)
  local e1, e2 = f(x), f(x)
  t.ok(kp:stats().kept == 0 and close(a1, e1) and close(a2, e2) and not close(a1, a2),
       "a weight times fresh random numbers: drawn on every call, as eager draws them")
end

-- a mask from the input's (symbolic) length: kept while the length stays,
-- computed again when it changes
do
  local w = fl.randn(16)
  local f = function(x)
    local T = x.shape[2]
    local i, j = fl.arange(T):reshape(T, 1), fl.arange(T):reshape(1, T)
    local m = fl.where(j:gt(i), 0.0, 1.0) * w:narrow(1, 1, T)
    return x:matmul(m)
  end
  local cf = fl.compile(f, {dynamic = true})
  local good = true
  for _, T in ipairs{5, 5, 9, 9, 5, 12, 12} do
    local x = fl.randn(3, T)
    local want = fl.capture(f, x):run_reference(x)
    local ok, got = pcall(cf, x)
    if not (ok and close(got, want)) then
      good = false
      t.diag(("T = %d: %s"):format(T, ok and "max err " .. maxerr(got, want) or got))
    end
  end
  t.ok(good and cf:stats().recompiles <= 1,
       "a causal mask from the length, over lengths 5, 9, 5, 12: matches the reference (" ..
       cf:stats().recompiles .. " recompiles)")
end

if not off then
  local exe = os.getenv("FUSELAB") or arg[-1]
  local p = assert(io.popen(("FUSELAB_KEEP=0 %s %s 2>&1"):format(exe, arg[0])))
  local out = p:read("a")
  p:close()
  local fails = 0
  for line in out:gmatch("[^\n]+") do if line:match("^not ok") then fails = fails + 1; t.diag(line) end end
  t.ok(out:match("\nok") and fails == 0 and out:find("nothing kept", 1, true),
       "the same cases with FUSELAB_KEEP=0: " .. fails .. " failed")
end

t.done()
