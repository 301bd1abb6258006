-- nn.lua -- neural-network modules and ready models, Torch7 style, written
-- in Lua over the fl tensor API.  Embedded in the binary and the C module
-- (lfl_nn.c runs this chunk with the fl table); it fills fl.nn and
-- fl.models.
--
-- A module is a table whose metatable is its class.  It keeps, in
-- registration order, the names of its parameters, buffers and children
-- (each also a plain field: m.weight, m.attn), so rebinding a field is
-- seen by named_parameters and by graph capture.  Names follow PyTorch's
-- state_dict ("blocks.0.attn.q_proj.weight"; Sequential children are
-- "0", "1", ...), so weights move both ways unchanged; printing follows
-- Torch7 ("nn.Linear(10 -> 20)"; Sequential numbers its children from 1,
-- as its Lua list m.modules does).  Every module records its dotted path
-- from the root in m._path ("" for the root) so graph capture can
-- attribute nodes to modules.
--
-- Modules start in training mode, as PyTorch's do.  Training mode changes
-- nn.Dropout (inverted dropout, the fl.dropout op) and nn.BatchNorm2d
-- (the batch's statistics, and the running ones updated); eval mode is
-- what a deployed model runs.  Every parameter requires grad from the
-- moment it is registered (PyTorch's nn.Parameter); buffers never do.

local fl = ...
local nn = fl.nn or {}
local models = fl.models or {}
fl.nn, fl.models = nn, models

local fmt = string.format

-- ---------------------------------------------------------------------------
-- helpers
-- ---------------------------------------------------------------------------

local size_eq = fl.size_eq

-- "[2,3]": a tensor's shape, or a list of sizes
local function shape_str(t)
  local s = {}
  for i, n in ipairs(fl.is_tensor(t) and t.shape or t) do s[i] = tostring(n) end
  return "[" .. table.concat(s, ",") .. "]"
end

local function same_shape(a, b)
  if a:dim() ~= b:dim() then return false end
  for d = 1, a:dim() do if a:size(d) ~= b:size(d) then return false end end
  return true
end

-- Argument and configuration errors are raised at level 0: the message
-- names the module or model and the argument, and the traceback says
-- where the call came from.

-- A positive (or, with min, at least min) integer argument.
local function check_int(v, what, min)
  min = min or 1
  local i = math.tointeger(v)
  if not i then
    error(fmt("%s: expected an integer, got %s", what, type(v) == "number" and v or type(v)), 0)
  end
  v = i
  if v < min then error(fmt("%s: expected an integer >= %d, got %d", what, min, v), 0) end
  return v
end

-- An options table (or nil, unless required) with only the allowed keys:
-- catches typos.
local function options(opts, allowed, what, required)
  if opts == nil and not required then return {} end
  if type(opts) ~= "table" then error(fmt("%s: expected an options table, got %s", what, type(opts)), 0) end
  for k in pairs(opts) do
    local known = false
    for _, a in ipairs(allowed) do known = known or k == a end
    if not known then
      error(fmt("%s: unknown option '%s' (expected %s)", what, tostring(k), table.concat(allowed, ", ")), 0)
    end
  end
  return opts
end

-- A kernel/stride/padding given as n or {h, w}, as a pair.
local function pair(v, what)
  if type(v) == "table" then
    if #v ~= 2 then error(fmt("%s: expected a number or {h, w}", what), 0) end
    return {v[1], v[2]}
  end
  return {v, v}
end

local function pair_str(p, sep) return p[1] .. sep .. p[2] end

-- Uniform values in [-bound, bound): PyTorch's default initialization of
-- Linear and Conv2d weights and biases, bound = 1/sqrt(fan_in).
local function uniform(shape, bound)
  return (fl.rand(shape) * 2 - 1) * bound
end

-- ---------------------------------------------------------------------------
-- Module: the base class
-- ---------------------------------------------------------------------------

local Module = {__typename = "nn.Module"}
Module.__index = Module
nn.Module = Module

local function is_class(v) return type(v) == "table" and rawget(v, "__typename") ~= nil end
local function is_module(v)
  local mt = type(v) == "table" and getmetatable(v)
  return type(mt) == "table" and rawget(mt, "__typename") ~= nil and v ~= mt
end
nn.is_module = is_module

-- nn.class(name [, parent]): a new module class.  Calling the class makes
-- an instance and runs its __init with the arguments.
local function class(name, parent)
  parent = parent or Module
  local cls = {__typename = name, __call = Module.__call, __tostring = Module.__tostring}
  cls.__index = cls
  return setmetatable(cls, {
    __index = parent,
    __tostring = function() return name end,
    __call = function(c, ...)
      local self = setmetatable({training = true, _path = "", _params = {}, _buffers = {},
                                 _children = {}}, c)
      self:__init(...)
      return self
    end,
  })
end
nn.class = class

function Module:__init() end

-- Calling a module runs its forward.  nn._call_hook, when set, is called
-- instead as hook(module, ...) and must call module:forward itself.
-- While a trace records, the module's _path brackets the nodes its forward
-- adds (fl.draw's group_modules clusters by it); an error ends the trace,
-- which drops the bracket with it.
local function scope_pop(...)
  fl._scope_pop()
  return ...
end

function Module.__call(self, ...)
  local hook = nn._call_hook
  if hook then return hook(self, ...) end
  if self._path ~= "" and fl._tracing() then
    fl._scope_push(self._path)
    return scope_pop(self:forward(...))
  end
  return self:forward(...)
end

function Module:forward()
  error(self.__typename .. ": forward is not implemented", 0)
end

-- Raise a message naming this module (and where it sits in the model).
function Module:error(msg, ...)
  local where = self._path ~= "" and (" at " .. self._path) or ""
  error(self:_head() .. where .. ": " .. fmt(msg, ...), 0)
end

local function append_once(list, name)
  for _, n in ipairs(list) do if n == name then return end end
  list[#list + 1] = name
end

-- A parameter is a leaf that requires grad, as nn.Parameter is.  Where
-- autograd cannot follow (an integer tensor, a tensor on the GPU, a
-- tensor of a capture in progress) it is kept as it is: such a model
-- still runs, it only cannot be trained there.
-- A tensor computed from others (not a leaf) becomes a leaf sharing its
-- values, as nn.Parameter(t) does.
local function as_parameter(t)
  if not fl.is_tensor(t) then return t end
  if t.requires_grad then
    if t.is_leaf then return t end
    t = t:detach()
  end
  if not t.dtype:find("float") or fl._tracing() then return t end
  return t:requires_grad_()
end

function Module:register_parameter(name, t)
  append_once(self._params, name)
  self[name] = as_parameter(t)
end

function Module:register_buffer(name, t)
  append_once(self._buffers, name)
  self[name] = t
end

-- Set m's path and its children's, recursively (a subtree moved under a
-- new parent gets new paths).
local function set_path(m, path)
  m._path = path
  for _, name in ipairs(m._children) do
    set_path(m[name], path == "" and name or (path .. "." .. name))
  end
end

-- Add child m (a module, or a class, instantiated with no arguments).
function Module:add_module(name, m)
  if is_class(m) then m = m() end
  if not is_module(m) then
    error(fmt("%s: add_module '%s': expected a module, got %s", self.__typename, name,
              type(m) == "table" and "a table" or type(m)), 0)
  end
  append_once(self._children, name)
  self[name] = m
  set_path(m, self._path == "" and name or (self._path .. "." .. name))
  return m
end

-- Walk parameters (kind "_params") or buffers ("_buffers") in PyTorch's
-- state_dict order: a module's own, then each child's.
local function walk(m, kind, prefix, fn)
  for _, name in ipairs(m[kind]) do
    if m[name] ~= nil then fn(prefix .. name, m[name]) end
  end
  for _, name in ipairs(m._children) do walk(m[name], kind, prefix .. name .. ".", fn) end
end

-- name -> tensor, plus the names in order as a second result.  A tensor
-- reachable under two names (tied weights) is listed once, as PyTorch does.
function Module:named_parameters()
  local map, names, seen = {}, {}, {}
  walk(self, "_params", "", function(name, t)
    if not seen[t] then
      seen[t] = true
      map[name] = t
      names[#names + 1] = name
    end
  end)
  return map, names
end

function Module:parameters()
  local map, names = self:named_parameters()
  local list = {}
  for i, n in ipairs(names) do list[i] = map[n] end
  return list
end

function Module:named_buffers()
  local map, names = {}, {}
  walk(self, "_buffers", "", function(name, t)
    map[name] = t
    names[#names + 1] = name
  end)
  return map, names
end

-- Every parameter and buffer by name, in PyTorch's state_dict order (a
-- module's parameters, its buffers, then its children): what
-- fl.save_weights writes and fl.load_weights fills.
function Module:state_dict()
  local map, names = {}, {}
  local function visit(m, prefix)
    for _, kind in ipairs({"_params", "_buffers"}) do
      for _, name in ipairs(m[kind]) do
        if m[name] ~= nil then
          map[prefix .. name] = m[name]
          names[#names + 1] = prefix .. name
        end
      end
    end
    for _, name in ipairs(m._children) do visit(m[name], prefix .. name .. ".") end
  end
  visit(self, "")
  return map, names
end

-- The total number of parameter elements.
function Module:nparameters()
  local n = 0
  for _, t in ipairs(self:parameters()) do n = n + t:numel() end
  return n
end

function Module:children()
  local list = {}
  for i, name in ipairs(self._children) do list[i] = self[name] end
  return list
end

function Module:train(mode)
  if mode == nil then mode = true end
  self.training = not not mode
  for _, name in ipairs(self._children) do self[name]:train(mode) end
  return self
end

function Module:eval() return self:train(false) end

-- m:to(device or dtype ...), m:cuda(), m:cpu(): every parameter and buffer
-- replaced by the moved tensor, in place (the module is returned), as
-- PyTorch's Module.to does.  A tensor under two names (tied weights) is
-- moved once and stays shared; a weight already there is kept as it is.
-- Compiled functions then bind the resident weights: no copy per call.
-- A moved parameter is a new leaf (its .grad starts empty) that requires
-- grad as the parameter it replaces did (autograd runs on either device).
function Module:to(...)
  local args, moved = table.pack(...), {}
  local function visit(m)
    for _, kind in ipairs({"_params", "_buffers"}) do
      for _, name in ipairs(m[kind]) do
        local t = m[name]
        if t ~= nil then
          if moved[t] == nil then
            local u = fl.no_grad(t.to, t, table.unpack(args, 1, args.n))
            if u ~= t and kind == "_params" and t.requires_grad then
              u = as_parameter(u)
            end
            moved[t] = u
          end
          m[name] = moved[t]
        end
      end
    end
    for _, name in ipairs(m._children) do visit(m[name]) end
  end
  visit(self)
  return self
end

-- m:zero_grad([set_to_none]): every parameter's .grad set to nil
-- (PyTorch's default, set_to_none = true), or zeroed in place with false.
function Module:zero_grad(set_to_none)
  if fl._dry_capture then return self end  -- fl.compile's dry capture runs nothing
  for _, p in ipairs(self:parameters()) do
    if set_to_none == false then
      local g = p.grad
      if g and g.requires_grad then     -- a history (create_graph): detached first
        g = g:detach()
        p.grad = g
      end
      if g then g:zero_() end
    else
      p.grad = nil
    end
  end
  return self
end

-- m:requires_grad_([on]): every parameter's requires_grad (freezing a
-- part of a model with false); returns m.
function Module:requires_grad_(on)
  if on == nil then on = true end
  for _, p in ipairs(self:parameters()) do p:requires_grad_(on) end
  return self
end

function Module:cuda() return self:to("cuda") end
function Module:cpu() return self:to("cpu") end

-- One line describing the module itself ("nn.Linear(10 -> 20)").
function Module:_head() return self.__typename end

-- Torch7's layout: the head, then named children indented.
function Module.__tostring(self)
  local s = self:_head()
  if #self._children == 0 then return s end
  local lines = {s .. " {"}
  for _, name in ipairs(self._children) do
    lines[#lines + 1] = "  (" .. name .. "): " .. tostring(self[name]):gsub("\n", "\n  ")
  end
  lines[#lines + 1] = "}"
  return table.concat(lines, "\n")
end

local function check_tensor(m, x, what)
  if not fl.is_tensor(x) then m:error("expected %s to be a tensor, got %s", what or "the input", type(x)) end
end

-- ---------------------------------------------------------------------------
-- layers
-- ---------------------------------------------------------------------------

-- nn.Linear(i, o [, {bias=}]) or nn.Linear(i, o, false): y = x W^T + b,
-- weight [o, i], bias [o].
local Linear = class("nn.Linear")
nn.Linear = Linear

function Linear:__init(i, o, opts)
  if opts == false then opts = {bias = false} end
  opts = options(opts, {"bias"}, "nn.Linear")
  self.in_features = check_int(i, "nn.Linear: in_features", 0)
  self.out_features = check_int(o, "nn.Linear: out_features", 0)
  i, o = self.in_features, self.out_features
  local bound = i > 0 and 1 / math.sqrt(i) or 0
  self:register_parameter("weight", uniform({o, i}, bound))
  if opts.bias ~= false then self:register_parameter("bias", uniform({o}, bound)) end
end

function Linear:_head()
  return fmt("nn.Linear(%d -> %d)%s", self.in_features, self.out_features,
             self.bias and "" or " without bias")
end

function Linear:forward(x)
  check_tensor(self, x)
  local n = x:dim()
  -- size_eq, not ~=: under capture x:size(n) may be a symbolic size,
  -- which Lua's == never asks
  if n == 0 or not size_eq(x:size(n), self.in_features) then
    self:error("input %s has %d features in its last dim, expected %d", shape_str(x),
               n == 0 and 0 or x:size(n), self.in_features)
  end
  return fl.linear(x, self.weight, self.bias)
end

-- Activations: no parameters, one elementwise op each.
local function activation(name, method)
  local cls = class("nn." .. name)
  cls.forward = function(self, x)
    check_tensor(self, x)
    return x[method](x)
  end
  nn[name] = cls
  return cls
end
activation("ReLU", "relu")
activation("SiLU", "silu")
activation("Tanh", "tanh")
activation("Sigmoid", "sigmoid")

-- nn.GELU() exact (erf); nn.GELU{approximate="tanh"} or nn.GELU("tanh").
local GELU = class("nn.GELU")
nn.GELU = GELU

function GELU:__init(opts)
  if type(opts) == "string" then opts = {approximate = opts} end
  opts = options(opts, {"approximate"}, "nn.GELU")
  local a = opts.approximate or "none"
  if a ~= "none" and a ~= "tanh" then
    error(fmt("nn.GELU: approximate must be 'none' or 'tanh', got '%s'", tostring(a)), 0)
  end
  self.approximate = a
end

function GELU:_head()
  return self.approximate == "tanh" and "nn.GELU(approximate=tanh)" or "nn.GELU"
end

function GELU:forward(x)
  check_tensor(self, x)
  if self.approximate == "tanh" then return x:gelu({approximate = "tanh"}) end
  return x:gelu()
end

-- nn.Softmax(dim): dim defaults to -1 (the last).
local Softmax = class("nn.Softmax")
nn.Softmax = Softmax

function Softmax:__init(dim)
  self.dim = dim == nil and -1 or check_int(dim, "nn.Softmax: dim", -math.maxinteger)
end

function Softmax:_head() return fmt("nn.Softmax(dim=%d)", self.dim) end

function Softmax:forward(x)
  check_tensor(self, x)
  return x:softmax(self.dim)
end

-- Normalized shape from d or {d1, d2, ...}.
local function norm_shape(d, what)
  local shape = type(d) == "table" and d or {d}
  if #shape == 0 then error(what .. ": expected a size or a non-empty table of sizes", 0) end
  local out = {}
  for i, s in ipairs(shape) do out[i] = check_int(s, what) end
  return out
end

local function check_trailing(m, x, shape)
  local n, k = x:dim(), #shape
  local ok = n >= k
  for i = 1, k do ok = ok and size_eq(x:size(n - k + i), shape[i]) end
  if not ok then
    m:error("input %s does not end in the normalized shape [%s]", shape_str(x), table.concat(shape, ","))
  end
end

-- nn.LayerNorm(d or shape [, {eps=, affine=}]): weight ones, bias zeros.
local LayerNorm = class("nn.LayerNorm")
nn.LayerNorm = LayerNorm

function LayerNorm:__init(d, opts)
  opts = options(opts, {"eps", "affine"}, "nn.LayerNorm")
  self.normalized_shape = norm_shape(d, "nn.LayerNorm")
  self.eps = opts.eps or 1e-5
  if opts.affine ~= false then
    self:register_parameter("weight", fl.ones(self.normalized_shape))
    self:register_parameter("bias", fl.zeros(self.normalized_shape))
  end
end

function LayerNorm:_head()
  local s = table.concat(self.normalized_shape, "x")
  if self.eps ~= 1e-5 then s = s .. ", eps=" .. self.eps end
  return "nn.LayerNorm(" .. s .. ")"
end

function LayerNorm:forward(x)
  check_tensor(self, x)
  check_trailing(self, x, self.normalized_shape)
  return x:layer_norm(self.normalized_shape, self.weight, self.bias, self.eps)
end

-- nn.RMSNorm(d or shape [, {eps=}]): weight ones; eps defaults to the
-- op's default.
local RMSNorm = class("nn.RMSNorm")
nn.RMSNorm = RMSNorm

function RMSNorm:__init(d, opts)
  opts = options(opts, {"eps"}, "nn.RMSNorm")
  self.normalized_shape = norm_shape(d, "nn.RMSNorm")
  self.eps = opts.eps
  self:register_parameter("weight", fl.ones(self.normalized_shape))
end

function RMSNorm:_head()
  local s = table.concat(self.normalized_shape, "x")
  if self.eps then s = s .. ", eps=" .. self.eps end
  return "nn.RMSNorm(" .. s .. ")"
end

function RMSNorm:forward(x)
  check_tensor(self, x)
  check_trailing(self, x, self.normalized_shape)
  return x:rms_norm(self.normalized_shape, self.weight, self.eps)
end

-- nn.Dropout(p): in training mode zeroes each element with probability p
-- and scales the rest by 1/(1-p) (inverted dropout); identity in eval.
local Dropout = class("nn.Dropout")
nn.Dropout = Dropout

function Dropout:__init(p)
  p = p == nil and 0.5 or p
  if type(p) ~= "number" or p < 0 or p > 1 then
    error(fmt("nn.Dropout: p must be a probability in [0, 1], got %s", tostring(p)), 0)
  end
  self.p = p
end

function Dropout:_head() return fmt("nn.Dropout(%g)", self.p) end

-- One dropout op: under capture it is a graph node drawing from the stream
-- at every call (a compiled model in training mode gets a new mask each
-- time), and eager and compiled draw the same mask after fl.manual_seed.
function Dropout:forward(x)
  check_tensor(self, x)
  if not self.training or self.p == 0 then return x end
  return fl.dropout(x, self.p)
end

-- nn.Embedding(n, d): weight [n, d] drawn from N(0, 1); the input holds
-- 0-based int64 indices.
local Embedding = class("nn.Embedding")
nn.Embedding = Embedding

function Embedding:__init(n, d)
  self.num_embeddings = check_int(n, "nn.Embedding: num_embeddings")
  self.embedding_dim = check_int(d, "nn.Embedding: embedding_dim")
  self:register_parameter("weight", fl.randn(self.num_embeddings, self.embedding_dim))
end

function Embedding:_head()
  return fmt("nn.Embedding(%d, %d)", self.num_embeddings, self.embedding_dim)
end

function Embedding:forward(idx)
  check_tensor(self, idx, "the indices")
  return fl.embedding(idx, self.weight)
end

-- nn.Conv2d(ci, co, k [, {stride=, padding=, dilation=, groups=, bias=}]):
-- weight [co, ci/groups, kh, kw], bias [co]; input [N, ci, H, W].
-- padding: n, {h, w} or {top, left, bottom, right}.
local Conv2d = class("nn.Conv2d")
nn.Conv2d = Conv2d

local function padding4(v, what)
  if type(v) == "table" and #v == 4 then
    for i = 1, 4 do check_int(v[i], what, 0) end
    return {v[1], v[2], v[3], v[4]}
  end
  local p = pair(v, what)
  for i = 1, 2 do check_int(p[i], what, 0) end
  return p
end

function Conv2d:__init(ci, co, k, opts)
  opts = options(opts, {"stride", "padding", "dilation", "groups", "bias"}, "nn.Conv2d")
  self.in_channels = check_int(ci, "nn.Conv2d: in_channels")
  self.out_channels = check_int(co, "nn.Conv2d: out_channels")
  self.kernel_size = pair(k, "nn.Conv2d: kernel size")
  self.stride = pair(opts.stride or 1, "nn.Conv2d: stride")
  self.padding = padding4(opts.padding or 0, "nn.Conv2d: padding")
  self.dilation = pair(opts.dilation or 1, "nn.Conv2d: dilation")
  self.groups = check_int(opts.groups or 1, "nn.Conv2d: groups", 1)
  for i = 1, 2 do
    check_int(self.kernel_size[i], "nn.Conv2d: kernel size")
    check_int(self.stride[i], "nn.Conv2d: stride")
    check_int(self.dilation[i], "nn.Conv2d: dilation", 1)
  end
  ci, co = self.in_channels, self.out_channels
  if ci % self.groups ~= 0 or co % self.groups ~= 0 then
    error(fmt("nn.Conv2d: groups=%d must divide in_channels (%d) and out_channels (%d)",
              self.groups, ci, co), 0)
  end
  local fan_in = ci // self.groups * self.kernel_size[1] * self.kernel_size[2]
  local bound = 1 / math.sqrt(fan_in)
  self:register_parameter("weight", uniform({co, ci // self.groups, self.kernel_size[1], self.kernel_size[2]}, bound))
  if opts.bias ~= false then self:register_parameter("bias", uniform({co}, bound)) end
end

-- Torch7's SpatialConvolution layout: stride and padding only when not
-- the defaults, then dilation and groups the same way.
function Conv2d:_head()
  local s = fmt("nn.Conv2d(%d -> %d, %s", self.in_channels, self.out_channels,
                pair_str(self.kernel_size, "x"))
  local st, pd = self.stride, self.padding
  local padded = false
  for i = 1, #pd do padded = padded or pd[i] ~= 0 end
  if st[1] ~= 1 or st[2] ~= 1 or padded then s = s .. ", " .. pair_str(st, ",") end
  if padded then s = s .. ", " .. table.concat(pd, ",") end
  if self.dilation[1] ~= 1 or self.dilation[2] ~= 1 then
    s = s .. ", dilation " .. pair_str(self.dilation, ",")
  end
  if self.groups ~= 1 then s = s .. ", groups " .. self.groups end
  return s .. (self.bias and ")" or ") without bias")
end

function Conv2d:forward(x)
  check_tensor(self, x)
  if x:dim() ~= 4 or not size_eq(x:size(2), self.in_channels) then
    self:error("input %s: expected [N, %d, H, W]", shape_str(x), self.in_channels)
  end
  return fl.conv2d(x, self.weight, self.bias, {stride = self.stride, padding = self.padding,
                                               dilation = self.dilation, groups = self.groups})
end

-- nn.BatchNorm2d(c [, {eps=, momentum=, affine=, track_running_stats=}]):
-- PyTorch's semantics.  In training mode the input is normalized with
-- its own per-channel mean and biased variance (over N, H and W), and the
-- running statistics move toward the batch's, the variance unbiased:
--   running = (1 - momentum) * running + momentum * batch
-- with momentum = false for the cumulative average (PyTorch's None:
-- momentum 1/num_batches_tracked).  In eval mode the running statistics
-- normalize (inference), as they always did.  Without
-- track_running_stats there are no buffers and both modes use the batch.
local BatchNorm2d = class("nn.BatchNorm2d")
nn.BatchNorm2d = BatchNorm2d

function BatchNorm2d:__init(c, opts)
  opts = options(opts, {"eps", "momentum", "affine", "track_running_stats"}, "nn.BatchNorm2d")
  self.num_features = check_int(c, "nn.BatchNorm2d: num_features")
  self.eps = opts.eps or 1e-5
  local m = opts.momentum
  if m == nil then m = 0.1 end
  if m ~= false and (type(m) ~= "number" or m < 0 or m > 1) then
    error(fmt("nn.BatchNorm2d: momentum must be a number in [0, 1] or false (the cumulative "
              .. "average), got %s", tostring(m)), 0)
  end
  self.momentum = m
  self.affine = opts.affine ~= false
  self.track_running_stats = opts.track_running_stats ~= false
  c = self.num_features
  if self.affine then
    self:register_parameter("weight", fl.ones(c))
    self:register_parameter("bias", fl.zeros(c))
  end
  if self.track_running_stats then
    self:register_buffer("running_mean", fl.zeros(c))
    self:register_buffer("running_var", fl.ones(c))
    self:register_buffer("num_batches_tracked", fl.zeros({}, {dtype = "int64"}))
  end
end

function BatchNorm2d:_head()
  local s = fmt("nn.BatchNorm2d(%d", self.num_features)
  if self.eps ~= 1e-5 then s = s .. fmt(", eps=%g", self.eps) end
  if self.momentum ~= 0.1 then s = s .. ", momentum=" .. tostring(self.momentum) end
  if not self.affine then s = s .. ", affine=false" end
  if not self.track_running_stats then s = s .. ", track_running_stats=false" end
  return s .. ")"
end

-- The running statistics moved toward the batch's, outside autograd (a
-- buffer is state, not part of the loss), in place so that whatever
-- holds the buffers (a compiled function) sees the new values.  The
-- variance that moves them is the unbiased one, computed as such rather
-- than scaled by n / (n - 1): under fl.compile the batch size then stays
-- symbolic.
function BatchNorm2d:_update_stats(x, mean)
  fl.no_grad(function()
    self.num_batches_tracked:add_(1)
    local f = self.momentum
    if f == false then f = 1 / self.num_batches_tracked:item() end
    self.running_mean:mul_(1 - f):add_(mean * f)
    self.running_var:mul_(1 - f):add_(x:var({1, 3, 4}) * f)
  end)
end

function BatchNorm2d:forward(x)
  check_tensor(self, x)
  if x:dim() ~= 4 or not size_eq(x:size(2), self.num_features) then
    self:error("input %s: expected [N, %d, H, W]", shape_str(x), self.num_features)
  end
  if not self.training and self.track_running_stats then
    return fl.batch_norm(x, self.running_mean, self.running_var, self.weight, self.bias, self.eps)
  end
  -- (a symbolic size is not asked: it would specialize the graph)
  local n, h, w = x:size(1), x:size(3), x:size(4)
  if math.type(n) and math.type(h) and math.type(w) and n * h * w <= 1 then
    self:error("expected more than 1 value per channel when training, got input %s", shape_str(x))
  end
  -- the batch's statistics, detached: with batch_stats, batch_norm's
  -- derivative carries theirs in x's gradient (two reductions, where
  -- differentiating mean and var as ops of their own takes five)
  local xd = x:detach()
  local mean = xd:mean({1, 3, 4})
  local var = xd:var({1, 3, 4}, {correction = 0})
  if self.training and self.track_running_stats then self:_update_stats(xd, mean) end
  return fl.batch_norm(x, mean, var, self.weight, self.bias, {eps = self.eps, batch_stats = true})
end

-- Pooling: nn.MaxPool2d(k [, {stride=, padding=, dilation=, ceil_mode=}]),
-- nn.AvgPool2d(k [, {stride=, padding=, ceil_mode=, count_include_pad=}]),
-- stride defaulting to k; the options are x:max_pool2d's / x:avg_pool2d's.
local function pool(name, method, extra)
  local cls = class("nn." .. name)
  local keys = {"stride", "padding", "ceil_mode"}
  for _, k in ipairs(extra) do keys[#keys + 1] = k end
  function cls:__init(k, opts)
    opts = options(opts, keys, "nn." .. name)
    self.kernel_size = pair(k, "nn." .. name .. ": kernel size")
    self.stride = pair(opts.stride or k, "nn." .. name .. ": stride")
    self.padding = padding4(opts.padding or 0, "nn." .. name .. ": padding")
    for i = 1, 2 do
      check_int(self.kernel_size[i], "nn." .. name .. ": kernel size")
      check_int(self.stride[i], "nn." .. name .. ": stride")
    end
    self.opts = {stride = self.stride, padding = self.padding}
    for _, key in ipairs(keys) do
      if key ~= "stride" and key ~= "padding" and opts[key] ~= nil then self.opts[key] = opts[key] end
    end
  end
  function cls:_head()
    local s = fmt("nn.%s(%s, %s", name, pair_str(self.kernel_size, "x"), pair_str(self.stride, ","))
    local padded = false
    for i = 1, #self.padding do padded = padded or self.padding[i] ~= 0 end
    if padded then s = s .. ", " .. table.concat(self.padding, ",") end
    for _, key in ipairs(keys) do
      local v = self.opts[key]
      if key ~= "stride" and key ~= "padding" and v ~= nil then
        s = s .. ", " .. key .. "=" .. (type(v) == "table" and pair_str(v, ",") or tostring(v))
      end
    end
    return s .. ")"
  end
  function cls:forward(x)
    check_tensor(self, x)
    return x[method](x, self.kernel_size, self.opts)
  end
  nn[name] = cls
end
pool("MaxPool2d", "max_pool2d", {"dilation"})
pool("AvgPool2d", "avg_pool2d", {"count_include_pad"})

-- nn.Flatten([start [, end]]): dims start..end (1-based, default 2..-1,
-- i.e. all but the batch dim) become one.
local Flatten = class("nn.Flatten")
nn.Flatten = Flatten

function Flatten:__init(s, e)
  self.start_dim = s or 2
  self.end_dim = e or -1
end

function Flatten:_head()
  if self.start_dim == 2 and self.end_dim == -1 then return "nn.Flatten" end
  return fmt("nn.Flatten(%d, %d)", self.start_dim, self.end_dim)
end

function Flatten:forward(x)
  check_tensor(self, x)
  local n = x:dim()
  local s = self.start_dim < 0 and n + 1 + self.start_dim or self.start_dim
  local e = self.end_dim < 0 and n + 1 + self.end_dim or self.end_dim
  if s < 1 or e > n or s > e then
    self:error("dims %d..%d out of range for a %d-d input %s", self.start_dim, self.end_dim, n, shape_str(x))
  end
  -- sizes through x:size(i), the leading one as -1 when it is left
  -- alone: under fl.compile a batch size then stays symbolic
  local shape, size = {}, 1
  for i = 1, s - 1 do shape[#shape + 1] = i == 1 and -1 or x:size(i) end
  for i = s, e do size = size * x:size(i) end
  shape[#shape + 1] = size
  for i = e + 1, n do shape[#shape + 1] = x:size(i) end
  if s == 1 then shape[1] = size end
  return x:reshape(shape)
end

-- ---------------------------------------------------------------------------
-- containers
-- ---------------------------------------------------------------------------

-- nn.Sequential(m1, m2, ...) and :add(m): runs its children in order.
-- m.modules is the Lua list (1-based); their names are "0", "1", ... as
-- in PyTorch.
local Sequential = class("nn.Sequential")
nn.Sequential = Sequential

function Sequential:__init(...)
  self.modules = {}
  for i = 1, select("#", ...) do self:add((select(i, ...))) end
end

function Sequential:add(m)
  if is_class(m) then m = m() end
  if not is_module(m) then
    error(fmt("nn.Sequential:add: expected a module, got %s",
              type(m) == "table" and "a table" or type(m)), 0)
  end
  local i = #self.modules + 1
  self.modules[i] = self:add_module(tostring(i - 1), m)
  return self
end

function Sequential:get(i) return self.modules[i] end
function Sequential.__len(self) return #self.modules end

function Sequential:forward(x)
  for _, m in ipairs(self.modules) do x = m(x) end
  return x
end

-- Torch7's exact layout: the data path, then each child numbered.
function Sequential.__tostring(self)
  local path, lines = {"[input"}, {}
  for i = 1, #self.modules do path[#path + 1] = "(" .. i .. ")" end
  path[#path + 1] = "output]"
  lines[1] = "nn.Sequential {"
  lines[2] = "  " .. table.concat(path, " -> ")
  for i, m in ipairs(self.modules) do
    lines[#lines + 1] = "  (" .. i .. "): " .. tostring(m):gsub("\n", "\n  ")
  end
  lines[#lines + 1] = "}"
  return table.concat(lines, "\n")
end

-- ---------------------------------------------------------------------------
-- attention and the transformer block
-- ---------------------------------------------------------------------------

-- The additive causal mask [T, T]: 0 where key j <= query i, -inf above
-- the diagonal, on the device of the scores it is added to.  Built from fl
-- ops so graph capture records it.
local function causal_mask(T, device)
  local on = {device = device or "cpu"}
  local i = fl.arange(T, on):reshape(T, 1)
  local j = fl.arange(T, on):reshape(1, T)
  return fl.where(j:gt(i), -math.huge, 0.0)
end
nn.causal_mask = causal_mask

-- nn.MultiheadAttention(d, heads [, {causal=, bias=}]): separate q, k, v
-- and output projections (q_proj, k_proj, v_proj, out_proj, each d -> d),
-- scaled dot-product attention per head.  forward(q [, k [, v]]) takes
-- [B, T, d] or [T, d]; k and v default to q (self-attention).
local MHA = class("nn.MultiheadAttention")
nn.MultiheadAttention = MHA

function MHA:__init(d, heads, opts)
  opts = options(opts, {"causal", "bias"}, "nn.MultiheadAttention")
  self.embed_dim = check_int(d, "nn.MultiheadAttention: d")
  self.num_heads = check_int(heads, "nn.MultiheadAttention: heads")
  d, heads = self.embed_dim, self.num_heads
  if d % heads ~= 0 then
    error(fmt("nn.MultiheadAttention: d %d is not divisible by heads %d", d, heads), 0)
  end
  self.head_dim = d // heads
  self.causal = not not opts.causal
  local lopts = {bias = opts.bias ~= false}
  for _, name in ipairs({"q_proj", "k_proj", "v_proj", "out_proj"}) do
    self:add_module(name, Linear(d, d, lopts))
  end
end

function MHA:_head()
  return fmt("nn.MultiheadAttention(%d, heads=%d%s)", self.embed_dim, self.num_heads,
             self.causal and ", causal" or "")
end

function MHA:forward(q, k, v)
  check_tensor(self, q, "the query")
  k = k or q
  v = v or k
  local d, h, hd = self.embed_dim, self.num_heads, self.head_dim
  local unbatched = q:dim() == 2
  for _, t in ipairs({q, k, v}) do
    if (t:dim() ~= 2 and t:dim() ~= 3) or not size_eq(t.shape[t:dim()], d) then
      self:error("input %s: expected [B, T, %d] or [T, %d]", shape_str(t), d, d)
    end
  end
  if unbatched then q, k, v = q:unsqueeze(1), k:unsqueeze(1), v:unsqueeze(1) end
  local B, Tq, Tk = q.shape[1], q.shape[2], k.shape[2]
  if self.causal and not size_eq(Tq, Tk) then
    self:error("causal attention needs as many queries as keys (%d vs %d)", Tq, Tk)
  end
  -- [B, T, d] -> [B, h, T, hd]
  local function heads(t, T) return t:reshape(B, T, h, hd):transpose(2, 3) end
  local qh = heads(self.q_proj(q), Tq)
  local kh = heads(self.k_proj(k), Tk)
  local vh = heads(self.v_proj(v), Tk)
  local scores = qh:matmul(kh:transpose(3, 4)) * (1 / math.sqrt(hd))
  if self.causal then scores = scores + causal_mask(Tq, scores.device) end
  local out = scores:softmax(-1):matmul(vh)            -- [B, h, Tq, hd]
  out = out:transpose(2, 3):reshape(B, Tq, d)
  out = self.out_proj(out)
  if unbatched then out = out:squeeze(1) end
  return out
end

-- nn.TransformerBlock(d, heads [, {mlp=4, causal=true, dropout=0}]): the
-- pre-LN GPT block  x + attn(ln1(x)), then  x + mlp(ln2(x)), with
-- mlp = Linear(d, 4d) -> GELU -> Linear(4d, d); dropout > 0 drops each
-- branch before its residual add (GPT-2's resid_pdrop).
local Block = class("nn.TransformerBlock")
nn.TransformerBlock = Block

function Block:__init(d, heads, opts)
  opts = options(opts, {"mlp", "causal", "dropout"}, "nn.TransformerBlock")
  self.d, self.heads = check_int(d, "nn.TransformerBlock: d"), check_int(heads, "nn.TransformerBlock: heads")
  d, heads = self.d, self.heads
  local hidden = check_int(opts.mlp or 4, "nn.TransformerBlock: mlp") * d
  self:add_module("ln1", LayerNorm(d))
  self:add_module("attn", MHA(d, heads, {causal = opts.causal ~= false}))
  self:add_module("ln2", LayerNorm(d))
  self:add_module("mlp", Sequential(Linear(d, hidden), GELU(), Linear(hidden, d)))
  if (opts.dropout or 0) > 0 then self:add_module("drop", Dropout(opts.dropout)) end
end

function Block:_head() return fmt("nn.TransformerBlock(%d, heads=%d)", self.d, self.heads) end

function Block:forward(x)
  local drop = rawget(self, "drop")
  local a = self.attn(self.ln1(x))
  if drop then a = drop(a) end
  x = x + a
  local m = self.mlp(self.ln2(x))
  if drop then m = drop(m) end
  return x + m
end

-- ---------------------------------------------------------------------------
-- ready models
-- ---------------------------------------------------------------------------

local acts = {relu = nn.ReLU, gelu = nn.GELU, silu = nn.SiLU, tanh = nn.Tanh, sigmoid = nn.Sigmoid}

-- fl.models.mlp{sizes={in, h1, ..., out}, act="relu"|"gelu"|"silu"|"tanh"|"sigmoid"}:
-- Linear layers with the activation between them (not after the last).
function models.mlp(cfg)
  cfg = options(cfg, {"sizes", "act"}, "fl.models.mlp")
  local sizes = cfg.sizes
  if type(sizes) ~= "table" or #sizes < 2 then
    error("fl.models.mlp: sizes must list at least an input and an output size", 0)
  end
  local act = acts[cfg.act or "relu"]
  if not act then
    error(fmt("fl.models.mlp: unknown act '%s' (expected relu, gelu, silu, tanh or sigmoid)",
              tostring(cfg.act)), 0)
  end
  local m = Sequential()
  for i = 1, #sizes - 1 do
    m:add(Linear(check_int(sizes[i], "fl.models.mlp: sizes"), check_int(sizes[i + 1], "fl.models.mlp: sizes")))
    if i < #sizes - 1 then m:add(act()) end
  end
  return m
end

-- The GPT-style model of fl.models.transformer.
local GPT = class("fl.models.transformer")

function GPT:__init(cfg)
  cfg = options(cfg, {"vocab", "d", "heads", "layers", "seq", "dropout"}, "fl.models.transformer")
  local what = "fl.models.transformer"
  self.vocab = check_int(cfg.vocab, what .. ": vocab")
  self.d = check_int(cfg.d, what .. ": d")
  self.heads = check_int(cfg.heads or 4, what .. ": heads")
  self.layers = check_int(cfg.layers or 2, what .. ": layers", 0)
  self.seq = check_int(cfg.seq, what .. ": seq")
  if self.d % self.heads ~= 0 then
    error(fmt("%s: d %d is not divisible by heads %d", what, self.d, self.heads), 0)
  end
  self:add_module("tok_emb", Embedding(self.vocab, self.d))
  self:add_module("pos_emb", Embedding(self.seq, self.d))
  local p = cfg.dropout or 0
  if type(p) ~= "number" or p < 0 or p >= 1 then error(fmt("%s: dropout must be in [0, 1), got %s", what, tostring(p)), 0) end
  if p > 0 then self:add_module("drop", Dropout(p)) end
  local blocks = Sequential()
  for _ = 1, self.layers do blocks:add(Block(self.d, self.heads, {dropout = p})) end
  self:add_module("blocks", blocks)
  self:add_module("ln_f", LayerNorm(self.d))
  self:add_module("head", Linear(self.d, self.vocab, {bias = false}))
end

function GPT:_head()
  return fmt("fl.models.transformer(vocab=%d, d=%d, heads=%d, layers=%d, seq=%d)",
             self.vocab, self.d, self.heads, self.layers, self.seq)
end

-- idx: int64 token ids [B, T] or [T], T <= seq; returns logits [B, T, vocab].
function GPT:forward(idx)
  check_tensor(self, idx, "the token ids")
  local n = idx:dim()
  if n ~= 1 and n ~= 2 then self:error("token ids %s: expected [B, T] or [T]", shape_str(idx)) end
  local T = idx.shape[n]
  if T > self.seq then self:error("sequence of %d tokens is longer than seq=%d", T, self.seq) end
  local x = self.tok_emb(idx) + self.pos_emb(fl.arange(T, {device = idx.device}))
  if rawget(self, "drop") then x = self.drop(x) end
  x = self.blocks(x)
  return self.head(self.ln_f(x))
end

-- fl.models.transformer{vocab=, d=, heads=, layers=, seq= [, dropout=0]}:
-- token and learned position embeddings, `layers` pre-LN blocks, a final
-- LayerNorm and a bias-free head to vocab logits; dropout > 0 after the
-- embeddings and on every residual branch, active in training mode.
function models.transformer(cfg) return GPT(cfg) end

-- fl.models.cnn{channels={c_in, c1, c2, ...}, classes=, input=H or {H, W}}:
-- per block Conv2d(3x3, padding 1) -> BatchNorm2d -> ReLU -> MaxPool2d(2),
-- then Flatten and Linear to the classes.  One Sequential, so names read
-- "0.weight", "1.running_mean", ...
function models.cnn(cfg)
  cfg = options(cfg, {"channels", "classes", "input"}, "fl.models.cnn")
  local ch = cfg.channels
  if type(ch) ~= "table" or #ch < 2 then
    error("fl.models.cnn: channels must list the input channels and at least one block's", 0)
  end
  local hw = pair(cfg.input or 32, "fl.models.cnn: input")
  local h, w = check_int(hw[1], "fl.models.cnn: input"), check_int(hw[2], "fl.models.cnn: input")
  local classes = check_int(cfg.classes or 10, "fl.models.cnn: classes")
  local m = Sequential()
  for i = 1, #ch - 1 do
    m:add(Conv2d(check_int(ch[i], "fl.models.cnn: channels"), check_int(ch[i + 1], "fl.models.cnn: channels"),
                 3, {padding = 1}))
    m:add(BatchNorm2d(ch[i + 1]))
    m:add(nn.ReLU())
    m:add(nn.MaxPool2d(2))
    h, w = h // 2, w // 2
    if h < 1 or w < 1 then
      error(fmt("fl.models.cnn: input %s is too small for %d pooling blocks", pair_str(hw, "x"), #ch - 1), 0)
    end
  end
  m:add(Flatten())
  m:add(Linear(ch[#ch] * h * w, classes))
  return m
end

-- The helpers loss.lua, optim.lua and checkpoint.lua share with this file.
nn._util = {shape_str = shape_str, same_shape = same_shape, options = options}

return nn
