--- Reports: a list of rows (tables) rendered as Markdown, CSV or JSON.
--
--   tf.report.table(rows, {columns = {"size", {"fwd_ms", "forward ms", "%.2f"}},
--                          format = "markdown", out = io.stdout})
--
-- A column is a key, or {key, title, format} where format is a
-- string.format pattern or a function(value, row) -> string. Formats live in
-- tf.report.formats and can be replaced or extended by scripts:
--   tf.report.formats.tsv = function(rows, columns) return text end
local M = { formats = {} }
local writable = require("tf.safe").writable -- tfhost --safe's path rule

--- The default rendering of a value in a cell.
function M.cell(v)
  if v == nil then return "" end
  if math.type(v) == "integer" then return tostring(v) end
  if type(v) == "number" then
    if v ~= v then return "nan" end
    if v == math.huge then return "inf" end
    if v == -math.huge then return "-inf" end
    local a = math.abs(v)
    if a ~= 0 and (a >= 1e7 or a < 1e-3) then return string.format("%.3e", v) end
    if a >= 1000 then return string.format("%.1f", v) end
    return string.format("%.4g", v)
  end
  return tostring(v)
end

-- Columns as {key, title, format}; defaults to the sorted keys of all rows.
local function columns_of(rows, columns)
  local out = {}
  if not columns then
    local seen, keys = {}, {}
    for _, r in ipairs(rows) do
      for k in pairs(r) do
        if not seen[k] then seen[k], keys[#keys + 1] = true, k end
      end
    end
    table.sort(keys, function(a, b) return tostring(a) < tostring(b) end)
    columns = keys
  end
  for _, c in ipairs(columns) do
    if type(c) == "table" then
      out[#out + 1] = { key = c[1] or c.key, title = c[2] or c.title or c[1] or c.key, format = c[3] or c.format }
    else
      out[#out + 1] = { key = c, title = tostring(c) }
    end
  end
  return out
end

local function text_of(col, row)
  local v = row[col.key]
  if col.format and v ~= nil then
    if type(col.format) == "function" then return tostring(col.format(v, row)) end
    if type(v) == "number" then return string.format(col.format, v) end
  end
  return M.cell(v)
end

function M.formats.markdown(rows, columns)
  local head, rule, lines = {}, {}, {}
  for _, c in ipairs(columns) do
    head[#head + 1] = c.title
    rule[#rule + 1] = "---"
  end
  lines[1] = "| " .. table.concat(head, " | ") .. " |"
  lines[2] = "|" .. table.concat(rule, "|") .. "|"
  for _, r in ipairs(rows) do
    local cells = {}
    for _, c in ipairs(columns) do cells[#cells + 1] = (text_of(c, r):gsub("|", "\\|")) end
    lines[#lines + 1] = "| " .. table.concat(cells, " | ") .. " |"
  end
  return table.concat(lines, "\n") .. "\n"
end

local function csv_field(s)
  if s:find('[,"\r\n]') then return '"' .. s:gsub('"', '""') .. '"' end
  return s
end

function M.formats.csv(rows, columns)
  local lines, head = {}, {}
  for _, c in ipairs(columns) do head[#head + 1] = csv_field(tostring(c.title)) end
  lines[1] = table.concat(head, ",")
  for _, r in ipairs(rows) do
    local cells = {}
    for _, c in ipairs(columns) do
      local v = r[c.key]
      cells[#cells + 1] = csv_field(type(v) == "number" and not c.format and tostring(v) or text_of(c, r))
    end
    lines[#lines + 1] = table.concat(cells, ",")
  end
  return table.concat(lines, "\n") .. "\n"
end

function M.formats.json(rows, columns)
  local tf = require "tf"
  local out = tf.json.array()
  for _, r in ipairs(rows) do
    local o = {}
    for _, c in ipairs(columns) do o[c.key] = r[c.key] end
    out[#out + 1] = o
  end
  return tf.json.encode(out, { indent = true }) .. "\n"
end

-- The reporters tfhost ships, whose options tf.report.table knows.
local BUILTIN = { markdown = M.formats.markdown, csv = M.formats.csv, json = M.formats.json }

--- Renders rows; writes them to opts.out (a file handle or a path; default
-- io.stdout) unless opts.out is false, and returns the text.
function M.table(rows, opts)
  if type(rows) ~= "table" then
    error("tf.report.table: expects a list of rows (tables), got " .. (rows == nil and "nothing" or type(rows)), 2)
  end
  for i, r in ipairs(rows) do
    if type(r) ~= "table" then
      error(string.format("tf.report.table: rows[%d] is a %s, not a row (a table of columns)", i, type(r)), 2)
    end
  end
  if opts ~= nil and type(opts) ~= "table" then
    error("tf.report.table: the second argument is a table of options (or nothing), got " .. type(opts), 2)
  end
  opts = opts or {}
  local named = opts.format or "markdown"
  if BUILTIN[named] and M.formats[named] == BUILTIN[named] then -- a reporter of the user's may take options of its own
    require("tf.check").keys(opts, "tf.report.table", { "columns", "format", "out", "title" })
  end
  if opts.columns ~= nil and type(opts.columns) ~= "table" then
    error("tf.report.table: opts.columns must be a list of columns, got " .. type(opts.columns), 2)
  end
  local fmt = opts.format or "markdown"
  local render = M.formats[fmt]
  if not render then
    local names = {}
    for k in pairs(M.formats) do names[#names + 1] = k end
    table.sort(names)
    error("tf.report.table: unknown format '" .. tostring(fmt) .. "' (have " .. table.concat(names, ", ") .. ")", 2)
  end
  local text = render(rows, columns_of(rows, opts.columns), opts)
  if opts.title and fmt == "markdown" then text = "### " .. opts.title .. "\n\n" .. text end
  local out = opts.out
  if out == nil then out = io.stdout end
  if type(out) == "string" then
    writable(out, "tf.report.table")
    local f, err = io.open(out, "w")
    if not f then error("tf.report.table: " .. err, 2) end
    f:write(text)
    f:close()
  elseif out then
    out:write(text)
  end
  return text
end

--- tf.report.progress(fmt, ...): a progress note on stderr (stdout keeps the tables).
function M.progress(fmt, ...)
  if type(fmt) ~= "string" then error("tf.report.progress: expects a format string, got " .. type(fmt), 2) end
  io.stderr:write(string.format(fmt, ...))
end

--- tf.report.sweep(opts): the loop of a sweep, with a progress line that
-- says what is left and the rows written to the results file as they
-- finish (lua/tf/sweep.lua, loaded at the first use: a script that runs no
-- sweep does not pay for it on the Lua heap, which tfhost's start must keep
-- small).
-- tf.report.noise(a, b, spread_a, spread_b) is there too.
setmetatable(M, { __index = function(t, k)
  if k ~= "sweep" and k ~= "noise" then return nil end
  local sweep = require "tf.sweep"
  rawset(t, "sweep", sweep.new)
  rawset(t, "noise", sweep.noise)
  return t[k]
end })

return M
