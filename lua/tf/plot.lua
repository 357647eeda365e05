--- Plots of result rows as self-contained SVG (and HTML pages holding
-- several): lines over a numeric column with one series per configuration,
-- log axes where sizes double, axis labels with units, a legend, a title,
-- and out-of-memory rows marked. No network and no JavaScript: a browser,
-- an image viewer or a Markdown page shows the file as it is.
--
--   local svg = tf.plot.chart(rows, {x = "seq", y = "fwd_ms", series = {"impl", "d"}, title = "Forward"})
--   tf.plot.write("attention.html", {{rows = rows, x = "seq", y = "fwd_ms"}, {rows = rows, x = "seq", y = "bwd_ms"}})
local units = require "tf.units"

local check = require "tf.check"
local M = {}
local write_file = require("tf.safe").write_file -- taken when the module loads, as tf's other writers

--- Series colours, in order; a script may replace them.
M.palette = { "#2b6cb0", "#dd6b20", "#2f855a", "#c53030", "#6b46c1", "#975a16", "#d53f8c", "#4a5568",
  "#b7791f", "#0987a0" }
--- Line styles of the groups of a chart (opts.group), in order.
M.dashes = { "", "7 4", "2 3", "9 3 2 3" }

local WIDTH, HEIGHT = 720, 420

local function esc(s)
  return (tostring(s):gsub("[&<>\"]", { ["&"] = "&amp;", ["<"] = "&lt;", [">"] = "&gt;", ['"'] = "&quot;" }))
end

local kind_of = check.kind
local function num(v) return math.type(v) ~= nil and v == v and v ~= math.huge and v ~= -math.huge end

