--- hello: the smallest tfhost experiment. Prints the device, runs a
-- matrix product there and checks it against the CPU, and times it.
--
--   tfhost experiments/hello.lua [--size N] [--dtype f32|bf16|f16] [--json out.json]
local opt = tf.options{
  description = "Print the device, multiply two random matrices on it, check against the CPU, and time it.",
  { "size", "matrix size N (an N x N product)", default = 1024, min = 1 },
  { "dtype", "element type of the product", default = "f32", choices = { "f32", "f16", "bf16", "f64" } },
  { "iters", "timed repetitions", default = 10, min = 1 },
  { "json", "also write the results (with the environment) to this file", type = "string" },
}

print("tfhost " .. tf.version .. " (" .. tf.commit .. ")")
print("device: " .. tf.device())

local n, dtype = opt.size, opt.dtype
local a = tf.randn(n, n, { dtype = dtype })
local b = tf.randn(n, n, { dtype = dtype })
tf.sync()
local t0 = tf.now()
local c = tf.matmul(a, b)
tf.sync()
local first_ms = tf.now() - t0
print(string.format("c = a @ b for %d x %d %s matrices; c[0, :4] =", n, n, dtype))
print(c:narrow(0, 0, 1):narrow(1, 0, 4))

-- The same product on the CPU (the reference backend), on a corner when large.
local m = math.min(n, 256)
local ref = tf.matmul(a:narrow(0, 0, m):to("cpu"):to("f64"), b:narrow(1, 0, m):to("cpu"):to("f64"))
local got = c:narrow(0, 0, m):narrow(1, 0, m):to("cpu"):to("f64")
local diff = got - ref
local relerr = math.sqrt((diff * diff):sum():item() / (ref * ref):sum():item())
print(string.format("relative error against an f64 CPU product: %.2e", relerr))

-- A slow product (a large one on a CPU) says how long the timing will take.
local calls = 2 + opt.iters
local slow = first_ms * calls > 5000
if slow then
  tf.report.progress("timing %d products of about %.1f s each (about %.0f s) ...\n", calls, first_ms / 1e3,
    first_ms * calls / 1e3)
end
local done = 0
local stats = tf.bench(function()
  tf.matmul(a, b)
  done = done + 1
  if slow then tf.report.progress("  %d/%d\n", done, calls) end
end, { warmup = 2, iters = opt.iters })
local tflops = 2 * n ^ 3 / (stats.median * 1e-3) / 1e12
local rows = { { device = tf.device(), n = n, dtype = dtype, median_ms = stats.median, mean_ms = stats.mean,
  std_ms = stats.std, tflops = tflops, relerr = relerr } }
tf.report.table(rows, { columns = { "device", "n", "dtype", { "median_ms", "median ms", "%.3f" },
  { "std_ms", "std ms", "%.3f" }, { "tflops", "TFLOP/s", "%.2f" }, { "relerr", "rel. error", "%.1e" } } })

if opt.json then
  tf.results.write(opt.json, rows)
  print("wrote " .. opt.json)
end
