--- help: one-line signatures and summaries of tf's functions, for the REPL
-- and scripts. help() lists the namespaces; help(tf.matmul) or
-- help("tf.matmul") prints a function's signature and what it does;
-- help(tf.nn) lists a namespace's entries. docs/api.md is the full
-- reference: tests/lua/test_help.lua checks every entry here is documented
-- there and names a function that exists.
local M = {}

-- name, signature, summary
M.entries = {
  -- tensors
  { "tf.tensor", "tf.tensor(values [, opts])", "a tensor from nested Lua tables or a number" },
  { "tf.zeros", "tf.zeros(shape... [, opts])", "a tensor of zeros (opts: dtype, device)" },
  { "tf.ones", "tf.ones(shape... [, opts])", "a tensor of ones" },
  { "tf.full", "tf.full(shape, value [, opts])", "a tensor filled with value" },
  { "tf.empty", "tf.empty(shape... [, opts])", "an uninitialised tensor" },
  { "tf.arange", "tf.arange([start,] stop [, step])", "evenly spaced values, like torch.arange" },
  { "tf.rand", "tf.rand(shape... [, opts])", "uniform random numbers in [0, 1)" },
  { "tf.randn", "tf.randn(shape... [, opts])", "standard normal random numbers" },
  { "tf.randint", "tf.randint(low, high, shape [, opts])", "random integers in [low, high)" },
  { "tf.seed", "tf.seed(n)", "reseeds every device's random numbers" },
  { "tf.is_tensor", "tf.is_tensor(v)", "whether v is a tensor" },
  -- ops
  { "tf.matmul", "tf.matmul(a, b)", "matrix product, batched and broadcast over leading dims" },
  { "tf.attention", "tf.attention(q, k, v [, opts])", "scaled dot-product attention: FlashAttention-2 or naive" },
  { "tf.softmax", "tf.softmax(x, dim)", "softmax along dim" },
  { "tf.cross_entropy", "tf.cross_entropy(logits, targets)", "mean cross-entropy of logits against integer targets" },
  { "tf.autocast", "tf.autocast(dtype, fn)", "runs fn with mixed precision (bf16 or f16), as torch.autocast" },
  { "tf.no_grad", "tf.no_grad(fn)", "runs fn without recording autograd history" },
  -- devices and the host
  { "tf.device", "tf.device([dev])", "the current (or dev's) device name" },
  { "tf.set_device", "tf.set_device(dev)", "changes the default device (cpu, cuda, cuda:N)" },
  { "tf.device_info", "tf.device_info([dev])", "name, memory, compute capability, driver of a device" },
  { "tf.sync", "tf.sync()", "waits for every device to finish its work" },
  { "tf.now", "tf.now()", "a monotonic clock in milliseconds" },
  { "tf.threads", "tf.threads([n])", "the CPU backend's thread count (sets it to n)" },
  { "tf.sysinfo", "tf.sysinfo()", "the host: OS, CPU, cores, threads, BLAS, Lua heap" },
  { "tf.exit", "tf.exit([code [, message]])", "leaves tfhost cleanly with an exit code" },
  { "tf.mkdir", "tf.mkdir(path)", "makes a folder and its missing parents (as mkdir -p)" },
  { "tf.safe_run", "tf.safe_run(script [, opts])", "runs a script you were sent under tfhost --safe; ok, exit code" },
  -- namespaces' main entries
  { "tf.nn.Linear", "tf.nn.Linear(in, out [, opts])", "a linear layer (module)" },
  { "tf.nn.Sequential", "tf.nn.Sequential(m1, m2, ...)", "modules applied in order" },
  { "tf.optim.AdamW", "tf.optim.AdamW(params [, opts])", "torch.optim.AdamW over a module's or a list's parameters" },
  { "tf.optim.SGD", "tf.optim.SGD(params [, opts])", "torch.optim.SGD" },
  { "tf.amp.GradScaler", "tf.amp.GradScaler([opts])", "loss scaling for f16 training" },
  { "tf.model.new", "tf.model.new{preset = ..., ...}", "the CS336 Transformer LM (fused C engine or eager)" },
  { "tf.model.load", "tf.model.load(path [, opts])", "a model saved by m:save, with its configuration" },
  { "tf.dist.rank", "tf.dist.rank()", "this process's rank (0 without a launcher; tfhost --nproc N starts N)" },
  { "tf.dist.world_size", "tf.dist.world_size()", "the number of ranks in the run" },
  { "tf.dist.all_reduce", "tf.dist.all_reduce(t [, op])", "t = sum (avg, max, min) over the ranks, in place; _async: a work" },
  { "tf.dist.broadcast", "tf.dist.broadcast(t, root)", "t = root's t on every rank" },
  { "tf.dist.all_gather", "tf.dist.all_gather(out, t)", "out = every rank's t, in rank order" },
  { "tf.dist.reduce_scatter", "tf.dist.reduce_scatter(out, t [, op])", "out = this rank's part of the sum over ranks" },
  { "tf.dist.barrier", "tf.dist.barrier()", "waits until every rank has arrived" },
  { "tf.mem.stats", "tf.mem.stats([dev])", "the caching allocator's counters" },
  { "tf.mem.snapshot", "tf.mem.snapshot([dev])", "segments, blocks and the recorded history" },
  { "tf.mem.record", "tf.mem.record{max_entries = ...}", "starts (false: stops) recording allocator events" },
  { "tf.mem.dump", "tf.mem.dump(path, snapshot)", "writes a snapshot as PyTorch's pickle or as JSON" },
  { "tf.mem.plot", "tf.mem.plot(path, opts)", "a self-contained HTML memory timeline" },
  { "tf.mem.set_limit", "tf.mem.set_limit(bytes)", "caps the memory tfhost may reserve (nil: no cap)" },
  { "tf.range", "tf.range(name [, fn, ...])", "a named range (NVTX and the profiler), closed at scope end" },
  { "tf.prof.start", "tf.prof.start([opts])", "starts the kernel profiler; p:kernels{}, p:ranges(), p:busy{}" },
  { "tf.bench", "tf.bench(fn [, opts])", "times fn: warm-up, then timed calls between synchronisations" },
  { "tf.bench.backward", "tf.bench.backward(forward, dout, leaves [, opts])", "times backward passes alone" },
  { "tf.report.table", "tf.report.table(rows [, opts])", "prints rows as a Markdown (CSV, JSON) table" },
  { "tf.results.write", "tf.results.write(path, rows [, extra])", "writes rows with the run's environment as JSON" },
  { "tf.results.env", "tf.results.env()", "the environment of this run (device, commit, options, ...)" },
  { "tf.results.read", "tf.results.read(path [, opts])", "a results file's rows, and the whole document" },
  { "tf.plot.chart", "tf.plot.chart(rows, opts)", "one SVG chart: opts.y against opts.x, a line per series" },
  { "tf.plot.write", "tf.plot.write(path, charts [, opts])", "writes charts as an .svg or a self-contained .html" },
  { "tf.plot.sweep", "tf.plot.sweep(path, rows, opts)", "a chart per metric of a sweep, into an .svg or .html" },
  { "tf.sha256", "tf.sha256(text)", "the SHA-256 of a string, as 64 hex digits" },
  { "tf.sha256_file", "tf.sha256_file(path)", "the SHA-256 of a file's bytes" },
  { "tf.options", "tf.options(spec [, args])", "declares a script's command-line options" },
  { "tf.safetensors.save", "tf.safetensors.save(path, tensors [, metadata])", "writes tensors as safetensors" },
  { "tf.safetensors.load", "tf.safetensors.load(path [, opts])", "reads a safetensors file: tensors, metadata" },
  { "tf.json.read", "tf.json.read(path)", "reads a JSON file into Lua tables" },
  { "tf.help", "tf.help([x])", "this help: namespaces, or one function's signature" },
}

