-- vision.lua -- conv2d with groups, dilation and asymmetric padding, and the
-- pools with ceil_mode, count_include_pad, asymmetric padding and dilation,
-- over random shapes and options: eager, compiled for the CPU (the extern
-- step, with a fused epilogue) and, where a device or the CUDA emulator is
-- there, compiled for CUDA, each against the reference interpreter (the
-- oracle, double precision).  The NumPy cases (tests/numpy) check the
-- oracle's semantics against NumPy and PyTorch; this file checks every path
-- agrees with it, and that bad options fail clearly.  Float32 convolutions
-- run through oneDNN where the build has it; the same file runs again in a
-- child with FUSELAB_CONV=blas (im2col + sgemm, the fallback).
--
-- Tolerance: |got - want| <= 1e-5 + 1e-4 |want| (float32 sums of at most a
-- few hundred products of values in [-1, 1], about 1e-6 off; a wrong tap,
-- group or divisor is off by 1e-2 or more); max_pool2d exactly.
local fl = fl or require "fuselab"
local t = require "tap"
local C = require "compare"

local RTOL, ATOL = 1e-4, 1e-5
local cuda = fl.cuda_available()
local ROUNDS = tonumber(os.getenv("FUSELAB_VISION_ROUNDS") or "") or 6

math.randomseed(20261201)
local R = math.random

local function pads()
  local k = R(4)
  if k == 1 then return R(0, 2) end
  if k == 2 then return {R(0, 2), R(0, 2)} end
  return {R(0, 2), R(0, 2), R(0, 2), R(0, 2)}
end

local function pad4(p)
  if type(p) == "number" then return p, p, p, p end
  if #p == 2 then return p[1], p[2], p[1], p[2] end
  return p[1], p[2], p[3], p[4]
end

local function str(v)
  if type(v) ~= "table" then return tostring(v) end
  local s = {}
  for i, x in ipairs(v) do s[i] = tostring(x) end
  return "{" .. table.concat(s, ",") .. "}"
end

-- one random conv: returns a description, the inputs and the function
local function conv_case()
  local g = ({1, 1, 2, 3, 4})[R(5)]
  local depthwise = R(4) == 1
  local cg = depthwise and 1 or R(3)
  local og = R(3)
  local kh, kw = R(3), R(3)
  local dil = {R(2), R(2)}
  local st = {R(2), R(2)}
  local p = pads()
  local t_, l, b, r = pad4(p)
  local H = math.max(R(3, 9), (kh - 1) * dil[1] + 1 - t_ - b)
  local W = math.max(R(3, 9), (kw - 1) * dil[2] + 1 - l - r)
  local N = R(2)
  local x = fl.rand(N, g * cg, H, W) * 2 - 1
  local w = fl.rand(g * og, cg, kh, kw) * 2 - 1
  local bias = R(2) == 1 and (fl.rand(g * og) * 2 - 1) or nil
  local opts = {stride = st, padding = p, dilation = dil, groups = g}
  local what = string.format("conv2d x[%d,%d,%d,%d] w[%d,%d,%d,%d]%s stride %s padding %s dilation %s groups %d",
                             N, g * cg, H, W, g * og, cg, kh, kw, bias and " +bias" or "", str(st), str(p),
                             str(dil), g)
  return what, {x, w, bias}, function(a, b_, c) return fl.conv2d(a, b_, c, opts) end
end

local function pool_case()
  local max = R(2) == 1
  local k = {R(3), R(3)}
  local dil = max and {R(2), R(2)} or {1, 1}
  local st = {R(3), R(3)}
  local ek = {(k[1] - 1) * dil[1] + 1, (k[2] - 1) * dil[2] + 1}
  -- each pad below the (dilated) kernel
  local p = {R(0, ek[1] - 1), R(0, ek[2] - 1), R(0, ek[1] - 1), R(0, ek[2] - 1)}
  local ceil = R(2) == 1
  local cip = R(2) == 1
  local H, W = R(ek[1], ek[1] + 7), R(ek[2], ek[2] + 7)
  local x = fl.rand(R(2), R(3), H, W) * 2 - 1
  local opts = {stride = st, padding = p, ceil_mode = ceil}
  if max then opts.dilation = dil else opts.count_include_pad = cip end
  local what = string.format("%s_pool2d x%s k %s stride %s padding %s%s%s", max and "max" or "avg",
                             str(x.shape), str(k), str(st), str(p), max and (" dilation " .. str(dil)) or
                             (" count_include_pad " .. tostring(cip)), ceil and " ceil_mode" or "")
  local m = max and "max_pool2d" or "avg_pool2d"
  return what, {x}, function(a) return a[m](a, k, opts) end, max
end

local function close(got, want, exact)
  if not got or got.shape[1] ~= want.shape[1] then return false end
  if exact then return fl.allclose(got:cpu(), want, 0, 0) end
  return fl.allclose(got:cpu(), want, RTOL, ATOL)
end

local function maxerr(got, want)
  return (got:cpu() - want):abs():amax():item()
end

-- f(args) by the reference, eagerly and compiled for the CPU
local function three_ways(f, args)
  local want = fl.capture(f, table.unpack(args)):run_reference(table.unpack(args))
  return want, f(table.unpack(args)), fl.compile(f, {backend = "cpu"})(table.unpack(args))
end

-- f(args) compiled for the CPU and called twice (the second call runs on
-- the memory the first left) against the reference: nil where both
-- agree, else their max errors; and the compiled function
local function twice(f, args)
  local want = fl.capture(f, table.unpack(args)):run_reference(table.unpack(args))
  local cm = fl.compile(f, {backend = "cpu"})
  local got1 = cm(table.unpack(args))
  local got2 = cm(table.unpack(args))
  if close(got1, want) and close(got2, want) then return nil, cm end
  return ("max err %s / %s"):format(got1 and tostring(maxerr(got1, want)) or "no result",
                                    got2 and tostring(maxerr(got2, want)) or "no result"), cm
end

-- Each round: several random convs and pools in one function (one capture,
-- one compile per backend), each also with a fused relu epilogue.
local bad = {eager = 0, cpu = 0, cuda = 0, relu = 0}
local count, first_bad = 0, {}
local function agree(got, want, c) return close(got, want, c[4]) end   -- max pools exactly
local function note(kind, c, got, want)
  bad[kind] = bad[kind] + 1
  if #first_bad < 8 then
    first_bad[#first_bad + 1] = string.format("%s: %s (max err %s)", kind, c[1],
                                              got and tostring(maxerr(got, want)) or "no result")
  end
