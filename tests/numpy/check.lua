-- check.lua DIR -- run the NumPy cases tests/numpy/gen.py wrote into DIR.
--
-- Each case of DIR/cases.lua names its input files (bound to a, b, c... in
-- order), a Lua expression over them using the fuselab API (1-based dims),
-- NumPy's expected output and a tolerance.  A case passes when the result
-- has the expected dtype and shape and every element satisfies
--   |got - want| <= atol + rtol * |want|
-- (NaN matching NaN, infinities equal).  A failure prints the largest
-- error, where it is and what was allowed.
--
-- It then saves tensors of every dtype with fl.save into DIR/saved/, with a
-- NAME.txt beside each holding dtype, shape and values, for
-- `gen.py verify` to read back in NumPy.  TAP lines without a plan: the
-- number printed goes to DIR/ntests and numpy.sh adds the rest and the plan.
--
-- Run as: fuselab check.lua DIR   (or lua5.4 with fuselab on package.cpath)

local fl = rawget(_G, "fl") or require "fuselab"
local dir = (...) or (arg and arg[1])
if not dir then
  io.stderr:write("usage: fuselab check.lua DIR\n")
  os.exit(2)
end

local n, failed = 0, 0

local function tap(pass, name, diag)
  n = n + 1
  if not pass then failed = failed + 1 end
  io.write((pass and "ok " or "not ok "), n, " - ", name, "\n")
  if not pass and diag then
    for line in (tostring(diag) .. "\n"):gmatch("(.-)\n") do io.write("#   ", line, "\n") end
  end
  io.flush()
end

-- Every element of a tolist() result in row-major order, as numbers.
local function flatten(v, out)
  out = out or {}
  if type(v) == "table" then
    for i = 1, #v do flatten(v[i], out) end
  elseif type(v) == "boolean" then
    out[#out + 1] = v and 1 or 0
  else
    out[#out + 1] = v
  end
  return out
end

local function shape_str(s)
  local parts = {}
  for i = 1, #s do parts[i] = tostring(s[i]) end
  return "[" .. table.concat(parts, ",") .. "]"
end

-- nil when got matches want within the tolerance, else why not.
local function compare(got, want, atol, rtol)
  if type(got) ~= "userdata" then
    return ("result is a %s, not a tensor"):format(type(got))
  end
  if got.dtype ~= want.dtype then
    return ("dtype %s, want %s"):format(tostring(got.dtype), want.dtype)
  end
  local gs, ws = shape_str(got.shape), shape_str(want.shape)
  if gs ~= ws then return ("shape %s, want %s"):format(gs, ws) end
  local g, w = flatten(got:tolist()), flatten(want:tolist())
  if #g ~= #w then return ("%d values, want %d"):format(#g, #w) end
  local worst, at, bad = -1, nil, 0
  for i = 1, #w do
    local a, b = g[i], w[i]
    local pass
    if b ~= b then pass = a ~= a
    elseif a == b then pass = true
    else pass = math.abs(a - b) <= atol + rtol * math.abs(b) end
    if not pass then
      bad = bad + 1
      local err = math.abs(a - b)
      if err ~= err then err = math.huge end
      if err > worst then worst, at = err, i end
    end
  end
  if bad == 0 then return nil end
  return ("%d of %d elements out of tolerance; max abs err %.3g at element %d " ..
          "(got %.9g, want %.9g; allowed %.3g = atol %g + rtol %g * |want|)"):format(
          bad, #w, worst, at - 1, g[at], w[at], atol + rtol * math.abs(w[at]), atol, rtol)
end

local env = setmetatable({ fl = fl }, { __index = _G })

local function run_case(c)
  local ins = {}
  for k, f in ipairs(c.inputs) do ins[k] = fl.load(dir .. "/" .. f) end
  local fn, err = load("local a, b, c, d, e, f = ...\nreturn " .. c.expr, "=" .. c.expr, "t", env)
  if not fn then error("bad expression: " .. err, 0) end
  local got = fn(table.unpack(ins, 1, #c.inputs))
  return compare(got, fl.load(dir .. "/" .. c.want), c.atol, c.rtol)
end

local cases = dofile(dir .. "/cases.lua")
local per_op = {}
for _, c in ipairs(cases) do
  local okc, why = pcall(run_case, c)
  if okc then
    tap(why == nil, c.name, why)
  else
    tap(false, c.name, "error: " .. tostring(why))
  end
  per_op[c.op] = per_op[c.op] or { 0, 0 }
  per_op[c.op][1] = per_op[c.op][1] + 1
  if not (okc and why == nil) then per_op[c.op][2] = per_op[c.op][2] + 1 end
end
local ops = {}
for op, v in pairs(per_op) do ops[#ops + 1] = ("%s %d%s"):format(op, v[1], v[2] > 0 and ("/" .. v[2] .. " failed") or "") end
table.sort(ops)
io.write(("# %d NumPy cases over %d ops, %d failed\n# %s\n"):format(#cases, #ops, failed,
         table.concat(ops, ", ")))

-- ---- fuselab -> NumPy: fl.save files with their values beside them ----------

local function save_case(name, make, npdtype)
  local okc, err = pcall(function()
    local t = make()
    local path = dir .. "/saved/" .. name
    fl.save(t, path .. ".npy")
    local vals = flatten(t:tolist())
    for i = 1, #vals do
      local v = vals[i]
      if math.type(v) == "integer" then vals[i] = ("%d"):format(v)
      elseif v ~= v then vals[i] = "nan"
      elseif v == math.huge then vals[i] = "inf"
      elseif v == -math.huge then vals[i] = "-inf"
      else vals[i] = ("%.17g"):format(v) end
    end
    local f = assert(io.open(path .. ".txt", "w"))
    f:write(npdtype, "\n", table.concat(t.shape, " "), "\n", table.concat(vals, " "), "\n")
    f:close()
  end)
  tap(okc, "fl.save " .. name, okc and nil or ("error: " .. tostring(err)))
end

local m = fl.tensor{{1.5, -2, 3.25}, {0, 1e-3, -7e5}}
save_case("float32", function() return m end, "float32")
save_case("float16", function() return m:to("float16") end, "float16")
save_case("bfloat16_as_float32", function() return m:to("bfloat16") end, "float32")
save_case("int64", function() return fl.tensor{{1, -2, 3}, {4, 5, 9007199254740993}}:to("int64") end, "int64")
save_case("bool", function() return m:gt(0) end, "bool")
save_case("scalar", function() return fl.tensor(2.5) end, "float32")
save_case("empty", function() return fl.zeros(3, 0) end, "float32")
save_case("transposed", function() return m:transpose(1, 2) end, "float32")
save_case("narrowed", function() return m:narrow(2, 2, 2) end, "float32")
save_case("nonfinite", function() return fl.tensor{0, 1, -1} / 0 end, "float32")

local f = io.open(dir .. "/ntests", "w")
if f then f:write(n, "\n"); f:close() end
