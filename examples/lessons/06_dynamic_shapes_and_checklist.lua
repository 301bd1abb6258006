-- Lesson 06: dynamic shapes, recompiles, and the go-live checklist.
--
-- Claim (doc/DESIGN.md §2, "Go-live checklist"): the decision table --
--   stable inference      -> turn compile on    (稳定推理服务 -> 开启 compile)
--   frequent changes      -> leave it off       (频繁实验调试 -> 关闭 compile)
--   dynamic input shapes  -> dynamic mode, or not at all
--                                               (动态形状输入 -> 谨慎开启)
-- and the pitfall that ignoring dynamic shapes means compiling again and
-- again (忽略动态形状导致的重复编译).  The checklist asks to verify the
-- cache hit rate under changing input shapes (验证动态输入形状下的缓存命中率).
--
-- What it measures: one function served with changing batch sizes,
-- compiled three ways -- static (dynamic=false: one graph per shape),
-- automatic (the default: specialize, then make the sizes that changed
-- symbolic) and dynamic=true -- counting compiles, recompiles, cache hits
-- and compile time; then a GPT served changing sequence lengths the same
-- three ways (symbolic sizes keep its attention to one graph); then fl.checklist on the table's three rows, each
-- with the recommendation it derives from its own measurements.
--
-- Run: fuselab examples/lessons/06_dynamic_shapes_and_checklist.lua   (about 10 s)

local fl = fl or require "fuselab"

fl.manual_seed(6)

