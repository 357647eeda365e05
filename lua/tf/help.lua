--- help: one-line signatures and summaries of tf's functions, for the REPL
-- and scripts. help() lists the namespaces; help(tf.matmul) or
-- help("tf.matmul") prints a function's signature and what it does;
-- help(tf.nn) lists a namespace's entries. docs/api.md is the full
-- reference. The entries themselves are in help_entries.lua, loaded at the
-- first help or Tab (M.entries, M.namespaces, M.tensor_fields), not at start.
local M = {}

local by_name -- entry name -> entry, made with the entries
setmetatable(M, {
  __index = function(t, k)
    if k ~= "entries" and k ~= "namespaces" and k ~= "tensor_fields" then return nil end
    local e = require "tf.help_entries"
    t.entries, t.namespaces, t.tensor_fields = e.entries, e.namespaces, e.tensor_fields
    by_name = {}
    for _, entry in ipairs(e.entries) do by_name[entry[1]] = entry end
    return rawget(t, k)
  end,
})

-- The entry of a name, or nil (loads the entries).
local function entry_of(name)
  if not by_name then local _ = M.entries end
  return by_name[name]
end

-- The value at a dotted name ("tf.nn.Linear") from the globals, or nil.
function M.resolve(name)
  local v = _G
  for part in name:gmatch("[^.]+") do
    if type(v) ~= "table" and getmetatable(v) == nil then return nil end
    local ok, nv = pcall(function() return v[part] end)
    if not ok then return nil end
    v = nv
  end
  return v
end

local function is_tensor(v) return type(v) == "userdata" and tf and tf.is_tensor(v) end

-- The names of values: entries first, then namespaces, then every table
-- reached from tf (so help(tf.report.formats) can list it).
local function names_by_value()
  local names = {}
  local function name(v, n)
    if v ~= nil and names[v] == nil then names[v] = n end
  end
  for _, e in ipairs(M.entries) do name(M.resolve(e[1]), e[1]) end
  for _, n in ipairs(M.namespaces) do name(M.resolve(n[1]), n[1]) end
  local walked = {}
  local function walk(t, prefix)
    walked[t] = true
    for k, v in pairs(t) do
      if type(k) == "string" and k:sub(1, 1) ~= "_" and type(v) == "table" and not walked[v] then
        name(v, prefix .. "." .. k)
        walk(v, prefix .. "." .. k)
      end
    end
  end
  if type(rawget(_G, "tf")) == "table" then walk(tf, "tf") end
  return names
end

-- "tf.sum(x [, dim])" -> "x:sum([dim])": an op's form as a tensor method.
local function method_form(sig)
  local op, first, rest = sig:match("^tf%.([%w_]+)%(([%w_]+)(.*)$")
  if not op then return nil end
  if rest:sub(1, 2) == ", " then
    rest = rest:sub(3)
  elseif rest:sub(1, 4) == " [, " then
    rest = "[" .. rest:sub(5)
  end
  return first .. ":" .. op .. "(" .. rest
end

local function show_entry(e)
  local text = e[2] .. "\n  " .. e[3]
  local op = e[1]:match("^tf%.([%w_]+)$")
  local methods = tf and tf.Tensor
  if op and methods and rawget(methods, op) ~= nil and rawget(methods, op) == M.resolve(e[1]) then
    text = text .. "\n  also a tensor method: " .. method_form(e[2])
  end
  return text
end

