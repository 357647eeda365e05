--- tf.pickle: Python values written as a protocol-2 pickle, the format
-- PyTorch's memory snapshots are read in (tf.memviz writes them through it;
-- scripts reach it as memviz.python). Dicts keep their keys in the order
-- given (dict(k1, v1, k2, v2, ...)), so the same value always gives the same
-- bytes. Strings, integers, floats and booleans are themselves.
--
--   local py = require "tf.pickle"
--   local bytes = py.dumps(py.dict("name", "w", "shape", py.tuple(2, 3), "tags", py.list({ "a" })))
local py = {}

local pack, char, concat = string.pack, string.char, table.concat
local mtype = math.type


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
function py.text(s)
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
local text = py.text

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

-- The Python value as plain Lua tables for tf.json (dicts become objects,
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

--- py.plain(value, json): the Python value as plain Lua tables for json (tf.json):
-- dicts become objects, lists and tuples arrays, None json.null.
function py.plain(value, json) return plain(value, json, {}) end

return py
