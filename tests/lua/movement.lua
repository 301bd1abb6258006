-- movement.lua -- x:slice, fl.pad, x:flip, fl.gather and fl.cumsum over
-- random shapes, pads, steps and indices, in float32, float16 and int64: eager, compiled
-- for the CPU (with a fused epilogue) and, where a device or the CUDA
-- emulator is there, for CUDA, each against the reference interpreter.
-- These ops copy elements, so every path must agree exactly (atol 0,
-- rtol 0); cumsum of floats within 1e-6 (atol and rtol).  Then the API's
-- conventions and its errors.
local fl = fl or require "fuselab"
local t = require "tap"
local C = require "compare"

local cuda = fl.cuda_available()
local ROUNDS = tonumber(os.getenv("FUSELAB_MOVEMENT_ROUNDS") or "") or 5

math.randomseed(20261202)
local R = math.random

local function shape_of(nd)
  local s = {}
  for d = 1, nd do s[d] = R(1, 5) end
  return s
end

local function input(dt, s)
  if dt == "int64" then return ((fl.rand(s) * 2e6):to("int64") - 1000000) * 1000000007 end
  return (fl.randn(s)):to(dt)
end

local function str(v)
  if type(v) ~= "table" then return tostring(v) end
  local p = {}
  for i, x in ipairs(v) do p[i] = str(x) end
  return "{" .. table.concat(p, ",") .. "}"
end

-- one random case: what, inputs, fn(inputs...)
local function pad_case(dt)
  local s = shape_of(R(1, 4))
  local nd = #s
  local mode = ({"constant", "reflect", "edge"})[R(3)]
  local pads = {}
  for d = 1, nd do
    -- crop at most what the dim has, pad below the cropped size for reflect
    local cb = R(0, 2) == 0 and R(0, s[d] - 1) or 0
    local ce = R(0, 2) == 0 and R(0, s[d] - 1 - cb) or 0
    local m = s[d] - cb - ce
    local lim = mode == "reflect" and m - 1 or 3
    pads[d] = cb > 0 and -cb or R(0, math.max(lim, 0))
    pads[nd + d] = ce > 0 and -ce or R(0, math.max(lim, 0))
  end
  local opts = {mode = mode}
  if mode == "constant" then opts.value = dt == "int64" and R(-9, 9) or R(-9, 9) / 4 end
  local x = input(dt, s)
  return string.format("pad %s %s %s %s", dt, str(s), str(pads), mode), {x},
         function(a) return fl.pad(a, pads, opts) end
end

