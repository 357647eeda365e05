-- The checkpoint of a training state written and read back on this machine's disk: rates and exactness.
--   tfhost tests/gpu/checkpoint_bench.lua [preset = 2.7B] [folder = /tmp/ckbench] [results.json]
-- The state is that of two AdamW steps (bf16, clipping, a cosine schedule); the restore runs once after
-- dropping the page cache where this process may (root), once warm; the two steps after it must give the
-- loss bits of the two steps after the save.
local preset = arg[1] or "2.7B"
local dir = arg[2] or "/tmp/ckbench"
tf.mkdir(dir)
local m = tf.model.new{ preset = preset, context_length = 256, precision = "bf16" }
m:optimizer{ schedule = tf.optim.schedule.cosine{ max_lr = 3e-4, min_lr = 3e-5, warmup = 1, cycle = 100 }, max_norm = 1.0 }
local a = tf.randint(0, 10000, { 2, 256 })
local b = tf.randint(0, 10000, { 2, 256 })
m:step(a, a)
m:step(b, b)
tf.sync()
local path = dir .. "/ck.safetensors"
local info = tf.checkpoint.save(path, { model = m })
local gb = info.bytes / 1e9
print(string.format("%s save: %.2f GB in %.2f s: %.2f GB/s", preset, gb, info.seconds, gb / info.seconds))
local l1 = m:step(a, b):item()
local l1b = m:step(b, a):item()
-- drop the page cache where allowed, for a cold read
local f = io.open("/proc/sys/vm/drop_caches", "w")
local cold = false
if f then os.execute("sync"); cold = f:write("3") ~= nil; f:close() end
tf.sync()
local t0 = tf.now()
local r = tf.checkpoint.restore(path, { model = m })
tf.sync()
local dt = (tf.now() - t0) / 1e3
print(string.format("%s restore (%s): %.2f GB in %.2f s: %.2f GB/s", preset, cold and "page cache dropped" or "page cache warm", gb, dt, gb / dt))
local t1 = tf.now()
tf.checkpoint.restore(path, { model = m })
tf.sync()
local dt2 = (tf.now() - t1) / 1e3
print(string.format("%s restore again (warm): %.2f s: %.2f GB/s", preset, dt2, gb / dt2))
local l2 = m:step(a, b):item()
local l2b = m:step(b, a):item()
print(string.format("resumed steps: %a %a vs %a %a: %s", l2, l2b, l1, l1b, (l1 == l2 and l1b == l2b) and "same bits" or "DIFFERENT"))
tf.json.write(arg[3] or (dir .. "/checkpoint_bench.json"), { preset = preset, bytes = info.bytes, save_s = info.seconds,
  restore_s = dt, restore_cold = cold, restore_warm_s = dt2, same_bits = l1 == l2 and l1b == l2b, env = tf.results.env() })
os.remove(path)
