--- How fast does the fused engine generate? Prefill time and decode tokens/s (m:generate, greedy,
-- the KV cache and the decode step's CUDA graph) for each model size and batch, against the
-- memory-bandwidth limit: a decode step reads every matmul weight once (the low-precision copy)
-- and the cached keys and values of every layer, so it cannot beat (weight bytes + KV bytes) /
-- copy rate, the copy rate measured in the same run (tf.bench.copy_rate). With --hf, the Hugging
-- Face reference's tokens/s (tests/reference/hf_generate.py --json) go beside each row.
--
--   tfhost experiments/decode_benchmark.lua                            (small..2.7B, batch 1 and 16, bf16)
--   tfhost experiments/decode_benchmark.lua --size 2.7B --batch 1 --json decode.json
--   tfhost experiments/decode_benchmark.lua --hf hf_generate.json     (the reference's rows beside)
--   tfhost experiments/decode_benchmark.lua --size 2.7B --batch 1 --profile   (where a step's time goes)
local opt = tf.options{
  description = "Prefill time and decode tokens/s of m:generate against the memory-bandwidth limit.",
  { "size", "model sizes (small, medium, large, xl, 2.7B; tiny for a quick CPU run)",
    default = "small,medium,large,xl,2.7B", cpu = "tiny", type = "list" },
  { "batch", "batch sizes", default = "1,16", cpu = "1,2", type = "list:int", min = 1 },
  { "precision", "f32, bf16 or f16", default = "bf16", cpu = "f32", type = "string", choices = { "f32", "bf16", "f16" } },
  { "prompt", "prompt tokens a row", default = 128, cpu = 8, min = 1 },
  { "new_tokens", "tokens generated a row (greedy)", default = 256, cpu = 8, min = 2 },
  { "repeats", "timed generations per row of the table (the fastest kept)", default = 3, cpu = 1, min = 1 },
  { "target", "the fraction of the bandwidth limit decode should reach at batch 1", default = 0.8, min = 0 },
  { "hf", "a results file of tests/reference/hf_generate.py: its tokens/s beside ours", type = "string" },
  { "graphs", "CUDA graph replay of the decode step", default = true },
  { "profile", "after the timing, one more generation under tf.prof: a decode step's kernel time by class "
    .. "and the kernels that take the most", default = false },
  { "json", "also write the rows (with the environment) to this file", type = "string" },
}

local on_gpu = tf.cuda.is_available()
tf.report.progress("copy rate ...")
local rate = on_gpu and tf.bench.copy_rate() or nil
tf.report.progress(rate and string.format(" %.0f GB/s\n", rate) or " (not measured on the CPU)\n")

-- The reference's rows by size and batch.
local hf = {}
if opt.hf then
  local f = io.open(opt.hf, "rb") or tf.exit(2, "decode_benchmark.lua: cannot read " .. opt.hf .. "\n")
  local doc = tf.json.decode(f:read("a"))
  f:close()
  for _, r in ipairs(doc.results or doc.rows or doc) do hf[r.size .. "/" .. r.batch] = r end
end

-- Bytes a decode step reads: every matmul weight (the compute dtype) and, at position pos, the
-- pos + 1 cached keys and values of each layer and row.
local function step_bytes(cfg, es, batch, pos)
  local d, f, L, V = cfg.d_model, cfg.d_ff, cfg.num_layers, cfg.vocab_size
  local weights = (L * (4 * d * d + 3 * d * f) + V * d) * es
  return weights, 2 * L * batch * d * (pos + 1) * es
end

-- One more generation under the kernel profiler: the kernels inside the engine's "decode step" ranges
-- (the prefill's left out), by class and by name, per step, into row.profile.
local function profile_step(m, prompt, row)
  local p = tf.prof.start()
  local _, st = m:generate(prompt, { max_new_tokens = opt.new_tokens })
  tf.sync()
  p:stop()
  local steps = st.decode_steps
  local function per_step(list, n)
    local total, out = 0, {}
    for _, r in ipairs(list) do total = total + r.total_ms end
    table.sort(list, function(a, b) return a.total_ms > b.total_ms end)
    for i = 1, math.min(n, #list) do
      local r = list[i]
      out[i] = { name = r.name, class = r.class, per_step = r.instances / steps, us = r.total_ms * 1e3 / steps,
        pct = total > 0 and 100 * r.total_ms / total or 0 }
    end
    return out, total * 1e3 / steps
  end
  local classes, step_us = per_step(p:kernels{ range = "decode step", by = "class" }, math.huge)
  local kernels = per_step(p:kernels{ range = "decode step", by = "name" }, 8)
  row.profile = { steps = steps, kernel_us_per_step = step_us, classes = classes, kernels = kernels,
    ms_per_step_profiled = st.decode_ms / steps }
end

local rows = {}
local es = opt.precision == "f32" and 4 or 2
for _, size in ipairs(opt.size) do
  if not tf.model.presets[size] then tf.exit(2, "decode_benchmark.lua: unknown size '" .. size .. "'\n") end
end
local costs = {}
for _, size in ipairs(opt.size) do
  local cfg = tf.model.config{ preset = size }
  for _ = 1, #opt.batch do costs[#costs + 1] = tf.model.num_parameters(cfg) end
end
local sweep = tf.report.sweep{ total = #costs, json = opt.json, results = rows, costs = costs,
  extra = { options = opt, copy_gbps = rate, key = { "size", "batch" }, metrics = { "prefill_ms", "tokens_per_s" } } }
for _, size in ipairs(opt.size) do
  local m = tf.model.new{ preset = size, context_length = opt.prompt + opt.new_tokens, precision = opt.precision,
    graphs = opt.graphs }
  for _, batch in ipairs(opt.batch) do
    sweep:start("%s batch %d", size, batch)
    tf.seed(1)
    local prompt = tf.randint(0, m.config.vocab_size, { batch, opt.prompt }, { dtype = "i64" })
    m:generate(prompt, { max_new_tokens = opt.new_tokens }) -- the cache made, the decode step captured
    local best
    for _ = 1, opt.repeats do
      local _, st = m:generate(prompt, { max_new_tokens = opt.new_tokens })
      if not best or st.decode_tokens_per_s > best.decode_tokens_per_s then best = st end
    end
    local weights, kv = step_bytes(m.config, es, batch, opt.prompt + opt.new_tokens / 2)
    local steps_per_s = best.decode_tokens_per_s / batch
    local row = { size = size, batch = batch, precision = opt.precision, prompt = opt.prompt,
      new_tokens = opt.new_tokens, prefill_ms = best.prefill_ms, tokens_per_s = best.decode_tokens_per_s,
      ms_per_step = 1e3 / steps_per_s, gb_per_step = (weights + kv) / 1e9, kv_gb_per_step = kv / 1e9 }
    if rate then
      row.limit_tokens_per_s = rate * 1e9 / (weights + kv) * batch
      row.fraction = row.tokens_per_s / row.limit_tokens_per_s
    end
    local ref = hf[size .. "/" .. batch]
    if ref then
      row.hf_tokens_per_s = ref.tokens_per_s
      row.speedup = row.tokens_per_s / ref.tokens_per_s
    end
    if opt.profile then profile_step(m, prompt, row) end
    rows[#rows + 1] = row
    sweep:done()
  end
  m = nil
  collectgarbage()
  collectgarbage()
end
sweep:finish()

local function fmt(f) return function(v) return v and string.format(f, v) or "-" end end
tf.report.table(rows, { columns = { "size", { "batch", "batch", "%d" }, "precision",
  { "prefill_ms", "prefill ms", "%.2f" }, { "tokens_per_s", "tokens/s", "%.1f" }, { "ms_per_step", "ms/step", "%.3f" },
  { "gb_per_step", "GB/step", "%.3f" }, { "limit_tokens_per_s", "limit tokens/s", fmt("%.1f") },
  { "fraction", "of limit", fmt("%.2f") }, { "hf_tokens_per_s", "HF tokens/s", fmt("%.1f") },
  { "speedup", "x HF", fmt("%.2f") } } })
if rate then
  print(string.format("\nCopy rate %.0f GB/s. A decode step reads the matmul weights and the KV cache (at the "
    .. "middle position) once; the limit is those bytes over the copy rate. Target at batch 1: %.0f %% of it.",
    rate, opt.target * 100))
end
local columns = { "name", "class", { "per_step", "a step", "%.0f" }, { "us", "us a step", "%.1f" },
  { "pct", "% of kernel time", "%.1f" } }
for _, r in ipairs(rows) do
  local f = r.profile
  if f then
    print(string.format("\n### %s batch %d: a decode step's kernels (%d steps profiled: %.1f us of kernel time a "
      .. "step, %.3f ms a step with the profiler on)\n", r.size, r.batch, f.steps, f.kernel_us_per_step,
      f.ms_per_step_profiled))
    tf.report.table(f.classes, { columns = { "name", table.unpack(columns, 3) } })
    print("")
    tf.report.table(f.kernels, { columns = columns })
  end
end
if opt.json then print("wrote " .. opt.json) end
