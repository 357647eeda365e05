--- tf: the tfhost runtime, as scripts see it (also the global `tf`).
-- The C core ("tf.core") provides tensors, ops, memory, timers and JSON;
-- this file adds the Lua half: printing, script options, benchmarking,
-- reports and results files.
local C = require "tf.core"
-- Only tf reaches the core: tracebacks then name its functions tf.<name>.
package.loaded["tf.core"] = nil
local safe = require "tf.safe"
safe.bind(C)
-- tfhost --safe's path rule, which every writer below obeys by writing through it (taken now: a
-- script that replaces tf.safe's fields later changes nothing here)
local write_file = safe.write_file
local check = require "tf.check"

local tf = {}
for name, value in pairs(C) do
  if name:sub(1, 1) ~= "_" then tf[name] = value end
end
tf._adamw_step = C._adamw_step -- for tf.optim
tf._model = C._model -- the fused engine, for tf.model
tf._prof = C._prof -- ranges and the collector, for tf.prof
tf._dist = C._dist -- ranks and collectives, for tf.dist
tf._op_table = C._op_table -- every op of the C registry, for the tests that go over them all

C._tensor_metatable.__tostring = require("tf.format").tensor

tf.cuda = {
  is_available = C.cuda_available,
  device_count = C.cuda_device_count,
  compiled = C.cuda_compiled,
  gemm_tuning = C.cuda_gemm_tuning,
}
do -- kernels compiled at run time (lua/tf/cuda.lua, host/bind/l_rtc.c)
  local rtc = require "tf.cuda"
  rtc.bind(tf, C._rtc)
  for _, name in ipairs { "compile", "compile_file", "graph", "nvrtc_version", "context_lost", "cache_dir", "tensor_map",
                         "tensor_map_plan" } do
    tf.cuda[name] = rtc[name]
  end
end

-- differentiable ops written in Lua, gradcheck (lua/tf/autograd.lua, host/bind/l_function.c)
do
  local autograd = require("tf.autograd").bind(tf, C)
  tf.autograd = { Function = autograd.Function, gradcheck = autograd.gradcheck }
end

local json = C.json
--- Reads and decodes a JSON file.
function json.read(path)
  check.arg(path, "tf.json.read", "the path", "string")
  local f, err = io.open(path, "r")
  if not f then error("tf.json.read: " .. err, 2) end
  local text, rerr = f:read("a")
  f:close()
  if not text then error("tf.json.read: " .. path .. ": " .. tostring(rerr or "cannot be read (a directory?)"), 2) end
  return json.decode(text)
end
--- Encodes value and writes it to path (options as tf.json.encode).
function json.write(path, value, opts)
  check.arg(path, "tf.json.write", "the path", "string")
  local text = json.encode(value, opts or { indent = true })
  write_file(path, "tf.json.write", text, "\n")
end
--- Marks a table to be written as a JSON array even when empty.
function json.array(t)
  check.arg(t, "tf.json.array", "the argument", "table", true)
  return setmetatable(t or {}, { __jsontype = "array" })
end
tf.json = json

--- Runs fn with a scope open and closes it however fn ends; without fn,
-- returns the scope for `local _ <close> = ...`.
local function scoped(fname, scope, fn, ...)
  check.arg(fn, fname, "fn", "function", true)
  if fn == nil then return scope end
  local _ <close> = scope
  return fn(...)
end

--- tf.mem.scope(tag [, what] [, fn, ...]): allocations inside are tagged tag (and named what);
-- with fn, runs fn inside and returns its results.
local mem_scope = C.mem.scope
function tf.mem.scope(tag, what, fn, ...)
  if type(tag) ~= "string" then error("tf.mem.scope: the tag must be a string, got " .. type(tag), 2) end
  if what ~= nil and type(what) ~= "string" and type(what) ~= "number" then
    error("tf.mem.scope: what (the second argument) must be a string or nil, got " .. type(what), 2)
  end
  if fn ~= nil and type(fn) ~= "function" then
    error("tf.mem.scope: the third argument must be a function (or nothing), got " .. type(fn), 2)
  end
  -- scoped()'s body written out: a tail call to it would leave this function out of fn's traceback
  local scope = mem_scope(tag, what)
  if fn == nil then return scope end
  local _ <close> = scope
  return fn(...)
end

--- tf.cuda.traffic(fn [, device]): what the engine's memory-bound kernels move while fn runs,
-- { [kernel name] = { calls = n, bytes = b } } (docs/api.md). The count is turned off however fn
-- ends; calls do not nest.
function tf.cuda.traffic(fn, device)
  if type(fn) ~= "function" then error("tf.cuda.traffic: function expected, got " .. type(fn), 2) end
  local count = C._cuda_traffic_start(device)
  do
    local _ <close> = count
    fn()
  end
  return C._cuda_traffic_counted(count)
end

--- tf.no_grad([fn]): ops record no autograd history inside.
function tf.no_grad(fn, ...) return scoped("tf.no_grad", C._grad_scope(false), fn, ...) end
--- tf.enable_grad([fn]): turns recording back on inside a no_grad region.
function tf.enable_grad(fn, ...) return scoped("tf.enable_grad", C._grad_scope(true), fn, ...) end
--- tf.autocast(dtype [, fn]): mixed precision ("bf16" or "f16"; nil disables it inside).
function tf.autocast(dtype, fn, ...) return scoped("tf.autocast", C._autocast_scope(dtype), fn, ...) end

