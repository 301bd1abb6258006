-- epilogue.lua -- what an activation after a linear costs, compiled: the
-- product alone against the product with its activation (run inside
-- oneDNN's call as a post-op, or as the generated epilogue: fl.blas_info()
-- counts which), at two value scales (weights of 1 / sqrt(K): values about
-- 1; weights of 1: values of tens), rounds interleaved in one process,
-- medians and ranges of the best of 5 x 10 calls.
--   OMP_NUM_THREADS=2 build/fuselab bench/epilogue.lua [rounds]
local rounds = tonumber(arg and arg[1]) or 5

local acts = {
  {"linear", function(v) return v end},
  {"relu", function(v) return fl.relu(v) end},
  {"gelu", function(v) return fl.gelu(v) end},
  {"gelu tanh", function(v) return fl.gelu(v, "tanh") end},
  {"silu", function(v) return fl.silu(v) end},
}

local function median_range(xs)
  table.sort(xs)
  return xs[(#xs + 1) // 2], xs[1], xs[#xs]
end

local cpu = io.open("/proc/cpuinfo") and io.open("/proc/cpuinfo"):read("a"):match("model name%s*: ([^\n]*)")
print(("CPU: %s; products: %s"):format(cpu or "?", fl.blas_info().matmul))
for _, shape in ipairs{{1024, 256, 1024}, {256, 512, 2048}} do
  local M, K, N = shape[1], shape[2], shape[3]
  for _, scale in ipairs{1 / math.sqrt(K), 1.0} do
    local x, w, b = fl.randn{M, K}, fl.randn{N, K} * scale, fl.randn{N} * scale
    local fns, times = {}, {}
    for i, a in ipairs(acts) do
      local act = a[2]
      fns[i] = fl.compile(function(x, w, b) return act(fl.linear(x, w, b)) end)
      times[i] = {}
    end
    local posts = {}
    for _ = 1, rounds do
      for i, f in ipairs(fns) do
        for _ = 1, 2 do f(x, w, b) end
        local p0 = fl.blas_info().onednn_posts
        local best = math.huge
        for _ = 1, 5 do
          local t0 = fl.now()
          for _ = 1, 10 do f(x, w, b) end
          best = math.min(best, (fl.now() - t0) / 10)
        end
        posts[i] = fl.blas_info().onednn_posts > p0
        table.insert(times[i], best * 1e3)
      end
    end
    print(("\n%dx%d -> %d, weights x %.3g (values about %.3g):"):format(M, K, N, scale, scale * math.sqrt(K)))
    local base = median_range({table.unpack(times[1])})
    for i, a in ipairs(acts) do
      local m, lo, hi = median_range(times[i])
      print(("  %-10s %7.3f ms (%.3f-%.3f)  +%.3f over the product  %s"):format(a[1], m, lo, hi, m - base,
        i == 1 and "" or posts[i] and "oneDNN post-op" or "generated epilogue"))
    end
  end
end
