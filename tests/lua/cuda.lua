-- cuda.lua -- the CUDA backend from Lua, on any machine: fl.cuda_available
-- and its reason, the no-device errors of x:cuda(), x:to("cuda") and
-- k:run, and p:codegen("cuda"): readable source, an NVRTC compile and its
-- PTX without a GPU.  Built without the toolkit, it checks the "built
-- without CUDA" reason instead.  With a GPU it also moves data both ways
-- and runs a compiled program against the CPU one.
local fl = fl or require "fuselab"
local t = require "tap"

local have, why = fl.cuda_available()
t.ok(type(have) == "boolean", "fl.cuda_available() answers a boolean")
if not have then
  t.ok(type(why) == "string" and why:find("^no CUDA device: ") ~= nil,
       "the reason says no CUDA device: " .. tostring(why))
end

local function softmax_plan()
  local x = fl.randn(8, 33)
  local g = fl.capture(function(a) return (a * 2):softmax(2):exp() end, x)
  return g:fuse(), x
end

local x = fl.ones(2, 3)
if not have then
  t.raises(function() return x:cuda() end, "no CUDA device: ", "x:cuda() without a device")
  t.raises(function() return x:to("cuda") end, "no CUDA device: ", "x:to(\"cuda\") without a device")
  t.raises(function() return x:to("cuda", "float16") end, "no CUDA device: ",
           "x:to(\"cuda\", \"float16\") without a device")
end
t.is(x:cpu(), x, "x:cpu() of a CPU tensor is x")
t.is(x:to("float16").dtype, "float16", "x:to(dtype) still converts")

local p, xin = softmax_plan()
local built = why == nil or not why:find("built without CUDA", 1, true)
if not built then
  t.raises(function() return p:codegen("cuda") end, "built without CUDA",
           "p:codegen(\"cuda\") in a build without CUDA")
  t.raises(function() return fl._cuda_program(p) end, "built without CUDA",
           "fl._cuda_program in a build without CUDA")
  t.done()
  return
end

local k = p:codegen("cuda")
local src = tostring(k)
t.ok(src:find("__global__", 1, true) ~= nil, "print(k) shows CUDA C")
t.ok(src:find("fl_block_reduce", 1, true) ~= nil, "the softmax is a block reduction")
t.ok(src:find("/* k0: ", 1, true) ~= nil, "kernels carry the C generator's header comments")
t.is(src, k:code(), "print(k) is k:code(): the host program, then the kernels")
t.ok(src:find("^/%* host program %(cuda%)"), "the host program comes first")
t.ok(k:source():find("/* k0: ", 1, true) ~= nil, "k:source() is the whole compilable source")
t.is(k:compile(), true, "k:compile() runs NVRTC")
local st = k:stats()
t.ok(st.compiled and (st.how == "compiled" or st.how == "disk" or st.how == "memory"),
     "stats: compiled, how = " .. tostring(st.how))
t.ok(type(st.arch) == "string" and st.arch:find("^s?[mc]") ~= nil, "stats: arch " .. tostring(st.arch))
local ptx = k:ptx()
t.ok(type(ptx) == "string" and ptx:find(".entry", 1, true) ~= nil, "k:ptx() returns PTX")
t.ok(fl._cuda_program(p):compile(), "fl._cuda_program(plan) is the same generator")

-- a matmul with an epilogue: the extern kernel and its fused store
local w = fl.randn(33, 16)
local g2 = fl.capture(function(a) return fl.matmul(a, w):relu() end, xin)
local k2 = g2:fuse():codegen("cuda")
t.ok(tostring(k2):find("fl_gemm", 1, true) ~= nil, "matmul + relu uses the tiled matmul")
t.is(k2:compile(), true, "and compiles")

if not have then
  t.raises(function() return k:run(xin) end, "no CUDA device: ", "k:run without a device")
else
  local y = k:run(xin)
  t.is(y.device, "cuda", "k:run returns device tensors")
  local want = p:codegen("cpu"):run(xin)
  t.ok(fl.allclose(y:cpu(), want, 1e-4, 1e-5), "the CUDA result matches the CPU program")
  local xc = xin:cuda()
  t.is(xc.device, "cuda", "x:cuda() moves")
  t.ok(fl.allclose(xc:cpu(), xin, 0, 0), "and back unchanged")
  t.is(xin:to("cuda", "float16").dtype, "float16", "x:to(\"cuda\", \"float16\")")
end
t.done()
