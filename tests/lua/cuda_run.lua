-- cuda_run.lua -- the CUDA path executed: models compiled for "cuda" match
-- the CPU, modules moved with m:cuda() keep their weights on the device
-- (no copy per call), CUDA graphs replay with no launch one by one,
-- capture takes device tensors, per-kernel profiles, and the out-of-memory
-- error names the device.  Needs a device: on a machine without one it
-- runs on the CUDA emulator (tests/gpu/emu/run), else it skips.
local fl = fl or require "fuselab"
local t = require "tap"

local have, why = fl.cuda_available()
if not have then
  t.skip("no CUDA device (" .. tostring(why) .. "); the emulator runs this file", 1)
  t.done()
  return
end

-- float32 products and reductions are summed in another order on the
-- device: the tolerance of the GPU differential test
local RTOL, ATOL = 2e-3, 1e-4
local function close(a, b) return fl.allclose(a:cpu(), b:cpu(), RTOL, ATOL) end

-- multi-head attention: the heads merged back by reshape(transpose(...))
do
  fl.manual_seed(1)
  local m = nn.MultiheadAttention(64, 4, {causal = true}):eval()
  local x = fl.randn(2, 16, 64)
  local want = m(x)
  local cm = fl.compile(m, {backend = "cuda"})
  local y = cm(x)
  t.ok(y.device == "cuda", "MultiheadAttention on cuda: the result is on the device")
  t.ok(close(y, want), "MultiheadAttention(64, 4) on cuda matches the CPU")
  t.is(cm:stats().fallbacks, 0, "MultiheadAttention: no fallback")
end

-- a transformer over two lengths, weights moved to the device
do
  fl.manual_seed(2)
  local gpt = fl.models.transformer{vocab = 40, d = 32, heads = 2, layers = 1, seq = 32}:eval()
  local ids = {fl.tensor{{1, 5, 7, 2, 9, 3, 0, 4}}, fl.tensor{{3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8}}}
  local want = {}
  for i, x in ipairs(ids) do want[i] = gpt(x) end
  gpt:cuda()
  local p = gpt:parameters()
  local on = true
  for _, w in ipairs(p) do on = on and w.device == "cuda" end
  t.ok(on, "m:cuda() moves every parameter (" .. #p .. ")")
  local cm = fl.compile(gpt, {backend = "cuda"})
  local ok = true
  for i, x in ipairs(ids) do ok = ok and close(cm(x:cuda()), want[i]) end
  t.ok(ok, "transformer on cuda over two lengths matches the CPU")
  local x = ids[1]:cuda()
  cm(x)                                  -- the steady state: weights bound
  local before = fl.cuda_info()
  cm(x)
  local after = fl.cuda_info()
  t.is(after.h2d_bytes - before.h2d_bytes, 0,
       "resident weights, device input: a call copies nothing to the device")
  t.ok(after.launches > before.launches, "and launches its kernels")
  gpt:cpu()
  t.ok(gpt:parameters()[1].device == "cpu", "m:cpu() moves them back")
end

-- tied weights stay tied through m:to("cuda")
do
  local m = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4))
  local a, b = m:children()[1], m:children()[2]
  b.weight = a.weight
  m:to("cuda")
  t.ok(rawequal(a.weight, b.weight) and a.weight.device == "cuda",
       "m:to('cuda') keeps a tied weight one tensor, on the device")
end

-- reduce-overhead: one CUDA graph replay per call, nothing launched by itself
do
  local m = nn.Sequential(nn.Linear(32, 64), nn.GELU(), nn.Linear(64, 32)):cuda()
  local x = fl.randn(8, 32):cuda()
  local want = m(x)
  local cm = fl.compile(m, {backend = "cuda", mode = "reduce-overhead"})
  cm(x)
  cm(x)
  local before = fl.cuda_info()
  local y = cm(x)
  local after = fl.cuda_info()
  t.ok(close(y, want), "reduce-overhead on cuda matches eager")
  t.is(after.graph_replays - before.graph_replays, 1, "reduce-overhead: a call is one graph replay")
  t.is(after.h2d_bytes - before.h2d_bytes, 0, "a replay copies nothing from the host")
