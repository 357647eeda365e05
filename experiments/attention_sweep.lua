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
--   tfhost experiments/attention_sweep.lua                       (the CS336 sweep; on a CPU: d 16,64,
--                                                                 seq 64..256, 5 passes: seconds)
--   tfhost experiments/attention_sweep.lua --d 64 --seq 1024,4096 --impl flash --json out.json
local bench = require "tf.attention_bench"
local decl = bench.options({
  description = "Naive vs flash attention: forward and backward time and memory over head dims and lengths.",
}, {
  batch = 8, batch_help = "batch size (one head per problem, as CS336)",
  d = { "16,32,64,128", "16,64" }, seq = { "256,1024,4096,8192,16384", "64,128,256" },
  impl = "naive,flash", dtype = "f32", causal = true,
  iters = { 100, 5 }, iters_help = "timed passes of each kind", warmup = { 10, 1 }, memory_limit = 0.0,
})
decl[#decl + 1] = { "json", "write the rows (as each configuration finishes), the memory accounting and the " ..
  "environment to this file", type = "string" }
decl[#decl + 1] = { "plot", "draw forward and backward time and memory against sequence length into this file " ..
  "(.svg or .html)", type = "string" }
local opt = tf.options(decl)

local MiB = 2 ^ 20
local ELT = { f32 = 4, f16 = 2, bf16 = 2 }

-- One configuration: the row, with "OOM" in what did not fit.
local function measure(c)
  local row = { dtype = c.dtype, d = c.d, seq = c.seq, impl = c.impl, batch = opt.batch, causal = opt.causal }
  local attn = { impl = c.impl, causal = opt.causal }
  local stage = "inputs"
  bench.guarded(function()
    local q, k, v, dout = bench.inputs({ opt.batch, c.seq, c.d }, c.dtype)
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
  end, function()
    row.oom = stage
    if stage ~= "backward" then row.fwd_ms, row.mem_mib = "OOM", "OOM" end
    row.bwd_ms = "OOM"
  end)
  return row
end

print(string.format("tfhost %s (%s), device %s; batch %d, %s, %d timed passes after %d warm-up",
  tf.version, tf.commit, tf.device(), opt.batch, bench.mask(opt), opt.iters, opt.warmup))
local rows, sweep = bench.run(opt, measure, {
  extra = { key = { "dtype", "d", "seq", "impl", "batch", "causal" }, metrics = { "fwd_ms", "bwd_ms", "mem_mib" } },
  note = function(row) return row.oom and ("OOM in " .. row.oom) or "done" end,
})

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
local num = bench.num
local columns = { "dtype", "d", "seq" }
local function mib(v) return type(v) == "number" and tf.units.bytes(v * MiB) or tostring(v) end
for _, what in ipairs({ { "fwd_ms", "fwd ms", num("%.3f") }, { "bwd_ms", "bwd ms", num("%.3f") },
  { "mem_mib", "mem before bwd", mib } }) do
  for _, impl in ipairs(opt.impl) do
    columns[#columns + 1] = { impl .. "_" .. what[1], impl .. " " .. what[2], what[3] }
  end
end
tf.report.table(lines, { columns = columns,
  title = string.format("Attention, batch %d, %s", opt.batch, bench.mask(opt)) })

local human = tf.units.bytes

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

sweep:finish{ memory_accounting = acc }
if opt.plot then
  tf.plot.sweep(opt.plot, rows, { x = { "seq", "d" }, y = { "fwd_ms", "bwd_ms", "mem_mib" },
    series = { "impl", "d", "dtype" }, title = string.format("Attention, batch %d, %s", opt.batch, bench.mask(opt)) })
  print("wrote " .. opt.plot)
end
