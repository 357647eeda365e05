-- Options tables never ignore a key: for every function of the API that
-- takes one, an unknown key is an error that names the key and lists the
-- accepted ones, at the caller's line. Unknown values of choice options
-- list the accepted values.
local T = require "harness"

local here = debug.getinfo(1, "S").short_src

local function refused(what, f, key, accepted)
  local ok, err = pcall(f)
  err = tostring(err)
  T.ok(not ok, what .. ": an unknown option was accepted")
  T.ok(err:find("unknown option '" .. key .. "'", 1, true), what .. ": the key is named: " .. err)
  for _, a in ipairs(accepted) do
    T.ok(err:find(a, 1, true), what .. ": the accepted key " .. a .. " is listed: " .. err)
  end
  T.ok(err:sub(1, #here + 1) == here .. ":", what .. ": the position is the caller's: " .. err)
  return err
end

local tiny = { preset = "tiny", context_length = 8, device = "cpu" }
local function with(t, extra)
  local out = {}
  for k, v in pairs(t) do out[k] = v end
  for k, v in pairs(extra) do out[k] = v end
  return out
end

T.test("the issue's examples", function()
  local err = refused("model.new dmodel", function() tf.model.new(with(tiny, { dmodel = 32 })) end, "dmodel",
    { "preset", "d_model", "context_length", "precision" })
  T.ok(err:find("did you mean d_model?", 1, true), err)
  err = refused("model.new size", function() tf.model.new{ size = "tiny" } end, "size", { "preset" })
  T.ok(err:find("did you mean preset?", 1, true), "the experiments' --size names preset: " .. err)
end)

T.test("the model, its optimizers and loading", function()
  for _, impl in ipairs({ "eager", tf._model and "fused" or nil }) do
    local m = tf.model.new(with(tiny, { impl = impl }))
    refused(impl .. " m:optimizer", function() m:optimizer{ lr = 1e-3, beta = 0.9 } end, "beta",
      { "lr", "betas", "eps", "weight_decay" })
  end
  local path = os.tmpname() .. ".safetensors"
  tf.model.new(tiny):save(path)
  refused("model.load", function() tf.model.load(path, { precison = "bf16" }) end, "precison",
    { "precision", "impl", "device", "attention" })
  os.remove(path)
  refused("safetensors.load", function() tf.safetensors.load(path, { devise = "cpu" }) end, "devise", { "device" })
  if tf._model then
    local cfg = tf.model.config(tiny)
    refused("engine create", function() tf._model.create(cfg, { precission = "f32" }) end, "precission",
      { "device", "precision", "attention", "graphs" })
    local e = tf._model.create(cfg, { device = "cpu" })
    refused("engine adamw_step", function() e:adamw_step{ step = 1, learning_rate = 1 } end, "learning_rate",
      { "step", "lr", "beta1", "beta2", "eps", "weight_decay" })
  end
end)

T.test("optimizers, loss scaling and nn modules", function()
  local w = tf.zeros(2):requires_grad(true)
  refused("SGD", function() tf.optim.SGD({ w }, { lr = 0.1, nesterov = true }) end, "nesterov",
    { "lr", "momentum", "weight_decay" })
  refused("AdamW", function() tf.optim.AdamW({ w }, { weight_decays = 0 }) end, "weight_decays",
    { "lr", "betas", "eps", "weight_decay" })
  refused("GradScaler", function() tf.amp.GradScaler{ scale = 1024 } end, "scale",
    { "init_scale", "growth_factor", "backoff_factor", "growth_interval" })
  refused("Linear", function() tf.nn.Linear(2, 3, { biases = false }) end, "biases", { "bias", "device", "dtype" })
  refused("LayerNorm", function() tf.nn.LayerNorm(2, { elementwise_affine = false }) end, "elementwise_affine",
    { "eps", "affine", "device", "dtype" })
  refused("RMSNorm", function() tf.nn.RMSNorm(2, { epsilon = 1e-6 }) end, "epsilon", { "eps", "device", "dtype" })
  refused("Embedding", function() tf.nn.Embedding(4, 2, { padding_idx = 0 }) end, "padding_idx", { "device", "dtype" })
  refused("init.trunc_normal", function() tf.nn.init.trunc_normal({ 2 }, 1, { mean = 0 }) end, "mean",
    { "device", "dtype" })
end)

T.test("tensors, autograd, attention, memory, benchmarks", function()
  refused("zeros", function() tf.zeros(2, { dtpye = "f32" }) end, "dtpye", { "dtype", "device" })
  refused("ones", function() tf.ones({ 2 }, { requires_grad = true }) end, "requires_grad", { "dtype", "device" })
  refused("tensor", function() tf.tensor({ 1, 2 }, { kind = "f32" }) end, "kind", { "dtype", "device" })
  refused("x:to", function() tf.ones(2):to{ dtype = "f64", non_blocking = true } end, "non_blocking",
    { "dtype", "device" })
  local x = tf.ones(2):requires_grad(true)
  refused("backward", function() x:sum():backward{ create_graph = true } end, "create_graph",
    { "retain_graph", "on_grad" })
  local q = tf.ones(1, 4, 8)
  refused("attention", function() tf.attention(q, q, q, { is_causal = true }) end, "is_causal",
    { "causal", "impl", "scale", "deterministic", "return_lse" })
  refused("mem.record", function() tf.mem.record{ max_entry = 10 } end, "max_entry",
    { "max_entries", "enabled", "device" })
  refused("bench", function() tf.bench(function() end, { iterations = 2 }) end, "iterations",
    { "warmup", "iters", "setup", "teardown" })
  refused("bench.backward", function() tf.bench.backward(function() return x:sum() end, nil, { x }, { runs = 1 }) end,
    "runs", { "warmup", "iters" })
  refused("causal_mask", function() tf.causal_mask(3, { dtype = "f32" }) end, "dtype", { "device" })
  refused("mem.plot", function() tf.mem.plot(os.tmpname() .. ".html", { titel = "x" }) end, "titel",
    { "snapshot", "title" })
  refused("json.encode", function() tf.json.encode({ 1 }, { pretty = true }) end, "pretty",
    { "indent", "sort_keys", "nan" })
end)

T.test("choice values list what is accepted", function()
  local function value_refused(what, f, ...)
    local ok, err = pcall(f)
    err = tostring(err)
    T.ok(not ok, what .. ": a bad value was accepted")
    for _, want in ipairs({ ... }) do T.ok(err:find(want, 1, true), what .. ": " .. want .. " in: " .. err) end
    T.ok(err:sub(1, #here + 1) == here .. ":", what .. ": the position is the caller's: " .. err)
  end
  value_refused("preset", function() tf.model.new{ preset = "huge" } end, "huge", "small", "tiny")
  value_refused("precision", function() tf.model.new(with(tiny, { precision = "fp4" })) end, "f32", "bf16", "f16",
    "fp8")
  value_refused("impl", function() tf.model.new(with(tiny, { impl = "jit" })) end, "fused", "eager")
  value_refused("attention", function() tf.model.new(with(tiny, { attention = "sdpa" })) end, "flash", "naive")
  value_refused("autocast", function() tf.autocast("int8", function() end) end, "tf.autocast", "bf16", "f16")
  value_refused("autocast f32", function() tf.autocast("f32", function() end) end, "tf.autocast", "bf16", "f16")
  local q = tf.ones(1, 4, 8)
  value_refused("attention impl", function() tf.attention(q, q, q, { impl = "sdpa" }) end, "naive", "flash")
end)

T.test("the checker itself: a near spelling, several unknown keys, a non-table", function()
  local check = require "tf.check"
  local ok, err = pcall(check.keys, { Lr = 1, zz = 2 }, "f", { "lr", "eps" })
  T.ok(not ok and err:find("unknown options 'Lr', 'zz' (did you mean lr?); accepted: lr, eps", 1, true), err)
  ok, err = pcall(check.keys, 5, "f", { "lr" })
  T.ok(not ok and err:find("f: options must be a table, not number", 1, true), err)
  T.eq(check.keys(nil, "f", { "lr" }), {}, "no options: an empty table")
  T.eq(check.choice(nil, "f", "k", { "a" }), nil, "an absent choice passes")
end)

T.test("reports, plots, results files, sweeps and tf.safe_run", function()
  local rows = { { x = 1, y = 2 }, { x = 2, y = 3 } }
  refused("report.table", function() tf.report.table(rows, { formt = "csv", out = false }) end, "formt",
    { "columns", "format", "out", "title" })
  -- a reporter of the script's own may take options tfhost does not know
  tf.report.formats.upper = function(r) return tostring(#r) end
  T.eq(tf.report.table(rows, { format = "upper", out = false, shout = true }), "2")
  tf.report.formats.upper = nil
  refused("plot.chart", function() tf.plot.chart(rows, { x = "x", y = "y", colour = "red" }) end, "colour",
    { "x", "y", "series", "title", "logx" })
  refused("plot.page", function() tf.plot.page({}, { titel = "t" }) end, "titel", { "title", "notes" })
  refused("plot.sweep", function() tf.plot.sweep(os.tmpname() .. ".svg", rows, { x = "x", y = { "y" }, serie = "s" }) end,
    "serie", { "x", "y", "series", "title", "notes" })
  local path = os.tmpname() .. ".json"
  tf.results.write(path, rows)
  refused("results.read", function() tf.results.read(path, { prat = "a" }) end, "prat", { "part" })
  os.remove(path)
  refused("report.sweep", function() tf.report.sweep{ total = 1, jsn = "x.json" } end, "jsn",
    { "total", "json", "results", "costs" })
  refused("safe_run", function() tf.safe_run("print(1)", { timout = 1 }) end, "timout",
    { "args", "timeout", "memory_limit", "allow_write" })
end)

T.run()
