--- What observing costs: the training step timed plain, with the memory
-- history recording (tf.mem.record) and with the kernel collector running
-- (tf.prof), for each model size and implementation. Each round times
-- every mode once, in an order that rotates from round to round, so that
-- clock and thermal drift fall on all of them alike; a mode's overhead in a
-- round is against the plain steps of the same round, and the table gives
-- the median over rounds with its spread (half the interquartile range of
-- the rounds' overheads; with fewer than 5 rounds, half their range). The
-- noise of a mode is the larger of its spread and the plain steps' own
-- spread from round to round (relative to their median): an overhead
-- inside it is printed as "within noise (±x %)"; one below zero past it
-- too, since observing cannot make a step faster.
--
--   tfhost experiments/overhead.lua                       (small and 2.7B, context 256, fused and eager;
--                                                          on a CPU: tiny, context 16, batch 1, 2 steps,
--                                                          5 rounds)
--   tfhost experiments/overhead.lua --size tiny --context 32 --rounds 3   (a quick CPU run)
local opt = tf.options{
  description = "Training-step time with and without memory recording and the kernel collector.",
  { "size", "model sizes", default = "small,2.7B", cpu = "tiny", type = "list" },
  { "context", "context length", default = 256, cpu = 16, min = 1 },
  { "batch", "batch size", default = 4, cpu = 1, min = 1 },
  { "precision", "precision", default = "bf16", choices = { "f32", "bf16", "f16" } },
  { "impl", "implementations", default = "fused,eager", type = "list", choices = { "fused", "eager" } },
  { "steps", "timed steps per round and mode (0: as many as fill --round_ms)", default = 0, cpu = 2, min = 0 },
  { "round_ms", "with --steps 0, about how long each mode runs per round, in ms", default = 400, cpu = 100, min = 1 },
  { "rounds", "rounds (medians and spreads over rounds are reported; at least 3)", default = 11, cpu = 5, min = 3 },
  { "memory_limit", "cap the device memory tfhost may reserve, in GiB (0: none)", default = 0.0, min = 0 },
  { "json", "write the rows (as each configuration finishes) and the environment to this file", type = "string" },
}
for _, s in ipairs(opt.size) do
  if not tf.model.presets[s] then tf.exit(2, "overhead.lua: unknown size '" .. s .. "'\n") end
end
if opt.memory_limit > 0 then tf.mem.set_limit(math.floor(opt.memory_limit * 2 ^ 30)) end

if not tf.prof.available() then tf.prof.start{}:stop() end -- its one-line note before the progress lines

local modes = {
  { name = "plain", start = function() end, stop = function() end },
  { name = "tf.mem.record", start = function() tf.mem.record{ max_entries = 1 << 22 } end,
    stop = function() tf.mem.record(false) end },
  { name = "tf.prof", start = function() return tf.prof.start{} end, stop = function(p) p:stop() end },
}

local function quantile(sorted, q)
  local x = 1 + (#sorted - 1) * q
  local lo = math.floor(x)
  local hi = math.min(lo + 1, #sorted)
  return sorted[lo] + (sorted[hi] - sorted[lo]) * (x - lo)
end

-- The median and the spread: half the interquartile range, or half the
-- range with fewer than 5 values (the quartiles of 3 or 4 values say little).
local function stats(values)
  local s = { table.unpack(values) }
  table.sort(s)
  if #s < 5 then return quantile(s, 0.5), (s[#s] - s[1]) / 2 end
  return quantile(s, 0.5), (quantile(s, 0.75) - quantile(s, 0.25)) / 2
end

-- Runs n steps of m under mode; returns ms per step.
local function timed(m, ids, targets, mode, n)
  collectgarbage()
  tf.sync()
  local handle = mode.start()
  local t0 = tf.now()
  for _ = 1, n do m:step(ids, targets):free() end
  tf.sync()
  local ms = (tf.now() - t0) / n
  mode.stop(handle)
  return ms
end

local rows = {}
local configs = {}
for _, size in ipairs(opt.size) do
  for _, impl in ipairs(opt.impl) do configs[#configs + 1] = { size = size, impl = impl } end
end
local sweep = tf.report.sweep{ total = #configs, json = opt.json, results = rows, extra = { options = opt } }
for _, c in ipairs(configs) do
  sweep:start("%s %s ctx %d %s", c.size, c.impl, opt.context, opt.precision)
  local ok, err = pcall(function()
    tf.seed(0)
    local m = tf.model.new{ preset = c.size, context_length = opt.context, precision = opt.precision, impl = c.impl }
    local vocab = m.config.vocab_size
    local ids = tf.randint(0, vocab, { opt.batch, opt.context })
    local targets = tf.randint(0, vocab, { opt.batch, opt.context })
    for _ = 1, 3 do m:step(ids, targets):free() end
    -- Warm each mode once (the collector's first session captures the engine's graphs again).
    local probe = math.huge
    for _, mode in ipairs(modes) do probe = math.min(probe, timed(m, ids, targets, mode, 2)) end
    local steps = opt.steps > 0 and opt.steps or math.max(3, math.ceil(opt.round_ms / probe))
    local times, over = {}, {}
    for _, mode in ipairs(modes) do times[mode.name], over[mode.name] = {}, {} end
    for r = 1, opt.rounds do
      local this = {}
      for i = 0, #modes - 1 do
        local mode = modes[(i + r - 1) % #modes + 1]
        this[mode.name] = timed(m, ids, targets, mode, steps)
      end
      for _, mode in ipairs(modes) do
        table.insert(times[mode.name], this[mode.name])
        table.insert(over[mode.name], 100 * (this[mode.name] / this.plain - 1))
      end
    end
    local plain_ms, plain_spread = stats(times.plain)
    local plain_pct = 100 * plain_spread / plain_ms -- the plain steps' own noise from round to round
    for _, mode in ipairs(modes) do
      local ms = stats(times[mode.name])
      local row = { size = c.size, impl = m.impl, mode = mode.name, steps = steps, rounds = opt.rounds,
        step_ms = ms, graphs = m.engine and m.engine:info().graph_replays > 0 or false }
      if mode.name ~= "plain" then
        local pct, spread = stats(over[mode.name])
        row.overhead_pct, row.spread_pct = pct, spread
        row.noise_pct = math.max(spread, plain_pct)
      else
        row.spread_pct = plain_pct
      end
      rows[#rows + 1] = row
    end
    m = nil
  end)
  if not ok then
    if not tf.mem.is_oom(err) then error(err, 0) end
    rows[#rows + 1] = { size = c.size, impl = c.impl, mode = "-", oom = true }
  end
  collectgarbage()
  tf.mem.empty_cache()
  sweep:done(ok and "done" or "OOM")
end

print(string.format("# Observation overhead: context %d, batch %d, %s, on %s (%d rounds; medians over rounds, "
  .. "spread = half the %s of the rounds)\n", opt.context, opt.batch, opt.precision, tf.device(), opt.rounds,
  opt.rounds < 5 and "range" or "interquartile range"))
local function pct(v, row)
  if row.oom then return "OOM" end
  return v and string.format("%+.2f", v) or "-"
end
tf.report.table(rows, { columns = { "size", "impl", "mode", "steps", { "step_ms", "step ms", function(v, row)
  return row.oom and "OOM" or string.format("%.3f", v) end }, { "overhead_pct", "overhead %", pct },
  { "spread_pct", "spread %", function(v, row) return row.oom and "" or v and string.format("%.2f", v) or "-" end },
  { "mode", "verdict", function(_, row)
    local v = row.overhead_pct
    if row.oom then return "" end
    if not v then return "the reference" end
    if math.abs(v) <= row.noise_pct then return string.format("within noise (±%.1f %%)", row.noise_pct) end
    if v < 0 then return string.format("noise: below plain by more than its spread (±%.1f %%)", row.noise_pct) end
    return string.format("costs %.1f %% (noise ±%.1f %%)", v, row.noise_pct)
  end } } })
print("\nThe plain row's spread is its own step time's, in % of its median; a mode's noise is the larger of that "
  .. "and its overhead's spread.")
sweep:finish()
