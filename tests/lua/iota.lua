-- iota.lua -- masks from indices: fl.arange inside a compiled function is
-- a constant iota, and the kernels read its elements as the loop index
-- itself (no load, integer compares), on the C and the CUDA generator.
-- Against the reference interpreter: causal masks, offsets, windows,
-- float32 aranges, a dynamic T, aranges that are not iotas.
local fl = fl or require "fuselab"
local t = require "tap"

local function check(name, f, args, noload)
  local ref = fl.capture(f, table.unpack(args)):run_reference(table.unpack(args))
  local cf = fl.compile(f)
  local got = cf(table.unpack(args))
  t.ok(fl.allclose(got, ref, 1e-5, 1e-6), name .. ": compiled matches the reference")
  if noload then
    local code = cf:code()
    -- the iota is read as "(fl_i64)(b0 + j3)", never as "(fl_i64)p0[...]"
    t.ok(code:find("(fl_i64)(", 1, true) ~= nil and not code:find("(fl_i64)p%d+%["),
         name .. ": the arange is the index expression, not a load")
  end
  return cf
end

local function causal(T, off)
  local i = fl.arange(T):reshape(T, 1)
  local j = fl.arange(T):reshape(1, T)
  return fl.where(j:gt(i + (off or 0)), -math.huge, 0.0)
end

fl.manual_seed(3)
for _, T in ipairs{2, 7, 16, 33} do
  check("causal softmax T=" .. T, function(s) return (s * 0.25 + causal(T)):softmax(-1) end,
        {fl.randn(2, 3, T, T)}, true)
end
check("causal mask with an offset", function(s) return (s + causal(9, 2)):softmax(-1) end, {fl.randn(2, 9, 9)}, true)
check("sliding window", function(s)
  local i = fl.arange(12):reshape(12, 1)
  local j = fl.arange(12):reshape(1, 12)
  return fl.where(j:le(i), fl.where((i - j):lt(4), s, -math.huge), -math.huge):softmax(-1)
end, {fl.randn(3, 12, 12)}, true)
check("the mask itself", function(s) return s + causal(10) end, {fl.randn(10, 10)}, true)
check("float32 arange", function(s)
  local i = fl.arange(8, {dtype = "float32"})
  return s * i:reshape(1, 8) + i:reshape(8, 1)
end, {fl.randn(8, 8)})
check("arange(2, 10) is not an iota", function(s)
  local i = fl.arange(2, 10):reshape(8, 1)
  local j = fl.arange(8):reshape(1, 8)
  return fl.where(j:gt(i - 2), s, 0.0)
end, {fl.randn(8, 8)})
check("positions as values", function(s) return s + fl.arange(6):to("float32") end, {fl.randn(4, 6)})

-- a dynamic T: one compiled graph over several lengths
do
  local f = function(s)
    local T = s.shape[3]
    local i = fl.arange(T):reshape(T, 1)
    local j = fl.arange(T):reshape(1, T)
    return (s + fl.where(j:gt(i), -math.huge, 0.0)):softmax(-1)
  end
  local cf = fl.compile(f, {dynamic = true})
  for _, T in ipairs{5, 6, 9, 17} do
    local s = fl.randn(2, T, T)
    local ref = fl.capture(f, s):run_reference(s)
    t.ok(fl.allclose(cf(s), ref, 1e-5, 1e-6), "dynamic T=" .. T .. ": matches the reference")
  end
  t.is(cf:stats().compiles, 1, "dynamic T: compiled once")
  t.ok(not cf:code():find("(fl_i64)p%d+%["), "dynamic T: the iota is the index expression")
end

-- an arange made outside and captured is the caller's tensor: a param,
-- read from memory, and changes to it are seen
do
  local pos = fl.arange(5)
  local cf = fl.compile(function(s) return s + pos:to("float32") end)
  local s = fl.zeros(5)
  t.ok(fl.allclose(cf(s), fl.tensor{0, 1, 2, 3, 4}), "an outside arange: right values")
  pos:mul_(2)
  t.ok(fl.allclose(cf(s), fl.tensor{0, 2, 4, 6, 8}), "and an in-place change to it is seen")
end

-- the CUDA generator emits the same index expression (compiled by NVRTC
-- where there is one, in tests/lua/cuda.lua; here: its source)
do
  local T = 8
  local g = fl.capture(function(s) return (s + causal(T)):softmax(-1) end, fl.randn(2, T, T))
  local ok, prog = pcall(function() return g:fuse():codegen("cuda") end)
  if ok then
    local src = tostring(prog)
    t.ok(src:find("const fl_i64 v%d+ = %(fl_i64%)%(b") ~= nil and not src:find("fl_i64 v%d+ = fl_ld"),
         "CUDA: the arange is the index expression")
  else
    t.skip("no CUDA code generator in this build", 1)
  end
end
t.done()
