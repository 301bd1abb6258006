-- checklist.lua -- fl.checklist: the fields of the table it returns, the
-- coverage count, the decision table's three answers, the report, and the
-- errors for bad arguments.  Timings are only checked for sanity
-- (positive, finite): the machine running the tests may be busy, and a
-- speed target here would test the machine, not the checklist.
local fl = fl or require "fuselab"
local t = require "tap"

fl.manual_seed(3)

local function finite_pos(v) return type(v) == "number" and v > 0 and v < math.huge end

-- Runs f with print captured; returns what it printed and f's results.
local function printed(f)
  local lines, saved = {}, print
  print = function(...)
    local parts = table.pack(...)
    for i = 1, parts.n do parts[i] = tostring(parts[i]) end
    lines[#lines + 1] = table.concat(parts, "\t")
  end
  local res = table.pack(pcall(f))
  print = saved
  if not res[1] then error(res[2], 0) end
  return table.concat(lines, "\n"), table.unpack(res, 2, res.n)
end

local dir_before = fl.cache_info().dir

-- Sizes stay under the generated kernels' threshold for starting threads
-- (32768 elements): on a loaded machine a parallel region can wait
-- milliseconds for a core, and the decisions below compare timings.

-- ---- a stable function: eight elementwise ops, one fused kernel compiled
-- against eight passes over memory eagerly
local function stable(x)
  return ((x * 2 + 1):tanh() * x - 3):sigmoid():exp():relu()
end
local x = fl.randn(128, 128)
local text, r = printed(function() return fl.checklist(stable, {inputs = {x}, calls = 10}) end)

t.is(type(r), "table", "returns a table")
t.is(type(r.coverage), "table", "coverage is a table")
t.is(math.type(r.coverage.supported), "integer", "coverage.supported is an integer")
t.is(math.type(r.coverage.total), "integer", "coverage.total is an integer")
t.is(type(r.coverage.unsupported), "table", "coverage.unsupported is a list")
t.is(r.coverage.supported, 8, "all eight ops counted")
t.is(r.coverage.total, 8, "eight ops in all")
t.is(#r.coverage.unsupported, 0, "nothing unsupported")
for _, k in ipairs{"cold_ms", "warm_ms", "steady_ms", "eager_ms"} do
  t.ok(finite_pos(r[k]), k .. " is a positive, finite number (" .. tostring(r[k]) .. ")")
end
t.ok(r.break_even_calls == nil or (math.type(r.break_even_calls) == "integer" and r.break_even_calls >= 1),
  "break_even_calls is nil or a count >= 1")
for _, k in ipairs{"cache_hit_rate", "cache_hit_rate_static"} do
  t.ok(type(r[k]) == "number" and r[k] >= 0 and r[k] <= 1, k .. " is a rate in [0, 1]")
end
t.is(r.cache_hit_rate, 1, "one shape: every call after the first hits")
t.is(r.recompiles, 0, "no recompiles without a shape sweep")
t.is(r.recompiles_static, 0, "no static recompiles either")
t.ok(type(r.max_abs_err) == "number" and r.max_abs_err < 1e-4, "max_abs_err small (" .. r.max_abs_err .. ")")
t.ok(type(r.max_rel_err) == "number" and r.max_rel_err < 1e-4, "max_rel_err small (" .. r.max_rel_err .. ")")
t.is(r.fallbacks, 0, "no fallbacks")
t.is(type(r.recommendation), "string", "recommendation is a sentence")
-- the decision follows the verdict, whichever way this machine's timings
-- went (a busy machine may leave no clear difference)
if r.verdict.verdict > 0 then
  t.is(r.decision, "compile", "stable inference, compiled clearly faster: compile")
  t.ok(r.recommendation:find("^compile"), "the sentence says compile: " .. r.recommendation)
  t.ok(r.recommendation:find("saves %d+%% per call") and r.recommendation:find("after %d+ call"),
    "with the measured saving and the break-even")
else
  t.is(r.decision, "eager", "no clear gain: eager (" .. r.verdict.text .. ")")
  t.ok(r.recommendation:find("no clear difference here", 1, true) or r.recommendation:find("slower", 1, true),
    "the sentence says why: " .. r.recommendation)
  t.ok(r.break_even_calls == nil, "and there is no break-even")
end
t.ok(r.recommendation:find(("%.4g ms"):format(r.steady_ms), 1, true)
     and r.recommendation:find(("%.4g ms"):format(r.eager_ms), 1, true),
  "the sentence gives the two medians that decided it")
t.ok(not r.recommendation:find("while the model still changes often", 1, true), "no boilerplate clause")
t.is(type(r.noisy), "boolean", "noisy is a flag")
t.ok(type(r.spreads.steady) == "number" and type(r.spreads.eager) == "number", "the spreads are kept")
t.ok(r.timing.steady.q1_ms <= r.steady_ms and r.steady_ms <= r.timing.steady.q3_ms, "steady_ms is a median")
t.ok(text:find("go-live checklist", 1, true), "prints a report")
for _, item in ipairs{"operator coverage", "first call (cold)", "steady state", "break-even",
                      "cache hit rate", "accuracy vs eager", "fallbacks", "recommendation:"} do
  t.ok(text:find(item, 1, true), "the report has " .. item)
end
t.is(fl.cache_info().dir, dir_before, "the user's cache directory is back in place")

-- ---- quiet prints nothing
local quiet_text = printed(function()
  return fl.checklist(stable, {inputs = {fl.randn(64, 64)}, quiet = true, calls = 3})
end)
t.is(quiet_text, "", "quiet = true prints nothing")
-- cold means cold: an empty cache of its own each time, the user's back after
do
  -- "the user's cache": one only this test writes (the suite's is shared
  -- by the tests running beside this one)
  local saved = fl._cache_use_dir(fl._mkdtemp())
  fl.compile(function(z) return z:abs() * 5 end)(fl.randn(5))
  local dir0, n0 = fl.cache_info().dir, fl.cache_info().entries
  local okw, err = pcall(fl.with_empty_cache, function()
    fl.compile(function(z) return z:cos() * 3 end)(fl.randn(5))
    error("boom")
  end)
  t.ok(not okw and tostring(err):find("boom", 1, true) and fl.cache_info().dir == dir0
       and n0 >= 1 and fl.cache_info().entries == n0,
       "with_empty_cache: the user's cache is back, untouched, after an error")
  pcall(fl.cache_clear)
  os.remove(fl._cache_use_dir(saved))
  local function cold_origin()
    return fl.with_empty_cache(function()
      local c0 = fl.cache_info()
      fl.compile(function(z) return z:sin() * 7 end)(fl.randn(5))
      return fl.cache_origins(c0)
    end)
  end
  t.is(cold_origin(), "1 program compiled", "a cold start compiles")
  t.is(cold_origin(), "1 program compiled", "and again the second time: a rehearsal leaves it cold")
end
local one_text = printed(function()
  return fl.checklist(function(z) return z:exp() end, {inputs = {fl.randn(8, 8)}, calls = 3})
end)
t.ok(one_text:find("cache hit rate      not measured", 1, true) and not one_text:find("static 100%", 1, true),
     "one input and no shapes: the hit rate is not measured, and says so")

-- ---- coverage: an in-place write the graph cannot express (through a
-- strided slice) is a break; one it can is captured
local function inplace(y)
  local z = y:exp()
  z:slice(2, 1, 16, 2):fill_(0)
  return z:relu()
end
local ri = fl.checklist(inplace, {inputs = {fl.randn(16, 16)}, quiet = true, calls = 3})
t.is(ri.coverage.supported, 3, "exp, slice and relu are supported")
t.is(ri.coverage.total, 4, "four ops in all")
t.is(ri.coverage.unsupported, {"fill_"}, "fill_ through a strided slice is listed as not supported")
local rc = fl.checklist(function(y) local z = y:exp(); z:add_(y); return z:relu() end,
                        {inputs = {fl.randn(16, 16)}, quiet = true, calls = 3})
t.is(#rc.coverage.unsupported, 0, "add_ is captured: nothing unsupported")
t.ok(ri.max_abs_err < 1e-4, "the broken graph still computes the same")

-- ---- dynamic shapes: batch sizes change; static mode recompiles for
-- each, automatic dynamic shapes once
local function rows(y) return (y * 2 + 1):tanh():relu():sum(-1) end
local rd = fl.checklist(rows, {inputs = {fl.randn(64, 256)}, shapes = {32, 96, {16, 256}, {fl.randn(100, 256)}},
                               quiet = true, calls = 5})
t.ok(rd.recompiles_static >= 3, "static mode recompiles for new shapes (" .. rd.recompiles_static .. ")")
t.ok(rd.recompiles < rd.recompiles_static, "automatic dynamic recompiles less (" .. rd.recompiles .. ")")
t.ok(rd.cache_hit_rate > rd.cache_hit_rate_static, ("dynamic hit rate %.2f > static %.2f"):format(
  rd.cache_hit_rate, rd.cache_hit_rate_static))
if rd.verdict_dynamic.verdict > 0 then
  t.is(rd.decision, "dynamic", "varying shapes, the dynamic build clearly faster: dynamic mode")
  t.ok(rd.recommendation:find("dynamic") and rd.recommendation:find("recompiled %d+ time"),
    "the sentence gives dynamic advice with the recompiles: " .. rd.recommendation)
else
  t.is(rd.decision, "eager", "the dynamic build not clearly faster: eager")
  t.ok(rd.recommendation:find("the dynamic build is not faster", 1, true), rd.recommendation)
end
t.ok(rd.recommendation:find(("%.4g ms"):format(rd.steady_dynamic_ms), 1, true),
  "the dynamic build's median is in the sentence: " .. rd.recommendation)

-- ---- the decision table alone: the reasons are the deciding numbers
local function timing(ms) return fl.measure({ms * 0.99, ms, ms, ms * 1.01}) end
local base = {accuracy_nan = false, max_rel_err = 0, fallbacks = 0, graph_breaks = 0, cold_ms = 300,
              eager_ms = 0.48, steady_ms = 0.2, steady_dynamic_ms = 0.5}
local function case(over)
  local c = {}
  for k, v in pairs(base) do c[k] = v end
  for k, v in pairs(over) do c[k] = v end
  c.timing = {eager = timing(c.eager_ms), steady = timing(c.steady_ms), steady_dynamic = timing(c.steady_dynamic_ms)}
  c.verdict = fl.compare_times(c.timing.steady, c.timing.eager)
  c.verdict_dynamic = fl.compare_times(c.timing.steady_dynamic, c.timing.eager)
  return c
end
-- an 88% hit rate whose dynamic build is not faster than eager: the reason
-- is that timing, not "inputs change too often"
local d, text = fl._checklist_recommend(case{recompiles_static = 3, recompiles = 1, cache_hit_rate = 0.88,
                                             cache_hit_rate_static = 0.5}, 4)
t.is(d, "eager", "dynamic not faster: eager")
t.ok(text:find("dynamic 0.5 ms (IQR", 1, true) and text:find("eager 0.48 ms (IQR", 1, true),
  "the dynamic and eager medians are the reason: " .. text)
t.ok(text:find("hit rate 88%", 1, true), "with the hit rate it had")
t.ok(not text:find("change too often", 1, true), "not 'inputs change too often'")
-- inputs that really change too often
d, text = fl._checklist_recommend(case{recompiles_static = 3, recompiles = 3, cache_hit_rate = 0.2,
                                       cache_hit_rate_static = 0.2}, 4)
t.ok(d == "eager" and text:find("change too often", 1, true), "no reuse: " .. text)
-- static shapes, 2.4x faster: compile, with both medians, no boilerplate
d, text = fl._checklist_recommend(case{recompiles_static = 0, recompiles = 0, cache_hit_rate = 1,
                                       cache_hit_rate_static = 1, break_even_calls = 1072}, 1)
t.is(d, "compile", "clearly faster: compile")
t.ok(text:find("compiled 0.2 ms (IQR", 1, true) and text:find("eager 0.48 ms (IQR", 1, true), text)
t.ok(not text:find("stay eager", 1, true), "no boilerplate clause: " .. text)
-- 3% apart: no clear difference
d, text = fl._checklist_recommend(case{recompiles_static = 0, recompiles = 0, cache_hit_rate = 1,
                                       cache_hit_rate_static = 1, steady_ms = 0.466}, 1)
t.ok(d == "eager" and text:find("no clear difference here", 1, true), "within the noise: " .. text)
t.ok(rd.max_abs_err < 1e-3, "accurate over the sweep")

-- ---- frequent changes: a choice the experimenter switches every run (a
-- string: which activation) is a guard that fails every time, in either
-- mode; a float that changes becomes a graph input after one recompile,
-- as torch.compile's automatic dynamic makes it
local function switched(y, act) return (y * 0.5 + 1)[act](y * 0.5 + 1) end
local y = fl.randn(64, 64)
local rc = fl.checklist(switched, {inputs = {y, "relu"}, shapes = {{y, "gelu"}, {y, "tanh"}, {y, "sigmoid"}},
                                   quiet = true, calls = 3})
t.ok(rc.recompiles >= 3, "a changing choice recompiles in dynamic mode too (" .. rc.recompiles .. ")")
t.is(rc.decision, "eager", "frequent changes: eager")
t.ok(rc.recommendation:find("^eager"), "the sentence says eager: " .. rc.recommendation)
local function scaled(z, s) return (z * s + 1):relu() end
local rf = fl.checklist(scaled, {inputs = {y, 0.5}, shapes = {{y, 1.5}, {y, 2.5}, {y, 3.5}},
                                 quiet = true, calls = 3})
t.is(rf.recompiles, 1, "a changing float: one recompile, then a graph input")
t.ok(rf.recompiles_static >= 3, "with dynamic=false each value recompiles (" .. rf.recompiles_static .. ")")

-- ---- outputs holding infinities and NaN: compiled and eager agree exactly
-- (log(0) = -inf, log(-1) = NaN, an int64 timestamp), so nothing differs
local function nonfinite(x, i) return x:log(), x * 2, i + 1 end
local rn = fl.checklist(nonfinite, {inputs = {fl.tensor{0, -1, 1, 2, 1 / 0},
                                              fl.tensor({1733000000123456789}, {dtype = "int64"})},
                                    calls = 3, quiet = true})
t.is(rn.accuracy_nan, false, "inf and NaN outputs that agree are no NaN difference")
t.is(rn.max_rel_err, 0.0, "inf and NaN outputs that agree have no error")
t.ok(not rn.recommendation:find("results differ"), "no 'results differ': " .. rn.recommendation)

-- ---- errors
local ok_opts = {inputs = {fl.randn(2, 2)}}
t.raises(function() fl.checklist(42, ok_opts) end, "checklist: expected a function or an nn module", "not a function")
t.raises(function() fl.checklist(stable) end, "checklist: expected an options table", "no options")
t.raises(function() fl.checklist(stable, {}) end, "checklist: inputs are missing", "missing inputs")
t.raises(function() fl.checklist(stable, {inputs = fl.randn(2, 2)}) end, "inputs must be a list", "inputs not a list")
t.raises(function() fl.checklist(stable, {inputs = {fl.randn(2, 2)}, shapes = {"big"}}) end,
  "shapes%[1%] must be a batch size, a shape", "a string in shapes")
t.raises(function() fl.checklist(stable, {inputs = {fl.randn(2, 2)}, shapes = {{4, -1}}}) end,
  "shapes%[1%] = %[4,%-1%]: sizes must be whole numbers >= 0", "a negative size")
t.raises(function() fl.checklist(stable, {inputs = {fl.randn(2, 2)}, shapes = {{2, 2}, {}}}) end,
  "shapes%[2%] must be .* got an empty table", "an empty entry")
t.raises(function() fl.checklist(stable, {inputs = {3}, shapes = {8}}) end,
  "shapes%[1%] is a batch size, but no input is a tensor", "a batch size without a tensor")
t.raises(function() fl.checklist(stable, {inputs = {fl.randn(2, 2)}, shapes = 4}) end,
  "shapes must be a list", "shapes not a list")
t.raises(function() fl.checklist(stable, {inputs = {fl.randn(2, 2)}, calls = 0}) end,
  "calls must be a positive integer", "calls = 0")
t.raises(function() fl.checklist(stable, {inputs = {fl.randn(2, 2)}, input = 1}) end,
  "unknown option 'input'", "a misspelt option")
t.raises(function() fl.checklist(function(a) return a:matmul(a) end, {inputs = {fl.randn(2, 3)}}) end,
  "checklist: the function fails eagerly on inputs %(%[2,3%]%)", "a function that fails eagerly")
t.is(fl.cache_info().dir, dir_before, "the cache directory is unchanged after the errors")

-- a training step: compiled (fl.compile of the loss) against eager; the
-- model and the optimizer end as they began
do
  fl.manual_seed(7)
  local m = fl.nn.Sequential(fl.nn.Linear(16, 32), fl.nn.GELU(), fl.nn.Linear(32, 4))
  local opt = fl.optim.AdamW(m:parameters(), {lr = 1e-2})
  local x, y = fl.randn(8, 16), (fl.rand(8) * 4):to("int64")
  local before = {}
  for i, p in ipairs(m:parameters()) do before[i] = p * 1 end
  local loss = function(a, b) return fl.cross_entropy(m(a), b) end
  local r = fl.checklist(loss, {inputs = {x, y}, train = {optimizer = opt}, quiet = true, calls = 5})
  t.ok(r.grad_max_rel_err < 1e-5 and r.loss_compiled == r.loss_compiled and
       math.abs(r.loss_compiled - r.loss_eager) < 1e-5,
       ("training checklist: compiled gradients agree with eager's (max rel err %.2g)"):format(r.grad_max_rel_err))
  t.ok(r.compiled_training and r.first_step_ms > 0 and r.timing.compiled.median_ms > 0 and
       r.timing.eager.median_ms > 0 and (r.decision == "compile" or r.decision == "eager"),
       ("training checklist: first step %.1f ms, steady %.3f ms compiled, %.3f ms eager -> %s"):format(
       r.first_step_ms, r.compiled_ms, r.eager_ms, r.decision))
  t.ok(r.saved_bytes < r.eager_saved_bytes and r.recomputed > 0 and r.peak_bytes_backward > 0,
       ("training checklist: the forward keeps %d B (eager autograd %d B), %d ops recomputed"):format(
       r.saved_bytes, r.eager_saved_bytes, r.recomputed))
  local same = true
  for i, p in ipairs(m:parameters()) do same = same and (p - before[i]):abs():amax():item() == 0 and p.grad == nil end
  t.ok(same and opt:state_dict().state[1] == nil, "training checklist: the model and the optimizer end as they began")
  t.raises(function() fl.checklist(loss, {inputs = {x, y}, train = true}) end,
           "train must be {optimizer = opt}", "training checklist: train without an optimizer")
  t.raises(function() fl.checklist(function(a) return m(a) end, {inputs = {x}, train = {optimizer = opt}}) end,
           "the function must return a loss", "training checklist: a function that returns no loss")
end

t.done()
