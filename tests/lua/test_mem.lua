-- The caching allocator through tf.mem on the CPU device (the same
-- accounting as on a GPU): statistics, reuse, limits and out-of-memory.
local T = require "harness"
local cpu = { device = "cpu" }
local MiB = 1 << 20

local function stats() return tf.mem.stats("cpu") end

T.test("stats follow allocations and frees", function()
  collectgarbage()
  tf.mem.empty_cache("cpu")
  local s0 = stats()
  T.eq(s0.device, "cpu")
  local x = tf.zeros(1000, cpu) -- 4000 bytes -> one 4096-byte block in a 2 MiB segment
  local s1 = stats()
  T.eq(s1.allocated - s0.allocated, 4096)
  T.eq(s1.requested - s0.requested, 4000)
  T.eq(s1.num_allocs - s0.num_allocs, 1)
  T.ok(s1.reserved >= s0.reserved + 4096)
  x:free()
  local s2 = stats()
  T.eq(s2.allocated, s0.allocated)
  T.eq(s2.num_frees - s0.num_frees, 1)
  T.eq(s2.reserved, s1.reserved) -- cached, not returned
  local y = tf.zeros(1000, cpu) -- reuses the cached block: no new segment
  T.eq(stats().num_segment_allocs, s2.num_segment_allocs)
  y:free()
  tf.mem.empty_cache("cpu")
  T.eq(stats().reserved, s0.reserved)
end)

T.test("peak tracking and reset", function()
  collectgarbage()
  tf.mem.reset_peak("cpu")
  local base = stats().allocated
  local big = tf.zeros(4 * MiB, cpu) -- 16 MiB
  big:free()
  T.eq(stats().peak_allocated - base, 16 * MiB)
  tf.mem.reset_peak("cpu")
  T.eq(stats().peak_allocated, stats().allocated)
end)

T.test("out of memory is a catchable error and leaves nothing behind", function()
  collectgarbage()
  tf.mem.empty_cache("cpu")
  local base = stats()
  tf.mem.set_limit(base.reserved + 64 * MiB, "cpu")
  local keep = tf.zeros(8 * MiB, cpu) -- 32 MiB
  local ok, err = pcall(tf.zeros, 16 * MiB, cpu) -- 64 MiB more does not fit
  T.eq(ok, false)
  T.ok(tf.mem.is_oom(err), err)
  T.ok(err:find("tried to allocate 64.00 MiB on cpu", 1, true), err)
  T.ok(err:find("in tf.zeros", 1, true), err)
  local after = stats()
  T.eq(after.allocated, base.allocated + 32 * MiB)
  T.eq(after.num_ooms, base.num_ooms + 1)
  -- the engine keeps working: ops still run and memory is accounted
  T.eq((keep:narrow(0, 0, 3) + 1):tolist(), { 1.0, 1.0, 1.0 })
  keep:free()
  collectgarbage()
  T.eq(stats().allocated, base.allocated)
  tf.mem.set_limit(nil, "cpu")
  T.eq(stats().limit, nil, "no cap: nil, as the docs say")
  local fits = tf.zeros(16 * MiB, cpu)
  T.eq(fits:numel(), 16 * MiB)
end)

T.test("garbage tensors are collected before out of memory is reported", function()
  collectgarbage()
  tf.mem.empty_cache("cpu")
  local base = stats()
  tf.mem.set_limit(base.reserved + 48 * MiB, "cpu")
  -- 20 tensors of 16 MiB, each dropped without free(): only the GC can reclaim them
  for _ = 1, 20 do
    local t = tf.zeros(4 * MiB, cpu)
    T.eq(t:numel(), 4 * MiB)
  end
  tf.mem.set_limit(nil, "cpu")
  T.ok(stats().num_ooms == base.num_ooms, "no OOM reached the script")
end)

T.test("bad arguments", function()
  T.raises(function() tf.mem.set_limit(-1, "cpu") end, "the limit must be >= 0")
  T.raises(function() tf.mem.stats("tpu") end, "unknown device 'tpu'")
end)

T.run()
