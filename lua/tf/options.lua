--- Script options: a script declares them, tfhost parses its arguments.
--
--   local opt = tf.options{
--     description = "What this script measures",
--     {"size", "model sizes to run", default = "small", type = "list"},
--     {"steps", "timed steps", default = 10, type = "int"},
--     {"json", "write results to this file", type = "string"},
--     {"verbose", "print every step", type = "bool"},
--   }
--
-- Types: string, int, number, bool, list (comma-separated strings),
-- list:int, list:number; `choices = {...}` restricts values; `min = n` and
-- `max = n` bound a number (every value of a list), checked as the
-- arguments are parsed, so a bad value is refused before anything runs.
-- `cpu = value` is the default where the default device is the CPU (a
-- sweep sized for a GPU would take hours there); --help shows both.
-- Arguments are
-- --name value, --name=value, --flag, --no-flag. `tfhost script.lua --help`
-- lists the options; an unknown or malformed option is a usage error (exit
-- code 2). Positional arguments come back in opt.args. `usage = "..."`
-- replaces the help's first line.
local M = {}

local TYPES = {
  string = "STR", int = "INT", number = "NUM", bool = "", list = "LIST",
  ["list:int"] = "INTS", ["list:number"] = "NUMS",
}

local declared = nil -- the options of the running script, for results files

--- Whether the run's default device is the CPU (where `cpu = ...` defaults apply).
function M.on_cpu()
  local ok, dev = pcall(function() return require("tf").default_device() end)
  return not ok or dev == "cpu"
end

local function usage_error(script, msg)
  local tf = require "tf"
  tf.exit(2, string.format("%s: %s (see %s --help)\n", script, msg, script))
end

local function convert_scalar(kind, text)
  if kind == "int" then
    return math.tointeger(tonumber(text))
  elseif kind == "number" then
    local v = tonumber(text)
    return v and v + 0.0
  end
  return text
end

