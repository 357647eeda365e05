-- tf.range and tf.prof. On the CPU device (every machine): ranges nest, close
-- on errors and complain about mismatched closes; host-timed op records
-- count per range (3 matmuls in "a", 2 of them in "b" nested in "a");
-- shares sum to 100; range wall times nest; the Chrome trace parses back
-- with every event well-formed, its durations equal to the records' and
-- each range holding its ops in time; one collector at a time; reads after
-- stop; the CUPTI failure path (TF_PROF_FORCE_NO_CUPTI) prints one line and
-- keeps host records; busy time (the union of kernel intervals per device)
-- on the CPU's ops and on stand-in records of two overlapping streams. On
-- a GPU with CUPTI, the same counts from CUPTI's kernel records (cuBLAS
-- GEMMs attributed through the external correlation ids), launch shapes,
-- memcpy byte counts, kernels inside their ranges, and the busy time of
-- the fused engine's overlapped training step.
local T = require "harness"
local cpu = { device = "cpu" }

-- Host op records on the CPU need tf_cpu_backend() to hand out the wrapped
-- table: say so plainly instead of failing on counts.
local function require_cpu_ops()
  if not tf._prof.cpu_wired() then
    error("CPU op records are off: tf_cpu_backend() must return tf_cpu_prof_backend(&table) (kernels/cpu/cpu_prof.h)", 2)
  end
end

local function find(rows, name)
  for _, r in ipairs(rows) do
    if r.name == name then return r end
  end
end

local function pct_sum(rows)
  local s = 0
  for _, r in ipairs(rows) do s = s + r.pct end
  return s
end

-- 3 matmuls inside "a", 2 more inside "b" nested in "a", on device.
local function known_sequence(device)
  local x = tf.randn({ 48, 48 }, { device = device })
  tf.sync()
  local p <close> = tf.prof.start()
  tf.range("a", function()
    for _ = 1, 3 do tf.matmul(x, x) end
    tf.range("b", function()
      for _ = 1, 2 do tf.matmul(x, x) end
      tf.sync()
    end)
    tf.sync()
  end)
  p:stop()
  return p
end

T.test("ranges nest, give back fn's results and close on errors", function()
  T.eq(tf.prof.stack(), {})
  do
    local _ <close> = tf.range("outer")
    T.eq(tf.prof.stack(), { "outer" })
    local a, b = tf.range("inner", function(x, y)
      T.eq(tf.prof.stack(), { "outer", "inner" })
      return x + y, "z"
    end, 1, 2)
    T.eq({ a, b }, { 3, "z" })
    local ok, err = pcall(tf.range, "boom", function()
      local _ <close> = tf.range("deeper")
      error("failed inside")
    end)
    T.eq(ok, false)
    T.ok(tostring(err):find("failed inside", 1, true), err)
    T.eq(tf.prof.stack(), { "outer" })
  end
  T.eq(tf.prof.stack(), {})
end)

T.test("closing twice is harmless; mismatched closes are clear errors", function()
  local r = tf.range("x")
  T.eq(r.name, "x")
  T.ok(r.open)
  T.ok(math.type(r.id) == "integer" and r.id > 0)
  r:close()
  r:close()
  T.eq(r.open, false)
  T.eq(tf.prof.stack(), {})
  local a = tf.range("a")
  local b = tf.range("b")
  T.raises(function() a:close() end, "range 'a' closed while 'b' opened inside it was still open")
  T.eq(tf.prof.stack(), {}) -- closed with it: the stack is consistent again
  b:close() -- already closed: nothing
  T.eq(tf.prof.stack(), {})
  T.raises(function() tf.range(42) end, "tf.range: expects a range name")
  T.raises(function() tf.range("x", 42) end, "tf.range: the second argument must be a function")
  T.eq(tf.prof.stack(), {})
  local shown = tf.range("shown")
  T.ok(tostring(shown):find("tf.Range(shown, open)", 1, true), tostring(shown))
  shown:close()
  T.ok(tostring(shown):find("closed", 1, true))
end)

