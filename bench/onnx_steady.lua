-- onnx_steady.lua -- one network's steady compiled call, in a process of its own.
--
--   fuselab bench/onnx_steady.lua DIR NAME [CALLS]
--
-- Loads DIR/NAME/model.onnx (bench/onnx_models.py writes it, with its
-- input_K.npy), compiles it for the CPU, makes ten warm-up calls and prints
-- "NAME median_ms lowest_ms highest_ms" over CALLS more (default 30).  One process
-- per measurement, so that bench/onnx_turns.sh can put it in turns with
-- onnxruntime and another fuselab binary: on a shared machine the hour
-- decides more than the build does, and only turns compare.
local here = arg[0]:match("^(.*/)") or "./"
local stats = dofile(here .. "stats.lua")
local dir, name = arg[1], arg[2]
local n = tonumber(arg[3] or "30")
if not dir or not name or not n or n < 1 then
  io.stderr:write("usage: fuselab bench/onnx_steady.lua DIR NAME [CALLS]\n")
  os.exit(2)
end
local m = fl.load_onnx(dir .. "/" .. name .. "/model.onnx")
local xs = {}
while true do
  local p = string.format("%s/%s/input_%d.npy", dir, name, #xs)
  local f = io.open(p)
  if not f then break end
  f:close()
  xs[#xs + 1] = fl.load(p)
end
local cm = fl.compile(m, {backend = "cpu"})
for _ = 1, 10 do cm(table.unpack(xs)) end
local ts = {}
for i = 1, n do
  local t = fl.now()
  cm(table.unpack(xs))
  ts[i] = (fl.now() - t) * 1e3
end
print(string.format("%s %.3f %.3f %.3f", name, stats.median(ts)))
