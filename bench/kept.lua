-- kept.lua -- what keeping the values computed from weights alone saves
-- (exec/program.c, find_kept), measured in one process: calls where the
-- weights stay, against calls after one weight is written in place (a
-- mul_(1) on the first parameter, which makes every kept kernel run again
-- as it did before they were kept), in turns.
--   fuselab bench/kept.lua DIR [NAME ...]   (DIR as bench/onnx_real.lua's)
local here = arg[0]:match("^(.*/)") or "./"
local median = dofile(here .. "stats.lua").median
local dir = arg[1] or error("usage: fuselab bench/kept.lua DIR [NAME ...]")
local names = {}
for i = 2, #arg do names[#names + 1] = arg[i] end
if #names == 0 then names = {"resnet50", "inception_v2", "densenet121", "shufflenet", "squeezenet"} end
local N = 15

print(string.format("%-14s %6s %24s %24s %7s", "network", "kept", "weights stay ms", "one written ms", "saved"))
for _, name in ipairs(names) do
  local m = fl.load_onnx(dir .. "/" .. name .. "/model.onnx")
  local x = fl.load(dir .. "/" .. name .. "/input_0.npy")
  local k = fl.capture(m, x):decompose{quiet = true}:optimize{quiet = true}:fuse():codegen("cpu")
  local f = function(x) return k:run(x) end
  local p1 = m:parameters()[1]
  for _ = 1, 3 do f(x) end
  local stay, wrote = {}, {}
  for i = 1, N do
    local t = fl.now()
    f(x)
    stay[i] = fl.now() - t
    p1:mul_(1)
    t = fl.now()
    f(x)
    wrote[i] = fl.now() - t
  end
  local function row(ts)
    table.sort(ts)
    return string.format("%6.2f (%6.2f-%6.2f)", median(ts) * 1e3, ts[1] * 1e3, ts[#ts] * 1e3)
  end
  local ms, mw = median(stay), median(wrote)
  local st = k:stats()
  print(string.format("%-14s %6d %24s %24s %6.1f%%  (%d launches, %d saved)", name, st.kept, row(stay),
                      row(wrote), 100 * (mw - ms) / mw, st.kept_runs, st.kept_skips))
end
