-- Ops on the CPU backend against references computed in Lua (double
-- precision) from the same inputs, on fresh random data each run.
local T = require "harness"
local cpu = "cpu"

tf.seed(T.fresh_seed())

-- Tolerance of a result stored in dtype (relative, on top of f32 libm error).
local RTOL = { f32 = 2e-6, f64 = 1e-12, f16 = 1e-3, bf16 = 8e-3 }
-- Absolute tolerance where relative precision runs out: f16 subnormals are
-- spaced 2^-24 apart; f32 libm results near zero.
local ATOL = { f32 = 1e-7, f64 = 0, f16 = 6e-8, bf16 = 0 }

local function rand(shape, dtype, lo, hi)
  local x = tf.rand(shape, { device = cpu, dtype = "f64" }) * (hi - lo) + lo
  return x:to(dtype)
end

local function map(v, fn)
  if type(v) == "table" then
    local out = {}
    for i, x in ipairs(v) do out[i] = map(x, fn) end
    return out
  end
  return fn(v)
end

local function gelu(x)
  -- erf via math: Lua has no erf; use a high-precision series/continued fraction
  local function erf(z)
    local t = 1 / (1 + 0.5 * math.abs(z))
    local y = 1 - t * math.exp(-z * z - 1.26551223 + t * (1.00002368 + t * (0.37409196 + t * (0.09678418 +
      t * (-0.18628806 + t * (0.27886807 + t * (-1.13520398 + t * (1.48851587 + t * (-0.82215223 + t * 0.17087277)))))))))
    return z >= 0 and y or -y
  end
  return 0.5 * x * (1 + erf(x / math.sqrt(2)))
end

local UNARY = {
  neg = { function(x) return -x end, -3, 3 },
  abs = { math.abs, -3, 3 },
  relu = { function(x) return x < 0 and 0 or x end, -3, 3 },
  square = { function(x) return x * x end, -3, 3 },
  exp = { math.exp, -4, 4 },
  log = { math.log, 0.01, 10 },
  sqrt = { math.sqrt, 0, 10 },
  rsqrt = { function(x) return 1 / math.sqrt(x) end, 0.01, 10 },
  sigmoid = { function(x) return 1 / (1 + math.exp(-x)) end, -6, 6 },
  silu = { function(x) return x / (1 + math.exp(-x)) end, -6, 6 },
  gelu = { gelu, -4, 4, 1e-6 },
  tanh = { function(x) return (math.exp(2 * x) - 1) / (math.exp(2 * x) + 1) end, -3, 3 },
  sin = { math.sin, -6, 6 },
  cos = { math.cos, -6, 6 },
}

T.test("unary ops match double-precision references in every float dtype", function()
  for name, spec in pairs(UNARY) do
    for dtype, rtol in pairs(RTOL) do
      local x = rand({ 7, 33 }, dtype, spec[2], spec[3])
      local y = tf[name](x)
      T.eq(y.dtype, dtype, name)
      local ref = map(x:tolist(), spec[1])
      -- gelu's reference erf is good to ~1e-7 absolute
      T.near(y, ref, rtol, (spec[4] or 0) + ATOL[dtype], name .. " " .. dtype)
      T.near(x[name](x), ref, rtol, (spec[4] or 0) + ATOL[dtype], "method " .. name)
    end
  end
end)

T.test("integer ops are exact and float-only ops promote integers to f32", function()
  local i = tf.tensor({ -3, 0, 5 }, { device = cpu, dtype = "i32" })
  T.eq(tf.neg(i):tolist(), { 3, 0, -5 })
  T.eq(tf.abs(i):tolist(), { 3, 0, 5 })
  T.eq(tf.relu(i):tolist(), { 0, 0, 5 })
  T.eq(tf.square(i).dtype, "i32")
  T.eq(tf.exp(i).dtype, "f32")
  T.eq(tf.sqrt(tf.tensor({ 4, 9 }, { device = cpu })):tolist(), { 2.0, 3.0 })
  T.eq(tf.exp(tf.tensor({ true }, { device = cpu })).dtype, "f32")
  T.raises(function() tf.neg(tf.tensor({ true }, { device = cpu })) end, "neg does not support dtype bool")
  local big = tf.tensor({ 1 << 40 }, { device = cpu, dtype = "i64" })
  T.eq((big * 3):tolist(), { 3 * (1 << 40) })
end)

