-- pass_orders.lua -- every pass order a student can call before fusing,
-- as {name, function(g) -> FusionPlan}: the orders the memory promise
-- (doc/DESIGN.md: fusion never costs memory) is checked over, here
-- (costmodel.lua) and on the ImageNet networks (tests/onnx/memory.sh).
local q = {quiet = true}
return {
  {"fuse()", function(g) return g:fuse() end},
  {"decompose():fuse()", function(g) return g:decompose(q):fuse() end},
  {"optimize():fuse()", function(g) return g:optimize(q):fuse() end},
  {"decompose():optimize():fuse()", function(g) return g:decompose(q):optimize(q):fuse() end},
  {"optimize():decompose():fuse()", function(g) return g:optimize(q):decompose(q):fuse() end},
}
