-- train_digits.lua -- train a small network on real data: the UCI
-- handwritten digits (examples/data/digits.txt, 1797 images of 8x8), with
-- autograd, cross-entropy and AdamW, in a few seconds.  Prints the loss
-- and the test accuracy after every epoch; exits non-zero when the test
-- accuracy ends below 95 %.
--
--   fuselab examples/train_digits.lua [--save PATH] [--epochs N]
--
-- --save writes the trained weights (a safetensors file under PyTorch's
-- names: 0.weight, 0.bias, 2.weight, 2.bias); examples/models/digits_mlp
-- .safetensors was made so and is what the lessons load wherever an
-- accuracy check must be able to fail.
local fl = fl or require "fuselab"
local nn = fl.nn

local here = (arg and arg[0] or ""):match("^(.*)/[^/]*$") or "."
local save, epochs = nil, 12
do
  local i = 1
  while arg and arg[i] do
    if arg[i] == "--save" then save, i = arg[i + 1], i + 2
    elseif arg[i] == "--epochs" then epochs, i = tonumber(arg[i + 1]), i + 2
    else error("train_digits: unknown argument " .. arg[i]) end
  end
end

local Xtr, Ytr, Xte, Yte = dofile(here .. "/data/digits.lua")(here .. "/data")
local ntrain, n = Xtr.shape[1], Xtr.shape[1] + Xte.shape[1]

fl.manual_seed(0)
local model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 10))
local opt = fl.optim.AdamW(model:parameters(), {lr = 3e-3, weight_decay = 1e-4})

local function accuracy(x, y)
  return fl.no_grad(function()
    local pred = model(x):argmax(2)
    return pred:eq(y):to("float32"):mean():item()
  end)
end

print(("%d training images, %d held out; an MLP 64-128-10 of %d parameters, AdamW"):format(
  ntrain, n - ntrain, model:nparameters()))
local batch, t0, acc = 64, fl.now(), 0
for epoch = 1, epochs do
  model:train()
  local total, seen = 0, 0
  for s = 1, ntrain, batch do
    local len = math.min(batch, ntrain - s + 1)
    local loss = fl.cross_entropy(model(Xtr:narrow(1, s, len)), Ytr:narrow(1, s, len))
    opt:zero_grad()
    loss:backward()
    opt:step()
    total, seen = total + loss:item() * len, seen + len
  end
  model:eval()
  acc = accuracy(Xte, Yte)
  print(("epoch %2d  loss %.4f  test accuracy %5.1f %%  (%.1f s)"):format(
    epoch, total / seen, acc * 100, fl.now() - t0))
end

if save then
  fl.save_weights(model, save)
  print("saved the weights to " .. save)
end
if acc < 0.95 then
  io.stderr:write(("train_digits: test accuracy %.1f %% is below 95 %%\n"):format(acc * 100))
  os.exit(1)
end
