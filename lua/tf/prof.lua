--- tf.prof: where the time of a piece of code goes, kernel by kernel.
--
--   do
--     local p <close> = tf.prof.start()             -- {kernels, memcpy, host_ops}
--     for _ = 1, 3 do
--       local _ <close> = tf.range("step")
--       tf.range("forward", function() loss = m:loss(ids, targets) end)
--       tf.range("backward", function() m:backward() end)
--     end
--     p:stop()
--     tf.report.table(p:kernels{range = "forward", by = "class"})
--     tf.report.table(p:ranges())                  -- wall, summed kernel and busy time
--     print(p:busy{range = "step"}.busy_ms)         -- how long the device ran the step's kernels
--     p:trace("step.json")                            -- Perfetto / chrome://tracing
--   end
--
-- On a GPU the records are CUPTI's (every kernel, memcpy and memset, with
-- its launch shape); on the CPU device they are the host-timed ops. A
-- kernel counts toward every range that was open when it was launched (as
-- nsys's nvtx_kern_sum counts), through the range instance it was launched
-- in and that instance's parents; a CUDA graph replay's kernels through
-- the replay's instances of the ranges they were captured in. The mechanism is C (host/observe/prof.c,
-- kernels/cuda/prof.cu); the tables, the kernel classes and the trace
-- format are here, and scripts may change them (tf.prof.op_classes,
-- tf.prof.class_patterns).
local M = {}
local writable = require("tf.safe").writable -- tfhost --safe's path rule

local core_cache
local function core()
  core_cache = core_cache or require("tf")._prof
  return core_cache
end

--- tf.range(name [, fn, ...]): opens a range (an NVTX range and a profiler
-- tag). Without fn, returns it for `local _ <close> = tf.range(name)` (or
-- r:close(); closing twice is harmless); with fn, runs fn(...) inside it and
-- returns fn's results, closing the range however fn ends.
function M.range(name, fn, ...)
  if type(name) ~= "string" then error("tf.range: expects a range name (a string)", 2) end
  if fn ~= nil and type(fn) ~= "function" and not (getmetatable(fn) or {}).__call then
    error("tf.range: the second argument must be a function (or nothing)", 2)
  end
  local r = core().range(name)
  if fn == nil then return r end
  local _ <close> = r
  return fn(...)
end

--- tf.prof.available() -> ok, reason: whether GPU kernel records can be had.
function M.available()
  local ok, reason = core().available()
  if ok then return true end
  return false, reason
end

-- ---- kernel classes -----------------------------------------------------------------------

--- The class of tfhost's own ops and kernels, by key: the short name
-- without "tf_cuda_" in front, "_kernel" behind or ":<op>" ("unary:exp").
M.op_classes = {
  matmul = "gemm", gemm = "gemm",
  flash_attention = "attention", flash_attention_backward = "attention",
  softmax = "softmax", softmax_backward = "softmax", log_softmax = "softmax", log_softmax_backward = "softmax",
  softmax_forward = "softmax", causal_softmax = "softmax", causal_softmax_backward = "softmax",
  causal_forward = "softmax", causal_backward = "softmax",
  layer_norm = "norm", layer_norm_backward = "norm", rms_norm = "norm", rms_norm_backward = "norm",
  rmsnorm = "norm", rmsnorm_backward = "norm", norm_forward = "norm", norm_backward = "norm",
  norm_wgrad = "norm", norm_wgrad_finish = "norm", rms_forward = "norm", rms_backward = "norm",
  rms_wgrad = "norm", rms_wgrad_finish = "norm", rms_backward_fused = "norm", rms_partial_sum = "norm",
  rms_apply = "norm",
  adamw = "optimizer",
  reduce = "reduction", cross_entropy = "reduction", cross_entropy_backward = "reduction",
  ce_forward = "reduction", ce_backward = "reduction", ce_mean = "reduction", lm_loss = "reduction",
  lm_loss_mean = "reduction", index_check = "reduction",
  copy = "copy", convert = "copy", heads = "copy", heads_split = "copy", heads_merge = "copy", heads_rows = "copy", gather = "copy",
  fill = "elementwise", arange = "elementwise", random = "elementwise", unary = "elementwise",
  binary = "elementwise", masked_fill = "elementwise", rope = "elementwise", rope_inverse = "elementwise",
  rope_heads = "elementwise", rope_heads_backward = "elementwise", rope_heads_rows = "elementwise", swiglu = "elementwise",
  swiglu_backward = "elementwise", embedding = "elementwise", embedding_backward = "elementwise",
  embedding_keys = "elementwise", embedding_runs = "elementwise", embedding_sum = "elementwise",
  encoder = "elementwise", encoder_backward = "elementwise", encoder_keys = "elementwise",
  encoder_runs = "elementwise", encoder_sum = "elementwise",
}

