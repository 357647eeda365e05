--- Results files: what was measured, plus everything needed to reproduce
-- it and to tell where it came from (the script and a hash of its source,
-- the tfhost binary and its hash, the command line, seed, start time and
-- duration, tfhost version and build, device, driver and CUDA versions,
-- options).
local M = {}
local writable = require("tf.safe").writable -- tfhost --safe's path rule

-- When this run began: the runtime loads this module before the script runs.
local started_wall, started_ms = os.time(), nil

local function safe(fn, ...)
  local ok, v = pcall(fn, ...)
  if ok then return v end
  return nil
end

local binary_sha256 -- hashed once per run: the binary does not change under us
local script_hash -- {path, sha256}, taken as the script starts (tf.options) or at the first write

--- The whole command line as a list: tfhost's path and options (arg's
-- negative indices), the script and its arguments; nil without `arg`.
function M.command()
  local tf = require "tf"
  if not arg then return nil end
  local first = 0
  while arg[first - 1] ~= nil do first = first - 1 end
  local out = tf.json.array()
  for i = first, #arg do out[#out + 1] = arg[i] end
  return out
end

-- The script's source hash, when the script is a file that can be read.
local function script_sha256(tf, path)
  if type(path) ~= "string" or path == "-" then return nil end
  if not (script_hash and script_hash.path == path) then
    script_hash = { path = path, sha256 = safe(tf.sha256_file, path) }
  end
  return script_hash.sha256
end

--- Hashes the running script's source now, so that results written later
-- name the source that started, even if the file is edited meanwhile
-- (tf.options calls it as a script declares its options).
function M.note_script()
  if arg then script_sha256(require "tf", arg[0]) end
end

