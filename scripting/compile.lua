-- compile.lua -- the Lua half of capture: fl.compile, fl.capture,
-- fl.explain, fl.mark_dynamic.  The hot path (guard checks, running a
-- cached graph) is C (lfl_compile.c); this file decides what happens on a
-- miss: trace the function into graphs (lfl_trace.c), record why, choose
-- static or symbolic sizes, build the guards, or fall back to eager.
local fl = ...

local pack, unpack = table.pack, table.unpack
local is_tensor = fl.is_tensor

local DEBUG = tonumber(os.getenv("FUSELAB_DEBUG") or "0") or 0

local function debug_line(fmt, ...)
  if DEBUG >= 1 then io.stderr:write(("fuselab: " .. fmt .. "\n"):format(...)) end
end

-- ---- options ----------------------------------------------------------

local OPTION_NAMES = {"backend", "mode", "dynamic", "fullgraph", "fuse", "recompile_limit", "partition"}
local CHOICES = {
  backend = {"auto", "cpu", "cuda", "eager"},
  mode = {"default", "reduce-overhead", "max-autotune"},
  partition = {"mincut", "save_all", "recompute_all"},
}

local function check_choice(name, v)
  for _, c in ipairs(CHOICES[name]) do if v == c then return end end
  error(("compile: %s must be one of %s, got %s"):format(
    name, table.concat(CHOICES[name], ", "), tostring(v)), 4)
end

local function check_opts(opts)
  if opts == nil then return {} end
  if type(opts) ~= "table" then
    error("compile: options must be a table, got " .. type(opts), 3)
  end
  for k in pairs(opts) do
    local known = false
    for _, n in ipairs(OPTION_NAMES) do if k == n then known = true end end
    if not known then
      error(("compile: unknown option '%s' (expected %s)"):format(
        tostring(k), table.concat(OPTION_NAMES, ", ")), 3)
    end
  end
  if opts.backend ~= nil then check_choice("backend", opts.backend) end
  if opts.mode ~= nil then check_choice("mode", opts.mode) end
  if opts.partition ~= nil then check_choice("partition", opts.partition) end
  if opts.dynamic ~= nil and type(opts.dynamic) ~= "boolean" then
    error("compile: dynamic must be true, false or nil, got " .. tostring(opts.dynamic), 3)
  end
  local lim = opts.recompile_limit
  if lim ~= nil and (math.type(lim) ~= "integer" or lim < 1) then
    error("compile: recompile_limit must be a positive integer, got " .. tostring(lim), 3)
  end
  if opts.backend == "cuda" then
    local ok, why = true, nil
    if fl.cuda_available then ok, why = fl.cuda_available() else ok, why = false, "no CUDA device: this build has no CUDA backend" end
    if not ok then error("compile: " .. tostring(why), 3) end
  end
  return opts
end

-- ---- what a function is ------------------------------------------------

