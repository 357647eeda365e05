-- tf.cuda.traffic: the engine's own count of what its memory-bound kernels
-- move, which experiments/kernel_bandwidth.lua checks its byte model
-- against. Without a GPU: clear errors. With one: a tiny model's training
-- step counts, for each kernel, the calls made and the bytes their
-- arguments give (checked here from the shapes, apart from the engine's
-- code: SwiGLU, the norms the backward pass recomputes, the loss, the
-- embedding and AdamW, in the step and in the separate optimizer step); an
-- error in the function goes on up; calls do not nest; a step replayed from
-- a CUDA graph counts nothing.
local T = require "harness"
tf.seed(T.fresh_seed())

local B, S, V = 2, 32, 1000
local CFG = tf.model.presets.tiny -- d_model 64, d_ff 256, 2 layers, 4 heads

local function fl(v) return v + 0.0 end -- bytes come as floats

local function cuda_test(name, fn)
  T.test(name, function()
    if not tf.cuda.is_available() then
      T.skip_test(tf.cuda.compiled() and "no GPU is present" or "this tfhost was built without CUDA")
    end
    fn()
  end)
end

local function tiny(precision, graphs)
  return tf.model.new{ preset = "tiny", context_length = S, vocab_size = V, precision = precision, graphs = graphs,
    device = "cuda" }
end

local function batch()
  return tf.randint(0, V, { B, S }, { device = "cuda" }), tf.randint(0, V, { B, S }, { device = "cuda" })
end

T.test("arguments and devices are checked", function()
  T.raises(function() tf.cuda.traffic("a step") end, "function expected")
  T.raises(function() tf.cuda.traffic(function() end, "cpu") end, "cpu is not a CUDA device")
  if not tf.cuda.is_available() then T.raises(function() tf.cuda.traffic(function() end) end, "tf.cuda.traffic") end
end)

cuda_test("a training step counts the calls and bytes each kernel's arguments give", function()
  for _, precision in ipairs{ "bf16", "f32" } do
    local m = tiny(precision, false)
    local x, y = batch()
    m:step(x, y):free() -- the first step plans the buffers
    local c = tf.cuda.traffic(function() m:step(x, y):free() end)
    local L, d, f, n = CFG.num_layers, CFG.d_model, CFG.d_ff, B * S
    local e = precision == "f32" and 4 or 2
    local what = precision .. ": "
    -- SwiGLU: forward reads [a | b] and writes the gate; backward reads [a | b]
    -- and the gate's gradient, writes d[a | b] and the gate again
    T.eq(c.tf_cuda_swiglu_kernel, { calls = 2 * L, bytes = fl(L * n * f * 9 * e) }, what .. "SwiGLU")
    -- the recomputed norms: ln1 reads x (f32) and rstd, writes h; ln2 the same,
    -- and in bf16 it rebuilds the residual stream from x and the kept
    -- projection first (the projection read, the stream written)
    local ln1 = n * d * (4 + e) + 4 * n
    local ln2 = precision == "f32" and ln1 or n * d * (4 + e + e + 4) + 4 * n
    T.eq(c.tf_cuda_rms_apply_kernel, { calls = 2 * L, bytes = fl(L * (ln1 + ln2)) }, what .. "the recomputed norms")
    -- the loss: logits read and their gradient written over them, int64
    -- targets and an f32 loss a row (rows of 1000 take the row kernel)
    T.eq(c.tf_cuda_ce_row_kernel, { calls = 1, bytes = fl(n * (2 * V * e + 12)) }, what .. "the loss")
    -- the embedding: ids read, f32 rows read and written; backward: dout
    -- read, a row of the gradient read and written for each position
    T.eq(c.tf_cuda_embedding_kernel, { calls = 1, bytes = fl(8 * n * d + 8 * n) }, what .. "the embedding")
    T.eq(c.tf_cuda_embedding_sum_kernel, { calls = 1, bytes = fl(12 * n * d) }, what .. "the embedding's gradient")
    -- AdamW: 28 bytes a parameter (p, g, m, v read; p, m, v written), the
    -- gradients the next step adds to zeroed (embedding, gains), the matmul
    -- weights' low copy written
    local matmul = L * (4 * d * d + 3 * d * f) + V * d
    local other = V * d + (2 * L + 1) * d
    T.eq(matmul + other, m:num_parameters(), "the parameters")
    local adamw = 0.0
    for name, k in pairs(c) do
      if name:find("^tf_cuda_adamw") then adamw = adamw + k.bytes end
    end
    T.eq(adamw, fl(28 * (matmul + other) + 4 * other + (precision == "f32" and 0 or e * matmul)), what .. "AdamW")
    -- the step's other memory-bound kernels are there too (their bytes are
    -- checked against kernel_bandwidth.lua's model in its test), and nothing else
    for _, name in ipairs{ "tf_cuda_rms_forward_row_kernel", "tf_cuda_rms_backward_fused_kernel" } do
      T.ok(c[name] and c[name].calls == 2 * L + 1, what .. name .. ": 2L + 1 calls")
    end
    for name, k in pairs(c) do
      T.ok((name:find("^tf_cuda_") or name == "tf_flash_rowdot_kernel") and k.calls > 0 and k.bytes > 0, what .. name)
    end
    m.engine:free()
  end
end)

