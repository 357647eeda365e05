-- tf.plot: the SVG it writes says what the rows say (tests/cli/test_plot_render.py
-- checks the rendered picture).
local T = require "harness"

-- Rows of a sweep: time grows with seq; naive runs out of memory at the longest.
local function sweep_rows()
  local rows = {}
  for _, impl in ipairs({ "naive", "flash" }) do
    for _, seq in ipairs({ 256, 1024, 4096, 16384 }) do
      local r = { impl = impl, seq = seq, d = 64, fwd_ms = seq * (impl == "naive" and 0.003 or 0.001) }
      if impl == "naive" and seq == 16384 then r.fwd_ms, r.oom = "OOM", true end
      rows[#rows + 1] = r
    end
  end
  return rows
end

local function count(text, pattern)
  local n = 0
  for _ in text:gmatch(pattern) do n = n + 1 end
  return n
end

T.test("a chart has a series per configuration, labels with units, a legend and OOM marks", function()
  local svg = tf.plot.chart(sweep_rows(), { x = "seq", y = "fwd_ms", title = "Forward" })
  T.ok(svg:match("^<svg xmlns=\"http://www.w3.org/2000/svg\""), svg:sub(1, 80))
  T.ok(not svg:find("<script", 1, true), "no script")
  T.ok(svg:find(">Forward</text>", 1, true), "title")
  T.ok(svg:find(">sequence length (tokens), log scale</text>", 1, true), "x label: unit and log scale")
  T.ok(svg:find(">fwd (ms), log scale</text>", 1, true), "y label with its unit")
  T.eq(count(svg, '<g class="series"'), 2)
  T.ok(svg:find('data-label="naive" data-group="" data-color="' .. tf.plot.palette[1] .. '"', 1, true))
  T.ok(svg:find('data-label="flash" data-group="" data-color="' .. tf.plot.palette[2] .. '"', 1, true))
  T.eq(count(svg, '<g class="oom"'), 1)
  T.eq(count(svg, "<circle "), 7, "one point per row that ran")
  local legend = svg:match('<g class="legend">(.-)</g>')
  T.ok(legend:find(">naive</text>", 1, true) and legend:find(">flash</text>", 1, true), "legend entries")
  T.ok(legend:find(">out of memory</text>", 1, true), "the legend explains the OOM mark")
  -- the x ticks are the sizes, shortened past 10k
  for _, t in ipairs({ ">256</text>", ">1024</text>", ">4096</text>", ">16k</text>" }) do
    T.ok(svg:find(t, 1, true), t)
  end
end)

T.test("points go where their values say: x in order, larger y higher up", function()
  local svg = tf.plot.chart(sweep_rows(), { x = "seq", y = "fwd_ms", series = { "impl" } })
  local flash = svg:match('data%-label="flash".-points="([^"]+)"')
  local xs, ys = {}, {}
  for x, y in flash:gmatch("([%d.]+),([%d.]+)") do xs[#xs + 1], ys[#ys + 1] = tonumber(x), tonumber(y) end
  T.eq(#xs, 4)
  for i = 2, 4 do
    T.ok(xs[i] > xs[i - 1], "x grows")
    T.ok(ys[i] < ys[i - 1], "a larger time is drawn higher")
  end
  -- log2 x: equal ratios (x4) are equal steps; log10 y: the same
  T.near(xs[3] - xs[2], xs[2] - xs[1], 1e-2)
  T.near(ys[2] - ys[3], ys[1] - ys[2], 1e-2)
  local rect = { svg:match('class="plot%-area" x="(%d+)" y="(%d+)" width="(%d+)" height="(%d+)"') }
  local left, top, w, h = tonumber(rect[1]), tonumber(rect[2]), tonumber(rect[3]), tonumber(rect[4])
  for i = 1, 4 do T.ok(xs[i] >= left and xs[i] <= left + w and ys[i] >= top and ys[i] <= top + h, "inside") end
end)

T.test("axes: linear where values do not double, categorical for names, forced by logx/logy", function()
  local rows = { { n = 1, t_ms = 1.0 }, { n = 2, t_ms = 2.0 }, { n = 3, t_ms = 3.0 } }
  local svg = tf.plot.chart(rows, { x = "n", y = "t_ms" })
  T.ok(svg:find(">n</text>", 1, true) and not svg:find("log scale", 1, true), "linear axes")
  T.eq(count(svg, '<g class="series"'), 1)
  svg = tf.plot.chart(rows, { x = "n", y = "t_ms", logy = true, logx = true })
  T.ok(svg:find(">n, log scale</text>", 1, true) and svg:find(">t (ms), log scale</text>", 1, true))
  svg = tf.plot.chart({ { size = "small", peak_gib = 1.5 }, { size = "large", peak_gib = 6.0 } },
    { x = "size", y = "peak_gib" })
  T.ok(svg:find(">small</text>", 1, true) and svg:find(">large</text>", 1, true), "names along x")
  T.ok(svg:find(">peak (GiB)</text>", 1, true))
  svg = tf.plot.chart({}, { x = "n", y = "t_ms" })
  T.ok(svg:find(">no data</text>", 1, true), "an empty chart says so")
end)

T.test("groups are line styles: series by colour, groups by dash; a constant series column names none", function()
  local rows = {}
  for _, file in ipairs({ "A", "B" }) do
    for _, seq in ipairs({ 128, 256, 512 }) do
      rows[#rows + 1] = { file = file, impl = "flash", seq = seq, fwd_ms = seq / 100 }
    end
  end
  local svg = tf.plot.chart(rows, { x = "seq", y = "fwd_ms", series = { "impl" }, group = function(r) return r.file end })
  T.eq(count(svg, '<g class="series"'), 2)
  T.eq(count(svg, 'stroke%-dasharray="' .. tf.plot.dashes[2] .. '"'), 2, "B's line and its legend entry")
  T.ok(svg:find('data-label="all" data-group="A" data-color="' .. tf.plot.palette[1], 1, true))
  T.ok(svg:find('data-label="all" data-group="B" data-color="' .. tf.plot.palette[1], 1, true))
end)

T.test("more series than colours: line styles tell them apart, the chart grows to hold the legend", function()
  local rows = {}
  for k = 1, 24 do
    for _, x in ipairs({ 1, 2, 4 }) do rows[#rows + 1] = { s = "series " .. k, x = x, y_ms = k * x } end
  end
  local svg = tf.plot.chart(rows, { x = "x", y = "y_ms" })
  T.eq(count(svg, '<g class="series"'), 24)
  local height = tonumber(svg:match('^<svg [^>]- height="(%d+)"'))
  T.ok(height >= 44 + 20 + 18 * 24, "height " .. height)
  T.eq(count(svg, 'stroke%-dasharray="' .. tf.plot.dashes[2] .. '"'), 2 * 10, "series 11-20: line and legend")
  T.eq(count(svg, 'stroke%-dasharray="' .. tf.plot.dashes[3] .. '"'), 2 * 4, "series 21-24")
end)

T.test("write: .svg stacks charts, .html holds them in a page; bad input is an error", function()
  local dir = os.tmpname()
  os.remove(dir)
  local rows = sweep_rows()
  local svg_path, html_path = dir .. ".svg", dir .. ".html"
  tf.plot.write(svg_path, { { rows = rows, x = "seq", y = "fwd_ms" }, { rows = rows, x = "seq", y = "fwd_ms" } })
  local svg = T.read_file(svg_path)
  T.ok(svg:match('^<svg xmlns="http://www.w3.org/2000/svg" width="720" height="840"'), svg:sub(1, 100))
  T.eq(count(svg, 'class="tf%-plot"'), 2)
  tf.plot.sweep(html_path, rows, { x = { "d", "seq" }, y = { "fwd_ms" }, series = { "impl", "d" }, title = "Sweep" })
  local html = T.read_file(html_path)
  T.ok(html:find("<!DOCTYPE html>", 1, true) and html:find("<h1>Sweep</h1>", 1, true))
  T.ok(html:find(">Sweep: fwd (ms)</text>", 1, true), "the chart's title")
  T.ok(html:find(">sequence length (tokens), log scale</text>", 1, true), "x: the first column that varies")
  T.ok(html:find("command: ", 1, true), "the page says how it was made")
  T.ok(not html:find("<script", 1, true), "no script")
  os.remove(svg_path)
  os.remove(html_path)
  T.raises(function() tf.plot.write(dir .. ".png", { rows = rows, x = "seq", y = "fwd_ms" }) end,
    "the name must end in .svg or .html")
  T.raises(function() tf.plot.chart(rows, { x = "seq" }) end, "opts.x and opts.y must name columns")
  T.raises(function() tf.plot.write(svg_path, { { x = 1 } }) end, "each chart is SVG text or a table")
  T.raises(function() tf.plot.write("/nonexistent/dir/p.svg", { rows = rows, x = "seq", y = "fwd_ms" }) end,
    "/nonexistent/dir/p.svg")
end)

T.test("units: kinds, which way is better, labels", function()
  T.eq(tf.units.of("mean_ms").better, "lower")
  T.eq(tf.units.of("tokens_per_s").better, "higher")
  T.eq(tf.units.of("fwdbwd_tflops").kind, "throughput")
  T.eq(tf.units.of("peak_gib").kind, "memory")
  T.eq(tf.units.of("context"), nil)
  T.eq(tf.units.label("tokens_per_s"), "tokens/s")
  T.eq(tf.units.label("context"), "context length (tokens)")
  T.eq(tf.plot.tick_text(65536), "64k")
  T.eq(tf.plot.tick_text(0.25), "0.25")
  T.eq(tf.plot.tick_text(1e-5), "1e-5")
end)

T.test("the log scale other charts use (tf.roofline): whole decades, values mapped by their logarithm", function()
  local sc = tf.plot._log_scale(0.03, 2500)
  T.eq({ sc.lo, sc.hi, sc.log }, { 0.01, 10000.0, true })
  T.near(sc.map(0.01), 0, 0, 1e-12)
  T.near(sc.map(10000), 1, 1e-12)
  T.near(sc.map(10), 0.5, 1e-12)
  T.eq(#sc.ticks, 7, "a tick per decade over six decades")
  T.eq(tf.plot._escape('a<b & "c"'), "a&lt;b &amp; &quot;c&quot;")
end)

T.run()
