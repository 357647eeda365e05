--- `tfhost compare A.json B.json [C.json ...]`: results files side by side.
-- Rows are matched by their configuration columns (size, context,
-- precision, dtype, d, seq, ...); each metric is shown for every file with
-- its ratio to the first file (the baseline); rows that only some files
-- have are marked; the differences of the files' environments (device,
-- driver, CUDA, commit, options, ...) come above the table. --threshold PCT
-- makes a time that rises or a throughput that falls by more than PCT
-- percent exit 1, so CI can catch regressions.
local units = require "tf.units"
local report = require "tf.report"

local M = {}

local USAGE = "tfhost compare [options] A.json B.json [C.json ...]"

-- Columns that are never a configuration: outcomes, paths and derived counts.
M.not_key = { oom = true, params = true, snapshot = true, timeline = true, backend = true, gpu = true,
  same_leader = true, fwd_top = true, fwd_top_class = true, step_top = true, residual_found = true,
  residual_bytes = true }

-- Environment fields that differ on every run and say nothing of the setup.
M.not_env = { date = true, started = true, duration_s = true, argv = true, command = true,
  ["host.lua_heap_used"] = true, ["host.lua_heap_limit"] = true, ["tfhost.binary"] = true,
  ["options.json"] = true, ["options.plot"] = true, ["options.out"] = true, ["options.trace"] = true,
  ["options.args"] = true }

local function fail(fmt, ...) require("tf").exit(2, "tfhost compare: " .. string.format(fmt, ...) .. "\n") end

local function scalar(v) return type(v) == "string" or type(v) == "boolean" or math.type(v) ~= nil end
local function number(v) return math.type(v) ~= nil end

-- The rows and document of a file; a bad file ends the command (exit 2).
local function load(path, label)
  local ok, rows, doc = pcall(require("tf.results").read, path)
  if not ok then
    local msg = tostring(rows):gsub("^.-tf%.results%.read: ", "")
    fail("%s", msg)
  end
  if #rows == 0 then fail("%s: \"results\" has no rows", path) end
  return { path = path, label = label, rows = rows, doc = doc, env = type(doc.env) == "table" and doc.env or {} }
end

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

-- The settings that differ between files: environment fields, then the
-- row columns that are constant within each file.
local function differences(files, settings)
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

-- Warnings about what was run: scripts that differ.
local function script_warnings(files)
  local out = {}
  local base = files[1].env
  for i = 2, #files do
    local e = files[i].env
    if base.script_sha256 and e.script_sha256 and base.script_sha256 ~= e.script_sha256 then
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

local function is_oom(row, metric)
  return row and (row[metric] == "OOM" or (row.oom ~= nil and row.oom ~= false and not number(row[metric])))
end

local function cell(row, metric)
  if not row then return nil end
  if number(row[metric]) then return row[metric] end
  if is_oom(row, metric) then return "OOM" end
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
          if gated and number(va) and is_oom(b, m) then
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