--- Other kernels (cuBLAS, cuBLASLt, CUTLASS, libraries, user kernels): the
-- first class with a Lua pattern that matches the lower-cased short name,
-- then the full name, wins.
M.class_patterns = {
  { "attention", { "flash", "attention", "attn", "fmha", "sdpa" } },
  { "gemm", { "gemm", "gemv", "^nvjet", "xmma", "cutlass", "cublas", "wgmma", "hmma", "tensorop",
              "splitkreduce", "^sm%d+_", "matmul", "^kernel2$" } },
  { "softmax", { "softmax" } },
  { "norm", { "norm" } },
  { "optimizer", { "adam", "sgd", "optim" } },
  { "reduction", { "reduce", "reduction", "cross_entropy", "nll", "loss", "argmax", "argmin" } },
  { "copy", { "copy", "memcpy", "transpose", "permute", "gather", "scatter", "cat_" } },
  { "elementwise", { "elementwise", "unary", "binary", "vectorized", "fill", "rope", "silu", "gelu", "relu",
                     "sigmoid", "tanh", "exp", "mul", "add", "cast", "convert", "random", "uniform", "normal" } },
}

local function match_class(s)
  for _, entry in ipairs(M.class_patterns) do
    for _, pat in ipairs(entry[2]) do
      if s:find(pat) then return entry[1] end
    end
  end
end

local user_kernels = require("tf.cuda").kernel_classes

--- The class of a kernel from its short and full names. cache (optional)
-- is a table that remembers answers.
function M.classify(short_name, full_name, cache)
  local key = cache and short_name .. "\0" .. (full_name or "")
  local c = cache and cache[key]
  if c then return c end
  local op = short_name:gsub("^tf_cuda_", ""):gsub("_kernel$", ""):gsub(":.*$", "")
  -- a script's own kernels (tf.cuda.compile) are in their class ("user", or the one the script named)
  c = user_kernels[short_name:match("^[%w_]+") or short_name] or M.op_classes[op] or match_class(short_name:lower())
      or (full_name and match_class(full_name:lower())) or "other"
  if cache then cache[key] = c end
  return c
end

-- ---- analysis of a session's records -------------------------------------------------------

local Profile = {} -- the Lua methods of tf.Profile (the C ones: stop, info, records)
local analysed = setmetatable({}, { __mode = "k" })

local function duration_ns(r)
  local d = r.end_ns - r.start_ns
  return d > 0 and d or 0
end

