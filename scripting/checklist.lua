-- checklist.lua -- fl.checklist, the go-live checklist (DESIGN §2): should
-- this function be compiled?  Answered by numbers measured here, on this
-- machine, never by belief: operator coverage, the cold first call against
-- the steady state and the calls needed to break even, the cache hit rate
-- over a shape sweep (static against automatic dynamic shapes), accuracy
-- against eager, fallbacks; then a recommendation from the decision table
--
--   stable inference      -> compile (with the measured saving)
--   frequent changes      -> eager   (every change is a new compile)
--   dynamic shapes        -> dynamic mode, or eager (with the measured recompiles)
--
-- The C helpers (_isatty, _mkdtemp, _cache_use_dir) are in lfl_checklist.c.
local fl = ...

local pack, unpack = table.pack, table.unpack
local is_tensor = fl.is_tensor

-- Relative error above which compiled results count as different from
-- eager: float32 kernels that only regroup sums stay far below it.
local REL_TOL = 1e-3
-- Each shape of the sweep is called this many times: a service sees its
-- shapes again, and only a repeat can hit the cache.
local ROUNDS = 2
-- The steady-state timing stops early after this many seconds per side.
local TIME_BUDGET_S = 1.5

local OPTION_NAMES = {"inputs", "shapes", "calls", "quiet", "name", "train"}

-- Raises "checklist: msg" at the line that called fl.checklist: the first
-- stack level outside this file and fl.no_grad (error and getinfo count
-- levels alike).
local function fail(msg)
  local level = 2
  while true do
    local info = debug.getinfo(level, "S")
    if not info or (info.source ~= "=checklist.lua" and info.what ~= "C") then break end
    level = level + 1
  end
  error("checklist: " .. msg, level)
end

local function is_callable(fn)
  local t = type(fn)
  if t == "function" then return true end
  local mt = (t == "table" or t == "userdata") and getmetatable(fn)
  return type(mt) == "table" and mt.__call ~= nil
end

local function shape_str(shape)
  local s = {}
  for i, n in ipairs(shape) do s[i] = tostring(n) end
  return "[" .. table.concat(s, ",") .. "]"
end

local function args_str(args)
  local s = {}
  for i = 1, args.n do
    local a = args[i]
    s[i] = is_tensor(a) and shape_str(a.shape) or tostring(a)
  end
  return "(" .. table.concat(s, ", ") .. ")"
end

-- ---- arguments -----------------------------------------------------------

local function is_shape(v)
  if type(v) ~= "table" or #v == 0 or is_tensor(v) then return false end
  for k, n in pairs(v) do
    if math.type(k) ~= "integer" or type(n) ~= "number" then return false end
  end
  return true
end

local function check_shape(shape, where)
  for _, n in ipairs(shape) do
    if math.tointeger(n) == nil or n < 0 then
      fail(("%s = %s: sizes must be whole numbers >= 0"):format(where, shape_str(shape)))
    end
  end
end

-- A new tensor like t (dtype, device) but of the given shape: random for
-- floating types, zeros otherwise (valid indices for embeddings).
local function tensor_like(t, shape)
  local o = {dtype = t.dtype, device = t.device}
  local s = {}
  for i, n in ipairs(shape) do s[i] = math.tointeger(n) end
  if t.dtype:find("float") then   -- float32, float64, float16, bfloat16
    return fl.randn(s, o)
  end
  return fl.zeros(s, o)
end

