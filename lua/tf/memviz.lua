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
--
-- Three files: the pickle writer is lua/tf/pickle.lua (memviz.python), the
-- page lua/tf/memviz_html.lua (memviz.html), the conversion and the rest of
-- the API this one.
local M = {}

local py = require "tf.pickle"
M.python = py
local text = py.text
M.text = text

local concat = table.concat
local tointeger, mtype = math.tointeger, math.type

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
  return json.encode(py.plain(M.torch(snapshot), json), opts)
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

-- ---- tags, colours, sizes -----------------------------------------------------

--- The recorder's tags, in the legend's order, and the colour of each.
M.tags = { "parameter", "gradient", "optimizer state", "activation", "workspace", "temporary", "other" }
M.colors = {
  parameter = "#4e79a7", gradient = "#f28e2c", ["optimizer state"] = "#59a14f", activation = "#e15759",
  workspace = "#76b7b2", temporary = "#e0b825", other = "#9c9c9c",
}
local UNITS = { { "TiB", 2 ^ 40 }, { "GiB", 2 ^ 30 }, { "MiB", 2 ^ 20 }, { "KiB", 2 ^ 10 } }

--- Bytes for people: "512 B", "1.50 KiB", "3.00 MiB", "1.25 GiB".
function M.format_bytes(n)
  for _, u in ipairs(UNITS) do
    if math.abs(n) >= u[2] then return string.format("%.2f %s", n / u[2], u[1]) end
  end
  return string.format("%d B", n)
end

-- What tf.memviz_html draws from: the replay of a trace, the live bytes over
-- it, the integer reading of a field, the byte units.
M._trace = { replay = replay, peak_of = peak_of, int = int, units = UNITS }

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
  return require("tf.memviz_html").html(snapshot, opts)
end

return M
