-- tf.prof's hardware counters on a GPU (tf.prof.start{metrics = ...}),
-- checked against work whose counts are known: a bf16 GEMM 4096^3 (FLOPs
-- within 1 % of 2MNK, DRAM reads at least its operands), a device-to-device
-- copy and a copy kernel of N bytes (DRAM reads ~N), an f32 elementwise
-- multiply (f32 FLOPs = numel), a fused-engine training step (every kernel
-- counted or counted as lost, the classes present, no CUDA graph replayed
-- while counting), the pipes and occupancy sets having values, and
-- max_kernels overflowing into "lost", and tf.prof.count (the work run
-- once per pass) agreeing with kernel replay on a fused step's counts, and
-- refusing work that changes between passes. Each pairing of a counted range
-- with its kernel is checked by the counted duration against the record's
-- (p.counters.mismatched). Skipped (77) without a GPU or without CUPTI;
-- a test skips itself when the driver refuses the counters (permissions),
-- saying why. TF_COUNTERS_DEBUG=1 shows every CUPTI call and pairing.
local T = require "harness"
T.require_cuda()
if not tf.prof.available() then T.skip("CUPTI is unavailable: " .. select(2, tf.prof.available())) end
tf.seed(T.fresh_seed())

-- tf.ceilings comes from elsewhere; where it is missing, stand-in H100-like
-- peaks let roof_share be computed (its value is not checked against them).
if not pcall(require, "tf.ceilings") then
  package.loaded["tf.ceilings"] = { get = function(device)
    return { bf16 = 989, fp8 = 1979, tf32 = 494, f32 = 67, f64 = 34, copy = 3000, device = device, driver = "stand-in" }
  end }
end

-- Skips the test where the counters cannot be had (permissions, another
-- profiler), raising other errors.
local function skip_unless_counting(err)
  local e = tostring(err)
  if e:find("administrators") or e:find("another CUDA profiler") or e:find("cannot be counted") then T.skip_test(e) end
  error(e, 0)
end

local function say_counted(p, t0)
  local c = p.counters
  print(string.format("  %d kernels counted, %d lost, %d copies, %d mismatched, %d passes%s; start %.1f ms, read-out "
    .. "%.1f ms, %.2f s in all", c.counted, c.lost, c.copies, c.mismatched, c.passes, c.by_pass and " (by pass)" or "",
    c.start_ns / 1e6, c.stop_ns / 1e6, (tf.now() - t0) / 1e3))
end

-- Runs body under a counting profile (kernel replay).
local function counted(opts, body)
  tf.sync()
  local ok, p = pcall(tf.prof.start, opts)
  if not ok then skip_unless_counting(p) end
  local t0 = tf.now()
  body()
  tf.sync()
  p:stop()
  say_counted(p, t0)
  return p
end

-- Runs body once per pass under tf.prof.count.
local function counted_by_pass(opts, body)
  tf.sync()
  local t0 = tf.now()
  local ok, p = pcall(tf.prof.count, function()
    body()
    tf.sync()
  end, opts)
  if not ok then
    if not tostring(p):find("pass %d") then skip_unless_counting(p) end
    error(p, 0)
  end
  say_counted(p, t0)
  return p
end

local function find(rows, key, value)
  for _, r in ipairs(rows) do
    if r[key] == value then return r end
  end
end

local function rel(a, b) return math.abs(a - b) / math.abs(b) end

T.test("a bf16 GEMM 4096^3: FLOPs within 1 % of 2MNK, DRAM reads at least the operands", function()
  local n = 4096
  local a = tf.randn({ n, n }, { device = "cuda", dtype = "bf16" })
  local b = tf.randn({ n, n }, { device = "cuda", dtype = "bf16" })
  tf.matmul(a, b) -- the plan chosen and cached before counting
  local c
  local p = counted({ metrics = "roofline" }, function() c = tf.matmul(a, b) end)
  T.eq(p.counters.lost, 0)
  T.eq(p.counters.mismatched, 0)
  local rows = p:kernels{ by = "class" }
  local gemm = find(rows, "name", "gemm")
  T.ok(gemm, "a gemm row")
  print(string.format("  gemm: %.4g FLOPs (bf16 %.4g), %.1f TFLOP/s, read %.3g B, written %.3g B, %.1f FLOP/B, "
    .. "%.2f of the roof", gemm.flops, gemm.flops_by.bf16, gemm.tflops, gemm.dram_read, gemm.dram_write,
    gemm.intensity, gemm.roof_share or -1))
  T.ok(rel(gemm.flops, 2 * n * n * n) < 0.01, "flops within 1 % of 2MNK")
  T.ok(gemm.flops_by.bf16 > 0.99 * gemm.flops, "bf16 tensor FLOPs dominate")
  T.ok(gemm.dram_read >= 0.99 * 2 * n * n * 2, "DRAM reads at least A and B")
  T.ok(gemm.dram_bytes >= gemm.dram_read)
  T.ok(gemm.tflops > 0 and gemm.gbs > 0)
  T.ok(gemm.roof_share and gemm.roof_share > 0 and gemm.roof_share < 1.5, "a share of the roof")
  T.ok(p.ceilings and p.ceilings.bf16, "the profile carries its ceilings")
  local rec = p:records().kernels
  for _, k in ipairs(rec) do T.ok(k.counters, k.short_name .. " has counters") end
  T.ok(c)
end)