-- The typed value of `text` for option spec, or nil and a reason.
local function convert(spec, text)
  local kind = spec.type
  if kind == "bool" then
    local v = ({ ["true"] = true, ["1"] = true, yes = true, on = true,
                 ["false"] = false, ["0"] = false, no = false, off = false })[text:lower()]
    if v == nil then return nil, "expects true or false" end
    return v
  end
  local values
  if kind:sub(1, 4) == "list" then
    local item = kind:match("^list:(%a+)$") or "string"
    values = {}
    for piece in (text .. ","):gmatch("([^,]*),") do
      piece = piece:match("^%s*(.-)%s*$")
      if piece ~= "" then
        local v = convert_scalar(item, piece)
        if v == nil then return nil, "expects a comma-separated list of " .. item .. "s" end
        values[#values + 1] = v
      end
    end
    if #values == 0 then return nil, "expects at least one value" end
  else
    local v = convert_scalar(kind, text)
    if v == nil then return nil, "expects " .. (kind == "int" and "an integer" or "a number") end
    values = { v }
  end
  if spec.choices then
    local ok = {}
    for _, c in ipairs(spec.choices) do ok[c] = true end
    for _, v in ipairs(values) do
      if not ok[v] then
        return nil, "must be one of " .. table.concat(spec.choices, ", ") .. " (got " .. tostring(v) .. ")"
      end
    end
  end
  for _, v in ipairs(values) do
    local each = kind:sub(1, 4) == "list" and "values " or ""
    if type(v) == "number" and spec.min and v < spec.min then
      return nil, string.format("%smust be >= %s (got %s)", each, tostring(spec.min), tostring(v))
    end
    if type(v) == "number" and spec.max and v > spec.max then
      return nil, string.format("%smust be <= %s (got %s)", each, tostring(spec.max), tostring(v))
    end
  end
  if kind:sub(1, 4) == "list" then return values end
  return values[1]
end

local function help_text(script, specs, description, usage)
  local lines = { "usage: " .. (usage or ("tfhost " .. script .. " [options]")) }
  if description then lines[#lines + 1] = description end
  lines[#lines + 1] = ""
  lines[#lines + 1] = "Options:"
  local rows, width = {}, 10
  for _, s in ipairs(specs) do
    local left = "--" .. s.name .. (TYPES[s.type] ~= "" and (" " .. TYPES[s.type]) or "")
    if #left > width then width = #left end
    local right = s.help or ""
    if s.choices then right = right .. " [" .. table.concat(s.choices, "|") .. "]" end
    local function text(v) return type(v) == "table" and table.concat(v, ",") or tostring(v) end
    if s.cpu ~= nil then
      right = right .. " (default: " .. (s.default ~= nil and text(s.default) or "none") .. " on a GPU, " ..
        text(s.cpu) .. " on a CPU)"
    elseif s.default ~= nil then
      right = right .. " (default: " .. text(s.default) .. ")"
    end
    rows[#rows + 1] = { left, right }
  end
  rows[#rows + 1] = { "-h, --help", "show this help" }
  for _, r in ipairs(rows) do
    lines[#lines + 1] = string.format("  %-" .. width .. "s  %s", r[1], r[2])
  end
  return table.concat(lines, "\n") .. "\n"
end

local function normalise(decl)
  local specs, by_name = {}, {}
  for i, d in ipairs(decl) do
    local s = {
      name = d[1] or d.name, help = d[2] or d.help, default = d.default,
      type = d.type, choices = d.choices, min = d.min, max = d.max, cpu = d.cpu,
    }
    if type(s.name) ~= "string" or not s.name:match("^[%w][%w_-]*$") then
      error(string.format("tf.options: option %d needs a name of letters, digits, '-' and '_'", i), 3)
    end
    if by_name[s.name] then error("tf.options: option '" .. s.name .. "' is declared twice", 3) end
    if s.type == nil then
      local d = s.default
      if d == nil then d = s.cpu end
      s.type = math.type(d) == "integer" and "int" or type(d) == "number" and "number"
        or type(d) == "boolean" and "bool" or "string"
    end
    for _, bound in ipairs({ "min", "max" }) do
      if s[bound] ~= nil and type(s[bound]) ~= "number" then
        error("tf.options: option '" .. s.name .. "': " .. bound .. " must be a number", 3)
      end
    end
    if not TYPES[s.type] then
      error("tf.options: option '" .. s.name .. "' has unknown type '" .. tostring(s.type) .. "'", 3)
    end
    for _, field in ipairs({ "default", "cpu" }) do
      local what = field == "cpu" and "the CPU default of '" or "the default of '"
      if type(s[field]) == "string" and s.type ~= "string" then
        local v, why = convert(s, s[field])
        if v == nil then error("tf.options: " .. what .. s.name .. "' " .. why, 3) end
        s[field] = v
      elseif s.type == "number" and math.type(s[field]) == "integer" then
        s[field] = s[field] + 0.0
      end
      if s.choices and s[field] ~= nil then
        for _, v in ipairs(type(s[field]) == "table" and s[field] or { s[field] }) do
          local found = false
          for _, c in ipairs(s.choices) do found = found or c == v end
          if not found then
            error("tf.options: " .. what .. s.name .. "' must be one of " .. table.concat(s.choices, ", ") ..
              " (got " .. tostring(v) .. ")", 3)
          end
        end
      end
    end
    if s.type == "bool" and s.default == nil then s.default = false end
    specs[#specs + 1], by_name[s.name] = s, s
  end
  return specs, by_name
end

--- Declares the script's options and returns their values, parsed from
-- argv (default: the script's arguments, the global `arg`).
function M.declare(decl, argv)
  if type(decl) ~= "table" then error("tf.options: expects a table of option declarations", 2) end
  local specs, by_name = normalise(decl)
  argv = argv or arg or {}
  local script = (arg and arg[0]) or "script"
  local values, args = {}, {}
  local cpu = M.on_cpu()
  for _, s in ipairs(specs) do
    if cpu and s.cpu ~= nil then values[s.name] = s.cpu else values[s.name] = s.default end
  end
  local i, only_positional = 1, false
  while i <= #argv do
    local a = argv[i]
    if only_positional or a:sub(1, 1) ~= "-" or a == "-" then
      args[#args + 1] = a
    elseif a == "--" then
      only_positional = true
    elseif a == "-h" or a == "--help" then
      require("tf").exit(0, help_text(script, specs, decl.description, decl.usage))
    else
      local name, value = a:match("^%-%-([^=]+)=(.*)$")
      name = name or a:match("^%-%-(.+)$")
      if not name then usage_error(script, "unknown option '" .. a .. "'") end
      local spec = by_name[name]
      if not spec and name:sub(1, 3) == "no-" and by_name[name:sub(4)] and by_name[name:sub(4)].type == "bool" then
        spec, value = by_name[name:sub(4)], value or "false"
        if value ~= "false" then usage_error(script, "option '--" .. name .. "' takes no value") end
      end
      if not spec then usage_error(script, "unknown option '--" .. name .. "'") end
      if value == nil then
        if spec.type == "bool" then
          value = "true"
        else
          i = i + 1
          value = argv[i]
          if value == nil then usage_error(script, "option '--" .. name .. "' needs a value") end
        end
      end
      local v, why = convert(spec, value)
      if v == nil then usage_error(script, "option '--" .. spec.name .. "' " .. why) end
      values[spec.name] = v
    end
    i = i + 1
  end
  values.args = args
  declared = values
  require("tf.results").note_script()
  return values
end

--- The option values of the running script (nil when it declared none).
function M.current()
  return declared
end

return M
