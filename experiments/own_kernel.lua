--- Kernels the experiment carries: CUDA C compiled when the script runs (tf.cuda.compile), launched on
-- tensors, and made differentiable with an autograd function written in Lua.
--
--   launch:  what compiling and launching cost: the cold compile of the FlashAttention-2 source, the
--            cached compile, the host time of one launch of a small kernel;
--   softmax: a fused row softmax (experiments/kernels/row_softmax.cu), checked against tf.softmax,
--            its bandwidth beside tf.softmax's and the device's copy rate over row widths (the Triton
--            tutorial's classic);
--   flash:   FlashAttention-2 forward and backward written in CUDA C (experiments/kernels/flash2.cu,
--            mma.sync tensor cores, bf16), wrapped as an autograd function, checked against
--            tf.attention{impl = "naive"} and timed beside tfhost's built-in FlashAttention and naive
--            attention;
--   train:   the eager model trained for a few steps with the script's attention in place of its own,
--            beside the same model and seed with tfhost's attention.
--
--   tfhost experiments/own_kernel.lua                      (every part)
--   tfhost experiments/own_kernel.lua --parts flash --json own.json
-- On a CPU the kernels are compiled (NVRTC needs no GPU) and the parts that launch them are skipped,
-- saying so.
local on_gpu = tf.default_device() ~= "cpu"
local opt = tf.options{
  description = "A script's own CUDA kernels: compile and launch costs, a fused softmax, FlashAttention-2 in "
    .. "CUDA C as an autograd function, and the eager model trained with it.",
  { "parts", "comma list of launch, softmax, flash, train", default = "launch,softmax,flash,train" },
  { "rows", "softmax: rows of the matrix", default = 4096, cpu = 64, min = 1 },
  { "widths", "softmax: comma list of row widths",
    default = "256,512,1024,2048,4096,8192,16384,32768", cpu = "256,1024" },
  { "shapes", "flash: comma list of BxHxTxD to time",
    default = "4x16x4096x64,1x16x16384x64,4x16x4096x128,1x16x16384x128", cpu = "1x2x256x64" },
  { "naive_max_t", "flash: time naive attention up to this length", default = 4096, min = 0 },
  { "steps", "train: training steps", default = 20, cpu = 2, min = 1 },
  { "size", "train: model size", default = "small" },
  { "context", "train: context length", default = 512, cpu = 64, min = 1 },
  { "batch", "train: batch size", default = 8, cpu = 2, min = 1 },
  { "iters", "timed repetitions", default = 20, cpu = 3, min = 1 },
  { "json", "write the rows and the environment to this file", type = "string" },
}

local parts = {}
for p in opt.parts:gmatch("[^,]+") do
  if not ({ launch = 1, softmax = 1, flash = 1, train = 1 })[p] then
    tf.exit(2, "own_kernel.lua: unknown part '" .. p .. "' (launch, softmax, flash, train)\n")
  end
  parts[p] = true
end
if not tf.cuda.compiled() then
  tf.exit(2, "own_kernel.lua: this tfhost was built without CUDA: there is no compiler for the script's kernels\n")
end

local here = arg[0]:match("^(.*)/[^/]*$") or "."
local rows = {}
local failures = {} -- checks that failed: the parts go on, and the run ends with exit 1 naming them
local function row(part, t)
  t.part = part
  rows[#rows + 1] = t
end
local order = {}
for _, p in ipairs { "launch", "softmax", "flash", "train" } do
  if parts[p] then order[#order + 1] = p end
end
-- each part is a step of the sweep: its progress line, and the results file written after it
local sweep = tf.report.sweep { total = #order, json = opt.json, results = rows, extra = { options = opt } }
local function part(name, what, fn)
  if not parts[name] then return end
  sweep:start("%s: %s", name, what)
  fn()
  sweep:done()
end
local function shapes_of(text)
  local out = {}
  for s in text:gmatch("[^,]+") do
    local b, h, t, d = s:match("^(%d+)x(%d+)x(%d+)x(%d+)$")
    if not b then tf.exit(2, "own_kernel.lua: --shapes wants BxHxTxD, not " .. s .. "\n") end
    out[#out + 1] = { tonumber(b), tonumber(h), tonumber(t), tonumber(d) }
  end
  return out
end

-- ---- the kernels ----------------------------------------------------------------------------------

local FLASH_EXPRS = {}
for _, d in ipairs { 64, 128 } do
  for _, c in ipairs { "false", "true" } do
    FLASH_EXPRS[#FLASH_EXPRS + 1] = string.format("flash2_fwd<%d, %s>", d, c)
    FLASH_EXPRS[#FLASH_EXPRS + 1] = string.format("flash2_bwd_dkdv<%d, %s>", d, c)
    FLASH_EXPRS[#FLASH_EXPRS + 1] = string.format("flash2_bwd_dq<%d, %s>", d, c)
  end
  FLASH_EXPRS[#FLASH_EXPRS + 1] = string.format("flash2_bwd_prep<%d>", d)
end
-- dynamic shared memory of each kernel, by head dim (flash2.cu's opening comment)
local SHARED = { fwd = { [64] = 55296, [128] = 69632 }, dkdv = { [64] = 56320, [128] = 105472 },
  dq = { [64] = 55296, [128] = 104448 } }

-- the kernels of one (head dim, causal) configuration, compiled together on first use
local function flash_config(d, causal)
  local c = causal and "true" or "false"
  return { string.format("flash2_fwd<%d, %s>", d, c), string.format("flash2_bwd_prep<%d>", d),
    string.format("flash2_bwd_dkdv<%d, %s>", d, c), string.format("flash2_bwd_dq<%d, %s>", d, c) }
end

local t0 = tf.now()
local flash_mod = tf.cuda.compile_file(here .. "/kernels/flash2.cu", { instantiate = flash_config(64, true) })
local flash_ms = tf.now() - t0
local softmax_mod = tf.cuda.compile_file(here .. "/kernels/row_softmax.cu", { instantiate = { "row_softmax<256, float>" } })
row("compile", { what = "flash2.cu, head dim 64, causal", ms = flash_ms, from = flash_mod.cached or "compiled" })
print(string.format("flash2.cu (head dim 64, causal): %s in %.1f ms; row_softmax.cu: %s",
  flash_mod.cached and ("from the " .. flash_mod.cached .. " cache") or "compiled", flash_ms,
  softmax_mod.cached and ("from the " .. softmax_mod.cached .. " cache") or "compiled"))

-- ---- launch -------------------------------------------------------------------------------------------

part("launch", "compile and launch costs", function()
  -- a compile as a new process makes it: one configuration of FlashAttention-2, NVRTC opened and
  -- the device set up first (a GPU script pays for its context anyway), with the disk cache off
  -- (cold) or holding the kernels (a second run's); the memory cache is a process's own
  local flash_file = string.format("%q", here .. "/kernels/flash2.cu")
  local config = '"' .. table.concat(flash_config(64, true), '", "') .. '"'
  local function in_child(cache)
    local child = io.popen(string.format("TFHOST_KERNEL_CACHE=%q %q -e %q", cache, tf.executable(),
      "if tf.cuda.is_available() then tf.zeros(1, {device = 'cuda'}) end; " ..
      "local t = tf.now(); tf.cuda.nvrtc_version(); local open = tf.now() - t; " ..
      "t = tf.now(); local m = tf.cuda.compile_file(" .. flash_file .. ", {instantiate = {" .. config .. "}}); " ..
      "io.write(m.cached or 'compiled', ' ', tf.now() - t, ' ', open)"))
    local out = child:read("a")
    child:close()
    local from, ms, open = out:match("^(%S+) (%S+) (%S+)$")
    return from, tonumber(ms), tonumber(open)
  end
  local sandboxed, cache_dir = not pcall(io.popen, "true"), nil
  if not sandboxed then
    cache_dir = os.tmpname()
    os.remove(cache_dir)
  end
  local cold_from, cold, open_ms
  if cache_dir then cold_from, cold, open_ms = in_child("none") end
  -- in this process, NVRTC open: the same configuration again, then every instantiation at once
  local t = tf.now()
  tf.cuda.compile_file(here .. "/kernels/flash2.cu", { instantiate = flash_config(64, true), cache = false })
  local again = tf.now() - t
  t = tf.now()
  tf.cuda.compile_file(here .. "/kernels/flash2.cu", { instantiate = FLASH_EXPRS, cache = false })
  local cold_all = tf.now() - t
  local from, cached_ms
  if cache_dir then
    tf.cuda.compile_file(here .. "/kernels/flash2.cu", { instantiate = flash_config(64, true), cache_dir = cache_dir })
    from, cached_ms = in_child(cache_dir)
    os.execute("rm -rf " .. string.format("%q", cache_dir))
  else
    print("launch: under --safe no process can be started, so the compiles of a new process are not timed")
  end
  row("launch", { what = "opening NVRTC, once a process", ms = open_ms })
  row("launch", { what = "cold compile of FlashAttention-2 (head dim 64, causal: forward, backward's 3 kernels), "
    .. "a new process", ms = cold, from = cold_from })
  row("launch", { what = "the same compile again in this process (NVRTC open)", ms = again })
  row("launch", { what = "cold compile of flash2.cu's " .. #FLASH_EXPRS .. " instantiations at once", ms = cold_all })
  row("launch", { what = "compile answered by the disk cache, a new process", ms = cached_ms, from = from })
  local function ms_of(v, fmt) return v and string.format(fmt or "%.0f ms", v) or "-" end
  print(string.format("cold compile %s (a new process, NVRTC opened first in %s), %.0f ms again, %.0f ms (all %d); "
    .. "from the cache (%s) %s", ms_of(cold), ms_of(open_ms, "%.1f ms"), again, cold_all, #FLASH_EXPRS,
    tostring(from), ms_of(cached_ms, "%.2f ms")))
  if on_gpu then
    local m = tf.cuda.compile([[extern "C" __global__ void noop(float *x, int n) { if (n < 0) x[0] = 1.0f; }]])
    local k = m:kernel("noop")
    local x = tf.zeros(32, { device = "cuda" })
    local cfg = { grid = 1, block = 32 }
    local warm = tf.now() -- half a second of launches first: the host's clocks settle (as triton_launch.py)
    while tf.now() - warm < 500 do
      for _ = 1, 256 do k:launch(cfg, x, 1) end
      tf.sync()
    end
    -- bursts of 256 launches, shorter than the device's launch queue, each timed on the host and
    -- followed by a wait: the time is the host's, never the GPU's rate of starting kernels
    local samples = {}
    for r = 1, 5 do
      local host = 0
      for _ = 1, 200 do
        local s = tf.now()
        for _ = 1, 256 do k:launch(cfg, x, 1) end
        host = host + (tf.now() - s)
        tf.sync()
      end
      samples[r] = host * 1e3 / (200 * 256)
    end
    table.sort(samples)
    row("launch", { what = "host time of one launch from Lua", us = samples[3], samples = samples })
    print(string.format("host time of one launch from Lua: %.2f us (median of 5 x 200 bursts of 256)", samples[3]))
  else
    print("launch: no GPU, so the launch itself is not timed")
  end
end)

-- ---- softmax ------------------------------------------------------------------------------------------

local function median_ms(fn)
  return tf.bench(fn, { warmup = 3, iters = opt.iters }).median
end

part("softmax", "a fused row softmax over row widths", function()
  if not on_gpu then
    print("softmax: needs a GPU (compiled above)")
  else
    local copy_x = tf.randn(64 << 20, { device = "cuda" })
    local copy_y = tf.empty({ 64 << 20 }, { device = "cuda" })
    local copy_gbs = 2 * 4 * (64 << 20) / (median_ms(function() copy_y:copy_(copy_x) end) * 1e6)
    copy_x, copy_y = nil, nil
    local sweep = {}
    for w in opt.widths:gmatch("%d+") do sweep[#sweep + 1] = tonumber(w) end
    print(string.format("\nsoftmax over rows (%d rows, f32; copy rate %.0f GB/s)", opt.rows, copy_gbs))
    local tab = {}
    for _, cols in ipairs(sweep) do
      local x = tf.randn(opt.rows, cols, { device = "cuda" })
      local y = tf.empty({ opt.rows, cols }, { device = "cuda" })
      local block = 256
      local k = softmax_mod:kernel("row_softmax<256, float>")
      local grid = cols <= 1024 and (opt.rows + block // 32 - 1) // (block // 32) or opt.rows
      local function run() k:launch({ grid = grid, block = block }, x, y, opt.rows, cols) end
      run()
      local ref = tf.softmax(x, -1)
      local err = (y - ref):abs():max():item()
      local bytes = 2 * 4 * opt.rows * cols
      local mine = bytes / (median_ms(run) * 1e6)
      local theirs = bytes / (median_ms(function() return tf.softmax(x, -1) end) * 1e6)
      local r = { cols = cols, script_gbs = mine, tf_softmax_gbs = theirs, copy_gbs = copy_gbs,
        of_copy = mine / copy_gbs, max_abs_error = err }
      row("softmax", r)
      tab[#tab + 1] = r
      if not (err <= 1e-5) then
        failures[#failures + 1] = string.format("softmax: %d columns: max error %.3g against tf.softmax", cols, err)
      end
    end
    tf.report.table(tab, { columns = { "cols", { "script_gbs", "script GB/s", "%.0f" },
      { "tf_softmax_gbs", "tf.softmax GB/s", "%.0f" }, { "of_copy", "of copy", "%.2f" },
      { "max_abs_error", "max |err|", "%.1e" } } })
  end
end)

-- ---- flash ----------------------------------------------------------------------------------------------

local function ceil_div(a, b) return (a + b - 1) // b end

--- FlashAttention-2 of the script, (B, H, T, D) bf16 on the GPU, as an autograd function.
local function flash_kernels(d, causal)
  local c = causal and "true" or "false"
  flash_mod:instantiate(flash_config(d, causal))
  return {
    fwd = flash_mod:kernel(string.format("flash2_fwd<%d, %s>", d, c)),
    prep = flash_mod:kernel(string.format("flash2_bwd_prep<%d>", d)),
    dkdv = flash_mod:kernel(string.format("flash2_bwd_dkdv<%d, %s>", d, c)),
    dq = flash_mod:kernel(string.format("flash2_bwd_dq<%d, %s>", d, c)),
  }
end

local Flash2 = tf.autograd.Function {
  name = "flash2",
  forward = function(ctx, q, k, v, causal)
    local b, h, t, d = q:size(0), q:size(1), q:size(2), q:size(3)
    if d ~= 64 and d ~= 128 then error("flash2: head dim " .. d .. " (the script's kernels take 64 and 128)", 2) end
    q, k, v = q:contiguous(), k:contiguous(), v:contiguous()
    local K = flash_kernels(d, causal)
    local o = tf.empty({ b, h, t, d }, { dtype = "bf16", device = q.device })
    local lse = tf.empty({ b, h, t }, { device = q.device })
    K.fwd:launch({ grid = { ceil_div(t, 128), b * h }, block = 128, shared = SHARED.fwd[d] },
      q, k, v, o, lse, t, 1 / math.sqrt(d))
    ctx:save(q, k, v, o, lse)
    ctx.causal = causal
    return o
  end,
  backward = function(ctx, dout)
    local q, k, v, o, lse = ctx:saved()
    local b, h, t, d = q:size(0), q:size(1), q:size(2), q:size(3)
    local K = flash_kernels(d, ctx.causal)
    dout = dout:to("bf16"):contiguous()
    local delta = tf.empty({ b, h, t }, { device = q.device })
    local dq = tf.empty({ b, h, t, d }, { dtype = "bf16", device = q.device })
    local dk, dv = tf.empty({ b, h, t, d }, { dtype = "bf16", device = q.device }),
      tf.empty({ b, h, t, d }, { dtype = "bf16", device = q.device })
    local scale = 1 / math.sqrt(d)
    K.prep:launch({ grid = { ceil_div(t, 8), b * h }, block = 256 }, o, dout, delta, t)
    K.dkdv:launch({ grid = { ceil_div(t, 64), b * h }, block = 128, shared = SHARED.dkdv[d] },
      q, k, v, dout, lse, delta, dk, dv, t, scale)
    K.dq:launch({ grid = { ceil_div(t, 64), b * h }, block = 128, shared = SHARED.dq[d] },
      q, k, v, dout, lse, delta, dq, t, scale)
    return dq, dk, dv, nil
  end,
}

local function script_attention(q, k, v, causal) return Flash2(q, k, v, causal ~= false) end

part("flash", "FlashAttention-2 of the script: checks, then timings", function()
  if not on_gpu then
    print("flash: needs a GPU (compiled above)")
  else
    -- correctness: forward and the three gradients against naive attention on the same bf16 inputs
    for _, c in ipairs { { 2, 3, 257, 64, true }, { 1, 2, 200, 128, false }, { 1, 2, 512, 128, true } } do
      local b, h, t, d, causal = table.unpack(c)
      local q, k, v = tf.randn(b, h, t, d, { device = "cuda", dtype = "bf16" }), tf.randn(b, h, t, d, { device = "cuda", dtype = "bf16" }),
        tf.randn(b, h, t, d, { device = "cuda", dtype = "bf16" })
      local dout = tf.randn(b, h, t, d, { device = "cuda", dtype = "bf16" })
      local function grads(fn)
        local lq, lk, lv = q:detach():requires_grad(true), k:detach():requires_grad(true), v:detach():requires_grad(true)
        local o = fn(lq, lk, lv)
        o:backward(dout:to(o.dtype))
        return o, lq.grad, lk.grad, lv.grad
      end
      local mine = { grads(function(a, b2, c2) return script_attention(a, b2, c2, causal) end) }
      local ref = { grads(function(a, b2, c2)
        return tf.attention(a:to("f32"), b2:to("f32"), c2:to("f32"), { causal = causal, impl = "naive" })
      end) }
      local names = { "out", "dq", "dk", "dv" }
      local r = { shape = string.format("%dx%dx%dx%d", b, h, t, d), causal = causal }
      for i = 1, 4 do
        local a, e = mine[i]:to("f32"), ref[i]:to("f32")
        r[names[i] .. "_rel_error"] = (a - e):abs():max():item() / math.max(e:abs():max():item(), 1e-30)
        if not (r[names[i] .. "_rel_error"] <= 1e-2) then -- NaN fails too
          failures[#failures + 1] = string.format("flash: %s causal=%s %s: relative error %.3g against naive "
            .. "attention", r.shape, tostring(causal), names[i], r[names[i] .. "_rel_error"])
        end
      end
      row("flash_check", r)
      print(string.format("flash2 %s causal=%s: rel. errors out %.1e dq %.1e dk %.1e dv %.1e", r.shape,
        tostring(causal), r.out_rel_error, r.dq_rel_error, r.dk_rel_error, r.dv_rel_error))
    end
    local tab = {}
    for _, s in ipairs(shapes_of(opt.shapes)) do
      local b, h, t, d = table.unpack(s)
      local q, k, v = tf.randn(b, h, t, d, { device = "cuda", dtype = "bf16" }), tf.randn(b, h, t, d, { device = "cuda", dtype = "bf16" }),
        tf.randn(b, h, t, d, { device = "cuda", dtype = "bf16" })
      local dout = tf.randn(b, h, t, d, { device = "cuda", dtype = "bf16" })
      local leaves = { q:requires_grad(true), k:requires_grad(true), v:requires_grad(true) }
      local impls = {
        { "script flash2", function() return script_attention(q, k, v, true) end },
        { "tfhost flash", function() return tf.attention(q, k, v, { causal = true }) end },
      }
      if t <= opt.naive_max_t then
        impls[#impls + 1] = { "tfhost naive", function() return tf.attention(q, k, v, { causal = true, impl = "naive" }) end }
      end
      for _, impl in ipairs(impls) do
        local fwd = tf.no_grad(function() return median_ms(impl[2]) end)
        local both = tf.bench(function()
          local o = impl[2]()
          o:backward(dout)
          for _, l in ipairs(leaves) do l:zero_grad() end
        end, { warmup = 3, iters = opt.iters }).median
        -- causal attention's FLOPs: half of 4 B H T^2 D forward, 2.5 times that forward and backward
        local flops = 4 * b * h * t * t * d / 2
        local r = { impl = impl[1], shape = string.format("%dx%dx%dx%d", b, h, t, d), fwd_ms = fwd, fwd_bwd_ms = both,
          fwd_tflops = flops / (fwd * 1e9), fwd_bwd_tflops = 3.5 * flops / (both * 1e9) }
        if impl[1] == "script flash2" then
          -- the kernels alone, 10 launches a sample (the host's wait amortised), for the comparison with
          -- the same source built by nvcc (tests/gpu/own_kernel_compare.sh)
          local K = flash_kernels(d, true)
          local o, lse = tf.empty({ b, h, t, d }, { dtype = "bf16", device = "cuda" }), tf.empty({ b, h, t }, { device = "cuda" })
          local delta = tf.empty({ b, h, t }, { device = "cuda" })
          local function like(x) return tf.empty(x:size(), { dtype = x.dtype, device = "cuda" }) end
          local dq, dk, dv = like(q), like(q), like(q)
          local scale = 1 / math.sqrt(d)
          local qd, kd, vd = q:detach(), k:detach(), v:detach()
          local function fwd_kernels()
            K.fwd:launch({ grid = { ceil_div(t, 128), b * h }, block = 128, shared = SHARED.fwd[d] }, qd, kd, vd, o, lse, t, scale)
          end
          local function bwd_kernels()
            K.prep:launch({ grid = { ceil_div(t, 8), b * h }, block = 256 }, o, dout, delta, t)
            K.dkdv:launch({ grid = { ceil_div(t, 64), b * h }, block = 128, shared = SHARED.dkdv[d] },
              qd, kd, vd, dout, lse, delta, dk, dv, t, scale)
            K.dq:launch({ grid = { ceil_div(t, 64), b * h }, block = 128, shared = SHARED.dq[d] },
              qd, kd, vd, dout, lse, delta, dq, t, scale)
          end
          r.kernels_fwd_ms = median_ms(function() for _ = 1, 10 do fwd_kernels() end end) / 10
          r.kernels_fwd_bwd_ms = median_ms(function() for _ = 1, 10 do fwd_kernels(); bwd_kernels() end end) / 10
        end
        row("flash", r)
        tab[#tab + 1] = r
      end
    end
    print("\nFlashAttention-2 of the script beside tfhost's (causal, bf16, median of " .. opt.iters .. ")")
    tf.report.table(tab, { columns = { "impl", "shape", { "fwd_ms", "fwd ms", "%.3f" },
      { "fwd_bwd_ms", "fwd+bwd ms", "%.3f" }, { "fwd_tflops", "fwd TFLOP/s", "%.0f" },
      { "fwd_bwd_tflops", "fwd+bwd TFLOP/s", "%.0f" } } })
  end
end)

-- ---- train -----------------------------------------------------------------------------------------------

part("train", "the eager model trained with the script's attention", function()
  if not on_gpu then
    print("train: needs a GPU (the script's attention is a CUDA kernel)")
  else
    local function train(attention)
      tf.seed(1234)
      local m = tf.model.new { preset = opt.size, context_length = opt.context, precision = "bf16", impl = "eager",
        attention = attention }
      local ids = tf.randint(0, m.config.vocab_size, { opt.batch, opt.context + 1 }, { device = "cuda" })
      local x, y = ids:narrow(1, 0, opt.context):contiguous(), ids:narrow(1, 1, opt.context):contiguous()
      local losses = {}
      local t = tf.now()
      for i = 1, opt.steps do losses[i] = m:step(x, y):item() end
      return losses, (tf.now() - t) / opt.steps
    end
    local mine, mine_ms = train(function(q, k, v) return script_attention(q, k, v, true):to(q.dtype) end)
    local theirs, theirs_ms = train(nil)
    print(string.format("\nthe eager %s model, %d steps on one batch (it memorises it), bf16:", opt.size, opt.steps))
    local tab = {}
    for i = 1, opt.steps, math.max(1, opt.steps // 5) do
      tab[#tab + 1] = { step = i, script = mine[i], tfhost = theirs[i], diff = mine[i] - theirs[i] }
    end
    tab[#tab + 1] = { step = opt.steps, script = mine[opt.steps], tfhost = theirs[opt.steps],
      diff = mine[opt.steps] - theirs[opt.steps] }
    tf.report.table(tab, { columns = { "step", { "script", "loss, script's attention", "%.4f" },
      { "tfhost", "loss, tfhost's attention", "%.4f" }, { "diff", "difference", "%+.4f" } } })
    print(string.format("a step: %.1f ms with the script's attention, %.1f ms with tfhost's", mine_ms, theirs_ms))
    row("train", { size = opt.size, steps = opt.steps, script_losses = mine, tfhost_losses = theirs,
      script_step_ms = mine_ms, tfhost_step_ms = theirs_ms })
    if not (mine[opt.steps] < mine[1]) then
      failures[#failures + 1] = "train: the loss did not go down with the script's attention"
    end
  end
end)

sweep:finish()
if #failures > 0 then tf.exit(1, "own_kernel.lua: " .. #failures .. " check(s) failed:\n  " .. table.concat(failures, "\n  ") .. "\n") end
