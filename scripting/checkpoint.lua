-- checkpoint.lua -- training checkpoints in one safetensors file:
-- fl.save_checkpoint(path, {model=, optimizer=, scheduler=, extra=}) and
-- fl.load_checkpoint(path, {...}).  Tensors go in as tensors (the model's
-- state_dict under "model.", the optimizer's state under
-- "optimizer.state.<i>."), every number of the optimizer's groups and
-- state, the scheduler's fields and extra's values in the metadata, as
-- text that reads back exactly.  Embedded in the binary; lfl_nn.c runs it
-- after optim.lua, with the fl table.

local fl = ...
local nn = fl.nn
local fmt = string.format

local util = nn._util
local shape_str, same_shape = util.shape_str, util.same_shape
local function check_opts(opts, allowed, what) util.options(opts, allowed, what, true) end

-- Numbers, booleans, strings and lists of numbers as metadata strings
-- (safetensors metadata is string to string), read back by decode.
-- A float prints with the fewest digits that read back as the same
-- double (0.1, not 0.10000000000000001).
local function encode(v)
  local t = type(v)
  if t == "number" then
    if math.type(v) == "integer" then return tostring(v) end
    for digits = 15, 17 do
      local s = fmt("%." .. digits .. "g", v)
      if tonumber(s) == v or digits == 17 then return s end
    end
  end
  if t == "boolean" then return tostring(v) end
  if t == "string" then return "'" .. v end
  if t == "table" then
    local parts = {}
    for i, x in ipairs(v) do
      if type(x) ~= "number" then return nil end
      parts[i] = encode(x)
    end
    return "[" .. table.concat(parts, ",") .. "]"
  end
  return nil
end

local specials = {["inf"] = math.huge, ["-inf"] = -math.huge, ["nan"] = 0 / 0, ["-nan"] = 0 / 0}

