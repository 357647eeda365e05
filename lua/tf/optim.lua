--- tf.optim: optimizers over lists of parameters, as torch.optim.
--
--   local opt = tf.optim.AdamW(model, {lr = 1e-3, weight_decay = 0.01})
--   loss:backward(); opt:step(); opt:zero_grad()
--
-- `params` is a module (its parameters()), a list of tensors, or a table
-- name -> tensor. Parameters without a gradient are skipped by step().
local optim = {}
local check = require "tf.check"

local function param_list(params)
  if type(params) ~= "table" then error("tf.optim: expects a module or a table of parameters", 3) end
  if params.parameters then return params:parameters() end
  local list = {}
  for _, p in ipairs(params) do list[#list + 1] = p end
  if #list == 0 then
    local names = {}
    for name in pairs(params) do names[#names + 1] = name end
    table.sort(names)
    for _, name in ipairs(names) do list[#list + 1] = params[name] end
  end
  for i, p in ipairs(list) do
    if not tf.is_tensor(p) then error("tf.optim: parameter " .. i .. " is not a tensor", 3) end
  end
  return list
end

local function check_number(opts, key, default, lo)
  local v = opts[key]
  if v == nil then v = default end
  if type(v) ~= "number" or v < lo then
    error(string.format("tf.optim: %s must be a number >= %g", key, lo), 4)
  end
  return v
end

local Optimizer = {}
Optimizer.__index = Optimizer

function Optimizer:zero_grad()
  for _, p in ipairs(self.params) do p:zero_grad() end
end

--- SGD(params, {lr = 1e-3, momentum = 0, weight_decay = 0}): p -= lr * (g + wd p), with momentum buffers.
function optim.SGD(params, opts)
  opts = check.keys(opts, "tf.optim.SGD", { "lr", "momentum", "weight_decay" })
  local self = setmetatable({ params = param_list(params), state = {} }, Optimizer)
  self.lr = check_number(opts, "lr", 1e-3, 0)
  self.momentum = check_number(opts, "momentum", 0, 0)
  self.weight_decay = check_number(opts, "weight_decay", 0, 0)
  self.step = function(o)
    tf.no_grad(function()
      for i, p in ipairs(o.params) do
        local g = p.grad
        if g then
          if o.weight_decay ~= 0 then g = g + p * o.weight_decay end
          if o.momentum ~= 0 then
            local buf = o.state[i]
            if buf then buf:copy_(buf * o.momentum + g) else buf = tf.mem.scope("optimizer state", "SGD", g.clone, g) end
            o.state[i] = buf
            g = buf
          end
          p:copy_(p - g * o.lr)
        end
      end
    end)
  end
  return self
end

--- AdamW(params, {lr = 1e-3, betas = {0.9, 0.999}, eps = 1e-8, weight_decay = 0.01}):
-- torch.optim.AdamW (decoupled weight decay, bias-corrected moments), one
-- fused kernel per parameter tensor; moments kept in f32 (f64 for f64).
function optim.AdamW(params, opts)
  opts = check.keys(opts, "tf.optim.AdamW", { "lr", "betas", "eps", "weight_decay" })
  local self = setmetatable({ params = param_list(params), state = {}, t = 0 }, Optimizer)
  self.lr = check_number(opts, "lr", 1e-3, 0)
  local betas = opts.betas or { 0.9, 0.999 }
  self.beta1, self.beta2 = betas[1], betas[2]
  if type(self.beta1) ~= "number" or type(self.beta2) ~= "number" or self.beta1 < 0 or self.beta1 >= 1 or
      self.beta2 < 0 or self.beta2 >= 1 then
    error("tf.optim.AdamW: betas must be two numbers in [0, 1)", 2)
  end
  self.eps = check_number(opts, "eps", 1e-8, 0)
  self.weight_decay = check_number(opts, "weight_decay", 0.01, 0)
  self.step = function(o)
    o.t = o.t + 1
    local args = { lr = o.lr, beta1 = o.beta1, beta2 = o.beta2, eps = o.eps, weight_decay = o.weight_decay, step = o.t }
    for i, p in ipairs(o.params) do
      if p.grad then
        local s = o.state[i]
        if not s then
          local moment = { device = p.device, dtype = p.dtype == "f64" and "f64" or "f32" }
          local _ <close> = tf.mem.scope("optimizer state", "AdamW")
          s = { m = tf.zeros(p:size(), moment), v = tf.zeros(p:size(), moment) }
          o.state[i] = s
        end
        tf._adamw_step(p, p.grad, s.m, s.v, args)
      end
    end
  end
  return self
end

return optim