end
for round = 1, ROUNDS do
  local cases = {}
  for i = 1, 6 do cases[#cases + 1] = {conv_case()} end
  for i = 1, 6 do cases[#cases + 1] = {pool_case()} end
  C.check(cases, C.run(cases, 3, function(y) return y:relu() end, cuda), agree, note, "relu")
  count = count + #cases
end
for _, s in ipairs(first_bad) do t.diag(s) end
t.is(bad.eager, 0, count .. " random convs and pools: eager matches the reference")
t.is(bad.cpu, 0, count .. " random convs and pools: compiled for the CPU matches the reference")
t.is(bad.relu, 0, count .. " random convs and pools with a fused relu match the reference")
if cuda then
  t.is(bad.cuda, 0, count .. " random convs and pools: compiled for CUDA matches the reference")
else
  t.skip("no CUDA device or emulator: the CUDA path runs under tests/gpu/emu/run", 1)
end

local conv_blas = os.getenv("FUSELAB_CONV") == "blas"
local conv_on = fl.blas_info().conv:find("oneDNN", 1, true) ~= nil
if conv_on then
  t.ok(fl.blas_info().onednn_convs > 0, "those convs ran through oneDNN: " .. fl.blas_info().conv)
else
  t.skip("convolutions run on im2col + sgemm here: " .. fl.blas_info().conv, 1)
end

-- A conv whose only reader is a residual add and a relu: compiled, the
-- epilogue runs inside oneDNN's call (post-ops) where oneDNN runs convs.
do
  local before = fl.blas_info().onednn_conv_posts
  local nbad, n = 0, 0
  for _ = 1, 8 do
    local what, ins, fn = conv_case()
    local r = fl.rand(table.unpack(fn(ins[1], ins[2], ins[3]).shape)) * 2 - 1
    local function f(x, w, res, b) return (fn(x, w, b) + res):relu() end
    local args = {ins[1], ins[2], r, ins[3]}
    local want = fl.capture(f, table.unpack(args)):run_reference(table.unpack(args))
    local got = fl.compile(f, {backend = "cpu"})(table.unpack(args))
    n = n + 1
    if not close(got, want) then
      nbad = nbad + 1
      t.diag("fused: " .. what .. " max err " .. (got and tostring(maxerr(got, want)) or "no result"))
    end
  end
  t.is(nbad, 0, n .. " random convs + residual + relu compiled for the CPU match the reference")
  if conv_on then
    t.ok(fl.blas_info().onednn_conv_posts > before, "and their epilogues ran as oneDNN post-ops")
  else
    t.skip("no oneDNN convolutions here", 1)
  end
end

-- Depthwise convolutions on plain layouts run on fuselab's own loop
-- (cpu/conv_dw.c: 8 channels at a time through a padded pixel-major
-- scratch): channel counts off the 8-lane groups, one and two images,
-- strides, dilation, asymmetric padding, 1x1 to 5x5 and 1x7 windows, with
-- and without bias, and every epilogue it runs itself -- each activation,
-- a residual add and a product with a tensor laid out as the result
-- (brought into the scratch the same way), a per-channel scale and shift
-- (an inference batch norm's), constants; eager and compiled, against the
-- reference.  The first call of each shape times the loop against
-- oneDNN's forms and keeps the faster; the child run with
-- FUSELAB_CONV=depthwise takes the loop for every one
-- (fl.blas_info().depthwise_convs counts them), FUSELAB_CONV=plain none.
do
  local acts = {
    function(y) return y:relu() end, function(y) return y:silu() end,
    function(y) return y:sigmoid() end, function(y) return y:tanh() end,
    function(y) return y:gelu{approximate = "tanh"} end, function(y) return (y * 0.25):exp() end,
    function(y) return y * 1.5 - 0.25 end, function(y) y = y * 4.0; return y * (y / 6.0 + 0.5):clamp(0, 1) end}   -- past both bends
  local dw0 = fl.blas_info().depthwise_convs
  local mode = os.getenv("FUSELAB_CONV")
  if mode == "" then mode = nil end
  local nbad, n = 0, 0
  for i = 1, 24 do
    local Cn, N = ({1, 3, 8, 13, 16, 21})[R(6)], R(2)
    local k = ({{1, 1}, {3, 3}, {3, 3}, {5, 5}, {1, 7}, {2, 3}})[R(6)]
    local st, dil = {R(2), R(2)}, {R(2), R(2)}
    if R(2) == 1 then dil = {1, 1} end
    local p = pads()
    local t_, l, b, r = pad4(p)
    local H = math.max(R(4, 19), (k[1] - 1) * dil[1] + 1 - t_ - b)
    local W = math.max(R(4, 19), (k[2] - 1) * dil[2] + 1 - l - r)
    local x = fl.rand(N, Cn, H, W) * 2 - 1
    local w = fl.rand(Cn, 1, k[1], k[2]) * 2 - 1
    local bias = R(2) == 1 and (fl.rand(Cn) * 2 - 1) or nil
    local opts = {stride = st, padding = p, dilation = dil, groups = Cn}
    local y0 = fl.conv2d(x, w, bias, opts)
    local res = fl.rand(table.unpack(y0.shape)) * 2 - 1
    local sc, sh = fl.rand(Cn, 1, 1) + 0.5, fl.rand(Cn, 1, 1) - 0.5
    local kind, act = i % 4, acts[(i - 1) % #acts + 1]   -- each activation three times
    local function f(x_, w_, res_, sc_, sh_, b_)
      local y = fl.conv2d(x_, w_, b_, opts)
      if kind == 1 then y = y + res_ elseif kind == 2 then y = y * res_
      elseif kind == 3 then y = y * sc_ + sh_ end
      return act(y)
    end
    local args = {x, w, res, sc, sh, bias}
    local want, eager, got = three_ways(f, args)
    n = n + 1
    if not (close(got, want) and close(eager, want)) then
      nbad = nbad + 1
      t.diag(("depthwise: x%s k %s stride %s dilation %s padding %s%s kind %d: max err %s / %s"):format(
             str(x.shape), str(k), str(st), str(dil), str(p), bias and " +bias" or "", kind,
             got and tostring(maxerr(got, want)) or "no result", maxerr(eager, want)))
    end
  end
  t.is(nbad, 0, n .. " depthwise convs with epilogues match the reference, eager and compiled")
  -- next to a convolution that keeps blocks of channels: read in blocks
  -- (its result plain, for a sum) and written in blocks (its input plain, a
  -- graph input), with a residual in the result's layout (a pool's
  -- blocks)
  do
    local x = fl.rand(2, 32, 11, 11) * 2 - 1
    local w1, wd, wd2, w2 = fl.rand(32, 32, 1, 1) - 0.5, fl.rand(32, 1, 3, 3) - 0.5,
                            fl.rand(32, 1, 5, 5) - 0.5, fl.rand(32, 32, 3, 3) * 0.2 - 0.1
    local w3 = fl.rand(32, 32, 1, 1) - 0.5
    local function f(x_, w1_, wd_, wd2_, w2_, w3_)
      local a = fl.conv2d(fl.conv2d(x_, w1_):relu(), wd_, {padding = 1, groups = 32}):relu():sum(4)
      local r = fl.conv2d(x_, w3_):relu():max_pool2d(2, {ceil_mode = true})
      local b = (fl.conv2d(x_, wd2_, {padding = 2, stride = 2, groups = 32}) + r):relu()
      return a, fl.conv2d(b, w2_, {padding = 1}) + 1.0
    end
    local args = {x, w1, wd, wd2, w2, w3}
    local d0 = fl.blas_info().depthwise_convs
    local g = fl.capture(f, table.unpack(args))
    local want1, want2 = g:run_reference(table.unpack(args))
    local got1, got2 = fl.compile(f, {backend = "cpu"})(table.unpack(args))
    t.ok(close(got1, want1) and close(got2, want2), "depthwise convs read and write a neighbour's blocks")
    if conv_on and mode == "depthwise" then
      t.ok(fl.blas_info().depthwise_convs - d0 >= 2, "on cpu/conv_dw.c")
    else
      t.skip("cpu/conv_dw.c is taken where it is timed faster; the FUSELAB_CONV=depthwise run takes it", 1)
    end
  end
  local ran = fl.blas_info().depthwise_convs - dw0
  if conv_on and mode == "depthwise" then
    t.ok(ran >= n, "they ran on cpu/conv_dw.c (" .. ran .. " calls)")
  elseif conv_on and (not mode or mode == "matmul" or mode == "pointwise") then
    t.skip("cpu/conv_dw.c ran where timed faster (" .. ran .. " calls); the FUSELAB_CONV=depthwise run takes it", 1)
  else
    t.is(ran, 0, "with FUSELAB_CONV=" .. tostring(mode) .. ", none ran on cpu/conv_dw.c")
  end
end

-- Hardswish as the ONNX loader writes it, x * clamp(x / 6 + 1/2, 0, 1),
-- runs inside the call of the convolution or product before it (oneDNN's
-- hardswish post-op), so MobileNetV3's values stay in blocks: a conv and a
-- linear, compiled, against the reference, and counted as fused.
do
  local x, w, b = fl.rand(2, 16, 9, 9) * 8 - 4, fl.rand(24, 16, 3, 3) * 0.4 - 0.2, fl.rand(24) - 0.5
  local a, lw = fl.rand(5, 32) * 8 - 4, fl.rand(40, 32) * 0.4 - 0.2
  local function hs(y) return y * (y / 6.0 + 0.5):clamp(0, 1) end
  local function f(x_, w_, b_, a_, lw_)
    return hs(fl.conv2d(x_, w_, b_, {padding = 1})), hs(fl.linear(a_, lw_))
  end
  local args = {x, w, b, a, lw}
  local function fused()   -- the linear's 5 rows run on cpu/mm_rows.c, its epilogue inside
    local bi = fl.blas_info()
    return bi.onednn_conv_posts + bi.onednn_posts + bi.row_posts
  end
  local p0 = fused()
  local g = fl.capture(f, table.unpack(args))
  local want1, want2 = g:run_reference(table.unpack(args))
  local got1, got2 = fl.compile(f, {backend = "cpu"})(table.unpack(args))
  t.ok(close(got1, want1) and close(got2, want2), "conv and linear with a hardswish match the reference")
  if conv_on then
    t.ok(fused() - p0 >= 2, "and the hardswish ran inside their calls")
  else
    t.skip("no oneDNN here", 1)
  end
end

-- Squeeze-and-excitation at batches of 1 to 8: its two 1x1 convolutions
-- over a 1x1 map are products of that many rows (cpu/mm.c conv_as_rows,
-- cpu/mm_rows.c), with their bias, a relu, a hardsigmoid, a batch norm's
-- per-channel scale and shift (a map smaller than the weights keeps them
-- out of the weights: per-channel post-ops) and a residual; compiled
-- against the reference and counted as run there.  Nine images stay on
-- oneDNN's convolution.
do
  local nbad, ran, n = 0, 0, 0
  for i = 1, 12 do
    local N = i <= 8 and i or 9 + (i - 9) % 3
    local C, Rd = ({16, 24, 40, 96})[R(4)], ({8, 4, 12})[R(3)]
    local H = R(2, 7)
    local x = fl.randn(N, C, H, H)
    local w1, b1 = fl.randn(Rd, C, 1, 1) * 0.3, fl.randn(Rd)
    local w2, b2 = fl.randn(C, Rd, 1, 1) * 0.3, fl.randn(C)
    local s, sh = fl.rand(C, 1, 1) + 0.5, fl.randn(C, 1, 1)
    local function f(x_)
      local p = x_:mean({3, 4}, true)
      local z = fl.conv2d(p, w1, b1):relu()
      local g = (fl.conv2d(z, w2, b2) * s + sh + p)           -- scale, shift, residual
      g = (g / 6 + 0.5):clamp(0, 1)                          -- hardsigmoid
      return x_ * g
    end
    local want = fl.capture(f, x):run_reference(x)
    local r0 = fl.blas_info().row_products
    local cf = fl.compile(f, {backend = "cpu"})
    local got = cf(x)
    n = n + 1
    if N <= 8 and fl.blas_info().row_products - r0 >= 2 then ran = ran + 1 end
    if N > 8 and fl.blas_info().row_products - r0 > 0 then ran = ran - 100 end
    if not close(got, want) then
      nbad = nbad + 1
      t.diag(("squeeze-and-excitation N %d C %d R %d H %d: max err %s"):format(N, C, Rd, H, tostring(maxerr(got, want))))
    end
  end
  t.is(nbad, 0, n .. " squeeze-and-excitation blocks of 1 to 11 images match the reference")
  if conv_on and os.getenv("FUSELAB_MATMUL") ~= "onednn" then
    t.is(ran, 8, "up to 8 images their 1x1 convolutions ran as products of rows, beyond that on oneDNN")
  else
    t.skip("oneDNN off or FUSELAB_MATMUL=onednn", 1)
  end
end

-- ResNet's downsampling block: two convolutions of one input, each with a
-- batch norm left unfolded (weights large against the activations: their
-- folded copies would not fit the memory kept values may take), added and
-- relu'd.  Each batch norm becomes its own convolution's epilogue
-- (fuse/plan.c, conv_affine), so both run as one library call with their
-- post-ops, and where the CPU blocks, the first's result stays in blocks.
do
  local Cn, I = 256, 64
  local x = fl.rand(1, I, 4, 4) * 2 - 1
  local w1, w2 = fl.rand(Cn, I, 1, 1) - 0.5, fl.rand(Cn, I, 3, 3) * 0.2 - 0.1
  local s1, t1 = fl.rand(Cn, 1, 1) + 0.5, fl.rand(Cn, 1, 1) - 0.5
  local s2, t2 = fl.rand(Cn, 1, 1) + 0.5, fl.rand(Cn, 1, 1) - 0.5
  local w3 = (fl.rand(Cn, Cn, 1, 1) - 0.5) * 0.1
  local function f(x_)
    local a = fl.conv2d(x_, w1) * s1 + t1
    local b = fl.conv2d(x_, w2, {padding = 1}) * s2 + t2
    return fl.conv2d((a + b):relu(), w3)
  end
  local want = fl.capture(f, x):run_reference(x)
  local cm = fl.compile(f, {backend = "cpu"})
  local got = cm(x)
  t.ok(close(got, want), "two batch-normed convolutions added: compiled matches the reference")
  local own, lines = 0, {}
  for l in cm:code():gmatch("[^\n]+") do
    if l:find("extern conv2d(x_,", 1, true) then
      lines[#lines + 1] = l:match("^%s*(.-)%s*#") or l
      if l:find("+ epilogue mul add", 1, true) then own = own + 1 end
    end
  end
  t.ok(#lines == 2 and own == 2, "each batch norm is its own convolution's epilogue: " .. table.concat(lines, "; "))
  if conv_on and (fl.blas_info().conv_block or 0) > 0 then
    t.ok(lines[1] and lines[1]:find("in nChw", 1, true), "and the first's result stays in blocks")
  else
    t.skip("no blocked layout here", 1)
  end
end

-- A residual add after a batch norm's per-channel scale and shift (ResNet's
-- late blocks, where the norm is not folded into large weights): oneDNN
-- takes no residual after per-channel post-ops as its sum, so the call
-- runs the scale and shift and the add and relu run over its result after
-- it (cpu/mm.c, conv_tail), in whatever layout the result has; in a chain
-- of convolutions over whole blocks of channels the values stay blocked
-- through it.  Compiled, against the reference.
do
  local nbad, n = 0, 0
  local r0 = fl.blas_info().blocked_writes
  for i = 1, 6 do
    local Cn, H, N = ({8, 16, 24})[R(3)], R(3, 9), R(2)
    local k = ({1, 3})[R(2)]
    local x = fl.rand(N, Cn, H, H) * 2 - 1
    local w1, w2, w3 = fl.rand(Cn, Cn, 3, 3) * 0.4 - 0.2, fl.rand(Cn, Cn, k, k) * 0.4 - 0.2,
                       fl.rand(Cn, Cn, 1, 1) * 0.4 - 0.2
    local sc, sh = fl.rand(Cn, 1, 1) + 0.5, fl.rand(Cn, 1, 1) - 0.5
    local pad = (k - 1) // 2
    local function f(x_, w1_, w2_, w3_, sc_, sh_)
      local c1 = fl.conv2d(x_, w1_, {padding = 1}):relu()
      local c2 = (fl.conv2d(c1, w2_, {padding = pad}) * sc_ + sh_ + c1):relu()
      return fl.conv2d(c2, w3_) * 1.0
    end
    local args = {x, w1, w2, w3, sc, sh}
    local want = fl.capture(f, table.unpack(args)):run_reference(table.unpack(args))
    local got = fl.compile(f, {backend = "cpu"})(table.unpack(args))
    n = n + 1
    if not close(got, want) then
      nbad = nbad + 1
      t.diag(("affine + residual: x%s k %d: max err %s"):format(str(x.shape), k,
             got and tostring(maxerr(got, want)) or "no result"))
    end
  end
  t.is(nbad, 0, n .. " chains with a residual add after a per-channel scale and shift match the reference")
  if conv_on and (fl.blas_info().conv_block or 0) > 0 then
    t.ok(fl.blas_info().blocked_writes > r0, "and their convolutions wrote blocks")
  else
    t.skip("no blocked layout here", 1)
  end
end

-- Convolution weights kept in oneDNN's layout (cpu/mm.c, kept_find):
-- from their second unchanged use on, convs read the kept copy; every
-- call matches the reference with the weights' values of that moment,
-- written in place between calls as well.
do
  local x, w, b = fl.randn(2, 16, 12, 12), fl.randn(32, 16, 3, 3) * 0.1, fl.randn(32)
  local f = function(x) return fl.conv2d(x, w, b, {padding = 1}):relu() end
  local cf = fl.compile(f, {backend = "cpu"})
  local p0 = fl.blas_info().packed_calls
  local good = true
  for _, step in ipairs{
    function() end, function() end, function() end,
    function() w:mul_(-0.5) end, function() end,
    function() w[3] = fl.randn(16, 3, 3) end, function() end,
    function() w:copy_(fl.randn(32, 16, 3, 3)) end, function() end, function() end,
  } do
    step()
    local want = fl.capture(f, x):run_reference(x)
    local got, eager = cf(x), f(x)
    if not (close(got, want) and close(eager, want)) then
      good = false
      t.diag("kept weights: max err " .. maxerr(got, want) .. " / " .. maxerr(eager, want))
    end
  end
  t.ok(good, "a conv's weights written in place between calls: compiled and eager read their new values")
  if os.getenv("FUSELAB_CONV") == "any" then
    t.ok(fl.blas_info().packed_calls - p0 >= 6,
         "FUSELAB_CONV=any: convs read the kept weights (" .. (fl.blas_info().packed_calls - p0) .. " calls)")
  end
end

-- 1x1 convolutions (ShuffleNet's grouped ones) may run as one batched matmul
-- (cpu/mm.c, centry_make_mm), the bias and a leading residual added
-- through a sum post-op: one to four groups whose widths are off
-- oneDNN's blocks of 8, one and two images, with and without bias; bare,
-- with a relu, with a residual add and a relu, with a per-channel scale
-- and shift (a batch norm's, run over the result after the product:
-- cpu_conv_posts); eager and compiled, each against the reference.  The child run with FUSELAB_CONV=matmul takes
-- that form wherever it applies: every compiled case (each has an
-- epilogue: `* 1.0` is one) and the grouped eager ones.  All may also
-- run on fuselab's own loop (cpu/conv_pw.c: strips of pixels, tiles of
-- up to 6 channels x 16 pixels, the epilogue in the same pass), which the
-- child run with FUSELAB_CONV=pointwise takes for all of them, one group
-- or more; cases 21-26 are wide (groups of 30 to 300 channels, up to
-- 24x24 pixels: strips of 16 pixels and more than one strip a plane),
-- cases 27-30 one group of 70-100 channels to 60-90 (MobileNetV3's
-- widths, off oneDNN's blocks).
do
  local mm0, pw0 = fl.blas_info().onednn_conv_matmuls, fl.blas_info().pointwise_convs
  local nbad, n, want_mm, pw_short = 0, 0, 0, {}
  for i = 1, 30 do
    local g, cg, og = R(4), R(2, 9), R(1, 9)
    local N, H, W = R(2), R(1, 9), R(1, 9)
    if i > 20 then g, cg, og, H, W = R(2, 4), R(30, 300), R(5, 40), R(5, 24), R(5, 24) end
    if i > 26 then g, cg, og = 1, R(70, 100), R(60, 90) end
    local x = fl.rand(N, g * cg, H, W) * 2 - 1
    local w = fl.rand(g * og, cg, 1, 1) * 2 - 1
    local r = fl.rand(N, g * og, H, W) * 2 - 1
    local b = R(2) == 1 and (fl.rand(g * og) * 2 - 1) or nil
    local sc, sh = fl.rand(g * og, 1, 1) + 0.5, fl.rand(g * og, 1, 1) - 0.5
    local kind = i % 5
    local function f(x_, w_, r_, sc_, sh_, b_)
      local y = fl.conv2d(x_, w_, b_, {groups = g})
      if kind == 1 then return y:relu() end
      if kind == 2 then return (y + r_):relu() end
      if kind == 3 then return (y * sc_ + sh_):relu() end          -- per channel, after the product
      if kind == 4 then return ((y + r_) * sc_ + sh_):sigmoid() end
      return y * 1.0
    end
    local args = {x, w, r, sc, sh, b}
    local pw1 = fl.blas_info().pointwise_convs
    local want, eager, got = three_ways(f, args)
    n = n + 1
    want_mm = want_mm + (g > 1 and 2 or 1)
    if fl.blas_info().pointwise_convs - pw1 < 2 then pw_short[#pw_short + 1] = i end   -- eager and compiled
    if not (close(got, want) and close(eager, want)) then
      nbad = nbad + 1
      t.diag(("1x1: x%s w%s%s kind %d: max err %s / %s"):format(str(x.shape), str(w.shape),
             b and " +bias" or "", kind, got and tostring(maxerr(got, want)) or "no result", maxerr(eager, want)))
    end
  end
  t.is(nbad, 0, n .. " 1x1 convs (bare, relu, residual + relu, per-channel affine) match the reference, eager and compiled")
  if os.getenv("FUSELAB_CONV") == "matmul" then
    local k = fl.blas_info().onednn_conv_matmuls - mm0
    t.ok(k >= want_mm, "FUSELAB_CONV=matmul: 1x1 convs ran as batched matmuls (" .. k .. " calls, " ..
         want_mm .. " expected at least)")
  end
  if os.getenv("FUSELAB_CONV") == "pointwise" then
    t.is(#pw_short, 0, "FUSELAB_CONV=pointwise: every case's 1x1, of one group or more, ran on cpu/conv_pw.c " ..
         "eager and compiled (" .. (fl.blas_info().pointwise_convs - pw0) .. " calls; cases short: " ..
         table.concat(pw_short, " ") .. ")")
  end
end

-- Grouped 1x1s between convolutions that keep blocks of 8 channels
-- (ShuffleNet's last stage): where each group is whole blocks,
-- cpu/conv_pw.c reads and writes the blocks (its weights packed
-- gOIhw8i8o, kept), timed against oneDNN's grouped kernel at the first
-- call.  Each case is a depthwise 3x3, the grouped 1x1 with an epilogue
-- (a batch norm's scale and shift, a residual from the depthwise's result
-- or from a plain input, relu, sigmoid, hardswish), and a depthwise 3x3
-- after it; output blocks 1 to 6 a group (tiles of 3-4 blocks and their
-- remainders), maps of 1 to 15 pixels a side (tiles of 3 pixels and their
-- remainders, strips of pixels), widths off the block too.  Eager and
-- compiled against the reference; the child run with
-- FUSELAB_CONV=pointwise takes the loop for every grouped 1x1, so its
-- blocked form for every case whose groups are whole blocks.
do
  local pb0 = fl.blas_info().pointwise_blocked
  local nbad, n, whole = 0, 0, 0
  for i = 1, 18 do
    local g, cg, og = R(2, 4), 8 * R(1, 4), 8 * R(1, 6)
    if i % 6 == 0 then cg, og = R(3, 20), R(3, 20) end                -- off the block
    if i == 7 then g, cg, og = 4, 136, 136 end                        -- ShuffleNet's
    local N, H, W = R(2), R(1, 15), R(1, 15)
    local CI, CO = g * cg, g * og
    local x = fl.rand(N, CI, H, W) * 2 - 1
    local wd = fl.rand(CI, 1, 3, 3) * 2 - 1
    local w = (fl.rand(CO, cg, 1, 1) * 2 - 1) * (1 / math.sqrt(cg))
    local wd2 = fl.rand(CO, 1, 3, 3) * 2 - 1
    local r = fl.rand(N, CO, H, W) * 2 - 1
    local sc, sh = fl.rand(CO, 1, 1) + 0.5, fl.rand(CO, 1, 1) - 0.5
    local b = R(2) == 1 and (fl.rand(CO) * 2 - 1) or nil
    local kind = i % 5
    local function f(x_, wd_, w_, wd2_, r_, sc_, sh_, b_)
      local h = fl.conv2d(x_, wd_, {groups = CI, padding = 1})
      local y = fl.conv2d(h, w_, b_, {groups = g})
      if kind == 1 then y = (y * sc_ + sh_):relu()
      elseif kind == 2 then y = (y * sc_ + sh_ + (CI == CO and h or r_)):relu()   -- ShuffleNet's residual
      elseif kind == 3 then y = ((y + r_) * sc_ + sh_):sigmoid()
      elseif kind == 4 then y = y * sc_ + sh_; y = y * (y / 6.0 + 0.5):clamp(0, 1)   -- hardswish
      else y = y:relu() end
      return fl.conv2d(y, wd2_, {groups = CO, padding = 1})
    end
    local args = {x, wd, w, wd2, r, sc, sh, b}
    local want, eager, got = three_ways(f, args)
    n = n + 1
    if cg % 8 == 0 and og % 8 == 0 then whole = whole + 1 end
    if not (close(got, want) and close(eager, want)) then
      nbad = nbad + 1
      t.diag(("blocked 1x1: x%s groups %d of %d -> %d, kind %d%s: max err %s / %s"):format(str(x.shape), g,
             cg, og, kind, b and " +bias" or "", got and tostring(maxerr(got, want)) or "no result",
             maxerr(eager, want)))
    end
  end
  t.is(nbad, 0, n .. " grouped 1x1s between blocked convolutions match the reference, eager and compiled")
  -- their weights packed and kept: a weight written in place between
  -- calls is packed again
  local C = 64
  local x, wd = fl.rand(1, C, 10, 10) * 2 - 1, fl.rand(C, 1, 3, 3) * 2 - 1
  local w, wd2 = (fl.rand(C, C // 4, 1, 1) * 2 - 1) * 0.25, fl.rand(C, 1, 3, 3) * 2 - 1
  local function f(x_, w_)
    local h = fl.conv2d(x_, wd, {groups = C, padding = 1})
    return fl.conv2d(fl.conv2d(h, w_, {groups = 4}):relu(), wd2, {groups = C, padding = 1})
  end
  local cf = fl.compile(f, {backend = "cpu"})
  local g = fl.capture(f, x, w)
  local ok1 = close(cf(x, w), g:run_reference(x, w)) and close(cf(x, w), g:run_reference(x, w))
  fl.no_grad(function() w:mul_(-0.5) end)
  t.ok(ok1 and close(cf(x, w), g:run_reference(x, w)), "a grouped 1x1's weight written in place between calls is read anew")
  if os.getenv("FUSELAB_CONV") == "pointwise" and conv_on and fl.blas_info().conv_block == 8 then
    local k = fl.blas_info().pointwise_blocked - pb0
    t.ok(k >= whole, "FUSELAB_CONV=pointwise: grouped 1x1s of whole blocks read or wrote them on cpu/conv_pw.c (" ..
         k .. " calls, " .. whole .. " expected at least)")
  end
end

-- FUSELAB_DEBUG=2 names each convolution shape's candidates, their
-- times and the one kept (a child process: the choices are made once per
-- process).
do
  local bin = os.getenv("FUSELAB")
  if bin and conv_on and not os.getenv("FUSELAB_CONV") then
    local code = "local w = fl.rand(32, 8, 1, 1); local f = fl.compile(function(x) "
      .. "return fl.conv2d(x, w, {groups = 4}):relu() end, {backend = 'cpu'}); f(fl.rand(1, 32, 6, 6))"
    local p = io.popen("FUSELAB_DEBUG=2 '" .. bin .. "' -e \"" .. code .. "\" 2>&1")
    local out = p:read("a")
    p:close()
    local line = out:match("fuselab: conv2d 1x32x6x6 %-> 32, 1x1 stride 1, groups 4[^\n]*") or ""
    t.ok(line:find("cpu/conv_pw.c [%d.]+ ms") and line:find("oneDNN in its layouts [%d.]+ ms") and
         select(2, line:gsub("%(kept%)", "")) == 1, "FUSELAB_DEBUG=2 names a convolution's timed candidates and the one kept: " .. line)
  else
    t.skip("needs the fuselab binary and oneDNN's convolutions")
  end
end

if not os.getenv("FUSELAB_CONV") and not os.getenv("FUSELAB_LAYOUT") then
  C.rerun("FUSELAB_CONV=blas", "im2col + sgemm", "im2col + OpenBLAS sgemm", "conv")
  if conv_on then
    C.rerun("FUSELAB_CONV=plain", "oneDNN on plain layouts", "none ran on cpu/conv_dw.c", "conv")
    C.rerun("FUSELAB_CONV=depthwise", "depthwise convs on cpu/conv_dw.c", "they ran on cpu/conv_dw.c",
            "depthwise_convs")
    C.rerun("FUSELAB_CONV=any", "oneDNN's own layouts", "oneDNN", "conv")
    C.rerun("FUSELAB_CONV=matmul", "1x1s as matmuls", "ran as batched matmuls", "onednn_conv_matmuls")
    C.rerun("FUSELAB_CONV=pointwise", "1x1s on cpu/conv_pw.c", "ran on cpu/conv_pw.c", "pointwise_convs")
  end
end

-- Concatenations written in place (fuse/plan.c plan_into): the inputs'
-- kernels store them in their places in the concatenation's memory and
-- the concatenation copies nothing.  DenseNet-like chains (each block's
-- concatenations nested in the last one's memory, a pool first), and
-- Inception-like fans (branches of convolutions and pools, channel counts
-- on and off the CPU's block, so that some inputs come in blocks and some
-- plain: the run brings them to one layout in place), with readers of an
-- input after its concatenation ran, compiled against the reference, one
-- and two images (two: not in place, dims before the axis are not all 1).
-- The host program says which concatenations had nothing to copy.
do
  local nbad, n, inplace, copied = 0, 0, 0, 0
  for i = 1, 16 do
    local N = i % 4 == 0 and 2 or 1
    local H, W = R(4, 12), R(4, 12)
    local dense = i % 2 == 1
    local c0 = ({8, 16, 12})[R(3)]
    local x = fl.rand(N, c0, H, W) * 2 - 1
    local ws, growth, layers = {}, ({8, 16, 4, 6})[R(4)], R(2, 4)
    local c = c0
    for l = 1, layers do
      ws[l] = {(fl.rand(16, c, 1, 1) * 2 - 1) * (1 / math.sqrt(c)),
               (fl.rand(growth, 16, 3, 3) * 2 - 1) * (1 / math.sqrt(144)),
               fl.rand(c, 1, 1) + 0.5}
      c = dense and c + growth or c
    end
    local after = R(2) == 1
    local function f(a, ...)
      local w = {...}
      local h = a:max_pool2d(3, {stride = 1, padding = 1})
      local first
      for l = 1, layers do
        local s_, b1, b2 = w[3 * l], w[3 * l - 2], w[3 * l - 1]
        local pre = (h * s_):relu()                     -- a reader that wants it plain
        local y = fl.conv2d(fl.conv2d(pre, b1):relu(), b2, {padding = 1})
        first = first or y
        if dense then
          h = fl.cat({h, y}, 2)
        else                                            -- a fan: four branches into one
          h = fl.cat({fl.conv2d(pre, b1):relu(), y, h:avg_pool2d(3, {stride = 1, padding = 1}),
                      (h * 0.5):sigmoid()}, 2)
          h = h:narrow(2, 1, c0)                         -- back to c0 channels for the next layer
        end
      end
      local out = h:sum(4)
      if after then out = out:sum() + first:sum() end   -- an input read after its concatenation
      return out
    end
    local args = {x}
    for l = 1, layers do for j = 1, 3 do args[#args + 1] = ws[l][j] end end
    local want = fl.capture(f, table.unpack(args)):run_reference(table.unpack(args))
    local cf = fl.compile(f, {backend = "cpu"})
    local got = cf(table.unpack(args))
    local got2 = cf(table.unpack(args))                 -- a second call: the same memory again
    n = n + 1
    if not (close(got, want) and close(got2, want)) then
      nbad = nbad + 1
      t.diag(("concat in place: %s x%s layers %d growth %d: max err %s"):format(dense and "dense" or "fan",
             str(x.shape), layers, growth, got and tostring(maxerr(got, want)) or "no result"))
    end
    local code = cf:code()
    local _, k = code:gsub("nothing to copy, its inputs were stored in place", "")
    if N == 1 then inplace = inplace + k else copied = copied + k end
  end
  t.is(nbad, 0, n .. " DenseNet- and Inception-like concatenations compiled match the reference")
  t.ok(inplace > 0, "with one image they were written in place (" .. inplace .. " concatenations)")
  t.is(copied, 0, "with two images none was (its inputs are not one run of its memory each)")
end

-- A concatenation's inputs stored in its memory, shown in the host
-- program: the inputs as slices of its buffer, nothing copied, the
-- plan's bytes for it 0 and its memory counted once.
do
  local w1, w2, w3 = fl.randn(8, 4, 3, 3), fl.randn(8, 12, 1, 1), fl.randn(8, 16, 1, 1)
  local function f(x)
    local a = fl.conv2d(x, w1, {padding = 1}):relu()
    local b = fl.conv2d(fl.cat({x, a}, 2), w2)
    return fl.cat({x, a, b}, 2):sum(4)
  end
  local x = fl.randn(1, 4, 6, 6)
  local cf = fl.compile(f, {backend = "cpu"})
  local want = fl.capture(f, x):run_reference(x)
  t.ok(close(cf(x), want), "a concatenation whose input is a graph input is not in place, and matches")
  local code = cf:code()
  t.ok(not code:find("nothing to copy", 1, true), "a graph input cannot be stored into it: the copy stays")
  local function g(x)
    local a = fl.conv2d(x, w1, {padding = 1}):relu()
    local c1 = fl.cat({a:max_pool2d(3, {stride = 1, padding = 1}), a}, 2)
    local b = fl.conv2d(c1, w3)
    return fl.cat({c1, b}, 2):sum(4)
  end
  local cg = fl.compile(g, {backend = "cpu"})
  t.ok(close(cg(x), fl.capture(g, x):run_reference(x)), "nested concatenations in place match the reference")
  code = cg:code()
  local _, k = code:gsub("nothing to copy", "")
  t.is(k, 2, "both concatenations copy nothing")
  t.ok(code:find("-> buf%d+%[0:%d+%]") ~= nil, "their inputs are stored as slices of the outer one's buffer")
  -- the memory walk: every value but the result lives in the outer
  -- concatenation's memory (1x24x6x6), counted once; the concatenations
  -- move no bytes
  local ps = cg:plans()[1]
  t.is(ps:stats().peak_bytes_after, (24 * 36 + 24 * 6) * 4,
       "the plan's peak is the outer concatenation's memory and the result, nothing more")
  local catb = {}
  for _, kr in ipairs(ps:kernels()) do if kr.name:find("^x_cat") then catb[#catb + 1] = kr.bytes end end
  t.is(table.concat(catb, ","), "0,0", "the plan counts no bytes for either concatenation")
  local dotp = t.tmpdir() .. "/cat.dot"
  fl.draw(cg, dotp)
  local _, said = t.slurp(dotp):gsub("in place: its inputs were stored in it", "")
  t.is(said, 2, "the picture says both are in place")
  -- a large value computed between a concatenation's two inputs: its
  -- memory in place would be alive through it and raise the peak above
  -- the plan with the copies and the graph op by op, so the
  -- concatenation copies (the peak with one image is half that with two,
  -- which are never in place)
  local wa2, wbig, wb2 = fl.randn(4, 4, 1, 1), fl.randn(256, 4, 3, 3), fl.randn(60, 1, 1, 1)
  local function h(x)
    local a = fl.conv2d(x, wa2):relu()
    local big = fl.conv2d(x, wbig, {padding = 1})
    local b = fl.conv2d(big:sum(2, true) + big:amax(2, true), wb2):relu()
    return fl.cat({a, b}, 2):sum(4)
  end
  local peaks = {}
  for N = 1, 2 do
    local xh = fl.randn(N, 4, 8, 8)
    local ch = fl.compile(h, {backend = "cpu"})
    t.ok(close(ch(xh), fl.capture(h, xh):run_reference(xh)), N .. " image(s): the concatenation that copies matches")
    peaks[N] = ch:plans()[1]:stats().peak_bytes_after
    if N == 1 then t.ok(not ch:code():find("nothing to copy", 1, true), "it is not in place") end
  end
  t.is(peaks[1] * 2, peaks[2], "in place would have raised the peak: the plan's peak is that of the copies")
  -- inputs in two layouts: a convolution's result, which only the
  -- concatenation and then a convolution read (in blocks where the CPU
  -- has them), beside an elementwise kernel's (plain): the run puts the
  -- first back plain where it lies
  local wa, wb = fl.randn(16, 4, 3, 3) * 0.3, fl.randn(8, 32, 3, 3) * 0.2
  local function m(x)
    local c1 = fl.cat({fl.conv2d(x, wa, {padding = 1}), fl.cat({x, x, x, x}, 2):sigmoid()}, 2)
    return fl.conv2d(c1, wb, {padding = 1}):sum(4)
  end
  local x2 = fl.randn(1, 4, 7, 9)
  local cm = fl.compile(m, {backend = "cpu"})
  t.ok(close(cm(x2), fl.capture(m, x2):run_reference(x2)),
       "a concatenation of inputs in blocks and plain matches the reference")
  _, k = cm:code():gsub("nothing to copy", "")
  t.is(k, 1, "and copies nothing")
end

-- Chains of convolutions keep their values in oneDNN's blocked layout
-- between them (cpu/backend.c, plan_block): random chains of two to five
-- convs (plain, grouped with whole blocks per group, depthwise, a group
-- width off the block), with relus, residual adds of an earlier value, and
-- a max or average pool or a concatenation of channels now and then (which
-- read and write the blocks where convolutions surround them) and a second
-- reader (which keeps a value plain),
-- compiled and against the reference; where the CPU blocks, the
-- convolutions read and wrote blocks, and FUSELAB_LAYOUT=plain (the child
-- run) none.
do
  local bi0 = fl.blas_info()
  local B = bi0.conv_block or 0
  local nbad, n, listed, drawn = 0, 0, false, nil
  for i = 1, 12 do
    local blk = B > 0 and B or 8
    local N, H, W = R(2), R(3, 12), R(3, 12)
    local C0 = blk * R(1, 3)
    local x = fl.rand(N, 3, H, W) * 2 - 1
    local ws, kinds = {}, {}
    local c = C0
    local w0 = (fl.rand(C0, 3, 3, 3) * 2 - 1) * 0.4
    local steps = R(2, 5)
    for s_ = 1, steps do
      local kind = ({"plain", "grouped", "depthwise", "odd", "plain"})[R(5)]
      local co, g = blk * R(1, 3), 1
      if kind == "grouped" then g = 2; co = 2 * blk * R(1, 2); if c % (2 * blk) ~= 0 then kind, g = "plain", 1 end end
      if kind == "depthwise" then g, co = c, c end
      if kind == "odd" then co = blk * 2 + 2 end
      kinds[s_] = {kind = kind, g = g, k = R(2) == 1 and 3 or 1, res = R(3) == 1, pool = R(3) == 1 and R(4),
                   twice = R(6) == 1, cat = R(4) == 1}
      ws[s_] = (fl.rand(co, c // g, kinds[s_].k, kinds[s_].k) * 2 - 1) * (1 / math.sqrt(c // g * kinds[s_].k ^ 2))
      if kinds[s_].cat then kinds[s_].pool = false end
      c = kinds[s_].cat and co + c or co
    end
    local function f(a, ...)
      local wl = {...}
      local h = fl.conv2d(a, w0, nil, {padding = 1}):relu()
      local extra = nil
      for s_ = 1, steps do
        local k = kinds[s_]
        local y = fl.conv2d(h, wl[s_], nil, {padding = k.k // 2, groups = k.g})
        if k.res and y.shape[2] == h.shape[2] then y = y + h end
        y = y:relu()
        if k.cat then y = fl.cat({y, h}, 2) end    -- DenseNet's and Inception's concatenations
        if k.twice then extra = (extra or 0) + y:sum() end
        if k.pool and y.shape[3] >= 3 and y.shape[4] >= 3 then
          -- pools between convolutions read and write the blocks too
          if k.pool == 1 then y = y:max_pool2d(2)
          elseif k.pool == 2 then y = y:max_pool2d(3, {stride = 2, padding = 1, ceil_mode = true})
          elseif k.pool == 3 then y = y:avg_pool2d(3, {stride = 1, padding = 1, count_include_pad = false})
          else y = y:avg_pool2d(2, {stride = 2, ceil_mode = true}) end
        end
        h = y
      end
      return extra and h:sum({2, 3}) + extra or h:sum({2, 3})
    end
    local args = {x, table.unpack(ws)}
    local want = fl.capture(f, table.unpack(args)):run_reference(table.unpack(args))
    local cm = fl.compile(f, {backend = "cpu"})
    local got = cm(table.unpack(args))
    listed = listed or (cm:code():find("in nChw" .. B .. "c", 1, true) ~= nil)
    if not drawn and (listed or i == 12) then
      -- the picture of the program that kept blocks (the last one, when none did)
      local dot = t.tmpdir() .. "/chain.dot"
      fl.draw(cm, dot)
      local fh = assert(io.open(dot))
      drawn = fh:read("a")
      fh:close()
    end
    n = n + 1
    if not close(got, want) then
      nbad = nbad + 1
      local ks = {}
      for s_ = 1, steps do
        ks[s_] = kinds[s_].kind .. (kinds[s_].res and "+res" or "") .. (kinds[s_].cat and "+cat" or "") ..
                 (kinds[s_].pool and "+pool" .. kinds[s_].pool or "")
      end
      t.diag(("chain %d: x%s %s: max err %s"):format(i, str(x.shape), table.concat(ks, ","), tostring(maxerr(got, want))))
    end
  end
  t.is(nbad, 0, n .. " chains of convolutions compiled for the CPU match the reference")
  local bi = fl.blas_info()
  if B > 0 then
    t.ok(bi.blocked_writes > bi0.blocked_writes and bi.blocked_reads > bi0.blocked_reads,
         ("and carried nChw%dc between them (%d results written, %d inputs read in blocks)"):format(
         B, bi.blocked_writes - bi0.blocked_writes, bi.blocked_reads - bi0.blocked_reads))
    t.ok(listed, "the host program says which results stay in nChw" .. B .. "c")
    local name = "nChw" .. B .. "c"
    t.ok(drawn:find("writes " .. name, 1, true) and drawn:find("KiB " .. name, 1, true) and
         drawn:find("kept in blocks of channels", 1, true) and drawn:find("nchw (out of blocks)", 1, true),
         "its picture marks the kernels writing " .. name .. ", the edges carrying it and where it ends")
  elseif conv_on and os.getenv("FUSELAB_LAYOUT") == "plain" then
    t.ok(bi.blocked_writes == 0 and bi.blocked_reads == 0 and not listed, "FUSELAB_LAYOUT=plain: no value in blocks")
    t.ok(drawn and not drawn:find("nChw", 1, true) and not drawn:find("blocks", 1, true),
         "FUSELAB_LAYOUT=plain: the picture shows no layout change")
    t.skip("no blocked layout to list", 1)
  else
    t.skip("no blocked layout here: " .. fl.blas_info().conv, 3)
  end
end

-- nbad of n cases failed; and with FUSELAB_CONV=any (oneDNN's own layouts
-- for every convolution) on an AVX-512 CPU, some results were left
-- channels last since the count c0
local function channels_last_checks(nbad, n, c0, cases, left)
  t.is(nbad, 0, n .. " " .. cases .. " compiled match the reference, two calls each")
  local wrote = (fl.blas_info().channels_last_writes or 0) - c0
  if os.getenv("FUSELAB_CONV") == "any" and fl.blas_info().conv_block == 16 then
    t.ok(wrote > 0, "FUSELAB_CONV=any with AVX-512: " .. left .. " (" .. wrote .. ")")
  else
    t.skip("channels last only where oneDNN's own layouts are taken with AVX-512 (" .. wrote .. " here)", 1)
  end
end

-- A convolution's result that one convolution alone reads (DenseNet's 1x1
-- then 3x3) is left channels last where oneDNN's kernel writes it so
-- (brgconv, with AVX-512), and the next reads it as it is: no reorder into
-- blocks and back between them (cpu/backend.c conv_reads_alone,
-- fl.blas_info().channels_last_writes).  Dense blocks of three layers --
-- a batch norm's scale and shift with relu over the concatenation so far,
-- a 1x1 to 64 channels with relu, a 3x3 to the growth, the concatenation
-- -- compiled, against the reference.  With FUSELAB_CONV=any (oneDNN's own
-- layouts for every convolution: the child run) an AVX-512 CPU writes
-- some; an AVX2 one has no such kernel.
do
  local nbad, n = 0, 0
  local c0 = fl.blas_info().channels_last_writes or 0
  for i = 1, 4 do
    local N, H, Cn, G = R(2), R(5, 14), ({16, 32})[R(2)], ({16, 32})[R(2)]
    local x = fl.rand(N, Cn, H, H) * 2 - 1
    local args = {x}
    for l = 1, 3 do
      local cin = Cn + (l - 1) * G
      args[#args + 1] = fl.rand(cin, 1, 1) + 0.5
      args[#args + 1] = fl.rand(cin, 1, 1) - 0.5
      args[#args + 1] = fl.rand(64, cin, 1, 1) * 0.4 - 0.2
      args[#args + 1] = fl.rand(G, 64, 3, 3) * 0.2 - 0.1
    end
    local function f(x_, ...)
      local w, h = {...}, x_
      for l = 1, 3 do
        local b = fl.conv2d((h * w[4 * l - 3] + w[4 * l - 2]):relu(), w[4 * l - 1]):relu()
        h = fl.cat({h, fl.conv2d(b, w[4 * l], {padding = 1})}, 2)
      end
      return h
    end
    local err = twice(f, args)
    n = n + 1
    if err then
      nbad = nbad + 1
      t.diag(("dense block: x%s growth %d: %s"):format(str(x.shape), G, err))
    end
  end
  channels_last_checks(nbad, n, c0, "dense blocks (1x1 then 3x3, concatenated)",
                       "1x1 results left channels last for their 3x3")
end

-- The same for a depthwise reader: an inverted residual's expansion (a 1x1
-- with SiLU, EfficientNet's) left channels last is read so by its 3x3 or
-- 5x5 depthwise convolution, on oneDNN's kernel or on cpu/conv_dw.c
-- (whichever the first call times faster; the unit test runs the loop on
-- channels last directly), then the projection and the residual.
do
  local nbad, n, planned = 0, 0, true
  local c0 = fl.blas_info().channels_last_writes or 0
  for i = 1, 4 do
    local N, H, C, E, K = R(2), R(6, 16), ({16, 24})[R(2)], ({64, 96})[R(2)], ({3, 5})[R(2)]
    local x = fl.rand(N, C, H, H) * 2 - 1
    local args = {x, fl.rand(E, C, 1, 1) * 0.4 - 0.2, fl.rand(E) - 0.5, fl.rand(E, 1, K, K) - 0.5,
                  fl.rand(C, E, 1, 1) * 0.2 - 0.1}
    local st = R(2)
    local function f(x_, w1, b1, wd, w2)
      local e = fl.conv2d(x_, w1, b1):silu()
      local d = fl.conv2d(e, wd, {padding = K // 2, groups = E, stride = st}):silu()
      local y = fl.conv2d(d, w2)
      return st == 1 and y + x_ or y
    end
    local err, cm = twice(f, args)
    n = n + 1
    if err then
      nbad = nbad + 1
      t.diag(("inverted residual: x%s expand %d k%d stride %d: %s"):format(str(x.shape), E, K, st, err))
    end
    -- the plan lets the expansion's result be left channels last
    planned = planned and cm ~= nil and cm:code():find("conv2d%(x_, w1, b1%)[^\n]*or nhwc") ~= nil
  end
  channels_last_checks(nbad, n, c0, "inverted residuals (1x1, depthwise, 1x1)",
                       "expansions left channels last for their depthwise")
  if (fl.blas_info().conv_block or 0) > 0 then
    t.ok(planned, "the host program lets each expansion's result stay channels last for its depthwise")
  else
    t.skip("no blocked layout here: " .. fl.blas_info().conv, 1)
  end
end

-- Channels in whole blocks of 8 but not of 16 (MobileNetV3's 72 and 88)
-- go in blocks of 8 where the CPU's are 16 (cpu/backend.c plan_block):
-- an expansion to 72 or 88 with a hardswish, its depthwise 3x3, the
-- projection back; compiled twice against the reference, and the host
-- program names nChw8c for them on an AVX-512 CPU.
do
  local nbad, n, named = 0, 0, true
  for i = 1, 3 do
    local N, H, E, st = R(2), R(6, 16), ({72, 88, 40})[i], R(2)
    local x = fl.rand(N, 24, H, H) * 2 - 1
    local args = {x, fl.rand(E, 24, 1, 1) * 0.4 - 0.2, fl.rand(E) - 0.5, fl.rand(E, 1, 3, 3) - 0.5,
                  fl.rand(24, E, 1, 1) * 0.2 - 0.1}
    local function f(x_, w1, b1, wd, w2)
      local e = fl.conv2d(x_, w1, b1)
      e = e * (e + 3):clamp(0, 6) / 6
      local d = fl.conv2d(e, wd, {padding = 1, groups = E, stride = st}):relu()
      return fl.conv2d(d, w2)
    end
    local err, cm = twice(f, args)
    n = n + 1
    if err then
      nbad = nbad + 1
      t.diag(("blocks of 8: x%s expand %d stride %d: %s"):format(str(x.shape), E, st, err))
    end
    named = named and cm ~= nil and cm:code():find("nChw8c", 1, true) ~= nil
  end
  t.is(nbad, 0, n .. " expansions to 72, 88 and 40 channels, depthwise, projection: compiled match the reference")
  -- without a depthwise convolution around them, 24 and 40 channels stay
  -- plain (a projection's residual sum has no kernel from plain to blocks)
  local x = fl.rand(2, 16, 9, 9) * 2 - 1
  local w1, w2, w3 = fl.rand(24, 16, 1, 1) - 0.5, fl.rand(40, 24, 1, 1) - 0.5, fl.rand(48, 40, 3, 3) * 0.2 - 0.1
  local function f(x_, a, b, c)
    return fl.conv2d(fl.conv2d(fl.conv2d(x_, a):relu(), b):relu(), c, {padding = 1})
  end
  local err, cm = twice(f, {x, w1, w2, w3})
  t.ok(not err, "1x1s to 24 and 40 channels, then a 3x3: compiled match the reference" .. (err and (": " .. err) or ""))
  if fl.blas_info().conv_block == 16 and not os.getenv("FUSELAB_LAYOUT") and os.getenv("FUSELAB_CONV") ~= "blas" then
    t.ok(named, "with blocks of 16, channels of whole blocks of 8 go in nChw8c around a depthwise convolution")
    t.ok(cm and not cm:code():find("nChw8c", 1, true), "and stay plain where none is")
  else
    t.skip("blocks of 8 beside 16 only where the CPU's are 16 (" .. tostring(fl.blas_info().conv_block) .. " here)", 2)
  end
end

-- A convolution whose epilogue first adds a residual read by nothing
-- after it (ResNet's last 1x1 of a block) stores its result over that
-- residual (fuse/plan.c residual_over): oneDNN's sum adds into the memory
-- the residual is in, where it was copied into the result first.  Chains
-- of three bottleneck blocks compiled against the reference, two calls
-- each (the first call's timed candidates must not add twice), in every
-- FUSELAB_CONV and FUSELAB_LAYOUT child; the host program says so.  Half
-- end their blocks with a SiLU, which cpu/conv_pw.c runs after its rows
-- are stored: it must then leave such a convolution to the others.
do
  local nbad, n, listed = 0, 0, 0
  for i = 1, 6 do
    local act = i % 2 == 0 and fl.silu or fl.relu
    local N, Cc, H = R(2), ({16, 24, 32, 64})[R(4)], R(4, 14)
    local x = fl.rand(N, Cc, H, H) * 2 - 1
    local w0 = fl.rand(Cc, Cc, 1, 1) * 0.4 - 0.2
    local w1, w2 = fl.rand(Cc // 2, Cc, 1, 1) * 0.4 - 0.2, fl.rand(Cc // 2, Cc // 2, 3, 3) * 0.2 - 0.1
    local w3, b3 = fl.rand(Cc, Cc // 2, 1, 1) * 0.4 - 0.2, fl.rand(Cc) - 0.5
    local function f(x_, w0_, w1_, w2_, w3_, b3_)
      local y = fl.conv2d(x_, w0_):relu()
      for _ = 1, 3 do
        local h = fl.conv2d(fl.conv2d(y, w1_):relu(), w2_, {padding = 1}):relu()
        y = act(fl.conv2d(h, w3_, b3_) + y)
      end
      return y:sum({3, 4})
    end
    local err, cm = twice(f, {x, w0, w1, w2, w3, b3})
    n = n + 1
    if err then
      nbad = nbad + 1
      t.diag(("bottlenecks: x%s: %s"):format(str(x.shape), err))
    end
    local _, k = cm:code():gsub("stores its result over the residual it adds", "")
    listed = listed + k
  end
  t.is(nbad, 0, n .. " chains of bottleneck blocks, each result stored over its residual, match the reference (two calls)")
  t.is(listed, 2 * n, "the host program lists the two results stored over their residuals in each (the last is read by the sum)")
  -- a residual read again after the block keeps its memory
  local x, w0, w1 = fl.rand(2, 16, 9, 9) * 2 - 1, fl.rand(16, 16, 1, 1) * 0.4 - 0.2, fl.rand(16, 16, 3, 3) * 0.2 - 0.1
  local function g(x_, w0_, w1_)
    local r = fl.conv2d(x_, w0_):relu()
    local y = (fl.conv2d(fl.conv2d(r, w1_, {padding = 1}):relu(), w0_) + r):relu()
    return (fl.conv2d(y, w0_) + fl.conv2d(r, w0_)):sum({3, 4})
  end
  local err, cm = twice(g, {x, w0, w1})
  t.ok(not err and not cm:code():find("stores its result over the residual", 1, true),
       "a residual read after its block is not stored over and the result matches" .. (err and (": " .. err) or ""))
end

-- ShuffleNet's channel shuffle (reshape to [n, g, c/g, h, w], swap the two
-- channel dims, reshape back) moves whole planes in an order no strides
-- express; the depthwise convolution after it reads each plane where it
-- lies instead of a copy (cpu/backend.c plan_shuffle,
-- fl.blas_info().shuffles_read_in_place).  Units of grouped 1x1 + relu,
-- shuffle, depthwise (3x3 or 5x5, strides 1 and 2, with a bias and
-- sometimes a relu after), grouped 1x1, compiled against the reference,
-- two calls each.  A shuffle of one channel per group is a view (nothing
-- to copy) and a dense 1x1 after a shuffle reads the copy: neither counts.
do
  local nbad, n, want_reads, listed_bad = 0, 0, 0, 0
  local s0 = fl.blas_info().shuffles_read_in_place or 0
  local cases = {{1, 4, 34, 14, 1, 3}, {2, 3, 8, 9, 2, 3}, {1, 2, 17, 7, 1, 5}, {1, 8, 3, 12, 2, 3}}
  for _ = 1, 4 do
    cases[#cases + 1] = {R(2), R(2, 4), ({3, 8, 17, 34})[R(4)], R(4, 16), R(2), ({3, 5})[R(2)]}
  end
  cases[#cases + 1] = {1, 12, 1, 8, 1, 3, "a view"}
  cases[#cases + 1] = {2, 4, 6, 8, 1, 1, "dense"}
  for _, cs in ipairs(cases) do
    local N, G, CG, H, st, K, kind = table.unpack(cs)
    local Cc = G * CG
    local dense = kind == "dense"
    local x = fl.rand(N, Cc, H, H) * 2 - 1
    local w1 = fl.rand(Cc, CG, 1, 1) * 0.6 - 0.3
    local wd = dense and fl.rand(Cc, Cc, 1, 1) * 0.4 - 0.2 or fl.rand(Cc, 1, K, K) * 2 - 1
    local bd, w2 = fl.rand(Cc) - 0.5, fl.rand(Cc, CG, 1, 1) * 0.6 - 0.3
    local relu = R(2) == 1
    local function f(x_, w1_, wd_, bd_, w2_)
      local a = fl.conv2d(x_, w1_, {groups = G}):relu()
      a = a:reshape(N, G, CG, H, H):transpose(2, 3):reshape(N, Cc, H, H)
      local b = dense and fl.conv2d(a, wd_, bd_)
                      or fl.conv2d(a, wd_, bd_, {padding = K // 2, stride = st, groups = Cc})
      if relu then b = b:relu() end
      return fl.conv2d(b, w2_, {groups = G})
    end
    local err, cm = twice(f, {x, w1, wd, bd, w2})
    n = n + 1
    if not kind then want_reads = want_reads + 2 end
    if (cm:code():find("its input a channel shuffle", 1, true) ~= nil) ~= (kind ~= "dense") then
      listed_bad = listed_bad + 1
    end
    if err then
      nbad = nbad + 1
      t.diag(("shuffle unit: x%s groups %d, %dx%d stride %d%s: %s"):format(str(x.shape), G, K, K, st,
             kind and (" (" .. kind .. ")") or "", err))
    end
  end
  t.is(nbad, 0, n .. " ShuffleNet units (grouped 1x1, channel shuffle, depthwise, grouped 1x1) compiled match the reference")
  t.is(listed_bad, 0, "the host program says which depthwise convolutions read a shuffle where it lies")
  local reads = (fl.blas_info().shuffles_read_in_place or 0) - s0
  local mode = os.getenv("FUSELAB_CONV")
  if conv_on and mode ~= "plain" and mode ~= "any" then
    t.is(reads, want_reads, "the depthwise convolutions read the shuffled planes where they lay, the view and the dense 1x1 not")
  else
    t.is(reads, 0, "no shuffle read in place where oneDNN runs every convolution (" .. (mode or "no oneDNN") .. ")")
  end
end

if not os.getenv("FUSELAB_CONV") and not os.getenv("FUSELAB_LAYOUT") and conv_on then
  C.rerun("FUSELAB_LAYOUT=plain", "every value plain", "no value in blocks", "blocked")
  -- the other CPUs' block (AVX2's 8, AVX-512's 16), with every depthwise
  -- convolution on cpu/conv_dw.c: its blocked paths for both sizes, here
  local other = fl.blas_info().conv_block == 16 and 8 or 16
  C.rerun(("FUSELAB_LAYOUT=nChw%dc FUSELAB_CONV=depthwise"):format(other),
          "blocks of " .. other .. " channels, depthwise convs on cpu/conv_dw.c",
          ("carried nChw%dc between them"):format(other), "blocked_reads")
end

-- ShuffleNet's grouped 1x1 and depthwise 3x3 stay one conv2d each: one
-- extern step per conv, not one per group
do
  local x = fl.rand(1, 24, 8, 8)
  local w1, w2 = fl.rand(24, 8, 1, 1), fl.rand(24, 1, 3, 3)
  local function f(a)
    return fl.conv2d(fl.conv2d(a, w1, {groups = 3}):relu(), w2, {padding = 1, groups = 24})
  end
  local g = fl.capture(f, x)
  local n = 0
  for _, o in ipairs(g:ops()) do if o == "conv2d" then n = n + 1 end end
  t.is(n, 2, "grouped and depthwise convolutions are one conv2d node each")
  t.ok(tostring(g):find("groups=24", 1, true) ~= nil, "the IR listing shows groups")
  t.ok(close(f(x), g:run_reference(x)), "and match the reference")
end

-- nn.Conv2d and the pool modules take the new options
do
  local c = nn.Conv2d(8, 16, 3, {groups = 4, dilation = 2, padding = {2, 1, 2, 2}})
  t.is(c.weight.shape, {16, 2, 3, 3}, "nn.Conv2d groups: weight [co, ci/groups, kh, kw]")
  t.is(tostring(c), "nn.Conv2d(8 -> 16, 3x3, 1,1, 2,1,2,2, dilation 2,2, groups 4)", "nn.Conv2d prints its options")
  t.is(c(fl.rand(1, 8, 9, 9)).shape, {1, 16, 9, 8}, "nn.Conv2d asymmetric padding and dilation: output shape")
  local mp = nn.MaxPool2d(3, {stride = 2, ceil_mode = true})
  t.is(mp(fl.rand(1, 1, 8, 8)).shape, {1, 1, 4, 4}, "nn.MaxPool2d ceil_mode")
  local ap = nn.AvgPool2d(3, {stride = 2, padding = 1, count_include_pad = false})
  t.ok(fl.allclose(ap(fl.ones(1, 1, 5, 5)), fl.ones(1, 1, 3, 3)), "nn.AvgPool2d count_include_pad=false averages only the input")
  t.raises(function() nn.Conv2d(6, 8, 3, {groups = 4}) end,
           "nn.Conv2d: groups=4 must divide in_channels %(6%) and out_channels %(8%)", "nn.Conv2d groups not dividing")
end

-- ceil_mode: the last window must start inside the input or the left padding
do
  local x = fl.arange(16):reshape(1, 1, 4, 4):to("float32")
  local y = x:max_pool2d(2, {stride = 3, ceil_mode = true})
  t.is(y.shape, {1, 1, 2, 2}, "ceil_mode 4 / k2 s3: two windows, the second one partial")
  t.is(y:reshape(-1):tolist(), {5, 7, 13, 15}, "ceil_mode: the partial windows take what is there")
  t.is(x:max_pool2d(2, {stride = 2, padding = 1, ceil_mode = true}).shape, {1, 1, 3, 3},
       "ceil_mode drops a window that would start in the end padding")
end

-- bad options: clear errors naming the op and the values
local function bad_(f, pat, what) t.raises(f, pat, what) end
local x = fl.ones(1, 4, 6, 6)
bad_(function() return fl.conv2d(x, fl.ones(6, 2, 3, 3), {groups = 3}) end,
     "conv2d: groups=3 must divide both the input channels %(input %[1,4,6,6%]%)", "groups not dividing the channels")
bad_(function() return fl.conv2d(x, fl.ones(6, 4, 3, 3), {groups = 2}) end,
     "conv2d: weight %[6,4,3,3%] expects 4 input channels per group, but input %[1,4,6,6%] has 4 channels in 2 groups %(2 each%)",
     "grouped weight of the wrong width")
bad_(function() return fl.conv2d(x, fl.ones(4, 4, 3, 3), {groups = 0}) end,
     "conv2d: groups must be >= 1, got 0", "groups 0")
bad_(function() return fl.conv2d(x, fl.ones(4, 4, 3, 3), {dilation = -1}) end,
     "conv2d: dilation must be >= 1, got %-1", "negative dilation")
bad_(function() return fl.conv2d(x, fl.ones(4, 4, 3, 3), {dilation = 4}) end,
     "conv2d: padded input size 6x6 is smaller than the dilated kernel 9x9", "dilated kernel larger than the input")
bad_(function() return fl.conv2d(x, fl.ones(4, 4, 3, 3), {padding = {1, 2, 3}}) end,
     "conv2d: padding must be a number, a pair {h, w} or {top, left, bottom, right}", "padding of 3 values")
bad_(function() return fl.conv2d(x, fl.ones(4, 4, 3, 3), {padding = {1, -1, 0, 0}}) end,
     "conv2d: padding must be >= 0, got %-1", "negative padding")
bad_(function() return x:max_pool2d(3, {padding = 3}) end,
     "max_pool2d: padding %[3,3,3,3%] %(top, left, bottom, right%) must be smaller than the kernel %[3,3%]",
     "pool padding as large as the kernel")
bad_(function() return x:max_pool2d(2, {padding = {0, 0, 2, 0}, dilation = 1}) end,
     "max_pool2d: padding %[0,0,2,0%] %(top, left, bottom, right%) must be smaller than the kernel %[2,2%]",
     "pool end padding as large as the kernel")
bad_(function() return x:max_pool2d(2, {dilation = 0}) end,
     "max_pool2d: dilation must be >= 1, got 0", "pool dilation 0")
bad_(function() return x:avg_pool2d(2, {dilation = 2}) end,
     "avg_pool2d: unknown option 'dilation'", "avg_pool2d has no dilation")
bad_(function() return x:max_pool2d(2, {count_include_pad = true}) end,
     "max_pool2d: unknown option 'count_include_pad'", "max_pool2d has no count_include_pad")
bad_(function() return x:avg_pool2d(2, {ceil_mode = 1}) end,
     "avg_pool2d: ceil_mode must be a boolean, got number", "ceil_mode not a boolean")

-- the 2x2, stride-2 max pool has a loop of its own (whole planes): equal
-- to the reference with NaNs among the values and odd sizes (the last row
-- or column left out)
do
  local bad = {}
  for _, sh in ipairs{{1, 1, 2, 2}, {2, 3, 5, 7}, {4, 16, 32, 32}, {1, 2, 9, 4}, {3, 1, 2, 11}} do
    fl.manual_seed(#bad + sh[4])
    local x = fl.randn(sh)
    local flat = x:reshape(-1)
    for i = 1, #flat, 5 do flat[i] = 0 / 0 end
    local want = fl.capture(function(a) return fl.max_pool2d(a, 2) end, x):run_reference(x):reshape(-1)
    local got = fl.max_pool2d(x, 2):reshape(-1)
    for i = 1, #got do
      local a, b = got[i], want[i]
      if not (a == b or (a ~= a and b ~= b)) then bad[#bad + 1] = table.concat(sh, "x"); break end
    end
  end
  t.ok(#bad == 0, "2x2 stride-2 max pools with NaNs and odd sizes equal the reference: " ..
       (#bad == 0 and "all 5 shapes" or table.concat(bad, ", ")))
end

-- Pools over 8 planes at a time (pool_by8: planes transposed into a
-- pixel-major scratch, large planes cut into bands of output rows, max
-- windows inside the image four at a time, averages through column sums):
-- 3x3 windows of stride 1 and 2 with and without padding, ceil_mode,
-- count_include_pad, on planes of 9 to 120 pixels a side; max pools with
-- NaNs among the values, averages with infinities.  Eager against the
-- reference (max exactly, NaN for NaN; averages within 1e-6), and
-- compiled between two convolutions whose values stay in blocks (the same
-- windows on nChw8c or nChw16c).
do
  local bad = {}
  for i = 1, 16 do
    fl.manual_seed(900 + i)
    local n, c, h, w = R(2), 8 * R(1, 3) + (i % 3 == 0 and R(1, 7) or 0), R(9, 120), R(9, 120)
    if i <= 4 then h, w = R(100, 120), R(100, 120) end             -- few groups of large planes: bands
    local max = i % 2 == 1
    local opts = {stride = R(2), padding = R(0, 1), ceil_mode = R(3) == 1}
    if not max then opts.count_include_pad = R(2) == 1 end
    local x = fl.randn(n, c, h, w)
    local flat = x:reshape(-1)
    if max then
      for j = R(7), #flat, 7 + R(40) do flat[j] = 0 / 0 end
    elseif i % 4 == 0 then
      for j = R(97), #flat, 97 + R(400) do flat[j] = R(2) == 1 and 1 / 0 or -1 / 0 end
    end
    local function f(a) return max and fl.max_pool2d(a, 3, opts) or fl.avg_pool2d(a, 3, opts) end
    local want = fl.capture(f, x):run_reference(x):reshape(-1)
    local got = f(x):reshape(-1)
    local ok = #got == #want
    for j = 1, ok and #got or 0 do
      local a, b = got[j], want[j]
      if not (a == b or (a ~= a and b ~= b) or (not max and math.abs(a - b) <= 1e-6 * (1 + math.abs(b)))) then
        ok = false
        break
      end
    end
    if not ok then bad[#bad + 1] = ("%s %dx%dx%dx%d"):format(max and "max" or "avg", n, c, h, w) end
  end
  t.ok(#bad == 0, "3x3 pools over 8 planes at a time, NaNs among max pools', infinities among averages', " ..
       "equal the reference: " .. (#bad == 0 and "all 16" or table.concat(bad, ", ")))
  local nbad = 0
  for i = 1, 6 do
    local max = i % 2 == 0
    local c, h = max and 8 * R(1, 3) or 16 * R(1, 2), R(12, 60)   -- averages in blocks of 16 too
    local w1, w2 = fl.rand(c, c, 3, 3) * 0.2 - 0.1, fl.rand(c, c, 1, 1) * 0.4 - 0.2
    local po = {stride = i % 3 == 1 and 2 or 1, padding = 1, count_include_pad = i % 3 ~= 0}
    local function f(x_, a_, b_)
      local y = fl.conv2d(x_, a_, {padding = 1}):relu()
      y = max and fl.max_pool2d(y, 3, {stride = po.stride, padding = 1}) or fl.avg_pool2d(y, 3, po)
      return fl.conv2d(y, b_)
    end
    local args = {fl.randn(R(2), c, h, h), w1, w2}
    local want, eager, got = three_ways(f, args)
    if not (close(got, want) and close(eager, want)) then
      nbad = nbad + 1
      t.diag(("%s pool between convs: %d channels, %dx%d: max err %s"):format(max and "max" or "avg", c, h, h,
             got and tostring(maxerr(got, want)) or "no result"))
    end
  end
  t.is(nbad, 0, "6 pools between convolutions (their values in blocks) compiled match the reference")
end

t.done()
