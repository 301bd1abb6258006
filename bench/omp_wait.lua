-- bench/omp_wait.lua -- how OpenMP's idle-thread policy changes compiled
-- calls: a 10-op elementwise graph on 32768 floats (a parallel loop whose
-- work is shorter than a thread's wake-up), a 256-512-256 MLP (batch 64),
-- and a 2-layer GPT-sized stack of products and kernels (8x128 tokens,
-- d 256).  Prints one line per workload: the median call with its spread
-- and whether the machine was busy while it ran.  The policy is the
-- process's own (OMP_WAIT_POLICY / GOMP_SPINCOUNT, or the fuselab
-- program's choice at start, fl.blas_info().threads):
-- bench/omp_wait.sh runs it under each, on an idle machine and on one
-- kept busy.
--   build/fuselab bench/omp_wait.lua
local fl = fl or require "fuselab"
fl.manual_seed(1)

local function tiny(x)
  local y = x * 1.5 + 0.25
  y = (y - 0.5) * x + 1.0
  y = y:abs() * 0.5 - 0.125
  y = fl.relu(y) * x - 0.5
  return y:exp() + y:tanh()
end

local w1, b1 = fl.randn(512, 256) * 0.05, fl.randn(512) * 0.1
local w2, b2 = fl.randn(256, 512) * 0.05, fl.randn(256) * 0.1
local function mlp(x) return fl.linear(fl.gelu(fl.linear(x, w1, b1)), w2, b2) end

local D, T, H = 256, 128, 4
local function layer()
  local P = {}
  for _, n in ipairs{"q", "k", "v", "o"} do
    P[n .. "_w"], P[n .. "_b"] = fl.randn(D, D) * 0.06, fl.randn(D) * 0.02
  end
  P.fc1_w, P.fc1_b = fl.randn(4 * D, D) * 0.06, fl.randn(4 * D) * 0.02
  P.fc2_w, P.fc2_b = fl.randn(D, 4 * D) * 0.03, fl.randn(D) * 0.02
  P.ln1_w, P.ln1_b, P.ln2_w, P.ln2_b = fl.ones(D), fl.zeros(D), fl.ones(D), fl.zeros(D)
  return P
end
local layers = {layer(), layer()}
local function gpt(x)
  local b, hd = x.shape[1], D // H
  local function split(t) return t:reshape(b, T, H, hd):transpose(2, 3) end
  local i, j = fl.arange(T):reshape(T, 1), fl.arange(T):reshape(1, T)
  local mask = fl.where(j:gt(i), -math.huge, 0.0)
  for _, P in ipairs(layers) do
    local h = x:layer_norm({D}, P.ln1_w, P.ln1_b, 1e-5)
    local q = split(fl.linear(h, P.q_w, P.q_b))
    local k = split(fl.linear(h, P.k_w, P.k_b))
    local v = split(fl.linear(h, P.v_w, P.v_b))
    local s = q:matmul(k:transpose(-2, -1)) * (1.0 / math.sqrt(hd)) + mask
    local a = s:softmax(-1):matmul(v):transpose(2, 3):reshape(b, T, D)
    x = x + fl.linear(a, P.o_w, P.o_b)
    local g = x:layer_norm({D}, P.ln2_w, P.ln2_b, 1e-5)
    x = x + fl.linear(fl.gelu(fl.linear(g, P.fc1_w, P.fc1_b)), P.fc2_w, P.fc2_b)
  end
  return x
end

print("threads: " .. fl.blas_info().threads)
for _, w in ipairs{{"elementwise 32768", tiny, fl.randn(32768), 200},
                   {"MLP 64x256", mlp, fl.randn(64, 256), 50},
                   {"GPT 8x128 d256", gpt, fl.randn(8, T, D), 15}} do
  local cf = fl.compile(w[2])
  local t = fl.measure(cf, {args = {w[3]}, runs = w[4], warmup = 3, budget_s = 3})
  print(("%-18s %s"):format(w[1], tostring(t)))
end
