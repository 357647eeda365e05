--- `tfhost compare A.json B.json [C.json ...]`: results files side by side.
-- Rows are matched by their configuration columns (size, context,
-- precision, dtype, d, seq, ...); each metric is shown for every file with
-- its ratio to the first file (the baseline); rows that only some files
-- have are marked; the differences of the files' environments (device,
-- driver, CUDA, commit, options, ...) come above the table. --threshold PCT
-- makes a time that rises or a throughput that falls by more than PCT
-- percent exit 1, so CI can catch regressions. Files whose results are
-- named parts (experiments/mixed_precision.lua) are compared part by part.
-- The analysis is tf.comparison; this file is the command and its output.
local units = require "tf.units"
local report = require "tf.report"
local C = require "tf.comparison"

local M = {}

local USAGE = "tfhost compare [options] A.json B.json [C.json ...]"
local fail, cell, values_of = C.fail, C.cell, C.values_of

local function number(v) return math.type(v) ~= nil end

-- A file's document and its parts ({name, rows}; one unnamed part when
-- "results" is a list of rows); a bad file ends the command (exit 2).
local function load(path, label)
  local read = require("tf.results").read
  local function try(part)
    local ok, rows, doc = pcall(read, path, part and { part = part } or nil)
    if not ok then fail("%s", (tostring(rows):gsub("^.-tf%.results%.read: ", ""))) end
    return rows, doc
  end
  local ok, rows, doc = pcall(read, path)
  local parts = {}
  if ok then
    parts[1] = { rows = rows }
  elseif tostring(rows):find("holds named parts", 1, true) then
    doc = require("tf").json.read(path)
    local names = {}
    for name, v in pairs(doc.results) do
      if type(v) == "table" and (v[1] ~= nil or next(v) == nil) then names[#names + 1] = name end
    end
    table.sort(names)
    for _, name in ipairs(names) do parts[#parts + 1] = { name = name, rows = (try(name)) } end
  else
    try()
  end
  return { path = path, label = label, doc = doc, parts = parts, env = type(doc.env) == "table" and doc.env or {} }
end

-- The parts every file has, in order; the files' rows are set per part.
local function common_parts(files, only)
  local names = {}
  for _, p in ipairs(files[1].parts) do names[#names + 1] = p.name or false end
  if only then names = { only } end
  local out = {}
  for _, name in ipairs(names) do
    local everywhere = true
    for _, f in ipairs(files) do
      local found = false
      for _, p in ipairs(f.parts) do found = found or (p.name or false) == name end
      everywhere = everywhere and found
    end
    if everywhere then out[#out + 1] = name end
  end
  if #out == 0 then
    for _, f in ipairs(files) do
      local have = {}
      for _, p in ipairs(f.parts) do have[#have + 1] = p.name or "(rows)" end
      if only then fail("%s: \"results\" has no part \"%s\" (it has %s)", f.path, only, table.concat(have, ", ")) end
    end
    fail("the files have no part of their results in common: %s holds %s, %s holds %s", files[1].path,
      files[1].parts[1].name and "named parts" or "rows", files[2].path, files[2].parts[1].name and "named parts" or "rows")
  end
  return out
end

local function use_part(files, name)
  for _, f in ipairs(files) do
    for _, p in ipairs(f.parts) do
      if (p.name or false) == name then f.rows = p.rows end
    end
    if #f.rows == 0 then fail("%s: \"results\"%s has no rows", f.path, name and (" part \"" .. name .. "\"") or "") end
  end
end

-- The comparison as table rows and columns for tf.report; long titles
-- (CSV) name each ratio column by its metric.
local function table_of(files, cmp, long_titles)
  local columns = {}
  for _, c in ipairs(cmp.key) do columns[#columns + 1] = c end
  local rows = {}
  for _, line in ipairs(cmp.lines) do
    local r = {}
    for _, c in ipairs(cmp.key) do r[c] = line.row[c] end
    local present = {}
    for i, f in ipairs(files) do
      if line.of[i] then present[#present + 1] = f.label end
    end
    r.present = #present == #files and "" or (table.concat(present, ", ") .. " only")
    for _, m in ipairs(cmp.metrics) do
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
  for _, m in ipairs(cmp.metrics) do
    columns[#columns + 1] = m .. " " .. files[1].label
    for i = 2, #files do
      columns[#columns + 1] = m .. " " .. files[i].label
      local ratio = files[i].label .. "/" .. files[1].label
      columns[#columns + 1] = { m .. " " .. ratio, long_titles and (m .. " " .. ratio) or ratio, function(v)
        return string.format("%.2f", v) end }
    end
  end
  columns[#columns + 1] = { "present", "rows" }
  return rows, columns
end

-- Refuses an --x that is not a column naming the rows' configurations (a
-- column of one value would draw every point at one place).
local function check_x(files, cmp, x, part)
  local accepted = {}
  for _, c in ipairs(cmp.key) do
    if c == x then return end
    accepted[#accepted + 1] = c
  end
  if x == "file" then return end
  accepted[#accepted + 1] = "file"
  local where = part and (" in part \"" .. part .. "\"") or ""
  local values, count = {}, 0
  for _, f in ipairs(files) do
    local set = values_of(f, x)
    for text in pairs(set) do
      if not values[text] then values[text], count = true, count + 1 end
    end
  end
  if count == 0 then
    fail("--x %s: no row%s has a column '%s' (accepted: %s)", x, where, x, table.concat(accepted, ", "))
  end
  local shown = next(values)
  if count == 1 then
    fail("--x %s: '%s' is %s in every row%s, so it cannot be the x axis (accepted: %s)", x, x, shown, where,
      table.concat(accepted, ", "))
  end
  fail("--x %s: '%s' is not a column that names a configuration%s (accepted: %s; --key chooses them)", x, x, where,
    table.concat(accepted, ", "))
end

-- The charts of --plot: each metric along x (default: the numeric key
-- column with the most values; the files themselves where every row is
-- one configuration), one colour per configuration, one line style per
-- file.
local function charts_of(files, cmp, x, part)
  if x then check_x(files, cmp, x, part) end
  if not x then
    local best = 0
    for _, c in ipairs(cmp.key) do
      local n, numeric = 0, true
      for _, f in ipairs(files) do
        local set, count = values_of(f, c)
        n = math.max(n, count)
        for _, v in pairs(set) do numeric = numeric and number(v) end
      end
      if numeric and n > best then x, best = c, n end
    end
    x = x or cmp.key[1] or "file"
  end
  local series = {}
  for _, c in ipairs(cmp.key) do
    if c ~= x then series[#series + 1] = c end
  end
  local rows = {}
  for _, line in ipairs(cmp.lines) do
    for i, f in ipairs(files) do
      local r = line.of[i]
      if r then
        local p = { oom = r.oom, [x] = r[x] }
        p.file = f.label .. ": " .. f.path:match("[^/]*$")
        for _, c in ipairs(cmp.key) do p[c] = r[c] end
        for _, m in ipairs(cmp.metrics) do p[m] = cell(r, m) end
        rows[#rows + 1] = p
      end
    end
  end
  local labels = {}
  for _, f in ipairs(files) do labels[#labels + 1] = f.label end
  local charts = {}
  for _, m in ipairs(cmp.metrics) do
    charts[#charts + 1] = { rows = rows, x = x, y = m, series = series, group = function(r) return r.file end,
      title = (part and (part .. ": ") or "") .. units.label(m) .. ": " .. table.concat(labels, " vs ") }
  end
  return charts
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

-- A table of differences: | setting | A | B | ...
local function print_differences(files, diffs, title)
  local drows, dcols = {}, { "setting" }
  for _, f in ipairs(files) do dcols[#dcols + 1] = f.label end
  for _, d in ipairs(diffs) do
    local r = { setting = d.setting }
    for i, f in ipairs(files) do r[f.label] = d.values[i] == nil and "-" or d.values[i] end
    drows[#drows + 1] = r
  end
  print()
  report.table(drows, { columns = dcols, title = title })
end

-- One part's comparison as Markdown.
local function print_markdown(files, cmp, part, threshold)
  if part and #cmp.settings > 0 then print_differences(files, cmp.settings, (part and (part .. ": ") or "") .. "Row settings") end
  print()
  local rows, columns = table_of(files, cmp)
  report.table(rows, { columns = columns, title = string.format("%s (%d rows in common, %d in some files only)",
    part and ("Part " .. part) or "Results", cmp.common, #cmp.lines - cmp.common) })
  if threshold then
    if #cmp.regressions == 0 then
      print(string.format("\nNo time rose and no throughput fell by more than %g%%.", threshold))
    else
      print(string.format("\n### Regressions beyond %g%%\n", threshold))
      for _, g in ipairs(cmp.regressions) do
        print(string.format("- %s %s %s: %s", g.file, g.config, g.metric, g.change))
      end
    end
  end
end

-- One part's comparison as a JSON-ready table.
local function json_of(tf, files, cmp, threshold)
  local function labelled(values)
    local v = {}
    for i, f in ipairs(files) do v[f.label] = values[i] end
    return v
  end
  local out = { key = tf.json.array(cmp.key), metrics = tf.json.array(cmp.metrics), settings = tf.json.array(),
    rows = tf.json.array(), threshold = threshold, regressions = tf.json.array(cmp.regressions),
    common_rows = cmp.common }
  for _, d in ipairs(cmp.settings) do out.settings[#out.settings + 1] = { setting = d.setting, values = labelled(d.values) } end
  for _, line in ipairs(cmp.lines) do
    local r = { config = {}, present = tf.json.array(), values = {}, ratios = {} }
    for _, c in ipairs(cmp.key) do r.config[c] = line.row[c] end
    for i, f in ipairs(files) do
      if line.of[i] then r.present[#r.present + 1] = f.label end
    end
    for _, m in ipairs(cmp.metrics) do
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
  return out
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
    { "x", "the column along the plot's x axis (default: the numeric key column with the most values;"
      .. " the files where each holds one configuration)", type = "string" },
    { "part", "where results are named parts (mixed_precision.lua): compare this one (default: each in turn)",
      type = "string" },
  }, { ... })
  if #opt.args < 2 then fail("needs two or more results files (usage: %s)", USAGE) end
  if opt.json and opt.csv then fail("--json and --csv: choose one") end
  if opt.threshold and opt.threshold < 0 then fail("--threshold needs a percentage >= 0") end
  if opt.x and not opt.plot then fail("--x %s: --x chooses the x axis of --plot's charts: give --plot FILE too", opt.x) end
  local files = {}
  for i, path in ipairs(opt.args) do files[i] = load(path, i <= 26 and string.char(64 + i) or ("F" .. i)) end
  local parts = common_parts(files, opt.part)
  if opt.csv and #parts > 1 then
    fail("the files hold named parts (%s): --csv needs --part NAME", table.concat(parts, ", "))
  end
  local warnings = C.script_warnings(files)
  local done, skipped, charts, regressed = {}, {}, {}, false
  for _, name in ipairs(parts) do
    use_part(files, name)
    local cmp, why = C.build(files, opt)
    if cmp then
      done[#done + 1] = { name = name or nil, cmp = cmp }
      for _, w in ipairs(cmp.warnings) do warnings[#warnings + 1] = w end
      regressed = regressed or #cmp.regressions > 0
      if opt.plot then
        for _, c in ipairs(charts_of(files, cmp, opt.x, name or nil)) do charts[#charts + 1] = c end
      end
    elseif #parts == 1 then
      fail("%s", why)
    else
      skipped[#skipped + 1] = name .. ": " .. why
    end
  end
  if #done == 0 then fail("no part of the results could be compared (%s)", table.concat(skipped, "; ")) end
  for _, w in ipairs(warnings) do io.stderr:write("tfhost compare: warning: ", w, "\n") end
  if opt.plot then
    local notes = {}
    for _, f in ipairs(files) do notes[#notes + 1] = f.label .. ": " .. f.path end
    local ok, err = pcall(tf.plot.write, opt.plot, charts, { title = "tfhost compare", notes = notes })
    if not ok then fail("--plot: %s", (tostring(err):gsub("^.-tf%.plot%.write: ", ""))) end
  end
  local diffs = C.env_differences(files)
  if not done[1].name then
    for _, d in ipairs(done[1].cmp.settings) do diffs[#diffs + 1] = d end
  end

  if opt.json then
    local out = { files = tf.json.array(), differences = tf.json.array(), warnings = tf.json.array(warnings) }
    for _, f in ipairs(files) do
      out.files[#out.files + 1] = { label = f.label, path = f.path, script = f.env.script,
        script_sha256 = f.env.script_sha256, command = f.env.command, device = f.env.device }
    end
    for _, d in ipairs(diffs) do
      local v = {}
      for i, f in ipairs(files) do v[f.label] = d.values[i] end
      out.differences[#out.differences + 1] = { setting = d.setting, values = v }
    end
    if done[1].name then
      out.parts = {}
      for _, p in ipairs(done) do out.parts[p.name] = json_of(tf, files, p.cmp, opt.threshold) end
      out.skipped_parts = tf.json.array(skipped)
    else
      for k, v in pairs(json_of(tf, files, done[1].cmp, opt.threshold)) do out[k] = v end
      out.settings = nil
    end
    io.write(tf.json.encode(out, { indent = true, nan = "null" }), "\n")
  elseif opt.csv then
    local rows, columns = table_of(files, done[1].cmp, true)
    report.table(rows, { columns = columns, format = "csv" })
  else
    print("Files (ratios are to " .. files[1].label .. "):")
    for _, f in ipairs(files) do print(file_line(f)) end
    for _, w in ipairs(warnings) do print("\n**warning**: " .. w) end
    if #diffs > 0 then
      print_differences(files, diffs, "Differences")
    else
      print("\nNo differences in the environments.")
    end
    for _, p in ipairs(done) do print_markdown(files, p.cmp, p.name, opt.threshold) end
    for _, s in ipairs(skipped) do print("\nNot compared: " .. s) end
  end
  if regressed then tf.exit(1) end
end

return M