-- Parameter names of a Lua function (or of a module's forward, without
-- self), for readable guard reasons: x.shape[2] rather than arg1.shape[2].
local function arg_names(fn)
  local names = {}
  local f, skip = fn, 0
  if type(fn) == "table" then f, skip = fn.forward, 1 end
  if type(f) == "function" then
    local i = 1
    while true do
      local n = debug.getlocal(f, i)
      if not n then break end
      if i > skip then names[#names + 1] = n end
      i = i + 1
    end
  end
  return setmetatable(names, {__index = function(_, i) return "arg" .. i end})
end

-- Scalar upvalues of fn (numbers, booleans, strings): captured values the
-- graph may depend on, so they are guarded.
local function scalar_upvalues(fn)
  local out = {}
  if type(fn) ~= "function" then return out end
  local i = 1
  while true do
    local name, v = debug.getupvalue(fn, i)
    if not name then break end
    local t = type(v)
    if name ~= "_ENV" and (t == "number" or t == "boolean" or t == "string") then
      out[#out + 1] = {kind = "upvalue", key = i, name = name, value = v}
    end
    i = i + 1
  end
  return out
end

-- ---- what the traced code reads ------------------------------------------

-- Values that never change under a model: the standard libraries,
-- fuselab's own tables, whatever require loaded.
local function library_values()
  local lib = {}
  for _, k in ipairs{"fl", "nn", "package", "string", "table", "math", "io", "os", "debug",
                     "coroutine", "utf8"} do
    if _G[k] ~= nil then lib[_G[k]] = true end
  end
  for _, v in pairs(package.loaded) do lib[v] = true end
  if fl.nn then lib[fl.nn] = true end
  return lib
end

-- fuselab's own Lua: what it reads is the modules' fields, guarded
-- through the modules themselves.
local OWN_CHUNKS = {["=nn.lua"] = true, ["=compile.lua"] = true, ["=checklist.lua"] = true,
                    ["=onnx.lua"] = true}

local function own_function(f)
  local ok, info = pcall(debug.getinfo, f, "S")
  return not ok or info.what == "C" or OWN_CHUNKS[info.source]
end

local function is_scalar(v)
  local t = type(v)
  return t == "number" or t == "boolean" or t == "string"
end

-- Keys of table t in a fixed order (strings, then integers) so the name a
-- param gets, and the order guards are listed in, does not depend on hash
-- order.  Keys starting with "_" are
-- fuselab's own bookkeeping (nn's _params, _path) and are not followed.
local function sorted_keys(t)
  -- two lists sorted by the built-in order (no Lua comparator: this runs
  -- over every table a compiled function reaches, on its first call)
  local ks, ints = {}, {}
  for k in next, t do
    if type(k) == "string" then
      if k:byte(1) ~= 95 then ks[#ks + 1] = k end        -- not "_..."
    elseif math.type(k) == "integer" then
      ints[#ints + 1] = k
    end
  end
  table.sort(ks)
  table.sort(ints)
  table.move(ints, 1, #ints, #ks + 1, ks)
  return ks
end

-- A table of more keys is data (a vocabulary), not settings; at most this
-- many values are guarded.
local TABLE_MAX, REACH_MAX = 256, 2048

-- Everything fn can reach that its result may depend on, as guard groups
-- {path = <to a table or function>, name =, items = {{step =, value =,
-- name =}...}}: Lua cannot see which fields the traced code reads (Dynamo
-- reads the bytecode; Lua's debug library has no hook on field reads), so
-- every scalar (and function) reachable is guarded: module fields and
-- fields of tables reachable from fn (keys starting with "_" are
-- fuselab's own), upvalues of every function reachable (helpers, and
-- methods through metatables), each named by its path ("self.dim",
-- "m.blocks.1.eps", "helper[upvalue scale]").  Also returns the Lua
-- functions reached (their global reads are recorded too).  The scalar
-- upvalues of fn itself are guarded by scalar_upvalues.
local function reach(fn)
  local lib, seen, groups, funcs = library_values(), {}, {}, {}
  local queue, head, count, cut = {}, 1, 0, false
  local function push(v, path, name, class) queue[#queue + 1] = {v, path, name, class} end
  if type(fn) == "table" then
    push(fn, {{"self"}}, "self")
  elseif type(fn) == "function" then
    seen[fn] = true
    funcs[#funcs + 1] = fn
    local i = 1
    while true do
      local name, v = debug.getupvalue(fn, i)
      if not name then break end
      if name ~= "_ENV" and not is_scalar(v) then push(v, {{"upvalue", i, name}}, name) end
      i = i + 1
    end
  end
  while head <= #queue and not cut do
    local v, path, name, class = queue[head][1], queue[head][2], queue[head][3], queue[head][4]
    head = head + 1
    local tv = type(v)
    if (tv == "table" or tv == "function") and not seen[v] and not lib[v] and #path <= 10 then
      seen[v] = true
      local items = {}
      local function add(step, x, xname)
        -- (the methods of fuselab's own classes do not change)
        if is_scalar(x) or (type(x) == "function" and not (class and own_function(x))) then
          count = count + 1
          items[#items + 1] = {step = step, value = x, name = xname}
        end
        if type(x) == "table" or type(x) == "function" or fl._compiled_inner(x) then
          local child = {table.unpack(path)}
          child[#child + 1] = step
          push(x, child, xname)
        end
      end
      if tv == "table" then
        local n = 0
        for _ in next, v do n = n + 1 if n > TABLE_MAX then break end end
        if n <= TABLE_MAX then
          for _, k in ipairs(sorted_keys(v)) do add(k, rawget(v, k), name .. "." .. tostring(k)) end
        end
        -- its class (methods through __index) and what calling it runs
        local mt = getmetatable(v)
        if type(mt) == "table" then
          for _, mm in ipairs{"__index", "__call"} do
            local x = rawget(mt, mm)
            if type(x) == "table" or type(x) == "function" then
              local child = {table.unpack(path)}
              child[#child + 1] = {"meta"}
              child[#child + 1] = mm
              push(x, child, name .. (mm == "__index" and "[class]" or "[call]"), true)
            end
          end
        end
      elseif not own_function(v) then
        funcs[#funcs + 1] = v
        local i = 1
        while true do
          local uname, x = debug.getupvalue(v, i)
          if not uname then break end
          if uname ~= "_ENV" then add({"up", i}, x, ("%s[upvalue %s]"):format(name, uname)) end
          i = i + 1
        end
      end
      if #items > 0 then groups[#groups + 1] = {path = path, name = name, items = items} end
      if count > REACH_MAX then cut = true end
    elseif tv == "userdata" and not seen[v] and fl._compiled_inner(v) then
      -- a compiled function or module called inside: inlined, so what it
      -- reads is read by this one
      seen[v] = true
      local child = {table.unpack(path)}
      child[#child + 1] = {"inner"}
      push(fl._compiled_inner(v), child, name)
    end
  end
  return groups, funcs, cut
end

-- The guard groups as the program the C check runs (lfl_compile.c's
-- run_guards; the step codes are its G_* codes): the groups' paths merged
-- into a tree, walked depth first, so each table is reached once per call.
local G = {ROOT_SELF = 1, ROOT_UP = 2, ROOT_GLOBAL = 3, DOWN = 4, DOWN_UP = 5, DOWN_META = 6,
           DOWN_INNER = 7, CHECK = 8, CHECK_UP = 9, POP = 10}

local function step_key(step)
  if type(step) == "table" then return step[1] .. ":" .. tostring(step[2] or "") end
  return type(step) .. ":" .. tostring(step)
end

local function guard_program(groups)
  local tree = {kids = {}, order = {}}
  for _, grp in ipairs(groups) do
    local node = tree
    for _, step in ipairs(grp.path) do
      local k = step_key(step)
      if not node.kids[k] then
        node.kids[k] = {kids = {}, order = {}, step = step}
        node.order[#node.order + 1] = node.kids[k]
      end
      node = node.kids[k]
    end
    node.items = grp.items
  end
  local prog, names = {}, {}
  local function put(v) prog[#prog + 1] = v end
  local function walk(node, depth)
    for _, it in ipairs(node.items or {}) do
      if type(it.step) == "table" then put(G.CHECK_UP); put(it.step[2])
      else put(G.CHECK); put(it.step) end
      put(it.value)
      names[#names + 1] = it.name
    end
    for _, kid in ipairs(node.order) do
      local st = kid.step
      if depth == 0 then
        if st[1] == "self" then put(G.ROOT_SELF)
        elseif st[1] == "upvalue" then put(G.ROOT_UP); put(st[2])
        else put(G.ROOT_GLOBAL) end
      elseif type(st) ~= "table" then put(G.DOWN); put(st)
      elseif st[1] == "up" then put(G.DOWN_UP); put(st[2])
      elseif st[1] == "meta" then put(G.DOWN_META)
      else put(G.DOWN_INNER) end
      walk(kid, depth + 1)
      put(G.POP)
    end
  end
  walk(tree, 0)
  return {prog = prog, names = names}
end

-- The value at the end of path (as the C guard walks it), or nil.
local function resolve(fn, path)
  local root, v = path[1]
  if root[1] == "upvalue" then v = select(2, debug.getupvalue(fn, root[2]))
  elseif root[1] == "self" then v = fn
  else v = _G end
  for i = 2, #path do
    local step = path[i]
    if v == nil then return nil end
    if type(step) == "table" then
      if step[1] == "up" and type(v) == "function" then v = select(2, debug.getupvalue(v, step[2]))
      elseif step[1] == "meta" then v = getmetatable(v)
      elseif step[1] == "inner" then v = fl._compiled_inner(v)
      else v = nil end
    elseif type(v) == "table" then v = rawget(v, step)
    else v = nil end
  end
  return v
end

local function item_value(container, step)
  if type(step) == "table" then
    if type(container) ~= "function" then return nil end
    return (select(2, debug.getupvalue(container, step[2])))
  end
  if type(container) ~= "table" then return nil end
  return rawget(container, step)
end

-- The first guarded value the call itself changed, by name, or nil.
local function changed_inside(fn, groups)
  for _, g in ipairs(groups) do
    local c = resolve(fn, g.path)
    for _, it in ipairs(g.items) do
      local now = item_value(c, it.step)
      if not rawequal(now, it.value) then return it.name end
    end
  end
end

-- Run body() while the global reads of fn and of the functions in funcs
-- (and of any Lua function read from a global meanwhile: a helper of
-- another chunk) are recorded into reads (name -> value, scalars only).
-- Each _ENV is swapped for a recording proxy and restored afterwards,
-- also on error.  The proxy answers rawget, next, pairs and _G as the
-- real table would (functions read through it see the real globals).
local function with_global_spy(fn, funcs, reads, body)
  local spies, is_spy, swapped = {}, {}, {}
  local spy_function
  local function spy_of(env)
    if spies[env] then return spies[env] end
    local spy = {}
    local function real(t) if rawequal(t, spy) then return env end return t end
    -- a scalar global the code saw (iterating _ENV sees every one)
    local function record(k, v)
      if k ~= nil and is_scalar(v) and reads[k] == nil and env == _G then reads[k] = v end
    end
    local wrap = {
      [rawget] = function(t, k, ...)
        local v = rawget(real(t), k, ...)
        if rawequal(t, spy) then record(k, v) end
        return v
      end,
      [next] = function(t, ...)
        local k, v = next(real(t), ...)
        if rawequal(t, spy) then record(k, v) end
        return k, v
      end,
      [rawlen] = function(t, ...) return rawlen(real(t), ...) end,
      [rawequal] = function(a, b) return rawequal(real(a), real(b)) end,
      [rawset] = function(t, ...) return rawset(real(t), ...) end,
    }
    setmetatable(spy, {
      __index = function(_, k)
        local v = env[k]
        if is_scalar(v) then
          record(k, v)
        elseif rawequal(v, env) then
          return spy                      -- _G.x reads are reads too
        elseif wrap[v] then
          return wrap[v]
        elseif type(v) == "function" then
          spy_function(v)                 -- a helper about to be called
        end
        return v
      end,
      __newindex = env,
      __pairs = function()
        return function(_, k)
          local nk, v = next(env, k)
          record(nk, v)
          return nk, v
        end, spy, nil
      end,
      __len = function() return rawlen(env) end,
    })
    spies[env], is_spy[spy] = spy, true
    return spy
  end
  spy_function = function(f)
    if type(f) ~= "function" or own_function(f) then return end
    local i = 1
    while true do
      local name, v = debug.getupvalue(f, i)
      if not name then break end
      if name == "_ENV" then
        if type(v) == "table" and not is_spy[v] then   -- (upvalues may be shared)
          swapped[#swapped + 1] = {f, i, v}
          debug.setupvalue(f, i, spy_of(v))
        end
        break
      end
      i = i + 1
    end
  end
  spy_function(fn)
  for _, f in ipairs(funcs) do spy_function(f) end
  local res = pack(pcall(body))
  for k = #swapped, 1, -1 do debug.setupvalue(swapped[k][1], swapped[k][2], swapped[k][3]) end
  if not res[1] then error(res[2], 0) end
  return unpack(res, 2, res.n)
end

-- ---- where parameters came from -------------------------------------------

local SKIP_GLOBALS = {fl = true, nn = true, package = true, _G = true, string = true,
  table = true, math = true, io = true, os = true, debug = true, coroutine = true,
  utf8 = true, arg = true}

-- Find, for each param {key=}, a path from the function to it: through the
-- module (self), an upvalue, or a global, then table fields; breadth first,
-- so the shortest path names it ("0.weight", not "modules.1.weight").
-- The path is both its name and its guard (still the same tensor there).
local function walk_reach(fn, visit)
  local queue, head, seen = {}, 1, {}
  local function push(v, path) queue[#queue + 1] = {v, path} end
  if type(fn) == "table" then push(fn, {{"self"}}) end
  if type(fn) == "function" then
    local i = 1
    while true do
      local name, v = debug.getupvalue(fn, i)
      if not name then break end
      if name ~= "_ENV" then push(v, {{"upvalue", i, name}}) end
      i = i + 1
    end
  end
  for _, k in ipairs(sorted_keys(_G)) do
    if type(k) == "string" and not SKIP_GLOBALS[k] then push(_G[k], {{"global"}, k}) end
  end
  while head <= #queue do
    local v, path = queue[head][1], queue[head][2]
    head = head + 1
    local tv = type(v)
    if tv == "userdata" then
      if visit(v, path) then return end
    elseif tv == "table" and not seen[v] and #path <= 7 then
      seen[v] = true
      for _, k in ipairs(sorted_keys(v)) do
        local child = {table.unpack(path)}
        child[#child + 1] = k
        push(rawget(v, k), child)
      end
    end
    if tv == "userdata" and not seen[v] and fl._compiled_inner(v) then
      seen[v] = true            -- a compiled callee's weights are ours
      local child = {table.unpack(path)}
      child[#child + 1] = {"inner"}
      push(fl._compiled_inner(v), child)
    end
  end
end

local function find_params(fn, params)
  local want, left = {}, 0
  for _, p in ipairs(params) do want[p.key] = p; left = left + 1 end
  if left == 0 then return end
  walk_reach(fn, function(v, path)
    local k = fl._tensor_key(v)
    local p = k and want[k]
    if p and not p.path then
      p.path = path
      left = left - 1
    end
    return left == 0
  end)
end

-- The tensors fn reaches that require grad (its weights, before a trace
-- has found them).
local function grad_tensors(fn)
  local found = {}
  walk_reach(fn, function(v)
    if is_tensor(v) and v.requires_grad then found[#found + 1] = v end
  end)
  return found
end

local function path_name(path)
  local parts = {}
  local root = path[1]
  if root[1] == "upvalue" then parts[1] = root[3] end
  for i = 2, #path do
    if type(path[i]) ~= "table" then parts[#parts + 1] = tostring(path[i]) end
  end
  return table.concat(parts, ".")
end

-- ---- tracing one call ---------------------------------------------------

-- An error inside the traced function: its message and the frames down to
-- the function's call; what called it (xpcall and the tracing here) is
-- fuselab's, and the REPL adds the user's own caller frames.
local function body_traceback(m)
  if type(m) ~= "string" then return m end
  return (debug.traceback(m, 2):gsub("\n\t%[C%]: in function 'xpcall'.*$", ""))
end

-- Trace fn(...) into graphs.  Returns the results (computed) and what the
-- trace saw: {graphs, breaks, nodes of results, params, reads, fast=bool
-- and why not}.  dyn[i] lists argument i's symbolic dims.
local function trace_body(tr, fn, names, dyn, args)
  local targs = {}
  for i = 1, args.n do
    if is_tensor(args[i]) then
      targs[i] = tr:input(args[i], names[i], dyn[i])
    elseif dyn[i] == true then          -- a number that is a graph input
      targs[i] = tr:input_number(args[i], names[i])
    else
      targs[i] = args[i]
    end
  end
  local ups_before = scalar_upvalues(fn)
  local groups, funcs, cut = reach(fn)
  local reads = {}
  local res = with_global_spy(fn, funcs, reads, function()
    return pack(xpcall(fn, body_traceback, unpack(targs, 1, args.n)))
  end)
  if not res[1] then error(res[2], 0) end
  targs = nil                     -- only what the function kept stays live
  local why_not
  local params = tr:params()
  local info = tr:finish()
  -- what each result is, now that the last segment gave the values: an
  -- output of the last graph, a view of an argument or weight (it shares
  -- that storage, as eager's does), or a value from elsewhere
  local rets = {}
  for i = 2, res.n do
    local v = res[i]
    if is_tensor(v) then
      local node, view = tr:result_of(v)
      if node then rets[i - 1] = {kind = "node", node = node, view = view}
      else rets[i - 1] = {kind = "value", value = v} end
    elseif type(v) == "table" or type(v) == "function" or type(v) == "userdata" then
      why_not = why_not or ("result " .. (i - 1) .. " is a " .. type(v) .. "; the body re-runs in Lua each call")
      rets[i - 1] = {kind = "value", value = v}
    else
      rets[i - 1] = {kind = "value", value = v}
    end
  end
  for i, u in ipairs(scalar_upvalues(fn)) do
    local b = ups_before[i]
    if b and b.value ~= u.value then
      why_not = why_not or ("upvalue '" .. u.name .. "' is assigned inside the function; the body re-runs in Lua each call")
    end
  end
  local inside = changed_inside(fn, groups)
  if inside then
    why_not = why_not or (inside .. " is assigned inside the function; the body re-runs in Lua each call")
  end
  if #info.breaks > 0 then why_not = why_not or "graph breaks: the Lua between the graphs runs each call" end
  info.rets, info.params, info.reads, info.ups = rets, params, reads, ups_before
  info.fields, info.fields_cut = groups, cut
  info.results = res
  info.why_not_fast = why_not
  return info
end

-- Every way out of a trace ends it: an error in the function, in running
-- its last segment, an interrupt or running out of memory anywhere between
-- begin and finish.  A trace left recording would refuse every later one.
local function trace_call(fn, opts, names, dyn, exec, capture, plan, ...)
  local args = pack(...)
  local kinds
  if plan then
    local k = {}
    for i = 1, args.n do k[i] = is_tensor(args[i]) and "t" or "v" end
    kinds = table.concat(k)
  end
  local tr = fl._trace_begin{capture = capture, fullgraph = opts.fullgraph, exec = exec,
                             plan = plan, kinds = kinds}
  local ok, info = pcall(trace_body, tr, fn, names, dyn, args)
  if not ok then
    tr:abort()
    error(info, 0)
  end
  return info
end

-- Name each param node of graph g after the path it was found at.
local function name_params(fn, g, params)
  find_params(fn, params)
  for _, p in ipairs(params) do
    p.name = p.path and path_name(p.path) or ("tensor%" .. p.node)
    g:_set_name(p.node, p.name)
  end
end

-- ---- fl.compile -----------------------------------------------------------

local function new_stats()
  return {calls = 0, compiles = 0, recompiles = 0, cache_hits = 0, disk_cache_hits = 0,
          remote_cache_hits = 0,
          graph_breaks = 0, fallbacks = 0, compile_ms = 0, first_call_ms = nil,
          kernels = 0, guards = {}, recompile_reasons = {}, break_reasons = {},
          specializations = {}, autotune = {}, dynamic_numbers = {},
          backward_graphs = 0, backward_kernels = 0, saved_bytes = 0, recomputed = 0,
          training_calls = 0, training_eager = {}}
end

local function eager_runner(g)
  return function(inputs) return {g:run(unpack(inputs))} end
end

local function program_runner(prog)
  return function(inputs) return {prog:run(unpack(inputs))} end
end

-- A graph the CUDA backend cannot lower (its codegen or its first run says
-- "no CUDA lowering") runs on the eager kernels instead, where its tensors
-- are (g:run: one kernel per op on the device, the host for an op no CUDA
-- kernel has): warned once per function, counted in stats.fallbacks.
local function cuda_fallback(st, g, why)
  st.stats.fallbacks = st.stats.fallbacks + 1
  st.compile_logs[#st.compile_logs + 1] = tostring(why)
  if not st.warned_lowering then
    st.warned_lowering = true
    io.stderr:write(("fuselab: warning: %s; this graph runs on the eager kernels\n"):format(
      (tostring(why):gsub("\n.*", ""):gsub("^[%w_./-]+:%d+: ", ""))))
  end
  return eager_runner(g)
end

local function lowering_failed(why) return tostring(why):find("CUDA lowering", 1, true) ~= nil end

-- The median of 5 runs of prog on inputs (fl.measure's summary).
-- Timing runs draw no numbers the caller sees: the random stream is put
-- back, so the first compiled call draws what eager would.
local function time_program(prog, inputs)
  local rng = fl.get_rng_state()
  local t = fl.measure(function() prog:run(unpack(inputs)) end, {runs = 5, warmup = 0})
  fl.set_rng_state(rng)
  return t
end

-- The one compile pipeline (exec/pipeline.c): g decomposed and optimized
-- -- the step-by-step route g:decompose():optimize(), so both give the same
-- plan, kernel names and traffic -- fused, generated for the backend and
-- compiled through the cache.  fl._pipeline returns every stage; a
-- compiler's failure is b.ok false with its log, anything earlier raises.
local function pipeline(g, backend, fuse)
  local b = fl._pipeline(g, {backend = backend, fuse = fuse})
  if DEBUG >= 3 then io.stderr:write("fuselab: optimize: ", b.log) end
  return b
end

-- ---- FUSELAB_COMPILE_DEBUG=DIR (DESIGN §4, like TORCH_COMPILE_DEBUG) ------
-- Per compiled graph a folder DIR/run_<time>_pid<pid>/graph_<n>_<key>
-- with the graph as captured, the IR after each pass, the plan and its
-- decisions, the host program and the kernels, the timings of each stage
-- and the review report.  The folder is checked as the compile cache's is
-- (fl._debug_dir); one that fails is a warning, once, and no files.
local debug_run, debug_refused, debug_count = nil, false, 0

local function debug_folder(key)
  local dir = os.getenv("FUSELAB_COMPILE_DEBUG")
  if not dir or dir == "" or debug_refused then return nil end
  if not debug_run then
    local run, why = fl._debug_dir(dir)
    if not run then
      debug_refused = true
      io.stderr:write(("fuselab: warning: FUSELAB_COMPILE_DEBUG: %s; no debug files are written\n"):format(why))
      return nil
    end
    debug_run = run
  end
  debug_count = debug_count + 1
  local sub, why = fl._debug_subdir(debug_run, ("graph_%d_%s"):format(debug_count, key:sub(1, 8)))
  if not sub then io.stderr:write("fuselab: warning: FUSELAB_COMPILE_DEBUG: ", why, "\n") end
  return sub
end

local function debug_write(dir, name, text)
  local f = io.open(dir .. "/" .. name, "w")
  if not f then return end
  f:write(text)
  if text:sub(-1) ~= "\n" then f:write("\n") end
  f:close()
end

local function debug_dump(st, key, stages, plan, prog, times)
  local dir = debug_folder(key)
  if not dir then return end
  debug_write(dir, "01_captured.txt", tostring(stages.captured))
  debug_write(dir, "02_decomposed.txt", tostring(stages.decomposed))
  debug_write(dir, "03_optimized.txt", tostring(stages.optimized) .. "\n\n-- what optimize did --\n"
    .. tostring(stages.log or ""))
  local dec = {tostring(plan), "", "-- decisions, in graph order --"}
  for _, d in ipairs(plan:decisions()) do
    dec[#dec + 1] = ("%s %%%d -> %%%d: %s (saves %d bytes)"):format(d.fused and "fused  " or "refused",
      d.a, d.b, d.reason, d.bytes_saved or 0)
  end
  debug_write(dir, "04_plan.txt", table.concat(dec, "\n"))
  if prog then
    local code = prog.code and prog:code() or ""
    debug_write(dir, "05_host_program.txt", (code:match("^(.-\n)\n") or code))
    debug_write(dir, "06_kernels." .. (st.backend == "cuda" and "cu" or "c"), prog:source())
  end
  local lines = {("backend %s; kernels %s"):format(st.backend or "cpu",
    prog and prog:stats().how or "none (runs on the eager kernels)")}
  for _, t in ipairs(times) do lines[#lines + 1] = ("%-22s %10.2f ms (one run)"):format(t[1], t[2]) end
  debug_write(dir, "07_timings.txt", table.concat(lines, "\n"))
  if fl.report then
    local target = prog or plan
    local ok, err = pcall(fl.report, target, dir .. "/08_report.html", {title = "Graph " .. debug_count .. " " .. key:sub(1, 8)})
    if not ok then debug_write(dir, "08_report.txt", "the report could not be written: " .. tostring(err)) end
  end
  debug_line("compile debug: %s", dir)
end

-- Whether graph g compiles for the device: "auto" is the GPU when one is
-- usable and the graph's tensors are there (results stay on their inputs'
-- device, as torch.compile's do); "cuda" was checked at fl.compile.
local function on_device(st, g)
  local backend = st.opts.backend or "auto"
  return backend == "cuda" or (backend == "auto" and fl.cuda_available ~= nil
                               and fl.cuda_available() == true and g:_on_cuda())
end

-- The backend's compile step for one graph: decompose and optimize, fuse,
-- generate C, compile through the cache.  Returns a runner
-- function(inputs) -> outputs, the program (nil when the graph runs on the
-- eager kernels: the compiler failed, which is a warning, counted, with
-- its log kept) and the graph compiled (the plan's graph).
local function build_runner_now(st, captured, inputs)
  if DEBUG >= 5 then io.stderr:write("fuselab: graph to compile:\n", tostring(captured), "\n") end
  local use_cuda = on_device(st, captured)
  st.backend = use_cuda and "cuda" or "cpu"
  local okb, b = pcall(pipeline, captured, st.backend, st.opts.fuse ~= false)
  if not okb then
    -- the generator cannot lower an op for the device: the eager kernels
    if use_cuda and lowering_failed(b) then return cuda_fallback(st, captured, b), nil, captured end
    error(b, 0)
  end
  local g, plan, prog, times = b.optimized, b.plan, b.program, b.times
  local dump = os.getenv("FUSELAB_COMPILE_DEBUG") and function(p)
    debug_dump(st, fl._graph_key(captured), {captured = captured, decomposed = b.decomposed, optimized = g,
      log = b.log}, plan, p, times)
  end or function() end
  if DEBUG >= 3 then
    io.stderr:write("fuselab: ", tostring(plan), "\n")
    for _, d in ipairs(plan:decisions()) do
      -- the reason says "fused ..." or "cannot fuse ..." itself
      io.stderr:write(("fuselab:   %s\n"):format(d.reason))
    end
  end
  if use_cuda and st.opts.mode == "reduce-overhead" then prog:set_mode("reduce-overhead") end
  if not b.ok then
    dump(nil)
    st.stats.fallbacks = st.stats.fallbacks + 1
    st.compile_logs[#st.compile_logs + 1] = b.compile_log
    if not st.warned_compile then
      st.warned_compile = true
      if b.cause then   -- not the compiler's failure: no descriptor left, a full disk, Ctrl-C
        io.stderr:write("fuselab: warning: " .. b.cause .. "; this graph runs on the eager kernels\n")
      else
        io.stderr:write("fuselab: warning: compiling the generated C failed; this graph runs "
          .. "on the eager kernels (cm:stats().compile_log has the compiler's output)\n")
      end
    end
    return eager_runner(g), nil, g
  end
  local how = prog:stats().how
  -- the first call is warm when no compiler ran for it: its kernels were
  -- in memory, on disk or on the remote cache already
  if st.first_how == nil then st.first_how = how end
  if how == "disk" then st.stats.disk_cache_hits = st.stats.disk_cache_hits + 1
  elseif how == "remote" then st.stats.remote_cache_hits = st.stats.remote_cache_hits + 1 end
  if use_cuda and st.opts.mode == "max-autotune" then
    local rng = fl.get_rng_state()
    st.stats.autotune[#st.stats.autotune + 1] = prog:autotune(unpack(inputs))
    fl.set_rng_state(rng)
  elseif st.opts.mode == "max-autotune" and st.opts.fuse ~= false then
    -- time the fused program against the unfused one on these inputs
    local ub = fl._pipeline(g, {passes = false, fuse = false})
    local alt = ub.program
    if ub.ok then
      local tf, tu = time_program(prog, inputs), time_program(alt, inputs)
      -- unfused only when it is clearly faster: fusion moves fewer bytes,
      -- and a difference inside the noise is no reason to give that up
      local v = fl.compare_times(tu, tf, {names = {"unfused", "fused"}})
      st.stats.autotune[#st.stats.autotune + 1] = ("%s: fused %.3f ms, unfused %.3f ms (medians of 5) -> %s"):format(
        fl._graph_key(g):sub(1, 8), tf.median_ms, tu.median_ms, v.verdict > 0 and "unfused" or "fused")
      if v.verdict > 0 then prog, plan = alt, alt:plan() end
    end
  end
  st.programs[#st.programs + 1] = prog
  st.plans[#st.plans + 1] = plan
  dump(prog)
  -- every kernel of a CPU program is timed (two clock reads each), so the
  -- review report has each kernel's mean time from the calls already made
  if not use_cuda and prog.profile then prog:profile(true) end
  if DEBUG >= 4 then io.stderr:write("fuselab: generated source:\n", prog:source(), "\n") end
  if DEBUG >= 2 then
    -- time every run of this graph, and of each of its kernels, with the
    -- bandwidth they reached
    local bytes, n = plan:stats().bytes_after, #st.plans
    if prog.profile then prog:profile(true) end
    local earlier = {}   -- the latest runs' ms: this run's time beside their median
    return function(ins)
      local t0 = fl.now()
      local outs = {prog:run(unpack(ins))}
      local dt = fl.now() - t0
      local med = #earlier >= 3 and ("; earlier runs: median " .. tostring(fl.measure(earlier))) or ""
      io.stderr:write(("fuselab: graph %d: %d kernel(s), %.3f ms (this run), %.2f GB/s%s\n"):format(
        n, plan:stats().kernels, dt * 1e3, bytes / dt / 1e9, med))
      if #earlier >= 256 then table.remove(earlier, 1) end
      earlier[#earlier + 1] = dt * 1e3
      fl._print_kernel_times(prog)
      return outs
    end, prog, g
  end
  return program_runner(prog), prog, g
end

-- Compiled never fails where eager works: a graph that a pass, fusion or
-- a code generator cannot take (a softmax over a dim of size 0, whatever
-- else the differential fuzzer finds) runs on the eager kernels, with one
-- warning per function and the reason in cm:stats().compile_log.  An
-- interrupt or running out of memory is not such a limit: it goes on up.
local function build_runner(st, captured, inputs)
  local res = pack(pcall(build_runner_now, st, captured, inputs))
  if res[1] then return unpack(res, 2, res.n) end
  local why = tostring(res[2])
  if why:find("interrupted", 1, true) or why:find("not enough memory", 1, true) then error(res[2], 0) end
  st.stats.fallbacks = st.stats.fallbacks + 1
  st.compile_logs[#st.compile_logs + 1] = why
  if not st.warned_fallback then
    st.warned_fallback = true
    io.stderr:write(("fuselab: warning: this graph cannot be compiled (%s); it runs on the eager kernels\n"):format(
      (why:gsub("\n.*", ""):gsub("^[%w_./-]+:%d+: ", ""))))
  end
  return eager_runner(captured), nil, captured
end

-- The executor the trace calls for each segment: the segment cache.
-- Returns the outputs, and for the segment's record (lfl_resume.c) the
-- program a replay runs directly (a CPU program) or the runner it calls
-- (nil, nil: the eager kernels).
local train_segment   -- compiled training of one segment (below)

local function make_exec(st)
  return function(g, inputs, params)
    -- a segment without ops (values passed through a break) has nothing
    -- to compile
    if #g:ops() == 0 then return {g:run(unpack(inputs))}, nil, nil end
    if st.train_segments then return train_segment(st, g, inputs, params) end
    local key = fl._graph_key(g)
    local hit = st.segcache[key]
    if hit then
      st.seg_hits = st.seg_hits + 1
      debug_line("cache hit: graph %s (%d ops)", key:sub(1, 8), #g:ops())
    else
      local t0 = fl.now()
      name_params(st.fn, g, params)
      local runner, prog, compiled = build_runner(st, g, inputs)
      hit = {run = runner, program = prog, cuda = st.backend == "cuda"}
      st.segcache[key] = hit
      st.stats.compiles = st.stats.compiles + 1
      st.stats.compile_ms = st.stats.compile_ms + (fl.now() - t0) * 1e3
      st.graphs[#st.graphs + 1] = compiled
      st.new_compiles = st.new_compiles + 1
      debug_line("compile: graph %s (%d ops)", key:sub(1, 8), #g:ops())
    end
    if hit.program and hit.cuda and not hit.ran then
      -- the first run shows what the device cannot lower
      local ok, outs = pcall(hit.run, inputs)
      if not ok and not lowering_failed(outs) then error(outs, 0) end
      if not ok then hit.run, hit.program = cuda_fallback(st, g, outs), nil end
      hit.ran = true
      if ok then
        st.last_program = hit.program
        return outs, DEBUG < 2 and hit.program or nil, hit.run
      end
    end
    st.last_program = hit.program
    local direct = DEBUG < 2 and hit.program or nil
    return hit.run(inputs), direct, hit.run
  end
end

local function shape_str(t)
  local s = {}
  for d, n in ipairs(t.shape) do s[d] = tostring(n) end
  return "[" .. table.concat(s, ",") .. "]"
end

-- Guards of a new entry, as data for C and as text for cm:stats().
local function build_entry(st, info, args, dyn, train)
  local g = info.graphs[1]
  local spec = {args = {}, values = {}, params = {}, rets = {}, consts = {}}
  local text = {}
  local static = {}
  for _, sd in ipairs(info.static_dims) do
    static[sd[1]] = static[sd[1]] or {}
    static[sd[1]][sd[2]] = true
  end
  for i = 1, args.n do
    local a = args[i]
    local name = st.names[i]
    if is_tensor(a) then
      local d = {}
      for _, dim in ipairs(dyn[i] or {}) do
        if not (static[i] and static[i][dim]) and a.shape[dim] >= 2 then d[#d + 1] = dim end
      end
      spec.args[i] = {tensor = true, dtype = a.dtype, device = a.device == "cuda" and 1 or 0,
                      shape = a.shape, dyn = d, name = name}
      local dims = {}
      local dset = {}
      for _, k in ipairs(d) do dset[k] = true end
      for k, n in ipairs(a.shape) do dims[k] = dset[k] and ("s(>=2)") or tostring(n) end
      text[#text + 1] = ("%s: %s[%s] on %s"):format(name, a.dtype, table.concat(dims, ","), a.device)
    elseif dyn[i] == true then
      -- a graph input: any value of its kind runs this graph
      local int = math.type(a) == "integer"
      spec.args[i] = {tensor = false, number = int and 2 or 1, name = name}
      text[#text + 1] = ("%s: any %s (a graph input)"):format(name, int and "integer" or "float")
    else
      spec.args[i] = {tensor = false, name = name}
      spec.values[#spec.values + 1] = {kind = "arg", key = i, name = name, value = a}
      text[#text + 1] = ("%s == %s"):format(name, tostring(a))
    end
  end
  for name, v in pairs(info.reads) do
    spec.values[#spec.values + 1] = {kind = "global", key = name, name = name, value = v}
    text[#text + 1] = ("global '%s' == %s"):format(name, tostring(v))
  end
  for _, u in ipairs(info.ups) do
    spec.values[#spec.values + 1] = u
    text[#text + 1] = ("upvalue '%s' == %s"):format(u.name, tostring(u.value))
  end
  spec.guards = guard_program(info.fields)
  for _, grp in ipairs(info.fields) do
    for _, it in ipairs(grp.items) do
      local v = it.value
      text[#text + 1] = type(v) == "function" and ("%s is the same function"):format(it.name)
        or ("%s == %s"):format(it.name, type(v) == "string" and ("%q"):format(v) or tostring(v))
    end
  end
  if info.fields_cut then
    text[#text + 1] = ("(more than %d values reachable: the rest are not guarded)"):format(REACH_MAX)
  end
  spec.sym_guards = info.sym_guards
  for _, sg in ipairs(info.sym_guards or {}) do text[#text + 1] = "size guard: " .. sg.text end
  for _, p in ipairs(info.params) do
    if p.path then
      spec.params[#spec.params + 1] = {path = p.path, key = p.key, name = p.name}
      text[#text + 1] = ("%s is the same tensor"):format(p.name)
    end
  end
  -- results: graph outputs by node id
  local outpos = {}
  for k, id in ipairs(g:outputs()) do outpos[id] = k end
  for i, r in ipairs(info.rets) do
    if r.kind == "node" and r.view then
      -- a view of an argument (eager returns it sharing the storage): the
      -- entry rebuilds it from the argument; of a weight: Lua does
      if not outpos[r.node] then
        return nil, ("result %d is a view of a weight (it shares its storage, as in eager); "
          .. "the body re-runs in Lua each call"):format(i)
      end
      spec.rets[i] = {kind = "alias", k = outpos[r.node], node = r.node}
    elseif r.kind == "node" then
      spec.rets[i] = {kind = "out", k = outpos[r.node]}
    else
      spec.consts[#spec.consts + 1] = r.value
      spec.rets[i] = {kind = "const", k = #spec.consts}
    end
  end
  -- any other output is a value the function stored somewhere
  local used = {}
  for _, r in ipairs(info.rets) do if r.node then used[r.node] = true end end
  for _, n in ipairs(g:nodes()) do
    if outpos[n.id] and n.kind == "op" and not used[n.id] then
      return nil, "a traced tensor escapes through a table or global; the body re-runs in Lua each call"
    end
  end
  spec.program = st.last_program
  spec.train = train
  local ok, e = pcall(fl._entry_new, g, spec)
  if not ok then
    return nil, tostring(e):gsub("^compile: ", "") .. "; the body re-runs in Lua each call"
  end
  return e, text
end

-- ---- compiled training (AOTAutograd) -------------------------------------------
-- In grad mode, a call of a function that returns a loss (a float scalar
-- first) and whose tensor arguments or parameters require grad runs a
-- forward and a backward compiled from its joint graph (g:joint(),
-- partitioned as opts.partition says, "mincut" by default): the forward
-- returns the results and the saved values, and the loss gets a
-- CompiledFunctionBackward grad_fn that runs the backward program and
-- hands each gradient to its input or parameter.  One pair per guarded
-- entry and requires_grad pattern; with graph breaks, one pair per
-- segment, chained (below).  A function that returns something else keeps
-- the inference path (st.no_train says why); a loss whose joint graph
-- cannot be built (symbolic sizes, a half the backend cannot lower) trains
-- eagerly, the reason in stats.training_eager.

local capture_outputs   -- fl.capture's (below)
local train             -- below

-- The live tensors of a trace's parameters (resolved through their paths).
local function live_params(fn, params)
  local out = {}
  for _, p in ipairs(params) do
    local v = p.path and resolve(fn, p.path)
    if is_tensor(v) then out[#out + 1] = v end
  end
  return out
end

local function wants_grad(args, params)
  if not fl.is_grad_enabled() then return false end
  for i = 1, args.n do
    if is_tensor(args[i]) and args[i].requires_grad then return true end
  end
  for _, p in ipairs(params or {}) do if p.requires_grad then return true end end
  return false
end

-- The tensor arguments, in order (a graph's inputs), and each one's
-- argument position.
local function tensor_args(args)
  local ins, at = {}, {}
  for i = 1, args.n do
    if is_tensor(args[i]) then ins[#ins + 1] = args[i]; at[#ins] = i end
  end
  return ins, at
end

local function no_train(st, why)
  st.no_train = why
  debug_line("compiled training: not for this function (%s)", why)
end

local function train_eager(st, why)
  if not st.train_why[why] then
    st.train_why[why] = true
    local list = st.stats.training_eager
    list[#list + 1] = why
    debug_line("training runs eagerly: %s", why)
  end
end

-- A node type that a loss has: a float scalar ("float32[]").
local function is_loss_type(ty) return ty ~= nil and ty:find("^b?float%d*%[%]$") ~= nil end

-- The type of node id of g, or nil.
local function node_type(g, id)
  for _, n in ipairs(g:nodes()) do if n.id == id then return n.type end end
end

-- The results of segment graph g that depend on a leaf requiring grad
-- (their positions among g:outputs(), float values only), and each
-- node's type.
local function grad_results(g)
  local needs, types = {}, {}
  for _, n in ipairs(g:nodes()) do          -- ids ascending: inputs first
    types[n.id] = n.type
    if n.requires_grad then needs[n.id] = true end
    for _, i in ipairs(n.inputs or {}) do
      if needs[i] and n.type:find("float") then needs[n.id] = true end
    end
  end
  local list = {}
  for k, id in ipairs(g:outputs()) do if needs[id] then list[#list + 1] = k end end
  return list, types
end

-- The value a segment graph g's pair seeds its backward from: the first
-- result that needs a gradient and is a float scalar (a loss), else the
-- first that needs one (an activation crossing a break to the next
-- segment); nil when none does.  Its position among g:outputs().
local function segment_main(g)
  local list, types = grad_results(g)
  for _, i in ipairs(list) do
    if is_loss_type(types[g:outputs()[i]]) then return i end
  end
  return list[1]
end

-- The executor of a training capture: nothing runs (no write lands, no
-- time is spent); the segment's outputs are zeros of their shapes, which
-- nobody reads.
local function dry_exec(g)
  local outs = {}
  local grads, types = grad_results(g)
  local ids = g:outputs()
  local device = g:_on_cuda() and "cuda" or "cpu"   -- where the real results would be
  for _, w in ipairs(g:writebacks()) do ids[#ids + 1] = w.node end
  for i, id in ipairs(ids) do
    local dt, dims = types[id]:match("^(%w+)%[(.-)%]$")
    local shape = {}
    for d in (dims or ""):gmatch("%d+") do shape[#shape + 1] = tonumber(d) end
    outs[i] = fl.zeros(shape, {dtype = dt, device = device})
  end
  -- a value that needs gradients gets a history of its own (a leaf of
  -- zeros), so that the function's own backward() goes on, touching nothing
  for _, k in ipairs(grads) do outs[k]:requires_grad_() end
  return outs
end

-- The dry capture: each segment's results are zeros, and while
-- fl._dry_capture is set an optimizer's step and zero_grad do nothing
-- (their tensors are real).  A value read at a break is 0, so a branch on
-- one may take another way than the real call: the segments the real call
-- makes are checked again as they run (train_segment).
local function dry_capture(st, ...)
  fl._dry_capture = true
  local r = pack(pcall(trace_call, st.fn, {}, st.names, {}, dry_exec, false, nil, ...))
  fl._dry_capture = nil
  return unpack(r, 1, r.n)
end

-- The joint graph of g (its loss, or the value it seeds from, first) and
-- its partition: with a tangent for every result that needs a gradient
-- when a scalar loss is not the only one (an activation returned beside
-- it, or crossing a break), as AOTAutograd's joint.
local function joint_partition(st, g)
  local needs, types = grad_results(g)
  local first = g:outputs()[1]
  local tangents = #needs > 1 or (needs[1] or 1) ~= 1 or not is_loss_type(types[first])
  return g:joint{tangents = tangents}:partition{policy = st.opts.partition or "mincut"}
end

-- A partition's halves fused and compiled for where the forward's
-- tensors are (the backward's follow them): their plans and programs,
-- compiled now (compile_ms, not the first call's backward_ms).
local function compile_pair(st, fw, bw)
  local backend = on_device(st, fw) and "cuda" or "cpu"
  st.backend = backend
  local function compile_half(h)
    local b = pipeline(h, backend, st.opts.fuse ~= false)
    if not b.ok then error(b.compile_log, 0) end
    return b.plan, b.program
  end
  local fplan, fprog = compile_half(fw)
  local bplan, bprog = compile_half(bw)
  return fplan, fprog, bplan, bprog
end

-- The pair of a partition's programs (exec/pair.h): which forward
-- input or output each saved value is, and the tangents.
local function new_pair(fprog, bprog, pinfo)
  local saved_in = {}
  for i, sv in ipairs(pinfo.saved) do saved_in[i] = sv.input or 0 end
  return fl._pair(fprog, bprog, saved_in, pinfo.results, pinfo.tangents)
end

-- Each leaf that requires grad now gets its gradient; the others none.
local function grad_leaves(list)
  local leaves = {}
  for i, v in ipairs(list) do leaves[i] = is_tensor(v) and v.requires_grad and v or false end
  return leaves
end

-- A pair built: counted in stats, listed by cm:training().
local function count_pair(st, fplan, fprog, bplan, bprog, pinfo, t0)
  local stats = st.stats
  stats.backward_graphs = stats.backward_graphs + 1
  stats.backward_kernels = stats.backward_kernels + bplan:stats().kernels
  stats.saved_bytes = pinfo.saved_bytes
  stats.recomputed = #pinfo.recomputed
  stats.compile_ms = stats.compile_ms + (fl.now() - t0) * 1e3
  st.train_pairs[#st.train_pairs + 1] = {fw = fplan, bw = bplan, fw_program = fprog, bw_program = bprog,
                                         partition = pinfo}
end

-- The forward and backward programs of one training entry, or
-- {eager = reason}.
local function train_build(st, args, fresh)
  local t0 = fl.now()
  local g, info = fresh and fresh.g, fresh and fresh.info
  if not g then
    local ok
    ok, info = dry_capture(st, unpack(args, 1, args.n))
    if not ok then return {eager = "one graph is needed for a compiled backward: " .. tostring(info):match("^[^\n]*")} end
    g = info.graphs[#info.graphs]
    capture_outputs(g, info)
    name_params(st.fn, g, info.params)
  end
  local okj, fw, bw, pinfo = pcall(joint_partition, st, g)
  if not okj then return {eager = tostring(fw):gsub("^joint: ", "")} end
  local okc, fplan, fprog, bplan, bprog = pcall(compile_pair, st, fw, bw)
  if not okc then
    -- a half the backend cannot lower (an op without a CUDA kernel)
    return {eager = "the joint graph's halves cannot be compiled: " .. tostring(fplan):match("^[^\n]*")}
  end
  -- each gradient's leaf: an argument by position, a parameter by storage
  local params, leaves = live_params(st.fn, info.params), {}
  local _, at = tensor_args(args)
  for k, gr in ipairs(pinfo.grads) do
    if gr.input then
      leaves[k] = {arg = at[gr.input]}
    else
      for _, p in ipairs(params) do
        if fl._same_storage(p, gr.param) then leaves[k] = {param = p} end
      end
      if not leaves[k] then return {eager = "a parameter of the joint graph is not reachable from the function"} end
    end
  end
  count_pair(st, fplan, fprog, bplan, bprog, pinfo, t0)
  return {pair = new_pair(fprog, bprog, pinfo), results = pinfo.results, leaves = leaves}
end

-- ---- compiled training across graph breaks ---------------------------------------
-- A loss whose function has graph breaks (a print of a value, an
-- optimizer's step, loss:backward() itself inside the function) trains one
-- segment at a time, as PyTorch chains a compiled pair per segment: a
-- segment with values that need gradients runs its compiled forward, and
-- the first of them (its loss, or an activation the next segment reads)
-- gets the CompiledFunctionBackward of its compiled backward, the others
-- histories that feed it; the backward hands gradients to the parameters
-- and to the segment's inputs that require grad (an argument, or an
-- earlier segment's result, whose own backward then goes on), so the
-- tape chains the segments.  Segments that need no gradients run their
-- inference programs.  Each segment's record (lfl_resume.c) keeps a
-- runner that chooses per call: the pair in grad mode, the forward alone
-- else.

-- Segment graph g's pair, seeded from output position k, for the
-- inputs pattern says require grad.  Its leaves: {param = tensor} or
-- {input = i} (the segment's input i, live per call).
local function segment_pair(st, g, params, k, pattern)
  local key = fl._graph_key(g) .. "#" .. k .. "#" .. pattern
  local t = st.segtrain[key]
  if t then return t end
  local t0 = fl.now()
  name_params(st.fn, g, params)
  local c = g:_clone()
  local outs, order = c:outputs(), {}
  order[1] = outs[k]
  for i, id in ipairs(outs) do if i ~= k then order[#order + 1] = id end end
  c:_set_outputs(order)
  local fw, bw, pinfo = joint_partition(st, c)
  local fplan, fprog, bplan, bprog = compile_pair(st, fw, bw)
  local live, leaves = live_params(st.fn, params), {}
  for i, gr in ipairs(pinfo.grads) do
    if gr.input then
      leaves[i] = {input = gr.input}
    else
      for _, p in ipairs(live) do
        if fl._same_storage(p, gr.param) then leaves[i] = {param = p} end
      end
    end
    if not leaves[i] then error("compiled training: a parameter of the segment's joint graph is not reachable from the function", 0) end
  end
  count_pair(st, fplan, fprog, bplan, bprog, pinfo, t0)
  st.stats.compiles = st.stats.compiles + 1
  t = {pair = new_pair(fprog, bprog, pinfo), results = pinfo.results, leaves = leaves, k = k, n = #outs}
  st.segtrain[key] = t
  return t
end

-- The segment's results in its own order from the pair's forward (the
-- seeded one first), then the write-backs' values (the forward wrote
-- them already); its backward attached in grad mode.
local function run_segment_pair(st, t, inputs)
  local train = fl.is_grad_enabled()
  local leaves = false
  if train then
    leaves = {}
    for i, l in ipairs(t.leaves) do leaves[i] = l.param or inputs[l.input] end
    leaves = grad_leaves(leaves)
  end
  local outs = pack(t.pair:run(leaves, unpack(inputs)))
  local res, j = {}, 2
  for i = 1, t.n do
    if i == t.k then res[i] = outs[1] else res[i] = outs[j]; j = j + 1 end
  end
  for i = t.results + 1, outs.n do res[#res + 1] = outs[i] end
  if train then st.stats.training_calls = st.stats.training_calls + 1 end
  return res
end

-- Which of a segment's inputs require grad now ("g" or "n" each): its
-- pair hands gradients to those, so each pattern has its own.
local function grad_pattern(inputs)
  local k = {}
  for i, v in ipairs(inputs) do k[i] = is_tensor(v) and v.requires_grad and "g" or "n" end
  return table.concat(k)
end

-- Segment graph g with its inputs requiring grad as pattern says.
local function with_input_grads(g, pattern)
  local c, i = g:_clone(), 0
  for _, n in ipairs(c:nodes()) do
    if n.kind == "input" then
      i = i + 1
      c:_set_requires_grad(n.id, pattern:sub(i, i) == "g")
    end
  end
  return c
end

-- The segment's results, and its runner for the calls that replay it:
-- per pattern of inputs requiring grad, a compiled pair when a value
-- needs a gradient, else the inference program.
function train_segment(st, g, inputs, params)
  local by = {}
  local function run(ins)
    local pattern = grad_pattern(ins)
    local c = by[pattern]
    if not c then
      local cg = with_input_grads(g, pattern)
      local main = segment_main(cg)
      if not main then
        -- no value needs gradients: the segment's program, through a
        -- runner (a record that runs a program directly could not train
        -- later)
        st.train_segments = false
        local outs, _, runner = make_exec(st)(g, ins, params)
        st.train_segments = true
        by[pattern] = {run = runner}
        return outs
      end
      c = {pair = segment_pair(st, cg, params, main, pattern)}
      by[pattern] = c
    end
    if c.pair then return run_segment_pair(st, c.pair, ins) end
    return c.run(ins)
  end
  return run(inputs), nil, run
end


-- Does a dry capture's function return a tensor that is not a scalar
-- first (an output of its last graph, or a value from before)?
local function returns_activation(info)
  local r = info.rets[1]
  if not r then return false end
  if r.kind == "node" then
    local ty = node_type(info.graphs[#info.graphs], r.node)
    return ty ~= nil and not ty:find("%[%]$")
  end
  return is_tensor(r.value) and r.value:numel() ~= 1
end

-- A call in grad mode that may train, and no entry's guards hold: the
-- function captured dry (one graph, nothing run).  When it returns a loss
-- (a float scalar first), an entry made from the capture, with its
-- inference program for calls under fl.no_grad, and the call trains:
-- true and its results.  Else false, once for good (st.no_train says why):
-- the inference path, as before.
local function train_first(st, reason, ...)
  local args = pack(...)
  local stats = st.stats
  local ok, info = dry_capture(st, ...)
  local why = not ok and tostring(info):match("^[^\n]*"):gsub("^[%w_./-]+:%d+: ", ""):gsub("; hint: .*", "")
              or info.why_not_fast
  if ok and #info.graphs > 1 then
    -- graph breaks: one compiled pair per segment with values that need
    -- gradients, chained, when nothing was recorded yet (a record of a call
    -- under fl.no_grad runs its program directly).  A function returning
    -- an activation rather than a loss keeps the inference path, as one
    -- graph does; one returning a loss, nothing or a number (a whole
    -- training step) trains.
    if returns_activation(info) then
      no_train(st, "its first result is not a loss (a float scalar)")
      return false
    end
    why = st.traces > 0 and "graph breaks, and calls under fl.no_grad recorded its segments first" or nil
    if not why then
      st.train_segments = true
      debug_line("compiled training: one pair per segment (%d segments)", #info.graphs)
      return false
    end
    why = "graph breaks: " .. why
  end
  if why then
    -- not one graph: this call runs eagerly, and says what it was.  A
    -- loss trains eagerly from now on (its gradients right, uncompiled);
    -- anything else takes the inference path
    local r = pack(st.fn(...))
    local loss = is_tensor(r[1]) and r[1]:numel() == 1 and r[1].requires_grad
    if loss then
      st.train_breaks = true
      train_eager(st, why .. ": a compiled backward needs one graph; the loss trains eagerly")
    else
      no_train(st, why)
    end
    return true, unpack(r, 1, r.n)
  end
  local g = info.graphs[1]
  capture_outputs(g, info)
  if not is_loss_type(node_type(g, g:outputs()[1])) then
    no_train(st, "its first result is not a loss (a float scalar)")
    return false
  end
  st.ntraces = st.ntraces + 1
  name_params(st.fn, g, info.params)
  st.grad_params = live_params(st.fn, info.params)
  local t0 = fl.now()
  local _, prog, compiled = build_runner(st, g, (tensor_args(args)))
  stats.compiles = stats.compiles + 1
  stats.compile_ms = stats.compile_ms + (fl.now() - t0) * 1e3
  st.graphs[#st.graphs + 1] = compiled
  st.last_program = prog
  local e, text = build_entry(st, info, args, {}, true)
  if not e then
    no_train(st, text)
    return false
  end
  table.insert(st.entries, 1, e)
  stats.guards = text
  st.traces = st.traces + 1
  st.fresh = {g = g, info = info}
  if reason then
    stats.recompiles = stats.recompiles + 1
    stats.recompile_reasons[#stats.recompile_reasons + 1] = reason
  end
  return true, train(st, e, ...)
end

local function train_key(args)
  local k = {}
  for i = 1, args.n do
    local a = args[i]
    k[i] = is_tensor(a) and (a.requires_grad and "g" or "n") or "-"
  end
  return table.concat(k)
end

-- cm(...) in training: the entry's forward, a backward on its loss.
function train(st, entry, ...)
  local args = pack(...)
  local byentry = st.train_cache[entry]
  if not byentry then byentry = {}; st.train_cache[entry] = byentry end
  local key = train_key(args)
  local t = byentry[key]
  if not t then
    t = train_build(st, args, st.fresh)
    byentry[key] = t
  end
  st.fresh = nil
  if t.eager then
    train_eager(st, t.eager)
    return st.fn(...)
  end
  local leaves = {}
  for i, l in ipairs(t.leaves) do leaves[i] = l.arg and args[l.arg] or l.param end
  st.stats.training_calls = st.stats.training_calls + 1
  local outs = pack(t.pair:run(grad_leaves(leaves), unpack((tensor_args(args)))))
  return unpack(outs, 1, t.results)
end

local function record_breaks(st, breaks)
  for _, b in ipairs(breaks) do
    local key = b.reason .. "@" .. b.where
    if not st.break_seen[key] then
      st.break_seen[key] = true
      st.stats.graph_breaks = st.stats.graph_breaks + 1
      st.stats.break_reasons[#st.stats.break_reasons + 1] = b
      debug_line("graph break: %s (%s)", b.reason, b.where)
    end
  end
end

-- A symbolic size made static, said once per reason.
local function note_specialization(st, r)
  if st.spec_seen[r] then return end
  st.spec_seen[r] = true
  st.stats.specializations[#st.stats.specializations + 1] = r
  debug_line("specialized: %s", r)
end

-- The slow path: called by the C callable on a miss.
local function slow(st, reason, argi, dim, ...)
  local args = pack(...)
  local stats = st.stats
  if st.fallback then
    stats.fallbacks = stats.fallbacks + 1
    return st.fn(...)
  end
  if st.opts.backend == "eager" then return st.fn(...) end
  -- training: the function captured dry first, so that nothing runs twice
  -- (BatchNorm's statistics would move twice)
  if not st.no_train and not st.train_segments and fl.is_grad_enabled()
     and st.traces < (st.opts.recompile_limit or 8) then
    if st.grad_params == nil then st.grad_params = grad_tensors(st.fn) end
    if wants_grad(args, st.grad_params) then
      if st.train_breaks then return st.fn(...) end
      local r = pack(train_first(st, reason, ...))
      if r[1] then return unpack(r, 2, r.n) end
    end
  end
  local recompiling = reason ~= nil
  if recompiling then
    stats.recompile_reasons[#stats.recompile_reasons + 1] = reason
    debug_line("recompile: %s", reason)
    if st.opts.dynamic == nil and argi < 0 and not st.dyn_num[-argi] then
      -- automatic dynamic for numbers (as Dynamo's for a float): the
      -- number that changed is a graph input from now on
      st.dyn_num[-argi] = true
      stats.dynamic_numbers[#stats.dynamic_numbers + 1] = st.names[-argi]
    end
    if st.opts.dynamic == nil and argi > 0 then
      -- automatic dynamic shapes: every size that changed since the last
      -- trace becomes symbolic (0 and 1 never do: they change broadcasting)
      st.auto_dyn[argi] = st.auto_dyn[argi] or {}
      st.auto_dyn[argi][dim] = true
      for i = 1, args.n do
        local a, prev = args[i], st.last_shapes[i]
        if is_tensor(a) and prev and #prev == #a.shape then
          for d, n in ipairs(a.shape) do
            if n ~= prev[d] and n >= 2 then
              st.auto_dyn[i] = st.auto_dyn[i] or {}
              st.auto_dyn[i][d] = true
            end
          end
        end
      end
    end
  end
  if st.traces >= (st.opts.recompile_limit or 8) then
    st.fallback = true
    stats.fallbacks = stats.fallbacks + 1
    io.stderr:write(("fuselab: warning: recompile_limit (%d) reached%s; running eagerly from now on\n"):format(
      st.opts.recompile_limit or 8, reason and (" (last reason: " .. reason .. ")") or ""))
    return st.fn(...)
  end
  -- which dims are symbolic for this trace
  local dyn = {}
  for i = 1, args.n do
    local a = args[i]
    if type(a) == "number" and not st.num_failed and not st.replaying
       and (st.dyn_num[i] or st.opts.dynamic == true) then
      dyn[i] = true                     -- a graph input, not a constant
    elseif is_tensor(a) and st.sym_failed then
      dyn[i] = {}
    elseif is_tensor(a) then
      local d = {}
      local set = {}
      local function add(k) if not set[k] then set[k] = true; d[#d + 1] = k end end
      if st.opts.dynamic == true then for k = 1, #a.shape do add(k) end end
      if st.opts.dynamic ~= false then
        for k in pairs(st.auto_dyn[i] or {}) do add(k) end
        for k in pairs(fl._dynamic_marks[a] or {}) do add(k) end
        -- a module may name dims dynamic by itself (an ONNX model's symbolic dims)
        local md = type(st.fn) == "table" and rawget(st.fn, "_dynamic_dims")
        for k in pairs(md and md[i] or {}) do if k <= #a.shape then add(k) end end
      end
      table.sort(d)
      dyn[i] = d
    end
  end
  if st.replaying then
    -- the function breaks: its segments replay for the exact shapes they
    -- were recorded with (a replayed call reads plain sizes), so symbols
    -- would only make the recording differ from its replays
    for i = 1, args.n do if is_tensor(args[i]) then dyn[i] = {} end end
  end
  for i = 1, args.n do st.last_shapes[i] = is_tensor(args[i]) and args[i].shape or nil end
  -- what the arguments were like, without keeping them alive: fl.report
  -- runs its checklist on inputs like these
  st.last_args = {n = args.n}
  for i = 1, args.n do
    local a = args[i]
    if is_tensor(a) then st.last_args[i] = {shape = a.shape, dtype = a.dtype, device = a.device}
    elseif type(a) ~= "table" and type(a) ~= "userdata" and type(a) ~= "function" then st.last_args[i] = {value = a}
    else st.last_args[i] = {opaque = true} end
  end
  local t0 = fl.now()
  st.new_compiles = 0
  st.ntraces = st.ntraces + 1
  local okt, info = pcall(trace_call, st.fn, st.opts, st.names, dyn, st.exec, false, st.plan, ...)
  local any_dyn = false
  for _, d in pairs(dyn) do any_dyn = any_dyn or d == true or #d > 0 end
  if not okt and any_dyn then
    -- most likely the Lua code needed a plain number where a symbolic size
    -- or a number input went (a loop bound, string.format's %d,
    -- math.floor, a comparison): trace again with every size and number
    -- static, and say so (a real error comes back again)
    note_specialization(st, "a symbolic size or number reached Lua code that needs a plain number ("
      .. tostring(info):match("^[^\n]*") .. "); these are static")
    dyn = {}
    for i = 1, args.n do if is_tensor(args[i]) then dyn[i] = {} end end
    st.sym_failed, st.num_failed = true, true
    stats.dynamic_numbers = {}            -- none is an input any more
    okt, info = pcall(trace_call, st.fn, st.opts, st.names, dyn, st.exec, false, st.plan, ...)
  end
  if not okt then
    -- a body that failed on the wrong number of arguments says so first
    local want = st.nparams
    if want and args.n ~= want then
      info = ("compile: the function takes %d argument(s) (%s), called with %d: %s"):format(
        want, table.concat(st.names, ", ", 1, want), args.n, tostring(info))
    end
    error(info, 0)
  end
  if st.new_compiles > 0 then
    st.traces = st.traces + 1
    if recompiling then stats.recompiles = stats.recompiles + 1 end
  end
  if stats.first_call_ms == nil then stats.first_call_ms = (fl.now() - t0) * 1e3 end
  record_breaks(st, info.breaks)
  for _, r in ipairs(info.specialized or {}) do note_specialization(st, r) end
  for _, sg in ipairs(info.sym_guards or {}) do debug_line("size guard: %s", sg.text) end
  if #info.graphs > 0 then name_params(st.fn, info.graphs[#info.graphs], info.params) end
  if not info.why_not_fast and #info.graphs == 1 then
    local e, text = build_entry(st, info, args, dyn)
    if e then
      table.insert(st.entries, 1, e)
      stats.guards = text
    else
      info.why_not_fast = text
    end
  end
  -- the Lua body runs on every call: later calls replay the segments
  -- just recorded (lfl_resume.c) instead of tracing again
  if info.why_not_fast then
    fl._resume_enable(st.plan, true)
    st.replaying = true
  end
  if info.why_not_fast and not st.told_lua then
    st.told_lua = true
    st.lua_reason = info.why_not_fast
    debug_line("not cached whole: %s", info.why_not_fast)
  end
  return unpack(info.results, 2, info.results.n)
end

local methods = {}

function methods.stats(cm)
  local st = cm.state
  local s = {}
  for k, v in pairs(st.stats) do s[k] = v end
  local segs, replays = fl._resume_counts(st.plan)
  s.calls = cm.calls
  s.cache_hits = cm.hits + st.seg_hits + segs
  s.traces = st.ntraces
  s.replays = replays
  s.kernels = 0
  for _, p in ipairs(st.plans) do s.kernels = s.kernels + p:stats().kernels end
  s.compile_log = table.concat(st.compile_logs, "\n")
  s.first_call_warm = st.first_how ~= nil and st.first_how ~= "compiled"
  -- the calls' own wall times: the first (capture and compile, or kernels
  -- from the disk cache), the second, and the median of the later ones
  local tm = cm.timings
  s.timings = {first_ms = tm.first_ms, second_ms = tm.second_ms,
               steady = #tm.steady > 0 and fl.measure(tm.steady) or nil}
  s.backend = st.opts.backend == "eager" and "eager" or st.backend or "cpu"
  s.training_note = st.no_train
  s.backward_ms = 0
  for _, p in ipairs(st.train_pairs) do s.backward_ms = s.backward_ms + (p.bw_program:stats().run_ms or 0) end  -- a CUDA program keeps none
  return s
end

-- print(cm): the same counts as cm:stats()
function methods._tostring(cm)
  local s = methods.stats(cm)
  return ("fl.compile: %d compiled graph(s), %d call(s), %d cache hit(s), %d trace(s), %d graph break(s)"):format(
    #cm.state.graphs, s.calls, s.cache_hits, s.traces, s.graph_breaks)
end

-- cm:code([{preamble = true}]) -> for every compiled graph its host program
-- (buffers, the kernel and library calls in order, frees), then its
-- kernels; the preamble (includes, SIMD helpers) only on request
function methods.code(cm, opts)
  if opts ~= nil and type(opts) ~= "table" then
    error("code: expected an options table {preamble = true}, got " .. type(opts), 2)
  end
  local parts = {}
  for i, p in ipairs(cm.state.programs) do
    parts[#parts + 1] = ("/* ---- graph %d ---- */\n%s"):format(i, p.code and p:code(opts) or p:source())
  end
  for i, t in ipairs(cm.state.train_pairs) do
    for _, half in ipairs{{"forward", t.fw_program}, {"backward", t.bw_program}} do
      parts[#parts + 1] = ("/* ---- training pair %d: the %s ---- */\n%s"):format(i, half[1], half[2]:code(opts))
    end
  end
  return table.concat(parts, "\n")
end

-- cm:kernels() -> {{graph=, name=, kind=, nodes=, bytes=}...}
function methods.kernels(cm)
  local out = {}
  for i, p in ipairs(cm.state.plans) do
    for _, k in ipairs(p:kernels()) do
      k.graph = i
      out[#out + 1] = k
    end
  end
  return out
end

function methods.plans(cm)
  local out = {}
  for i, p in ipairs(cm.state.plans) do out[i] = p end
  return out
end

-- cm:training() -> {{fw =, bw = (their plans), fw_program =, bw_program =,
-- partition = (j:partition's info)}...}: the compiled training pairs
function methods.training(cm)
  local out = {}
  for i, p in ipairs(cm.state.train_pairs) do out[i] = p end
  return out
end

function methods.graphs(cm)
  local out = {}
  for i, g in ipairs(cm.state.graphs) do out[i] = g end
  return out
end

function methods.explain(cm)
  local st = cm.state
  local s = methods.stats(cm)
  local lines = {("fl.compile: %d call(s), %d compile(s), %d recompile(s), %d cache hit(s), %d graph break(s), %d fallback(s)"):format(
    s.calls, s.compiles, s.recompiles, s.cache_hits, s.graph_breaks, s.fallbacks)}
  if st.lua_reason then lines[#lines + 1] = "runs its Lua each call: " .. st.lua_reason end
  if s.replays > 0 then
    lines[#lines + 1] = ("%d call(s) replayed the recorded segments (%d trace(s) in all)"):format(
      s.replays, s.traces)
  end
  if #s.guards > 0 then
    lines[#lines + 1] = "guards of the newest cached graph:"
    for _, g in ipairs(s.guards) do lines[#lines + 1] = "  " .. g end
  end
  for _, r in ipairs(s.recompile_reasons) do lines[#lines + 1] = "recompiled: " .. r end
  if #s.dynamic_numbers > 0 then
    lines[#lines + 1] = "number arguments that are graph inputs (they changed value; any value reuses the graph): "
      .. table.concat(s.dynamic_numbers, ", ")
  end
  for _, r in ipairs(s.specializations) do lines[#lines + 1] = "specialized: " .. r end
  for _, b in ipairs(s.break_reasons) do
    lines[#lines + 1] = ("graph break: %s (%s)\n  hint: %s"):format(b.reason, b.where, b.hint)
  end
  -- what fusion bought, in the numbers p:stats(), the pictures and the
  -- report show (before: the captured graph run op by op)
  local B = fl._bytes_str
  for i, p in ipairs(st.plans) do
    local ps = p:stats()
    lines[#lines + 1] = ("graph %d: %d op(s) -> %d kernel(s), bytes moved %s -> %s, peak memory %s -> %s%s"):format(
      i, ps.kernels_before, ps.kernels, B(ps.bytes_before), B(ps.bytes_after),
      B(ps.peak_bytes_before), B(ps.peak_bytes_after), ps.note and ("\n  note: " .. ps.note) or "")
  end
  local text = table.concat(lines, "\n")
  print(text)
  return fl._shown(text)  -- the REPL does not echo it a second time
end

function fl.compile(fn, opts)
  local tf = type(fn)
  local callable = tf == "function" or (tf == "table" and getmetatable(fn) and getmetatable(fn).__call)
  if not callable then
    error("compile: expected a function or an nn module, got " .. tf, 2)
  end
  opts = check_opts(opts)
  local st = {
    fn = fn, opts = opts, names = arg_names(fn), stats = new_stats(),
    entries = {}, graphs = {}, segcache = {}, segtrain = {}, seg_hits = 0, traces = 0, new_compiles = 0,
    programs = {}, plans = {}, compile_logs = {},
    auto_dyn = {}, dyn_num = {}, last_shapes = {}, break_seen = {}, spec_seen = {}, methods = methods,
    ntraces = 0, train_cache = setmetatable({}, {__mode = "k"}), train_why = {}, train_pairs = {},
  }
  st.train = train
  st.exec = make_exec(st)
  st.plan = fl._resume_new{
    exec = st.exec, fullgraph = opts.fullgraph,
    -- a replayed call met something its records did not have: it recorded
    -- from there (a new variant of that segment)
    diverge = function(reason)
      local stats = st.stats
      stats.recompiles = stats.recompiles + 1
      stats.recompile_reasons[#stats.recompile_reasons + 1] = reason
      st.traces = st.traces + 1
      st.ntraces = st.ntraces + 1
      debug_line("recompile: %s", reason)
      if st.traces >= (opts.recompile_limit or 8) then fl._resume_enable(st.plan, false) end
    end,
    breaks = function(list) record_breaks(st, list) end,
  }
  local f = type(fn) == "table" and fn.forward or fn
  if type(f) == "function" then
    local di = debug.getinfo(f, "u")
    if not di.isvararg then st.nparams = di.nparams - (f ~= fn and 1 or 0) end
  end
  return fl._compiled_new(fn, st.entries, slow, st, st.plan)
end

-- ---- fl.capture, fl.explain, fl.mark_dynamic --------------------------------

-- The captured graph returns what fn returned, in order: a result computed
-- in the trace by its node, any other tensor (a returned upvalue or module
-- weight, an fl.full made inside) as a param bound by reference, the node
-- it already has when the graph uses it.  A value the function stored
-- elsewhere is not returned.  Non-tensor results are not graph values and
-- are left out.
function capture_outputs(g, info)
  local bykey, outs = {}, {}
  for _, p in ipairs(info.params) do bykey[p.key] = p.node end
  for i = 1, info.results.n - 1 do
    local r = info.rets[i]
    if r.kind == "node" then
      outs[#outs + 1] = r.node
    elseif is_tensor(r.value) then
      local key = fl._tensor_key(r.value)
      local id = bykey[key]
      if not id then
        id = g:_add_param(r.value)
        bykey[key] = id
        info.params[#info.params + 1] = {node = id, key = key}
      end
      outs[#outs + 1] = id
    end
  end
  g:_set_outputs(outs)
end

function fl.capture(fn, ...)
  local tf = type(fn)
  if not (tf == "function" or (tf == "table" and getmetatable(fn) and getmetatable(fn).__call)) then
    error("capture: expected a function or an nn module, got " .. tf, 2)
  end
  local info = trace_call(fn, {}, arg_names(fn), {}, nil, true, nil, ...)
  local g = info.graphs[#info.graphs]
  capture_outputs(g, info)
  name_params(fn, g, info.params)
  return g
end

function fl.explain(fn, ...)
  local tf = type(fn)
  if not (tf == "function" or (tf == "table" and getmetatable(fn) and getmetatable(fn).__call)) then
    error("explain: expected a function or an nn module, got " .. tf, 2)
  end
  local info = trace_call(fn, {}, arg_names(fn), {}, nil, false, nil, ...)
  local ops, counts, unsupported = {}, {}, {}
  local op_count = 0
  for _, g in ipairs(info.graphs) do
    for _, name in ipairs(g:ops()) do
      op_count = op_count + 1
      if not counts[name] then ops[#ops + 1] = name; counts[name] = 0 end
      counts[name] = counts[name] + 1
    end
  end
  local reasons = {}
  for _, b in ipairs(info.breaks) do
    reasons[#reasons + 1] = b
    if b.reason:find("in%-place") or b.hint:find("no lowering") then
      unsupported[#unsupported + 1] = b.reason:match("^(%S+):") or b.reason
    end
  end
  local graphs = {}
  for _, g in ipairs(info.graphs) do if #g:ops() > 0 then graphs[#graphs + 1] = g end end
  local r = {graph_count = #graphs, graph_break_count = #info.breaks, break_reasons = reasons,
             op_count = op_count, ops = ops, op_counts = counts, unsupported = unsupported,
             graphs = graphs}
  local lines = {("%d graph(s), %d graph break(s), %d op(s)"):format(r.graph_count, r.graph_break_count, op_count)}
  local parts = {}
  for _, name in ipairs(ops) do parts[#parts + 1] = ("%s x%d"):format(name, counts[name]) end
  if #parts > 0 then lines[#lines + 1] = "ops: " .. table.concat(parts, ", ") end
  for i, b in ipairs(reasons) do
    lines[#lines + 1] = ("break %d: %s (%s)\n  hint: %s"):format(i, b.reason, b.where, b.hint)
  end
  if #unsupported > 0 then lines[#lines + 1] = "unsupported: " .. table.concat(unsupported, ", ") end
  print(table.concat(lines, "\n"))
  return fl._shown(r)  -- printed: the REPL does not spell the table out too
end

fl._dynamic_marks = setmetatable({}, {__mode = "k"})

function fl.mark_dynamic(x, d)
  if not is_tensor(x) then error("mark_dynamic: expected a tensor, got " .. type(x), 2) end
  if math.type(d) ~= "integer" then error("mark_dynamic: dim must be an integer", 2) end
  local n = #x.shape
  if d < 0 then d = n + 1 + d end
  if d < 1 or d > n then
    error(("mark_dynamic: dim %d out of range for a %d-d tensor"):format(d, n), 2)
  end
  local m = fl._dynamic_marks[x] or {}
  m[d] = true
  fl._dynamic_marks[x] = m
  return x
end

-- ---- g:diff(g2): what a pass changed ------------------------------------------

-- Each node's canonical form: its listing line with the source comment
-- left out and every %id replaced by the canonical number of that node
-- (interned in `canon`, shared by both graphs), so a node both graphs
-- compute the same way has the same number whatever its id.  Returns the
-- lines {id, text, canon, op, at} in order (op: the form without its
-- inputs; at: the line's number in the listing), and the write-back and
-- return lines.
local function canonical_lines(g, canon)
  local lines, byid, tail = {}, {}, {}
  local text = tostring(g)
  local header = text:match("^graph%((.-)%) {")
  for id, decl in (header or ""):gmatch("%%(%d+): ([^,]+)") do
    local key = "input " .. decl
    canon[key] = canon[key] or (#canon + 1)
    if canon[key] == #canon + 1 then canon[#canon + 1] = key end
    byid[tonumber(id)] = canon[key]
  end
  local at = 0
  for line in text:gmatch("[^\n]*") do
    at = at + 1
    local id, rhs = line:match("^  %%(%d+) = (.-)%s*$")
    if id then
      rhs = rhs:gsub("    # .*$", "")
      -- a param's name is not a reference, even one like "tensor%8"
      local leaf = rhs:match("^param ") or rhs:match("^const ")
      local key = leaf and rhs or rhs:gsub("%%(%d+)", function(ref) return "#" .. tostring(byid[tonumber(ref)]) end)
      if not canon[key] then canon[#canon + 1] = key; canon[key] = #canon end
      byid[tonumber(id)] = canon[key]
      lines[#lines + 1] = {id = tonumber(id), text = line:gsub("    # .*$", ""), canon = canon[key],
                           op = leaf and rhs or rhs:gsub("%%%d+", "%%"), at = at}
    elseif line:match("^  write ") or line:match("^  return ") then
      local key = line:gsub("%%(%d+)", function(ref) return "#" .. tostring(byid[tonumber(ref)]) end)
      tail[#tail + 1] = {text = line:gsub("^%s+", ""), canon = key, at = at}
    end
  end
  return lines, tail
end

-- fl._graph_diff(g1, g2): what g:diff prints and the review report's pass
-- stepper highlights, one definition for both.  A node of g2 is kept when
-- g1 computes it (same op, attributes, type and inputs, whatever the ids),
-- else added; a node of g1 that g2 no longer computes is removed.  An
-- added node that is the same op, attributes and type as a removed one
-- (new inputs only: a rewrite upstream renumbered them) is also changed,
-- paired with it in order.  Line numbers are those of the listings
-- tostring(g1) and tostring(g2), so a reader can point at a line.
-- Returns {added = {texts}, removed = {texts}, kept = n, text = g:diff's
-- text, changed = {{old = line, new = line}}, marks = {[new line] = "+"
-- or "~"}, gone = {{line = old line, after = new line}} (the removed
-- nodes no changed node stands for, each after the new line of the last
-- node before it that is kept or changed), moved = results moved}.
function fl._graph_diff(g1, g2)
  local canon = {}
  local a, ta = canonical_lines(g1, canon)
  local b, tb = canonical_lines(g2, canon)
  local in_a, in_b = {}, {}
  for _, l in ipairs(a) do in_a[l.canon] = true end
  for _, l in ipairs(b) do in_b[l.canon] = in_b[l.canon] or l.at end
  local out, added, removed, kept = {}, {}, {}, 0
  local marks, changed, gone = {}, {}, {}
  -- removed nodes by their form without inputs, first come first paired
  local waiting = {}
  for _, l in ipairs(a) do
    if not in_b[l.canon] then
      local q = waiting[l.op] or {first = 1}
      q[#q + 1] = l
      waiting[l.op] = q
    end
  end
  local partner = {}
  for _, l in ipairs(b) do
    if in_a[l.canon] then
      kept = kept + 1
      out[#out + 1] = "  " .. l.text:sub(3)
    else
      added[#added + 1] = l.text
      out[#out + 1] = "+ " .. l.text:sub(3)
      local q = waiting[l.op]
      if q and q[q.first] then
        partner[q[q.first]] = l.at
        changed[#changed + 1] = {old = q[q.first].at, new = l.at}
        q.first = q.first + 1
        marks[l.at] = "~"
      else
        marks[l.at] = "+"
      end
    end
  end
  local after = 1   -- the header line
  for _, l in ipairs(a) do
    if in_b[l.canon] then after = in_b[l.canon]
    else
      removed[#removed + 1] = l.text
      out[#out + 1] = "- " .. l.text:sub(3)
      if partner[l] then after = partner[l]
      else gone[#gone + 1] = {line = l.at, after = after} end
    end
  end
  local function joined(t, k) local r = {} for i, x in ipairs(t) do r[i] = x[k] end return table.concat(r, "; ") end
  local moved = joined(ta, "canon") ~= joined(tb, "canon")
  if moved then
    out[#out + 1] = ("  results: %s (was: %s)"):format(joined(tb, "text"), joined(ta, "text"))
    for i, l in ipairs(tb) do
      if not ta[i] or ta[i].canon ~= l.canon then
        marks[l.at] = "~"
        if ta[i] then changed[#changed + 1] = {old = ta[i].at, new = l.at} end
      end
    end
  end
  table.insert(out, 1, ("%d node(s) kept, %d added (+), %d removed (-)"):format(kept, #added, #removed))
  return {added = added, removed = removed, kept = kept, text = table.concat(out, "\n"),
          changed = changed, marks = marks, gone = gone, moved = moved}
end

-- g:diff(g2) -> {added = {lines}, removed = {lines}, kept = n, text = ...}:
-- prints g2's listing with each node g does not compute marked "+", then
-- g's nodes g2 no longer computes marked "-" (fl._graph_diff above).
local GraphMethods = debug.getregistry()["fl.Graph"].__index
function GraphMethods.diff(g1, g2)
  if not (type(g2) == "userdata" and getmetatable(g2) == getmetatable(g1)) then
    error("diff: expected a Graph to compare with, got " .. type(g2), 2)
  end
  local d = fl._graph_diff(g1, g2)
  print(d.text)
  return fl._shown({added = d.added, removed = d.removed, kept = d.kept, text = d.text})
end
