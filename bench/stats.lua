-- stats.lua -- what the benches share: the median of a list of times and
-- its range (DESIGN §4b: a number shown with its spread).
--   local median = dofile(bench_dir .. "stats.lua").median
local M = {}

-- median, lowest, highest of t (sorted in place)
function M.median(t)
  table.sort(t)
  return t[(#t + 1) // 2], t[1], t[#t]
end

return M
