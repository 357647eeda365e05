--- The comparison of results files, for `tfhost compare` (tf.compare):
-- which columns name a configuration (the key) and which are compared (the
-- metrics), rows matched across files, the environments' differences, and
-- the regressions beyond a threshold.
local units = require "tf.units"
local report = require "tf.report"

local M = {}

-- Columns that are never a configuration: outcomes, paths and derived counts.
M.not_key = { oom = true, params = true, snapshot = true, timeline = true, backend = true, gpu = true,
  same_leader = true, fwd_top = true, fwd_top_class = true, step_top = true, residual_found = true,
  residual_bytes = true }

-- Environment fields that differ on every run and say nothing of the setup.
M.not_env = { date = true, started = true, duration_s = true, argv = true, command = true,
  ["host.lua_heap_used"] = true, ["host.lua_heap_limit"] = true, ["tfhost.binary"] = true,
  ["options.json"] = true, ["options.plot"] = true, ["options.out"] = true, ["options.trace"] = true,
  ["options.args"] = true }

-- Bad input ends the command: exit code 2 and the reason.
local function fail(fmt, ...) require("tf").exit(2, "tfhost compare: " .. string.format(fmt, ...) .. "\n") end
M.fail = fail

local function scalar(v) return type(v) == "string" or type(v) == "boolean" or math.type(v) ~= nil end
local function number(v) return math.type(v) ~= nil end

-- The values a column takes in a file's rows (nil ones left out), as a set of texts.
local function values_of(file, column)
  local set, n = {}, 0
  for _, r in ipairs(file.rows) do
    local v = r[column]
    if v ~= nil and scalar(v) and set[tostring(v)] == nil then set[tostring(v)], n = v, n + 1 end
  end
  return set, n
end

