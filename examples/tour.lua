-- tour.lua -- the guided tour of fuselab, run by README's first command.
-- It walks the pipeline stage by stage; each section prints what it shows.
-- Run it yourself: fuselab examples/tour.lua

local fl = fl or require "fuselab"

local function section(title)
  print(("\n== %s %s"):format(title, ("="):rep(math.max(0, 66 - #title))))
end

section("1. Tensors")
fl.manual_seed(0)
local x = fl.tensor{{1.0, 2, 3}, {4, 5, 6}}
print("x = fl.tensor{{1.0,2,3},{4,5,6}}   (a float anywhere makes it float32)")
print(x)
print("x.shape = {" .. table.concat(x.shape, ", ") .. "}, dtype " .. x.dtype)
local r = fl.randn(2, 3)
print("fl.randn(2, 3) after fl.manual_seed(0):")
print(r)

section("2. Eager ops, as in PyTorch")
print("x * 2 + 1:")
print(x * 2 + 1)
print("x:softmax(-1)  (dims are 1-based; -1 is the last):")
print(x:softmax(-1))
print("x:sum(1) =", table.concat(x:sum(1):tolist(), ", "))
print("x:matmul(x:transpose(1, 2)):")
print(x:matmul(x:transpose(1, 2)))
print("a view shares storage: y = x * 1; v = y:view(3, 2); v:fill_(7) fills y too")
local y = x * 1
local v = y:view(3, 2)
v:fill_(7)
print(y)

section("3. Errors name what was wrong")
local ok, msg = pcall(function() return fl.ones(64, 128):matmul(fl.ones(64, 10)) end)
print("fl.ones(64,128):matmul(fl.ones(64,10)) ->", ok and "no error?" or msg)
ok, msg = pcall(function() return fl.zeros(1e15) end)
print("fl.zeros(1e15) ->", ok and "no error?" or msg)

section("4. How fast is eager?")
local n = 1 << 22
local a, b = fl.rand(n), fl.rand(n)
local reps = 20
local t0 = fl.now()
for _ = 1, reps do local _ = a + b end
local dt = (fl.now() - t0) / reps
print(("a + b over %d float32: %.2f ms, %.1f GB/s (3 x 4 bytes per element)"):format(
  n, dt * 1e3, 12 * n / dt / 1e9))

print("\nThe tour ends here for now; capture, fusion, code generation and")
print("pictures join it as they land.  Start the REPL with ./build/fuselab")