M.namespaces = {
  { "tf", "tensors, ops, devices (tf.zeros, tf.matmul, tf.attention, ...)" },
  { "tf.nn", "modules and functions for networks (Linear, Sequential, ...)" },
  { "tf.optim", "optimizers (AdamW, SGD)" },
  { "tf.amp", "mixed-precision helpers (GradScaler)" },
  { "tf.model", "the Transformer LM (new, load)" },
  { "tf.dist", "several processes: ranks and collectives (all_reduce, broadcast, ...)" },
  { "tf.mem", "the caching allocator: stats, snapshots, history, timelines" },
  { "tf.prof", "ranges and the kernel profiler" },
  { "tf.bench", "timing" },
  { "tf.report", "tables" },
  { "tf.results", "results files with their environment and provenance" },
  { "tf.plot", "SVG and HTML plots of result rows" },
  { "tf.units", "what a results column measures: unit, kind, which way is better" },
  { "tf.safetensors", "safetensors files" },
  { "tf.json", "JSON" },
}

local by_name = {}
for _, e in ipairs(M.entries) do by_name[e[1]] = e end

-- The value at a dotted name ("tf.nn.Linear") from the globals, or nil.
function M.resolve(name)
  local v = _G
  for part in name:gmatch("[^.]+") do
    if type(v) ~= "table" and getmetatable(v) == nil then return nil end
    local ok, nv = pcall(function() return v[part] end)
    if not ok then return nil end
    v = nv
  end
  return v