T.test("NaN and infinities propagate like PyTorch", function()
  local x = tf.tensor({ 0 / 0, math.huge, -math.huge, 1 }, { device = cpu })
  local r = tf.relu(x):tolist()
  T.ok(r[1] ~= r[1], "relu(nan) is nan")
  T.eq({ r[2], r[3], r[4] }, { math.huge, 0.0, 1.0 })
  local m = tf.maximum(x, tf.zeros(4, { device = cpu })):tolist()
  T.ok(m[1] ~= m[1], "maximum(nan, 0) is nan")
  local m2 = tf.maximum(tf.zeros(4, { device = cpu }), x):tolist()
  T.ok(m2[1] ~= m2[1], "maximum(0, nan) is nan")
  local mx = x:max():item()
  T.ok(mx ~= mx, "max over a nan is nan")
end)

local function bin_ref(name)
  return ({
    add = function(a, b) return a + b end,
    sub = function(a, b) return a - b end,
    mul = function(a, b) return a * b end,
    div = function(a, b) return a / b end,
    maximum = math.max,
    minimum = math.min,
    pow = function(a, b) return a ^ b end,
  })[name]
end

-- Broadcast a (2, 1, 4) table against (3, 4) by hand.
local function broadcast_ref(a, b, fn)
  local out = {}
  for i = 1, 2 do
    out[i] = {}
    for j = 1, 3 do
      out[i][j] = {}
      for k = 1, 4 do out[i][j][k] = fn(a[i][1][k], b[j][k]) end
    end
  end
  return out
end

T.test("binary ops broadcast and match references", function()
  for _, name in ipairs({ "add", "sub", "mul", "div", "maximum", "minimum", "pow" }) do
    for dtype, rtol in pairs(RTOL) do
      local a = rand({ 2, 1, 4 }, dtype, 0.5, 2)
      local b = rand({ 3, 4 }, dtype, 0.5, 2)
      local y = tf[name](a, b)
      T.eq(tostring(y.shape), "(2, 3, 4)")
      T.near(y, broadcast_ref(a:tolist(), b:tolist(), bin_ref(name)), rtol, 0, name .. " " .. dtype)
    end
  end
end)

T.test("scalars on either side, and Tensor metamethods", function()
  local x = tf.tensor({ 1, 2, 4 }, { device = cpu, dtype = "f32" })
  T.eq((x + 1):tolist(), { 2.0, 3.0, 5.0 })
  T.eq((1 - x):tolist(), { 0.0, -1.0, -3.0 })
  T.eq((x * 0.5):tolist(), { 0.5, 1.0, 2.0 })
  T.eq((8 / x):tolist(), { 8.0, 4.0, 2.0 })
  T.eq((x / 8):tolist(), { 0.125, 0.25, 0.5 })
  T.eq((x ^ 2):tolist(), { 1.0, 4.0, 16.0 })
  T.eq((-x):tolist(), { -1.0, -2.0, -4.0 })
  T.eq((x - x):tolist(), { 0.0, 0.0, 0.0 })
  T.eq(tf.maximum(x, 2):tolist(), { 2.0, 2.0, 4.0 })
  T.eq(tf.minimum(3, x):tolist(), { 1.0, 2.0, 3.0 })
  -- f16: the scalar is applied in float, then rounded once (0.1 is not rounded to f16 first)
  local h = tf.tensor({ 3 }, { device = cpu, dtype = "f16" })
  T.eq((h * 0.1):tolist()[1], tf.tensor({ 3 * 0.1 }, { device = cpu }):to("f16"):tolist()[1])
end)

