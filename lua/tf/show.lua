--- tf.show: how the REPL prints the values of an expression. A table prints
-- as a Lua table constructor, nested, with its keys sorted, on one line when
-- it fits and one entry per line when not; deep, long or cyclic tables are
-- cut short with a note, so printing never floods the terminal. Other values
-- print as print() shows them (tensors with their values).
--
--   tf> tf.mem.stats()
--   {
--     active_blocks = 0,
--     allocated = 0,
--     ...
--   }
local M = {}

M.max_depth = 4    -- tables nested deeper print as {...}
M.max_items = 50   -- entries shown of one table
M.max_total = 400  -- entries shown in all
M.width = 100      -- a table fits on one line up to this many characters

local function is_identifier(k)
  return type(k) == "string" and k:match("^[%a_][%w_]*$") ~= nil and not ({
    ["and"] = 1, ["break"] = 1, ["do"] = 1, ["else"] = 1, ["elseif"] = 1, ["end"] = 1, ["false"] = 1,
    ["for"] = 1, ["function"] = 1, ["goto"] = 1, ["if"] = 1, ["in"] = 1, ["local"] = 1, ["nil"] = 1,
    ["not"] = 1, ["or"] = 1, ["repeat"] = 1, ["return"] = 1, ["then"] = 1, ["true"] = 1, ["until"] = 1,
    ["while"] = 1,
  })[k]
end

local function quote(s) return (string.format("%q", s):gsub("\\\n", "\\n")) end

-- A scalar (or anything that is not a plain table) as it reads inside a table.
local function scalar(v)
  if type(v) == "string" then return quote(v) end
  if type(v) == "userdata" and tf and tf.is_tensor(v) then
    -- inside a table, a tensor's summary, not its values
    local ok, text = pcall(function()
      return string.format("tensor(shape=%s, dtype=%s, device=%s)", tostring(v.shape), v.dtype, v.device)
    end)
    return ok and text or tostring(v)
  end
  return tostring(v)
end

-- Whether print() already shows v well: anything but a table without __tostring.
local function has_own_text(v)
  local mt = getmetatable(v)
  return type(v) ~= "table" or (mt ~= nil and (type(mt) ~= "table" or mt.__tostring ~= nil))
end

local type_order = { number = 1, string = 2, boolean = 3 }

-- The keys of t in print order: 1..n first, then the others sorted.
local function ordered_keys(t)
  local n = #t
  local keys, rest = {}, {}
  for i = 1, n do keys[i] = i end
  for k in next, t do
    if not (math.type(k) == "integer" and k >= 1 and k <= n) then rest[#rest + 1] = k end
  end
  table.sort(rest, function(a, b)
    local ta, tb = type_order[type(a)] or 4, type_order[type(b)] or 4
    if ta ~= tb then return ta < tb end
    if ta <= 2 then return a < b end
    return tostring(a) < tostring(b)
  end)
  for _, k in ipairs(rest) do keys[#keys + 1] = k end
  return keys, n
end

local function render(v, state, indent, open)
  if has_own_text(v) then return scalar(v) end
  if open[v] then return "<cycle: " .. tostring(v) .. ">" end
  if indent // 2 >= M.max_depth then return "{...}" end
  local keys, n = ordered_keys(v)
  if #keys == 0 then return "{}" end
  open[v] = true
  local items, listed, single, length = {}, {}, true, 0
  for i, k in ipairs(keys) do
    if i > M.max_items or state.total >= M.max_total then
      items[#items + 1] = string.format("... (%d more)", #keys - i + 1)
      break
    end
    state.total = state.total + 1
    local text = render(rawget(v, k), state, indent + 2, open)
    if not (math.type(k) == "integer" and k >= 1 and k <= n) then
      local key = is_identifier(k) and k or ("[" .. render(k, state, indent + 2, open) .. "]")
      text = key .. " = " .. text
    else
      listed[#items + 1] = not text:find("\n", 1, true)
    end
    single = single and not text:find("\n", 1, true)
    length = length + #text + 2
    items[#items + 1] = text
  end
  open[v] = nil
  if single and indent + length + 2 <= M.width then return "{ " .. table.concat(items, ", ") .. " }" end
  -- one entry per line, but a list's one-line items share lines up to the width
  local pad = string.rep(" ", indent + 2)
  local lines = {}
  for i, text in ipairs(items) do
    local last = lines[#lines]
    if listed[i] and listed[i - 1] and #last + #text + 2 <= M.width then
      lines[#lines] = last .. " " .. text .. ","
    else
      lines[#lines + 1] = pad .. text .. ","
    end
  end
  return "{\n" .. table.concat(lines, "\n") .. "\n" .. string.rep(" ", indent) .. "}"
end

--- tf.show.text(v): v as the REPL prints it (a string).
function M.text(v)
  if has_own_text(v) then return tostring(v) end
  return render(v, { total = 0 }, 0, {})
end

--- tf.show.print(...): prints the values through the global print, tables rendered.
function M.print(...)
  local n = select("#", ...)
  local out = table.pack(...)
  for i = 1, n do
    if not has_own_text(out[i]) then out[i] = M.text(out[i]) end
  end
  print(table.unpack(out, 1, n))
end

return M
