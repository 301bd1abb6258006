-- bench/dispatch.lua -- what a guard hit costs.  A compiled function with
-- 10 tiny tensor inputs is called in a loop; its per-call time is compared
-- in the same run with calling the eager function, and with a compiled
-- function whose graph does no work (so its time is the guard check and
-- the call itself).  Target: a guard hit costs <= 5 us.
-- Run: build/fuselab bench/dispatch.lua
local fl = fl or require "fuselab"

local N = tonumber(arg and arg[1]) or 20000

local function time(f, ...)
  for _ = 1, 200 do f(...) end        -- warm: first call compiles
  local best = math.huge
  for _ = 1, 5 do
    local t0 = fl.now()
    for _ = 1, N do f(...) end
    best = math.min(best, (fl.now() - t0) / N)
  end
  return best
end

local xs = {}
for i = 1, 10 do xs[i] = fl.randn(4) end

local function sum10(a, b, c, d, e, f, g, h, i, j)
  return a + b + c + d + e + f + g + h + i + j
end
local function first(a, b, c, d, e, f, g, h, i, j) return a end

local eager = time(sum10, table.unpack(xs))
local compiled = time(fl.compile(sum10), table.unpack(xs))
local eager_empty = time(first, table.unpack(xs))
local guard = time(fl.compile(first), table.unpack(xs))

print(("per call, 10 inputs of 4 float32, best of 5 x %d calls:"):format(N))
print(("  eager sum of 10 (9 adds)        %8.2f us"):format(eager * 1e6))
print(("  compiled sum of 10              %8.2f us   ratio to eager %.2f"):format(compiled * 1e6, compiled / eager))
print(("  eager function doing nothing    %8.2f us"):format(eager_empty * 1e6))
print(("  compiled, guard hit, empty graph%8.2f us   (target <= 5 us)"):format(guard * 1e6))

-- A module: every field of it and of its submodules is a guard (the
-- training flag, eps, dims...), checked on each call.  A 4-block
-- transformer on a tiny input: its dispatch is the guard walk plus the
-- graph's launches; the count of guards is printed with it.
local model = fl.models.transformer{vocab = 32, d = 16, heads = 2, layers = 4, seq = 8}:eval()
local ids = fl.tensor({{1, 2, 3, 4}}):to("int64")
local cmodel = fl.compile(model)
local m_eager = time(model, ids)
local m_comp = time(cmodel, ids)
local nguards = #cmodel:stats().guards
print(("  4-block transformer, 4 tokens   eager %8.2f us, compiled %8.2f us (%d guards)"):format(
  m_eager * 1e6, m_comp * 1e6, nguards))
