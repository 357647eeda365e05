--- tf.data: training data. tf.data.tokens opens a token file (raw
-- little-endian integers as nanoGPT and the CS336 course write them with
-- np.memmap, or a 1-D .npy array) mapped read-only, never copied whole:
--
--   local ds <close> = tf.data.tokens("data/bytes/train.bin", { vocab_size = 256, seed = 1 })
--   local x, y = ds:batch(8, 128)               -- (8, 128) i64: y is x shifted by one token
--   for x, y in ds:windows(8, 128) do ... end   -- every window once, in order (evaluation)
--
-- The mapping and the gather of windows are C (host/bind/l_data.c, host/io/tokens.c); the options,
-- the dataset's own random generator and the iterators are here. docs/training.md documents it.
local check = require "tf.check"

local M = {}

local Dataset = {} -- tf.data.TokenDataset, the class of what tf.data.tokens returns
M.TokenDataset = Dataset

local core -- tf._data, bound once by tf/init.lua

--- bind(c): takes the C half (once; later calls change nothing).
function M.bind(c)
  core = core or c
  return M
end

-- The dataset's generator: splitmix64 (Steele, Lea and Flood 2014, as in java.util.SplittableRandom).
-- The state is one 64-bit integer, advanced by the golden gamma at each draw and mixed into the output;
-- Lua's integers wrap around as the algorithm's unsigned arithmetic does.
local GAMMA = 0x9E3779B97F4A7C15
local GENERATOR = "splitmix64"

local function splitmix64(state)
  state = state + GAMMA
  local z = state
  z = (z ~ (z >> 30)) * 0xBF58476D1CE4E5B9
  z = (z ~ (z >> 27)) * 0x94D049BB133111EB
  return state, z ~ (z >> 31)
end

Dataset.__index = Dataset
Dataset.__name = "tf.data.TokenDataset"

-- A uniform integer in [0, m) (1 <= m < 2^63): the draw's top 63 bits, drawn again when they fall in
-- the last, partial run of m values, so that every offset is equally likely.
local function below(ds, m)
  local accept = math.maxinteger - math.maxinteger % m -- m * floor((2^63 - 1) / m)
  while true do
    local z
    ds._state, z = splitmix64(ds._state)
    local r = z >> 1
    if r < accept then return r % m end
  end
end

local function check_count(v, fname, what)
  check.arg(v, fname, what, "integer")
  if v < 1 then error(string.format("%s: %s must be at least 1, not %d", fname, what, v), 2) end
end

-- Refuses a context the file cannot hold with its target (context + 1 tokens).
local function check_fits(ds, fname, context_length)
  if ds.size_tokens < context_length + 1 then
    error(string.format("%s: %s has %d tokens, fewer than context_length + 1 = %d (a window and its target)", fname,
      ds.path, ds.size_tokens, context_length + 1), 2)
  end
end

