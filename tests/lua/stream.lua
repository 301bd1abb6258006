-- stream.lua -- a reduce kernel's big output that nothing later reads is
-- staged in L1 and written with streaming stores (cpu/codegen.c,
-- FL_STREAM_MIN = 2^20 elements): every element must still be written
-- (the suite poisons fresh buffers with NaN), row starts that are not
-- 64-byte aligned and row tails must be right, and a value a later kernel
-- reads must not be streamed.  Compared with eager within 1e-6 of the
-- largest magnitude (softmax, layer_norm: float32 rounding of the same
-- formulas in another order; 1e-3 for float16).
local fl = fl or require "fuselab"
local t = require "tap"

local function streams(cf) return select(2, cf:code():gsub("fl_stream_f32%(", "")) end

-- tol: relative to the largest magnitude of the eager result
local function check(name, f, args, want_streams, tol)
  tol = tol or 1e-6
  local cf = fl.compile(f)
  local got = cf(table.unpack(args))
  local want = f(table.unpack(args))
  local d = ((got - want):abs():amax() / math.max(1, want:abs():amax():item())):item()
  local shape = table.concat(args[1].shape, "x")
  t.ok(d <= tol, ("%s %s: compiled equals eager within %g (%.2g)"):format(name, shape, tol, d))
  if want_streams ~= nil then
    t.is(streams(cf) > 0, want_streams, ("%s %s: %s"):format(name, shape,
         want_streams and "the output is streamed" or "nothing is streamed"))
  end
  return cf
end

local softmax = function(x) return (x * 1.5):softmax(-1) end
-- at, just below and above 2^20 elements; rows of 1025 and 1000 floats start
-- unaligned; a single row runs on one thread
for _, s in ipairs{{1024, 1024}, {1023, 1024}, {1024, 1025}, {2049, 1000}, {1, 1048579}, {4099, 257}} do
  check("softmax", softmax, {fl.randn(s[1], s[2])}, true)
end
local ln = function(x, w, b) return x:layer_norm({x.shape[2]}, w, b, 1e-5) end
for _, s in ipairs{{4096, 256}, {1031, 1031}} do
  check("layer_norm", ln, {fl.randn(s[1], s[2]), fl.randn(s[2]), fl.randn(s[2])}, true)
end
-- one compiled function over sizes on both sides of the threshold
do
  local cf = fl.compile(softmax, {dynamic = true})
  local okall = true
  for _, rows in ipairs{8, 600, 1024, 3000} do
    local x = fl.randn(rows, 1024)
    if (cf(x) - softmax(x)):abs():amax():item() > 1e-6 then okall = false end
  end
  t.ok(okall, "dynamic rows 8..3000 (below and above the threshold): equal to eager within 1e-6")
end
-- read again by a later kernel: not streamed
check("softmax read again", function(x) local y = x:softmax(-1); return y * 2 + y:sum(-1, true) end,
      {fl.randn(2048, 1024)}, nil)
do
  local f = function(x) local y = x:softmax(-1); return y, y:matmul(x:transpose(1, 2)) end
  local cf = fl.compile(f)
  local x = fl.randn(1024, 1024)
  local a, b = cf(x)
  local ea, eb = f(x)
  t.ok((a - ea):abs():amax():item() <= 1e-6 and (b - eb):abs():amax():item() <= 1e-4,
       "an output a product also reads: both right")
  t.is(streams(cf), 0, "and it is not streamed")
end
-- float16 output: not streamed, still right
check("softmax float16", function(x) return x:softmax(-1) end, {fl.randn(1024, 1024):to("float16")}, false, 1e-3)

t.done()
