-- mutation.lua -- compiled equals eager, always: in-place writes through
-- views of inputs and weights, views returned as views, guards on what the
-- function reads (module fields, tables, helpers' upvalues, globals of other
-- chunks, _ENV), compiled functions called inside compiled ones, and
-- graphs the compiler cannot take falling back.  Every case runs the
-- function eagerly and compiled on fresh copies of the same inputs, three
-- calls each, and compares the results and what the inputs hold afterwards
-- (float32, rtol 1e-5, atol 1e-6: the same arithmetic, grouped
-- differently).  On the CPU always; with backend "cuda" as well where a
-- CUDA device (or the emulator) is there.  Ends with a random campaign of
-- writes through random views, time-bounded.
local fl = fl or require "fuselab"
local t = require "tap"

local function close(a, b) return fl.allclose(a, b, 1e-5, 1e-6) end

local backends = {"cpu"}
if fl.cuda_available and fl.cuda_available() == true then backends[#backends + 1] = "cuda" end

local function clone(v)
  if fl.is_tensor(v) then return v:contiguous() + 0 end
  return v
end

-- run f eagerly and compiled on copies of mk(call)'s arguments; the
-- results and the arguments after the call must agree
local function same_as_eager(name, f, mk, opts)
  opts = opts or {}
  for _, be in ipairs(backends) do
    local cf = fl.compile(f, {backend = be})
    local ok, why = true, nil
    for call = 1, opts.calls or 3 do
      if opts.before then opts.before(call) end
      local args = table.pack(mk(call))
      local ea, ca = {}, {}
      for i = 1, args.n do ea[i], ca[i] = clone(args[i]), clone(args[i]) end
      if opts.seed then fl.manual_seed(opts.seed + call) end
      local er = table.pack(f(table.unpack(ea, 1, args.n)))
      if opts.between then opts.between(call) end
      if opts.seed then fl.manual_seed(opts.seed + call) end
      local okc, cr = pcall(function() return table.pack(cf(table.unpack(ca, 1, args.n))) end)
      if not okc then ok, why = false, "call " .. call .. ": " .. tostring(cr) break end
      for i = 1, er.n do
        if fl.is_tensor(er[i]) and not close(er[i], cr[i]:cpu()) then
          ok, why = false, ("call %d: result %d differs"):format(call, i)
        end
      end
      for i = 1, args.n do
        if fl.is_tensor(ea[i]) and not close(ea[i], ca[i]:cpu()) then
          ok, why = false, ("call %d: argument %d after the call differs"):format(call, i)
        end
      end
      if opts.after then
        local good, w = opts.after(er, cr, ea, ca, cf)
        if not good then ok, why = false, ("call %d: %s"):format(call, w) end
      end
      if not ok then break end
    end
    t.ok(ok, ("%s [%s]"):format(name, be))
    if not ok then t.diag(why) end
  end
end

local function grid(call) return fl.arange(12):to("float32"):reshape{3, 4} / 7 + call end

-- ---- writes through views of an argument ------------------------------------
same_as_eager("narrow then fill_ writes the argument, the read after sees it",
  function(a) a:narrow(1, 2, 1):fill_(9); return a + 0 end, grid)
same_as_eager("through a transpose", function(a) a:transpose(1, 2):narrow(1, 2, 1):fill_(7); return a * 2 end, grid)
same_as_eager("through a reshape", function(a) a:reshape{12}:narrow(1, 3, 4):fill_(-1); return a:sum() end, grid)
same_as_eager("through a view", function(a) a:view{2, 6}:narrow(2, 2, 3):mul_(3); return a end, grid)
same_as_eager("through a permute", function(a)
  local b = a:reshape{3, 2, 2}:permute{3, 1, 2}
  b:narrow(1, 1, 1):fill_(0)
  return a:sum(1)
end, grid)
same_as_eager("through unsqueeze and squeeze", function(a)
  a:unsqueeze(1):squeeze(1):narrow(2, 4, 1):fill_(4)
  return a * 1
end, grid)
same_as_eager("through a[i]", function(a) a[2]:fill_(5); return a + 1 end, grid)
same_as_eager("a[i] = number", function(a) a[3] = 8; return a:sum(2) end, grid)
same_as_eager("through a slice of step 1", function(a) a:slice(2, 2, 4):add_(10); return a end, grid)
same_as_eager("through a slice of step 2 (a break)", function(a) a:slice(2, 1, 5, 2):fill_(0); return a:exp() end, grid)
same_as_eager("add_ sub_ mul_ div_ on the argument", function(a, b)
  a:add_(b); a:sub_(1); a:mul_(b); a:div_(2)
  return a:relu()
end, function(c) return grid(c), grid(c) * 0.5 end)
same_as_eager("copy_ broadcasts and converts", function(a, b) a:narrow(1, 1, 2):copy_(b); return a end,
  function(c) return grid(c), fl.full({1, 4}, c) end)
same_as_eager("copy_ of int64 into float32", function(a, i) a[1]:copy_(i); return a end,
  function(c) return grid(c), fl.arange(4) * c end)
same_as_eager("an int64 argument add_", function(i) i:add_(3); return i * 2 end,
  function(c) return fl.arange(6) + c end)
same_as_eager("overlapping source and destination", function(a)
  a:narrow(1, 1, 1):copy_(a:narrow(1, 2, 1)); return a
end, grid)
same_as_eager("a read after the write sees it; a value computed before does not",
  function(a) local v = a:narrow(1, 1, 1); local b = v * 1; a:fill_(2); return b + v end, grid)
same_as_eager("two writes, then views made before both", function(a)
  local v = a:transpose(1, 2)
  a:narrow(2, 1, 2):fill_(1)
  a:narrow(1, 2, 2):mul_(3)
  return v:contiguous()
end, grid)
same_as_eager("a write into a value computed inside", function(a)
  local z = a:exp(); z:narrow(2, 1, 1):zero_(); return z:sum(1)
end, grid)
same_as_eager("a write into a tensor made inside", function(a)
  local z = fl.zeros(3, 4); z:narrow(1, 1, 1):fill_(1); return z + a
end, grid)
same_as_eager("a write after a graph break", function(a)
  local v = a:narrow(1, 1, 1); fl.graph_break(); v:fill_(3); return a * 1
end, grid)
same_as_eager("an eager view of the argument written after a break", function(a)
  local s = (a:sum()):item(); a:narrow(1, 3, 1):fill_(s); return a:sum()
end, grid)

-- symbolic sizes (automatic dynamic): writes whose views need no size
-- computed stay in the graph
do
  local f = function(x, y)
    local h = x * 2
    h:add_(y)
    x:transpose(1, 2):narrow(1, 1, 1):fill_(3)
    h:narrow(2, 2, 1):zero_()
    return h
  end
  local cf = fl.compile(f)
  local ok = true
  for _, B in ipairs{3, 5, 7, 9} do
    local x, y = fl.randn(B, 4), fl.randn(B, 4)
    local x2 = x + 0
    ok = ok and close(f(x, y), cf(x2, y)) and close(x, x2)
  end
  t.ok(ok, "writes with a symbolic batch size: right at every size")
  t.ok(cf:stats().compiles == 2 and cf:stats().graph_breaks == 0, "one recompile (the size becomes symbolic), no break")
end

-- a view the caller writes afterwards: eager returns it sharing storage
same_as_eager("a returned view shares the argument's storage", function(a) return a:view{-1} end, grid, {
  after = function(er, cr, ea, ca)
    ea[1]:fill_(4); ca[1]:fill_(4)
    return close(er[1], cr[1]:cpu()) and cr[1][1] == 4, "the view did not see the write"
  end})
same_as_eager("a returned transpose shares it too", function(a) return a:transpose(1, 2), a * 2 end, grid, {
  after = function(er, cr, ea, ca)
    er[1]:narrow(1, 1, 1):fill_(-3); cr[1]:narrow(1, 1, 1):fill_(-3)
    return close(ea[1], ca[1]:cpu()), "a write through the returned view did not reach the argument"
  end})
same_as_eager("a returned reshape with dynamic sizes shares it", function(a) return a:reshape(a.shape[1] * 4) end,
  function(c) return fl.randn(c + 2, 4) end, {
  after = function(er, cr, ea, ca)
    ca[1]:fill_(1)
    return cr[1]:sum():item() == cr[1].shape[1], "the view did not see the write"
  end})

-- ---- writes into weights: the KV-cache pattern, module buffers ------------------
do
  local kv_e, kv_c = fl.zeros(2, 6, 3), fl.zeros(2, 6, 3)
  local function make(kv) return function(new, pos) kv:narrow(2, pos, 1):copy_(new); return kv:sum(2) end end
  local fe, fc = make(kv_e), fl.compile(make(kv_c))
  local ok = true
  for pos = 1, 6 do
    local new = fl.randn(2, 1, 3)
    ok = ok and close(fe(new, pos), fc(new, pos))
  end
  t.ok(ok and close(kv_e, kv_c), "the KV cache kv:narrow(2, pos, 1):copy_(new) is written in place, every position")
end
do
  local m = nn.Linear(4, 2)
  m.count = fl.zeros(1)
  m.forward = function(self, x) self.count:add_(1); return nn.Linear.forward(self, x) end
  local cm = fl.compile(m)
  local x = fl.randn(3, 4)
  local ok = true
  for _ = 1, 4 do ok = ok and close(cm(x), x:matmul(m.weight:transpose(1, 2)) + m.bias) end
  t.ok(ok and m.count:item() == 4, "a module buffer updated in forward counts every compiled call")
  t.is(cm:stats().compiles, 1, "and needs one compile")
end
do
  local w = fl.ones(2, 2)
  local cf = fl.compile(function(x) w:mul_(2); return x + w end)
  local r
  for _ = 1, 3 do r = cf(fl.zeros(2, 2)) end
  t.ok(close(r, fl.full({2, 2}, 8)) and close(w, fl.full({2, 2}, 8)), "a weight updated in place: 2, 4, 8")
end

-- the write is in the graph: the listing ends with it
do
  local g = fl.capture(function(a) a:narrow(1, 2, 1):fill_(9); return a + 0 end, fl.zeros(3, 3))
  local text = tostring(g)
  t.ok(text:find("write %%%d+ into %%0 %(input a%)"), "the listing shows the write-back into the input")
  t.is(#g:writebacks(), 1, "g:writebacks() lists it")
  local a = fl.zeros(3, 3)
  g:run(a)
  t.is(a:sum():item(), 27, "g:run writes back too")
  local b = fl.zeros(3, 3)
  g:decompose{quiet = true}:optimize{quiet = true}:fuse():codegen("cpu"):run(b)
  t.is(b:sum():item(), 27, "and so does the generated program after every pass")
  local c = fl.zeros(3, 3)
  g:run_reference(c)
  t.is(c:sum():item(), 27, "and the reference interpreter")
end

-- writing through an expanded view is refused, compiled as eagerly
do
  local f = function(a) a:expand(3, 4):fill_(1); return a end
  local oke, ee = pcall(f, fl.zeros(1, 4))
  local okc, ec = pcall(fl.compile(f), fl.zeros(1, 4))
  t.ok(not oke and not okc and tostring(ec):find("expanded"), "a write through an expanded view: the same refusal")
end

-- ---- guards on everything the function reads --------------------------------------
local function guarded(name, obj, f, change, want_reason)
  local cf = fl.compile(obj or f)
  local x = grid(0)
  local r1, e1 = cf(x), f(x)
  change()
  local r2, e2 = cf(x), f(x)
  local reason = cf:stats().recompile_reasons[1]
  t.ok(close(r1, e1) and close(r2, e2), name .. ": the new value is used")
  if want_reason then t.is(reason, want_reason, name .. ": the recompile names what changed") end
end
do
  local sm = nn.Softmax(2)
  guarded("nn.Softmax's dim", sm, function(x) return sm(x) end, function() sm.dim = 1 end,
          "self.dim: expected 2, got 1")
  local ln = nn.LayerNorm(4)
  guarded("nn.LayerNorm's eps", ln, function(x) return ln(x) end, function() ln.eps = 10 end,
          "self.eps: expected 1e-05, got 10")
  local cfg = {scale = 2}
  guarded("a field of a table", nil, function(x) return x * cfg.scale end, function() cfg.scale = 3 end,
          "cfg.scale: expected 2, got 3")
  local k = 2
  local function helper(x) return x * k end
  guarded("an upvalue of a called helper", nil, function(x) return helper(x) + 1 end, function() k = 5 end,
          "helper[upvalue k]: expected 2, got 5")
  SCALE_MUTATION_TEST = 2
  local other = load("return function(x) return x * SCALE_MUTATION_TEST end", "=other_chunk")()
  guarded("a global read by a function of another chunk", nil, function(x) return other(x) end,
          function() SCALE_MUTATION_TEST = 7 end, "global 'SCALE_MUTATION_TEST': expected 2, got 7")
  guarded("rawget(_ENV, name)", nil, function(x) return x * rawget(_ENV, "SCALE_MUTATION_TEST") end,
          function() SCALE_MUTATION_TEST = 9 end)
  guarded("pairs(_ENV)", nil, function(x)
    local n = 0
    for key, v in pairs(_ENV) do if key == "SCALE_MUTATION_TEST" then n = v end end
    return x * n
  end, function() SCALE_MUTATION_TEST = 4 end)
  local m = setmetatable({w = 3}, {__call = function(self, x) return x * self.w end})
  guarded("a field of a custom module", m, function(x) return m(x) end, function() m.w = 5 end,
          "self.w: expected 3, got 5")
  local bn = nn.BatchNorm2d(3)
  local xb = fl.randn(2, 3, 4, 4)
  local cb = fl.compile(bn)
  local okb = close(cb(xb), bn(xb))
  bn:eval()
  okb = okb and close(cb(xb), bn(xb))
  t.ok(okb, "the training flag: BatchNorm2d switched to eval uses its running statistics")
  local dr = nn.Dropout(0.5)
  local cd = fl.compile(dr)
  fl.manual_seed(3); local d1 = cd(fl.ones(64))
  fl.manual_seed(3); local e1 = dr(fl.ones(64))
  dr.p = 0.25
  fl.manual_seed(3); local d2 = cd(fl.ones(64))
  fl.manual_seed(3); local e2 = dr(fl.ones(64))
  t.ok(close(d1, e1) and close(d2, e2), "nn.Dropout's p")
end
do
  -- a field the call itself assigns is a side effect: the Lua runs each call
  local state = {calls = 0}
  local cf = fl.compile(function(x) state.calls = state.calls + 1; return x * 2 end)
  for _ = 1, 3 do cf(grid(0)) end
  t.is(state.calls, 3, "a counter the function keeps counts every compiled call")
end

-- ---- compiled inside compiled -----------------------------------------------------
do
  local inner = fl.compile(function(x) return x * 2 + 1 end)
  local outer = fl.compile(function(x) return inner(x):relu() end)
  local x = fl.randn(3, 4)
  t.ok(close(outer(x), (x * 2 + 1):relu()), "a compiled function called inside a compiled one")
  t.ok(outer:stats().graph_breaks == 0 and #outer:graphs() == 1, "is inlined: one graph, no break")
  local g = fl.capture(function(y) return inner(y) * 3 end, x)
  t.is(#g:ops(), 3, "fl.capture inlines it too")
  local blk = nn.Linear(4, 4)
  local m = setmetatable({blk = fl.compile(blk)}, {__call = function(self, y) return self.blk(y):relu() end})
  local cm = fl.compile(m)
  t.ok(close(cm(x), m(x)), "a compiled submodule inside a compiled module")
  blk.weight = fl.randn(4, 4)
  t.ok(close(cm(x), m(x)), "its new weight is seen")
  t.ok((cm:stats().recompile_reasons[1] or ""):find("blk.weight", 1, true), "through a guard that names it")
end

-- ---- compiled never fails where eager works -----------------------------------------
for _, c in ipairs{
  {"softmax over a dim of size 0", function(x) return x:softmax(2) end, {3, 0}},
  {"log_softmax over a dim of size 0", function(x) return x:log_softmax(1) end, {0, 5}},
  {"a sum over a dim of size 0", function(x) return x:sum(2) end, {3, 0}},
} do
  local x = fl.randn(table.unpack(c[3]))
  local ok, r = pcall(fl.compile(c[2]), x)
  t.ok(ok and close(r, c[2](x)), c[1] .. ": compiled gives eager's (empty) result")
end

-- ---- a random campaign: writes through random views ---------------------------------
-- Each case: an argument of a random shape, a chain of 1-3 random views
-- (narrow, transpose, reshape, unsqueeze, a[i]), a random write through
-- it (fill_, add_, mul_, copy_ of a random tensor), reads before and after
-- it.  Time-bounded: reports how many ran.
do
  math.randomseed(11)
  local function random_view(x)
    local k = math.random(5)
    local s = x.shape
    if k == 1 then
      local d = math.random(#s)
      if s[d] < 1 then return x end
      local st = math.random(s[d]); return x:narrow(d, st, math.random(s[d] - st + 1))
    elseif k == 2 and #s >= 2 then
      local a, b = math.random(#s), math.random(#s); return x:transpose(a, b)
    elseif k == 3 then   -- (a copy, where the view is not contiguous: eager loses the write too)
      return x:reshape{-1}
    elseif k == 4 then
      return x:unsqueeze(math.random(#s + 1))
    elseif #s >= 2 and s[1] >= 1 then
      return x[math.random(s[1])]
    end
    return x
  end
  local deadline, ran, bad, errors = fl.now() + 40, 0, nil, 0
  for case = 1, 150 do
    if fl.now() > deadline then break end
    local shape = {math.random(4), math.random(5)}
    if math.random(2) == 1 then shape[3] = math.random(3) end
    local chain = {}
    for i = 1, math.random(3) do chain[i] = math.random(1000) end
    local wkind, seed = math.random(4), math.random(1000)
    local f = function(a)
      math.randomseed(seed)
      local before = a:sum(1)
      local v = a
      for _ = 1, #chain do v = random_view(v) end
      if wkind == 1 then v:fill_(seed % 7)
      elseif wkind == 2 then v:add_(1.5)
      elseif wkind == 3 then v:mul_(v)
      else v:copy_(fl.full(v.shape, -2)) end
      return before, a * 1, v * 1
    end
    local cf = fl.compile(f)
    local same = true
    for _ = 1, 2 do                 -- the second call runs the cached graph (or replays)
      local x = fl.randn(table.unpack(shape))
      local ea, ca = x + 0, x + 0
      local er = table.pack(pcall(f, ea))
      local cr = table.pack(pcall(cf, ca))
      same = same and er[1] == cr[1]
      if same and er[1] then
        for i = 2, er.n do same = same and close(er[i], cr[i]) end
        same = same and close(ea, ca)
      end
      errors = errors + (er[1] and 0 or 1)
      if not same then break end
    end
    if not same then bad = bad or ("case %d (shape %s)"):format(case, table.concat(shape, "x")) end
    ran = ran + 1
  end
  t.ok(bad == nil and ran >= 10 and errors < ran / 2,
       ("%d random writes through random views (%d refused eagerly too): compiled equals eager"):format(ran, errors))
  if bad then t.diag(bad) end
end

-- ---- a random campaign: fields changed between calls ---------------------------------
-- A module of our own whose forward reads its fields (a scale, a dim, an
-- eps, a flag, a nested table's number, a helper's upvalue); between calls
-- one of them changes at random.  Compiled must follow every change.
do
  math.randomseed(17)
  local bias = 0.5
  local function helper(x) return x + bias end
  local m = setmetatable({scale = 2, dim = 2, eps = 1e-5, flag = true, cfg = {shift = 1}},
    {__call = function(self, x)
      local y = x * self.scale + self.cfg.shift
      if self.flag then y = y:relu() end
      y = y:softmax(self.dim)
      return helper(y:layer_norm({4}, nil, nil, self.eps))
    end})
  local cm = fl.compile(m, {recompile_limit = 64})   -- compiled all along, no eager fallback
  local changes = {
    function() m.scale = math.random(1, 4) end,
    function() m.dim = math.random(1, 2) end,
    function() m.eps = ({1e-5, 1e-3, 0.1})[math.random(3)] end,
    function() m.flag = not m.flag end,
    function() m.cfg.shift = math.random(-2, 2) end,
    function() m.cfg = {shift = math.random(-2, 2)} end,
    function() bias = math.random(0, 3) / 2 end,
  }
  local ok, calls = true, 0
  for _ = 1, 40 do
    changes[math.random(#changes)]()
    local x = fl.randn(3, 4)
    calls = calls + 1
    if not close(cm(x), m(x)) then ok = false break end
  end
  t.ok(ok and cm:stats().fallbacks == 0,
       ("%d calls with a random field changed before each: compiled follows every change (%d compiles)"):format(
       calls, cm:stats().compiles))
end

-- In place (plan_inplace): a write-back whose pointwise kernel may store
-- into the leaf itself does, and a where selecting rows then writes only
-- those rows.  Each case against eager over several calls, at positions
-- given as tensors: the KV-cache write read by a product (in place, rows
-- skipped); the cache also read by a product of the old values; the old
-- cache returned as a view (never in place: the result must keep its
-- values); a cache that is a transposed view (the call falls back to the
-- copy); two writes.  `expect` is whether the plan stores in place (nil:
-- either is right, equality is what counts).
do
  local function run(name, body, mk_cache, expect)
    local ce, cc = mk_cache(), mk_cache()
    cc:copy_(ce)
    local cf = fl.compile(body)
    local ok = true
    for call = 1, 6 do
      local new = fl.randn(1, 2, 1, 4) + call
      local pos = fl.tensor({(call * 3) % 8}, {dtype = "int64"})
      local a, b = table.pack(body(ce, new, pos)), table.pack(cf(cc, new, pos))
      ok = ok and close(ce, cc) and a.n == b.n
      for i = 1, a.n do ok = ok and close(a[i], b[i]) end
    end
    local g = fl.capture(body, mk_cache(), fl.randn(1, 2, 1, 4), fl.tensor({1}, {dtype = "int64"}))
    local inplace = tostring(g:optimize{quiet = true}:fuse()):find("in place") ~= nil
    t.ok(ok and (expect == nil or inplace == expect),
         string.format("in place: %s: compiled equals eager over 6 calls (%s in place)", name,
                       inplace and "stored" or "not stored"))
  end
  local function rows(c, pos) return fl.arange(c.shape[3]):reshape(-1, 1):eq(pos:reshape(1, 1)) end
  local w = fl.randn(4, 3)
  run("a KV-cache row", function(c, new, pos)
    c:copy_(fl.where(rows(c, pos), new, c))
    return new:matmul(c:transpose(3, 4))
  end, function() return fl.randn(1, 2, 8, 4) end, true)
  run("a KV-cache row, its condition read by another kernel too (rows skipped)", function(c, new, pos)
    local slot = rows(c, pos)
    c:copy_(fl.where(slot, new, c))
    return new:matmul(c:transpose(3, 4)), slot:to("float32"):sum()
  end, function() return fl.randn(1, 2, 8, 4) end, true)
  run("the old cache read by a product too", function(c, new, pos)
    local old = c:matmul(w)
    c:copy_(fl.where(rows(c, pos), new, c))
    return old, new:matmul(c:transpose(3, 4))
  end, function() return fl.randn(1, 2, 8, 4) end, nil)
  run("the old cache returned as a view", function(c, new, pos)
    local r = c:narrow(3, 1, 2)
    c:copy_(fl.where(rows(c, pos), new, c))
    return r, new:matmul(c:transpose(3, 4))
  end, function() return fl.randn(1, 2, 8, 4) end, false)
  run("a transposed cache", function(c, new, pos)
    c:copy_(fl.where(rows(c, pos), new, c))
    return new:matmul(c:transpose(3, 4))
  end, function() return fl.randn(1, 2, 4, 8):transpose(3, 4) end, nil)
  run("two writes of one cache", function(c, new, pos)
    c:copy_(fl.where(rows(c, pos), new, c))
    c:copy_(c * 0.5)
    return new:matmul(c:transpose(3, 4))
  end, function() return fl.randn(1, 2, 8, 4) end, nil)
end

-- many arguments: the call's paths push them again (once past the 20
-- stack slots a C function is promised, the heap was overwritten)
do
  local f = fl.compile(function(...)
    local a = {...}
    for i = 1, #a, 2 do a[i]:copy_(a[i] + a[i + 1]) end
  end)
  local args = {}
  for i = 1, 50 do args[i] = fl.full({3}, i) end
  for _ = 1, 3 do f(table.unpack(args)) end
  local ok = true
  for i = 1, 50, 2 do ok = ok and args[i][1] == i + 3 * (i + 1) end
  t.ok(ok and #args == 50, "a compiled function of 50 arguments writes into 25 of them, three calls")
end

t.done()
