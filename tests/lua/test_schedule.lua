-- Learning-rate schedules and global gradient-norm clipping (tf.optim):
-- the schedules against CS336's formulas written out here at every step of
-- a run and at the boundaries; clip_grad_norm against a norm worked out by
-- hand, a no-op under the maximum, zero gradients; the options' errors; and
-- the fused engine against the eager model over steps with clipping active
-- and a cosine schedule (the CPU; a GPU too when present). CS336's own
-- vectors for these two functions are not in ../shared/conformance (it holds
-- RoPE and attention only), so the formulas are the reference.
local T = require "harness"

-- CS336 assignment 1's lr_cosine_schedule(t, alpha_max, alpha_min, T_w, T_c).
local function cs336_cosine(t, amax, amin, tw, tc)
  if t < tw then return t / tw * amax end
  if t <= tc then return amin + 0.5 * (1 + math.cos((t - tw) / (tc - tw) * math.pi)) * (amax - amin) end
  return amin
end

T.test("cosine is CS336's lr_cosine_schedule at every step and the boundaries", function()
  local cases = { { 1, 0.1, 7, 21 }, { 3e-4, 3e-5, 100, 1000 }, { 1e-3, 0, 0, 10 }, { 2e-3, 2e-3, 5, 6 } }
  for _, c in ipairs(cases) do
    local s = tf.optim.schedule.cosine{ max_lr = c[1], min_lr = c[2], warmup = c[3], cycle = c[4] }
    for t = 0, c[4] + 5 do
      T.near(s(t), cs336_cosine(t, c[1], c[2], c[3], c[4]), 1e-15, 1e-18, "cosine at t = " .. t)
      T.eq(s:lr(t), s(t), "s:lr(t) is s(t)")
    end
    T.near(s(c[3] + 0.5), cs336_cosine(c[3] + 0.5, c[1], c[2], c[3], c[4]), 1e-15, 1e-18, "between steps")
    T.eq(s(0), c[3] > 0 and 0.0 or c[1], "t = 0")
    T.near(s(c[3]), c[1], 1e-15, 0, "the warm-up ends at max_lr")
    T.near(s(c[4]), c[2], 1e-15, 1e-18, "the cycle ends at min_lr")
    T.eq(s(c[4] + 1), c[2], "min_lr after the cycle")
    T.eq(s(1e9), c[2], "min_lr long after")
  end
  -- the assignment's test: max 1, min 0.1, T_w 7, T_c 21, t = 0 .. 24
  local s = tf.optim.schedule.cosine{ max_lr = 1, min_lr = 0.1, warmup = 7, cycle = 21 }
  T.near(s(8), 0.1 + 0.45 * (1 + math.cos(math.pi / 14)), 1e-15)
  T.near(s(14), 0.55, 1e-15)
  T.eq(s.kind, "cosine")
  T.eq(s.options.warmup, 7)
  T.ok(tostring(s):find("tf.optim.schedule.cosine{max_lr = 1", 1, true), tostring(s))
end)

T.test("linear and constant", function()
  local s = tf.optim.schedule.linear{ max_lr = 1e-3, min_lr = 1e-4, warmup = 4, total = 10 }
  for t = 0, 15 do
    local want
    if t < 4 then want = t / 4 * 1e-3 elseif t <= 10 then want = 1e-3 + (t - 4) / 6 * (1e-4 - 1e-3) else want = 1e-4 end
    T.near(s(t), want, 1e-15, 1e-19, "linear at t = " .. t)
  end
  T.near(s(4), 1e-3, 1e-15)
  T.near(s(10), 1e-4, 1e-15)
  T.near(s(7), 5.5e-4, 1e-15)
  local c = tf.optim.schedule.constant{ lr = 3e-4 }
  for _, t in ipairs({ 0, 1, 10, 1e6, 2.5 }) do T.eq(c(t), 3e-4) end
  T.ok(tf.optim.is_schedule(c) and tf.optim.is_schedule(function() return 1 end) and not tf.optim.is_schedule(1e-3))
end)

