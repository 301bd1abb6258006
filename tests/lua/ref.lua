-- ref.lua -- fuselab's ready models against PyTorch.  tests/ref/make_ref.py
-- built the same MLP, transformer and CNN in PyTorch 1.13 and wrote their
-- weights (.safetensors), an input and PyTorch's eager output (.npy); here
-- the weights go into fl.models.* through fl.load_weights and the outputs
-- must match.
--
-- Tolerance: float32 throughout, atol 1e-5 and rtol 1e-4 (|got - want| <=
-- atol + rtol * |want|).  Both sides compute in float32 but sum in
-- different orders (BLAS blocking, the reductions in softmax and
-- layer_norm), which moves the last bits: over dot products of at most 128
-- terms of magnitude about 1 that is ~1e-6, ten times under atol.  A real
-- mistake (a transposed weight, a missing mask, the tanh GELU for the erf
-- one) is off by 1e-3 or more.  The measured worst errors are printed.

local fl = fl or require "fuselab"
local t = require "tap"

local src = os.getenv("FUSELAB_SRC")
local dir = src and (src .. "/tests/ref/")
  or (debug.getinfo(1, "S").source:match("^@(.*/)lua/[^/]*$") or "tests/") .. "ref/"

local RTOL, ATOL = 1e-4, 1e-5

local function max_err(got, want)
  local diff = (got - want):abs()
  return diff:amax():item(), (diff / (want:abs() + 1e-12)):amax():item()
end

-- Load the weights and the input into model, run it in eval mode, and
-- check the output against PyTorch's.  Returns the output.
local function check(name, model)
  local okay, err = pcall(fl.load_weights, model, dir .. name .. ".safetensors")
  t.ok(okay, name .. ": PyTorch's weights load" .. (okay and "" or (": " .. tostring(err))))
  if not okay then return end
  model:eval()
  local x = fl.load(dir .. name .. "_x.npy")
  local want = fl.load(dir .. name .. "_y.npy")
  local got = model(x)
  t.is(got.shape, want.shape, name .. ": output shape " .. table.concat(want.shape, "x"))
  local abs, rel = max_err(got, want)
  t.diag(string.format("%s: max abs err %.3g, max rel err %.3g (atol %g, rtol %g)",
                       name, abs, rel, ATOL, RTOL))
  t.ok(fl.allclose(got, want, RTOL, ATOL), name .. ": eager output matches PyTorch's")
  return got, x, want
end

-- fl.models.mlp{sizes={16, 32, 32, 4}, act="gelu"}
fl.manual_seed(1)
local mlp = fl.models.mlp{sizes = {16, 32, 32, 4}, act = "gelu"}
check("mlp", mlp)

-- fl.models.transformer{vocab=50, d=32, heads=4, layers=2, seq=8}
local gpt = fl.models.transformer{vocab = 50, d = 32, heads = 4, layers = 2, seq = 8}
local _, idx = check("transformer", gpt)
t.is(idx and idx.dtype, "int64", "transformer: token ids are int64")

-- fl.models.cnn{channels={3, 4, 8}, classes=5, input=8}; BatchNorm's
-- running statistics come from the file too
local cnn = fl.models.cnn{channels = {3, 4, 8}, classes = 5, input = 8}
check("cnn", cnn)
t.is(cnn.modules[2].num_batches_tracked:item(), 7, "cnn: num_batches_tracked loaded (int64 buffer)")

-- The weights fuselab writes load back into a fresh model and give the
-- same output bit for bit (the file round trip loses nothing).
do
  local tmp = os.tmpname()
  fl.save_weights(gpt, tmp)
  local again = fl.models.transformer{vocab = 50, d = 32, heads = 4, layers = 2, seq = 8}
  fl.load_weights(again, tmp):eval()
  local x = fl.load(dir .. "transformer_x.npy")
  t.ok(fl.allclose(again(x), gpt(x), 0, 0), "transformer: saved and reloaded weights give identical output")
  os.remove(tmp)
end

-- ==== compiled vs PyTorch ==================================================
-- The same files and tolerances, through fl.compile (fused, generated C):
-- the compiled graph sums in yet another order, which they already allow.
for _, case in ipairs{{"mlp", mlp}, {"transformer", gpt}, {"cnn", cnn}} do
  local name, model = case[1], case[2]
  local x = fl.load(dir .. name .. "_x.npy")
  local want = fl.load(dir .. name .. "_y.npy")
  local cm = fl.compile(model)
  local got = cm(x)
  local abs, rel = max_err(got, want)
  t.diag(string.format("%s compiled: max abs err %.3g, max rel err %.3g", name, abs, rel))
  t.ok(fl.allclose(got, want, RTOL, ATOL), name .. ": compiled output matches PyTorch's")
  t.ok(fl.allclose(cm(x), want, RTOL, ATOL), name .. ": and again from the cache")
  local s = cm:stats()
  t.ok(s.kernels >= 1 and s.fallbacks == 0, name .. ": ran generated kernels, no fallback")
end

t.done()
