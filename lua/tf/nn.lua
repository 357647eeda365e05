--- tf.nn: modules in the manner of torch.nn, built from tf's differentiable ops.
--
--   local Toy = tf.nn.Module:extend("ToyModel")
--   function Toy:init(d_in, d_out)
--     self:add("fc1", tf.nn.Linear(d_in, 10, {bias = false}))
--     self:add("ln", tf.nn.LayerNorm(10))
--     self:add("fc2", tf.nn.Linear(10, d_out, {bias = false}))
--   end
--   function Toy:forward(x) return self.fc2(self.ln(self.fc1(x):relu())) end
--   local m = Toy(8, 4)
--   for name, p in m:named_parameters() do print(name, p.shape) end
--
-- Children and parameters are registered with self:add(name, value) so
-- that their order (and the parameter names, "fc1.weight") is stable.
local nn = {}
local check = require "tf.check"

local Module = {}
Module.__index = Module
Module.__name = "Module"
nn.Module = Module

--- A subclass: Class(...) creates an instance and calls Class.init(self, ...).
function Module:extend(name)
  local cls = setmetatable({}, { __index = self, __call = function(c, ...) return c:new(...) end })
  cls.__index = cls
  cls.__name = name
  cls.__call = function(m, ...) return m:forward(...) end
  cls.__tostring = Module.__tostring
  return cls
end

--- What init allocates is tagged "parameter" in memory snapshots.
function Module:new(...)
  local m = setmetatable({ _names = {}, _items = {} }, self)
  if m.init then tf.mem.scope("parameter", self.__name, m.init, m, ...) end
  return m
end

--- Registers a child module or a parameter (a tensor) under name.
function Module:add(name, value)
  if rawget(self, "_items")[name] == nil then table.insert(self._names, name) end
  self._items[name] = value
  rawset(self, name, value)
  return value
end

