-- symbolic.lua -- symbolic sizes (SymInt): attention, transformer blocks and
-- GPTs compile once for every batch size and sequence length; sizes Lua
-- compares become guards; sizes Lua needs as numbers are specialized, with
-- the reason; every compiled result is compared with eager (float32,
-- rtol 1e-4, atol 1e-5: fused kernels reorder float sums) and, for the
-- captured graphs, with the reference interpreter.
local fl = fl or require "fuselab"
local t = require "tap"

local function close(a, b) return fl.allclose(a, b, 1e-4, 1e-5) end

fl.manual_seed(21)

local function has(list, pat)
  for _, s in ipairs(list) do if tostring(s):find(pat) then return true end end
  return false
end

-- ---- the issue's targets ------------------------------------------------
do
  local m = nn.MultiheadAttention(32, 2, {causal = true})
  local cm = fl.compile(m, {dynamic = true})
  local ok = true
  for _, T in ipairs{4, 5, 6, 7} do
    local x = fl.randn(2, T, 32)
    ok = ok and close(cm(x), m(x))
  end
  t.ok(ok, "MultiheadAttention(32, 2), dynamic=true, T = 4..7: matches eager")
  t.is(cm:stats().compiles, 1, "MultiheadAttention: one compile for four sequence lengths")
  t.ok(has(cm:stats().guards, "s0%(>=2%),s1%(>=2%),32") or has(cm:stats().guards, "s%(>=2%),s%(>=2%),32"),
       "its guards keep B and T symbolic, d = 32 static")
  t.ok(has(cm:stats().specializations, "q%.shape%[3%] specialized to 32"),
       "d was specialized by an equality with a number, and that is said")
end

do
  local gpt = fl.models.transformer{vocab = 50, d = 32, heads = 4, layers = 2, seq = 64}
  local cm = fl.compile(gpt)
  local ok = true
  for _, T in ipairs{8, 9, 12, 16, 33} do
    local idx = (fl.rand(2, T) * 50):to("int64")
    ok = ok and close(cm(idx), gpt(idx))
  end
  t.ok(ok, "fl.models.transformer over 5 sequence lengths (automatic): matches eager")
  t.ok(cm:stats().compiles <= 2, "transformer: at most two compiles, got " .. cm:stats().compiles)
  t.ok(has(cm:stats().guards, "size guard: s0 <= 64"), "T > seq became the guard s0 <= 64")
  -- past the guard the module's own error, not a wrong answer
  t.raises(function() return cm((fl.rand(2, 70) * 50):to("int64")) end,
           "longer than seq=64", "a sequence past seq fails the guard and raises the module's error")
  local idx = (fl.rand(1, 20) * 50):to("int64")
  t.ok(close(cm(idx), gpt(idx)), "batch 1 (specialized) is right too")
end

do
  local blk = nn.TransformerBlock(32, 4)
  local cm = fl.compile(blk)
  local ok = true
  for _, B in ipairs{2, 3, 4, 7} do
    local x = fl.randn(B, 10, 32)
    ok = ok and close(cm(x), blk(x))
  end
  t.ok(ok, "TransformerBlock over 4 batch sizes (automatic): matches eager")
  t.ok(cm:stats().compiles <= 2, "TransformerBlock: at most two compiles, got " .. cm:stats().compiles)
end

-- random batch sizes and lengths through one symbolic attention graph
do
  local m = nn.MultiheadAttention(16, 4, {causal = true})
  local cm = fl.compile(m, {dynamic = true})
  local ok, n = true, 0
  for _ = 1, 12 do
    local B, T = math.random(2, 5), math.random(2, 24)
    local x = fl.randn(B, T, 16)
    ok = ok and close(cm(x), m(x))
    n = n + 1
  end
  t.ok(ok, "12 random (B, T) through one attention graph match eager")
  t.is(cm:stats().compiles, 1, "and compiled once")
  -- the captured graph at one size, run at another, against the reference
  local g = fl.compile(m, {dynamic = true})
  g(fl.randn(2, 6, 16))
  local graph = g:graphs()[1]
  local x = fl.randn(3, 11, 16)
  t.ok(close(graph:run_reference(x), m(x)), "the symbolic graph on the reference interpreter at another size")
  t.ok(tostring(graph):find("s0,s1"), "the listing shows symbolic dims")
end

