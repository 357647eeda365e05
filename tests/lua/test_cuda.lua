-- The CUDA backend against its CPU twin, on fresh random inputs: random
-- numbers and conversions bit-identical, ops within tolerance (f32 1e-5,
-- f64 1e-12, f16/bf16 1e-2 relative), plus GPU memory, out-of-memory and
-- timers. Skipped (exit 77) without a GPU.
local T = require "harness"
T.require_cuda()

local seed = T.fresh_seed()
local FLOATS = { "f32", "f64", "f16", "bf16" }
local TOL = { f32 = 1e-5, f64 = 1e-12, f16 = 1e-2, bf16 = 1e-2 }
print("device: " .. tf.device("cuda"))

local function both(fn)
  tf.seed(seed)
  local c = fn("cpu")
  tf.seed(seed)
  local g = fn("cuda")
  return c, g
end

local function same_values(a, b, msg)
  local x, y = a:to("cpu"):tolist(), b:to("cpu"):tolist()
  T.eq(x, y, msg)
end

T.test("random numbers are bit-identical on CPU and GPU", function()
  for _, dtype in ipairs(FLOATS) do
    local c, g = both(function(dev) return tf.randn({ 1001, 3 }, { device = dev, dtype = dtype }) end)
    T.eq(g.device, "cuda:0")
    same_values(c, g, "randn " .. dtype)
    c, g = both(function(dev) return tf.rand(777, { device = dev, dtype = dtype }) end)
    same_values(c, g, "rand " .. dtype)
  end
  for _, dtype in ipairs({ "i32", "i64", "f32" }) do
    local c, g = both(function(dev) return tf.randint(-50, 1000, { 999 }, { device = dev, dtype = dtype }) end)
    same_values(c, g, "randint " .. dtype)
  end
  -- a long stream: offsets advance the same way
  local c, g = both(function(dev)
    tf.randn(5, { device = dev })
    return tf.randn(1 << 20, { device = dev })
  end)
  T.eq(c:sum():item(), g:to("cpu"):sum():item(), "randn after an odd-sized call")
end)