local function slice_case(dt)
  local s = shape_of(R(1, 4))
  local d = R(#s)
  local n = s[d]
  local a, b = R(-n - 2, n + 2), R(-n - 2, n + 2)
  local step = R(1, 3) * (R(2) == 1 and 1 or -1)
  local x = input(dt, s)
  -- a transposed input: the view of a view
  local tr = #s >= 2 and R(2) == 1
  return string.format("slice %s %s%s dim %d %d..%d by %d", dt, str(s), tr and " transposed" or "", d, a, b, step),
         {x}, function(v)
           if tr then v = v:transpose(1, 2) end
           return v:slice(d, a, b, step)
         end
end

local function flip_case(dt)
  local s = shape_of(R(1, 4))
  local dims = {}
  for d = 1, #s do if R(2) == 1 then dims[#dims + 1] = R(2) == 1 and d or d - #s - 1 end end
  local x = input(dt, s)
  return string.format("flip %s %s %s", dt, str(s), str(dims)), {x}, function(v) return v:flip(dims) end
end

local function gather_case(dt)
  local s = shape_of(R(1, 3))
  local d = R(#s)
  local n = s[d]
  local is = shape_of(R(0, 2))
  local idx = (fl.rand(is) * (2 * n)):to("int64") - n      -- -n .. n-1
  local x = input(dt, s)
  return string.format("gather %s %s dim %d idx %s", dt, str(s), d, str(is)), {x, idx},
         function(v, i) return fl.gather(v, d, i) end
end

-- cumsum sums in double on every path, but a reversed scan adds in another
-- order than the oracle's: float results within 1e-6 relative
local function cumsum_case(dt)
  local s = shape_of(R(1, 3))
  local d = R(#s)
  local opts = {exclusive = R(2) == 1, reverse = R(2) == 1}
  local x = input(dt, s)
  return string.format("cumsum %s %s dim %d%s%s", dt, str(s), d, opts.exclusive and " exclusive" or "",
                       opts.reverse and " reverse" or ""), {x},
         function(v) return fl.cumsum(v, d, opts) end, dt ~= "int64"
end

local makers = {pad_case, slice_case, flip_case, gather_case, cumsum_case}
local dts = {"float32", "float16", "int64"}
local bad = {eager = 0, cpu = 0, cuda = 0, epi = 0}
local first, count = {}, 0

local function same(a, b, approx)
  if not a or a.dtype ~= b.dtype or #a.shape ~= #b.shape then return false end
  for i = 1, #a.shape do if a.shape[i] ~= b.shape[i] then return false end end
  if a:numel() == 0 then return true end
  if approx then return fl.allclose(a:cpu(), b, 1e-6, 1e-6) end
  return fl.allclose(a:cpu(), b, 0, 0)
end

local function agree(a, b, c) return same(a, b, c[4]) end   -- c[4]: cumsum of floats, within 1e-6
local function note(kind, c)
  bad[kind] = bad[kind] + 1
  if #first < 8 then first[#first + 1] = kind .. ": " .. c[1] end
end
-- an epilogue fused after the extern step (a view's is a plain kernel)
local function twice(y) return y + y end
for round = 1, ROUNDS do
  local cases = {}
  for i = 1, 20 do cases[i] = {makers[(i - 1) % #makers + 1](dts[R(3)])} end
  C.check(cases, C.run(cases, 2, twice, cuda), agree, note, "epi")   -- gather takes 2 inputs
  count = count + #cases
end
for _, s in ipairs(first) do t.diag(s) end
t.is(bad.eager, 0, count .. " random slices, pads, flips and gathers: eager equals the reference")
t.is(bad.cpu, 0, count .. " random slices, pads, flips and gathers: compiled for the CPU equals the reference")
t.is(bad.epi, 0, count .. " of them with an epilogue: equal to the reference")
if cuda then
  t.is(bad.cuda, 0, count .. " random slices, pads, flips and gathers: compiled for CUDA equals the reference")
else
  t.skip("no CUDA device or emulator: the CUDA path runs under tests/gpu/emu/run", 1)
end

-- the conventions
local x = fl.arange(12):reshape(3, 4)
t.is(x:slice(2, 2, 3).shape, {3, 2}, "slice: 1-based, the stop included")
t.is(x:slice(2, -1, 1, -1):tolist()[1], {3, 2, 1, 0}, "slice: a negative step walks backward")
t.is(x:slice(2, 1, 100, 3):tolist()[2], {4, 7}, "slice: a stop past the end clamps")
t.is(x:slice(1, 3, 3).shape, {1, 4}, "slice: one element")
t.is(x:slice(1, 3, 2).shape, {0, 4}, "slice: stop before start is empty")
do
  local z = fl.zeros(3, 4)
  local v = z:slice(2, 1, 4, 2)
  z:fill_(5)
  t.is(v:tolist(), {{5, 5}, {5, 5}, {5, 5}}, "slice with a positive step is a view")
end
t.is(fl.pad(x, {1, 0, 0, 2}).shape, {4, 6}, "pad: ONNX's order, befores then afters")
t.is(fl.pad(x, {-1, 0, 0, -1}):tolist()[1], {4, 5, 6}, "pad: negative pads crop")
t.is(fl.pad(x, {0, 2, 0, 1}, {mode = "reflect"}):tolist()[1], {2, 1, 0, 1, 2, 3, 2}, "pad: reflect")
t.is(fl.pad(x, {0, 1, 0, 1}, {mode = "edge"}):tolist()[3], {8, 8, 9, 10, 11, 11}, "pad: edge")
t.is(fl.pad(x:to("float32"), {0, 1, 0, 0}, {value = 0.5}):tolist()[1][1], 0.5, "pad: the constant")
t.is(x:flip(-1):tolist()[1], {3, 2, 1, 0}, "flip a dim")
t.is(fl.gather(x, 2, fl.tensor{-1, 0}):tolist(), {{3, 0}, {7, 4}, {11, 8}}, "gather: negative indices wrap")
t.is(fl.gather(x, 1, fl.tensor(2)).shape, {4}, "gather: a 0-d index drops the dim")
t.is(x:cumsum(2):tolist()[2], {4, 9, 15, 22}, "cumsum along a dim")
t.is(fl.cumsum(x, 2, {exclusive = true, reverse = true}):tolist()[1], {6, 5, 3, 0}, "cumsum exclusive, reversed: what follows each element")
t.is(fl.tensor{true, false, true}:cumsum(1):tolist(), {1, 1, 2}, "cumsum of bool counts in int64")
t.raises(function() return fl.cumsum(x, 2, {exlusive = true}) end, "cumsum: unknown option 'exlusive'",
         "cumsum: an option typo")

-- an index out of range: an error, never a read outside the tensor
t.raises(function() return fl.gather(x, 2, fl.tensor{0, 4}) end,
         "gather: index 4 out of range for dim 2 of size 4 %(valid %-4..3%)", "gather: index past the end")
t.raises(function() return fl.gather(x, 2, fl.tensor{-5}) end,
         "gather: index %-5 out of range", "gather: index before the start")
do
  local cm = fl.compile(function(a, i) return fl.gather(a, 2, i) end, {backend = "cpu"})
  t.ok(cm(x, fl.tensor{1}) ~= nil, "compiled gather runs")
  t.raises(function() return cm(x, fl.tensor{9}) end, "gather: index 9 out of range",
           "compiled gather: an index out of range is an error too")
end
if cuda then
  -- a kernel cannot raise: the element is NaN, and nothing outside x is read
  -- (the emulator checks every access)
  local y = fl.gather(x:to("float32"):cuda(), 2, fl.tensor{1, 9}:cuda())
  local v = y:cpu():tolist()
  t.ok(v[1][1] == 1 and v[1][2] ~= v[1][2], "CUDA gather: an index out of range gives NaN, no stray read")
else
  t.skip("no CUDA device or emulator", 1)
end

t.raises(function() return fl.gather(x, 2, fl.tensor{1.0}) end, "gather: indices must be int64, got float32",
         "gather: float indices")
t.raises(function() return fl.gather(x, 3, fl.tensor{0}) end, "gather: dim 3 out of range", "gather: bad dim")
t.raises(function() return fl.pad(x, {1, 1}) end, "pad: 2 pads given for a 2%-d tensor %(expected 4",
         "pad: one pad per side per dim")
t.raises(function() return fl.pad(x, {0, 4, 0, 0}, {mode = "reflect"}) end,
         "pad: reflect pads 4, 0 of dim 2 must be smaller than its size 4", "pad: reflect too wide")
t.raises(function() return fl.pad(x, {-2, 0, -2, 0}) end, "pad: pads %-2, %-2 crop 4 elements from dim 1",
         "pad: cropping more than there is")
t.raises(function() return fl.pad(x, {0, 0, 0, 0}, {mode = "wrap"}) end, "pad: unknown mode wrap",
         "pad: unknown mode")
t.raises(function() return fl.pad(x, {0, 0, 0, 1}, {value = 0.5}) end,
         "pad: value 0.5 is not an integer, for an int64 tensor", "pad: a fraction for int64")
t.raises(function() return fl.pad(x, {0, 0, 0, 1}, {mode = "edge", value = 1}) end,
         "pad: value is for mode \"constant\" only", "pad: value with another mode")
t.raises(function() return x:slice(2, 1, 2, 0) end, "slice: step must not be 0", "slice: step 0")
t.raises(function() return x:flip{1, -2} end, "flip: dim 1 appears twice", "flip: a dim twice")

t.done()
