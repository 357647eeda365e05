-- tf.memviz: the pickle (read back by a reader of exactly the opcodes it
-- writes), the JSON, the HTML picture and the summary, on snapshots built
-- by hand from known alloc/free sequences.
local T = require "harness"
local memviz = require "tf.memviz"
local py = memviz.python

local KiB, MiB = 1024, 1024 * 1024
local BASE = 0x7f0000000000 -- above 2^46, like a CUDA address

-- ---- a reader for the opcodes memviz writes ----------------------------------

local NONE = setmetatable({}, { __name = "None" })
local unpack = string.unpack

--- Walks the pickle's opcodes and rebuilds the Python value: dicts and lists
-- as Lua tables (kinds[t] says which), tuples as {tuple = {...}}, None as
-- NONE. Fails on anything but protocol 2 with the expected opcodes, on
-- invalid UTF-8, and unless STOP ends the bytes with one value left.
local function unpickle(bytes)
  local stack, marks, kinds = {}, {}, {}
  local stats = { ops = {}, largest_mark = 0 }
  local function push(v) stack[#stack + 1] = v end
  local function pop_mark()
    local m = table.remove(marks)
    assert(m, "an opcode needs a MARK")
    local items = {}
    for i = m + 1, #stack do items[#items + 1] = stack[i] end
    for i = #stack, m + 1, -1 do stack[i] = nil end
    if #items > stats.largest_mark then stats.largest_mark = #items end
    return items
  end
  assert(bytes:sub(1, 2) == "\x80\x02", "the pickle starts with PROTO 2")
  local pos = 3
  while true do
    local op = bytes:sub(pos, pos)
    assert(op ~= "", "the pickle ends before STOP")
    pos = pos + 1
    stats.ops[op] = (stats.ops[op] or 0) + 1
    if op == "}" then
      local t = {}
      kinds[t] = "dict"
      push(t)
    elseif op == "]" then
      local t = {}
      kinds[t] = "list"
      push(t)
    elseif op == "(" then
      marks[#marks + 1] = #stack
    elseif op == "u" then
      local items = pop_mark()
      local d = stack[#stack]
      assert(kinds[d] == "dict", "SETITEMS needs a dict")
      assert(#items % 2 == 0, "SETITEMS needs key, value pairs")
      for i = 1, #items, 2 do d[items[i]] = items[i + 1] end
    elseif op == "e" then
      local items = pop_mark()
      local l = stack[#stack]
      assert(kinds[l] == "list", "APPENDS needs a list")
      for _, v in ipairs(items) do l[#l + 1] = v end
    elseif op == "t" then
      push({ tuple = pop_mark() })
    elseif op == "\x86" then
      local b = table.remove(stack)
      local a = table.remove(stack)
      push({ tuple = { a, b } })
    elseif op == "X" then
      local len = unpack("<I4", bytes, pos)
      local s = bytes:sub(pos + 4, pos + 3 + len)
      assert(#s == len, "BINUNICODE runs past the end")
      assert(utf8.len(s), "BINUNICODE holds invalid UTF-8")
      push(s)
      pos = pos + 4 + len
    elseif op == "K" then
      push(bytes:byte(pos))
      pos = pos + 1
    elseif op == "M" then
      push((unpack("<I2", bytes, pos)))
      pos = pos + 2
    elseif op == "J" then
      push((unpack("<i4", bytes, pos)))
      pos = pos + 4
    elseif op == "\x8a" then
      local len = bytes:byte(pos)
      assert(len >= 1 and len <= 8, "LONG1 of " .. len .. " bytes")
      push((unpack("<i" .. len, bytes, pos + 1)))
      pos = pos + 1 + len
    elseif op == "G" then
      push((unpack(">d", bytes, pos)))
      pos = pos + 8
    elseif op == "N" then
      push(NONE)
    elseif op == "\x88" then
      push(true)
    elseif op == "\x89" then
      push(false)
    elseif op == "." then
      assert(pos == #bytes + 1, "STOP is the last byte")
      assert(#stack == 1 and #marks == 0, "STOP leaves exactly one value")
      return stack[1], kinds, stats
    else
      error(string.format("unexpected opcode 0x%02x at byte %d", op:byte(), pos - 1))
    end
  end
end

local function count(s, pattern)
  local n = 0
  for _ in s:gmatch(pattern) do n = n + 1 end
  return n
end

-- ---- snapshots ----------------------------------------------------------------

local function frames(...)
  local out = {}
  for i, f in ipairs({ ... }) do out[i] = { filename = f[1], line = f[2], name = f[3] } end
  return out
end

-- One 2 MiB segment: a recorded parameter block, an unrecorded one, a free
-- tail; a trace that allocates, frees, runs out of memory and frees a block
-- it never allocated.
local function small_snapshot()
  return {
    device = "cuda:0",
    device_index = 0,
    segments = {
      { address = BASE, total_size = 2 * MiB, stream = 0, segment_type = "large", allocated_size = 768 * KiB,
        active_size = 768 * KiB, requested_size = 700 * KiB,
        blocks = {
          { address = BASE, size = 512 * KiB, requested_size = 444 * KiB, state = "active_allocated",
            tag = "parameter", what = "model.init", source = "experiments/x.lua:3", ranges = { "init" },
            frames = frames({ "experiments/x.lua", 3, "main" }) },
          { address = BASE + 512 * KiB, size = 256 * KiB, requested_size = 256 * KiB, state = "active_allocated" },
          { address = BASE + 768 * KiB, size = 1280 * KiB, requested_size = 0, state = "inactive" },
        } },
    },
    trace = {
      { action = "segment_alloc", addr = BASE, size = 2 * MiB, stream = 0, time_us = 5 },
      { action = "alloc", addr = BASE + MiB, size = 512 * KiB, requested_size = 500 * KiB, stream = 0, time_us = 10,
        tag = "activation", what = "matmul", source = "experiments/x.lua:12", ranges = { "forward", "layer 3" },
        frames = frames({ "experiments/x.lua", 12, "step" }, { "experiments/x.lua", 40, "main" }) },
      { action = "free_completed", addr = BASE + MiB, size = 512 * KiB, stream = 0, time_us = 20,
        tag = "activation", what = "matmul", source = "experiments/x.lua:12", ranges = { "forward", "layer 3" },
        frames = frames({ "experiments/x.lua", 12, "step" }, { "experiments/x.lua", 40, "main" }) },
      { action = "oom", size = 1 << 41, device_free = 3 * MiB, stream = 0, time_us = 30 },
      { action = "free_completed", addr = BASE + 1536 * KiB, size = 128 * KiB, stream = 0, time_us = 40 },
    },
  }
end

local function frame(filename, line, name) return { filename = filename, line = line, name = name } end

-- What the pickle of small_snapshot() must read back as.
local function small_expected()
  local act_frames = {
    frame("experiments/x.lua", 12, "activation: matmul [forward > layer 3]"),
    frame("experiments/x.lua", 12, "step"),
    frame("experiments/x.lua", 40, "main"),
  }
  local act_meta = "activation: matmul [forward > layer 3]"
  local function event(action, addr, size, time, frames_, meta)
    return { action = action, addr = addr, size = size, stream = 0, time_us = time, frames = frames_,
      user_metadata = meta }
  end
  return {
    segments = {
      { device = 0, address = BASE, total_size = 2 * MiB, allocated_size = 768 * KiB, active_size = 768 * KiB,
        requested_size = 700 * KiB, stream = 0, segment_type = "large", segment_pool_id = { tuple = { 0, 0 } },
        is_expandable = false, frames = {},
        blocks = {
          { address = BASE, size = 512 * KiB, requested_size = 444 * KiB, state = "active_allocated",
            frames = { frame("experiments/x.lua", 3, "parameter: model.init [init]"),
              frame("experiments/x.lua", 3, "main") },
            user_metadata = "parameter: model.init [init]" },
          { address = BASE + 512 * KiB, size = 256 * KiB, requested_size = 256 * KiB, state = "active_allocated",
            frames = {} },
          { address = BASE + 768 * KiB, size = 1280 * KiB, requested_size = 0, state = "inactive", frames = {} },
        } },
    },
    device_traces = { {
      event("segment_alloc", BASE, 2 * MiB, 5, {}),
      event("alloc", BASE + MiB, 512 * KiB, 10, act_frames, act_meta),
      event("free_requested", BASE + MiB, 512 * KiB, 20, act_frames, act_meta),
      event("free_completed", BASE + MiB, 512 * KiB, 20, act_frames, act_meta),
      { action = "oom", device_free = 3 * MiB, size = 1 << 41, stream = 0, time_us = 30, frames = {} },
      event("free_requested", BASE + 1536 * KiB, 128 * KiB, 40, {}),
      event("free_completed", BASE + 1536 * KiB, 128 * KiB, 40, {}),
    } },
    allocator_settings = {
      PYTORCH_CUDA_ALLOC_CONF = "", max_split_size = -1, garbage_collection_threshold = 0.0,
      expandable_segments = false, pinned_num_register_threads = 1, release_lock_on_cudamalloc = false,
      pinned_use_cuda_host_register = false, roundup_power2_divisions = {}, trace_alloc_overflowed = false,
    },
  }
end

-- ---- the pickle ---------------------------------------------------------------

T.test("python.dumps: scalars are the bytes CPython's protocol 2 writes", function()
  local cases = {
    { 0, "K\x00" }, { 255, "K\xff" }, { 256, "M\x00\x01" }, { 65535, "M\xff\xff" },
    { 65536, "J\x00\x00\x01\x00" }, { -1, "J\xff\xff\xff\xff" }, { 0x7fffffff, "J\xff\xff\xff\x7f" },
    { -0x80000000, "J\x00\x00\x00\x80" }, { 0x80000000, "\x8a\x05\x00\x00\x00\x80\x00" },
    { -0x80000001, "\x8a\x05\xff\xff\xff\x7f\xff" }, { 1 << 40, "\x8a\x06\x00\x00\x00\x00\x00\x01" },
    { math.maxinteger, "\x8a\x08\xff\xff\xff\xff\xff\xff\xff\x7f" },
    { math.mininteger, "\x8a\x08\x00\x00\x00\x00\x00\x00\x00\x80" },
    { 1.5, "G\x3f\xf8\x00\x00\x00\x00\x00\x00" }, { true, "\x88" }, { false, "\x89" }, { py.None, "N" },
    { "é", "X\x02\x00\x00\x00\xc3\xa9" },
  }
  for _, c in ipairs(cases) do
    T.eq(py.dumps(c[1]), "\x80\x02" .. c[2] .. ".", "dumps(" .. tostring(c[1]) .. ")")
  end
  T.eq(py.dumps(py.tuple(1, 2)), "\x80\x02K\x01K\x02\x86.")
  T.eq(py.dumps(py.tuple(1, 2, 3)), "\x80\x02(K\x01K\x02K\x03t.")
  T.eq(py.dumps(py.dict("a", 1)), "\x80\x02}(X\x01\x00\x00\x00aK\x01u.")
  T.eq(py.dumps(py.list({ 1 })), "\x80\x02](K\x01e.")
  T.eq(py.dumps(py.dict()), "\x80\x02}.")
  T.raises(function() py.dumps({ 1, 2 }) end, "cannot pickle a plain table")
end)

T.test("integers of every width round-trip; large addresses stay exact", function()
  local values = { 0, 1, 255, 256, 65535, 65536, 0x7fffffff, 0x80000000, 0xffffffff, 1 << 32, (1 << 40) + 5,
    BASE + 123, (1 << 47) - 1, 1 << 55, (1 << 62) + 7, math.maxinteger, -1, -128, -129, -32768, -0x80000000,
    -0x80000001, -(1 << 40), -(1 << 55) - 3, math.mininteger }
  local back = unpickle(py.dumps(py.list(values)))
  T.eq(back, values)
  for i, v in ipairs(back) do T.eq(math.type(v), "integer", "value " .. i) end
  -- through a snapshot: addresses beyond 2^40, sizes beyond 2^32, negative lines
  local snap = { device_index = 0, segments = {}, trace = {
    { action = "alloc", addr = (1 << 47) + 4096, size = (1 << 33) + 1, stream = 0, time_us = 1 << 42,
      tag = "workspace", source = "x.lua:-1", frames = frames({ "[C]", -1, "?" }) } } }
  local e = unpickle(memviz.pickle(snap)).device_traces[1][1]
  T.eq(e.addr, (1 << 47) + 4096)
  T.eq(e.size, (1 << 33) + 1)
  T.eq(e.time_us, 1 << 42)
  T.eq(e.frames, { frame("x.lua", -1, "workspace"), frame("[C]", -1, "?") })
end)

T.test("pickle: segments, blocks and trace read back as PyTorch's snapshot dict", function()
  local bytes = memviz.pickle(small_snapshot())
  local value, kinds, stats = unpickle(bytes)
  T.eq(value, small_expected())
  T.eq(kinds[value], "dict")
  T.eq(kinds[value.segments], "list")
  T.eq(kinds[value.segments[1].frames], "list", "empty frames are a list")
  T.eq(kinds[value.device_traces[1][5].frames], "list")
  T.eq(kinds[value.allocator_settings.roundup_power2_divisions], "dict")
  -- only the opcodes the brief allows; integers beyond 32 bits as LONG1
  local allowed = "\x80}](ueXKMJ\x8aGN\x88\x89\x86t."
  for op in pairs(stats.ops) do T.ok(allowed:find(op, 1, true), string.format("opcode 0x%02x", op:byte())) end
  T.ok((stats.ops["\x8a"] or 0) > 0, "addresses use LONG1")
  T.eq(memviz.pickle(small_snapshot()), bytes, "the same snapshot gives the same bytes")
end)

T.test("pickle: every key PyTorch's readers use is there, with its type", function()
  local v = unpickle(memviz.pickle(small_snapshot()))
  local seg = v.segments[1]
  for _, k in ipairs({ "device", "address", "total_size", "allocated_size", "active_size", "requested_size",
    "stream" }) do
    T.eq(math.type(seg[k]), "integer", "segment " .. k)
  end
  local covered = 0
  for _, b in ipairs(seg.blocks) do
    covered = covered + b.size
    T.eq(type(b.state), "string")
    T.eq(math.type(b.requested_size), "integer")
    T.eq(math.type(b.address), "integer")
  end
  T.eq(covered, seg.total_size, "blocks cover the segment (segsum asserts it)")
  for _, e in ipairs(v.device_traces[1]) do
    T.eq(type(e.action), "string")
    T.eq(math.type(e.size), "integer")
    T.eq(math.type(e.stream), "integer")
    T.eq(math.type(e.time_us), "integer")
    T.ok(e.frames, "every entry has frames")
    if e.action == "oom" then
      T.eq(math.type(e.device_free), "integer")
      T.eq(e.addr, nil, "oom has device_free in place of addr, as PyTorch writes it")
    else
      T.eq(math.type(e.addr), "integer")
    end
    for _, f in ipairs(e.frames) do
      T.eq({ type(f.filename), math.type(f.line), type(f.name) }, { "string", "integer", "string" })
    end
  end
end)

T.test("pickle: one trace list per device up to device_index", function()
  local snap = small_snapshot()
  snap.device, snap.device_index = "cuda:2", 2
  local v = unpickle(memviz.pickle(snap))
  T.eq(#v.device_traces, 3)
  T.eq(v.device_traces[1], {})
  T.eq(v.device_traces[2], {})
  T.eq(#v.device_traces[3], 7)
  T.eq(v.segments[1].device, 2)
  local cpu = unpickle(memviz.pickle({ device = "cpu", segments = {}, trace = {} }))
  T.eq(cpu.device_traces, { {} })
  T.eq(cpu.segments, {})
end)

T.test("strings: UTF-8, quotes and markup survive; invalid bytes become U+FFFD", function()
  local what = 'say "hi" \'there\' <b>&amp;</b> \\ back'
  local snap = { device_index = 0, segments = {}, trace = {
    { action = "alloc", addr = BASE, size = 64, stream = 0, time_us = 1, tag = "activation", what = what,
      source = "expériences/modèle.lua:7", ranges = { "前向", "layer ✓" },
      frames = frames({ "expériences/modèle.lua", 7, "étape" }, { "bad\xff\xfename.lua", 1, "f\xc3" }) } } }
  local e = unpickle(memviz.pickle(snap)).device_traces[1][1]
  T.eq(e.frames[1], frame("expériences/modèle.lua", 7, "activation: " .. what .. " [前向 > layer ✓]"))
  T.eq(e.frames[2], frame("expériences/modèle.lua", 7, "étape"))
  T.eq(e.frames[3], frame("bad\u{FFFD}\u{FFFD}name.lua", 1, "f\u{FFFD}"))
  T.eq(e.user_metadata, "activation: " .. what .. " [前向 > layer ✓]")
  T.eq(memviz.text("ok\xc3"), "ok\u{FFFD}")
end)

T.test("long lists are written in batches of at most 1000 items per MARK", function()
  local trace = {}
  for i = 1, 2500 do
    trace[i] = { action = "alloc", addr = BASE + i * 4096, size = 4096, stream = 0, time_us = i }
  end
  local v, _, stats = unpickle(memviz.pickle({ device_index = 0, segments = {}, trace = trace }))
  T.eq(#v.device_traces[1], 2500)
  T.eq(v.device_traces[1][2500].addr, BASE + 2500 * 4096)
  T.ok(stats.largest_mark <= 2000, "largest MARK holds " .. stats.largest_mark .. " items")
  T.ok(stats.ops["e"] >= 3, "the 2500 entries take three APPENDS")
end)

-- The pickle reader's value as tf.json decodes it (tuples are arrays, None
-- null, integral floats integers).
local function as_json(v, kinds)
  if v == NONE then return tf.json.null end
  if math.type(v) == "float" then return math.tointeger(v) or v end
  if type(v) ~= "table" then return v end
  if v.tuple and not kinds[v] then return as_json(v.tuple, kinds) end
  local out = {}
  for k, x in pairs(v) do out[k] = as_json(x, kinds) end
  return out
end

T.test("json: the same content as the pickle", function()
  local snap = small_snapshot()
  local v, kinds = unpickle(memviz.pickle(snap))
  local decoded = tf.json.decode(memviz.json(snap))
  T.eq(decoded, as_json(v, kinds))
  T.eq(decoded.segments[1].segment_pool_id, { 0, 0 })
  T.eq(decoded.device_traces[1][2].addr, BASE + MiB)
  T.ok(memviz.json(snap):find('"garbage_collection_threshold":0.0', 1, true), "a float stays a float")
  T.ok(memviz.json(snap, { indent = true }):find("\n"), "options pass to tf.json.encode")
end)

-- ---- the picture --------------------------------------------------------------

-- Tags open and close in order (void elements and script bodies aside).
local function balanced(html)
  html = html:gsub("<script>.-</script>", "<script></script>")
  local stack = {}
  for close, name, selfclose in html:gmatch("<(/?)([%a][%w%-]*)[^>]-(/?)>") do
    if name ~= "meta" and selfclose == "" then
      if close == "/" then
        if stack[#stack] ~= name then return false, "</" .. name .. "> closes <" .. tostring(stack[#stack]) .. ">" end
        stack[#stack] = nil
      else
        stack[#stack + 1] = name
      end
    end
  end
  if #stack > 0 then return false, "<" .. stack[#stack] .. "> is never closed" end
  return true
end

local function peak_label(html)
  local bytes, label = html:match('<text id="peak%-label" data%-bytes="(%d+)"[^>]*>([^<]*)</text>')
  return math.tointeger(tonumber(bytes)), label
end

-- Six allocations of comparable sizes: a parameter from before the trace,
-- then a forward/backward pattern. Live bytes after each event:
-- 4, 6, 9, 10 (peak), 7, 9, 7, 6 MiB.
local function training_snapshot()
  local function ev(action, n, size, tag, what, t)
    return { action = action, addr = BASE + n * 16 * MiB, size = size * MiB, stream = 0, time_us = t * 100,
      tag = tag, what = what, source = "experiments/train.lua:" .. (10 + n), ranges = { "step 1", "forward" },
      frames = frames({ "experiments/train.lua", 10 + n, "forward" }) }
  end
  return {
    device = "cuda:0",
    device_index = 0,
    segments = { { address = BASE, total_size = 16 * MiB, stream = 0, segment_type = "large",
      blocks = { { address = BASE, size = 4 * MiB, requested_size = 4 * MiB, state = "active_allocated",
        tag = "parameter", what = "model.init", source = "experiments/train.lua:3" },
        { address = BASE + 4 * MiB, size = 12 * MiB, requested_size = 0, state = "inactive" } } } },
    trace = {
      ev("alloc", 1, 2, "activation", "matmul", 1),
      ev("alloc", 2, 3, "activation", 'softmax <"&">', 2),
      ev("alloc", 3, 1, "temporary", "add", 3),
      ev("free_completed", 2, 3, "activation", "softmax", 4),
      ev("alloc", 4, 2, "gradient", "matmul.backward", 5),
      ev("free_completed", 3, 1, "temporary", "add", 6),
      ev("free_completed", 1, 2, "activation", "matmul", 7),
      ev("alloc", 5, 1, "optimizer state", "adamw", 8),
    },
  }
end

T.test("html: one band per allocation, the peak, the legend, hover text", function()
  local html = memviz.html(training_snapshot(), { title = 'Memory <of> "step 1"' })
  T.eq(count(html, '<polygon class="alloc"'), 6, "four allocations in the trace, one before it")
  local bytes, label = peak_label(html)
  T.eq(bytes, 10 * MiB)
  T.eq(label, "peak 10.00 MiB (event 3)")
  T.eq(count(html, 'class="legend%-item"'), 7)
  for _, tag in ipairs({ "parameter", "gradient", "optimizer state", "activation", "workspace", "temporary",
    "other" }) do
    T.ok(html:find('class="legend-item" data-tag="' .. tag .. '"', 1, true), "legend has " .. tag)
  end
  T.ok(html:find("2.00 MiB (2097152 bytes)  activation: matmul\nat experiments/train.lua:11\nin step 1 &gt; forward",
    1, true), "the hover text names size, tag, op, source and ranges")
  T.ok(html:find("softmax &lt;&quot;&amp;&quot;&gt;", 1, true), "hover text is escaped")
  T.ok(not html:find('softmax <"&">', 1, true))
  T.ok(html:find("Memory &lt;of&gt; &quot;step 1&quot;", 1, true), "the title")
  T.ok(balanced(html))
  T.eq(count(html, "<svg"), 1)
  T.eq(count(html, "</svg>"), 1)
  T.ok(html:find('<pre id="errors"></pre>', 1, true))
  T.ok(html:find("window.onerror", 1, true))
  T.ok(html:find("document.body.dataset.status = 'drawn'", 1, true))
  local outside = html:gsub('xmlns="http://www.w3.org/2000/svg"', "")
  T.ok(not outside:find("https?://") and not outside:find("src=") and not outside:find("href="),
    "nothing is fetched")
  T.ok(memviz.html(training_snapshot(), { x = "time" }):find("time (ms)", 1, true))
end)

T.test("html: bands keep their place while live and drop when one below is freed", function()
  local html = memviz.html(training_snapshot())
  -- the temporary (1 MiB, allocated third) sits on 4 + 2 + 3 MiB and drops by
  -- 3 MiB when the 3 MiB activation below it is freed
  local ymax, top, height = 10 * MiB * 1.08, 70, 580
  local function y(b) return string.format("%.1f", top + height - b / ymax * height) end
  local temp
  for poly in html:gmatch('<polygon class="alloc"[^>]*>.-</polygon>') do
    if poly:find("temporary: add", 1, true) then temp = poly end
  end
  T.ok(temp, "the temporary's band")
  local points = temp:match('points="([^"]*)"')
  T.ok(points:find("," .. y(9 * MiB) .. " ", 1, true), "its bottom starts at 9 MiB")
  T.ok(points:find("," .. y(6 * MiB) .. " ", 1, true), "and drops to 6 MiB")
end)

T.test("html: allocations under a pixel merge into one band per tag", function()
  local trace = {}
  for i = 1, 2 do
    trace[#trace + 1] = { action = "alloc", addr = BASE + i * MiB, size = MiB, stream = 0, time_us = i,
      tag = "activation" }
  end
  for i = 1, 500 do
    local tag = i % 2 == 0 and "temporary" or "workspace"
    trace[#trace + 1] = { action = "alloc", addr = BASE + 64 * MiB + i * 64, size = 16, stream = 0,
      time_us = 10 + i, tag = tag }
    if i % 3 == 0 then
      trace[#trace + 1] = { action = "free_completed", addr = BASE + 64 * MiB + i * 64, size = 16, stream = 0,
        time_us = 10 + i, tag = tag }
    end
  end
  local html = memviz.html({ device = "cuda:0", device_index = 0, segments = {}, trace = trace })
  T.eq(count(html, '<polygon class="alloc"'), 2)
  T.eq(count(html, '<polygon class="band small"'), 2)
  T.ok(html:find('class="band small" data-tag="temporary"', 1, true))
  T.ok(html:find('class="band small" data-tag="workspace"', 1, true))
  T.ok(balanced(html))
  -- a cap on the number of bands
  local many = {}
  for i = 1, 50 do
    many[i] = { action = "alloc", addr = BASE + i * MiB, size = MiB + i, stream = 0, time_us = i, tag = "gradient" }
  end
  local capped = memviz.html({ device = "cuda:0", segments = {}, trace = many }, { max_bands = 10 })
  T.eq(count(capped, '<polygon class="alloc"'), 10)
  T.eq(count(capped, '<polygon class="band small" data%-tag="gradient"'), 1)
end)

T.test("html: without a trace, the live blocks as one bar", function()
  local snap = small_snapshot()
  snap.trace = {}
  local html = memviz.html(snap)
  T.ok(html:find('id="note"', 1, true))
  T.ok(html:find("No allocation events were recorded", 1, true))
  T.eq(count(html, '<rect class="alloc"'), 2)
  local bytes, label = peak_label(html)
  T.eq(bytes, 768 * KiB)
  T.eq(label, "live 768.00 KiB at the snapshot")
  T.ok(balanced(html))
  local empty = memviz.html({ device = "cpu", segments = {}, trace = {} })
  T.ok(balanced(empty))
  T.eq(peak_label(empty), 0)
  T.raises(function() memviz.html(nil) end, "expects a snapshot table")
end)

T.test("html: 200k events draw in seconds, as a page of reasonable size", function()
  local trace, live, seed = {}, {}, 7
  local function rand(m)
    seed = (seed * 1103515245 + 12345) % 2147483648
    return seed % m
  end
  local tags = { "activation", "temporary", "workspace", "gradient", "optimizer state", "parameter", nil }
  while #trace < 200000 do
    if #live > 0 and (rand(100) < 45 or #live > 300) then
      local e = table.remove(live, rand(4) == 0 and rand(#live) + 1 or #live)
      trace[#trace + 1] = { action = "free_completed", addr = e.addr, size = e.size, stream = 0,
        time_us = #trace, tag = e.tag }
    else
      local size = rand(10) == 0 and (rand(64) + 1) * MiB or (rand(4096) + 1) * 512
      local e = { action = "alloc", addr = BASE + #trace * 128 * MiB, size = size, stream = 0, time_us = #trace,
        tag = tags[rand(7) + 1], what = "op", source = "x.lua:" .. rand(100), ranges = { "forward" } }
      trace[#trace + 1] = e
      live[#live + 1] = e
    end
  end
  local snap = { device = "cuda:0", device_index = 0, segments = {}, trace = trace }
  local t0 = os.clock()
  local html = memviz.html(snap)
  local seconds = os.clock() - t0
  print(string.format("  html of 200k events: %.2f s, %d bytes", seconds, #html))
  T.ok(seconds < 10, "took " .. seconds .. " s")
  T.ok(#html < 6 * MiB, "page of " .. #html .. " bytes")
  T.ok(count(html, '<polygon class="alloc"') <= 4000)
  T.eq(peak_label(html), memviz.summary(snap).peak_bytes)
  T.ok(balanced(html))
  t0 = os.clock()
  local bytes = memviz.pickle(snap)
  seconds = os.clock() - t0
  print(string.format("  pickle of 200k events: %.2f s, %d bytes", seconds, #bytes))
  T.ok(seconds < 30, "took " .. seconds .. " s")
  T.eq(bytes:sub(1, 2) .. bytes:sub(-1), "\x80\x02.")
end)

-- ---- the summary --------------------------------------------------------------

T.test("summary: bytes per tag live at the peak", function()
  local function ev(action, n, size, tag)
    return { action = action, addr = BASE + n * 4096, size = size, stream = 0, time_us = n, tag = tag }
  end
  local snap = {
    device = "cuda:0",
    device_index = 0,
    -- a parameter block live before the trace (and still live)
    segments = { { address = BASE, total_size = 4096, blocks = {
      { address = BASE, size = 1000, state = "active_allocated", tag = "parameter" } } } },
    trace = {
      ev("alloc", 1, 300, "activation"),      -- 1: 1400 (1000 + the workspace freed at 9)
      ev("alloc", 2, 50, "temporary"),        -- 2: 1450
      ev("free_completed", 2, 50, "temporary"), -- 3: 1400
      ev("alloc", 3, 200, "gradient"),        -- 4: 1600
      ev("alloc", 4, 60, nil),                -- 5: 1660 (untagged: "other")
      ev("alloc", 5, 400, "activation"),      -- 6: 2060: the peak
      { action = "oom", size = 1 << 40, device_free = 0, time_us = 6 },
      ev("free_completed", 1, 300, "activation"), -- 8: 1760
      ev("free_completed", 9, 100, "workspace"),  -- 9: 1660, allocated before the trace
      ev("alloc", 6, 350, "optimizer state"), -- 10: 2010
      ev("free_completed", 5, 400, "activation"), -- 11: 1610
    },
  }
  local s = memviz.summary(snap)
  T.eq(s.peak_bytes, 2060)
  T.eq(s.peak_index, 6)
  T.eq(s.by_tag, { parameter = 1000, activation = 700, gradient = 200, other = 60, workspace = 100 })
  local html = memviz.html(snap)
  T.eq(peak_label(html), 2060)
  T.ok(html:find('class="oom"', 1, true), "the out-of-memory event is marked")
  -- no trace: the live blocks are the peak
  T.eq(memviz.summary({ segments = snap.segments }),
    { by_tag = { parameter = 1000 }, peak_bytes = 1000, peak_index = 0 })
  T.eq(memviz.format_bytes(512), "512 B")
  T.eq(memviz.format_bytes(1536), "1.50 KiB")
  T.eq(memviz.format_bytes(3 << 30), "3.00 GiB")
end)

T.run()
