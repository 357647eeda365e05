--- Attention at scale (CS336 "Systems", pytorch_attention): for each head
-- dim and sequence length, time forward and backward passes of naive
-- attention (softmax(q k^T / sqrt(d)) v from matmul, masked_fill and
-- softmax: autograd keeps the seq x seq probabilities) and of
-- FlashAttention-2 (keeps the output and one log-sum-exp per row), and
-- measure the memory in use before the backward pass. Configurations that
-- run out of memory become rows marked OOM and the sweep goes on; after the
-- table, the memory accounting of the smallest configuration where naive
-- attention ran out of memory (or of the largest that ran) shows why.
--
-- Timing: `warmup` untimed calls, then `iters` timed ones, each followed by
-- a device synchronisation (the wall time of one complete call, as CS336
-- times them). A forward pass runs on inputs that require grad, so it
-- records the graph a training step would; its output is freed at once.
-- A backward pass is timed alone: each one follows a fresh, untimed forward
-- pass, and o:backward(dout) with a fixed random dout is what the clock
-- sees (the gradients are dropped after each, untimed).
--
--   tfhost experiments/attention_sweep.lua                       (the CS336 sweep)
--   tfhost experiments/attention_sweep.lua --d 64 --seq 1024,4096 --impl flash --json out.json
local opt = tf.options{
  description = "Naive vs flash attention: forward and backward time and memory over head dims and lengths.",
  { "batch", "batch size (one head per problem, as CS336)", default = 8 },
  { "d", "head dims", default = "16,32,64,128", type = "list:int" },
  { "seq", "sequence lengths", default = "256,1024,4096,8192,16384", type = "list:int" },
  { "impl", "implementations", default = "naive,flash", type = "list", choices = { "naive", "flash" } },
  { "dtype", "input dtypes", default = "f32", type = "list", choices = { "f32", "f16", "bf16" } },
  { "causal", "causal mask (--no-causal for full attention)", default = true },
  { "iters", "timed passes of each kind", default = 100 },
  { "warmup", "untimed passes before timing", default = 10 },
  { "memory_limit", "cap the device memory tfhost may reserve, in GiB (0: none); shows OOM rows cheaply",
    default = 0.0 },
  { "json", "write the rows, the memory accounting and the environment to this file", type = "string" },
  { "plot", "draw forward and backward time and memory against sequence length into this file (.svg or .html)",
    type = "string" },
}
for _, name in ipairs({ "batch", "iters" }) do
  if opt[name] < 1 then tf.exit(2, "attention_sweep.lua: --" .. name .. " must be >= 1\n") end
end
if opt.warmup < 0 then tf.exit(2, "attention_sweep.lua: --warmup must be >= 0\n") end
for _, list in ipairs({ "d", "seq" }) do
  for _, n in ipairs(opt[list]) do
    if n < 1 then tf.exit(2, "attention_sweep.lua: --" .. list .. " values must be >= 1\n") end
  end
end
if opt.memory_limit > 0 then tf.mem.set_limit(math.floor(opt.memory_limit * 2 ^ 30)) end

local MiB = 2 ^ 20
local ELT = { f32 = 4, f16 = 2, bf16 = 2 }

local progress = tf.report.progress


-- One configuration: the row, with "OOM" in what did not fit.
local function measure(dtype, d, seq, impl)
  local row = { dtype = dtype, d = d, seq = seq, impl = impl, batch = opt.batch, causal = opt.causal }
  local attn = { impl = impl, causal = opt.causal }
  local q, k, v, dout
  local stage = "inputs"
  local ok, err = pcall(function()
    tf.seed(0)
    local shape, o = { opt.batch, seq, d }, { dtype = dtype }
    q = tf.randn(shape, o):requires_grad(true)
    k = tf.randn(shape, o):requires_grad(true)
    v = tf.randn(shape, o):requires_grad(true)
    dout = tf.randn(shape, o)
    stage = "forward"
    local fwd = tf.bench(function() tf.attention(q, k, v, attn):free() end, { warmup = opt.warmup, iters = opt.iters })
    row.fwd_ms, row.fwd_std_ms = fwd.mean, fwd.std
    -- memory in use before backward: what one forward adds to the inputs
    collectgarbage()
    tf.sync()
    tf.mem.reset_peak()
    local before = tf.mem.stats().allocated
    local out = tf.attention(q, k, v, attn)
    tf.sync()
    local s = tf.mem.stats()
    row.mem_mib = (s.allocated - before) / MiB
    row.fwd_peak_mib = (s.peak_allocated - before) / MiB
    stage = "backward"
    tf.mem.reset_peak()
    out:backward(dout)
    tf.sync()
    row.bwd_peak_mib = (tf.mem.stats().peak_allocated - before) / MiB
    out:free()
    q:zero_grad()
    k:zero_grad()
    v:zero_grad()
    local bwd = tf.bench.backward(function() return tf.attention(q, k, v, attn) end, dout, { q, k, v },
      { warmup = opt.warmup, iters = opt.iters })
    row.bwd_ms, row.bwd_std_ms = bwd.mean, bwd.std
  end)
  if not ok then
    if not tf.mem.is_oom(err) then error(err, 0) end
    row.oom = stage
    if stage ~= "backward" then row.fwd_ms, row.mem_mib = "OOM", "OOM" end
    row.bwd_ms = "OOM"
  end
  q, k, v, dout = nil, nil, nil, nil
  tf.mem.empty_cache()
  return row
