-- autograd_loop.lua -- the tape does not outlive its step: a 1000-step
-- training loop (an MLP, SGD by hand under fl.no_grad) leaves no recorded
-- op alive, its memory stays flat (a tape kept by mistake would hold every
-- step's activations: 1000 x 0.75 MiB), and the loss falls.  The sanitized
-- build runs the same loop under ASan (leaks, use after free).
local fl = fl or require "fuselab"
local t = require "tap"

local asan = os.getenv("FUSELAB_ASAN") == "1"
local MiB = 1024 * 1024

-- resident memory in bytes (Linux), or nil elsewhere
local function rss()
  local f = io.open("/proc/self/statm")
  if not f then return nil end
  local _, res = f:read("n", "n")
  f:close()
  return res and res * 4096
end

fl.manual_seed(3)
local N, D, H = 256, 64, 256
local x = fl.randn(N, D)
local target = (x:narrow(2, 1, 8) * 2):tanh()
local w1 = (fl.randn(H, D) * (1 / math.sqrt(D))):requires_grad_()
local b1 = fl.zeros(H, {requires_grad = true})
local w2 = (fl.randn(8, H) * (1 / math.sqrt(H))):requires_grad_()
local params = {w1, b1, w2}
local base = fl._autograd_live()

local function step(lr)
  local h = fl.linear(x, w1, b1):gelu()
  local out = fl.linear(h, w2)
  local loss = ((out - target) * (out - target)):mean()
  loss:backward()
  fl.no_grad(function()
    for _, p in ipairs(params) do
      p:sub_(p.grad * lr)
      p.grad = nil
    end
  end)
  return loss:item()
end

local first, last, mem200, steps = nil, nil, nil, 0
local t0 = fl.now()
for i = 1, 1000 do
  local l = step(0.1)
  first = first or l
  last = l
  steps = i
  if i % 50 == 0 then collectgarbage() end
  if i == 200 then collectgarbage(); collectgarbage(); mem200 = rss() end
  -- a slow (sanitized, busy) machine runs fewer steps, never fails for it
  if fl.now() - t0 > (asan and 120 or 60) then break end
end
t.diag(("%d steps in %.1f s; loss %.4f -> %.4f"):format(steps, fl.now() - t0, first, last))
t.ok(last < first * 0.5, ("the loss falls: %.4f -> %.4f"):format(first, last))
collectgarbage(); collectgarbage()
-- the three leaves' accumulators stay (the params require grad); no op does
t.is(fl._autograd_live(), base, "no recorded op outlives its step")
if mem200 and steps >= 400 and not asan then
  local grown = rss() - mem200
  t.ok(grown < 24 * MiB, ("memory stays flat from step 200 to %d: %+.1f MiB"):format(steps, grown / MiB))
else
  t.skip("memory growth (needs /proc and 400 steps, not under ASan)")
end

-- a tape that is never run backward is freed with its outputs
do
  local y
  for i = 1, 100 do y = fl.linear(x, w1, b1):relu():sum() end
  y = nil
  collectgarbage(); collectgarbage()
  t.is(fl._autograd_live(), base, "an unused tape goes with its outputs")
end

-- a long chain is freed without deep recursion
do
  local v = fl.ones(4, {requires_grad = true})
  local z = v
  for i = 1, 20000 do z = z * 1.0001 end
  z:sum():backward()
  t.ok(math.abs(v.grad[1] - 1.0001 ^ 20000) < 1e-2 * 1.0001 ^ 20000, "a 20000-op chain runs backward")
  z = nil
  collectgarbage(); collectgarbage()
  t.is(fl._autograd_live(), base + 1, "and is freed (only v's accumulator is left)")
  v = nil
  collectgarbage(); collectgarbage()
  t.is(fl._autograd_live(), base, "the accumulator goes with its leaf")
end
t.done()
