--- tf.optim: optimizers over lists of parameters, as torch.optim.
--
--   local opt = tf.optim.AdamW(model, {lr = 1e-3, weight_decay = 0.01})
--   loss:backward(); opt:step(); opt:zero_grad()
--
-- `params` is a module (its parameters()), a list of tensors, or a table
-- name -> tensor. Parameters without a gradient are skipped by step().
-- Both optimizers take `schedule` (the learning rate as a function of the
-- step, tf.optim.schedule) and `max_norm` (global gradient-norm clipping
-- before each step, tf.optim.clip_grad_norm).
local optim = {}
local check = require "tf.check"

local function param_list(params, fname)
  fname = fname or "tf.optim"
  if type(params) ~= "table" then error(fname .. ": expects a module or a table of parameters", 3) end
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
    if not tf.is_tensor(p) then error(fname .. ": parameter " .. i .. " is not a tensor", 3) end
  end
  return list
end
optim._param_list = function(params, fname) return param_list(params, fname) end

local function check_number(opts, key, default, lo)
  local v = opts[key]
  if v == nil then v = default end
  if type(v) ~= "number" or v < lo then
    error(string.format("tf.optim: %s must be a number >= %g", key, lo), 4)
  end
  return v
end

-- ---- learning-rate schedules ------------------------------------------------

