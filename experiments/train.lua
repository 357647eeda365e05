--- Trains the Transformer LM on a token dataset: random batches (tf.data.tokens), AdamW with a cosine
-- schedule and warm-up, gradient clipping, the validation loss every --eval_every steps, checkpoints
-- every --checkpoint_every steps (the newest --keep kept), and the loss curves drawn as the run goes.
-- Ctrl-C saves a checkpoint and exits 130; --resume goes on from a checkpoint with the same bits as a
-- run that was never stopped.
--
--   tfhost experiments/make_bytes_dataset.lua            (once: data/bytes from Python's standard library)
--   tfhost experiments/train.lua                          (small on a GPU, tiny on a CPU; into runs/train)
--   tfhost experiments/train.lua --steps 5000 --batch 64 --out runs/long
--   tfhost experiments/train.lua --minutes 10             (stops after 10 minutes, with a checkpoint)
--   tfhost experiments/train.lua --resume runs/train      (the newest checkpoint of the folder, or a file)
--
-- The run folder (--out) gets checkpoints/ (step_00000500.safetensors, ...), results.json (a row per
-- evaluation: steps, losses, tokens/s, model FLOP utilisation), loss.svg (train and validation loss
-- against steps) and log.txt (the progress lines).
local opt = tf.options{
  description = "Train the Transformer LM on a token dataset, with evaluation, checkpoints and resume.",
  { "data", "the dataset folder: train.bin, val.bin (raw uint16) and meta.json (vocab_size)",
    default = "data/bytes", type = "string" },
  { "from", "text folders (comma-separated) to make the byte-level dataset from when --data has none (default for "
    .. "data/bytes: Python's standard library)", type = "string" },
  { "ext", "with --from: the file name endings read (no dot; *: every file)", default = "py,txt,md,rst",
    type = "list" },
  { "preset", "model size (tiny, small, medium, large, xl, 2.7B)", default = "small", cpu = "tiny", type = "string" },
  { "d_model", "the model's width (default: the preset's)", type = "int", min = 1 },
  { "num_layers", "layers (default: the preset's)", type = "int", min = 1 },
  { "num_heads", "attention heads (default: the preset's)", type = "int", min = 1 },
  { "d_ff", "the SwiGLU's inner width (default: the preset's)", type = "int", min = 1 },
  { "context", "context length", default = 256, cpu = 64, min = 1 },
  { "batch", "sequences a step", default = 32, cpu = 8, min = 1 },
  { "precision", "f32, bf16, f16 or fp8 (the fused engine's FP8 products, current scaling)", default = "bf16",
    cpu = "f32", type = "string", choices = { "f32", "bf16", "f16", "fp8" } },
  { "fp8_grad", "precision fp8: the gradients' format", default = "f8e5m2", type = "string",
    choices = { "f8e5m2", "f8e4m3" } },
  { "fp8_scaling", "precision fp8: current scaling (each cast by its own amax) or delayed (by an amax history)",
    default = "current", type = "string", choices = { "current", "delayed" } },
  { "fp8_history", "precision fp8, delayed scaling: the amax history's length", default = 16, min = 1 },
  { "impl", "fused or eager (default: fused when built in)", type = "string", choices = { "fused", "eager" } },
  { "steps", "optimizer steps in all (the schedule's length)", default = 2000, cpu = 200, min = 1 },
  { "minutes", "stop after this many minutes of training (0: no limit), with a checkpoint", default = 0.0, min = 0 },
  { "lr", "the schedule's largest learning rate", default = 1e-3, min = 0 },
  { "min_lr", "the schedule's last learning rate (default: lr / 10)", type = "number", min = 0 },
  { "warmup", "linear warm-up steps (default: 5 % of --steps)", type = "int", min = 0 },
  { "weight_decay", "AdamW's weight decay", default = 0.1, min = 0 },
  { "beta2", "AdamW's second beta", default = 0.95, min = 0, max = 0.999999 },
  { "max_norm", "global gradient-norm clipping (0: off)", default = 1.0, min = 0 },
  { "eval_every", "steps between validation losses (0: only at the end)", default = 100, cpu = 50, min = 0 },
  { "eval_tokens", "validation tokens read per evaluation (whole windows from the start of val.bin)",
    default = 262144, cpu = 16384, min = 1 },
  { "checkpoint_every", "steps between checkpoints (0: only at the end and on Ctrl-C)", default = 500, cpu = 100,
    min = 0 },
  { "keep", "checkpoints kept in the folder", default = 3, min = 1 },
  { "log_every", "steps between progress lines", default = 10, min = 1 },
  { "out", "the run folder", default = "runs/train", type = "string" },
  { "resume", "a checkpoint file, or a run folder (its newest checkpoint), to go on from", type = "string" },
  { "seed", "the data generator's seed (default: tfhost --seed)", type = "int" },
  { "peak_tflops", "the device's peak for the FLOP utilisation (default: the datasheet's dense bf16/f32 figure for "
    .. "known GPUs; none on a CPU)", type = "number", min = 0 },
  { "graphs", "fused engine: CUDA graph replay", default = true },
  { "json", "the results file (default: results.json in the run folder)", type = "string" },
}

local function die(msg) tf.exit(2, "train.lua: " .. msg .. "\n") end

-- ---- the dataset ----------------------------------------------------------------------
local meta_path = opt.data .. "/meta.json"
local okm, meta = pcall(tf.json.read, meta_path)
if not okm and (opt.from or opt.data == "data/bytes") then -- made here the first time (make_bytes_dataset.lua's way)
  local from = {}
  for f in (opt.from or ""):gmatch("[^,]+") do from[#from + 1] = f end
  if #from == 0 then from[1] = tf.data.python_library() end
  if #from > 0 then
    io.stderr:write(string.format("no dataset in %s: making one from %s\n", opt.data, table.concat(from, ", ")))
    local okb, err = pcall(tf.data.make_bytes, { from = from, out = opt.data, ext = opt.ext, python = opt.from == nil })
    if not okb then die("making " .. opt.data .. ": " .. tostring(err)) end
    okm, meta = pcall(tf.json.read, meta_path)
  end
end
if not okm then
  die(string.format("no dataset in %s (%s); make one with: tfhost experiments/make_bytes_dataset.lua --out %s",
    opt.data, tostring(meta):gsub("^[^\n]-:%d+: ", ""), opt.data))
end
local vocab = math.tointeger(meta.vocab_size)
if not vocab or vocab < 1 then die(meta_path .. " has no vocab_size") end
local train = tf.data.tokens(opt.data .. "/train.bin", { vocab_size = vocab, dtype = meta.dtype or "u16", seed = opt.seed })
local val = tf.data.tokens(opt.data .. "/val.bin", { vocab_size = vocab, dtype = meta.dtype or "u16" })
if #val < opt.context + 1 then die(string.format("%s/val.bin has %d tokens, fewer than --context + 1", opt.data, #val)) end

-- ---- the model, its optimizer, and where the run starts -----------------------------------
local warmup = opt.warmup or math.floor(opt.steps * 0.05)
local min_lr = opt.min_lr or opt.lr / 10
if warmup >= opt.steps then die(string.format("--warmup (%d) must be fewer steps than --steps (%d)", warmup, opt.steps)) end
local spec = { preset = opt.preset, vocab_size = vocab, context_length = opt.context, precision = opt.precision,
  fp8 = opt.precision == "fp8" and { grad_dtype = opt.fp8_grad, scaling = opt.fp8_scaling,
    history = opt.fp8_scaling == "delayed" and opt.fp8_history or nil } or nil,
  impl = opt.impl, graphs = opt.graphs, d_model = opt.d_model, num_layers = opt.num_layers, num_heads = opt.num_heads,
  d_ff = opt.d_ff }
if not tf.model.presets[opt.preset] then die("unknown preset '" .. opt.preset .. "'") end
local m = tf.model.new(spec)
local function optimizer_opts()
  return { schedule = tf.optim.schedule.cosine{ max_lr = opt.lr, min_lr = min_lr, warmup = warmup, cycle = opt.steps },
    betas = { 0.9, opt.beta2 }, weight_decay = opt.weight_decay, max_norm = opt.max_norm > 0 and opt.max_norm or nil }
end
m:optimizer(optimizer_opts())

local folder = tf.checkpoint.folder(opt.out .. "/checkpoints", { keep = opt.keep })
local start, rows, elapsed_before, tokens_before = 0, {}, 0, 0
local window_loss, window_n = 0, 0 -- the logged losses since the last evaluation (a row's train loss)
if opt.resume then
  local path = opt.resume
  if not path:match("%.safetensors$") then
    local f = tf.checkpoint.folder((path:gsub("/checkpoints/?$", "")) .. "/checkpoints")
    path = f:latest()
    if not path then die("no checkpoint in " .. opt.resume) end
  end
  local info = tf.checkpoint.restore(path, { model = m, data = { train = train } })
  start = info.step
  local extra = info.extra or {}
  rows = extra.rows or {}
  elapsed_before, tokens_before = extra.elapsed_s or 0, extra.tokens or 0
  window_loss, window_n = extra.window_loss or 0, extra.window_n or 0
  io.stderr:write(string.format("resumed from %s at step %d\n", path, start))
end

local cfg = m.config
local tokens_per_step = opt.batch * opt.context
local flops_per_step = tf.model.step_flops(cfg, opt.batch, opt.context)
local function datasheet_peak()
  if opt.peak_tflops then return opt.peak_tflops end
  if tf.default_device() == "cpu" then return nil end
  local name = tf.device_info().name or ""
  local dense = { { "H100", 989.4, 494.7 }, { "H200", 989.4, 494.7 }, { "A100", 312, 156 } } -- bf16, tf32 (SXM)
  for _, d in ipairs(dense) do
    if name:find(d[1], 1, true) then return opt.precision == "f32" and d[3] or d[2] end
  end
  return nil
end
local peak = datasheet_peak()

-- ---- evaluation, logs, results ---------------------------------------------------------------
tf.mkdir(opt.out)
local log = assert(io.open(opt.out .. "/log.txt", "a"))
local function note(fmt, ...)
  local line = string.format(fmt, ...)
  io.stderr:write(line, "\n")
  log:write(line, "\n")
  log:flush()
end

-- whole batches of whole windows (a batch of another shape would make the engine plan for it)
local eval_windows = math.min(val:num_windows(opt.context), opt.eval_tokens // opt.context)
if eval_windows >= opt.batch then eval_windows = eval_windows // opt.batch * opt.batch end
eval_windows = math.max(1, eval_windows)
local function evaluate()
  local sum, count, seen = 0, 0, 0
  for x, y in val:windows(opt.batch, opt.context) do
    if seen >= eval_windows then break end
    local rows_here = x.shape[1]
    sum = sum + m:eval_loss(x, y):item() * rows_here
    count, seen = count + rows_here, seen + rows_here
  end
  return sum / count
end

local results_path = opt.json or (opt.out .. "/results.json")
local function plot()
  local curve = {}
  for _, r in ipairs(rows) do
    curve[#curve + 1] = { step = r.step, split = "train", loss = r.train_loss }
    if r.val_loss then curve[#curve + 1] = { step = r.step, split = "validation", loss = r.val_loss } end
  end
  if #curve > 0 then
    tf.plot.write(opt.out .. "/loss.svg", { rows = curve, x = "step", y = "loss", series = { "split" },
      title = string.format("%s on %s, batch %d x %d, %s", opt.preset, opt.data, opt.batch, opt.context, opt.precision),
      ylabel = "loss (nats/token)" })
  end
end

-- ---- the loop -----------------------------------------------------------------------------------
tf.catch_interrupt()
local deadline = opt.minutes > 0 and tf.now() + opt.minutes * 60e3 or math.huge
local t_run = tf.now()
local t_window, window_steps = t_run, 0

local function seconds() return elapsed_before + (tf.now() - t_run) / 1e3 end
local function save(step, why)
  local info = folder:save(step, { model = m, data = { train = train },
    extra = { rows = rows, elapsed_s = seconds(), tokens = tokens_before + (step - start) * tokens_per_step, why = why,
      window_loss = window_loss, window_n = window_n } })
  note("checkpoint %s (%.2f GB in %.1f s, %.2f GB/s)%s", info.path, info.bytes / 1e9, info.seconds,
    info.bytes / 1e9 / math.max(info.seconds, 1e-9), why and (" " .. why) or "")
end

note("training %s (%.1fM parameters, %s, %s) on %s: %d train / %d val tokens, batch %d x %d, steps %d..%d",
  opt.preset, m:num_parameters() / 1e6, opt.precision, m.impl, opt.data, #train, #val, opt.batch, opt.context,
  start + 1, opt.steps)

-- The sweep's configurations are the stretches of steps between two evaluations.
local stretches = {}
do
  local every = opt.eval_every > 0 and opt.eval_every or opt.steps
  local a = start + 1
  while a <= opt.steps do
    local b = math.min(opt.steps, (a - 1) // every * every + every)
    stretches[#stretches + 1] = { a, b }
    a = b + 1
  end
end
local costs = {}
for i, st in ipairs(stretches) do costs[i] = st[2] - st[1] + 1 end
local sweep = tf.report.sweep{ total = #stretches, json = results_path, results = rows, costs = costs, lines = true,
  extra = { key = { "step" }, metrics = { "val_loss", "train_loss" }, model = cfg, precision = opt.precision,
    impl = m.impl, peak_tflops = peak, resumed_from = opt.resume and start or nil } }

local step = start
local stopped
for _, st in ipairs(stretches) do
  sweep:start("steps %d..%d", st[1], st[2])
  while step < st[2] do
    step = step + 1
    local x, y = train:batch(opt.batch, opt.context)
    local loss = m:step(x, y)
    window_steps = window_steps + 1
    local at_eval = step == st[2]
    if step % opt.log_every == 0 or at_eval then
      local l = loss:item() -- waits for the step
      window_loss, window_n = window_loss + l, window_n + 1
      local tps = window_steps * tokens_per_step / ((tf.now() - t_window) / 1e3)
      local mfu = peak and (tps / tokens_per_step * flops_per_step) / (peak * 1e12) or nil
      local norm = m:last_grad_norm()
      note("step %d/%d  loss %.4f  lr %.2e  norm %.3f  %.0f tokens/s%s  %.0f s, about %.0f s left", step, opt.steps,
        l, m:optimizer().lr, norm and norm:item() or 0 / 0, tps, mfu and string.format("  MFU %.1f%%", 100 * mfu) or "",
        seconds(), (opt.steps - step) * tokens_per_step / tps)
      if at_eval then
        local v = evaluate()
        rows[#rows + 1] = { step = step, tokens = tokens_before + (step - start) * tokens_per_step,
          elapsed_s = seconds(), train_loss = window_loss / window_n, val_loss = v, lr = m:optimizer().lr,
          tokens_per_s = tps, mfu = mfu }
        window_loss, window_n = 0, 0
        note("step %d: validation loss %.4f (%d windows of %d)", step, v, eval_windows, opt.context)
        plot()
      end
      t_window, window_steps = tf.now(), 0
    end
    if opt.checkpoint_every > 0 and step % opt.checkpoint_every == 0 and step < opt.steps then save(step) end
    if tf.interrupted() then
      stopped = "interrupted"
    elseif tf.now() > deadline then
      stopped = "time limit"
    end
    if stopped then break end
  end
  if step == st[2] then sweep:done() end
  if stopped then break end
end
save(step, stopped and ("(" .. stopped .. ")") or nil)
if not stopped then
  sweep:finish()
else -- the rows so far, marked incomplete
  sweep:write(false, { stopped = stopped, step = step })
end
local last = rows[#rows]
tf.report.table(rows, { columns = { "step", "tokens", { "elapsed_s", "seconds", "%.1f" },
  { "train_loss", "train loss", "%.4f" }, { "val_loss", "validation loss", "%.4f" },
  { "tokens_per_s", "tokens/s", "%.0f" },
  { "mfu", "MFU", function(v) return v and string.format("%.1f%%", 100 * v) or "" end } },
  title = "Training " .. opt.preset })
note("%s at step %d%s; results in %s, curves in %s/loss.svg", stopped or "done", step,
  last and last.val_loss and string.format(", validation loss %.4f", last.val_loss) or "", results_path, opt.out)
log:close()
if stopped == "interrupted" then tf.exit(130) end
