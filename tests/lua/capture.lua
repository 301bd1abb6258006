-- capture.lua -- graph capture and fl.compile: listings, passes, guards,
-- recompiles, automatic dynamic shapes, graph breaks, stats.
-- Compiled results are compared with eager ones (float32, rtol 1e-5,
-- atol 1e-6: the same kernels run in a different grouping).
local fl = fl or require "fuselab"
local t = require "tap"

local function close(a, b) return fl.allclose(a, b, 1e-5, 1e-6) end

fl.manual_seed(7)

-- ---- capture and the listing -------------------------------------------
local W = fl.randn(4, 3)
-- how often f's Lua body runs, seen from outside (a counter f kept itself
-- would be a side effect the compiled f must repeat each call)
local counter = {n = 0}
local f
local function count_calls(on)
  debug.sethook(on and function()
    if debug.getinfo(2, "f").func == f then counter.n = counter.n + 1 end
  end or nil, on and "c" or "")
end
function f(x, y)
  local h = (x:matmul(W) + 1):relu()
  return h * y, "tag", 3
end

local x, y = fl.randn(2, 4), fl.randn(2, 3)
local g = fl.capture(f, x, y)
local listing = tostring(g)
t.ok(listing:find("graph(%0: float32[2,4] x, %1: float32[2,3] y)", 1, true), "listing names inputs with types")
t.ok(listing:find("= param W : float32[4,3]", 1, true), "the upvalue W is a param named W")
t.ok(listing:find("%%%d+ = matmul%(%%0, %%2%) : float32%[2,3%]    # [^\n]*capture.lua:24"), "matmul line with its source line")
t.ok(listing:find("%%%d+ = relu%(%%%d+%) : float32%[2,3%]"), "relu line")
t.is(#g:ops(), 4, "four ops: matmul add relu mul")
local ref = f(x, y)
t.ok(close(g:run(x, y), ref), "captured graph computes what the function does")
t.ok(close(g:run_reference(x, y), ref), "and so does the reference interpreter on it")

-- decompose / optimize keep results
local function mlp_block(x)
  local h = x:layer_norm({4}) : gelu()
  local s = h:softmax(-1)
  return (s * 1 + 0):log_softmax(-1)
end
local g1 = fl.capture(mlp_block, x)
local g2, log2 = g1:decompose{quiet = true}
local g3, log3 = g2:optimize{quiet = true}
t.ok(log2:find("layer_norm"), "decompose log names layer_norm")
t.ok(log3:find("x %* 1 = x") and log3:find("x %+ 0 = x"), "optimize log shows the simplifications")
t.ok(close(g2:run(x), mlp_block(x)) and close(g3:run(x), mlp_block(x)), "decomposed and optimized graphs match eager")
local kinds = {}
for _, name in ipairs(g2:ops()) do kinds[name] = true end
t.ok(not kinds.layer_norm and not kinds.softmax and not kinds.gelu and kinds.erf, "composites are gone after decompose")

-- ---- fl.compile: guards, no re-run, automatic dynamic ---------------------
counter.n = 0
local cm = fl.compile(f)
count_calls(true)
local a, tag, three = cm(x, y)
count_calls(false)
t.ok(close(a, ref) and tag == "tag" and three == 3, "first call: tensor and plain results")
t.is(counter.n, 1, "first call ran the body once")
count_calls(true)
a = cm(x, y)
count_calls(false)
t.ok(close(a, ref), "second call right")
t.is(counter.n, 1, "second call did not run the Lua body")
local x5, y5, x7, y7 = fl.randn(5, 4), fl.randn(5, 3), fl.randn(7, 4), fl.randn(7, 3)
t.ok(close(cm(x5, y5), f(x5, y5)), "new batch size right")
t.ok(close(cm(x7, y7), f(x7, y7)), "third batch size right")
local s = cm:stats()
t.is(s.compiles, 2, "three shapes under automatic dynamic: exactly two compiles")
t.is(s.recompiles, 1, "one recompile")
t.is(s.recompile_reasons[1], "x.shape[1]: expected 2, got 5", "the recompile reason names the dim and sizes")
t.is(s.calls, 4, "calls counted")
t.ok(s.cache_hits >= 2, "cache hits counted")
for _, k in ipairs{"calls", "compiles", "recompiles", "cache_hits", "disk_cache_hits", "graph_breaks",
                    "fallbacks", "compile_ms", "first_call_ms", "kernels", "guards",
                    "recompile_reasons", "break_reasons"} do
  t.ok(s[k] ~= nil, "stats has " .. k)
end
local gtext = table.concat(s.guards, "\n")
t.ok(gtext:find("x: float32[s(>=2),4] on cpu", 1, true), "guards show the symbolic dim")
t.ok(gtext:find("W is the same tensor", 1, true), "guards include the param")

-- sizes 0 and 1 are always specialized
local x1, y1 = fl.randn(1, 4), fl.randn(1, 3)
t.ok(close(cm(x1, y1), f(x1, y1)), "batch of one right")
t.is(cm:stats().compiles, 3, "size 1 is specialized: a new compile")

-- dynamic=false specializes every size; dynamic=true needs one compile
local cs = fl.compile(f, {dynamic = false})
cs(x, y); cs(x5, y5); cs(x7, y7)
t.is(cs:stats().compiles, 3, "dynamic=false: one compile per shape")
local cd = fl.compile(f, {dynamic = true})
cd(x, y); cd(x5, y5); cd(x7, y7)
t.is(cd:stats().compiles, 1, "dynamic=true: one compile for three shapes")

-- fl.mark_dynamic
local cmk = fl.compile(f)
local xm = fl.mark_dynamic(fl.randn(3, 4), 1)
local ym = fl.mark_dynamic(fl.randn(3, 3), 1)
cmk(xm, ym)
cmk(x5, y5)
t.is(cmk:stats().compiles, 1, "mark_dynamic makes the first compile symbolic")

-- a size read by Lua stays symbolic under dynamic=true: x.shape[1] is s0
-- and the reshape to s0*4 serves every size
local function reads_shape(x)
  local n = x.shape[1]
  return x:reshape(n * 4)
end
local cr = fl.compile(reads_shape, {dynamic = true})
cr(fl.randn(3, 4))
local r6 = cr(fl.randn(6, 4))
t.is(r6.shape[1], 24, "a reshape to a size read from x.shape stays right")
t.is(cr:stats().compiles, 1, "reading x.shape keeps that dim symbolic: one compile")

-- ---- params: by reference, rebinding -------------------------------------
local cp = fl.compile(f)
local before = cp(x, y)
W:mul_(2)
local after = cp(x, y)
t.ok(close(after, f(x, y)) and not close(after, before), "in-place change of a weight is seen by the next call")
t.is(cp:stats().compiles, 1, "and needs no recompile")
W = fl.randn(4, 3)
local rebound = cp(x, y)
t.ok(close(rebound, f(x, y)), "rebinding the weight gives the new result")
t.ok(cp:stats().recompile_reasons[1]:find("parameter W: a different tensor now", 1, true), "rebinding is a recompile with its reason")

-- modules as nested tables
local Lin = {}
Lin.__index = Lin
Lin.__call = function(self, x) return x:matmul(self.w) + self.b end
local function lin(i, o) return setmetatable({w = fl.randn(i, o), b = fl.randn(o)}, Lin) end
local model = setmetatable({l1 = lin(4, 8), l2 = lin(8, 2)}, {__call = function(self, x)
  return self.l2(self.l1(x):tanh())
end})
local cmod = fl.compile(model)
t.ok(close(cmod(x), model(x)), "a callable table (module) compiles")
local gm = fl.capture(model, x)
t.ok(tostring(gm):find("param l1.w", 1, true) and tostring(gm):find("param l2.b", 1, true), "module params are named by their path")

-- globals read during capture are guarded
scale = 2
local function scaled(x) return x * scale end
local cg = fl.compile(scaled)
t.ok(close(cg(x), x * 2), "global scale 2")
scale = 3
t.ok(close(cg(x), x * 3), "global scale 3 after a recompile")
t.is(cg:stats().recompile_reasons[1], "global 'scale': expected 2, got 3", "the reason names the global")

-- several tensors and values out
local function multi(x) return x + 1, x:sum(), {k = 1}, nil, true end
local cmu = fl.compile(multi)
local r1, r2, r3, r4, r5 = cmu(x)
t.ok(close(r1, x + 1) and close(r2, x:sum()) and r3.k == 1 and r4 == nil and r5 == true, "several results of mixed kinds")

-- recompile limit
local cl = fl.compile(f, {dynamic = false, recompile_limit = 2})
local ok_all = true
for n = 2, 6 do
  local xa, ya = fl.randn(n, 4), fl.randn(n, 3)
  ok_all = ok_all and close(cl(xa, ya), f(xa, ya))
end
local sl = cl:stats()
t.ok(ok_all, "results stay right past the recompile limit")
t.is(sl.compiles, 2, "no compile past the limit")
t.ok(sl.fallbacks >= 1, "fallbacks counted")

-- ---- graph breaks -----------------------------------------------------------
local function branchy(x)
  local y
  if x:sum():item() > 0 then y = x * 2 else y = x - 1 end
  for i = 1, 3 do
    y = y + i
    if i == 2 then fl.graph_break() end
  end
  return y:relu()
end
local cb = fl.compile(branchy)
local pos, neg = fl.ones(2, 3), -fl.ones(2, 3)
t.ok(close(cb(pos), branchy(pos)) and close(cb(neg), branchy(neg)), "data-dependent branch: both ways right")
t.ok(close(cb(pos), branchy(pos)), "again from the segment cache")
local sb = cb:stats()
t.is(sb.graph_breaks, 2, "two distinct break sites")
t.ok(sb.break_reasons[1].reason:find("item", 1, true) and sb.break_reasons[1].where:find("capture.lua:%d+"), "break reason and file:line")
t.ok(sb.break_reasons[1].hint ~= nil, "break hint")
local ex = fl.explain(branchy, pos)
t.is(ex.graph_break_count, 2, "explain counts breaks")
t.ok(ex.graph_count >= 3, "explain counts graphs")
t.ok(ex.op_count >= 6 and #ex.ops >= 4, "explain lists ops")
t.ok(ex.unsupported and #ex.unsupported == 0, "nothing unsupported")

local function inplace(x) local y = x * 2; y:add_(1); return y end
local exi = fl.explain(inplace, pos)
t.ok(exi.graph_break_count == 0 and #exi.unsupported == 0, "an in-place op is captured: no break, nothing unsupported")
t.ok(close(fl.compile(inplace)(pos), inplace(pos)), "and still computes right")

-- fullgraph
local okf, errf = pcall(fl.compile(branchy, {fullgraph = true}), pos)
t.ok(not okf and errf:find("graph break with fullgraph=true: item%(%) needs a concrete value %(.-capture.lua:%d+%)"), "fullgraph names the break and line")
t.ok(not fl._tracing(), "no trace left recording after the error")

-- ---- bad input ----------------------------------------------------------------
local function boom(x) return x:matmul(fl.ones(7, 7)) end
local okb, errb = pcall(fl.compile(boom), x)
t.ok(not okb and errb:find("matmul: [2,4] @ [7,7]: inner dimensions differ", 1, true), "an error in the body surfaces with its own message")
t.ok(errb:find("capture.lua:%d+"), "and its own source line")
t.ok(close(x + 1, x + 1) and not fl._tracing(), "eager works after a failed capture")
t.raises(function() fl.compile(42) end, "compile: expected a function or an nn module, got number", "compile of a number")
t.raises(function() fl.compile(f, {backnd = "cpu"}) end, "unknown option 'backnd'", "option typo")
t.raises(function() fl.compile(f, {mode = "fast"}) end, "mode must be one of", "bad mode")
t.raises(function() fl.capture(nil) end, "capture: expected a function", "capture of nil")
local okw, errw = pcall(cm, x)     -- missing y: the body fails, and says why
t.ok(not okw and errw:find("the function takes 2 argument(s) (x, y), called with 1", 1, true),
     "wrong arity on a compiled call is named")
local cnum = fl.compile(function(x, k) return x * k end)
t.ok(close(cnum(x, 2), x * 2) and close(cnum(x, 3), x * 3), "number arguments are guarded by value")
t.is(cnum:stats().recompile_reasons[1], "argument 'k': expected 2, got 3", "and named in the reason")

-- FUSELAB_DEBUG=1 prints one line per compile / recompile / cache hit
local bin = os.getenv("FUSELAB")
if bin then
  local code = "local f=fl.compile(function(x) return x+1 end); f(fl.ones(2)); f(fl.ones(3)); f(fl.ones(3))"
  local p = io.popen("FUSELAB_DEBUG=1 '" .. bin .. "' -e '" .. code .. "' 2>&1")
  local out = p:read("a")
  p:close()
  t.ok(out:find("fuselab: compile:") and out:find("fuselab: recompile: x.shape%[1%]: expected 2, got 3"), "FUSELAB_DEBUG=1 shows compiles and recompile reasons")
  -- FUSELAB_DEBUG=2 adds every kernel's time and bandwidth, on the first
  -- run and on cache hits alike
  code = "local w=fl.randn(8,16); local f=fl.compile(function(x) return (x:matmul(w)+1):relu():softmax(2) end); "
    .. "local x=fl.randn(4,8); f(x); f(x)"
  p = io.popen("FUSELAB_DEBUG=2 '" .. bin .. "' -e '" .. code .. "' 2>&1")
  out = p:read("a")
  p:close()
  local _, klines = out:gsub("\nfuselab:   k%d+%s+[%w_]+%s+[%d.]+ ms%s+[%d.]+ GB/s", "")
  t.ok(klines >= 4 and out:find("ran %d+ kernel%(s%) in"), "FUSELAB_DEBUG=2 times each kernel of each run (" .. klines .. " lines)")
else
  t.skip("FUSELAB not set")
  t.skip("FUSELAB not set")
end

-- k:profile(): per-kernel times of a program, off until asked for
do
  local x = fl.randn(64, 32)
  local g = fl.capture(function(x) return (x * 2):exp():sum(2) + x:amax(2) end, x)
  local k = g:fuse{fuse = false}:codegen("cpu")
  local want = k:run(x)
  t.is(k:profile().runs, 0, "profile: nothing recorded before it is turned on")
  k:profile(true)
  local got
  for _ = 1, 3 do got = k:run(x) end
  local prof = k:profile()
  t.is(prof.runs, 3, "profile: counts the runs made while on")
  t.is(#prof, k:stats().kernels, "profile: one row per kernel")
  local names_ok, times_ok = true, true
  for i, r in ipairs(prof) do
    names_ok = names_ok and r.name == g:fuse{fuse = false}:kernels()[i].name
    times_ok = times_ok and r.ms >= 0 and r.last_ms >= 0 and r.gbps >= 0
  end
  t.ok(names_ok and times_ok, "profile: rows name their kernels, in run order, with times")
  t.ok(close(got, want), "profile: results unchanged")
  k:profile(false)
  k:run(x)
  t.is(k:profile().runs, 3, "profile(false): stops counting")
  t.raises(function() k:profile("yes") end, "profile: expected true or false, got string",
           "profile: a bad argument is named")
end

-- a name from the user (a Lua key) with terminal control characters is
-- kept as visible text in the graph, the plan and the generated source
do
  local m = {["w\27[31mred"] = fl.ones(2)}
  local g = fl.capture(function(x) return (x + m["w\27[31mred"]):exp() end, fl.ones(2))
  local text = tostring(g)
  t.ok(text:find("\27", 1, true) == nil and text:find("w\\x1b[31mred", 1, true) ~= nil,
       "control characters in a param name print escaped")
  local k = g:decompose():fuse():codegen("cpu")
  t.ok(k:source():find("\27", 1, true) == nil, "and never reach the generated source raw")
end

-- ---- numbers as graph inputs (automatic dynamic, as torch.compile's floats)
do
  local function tempered(x, temperature) return (x / temperature):softmax(-1) end
  local x = fl.randn(4, 8)
  local cf, cd = fl.compile(tempered), fl.compile(tempered, {dynamic = true})
  local cs = fl.compile(tempered, {dynamic = false})
  local ok = true
  for _, temp in ipairs{0.5, 0.7, 0.8, 0.9, 1.1, 1.3} do
    ok = ok and close(cf(x, temp), tempered(x, temp)) and close(cd(x, temp), tempered(x, temp))
      and close(cs(x, temp), tempered(x, temp))
  end
  t.ok(ok, "six temperatures: compiled equals eager in every mode")
  t.is(cf:stats().compiles, 2, "automatic: one recompile, then the float is a graph input")
  t.is(cf:stats().dynamic_numbers, {"temperature"}, "stats name it")
  t.ok(table.concat(cf:stats().guards, "\n"):find("temperature: any float (a graph input)", 1, true),
       "the guards say so")
  t.is(cd:stats().compiles, 1, "dynamic=true: an input from the start")
  t.is(cs:stats().compiles, 6, "dynamic=false: a graph per value")
  cf(x, 2)
  t.is(cf:stats().recompile_reasons[2], "temperature: expected a float, got an integer",
       "an integer where a float was: a guard that names it")
  local function takes(y, n) return y:narrow(2, 1, n):sum() end
  local ct = fl.compile(takes)
  local okt = true
  for _, n in ipairs{2, 3, 4} do okt = okt and close(ct(x, n), takes(x, n)) end
  t.ok(okt and ct:stats().compiles == 3 and #ct:stats().dynamic_numbers == 0,
       "an integer used as a size stays specialized")
  t.ok(table.concat(ct:stats().specializations, "\n"):find("needs a plain number", 1, true),
       "and the specialization says why")
end

t.done()