end

-- The name of a value: an entry whose value it is, or a namespace.
local function name_of(x)
  for _, e in ipairs(M.entries) do
    if M.resolve(e[1]) == x then return e[1] end
  end
  for _, n in ipairs(M.namespaces) do
    if M.resolve(n[1]) == x then return n[1] end
  end
end

local function show_namespace(ns)
  local lines = { ns .. ":" }
  for _, e in ipairs(M.entries) do
    local prefix = e[1]:match("^(.*)%.[^.]+$")
    if prefix == ns then lines[#lines + 1] = string.format("  %-42s %s", e[2], e[3]) end
  end
  return table.concat(lines, "\n")
end

--- The help text for x (nil: the overview), or nil and why.
function M.text(x)
  if x == nil then
    local lines = { "tfhost " .. (tf and tf.version or "") .. ": help(name or function) for one entry, e.g. help(tf.matmul);",
      "docs/api.md is the full reference. Namespaces:" }
    for _, n in ipairs(M.namespaces) do lines[#lines + 1] = string.format("  %-16s %s", n[1], n[2]) end
    return table.concat(lines, "\n")
  end
  local name = type(x) == "string" and x or name_of(x)
  if name and by_name[name] then
    local e = by_name[name]
    return e[2] .. "\n  " .. e[3]
  end
  for _, n in ipairs(M.namespaces) do
    if n[1] == name then return show_namespace(name) end
  end
  return nil, "no help for " .. (type(x) == "string" and ("'" .. x .. "'") or tostring(x)) ..
    " (help() lists the namespaces; docs/api.md has everything)"
end

-- The names a value offers after "." (every field) or ":" (its methods):
-- a table's string keys and its metatable's __index table's, a tensor's methods.
local function fields(v, methods_only)
  local out, seen = {}, {}
  local function add(t)
    if type(t) ~= "table" then return end
    for k, x in pairs(t) do
      if type(k) == "string" and k:match("^[%a_][%w_]*$") and not seen[k]
          and (not methods_only or type(x) == "function") then
        seen[k] = true
        out[#out + 1] = k
      end
    end
  end
  if type(v) == "table" then add(v) end
  if type(v) == "userdata" and tf and tf.is_tensor(v) then add(require("tf.core").Tensor) end
  local mt = getmetatable(v)
  if type(mt) == "table" and type(rawget(mt, "__index")) == "table" then add(mt.__index) end
  return out
end

--- complete(text): the completions of a partial name, sorted: globals,
--- "tf.ma" -> "tf.matmul", "tf.max", ..., "x:su" -> "x:sum", ... (the REPL's Tab).
function M.complete(text)
  local head, sep, partial = text:match("^(.*)([.:])([%w_]*)$")
  local candidates
  if head then
    if not head:match("^[%a_][%w_.]*$") then return {} end
    local v = M.resolve(head)
    if v == nil then return {} end
    candidates = fields(v, sep == ":")
  else
    head, sep, partial = "", "", text
    candidates = fields(_G)
  end
  local out = {}
  for _, k in ipairs(candidates) do
    if k:sub(1, #partial) == partial then out[#out + 1] = head .. sep .. k end
  end
  table.sort(out)
  return out
end

--- help([x]): prints the help text (or why there is none).
function M.help(x)
  local text, why = M.text(x)
  print(text or why)
end

return M