end

local configs = {}
for _, dtype in ipairs(opt.dtype) do
  for _, d in ipairs(opt.d) do
    for _, seq in ipairs(opt.seq) do
      for _, impl in ipairs(opt.impl) do configs[#configs + 1] = { dtype, d, seq, impl } end
    end
  end
end

print(string.format("tfhost %s (%s), device %s; batch %d, %s, %d timed passes after %d warm-up",
  tf.version, tf.commit, tf.device(), opt.batch, opt.causal and "causal" or "not causal", opt.iters, opt.warmup))
local rows = {}
for i, c in ipairs(configs) do
  local dtype, d, seq, impl = table.unpack(c)
  progress("[%d/%d] %s d %d seq %d %s ...", i, #configs, dtype, d, seq, impl)
  local t0 = tf.now()
  local row = measure(dtype, d, seq, impl)
  rows[#rows + 1] = row
  progress(" %s (%.1f s)\n", row.oom and ("OOM in " .. row.oom) or "done", (tf.now() - t0) / 1e3)
end

-- naive and flash side by side: one line per (dtype, d, seq)
local lines, by_key = {}, {}
for _, r in ipairs(rows) do
  local key = r.dtype .. "/" .. r.d .. "/" .. r.seq
  local line = by_key[key]
  if not line then
    line = { dtype = r.dtype, d = r.d, seq = r.seq }
    by_key[key] = line
    lines[#lines + 1] = line
  end
  for _, f in ipairs({ "fwd_ms", "bwd_ms", "mem_mib" }) do line[r.impl .. "_" .. f] = r[f] end
end
local function num(fmt) return function(v) return type(v) == "number" and string.format(fmt, v) or tostring(v) end end
local columns = { "dtype", "d", "seq" }
for _, what in ipairs({ { "fwd_ms", "fwd ms", "%.3f" }, { "bwd_ms", "bwd ms", "%.3f" },
  { "mem_mib", "mem before bwd MiB", "%.2f" } }) do
  for _, impl in ipairs(opt.impl) do
    columns[#columns + 1] = { impl .. "_" .. what[1], impl .. " " .. what[2], num(what[3]) }
  end
end
tf.report.table(lines, { columns = columns,
  title = string.format("Attention, batch %d, %s", opt.batch, opt.causal and "causal" or "not causal") })

-- "1.50 GiB"
local function human(bytes)
  local units, i = { "B", "KiB", "MiB", "GiB", "TiB" }, 1
  while bytes >= 1024 and i < #units do bytes, i = bytes / 1024, i + 1 end
  return i == 1 and string.format("%d B", math.floor(bytes)) or string.format("%.2f %s", bytes, units[i])
end

-- The memory accounting of one configuration: what naive attention's graph
-- keeps, as formulas, and how it grows with the sequence length.
local function accounting()
  local pick
  for _, r in ipairs(rows) do
    if r.impl == "naive" and r.oom and (not pick or r.seq < pick.seq or (r.seq == pick.seq and r.d < pick.d)) then
      pick = r
    end
  end
  local why = "the smallest configuration where naive attention ran out of memory"
  if not pick then
    why = "the largest configuration that ran (naive attention never ran out of memory)"
    for _, r in ipairs(rows) do
      local larger = not pick or r.seq > pick.seq or (r.seq == pick.seq and r.d > pick.d)
      if r.impl == rows[1].impl and not r.oom and larger then
        pick = r
      end
    end
  end
  if not pick then return nil end
  local B, S, d, e = pick.batch, pick.seq, pick.d, ELT[pick.dtype]
  local mask = opt.causal and S * S or 0
  local function item(name, count, formula, bytes)
    return { tensor = name, elements = count, formula = formula, bytes = bytes }
  end
  local sq = B * S * S
  local items = {
    item("S = q k^T * scale (scores; forward only)", sq, string.format("B*seq^2*%d = %d*%d^2*%d", e, B, S, e), sq * e),
    item("P = softmax(S), saved for backward", sq, string.format("B*seq^2*%d", e), sq * e),
    item("causal mask (bool), saved for backward", mask, "seq^2*1", mask),
    item("q, k, v (inputs)", 3 * B * S * d, string.format("3*B*seq*d*%d = 3*%d*%d*%d*%d", e, B, S, d, e),
      3 * B * S * d * e),
    item("O (output), kept", B * S * d, string.format("B*seq*d*%d", e), B * S * d * e),
    item("dP and dS (backward only)", 2 * sq, string.format("2*B*seq^2*%d", e), 2 * sq * e),
    item("flash: O and lse, kept", B * S * d + B * S, string.format("B*seq*d*%d + B*seq*4", e),
      B * S * d * e + B * S * 4),
  }
  -- kept until backward: P, the mask and O (naive); O and lse (flash)
  local function naive_kept(n) return B * n * n * e + (opt.causal and n * n or 0) + B * n * d * e end
  local function flash_kept(n) return B * n * d * e + B * n * 4 end
  local measured
  for _, r in ipairs(rows) do
    if r.impl == "naive" and r.dtype == pick.dtype and r.d == d and r.seq == S and type(r.mem_mib) == "number" then
      measured = r.mem_mib * MiB
    end
  end
  return {
    why = why, dtype = pick.dtype, batch = B, seq = S, d = d, element_bytes = e, items = items,
    naive_kept_bytes = naive_kept(S), naive_kept_2x_bytes = naive_kept(2 * S), naive_kept_4x_bytes = naive_kept(4 * S),
    naive_forward_peak_bytes = 2 * sq * e + mask + B * S * d * e,
    naive_backward_peak_bytes = naive_kept(S) + 2 * sq * e + 3 * B * S * d * e,
    flash_kept_bytes = flash_kept(S), flash_kept_2x_bytes = flash_kept(2 * S),
    measured_naive_bytes = measured,
  }
end

local acc = accounting()
if acc then
  print(string.format("\n### Memory accounting: batch %d, seq %d, d %d, %s (%d bytes per element)\n\n%s.\n",
    acc.batch, acc.seq, acc.d, acc.dtype, acc.element_bytes, (acc.why:gsub("^%l", string.upper))))
  tf.report.table(acc.items, { columns = { "tensor", { "elements", "elements", "%d" }, "formula",
    { "bytes", "size", human } } })
  local measured = acc.measured_naive_bytes and (human(acc.measured_naive_bytes) .. " measured")
    or "not measured: it ran out of memory"
  print(string.format([[

Naive attention keeps P, the causal mask and O until backward: %s (%s). Its
forward pass holds S and P at once (%s with the mask and O) and its backward adds
dP, dS and the gradients (%s at the peak). The seq^2 terms grow 4x when the sequence
doubles: at seq %d naive attention would keep %s, at seq %d %s. FlashAttention keeps
O and one f32 log-sum-exp per row, %s here (%s at seq %d): it grows linearly, since
it never materialises S or P and recomputes them block by block in the backward pass.]],
    human(acc.naive_kept_bytes), measured, human(acc.naive_forward_peak_bytes), human(acc.naive_backward_peak_bytes),
    2 * acc.seq, human(acc.naive_kept_2x_bytes), 4 * acc.seq, human(acc.naive_kept_4x_bytes),
    human(acc.flash_kept_bytes), human(acc.flash_kept_2x_bytes), 2 * acc.seq))
end

if opt.json then
  tf.results.write(opt.json, rows, { memory_accounting = acc,
    key = { "dtype", "d", "seq", "impl", "batch", "causal" }, metrics = { "fwd_ms", "bwd_ms", "mem_mib" } })
  print("wrote " .. opt.json)
end
if opt.plot then
  tf.plot.sweep(opt.plot, rows, { x = { "seq", "d" }, y = { "fwd_ms", "bwd_ms", "mem_mib" },
    series = { "impl", "d", "dtype" }, title = string.format("Attention, batch %d, %s", opt.batch,
      opt.causal and "causal" or "not causal") })
  print("wrote " .. opt.plot)
end
