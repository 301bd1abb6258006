-- Lesson 05: code generation and warm-up.
--
-- Claim (this lesson's; the checklist that weighs it is doc/DESIGN.md
-- §2, "Go-live checklist"): compile warm-up must be counted in the
-- user's experience (originally "编译预热时间需纳入用户体验考量"): the
-- first run pays for compilation and is slower, later runs are much
-- faster (originally "首次运行需要编译预热，可能增加首屏延迟，但后续吞吐量
-- 大幅提升").  A compiled program is worth it only after enough calls
-- to win back its warm-up.
--
-- What it measures: the generated C of one kernel; where a program comes
-- from (the C compiler, the disk cache, memory) and what each costs; the
-- cold first call (empty cache), the warm one (a new process finding the
-- disk cache), the steady state against eager, and the number of calls
-- after which compiling has paid -- then the running totals that show it.
--
-- Run: fuselab examples/lessons/05_codegen_and_warmup.lua   (about 3 s)

local fl = fl or require "fuselab"

fl.manual_seed(5)

-- A small softmax-then-scale, typical of attention scores.
local function scores(q, k)
  return (q:matmul(k:transpose(1, 2)) * 0.125):softmax(-1)
end

local q, k = fl.randn(32, 64), fl.randn(32, 64)
local plan = fl.capture(scores, q, k):decompose():optimize():fuse()
local prog = plan:codegen("cpu")

-- The source of the last kernel: one function per kernel, a comment
-- header naming the graph nodes it fuses.  The lines that only unpack
-- strides and offsets are left out of the excerpt.
local src = prog:source()
local last = 0
for at in src:gmatch("()\n/%* k%d+: ") do last = at end
local excerpt = {}
for line in src:sub(last + 1):gmatch("[^\n]*") do
  local boiler = line:match("^%s*const int64_t [so]%d+_?%d* = arg%[") or line:match("^%s*%(void%)")
    or line:match("^%s*/%* load %%") or line:match("^%s*/%* store %%")
  if not boiler then excerpt[#excerpt + 1] = line end
  if #excerpt >= 40 then break end
end
print(("The generated C (%d lines in all); the last kernel, without its stride and offset lines:\n"):format(
  select(2, src:gsub("\n", ""))))
print(table.concat(excerpt, "\n"))
print("  ...\n")

-- Where the program comes from, and what that costs.
local function load_ms(p)
  local t0 = fl.now()
  p:compile()
  return (fl.now() - t0) * 1e3, p:stats().how
end
-- Cold means cold: in an empty cache of the lesson's own, so the first
-- load runs the compiler on every run of the lesson (the user's cache is
-- left as it was).
local ms1, how1, ms2, how2, ms3, how3 = fl.with_empty_cache(function()
  local a, ha = load_ms(prog)
  local b, hb = load_ms(plan:codegen("cpu"))
  fl._cache_forget_memory()                  -- as a new process would find it
  local c, hc = load_ms(plan:codegen("cpu"))
  return a, ha, b, hb, c, hc
end)
print("Loading the same program three times, in an empty cache (one run each: a load happens once, so no median):")
print(("  1st  %9.2f ms  from %s%s"):format(ms1, how1,
  how1 == "compiled" and " (the C compiler ran)" or " (an earlier run left it in the cache)"))
print(("  2nd  %9.2f ms  from %s"):format(ms2, how2))
print(("  3rd  %9.2f ms  from %s (after forgetting the loaded objects, as a new process)"):format(ms3, how3))
print(("Your own cache, untouched: %s\n"):format(fl.cache_info().dir))

-- The checklist measures the rest with an empty cache of its own, so the
-- cold call really runs the compiler.
print("fl.checklist(scores, {inputs = {q, k}}):")
local r = fl.checklist(scores, {inputs = {q, k}, calls = 50})

print("\nRunning totals, eager against compiled (cold first call, then steady calls at their medians):")
print(("%10s  %14s  %14s"):format("calls", "eager ms", "compiled ms"))
for _, n in ipairs{1, 10, 100, 1000, 10000, 100000} do
  local e = n * r.eager_ms
  local c = r.cold_ms + (n - 1) * r.steady_ms
  print(("%10d  %14.2f  %14.2f%s"):format(n, e, c, c < e and "   <- compiled ahead" or ""))
end
print()
if r.break_even_calls then
  print(("Measured: the first call costs %.0f ms cold (%.1f ms warm from disk) against %.3f ms eager;"):format(
    r.cold_ms, r.warm_ms, r.eager_ms))
  print(("each later call saves %.3f ms, so compiling pays after %d calls."):format(
    r.eager_ms - r.steady_ms, r.break_even_calls))
else
  print(("Measured: the compiled program is not faster here (%.3f ms vs %.3f ms eager): it never pays."):format(
    r.steady_ms, r.eager_ms))
end