T.test("a schedule's bad options and steps are errors", function()
  local cos = tf.optim.schedule.cosine
  T.raises(function() cos{ max_lr = 1, min_lr = 0.1, warmup = 7 } end, "cycle must be an integer number of steps")
  T.raises(function() cos{ max_lr = 1, min_lr = 0.1, warmup = 7, cycle = 7 } end, "cycle (7) must be more steps than warmup (7)")
  T.raises(function() cos{ max_lr = 1, min_lr = 2, warmup = 1, cycle = 7 } end, "min_lr (2) must not be above max_lr (1)")
  T.raises(function() cos{ max_lr = -1, min_lr = 0, warmup = 1, cycle = 7 } end, "max_lr must be a finite number >= 0")
  T.raises(function() cos{ max_lr = 0 / 0, min_lr = 0, warmup = 1, cycle = 7 } end, "max_lr must be a finite number >= 0")
  T.raises(function() cos{ max_lr = 1, min_lr = 0, warmup = 1.5, cycle = 7 } end, "warmup must be an integer")
  T.raises(function() cos{ max_lr = 1, min_lr = 0, warmup = 1, cycle = 7, warm_up = 2 } end, "warm_up")
  T.raises(function() cos(1e-3) end, "tf.optim.schedule.cosine")
  T.raises(function() tf.optim.schedule.linear{ max_lr = 1, min_lr = 0, warmup = 3, total = 2 } end,
    "total (2) must be more steps than warmup (3)")
  T.raises(function() tf.optim.schedule.constant{} end, "lr must be a finite number >= 0")
  local s = cos{ max_lr = 1, min_lr = 0, warmup = 1, cycle = 7 }
  T.raises(function() s(-1) end, "the step must be a finite number >= 0")
  T.raises(function() s:lr("3") end, "the step must be a finite number >= 0")
end)

-- Two parameters with gradients set by hand, and one without.
local function params_with(g1, g2)
  local a, b, c = tf.zeros({ 2, 2 }):requires_grad(true), tf.zeros({ 3 }):requires_grad(true),
    tf.zeros({ 2 }):requires_grad(true)
  local loss = (a * tf.tensor(g1)):sum() + (b * tf.tensor(g2)):sum() + c:sum() * 0
  loss:backward()
  c.grad = nil
  return { a, b, c }
end

T.test("clip_grad_norm: the total norm, scaled by max / (norm + 1e-6) above max", function()
  local ps = params_with({ { 1, 2 }, { 2, 4 } }, { 0, 0, 10 }) -- squares 1 + 4 + 4 + 16 + 100 = 125
  local norm = tf.optim.clip_grad_norm(ps, 5)
  T.eq(norm.ndim, 0)
  T.eq(norm.dtype, "f32")
  T.near(norm:item(), math.sqrt(125), 1e-7)
  local scale = 5 / (math.sqrt(125) + 1e-6)
  T.near(ps[1].grad, { { scale, 2 * scale }, { 2 * scale, 4 * scale } }, 1e-6)
  T.near(ps[2].grad, { 0, 0, 10 * scale }, 1e-6)
  T.ok(ps[3].grad == nil, "a parameter without a gradient is left alone")
  -- the clipped norm is max (to 1e-6 / norm)
  local sq = (ps[1].grad:square():sum() + ps[2].grad:square():sum()):item()
  T.near(math.sqrt(sq), 5, 1e-6)
  -- under the max: nothing changes, the norm is still reported
  local before = ps[2].grad:clone()
  local again = tf.optim.clip_grad_norm(ps, 100)
  T.near(again:item(), 5, 1e-6)
  T.near(ps[2].grad, before, 0, 0, "no-op under max_norm")
  -- exactly at max: not above, so no change (CS336: only a norm above the max clips)
  local at = params_with({ { 3, 0 }, { 0, 0 } }, { 4, 0, 0 })
  T.near(tf.optim.clip_grad_norm(at, 5):item(), 5, 0)
  T.near(at[1].grad, { { 3, 0 }, { 0, 0 } }, 0, 0, "a norm equal to max_norm is not clipped")
  -- math.huge measures
  T.near(tf.optim.clip_grad_norm(at, math.huge):item(), 5, 0)
end)