T.test("type promotion follows PyTorch", function()
  local function t(dtype) return tf.ones(2, { device = cpu, dtype = dtype }) end
  local cases = {
    { "f16", "f32", "f32" }, { "bf16", "f16", "f32" }, { "bf16", "bf16", "bf16" }, { "i32", "i64", "i64" },
    { "i64", "f16", "f16" }, { "i32", "f64", "f64" }, { "f32", "f64", "f64" },
  }
  for _, c in ipairs(cases) do
    T.eq((t(c[1]) + t(c[2])).dtype, c[3], c[1] .. " + " .. c[2])
    T.eq((t(c[2]) * t(c[1])).dtype, c[3], c[2] .. " * " .. c[1])
  end
  T.eq((t("i32") / t("i32")).dtype, "f32")
  T.eq((t("i32") / t("i32")):tolist(), { 1.0, 1.0 })
  T.eq((t("i32") + 1).dtype, "i32")
  T.eq((t("i64") * 2.5).dtype, "f32")
  T.eq((t("f16") * 2.5).dtype, "f16")
  T.eq((t("bf16") + 1).dtype, "bf16")
  T.eq((t("i64") ^ 2).dtype, "f32")
  T.raises(function() return t("bool") + t("bool") end, "add does not support dtype bool")
  T.raises(function() return tf.ones(2, { device = cpu }) + tf.ones(3, { device = cpu }) end,
    "shapes (2,) and (3,) cannot be broadcast")
end)

T.test("reductions over a dim or everything, with keepdim", function()
  for dtype, rtol in pairs(RTOL) do
    local x = rand({ 3, 5, 4 }, dtype, -2, 2)
    local v = x:tolist()
    -- sum over dim 1 by hand
    local s1, mx = {}, -math.huge
    for i = 1, 3 do
      s1[i] = {}
      for k = 1, 4 do
        local acc = 0
        for j = 1, 5 do
          acc = acc + v[i][j][k]
          mx = math.max(mx, v[i][j][k])
        end
        s1[i][k] = acc
      end
    end
    T.near(x:sum(1), s1, rtol, rtol * 4, "sum dim 1 " .. dtype)
    T.eq(tostring(x:sum(1, true).shape), "(3, 1, 4)")
    T.near(x:mean(-2), map(s1, function(a) return a / 5 end), rtol, rtol, "mean dim -2 " .. dtype)
    T.near(x:max(), mx, rtol, 0, "max " .. dtype)
    T.eq(x:max().ndim, 0)
    local total = 0
    for _, row in ipairs(s1) do for _, a in ipairs(row) do total = total + a end end
    T.near(x:sum(), total, rtol, rtol * 20, "sum all " .. dtype)
    T.near(x:min(0), map(v[1], function() return 0 end), 1, 3, "min dim 0 is in range")
  end
  local ints = tf.tensor({ { 1, 2 }, { 3, 4 } }, { device = cpu, dtype = "i32" })
  T.eq(ints:sum().dtype, "i64")
  T.eq(ints:sum(0):tolist(), { 4, 6 })
  T.eq(ints:max(1):tolist(), { 2, 4 })
  T.eq(tf.tensor({ true, true, false }, { device = cpu }):sum():item(), 2)
  T.raises(function() ints:mean() end, "mean does not support dtype i32")
  T.eq(tf.zeros(0, 3, { device = cpu }):sum(0):tolist(), { 0.0, 0.0, 0.0 })
  T.ok(tf.zeros(0, { device = cpu }):mean():item() ~= tf.zeros(0, { device = cpu }):mean():item(), "mean of empty is nan")
  T.raises(function() tf.zeros(0, { device = cpu }):max() end, "max of an empty tensor")
  T.raises(function() ints:sum(2) end, "dimension 2 out of range")
end)

local function matmul_ref(a, b)
  local m, k, n = #a, #b, #b[1]
  local c = {}
  for i = 1, m do
    c[i] = {}
    for j = 1, n do
      local acc = 0
      for p = 1, k do acc = acc + a[i][p] * b[p][j] end
      c[i][j] = acc
    end
  end
  return c
end

