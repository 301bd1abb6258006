-- pictures.lua -- makes README's pictures: build/fuselab doc/pictures.lua [DIR]
-- (DIR defaults to doc).  A small MLP block with a residual and a layer
-- norm, captured, then decomposed, optimized and fused: fl.draw_compare
-- shows the captured graph run op by op against the fused plan, each side
-- titled with its kernels, buffers and bytes moved (one cost model).
local dir = arg and arg[1] or "doc"
fl.manual_seed(0)
local d = 64
local fc1, fc2, ln = nn.Linear(d, 4 * d), nn.Linear(4 * d, d), nn.LayerNorm(d)
local function block(x) return ln(x + fc2(fc1(x):gelu())) end
local g = fl.capture(block, fl.randn(16, d))
local p = g:decompose{quiet = true}:optimize{quiet = true}:fuse()
fl.draw_compare(g, p, dir .. "/compare.png")
local s = p:stats()
print(("%s/compare.png: %d ops -> %d kernels, %d -> %d bytes moved"):format(
  dir, s.kernels_before, s.kernels, s.bytes_before, s.bytes_after))
