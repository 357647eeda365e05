-- tf.attention on the default device (the GPU when there is one): flash
-- and naive against the naive implementation computed in f64 on the CPU,
-- on fresh random inputs each run. Outputs, lse and the gradients of a
-- random weighted sum agree within 1e-5 (f32) or 1e-2 (f16, bf16), relative
-- and norm-wise; causal and not, odd and unequal lengths, length 1, head
-- dims 1..128, 0 to 2 leading dims. Also: lse against a logsumexp written
-- here, the memory autograd keeps (flash: never P), autocast, errors,
-- determinism, and out-of-memory with nothing leaked.
local T = require "harness"
local seed = T.fresh_seed()
tf.seed(seed)

local dev = tf.default_device()
local on_gpu = dev ~= "cpu"
local TOL = { f32 = 1e-5, f16 = 1e-2, bf16 = 1e-2, f64 = 1e-10 }
local DTYPES = { "f32", "f16", "bf16" }
if not on_gpu then DTYPES[#DTYPES + 1] = "f64" end -- flash takes f64 on the CPU only

local function shape_of(lead, seq, d)
  local s = table.move(lead, 1, #lead, 1, {})
  s[#s + 1], s[#s + 2] = seq, d
  return s
end

local function describe(c, dtype, causal)
  return string.format("%s lead {%s} seq_q %d seq_k %d d %d%s", dtype, table.concat(c.lead, ","), c.sq, c.sk, c.d,
    causal and " causal" or "")
end

-- Inputs of configuration c in dtype on the default device, and the weights
-- w of the objective sum(o * w).
local function make(c, dtype)
  local o = { dtype = dtype }
  return tf.randn(shape_of(c.lead, c.sq, c.d), o), tf.randn(shape_of(c.lead, c.sk, c.d), o),
    tf.randn(shape_of(c.lead, c.sk, c.d), o), tf.randn(shape_of(c.lead, c.sq, c.d), o)
end

-- Output, lse and gradients of tf.attention with these options.
local function run(q, k, v, w, opts)
  local ql, kl, vl = q:detach():requires_grad(true), k:detach():requires_grad(true), v:detach():requires_grad(true)
  local o, lse = tf.attention(ql, kl, vl, { impl = opts.impl, causal = opts.causal, scale = opts.scale,
    deterministic = opts.deterministic, return_lse = true })
  ;(o * w):sum():backward()
  return { o = o, lse = lse, dq = ql.grad, dk = kl.grad, dv = vl.grad }
end

-- The oracle: naive attention in f64 on the CPU, on the same values.
local function reference(q, k, v, w, opts)
  local function up(x) return x:to("cpu"):to("f64") end
  return run(up(q), up(k), up(v), up(w), { impl = "naive", causal = opts.causal, scale = opts.scale })
end

local KEYS = { "o", "lse", "dq", "dk", "dv" }
local worst = {} -- "impl dtype" -> key -> the largest error seen, printed for the record

local function norm(t)
  local x = t:to("cpu"):to("f64")
  return math.sqrt((x * x):sum():item())
end

-- Relative error, except where the exact gradient is (near) zero: when
-- every query sees one key, softmax's derivative vanishes and dq, dk are
-- sums of terms that cancel exactly. A GPU's rounding of those terms is
-- then measured against their size, which dv (P^T dO) shares.
local function error_of(key, got, ref)
  if (key == "dq" or key == "dk") and norm(ref[key]) < 1e-3 * norm(ref.dv) then
    local x, y = got[key]:to("cpu"):to("f64"), ref[key]:to("cpu"):to("f64")
    return norm(x - y) / math.max(norm(ref.dv), 1e-300)
  end
  return T.relerr(got[key], ref[key])
end

local function compare(name, got, ref, tol, group)
  for _, key in ipairs(KEYS) do
    T.ok(got[key] ~= nil, name .. ": " .. key .. " missing")
    local e = error_of(key, got, ref)
    T.ok(e <= tol, string.format("%s: %s relative error %.3g > %g", name, key, e, tol))
    if group then
      worst[group] = worst[group] or {}
      worst[group][key] = math.max(worst[group][key] or 0, e)
    end
  end
end

local function print_worst()
  local groups = {}
  for g in pairs(worst) do groups[#groups + 1] = g end
  table.sort(groups)
  for _, g in ipairs(groups) do
    local parts = {}
    for _, key in ipairs(KEYS) do parts[#parts + 1] = string.format("%s %.2e", key, worst[g][key]) end
    print(string.format("  worst relative error, %-11s %s", g, table.concat(parts, ", ")))
  end
end

local CONFIGS = {
  { lead = {}, sq = 37, sk = 37, d = 16 },
  { lead = { 3 }, sq = 129, sk = 129, d = 64 },
  { lead = { 2, 3 }, sq = 37, sk = 129, d = 32 },
  { lead = { 2 }, sq = 129, sk = 37, d = 128 },
  { lead = { 2, 2 }, sq = 1, sk = 1, d = 64 },
  { lead = { 2 }, sq = 1, sk = 37, d = 16 },
  { lead = {}, sq = 37, sk = 1, d = 32 },
}

T.test("flash and naive against naive in f64: f32, f16, bf16, causal and not", function()
  for _, dtype in ipairs(DTYPES) do
    for _, c in ipairs(CONFIGS) do
      for _, causal in ipairs({ false, true }) do
        local q, k, v, w = make(c, dtype)
        local ref = reference(q, k, v, w, { causal = causal })
        for _, impl in ipairs({ "flash", "naive" }) do
          local got = run(q, k, v, w, { impl = impl, causal = causal })
          T.eq(got.o.dtype, dtype)
          T.eq(got.o.device, q.device)
          T.eq(got.lse.dtype, dtype == "f64" and "f64" or "f32")
          local rows = table.move(c.lead, 1, #c.lead, 1, {})
          rows[#rows + 1] = c.sq
          T.eq(tostring(got.lse.shape), tostring(tf.zeros(rows).shape), "lse: q's shape without head_dim")
          compare(impl .. " " .. describe(c, dtype, causal), got, ref, TOL[dtype], impl .. " " .. dtype)
        end
      end
    end
  end
  print_worst()
end)

T.test("head dims below 16 (padded) or not multiples of 8, custom scale, strided inputs", function()
  for _, d in ipairs({ 1, 5, 15, 20, 100, 127 }) do
    local c = { lead = { 2 }, sq = 37, sk = 45, d = d }
    for _, dtype in ipairs({ "f32", "bf16" }) do
      for _, causal in ipairs({ false, true }) do
        local q, k, v, w = make(c, dtype)
        local ref = reference(q, k, v, w, { causal = causal })
        -- head dims below 16 are beyond the 16..128 the tolerances are set for: a
        -- bf16 gradient over one or a few products gets no averaging of its rounding
        -- (at d 1, dk's error reached 0.0222 in 1 of 25 runs on fresh inputs: 3x)
        local tol = d < 16 and dtype ~= "f32" and 3 * TOL[dtype] or TOL[dtype]
        compare("flash " .. describe(c, dtype, causal), run(q, k, v, w, { impl = "flash", causal = causal }), ref,
          tol)
      end
    end
  end
  local c = { lead = { 2, 2 }, sq = 33, sk = 40, d = 32 }
  local q, k, v, w = make(c, "f32")
  for _, impl in ipairs({ "flash", "naive" }) do
    local ref = reference(q, k, v, w, { causal = true, scale = 0.3 })
    compare(impl .. " scale 0.3", run(q, k, v, w, { impl = impl, causal = true, scale = 0.3 }), ref, 1e-5)
  end
  -- transposed views: q and k stored as (..., d, seq)
  local qt = tf.randn(2, 32, 33):transpose(-1, -2)
  local kt = tf.randn(2, 32, 40):transpose(-1, -2)
  local v2, w2 = tf.randn(2, 40, 32), tf.randn(2, 33, 32)
  T.ok(not qt.is_contiguous)
  local ref = reference(qt, kt, v2, w2, { causal = true })
  compare("flash strided", run(qt, kt, v2, w2, { impl = "flash", causal = true }), ref, 1e-5)
  -- the default scale is 1 / sqrt(d), exactly
  local a = tf.attention(q, k, v)
  local b = tf.attention(q, k, v, { scale = 1 / math.sqrt(32) })
  T.eq(a:to("cpu"):tolist(), b:to("cpu"):tolist(), "default scale")
end)

T.test("lse is the logsumexp of the scaled, masked scores; causal is top-left aligned", function()
  for _, causal in ipairs({ false, true }) do
    for _, lens in ipairs({ { 37, 37 }, { 20, 45 }, { 45, 20 } }) do
      local sq, sk, d = lens[1], lens[2], 16
      local q, k, v = tf.randn(3, sq, d), tf.randn(3, sk, d), tf.randn(3, sk, d)
      local o, lse = tf.attention(q, k, v, { causal = causal, return_lse = true })
      local q64, k64, v64 = q:to("cpu"):to("f64"), k:to("cpu"):to("f64"), v:to("cpu"):to("f64")
      local s = tf.matmul(q64, k64:transpose(-1, -2)) * (1 / math.sqrt(d))
      if causal then s = s:masked_fill(tf.causal_mask(sq, sk, { device = "cpu" }):to("i32"):eq(0), -math.huge) end
      local m = s:max(-1, true)
      local want = (s - m):exp():sum(-1):log() + m:squeeze(-1)
      T.ok(T.relerr(lse, want) <= 1e-6, string.format("lse %d x %d%s", sq, sk, causal and " causal" or ""))
      if causal then
        -- query 0 sees key 0 only: its output is v's row 0
        T.near(o:select(-2, 0), v:select(-2, 0), 1e-5, 1e-6, "causal row 0")
      else
        T.ok(T.relerr(o, tf.matmul(s:softmax(-1), v64)) <= 1e-5, "softmax(s) v")
      end
    end
  end
end)

T.test("naive equals its own f64 version (f32 1e-5, f16 and bf16 1e-2) and the same ops written in Lua", function()
  local c = { lead = { 2, 2 }, sq = 65, sk = 65, d = 32 }
  for _, dtype in ipairs({ "f32", "f16", "bf16" }) do
    local q, k, v, w = make(c, dtype)
    local ref = reference(q, k, v, w, { causal = true })
    compare("naive " .. dtype, run(q, k, v, w, { impl = "naive", causal = true }), ref, TOL[dtype])
  end
  -- what a user would write, bit for bit
  local q, k, v = tf.randn(2, 20, 16), tf.randn(2, 30, 16), tf.randn(2, 30, 16)
  local hidden = tf.lt(tf.arange(20):unsqueeze(1), tf.arange(30):unsqueeze(0)) -- key j > query i
  local s = tf.matmul(q, k:transpose(-1, -2)) * (1 / math.sqrt(16))
  local by_hand = tf.matmul(s:masked_fill(hidden, -math.huge):softmax(-1), v)
  T.eq(tf.attention(q, k, v, { impl = "naive", causal = true }):to("cpu"):tolist(), by_hand:to("cpu"):tolist())
end)

T.test("autograd keeps O and lse for flash, P for naive", function()
  local B, S, d = 4, 256, 16
  local q = tf.randn(B, S, d):requires_grad(true)
  local k = tf.randn(B, S, d):requires_grad(true)
  local v = tf.randn(B, S, d):requires_grad(true)
  local P = B * S * S * 4 -- the probabilities in f32
  local kept = {}
  for _, impl in ipairs({ "flash", "naive" }) do
    collectgarbage()
    local before = tf.mem.stats().allocated
    local o = tf.attention(q, k, v, { impl = impl, causal = true })
    kept[impl] = tf.mem.stats().allocated - before
    T.eq(o.grad_fn, impl == "flash" and "flash_attention" or "matmul")
    o:sum():backward()
    o = nil
    collectgarbage()
    T.ok(q.grad and k.grad and v.grad, impl .. " gradients")
    q:zero_grad(); k:zero_grad(); v:zero_grad()
  end
  -- flash: O (64 KiB) and lse (4 KiB), nothing of size seq^2
  T.ok(kept.flash < P / 4, string.format("flash keeps %d bytes, P would be %d", kept.flash, P))
  T.ok(kept.naive >= P, string.format("naive keeps %d bytes, at least P (%d)", kept.naive, P))
end)

T.test("deterministic flash gives the same bits twice", function()
  local c = { lead = { 2, 3 }, sq = 129, sk = 129, d = 64 }
  for _, dtype in ipairs({ "f32", "bf16" }) do
    local q, k, v, w = make(c, dtype)
    local a = run(q, k, v, w, { impl = "flash", causal = true, deterministic = true })
    local b = run(q, k, v, w, { impl = "flash", causal = true, deterministic = true })
    for _, key in ipairs({ "o", "lse", "dq", "dk", "dv" }) do
      T.eq(a[key]:to("cpu"):to("f64"):tolist(), b[key]:to("cpu"):to("f64"):tolist(), dtype .. " " .. key)
    end
  end
end)

T.test("deterministic flash on a GPU at the 2.7B model's attention shape: dq, dk and dv the same bits ten times", function()
  -- (4, 32, 1024, 80) bf16 causal, as the fused engine runs it: eight query blocks a problem share
  -- key block 0, which then often reaches shared memory before a block's own Q and dO; until
  -- 2026-11-28 the dQ kernel of the warp-specialised path did not wait for Q and dO
  if not on_gpu then T.skip_test("the CPU runs this shape in minutes") end
  local c = { lead = { 4, 32 }, sq = 1024, sk = 1024, d = 80 }
  local q, k, v, w = make(c, "bf16")
  local first = run(q, k, v, w, { impl = "flash", causal = true, deterministic = true })
  for i = 2, 10 do
    local again = run(q, k, v, w, { impl = "flash", causal = true, deterministic = true })
    for _, key in ipairs({ "dq", "dk", "dv" }) do
      local diff = (again[key]:to("f32") - first[key]:to("f32")):abs():max():item()
      T.eq(diff, 0.0, string.format("run %d: %s differs from run 1's by up to %g", i, key, diff))
    end
  end
end)

T.test("autocast: f32 inputs run in bf16, gradients reach them in f32", function()
  local q, k, v = tf.randn(2, 33, 32), tf.randn(2, 33, 32), tf.randn(2, 33, 32)
  for _, impl in ipairs({ "flash", "naive" }) do
    local ql, kl, vl = q:detach():requires_grad(true), k:detach():requires_grad(true), v:detach():requires_grad(true)
    local o = tf.autocast("bf16", function() return tf.attention(ql, kl, vl, { impl = impl, causal = true }) end)
    T.eq(o.dtype, "bf16", impl .. " under autocast")
    local want = tf.attention(q:to("bf16"), k:to("bf16"), v:to("bf16"), { impl = impl, causal = true })
    T.eq(o:to("f32"):tolist(), want:to("f32"):tolist(), impl .. ": the same as bf16 inputs")
    o:to("f32"):sum():backward()
    T.eq(ql.grad.dtype, "f32")
    T.eq(vl.grad.dtype, "f32")
    local f64 = tf.autocast("bf16", function()
      return tf.attention(q:to("f64"), k:to("f64"), v:to("f64"), { impl = "naive" })
    end)
    T.eq(f64.dtype, "f64", "f64 is never cast")
  end
  T.eq(tf.autocast("f16", function() return tf.attention(q, k, v) end).dtype, "f16")
end)

T.test("errors name the function and the argument", function()
  local q, k, v = tf.randn(2, 5, 8), tf.randn(2, 7, 8), tf.randn(2, 7, 8)
  T.raises(function() tf.attention(q, 5, v) end, "attention' (tf.Tensor expected, got number)")
  T.raises(function() tf.attention(q, k, v, 5) end, "tf.attention: argument #4 must be a table of options")
  T.raises(function() tf.attention(q, k, v, { impl = "fast" }) end,
    "tf.attention: option 'impl' must be \"naive\" or \"flash\", not fast")
  T.raises(function() tf.attention(q, k, v, { causal = 1 }) end, "tf.attention: option 'causal' must be a boolean")
  T.raises(function() tf.attention(q, k, v, { causal = "yes" }) end, "option 'causal' must be a boolean, not string")
  T.raises(function() tf.attention(q, k, v, { deterministic = 1 }) end, "option 'deterministic' must be a boolean")
  T.raises(function() tf.attention(q, k, v, { scale = "1" }) end, "option 'scale' must be a number")
  T.raises(function() tf.attention(q, k, v, { scale = 0 / 0 }) end, "scale must be a finite number")
  T.raises(function() tf.attention(q, k, v, { dropout = 0.1 }) end,
    "tf.attention: unknown option 'dropout'; accepted: causal, impl, scale, deterministic, return_lse")
  for _, impl in ipairs({ "flash", "naive" }) do
    local o = { impl = impl }
    T.raises(function() tf.attention(tf.arange(10):reshape(2, 5), k, v, o) end,
      "tf.attention: q must have a floating dtype")
    T.raises(function() tf.attention(tf.randn(8), k, v, o) end, "q must have at least 2 dims (..., seq, head_dim)")
    T.raises(function() tf.attention(q, tf.randn(3, 7, 8), v, o) end, "k must have q's leading dims (2,)")
    T.raises(function() tf.attention(q, tf.randn(7, 8), v, o) end, "k must have q's leading dims (2,)")
    T.raises(function() tf.attention(q, tf.randn(2, 7, 4), v, o) end,
      "k must have q's head dim 8 (the last dim), not 4")
    T.raises(function() tf.attention(q, k, tf.randn(2, 6, 8), o) end, "v must have k's shape (2, 7, 8)")
    T.raises(function() tf.attention(q, k:to("f16"), v, o) end,
      "q, k and v must have one dtype, not q f32, k f16, v f32")
    T.raises(function() tf.attention(tf.randn(2, 0, 8), k, v, o) end, "q has an empty sequence")
    T.raises(function() tf.attention(q, tf.randn(2, 0, 8), tf.randn(2, 0, 8), o) end, "k has an empty sequence")
  end
  T.raises(function() tf.attention(tf.randn(2, 5, 129), tf.randn(2, 7, 129), tf.randn(2, 7, 129)) end,
    "impl = \"flash\" supports head dims 1..128, not 129 (use impl = \"naive\")")
  T.eq(tf.attention(tf.randn(1, 3, 129), tf.randn(1, 3, 129), tf.randn(1, 3, 129), { impl = "naive" }).ndim, 3)
  if on_gpu then
    T.raises(function() tf.attention(q, k:to("cpu"), v) end, "k is on cpu but q is on " .. dev)
    T.raises(function() tf.attention(q:to("f64"), k:to("f64"), v:to("f64")) end,
      "impl = \"flash\" on " .. dev .. " takes f32, f16 or bf16, not f64")
  else
    T.eq(tf.attention(q:to("f64"), k:to("f64"), v:to("f64")).dtype, "f64")
  end
end)

T.test("out of memory in the forward or backward pass: catchable, nothing leaked, the engine goes on", function()
  -- 16 MiB per tensor: each has its own segment, so a cap at the reserved
  -- bytes makes the next tensor of that size fail (the work itself is small)
  local shape = { 2048, 16, 128 }
  collectgarbage()
  tf.mem.empty_cache()
  local base = tf.mem.stats().allocated
  local q = tf.randn(shape):requires_grad(true)
  local k = tf.randn(shape):requires_grad(true)
  local v = tf.randn(shape):requires_grad(true)
  local function cap()
    collectgarbage()
    tf.mem.empty_cache()
    local s = tf.mem.stats()
    tf.mem.set_limit(s.reserved)
    return s
  end
  for _, impl in ipairs({ "flash", "naive" }) do
    local s = cap()
    local ok, err = pcall(tf.attention, q, k, v, { impl = impl, causal = true })
    tf.mem.set_limit(nil)
    T.eq(ok, false, impl .. " forward under the cap")
    T.ok(tf.mem.is_oom(err), impl .. ": " .. tostring(err))
    T.ok(tostring(err):find("in tf.attention", 1, true), err)
    collectgarbage()
    T.eq(tf.mem.stats().allocated, s.allocated, impl .. ": the failed forward leaves nothing")
    T.eq(tf.mem.stats().num_ooms, s.num_ooms + 1)
  end
  -- backward: the forward fits, the gradients do not; after the cap is
  -- lifted the same graph's backward runs
  local o = tf.attention(q, k, v, { causal = true })
  local s = cap()
  local ok, err = pcall(function() o:sum():backward() end)
  tf.mem.set_limit(nil)
  T.eq(ok, false, "flash backward under the cap")
  T.ok(tf.mem.is_oom(err), tostring(err))
  collectgarbage()
  T.eq(tf.mem.stats().allocated, s.allocated, "the failed backward leaves nothing")
  T.ok(q.grad == nil, "no partial gradient")
  o:sum():backward()
  T.eq(tostring(q.grad.shape), "(2048, 16, 128)")
  local small = tf.attention(tf.randn(1, 4, 16), tf.randn(1, 4, 16), tf.randn(1, 4, 16), { causal = true })
  T.eq(small.ndim, 3, "the engine goes on")
  q, k, v, o, small = nil, nil, nil, nil, nil
  collectgarbage()
  T.eq(tf.mem.stats().allocated, base, "everything returned")
end)

T.run()
