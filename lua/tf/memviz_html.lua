--- tf.memviz_html: a memory snapshot (tf.mem.snapshot()) as one
-- self-contained HTML page, the active memory timeline; scripts call it as
-- memviz.html(snapshot [, opts]) or tf.mem.plot (lua/tf/memviz.lua documents
-- the options).
local Page = {}

local memviz = require "tf.memviz"
local trace_of = memviz._trace
local replay, peak_of, int, UNITS = trace_of.replay, trace_of.peak_of, trace_of.int, trace_of.units
local label_of, format_bytes, text = memviz.label, memviz.format_bytes, memviz.text

local concat = table.concat
local floor = math.floor

local TAG_INDEX = {}
for i, t in ipairs(memviz.tags) do TAG_INDEX[t] = i end
local function class_of(rec) return TAG_INDEX[rec.tag] or #memviz.tags end

-- Three shades per tag, so neighbouring allocations stay apart.
local SHADES = {}
for i, tag in ipairs(memviz.tags) do
  local hex = memviz.colors[tag]
  local rgb = { tonumber(hex:sub(2, 3), 16), tonumber(hex:sub(4, 5), 16), tonumber(hex:sub(6, 7), 16) }
  local function mix(toward, f)
    return string.format("#%02x%02x%02x", floor(rgb[1] + (toward - rgb[1]) * f + 0.5),
      floor(rgb[2] + (toward - rgb[2]) * f + 0.5), floor(rgb[3] + (toward - rgb[3]) * f + 0.5))
  end
  SHADES[i] = { hex, mix(255, 0.22), mix(0, 0.14) }
end

local function esc(s)
  return (tostring(s):gsub("[&<>\"']", { ["&"] = "&amp;", ["<"] = "&lt;", [">"] = "&gt;", ['"'] = "&quot;",
    ["'"] = "&#39;" }))
end

-- A tick step near span/count: 1, 2, 2.5 or 5 times a power of ten.
local function nice_step(span, count)
  local raw = span / count
  local p = 10 ^ floor(math.log(raw, 10))
  for _, m in ipairs({ 1, 2, 2.5, 5, 10 }) do
    if m * p >= raw then return m * p end
  end
  return 10 * p
end

local W, H = 1200, 720
local PX0, PX1, PY0, PY1 = 90, 990, 70, 650 -- the plot area
local PW, PH = PX1 - PX0, PY1 - PY0

