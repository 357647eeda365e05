-- tf.report: Markdown, CSV and JSON renderings, column specs, custom formats.
local T = require "harness"

local rows = {
  { size = "small", ctx = 128, ms = 1.23456, note = "a|b" },
  { size = "large", ctx = 1024, ms = 1234.5, note = 'say "hi", ok' },
}
local columns = { "size", "ctx", { "ms", "time (ms)", "%.2f" }, "note" }

T.test("markdown", function()
  local text = tf.report.table(rows, { columns = columns, out = false })
  T.eq(text, "| size | ctx | time (ms) | note |\n|---|---|---|---|\n" ..
    "| small | 128 | 1.23 | a\\|b |\n| large | 1024 | 1234.50 | say \"hi\", ok |\n")
end)

T.test("csv quotes what needs quoting and keeps full precision", function()
  local text = tf.report.table(rows, { columns = { "size", "ms", "note" }, format = "csv", out = false })
  T.eq(text, 'size,ms,note\nsmall,1.23456,a|b\nlarge,1234.5,"say ""hi"", ok"\n')
end)

T.test("json", function()
  local text = tf.report.table(rows, { columns = { "size", "ctx" }, format = "json", out = false })
  T.eq(tf.json.decode(text), { { size = "small", ctx = 128 }, { size = "large", ctx = 1024 } })
end)

T.test("default columns, cells, files and custom formats", function()
  local text = tf.report.table({ { b = 1, a = 0.5 } }, { out = false })
  T.eq(text, "| a | b |\n|---|---|\n| 0.5 | 1 |\n")
  T.eq(tf.report.cell(1e-5), "1.000e-05")
  T.eq(tf.report.cell(0 / 0), "nan")
  T.eq(tf.report.cell(nil), "")
  local path = os.tmpname()
  tf.report.table(rows, { columns = { "size" }, format = "csv", out = path })
  local f = io.open(path)
  T.eq(f:read("a"), "size\nsmall\nlarge\n")
  f:close()
  os.remove(path)
  tf.report.formats.tsv = function(r, cols)
    local out = {}
    for _, row in ipairs(r) do
      local cells = {}
      for _, c in ipairs(cols) do cells[#cells + 1] = tostring(row[c.key]) end
      out[#out + 1] = table.concat(cells, "\t")
    end
    return table.concat(out, "\n") .. "\n"
  end
  T.eq(tf.report.table(rows, { columns = { "size", "ctx" }, format = "tsv", out = false }), "small\t128\nlarge\t1024\n")
  T.raises(function() tf.report.table(rows, { format = "xml" }) end, "unknown format 'xml'")
end)

T.run()
