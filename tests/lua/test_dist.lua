-- tf.dist's collectives, exactly: every rank computes locally what each
-- collective must give (integer-valued floats, so any order of summation
-- gives the same bits) and compares. Runs as a world of one (ctest's
-- lua_test_dist), as 2 and 3 CPU ranks (dist_2_ranks, dist_3_ranks:
-- tfhost --nproc N) and as 2 GPU ranks through NCCL (dist_2_gpus, where
-- the machine has two GPUs), the same file.
local T = require "harness"

local rank, world = tf.dist.rank(), tf.dist.world_size()
local DTYPES = { "f32", "f64", "bf16", "f16", "i32", "i64" }

-- Rank r's tensor of n elements in dtype: small integers that differ per rank and element.
local function data_of(r, n, dtype)
  local v = {}
  for i = 1, n do v[i] = (r * 7 + i * 3) % 11 - 5 end
  return tf.tensor(v, { dtype = dtype })
end

local function expected_reduce(op, n, dtype)
  local out = {}
  for i = 1, n do
    local acc
    for r = 0, world - 1 do
      local x = data_of(r, n, "f64"):tolist()[i]
      if acc == nil then acc = x
      elseif op == "max" then acc = math.max(acc, x)
      elseif op == "min" then acc = math.min(acc, x)
      else acc = acc + x end
    end
    if op == "avg" then acc = acc / world end
    out[i] = acc
  end
  return tf.tensor(out, { dtype = "f64" }):to(dtype):tolist()
end

T.test("rank and world size", function()
  T.ok(rank >= 0 and rank < world, "rank in range")
  T.eq(tf.dist.local_rank(), rank, "one machine: local rank = rank")
  T.eq(tf.dist.info().world_size, world)
  T.eq(tf.dist.is_distributed(), world > 1)
end)

T.test("all_reduce: sum, avg, max, min in every dtype", function()
  for _, dtype in ipairs(DTYPES) do
    for _, op in ipairs({ "sum", "avg", "max", "min" }) do
      if op ~= "avg" or dtype:sub(1, 1) == "f" or dtype == "bf16" then
        local t = data_of(rank, 13, dtype)
        tf.dist.all_reduce(t, op)
        T.eq(t:tolist(), expected_reduce(op, 13, dtype), op .. " " .. dtype)
      end
    end
  end
end)

T.test("all_reduce is in place on a contiguous view", function()
  local base = tf.zeros(4, 6)
  local row = base:narrow(0, 1, 1)
  row:copy_(data_of(rank, 6, "f32"):reshape(1, 6))
  tf.dist.all_reduce(row)
  T.eq(row:reshape(6):tolist(), expected_reduce("sum", 6, "f32"))
  T.eq(base:narrow(0, 0, 1):sum():item(), 0.0, "the rest untouched")
end)

T.test("broadcast from every root", function()
  for root = 0, world - 1 do
    local t = data_of(rank, 9, "f32")
    tf.dist.broadcast(t, root)
    T.eq(t:tolist(), data_of(root, 9, "f32"):tolist(), "root " .. root)
  end
end)

T.test("all_gather and reduce_scatter", function()
  for _, dtype in ipairs({ "f32", "bf16", "i64" }) do
    local out = tf.zeros(world, 5, { dtype = dtype })
    tf.dist.all_gather(out, data_of(rank, 5, dtype))
    for r = 0, world - 1 do
      T.eq(out:select(0, r):tolist(), data_of(r, 5, dtype):tolist(), "gathered rank " .. r .. " " .. dtype)
    end
    local full = data_of(rank, 4 * world, dtype)
    local part = tf.zeros(4, { dtype = dtype })
    tf.dist.reduce_scatter(part, full)
    local sum = expected_reduce("sum", 4 * world, dtype)
    T.eq(part:tolist(), table.move(sum, rank * 4 + 1, rank * 4 + 4, 1, {}), "scattered part " .. dtype)
  end
end)

T.test("async forms give the same numbers", function()
  local a, b = data_of(rank, 7, "f32"), data_of(rank, 7, "f32")
  local w1 = tf.dist.all_reduce_async(a, "max")
  local w2 = tf.dist.all_reduce_async(b, "sum")
  w2:wait()
  w1:wait()
  T.eq(a:tolist(), expected_reduce("max", 7, "f32"))
  T.eq(b:tolist(), expected_reduce("sum", 7, "f32"))
  T.ok(w1:is_completed(), "done after wait")
  local out = tf.zeros(world * 3)
  local w3 <close> = tf.dist.all_gather_async(out, data_of(rank, 3, "f32"))
  w3:wait()
  T.eq(out:narrow(0, rank * 3, 3):tolist(), data_of(rank, 3, "f32"):tolist())
end)

T.test("collectives follow the ops queued before them, and the ops after follow them", function()
  -- on a GPU: kernels still running when the collective is queued, and read right after it
  local n = 1 << 22
  local x = tf.ones(n) * (rank + 1) * 3
  local out = tf.zeros(world * n)
  tf.dist.all_gather(out, x)
  local y = out * 2
  local sums = y:reshape(world, n):sum(1):tolist()
  for r = 0, world - 1 do T.eq(sums[r + 1], 6.0 * (r + 1) * n, "rank " .. r .. "'s part") end
  local z = tf.ones(n) * (rank + 1)
  local w = tf.dist.all_reduce_async(z)
  w:wait()
  T.eq((z * 1):sum():item(), n * world * (world + 1) / 2.0)
end)

