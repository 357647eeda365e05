--- Kernel profile of the Transformer LM (CS336 nsys_profile, questions a-e),
-- from tfhost's own collector (tf.prof) instead of nsys: for each model size
-- and context length, after warm-up, a few forward passes and full training
-- steps (forward, loss, backward, AdamW) are recorded, and the kernel records
-- answer
--   a. forward pass and training step: the kernels' summed time, the time
--      they kept the device busy (the union of their intervals: kernels on
--      two streams count once) and the wall time, and the busy share of it;
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
--   tfhost experiments/profile_kernels.lua --size small --context 512 --roofline --out /tmp/roof   (GPU counters)
-- With --roofline, one training step of each implementation is profiled again under the hardware
-- counters (tf.prof.count with metrics = "roofline": the step runs once per counting pass, two
-- steps in all): where each kernel class stands against the device's ceilings (tf.ceilings), as a
-- table and as roofline pictures.
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
  { "precision", "precision", default = "f32", choices = { "f32", "bf16", "f16", "fp8" } },
  { "batch", "batch size", default = 4 },
  { "vocab", "vocabulary size", default = 10000 },
  { "warmup", "warm-up training steps", default = 3 },
  { "passes", "profiled forward passes and training steps", default = 3 },
  { "top", "rows in the per-configuration kernel lists", default = 5 },
  { "min_pct", "share of the forward pass (%) a non-GEMM kernel needs to be listed in (c)", default = 1.0 },
  { "trace", "write a Chrome trace (Perfetto) per configuration into this folder", type = "string" },
  { "memory_limit", "cap the device memory tfhost may reserve, in GiB (0: none)", default = 0.0 },
  { "json", "write the rows and the environment to this file", type = "string" },
  { "plot", "draw kernel and host time and the GEMM share against context length into this file (.svg or .html)",
    type = "string" },
  { "roofline", "also count one training step of the fused engine and one of the eager model (the first --size and "
    .. "--context) with the GPU's hardware counters: their roofline tables, and roofline_fused and roofline_eager "
    .. ".svg and .html in --out", default = false },
  { "out", "the folder --roofline writes its pictures into", default = "profile_kernels", type = "string" },
  { "max_kernels", "kernels --roofline counts in a step (tf.prof.start's max_kernels; past it they are lost)",
    default = 4096, min = 1 },
  { "sass", "with --roofline, also count the CUDA cores' FLOPs (tf.prof.count's sass = true: one more step with "
    .. "each kernel replayed, slow where the model holds much memory; without it those FLOPs are left out and the "
    .. "rows say so)", default = false },
}
local sizes = opt.size
if #sizes == 1 and sizes[1] == "all" then sizes = tf.model.preset_names end
for _, s in ipairs(sizes) do
  if not tf.model.presets[s] then tf.exit(2, "profile_kernels.lua: unknown size '" .. s .. "'\n") end
end
if opt.passes < 1 then tf.exit(2, "profile_kernels.lua: --passes must be >= 1\n") end
if opt.min_pct < 0 or opt.min_pct > 100 then tf.exit(2, "profile_kernels.lua: --min_pct must be in [0, 100]\n") end
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

