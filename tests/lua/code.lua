-- code.lua -- cm:code() and print(k) show the host program first, as
-- Inductor's output_code shows call(): the arguments, the buffers and the
-- reuse of their slots, the kernel and library (extern) calls in the order
-- they run with their arguments, what is freed, what is returned; then the
-- kernels; the preamble only with {preamble = true}.
local t = require "tap"

fl.manual_seed(0)
local model = fl.models.mlp{sizes = {16, 32, 4}}
local cm = fl.compile(model, {backend = "cpu"})
local x = fl.randn(8, 16)
cm(x)
local code = cm:code()
t.ok(code:find("^/%* %-%-%-%- graph 1 %-%-%-%- %*/\n/%* host program %(cpu%)"), "the host program comes first")
t.ok(code:find("call(x: float32[8,16]):", 1, true), "the call and its argument")
t.ok(code:find("0.weight float32[32,16]", 1, true), "the parameters")
t.ok(code:find("buf0 = empty(float32[8,32])", 1, true), "a buffer with its shape")
local l1 = code:find("extern linear(x, 0.weight, 0.bias) + epilogue relu -> buf0", 1, true)
local l2 = code:find("extern linear(buf0, 2.weight, 2.bias) -> out0", 1, true)
t.ok(l1 and l2 and l1 < l2, "the library calls in order, with arguments and the fused epilogue")
t.ok(code:find("del buf0", 1, true), "where a buffer is freed")
t.ok(code:find("return out0", 1, true), "what is returned")
t.ok(code:find("void fl_k0_", 1, true), "the kernels follow")
t.ok(not code:find("#include", 1, true), "no preamble by default")
local full = cm:code{preamble = true}
t.ok(full:find("#include <math.h>", 1, true), "the preamble with {preamble = true}")
t.ok(full:find("call(x: float32[8,16]):", 1, true), "and the host program still first")
t.raises(function() cm:code("yes") end, "code: expected an options table", "a bad option")

-- a longer graph: a slot taken again is a reuse
local p = fl.capture(function(a)
  local b = (a * 2):exp():sum(-1, true)
  local c = (a - b):relu():amax(-1, true)
  return (a / c):tanh():sum(-1)
end, fl.randn(16, 64)):decompose():optimize():fuse()
local k = p:codegen("cpu")
local s = tostring(k)
t.is(s, k:code(), "print(k) is k:code()")
t.ok(s:find("^/%* host program %(cpu%)"), "print(k) starts with the host program")
local nk = 0
for _ in s:gmatch("\n  k%d+ ") do nk = nk + 1 end
t.is(nk, p:stats().kernels, "every kernel call is listed once")
t.ok(k:source():find("#include", 1, true), "k:source() stays the whole compilable file")
t.ok(#k:code{preamble = true} > #s, "k:code{preamble = true} adds the preamble")

t.done()