-- Everything the tables and the trace need, built once per stopped session
-- (again on every call while it runs, since records keep coming).
local function analyse(p)
  local a = analysed[p]
  if a then return a end
  local info = p:info()
  local rec = p:records()
  a = { info = info, rec = rec, by_id = {}, items = {}, names = {}, noted = {} }
  -- Ranges: each instance's chain (itself, then its parents).
  for _, r in ipairs(rec.ranges) do
    a.by_id[r.id] = r
    a.names[r.name] = true
  end
  for _, r in ipairs(rec.ranges) do -- in id order: parents come first
    local parent = r.parent and a.by_id[r.parent]
    r.chain = { r }
    if parent then table.move(parent.chain, 1, #parent.chain, 2, r.chain) end
    local names = {}
    for i = #r.chain, 1, -1 do names[#names + 1] = r.chain[i].name end
    r.path = table.concat(names, "/")
    r.kernels, r.gpu_ns = 0, 0
  end
  -- Items: kernels (GPU kernels and the CPU's ops), then copies and memsets.
  local function add(r, kind, name, class)
    local item = { rec = r, kind = kind, name = name, class = class, ns = duration_ns(r),
                   range = r.range and a.by_id[r.range] }
    a.items[#a.items + 1] = item
  end
  local classes = {}
  for _, k in ipairs(rec.kernels) do add(k, "kernel", k.short_name, M.classify(k.short_name, k.name, classes)) end
  for _, c in ipairs(rec.memcpy) do add(c, "memcpy", "[memcpy " .. c.kind .. "]", "copy") end
  for _, c in ipairs(rec.memset) do add(c, "memset", "[memset]", "memset") end
  -- Kernel counts and GPU time of each instance (each kernel counts toward
  -- every instance of its chain).
  for _, item in ipairs(a.items) do
    if item.kind == "kernel" and item.range then
      for _, r in ipairs(item.range.chain) do
        r.kernels = r.kernels + 1
        r.gpu_ns = r.gpu_ns + item.ns
      end
    end
  end
  a.t0 = info.start_ns
  for _, r in ipairs(rec.ranges) do a.t0 = math.min(a.t0, r.start_ns) end
  for _, item in ipairs(a.items) do a.t0 = math.min(a.t0, item.rec.start_ns) end
  if not info.running then analysed[p] = a end
  return a
end

-- Kernel time and busy time of a list of kernel items: kernel_ns sums
-- their durations; busy_ns is, on each device, the length of the union of
-- their intervals (tf._prof.busy_ns), summed over the devices. Kernels on
-- two streams (the fused engine's optimizer beside its backward pass) run
-- at the same time: they count twice in kernel_ns and once in busy_ns.
-- devices: one entry per device, by name.
local function busy_of(items)
  local by_device, devices = {}, {}
  for _, item in ipairs(items) do
    local r = item.rec
    local d = by_device[r.device]
    if not d then
      d = { device = r.device, kernels = 0, kernel_ns = 0, spans = {} }
      by_device[r.device] = d
      devices[#devices + 1] = d
    end
    d.kernels, d.kernel_ns = d.kernels + 1, d.kernel_ns + item.ns
    local spans = d.spans
    spans[#spans + 1], spans[#spans + 2] = r.start_ns, r.end_ns
  end
  table.sort(devices, function(x, y) return x.device < y.device end)
  local total = { kernels = 0, kernel_ns = 0, busy_ns = 0, devices = devices }
  for _, d in ipairs(devices) do
    d.busy_ns = core().busy_ns(d.spans)
    d.spans = nil
    total.kernels, total.kernel_ns, total.busy_ns = total.kernels + d.kernels, total.kernel_ns + d.kernel_ns,
      total.busy_ns + d.busy_ns
  end
  return total
end

-- The busy time of every range instance (r.busy_ns) and range name
-- (a.name_busy_ns[name]), from the kernels that count toward them (those
-- of gpu_ns), made once per analysis.
local function range_busy(a)
  if a.name_busy_ns then return end
  local of_instance, of_name = {}, {}
  for _, item in ipairs(a.items) do
    if item.kind == "kernel" and item.range then
      local seen = {}
      for _, r in ipairs(item.range.chain) do
        local list = of_instance[r]
        if not list then list = {}; of_instance[r] = list end
        list[#list + 1] = item
        if not seen[r.name] then
          seen[r.name] = true
          list = of_name[r.name]
          if not list then list = {}; of_name[r.name] = list end
          list[#list + 1] = item
        end
      end
    end
  end
  for _, r in ipairs(a.rec.ranges) do r.busy_ns = of_instance[r] and busy_of(of_instance[r]).busy_ns or 0 end
  a.name_busy_ns = {}
  for name in pairs(a.names) do a.name_busy_ns[name] = of_name[name] and busy_of(of_name[name]).busy_ns or 0 end
end

local no_chain = {}

-- Whether item passes the range filters (names: the range names that
-- must all be open; instance: a range id that must be open); then its
-- chain and how much of it the grouping by range looks at: chain[1..cut],
-- from the innermost range out to the outermost one a filter needed.
local function in_range(item, names, instance)
  if #names == 0 and instance == nil then
    local chain = item.range and item.range.chain or no_chain
    return true, chain, #chain
  end
  if not item.range then return false end
  local chain = item.range.chain
  local missing, found, cut = #names, {}, 0
  local need_instance = instance ~= nil
  for i, r in ipairs(chain) do
    if need_instance and r.id == instance then need_instance, cut = false, i end
    if missing > 0 and names[r.name] and not found[r.name] then
      found[r.name], missing = true, missing - 1
      cut = math.max(cut, i)
    end
  end
  if missing > 0 or need_instance then return false end
  return true, chain, cut
end

local function median(sorted)
  local n = #sorted
  if n == 0 then return 0 end
  if n % 2 == 1 then return sorted[(n + 1) // 2] end
  return (sorted[n // 2] + sorted[n // 2 + 1]) / 2
end

-- This process's rank in a run of several (nil in a world of one): rows
-- carry it and the trace's process names start with it, so the tables and
-- traces of the ranks of one run can be told apart and put together.
local function dist_rank()
  local d = require("tf").dist
  if d and d.world_size() > 1 then return d.rank() end
  return nil
end

local function check_opts(fname, opts, allowed)
  if opts == nil then return {} end
  if type(opts) ~= "table" then error(fname .. ": expects an options table", 3) end
  for k in pairs(opts) do
    if not allowed[k] then
      local names = {}
      for name in pairs(allowed) do names[#names + 1] = name end
      table.sort(names)
      error(string.format("%s: unknown option '%s' (have %s)", fname, tostring(k), table.concat(names, ", ")), 3)
    end
  end
  return opts
end

-- The range names of opts.range (a name or a list of names), as a list
-- that is also a set, after checking opts.range and opts.instance; says
-- once per session and name when no range of that name was open.
local function range_filter(fname, opts, a)
  local names = {}
  if type(opts.range) == "string" then
    names = { opts.range, [opts.range] = true }
  elseif type(opts.range) == "table" then
    for _, n in ipairs(opts.range) do
      if type(n) ~= "string" then error(fname .. ": range must be a name or a list of names", 3) end
      if not names[n] then names[#names + 1], names[n] = n, true end
    end
  elseif opts.range ~= nil then
    error(fname .. ": range must be a name or a list of names", 3)
  end
  if opts.instance ~= nil and math.type(opts.instance) ~= "integer" then
    error(fname .. ": instance must be an integer range id", 3)
  end
  for _, n in ipairs(names) do
    if not a.names[n] and not a.noted[n] then
      a.noted[n] = true
      io.stderr:write(string.format("tf.prof: no range named '%s' was open while the collector ran: "
        .. "its kernels are an empty table\n", n))
    end
  end
  return names
end

--- p:kernels{range = name, instance = id, by = "name" | "class" | "range",
-- copies = true, device = "cuda:0"} -> rows {name, class, instances,
-- total_ms, avg_us, median_us, min_us, max_us, pct}, by total time, largest
-- first. range/instance keep only kernels launched while a range of that
-- name (that instance) was open, anywhere on the stack (range may be a list
-- of names that must all have been open); pct is each row's
-- share of the kept kernels' total time (by = "range": rows overlap, a
-- kernel counting toward each range open at its launch, from the filter
-- range inwards). copies = false leaves out memcpy and memset records.
function Profile:kernels(opts)
  opts = check_opts("profile:kernels", opts,
    { range = true, instance = true, by = true, copies = true, device = true })
  local by = opts.by or "name"
  if by ~= "name" and by ~= "class" and by ~= "range" then
    error("profile:kernels: by must be \"name\", \"class\" or \"range\"", 2)
  end
  local a = analyse(self)
  local names = range_filter("profile:kernels", opts, a)
  local groups, order, total = {}, {}, 0
  local function group(key, class)
    local g = groups[key]
    if not g then
      g = { name = key, class = class, samples = {} }
      groups[key] = g
      order[#order + 1] = g
    end
    return g
  end
  for _, item in ipairs(a.items) do
    local keep = (opts.copies ~= false or item.kind == "kernel") and (opts.device == nil or item.rec.device == opts.device)
    local inside, chain, cut = false, nil, 0
    if keep then inside, chain, cut = in_range(item, names, opts.instance) end
    if inside then
      total = total + item.ns
      if by == "range" then
        local seen = {}
        if cut == 0 then chain, cut = { { name = "(no range)" } }, 1 end
        for i = 1, cut do
          local r = chain[i]
          if not seen[r.name] then
            seen[r.name] = true
            local g = group(r.name, nil)
            g.samples[#g.samples + 1] = item.ns
          end
        end
      else
        local g = by == "class" and group(item.class, item.class) or group(item.name, item.class)
        g.samples[#g.samples + 1] = item.ns
      end
    end
  end
  local rows, rank = {}, dist_rank()
  for _, g in ipairs(order) do
    local s = g.samples
    table.sort(s)
    local sum = 0
    for _, v in ipairs(s) do sum = sum + v end
    rows[#rows + 1] = {
      name = g.name, class = g.class, instances = #s, total_ms = sum / 1e6, avg_us = sum / #s / 1e3,
      median_us = median(s) / 1e3, min_us = s[1] / 1e3, max_us = s[#s] / 1e3,
      pct = total > 0 and 100 * sum / total or 0, rank = rank,
    }
  end
  table.sort(rows, function(x, y)
    if x.total_ms ~= y.total_ms then return x.total_ms > y.total_ms end
    return x.name < y.name
  end)
  return rows
end

--- p:ranges() -> rows {name, instances, wall_ms, gpu_ms, busy_ms, kernels}
-- per range name, largest wall time first: wall_ms is the host time inside
-- the range summed over its instances, gpu_ms the summed time of the
-- kernels launched inside (each kernel once per name, however deep the
-- nesting), busy_ms how long those kernels kept their devices busy (the
-- union of their intervals on each device, summed over devices: kernels
-- that ran at the same time count once; busy_ms <= gpu_ms), kernels their
-- count. p:ranges{instances = true} -> one row per instance in order of
-- opening: {id, name, parent, depth, path, start_ms, end_ms, wall_ms,
-- gpu_ms, busy_ms, kernels, open} (start_ms/end_ms from the session's start).
function Profile:ranges(opts)
  opts = check_opts("profile:ranges", opts, { instances = true })
  local a = analyse(self)
  range_busy(a)
  local rows = {}
  if opts.instances then
    for _, r in ipairs(a.rec.ranges) do
      rows[#rows + 1] = {
        id = r.id, name = r.name, parent = r.parent, depth = r.depth, path = r.path,
        start_ms = (r.start_ns - a.info.start_ns) / 1e6, end_ms = (r.end_ns - a.info.start_ns) / 1e6,
        wall_ms = duration_ns(r) / 1e6, gpu_ms = r.gpu_ns / 1e6, busy_ms = r.busy_ns / 1e6, kernels = r.kernels,
        open = r.open, rank = dist_rank(),
      }
    end
    return rows
  end
  local by_name = {}
  for _, r in ipairs(a.rec.ranges) do
    local row = by_name[r.name]
    if not row then
      row = { name = r.name, instances = 0, wall_ms = 0, gpu_ms = 0, busy_ms = a.name_busy_ns[r.name] / 1e6,
              kernels = 0, rank = dist_rank() }
      by_name[r.name] = row
      rows[#rows + 1] = row
    end
    row.instances = row.instances + 1
    row.wall_ms = row.wall_ms + duration_ns(r) -- ns until the end: integer sums, so that busy <= gpu holds in ms
  end
  -- GPU time per name: each kernel once per distinct name of its chain.
  for _, item in ipairs(a.items) do
    if item.kind == "kernel" and item.range then
      local seen = {}
      for _, r in ipairs(item.range.chain) do
        if not seen[r.name] then
          seen[r.name] = true
          local row = by_name[r.name]
          row.kernels = row.kernels + 1
          row.gpu_ms = row.gpu_ms + item.ns
        end
      end
    end
  end
  for _, row in ipairs(rows) do row.wall_ms, row.gpu_ms = row.wall_ms / 1e6, row.gpu_ms / 1e6 end
  table.sort(rows, function(x, y)
    if x.wall_ms ~= y.wall_ms then return x.wall_ms > y.wall_ms end
    return x.name < y.name
  end)
  return rows
end

--- p:busy{range = name, instance = id, device = "cuda:0"} -> {kernel_ms,
-- busy_ms, kernels, wall_ms, devices}: the kernels of the session (range
-- and instance keep those launched inside, as for p:kernels; device those
-- of one device), their summed time (kernel_ms), how long they kept their
-- devices busy (busy_ms: on each device the union of their intervals,
-- summed over devices; never more than kernel_ms) and their count; devices
-- has one row {device, kernel_ms, busy_ms, kernels} per device. wall_ms is
-- the time the busy time was spent in: the session's (start to stop, or to
-- this read) without a range filter, the instance's with instance, the
-- summed instances' with one range name, none with a list of names. A
-- range's kernels may still run after it closes (the GPU runs behind the
-- host): busy_ms <= wall_ms holds for ranges that wait for their work
-- (tf.sync() before they close), and always for the session (stop waits).
function Profile:busy(opts)
  opts = check_opts("profile:busy", opts, { range = true, instance = true, device = true })
  local a = analyse(self)
  local names = range_filter("profile:busy", opts, a)
  local items = {}
  for _, item in ipairs(a.items) do
    if item.kind == "kernel" and (opts.device == nil or item.rec.device == opts.device)
        and in_range(item, names, opts.instance) then
      items[#items + 1] = item
    end
  end
  local b = busy_of(items)
  local out = { kernel_ms = b.kernel_ns / 1e6, busy_ms = b.busy_ns / 1e6, kernels = b.kernels, devices = {},
                rank = dist_rank() }
  for _, d in ipairs(b.devices) do
    out.devices[#out.devices + 1] = { device = d.device, kernel_ms = d.kernel_ns / 1e6, busy_ms = d.busy_ns / 1e6,
                                      kernels = d.kernels }
  end
  local wall_ns
  if opts.instance ~= nil then
    local r = a.by_id[opts.instance]
    wall_ns = r and duration_ns(r) or 0
  elseif #names == 1 then
    wall_ns = 0
    for _, r in ipairs(a.rec.ranges) do
      if r.name == names[1] then wall_ns = wall_ns + duration_ns(r) end
    end
  elseif #names == 0 then
    wall_ns = (a.info.stop_ns or math.floor(require("tf").now() * 1e6)) - a.info.start_ns
  end
  out.wall_ms = wall_ns and wall_ns / 1e6
  return out
end

--- Column lists for tf.report.table(rows, {columns = tf.prof.columns.kernels}).
M.columns = {
  kernels = { "name", "class", "instances", { "total_ms", "total ms", "%.3f" }, { "avg_us", "avg us", "%.1f" },
              { "median_us", "median us", "%.1f" }, { "min_us", "min us", "%.1f" }, { "max_us", "max us", "%.1f" },
              { "pct", "%", "%.1f" } },
  ranges = { "name", "instances", { "wall_ms", "wall ms", "%.3f" }, { "gpu_ms", "kernel ms", "%.3f" },
             { "busy_ms", "busy ms", "%.3f" }, "kernels" },
  instances = { "id", "name", "parent", "depth", "path", { "start_ms", "start ms", "%.3f" },
                { "end_ms", "end ms", "%.3f" }, { "wall_ms", "wall ms", "%.3f" }, { "gpu_ms", "kernel ms", "%.3f" },
                { "busy_ms", "busy ms", "%.3f" }, "kernels", "open" },
}

-- ---- the trace ---------------------------------------------------------------------------------

--- Process ids of the trace: GPUs are their device index; these two are
-- the host's ranges (and host-timed ops of GPUs) and the CPU device's ops.
M.HOST_PID, M.CPU_PID = 1000, 999

-- JSON text for trace events, written directly (a long trace has hundreds
-- of thousands of them): strings are escaped once per distinct string,
-- times keep nanoseconds (3 decimals of a microsecond).
local escaped = {} -- emptied by every trace()
local function json_string(s)
  local e = escaped[s]
  if not e then
    e = '"' .. s:gsub('[%c"\\]', function(c)
      if c == '"' then return '\\"' elseif c == "\\" then return "\\\\" end
      return string.format("\\u%04x", c:byte())
    end) .. '"'
    escaped[s] = e
  end
  return e
end

local function pid_of(device)
  if device == "cpu" then return M.CPU_PID end
  return tonumber(device:match("^cuda:(%d+)$")) or M.CPU_PID
end

--- p:trace(path) writes the session as Chrome Trace Event Format JSON
-- (Perfetto's ui.perfetto.dev and chrome://tracing open it): kernels,
-- copies and memsets as complete ("X") events on one process per GPU and
-- one thread per stream, with their launch shape and range path in args;
-- ranges on their own host track. Times in microseconds from the earliest
-- record. Returns path.
function Profile:trace(path)
  if type(path) ~= "string" then error("profile:trace: expects a file path", 2) end
  local a = analyse(self)
  escaped = {}
  local fmt, q = string.format, json_string
  local lines, threads, procs = {}, {}, {}
  local function thread(pid, tid, pname, tname)
    procs[pid] = procs[pid] or pname
    threads[pid] = threads[pid] or {}
    threads[pid][tid] = threads[pid][tid] or tname
  end
  -- One complete event; args is JSON text without its braces.
  local function event(name, cat, pid, tid, r, args)
    lines[#lines + 1] = fmt('{"name":%s,"cat":%s,"ph":"X","pid":%d,"tid":%d,"ts":%.3f,"dur":%.3f,"args":{%s}}',
      q(name), q(cat), pid, tid, (r.start_ns - a.t0) / 1e3, duration_ns(r) / 1e3, args)
  end
  local function range_arg(range) return range and fmt('"range":%s,', q(range.path)) or "" end
  for _, r in ipairs(a.rec.ranges) do
    thread(M.HOST_PID, 0, "host", "ranges")
    event(r.name, "range", M.HOST_PID, 0, r, fmt('"id":%d,"path":%s,"kernels":%d,"gpu_ms":%.6f%s', r.id, q(r.path),
      r.kernels, r.gpu_ns / 1e6, r.open and ',"open":true' or ""))
  end
  for _, item in ipairs(a.items) do
    local r = item.rec
    local pid, tid = pid_of(r.device), r.stream
    local args
    if item.kind ~= "kernel" then
      args = fmt('%s"bytes":%d', range_arg(item.range), r.bytes)
      thread(pid, tid, r.device, "stream " .. tid)
    elseif r.host then
      tid = 0
      args = fmt('%s"full_name":%s', range_arg(item.range), q(r.name))
      thread(pid, tid, r.device, "ops")
    else
      local g, b = r.grid, r.block
      args = fmt('%s"grid":[%d,%d,%d],"block":[%d,%d,%d],"registers":%d,"shared_memory":%d,"static_shared":%d,'
        .. '"dynamic_shared":%d,"correlation":%d,"full_name":%s', range_arg(item.range), g[1], g[2], g[3], b[1], b[2],
        b[3], r.registers, r.shared_memory, r.static_shared, r.dynamic_shared, r.correlation, q(r.name))
      thread(pid, tid, r.device, "stream " .. tid)
    end
    event(item.name, item.class, pid, tid, r, args)
  end
  local classes = {}
  for _, op in ipairs(a.rec.host_ops) do
    thread(M.HOST_PID, 1, "host", "host-timed ops")
    event(op.short_name, M.classify(op.short_name, op.name, classes), M.HOST_PID, 1, op,
      fmt('%s"device":%s', range_arg(op.range and a.by_id[op.range]), q(op.device)))
  end
  local meta, rank = {}, dist_rank()
  for pid, pname in pairs(procs) do
    local label = pid == M.HOST_PID and "host (tfhost ranges)" or pname
    if rank then label = "rank " .. rank .. " " .. label end
    meta[#meta + 1] = fmt('{"name":"process_name","ph":"M","ts":0,"pid":%d,"tid":0,"args":{"name":%s}}', pid, q(label))
    meta[#meta + 1] = fmt('{"name":"process_sort_index","ph":"M","ts":0,"pid":%d,"tid":0,"args":{"sort_index":%d}}', pid,
      pid == M.HOST_PID and -1 or pid)
    for tid, tname in pairs(threads[pid]) do
      meta[#meta + 1] = fmt('{"name":"thread_name","ph":"M","ts":0,"pid":%d,"tid":%d,"args":{"name":%s}}', pid, tid, q(tname))
    end
  end
  writable(path, "profile:trace")
  local f, err = io.open(path, "w")
  if not f then error("profile:trace: " .. err, 2) end
  f:write('{"displayTimeUnit": "ms", "traceEvents": [\n', table.concat(meta, ",\n"))
  local chunk = 4096 -- lines per write
  for i = 1, #lines, chunk do
    f:write(#meta > 0 and ",\n" or "", table.concat(lines, ",\n", i, math.min(i + chunk - 1, #lines)))
  end
  f:write("\n]}\n")
  f:close()
  escaped = {}
  return path
end

--- tf.prof.start{kernels = true, memcpy = true, host_ops = true}
-- -> a running profile (use with <close>, or call p:stop()). Only one runs
-- at a time. Without GPU records (no GPU, another profiler attached, ...)
-- it says why once on stderr and records host timings; p:info().reason
-- keeps the reason.
-- p.gpu, p.reason (why no GPU records), p.running: read without waiting for the devices.
local properties = {
  running = function(p) return (p:_status()) end,
  gpu = function(p) return select(2, p:_status()) end,
  reason = function(p)
    local _, gpu, reason = p:_status()
    return not gpu and reason or nil
  end,
}

local installed = false
local function install(p)
  installed = true
  local methods = core().methods
  for name, fn in pairs(Profile) do methods[name] = fn end
  getmetatable(p).__index = function(self, key)
    local m = methods[key]
    if m ~= nil then return m end
    local prop = properties[key]
    return prop and prop(self)
  end
end

function M.start(opts)
  if opts ~= nil and type(opts) ~= "table" then error("tf.prof.start: expects an options table", 2) end
  local p = core().start(opts)
  if not installed then install(p) end
  return p
end

--- tf.prof.stack() -> the names of the open ranges, outermost first.
function M.stack() return core().range_stack() end

return M
