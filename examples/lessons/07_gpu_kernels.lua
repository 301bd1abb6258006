-- Lesson 07: GPU kernels, live.
--
-- Claim (doc/DESIGN.md's opening paragraph and §4, `cuda`): the last
-- stage of the pipeline is running kernels on the GPU -- the code
-- generator (PyTorch's Inductor) emits kernels for the GPU, where
-- one fused kernel replaces a chain of launches.  On a machine with a GPU
-- this lesson compiles a function for it (CUDA C through NVRTC) and
-- measures it against the CPU; without one it shows the CUDA source and
-- what NVRTC said, or, where this build has no CUDA code generator, says
-- so and shows the C kernel the CUDA one is rendered like.  It never
-- fails for want of a GPU.
--
-- Run: fuselab examples/lessons/07_gpu_kernels.lua   (about 3 s without a GPU)

local fl = fl or require "fuselab"

fl.manual_seed(7)

local function attention_scores(q, k)
  return (q:matmul(k:transpose(1, 2)) * 0.125):softmax(-1)
end

-- The first n lines of generated source s, leaving out blank lines and
-- those that only unpack strides and offsets.
local function head_lines(s, n)
  local out = {}
  for line in s:gmatch("[^\n]*") do
    if #out >= n then break end
    local boiler = line:match("^%s*const int64_t [so]%d+_?%d* = arg%[") or line:match("^%s*%(void%)")
      or line:match("^%s*/%* load %%") or line:match("^%s*/%* store %%")
    if line:match("%S") and not boiler then out[#out + 1] = line end
  end
  return table.concat(out, "\n")
end

-- The kernel functions of a source, without the preamble.
local function kernels_only(src)
  local at = src:find("\n/%* k%d+: ") or src:find("__global__") or 1
  return src:sub(at)
end

-- The median of n calls (each waited for with fl.synchronize) with its
-- spread: fl.measure.
local function timed(n, f, ...) return fl.measure(f, {args = {...}, runs = n}) end

local gpu, why = false, "this build has no CUDA backend: fl.cuda_available is absent"
if fl.cuda_available then
  local ok, yes, reason = pcall(fl.cuda_available)
  if ok then gpu, why = yes, reason or (yes and "a GPU is usable" or "no usable GPU")
  else why = tostring(yes) end
end
print(("GPU: %s -- %s\n"):format(gpu and "yes" or "no", why))

local q, k = fl.randn(512, 64), fl.randn(512, 64)
local plan = fl.capture(attention_scores, q, k):decompose():optimize():fuse()

-- 1. With a GPU: compile for it and measure.
local ran_on_gpu = false
if gpu then
  local ok, err = pcall(function()
    local qc, kc = q:cuda(), k:cuda()
    local cm_gpu = fl.compile(attention_scores, {backend = "cuda"})
    local cm_cpu = fl.compile(attention_scores, {backend = "cpu"})
    local y = cm_gpu(qc, kc)
    fl.synchronize()
    local ref = cm_cpu(q, k)
    print(("GPU result matches the CPU: %s"):format(tostring(fl.allclose(y:cpu(), ref, 1e-4, 1e-5))))
    local mg, mc, me = timed(50, cm_gpu, qc, kc), timed(50, cm_cpu, q, k), timed(10, attention_scores, q, k)
    local tg, tc, te = mg.median_ms, mc.median_ms, me.median_ms
    print("\nThe CUDA kernels that ran (excerpt):")
    print(head_lines(kernels_only(cm_gpu:code()), 40))
    print(("\n%-16s %10s\n%-16s %10.3f\n%-16s %10.3f\n%-16s %10.3f"):format("", "ms per call",
      "eager (CPU)", te, "compiled CPU", tc, "compiled GPU", tg))
    print(("\nMeasured (medians): %s; %s;\n%d kernel(s) per call (stats: %d compile(s), %d fallback(s))."):format(
      fl.compare_times(mg, mc, {names = {"the GPU graph", "the compiled CPU one"}}).text,
      fl.compare_times(mg, me, {names = {"the GPU graph", "eager"}}).text,
      cm_gpu:stats().kernels, cm_gpu:stats().compiles, cm_gpu:stats().fallbacks))
    ran_on_gpu = true
  end)
  if not ok then print("The GPU run failed; what it said:\n  " .. tostring(err) .. "\n") end
end

-- 2. Without a GPU (or after a failed run): the CUDA source and NVRTC.
if not ran_on_gpu then
  local ok, prog = pcall(plan.codegen, plan, "cuda")
  if ok then
    print("The CUDA source this plan generates (excerpt):")
    print(head_lines(kernels_only(prog:source()), 40))
    local cok, err = pcall(prog.compile, prog)
    if cok then
      local log = prog.log and prog:log() or ""
      print(("\nNVRTC compiled it%s."):format(log ~= "" and (":\n" .. log) or " without a message"))
      local st = prog:stats()
      if st.compile_ms then print(("NVRTC took %.1f ms."):format(st.compile_ms)) end
    else
      print("\nNVRTC did not compile it here; what it said:\n  " .. tostring(err))
    end
  else
    print("This build has no CUDA code generator: p:codegen(\"cuda\") says")
    print("  " .. tostring(prog))
    print("\nThe CUDA kernels will be rendered like the C ones (DESIGN §1: one kernel description,")
    print("two renderers that differ only where C and CUDA differ).  The C kernel of this plan:")
    local c = plan:codegen("cpu")
    print(head_lines(kernels_only(c:source()), 30))
    print("  ...")
  end
  print("\nMeasured on the CPU instead (the numbers a GPU run would be compared with):")
  local cm_cpu = fl.compile(attention_scores, {backend = "cpu"})
  cm_cpu(q, k)
  local mc, me = timed(50, cm_cpu, q, k), timed(10, attention_scores, q, k)
  print(("  eager %s\n  compiled CPU %s, %d kernel(s)\n  %s."):format(me, mc, cm_cpu:stats().kernels,
    fl.compare_times(mc, me, {names = {"compiled CPU", "eager"}}).text))
end