T.test("conversions between all dtypes are identical", function()
  local special = { 0 / 0, math.huge, -math.huge, 1e30, -1e30, 65519.99, 65520, 2.5, -2.5, 0.5, -0.0,
    3e-8, 1e-45, 255.5, 4294967296.7, -2147483649 }
  local values = {}
  for _, v in ipairs(special) do values[#values + 1] = v end
  tf.seed(seed)
  for _, v in ipairs((tf.randn(500, { device = "cpu", dtype = "f64" }) * 1000):tolist()) do values[#values + 1] = v end
  local base = tf.tensor(values, { device = "cpu", dtype = "f64" })
  local dtypes = { "f32", "f16", "bf16", "f64", "i32", "i64", "bool" }
  for _, from in ipairs(dtypes) do
    local c = base:to(from)
    local g = c:to("cuda")
    for _, to in ipairs(dtypes) do
      local cc, gg = c:to(to), g:to(to)
      T.eq(gg.device, "cuda:0")
      same_values(cc, gg, from .. " -> " .. to)
    end
  end
end)

T.test("fill, arange and copies", function()
  for _, dtype in ipairs({ "f32", "f16", "bf16", "f64", "i32", "i64", "bool" }) do
    same_values(tf.full({ 3, 5 }, 2.75, { device = "cpu", dtype = dtype }),
      tf.full({ 3, 5 }, 2.75, { device = "cuda", dtype = dtype }), "full " .. dtype)
  end
  same_values(tf.arange(-3, 5, 0.37, { device = "cpu" }), tf.arange(-3, 5, 0.37, { device = "cuda" }), "arange")
  local x = tf.randn(7, 9, { device = "cpu" })
  same_values(x, x:to("cuda"):t():contiguous():t():to("cpu"), "strided copy on the GPU")
  same_values(x:t(), x:t():to("cuda"), "a strided CPU view to the GPU")
  local g = tf.zeros(7, 9, { device = "cuda" })
  g:copy_(x:to("cuda"))
  same_values(g, x, "copy_ on the GPU")
  g:narrow(1, 2, 3):fill_(1)
  x:narrow(1, 2, 3):fill_(1)
  same_values(g, x, "fill_ of a view")
end)

local DOMAIN = {
  log = { 0.01, 10 }, sqrt = { 0, 10 }, rsqrt = { 0.01, 10 }, exp = { -5, 5 },
}

T.test("unary ops match the CPU in every dtype", function()
  local names = { "neg", "abs", "relu", "square", "exp", "log", "sqrt", "rsqrt", "sigmoid", "silu", "gelu", "tanh",
    "sin", "cos" }
  for _, name in ipairs(names) do
    local lo, hi = table.unpack(DOMAIN[name] or { -4, 4 })
    for _, dtype in ipairs(FLOATS) do
      local x = (tf.rand({ 65, 129 }, { device = "cpu", dtype = "f64" }) * (hi - lo) + lo):to(dtype)
      local c, g = tf[name](x), tf[name](x:to("cuda"))
      T.eq(g.dtype, c.dtype)
      T.ok(T.relerr(g, c) <= TOL[dtype], name .. " " .. dtype .. " relerr " .. T.relerr(g, c))
      -- strided input: a transposed view
      local ct, gt = tf[name](x:t()), tf[name](x:to("cuda"):t())
      T.ok(T.relerr(gt, ct) <= TOL[dtype], name .. " strided " .. dtype)
    end
    if name == "neg" or name == "abs" or name == "relu" or name == "square" then
      for _, dtype in ipairs({ "i32", "i64" }) do
        local x = tf.randint(-1000, 1000, { 300 }, { device = "cpu", dtype = dtype })
        same_values(tf[name](x), tf[name](x:to("cuda")), name .. " " .. dtype)
      end
    end
  end
end)

T.test("binary ops, broadcasting, scalars and promotion match the CPU", function()
  for _, name in ipairs({ "add", "sub", "mul", "div", "maximum", "minimum", "pow" }) do
    for _, dtype in ipairs(FLOATS) do
      local a = (tf.rand({ 4, 1, 33 }, { device = "cpu", dtype = "f64" }) + 0.5):to(dtype)
      local b = (tf.rand({ 17, 33 }, { device = "cpu", dtype = "f64" }) + 0.5):to(dtype)
      local c, g = tf[name](a, b), tf[name](a:to("cuda"), b:to("cuda"))
      T.ok(T.relerr(g, c) <= TOL[dtype], name .. " " .. dtype)
      c, g = tf[name](a, 1.7), tf[name](a:to("cuda"), 1.7)
      T.ok(T.relerr(g, c) <= TOL[dtype], name .. " scalar right " .. dtype)
      c, g = tf[name](2.5, b:t()), tf[name](2.5, b:to("cuda"):t())
      T.ok(T.relerr(g, c) <= TOL[dtype], name .. " scalar left, strided " .. dtype)
    end
  end
  for _, dtype in ipairs({ "i32", "i64" }) do
    local a = tf.randint(-1000, 1000, { 5, 1, 7 }, { device = "cpu", dtype = dtype })
    local b = tf.randint(-1000, 1000, { 3, 7 }, { device = "cpu", dtype = dtype })
    for _, name in ipairs({ "add", "sub", "mul", "maximum", "minimum" }) do
      same_values(tf[name](a, b), tf[name](a:to("cuda"), b:to("cuda")), name .. " " .. dtype)
      same_values(tf[name](a, 7), tf[name](a:to("cuda"), 7), name .. " scalar " .. dtype)
    end
    same_values(a / b, a:to("cuda") / b:to("cuda"), "integer division gives f32")
  end
  local h, f = tf.randn(10, { device = "cpu", dtype = "f16" }), tf.randn(10, { device = "cpu" })
  T.eq((h:to("cuda") + f:to("cuda")).dtype, "f32")
  T.ok(T.relerr(h:to("cuda") + f:to("cuda"), h + f) <= 1e-6)
  T.raises(function() return tf.ones(2, { device = "cuda" }) + tf.ones(2, { device = "cpu" }) end,
    "operands are on different devices (cuda:0 and cpu)")
end)

T.test("reductions match the CPU, including large ones", function()
  for _, dtype in ipairs(FLOATS) do
    local x = tf.randn({ 6, 300, 70 }, { device = "cpu", dtype = dtype })
    local g = x:to("cuda")
    for _, name in ipairs({ "sum", "mean", "max", "min" }) do
      for _, dim in ipairs({ 0, 1, 2, -1 }) do
        local tol = (name == "sum" or name == "mean") and TOL[dtype] * (dtype == "f32" and 10 or 1) or 0
        T.ok(T.relerr(g[name](g, dim), x[name](x, dim)) <= tol, name .. " dim " .. dim .. " " .. dtype)
      end
      -- a full sum is rounded once to dtype: the two backends may land on neighbouring values
      local c1, g1 = x[name](x), g[name](g)
      local atol = ({ sum = TOL[dtype] * math.sqrt(x:numel()), mean = TOL[dtype] * 1e-2 })[name] or 0
      T.near(g1:item(), c1:item(), name == "sum" and TOL[dtype] or 0, atol, name .. " all " .. dtype)
    end
  end
  -- a full reduction of 2^24 + 3 elements takes the split path
  local big = tf.rand((1 << 24) + 3, { device = "cpu" })
  T.near(big:to("cuda"):sum():item(), big:sum():item(), 1e-5, 0, "sum of 16M")
  T.near(big:to("cuda"):max():item(), big:max():item(), 0, 0, "max of 16M")
  local ints = tf.randint(-100, 100, { 1000, 37 }, { device = "cpu", dtype = "i32" })
  same_values(ints:sum(0), ints:to("cuda"):sum(0), "integer sum")
  same_values(ints:sum(), ints:to("cuda"):sum(), "integer sum of all")
  same_values(ints:max(1), ints:to("cuda"):max(1), "integer max")
  local nan = tf.tensor({ 1, 0 / 0, 3 }, { device = "cuda" })
  local m = nan:max():item()
  T.ok(m ~= m, "max propagates NaN on the GPU")
end)

T.test("matmul matches the CPU: 2-D, transposed, batched, broadcast", function()
  for _, dtype in ipairs(FLOATS) do
    for _, mnk in ipairs({ { 64, 48, 80 }, { 257, 129, 511 }, { 1, 300, 7 } }) do
      local m, n, k = table.unpack(mnk)
      local a = tf.randn(m, k, { device = "cpu", dtype = dtype })
      local b = tf.randn(k, n, { device = "cpu", dtype = dtype })
      local c = tf.matmul(a, b)
      local g = tf.matmul(a:to("cuda"), b:to("cuda"))
      T.ok(T.relerr(g, c) <= TOL[dtype], string.format("matmul %s %dx%dx%d: %g", dtype, m, n, k, T.relerr(g, c)))
      local gt = tf.matmul(a:t():contiguous():to("cuda"):t(), b:t():contiguous():to("cuda"):t())
      T.ok(T.relerr(gt, c) <= TOL[dtype], "transposed operands " .. dtype)
    end
    local a = tf.randn(3, 1, 33, 20, { device = "cpu", dtype = dtype })
    local b = tf.randn(5, 20, 9, { device = "cpu", dtype = dtype })
    T.ok(T.relerr(tf.matmul(a:to("cuda"), b:to("cuda")), tf.matmul(a, b)) <= TOL[dtype], "broadcast batch " .. dtype)
    local v = tf.randn(9, { device = "cpu", dtype = dtype })
    T.ok(T.relerr(tf.matmul(b:to("cuda"), v:to("cuda")), tf.matmul(b, v)) <= TOL[dtype], "matrix-vector " .. dtype)
  end
  -- TF32 is opt-in and stays within TF32's accuracy
  local a, b = tf.randn(256, 256, { device = "cuda" }), tf.randn(256, 256, { device = "cuda" })
  local strict = tf.matmul(a, b)
  T.eq(tf.allow_tf32(true, "cuda"), false)
  local fast = tf.matmul(a, b)
  tf.allow_tf32(false, "cuda")
  T.ok(T.relerr(fast, strict) < 1e-2, "tf32 within 1e-2")
  T.ok(T.relerr(tf.matmul(a, b), strict) == 0, "f32 is deterministic and strict again")
end)

T.test("GPU memory: stats, out of memory as a Lua error, recovery", function()
  collectgarbage()
  tf.mem.empty_cache("cuda") -- no cached block may serve the requests below
  tf.sync()
  local s0 = tf.mem.stats("cuda")
  T.eq(s0.device, "cuda:0")
  local x = tf.zeros(1 << 20, { device = "cuda" })
  T.eq(tf.mem.stats("cuda").allocated - s0.allocated, 4 << 20)
  x:free()
  T.eq(tf.mem.stats("cuda").allocated, s0.allocated)
  -- a request no device can serve: 1 PiB
  local ok, err = pcall(tf.empty, 1 << 48, { device = "cuda" })
  T.eq(ok, false)
  T.ok(tf.mem.is_oom(err), err)
  T.ok(err:find("tried to allocate 1024.00 TiB on cuda:0", 1, true), err)
  T.eq(tf.mem.stats("cuda").allocated, s0.allocated)
  -- a limit
  tf.mem.set_limit(s0.reserved + (64 << 20), "cuda")
  ok, err = pcall(tf.zeros, 32 << 20, { device = "cuda" }) -- 128 MiB
  tf.mem.set_limit(nil, "cuda")
  T.eq(ok, false)
  T.ok(err:find("out of memory: tried to allocate 128.00 MiB on cuda:0", 1, true), err)
  -- the engine still works
  local y = tf.ones(1000, { device = "cuda" })
  T.eq(y:sum():item(), 1000.0)
  tf.mem.empty_cache("cuda")
end)

T.test("CUDA event timers and device info", function()
  local a = tf.randn(2048, 2048, { device = "cuda" })
  tf.sync()
  local t = tf.timer("cuda")
  for _ = 1, 10 do tf.matmul(a, a) end
  local ms = t:ms()
  T.ok(ms > 0 and ms < 10000, "10 matmuls took " .. ms .. " ms")
  local info = tf.device_info("cuda")
  T.ok(info.name:find("NVIDIA", 1, true), info.name)
  T.ok(info.total_memory > 1 << 30)
  T.ok(info.driver_version >= 12000 and info.runtime_version >= 12000)
  T.ok(tostring(tf.ones(2, { device = "cuda" })):find("device=cuda:0", 1, true))
  T.ok(tf.device():find("cuda:0 (", 1, true), "the default device is the GPU when present")
end)

T.run()
