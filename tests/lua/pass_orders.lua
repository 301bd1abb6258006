-- pass_orders.lua -- every pass order a student can call before fusing,
-- and the memory promise over them (doc/DESIGN.md: fusion never costs
-- memory), for costmodel.lua and the ImageNet networks
-- (tests/onnx/memory.sh).
local q = {quiet = true}
local M = {
  {"fuse()", function(g) return g:fuse() end},
  {"decompose():fuse()", function(g) return g:decompose(q):fuse() end},
  {"optimize():fuse()", function(g) return g:optimize(q):fuse() end},
  {"decompose():optimize():fuse()", function(g) return g:decompose(q):optimize(q):fuse() end},
  {"optimize():decompose():fuse()", function(g) return g:optimize(q):decompose(q):fuse() end},
}

-- "what: bytes b -> a, peak b -> a" when s moves more or peaks higher
-- than the captured graph op by op, else nil
function M.worse(what, s)
  if s.bytes_after <= s.bytes_before and s.peak_bytes_after <= s.peak_bytes_before then return nil end
  return ("%s: bytes %d -> %d, peak %d -> %d"):format(what, s.bytes_before, s.bytes_after,
                                                      s.peak_bytes_before, s.peak_bytes_after)
end

-- Plans g in every order: the list of those that break the promise, and
-- the stats of each order by name.
function M.check(g)
  local bad, stats = {}, {}
  for _, o in ipairs(M) do
    stats[o[1]] = o[2](g):stats()
    bad[#bad + 1] = M.worse(o[1], stats[o[1]])
  end
  return bad, stats
end

return M
