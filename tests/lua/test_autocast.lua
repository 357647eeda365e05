-- Autocast: PyTorch's CUDA autocast policy, op by op, on the default
-- device (the policy is the same on the CPU), plus scopes, nesting, the cast
-- cache and gradients.
local T = require "harness"

local function t(dtype, ...) return tf.randn({ ... }, { dtype = dtype }) + 2 end

T.test("matmul and linear run in the autocast dtype", function()
  for _, low in ipairs({ "bf16", "f16" }) do
    tf.autocast(low, function()
      T.eq(tf.autocast_dtype(), low)
      T.eq(tf.matmul(t("f32", 4, 8), t("f32", 8, 3)).dtype, low)
      T.eq(tf.matmul(t("f16", 4, 8), t("f32", 8, 3)).dtype, low)
      T.eq(tf.linear(t("f32", 2, 8), t("f32", 5, 8), t("f32", 5)).dtype, low, "bias cast too")
      T.eq(tf.matmul(t("f64", 4, 8), t("f64", 8, 3)).dtype, "f64", "f64 is never cast")
    end)
  end
end)

T.test("the f32 list: exp, log, pow, rsqrt, sum produce f32", function()
  tf.autocast("f16", function()
    local h = t("f16", 3, 4)
    T.eq(h:exp().dtype, "f32")
    T.eq(h:log().dtype, "f32")
    T.eq(h:rsqrt().dtype, "f32")
    T.eq((h ^ 2).dtype, "f32")
    T.eq(tf.pow(h, h).dtype, "f32")
    T.eq(h:sum().dtype, "f32")
    T.eq(h:sum(0).dtype, "f32")
  end)
end)

T.test("other ops keep their inputs' dtype, with normal promotion", function()
  tf.autocast("bf16", function()
    local b, f = t("bf16", 3, 4), t("f32", 3, 4)
    T.eq(b:relu().dtype, "bf16")
    T.eq(b:sqrt().dtype, "bf16")
    T.eq(b:sigmoid().dtype, "bf16")
    T.eq(b:mean().dtype, "bf16")
    T.eq(b:max().dtype, "bf16")
    T.eq((b + f).dtype, "f32")
    T.eq((b * 2).dtype, "bf16")
    T.eq(f:relu().dtype, "f32")
    T.eq(f:exp().dtype, "f32")
    T.eq(tf.arange(4):sum().dtype, "i64", "integers are never cast")
  end)
end)

T.test("scopes: nesting, disabling, restoring on errors", function()
  T.eq(tf.autocast_dtype(), nil)
  do
    local _ <close> = tf.autocast("bf16")
    T.eq(tf.autocast_dtype(), "bf16")
    do
      local _ <close> = tf.autocast("f16")
      T.eq(tf.matmul(t("f32", 2, 2), t("f32", 2, 2)).dtype, "f16")
      do
        local _ <close> = tf.autocast(nil)
        T.eq(tf.autocast_dtype(), nil)
        T.eq(tf.matmul(t("f32", 2, 2), t("f32", 2, 2)).dtype, "f32")
      end
    end
    T.eq(tf.autocast_dtype(), "bf16")
  end
  T.eq(tf.autocast_dtype(), nil)
  local ok = pcall(tf.autocast, "bf16", function() error("inside") end)
  T.eq(ok, false)
  T.eq(tf.autocast_dtype(), nil, "an error inside leaves the region")
  T.eq(tf.autocast("bf16", function(a, b) return a + b end, 2, 3), 5, "arguments and results pass through")
  T.raises(function() tf.autocast("f32") end, 'tf.autocast: the dtype must be "bf16" or "f16" (nil: autocast off), not f32')
  T.raises(function() tf.autocast("f99") end, "not f99")
end)

T.test("a parameter is cast once per region (the cast cache)", function()
  local w = tf.randn(64, 64):requires_grad(true)
  local x = tf.randn(8, 64)
  tf.autocast("bf16", function()
    tf.matmul(x, w)
    local before = tf.mem.stats().num_allocs
    tf.matmul(x, w)
    -- x's cast and the output: w's cast is reused
    T.eq(tf.mem.stats().num_allocs - before, 2)
  end)
  tf.autocast("bf16", function()
    local before = tf.mem.stats().num_allocs
    tf.matmul(x, w)
    T.eq(tf.mem.stats().num_allocs - before, 3, "a new region casts again")
  end)
end)

T.test("gradients reach f32 parameters in f32", function()
  tf.seed(5)
  local w = tf.randn(16, 8):requires_grad(true)
  local b = tf.randn(16):requires_grad(true)
  local x = tf.randn(4, 8)
  local loss = tf.autocast("bf16", function()
    local y = tf.linear(x, w, b)
    T.eq(y.dtype, "bf16")
    return (y:relu() * y):sum()
  end)
  T.eq(loss.dtype, "f32")
  loss:backward()
  T.eq(w.grad.dtype, "f32")
  T.eq(b.grad.dtype, "f32")
  -- the same computation in f32 agrees to bf16 precision
  local w32, b32 = w:detach():requires_grad(true), b:detach():requires_grad(true)
  local y = tf.linear(x, w32, b32)
  ;(y:relu() * y):sum():backward()
  T.ok(T.relerr(w.grad, w32.grad) < 3e-2, "bf16 gradients within 3e-2: " .. T.relerr(w.grad, w32.grad))
  T.ok(T.relerr(b.grad, b32.grad) < 3e-2)
end)

T.run()
