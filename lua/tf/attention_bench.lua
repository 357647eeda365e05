--- What the attention experiments (experiments/attention_sweep.lua and
-- flash_benchmark.lua) share: their common options, the configurations
-- (dtype x head dim x sequence length x implementation), the inputs, one
-- configuration measured with out-of-memory as a row, and the sweep loop
-- (progress with an estimate, rows written as they finish).
local M = {}

--- Adds the options both experiments take to decl (a tf.options table),
-- with this experiment's defaults: defaults[name] = {gpu default, cpu
-- default} (or a single value, the same on both).
function M.options(decl, defaults)
  local function d(name)
    local v = defaults[name]
    if type(v) == "table" then return v[1], v[2] end
    return v, nil
  end
  local function add(spec)
    spec.default, spec.cpu = d(spec[1])
    decl[#decl + 1] = spec
  end
  add{ "batch", defaults.batch_help or "batch size", min = 1 }
  add{ "d", "head dims", type = "list:int", min = 1 }
  add{ "seq", "sequence lengths", type = "list:int", min = 1 }
  add{ "impl", "implementations", type = "list", choices = { "naive", "flash" } }
  add{ "dtype", "input dtypes", type = "list", choices = { "f32", "f16", "bf16" } }
  add{ "causal", "causal mask (--no-causal for full attention)", type = "bool" }
  add{ "warmup", "untimed calls before timing", type = "int", min = 0 }
  add{ "iters", defaults.iters_help or "timed calls", type = "int", min = 1 }
  add{ "memory_limit", "cap the device memory tfhost may reserve, in GiB (0: none); shows OOM rows cheaply",
    type = "number", min = 0 }
  return decl
end

--- The configurations of a run, and the relative cost of each for the
-- estimate: attention's two matmuls, seq^2 * d, plus a fixed part (the
-- calls and launches that dominate small shapes).
function M.configs(opt)
  local configs, costs = {}, {}
  for _, dtype in ipairs(opt.dtype) do
    for _, d in ipairs(opt.d) do
      for _, seq in ipairs(opt.seq) do
        for _, impl in ipairs(opt.impl) do
          configs[#configs + 1] = { dtype = dtype, d = d, seq = seq, impl = impl }
          costs[#costs + 1] = seq * seq * d + 2 ^ 20
        end
      end
    end
  end
  return configs, costs
end

--- q, k and v (requiring grad) and a fixed random output gradient, of shape
-- and dtype, from seed 0.
function M.inputs(shape, dtype)
  local tf = require "tf"
  tf.seed(0)
  local o = { dtype = dtype }
  local q = tf.randn(shape, o):requires_grad(true)
  local k = tf.randn(shape, o):requires_grad(true)
  local v = tf.randn(shape, o):requires_grad(true)
  return q, k, v, tf.randn(shape, o)
end

--- Runs fn() (the measurements of one configuration); an out-of-memory
-- error becomes on_oom(err) and any other is raised again. The memory the
-- configuration held goes back to the device afterwards.
function M.guarded(fn, on_oom)
  local tf = require "tf"
  local ok, err = pcall(fn)
  if not ok then
    if not tf.mem.is_oom(err) then error(err, 0) end
    on_oom(err)
  end
  collectgarbage()
  collectgarbage()
  tf.mem.empty_cache()
  return ok
end

--- The sweep: measure(config) -> row for each configuration, with a
-- progress line and the rows written to opt.json as they finish (extra:
-- the results file's other fields; after(row, config): called on each row
-- before it is kept; note(row): the progress line's word for it).
function M.run(opt, measure, opts)
  local tf = require "tf"
  opts = opts or {}
  if opt.memory_limit > 0 then tf.mem.set_limit(math.floor(opt.memory_limit * 2 ^ 30)) end
  local configs, costs = M.configs(opt)
  local rows = {}
  local sweep = tf.report.sweep{ total = #configs, json = opt.json, results = rows, extra = opts.extra,
    costs = costs }
  for _, c in ipairs(configs) do
    sweep:start("%s d %d seq %d %s", c.dtype, c.d, c.seq, c.impl)
    local row = measure(c)
    if opts.after then opts.after(row, c) end
    rows[#rows + 1] = row
    sweep:done(opts.note and opts.note(row) or (row.oom and "OOM" or "done"))
  end
  return rows, sweep
end

--- "causal" or "not causal".
function M.mask(opt) return opt.causal and "causal" or "not causal" end

--- A cell format: numbers by fmt, anything else (OOM) as it is.
function M.num(fmt)
  return function(v) return type(v) == "number" and string.format(fmt, v) or tostring(v) end
end

return M
