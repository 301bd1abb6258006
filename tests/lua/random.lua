-- random.lua -- randomness in captured and compiled code: fl.rand,
-- fl.randn and dropout are graph ops fed the Philox seed and a per-call
-- stream position, so every compiled call draws new numbers, and after
-- fl.manual_seed(n) the compiled function, the eager one, the graph
-- interpreters and the unfused program draw the same numbers, bit for bit
-- (compared with rtol = atol = 0), and leave the stream at the same place.
local fl = fl or require "fuselab"
local t = require "tap"

local function same(a, b) return fl.allclose(a, b, 0, 0) end

-- Run fn under seed s, then draw 3 more numbers: what it returned and
-- where it left the stream.
local function seeded(s, fn, ...)
  fl.manual_seed(s)
  local y = fn(...)
  return y, fl.rand(3)
end

-- The same, keeping every value fn returned (then the 3 numbers).
local function seeded_all(s, fn, ...)
  fl.manual_seed(s)
  local r = table.pack(fn(...))
  r.n = r.n + 1
  r[r.n] = fl.rand(3)
  return r
end

local function all_same(a, b)
  if a.n ~= b.n then return false end
  for i = 1, a.n do if not same(a[i], b[i]) then return false end end
  return true
end

-- ---- each compiled call draws anew ------------------------------------
do
  local f = function(x) return x + fl.rand(4) end
  local cf = fl.compile(f)
  local x = fl.zeros(3, 4)
  local a, b, c = cf(x), cf(x), cf(x)
  t.ok(not same(a, b) and not same(b, c), "x + fl.rand(4) compiled: new numbers at every call")
  t.is(cf:stats().compiles, 1, "... from one compiled graph")
  local ye, re = seeded(11, f, x)
  local yc, rc = seeded(11, cf, x)
  t.ok(same(ye, yc), "after manual_seed, compiled rand equals eager bit for bit")
  t.ok(same(re, rc), "... and the stream continues from the same place")
end