-- Words joined into lines of at most width characters, each indented.
local function wrap(words, indent, width)
  local lines, line = {}, indent
  for _, w in ipairs(words) do
    if #line > #indent and #line + 1 + #w > width then
      lines[#lines + 1] = line
      line = indent
    end
    line = line .. (#line > #indent and " " or "") .. w
  end
  if #line > #indent then lines[#lines + 1] = line end
  return table.concat(lines, "\n")
end

-- What a tensor offers: its own methods, the ops that are methods too, its fields.
local function show_tensor()
  local lines = { "tf.Tensor (x below is a tensor):" }
  for _, e in ipairs(M.entries) do
    if e[1]:match("^tf%.Tensor%.") then lines[#lines + 1] = string.format("  %-42s %s", e[2], e[3]) end
  end
  local ops = {}
  for k, v in pairs(tf.Tensor) do
    if type(k) == "string" and rawget(tf, k) == v then ops[#ops + 1] = k end
  end
  table.sort(ops)
  lines[#lines + 1] = "ops, also methods (x:sum(), a:matmul(b); help(tf.sum) for one):"
  lines[#lines + 1] = wrap(ops, "  ", 100)
  lines[#lines + 1] = "fields:"
  for _, f in ipairs(M.tensor_fields) do lines[#lines + 1] = string.format("  %-42s %s", "x." .. f[1], f[2]) end
  return table.concat(lines, "\n")
end

-- The entries under a table's name, and the tables in it.
local function show_namespace(ns, t)
  if ns == "tf.Tensor" then return show_tensor() end
  local lines = { ns .. ":" }
  for _, e in ipairs(M.entries) do
    local prefix = e[1]:match("^(.*)%.[^.]+$")
    if prefix == ns then lines[#lines + 1] = string.format("  %-42s %s", e[2], e[3]) end
  end
  local inner = {}
  for k, v in pairs(t) do
    if type(k) == "string" and k:sub(1, 1) ~= "_" and type(v) == "table" and not entry_of(ns .. "." .. k) then
      inner[#inner + 1] = ns .. "." .. k
    end
  end
  table.sort(inner)
  for _, n in ipairs(inner) do lines[#lines + 1] = string.format("  %-42s %s", n, "(a table: help(" .. n .. "))") end
  return table.concat(lines, "\n")
end

--- The help text for x (nil: the overview), or nil and why. x is a value
--- (a function, a table, a tensor: help(x.sum), help(tf.nn)) or its name.
function M.text(x)
  if x == nil then
    local lines = { "tfhost " .. (tf and tf.version or "") .. ": help(name or function) for one entry, e.g. help(tf.matmul);",
      "docs/api.md is the full reference. Namespaces:" }
    for _, n in ipairs(M.namespaces) do lines[#lines + 1] = string.format("  %-16s %s", n[1], n[2]) end
    return table.concat(lines, "\n")
  end
  local why = "no help for " .. (type(x) == "string" and ("'" .. x .. "'") or tostring(x)) ..
    " (help() lists the namespaces; docs/api.md has everything)"
  if type(x) == "string" and entry_of(x) then return show_entry(entry_of(x)) end
  local v = x
  if type(x) == "string" then v = M.resolve(x) end
  if is_tensor(v) then return show_tensor() end
  if v == nil then return nil, why end
  local names = names_by_value()
  local name = names[v]
  if not name and type(v) == "table" and getmetatable(v) ~= nil then
    name = names[getmetatable(v)] -- a module's class: help(model) is help(tf.nn.Linear)
  end
  if name and entry_of(name) then return show_entry(entry_of(name)) end
  if name and type(v) == "table" then return show_namespace(name, v) end
  return nil, why
end

-- The names a value offers after "." (every field) or ":" (its methods):
-- a table's string keys and its metatable's __index table's, a tensor's
-- methods and (after ".") its fields.
local function fields(v, methods_only)
  local out, seen = {}, {}
  local function add(k, x)
    if type(k) == "string" and k:match("^[%a_][%w_]*$") and not seen[k]
        and (not methods_only or type(x) == "function") then
      seen[k] = true
      out[#out + 1] = k
    end
  end
  local function add_all(t)
    if type(t) ~= "table" then return end
    for k, x in pairs(t) do add(k, x) end
  end
  if type(v) == "table" then add_all(v) end
  if is_tensor(v) then
    add_all(tf.Tensor)
    if not methods_only then
      for _, f in ipairs(M.tensor_fields) do add(f[1], true) end
    end
  end
  local mt = getmetatable(v)
  if type(mt) == "table" and type(rawget(mt, "__index")) == "table" then add_all(mt.__index) end
  return out
end

--- complete(text): the completions of a partial name, sorted: globals,
--- "tf.ma" -> "tf.matmul", "tf.max", ..., "x:su" -> "x:sum", ..., "w.gr" ->
--- "w.grad", "w.grad_fn" (the REPL's Tab).
function M.complete(text)
  local head, sep, partial = text:match("^(.*)([.:])([%w_]*)$")
  local candidates
  if head then
    if not head:match("^[%a_][%w_.]*$") then return {} end
    local v = M.resolve(head)
    if v == nil then return {} end
    candidates = fields(v, sep == ":")
  else
    head, sep, partial = "", "", text
    candidates = fields(_G)
  end
  local out = {}
  for _, k in ipairs(candidates) do
    if k:sub(1, #partial) == partial then out[#out + 1] = head .. sep .. k end
  end
  table.sort(out)
  return out
end

--- help([x]): prints the help text (or why there is none).
function M.help(x)
  local text, why = M.text(x)
  print(text or why)
end

return M