--- tf.optim.schedule: learning rates as functions of the step t (0 for the
-- first step, as CS336's training loop counts its iterations). A schedule
-- is called, s(t), or asked, s:lr(t); s.kind names it and s.options holds
-- its options.
optim.schedule = {}
local Schedule = {}
Schedule.__index = Schedule
Schedule.__call = function(s, t) return s:lr(t) end
Schedule.__tostring = function(s)
  local parts = {}
  for _, k in ipairs(s._keys) do parts[#parts + 1] = string.format("%s = %s", k, tostring(s.options[k])) end
  return "tf.optim.schedule." .. s.kind .. "{" .. table.concat(parts, ", ") .. "}"
end

function Schedule:lr(t)
  if type(t) ~= "number" or not (t >= 0) or t == math.huge then
    error("tf.optim.schedule." .. self.kind .. ": the step must be a finite number >= 0, not " .. tostring(t), 2)
  end
  return self._lr(self.options, t)
end

-- The options of schedule `kind`, every key required: rates numbers >= 0
-- (the minimum at most the maximum), step counts integers >= 0.
local function schedule_opts(kind, opts, rates, steps)
  local fname = "tf.optim.schedule." .. kind
  local keys = {}
  for _, k in ipairs(rates) do keys[#keys + 1] = k end
  for _, k in ipairs(steps) do keys[#keys + 1] = k end
  check.arg(opts, fname, "the options", "table")
  opts = check.keys(opts, fname, keys)
  local o = {}
  local s = setmetatable({ kind = kind, _keys = keys, options = o }, Schedule)
  for _, k in ipairs(rates) do
    local v = opts[k]
    if type(v) ~= "number" or not (v >= 0) or v == math.huge then
      error(string.format("%s: %s must be a finite number >= 0, not %s", fname, k, tostring(v)), 3)
    end
    o[k] = v
  end
  for _, k in ipairs(steps) do
    local v = opts[k]
    if math.type(v) ~= "integer" or v < 0 then
      error(string.format("%s: %s must be an integer number of steps >= 0, not %s", fname, k, tostring(v)), 3)
    end
    o[k] = v
  end
  if o.min_lr and o.min_lr > o.max_lr then
    error(string.format("%s: min_lr (%g) must not be above max_lr (%g)", fname, o.min_lr, o.max_lr), 3)
  end
  return s, o
end

--- constant{lr}: lr at every step.
function optim.schedule.constant(opts)
  local s = schedule_opts("constant", opts, { "lr" }, {})
  s._lr = function(o) return o.lr end
  return s
end

-- cosine and linear: a linear warm-up from 0 to max_lr over `warmup`
-- steps, then decay(options, progress) from max_lr at warmup (progress 0)
-- to min_lr at options[last] (progress 1), min_lr after.
local function warm_then(kind, opts, last, decay)
  local s, o = schedule_opts(kind, opts, { "max_lr", "min_lr" }, { "warmup", last })
  if o[last] <= o.warmup then
    error(string.format("tf.optim.schedule.%s: %s (%d) must be more steps than warmup (%d)", kind, last, o[last],
      o.warmup), 3)
  end
  s._lr = function(c, t)
    if t < c.warmup then return t / c.warmup * c.max_lr end
    if t > c[last] then return c.min_lr end
    return decay(c, (t - c.warmup) / (c[last] - c.warmup))
  end
  return s
end

--- cosine{max_lr, min_lr, warmup, cycle}: CS336's lr_cosine_schedule(t,
-- alpha_max, alpha_min, T_w, T_c): t / T_w * max_lr while t < T_w; then
-- min_lr + (1 + cos((t - T_w) / (T_c - T_w) pi)) / 2 * (max_lr - min_lr)
-- up to T_c; min_lr after. cycle > warmup.
function optim.schedule.cosine(opts)
  return warm_then("cosine", opts, "cycle", function(c, progress)
    return c.min_lr + 0.5 * (1 + math.cos(progress * math.pi)) * (c.max_lr - c.min_lr)
  end)
end

--- linear{max_lr, min_lr, warmup, total}: the same warm-up, then a straight
-- line from max_lr at warmup to min_lr at total, min_lr after. total > warmup.
function optim.schedule.linear(opts)
  return warm_then("linear", opts, "total", function(c, progress) return c.max_lr + progress * (c.min_lr - c.max_lr) end)
end

--- Whether v is a schedule (one of tf.optim.schedule's, or any function t -> lr).
function optim.is_schedule(v) return type(v) == "function" or getmetatable(v) == Schedule end

-- ---- global gradient-norm clipping -------------------------------------------

local function check_max_norm(fname, v, level)
  if type(v) ~= "number" or not (v > 0) then
    error(string.format("%s: max_norm must be a number > 0 (math.huge measures without clipping), not %s", fname,
      tostring(v)), level + 1)
  end
end

--- clip_grad_norm(params, max_norm) -> the total L2 norm of the gradients
-- before clipping (a 0-dim f32 tensor on their device; nothing waits for
-- it), as torch.nn.utils.clip_grad_norm_; where it is above max_norm,
-- every gradient is multiplied by max_norm / (norm + 1e-6) in place (CS336's
-- gradient_clipping). Squares summed in f64. Parameters without a gradient
-- are left out; with none at all the norm is 0 (on the CPU).
function optim.clip_grad_norm(params, max_norm)
  local list = optim._param_list(params, "tf.optim.clip_grad_norm")
  check_max_norm("tf.optim.clip_grad_norm", max_norm, 2)
  return tf.no_grad(function()
    local total
    for _, p in ipairs(list) do
      local g = p.grad
      if g then
        local sq = g:to("f64"):square():sum()
        total = total and total + sq or sq
      end
    end
    if not total then return tf.zeros({}, { dtype = "f32" }) end
    local norm = total:sqrt()
    local scale = tf.masked_fill(max_norm / (norm + 1e-6), tf.le(norm, max_norm), 1.0):to("f32")
    for _, p in ipairs(list) do
      local g = p.grad
      if g then g:copy_(g * scale:to(g.dtype)) end
    end
    return norm:to("f32")
  end)
end

-- ---- optimizers --------------------------------------------------------------------

local Optimizer = {}
Optimizer.__index = Optimizer

function Optimizer:zero_grad()
  for _, p in ipairs(self.params) do p:zero_grad() end
end

--- The learning rate of the next step (the schedule's at self.t steps taken).
function Optimizer:next_lr()
  if self.schedule then return self.schedule(self.t) end
  return self.lr
end

-- schedule and max_norm of an optimizer's options (fname names it; errors
-- at level of _schedule_opts's caller); lr is the schedule's (and may not be
-- given beside it).
function optim._schedule_opts(self, opts, fname, level)
  level = (level or 2) + 1
  if opts.schedule ~= nil then
    if not optim.is_schedule(opts.schedule) then
      error(fname .. ": schedule must be a tf.optim.schedule or a function of the step, not " ..
        check.what_is(opts.schedule), level)
    end
    if opts.lr ~= nil then error(fname .. ": give lr or schedule, not both (the schedule sets the rate)", level) end
    self.schedule = opts.schedule
  end
  if opts.max_norm ~= nil then check_max_norm(fname, opts.max_norm, level) end
  self.max_norm = opts.max_norm
end

-- Clipping (when asked) and the step's learning rate, before an update;
-- the step count moves on. Returns the rate.
function Optimizer:_begin_step()
  if self.max_norm then self.grad_norm = optim.clip_grad_norm(self.params, self.max_norm) end
  local lr = self:next_lr()
  if type(lr) ~= "number" or not (lr >= 0) then
    error("tf.optim: the schedule gave " .. tostring(lr) .. " at step " .. self.t .. " (a learning rate >= 0)", 3)
  end
  self.t = self.t + 1
  self.lr = lr
  return lr
end

--- SGD(params, {lr = 1e-3, momentum = 0, weight_decay = 0, schedule, max_norm}): p -= lr * (g + wd p), with momentum buffers.
function optim.SGD(params, opts)
  opts = check.keys(opts, "tf.optim.SGD", { "lr", "momentum", "weight_decay", "schedule", "max_norm" })
  local self = setmetatable({ params = param_list(params), state = {}, t = 0 }, Optimizer)
  optim._schedule_opts(self, opts, "tf.optim.SGD")
  self.lr = check_number(opts, "lr", 1e-3, 0)
  self.momentum = check_number(opts, "momentum", 0, 0)
  self.weight_decay = check_number(opts, "weight_decay", 0, 0)
  self.step = function(o)
    local lr = o:_begin_step()
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
          p:copy_(p - g * lr)
        end
      end
    end)
  end
  return self
end

--- AdamW(params, {lr = 1e-3, betas = {0.9, 0.999}, eps = 1e-8, weight_decay = 0.01, schedule, max_norm}):
-- torch.optim.AdamW (decoupled weight decay, bias-corrected moments), one
-- fused kernel per parameter tensor; moments kept in f32 (f64 for f64).
function optim.AdamW(params, opts)
  opts = check.keys(opts, "tf.optim.AdamW", { "lr", "betas", "eps", "weight_decay", "schedule", "max_norm" })
  local self = setmetatable({ params = param_list(params), state = {}, t = 0 }, Optimizer)
  optim._schedule_opts(self, opts, "tf.optim.AdamW")
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
    local lr = o:_begin_step()
    local args = { lr = lr, beta1 = o.beta1, beta2 = o.beta2, eps = o.eps, weight_decay = o.weight_decay, step = o.t }
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
