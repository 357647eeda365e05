--- tf.checkpoint: a whole training state in safetensors files, and folders
-- that keep the last few.
--
--   local ck = tf.checkpoint.folder("runs/a", { keep = 3 })
--   ck:save(step, { model = m, data = { train = ds } })      -- every N steps
--   local path = ck:latest()                                  -- nil when there is none
--   local st = tf.checkpoint.restore(path, { model = m, data = { train = ds } })
--   -- st.step: the steps the saved run had taken; go on from st.step + 1
--
-- A checkpoint holds the model's f32 parameters, AdamW's moments, the
-- optimizer's settings and step count (the schedule's position), every
-- random generator a run draws from (the devices' and each dataset's), the
-- model's configuration and precision, and a table of the script's own
-- (`extra`). Tensors are safetensors tensors with a checksum each; the rest
-- is JSON in the file's metadata. A file is written under a temporary name,
-- synced and renamed, so a path never holds a partial checkpoint. A run of
-- several ranks writes one file per rank beside rank 0's, rank 0's last.
local check = require "tf.check"

local M = {}

--- The format this tfhost writes and the newest it reads.
M.FORMAT = 1

local FIELDS = { "vocab_size", "context_length", "d_model", "num_layers", "num_heads", "d_ff", "rope_theta" }
local OPT_FIELDS = { "lr", "beta1", "beta2", "eps", "weight_decay", "max_norm" }

local function tf() return require "tf" end

local function fail(path, fmt, ...)
  error(string.format("tf.checkpoint: %s: " .. fmt, path, ...), 0)
end

-- ---- what a state is ---------------------------------------------------------

-- state.data as name -> dataset (a lone dataset is "data").
local function datasets(data, fname)
  if data == nil then return {} end
  if type(data) ~= "table" then error(fname .. ": data must be a dataset or a table name -> dataset", 3) end
  if data.state and data.set_state then return { data = data } end
  for name, ds in pairs(data) do
    if type(name) ~= "string" or type(ds) ~= "table" or not ds.state then
      error(fname .. ": data must be a dataset or a table name -> dataset (" .. tostring(name) .. " is not one)", 3)
    end
  end
  return data
end

local function check_state(state, fname)
  check.arg(state, fname, "the state", "table")
  state = check.keys(state, fname, { "model", "data", "step", "extra", "rng" })
  local m = state.model
  if type(m) ~= "table" or not m.config or not m.named_parameters then
    error(fname .. ": state.model must be a tf.model", 3)
  end
  if m.attention == "function" then
    error(fname .. ": the model's attention is a script's function, which a checkpoint cannot hold", 3)
  end
  check.arg(state.step, fname, "state.step", "integer", true)
  if state.extra ~= nil and type(state.extra) ~= "table" then error(fname .. ": state.extra must be a table", 3) end
  return state, datasets(state.data, fname)
end

