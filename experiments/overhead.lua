--- What observing costs: the training step timed plain, with the memory
-- history recording (tf.mem.record) and with the kernel collector running
-- (tf.prof), for each implementation. Rounds alternate the three modes so
-- that clock and thermal drift fall on all of them alike.
--
--   tfhost experiments/overhead.lua                       (small model, context 256)
--   tfhost experiments/overhead.lua --size tiny --context 32 --rounds 2   (a quick CPU run)
local opt = tf.options{
  description = "Training-step time with and without memory recording and the kernel collector.",
  { "size", "model size", default = "small" },
  { "context", "context length", default = 256 },
  { "batch", "batch size", default = 4 },
  { "precision", "precision", default = "bf16", choices = { "f32", "bf16", "f16" } },
  { "impl", "implementations", default = "fused,eager", type = "list", choices = { "fused", "eager" } },
  { "steps", "timed steps per round and mode", default = 20 },
  { "rounds", "rounds (the median over rounds is reported)", default = 5 },
  { "json", "write the rows and the environment to this file", type = "string" },
}
if not tf.model.presets[opt.size] then tf.exit(2, "overhead.lua: unknown size '" .. opt.size .. "'\n") end

local modes = {
  { name = "plain", start = function() end, stop = function() end },
  { name = "tf.mem.record", start = function() tf.mem.record{ max_entries = 1 << 22 } end,
    stop = function() tf.mem.record(false) end },
  { name = "tf.prof", start = function() return tf.prof.start{} end, stop = function(p) p:stop() end },
}

local function median(t)
  table.sort(t)
  local n = #t
  return n % 2 == 1 and t[(n + 1) // 2] or (t[n // 2] + t[n // 2 + 1]) / 2
end

local rows = {}
for _, impl in ipairs(opt.impl) do
  io.stderr:write(string.format("%s %s ctx %d %s ...", opt.size, impl, opt.context, opt.precision))
  tf.seed(0)
  local m = tf.model.new{ preset = opt.size, context_length = opt.context, precision = opt.precision, impl = impl }
  local vocab = m.config.vocab_size
  local ids = tf.randint(0, vocab, { opt.batch, opt.context })
  local targets = tf.randint(0, vocab, { opt.batch, opt.context })
  for _ = 1, 3 do m:step(ids, targets):free() end
  local times = {}
  for _, mode in ipairs(modes) do times[mode.name] = {} end
  for _ = 1, opt.rounds do
    for _, mode in ipairs(modes) do
      collectgarbage()
      tf.sync()
      local handle = mode.start()
      local t0 = tf.now()
      for _ = 1, opt.steps do m:step(ids, targets):free() end
      tf.sync()
      local ms = (tf.now() - t0) / opt.steps
      mode.stop(handle)
      table.insert(times[mode.name], ms)
    end
  end
  local plain = median(times.plain)
  for _, mode in ipairs(modes) do
    local ms = median(times[mode.name])
    rows[#rows + 1] = { impl = m.impl, mode = mode.name, step_ms = ms, overhead_pct = 100 * (ms / plain - 1) }
  end
  m = nil
  collectgarbage()
  tf.mem.empty_cache()
  io.stderr:write(" done\n")
end

print(string.format("# Observation overhead: %s model, context %d, batch %d, %s, on %s (median of %d rounds x %d "
  .. "steps)\n", opt.size, opt.context, opt.batch, opt.precision, tf.device(), opt.rounds, opt.steps))
tf.report.table(rows, { columns = { "impl", "mode", { "step_ms", "step ms", "%.3f" },
  { "overhead_pct", "overhead %", "%+.2f" } } })
if opt.json then
  tf.results.write(opt.json, rows)
  print("wrote " .. opt.json)
end