T.test("clip_grad_norm: zero gradients, no gradients, modules, errors", function()
  local zs = params_with({ { 0, 0 }, { 0, 0 } }, { 0, 0, 0 })
  T.eq(tf.optim.clip_grad_norm(zs, 1):item(), 0.0)
  T.near(zs[1].grad, { { 0, 0 }, { 0, 0 } }, 0, 0, "zeros stay zeros (no NaN)")
  T.eq(tf.optim.clip_grad_norm({ tf.zeros({ 2 }) }, 1):item(), 0.0, "no gradients at all")
  local lin = tf.nn.Linear(4, 3)
  local x = tf.randn(5, 4)
  lin(x):square():sum():backward()
  local want = 0
  for _, p in ipairs(lin:parameters()) do want = want + p.grad:to("f64"):square():sum():item() end
  T.near(tf.optim.clip_grad_norm(lin, 1e-3):item(), math.sqrt(want), 1e-6, 0, "a module's parameters")
  T.near(tf.optim.clip_grad_norm(lin, 1):item(), 1e-3, 1e-5, 0, "clipped to max_norm")
  T.raises(function() tf.optim.clip_grad_norm(lin, 0) end, "max_norm must be a number > 0")
  T.raises(function() tf.optim.clip_grad_norm(lin, -1) end, "max_norm must be a number > 0")
  T.raises(function() tf.optim.clip_grad_norm(lin) end, "max_norm must be a number > 0")
  T.raises(function() tf.optim.clip_grad_norm(3, 1) end, "tf.optim.clip_grad_norm: expects a module")
  T.raises(function() tf.optim.clip_grad_norm({ 1, 2 }, 1) end, "parameter 1 is not a tensor")
end)

T.test("AdamW and SGD take a schedule and max_norm", function()
  local s = tf.optim.schedule.linear{ max_lr = 0.1, min_lr = 0.01, warmup = 1, total = 3 }
  local lin = tf.nn.Linear(4, 3)
  local x = tf.randn(5, 4)
  for _, make in ipairs({ tf.optim.AdamW, tf.optim.SGD }) do
    local opt = make(lin, { schedule = s, max_norm = 0.5 })
    local lrs = {}
    for i = 1, 4 do
      lin(x):square():sum():backward()
      opt:step()
      lrs[i] = opt.lr
      T.ok(opt.grad_norm:item() > 0, "the norm before clipping is kept")
      local after = 0
      for _, p in ipairs(lin:parameters()) do after = after + p.grad:to("f64"):square():sum():item() end
      T.ok(math.sqrt(after) <= 0.5 + 1e-6, "the step used clipped gradients")
      opt:zero_grad()
    end
    T.near(lrs, { 0, 0.1, 0.055, 0.01 }, 1e-15, 0, "the rates of steps t = 0, 1, 2, 3")
    T.eq(opt.t, 4)
  end
  T.raises(function() tf.optim.AdamW(lin, { schedule = s, lr = 1 }) end, "give lr or schedule, not both")
  T.raises(function() tf.optim.AdamW(lin, { schedule = 3 }) end, "schedule must be a tf.optim.schedule")
  T.raises(function() tf.optim.SGD(lin, { max_norm = -2 }) end, "max_norm must be a number > 0")
  local bad = tf.optim.AdamW(lin, { schedule = function() return -1 end })
  lin(x):sum():backward()
  T.raises(function() bad:step() end, "the schedule gave -1 at step 0")
end)

