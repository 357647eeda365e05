--- ddp: data-parallel training, the ways of averaging gradients side by side.
-- Every rank trains the same model on its own batch (tfhost --nproc N); the
-- variants differ in how the gradients travel: one all-reduce per parameter
-- after the backward pass, one of the flat buffer after it, one per
-- parameter overlapped with the pass, buckets of bucket_mb overlapped with
-- it, and ZeRO-1 (buckets, plus AdamW's state sharded over the ranks).
--
-- Per variant: the step time (the slowest rank's median), the time the
-- step spends more than the same step without communication ("exposed"),
-- the communication's own time (one all-reduce of every gradient alone),
-- how much of it the overlap hides (1 - exposed / communication), and the
-- peak memory and optimizer memory per rank.
--
--   tfhost --nproc 2 experiments/ddp.lua --json ddp.json                  # GPUs: one per rank
--   tfhost --nproc 2 --device cpu experiments/ddp.lua --bucket_mb 1,5,25
local opt = tf.options{
  description = "Data-parallel training step per gradient sync (per_param, flat, overlap, bucket, zero1) over the "
    .. "ranks of the run: step time, communication exposed and hidden, memory per rank.",
  { "size", "model preset (xl is the course's; tiny runs anywhere)", default = "xl", cpu = "tiny" },
  { "context", "sequence length", default = 512, cpu = 64, min = 1 },
  { "batch", "sequences per rank", default = 4, min = 1 },
  { "precision", "f32, bf16 or f16 (mixed)", default = "f32", choices = { "f32", "bf16", "f16" } },
  { "variants", "what to run: none (no communication: the baseline), per_param, flat, overlap, bucket, zero1",
    default = "none,per_param,flat,overlap,bucket,zero1", type = "list" },
  { "bucket_mb", "bucket sizes of the bucket and zero1 variants (MB)", default = "25", type = "list:number",
    min = 0 },
  { "warmup", "untimed steps per variant", default = 2, cpu = 1, min = 0 },
  { "steps", "timed steps per variant", default = 5, cpu = 3, min = 1 },
  { "json", "write the rows (as each variant finishes) and the environment to this file (rank 0)",
    type = "string" },
  { "plot", "draw step time and exposed communication against bucket size to this HTML page (rank 0)",
    type = "string" },
}

local rank, world = tf.dist.rank(), tf.dist.world_size()
local device = tf.default_device()
local size, context = opt.size, opt.context
if not tf.model.presets[size] then tf.exit(2, "ddp.lua: unknown size '" .. size .. "'\n") end
local SYNCS = { per_param = true, flat = true, overlap = true, bucket = true }
for _, v in ipairs(opt.variants) do
  if v ~= "none" and v ~= "zero1" and not SYNCS[v] then
    error("ddp: unknown variant '" .. v .. "' (none, per_param, flat, overlap, bucket, zero1)", 0)
  end
end
local function say(...)
  if rank == 0 then print(string.format(...)) end
end
say("data parallel over %d rank(s) on %s: %s, context %d, batch %d per rank, %s", world, tf.device(), size, context,
  opt.batch, opt.precision)
if world == 1 then say("a world of one communicates nothing: start several ranks with tfhost --nproc N") end

-- Each rank its own batch (seeded by rank), the same model everywhere.
local vocab = tf.model.config({ preset = size }).vocab_size
tf.seed(1000 + rank)
local ids = tf.randint(0, vocab, { opt.batch, context }, { device = device })
local targets = tf.randint(0, vocab, { opt.batch, context }, { device = device })
local align_t = tf.zeros(1, { device = device })
local function align()
  if tf.dist.info().mpi or world == 1 then tf.dist.barrier() else tf.dist.all_reduce(align_t) end
end
local function slowest(ms)
  local t = tf.full({ 1 }, ms, { dtype = "f64", device = tf.dist.info().mpi and "cpu" or device })
  tf.dist.all_reduce(t, "max")
  return t:item()
end

-- The runs: one per variant, one per bucket size for the bucketed ones.
local runs = {}
for _, v in ipairs(opt.variants) do
  if v == "bucket" or v == "zero1" then
    for _, mb in ipairs(opt.bucket_mb) do
      runs[#runs + 1] = { variant = v, parallel = v == "zero1" and "zero1" or "ddp", grad_sync = "bucket", bucket_mb = mb }
    end
  else
    runs[#runs + 1] = { variant = v, parallel = v ~= "none" and "ddp" or nil, grad_sync = v ~= "none" and v or nil }
  end
end

-- Every variant's step, the baseline's too: loss, backward (with the
-- variant's gradient sync), then AdamW. (A data-parallel step cannot run
-- AdamW beside the backward pass, as m:step does on one GPU: the baseline
-- does not either, so that the difference is the communication alone.)
local function step(m)
  local o = m:optimizer()
  m:loss(ids, targets)
  m:backward()
  o:step()
  o:zero_grad()
end

-- A first model's steps, untimed: the allocator's cache, the BLAS's and
-- the communication library's buffers warm up before any variant is timed.
do
  tf.seed(1)
  local m = tf.model.new({ preset = size, context_length = context, precision = opt.precision, device = device })
  for _ = 1, math.max(2, opt.warmup) do step(m) end
  if m.engine then m.engine:free() end
end

local rows, baseline_ms, baseline_std_ms, comm_ms = {}, nil, nil, nil
-- progress and the rows so far from rank 0 (the others run the same steps)
local sweep = tf.report.sweep{ total = #runs, json = rank == 0 and opt.json or nil, results = rows,
  out = rank == 0 and io.stderr or false,
  extra = { key = { "variant", "bucket_mb", "world_size", "size", "context", "batch", "precision" },
    metrics = { "step_ms", "exposed_ms", "hidden_pct", "peak_mib" } } }
for _, run in ipairs(runs) do
  sweep:start("%s%s", run.variant, run.bucket_mb and string.format(" %g MB", run.bucket_mb) or "")
  collectgarbage()
  tf.mem.reset_peak()
  tf.seed(1)
  local ok, m = pcall(tf.model.new, { preset = size, context_length = context, precision = opt.precision,
    device = device, parallel = run.parallel, grad_sync = run.grad_sync, bucket_mb = run.bucket_mb })
  if not ok then error(m, 0) end
  local step_ok, stats = pcall(tf.bench, function() step(m) end,
    { warmup = opt.warmup, iters = opt.steps, setup = align })
  local row = { variant = run.variant, bucket_mb = run.bucket_mb, world_size = world, size = size, context = context,
    batch = opt.batch, precision = opt.precision }
  if not step_ok then
    if not tf.mem.is_oom(stats) then error(stats, 0) end
    row.oom, row.step_ms = true, "OOM"
  else
    row.step_ms, row.step_min_ms, row.step_std_ms = slowest(stats.median), slowest(stats.min), slowest(stats.std)
    local mem = m.engine and m.engine:memory() or {}
    row.optimizer_mib = (mem.optimizer or 0) / 2 ^ 20
    row.peak_mib = slowest(tf.mem.stats(device).peak_allocated / 2 ^ 20)
    if run.variant == "none" then baseline_ms, baseline_std_ms = row.step_ms, row.step_std_ms end
    if not comm_ms and m.engine then
      -- the communication alone: every gradient in one all-reduce
      local grads = tf.zeros(m:num_parameters(), { device = device })
      comm_ms = slowest(tf.bench(function() tf.dist.all_reduce(grads, "avg") end,
        { warmup = 1, iters = opt.steps, setup = align }).median)
      grads:free()
    end
  end
  rows[#rows + 1] = row
  if m.engine then m.engine:free() end
  sweep:done(row.oom and "OOM" or "done")
end
for _, row in ipairs(rows) do
  if not row.oom then
    row.comm_ms = comm_ms
    if baseline_ms and row.variant ~= "none" then
      row.exposed_ms = math.max(0, row.step_ms - baseline_ms)
      if world > 1 and comm_ms and comm_ms > 0 then row.hidden_pct = 100 * math.max(0, 1 - row.exposed_ms / comm_ms) end
    end
  end
end

if rank == 0 then
  tf.report.table(rows, { columns = { "variant", { "bucket_mb", "bucket MB" }, { "world_size", "ranks" },
    { "step_ms", "step ms", "%.2f" }, { "exposed_ms", "exposed ms", function(v, row)
      -- a step slower than the baseline by less than their spreads: nothing measurable is exposed
      local noise = select(2, tf.report.noise(row.step_ms, baseline_ms, row.step_std_ms, baseline_std_ms))
      return string.format("%.2f", v) .. (noise and " (" .. noise .. ")" or "") end },
    { "comm_ms", "comm alone ms", "%.2f" }, { "hidden_pct", "hidden %", "%.0f" }, { "peak_mib", "peak MiB", "%.1f" },
    { "optimizer_mib", "optimizer MiB", "%.1f" } } })
  sweep:finish()
  if opt.plot then -- the bucket-size sweep (bucket and zero1 rows)
    local swept = {}
    for _, row in ipairs(rows) do
      if row.bucket_mb then swept[#swept + 1] = row end
    end
    tf.plot.sweep(opt.plot, swept, { x = { "bucket_mb" }, y = { "step_ms", "exposed_ms" }, series = { "variant" },
      title = string.format("data parallel over %d ranks, %s ctx %d batch %d", world, size, context, opt.batch) })
    print("wrote " .. opt.plot)
  end
end
