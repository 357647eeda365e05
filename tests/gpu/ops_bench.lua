--- Times the eager NN ops whose kernels the fused engine shares (norms,
-- softmax, cross-entropy, RoPE, embedding, matmul), forward and
-- forward+backward, at the sizes of the 2.7B model's step (batch 4, context
-- 1024, width 2560, 32 heads of 80, vocabulary 10000). For comparing two
-- builds on one GPU in one call (tests/gpu/ops_compare.sh): both print the
-- same table and write the same JSON.
--
--   tfhost tests/gpu/ops_bench.lua [--dtype bf16] [--iters 20] [--json out.json]
local opt = tf.options{
  description = "Time the eager NN ops that share kernels with the fused engine.",
  { "dtype", "element type of the inputs", default = "bf16", choices = { "f32", "bf16", "f16" } },
  { "iters", "timed calls per op", default = 20 },
  { "warmup", "untimed calls first", default = 5 },
  { "ops", "which ops (default: all)", type = "list" },
  { "json", "write the rows and the environment to this file", type = "string" },
}

local dt = opt.dtype
local B, T, D, H, V = 4, 1024, 2560, 32, 10000
local hd = D // H
local rows = B * T
local bench = { warmup = opt.warmup, iters = opt.iters }

-- A random tensor of dtype dt and the given dims that requires grad.
local function randn_of(dtype, dims)
  local args = { table.unpack(dims) }
  args[#args + 1] = { dtype = dtype }
  return tf.randn(table.unpack(args))
end

local function leaf(...)
  return randn_of(dt, { ... }):requires_grad(true)
end

local cases = {
  { "rms_norm", function()
      local x, g = leaf(rows, D), tf.ones(D):requires_grad(true)
      return function() return tf.rms_norm(x, g) end, { x, g }, { rows, D }
    end },
  { "layer_norm", function()
      local x, w, b = leaf(rows, D), tf.ones(D):requires_grad(true), tf.zeros(D):requires_grad(true)
      return function() return tf.layer_norm(x, w, b) end, { x, w, b }, { rows, D }
    end },
  { "softmax", function()
      local x = leaf(B * H * 64, T)
      return function() return tf.softmax(x) end, { x }, { B * H * 64, T }
    end },
  { "cross_entropy", function()
      local logits = leaf(rows, V)
      local targets = tf.randint(0, V, { rows })
      return function() return tf.cross_entropy(logits, targets) end, { logits }, {}
    end },
  { "rope", function()
      local x = leaf(B, H, T, hd)
      return function() return tf.rope(x) end, { x }, { B, H, T, hd }
    end },
  { "embedding", function()
      local w = tf.randn(V, D):requires_grad(true)
      local ids = tf.randint(0, V, { B, T })
      return function() return tf.embedding(w, ids) end, { w }, { B, T, D }
    end },
  { "matmul", function()
      local a, b = leaf(rows, D), leaf(D, 4 * D)
      return function() return tf.matmul(a, b) end, { a, b }, { rows, 4 * D }
    end },
}

if opt.ops then
  local wanted, chosen = {}, {}
  for _, name in ipairs(opt.ops) do wanted[name] = true end
  for _, case in ipairs(cases) do
    if wanted[case[1]] then chosen[#chosen + 1] = case; wanted[case[1]] = nil end
  end
  local unknown = next(wanted)
  if unknown then tf.exit(2, "ops_bench.lua: unknown op '" .. unknown .. "'\n") end
  cases = chosen
end

local out = {}
print(string.format("device %s, %s, batch %d, context %d, width %d", tf.device(), dt, B, T, D))
print("| op | fwd ms | fwd+bwd ms |")
print("|---|---|---|")
for i, case in ipairs(cases) do
  local name = case[1]
  tf.report.progress("[%d/%d] %s", i, #cases, name)
  local forward, leaves, shape = case[2]()
  local fwd = tf.bench(forward, bench)
  local grad
  if #shape > 0 then grad = randn_of(name == "embedding" and "f32" or dt, shape)
  else grad = tf.ones({}) end
  local bwd = tf.bench.backward(forward, grad, leaves, bench)
  local row = { op = name, dtype = dt, fwd_ms = fwd.median, bwd_ms = bwd.median, fwdbwd_ms = fwd.median + bwd.median }
  out[#out + 1] = row
  print(string.format("| %s | %.3f | %.3f |", name, row.fwd_ms, row.fwdbwd_ms))
  for _, t in ipairs(leaves) do t:free() end
  grad:free()
  tf.mem.empty_cache()
end
if opt.json then tf.results.write(opt.json, out, { options = opt }) end