-- ---- SymInt arithmetic and what specializes ------------------------------
do
  local seen
  local f = fl.compile(function(x)
    local B, T = x.shape[1], x.shape[2]
    seen = {tostring(B), tostring(B * T), tostring(T // 2), tostring(T % 3), tostring(-T),
            tostring(2 * T + 1), tostring(x:numel()), tostring(#x)}
    return x:reshape(B * T, -1):sum(2):reshape(B, T)
  end, {dynamic = true})
  local x = fl.randn(2, 8, 3)        -- T // 2 and T % 3 are >= 2 here: symbolic
  f(x)
  t.is(table.concat(seen, " "), "s0 s0*s1 s1//2 s1%3 -s1 1+(2*s1) s2*(s0*s1) s0",
       "sizes print as expressions")
  local ok = true
  for _, T in ipairs{3, 7, 10} do
    local y = fl.randn(3, T, 5)
    ok = ok and close(f(y), y:sum(3))
  end
  -- T - 1 is 1 when T = 2: a size 1 broadcasts, so it must not stay symbolic
  local function h(x)
    local T = x.shape[2]
    return x:narrow(2, 1, T - 1):sum(2, true):expand(x.shape[1], T, x.shape[3]) + x
  end
  local g = fl.compile(h, {dynamic = true})
  g(fl.randn(2, 2, 3))
  local y = fl.randn(4, 7, 5)
  t.ok(close(g(y), h(y)), "T - 1 worth 1 at capture: specialized, right at T = 7")
  t.ok(has(g:stats().specializations, "worth 0 or 1"), "and the reason says why")
  t.ok(ok, "reshape(B*T, -1) then back: right at other sizes")
  t.is(f:stats().compiles, 1, "one compile")
end

do
  local T0
  local f = fl.compile(function(x)
    local T = x.shape[1]
    local mask = fl.zeros(T, T) + fl.full({T}, 2.0) + fl.ones(1, T)
    local pos = fl.arange(T):to("float32")
    T0 = T
    return x:narrow(1, 1, T - 1):sum() + mask:sum() + pos:sum()
  end, {dynamic = true})
  local ok = true
  for _, T in ipairs{3, 6, 9} do
    local x = fl.randn(T)
    local want = x:narrow(1, 1, T - 1):sum() + 3 * T * T + T * (T - 1) / 2
    ok = ok and close(f(x), want)
  end
  t.ok(ok, "fl.zeros/full/ones/arange and narrow with symbolic sizes are right")
  t.is(f:stats().compiles, 1, "and compile once")
  t.raises(function() return T0 + 1 end, "after the capture that made it ended",
           "a SymInt kept past its capture raises a clear error")
end

do
  -- concatenation specializes, with the file:line
  local f = fl.compile(function(x)
    local name = "n" .. x.shape[1]
    return x * #name
  end, {dynamic = true})
  f(fl.randn(5))
  f(fl.randn(6))
  t.is(f:stats().compiles, 2, "a size used in a string is specialized: recompiles per size")
  t.ok(has(f:stats().specializations, "concatenation.*symbolic%.lua:%d+"),
       "the reason names the concatenation and its file:line")
end

do
  -- a size used as a loop bound: Lua raises, the trace runs again static
  local f = fl.compile(function(x)
    local acc = x * 0
    for _ = 1, x.shape[1] do acc = acc + 1 end
    return acc + x
  end, {dynamic = true})
  local x = fl.randn(4)
  t.ok(close(f(x), x + 4), "a symbolic loop bound: traced again with static sizes, right")
  t.ok(has(f:stats().specializations, "needs a plain number"), "and the reason says so")
end

do
  -- sizes 0 and 1 never become symbolic
  local f = fl.compile(function(x) return x:reshape(x.shape[1] * x.shape[2]) end, {dynamic = true})
  f(fl.randn(1, 5))
  f(fl.randn(1, 7))
  f(fl.randn(3, 7))
  t.ok(f:stats().compiles >= 2, "a dim of size 1 is specialized (it changes broadcasting)")
  t.ok(close(f(fl.ones(1, 9)), fl.ones(9)), "and results stay right")
end

do
  -- comparisons between sizes: one expression is always equal to itself,
  -- different ones leave a guard
  local f = fl.compile(function(a, b)
    if a.shape[1] == b.shape[1] then return a + b end
    return a:sum() + b:sum()
  end, {dynamic = true})
  local a, b = fl.randn(4), fl.randn(4)
  t.ok(close(f(a, b), a + b), "equal sizes: the elementwise branch")
  local c = fl.randn(5)
  t.ok(close(f(a, c), a:sum() + c:sum()), "different sizes: the guard fails, the other branch")
  t.is(f:stats().compiles, 2, "two branches, two compiles")
end

do
  -- a size as a tensor operand: x * T, a mean over x:numel()
  local f = fl.compile(function(x) return x * x.shape[1], x:sum() / x:numel() end, {dynamic = true})
  local ok = true
  for _, n in ipairs{3, 5, 12} do
    local x = fl.randn(n, 4)
    local a, b = f(x)
    ok = ok and close(a, x * n) and close(b, x:mean())
  end
  t.ok(ok, "x * T and x:sum() / x:numel() with symbolic sizes are right")
  t.is(f:stats().compiles, 1, "and compile once")
  local h = fl.compile(function(x) return x * x.shape[1] end, {dynamic = true})
  t.is(h(fl.randn(3, {dtype = "float16"})).dtype, "float16", "a size operand keeps float16 (it is an integer)")
  t.is(h(fl.tensor({1, 2, 3, 4}, {dtype = "int64"})).dtype, "int64", "and int64 stays int64")
  t.is(h(fl.tensor({1, 2, 3, 4}, {dtype = "int64"})):tolist()[4], 16, "exactly")
end

-- ---- random programs over symbolic sizes against eager -------------------
-- Chains of size-reading steps (reshape to B*T, narrow to T-1, masks from
-- fl.arange(T), x * T, fl.zeros(B, T, 1)...), compiled with dynamic=true or
-- automatic, each called at four random shapes.  Seed: FUSELAB_FUZZ_SEED
-- (default 1).  Bounded to 40 s: it reports how far it got.
do
  local seed = tonumber(os.getenv("FUSELAB_FUZZ_SEED") or "1") or 1
  math.randomseed(seed)
  local steps = {
    function(x) local B, T, C = x.shape[1], x.shape[2], x.shape[3]
      return x:reshape(B * T, C):tanh():reshape(B, T, C) end,
    function(x) local B, T, C = x.shape[1], x.shape[2], x.shape[3]
      return x:reshape(B, -1):softmax(-1):view(B, T, C) end,
    function(x) local T = x.shape[2]
      return x:narrow(2, 1, T - 1):sum(2, true):expand(x.shape[1], T, x.shape[3]) + x end,
    function(x) local T = x.shape[2]; return x + fl.arange(T):to("float32"):reshape(1, T, 1) end,
    function(x) return (x * x.shape[2] - x:sum() / x:numel()):tanh() end,
    function(x) local B, T = x.shape[1], x.shape[2]; return x + fl.zeros(B, T, 1) + fl.full({1, T, 1}, 0.5) end,
    function(x) local T = x.shape[2]
      local m = fl.where(fl.arange(T):reshape(1, T):gt(fl.arange(T):reshape(T, 1)), -math.huge, 0.0)
      return (x:matmul(x:transpose(2, 3)) + m):softmax(-1):matmul(x) end,
    function(x) local B, T, C = x.shape[1], x.shape[2], x.shape[3]
      return x:permute(3, 1, 2):reshape(C, B * T):transpose(1, 2):reshape(B, T, C) end,
    function(x) return x:mean(2, true) + x:amax(3, true) end,
  }
  local t0, bad, calls, trials, first = fl.now(), 0, 0, 0, nil
  for trial = 1, 16 do
    if fl.now() - t0 > 40 then break end
    local chain = {}
    for i = 1, math.random(1, 4) do chain[i] = math.random(#steps) end
    local function f(x) for _, k in ipairs(chain) do x = steps[k](x) end return x end
    local cm = fl.compile(f, {dynamic = math.random() < 0.5 or nil})
    for _ = 1, 4 do
      local x = fl.randn(math.random(2, 4), math.random(2, 9), math.random(2, 5))
      local want, got = f(x), cm(x)
      calls = calls + 1
      if not fl.allclose(got, want, 1e-4, 1e-5) then
        bad = bad + 1
        first = first or ("seed %d trial %d steps {%s} at %s"):format(seed, trial,
          table.concat(chain, ","), table.concat(x.shape, "x"))
      end
    end
    trials = trial
  end
  t.ok(bad == 0, ("%d random symbolic programs, %d calls, match eager (seed %d)%s"):format(
    trials, calls, seed, first and ("; first mismatch: " .. first) or ""))
end

-- ---- the CUDA code path: symbolic plans compile (NVRTC) ------------------
do
  local _, why = fl.cuda_available()
  local built = why == nil or not why:find("built without CUDA", 1, true)
  if not built then
    t.skip("built without CUDA", 1)
  else
    local m = nn.MultiheadAttention(32, 2, {causal = true})
    local cm = fl.compile(m, {dynamic = true, backend = "cpu"})
    cm(fl.randn(2, 5, 32))
    local prog = fl._cuda_program(cm:plans()[1])
    t.ok(prog:compile(), "the symbolic attention plan compiles for CUDA")
  end
end

t.done()
