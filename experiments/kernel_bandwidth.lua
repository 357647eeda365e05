--- Are the fused engine's memory-bound kernels at the device's copy rate?
-- Training steps of the fused engine (forward, loss, backward, AdamW) are
-- profiled with tf.prof, with the optimizer's update run after each layer's
-- part of the backward pass instead of beside it (m:set_overlap(false): the
-- same kernels and bits, each running alone, so that its time is its own);
-- the step as m:step runs it, overlapped, is timed too. Each kernel that is bound by
-- memory traffic (norms, RoPE and the heads layout, SwiGLU, cross-entropy,
-- embedding, AdamW) gets the bytes one step must move through it, from the
-- engine's shapes (the byte model below: every operand read once and every
-- result written once, the least any kernel could move), its measured time,
-- the rate that makes, and that rate as a fraction of the device's copy rate
-- (a device-to-device copy of 1 GiB, timed in the same run). The model is
-- checked against the engine's own count of one more step (tf.cuda.traffic:
-- each launch's calls and the bytes its arguments give); the script stops
-- with an error, after the table, where they disagree. GEMMs and
-- attention are bound by arithmetic and are left to benchmark.lua and
-- flash_benchmark.lua; the table says how much of the step they take.
--
--   tfhost experiments/kernel_bandwidth.lua                         (2.7B, context 1024, bf16)
--   tfhost experiments/kernel_bandwidth.lua --size small --context 128 --json bw.json
-- A kernel the byte model does not know is listed with its time and "?"
-- for bytes, so nothing the step launches is left out of the table.
local opt = tf.options{
  description = "Bytes moved, time and fraction of the copy rate of each memory-bound kernel of a training step. "
    .. "Needs a CUDA device: on a CPU it refuses to run (exit code 2).",
  { "size", "model size (tiny, small, medium, large, xl, 2.7B)", default = "2.7B" },
  { "context", "context length", default = 1024, min = 1 },
  { "precision", "precision", default = "bf16", choices = { "f32", "bf16", "f16" } },
  { "attention", "the engine's attention", default = "flash", choices = { "flash", "naive" } },
  { "batch", "batch size", default = 4, min = 1 },
  { "vocab", "vocabulary size", default = 10000, min = 1 },
  { "warmup", "warm-up training steps", default = 3, min = 0 },
  { "steps", "profiled training steps", default = 3, min = 1 },
  { "target", "the fraction of the copy rate a kernel should reach", default = 0.8, min = 0 },
  { "json", "write the rows and the environment to this file", type = "string" },
}
if tf.default_device() == "cpu" then
  tf.exit(2, "kernel_bandwidth.lua: needs a CUDA device (it measures the fused engine's GPU kernels); "
    .. (tf.cuda.is_available() and "--device cpu was given" or "none is present") .. "\n")
end
if not tf.model.presets[opt.size] then tf.exit(2, "kernel_bandwidth.lua: unknown size '" .. opt.size .. "'\n") end

