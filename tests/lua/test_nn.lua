-- Neural-network functions on the CPU: values against references written
-- here with basic ops, gradients against finite differences in f64, errors.
local T = require "harness"
tf.seed(T.fresh_seed())

local cpu64 = { device = "cpu", dtype = "f64" }
local function r(...) return tf.randn({ ... }, cpu64) end

T.test("softmax and log_softmax: values and gradients, any dim", function()
  local x = r(3, 5)
  local e = (x - x:max(-1, true)):exp()
  T.near(tf.softmax(x), e / e:sum(-1, true), 1e-12, 1e-15)
  T.near(tf.log_softmax(x), (e / e:sum(-1, true)):log(), 1e-12, 1e-14)
  T.near(tf.softmax(x, 0), tf.softmax(x:t()):t(), 1e-12, 1e-15)
  T.gradcheck(function(a) return tf.softmax(a) end, { r(3, 4) }, { name = "softmax" })
  T.gradcheck(function(a) return tf.log_softmax(a) end, { r(3, 4) }, { name = "log_softmax" })
  T.gradcheck(function(a) return a:softmax(0) end, { r(3, 4) }, { name = "softmax dim 0" })
  T.eq(tf.softmax(tf.tensor({ 1000, 1000 }, cpu64)):tolist(), { 0.5, 0.5 }, "large logits do not overflow")
end)

T.test("layer_norm: values and gradients", function()
  local x, w, b = r(4, 6), r(6), r(6)
  local mean = x:mean(-1, true)
  local var = ((x - mean) * (x - mean)):mean(-1, true)
  T.near(tf.layer_norm(x, w, b, 1e-5), (x - mean) / (var + 1e-5):sqrt() * w + b, 1e-10, 1e-12)
  T.near(tf.layer_norm(x), (x - mean) / (var + 1e-5):sqrt(), 1e-10, 1e-12)
  T.gradcheck(function(a, ww, bb) return tf.layer_norm(a, ww, bb) end, { r(3, 5), r(5), r(5) }, { name = "layer_norm" })
  T.gradcheck(function(a) return tf.layer_norm(a) end, { r(2, 3, 4) }, { name = "layer_norm without affine" })
  T.raises(function() tf.layer_norm(x, r(5)) end, "layer_norm")
end)

T.test("rms_norm: values, gradients, f32 statistics", function()
  local x, g = r(4, 6), r(6)
  local rms = ((x * x):mean(-1, true) + 1e-5):rsqrt()
  T.near(tf.rms_norm(x, g), x * rms * g, 1e-10, 1e-12)
  T.gradcheck(function(a, gg) return tf.rms_norm(a, gg) end, { r(3, 5), r(5) }, { name = "rms_norm" })
  local h = tf.randn(4, 64, { device = "cpu", dtype = "bf16" })
  local y = tf.rms_norm(h, tf.ones(64, { device = "cpu" }))
  T.eq(y.dtype, "bf16", "the output has the input's dtype")
  local h32 = h:to("f32")
  local ref = h32 * ((h32 * h32):mean(-1, true) + 1e-5):rsqrt()
  T.ok(T.relerr(y, ref) < 5e-3, "bf16 rms_norm within bf16 rounding")
end)

T.test("cross_entropy: values, gradients, targets checked", function()
  local logits = r(5, 7)
  local targets = tf.tensor({ 0, 6, 3, 3, 1 }, { device = "cpu" })
  local lse = logits:exp():sum(-1):log():tolist()
  local rows, expect = logits:tolist(), 0
  for i, t in ipairs(targets:tolist()) do expect = expect + lse[i] - rows[i][t + 1] end
  T.near(tf.cross_entropy(logits, targets):item(), expect / 5, 1e-12)
  T.eq(tf.cross_entropy(logits, targets).ndim, 0)
  T.gradcheck(function(l) return tf.cross_entropy(l, targets) end, { r(5, 7) }, { name = "cross_entropy" })
  T.gradcheck(function(l) return tf.cross_entropy(l, targets:reshape(5, 1)) end, { r(5, 1, 7) },
    { name = "cross_entropy over leading dims" })
  T.raises(function() tf.cross_entropy(logits, tf.tensor({ 0, 7, 0, 0, 0 }, { device = "cpu" })) end, "7")
  T.raises(function() tf.cross_entropy(logits, tf.tensor({ 0, -1, 0, 0, 0 }, { device = "cpu" })) end, "-1")
  T.raises(function() tf.cross_entropy(logits, tf.tensor({ 0, 1 }, { device = "cpu" })) end, "cross_entropy")
  T.raises(function() tf.cross_entropy(logits, logits) end, "cross_entropy")
end)

