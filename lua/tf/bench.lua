--- Benchmarking: time a function with device synchronisation.
local M = {}

--- Statistics of a list of samples (ms): mean, std (n - 1), median, min, max.
function M.summarize(samples)
  if type(samples) ~= "table" then error("tf.bench.summarize: expects a list of samples (ms), not " .. type(samples), 2) end
  for i, v in ipairs(samples) do
    if type(v) ~= "number" then error("tf.bench.summarize: sample " .. i .. " is a " .. type(v) .. ", not a number", 2) end
  end
  local n = #samples
  local s = { samples = samples, n = n }
  if n == 0 then return s end
  local sum, min, max = 0, math.huge, -math.huge
  for _, v in ipairs(samples) do
    sum = sum + v
    if v < min then min = v end
    if v > max then max = v end
  end
  local mean = sum / n
  local var = 0
  for _, v in ipairs(samples) do var = var + (v - mean) ^ 2 end
  local sorted = table.move(samples, 1, n, 1, {})
  table.sort(sorted)
  local median = n % 2 == 1 and sorted[(n + 1) // 2] or (sorted[n // 2] + sorted[n // 2 + 1]) / 2
  s.mean, s.std, s.median, s.min, s.max = mean, n > 1 and math.sqrt(var / (n - 1)) or 0, median, min, max
  return s
end

--- tf.bench(fn, {warmup = 5, iters = 10, setup, teardown}): runs fn `warmup`
-- times, then `iters` timed times, synchronising every device before and
-- after each call, so each sample is the wall time of one complete call;
-- a full garbage collection before each call (untimed) frees what the
-- previous calls dropped.
-- With setup, every call is fn(setup()) and teardown(setup's results)
-- follows it, both untimed (e.g. a fresh forward pass before each timed
-- backward pass). Returns {samples, mean, std, median, min, max, n,
-- warmup} in milliseconds.
function M.bench(fn, opts)
  local tf = require "tf"
  if type(fn) ~= "function" then error("tf.bench: expects a function", 2) end
  opts = require("tf.check").keys(opts, "tf.bench", { "warmup", "iters", "setup", "teardown" })
  local warmup, iters = opts.warmup or 5, opts.iters or 10
  if math.type(warmup) ~= "integer" or warmup < 0 then error("tf.bench: warmup must be an integer >= 0", 2) end
  if math.type(iters) ~= "integer" or iters < 1 then error("tf.bench: iters must be an integer >= 1", 2) end
  local setup, teardown = opts.setup, opts.teardown
  if setup ~= nil and type(setup) ~= "function" then error("tf.bench: setup must be a function", 2) end
  if teardown ~= nil and type(teardown) ~= "function" then error("tf.bench: teardown must be a function", 2) end
  local function sample()
    local args = setup and table.pack(setup()) or { n = 0 }
    -- Tensors the last call dropped go back to the allocator now, untimed, as PyTorch frees a
    -- dropped tensor at once: Lua's collector does not see their memory and could leave dozens
    -- alive, each call then taking fresh memory (page faults on the CPU, cudaMalloc on a GPU).
    collectgarbage()
    tf.sync()
    local t0 = tf.now()
    fn(table.unpack(args, 1, args.n))
    tf.sync()
    local ms = tf.now() - t0
    if teardown then teardown(table.unpack(args, 1, args.n)) end
    return ms
  end
  for _ = 1, warmup do sample() end
  local samples = {}
  for i = 1, iters do samples[i] = sample() end
  local s = M.summarize(samples)
  s.warmup = warmup
  return s
end

--- tf.bench.backward(forward, grad, leaves, opts): times out:backward(grad)
-- alone, each call after a fresh untimed out = forward(); the output is
-- freed and the leaves' gradients dropped between calls (untimed). opts as
-- tf.bench (warmup, iters).
function M.backward(forward, grad, leaves, opts)
  local check = require "tf.check"
  opts = check.keys(opts, "tf.bench.backward", { "warmup", "iters" })
  check.arg(forward, "tf.bench.backward", "forward", "function")
  check.arg(grad, "tf.bench.backward", "grad", "tensor", true)
  check.arg(leaves, "tf.bench.backward", "leaves (a list of tensors)", "table")
  local tf = require "tf"
  return M.bench(function(out)
    if not tf.is_tensor(out) then
      error("tf.bench.backward: forward must return a tensor, not " .. check.what_is(out), 2)
    end
    out:backward(grad)
  end, {
    warmup = opts.warmup, iters = opts.iters, setup = forward,
    teardown = function(out)
      out:free()
      for _, t in ipairs(leaves) do t:zero_grad() end
    end,
  })
end

--- The device's copy rate in GB/s (and the copy's ms): a 1 GiB f32 tensor
-- copied on the device (read and written: 2 GiB moved), the median of a
-- few copies; the yardstick of the memory-bound experiments.
function M.copy_rate()
  local tf = require "tf"
  local n = 1 << 28
  local a, b = tf.randn(n), tf.zeros(n)
  local s = M.bench(function() b:copy_(a) end, { warmup = 3, iters = 15 })
  a:free(); b:free()
  return 2 * 4 * n / (s.median * 1e-3) / 1e9, s.median
end

return M
