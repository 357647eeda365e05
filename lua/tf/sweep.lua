--- Sweeps: the loop an experiment runs over its configurations, with a
-- progress line on stderr that says how much is left, and the rows done so
-- far written to the results file as each configuration finishes, so that
-- a sweep stopped by Ctrl-C or a kill keeps what it measured.
--
--   local sweep = tf.report.sweep{ total = #configs, json = opt.json, results = rows,
--     extra = { key = {...}, metrics = {...} }, costs = costs }
--   for i, c in ipairs(configs) do
--     sweep:start("%s ctx %d", c.size, c.ctx)   -- "[3/12] small ctx 256 ..."
--     rows[#rows + 1] = measure(c)
--     sweep:done()                              -- " done (2.1 s; about 40 s left)", then the JSON
--   end
--   sweep:finish{ summary = ... }               -- the JSON with "complete": true
--
-- Until finish, the file says "complete": false and "progress":
-- {done, total}. The estimate is the time so far, scaled by what is left:
-- by opts.costs (one relative cost per configuration, e.g. seq^2 * d for
-- attention) where given, else by the count.
local M = {}

local Sweep = {}
Sweep.__index = Sweep

local check = require "tf.check"
local kind_of = check.kind

--- "0.4 s", "12 s", "3 min 20 s", "1 h 5 min".
function M.duration(s)
  if s < 10 then return string.format("%.1f s", s) end
  if s < 60 then return string.format("%.0f s", s) end
  if s < 3600 then
    local m = math.floor(s / 60)
    return string.format("%d min %d s", m, math.floor(s - 60 * m))
  end
  local h = math.floor(s / 3600)
  return string.format("%d h %d min", h, math.floor((s - 3600 * h) / 60))
end

--- tf.report.sweep(opts) -> a sweep. opts: total (how many configurations;
-- required), json (the results file; nil: none), results (the table of rows
-- the script fills, a list or named parts: written as it is at each
-- step), extra (fields beside the rows: key, metrics, ...), costs (a list
-- of total relative costs), out (where progress goes; default io.stderr;
-- false: nowhere), lines (true: a line at the start and one at the end of
-- each configuration, for scripts that print while they run).
function M.new(opts)
  if type(opts) ~= "table" then error("tf.report.sweep: expects a table of options, got " .. kind_of(opts), 2) end
  check.keys(opts, "tf.report.sweep", { "total", "json", "results", "costs", "extra", "lines", "out" })
  if math.type(opts.total) ~= "integer" or opts.total < 0 then
    error("tf.report.sweep: opts.total must be the number of configurations (an integer >= 0), got " ..
      tostring(opts.total), 2)
  end
  if opts.json ~= nil and type(opts.json) ~= "string" then
    error("tf.report.sweep: opts.json must be a file path or nil, got " .. kind_of(opts.json), 2)
  end
  if opts.results ~= nil and type(opts.results) ~= "table" then
    error("tf.report.sweep: opts.results must be the table of rows, got " .. kind_of(opts.results), 2)
  end
  if opts.costs ~= nil then
    if type(opts.costs) ~= "table" or #opts.costs ~= opts.total then
      error("tf.report.sweep: opts.costs must list one cost per configuration (" .. opts.total .. ")", 2)
    end
    for i, c in ipairs(opts.costs) do
      if type(c) ~= "number" or c < 0 then
        error("tf.report.sweep: opts.costs[" .. i .. "] must be a number >= 0", 2)
      end
    end
  end
  local tf = require "tf"
  local out = opts.out
  if out == nil then out = io.stderr end
  return setmetatable({ total = opts.total, json = opts.json, results = opts.results or {}, extra = opts.extra or {},
    costs = opts.costs, out = out, lines = opts.lines, count = 0, started_ms = tf.now(), step_ms = nil,
    cost_done = 0 }, Sweep)
end

function Sweep:say(fmt, ...)
  if self.out then
    self.out:write(string.format(fmt, ...))
    self.out:flush()
  end
end

--- sweep:start(fmt, ...): the next configuration begins: "[i/n] <label> ...".
function Sweep:start(fmt, ...)
  self.step_ms = require("tf").now()
  self.label = string.format("[%d/%d] " .. (fmt or ""), self.count + 1, self.total, ...)
  self:say("%s%s", self.label, self.lines and "\n" or " ...")
end

-- Seconds the rest should take, from the pace so far; nil before any step.
function Sweep:left_s(elapsed_s)
  if self.count == 0 then return nil end
  if self.costs then
    local left = 0
    for i = self.count + 1, self.total do left = left + self.costs[i] end
    if self.cost_done <= 0 then return nil end
    return elapsed_s / self.cost_done * left
  end
  return elapsed_s / self.count * (self.total - self.count)
end

--- sweep:done([note]): the configuration finished (note: "done", "OOM", ...):
-- its time and what is left on the progress line; the rows so far into the
-- results file, marked incomplete.
function Sweep:done(note)
  local tf = require "tf"
  local now = tf.now()
  self.count = self.count + 1
  if self.costs then self.cost_done = self.cost_done + (self.costs[self.count] or 0) end
  local step_s = self.step_ms and (now - self.step_ms) / 1e3 or 0
  local elapsed_s = (now - self.started_ms) / 1e3
  local left = self:left_s(elapsed_s)
  local tail = ""
  if self.count < self.total and left then tail = "; about " .. M.duration(left) .. " left" end
  self:say("%s %s (%s%s)\n", self.lines and (self.label or "") .. ":" or "", note or "done", M.duration(step_s), tail)
  if self.json then
    self:write(false)
  end
end

-- The results file as it stands: complete or not.
function Sweep:write(complete, extra)
  local doc = {}
  for k, v in pairs(self.extra) do doc[k] = v end
  for k, v in pairs(extra or {}) do doc[k] = v end
  doc.complete = complete
  doc.progress = { done = self.count, total = self.total }
  return require("tf.results").write(self.json, self.results, doc)
end

--- sweep:finish([extra]) -> the results document (nil without opts.json):
-- writes the results file whole, "complete": true, with extra's fields
-- beside those given at the start, and prints "wrote <path>".
function Sweep:finish(extra)
  if extra ~= nil and type(extra) ~= "table" then
    error("sweep:finish: expects a table of extra fields (or nothing), got " .. type(extra), 2)
  end
  self:say("%d of %d done in %s\n", self.count, self.total,
    M.duration((require("tf").now() - self.started_ms) / 1e3))
  if not self.json then return nil end
  local doc = self:write(true, extra)
  print("wrote " .. self.json)
  return doc
end

--- tf.report.noise(a, b, spread_a, spread_b) -> ratio, text: how b compares
-- with a (ratio a / b: above 1, b is faster) and the words for it, "within
-- noise (±x %)" when the difference is inside the runs' spread (spreads
-- in a's and b's units: a std, or half an interquartile range).
function M.noise(a, b, spread_a, spread_b)
  if type(a) ~= "number" or type(b) ~= "number" then
    error("tf.report.noise: expects two measured values, got " .. type(a) .. " and " .. type(b), 2)
  end
  local ratio = a / b
  local rel = 0
  if a ~= 0 then rel = rel + math.abs((spread_a or 0) / a) end
  if b ~= 0 then rel = rel + math.abs((spread_b or 0) / b) end
  if math.abs(ratio - 1) <= rel then
    return ratio, string.format("within noise (±%.0f %%)", 100 * rel)
  end
  return ratio, nil
end

return M
