-- Autograd, autocast, nn modules and optimizers on the GPU against the same
-- computation on the CPU, on fresh random inputs: outputs and every
-- gradient within f32 1e-5 (relative, norm-wise), bf16 autocast within 1e-2.
-- Skipped (exit 77) without a GPU.
local T = require "harness"
T.require_cuda()
local seed = T.fresh_seed()

-- Runs fn(inputs...) -> scalar-able output on both devices; compares output
-- and gradients. Float inputs are converted to dtype (default f32).
local function both(name, fn, make_inputs, tol, dtype)
  tol = tol or 1e-5
  tf.seed(seed)
  local base = make_inputs()
  local results = {}
  for _, dev in ipairs({ "cpu", "cuda" }) do
    local inputs = {}
    for i, x in ipairs(base) do
      local moved = x:to(dev)
      if moved.dtype ~= "i64" and moved.dtype ~= "i32" and moved.dtype ~= "bool" then
        moved = moved:to(dtype or "f32"):detach():requires_grad(true)
      end
      inputs[i] = moved
    end
    local out = fn(table.unpack(inputs))
    -- a random upstream gradient (a constant one would make softmax's exactly 0)
    tf.seed(seed + 1)
    local w = tf.rand(out:size(), { device = "cpu" }):to(dev, out.dtype)
    ;(out * w):sum():backward()
    local grads = {}
    for i, x in ipairs(inputs) do grads[i] = x.grad end
    results[dev] = { out = out, grads = grads }
  end
  local c, g = results.cpu, results.cuda
  T.eq(g.out.device, "cuda:0")
  local e = T.relerr(g.out, c.out)
  T.ok(e <= tol, string.format("%s: output relerr %.3g", name, e))
  for i, cg in pairs(c.grads) do
    local gg = g.grads[i]
    T.ok(gg ~= nil, name .. ": gradient " .. i .. " on the GPU")
    local ge = T.relerr(gg, cg)
    T.ok(ge <= tol, string.format("%s: gradient %d relerr %.3g", name, i, ge))
  end
end

local function rn(...) local s = { ... }; return function() return tf.randn(s, { device = "cpu" }) end end
local function inputs(...)
  local makers = { ... }
  return function()
    local out = {}
    for i, m in ipairs(makers) do out[i] = m() end
    return out
  end
end
local function pos(...) local s = { ... }; return function() return tf.rand(s, { device = "cpu" }) + 0.5 end end

T.test("elementwise ops, reductions, matmul, linear", function()
  for _, name in ipairs({ "neg", "abs", "relu", "square", "exp", "sigmoid", "silu", "gelu", "tanh", "sin", "cos" }) do
    both(name, function(x) return tf[name](x) end, inputs(rn(33, 65)))
  end
  for _, name in ipairs({ "log", "sqrt", "rsqrt" }) do both(name, function(x) return tf[name](x) end, inputs(pos(33, 65))) end
  for _, name in ipairs({ "add", "sub", "mul", "div", "maximum", "minimum", "pow" }) do
    both(name, function(a, b) return tf[name](a, b) end, inputs(pos(4, 1, 33), pos(7, 33)))
  end
  for _, name in ipairs({ "sum", "mean", "max", "min" }) do
    both(name .. " dim", function(x) return x[name](x, 1) end, inputs(rn(6, 50, 7)))
    both(name .. " all", function(x) return x[name](x) end, inputs(rn(60, 70)))
  end
  both("matmul", tf.matmul, inputs(rn(3, 64, 48), rn(48, 80)))
  both("matmul transposed", function(a, b) return tf.matmul(a:t(), b) end, inputs(rn(48, 64), rn(48, 80)))
  both("linear", tf.linear, inputs(rn(4, 16, 96), rn(80, 96), rn(80)))
  both("views", function(x) return x:t():reshape(4, -1):narrow(1, 2, 10):select(0, 2):unsqueeze(0):expand(3, 10) end,
    inputs(rn(8, 6)))
end)

T.test("nn functions", function()
  both("softmax", function(x) return x:softmax() end, inputs(rn(17, 300)))
  both("log_softmax dim 0", function(x) return x:log_softmax(0) end, inputs(rn(17, 30)))
  both("layer_norm", tf.layer_norm, inputs(rn(9, 257), rn(257), rn(257)))
  both("rms_norm", tf.rms_norm, inputs(rn(9, 257), rn(257)))
  local targets = function() return tf.randint(0, 1000, { 64 }, { device = "cpu" }) end
  both("cross_entropy", tf.cross_entropy, inputs(rn(64, 1000), targets))
  both("rope", function(x) return tf.rope(x, 10000) end, inputs(rn(2, 4, 33, 64)))
  local ids = function() return tf.randint(0, 50, { 8, 33 }, { device = "cpu" }) end
  both("embedding", tf.embedding, inputs(rn(50, 64), ids))
  both("masked attention", function(q, k, v)
    local mask = tf.causal_mask(33, { device = q.device })
    local s = tf.matmul(q, k:transpose(-1, -2)) / 8
    return tf.matmul(s:masked_fill(tf.eq(mask:to("i32"), 0), -math.huge):softmax(-1), v)
  end, inputs(rn(2, 33, 64), rn(2, 33, 64), rn(2, 33, 64)))
end)

T.test("f16 and bf16 forward and backward match the CPU within 1e-2", function()
  for _, dtype in ipairs({ "f16", "bf16" }) do
    for _, name in ipairs({ "relu", "exp", "silu", "gelu", "tanh" }) do
      both(name .. " " .. dtype, function(x) return tf[name](x) end, inputs(rn(33, 65)), 1e-2, dtype)
    end
    both("mul " .. dtype, tf.mul, inputs(rn(4, 1, 33), rn(7, 33)), 1e-2, dtype)
    both("sum " .. dtype, function(x) return x:sum(1) end, inputs(rn(6, 50, 7)), 1e-2, dtype)
    both("matmul " .. dtype, tf.matmul, inputs(rn(64, 48), rn(48, 80)), 1e-2, dtype)
    both("softmax " .. dtype, function(x) return x:softmax() end, inputs(rn(17, 300)), 1e-2, dtype)
    both("layer_norm " .. dtype, tf.layer_norm, inputs(rn(9, 257), rn(257), rn(257)), 1e-2, dtype)
    both("rms_norm " .. dtype, tf.rms_norm, inputs(rn(9, 257), rn(257)), 1e-2, dtype)
    both("rope " .. dtype, function(x) return tf.rope(x, 10000) end, inputs(rn(2, 4, 33, 64)), 1e-2, dtype)
    local targets = function() return tf.randint(0, 1000, { 64 }, { device = "cpu" }) end
    both("cross_entropy " .. dtype, tf.cross_entropy, inputs(rn(64, 1000), targets), 1e-2, dtype)
  end
end)

T.test("embedding gradients are bit-identical run to run", function()
  local w = tf.randn(1000, 64, { device = "cuda" }):requires_grad(true)
  local ids = tf.randint(0, 20, { 4096 }, { device = "cuda" }) -- many repeats
  local grads = {}
  for run = 1, 2 do
    w:zero_grad()
    tf.embedding(w, ids):sum():backward()
    grads[run] = w.grad:to("cpu"):tolist()
  end
  T.eq(grads[1], grads[2])
end)

T.test("bf16 autocast on the GPU: dtypes and gradients as on the CPU", function()
  local results = {}
  for _, dev in ipairs({ "cpu", "cuda" }) do
    tf.seed(seed)
    local model = tf.nn.Sequential(tf.nn.Linear(64, 128, { device = dev }), tf.nn.LayerNorm(128, { device = dev }),
      tf.nn.GELU(), tf.nn.Linear(128, 10, { device = dev }))
    local x, y = tf.randn(32, 64, { device = dev }), tf.randint(0, 10, { 32 }, { device = dev })
    local logits, loss
    tf.autocast("bf16", function()
      logits = model(x)
      loss = tf.cross_entropy(logits, y)
    end)
    loss:backward()
    results[dev] = { logits = logits, loss = loss, grad = model["0"].weight.grad }
  end
  T.eq(results.cuda.logits.dtype, "bf16")
  T.eq(results.cuda.loss.dtype, "f32")
  T.eq(results.cuda.grad.dtype, "f32")
  T.ok(T.relerr(results.cuda.logits, results.cpu.logits) < 1e-2)
  T.ok(T.relerr(results.cuda.grad, results.cpu.grad) < 1e-2, "relerr " .. T.relerr(results.cuda.grad, results.cpu.grad))
end)

T.test("an AdamW training step matches the CPU", function()
  local params = {}
  for _, dev in ipairs({ "cpu", "cuda" }) do
    tf.seed(seed)
    local model = tf.nn.Sequential(tf.nn.Linear(32, 64, { device = dev }), tf.nn.SiLU(), tf.nn.Linear(64, 8, { device = dev }))
    local opt = tf.optim.AdamW(model, { lr = 1e-2 })
    local x, y = tf.randn(16, 32, { device = dev }), tf.randint(0, 8, { 16 }, { device = dev })
    for _ = 1, 3 do
      tf.cross_entropy(model(x), y):backward()
      opt:step()
      opt:zero_grad()
    end
    params[dev] = model["2"].weight
  end
  T.ok(T.relerr(params.cuda, params.cpu) < 1e-5, "relerr " .. T.relerr(params.cuda, params.cpu))
end)

T.test("the conformance vectors on the GPU come from test_conformance.lua; here memory after backward", function()
  collectgarbage()
  tf.mem.empty_cache("cuda")
  local w = tf.randn(512, 512, { device = "cuda" }):requires_grad(true)
  local x = tf.randn(256, 512, { device = "cuda" })
  collectgarbage()
  local before = tf.mem.stats("cuda").allocated
  local loss = tf.matmul(tf.matmul(x, w):gelu(), w):softmax():log():sum()
  loss:backward()
  loss = nil
  collectgarbage()
  T.eq(tf.mem.stats("cuda").allocated, before + w.grad.nbytes)
end)

T.run()
