-- CUDA graph replay in the fused engine (host/model/model.h): a phase runs
-- eagerly on its first call for a shape, is captured on the second and
-- replayed after. Replays must give the very bits of eager runs: every
-- test drives a model with graphs and an identically seeded one without
-- through the same calls and compares losses, gradients and logits
-- exactly, under f32 and bf16, naive and flash attention. The replay
-- counters of m:info() show that graphs were really used. Skipped (exit
-- 77) without a GPU; the CPU side of the option is in test_model_engine.lua.
local T = require "harness"
T.require_cuda()
if os.getenv("TF_MODEL_GRAPHS") == "0" then T.skip("TF_MODEL_GRAPHS=0 turns graph replay off") end
tf.seed(T.fresh_seed())

local E = tf._model
local dev = "cuda"
local TINY = { vocab_size = 64, context_length = 16, d_model = 32, num_layers = 2, num_heads = 4, d_ff = 64,
  rope_theta = 10000.0 }
local SPECS = { { "f32", "naive" }, { "f32", "flash" }, { "bf16", "naive" }, { "bf16", "flash" } }

local function ids(b, t) return tf.randint(0, TINY.vocab_size, { b, t }, { device = dev }) end

-- The same model twice (one seed): with graph replay, and without; the
-- third result frees both when closed.
local function pair(precision, attention)
  tf.seed(7)
  local on = E.create(TINY, { device = dev, precision = precision, attention = attention })
  tf.seed(7)
  local off = E.create(TINY, { device = dev, precision = precision, attention = attention, graphs = false })
  T.eq(on:info().graphs, true, "replay on by default on CUDA")
  T.eq(off:info().graphs, false)
  return on, off, setmetatable({}, { __close = function()
    on:free()
    off:free()
  end })
end

-- {captures, replays, failures}
local function counts(m)
  local i = m:info()
  return { i.graph_captures, i.graph_replays, i.graph_failures }
end

-- The largest |a - b| over two equally shaped tensors, in f64 on the CPU.
local function maxdiff(a, b) return (a:to("cpu"):to("f64") - b:to("cpu"):to("f64")):abs():max():item() end

-- One training step on both models: the same loss bits, the same bits in
-- every gradient, then AdamW and zero_grad (eager in both). Returns the
-- loss tensor of the model with graphs.
local function step_both(on, off, x, y, s, what)
  local la, lb = on:loss(x, y), off:loss(x, y)
  on:backward()
  off:backward()
  T.eq(la:item(), lb:item(), what .. ": loss")
  local worst, where, gb = 0.0, "", off:grads()
  for i, g in ipairs(on:grads()) do
    local d = maxdiff(g.tensor, gb[i].tensor)
    if not (d <= worst) then worst, where = d, g.name end
  end
  T.eq(worst, 0.0, what .. ": gradients differ (" .. where .. ")")
  on:adamw_step({ step = s, lr = 1e-2 })
  off:adamw_step({ step = s, lr = 1e-2 })
  on:zero_grad()
  off:zero_grad()
  return la
end

-- Logits of both models for ids: the same bits.
local function forward_both(on, off, x, training, what)
  T.eq(maxdiff(on:forward(x, training), off:forward(x, training)), 0.0, what .. ": logits")
end

T.test("training steps replayed give the bits of eager steps", function()
  for _, spec in ipairs(SPECS) do
    local what = spec[1] .. " " .. spec[2]
    local on, off, _ <close> = pair(spec[1], spec[2])
    local x, y = ids(4, 12), ids(4, 12)
    local losses, values = {}, {}
    losses[1] = step_both(on, off, x, y, 1, what .. ", step 1")
    T.eq(counts(on), { 0, 0, 0 }, what .. ": the first step of a shape runs eagerly")
    losses[2] = step_both(on, off, x, y, 2, what .. ", step 2")
    T.eq(counts(on), { 2, 2, 0 }, what .. ": the second captures forward + loss and backward")
    for s = 3, 6 do losses[s] = step_both(on, off, x, y, s, what .. ", step " .. s) end
    T.eq(counts(on), { 2, 10, 0 }, what .. ": later steps replay")
    T.eq(counts(off), { 0, 0, 0 }, what .. ": no graphs without replay")
    for s = 1, 6 do values[s] = losses[s]:item() end
    T.ok(values[6] < values[1], what .. string.format(": the loss goes down (%.4f -> %.4f)", values[1], values[6]))
    T.ok(values[5] ~= values[6], what .. ": each replay's loss is a tensor of its own")
  end
end)