end

-- a compiled call on the device runs its programs from C: an entry's, and
-- each recorded segment's of a function with a graph break, with no
-- library Lua function called (before, each segment's CUDA program was run
-- through a Lua runner)
do
  local w = fl.randn(16, 16):cuda()
  local f = fl.compile(function(x)
    local y = x:matmul(w):relu()
    fl.graph_break()
    return (y * 2):sum(2)
  end, {backend = "cuda"})
  local g = fl.compile(function(x) return x:matmul(w):gelu() end, {backend = "cuda"})
  local x = fl.randn(4, 16):cuda()
  for _ = 1, 2 do f(x); g(x) end
  local lua_calls = 0
  local function count()   -- the library's Lua functions (the body itself replays)
    local i = debug.getinfo(2, "S")
    if i.what == "Lua" and not i.source:find("cuda_run.lua", 1, true) then lua_calls = lua_calls + 1 end
  end
  debug.sethook(count, "c")
  local a, b = f(x), g(x)
  debug.sethook()
  local want = (x:cpu():matmul(w:cpu()):relu() * 2):sum(2)
  t.ok(close(a, want) and close(b, x:cpu():matmul(w:cpu()):gelu()) and f:stats().replays >= 1,
       "compiled calls on cuda, one replaying the segments around a break, give eager's values")
  t.is(lua_calls, 0, "those calls ran their CUDA programs without calling the library's Lua")
end

