--- Fused vs eager (CS336 torch_compile): what fusing buys.
--   (a) attention: the eager op chain (matmul, scale, mask, softmax, matmul:
--       one kernel per op, P materialised) against the fused FlashAttention
--       kernels, forward and forward+backward;
--   (b) the whole Transformer LM: the eager Lua model (tf ops + autograd,
--       like PyTorch eager) against the fused C engine (planned memory,
--       fused kernels, FlashAttention), forward and full training step; the
--       engine runs with CUDA graph replay (its default) and without, so the
--       launch cost that replay saves shows on its own.
--
--   tfhost experiments/fused_vs_eager.lua                  (on a CPU: d 16,64, seq 64..256, the tiny model)
--   tfhost experiments/fused_vs_eager.lua --part model --size small --context 256
--   tfhost experiments/fused_vs_eager.lua --quick            (tiny sizes: a CPU smoke run)
local opt = tf.options{
  description = "Eager ops vs fused kernels: attention, and the whole Transformer LM.",
  { "part", "which parts to run", default = "attention,model", type = "list", choices = { "attention", "model" } },
  { "batch", "attention: batch", default = 8, min = 1 },
  { "d", "attention: head dims", default = "16,32,64,128", cpu = "16,64", type = "list:int", min = 1 },
  { "seq", "attention: sequence lengths", default = "256,1024,4096,8192,16384", cpu = "64,128,256", type = "list:int",
    min = 1 },
  { "attn_dtype", "attention: dtype", default = "f32", choices = { "f32", "bf16", "f16" } },
  { "size", "model: sizes", default = "small,medium,large", cpu = "tiny", type = "list" },
  { "context", "model: context length", default = 512, cpu = 64, min = 1 },
  { "model_batch", "model: batch", default = 4, min = 1 },
  { "precision", "model: precisions", default = "f32,bf16", cpu = "f32", type = "list",
    choices = { "f32", "bf16", "f16" } },
  { "warmup", "warm-up iterations", default = 3, cpu = 1, min = 0 },
  { "iters", "timed iterations", default = 10, cpu = 3, min = 1 },
  { "quick", "tiny sizes for a quick (CPU) run", default = false },
  { "json", "write the rows (as each configuration finishes) and the environment to this file", type = "string" },
}
if opt.quick then
  opt.d, opt.seq, opt.batch = { 16 }, { 32, 64 }, 2
  opt.size, opt.context, opt.model_batch, opt.warmup, opt.iters = { "tiny" }, 32, 2, 1, 2
end
for _, s in ipairs(opt.size) do
  if not tf.model.presets[s] then tf.exit(2, "fused_vs_eager.lua: unknown size '" .. s .. "'\n") end
end

local function bench(fn) return tf.bench(fn, { warmup = opt.warmup, iters = opt.iters }) end

local rows = { attention = {}, model = {} }

-- Times each implementation with time(impl), which returns one tf.bench
-- summary per key; fills row.<impl>_<key>_ms (the median) and
-- row.<impl>_<key>_std_ms (or row.<impl>_oom).
local function time_all(row, impls, keys, time)
  for _, impl in ipairs(impls) do
    local res = table.pack(pcall(time, impl, row))
    if res[1] then
      for i, key in ipairs(keys) do
        row[impl .. "_" .. key .. "_ms"], row[impl .. "_" .. key .. "_std_ms"] = res[i + 1].median, res[i + 1].std
      end
    elseif tf.mem.is_oom(res[2]) then
      row[impl .. "_oom"] = true
    else
      error(res[2], 0)
    end
    tf.mem.empty_cache()
  end
end

-- row.<key>_<name> = slow's time / fast's time, for each key both have.
local function speedups(row, slow, fast, keys, name)
  for _, key in ipairs(keys) do
    local a, b = row[slow .. "_" .. key .. "_ms"], row[fast .. "_" .. key .. "_ms"]
    if a and b then row[key .. "_" .. name] = a / b end
  end
end

local function has(part)
  for _, p in ipairs(opt.part) do
    if p == part then return true end
  end
end

-- (a) One attention shape, one implementation: forward and forward+backward.
local function time_attention(d, seq, impl)
  local shape = { opt.batch, seq, d }
  local q = tf.randn(shape, { dtype = opt.attn_dtype }):requires_grad(true)
  local k = tf.randn(shape, { dtype = opt.attn_dtype }):requires_grad(true)
  local v = tf.randn(shape, { dtype = opt.attn_dtype }):requires_grad(true)
  local dout = tf.randn(shape, { dtype = opt.attn_dtype })
  local o = { causal = true, impl = impl }
  local fwd = bench(function() tf.no_grad(function() tf.attention(q, k, v, o):free() end) end)
  local fwdbwd = bench(function()
    local out = tf.attention(q, k, v, o)
    out:backward(dout)
    q.grad, k.grad, v.grad = nil, nil, nil
    out:free()
  end)
  return fwd, fwdbwd
end