cuda_test("the engine's separate AdamW step is counted too", function()
  local m = tiny("bf16", false)
  local x, y = batch()
  m:loss(x, y)
  m:backward()
  local c = tf.cuda.traffic(function() m.engine:adamw_step({ step = 1, lr = 1e-3 }) end)
  local L, d, f = CFG.num_layers, CFG.d_model, CFG.d_ff
  local matmul = L * (4 * d * d + 3 * d * f) + V * d
  local other = V * d + (2 * L + 1) * d
  local bytes = 0.0
  for name, k in pairs(c) do
    T.ok(name:find("^tf_cuda_adamw"), name)
    bytes = bytes + k.bytes
  end
  -- p, m, v read and written, the f32 gradient read, the bf16 copy of the matmul weights written
  T.eq(bytes, fl(28 * (matmul + other) + 2 * matmul))
  m.engine:free()
end)

cuda_test("an error inside goes on up and the next count starts clean; calls do not nest", function()
  T.raises(function() tf.cuda.traffic(function() error("inside the count") end) end, "inside the count")
  -- the count is turned off by a to-be-closed variable, not a protected call: the traceback goes down into fn
  local function deep() error("deep in the count") end
  local ok, trace = xpcall(tf.cuda.traffic, debug.traceback, function() deep() end)
  T.ok(not ok and trace:find("deep in the count", 1, true), tostring(trace))
  T.ok(trace:find("in upvalue 'deep'", 1, true) or trace:find("in local 'deep'", 1, true), "fn's frames: " .. trace)
  local c = tf.cuda.traffic(function()
    T.raises(function() tf.cuda.traffic(function() end) end, "calls do not nest")
  end)
  T.eq(next(c), nil, "nothing launched, nothing counted")
  local m = tiny("bf16", false)
  local x, y = batch()
  c = tf.cuda.traffic(function() m:step(x, y):free() end)
  T.eq(c.tf_cuda_swiglu_kernel.calls, 2 * CFG.num_layers, "counting again after both")
  m.engine:free()
end)

cuda_test("a step replayed from a CUDA graph counts nothing", function()
  local m = tiny("bf16", true)
  if not m.graphs then T.skip_test("graph replay is off (TF_MODEL_GRAPHS=0)") end
  local x, y = batch()
  for _ = 1, 3 do m:step(x, y):free() end -- run eagerly, captured, replayed
  local before = m.engine:info().graph_replays
  local c = tf.cuda.traffic(function() m:step(x, y):free() end)
  T.ok(m.engine:info().graph_replays > before, "the step was replayed")
  T.eq(c.tf_cuda_swiglu_kernel, nil, "replayed kernels are not launched one by one")
  T.eq(c.tf_cuda_rms_apply_kernel, nil)
  m.engine:free()
end)

T.run()
