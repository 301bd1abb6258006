-- Lesson 03: graph breaks, and how to remove them.
--
-- Claim (SEED.txt §2-§3): capture turns the code into one whole flow
-- chart ("将分散的指令变成整体流程图") that the compiler optimizes as a
-- whole.  Code that needs a concrete value in Lua (item() in an if, an
-- in-place update) cannot be drawn into the chart: the graph breaks into
-- pieces, the Lua between them runs on every call, and the pieces fuse
-- apart.  Rewriting the code keeps it one graph and wins the time back.
--
-- What it measures: two functions with a break each (a data-dependent
-- branch on item(), an in-place add_), their rewrites (fl.where, an
-- out-of-place add): graphs and breaks from fl.explain, compiled kernels,
-- time per call, and that before and after compute the same.
--
-- Run: fuselab examples/lessons/03_graph_breaks.lua   (about 3 s)

local fl = fl or require "fuselab"

fl.manual_seed(3)

-- 1. A data-dependent branch: Lua must see the sum to choose a side.
local function gate_if(x)
  local s = x:sum():item()                  -- a concrete number: graph break
  if s > 0 then return (x * 2):tanh() end
  return (x * -0.5):tanh()
end

-- The same, as tensor ops: both sides are computed and fl.where picks.
local function gate_where(x)
  local positive = x:sum():gt(0)
  return fl.where(positive, (x * 2):tanh(), (x * -0.5):tanh())
end

-- 2. An in-place update of a traced tensor has no lowering.
local function residual_inplace(x)
  local h = (x * 0.5):sigmoid()
  h:add_(x)                                 -- in place: graph break
  return h:relu()
end

local function residual(x)
  local h = (x * 0.5):sigmoid()
  return (h + x):relu()
end

-- fl.explain without its printout: the numbers only.
local function explain(fn, x)
  local saved = print
  print = function() end
  local r = fl.explain(fn, x)
  print = saved
  return r
end

local function best_us(f, x)
  local best = math.huge
  for _ = 1, 200 do
    local t0 = fl.now()
    f(x)
    best = math.min(best, fl.now() - t0)
  end
  return best * 1e6
end

local x = fl.randn(64, 64)
local neg = -x:abs()                        -- a sum below zero: the other branch

local function compare(title, before, after)
  print(("== %s"):format(title))
  local e1, e2 = explain(before, x), explain(after, x)
  for _, b in ipairs(e1.break_reasons) do
    print(("  break: %s\n    at %s\n    hint: %s"):format(b.reason, b.where, b.hint))
  end
  local c1, c2 = fl.compile(before), fl.compile(after)
  for _, input in ipairs{x, neg} do
    assert(fl.allclose(c1(input), before(input), 1e-5, 1e-6), "compiled 'before' differs from eager")
    assert(fl.allclose(c2(input), after(input), 1e-5, 1e-6), "compiled 'after' differs from eager")
    assert(fl.allclose(before(input), after(input), 1e-5, 1e-6), "the rewrite changes the result")
  end
  local t1, t2 = best_us(c1, x), best_us(c2, x)
  local s1, s2 = c1:stats(), c2:stats()
  print(("  %-8s %8s %8s %9s %14s"):format("", "graphs", "breaks", "kernels", "us per call"))
  print(("  %-8s %8d %8d %9d %14.1f"):format("before", e1.graph_count, e1.graph_break_count, s1.kernels, t1))
  print(("  %-8s %8d %8d %9d %14.1f"):format("after", e2.graph_count, e2.graph_break_count, s2.kernels, t2))
  print(("  breaks %d -> %d; the rewrite runs in %.0f%% of the time (%.1fx)\n"):format(
    e1.graph_break_count, e2.graph_break_count, 100 * t2 / t1, t1 / t2))
  return e1.graph_break_count, e2.graph_break_count, t1 / t2
end

local b1, a1, r1 = compare("item() in an if  ->  fl.where", gate_if, gate_where)
local b2, a2, r2 = compare("x:add_(y)  ->  x + y", residual_inplace, residual)

print(("Measured: graph breaks %d -> %d and %d -> %d; compiled calls %.1fx and %.1fx faster after the rewrite."):format(
  b1, a1, b2, a2, r1, r2))
print("Both rewrites compute the same values (checked above for a positive and a negative sum).")
