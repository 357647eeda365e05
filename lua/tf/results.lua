--- Results files: what was measured, plus everything needed to reproduce
-- it (tfhost version and commit, device, driver and CUDA versions, seed,
-- options, date).
local M = {}
local writable = require("tf.safe").writable -- tfhost --safe's path rule

local function safe(fn, ...)
  local ok, v = pcall(fn, ...)
  if ok then return v end
  return nil
end

--- The environment of this run, as a table.
function M.env()
  local tf = require "tf"
  local options = require("tf.options").current()
  local info = safe(tf.device_info) or {}
  local env = {
    tfhost = { version = tf.version, commit = tf.commit, build = tf.build_options },
    date = os.date("!%Y-%m-%dT%H:%M:%SZ"),
    device = safe(tf.device) or tf.default_device(),
    device_info = info,
    driver_version = info.driver_version,
    cuda_runtime_version = info.runtime_version,
    cublas_version = info.blas_version,
    seed = tf.initial_seed(),
    tf32 = safe(tf.allow_tf32),
    host = tf.sysinfo(),
    script = arg and arg[0] or nil,
    argv = arg and table.move(arg, 1, #arg, 1, tf.json.array()) or nil,
    options = options,
  }
  if options then
    local copy = {}
    for k, v in pairs(options) do copy[k] = v end
    copy.args = tf.json.array(copy.args)
    env.options = copy
  end
  return env
end

--- Writes {env = tf.results.env(), results = results, ...extra} as JSON to
-- path and returns that table. results is a list of rows or a table of
-- named parts; extra may add fields (e.g. a summary).
function M.write(path, results, extra)
  local tf = require "tf"
  writable(path, "tf.results.write")
  results = results or {}
  local is_list = results[1] ~= nil or next(results) == nil
  local doc = { env = M.env(), results = is_list and tf.json.array(results) or results }
  for k, v in pairs(extra or {}) do doc[k] = v end
  tf.json.write(path, doc, { indent = true, nan = "null" })
  return doc
end

return M