-- Columns in the order first seen across files' rows.
local function columns_of(files, pred)
  local seen, out = {}, {}
  for _, f in ipairs(files) do
    for _, r in ipairs(f.rows) do
      local keys = {}
      for k in pairs(r) do keys[#keys + 1] = k end
      table.sort(keys)
      for _, k in ipairs(keys) do
        if not seen[k] and pred(k, r[k]) then seen[k], out[#out + 1] = true, k end
      end
    end
  end
  return out
end

local function in_every(files, column)
  for _, f in ipairs(files) do
    local _, n = values_of(f, column)
    if n == 0 then return false end
  end
  return true
end

-- The key: the columns given, else the files' declared ones, else every
-- scalar column whose name is no metric; kept where every file has it and
-- some file varies it. Columns constant within each file are settings: the
-- ones whose values differ between files are listed with the environment.
local function choose_key(files, given)
  if given then
    for _, c in ipairs(given) do
      for _, f in ipairs(files) do
        local _, n = values_of(f, c)
        if n == 0 then fail("%s: no row has the key column '%s'", f.path, c) end
      end
    end
    return given, {}
  end
  local declared, seen = {}, {}
  for _, f in ipairs(files) do
    if type(f.doc.key) == "table" then
      for _, c in ipairs(f.doc.key) do
        if not seen[c] then seen[c], declared[#declared + 1] = true, c end
      end
    end
  end
  local candidates = #declared > 0 and declared or columns_of(files, function(k, v)
    return not M.not_key[k] and units.of(k) == nil and (type(v) == "string" or type(v) == "boolean"
      or math.type(v) == "integer")
  end)
  local key, settings = {}, {}
  for _, c in ipairs(candidates) do
    if in_every(files, c) then
      local varies = false
      for _, f in ipairs(files) do
        local _, n = values_of(f, c)
        varies = varies or n > 1
      end
      if varies then
        key[#key + 1] = c
      else
        settings[#settings + 1] = c
      end
    end
  end
  return key, settings
end

local KIND_ORDER = { time = 1, throughput = 2, memory = 3, percent = 4, ratio = 5 }

-- The metrics: given, else the files' declared ones, else every numeric
-- column of every file that is not in the key (times, throughputs, memory, others).
local function choose_metrics(files, given, key)
  local in_key = {}
  for _, c in ipairs(key) do in_key[c] = true end
  if given then
    for _, c in ipairs(given) do
      for _, f in ipairs(files) do
        local found = false
        for _, r in ipairs(f.rows) do found = found or r[c] ~= nil end
        if not found then
          local cols = columns_of({ f }, function(_, v) return number(v) end)
          fail("%s: no column '%s' (its numeric columns: %s)", f.path, c, table.concat(cols, ", "))
        end
      end
    end
    return given
  end
  local declared, seen = {}, {}
  for _, f in ipairs(files) do
    if type(f.doc.metrics) == "table" then
      for _, c in ipairs(f.doc.metrics) do
        if not seen[c] and in_every(files, c) then seen[c], declared[#declared + 1] = true, c end
      end
    end
  end
  if #declared > 0 then return declared end
  local out = {}
  for _, c in ipairs(columns_of(files, function(k, v)
    return not in_key[k] and not M.not_key[k] and number(v) and (math.type(v) == "float" or units.of(k) ~= nil)
  end)) do
    local everywhere = true
    for _, f in ipairs(files) do
      local found = false
      for _, r in ipairs(f.rows) do found = found or number(r[c]) end
      everywhere = everywhere and found
    end
    if everywhere then out[#out + 1] = c end
  end
  table.sort(out, function(a, b)
    local ka, kb = KIND_ORDER[(units.of(a) or {}).kind] or 9, KIND_ORDER[(units.of(b) or {}).kind] or 9
    if ka ~= kb then return ka < kb end
    return a < b
  end)
  return out
end

local function key_text(row, key)
  local parts = {}
  for i, c in ipairs(key) do
    local v = row[c]
    parts[i] = v == nil and "\1" or tostring(v)
  end
  return table.concat(parts, "\0")
end

-- Dotted paths of an environment's scalar fields: {"device" = "cpu", "host.threads" = 2, ...}.
local function flatten(t, prefix, out)
  out = out or {}
  for k, v in pairs(t) do
    local name = prefix and (prefix .. "." .. tostring(k)) or tostring(k)
    if type(v) == "table" then
      if v[1] ~= nil then
        local parts = {}
        for i, x in ipairs(v) do parts[i] = tostring(x) end
        out[name] = table.concat(parts, ",")
      else
        flatten(v, name, out)
      end
    elseif v ~= require("tf").json.null then
      out[name] = v
    end
  end
  return out
end

--- The environment fields that differ between files: {setting, values = {per file}}.
function M.env_differences(files)
  local flat, names, seen = {}, {}, {}
  for i, f in ipairs(files) do
    flat[i] = flatten(f.env)
    for k in pairs(flat[i]) do
      if not seen[k] and not M.not_env[k] then seen[k], names[#names + 1] = true, k end
    end
  end
  table.sort(names)
  local out = {}
  for _, name in ipairs(names) do
    local first, differ = flat[1][name], false
    for i = 2, #files do differ = differ or flat[i][name] ~= first end
    if differ then
      local values = {}
      for i = 1, #files do values[i] = flat[i][name] end
      out[#out + 1] = { setting = name, values = values }
    end
  end
  return out
end

-- The row columns constant within each file whose values differ between files ("rows: impl").
local function setting_differences(files, settings)
  local out = {}
  for _, c in ipairs(settings) do
    local values, differ = {}, false
    for i, f in ipairs(files) do
      local set = values_of(f, c)
      values[i] = select(2, next(set))
      differ = differ or values[i] ~= values[1]
    end
    if differ then out[#out + 1] = { setting = "rows: " .. c, values = values } end
  end
  return out
end

--- Warnings about what was run: scripts that differ.
function M.script_warnings(files)
  local out = {}
  local base = files[1].env
  for i = 2, #files do
    local e = files[i].env
    if type(base.script_sha256) == "string" and type(e.script_sha256) == "string" and base.script_sha256 ~= e.script_sha256 then
      out[#out + 1] = string.format("the scripts differ: %s ran %s (sha256 %s), %s ran %s (sha256 %s)",
        files[1].label, tostring(base.script), base.script_sha256:sub(1, 12), files[i].label, tostring(e.script),
        e.script_sha256:sub(1, 12))
    elseif type(base.script) == "string" and type(e.script) == "string"
      and base.script:match("[^/]*$") ~= e.script:match("[^/]*$") then
      out[#out + 1] = string.format("the scripts differ: %s ran %s, %s ran %s", files[1].label, base.script,
        files[i].label, e.script)
    end
  end
  return out
end

-- Matches rows across files: the list of {key row, per-file rows} in the
-- baseline's order, then the rows of the other files that it lacks.
local function match(files, key, warnings)
  local lines, by_key = {}, {}
  for i, f in ipairs(files) do
    local dup = 0
    for _, r in ipairs(f.rows) do
      local k = key_text(r, key)
      local line = by_key[k]
      if not line then
        line = { row = r, of = {} }
        by_key[k], lines[#lines + 1] = line, line
      end
      if line.of[i] then dup = dup + 1 else line.of[i] = r end
    end
    if dup > 0 then
      warnings[#warnings + 1] = string.format("%s: %d rows repeat the configuration of an earlier row (key: %s); "
        .. "the first is compared (--key adds columns)", f.path, dup, table.concat(key, ", "))
    end
  end
  return lines
end

--- Whether a row's metric is out of memory.
function M.is_oom(row, metric)
  return row and (row[metric] == "OOM" or (row.oom ~= nil and row.oom ~= false and not number(row[metric])))
end

--- A row's value of a metric: the number, "OOM", or what the row holds.
function M.cell(row, metric)
  if not row then return nil end
  if number(row[metric]) then return row[metric] end
  if M.is_oom(row, metric) then return "OOM" end
  return row[metric]
end

-- Regressions of file i against the baseline beyond pct percent.
local function regressions(files, lines, metrics, pct, key)
  local out = {}
  for _, line in ipairs(lines) do
    local a = line.of[1]
    for i = 2, #files do
      local b = line.of[i]
      if a and b then
        for _, m in ipairs(metrics) do
          local spec = units.of(m) or {}
          local gated = spec.kind == "time" or spec.kind == "throughput"
          local va, vb = a[m], b[m]
          local why
          if gated and number(va) and M.is_oom(b, m) then
            why = "ran out of memory"
          elseif gated and number(va) and number(vb) and va ~= 0 then
            local change = (vb / va - 1) * 100
            if spec.better == "lower" and change > pct then
              why = string.format("%+.1f%% (%s -> %s)", change, report.cell(va), report.cell(vb))
            elseif spec.better == "higher" and -change > pct then
              why = string.format("%+.1f%% (%s -> %s)", change, report.cell(va), report.cell(vb))
            end
          end
          if why then
            local cfg = {}
            for _, c in ipairs(key) do cfg[#cfg + 1] = c .. "=" .. tostring(line.row[c]) end
            out[#out + 1] = { file = files[i].label, metric = m, config = table.concat(cfg, " "), change = why }
          end
        end
      end
    end
  end
  return out
end

--- The comparison of files' rows ({path, label, rows, doc, env} each):
-- {key, metrics, lines = {{row, of = {per-file rows}}}, common, settings
-- (differences of row settings), warnings, regressions}, or nil and why
-- when no row is in every file.
function M.build(files, opts)
  local warnings = {}
  local key, settings = choose_key(files, opts.key)
  local metrics = choose_metrics(files, opts.metric, key)
  if #metrics == 0 then return nil, "the files have no numeric column in common to compare (--metric names one)" end
  local lines = match(files, key, warnings)
  local common = 0
  for _, line in ipairs(lines) do
    local all = true
    for i = 1, #files do all = all and line.of[i] ~= nil end
    if all then common = common + 1 end
  end
  if common == 0 then
    return nil, "the files have no rows in common (matched by " ..
      (#key > 0 and table.concat(key, ", ") or "no column") .. ")"
  end
  return { key = key, metrics = metrics, lines = lines, common = common, warnings = warnings,
    settings = setting_differences(files, settings),
    regressions = opts.threshold and regressions(files, lines, metrics, opts.threshold, key) or {} }
end

--- The values a column takes in a file's rows, as a set keyed by their text, and their count.
M.values_of = values_of

return M
