--- Memory profile of the Transformer LM (CS336 memory_profiling, parts a-e):
-- the peak memory of forward-only and full training steps for each context
-- length and precision, where the peak comes from (parameters, gradients,
-- optimizer state, activations, workspace, temporaries), a PyTorch-format
-- snapshot (open it at pytorch.org/memory_viz) and an HTML timeline for each
-- configuration, the size of one residual-stream activation and the largest
-- allocations with their origin.
--
--   tfhost experiments/memory_profile.lua                        (2.7B, ctx 128,256,512, f32+bf16; tiny on a CPU)
--   tfhost experiments/memory_profile.lua --size tiny --context 32 --out /tmp/mem   (a quick CPU run)
local opt = tf.options{
  description = "Peak memory, snapshots and timelines of the Transformer LM's forward pass and training step.",
  { "size", "model size (small, medium, large, xl, 2.7B; tiny for a quick CPU run)", default = "2.7B", cpu = "tiny" },
  { "context", "context lengths", default = "128,256,512", cpu = "32,64", type = "list:int", min = 1 },
  { "precision", "precisions", default = "f32,bf16", type = "list", choices = { "f32", "bf16", "f16" } },
  { "mode", "what to profile", default = "forward,step", type = "list", choices = { "forward", "step" } },
  { "batch", "batch size", default = 4, min = 1 },
  { "vocab", "vocabulary size", default = 10000, min = 1 },
  { "impl", "model implementation (default: fused when built in)", type = "string", choices = { "fused", "eager" } },
  { "out", "folder for the snapshots (.pickle) and timelines (.html); empty: none", default = "memory_profile" },
  { "top", "how many of the largest allocations to list", default = 8, min = 0 },
  { "memory_limit", "cap the device memory tfhost may reserve, in GiB (0: none)", default = 0.0, min = 0 },
  { "json", "write the rows (as each configuration finishes) and the environment to this file", type = "string" },
  { "plot", "draw the peak and what it is made of against context length into this file (.svg or .html)",
    type = "string" },
}
if not tf.model.presets[opt.size] then tf.exit(2, "memory_profile.lua: unknown size '" .. opt.size .. "'\n") end
if opt.memory_limit > 0 then tf.mem.set_limit(math.floor(opt.memory_limit * 2 ^ 30)) end
if opt.out ~= "" then
  tf.mkdir(opt.out)
end

local GiB = 2 ^ 30
local tags = { "parameter", "gradient", "optimizer state", "activation", "workspace", "temporary" }
local bytes = tf.units.bytes

local function release(m)
  if m and m.engine then m.engine:free() end
  tf.mem.empty_cache()
end

