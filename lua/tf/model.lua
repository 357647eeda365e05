--- tf.model: the CS336 Transformer LM, trained and benchmarked.
--
--   local m = tf.model.new{preset = "small", context_length = 256, precision = "bf16"}
--   local loss = m:step(ids, targets)          -- forward, backward, AdamW
--   local logits = m:forward(ids)              -- inference, keeps no activations
--   m:save("w.safetensors");  local m2 = tf.model.load("w.safetensors")
--
-- Two implementations of one model: "fused", the C engine (explicit forward
-- and backward over planned memory), and "eager", lua/tf/models/transformer.lua
-- written with tf's autograd ops (the readable reference). Both have the same
-- parameters (CS336's state-dict names) and the same methods.
local M = {}
local check = require "tf.check"

M.presets = {
  small = { d_model = 768, d_ff = 3072, num_layers = 12, num_heads = 12 },
  medium = { d_model = 1024, d_ff = 4096, num_layers = 24, num_heads = 16 },
  large = { d_model = 1280, d_ff = 5120, num_layers = 36, num_heads = 20 },
  xl = { d_model = 1600, d_ff = 6400, num_layers = 48, num_heads = 25 },
  ["2.7B"] = { d_model = 2560, d_ff = 10240, num_layers = 32, num_heads = 32 },
  -- not a CS336 size: quick runs on a CPU and in tests
  tiny = { d_model = 64, d_ff = 256, num_layers = 2, num_heads = 4 },
}
--- The CS336 sizes, in order ("all" in experiments).
M.preset_names = { "small", "medium", "large", "xl", "2.7B" }

local FIELDS = { "vocab_size", "context_length", "d_model", "num_layers", "num_heads", "d_ff", "rope_theta" }
local DEFAULTS = { vocab_size = 10000, context_length = 256, rope_theta = 10000.0 }

--- The full configuration of spec: a preset's sizes, the defaults, and any
-- field given explicitly; checked.
function M.config(spec)
  check.arg(spec, "tf.model.config", "the spec", "table")
  local cfg = {}
  if spec.preset then
    local p = M.presets[spec.preset]
    if not p then
      error("tf.model: unknown preset '" .. tostring(spec.preset) .. "' (have " .. table.concat(M.preset_names, ", ") ..
        ", tiny)", 3)
    end
    for k, v in pairs(p) do cfg[k] = v end
  end
  for k, v in pairs(DEFAULTS) do cfg[k] = v end
  for _, k in ipairs(FIELDS) do
    if spec[k] ~= nil then cfg[k] = spec[k] end
  end
  for _, k in ipairs(FIELDS) do
    local v = cfg[k]
    if v == nil then error("tf.model: the config needs " .. k .. " (or a preset)", 3) end
    if k == "rope_theta" then
      if type(v) ~= "number" or v <= 0 then error("tf.model: rope_theta must be a positive number", 3) end
      cfg[k] = v + 0.0
    elseif math.type(v) ~= "integer" or v <= 0 then
      error(string.format("tf.model: %s must be a positive integer, not %s", k, tostring(v)), 3)
    end
  end
  if cfg.d_model % cfg.num_heads ~= 0 then
    error(string.format("tf.model: d_model (%d) is not divisible by num_heads (%d)", cfg.d_model, cfg.num_heads), 3)
  end
  if (cfg.d_model // cfg.num_heads) % 2 ~= 0 then
    error("tf.model: the head dimension must be even for RoPE", 3)
  end
  return cfg
end

--- Parameters of a configuration (a formula, no allocation).
local function need_config(cfg, fname)
  check.arg(cfg, fname, "the config", "table")
  for _, k in ipairs({ "d_model", "d_ff", "num_layers", "vocab_size" }) do
    if math.type(cfg[k]) ~= "integer" then
      error(string.format("%s: the config needs an integer %s (tf.model.config makes one), not %s", fname, k,
        check.what_is(cfg[k])), 3)
    end
  end
end

function M.num_parameters(cfg)
  need_config(cfg, "tf.model.num_parameters")
  local d, f, l, v = cfg.d_model, cfg.d_ff, cfg.num_layers, cfg.vocab_size
  return 2 * v * d + l * (4 * d * d + 3 * d * f + 2 * d) + d
end

--- FLOPs of one training step (forward + backward) over a (batch, seq)
-- batch, as the PyTorch anchors count them: 6 P tokens + 12 L B T^2 d. A
-- forward pass is a third of it.
function M.step_flops(cfg, batch, seq)
  need_config(cfg, "tf.model.step_flops")
  check.arg(batch, "tf.model.step_flops", "batch", "number")
  check.arg(seq, "tf.model.step_flops", "seq", "number")
  return 6 * M.num_parameters(cfg) * batch * seq + 12 * cfg.num_layers * batch * seq * seq * cfg.d_model
end

local Model = {}
Model.__index = Model

-- The ids (and targets) of m:forward / m:loss (fname), the same checks for
-- both implementations.
local function check_batch(self, fname, ids, targets)
  if not tf.is_tensor(ids) or ids.ndim ~= 2 then error("tf.model: ids must be a (batch, seq) integer tensor", 3) end
  if ids.dtype ~= "i64" and ids.dtype ~= "i32" then error("tf.model: ids must be i64 or i32, not " .. ids.dtype, 3) end
  if ids:numel() == 0 then
    error(string.format("%s: ids must not be empty (shape %s): a batch needs at least one sequence of at least one token",
      fname, tostring(ids.shape)), 3)
  end
  if ids:size(1) > self.config.context_length then
    error(string.format("tf.model: sequence length %d is longer than the context length %d", ids:size(1),
      self.config.context_length), 3)
  end
  if targets and (not tf.is_tensor(targets) or tostring(targets.shape) ~= tostring(ids.shape)) then
    error("tf.model: targets must have the shape of ids " .. tostring(ids.shape), 3)
  end
end

-- ---- the eager implementation -----------------------------------------------

local Eager = setmetatable({}, { __index = Model })
Eager.__index = Eager

local function region(self) return self.precision ~= "f32" and self.precision or nil end

function Eager:forward(ids)
  check_batch(self, "model:forward", ids)
  local _ <close> = tf.range("forward")
  return tf.no_grad(function() return tf.autocast(region(self), function() return self.module(ids) end) end)
end

function Eager:loss(ids, targets)
  check_batch(self, "model:loss", ids, targets)
  local loss = tf.autocast(region(self), function()
    local logits = tf.range("forward", self.module, ids)
    local _ <close> = tf.range("loss")
    return tf.cross_entropy(logits:reshape(-1, self.config.vocab_size), targets:reshape(-1))
  end)
  self._loss = loss
  return loss
end

local OVERLAPPED = { overlap = true, bucket = true }

--- The mean loss of ids against targets, for evaluation: nothing kept for backward.
function Eager:eval_loss(ids, targets)
  check_batch(self, "model:eval_loss", ids, targets)
  return tf.no_grad(function()
    return tf.autocast(region(self), function()
      local logits = self.module(ids)
      local V = self.config.vocab_size
      return tf.cross_entropy(logits:reshape(-1, V), targets:reshape(-1))
    end)
  end)
end

function Eager:backward()
  if not self._loss then error("tf.model: backward needs a loss first (m:loss(ids, targets))", 2) end
  local overlapped = OVERLAPPED[self.grad_sync]
  do
    local _ <close> = tf.range("backward")
    if overlapped then self:_backward_overlapped() else self._loss:backward() end
    self._loss = nil
  end
  if self.grad_sync and not overlapped then tf.range("gradient all-reduce", self._sync_grads, self) end
end

-- Data parallel (eager), overlapped with the backward pass: each parameter's
-- gradient leaves as soon as the pass has added it (loss:backward's
-- on_grad), alone ("overlap") or gathered with the next ones into a bucket
-- of at least bucket_mb in the order they come ("bucket"), each with an
-- asynchronous all-reduce; the pass waits for them at its end and copies
-- the buckets' averages back. Every parameter must get one gradient a pass.
function Eager:_backward_overlapped()
  if not self._param_of then
    self._param_of = {}
    for _, p in self:named_parameters() do self._param_of[p:data_ptr()] = p end
  end
  local limit = self.grad_sync == "bucket" and self.bucket_mb * 1e6 or 0
  local seen, works, pending, pending_bytes = {}, {}, {}, 0
  local function send_bucket()
    if #pending == 0 then return end
    local total = 0
    for _, g in ipairs(pending) do total = total + g:numel() end
    local flat, at = tf.empty(total, { dtype = pending[1].dtype, device = self.device }), 0
    for _, g in ipairs(pending) do
      flat:narrow(0, at, g:numel()):copy_(g:reshape(-1))
      at = at + g:numel()
    end
    works[#works + 1] = { work = tf.dist.all_reduce_async(flat, "avg"), flat = flat, grads = pending }
    pending, pending_bytes = {}, 0
  end
  self._loss:backward{ on_grad = function(leaf)
    local ptr = leaf:data_ptr()
    if not self._param_of[ptr] then return end
    if seen[ptr] then
      error("tf.model: a parameter got a second gradient in one backward pass; overlapped syncs need one", 0)
    end
    seen[ptr] = true
    local g = leaf.grad
    if limit == 0 then
      works[#works + 1] = { work = tf.dist.all_reduce_async(g, "avg") }
      return
    end
    pending[#pending + 1] = g
    pending_bytes = pending_bytes + g:numel() * g:element_size()
    if pending_bytes >= limit then send_bucket() end
  end }
  send_bucket()
  local _ <close> = tf.range("gradient all-reduce (wait)")
  tf.no_grad(function()
    for _, w in ipairs(works) do
      w.work:wait()
      local at = 0
      for _, g in ipairs(w.grads or {}) do
        g:copy_(w.flat:narrow(0, at, g:numel()):reshape(g.shape))
        at = at + g:numel()
      end
    end
  end)
end

-- Data parallel (eager): the gradients averaged over the ranks after the
-- backward pass, one all-reduce per parameter or one over a flat copy.
function Eager:_sync_grads()
  local grads = {}
  for _, p in self:named_parameters() do
    if p.grad then grads[#grads + 1] = p.grad end
  end
  if self.grad_sync == "per_param" then
    for _, g in ipairs(grads) do tf.dist.all_reduce(g, "avg") end
    return
  end
  local total = 0
  for _, g in ipairs(grads) do total = total + g:numel() end
  if not self._flat_grads or self._flat_grads:numel() ~= total then
    self._flat_grads = tf.zeros(total, { device = self.device })
  end
  local flat, at = self._flat_grads, 0
  tf.no_grad(function()
    for _, g in ipairs(grads) do
      flat:narrow(0, at, g:numel()):copy_(g:reshape(-1))
      at = at + g:numel()
    end
    tf.dist.all_reduce(flat, "avg")
    at = 0
    for _, g in ipairs(grads) do
      g:copy_(flat:narrow(0, at, g:numel()):reshape(g.shape))
      at = at + g:numel()
    end
  end)
end

function Eager:zero_grad() self.module:zero_grad() end

--- The eager model has no graphs: asking for them changes nothing (self.graphs stays false).
function Eager:set_graphs(on)
  if type(on) ~= "boolean" then error("tf.model: set_graphs expects true or false", 2) end
end

--- The eager model's optimizer runs after its backward pass: nothing to overlap.
function Eager:set_overlap(on)
  if type(on) ~= "boolean" then error("tf.model: set_overlap expects true or false", 2) end
end

--- The eager model keeps what its autograd graph keeps: nothing to recompute.
function Eager:set_recompute_residual(on)
  if type(on) ~= "boolean" then error("tf.model: set_recompute_residual expects true or false", 2) end
end

function Eager:named_parameters() return self.module:named_parameters() end

function Eager:make_optimizer(opts) return tf.optim.AdamW(self.module, opts) end

--- The gradient norm before clipping of the last step of an optimizer with
--- max_norm (a 0-dim f32 tensor), or nil.
function Eager:last_grad_norm() return self._optimizer and self._optimizer.grad_norm end

-- ---- the fused implementation -------------------------------------------------

local Fused = setmetatable({}, { __index = Model })
Fused.__index = Fused
local FusedOptimizer = {}

--- The engine's state (m.engine:info()), precision as the model was made ("fp8" with its
-- recipe's state in info.fp8).
function Fused:info()
  local info = self.engine:info()
  info.precision = self.precision
  return info
end

function Fused:forward(ids)
  check_batch(self, "model:forward", ids)
  return self.engine:forward(ids, false)
end

function Fused:loss(ids, targets)
  check_batch(self, "model:loss", ids, targets)
  self._has_loss = true
  return self.engine:loss(ids, targets)
end

--- The mean loss of ids against targets, for evaluation (the training
-- forward pass and the fused loss: the same value m:loss gives; a later
-- m:backward needs a loss of its own).
function Fused:eval_loss(ids, targets)
  check_batch(self, "model:eval_loss", ids, targets)
  self._has_loss = false
  return self.engine:loss(ids, targets)
end

function Fused:backward()
  if not self._has_loss then error("tf.model: backward needs a loss first (m:loss(ids, targets))", 2) end
  self.engine:backward()
  self._has_loss = false
end

function Fused:zero_grad() self.engine:zero_grad() end

--- CUDA graph replay on or off (taken where the device has graphs); self.graphs follows.
function Fused:set_graphs(on)
  if type(on) ~= "boolean" then error("tf.model: set_graphs expects true or false", 2) end
  self.engine:set_graphs(on)
  self.graphs = self.engine:info().graphs
end

--- m:step's AdamW beside the backward pass on a second stream (true, the
-- default) or after each layer's part of it on the same stream (false: the
-- same bits; each kernel runs alone, as kernel_bandwidth.lua measures them).
function Fused:set_overlap(on)
  if type(on) ~= "boolean" then error("tf.model: set_overlap expects true or false", 2) end
  self.engine:set_overlap(on)
end

--- Training keeps the residual stream before each layer only (true) and the
-- backward pass recomputes the stream after attention (one more output-
-- projection GEMM a layer, the same bits), or keeps both (false, the
-- default). Saves L f32 (batch * seq, d_model) buffers; drops the plan.
function Fused:set_recompute_residual(on)
  if type(on) ~= "boolean" then error("tf.model: set_recompute_residual expects true or false", 2) end
  self.engine:set_recompute_residual(on)
end

function Fused:named_parameters()
  local list, i = self.engine:parameters(), 0
  return function()
    i = i + 1
    if list[i] then return list[i][1], list[i][2] end
  end
end

function Fused:grads()
  local out = {}
  for _, pair in ipairs(self.engine:grads()) do out[pair[1]] = pair[2] end
  return out
end

function Fused:make_optimizer(opts)
  opts = check.keys(opts, "model:optimizer", { "lr", "betas", "eps", "weight_decay", "schedule", "max_norm" })
  local betas = opts.betas or { 0.9, 0.999 }
  local engine = self.engine
  local o = setmetatable({ lr = opts.lr or 1e-3, beta1 = betas[1], beta2 = betas[2], eps = opts.eps or 1e-8,
    weight_decay = opts.weight_decay or 0.01, t = 0 }, { __index = FusedOptimizer })
  tf.optim._schedule_opts(o, opts, "model:optimizer", 3)
  engine:set_max_grad_norm(o.max_norm or 0) -- the engine clips inside its step
  o.engine = engine
  return o
end

-- The fused model's AdamW: the engine's step, its learning rate from the
-- schedule at the steps taken so far.
FusedOptimizer.__index = FusedOptimizer
function FusedOptimizer.next_lr(opt)
  if opt.schedule then return opt.schedule(opt.t) end
  return opt.lr
end

function FusedOptimizer.args(opt)
  local lr = opt:next_lr()
  if type(lr) ~= "number" or not (lr >= 0) then
    error("model:optimizer: the schedule gave " .. tostring(lr) .. " at step " .. opt.t .. " (a learning rate >= 0)", 3)
  end
  return { lr = lr, beta1 = opt.beta1, beta2 = opt.beta2, eps = opt.eps, weight_decay = opt.weight_decay,
    step = opt.t + 1 }, lr
end

function FusedOptimizer.step(opt)
  local args, lr = opt:args() -- the engine opens the "optimizer" range itself
  opt.engine:adamw_step(args)
  opt.t, opt.lr = opt.t + 1, lr
end

-- The backward pass with this step beside it (one backward per step).
function FusedOptimizer.backward_step(opt)
  local args, lr = opt:args()
  local ok, err = pcall(opt.engine.backward_adamw, opt.engine, args)
  if not ok then error(err, 0) end
  opt.t, opt.lr = opt.t + 1, lr
end

function FusedOptimizer.zero_grad(opt) opt.engine:zero_grad() end

--- The gradient norm before clipping of the last clipped step (a 0-dim f32
-- tensor on the model's device, queued after the step: :item() waits), or nil.
function Fused:last_grad_norm() return self.engine:grad_norm() end

-- ---- shared ------------------------------------------------------------------------

--- name -> parameter tensor (views of the model: writing into them writes the model).
function Model:parameters()
  local t = {}
  for name, p in self:named_parameters() do t[name] = p end
  return t
end

--- name -> gradient tensor (eager: the parameters' .grad).
function Model:grads()
  local t = {}
  for name, p in self:named_parameters() do t[name] = p.grad end
  return t
end

--- The model's AdamW (torch.optim.AdamW semantics), made on first use.
function Model:optimizer(opts)
  if opts or not self._optimizer then self._optimizer = self:make_optimizer(opts) end
  return self._optimizer
end

--- One training step: loss, backward, AdamW, zero_grad. Returns the loss tensor.
-- The fused engine steps AdamW beside its backward pass (layer by layer,
-- on a second stream on a GPU), with the same bits as one after the other.
function Model:step(ids, targets)
  local loss = self:loss(ids, targets)
  local opt = self:optimizer()
  if self.engine then
    opt:backward_step()
  else
    self:backward()
    tf.range("optimizer", opt.step, opt)
  end
  opt:zero_grad()
  return loss
end

function Model:num_parameters() return M.num_parameters(self.config) end

--- Writes the parameters and the whole configuration (header metadata) as
--- safetensors: the sizes, and how the model runs (precision, impl,
--- attention, graphs), which tf.model.load restores.
function Model:save(path)
  local meta = {}
  for _, k in ipairs(FIELDS) do meta[k] = tostring(self.config[k]) end
  meta.precision, meta.impl = self.precision, self.impl
  meta.fp8_grad_dtype = self.fp8 and self.fp8.grad_dtype or nil
  meta.fp8_history = self.fp8 and self.fp8.history and tostring(self.fp8.history) or nil
  meta.attention = self.attention ~= "function" and self.attention or nil -- a function is the script's, not saved
  meta.graphs = tostring(self.graphs)
  tf.safetensors.save(path, self:parameters(), meta)
end

--- Copies tensors (name -> tensor) into the parameters; every parameter
-- must be given with its exact shape, and nothing else.
function Model:load_state_dict(tensors, source)
  source = source or "the state dict"
  local params, problems = self:parameters(), {}
  for name, p in pairs(params) do
    local t = tensors[name]
    if not t then
      problems[#problems + 1] = "missing " .. name
    elseif tostring(t.shape) ~= tostring(p.shape) then
      problems[#problems + 1] = string.format("%s has shape %s, expected %s", name, tostring(t.shape), tostring(p.shape))
    elseif t.dtype ~= "f32" and t.dtype ~= "f16" and t.dtype ~= "bf16" and t.dtype ~= "f64" then
      problems[#problems + 1] = name .. " has dtype " .. t.dtype
    end
  end
  for name in pairs(tensors) do
    if not params[name] then problems[#problems + 1] = "unexpected " .. name end
  end
  if #problems > 0 then
    table.sort(problems)
    error("tf.model: " .. source .. " does not fit the model: " .. table.concat(problems, "; "), 3)
  end
  tf.no_grad(function()
    for name, p in pairs(params) do p:copy_(tensors[name]:to(p.device)) end
  end)
  if self.engine and self.engine.sync_weights then self.engine:sync_weights() end
end

function Model:__tostring()
  local c = self.config
  return string.format("tf.model(%s, %s, %d layers, d_model %d, %d heads, d_ff %d, vocab %d, ctx %d, %.1fM parameters)",
    self.impl, self.precision, c.num_layers, c.d_model, c.num_heads, c.d_ff, c.vocab_size, c.context_length,
    self:num_parameters() / 1e6)
end
Eager.__tostring = Model.__tostring
Fused.__tostring = Model.__tostring

local function resolve_impl(impl)
  if impl == nil then return tf._model and "fused" or "eager" end
  if impl ~= "fused" and impl ~= "eager" then error("tf.model: impl must be \"fused\" or \"eager\"", 3) end
  if impl == "fused" and not tf._model then error("tf.model: this tfhost has no fused engine", 3) end
  return impl
end

local GRAD_SYNCS = { per_param = true, flat = true, overlap = true, bucket = true }

-- How a model runs (tf.model.new and tf.model.load take them), beside FIELDS (its sizes).
local RUN_KEYS = { "precision", "fp8", "impl", "device", "attention", "graphs", "parallel", "grad_sync", "bucket_mb" }
local NEW_KEYS = { "preset" }
for _, k in ipairs(FIELDS) do NEW_KEYS[#NEW_KEYS + 1] = k end
for _, k in ipairs(RUN_KEYS) do NEW_KEYS[#NEW_KEYS + 1] = k end
-- Names users try for an accepted key (the experiments' flags among them).
local KEY_HINTS = { size = "preset", dtype = "precision", context = "context_length", ctx = "context_length",
  layers = "num_layers", heads = "num_heads", vocab = "vocab_size", dim = "d_model", hidden = "d_model" }

-- Data parallel (tf.dist): parallel = "ddp" averages the gradients over the
-- ranks (grad_sync says how, bucket_mb sizes the buckets); "zero1" also
-- shards AdamW's state (fused engine). Every rank starts from rank 0's parameters.
local function make_parallel(self, spec)
  local parallel = spec.parallel
  if parallel == nil or parallel == "none" then
    if spec.grad_sync ~= nil or spec.bucket_mb ~= nil then
      error("tf.model.new: grad_sync and bucket_mb need parallel = \"ddp\" or \"zero1\"", 3)
    end
    return
  end
  if parallel ~= "ddp" and parallel ~= "zero1" then
    error("tf.model.new: parallel must be \"ddp\", \"zero1\" or \"none\", not " .. tostring(parallel), 3)
  end
  local sync = spec.grad_sync or "bucket"
  if not GRAD_SYNCS[sync] then
    error("tf.model.new: grad_sync must be \"per_param\", \"flat\", \"overlap\" or \"bucket\", not " .. tostring(sync), 3)
  end
  local bucket_mb = spec.bucket_mb or 25
  if type(bucket_mb) ~= "number" or not (bucket_mb > 0) then
    error("tf.model.new: bucket_mb must be a size in MB > 0, not " .. tostring(spec.bucket_mb), 3)
  end
  self.parallel, self.grad_sync, self.bucket_mb = parallel, sync, bucket_mb
  if self.engine then
    self.engine:set_data_parallel(sync, bucket_mb, parallel == "zero1")
    self.graphs = self.engine:info().graphs
    return
  end
  if parallel == "zero1" then error("tf.model.new: parallel = \"zero1\" shards the fused engine's optimizer: use impl = \"fused\"", 3) end
  tf.no_grad(function()
    for _, p in self:named_parameters() do tf.dist.broadcast(p, 0) end
  end)
end

--- tf.model.new{preset = "small" | ... or explicit sizes, context_length, vocab_size,
--- precision = "f32" | "bf16" | "f16" | "fp8" (fused: the layers' products in FP8, the rest bf16),
--- fp8 = {grad_dtype = "f8e5m2" | "f8e4m3", scaling = "current" | "delayed", history = 16} (precision "fp8":
--- the gradients' format, the recipe, delayed scaling's amax history), impl = "fused" | "eager", device,
--- attention = "flash" | "naive" (default: flash under bf16/f16, naive in f32), or for the eager model a
--- function(q, k, v) -> out of (B, H, T, head_dim) tensors, causal, in place of its own (a script's kernel),
--- graphs = true | false (fused: CUDA graph replay of fixed shapes, default true where the
--- device has graphs; self.graphs says whether it is on; the eager model has none),
--- parallel = "ddp" | "zero1" (data parallel over tf.dist's ranks; docs/distributed.md),
--- grad_sync = "bucket" (default) | "overlap" | "flat" | "per_param", bucket_mb = 25}
function M.new(spec)
  if type(spec) ~= "table" then error("tf.model.new: expects a table", 2) end
  check.keys(spec, "tf.model.new", NEW_KEYS, KEY_HINTS)
  local cfg = M.config(spec)
  local precision = check.choice(spec.precision, "tf.model.new", "precision", { "f32", "bf16", "f16", "fp8" }) or "f32"
  local impl = resolve_impl(check.choice(spec.impl, "tf.model.new", "impl", { "fused", "eager" }))
  local fp8 = check.keys(spec.fp8, "tf.model.new: fp8", { "grad_dtype", "scaling", "history" })
  if spec.fp8 ~= nil and precision ~= "fp8" then error("tf.model.new: fp8 options go with precision = \"fp8\"", 2) end
  if precision == "fp8" then
    if impl ~= "fused" then error("tf.model.new: precision \"fp8\" runs in the fused engine (impl = \"fused\")", 2) end
    fp8.grad_dtype = check.choice(fp8.grad_dtype, "tf.model.new", "fp8.grad_dtype", { "f8e5m2", "f8e4m3" }) or "f8e5m2"
    fp8.scaling = check.choice(fp8.scaling, "tf.model.new", "fp8.scaling", { "current", "delayed" }) or "current"
    if fp8.history ~= nil and fp8.scaling ~= "delayed" then
      error("tf.model.new: fp8.history is delayed scaling's amax history: give scaling = \"delayed\" too", 2)
    end
    if fp8.history ~= nil and (math.type(fp8.history) ~= "integer" or fp8.history < 1 or fp8.history > 1024) then
      error("tf.model.new: fp8.history must be an integer from 1 to 1024, not " .. tostring(fp8.history), 2)
    end
    if fp8.scaling == "delayed" then fp8.history = fp8.history or 16 end
  end
  local attend_fn = type(spec.attention) == "function" and spec.attention or nil
  if attend_fn and impl ~= "eager" then
    error("tf.model.new: attention as a function replaces the eager model's attention: use impl = \"eager\" " ..
      "(the fused engine runs its own kernels)", 2)
  end
  if not attend_fn then check.choice(spec.attention, "tf.model.new", "attention", { "flash", "naive" }) end
  if spec.graphs ~= nil and type(spec.graphs) ~= "boolean" then
    error("tf.model.new: graphs must be true or false", 2)
  end
  local device = spec.device or tf.default_device()
  local self = { config = cfg, precision = precision, impl = impl, device = device,
    attention = attend_fn and "function" or spec.attention, graphs = false }
  if impl == "eager" then
    local T = require "tf.models.transformer"
    self.module = T.TransformerLM(cfg, { device = device, attention = attend_fn })
    setmetatable(self, Eager)
    make_parallel(self, spec)
    return self
  end
  self.engine = tf._model.create(cfg, { device = device, precision = precision == "fp8" and "bf16" or precision,
    attention = spec.attention, graphs = spec.graphs })
  if precision == "fp8" then
    self.engine:set_fp8(fp8.grad_dtype, fp8.history)
    self.fp8 = { grad_dtype = fp8.grad_dtype, scaling = fp8.scaling, history = fp8.history }
  end
  local info = self.engine:info()
  self.attention, self.graphs = info.attention, info.graphs
  setmetatable(self, Fused)
  make_parallel(self, spec)
  return self
end

-- ---- generation -------------------------------------------------------------------

local GENERATE_KEYS = { "max_new_tokens", "temperature", "top_p", "top_k", "seed", "stop" }

-- The options of m:generate, checked and filled in: max_new_tokens 1,
-- temperature 0 (greedy), top_p 1, top_k 0 (no cut), seed 0, stop as a list.
local function generate_opts(self, prompt, opts)
  local fname = "model:generate"
  opts = check.keys(opts, fname, GENERATE_KEYS)
  if not tf.is_tensor(prompt) or prompt.ndim ~= 2 or (prompt.dtype ~= "i64" and prompt.dtype ~= "i32") then
    error(fname .. ": prompt_ids must be a (batch, seq) i64 or i32 tensor (rows of one length)", 3)
  end
  if prompt:numel() == 0 then error(fname .. ": prompt_ids must not be empty", 3) end
  local o = {}
  local function int(key, default, least)
    local v = opts[key]
    if v == nil then return default end
    if math.type(v) ~= "integer" or v < least then
      error(string.format("%s: %s must be an integer >= %d, not %s", fname, key, least, tostring(v)), 4)
    end
    return v
  end
  local function num(key, default)
    local v = opts[key]
    if v == nil then return default end
    if type(v) ~= "number" or v ~= v then error(string.format("%s: %s must be a number, not %s", fname, key, tostring(v)), 4) end
    return v
  end
  o.max_new_tokens = int("max_new_tokens", 1, 1)
  o.top_k = int("top_k", 0, 0)
  o.seed = int("seed", 0, math.mininteger)
  o.temperature = num("temperature", 0)
  o.top_p = num("top_p", 1)
  if o.temperature < 0 or o.temperature == math.huge then error(fname .. ": temperature must be finite and >= 0", 3) end
  if not (o.top_p > 0 and o.top_p <= 1) then error(fname .. ": top_p must be in (0, 1]", 3) end
  local V, T = self.config.vocab_size, prompt:size(1)
  local stop = opts.stop
  if math.type(stop) == "integer" then stop = { stop } end
  if stop ~= nil and type(stop) ~= "table" then error(fname .. ": stop must be a token id or a list of them", 3) end
  o.stop = {}
  for i, id in ipairs(stop or {}) do
    if math.type(id) ~= "integer" or id < 0 or id >= V then
      error(string.format("%s: stop[%d] = %s is not a token id in [0, %d)", fname, i, tostring(id), V), 3)
    end
    o.stop[i] = id
  end
  if T + o.max_new_tokens > self.config.context_length then
    error(string.format("%s: the prompt's %d tokens and max_new_tokens %d are more than the context length %d", fname,
      T, o.max_new_tokens, self.config.context_length), 3)
  end
  for b, row in ipairs(prompt:to("cpu"):tolist()) do
    for t, id in ipairs(row) do
      if id < 0 or id >= V then
        error(string.format("%s: prompt id %d at [%d, %d] is out of range [0, %d) (the vocabulary size)", fname, id,
          b - 1, t - 1, V), 3)
      end
    end
  end
  return o
end

--- m:generate(prompt_ids, {max_new_tokens, temperature, top_p, top_k, seed, stop}) -> ids, stats:
--- prompt_ids (batch, seq) (rows of one length), the new ids (batch, n) i64 on the CPU, n <=
--- max_new_tokens (fewer when every row met a stop id; a stopped row holds -1 after its stop id);
--- stats: prefill_ms, decode_ms, decode_steps, new_tokens, decode_tokens_per_s. The fused engine
--- keeps a KV cache (a prefill, then one decode step a token, a CUDA graph on a GPU).
function Fused:generate(prompt, opts)
  local o = generate_opts(self, prompt, opts)
  if prompt.device ~= self.engine:info().device then prompt = prompt:to(self.engine:info().device) end -- a few ids
  return self.engine:generate_ids(prompt, o)
end

-- The eager model has no cache: each new token runs the full forward over
-- the sequence so far (quadratic in its length; the reference the fused
-- engine's generation is tested against), drawn by the same sampler.
function Eager:generate(prompt, opts)
  local o = generate_opts(self, prompt, opts)
  local rows = prompt:to("cpu", "i64"):tolist()
  local B, n = #rows, o.max_new_tokens
  local out, done, state = {}, {}, nil
  for b = 1, B do out[b] = {} end
  local t0 = tf.now() -- milliseconds
  local t1, made = t0, 0
  for step = 1, n do
    local ids = tf.tensor(rows, { dtype = "i64", device = self.device })
    local logits = self:forward(ids)
    local last = logits:select(1, logits:size(1) - 1):to("cpu", "f32")
    local all_done = true
    for b = 1, B do
      local id
      if done[b] then
        id = -1
      else
        id, state = tf._model.sample(last:select(0, b - 1):contiguous(), o, state)
        for _, s in ipairs(o.stop) do
          if id == s then done[b] = true end
        end
      end
      out[b][step] = id
      rows[b][#rows[b] + 1] = id >= 0 and id or rows[b][#rows[b]]
      all_done = all_done and done[b]
    end
    made = step
    if step == 1 then t1 = tf.now() end
    if all_done then break end
  end
  local t2 = tf.now()
  local steps = made - 1
  return tf.tensor(out, { dtype = "i64" }), { prefill_ms = t1 - t0, decode_ms = t2 - t1, decode_steps = steps,
    new_tokens = made, decode_tokens_per_s = t2 > t1 and steps * B / ((t2 - t1) * 1e-3) or 0 }
end

--- The run settings a file's metadata records (m:save writes them; files
--- from elsewhere may lack them: defaults then), checked like tf.model.new's.
local function saved_settings(path, meta)
  local spec = {}
  local function choice(key, allowed)
    local v = meta[key]
    if v == nil then return nil end
    for _, a in ipairs(allowed) do
      if v == a then return v end
    end
    error(string.format("tf.model.load: %s has %s = '%s' in its metadata (expected %s)", path, key, v,
      table.concat(allowed, ", "))) -- error() reports the caller's line, past tfhost's own frames
  end
  spec.precision = choice("precision", { "f32", "bf16", "f16", "fp8" })
  local grad = choice("fp8_grad_dtype", { "f8e5m2", "f8e4m3" })
  if grad and spec.precision == "fp8" then
    local history = math.tointeger(tonumber(meta.fp8_history))
    spec.fp8 = { grad_dtype = grad, scaling = history and "delayed" or nil, history = history }
  end
  spec.attention = choice("attention", { "flash", "naive" })
  spec.impl = choice("impl", { "fused", "eager" })
  if spec.impl == "fused" and not tf._model then spec.impl = nil end -- the same model, computed another way
  if choice("graphs", { "true", "false" }) == "false" then spec.graphs = false end
  return spec
end

--- tf.model.load(path [, {precision, impl, attention, graphs, device}]): a
--- model from a safetensors file with the config in its metadata (as m:save
--- writes it: sizes, precision, impl, attention, graphs); options given here
--- override the file's.
function M.load(path, opts)
  check.arg(path, "tf.model.load", "the path", "string")
  opts = check.keys(opts, "tf.model.load", RUN_KEYS, KEY_HINTS)
  local tensors, meta = tf.safetensors.load(path, { device = opts.device })
  local spec = saved_settings(path, meta)
  for _, k in ipairs(FIELDS) do
    if meta[k] == nil then error("tf.model.load: " .. path .. " has no '" .. k .. "' in its metadata", 2) end
    spec[k] = math.tointeger(tonumber(meta[k])) or tonumber(meta[k])
  end
  for k, v in pairs(opts) do spec[k] = v end
  if spec.precision ~= "fp8" and opts.fp8 == nil then spec.fp8 = nil end -- the file's fp8 recipe, loaded otherwise
  local m = M.new(spec)
  m:load_state_dict(tensors, path)
  return m
end

return M