T.test("a range open when the collector starts or stops is recorded as open", function()
  local left = tf.range("left open")
  local p <close> = tf.prof.start{ kernels = false, memcpy = false }
  local inside = tf.range("inside")
  p:stop()
  local rows = p:ranges{ instances = true }
  T.eq(#rows, 2)
  T.eq(rows[1].name, "left open")
  T.eq(rows[1].open, true)
  T.ok(rows[1].start_ms < 0, "opened before the session started")
  T.eq(rows[2].parent, rows[1].id)
  T.eq(rows[2].open, true)
  inside:close()
  left:close()
  T.eq(tf.prof.stack(), {})
  T.eq(p:ranges{ instances = true }[1].open, true) -- the stopped session keeps what it saw
end)

T.test("host op records count per range on the CPU", function()
  require_cpu_ops()
  local p = known_sequence("cpu")
  local a = p:kernels{ range = "a" }
  local b = p:kernels{ range = "b" }
  T.eq(find(a, "matmul").instances, 5)
  T.eq(find(a, "matmul").class, "gemm")
  T.eq(find(b, "matmul").instances, 2)
  T.eq(find(p:kernels{ range = { "a", "b" } }, "matmul").instances, 2)
  T.eq(find(p:kernels(), "matmul").instances, 5)
  T.near(pct_sum(a), 100, 1e-9)
  T.near(pct_sum(b), 100, 1e-9)
  T.near(pct_sum(p:kernels()), 100, 1e-9)
  local by_class = p:kernels{ range = "a", by = "class" }
  T.eq(find(by_class, "gemm").instances, 5)
  T.near(pct_sum(by_class), 100, 1e-9)
  local by_range = p:kernels{ by = "range" }
  local in_b = 0
  for _, r in ipairs(b) do in_b = in_b + r.instances end
  T.eq(find(by_range, "b").instances, in_b)
  T.ok(find(by_range, "a").instances >= in_b + 3)
  -- statistics of a row agree with themselves
  local m = find(a, "matmul")
  T.ok(m.min_us <= m.median_us and m.median_us <= m.max_us)
  T.near(m.avg_us * m.instances / 1e3, m.total_ms, 1e-9)
  -- rows come largest first
  for i = 2, #a do T.ok(a[i - 1].total_ms >= a[i].total_ms) end
  -- one instance: only its kernels
  local b_id
  for _, r in ipairs(p:ranges{ instances = true }) do
    if r.name == "b" then b_id = r.id end
  end
  T.eq(find(p:kernels{ instance = b_id }, "matmul").instances, 2)
  T.eq(p:kernels{ range = "nowhere" }, {})
end)

T.test("range wall times nest and GPU (op) times add up", function()
  require_cpu_ops()
  local p = known_sequence("cpu")
  local rows = p:ranges()
  local a, b = find(rows, "a"), find(rows, "b")
  T.eq(a.instances, 1)
  T.eq(b.instances, 1)
  T.ok(b.wall_ms <= a.wall_ms, "child wall <= parent wall")
  T.ok(b.gpu_ms <= a.gpu_ms and a.gpu_ms <= a.wall_ms, "op time inside the range's wall time")
  T.ok(b.kernels >= 2 and a.kernels >= 5)
  local k_total = 0
  for _, r in ipairs(p:kernels{ range = "a", copies = false }) do k_total = k_total + r.total_ms end
  T.near(a.gpu_ms, k_total, 1e-9)
  local inst = p:ranges{ instances = true }
  T.eq(#inst, 2)
  T.eq(inst[1].name, "a")
  T.eq(inst[1].depth, 0)
  T.eq(inst[2].parent, inst[1].id)
  T.eq(inst[2].depth, 1)
  T.eq(inst[2].path, "a/b")
  T.ok(inst[1].start_ms <= inst[2].start_ms and inst[2].end_ms <= inst[1].end_ms)
  T.eq(inst[1].open, false)
end)

T.test("records: raw arrays with names, devices, times and ranges", function()
  require_cpu_ops()
  local p = known_sequence("cpu")
  local rec = p:records()
  T.eq(#rec.ranges, 2)
  local ids = {}
  for _, r in ipairs(rec.ranges) do ids[r.name] = r.id end
  local n = 0
  for _, k in ipairs(rec.kernels) do
    T.ok(k.end_ns >= k.start_ns)
    if k.name == "matmul" then
      n = n + 1
      T.eq(k.device, "cpu")
      T.eq(k.host, true)
      T.eq(k.stream, 0)
      T.ok(k.range == ids.a or k.range == ids.b)
    end
  end
  T.eq(n, 5)
  T.eq(rec.memcpy, {})
  T.eq(rec.memset, {})
  local info = p:info()
  T.eq(info.running, false)
  T.ok(info.stop_ns >= info.start_ns)
  T.eq(info.options.host_ops, true)
end)

T.test("busy time on the CPU: under the wall time of ranges that wait, equal to the op time", function()
  require_cpu_ops()
  local p = known_sequence("cpu") -- each range ends with tf.sync()
  for _, r in ipairs(p:ranges()) do
    T.ok(r.busy_ms <= r.wall_ms, string.format("%s: busy %.6f ms <= wall %.6f ms", r.name, r.busy_ms, r.wall_ms))
    T.ok(r.busy_ms <= r.gpu_ms, string.format("%s: busy <= kernel time (no rounding above it)", r.name))
    -- the CPU's ops run one after the other on one thread: nothing overlaps
    T.near(r.busy_ms, r.gpu_ms, 1e-9, 0, r.name .. ": busy = op time")
  end
  for _, r in ipairs(p:ranges{ instances = true }) do T.ok(r.busy_ms <= r.wall_ms and r.busy_ms <= r.gpu_ms) end
  local all = p:busy()
  T.ok(all.busy_ms > 0 and all.busy_ms <= all.wall_ms, "the session's busy time within its wall time")
  T.near(all.busy_ms, all.kernel_ms, 1e-9)
  T.eq(#all.devices, 1)
  T.eq(all.devices[1].device, "cpu")
  T.eq(all.devices[1].kernels, all.kernels)
  local a = p:busy{ range = "a" }
  T.near(a.busy_ms, find(p:ranges(), "a").busy_ms, 1e-12)
  T.near(a.wall_ms, find(p:ranges(), "a").wall_ms, 1e-12)
  T.eq(a.kernels, find(p:ranges(), "a").kernels)
  T.raises(function() p:busy{ colour = 1 } end, "profile:busy: unknown option 'colour'")
  T.raises(function() p:busy{ range = 3 } end, "profile:busy: range must be a name or a list of names")
  T.raises(function() p:busy{ instance = 1.5 } end, "profile:busy: instance must be an integer range id")
end)

-- A stand-in for a session (p:info and p:records), for the analysis of
-- records no machine here makes: kernels of two streams of cuda:0 that
-- overlap (an optimizer beside a backward pass) and one of cuda:1 at the
-- same time. Times in ms.
local function overlapped_profile()
  local ms = 1000000
  local function kernel(name, device, stream, t0, t1, range)
    return { name = name, short_name = name, device = device, stream = stream, start_ns = t0 * ms,
             end_ns = t1 * ms, range = range, host = false, correlation = 1, grid = { 1, 1, 1 },
             block = { 1, 1, 1 }, registers = 1, static_shared = 0, dynamic_shared = 0, shared_memory = 0 }
  end
  local rec = {
    ranges = {
      { id = 1, name = "step", depth = 0, start_ns = 0, end_ns = 1000 * ms, open = false },
      { id = 2, name = "backward", parent = 1, depth = 1, start_ns = 100 * ms, end_ns = 800 * ms, open = false },
    },
    kernels = {
      kernel("gemm_a", "cuda:0", 7, 100, 400, 2),
      kernel("adamw", "cuda:0", 8, 300, 600, 1), -- beside gemm_a and gemm_b
      kernel("gemm_b", "cuda:0", 7, 400, 700, 2),
      kernel("adamw", "cuda:0", 8, 800, 900, 1),
      kernel("gemm_c", "cuda:1", 3, 100, 300, 1), -- another device: its time adds
      kernel("lone", "cuda:0", 7, 950, 960, nil), -- outside every range
    },
    memcpy = {}, memset = {}, host_ops = {},
  }
  local info = { running = false, gpu = true, start_ns = 0, stop_ns = 1000 * ms }
  local real = tf.prof.start{ kernels = false, memcpy = false, host_ops = false }
  real:stop()
  local fake = { info = function() return info end, records = function() return rec end }
  -- the Lua methods of tf.Profile, on the stand-in
  return setmetatable(fake, { __index = function(_, k) return real[k] end })
end

T.test("busy time: the union of overlapping kernels' intervals per device, summed over devices", function()
  local p = overlapped_profile()
  local rows = p:ranges()
  local step, bwd = find(rows, "step"), find(rows, "backward")
  T.near(step.gpu_ms, 300 + 300 + 300 + 100 + 200, 1e-12)
  T.near(step.busy_ms, 600 + 100 + 200, 1e-12) -- cuda:0 [100, 700) and [800, 900); cuda:1 [100, 300)
  T.ok(step.busy_ms < step.gpu_ms and step.busy_ms <= step.wall_ms)
  T.near(bwd.gpu_ms, 600, 1e-12)
  T.near(bwd.busy_ms, 600, 1e-12) -- one stream: nothing overlaps
  local inst = p:ranges{ instances = true }
  T.near(inst[1].busy_ms, 900, 1e-12)
  T.near(inst[2].busy_ms, 600, 1e-12)
  local all = p:busy()
  T.near(all.kernel_ms, 1210, 1e-12)
  T.near(all.busy_ms, 910, 1e-12)
  T.near(all.wall_ms, 1000, 1e-12)
  T.eq(all.kernels, 6)
  T.eq(#all.devices, 2)
  T.eq({ all.devices[1].device, all.devices[2].device }, { "cuda:0", "cuda:1" })
  T.near({ all.devices[1].kernel_ms, all.devices[1].busy_ms, all.devices[1].kernels }, { 1010, 710, 5 }, 1e-12)
  T.near({ all.devices[2].kernel_ms, all.devices[2].busy_ms, all.devices[2].kernels }, { 200, 200, 1 }, 1e-12)
  local one = p:busy{ device = "cuda:1" }
  T.near({ one.kernel_ms, one.busy_ms }, { 200, 200 }, 1e-12)
  local b = p:busy{ range = "backward" }
  T.near({ b.kernel_ms, b.busy_ms, b.wall_ms }, { 600, 600, 700 }, 1e-12)
  T.near(p:busy{ instance = 1 }.busy_ms, 900, 1e-12)
  T.near(p:busy{ instance = 1 }.wall_ms, 1000, 1e-12)
  local both = p:busy{ range = { "step", "backward" } }
  T.near(both.busy_ms, 600, 1e-12)
  T.eq(both.wall_ms, nil) -- no one wall time for a list of names
  T.eq(p:busy{ range = "nowhere" }.kernels, 0)
  T.eq(tf._prof.busy_ns({}), 0)
  T.eq(tf._prof.busy_ns({ 0, 10, 5, 15, 20, 30, 25, 26, 40, 40 }), 25)
  T.raises(function() tf._prof.busy_ns({ 1, 2, 3 }) end, "expects start, end pairs")
  T.raises(function() tf._prof.busy_ns({ 1, "x" }) end, "value 2 is not an integer time")
end)

-- Every event well-formed; X events' durations equal the records'; each
-- op event lies inside the events of the ranges on its path.
local function check_trace(p, path)
  p:trace(path)
  local doc = tf.json.read(path)
  T.eq(doc.displayTimeUnit, "ms")
  T.ok(type(doc.traceEvents) == "table" and #doc.traceEvents > 0)
  local ranges, ops, names = {}, {}, {}
  for _, ev in ipairs(doc.traceEvents) do
    T.ok(type(ev.name) == "string" and (ev.ph == "X" or ev.ph == "M"), "name and ph")
    T.ok(math.type(ev.pid) == "integer" and math.type(ev.tid) == "integer", "pid and tid")
    if ev.ph == "M" then
      T.ok(ev.args and (ev.args.name or ev.args.sort_index), "metadata args")
      if ev.name == "process_name" then names[ev.pid] = ev.args.name end
    else
      T.ok(type(ev.ts) == "number" and ev.ts >= 0 and type(ev.dur) == "number" and ev.dur >= 0, "ts and dur")
      if ev.cat == "range" then ranges[ev.args.id] = ev else ops[#ops + 1] = ev end
    end
  end
  -- durations match the records
  local rec = p:records()
  local durs = {}
  for _, k in ipairs(rec.kernels) do durs[#durs + 1] = (k.end_ns - k.start_ns) / 1e3 end
  for _, c in ipairs(rec.memcpy) do durs[#durs + 1] = (c.end_ns - c.start_ns) / 1e3 end
  for _, c in ipairs(rec.memset) do durs[#durs + 1] = (c.end_ns - c.start_ns) / 1e3 end
  local got = {}
  for _, ev in ipairs(ops) do if ev.pid ~= tf.prof.HOST_PID then got[#got + 1] = ev.dur end end
  table.sort(durs)
  table.sort(got)
  T.near(got, durs, 1e-9, 1e-6, "event durations vs records")
  -- ranges hold their ops (host times: ops run on the host, or a sync closes the range)
  local by_path = {}
  for _, r in pairs(ranges) do by_path[r.args.path] = r end
  local eps = 1e-3 -- microseconds of float rounding
  for _, ev in ipairs(ops) do
    local path = ev.args.range
    while path do
      local r = by_path[path]
      T.ok(r, "range event for " .. path)
      T.ok(r.ts - eps <= ev.ts and ev.ts + ev.dur <= r.ts + r.dur + eps,
        string.format("%s [%g, %g] inside range %s [%g, %g]", ev.name, ev.ts, ev.ts + ev.dur, path, r.ts, r.ts + r.dur))
      path = path:match("^(.*)/[^/]*$")
    end
  end
  return doc, names
end

T.test("the Chrome trace parses back, consistent with the records", function()
  require_cpu_ops()
  local p = known_sequence("cpu")
  local path = os.tmpname()
  local _, names = check_trace(p, path)
  T.eq(names[tf.prof.HOST_PID], "host (tfhost ranges)")
  T.eq(names[tf.prof.CPU_PID], "cpu")
  os.remove(path)
  T.raises(function() p:trace("/nonexistent-dir/t.json") end, "profile:trace")
end)

T.test("an empty session still makes valid tables and a valid trace", function()
  local p <close> = tf.prof.start{ host_ops = false }
  p:stop()
  T.eq(p:kernels(), {})
  T.eq(p:ranges(), {})
  local path = os.tmpname()
  p:trace(path)
  T.eq(#tf.json.read(path).traceEvents, 0)
  os.remove(path)
  local text = tf.report.table(p:kernels(), { columns = tf.prof.columns.kernels, out = false })
  T.ok(text:find("| name | class |", 1, true), text)
end)

T.test("one collector at a time; stop is idempotent; reads after stop", function()
  local p = tf.prof.start()
  T.eq(p.running, true)
  T.raises(function() tf.prof.start() end, "already running")
  p:stop()
  p:stop()
  T.eq(p.running, false)
  T.ok(type(p:kernels()) == "table")
  do
    local q <close> = tf.prof.start{ host_ops = true }
    T.eq(q.running, true)
  end
  local r = tf.prof.start()
  r:stop()
  T.raises(function() tf.prof.start{ bogus = true } end, "unknown option 'bogus'")
  T.raises(function() tf.prof.start{ kernels = 1 } end, "option 'kernels' must be a boolean")
  T.raises(function() p:kernels{ by = "size" } end, "by must be")
  T.raises(function() p:kernels{ colour = 1 } end, "unknown option 'colour'")
  T.raises(function() p:ranges{ instances = true, x = 1 } end, "unknown option 'x'")
end)

T.test("tf.prof.available and the reason on the profile", function()
  local ok, reason = tf.prof.available()
  T.ok(type(ok) == "boolean")
  local p = tf.prof.start()
  p:stop()
  if ok then
    T.eq(reason, nil)
    T.eq(p.gpu, true)
  else
    T.ok(type(reason) == "string" and #reason > 0, "a reason")
    T.eq(p.gpu, false)
    T.eq(p.reason, p:info().reason)
  end
end)

-- The tfhost binary running this test (arg's most negative index).
local function tfhost_path()
  local i = -1
  while arg[i - 1] do i = i - 1 end
  return arg[i]
end

T.test("a range that never opened: an empty table and one note on stderr", function()
  local script = os.tmpname()
  local f = assert(io.open(script, "w"))
  f:write([[
    local x = tf.randn({8, 8}, {device = "cpu"})
    local p <close> = tf.prof.start{kernels = false, memcpy = false}
    tf.range("there", function() tf.matmul(x, x) end)
    p:stop()
    print("rows=" .. #p:kernels{range = "not there"} .. "," .. #p:kernels{range = {"there", "not there"}}
      .. "," .. #p:kernels{range = "not there", by = "class"})
  ]])
  f:close()
  local pipe = assert(io.popen(string.format("'%s' '%s' 2>&1", tfhost_path(), script)))
  local out = pipe:read("a")
  local ok = pipe:close()
  os.remove(script)
  T.ok(ok, out)
  T.ok(out:find("rows=0,0,0", 1, true), out)
  local _, notes = out:gsub("tf%.prof: no range named 'not there' was open while the collector ran", "")
  T.eq(notes, 1, "one note per name and session:\n" .. out)
end)

T.test("without CUPTI: one line on stderr, host records kept", function()
  local script = os.tmpname()
  local f = assert(io.open(script, "w"))
  f:write([[
    local x = tf.randn({8, 8}, {device = "cpu"})
    for _ = 1, 2 do
      local p <close> = tf.prof.start()
      tf.range("r", function() tf.matmul(x, x) end)
      p:stop()
      local n = 0
      for _, k in ipairs(p:records().kernels) do if k.name == "matmul" then n = n + 1 end end
      print("gpu=" .. tostring(p.gpu) .. " matmuls=" .. n .. " wired=" .. tostring(tf._prof.cpu_wired()))
    end
    print("available=" .. tostring((tf.prof.available())))
  ]])
  f:close()
  local cmd = string.format("TF_PROF_FORCE_NO_CUPTI=1 '%s' '%s' 2>&1", tfhost_path(), script)
  local pipe = assert(io.popen(cmd))
  local out = pipe:read("a")
  pipe:close()
  os.remove(script)
  local lines = 0
  for line in out:gmatch("[^\n]+") do
    if line:find("^tf%.prof: GPU kernel records unavailable %(.+%); recording host timings only$") then
      lines = lines + 1
      if tf.cuda.is_available() then T.ok(line:find("TF_PROF_FORCE_NO_CUPTI is set", 1, true), line) end
    end
  end
  T.eq(lines, 1, "one stderr line for two starts:\n" .. out)
  local _, starts = out:gsub("gpu=false", "")
  T.eq(starts, 2, out)
  T.ok(out:find("available=false", 1, true), out)
  if out:find("wired=true", 1, true) then
    local _, ok = out:gsub("matmuls=1", "")
    T.eq(ok, 2, out)
  end
end)

-- ---- on a GPU, with CUPTI ------------------------------------------------------------------

local function require_gpu_records()
  if not tf.cuda.is_available() then T.skip("no GPU: the CUPTI tests need one") end
  local ok, why = tf.prof.available()
  if not ok then error("a GPU is present but tf.prof.available() says no: " .. tostring(why), 2) end
end

T.test("GPU: kernel records from CUPTI count per range", function()
  if not tf.cuda.is_available() then T.skip_test("no GPU is present") end
  require_gpu_records()
  local p = known_sequence("cuda")
  T.eq(p.gpu, true)
  local a = p:kernels{ range = "a", by = "class" }
  local b = p:kernels{ range = "b", by = "class" }
  local ga, gb = find(a, "gemm"), find(b, "gemm")
  T.ok(ga and gb, "gemm rows (cuBLAS kernels attributed through the external correlation id)")
  T.ok(ga.instances >= 5 and gb.instances >= 2, string.format("gemm kernels: a %d, b %d", ga.instances, gb.instances))
  T.eq(ga.instances - gb.instances >= 3, true)
  T.near(pct_sum(a), 100, 1e-9)
  local rec = p:records()
  local ids = {}
  for _, r in ipairs(rec.ranges) do ids[r.name] = r.id end
  local in_a = 0
  for _, k in ipairs(rec.kernels) do
    if not k.host then
      T.eq(k.device, "cuda:0")
      T.ok(k.range == ids.a or k.range == ids.b, "every kernel launched in a range maps to it: " .. k.name)
      T.ok(k.grid[1] >= 1 and k.block[1] >= 1 and k.registers >= 1, "launch shape of " .. k.name)
      T.ok(k.stream > 0 and k.correlation > 0)
      T.ok(k.end_ns > k.start_ns)
      in_a = in_a + 1
    end
  end
  T.ok(in_a >= 5)
  print(string.format("  GPU kernels in a: %d; top: %s (%s)", in_a, a[1].name, a[1].class))
  local ranges = p:ranges()
  T.ok(find(ranges, "b").gpu_ms <= find(ranges, "a").gpu_ms)
  local path = os.tmpname()
  local doc = check_trace(p, path)
  os.remove(path)
  local gpu_events = 0
  for _, ev in ipairs(doc.traceEvents) do
    if ev.ph == "X" and ev.pid == 0 then
      gpu_events = gpu_events + 1
      T.ok(ev.args.grid and ev.args.block and ev.args.registers and ev.args.shared_memory and ev.args.full_name)
    end
  end
  T.ok(gpu_events >= 5)
end)

T.test("GPU: the fused step's optimizer beside its backward pass: busy time under kernel and wall time", function()
  if not tf.cuda.is_available() then T.skip_test("no GPU is present") end
  require_gpu_records()
  tf.seed(0)
  local m = tf.model.new{ preset = "medium", context_length = 512, precision = "bf16", impl = "fused", device = "cuda" }
  m:set_overlap(true) -- AdamW on a second stream, beside the rest of the backward pass (the default)
  T.eq(m.engine:info().overlap, true)
  local ids = tf.randint(0, 10000, { 4, 512 }, { device = "cuda" })
  local targets = tf.randint(0, 10000, { 4, 512 }, { device = "cuda" })
  for _ = 1, 3 do m:step(ids, targets):free() end
  tf.sync()
  local p <close> = tf.prof.start()
  tf.range("warm-up", function() m:step(ids, targets):free() end) -- graphs captured again under the collector
  tf.sync()
  for _ = 1, 3 do
    tf.range("training step", function()
      m:step(ids, targets):free()
      tf.sync() -- the range waits for its kernels: their busy time lies inside it
    end)
  end
  p:stop()
  local skew = 0.1 -- ms: the CUPTI-to-host clock mapping's error at both ends
  local row = find(p:ranges(), "training step")
  print(string.format("  3 steps: wall %.3f ms, kernels %.3f ms summed, busy %.3f ms (%d kernels)", row.wall_ms,
    row.gpu_ms, row.busy_ms, row.kernels))
  T.ok(row.busy_ms <= row.wall_ms + skew, "busy time within the wall time")
  T.ok(row.busy_ms <= row.gpu_ms, "busy time within the summed kernel time")
  T.ok(row.busy_ms < row.gpu_ms, "overlapped: the optimizer's kernels ran beside the backward pass's")
  for _, r in ipairs(p:ranges{ instances = true }) do
    if r.name == "training step" then
      T.ok(r.busy_ms <= r.wall_ms + skew and r.busy_ms <= r.gpu_ms, string.format("step %d: busy %.3f, wall %.3f, "
        .. "kernels %.3f ms", r.id, r.busy_ms, r.wall_ms, r.gpu_ms))
    end
  end
  local all = p:busy()
  T.ok(all.busy_ms <= all.wall_ms + skew and all.busy_ms < all.kernel_ms, "the session: busy within wall and sum")
  T.eq(all.devices[1].device, "cuda:0")
  T.near(p:busy{ range = "training step" }.busy_ms, row.busy_ms, 1e-12)
end)

T.test("GPU: memcpy records with their byte counts, in their range", function()
  if not tf.cuda.is_available() then T.skip_test("no GPU is present") end
  require_gpu_records()
  local x = tf.randn({ 64, 32 }, { device = "cuda" })
  tf.sync()
  local p <close> = tf.prof.start()
  local y
  tf.range("to host", function() y = x:to("cpu") end)
  local z
  tf.range("to device", function() z = y:to("cuda") end)
  p:stop()
  local rec = p:records()
  local ids = {}
  for _, r in ipairs(rec.ranges) do ids[r.name] = r.id end
  local seen = {}
  for _, c in ipairs(rec.memcpy) do
    if c.bytes == 64 * 32 * 4 then
      seen[c.kind] = c
      T.ok(c.end_ns >= c.start_ns)
    end
  end
  T.ok(seen.DtoH and seen.HtoD, "a DtoH and an HtoD copy of 8192 bytes")
  T.eq(seen.DtoH.range, ids["to host"])
  T.eq(seen.HtoD.range, ids["to device"])
  local rows = p:kernels{ range = "to host" }
  T.ok(find(rows, "[memcpy DtoH]"), "copies are rows of kernels{} (copies = true)")
  T.eq(find(p:kernels{ range = "to host", copies = false }, "[memcpy DtoH]"), nil)
  T.eq(z:tolist()[1][1], x:to("cpu"):tolist()[1][1])
end)

T.test("GPU: kernels lie inside their range's host interval when the range waits for them", function()
  if not tf.cuda.is_available() then T.skip_test("no GPU is present") end
  require_gpu_records()
  local p = known_sequence("cuda") -- each range ends with tf.sync()
  local inst = {}
  for _, r in ipairs(p:records().ranges) do inst[r.id] = r end
  local skew = 50e3 -- ns of allowed clock mapping error
  for _, k in ipairs(p:records().kernels) do
    local r = k.range and inst[k.range]
    if r then
      T.ok(k.start_ns >= r.start_ns - skew and k.end_ns <= r.end_ns + skew,
        string.format("%s [%d, %d] in %s [%d, %d]", k.short_name, k.start_ns, k.end_ns, r.name, r.start_ns, r.end_ns))
    end
  end
  T.ok(math.abs(p:info().clock_drift_ns) < 1e6, "CUPTI-to-host clock drift under 1 ms")
end)

T.run()
