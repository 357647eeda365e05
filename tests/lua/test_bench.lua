-- Timers and tf.bench on the CPU device.
local T = require "harness"

local function spin(ms)
  local t0 = tf.now()
  while tf.now() - t0 < ms do end
end

T.test("tf.timer measures elapsed time", function()
  local t = tf.timer("cpu")
  spin(20)
  t:stop()
  local ms = t:ms()
  T.ok(ms >= 19 and ms < 1000, "20 ms spin measured as " .. ms)
  T.eq(t:ms(), ms) -- stopped: the reading does not change
  t:start()
  spin(5)
  T.ok(t:ms() >= 4.5)
  T.eq(tostring(t), "tf.Timer(stopped)")
  t:free()
  T.raises(function() t:ms() end, "timer has been freed")
  do
    local u <close> = tf.timer("cpu")
    T.eq(tostring(u), "tf.Timer(running)")
  end
end)

T.test("tf.bench runs warm-up and timed calls and summarises them", function()
  local calls = 0
  local s = tf.bench(function() calls = calls + 1; spin(2) end, { warmup = 3, iters = 7 })
  T.eq(calls, 10)
  T.eq(#s.samples, 7)
  T.eq(s.n, 7)
  T.eq(s.warmup, 3)
  T.ok(s.min <= s.median and s.median <= s.max)
  T.ok(s.min >= 1.9, "each sample covers the call")
  local sum = 0
  for _, v in ipairs(s.samples) do sum = sum + v end
  T.near(s.mean, sum / 7, 1e-12)
  T.ok(s.std >= 0)
  local fixed = require("tf.bench").summarize({ 1, 2, 3, 4 })
  T.eq(fixed.median, 2.5)
  T.near(fixed.std, math.sqrt(5 / 3), 1e-12)
  T.raises(function() tf.bench(1) end, "expects a function")
  T.raises(function() tf.bench(function() end, { iters = 0 }) end, "iters must be an integer >= 1")
end)

T.test("setup and teardown stay out of the samples; tf.bench.backward", function()
  local calls = { setup = 0, fn = 0, teardown = 0 }
  local s = tf.bench(function(a, b)
    calls.fn = calls.fn + 1
    T.eq({ a, b }, { "x", 42 }, "fn gets what setup returned")
  end, {
    warmup = 2, iters = 3,
    setup = function()
      calls.setup = calls.setup + 1
      local t0 = tf.now()
      while tf.now() - t0 < 20 do end -- untimed
      return "x", 42
    end,
    teardown = function(a) calls.teardown = calls.teardown + 1; T.eq(a, "x") end,
  })
  T.eq(calls, { setup = 5, fn = 5, teardown = 5 })
  T.eq(s.n, 3)
  T.ok(s.max < 20, "the setup's 20 ms are not in any sample: " .. s.max)
  T.raises(function() tf.bench(function() end, { setup = 1 }) end, "setup must be a function")

  local x = tf.randn({ 8, 8 }):requires_grad(true)
  local forwards = 0
  local b = tf.bench.backward(function()
    forwards = forwards + 1
    return (x * x):sum()
  end, nil, { x }, { warmup = 1, iters = 4 })
  T.eq(forwards, 5)
  T.eq(b.n, 4)
  T.eq(x.grad, nil, "the leaves' gradients are dropped after each call")
end)

T.test("tensors a call dropped are freed before the next call, as PyTorch frees them", function()
  local a = tf.randn(512, 512) -- each call's product: 1 MiB, dropped at once
  collectgarbage()
  tf.mem.reset_peak()
  local base = tf.mem.stats("cpu").allocated
  tf.bench(function() tf.matmul(a, a) end, { warmup = 2, iters = 30 })
  local peak = tf.mem.stats("cpu").peak_allocated - base
  -- one product live at a time (and the call's own scratch), not one per call
  T.ok(peak <= 4 * 2 ^ 20, string.format("32 calls held %.1f MiB at once", peak / 2 ^ 20))
end)

T.test("tf.sync on every device in use, or on one", function()
  T.eq(select("#", tf.sync()), 0)
  T.eq(select("#", tf.sync("cpu")), 0)
  T.raises(function() tf.sync("nope") end, "unknown device 'nope' (expected cpu, cuda or cuda:N)")
  if not tf.cuda.is_available() then
    -- (no GPU here, or a CPU-only build: the message says which)
    local err = T.raises(function() tf.sync("cuda:0") end, "(asked for cuda:0)")
    T.ok(err:find("tf.sync: no CUDA device", 1, true), err)
  end
end)

T.run()
