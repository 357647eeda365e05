-- Data-parallel training is exact: N ranks with batch b each end a step
-- with the parameters one process has after the same step on the N*b
-- sequences together (relative error <= 1e-6), for every gradient sync,
-- with and without ZeRO-1, fused and eager. Each rank computes the one-
-- process reference itself. Runs as a world of one (lua_test_ddp), as 2
-- and 3 CPU ranks (ddp_2_ranks, ddp_3_ranks: tfhost --nproc N) and as 2 GPU
-- ranks (ddp_2_gpus, where the machine has two GPUs).
local T = require "harness"

local rank, world = tf.dist.rank(), tf.dist.world_size()
-- TF_DDP_DEVICE=default runs it on each rank's default device (its GPU under tfhost --nproc)
local DEVICE = os.getenv("TF_DDP_DEVICE") or "cpu"
if DEVICE == "default" then DEVICE = tf.default_device() end
local B, SEQ = 2, 8 -- per rank
local SPEC = { vocab_size = 97, context_length = SEQ, d_model = 32, num_layers = 2, num_heads = 4, d_ff = 64 }

-- The global batches of two steps (the same on every rank: one seed), and this rank's rows.
tf.seed(11)
local batches = {}
for s = 1, 2 do
  local ids = tf.randint(0, SPEC.vocab_size, { B * world, SEQ }, { device = DEVICE })
  local targets = tf.randint(0, SPEC.vocab_size, { B * world, SEQ }, { device = DEVICE })
  batches[s] = { ids = ids, targets = targets, my_ids = ids:narrow(0, rank * B, B):contiguous(),
    my_targets = targets:narrow(0, rank * B, B):contiguous() }
end

-- AdamW's eps at 1e-5, not the default 1e-8: an update is lr g / (|g| + eps), so
-- a gradient element near eps turns the f32 rounding of the gradient's sum into a
-- large share of its update. With 1e-8 one element of layers.0.ffn.w2's gradient
-- (1.5e-8 of a median 4e-3) made a GPU rank's rounding, of another order of
-- summation than the one process's, a relative error of 1.3e-5 in the parameters
-- while the gradients agreed to 6e-7. With 1e-5 an update moves by at most
-- lr / eps times the gradient's rounding, and the check is of the gradients the
-- ranks share, not of that amplification.
local ADAMW = { eps = 1e-5 }

local function model(extra)
  tf.seed(5) -- the same initial parameters for the reference and every rank
  local spec = { device = DEVICE }
  for k, v in pairs(SPEC) do spec[k] = v end
  for k, v in pairs(extra) do spec[k] = v end
  local m = tf.model.new(spec)
  m:optimizer(ADAMW)
  return m
end

local function params_of(m)
  local out = {}
  for name, p in m:named_parameters() do out[name] = p:to("cpu"):contiguous() end
  return out
end

-- One process, the whole batch, two steps.
local reference = {}
for _, impl in ipairs({ "fused", "eager" }) do
  local m = model({ impl = impl })
  for s = 1, 2 do m:step(batches[s].ids, batches[s].targets) end
  reference[impl] = params_of(m)
end

-- The largest relative error of a parameter after two steps on this rank's rows.
local function worst_error(impl, m)
  for s = 1, 2 do m:step(batches[s].my_ids, batches[s].my_targets) end
  local worst, where = 0, nil
  for name, p in pairs(params_of(m)) do
    local e = T.relerr(p, reference[impl][name])
    if e > worst then worst, where = e, name end
  end
  return worst, where
end

local function check(impl, extra)
  local m = model(extra)
  local worst, where = worst_error(impl, m)
  T.ok(worst <= 1e-6, string.format("%s %s/%s: relative error %.3g at %s", impl, extra.parallel, extra.grad_sync, worst,
    tostring(where)))
  return m
end

