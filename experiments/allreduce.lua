--- allreduce: how fast the ranks of a run sum a tensor. Times tf.dist.all_reduce
-- over sizes and dtypes and reports, per call, the time (the slowest rank's
-- median) and the bus bandwidth, 2 (n - 1) / n * bytes / time: the rate each
-- link moves data at in a ring all-reduce, comparable across world sizes
-- (NCCL's tests report the same). GPU tensors go through NCCL, CPU tensors
-- through MPI.
--
--   tfhost --nproc 2 experiments/allreduce.lua --json ar.json --plot ar.html
--   tfhost --nproc 4 --device cpu experiments/allreduce.lua --sizes 1,16
--   python3 tests/reference/torch_allreduce.py --nproc 2 --json torch.json   # torch.distributed
--   tfhost compare ar.json torch.json
local opt = tf.options{
  description = "Time tf.dist.all_reduce across the ranks of the run (tfhost --nproc N): time per call and bus "
    .. "bandwidth per size and dtype.",
  { "sizes", "tensor sizes in MB (10^6 bytes)", default = "1,4,16,64,256,1024", cpu = "1,4,16,64",
    type = "list:int", min = 1 },
  { "dtypes", "element types", default = "f32,bf16", type = "list" },
  { "op", "the reduction", default = "sum", choices = { "sum", "avg", "max", "min" } },
  { "warmup", "untimed calls per size", default = 3, min = 0 },
  { "iters", "timed calls per size", default = 10, min = 1 },
  { "json", "write the rows (as each size finishes) and the environment to this file (rank 0)", type = "string" },
  { "plot", "draw bus bandwidth and time against size to this HTML page (rank 0)", type = "string" },
}

local rank, world = tf.dist.rank(), tf.dist.world_size()
local device = tf.default_device()
local on_gpu = device ~= "cpu"
local sizes = opt.sizes
local ELEMENT_BYTES = { f32 = 4, bf16 = 2, f16 = 2, f64 = 8, i32 = 4, i64 = 8 }
for _, d in ipairs(opt.dtypes) do
  if not ELEMENT_BYTES[d] then error("allreduce: unknown dtype '" .. d .. "' (f32, bf16, f16, f64, i32, i64)", 0) end
end
local info = tf.dist.info()
local engine = on_gpu and ("NCCL " .. (info.nccl or "")) or (info.mpi or "local (a world of one)")

local function say(...)
  if rank == 0 then print(string.format(...)) end
end
say("all-reduce (%s) over %d rank(s) on %s through %s", opt.op, world, tf.device(), engine)
if world == 1 then say("a world of one moves nothing: start several ranks with tfhost --nproc N") end

-- The ranks start each timed call together (untimed): a barrier where MPI
-- has one, else a one-element all-reduce on the device.
local align_t = tf.zeros(1, { device = device })
local function align()
  if info.mpi or world == 1 then tf.dist.barrier() else tf.dist.all_reduce(align_t) end
end

-- The slowest rank's value: a call is finished when every rank has it.
local function slowest(ms)
  local t = tf.full({ 1 }, ms, { dtype = "f64", device = info.mpi and "cpu" or device })
  tf.dist.all_reduce(t, "max")
  return t:item()
end

tf.dist.set_checks(false) -- the ranks agree by construction; the check would add a message per call
local rows, costs = {}, {}
for _ = 1, #opt.dtypes do
  for _, mb in ipairs(sizes) do costs[#costs + 1] = mb + 1 end
end
local sweep = tf.report.sweep{ total = #costs, json = rank == 0 and opt.json or nil, results = rows, costs = costs,
  out = rank == 0 and io.stderr or false, extra = { key = { "dtype", "size_mb", "world_size" },
    metrics = { "time_ms", "busbw_gbs" }, op = opt.op, engine = engine } }
for _, dtype in ipairs(opt.dtypes) do
  for _, mb in ipairs(sizes) do
    sweep:start("%s %d MB", dtype, mb)
    local bytes = mb * 1000000
    local n = bytes // ELEMENT_BYTES[dtype]
    local ok, t = pcall(tf.randn, n, { dtype = dtype, device = device })
    if not ok then
      if not tf.mem.is_oom(t) then error(t, 0) end
      rows[#rows + 1] = { dtype = dtype, size_mb = mb, world_size = world, oom = true, time_ms = "OOM" }
    else
      local stats = tf.bench(function() tf.dist.all_reduce(t, opt.op) end,
        { warmup = opt.warmup, iters = opt.iters, setup = align })
      t:free()
      local ms = slowest(stats.median)
      local seconds = ms / 1e3
      rows[#rows + 1] = {
        dtype = dtype, size_mb = mb, bytes = n * ELEMENT_BYTES[dtype], world_size = world, device = device,
        engine = engine, impl = "tfhost", time_ms = ms, min_ms = slowest(stats.min),
        algbw_gbs = n * ELEMENT_BYTES[dtype] / seconds / 1e9,
        busbw_gbs = 2 * (world - 1) / world * n * ELEMENT_BYTES[dtype] / seconds / 1e9,
      }
    end
    collectgarbage()
    sweep:done(rows[#rows].oom and "OOM" or "done")
  end
end
tf.dist.set_checks(true)

if rank == 0 then
  tf.report.table(rows, { columns = { "dtype", { "size_mb", "MB" }, { "world_size", "ranks" },
    { "time_ms", "ms/call", "%.3f" }, { "algbw_gbs", "algbw GB/s", "%.2f" }, { "busbw_gbs", "busbw GB/s", "%.2f" } } })
  sweep:finish()
  if opt.plot then
    tf.plot.sweep(opt.plot, rows, { x = { "size_mb" }, y = { "busbw_gbs", "time_ms" }, series = { "dtype" },
      title = string.format("all-reduce over %d ranks, %s", world, engine) })
    print("wrote " .. opt.plot)
  end
end
