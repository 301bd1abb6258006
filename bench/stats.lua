-- stats.lua -- what the benches share: the median of a list of times and
-- its range (DESIGN §4b: a number shown with its spread), and the best of
-- timed batches.
--   local median = dofile(bench_dir .. "stats.lua").median
local M = {}

-- median, lowest, highest of t (sorted in place)
function M.median(t)
  table.sort(t)
  return t[(#t + 1) // 2], t[1], t[#t]
end

-- Seconds per call of f(...): after two calls, the best of 7 batches of
-- as many calls as take about `budget` seconds.
function M.best_of_batches(budget, f, ...)
  f(...); f(...)
  local t0 = fl.now()
  f(...)
  local reps = math.floor(budget / math.max(fl.now() - t0, 1e-7)) + 1
  local best = math.huge
  for _ = 1, 7 do
    t0 = fl.now()
    for _ = 1, reps do f(...) end
    best = math.min(best, (fl.now() - t0) / reps)
  end
  return best
end

return M