-- The starts of the next batch_size windows: each uniform in [0, #ds - context_length - 1].
local function draw(ds, fname, batch_size, context_length)
  check_count(batch_size, fname, "batch_size")
  check_count(context_length, fname, "context_length")
  check_fits(ds, fname, context_length)
  local m = ds.size_tokens - context_length
  local starts = {}
  for r = 1, batch_size do starts[r] = below(ds, m) end
  return starts
end

--- ds:offsets(batch_size, context_length) -> the starts (from 0) of the next batch's windows, each
-- uniform in [0, #ds - context_length - 1] as the CS336 course's get_batch draws them; advances the
-- generator exactly as ds:batch does.
function Dataset:offsets(batch_size, context_length) return draw(self, "ds:offsets", batch_size, context_length) end

--- ds:gather(starts, context_length) -> inputs, targets: the windows that start at the given token
-- positions (from 0), as (#starts, context_length) i64 tensors on the dataset's device.
function Dataset:gather(starts, context_length)
  check.arg(starts, "ds:gather", "starts", "table")
  check_count(context_length, "ds:gather", "context_length")
  return self._file:windows(starts, context_length, self.vocab_size, self.device, "ds:gather")
end

--- ds:batch(batch_size, context_length) -> inputs, targets: batch_size windows at uniform random
-- offsets (ds:offsets), targets the inputs shifted by one token.
function Dataset:batch(batch_size, context_length)
  local starts = draw(self, "ds:batch", batch_size, context_length)
  return self._file:windows(starts, context_length, self.vocab_size, self.device, "ds:batch")
end

--- ds:windows(batch_size, context_length [, {drop_last = false}]) -> an iterator over the file's
-- non-overlapping windows in order: window i holds tokens i*T .. i*T+T-1 and its targets one further,
-- for i below floor((#ds - 1) / T). The last batch holds the windows left over (fewer than batch_size
-- rows) unless drop_last; the tokens past the last whole window are not read.
function Dataset:windows(batch_size, context_length, opts)
  check_count(batch_size, "ds:windows", "batch_size")
  check_count(context_length, "ds:windows", "context_length")
  opts = check.keys(opts, "ds:windows", { "drop_last" })
  check.arg(opts.drop_last, "ds:windows", "drop_last", "boolean", true)
  check_fits(self, "ds:windows", context_length)
  local count = (self.size_tokens - 1) // context_length
  local file, vocab, device = self._file, self.vocab_size, self.device
  local next_window = 0
  return function()
    local rows = math.min(batch_size, count - next_window)
    if rows < 1 or (rows < batch_size and opts.drop_last) then return nil end
    local starts = {}
    for r = 1, rows do starts[r] = (next_window + r - 1) * context_length end
    next_window = next_window + rows
    return file:windows(starts, context_length, vocab, device, "ds:windows")
  end
end

--- ds:num_windows(context_length) -> how many windows ds:windows gives: floor((#ds - 1) / context_length).
function Dataset:num_windows(context_length)
  check_count(context_length, "ds:num_windows", "context_length")
  return math.max(0, (self.size_tokens - 1) // context_length)
end

--- ds:check([vocab_size]) -> true, or false, message, position: scans the whole file once for the first
-- token that is negative or not below vocab_size (default: the dataset's; without one, negatives only).
function Dataset:check(vocab_size)
  check.arg(vocab_size, "ds:check", "vocab_size", "integer", true)
  local position, message = self._file:check(vocab_size or self.vocab_size or 0)
  if position == nil then return true end
  return false, message, position
end

--- ds:state() -> a plain table (strings only, safe in JSON): the generator's state, for checkpoints.
function Dataset:state()
  return { generator = GENERATOR, state = string.format("%016x", self._state) }
end

--- ds:set_state(s): restores a state that ds:state() returned (of this or another dataset).
function Dataset:set_state(s)
  if type(s) ~= "table" then error("ds:set_state: expects a table from ds:state(), not " .. check.what_is(s), 2) end
  if s.generator ~= GENERATOR then
    error(string.format("ds:set_state: the state is of generator %s, not %s", tostring(s.generator), GENERATOR), 2)
  end
  local hex = s.state
  if type(hex) ~= "string" or not hex:match("^%x+$") or #hex > 16 then
    error("ds:set_state: the state's 'state' must be up to 16 hex digits, not " .. tostring(hex), 2)
  end
  self._state = tonumber(hex, 16)
end

--- ds:size() (also #ds): the file's token count.
function Dataset:size() return self.size_tokens end
Dataset.__len = Dataset.size

--- ds:close() (also <close>, and when collected): unmaps the file; a closed dataset refuses batches.
function Dataset:close() self._file:close() end
Dataset.__close = Dataset.close

function Dataset:__tostring()
  return string.format("tf.data.tokens(%s, %s, %d tokens)", self.path, self.dtype, self.size_tokens)
end

local RAW_DTYPES = { "u16", "u32", "u8", "i16", "i32", "i64" }

--- tf.data.tokens(path [, opts]) -> a dataset. opts: dtype (a raw file's: "u16", the default, or
-- "u32", "u8", "i16", "i32", "i64"; a .npy file's comes from its header), format ("raw" or "npy";
-- default by the name: .npy is npy), vocab_size (every token of a batch is checked below it),
-- device (the batches'; default: the default device when a batch is made), seed (the dataset's
-- generator; default tf.initial_seed()).
function M.tokens(path, opts)
  check.arg(path, "tf.data.tokens", "the path", "string")
  opts = check.keys(opts, "tf.data.tokens", { "dtype", "format", "vocab_size", "device", "seed" },
    { vocab = "vocab_size" })
  check.arg(opts.dtype, "tf.data.tokens", "dtype", "string", true)
  check.arg(opts.format, "tf.data.tokens", "format", "string", true)
  check.arg(opts.vocab_size, "tf.data.tokens", "vocab_size", "integer", true)
  check.arg(opts.device, "tf.data.tokens", "device", "string", true)
  check.arg(opts.seed, "tf.data.tokens", "seed", "integer", true)
  check.choice(opts.format, "tf.data.tokens", "format", { "raw", "npy" })
  if opts.vocab_size and opts.vocab_size < 1 then
    error("tf.data.tokens: vocab_size must be at least 1, not " .. opts.vocab_size, 2)
  end
  local npy = opts.format == "npy" or (opts.format == nil and path:lower():match("%.npy$") ~= nil)
  if not npy then check.choice(opts.dtype, "tf.data.tokens", "dtype", RAW_DTYPES) end
  local file = core.open(path, npy, not npy and opts.dtype or nil)
  local count, dtype = file:info()
  if npy and opts.dtype and opts.dtype ~= dtype then
    file:close()
    error(string.format("tf.data.tokens: %s: the .npy header says %s tokens, not %s", path, dtype, opts.dtype), 2)
  end
  local seed = opts.seed or require("tf").initial_seed()
  return setmetatable({ path = path, dtype = dtype, format = npy and "npy" or "raw", size_tokens = count,
    vocab_size = opts.vocab_size, device = opts.device, seed = seed, _file = file, _state = seed }, Dataset)
end

--- tf.data.files(folder [, pattern]) -> the paths of the files under folder (every level) whose
-- names match the Lua pattern, sorted; for the scripts that make datasets (Lua cannot list a folder).
function M.files(folder, pattern)
  check.arg(folder, "tf.data.files", "the folder", "string")
  check.arg(pattern, "tf.data.files", "the pattern", "string", true)
  local found = {}
  local function walk(dir)
    for _, e in ipairs(core.list(dir)) do
      local p = dir:sub(-1) == "/" and dir .. e.name or dir .. "/" .. e.name
      if e.folder then
        walk(p)
      elseif not pattern or e.name:match(pattern) then
        found[#found + 1] = p
      end
    end
  end
  walk(folder)
  table.sort(found)
  return found
end

return M
