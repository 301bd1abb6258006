-- rnn.lua -- the rnn op (ONNX's RNN, GRU and LSTM cells, fl.rnn) against
-- ONNX's equations written out here in plain Lua numbers, step by step:
-- every cell, direction, biases, initial states, peepholes, clip,
-- linear_before_reset, other activations and sequence_lens; eager, and
-- compiled once for two sequence lengths (and batches); float64 through
-- the oracle; errors that name the op.
local fl = fl or require "fuselab"
local t = require "tap"

local GATES = {rnn = 1, gru = 3, lstm = 4}
local ACT = {
  Sigmoid = function(x) return 1 / (1 + math.exp(-x)) end,
  Tanh = function(x) local e = math.exp(2 * x) return x > 20 and 1 or x < -20 and -1 or (e - 1) / (e + 1) end,
  Relu = function(x) return x < 0 and 0 or x end,
  Softsign = function(x) return x / (1 + math.abs(x)) end,
  Softplus = function(x) return x > 30 and x or math.log(1 + math.exp(x)) end,
}
local DEFAULT = {rnn = {"Tanh"}, gru = {"Sigmoid", "Tanh"}, lstm = {"Sigmoid", "Tanh", "Tanh"}}

local function flat(x) return x and x:to("float64"):reshape({-1}):tolist() or nil end

-- ONNX's cell equations (onnx.ai/onnx/operators: RNN, GRU, LSTM), layout 0.
-- o: cell, dir, T, B, I, H, and tensors x w r b lens h0 c0 p; clip, lbr,
-- acts (ONNX's list).  Returns Y [T][D][B][H], Y_h, Y_c as flat lists.
local function reference(o)
  local G, H, I, B, T = GATES[o.cell], o.H, o.I, o.B, o.T
  local D = o.dir == "bidirectional" and 2 or 1
  local x, w, r, b, p = flat(o.x), flat(o.w), flat(o.r), flat(o.b), flat(o.p)
  local lens, h0, c0 = o.lens and o.lens:tolist(), flat(o.h0), flat(o.c0)
  local nact = #DEFAULT[o.cell]
  local Y, Yh, Yc = {}, {}, {}
  for k = 1, T * D * B * H do Y[k] = 0 end
  local function clip(v)
    if not o.clip then return v end
    return math.max(-o.clip, math.min(o.clip, v))
  end
  for d = 0, D - 1 do
    local reverse = o.dir == "reverse" or d == 1
    local function act(k, v)
      local name = o.acts and o.acts[d * nact + k] or DEFAULT[o.cell][k]
      return ACT[name](v)
    end
    -- gate g (0-based), unit j: row of W/R, and the two biases
    local function Wx(g, tt, bb, j)
      local s = 0
      for i = 0, I - 1 do s = s + x[(tt * B + bb) * I + i + 1] * w[(d * G * H + g * H + j) * I + i + 1] end
      return s + (b and b[d * 2 * G * H + g * H + j + 1] or 0)
    end
    local function Rh(g, hv, j)
      local s = 0
      for m = 0, H - 1 do s = s + hv[m + 1] * r[(d * G * H + g * H + j) * H + m + 1] end
      return s + (b and b[d * 2 * G * H + (G + g) * H + j + 1] or 0)
    end
    for bb = 0, B - 1 do
      local h, c = {}, {}
      for j = 0, H - 1 do
        h[j + 1] = h0 and h0[(d * B + bb) * H + j + 1] or 0
        c[j + 1] = c0 and c0[(d * B + bb) * H + j + 1] or 0
      end
      for s = 0, T - 1 do
        local tt = reverse and T - 1 - s or s
        if not lens or tt < lens[bb + 1] then
          local hn, cn = {}, {}
          if o.cell == "rnn" then
            for j = 0, H - 1 do hn[j + 1] = act(1, clip(Wx(0, tt, bb, j) + Rh(0, h, j))) end
          elseif o.cell == "gru" then
            local z, rr, rh = {}, {}, {}
            for j = 0, H - 1 do
              z[j + 1] = act(1, clip(Wx(0, tt, bb, j) + Rh(0, h, j)))
              rr[j + 1] = act(1, clip(Wx(1, tt, bb, j) + Rh(1, h, j)))
              rh[j + 1] = rr[j + 1] * h[j + 1]
            end
            for j = 0, H - 1 do
              local cand
              if o.lbr then cand = act(2, clip(Wx(2, tt, bb, j) + rr[j + 1] * Rh(2, h, j)))
              else cand = act(2, clip(Wx(2, tt, bb, j) + Rh(2, rh, j))) end
              hn[j + 1] = (1 - z[j + 1]) * cand + z[j + 1] * h[j + 1]
            end
          else
            for j = 0, H - 1 do
              local pi = p and p[d * 3 * H + j + 1] or 0
              local po = p and p[d * 3 * H + H + j + 1] or 0
              local pf = p and p[d * 3 * H + 2 * H + j + 1] or 0
              local ig = act(1, clip(Wx(0, tt, bb, j) + Rh(0, h, j) + pi * c[j + 1]))
              local fg = act(1, clip(Wx(2, tt, bb, j) + Rh(2, h, j) + pf * c[j + 1]))
              local cg = act(2, clip(Wx(3, tt, bb, j) + Rh(3, h, j)))
              cn[j + 1] = fg * c[j + 1] + ig * cg
              local og = act(1, clip(Wx(1, tt, bb, j) + Rh(1, h, j) + po * cn[j + 1]))
              hn[j + 1] = og * act(3, cn[j + 1])
            end
          end
          h = hn
          if o.cell == "lstm" then c = cn end
          for j = 0, H - 1 do Y[((tt * D + d) * B + bb) * H + j + 1] = h[j + 1] end
        end
      end
      for j = 0, H - 1 do
        Yh[(d * B + bb) * H + j + 1] = h[j + 1]
        Yc[(d * B + bb) * H + j + 1] = c[j + 1]
      end
    end
  end
  return Y, Yh, Yc
end

-- |got - want| <= 1e-5 (1 + |want|) everywhere
local function close(got, want)
  local g = flat(got)
  if #g ~= #want then return false, "sizes " .. #g .. " and " .. #want end
  local worst = 0
  for k = 1, #g do worst = math.max(worst, math.abs(g[k] - want[k]) / (1 + math.abs(want[k]))) end
  return worst <= 1e-5, string.format("worst relative error %.2g", worst)
end

-- a case's tensors at sequence length T and batch B (its seed fixes them)
local function make(case, T, B)
  local G, H, I = GATES[case.cell], case.H, case.I
  local D = case.dir == "bidirectional" and 2 or 1
  fl.manual_seed(case.seed)
  local o = {cell = case.cell, dir = case.dir, T = T, B = B, I = I, H = H, clip = case.clip,
             lbr = case.lbr, acts = case.acts}
  o.w = fl.randn(D, G * H, I) * 0.5
  o.r = fl.randn(D, G * H, H) * 0.5
  if case.bias then o.b = fl.randn(D, 2 * G * H) * 0.5 end
  if case.init then
    o.h0 = fl.randn(D, B, H)
    if case.cell == "lstm" then o.c0 = fl.randn(D, B, H) end
  end
  if case.peep then o.p = fl.randn(D, 3 * H) * 0.5 end
  fl.manual_seed(case.seed * 7 + T * 31 + B)
  o.x = fl.randn(T, B, I)
  if case.lens then
    local l = {}
    for k = 1, B do l[k] = (k * 3) % (T + 1) end   -- 0 (the state stays h0) up to T
    o.lens = fl.tensor(l, {dtype = "int64"})
  end
  return o
end

local function opts(o)
  return {cell = o.cell, direction = o.dir, bias = o.b, sequence_lens = o.lens, initial_h = o.h0,
          initial_c = o.c0, peepholes = o.p, clip = o.clip, linear_before_reset = o.lbr,
          activations = o.acts}
end

local function check(what, o, y, yh, yc)
  local Y, Yh, Yc = reference(o)
  local ok1, m1 = close(y, Y)
  local ok2, m2 = close(yh, Yh)
  local ok3, m3 = true, ""
  if o.cell == "lstm" then ok3, m3 = close(yc, Yc) end
  t.ok(ok1 and ok2 and ok3, what .. " (y: " .. m1 .. "; y_h: " .. m2 .. (o.cell == "lstm" and "; y_c: " .. m3 or "") .. ")")
end

local cases = {
  {cell = "rnn", dir = "forward", I = 3, H = 4, seed = 1, bias = true},
  {cell = "rnn", dir = "bidirectional", I = 5, H = 2, seed = 2, bias = true, init = true, lens = true},
  {cell = "rnn", dir = "reverse", I = 2, H = 3, seed = 3, acts = {"Relu"}, clip = 1.5},
  {cell = "gru", dir = "forward", I = 4, H = 5, seed = 4, bias = true, init = true},
  {cell = "gru", dir = "reverse", I = 3, H = 4, seed = 5, bias = true, lbr = true, lens = true},
  {cell = "gru", dir = "bidirectional", I = 3, H = 3, seed = 6, bias = true, lbr = true, init = true,
   acts = {"Sigmoid", "Softsign", "Softplus", "Tanh"}},
  {cell = "lstm", dir = "forward", I = 4, H = 3, seed = 7, bias = true},
  {cell = "lstm", dir = "bidirectional", I = 3, H = 4, seed = 8, bias = true, init = true, peep = true,
   lens = true},
  {cell = "lstm", dir = "reverse", I = 2, H = 2, seed = 9, init = true, peep = true, clip = 0.7,
   acts = {"Sigmoid", "Softsign", "Relu"}},
  {cell = "lstm", dir = "forward", I = 1, H = 7, seed = 10, bias = true, init = true, lens = true},
}

for _, case in ipairs(cases) do
  local name = string.format("%s %s I=%d H=%d%s%s%s%s%s%s%s", case.cell, case.dir, case.I, case.H,
    case.bias and " bias" or "", case.init and " initial states" or "", case.peep and " peepholes" or "",
    case.clip and " clip" or "", case.lbr and " linear_before_reset" or "", case.acts and " activations" or "",
    case.lens and " sequence_lens" or "")
  -- eager, at two sizes
  for _, tb in ipairs{{5, 3}, {1, 2}} do
    local o = make(case, tb[1], tb[2])
    check(name .. string.format(", eager T=%d B=%d", tb[1], tb[2]), o, fl.rnn(o.x, o.w, o.r, opts(o)))
  end
  -- compiled with symbolic sizes: T 4 then 7 (and B 2 then 3), one compile
  local cf = fl.compile(function(x, w, r, b, lens, h0, c0, p)
    local op = {cell = case.cell, direction = case.dir, bias = b, sequence_lens = lens, initial_h = h0,
                initial_c = c0, peepholes = p, clip = case.clip, linear_before_reset = case.lbr,
                activations = case.acts}
    return fl.rnn(x, w, r, op)
  end, {backend = "cpu", dynamic = true})
  for _, tb in ipairs{{4, 2}, {7, 3}} do
    local o = make(case, tb[1], tb[2])
    check(name .. string.format(", compiled T=%d B=%d", tb[1], tb[2]), o,
          cf(o.x, o.w, o.r, o.b, o.lens, o.h0, o.c0, o.p))
  end
  local s = cf:stats()
  t.ok(s.compiles == 1 and s.recompiles == 0 and s.graph_breaks == 0,
       name .. string.format(": one compile for two sequence lengths (compiles %d, recompiles %d)",
                             s.compiles, s.recompiles))
end

-- the compiled graph holds one rnn op, its sequence length symbolic
do
  local case = cases[8]
  local o = make(case, 6, 2)
  local cf = fl.compile(function(x) return fl.rnn(x, o.w, o.r, opts(o)) end, {backend = "cpu", dynamic = true})
  cf(o.x)
  local text = tostring(cf:graphs()[1])
  local _, n = text:gsub("= rnn%(", "")
  t.ok(n == 1 and text:find("rnn%([^\n]-LSTM, bidirectional%) : float32%[2%+s0,2,s1,4%]") ~= nil,
       "compiled: one rnn node, its result [2 + T, 2, B, 4] symbolic")
  if n ~= 1 then t.diag(text) end
  -- float64 runs the oracle (graph/ref_nn.c), which must agree too
  local o64 = {}
  for k, v in pairs(o) do o64[k] = fl.is_tensor(v) and v.dtype == "float32" and v:to("float64") or v end
  check("float64 (the oracle)", o64, fl.rnn(o64.x, o64.w, o64.r, opts(o64)))
end

-- compiled for CUDA (a device or the emulator, tests/gpu/emu/run): the
-- same results as eager on the CPU, within 1e-5 relative (float32);
-- LSTM and GRU, bidirectional, with sequence_lens, initial states, one
-- with peepholes, one with linear_before_reset, and an epilogue fused
-- into the store
if fl.cuda_available() then
  local gpu_cases = {
    {cell = "lstm", dir = "bidirectional", I = 3, H = 5, seed = 21, bias = true, init = true, peep = true,
     lens = true},
    {cell = "gru", dir = "bidirectional", I = 4, H = 3, seed = 22, bias = true, init = true, lens = true},
    {cell = "gru", dir = "bidirectional", I = 2, H = 4, seed = 23, bias = true, lbr = true, lens = true,
     clip = 1.2, acts = {"Sigmoid", "Softsign", "Softplus", "Tanh"}},
    {cell = "rnn", dir = "reverse", I = 3, H = 4, seed = 24, bias = true, init = true, lens = true,
     acts = {"Relu"}},
  }
  local function dev(v) return fl.is_tensor(v) and v:cuda() or v end
  for _, case in ipairs(gpu_cases) do
    local o = make(case, 6, 4)
    local f = function(x, w, r, b, lens, h0, c0, p)
      local y, yh, yc = fl.rnn(x, w, r, {cell = case.cell, direction = case.dir, bias = b, sequence_lens = lens,
                                         initial_h = h0, initial_c = c0, peepholes = p, clip = case.clip,
                                         linear_before_reset = case.lbr, activations = case.acts})
      return y, yh * 2 + 1, yc
    end
    local want = {f(o.x, o.w, o.r, o.b, o.lens, o.h0, o.c0, o.p)}
    local cf = fl.compile(f, {backend = "cuda"})
    local got = {cf(dev(o.x), dev(o.w), dev(o.r), dev(o.b), dev(o.lens), dev(o.h0), dev(o.c0), dev(o.p))}
    local ok, msgs = true, {}
    for k = 1, case.cell == "lstm" and 3 or 2 do
      local okk, m = close(got[k]:cpu(), flat(want[k]))
      ok = ok and okk
      msgs[#msgs + 1] = m
    end
    -- a graph without a CUDA lowering would run on the eager kernels
    -- (stats.fallbacks): that must not pass for the generated kernel
    local s = cf:stats()
    t.ok(ok and s.fallbacks == 0 and s.graph_breaks == 0,
         string.format("%s %s%s%s, compiled for CUDA matches eager on the CPU (%s; fallbacks %d, graph breaks %d)",
                       case.cell, case.dir, case.lbr and " linear_before_reset" or "",
                       case.peep and " peepholes" or "", table.concat(msgs, "; "), s.fallbacks, s.graph_breaks))
  end
else
  t.skip("no CUDA device or emulator: the CUDA path runs under tests/gpu/emu/run", 4)
end

-- errors name the op
do
  local x, w, r = fl.randn(3, 2, 4), fl.randn(1, 12, 4), fl.randn(1, 12, 3)
  t.raises(function() fl.rnn(x, fl.randn(1, 12, 5), r, {cell = "lstm"}) end,
           "rnn: W has shape %[1,12,5%], expected %[1,12,4%]", "a W of the wrong input size")
  t.raises(function() fl.rnn(x, w, r, {cell = "lstm", direction = "bidirectional"}) end,
           "rnn: R must be %[2, 4%*H, H%]", "one direction's weights for two")
  t.raises(function() fl.rnn(x, w, r, {cell = "lstm", sequence_lens = fl.tensor{1.0, 2.0}}) end,
           "rnn: sequence_lens must be int64 %[2%]", "float lengths")
  t.raises(function() fl.rnn(x, w, r, {cell = "lstm", activations = {"Sigmoid", "Elu", "Tanh"}}) end,
           "rnn: activation Elu is not one of", "an activation the op lacks")
  local wg = w:detach():requires_grad_()
  local y = fl.rnn(x, wg, r)
  t.ok(y.requires_grad, "a result of rnn over a weight that requires grad requires grad")
  t.raises(function() y:sum():backward() end, "rnn has no derivative",
           "backward through rnn: an error naming it")
end

t.done()