T.test("rope: rotation of interleaved pairs, positions, gradient", function()
  local x = r(2, 3, 4) -- (batch, seq, d)
  local y = tf.rope(x, 10000)
  -- by hand: pair k of position p rotates by p * 10000^(-2k/4)
  local xv, yv = x:tolist(), y:tolist()
  for bi = 1, 2 do
    for p = 1, 3 do
      for k = 0, 1 do
        local a = (p - 1) * 10000 ^ (-2 * k / 4)
        local x0, x1 = xv[bi][p][2 * k + 1], xv[bi][p][2 * k + 2]
        T.near(yv[bi][p][2 * k + 1], x0 * math.cos(a) - x1 * math.sin(a), 1e-6, 1e-6)
        T.near(yv[bi][p][2 * k + 2], x0 * math.sin(a) + x1 * math.cos(a), 1e-6, 1e-6)
      end
    end
  end
  local pos = tf.tensor({ 5, 0, 2 }, { device = "cpu" })
  T.near(tf.rope(x, 10000, pos):select(1, 1), x:select(1, 1), 1e-12, 0, "position 0 is the identity")
  T.gradcheck(function(a) return tf.rope(a, 100) end, { r(2, 3, 6) }, { name = "rope" })
  T.raises(function() tf.rope(r(2, 3, 5), 10000) end, "rope")
end)

T.test("embedding: lookup, gradient with repeated ids, id range", function()
  local w = r(6, 3)
  local ids = tf.tensor({ { 1, 4 }, { 4, 0 } }, { device = "cpu" })
  local e = tf.embedding(w, ids)
  T.eq(tostring(e.shape), "(2, 2, 3)")
  T.eq(e:tolist()[1][2], w:tolist()[5])
  T.gradcheck(function(ww) return tf.embedding(ww, ids) end, { r(6, 3) }, { name = "embedding" })
  local wl = r(6, 3):requires_grad(true)
  tf.embedding(wl, ids):sum():backward()
  T.eq(wl.grad:sum(-1):tolist(), { 3.0, 3.0, 0.0, 0.0, 6.0, 0.0 })
  T.raises(function() tf.embedding(w, tf.tensor({ 6 }, { device = "cpu" })) end, "6")
  T.raises(function() tf.embedding(w, tf.tensor({ 1.5 }, { device = "cpu" })) end, "embedding")
end)

T.test("masked_fill, comparisons and the causal mask", function()
  local x = r(3, 3)
  local m = tf.causal_mask(3, { device = "cpu" })
  T.eq(m.dtype, "bool")
  T.eq(m:tolist(), { { true, false, false }, { true, true, false }, { true, true, true } })
  T.eq(tf.causal_mask(2, 3, { device = "cpu" }):tolist(), { { true, false, false }, { true, true, false } })
  local filled = tf.masked_fill(x, m, 0)
  T.eq(filled:tolist()[1][1], 0.0)
  T.eq(filled:tolist()[1][2], x:tolist()[1][2])
  T.gradcheck(function(a) return a:masked_fill(m, -1) end, { r(3, 3) }, { name = "masked_fill" })
  T.eq(tf.lt(tf.tensor({ 1, 5 }, { device = "cpu" }), 3):tolist(), { true, false })
  T.eq(tf.eq(tf.tensor({ 1, 5 }, { device = "cpu" }), tf.tensor({ 1, 4 }, { device = "cpu" })):tolist(), { true, false })
  T.eq(tf.isnan(tf.tensor({ 0 / 0, 1 }, { device = "cpu" })):tolist(), { true, false })
  T.eq(tf.isfinite(tf.tensor({ math.huge, 1 }, { device = "cpu" })):tolist(), { false, true })
end)

T.test("a masked attention from these ops has the right gradient", function()
  local mask = tf.causal_mask(4, { device = "cpu" })
  local function attention(q, k, v)
    local s = tf.matmul(q, k:transpose(-1, -2)) / math.sqrt(q:size(-1))
    return tf.matmul(s:masked_fill(tf.eq(mask:to("i32"), 0), -math.huge):softmax(-1), v)
  end
  T.gradcheck(attention, { r(2, 4, 3), r(2, 4, 3), r(2, 4, 3) }, { name = "attention" })
end)

T.run()