--- A number as an axis shows it: 16384 -> "16k", 0.25 -> "0.25", 1e-5 -> "1e-05".
function M.tick_text(v)
  if v == 0 then return "0" end
  local a = math.abs(v)
  if a >= 10000 and v % 1024 == 0 then return string.format("%dk", v // 1024) end
  if a >= 1e6 or a < 1e-3 then return (string.format("%.0e", v):gsub("e%+?(%-?)0*(%d)", "e%1%2")) end
  if v == math.floor(v) then return string.format("%d", math.floor(v)) end
  return (string.format("%.3g", v))
end

-- A linear scale over [lo, hi] with "nice" ticks (steps of 1, 2 or 5 x 10^k).
local function linear_scale(lo, hi, from_zero)
  if from_zero and lo > 0 then lo = 0 end
  if hi == lo then hi, lo = hi + (hi == 0 and 1 or math.abs(hi) * 0.5), lo - (lo == 0 and 0 or math.abs(lo) * 0.5) end
  local raw = (hi - lo) / 5
  local mag = 10 ^ math.floor(math.log(raw, 10))
  local step = mag
  for _, m in ipairs({ 1, 2, 5, 10 }) do
    if m * mag >= raw then step = m * mag break end
  end
  local first, last = math.floor(lo / step + 1e-9) * step, math.ceil(hi / step - 1e-9) * step
  local ticks = {}
  for i = 0, math.floor((last - first) / step + 0.5) do ticks[#ticks + 1] = first + i * step end
  return { lo = first, hi = last, ticks = ticks, map = function(v) return (v - first) / (last - first) end }
end

-- A log scale: decades (with 2 and 5 between when there are few), or the
-- data's own values when it is an axis of doubling sizes (base 2).
local function log_scale(lo, hi, values, base)
  local ticks = {}
  if base == 2 then
    local llo, lhi = math.log(lo, 2), math.log(hi, 2)
    if lhi - llo < 1e-9 then llo, lhi = llo - 1, lhi + 1 end
    local pad = (lhi - llo) * 0.04
    llo, lhi = llo - pad, lhi + pad
    local every = math.max(1, math.ceil(#values / 12))
    for i = 1, #values, every do ticks[#ticks + 1] = values[i] end
    return { lo = 2 ^ llo, hi = 2 ^ lhi, ticks = ticks, log = true,
      map = function(v) return (math.log(v, 2) - llo) / (lhi - llo) end }
  end
  local dlo, dhi = math.floor(math.log(lo, 10) + 1e-9), math.ceil(math.log(hi, 10) - 1e-9)
  if dhi == dlo then dhi = dlo + 1 end
  local steps = dhi - dlo <= 2 and { 1, 2, 5 } or { 1 }
  for d = dlo, dhi do
    for _, m in ipairs(steps) do
      local v = m * 10 ^ d
      if v <= 10 ^ dhi * 1.0000001 then ticks[#ticks + 1] = v end
    end
  end
  return { lo = 10 ^ dlo, hi = 10 ^ dhi, ticks = ticks, log = true,
    map = function(v) return (math.log(v, 10) - dlo) / (dhi - dlo) end }
end

--- For other charts of tfhost's (lua/tf/roofline.lua): a base-10 log scale over [lo, hi] (lo > 0)
-- widened to whole decades, {lo, hi, ticks, log = true, map = function(v) -> 0..1}, and the escape
-- of text into SVG.
function M._log_scale(lo, hi) return log_scale(lo, hi, nil, 10) end
M._escape = esc

-- Whether sorted positive values grow by factors (sizes that double): a log axis.
local function doubling(values)
  if #values < 2 or values[1] <= 0 then return false end
  for i = 2, #values do
    if values[i] / values[i - 1] < 1.9 then return false end
  end
  return true
end

-- The text naming a row's series: "flash, d=64" (strings bare, numbers named).
local function series_text(row, columns)
  local parts = {}
  for _, c in ipairs(columns) do
    local v = row[c]
    if v ~= nil then
      parts[#parts + 1] = type(v) == "string" and v or (c .. "=" .. tostring(v))
    end
  end
  return #parts > 0 and table.concat(parts, ", ") or "all"
end

-- The columns of a list that take more than one value in rows.
local function varying(rows, columns)
  local out = {}
  for _, c in ipairs(columns) do
    local first, differs = nil, false
    for _, r in ipairs(rows) do
      local v = r[c]
      if v ~= nil then
        if first == nil then first = v elseif v ~= first then differs = true end
      end
    end
    if differs then out[#out + 1] = c end
  end
  return out
end

--- The columns that tell rows apart when no series is given: scalar,
-- non-metric columns (other than x and y) whose values vary.
function M.series_columns(rows, x, y, ignore)
  local skip = { [x] = true, [y] = true, oom = true }
  for _, c in ipairs(ignore or {}) do skip[c] = true end
  local seen, order = {}, {}
  for _, r in ipairs(rows) do
    for k, v in pairs(r) do
      if not seen[k] and not skip[k] and not units.of(k)
        and (type(v) == "string" or type(v) == "boolean" or math.type(v) == "integer") then
        seen[k], order[#order + 1] = true, k
      end
    end
  end
  table.sort(order)
  return varying(rows, order)
end

-- Groups rows into series: {label, group, points = {{x, y, row}}, oom = {x...}}.
local function gather(rows, opts)
  local label_of = opts.series
  if type(label_of) ~= "function" then
    local columns = M.series_columns(rows, opts.x, opts.y, opts.ignore)
    if label_of then
      columns = {}
      for _, c in ipairs(varying(rows, label_of)) do
        if c ~= opts.x then columns[#columns + 1] = c end
      end
    end
    label_of = function(r) return series_text(r, columns) end
  end
  local is_oom = opts.oom or function(r, y) return r.oom ~= nil and r.oom ~= false or r[y] == "OOM" end
  local list, by = {}, {}
  for _, r in ipairs(rows) do
    local xv, yv = r[opts.x], r[opts.y]
    local oom = is_oom(r, opts.y) and not num(yv)
    if xv ~= nil and (num(yv) or oom) then
      local label = tostring(label_of(r))
      local group = opts.group and tostring(opts.group(r)) or nil
      local id = label .. "\0" .. (group or "")
      local s = by[id]
      if not s then
        s = { label = label, group = group, points = {}, oom = {} }
        by[id], list[#list + 1] = s, s
      end
      if oom then s.oom[#s.oom + 1] = xv else s.points[#s.points + 1] = { xv, yv } end
    end
  end
  return list
end

-- The x axis: numeric (linear, or log base 2 where sizes double) or
-- categorical (names in their first order).
local function x_axis(list, opts)
  local values, seen, numeric = {}, {}, true
  for _, s in ipairs(list) do
    for _, p in ipairs(s.points) do
      if not seen[p[1]] then seen[p[1]], values[#values + 1] = true, p[1] end
    end
    for _, xv in ipairs(s.oom) do
      if not seen[xv] then seen[xv], values[#values + 1] = true, xv end
    end
  end
  for _, v in ipairs(values) do numeric = numeric and num(v) end
  if not numeric then
    local index = {}
    for i, v in ipairs(values) do index[v] = i end
    local n = #values
    return { ticks = values, map = function(v) return n == 1 and 0.5 or (index[v] - 1) / (n - 1) * 0.9 + 0.05 end,
      categorical = true }
  end
  table.sort(values)
  local logx = opts.logx
  if logx == nil then logx = doubling(values) end
  if logx and values[1] and values[1] > 0 then return log_scale(values[1], values[#values], values, 2) end
  local sc = linear_scale(values[1] or 0, values[#values] or 1, false)
  return sc
end

local function y_axis(list, opts)
  local lo, hi = math.huge, -math.huge
  for _, s in ipairs(list) do
    for _, p in ipairs(s.points) do
      if p[2] < lo then lo = p[2] end
      if p[2] > hi then hi = p[2] end
    end
  end
  if lo > hi then lo, hi = 0, 1 end
  local logy = opts.logy
  if logy == nil then logy = lo > 0 and hi / lo >= 50 end
  if logy and lo > 0 then return log_scale(lo, hi, nil, 10) end
  return linear_scale(lo, hi, lo >= 0)
end

-- The options a chart takes (tf.plot.chart, and the specs of page and write).
local CHART_KEYS = { "x", "y", "rows", "series", "title", "xlabel", "ylabel", "width", "height", "group", "ignore", "logx", "logy", "oom" }

--- tf.plot.chart(rows, opts) -> the SVG text of one chart. opts: x and y
-- (column names; required), series (a list of columns, or function(row) ->
-- label; default: the varying non-metric columns), group (function(row) ->
-- label drawn as the line style, e.g. which file a row came from), title,
-- xlabel, ylabel (default: from the column names, with units), logx, logy
-- (default: log x where sizes double, log y over two decades), oom
-- (function(row, y) -> whether the row ran out of memory; default: row.oom
-- or y == "OOM"), width, height.
function M.chart(rows, opts)
  if type(rows) ~= "table" then error("tf.plot.chart: expects a list of rows, got " .. kind_of(rows), 2) end
  if opts ~= nil and type(opts) ~= "table" then error("tf.plot.chart: opts must be a table, got " .. type(opts), 2) end
  opts = check.keys(opts, "tf.plot.chart", CHART_KEYS)
  if type(opts.x) ~= "string" or type(opts.y) ~= "string" then
    error("tf.plot.chart: opts.x and opts.y must name columns (strings), got " .. kind_of(opts.x) .. " and " ..
      kind_of(opts.y), 2)
  end
  local W, H = opts.width or WIDTH, opts.height or HEIGHT
  local list = gather(rows, opts)
  local groups, group_index = {}, {}
  for _, s in ipairs(list) do
    if s.group and not group_index[s.group] then groups[#groups + 1] = s.group group_index[s.group] = #groups end
  end
  -- a colour per series; past the palette, without groups, a line style too
  local colors, color_of, dash_of = {}, {}, {}
  for _, s in ipairs(list) do
    if not color_of[s.label] then
      colors[#colors + 1] = s.label
      local k = #colors - 1
      color_of[s.label] = M.palette[k % #M.palette + 1]
      dash_of[s.label] = #groups == 0 and M.dashes[(k // #M.palette) % #M.dashes + 1] or ""
    end
  end
  -- the legend: one entry per series, then one per line style
  local entries = {}
  for _, label in ipairs(colors) do
    entries[#entries + 1] = { text = label, color = color_of[label], dash = dash_of[label] }
  end
  for _, g in ipairs(groups) do
    entries[#entries + 1] = { text = g, color = "#333333", dash = M.dashes[(group_index[g] - 1) % #M.dashes + 1] }
  end
  local any_oom = false
  for _, s in ipairs(list) do any_oom = any_oom or #s.oom > 0 end
  if any_oom then entries[#entries + 1] = { text = "out of memory", oom = true } end
  local longest = 0
  for _, e in ipairs(entries) do longest = math.max(longest, utf8.len(e.text) or #e.text) end
  local legend_w = math.min(300, math.max(110, 44 + 7 * longest))
  local left, right, top, bottom = 72, legend_w + 16, 44, 56
  H = math.max(H, top + 20 + 18 * #entries + bottom) -- room for a long legend
  local pw, ph = W - left - right, H - top - bottom
  local xs, ys = x_axis(list, opts), y_axis(list, opts)
  local function px(v) return left + xs.map(v) * pw end
  -- out-of-memory crosses stand in a band along the top edge, as many deep as
  -- the most series that ran out at one x; the values are drawn below it, so
  -- that no cross covers a point
  local stacked, band = {}, 0
  for _, s in ipairs(list) do
    for _, xv in ipairs(s.oom) do
      local x = string.format("%.1f", px(xv))
      stacked[x] = (stacked[x] or 0) + 1
      band = math.max(band, 10 + 14 * stacked[x])
    end
  end
  local function py(v) return top + ph - ys.map(v) * (ph - band) end

  local out = {}
  local function add(fmt, ...) out[#out + 1] = string.format(fmt, ...) end
  add('<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" ' ..
    'font-family="DejaVu Sans, Arial, sans-serif" font-size="12" class="tf-plot">', W, H, W, H)
  add('<rect width="%d" height="%d" fill="#ffffff"/>', W, H)
  local title = opts.title or (units.label(opts.y) .. " by " .. units.label(opts.x))
  add('<text x="%d" y="24" font-size="15" font-weight="bold" text-anchor="middle" class="title">%s</text>',
    left + pw // 2, esc(title))
  add('<rect class="plot-area" x="%d" y="%d" width="%d" height="%d" fill="#ffffff" stroke="#999999"/>',
    left, top, pw, ph)
  -- grid and tick labels
  for _, t in ipairs(ys.ticks) do
    local y = py(t)
    add('<line x1="%d" y1="%.1f" x2="%d" y2="%.1f" stroke="#e6e6e6"/>', left, y, left + pw, y)
    add('<text x="%d" y="%.1f" text-anchor="end" dominant-baseline="middle" fill="#333333">%s</text>',
      left - 6, y, esc(M.tick_text(t)))
  end
  for _, t in ipairs(xs.ticks) do
    local x = px(t)
    add('<line x1="%.1f" y1="%d" x2="%.1f" y2="%d" stroke="#e6e6e6"/>', x, top, x, top + ph)
    add('<text x="%.1f" y="%d" text-anchor="middle" fill="#333333">%s</text>', x, top + ph + 16,
      esc(num(t) and M.tick_text(t) or t))
  end
  local xlabel = opts.xlabel or (units.label(opts.x) .. (xs.log and ", log scale" or ""))
  local ylabel = opts.ylabel or (units.label(opts.y) .. (ys.log and ", log scale" or ""))
  add('<text x="%d" y="%d" text-anchor="middle" class="xlabel">%s</text>', left + pw // 2, H - 14, esc(xlabel))
  add('<text transform="translate(18 %d) rotate(-90)" text-anchor="middle" class="ylabel">%s</text>',
    top + ph // 2, esc(ylabel))
  -- the series, lines then points; out-of-memory rows as crosses along the
  -- top edge, stacked where several series ran out at one x
  local oom_at = {}
  for _, s in ipairs(list) do
    local color = color_of[s.label]
    local dash = s.group and M.dashes[(group_index[s.group] - 1) % #M.dashes + 1] or dash_of[s.label]
    table.sort(s.points, function(a, b)
      if xs.categorical then return xs.map(a[1]) < xs.map(b[1]) end
      return a[1] < b[1]
    end)
    add('<g class="series" data-label="%s" data-group="%s" data-color="%s">', esc(s.label), esc(s.group or ""), color)
    local pts = {}
    for _, p in ipairs(s.points) do pts[#pts + 1] = string.format("%.1f,%.1f", px(p[1]), py(p[2])) end
    if #pts > 1 then
      add('<polyline fill="none" stroke="%s" stroke-width="2.5" stroke-linejoin="round"%s points="%s"/>', color,
        dash ~= "" and (' stroke-dasharray="' .. dash .. '"') or "", table.concat(pts, " "))
    end
    for _, p in ipairs(s.points) do
      add('<circle cx="%.1f" cy="%.1f" r="3.5" fill="%s"><title>%s: %s = %s</title></circle>', px(p[1]), py(p[2]),
        color, esc(s.label), esc(opts.y), esc(M.tick_text(p[2])))
    end
    for _, xv in ipairs(s.oom) do
      local x = px(xv)
      local at = string.format("%.1f", x)
      local k = oom_at[at] or 0
      oom_at[at] = k + 1
      local y = top + 10 + 14 * k
      add('<g class="oom" data-x="%.1f" data-y="%d"><path d="M%.1f %.1f L%.1f %.1f M%.1f %.1f L%.1f %.1f" ' ..
        'stroke="%s" stroke-width="3"/><title>%s: out of memory</title></g>', x, y, x - 6, y - 6, x + 6, y + 6,
        x - 6, y + 6, x + 6, y - 6, color, esc(s.label))
    end
    add('</g>')
  end
  if #list == 0 then
    add('<text x="%d" y="%d" text-anchor="middle" fill="#666666">no data</text>', left + pw // 2, top + ph // 2)
  end
  -- the legend
  local lx, ly = W - right + 12, top
  add('<g class="legend">')
  for i, e in ipairs(entries) do
    local y = ly + 10 + (i - 1) * 18
    if e.oom then
      add('<path d="M%d %d L%d %d M%d %d L%d %d" stroke="#333333" stroke-width="2.5"/>', lx + 8, y - 5, lx + 18,
        y + 5, lx + 8, y + 5, lx + 18, y - 5)
    else
      add('<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="%s" stroke-width="3"%s/>', lx, y, lx + 26, y, e.color,
        e.dash ~= "" and (' stroke-dasharray="' .. e.dash .. '"') or "")
    end
    add('<text x="%d" y="%d" dominant-baseline="middle">%s</text>', lx + 32, y, esc(e.text))
  end
  add('</g></svg>')
  return table.concat(out, "\n") .. "\n"
end

-- A chart given as an SVG string or as {rows = ..., x = ..., y = ..., ...}.
local function render(c)
  if type(c) == "string" then return c end
  if type(c) ~= "table" or type(c.rows) ~= "table" then
    error("tf.plot.write: each chart is SVG text or a table {rows = ..., x = ..., y = ...}", 3)
  end
  return M.chart(c.rows, c)
end

--- tf.plot.page(charts [, opts]) -> a self-contained HTML page holding the
-- charts (SVG texts or chart specs) under opts.title, with opts.notes
-- (a list of lines) below the title.
function M.page(charts, opts)
  opts = check.keys(opts, "tf.plot.page", { "title", "notes" })
  local out = { '<!DOCTYPE html>\n<html><head><meta charset="utf-8"><title>' .. esc(opts.title or "tfhost plots") ..
    '</title>\n<style>body{font-family:"DejaVu Sans",Arial,sans-serif;margin:16px;background:#ffffff;color:#222222}' ..
    'figure{margin:0 0 20px 0}p.note{margin:2px 0;color:#444444}</style></head>\n<body>' }
  out[#out + 1] = "<h1>" .. esc(opts.title or "tfhost plots") .. "</h1>"
  for _, line in ipairs(opts.notes or {}) do out[#out + 1] = '<p class="note">' .. esc(line) .. "</p>" end
  for _, c in ipairs(charts) do out[#out + 1] = "<figure>\n" .. render(c) .. "</figure>" end
  out[#out + 1] = "</body></html>\n"
  return table.concat(out, "\n")
end

-- Several SVG charts stacked into one SVG.
local function stack(svgs)
  if #svgs == 1 then return svgs[1] end
  local parts, y, w = {}, 0, 0
  for _, s in ipairs(svgs) do
    local sw, sh = s:match('^<svg[^>]- width="(%d+)" height="(%d+)"')
    sw, sh = tonumber(sw) or WIDTH, tonumber(sh) or HEIGHT
    parts[#parts + 1] = (s:gsub("^<svg ", string.format('<svg x="0" y="%d" ', y), 1))
    y, w = y + sh, math.max(w, sw)
  end
  return string.format('<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d">\n',
    w, y, w, y) .. table.concat(parts) .. "</svg>\n"
end

--- tf.plot.sweep(path, rows, opts) -> path: what a sweep experiment draws,
-- one chart per column of opts.y (a list) against opts.x, series by
-- opts.series (those of its columns that vary), into an .svg or .html file.
-- opts.x may be a list: the first column that takes several values is
-- used (else the first). opts.title heads the page and each chart.
function M.sweep(path, rows, opts)
  if type(path) ~= "string" then error("tf.plot.sweep: the first argument is a file path, got " .. kind_of(path), 2) end
  if type(rows) ~= "table" then
    error("tf.plot.sweep: the second argument is a list of rows, got " .. kind_of(rows), 2)
  end
  if type(opts) ~= "table" or type(opts.y) ~= "table" or opts.x == nil then
    error("tf.plot.sweep: the third argument is a table {x = column(s), y = {columns}, ...}, got " .. kind_of(opts), 2)
  end
  check.keys(opts, "tf.plot.sweep", { "x", "y", "series", "title", "notes" })
  local x = opts.x
  if type(x) == "table" then
    local chosen = varying(rows, x)[1]
    x = chosen or x[1]
  end
  local charts = {}
  for _, y in ipairs(opts.y) do
    charts[#charts + 1] = { rows = rows, x = x, y = y, series = opts.series,
      title = (opts.title and opts.title .. ": " or "") .. units.label(y) }
  end
  local notes = opts.notes
  if not notes then
    local tf = require "tf"
    notes = { string.format("tfhost %s (%s), %s", tf.version, tf.commit, tf.device()),
      "command: " .. table.concat(require("tf.results").command() or {}, " ") }
  end
  return M.write(path, charts, { title = opts.title, notes = notes })
end

--- tf.plot.write(path, charts [, opts]) -> path: one chart (a spec or SVG
-- text) or a list of them, as an .svg file (several are stacked) or an
-- .html page (opts.title and opts.notes head it).
function M.write(path, charts, opts)
  if type(path) ~= "string" then error("tf.plot.write: expects a file path, got " .. kind_of(path), 2) end
  if type(charts) == "string" or (type(charts) == "table" and charts.rows) then charts = { charts } end
  if type(charts) ~= "table" or #charts == 0 then error("tf.plot.write: expects one or more charts", 2) end
  local text
  if path:match("%.html?$") then
    text = M.page(charts, opts)
  elseif path:match("%.svg$") then
    local svgs = {}
    for i, c in ipairs(charts) do svgs[i] = render(c) end
    text = stack(svgs)
  else
    error("tf.plot.write: " .. path .. ": the name must end in .svg or .html", 2)
  end
  write_file(path, "tf.plot.write", text)
  return path
end

return M
