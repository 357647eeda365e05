--- End-to-end benchmark of the Transformer LM (CS336 benchmarking_script):
-- forward, forward+backward and full training steps for each model size,
-- context length and precision; mean and std of the step time, tokens/s,
-- achieved TFLOP/s and peak memory. Out-of-memory configurations become rows
-- marked OOM and the sweep goes on.
--
--   tfhost experiments/benchmark.lua                  (small, ctx 128..1024; on a CPU: tiny, ctx 32,64, f32)
--   tfhost experiments/benchmark.lua --size small,medium --context 128,256 --precision f32,bf16
--   tfhost experiments/benchmark.lua --size small --warmup 0,1,2,5      (the warm-up effect)
--   tfhost experiments/benchmark.lua --size small --no-graphs           (the fused engine without CUDA graphs)
--   tfhost experiments/benchmark.lua --size 2.7B --context 1024 --precision f32 --tf32   (f32 with TF32 products)
local opt = tf.options{
  description = "Time forward, forward+backward and training steps of the Transformer LM.",
  { "size", "model sizes (small, medium, large, xl, 2.7B, or all; tiny for a quick CPU run)", default = "small",
    cpu = "tiny", type = "list" },
  { "context", "context lengths", default = "128,256,512,1024", cpu = "32,64", type = "list:int", min = 1 },
  { "batch", "batch size", default = 4, min = 1 },
  { "vocab", "vocabulary size", default = 10000, min = 1 },
  { "warmup", "warm-up steps before timing (a list sweeps them)", default = "5", cpu = "1", type = "list:int",
    min = 0 },
  { "steps", "timed steps", default = 10, cpu = 3, min = 1 },
  { "mode", "what to time", default = "fwd,fwdbwd,step", type = "list", choices = { "fwd", "fwdbwd", "step" } },
  { "precision", "precisions (fp8: the fused engine's FP8 products, current scaling; fp8_delayed: delayed scaling, "
    .. "an amax history of 16)", default = "f32,bf16", cpu = "f32", type = "list",
    choices = { "f32", "bf16", "f16", "fp8", "fp8_delayed" } },
  { "impl", "model implementation (default: fused when built in)", type = "string", choices = { "fused", "eager" } },
  { "graphs", "fused engine: replay fixed shapes as CUDA graphs (where the device has graphs)",
    default = true },
  { "recompute_residual", "fused engine: keep the residual stream before each layer only and recompute the one "
    .. "after attention in the backward pass (less memory, one more GEMM a layer)", default = false },
  { "tf32", "f32 runs: let the matmuls use TF32 tensor cores (tf.allow_tf32; CUDA devices); their rows say "
    .. "f32+tf32", default = false },
  { "memory_limit", "cap the device memory tfhost may reserve, in GiB (0: none); shows OOM rows cheaply", default = 0.0,
    min = 0 },
  { "json", "write the rows (as each configuration finishes) and the environment to this file", type = "string" },
  { "plot", "draw time, tokens/s, TFLOP/s and peak memory against context length into this file (.svg or .html)",
    type = "string" },
}
if opt.memory_limit > 0 then tf.mem.set_limit(math.floor(opt.memory_limit * 2 ^ 30)) end
if opt.tf32 then
  if tf.default_device() == "cpu" then
    tf.exit(2, "benchmark.lua: --tf32 is a mode of CUDA's tensor cores; the device is the CPU\n")
  end
  tf.allow_tf32(true)
end
-- a row's precision: f32 runs with TF32 products are told apart from exact f32
local function label(precision) return (precision == "f32" and opt.tf32) and "f32+tf32" or precision end

local sizes = opt.size
if #sizes == 1 and sizes[1] == "all" then sizes = tf.model.preset_names end
for _, s in ipairs(sizes) do
  if not tf.model.presets[s] then tf.exit(2, "benchmark.lua: unknown size '" .. s .. "'\n") end
end

-- Times one mode of one built model: warm-up, then timed steps, each
-- followed by a device synchronisation (tf.bench).
local function time_mode(m, mode, ids, targets, warmup)
  -- results are freed at once: garbage logits would inflate the peak
  local fn
  if mode == "fwd" then
    fn = function() m:forward(ids):free() end
  elseif mode == "fwdbwd" then
    fn = function()
      m:loss(ids, targets):free()
      m:backward()
      m:zero_grad()
    end
  else
    fn = function() m:step(ids, targets):free() end
  end
  return tf.bench(fn, { warmup = warmup, iters = opt.steps })
