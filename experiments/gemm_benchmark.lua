--- How fast are the matrix products: bf16 against FP8 (tf.scaled_matmul on cuBLASLt: e4m3
-- operands, bf16 out, tensorwise and rowwise scales, with and without the tensor cores' fast
-- accumulation), at square sizes and at the 2.7B model's shapes. C = A B^T with A (M, K) and the
-- weight B (N, K), both row-major, as a linear layer computes it; 2 M N K FLOPs a product.
--
-- Timing: `warmup` untimed products, then `repeats` rounds of `iters` products back to back
-- between two device events (tf.timer); the fastest round's mean is reported, in ms and TFLOP/s.
-- With --torch, the rows of tests/reference/torch_gemm.py (torch.matmul and torch._scaled_mm on
-- the same shapes, in the same kinds) go beside ours.
--
--   tfhost experiments/gemm_benchmark.lua                              (the default shapes, bf16 and fp8)
--   tfhost experiments/gemm_benchmark.lua --shapes 8192x8192x8192 --kinds bf16,fp8 --json gemm.json
--   tfhost experiments/gemm_benchmark.lua --torch torch_gemm.json      (PyTorch's rows beside)
local opt = tf.options{
  description = "bf16 and FP8 (tf.scaled_matmul) matrix products: ms and TFLOP/s, beside PyTorch's with --torch.",
  { "shapes", "MxNxK products, C (M, N) = A (M, K) B^T", type = "list",
    default = "8192x8192x8192,4096x10240x2560,4096x2560x10240,4096x7680x2560", cpu = "64x64x64,128x256x128" },
  { "kinds", "bf16, fp8 (tensorwise scales), fp8_rowwise, fp8_fast (fast accumulation)", type = "list",
    default = "bf16,fp8,fp8_rowwise,fp8_fast" },
  { "warmup", "untimed products first", default = 10, cpu = 1, min = 0 },
  { "iters", "products a timed round", default = 50, cpu = 2, min = 1 },
  { "repeats", "timed rounds (the fastest kept)", default = 5, cpu = 1, min = 1 },
  { "torch", "a results file of tests/reference/torch_gemm.py: its rows beside ours", type = "string" },
  { "json", "also write the rows (with the environment) to this file", type = "string" },
}

local kinds = {
  bf16 = { dtype = "bf16" },
  fp8 = { dtype = "f8e4m3" },
  fp8_rowwise = { dtype = "f8e4m3", rowwise = true },
  fp8_fast = { dtype = "f8e4m3", fast_accum = true },
}
local shapes = {}
for _, s in ipairs(opt.shapes) do
  local m, n, k = s:match("^(%d+)x(%d+)x(%d+)$")
  if not m then tf.exit(2, "gemm_benchmark.lua: a shape is MxNxK, like 4096x10240x2560, not '" .. s .. "'\n") end
  shapes[#shapes + 1] = { m = tonumber(m), n = tonumber(n), k = tonumber(k) }
end
for _, k in ipairs(opt.kinds) do
  if not kinds[k] then tf.exit(2, "gemm_benchmark.lua: unknown kind '" .. k .. "' (bf16, fp8, fp8_rowwise, fp8_fast)\n") end
end

local ref = {}
if opt.torch then
  local f = io.open(opt.torch, "rb") or tf.exit(2, "gemm_benchmark.lua: cannot read " .. opt.torch .. "\n")
  local doc = tf.json.decode(f:read("a"))
  f:close()
  for _, r in ipairs(doc.rows or doc) do ref[string.format("%dx%dx%d/%s", r.m, r.n, r.k, r.kind)] = r end
end

-- The product of one kind on fresh operands, as a function of no arguments.
local function product(shape, kind)
  local spec = kinds[kind]
  local a = tf.randn({ shape.m, shape.k })
  local w = tf.randn({ shape.n, shape.k })
  if spec.dtype == "bf16" then
    a, w = a:to("bf16"), w:to("bf16")
    local wt = w:t()
    return function() return tf.matmul(a, wt) end
  end
  -- scaled as current scaling would scale them: each operand's amax onto the format's max
  local top = tf.finfo(spec.dtype).max
  local sa, sw = a:abs():max() / top, w:abs():max() / top
  if spec.rowwise then
    sa = a:abs():max(1, true) / top
    sw = w:abs():max(1, true):t() / top
  end
  local a8 = tf.cast(a / sa, spec.dtype, { saturate = true })
  local w8t = tf.cast(w / (spec.rowwise and sw:t() or sw), spec.dtype, { saturate = true }):t()
  local opts = { scale_a = sa, scale_b = sw, out_dtype = "bf16", fast_accum = spec.fast_accum }
  return function() return tf.scaled_matmul(a8, w8t, opts) end
end

local rows = {}
local sweep = tf.report.sweep{ total = #shapes * #opt.kinds, json = opt.json, results = rows,
  extra = { options = opt, key = { "m", "n", "k", "kind" }, metrics = { "ms", "tflops" } } }
for _, shape in ipairs(shapes) do
  for _, kind in ipairs(opt.kinds) do
    sweep:start("%dx%dx%d %s", shape.m, shape.n, shape.k, kind)
    local run = product(shape, kind)
    for _ = 1, opt.warmup do run() end
    local best
    for _ = 1, opt.repeats do
      tf.sync()
      local t <close> = tf.timer()
      for _ = 1, opt.iters do run() end
      local ms = t:ms() / opt.iters
      if not best or ms < best then best = ms end
      collectgarbage()
    end
    local row = { m = shape.m, n = shape.n, k = shape.k, kind = kind, ms = best,
      tflops = 2 * shape.m * shape.n * shape.k / (best * 1e-3) / 1e12 }
    local r = ref[string.format("%dx%dx%d/%s", shape.m, shape.n, shape.k, kind)]
    if r then
      row.torch_ms, row.torch_tflops = r.ms, r.tflops
      row.speedup = r.ms / best
    end
    rows[#rows + 1] = row
    run = nil
    collectgarbage()
    sweep:done()
  end
end
sweep:finish()

local function fmt(f) return function(v) return v and string.format(f, v) or "-" end end
tf.report.table(rows, { title = string.format("Matrix products on %s (C = A B^T, bf16 out)", tf.device()),
  columns = { { "m", "M", "%d" }, { "n", "N", "%d" }, { "k", "K", "%d" }, "kind", { "ms", "ms", "%.4f" },
    { "tflops", "TFLOP/s", "%.1f" }, { "torch_ms", "PyTorch ms", fmt("%.4f") },
    { "torch_tflops", "PyTorch TFLOP/s", fmt("%.1f") }, { "speedup", "x PyTorch", fmt("%.3f") } } })
if opt.json then print("wrote " .. opt.json) end
