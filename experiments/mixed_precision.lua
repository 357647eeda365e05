--- Mixed precision (CS336 "Systems", mixed_precision_accumulation and
-- benchmarking_mixed_precision): what low-precision accumulation does, what
-- autocast does to each dtype, why LayerNorm stays in f32, what bf16
-- autocast buys in speed, and the next precision, FP8: what its two formats
-- hold, why it needs scales, and what a scaled FP8 product costs in error and
-- gains in time. Runs on the CPU and on a GPU.
--
--   tfhost experiments/mixed_precision.lua [--sections 1,2,3,4,5] [--json out.json]
local opt = tf.options{
  description = "Mixed precision: accumulation, autocast dtypes, LayerNorm precision, f32 vs bf16 timing, FP8.",
  { "sections", "which sections to run", default = "1,2,3,4,5", type = "list:int", choices = { 1, 2, 3, 4, 5 } },
  { "fp8_size", "M = N = K of section 5's products", default = 8192, cpu = 256, min = 16 },
  { "d_model", "width of the timing model", default = 1024, cpu = 256, min = 1 },
  { "layers", "blocks of the timing model", default = 4, min = 1 },
  { "tokens", "rows per batch of the timing model", default = 8192, cpu = 256, min = 1 },
  { "warmup", "warm-up steps before timing", default = 3, cpu = 1, min = 0 },
  { "steps", "timed steps", default = 10, cpu = 3, min = 1 },
  { "json", "write the results (as each section finishes) and the environment to this file", type = "string" },
}

local on_gpu = tf.default_device():find("cuda") ~= nil
local results = {}
local function wanted(n)
  for _, s in ipairs(opt.sections) do if s == n then return true end end
  return false