T.test("a new shape is captured anew and stays bit-identical", function()
  for _, spec in ipairs({ { "bf16", "flash" }, { "f32", "naive" } }) do
    local what = spec[1] .. " " .. spec[2]
    local on, off, _ <close> = pair(spec[1], spec[2])
    local big, small = { ids(4, 12), ids(4, 12) }, { ids(2, 16), ids(2, 16) }
    local s = 0
    local function steps(batch, n, label)
      for _ = 1, n do
        s = s + 1
        step_both(on, off, batch[1], batch[2], s, what .. ", " .. label .. ", step " .. s)
      end
    end
    steps(big, 3, "(4, 12)")
    T.eq(counts(on), { 2, 4, 0 })
    steps(small, 1, "(2, 16)")
    T.eq(counts(on), { 2, 4, 0 }, what .. ": a new shape's first step runs eagerly")
    steps(small, 2, "(2, 16)")
    T.eq(counts(on), { 4, 8, 0 }, what .. ": then it is captured and replayed")
    steps(big, 3, "back to (4, 12)")
    T.eq(counts(on), { 6, 12, 0 }, what .. ": the old shape's graphs went with its plan")
  end
end)

T.test("out-of-range ids: the same clear error with graphs, and the engine keeps working", function()
  local on, off, _ <close> = pair("bf16", "flash")
  local x, y = ids(2, 8), ids(2, 8)
  for s = 1, 3 do step_both(on, off, x, y, s, "before, step " .. s) end
  local before = counts(on)
  local function with_bad(t, value)
    local v = t:to("cpu"):tolist()
    v[2][4] = value
    return tf.tensor(v, { dtype = "i64", device = dev })
  end
  for _, m in ipairs({ on, off }) do
    T.raises(function() m:loss(with_bad(x, 64), y) end,
      "token id 64 at position [1, 3] is out of range [0, 64) (the vocabulary size)")
    T.raises(function() m:loss(x, with_bad(y, -1)) end, "target -1 at position [1, 3]")
    T.raises(function() m:forward(with_bad(x, 99)) end, "token id 99 at position [1, 3]")
    T.raises(function() m:backward() end, "call loss() first")
  end
  T.eq(counts(on), before, "nothing ran for the bad batches")
  for s = 4, 6 do step_both(on, off, x, y, s, "after, step " .. s) end
  T.eq(counts(on), { before[1], before[2] + 6, 0 }, "the graphs keep replaying")
end)

T.test("inference forward: logits identical with and without graphs", function()
  for _, spec in ipairs(SPECS) do
    local what = spec[1] .. " " .. spec[2]
    local on, off, _ <close> = pair(spec[1], spec[2])
    local x = ids(3, 5)
    for i = 1, 3 do forward_both(on, off, x, false, what .. ", inference plan, call " .. i) end
    T.eq(counts(on), { 1, 2, 0 }, what .. ": the layers captured on the second call")
    for i = 1, 3 do forward_both(on, off, x, true, what .. ", keeping activations, call " .. i) end
    T.eq(counts(on), { 2, 4, 0 }, what .. ": keeping activations is another key (and a training plan)")
    local xt, yt = ids(4, 12), ids(4, 12)
    step_both(on, off, xt, yt, 1, what)
    for i = 1, 3 do forward_both(on, off, xt, false, what .. ", inference on the training plan, call " .. i) end
    T.eq(counts(on)[3], 0, what .. ": no capture failed")
  end
end)

T.test("replay turned off runs eagerly, and the profiler keeps replaying, with the same bits", function()
  local on, off, _ <close> = pair("bf16", "flash")
  local x, y = ids(4, 12), ids(4, 12)
  local s = 0
  local function steps(n, label)
    for _ = 1, n do
      s = s + 1
      step_both(on, off, x, y, s, label .. ", step " .. s)
    end
  end
  steps(3, "replaying")
  T.eq(counts(on), { 2, 4, 0 })
  on:set_graphs(false)
  T.eq(on:info().graphs, false)
  steps(2, "turned off")
  T.eq(counts(on), { 2, 4, 0 }, "off: nothing replayed")
  on:set_graphs(true)
  steps(2, "turned on again")
  T.eq(counts(on), { 4, 6, 0 }, "on again: the graphs were freed, so a warm-up call and a capture")
  do
    local p <close> = tf.prof.start()
    steps(2, "profiling")
  end
  T.eq(counts(on), { 6, 10, 0 },
    "the collector's first step captures again (so that the nodes know their ranges), then replays")
  steps(1, "after profiling")
  T.eq(counts(on), { 6, 12, 0 }, "graphs captured while profiling are kept after")
  do
    local p <close> = tf.prof.start()
    steps(1, "profiling again")
  end
  T.eq(counts(on), { 6, 14, 0 }, "a later session replays them without capturing")
end)

-- The largest difference between two models' parameters, and where.
local function params_maxdiff(a, b)
  local worst, where, pb = 0.0, "", b:parameters()
  for i, p in ipairs(a:parameters()) do
    local d = maxdiff(p.tensor, pb[i].tensor)
    if not (d <= worst) then worst, where = d, p.name end
  end
  return worst, where
end

-- One step of a through backward_adamw and of b through backward then
-- adamw_step: the same loss and the same parameter bits.
local function step_both_ways(a, b, x, y, s, what)
  local la, lb = a:loss(x, y), b:loss(x, y)
  a:backward_adamw({ step = s, lr = 1e-2 })
  b:backward()
  b:adamw_step({ step = s, lr = 1e-2 })
  T.eq(la:item(), lb:item(), what .. ": loss")
  local worst, where = params_maxdiff(a, b)
  T.eq(worst, 0.0, what .. ": parameters differ (" .. where .. ")")
