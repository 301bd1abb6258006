-- onnx_signal.lua -- fl.load_onnx's signal and sequence-model ops (DFT,
-- STFT, MelWeightMatrix, LinearAttention, CausalConvWithState, Scan before
-- opset 9), eagerly and compiled, against answers computed here by plain
-- Lua loops in double straight from ONNX's definitions (or by hand), and
-- the refusals and errors they keep.
local t = require "tap"
local P = require "onnx_proto"

local dir = t.tmpdir()
local nmodel = 0

-- A model of one node: inputs {name, dtype, dims}, inits (onnx_proto
-- tensors), outputs by name.
local function one_node(op, attrs, inputs, opset, opts)
  opts = opts or {}
  nmodel = nmodel + 1
  local vals, names = {}, {}
  for i, v in ipairs(inputs) do
    names[i] = v[1]
    if v[2] then vals[#vals + 1] = {name = v[1], dtype = v[2], dims = v[3]} end
  end
  local outs = {}
  for i, o in ipairs(opts.outputs or {"y"}) do outs[i] = {name = o, dtype = "none"} end
  local p = dir .. "/m" .. nmodel .. ".onnx"
  P.write(p, P.model{opset = opset, nodes = {{op = op, inputs = names, outputs = opts.outputs or {"y"},
    name = "n", attrs = attrs}}, inits = opts.inits, inputs = vals, outputs = outs})
  return fl.load_onnx(p)
end

local function flat(x) return x:to("float64"):reshape({-1}):tolist() end

-- The largest of |got - want| / (atol + rtol |want|): at most 1 passes.
local function worst(got, want, rtol, atol)
  local g = flat(got)
  if #g ~= #want then return math.huge end
  local w = 0
  for i = 1, #g do w = math.max(w, math.abs(g[i] - want[i]) / (atol + rtol * math.abs(want[i]))) end
  return w
end

local function shape_is(x, s) return table.concat(x.shape, ",") == table.concat(s, ",") end

-- got (a tensor) against want (a flat list) of shape s
local function check(got, want, s, rtol, atol, name)
  t.ok(shape_is(got, s), name .. ": shape [" .. table.concat(s, ",") .. "]")
  local w = worst(got, want, rtol, atol)
  t.ok(w <= 1, ("%s: within rtol %g atol %g (worst %.3g)"):format(name, rtol, atol, w))
end

-- row-major strides and the multi-index (0-based) of flat index i (0-based)
local function strides(s)
  local st, p = {}, 1
  for d = #s, 1, -1 do st[d] = p; p = p * s[d] end
  return st, p
end
local function unflat(i, s)
  local idx = {}
  for d = #s, 1, -1 do idx[d] = i % s[d]; i = i // s[d] end
  return idx
end

fl.manual_seed(7)

-- ---- DFT ------------------------------------------------------------------
-- The DFT of x (flat, shape s, last dim 1 or 2) along dim ax (1-based) at
-- length L, by the definitions: Y_k = sum_n x_n e^(-2 pi i k n / L) over
-- the signal cut or zero-padded to L; the inverse with e^(+...) and 1/L;
-- onesided inverse: the full spectrum rebuilt by conjugate symmetry from
-- the L // 2 + 1 first bins, the real part of its inverse.
local function ref_dft(x, s, ax, L, inverse, onesided)
  local C, N = s[#s], s[ax]
  local st = strides(s)
  local function z(idx, n)             -- the input value at position n along ax
    if n >= N then return 0, 0 end
    local j = 1
    for d = 1, #s - 1 do j = j + (d == ax and n or idx[d]) * st[d] end
    return x[j], C == 2 and x[j + 1] or 0
  end
  local K = (onesided and not inverse) and L // 2 + 1 or L
  local os = {}
  for d = 1, #s do os[d] = s[d] end
  os[ax], os[#s] = K, (onesided and inverse) and 1 or 2
  local _, total = strides(os)
  local out = {}
  for i = 0, total - 1, os[#s] do
    local idx = unflat(i, os)
    local k = idx[ax]
    local re, im = 0, 0
    for n = 0, L - 1 do
      local a, b
      if onesided and inverse then
        local h = L // 2
        if n <= h then a, b = z(idx, n)
          if n > (N - 1) then a, b = 0, 0 end
        else a, b = z(idx, L - n); b = -b
          if L - n > N - 1 then a, b = 0, 0 end
        end
      else
        a, b = z(idx, n)
      end
      local th = (inverse and 2 or -2) * math.pi * k * n / L
      re = re + a * math.cos(th) - b * math.sin(th)
      im = im + a * math.sin(th) + b * math.cos(th)
    end
    if inverse then re, im = re / L, im / L end
    out[#out + 1] = re
    if os[#s] == 2 then out[#out + 1] = im end
  end
  return out, os
end

-- case: {shape, axis (0-based), C, opts}
local dft_cases = {
  {s = {3, 8, 1}, axis = 1, name = "real [3,8,1] axis 1"},
  {s = {2, 5, 2}, axis = 1, name = "complex [2,5,2] axis 1"},
  {s = {2, 6, 4, 2}, axis = 2, name = "complex [2,6,4,2] axis 2"},
  {s = {2, 6, 4, 1}, axis = -3, name = "real [2,6,4,1] axis -3"},
  {s = {2, 7, 1}, axis = 1, onesided = 1, name = "rfft, odd length"},
  {s = {2, 8, 3, 1}, axis = 1, onesided = 1, name = "rfft [2,8,3,1]"},
  {s = {2, 9, 2}, axis = 1, inverse = 1, name = "inverse complex"},
  {s = {2, 5, 3, 2}, axis = 1, inverse = 1, onesided = 1, name = "irfft, even length 8"},
  {s = {2, 5, 2}, axis = 1, inverse = 1, onesided = 1, L = 9, name = "irfft, odd length 9"},
  {s = {2, 6, 2}, axis = 1, L = 10, name = "dft_length 10 pads 6"},
  {s = {2, 6, 1}, axis = 1, L = 4, name = "dft_length 4 cuts 6"},
  {s = {2, 6, 1}, axis = 1, L = 11, onesided = 1, name = "rfft dft_length 11"},
  {s = {1, 7, 2}, axis = 1, L = 5, inverse = 1, name = "inverse dft_length 5 cuts 7"},
  {s = {2, 3, 2}, axis = 1, L = 10, inverse = 1, onesided = 1, name = "irfft dft_length 10 pads 3 bins"},
}
for _, opset in ipairs({17, 20}) do
  for _, c in ipairs(dft_cases) do
    local x = fl.randn(c.s) * 3
    local r = #c.s
    local ax = c.axis < 0 and c.axis + r + 1 or c.axis + 1
    local L = c.L or ((c.onesided == 1 and c.inverse == 1) and 2 * (c.s[ax] - 1) or c.s[ax])
    local want, ws = ref_dft(flat(x), c.s, ax, L, c.inverse == 1, c.onesided == 1)
    local attrs = {inverse = c.inverse, onesided = c.onesided}
    local inputs, inits = {{"x", "float", c.s}}, {}
    if c.L then
      inputs[2] = {"len"}
      inits[1] = {name = "len", dtype = "int64", dims = {}, ints = {c.L}}
    else
      inputs[2] = {""}
    end
    if opset == 17 then attrs.axis = c.axis
    else
      inputs[3] = {"axis"}
      inits[#inits + 1] = {name = "axis", dtype = "int64", dims = {}, ints = {c.axis}}
    end
    local m = one_node("DFT", attrs, inputs, opset, {inits = inits})
    local name = ("DFT-%d %s"):format(opset, c.name)
    check(m(x), want, ws, 1e-6, 1e-6, name .. ", eager")
    check(fl.compile(m, {backend = "cpu"})(x), want, ws, 1e-6, 1e-6, name .. ", compiled")
  end
end

-- float64 stays float64 all the way
do
  local s = {2, 12, 2}
  local x = fl.randn(s):to("float64")
  local want, ws = ref_dft(flat(x), s, 2, 12, false, false)
  local m = one_node("DFT", {axis = 1}, {{"x", "double", s}}, 17)
  local y = m(x)
  t.is(y.dtype, "float64", "DFT of float64 gives float64")
  check(y, want, ws, 1e-12, 1e-12, "DFT float64, eager")
  check(fl.compile(m, {backend = "cpu"})(x), want, ws, 1e-12, 1e-12, "DFT float64, compiled")
end

-- float16 is transformed in float32 and rounded once
do
  local s = {2, 6, 2}
  local x = fl.randn(s):to("float16")
  local want, ws = ref_dft(flat(x), s, 2, 6, false, false)
  local m = one_node("DFT", {axis = 1}, {{"x", "float16", s}}, 17)
  local y = m(x)
  t.is(y.dtype, "float16", "DFT of float16 gives float16")
  check(y, want, ws, 2 ^ -10, 1e-3, "DFT float16 (half a unit in the last place)")
end

-- the axis as a graph input (opset 20): read as data, eagerly and compiled
do
  local s = {2, 4, 5, 1}
  local x = fl.randn(s)
  local want, ws = ref_dft(flat(x), s, 3, 5, false, false)
  local m = one_node("DFT", nil, {{"x", "float", s}, {""}, {"axis", "int64", {}}}, 20)
  local a = fl.full({}, 2, {dtype = "int64"})
  check(m(x, a), want, ws, 1e-6, 1e-6, "DFT-20 axis from a graph input, eager")
  check(fl.compile(m, {backend = "cpu"})(x, a), want, ws, 1e-6, 1e-6, "DFT-20 axis from a graph input, compiled")
end

-- refusals and errors
t.raises(function() one_node("DFT", {onesided = 1, axis = 1}, {{"x", "float", {2, 4, 2}}}, 17)(fl.randn(2, 4, 2)) end,
         "a onesided forward DFT takes a real input", "DFT: onesided forward of a complex input")
t.raises(function()
  one_node("DFT", {onesided = 1, inverse = 1, axis = 1}, {{"x", "float", {2, 4, 1}}}, 17)(fl.randn(2, 4, 1))
end, "a onesided inverse DFT takes a complex input", "DFT: onesided inverse of a real input")
t.raises(function() one_node("DFT", {axis = 2}, {{"x", "float", {2, 4, 1}}}, 17)(fl.randn(2, 4, 1)) end,
         "axis 2 out of range for a 3%-d input", "DFT: the complex dim is no axis")
t.raises(function() one_node("DFT", {axis = -1}, {{"x", "float", {2, 4, 1}}}, 17)(fl.randn(2, 4, 1)) end,
         "out of range", "DFT: axis -1 is the complex dim")
t.raises(function() one_node("DFT", {axis = 1}, {{"x", "float", {2, 4, 3}}}, 17)(fl.randn(2, 4, 3)) end,
         "the last dim must be 1 %(real%) or 2 %(complex%), got 3", "DFT: a last dim of 3")
t.raises(function()
  one_node("DFT", {axis = 1}, {{"x", "float", {2, 4, 1}}, {"len"}}, 17,
           {inits = {{name = "len", dtype = "int64", dims = {}, ints = {0}}}})(fl.randn(2, 4, 1))
end, "dft_length 0 %(at least 1%)", "DFT: dft_length 0")
t.raises(function() one_node("DFT", {axis = 1}, {{"x", "float", {2, 4, 1}}}, 20) end,
         "attribute 'axis' is unsupported", "DFT-20 has no axis attribute")
t.raises(function() one_node("DFT", {axis = 1}, {{"x", "int64", {2, 4, 1}}}, 17)(fl.zeros({2, 4, 1}, {dtype = "int64"})) end,
         "unsupported", "DFT: an int64 input")

-- ---- STFT ----------------------------------------------------------------
-- frames f: x[b, f * step + j] * w[j], j < len, each transformed
local function ref_stft(x, s, step, len, w, onesided)
  local B, N, C = s[1], s[2], s[3]
  local F = (N - len) // step + 1
  local fr = {}
  for b = 0, B - 1 do
    for f = 0, F - 1 do
      for j = 0, len - 1 do
        for c = 1, C do
          fr[#fr + 1] = x[(b * N + f * step + j) * C + c] * (w and w[j + 1] or 1)
        end
      end
    end
  end
  return ref_dft(fr, {B, F, len, C}, 3, len, false, onesided)
end

local stft_cases = {
  {s = {2, 20, 1}, step = 4, len = 8, window = true, onesided = 1, name = "real, window, onesided"},
  {s = {1, 19, 1}, step = 3, len = 6, onesided = 0, name = "real, frame_length only, two-sided"},
  {s = {2, 16, 2}, step = 5, len = 7, window = true, onesided = 0, name = "complex, window, odd frames"},
  {s = {2, 12, 1}, step = 2, len = 5, window = true, with_len = true, name = "window and frame_length"},
  {s = {1, 9, 1}, step = 4, name = "no window nor frame_length: one frame of the whole signal"},
}
for _, c in ipairs(stft_cases) do
  local x = fl.randn(c.s)
  local len = c.len or c.s[2]
  local w = c.window and fl.rand(len) or nil
  local onesided = c.onesided ~= 0
  local want, ws = ref_stft(flat(x), c.s, c.step, len, w and flat(w), onesided)
  local inputs, inits = {{"x", "float", c.s}, {"step"}}, {{name = "step", dtype = "int64", dims = {}, ints = {c.step}}}
  local args = {x}
  inputs[3] = c.window and {"w", "float", {len}} or {""}
  if c.window then args[2] = w end
  if c.len and (c.with_len or not c.window) then
    inputs[4] = {"len"}
    inits[2] = {name = "len", dtype = "int64", dims = {}, ints = {len}}
  end
  local m = one_node("STFT", {onesided = c.onesided}, inputs, 17, {inits = inits})
  check(m(table.unpack(args)), want, ws, 1e-6, 1e-6, "STFT " .. c.name .. ", eager")
  check(fl.compile(m, {backend = "cpu"})(table.unpack(args)), want, ws, 1e-6, 1e-6, "STFT " .. c.name .. ", compiled")
end
t.raises(function()
  one_node("STFT", nil, {{"x", "float", {1, 10, 1}}, {"step"}, {"w", "float", {4}}, {"len"}}, 17,
    {inits = {{name = "step", dtype = "int64", dims = {}, ints = {2}},
              {name = "len", dtype = "int64", dims = {}, ints = {5}}}})(fl.randn(1, 10, 1), fl.rand(4))
end, "a window of 4 for frame_length 5", "STFT: a window and frame_length that differ")
t.raises(function()
  one_node("STFT", nil, {{"x", "float", {1, 10, 2}}, {"step"}, {""}, {"len"}}, 17,
    {inits = {{name = "step", dtype = "int64", dims = {}, ints = {2}},
              {name = "len", dtype = "int64", dims = {}, ints = {4}}}})(fl.randn(1, 10, 2))
end, "a onesided forward DFT takes a real input", "STFT: onesided (the default) of a complex signal")
t.raises(function()
  one_node("STFT", nil, {{"x", "float", {1, 10, 1}}, {"step"}, {""}, {"len"}}, 17,
    {inits = {{name = "step", dtype = "int64", dims = {}, ints = {2}},
              {name = "len", dtype = "int64", dims = {}, ints = {11}}}})(fl.randn(1, 10, 1))
end, "frame_length 11 for a signal of 10", "STFT: a frame longer than the signal")
t.raises(function()
  one_node("STFT", nil, {{"x", "float", {1, 10, 1}}, {"step"}, {""}, {"len"}}, 17,
    {inits = {{name = "step", dtype = "int64", dims = {}, ints = {0}},
              {name = "len", dtype = "int64", dims = {}, ints = {4}}}})(fl.randn(1, 10, 1))
end, "frame_step 0 %(at least 1%)", "STFT: frame_step 0")

-- ---- MelWeightMatrix -------------------------------------------------------
-- 3 bands, dft_length 40, 8 kHz, 100..4000 Hz: the mel edges 150.5, 549.6,
-- 948.7, 1347.8, 1746.9 are 100, 440.2, 924.5, 1614.5, 2598.9 Hz, bins
-- floor(41 hz / 8000) = 0, 2, 4, 8, 13 (worked by hand)
do
  local want = {}
  for i = 1, 21 * 3 do want[i] = 0 end
  local function put(j, i, v) want[j * 3 + i + 1] = v end
  put(1, 0, 0.5); put(2, 0, 1); put(3, 0, 0.5)
  put(3, 1, 0.5); put(4, 1, 1); put(5, 1, 0.75); put(6, 1, 0.5); put(7, 1, 0.25)
  put(5, 2, 0.25); put(6, 2, 0.5); put(7, 2, 0.75); put(8, 2, 1); put(9, 2, 0.8); put(10, 2, 0.6)
  put(11, 2, 0.4); put(12, 2, 0.2)
  local function mel(attrs)
    return one_node("MelWeightMatrix", attrs, {{"n"}, {"len"}, {"rate"}, {"lo"}, {"hi"}}, 17, {inits = {
      {name = "n", dtype = "int64", dims = {}, ints = {3}}, {name = "len", dtype = "int64", dims = {}, ints = {40}},
      {name = "rate", dtype = "int64", dims = {}, ints = {8000}},
      {name = "lo", dtype = "float", dims = {}, floats = {100}}, {name = "hi", dtype = "float", dims = {}, floats = {4000}}}})
  end
  local m = mel()
  check(m(), want, {21, 3}, 1e-7, 1e-7, "MelWeightMatrix, eager")
  check(fl.compile(m, {backend = "cpu"})(), want, {21, 3}, 1e-7, 1e-7, "MelWeightMatrix, compiled")
  local md = mel({output_datatype = 11})()
  t.is(md.dtype, "float64", "MelWeightMatrix output_datatype 11 gives float64")
  check(md, want, {21, 3}, 1e-15, 1e-15, "MelWeightMatrix in float64")
  t.raises(function() mel({output_datatype = 7}) end, "output_datatype int64 is unsupported",
           "MelWeightMatrix: an integer output_datatype")
  local bad = one_node("MelWeightMatrix", nil, {{"n"}, {"len"}, {"rate"}, {"lo"}, {"hi"}}, 17, {inits = {
    {name = "n", dtype = "int64", dims = {}, ints = {3}}, {name = "len", dtype = "int64", dims = {}, ints = {40}},
    {name = "rate", dtype = "int64", dims = {}, ints = {8000}},
    {name = "lo", dtype = "float", dims = {}, floats = {100}}, {name = "hi", dtype = "float", dims = {}, floats = {7000}}}})
  t.raises(function() bad() end, "past the 21 spectrogram bins", "MelWeightMatrix: bands past the Nyquist bin")
end

-- ---- LinearAttention --------------------------------------------------------
-- The recurrence as ONNX writes it, per batch entry and KV head, in double:
-- S = exp(g) S; v' = beta (v - S^T k) (delta rules, else v' = v);
-- S = S + k v'^T; query head h (of KV head h // G) reads scale q^T S.
local function ref_linear(c, q, k, v, past, decay, beta)
  local B, Tn, hq, hkv, dk, dv = c.B, c.T, c.hq, c.hkv, c.dk, c.dv
  local G = hq // hkv
  local sc = (c.scale and c.scale ~= 0) and c.scale or 1 / math.sqrt(dk)
  local out, state = {}, {}
  for i = 1, B * Tn * hq * dv do out[i] = 0 end
  for b = 0, B - 1 do
    for h = 0, hkv - 1 do
      local S = {}
      for i = 0, dk - 1 do
        S[i] = {}
        for j = 0, dv - 1 do S[i][j] = past and past[((b * hkv + h) * dk + i) * dv + j + 1] or 0 end
      end
      for tt = 0, Tn - 1 do
        local function kk(i) return k[(b * Tn + tt) * hkv * dk + h * dk + i + 1] end
        local function vv(j) return v[(b * Tn + tt) * hkv * dv + h * dv + j + 1] end
        if decay then
          for i = 0, dk - 1 do
            local g = c.decay_per_key and decay[(b * Tn + tt) * hkv * dk + h * dk + i + 1]
              or decay[(b * Tn + tt) * hkv + h + 1]
            for j = 0, dv - 1 do S[i][j] = S[i][j] * math.exp(g) end
          end
        end
        local vn = {}
        for j = 0, dv - 1 do vn[j] = vv(j) end
        if beta then
          local bt = c.beta_one and beta[b * Tn + tt + 1] or beta[(b * Tn + tt) * hkv + h + 1]
          for j = 0, dv - 1 do
            local r = 0
            for i = 0, dk - 1 do r = r + S[i][j] * kk(i) end
            vn[j] = bt * (vv(j) - r)
          end
        end
        for i = 0, dk - 1 do for j = 0, dv - 1 do S[i][j] = S[i][j] + kk(i) * vn[j] end end
        for g = 0, G - 1 do
          local qh = h * G + g
          for j = 0, dv - 1 do
            local o = 0
            for i = 0, dk - 1 do o = o + q[(b * Tn + tt) * hq * dk + qh * dk + i + 1] * S[i][j] end
            out[(b * Tn + tt) * hq * dv + qh * dv + j + 1] = sc * o
          end
        end
      end
      for i = 0, dk - 1 do for j = 0, dv - 1 do state[((b * hkv + h) * dk + i) * dv + j + 1] = S[i][j] end end
    end
  end
  return out, state
end

local la_cases = {
  {rule = "linear", B = 2, T = 4, hq = 2, hkv = 2, dk = 3, dv = 4, name = "linear"},
  {rule = "linear", B = 1, T = 1, hq = 2, hkv = 1, dk = 4, dv = 2, past = true, name = "linear, one token, MQA, past"},
  {rule = "gated", B = 2, T = 3, hq = 2, hkv = 2, dk = 3, dv = 2, decay_per_key = true, past = true,
   name = "gated, per-key decay, past"},
  {rule = "gated", B = 1, T = 5, hq = 4, hkv = 2, dk = 2, dv = 3, name = "gated, per-head decay, GQA"},
  {rule = "delta", B = 2, T = 3, hq = 2, hkv = 2, dk = 4, dv = 3, scale = 0.3, name = "delta, explicit scale"},
  {rule = "gated_delta", B = 2, T = 4, hq = 4, hkv = 2, dk = 3, dv = 2, past = true, name = "gated_delta, GQA, past"},
  {rule = "gated_delta", B = 1, T = 3, hq = 3, hkv = 1, dk = 2, dv = 2, beta_one = true, decay_per_key = true,
   name = "gated_delta, MQA, beta [B,T,1], per-key decay"},
  {rule = nil, B = 1, T = 2, hq = 2, hkv = 2, dk = 2, dv = 2, name = "the default rule (gated_delta)"},
}
for _, c in ipairs(la_cases) do
  local rule = c.rule or "gated_delta"
  local gate, delta = rule:find("gated") ~= nil, rule:find("delta") ~= nil
  local B, Tn = c.B, c.T
  local q = fl.randn(B, Tn, c.hq * c.dk) * 0.5
  local k = fl.randn(B, Tn, c.hkv * c.dk) * 0.5
  local v = fl.randn(B, Tn, c.hkv * c.dv)
  local past = c.past and fl.randn(B, c.hkv, c.dk, c.dv) or nil
  local decay = gate and -fl.rand(B, Tn, c.decay_per_key and c.hkv * c.dk or c.hkv) or nil
  local beta = delta and fl.rand(B, Tn, c.beta_one and 1 or c.hkv) or nil
  local want, wstate = ref_linear(c, flat(q), flat(k), flat(v), past and flat(past), decay and flat(decay),
                                  beta and flat(beta))
  local inputs = {{"q", "float", q.shape}, {"k", "float", k.shape}, {"v", "float", v.shape},
    past and {"p", "float", past.shape} or {""}, decay and {"g", "float", decay.shape} or {""},
    beta and {"b", "float", beta.shape} or {""}}
  while inputs[#inputs][1] == "" do inputs[#inputs] = nil end
  local args = {q, k, v}
  for _, a in ipairs({past or false, decay or false, beta or false}) do if a then args[#args + 1] = a end end
  local m = one_node("LinearAttention", {update_rule = c.rule, q_num_heads = c.hq, kv_num_heads = c.hkv,
    scale = c.scale, chunk_size = 2}, inputs, 27, {outputs = {"y", "state"}})
  for _, mode in ipairs({"eager", "compiled"}) do
    local f = mode == "eager" and m or fl.compile(m, {backend = "cpu"})
    local y, st = f(table.unpack(args))
    local name = ("LinearAttention %s, %s"):format(c.name, mode)
    check(y, want, {B, Tn, c.hq * c.dv}, 1e-5, 1e-5, name .. " output")
    check(st, wstate, {B, c.hkv, c.dk, c.dv}, 1e-5, 1e-5, name .. " present_state")
  end
end

-- float16: computed in float32, each output rounded once
do
  local c = {B = 1, T = 3, hq = 2, hkv = 2, dk = 2, dv = 2}
  local q, k, v = fl.randn(1, 3, 4):to("float16"), fl.randn(1, 3, 4):to("float16"), fl.randn(1, 3, 4):to("float16")
  local want, wstate = ref_linear(c, flat(q), flat(k), flat(v))
  local m = one_node("LinearAttention", {update_rule = "linear", q_num_heads = 2, kv_num_heads = 2},
    {{"q", "float16", {1, 3, 4}}, {"k", "float16", {1, 3, 4}}, {"v", "float16", {1, 3, 4}}}, 27,
    {outputs = {"y", "state"}})
  local y, st = m(q, k, v)
  t.ok(y.dtype == "float16" and st.dtype == "float16", "LinearAttention float16: outputs in float16")
  check(y, want, {1, 3, 4}, 2 ^ -10, 1e-3, "LinearAttention float16 output")
  check(st, wstate, {1, 2, 2, 2}, 2 ^ -10, 1e-3, "LinearAttention float16 present_state")
end

-- a float32 state beside float16 activations: present_state stays float32
do
  local c = {B = 1, T = 2, hq = 2, hkv = 2, dk = 2, dv = 2}
  local q, k, v = fl.randn(1, 2, 4):to("float16"), fl.randn(1, 2, 4):to("float16"), fl.randn(1, 2, 4):to("float16")
  local past = fl.randn(1, 2, 2, 2)
  local want, wstate = ref_linear(c, flat(q), flat(k), flat(v), flat(past))
  local m = one_node("LinearAttention", {update_rule = "linear", q_num_heads = 2, kv_num_heads = 2},
    {{"q", "float16", {1, 2, 4}}, {"k", "float16", {1, 2, 4}}, {"v", "float16", {1, 2, 4}}, {"p", "float", {1, 2, 2, 2}}},
    27, {outputs = {"y", "state"}})
  local y, st = m(q, k, v, past)
  t.ok(y.dtype == "float16" and st.dtype == "float32", "LinearAttention: a float32 past_state gives a float32 present_state")
  check(y, want, {1, 2, 4}, 2 ^ -10, 1e-3, "LinearAttention float16 with a float32 state: output")
  check(st, wstate, {1, 2, 2, 2}, 1e-5, 1e-5, "LinearAttention float16 with a float32 state: present_state")
end

local function la(attrs, dims)
  dims = dims or {}
  return one_node("LinearAttention", attrs, {{"q", "float", dims.q or {1, 2, 4}}, {"k", "float", dims.k or {1, 2, 4}},
    {"v", "float", dims.v or {1, 2, 4}}, dims.p and {"p", "float", dims.p} or {""},
    dims.g and {"g", "float", dims.g} or {""}, dims.b and {"b", "float", dims.b} or {""}}, 27,
    {outputs = {"y", "state"}})
end
local q4 = fl.randn(1, 2, 4)
t.raises(function() la({update_rule = "softmax", q_num_heads = 2, kv_num_heads = 2}) end,
         "update_rule 'softmax' is unsupported", "LinearAttention: an unknown update_rule")
t.raises(function() la({update_rule = "linear", q_num_heads = 2}) end,
         "q_num_heads and kv_num_heads are required", "LinearAttention: kv_num_heads missing")
t.raises(function() la({update_rule = "linear", q_num_heads = 3, kv_num_heads = 2}) end,
         "q_num_heads 3 is not a positive multiple of kv_num_heads 2", "LinearAttention: 3 query heads over 2")
t.raises(function() la({update_rule = "gated", q_num_heads = 2, kv_num_heads = 2})(q4, q4, q4) end,
         "update_rule 'gated' needs decay", "LinearAttention: gated without decay")
t.raises(function()
  la({update_rule = "linear", q_num_heads = 2, kv_num_heads = 2}, {g = {1, 2, 2}})(q4, q4, q4, fl.randn(1, 2, 2))
end, "update_rule 'linear' takes no decay", "LinearAttention: linear with a decay")
t.raises(function()
  la({update_rule = "delta", q_num_heads = 2, kv_num_heads = 2}, {b = {1, 2, 3}})(q4, q4, q4, fl.rand(1, 2, 3))
end, "beta of 3 features", "LinearAttention: beta of a bad size")
t.raises(function()
  la({update_rule = "gated", q_num_heads = 2, kv_num_heads = 2}, {g = {1, 2, 3}})(q4, q4, q4, fl.rand(1, 2, 3))
end, "decay of 3 features", "LinearAttention: decay of a bad size")
t.raises(function()
  la({update_rule = "linear", q_num_heads = 2, kv_num_heads = 2}, {p = {1, 2, 2, 3}})(q4, q4, q4, fl.randn(1, 2, 2, 3))
end, "past_state of shape %[1,2,2,3%]", "LinearAttention: past_state of a bad shape")
t.raises(function()
  la({update_rule = "linear", q_num_heads = 2, kv_num_heads = 2}, {k = {1, 2, 6}})(q4, fl.randn(1, 2, 6), q4)
end, "key of 6 features for 2 heads of 2", "LinearAttention: key and query head sizes differ")

-- ---- CausalConvWithState ----------------------------------------------------
-- y[b, c, t] = bias[c] + sum_j w[c, j] p[b, c, t + j] over p = past ++ x
local function ref_conv(x, w, bias, past, B, C, L, k, act)
  local y, st = {}, {}
  for b = 0, B - 1 do
    for c = 0, C - 1 do
      local p = {}
      for i = 0, k - 2 do p[#p + 1] = past and past[(b * C + c) * (k - 1) + i + 1] or 0 end
      for i = 0, L - 1 do p[#p + 1] = x[(b * C + c) * L + i + 1] end
      for tt = 0, L - 1 do
        local s = bias and bias[c + 1] or 0
        for j = 0, k - 1 do s = s + w[c * k + j + 1] * p[tt + j + 1] end
        if act then s = s / (1 + math.exp(-s)) end
        y[#y + 1] = s
      end
      for i = #p - (k - 1) + 1, #p do st[#st + 1] = p[i] end
    end
  end
  return y, st
end

local cc_cases = {
  {B = 2, C = 3, L = 6, k = 4, name = "k 4"},
  {B = 1, C = 2, L = 5, k = 3, bias = true, past = true, name = "k 3, bias and past"},
  {B = 2, C = 4, L = 1, k = 4, past = true, act = "silu", name = "one step (decode), past, silu"},
  {B = 1, C = 2, L = 2, k = 5, name = "shorter than the kernel, no past"},
  {B = 2, C = 3, L = 4, k = 1, bias = true, act = "swish", name = "k 1, swish"},
}
for _, c in ipairs(cc_cases) do
  local x, w = fl.randn(c.B, c.C, c.L), fl.randn(c.C, 1, c.k)
  local bias = c.bias and fl.randn(c.C) or nil
  local past = c.past and fl.randn(c.B, c.C, c.k - 1) or nil
  local want, wst = ref_conv(flat(x), flat(w), bias and flat(bias), past and flat(past), c.B, c.C, c.L, c.k, c.act)
  local inputs = {{"x", "float", x.shape}, {"w", "float", w.shape}, bias and {"b", "float", bias.shape} or {""},
    past and {"p", "float", past.shape} or {""}}
  while inputs[#inputs][1] == "" do inputs[#inputs] = nil end
  local args = {x, w}
  if bias then args[#args + 1] = bias end
  if past then args[#args + 1] = past end
  local m = one_node("CausalConvWithState", {activation = c.act}, inputs, 27, {outputs = {"y", "state"}})
  for _, mode in ipairs({"eager", "compiled"}) do
    local f = mode == "eager" and m or fl.compile(m, {backend = "cpu"})
    local y, st = f(table.unpack(args))
    local name = ("CausalConvWithState %s, %s"):format(c.name, mode)
    check(y, want, {c.B, c.C, c.L}, 1e-5, 1e-6, name .. " output")
    check(st, wst, {c.B, c.C, c.k - 1}, 0, 0, name .. " present_state")
  end
end
t.raises(function()
  one_node("CausalConvWithState", {activation = "relu"}, {{"x", "float", {1, 2, 3}}, {"w", "float", {2, 1, 2}}}, 27)
end, "activation 'relu' is unsupported", "CausalConvWithState: activation relu")
t.raises(function()
  one_node("CausalConvWithState", nil, {{"x", "float", {1, 2, 3}}, {"w", "float", {2, 2, 2}}}, 27)(
    fl.randn(1, 2, 3), fl.randn(2, 2, 2))
end, "weight of shape %[2,2,2%]", "CausalConvWithState: a weight that is not depthwise")
t.raises(function()
  one_node("CausalConvWithState", nil, {{"x", "float", {1, 2, 3}}, {"w", "float", {2, 1, 3}}, {""},
    {"p", "float", {1, 2, 1}}}, 27)(fl.randn(1, 2, 3), fl.randn(2, 1, 3), fl.randn(1, 2, 1))
end, "past_state of shape %[1,2,1%]", "CausalConvWithState: past_state of k - 2 positions")

-- ---- Scan before opset 9 --------------------------------------------------
-- a running sum per batch entry; sequence_lens cut each entry's steps, the
-- scan output zero past them; directions reverses the scan input
local function scan8(lens, dirs)
  local body = {graph = {name = "body",
    nodes = {{op = "Add", inputs = {"s_in", "x_t"}, outputs = {"s_out"}},
             {op = "Identity", inputs = {"s_out"}, outputs = {"o"}}},
    inputs = {{name = "s_in", dtype = "float", dims = {2}}, {name = "x_t", dtype = "float", dims = {2}}},
    outputs = {{name = "s_out", dtype = "float", dims = {2}}, {name = "o", dtype = "float", dims = {2}}}}}
  local inits = lens and {{name = "lens", dtype = "int64", dims = {#lens}, ints = lens}} or nil
  return one_node("Scan", {num_scan_inputs = 1, body = body, directions = dirs},
    {{lens and "lens" or ""}, {"init", "float", {3, 2}}, {"x", "float", {3, 4, 2}}}, 8,
    {outputs = {"final", "scan"}, inits = inits})
end
local function ref_scan8(init, x, lens, rev)
  local fin, sc = {}, {}
  for b = 0, 2 do
    local s = {init[b * 2 + 1], init[b * 2 + 2]}
    local n = lens and lens[b + 1] or 4
    for step = 0, 3 do
      if step < n then
        local at = rev and n - 1 - step or step
        for d = 1, 2 do s[d] = s[d] + x[(b * 4 + at) * 2 + d] end
        sc[#sc + 1], sc[#sc + 2] = s[1], s[2]
      else
        sc[#sc + 1], sc[#sc + 2] = 0, 0
      end
    end
    fin[#fin + 1], fin[#fin + 2] = s[1], s[2]
  end
  return fin, sc
end
for _, c in ipairs({{name = "no sequence_lens"}, {lens = {4, 1, 3}, name = "sequence_lens 4, 1, 3"},
                    {lens = {2, 4, 0}, dirs = {1}, name = "sequence_lens 2, 4, 0, reversed"}}) do
  local init, x = fl.randn(3, 2), fl.randn(3, 4, 2)
  local fin, sc = ref_scan8(flat(init), flat(x), c.lens, c.dirs ~= nil)
  local m = scan8(c.lens, c.dirs)
  if c.lens and c.lens[3] == 0 then
    t.raises(function() m(init, x) end, "scan outputs of a Scan over no step is unsupported",
             "Scan-8: an entry of length 0 with scan outputs")
  else
    for _, mode in ipairs({"eager", "compiled"}) do
      local f = mode == "eager" and m or fl.compile(m, {backend = "cpu"})
      local a, b = f(init, x)
      check(a, fin, {3, 2}, 1e-6, 1e-6, "Scan-8 " .. c.name .. ", " .. mode .. ": final state")
      check(b, sc, {3, 4, 2}, 1e-6, 1e-6, "Scan-8 " .. c.name .. ", " .. mode .. ": scan output")
    end
  end
end
do
  local init, x = fl.randn(3, 2), fl.randn(3, 4, 2)
  local fin, sc = ref_scan8(flat(init), flat(x), {3, 2, 4}, true)
  local m = scan8({3, 2, 4}, {1})
  local a, b = m(init, x)
  check(a, fin, {3, 2}, 1e-6, 1e-6, "Scan-8 reversed over sequence_lens 3, 2, 4: final state")
  check(b, sc, {3, 4, 2}, 1e-6, 1e-6, "Scan-8 reversed over sequence_lens 3, 2, 4: scan output")
end
t.raises(function() scan8({5, 1, 1})(fl.randn(3, 2), fl.randn(3, 4, 2)) end,
         "sequence length 5 outside %[0, 4%]", "Scan-8: a sequence length past the steps")
t.raises(function() scan8({1, 1})(fl.randn(3, 2), fl.randn(3, 4, 2)) end,
         "sequence_lens of 2 values for a batch of 3", "Scan-8: sequence_lens of the wrong size")

t.done()