-- One entry of opts.shapes as an argument list (packed).  An entry is
--   n                 the first tensor argument, with n as its first size
--                     (a batch size);
--   {n1, n2, ...}     the first tensor argument with this shape;
--   {a1, a2, ...}     a whole argument list: tensors as they are, shapes
--                     ({n1, ...}) made into tensors like that argument of
--                     inputs, other values as they are; missing ones are
--                     taken from inputs.
local function sweep_args(inputs, entry, i)
  local where = ("shapes[%d]"):format(i)
  local first
  for k = 1, inputs.n do
    if is_tensor(inputs[k]) then first = k break end
  end
  local args = pack(unpack(inputs, 1, inputs.n))
  if type(entry) == "number" then
    if not first or #inputs[first].shape == 0 then
      fail(where .. " is a batch size, but no input is a tensor with a first dimension")
    end
    local shape = {unpack(inputs[first].shape)}
    shape[1] = entry
    check_shape(shape, where)
    args[first] = tensor_like(inputs[first], shape)
  elseif is_tensor(entry) then
    if not first then fail(where .. " is a tensor, but no input is a tensor") end
    args[first] = entry
  elseif is_shape(entry) then
    if not first then fail(where .. " is a shape, but no input is a tensor") end
    check_shape(entry, where)
    args[first] = tensor_like(inputs[first], entry)
  elseif type(entry) == "table" and next(entry) ~= nil then
    local n = math.max(#entry, inputs.n)
    for k = 1, n do
      local v = entry[k]
      if v == nil then
        if k > inputs.n then fail(("%s[%d] is missing"):format(where, k)) end
      elseif is_shape(v) then
        if not is_tensor(inputs[k]) then
          fail(("%s[%d] is a shape, but inputs[%d] is not a tensor"):format(where, k, k))
        end
        check_shape(v, ("%s[%d]"):format(where, k))
        args[k] = tensor_like(inputs[k], v)
      elseif type(v) == "table" and not is_tensor(v) then
        fail(("%s[%d] must be a tensor, a shape {n, ...} or a plain value, got a table that is none"):format(where, k))
      else
        args[k] = v
      end
    end
    args.n = n
  else
    fail(("%s must be a batch size, a shape {n, ...}, a tensor or an argument list {x, ...}, got %s"):format(
      where, type(entry) == "table" and "an empty table" or type(entry)))
  end
  return args
end

local function check_opts(fn, opts)
  if not is_callable(fn) then fail("expected a function or an nn module to check, got " .. type(fn)) end
  if type(opts) ~= "table" then
    fail("expected an options table {inputs={...}} as the second argument, got " .. type(opts))
  end
  for k in pairs(opts) do
    local known = false
    for _, n in ipairs(OPTION_NAMES) do if k == n then known = true end end
    if not known then
      fail(("unknown option '%s' (expected %s)"):format(tostring(k), table.concat(OPTION_NAMES, ", ")))
    end
  end
  if opts.inputs == nil then
    fail("inputs are missing: give the arguments of one call, e.g. {inputs = {x}}")
  end
  if type(opts.inputs) ~= "table" or is_tensor(opts.inputs) then
    fail("inputs must be a list of arguments, e.g. {inputs = {x}}, got " .. type(opts.inputs))
  end
  if opts.shapes ~= nil and (type(opts.shapes) ~= "table" or is_tensor(opts.shapes)) then
    fail("shapes must be a list (batch sizes, shapes or argument lists), got " .. type(opts.shapes))
  end
  local calls = opts.calls
  if calls ~= nil and (math.type(calls) ~= "integer" or calls < 1) then
    fail("calls must be a positive integer, got " .. tostring(calls))
  end
  if opts.name ~= nil and type(opts.name) ~= "string" then
    fail("name must be a string, got " .. type(opts.name))
  end
end

-- ---- measuring -----------------------------------------------------------

local function ms_since(t0) return (fl.now() - t0) * 1e3 end

-- The median of up to n calls of f(args) with its spread, as fl.measure
-- gives it (DESIGN §4b: stops early past the time budget, after 5 calls).
local function timed(n, f, args)
  return fl.measure(f, {args = {unpack(args, 1, args.n)}, runs = n, budget_s = TIME_BUDGET_S})
end

-- Compare one compiled output with the eager one: returns max |a - b| and
-- max |b| (so the caller can form a relative error), or nil for outputs
-- that are not numbers.  A tensor where eager gave none (or the other way
-- round) is an infinite error.
local function diff(a, b)
  if is_tensor(a) ~= is_tensor(b) then return math.huge, 0 end
  if is_tensor(a) then
    if shape_str(a.shape) ~= shape_str(b.shape) then return math.huge, 0 end
    if b:numel() == 0 then return 0, 0 end
    if a.dtype == "int64" and b.dtype == "int64" then
      -- exactly: through float32 two timestamps 1 ns apart look equal
      local ac, bc = a:cpu(), b:cpu()
      local n = ac:ne(bc):sum():item()
      return n > 0 and math.max(1, (ac - bc):abs():amax():item()) or 0, bc:abs():amax():item()
    end
    local af, bf = a:cpu():to("float32"), b:cpu():to("float32")
    -- equal values (infinities too) and NaN against NaN do not differ;
    -- NaN against a number is a NaN difference, inf against a finite
    -- number an infinite one.  The scale ignores non-finite values, which
    -- would make every relative error 0.
    local d = fl.where(af:eq(bf), 0, (af - bf):abs())
    d = fl.where(af:ne(af), fl.where(bf:ne(bf), 0, 0 / 0), d)
    local bm = bf:abs()
    bm = fl.where(bm:ne(bm), 0, fl.where(bm:eq(math.huge), 0, bm))
    return d:amax():item(), bm:amax():item()
  elseif type(a) == "number" and type(b) == "number" then
    return math.abs(a - b), math.abs(b)
  end
  return nil
end

-- Accumulates accuracy over every compiled call of the checklist.
local function new_accuracy() return {abs = 0, ref = 0, nan = false, count = 0} end

local function compare(acc, got, want)
  for i = 1, math.max(got.n, want.n) do
    local d, m = diff(got[i], want[i])
    if d then
      acc.count = acc.count + 1
      if d ~= d then acc.nan = true
      else acc.abs = math.max(acc.abs, d) end
      if m == m then acc.ref = math.max(acc.ref, m) end
    end
  end
end

-- A progress bar on stderr, only when stderr is a terminal (a log file
-- or a pipe gets no carriage returns).
local function progress(enabled, total)
  local bar = {done = 0}
  local width = 30
  function bar.step(label)
    bar.done = bar.done + 1
    if not enabled then return end
    local fill = math.floor(width * bar.done / total + 0.5)
    io.stderr:write(("\r  %-14s [%s%s] %d/%d "):format(label, ("#"):rep(fill),
      ("."):rep(width - fill), bar.done, total))
    io.stderr:flush()
  end
  function bar.finish()
    if enabled then io.stderr:write("\r" .. (" "):rep(width + 32) .. "\r") io.stderr:flush() end
  end
  return bar
end

-- fl.explain prints its summary; the checklist prints its own, so the
-- call runs with print silenced (restored also when it fails).
local function explain_quietly(fn, inputs)
  local saved = print
  _G.print = function() end
  local ok, r = pcall(fl.explain, fn, unpack(inputs, 1, inputs.n))
  _G.print = saved
  if not ok then error(r, 0) end
  return r
end

-- Cold and warm first calls.  Cold: a new, empty cache directory, so the C
-- compiler really runs (the user's cache may know this function from an
-- earlier run).  Warm: the same directory with the loaded objects
-- forgotten, as a new process finds it.  The user's directory is back in
-- place before this returns or raises.
-- Where the programs of one first call came from: "3 compiled", "2 from
-- disk, 1 from remote", from the process's cache counters before and after.
-- The cache holds programs (one compiled object per graph, each with all
-- its kernels), so these count programs, not kernels.
local function origins(before, after)
  local parts = {}
  local function add(n, what)
    if n > 0 then parts[#parts + 1] = ("%d program%s %s"):format(n, n == 1 and "" or "s", what) end
  end
  add(after.misses - before.misses, "compiled")
  add(after.disk_hits - before.disk_hits, "from disk")
  add((after.remote and after.remote.hits or 0) - (before.remote and before.remote.hits or 0), "from remote")
  add(after.hits - before.hits, "from memory")
  return #parts > 0 and table.concat(parts, ", ") or "no program loaded"
end

-- fl.cache_origins(before [, after]) -> "3 compiled, 1 from disk": where
-- the kernels loaded between two fl.cache_info() readings came from.
fl.cache_origins = function(before, after) return origins(before, after or fl.cache_info()) end

-- fl.with_empty_cache(fn, ...) -> fn's results, run with a new, empty
-- kernel cache: every kernel is compiled there and then (a cold start, the
-- same on the first rehearsal and in front of the class); the user's
-- cache is untouched and back in place after, also on error.
function fl.with_empty_cache(fn, ...)
  if type(fn) ~= "function" then error("with_empty_cache: expected a function, got " .. type(fn), 2) end
  local dir = fl._mkdtemp()
  local saved = fl._cache_use_dir(dir)
  fl._cache_forget_memory()
  local res = pack(pcall(fn, ...))
  pcall(fl.cache_clear)             -- only the private directory's entries
  fl._cache_forget_memory()
  fl._cache_use_dir(saved)
  os.remove(dir)
  if not res[1] then error(res[2], 0) end
  return unpack(res, 2, res.n)
end

local function first_calls(fn, inputs)
  return fl.with_empty_cache(function()
    local cold = fl.compile(fn)
    local c0 = fl.cache_info()
    local t0 = fl.now()
    cold(unpack(inputs, 1, inputs.n))
    fl.synchronize()
    local cold_ms = ms_since(t0)
    local cold_from = origins(c0, fl.cache_info())
    local cold_fallbacks = cold:stats().fallbacks
    cold_from = ("%d kernel%s: %s"):format(cold:stats().kernels, cold:stats().kernels == 1 and "" or "s", cold_from)
    -- drop every holder of the loaded objects, so the next load maps the
    -- file again as a new process would, rather than finding it mapped
    cold = nil
    collectgarbage()
    collectgarbage()
    fl._cache_forget_memory()
    local warm = fl.compile(fn)
    c0 = fl.cache_info()
    t0 = fl.now()
    warm(unpack(inputs, 1, inputs.n))
    fl.synchronize()
    local warm_ms = ms_since(t0)
    return cold_ms, warm_ms, warm, cold_fallbacks, cold_from, origins(c0, fl.cache_info())
  end)
end

-- Calls a fresh fl.compile(fn, copts) on every argument list of the sweep,
-- ROUNDS times over; a call is a hit when it compiled nothing new.  The
-- first call of all is the cold start (measured apart), so the hit rate
-- counts the calls after it.
local function sweep(fn, copts, list, eager_out, acc, bar, label)
  local cm = fl.compile(fn, copts)
  local hits, calls = 0, 0
  for _ = 1, ROUNDS do
    for i, args in ipairs(list) do
      local before = cm:stats().compiles
      fl.set_rng_state(eager_out[i].rng)   -- the draws eager made: comparable
      local out = pack(cm(unpack(args, 1, args.n)))
      calls = calls + 1
      if calls > 1 and cm:stats().compiles == before then hits = hits + 1 end
      compare(acc, out, eager_out[i])
      bar.step(label)
    end
  end
  local s = cm:stats()
  return {cm = cm, hit_rate = calls > 1 and hits / (calls - 1) or 1, recompiles = s.recompiles,
          compiles = s.compiles, fallbacks = s.fallbacks, reasons = s.recompile_reasons}
end

-- ---- the decision table ------------------------------------------------

local function pct(x) return ("%d%%"):format(math.floor(x * 100 + 0.5)) end

local function plural(n, word) return ("%d %s%s"):format(n, word, n == 1 and "" or "s") end

local function saving_text(eager_ms, steady_ms, break_even)
  return ("saves %s per call (%.3f -> %.3f ms) after %s"):format(
    pct((eager_ms - steady_ms) / eager_ms), eager_ms, steady_ms, plural(break_even, "call"))
end

-- "0.123 ms (IQR 0.12-0.13)": a median and its spread, short (4
-- significant digits: a 8 us call keeps its digits)
local function t_short(t)
  return ("%.4g ms (IQR %.4g-%.4g)"):format(t.median_ms, t.q1_ms, t.q3_ms)
end

-- Returns decision ("compile", "dynamic" or "eager") and the sentence:
-- each reason is the numbers that decided it.
local function recommend(r, nshapes)
  if r.accuracy_nan or r.max_rel_err > REL_TOL then
    return "eager", ("eager: compiled results differ from eager (max rel err %.2g > %.0e); "
      .. "keep eager and report the function"):format(r.max_rel_err, REL_TOL)
  end
  if r.fallbacks > 0 then
    return "eager", ("eager: compilation fell back to eager %s (cm:stats().compile_log says why); "
      .. "keep eager until it compiles"):format(plural(r.fallbacks, "time"))
  end
  if r.recompiles_static > 0 then
    -- the shapes vary: does automatic dynamic mode absorb them, and is
    -- the dynamic build then faster than eager?
    local absorbs = r.recompiles < r.recompiles_static and r.cache_hit_rate >= 0.5
    if not absorbs then
      return "eager", ("eager: the inputs change too often to cache: static mode recompiled %s, "
        .. "dynamic mode %s over %s (hit rate %s); every recompile costs about %.0f ms"):format(
        plural(r.recompiles_static, "time"), plural(r.recompiles, "time"), plural(nshapes, "different input"),
        pct(r.cache_hit_rate), r.cold_ms)
    end
    local v = r.verdict_dynamic
    if v.verdict > 0 and r.break_even_dynamic then
      return "dynamic", ("dynamic shapes: compile with dynamic shapes (dynamic=nil, the default, or true): "
        .. "static mode recompiled %s over %s (hit rate %s), dynamic %s (hit rate %s); "
        .. "dynamic %s vs eager %s, %s"):format(
        plural(r.recompiles_static, "time"), plural(nshapes, "different input"), pct(r.cache_hit_rate_static),
        plural(r.recompiles, "time"), pct(r.cache_hit_rate),
        t_short(r.timing.steady_dynamic), t_short(r.timing.eager),
        saving_text(r.eager_ms, r.steady_dynamic_ms, r.break_even_dynamic))
    end
    return "eager", ("eager: the dynamic build is not faster: dynamic %s vs eager %s: %s "
      .. "(it recompiled %s, hit rate %s)"):format(t_short(r.timing.steady_dynamic), t_short(r.timing.eager),
      v.verdict < 0 and "eager is faster" or "no clear difference here",
      plural(r.recompiles, "time"), pct(r.cache_hit_rate))
  end
  local v = r.verdict
  if v.verdict < 0 or not r.break_even_calls then
    return "eager", ("eager: compiled %s vs eager %s: %s"):format(
      t_short(r.timing.steady), t_short(r.timing.eager),
      v.verdict < 0 and "compiled is slower" or "no clear difference here")
  end
  local text = ("compile: compiled %s vs eager %s, %.2fx: %s (cold start %.0f ms)"):format(
    t_short(r.timing.steady), t_short(r.timing.eager), v.ratio,
    saving_text(r.eager_ms, r.steady_ms, r.break_even_calls), r.cold_ms)
  if r.graph_breaks > 0 then
    text = text .. ("; remove the %s for more"):format(plural(r.graph_breaks, "graph break"))
  end
  return "compile", text
end

fl._checklist_recommend = recommend   -- the decision table alone, for its tests

-- ---- the report ----------------------------------------------------------

local function report(r, name, nshapes, calls)
  local cov = r.coverage
  local out = {}
  local function line(fmt, ...) out[#out + 1] = fmt:format(...) end
  line("go-live checklist: %s", name)
  line("  1. operator coverage   %d/%d ops supported, %s%s", cov.supported, cov.total,
    plural(r.graph_breaks, "graph break"),
    #cov.unsupported > 0 and ("; not supported: " .. table.concat(cov.unsupported, ", ")) or "")
  line("  2. first call (cold)   %.1f ms (one run): capture, generate, compile, run (%s)",
    r.cold_ms, r.cold_from)
  line("     warm start          %.1f ms (one run), as a new process (%s)", r.warm_ms, r.warm_from)
  line("     steady state        compiled %s", r.timing.steady.text)
  line("                         eager    %s", r.timing.eager.text)
  line("                         %s", r.verdict.text)
  if r.break_even_calls then
    line("     break-even          after %s", plural(r.break_even_calls, "call"))
  else
    line("     break-even          never: compiled is not clearly faster")
  end
  if not r.cache_hit_rate_measured then
    -- one input called again always hits: a rate of nothing measured
    line("  3. cache hit rate      not measured: one input only (shapes = {...} sweeps changing inputs)")
  else
    line("  3. cache hit rate      %s x %d rounds: static %s (%s), dynamic %s (%s)",
      plural(nshapes, "input"), ROUNDS, pct(r.cache_hit_rate_static), plural(r.recompiles_static, "recompile"),
      pct(r.cache_hit_rate), plural(r.recompiles, "recompile"))
  end
  if r.recompiles_static > 0 then
    line("     dynamic build       %s", r.timing.steady_dynamic.text)
  end
  line("  4. accuracy vs eager   max abs err %.3g, max rel err %.3g%s", r.max_abs_err, r.max_rel_err,
    r.accuracy_nan and " (NaN differences!)" or "")
  line("     fallbacks           %d", r.fallbacks)
  if r.peak_bytes_before then
    local B = fl._bytes_str
    line("     memory              bytes moved %s -> %s, peak %s -> %s (op by op -> fused)%s",
      B(r.bytes_before), B(r.bytes_after), B(r.peak_bytes_before), B(r.peak_bytes_after),
      (r.bytes_after <= r.bytes_before and r.peak_bytes_after <= r.peak_bytes_before) and ": both down or equal" or "")
  end
  if r.noisy then
    line("  timings are noisy (%s): verdicts need a wider margin; a quiet machine gives firmer numbers",
      r.noise)
  end
  line("  recommendation: %s", r.recommendation)
  print(table.concat(out, "\n"))
end

-- ---- fl.checklist ----------------------------------------------------------

local function default_name(fn)
  if type(fn) == "function" then
    local info = debug.getinfo(fn, "S")
    return ("function at %s:%d"):format(info.short_src, info.linedefined)
  end
  -- a module prints over many lines: its first line names it
  return (tostring(fn):match("^[^\n{]*"):gsub("%s+$", ""))
end

local function checklist(fn, opts)
  check_opts(fn, opts)
  local inputs = pack(unpack(opts.inputs))
  local calls = opts.calls or 20
  local list = {inputs}
  local shapes = opts.shapes or {}
  for k in pairs(shapes) do
    if math.type(k) ~= "integer" or k < 1 or k > #shapes then
      fail("shapes must be a list {entry, entry, ...}, not a table with key " .. tostring(k))
    end
  end
  for i, entry in ipairs(shapes) do list[#list + 1] = sweep_args(inputs, entry, i) end

  -- the eager results of every argument list: the oracle for accuracy
  -- (with the random stream where each began, so a function that draws
  -- is compared with the same draws)
  local eager_out = {}
  for i, args in ipairs(list) do
    local rng = fl.get_rng_state()
    local res = pack(pcall(fn, unpack(args, 1, args.n)))
    if not res[1] then
      fail(("the function fails eagerly on %s %s: %s"):format(
        i == 1 and "inputs" or ("shapes[" .. (i - 1) .. "]"), args_str(args), tostring(res[2])))
    end
    eager_out[i] = pack(unpack(res, 2, res.n))
    eager_out[i].rng = rng
  end
  local rng_after = fl.get_rng_state()

  local r = {}
  -- 1. coverage: ops traced into graphs, and those that broke the graph
  -- because they have no lowering
  local ex = explain_quietly(fn, inputs)
  local unsupported, seen = {}, {}
  for _, name in ipairs(ex.unsupported) do
    if not seen[name] then seen[name] = true; unsupported[#unsupported + 1] = name end
  end
  r.coverage = {supported = ex.op_count, total = ex.op_count + #ex.unsupported, unsupported = unsupported}
  r.graph_breaks = ex.graph_break_count

  -- 2. latency: cold, warm, steady, eager
  local acc = new_accuracy()
  local cold_fallbacks, steady_cm
  r.cold_ms, r.warm_ms, steady_cm, cold_fallbacks, r.cold_from, r.warm_from = first_calls(fn, inputs)
  r.timing = {}
  r.timing.eager = timed(calls, fn, inputs)
  r.timing.steady = timed(calls, steady_cm, inputs)
  r.eager_ms, r.steady_ms = r.timing.eager.median_ms, r.timing.steady.median_ms
  fl.set_rng_state(eager_out[1].rng)
  compare(acc, pack(steady_cm(unpack(inputs, 1, inputs.n))), eager_out[1])

  -- 3. the shape sweep, static then automatic dynamic
  local bar = progress(not opts.quiet and fl._isatty(2), 2 * ROUNDS * #list)
  local ok, st, dy = pcall(function()
    local limit = math.max(8, #list + 1)   -- count every recompile, never give up
    local st = sweep(fn, {dynamic = false, recompile_limit = limit}, list, eager_out, acc, bar, "sweep static")
    local dy = sweep(fn, {}, list, eager_out, acc, bar, "sweep dynamic")
    return st, dy
  end)
  bar.finish()
  fl.set_rng_state(rng_after)
  if not ok then error(st, 0) end
  r.cache_hit_rate, r.cache_hit_rate_static = dy.hit_rate, st.hit_rate
  r.cache_hit_rate_measured = #list > 1
  r.recompiles, r.recompiles_static = dy.recompiles, st.recompiles
  r.recompile_reasons, r.recompile_reasons_static = dy.reasons, st.reasons
  r.timing.steady_dynamic = timed(calls, dy.cm, inputs)
  r.steady_dynamic_ms = r.timing.steady_dynamic.median_ms
  local names = {names = {"compiled", "eager"}}
  r.verdict = fl.compare_times(r.timing.steady, r.timing.eager, names)
  r.verdict_dynamic = fl.compare_times(r.timing.steady_dynamic, r.timing.eager,
    {names = {"dynamic", "eager"}})
  -- the spreads and the noise, for scripts that keep the numbers
  r.spreads = {}
  local noise, seen = {}, {}
  for _, k in ipairs{"steady", "eager", "steady_dynamic"} do
    local t = r.timing[k]
    r.spreads[k] = t.spread
    if t.noisy then
      r.noisy = true
      for part in t.noise:gmatch("[^,]+") do
        part = part:gsub("^%s+", "")
        if part:match("^spread") then part = ({steady = "compiled", eager = "eager", steady_dynamic = "dynamic"})[k] .. " " .. part end
        if not seen[part] then seen[part] = true; noise[#noise + 1] = part end
      end
    end
  end
  r.noisy = r.noisy or false
  r.noise = table.concat(noise, "; ")

  -- 4. accuracy and fallbacks; the static sweep's are kept apart, as the
  -- same compiler failure would otherwise count twice
  r.max_abs_err = acc.nan and 0 / 0 or acc.abs
  r.max_rel_err = acc.nan and 0 / 0 or (acc.ref > 0 and acc.abs / acc.ref or acc.abs)
  r.accuracy_nan = acc.nan
  r.fallbacks = cold_fallbacks + steady_cm:stats().fallbacks + dy.fallbacks
  r.fallbacks_static = st.fallbacks
  -- memory: the compiled function's first plan, in the one cost model
  local plan = steady_cm.plans and steady_cm:plans()[1]
  if plan then
    local ps = plan:stats()
    r.bytes_before, r.bytes_after = ps.bytes_before, ps.bytes_after
    r.peak_bytes_before, r.peak_bytes_after = ps.peak_bytes_before, ps.peak_bytes_after
  end

  -- break-even: the one definition (fl._break_even, the report's too)
  local function break_even(steady, verdict)
    if verdict.verdict <= 0 then return nil end   -- not clearly faster: never
    return fl._break_even(r.cold_ms, r.eager_ms, steady)
  end
  r.break_even_calls = break_even(r.steady_ms, r.verdict)
  r.break_even_dynamic = break_even(r.steady_dynamic_ms, r.verdict_dynamic)
  r.saving = (r.eager_ms - r.steady_ms) / r.eager_ms

  r.decision, r.recommendation = recommend(r, #list)
  if opts.quiet then return r end
  report(r, opts.name or default_name(fn), #list, calls)
  return fl._shown(r)   -- printed: the REPL does not spell the table out too
end

-- ---- the training checklist -----------------------------------------------
-- fl.checklist(loss_fn, {inputs = {x, y}, train = {optimizer = opt}}): a
-- training step (the loss, backward, the optimizer's step) compiled
-- (fl.compile of the loss: a forward and a backward from its joint
-- graph; the optimizer's step its compiled update) against eager.  The model and the optimizer end as they began:
-- the steps it times are undone.

local function grads_of(params)
  local g = {}
  for i, p in ipairs(params) do g[i] = p.grad and p.grad * 1 or false end
  return g
end

local function train_checklist(fn, opts)
  local tr = opts.train
  if type(tr) ~= "table" or type(tr.optimizer) ~= "table" or type(tr.optimizer.step) ~= "function" then
    fail("train must be {optimizer = opt} (an fl.optim optimizer over the parameters the loss uses)")
  end
  local opt, inputs, calls = tr.optimizer, pack(unpack(opts.inputs)), opts.calls or 10
  local params = {}
  for _, group in ipairs(opt.param_groups) do
    for _, p in ipairs(group.params) do params[#params + 1] = p end
  end
  if #params == 0 then fail("the optimizer has no parameters") end
  -- the state to restore: parameters, their gradients, the optimizer's
  local saved_params = fl.no_grad(function()
    local c = {}
    for i, p in ipairs(params) do c[i] = p * 1 end
    return c
  end)
  local saved_grads, saved_opt = grads_of(params), opt:state_dict()
  local rng = fl.get_rng_state()
  local function restore()
    fl.no_grad(function() for i, p in ipairs(params) do p:copy_(saved_params[i]) end end)
    for i, p in ipairs(params) do p.grad = saved_grads[i] or nil end
    opt:load_state_dict(saved_opt)
    fl.set_rng_state(rng)
  end
  local function zero() for _, p in ipairs(params) do p.grad = nil end end
  local r = {}
  local ok, err = pcall(function()
    -- 1. gradients, eager and compiled, from the same weights and draws
    zero()
    fl.set_rng_state(rng)
    local le = fn(unpack(inputs, 1, inputs.n))
    if not (fl.is_tensor(le) and le:numel() == 1 and le.requires_grad) then
      fail("train: the function must return a loss (a float scalar that requires grad)")
    end
    le:backward()
    local ge = grads_of(params)
    zero()
    local cm = fl.compile(fn)
    local cstep = fl.compile(function() opt:step() end)   -- its compiled update
    fl.set_rng_state(rng)
    local t0 = fl.now()
    local lc = cm(unpack(inputs, 1, inputs.n))
    lc:backward()
    cstep()
    r.first_step_ms = (fl.now() - t0) * 1e3
    local gc = grads_of(params)
    local worst, scale = 0, 0
    for i = 1, #ge do
      if ge[i] and gc[i] then
        worst = math.max(worst, (gc[i] - ge[i]):abs():amax():item())
        scale = math.max(scale, ge[i]:abs():amax():item())
      elseif ge[i] or gc[i] then
        worst = math.huge
      end
    end
    r.grad_max_abs_err = worst
    r.grad_max_rel_err = scale > 0 and worst / scale or worst
    r.loss_eager, r.loss_compiled = le:item(), lc:item()
    local s = cm:stats()
    r.compiled_training = s.backward_graphs > 0
    r.training_note = s.training_note or s.training_eager[1]
    r.saved_bytes = s.saved_bytes
    local pair = cm:training()[1]
    r.eager_saved_bytes = pair and pair.partition.eager_saved_bytes or nil
    r.recomputed = s.recomputed
    if pair then
      local ps, bs = pair.fw:stats(), pair.bw:stats()
      r.peak_bytes_forward, r.peak_bytes_backward = ps.peak_bytes_after, bs.peak_bytes_after
    end
    -- 2. steady steps, each side alternately (fl.measure), both restored after
    local function step(f, update)
      return function()
        zero()
        local l = f(unpack(inputs, 1, inputs.n))
        l:backward()
        update()
      end
    end
    restore()
    local eager_step = step(fn, function() opt:step() end)
    eager_step()                           -- warm: the eager kernels and caches
    r.timing = {eager = fl.measure(eager_step, {runs = calls, budget_s = TIME_BUDGET_S})}
    restore()
    r.timing.compiled = fl.measure(step(cm, cstep), {runs = calls, budget_s = TIME_BUDGET_S})
    r.eager_ms, r.compiled_ms = r.timing.eager.median_ms, r.timing.compiled.median_ms
    r.verdict = fl.compare_times(r.timing.compiled, r.timing.eager, {names = {"compiled", "eager"}})
    r.noisy = r.timing.eager.noisy or r.timing.compiled.noisy or false
  end)
  restore()
  if not ok then error(err, 0) end
  if r.grad_max_rel_err > REL_TOL then
    r.decision, r.recommendation = "eager", ("eager: compiled gradients differ from eager's (max rel err "
      .. "%.2g > %.0e); keep eager and report the function"):format(r.grad_max_rel_err, REL_TOL)
  elseif not r.compiled_training then
    r.decision, r.recommendation = "eager", "eager: the step does not compile for training ("
      .. tostring(r.training_note) .. ")"
  elseif r.verdict.verdict > 0 then
    local be = fl._break_even(r.first_step_ms, r.eager_ms, r.compiled_ms)
    r.break_even_steps = be
    r.decision, r.recommendation = "compile", ("compile: a step compiled %s vs eager %s, %.2fx; the "
      .. "first step (capture and compile) %.0f ms%s"):format(t_short(r.timing.compiled),
      t_short(r.timing.eager), r.verdict.ratio, r.first_step_ms,
      be and (", paid back after " .. plural(be, "step")) or "")
  else
    r.decision, r.recommendation = "eager", ("eager: a step compiled %s vs eager %s: %s"):format(
      t_short(r.timing.compiled), t_short(r.timing.eager),
      r.verdict.verdict < 0 and "compiled is slower" or "no clear difference here")
  end
  if opts.quiet then return r end
  local B = fl._bytes_str
  local out = {("training checklist: %s"):format(opts.name or default_name(fn))}
  local function line(fmt, ...) out[#out + 1] = fmt:format(...) end
  line("  1. first step          %.1f ms (one run): capture, joint graph, partition, compile both halves"
    .. " and the optimizer's update, run",
    r.first_step_ms)
  line("  2. steady step         compiled %s", r.timing.compiled.text)
  line("                         eager    %s", r.timing.eager.text)
  line("                         %s", r.verdict.text)
  if r.saved_bytes and r.eager_saved_bytes then
    line("  3. memory              the forward keeps %s for the backward (eager autograd: %s), %s recomputed;"
      .. " peak forward %s, backward %s", B(r.saved_bytes), B(r.eager_saved_bytes), plural(r.recomputed, "op"),
      B(r.peak_bytes_forward), B(r.peak_bytes_backward))
  else
    line("  3. memory              not compiled for training: %s", tostring(r.training_note))
  end
  line("  4. gradients vs eager  max abs err %.3g, max rel err %.3g (loss %.6g vs %.6g)",
    r.grad_max_abs_err, r.grad_max_rel_err, r.loss_compiled, r.loss_eager)
  if r.noisy then line("  timings are noisy: verdicts need a wider margin") end
  line("  recommendation: %s", r.recommendation)
  print(table.concat(out, "\n"))
  return fl._shown(r)
end

-- fl._report_checklist(cm) -> the checklist of what cm compiles, run quietly
-- on new inputs like those of cm's last traced call (fl.report puts it on
-- its page); nil and why when there are none to make.  The random stream
-- is put back: a report draws nothing its caller would see.
-- The checklist answers for inference: eager is timed and compared as
-- PyTorch's inference benchmarks run it, under no_grad (a model's
-- parameters require grad; a tape would slow eager down and keep every
-- activation alive).
function fl.checklist(fn, opts)
  -- a language model with a prompt: the decoding checklist (llm.lua)
  if type(fn) == "table" and fn.spec and fn.generate and type(opts) == "table" and opts.prompt ~= nil then
    return fl.no_grad(fl._checklist_lm, fn, opts)
  end
  if type(opts) == "table" and opts.train ~= nil then
    check_opts(fn, opts)
    return fl.enable_grad(train_checklist, fn, opts)
  end
  return fl.no_grad(checklist, fn, opts)
end

function fl._report_checklist(cm)
  local st = cm.state
  local last = st.last_args
  if not last then return nil, "the compiled function has not been called" end
  local inputs = {n = last.n}
  local rng = fl.get_rng_state()
  for i = 1, last.n do
    local a = last[i]
    if a.opaque then
      fl.set_rng_state(rng)
      return nil, ("argument %d of the last call was a table or a function; pass "
        .. "checklist = fl.checklist(fn, {inputs = {...}}) to fl.report"):format(i)
    elseif a.shape then
      inputs[i] = tensor_like(a, a.shape)
    else
      inputs[i] = a.value
    end
  end
  local ok, r = pcall(fl.checklist, st.fn, {inputs = inputs, quiet = true})
  fl.set_rng_state(rng)
  if not ok then return nil, tostring(r) end
  return r
end