end

T.test("AdamW beside the backward pass (a second stream) gives the bits of the step after it", function()
  -- overlap off: the same update after each layer's part of the pass, on its stream
  for _, spec in ipairs({ { "bf16", "flash", true }, { "f32", "naive", true }, { "bf16", "flash", false } }) do
    for _, graphs in ipairs({ true, false }) do
      local what = string.format("%s %s, graphs %s, overlap %s", spec[1], spec[2], tostring(graphs), tostring(spec[3]))
      tf.seed(7)
      local a = E.create(TINY, { device = dev, precision = spec[1], attention = spec[2], graphs = graphs })
      T.eq(a:info().overlap, true, what .. ": overlap is the default")
      a:set_overlap(spec[3])
      T.eq(a:info().overlap, spec[3], what .. ": set_overlap")
      tf.seed(7)
      local b = E.create(TINY, { device = dev, precision = spec[1], attention = spec[2], graphs = graphs })
      local x, y = ids(4, 12), ids(4, 12)
      for s = 1, 5 do
        step_both_ways(a, b, x, y, s, what .. ", step " .. s)
        a:zero_grad()
        b:zero_grad()
      end
      -- the low-precision weights the next forward reads: the same logits
      T.eq(maxdiff(a:forward(x), b:forward(x)), 0.0, what .. ": logits after the steps")
      if graphs then T.ok(a:info().graph_replays > 0, what .. ": the backward pass with AdamW replayed") end
      -- the step went through the gradient ring: the flat gradients were never made (with this
      -- model's 2 layers the ring is as large; at 2.7B it is 1.1 GB against 13.6 GB)
      T.ok(a:memory().grads <= b:memory().grads,
        string.format("%s: gradient bytes %d (ring) against %d", what, a:memory().grads, b:memory().grads))
      -- accumulation: a backward pass first, then the step adds to its gradients in place
      for s = 6, 7 do
        local x2 = ids(4, 12)
        a:loss(x2, y):free()
        b:loss(x2, y):free()
        a:backward()
        b:backward()
        step_both_ways(a, b, x, y, s, what .. ", accumulated step " .. s)
        a:zero_grad()
        b:zero_grad()
      end
      -- and the ring again after it (the flat gradients are clean)
      step_both_ways(a, b, x, y, 8, what .. ", ring step after accumulation")
      T.eq(maxdiff(a:forward(x), b:forward(x)), 0.0, what .. ": logits after a ring step following accumulation")
      T.ok(not pcall(a.backward_adamw, a, { step = 9 }), what .. ": no loss to differentiate")
      local l = a:loss(x, y)
      T.ok(not pcall(a.backward_adamw, a, { step = 0 }), what .. ": step 0 refused")
      l:free()
      a:free()
      b:free()
    end
  end
end)

-- Kernel counts per range name and kernel name, from one profiled call of fn(m).
local function kernels_by_range(m, fn)
  local p <close> = tf.prof.start()
  fn(m)
  tf.sync()
  p:stop()
  local out, unattributed = {}, 0
  for _, row in ipairs(p:ranges()) do
    if not row.name:find(" graph$") then -- the replay's own range (around its launch)
      for _, k in ipairs(p:kernels{ range = row.name, copies = false }) do
        out[row.name .. " | " .. k.name] = k.instances
      end
    end
  end
  for _, k in ipairs(p:records().kernels) do
    if not k.range then unattributed = unattributed + 1 end
  end
  return out, unattributed
end

T.test("profiled replays: every kernel in the ranges it was captured in, as when eager", function()
  for _, spec in ipairs({ { "bf16", "flash" }, { "f32", "naive" } }) do
    local on, off, _ <close> = pair(spec[1], spec[2])
    local x, y = ids(4, 12), ids(4, 12)
    for i = 1, 3 do step_both(on, off, x, y, i, "warm-up " .. i) end
    for _ = 1, 3 do forward_both(on, off, x, false, "warm-up forward") end
    local function work(m)
      tf.range("training step", function()
        local l = m:loss(x, y)
        m:backward()
        m:zero_grad()
        l:free()
      end)
      tf.range("forward pass", function() m:forward(x):free() end)
    end
    local before = on:info().graph_replays
    local got, lost_on = kernels_by_range(on, work)
    local want, lost_off = kernels_by_range(off, work)
    T.eq(on:info().graph_replays - before, 3, spec[1] .. " " .. spec[2] .. ": replayed while profiled")
    T.eq(lost_on, 0, "no kernel outside the ranges (replays)")
    T.eq(lost_off, 0, "no kernel outside the ranges (eager)")
    local n = 0
    for key, count in pairs(want) do
      n = n + 1
      T.eq(got[key], count, spec[1] .. " " .. spec[2] .. ": " .. key)
    end
    for key in pairs(got) do T.ok(want[key] ~= nil, "only with replays: " .. key) end
    T.ok(n > 20, "the eager profile has kernels in many ranges")
  end
end)

T.run()