end
-- one progress step per section (section 4, the timing, is most of the run)
local costs = {}
for n = 1, 5 do
  if wanted(n) then costs[#costs + 1] = n == 4 and 20 or n == 5 and 5 or 1 end
end
local sweep = tf.report.sweep{ total = #costs, json = opt.json, results = results, costs = costs, lines = true }
local function heading(text)
  sweep:start("section %s", text:match("^%d+") or text)
  print("\n## " .. text .. "\n")
end

print("tfhost " .. tf.version .. " (" .. tf.commit .. "), device " .. tf.device())

-- 1. Accumulating 0.01 a thousand times, with tensors on the device. ------
if wanted(1) then
  heading("1. Accumulation: 1000 additions of 0.01")
  local cases = {
    { "f32 sum, f32 increment", "f32", "f32", false },
    { "f16 sum, f16 increment", "f16", "f16", false },
    { "f32 sum, f16 increment", "f32", "f16", false },
    { "f32 sum, f16 increment cast to f32", "f32", "f16", true },
  }
  local rows = {}
  for _, c in ipairs(cases) do
    local name, sum_dtype, inc_dtype, cast = table.unpack(c)
    local s = tf.tensor(0, { dtype = sum_dtype })
    for _ = 1, 1000 do
      local x = tf.tensor(0.01, { dtype = inc_dtype })
      if cast then x = x:to("f32") end
      s = s + x
    end
    rows[#rows + 1] = { case = name, dtype = s.dtype, sum = s:item(), error = s:item() - 10 }
  end
  tf.report.table(rows, { columns = { "case", "dtype", { "sum", "sum", "%.7g" }, { "error", "error vs 10", "%+.3e" } } })
  print([[
f32 accumulates 0.01 (itself not exact in binary) with a small drift. An f16 sum
stalls: once it reaches 8, one f16 step there is 2^-7 = 0.0078, so adding 0.01
rounds to a single step and most of each increment is lost. With an f32 sum the
increments' own f16 rounding (0.01 -> 0.010002136) is all that is left, and
casting the increment to f32 first changes nothing: the value was already rounded.
Low precision is fine for the values; the accumulator is what needs f32.]])
  results.accumulation = rows
  sweep:done()
end

-- 2. What autocast does to each dtype: the ToyModel of CS336. ---------------
local ToyModel = tf.nn.Module:extend("ToyModel")
function ToyModel:init(d_in, d_out)
  self:add("fc1", tf.nn.Linear(d_in, 10, { bias = false }))
  self:add("ln", tf.nn.LayerNorm(10))
  self:add("fc2", tf.nn.Linear(10, d_out, { bias = false }))
end
function ToyModel:forward(x, trace)
  local h = self.fc1(x)
  trace.fc1 = h.dtype
  h = h:relu()
  trace.relu = h.dtype
  h = self.ln(h)
  trace.ln = h.dtype
  local logits = self.fc2(h)
  trace.logits = logits.dtype
  return logits
end

if wanted(2) then
  heading("2. Autocast: the dtype of everything in the ToyModel")
  local rows = {}
  for _, low in ipairs({ "f16", "bf16" }) do
    tf.seed(0)
    local model = ToyModel(20, 5)
    local x = tf.randn(8, 20)
    local y = tf.randint(0, 5, { 8 })
    local trace = {}
    local loss = tf.autocast(low, function()
      local logits = model(x, trace)
      local l = tf.cross_entropy(logits, y)
      trace.loss = l.dtype
      return l
    end)
    loss:backward()
    local params, grads = {}, {}
    for name, p in model:named_parameters() do
      params[#params + 1] = name .. " " .. p.dtype
      grads[#grads + 1] = name .. " " .. p.grad.dtype
    end
    rows[#rows + 1] = {
      autocast = low, parameters = table.concat(params, ", "), fc1 = trace.fc1, relu = trace.relu, ln = trace.ln,
      logits = trace.logits, loss = trace.loss, gradients = table.concat(grads, ", "),
    }
  end
  tf.report.table(rows, { columns = { "autocast", "parameters", { "fc1", "fc1 output" }, { "relu", "ReLU output" },
    { "ln", "LayerNorm output" }, "logits", "loss", "gradients" } })
  print([[
Parameters and their gradients stay f32 (autocast casts copies). Linear layers
run in the low dtype; ReLU keeps its input's dtype; LayerNorm is on autocast's f32
list, so it runs on an f32 copy of its input and returns f32; the next Linear
casts back down, so the logits are low precision; cross-entropy is on the f32
list, so the loss is f32. The same holds for f16 and bf16.]])
  results.autocast_dtypes = rows
  sweep:done()
end

-- 3. Why LayerNorm stays in f32. -------------------------------------------
-- LayerNorm written with ordinary ops, each rounding to dtype: what running
-- it in low precision does, against f64.
local function eager_layer_norm(x)
  local mean = x:mean(-1, true)
  local centered = x - mean
  local var = (centered * centered):mean(-1, true)
  return centered * (var + 1e-5):rsqrt()
end

if wanted(3) then
  heading("3. LayerNorm in low precision, against f64")
  tf.seed(1)
  local inputs = {
    { "offset mean (64 + N(0,1))", tf.randn(64, 512, { dtype = "f64" }) + 64 },
    { "large magnitude (1000 N(0,1))", tf.randn(64, 512, { dtype = "f64" }) * 1000 },
    { "ordinary (N(0,1))", tf.randn(64, 512, { dtype = "f64" }) },
  }
  local rows = {}
  for _, input in ipairs(inputs) do
    local name, x64 = table.unpack(input)
    for _, dtype in ipairs({ "f16", "bf16", "f32" }) do
      -- the input as dtype holds it; the reference normalises exactly that input in f64
      local x = x64:to(dtype)
      local ref = tf.layer_norm(x:to("f64"))
      local eager = tf.no_grad(function() return eager_layer_norm(x) end):to("f64")
      local fused = tf.layer_norm(x):to("f64")
      local function err(y)
        local e = (y - ref):abs():max():item()
        return e ~= e and math.huge or e
      end
      rows[#rows + 1] = { input = name, dtype = dtype, eager = err(eager), fused = err(fused) }
    end
  end
  tf.report.table(rows, { columns = { "input", "dtype", { "eager", "ops in dtype: max error" },
    { "fused", "f32 statistics: max error" } } })
  print([[
Each input is first rounded to the dtype; the reference normalises that rounded
input in f64, so the errors are the computation's alone. With every op rounding
to f16/bf16, LayerNorm fails where its statistics need precision or range: when
the mean is large next to the spread, the rounded mean is off by a good part of
a standard deviation and x - mean is wrong everywhere; with large values f16's
x^2 overflows (65504) and the output collapses. With the statistics in f32, as
autocast arranges (and as tfhost's fused layer_norm does), only the output's own
rounding is left. Hence LayerNorm (and softmax, log, exp, sum) stay f32 under
autocast.]])
  results.layer_norm = rows
  sweep:done()
end

-- 4. Speed: the same small model in f32 and under bf16 autocast. ------------
local Block = tf.nn.Module:extend("Block")
function Block:init(d)
  self:add("ln", tf.nn.LayerNorm(d))
  self:add("up", tf.nn.Linear(d, 4 * d))
  self:add("down", tf.nn.Linear(4 * d, d))
end
function Block:forward(x) return x + self.down(self.up(self.ln(x)):gelu()) end

if wanted(4) then
  local d, n = opt.d_model, opt.tokens
  local classes = 1000
  heading(string.format("4. Speed: %d blocks of width %d, %d rows, f32 vs bf16 autocast", opt.layers, d, n))
  tf.seed(2)
  local blocks = {}
  for i = 1, opt.layers do blocks[i] = Block(d) end
  local model = tf.nn.Sequential(table.unpack(blocks))
  local head = tf.nn.Linear(d, classes)
  local x = tf.randn(n, d)
  local y = tf.randint(0, classes, { n })
  local function loss_of() return tf.cross_entropy(head(model(x)), y) end
  local rows = {}
  for _, precision in ipairs({ "f32", "bf16" }) do
    local region = precision == "bf16" and "bf16" or nil
    local fwd = tf.bench(function() tf.no_grad(tf.autocast, region, loss_of) end,
      { warmup = opt.warmup, iters = opt.steps })
    local step = tf.bench(function()
      local loss = tf.autocast(region, loss_of)
      loss:backward()
      model:zero_grad()
      head:zero_grad()
    end, { warmup = opt.warmup, iters = opt.steps })
    rows[#rows + 1] = { precision = precision, forward_ms = fwd.median, forward_backward_ms = step.median,
      forward_std = fwd.std, forward_backward_std = step.std }
  end
  local speedup, noise = tf.report.noise(rows[1].forward_backward_ms, rows[2].forward_backward_ms,
    rows[1].forward_backward_std, rows[2].forward_backward_std)
  rows[2].speedup = speedup
  tf.report.table(rows, { columns = { "precision", { "forward_ms", "forward ms", "%.3f" },
    { "forward_backward_ms", "forward+backward ms", "%.3f" }, { "speedup", "fwd+bwd speed-up", function(v)
      return string.format("%.2fx", v) .. (noise and " (" .. noise .. ")" or "") end } } })
  -- what the numbers say, from the numbers
  local verdict
  if noise then
    verdict = "bf16 autocast and f32 take the same time here: the difference is " .. noise .. "."
  elseif speedup > 1 then
    verdict = string.format("bf16 autocast is %.2fx as fast as f32 here.", speedup)
  else
    verdict = string.format("bf16 autocast is slower than f32 here (%.2fx).", speedup)
  end
  print(verdict .. (on_gpu and [[

On a GPU the Linear layers run on bf16 tensor cores; the casts and the f32 ops
autocast keeps cost memory traffic, so the gain grows with width.]]
    or [[

The CPU has no bf16 matrix units: bf16 autocast adds casts and can only gain
from moving fewer bytes; the tensor-core gain is the GPU run's.]]))
  results.timing = rows
  sweep:done()
end

-- 5. FP8: the formats, scaling, and a scaled product. ----------------------
if wanted(5) then
  local size = opt.fp8_size - opt.fp8_size % 16
  heading(string.format("5. FP8: e4m3 and e5m2, scales, and a %d^3 product", size))
  local fmts = {}
  for _, d in ipairs({ "f32", "bf16", "f16", "f8e4m3", "f8e5m2" }) do
    local f = tf.finfo(d)
    fmts[#fmts + 1] = { dtype = d, bits = f.bits, max = f.max, smallest_normal = f.smallest_normal,
      smallest_subnormal = f.smallest_subnormal, eps = f.eps }
  end
  tf.report.table(fmts, { columns = { "dtype", { "bits", "bits", "%d" }, { "max", "max", "%.5g" },
    { "smallest_normal", "smallest normal", "%.5g" }, { "smallest_subnormal", "smallest subnormal", "%.5g" },
    { "eps", "eps", "%.5g" } } })

  -- the accumulation probe of section 1, the sum kept in each 8-bit format (rounded after each add)
  local acc = {}
  for _, d in ipairs({ "bf16", "f8e4m3", "f8e5m2" }) do
    local sum, inc = tf.tensor(0):to(d), tf.tensor(0.01):to(d)
    for _ = 1, 1000 do sum = (sum:to("f32") + inc:to("f32")):to(d) end
    acc[#acc + 1] = { dtype = d, increment = inc:to("f32"):item(), sum = sum:to("f32"):item(),
      error = sum:to("f32"):item() - 10 }
  end
  tf.report.table(acc, { columns = { "dtype", { "increment", "0.01 as stored", "%.6g" }, { "sum", "sum of 1000", "%.6g" },
    { "error", "error vs 10", "%+.4g" } } })
  print(string.format([[
A sum kept in e4m3 stops where one step of the format outgrows the increment: at %.4g, e4m3's
neighbours are 2^-3 of it apart; e5m2, with a bit less, stops at %.4g. FP8 holds operands; the sums
are f32 (the tensor cores' accumulators), as bf16's are.
]], acc[2].sum, acc[3].sum))

  -- the error of an FP8 product against f64, operands of one magnitude, without and with a scale
  local msize = math.min(size, 512)
  local sweep_rows = {}
  for _, mag in ipairs({ 1e-4, 1e-2, 1, 1e2, 1e4 }) do
    tf.seed(4)
    local x, y = tf.randn(msize, msize) * mag, tf.randn(msize, msize) * mag
    local exact = x:to("f64"):matmul(y:to("f64"):t())
    local function rel(c) return ((c:to("f64") - exact):abs():max() / exact:abs():max()):item() end
    local x8 = tf.cast(x, "f8e4m3", { saturate = true })
    local y8 = tf.cast(y, "f8e4m3", { saturate = true })
    local top = tf.finfo("f8e4m3").max
    local sx, sy = x:abs():max() / top, y:abs():max() / top
    local xs8 = tf.cast(x / sx, "f8e4m3", { saturate = true })
    local ys8 = tf.cast(y / sy, "f8e4m3", { saturate = true })
    local flushed = x8:to("f32"):eq(0):sum():item() / x:numel()
    local clipped = x8:to("f32"):abs():eq(top):sum():item() / x:numel()
    sweep_rows[#sweep_rows + 1] = { magnitude = mag,
      unscaled = rel(tf.scaled_matmul(x8, y8:t(), { scale_a = 1, scale_b = 1, out_dtype = "f32" })),
      scaled = rel(tf.scaled_matmul(xs8, ys8:t(), { scale_a = sx, scale_b = sy, out_dtype = "f32" })),
      bf16 = rel(tf.matmul(x:to("bf16"), y:to("bf16"):t())), flushed = 100 * flushed, clipped = 100 * clipped }
  end
  tf.report.table(sweep_rows, { columns = { { "magnitude", "operands N(0, s^2), s", "%g" },
    { "unscaled", "e4m3 unscaled: error", "%.3g" }, { "flushed", "flushed to 0", "%.1f%%" },
    { "clipped", "clipped at 448", "%.1f%%" }, { "scaled", "e4m3 scaled: error", "%.3g" }, { "bf16", "bf16: error", "%.3g" } } })
  print([[
Without a scale e4m3 holds only a band of magnitudes (here 0.01 to 100): small operands flush to 0, large ones
saturate at 448 (or become NaN with a plain cast), and the product is lost at both ends. Scaled by
the amax, every magnitude gives the same error: the 3 mantissa bits' own.
]])
  -- a product of activation-like values (N(0,1)) and gradient-like ones (N(0, 1e-3)), against f64
  tf.seed(3)
  local a = tf.randn(size, size)
  local w = tf.randn(size, size) * 1e-3
  local ref = a:to("f64"):matmul(w:to("f64"):t())
  local function err(y) return ((y:to("f64") - ref):abs():max() / ref:abs():max()):item() end
  local top = tf.finfo("f8e4m3").max
  local sa, sw = a:abs():max() / top, w:abs():max() / top
  local a8 = tf.cast(a / sa, "f8e4m3", { saturate = true })
  local w8 = tf.cast(w / sw, "f8e4m3", { saturate = true })
  local raw_w8 = w:to("f8e4m3") -- no scale: N(0, 1e-3) lives below e4m3's smallest normal (2^-6)
  local ab, wbt = a:to("bf16"), w:to("bf16"):t()
  local w8t, raw_w8t = w8:t(), raw_w8:t()
  local unscaled_a8 = a:to("f8e4m3")
  local cases = {
    { "bf16", function() return tf.matmul(ab, wbt) end },
    { "fp8 e4m3, current scaling", function() return tf.scaled_matmul(a8, w8t, { scale_a = sa, scale_b = sw }) end },
    { "fp8 e4m3, no scaling", function() return tf.scaled_matmul(unscaled_a8, raw_w8t, { scale_a = 1, scale_b = 1 }) end },
  }
  local rows = {}
  for _, c in ipairs(cases) do
    local s = tf.bench(function() c[2]() end, { warmup = opt.warmup, iters = opt.steps })
    rows[#rows + 1] = { product = c[1], max_error = err(c[2]()), ms = s.median,
      tflops = 2 * size ^ 3 / (s.median * 1e-3) / 1e12 }
  end
  local zeros = (raw_w8:to("f32"):eq(0):sum():item()) / w:numel()
  tf.report.table(rows, { columns = { "product", { "max_error", "max error / max |C|", "%.3e" },
    { "ms", "ms (median)", "%.3f" }, { "tflops", "TFLOP/s", "%.1f" } } })
  local bf, scaled, raw = rows[1], rows[2], rows[3]
  print(string.format([[
e4m3 keeps 3 mantissa bits (eps 0.125) between 2^-9 and 448, e5m2 2 bits between 2^-16 and 57344.
Scaled by its amax onto 448 (current scaling), each operand uses the whole format: the product's
error is %.1fx bf16's here, the price of 3 mantissa bits against 7. Without a scale the small
operand, N(0, 1e-3), falls below e4m3's normal range: %.0f%% of it became 0 and the product's error
is %.2g of its largest value, %.0fx the scaled one's. Training in FP8 therefore carries a scale with
every tensor (tf.model's precision "fp8").
]], scaled.max_error / bf.max_error, 100 * zeros, raw.max_error, raw.max_error / scaled.max_error))
  print(on_gpu and string.format([[
On this GPU the scaled FP8 product ran at %.0f TFLOP/s against bf16's %.0f (%.2fx); in training the
casts cost a pass over each operand, which must be fused away for the gain to show.]], scaled.tflops,
    bf.tflops, scaled.tflops / bf.tflops) or [[
The CPU computes FP8 products from the decoded values in f32 (the GPU's twin): there is no speed to
gain here; a GPU run shows the tensor cores' rate.]])
  -- the training step of the fused engine in each precision (GPU only)
  local steps = {}
  if on_gpu then
    tf.seed(5)
    for _, precision in ipairs({ "f32", "bf16", "fp8" }) do
      local m = tf.model.new{ d_model = opt.d_model, num_layers = opt.layers, num_heads = opt.d_model // 64,
        d_ff = 4 * opt.d_model, vocab_size = 10000, context_length = 512, precision = precision }
      m:optimizer{ lr = 1e-4 }
      local ids = tf.randint(0, 10000, { 8, 512 }, { dtype = "i64" })
      local st = tf.bench(function() m:step(ids, ids) end, { warmup = opt.warmup, iters = opt.steps })
      steps[#steps + 1] = { precision = precision, step_ms = st.median, std_ms = st.std }
      m = nil
      collectgarbage()
    end
    tf.report.table(steps, { title = string.format("Training step, fused engine: %d layers of width %d, batch 8 x 512",
      opt.layers, opt.d_model), columns = { "precision", { "step_ms", "step ms (median)", "%.3f" },
      { "std_ms", "std ms", "%.3f" } } })
  else
    print("(The training step's time in f32, bf16 and fp8 is a GPU row: skipped on the CPU, which has no FP8 or bf16 "
      .. "matrix units to time.)")
  end
  results.fp8 = { formats = fmts, accumulation = acc, magnitudes = sweep_rows, products = rows,
    unscaled_zero_fraction = zeros, steps = steps }
  sweep:done()
end

if opt.json then print() end
sweep:finish()
