-- The fused engine through its low-level binding tf._model (tf.model is
-- built on it): parameter names, shapes and counts, configuration and input
-- errors, logits' shape and dtype per precision, training on a fixed batch,
-- bit-identical runs, planned activation memory, views sharing the engine's
-- storage, agreement with the eager Lua model (tf.models.transformer), and
-- with PyTorch when tests/reference/oracles/lm_tiny.safetensors exists.
-- Runs on the default device (a GPU when there is one).
local T = require "harness"
tf.seed(T.fresh_seed())

-- tf._model: the engine as tf.model uses it.
local E = tf._model
local dev = tf.default_device()
local TINY = { vocab_size = 64, context_length = 16, d_model = 32, num_layers = 2, num_heads = 4, d_ff = 64,
  rope_theta = 10000.0 }

local function with(cfg, changes)
  local c = {}
  for k, v in pairs(cfg) do c[k] = v end
  for k, v in pairs(changes or {}) do c[k] = v end
  return c
end

local function ids(b, t, v) return tf.randint(0, v or TINY.vocab_size, { b, t }, { device = dev }) end

local function relerr(a, b) return T.relerr(a, b) end

local function formula(c)
  local d, f = c.d_model, c.d_ff
  return 2 * c.vocab_size * d + c.num_layers * (4 * d * d + 3 * d * f + 2 * d) + d
end

