--- tf.memviz: memory snapshots (tf.mem.snapshot()) as files other tools read,
-- and as a picture.
--
--   local memviz = require "tf.memviz"
--   local snap = tf.mem.snapshot()
--   write("mem.pickle", memviz.pickle(snap)) -- pytorch.org/memory_viz, torch.cuda._memory_viz
--   write("mem.json", memviz.json(snap))     -- the same structure as JSON
--   write("mem.html", memviz.html(snap, {title = "step 3"}))
--   local s = memviz.summary(snap)           -- {by_tag, peak_bytes, peak_index}
--
-- The pickle holds the dict torch.cuda.memory._snapshot() returns:
--   {segments = [{device, address, total_size, allocated_size, active_size,
--                 requested_size, stream, segment_type, segment_pool_id = (0, 0),
--                 is_expandable, frames, blocks = [{address, size,
--                 requested_size, state, frames}]}],
--    device_traces = [[{action, addr, size, stream, time_us, frames}], ...],
--    allocator_settings = {...}}
-- tfhost's own annotations (tag, op, source line, open ranges) travel as a
-- first, synthetic stack frame named "activation: matmul [forward > layer 3]"
-- at the source file and line, followed by the real Lua frames, so every
-- viewer shows them; newer viewers also print them as user_metadata.
local M = {}

local pack, char, concat = string.pack, string.char, table.concat
local floor, tointeger, mtype = math.floor, math.tointeger, math.type

-- ---- Python values --------------------------------------------------------

--- memviz.python: the Python values a pickle is written from. Dicts keep
-- their keys in the order given (dict(k1, v1, k2, v2, ...)), so the same
-- snapshot always gives the same bytes. Strings, integers, floats and
-- booleans are themselves.
local py = {}
M.python = py
local Dict = { __name = "memviz.dict" }
local List = { __name = "memviz.list" }
local Tuple = { __name = "memviz.tuple" }
-- A dict that recurs (a stack frame): dumps encodes it once and reuses the bytes.
local Shared = { __name = "memviz.dict" }
py.None = setmetatable({}, { __name = "memviz.None", __tostring = function() return "None" end })
function py.dict(...) return setmetatable({ ... }, Dict) end
function py.list(t) return setmetatable(t or {}, List) end
function py.tuple(...) return setmetatable({ ... }, Tuple) end
--- A dict that is written once and used in many places (dumps then encodes it once).
function py.shared_dict(...) return setmetatable({ ... }, Shared) end

