--- tf.ceilings: the rates a device reaches at its best, measured with tfhost's own ops, for the
-- roofline (lua/tf/roofline.lua) and the profiler's counted rows (p.ceilings).
--
--   local c = tf.ceilings.get("cuda:0")   -- {bf16, fp8, tf32, f32 (TFLOP/s), copy (GB/s), ...}
--
-- On a GPU: a bf16 product (tf.matmul), an FP8 product (tf.scaled_matmul, e4m3, compute
-- capability 8.9 and newer), f32 products with TF32 allowed and without, and a device-to-device
-- copy; on the CPU an f32 product and a copy. Each rate is the best of a few timed rounds. The
-- first measurement on a device is kept as JSON in tfhost's per-user cache (beside the kernel
-- cache of tf.cuda.compile), one file per device name and driver version, and read back after.
local check = require "tf.check"

local M = {}

--- The cache files' format; a file of another format is measured again and replaced.
M.FORMAT = 1

--- The default sizes: an n x n x n product and a copy of copy_bytes, by device type.
M.defaults = {
  cuda = { matmul = 8192, copy_bytes = 1 << 30, warmup = 3, iters = 10, repeats = 5 },
  cpu = { matmul = 1024, copy_bytes = 64 << 20, warmup = 1, iters = 2, repeats = 3 },
}

-- captured now: the cache's files are tfhost's own, written the way tf.cuda's kernel cache is
local io_open, os_rename, os_remove, os_date = io.open, os.rename, os.remove, os.date

local KEYS = { "refresh", "cache", "cache_dir", "matmul", "copy_bytes", "warmup", "iters", "repeats", "quiet" }

--- Where the module's notes go (stderr); the tests replace it.
function M._note(text) io.stderr:write("tf.ceilings: ", text, "\n") end
local function note(text) M._note(text) end

-- The best milliseconds of one call of run, over `repeats` rounds of `iters` calls timed on the
-- device's queue (tf.timer: CUDA events on a GPU, the host clock on the CPU), after `warmup`.
local function best_ms(tf, dev, run, sizes)
  for _ = 1, sizes.warmup do run() end
  local best
  for _ = 1, sizes.repeats do
    tf.sync(dev)
    local t <close> = tf.timer(dev)
    for _ = 1, sizes.iters do run() end
    local ms = t:ms() / sizes.iters
    if not best or ms < best then best = ms end
  end
  return best
end

local function tflops(n, ms) return 2 * n * n * n / (ms * 1e-3) / 1e12 end

-- Whether the device has FP8 tensor cores (compute capability 8.9: Ada, and newer).
local function has_fp8(info)
  local major, minor = tostring(info.compute_capability or ""):match("^(%d+)%.(%d+)$")
  major, minor = tonumber(major), tonumber(minor)
  return major ~= nil and (major > 8 or (major == 8 and minor >= 9))
end

-- Measures the ceilings of dev; progress lines on stderr unless quiet.
local function measure(tf, dev, info, sizes, quiet)
  local n = sizes.matmul
  local out = {}
  local function step(what, fn)
    if not quiet then io.stderr:write(string.format("  %s ...", what)) end
    local value, unit = fn()
    if not quiet then io.stderr:write(string.format(" %.4g %s\n", value, unit)) end
    collectgarbage()
    return value
  end
  local on = { device = dev }
  local gpu = info.type == "cuda"
  if gpu then
    out.bf16 = step(string.format("bf16 product %dx%dx%d", n, n, n), function()
      local a, b = tf.randn({ n, n }, on):to("bf16"), tf.randn({ n, n }, on):to("bf16")
      local ms = best_ms(tf, dev, function() tf.matmul(a, b):free() end, sizes)
      a:free(); b:free()
      return tflops(n, ms), "TFLOP/s"
    end)
    if has_fp8(info) then
      out.fp8 = step(string.format("fp8 (e4m3) product %dx%dx%d", n, n, n), function()
        -- a (n, n) row-major, b the transpose of a row-major weight: the layout FP8 tensor cores take
        local a = tf.cast(tf.randn({ n, n }, on), "f8e4m3", { saturate = true })
        local w = tf.cast(tf.randn({ n, n }, on), "f8e4m3", { saturate = true })
        local wt = w:t()
        local best = math.huge
        for _, fast in ipairs({ false, true }) do -- the faster of f32-promoted and fast accumulation
          local opts = { scale_a = 1.0, scale_b = 1.0, fast_accum = fast }
          best = math.min(best, best_ms(tf, dev, function() tf.scaled_matmul(a, wt, opts):free() end, sizes))
        end
        a:free(); w:free()
        return tflops(n, best), "TFLOP/s"
      end)
    end
    local previous = tf.allow_tf32(true, dev)
    local ok, err = pcall(function()
      local a, b = tf.randn({ n, n }, on), tf.randn({ n, n }, on)
      out.tf32 = step(string.format("tf32 product %dx%dx%d", n, n, n), function()
        tf.allow_tf32(true, dev)
        return tflops(n, best_ms(tf, dev, function() tf.matmul(a, b):free() end, sizes)), "TFLOP/s"
      end)
      out.f32 = step(string.format("f32 product %dx%dx%d (FMA, no TF32)", n, n, n), function()
        tf.allow_tf32(false, dev)
        return tflops(n, best_ms(tf, dev, function() tf.matmul(a, b):free() end, sizes)), "TFLOP/s"
      end)
      a:free(); b:free()
    end)
    tf.allow_tf32(previous, dev)
    if not ok then error(err, 0) end
  else
    out.f32 = step(string.format("f32 product %dx%dx%d", n, n, n), function()
      local a, b = tf.randn({ n, n }, on), tf.randn({ n, n }, on)
      local ms = best_ms(tf, dev, function() tf.matmul(a, b):free() end, sizes)
      a:free(); b:free()
      return tflops(n, ms), "TFLOP/s"
    end)
  end
  out.copy = step(string.format("copy of %s", tf.units.bytes(sizes.copy_bytes)), function()
    local count = sizes.copy_bytes // 4
    local src, dst = tf.randn(count, on), tf.zeros(count, on)
    local ms = best_ms(tf, dev, function() dst:copy_(src) end, sizes)
    src:free(); dst:free()
    return 2 * 4 * count / (ms * 1e-3) / 1e9, "GB/s" -- each byte read once and written once
  end)
  return out
