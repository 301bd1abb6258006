-- torch_compile.lua -- the fuselab side of bench/torch_compile.py: one
-- workload, compiled, on the .npy weights and inputs the driver wrote.
-- Prints "ms <best ms per call> sum <sum of the output>" (for "cold": the
-- first call's time, compile included).  The functions mirror the
-- PyTorch ones in bench/torch_compile.py line for line.
--   build/fuselab bench/torch_compile.lua <workload> <dir>
local name, dir = arg[1], arg[2]
assert(name and dir, "usage: torch_compile.lua <workload> <dir>")
local B, T, D, H, V, LAYERS = 8, 128, 256, 4, 512, 2

local function load(k) return fl.load(dir .. "/" .. k .. ".npy") end

local function block_fn(P, prefix)
  local hd = D // H
  local function W(n) return P[prefix .. n] end
  local function split(t, b) return t:reshape(b, T, H, hd):transpose(2, 3) end
  return function(x)
    local b = x.shape[1]
    local h = x:layer_norm({D}, W("ln1_w"), W("ln1_b"), 1e-5)
    local q = split(fl.linear(h, W("q_w"), W("q_b")), b)
    local k = split(fl.linear(h, W("k_w"), W("k_b")), b)
    local v = split(fl.linear(h, W("v_w"), W("v_b")), b)
    local i = fl.arange(T):reshape(T, 1)
    local j = fl.arange(T):reshape(1, T)
    local mask = fl.where(j:gt(i), -math.huge, 0.0)
    local s = q:matmul(k:transpose(-2, -1)) * (1.0 / math.sqrt(hd)) + mask
    local a = s:softmax(-1):matmul(v)
    a = a:transpose(2, 3):reshape(b, T, D)
    local x2 = x + fl.linear(a, W("o_w"), W("o_b"))
    local g = x2:layer_norm({D}, W("ln2_w"), W("ln2_b"), 1e-5)
    local f = fl.gelu(fl.linear(g, W("fc1_w"), W("fc1_b")))
    return x2 + fl.linear(f, W("fc2_w"), W("fc2_b"))
  end
end

local function params(prefix)
  local P = {}
  for _, n in ipairs{"ln1_w", "ln1_b", "q_w", "q_b", "k_w", "k_b", "v_w", "v_b", "o_w", "o_b",
                     "ln2_w", "ln2_b", "fc1_w", "fc1_b", "fc2_w", "fc2_b"} do
    P[prefix .. n] = load(prefix .. n)
  end
  return P
end

local fn, args
if name == "chain" then
  args = {load("chain_x")}
  fn = function(x)
    local y = x * 1.5 + 0.25
    y = (y - 0.5) * x + 1.0
    y = y:abs() * 0.5 - 0.125
    return fl.relu(y)
  end
elseif name == "softmax" then
  args = {load("rows_x")}
  fn = function(x) return x:softmax(-1) end
elseif name == "layer_norm" then
  args = {load("rows_x"), load("ln_w"), load("ln_b")}
  fn = function(x, w, b) return x:layer_norm({1024}, w, b, 1e-5) end
elseif name == "mlp" then
  args = {load("mlp_x")}
  local w1, b1, w2, b2 = load("mlp_w1"), load("mlp_b1"), load("mlp_w2"), load("mlp_b2")
  fn = function(x) return fl.linear(fl.gelu(fl.linear(x, w1, b1)), w2, b2) end
elseif name == "block" or name == "cold" then
  args = {load("block_x")}
  fn = block_fn(params("b0_"), "b0_")
elseif name == "gpt" then
  args = {load("gpt_idx")}
  local tok, pos = load("gpt_tok"), load("gpt_pos")
  local lnf_w, lnf_b, head = load("gpt_lnf_w"), load("gpt_lnf_b"), load("gpt_head")
  local blocks = {}
  for l = 0, LAYERS - 1 do blocks[#blocks + 1] = block_fn(params("g" .. l .. "_"), "g" .. l .. "_") end
  fn = function(idx)
    local x = fl.embedding(idx, tok) + fl.embedding(fl.arange(T), pos)
    for _, blk in ipairs(blocks) do x = blk(x) end
    return fl.linear(x:layer_norm({D}, lnf_w, lnf_b, 1e-5), head)
  end
elseif name == "dispatch" then
  args = {load("tiny_x")}
  fn = function(x) return x * 2.0 + 1.0 end
else
  error("unknown workload " .. tostring(name))
end

local cf = fl.compile(fn)
local t0 = fl.now()
local out = cf(table.unpack(args))
local first = fl.now() - t0
local function sum(t) return t:sum():item() end
if name == "cold" then
  print(("ms %.6f sum %.6e"):format(first * 1e3, sum(out)))
  return
end
local reps = name == "dispatch" and 2000 or 10
for _ = 1, 3 do cf(table.unpack(args)) end
local best = math.huge
for _ = 1, 5 do
  t0 = fl.now()
  for _ = 1, reps do out = cf(table.unpack(args)) end
  best = math.min(best, (fl.now() - t0) / reps)
end
print(("ms %.6f sum %.6e"):format(best * 1e3, sum(out)))
