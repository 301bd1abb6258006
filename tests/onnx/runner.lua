-- runner.lua -- ONNX's backend node tests (Debian libonnx-testdata:
-- data/node/*/model.onnx with test_data_set_*/input_*.pb and output_*.pb)
-- through fl.load_onnx, eagerly and compiled, compared with the stored
-- outputs at the tolerances ONNX's own backend test uses (numpy's
-- assert_allclose with rtol 1e-3, atol 1e-7, NaN equal to NaN; integers
-- and bools exactly).
--
-- A case passes, or is unsupported: it fails to load or run with a message
-- saying "unsupported".  Anything else -- a wrong answer, another error --
-- fails the runner (a crash fails it by itself).  A case that draws random
-- numbers (a Bernoulli or Random* node, a Dropout in training with a ratio
-- above 0) has stored outputs from numpy's generator, which fuselab's does
-- not reproduce: it is "random", its outputs checked for shape, dtype and
-- their values' set or range, and counted apart.
--
-- "Compiled" is fl.compile's pipeline for the cpu backend, step by step
-- (capture, decompose, optimize, fuse, codegen), with every case's program
-- compiled in ONE compiler run (fl.compile_batch): one $CC call per graph
-- would take far longer than the suite allows.
--
--   fuselab tests/onnx/runner.lua [options]
--     --data DIR        the node tests (default /usr/share/libonnx-testdata/data/node)
--     --write FILE      write the table (doc/ONNX.md)
--     --check FILE      TAP: fail on a wrong answer, an error that is not
--                       "unsupported", or a table differing from FILE
--     --eager-only      skip the compiled runs (the sanitized build)
--     --source TEXT     where the cases come from, for the table's header
--                       (default: Debian's libonnx-testdata)
--     --test NAME       the test script that checks the table (default
--                       tests/onnx/conformance.sh)
--     --only PATTERN    cases whose name matches the Lua pattern (given
--                       again: any of them)
--     --cuda            compile for the cuda backend instead, each case's
--                       inputs on the device (a GPU or the CUDA
--                       emulator); prints the counts and TAP, no table
--     -v                one line per case

local args = {...}
local opt = {data = "/usr/share/libonnx-testdata/data/node"}
do
  local i = 1
  while i <= #args do
    local a = args[i]
    if a == "--only" then
      opt.only = opt.only or {}
      opt.only[#opt.only + 1] = args[i + 1]
      i = i + 1
    elseif a == "--data" or a == "--write" or a == "--check" or a == "--source" or a == "--test" then
      opt[a:sub(3)] = args[i + 1]
      i = i + 1
    elseif a == "--eager-only" then opt.eager_only = true
    elseif a == "--cuda" then opt.cuda = true
    elseif a == "-v" then opt.verbose = true
    else error("conformance: unknown argument " .. a) end
    i = i + 1
  end
end

local RTOL, ATOL = 1e-3, 1e-7
local t_start = fl.now()

local function ls(dir)
  local p = io.popen("ls -1 '" .. dir .. "' 2>/dev/null")
  local out = {}
  for l in p:lines() do out[#out + 1] = l end
  p:close()
  return out
end

local function exists(path)
  local f = io.open(path, "rb")
  if f then f:close() end
  return f ~= nil
end

local tap_n = 0
local function tap(ok, msg)
  tap_n = tap_n + 1
  print((ok and "ok " or "not ok ") .. tap_n .. " - " .. msg)
end

if opt.check and not exists(opt.data .. "/test_abs/model.onnx") then
  print("1..0 # SKIP libonnx-testdata is not installed (" .. opt.data .. ")")
  os.exit(0)
end

-- "unsupported" errors: the reason without the node's name, so the same
-- reason in different cases counts together
local function reason_of(msg)
  msg = tostring(msg):match("^[^\n]*")
  local r = msg:match("onnx: node '.-' %((.-)%): (.*)$")
  if r then
    local rest = msg:match("onnx: node '.-' %(.-%): (.*)$")
    local op = msg:match("onnx: node '.-' %(([^,)]*)[,)]")
    return (op or "?") .. ": " .. rest
  end
  r = msg:match("%.onnx: onnx: (.*)$") or msg:match("onnx: (.*)$") or msg
  r = r:gsub("tensor '[^']*'", "tensor"):gsub("input '[^']*'", "input"):gsub("output '[^']*'", "output")
  return r
end

local function is_unsupported(msg) return tostring(msg):find("unsupported", 1, true) ~= nil end
-- A few cases store inputs of other shapes than their model declares
-- (test_castlike_*: a [1] tensor for a declared [3,4]); the module refuses
-- them as it refuses any caller's: counted apart, as bad test data.
local function is_bad_data(msg) return tostring(msg):find("^onnx%.Model: input %d+ %('[^']*'%) must be %[") ~= nil end

-- A case whose stored outputs its own model cannot give, by the model
-- itself: ONNX 1.12's test_adam_multiple computed them with epsilon 0.01
-- and wrote the node without it (the default 1e-6 then holds); later
-- ONNX writes it, and that case passes.  A reason, or nil.
local function stale_data(name, g)
  if name ~= "test_adam_multiple" or not g then return nil end
  for _, n in ipairs(g.nodes) do
    if n.op == "Adam" and n.attrs.epsilon == nil then
      return "test data: outputs computed with an epsilon (0.01) the model does not set (ONNX 1.12's)"
    end
  end
  return nil
end

-- ONNX stores its DFT and STFT cases' outputs from NumPy's FFT, which
-- (NumPy 2) transforms float32 data in single precision: they err by a
-- few float32 units of the largest output, plain to see where the exact
-- value is 0 (test_dft_inverse stores 1.9e-7 for 0, past atol 1e-7).
-- A graph with a DFT or STFT node is compared so.
local function fft_graph(g)
  for _, n in ipairs(g and g.nodes or {}) do
    if n.op == "DFT" or n.op == "STFT" then return true end
  end
  return false
end

-- Compare result r with expected e: nil when equal, else what differs.
local function compare(r, e, expanded, fft)
  if not fl.is_tensor(r) then return "result is not a tensor" end
  if r.dtype ~= e.dtype then return ("dtype %s, expected %s"):format(r.dtype, e.dtype) end
  if #r.shape ~= #e.shape then return ("shape [%s], expected [%s]"):format(table.concat(r.shape, ","), table.concat(e.shape, ",")) end
  for i = 1, #r.shape do
    if r.shape[i] ~= e.shape[i] then return ("shape [%s], expected [%s]"):format(table.concat(r.shape, ","), table.concat(e.shape, ",")) end
  end
  if e:numel() == 0 then return nil end
  if e.dtype == "int64" or e.dtype == "bool" then
    local bad = r:ne(e):to("int64"):sum():item()
    if bad > 0 then return ("%d of %d elements differ"):format(bad, e:numel()) end
    return nil
  end
  local a, b = r:to("float32"), e:to("float32")
  -- ONNX's runner allows two units in the last place of a bfloat16 result
  -- (rtol 2^-6); a float16 result computed through float16 intermediates
  -- (an "_expanded" graph rounds every step) two of float16's (2^-9)
  local rtol = e.dtype == "bfloat16" and math.max(RTOL, 2 ^ -6)
    or (e.dtype == "float16" and expanded) and math.max(RTOL, 2 ^ -9) or RTOL
  local same = a:eq(b):to("int64")                           -- equal, infinities included
  local nan = (a:ne(a):to("int64") * b:ne(b):to("int64"))    -- both NaN
  -- an FFT case's outputs within 8 float32 units of their largest
  local atol = fft and math.max(ATOL, 2 ^ -20 * b:abs():amax():item()) or ATOL
  local close = (a - b):abs():le(b:abs() * rtol + atol):to("int64")
  local ok = (same + nan + close):gt(0):to("int64"):sum():item()
  if ok < e:numel() then
    local err = (a - b):abs():amax():item()
    return ("%d of %d elements beyond rtol %g atol %g (max abs error %g)"):format(
      e:numel() - ok, e:numel(), rtol, atol, err)
  end
  return nil
end

-- ---- random cases ---------------------------------------------------------
-- Which graph outputs come from a random draw, and how to check them,
-- from the nodes' ops and attributes and the values of their inputs known
-- before the call (the data set's graph inputs, the initializers): nil when
-- the case draws nothing.  A Dropout whose training_mode or ratio cannot be
-- read so counts as drawing.
local DRAWS = {Bernoulli = true, RandomUniform = true, RandomUniformLike = true,
  RandomNormal = true, RandomNormalLike = true, Multinomial = true}

local function random_checks(g, set)
  local known = {}
  for i, v in ipairs(g.inputs) do known[v.name] = set.inputs[i] end
  for _, init in ipairs(g.initializers) do known[init.name] = init.tensor end
  local function first(name, default)
    if name == nil or name == "" then return default end
    local t = known[name]
    if not fl.is_tensor(t) or t:numel() ~= 1 then return nil end
    return t:to("float64"):reshape({-1}):tolist()[1]
  end
  local checks, any = {}, false
  for _, n in ipairs(g.nodes) do
    if DRAWS[n.op] then
      any = true
      checks[n.outputs[1]] = {op = n.op, attrs = n.attrs}
    elseif n.op == "Dropout" and g.opset >= 12 and (n.inputs[3] or "") ~= "" then
      local training, ratio = first(n.inputs[3]), first(n.inputs[2], 0.5)
      if training ~= 0 and ratio ~= 0 then
        any = true
        local mask = n.outputs[2] ~= "" and n.outputs[2] or nil
        checks[n.outputs[1]] = {op = "Dropout", x = known[n.inputs[1]], ratio = ratio, mask = mask}
        if mask then checks[mask] = {op = "mask"} end
      end
    end
  end
  return any and checks or nil
end

local function meta_differs(r, e)
  if not fl.is_tensor(r) then return "result is not a tensor" end
  if r.dtype ~= e.dtype then return ("dtype %s, expected %s"):format(r.dtype, e.dtype) end
  local same = #r.shape == #e.shape
  for i = 1, #r.shape do same = same and r.shape[i] == e.shape[i] end
  if not same then return ("shape [%s], expected [%s]"):format(table.concat(r.shape, ","), table.concat(e.shape, ",")) end
end

local function count(b) return b:to("int64"):sum():item() end
local function both(a, b) return (a:to("int64") * b:to("int64")):gt(fl.zeros({}, {dtype = "int64"})) end
local function either(a, b) return (a:to("int64") + b:to("int64")):gt(fl.zeros({}, {dtype = "int64"})) end
local function f64(x) return fl.full({}, x, {dtype = "float64"}) end

-- The outputs res of a random case against the stored ones (for shape and
-- dtype) and what their draws allow: nil when all hold, else what does not.
local function check_random(checks, g, res, outputs)
  local at = {}
  for i, v in ipairs(g.outputs) do at[v.name] = i end
  for i, e in ipairs(outputs) do
    local r = res[i]
    local d = meta_differs(r, e)
    if d then return ("output %d: %s"):format(i, d) end
    local c = checks[g.outputs[i].name]
    local n, bad = r:numel(), 0
    if c and n > 0 and r.dtype ~= "bool" then
      local v = r:to("float64")
      if c.op == "Bernoulli" then
        bad = n - count(v:eq(f64(0))) - count(v:eq(f64(1)))
      elseif c.op == "RandomUniform" or c.op == "RandomUniformLike" then
        local lo, hi = c.attrs.low or 0, c.attrs.high or 1
        bad = n - count(both(v:ge(f64(lo)), v:lt(f64(hi))))
      elseif c.op == "RandomNormal" or c.op == "RandomNormalLike" then
        bad = n - count(both(v:eq(v), v:abs():lt(f64(math.huge))))
      elseif c.op == "Dropout" and c.ratio and fl.is_tensor(c.x) then
        -- each value 0 or x / (1 - ratio); where the mask is an output
        -- too, the one it says
        local kept = c.x:to("float64") * (1 / (1 - c.ratio))
        local near = (v - kept):abs():le(kept:abs() * f64(RTOL) + f64(ATOL))
        local zero = v:eq(f64(0))
        local m = c.mask and at[c.mask] and res[at[c.mask]]
        if fl.is_tensor(m) and m.dtype == "bool" and #m.shape == #v.shape then
          bad = n - count(fl.where(m, near, zero))
        else
          bad = n - count(either(near, zero))
        end
      end
    end
    if bad > 0 then return ("output %d: %d of %d values outside what a %s draw gives"):format(i, bad, n, c.op) end
  end
  return nil
end

-- One test data file of the kind m's value v declares.  Data written by
-- tests/onnx/gen_node.py before it wrote OptionalProto files holds an
-- optional's tensor as a plain TensorProto: read as such when it is one.
local function load_value(p, v)
  local ok, t, dt = pcall(fl.load_onnx_value, p, v.kind)
  if not ok and v.kind == "optional" and v.inner ~= "sequence" then
    local ok2, t2, dt2 = pcall(fl.load_onnx_value, p, "tensor")
    if ok2 then return true, t2, dt2 end
  end
  return ok, t, dt
end

-- Compare a value of any kind (a sequence is an array of tensors, an
-- optional nil or either) with the expected one: nil when equal.
local function compare_value(r, e, expanded, fft)
  if e == nil then return r ~= nil and "a value, expected an empty optional" or nil end
  if fl.is_tensor(e) then return compare(r, e, expanded, fft) end
  if type(r) ~= "table" or fl.is_tensor(r) then return "result is not a sequence" end
  if #r ~= #e then return ("a sequence of %d tensors, expected %d"):format(#r, #e) end
  for k = 1, #e do
    local d = compare(r[k], e[k], expanded, fft)
    if d then return ("element %d: %s"):format(k, d) end
  end
  return nil
end

-- ONNX's test data holds bfloat16 tensors as their uint16 bit patterns
-- (NumPy has no bfloat16): the values they stand for, as bfloat16.
local function bf16_bits(t)
  local vals = {}
  for i, b in ipairs(t:reshape({-1}):tolist()) do
    vals[i] = string.unpack("<f", string.pack("<I4", b << 16))
  end
  if #vals == 0 then return fl.zeros(t.shape, {dtype = "bfloat16"}) end
  return fl.tensor(vals, {dtype = "float32"}):reshape(t.shape):to("bfloat16")
end

-- The outputs res (1-based) of one data set: nil when they pass, else
-- what differs; and whether the set draws random numbers (checked so).
local function check_outputs(g, set, res, expanded)
  local checks = g and random_checks(g, set)
  if checks then return check_random(checks, g, res, set.outputs), true end
  local fft = fft_graph(g)
  for i = 1, set.outputs.n do
    local d = compare_value(res[i], set.outputs[i], expanded, fft)
    if d then return ("output %d: %s"):format(i, d), false end
  end
  return nil, false
end

local function snake(op)
  return (op:gsub("(%l)(%u)", "%1_%2"):gsub("(%u)(%u%l)", "%1_%2"):lower())
end

-- The op a case is about: the node op whose snake_case name starts the
-- case name (the longest such), else its first node's op.
local function case_op(name, path)
  local ok, g = pcall(fl._onnx_read, path)
  if not ok then return name:gsub("^test_", "") end
  local best, stem = nil, name:gsub("^test_", "")
  for _, n in ipairs(g.nodes) do
    local s = snake(n.op)
    if (stem == s or stem:sub(1, #s + 1) == s .. "_" or stem:sub(1, #s) == s:gsub("_", ""))
       and (not best or #s > #snake(best)) then best = n.op end
  end
  return best or (g.nodes[1] and g.nodes[1].op) or stem
end

local cases = {}
for _, name in ipairs(ls(opt.data)) do
  local want = not opt.only
  for _, pat in ipairs(opt.only or {}) do want = want or name:match(pat) ~= nil end
  if name:match("^test_") and want then cases[#cases + 1] = name end
end

local results = {}       -- name -> {op=, status="pass"|"unsupported"|"fail", reason=, cstatus=}
local n_broken = 0       -- compiled with graph breaks (sizes from input data)
local compiled = {}      -- {case=, k=, sets=}
local failures = {}

local function finish(name, st, reason)
  local r = results[name]
  r.status, r.reason = st, reason
  if st == "fail" then failures[#failures + 1] = name .. ": " .. reason end
end

for _, name in ipairs(cases) do
  local dir = opt.data .. "/" .. name
  local path = dir .. "/model.onnx"
  results[name] = {op = case_op(name, path)}
  local ok, m = pcall(fl.load_onnx, path)
  if not ok then
    if is_unsupported(m) then finish(name, "unsupported", reason_of(m))
    else finish(name, "fail", "load: " .. tostring(m)) end
    goto continue
  end
  do
    local sets = {}
    for _, sd in ipairs(ls(dir)) do
      if sd:match("^test_data_set_%d+$") then
        local set = {inputs = {}, outputs = {}}
        local bad
        for i = 0, #m.inputs - 1 do
          local p = ("%s/%s/input_%d.pb"):format(dir, sd, i)
          local okt, t, dt = load_value(p, m.inputs[i + 1])
          if not okt then bad = t break end
          if dt == "uint16" and m.inputs[i + 1].dtype == "bfloat16" then t = bf16_bits(t) end
          set.inputs[i + 1] = t
        end
        for i = 0, #m.outputs - 1 do
          if bad then break end
          local p = ("%s/%s/output_%d.pb"):format(dir, sd, i)
          local okt, t, dt = load_value(p, m.outputs[i + 1])
          if not okt then bad = t break end
          if dt == "uint16" and m.outputs[i + 1].dtype == "bfloat16" then t = bf16_bits(t) end
          set.outputs[i + 1] = t
        end
        if bad and not exists(bad:match("^load_onnx_data: (.-%.pb): ") or "") then
          -- data written before sequences and optionals had files (an
          -- older tests/onnx/gen_node.py)
          for _, v in ipairs(m.inputs) do if v.kind ~= "tensor" then bad = nil end end
          for _, v in ipairs(m.outputs) do if v.kind ~= "tensor" then bad = nil end end
          if not bad then bad = "test data: no file for a sequence or optional value (unsupported)" end
        end
        if bad then set.bad = bad end
        set.inputs.n, set.outputs.n = #m.inputs, #m.outputs     -- an empty optional is nil
        sets[#sets + 1] = set
      end
    end
    local verdict, why = "pass", nil
    local okg, g = pcall(fl._onnx_read, path)
    if not okg then g = nil end
    local expanded = name:find("_expanded", 1, true) ~= nil
    for _, set in ipairs(sets) do
      if set.bad then
        verdict, why = is_unsupported(set.bad) and "unsupported" or "fail", reason_of(set.bad)
        break
      end
      local res = table.pack(pcall(m, table.unpack(set.inputs, 1, set.inputs.n)))
      if not res[1] then
        verdict, why = is_unsupported(res[2]) and "unsupported" or "fail", reason_of(res[2])
        if is_bad_data(res[2]) then
          verdict, why = "unsupported", "test data: stored inputs differ from the declared input shapes"
        elseif verdict == "fail" then why = "eager: " .. tostring(res[2]) end
        break
      end
      local d, drawn = check_outputs(g, set, {table.unpack(res, 2, res.n)}, expanded)
      if d and stale_data(name, g) then verdict, why = "unsupported", stale_data(name, g) break end
      if d then verdict, why = "fail", "eager: " .. d break end
      if drawn then verdict = "random" end
    end
    finish(name, verdict, why)
    if (verdict == "pass" or verdict == "random") and not opt.eager_only then
      -- capture with the first data set, compile later in one batch
      -- sequences and optionals are Lua values, no graph's: such a model
      -- compiles through fl.compile, a graph break at its inputs
      local held = false
      for _, v in ipairs(m.inputs) do held = held or v.kind ~= "tensor" end
      for _, v in ipairs(m.outputs) do held = held or v.kind ~= "tensor" end
      local okc, k = false, "sequence or optional values"
      if not held then
        okc, k = pcall(function()
          local g = fl.capture(m, table.unpack(sets[1].inputs))
          return g:decompose{quiet = true}:optimize{quiet = true}:fuse():codegen(opt.cuda and "cuda" or "cpu",
                                                                                ("fl_c%d_"):format(#compiled))
        end)
      end
      if okc then compiled[#compiled + 1] = {case = name, k = k, sets = sets, g = g}
      elseif opt.cuda then
        -- (fl.compile's graph breaks and sequences are the cpu runs' business)
        results[name].cstatus = (held or is_unsupported(k)) and "unsupported" or "fail"
        results[name].creason = tostring(k)
        if results[name].cstatus == "fail" then failures[#failures + 1] = name .. ": cuda: " .. tostring(k) end
      elseif held or is_unsupported(k) and tostring(k):find("computed from graph inputs under capture", 1, true) then
        -- a size from input data: one graph cannot hold it, fl.compile takes
        -- a graph break there and compiles the graphs around it
        local okf, why = pcall(function()
          local cm = fl.compile(m, {backend = "cpu"})
          for _, set in ipairs(sets) do
            local res = table.pack(cm(table.unpack(set.inputs, 1, set.inputs.n)))
            local d = check_outputs(g, set, res, expanded)
            if d then error("compiled with graph breaks: " .. d, 0) end
          end
          local st = cm:stats()
          if st.fallbacks > 0 then error("fl.compile fell back to eager (unsupported)", 0) end
          return st
        end)
        if okf then
          results[name].cstatus, results[name].cbreak = verdict, true
          n_broken = n_broken + 1
        else
          results[name].cstatus = is_unsupported(why) and "unsupported" or "fail"
          results[name].creason = is_unsupported(why) and not held and tostring(k) or tostring(why)
          if results[name].cstatus == "fail" then failures[#failures + 1] = name .. ": " .. tostring(why) end
        end
      else
        results[name].cstatus = is_unsupported(k) and "unsupported" or "fail"
        results[name].creason = tostring(k)
        if results[name].cstatus == "fail" then failures[#failures + 1] = name .. ": capture: " .. tostring(k) end
      end
    end
  end
  ::continue::
  if opt.verbose then
    local r = results[name]
    io.stderr:write(("%-60s %s %s\n"):format(name, r.status, r.reason or ""))
  end
end
local t_eager = fl.now() - t_start

-- compile every captured program in one compiler run, then run them
local t_c0 = fl.now()
-- (in chunks: each compiler run stays well inside FUSELAB_COMPILE_TIMEOUT)
local CHUNK, batch_failed = 64, {}
for first = 1, opt.cuda and 0 or #compiled, CHUNK do      -- (cuda: each as it first runs)
  local list = {}
  for i = first, math.min(first + CHUNK - 1, #compiled) do list[#list + 1] = compiled[i].k end
  local okb, err = pcall(fl.compile_batch, list)
  if not okb then
    failures[#failures + 1] = "compile_batch: " .. tostring(err) .. "\n" .. tostring(list[1]:log()):sub(1, 3000)
    for i = first, first + #list - 1 do batch_failed[i] = true end
  end
end
local t_compile = fl.now() - t_c0
for ci, c in ipairs(compiled) do
  local r = results[c.case]
  r.cstatus = batch_failed[ci] and "fail" or r.status
  for _, set in ipairs(batch_failed[ci] and {} or c.sets) do
    -- a set of other shapes than the captured one runs where dims allow
    local ins = set.inputs
    if opt.cuda then
      ins = {}
      for i = 1, set.inputs.n do
        local v = set.inputs[i]
        ins[i] = fl.is_tensor(v) and v:cuda() or v
      end
    end
    local res = table.pack(pcall(c.k.run, c.k, table.unpack(ins, 1, set.inputs.n)))
    for i = 2, opt.cuda and res.n or 0 do
      if fl.is_tensor(res[i]) then res[i] = res[i]:cpu() end
    end
    if not res[1] then
      r.cstatus, r.creason = "fail", "compiled: " .. tostring(res[2])
    else
      local d = check_outputs(c.g, set, {table.unpack(res, 2, res.n)}, c.case:find("_expanded", 1, true) ~= nil)
      if d then r.cstatus, r.creason = "fail", "compiled: " .. d end
    end
    if r.cstatus == "fail" then
      failures[#failures + 1] = c.case .. ": " .. r.creason
      break
    end
  end
end
local t_total = fl.now() - t_start

if opt.cuda then
  -- the cases that pass eagerly, compiled for CUDA: counts and TAP only
  local n, pass, unsup = 0, 0, 0
  for _, name in ipairs(cases) do
    local r = results[name]
    if r.status == "pass" or r.status == "random" then
      n = n + 1
      if r.cstatus == "pass" or r.cstatus == "random" then pass = pass + 1
      elseif r.cstatus == "unsupported" then unsup = unsup + 1 end
    end
  end
  print("1..2")
  tap(#failures == 0, ("no wrong answer and no error other than unsupported on cuda (%d failures)"):format(#failures))
  for _, f in ipairs(failures) do print("# " .. f:gsub("\n", "\n# ")) end
  tap(pass > 0 and pass + unsup == n, ("%d of %d cases that pass eagerly compiled for CUDA give the stored outputs, "
      .. "%d unsupported there; %.1f s"):format(pass, n, unsup, t_total))
  os.exit(#failures == 0 and pass + unsup == n and 0 or 1)
end

-- ---- the table ------------------------------------------------------------
local n_pass, n_unsup, n_cpass, n_random, n_crandom = 0, 0, 0, 0, 0
local by_op, ops = {}, {}
local reasons, reason_list = {}, {}
for _, name in ipairs(cases) do
  local r = results[name]
  if not by_op[r.op] then by_op[r.op] = {cases = 0, pass = 0, cpass = 0, random = 0, reasons = {}}; ops[#ops + 1] = r.op end
  local o = by_op[r.op]
  o.cases = o.cases + 1
  if r.status == "pass" then n_pass = n_pass + 1; o.pass = o.pass + 1 end
  if r.cstatus == "pass" then n_cpass = n_cpass + 1; o.cpass = o.cpass + 1 end
  if r.status == "random" then n_random = n_random + 1; o.random = o.random + 1 end
  if r.cstatus == "random" then n_crandom = n_crandom + 1 end
  if r.cstatus == "unsupported" then
    local cr = "compiled only: " .. reason_of(r.creason)
    if not reasons[cr] then reasons[cr] = 0; reason_list[#reason_list + 1] = cr end
    reasons[cr] = reasons[cr] + 1
  end
  if r.status == "unsupported" then
    n_unsup = n_unsup + 1
    o.reasons[r.reason] = (o.reasons[r.reason] or 0) + 1
    if not reasons[r.reason] then reasons[r.reason] = 0; reason_list[#reason_list + 1] = r.reason end
    reasons[r.reason] = reasons[r.reason] + 1
  end
end
table.sort(ops, function(a, b) return a:lower() < b:lower() end)
table.sort(reason_list, function(a, b)
  if reasons[a] ~= reasons[b] then return reasons[a] > reasons[b] end
  return a < b
end)

local function esc(s) return (tostring(s):gsub("|", "\\|"):gsub("\n", " ")) end

local function table_text()
  local L = {}
  L[#L + 1] = "# ONNX conformance"
  L[#L + 1] = ""
  local doc = (opt.write or opt.check or "doc/ONNX.md"):match("doc/.*$") or "doc/ONNX.md"
  L[#L + 1] = ("Generated by `fuselab tests/onnx/runner.lua --write %s` (do not edit):"):format(doc)
  L[#L + 1] = opt.source or "ONNX's backend node tests as Debian's libonnx-testdata installs them\n" ..
    "(/usr/share/libonnx-testdata/data/node)"
  L[#L] = L[#L] .. ", each case loaded with `fl.load_onnx`, run"
  L[#L + 1] = "eagerly and compiled for the cpu backend, and compared with its stored outputs at"
  L[#L + 1] = ("ONNX's tolerances (rtol %g, atol %g, NaN equal to NaN; integers and bools exactly;"):format(RTOL, ATOL)
  L[#L + 1] = "bfloat16 within two units in the last place, as ONNX's runner; float16 through float16"
  L[#L + 1] = "intermediates (an `_expanded` case) within two; the DFT and STFT cases, whose outputs"
  L[#L + 1] = "NumPy's FFT computed in float32, within 8 float32 units of their largest output)."
  L[#L + 1] = "A case passes or is unsupported (a load-time or run-time error naming the node, the op,"
  L[#L + 1] = "the opset and what is missing); a wrong answer or any other error fails the suite's"
  L[#L + 1] = ("test (%s), and so does a table that differs from this one."):format(opt.test or "tests/onnx/conformance.sh")
  L[#L + 1] = ""
  L[#L + 1] = ("**%d cases: %d pass eagerly, %d pass compiled, %d random, %d unsupported, %d fail.**"):format(
    #cases, n_pass, n_cpass, n_random, n_unsup, #cases - n_pass - n_random - n_unsup)
  L[#L + 1] = ""
  L[#L + 1] = ("Random: %d cases draw random numbers (a Bernoulli or Random* node, a Dropout in training"):format(n_random)
  L[#L + 1] = "with a ratio above 0), whose stored outputs come from numpy's generator: their values are"
  L[#L + 1] = "not comparable; their shapes, dtypes and the values' set or range are checked, eagerly and"
  L[#L + 1] = ("compiled (%d of them compiled)."):format(n_crandom)
  L[#L + 1] = ""
  L[#L + 1] = ("Compiled: one graph through capture, decompose, optimize, fuse and codegen; %d cases"):format(n_broken)
  L[#L + 1] = "whose sizes or axes come from input data compile through `fl.compile` with a graph break"
  L[#L + 1] = "where the values are read (one graph cannot hold them)."
  L[#L + 1] = ""
  L[#L + 1] = "## Unsupported, by cases"
  L[#L + 1] = ""
  L[#L + 1] = "| cases | reason |"
  L[#L + 1] = "|---:|---|"
  for _, r in ipairs(reason_list) do L[#L + 1] = ("| %d | %s |"):format(reasons[r], esc(r)) end
  L[#L + 1] = ""
  L[#L + 1] = "## Per op"
  L[#L + 1] = ""
  L[#L + 1] = "| op | cases | pass (eager) | pass (compiled) | unsupported: reason |"
  L[#L + 1] = "|---|---:|---:|---:|---|"
  for _, op in ipairs(ops) do
    local o = by_op[op]
    local rs = {}
    for r, n in pairs(o.reasons) do rs[#rs + 1] = ("%d: %s"):format(n, esc(r)) end
    table.sort(rs)
    if o.random > 0 then table.insert(rs, 1, ("%d random: shape, dtype and range checked, values not comparable"):format(o.random)) end
    L[#L + 1] = ("| %s | %d | %d | %d | %s |"):format(esc(op), o.cases, o.pass, o.cpass, table.concat(rs, "; "))
  end
  return table.concat(L, "\n") .. "\n"
end

io.stderr:write(("conformance: %d cases, %d pass eagerly, %d compiled, %d random (%d compiled), %d unsupported, %d fail; "
  .. "%.1f s (eager %.1f s, compiling %d programs in batches of 64 %.1f s)\n"):format(#cases, n_pass, n_cpass,
  n_random, n_crandom, n_unsup, #failures, t_total, t_eager, #compiled, t_compile))

if opt.write then
  local f = assert(io.open(opt.write, "w"))
  f:write(table_text())
  f:close()
end

if opt.check then
  print("1..4")
  tap(#failures == 0, ("no wrong answer and no error other than unsupported (%d failures)"):format(#failures))
  for i = 1, math.min(#failures, 30) do print("# " .. failures[i]:gsub("\n", "\n# ")) end
  local f = io.open(opt.check, "r")
  local committed = f and f:read("a") or ""
  if f then f:close() end
  local want_pass = tonumber(committed:match("(%d+) pass eagerly")) or 0
  local want_cpass = tonumber(committed:match("(%d+) pass compiled")) or 0
  tap(n_pass >= want_pass, ("eager pass count %d >= the committed %d"):format(n_pass, want_pass))
  if opt.eager_only then
    tap(true, "# SKIP compiled runs (eager only here)")
    tap(true, "# SKIP table comparison (eager only here)")
  else
    tap(n_cpass >= want_cpass, ("compiled pass count %d >= the committed %d"):format(n_cpass, want_cpass))
    local now = table_text()
    tap(now == committed, opt.check .. " is up to date (regenerate with --write)")
    if now ~= committed then
      local a, b = {}, {}
      for l in committed:gmatch("[^\n]*") do a[#a + 1] = l end
      for l in now:gmatch("[^\n]*") do b[#b + 1] = l end
      for i = 1, math.max(#a, #b) do
        if a[i] ~= b[i] then print("# committed: " .. tostring(a[i])); print("# now:       " .. tostring(b[i])) break end
      end
    end
  end
elseif #failures > 0 then
  for _, f in ipairs(failures) do io.stderr:write("FAIL ", f, "\n") end
  os.exit(1)
end