local function tooltip(el, first, last)
  local rec = el.rec
  local what = "not recorded"
  if label_of(rec) then
    what = tostring(rec.tag or "untagged")
    if rec.what ~= nil then what = what .. ": " .. tostring(rec.what) end
  end
  local lines = { format_bytes(el.size) .. " (" .. tostring(el.size) .. " bytes)  " .. what }
  if rec.source then lines[#lines + 1] = "at " .. tostring(rec.source) end
  if type(rec.ranges) == "table" and #rec.ranges > 0 then
    local parts = {}
    for i = 1, #rec.ranges do parts[i] = tostring(rec.ranges[i]) end
    lines[#lines + 1] = "in " .. concat(parts, " > ")
  end
  if first then lines[#lines + 1] = first end
  if last then lines[#lines + 1] = last end
  return esc(text(concat(lines, "\n")))
end

local function fmt1(v) return string.format("%.1f", v) end

-- The y axis, its grid and the legend (shared by both pictures).
local function frame_parts(out, ymax, opts, subtitle)
  local title = opts.title or "tfhost memory"
  out[#out + 1] = string.format('<text x="%d" y="28" font-size="20" font-weight="bold" id="title">%s</text>',
    PX0, esc(text(title)))
  out[#out + 1] = string.format('<text x="%d" y="50" font-size="13" fill="#555" id="subtitle">%s</text>', PX0,
    esc(text(subtitle)))
  out[#out + 1] = string.format('<rect x="%d" y="%d" width="%d" height="%d" fill="#fbfbfb" stroke="#bbb"/>',
    PX0, PY0, PW, PH)
  local unit, scale = "B", 1
  for _, u in ipairs(UNITS) do
    if ymax >= u[2] then
      unit, scale = u[1], u[2]
      break
    end
  end
  local step = nice_step(ymax / scale, 6)
  local v = 0
  while v * scale <= ymax + 1e-9 do
    local y = PY1 - v * scale / ymax * PH
    out[#out + 1] = string.format('<line x1="%d" x2="%d" y1="%s" y2="%s" stroke="#e4e4e4"/>', PX0, PX1, fmt1(y),
      fmt1(y))
    out[#out + 1] = string.format('<text class="ytick" x="%d" y="%s" text-anchor="end">%s %s</text>', PX0 - 6,
      fmt1(y + 4), string.format("%g", v), unit)
    v = v + step
  end
  out[#out + 1] = string.format(
    '<text x="20" y="%d" transform="rotate(-90 20 %d)" text-anchor="middle" fill="#444">bytes allocated</text>',
    (PY0 + PY1) // 2, (PY0 + PY1) // 2)
  local lx, ly = PX1 + 18, PY0 + 4
  out[#out + 1] = string.format('<g id="legend"><text x="%d" y="%d" font-weight="bold">tag</text>', lx, ly + 8)
  for i, tag in ipairs(memviz.tags) do
    local y = ly + 8 + i * 22
    out[#out + 1] = string.format(
      '<g class="legend-item" data-tag="%s"><rect x="%d" y="%d" width="14" height="14" fill="%s"/>' ..
      '<text x="%d" y="%d">%s</text></g>', esc(tag), lx, y - 11, memviz.colors[tag], lx + 20, y, esc(tag))
  end
  local y = ly + 8 + (#memviz.tags + 1) * 22
  out[#out + 1] = string.format('<rect x="%d" y="%d" width="14" height="14" fill="%s" fill-opacity="0.45"/>' ..
    '<text x="%d" y="%d">small allocations,</text><text x="%d" y="%d">merged per tag</text></g>', lx, y - 11,
    memviz.colors.other, lx + 20, y, lx + 20, y + 15)
end

local SCRIPT = [[
(function () {
  var svg = document.getElementById('plot'), out = document.getElementById('readout');
  var X0 = %d, X1 = %d, Y0 = %d, Y1 = %d, W = %d, H = %d, XMAX = %s, YMAX = %s, XUNIT = '%s';
  function bytes(b) {
    var u = ['B', 'KiB', 'MiB', 'GiB', 'TiB'], i = 0;
    while (Math.abs(b) >= 1024 && i < u.length - 1) { b /= 1024; i++; }
    return (i ? b.toFixed(2) : Math.round(b)) + ' ' + u[i];
  }
  svg.addEventListener('mousemove', function (ev) {
    var r = svg.getBoundingClientRect();
    var sx = (ev.clientX - r.left) * W / r.width, sy = (ev.clientY - r.top) * H / r.height;
    if (sx < X0 || sx > X1 || sy < Y0 || sy > Y1) { out.textContent = ''; return; }
    var x = (sx - X0) / (X1 - X0) * XMAX, y = (Y1 - sy) / (Y1 - Y0) * YMAX;
    out.textContent = XUNIT + ' ' + x.toFixed(XUNIT === 'ms' ? 2 : 0) + ', ' + bytes(y);
  });
})();
document.body.dataset.status = 'drawn';
]]

local function page(title, svg_parts, xmax, ymax, xunit)
  local head = '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8"><title>' .. esc(text(title)) ..
    '</title>\n<style>body{font-family:sans-serif;margin:8px;color:#222;background:#fff}' ..
    '#errors{color:#b00020;white-space:pre-wrap;margin:0}#errors:empty{display:none}' ..
    'svg{display:block;width:100%;max-width:1200px;height:auto}' ..
    '.alloc:hover,.band:hover{stroke:#000;stroke-width:1}#readout{font:12px monospace;min-height:1.3em}</style>\n' ..
    '<script>window.onerror=function(msg,src,line){var e=document.getElementById("errors");' ..
    'if(e){e.textContent+=String(msg)+" (line "+line+")\\n";}};</script>\n</head><body>\n<pre id="errors"></pre>\n' ..
    string.format('<svg xmlns="http://www.w3.org/2000/svg" id="plot" viewBox="0 0 %d %d" font-family="sans-serif" ' ..
      'font-size="12">\n', W, H)
  local tail = '\n</svg>\n<div id="readout"></div>\n<script>\n' ..
    string.format(SCRIPT, PX0, PX1, PY0, PY1, W, H, string.format("%.17g", xmax), string.format("%.17g", ymax),
      xunit) .. '</script>\n</body></html>\n'
  return head .. concat(svg_parts, "\n") .. tail
end

-- Where nothing was traced: the live blocks of the segments as one bar.
local function bar_page(snapshot, opts)
  local blocks, total = {}, 0
  for _, seg in ipairs(snapshot.segments or {}) do
    for _, b in ipairs(seg.blocks or {}) do
      if b.state == "active_allocated" then
        local size = int(b.size, 0)
        blocks[#blocks + 1] = { size = size, rec = b }
        total = total + size
      end
    end
  end
  local ymax = total > 0 and total * 1.08 or 1024
  local out = {}
  local device = tostring(snapshot.device or "?")
  frame_parts(out, ymax, opts, string.format("%s · no allocation trace · %d live blocks, %s", device, #blocks,
    format_bytes(total)))
  local bx0, bx1 = PX0 + PW * 0.3, PX0 + PW * 0.7
  local min_bytes = ymax / PH
  local base, small = 0, {}
  for i = 1, #memviz.tags do small[i] = 0 end
  for i, el in ipairs(blocks) do
    if el.size >= min_bytes then
      local ci = class_of(el.rec)
      local y0, y1 = PY1 - (base + el.size) / ymax * PH, PY1 - base / ymax * PH
      out[#out + 1] = string.format('<rect class="alloc" x="%s" y="%s" width="%s" height="%s" fill="%s">' ..
        '<title>%s</title></rect>', fmt1(bx0), fmt1(y0), fmt1(bx1 - bx0), fmt1(y1 - y0), SHADES[ci][i % 3 + 1],
        tooltip(el, string.format("address 0x%x", int(el.rec.address, 0))))
      base = base + el.size
    else
      local ci = class_of(el.rec)
      small[ci] = small[ci] + el.size
    end
  end
  for ci, tag in ipairs(memviz.tags) do
    if small[ci] > 0 then
      local y0, y1 = PY1 - (base + small[ci]) / ymax * PH, PY1 - base / ymax * PH
      out[#out + 1] = string.format('<rect class="band small" data-tag="%s" x="%s" y="%s" width="%s" height="%s" ' ..
        'fill="%s" fill-opacity="0.45"><title>%s of small %s allocations</title></rect>', esc(tag), fmt1(bx0),
        fmt1(y0), fmt1(bx1 - bx0), fmt1(math.max(y1 - y0, 0.5)), memviz.colors[tag], format_bytes(small[ci]), esc(tag))
      base = base + small[ci]
    end
  end
  local y_total = PY1 - total / ymax * PH
  out[#out + 1] = string.format('<line class="peak" x1="%d" x2="%d" y1="%s" y2="%s" stroke="#222" ' ..
    'stroke-dasharray="6 4"/>', PX0, PX1, fmt1(y_total), fmt1(y_total))
  out[#out + 1] = string.format('<text id="peak-label" data-bytes="%d" x="%d" y="%s" text-anchor="end" ' ..
    'font-weight="bold">live %s at the snapshot</text>', total, PX1 - 6, fmt1(y_total - 6), format_bytes(total))
  out[#out + 1] = string.format('<text id="note" x="%d" y="%d" text-anchor="middle" fill="#444">No allocation ' ..
    'events were recorded: the bar shows the %d blocks live when the snapshot was taken.</text>',
    (PX0 + PX1) // 2, PY1 + 30, #blocks)
  return page(opts.title or "tfhost memory", out, 1, ymax, "snapshot")
end

function Page.html(snapshot, opts)
  opts = opts or {}
  local r = replay(snapshot)
  if r.steps == 0 then return bar_page(snapshot, opts) end
  local steps, act, is_alloc = r.steps, r.act, r.is_alloc
  local peak, peak_step = peak_of(r, class_of)
  local ymax = peak > 0 and peak * 1.08 or 1024

  -- x of a trace event (0: the start): its index in the trace, or its time
  local trace = snapshot.trace
  local ntrace = #trace
  local xmax, xunit = ntrace, "event"
  local x_of_event = function(i) return PX0 + i / ntrace * PW end
  if opts.x == "time" then
    local t0 = trace[r.trace_index[1]].time_us or 0
    local t1 = trace[r.trace_index[steps]].time_us or 0
    if t1 > t0 then
      x_of_event = function(i)
        local t = i > 0 and trace[i].time_us or t0
        return PX0 + math.min(math.max(t - t0, 0), t1 - t0) / (t1 - t0) * PW
      end
      xmax, xunit = (t1 - t0) / 1000, "ms"
    end
  end
  local trace_index = r.trace_index
  local function xof(k) return x_of_event(k > 0 and trace_index[k] or 0) end

  -- Which allocations get their own band: at least a pixel high, and the
  -- largest max_bands of those (found through a power-of-two histogram).
  local all = {}
  for _, el in ipairs(r.initial) do all[#all + 1] = el end
  for k = 1, steps do
    if is_alloc[k] then all[#all + 1] = act[k] end
  end
  local min_bytes = ymax / PH
  local max_bands = opts.max_bands or 4000
  local hist, candidates = {}, 0
  local log = math.log
  for _, el in ipairs(all) do
    if el.size >= min_bytes then
      candidates = candidates + 1
      local b = floor(log(el.size, 2))
      hist[b] = (hist[b] or 0) + 1
    end
  end
  if candidates > max_bands then
    local count, b = 0, 63
    while b > 0 and count + (hist[b] or 0) <= max_bands do
      count = count + (hist[b] or 0)
      b = b - 1
    end
    -- bucket b overflows: of its sizes, the largest (max_bands - count) fit
    local sizes = {}
    for _, el in ipairs(all) do
      if el.size >= min_bytes and floor(log(el.size, 2)) == b then sizes[#sizes + 1] = el.size end
    end
    table.sort(sizes)
    local keep = max_bands - count
    local cut = sizes[#sizes - keep + 1]
    if keep == 0 then
      cut = sizes[#sizes] + 0.5
    elseif sizes[#sizes - keep] == cut then
      cut = cut + 0.5 -- a tie across the cut merges whole
    end
    min_bytes = math.max(min_bytes, cut)
  end
  local ndrawn = 0
  for _, el in ipairs(all) do
    el.drawn = el.size >= min_bytes
    if el.drawn then ndrawn = ndrawn + 1 end
    el.class = class_of(el.rec)
  end

  -- Sweep the steps: drawn allocations keep a stack (allocation order) and a
  -- bottom edge of (x, base) points, at most two per column of colw pixels;
  -- the merged small allocations keep one profile per column, at the step of
  -- the column's highest total.
  local ntags = #memviz.tags
  local function sweep(colw)
    local stack, top, drawn_total, small_sum = {}, 0, 0, 0
    local small = {}
    for ci = 1, ntags do small[ci] = 0 end
    local drawn, points = {}, 0
    local function column(px) return (px - PX0) // colw end
    local function push(el, px)
      top = top + 1
      stack[top] = el
      el.base, el.pts, el.np = drawn_total, { px, drawn_total }, 2
      drawn_total = drawn_total + el.size
      drawn[#drawn + 1] = el
    end
    local function lower(el, px, old, new)
      local p, n = el.pts, el.np
      if n > 2 and column(p[n - 1]) == column(px) then
        p[n] = new
      else
        p[n + 1], p[n + 2], p[n + 3], p[n + 4] = px, old, px, new
        el.np = n + 4
      end
    end
    local function close(el, px)
      local p, n = el.pts, el.np
      if px < p[1] + 0.8 then px = p[1] + 0.8 end
      p[n + 1], p[n + 2] = px, el.base
      el.np = n + 2
      points = points + el.np
    end
    local function remove(el, px)
      if not el.drawn then
        small[el.class] = small[el.class] - el.size
        small_sum = small_sum - el.size
        return
      end
      local i = top
      while i > 0 and stack[i] ~= el do i = i - 1 end
      if i == 0 then return end
      close(el, px)
      for j = i + 1, top do
        local above = stack[j]
        local old = above.base
        above.base = old - el.size
        lower(above, px, old, above.base)
        stack[j - 1] = above
      end
      stack[top] = nil
      top = top - 1
      drawn_total = drawn_total - el.size
    end
    local function add(el, px)
      if el.drawn then
        push(el, px)
      else
        small[el.class] = small[el.class] + el.size
        small_sum = small_sum + el.size
      end
    end
    local profile, cur = {}, nil
    local function record(px)
      local c, total = column(px), drawn_total + small_sum
      if cur and cur.col == c then
        if total <= cur.total then return end
      else
        if cur then cur.x1 = px end
        cur = { col = c, x0 = px }
        profile[#profile + 1] = cur
      end
      cur.total, cur.drawn = total, drawn_total
      for ci = 1, ntags do cur[ci] = small[ci] end
    end
    local x = xof(0)
    for _, el in ipairs(r.initial) do add(el, x) end
    record(x)
    for k = 1, steps do
      local el = act[k]
      x = xof(k)
      if is_alloc[k] then
        if el.replaces then remove(el.replaces, x) end
        add(el, x)
      else
        remove(el, x)
      end
      record(x)
    end
    cur.x1 = PX1
    for j = 1, top do close(stack[j], PX1) end
    return drawn, profile, points
  end
  local colw, drawn, profile, points = 1, nil, nil, nil
  repeat
    drawn, profile, points = sweep(colw)
    colw = colw * 2
  until points <= (opts.max_points or 400000) or colw > 64

  local function yof(b) return PY1 - b / ymax * PH end
  local out = {}
  local device = tostring(snapshot.device or "?")
  frame_parts(out, ymax, opts, string.format("%s · %d events · %d allocations: %d drawn, %d merged · peak %s",
    device, #trace, #all, ndrawn, #all - ndrawn, format_bytes(peak)))
  -- x axis
  local xstep = nice_step(xmax, 8)
  if xunit == "event" then xstep = math.max(1, floor(xstep)) end
  local v = 0
  while v <= xmax + 1e-9 do
    local px = PX0 + v / xmax * PW
    out[#out + 1] = string.format('<line x1="%s" x2="%s" y1="%d" y2="%d" stroke="#888"/><text class="xtick" ' ..
      'x="%s" y="%d" text-anchor="middle">%g</text>', fmt1(px), fmt1(px), PY1, PY1 + 5, fmt1(px), PY1 + 18, v)
    v = v + xstep
  end
  out[#out + 1] = string.format('<text x="%d" y="%d" text-anchor="middle" fill="#444">%s</text>',
    (PX0 + PX1) // 2, PY1 + 38, xunit == "ms" and "time (ms)" or "trace event")

  -- the allocations, then the merged small ones on top
  out[#out + 1] = '<g id="allocations" stroke="#fff" stroke-width="0.3" stroke-opacity="0.7">'
  local strf = string.format
  for i, el in ipairs(drawn) do
    local p, n, size = el.pts, el.np, el.size
    local coords = {}
    for j = 1, n, 2 do coords[#coords + 1] = strf("%.1f,%.1f", p[j], yof(p[j + 1])) end
    for j = n - 1, 1, -2 do coords[#coords + 1] = strf("%.1f,%.1f", p[j], yof(p[j + 1] + size)) end
    local first = el.initial and "live before the trace began"
      or strf("allocated at event %d", trace_index[el.start])
    local last = el.stop and strf("freed at event %d", trace_index[el.stop]) or "still live at the snapshot"
    out[#out + 1] = strf('<polygon class="alloc" fill="%s" points="%s"><title>%s</title></polygon>',
      SHADES[el.class][i % 3 + 1], concat(coords, " "), tooltip(el, first, last))
  end
  out[#out + 1] = '</g>'
  for ci, tag in ipairs(memviz.tags) do
    local any, most = false, 0
    for _, s in ipairs(profile) do
      if s[ci] > 0 then any = true end
      if s[ci] > most then most = s[ci] end
    end
    if any then
      local lo, hi = {}, {}
      for j, s in ipairs(profile) do
        local bottom = s.drawn
        for cj = 1, ci - 1 do bottom = bottom + s[cj] end
        lo[#lo + 1] = strf("%.1f,%.1f %.1f,%.1f", s.x0, yof(bottom), s.x1, yof(bottom))
        hi[#profile - j + 1] = strf("%.1f,%.1f %.1f,%.1f", s.x1, yof(bottom + s[ci]), s.x0, yof(bottom + s[ci]))
      end
      out[#out + 1] = strf('<polygon class="band small" data-tag="%s" fill="%s" fill-opacity="0.45" ' ..
        'points="%s %s"><title>small %s allocations (each under a pixel high), up to %s</title></polygon>',
        esc(tag), memviz.colors[tag], concat(lo, " "), concat(hi, " "), esc(tag), format_bytes(most))
    end
  end

  -- out-of-memory events and the peak
  for _, o in ipairs(r.ooms) do
    local px = x_of_event(o.index)
    out[#out + 1] = strf('<line class="oom" x1="%s" x2="%s" y1="%d" y2="%d" stroke="#b00020" stroke-width="2">' ..
      '<title>out of memory: %s requested, %s free on the device</title></line>', fmt1(px), fmt1(px), PY0, PY1,
      format_bytes(int(o.rec.size, 0)), format_bytes(int(o.rec.device_free, 0)))
  end
  local ppx, ppy = xof(peak_step), yof(peak)
  out[#out + 1] = strf('<line class="peak" x1="%d" x2="%d" y1="%s" y2="%s" stroke="#222" stroke-dasharray="6 4"/>',
    PX0, PX1, fmt1(ppy), fmt1(ppy))
  out[#out + 1] = strf('<line x1="%s" x2="%s" y1="%s" y2="%d" stroke="#222" stroke-dasharray="2 3"/>', fmt1(ppx),
    fmt1(ppx), fmt1(ppy), PY1)
  local peak_index = peak_step > 0 and trace_index[peak_step] or 0
  local anchor, lx = "end", PX1 - 6
  if ppx < PX0 + PW * 0.5 then anchor, lx = "start", ppx + 6 end
  out[#out + 1] = strf('<text id="peak-label" data-bytes="%d" x="%s" y="%s" text-anchor="%s" font-weight="bold" ' ..
    'paint-order="stroke" stroke="#fff" stroke-width="3">peak %s (event %d)</text>', peak, fmt1(lx), fmt1(ppy - 6),
    anchor, format_bytes(peak), peak_index)
  return page(opts.title or "tfhost memory", out, xmax, ymax, xunit)
end

return Page
