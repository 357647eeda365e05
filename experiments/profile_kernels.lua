--- Kernel profile of the Transformer LM (CS336 nsys_profile, questions a-e),
-- from tfhost's own collector (tf.prof) instead of nsys: for each model size
-- and context length, after warm-up, a few forward passes and full training
-- steps (forward, loss, backward, AdamW) are recorded, and the kernel records
-- answer
--   a. forward time from the kernel records vs the host timer;
--   b. the kernel with the most GPU time in the forward pass, its instances
--      per pass, and whether it also leads the training step;
--   c. the non-GEMM kernels with non-trivial time in the forward pass;
--   d. the GEMM share of GPU time, forward-only vs a training step;
--   e. inside attention: softmax time vs the two matmuls, beside their FLOPs.
-- Both implementations run: eager (one kernel per op, like PyTorch) and the
-- fused engine; their difference is a finding of its own.
--
--   tfhost experiments/profile_kernels.lua --size small,2.7B --context 128,512
--   tfhost experiments/profile_kernels.lua --size tiny --context 32 --trace /tmp/traces   (CPU: host-timed ops)
-- On the CPU the defaults are the sizes a CPU finishes in seconds.
local gpu = tf.default_device() ~= "cpu" -- what runs here (--device cpu on a GPU machine too)
local opt = tf.options{
  description = "Which kernels a Transformer LM forward pass and training step spend their time in.",
  { "size", "model sizes (small, medium, large, xl, 2.7B, or all; tiny for a quick CPU run; on a CPU the "
    .. "default is tiny)", default = gpu and "small,medium,large,xl,2.7B" or "tiny", type = "list" },
  { "context", "context lengths (on a CPU the default is 32)", default = gpu and "128,256,512,1024" or "32",
    type = "list:int" },
  { "impl", "implementations", default = "eager,fused", type = "list", choices = { "eager", "fused" } },
  { "attention", "the fused engine's attention (naive shows CS336's softmax vs matmul split)", default = "naive",
    choices = { "naive", "flash" } },
  { "precision", "precision", default = "f32", choices = { "f32", "bf16", "f16" } },
  { "batch", "batch size", default = 4 },
  { "vocab", "vocabulary size", default = 10000 },
  { "warmup", "warm-up training steps", default = 3 },
  { "passes", "profiled forward passes and training steps", default = 3 },
  { "top", "rows in the per-configuration kernel lists", default = 5 },
  { "trace", "write a Chrome trace (Perfetto) per configuration into this folder", type = "string" },
  { "memory_limit", "cap the device memory tfhost may reserve, in GiB (0: none)", default = 0.0 },
  { "json", "write the rows and the environment to this file", type = "string" },
  { "plot", "draw kernel and host time and the GEMM share against context length into this file (.svg or .html)",
    type = "string" },
}
local sizes = opt.size
if #sizes == 1 and sizes[1] == "all" then sizes = tf.model.preset_names end
for _, s in ipairs(sizes) do
  if not tf.model.presets[s] then tf.exit(2, "profile_kernels.lua: unknown size '" .. s .. "'\n") end
end
if opt.passes < 1 then tf.exit(2, "profile_kernels.lua: --passes must be >= 1\n") end
if opt.memory_limit > 0 then tf.mem.set_limit(math.floor(opt.memory_limit * 2 ^ 30)) end
if opt.trace then tf.mkdir(opt.trace) end

local progress = tf.report.progress
local ok_prof, why = tf.prof.available()
if not ok_prof then
  progress("profile_kernels.lua: %s; the tables below are host op timings\n", why)
  tf.prof.start{}:stop() -- the collector's own one-line note, now, not inside a progress line
end

-- GPU time (ms) and rows of kernels launched inside every range in names
-- (all of them open at launch), from the records.
local function kernels_within(p, names, by)
  return p:kernels{ range = names, by = by or "name" }
end

local function total_ms(rows)
  local t = 0
  for _, r in ipairs(rows) do t = t + r.total_ms end
  return t
end

local function share(rows, pred)
  local t, all = 0, 0
  for _, r in ipairs(rows) do
    all = all + r.total_ms
    if pred(r) then t = t + r.total_ms end
  end
  return all > 0 and t / all or 0
end

