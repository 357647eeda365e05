--- What observing costs: the training step timed plain, with the memory
-- history recording (tf.mem.record) and with the kernel collector running
-- (tf.prof), for each model size and implementation. Each round times
-- every mode once, in an order that rotates from round to round, so that
-- clock and thermal drift fall on all of them alike; a mode's overhead in a
-- round is against the plain steps of the same round, and the table gives
-- the median over rounds with its spread (half the interquartile range of
-- the rounds' overheads): an overhead smaller than its spread is noise.
--
--   tfhost experiments/overhead.lua                       (small and 2.7B, context 256, fused and eager)
--   tfhost experiments/overhead.lua --size tiny --context 32 --rounds 3   (a quick CPU run)
local opt = tf.options{
  description = "Training-step time with and without memory recording and the kernel collector.",
  { "size", "model sizes", default = "small,2.7B", type = "list" },
  { "context", "context length", default = 256 },
  { "batch", "batch size", default = 4 },
  { "precision", "precision", default = "bf16", choices = { "f32", "bf16", "f16" } },
  { "impl", "implementations", default = "fused,eager", type = "list", choices = { "fused", "eager" } },
  { "steps", "timed steps per round and mode (0: as many as fill --round_ms)", default = 0 },
  { "round_ms", "with --steps 0, about how long each mode runs per round, in ms", default = 400 },
  { "rounds", "rounds (medians and spreads over rounds are reported)", default = 11 },
  { "memory_limit", "cap the device memory tfhost may reserve, in GiB (0: none)", default = 0.0 },
  { "json", "write the rows and the environment to this file", type = "string" },
}
for _, s in ipairs(opt.size) do
  if not tf.model.presets[s] then tf.exit(2, "overhead.lua: unknown size '" .. s .. "'\n") end
end
if opt.rounds < 3 then tf.exit(2, "overhead.lua: --rounds must be >= 3 (a spread needs them)\n") end
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

local function stats(values)
  local s = { table.unpack(values) }
  table.sort(s)
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
for ci, c in ipairs(configs) do
  tf.report.progress("[%d/%d] %s %s ctx %d %s ...", ci, #configs, c.size, c.impl, opt.context, opt.precision)
  local t_start = tf.now()
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
    for _, mode in ipairs(modes) do
      local ms = stats(times[mode.name])
      local pct, spread = stats(over[mode.name])
      rows[#rows + 1] = { size = c.size, impl = m.impl, mode = mode.name, steps = steps, rounds = opt.rounds,
        step_ms = ms, overhead_pct = mode.name ~= "plain" and pct or nil,
        spread_pct = mode.name ~= "plain" and spread or nil,
        graphs = m.engine and m.engine:info().graph_replays > 0 or false }
    end
    m = nil
  end)
  if not ok then
    if not tf.mem.is_oom(err) then error(err, 0) end
    rows[#rows + 1] = { size = c.size, impl = c.impl, mode = "-", oom = true }
  end
  collectgarbage()
  tf.mem.empty_cache()
  tf.report.progress(" %s (%.1f s)\n", ok and "done" or "OOM", (tf.now() - t_start) / 1e3)
end

print(string.format("# Observation overhead: context %d, batch %d, %s, on %s (%d rounds; medians over rounds, "
  .. "spread = half the interquartile range)\n", opt.context, opt.batch, opt.precision, tf.device(), opt.rounds))
local function pct(v, row)
  if row.oom then return "OOM" end
  return v and string.format("%+.2f", v) or "-"
end
tf.report.table(rows, { columns = { "size", "impl", "mode", "steps", { "step_ms", "step ms", function(v, row)
  return row.oom and "OOM" or string.format("%.3f", v) end }, { "overhead_pct", "overhead %", pct },
  { "spread_pct", "spread %", function(v, row) return row.oom and "" or v and string.format("%.2f", v) or "-" end },
  { "overhead_pct", "", function(v, row)
    if row.oom or not v then return "" end
    return math.abs(v) <= row.spread_pct and "(noise)" or ""
  end } } })
if opt.json then
  tf.results.write(opt.json, rows, { options = opt })
  print("wrote " .. opt.json)
end