-- The instances of range name, and among them the one of median wall time
-- (the lower middle for an even count): a row's kernel, busy and wall
-- times are one pass's, so that busy <= wall and busy <= kernel hold in it.
local function median_pass(p, name)
  local list = {}
  for _, r in ipairs(p:ranges{ instances = true }) do
    if r.name == name then list[#list + 1] = r end
  end
  table.sort(list, function(x, y) return x.wall_ms < y.wall_ms end)
  return list[(#list + 1) // 2], list
end

-- What the text under the tables needs and the results file does not keep
-- (kernel names ranked by time), by row.
local notes = {}

-- One configuration: warm-up, then `passes` forward passes and training
-- steps under the collector, each range waiting for its kernels.
-- The model of one configuration, its batch, after `warmup` training steps.
local function warm_model(size, ctx, impl, warmup)
  tf.seed(0)
  local m = tf.model.new{ preset = size, context_length = ctx, vocab_size = opt.vocab, precision = opt.precision,
    impl = impl, attention = impl == "fused" and opt.attention or nil }
  local ids = tf.randint(0, opt.vocab, { opt.batch, ctx })
  local targets = tf.randint(0, opt.vocab, { opt.batch, ctx })
  for _ = 1, warmup do m:step(ids, targets):free() end
  return m, ids, targets
end

local function profile(size, ctx, impl)
  local m, ids, targets = warm_model(size, ctx, impl, opt.warmup)
  m:forward(ids):free()
  tf.sync()
  local p <close> = tf.prof.start{}
  for _ = 1, opt.passes do
    tf.range("forward pass", function()
      m:forward(ids):free()
      tf.sync()
    end)
  end
  for _ = 1, opt.passes do
    tf.range("training step", function()
      m:step(ids, targets):free()
      tf.sync()
    end)
  end
  p:stop()
  if opt.trace then p:trace(string.format("%s/%s_ctx%d_%s.json", opt.trace, size, ctx, impl)) end

  local n = opt.passes
  local fwd = kernels_within(p, { "forward pass" })
  local step = kernels_within(p, { "training step" })
  local row = { size = size, context = ctx, impl = m.impl, attention = m.attention or "naive", passes = n,
    gpu = p.gpu }
  local fwd_pass, fwd_passes = median_pass(p, "forward pass")
  local step_pass = median_pass(p, "training step")
  row.fwd_host_ms, row.fwd_kernel_ms, row.fwd_busy_ms = fwd_pass.wall_ms, fwd_pass.gpu_ms, fwd_pass.busy_ms
  row.step_host_ms, row.step_kernel_ms, row.step_busy_ms = step_pass.wall_ms, step_pass.gpu_ms, step_pass.busy_ms
  row.fwd_kernels = 0
  for _, r in ipairs(fwd) do row.fwd_kernels = row.fwd_kernels + r.instances end
  row.fwd_kernels = row.fwd_kernels / n
  if fwd[1] then
    row.fwd_top, row.fwd_top_class = fwd[1].name, fwd[1].class
    row.fwd_top_per_pass, row.fwd_top_pct = fwd[1].instances / n, fwd[1].pct
  end
  if step[1] then row.step_top, row.step_top_pct = step[1].name, step[1].pct end
  row.same_leader = row.fwd_top ~= nil and row.fwd_top == row.step_top
  row.non_gemm = {}
  local note = { kernels = #fwd }
  notes[row] = note
  for _, r in ipairs(fwd) do
    if r.class ~= "gemm" then
      if not note.top_non_gemm then note.top_non_gemm = r end
      if r.pct >= opt.min_pct and #row.non_gemm < opt.top then
        row.non_gemm[#row.non_gemm + 1] = { name = r.name, class = r.class, pct = r.pct, per_pass_ms = r.total_ms / n }
      end
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
    -- the spread of the ratio over the passes, for the text under table (e)
    for _, pass in ipairs(fwd_passes) do
      local function in_pass(name) return total_ms(p:kernels{ instance = pass.id, range = name }) end
      local mm = in_pass("computing attention scores") + in_pass("final matmul")
      if mm > 0 then
        local ratio = in_pass("computing softmax") / mm
        row.min_time_ratio = math.min(row.min_time_ratio or ratio, ratio)
        row.max_time_ratio = math.max(row.max_time_ratio or ratio, ratio)
      end
    end
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
-- The rows as the tables show them: an OOM row says OOM in every column
-- past the configuration.
local shown, ran = {}, {}
for i, r in ipairs(rows) do
  if r.oom then
    shown[i] = setmetatable({ size = r.size, context = r.context, impl = r.impl }, { __index = function() return "OOM" end })
  else
    shown[i] = r
    ran[#ran + 1] = r
  end
end

-- ---- the text under the tables, computed from the rows -------------------------------------

local function config(r) return string.format("%s ctx %d %s", r.size, r.context, r.impl) end
-- "a", "a and b", "a, b and c"
local function listing(items)
  if #items <= 1 then return items[1] or "" end
  return table.concat(items, ", ", 1, #items - 1) .. " and " .. items[#items]
end
local function busy_pct(busy, wall) return wall > 0 and 100 * busy / wall or 0 end
-- "85.2 %" or "85.2 % to 97.1 %": the range of f over the rows that ran
local function spread(f, fmt)
  local lo, hi
  for _, r in ipairs(ran) do
    local v = f(r)
    lo, hi = math.min(lo or v, v), math.max(hi or v, v)
  end
  local a, b = string.format(fmt, lo), string.format(fmt, hi)
  return a == b and a or a .. " to " .. b
end
local any_gpu = false
for _, r in ipairs(ran) do any_gpu = any_gpu or r.gpu end
local device_word = any_gpu and "GPU" or gpu and "GPU (host timings only: no kernel records)"
  or "CPU (its ops timed on the host)"
local all_oom = "Every configuration ran out of memory: there is nothing to show."

print(string.format("# Kernel profile: batch %d, %s, device %s, %d profiled passes after %d warm-up steps\n",
  opt.batch, opt.precision, tf.device(), opt.passes, opt.warmup))
print("## (a) Forward pass and training step: kernel time, busy time and wall time\n")
local function pct_of(busy, wall)
  return oomable(function(_, row) return string.format("%.1f", busy_pct(row[busy], row[wall])) end)
end
tf.report.table(shown, { columns = cols{
  { "fwd_kernel_ms", "fwd kernel ms", oomable("%.3f") }, { "fwd_busy_ms", "fwd busy ms", oomable("%.3f") },
  { "fwd_host_ms", "fwd wall ms", oomable("%.3f") }, { "fwd_busy_ms", "fwd busy %", pct_of("fwd_busy_ms", "fwd_host_ms") },
  { "step_kernel_ms", "step kernel ms", oomable("%.3f") }, { "step_busy_ms", "step busy ms", oomable("%.3f") },
  { "step_host_ms", "step wall ms", oomable("%.3f") },
  { "step_busy_ms", "step busy %", pct_of("step_busy_ms", "step_host_ms") },
  { "fwd_kernels", "kernels/pass", oomable("%.0f") } } })
print(string.format("\nKernel ms sums the durations of the kernels launched in one forward pass (training step); busy "
  .. "ms is how long the device ran at least one of them (the union of their intervals: kernels that ran at the same "
  .. "time count once); wall ms is the pass's time on the host clock, up to a synchronisation; busy %% is busy ms "
  .. "over wall ms. Each row is the pass (step) of median wall time of %d.", opt.passes))
if #ran == 0 then
  print(all_oom)
else
  print(string.format("The %s was busy %s of the forward pass's wall time and %s of the training step's; the rest is "
    .. "launch gaps and host work.", device_word,
    spread(function(r) return busy_pct(r.fwd_busy_ms, r.fwd_host_ms) end, "%.1f %%"),
    spread(function(r) return busy_pct(r.step_busy_ms, r.step_host_ms) end, "%.1f %%")))
  local overlapped = {}
  for _, r in ipairs(ran) do
    for _, part in ipairs({ { "forward pass", "fwd" }, { "training step", "step" } }) do
      local k, b = r[part[2] .. "_kernel_ms"], r[part[2] .. "_busy_ms"]
      if k > b * 1.001 then
        overlapped[#overlapped + 1] = string.format("the %s of %s (kernel time %.2fx the busy time)", part[1],
          config(r), k / b)
      end
    end
  end
  if #overlapped > 0 then
    print("Kernels ran at the same time (on two streams) in " .. listing(overlapped) .. ": there the summed kernel "
      .. "time is more than the time the device was busy.")
  else
    print("No kernels ran at the same time: kernel ms is within 0.1 % of busy ms in every row.")
  end
end

print("\n## (b) The kernel that takes the most time\n")
tf.report.table(shown, { columns = cols{
  { "fwd_top", "forward: top kernel", oomable("%s") }, { "fwd_top_per_pass", "instances/pass", oomable("%.0f") },
  { "fwd_top_pct", "% of fwd", oomable("%.1f") }, { "step_top", "training step: top kernel", oomable("%s") },
  { "step_top_pct", "% of step", oomable("%.1f") }, { "same_leader", "same", oomable(function(v)
    return v and "yes" or "no" end) } } })
if #ran == 0 then print("\n" .. all_oom) end

local min_pct = string.format("%g%%", opt.min_pct)
print("\n## (c) Non-GEMM kernels with at least " .. min_pct .. " of the forward pass\n")
local c_rows, without = {}, {}
for _, r in ipairs(rows) do
  for _, k in ipairs(r.non_gemm or {}) do
    c_rows[#c_rows + 1] = { size = r.size, context = r.context, impl = r.impl, kernel = k.name, class = k.class,
      pct = k.pct, ms = k.per_pass_ms }
  end
  if not r.oom and #r.non_gemm == 0 then
    local note = notes[r]
    local why
    if note.kernels == 0 then
      why = "no kernels were recorded"
    elseif not note.top_non_gemm then
      why = "every kernel is a GEMM"
    else
      why = string.format("the largest, %s, has %.2f %%", note.top_non_gemm.name, note.top_non_gemm.pct)
    end
    without[#without + 1] = config(r) .. " (" .. why .. ")"
  end
end
tf.report.table(c_rows, { columns = cols{ "kernel", "class", { "pct", "% of fwd", "%.1f" },
  { "ms", "ms/pass", "%.3f" } } })
if #ran == 0 then
  print("\nThe table is empty: every configuration ran out of memory.")
elseif #c_rows == 0 then
  print(string.format("\nThe table is empty: no non-GEMM kernel has %s of the forward pass in any configuration: %s.",
    min_pct, listing(without)))
elseif #without > 0 then
  print(string.format("\nNo non-GEMM kernel has %s of the forward pass in %s.", min_pct, listing(without)))
end

print("\n## (d) GEMM share of kernel time: forward only vs a training step\n")
local function class_pct(which, class)
  return { which, class, oomable(function(v) return string.format("%.1f", v[class] or 0) end) }
end
tf.report.table(shown, { columns = cols{
  { "fwd_gemm_pct", "fwd gemm %", oomable("%.1f") }, { "step_gemm_pct", "step gemm %", oomable("%.1f") },
  class_pct("step_classes", "elementwise"), class_pct("step_classes", "softmax"), class_pct("step_classes", "norm"),
  class_pct("step_classes", "reduction"), class_pct("step_classes", "optimizer"), class_pct("step_classes", "copy") } })
print("\nThe shares are of summed kernel time; the class columns are percentages of the training step's.")
if #ran == 0 then print(all_oom) end

print("\n## (e) Attention in the forward pass: softmax vs the two matmuls\n")
local e_rows, left_out = {}, {}
for _, r in ipairs(rows) do
  if r.time_ratio then
    e_rows[#e_rows + 1] = r
  elseif r.oom then
    left_out[#left_out + 1] = config(r) .. " (out of memory)"
  elseif r.attention == "flash" then
    left_out[#left_out + 1] = config(r) .. " (FlashAttention: softmax and the matmuls are one kernel)"
  else
    left_out[#left_out + 1] = config(r) .. " (no kernels in the attention's ranges)"
  end
end
tf.report.table(e_rows, { columns = cols{
  { "softmax_ms", "softmax ms", "%.3f" }, { "matmuls_ms", "QK^T + PV ms", "%.3f" },
  { "time_ratio", "time ratio", "%.3f" }, { "flop_ratio", "FLOP ratio", "%.4f" } } })
print("\nTime ratio: softmax's kernel time over the two matmuls' (their spread over the passes decides the words "
  .. "below); FLOP ratio: softmax's 5 FLOPs per score over the matmuls' 2 x head_dim per score each.")
if #left_out > 0 then print("Not in the table: " .. listing(left_out) .. ".") end
if #e_rows == 0 then
  print("The table is empty: no configuration ran the naive attention with kernels in its ranges.")
else
  local larger, smaller, within = {}, {}, {}
  for _, r in ipairs(e_rows) do
    local lo, hi = r.min_time_ratio or r.time_ratio, r.max_time_ratio or r.time_ratio
    local text = string.format("%s (%.3f against %.4f)", config(r), r.time_ratio, r.flop_ratio)
    if lo > r.flop_ratio then
      larger[#larger + 1] = text
    elseif hi < r.flop_ratio then
      smaller[#smaller + 1] = text
    else
      within[#within + 1] = string.format("%s (%.3f to %.3f over the passes, against %.4f)", config(r), lo, hi,
        r.flop_ratio)
    end
  end
  if #larger > 0 then
    print("Softmax takes a larger share of the time than of the FLOPs in " .. listing(larger) .. ": per FLOP it "
      .. "is the slower, reading and writing the (seq x seq) scores with little arithmetic on each.")
  end
  if #smaller > 0 then
    print("Softmax takes a smaller share of the time than of the FLOPs in " .. listing(smaller) .. ": per FLOP, "
      .. "the two matmuls are the slower there.")
  end
  if #within > 0 then
    print("Softmax's share of the time is that of its FLOPs within the spread of the passes in " .. listing(within)
      .. ".")
  end
end
-- ---- --roofline: one training step of each implementation under the hardware counters ------------

-- One training step of impl counted: its rows by class and by name, the ceilings, and how many of
-- its kernels were not counted; or nil and why not.
local function counted_step(size, ctx, impl)
  local m, ids, targets = warm_model(size, ctx, impl, math.max(1, opt.warmup))
  tf.sync()
  -- The step runs once per counting pass (tf.prof.count): replaying each kernel instead would save and
  -- restore all the memory the model holds around every kernel.
  local counted_ok, p = pcall(tf.prof.count, function()
    tf.range("training step", function()
      m:step(ids, targets):free()
      tf.sync()
    end)
  end, { metrics = "roofline", max_kernels = opt.max_kernels, sass = opt.sass })
  if not counted_ok then
    if tf.mem.is_oom(p) then error(p, 0) end
    return nil, tostring(p)
  end
  local kernels = p:records().kernels or {}
  local counted = 0
  for _, k in ipairs(kernels) do
    if k.counters ~= nil then counted = counted + 1 end
  end
  return { by_class = p:kernels{ range = "training step", by = "class" },
    by_name = p:kernels{ range = "training step", by = "name" },
    ceilings = p.ceilings or tf.ceilings.get(), kernels = #kernels, lost = #kernels - counted }
end

-- "fp8 1300.0 TFLOP/s, bf16 790.0 TFLOP/s, ...": the compute ceilings the device has.
local function ceiling_text(c)
  local parts = {}
  for _, k in ipairs(tf.roofline.compute) do
    if c[k] then parts[#parts + 1] = string.format("%s %.1f TFLOP/s", k, c[k]) end
  end
  return table.concat(parts, ", ")
end

local roofline_rows
if opt.roofline then
  print("\n## Roofline: one training step under the hardware counters\n")
  local no_counters = not gpu and "the device is the CPU" or not ok_prof and tostring(why) or nil
  if no_counters then
    print("The roofline needs a GPU's hardware counters (tf.prof.start{metrics = \"roofline\"}), and " .. no_counters
      .. ": this part is skipped.")
  else
    local size, ctx = sizes[1], opt.context[1]
    tf.mkdir(opt.out)
    roofline_rows = {}
    for _, impl in ipairs({ "fused", "eager" }) do
      progress("roofline: %s ctx %d %s ...", size, ctx, impl)
      local t0 = tf.now()
      local ok, got, why_not = pcall(counted_step, size, ctx, impl)
      if not ok and not tf.mem.is_oom(got) then error(got, 0) end
      progress(" %s (%.1f s)\n", ok and (got and "done" or "not counted") or "OOM", (tf.now() - t0) / 1e3)
      local what = string.format("%s ctx %d %s, one training step, %s", size, ctx, impl, opt.precision)
      if not ok then
        print(string.format("### %s\n\nOut of memory.\n", what))
      elseif not got then
        print(string.format("### %s\n\nThe counters could not start: %s\n", what, why_not))
      else
        local c = got.ceilings
        local tbl = tf.roofline.table(got.by_class, { ceilings = c })
        roofline_rows[impl] = tbl
        tf.report.table(tbl, { columns = tf.roofline.columns, title = what .. ": by kernel class" })
        local top = {}
        for i = 1, math.min(opt.top, #got.by_name) do top[i] = got.by_name[i] end
        print()
        tf.report.table(tf.roofline.table(top, { ceilings = c }), { columns = tf.roofline.columns,
          title = string.format("%s: the %d kernels with the most time", what, #top) })
        print(string.format("\nCeilings of %s (%s): %s; copy %.0f GB/s. \"of roof\" is the achieved rate over the "
          .. "roof at the row's intensity (the ceiling of its precision, or the copy rate times the intensity); "
          .. "bound is the side of that ceiling's ridge point.", tostring(c.device), tostring(c.source or "given"),
          ceiling_text(c), c.copy))
        if got.lost > 0 then
          print(string.format("%d of the step's %d kernels were not counted (past --max_kernels %d): the rows leave "
            .. "them out.", got.lost, got.kernels, opt.max_kernels))
        end
        for _, ext in ipairs({ "svg", "html" }) do
          local path = string.format("%s/roofline_%s.%s", opt.out, impl, ext)
          tf.roofline.plot(got.by_class, { ceilings = c, path = path, title = "Roofline: " .. what })
          print("wrote " .. path)
        end
        print()
      end
      tf.mem.empty_cache()
    end
  end
end

if opt.json then
  tf.results.write(opt.json, rows, { options = opt, key = { "size", "context", "impl", "attention" },
    metrics = { "fwd_kernel_ms", "fwd_host_ms", "step_kernel_ms", "fwd_gemm_pct", "step_gemm_pct" },
    roofline = roofline_rows })
  print("wrote " .. opt.json)
end
if opt.plot then
  tf.plot.sweep(opt.plot, rows, { x = { "context", "size" },
    y = { "fwd_kernel_ms", "fwd_host_ms", "step_kernel_ms", "fwd_gemm_pct", "step_gemm_pct", "time_ratio" },
    series = { "size", "impl" }, title = string.format("Kernel profile, batch %d, %s", opt.batch, opt.precision) })
  print("wrote " .. opt.plot)
end
