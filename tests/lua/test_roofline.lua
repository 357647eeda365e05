-- tf.ceilings and tf.roofline on the CPU: the ceilings measured at tiny sizes, cached, read back,
-- refreshed, and a cache folder that cannot be written skipped with a note; the roofline table's
-- numbers and sides of the ridge, and its picture (one point per counted row, in place, sized by
-- its share, the ridge where the ceiling meets the diagonal) from synthetic rows, and the errors for
-- bad input.
local T = require "harness"
local ceilings_module = require "tf.ceilings"

local TINY = { matmul = 32, copy_bytes = 4096, warmup = 0, iters = 1, repeats = 1, quiet = true }
local function tiny(extra)
  local o = {}
  for k, v in pairs(TINY) do o[k] = v end
  for k, v in pairs(extra or {}) do o[k] = v end
  return o
end

local scratch = os.tmpname()
os.remove(scratch)
tf.mkdir(scratch)
local _ <close> = setmetatable({}, { __close = function() os.execute("rm -rf '" .. scratch .. "'") end })

-- The notes tf.ceilings gives while fn runs.
local function notes_of(fn)
  local got, saved = {}, ceilings_module._note
  ceilings_module._note = function(text) got[#got + 1] = text end
  local ok, err = pcall(fn)
  ceilings_module._note = saved
  if not ok then error(err, 0) end
  return got
end

T.test("the CPU's ceilings: f32 and copy measured, cached, read back, measured again on refresh", function()
  local dir = scratch .. "/cache"
  local c = tf.ceilings.get("cpu", tiny{ cache_dir = dir })
  T.eq(c.source, "measured")
  T.ok(c.f32 > 0 and c.copy > 0, "rates: " .. tostring(c.f32) .. ", " .. tostring(c.copy))
  T.eq({ c.bf16, c.fp8, c.tf32 }, {}, "the CPU has no tensor-core ceilings")
  T.eq(c.device, tf.device_info("cpu").name)
  T.ok(c.measured:match("^%d%d%d%d%-%d%d%-%d%dT%d%d:%d%d:%d%dZ$"), c.measured)
  T.eq(c.sizes.matmul, 32)
  local again = tf.ceilings.get("cpu", tiny{ cache_dir = dir })
  T.eq(again.source, "cache")
  T.eq(again.f32, c.f32, "the cached rate, as measured")
  T.eq(again.measured, c.measured)
  local fresh = tf.ceilings.get("cpu", tiny{ cache_dir = dir, refresh = true })
  T.eq(fresh.source, "measured")
  T.eq(tf.ceilings.get("cpu", tiny{ cache_dir = dir }).f32, fresh.f32, "refresh replaced the cached file")
  -- other sizes are a file of their own: the first entry stays
  local other = tf.ceilings.get("cpu", tiny{ cache_dir = dir, matmul = 16 })
  T.eq(other.source, "measured")
  T.eq(tf.ceilings.get("cpu", tiny{ cache_dir = dir }).source, "cache")
  -- cache = false neither reads nor writes
  T.eq(tf.ceilings.get("cpu", tiny{ cache = false }).source, "measured")
end)

T.test("a cache folder that cannot be written is skipped with a note; a damaged file is replaced", function()
  local blocker = scratch .. "/a_file"
  assert(io.open(blocker, "w")):close() -- a file where the folder would be made
  local c
  local notes = notes_of(function() c = tf.ceilings.get("cpu", tiny{ cache_dir = blocker .. "/cache" }) end)
  T.eq(c.source, "measured")
  T.eq(#notes, 1)
  T.ok(notes[1]:find("cannot be written", 1, true) and notes[1]:find(blocker, 1, true), notes[1])
  local dir = scratch .. "/damaged"
  tf.ceilings.get("cpu", tiny{ cache_dir = dir })
  for name in io.popen('ls "' .. dir .. '"'):lines() do
    local g = assert(io.open(dir .. "/" .. name, "w"))
    g:write("{ not json")
    g:close()
  end
  local again
  notes = notes_of(function() again = tf.ceilings.get("cpu", tiny{ cache_dir = dir }) end)
  T.eq(again.source, "measured")
  T.ok(notes[1] and notes[1]:find("damaged", 1, true), tostring(notes[1]))
  T.eq(tf.ceilings.get("cpu", tiny{ cache_dir = dir }).source, "cache", "written again")
end)

T.test("tf.ceilings.get refuses bad options", function()
  T.raises(function() tf.ceilings.get("cpu", { matmull = 8 }) end, "unknown option 'matmull'")
  T.raises(function() tf.ceilings.get("cpu", { matmul = 0 }) end, "matmul must be a positive integer")
  T.raises(function() tf.ceilings.get("cpu", { iters = 1.5 }) end, "iters must be a positive integer")
  T.raises(function() tf.ceilings.get(7) end, "the device must be a string")
end)

-- H200-like ceilings (docs/api.md's order of magnitude) and rows as p:kernels{by = "class"} gives
-- them with counters.
local C = { bf16 = 800, fp8 = 1600, tf32 = 400, f32 = 50, copy = 4000, device = "test GPU", source = "measured" }
local function rows()
  return {
    { name = "gemm", class = "gemm", pct = 64, total_ms = 10, flops = 7e12, dram_bytes = 7e9,
      flops_by = { bf16 = 7e12 } },                                  -- 700 TFLOP/s at 1000 FLOP/B
    { name = "elementwise", class = "elementwise", pct = 16, total_ms = 2.5, flops = 2.5e9, dram_read = 6e9,
      dram_write = 4e9, flops_by = { f32 = 2.5e9 } },                -- 1 TFLOP/s at 0.25 FLOP/B, 4000 GB/s
    { name = "attention", class = "attention", pct = 4, total_ms = 0.5, flops = 1e11, dram_bytes = 2e9, gbs = 4000,
      tflops = 200, intensity = 50, flops_by = { f16 = 1e11 } },     -- given, not computed
    { name = "memset", class = "memset", pct = 16, total_ms = 2.5 }, -- no counts
  }
end

T.test("the table: rates from the counts, the roof's share, the side of the ridge", function()
  local t = tf.roofline.table(rows(), { ceilings = C })
  T.eq(#t, 4)
  local by = {}
  for _, r in ipairs(t) do by[r.name] = r end
  T.near(by.gemm.tflops, 700, 1e-12)
  T.near(by.gemm.gbs, 700, 1e-12)
  T.near(by.gemm.intensity, 1000, 1e-12)
  T.near(by.gemm.roof_share, 700 / 800, 1e-12)
  T.eq(by.gemm.bound, "compute")                      -- bf16's ridge: 800 / 4000 GB/s = 200 FLOP/B
  T.near(by.elementwise.intensity, 0.25, 1e-12)
  T.near(by.elementwise.gbs, 4000, 1e-12)
  T.near(by.elementwise.roof_share, 1, 1e-12)         -- on the diagonal
  T.eq(by.elementwise.bound, "memory")
  T.eq(by.attention.tflops, 200)
  T.eq(by.attention.ceiling, "bf16", "f16 runs against bf16's ceiling")
  T.eq(by.attention.bound, "memory")                  -- 50 FLOP/B < 200
  T.near(by.attention.roof_share, 200 / 200, 1e-12)   -- the roof at 50 FLOP/B: 4000 x 50 / 1000
  T.eq(by.memset.tflops, nil)
  T.eq(by.memset.bound, nil)
  T.eq(by.memset.pct, 16)
  local shown = tf.report.table(t, { columns = tf.roofline.columns, out = false })
  T.ok(shown:find("| gemm | gemm | 64.0 | 700.00 | 700 | 1e+03 | 0.88 | compute |", 1, true), shown)
  -- a row's own roof_share (the profiler's) is kept
  local given = rows()
  given[1].roof_share = 0.5
  T.eq(tf.roofline.table(given, { ceilings = C })[1].roof_share, 0.5)
  -- without ceilings: the rates, no sides
  local bare = tf.roofline.table(rows())
  T.near(bare[1].tflops, 700, 1e-12)
  T.eq(bare[1].bound, nil)
end)

local function attr(s, name) return tonumber(s:match(name .. '="([^"]+)"')) end

T.test("the picture: a point per counted row, in place, sized by its share; the others listed", function()
  local svg = tf.roofline.plot(rows(), { ceilings = C, title = "synthetic" })
  T.ok(svg:match('^<svg xmlns="http://www.w3.org/2000/svg"'), svg:sub(1, 60))
  T.ok(not svg:find("<script", 1, true), "no script")
  T.ok(svg:find(">synthetic</text>", 1, true), "title")
  local points = {}
  for c in svg:gmatch('<circle class="kernel"[^>]*>') do points[#points + 1] = c end
  T.eq(#points, 3, "the three rows with counts")
  local by = {}
  for _, c in ipairs(points) do by[c:match('data%-name="([^"]+)"')] = c end
  T.ok(by.gemm and by.elementwise and by.attention and not by.memset, "which rows")
  local area = { x = attr(svg, 'class="plot%-area" x'), y = attr(svg, 'class="plot%-area" x="%d+" y') }
  area.w = tonumber(svg:match('class="plot%-area"[^>]- width="(%d+)"'))
  area.h = tonumber(svg:match('class="plot%-area"[^>]- height="(%d+)"'))
  local function xy(c) return attr(c, "cx"), attr(c, "cy") end
  local gx, gy = xy(by.gemm)
  local ex, ey = xy(by.elementwise)
  local ax, ay = xy(by.attention)
  T.ok(gx > ax and ax > ex, "x grows with intensity")
  T.ok(gy < ay and ay < ey, "higher TFLOP/s is drawn higher")
  -- log x: 1000 / 50 and 50 / 0.25 are in the ratio of their logarithms
  T.near((gx - ax) / (ax - ex), math.log(1000 / 50) / math.log(50 / 0.25), 1e-2)
  for _, c in ipairs(points) do
    local x, y = xy(c)
    T.ok(x >= area.x and x <= area.x + area.w and y >= area.y and y <= area.y + area.h, "inside: " .. c)
  end
  -- area proportional to the share: gemm has 64 %, elementwise 16 %: radii 2 : 1
  T.near(attr(by.gemm, " r") / attr(by.elementwise, " r"), 2, 1e-3)
  T.ok(by.gemm:find('data-class="gemm"', 1, true))
  T.ok(svg:find('class="not%-plotted"[^>]*>not plotted %(no FLOP or DRAM byte counts%): memset</text>'),
    "the row without counts is named under the picture")
  -- a legend entry per class plotted, a colour per class
  local legend = svg:match('<g class="legend">(.-)</g>')
  for _, k in ipairs({ "gemm", "elementwise", "attention" }) do T.ok(legend:find(">" .. k .. "</text>", 1, true), k) end
  T.ok(not legend:find(">memset<", 1, true), "no entry for a class without points")
  T.ok(by.gemm:match('fill="([^"]+)"') ~= by.elementwise:match('fill="([^"]+)"'), "colours by class")
end)

T.test("the roofs: a line per ceiling from its ridge point, the diagonal of the copy rate up to the highest", function()
  local svg = tf.roofline.plot(rows(), { ceilings = C })
  local roofs = {}
  for l in svg:gmatch('<line class="roof" [^>]*>') do roofs[l:match('data%-ceiling="(%w+)"')] = l end
  T.eq({ roofs.fp8 ~= nil, roofs.bf16 ~= nil, roofs.tf32 ~= nil, roofs.f32 ~= nil }, { true, true, true, true })
  local diag = svg:match('<line class="roof%-memory"[^>]*>')
  T.eq(attr(diag, "data%-gbs"), 4000)
  local ridges = {}
  for g in svg:gmatch('<g class="ridge" [^>]*>') do
    ridges[g:match('data%-ceiling="(%w+)"')] = attr(g, "data%-intensity")
  end
  T.near(ridges.bf16, 200, 1e-9)   -- 800 TFLOP/s over 4000 GB/s
  T.near(ridges.fp8, 400, 1e-9)
  T.near(ridges.f32, 12.5, 1e-9)
  -- the highest ceiling starts where the diagonal ends: at the fp8 ridge point
  T.near(attr(roofs.fp8, "x1"), attr(diag, "x2"), 0, 0.05)
  T.near(attr(roofs.fp8, "y1"), attr(diag, "y2"), 0, 0.05)
  -- each lower ceiling meets the diagonal at its own ridge: on the line through the diagonal's ends
  local x1, y1, x2, y2 = attr(diag, "x1"), attr(diag, "y1"), attr(diag, "x2"), attr(diag, "y2")
  for _, k in ipairs({ "bf16", "tf32", "f32" }) do
    local rx, ry = attr(roofs[k], "x1"), attr(roofs[k], "y1")
    T.near(ry, y1 + (rx - x1) * (y2 - y1) / (x2 - x1), 0, 0.2, k .. " ridge on the diagonal")
  end
  -- the ridge's circle where the ceiling starts
  local circle = svg:match('<g class="ridge" data%-ceiling="bf16"[^>]*><circle ([^>]*)>')
  T.near(attr(circle, "cx"), attr(roofs.bf16, "x1"), 0, 0.05)
  T.ok(svg:find(">ridge 400 FLOP/byte</text>", 1, true), "the highest ridge's intensity is written")
  for _, k in ipairs({ "fp8 1600", "bf16 800", "tf32 400", "f32 50" }) do
    T.ok(svg:find(">" .. k .. " TFLOP/s</text>", 1, true), k)
  end
  -- no FP8 ceiling (a GPU older than 8.9): no fp8 roof, bf16 the highest
  local without = {}
  for k, v in pairs(C) do without[k] = v end
  without.fp8 = nil
  local svg2 = tf.roofline.plot(rows(), { ceilings = without })
  T.ok(not svg2:find('data-ceiling="fp8"', 1, true), "no fp8 roof")
  T.ok(svg2:find(">ridge 200 FLOP/byte</text>", 1, true))
end)

T.test("files: .svg and .html through tf.plot's writer", function()
  local svg_path, html_path = scratch .. "/roof.svg", scratch .. "/roof.html"
  local svg = tf.roofline.plot(rows(), { ceilings = C, path = svg_path, title = "step" })
  T.eq(T.read_file(svg_path), svg)
  tf.roofline.plot(rows(), { ceilings = C, path = html_path, title = "step" })
  local html = T.read_file(html_path)
  T.ok(html:match("^<!DOCTYPE html>"), html:sub(1, 40))
  T.ok(html:find("<title>step</title>", 1, true))
  T.ok(html:find("ceilings of test GPU (measured)", 1, true), "the ceilings' source under the title")
  T.ok(html:find('<circle class="kernel"', 1, true))
end)

T.test("bad input is an error that says what is wrong", function()
  T.raises(function() tf.roofline.plot(rows()) end, "tf.roofline.plot: no ceilings: pass opts.ceilings")
  T.raises(function() tf.roofline.plot(rows(), { ceilings = { bf16 = 800 } }) end,
    "the ceilings need copy (GB/s) and at least one of fp8, bf16, tf32, f32")
  T.raises(function() tf.roofline.plot(rows(), { ceilings = { copy = 4000 } }) end, "at least one of")
  T.raises(function() tf.roofline.plot(rows(), { ceilings = { copy = 4000, bf16 = -1 } }) end,
    "ceilings.bf16 must be a positive number (TFLOP/s), not -1")
  T.raises(function() tf.roofline.plot(42, { ceilings = C }) end,
    "tf.roofline.plot: expects rows (p:kernels{...}) or a profile (tf.prof.start), got number")
  T.raises(function() tf.roofline.plot({ rows()[1], "gemm" }, { ceilings = C }) end, "rows[2] is a string, not a row")
  T.raises(function() tf.roofline.plot(rows(), { ceilings = C, path = "roof.png" }) end,
    "roof.png: the name must end in .svg or .html")
  T.raises(function() tf.roofline.plot(rows(), { ceilings = C, colour = "red" }) end, "unknown option 'colour'")
  T.raises(function() tf.roofline.plot(rows(), { ceilings = C, by = "name" }) end,
    "by and range choose a profile's rows")
  T.raises(function() tf.roofline.table(rows(), { ceilings = C, by = "kernel" }) end, 'by must be "name", "class"')
  T.raises(function() tf.roofline.table("rows") end, "tf.roofline.table: expects rows")
  -- no counted row at all still draws the roofs, and says so
  local svg = tf.roofline.plot({ { name = "x", class = "other", pct = 100 } }, { ceilings = C })
  T.ok(svg:find(">no counted kernels</text>", 1, true))
  T.ok(svg:find('<line class="roof-memory"', 1, true))
end)

T.test("a profile without counters (the CPU's): its rows are listed, not plotted", function()
  local a = tf.randn(16, 16)
  local p <close> = tf.prof.start()
  tf.matmul(a, a)
  p:stop()
  local svg = tf.roofline.plot(p, { ceilings = C })
  T.ok(svg:find(">no counted kernels</text>", 1, true))
  T.ok(svg:find("not plotted", 1, true) and svg:find("gemm", 1, true), "the class is listed")
  local t = tf.roofline.table(p, { ceilings = C })
  T.ok(#t >= 1 and t[1].bound == nil and t[1].tflops == nil, "no counts, no rates")
end)

T.run()
