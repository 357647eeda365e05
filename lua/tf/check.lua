--- Options tables of the Lua half of the API: an unknown key or value is an
-- error that names it and lists what is accepted, so a typo never passes
-- silently. The C bindings' twin is tf_lua_checkkeys (host/bind/bind.c).
--
--   check.keys(opts, "tf.model.new", {"preset", "d_model", ...}, {size = "preset"})
--   check.choice(opts.precision, "tf.model.new", "precision", {"f32", "bf16", "f16"})
--
-- error() reports the first line outside tfhost's modules, so the message
-- points at the user's call whatever the depth.
local M = {}

-- name without case and underscores: "dmodel" and "D_Model" are near "d_model".
local function plain(name) return (name:lower():gsub("_", "")) end

--- Refuses opts (nil passes) unless a table whose every key is in accepted
-- (a list of names). hints maps names users are likely to try to the
-- accepted one they mean ({size = "preset"}). Returns opts or {}.
function M.keys(opts, fname, accepted, hints)
  if opts == nil then return {} end
  if type(opts) ~= "table" then error(fname .. ": options must be a table, not " .. type(opts), 2) end
  local known = {}
  for _, k in ipairs(accepted) do known[k] = true end
  local unknown = {}
  for k in pairs(opts) do
    if not known[k] then unknown[#unknown + 1] = k end
  end
  if #unknown == 0 then return opts end
  table.sort(unknown, function(a, b) return tostring(a) < tostring(b) end)
  local k = unknown[1]
  local near = hints and hints[k]
  if not near and type(k) == "string" then
    for _, a in ipairs(accepted) do
      if plain(a) == plain(k) then near = a end
    end
  end
  local names = {}
  for i, u in ipairs(unknown) do names[i] = "'" .. tostring(u) .. "'" end
  error(string.format("%s: unknown option%s %s%s; accepted: %s", fname, #unknown > 1 and "s" or "",
    table.concat(names, ", "), near and " (did you mean " .. near .. "?)" or "", table.concat(accepted, ", ")), 2)
end

--- Refuses value (nil passes) unless it is one of choices (a list).
function M.choice(value, fname, key, choices)
  if value == nil then return nil end
  for _, c in ipairs(choices) do
    if value == c then return value end
  end
  local shown = {}
  for i, c in ipairs(choices) do shown[i] = type(c) == "string" and string.format("%q", c) or tostring(c) end
  error(string.format("%s: %s must be %s, not %s", fname, key, table.concat(shown, ", "),
    type(value) == "string" and string.format("%q", value) or tostring(value)), 2)
end

--- What v is in a message about a missing or wrong argument: "nothing"
-- for nil, else its Lua type ("number", "table").
function M.kind(v) return v == nil and "nothing" or type(v) end

-- What v is, as messages say it: "a tf.Tensor", "nil", "a number".
local function what_is(v)
  if v == nil then return "nil" end
  local mt = getmetatable(v)
  local name = type(mt) == "table" and rawget(mt, "__name")
  return "a " .. (type(name) == "string" and name or type(v))
end
M.what_is = what_is

local function callable(v)
  if type(v) == "function" then return true end
  local mt = getmetatable(v)
  return type(mt) == "table" and rawget(mt, "__call") ~= nil
end

--- Refuses argument v of fname (described as what, e.g. "argument #1 (fn)")
-- unless it is of kind ("function" (anything callable), "tensor",
-- "string", "number", "integer", "table"); optional lets nil pass.
function M.arg(v, fname, what, kind, optional)
  if v == nil and optional then return v end
  local ok
  if kind == "function" then ok = callable(v)
  elseif kind == "tensor" then ok = require("tf").is_tensor(v)
  elseif kind == "integer" then ok = math.type(v) == "integer"
  else ok = type(v) == kind end
  if not ok then
    error(string.format("%s: %s must be %s%s%s, not %s", fname, what, kind == "integer" and "an " or "a ", kind,
      optional and " (or nil)" or "", what_is(v)), 2)
  end
  return v
end

return M