T.test("matmul: 2-D, transposed views, batched, broadcast and vectors", function()
  for dtype, rtol in pairs(RTOL) do
    local a, b = rand({ 5, 7 }, dtype, -1, 1), rand({ 7, 3 }, dtype, -1, 1)
    local tol = dtype == "f64" and 1e-12 or rtol * 2
    T.near(tf.matmul(a, b), matmul_ref(a:tolist(), b:tolist()), tol, tol, "matmul " .. dtype)
    local at = rand({ 7, 5 }, dtype, -1, 1):t() -- (5, 7) stored transposed
    local bt = rand({ 3, 7 }, dtype, -1, 1):t()
    T.near(at:matmul(bt), matmul_ref(at:tolist(), bt:tolist()), tol, tol, "transposed " .. dtype)
  end
  local a, b = rand({ 2, 1, 3, 4 }, "f32", -1, 1), rand({ 5, 4, 2 }, "f32", -1, 1)
  local c = tf.matmul(a, b)
  T.eq(tostring(c.shape), "(2, 5, 3, 2)")
  local av, bv, cv = a:tolist(), b:tolist(), c:tolist()
  for i = 1, 2 do
    for j = 1, 5 do T.near(cv[i][j], matmul_ref(av[i][1], bv[j]), 1e-5, 1e-6, "broadcast batch") end
  end
  local v = rand({ 4 }, "f32", -1, 1)
  local m = rand({ 3, 4 }, "f32", -1, 1)
  local mv = tf.matmul(m, v)
  T.eq(tostring(mv.shape), "(3,)")
  local col = map(v:tolist(), function(x) return { x } end)
  T.near(mv, map(matmul_ref(m:tolist(), col), function(x) return x end), 1e-5, 1e-6)
  T.eq(tf.matmul(v, v).ndim, 0)
  T.eq(tf.matmul(tf.zeros(2, 0, { device = cpu }), tf.zeros(0, 3, { device = cpu })):tolist(),
    { { 0.0, 0.0, 0.0 }, { 0.0, 0.0, 0.0 } })
  T.raises(function() tf.matmul(tf.ones(2, 3, { device = cpu }), tf.ones(2, 3, { device = cpu })) end,
    "do not fit (inner dimensions 3 and 2)")
  T.raises(function() tf.matmul(tf.ones(2, 2, { device = cpu }), tf.ones(2, 2, { device = cpu, dtype = "f16" })) end,
    "different dtypes")
  T.raises(function() tf.matmul(tf.ones(2, 2, { device = cpu, dtype = "i32" }), tf.ones(2, 2, { device = cpu, dtype = "i32" })) end,
    "matmul does not support dtype i32")
end)

T.test("matmul: a long inner dimension, cut into chunks added in order, in every dtype", function()
  -- 3 x 1300 times 1300 x 2: one tile, K in five chunks (kernels/cpu/gemm.c)
  for dtype, rtol in pairs(RTOL) do
    local a, b = rand({ 3, 1300 }, dtype, -1, 1), rand({ 1300, 2 }, dtype, -1, 1)
    -- sums of 1300 terms (results about 12 in size): a relative bound, and an absolute one near zero
    local rt, at = dtype == "f64" and 1e-12 or rtol, dtype == "f64" and 1e-10 or rtol * 50
    T.near(tf.matmul(a, b), matmul_ref(a:tolist(), b:tolist()), rt, at, "long K " .. dtype)
    local bt = rand({ 2, 1300 }, dtype, -1, 1)
    T.near(tf.matmul(a, bt:t()), matmul_ref(a:tolist(), bt:t():tolist()), rt, at, "long K, B transposed " .. dtype)
  end
end)

T.test("random numbers: reproducible by seed, right ranges and moments", function()
  tf.seed(123)
  local a = tf.randn(1000, { device = cpu })
  local u = tf.rand(1000, { device = cpu })
  tf.seed(123)
  T.eq(tf.randn(1000, { device = cpu }):tolist(), a:tolist())
  T.eq(tf.rand(1000, { device = cpu }):tolist(), u:tolist())
  T.ok(tf.randn(1000, { device = cpu }):sum():item() ~= a:sum():item(), "the stream moves on")
  T.eq(tf.initial_seed(), 123)
  local n = tf.randn(200000, { device = cpu, dtype = "f64" })
  T.near(n:mean():item(), 0, 0, 0.02)
  T.near(((n * n):mean()):item(), 1, 0.02)
  local r = tf.rand(100000, { device = cpu })
  T.ok(r:min():item() >= 0 and r:max():item() < 1)
  local k = tf.randint(-2, 3, { 10000 }, { device = cpu })
  T.eq(k.dtype, "i64")
  T.eq(k:min():item(), -2)
  T.eq(k:max():item(), 2)
  T.eq(tf.randn(3, { device = cpu, dtype = "bf16" }).dtype, "bf16")
end)

T.run()
