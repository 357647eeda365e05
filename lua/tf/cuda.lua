--- tf.cuda.compile: CUDA C++ compiled at run time from a script (NVRTC), its kernels launched on
-- tensors. This half reads the options, places the source at the script's lines, keeps the cache
-- (in memory and on disk) and reads the kernels' declarations; the C half (host/bind/l_rtc.c)
-- compiles, loads and launches. docs/kernels.md is the user's guide.
--
--   local mod = tf.cuda.compile([[
--     extern "C" __global__ void scale(float *x, float a, int n) {
--       int i = blockIdx.x * blockDim.x + threadIdx.x;
--       if (i < n) x[i] *= a;
--     }]])
--   mod:kernel("scale"):launch({grid = (n + 255) // 256, block = 256}, x, 2.0, n)
local check = require "tf.check"
local decl = require "tf.cuda_decl"

local M = {}

local tf_ref -- the tf table, bound by tf/init.lua
local R      -- tf._rtc
-- captured now: under --safe the script's io and debug are replaced, the cache's are not
local io_open, os_rename, os_remove, getinfo, getenv = io.open, os.rename, os.remove, debug.getinfo, os.getenv

--- bind(tf): takes the tf table and the C half (tf/init.lua calls it once).
function M.bind(tf, rtc)
  tf_ref, R = tf, rtc
end

M.CACHE_FORMAT = 1

-- ---- where a source comes from ------------------------------------------------------------------

-- The text of each script file read so far, by path.
local file_texts = {}

local function file_text(path)
  local t = file_texts[path]
  if t == nil then
    local f = io_open(path, "rb")
    t = f and f:read("a") or false
    if f then f:close() end
    file_texts[path] = t
  end
  return t or nil
end

-- The Lua caller outside tfhost's modules: its file (nil when it is not a file) and line.
local function caller()
  for level = 3, 30 do
    local info = getinfo(level, "Sl")
    if not info then break end
    local src = info.source
    if src:sub(1, 1) == "@" and not src:find("^@lua/tf/") then return src:sub(2), info.currentline end
    if src:sub(1, 1) ~= "@" then return nil, info.currentline, info.short_src end
  end
  return nil, 0
end

-- Where the source text sits: {file, line} of its first line. A long string of the script is found
-- in the script's own text; a source made at run time is named after the line that compiled it.
local function locate(source, opts)
  if opts.file then return opts.file, opts.line or 1 end
  local file, line, short = caller()
  if file then
    local text = file_text(file)
    local at = text and text:find(source, 1, true)
    if at and not text:find(source, at + 1, true) then
      return file, select(2, text:sub(1, at):gsub("\n", "")) + 1, file
    end
    return string.format("%s:%d (the source given to tf.cuda.compile)", file, line), 1, file
  end
  return string.format("%s:%d (the source given to tf.cuda.compile)", short or "?", line), 1, nil
end

-- ---- options ---------------------------------------------------------------------------------------

local OPTIONS = { "target", "defines", "include", "std", "lineinfo", "debug", "fast_math", "instantiate",
  "options", "device", "cache", "cache_dir", "file", "line", "quiet" }

local function default_device()
  local d = tf_ref.default_device()
  if d:find("^cuda") then return d end
  return "cuda:0"
end

-- The device's target: sm_90a on compute capability 9.0 (wgmma and TMA), sm_XY elsewhere; without a
-- GPU, sm_90a (the H100/H200 this build is for).
local facts = {} -- device -> {target, driver}, asked once a process

local function device_facts(device)
  local f = facts[device]
  if f then return f end
  if not tf_ref.cuda.is_available() then
    f = { target = "sm_90a", driver = "none" }
  else
    local major, minor, driver = R.device(device)
    f = { target = "sm_" .. major .. minor .. (major >= 9 and "a" or ""), driver = tostring(driver) }
  end
  facts[device] = f
  return f
end

local function device_target(device) return device_facts(device).target end

local function list_of(v, what, fname)
  if v == nil then return {} end
  if type(v) == "string" then return { v } end
  if type(v) ~= "table" then error(string.format("%s: %s must be a list of strings, not %s", fname, what, type(v)), 3) end
  for i, s in ipairs(v) do
    if type(s) ~= "string" then error(string.format("%s: %s[%d] must be a string, not %s", fname, what, i, type(s)), 3) end
  end
  return v
end

-- The NVRTC options for opts, in a fixed order (the cache key depends on them).
local function nvrtc_options(opts, target, script_dir, fname)
  local o = { "--gpu-architecture=" .. target, "--std=" .. (opts.std or "c++17") }
  if opts.lineinfo ~= false then o[#o + 1] = "--generate-line-info" end
  if opts.debug then o[#o + 1] = "--device-debug" end
  if opts.fast_math then o[#o + 1] = "--use_fast_math" end
  local defines = opts.defines or {}
  if type(defines) ~= "table" then error(fname .. ": defines must be a table ({NAME = value} or {\"NAME\"})", 3) end
  local names = {}
  for k, v in pairs(defines) do
    if type(k) == "number" then
      if type(v) ~= "string" then error(fname .. ": defines[" .. k .. "] must be a name", 3) end
      names[#names + 1] = v
    else
      if type(v) ~= "string" and type(v) ~= "number" and type(v) ~= "boolean" then
        error(fname .. ": defines." .. tostring(k) .. " must be a string, a number or a boolean", 3)
      end
      names[#names + 1] = k .. "=" .. (v == true and "1" or v == false and "0" or tostring(v))
    end
  end
  table.sort(names)
  for _, d in ipairs(names) do o[#o + 1] = "-D" .. d end
  for _, dir in ipairs(list_of(opts.include, "include", fname)) do
    if script_dir and dir:sub(1, 1) ~= "/" then
      local there = script_dir .. "/" .. dir
      local f = io_open(there, "r")
      if f then f:close(); dir = there end
    end
    o[#o + 1] = "-I" .. dir
  end
  -- CUDA's own headers: the toolkit's found at build time, then the usual place
  for _, dir in ipairs { R.cuda_include, "/usr/local/cuda/include" } do
    o[#o + 1] = "-I" .. dir
    o[#o + 1] = "-I" .. dir .. "/cccl"
  end
  for _, extra in ipairs(list_of(opts.options, "options", fname)) do o[#o + 1] = extra end
  return o
end

-- ---- the cache --------------------------------------------------------------------------------------

local memory_cache = {} -- key -> {code, cubin, lowered, log}
local parsed = setmetatable({}, { __mode = "v" }) -- source -> its kernels' declarations, while a module has them
local notes_given = {}

local function note(text)
  if notes_given[text] then return end
  notes_given[text] = true
  io.stderr:write("tf.cuda: ", text, "\n")
end

--- user_cache(sub) -> the folder sub of tfhost's per-user cache: $XDG_CACHE_HOME/tfhost/sub, else
-- ~/.cache/tfhost/sub (nil without either variable). The kernel cache and tf.ceilings' cache
-- (lua/tf/ceilings.lua) both live there.
function M.user_cache(sub)
  local xdg = getenv("XDG_CACHE_HOME")
  if xdg and xdg ~= "" then return xdg .. "/tfhost/" .. sub end
  local home = getenv("HOME")
  return home and home ~= "" and home .. "/.cache/tfhost/" .. sub or nil
end

--- The folder of the disk cache: TFHOST_KERNEL_CACHE, else $XDG_CACHE_HOME/tfhost/kernels, else
-- ~/.cache/tfhost/kernels. TFHOST_KERNEL_CACHE=none turns the disk cache off.
function M.cache_dir()
  local env = getenv("TFHOST_KERNEL_CACHE")
  if env and env ~= "" then return env ~= "none" and env or nil end
  return M.user_cache("kernels")
end

local MAGIC = "tfhost kernel cache "

local function cache_read(dir, key)
  local path = dir .. "/" .. key .. ".bin"
  local f = io_open(path, "rb")
  if not f then return nil end
  local data = f:read("a")
  f:close()
  local head, meta_len = data:match("^(" .. MAGIC .. "%d+)\n(%d+)\n")
  local entry
  if head and head == MAGIC .. M.CACHE_FORMAT then
    local start = #head + #meta_len + 3
    local ok, meta = pcall(tf_ref.json.decode, data:sub(start, start + tonumber(meta_len) - 1))
    local code = data:sub(start + tonumber(meta_len))
    if ok and type(meta) == "table" and meta.key == key and meta.size == #code and tf_ref.sha256(code) == meta.sha256 then
      entry = { code = code, cubin = meta.cubin, lowered = meta.lowered, log = meta.log or "" }
    end
  end
  if not entry then
    note("the cache entry " .. path .. " is damaged or of another format: compiling again and replacing it")
  end
  return entry
end

local function cache_write(dir, key, entry)
  local ok, err = pcall(tf_ref.mkdir, dir)
  if not ok then
    note("the kernel cache folder " .. dir .. " cannot be made (" .. tostring(err) .. "): compiled kernels are not " ..
      "kept for the next run")
    return
  end
  local meta = tf_ref.json.encode({ key = key, cubin = entry.cubin, lowered = entry.lowered, log = entry.log,
    size = #entry.code, sha256 = tf_ref.sha256(entry.code), format = M.CACHE_FORMAT })
  local path = dir .. "/" .. key .. ".bin"
  local tmp = string.format("%s.%d.tmp", path, math.random(1, 1 << 30))
  local f, why = io_open(tmp, "wb")
  local written = f and f:write(MAGIC, M.CACHE_FORMAT, "\n", #meta, "\n", meta, entry.code)
  local closed = f and f:close()
  if not (written and closed and os_rename(tmp, path)) then
    if f then os_remove(tmp) end
    note("the kernel cache at " .. dir .. " cannot be written (" .. tostring(why or "the disk may be full") ..
      "): compiled kernels are not kept for the next run")
  end
end

-- ---- modules and kernels ---------------------------------------------------------------------------

local Module = {}
Module.__index = Module

--- The device headers every source may include by name: <tfhost.cuh> (kernels/cuda/rtc/, embedded
-- in the binary at build time, so a copied tfhost needs no files beside it).
M.headers = require "tf.cuda_headers"

-- Compiles (or finds in a cache) source with opts' options and the name expressions exprs.
-- Returns the entry {code, cubin, lowered, log, cached, ms}.
local header_digest -- of every device header, in the order of their names (pairs' order differs between processes)
local function headers_key()
  if not header_digest then
    local names, parts = {}, {}
    for name in pairs(M.headers) do names[#names + 1] = name end
    table.sort(names)
    for _, name in ipairs(names) do parts[#parts + 1] = name .. "\0" .. tf_ref.sha256(M.headers[name]) end
    header_digest = tf_ref.sha256(table.concat(parts, "\0"))
  end
  return header_digest
end

local function build(unit, exprs)
  local key_parts = { "tfhost-rtc", M.CACHE_FORMAT, unit.nvrtc, unit.driver, unit.text }
  for _, o in ipairs(unit.options) do key_parts[#key_parts + 1] = o end
  key_parts[#key_parts + 1] = headers_key()
  for _, e in ipairs(exprs) do key_parts[#key_parts + 1] = "expr:" .. e end
  local key = tf_ref.sha256(table.concat(key_parts, "\0"))
  local t0 = tf_ref.now()
  local entry = not unit.uncached and memory_cache[key] or nil
  local from = entry and "memory"
  if not entry and unit.cache_dir then
    entry = cache_read(unit.cache_dir, key)
    from = entry and "disk"
  end
  if not entry then
    local names, texts = {}, {}
    for name, text in pairs(M.headers) do names[#names + 1], texts[#texts + 1] = name, text end
    local r = R.compile(unit.text, unit.file, unit.options, names, texts, exprs)
    if not r.ok then
      local log = r.log:gsub("([^\n]-)%((%d+)%): ", "%1:%2: ")
      local first = log:match("[^\n]*:%d+: [^\n]*error[^\n]*") or log:match("[^\n]+") or "no log"
      local where = first:match("^(.-:%d+): ")
      local s, e = log:find(first, 1, true)
      local rest = s and log:sub(1, s - 1) .. log:sub(e + 2) or log
      local msg = string.format("tf.cuda.compile: %s\n%s", where and first:sub(#where + 3) or first, rest)
      error(where and (where .. ": " .. msg) or msg, 0)
    end
    entry = { code = r.code, cubin = r.cubin, lowered = r.lowered, log = r.log }
    from = nil
  end
  -- the disk cache holds what this process compiled, whichever folder a compile names
  entry.on_disk = entry.on_disk or {}
  if from == "disk" then entry.on_disk[unit.cache_dir] = true end
  if unit.cache_dir and not entry.on_disk[unit.cache_dir] then
    cache_write(unit.cache_dir, key, entry)
    entry.on_disk[unit.cache_dir] = true
  end
  if not unit.uncached then memory_cache[key] = entry end
  return { code = entry.code, cubin = entry.cubin, lowered = entry.lowered, log = entry.log, cached = from,
    ms = tf_ref.now() - t0 }
end

--- tf.cuda.compile(source [, opts]) -> module. opts: target ("sm_90a"; default the device's),
-- defines ({NAME = value} or {"NAME"}), include (folders, relative to the script's folder), std
-- ("c++17"), lineinfo (true), debug (false: -G), fast_math (false), instantiate (template names
-- compiled now: {"row_softmax<256, float>"}), options (more NVRTC options), device, cache (true),
-- cache_dir, file and line (where the source's first line is, for messages; found by itself for a
-- long string of the script), quiet (no warnings printed).
function M.compile(source, opts)
  local fname = "tf.cuda.compile"
  check.arg(source, fname, "the source", "string")
  opts = check.keys(opts, fname, OPTIONS, { arch = "target", defs = "defines", includes = "include",
    instantiations = "instantiate", templates = "instantiate", name_expressions = "instantiate" })
  if not R.built then
    error(fname .. ": this tfhost was built without the CUDA backend (no CUDA Toolkit at build time), so it " ..
      "cannot compile kernels", 2)
  end
  R.allowed(fname) -- --safe without --allow-kernels refuses here, before either cache is read
  for _, flag in ipairs { "lineinfo", "debug", "fast_math", "cache", "quiet" } do
    if opts[flag] ~= nil and type(opts[flag]) ~= "boolean" then
      error(string.format("%s: %s must be true or false, not %s", fname, flag, type(opts[flag])), 2)
    end
  end
  local device = opts.device and tf_ref.device(opts.device):match("^%S+") or default_device()
  if not device:find("^cuda") then error(fname .. ": kernels run on a CUDA device, not " .. device, 2) end
  local target = opts.target or device_target(device)
  if type(target) ~= "string" or not (target:match("^sm_%d+a?$") or target:match("^compute_%d+a?$")) then
    error(fname .. ": target must be like \"sm_90a\", \"sm_80\" or \"compute_90\", not " .. tostring(target), 2)
  end
  local file, line, script = locate(source, opts)
  local script_dir = script and (script:match("^(.*)/[^/]*$") or ".")
  local text = string.format("#line %d \"%s\"\n%s", line, file, source)
  local nvrtc_major, nvrtc_minor = R.version()
  local unit = {
    text = text, file = file, options = nvrtc_options(opts, target, script_dir, fname),
    nvrtc = nvrtc_major .. "." .. nvrtc_minor,
    driver = device_facts(device).driver,
    cache_dir = opts.cache ~= false and (opts.cache_dir or M.cache_dir()) or nil,
    uncached = opts.cache == false, -- neither cache is read or written: a cold compile
  }
  if opts.cache_dir then
    check.arg(opts.cache_dir, fname, "cache_dir", "string")
    require("tf.safe").writable(opts.cache_dir, fname)
  end
  local kernels = parsed[source] or decl.parse(source)
  parsed[source] = kernels
  -- every plain kernel now, and the instantiations asked for
  local exprs = {}
  local names = {}
  for name, k in pairs(kernels) do
    if not k.template then names[#names + 1] = name end
  end
  table.sort(names)
  for _, n in ipairs(names) do exprs[#exprs + 1] = n end
  for _, e in ipairs(list_of(opts.instantiate, "instantiate", fname)) do
    local k, why = decl.instance(kernels, e)
    if not k then error(fname .. ": instantiate: " .. e .. ": " .. why, 2) end
    exprs[#exprs + 1] = e
  end
  local built = build(unit, exprs)
  local mod = setmetatable({
    source = source, file = file, line = line, target = target, device = device, options = unit.options,
    log = built.log, cached = built.cached, compile_ms = built.ms, cubin = built.cubin, code = built.code,
    _unit = unit, _decls = kernels, _builds = {}, _kernels = {}, _quiet = opts.quiet,
  }, Module)
  for i, e in ipairs(exprs) do mod._builds[e] = { entry = built, lowered = built.lowered[i] } end
  if built.log:find("%S") and not opts.quiet and not built.cached then
    io.stderr:write((built.log:gsub("([^\n]-)%((%d+)%): ", "%1:%2: ")))
  end
  return mod
end

--- tf.cuda.compile_file(path [, opts]): the source of a .cu file (its messages name the file).
function M.compile_file(path, opts)
  check.arg(path, "tf.cuda.compile_file", "the path", "string")
  local f, err = io.open(path, "rb")
  if not f then
    local file = caller()
    local near = file and (file:match("^(.*)/[^/]*$") or ".") .. "/" .. path
    f = near and path:sub(1, 1) ~= "/" and io.open(near, "rb")
    if not f then error("tf.cuda.compile_file: " .. err, 2) end
    path = near
  end
  local source = f:read("a")
  f:close()
  opts = opts and check.keys(opts, "tf.cuda.compile_file", OPTIONS) or {}
  local o = {}
  for k, v in pairs(opts) do o[k] = v end
  o.file, o.line = o.file or path, o.line or 1
  local include = list_of(o.include, "include", "tf.cuda.compile_file")
  include = { table.unpack(include) }
  include[#include + 1] = path:match("^(.*)/[^/]*$") or "."
  o.include = include
  return M.compile(source, o)
end

-- The build that holds expr, compiled now if the module has not got it yet (a template instantiated
-- on first use, cached as any compile).
function Module:_build(expr)
  local b = self._builds[expr]
  if b then return b end
  local built = build(self._unit, { expr })
  b = { entry = built, lowered = built.lowered[1] }
  self._builds[expr] = b
  self.compile_ms = self.compile_ms + built.ms
  return b
end

--- mod:instantiate{"name<args>", ...}: compiles, in one compile, the instantiations the module has not
-- got yet (mod:kernel compiles one it lacks on its own; several at once share the compile's fixed
-- cost). Returns the module.
function Module:instantiate(exprs)
  local missing = {}
  for _, e in ipairs(list_of(exprs, "the instantiations", "mod:instantiate")) do
    if not self._builds[e] then
      local k, why = decl.instance(self._decls, e)
      if not k then error("mod:instantiate: " .. e .. ": " .. why, 2) end
      missing[#missing + 1] = e
    end
  end
  if #missing == 0 then return self end
  local built = build(self._unit, missing)
  for i, e in ipairs(missing) do self._builds[e] = { entry = built, lowered = built.lowered[i] } end
  self.compile_ms = self.compile_ms + built.ms
  return self
end

local kernel_classes = {} -- the function names of every user kernel, for tf.prof's classes
M.kernel_classes = kernel_classes

--- mod:kernel(name [, opts]) -> kernel. name: a kernel's name, or a template's instantiation
-- ("row_softmax<256, float>"); opts: params (the parameter types, when the declaration cannot be
-- read: {"const float *", "int"}), class (its class in tf.prof's tables: "user" by default).
function Module:kernel(name, opts)
  check.arg(name, "mod:kernel", "the kernel's name", "string")
  opts = check.keys(opts, "mod:kernel", { "params", "class" })
  local cached = self._kernels[name]
  if cached and not opts.params then return cached end
  local base = name:match("^%s*([%w_:]+)") or name
  local params
  if opts.params then
    params = {}
    for i, t in ipairs(list_of(opts.params, "params", "mod:kernel")) do
      local spec, why = decl.param(t, "arg" .. i)
      if not spec then error("mod:kernel: params[" .. i .. "]: " .. why, 2) end
      params[i] = spec
    end
  else
    local k, p = decl.instance(self._decls, name)
    if not k then
      local known = {}
      for n, kk in pairs(self._decls) do known[#known + 1] = kk.template and (n .. "<...>") or n end
      table.sort(known)
      error(string.format("mod:kernel: %s: %s (the module has: %s)", name, p,
        #known > 0 and table.concat(known, ", ") or "no __global__ function"), 2)
    end
    params = p
  end
  if not tf_ref.cuda.is_available() then
    error("mod:kernel: " .. name .. " was compiled (" .. self.target .. ") but cannot be loaded: this machine has no " ..
      "CUDA device", 2)
  end
  local b = self:_build(name)
  local entry = b.entry
  entry.libs = entry.libs or {}
  local lib = entry.libs[self.device]
  if not lib then
    lib = R.load(entry.code, self.device)
    entry.libs[self.device] = lib
  end
  -- a list read from the source has the count the code has; one the script declared is checked for more
  local kern = lib:kernel(b.lowered, name, params, opts.params ~= nil)
  kernel_classes[base] = opts.class or "user"
  if not opts.params then self._kernels[name] = kern end
  return kern
end

function Module:__tostring()
  return string.format("tf.CudaModule(%s, %s, %s)", self.file, self.target,
    self.cached and "from the " .. self.cached .. " cache" or string.format("compiled in %.0f ms", self.compile_ms))
end

--- mod:kernels() -> the names of the module's __global__ functions (templates as name<...>).
function Module:kernels()
  local out = {}
  for n, k in pairs(self._decls) do out[#out + 1] = k.template and (n .. "<...>") or n end
  table.sort(out)
  return out
end

--- tf.cuda.graph(fn [, device]) -> graph: fn's GPU work (a script's kernels, tfhost's ops on tensors
-- made before) captured once as a CUDA graph, not run; graph:replay() queues it again, with one launch
-- for the whole of it. Inside fn no tensor may be made, read back or copied to the host.
function M.graph(fn, device)
  check.arg(fn, "tf.cuda.graph", "fn", "function")
  local dev = device and tf_ref.device(device):match("^%S+") or default_device()
  return R.capture(fn, dev)
end

--- tf.cuda.nvrtc_version() -> "13.0"
-- ---- tensor maps (TMA) ----------------------------------------------------------------------------

local MAP_ELEMENT_BYTES = { f32 = 4, f16 = 2, bf16 = 2, f64 = 8, i32 = 4, i64 = 8, bool = 1, f8e4m3 = 1, f8e5m2 = 1 }
local SWIZZLE = { none = 0, ["32B"] = 32, ["64B"] = 64, ["128B"] = 128 }
local L2_PROMOTION = { none = 0, ["64B"] = 64, ["128B"] = 128, ["256B"] = 256 }

local function keys_of(t)
  local out = {}
  for k in pairs(t) do out[#out + 1] = k end
  table.sort(out, function(a, b) return (t[a] or 0) < (t[b] or 0) end)
  return table.concat(out, ", ")
end

--- tensor_map_plan(shape, strides, dtype, opts) -> the encoder's spec (innermost first), or an
-- error naming the rule broken. shape and strides are the tensor's (outermost first, strides in
-- elements); opts as tf.cuda.tensor_map's. Needs no GPU.
function M.tensor_map_plan(shape, strides, dtype, opts)
  local fname = "tf.cuda.tensor_map"
  if type(opts) ~= "table" then error(fname .. ": options {box = {...}, ...} are needed", 3) end
  check.keys(opts, fname, { "box", "swizzle", "l2_promotion", "oob", "element_strides" })
  local es = MAP_ELEMENT_BYTES[dtype]
  if not es then error(string.format("%s: a tensor of %s cannot be mapped (have %s)", fname, tostring(dtype),
    "f32, f16, bf16, f64, i32, i64, bool, f8e4m3, f8e5m2"), 3) end
  local rank = #shape
  if rank < 1 or rank > 5 then error(string.format("%s: the tensor has %d dimensions (1 to 5)", fname, rank), 3) end
  local box = opts.box
  if type(box) ~= "table" or #box ~= rank then
    error(string.format("%s: box must list %d sizes, outermost first as the tensor's shape", fname, rank), 3)
  end
  local estr = opts.element_strides or {}
  if type(estr) ~= "table" or (opts.element_strides and #estr ~= rank) then
    error(string.format("%s: element_strides must list %d steps, outermost first", fname, rank), 3)
  end
  local swizzle = SWIZZLE[opts.swizzle or "none"]
  if not swizzle then
    error(string.format("%s: swizzle '%s' (have %s)", fname, tostring(opts.swizzle), keys_of(SWIZZLE)), 3)
  end
  local l2 = L2_PROMOTION[opts.l2_promotion or "none"]
  if not l2 then
    error(string.format("%s: l2_promotion '%s' (have %s)", fname, tostring(opts.l2_promotion),
      keys_of(L2_PROMOTION)), 3)
  end
  local oob = opts.oob or "zero"
  if oob ~= "zero" and oob ~= "nan" then error(fname .. ": oob must be \"zero\" or \"nan\"", 3) end
  if oob == "nan" and not (dtype == "f32" or dtype == "f16" or dtype == "bf16" or dtype == "f64") then
    error(fname .. ": oob = \"nan\" needs a floating-point tensor", 3)
  end
  if strides[rank] ~= 1 then
    error(string.format("%s: the innermost dimension must be contiguous (its stride is %d elements; map a "
      .. ":contiguous() copy)", fname, strides[rank]), 3)
  end
  local spec = { rank = rank, dims = {}, strides = {}, box = {}, element_strides = {}, swizzle = swizzle,
    l2_promotion = l2, oob_nan = oob == "nan" }
  local bytes = es
  for i = 1, rank do
    local d = rank - i + 1 -- the tensor's dimension of the map's i-th (innermost first)
    local b = box[d]
    if math.type(b) ~= "integer" or b < 1 or b > 256 then
      error(string.format("%s: box[%d] = %s: each box size is 1 to 256 elements", fname, d, tostring(b)), 3)
    end
    local e = estr[d] or 1
    if math.type(e) ~= "integer" or e < 1 or e > 8 then
      error(string.format("%s: element_strides[%d] = %s: each step is 1 to 8", fname, d, tostring(e)), 3)
    end
    if shape[d] < 1 or shape[d] > (1 << 32) then
      error(string.format("%s: dimension %d has %d elements (1 to 2^32)", fname, d, shape[d]), 3)
    end
    spec.dims[i], spec.box[i], spec.element_strides[i] = shape[d], b, e
    if i > 1 then
      local sb = strides[d] * es
      if sb % 16 ~= 0 or sb <= 0 or sb >= (1 << 40) then
        error(string.format("%s: dimension %d's stride is %d bytes: the driver needs a positive multiple of 16 "
          .. "below 2^40 (pad the rows, or map a copy)", fname, d, sb), 3)
      end
      spec.strides[i - 1] = sb
    end
    bytes = bytes * b
  end
  local inner = box[rank] * es
  if inner % 16 ~= 0 then
    error(string.format("%s: the innermost box is %d bytes (box[%d] = %d of %d-byte elements): it must be a "
      .. "multiple of 16", fname, inner, rank, box[rank], es), 3)
  end
  if swizzle > 0 and inner > swizzle then
    error(string.format("%s: with swizzle %s the innermost box is at most %d bytes, not %d", fname, opts.swizzle,
      swizzle, inner), 3)
  end
  spec.bytes = bytes
  local sizes, dims = {}, {}
  for i = 1, rank do sizes[i], dims[i] = tostring(box[i]), tostring(shape[i]) end
  spec.text = string.format("%s box %s of %s, %d bytes, swizzle %s", dtype, table.concat(sizes, "x"),
    table.concat(dims, "x"), bytes, opts.swizzle or "none")
  return spec
end

--- tf.cuda.tensor_map(t, {box = {...}, swizzle, l2_promotion, oob, element_strides}) -> map, bytes:
-- a TMA tensor map (CUtensorMap, cuTensorMapEncodeTiled) of GPU tensor t, passed to a kernel
-- parameter declared const __grid_constant__ tf::tensor_map (or CUtensorMap); bytes is one box's
-- size, what mbar_arrive_expect_tx announces. The map keeps t alive; freeing t makes later launches
-- with the map an error.
function M.tensor_map(t, opts)
  if type(t) ~= "userdata" or not t.shape then error("tf.cuda.tensor_map: expects a tensor, then options", 2) end
  local shape = t.shape
  local strides = t:stride()
  local spec = M.tensor_map_plan(shape, strides, t.dtype, opts)
  local map = R.tensor_map(t, spec)
  return map, spec.bytes
end

function M.nvrtc_version()
  local major, minor = R.version()
  return major .. "." .. minor
end

--- tf.cuda.context_lost() -> why, or nil while the CUDA context works.
function M.context_lost() return R.context_lost() end

return M
