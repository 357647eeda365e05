-- tf.model against PyTorch: tests/reference/torch_lm.py wrote a tiny model's
-- weights, a batch, and PyTorch's logits, loss, gradients and parameters after
-- one AdamW step (tests/reference/oracles/lm_tiny.safetensors). Every model
-- implementation tfhost has must reproduce them: f32 logits and loss within
-- 1e-5, gradients within 1e-4, one AdamW step within 1e-6, bf16 logits within
-- 2e-2. Also the API's errors, save/load, and determinism.
local T = require "harness"

local ORACLE = "tests/reference/oracles/lm_tiny.safetensors"
local f = io.open(ORACLE, "rb")
if not f then T.skip("no PyTorch oracle at " .. ORACLE .. " (run tests/reference/torch_lm.py where torch is)") end
f:close()

local oracle, meta = tf.safetensors.load(ORACLE, { device = "cpu" })
local cfg = {}
for _, k in ipairs({ "vocab_size", "context_length", "d_model", "num_layers", "num_heads", "d_ff", "rope_theta" }) do
  cfg[k] = math.tointeger(tonumber(meta[k])) or tonumber(meta[k])
end

local impls = { "eager" }
if tf._model then impls[2] = "fused" end

local function build(impl, precision)
  local spec = { impl = impl, precision = precision or "f32" }
  for k, v in pairs(cfg) do spec[k] = v end
  local m = tf.model.new(spec)
  local weights = {}
  for name in m:named_parameters() do weights[name] = oracle[name] end
  m:load_state_dict(weights, ORACLE)
  return m
end

local dev = tf.default_device()
local ids, targets = oracle.ids:to(dev), oracle.targets:to(dev)

for _, impl in ipairs(impls) do
  T.test(impl .. ": f32 logits, loss, gradients and one AdamW step match PyTorch", function()
    local m = build(impl)
    T.ok(T.relerr(m:forward(ids), oracle.logits) <= 1e-5, "logits relerr " .. T.relerr(m:forward(ids), oracle.logits))
    local loss = m:loss(ids, targets)
    T.near(loss:item(), oracle.loss:item(), 1e-5)
    m:backward()
    local worst, where = 0, ""
    for name, g in pairs(m:grads()) do
      local e = T.relerr(g, oracle["grad." .. name])
      if e > worst then worst, where = e, name end
    end
    T.ok(worst <= 1e-4, string.format("worst gradient relerr %.3g (%s)", worst, where))
    local opt = tf.optim.adamw(m, {})
    opt:step()
    worst = 0
    for name, p in pairs(m:parameters()) do
      local e = (p:to("cpu"):to("f64") - oracle["adamw." .. name]:to("f64")):abs():max():item()
      if e > worst then worst, where = e, name end
    end
    T.ok(worst <= 1e-6, string.format("worst parameter difference after AdamW %.3g (%s)", worst, where))
  end)

  T.test(impl .. ": bf16 logits within 2e-2 of PyTorch's bf16 autocast", function()
    if not oracle.logits_bf16 then
      T.ok(true, "the oracle was made on a CPU: no bf16 logits")
      return
    end
    local m = build(impl, "bf16")
    local e = T.relerr(m:forward(ids), oracle.logits_bf16)
    T.ok(e <= 2e-2, "bf16 logits relerr " .. e)
  end)

  T.test(impl .. ": the same seed and batch give bit-identical losses", function()
    local losses = {}
    for run = 1, 2 do
      tf.seed(7)
      local spec = { impl = impl }
      for k, v in pairs(cfg) do spec[k] = v end
      local m = tf.model.new(spec)
      local l = {}
      for s = 1, 3 do l[s] = m:step(ids, targets):item() end
      losses[run] = l
    end
    T.eq(losses[1], losses[2])
    T.ok(losses[1][3] < losses[1][1], "the loss goes down")
  end)

  T.test(impl .. ": save and load round trip; bad files and inputs are clear errors", function()
    local m = build(impl)
    local path = os.tmpname()
    m:save(path)
    local m2 = tf.model.load(path, { impl = impl })
    T.eq(m2:forward(ids):to("cpu"):tolist(), m:forward(ids):to("cpu"):tolist())
    local header, hmeta = tf.safetensors.read_header(path)
    T.eq(hmeta.d_model, tostring(cfg.d_model))
    T.eq(header["lm_head.weight"].dtype, "F32")
    os.remove(path)
    local bad = {}
    for name, p in m:named_parameters() do bad[name] = p end
    bad["lm_head.weight"] = nil
    bad["extra.weight"] = tf.zeros(2)
    local e = T.raises(function() m:load_state_dict(bad) end, "missing lm_head.weight")
    T.ok(e:find("unexpected extra.weight", 1, true), e)
    bad = m:parameters()
    bad["ln_final.weight"] = tf.zeros(3)
    T.raises(function() m:load_state_dict(bad) end, "ln_final.weight has shape (3,)")
    T.raises(function() m:forward(tf.zeros(1, cfg.context_length + 1, { dtype = "i64", device = dev })) end,
      "longer than the context length")
    T.raises(function() m:forward(tf.full({ 1, 4 }, cfg.vocab_size, { dtype = "i64", device = dev })) end,
      tostring(cfg.vocab_size))
    T.raises(function() m:loss(ids, targets:narrow(1, 0, 2)) end, "targets must have the shape of ids")
    T.raises(function() m:forward(tf.zeros(1, 4, { device = dev })) end, "ids must be i64 or i32")
  end)
