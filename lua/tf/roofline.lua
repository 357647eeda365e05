--- tf.roofline: counted kernels (the rows of p:kernels{} under tf.prof.start{metrics = "roofline"})
-- against the device's ceilings (tf.ceilings.get, p.ceilings): a table of where each stands and a
-- log-log roofline picture, SVG or HTML, through tf.plot's writer.
--
--   local p <close> = tf.prof.start{metrics = "roofline"}
--   m:step(ids, targets); p:stop()
--   tf.report.table(tf.roofline.table(p), {columns = tf.roofline.columns})
--   tf.roofline.plot(p, {path = "roofline.svg", title = "one training step"})
--
-- A row's intensity is its FLOPs over its DRAM bytes (read and written); the roof at intensity I
-- is min(ceiling, copy rate x I), the ridge point the intensity where the two meet. A row is
-- compute-bound to the right of the ridge of its precision's ceiling, memory-bound to the left.
local check = require "tf.check"
local plot = require "tf.plot"

local M = {}

--- The compute ceilings, in the order the picture draws and the messages list them.
M.compute = { "fp8", "bf16", "tf32", "f32" }

--- Which ceiling a precision of flops_by runs against (f16 at bf16's tensor rate; f64 at none).
M.ceiling_of = { fp8 = "fp8", bf16 = "bf16", f16 = "bf16", tf32 = "tf32", f32 = "f32" }

--- The columns of tf.roofline.table's rows, for tf.report.table.
M.columns = { "name", "class", { "pct", "% time", "%.1f" }, { "tflops", "TFLOP/s", "%.2f" }, { "gbs", "GB/s", "%.0f" },
  { "intensity", "FLOP/byte", "%.3g" }, { "roof_share", "of roof", "%.2f" }, "bound" }

-- Kernel classes in tf.prof's order, so that a class has the same colour in every picture.
local CLASS_ORDER = { "gemm", "attention", "softmax", "norm", "elementwise", "reduction", "optimizer", "copy",
  "memset", "other" }

local kind_of = check.kind
local function positive(v) return math.type(v) ~= nil and v == v and v > 0 and v < math.huge end

-- The ceilings as given, checked: copy and at least one compute ceiling, positive numbers.
local function checked_ceilings(c, fname)
  if type(c) ~= "table" then
    error(fname .. ": no ceilings: pass opts.ceilings (tf.ceilings.get(device)) or a profile that has them " ..
      "(tf.prof.start{metrics = \"roofline\"}), got " .. kind_of(c), 3)
  end
  local any = false
  for _, k in ipairs(M.compute) do
    if c[k] ~= nil and not positive(c[k]) then
      error(string.format("%s: ceilings.%s must be a positive number (TFLOP/s), not %s", fname, k, tostring(c[k])), 3)
    end
    any = any or c[k] ~= nil
  end
  if not positive(c.copy) or not any then
    error(fname .. ": the ceilings need copy (GB/s) and at least one of " .. table.concat(M.compute, ", ") ..
      " (TFLOP/s)", 3)
  end
  return c
end

-- rows_or_profile as rows and the ceilings that go with them.
local function input(x, opts, fname)
  check.choice(opts.by, fname, "by", { "name", "class", "range" })
  local rows, ceilings = x, opts.ceilings
  local mt = getmetatable(x)
  local is_profile = type(x) == "userdata" or (type(mt) == "table" and mt.__name == "tf.Profile")
  if is_profile then
    rows = x:kernels{ by = opts.by or "class", range = opts.range }
    if ceilings == nil then ceilings = x.ceilings end
  else
    if type(x) ~= "table" then
      error(fname .. ": expects rows (p:kernels{...}) or a profile (tf.prof.start), got " .. kind_of(x), 3)
    end
    if opts.by ~= nil or opts.range ~= nil then
      error(fname .. ": by and range choose a profile's rows; these are rows already", 3)
    end
    for i, r in ipairs(x) do
      if type(r) ~= "table" then error(string.format("%s: rows[%d] is a %s, not a row", fname, i, type(r)), 3) end
    end
  end
  return rows, ceilings
end

-- The ceiling a row runs against: its precision with the most FLOPs (flops_by), else the highest.
local function ceiling_for(r, c)
  local best, most = nil, 0
  if type(r.flops_by) == "table" then
    for prec, n in pairs(r.flops_by) do
      local k = M.ceiling_of[prec]
      if k == "fp8" and not c.fp8 then k = "bf16" end
      if type(n) == "number" and n > most and k and c[k] then best, most = k, n end
    end
  end
  if best then return best end
  local top
  for _, k in ipairs(M.compute) do
    if c[k] and (not top or c[k] > c[top]) then top = k end
  end
  return top
end

-- What a row says about itself in roofline terms: {flops, bytes, tflops, gbs, intensity}, from its
-- fields, computed from flops, DRAM bytes and total_ms where the row lacks them; nil values where
-- it has no counts.
local function measures(r)
  local bytes = r.dram_bytes
  if bytes == nil and r.dram_read and r.dram_write then bytes = r.dram_read + r.dram_write end
  local seconds = positive(r.total_ms) and r.total_ms * 1e-3 or nil
  local m = { flops = r.flops, bytes = bytes, tflops = r.tflops, gbs = r.gbs, intensity = r.intensity }
  if m.tflops == nil and positive(m.flops) and seconds then m.tflops = m.flops / seconds / 1e12 end
  if m.gbs == nil and positive(bytes) and seconds then m.gbs = bytes / seconds / 1e9 end
  if m.intensity == nil and positive(m.flops) and positive(bytes) then m.intensity = m.flops / bytes end
  return m
end

-- The roof (TFLOP/s) at intensity for a ceiling of c, and that ceiling's ridge point (FLOP/byte).
local function roof(c, key, intensity) return math.min(c[key], c.copy * intensity / 1e3) end
local function ridge(c, key) return c[key] * 1e3 / c.copy end

--- tf.roofline.table(rows_or_profile [, opts]) -> rows {name, class, pct, tflops, gbs, intensity,
-- roof_share, bound} for tf.report.table (columns: tf.roofline.columns). opts: ceilings (default:
-- the profile's), by and range (a profile's p:kernels{} filter; by "class" by default). bound is
-- "compute" or "memory" by the side of the ridge point of the row's precision; nil where the row
-- has no counts or there are no ceilings.
function M.table(x, opts)
  local fname = "tf.roofline.table"
  opts = check.keys(opts, fname, { "ceilings", "by", "range" })
  local rows, c = input(x, opts, fname)
  if c ~= nil then c = checked_ceilings(c, fname) end
  local out = {}
  for _, r in ipairs(rows) do
    local m = measures(r)
    local row = { name = r.name, class = r.class, pct = r.pct, tflops = m.tflops, gbs = m.gbs,
      intensity = m.intensity, roof_share = r.roof_share }
    if c and positive(m.intensity) then
      local key = ceiling_for(r, c)
      row.ceiling = key
      row.bound = m.intensity >= ridge(c, key) and "compute" or "memory"
      if row.roof_share == nil and positive(m.tflops) then row.roof_share = m.tflops / roof(c, key, m.intensity) end
    end
    out[#out + 1] = row
  end
  return out
end

local function fmt_rate(v) return string.format(v >= 100 and "%.0f" or "%.3g", v) end

-- Text lines of at most width characters from words joined by ", ".
local function wrap(head, items, width)
  local lines, line = {}, head
  for i, item in ipairs(items) do
    local piece = item .. (i < #items and "," or "")
    if #line + 1 + #piece > width and line ~= "" then
      lines[#lines + 1] = line
      line = "  " .. piece
    else
      line = (line == "" and "" or line .. " ") .. piece
    end
  end
  lines[#lines + 1] = line
  return lines
end

local function short(name, n)
  name = tostring(name)
  if utf8.len(name) and utf8.len(name) > n then return name:sub(1, utf8.offset(name, n - 1) - 1) .. "…" end
  return name
end

--- tf.roofline.plot(rows_or_profile [, opts]) -> the SVG text (and writes it to opts.path, .svg or
-- .html). opts: path, title, ceilings (default: the profile's), by ("class", or "name", "range":
-- a profile's rows), range (a profile's p:kernels{range = ...}), width, height. Each counted row is
-- a point at (intensity, TFLOP/s) whose area is its share of the time (pct), coloured by class;
-- each ceiling a horizontal line capped by the copy rate's diagonal; rows without FLOP or byte
-- counts are listed under the picture.
function M.plot(x, opts)
  local fname = "tf.roofline.plot"
  if opts ~= nil and type(opts) ~= "table" then error(fname .. ": opts must be a table, got " .. type(opts), 2) end
  opts = check.keys(opts, fname, { "path", "title", "ceilings", "by", "range", "width", "height" })
  check.arg(opts.path, fname, "path", "string", true)
  check.arg(opts.title, fname, "title", "string", true)
  if opts.path and not (opts.path:match("%.svg$") or opts.path:match("%.html?$")) then
    error(fname .. ": " .. opts.path .. ": the name must end in .svg or .html", 2)
  end
  local rows, c = input(x, opts, fname)
  c = checked_ceilings(c, fname)
  local esc = plot._escape

  -- the rows that can be placed, and those that cannot
  local points, left_out = {}, {}
  for _, r in ipairs(rows) do
    local m = measures(r)
    local label = tostring(r.name or r.class or "?")
    if positive(m.intensity) and positive(m.tflops) then
      points[#points + 1] = { row = r, label = label, class = r.class or "(no class)", x = m.intensity, y = m.tflops,
        pct = positive(r.pct) and r.pct or 0 }
    else
      left_out[#left_out + 1] = label
    end
  end
  local ceilings = {}
  for _, k in ipairs(M.compute) do
    if c[k] then ceilings[#ceilings + 1] = { key = k, tflops = c[k], ridge = ridge(c, k) } end
  end
  table.sort(ceilings, function(a, b) return a.tflops > b.tflops end)
  local top = ceilings[1]

  -- the axes: every point and every ridge inside, a decade's room around
  local xlo, xhi, ylo = math.huge, 0, math.huge
  for _, p in ipairs(points) do
    xlo, xhi, ylo = math.min(xlo, p.x), math.max(xhi, p.x), math.min(ylo, p.y)
  end
  for _, k in ipairs(ceilings) do xlo, xhi = math.min(xlo, k.ridge), math.max(xhi, k.ridge) end
  xlo, xhi = xlo / 4, xhi * 4
  ylo = math.max(math.min(ylo / 2, c.copy * xlo / 1e3), top.tflops * 1e-6)
  local xs, ys = plot._log_scale(xlo, xhi), plot._log_scale(ylo, top.tflops * 2)

  local classes, color_of = {}, {}
  for _, p in ipairs(points) do
    if not color_of[p.class] then classes[#classes + 1] = p.class color_of[p.class] = true end
  end
  local rank = {}
  for i, k in ipairs(CLASS_ORDER) do rank[k] = i end
  table.sort(classes, function(a, b)
    local ra, rb = rank[a] or #CLASS_ORDER + 1, rank[b] or #CLASS_ORDER + 1
    if ra ~= rb then return ra < rb end
    return a < b
  end)
  for _, k in ipairs(classes) do
    local i = rank[k] or (#CLASS_ORDER + 1)
    color_of[k] = plot.palette[(i - 1) % #plot.palette + 1]
  end

  local W, H = opts.width or 760, opts.height or 480
  local note_lines = #left_out > 0 and wrap("not plotted (no FLOP or DRAM byte counts):", left_out, (W - 40) // 7) or {}
  local left, right, top_m, bottom = 72, 170, 44, 56
  local pw, ph = W - left - right, H - top_m - bottom
  H = H + 16 * #note_lines
  local function px(v) return left + xs.map(v) * pw end
  local function py(v) return top_m + ph - ys.map(v) * ph end

  local out = {}
  local function add(f, ...) out[#out + 1] = string.format(f, ...) end
  add('<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" ' ..
    'font-family="DejaVu Sans, Arial, sans-serif" font-size="12" class="tf-plot tf-roofline">', W, H, W, H)
  add('<rect width="%d" height="%d" fill="#ffffff"/>', W, H)
  add('<text x="%d" y="24" font-size="15" font-weight="bold" text-anchor="middle" class="title">%s</text>',
    left + pw // 2, esc(opts.title or "Roofline"))
  add('<defs><clipPath id="tf-roofline-area"><rect x="%d" y="%d" width="%d" height="%d"/></clipPath></defs>', left,
    top_m, pw, ph)
  add('<rect class="plot-area" x="%d" y="%d" width="%d" height="%d" fill="#ffffff" stroke="#999999"/>', left, top_m,
    pw, ph)
  for _, t in ipairs(ys.ticks) do
    local y = py(t)
    add('<line x1="%d" y1="%.1f" x2="%d" y2="%.1f" stroke="#ececec"/>', left, y, left + pw, y)
    add('<text x="%d" y="%.1f" text-anchor="end" dominant-baseline="middle" fill="#333333">%s</text>', left - 6, y,
      esc(plot.tick_text(t)))
  end
  for _, t in ipairs(xs.ticks) do
    local x = px(t)
    add('<line x1="%.1f" y1="%d" x2="%.1f" y2="%d" stroke="#ececec"/>', x, top_m, x, top_m + ph)
    add('<text x="%.1f" y="%d" text-anchor="middle" fill="#333333">%s</text>', x, top_m + ph + 16, esc(plot.tick_text(t)))
  end
  add('<text x="%d" y="%d" text-anchor="middle" class="xlabel">%s</text>', left + pw // 2, top_m + ph + 40,
    "arithmetic intensity (FLOP/byte of DRAM traffic), log scale")
  add('<text transform="translate(18 %d) rotate(-90)" text-anchor="middle" class="ylabel">%s</text>', top_m + ph // 2,
    "achieved TFLOP/s, log scale")

  -- the roofs: the copy rate's diagonal up to the highest ridge, each ceiling from its own ridge on
  add('<g class="roofs" clip-path="url(#tf-roofline-area)">')
  local x0 = xs.lo
  add('<line class="roof-memory" data-gbs="%.6g" x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#333333" ' ..
    'stroke-width="2"/>', c.copy, px(x0), py(c.copy * x0 / 1e3), px(top.ridge), py(top.tflops))
  for i, k in ipairs(ceilings) do
    add('<line class="roof" data-ceiling="%s" data-tflops="%.6g" x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" ' ..
      'stroke="%s" stroke-width="2"%s/>', k.key, k.tflops, px(k.ridge), py(k.tflops), left + pw, py(k.tflops),
      i == 1 and "#333333" or "#777777", i == 1 and "" or ' stroke-dasharray="7 4"')
  end
  add('</g>')
  -- each ridge point on the diagonal, the highest one's intensity marked down to the x axis; the
  -- ceilings' names and rates in the right margin at their heights, pushed apart where close
  for _, k in ipairs(ceilings) do
    add('<g class="ridge" data-ceiling="%s" data-intensity="%.6g"><circle cx="%.1f" cy="%.1f" r="3" fill="#333333"/>' ..
      '<title>%s ridge point: %s FLOP/byte</title></g>', k.key, k.ridge, px(k.ridge), py(k.tflops), k.key,
      fmt_rate(k.ridge))
  end
  add('<line class="ridge-mark" x1="%.1f" y1="%.1f" x2="%.1f" y2="%d" stroke="#999999" stroke-dasharray="2 3"/>',
    px(top.ridge), py(top.tflops), px(top.ridge), top_m + ph)
  add('<text class="ridge-label" x="%.1f" y="%d" fill="#555555" font-size="11">ridge %s FLOP/byte</text>',
    px(top.ridge) + 4, top_m + ph - 6, fmt_rate(top.ridge))
  local label_y = -math.huge
  for _, k in ipairs(ceilings) do
    label_y = math.max(py(k.tflops), label_y + 14)
    add('<text class="roof-label" data-ceiling="%s" x="%d" y="%.1f" dominant-baseline="middle" fill="#333333">' ..
      '%s %s TFLOP/s</text>', k.key, left + pw + 8, label_y, k.key, fmt_rate(k.tflops))
  end
  do -- the diagonal's label, along it, a quarter of the way up
    local xa, ya, xb, yb = px(x0), py(c.copy * x0 / 1e3), px(top.ridge), py(top.tflops)
    local lx, ly = xa + (xb - xa) * 0.25, ya + (yb - ya) * 0.25
    add('<text class="roof-label" transform="translate(%.1f %.1f) rotate(%.1f)" fill="#333333" dy="-6">copy %s GB/s</text>',
      lx, ly, math.deg(math.atan(yb - ya, xb - xa)), fmt_rate(c.copy))
  end

  -- the rows: area proportional to the share of the time; the largest drawn first, so that small
  -- points stay visible on top of it
  table.sort(points, function(a, b)
    if a.pct ~= b.pct then return a.pct > b.pct end
    return a.label < b.label
  end)
  local RMAX = 34 -- px: the radius of a row with all of the time
  add('<g class="kernels">')
  for _, p in ipairs(points) do
    local r = math.max(2, RMAX * math.sqrt(p.pct / 100))
    local cx, cy = px(p.x), py(p.y)
    add('<circle class="kernel" data-name="%s" data-class="%s" data-pct="%.6g" data-intensity="%.6g" ' ..
      'data-tflops="%.6g" cx="%.1f" cy="%.1f" r="%.2f" fill="%s" fill-opacity="0.55" stroke="%s">' ..
      '<title>%s (%s): %.1f %% of the time, %s TFLOP/s at %s FLOP/byte</title></circle>', esc(p.label), esc(p.class),
      p.pct, p.x, p.y, cx, cy, r, color_of[p.class], color_of[p.class], esc(p.label), esc(p.class), p.pct,
      fmt_rate(p.y), fmt_rate(p.x))
    add('<text class="kernel-label" x="%.1f" y="%.1f" dominant-baseline="middle" font-size="11" fill="#222222">%s</text>',
      cx + r + 3, cy, esc(short(p.label, 28)))
  end
  add('</g>')
  if #points == 0 then
    add('<text x="%d" y="%d" text-anchor="middle" fill="#666666">no counted kernels</text>', left + pw // 2,
      top_m + ph // 2)
  end

  -- the legend, at the foot of the right margin: a colour per class, and what a point's size says
  local lx, ly = left + pw + 10, top_m + ph - 18 * #classes - 8
  add('<g class="legend">')
  for i, k in ipairs(classes) do
    local y = ly + (i - 1) * 18
    add('<circle cx="%d" cy="%d" r="6" fill="%s" fill-opacity="0.55" stroke="%s"/>', lx + 6, y, color_of[k],
      color_of[k])
    add('<text x="%d" y="%d" dominant-baseline="middle">%s</text>', lx + 18, y, esc(k))
  end
  add('<text x="%d" y="%d" font-size="11" fill="#555555">area: share of the time</text>', lx, ly + #classes * 18)
  add('</g>')
  for i, line in ipairs(note_lines) do
    add('<text class="not-plotted" x="%d" y="%d" fill="#444444">%s</text>', 16, top_m + ph + 56 + (i - 1) * 16,
      esc(line))
  end
  add('</svg>')
  local svg = table.concat(out, "\n") .. "\n"
  if opts.path then
    local notes = {}
    if c.device then
      notes[1] = string.format("ceilings of %s (%s%s)", c.device, c.source or "given",
        c.measured and ", measured " .. c.measured or "")
    end
    plot.write(opts.path, svg, { title = opts.title or "Roofline", notes = notes })
  end
  return svg
end

return M