--- The environment of this run, as a table.
function M.env()
  local tf = require "tf"
  local options = require("tf.options").current()
  local info = safe(tf.device_info) or {}
  local exe = safe(tf.executable)
  if exe and not binary_sha256 then binary_sha256 = safe(tf.sha256_file, exe) end
  local script = arg and arg[0] or nil
  local env = {
    tfhost = { version = tf.version, commit = tf.commit, build = tf.build_options, binary = exe,
      binary_sha256 = binary_sha256 },
    date = os.date("!%Y-%m-%dT%H:%M:%SZ"),
    started = os.date("!%Y-%m-%dT%H:%M:%SZ", started_wall),
    duration_s = started_ms and (tf.now() - started_ms) / 1e3 or nil,
    device = safe(tf.device) or tf.default_device(),
    device_info = info,
    driver_version = info.driver_version,
    cuda_runtime_version = info.runtime_version,
    cublas_version = info.blas_version,
    seed = tf.initial_seed(),
    tf32 = safe(tf.allow_tf32),
    -- what the fused engine's timed choice of GEMM algorithms did (GPU only)
    gemm_tuning = tf.cuda.is_available() and safe(tf.cuda.gemm_tuning) or nil,
    host = tf.sysinfo(),
    script = script,
    script_sha256 = script_sha256(tf, script),
    command = M.command(),
    argv = arg and table.move(arg, 1, #arg, 1, tf.json.array()) or nil,
    options = options,
    dist = tf.dist and tf.dist.env(), -- the run's ranks (tf.dist), when there are several or a launcher
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
-- named parts; extra may add fields: a summary, and `key` (the columns that
-- name a configuration) and `metrics` (the columns worth comparing first),
-- which `tfhost compare` reads.
-- The file is written whole or not at all: into path .. ".part", then
-- renamed over path, so that a run killed while writing (a sweep writes
-- its rows as they finish) leaves the last complete file.
local kind_of = require("tf.check").kind

function M.write(path, results, extra)
  local tf = require "tf"
  if type(path) ~= "string" or path == "" then
    error("tf.results.write: the first argument is the file to write, a path; got " .. kind_of(path), 2)
  end
  if results ~= nil and type(results) ~= "table" then
    error("tf.results.write: the second argument is the results, a list of rows (tables) or a table of named " ..
      "parts; got " .. kind_of(results), 2)
  end
  if extra ~= nil and type(extra) ~= "table" then
    error("tf.results.write: the third argument is a table of extra fields (or nothing); got " .. kind_of(extra), 2)
  end
  results = results or {}
  for i, row in ipairs(results) do
    if type(row) ~= "table" then
      error(string.format("tf.results.write: results[%d] is a %s, not a row (a table of columns)", i, type(row)), 2)
    end
  end
  writable(path, "tf.results.write")
  local is_list = results[1] ~= nil or next(results) == nil
  local doc = { env = M.env(), results = is_list and tf.json.array(results) or results }
  for k, v in pairs(extra or {}) do doc[k] = v end
  local ok, text = pcall(tf.json.encode, doc, { indent = true, nan = "null" })
  if not ok then error("tf.results.write: " .. tostring(text):gsub("^.-tf%.json%.encode: ", ""), 2) end
  local part = path .. ".part"
  writable(part, "tf.results.write")
  local f, err = io.open(part, "wb")
  if not f then error("tf.results.write: " .. err, 2) end
  f:write(text, "\n")
  f:close()
  local renamed, why = os.rename(part, path)
  if not renamed then
    os.remove(part)
    error("tf.results.write: " .. tostring(why), 2)
  end
  return doc
end

-- JSON null (what NaN was written as) back to nil, so rows read back as written.
local function strip_nulls(tf, row)
  local out = {}
  for k, v in pairs(row) do
    if v ~= tf.json.null then out[k] = v end
  end
  return out
end

--- tf.results.read(path [, opts]) -> rows, doc: the rows of a results file
-- (tfhost's, or any JSON object with a "results" list of row objects, such
-- as the PyTorch reference scripts write), and the whole document. When
-- "results" holds named parts, opts.part picks one. A file that is not such
-- a results file is an error naming the file and what is missing.
function M.read(path, opts)
  local tf = require "tf"
  if type(path) ~= "string" then error("tf.results.read: expects a file path", 2) end
  opts = require("tf.check").keys(opts, "tf.results.read", { "part" })
  local f, err = io.open(path, "r")
  if not f then error("tf.results.read: " .. err, 2) end
  local text = f:read("a")
  f:close()
  local ok, doc = pcall(tf.json.decode, text)
  if not ok then
    error("tf.results.read: " .. path .. ": not JSON (" .. tostring(doc):gsub("^.-tf%.json%.decode: ", "") .. ")", 2)
  end
  local function bad(why) error("tf.results.read: " .. path .. ": not a results file: " .. why, 3) end
  if type(doc) ~= "table" or doc[1] ~= nil then
    bad("the top level is " .. (type(doc) == "table" and "a list" or "a " .. type(doc)) ..
      ", not an object with a \"results\" list")
  end
  local results = doc.results
  if results == nil then
    local keys = {}
    for k in pairs(doc) do keys[#keys + 1] = tostring(k) end
    table.sort(keys)
    bad("no \"results\" field (it has " .. (#keys > 0 and table.concat(keys, ", ") or "nothing") .. ")")
  end
  if type(results) ~= "table" then bad("\"results\" is a " .. type(results) .. ", not a list of rows") end
  if results[1] == nil and next(results) ~= nil then
    local parts = {}
    for k in pairs(results) do parts[#parts + 1] = tostring(k) end
    table.sort(parts)
    if not opts.part then
      bad("\"results\" holds named parts (" .. table.concat(parts, ", ") .. "); opts.part picks one")
    end
    results = results[opts.part]
    if type(results) ~= "table" then
      bad("\"results\" has no part \"" .. tostring(opts.part) .. "\" (it has " .. table.concat(parts, ", ") .. ")")
    end
  end
  local rows = {}
  for i, r in ipairs(results) do
    if type(r) ~= "table" or r[1] ~= nil then
      bad(string.format("results[%d] is %s, not a row (an object of columns)", i,
        type(r) == "table" and "a list" or "a " .. type(r)))
    end
    rows[i] = strip_nulls(tf, r)
  end
  return rows, doc
end

--- Marks the start of the run for env.duration_s (the runtime calls it once).
function M._start(now_ms) started_ms = now_ms end

return M
