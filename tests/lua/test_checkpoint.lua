-- Checkpoints (tf.checkpoint): a run stopped after step k and restored from
-- its checkpoint, in a fresh model, gives the same loss bits at every later
-- step as the run that went on, for the fused engine and the eager model, in
-- f32 and bf16 (and fp8, fused), with a cosine schedule, clipping and a dataset's generator
-- (on the CPU; on a GPU too when present, CUDA graphs on); folders keep the
-- newest K and never list a file being written; and every kind of bad
-- checkpoint is an error naming the file and what is wrong. Runs as a world
-- of one, and as 2 and 3 CPU ranks (checkpoint_N_ranks: tfhost --nproc N),
-- where each rank's data and ZeRO-1's shards of AdamW's moments are saved.
local T = require "harness"

local rank, world = tf.dist.rank(), tf.dist.world_size()
local DIR = string.format("%s/tf_checkpoint_test_w%d", os.getenv("TMPDIR") or "/tmp", world)
tf.mkdir(DIR)
local V, SEQ, B = 64, 16, 4

-- a token file every rank reads (each with a generator of its own seed)
local DATA = DIR .. "/train.bin"
if rank == 0 then
  local f = assert(io.open(DATA, "wb"))
  local parts = {}
  for i = 0, 8191 do parts[#parts + 1] = string.pack("<I2", (i * 7 + i // 13) % V) end
  f:write(table.concat(parts))
  f:close()
end
if world > 1 then tf.dist.barrier() end

local function bits(x) return string.format("%a", x) end

-- precision "fp8_delayed": fp8 with delayed scaling (its amax history is part of the state)
local function make_model(impl, precision, device, parallel)
  local fp8 = precision == "fp8_delayed" and { scaling = "delayed", history = 4 } or nil
  local m = tf.model.new{ preset = "tiny", vocab_size = V, context_length = SEQ, impl = impl,
    precision = fp8 and "fp8" or precision, fp8 = fp8, device = device, parallel = parallel }
  m:optimizer{ schedule = tf.optim.schedule.cosine{ max_lr = 1e-2, min_lr = 1e-3, warmup = 2, cycle = 12 },
    max_norm = parallel ~= "zero1" and 1.0 or nil, weight_decay = 0.1 }
  return m
end

local function dataset(device)
  return tf.data.tokens(DATA, { vocab_size = V, seed = 11 + rank, device = device })
end

-- Steps 1..n of a run; the checkpoint after step k; the losses of every step.
local function run(impl, precision, device, parallel, n, k, path)
  tf.seed(3)
  local m = make_model(impl, precision, device, parallel)
  local ds = dataset(device)
  local losses = {}
  for step = 1, n do
    local x, y = ds:batch(B, SEQ)
    losses[step] = bits(m:step(x, y):item())
    if step == k then tf.checkpoint.save(path, { model = m, data = { train = ds }, extra = { note = "k" } }) end
  end
  return losses, m
end

local function check_resume(impl, precision, device, parallel)
  local path = string.format("%s/%s_%s_%s_%s.safetensors", DIR, impl, precision, device:gsub(":", ""), parallel or "one")
  local n, k = 10, 4
  local losses, m1 = run(impl, precision, device, parallel, n, k, path)
  tf.seed(999) -- another model start and generator position: the checkpoint must set them all
  local m = make_model(impl, precision, device, parallel)
  local ds = dataset(device)
  ds:batch(B, SEQ)
  local info = tf.checkpoint.restore(path, { model = m, data = { train = ds } })
  T.eq(info.step, k)
  T.eq(info.extra, { note = "k" })
  T.eq(m:optimizer().t, k, "the schedule's position")
  for step = k + 1, n do
    local x, y = ds:batch(B, SEQ)
    T.eq(bits(m:step(x, y):item()), losses[step], string.format("%s %s %s step %d", impl, precision, device, step))
  end
  -- and the parameters after the last step, bit for bit
  local p1, p2 = m1:parameters(), m:parameters()
  for name, p in pairs(p1) do
    T.eq(p2[name]:tolist(), p:tolist(), name .. " has the same values after the resumed steps")
  end
end

local devices = { "cpu" }
if tf.cuda.is_available() then devices[2] = "cuda" end
local impls = { "eager" }
if tf._model then table.insert(impls, 1, "fused") end

if world == 1 then
  for _, device in ipairs(devices) do
    for _, impl in ipairs(impls) do
      for _, precision in ipairs(impl == "fused" and { "f32", "bf16", "fp8", "fp8_delayed" } or { "f32", "bf16" }) do
        T.test(string.format("%s %s on %s: the resumed run has the same loss bits at every step", impl, precision,
          device), function() check_resume(impl, precision, device) end)
      end
    end
  end
else
  for _, impl in ipairs(impls) do
    T.test(string.format("%s ddp over %d ranks: each rank resumes to the same bits", impl, world), function()
      check_resume(impl, "f32", "cpu", "ddp")
    end)
  end
  if tf._model then
    T.test(string.format("fused zero1 over %d ranks: each rank's shard of the moments resumes", world), function()
      check_resume("fused", "f32", "cpu", "zero1")
      T.ok(io.open(DIR .. "/fused_f32_cpu_zero1.rank1.safetensors", "rb") ~= nil, "rank 1's file")
    end)
  end
end

T.test("tf.checkpoint.load makes the model from the file; info reads the header only", function()
  local path = DIR .. "/load.safetensors"
  local losses = run("eager", "bf16", "cpu", world > 1 and "ddp" or nil, 6, 3, path)
  local info = tf.checkpoint.info(path)
  T.eq(info.step, 3)
  T.eq(info.format, tf.checkpoint.FORMAT)
  T.eq(info.model.precision, "bf16")
  T.eq(info.model.d_model, 64)
  T.eq(info.optimizer.schedule.kind, "cosine")
  T.eq(info.optimizer.t, 3)
  T.ok(info.bytes > 0)
  if world == 1 then
    local ds = dataset("cpu")
    local m, got = tf.checkpoint.load(path, { data = { train = ds }, device = "cpu" })
    T.eq(got.step, 3)
    T.eq(m.precision, "bf16")
    T.eq(m.impl, "eager")
    for step = 4, 6 do
      local x, y = ds:batch(B, SEQ)
      T.eq(bits(m:step(x, y):item()), losses[step], "step " .. step)
    end
  end
end)

T.test("the devices' generators are part of the state", function()
  local s = tf.rng_state()
  local a = tf.randn(5):tolist()
  tf.set_rng_state(s)
  T.eq(tf.randn(5):tolist(), a)
  T.eq(s.generator, "philox4x32")
  T.raises(function() tf.set_rng_state({ generator = "philox4x32", seed = "12", offset = "0" }) end,
    "seed must be 16 lowercase hex digits")
  T.raises(function() tf.set_rng_state({ generator = "mt19937" }) end, "generator must be \"philox4x32\"")
  -- a checkpoint puts the generator back where it was at the save
  local m = make_model("eager", "f32", "cpu", world > 1 and "ddp" or nil)
  local path = DIR .. "/rng.safetensors"
  tf.checkpoint.save(path, { model = m })
  local after = tf.randn(3):tolist()
  tf.randn(100)
  tf.checkpoint.restore(path, { model = m })
  T.eq(tf.randn(3):tolist(), after)
end)

if world == 1 then -- (each rank's files: the tests above, run as several ranks)
  T.test("a folder keeps the newest K and lists only whole checkpoints", function()
    local dir = DIR .. "/folder"
    local ck = tf.checkpoint.folder(dir, { keep = 2 })
    for _, p in ipairs(tf.data.files(dir)) do os.remove(p) end
    T.eq(ck:latest(), nil)
    local m = make_model("eager", "f32", "cpu")
    if world == 1 then
      for step = 1, 4 do ck:save(step * 10, { model = m }) end
      local list = ck:list()
      T.eq(#list, 2)
      T.eq(list[1].step, 30)
      T.eq(ck:latest(), dir .. "/step_00000040.safetensors")
      -- a file being written (the writer's temporary name) and other files are never a checkpoint
      for _, name in ipairs({ "step_00000050.safetensors.tmp-123-0", "step_00000060.rank1.safetensors", "notes.txt",
        "step_x.safetensors" }) do
        local f = assert(io.open(dir .. "/" .. name, "wb"))
        f:write("partial")
        f:close()
      end
      T.eq(ck:latest(), dir .. "/step_00000040.safetensors")
      T.eq(#ck:list(), 2)
      T.ok(tostring(ck):find("keep 2", 1, true))
    end
    T.raises(function() tf.checkpoint.folder(dir, { keep = 0 }) end, "keep must be an integer >= 1")
    T.raises(function() tf.checkpoint.folder(dir, { kep = 2 }) end, "kep")
  end)

  T.test("bad checkpoints are errors naming the file and what is wrong", function()
    local m = make_model("eager", "f32", "cpu")
    local path = DIR .. "/bad.safetensors"
    tf.checkpoint.save(path, { model = m, data = { train = dataset("cpu") } })
    local f = assert(io.open(path, "rb"))
    local bytes = f:read("a")
    f:close()
    local function write(p, s)
      local g = assert(io.open(p, "wb"))
      g:write(s)
      g:close()
    end
    -- another configuration
    local other = tf.model.new{ preset = "tiny", vocab_size = V, context_length = SEQ, d_ff = 96, impl = "eager" }
    T.raises(function() tf.checkpoint.restore(path, { model = other }) end,
      "bad.safetensors: does not fit the model: d_ff 256 in the checkpoint, 96 in the model")
    local bf = tf.model.new{ preset = "tiny", vocab_size = V, context_length = SEQ, precision = "bf16", impl = "eager" }
    T.raises(function() tf.checkpoint.restore(path, { model = bf }) end, "precision f32 in the checkpoint, bf16 in the model")
    -- truncated
    write(DIR .. "/trunc.safetensors", bytes:sub(1, #bytes - 100))
    T.raises(function() tf.checkpoint.restore(DIR .. "/trunc.safetensors", { model = m }) end,
      "trunc.safetensors: tensor 'model/token_embeddings.weight': data_offsets")
    -- one byte of a tensor changed
    local n = string.unpack("<I8", bytes)
    local at = 8 + n + 1000
    write(DIR .. "/flip.safetensors", bytes:sub(1, at) .. string.char(bytes:byte(at + 1) ~ 1) .. bytes:sub(at + 2))
    T.raises(function() tf.checkpoint.restore(DIR .. "/flip.safetensors", { model = m }) end,
      "do not match the checksum written with them (the file is damaged)")
    -- a newer format
    local newer = bytes:gsub('"tfhost.checkpoint":"1"', '"tfhost.checkpoint":"9"', 1)
    write(DIR .. "/newer.safetensors", newer)
    T.raises(function() tf.checkpoint.restore(DIR .. "/newer.safetensors", { model = m }) end,
      "newer.safetensors: is a checkpoint of format 9, newer than this tfhost reads (format 1)")
    -- a model's weights only
    m:save(DIR .. "/weights.safetensors")
    T.raises(function() tf.checkpoint.restore(DIR .. "/weights.safetensors", { model = m }) end,
      "weights.safetensors: is a safetensors file but not a tfhost checkpoint")
    T.raises(function() tf.checkpoint.info(DIR .. "/missing.safetensors") end, "missing.safetensors: cannot open")
    -- a dataset the checkpoint has no state of
    T.raises(function() tf.checkpoint.restore(path, { model = m, data = { val = dataset("cpu") } }) end,
      "holds no state of a dataset named 'val' (it has: train)")
    -- bad arguments
    T.raises(function() tf.checkpoint.save(path, { model = m, stepp = 3 }) end, "stepp")
    T.raises(function() tf.checkpoint.save(path, { model = 3 }) end, "state.model must be a tf.model")
    T.raises(function() tf.checkpoint.save(path, { model = m, data = 3 }) end, "data must be a dataset")
    -- a run of another world size
    if world == 1 then
      write(DIR .. "/world.safetensors", (bytes:gsub('"world":"1"', '"world":"4"', 1)))
      T.raises(function() tf.checkpoint.restore(DIR .. "/world.safetensors", { model = m }) end,
        "was written by a run of 4 ranks; this run has 1")
    end
  end)
end

T.test("a schedule that is a script's function is kept by the model, not the file", function()
  local m = tf.model.new{ preset = "tiny", vocab_size = V, context_length = SEQ, impl = "eager",
    parallel = world > 1 and "ddp" or nil }
  local f = function(t) return 1e-3 / (1 + t) end
  m:optimizer{ schedule = f }
  local path = DIR .. "/fn.safetensors"
  tf.checkpoint.save(path, { model = m })
  T.eq(tf.checkpoint.info(path).optimizer.schedule, "function")
  local fresh = tf.model.new{ preset = "tiny", vocab_size = V, context_length = SEQ, impl = "eager",
    parallel = world > 1 and "ddp" or nil }
  T.raises(function() tf.checkpoint.restore(path, { model = fresh }) end, "came from a script's function")
  fresh:optimizer{ schedule = f }
  tf.checkpoint.restore(path, { model = fresh })
  T.eq(fresh:optimizer().schedule, f)
end)

T.run()
