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
  -- tfhost's memsets, run as a kernel while the counters replay kernels (kernels/cuda/util.cu)
  memset = "memset",
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

-- ---- hardware counters --------------------------------------------------------------------

-- The counters' pure parts, for the tests and for scripts that want them
-- (tf.prof._counters: not yet a documented interface).
local C = {}
M._counters = C

--- The named metric sets of tf.prof.start{metrics = ...}: CUPTI metric
-- names (checked on GH100, sm_90). Each set is kept small: every metric
-- that needs counters of its own can add a replay pass of each kernel
-- (roofline: 3 passes on GH100; pipes and occupancy: 1 each, 1 together).
-- Half-precision tensor ops (sm__ops_path_tensor_src_fp16.sum) would cost
-- 2 passes more, FP64 tensor ops (sm__ops_path_tensor_src_fp64.sum) 1:
-- name them beside "roofline" to count them; the FLOPs derived below take
-- them in when present.
M.metric_sets = {
  roofline = {
    "dram__bytes_read.sum", "dram__bytes_write.sum", "gpu__time_duration.sum",
    "sm__sass_thread_inst_executed_op_ffma_pred_on.sum", "sm__sass_thread_inst_executed_op_fadd_pred_on.sum",
    "sm__sass_thread_inst_executed_op_fmul_pred_on.sum",
    "sm__sass_thread_inst_executed_op_dfma_pred_on.sum", "sm__sass_thread_inst_executed_op_dadd_pred_on.sum",
    "sm__sass_thread_inst_executed_op_dmul_pred_on.sum",
    "sm__sass_thread_inst_executed_op_hfma_pred_on.sum", "sm__sass_thread_inst_executed_op_hadd_pred_on.sum",
    "sm__sass_thread_inst_executed_op_hmul_pred_on.sum",
    "sm__ops_path_tensor_src_bf16_dst_fp32.sum", "sm__ops_path_tensor_src_tf32_dst_fp32.sum",
    "sm__ops_path_tensor_src_fp8.sum",
  },
  pipes = {
    "sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_active",
    "sm__inst_executed_pipe_fma.avg.pct_of_peak_sustained_active",
    "sm__inst_executed_pipe_alu.avg.pct_of_peak_sustained_active",
    "sm__inst_executed_pipe_lsu.avg.pct_of_peak_sustained_active",
    "gpu__time_duration.sum",
  },
  occupancy = { "sm__warps_active.avg.pct_of_peak_sustained_active", "gpu__time_duration.sum" },
}

