-- precision = "fp8", the fused engine's FP8 training: a run follows the bf16
-- run of the same seed and data step by step, with current scaling (e5m2 and
-- e4m3 gradients) and with delayed scaling; m:info() reports the recipe and its state; generation
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

T.test("delayed scaling follows bf16 too, casting by the amax history", function()
  local ref = losses("bf16", "cpu", 40)
  local current = losses("fp8", "cpu", 40)
  local got, m = losses("fp8", "cpu", 40, { scaling = "delayed", history = 8 })
  local differs = false
  for i = 1, 40 do
    T.near(got[i], ref[i], 0.03, 0.02, "delayed, step " .. i)
    differs = differs or got[i] ~= current[i]
  end
  T.eq(got[1], current[1], "the first step scales by its own amax, as current scaling does")
  T.ok(differs, "later steps cast by the history, not by their own amax")
  local info = m:info()
  T.eq(info.fp8.recipe, "delayed scaling")
  T.eq(info.fp8.history, 8)
  T.eq(info.fp8.nonfinite, 0)
  T.ok(info.fp8.overflows >= 0 and info.fp8.overflows < 8 * 40 * 2 * 4, "overflows counted: " .. info.fp8.overflows)
  T.eq(tf.model.new{ preset = "tiny", precision = "fp8", fp8 = { scaling = "delayed" }, device = "cpu" }:info().fp8.history,
    16, "the default history")
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
  T.eq(back:info().fp8.history, 0, "current scaling")
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
  T.raises(function() return tf.model.new{ preset = "tiny", precision = "fp8", fp8 = { recipe = "delayed" } } end,
    "unknown option")
  T.raises(function() return tf.model.new{ preset = "tiny", precision = "fp8", fp8 = { scaling = "late" } } end,
    "fp8.scaling must be")
  T.raises(function() return tf.model.new{ preset = "tiny", precision = "fp8", fp8 = { history = 4 } } end,
    "give scaling = \"delayed\" too")
  T.raises(function() return tf.model.new{ preset = "tiny", precision = "fp8", fp8 = { scaling = "delayed", history = 0 } } end,
    "from 1 to 1024")
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
  for _, fp8 in ipairs({ {}, { scaling = "delayed", history = 4 } }) do
    local what = fp8.scaling or "current"
    local cpu = losses("fp8", "cpu", 12, fp8)
    local gpu, m = losses("fp8", "cuda", 12, fp8)
    for i = 1, 12 do T.near(gpu[i], cpu[i], 0.02, 0.01, what .. ", step " .. i) end
    T.ok(m:info().graph_replays > 0, what .. ": the steps replayed CUDA graphs")
    T.eq(m:info().fp8.nonfinite, 0)
  end
end)

T.run()