--- Iterates (name, tensor) over every parameter, depth first, in registration order.
function Module:named_parameters(prefix)
  local out = {}
  local function walk(m, pre)
    for _, name in ipairs(m._names) do
      local v = m._items[name]
      if tf.is_tensor(v) then
        out[#out + 1] = { pre .. name, v }
      else
        walk(v, pre .. name .. ".")
      end
    end
  end
  walk(self, prefix or "")
  local i = 0
  return function()
    i = i + 1
    if out[i] then return out[i][1], out[i][2] end
  end
end

--- The parameters as a list of tensors.
function Module:parameters()
  local list = {}
  for _, p in self:named_parameters() do list[#list + 1] = p end
  return list
end

--- The parameters as a table name -> tensor (a state dict).
function Module:state_dict()
  local t = {}
  for name, p in self:named_parameters() do t[name] = p end
  return t
end

function Module:zero_grad()
  for _, p in ipairs(self:parameters()) do p:zero_grad() end
end

--- Number of parameter elements.
function Module:num_parameters()
  local n = 0
  for _, p in ipairs(self:parameters()) do n = n + p:numel() end
  return n
end

function Module:forward()
  error(self.__name .. ": forward is not defined", 2)
end

function Module:__tostring()
  local lines = { self.__name .. "(" }
  for _, name in ipairs(self._names) do
    local v = self._items[name]
    local text = tf.is_tensor(v) and string.format("tensor%s %s", tostring(v.shape), v.dtype) or tostring(v)
    lines[#lines + 1] = "  (" .. name .. "): " .. text:gsub("\n", "\n  ")
  end
  return table.concat(lines, "\n") .. (#self._names > 0 and "\n)" or ")")
end

-- A parameter tensor on the options' device and dtype, requiring grad.
local function param(t) return t:requires_grad(true) end

local function tensor_opts(opts)
  return { device = opts and opts.device, dtype = opts and opts.dtype or "f32" }
end

--- Initialisers (DESIGN's): truncated normal cut at 3 standard deviations.
nn.init = {}
function nn.init.trunc_normal(shape, std, opts)
  check.arg(shape, "tf.nn.init.trunc_normal", "the shape (a table of sizes)", "table")
  check.arg(std, "tf.nn.init.trunc_normal", "std", "number")
  return tf.trunc_normal(shape, std, 3, tensor_opts(check.keys(opts, "tf.nn.init.trunc_normal", { "device", "dtype" })))
end

--- Linear(in, out, {bias = true, device, dtype}): y = x W^T + b, W of shape
-- (out, in) initialised with std sqrt(2 / (in + out)), b zeros.
nn.Linear = Module:extend("Linear")
function nn.Linear:init(d_in, d_out, opts)
  opts = check.keys(opts, "tf.nn.Linear", { "bias", "device", "dtype" })
  check.arg(d_in, "tf.nn.Linear", "in_features (argument #1)", "integer")
  check.arg(d_out, "tf.nn.Linear", "out_features (argument #2)", "integer")
  self.in_features, self.out_features = d_in, d_out
  self:add("weight", param(nn.init.trunc_normal({ d_out, d_in }, math.sqrt(2 / (d_in + d_out)), tensor_opts(opts))))
  if opts.bias ~= false then self:add("bias", param(tf.zeros({ d_out }, tensor_opts(opts)))) end
end
-- The input of a built-in module's forward: a tensor, or an error at the caller's line.
local function input(x, name) return check.arg(x, "tf.nn." .. name, "the input", "tensor") end

function nn.Linear:forward(x) return tf.linear(input(x, "Linear"), self.weight, self.bias) end
function nn.Linear:__tostring()
  return string.format("Linear(%d, %d, bias=%s)", self.in_features, self.out_features, tostring(self.bias ~= nil))
end

--- LayerNorm(d, {eps = 1e-5, affine = true}) over the last dim.
nn.LayerNorm = Module:extend("LayerNorm")
function nn.LayerNorm:init(d, opts)
  opts = check.keys(opts, "tf.nn.LayerNorm", { "eps", "affine", "device", "dtype" })
  check.arg(d, "tf.nn.LayerNorm", "the size (argument #1)", "integer")
  check.arg(opts.eps, "tf.nn.LayerNorm", "eps", "number", true)
  self.eps = opts.eps or 1e-5
  if opts.affine ~= false then
    self:add("weight", param(tf.ones({ d }, tensor_opts(opts))))
    self:add("bias", param(tf.zeros({ d }, tensor_opts(opts))))
  end
end
function nn.LayerNorm:forward(x) return tf.layer_norm(input(x, "LayerNorm"), self.weight, self.bias, self.eps) end

--- RMSNorm(d, {eps = 1e-5}): statistics in f32, a learned gain (ones).
nn.RMSNorm = Module:extend("RMSNorm")
function nn.RMSNorm:init(d, opts)
  opts = check.keys(opts, "tf.nn.RMSNorm", { "eps", "device", "dtype" })
  check.arg(d, "tf.nn.RMSNorm", "the size (argument #1)", "integer")
  check.arg(opts.eps, "tf.nn.RMSNorm", "eps", "number", true)
  self.eps = opts.eps or 1e-5
  self:add("weight", param(tf.ones({ d }, tensor_opts(opts))))
end
function nn.RMSNorm:forward(x) return tf.rms_norm(input(x, "RMSNorm"), self.weight, self.eps) end

--- Embedding(num, dim): rows initialised with std 1, cut at 3.
nn.Embedding = Module:extend("Embedding")
function nn.Embedding:init(num, dim, opts)
  opts = check.keys(opts, "tf.nn.Embedding", { "device", "dtype" })
  check.arg(num, "tf.nn.Embedding", "num_embeddings (argument #1)", "integer")
  check.arg(dim, "tf.nn.Embedding", "embedding_dim (argument #2)", "integer")
  self:add("weight", param(nn.init.trunc_normal({ num, dim }, 1.0, opts)))
end
function nn.Embedding:forward(ids) return tf.embedding(self.weight, input(ids, "Embedding")) end

--- Activations as modules.
for name, fn in pairs({ ReLU = "relu", SiLU = "silu", GELU = "gelu", Tanh = "tanh", Sigmoid = "sigmoid" }) do
  nn[name] = Module:extend(name)
  nn[name].forward = function(_, x) return input(x, name)[fn](x) end
end

--- Sequential(m1, m2, ...): children named "0", "1", ... applied in order.
nn.Sequential = Module:extend("Sequential")
function nn.Sequential:init(...)
  for i, m in ipairs({ ... }) do
    local mt = getmetatable(m)
    if type(m) ~= "function" and not (type(m) == "table" and type(mt) == "table" and mt.__call) then
      error(string.format("tf.nn.Sequential: argument #%d must be a module (or a function), not %s", i,
        check.what_is(m)), 2)
    end
    self:add(tostring(i - 1), m)
  end
end
function nn.Sequential:forward(x)
  for _, name in ipairs(self._names) do x = self._items[name](x) end
  return x
end

return nn