end

T.test("save records how the model runs; load restores it, options override", function()
  local path = os.tmpname()
  local impls = tf._model and { "fused", "eager" } or { "eager" }
  for _, impl in ipairs(impls) do
    local m = tf.model.new{ preset = "tiny", context_length = 16, precision = "bf16", impl = impl, attention = "naive",
      graphs = false, device = "cpu" }
    m:save(path)
    local _, meta = tf.safetensors.load(path, { device = "cpu" })
    T.eq(meta.precision, "bf16")
    T.eq(meta.impl, impl)
    T.eq(meta.attention, "naive")
    T.eq(meta.graphs, "false")
    local back = tf.model.load(path, { device = "cpu" })
    T.eq(back.precision, "bf16", impl .. ": precision restored")
    T.eq(back.impl, impl)
    T.eq(back.attention, "naive")
    T.eq(back.graphs, false)
    local ids = tf.randint(0, 100, { 1, 16 }, { device = "cpu" })
    T.eq((back:forward(ids):to("f64") - m:forward(ids):to("f64")):abs():max():item(), 0.0)
    local f32 = tf.model.load(path, { precision = "f32", attention = "flash", device = "cpu" })
    T.eq(f32.precision, "f32", "an explicit option overrides the file")
    T.eq(f32.attention, "flash")
  end
  -- a file from elsewhere (sizes only) loads with the defaults; a bad setting is a clear error
  local m = tf.model.new{ preset = "tiny", context_length = 16, device = "cpu" }
  local meta = {}
  for k, v in pairs(m.config) do meta[k] = tostring(v) end
  tf.safetensors.save(path, m:parameters(), meta)
  T.eq(tf.model.load(path, { device = "cpu" }).precision, "f32")
  meta.precision = "f8"
  tf.safetensors.save(path, m:parameters(), meta)
  T.raises(function() tf.model.load(path, { device = "cpu" }) end, "has precision = 'f8' in its metadata (expected f32, bf16, f16, fp8)")
  os.remove(path)
end)

T.test("configuration errors", function()
  T.raises(function() tf.model.new{ preset = "huge" } end, "unknown preset 'huge'")
  T.raises(function() tf.model.new{ preset = "small", num_heads = 7 } end, "not divisible by num_heads")
  T.raises(function() tf.model.new{ preset = "small", d_model = -4 } end, "d_model must be a positive integer")
  T.raises(function() tf.model.new{ d_model = 8 } end, "needs num_layers")
  T.raises(function() tf.model.new{ preset = "small", precision = "f8" } end, "precision must be")
  T.eq(tf.model.num_parameters(tf.model.config{ preset = "small" }), 128625408)
  T.eq(tf.model.num_parameters(tf.model.config{ preset = "2.7B" }), 3406809600)
  local path = os.tmpname()
  tf.safetensors.save(path, { w = tf.zeros(2) }, {})
  T.raises(function() tf.model.load(path) end, "has no 'vocab_size' in its metadata")
  os.remove(path)
end)

T.run()