--- FLOPs by precision from counted metrics: {metric, precision, weight}
-- (as Nsight Compute's roofline: an FMA thread instruction is 2 FLOPs, an
-- add or a multiply 1; the tensor path's "math ops" are FLOPs).
M.flop_metrics = {
  { "sm__sass_thread_inst_executed_op_ffma_pred_on.sum", "f32", 2 },
  { "sm__sass_thread_inst_executed_op_fadd_pred_on.sum", "f32", 1 },
  { "sm__sass_thread_inst_executed_op_fmul_pred_on.sum", "f32", 1 },
  { "sm__sass_thread_inst_executed_op_dfma_pred_on.sum", "f64", 2 },
  { "sm__sass_thread_inst_executed_op_dadd_pred_on.sum", "f64", 1 },
  { "sm__sass_thread_inst_executed_op_dmul_pred_on.sum", "f64", 1 },
  { "sm__sass_thread_inst_executed_op_hfma_pred_on.sum", "f16", 2 },
  { "sm__sass_thread_inst_executed_op_hadd_pred_on.sum", "f16", 1 },
  { "sm__sass_thread_inst_executed_op_hmul_pred_on.sum", "f16", 1 },
  { "sm__ops_path_tensor_src_bf16_dst_fp32.sum", "bf16", 1 },
  { "sm__ops_path_tensor_src_fp16.sum", "f16", 1 },
  { "sm__ops_path_tensor_src_tf32_dst_fp32.sum", "tf32", 1 },
  { "sm__ops_path_tensor_src_fp8.sum", "fp8", 1 },
  { "sm__ops_path_tensor_src_fp64.sum", "f64", 1 },
}
M.precisions = { "bf16", "f16", "tf32", "fp8", "f32", "f64" }

--- The averaged utilisations of the rows, by field: the metric each comes from.
M.pct_metrics = {
  tensor_pct = "sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_active",
  fma_pct = "sm__inst_executed_pipe_fma.avg.pct_of_peak_sustained_active",
  alu_pct = "sm__inst_executed_pipe_alu.avg.pct_of_peak_sustained_active",
  lsu_pct = "sm__inst_executed_pipe_lsu.avg.pct_of_peak_sustained_active",
  occupancy_pct = "sm__warps_active.avg.pct_of_peak_sustained_active",
}
local DURATION = "gpu__time_duration.sum"

-- Levenshtein distance, given up past limit (returns limit + 1).
local function distance(a, b, limit)
  if math.abs(#a - #b) > limit then return limit + 1 end
  local prev = {}
  for j = 0, #b do prev[j] = j end
  for i = 1, #a do
    local cur, best = { [0] = i }, i
    local ca = a:byte(i)
    for j = 1, #b do
      local cost = ca == b:byte(j) and 0 or 1
      local v = math.min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + cost)
      cur[j] = v
      if v < best then best = v end
    end
    if best > limit then return limit + 1 end
    prev = cur
  end
  return prev[#b]
end

-- Up to n of names nearest to name: by edit distance, a name containing
-- it (or contained in it) counting as 1.5.
local function near_names(name, names, n)
  local scored = {}
  local limit = math.max(3, #name // 3)
  for _, c in ipairs(names) do
    local d
    if c:find(name, 1, true) or name:find(c, 1, true) then d = 1.5 + math.abs(#c - #name) / 100
    else d = distance(name, c, limit) end
    if d <= limit then scored[#scored + 1] = { c, d } end
  end
  table.sort(scored, function(x, y)
    if x[2] ~= y[2] then return x[2] < y[2] end
    return x[1] < y[1]
  end)
  local out = {}
  for i = 1, math.min(n, #scored) do out[i] = scored[i][1] end
  return out
end

local function set_names()
  local names = {}
  for k in pairs(M.metric_sets) do names[#names + 1] = k end
  table.sort(names)
  return names
end

--- tf.prof._counters.metric_list(spec [, catalog]) -> the CUPTI metric names of a
-- metrics option: a set name ("roofline", "pipes", "occupancy"), or a list
-- mixing set names and raw metric names ("dram__bytes_read.sum"), without
-- repeats, in order. catalog (optional) checks raw names against a chip:
-- {chip = "GH100", bases = {name = true, ...}, submetrics = function(base)
-- -> {".sum" = true, ...}}; a set's metrics the chip lacks are left out
-- (said once on stderr), an unknown raw name is an error naming near ones.
-- level: the error level (default 2).
function C.metric_list(spec, catalog, level)
  level = level or 2
  local fname = "tf.prof.start"
  local items
  if type(spec) == "string" then
    items = { spec }
  elseif type(spec) == "table" then
    items = {}
    for k in pairs(spec) do
      if math.type(k) ~= "integer" or k < 1 or k > #spec then
        error(string.format("%s: metrics must be a list of names (a key %s is not an index)", fname, tostring(k)), level)
      end
    end
    for i = 1, #spec do
      if type(spec[i]) ~= "string" then
        error(string.format("%s: metrics[%d] must be a set or metric name (a string), not %s", fname, i,
          type(spec[i])), level)
      end
      items[i] = spec[i]
    end
    if #items == 0 then error(fname .. ": metrics is an empty list (name a set: " ..
      table.concat(set_names(), ", ") .. ")", level) end
  else
    error(string.format("%s: metrics must be a set name (%s) or a list of set and metric names, not %s", fname,
      table.concat(set_names(), ", "), type(spec)), level)
  end
  local out, seen, missing = {}, {}, {}
  local function add(name)
    if not seen[name] then
      seen[name] = true
      out[#out + 1] = name
    end
  end
  for _, item in ipairs(items) do
    local set = M.metric_sets[item]
    if set then
      for _, name in ipairs(set) do
        local base = name:match("^[^.]+")
        if catalog and not catalog.bases[base] then missing[#missing + 1] = name else add(name) end
      end
    elseif not item:find("__", 1, true) then
      local near = near_names(item, set_names(), 1)[1]
      error(string.format("%s: unknown metric set '%s'%s; the sets are %s, or name a CUPTI metric "
        .. "(\"dram__bytes_read.sum\")", fname, item, near and " (did you mean " .. near .. "?)" or "",
        table.concat(set_names(), ", ")), level)
    else
      local base, sub = item:match("^([^.]+)(.*)$")
      if catalog then
        local chip = catalog.chip or "this GPU"
        if not catalog.bases[base] then
          local list = catalog.list
          if not list then
            list = {}
            for b in pairs(catalog.bases) do list[#list + 1] = b end
            table.sort(list)
            catalog.list = list
          end
          local near = near_names(base, list, 5)
          error(string.format("%s: unknown metric '%s' on %s%s", fname, item, chip,
            #near > 0 and " (near: " .. table.concat(near, ", ") .. ")" or ""), level)
        end
        local subs = catalog.submetrics(base)
        if not subs[sub] then
          local sublist = {}
          for k in pairs(subs) do sublist[#sublist + 1] = k end
          table.sort(sublist)
          local near = sub ~= "" and near_names(sub, sublist, 5) or {}
          if #near == 0 then
            for _, cand in ipairs({ ".sum", ".avg", ".max", ".ratio", ".pct", ".avg.pct_of_peak_sustained_active" }) do
              if subs[cand] then near[#near + 1] = cand end
            end
          end
          for i, n in ipairs(near) do near[i] = base .. n end
          error(string.format("%s: metric '%s' on %s %s%s", fname, item, chip,
            sub == "" and "needs a rollup" or "has no submetric '" .. sub .. "'",
            #near > 0 and " (near: " .. table.concat(near, ", ") .. ")" or ""), level)
        end
      end
      add(item)
    end
  end
  if #missing > 0 then
    io.stderr:write(string.format("tf.prof: %s lacks %d metric%s of the sets asked for, left out: %s\n",
      catalog.chip or "this GPU", #missing, #missing > 1 and "s" or "", table.concat(missing, ", ")))
  end
  return out
end

local catalogs = {} -- by chip name ("" for the current GPU's)

local function strip_where(msg) return (tostring(msg):gsub("^[^:\n]*:%d+: ", ""):gsub("^tf%.prof: ", "")) end

--- tf.prof._counters.counter_catalog([chip]) -> {chip, bases, submetrics} for
-- tf.prof._counters.metric_list: the metrics of chip ("GH100"; none needs a GPU), or
-- of the current GPU. An error where this build or machine has no
-- hardware counters.
function C.counter_catalog(chip, level)
  local key = chip or ""
  local c = catalogs[key]
  if c then return c end
  local ok, bases = pcall(core().counter_names, chip)
  if not ok then error("tf.prof.start{metrics}: " .. strip_where(bases), (level or 1) + 1) end
  local set = {}
  for _, b in ipairs(bases) do set[b] = true end
  local subs = {}
  c = { chip = chip, bases = set,
        submetrics = function(base)
          local s = subs[base]
          if not s then
            s = {}
            local okn, list = pcall(core().counter_names, chip, base)
            if okn then for _, n in ipairs(list) do s[n] = true end end
            subs[base] = s
          end
          return s
        end }
  catalogs[key] = c
  return c
end

-- The occupancy a launch shape can reach on a device, and what limits it:
-- blocks per SM by registers, shared memory, warps and the block limit
-- (registers allocated per warp in units of 256, shared memory in units of
-- 128 bytes plus the per-block reserve); the smallest wins (ties in that
-- order). -> {limiter, blocks_per_sm, theoretical_pct}, nil without limits.
function C.occupancy_limit(rec, limits)
  if not limits or not limits.max_threads_per_sm or limits.max_threads_per_sm <= 0 or not rec.block then return nil end
  local warp = limits.warp_size > 0 and limits.warp_size or 32
  local threads = rec.block[1] * rec.block[2] * rec.block[3]
  if threads <= 0 then return nil end
  local warps = (threads + warp - 1) // warp
  local max_warps = limits.max_threads_per_sm // warp
  local by = {}
  by.warps = max_warps // warps
  by.blocks = limits.max_blocks_per_sm
  if (rec.registers or 0) > 0 and limits.regs_per_sm > 0 then
    local per_warp = ((rec.registers * warp + 255) // 256) * 256
    by.registers = (limits.regs_per_sm // per_warp) // warps
  end
  if limits.shared_per_sm > 0 then
    local shared = (rec.shared_memory or ((rec.static_shared or 0) + (rec.dynamic_shared or 0)))
      + (limits.reserved_shared_per_block or 0)
    shared = ((shared + 127) // 128) * 128
    if shared > 0 then by.shared_memory = limits.shared_per_sm // shared end
  end
  local limiter, blocks
  for _, k in ipairs({ "registers", "shared_memory", "warps", "blocks" }) do
    if by[k] and (blocks == nil or by[k] < blocks) then limiter, blocks = k, by[k] end
  end
  return { limiter = limiter, blocks_per_sm = blocks, theoretical_pct = 100 * blocks * warps / max_warps }
end

--- tf.prof._counters.counter_fields(kernels, ceilings, limits) -> the counter
-- fields of a row made of kernel records (p:records().kernels' tables;
-- those without counters are left out): flops (sum), flops_by
-- {bf16, f16, tf32, fp8, f32, f64}, dram_read, dram_write, dram_bytes
-- (bytes), tflops (flops / their time), gbs (dram_bytes / their time, GB/s),
-- intensity (flops / dram_bytes), roof_share (the achieved rate over the
-- roof at that intensity: min(peak of the precision with the most flops,
-- intensity * ceilings.copy); without flops, gbs over ceilings.copy),
-- tensor_pct, fma_pct, alu_pct, lsu_pct, occupancy_pct (averaged, weighted
-- by kernel time), registers, shared_per_block (time-weighted averages),
-- limiter (the occupancy limiter of most of their time), counted (how
-- many kernels had counters). A field is nil when its metrics were not
-- counted. The time is gpu__time_duration where counted, else the
-- record's. Pure: no GPU needed (ceilings: tf.ceilings.get's table).
function C.counter_fields(kernels, ceilings, limits)
  local f = { counted = 0 }
  local time_ns, by, have = 0, {}, {}
  local pct_sum, pct_w = {}, {}
  local regs, shared, occ_w = 0, 0, 0
  local limiter_ns = {}
  for _, k in ipairs(kernels) do
    local c = k.counters
    if c then
      f.counted = f.counted + 1
      local ns = c[DURATION] or math.max(0, (k.end_ns or 0) - (k.start_ns or 0))
      time_ns = time_ns + ns
      local sass = false
      for _, m in ipairs(M.flop_metrics) do
        local v = c[m[1]]
        if v then
          by[m[2]] = (by[m[2]] or 0) + v * m[3]
          have.flops = true
          sass = sass or m[1]:find("__sass_", 1, true) ~= nil
        end
      end
      -- counted by passes the CUDA cores' instruction counts are missing: the FLOPs are the tensor
      -- pipe's alone
      if have.flops and not sass then have.tensor_only = true end
      for _, key in ipairs({ "dram__bytes_read.sum", "dram__bytes_write.sum" }) do
        if c[key] then have[key] = (have[key] or 0) + c[key] end
      end
      for field, metric in pairs(M.pct_metrics) do
        if c[metric] then
          pct_sum[field] = (pct_sum[field] or 0) + c[metric] * ns
          pct_w[field] = (pct_w[field] or 0) + ns
        end
      end
      if k.registers then
        regs = regs + k.registers * ns
        shared = shared + (k.shared_memory or 0) * ns
        occ_w = occ_w + ns
        local lim = C.occupancy_limit(k, limits)
        if lim then limiter_ns[lim.limiter] = (limiter_ns[lim.limiter] or 0) + ns end
      end
    end
  end
  if f.counted == 0 then return f end
  local secs = time_ns / 1e9
  if have.flops then
    f.flops_by, f.flops = {}, 0
    for _, p in ipairs(M.precisions) do
      f.flops_by[p] = by[p] or 0
      f.flops = f.flops + f.flops_by[p]
    end
    f.tflops = secs > 0 and f.flops / secs / 1e12 or nil
    if have.tensor_only then
      f.flops_tensor_only = true
      if f.flops == 0 then f.flops, f.flops_by, f.tflops = nil, nil, nil end -- not known, not zero
    end
  end
  f.dram_read, f.dram_write = have["dram__bytes_read.sum"], have["dram__bytes_write.sum"]
  if f.dram_read or f.dram_write then
    f.dram_bytes = (f.dram_read or 0) + (f.dram_write or 0)
    f.gbs = secs > 0 and f.dram_bytes / secs / 1e9 or nil
  end
  if f.flops and f.dram_bytes and f.dram_bytes > 0 then f.intensity = f.flops / f.dram_bytes end
  if ceilings and secs > 0 then
    local copy = ceilings.copy and ceilings.copy * 1e9 -- bytes/s
    if f.flops and f.flops > 0 then
      local top, top_flops = nil, -1
      for _, p in ipairs(M.precisions) do
        if f.flops_by[p] > top_flops then top, top_flops = p, f.flops_by[p] end
      end
      local peak = ceilings[top] or (top == "f16" and ceilings.bf16) or nil
      if peak then
        local roof = peak * 1e12
        if copy and f.intensity then roof = math.min(roof, f.intensity * copy) end
        f.roof_share = (f.flops / secs) / roof
        f.roof_precision = top
      end
    elseif f.dram_bytes and copy and copy > 0 then
      f.roof_share = (f.dram_bytes / secs) / copy
    end
  end
  for field in pairs(M.pct_metrics) do
    if pct_w[field] and pct_w[field] > 0 then f[field] = pct_sum[field] / pct_w[field] end
  end
  if occ_w > 0 then
    f.registers, f.shared_per_block = regs / occ_w, shared / occ_w
    local best, best_ns = nil, -1
    for lim, ns in pairs(limiter_ns) do
      if ns > best_ns or (ns == best_ns and lim < best) then best, best_ns = lim, ns end
    end
    if f.occupancy_pct then f.limiter = best end
  end
  return f
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
  a.counting = info.options ~= nil and info.options.metrics ~= nil
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
local function recs_of(items)
  local recs = {}
  for i, item in ipairs(items or {}) do recs[i] = item.rec end
  return recs
end

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
  a.of_instance, a.of_name = of_instance, of_name
  a.name_busy_ns = {}
  for name in pairs(a.names) do a.name_busy_ns[name] = of_name[name] and busy_of(of_name[name]).busy_ns or 0 end
end

local noted_ceilings = false

--- tf.prof._counters.load_ceilings(device) -> require("tf.ceilings").get(device)
-- (device "cuda:0"): the peaks counted rows are compared with; nil, said
-- once on stderr, where tfhost has no tf.ceilings module.
function C.load_ceilings(device)
  local ok, mod = pcall(require, "tf.ceilings")
  if not ok or type(mod) ~= "table" or type(mod.get) ~= "function" then
    if not noted_ceilings then
      noted_ceilings = true
      io.stderr:write("tf.prof: no tf.ceilings module: roof_share is left out\n")
    end
    return nil
  end
  return mod.get(device)
end

-- The ceilings of a counted session's device, loaded on first need.
local function ceilings_of(a)
  if a.ceilings == nil then
    local c = a.info.counters
    a.ceilings = C.load_ceilings("cuda:" .. (c and c.device or 0)) or false
  end
  return a.ceilings or nil
end

-- Adds the counter fields of the kernel records recs to row (when the
-- session counted).
local function add_counters(a, row, recs)
  if not a.counting then return row end
  local f = C.counter_fields(recs, ceilings_of(a), a.info.counters and a.info.counters.limits)
  for k, v in pairs(f) do row[k] = v end
  return row
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
      g = { name = key, class = class, samples = {}, recs = {} }
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
            if a.counting then g.recs[#g.recs + 1] = item.rec end
          end
        end
      else
        local g = by == "class" and group(item.class, item.class) or group(item.name, item.class)
        g.samples[#g.samples + 1] = item.ns
        if a.counting then g.recs[#g.recs + 1] = item.rec end
      end
    end
  end
  local rows, rank = {}, dist_rank()
  for _, g in ipairs(order) do
    local s = g.samples
    table.sort(s)
    local sum = 0
    for _, v in ipairs(s) do sum = sum + v end
    rows[#rows + 1] = add_counters(a, {
      name = g.name, class = g.class, instances = #s, total_ms = sum / 1e6, avg_us = sum / #s / 1e3,
      median_us = median(s) / 1e3, min_us = s[1] / 1e3, max_us = s[#s] / 1e3,
      pct = total > 0 and 100 * sum / total or 0, rank = rank,
    }, g.recs)
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
      rows[#rows + 1] = add_counters(a, {
        id = r.id, name = r.name, parent = r.parent, depth = r.depth, path = r.path,
        start_ms = (r.start_ns - a.info.start_ns) / 1e6, end_ms = (r.end_ns - a.info.start_ns) / 1e6,
        wall_ms = duration_ns(r) / 1e6, gpu_ms = r.gpu_ns / 1e6, busy_ms = r.busy_ns / 1e6, kernels = r.kernels,
        open = r.open, rank = dist_rank(),
      }, recs_of(a.of_instance[r]))
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
  for _, row in ipairs(rows) do
    row.wall_ms, row.gpu_ms = row.wall_ms / 1e6, row.gpu_ms / 1e6
    add_counters(a, row, recs_of(a.of_name[row.name]))
  end
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
  counters = { "name", "class", "instances", { "total_ms", "total ms", "%.3f" }, { "tflops", "TFLOP/s", "%.1f" },
               { "gbs", "GB/s", "%.0f" }, { "intensity", "FLOP/B", "%.1f" }, { "roof_share", "of roof", "%.2f" },
               { "flops", "FLOPs", "%.3g" }, { "dram_bytes", "DRAM B", "%.3g" }, { "tensor_pct", "tensor %", "%.0f" },
               { "fma_pct", "fma %", "%.0f" }, { "alu_pct", "alu %", "%.0f" }, { "lsu_pct", "lsu %", "%.0f" },
               { "occupancy_pct", "occupancy %", "%.0f" }, { "registers", "regs", "%.0f" },
               { "shared_per_block", "shared B", "%.0f" }, "limiter" },
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
-- metrics = "roofline" | "pipes" | "occupancy" | {set or CUPTI metric
-- names...} counts hardware counters of each kernel (CUPTI's range
-- profiler, kernels/cuda/counters.cu): kernels are serialised and replayed
-- once per pass (saving and restoring the device memory in use around
-- each: slow with many GB allocated; tf.prof.count runs the work once a
-- pass instead, by_pass = true with p:next_pass()), the fused engine runs
-- eagerly (no CUDA graph replay), and at most max_kernels (default 1024)
-- kernels are counted: the rest are "lost" (p.counters.lost, said on
-- stderr). Records get counters
-- {metric = value}, p:kernels and p:ranges rows the fields of
-- tf.prof._counters.counter_fields. Where counters cannot be had (a build without
-- CUDA, no GPU, another profiler holding them) it is an error.
-- p.gpu, p.reason (why no GPU records), p.running: read without waiting for the devices.
local properties = {
  -- the ceilings counted rows were compared with (nil without counters or tf.ceilings)
  ceilings = function(p)
    local a = analyse(p)
    return a.counting and ceilings_of(a) or nil
  end,
  -- p:info().counters: how counting went (lost, passes, ...), nil without metrics
  counters = function(p) return p:info().counters end,
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
  if opts and opts.metrics ~= nil then
    C.metric_list(opts.metrics, nil, 2) -- the option's form first, on every build
    if opts.sass ~= nil and type(opts.sass) ~= "boolean" then
      error("tf.prof.start: sass must be true or false, not a " .. type(opts.sass), 2)
    end
    if opts.sass and not opts.by_pass then
      error("tf.prof.start: sass = true goes with by_pass (tf.prof.count): replaying kernels counts the SASS "
        .. "metrics anyway", 2)
    end
    local list = C.metric_list(opts.metrics, C.counter_catalog(nil, 2), 2)
    if opts.by_pass and not opts.sass then
      -- by passes CUPTI counts no SASS instruction metrics (the CUDA cores' FLOPs): they need a pass of
      -- their own that replays each kernel (sass = true), else they are left out and the FLOPs are the
      -- tensor pipe's alone
      local kept = {}
      for _, name in ipairs(list) do
        if not name:find("__sass_", 1, true) then kept[#kept + 1] = name end
      end
      list = kept
    end
    local copy = {}
    for k, v in pairs(opts) do copy[k] = v end
    copy.metrics = list
    copy.sass = nil
    opts = copy
  elseif opts and opts.max_kernels ~= nil then
    error("tf.prof.start: max_kernels is the room for counted kernels: it goes with metrics", 2)
  elseif opts and opts.by_pass then
    error("tf.prof.start: by_pass is how counters are counted: it goes with metrics", 2)
  elseif opts and opts.sass ~= nil then
    error("tf.prof.start: sass is how the SASS metrics are counted by passes: it goes with metrics", 2)
  end
  local p = core().start(opts)
  if not installed then install(p) end
  return p
end

--- tf.prof.count(fn, opts) -> a stopped profile with hardware counters:
-- fn() runs once per pass the metrics need (p.counters.passes: 2 for
-- "roofline" on GH100, 3 with sass = true), under tf.prof.start(opts) with by_pass = true; the records
-- and ranges are those of the first run, each kernel's counters come from
-- all of them. fn must launch the same kernels each time (a training step,
-- a forward pass: the values may change, the work may not); where a run
-- launches other work it is an error. Unlike kernel replay (tf.prof.start
-- {metrics}), no device memory is saved or restored, so the cost is the
-- passes' runs with each kernel serialised, whatever memory is in use; fn's
-- effects happen once per pass (an optimizer step is taken each time). By
-- passes CUPTI counts no SASS instruction metrics (the CUDA cores' FLOPs):
-- they are left out (rows get flops_tensor_only) unless sass = true, which
-- counts them in one more pass that replays each kernel (its cost grows
-- with the device memory in use, as kernel replay's does).
function M.count(fn, opts)
  if type(fn) ~= "function" then error("tf.prof.count: expects a function to run once per pass, then options", 2) end
  if opts ~= nil and type(opts) ~= "table" then error("tf.prof.count: options must be a table", 2) end
  if not (opts and opts.metrics) then
    error("tf.prof.count: metrics are needed (\"roofline\", \"pipes\", \"occupancy\" or metric names)", 2)
  end
  local copy = {}
  for k, v in pairs(opts) do copy[k] = v end
  copy.by_pass = true
  local ok, p = pcall(M.start, copy)
  if not ok then error("tf.prof.count: " .. strip_where(p), 2) end
  local passes = 0
  local ran, err = pcall(function()
    repeat
      fn()
      passes = passes + 1
    until not p:next_pass()
  end)
  if not ran then
    pcall(p.stop, p)
    error(string.format("tf.prof.count: pass %d: %s", passes + 1, strip_where(err)), 2)
  end
  p:stop()
  return p
end

--- tf.prof.stack() -> the names of the open ranges, outermost first.
function M.stack() return core().range_stack() end

return M
