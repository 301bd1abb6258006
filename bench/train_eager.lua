-- train_eager.lua -- the fuselab side of bench/train_eager.py: eager
-- training steps (forward, cross-entropy, backward, AdamW) of one model
-- from the starting weights and data the driver's first run wrote.
--   build/fuselab bench/train_eager.lua <mlp|cnn|gpt> <dir> <steps> [init|compiled]
-- With "init": builds the model, writes <dir>/<model>_init.safetensors
-- and <dir>/<model>_data.safetensors, and exits.  Else prints
-- "ms <median ms of a step after two warm-up steps> loss <the last loss>
-- first <ms of the first step> rss <peak MiB resident>"; with "compiled"
-- also "saved <bytes> eager_saved <bytes>", and the whole step (zero_grad,
-- the loss, its backward, the optimizer's step) is one fl.compile'd
-- function: the loss's forward and backward a compiled pair, the step its
-- compiled update.
local name, dir, steps, init = arg[1], arg[2], tonumber(arg[3]), arg[4] == "init"
local compiled = arg[4] == "compiled"
assert(name and dir and steps, "usage: train_eager.lua <mlp|cnn|gpt> <dir> <steps> [init]")
local nn = fl.nn

local models = {
  mlp = function() return nn.Sequential(nn.Linear(512, 2048), nn.ReLU(), nn.Linear(2048, 512)) end,
  cnn = function() return fl.models.cnn{channels = {3, 16, 32}, classes = 10, input = 32} end,
  gpt = function() return fl.models.transformer{vocab = 512, d = 128, heads = 4, layers = 2, seq = 64} end,
}
local function data()
  if name == "mlp" then return {x = fl.randn(256, 512), y = (fl.rand(256) * 512):to("int64")} end
  if name == "cnn" then return {x = fl.randn(32, 3, 32, 32), y = (fl.rand(32) * 10):to("int64")} end
  return {x = (fl.rand(16, 64) * 512):to("int64"), y = (fl.rand(16, 64) * 512):to("int64")}
end
local function loss_of(m, d)
  local out = m(d.x)
  if name == "gpt" then return fl.cross_entropy(out:reshape(-1, 512), d.y:reshape(-1)) end
  return fl.cross_entropy(out, d.y)
end

fl.manual_seed(1)
local m = models[name]()
if init then
  fl.save_weights(m, dir .. "/" .. name .. "_init.safetensors")
  fl.save_safetensors(data(), dir .. "/" .. name .. "_data.safetensors")
  return
end
fl.load_weights(m, dir .. "/" .. name .. "_init.safetensors")
local d = fl.load_safetensors(dir .. "/" .. name .. "_data.safetensors")
m:train()
local opt = fl.optim.AdamW(m:parameters(), {lr = 1e-3})
local step = function(x, y)
  opt:zero_grad()
  local l = loss_of(m, {x = x, y = y})
  l:backward()
  opt:step()
  return l
end
if compiled then step = fl.compile(step) end
local times, loss, first = {}, nil, nil
for i = 1, steps + 2 do
  local t0 = fl.now()
  local l = step(d.x, d.y)
  loss = l:item()
  if i == 1 then first = (fl.now() - t0) * 1e3 end
  if i > 2 then times[#times + 1] = (fl.now() - t0) * 1e3 end
end
if compiled and (step:stats().backward_graphs ~= 1 or #opt:compiled() == 0) then
  error("train_eager.lua: the compiled step did not train compiled: " ..
        tostring(step:stats().training_note or step:stats().training_eager[1]))
end
-- the process's peak resident memory (VmHWM), and with "compiled" what the
-- forward keeps for the backward against what eager autograd keeps
local f = io.open("/proc/self/status")
local hwm = f and f:read("a"):match("VmHWM:%s*(%d+) kB")
if f then f:close() end
local saved = ""
if compiled then
  -- not counting the inputs (the data), as the PyTorch side counts
  local pinfo, inputs = step:training()[1].partition, 0
  for _, s in ipairs(pinfo.saved) do if s.input then inputs = inputs + s.bytes end end
  saved = (" saved %d eager_saved %d"):format(pinfo.saved_bytes - inputs, pinfo.eager_saved_bytes - inputs)
end
print(("ms %.3f loss %.6f first %.1f rss %.1f%s"):format(fl.measure(times).median_ms, loss, first,
      (tonumber(hwm) or 0) / 1024, saved))
