-- tf.prof's hardware counters without a GPU: the metrics option (sets,
-- raw names, repeats, bad types, unknown sets and names with the near
-- ones), the sets checked against GH100's metrics where the build has
-- CUPTI (its host API needs no GPU), the clear error where counters
-- cannot be had (a build without CUDA, a machine without a GPU), and the
-- fields derived from counted records (FLOPs by precision, bytes, rates,
-- intensity, the share of the roof, time-weighted utilisations, the
-- occupancy limiter) fed with stand-in records and a stand-in tf.ceilings.
local T = require "harness"
local C = tf.prof._counters

local function err_of(fn, ...)
  local ok, e = pcall(fn, ...)
  T.ok(not ok, "expected an error")
  return tostring(e)
end

local function has(list, name)
  for _, v in ipairs(list) do if v == name then return true end end
  return false
end

T.test("sets expand, without repeats, in order", function()
  local roof = C.metric_list("roofline")
  T.eq(#roof, #tf.prof.metric_sets.roofline)
  T.eq(roof[1], "dram__bytes_read.sum")
  local all = C.metric_list({ "roofline", "pipes", "occupancy", "gpu__time_duration.sum", "x__y.sum" })
  local seen = {}
  for _, n in ipairs(all) do
    T.ok(not seen[n], "repeated " .. n)
    seen[n] = true
  end
  T.ok(seen["sm__warps_active.avg.pct_of_peak_sustained_active"])
  T.ok(seen["sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_active"])
  T.eq(all[#all], "x__y.sum") -- a raw name passes when no chip checks it
  T.eq(C.metric_list({ "dram__bytes_read.sum" }), { "dram__bytes_read.sum" })
end)

T.test("bad metrics options are errors that say what is accepted", function()
  T.ok(err_of(C.metric_list, 3):find("metrics must be a set name %(occupancy, pipes, roofline%)"))
  T.ok(err_of(C.metric_list, { "roofline", 4 }):find("metrics%[2%] must be a set or metric name"))
  T.ok(err_of(C.metric_list, {}):find("empty list"))
  T.ok(err_of(C.metric_list, { roofline = true }):find("list of names"))
  local e = err_of(C.metric_list, "roofine")
  T.ok(e:find("unknown metric set 'roofine'") and e:find("did you mean roofline%?"), e)
  T.ok(err_of(tf.prof.start, { max_kernels = 10 }):find("goes with metrics"))
  T.ok(err_of(tf.prof.start, { metrics = true }):find("metrics must be a set name"))
  T.ok(err_of(tf.prof.start, { sass = true }):find("goes with metrics"))
  T.ok(err_of(tf.prof.start, { metrics = "roofline", sass = 1 }):find("sass must be true or false"))
  T.ok(err_of(tf.prof.start, { metrics = "roofline", sass = true }):find("goes with by_pass"))
  T.ok(err_of(tf.prof.count, function() end, { metrics = "roofline", sass = "yes" }):find("sass must be true or false"))
  -- the C side checks what reaches it, before it tries to count
  T.ok(err_of(tf._prof.start, { metrics = { "a__b.sum" }, max_kernels = 0 }):find("max_kernels must be an integer"))
  T.ok(err_of(tf._prof.start, { metrics = { 1 } }):find("metric 1 is not a name"))
  T.ok(err_of(tf._prof.start, { metrics = "roofline" }):find("metrics must be a list"))
  T.ok(err_of(tf._prof.start, { metric = "roofline" }):find("unknown option 'metric'"))
end)

-- A stand-in chip: two base metrics with their rollups.
local fake = {
  chip = "FAKE1",
  bases = { dram__bytes_read = true, gpu__time_duration = true },
  submetrics = function(base)
    if base == "dram__bytes_read" then return { [".sum"] = true, [".avg"] = true, [".sum.per_second"] = true } end
    return { [".sum"] = true }
  end,
}

T.test("raw names are checked against the chip, with the near names", function()
  local e = err_of(C.metric_list, { "dram__bytes_reed.sum" }, fake)
  T.ok(e:find("unknown metric 'dram__bytes_reed.sum' on FAKE1") and e:find("near: dram__bytes_read"), e)
  e = err_of(C.metric_list, { "dram__bytes_read" }, fake)
  T.ok(e:find("needs a rollup") and e:find("dram__bytes_read.sum"), e)
  e = err_of(C.metric_list, { "dram__bytes_read.summ" }, fake)
  T.ok(e:find("has no submetric '.summ'") and e:find("near: dram__bytes_read.sum"), e)
  T.eq(C.metric_list({ "dram__bytes_read.sum.per_second" }, fake), { "dram__bytes_read.sum.per_second" })
  -- a set's metrics the chip lacks are left out (and said on stderr)
  T.eq(C.metric_list("occupancy", fake), { "gpu__time_duration.sum" })
end)

T.test("the sets' metrics exist on GH100 (CUPTI's host API, no GPU needed)", function()
  if not tf.cuda.compiled() then T.skip_test("this tfhost was built without CUDA") end
  local c = C.counter_catalog("GH100")
  for set, names in pairs(tf.prof.metric_sets) do
    for _, name in ipairs(names) do
      local base, sub = name:match("^([^.]+)(.*)$")
      T.ok(c.bases[base], set .. ": " .. base .. " on GH100")
      T.ok(c.submetrics(base)[sub], set .. ": " .. name .. " on GH100")
    end
  end
  local extra = { "sm__ops_path_tensor_src_fp16.sum", "sm__ops_path_tensor_src_fp64.sum" }
  T.eq(C.metric_list(extra, c), extra)
  local e = err_of(C.metric_list, { "sm__ops_path_tensor_src_bf16.sum" }, c)
  T.ok(e:find("near: sm__ops_path_tensor_src_bf16_dst_fp32"), e)
  T.ok(err_of(C.counter_catalog, "NOSUCHCHIP"):find("no counters are known for chip 'NOSUCHCHIP'"))
end)

T.test("without counters to read, metrics are a clear error", function()
  if tf.cuda.device_count() > 0 then
    T.skip_test("a GPU is present (test_prof_counters.lua counts on it)")
  end
  local e = err_of(tf.prof.start, { metrics = "roofline" })
  T.ok(e:find("no hardware counters"), e)
  T.ok(e:find(tf.cuda.compiled() and "no CUDA device is present" or "built without CUDA"), e)
  local p <close> = tf.prof.start() -- the time-only profile is unchanged
  T.eq(p:info().options.metrics, nil)
  T.eq(p.counters, nil)
  p:stop()
end)

-- Stand-in ceilings (TFLOP/s, GB/s) and H100-like limits.
local CEIL = { bf16 = 1000, fp8 = 2000, tf32 = 500, f32 = 60, f64 = 30, copy = 4000, device = "fake" }
local LIMITS = { sm_count = 132, warp_size = 32, max_threads_per_sm = 2048, max_blocks_per_sm = 32,
                 max_threads_per_block = 1024, regs_per_sm = 65536, regs_per_block = 65536,
                 shared_per_sm = 233472, shared_per_block_optin = 232448, reserved_shared_per_block = 1024 }

local function near(a, b, rel, msg)
  T.ok(math.abs(a - b) <= rel * math.abs(b), string.format("%s: %.6g vs %.6g", msg or "near", a, b))
end

local function kernel(counters, extra)
  local k = { start_ns = 0, end_ns = 2000000, registers = 128, shared_memory = 0, block = { 256, 1, 1 },
              grid = { 132, 1, 1 }, counters = counters }
  for key, v in pairs(extra or {}) do k[key] = v end
  return k
end

T.test("a bf16 GEMM's fields: FLOPs, bytes, rates, intensity, roof share", function()
  local M, N, K = 4096, 4096, 4096
  local flops = 2 * M * N * K
  local f = C.counter_fields({ kernel({
    ["sm__ops_path_tensor_src_bf16_dst_fp32.sum"] = flops, ["sm__ops_path_tensor_src_tf32_dst_fp32.sum"] = 0,
    ["sm__ops_path_tensor_src_fp8.sum"] = 0, ["sm__sass_thread_inst_executed_op_ffma_pred_on.sum"] = 1000,
    ["dram__bytes_read.sum"] = 3e8, ["dram__bytes_write.sum"] = 1e8, ["gpu__time_duration.sum"] = 1e6,
  }) }, CEIL, LIMITS)
  T.eq(f.counted, 1)
  T.eq(f.flops_by.bf16, flops)
  T.eq(f.flops_by.f32, 2000)
  T.eq(f.flops_by.fp8, 0)
  T.eq(f.flops, flops + 2000)
  T.eq(f.dram_read, 3e8)
  T.eq(f.dram_bytes, 4e8)
  near(f.tflops, (flops + 2000) / 1e-3 / 1e12, 1e-12, "tflops (from the counted 1 ms, not the record's 2 ms)")
  near(f.gbs, 400, 1e-12, "gbs")
  near(f.intensity, (flops + 2000) / 4e8, 1e-12, "intensity")
  -- intensity ~344 FLOP/B: the roof is the bf16 peak (344 * 4 TB/s > 1 PFLOP/s)
  near(f.roof_share, (flops + 2000) / 1e-3 / 1000e12, 1e-12, "roof_share")
  T.eq(f.roof_precision, "bf16")
  T.eq(f.tensor_pct, nil) -- pipes were not counted
end)

T.test("an f32 elementwise kernel and a copy: FLOPs by instruction, the bandwidth roof", function()
  local n = 1 << 20
  local mul = kernel({
    ["sm__sass_thread_inst_executed_op_ffma_pred_on.sum"] = 0, ["sm__sass_thread_inst_executed_op_fadd_pred_on.sum"] = 0,
    ["sm__sass_thread_inst_executed_op_fmul_pred_on.sum"] = n, ["dram__bytes_read.sum"] = 8 * n,
    ["dram__bytes_write.sum"] = 4 * n, ["gpu__time_duration.sum"] = 5000,
  })
  local f = C.counter_fields({ mul }, CEIL, LIMITS)
  T.eq(f.flops_by.f32, n)
  near(f.intensity, 1 / 12, 1e-12, "intensity")
  -- memory-bound: the roof is intensity * copy bandwidth
  near(f.roof_share, (n / 5e-6) / (f.intensity * 4000e9), 1e-12, "roof_share")
  local mixed = C.counter_fields({ kernel({
    ["sm__sass_thread_inst_executed_op_ffma_pred_on.sum"] = 10, ["sm__sass_thread_inst_executed_op_fadd_pred_on.sum"] = 5,
    ["sm__sass_thread_inst_executed_op_fmul_pred_on.sum"] = 3, ["sm__sass_thread_inst_executed_op_dfma_pred_on.sum"] = 2,
    ["sm__sass_thread_inst_executed_op_hfma_pred_on.sum"] = 1, ["sm__ops_path_tensor_src_fp16.sum"] = 100,
  }) })
  T.eq(mixed.flops_by.f32, 28)
  T.eq(mixed.flops_by.f64, 4)
  T.eq(mixed.flops_by.f16, 102)
  T.eq(mixed.dram_bytes, nil)
  T.eq(mixed.roof_share, nil) -- no ceilings given
  near(mixed.tflops, 134 / 2e-3 / 1e12, 1e-12, "tflops from the record's time without a duration metric")
  local copy = C.counter_fields({ kernel({
    ["sm__sass_thread_inst_executed_op_ffma_pred_on.sum"] = 0, ["dram__bytes_read.sum"] = 1e9,
    ["dram__bytes_write.sum"] = 1e9, ["gpu__time_duration.sum"] = 1e6,
  }) }, CEIL)
  T.eq(copy.flops, 0)
  near(copy.gbs, 2000, 1e-12, "gbs")
  near(copy.roof_share, 0.5, 1e-12, "a copy's share of the copy bandwidth")
end)

T.test("rows sum FLOPs and bytes and weight utilisations by time; uncounted kernels are left out", function()
  local a = kernel({ ["sm__ops_path_tensor_src_bf16_dst_fp32.sum"] = 100, ["dram__bytes_read.sum"] = 10,
                     ["dram__bytes_write.sum"] = 0, ["gpu__time_duration.sum"] = 1000,
                     ["sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_active"] = 80,
                     ["sm__warps_active.avg.pct_of_peak_sustained_active"] = 10 })
  local b = kernel({ ["sm__ops_path_tensor_src_bf16_dst_fp32.sum"] = 300, ["dram__bytes_read.sum"] = 30,
                     ["dram__bytes_write.sum"] = 20, ["gpu__time_duration.sum"] = 3000,
                     ["sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_active"] = 40,
                     ["sm__warps_active.avg.pct_of_peak_sustained_active"] = 30 }, { registers = 24 })
  local uncounted = kernel(nil)
  local f = C.counter_fields({ a, b, uncounted }, CEIL, LIMITS)
  T.eq(f.counted, 2)
  T.eq(f.flops, 400)
  T.eq(f.dram_bytes, 60)
  near(f.tensor_pct, (80 * 1000 + 40 * 3000) / 4000, 1e-12, "tensor_pct")
  near(f.occupancy_pct, (10 * 1000 + 30 * 3000) / 4000, 1e-12, "occupancy_pct")
  near(f.registers, (128 * 1000 + 24 * 3000) / 4000, 1e-12, "registers")
  -- b (3/4 of the time): 24 registers, 256 threads -> 10 blocks by registers, 8 by warps: warps limit
  T.eq(f.limiter, "warps")
  T.eq(C.counter_fields({ uncounted }, CEIL, LIMITS), { counted = 0 })
end)

T.test("the occupancy limiter from the launch shape and the device's limits", function()
  local r = C.occupancy_limit({ block = { 256, 1, 1 }, registers = 128, shared_memory = 0 }, LIMITS)
  T.eq(r.limiter, "registers")
  T.eq(r.blocks_per_sm, 2)
  near(r.theoretical_pct, 25, 1e-12, "theoretical")
  r = C.occupancy_limit({ block = { 128, 1, 1 }, registers = 32, shared_memory = 100 * 1024 }, LIMITS)
  T.eq(r.limiter, "shared_memory")
  T.eq(r.blocks_per_sm, 2)
  r = C.occupancy_limit({ block = { 1024, 1, 1 }, registers = 16, shared_memory = 0 }, LIMITS)
  T.eq(r.limiter, "warps")
  T.eq(r.blocks_per_sm, 2)
  r = C.occupancy_limit({ block = { 32, 1, 1 }, registers = 16, shared_memory = 0 }, LIMITS)
  T.eq(r.limiter, "blocks")
  T.eq(r.blocks_per_sm, 32)
  T.eq(C.occupancy_limit({ block = { 32, 1, 1 } }, nil), nil)
end)

T.test("tf.ceilings is loaded lazily through package.loaded", function()
  local seen
  package.loaded["tf.ceilings"] = { get = function(device) seen = device; return CEIL end }
  T.eq(C.load_ceilings("cuda:0"), CEIL)
  T.eq(seen, "cuda:0")
  package.loaded["tf.ceilings"] = nil
end)

T.test("columns for counted rows", function()
  local names = {}
  for _, c in ipairs(tf.prof.columns.counters) do names[type(c) == "table" and c[1] or c] = true end
  for _, k in ipairs({ "tflops", "gbs", "intensity", "roof_share", "dram_bytes", "tensor_pct", "occupancy_pct",
                       "limiter" }) do
    T.ok(names[k], k)
  end
end)

T.run()