T.test("copies of N bytes: DRAM reads ~N, on the copy's record and on a copy kernel", function()
  local numel = 1 << 26 -- 256 MB in f32: past the L2
  local x = tf.randn({ numel }, { device = "cuda" })
  local y, z
  local sq = tf.randn({ 8192, 8192 }, { device = "cuda" })
  local p = counted({ metrics = "roofline" }, function()
    y = x:clone() -- a device-to-device cudaMemcpy
    z = sq:t():contiguous() -- a copy kernel
  end)
  local rec = p:records()
  local copy
  for _, c in ipairs(rec.memcpy) do
    if c.kind == "DtoD" and c.bytes == numel * 4 then copy = c end
  end
  T.ok(copy, "the DtoD copy's record")
  T.ok(copy and copy.counters, "the DtoD copy's counters")
  if copy and copy.counters then
    local read = copy.counters["dram__bytes_read.sum"]
    print(string.format("  the DtoD copy of %d bytes: read %.4g B", numel * 4, read))
    T.ok(rel(read, numel * 4) < 0.05, "the copy reads ~N bytes")
    T.eq(p.counters.copies, 1)
  end
  T.eq(p.counters.unpaired, 0)
  local kernel_row = find(p:kernels{ by = "class", copies = false }, "name", "copy")
  T.ok(kernel_row, "a copy kernel")
  do
    print(string.format("  the transposing copy of %d bytes: read %.4g B, wrote %.4g B, %.0f GB/s", numel * 4,
      kernel_row.dram_read, kernel_row.dram_write, kernel_row.gbs))
    -- the transposing read touches each 32-byte sector for 4 of its bytes at a time: it may read
    -- more than N from DRAM (about 2.8 N on an H200), never less; the write is dense
    T.ok(kernel_row.dram_read >= 0.95 * 8192 * 8192 * 4, "the copy kernel reads at least N bytes")
    T.ok(rel(kernel_row.dram_write, 8192 * 8192 * 4) < 0.1, "the copy kernel writes ~N bytes")
    print(string.format("  its FLOPs: %.4g", kernel_row.flops or 0))
  end
  T.eq(p.counters.lost, 0)
  T.ok(y and z)
end)