end

local function release(m)
  if m and m.engine then m.engine:free() end
  tf.mem.empty_cache()
end

-- The configurations, and what each costs (its FLOPs times the steps it runs), for the estimate.
local configs, costs = {}, {}
for _, size in ipairs(sizes) do
  for _, ctx in ipairs(opt.context) do
    local flops = tf.model.step_flops(tf.model.config{ preset = size, context_length = ctx, vocab_size = opt.vocab },
      opt.batch, ctx)
    for _, precision in ipairs(opt.precision) do
      for _, warmup in ipairs(opt.warmup) do
        configs[#configs + 1] = { size = size, ctx = ctx, precision = precision, warmup = warmup }
        costs[#costs + 1] = flops * (warmup + opt.steps) * #opt.mode
      end
    end
  end
end

local rows = {}
local sweep = tf.report.sweep{ total = #configs, json = opt.json, results = rows, costs = costs,
  extra = { key = { "size", "context", "precision", "impl", "mode", "warmup", "batch" },
    metrics = { "mean_ms", "tokens_per_s", "peak_gib" } } }
for _, c in ipairs(configs) do
  local size, ctx, precision, warmup = c.size, c.ctx, c.precision, c.warmup
  sweep:start("%s ctx %d %s warmup %d", size, ctx, label(precision), warmup)
  local m
  local timed = {} -- the modes that ran before an out-of-memory error
  local ok, err = pcall(function()
    tf.seed(0)
    m = tf.model.new{ preset = size, context_length = ctx, vocab_size = opt.vocab,
      precision = precision == "fp8_delayed" and "fp8" or precision,
      fp8 = precision == "fp8_delayed" and { scaling = "delayed" } or nil, impl = opt.impl, graphs = opt.graphs }
    m:set_recompute_residual(opt.recompute_residual)
    local ids = tf.randint(0, opt.vocab, { opt.batch, ctx })
    local targets = tf.randint(0, opt.vocab, { opt.batch, ctx })
    local flops = tf.model.step_flops(m.config, opt.batch, ctx)
    for _, mode in ipairs(opt.mode) do
      collectgarbage()
      tf.sync()
      tf.mem.reset_peak()
      local s = time_mode(m, mode, ids, targets, warmup)
      local mode_flops = mode == "fwd" and flops / 3 or flops
      rows[#rows + 1] = {
        size = size, context = ctx, precision = label(precision), impl = m.impl, graphs = m.graphs, mode = mode,
        recompute_residual = opt.recompute_residual,
        warmup = warmup,
        batch = opt.batch, mean_ms = s.mean, std_ms = s.std, median_ms = s.median,
        tokens_per_s = opt.batch * ctx / (s.mean * 1e-3),
        tflops = mode_flops / (s.mean * 1e-3) / 1e12,
        peak_gib = tf.mem.stats().peak_allocated / 2 ^ 30,
        params = m:num_parameters(),
      }
      timed[mode] = true
    end
  end)
  if not ok then
    local oom = tf.mem.is_oom(err)
    if not oom then error(err, 0) end
    for _, mode in ipairs(opt.mode) do
      if not timed[mode] then
        rows[#rows + 1] = { size = size, context = ctx, precision = label(precision), mode = mode, warmup = warmup,
          batch = opt.batch, oom = true, mean_ms = "OOM",
          impl = m and m.impl or opt.impl or (tf._model and "fused" or "eager") }
      end
    end
  end
  release(m)
  sweep:done(ok and "done" or "OOM")
end

local function ms(v, row) return row.oom and "OOM" or string.format("%.2f", v) end
tf.report.table(rows, {
  columns = { "size", { "context", "ctx" }, { "precision", "prec" }, "impl", "mode", "warmup",
    { "mean_ms", "mean ms", ms }, { "std_ms", "std ms", ms }, { "tokens_per_s", "tokens/s", "%.0f" },
    { "tflops", "TFLOP/s", "%.3g" }, { "peak_gib", "peak", function(v) return tf.units.bytes(v * 2 ^ 30) end } },
})
sweep:finish()
if opt.plot then
  tf.plot.sweep(opt.plot, rows, { x = { "context", "warmup", "size" },
    y = { "mean_ms", "tokens_per_s", "tflops", "peak_gib" }, series = { "size", "precision", "impl", "mode", "warmup" }, title = "Transformer LM, batch " .. opt.batch })
  print("wrote " .. opt.plot)
end
