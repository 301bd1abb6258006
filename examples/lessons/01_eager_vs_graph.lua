-- Lesson 01: eager vs graph -- what interpretation costs.
--
-- Claim (this lesson's; the pipeline it is about is doc/DESIGN.md's
-- opening paragraph): eager execution is like simultaneous
-- interpretation -- every step is understood anew each time it runs
-- (originally "每次执行都要重新理解意图"); a compiled graph is like a
-- printed book: prepared once, then read
-- fast.  On small tensors the per-op dispatch, not the arithmetic, should
-- dominate eager time, and one compiled graph should remove most of it.
--
-- What it measures: one function of ten elementwise ops, run eagerly (ten
-- dispatches from Lua, ten temporaries) and compiled (a guard check and one
-- fused kernel), at four tensor sizes.  At 16 elements the arithmetic takes
-- nanoseconds, so the eager time per op there is the dispatch cost, and the
-- compiled time is the cost of one call of a compiled graph.  At larger
-- sizes the kernels themselves start to count (fusion is lesson 04).
--
-- Last, the same answers: the handwritten-digit classifier shipped in
-- examples/models/digits_mlp.safetensors (trained by
-- examples/train_digits.lua) labels the 360 held-out images eagerly and
-- compiled; its accuracy is a check that can fail -- a wrong kernel
-- changes labels -- so the lesson exits non-zero unless both agree.
--
-- Run: fuselab examples/lessons/01_eager_vs_graph.lua   (about 2 s)

local fl = fl or require "fuselab"

-- The median of n calls of f(...) with its spread (fl.measure); us() is
-- its median in microseconds.
local function timed(n, f, ...) return fl.measure(f, {args = {...}, runs = n}) end
local function us(t) return t.median_ms * 1e3 end

local function ten_ops(x)
  local y = x * 1.5 + 0.5            -- mul, add
  y = y:tanh() * x                    -- tanh, mul
  y = (y - 0.25):abs():sqrt()         -- sub, abs, sqrt
  return (y + x):sigmoid():relu()     -- add, sigmoid, relu
end

fl.manual_seed(1)
print("fl.explain(ten_ops, x) -- what capture sees:")
local info = fl.explain(ten_ops, fl.randn(4, 4))
print()

local cm = fl.compile(ten_ops)
print(("%10s  %12s  %12s  %8s  %14s  %s"):format("elements", "eager us", "compiled us", "eager/", "eager us/op", "verdict"))
print(("%10s  %12s  %12s  %8s  %14s"):format("", "(median)", "(median)", "compiled", ""))
local small_eager, small_compiled, first, last, noisy
for _, n in ipairs{16, 256, 4096, 32768} do
  local x = fl.randn(n)
  cm(x)                                -- compiles (once per new size at most)
  local reps = n <= 4096 and 200 or 50
  local te = timed(reps, ten_ops, x)
  local tc = timed(reps, cm, x)
  assert(fl.allclose(cm(x), ten_ops(x), 1e-5, 1e-6), "compiled result differs from eager")
  local v = fl.compare_times(tc, te, {names = {"compiled", "eager"}})
  if not first then small_eager, small_compiled, first = us(te), us(tc), v end
  last = v
  noisy = noisy or te.noisy or tc.noisy
  print(("%10d  %12.1f  %12.1f  %7.1fx  %14.2f  %s"):format(n, us(te), us(tc), v.ratio, us(te) / info.op_count,
    v.verdict > 0 and "compiled faster" or v.verdict < 0 and "eager faster" or "no clear difference"))
end

local s = cm:stats()
print(("\nCompiled: %d graph(s) of %d kernel(s) in all, %d recompile(s) (new sizes), %.0f ms compiling."):format(
  s.compiles, s.kernels, s.recompiles, s.compile_ms))
print(("Measured: dispatching one eager op costs about %.1f us; one call of the compiled graph, %.1f us"):format(
  small_eager / info.op_count, small_compiled))
print(("for all ten.  Eager/compiled: %.1fx on 16 elements, %.1fx on 32768 (medians)."):format(first.ratio, last.ratio))
if noisy then print("(Some timings were noisy: the machine was busy or the runs spread widely.)") end
if first.verdict > 0 then
  print("The claim holds on this run: on small tensors the eager time is interpretation, which the graph pays once.")
elseif first.verdict < 0 then
  print("The claim does not hold on this run: the compiled graph was slower even on tiny tensors.")
else
  print("No verdict on this run: on tiny tensors " .. first.text .. ".")
end

-- Same answers on real data: a trained classifier, eager and compiled.
local here = (arg and arg[0] or ""):match("^(.*)/[^/]*$") or "."
local data = here .. "/../data"
if not io.open(data .. "/digits.txt") then data = (os.getenv("FUSELAB_SRC") or ".") .. "/examples/data" end
local _, _, Xtest, Ytest = dofile(data .. "/digits.lua")(data)
local net = fl.nn.Sequential(fl.nn.Linear(64, 128), fl.nn.ReLU(), fl.nn.Linear(128, 10))
fl.load_weights(net, data .. "/../models/digits_mlp.safetensors")
net:eval()
local eager_pred, compiled_pred = fl.no_grad(function()
  return net(Xtest):argmax(2), fl.compile(net)(Xtest):argmax(2)
end)
local function acc(p) return p:eq(Ytest):to("float32"):mean():item() * 100 end
local same = eager_pred:eq(compiled_pred):to("int64"):sum():item()
print(("\nThe digits classifier on %d held-out images: eager %.1f %% right, compiled %.1f %% right, "
  .. "%d of %d labels the same."):format(Ytest.shape[1], acc(eager_pred), acc(compiled_pred), same, Ytest.shape[1]))
if same ~= Ytest.shape[1] or acc(eager_pred) < 95 then
  io.stderr:write("lesson 01: the compiled classifier does not give eager's answers\n")
  os.exit(1)
end