-- The fused engine and the eager model from one seed, a few steps each with
-- clipping active (a max far below the norms) and a cosine schedule: losses,
-- pre-clip norms and parameters agree to the fused-vs-eager tolerances.
local devices = { "cpu" }
if tf.cuda.is_available() then devices[2] = "cuda" end
for _, device in ipairs(devices) do
  T.test("fused and eager agree with clipping and a cosine schedule on " .. device, function()
    if not tf._model then
      T.ok(true, "this tfhost has no fused engine")
      return
    end
    local sched = tf.optim.schedule.cosine{ max_lr = 1e-2, min_lr = 1e-3, warmup = 2, cycle = 6 }
    tf.seed(3)
    local ids = tf.randint(0, 64, { 2, 16 }, { device = device })
    local targets = tf.randint(0, 64, { 2, 16 }, { device = device })
    local models = {}
    for _, impl in ipairs({ "fused", "eager" }) do
      tf.seed(7)
      local m = tf.model.new{ preset = "tiny", vocab_size = 64, context_length = 16, impl = impl, device = device }
      m:optimizer{ schedule = sched, max_norm = 0.05 }
      T.ok(m:last_grad_norm() == nil, impl .. ": no norm before a step")
      models[impl] = m
    end
    for step = 1, 7 do
      local lf = models.fused:step(ids, targets):item()
      local le = models.eager:step(ids, targets):item()
      T.near(lf, le, 1e-5, 0, "loss at step " .. step)
      local nf, ne = models.fused:last_grad_norm(), models.eager:last_grad_norm()
      T.eq(nf.dtype, "f32")
      T.eq(nf.device, ids.device)
      T.ok(ne:item() > 0.05, "clipping is active at step " .. step .. " (norm " .. ne:item() .. ")")
      T.near(nf:item(), ne:item(), 1e-5, 0, "pre-clip norm at step " .. step)
      T.eq(models.fused:optimizer().lr, sched(step - 1))
      T.eq(models.eager:optimizer().lr, sched(step - 1))
    end
    local pe, worst, where = models.eager:parameters(), 0, ""
    for name, p in pairs(models.fused:parameters()) do
      local e = T.relerr(p, pe[name])
      if e > worst then worst, where = e, name end
    end
    -- AdamW divides by sqrt(v): last-bit differences of tiny gradients become
    -- differences of about lr in single elements (test_model_kernels_cuda.c)
    T.ok(worst <= 2e-3, string.format("worst parameter relerr %.3g (%s)", worst, where))
  end)
end

T.test("the fused engine: the clipped step's norm, separate steps, measuring, errors", function()
  if not tf._model then
    T.ok(true, "this tfhost has no fused engine")
    return
  end
  tf.seed(5)
  local ids = tf.randint(0, 64, { 2, 8 })
  local function model()
    tf.seed(9)
    return tf.model.new{ preset = "tiny", vocab_size = 64, context_length = 16, impl = "fused" }
  end
  -- the step in one call against loss, backward and the optimizer's own step: the same bits
  local a, b = model(), model()
  a:optimizer{ lr = 1e-2, max_norm = 0.1 }
  local ob = b:optimizer{ lr = 1e-2, max_norm = 0.1 }
  for _ = 1, 3 do
    a:step(ids, ids)
    b:loss(ids, ids)
    b:backward()
    local pre = 0
    for _, g in pairs(b:grads()) do pre = pre + g:to("f64"):square():sum():item() end
    ob:step()
    ob:zero_grad()
    T.near(b:last_grad_norm():item(), math.sqrt(pre), 1e-6, 0, "the norm of the whole gradient")
    T.eq(a:last_grad_norm():item(), b:last_grad_norm():item(), "one call or three: the same norm")
  end
  local pb = b:parameters()
  for name, p in pairs(a:parameters()) do T.eq((p - pb[name]):abs():max():item(), 0.0, name) end
  -- measuring only (math.huge) changes nothing against no clipping
  local c, d = model(), model()
  c:optimizer{ lr = 1e-2, max_norm = math.huge }
  d:optimizer{ lr = 1e-2 }
  c:step(ids, ids)
  d:step(ids, ids)
  T.ok(c:last_grad_norm():item() > 0 and d:last_grad_norm() == nil)
  local pd = d:parameters()
  for name, p in pairs(c:parameters()) do T.near(p, pd[name], 1e-6, 1e-7, name) end
  T.raises(function() c:optimizer{ max_norm = 0 } end, "max_norm must be a number > 0")
  T.raises(function() c:optimizer{ lr = 1, schedule = tf.optim.schedule.constant{ lr = 1 } } end,
    "give lr or schedule, not both")
  T.raises(function() c.engine:set_max_grad_norm(-1) end, "max_norm must be a number > 0")
end)

T.run()
