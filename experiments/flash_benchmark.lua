--- FlashAttention-2 against naive attention (CS336 "Systems",
-- flash_benchmarking): batch 1, causal, for each sequence length, head dim
-- and dtype, the latency of the forward pass, the backward pass and both,
-- and the TFLOP/s they achieve. Naive attention runs out of memory at long
-- sequences; those rows are marked OOM and the sweep goes on.
--
-- Timing (as tf.bench): `warmup` untimed calls, then `iters` timed calls,
-- each between two device synchronisations; the table shows the median.
-- The backward pass is timed alone: each call follows a fresh, untimed
-- forward pass and runs o:backward(dout) with a fixed random dout. The
-- forward runs on inputs that require grad (it records what backward needs).
-- FLOPs: 4 * batch * heads * seq^2 * d for the forward pass (the two
-- matmuls), halved when causal; the backward pass counts 2.5 times that.
--
--   tfhost experiments/flash_benchmark.lua                        (the full CS336 sweep; on a CPU: f32,
--                                                                  seq 128..512, d 16,64: seconds)
--   tfhost experiments/flash_benchmark.lua --seq 1024,16384 --d 64 --dtype bf16 --json out.json
--   tfhost experiments/flash_benchmark.lua --quick                (a CPU smoke run in seconds)
--   tfhost experiments/flash_benchmark.lua --seq 16384 --d 128 --dtype bf16 --impl flash --heads 16 --profile 10
--                                          (and where a forward + backward call's time goes, kernel by kernel)
--
-- --profile N runs N more forward + backward calls of each configuration
-- under tf.prof and prints its kernels (on the CPU: its ops) per call:
-- calls, ms and share of the call's kernel time; the row's kernel_ms is
-- their sum, beside fwdbwd_ms (wall time) in the JSON.
local bench = require "tf.attention_bench"
local decl = bench.options({
  description = "FlashAttention-2 vs naive attention: forward, backward and forward+backward latency and TFLOP/s.",
}, {
  seq = { "128,256,512,1024,2048,4096,8192,16384,32768,65536", "128,256,512" }, d = { "16,32,64,128", "16,64" },
  dtype = { "bf16,f32", "f32" }, impl = "naive,flash", batch = 1, causal = true, warmup = { 5, 2 },
  iters = { 20, 5 }, iters_help = "timed calls (the median is reported)", memory_limit = 0.0,
})
for _, spec in ipairs({
  { "heads", "heads per problem", default = 1, min = 1 },
  { "quick", "tiny sizes for a smoke run (seq 64,128; d 16,32; 2 timed calls after 1 warm-up)", type = "bool" },
  { "profile", "forward + backward calls profiled kernel by kernel after the timing (0: none)", default = 0, min = 0 },
  { "json", "write the rows (as each configuration finishes) and the environment to this file", type = "string" },
  { "plot", "draw latency and TFLOP/s against sequence length into this file (.svg or .html)", type = "string" },
}) do decl[#decl + 1] = spec end
local opt = tf.options(decl)
if opt.quick then
  opt.seq, opt.d, opt.warmup, opt.iters = { 64, 128 }, { 16, 32 }, 1, 2
end

-- One forward + backward call, its output and gradients dropped.
local function fwdbwd(q, k, v, dout, attn)
  local out = tf.attention(q, k, v, attn)
  out:backward(dout)
  out:free()
  q:zero_grad()
  k:zero_grad()
  v:zero_grad()
end

-- opt.profile forward + backward calls under tf.prof: each kernel's calls,
-- ms per call and share of the call's kernel time, heaviest first, and
-- that kernel time.
local function profile(q, k, v, dout, attn)
  local function call() fwdbwd(q, k, v, dout, attn) end
  call() -- a warm call outside the profile
  tf.sync()
  local p <close> = tf.prof.start()
  for _ = 1, opt.profile do call() end
  tf.sync()
  p:stop()
  local rows = {}
  for _, r in ipairs(p:kernels{}) do
    rows[#rows + 1] = { name = r.name, calls = r.instances / opt.profile, ms = r.total_ms / opt.profile }
  end
  table.sort(rows, function(a, b) return a.ms > b.ms end)
  local sum = 0
  for _, r in ipairs(rows) do sum = sum + r.ms end
  for _, r in ipairs(rows) do r.share = sum > 0 and 100 * r.ms / sum or 0 end
  return rows, sum
end

-- the profiles' tables by row (the results file keeps flat rows: kernel_ms)
local kernels_of = {}

local function measure(c)
  local row = { dtype = c.dtype, d = c.d, seq = c.seq, impl = c.impl, batch = opt.batch, heads = opt.heads,
    causal = opt.causal }
  local flops = 4 * opt.batch * opt.heads * c.seq * c.seq * c.d * (opt.causal and 0.5 or 1)
  local attn = { impl = c.impl, causal = opt.causal }
  bench.guarded(function()
    local q, k, v, dout = bench.inputs({ opt.batch, opt.heads, c.seq, c.d }, c.dtype)
    local runs = {
      { "fwd", 1, function() return tf.bench(function() tf.attention(q, k, v, attn):free() end,
          { warmup = opt.warmup, iters = opt.iters }) end },
      { "bwd", 2.5, function()
        return tf.bench.backward(function() return tf.attention(q, k, v, attn) end, dout, { q, k, v },
          { warmup = opt.warmup, iters = opt.iters })
      end },
      { "fwdbwd", 3.5, function()
        return tf.bench(function() fwdbwd(q, k, v, dout, attn) end, { warmup = opt.warmup, iters = opt.iters })
      end },
    }
    for _, r in ipairs(runs) do
      local name, factor, run = r[1], r[2], r[3]
      local s = run()
      row[name .. "_ms"], row[name .. "_std_ms"] = s.median, s.std
      row[name .. "_tflops"] = factor * flops / (s.median * 1e-3) / 1e12
    end
    if opt.profile > 0 then kernels_of[row], row.kernel_ms = profile(q, k, v, dout, attn) end
  end, function()
    row.oom = true
    for _, name in ipairs({ "fwd", "bwd", "fwdbwd" }) do
      if type(row[name .. "_ms"]) ~= "number" then row[name .. "_ms"] = "OOM" end
    end
  end)
  return row
end

print(string.format("tfhost %s (%s), device %s; batch %d, heads %d, %s; median of %d calls after %d warm-up",
  tf.version, tf.commit, tf.device(), opt.batch, opt.heads, bench.mask(opt), opt.iters, opt.warmup))
local naive_of, noise_of = {}, {} -- noise_of[row]: "within noise (...)" where the speed-up is inside the spread
local rows, sweep = bench.run(opt, measure, {
  extra = { key = { "dtype", "d", "seq", "impl", "batch", "heads", "causal" },
    metrics = { "fwd_ms", "bwd_ms", "fwdbwd_ms", "fwdbwd_tflops" } },
  after = function(row, c)
    local key = c.dtype .. "/" .. c.d .. "/" .. c.seq
    if c.impl == "naive" then naive_of[key] = row end
    local naive = naive_of[key]
    if c.impl == "flash" and naive and type(naive.fwdbwd_ms) == "number" and type(row.fwdbwd_ms) == "number" then
      row.speedup = naive.fwdbwd_ms / row.fwdbwd_ms
      noise_of[row] = select(2, tf.report.noise(naive.fwdbwd_ms, row.fwdbwd_ms, naive.fwdbwd_std_ms,
        row.fwdbwd_std_ms))
    end
  end,
})

local num = bench.num
tf.report.table(rows, {
  title = string.format("Attention latency, batch %d, heads %d, %s", opt.batch, opt.heads,
    bench.mask(opt)),
  columns = { "dtype", "d", "seq", "impl",
    { "fwd_ms", "fwd ms", num("%.3f") }, { "bwd_ms", "bwd ms", num("%.3f") },
    { "fwdbwd_ms", "fwd+bwd ms", num("%.3f") },
    { "fwd_tflops", "fwd TFLOP/s", num("%.3g") }, { "bwd_tflops", "bwd TFLOP/s", num("%.3g") },
    { "fwdbwd_tflops", "fwd+bwd TFLOP/s", num("%.3g") }, { "speedup", "fwd+bwd speedup vs naive", function(v, row)
      return string.format("%.2fx", v) .. (noise_of[row] and " (" .. noise_of[row] .. ")" or "") end } },
})
for _, row in ipairs(rows) do
  if kernels_of[row] then
    tf.report.table(kernels_of[row], {
      title = string.format("Kernels of one forward + backward call, %s d %d seq %d %s (mean of %d calls): %.3f ms, "
        .. "wall time %s ms", row.dtype, row.d, row.seq, row.impl, opt.profile, row.kernel_ms,
        num("%.3f")(row.fwdbwd_ms)),
      columns = { "name", { "calls", "calls", "%g" }, { "ms", "ms", "%.3f" }, { "share", "share", "%.1f%%" } },
    })
  end
end
sweep:finish()
if opt.plot then
  tf.plot.sweep(opt.plot, rows, { x = { "seq", "d" }, y = { "fwd_ms", "bwd_ms", "fwdbwd_ms", "fwdbwd_tflops" },
    series = { "impl", "d", "dtype" }, title = string.format("Attention latency, batch %d, heads %d, %s", opt.batch,
      opt.heads, bench.mask(opt)) })
  print("wrote " .. opt.plot)
end
