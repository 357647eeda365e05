-- Allocation history on the CPU device (the GPU's allocator is the same
-- code): tf.mem.record, tf.mem.snapshot, tags, scopes, source lines, OOM
-- events and the engine's named buffers.
local T = require "harness"
local cpu = { device = "cpu" }
local KiB, MiB = 1024, 1 << 20

local function fresh()
  collectgarbage()
  tf.mem.empty_cache("cpu")
  tf.mem.record({ max_entries = 10000, device = "cpu" })
end

-- This file's name as the recorder writes it (short_src).
local here = debug.getinfo(1, "S").short_src

local function events(snap, action)
  local out = {}
  for _, e in ipairs(snap.trace) do
    if e.action == action then out[#out + 1] = e end
  end
  return out
end

T.test("known allocations and frees give the expected trace", function()
  fresh()
  local a = tf.zeros(1000, cpu)      -- 4000 B -> 4096 B block; the first block opens a 2 MiB segment
  local b = tf.zeros(300 * KiB // 4, cpu) -- 300 KiB, same small segment
  local line_a = debug.getinfo(1, "l").currentline - 2
  a:free()
  local snap = tf.mem.snapshot("cpu")
  tf.mem.record(false, "cpu")
  T.eq(snap.device, "cpu")
  local actions = {}
  for _, e in ipairs(snap.trace) do actions[#actions + 1] = e.action end
  T.eq(actions, { "segment_alloc", "alloc", "alloc", "free_completed" })
  local allocs = events(snap, "alloc")
  T.eq(allocs[1].size, 4096)
  T.eq(allocs[1].requested_size, 4000)
  T.eq(allocs[2].size, 300 * KiB)
  T.eq(allocs[1].source, here .. ":" .. line_a)
  T.eq(allocs[1].what, "zeros")
  T.eq(allocs[1].frames[1].filename, here)
  T.eq(allocs[1].frames[1].line, line_a)
  T.eq(events(snap, "segment_alloc")[1].size, 2 * MiB)
  local free = events(snap, "free_completed")[1]
  T.eq(free.addr, allocs[1].addr)
  T.eq(free.size, 4096)
  for i = 2, #snap.trace do T.ok(snap.trace[i].time_us >= snap.trace[i - 1].time_us, "time runs forward") end
  -- the segment: one live block (b) and free space around it
  local seg
  for _, s in ipairs(snap.segments) do
    for _, blk in ipairs(s.blocks) do
      if blk.address == allocs[2].addr then seg = s end
    end
  end
  T.ok(seg, "the live block's segment is in the snapshot")
  T.eq(seg.total_size, 2 * MiB)
  T.eq(seg.segment_type, "small")
  local covered, live = 0, 0
  for i, blk in ipairs(seg.blocks) do
    covered = covered + blk.size
    if i > 1 then T.eq(blk.address, seg.blocks[i - 1].address + seg.blocks[i - 1].size, "blocks tile the segment") end
    if blk.state == "active_allocated" then live = live + blk.size end
  end
  T.eq(covered, seg.total_size)
  T.eq(live, 300 * KiB)
  T.eq(seg.allocated_size, 300 * KiB)
  b:free()
end)

T.test("peak of the recorded history", function()
  fresh()
  local x = tf.zeros(MiB // 4, cpu) -- 1 MiB
  local y = tf.zeros(2 * MiB // 4, cpu) -- 2 MiB
  x:free()
  local z = tf.zeros(MiB // 4, cpu)
  local snap = tf.mem.snapshot("cpu")
  tf.mem.record(false, "cpu")
  local base = tf.mem.stats("cpu").allocated - 3 * MiB -- what was live before (other tests' tensors)
  T.eq(snap.peak.allocated - base, 3 * MiB)
  T.eq(snap.trace[#snap.trace].action, "alloc")
  y:free(); z:free()
end)

T.test("tags come from scopes, autograd and the grad mode", function()
  fresh()
  local w = tf.mem.scope("parameter", "my weight", function() return tf.randn({ 64, 64 }, cpu):requires_grad(true) end)
  local x = tf.randn({ 8, 64 }, cpu)
  local y = tf.matmul(x, w)                                -- grad mode on: an activation
  local t = tf.no_grad(function() return x * 2 end)        -- off: a temporary
  y:sum():backward()                                       -- w.grad: a gradient
  local st
  do
    local _ <close> = tf.mem.scope("optimizer state", "momentum")
    st = tf.zeros(w:size(), cpu)
  end
  local snap = tf.mem.snapshot("cpu")
  tf.mem.record(false, "cpu")
  local by_addr = {}
  for _, e in ipairs(events(snap, "alloc")) do by_addr[e.addr] = e end
  local function tag_of(tensor)
    for _, s in ipairs(snap.segments) do
      for _, blk in ipairs(s.blocks) do
        if blk.state == "active_allocated" and blk.address == tensor:data_ptr() then return blk.tag, blk.what end
      end
    end
  end
  T.eq({ tag_of(w) }, { "parameter", "my weight" })
  T.eq((tag_of(y)), "activation")
  T.eq((tag_of(t)), "temporary")
  T.eq((tag_of(w.grad)), "gradient")
  T.eq({ tag_of(st) }, { "optimizer state", "momentum" })
  T.eq(by_addr[w.grad:data_ptr()].tag, "gradient", "the history's event is retagged too")
  T.raises(function() tf.mem.scope("weights") end, "unknown tag 'weights'")
end)

T.test("open ranges are recorded with each allocation", function()
  fresh()
  local x = tf.range("outer", function()
    local _ <close> = tf.range("inner")
    return tf.zeros(64, cpu)
  end)
  local snap = tf.mem.snapshot("cpu")
  tf.mem.record(false, "cpu")
  local a = events(snap, "alloc")
  T.eq(a[#a].ranges, { "outer", "inner" })
  T.eq(a[#a].addr, x:data_ptr())
end)

T.test("an out-of-memory error is recorded", function()
  fresh()
  tf.mem.set_limit(8 * MiB, "cpu")
  local ok, err = pcall(tf.zeros, 16 * MiB, cpu)
  tf.mem.set_limit(nil, "cpu")
  local snap = tf.mem.snapshot("cpu")
  tf.mem.record(false, "cpu")
  T.ok(not ok and tf.mem.is_oom(err), tostring(err))
  local oom = events(snap, "oom")
  T.eq(#oom, 1)
  T.eq(oom[1].size, 64 * MiB)
  T.ok(oom[1].device_free >= 0)
  T.ok(oom[1].source:find(here, 1, true), oom[1].source)
end)

T.test("the fused engine names its buffers", function()
  fresh()
  local m = tf.model.new({ preset = "tiny", context_length = 16, device = "cpu" })
  local ids = tf.randint(0, 100, { 2, 16 }, cpu)
  m:step(ids, ids):free()
  local snap = tf.mem.snapshot("cpu")
  tf.mem.record(false, "cpu")
  local named = {}
  for _, e in ipairs(events(snap, "alloc")) do named[e.what] = e end
  local d = m.config.d_model
  T.eq(named["token_embeddings.weight"].tag, "parameter")
  T.eq(named["token_embeddings.weight.grad"].tag, "gradient")
  T.eq(named["lm_head.weight.exp_avg_sq"].tag, "optimizer state")
  T.eq(named["lm_head.weight"].size, m.config.vocab_size * d * 4)
  T.eq(named["residual.0"].tag, "activation")
  T.eq(named["residual.0"].size, 2 * 16 * d * 4, "one residual stream: batch x seq x d_model f32")
  T.eq(named["layers.0.q"].tag, "activation")
  T.ok(named["d residual"] and named["d residual"].tag == "workspace")
  -- the snapshot's blocks show the same parts
  local found = false
  for _, s in ipairs(snap.segments) do
    for _, blk in ipairs(s.blocks) do found = found or blk.what == "residual.0" end
  end
  T.ok(found, "residual.0 is a block of the snapshot")
  -- and still tile every segment exactly (PyTorch's segsum asserts it): the
  -- bytes of a described block that no part names are blocks of their own
  for _, seg in ipairs(snap.segments) do
    local at, covered = seg.address, 0
    for _, blk in ipairs(seg.blocks) do
      T.eq(blk.address, at, "each block starts where the one before ends")
      at, covered = blk.address + blk.size, covered + blk.size
    end
    T.eq(covered, seg.total_size, "the blocks of a segment add up to its size")
    local active = 0
    for _, blk in ipairs(seg.blocks) do
      if blk.state == "active_allocated" then active = active + blk.size end
    end
    T.eq(seg.allocated_size, active, "allocated_size is the active blocks' bytes")
  end
  m = nil
  collectgarbage()
end)

T.test("the ring keeps the last max_entries events", function()
  collectgarbage()
  tf.mem.record({ max_entries = 4, device = "cpu" })
  for _ = 1, 5 do tf.zeros(10, cpu):free() end
  local snap = tf.mem.snapshot("cpu")
  tf.mem.record(false, "cpu")
  T.eq(#snap.trace, 4)
  T.eq(snap.dropped, 6)
  T.eq(snap.trace[4].action, "free_completed")
  T.raises(function() tf.mem.record({ max_entries = 0 }) end, "max_entries must be at least 1")
end)

T.run()