-- One configuration: warm-up, then `passes` forward passes and training
-- steps under the collector.
local function profile(size, ctx, impl)
  tf.seed(0)
  local m = tf.model.new{ preset = size, context_length = ctx, vocab_size = opt.vocab, precision = opt.precision,
    impl = impl, attention = impl == "fused" and opt.attention or nil }
  local ids = tf.randint(0, opt.vocab, { opt.batch, ctx })
  local targets = tf.randint(0, opt.vocab, { opt.batch, ctx })
  for _ = 1, opt.warmup do m:step(ids, targets):free() end
  m:forward(ids):free()
  tf.sync()
  local host_ms = {}
  local p <close> = tf.prof.start{}
  for i = 1, opt.passes do
    local t0 = tf.now()
    tf.range("forward pass", function() m:forward(ids):free() end)
    tf.sync()
    host_ms[i] = tf.now() - t0
  end
  for _ = 1, opt.passes do
    tf.range("training step", function() m:step(ids, targets):free() end)
  end
  tf.sync()
  p:stop()
  if opt.trace then p:trace(string.format("%s/%s_ctx%d_%s.json", opt.trace, size, ctx, impl)) end

  local n = opt.passes
  local fwd = kernels_within(p, { "forward pass" })
  local step = kernels_within(p, { "training step" })
  local row = { size = size, context = ctx, impl = m.impl, attention = m.attention or "naive", passes = n,
    gpu = p.gpu }
  table.sort(host_ms)
  row.fwd_host_ms = host_ms[(n + 1) // 2]
  row.fwd_kernel_ms = total_ms(fwd) / n
  row.fwd_kernels = 0
  for _, r in ipairs(fwd) do row.fwd_kernels = row.fwd_kernels + r.instances end
  row.fwd_kernels = row.fwd_kernels / n
  row.step_kernel_ms = total_ms(step) / n
  if fwd[1] then
    row.fwd_top, row.fwd_top_class = fwd[1].name, fwd[1].class
    row.fwd_top_per_pass, row.fwd_top_pct = fwd[1].instances / n, fwd[1].pct
  end
  if step[1] then row.step_top, row.step_top_pct = step[1].name, step[1].pct end
  row.same_leader = row.fwd_top ~= nil and row.fwd_top == row.step_top
  row.non_gemm = {}
  for _, r in ipairs(fwd) do
    if r.class ~= "gemm" and r.pct >= 1.0 and #row.non_gemm < opt.top then
      row.non_gemm[#row.non_gemm + 1] = { name = r.name, class = r.class, pct = r.pct, per_pass_ms = r.total_ms / n }
    end
  end
  local function is_gemm(r) return r.class == "gemm" end
  row.fwd_gemm_pct = 100 * share(fwd, is_gemm)
  row.step_gemm_pct = 100 * share(step, is_gemm)
  row.step_classes = {}
  for _, r in ipairs(kernels_within(p, { "training step" }, "class")) do row.step_classes[r.name] = r.pct end
  row.fwd_classes = {}
  for _, r in ipairs(kernels_within(p, { "forward pass" }, "class")) do row.fwd_classes[r.name] = r.pct end
  -- e. attention in the forward pass: softmax vs the two matmuls
  local scores = total_ms(kernels_within(p, { "forward pass", "computing attention scores" }))
  local softmax = total_ms(kernels_within(p, { "forward pass", "computing softmax" }))
  local final = total_ms(kernels_within(p, { "forward pass", "final matmul" }))
  if scores + final > 0 then
    local c = m.config
    local hd = c.d_model // c.num_heads
    local bh = opt.batch * c.num_heads
    local mm_flops = 2 * (2 * bh * ctx * ctx * hd)  -- Q K^T and P V
    local sm_flops = 5 * bh * ctx * ctx             -- max, subtract, exp, sum, divide per score
    row.softmax_ms, row.matmuls_ms = softmax / n, (scores + final) / n
    row.time_ratio = softmax / (scores + final)
    row.flop_ratio = sm_flops / mm_flops
  end
  m = nil
  return row
end

local rows, total, done = {}, #sizes * #opt.context * #opt.impl, 0
for _, size in ipairs(sizes) do
  for _, ctx in ipairs(opt.context) do
    for _, impl in ipairs(opt.impl) do
      done = done + 1
      progress("[%d/%d] %s ctx %d %s ...", done, total, size, ctx, impl)
      local t0 = tf.now()
      local ok, res = pcall(profile, size, ctx, impl)
      if not ok then
        if not tf.mem.is_oom(res) then error(res, 0) end
        res = { size = size, context = ctx, impl = impl, oom = true }
      end
      rows[#rows + 1] = res
      tf.mem.empty_cache()
      progress(" %s (%.1f s)\n", ok and "done" or "OOM", (tf.now() - t0) / 1e3)
    end
  end
end

local function oomable(fmt)
  return function(v, row)
    if row.oom then return "OOM" end
    if v == nil then return "-" end
    return type(fmt) == "function" and fmt(v, row) or string.format(fmt, v)
  end
end
local base = { "size", { "context", "ctx" }, "impl" }
local function cols(list)
  local out = { table.unpack(base) }
  for _, c in ipairs(list) do out[#out + 1] = c end
  return out
end

print(string.format("# Kernel profile: batch %d, %s, device %s, %d profiled passes after %d warm-up steps\n",
  opt.batch, opt.precision, tf.device(), opt.passes, opt.warmup))
print("## (a) Forward pass: kernel time vs host timer\n")
tf.report.table(rows, { columns = cols{
  { "fwd_kernel_ms", "kernel ms", oomable("%.3f") }, { "fwd_host_ms", "host ms", oomable("%.3f") },
  { "fwd_kernels", "kernels/pass", oomable("%.0f") } } })
print("\nKernel ms sums the durations of the kernels launched in one forward pass; host ms is the wall time of the "
  .. "pass with a synchronisation (launch gaps and host work included).")

print("\n## (b) The kernel with the most GPU time\n")
tf.report.table(rows, { columns = cols{
  { "fwd_top", "forward: top kernel", oomable("%s") }, { "fwd_top_per_pass", "instances/pass", oomable("%.0f") },
  { "fwd_top_pct", "% of fwd", oomable("%.1f") }, { "step_top", "training step: top kernel", oomable("%s") },
  { "step_top_pct", "% of step", oomable("%.1f") }, { "same_leader", "same", oomable(function(v)
    return v and "yes" or "no" end) } } })

print("\n## (c) Non-GEMM kernels with at least 1% of the forward pass\n")
local c_rows = {}
for _, r in ipairs(rows) do
  for _, k in ipairs(r.non_gemm or {}) do
    c_rows[#c_rows + 1] = { size = r.size, context = r.context, impl = r.impl, kernel = k.name, class = k.class,
      pct = k.pct, ms = k.per_pass_ms }
  end
end
tf.report.table(c_rows, { columns = cols{ "kernel", "class", { "pct", "% of fwd", "%.1f" },
  { "ms", "ms/pass", "%.3f" } } })

print("\n## (d) GEMM share of GPU time: forward only vs a training step\n")
local function class_pct(which, class)
  return { which, class, oomable(function(v) return string.format("%.1f", v[class] or 0) end) }
end
tf.report.table(rows, { columns = cols{
  { "fwd_gemm_pct", "fwd gemm %", oomable("%.1f") }, { "step_gemm_pct", "step gemm %", oomable("%.1f") },
  class_pct("step_classes", "elementwise"), class_pct("step_classes", "softmax"), class_pct("step_classes", "norm"),
  class_pct("step_classes", "reduction"), class_pct("step_classes", "optimizer"), class_pct("step_classes", "copy") } })
print("\nThe class columns are percentages of the training step's GPU time.")

print("\n## (e) Attention in the forward pass: softmax vs the two matmuls\n")
tf.report.table(rows, { columns = cols{
  { "softmax_ms", "softmax ms", oomable("%.3f") }, { "matmuls_ms", "QK^T + PV ms", oomable("%.3f") },
  { "time_ratio", "time ratio", oomable("%.3f") }, { "flop_ratio", "FLOP ratio", oomable("%.4f") } } })
print("\nSoftmax costs a few FLOPs per score against 2*head_dim per score for each matmul, yet its time is a far "
  .. "larger share: it is bound by memory traffic over the (seq x seq) scores, the matmuls by arithmetic.")
if opt.json then
  tf.results.write(opt.json, rows, { options = opt, key = { "size", "context", "impl", "attention" },
    metrics = { "fwd_kernel_ms", "fwd_host_ms", "step_kernel_ms", "fwd_gemm_pct", "step_gemm_pct" } })
  print("wrote " .. opt.json)
end
if opt.plot then
  tf.plot.sweep(opt.plot, rows, { x = { "context", "size" },
    y = { "fwd_kernel_ms", "fwd_host_ms", "step_kernel_ms", "fwd_gemm_pct", "step_gemm_pct", "time_ratio" },
    series = { "size", "impl" }, title = string.format("Kernel profile, batch %d, %s", opt.batch, opt.precision) })
  print("wrote " .. opt.plot)
end
