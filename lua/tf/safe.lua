--- tfhost --safe: the sandbox's policy. enter() runs once, after the
-- runtime is open and before any of the script's code: it refuses what
-- starts processes, loads native code or leaves the allowed folders, and
-- routes every file name through one check (tf._safe_check in C, which
-- follows links). docs/safe.md has the table of what is allowed.
-- tf.safe_run runs a script the same way in a new tfhost process.
local M = {}

local check, spawn -- the core's _safe_check and _safe_spawn, bound once by tf/init.lua

--- bind(core): takes the C side's functions (once; later calls change nothing).
function M.bind(core)
  if check then return end
  check, spawn = core._safe_check, core._safe_spawn
end

--- writable(path, who): raises under --safe when who may not write path
-- (nothing otherwise); every tf writer calls it before opening the file.
function M.writable(path, who)
  check(path, "w", who)
end

--- write_file(path, who, ...): the strings ... as the file at path, after
-- the write check; a failure is an error naming who (the tf writer).
function M.write_file(path, who, ...)
  check(path, "w", who)
  local f, err = io.open(path, "wb")
  if not f then error(who .. ": " .. err, 3) end
  f:write(...)
  f:close()
end

--- enter(): makes this Lua state the sandbox (tfhost --safe calls it).
function M.enter()
  -- Everything the wrappers use is captured now: a script that replaces a
  -- library function later cannot change what the wrappers do.
  local check = check
  local error, type = error, type
  local sbyte, sfind = string.byte, string.find
  local real_load, real_loadfile = load, loadfile
  local io_open, io_lines, io_input, io_output = io.open, io.lines, io.input, io.output
  local os_remove, os_rename, os_setlocale = os.remove, os.rename, os.setlocale
  local searchpath, traceback = package.searchpath, debug.traceback
  local preload = package.preload

  local function refuse(name, why) error("--safe: " .. name .. " is not available (" .. why .. ")", 3) end
  local function refuser(name, why) return function() refuse(name, why) end end
  local PROCESS, NATIVE = "it starts a process", "it runs native code"

  os.execute = refuser("os.execute", PROCESS)
  io.popen = refuser("io.popen", PROCESS)
  os.exit = refuser("os.exit", "it would end tfhost without unwinding; tf.exit ends the script cleanly")
  os.tmpname = refuser("os.tmpname", "it creates a file outside the writable folder")
  io.tmpfile = refuser("io.tmpfile", "it creates a file outside the writable folder")
  package.loadlib = refuser("package.loadlib", NATIVE)
  string.dump = refuser("string.dump", "binary chunks are not loaded under --safe")
  function os.setlocale(locale, ...)
    if locale ~= nil then refuse("os.setlocale with a locale", "it changes the whole process") end
    return os_setlocale(locale, ...)
  end

  -- Only debug.traceback; anything else the debug library has is refused
  -- by name (it reads and writes locals, upvalues and metatables).
  local safe_debug = setmetatable({ traceback = traceback }, {
    __index = function(_, k) refuse("debug." .. tostring(k), "the debug library can reach past the sandbox") end,
    __newindex = function() refuse("changing the debug library", "it is read-only under --safe") end,
    __metatable = false,
  })
  debug, package.loaded.debug = safe_debug, safe_debug

  -- Files: every name goes through the check first. Lua takes a number as a
  -- file name too; anything else is not a name, and the function itself
  -- says so (or takes it as a file handle, or stdin).
  local function checked(path, mode, who)
    local t = type(path)
    if t == "string" or t == "number" then check(path, mode, who) end
  end
  function io.open(path, mode, ...)
    checked(path, mode, "io.open")
    return io_open(path, mode, ...)
  end
  function io.lines(path, ...)
    checked(path, "r", "io.lines")
    return io_lines(path, ...)
  end
  function io.input(file)
    checked(file, "r", "io.input")
    return io_input(file)
  end
  function io.output(file)
    checked(file, "w", "io.output")
    return io_output(file)
  end
  function os.remove(path)
    checked(path, "w", "os.remove")
    return os_remove(path)
  end
  function os.rename(from, to)
    checked(from, "w", "os.rename")
    checked(to, "w", "os.rename")
    return os_rename(from, to)
  end

  -- Chunks: text only, whatever mode is asked for.
  local function binary_refused(f, err)
    if not f and type(err) == "string" and sfind(err, "attempt to load a binary chunk", 1, true) then
      error("--safe: loading a binary (precompiled) chunk is not available (it can break Lua's memory safety)", 3)
    end
    return f, err
  end
  function load(chunk, name, mode, ...)
    if type(chunk) == "string" and sbyte(chunk, 1) == 27 then
      error("--safe: loading a binary (precompiled) chunk is not available (it can break Lua's memory safety)", 2)
    end
    return binary_refused(real_load(chunk, name, "t", ...))
  end
  local function text_loadfile(path, who, ...)
    checked(path, "r", who)
    return binary_refused(real_loadfile(path, "t", ...))
  end
  function loadfile(path, mode, ...) return text_loadfile(path, "loadfile", ...) end
  function dofile(path)
    local f, err = text_loadfile(path, "dofile")
    if not f then error(err, 2) end
    return f()
  end

  -- require: preloaded modules and Lua files (checked, text only); no C
  -- modules, and the fresh core that package.preload could make is gone.
  preload["tf.core"] = nil
  package.cpath = ""
  local function lua_searcher(name)
    local path, err = searchpath(name, package.path)
    if not path then return err .. "\n\t--safe: C modules are not searched (no native code)" end
    checked(path, "r", "require")
    local f, why = binary_refused(real_loadfile(path, "t"))
    if not f then error(why, 2) end
    return f, path
  end
  local searchers = package.searchers
  for i = #searchers, 2, -1 do searchers[i] = nil end
  searchers[2] = lua_searcher
end

--- tf.safe_run(script, opts) -> ok, exit code: runs a script under
-- tfhost --safe in a new process and waits for it. script is a path when it
-- ends in ".lua" and has no newline, else Lua source (given on stdin).
-- opts: args (list), timeout (s), memory_limit (GiB), allow_write, device, seed;
-- a limit not given is --safe's default, "none" turns it off.
function M.run(script, opts)
  if type(script) ~= "string" then error("tf.safe_run: expected a script path or Lua source", 2) end
  opts = require("tf.check").keys(opts, "tf.safe_run",
    { "args", "timeout", "memory_limit", "allow_write", "device", "seed" })
  local argv = { "--safe" }
  for _, o in ipairs { { "timeout", "--timeout" }, { "memory_limit", "--memory-limit" },
                       { "allow_write", "--allow-write" }, { "device", "--device" }, { "seed", "--seed" } } do
    local v = opts[o[1]]
    if v ~= nil then
      if type(v) ~= "string" and type(v) ~= "number" then
        error("tf.safe_run: option " .. o[1] .. " must be a string or a number", 2)
      end
      argv[#argv + 1] = o[2] .. "=" .. tostring(v)
    end
  end
  local is_path = not script:find("\n", 1, true) and script:sub(-4) == ".lua"
  if is_path then
    argv[#argv + 1] = "--" -- a path may start with "-"
    argv[#argv + 1] = script
  else
    argv[#argv + 1] = "-"
  end
  for _, a in ipairs(opts.args or {}) do argv[#argv + 1] = tostring(a) end
  local code = spawn(argv, not is_path and script or nil)
  return code == 0, code
end

return M