end

-- A file name made of the device's name and driver ("NVIDIA_H200_driver12080"); on the CPU, of its
-- name and thread count, which its f32 rate depends on.
local function slug(text) return (tostring(text):gsub("[^%w%.%-]+", "_"):gsub("^_+", ""):gsub("_+$", "")) end

local function cache_file(dir, info, sizes, default_sizes)
  local name = info.type == "cpu" and string.format("%s_cpu_%dthreads", slug(info.name), sizes.threads)
    or slug(info.name) .. "_driver" .. slug(info.driver_version or "unknown")
  local differs = false
  for k, v in pairs(default_sizes) do differs = differs or sizes[k] ~= v end
  if differs then -- sizes other than the defaults: a file of their own, the defaults' left alone
    local tf = require "tf"
    name = name .. "_" .. tf.sha256(tf.json.encode({ matmul = sizes.matmul, copy_bytes = sizes.copy_bytes,
      warmup = sizes.warmup, iters = sizes.iters, repeats = sizes.repeats })):sub(1, 10)
  end
  return dir .. "/" .. name .. ".json"
end

local function cache_read(path, info)
  local f = io_open(path, "rb")
  if not f then return nil end
  local text = f:read("a")
  f:close()
  local ok, doc = pcall(require("tf").json.decode, text or "")
  if not ok or type(doc) ~= "table" or doc.format ~= M.FORMAT or doc.device_name ~= info.name then
    note(path .. " is damaged or of another format: measuring again and replacing it")
    return nil
  end
  return doc
end

local function cache_write(dir, path, doc)
  local tf = require "tf"
  local ok, err = pcall(tf.mkdir, dir)
  local tmp = string.format("%s.%d.tmp", path, math.random(1, 1 << 30))
  local f, why
  if ok then f, why = io_open(tmp, "wb") else why = tostring(err) end
  local written = f and f:write(tf.json.encode(doc, { indent = true, sort_keys = true }), "\n")
  local closed = f and f:close()
  if written and closed and os_rename(tmp, path) then return true end
  if f then os_remove(tmp) end
  note("the cache folder " .. dir .. " cannot be written (" .. tostring(why or "the disk may be full") ..
    "): the ceilings are not kept, and the next run measures them again")
  return false
end

--- tf.ceilings.get([device] [, opts]) -> {bf16, fp8, tf32, f32 (TFLOP/s), copy (GB/s), device
-- (its name), driver, cuda (the runtime's version), measured (UTC, ISO 8601), source ("measured"
-- or "cache"), sizes}. fp8 is nil without FP8 tensor cores; on the CPU
-- only f32 and copy are measured. opts: refresh (measure again, replacing the cache), cache
-- (false: neither read nor write it), cache_dir (default: tfhost's per-user cache, ceilings/),
-- matmul (n of the n x n x n products), copy_bytes, warmup, iters, repeats, quiet (no progress).
function M.get(device, opts)
  if type(device) == "table" and opts == nil then device, opts = nil, device end
  local fname = "tf.ceilings.get"
  check.arg(device, fname, "the device", "string", true)
  opts = check.keys(opts, fname, KEYS)
  check.arg(opts.cache_dir, fname, "cache_dir", "string", true)
  local tf = require "tf"
  local info = tf.device_info(device)
  local dev = info.device
  local default_sizes = M.defaults[info.type] or M.defaults.cpu
  local sizes = {}
  for k, v in pairs(default_sizes) do
    local given = opts[k]
    if given ~= nil then
      if math.type(given) ~= "integer" or given < (k == "warmup" and 0 or 1) then
        error(string.format("%s: %s must be a positive integer, not %s", fname, k, tostring(given)), 2)
      end
      if k == "copy_bytes" and given < 4 then error(fname .. ": copy_bytes must be at least 4", 2) end
    end
    sizes[k] = given or v
  end
  if info.type == "cpu" then sizes.threads = tf.threads() end
  local dir = opts.cache ~= false and (opts.cache_dir or require("tf.cuda").user_cache("ceilings")) or nil
  local path = dir and cache_file(dir, info, sizes, default_sizes)
  if path and not opts.refresh then
    local doc = path and cache_read(path, info)
    if doc then
      local c = doc.ceilings
      c.source = "cache"
      return c
    end
  end
  if not opts.quiet then
    io.stderr:write(string.format("measuring %s's ceilings (once, cached in %s)\n", dev,
      path or "no file: the cache is off"))
  end
  local c = measure(tf, dev, info, sizes, opts.quiet)
  c.device, c.driver, c.cuda = info.name, info.driver_version, info.runtime_version
  c.measured = os_date("!%Y-%m-%dT%H:%M:%SZ")
  c.sizes = sizes
  if path then
    cache_write(dir, path, { format = M.FORMAT, device_name = info.name, ceilings = c,
      tfhost = tf.version .. " (" .. tf.commit .. ")" })
  end
  c.source = "measured"
  return c
end

return M
