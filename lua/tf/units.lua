--- What a results column measures, from its name: its unit, its kind and
-- which way is better. tfhost's experiments and PyTorch's reference scripts
-- share these names (mean_ms, tflops, peak_gib, ...), so `tfhost compare`
-- knows that a time which rises is a regression and tf.plot labels axes
-- with units. Scripts may add their own: tf.units.add(pattern, spec).
local M = {}

-- {Lua pattern over the column name, spec}; the first match wins.
M.rules = {
  { "tokens_per_s$", { kind = "throughput", unit = "tokens/s", better = "higher" } },
  { "_per_s$", { kind = "throughput", unit = "/s", better = "higher" } },
  { "tflops$", { kind = "throughput", unit = "TFLOP/s", better = "higher" } },
  { "gflops$", { kind = "throughput", unit = "GFLOP/s", better = "higher" } },
  { "gbps$", { kind = "throughput", unit = "GB/s", better = "higher" } },
  { "_gb_s$", { kind = "throughput", unit = "GB/s", better = "higher" } },
  { "_ms$", { kind = "time", unit = "ms", better = "lower" } },
  { "^ms$", { kind = "time", unit = "ms", better = "lower" } },
  { "_us$", { kind = "time", unit = "µs", better = "lower" } },
  { "_s$", { kind = "time", unit = "s", better = "lower" } },
  { "gib$", { kind = "memory", unit = "GiB", better = "lower" } },
  { "mib$", { kind = "memory", unit = "MiB", better = "lower" } },
  { "_bytes$", { kind = "memory", unit = "bytes", better = "lower" } },
  { "_pct$", { kind = "percent", unit = "%" } },
  { "speedup$", { kind = "ratio", unit = "x" } },
  { "ratio$", { kind = "ratio", unit = "" } },
}

-- Readable names of configuration columns, for axis labels.
M.labels = {
  context = "context length (tokens)", seq = "sequence length (tokens)", d = "head dim", size = "model size",
  batch = "batch size", heads = "heads", precision = "precision", dtype = "dtype", warmup = "warm-up steps",
  impl = "implementation", mode = "mode", n = "n", bytes = "message size (bytes)", threads = "threads",
}

--- The spec of a column: {kind, unit, better} (better: "lower", "higher"
-- or nil), or nil when the name says nothing.
function M.of(name)
  for _, r in ipairs(M.rules) do
    if tostring(name):find(r[1]) then return r[2] end
  end
  return nil
end

--- Adds a rule in front of the others: tf.units.add("_joules$", {kind = "energy", unit = "J", better = "lower"}).
function M.add(pattern, spec)
  if type(pattern) ~= "string" or type(spec) ~= "table" then
    error("tf.units.add: expects a name pattern and a spec table", 2)
  end
  table.insert(M.rules, 1, { pattern, spec })
end

--- "fwd ms" -> an axis label: "fwd (ms)", "tokens/s", "context length (tokens)".
function M.label(name)
  if M.labels[name] then return M.labels[name] end
  local spec = M.of(name)
  local text = tostring(name)
  if spec and spec.unit ~= "" then
    local stem = text:gsub(spec.unit == "tokens/s" and "_?tokens_per_s$" or "_?[%a]+$", "")
    if spec.unit == "tokens/s" or spec.kind == "throughput" and stem == "" then
      return (stem ~= "" and stem:gsub("_", " ") .. " " or "") .. spec.unit
    end
    if stem == "" then stem = spec.kind end
    return stem:gsub("_", " ") .. " (" .. spec.unit .. ")"
  end
  return (text:gsub("_", " "))
end

--- tf.units.bytes(n) -> "512 B", "32.0 KiB", "1.50 GiB": a size in the
-- largest binary unit that keeps it at 1 or more, with three significant
-- digits (so a 32 KiB tensor never prints as "0.0 MiB"). Every size the
-- experiments and reports print goes through it.
function M.bytes(n)
  if type(n) ~= "number" then
    error("tf.units.bytes: expects a number of bytes, got " .. (n == nil and "nothing" or type(n)), 2)
  end
  if n ~= n then return "nan" end
  local sign, a = n < 0 and "-" or "", math.abs(n)
  if a == math.huge then return sign .. "inf" end
  local names, i = { "B", "KiB", "MiB", "GiB", "TiB", "PiB" }, 1
  while a >= 1024 and i < #names do a, i = a / 1024, i + 1 end
  if i == 1 then return string.format("%s%d B", sign, math.floor(a + 0.5)) end
  local fmt = a >= 100 and "%s%.0f %s" or a >= 10 and "%s%.1f %s" or "%s%.2f %s"
  return string.format(fmt, sign, a, names[i])
end

return M