T.test("parameter names, shapes and counts", function()
  local m <close> = E.create(TINY, { device = dev })
  local params = m:parameters()
  T.eq(#params, 1 + 9 * TINY.num_layers + 2)
  local expect = { "token_embeddings.weight" }
  for l = 0, TINY.num_layers - 1 do
    for _, s in ipairs({ "ln1", "attn.q_proj", "attn.k_proj", "attn.v_proj", "attn.output_proj", "ln2", "ffn.w1",
      "ffn.w2", "ffn.w3" }) do
      expect[#expect + 1] = string.format("layers.%d.%s.weight", l, s)
    end
  end
  expect[#expect + 1] = "ln_final.weight"
  expect[#expect + 1] = "lm_head.weight"
  local names, total = {}, 0
  for i, p in ipairs(params) do
    names[i] = p.name
    T.eq(p[1], p.name)
    T.ok(p[2] == p.tensor)
    T.eq(p.tensor.dtype, "f32")
    T.eq(p.tensor.device, dev)
    total = total + p.tensor:numel()
  end
  T.eq(names, expect)
  local shape = {}
  for _, p in ipairs(params) do shape[p.name] = p.tensor:size() end
  T.eq(shape["token_embeddings.weight"], { 64, 32 })
  T.eq(shape["layers.1.attn.q_proj.weight"], { 32, 32 })
  T.eq(shape["layers.0.ffn.w1.weight"], { 64, 32 })
  T.eq(shape["layers.0.ffn.w2.weight"], { 32, 64 })
  T.eq(shape["layers.0.ffn.w3.weight"], { 64, 32 })
  T.eq(shape["ln_final.weight"], { 32 })
  T.eq(shape["lm_head.weight"], { 64, 32 })
  T.eq(total, E.parameter_count(TINY))
  T.eq(m:info().parameters, total)
  T.eq(m:info().precision, "f32")
  T.eq(m:config(), TINY)
  for i, g in ipairs(m:grads()) do
    T.eq(g.name, params[i].name)
    T.eq(g.tensor:size(), params[i].tensor:size())
    T.eq(g.tensor:abs():max():item(), 0.0)
  end
  -- the presets (DESIGN.md; vocab 10000): the formula, without making them
  local presets = { small = { 768, 3072, 12, 12 }, medium = { 1024, 4096, 24, 16 }, large = { 1280, 5120, 36, 20 },
    xl = { 1600, 6400, 48, 25 }, ["2.7B"] = { 2560, 10240, 32, 32 } }
  for name, p in pairs(presets) do
    local c = { vocab_size = 10000, context_length = 256, d_model = p[1], d_ff = p[2], num_layers = p[3], num_heads = p[4] }
    T.eq(E.parameter_count(c), formula(c), name)
  end
  T.eq(E.parameter_count(with(TINY, { vocab_size = 10000, d_model = 768, d_ff = 3072, num_layers = 12, num_heads = 12 })),
    128625408)
  if tf.cuda.is_available() then -- the small preset itself, on the GPU
    local s <close> = E.create({ vocab_size = 10000, context_length = 256, d_model = 768, d_ff = 3072, num_layers = 12,
      num_heads = 12 }, { device = "cuda", precision = "bf16" })
    local n = 0
    for _, p in ipairs(s:parameters()) do n = n + p.tensor:numel() end
    T.eq(n, 128625408)
    T.ok(s:memory().low_precision >= 2 * (n - 2 * 10000 * 768), "a bf16 copy of the matmul weights")
  end
end)

T.test("configuration errors are clear", function()
  T.raises(function() E.create(with(TINY, { num_heads = 5 })) end, "d_model (32) must be divisible by num_heads (5)")
  T.raises(function() E.create(with(TINY, { num_heads = 32 })) end, "must be even")
  T.raises(function() E.create(with(TINY, { d_ff = 0 })) end, "d_ff must be a positive integer, not 0")
  T.raises(function() E.create(with(TINY, { num_layers = -2 })) end, "num_layers must be a positive integer")
  T.raises(function() E.create(with(TINY, { rope_theta = -1 })) end, "rope_theta")
  T.raises(function() E.create(with(TINY, { d_model = 32.5 })) end, "'d_model' must be an integer")
  T.raises(function() E.create(with(TINY, { vocab_size = false })) end, "'vocab_size' must be an integer")
  T.raises(function() E.create(with(TINY, { dmodel = 3 })) end, "unknown option 'dmodel' (did you mean d_model?)")
  T.raises(function()
    local c = with(TINY)
    c.d_ff = nil
    E.create(c)
  end, "'d_ff' must be an integer, not missing")
  T.raises(function() E.create(TINY, { precision = "f64" }) end, "precision must be f32, bf16 or f16")
  T.raises(function() E.create(TINY, { precision = "f8" }) end, "tf._model.create")
  T.raises(function() E.create(TINY, { device = "tpu" }) end, "unknown device")
  T.raises(function() E.create(TINY, { colour = "red" }) end, "unknown option 'colour'")
  T.raises(function() E.parameter_count(with(TINY, { num_heads = 3 })) end, "divisible")
end)

T.test("input errors are clear, and the engine keeps working", function()
  local m <close> = E.create(TINY, { device = dev })
  local x, y = ids(2, 8), ids(2, 8)
  T.raises(function() m:backward() end, "call loss() first")
  T.raises(function() m:forward(tf.zeros(1, 17, { dtype = "i64", device = dev })) end,
    "sequence length 17 of ids is longer than the context length 16")
  local function with_bad(value)
    local v = x:to("cpu"):tolist()
    v[2][4] = value
    return tf.tensor(v, { dtype = "i64", device = dev })
  end
  T.raises(function() m:forward(with_bad(64)) end,
    "token id 64 at position [1, 3] is out of range [0, 64) (the vocabulary size)")
  T.raises(function() m:loss(x, with_bad(64)) end, "target 64 at position [1, 3]")
  T.raises(function() m:loss(with_bad(-7), y) end, "token id -7 at position [1, 3]")
  T.raises(function() m:loss(x, y:reshape(16, 1)) end, "targets must have the shape of ids (2, 8), not (16, 1)")
  T.raises(function() m:forward(tf.zeros(2, 8, { device = dev })) end, "ids must be i32 or i64 token ids, not f32")
  T.raises(function() m:forward(x:reshape(16)) end, "ids must be 2-D (batch, seq)")
  T.raises(function() m:forward(tf.zeros(0, 8, { dtype = "i64", device = dev })) end, "must not be empty")
  T.raises(function() m:adamw_step({ lr = 1e-3 }) end, "option 'step' must be an integer")
  T.raises(function() m:adamw_step({ step = 0 }) end, "step counts from 1")
  T.raises(function() m:adamw_step({ step = 1, lr = "big" }) end, "option 'lr' must be a number")
  m:loss(x, y)
  m:backward()
  T.raises(function() m:backward() end, "one backward per loss")
  T.eq(m:forward(x:to("i32")).dtype, "f32", "i32 ids work")
  T.eq(m:forward(x:to("cpu")).shape, m:forward(x).shape, "ids on the CPU work too")
  m:free()
  m:free() -- harmless the second time
  T.raises(function() m:forward(x) end, "model has been freed")
  T.ok(tostring(m):find("freed"), tostring(m))
end)

T.test("forward: logits shape and dtype per precision", function()
  local x = ids(3, 5)
  for _, p in ipairs({ "f32", "bf16", "f16" }) do
    local m <close> = E.create(TINY, { device = dev, precision = p })
    local logits = m:forward(x)
    T.eq(logits:size(), { 3, 5, 64 }, p)
    T.eq(logits.dtype, p)
    T.eq(logits.device, dev)
    T.eq(m:forward(x, true).dtype, p, "training-mode forward")
    local loss = m:loss(x, x)
    T.eq(loss.ndim, 0)
    T.eq(loss.dtype, "f32", "the loss is f32 under every precision")
    T.ok(tostring(m):find(p, 1, true), tostring(m))
  end
end)

local function train(cfg, precision, seed, x, y, steps)
  tf.seed(seed)
  local m <close> = E.create(cfg, { device = dev, precision = precision })
  local losses = {}
  for s = 1, steps do
    local loss = m:loss(x, y)
    m:backward()
    m:adamw_step({ step = s, lr = 1e-2 })
    m:zero_grad()
    losses[s] = loss:item()
  end
  return losses
end

T.test("training: the loss goes down on a fixed batch; the same seed gives the same bits", function()
  local x, y = ids(4, 12), ids(4, 12)
  for _, p in ipairs({ "f32", "bf16" }) do
    local a = train(TINY, p, 11, x, y, 6)
    T.ok(a[6] < a[1] - 0.3, string.format("%s: loss %.4f -> %.4f", p, a[1], a[6]))
    T.eq(train(TINY, p, 11, x, y, 6), a, p .. ": bit-identical losses run to run")
    T.ok(train(TINY, p, 12, x, y, 1)[1] ~= a[1], p .. ": another seed, another model")
  end
end)

T.test("memory: activations planned once per shape", function()
  local m <close> = E.create(TINY, { device = dev, precision = "bf16" })
  local x, y = ids(2, 8), ids(2, 8)
  T.eq(m:memory().activations, 0)
  local stats = {}
  for s = 1, 4 do
    local loss = m:loss(x, y)
    m:backward()
    m:adamw_step({ step = s })
    m:zero_grad()
    loss:free()
    stats[s] = tf.mem.stats(dev)
  end
  local planned = m:memory().activations
  T.ok(planned > 0)
  if m:info().graphs then T.eq(m:info().graph_replays, 6, "steps 2 to 4 replayed CUDA graphs") end
  for s = 2, 4 do
    T.eq(stats[s].allocated, stats[1].allocated, "allocated, step " .. s)
    T.eq(stats[s].num_segment_allocs, stats[1].num_segment_allocs, "no new segments, step " .. s)
  end
  local logits = m:forward(x) -- inference at the planned shape: the training plan serves
  T.eq(m:memory().activations, planned)
  local keep = logits:to("cpu"):tolist()
  m:forward(ids(1, 16)) -- a new shape: a new (inference) plan
  local small = m:memory().activations
  T.ok(small > 0 and small ~= planned)
  T.eq(logits:to("cpu"):tolist(), keep, "returned logits survive a re-plan")
  m:loss(x, y)
  T.eq(m:memory().activations, planned, "back to the training plan")
  local mem = m:memory()
  T.eq(mem.grads, mem.params)
  T.eq(mem.optimizer, 2 * mem.params)
  T.ok(mem.low_precision > 0 and mem.low_precision < mem.params)
end)

T.test("memory: the optimizer beside the backward pass holds two matrices' gradients, not every layer's", function()
  if not tf.cuda.is_available() then T.skip_test("the optimizer runs beside the pass on a GPU's second stream only") end
  local cfg = with(TINY, { num_layers = 3, d_model = 64, d_ff = 192, num_heads = 4 })
  local m <close> = E.create(cfg, { device = dev, precision = "bf16" })
  local x, y = ids(2, 8), ids(2, 8)
  m:loss(x, y)
  m:backward_adamw({ step = 1 })
  -- the ring: one slot as large as w2 (the larger of w2 and output_proj), one as large as
  -- w1|w3 (the larger of w1|w3 and q|k|v), then lm_head's, the embedding's and the norms'
  -- places; every group starts at a multiple of 64 elements
  local d, f, V, L = cfg.d_model, cfg.d_ff, cfg.vocab_size, cfg.num_layers
  local elems = d * f + 2 * f * d + V * d + V * d + (2 * L + 1) * d
  local grads = m:memory().grads
  T.ok(grads >= 4 * elems and grads <= 4 * (elems + 64 * (2 * L + 5)),
    string.format("ring of %d bytes for %d elements", grads, elems))
  T.ok(grads < m:memory().params / 2, "less than half the flat gradients")
end)

T.test("recompute_residual: the same bits in a smaller plan", function()
  local cfg = with(TINY, { num_layers = 3 })
  local x, y = ids(2, 8), ids(2, 8)
  for _, p in ipairs({ "f32", "bf16" }) do
    tf.seed(5)
    local a <close> = E.create(cfg, { device = dev, precision = p })
    tf.seed(5)
    local b <close> = E.create(cfg, { device = dev, precision = p })
    T.eq(b:info().recompute_residual, false, p .. ": off by default")
    b:set_recompute_residual(true)
    T.eq(b:info().recompute_residual, true, p .. ": info says so")
    for s = 1, 3 do
      -- backward + adamw_step (flat gradients), then backward_adamw (the gradient ring)
      local la, lb = a:loss(x, y), b:loss(x, y)
      T.eq(lb:item(), la:item(), p .. ": loss, step " .. s)
      if s == 1 then
        a:backward()
        b:backward()
        for i, g in ipairs(a:grads()) do
          local h = b:grads()[i]
          T.eq((g.tensor:to("cpu"):to("f64") - h.tensor:to("cpu"):to("f64")):abs():max():item(), 0.0,
            p .. ": gradient of " .. g.name)
        end
        a:adamw_step({ step = s })
        b:adamw_step({ step = s })
        a:zero_grad()
        b:zero_grad()
      else
        a:backward_adamw({ step = s })
        b:backward_adamw({ step = s })
      end
    end
    for i, q in ipairs(a:parameters()) do
      local r = b:parameters()[i]
      T.eq((q.tensor:to("cpu"):to("f64") - r.tensor:to("cpu"):to("f64")):abs():max():item(), 0.0,
        p .. ": parameter " .. q.name .. " after 3 steps")
    end
    -- the plan (256-byte aligned ranges): in f32, 2L + 1 residual buffers against L + 1 and
    -- one shared; in bf16 both rebuild the stream after attention in one shared buffer, and
    -- recompute_residual drops the L kept projections it is rebuilt from
    local n, d = 2 * 8, cfg.d_model
    local round = function(bytes) return math.ceil(bytes / 256) * 256 end
    local saved = p == "f32" and (cfg.num_layers - 1) * round(n * d * 4) or cfg.num_layers * round(n * d * 2)
    T.eq(a:memory().activations - b:memory().activations, saved,
      p .. ": the plan is smaller by L - 1 residual buffers (f32) or L projections (bf16)")
  end
end)

T.test("out of memory is a clean error, and the engine keeps working", function()
  local cfg = with(TINY, { context_length = 256 })
  local m <close> = E.create(cfg, { device = dev })
  local x = ids(16, 256)
  tf.mem.empty_cache(dev)
  local before = tf.mem.stats(dev)
  tf.mem.set_limit(before.reserved + (1 << 20), dev)
  local ok, err = pcall(function() return m:loss(x, x) end)
  tf.mem.set_limit(nil, dev)
  T.ok(not ok and tf.mem.is_oom(err), tostring(err))
  T.eq(tf.mem.stats(dev).allocated, before.allocated, "nothing kept")
  T.eq(m:memory().activations, 0)
  T.raises(function() m:backward() end, "call loss() first")
  T.ok(m:loss(x, x):item() > 0)
  m:backward()
end)

T.test("views share the engine's storage and outlive it", function()
  local m = E.create(TINY, { device = dev, precision = "bf16" })
  local x, y = ids(2, 8), ids(2, 8)
  local head
  for _, p in ipairs(m:parameters()) do if p.name == "lm_head.weight" then head = p.tensor end end
  tf.no_grad(function() head:copy_(tf.zeros(64, 32, { device = dev })) end)
  T.eq(m:forward(x):abs():max():item(), 0.0, "the write reached the bf16 weights")
  local loss = m:loss(x, y)
  T.near(loss:item(), math.log(64), 1e-6, 0, "uniform logits")
  m:backward()
  local g = m:grads()
  local gh = g[#g].tensor
  T.ok(gh:abs():max():item() > 0)
  local before = gh:to("cpu"):tolist()
  m:loss(x, y)
  m:backward()
  T.near(gh:to("cpu"), tf.tensor(before):mul(2), 1e-5, 1e-7, "gradients accumulate")
  m:zero_grad()
  T.eq(gh:abs():max():item(), 0.0)
  m:free()
  T.eq(head:abs():max():item(), 0.0, "a view outlives the model")
  T.eq(gh:numel(), 64 * 32)
end)

-- Copies the parameters of an eager model (or a name -> tensor table) into the engine's views.
local function load_into(m, tensors)
  tf.no_grad(function()
    for _, p in ipairs(m:parameters()) do p.tensor:copy_(tensors[p.name]:to(p.tensor.device):to("f32")) end
  end)
end

T.test("the fused engine agrees with the eager Lua model", function()
  local ok, Tr = pcall(require, "tf.models.transformer")
  if not ok then
    T.ok(true, "no eager model in this build")
    return
  end
  local cfg = with(TINY)
  tf.seed(21)
  local eager = Tr.TransformerLM(cfg, { device = dev })
  local ep = {}
  for name, p in eager:named_parameters() do ep[name] = p end
  tf.seed(21)
  local m <close> = E.create(cfg, { device = dev })
  for _, p in ipairs(m:parameters()) do
    T.eq((p.tensor - ep[p.name]):abs():max():item(), 0.0, "the same seed, the same " .. p.name)
  end
  load_into(m, ep)
  local x, y = ids(2, 12), ids(2, 12)
  local logits = eager(x)
  T.ok(relerr(m:forward(x), logits) <= 1e-5, "logits relerr " .. relerr(m:forward(x), logits))
  local loss = tf.cross_entropy(logits:reshape(-1, 64), y:reshape(-1))
  loss:backward()
  T.near(m:loss(x, y):item(), loss:item(), 1e-5)
  m:backward()
  local worst, where = 0, ""
  for _, g in ipairs(m:grads()) do
    local e = relerr(g.tensor, ep[g.name].grad)
    if e > worst then worst, where = e, g.name end
  end
  T.ok(worst <= 1e-4, string.format("worst gradient relerr %.3g (%s)", worst, where))
  local mb <close> = E.create(cfg, { device = dev, precision = "bf16" })
  load_into(mb, ep)
  local lb = tf.no_grad(function() return tf.autocast("bf16", function() return eager(x) end) end)
  T.ok(relerr(mb:forward(x), lb) <= 2e-2, "bf16 logits relerr " .. relerr(mb:forward(x), lb))
end)

T.test("flash and naive attention give the same model; flash is the default under bf16", function()
  local cfg = with(TINY)
  local x, y = ids(2, 12), ids(2, 12)
  local runs = {}
  for _, spec in ipairs({ { "f32", "naive" }, { "f32", "flash" }, { "bf16", "naive" }, { "bf16", "flash" } }) do
    tf.seed(5)
    local m <close> = E.create(cfg, { device = dev, precision = spec[1], attention = spec[2] })
    T.eq(m:info().attention, spec[2])
    local loss = m:loss(x, y):item()
    m:backward()
    local grads = {}
    for _, g in ipairs(m:grads()) do grads[g.name] = g.tensor:clone() end
    runs[spec[1] .. " " .. spec[2]] = { loss = loss, grads = grads }
  end
  for _, prec in ipairs({ "f32", "bf16" }) do
    local a, b = runs[prec .. " naive"], runs[prec .. " flash"]
    local tol = prec == "f32" and 1e-5 or 2e-2
    T.near(b.loss, a.loss, tol)
    local worst = 0
    for name, g in pairs(a.grads) do worst = math.max(worst, relerr(b.grads[name], g)) end
    T.ok(worst <= (prec == "f32" and 1e-4 or 5e-2), string.format("%s: flash vs naive gradients relerr %.3g", prec, worst))
  end
  local f32 <close> = E.create(cfg, { device = dev })
  T.eq(f32:info().attention, "naive", "f32 keeps cuBLAS's f32 GEMMs")
  local low <close> = E.create(cfg, { device = dev, precision = "bf16" })
  T.eq(low:info().attention, "flash")
  T.raises(function() E.create(cfg, { attention = "fast" }) end, 'attention must be "flash" or "naive"')
end)

T.test("graphs: the option is accepted everywhere; info says whether replay is on", function()
  local cuda = dev:find("^cuda") ~= nil
  local env_off = os.getenv("TF_MODEL_GRAPHS") == "0"
  local m <close> = E.create(TINY, { device = dev })
  local info = m:info()
  T.eq(info.graphs_supported, cuda, "graphs exist on CUDA only")
  T.eq(info.graphs, cuda and not env_off, "on by default where supported")
  local off <close> = E.create(TINY, { device = dev, graphs = false })
  T.eq(off:info().graphs, false)
  off:set_graphs(true)
  T.eq(off:info().graphs, info.graphs, "set_graphs(true) takes where supported")
  m:set_graphs(false)
  T.eq(m:info().graphs, false)
  local x, y = ids(2, 8), ids(2, 8)
  for s = 1, 3 do
    m:loss(x, y)
    m:backward()
    m:adamw_step({ step = s })
    m:zero_grad()
  end
  T.eq({ m:info().graph_captures, m:info().graph_replays, m:info().graph_failures }, { 0, 0, 0 }, "off: all eager")
  if not cuda then
    local c <close> = E.create(TINY, { device = dev, graphs = true })
    c:loss(x, y)
    c:backward()
    c:loss(x, y)
    c:backward()
    T.eq(c:info().graphs, false, "asked for, but the CPU has no graphs")
    T.eq(c:info().graph_replays, 0)
  end
  T.raises(function() E.create(TINY, { graphs = "yes" }) end, "graphs must be true or false")
  T.raises(function() m:set_graphs() end, "boolean expected")
  local fused = tf.model.new({ preset = "tiny", vocab_size = 64, context_length = 16, device = dev, graphs = false })
  T.eq(fused.graphs, false)
  T.eq(fused.engine:info().graphs, false)
  fused:set_graphs(true)
  T.eq(fused.graphs, info.graphs, "m:set_graphs keeps m.graphs as the engine has it")
  T.eq(fused.engine:info().graphs, info.graphs)
  fused:set_graphs(false)
  T.eq(fused.graphs, false)
  T.raises(function() fused:set_graphs("on") end, "set_graphs expects true or false")
  local eager = tf.model.new({ preset = "tiny", vocab_size = 64, context_length = 16, device = dev, impl = "eager" })
  T.eq(eager.graphs, false, "the eager model has no graphs")
  eager:set_graphs(true)
  T.eq(eager.graphs, false, "asking the eager model changes nothing")
  T.raises(function() tf.model.new({ preset = "tiny", graphs = 1 }) end, "graphs must be true or false")
end)

T.test("the fused engine agrees with PyTorch (tests/reference/oracles/lm_tiny.safetensors)", function()
  local path = "tests/reference/oracles/lm_tiny.safetensors"
  local f = io.open(path, "rb")
  if not f then
    T.ok(true, "no oracle yet: run tests/reference/torch_lm.py where torch is")
    print("  (skipped: no " .. path .. ")")
    return
  end
  f:close()
  local o, meta = tf.safetensors.load(path, { device = dev })
  local cfg = {}
  for _, k in ipairs({ "vocab_size", "context_length", "d_model", "num_layers", "num_heads", "d_ff", "rope_theta" }) do
    cfg[k] = math.tointeger(tonumber(meta[k])) or tonumber(meta[k])
  end
  local m <close> = E.create(cfg, { device = dev })
  load_into(m, o)
  T.ok(relerr(m:forward(o.ids), o.logits) <= 1e-5, "logits relerr " .. relerr(m:forward(o.ids), o.logits))
  T.near(m:loss(o.ids, o.targets):item(), o.loss:item(), 1e-5)
  m:backward()
  local worst, where = 0, ""
  for _, g in ipairs(m:grads()) do
    local e = relerr(g.tensor, o["grad." .. g.name])
    if e > worst then worst, where = e, g.name end
  end
  T.ok(worst <= 1e-4, string.format("worst gradient relerr %.3g (%s)", worst, where))
  m:adamw_step({ step = 1, lr = 1e-3, beta1 = 0.9, beta2 = 0.999, eps = 1e-8, weight_decay = 0.01 })
  worst = 0
  for _, p in ipairs(m:parameters()) do
    local e = (p.tensor:to("cpu"):to("f64") - o["adamw." .. p.name]:to("cpu"):to("f64")):abs():max():item()
    if e > worst then worst, where = e, p.name end
  end
  T.ok(worst <= 1e-6, string.format("worst parameter difference after AdamW %.3g (%s)", worst, where))
  if o.logits_bf16 then
    local mb <close> = E.create(cfg, { device = dev, precision = "bf16" })
    load_into(mb, o)
    local e = relerr(mb:forward(o.ids), o.logits_bf16)
    T.ok(e <= 2e-2, "bf16 logits relerr " .. e)
  end
end)

T.run()