-- The comparison as table rows and columns for tf.report.
local function table_of(files, lines, key, metrics)
  local columns = {}
  for _, c in ipairs(key) do columns[#columns + 1] = c end
  local rows = {}
  for _, line in ipairs(lines) do
    local r = {}
    for _, c in ipairs(key) do r[c] = line.row[c] end
    local present = {}
    for i, f in ipairs(files) do
      if line.of[i] then present[#present + 1] = f.label end
    end
    r.present = #present == #files and "" or (table.concat(present, ", ") .. " only")
    for _, m in ipairs(metrics) do
      local base = cell(line.of[1], m)
      r[m .. " " .. files[1].label] = base
      for i = 2, #files do
        local v = cell(line.of[i], m)
        r[m .. " " .. files[i].label] = v
        if number(base) and number(v) and base ~= 0 then r[m .. " " .. files[i].label .. "/" .. files[1].label] = v / base end
      end
    end
    rows[#rows + 1] = r
  end
  for _, m in ipairs(metrics) do
    columns[#columns + 1] = m .. " " .. files[1].label
    for i = 2, #files do
      columns[#columns + 1] = m .. " " .. files[i].label
      local ratio = m .. " " .. files[i].label .. "/" .. files[1].label
      columns[#columns + 1] = { ratio, files[i].label .. "/" .. files[1].label, function(v)
        return string.format("%.2f", v) end }
    end
  end
  columns[#columns + 1] = { "present", "rows" }
  return rows, columns
end

-- The rows drawn by --plot: every file's matched rows, labelled by file.
local function plot(path, files, lines, key, metrics, x)
  local tf = require "tf"
  if not x then
    local best = 0
    for _, c in ipairs(key) do
      local n, numeric = 0, true
      for _, f in ipairs(files) do
        local set, count = values_of(f, c)
        n = math.max(n, count)
        for _, v in pairs(set) do numeric = numeric and number(v) end
      end
      if numeric and n > best then x, best = c, n end
    end
    x = x or key[1]
  end
  if not x then fail("--plot: the files have no configuration column to draw along (give --x COLUMN)") end
  local series = {}
  for _, c in ipairs(key) do
    if c ~= x then series[#series + 1] = c end
  end
  local rows = {}
  for _, line in ipairs(lines) do
    for i, f in ipairs(files) do
      local r = line.of[i]
      if r then
        local p = { file = f.label .. ": " .. f.path:match("[^/]*$") }
        for _, c in ipairs(key) do p[c] = r[c] end
        for _, m in ipairs(metrics) do p[m] = cell(r, m) end
        p.oom = r.oom
        rows[#rows + 1] = p
      end
    end
  end
  local charts = {}
  for _, m in ipairs(metrics) do
    charts[#charts + 1] = { rows = rows, x = x, y = m, series = series, group = function(r) return r.file end,
      title = units.label(m) .. ": " .. table.concat((function()
        local names = {}
        for _, f in ipairs(files) do names[#names + 1] = f.label end
        return names
      end)(), " vs ") }
  end
  local notes = {}
  for _, f in ipairs(files) do notes[#notes + 1] = f.label .. ": " .. f.path end
  local ok, err = pcall(tf.plot.write, path, charts, { title = "tfhost compare", notes = notes })
  if not ok then fail("--plot: %s", tostring(err):gsub("^.-tf%.plot%.write: ", "")) end
end

local function file_line(f)
  local e = f.env
  local what = {}
  if e.script then what[#what + 1] = tostring(e.script) end
  if type(e.command) == "table" then
    local parts = {}
    for i, a in ipairs(e.command) do parts[i] = a:find("[%s'\"]") and ("'" .. a:gsub("'", "'\\''") .. "'") or a end
    what[#what + 1] = "`" .. table.concat(parts, " ") .. "`"
  end
  if e.started or e.date then what[#what + 1] = tostring(e.started or e.date) end
  if e.device then what[#what + 1] = tostring(e.device) end
  return string.format("- %s: %s%s", f.label, f.path, #what > 0 and (" (" .. table.concat(what, ", ") .. ")") or "")
end

--- Runs the command with its arguments; exits 0, 1 (regressions beyond
-- the threshold) or 2 (bad input, or no rows in common).
function M.main(...)
  local tf = require "tf"
  arg = arg or {}
  arg[0] = "tfhost compare"
  local opt = tf.options({
    description = "Compare results files: rows matched by configuration, each metric side by side with its ratio "
      .. "to the first file, and the differences of their environments.",
    usage = USAGE,
    { "metric", "metrics to compare (default: the files' own choice, else every common numeric column)",
      type = "list" },
    { "key", "columns that name a configuration (default: the files' own, else every non-metric column that varies)",
      type = "list" },
    { "threshold", "exit 1 when a time rises or a throughput falls by more than PCT percent", type = "number" },
    { "json", "print the comparison as JSON", type = "bool" },
    { "csv", "print the table as CSV", type = "bool" },
    { "plot", "draw each metric of every file into FILE (.svg or .html)", type = "string" },
    { "x", "the column along the plot's x axis (default: the numeric key column with the most values)",
      type = "string" },
  }, { ... })
  if #opt.args < 2 then fail("needs two or more results files (usage: %s)", USAGE) end
  if opt.json and opt.csv then fail("--json and --csv: choose one") end
  if opt.threshold and opt.threshold < 0 then fail("--threshold needs a percentage >= 0") end
  local files = {}
  for i, path in ipairs(opt.args) do
    local label = i <= 26 and string.char(64 + i) or ("F" .. i)
    files[i] = load(path, label)
  end
  local warnings = script_warnings(files)
  local key, settings = choose_key(files, opt.key)
  local metrics = choose_metrics(files, opt.metric, key)
  if #metrics == 0 then fail("the files have no numeric column in common to compare (--metric names one)") end
  local lines = match(files, key, warnings)
  local common = 0
  for _, line in ipairs(lines) do
    local all = true
    for i = 1, #files do all = all and line.of[i] ~= nil end
    if all then common = common + 1 end
  end
  if common == 0 then
    fail("the files have no rows in common (matched by %s)", #key > 0 and table.concat(key, ", ") or "no column")
  end
  local diffs = differences(files, settings)
  local regress = opt.threshold and regressions(files, lines, metrics, opt.threshold, key) or {}
  local rows, columns = table_of(files, lines, key, metrics)
  for _, w in ipairs(warnings) do io.stderr:write("tfhost compare: warning: ", w, "\n") end
  if opt.plot then plot(opt.plot, files, lines, key, metrics, opt.x) end

  if opt.json then
    local out = { files = tf.json.array(), key = tf.json.array(key), metrics = tf.json.array(metrics),
      differences = tf.json.array(), warnings = tf.json.array(warnings), rows = tf.json.array(),
      threshold = opt.threshold, regressions = tf.json.array(regress), common_rows = common }
    for _, f in ipairs(files) do
      out.files[#out.files + 1] = { label = f.label, path = f.path, script = f.env.script,
        script_sha256 = f.env.script_sha256, command = f.env.command, device = f.env.device }
    end
    for _, d in ipairs(diffs) do
      local v = {}
      for i, f in ipairs(files) do v[f.label] = d.values[i] end
      out.differences[#out.differences + 1] = { setting = d.setting, values = v }
    end
    for _, line in ipairs(lines) do
      local r = { config = {}, present = tf.json.array(), values = {}, ratios = {} }
      for _, c in ipairs(key) do r.config[c] = line.row[c] end
      for i, f in ipairs(files) do
        if line.of[i] then r.present[#r.present + 1] = f.label end
      end
      for _, m in ipairs(metrics) do
        r.values[m], r.ratios[m] = {}, {}
        local base = cell(line.of[1], m)
        for i, f in ipairs(files) do
          local v = cell(line.of[i], m)
          r.values[m][f.label] = v
          if i > 1 and number(base) and number(v) and base ~= 0 then r.ratios[m][f.label] = v / base end
        end
      end
      out.rows[#out.rows + 1] = r
    end
    io.write(tf.json.encode(out, { indent = true, nan = "null" }), "\n")
  elseif opt.csv then
    report.table(rows, { columns = columns, format = "csv" })
  else
    print("Files (ratios are to " .. files[1].label .. "):")
    for _, f in ipairs(files) do print(file_line(f)) end
    for _, w in ipairs(warnings) do print("\n**warning**: " .. w) end
    if #diffs > 0 then
      local drows, dcols = {}, { "setting" }
      for _, f in ipairs(files) do dcols[#dcols + 1] = f.label end
      for _, d in ipairs(diffs) do
        local r = { setting = d.setting }
        for i, f in ipairs(files) do r[f.label] = d.values[i] == nil and "-" or d.values[i] end
        drows[#drows + 1] = r
      end
      print()
      report.table(drows, { columns = dcols, title = "Differences" })
    else
      print("\nNo differences in the environments.")
    end
    print()
    report.table(rows, { columns = columns, title = string.format("Results (%d rows in common, %d in some files only)",
      common, #lines - common) })
    if opt.threshold then
      if #regress == 0 then
        print(string.format("\nNo time rose and no throughput fell by more than %g%%.", opt.threshold))
      else
        print(string.format("\n### Regressions beyond %g%%\n", opt.threshold))
        for _, g in ipairs(regress) do
          print(string.format("- %s %s %s: %s", g.file, g.config, g.metric, g.change))
        end
      end
    end
  end
  if #regress > 0 then tf.exit(1) end
end

return M