T.test("send and recv around a ring", function()
  if world == 1 then
    T.raises(function() tf.dist.send(tf.zeros(2), 0) end, "no peer to send to")
    return
  end
  local right, left = (rank + 1) % world, (rank - 1) % world
  local got = tf.zeros(6)
  -- even ranks send first, odd ranks receive first: on GPUs NCCL's send waits for its receiver,
  -- and a rank's collectives run one after the other
  if rank % 2 == 0 then
    local s = tf.dist.send_async(data_of(rank, 6, "f32"), right)
    tf.dist.recv(got, left)
    s:wait()
  else
    tf.dist.recv(got, left)
    tf.dist.send(data_of(rank, 6, "f32"), right)
  end
  T.eq(got:tolist(), data_of(left, 6, "f32"):tolist())
end)

T.test("barrier", function()
  -- rank 0 writes a file 50 ms late, just before the barrier: every rank finds it after the barrier
  -- (a name of rank 0's making, unique among runs side by side, sent to the others as bytes)
  local bytes = tf.zeros(256, { dtype = "f64" })
  if rank == 0 then
    local name = os.tmpname()
    os.remove(name)
    bytes:narrow(0, 0, #name):copy_(tf.tensor({ name:byte(1, -1) }, { dtype = "f64" }))
  end
  tf.dist.broadcast(bytes, 0)
  local codes = {}
  for _, c in ipairs(bytes:tolist()) do if c > 0 then codes[#codes + 1] = math.floor(c) end end
  local path = string.char(table.unpack(codes))
  if rank == 0 then
    local t0 = tf.now()
    while tf.now() - t0 < 50 do end
    assert(io.open(path, "w")):close()
  end
  T.eq(select("#", tf.dist.barrier()), 0)
  local f = io.open(path)
  T.ok(f, "rank " .. rank .. " left the barrier before rank 0 reached it")
  if f then f:close() end
  tf.dist.barrier()
  if rank == 0 then os.remove(path) end
end)

T.test("bad arguments are clear errors", function()
  T.raises(function() tf.dist.all_reduce({}) end, "must be a tensor")
  T.raises(function() tf.dist.all_reduce(tf.zeros(2), "mean") end, "op must be")
  T.raises(function() tf.dist.all_reduce(tf.zeros(2, { dtype = "i32" }), "avg") end, "avg needs a floating-point")
  T.raises(function() tf.dist.all_reduce(tf.zeros(3, 4):transpose(0, 1)) end, "not contiguous")
  T.raises(function() tf.dist.broadcast(tf.zeros(2), world) end, "not a rank of this world")
  T.raises(function() tf.dist.broadcast(tf.zeros(2), 0.5) end, "integer rank")
  T.raises(function() tf.dist.all_gather(tf.zeros(world * 2 + 1), tf.zeros(2)) end, "needs world_size")
  T.raises(function() tf.dist.all_gather(tf.zeros(world * 2, { dtype = "f64" }), tf.zeros(2)) end, "share a dtype")
  T.raises(function() tf.dist.reduce_scatter(tf.zeros(2), tf.zeros(2 * world + 1)) end, "needs world_size")
  T.raises(function() tf.dist.all_reduce(tf.zeros(2, { dtype = "bool" })) end, "bool")
  T.raises(function() tf.dist.set_timeout(-1) end, "seconds > 0")
  if tf.cuda.is_available() then
    T.raises(function() tf.dist.all_gather(tf.zeros(world * 2, { device = "cpu" }), tf.zeros(2, { device = "cuda" })) end,
      "share a device")
  end
end)

T.test("ranks that disagree are named (the check)", function()
  if world == 1 then T.skip_test("needs two ranks or more (tfhost --nproc 2)") end
  -- rank 0 sends 4 elements, the others 5: every rank fails, naming both
  local n = rank == 0 and 4 or 5
  T.raises(function() tf.dist.all_reduce(tf.zeros(n)) end, "the ranks disagree: rank " .. rank .. " has all_reduce of " .. n .. " f32")
  T.raises(function() tf.dist.all_reduce(tf.zeros(4, { dtype = rank == 0 and "f32" or "f64" })) end, "ranks disagree")
  -- and the world still works afterwards
  local t = data_of(rank, 3, "f32")
  tf.dist.all_reduce(t)
  T.eq(t:tolist(), expected_reduce("sum", 3, "f32"))
end)

T.test("results files and the profiler name the rank", function()
  local env = tf.results.env()
  if world == 1 and tf.dist.info().launcher == "none" then
    T.eq(env.dist, nil, "no launcher, no ranks in the results")
  else
    T.eq(env.dist.rank, rank)
    T.eq(env.dist.world_size, world)
  end
  local p <close> = tf.prof.start()
  tf.range("step", function() return tf.ones(8) + 1 end)
  p:stop()
  local rows = p:ranges()
  T.eq(rows[1].name, "step")
  T.eq(rows[1].rank, world > 1 and rank or nil)
end)

T.run()