--- s as valid UTF-8 (Python decodes pickled strings strictly): each byte
-- that is not part of a valid sequence becomes U+FFFD.
local function text(s)
  s = tostring(s)
  if utf8.len(s) then return s end
  local out, i = {}, 1
  while true do
    local len, bad = utf8.len(s, i)
    if len then
      out[#out + 1] = s:sub(i)
      break
    end
    out[#out + 1] = s:sub(i, bad - 1)
    out[#out + 1] = "\u{FFFD}"
    i = bad + 1
  end
  return concat(out)
end
M.text = text

-- Items per MARK, as CPython's pickler batches them: MemoryViz.js spreads a
-- mark's items into one push() call, which long marks would overflow.
local BATCH = 1000
local BININT1 = {}
for i = 0, 255 do BININT1[i] = "K" .. char(i) end
local LONG1 = { [5] = "<BBi5", [6] = "<BBi6", [7] = "<BBi7", [8] = "<BBi8" }

--- The protocol-2 pickle of a Python value (see memviz.python). Only
-- PROTO, EMPTY_DICT, EMPTY_LIST, MARK, SETITEMS, APPENDS, TUPLE2, TUPLE,
-- BINUNICODE, BININT1, BININT2, BININT, LONG1, BINFLOAT, NONE, NEWTRUE,
-- NEWFALSE and STOP are written; no memo.
function py.dumps(value)
  local chunks, buf, n = {}, {}, 0
  local strings, shared, nesting = {}, {}, 0
  local encode
  -- Appends the items of t (a dict's keys and values, or a list's items) in
  -- batches of `per` between MARK and `close`.
  local function items(t, per, close)
    local count = #t
    for first = 1, count, per do
      n = n + 1
      buf[n] = "("
      for i = first, first + per - 1 < count and first + per - 1 or count do encode(t[i]) end
      n = n + 1
      buf[n] = close
      if n >= 8192 and nesting == 0 then
        chunks[#chunks + 1] = concat(buf, "", 1, n)
        n = 0
      end
    end
  end
  encode = function(v)
    local kind = type(v)
    local bytes
    if kind == "string" then
      bytes = strings[v]
      if not bytes then
        local t = text(v)
        bytes = pack("<BI4", 0x58, #t) .. t -- BINUNICODE
        strings[v] = bytes
      end
    elseif kind == "number" then
      if mtype(v) ~= "integer" then
        bytes = pack(">Bd", 0x47, v) -- BINFLOAT
      elseif v >= 0 and v < 256 then
        bytes = BININT1[v]
      elseif v >= 0 and v < 65536 then
        bytes = pack("<BI2", 0x4d, v) -- BININT2
      elseif v >= -0x80000000 and v < 0x80000000 then
        bytes = pack("<Bi4", 0x4a, v) -- BININT
      else -- LONG1: the shortest little-endian two's complement
        local len = 8
        if v >= -0x8000000000 and v < 0x8000000000 then
          len = 5
        elseif v >= -0x800000000000 and v < 0x800000000000 then
          len = 6
        elseif v >= -0x80000000000000 and v < 0x80000000000000 then
          len = 7
        end
        bytes = pack(LONG1[len], 0x8a, len, v)
      end
    elseif kind == "boolean" then
      bytes = v and "\x88" or "\x89"
    elseif kind == "table" then
      local mt = getmetatable(v)
      if mt == Dict then
        n = n + 1
        buf[n] = "}"
        return items(v, 2 * BATCH, "u")
      elseif mt == List then
        n = n + 1
        buf[n] = "]"
        return items(v, BATCH, "e")
      elseif mt == Shared then
        bytes = shared[v]
        if not bytes then
          local first = n + 1
          nesting = nesting + 1
          n = n + 1
          buf[n] = "}"
          items(v, 2 * BATCH, "u")
          nesting = nesting - 1
          bytes = concat(buf, "", first, n)
          shared[v], n = bytes, first - 1
        end
      elseif mt == Tuple then
        if #v == 2 then
          encode(v[1])
          encode(v[2])
          bytes = "\x86"
        else
          n = n + 1
          buf[n] = "("
          for i = 1, #v do encode(v[i]) end
          bytes = "t"
        end
      elseif v == py.None then
        bytes = "N"
      else
        error("memviz: cannot pickle a plain table (use memviz.python.dict, list or tuple)", 0)
      end
    else
      error("memviz: cannot pickle a " .. kind, 0)
    end
    n = n + 1
    buf[n] = bytes
  end
  buf[1], n = "\x80\x02", 1
  encode(value)
  n = n + 1
  buf[n] = "."
  chunks[#chunks + 1] = concat(buf, "", 1, n)
  return concat(chunks)
end

--- The Python value as plain Lua tables for tf.json (dicts become objects,
-- lists and tuples arrays, None null); a shared dict converts once.
local function plain(v, json, seen)
  if type(v) ~= "table" then return v end
  local mt = getmetatable(v)
  if mt == Dict or mt == Shared then
    local t = seen[v]
    if t then return t end
    t = {}
    for i = 1, #v, 2 do t[v[i]] = plain(v[i + 1], json, seen) end
    if mt == Shared then seen[v] = t end
    return t
  elseif mt == List or mt == Tuple then
    local t = json.array()
    for i = 1, #v do t[i] = plain(v[i], json, seen) end
    return t
  elseif v == py.None then
    return json.null
  end
  error("memviz: cannot convert a plain table", 0)
end

-- ---- tfhost snapshot -> PyTorch snapshot ----------------------------------

-- A Lua integer where PyTorch has an int (a float that holds one converts).
local function int(v, default)
  if v == nil then return default end
  return tointeger(v) or v
end

--- The name of the synthetic frame: "tag: what [range > range]", or nil
-- when nothing was recorded for r (a block or trace event).
function M.label(r)
  local ranges = r.ranges
  local has_ranges = type(ranges) == "table" and #ranges > 0
  if r.tag == nil and r.what == nil and r.source == nil and not has_ranges then return nil end
  local s = tostring(r.tag or "untagged")
  if r.what ~= nil then s = s .. ": " .. tostring(r.what) end
  if has_ranges then
    local ok, joined = pcall(concat, ranges, " > ")
    if not ok then
      local parts = {}
      for i = 1, #ranges do parts[i] = tostring(ranges[i]) end
      joined = concat(parts, " > ")
    end
    s = s .. " [" .. joined .. "]"
  end
  return s
end
local label_of = M.label

-- "file:line" -> file, line; else the first real frame's place.
local function place_of(r, places)
  local source = r.source
  if source ~= nil then
    local place = places[source]
    if not place then
      local file, line = tostring(source):match("^(.*):(%-?%d+)$")
      place = file and { file, tointeger(tonumber(line)) } or { tostring(source), 0 }
      places[source] = place
    end
    return place[1], place[2]
  end
  local f = r.frames and r.frames[1]
  if f then return f.filename or "?", int(f.line, 0) end
  return "?", 0
end

-- One dict per distinct frame: a trace repeats the same few frames many
-- times. cache = {frames = {}, places = {}} lives for one conversion.
local function frame(cache, filename, line, name)
  local by_line = cache.frames[filename]
  if not by_line then
    by_line = {}
    cache.frames[filename] = by_line
  end
  local by_name = by_line[line]
  if not by_name then
    by_name = {}
    by_line[line] = by_name
  end
  local f = by_name[name]
  if not f then
    f = py.shared_dict("filename", text(filename), "line", line, "name", text(name))
    by_name[name] = f
  end
  return f
end

local function frames_of(r, label, cache)
  local out = py.list()
  if label then
    local file, line = place_of(r, cache.places)
    out[1] = frame(cache, tostring(file), line, label)
  end
  local frames = r.frames
  if frames then
    for i = 1, #frames do
      local f = frames[i]
      out[#out + 1] = frame(cache, tostring(f.filename or "?"), int(f.line, 0), tostring(f.name or "?"))
    end
  end
  return out
end

local function torch_segment(seg, device, cache)
  local blocks = py.list()
  local allocated, active, requested = 0, 0, 0
  for i, b in ipairs(seg.blocks or {}) do
    local state = b.state or "inactive"
    local is_active = state == "active_allocated"
    local size = int(b.size, 0)
    local req = int(b.requested_size, is_active and size or 0)
    if is_active then
      allocated, requested = allocated + size, requested + req
    end
    if state ~= "inactive" then active = active + size end
    local label = is_active and label_of(b) or nil
    local d = py.dict("address", int(b.address, 0), "size", size, "requested_size", req, "state", text(state),
      "frames", is_active and frames_of(b, label, cache) or py.list())
    if label then
      d[#d + 1], d[#d + 2] = "user_metadata", text(label)
    end
    blocks[i] = d
  end
  return py.dict("device", device, "address", int(seg.address, 0), "total_size", int(seg.total_size, 0),
    "allocated_size", int(seg.allocated_size, allocated), "active_size", int(seg.active_size, active),
    "requested_size", int(seg.requested_size, requested), "stream", int(seg.stream, 0),
    "segment_type", text(seg.segment_type or "large"), "segment_pool_id", py.tuple(0, 0),
    "is_expandable", false, "frames", py.list(), "blocks", blocks)
end

-- One tfhost event as PyTorch trace entries. A free becomes the pair PyTorch's
-- allocator records (free_requested, then free_completed): its viewer merges
-- the pair into one "free", while a lone free_completed draws the block as
-- still waiting on another stream. PyTorch writes device_free where other
-- actions write addr.
local function torch_events(e, out, cache)
  local action = text(e.action or "?")
  local label = label_of(e)
  local frames = frames_of(e, label, cache)
  local size, stream, time = int(e.size, 0), int(e.stream, 0), int(e.time_us, 0)
  local addr_key, addr = "addr", int(e.addr, 0)
  if action == "oom" then addr_key, addr = "device_free", int(e.device_free, 0) end
  local n = #out
  if label then
    label = text(label)
    if action == "free_completed" then
      n = n + 1
      out[n] = py.dict("action", "free_requested", addr_key, addr, "size", size, "stream", stream, "time_us", time,
        "frames", frames, "user_metadata", label)
    end
    out[n + 1] = py.dict("action", action, addr_key, addr, "size", size, "stream", stream, "time_us", time,
      "frames", frames, "user_metadata", label)
  else
    if action == "free_completed" then
      n = n + 1
      out[n] = py.dict("action", "free_requested", addr_key, addr, "size", size, "stream", stream, "time_us", time,
        "frames", frames)
    end
    out[n + 1] = py.dict("action", action, addr_key, addr, "size", size, "stream", stream, "time_us", time,
      "frames", frames)
  end
end

--- The snapshot as the Python value torch.cuda.memory._snapshot() returns.
function M.torch(snapshot)
  if type(snapshot) ~= "table" then error("tf.memviz: expects a snapshot table (tf.mem.snapshot())", 2) end
  local device = int(snapshot.device_index, 0)
  if mtype(device) ~= "integer" or device < 0 then device = 0 end
  local cache = { frames = {}, places = {} }
  local segments = py.list()
  for i, seg in ipairs(snapshot.segments or {}) do segments[i] = torch_segment(seg, device, cache) end
  local traces = py.list()
  for i = 1, device + 1 do traces[i] = py.list() end
  local events = traces[device + 1]
  local trace = snapshot.trace or {}
  for i = 1, #trace do torch_events(trace[i], events, cache) end
  -- The CUDA caching allocator's defaults, in the types PyTorch writes, and
  -- whether the trace lost its oldest events (newer viewers warn then).
  local settings = py.dict("PYTORCH_CUDA_ALLOC_CONF", "", "max_split_size", -1,
    "garbage_collection_threshold", 0.0, "expandable_segments", false, "pinned_num_register_threads", 1,
    "release_lock_on_cudamalloc", false, "pinned_use_cuda_host_register", false,
    "roundup_power2_divisions", py.dict(), "trace_alloc_overflowed", (tonumber(snapshot.dropped) or 0) > 0)
  return py.dict("segments", segments, "device_traces", traces, "allocator_settings", settings)
end

--- The snapshot as a protocol-2 pickle in PyTorch's memory-snapshot format.
function M.pickle(snapshot)
  return py.dumps(M.torch(snapshot))
end

--- The same content as memviz.pickle, as JSON (tuples become arrays).
function M.json(snapshot, opts)
  local json = require("tf").json
  return json.encode(plain(M.torch(snapshot), json, {}), opts)
end

-- ---- replaying the trace ----------------------------------------------------

-- The allocations of a snapshot in stacking order, and the trace's alloc and
-- free events as steps. An element is {size, rec, start, stop, initial}; it is
-- live over steps [start, stop). Blocks freed by the trace but not allocated
-- in it, and blocks live in the segments that the trace never allocated,
-- predate the trace: they are live from step 0, at the bottom of the stack.
local function replay(snapshot)
  local trace = snapshot.trace or {}
  local live, unmatched = {}, {}
  local act, is_alloc, trace_index = {}, {}, {}
  local ooms, steps = {}, 0
  for i = 1, #trace do
    local e = trace[i]
    local action = e.action
    if action == "alloc" then
      steps = steps + 1
      local el = { size = int(e.size, 0), rec = e, start = steps }
      local addr = e.addr
      if addr == nil then addr = el end
      local old = live[addr]
      if old then -- a lost free: the address was handed out again
        old.stop, el.replaces = steps, old
      end
      live[addr] = el
      act[steps], is_alloc[steps], trace_index[steps] = el, true, i
    elseif action == "free_completed" then
      steps = steps + 1
      local el = live[e.addr]
      if el then
        live[e.addr] = nil
        el.stop = steps
      else
        el = { size = int(e.size, 0), rec = e, start = 0, stop = steps, initial = true }
        unmatched[#unmatched + 1] = el
      end
      act[steps], is_alloc[steps], trace_index[steps] = el, false, i
    elseif action == "oom" then
      ooms[#ooms + 1] = { index = i, rec = e }
    end
  end
  local initial = {}
  for _, seg in ipairs(snapshot.segments or {}) do
    for _, b in ipairs(seg.blocks or {}) do
      if b.state == "active_allocated" and not live[b.address] then
        initial[#initial + 1] = { size = int(b.size, 0), rec = b, start = 0, initial = true }
      end
    end
  end
  -- Those freed first sit highest, so their frees shift the least.
  for i = #unmatched, 1, -1 do initial[#initial + 1] = unmatched[i] end
  return { initial = initial, act = act, is_alloc = is_alloc, trace_index = trace_index, steps = steps,
    ooms = ooms }
end

-- Live bytes after every step: the peak, its step and the bytes per key(rec) then.
local function peak_of(r, key)
  local total, by = 0, {}
  local function add(el, sign)
    local k = key(el.rec)
    total = total + sign * el.size
    by[k] = (by[k] or 0) + sign * el.size
  end
  local function copy()
    local t = {}
    for k, v in pairs(by) do
      if v ~= 0 then t[k] = v end
    end
    return t
  end
  for _, el in ipairs(r.initial) do add(el, 1) end
  local peak, peak_step, peak_by = total, 0, copy()
  local act, is_alloc = r.act, r.is_alloc
  for k = 1, r.steps do
    local el = act[k]
    if is_alloc[k] then
      if el.replaces then add(el.replaces, -1) end
      add(el, 1)
    else
      add(el, -1)
    end
    if total > peak then
      peak, peak_step, peak_by = total, k, copy()
    end
  end
  return peak, peak_step, peak_by
end

--- {by_tag = {tag -> bytes live at the peak}, peak_bytes, peak_index}: the
-- peak of live bytes over the trace (blocks that predate the trace count
-- from its start); peak_index is the 1-based index in snapshot.trace of the
-- event that reached it (0: before the first event). Untagged bytes count
-- as "other".
function M.summary(snapshot)
  if type(snapshot) ~= "table" then error("tf.memviz.summary: expects a snapshot table", 2) end
  local r = replay(snapshot)
  local peak, step, by_tag = peak_of(r, function(rec) return rec.tag or "other" end)
  return { by_tag = by_tag, peak_bytes = peak, peak_index = step > 0 and r.trace_index[step] or 0 }
end

-- ---- the picture ------------------------------------------------------------

M.tags = { "parameter", "gradient", "optimizer state", "activation", "workspace", "temporary", "other" }
M.colors = {
  parameter = "#4e79a7", gradient = "#f28e2c", ["optimizer state"] = "#59a14f", activation = "#e15759",
  workspace = "#76b7b2", temporary = "#e0b825", other = "#9c9c9c",
}
local TAG_INDEX = {}
for i, t in ipairs(M.tags) do TAG_INDEX[t] = i end
local function class_of(rec) return TAG_INDEX[rec.tag] or #M.tags end

-- Three shades per tag, so neighbouring allocations stay apart.
local SHADES = {}
for i, tag in ipairs(M.tags) do
  local hex = M.colors[tag]
  local rgb = { tonumber(hex:sub(2, 3), 16), tonumber(hex:sub(4, 5), 16), tonumber(hex:sub(6, 7), 16) }
  local function mix(toward, f)
    return string.format("#%02x%02x%02x", floor(rgb[1] + (toward - rgb[1]) * f + 0.5),
      floor(rgb[2] + (toward - rgb[2]) * f + 0.5), floor(rgb[3] + (toward - rgb[3]) * f + 0.5))
  end
  SHADES[i] = { hex, mix(255, 0.22), mix(0, 0.14) }
end

local UNITS = { { "TiB", 2 ^ 40 }, { "GiB", 2 ^ 30 }, { "MiB", 2 ^ 20 }, { "KiB", 2 ^ 10 } }

--- Bytes for people: "512 B", "1.50 KiB", "3.00 MiB", "1.25 GiB".
function M.format_bytes(n)
  for _, u in ipairs(UNITS) do
    if math.abs(n) >= u[2] then return string.format("%.2f %s", n / u[2], u[1]) end
  end
  return string.format("%d B", n)
end
local format_bytes = M.format_bytes

local function esc(s)
  return (tostring(s):gsub("[&<>\"']", { ["&"] = "&amp;", ["<"] = "&lt;", [">"] = "&gt;", ['"'] = "&quot;",
    ["'"] = "&#39;" }))
end

-- A tick step near span/count: 1, 2, 2.5 or 5 times a power of ten.
local function nice_step(span, count)
  local raw = span / count
  local p = 10 ^ floor(math.log(raw, 10))
  for _, m in ipairs({ 1, 2, 2.5, 5, 10 }) do
    if m * p >= raw then return m * p end
  end
  return 10 * p
end

local W, H = 1200, 720
local PX0, PX1, PY0, PY1 = 90, 990, 70, 650 -- the plot area
local PW, PH = PX1 - PX0, PY1 - PY0

local function tooltip(el, first, last)
  local rec = el.rec
  local what = "not recorded"
  if label_of(rec) then
    what = tostring(rec.tag or "untagged")
    if rec.what ~= nil then what = what .. ": " .. tostring(rec.what) end
  end
  local lines = { format_bytes(el.size) .. " (" .. tostring(el.size) .. " bytes)  " .. what }
  if rec.source then lines[#lines + 1] = "at " .. tostring(rec.source) end
  if type(rec.ranges) == "table" and #rec.ranges > 0 then
    local parts = {}
    for i = 1, #rec.ranges do parts[i] = tostring(rec.ranges[i]) end
    lines[#lines + 1] = "in " .. concat(parts, " > ")
  end
  if first then lines[#lines + 1] = first end
  if last then lines[#lines + 1] = last end
  return esc(text(concat(lines, "\n")))
end

local function fmt1(v) return string.format("%.1f", v) end

-- The y axis, its grid and the legend (shared by both pictures).
local function frame_parts(out, ymax, opts, subtitle)
  local title = opts.title or "tfhost memory"
  out[#out + 1] = string.format('<text x="%d" y="28" font-size="20" font-weight="bold" id="title">%s</text>',
    PX0, esc(text(title)))
  out[#out + 1] = string.format('<text x="%d" y="50" font-size="13" fill="#555" id="subtitle">%s</text>', PX0,
    esc(text(subtitle)))
  out[#out + 1] = string.format('<rect x="%d" y="%d" width="%d" height="%d" fill="#fbfbfb" stroke="#bbb"/>',
    PX0, PY0, PW, PH)
  local unit, scale = "B", 1
  for _, u in ipairs(UNITS) do
    if ymax >= u[2] then
      unit, scale = u[1], u[2]
      break
    end
  end
  local step = nice_step(ymax / scale, 6)
  local v = 0
  while v * scale <= ymax + 1e-9 do
    local y = PY1 - v * scale / ymax * PH
    out[#out + 1] = string.format('<line x1="%d" x2="%d" y1="%s" y2="%s" stroke="#e4e4e4"/>', PX0, PX1, fmt1(y),
      fmt1(y))
    out[#out + 1] = string.format('<text class="ytick" x="%d" y="%s" text-anchor="end">%s %s</text>', PX0 - 6,
      fmt1(y + 4), string.format("%g", v), unit)
    v = v + step
  end
  out[#out + 1] = string.format(
    '<text x="20" y="%d" transform="rotate(-90 20 %d)" text-anchor="middle" fill="#444">bytes allocated</text>',
    (PY0 + PY1) // 2, (PY0 + PY1) // 2)
  local lx, ly = PX1 + 18, PY0 + 4
  out[#out + 1] = string.format('<g id="legend"><text x="%d" y="%d" font-weight="bold">tag</text>', lx, ly + 8)
  for i, tag in ipairs(M.tags) do
    local y = ly + 8 + i * 22
    out[#out + 1] = string.format(
      '<g class="legend-item" data-tag="%s"><rect x="%d" y="%d" width="14" height="14" fill="%s"/>' ..
      '<text x="%d" y="%d">%s</text></g>', esc(tag), lx, y - 11, M.colors[tag], lx + 20, y, esc(tag))
  end
  local y = ly + 8 + (#M.tags + 1) * 22
  out[#out + 1] = string.format('<rect x="%d" y="%d" width="14" height="14" fill="%s" fill-opacity="0.45"/>' ..
    '<text x="%d" y="%d">small allocations,</text><text x="%d" y="%d">merged per tag</text></g>', lx, y - 11,
    M.colors.other, lx + 20, y, lx + 20, y + 15)
end

local SCRIPT = [[
(function () {
  var svg = document.getElementById('plot'), out = document.getElementById('readout');
  var X0 = %d, X1 = %d, Y0 = %d, Y1 = %d, W = %d, H = %d, XMAX = %s, YMAX = %s, XUNIT = '%s';
  function bytes(b) {
    var u = ['B', 'KiB', 'MiB', 'GiB', 'TiB'], i = 0;
    while (Math.abs(b) >= 1024 && i < u.length - 1) { b /= 1024; i++; }
    return (i ? b.toFixed(2) : Math.round(b)) + ' ' + u[i];
  }
  svg.addEventListener('mousemove', function (ev) {
    var r = svg.getBoundingClientRect();
    var sx = (ev.clientX - r.left) * W / r.width, sy = (ev.clientY - r.top) * H / r.height;
    if (sx < X0 || sx > X1 || sy < Y0 || sy > Y1) { out.textContent = ''; return; }
    var x = (sx - X0) / (X1 - X0) * XMAX, y = (Y1 - sy) / (Y1 - Y0) * YMAX;
    out.textContent = XUNIT + ' ' + x.toFixed(XUNIT === 'ms' ? 2 : 0) + ', ' + bytes(y);
  });
})();
document.body.dataset.status = 'drawn';
]]

local function page(title, svg_parts, xmax, ymax, xunit)
  local head = '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8"><title>' .. esc(text(title)) ..
    '</title>\n<style>body{font-family:sans-serif;margin:8px;color:#222;background:#fff}' ..
    '#errors{color:#b00020;white-space:pre-wrap;margin:0}#errors:empty{display:none}' ..
    'svg{display:block;width:100%;max-width:1200px;height:auto}' ..
    '.alloc:hover,.band:hover{stroke:#000;stroke-width:1}#readout{font:12px monospace;min-height:1.3em}</style>\n' ..
    '<script>window.onerror=function(msg,src,line){var e=document.getElementById("errors");' ..
    'if(e){e.textContent+=String(msg)+" (line "+line+")\\n";}};</script>\n</head><body>\n<pre id="errors"></pre>\n' ..
    string.format('<svg xmlns="http://www.w3.org/2000/svg" id="plot" viewBox="0 0 %d %d" font-family="sans-serif" ' ..
      'font-size="12">\n', W, H)
  local tail = '\n</svg>\n<div id="readout"></div>\n<script>\n' ..
    string.format(SCRIPT, PX0, PX1, PY0, PY1, W, H, string.format("%.17g", xmax), string.format("%.17g", ymax),
      xunit) .. '</script>\n</body></html>\n'
  return head .. concat(svg_parts, "\n") .. tail
end

-- Where nothing was traced: the live blocks of the segments as one bar.
local function bar_page(snapshot, opts)
  local blocks, total = {}, 0
  for _, seg in ipairs(snapshot.segments or {}) do
    for _, b in ipairs(seg.blocks or {}) do
      if b.state == "active_allocated" then
        local size = int(b.size, 0)
        blocks[#blocks + 1] = { size = size, rec = b }
        total = total + size
      end
    end
  end
  local ymax = total > 0 and total * 1.08 or 1024
  local out = {}
  local device = tostring(snapshot.device or "?")
  frame_parts(out, ymax, opts, string.format("%s · no allocation trace · %d live blocks, %s", device, #blocks,
    format_bytes(total)))
  local bx0, bx1 = PX0 + PW * 0.3, PX0 + PW * 0.7
  local min_bytes = ymax / PH
  local base, small = 0, {}
  for i = 1, #M.tags do small[i] = 0 end
  for i, el in ipairs(blocks) do
    if el.size >= min_bytes then
      local ci = class_of(el.rec)
      local y0, y1 = PY1 - (base + el.size) / ymax * PH, PY1 - base / ymax * PH
      out[#out + 1] = string.format('<rect class="alloc" x="%s" y="%s" width="%s" height="%s" fill="%s">' ..
        '<title>%s</title></rect>', fmt1(bx0), fmt1(y0), fmt1(bx1 - bx0), fmt1(y1 - y0), SHADES[ci][i % 3 + 1],
        tooltip(el, string.format("address 0x%x", int(el.rec.address, 0))))
      base = base + el.size
    else
      local ci = class_of(el.rec)
      small[ci] = small[ci] + el.size
    end
  end
  for ci, tag in ipairs(M.tags) do
    if small[ci] > 0 then
      local y0, y1 = PY1 - (base + small[ci]) / ymax * PH, PY1 - base / ymax * PH
      out[#out + 1] = string.format('<rect class="band small" data-tag="%s" x="%s" y="%s" width="%s" height="%s" ' ..
        'fill="%s" fill-opacity="0.45"><title>%s of small %s allocations</title></rect>', esc(tag), fmt1(bx0),
        fmt1(y0), fmt1(bx1 - bx0), fmt1(math.max(y1 - y0, 0.5)), M.colors[tag], format_bytes(small[ci]), esc(tag))
      base = base + small[ci]
    end
  end
  local y_total = PY1 - total / ymax * PH
  out[#out + 1] = string.format('<line class="peak" x1="%d" x2="%d" y1="%s" y2="%s" stroke="#222" ' ..
    'stroke-dasharray="6 4"/>', PX0, PX1, fmt1(y_total), fmt1(y_total))
  out[#out + 1] = string.format('<text id="peak-label" data-bytes="%d" x="%d" y="%s" text-anchor="end" ' ..
    'font-weight="bold">live %s at the snapshot</text>', total, PX1 - 6, fmt1(y_total - 6), format_bytes(total))
  out[#out + 1] = string.format('<text id="note" x="%d" y="%d" text-anchor="middle" fill="#444">No allocation ' ..
    'events were recorded: the bar shows the %d blocks live when the snapshot was taken.</text>',
    (PX0 + PX1) // 2, PY1 + 30, #blocks)
  return page(opts.title or "tfhost memory", out, 1, ymax, "snapshot")
end

--- memviz.html(snapshot [, opts]): one self-contained HTML page (inline SVG,
-- a few lines of script, nothing fetched) drawing the active memory
-- timeline: x is the trace event (opts.x = "time": its time), y the bytes
-- allocated; every allocation is a band over its lifetime, stacked on those
-- allocated before it that are still live, coloured by tag, with its size,
-- tag, op, source and ranges on hover. Bands under one pixel high merge
-- into one band per tag on top; at most opts.max_bands (4000) bands are
-- drawn one by one. The peak is marked; opts.title titles the page. Without
-- alloc/free events the live blocks of the segments are drawn as a bar.
function M.html(snapshot, opts)
  if type(snapshot) ~= "table" then error("tf.memviz.html: expects a snapshot table", 2) end
  opts = opts or {}
  local r = replay(snapshot)
  if r.steps == 0 then return bar_page(snapshot, opts) end
  local steps, act, is_alloc = r.steps, r.act, r.is_alloc
  local peak, peak_step = peak_of(r, class_of)
  local ymax = peak > 0 and peak * 1.08 or 1024

  -- x of a trace event (0: the start): its index in the trace, or its time
  local trace = snapshot.trace
  local ntrace = #trace
  local xmax, xunit = ntrace, "event"
  local x_of_event = function(i) return PX0 + i / ntrace * PW end
  if opts.x == "time" then
    local t0 = trace[r.trace_index[1]].time_us or 0
    local t1 = trace[r.trace_index[steps]].time_us or 0
    if t1 > t0 then
      x_of_event = function(i)
        local t = i > 0 and trace[i].time_us or t0
        return PX0 + math.min(math.max(t - t0, 0), t1 - t0) / (t1 - t0) * PW
      end
      xmax, xunit = (t1 - t0) / 1000, "ms"
    end
  end
  local trace_index = r.trace_index
  local function xof(k) return x_of_event(k > 0 and trace_index[k] or 0) end

  -- Which allocations get their own band: at least a pixel high, and the
  -- largest max_bands of those (found through a power-of-two histogram).
  local all = {}
  for _, el in ipairs(r.initial) do all[#all + 1] = el end
  for k = 1, steps do
    if is_alloc[k] then all[#all + 1] = act[k] end
  end
  local min_bytes = ymax / PH
  local max_bands = opts.max_bands or 4000
  local hist, candidates = {}, 0
  local log = math.log
  for _, el in ipairs(all) do
    if el.size >= min_bytes then
      candidates = candidates + 1
      local b = floor(log(el.size, 2))
      hist[b] = (hist[b] or 0) + 1
    end
  end
  if candidates > max_bands then
    local count, b = 0, 63
    while b > 0 and count + (hist[b] or 0) <= max_bands do
      count = count + (hist[b] or 0)
      b = b - 1
    end
    -- bucket b overflows: of its sizes, the largest (max_bands - count) fit
    local sizes = {}
    for _, el in ipairs(all) do
      if el.size >= min_bytes and floor(log(el.size, 2)) == b then sizes[#sizes + 1] = el.size end
    end
    table.sort(sizes)
    local keep = max_bands - count
    local cut = sizes[#sizes - keep + 1]
    if keep == 0 then
      cut = sizes[#sizes] + 0.5
    elseif sizes[#sizes - keep] == cut then
      cut = cut + 0.5 -- a tie across the cut merges whole
    end
    min_bytes = math.max(min_bytes, cut)
  end
  local ndrawn = 0
  for _, el in ipairs(all) do
    el.drawn = el.size >= min_bytes
    if el.drawn then ndrawn = ndrawn + 1 end
    el.class = class_of(el.rec)
  end

  -- Sweep the steps: drawn allocations keep a stack (allocation order) and a
  -- bottom edge of (x, base) points, at most two per column of colw pixels;
  -- the merged small allocations keep one profile per column, at the step of
  -- the column's highest total.
  local ntags = #M.tags
  local function sweep(colw)
    local stack, top, drawn_total, small_sum = {}, 0, 0, 0
    local small = {}
    for ci = 1, ntags do small[ci] = 0 end
    local drawn, points = {}, 0
    local function column(px) return (px - PX0) // colw end
    local function push(el, px)
      top = top + 1
      stack[top] = el
      el.base, el.pts, el.np = drawn_total, { px, drawn_total }, 2
      drawn_total = drawn_total + el.size
      drawn[#drawn + 1] = el
    end
    local function lower(el, px, old, new)
      local p, n = el.pts, el.np
      if n > 2 and column(p[n - 1]) == column(px) then
        p[n] = new
      else
        p[n + 1], p[n + 2], p[n + 3], p[n + 4] = px, old, px, new
        el.np = n + 4
      end
    end
    local function close(el, px)
      local p, n = el.pts, el.np
      if px < p[1] + 0.8 then px = p[1] + 0.8 end
      p[n + 1], p[n + 2] = px, el.base
      el.np = n + 2
      points = points + el.np
    end
    local function remove(el, px)
      if not el.drawn then
        small[el.class] = small[el.class] - el.size
        small_sum = small_sum - el.size
        return
      end
      local i = top
      while i > 0 and stack[i] ~= el do i = i - 1 end
      if i == 0 then return end
      close(el, px)
      for j = i + 1, top do
        local above = stack[j]
        local old = above.base
        above.base = old - el.size
        lower(above, px, old, above.base)
        stack[j - 1] = above
      end
      stack[top] = nil
      top = top - 1
      drawn_total = drawn_total - el.size
    end
    local function add(el, px)
      if el.drawn then
        push(el, px)
      else
        small[el.class] = small[el.class] + el.size
        small_sum = small_sum + el.size
      end
    end
    local profile, cur = {}, nil
    local function record(px)
      local c, total = column(px), drawn_total + small_sum
      if cur and cur.col == c then
        if total <= cur.total then return end
      else
        if cur then cur.x1 = px end
        cur = { col = c, x0 = px }
        profile[#profile + 1] = cur
      end
      cur.total, cur.drawn = total, drawn_total
      for ci = 1, ntags do cur[ci] = small[ci] end
    end
    local x = xof(0)
    for _, el in ipairs(r.initial) do add(el, x) end
    record(x)
    for k = 1, steps do
      local el = act[k]
      x = xof(k)
      if is_alloc[k] then
        if el.replaces then remove(el.replaces, x) end
        add(el, x)
      else
        remove(el, x)
      end
      record(x)
    end
    cur.x1 = PX1
    for j = 1, top do close(stack[j], PX1) end
    return drawn, profile, points
  end
  local colw, drawn, profile, points = 1, nil, nil, nil
  repeat
    drawn, profile, points = sweep(colw)
    colw = colw * 2
  until points <= (opts.max_points or 400000) or colw > 64

  local function yof(b) return PY1 - b / ymax * PH end
  local out = {}
  local device = tostring(snapshot.device or "?")
  frame_parts(out, ymax, opts, string.format("%s · %d events · %d allocations: %d drawn, %d merged · peak %s",
    device, #trace, #all, ndrawn, #all - ndrawn, format_bytes(peak)))
  -- x axis
  local xstep = nice_step(xmax, 8)
  if xunit == "event" then xstep = math.max(1, floor(xstep)) end
  local v = 0
  while v <= xmax + 1e-9 do
    local px = PX0 + v / xmax * PW
    out[#out + 1] = string.format('<line x1="%s" x2="%s" y1="%d" y2="%d" stroke="#888"/><text class="xtick" ' ..
      'x="%s" y="%d" text-anchor="middle">%g</text>', fmt1(px), fmt1(px), PY1, PY1 + 5, fmt1(px), PY1 + 18, v)
    v = v + xstep
  end
  out[#out + 1] = string.format('<text x="%d" y="%d" text-anchor="middle" fill="#444">%s</text>',
    (PX0 + PX1) // 2, PY1 + 38, xunit == "ms" and "time (ms)" or "trace event")

  -- the allocations, then the merged small ones on top
  out[#out + 1] = '<g id="allocations" stroke="#fff" stroke-width="0.3" stroke-opacity="0.7">'
  local strf = string.format
  for i, el in ipairs(drawn) do
    local p, n, size = el.pts, el.np, el.size
    local coords = {}
    for j = 1, n, 2 do coords[#coords + 1] = strf("%.1f,%.1f", p[j], yof(p[j + 1])) end
    for j = n - 1, 1, -2 do coords[#coords + 1] = strf("%.1f,%.1f", p[j], yof(p[j + 1] + size)) end
    local first = el.initial and "live before the trace began"
      or strf("allocated at event %d", trace_index[el.start])
    local last = el.stop and strf("freed at event %d", trace_index[el.stop]) or "still live at the snapshot"
    out[#out + 1] = strf('<polygon class="alloc" fill="%s" points="%s"><title>%s</title></polygon>',
      SHADES[el.class][i % 3 + 1], concat(coords, " "), tooltip(el, first, last))
  end
  out[#out + 1] = '</g>'
  for ci, tag in ipairs(M.tags) do
    local any, most = false, 0
    for _, s in ipairs(profile) do
      if s[ci] > 0 then any = true end
      if s[ci] > most then most = s[ci] end
    end
    if any then
      local lo, hi = {}, {}
      for j, s in ipairs(profile) do
        local bottom = s.drawn
        for cj = 1, ci - 1 do bottom = bottom + s[cj] end
        lo[#lo + 1] = strf("%.1f,%.1f %.1f,%.1f", s.x0, yof(bottom), s.x1, yof(bottom))
        hi[#profile - j + 1] = strf("%.1f,%.1f %.1f,%.1f", s.x1, yof(bottom + s[ci]), s.x0, yof(bottom + s[ci]))
      end
      out[#out + 1] = strf('<polygon class="band small" data-tag="%s" fill="%s" fill-opacity="0.45" ' ..
        'points="%s %s"><title>small %s allocations (each under a pixel high), up to %s</title></polygon>',
        esc(tag), M.colors[tag], concat(lo, " "), concat(hi, " "), esc(tag), format_bytes(most))
    end
  end

  -- out-of-memory events and the peak
  for _, o in ipairs(r.ooms) do
    local px = x_of_event(o.index)
    out[#out + 1] = strf('<line class="oom" x1="%s" x2="%s" y1="%d" y2="%d" stroke="#b00020" stroke-width="2">' ..
      '<title>out of memory: %s requested, %s free on the device</title></line>', fmt1(px), fmt1(px), PY0, PY1,
      format_bytes(int(o.rec.size, 0)), format_bytes(int(o.rec.device_free, 0)))
  end
  local ppx, ppy = xof(peak_step), yof(peak)
  out[#out + 1] = strf('<line class="peak" x1="%d" x2="%d" y1="%s" y2="%s" stroke="#222" stroke-dasharray="6 4"/>',
    PX0, PX1, fmt1(ppy), fmt1(ppy))
  out[#out + 1] = strf('<line x1="%s" x2="%s" y1="%s" y2="%d" stroke="#222" stroke-dasharray="2 3"/>', fmt1(ppx),
    fmt1(ppx), fmt1(ppy), PY1)
  local peak_index = peak_step > 0 and trace_index[peak_step] or 0
  local anchor, lx = "end", PX1 - 6
  if ppx < PX0 + PW * 0.5 then anchor, lx = "start", ppx + 6 end
  out[#out + 1] = strf('<text id="peak-label" data-bytes="%d" x="%s" y="%s" text-anchor="%s" font-weight="bold" ' ..
    'paint-order="stroke" stroke="#fff" stroke-width="3">peak %s (event %d)</text>', peak, fmt1(lx), fmt1(ppy - 6),
    anchor, format_bytes(peak), peak_index)
  return page(opts.title or "tfhost memory", out, xmax, ymax, xunit)
end

return M