T.test("an f32 elementwise multiply: f32 FLOPs = numel", function()
  local numel = 1 << 24
  local a = tf.randn({ numel }, { device = "cuda" })
  local b = tf.randn({ numel }, { device = "cuda" })
  local c
  local p = counted({ metrics = { "roofline" } }, function() c = a * b end)
  local rows = p:kernels()
  T.eq(#rows, 1)
  local r = rows[1]
  print(string.format("  %s: f32 %.6g FLOPs (numel %d), read %.4g B", r.name, r.flops_by.f32, numel, r.dram_read))
  T.ok(rel(r.flops_by.f32, numel) < 1e-3, "one FMUL per element")
  T.ok(rel(r.dram_read, 2 * numel * 4) < 0.1, "reads both operands")
  T.ok(c)
end)

T.test("a fused-engine training step: every kernel counted or lost, the classes present, no graph replayed", function()
  tf.seed(0)
  local m = tf.model.new{ preset = "tiny", context_length = 64, precision = "bf16", impl = "fused", device = "cuda" }
  local ids = tf.randint(0, 256, { 2, 64 }, { device = "cuda" })
  local targets = tf.randint(0, 256, { 2, 64 }, { device = "cuda" })
  for _ = 1, 3 do m:step(ids, targets):free() end -- graphs captured and replayed
  local before = m:info().graph_replays
  local p = counted({ metrics = "roofline" }, function() m:step(ids, targets):free() end)
  T.eq(m:info().graph_replays, before, "no CUDA graph replayed while counting")
  local rec = p:records()
  local with = 0
  for _, k in ipairs(rec.kernels) do if k.counters then with = with + 1 end end
  T.eq(with, p.counters.counted)
  T.eq(p.counters.counted + p.counters.lost, #rec.kernels, "every kernel counted or counted as lost")
  T.eq(p.counters.lost, 0)
  T.eq(p.counters.mismatched, 0)
  local classes = {}
  for _, r in ipairs(p:kernels{ by = "class" }) do classes[r.name] = r end
  for _, cls in ipairs({ "gemm", "norm", "optimizer" }) do T.ok(classes[cls], "class " .. cls) end
  T.ok(classes.attention or classes.softmax, "attention (or its softmax)")
  if classes.gemm then T.ok(classes.gemm.flops > 0, "the step's GEMMs have FLOPs") end
  m:step(ids, targets):free()
  T.ok(m:info().graph_replays > before, "graphs replayed again once counting stopped")
end)

-- The per-class sums of a counted step: flops, and dram bytes.
local function class_counts(p)
  local out = {}
  for _, r in ipairs(p:kernels{ by = "class" }) do
    out[r.name] = { flops = r.flops, bytes = r.dram_bytes, instances = r.instances, tensor_only = r.flops_tensor_only }
  end
  return out
end

T.test("tf.prof.count: a fused step run once a pass counts what kernel replay counts", function()
  tf.seed(0)
  local m = tf.model.new{ preset = "tiny", context_length = 64, precision = "bf16", impl = "fused", device = "cuda" }
  local ids = tf.randint(0, 256, { 2, 64 }, { device = "cuda" })
  local targets = tf.randint(0, 256, { 2, 64 }, { device = "cuda" })
  for _ = 1, 3 do m:step(ids, targets):free() end
  local replayed = counted({ metrics = "roofline" }, function() m:step(ids, targets):free() end)
  local steps_before = m:info().steps
  local by_pass = counted_by_pass({ metrics = "roofline" }, function()
    tf.range("step", function() m:step(ids, targets):free() end)
  end)
  local c = by_pass.counters
  T.ok(c.by_pass)
  T.ok(c.passes >= 2, "the metrics need more than one pass")
  if steps_before then T.eq(m:info().steps - steps_before, c.passes, "one step a pass") end
  T.eq(c.lost, 0)
  T.eq(c.unpaired, 0)
  T.eq(c.mismatched, 0)
  -- replaying kernels, tfhost's memsets run as a kernel (class "memset"): by passes they stay memsets
  local replayed_memsets = (class_counts(replayed).memset or { instances = 0 }).instances
  T.eq(c.counted, replayed.counters.counted - replayed_memsets, "as many kernels counted as by replay")
  T.ok(c.launches >= c.counted + c.copies, "the first pass's launches include the counted ones")
  local step_row = find(by_pass:ranges(), "name", "step")
  T.ok(step_row, "the range of the step")
  T.eq(step_row and step_row.instances, 1, "the first pass's ranges alone")
  -- by passes, by default, the FLOPs are the tensor pipe's alone (CUPTI counts no SASS instructions
  -- then): the GEMMs' agree with replay's, the classes without tensor work have none rather than zero;
  -- with sass = true a last pass replays each kernel for the SASS metrics, and every class's FLOPs
  -- agree with kernel replay's
  local with_sass = counted_by_pass({ metrics = "roofline", sass = true }, function()
    m:step(ids, targets):free()
  end)
  T.eq(with_sass.counters.passes, c.passes + 1, "one more pass for the SASS metrics")
  T.eq(with_sass.counters.mismatched, 0)
  T.eq(with_sass.counters.sass_left_out, nil, "the SASS pass's values kept")
  local a, b, d = class_counts(replayed), class_counts(by_pass), class_counts(with_sass)
  a.memset = nil
  for cls, x in pairs(a) do
    local y, z = b[cls], d[cls]
    T.ok(y and z, "class " .. cls .. " counted by pass, and by pass with sass")
    if y and z then
      T.eq(y.instances, x.instances, cls .. " kernels")
      T.eq(z.instances, x.instances, cls .. " kernels, with sass")
      if y.flops then T.ok(y.tensor_only, cls .. ": tensor-pipe FLOPs only") end
      if cls == "gemm" then T.ok(y.flops and rel(y.flops, x.flops) < 1e-3, "the GEMMs' FLOPs agree") end
      if cls == "norm" or cls == "optimizer" then T.eq(y.flops, nil, cls .. ": FLOPs not known by passes") end
      T.ok(not z.tensor_only, cls .. ": with sass, the CUDA cores' FLOPs counted too")
      if x.flops and x.flops > 0 then
        T.ok(z.flops and rel(z.flops, x.flops) < 1e-3, cls .. ": with sass, FLOPs agree with replay's")
      else
        T.ok((z.flops or 0) == (x.flops or 0), cls .. ": no FLOPs, as replayed")
      end
      print(string.format("  %-12s FLOPs %s / %s / %.4g, DRAM %.4g / %.4g B (by pass / with sass / replayed)", cls,
        y.flops and string.format("%.4g", y.flops) or "-", z.flops and string.format("%.4g", z.flops) or "-",
        x.flops or 0, y.bytes or 0, x.bytes or 0))
    end
  end
end)

T.test("tf.prof.count: work that changes between passes is refused", function()
  local x = tf.randn({ 1024 }, { device = "cuda" })
  local runs = 0
  local ok, err = pcall(tf.prof.count, function()
    runs = runs + 1
    for _ = 1, runs do x = x + 1 end -- one kernel more each pass
    tf.sync()
  end, { metrics = "roofline" })
  if not ok and not tostring(err):find("pass %d") then skip_unless_counting(err) end
  T.ok(not ok, "refused")
  T.ok(tostring(err):find("same work in every pass"), tostring(err))
  T.ok(tostring(err):find("pass 1 launched 1"), tostring(err))
  local p = tf.prof.start()
  x = x + 1
  p:stop()
  T.ok(#p:records().kernels >= 1, "a time-only profile after the refusal has its records")
end)

T.test("the pipes and occupancy sets have values", function()
  local n = 2048
  local a = tf.randn({ n, n }, { device = "cuda", dtype = "bf16" })
  tf.matmul(a, a)
  local p = counted({ metrics = { "pipes", "occupancy" } }, function() tf.matmul(a, a) end)
  local gemm = find(p:kernels{ by = "class" }, "name", "gemm")
  T.ok(gemm, "a gemm row")
  print(string.format("  gemm: tensor %.0f %%, fma %.0f %%, alu %.0f %%, lsu %.0f %%, occupancy %.0f %%, %.0f registers, "
    .. "%.0f B shared a block, limited by %s", gemm.tensor_pct, gemm.fma_pct, gemm.alu_pct, gemm.lsu_pct,
    gemm.occupancy_pct, gemm.registers, gemm.shared_per_block, tostring(gemm.limiter)))
  T.ok(gemm.tensor_pct > 10, "the tensor pipe is busy")
  T.ok(gemm.fma_pct >= 0 and gemm.alu_pct >= 0 and gemm.lsu_pct >= 0)
  T.ok(gemm.occupancy_pct > 0)
  T.ok(gemm.registers > 0)
  T.ok(gemm.limiter, "an occupancy limiter")
  T.eq(gemm.flops, nil) -- roofline not counted
  T.eq(p.counters.passes, 1)
end)

T.test("max_kernels overflowing: the kernels past it are lost, and said", function()
  local x = tf.randn({ 1024 }, { device = "cuda" })
  local p = counted({ metrics = "occupancy", max_kernels = 4 }, function()
    for _ = 1, 10 do x = x + 1 end
  end)
  local rec = p:records()
  T.ok(#rec.kernels >= 10)
  T.ok(p.counters.counted <= 4)
  T.eq(p.counters.counted + p.counters.lost, #rec.kernels)
  T.ok(p.counters.lost >= 6)
  T.eq(p:info().options.max_kernels, 4)
end)

T.test("time-only profiles are unchanged: no counters, graphs replayed", function()
  local x = tf.randn({ 1024 }, { device = "cuda" })
  tf.sync()
  local p <close> = tf.prof.start()
  x = x + 1
  p:stop()
  T.eq(p:info().counters, nil)
  for _, k in ipairs(p:records().kernels) do T.eq(k.counters, nil) end
  T.eq(p:kernels()[1].flops, nil)
end)

T.run()