-- Cold means cold: every compile below runs in an empty kernel cache of
-- the lesson's own (the compile column is the C compiler's time on every
-- run, rehearsal or class), and the user's cache is left untouched.
fl.with_empty_cache(function()

-- A scoring head: squash, then a softmax over the features.
local function head(x)
  return ((x * 0.5):tanh() + 1):softmax(-1)
end

local features = 256
local batches = {8, 16, 24, 32, 48, 64, 8, 16, 24, 32, 48, 64}   -- traffic repeats its shapes
local inputs = {}
for i, b in ipairs(batches) do inputs[i] = fl.randn(b, features) end

print(("Serving %d calls with batch sizes %s:\n"):format(#batches, table.concat(batches, " ")))
print(("%-22s %9s %11s %11s %11s  %s"):format("mode", "compiles", "recompiles", "cache hits", "compile ms",
  "kernels"))
local results = {}
for _, mode in ipairs{{"static (dynamic=false)", false}, {"automatic (default)", nil}, {"dynamic=true", true}} do
  local cm = fl.compile(head, {dynamic = mode[2], recompile_limit = 16})
  fl._cache_forget_memory()       -- each mode compiles its own: none from the mode before
  fl.cache_clear()
  local c0 = fl.cache_info()
  for _, x in ipairs(inputs) do cm(x) end
  local s = cm:stats()
  results[#results + 1] = {name = mode[1], s = s}
  print(("%-22s %9d %11d %11d %11.0f  %s"):format(mode[1], s.compiles, s.recompiles, s.cache_hits, s.compile_ms,
    fl.cache_origins(c0)))
end
print("\nWhy the static mode recompiled (first three):")
for i = 1, math.min(3, #results[1].s.recompile_reasons) do
  print("  " .. results[1].s.recompile_reasons[i])
end
print("What automatic mode guards after its one recompile (s = any size >= 2):")
for _, g in ipairs(results[2].s.guards) do print("  " .. g) end

-- The same with a GPT whose sequence length changes: attention reads the
-- batch and length from x.shape to split heads and build the causal mask.
-- Under capture those reads are symbolic sizes (s0, s1), so the reshapes
-- and the mask stay symbolic and one graph serves every length; the one
-- comparison the model makes (T > seq) becomes a guard, not a recompile.
print("\nA 1-layer GPT (d 32, seq 64) served sequence lengths 8 12 16 33:\n")
local gpt = fl.models.transformer{vocab = 64, d = 32, heads = 4, layers = 1, seq = 64}
local lengths = {8, 12, 16, 33}
local ids = {}
for i, T in ipairs(lengths) do ids[i] = (fl.rand(2, T) * 64):to("int64") end
print(("%-22s %9s %11s %11s %s"):format("mode", "compiles", "recompiles", "cache hits", "matches eager"))
local gpt_auto
for _, mode in ipairs{{"static (dynamic=false)", false}, {"automatic (default)", nil}, {"dynamic=true", true}} do
  local cm = fl.compile(gpt, {dynamic = mode[2]})
  local same = true
  for _, idx in ipairs(ids) do same = same and fl.allclose(cm(idx), gpt(idx), 1e-4, 1e-5) end
  local s = cm:stats()
  if mode[2] == nil then gpt_auto = cm end
  print(("%-22s %9d %11d %11d %s"):format(mode[1], s.compiles, s.recompiles, s.cache_hits, tostring(same)))
end
print("What the automatic GPT guards (s = any size >= 2), weights left out:")
for _, g in ipairs(gpt_auto:stats().guards) do
  if not g:find("same tensor") then print("  " .. g) end
end

-- The decision table, one row at a time, measured by the checklist.
print("\n== Row 1: stable inference (one shape, always the same function)\n")
local stable = fl.checklist(head, {inputs = {fl.randn(32, features)}, name = "head, batch 32 only"})

-- Frequent changes: an experimenter switches a choice between runs (which
-- activation).  A string or boolean the function is called with is a
-- guard, in fuselab as in torch.compile: each new choice is a new graph,
-- in any mode.  A float is different: after it changes once it becomes a
-- graph input (torch.compile's automatic dynamic does the same), so a new
-- temperature costs no compile.
print("\n== Row 2: frequent changes (the activation switched between runs)\n")
local function tempered(x, temperature) return (x / temperature):softmax(-1) end
local function switched(x, act) return (x * 0.5)[act](x * 0.5):softmax(-1) end
local x = fl.randn(32, features)
local runs = {}
for i, a in ipairs{"gelu", "tanh", "sigmoid", "silu", "relu"} do runs[i] = {x, a} end
local changing = fl.checklist(switched, {inputs = {x, "relu"}, shapes = runs, name = "switched, new activation each run"})
local ct = fl.compile(tempered)
for _, t in ipairs{0.5, 0.7, 0.8, 0.9, 1.1, 1.3} do ct(x, t) end
print(("\nSix temperatures, one function compiled: %d compiles (%s); the float became a graph input: %s"):format(
  ct:stats().compiles, ct:stats().recompile_reasons[1], table.concat(ct:stats().dynamic_numbers, ", ")))

print("\n== Row 3: dynamic input shapes (the batch sizes above)\n")
local sweep = {}
for i = 2, 6 do sweep[#sweep + 1] = batches[i] end
local dynamic = fl.checklist(head, {inputs = {inputs[1]}, shapes = sweep, name = "head, changing batch"})

print("\nThe decision table, as measured on this machine:")
print(("%-38s %-8s %s"):format("row", "decision", "measured"))
local function row(name, r, extra)
  print(("%-38s %-8s %s"):format(name, r.decision, extra))
end
-- a saving only where the checklist's verdict found one beyond the noise
row("stable inference", stable, stable.break_even_calls
  and ("saves %d%% per call after %d calls"):format(math.floor(stable.saving * 100 + 0.5), stable.break_even_calls)
  or (stable.verdict.verdict == 0 and "no clear difference (within the noise)" or "compiled is slower"))
row("frequent changes (new activation)", changing,
  ("%d recompiles over %d runs, hit rate %d%%"):format(changing.recompiles, #runs + 1,
    math.floor(changing.cache_hit_rate * 100 + 0.5)))
row("dynamic shapes (batch 8..64)", dynamic,
  ("static %d recompiles, automatic %d; hit rate %d%% -> %d%%"):format(dynamic.recompiles_static,
    dynamic.recompiles, math.floor(dynamic.cache_hit_rate_static * 100 + 0.5),
    math.floor(dynamic.cache_hit_rate * 100 + 0.5)))
end)