--- tf.causal_mask(n [, m] [, opts]): the (n, m) bool mask that is true where
-- query i may attend to key j (j <= i), on opts.device.
function tf.causal_mask(n, m, opts)
  if type(m) == "table" then m, opts = nil, m end
  check.keys(opts, "tf.causal_mask", { "device" })
  check.arg(n, "tf.causal_mask", "n (the number of queries)", "integer")
  check.arg(m, "tf.causal_mask", "m (the number of keys)", "integer", true)
  m = m or n
  local device = { device = opts and opts.device }
  return tf.ge(tf.arange(n, device):unsqueeze(1), tf.arange(m, device):unsqueeze(0))
end

--- tf.mem.dump(path [, snapshot]): writes a snapshot (default: the default
-- device's, now) as a PyTorch-format .pickle (pytorch.org/memory_viz opens
-- it) or as .json, by the file's extension.
function tf.mem.dump(path, snap)
  if type(path) ~= "string" then error("tf.mem.dump: expected a file path", 2) end
  local memviz = require "tf.memviz"
  snap = snap or tf.mem.snapshot()
  local text
  if path:match("%.pickle$") or path:match("%.pkl$") then
    text = memviz.pickle(snap)
  elseif path:match("%.json$") then
    text = memviz.json(snap)
  else
    error("tf.mem.dump: " .. path .. ": the name must end in .pickle, .pkl or .json", 2)
  end
  write_file(path, "tf.mem.dump", text)
  return path
end
--- tf.mem.plot(path [, opts]): the active memory timeline as a self-contained
-- HTML page; opts.snapshot (default: taken now) and opts.title.
function tf.mem.plot(path, opts)
  if type(path) ~= "string" then error("tf.mem.plot: expected a file path", 2) end
  opts = check.keys(opts, "tf.mem.plot", { "snapshot", "title", "x", "max_bands", "max_points" })
  local html = require("tf.memviz").html(opts.snapshot or tf.mem.snapshot(), opts)
  write_file(path, "tf.mem.plot", html)
  return path
end
--- tf.mem.is_oom(err): whether an error (message) is an out-of-memory error,
-- for scripts that pcall and record OOM rows: "out of memory" starts the
-- message, after the position ("run.lua:12: out of memory: ...").
function tf.mem.is_oom(err)
  local s = tostring(err)
  return s:find("^out of memory") ~= nil or s:find("^[^\n]-:%d+: out of memory") ~= nil
end
--- tf.mem.summary(snapshot): bytes live per tag at the recorded peak.
function tf.mem.summary(snap) return require("tf.memviz").summary(snap or tf.mem.snapshot()) end

tf.nn = require "tf.nn"
tf.optim = require "tf.optim"
tf.amp = require "tf.amp"
tf.dist = require "tf.dist"
tf.model = require "tf.model"
tf.prof = require "tf.prof"
do -- token datasets (lua/tf/data.lua, host/bind/l_data.c)
  local data = require("tf.data").bind(C._data)
  local bytes = require "tf.data_bytes"
  tf.data = { tokens = data.tokens, files = data.files, TokenDataset = data.TokenDataset,
    make_bytes = bytes.make_bytes, python_library = bytes.python_library }
end
tf.checkpoint = require "tf.checkpoint" -- training states (lua/tf/checkpoint.lua)
tf.range = tf.prof.range
--- tf.optim.adamw(model, opts): the model's own AdamW (fused over all
-- parameters in the C engine), torch.optim.AdamW's semantics and defaults.
function tf.optim.adamw(model, opts)
  if type(model) ~= "table" or type(model.optimizer) ~= "function" then
    error("tf.optim.adamw: the first argument must be a tf.model (for modules use tf.optim.AdamW), not " ..
      check.what_is(model), 2)
  end
  return model:optimizer(opts or {})
end
tf.options = require("tf.options").declare
local bench = require "tf.bench"
--- tf.bench(fn, opts) times fn; tf.bench.backward times backward passes alone; tf.bench.copy_rate()
--- measures the device's copy rate (GB/s).
tf.bench = setmetatable({ backward = bench.backward, summarize = bench.summarize, copy_rate = bench.copy_rate },
  { __call = function(_, ...) return bench.bench(...) end })
tf.report = require "tf.report"
tf.results = require "tf.results"
tf.results._start(tf.now())
tf.units = require "tf.units"
tf.plot = require "tf.plot"
tf.ceilings = { get = require("tf.ceilings").get } -- the device's measured rates (lua/tf/ceilings.lua)
tf.roofline = require "tf.roofline"               -- counted kernels against them (lua/tf/roofline.lua)
tf.safe_run = safe.run
--- tf.help([x]) (also the global help): namespaces, or one function's signature and summary.
tf.help = require("tf.help").help
if rawget(_G, "help") == nil then rawset(_G, "help", tf.help) end

return tf
