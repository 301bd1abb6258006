-- memory_nets.lua -- the memory promise on the ImageNet networks ONNX ships as
-- its "light" test models (PyPI onnx's backend test data; their weights
-- are ConstantOfShape fills, which planning never reads): for every pass
-- order a student can call, the fused plan moves no more bytes and needs
-- no more memory at its peak than the captured graph run op by op, and
-- the CPU's compiled program of each network with concatenations neither.
-- fl.compile plans what decompose():optimize():fuse() plans (checked on
-- the teaching models in tests/lua/costmodel.lua), so that order stands
-- for it here.  Usage: fuselab memory_nets.lua LIGHT_DIR NAME...
local t = require "tap"
local dir = assert(arg[1], "usage: memory_nets.lua LIGHT_DIR NAME...")
local orders = require "pass_orders"
local function mib(b) return ("%.2f MiB"):format(b / 2 ^ 20) end
for i = 2, #arg do
  local name = arg[i]
  local g = fl.capture(fl.load_onnx(dir .. "/light_" .. name .. ".onnx"), fl.randn(1, 3, 224, 224))
  local bad, stats = orders.check(g)
  local s = stats["decompose():optimize():fuse()"]
  local line = ("moved %s -> %s, peak %s -> %s"):format(mib(s.bytes_before), mib(s.bytes_after),
                                                       mib(s.peak_bytes_before), mib(s.peak_bytes_after))
  t.ok(#bad == 0, ("%s: no pass order moves more or peaks higher than op by op (as fl.compile: %s)%s"):format(
       name, line, #bad > 0 and ": " .. table.concat(bad, "; ") or ""))
  -- the CPU's program: its concatenations written in place and its kept
  -- values are held to the same promise (fuse/plan.c into_within_peak,
  -- plan_keep_budget)
  if name:find("densenet") or name:find("inception") or name:find("shufflenet") or name:find("squeezenet") then
    local m = fl.load_onnx(dir .. "/light_" .. name .. ".onnx")
    local cm = fl.compile(m, {backend = "cpu"})
    cm(fl.randn(1, 3, 224, 224))
    local ps = cm:plans()[1]:stats()
    local _, inplace = cm:code():gsub("nothing to copy", "")
    t.ok(ps.peak_bytes_after <= ps.peak_bytes_before,
         ("%s compiled for the CPU (%d concatenations in place): peak %s -> %s"):format(
         name, inplace, mib(ps.peak_bytes_before), mib(ps.peak_bytes_after)))
  end
end
t.done()
