--- tf: the tfhost runtime, as scripts see it (also the global `tf`).
-- The C core ("tf.core") provides tensors, ops, memory, timers and JSON;
-- this file adds the Lua half: printing, script options, benchmarking,
-- reports and results files.
local C = require "tf.core"
-- Only tf reaches the core: tracebacks then name its functions tf.<name>.
package.loaded["tf.core"] = nil

local tf = {}
for name, value in pairs(C) do
  if name:sub(1, 1) ~= "_" then tf[name] = value end
end

C._tensor_metatable.__tostring = require("tf.format").tensor

tf.cuda = {
  is_available = C.cuda_available,
  device_count = C.cuda_device_count,
  compiled = C.cuda_compiled,
}

local json = C.json
--- Reads and decodes a JSON file.
function json.read(path)
  local f, err = io.open(path, "r")
  if not f then error("tf.json.read: " .. err, 2) end
  local text = f:read("a")
  f:close()
  return json.decode(text)
end
--- Encodes value and writes it to path (options as tf.json.encode).
function json.write(path, value, opts)
  local text = json.encode(value, opts or { indent = true })
  local f, err = io.open(path, "w")
  if not f then error("tf.json.write: " .. err, 2) end
  f:write(text, "\n")
  f:close()
end
--- Marks a table to be written as a JSON array even when empty.
function json.array(t)
  return setmetatable(t or {}, { __jsontype = "array" })
end
tf.json = json

--- tf.no_op: handy default for callbacks.
function tf.no_op() end

tf.options = require("tf.options").declare
tf.bench = require("tf.bench").bench
tf.report = require "tf.report"
tf.results = require "tf.results"

return tf