-- One configuration: a model made while recording, one warm-up run (the
-- optimizer state appears there), then the measured run; its peak, its
-- snapshot and its picture.
local function profile(ctx, precision, mode)
  local row = { size = opt.size, context = ctx, precision = precision, mode = mode, batch = opt.batch }
  local m
  tf.mem.record{ max_entries = 1 << 22 }
  local ok, err = pcall(function()
    tf.seed(0)
    m = tf.model.new{ preset = opt.size, context_length = ctx, vocab_size = opt.vocab, precision = precision,
      impl = opt.impl }
    row.impl = m.impl
    local ids = tf.randint(0, opt.vocab, { opt.batch, ctx })
    local targets = tf.randint(0, opt.vocab, { opt.batch, ctx })
    local function run()
      if mode == "forward" then
        tf.no_grad(function() m:forward(ids):free() end)
      else
        m:step(ids, targets):free()
      end
      tf.sync()
    end
    tf.range("warm-up", run)
    collectgarbage()
    tf.mem.reset_peak()
    tf.range(mode, run)
    row.peak_gib = tf.mem.stats().peak_allocated / GiB
  end)
  local t0 = tf.now()
  local snap = tf.mem.snapshot()
  tf.mem.record(false)
  if not ok then
    if not tf.mem.is_oom(err) then error(err, 0) end
    row.oom = true
    row.impl = row.impl or opt.impl or (tf._model and "fused" or "eager")
  end
  local name = string.format("%s/%s_ctx%d_%s_%s", opt.out, opt.size, ctx, precision, mode)
  if opt.out ~= "" then
    row.snapshot = tf.mem.dump(name .. ".pickle", snap)
    row.timeline = tf.mem.plot(name .. ".html", {
      snapshot = snap,
      title = string.format("%s, context %d, %s, %s%s", opt.size, ctx, precision, mode, row.oom and " (OOM)" or ""),
    })
  end
  row.write_s = (tf.now() - t0) / 1e3
  if not row.oom then
    local summary = tf.mem.summary(snap)
    row.at_peak = {}
    for _, tag in ipairs(tags) do row.at_peak[tag] = (summary.by_tag[tag] or 0) / GiB end
    -- (d) one residual-stream activation: batch x context x d_model in f32
    local resid = opt.batch * ctx * m.config.d_model * 4
    row.residual_bytes, row.residual_found = resid, 0
    local largest = {}
    for _, e in ipairs(snap.trace) do
      if e.action == "alloc" then
        if e.size == resid then row.residual_found = row.residual_found + 1 end
        largest[#largest + 1] = e
      end
    end
    table.sort(largest, function(a, b) return a.size > b.size end)
    local state = { parameter = true, gradient = true, ["optimizer state"] = true }
    local function top(keep)
      local out = {}
      for _, e in ipairs(largest) do
        if #out == opt.top then break end
        if keep(e) then
          out[#out + 1] = { bytes = e.size, tag = e.tag, what = e.what or "?", source = e.source or "?",
            ranges = table.concat(e.ranges or {}, "/") }
        end
      end
      return out
    end
    row.largest = top(function() return true end)
    row.largest_activations = top(function(e) return not state[e.tag] end)
  end
  release(m)
  return row
end

local rows, costs = {}, {}
for _, ctx in ipairs(opt.context) do
  for _ = 1, #opt.precision * #opt.mode do costs[#costs + 1] = ctx end
end
local sweep = tf.report.sweep{ total = #costs, json = opt.json, results = rows, costs = costs,
  extra = { key = { "size", "context", "precision", "mode", "impl", "batch" }, metrics = { "peak_gib" } } }
for _, ctx in ipairs(opt.context) do
  for _, precision in ipairs(opt.precision) do
    for _, mode in ipairs(opt.mode) do
      sweep:start("%s ctx %d %s %s", opt.size, ctx, precision, mode)
      local row = profile(ctx, precision, mode)
      rows[#rows + 1] = row
      sweep:done(string.format("%s; snapshot and timeline written in %.2f s", row.oom and "OOM" or "done",
        row.write_s))
    end
  end
end

print(string.format("## (a, b, c) Peak memory: %s model, batch %d, device %s\n", opt.size, opt.batch, tf.device()))
local function gib(v, row) return row.oom and "OOM" or bytes(v * GiB) end
local function at(tag)
  return { "at_peak", tag, function(v, row) return row.oom and "" or bytes(v[tag] * GiB) end }
end
tf.report.table(rows, {
  columns = { { "context", "ctx" }, { "precision", "prec" }, "mode", "impl", { "peak_gib", "peak", gib },
    at("parameter"), at("gradient"), at("optimizer state"), at("activation"), at("workspace"), at("temporary"),
    { "write_s", "write s", "%.2f" } },
})
print("\nThe tag columns are what was live at the peak moment of the recorded history. (a) is each configuration's "
  .. "snapshot and timeline (the files listed at the end), (b) the peak by context and mode, (c) the precision "
  .. "column: f32 against mixed precision at each context.")

local ref
for _, r in ipairs(rows) do
  if not r.oom and r.mode == "step" then ref = r end
end
ref = ref or rows[#rows]
if ref and not ref.oom then
  print(string.format("\n## (d) One residual-stream activation at context %d\n", ref.context))
  print(string.format("batch %d x context %d x d_model %d x 4 bytes (f32) = %s; allocations of exactly that size in "
    .. "the %s %s history: %d", ref.batch, ref.context, ref.residual_bytes // (ref.batch * ref.context * 4),
    bytes(ref.residual_bytes), ref.precision, ref.mode, ref.residual_found))
  print(string.format("\n## (e) The %d largest allocations (context %d, %s, %s)\n", #ref.largest, ref.context,
    ref.precision, ref.mode))
  local columns = { { "bytes", "size", function(v) return bytes(v) end }, "tag", "what", "ranges", "source" }
  tf.report.table(ref.largest, { columns = columns })
  print(string.format("\nThe %d largest beside parameters, gradients and optimizer state:\n",
    #ref.largest_activations))
  tf.report.table(ref.largest_activations, { columns = columns })
end
if opt.out ~= "" then
  print(string.format("\nSnapshots (.pickle: open at pytorch.org/memory_viz) and timelines (.html) are in %s/",
    opt.out))
end
sweep:finish()
if opt.plot then
  -- the peak, then each tag's GiB at the peak (columns named <tag>_gib)
  local prows, ys = {}, { "peak_gib" }
  for _, tag in ipairs(tags) do ys[#ys + 1] = tag:gsub(" ", "_") .. "_gib" end
  for _, r in ipairs(rows) do
    local p = { context = r.context, precision = r.precision, mode = r.mode, impl = r.impl, oom = r.oom,
      peak_gib = r.peak_gib }
    for _, tag in ipairs(tags) do p[tag:gsub(" ", "_") .. "_gib"] = r.at_peak and r.at_peak[tag] end
    prows[#prows + 1] = p
  end
  tf.plot.sweep(opt.plot, prows, { x = { "context" }, y = ys, series = { "precision", "mode", "impl" },
    title = string.format("Memory at the peak, %s model, batch %d", opt.size, opt.batch) })
  print("wrote " .. opt.plot)
end