-- ---- compiled == eager for rand, randn, dropout; shapes and dtypes ------
-- odd sizes end inside a Philox block of 4; one compile per case
local cases = {
  float32 = {{1}, {7}, {3, 5}, {2, 3, 5}},
  float16 = {{33}, {3, 5}},
  bfloat16 = {{7}, {2, 3, 5}},
}
for _, dt in ipairs{"float32", "float16", "bfloat16"} do
  for _, sh in ipairs(cases[dt]) do
    local name = dt .. "[" .. table.concat(sh, ",") .. "]"
    local f = function(x)
      local u = fl.rand(sh, {dtype = dt})
      local n = fl.randn(sh, {dtype = dt})
      return x * u + n, fl.dropout(x, 0.3), u
    end
    local x = fl.ones(sh, {dtype = dt}) * 2
    local cf, cu = fl.compile(f), fl.compile(f, {fuse = false})
    fl.manual_seed(5); local e1, e2, e3 = f(x); local er = fl.rand(3)
    fl.manual_seed(5); local c1, c2, c3 = cf(x); local cr = fl.rand(3)
    fl.manual_seed(5); local u1, u2, u3 = cu(x); local ur = fl.rand(3)
    t.ok(same(e1, c1) and same(e2, c2) and same(e3, c3) and same(er, cr),
         name .. ": compiled (fused) rand/randn/dropout equal eager bit for bit")
    t.ok(same(e1, u1) and same(e2, u2) and same(e3, u3) and same(er, ur),
         name .. ": unfused (fuse=false) equal eager bit for bit")
    t.is(c1.dtype, dt, name .. ": dtype kept")
    fl.manual_seed(5); local d1 = cf(x)
    local a1 = cf(x)
    t.ok(not same(d1, a1) or #sh == 1 and sh[1] == 1, name .. ": the next call draws anew")
  end
end

-- ---- the graph interpreters and the step-by-step pipeline agree --------
do
  local W = fl.randn(5, 5)
  local f = function(x)
    local h = (x:matmul(W) + fl.randn(5)):relu()
    local m = fl.rand(3, 5):transpose(1, 2)           -- read through a view
    return fl.dropout(h, 0.25) + m:sum(2), (x + fl.rand(3, 5)):exp():sum(2)
  end
  local x = fl.randn(3, 5)
  local g = fl.capture(f, x)
  local e1, e2 = seeded(8, f, x)
  local r1, r2 = seeded(8, function(v) return g:run(v) end, x)
  local o1, o2 = seeded(8, function(v) return g:run_reference(v) end, x)
  local c1, c2 = seeded(8, fl.compile(f), x)
  local k = g:fuse():codegen("cpu")
  local p1, p2 = seeded(8, function(v) return k:run(v) end, x)
  t.ok(same(e1, r1) and same(e2, r2), "g:run (eager kernels) draws what eager draws")
  t.ok(fl.allclose(e1, o1, 1e-6, 1e-6) and fl.allclose(e2, o2, 1e-6, 1e-6),
       "g:run_reference (the oracle) agrees")
  t.ok(fl.allclose(e1, c1, 1e-5, 1e-6) and fl.allclose(e2, c2, 1e-5, 1e-6),
       "compiled, with a product and reductions around the random ops, agrees")
  t.ok(fl.allclose(c1, p1, 0, 0) and fl.allclose(c2, p2, 0, 0),
       "g:fuse():codegen('cpu') gives what fl.compile gives")
end

-- ---- graph breaks and products ------------------------------------------
do
  -- the segments and the Lua between them draw in program order
  local f = function(x)
    local a = x + fl.rand(3)
    local s = a:sum():item()
    local b = fl.randn(3)
    return a * s + b + fl.rand(3), fl.rand(4, 3):matmul(x:reshape(3, 1))
  end
  local x = fl.ones(3)
  local cf = fl.compile(f)
  local e = seeded_all(9, f, x)
  local c1 = seeded_all(9, cf, x)
  local c2 = seeded_all(9, cf, x)
  t.ok(cf:stats().graph_breaks >= 1, "the function has a graph break")
  t.ok(fl.allclose(e[1], c1[1], 1e-6, 0) and fl.allclose(e[2], c1[2], 1e-6, 0) and same(e[3], c1[3]),
       "with a graph break, compiled draws what eager draws (first call)")
  t.ok(fl.allclose(e[1], c2[1], 1e-6, 0) and fl.allclose(e[2], c2[2], 1e-6, 0) and same(e[3], c2[3]),
       "... and on later calls")
end

-- ---- random ops inside fused elementwise chains -------------------------
do
  -- exact arithmetic around the draws (no product feeding a sum, which a
  -- fused kernel may contract to an FMA): every grouping gives the same bits
  local f = function(x)
    local y = x + fl.randn(x.shape)
    return fl.dropout(y, 0.5):maximum(fl.rand(x.shape)) - 1
  end
  local x = fl.randn(17, 33)
  t.is(fl.capture(f, x):fuse():stats().kernels, 1, "randn, add, dropout, rand, maximum, sub: one kernel")
  local fu = seeded_all(4, fl.compile(f), x)
  local un = seeded_all(4, fl.compile(f, {fuse = false}), x)
  local ea = seeded_all(4, f, x)
  t.ok(all_same(fu, un) and all_same(fu, ea), "fused equals unfused and eager bit for bit")
end
do
  -- with transcendental functions, whose vector forms may differ by ulps
  local f = function(x)
    local y = (x * 3):sin() + fl.randn(x.shape)
    return fl.dropout(y:tanh(), 0.5) * fl.rand(x.shape) - 1
  end
  local x = fl.randn(17, 33)
  local g = fl.capture(f, x)
  local plan = g:fuse()
  t.is(plan:stats().kernels, 1, "sin, randn, tanh, dropout, rand: one fused kernel")
  local src = plan:codegen("cpu"):source()
  t.ok(src:find("fl_rand_normal", 1, true) and src:find("fl_rand_uniform", 1, true),
       "the kernel computes its random numbers itself (fl_rand_normal, fl_rand_uniform)")
  local fu = seeded(4, fl.compile(f), x)
  local un = seeded(4, fl.compile(f, {fuse = false}), x)
  local ea = seeded(4, f, x)
  t.ok(fl.allclose(fu, un, 1e-5, 1e-6), "fused agrees with unfused (sin, tanh within ulps)")
  t.ok(fl.allclose(fu, ea, 1e-5, 1e-6), "and with eager")
end

-- ---- the captured graph shows random ops, not parameters ----------------
do
  local f = function(x)
    local _ = fl.rand(6)                        -- unused, still a draw
    return x + fl.rand(4), fl.randn(2, 4), fl.dropout(x, 0.1), x + fl.rand(4)
  end
  local x = fl.ones(2, 4)
  local g = fl.capture(f, x)
  local s = tostring(g)
  t.ok(s:find("= rand() : float32[4]", 1, true), "listing: %n = rand() : float32[4]")
  t.ok(s:find("= randn() : float32[2,4]", 1, true), "listing: randn()")
  t.ok(s:find("= dropout(%0) : float32[2,4]", 1, true), "listing: dropout(%0)")
  t.ok(not s:find("param", 1, true), "no random tensor became a parameter")
  local ex = fl.explain(f, x)
  t.is(ex.op_counts.rand, 3, "fl.explain counts the rand ops (the unused one too)")
  t.is(ex.op_counts.randn, 1, "fl.explain counts randn")
  t.is(ex.op_counts.dropout, 1, "fl.explain counts dropout")
  local o = g:optimize()
  local n = 0
  for _ in tostring(o):gmatch("= rand%(%)") do n = n + 1 end
  t.is(n, 3, "optimize: two rand(4) stay two draws (no CSE), the unused one stays (no DCE)")
  local a = seeded_all(2, f, x)
  local b = seeded_all(2, function(v) return o:run(v) end, x)
  local c = seeded_all(2, fl.compile(f), x)
  t.is(a.n, 5, "four results and the stream after them")
  t.ok(all_same(a, b) and all_same(a, c),
       "the unused draw still advances the stream: optimized and compiled equal eager")
end

-- ---- statistics ----------------------------------------------------------
do
  local n = 100000
  local cf = fl.compile(function(x) return x + fl.rand(n) end)
  local cn = fl.compile(function(x) return x + fl.randn(n) end)
  local z = fl.zeros(n)
  local u, g = cf(z), cn(z)
  local mu, vu = u:mean():item(), u:var():item()
  local mg, vg = g:mean():item(), g:var():item()
  t.ok(math.abs(mu - 0.5) < 0.005, ("compiled rand: mean %.4f within 0.5 +- 0.005"):format(mu))
  t.ok(math.abs(vu - 1 / 12) < 0.002, ("compiled rand: variance %.4f within 1/12 +- 0.002"):format(vu))
  t.ok(u:amin():item() >= 0 and u:amax():item() < 1, "compiled rand: values in [0, 1)")
  t.ok(math.abs(mg) < 0.016, ("compiled randn: mean %.4f within 0 +- 0.016"):format(mg))
  t.ok(math.abs(vg - 1) < 0.03, ("compiled randn: variance %.4f within 1 +- 0.03"):format(vg))
  local h = fl.compile(function(x) return x + fl.rand(n, {dtype = "float16"}) end)(z:to("float16"))
  t.ok(h:amax():item() < 1, "compiled float16 rand never rounds up to 1")
end

-- ---- nn.Dropout -----------------------------------------------------------
do
  local p = 0.3
  local d = nn.Dropout(p)
  local x = fl.ones(200, 500)
  local cd = fl.compile(d)
  local y = cd(x)
  local zeros = (y:eq(0)):to("float32"):mean():item()
  t.ok(math.abs(zeros - p) < 0.0075, ("compiled Dropout(0.3) in training zeroes %.4f (0.3 +- 0.0075)"):format(zeros))
  local kept = y:amax():item()
  t.near(kept, 1 / (1 - p), 1e-6, "kept values are scaled by 1/(1-p)")
  t.ok(not same(y, cd(x)), "each compiled call draws a new mask")
  local ye = seeded(3, d, x)
  local yc = seeded(3, cd, x)
  t.ok(same(ye, yc), "after manual_seed, compiled Dropout's mask equals eager's")
  local m = nn.Sequential(nn.Linear(8, 8), nn.Dropout(0.5), nn.ReLU())
  local xm = fl.randn(4, 8)
  local cm = fl.compile(m)
  t.ok(same(seeded(6, m, xm), seeded(6, cm, xm)), "a model with dropout in training: compiled equals eager")
  t.ok(tostring(fl.capture(m, xm)):find("dropout(", 1, true), "its graph has the dropout op")
  m:eval()
  local ce = fl.compile(m)
  t.ok(same(ce(xm), m(xm)) and same(ce(xm), ce(xm)), "in eval mode dropout is the identity, compiled too")
  t.ok(not tostring(fl.capture(m, xm)):find("dropout", 1, true), "... and not in the graph")
  t.ok(same(fl.dropout(x, 0.5, false), x), "fl.dropout(x, p, false) is x")
  t.ok(same(fl.dropout(x, 0), x), "fl.dropout(x, 0) keeps every value")
  t.ok(same(fl.dropout(x, 1), x * 0), "fl.dropout(x, 1) zeroes every value")
  t.raises(function() fl.dropout(x, 2) end, "dropout: p must be a probability in %[0, 1%], got 2",
           "fl.dropout: p out of range")
  t.raises(function() fl.dropout(fl.ones(3, {dtype = "int64"}), 0.5) end,
           "dropout: dtype int64 is not a floating dtype", "fl.dropout: integer tensors refused")
end

-- ---- the CUDA code path is generated for the random ops -------------------
do
  local f = function(x) return fl.dropout(x, 0.2) + fl.randn(x.shape) * fl.rand(x.shape) end
  local g = fl.capture(f, fl.ones(5, 9))
  local okc, k = pcall(function() return g:fuse():codegen("cuda") end)
  if okc then
    local src = k:source()
    t.ok(src:find("fl_rand_uniform(rk, rs", 1, true) and src:find("fl_rand_normal(rk, rs", 1, true),
         "codegen('cuda'): the kernel draws from the stream (key and start block as arguments)")
    if k.try_compile then
      local compiled, why = k:try_compile()
      t.ok(compiled, "NVRTC compiles it" .. (compiled and "" or (": " .. tostring(why))))
    end
  else
    t.skip("no CUDA code generator in this build", 2)
  end
end

-- max-autotune times its variants before the first call returns: those
-- timing runs must not move the stream the caller sees
do
  local f = function(x) return (x + fl.rand(64, 64)):exp() end
  local cm = fl.compile(f, {mode = "max-autotune"})
  local x = fl.randn(64, 64)
  fl.manual_seed(77)
  local a = cm(x)
  local after = fl.get_rng_state()
  fl.manual_seed(77)
  local b = f(x)
  local want = fl.get_rng_state()
  t.ok(fl.allclose(a, b, 1e-6, 1e-6), "max-autotune: the first call draws what eager draws")
  t.ok(after.offset == want.offset and after.seed == want.seed, "and leaves the stream where eager does")
end

-- the checklist compares compiled with eager on the same draws
do
  local r = fl.checklist(function(x) return x + fl.rand(32, 32) end,
                         {inputs = {fl.randn(32, 32)}, quiet = true})
  t.ok(r.max_abs_err <= 1e-6, "checklist: a function that draws matches eager (max abs err "
       .. tostring(r.max_abs_err) .. ")")
  -- "results differ", not "differ": "no clear difference here" is a
  -- timing verdict a busy machine may give
  t.ok(not tostring(r.recommendation):find("results differ"), "and is not called inaccurate")
end

t.done()
