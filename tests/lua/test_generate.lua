-- Generation (m:generate, the fused engine's KV cache): the logits of the
-- prefill and of every decode step against the full forward pass over the
-- same tokens (f32 and bf16), greedy generation against the argmax of
-- repeated full forwards, the eager model's generation against the fused
-- one's, the sampler (seeded, top-k, top-p, temperature) and stop ids, and
-- the errors. On the CPU, and on a GPU too when present (where the decode
-- step replays as a CUDA graph from its third call).
local T = require "harness"

local devices = { "cpu" }
if tf.cuda.is_available() then devices[2] = "cuda" end

local function tiny(device, precision, context)
  tf.seed(7)
  return tf.model.new{ preset = "tiny", context_length = context or 32, precision = precision, device = device,
    impl = "fused" }
end

-- Row-major ids of `batch` rows of `len` tokens, deterministic.
local function some_ids(batch, len, V)
  local rows = {}
  for b = 1, batch do
    rows[b] = {}
    for t = 1, len do rows[b][t] = (b * 7919 + t * 104729) % V end
  end
  return rows
end

local function first(rows, n)
  local out = {}
  for b, r in ipairs(rows) do
    out[b] = {}
    for t = 1, n do out[b][t] = r[t] end
  end
  return out
end

local function argmax(row)
  local best = 1
  for i = 2, #row do if row[i] > row[best] then best = i end end
  return best - 1
end

for _, device in ipairs(devices) do
  for _, prec in ipairs{ "f32", "bf16" } do
    T.test(string.format("prefill and decode logits are the full forward's (%s, %s)", device, prec), function()
      local m = tiny(device, prec)
      local B, T0, len = 2, 5, 12
      local rows = some_ids(B, len, m.config.vocab_size)
      -- bf16: each path rounds its own GEMMs, so compare as bf16 values around logits of size ~1
      local rtol, atol = prec == "f32" and 1e-4 or 3e-2, prec == "f32" and 1e-4 or 3e-2
      local logits = m.engine:prefill(tf.tensor(first(rows, T0), { dtype = "i64", device = device }), len)
      for t = T0, len do
        local full = m:forward(tf.tensor(first(rows, t), { dtype = "i64", device = device })):to("cpu", "f32")
        local want = full:select(1, t - 1)
        T.near(logits:to("cpu", "f32"), want, rtol, atol, "position " .. (t - 1))
        if t < len then logits = m.engine:decode_step({ rows[1][t + 1], rows[2][t + 1] }) end
      end
      T.raises(function() m.engine:decode_step({ 1, 2 }) end, "is full")
    end)

    T.test(string.format("greedy generation is the argmax of repeated full forwards (%s, %s)", device, prec), function()
      if device ~= "cpu" and prec ~= "f32" then
        T.skip_test("bf16 on a GPU: the decode GEMMs (M = batch) and the forward's round differently, so a near tie may go either way")
      end
      local m = tiny(device, prec)
      local rows = some_ids(3, 4, m.config.vocab_size)
      local out, stats = m:generate(tf.tensor(rows, { dtype = "i64", device = device }), { max_new_tokens = 10 })
      T.eq(out.shape[1], 3, "batch")
      T.eq(out.shape[2], 10, "new tokens")
      T.eq(out.dtype, "i64", "i64 ids")
      T.eq(stats.decode_steps, 9, "one decode step a token after the first")
      for _ = 1, 10 do
        local lg = m:forward(tf.tensor(rows, { dtype = "i64", device = device })):to("cpu", "f32")
        for b = 1, #rows do rows[b][#rows[b] + 1] = argmax(lg:select(0, b - 1):select(0, #rows[b] - 1):tolist()) end
      end
      local want = {}
      for b = 1, #rows do want[b] = { table.unpack(rows[b], 5) } end
      T.eq(out:tolist(), want, "the same tokens")
    end)
  end
end

T.test("the eager model generates what the fused one does (f32, CPU)", function()
  local m = tiny("cpu", "f32")
  tf.seed(7)
  local e = tf.model.new{ preset = "tiny", context_length = 32, impl = "eager", device = "cpu" }
  e:load_state_dict(m:parameters())
  local prompt = tf.tensor(some_ids(2, 3, m.config.vocab_size), { dtype = "i64" })
  T.eq(e:generate(prompt, { max_new_tokens = 6 }):tolist(), m:generate(prompt, { max_new_tokens = 6 }):tolist(), "greedy")
  local opts = { max_new_tokens = 6, temperature = 1.0, top_k = 20, seed = 5 }
  T.eq(e:generate(prompt, opts):tolist(), m:generate(prompt, opts):tolist(), "sampled, one seed")
end)

T.test("sampling: seeded, top_k = 1 and a tiny top_p are greedy", function()
  local m = tiny("cpu", "bf16")
  local prompt = tf.tensor(some_ids(2, 3, m.config.vocab_size), { dtype = "i64" })
  local greedy = m:generate(prompt, { max_new_tokens = 8 }):tolist()
  local a = m:generate(prompt, { max_new_tokens = 8, temperature = 1.0, seed = 11 }):tolist()
  local b = m:generate(prompt, { max_new_tokens = 8, temperature = 1.0, seed = 11 }):tolist()
  local c = m:generate(prompt, { max_new_tokens = 8, temperature = 1.0, seed = 12 }):tolist()
  T.eq(a, b, "the same seed, the same tokens")
  local function text(r) return table.concat(r[1], ",") .. ";" .. table.concat(r[2], ",") end
  T.ok(text(a) ~= text(c), "another seed, other tokens")
  T.ok(text(a) ~= text(greedy), "sampled at temperature 1, not greedy")
  T.eq(m:generate(prompt, { max_new_tokens = 8, temperature = 0.7, top_k = 1, seed = 3 }):tolist(), greedy, "top_k 1")
  T.eq(m:generate(prompt, { max_new_tokens = 8, temperature = 2, top_p = 1e-9, seed = 3 }):tolist(), greedy, "top_p")
end)

T.test("the sampler's warpers on a known row", function()
  local row = tf.tensor({ 0, 10, 9, -5 }, { dtype = "f32", device = "cpu" })
  T.eq((tf._model.sample(row, { temperature = 0 })), 1, "greedy")
  T.eq((tf._model.sample(row, { temperature = 1, top_p = 0.5 }, 1)), 1, "top_p 0.5 keeps the first (p 0.73)")
  local counts, state = { [0] = 0, 0, 0, 0 }, 42
  for _ = 1, 4000 do
    local id
    id, state = tf._model.sample(row, { temperature = 1, top_k = 2 }, state)
    counts[id] = counts[id] + 1
  end
  T.eq(counts[0] + counts[3], 0, "top_k 2 keeps ids 1 and 2 only")
  T.near(counts[1] / 4000, math.exp(1) / (math.exp(1) + 1), 0, 0.03, "p(1) = e / (e + 1)")
end)

T.test("stop ids end a row; every row stopped ends the call", function()
  local m = tiny("cpu", "f32")
  local prompt = tf.tensor(some_ids(2, 3, m.config.vocab_size), { dtype = "i64" })
  local greedy = m:generate(prompt, { max_new_tokens = 8 }):tolist()
  local stop = greedy[1][3]
  local out = m:generate(prompt, { max_new_tokens = 8, stop = stop }):tolist()
  T.eq(out[1][3], stop, "the stop id is kept")
  for j = 4, #out[1] do T.eq(out[1][j], -1, "after the stop id: -1") end
  local other = 8
  for j = 1, 8 do if greedy[2][j] == stop then other = j break end end
  for j = 1, math.min(other, #out[2]) do T.eq(out[2][j], greedy[2][j], "the other row goes on") end
  local both = m:generate(prompt, { max_new_tokens = 8, stop = { greedy[1][2], greedy[2][2] } })
  T.eq(both.shape[2], 2, "both rows stopped at their second token")
end)

T.test("errors", function()
  local m = tiny("cpu", "f32", 16)
  local prompt = tf.tensor(some_ids(1, 10, m.config.vocab_size), { dtype = "i64" })
  T.raises(function() m:generate(prompt, { max_new_tokens = 7 }) end, "more than the context length 16")
  T.raises(function() m:generate(prompt, { max_tokens = 2 }) end, "unknown option 'max_tokens'")
  T.raises(function() m:generate(tf.tensor({ { 1, 10000 } }, { dtype = "i64" }), {}) end, "out of range [0, 10000)")
  T.raises(function() m:generate(prompt, { stop = 10000 }) end, "stop[1]")
  T.raises(function() m:generate(prompt, { top_p = 0 }) end, "top_p must be in (0, 1]")
  T.raises(function() m:generate(prompt, { temperature = -1 }) end, "temperature")
  T.raises(function() m:generate(prompt, { top_k = 1.5 }) end, "top_k must be an integer")
  T.raises(function() m:generate(tf.tensor({ 1, 2 }, { dtype = "i64" }), {}) end, "(batch, seq)")
  T.raises(function() m.engine:decode_step({ 1 }) end, "no prompt was prefilled")
end)

T.run()
