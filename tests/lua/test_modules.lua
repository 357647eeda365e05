-- tf.nn modules, tf.optim optimizers and tf.amp.GradScaler on the default device.
local T = require "harness"
tf.seed(T.fresh_seed())

T.test("modules: parameters, names, init, forward", function()
  local Toy = tf.nn.Module:extend("ToyModel")
  function Toy:init(d_in, d_out)
    self:add("fc1", tf.nn.Linear(d_in, 10, { bias = false }))
    self:add("ln", tf.nn.LayerNorm(10))
    self:add("fc2", tf.nn.Linear(10, d_out, { bias = false }))
  end
  function Toy:forward(x) return self.fc2(self.ln(self.fc1(x):relu())) end
  local m = Toy(20, 5)
  local names = {}
  for name, p in m:named_parameters() do
    names[#names + 1] = name
    T.eq(p:requires_grad(), true)
    T.eq(p.dtype, "f32")
  end
  T.eq(names, { "fc1.weight", "ln.weight", "ln.bias", "fc2.weight" })
  T.eq(m:num_parameters(), 200 + 20 + 50)
  T.eq(tostring(m(tf.randn(8, 20)).shape), "(8, 5)")
  T.ok(tostring(m):find("Linear(20, 10, bias=false)", 1, true), tostring(m))
  T.eq(m:state_dict()["ln.bias"]:tolist(), { 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0 })
  -- truncated-normal init: std sqrt(2 / (in + out)), cut at 3 std
  local big = tf.nn.Linear(512, 1024)
  local std = math.sqrt(2 / (512 + 1024))
  local w = big.weight
  T.near((w * w):mean():item(), std * std * 0.9733, 0.03) -- variance of a normal cut at 3 std
  T.ok(w:abs():max():item() <= 3 * std * (1 + 1e-6))
  T.eq(big.bias:abs():max():item(), 0.0)
  local e = tf.nn.Embedding(100, 8)
  T.eq(tostring(e(tf.tensor({ 1, 2, 3 })).shape), "(3, 8)")
  local seq = tf.nn.Sequential(tf.nn.Linear(4, 8), tf.nn.ReLU(), tf.nn.Linear(8, 2))
  T.eq(tostring(seq(tf.randn(3, 4)).shape), "(3, 2)")
  local seq_names = {}
  for name in seq:named_parameters() do seq_names[#seq_names + 1] = name end
  T.eq(seq_names, { "0.weight", "0.bias", "2.weight", "2.bias" })
  T.raises(function() tf.nn.Module:new():forward() end, "forward is not defined")
end)

-- torch.optim.AdamW's update, written out in Lua on plain numbers.
local function adamw_reference(p, grads, lr, b1, b2, eps, wd)
  local m, v = {}, {}
  for i = 1, #p do m[i], v[i] = 0, 0 end
  for t, g in ipairs(grads) do
    for i = 1, #p do
      p[i] = p[i] - lr * wd * p[i]
      m[i] = b1 * m[i] + (1 - b1) * g[i]
      v[i] = b2 * v[i] + (1 - b2) * g[i] * g[i]
      local mh, vh = m[i] / (1 - b1 ^ t), v[i] / (1 - b2 ^ t)
      p[i] = p[i] - lr * mh / (math.sqrt(vh) + eps)
    end
  end
  return p
end

T.test("AdamW follows torch.optim.AdamW", function()
  for _, dtype in ipairs({ "f32", "f64" }) do
    local p = tf.randn(7, { dtype = dtype }):requires_grad(true)
    local start = p:tolist()
    local opt = tf.optim.AdamW({ p }, { lr = 0.01, betas = { 0.8, 0.95 }, eps = 1e-6, weight_decay = 0.1 })
    local grads = {}
    for step = 1, 4 do
      local g = tf.randn(7, { dtype = dtype })
      grads[step] = g:tolist()
      p.grad = g
      opt:step()
    end
    local expect = adamw_reference(start, grads, 0.01, 0.8, 0.95, 1e-6, 0.1)
    T.near(p, expect, dtype == "f64" and 1e-12 or 1e-6, 1e-7, "AdamW " .. dtype)
    opt:zero_grad()
    T.eq(p.grad, nil)
  end
  local q = tf.ones(3):requires_grad(true)
  local defaults = tf.optim.AdamW({ q })
  T.eq({ defaults.lr, defaults.beta1, defaults.beta2, defaults.eps, defaults.weight_decay }, { 1e-3, 0.9, 0.999, 1e-8, 0.01 })
  defaults:step() -- no gradient: nothing happens
  T.eq(q:tolist(), { 1.0, 1.0, 1.0 })
  T.raises(function() tf.optim.AdamW({ q }, { betas = { 1.5, 0.9 } }) end, "betas must be two numbers")
  T.raises(function() tf.optim.AdamW({ q }, { lr = -1 }) end, "lr must be a number >= 0")
  T.raises(function() tf.optim.AdamW(5) end, "expects a module or a table of parameters")
end)

T.test("SGD with momentum and weight decay", function()
  local p = tf.tensor({ 1.0, -2.0 }):requires_grad(true)
  local opt = tf.optim.SGD({ p }, { lr = 0.1, momentum = 0.9, weight_decay = 0.5 })
  p.grad = tf.tensor({ 1.0, 1.0 })
  opt:step() -- buf = g + wd p = (1.5, 0); p -= 0.1 buf
  T.near(p, { 0.85, -2.0 }, 1e-6)
  opt:step() -- g' = (1, 1) + 0.5 p = (1.425, 0); buf = 0.9 (1.5, 0) + g' = (2.775, 0)
  T.near(p, { 0.85 - 0.2775, -2.0 }, 1e-6)
end)

T.test("training a model lowers its loss", function()
  local model = tf.nn.Sequential(tf.nn.Linear(16, 32), tf.nn.GELU(), tf.nn.Linear(32, 4))
  local x, y = tf.randn(64, 16), tf.randint(0, 4, { 64 })
  local opt = tf.optim.AdamW(model, { lr = 1e-2, weight_decay = 0 })
  local first, last
  for step = 1, 60 do
    local loss = tf.cross_entropy(model(x), y)
    if step == 1 then first = loss:item() end
    last = loss:item()
    loss:backward()
    opt:step()
    opt:zero_grad()
  end
  T.ok(last < first * 0.5, string.format("loss %.3f -> %.3f", first, last))
end)

T.test("GradScaler: scaling, skipping on inf, backoff and growth", function()
  local p = tf.ones(2):requires_grad(true)
  local opt = tf.optim.SGD({ p }, { lr = 1.0 })
  local scaler = tf.amp.GradScaler({ init_scale = 8, growth_interval = 2 })
  scaler:scale((p * 3):sum()):backward()
  T.eq(p.grad:tolist(), { 24.0, 24.0 })
  T.eq(scaler:step(opt), true)
  T.eq(p.grad:tolist(), { 3.0, 3.0 }, "unscaled")
  T.eq(p:tolist(), { -2.0, -2.0 })
  scaler:update()
  T.eq(scaler:get_scale(), 8.0)
  opt:zero_grad()
  scaler:scale((p * 1):sum()):backward()
  scaler:step(opt)
  scaler:update()
  T.eq(scaler:get_scale(), 16.0, "doubled after growth_interval clean steps")
  opt:zero_grad()
  p.grad = tf.tensor({ math.huge, 1 })
  T.eq(scaler:step(opt), false, "inf gradients skip the step")
  T.eq(p:tolist(), { -3.0, -3.0 })
  scaler:update()
  T.eq(scaler:get_scale(), 8.0, "halved after an overflow")
  T.raises(function() tf.amp.GradScaler({ growth_factor = 0.5 }) end, "growth_factor > 1")
end)

T.run()
