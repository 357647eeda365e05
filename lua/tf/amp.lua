--- tf.amp: loss scaling for f16 training (torch.amp.GradScaler's algorithm).
--
--   local scaler = tf.amp.GradScaler()
--   local loss = tf.autocast("f16", function() return model(x):cross_entropy(y) end)
--   scaler:scale(loss):backward()
--   scaler:step(opt)     -- unscales the gradients; skips the step on inf/NaN
--   scaler:update()      -- halves the scale after a skip, doubles it after
--                        -- growth_interval clean steps
local amp = {}
local check = require "tf.check"

local GradScaler = {}
GradScaler.__index = GradScaler

function amp.GradScaler(opts)
  opts = check.keys(opts, "tf.amp.GradScaler", { "init_scale", "growth_factor", "backoff_factor", "growth_interval" })
  local s = setmetatable({
    scale_value = (opts.init_scale or 65536) + 0.0,
    growth_factor = opts.growth_factor or 2.0,
    backoff_factor = opts.backoff_factor or 0.5,
    growth_interval = opts.growth_interval or 2000,
    clean_steps = 0,
    found_inf = false,
    unscaled = false,
  }, GradScaler)
  if not (s.growth_factor > 1 and s.backoff_factor > 0 and s.backoff_factor < 1 and s.growth_interval >= 1) then
    error("tf.amp.GradScaler: need growth_factor > 1, 0 < backoff_factor < 1, growth_interval >= 1", 2)
  end
  return s
end

--- loss * scale, so that small f16 gradients do not underflow.
function GradScaler:scale(loss)
  return loss * self.scale_value
end

--- Divides every gradient by the scale (once per step) and notes whether any is inf or NaN.
function GradScaler:unscale(opt)
  if self.unscaled then return end
  local inv = 1.0 / self.scale_value
  tf.no_grad(function()
    for _, p in ipairs(opt.params) do
      local g = p.grad
      if g then
        local worst = g:abs():max():item()
        if worst ~= worst or worst == math.huge then self.found_inf = true end
        g:copy_(g * inv)
      end
    end
  end)
  self.unscaled = true
end

--- Unscales and steps, unless a gradient was inf or NaN; returns whether it stepped.
function GradScaler:step(opt)
  self:unscale(opt)
  if self.found_inf then return false end
  opt:step()
  return true
end

--- Adjusts the scale for the next iteration.
function GradScaler:update()
  if self.found_inf then
    self.scale_value = self.scale_value * self.backoff_factor
    self.clean_steps = 0
  else
    self.clean_steps = self.clean_steps + 1
    if self.clean_steps >= self.growth_interval then
      self.scale_value = self.scale_value * self.growth_factor
      self.clean_steps = 0
    end
  end
  self.found_inf, self.unscaled = false, false
end

function GradScaler:get_scale() return self.scale_value end

return amp
