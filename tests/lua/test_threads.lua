-- The CPU backend's thread count (tf.threads, --threads, TF_NUM_THREADS)
-- changes how fast it runs, never what it computes: every result below has
-- the same bits on 1, 2 and 3 threads (the CPU is the oracle the GPU
-- kernels are checked against).
local T = require "harness"

local cpu = { device = "cpu" }

-- Runs fn(seed) with n threads; returns its tensors on the CPU, as f64.
local function with_threads(n, fn)
  local before = tf.threads(n)
  local ok, out = pcall(fn)
  tf.threads(before)
  if not ok then error(out, 0) end
  return out
end

local function same_bits(name, make)
  local runs = {}
  for _, n in ipairs({ 1, 2, 3 }) do runs[n] = with_threads(n, make) end
  for key, t in pairs(runs[1]) do
    for _, n in ipairs({ 2, 3 }) do
      local other = runs[n][key]
      T.eq(other.shape, t.shape, name .. " " .. key .. " shape")
      local diff = (other:to { dtype = "f64" } - t:to { dtype = "f64" }):abs():max():item()
      T.ok(diff == 0, string.format("%s %s: 1 thread against %d differ by %g", name, key, n, diff))
    end
  end
end

T.test("tf.threads reads and sets the count; bad counts are errors", function()
  local n = tf.threads()
  T.ok(math.type(n) == "integer" and n >= 1, tostring(n))
  T.eq(tf.threads(3), n)
  T.eq(tf.threads(), 3)
  tf.threads(n)
  T.eq(tf.sysinfo().threads, n)
  T.ok(type(tf.sysinfo().blas) == "string" and #tf.sysinfo().blas > 0)
  T.raises(function() tf.threads(0) end, "tf.threads: need a count in 1..4096, not 0")
  T.raises(function() tf.threads("x") end, "number expected")
  T.eq(tf.results.env().host.threads, n)
end)

T.test("matrix products: f32, f64, bf16, batched, transposed, accumulated, long sums in chunks", function()
  same_bits("matmul", function()
    tf.seed(1)
    local a, b = tf.randn({ 96, 300 }, cpu), tf.randn({ 300, 80 }, cpu)
    local ab = tf.randn({ 12, 33, 40 }, cpu):to { dtype = "bf16" }
    local bb = tf.randn({ 12, 40, 17 }, cpu):to { dtype = "bf16" }
    local big = tf.randn({ 300, 513 }, cpu)
    -- few tiles and a long K: K is cut into chunks added in order (kernels/cpu/gemm.c)
    local la, lb = tf.randn({ 40, 2600 }, cpu), tf.randn({ 2600, 70 }, cpu)
    return {
      long = tf.matmul(la, lb),
      long_f64 = tf.matmul(la:to { dtype = "f64" }, lb:to { dtype = "f64" }),
      long_bf16 = tf.matmul(la:to { dtype = "bf16" }, lb:to { dtype = "bf16" }),
      f32 = tf.matmul(a, b),
      t = tf.matmul(b:transpose(0, 1), a:transpose(0, 1)),
      f64 = tf.matmul(a:to { dtype = "f64" }, b:to { dtype = "f64" }),
      bf16 = tf.matmul(ab, bb),
      big = tf.matmul(big, big:transpose(0, 1)),
    }
  end)
end)

T.test("elementwise ops, reductions, softmax and norms", function()
  same_bits("ops", function()
    tf.seed(2)
    local x = tf.randn({ 3, 70000 }, cpu)
    local y = tf.randn({ 70000 }, cpu)
    local long = tf.randn({ 1000003 }, cpu)
    return {
      add = x + y,
      exp = (x * 0.5):exp(),
      sum = long:sum(),
      mean = long:mean(),
      rows = x:sum(-1),
      cols = x:sum(0),
      softmax = x:softmax(-1),
      cast = x:to { dtype = "bf16" },
    }
  end)
end)

T.test("a training step of the tiny model (fused engine)", function()
  same_bits("model", function()
    tf.seed(3)
    local m = tf.model.new { preset = "tiny", context_length = 32, device = "cpu" }
    local ids = tf.randint(0, m.config.vocab_size, { 4, 32 }, cpu)
    local loss = m:step(ids, ids)
    local out = { loss = loss:reshape({ 1 }), logits = m:forward(ids) }
    for name, p in pairs(m:parameters()) do
      if name:find("layers.0.attn", 1, true) or name == "lm_head.weight" then out[name] = p:clone() end
    end
    return out
  end)
end)

T.run()
