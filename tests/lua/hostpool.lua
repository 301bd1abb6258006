-- hostpool.lua -- big host tensors are kept for reuse (graph/hostpool.c):
-- a freed buffer comes back for the next tensor of its size class with its
-- old contents, so zeros must still be zeros and every compiled result
-- must still match; what is kept stays under its limit, and is given back
-- when memory runs out.  The AddressSanitizer build keeps nothing.
local fl = fl or require "fuselab"
local t = require "tap"

local asan = os.getenv("FUSELAB_ASAN") == "1"
local exe = os.getenv("FUSELAB") or arg[-1]
local MiB = 1024 * 1024

local function info() collectgarbage(); collectgarbage(); return fl.host_pool_info() end

local p0 = info()
if asan then
  t.is(p0.limit, 0, "ASan build: nothing is kept")
else
  t.ok(p0.limit > 0 and p0.limit <= 1024 * MiB, "the limit is at most 1 GiB: " .. p0.limit)
end

-- a dirty block comes back zeroed for fl.zeros, and whole for a kernel
do
  local n = 1024 * 1024                      -- 4 MiB of float32
  local x = fl.ones(n) * 3
  t.is(x:sum():item(), 3 * n, "a 4 MiB tensor is written")
  x = nil
  local before = info()
  if not asan then t.ok(before.kept >= 4 * MiB, "a freed 4 MiB tensor is kept: " .. before.kept) end
  local z = fl.zeros(n)
  local after = fl.host_pool_info()
  if not asan then t.is(after.reuses - before.reuses, 1, "fl.zeros of the same size reuses it") end
  t.is(z:sum():item(), 0.0, "and it is all zeros")
  t.is(z:abs():amax():item(), 0.0, "every element")
end

-- repeated compiled calls: the outputs' memory is reused, every result right
do
  local f = function(a) return (a * 1.5 + 0.25):softmax(-1) end
  local cf = fl.compile(f)
  local okall, worst = true, 0
  for i, shape in ipairs{{1024, 1024}, {512, 513}, {4096, 256}, {1024, 1025}, {256, 1023}, {2049, 1024}} do
    local x = fl.randn(table.unpack(shape))
    local want = f(x)
    cf(x)
    local before = info()
    for _ = 1, 8 do
      local y = cf(x)
      local d = (y - want):abs():amax():item()
      worst = math.max(worst, d)
      if d > 1e-6 then okall = false end
      y = nil
      collectgarbage()
    end
    local after = info()
    if not asan and shape[1] * shape[2] * 4 >= MiB then
      t.ok(after.maps - before.maps <= 1, ("%dx%d: 8 calls map fresh memory at most once (%d)")
           :format(shape[1], shape[2], after.maps - before.maps))
    end
    t.ok(okall, ("%dx%d: compiled equals eager within 1e-6 on every call (worst %.2g)")
         :format(shape[1], shape[2], worst))
  end
end

-- a loop that drops each output without collecting: the collection the
-- storage accounting runs brings the old outputs' blocks back, so after
-- the first cycles no call maps fresh memory (512 KiB: a size malloc's
-- heap would hand back to the kernel, and a 64 MiB collection interval
-- left the first 128 calls all writing into fresh pages)
do
  local w = fl.randn(512, 512) * 0.05
  local f = function(a) return fl.gelu(a:matmul(w)) end
  local cf = fl.compile(f)
  local x = fl.randn(256, 512)
  local want = f(x)
  local y
  for _ = 1, 100 do y = cf(x) end
  local before = fl.host_pool_info()
  for _ = 1, 100 do y = cf(x) end
  local after = fl.host_pool_info()
  if not asan then
    t.ok(after.maps - before.maps <= 1, ("calls 101-200 of a 512 KiB output map fresh memory at most once (%d)")
         :format(after.maps - before.maps))
    t.ok(after.reuses - before.reuses >= 100, ("and reuse kept blocks (%d)"):format(after.reuses - before.reuses))
  end
  t.ok((y - want):abs():amax():item() <= 1e-5, "the last of them still equals eager within 1e-5")
end

-- a child process: the limit, and memory given back when it runs out
local function child(env, code)
  local path = os.tmpname()
  local f = assert(io.open(path, "w"))
  f:write(code)
  f:close()
  local p = io.popen(env .. " '" .. exe .. "' " .. path .. " 2>&1")
  local out = p:read("a")
  p:close()
  os.remove(path)
  return out
end

local hold = [[
local MiB = 1024 * 1024
local xs = {}
for i = 1, 6 do xs[i] = fl.zeros(MiB) end          -- 6 x 4 MiB alive at once
xs = nil
collectgarbage(); collectgarbage()
local p = fl.host_pool_info()
print("kept", p.kept // MiB, "limit", p.limit // MiB)
]]
if not asan then
  local out = child("FUSELAB_HOST_POOL_MB=8", hold)
  local kept, limit = out:match("kept%s+(%d+)%s+limit%s+(%d+)")
  t.is(tonumber(limit), 8, "FUSELAB_HOST_POOL_MB=8 sets the limit" .. (limit and "" or (": " .. out)))
  t.ok(tonumber(kept) and tonumber(kept) <= 8 and tonumber(kept) >= 4,
       "six freed 4 MiB blocks: 4-8 MiB kept under an 8 MiB limit (" .. tostring(kept) .. ")")
  out = child("FUSELAB_HOST_POOL_MB=0", hold)
  t.ok(out:match("kept%s+0%s+limit%s+0"), "FUSELAB_HOST_POOL_MB=0 keeps nothing: " .. out:sub(1, 80))
  out = child("FUSELAB_HOST_POOL_MB=junk", hold)
  t.ok(out:match("limit%s+(%d+)") and tonumber(out:match("limit%s+(%d+)")) > 8,
       "a malformed FUSELAB_HOST_POOL_MB keeps the default: " .. out:sub(1, 80))

  -- 800 MiB kept, then a 1.4 GiB tensor under a 2.4 GB address-space limit:
  -- it only fits once the kept blocks are given back
  out = child("ulimit -v 2500000; FUSELAB_HOST_POOL_MB=1024", [[
local MiB = 1024 * 1024
local xs = {}
for i = 1, 4 do xs[i] = fl.zeros(50 * MiB) end     -- 4 x 200 MiB
xs = nil
collectgarbage(); collectgarbage()
print("kept", fl.host_pool_info().kept // MiB)
local ok, big = pcall(fl.zeros, 350 * MiB)         -- 1400 MiB
print("big", ok and big.shape[1] or big)
big = nil
collectgarbage()
local ok2, err = pcall(fl.zeros, 900 * MiB)         -- 3600 MiB: cannot fit
print("huge", ok2, err)
print("after", (fl.ones(4) * 2):sum():item())
]])
  t.ok(out:match("kept%s+800"), "800 MiB kept: " .. out:sub(1, 200))
  t.ok(out:match("big%s+" .. 350 * MiB), "a 1.4 GiB tensor fits once the kept blocks are given back: "
       .. out:sub(1, 300))
  t.ok(out:match("huge%s+false%s+[^\n]*cannot allocate"), "a tensor that cannot fit is an error naming the size: "
       .. out:sub(1, 300))
  t.ok(out:match("after%s+8"), "and the process goes on")
end

t.done()
