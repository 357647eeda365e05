-- precision = "fp8", the fused engine's FP8 training (current scaling): a run
-- follows the bf16 run of the same seed and data step by step, with e5m2 and
-- with e4m3 gradients; m:info() reports the recipe and its state; generation
-- runs in bf16; the options and shapes it refuses are named errors. On a GPU
-- (CUDA graphs on) the run is the CPU run's twin within bf16's tolerance.
local T = require "harness"

local V, SEQ, B = 64, 16, 4

-- A fixed, learnable batch: each token is the previous one plus one.
local function batch(device)
  local rows = {}
  for b = 1, B do
    rows[b] = {}
    for t = 1, SEQ + 1 do rows[b][t] = (b * 5 + t) % V end
  end
  local all = tf.tensor(rows, { dtype = "i64", device = device })
  return all:narrow(1, 0, SEQ), all:narrow(1, 1, SEQ)
end

local function losses(precision, device, steps, fp8)
  tf.seed(5)
  local m = tf.model.new{ preset = "tiny", vocab_size = V, context_length = SEQ, precision = precision, fp8 = fp8,
    device = device }
  m:optimizer{ lr = 3e-3 }
  local x, y = batch(device)
  local out = {}
  for i = 1, steps do out[i] = m:step(x, y):item() end
  return out, m
end

if not tf._model then
  T.skip("this tfhost has no fused engine")
end

T.test("fp8 training follows bf16 step by step", function()
  local ref = losses("bf16", "cpu", 40)
  for _, grad in ipairs({ "f8e5m2", "f8e4m3" }) do
    local got, m = losses("fp8", "cpu", 40, { grad_dtype = grad })
    for i = 1, 40 do
      T.near(got[i], ref[i], 0.03, 0.02, string.format("%s gradients, step %d", grad, i))
    end
    T.ok(got[40] < 0.5 * got[1], grad .. ": it learns (" .. got[1] .. " -> " .. got[40] .. ")")
    local info = m:info()
    T.eq(info.precision, "fp8")
    T.eq(info.fp8.recipe, "current scaling")
    T.eq(info.fp8.grad_dtype, grad)
    T.eq(info.fp8.nonfinite, 0)
    T.ok(info.fp8.weight_amax_max > 0 and info.fp8.weight_scale_min > 0, "the weights' scales are set")
    T.near(info.fp8.weight_scale_max, info.fp8.weight_amax_max / 448, 1e-6, 0, "scale = amax / 448")
  end
end)

T.test("an fp8 model generates (in bf16) and evaluates", function()
  local _, m = losses("fp8", "cpu", 5)
  local x, y = batch("cpu")
  local ids = m:generate(x:narrow(1, 0, 1):narrow(0, 0, 1), { max_new_tokens = 4 })
  T.eq(ids.shape, { 1, 4 })
  local l = m:eval_loss(x, y):item()
  T.ok(l == l and l > 0, "a finite evaluation loss")
end)

T.test("save and load keep the recipe; loading as bf16 drops it", function()
  local _, m = losses("fp8", "cpu", 3, { grad_dtype = "f8e4m3" })
  local path = os.tmpname()
  m:save(path)
  local back = tf.model.load(path, { device = "cpu" })
  T.eq(back.precision, "fp8")
  T.eq(back:info().fp8.grad_dtype, "f8e4m3")
  local x, y = batch("cpu")
  T.eq(back:eval_loss(x, y):item(), m:eval_loss(x, y):item(), "the same model")
  T.eq(tf.model.load(path, { device = "cpu", precision = "bf16" }).precision, "bf16")
  os.remove(path)
end)

T.test("bad fp8 options and shapes are named errors", function()
  T.raises(function() return tf.model.new{ preset = "tiny", precision = "fp8", impl = "eager" } end,
    "runs in the fused engine")
  T.raises(function() return tf.model.new{ preset = "tiny", precision = "bf16", fp8 = { grad_dtype = "f8e4m3" } } end,
    "fp8 options go with precision")
  T.raises(function() return tf.model.new{ preset = "tiny", precision = "fp8", fp8 = { grad_dtype = "bf16" } } end,
    "fp8.grad_dtype must be")
  T.raises(function() return tf.model.new{ preset = "tiny", precision = "fp8", fp8 = { scaling = "delayed" } } end,
    "unknown option")
  T.raises(function() return tf.model.new{ d_model = 40, num_heads = 4, num_layers = 1, d_ff = 64, precision = "fp8",
    device = "cpu" } end, "multiples of 16")
  local m = tf.model.new{ preset = "tiny", vocab_size = V, context_length = SEQ, precision = "fp8", device = "cpu" }
  local x = tf.zeros({ 3, 5 }, { dtype = "i64", device = "cpu" })
  T.raises(function() return m:loss(x, x) end, "batch * seq a multiple of 16")
end)

-- Two backward passes add their gradients: twice one pass's (the weight gradients' FP8 products add into them).
local function accumulates(device)
  tf.seed(5)
  local m = tf.model.new{ preset = "tiny", vocab_size = V, context_length = SEQ, precision = "fp8", device = device }
  local x, y = batch(device)
  m:loss(x, y)
  m:backward()
  local once = {}
  for name, g in pairs(m:grads()) do once[name] = g:to("f64") * 2 end
  m:loss(x, y)
  m:backward()
  for name, g in pairs(m:grads()) do
    T.ok(T.relerr(g, once[name]) < 1e-5, device .. ": " .. name .. " accumulated")
  end
end

T.test("gradients of two backward passes add up", function() accumulates("cpu") end)

T.test("on the GPU: the CPU run's twin", function()
  if not tf.cuda.is_available() then T.skip_test("no GPU is present") end
  accumulates("cuda")
  local cpu = losses("fp8", "cpu", 12)
  local gpu, m = losses("fp8", "cuda", 12)
  for i = 1, 12 do T.near(gpu[i], cpu[i], 0.02, 0.01, "step " .. i) end
  T.ok(m:info().graph_replays > 0, "the steps replayed CUDA graphs")
  T.eq(m:info().fp8.nonfinite, 0)
end)

T.run()