for _, parallel in ipairs({ "ddp", "zero1" }) do
  for _, sync in ipairs({ "per_param", "flat", "overlap", "bucket" }) do
    T.test(string.format("fused %s, %s: the one-process step", parallel, sync), function()
      -- small buckets: several per step, a layer split over two
      check("fused", { impl = "fused", parallel = parallel, grad_sync = sync, bucket_mb = 0.01 })
    end)
  end
end

for _, sync in ipairs({ "per_param", "flat", "overlap", "bucket" }) do
  T.test("eager ddp, " .. sync .. ": the one-process step", function()
    -- small buckets: several per step, as for the fused engine
    check("eager", { impl = "eager", parallel = "ddp", grad_sync = sync, bucket_mb = 0.01 })
  end)
end

T.test("without the sync, the ranks' steps differ from the reference (the test can fail)", function()
  local worst = worst_error("fused", model({ impl = "fused" }))
  if world == 1 then T.ok(worst <= 1e-6, "a world of one is the reference") else T.ok(worst > 1e-4, worst) end
end)

T.test("zero1 keeps 1/world of AdamW's state on each rank", function()
  local ddp = check("fused", { impl = "fused", parallel = "ddp", grad_sync = "flat" })
  local zero = check("fused", { impl = "fused", parallel = "zero1", grad_sync = "flat" })
  local full, shard = ddp.engine:memory().optimizer, zero.engine:memory().optimizer
  T.ok(shard <= full // world + 8 * world, string.format("optimizer bytes %d of %d over %d ranks", shard, full, world))
  T.eq(zero.engine:info().zero1, true)
  T.eq(zero.engine:info().grad_sync, "flat")
end)

T.test("every rank starts from rank 0's parameters", function()
  tf.seed(100 + rank) -- different on every rank
  local spec = { device = DEVICE, parallel = "ddp" }
  for k, v in pairs(SPEC) do spec[k] = v end
  local m = tf.model.new(spec)
  local w = m:parameters()["lm_head.weight"]:contiguous()
  local mine = w:sum():item()
  local all = tf.zeros(world, { dtype = "f64" })
  tf.dist.all_gather(all, tf.full({ 1 }, mine, { dtype = "f64" }))
  for r = 0, world - 1 do T.eq(all:tolist()[r + 1], mine, "rank " .. r) end
end)

T.test("models that differ across ranks are an error naming the ranks, not a hang", function()
  if world == 1 then T.skip_test("needs two ranks or more (tfhost --nproc 2)") end
  T.raises(function() model({ parallel = "ddp", d_ff = rank == 0 and 64 or 128 }) end,
    "the ranks disagree: rank " .. rank .. " has broadcast of")
end)

T.test("tf.model.load takes the same options", function()
  -- one file for the run's ranks: MASTER_PORT is the run's own
  local path = string.format("%s/tfhost_test_ddp_%s.safetensors", os.getenv("TMPDIR") or "/tmp",
    os.getenv("MASTER_PORT") or tostring(os.time()))
  if rank == 0 then model({ impl = "fused" }):save(path) end
  tf.dist.barrier()
  local m = tf.model.load(path, { parallel = "zero1", grad_sync = "flat", device = DEVICE })
  m:optimizer(ADAMW)
  T.eq({ m.parallel, m.grad_sync, m.engine:info().zero1 }, { "zero1", "flat", true })
  local worst = worst_error("fused", m)
  T.ok(worst <= 1e-6, worst)
  tf.dist.barrier()
  if rank == 0 then os.remove(path) end
end)

T.test("bad options are clear errors", function()
  T.raises(function() model({ parallel = "fsdp" }) end, "parallel must be")
  T.raises(function() model({ parallel = "ddp", grad_sync = "ring" }) end, "grad_sync must be")
  T.raises(function() model({ parallel = "ddp", bucket_mb = 0 }) end, "bucket_mb must be")
  T.raises(function() model({ grad_sync = "flat" }) end, "need parallel")
  T.raises(function() model({ impl = "eager", parallel = "zero1" }) end, "use impl = \"fused\"")
end)

T.run()