-- One progress line and estimate over both parts (by count: an attention shape and a model's
-- three implementations cost too differently to compare before either ran); the rows so far
-- in the JSON as each finishes.
local total = (has("attention") and #opt.d * #opt.seq or 0) + (has("model") and #opt.size * #opt.precision or 0)
local sweep = tf.report.sweep{ total = total, json = opt.json, results = rows }

if has("attention") then
  for _, d in ipairs(opt.d) do
    for _, seq in ipairs(opt.seq) do
      sweep:start("attention d %d seq %d", d, seq)
      local row = { d = d, seq = seq, batch = opt.batch, dtype = opt.attn_dtype }
      time_all(row, { "naive", "flash" }, { "fwd", "fwdbwd" }, function(impl) return time_attention(d, seq, impl) end)
      speedups(row, "naive", "flash", { "fwd", "fwdbwd" }, "speedup")
      rows.attention[#rows.attention + 1] = row
      sweep:done()
    end
  end
end

-- (b) One model size and precision, one implementation: forward and step.
-- impl is "eager", "fused" (with CUDA graph replay, the engine's default;
-- row.graphs says whether the device has it) or "fused_nographs".
local function time_model(size, precision, impl, row)
  tf.seed(0)
  local m = tf.model.new{ preset = size, context_length = opt.context, precision = precision,
    impl = impl == "eager" and "eager" or "fused", graphs = impl ~= "fused_nographs" }
  if impl == "fused" then row.graphs = m.graphs end
  local vocab = m.config.vocab_size
  local ids = tf.randint(0, vocab, { opt.model_batch, opt.context })
  local targets = tf.randint(0, vocab, { opt.model_batch, opt.context })
  local fwd = bench(function() m:forward(ids):free() end)
  local step = bench(function() m:step(ids, targets):free() end)
  return fwd, step
end

if has("model") then
  for _, size in ipairs(opt.size) do
    for _, precision in ipairs(opt.precision) do
      sweep:start("model %s %s ctx %d", size, precision, opt.context)
      local row = { size = size, precision = precision, context = opt.context, batch = opt.model_batch }
      local keys = { "fwd", "step" }
      time_all(row, { "eager", "fused", "fused_nographs" }, keys,
        function(impl, r) return time_model(size, precision, impl, r) end)
      speedups(row, "eager", "fused", keys, "speedup")
      if row.graphs then
        speedups(row, "fused_nographs", "fused", keys, "graphs_speedup")
      end
      rows.model[#rows.model + 1] = row
      sweep:done()
    end
  end
end

local function ms(impl, key, title)
  return { impl .. "_" .. key, (title or impl) .. " " .. key:gsub("_ms", "") .. " ms", function(v, row)
    if row[impl .. "_oom"] then return "OOM" end
    return v and string.format("%.3f", v) or "-"
  end }
end
-- A speed-up cell, slow's time over fast's for what (fwd, step, ...):
-- "2.41x", "1.03x (within noise (±6 %))" when the two differ by less than
-- their spreads, or na(row) where it does not apply (graphs on a device
-- without them).
local function ratio(what, slow, fast, title, na)
  -- keyed by a column every row has, so that the cell is drawn where the ratio is missing too
  return { "batch", title, function(_, row)
    local a, b = row[slow .. "_" .. what .. "_ms"], row[fast .. "_" .. what .. "_ms"]
    if na and na(row) then return na(row) end
    if not (a and b) then return "-" end
    local v, noise = tf.report.noise(a, b, row[slow .. "_" .. what .. "_std_ms"], row[fast .. "_" .. what .. "_std_ms"])
    return string.format("%.2fx", v) .. (noise and " (" .. noise .. ")" or "")
  end }
end
local function no_graphs(row) return row.graphs == false and "n/a (no graphs)" or nil end

print(string.format("# Fused vs eager on %s (median of %d runs after %d warm-up)\n", tf.device(), opt.iters,
  opt.warmup))
if has("attention") then
  print(string.format("## (a) Attention, batch %d, %s, causal: eager ops vs FlashAttention kernels\n", opt.batch,
    opt.attn_dtype))
  tf.report.table(rows.attention, { columns = { "d", "seq", ms("naive", "fwd_ms"), ms("flash", "fwd_ms"),
    ratio("fwd", "naive", "flash", "fwd speed-up"), ms("naive", "fwdbwd_ms"), ms("flash", "fwdbwd_ms"),
    ratio("fwdbwd", "naive", "flash", "fwd+bwd speed-up") } })
  print("\nEager: S = QK^T * scale, masked, softmax, PV, each its own kernel, S and P kept for backward. "
    .. "Fused: one forward kernel, and backward kernels that recompute P tile by tile from the saved log-sum-exp.")
end
if has("model") then
  print(string.format("\n## (b) Transformer LM, context %d, batch %d: eager Lua model vs fused engine\n",
    opt.context, opt.model_batch))
  tf.report.table(rows.model, { columns = { "size", { "precision", "prec" }, ms("eager", "fwd_ms"),
    ms("fused", "fwd_ms"), ms("fused_nographs", "fwd_ms", "fused, no graphs"),
    ratio("fwd", "eager", "fused", "fwd speed-up"),
    ratio("fwd", "fused_nographs", "fused", "fwd graphs gain", no_graphs),
    ms("eager", "step_ms"), ms("fused", "step_ms"), ms("fused_nographs", "step_ms", "fused, no graphs"),
    ratio("step", "eager", "fused", "step speed-up"),
    ratio("step", "fused_nographs", "fused", "step graphs gain", no_graphs) } })
  print("\nEager: the model written with tf ops and autograd (one kernel per op, autocast casts per op). "
    .. "Fused: planned activation memory, fused norm/residual/SwiGLU/loss kernels, cuBLASLt GEMMs, "
    .. "FlashAttention, bf16 weight copies kept by the optimizer, and (unless \"no graphs\") CUDA graph replay "
    .. "of the forward, loss and backward passes. Speed-ups are eager over fused; graphs gain is fused without "
    .. "graphs over fused with them.")
  local with_graphs = 0
  for _, row in ipairs(rows.model) do
    if row.graphs then with_graphs = with_graphs + 1 end
  end
  if with_graphs == 0 then
    print(string.format("\n%s replays no CUDA graphs: both fused columns run the same engine the same way, so "
      .. "the graphs gain is n/a.", tf.device()))
  end
end
sweep:finish()