-- capture takes device tensors
do
  local x = fl.randn(4, 8):cuda()
  local g = fl.capture(function(a) return (a * 2):relu():sum(2) end, x)
  local k = g:fuse():codegen("cuda")
  local y = k:run(x)
  t.ok(close(y, (x:cpu() * 2):relu():sum(2)), "fl.capture(f, x) with x on cuda, run on cuda")
  k:profile(true)
  k:run(x)
  local prof = k:profile()
  t.ok(prof.runs == 1 and #prof >= 1 and prof[1].ms >= 0, "k:profile() times CUDA kernels")
end

-- a graph the device cannot lower (a cat of 17 tensors: the CUDA cat takes
-- at most 16) falls back to the eager kernels, counted, with right results
do
  local xs = {}
  for i = 1, 17 do xs[i] = fl.randn(2, 3):cuda() end
  local f = function(...) return fl.cat({...}, 1):relu() * 2 end
  local want = f(table.unpack(xs))
  local cm = fl.compile(f, {backend = "cuda"})
  local y = cm(table.unpack(xs))
  t.ok(close(y, want) and y.device == "cuda", "cat of 17 on cuda: falls back, right results on the device")
  t.is(cm:stats().fallbacks, 1, "the fallback is counted")
  t.ok(close(cm(table.unpack(xs)), want), "and the next call too")
end

-- out of device memory names the device and the size
do
  local big = fl.ones(1):cuda():expand(1 << 37)   -- a view of 512 GiB: no memory yet
  local ok, err = pcall(function() return big:contiguous() end)
  t.ok(not ok and tostring(err):find("out of device memory on", 1, true) ~= nil
       and tostring(err):find("bytes", 1, true) ~= nil,
       "an absurd device allocation names the device and size: " .. tostring(err))
  local y = fl.ones(3):cuda()
  t.ok(close(y + 1, fl.full({3}, 2)), "the device works after it")
end

-- a backward graph on the device: max_pool2d's gradient over overlapping
-- windows (3x3, stride 2, padding 1; ties after relu go to the first max)
do
  fl.manual_seed(4)
  local x = fl.randn(2, 3, 9, 7):relu():requires_grad_()
  local y = (x:max_pool2d({3, 3}, {stride = 2, padding = 1}) * fl.randn(2, 3, 5, 4)):sum()
  local out = fl.backward_graph(y):fuse():codegen("cuda"):run()
  y:backward()
  t.ok(out.device == "cuda" and close(out, x.grad),
       "max_pool2d's backward graph on cuda gives eager backward's gradient")
  -- embedding's: rows of repeated ids summed (index_add)
  local w = fl.randn(7, 5, {requires_grad = true})
  local e = (fl.embedding(fl.tensor{{3, 1, 3}, {0, 3, 6}}, w) * fl.randn(2, 3, 5)):sum()
  local gw = fl.backward_graph(e):fuse():codegen("cuda"):run()
  e:backward()
  t.ok(gw.device == "cuda" and close(gw, w.grad), "embedding's backward graph on cuda: repeated ids add up")
end

-- a model loaded from ONNX, its weights moved with m:cuda(), a dynamic batch
do
  local src = os.getenv("FUSELAB_SRC") or ".."
  local m = fl.load_onnx(src .. "/tests/fuzz/corpus_onnx/mlp.onnx")
  fl.manual_seed(3)
  local xs = {fl.randn(2, 4), fl.randn(5, 4)}
  local want = {m(xs[1]), m(xs[2])}
  m:cuda()
  local cm = fl.compile(m, {backend = "cuda"})
  for i, x in ipairs(xs) do
    local y = cm(x:cuda())
    t.ok(y.device == "cuda" and close(y, want[i]), ("ONNX mlp on cuda, batch %d, matches the CPU"):format(x.shape[1]))
  end
  t.is(cm:stats().fallbacks, 0, "ONNX mlp on cuda: no fallback")
end

-- a language model's decode step compiled for cuda with CUDA graphs: the
-- greedy tokens of the CPU's eager decoding, each step a graph replay
do
  local dir = (os.getenv("FUSELAB_SRC") or ".") .. "/tests/llm/data/models/llama"
  local m = fl.models.load_pretrained(dir)
  local want = m:generate({40, 280, 322}, {max_new_tokens = 12, stop = {}})
  local opts = {max_new_tokens = 12, stop = {}, compile = true, backend = "cuda", mode = "reduce-overhead"}
  m:generate({40, 280, 322}, opts)                    -- compiles and captures the graph
  local i0 = fl.cuda_info()
  local got, st = m:generate({40, 280, 322}, opts)
  local i1 = fl.cuda_info()
  t.is(got, want, "llama decoding on cuda (CUDA graphs): the CPU's greedy tokens")
  t.ok(st.step_compiles == 1 and i1.graph_replays - i0.graph_replays == 11,
       string.format("one compile, 11 decode steps replayed as graphs (%d)", i1.graph_replays - i0.graph_replays))
end

-- a product whose operand dies in its kernel, the epilogue storing values
-- that may take that operand's slot (LinearAttention's delta rule): fused
-- into the product the stores would race the other blocks' reads of the
-- operand (the emulator runs the threads in two orders and compares), so
-- such an epilogue runs after the product
do
  fl.manual_seed(6)
  local f = function(a, x, w, c, d)
    local b = (x * w):exp()                          -- [2,1,8], read only by the product
    local s = fl.matmul(a, b:unsqueeze(3)) + c       -- [2,1,8,1] @ [2,1,1,8], stored in b's slot
    local u = s * d:exp():unsqueeze(4)
    return fl.matmul(s, u):sum()
  end
  local args = {fl.randn(2, 1, 8, 1), fl.randn(2, 1, 8), fl.randn(2, 1, 8), fl.randn(2, 1, 8, 8), fl.randn(2, 1, 8)}
  local want = f(table.unpack(args))
  local dev = {}
  for i, a in ipairs(args) do dev[i] = a:cuda() end
  local cm = fl.compile(f, {backend = "cuda"})
  local ok, r = pcall(cm, table.unpack(dev))
  t.ok(ok and close(r, want) and cm:code():find("-> buf0, buf2", 1, true) ~= nil,
       "an epilogue storing into the slot of the product's own operand: no race, the CPU's value" ..
       (ok and "" or (": " .. tostring(r))))
end

t.done()