--- Bytes one training step moves through each memory-bound kernel of the
-- fused engine (host/model/*.c says which kernel runs where and how often):
-- L layers, n = batch * seq rows, d = d_model, f = d_ff, e = bytes of the
-- compute dtype; the residual stream, its gradient, the parameters, their
-- gradients and AdamW's moments are f32. Per-row statistics (4 bytes a
-- row) are counted; vectors of d (norm gains) are not.
local function byte_model(cfg, batch, seq, precision, attention, recompute_residual)
  local L, d, f, V = cfg.num_layers, cfg.d_model, cfg.d_ff, cfg.vocab_size
  local n = batch * seq
  local e = precision == "f32" and 4 or 2
  local low = precision ~= "f32" -- a low-precision copy of the weights and of the residual gradient
  local matmul = L * (4 * d * d + 3 * d * f) + V * d -- the layers' matmul weights and lm_head
  local other = V * d + (2 * L + 1) * d            -- the embedding and the norm gains
  local nd = n * d
  local m = {}
  -- RMSNorm forward: with the residual add in front (x, delta read; x_out, h
  -- written) after each attention and SwiGLU half (2L), without it for the
  -- first ln1 (1). Rows of a multiple of 8 up to 24576 run on the
  -- block-a-row kernel. The two norms each layer's backward recomputes
  -- apply the kept rstd (rstd read): ln1 from x (x read, h written; L) and
  -- ln2 from the residual stream after attention, kept in f32 (as ln1), in
  -- bf16 and f16 rebuilt from x and the kept projection (as the forward's
  -- ln2, with x_out written again; L).
  local forward = {
    calls = 2 * L + 1,
    bytes = 2 * L * (nd * (4 + e + 4 + e) + 4 * n) + (nd * (4 + e) + 4 * n) }
  -- (also in f32 when the residual stream is recomputed, m:set_recompute_residual)
  local ln2 = (low or recompute_residual) and (nd * (4 + e + 4 + e) + 4 * n) or (nd * (4 + e) + 4 * n)
  m.tf_cuda_rms_apply_kernel = { calls = 2 * L, bytes = L * (nd * (4 + e) + 4 * n) + L * ln2 }
  if d % 8 == 0 and d <= 24576 then
    m.tf_cuda_rms_forward_row_kernel = forward
  else
    m.tf_cuda_norm_forward_kernel = forward
  end
  -- RMSNorm backward: x, dh and rstd read, the residual gradient read and
  -- written (only written for ln_final), its low copy written (not for the
  -- first layer's ln1, and never under f32).
  -- The gains' gradient comes out of the same pass (d a multiple of 8 up
  -- to 8192, as in every preset; partial sums of d a block written); with
  -- TF_NORM_UNFUSED set, a second kernel reads x, dh and rstd again.
  local lows = low and (2 * L) or 0
  local backward = {
    calls = 2 * L + 1,
    bytes = (2 * L + 1) * (nd * (4 + e) + 4 * n) + 2 * L * nd * 8 + nd * 4 + lows * nd * e }
  if os.getenv("TF_NORM_UNFUSED") or d % 8 ~= 0 or d > 4096 then
    m.tf_cuda_norm_backward_kernel = backward
    m.tf_cuda_norm_wgrad_kernel = { calls = 2 * L + 1, bytes = (2 * L + 1) * (nd * (4 + e) + 4 * n) }
  else
    m.tf_cuda_rms_backward_fused_kernel = backward
  end
  -- SwiGLU: forward reads a|b and writes the gate (L); backward reads a|b
  -- and the gate's gradient, writes d(a|b) and the gate again (L).
  m.tf_cuda_swiglu_kernel = { calls = 2 * L, bytes = L * n * f * 3 * e + L * n * f * 6 * e }
  -- q, k, v out of the fused projection into heads, RoPE on q and k, and
  -- the way back for their gradients: 3 n d read and written each time.
  m.tf_cuda_rope_heads_vec_kernel = { calls = 2 * L, bytes = 2 * L * 6 * nd * e }
  m.tf_cuda_rope_heads_kernel = m.tf_cuda_rope_heads_vec_kernel
  m.tf_cuda_rope_heads_rows_kernel = m.tf_cuda_rope_heads_vec_kernel
  -- (B, H, T, hd) <-> (B, T, H hd), naive attention only: one tensor of
  -- n d read and written; the output merged and its gradient split (the
  -- flash kernels write the output merged and read it and its gradient so).
  if attention ~= "flash" then
    m.tf_cuda_heads_kernel = { calls = 2 * L, bytes = 2 * L * 2 * nd * e }
    m.tf_cuda_heads_rows_kernel = m.tf_cuda_heads_kernel
  end
  -- Naive attention's causal softmax over the (T, T) scores of each head,
  -- in place: the visible scores (t + 1 in row t) read, the whole row
  -- written (zeros past t); forward and its recomputation (2L), backward
  -- reading the gradient and the probabilities (L).
  local bh = batch * cfg.num_heads
  local tri, full = bh * seq * (seq + 1) // 2, bh * seq * seq
  m.tf_cuda_softmax_forward_kernel = { calls = 2 * L, bytes = 2 * L * (tri + full) * e }
  m.tf_cuda_softmax_backward_kernel = { calls = L, bytes = L * (2 * tri + full) * e }
  -- FlashAttention's backward starts with D = rowsum(dO * O): both read, one
  -- f32 per row of each head written. On a 9.0 device (H100, H200) the
  -- engine's deterministic dQ kernel sums D itself and this kernel does not run.
  if attention == "flash" then
    m.tf_flash_rowdot_kernel = { calls = L, bytes = L * (2 * nd * e + 4 * bh * seq) }
  end
  -- The loss: logits read, their gradient written in place, targets and
  -- the per-row loss.
  -- Rows of whole 16-byte vectors, up to 2048 of them, run on the
  -- block-a-row kernel.
  local loss = { calls = 1, bytes = 2 * n * V * e + 12 * n }
  local vw = 16 // e
  if V % vw == 0 and V // vw <= 2048 then
    m.tf_cuda_ce_row_kernel = loss
  else
    m.tf_cuda_ce_kernel = loss
  end
  -- Embedding rows gathered into the f32 residual; their gradient added
  -- back (the residual gradient read, the rows read and written).
  m.tf_cuda_embedding_kernel = { calls = 1, bytes = nd * 8 + 8 * n }
  m.tf_cuda_embedding_sum_kernel = { calls = 1, bytes = nd * 12 }
  -- AdamW (exact where d is a multiple of 64, as in every preset: the engine
  -- pads each tensor to 64 elements): parameter, gradient and both moments read; parameter and moments
  -- written; the matmul weights' low copy written; the gradients the next
  -- step adds to (embedding, norm gains) zeroed (the matmul weights' are
  -- written whole by their GEMMs).
  m.tf_cuda_adamw4_kernel = { calls = nil, bytes = (matmul + other) * 28 + other * 4 + (low and matmul * e or 0) }
  m.tf_cuda_adamw_kernel = m.tf_cuda_adamw4_kernel
  -- Kernels of a fixed, small amount of work whose time is their launch and
  -- latency, not bytes: the sum of the gains' partial sums (a few hundred
  -- rows of d), the loss's mean, AdamW's constants, the ids' range check,
  -- the embedding gradient's sort of the ids.
  for _, name in ipairs{ "tf_cuda_norm_wgrad_finish_kernel", "tf_cuda_ce_mean_kernel", "tf_cuda_adamw_consts_kernel",
    "tf_cuda_index_check_kernel", "tf_cuda_embedding_keys_kernel", "tf_cuda_embedding_runs_kernel",
    "DeviceRadixSortSingleTileKernel", "[memset]", "[memcpy DtoD]", "[memcpy DtoH]", "[memcpy HtoD]" } do
    m[name] = { latency = true }
  end
  m.tf_cuda_rms_partial_sum_kernel = { latency = true }
  if m.tf_cuda_rms_backward_fused_kernel then
    m.tf_cuda_rms_partial_sum_kernel.calls = 2 * L + 1
  else
    m.tf_cuda_norm_wgrad_finish_kernel.calls = 2 * L + 1
  end
  return m
end

-- GEMMs and attention are bound by arithmetic, but for the kernels of
-- theirs the byte model knows (FlashAttention's row dot).
local function is_compute_bound(r, model) return (r.class == "gemm" or r.class == "attention") and not model[r.name] end

local progress = tf.report.progress
local ok_prof, why = tf.prof.available()
if not ok_prof then tf.exit(2, "kernel_bandwidth.lua: " .. why .. "\n") end

progress("copy rate ...")
local rate, copy_ms = tf.bench.copy_rate()
progress(" %.0f GB/s\n", rate)
progress("%s ctx %d %s: %d warm-up and %d profiled steps ...", opt.size, opt.context, opt.precision, opt.warmup,
  opt.steps)
tf.seed(0)
local m = tf.model.new{ preset = opt.size, context_length = opt.context, vocab_size = opt.vocab,
  precision = opt.precision, impl = "fused", attention = opt.attention }
local ids = tf.randint(0, opt.vocab, { opt.batch, opt.context })
local targets = tf.randint(0, opt.vocab, { opt.batch, opt.context })
-- Wall time per step over `steps` steps after the warm-up.
local function time_steps()
  for _ = 1, opt.warmup do m:step(ids, targets):free() end
  tf.sync()
  local t0 = tf.now()
  for _ = 1, opt.steps do m:step(ids, targets):free() end
  tf.sync()
  return (tf.now() - t0) / opt.steps
end
local step_ms = time_steps()
m:set_overlap(false)
local serial_ms = time_steps()
local p <close> = tf.prof.start{}
for _ = 1, opt.steps do tf.range("training step", function() m:step(ids, targets):free() end) end
tf.sync()
p:stop()
-- The engine's own count of one more step (tf.cuda.traffic), graphs off so
-- that every launch is made, and counted, again: each memory-bound
-- kernel's calls and the bytes its arguments give. The byte model must
-- agree with it; where it does not, the model has missed a pass or an
-- operand (as it once missed the recomputed ln2's residual add).
-- A build before the count (an older tfhost running this script, as
-- tests/gpu/bandwidth_compare.sh does) skips the check and says so.
local counted = nil
if tf.cuda.traffic then
  m:set_graphs(false)
  counted = tf.cuda.traffic(function() m:step(ids, targets):free() end)
end
progress(" done\n")

local model = byte_model(m.config, opt.batch, opt.context, opt.precision, m.attention,
  m.engine:info().recompute_residual)
local rows, bound_ms, compute_ms, kernel_ms = {}, 0, 0, 0
for _, r in ipairs(p:kernels{ range = "training step" }) do
  local ms = r.total_ms / opt.steps
  kernel_ms = kernel_ms + ms
  if is_compute_bound(r, model) then
    compute_ms = compute_ms + ms
  else
    bound_ms = bound_ms + ms
    local bm = model[r.name]
    local row = { kernel = r.name, class = r.class, calls = r.instances / opt.steps, ms = ms }
    if bm and bm.latency then
      row.latency, row.expected_calls = true, bm.calls
    elseif bm then
      row.bytes = bm.bytes
      row.expected_calls = bm.calls
      row.gbps = bm.bytes / (ms * 1e-3) / 1e9
      row.fraction = row.gbps / rate
      row.meets = row.fraction >= opt.target
    end
    local c = counted and counted[r.name]
    if c then row.counted_calls, row.counted_bytes = c.calls, c.bytes end
    rows[#rows + 1] = row
  end
end
table.sort(rows, function(a, b) return a.ms > b.ms end)

--- Where the byte model and the engine's count disagree, one line each.
local function disagreements()
  local out, seen = {}, {}
  if not counted then return out end
  local function gb(v) return string.format("%.6f GB", v / 1e9) end
  for _, row in ipairs(rows) do
    seen[row.kernel] = true
    local modelled = row.bytes
    if row.counted_bytes and modelled then
      if math.abs(row.counted_bytes - modelled) > 1e-9 * modelled then
        out[#out + 1] = row.kernel .. ": the byte model says " .. gb(modelled) .. ", the engine counted "
          .. gb(row.counted_bytes)
      end
    elseif row.counted_bytes then
      out[#out + 1] = row.kernel .. ": the engine counted " .. gb(row.counted_bytes) .. ", the byte model has none"
    elseif modelled then
      out[#out + 1] = row.kernel .. ": the byte model says " .. gb(modelled) .. ", the engine counted none"
    end
    if row.counted_calls and row.counted_calls ~= row.calls then
      out[#out + 1] = string.format("%s: %d calls counted, %g a step profiled", row.kernel, row.counted_calls, row.calls)
    end
  end
  for name, c in pairs(counted) do
    if not seen[name] then
      out[#out + 1] = string.format("%s: the engine counted %d calls (%s) that the profile did not see", name, c.calls,
        gb(c.bytes))
    end
  end
  table.sort(out)
  return out
end
local disagree = disagreements()

local function fmt(f) return function(v) return v == nil and "?" or string.format(f, v) end end
print(string.format("# Memory-bound kernels of one training step: %s, context %d, batch %d, %s, %s attention, %s\n",
  opt.size, opt.context, opt.batch, opt.precision, m.attention, tf.device()))
print(string.format("Copy rate: %.0f GB/s (a 1 GiB device copy in %.3f ms). Step: %.2f ms as m:step runs it (AdamW "
  .. "beside the backward pass), %.2f ms with each kernel alone, of which %.2f ms of kernels: %.2f ms GEMMs and "
  .. "attention, %.2f ms the kernels below.\n", rate, copy_ms, step_ms, serial_ms, kernel_ms, compute_ms, bound_ms))
tf.report.table(rows, { columns = {
  "kernel", "class", { "calls", "calls/step", "%.0f" }, { "bytes", "GB/step", function(v, row)
    return v and string.format("%.3f", v / 1e9) or row.latency and "latency" or "?" end },
  { "ms", "ms/step", "%.3f" }, { "gbps", "GB/s", fmt("%.0f") }, { "fraction", "of copy rate", fmt("%.2f") },
  { "meets", string.format(">= %.2f", opt.target), function(v) return v == nil and "-" or v and "yes" or "no" end } } })
print(string.format("\nBytes are what the step must move through each kernel (every operand read once, every result "
  .. "written once); a kernel under %.0f %% of the copy rate moves them slower than a copy would, or moves more. "
  .. "Kernels marked latency do a small, fixed amount of work: their time is launch and latency. Kernels marked ? "
  .. "have no byte model: their time still counts in the total above.", 100 * opt.target))
if not counted then
  print("\nThis tfhost has no tf.cuda.traffic (a build before it): the byte model is not checked.")
elseif #disagree == 0 then
  print("\nThe byte model agrees with the engine's own count of each kernel's calls and bytes (tf.cuda.traffic).")
else
  print("\nThe byte model and the engine's own count (tf.cuda.traffic) disagree:")
  for _, line in ipairs(disagree) do print("  " .. line) end
end
if opt.json then
  tf.results.write(opt.json, rows, { options = opt, key = { "kernel", "class" }, copy_gbps = rate, step_ms = step_ms, serial_step_ms = serial_ms,
    kernel_ms = kernel_ms,
    compute_bound_ms = compute_ms, memory_bound_ms = bound_ms, model_disagreements = disagree })
  print("wrote " .. opt.json)
end
if #disagree > 0 then
  tf.exit(1, "kernel_bandwidth.lua: the byte model disagrees with the engine's count (above); its fractions are not "
    .. "to be trusted until it is mended\n")
end
