-- static_sizes.lua -- a graph without symbolic sizes compiles kernels that
-- hold their sizes, strides and offsets as constants and only the loop
-- that runs (cpu/codegen.c, fk_static_args); a dynamic graph's kernels read
-- them from arg[] and choose their loop at each call.  Both forms are
-- checked against the reference over random shapes: contiguous reads and
-- transposed ones (the any-stride loop), broadcasts, reductions over the
-- last dim and over another, rows past a 4096-element tile.
-- Tolerance: rtol 1e-5, atol 1e-6 (the kernels' exp and rsqrt are within
-- a few ulps of the reference's).
local t = require "tap"

fl.manual_seed(7)

local function close(a, b) return fl.allclose(a, b, 1e-5, 1e-6) end

local fns = {
  {"softmax", function(x) return x:softmax(-1) end},
  {"softmax of a transpose", function(x) return x:transpose(1, 2):softmax(-1) end},
  {"a layer norm", function(x)
    local c = x - x:mean(-1, true)
    return c * ((c * c):mean(-1, true) + 1e-5):rsqrt()
  end},
  {"a sum over dim 1", function(x) return (x * 0.5):exp():sum(1) end},
  {"a broadcast row", function(x) return (x - x:amax(1, true)):relu() * 0.5 + 1 end},
  {"a transposed elementwise", function(x) return (x:transpose(1, 2) * 3 + 1):tanh() end},
  -- a read at an offset (the last row); its start specializes the size
  {"the last row added", function(x) return (x + x:narrow(1, x.shape[1], 1)):exp() end, true},
}

-- rows x cols: 1s (dims merged away), odd sizes, a tile edge (4096)
local shapes = {{1, 5}, {3, 1}, {7, 17}, {2, 4097}, {33, 64}}
for _ = 1, 3 do shapes[#shapes + 1] = {math.random(2, 40), math.random(2, 300)} end

for _, fc in ipairs(fns) do
  local name, f, specializes = fc[1], fc[2], fc[3]
  local dyn = fl.compile(f, {dynamic = true})
  local ok_s, ok_d, form_s, bad = true, true, true, nil
  for _, sh in ipairs(shapes) do
    local x = fl.randn(sh[1], sh[2])
    local want = fl.capture(f, x):run_reference(x)
    local k = fl.capture(f, x):fuse():codegen("cpu")
    local got = k:run(x)
    if not close(got, want) then ok_s, bad = false, sh end
    if not close(dyn(x), want) then ok_d, bad = false, sh end
    local src = k:source()
    if src:find("= arg%[") or src:find("FL_UNIT%(s") then form_s = false end
  end
  t.ok(ok_s, name .. ": constant sizes equal the reference over " .. #shapes .. " shapes"
       .. (bad and (" (first off: " .. bad[1] .. "x" .. bad[2] .. ")") or ""))
  t.ok(ok_d, name .. ": sizes from arg[] equal it too")
  t.ok(form_s, name .. ": the static kernels read no size from arg[] and test no stride")
  -- sizes 1 are specialized: 1x5 and 3x1 take a compile each
  if not specializes then
    t.is(dyn:stats().compiles, 3, name .. ": three dynamic compiles served the " .. #shapes .. " shapes")
  end
  t.ok(dyn:code():find("= arg%["), name .. ": the dynamic kernels read their sizes from arg[]")
end

-- the dynamic form keeps a unit-stride loop beside an any-stride one
local x = fl.randn(6, 40)
local dyn = fl.compile(fns[1][2], {dynamic = true})
dyn(x)
t.ok(dyn:code():find("FL_UNIT%(s"), "a dynamic kernel chooses its loop at the call")

-- the static form writes the loop that runs, the unit-stride one, alone
local kc = fl.capture(fns[1][2], x):fuse():codegen("cpu")
local _, nsimd = kc:source():gsub("#pragma omp simd", "")
local _, nfor = kc:source():gsub("for %(int64_t j%d+ = ", "")
t.ok(nsimd >= 3 and nsimd == nfor, "a static softmax: every loop over a row is a vector loop ("
     .. nsimd .. " of " .. nfor .. ")")

-- one structure at three sizes: compiled once with its sizes as arguments
-- (cheaper than three functions); at two sizes, constants
local f3 = function(a, b, c) return (a * 2 + 1):relu(), (b * 2 + 1):relu(), (c * 2 + 1):relu() end
local function arg_reads(k) local _, n = k:source():gsub("= arg%[", ""); return n end
local a, b, c = fl.randn(4, 8), fl.randn(5, 8), fl.randn(6, 7)
local k3 = fl.capture(f3, a, b, c):fuse():codegen("cpu")
local k2 = fl.capture(f3, a, b, a):fuse():codegen("cpu")
t.is(k3:stats().kernels, 3, "three kernels of one structure")
t.ok(arg_reads(k3) > 0, "at three sizes they read their sizes from arg[]")
t.is(arg_reads(k2), 0, "at two sizes they hold constants")
local ok = true
for _, kc in ipairs{{k3, {a, b, c}}, {k2, {a, b, a}}} do
  local got = {kc[1]:run(table.unpack(kc[2]))}
  local want = {fl.capture(f3, table.unpack(kc[2])):run_reference(table.unpack(kc[2]))}
  for i = 1, 3 do ok = ok and close(got[i], want[i]) end
end
t.ok(ok, "both equal the reference")

-- random numbers stay per call: the key is still an argument
local r = fl.capture(function(a) return a + fl.rand(6, 40) end, x):fuse():codegen("cpu")
t.ok(r:source():find("rk = (fl_u64)arg[", 1, true), "a random kernel reads its key from arg[]")
local r1, r2 = r:run(x), r:run(x)
t.ok(not fl.allclose(r1, r2), "and draws anew at each call")
local d = r1 - x
t.ok(d:amin():item() >= 0 and d:amax():item() < 1, "uniform draws in [0, 1)")

t.done()