local function decode(s)
  if s == "true" then return true end
  if s == "false" then return false end
  if specials[s] then return specials[s] end
  if s:sub(1, 1) == "'" then return s:sub(2) end
  if s:sub(1, 1) == "[" then
    local l = {}
    for x in s:sub(2, -2):gmatch("[^,]+") do l[#l + 1] = math.tointeger(x) or tonumber(x) or specials[x] end
    return l
  end
  return math.tointeger(s) or tonumber(s) or s
end

local function opt_name(opt) return getmetatable(opt).__name end

-- fl.save_checkpoint(path, {model=, optimizer=, scheduler=, extra=}):
-- tensors "model.<name>" (the model's state_dict) and
-- "optimizer.state.<i>.<key>"; in the metadata every number of the
-- optimizer's state ("optimizer.state.<i>.step"), its groups' options
-- ("optimizer.param_groups.<g>.lr"), the scheduler's fields
-- ("scheduler.last_epoch") and extra's values ("extra.epoch").
function fl.save_checkpoint(path, what)
  local name = "save_checkpoint"
  if type(path) ~= "string" then error(name .. ": path must be a string", 0) end
  check_opts(what, {"model", "optimizer", "scheduler", "extra"}, name)
  local tensors, meta = {}, {["fuselab.checkpoint"] = "1"}
  local function put(key, v)
    local s = encode(v)
    if s == nil then error(fmt("%s: %s: a %s cannot be saved (numbers, booleans, strings and "
                                   .. "lists of numbers can)", name, key, type(v)), 0) end
    meta[key] = s
  end
  if what.model ~= nil then
    if not nn.is_module(what.model) then error(name .. ": model must be an nn module", 0) end
    local map = what.model:state_dict()
    for k, t in pairs(map) do tensors["model." .. k] = t end
  end
  if what.optimizer ~= nil then
    local opt = what.optimizer
    if type(opt) ~= "table" or type(opt.state_dict) ~= "function" then
      error(name .. ": optimizer must be an fl.optim optimizer", 0)
    end
    meta["optimizer.type"] = opt_name(opt)
    local sd = opt:state_dict()
    for i, st in pairs(sd.state) do
      for k, v in pairs(st) do
        local key = fmt("optimizer.state.%d.%s", i, k)
        if fl.is_tensor(v) then tensors[key] = v else put(key, v) end
      end
    end
    meta["optimizer.param_groups"] = tostring(#sd.param_groups)
    for g, pg in ipairs(sd.param_groups) do
      for k, v in pairs(pg) do put(fmt("optimizer.param_groups.%d.%s", g - 1, k), v) end
    end
  end
  if what.scheduler ~= nil then
    for k, v in pairs(what.scheduler:state_dict()) do put("scheduler." .. k, v) end
  end
  for k, v in pairs(what.extra or {}) do put("extra." .. tostring(k), v) end
  fl.save_safetensors(tensors, path, meta)
end

-- fl.load_checkpoint(path, {model=, optimizer=, scheduler=}) -> extra:
-- the model's tensors filled in place (names and shapes checked first,
-- all or nothing), the optimizer's state and groups and the scheduler's
-- fields restored; returns the extra values saved.
function fl.load_checkpoint(path, what)
  local name = "load_checkpoint"
  if type(path) ~= "string" then error(name .. ": path must be a string", 0) end
  check_opts(what, {"model", "optimizer", "scheduler"}, name)
  local tensors, meta = fl.load_safetensors(path)
  if meta["fuselab.checkpoint"] == nil then
    error(fmt("%s: %s is not a checkpoint (no fuselab.checkpoint in its metadata); "
              .. "fl.load_weights reads plain weights", name, path), 0)
  end
  local function section(prefix)
    local ts, ms = {}, {}
    for k, t in pairs(tensors) do
      if k:sub(1, #prefix) == prefix then ts[k:sub(#prefix + 1)] = t end
    end
    for k, v in pairs(meta) do
      if k:sub(1, #prefix) == prefix then ms[k:sub(#prefix + 1)] = decode(v) end
    end
    return ts, ms
  end
  -- all checks first
  local model_ts, sd, sched
  if what.model ~= nil then
    model_ts = section("model.")
    local map, names = what.model:state_dict()
    local missing, unexpected = {}, {}
    for _, n in ipairs(names) do if model_ts[n] == nil then missing[#missing + 1] = n end end
    for n in pairs(model_ts) do if map[n] == nil then unexpected[#unexpected + 1] = n end end
    table.sort(unexpected)
    if #missing > 0 or #unexpected > 0 then
      error(fmt("%s: %s does not match the model: missing %s; unexpected %s", name, path,
                #missing > 0 and table.concat(missing, ", ") or "none",
                #unexpected > 0 and table.concat(unexpected, ", ") or "none"), 0)
    end
    for _, n in ipairs(names) do
      local t, f = map[n], model_ts[n]
      if not same_shape(t, f) or t.dtype ~= f.dtype then
        error(fmt("%s: %s: %s %s in the file, %s %s in the model", name, n, f.dtype, shape_str(f),
                  t.dtype, shape_str(t)), 0)
      end
    end
  end
  if what.optimizer ~= nil then
    local opt = what.optimizer
    if meta["optimizer.type"] == nil then error(fmt("%s: %s holds no optimizer state", name, path), 0) end
    if meta["optimizer.type"] ~= opt_name(opt) then
      error(fmt("%s: %s holds the state of an %s, not of an %s", name, path, meta["optimizer.type"],
                opt_name(opt)), 0)
    end
    local st_ts, st_ms = section("optimizer.state.")
    local _, pg_ms = section("optimizer.param_groups.")
    sd = {state = {}, param_groups = {}}
    for g = 1, tonumber(meta["optimizer.param_groups"]) do sd.param_groups[g] = {} end
    local function put(map, key, v)
      local i, k = key:match("^(%d+)%.(.+)$")
      if i == nil then return end
      i = math.tointeger(i)
      map[i] = map[i] or {}
      map[i][k] = v
    end
    for k, t in pairs(st_ts) do put(sd.state, k, t) end
    for k, v in pairs(st_ms) do put(sd.state, k, v) end
    local groups = {}
    for k, v in pairs(pg_ms) do put(groups, k, v) end
    for g = 1, #sd.param_groups do sd.param_groups[g] = groups[g - 1] or {params = {}} end
  end
  if what.scheduler ~= nil then
    local _, ms = section("scheduler.")
    sched = ms
  end
  if what.model ~= nil then
    local map, names = what.model:state_dict()
    fl.no_grad(function()
      for _, n in ipairs(names) do map[n]:copy_(model_ts[n]) end
    end)
  end
  if sd ~= nil then what.optimizer:load_state_dict(sd) end
  if sched ~= nil then what.scheduler:load_state_dict(sched) end
  local _, extra = section("extra.")
  return extra
end