-- The devices whose generators a run draws from: the CPU's, the default
-- device's and the model's.
local function rng_devices(m)
  local list, seen = {}, {}
  for _, d in ipairs({ "cpu", tf().default_device(), m.device }) do
    if not seen[d] then list[#list + 1], seen[d] = d, true end
  end
  return list
end

-- Moments of the model's optimizer: name -> {exp_avg, exp_avg_sq}, or a shard.
local function moments(m)
  if m.engine then return m.engine:moments() end
  local opt = m._optimizer
  local out = { sharded = false, exp_avg = {}, exp_avg_sq = {} }
  if not opt or not opt.state then return out end
  local i = 0
  for name in m:named_parameters() do
    i = i + 1
    local s = opt.state[i]
    if s and s.m then out.exp_avg[name], out.exp_avg_sq[name] = s.m, s.v end
  end
  return out
end

local function optimizer_settings(opt)
  local o = { kind = "adamw", t = opt.t }
  for _, k in ipairs(OPT_FIELDS) do o[k] = opt[k] end
  if opt.schedule then
    local s = opt.schedule
    if getmetatable(s) and s.kind and s.options then
      o.schedule = { kind = s.kind, options = s.options }
    else
      o.schedule = "function"
    end
  end
  return o
end

-- ---- files ----------------------------------------------------------------------

local function rank_path(path, rank)
  if rank == 0 then return path end
  local stem = path:gsub("%.safetensors$", "")
  return string.format("%s.rank%d.safetensors", stem, rank)
end
M._rank_path = rank_path

local function world()
  local dist = tf().dist
  return dist.world_size(), dist.rank()
end

-- A token naming one save of a run of several ranks (rank 0's, broadcast),
-- so that a rank's file from another save is never taken for this one's.
local function save_id(size)
  local t = tf()
  local id = t.tensor({ size > 1 and t.dist.rank() == 0 and math.random(1, 2 ^ 52) or 0 }, { dtype = "f64", device = "cpu" })
  if size > 1 then t.dist.broadcast(id, 0) end -- (an integer below 2^53: exact in f64, the collectives' common type)
  return string.format("%x", math.tointeger(id:item()))
end

-- The checked arguments of save and restore: the state, its datasets, the
-- model, the world's size and this rank.
local function begin(fname, path, state)
  check.arg(path, fname, "the path", "string")
  local sets
  state, sets = check_state(state, fname)
  local size, rank = world()
  return state, sets, state.model, size, rank
end

--- tf.checkpoint.save(path, state) -> info: writes a checkpoint. state:
-- model (a tf.model, with its optimizer), data (a dataset or name ->
-- dataset: their generators' states), step (default: the optimizer's step
-- count), extra (a table of the script's, stored as JSON), rng (false: leave
-- the devices' generators out). info: {path, bytes, seconds, files}.
function M.save(path, state)
  local state, sets, m, size, rank = begin("tf.checkpoint.save", path, state)
  local t = tf()
  t.sync()
  local t0 = t.now()
  local opt = m:optimizer()
  local mom = moments(m)
  local meta = {
    ["tfhost.checkpoint"] = tostring(M.FORMAT),
    step = tostring(state.step or opt.t),
    world = tostring(size),
    rank = tostring(rank),
  }
  local model = { impl = m.impl, precision = m.precision, fp8 = m.fp8, attention = m.attention, graphs = m.graphs,
    parallel = m.parallel, zero1 = mom.sharded or nil }
  for _, k in ipairs(FIELDS) do model[k] = m.config[k] end
  meta.model = t.json.encode(model)
  meta.optimizer = t.json.encode(optimizer_settings(opt))
  local data = {}
  for name, ds in pairs(sets) do data[name] = ds:state() end
  meta.data = t.json.encode(data)
  if state.rng ~= false then
    local rng = {}
    for _, d in ipairs(rng_devices(m)) do rng[d] = t.rng_state(d) end
    meta.rng = t.json.encode(rng)
  end
  if state.extra then meta.extra = t.json.encode(state.extra) end
  meta.tfhost = t.json.encode({ version = t.version, commit = t.commit })
  meta.save_id = save_id(size)

  local tensors = {}
  if rank == 0 then
    for name, p in m:named_parameters() do tensors["model/" .. name] = p end
  end
  if mom.sharded then
    tensors["optimizer/exp_avg.shard"], tensors["optimizer/exp_avg_sq.shard"] = mom.exp_avg, mom.exp_avg_sq
    meta.shard = t.json.encode({ begin = mom.begin, ["end"] = mom["end"] })
  elseif rank == 0 then
    for name, v in pairs(mom.exp_avg) do tensors["optimizer/exp_avg/" .. name] = v end
    for name, v in pairs(mom.exp_avg_sq) do tensors["optimizer/exp_avg_sq/" .. name] = v end
  end
  -- delayed FP8 scaling's amax history: each rank's own (its own data's amax)
  local history, rolls, recorded
  if m.engine and m.fp8 and m.fp8.history then history, rolls, recorded = m.engine:fp8_history_state() end
  if history then
    tensors["fp8/amax_history"] = history
    meta.fp8_state = t.json.encode({ rolls = rolls, recorded = recorded })
  end
  -- Every other rank first; rank 0's file, which names the save, last.
  local mine = rank_path(path, rank)
  if rank ~= 0 then t.safetensors.save(mine, tensors, meta, { checksums = true }) end
  if size > 1 then t.dist.barrier() end
  if rank == 0 then t.safetensors.save(mine, tensors, meta, { checksums = true }) end
  if size > 1 then t.dist.barrier() end
  local bytes = 0
  for _, v in pairs(tensors) do bytes = bytes + v:numel() * v:element_size() end
  return { path = path, file = mine, bytes = bytes, seconds = (t.now() - t0) / 1e3, world = size }
end

-- The header of a checkpoint file, checked: its metadata decoded.
local function read_meta(path, fname)
  local t = tf()
  local ok, entries, meta = pcall(t.safetensors.read_header, path)
  if not ok then error((tostring(entries):gsub("^.-tf%.safetensors%.read_header: ", fname .. ": ", 1)), 0) end
  local format = meta["tfhost.checkpoint"]
  if not format then
    fail(path, "is a safetensors file but not a tfhost checkpoint (it has no tfhost.checkpoint metadata; " ..
      "a model's weights alone load with tf.model.load)")
  end
  local n = math.tointeger(tonumber(format))
  if not n then fail(path, "has a checkpoint format '%s' that is not a number", format) end
  if n > M.FORMAT then
    fail(path, "is a checkpoint of format %d, newer than this tfhost reads (format %d): use a newer tfhost", n, M.FORMAT)
  end
  local out = { format = n, entries = entries, raw = meta }
  for _, key in ipairs({ "model", "optimizer", "data", "rng", "extra", "shard", "tfhost", "fp8_state" }) do
    if meta[key] then
      local okj, v = pcall(t.json.decode, meta[key])
      if not okj or type(v) ~= "table" then fail(path, "its metadata '%s' is not valid JSON (a damaged header)", key) end
      out[key] = v
    end
  end
  for _, key in ipairs({ "model", "optimizer" }) do
    if not out[key] then fail(path, "its metadata has no '%s' (a damaged header)", key) end
  end
  out.step = math.tointeger(tonumber(meta.step))
  out.world = math.tointeger(tonumber(meta.world or "1")) or 1
  out.save_id = meta.save_id
  if not out.step then fail(path, "its metadata has no step count (a damaged header)") end
  return out
end

--- tf.checkpoint.info(path) -> what a checkpoint holds, without reading its
-- tensors: {format, step, world, model = {config, precision, impl, ...},
-- optimizer = {t, lr, ..., schedule}, data = {name = state}, extra, bytes}.
function M.info(path)
  check.arg(path, "tf.checkpoint.info", "the path", "string")
  local h = read_meta(path, "tf.checkpoint.info")
  local bytes = 0
  for _, e in pairs(h.entries) do bytes = bytes + (e.offsets[2] - e.offsets[1]) end
  return { format = h.format, step = h.step, world = h.world, model = h.model, optimizer = h.optimizer,
    data = h.data or {}, extra = h.extra, bytes = bytes, tfhost = h.tfhost }
end

-- Where the model and the checkpoint's model differ, as one message (nil: they fit).
local function mismatch(m, saved)
  local diffs = {}
  for _, k in ipairs(FIELDS) do
    if m.config[k] ~= saved[k] then
      diffs[#diffs + 1] = string.format("%s %s in the checkpoint, %s in the model", k, tostring(saved[k]), tostring(m.config[k]))
    end
  end
  if m.precision ~= saved.precision then
    diffs[#diffs + 1] = string.format("precision %s in the checkpoint, %s in the model", tostring(saved.precision), m.precision)
  end
  local function history(fp8) return fp8 and fp8.history or 0 end
  if history(m.fp8) ~= history(saved.fp8) then
    diffs[#diffs + 1] = string.format("fp8 amax history of %d steps in the checkpoint, %d in the model (0: current scaling)",
      history(saved.fp8), history(m.fp8))
  end
  if #diffs == 0 then return nil end
  return table.concat(diffs, "; ")
end

-- The optimizer of the checkpoint set on the model: its settings, its step count.
local function restore_optimizer(m, saved, path)
  local t = tf()
  local opts = { betas = { saved.beta1, saved.beta2 }, eps = saved.eps, weight_decay = saved.weight_decay,
    max_norm = saved.max_norm }
  local s = saved.schedule
  if s == "function" then
    local current = m._optimizer and m._optimizer.schedule
    if type(current) ~= "function" then
      fail(path, "the saved run's learning rate came from a script's function, which a checkpoint cannot hold: " ..
        "set it again with m:optimizer{schedule = f, ...} before restoring")
    end
    opts.schedule = current
  elseif type(s) == "table" then
    local make = t.optim.schedule[s.kind]
    if not make then fail(path, "its schedule '%s' is not one of tf.optim.schedule's", tostring(s.kind)) end
    opts.schedule = make(s.options)
  else
    opts.lr = saved.lr
  end
  local opt = m:optimizer(opts)
  opt.t = saved.t
  if saved.lr then opt.lr = saved.lr end
  return opt
end

-- The eager optimizer makes its moments at its first step: make those the
-- checkpoint holds now (zeros), to be read into.
local function eager_moments(m, entries)
  local t = tf()
  local opt = m:optimizer()
  local i = 0
  for name, p in m:named_parameters() do
    i = i + 1
    if entries["optimizer/exp_avg/" .. name] and not opt.state[i] then
      local moment = { device = p.device, dtype = p.dtype == "f64" and "f64" or "f32" }
      opt.state[i] = { m = t.zeros(p:size(), moment), v = t.zeros(p:size(), moment) }
    end
  end
end

local function load_into(file, into)
  local ok, err = pcall(tf().safetensors.load_into, file, into)
  if not ok then error((tostring(err):gsub("^.-tf%.safetensors%.load_into: ", "tf.checkpoint.restore: ", 1)), 0) end
end

-- The tensors into the model: the parameters and unsharded moments from
-- rank 0's file (main), a ZeRO-1 shard of the moments from the rank's own
-- (mine, h: its header).
local function restore_tensors(m, main, path, mine, h)
  local from_main, from_mine = {}, {}
  for name, p in m:named_parameters() do from_main["model/" .. name] = p end
  if h.shard then
    local mom = moments(m)
    from_mine["optimizer/exp_avg.shard"], from_mine["optimizer/exp_avg_sq.shard"] = mom.exp_avg, mom.exp_avg_sq
  else
    if not m.engine then eager_moments(m, main.entries) end
    local mom = moments(m)
    for name, v in pairs(mom.exp_avg) do from_main["optimizer/exp_avg/" .. name] = v end
    for name, v in pairs(mom.exp_avg_sq) do from_main["optimizer/exp_avg_sq/" .. name] = v end
  end
  if mine == path then
    for k, v in pairs(from_mine) do from_main[k] = v end
    load_into(path, from_main)
  else
    load_into(path, from_main)
    if next(from_mine) then load_into(mine, from_mine) end
  end
  if m.engine and m.fp8 and m.fp8.history then
    local history = m.engine:fp8_history_state()
    if not h.fp8_state then fail(mine, "holds no fp8 amax history, which the model's delayed scaling needs") end
    load_into(mine, { ["fp8/amax_history"] = history })
    m.engine:set_fp8_history_state(h.fp8_state.rolls, h.fp8_state.recorded)
  end
  if m.engine then m.engine:sync_weights() end
end

--- tf.checkpoint.restore(path, state) -> info: a checkpoint back into a
-- model made with the same configuration and precision (state.model) and
-- into datasets (state.data, by name); the devices' generators too (unless
-- rng = false). info as tf.checkpoint.info's; info.step is the step count
-- of the saved run.
function M.restore(path, state)
  local fname = "tf.checkpoint.restore"
  local state, sets, m, size, rank = begin(fname, path, state)
  local t = tf()
  local main = read_meta(path, fname)
  if main.world ~= size then
    fail(path, "was written by a run of %d rank%s; this run has %d", main.world, main.world == 1 and "" or "s", size)
  end
  local diff = mismatch(m, main.model)
  if diff then fail(path, "does not fit the model: %s", diff) end
  local mine, h = path, main
  if rank ~= 0 then
    mine = rank_path(path, rank)
    h = read_meta(mine, fname)
    if h.save_id ~= main.save_id then
      fail(mine, "belongs to another save than %s (a rank's file from an earlier run)", path)
    end
  end
  local sharded = m.parallel == "zero1" -- (tf.model.new takes zero1 for the fused engine only)
  if (main.model.zero1 or false) ~= sharded then
    fail(path, "was saved %s ZeRO-1 sharding; the model is %s", main.model.zero1 and "with" or "without",
      sharded and "sharded" or "not sharded")
  end
  local opt = restore_optimizer(m, main.optimizer, path)
  restore_tensors(m, main, path, mine, h)
  local data = h.data or {}
  for name, ds in pairs(sets) do
    if not data[name] then
      local have = {}
      for k in pairs(data) do have[#have + 1] = k end
      table.sort(have)
      fail(mine, "holds no state of a dataset named '%s' (it has: %s)", name,
        #have > 0 and table.concat(have, ", ") or "none")
    end
    ds:set_state(data[name])
  end
  if state.rng ~= false and h.rng then
    local wanted = {}
    for _, d in ipairs(rng_devices(m)) do wanted[d] = true end
    for d, s in pairs(h.rng) do
      if wanted[d] then t.set_rng_state(s, d) end -- a device this run has (a CPU run of a GPU checkpoint has not)
    end
  end
  m._has_loss = false
  return { format = main.format, step = main.step, world = main.world, model = main.model,
    optimizer = main.optimizer, data = data, extra = main.extra, optimizer_object = opt }
end

--- tf.checkpoint.load(path [, {device, data}]) -> model, info: a new model
-- of the checkpoint's configuration (on device: default the default device)
-- with its state restored; data as restore's.
function M.load(path, opts)
  local fname = "tf.checkpoint.load"
  check.arg(path, fname, "the path", "string")
  opts = check.keys(opts, fname, { "device", "data", "rng", "graphs" })
  local h = read_meta(path, fname)
  local spec = { device = opts.device, precision = h.model.precision, fp8 = h.model.fp8, impl = h.model.impl,
    attention = h.model.attention, graphs = opts.graphs, parallel = h.model.parallel }
  if spec.impl == "fused" and not tf()._model then spec.impl = nil end
  for _, k in ipairs(FIELDS) do spec[k] = h.model[k] end
  local m = tf().model.new(spec)
  local info = M.restore(path, { model = m, data = opts.data, rng = opts.rng })
  return m, info
end

-- ---- folders of checkpoints ------------------------------------------------------

local Folder = {}
Folder.__index = Folder

local function step_name(prefix, step) return string.format("%s%08d.safetensors", prefix, step) end

--- folder:list() -> {{step =, path =}, ...} of the whole checkpoints, oldest first
-- (files being written, under temporary names, and ranks' files are not listed).
function Folder:list()
  local out = {}
  local pattern = "^" .. self.prefix:gsub("%p", "%%%0") .. "(%d+)%.safetensors$"
  for _, p in ipairs(tf().data.files(self.dir)) do
    local name = p:match("[^/]+$")
    local step = name:match(pattern)
    if step and p:sub(1, #self.dir + 1 + #name) == self.dir .. "/" .. name then
      out[#out + 1] = { step = math.tointeger(tonumber(step)), path = p }
    end
  end
  table.sort(out, function(a, b) return a.step < b.step end)
  return out
end

-- Files a killed save left under the writer's temporary names
-- (name.tmp-PID-N), where process PID is gone (Linux's /proc says so).
local function readable(path)
  local ok, f = pcall(io.open, path, "rb") -- tfhost --safe refuses /proc: then nothing is removed
  if ok and f then f:close() end
  return ok and f ~= nil
end

function Folder:_remove_stale()
  if not readable("/proc/self/stat") then return end
  for _, p in ipairs(tf().data.files(self.dir)) do
    local pid = p:match("%.safetensors%.tmp%-(%d+)%-%d+$")
    if pid and not readable("/proc/" .. pid .. "/stat") then os.remove(p) end
  end
end

--- folder:latest() -> the path of the newest whole checkpoint, or nil.
function Folder:latest()
  local list = self:list()
  return list[#list] and list[#list].path or nil
end

--- folder:save(step, state) -> info: tf.checkpoint.save into the folder
-- (step_00000100.safetensors), then all but the newest `keep` removed.
function Folder:save(step, state)
  check.arg(step, "folder:save", "the step", "integer")
  check.arg(state, "folder:save", "the state", "table")
  local t = tf()
  local size, rank = world()
  local s = {}
  for k, v in pairs(state) do s[k] = v end
  s.step = s.step or step
  local path = self.dir .. "/" .. step_name(self.prefix, step)
  if rank == 0 then self:_remove_stale() end
  local info = M.save(path, s)
  if rank == 0 and self.keep then
    local list = self:list()
    for i = 1, #list - self.keep do
      if list[i].path ~= path then
        for r = size - 1, 0, -1 do os.remove(rank_path(list[i].path, r)) end -- rank 0's, naming the save, last
      end
    end
  end
  if size > 1 then t.dist.barrier() end
  return info
end

function Folder:__tostring()
  return string.format("tf.checkpoint.folder(%s, keep %s)", self.dir, tostring(self.keep or "all"))
end

--- tf.checkpoint.folder(dir [, {keep = 3, prefix = "step_"}]) -> a folder of
-- checkpoints (made when missing) that keeps the newest `keep` (nil: all).
function M.folder(dir, opts)
  check.arg(dir, "tf.checkpoint.folder", "the folder", "string")
  opts = check.keys(opts, "tf.checkpoint.folder", { "keep", "prefix" })
  local keep = opts.keep
  if keep == nil then keep = 3 end
  if keep ~= false and (math.type(keep) ~= "integer" or keep < 1) then
    error("tf.checkpoint.folder: keep must be an integer >= 1 (or false: keep all), not " .. tostring(keep), 2)
  end
  check.arg(opts.prefix, "tf.checkpoint.folder", "prefix", "string", true)
  dir = dir:gsub("/+$", "")
  if dir == "" then dir = "/" end
  tf().mkdir(dir)
  return setmetatable({ dir = dir, keep = keep ~= false and keep or nil, prefix = opts.prefix or "step_" }, Folder)
end

return M
