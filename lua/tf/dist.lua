--- tf.dist: several processes training one model. Each process is a rank of
-- a world (tfhost --nproc N, mpirun, srun or a torchrun-style launcher
-- starts them); collectives move tensors between ranks: CPU tensors
-- through MPI, GPU tensors through NCCL. Without a launcher the world has
-- one rank and every collective is local, so scripts run unchanged.
--
--   local t = tf.full({4}, tf.dist.rank() + 1)
--   tf.dist.all_reduce(t)                        -- in place: the sum over ranks
--   local w = tf.dist.all_reduce_async(t, "avg") -- started; w:wait() finishes it
--
-- The ranks compare what they were asked before each collective (dtype,
-- element count, device, root): a mismatch is an error on every rank that
-- names the ranks, and a rank that never arrives is named after the timeout
-- (tf.dist.set_timeout, default 300 s). tf.dist.set_checks(false) skips the
-- comparison (one small message per rank) where every microsecond counts.
local M = {}

-- the C half (tf._dist), found when first needed: tf is still loading this file
local function core() return require("tf")._dist end

local function info() return core().info() end

--- This process's rank, 0 .. world_size() - 1.
function M.rank() return info().rank end
--- The number of ranks in the run (1 without a launcher).
function M.world_size() return info().world_size end
--- The rank among the ranks of this machine (the GPU it uses).
function M.local_rank() return info().local_rank end
--- Whether the run has more than one rank.
function M.is_distributed() return info().world_size > 1 end
--- Everything tf.dist knows: rank, world_size, local_rank, local_world_size,
-- launcher, mpi (library version, when joined through MPI), nccl_available,
-- nccl (version, once loaded), checks, timeout.
function M.info() return info() end

--- Waits until every rank has arrived.
function M.barrier() core().barrier() end

local function check_tensor(fname, t, what)
  if not require("tf").is_tensor(t) then
    error(string.format("tf.dist.%s: %s must be a tensor, not %s", fname, what or "the argument", type(t)), 3)
  end
end

local OPS = { sum = true, avg = true, max = true, min = true }
local function check_op(fname, op)
  if op ~= nil and not OPS[op] then
    error(string.format("tf.dist.%s: op must be \"sum\", \"avg\", \"max\" or \"min\", not %s", fname, tostring(op)), 3)
  end
end

local function check_rank(fname, r, what)
  if math.type(r) ~= "integer" then
    error(string.format("tf.dist.%s: %s must be an integer rank, not %s", fname, what, tostring(r)), 3)
  end
  local n = M.world_size()
  if r < 0 or r >= n then
    error(string.format("tf.dist.%s: %s %d is not a rank of this world (0..%d)", fname, what, r, n - 1), 3)
  end
end

-- The blocking form and the _async one of each collective.
local function both(name, check, call)
  M[name] = function(...)
    check(name, ...)
    call(false, ...)
  end
  M[name .. "_async"] = function(...)
    check(name .. "_async", ...)
    return call(true, ...)
  end
end

--- tf.dist.all_reduce(t [, op]): t becomes op ("sum" (default), "avg",
--- "max", "min") over every rank's t, in place. _async returns a work.
both("all_reduce", function(fname, t, op)
  check_tensor(fname, t)
  check_op(fname, op)
end, function(async, t, op) return core().all_reduce(t, op or "sum", async) end)

--- tf.dist.broadcast(t, root): t becomes root's t on every rank.
both("broadcast", function(fname, t, root)
  check_tensor(fname, t)
  check_rank(fname, root, "root")
end, function(async, t, root) return core().broadcast(t, root, async) end)

--- tf.dist.all_gather(out, t): out (world_size x numel(t) elements, any
--- shape) holds every rank's t, in rank order.
both("all_gather", function(fname, out, t)
  check_tensor(fname, out, "out")
  check_tensor(fname, t, "t")
end, function(async, out, t) return core().all_gather(out, t, async) end)

--- tf.dist.reduce_scatter(out, t [, op]): out (numel(t) / world_size
--- elements) is this rank's part of op over every rank's t.
both("reduce_scatter", function(fname, out, t, op)
  check_tensor(fname, out, "out")
  check_tensor(fname, t, "t")
  check_op(fname, op)
end, function(async, out, t, op) return core().reduce_scatter(out, t, op or "sum", async) end)

--- tf.dist.send(t, peer) / tf.dist.recv(t, peer): t to or from one rank
--- (the same dtype and element count on both sides).
both("send", function(fname, t, peer)
  check_tensor(fname, t)
  check_rank(fname, peer, "peer")
end, function(async, t, peer) return core().send(t, peer, async) end)
both("recv", function(fname, t, peer)
  check_tensor(fname, t)
  check_rank(fname, peer, "peer")
end, function(async, t, peer) return core().recv(t, peer, async) end)

--- tf.dist.set_checks(on): the ranks' comparison before each collective.
function M.set_checks(on)
  if type(on) ~= "boolean" then error("tf.dist.set_checks: expects true or false", 2) end
  core().set_checks(on)
end
--- tf.dist.set_timeout(seconds): how long a rank waits for the others at a collective.
function M.set_timeout(s)
  if type(s) ~= "number" then error("tf.dist.set_timeout: expects a number of seconds", 2) end
  core().set_timeout(s)
end

--- What results files record about the run's ranks (nil in a world of one
-- without a launcher).
function M.env()
  local ok, i = pcall(info)
  if not ok or (i.world_size == 1 and i.launcher == "none") then return nil end
  return { rank = i.rank, world_size = i.world_size, local_rank = i.local_rank,
    local_world_size = i.local_world_size, launcher = i.launcher, mpi = i.mpi, nccl = i.nccl }
end

return M
