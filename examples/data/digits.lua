-- digits.lua -- the handwritten digits of digits.txt as tensors, split the
-- same way everywhere (examples/train_digits.lua trains on the first part,
-- the lessons check the shipped model on the second):
--   local Xtrain, Ytrain, Xtest, Ytest = dofile(dir .. "/digits.lua")(dir)
-- X: float32 [n, 64], pixels scaled to 0..1; Y: int64 [n], labels 0..9.
local fl = fl or require "fuselab"

return function(dir)
  local f = assert(io.open(dir .. "/digits.txt", "r"), "digits: cannot open " .. dir .. "/digits.txt")
  local pixels, labels = {}, {}
  for line in f:lines() do
    local label, px = line:match("^(%d) (%w+)$")
    if label then
      local row = {}
      for k = 1, 64 do row[k] = tonumber(px:sub(k, k), 17) / 16 end
      pixels[#pixels + 1] = row
      labels[#labels + 1] = tonumber(label)
    end
  end
  f:close()
  -- a fixed shuffle (Lua's own generator: the same on every machine), then
  -- 80 % to train on and 20 % held out
  local n = #labels
  math.randomseed(2024)
  for i = n, 2, -1 do
    local j = math.random(i)
    pixels[i], pixels[j] = pixels[j], pixels[i]
    labels[i], labels[j] = labels[j], labels[i]
  end
  local X, Y = fl.tensor(pixels), fl.tensor(labels)
  local ntrain = math.floor(n * 0.8)
  return X:narrow(1, 1, ntrain), Y:narrow(1, 1, ntrain),
         X:narrow(1, ntrain + 1, n - ntrain), Y:narrow(1, ntrain + 1, n - ntrain)
end
