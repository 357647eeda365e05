-- The 8-bit floats on the CPU: every code decoded against the format's
-- definition, casts at the edges (ties, overflow, subnormals, NaN, -0), the
-- saturating cast, creation, comparisons, printing, safetensors files,
-- tf.finfo for every float dtype, and the ops that refuse them. The
-- exhaustive casts against an independent model are tests/cli/test_fp8.py;
-- the GPU twin is tests/lua/test_fp8_cuda.lua.
local T = require "harness"
local cpu = { device = "cpu" }
local inf = math.huge
local nan = string.unpack("<d", string.pack("<I8", 0x7ff8000000000000)) -- positive (0/0 is -nan on x86)

-- The value of a code by the definition: (exponent bits, mantissa bits).
local LAYOUT = { f8e4m3 = { 4, 3 }, f8e5m2 = { 5, 2 } }
local function value(dtype, code)
  local eb, mb = LAYOUT[dtype][1], LAYOUT[dtype][2]
  local sign = code >= 128 and -1.0 or 1.0
  local e, m = (code >> mb) & ((1 << eb) - 1), code & ((1 << mb) - 1)
  local bias = (1 << (eb - 1)) - 1
  if dtype == "f8e4m3" and code & 0x7f == 0x7f then return nan end
  if dtype == "f8e5m2" and e == 31 then return m == 0 and sign * inf or nan end
  if e == 0 then return sign * m * 2.0 ^ (1 - bias - mb) end
  return sign * ((1 << mb) + m) * 2.0 ^ (e - bias - mb)
end

-- A tensor of the given codes, through a safetensors file (the only way in for raw bits).
local function codes_tensor(dtype, codes)
  local path = os.tmpname()
  local st = dtype == "f8e4m3" and "F8_E4M3" or "F8_E5M2"
  local header = string.format('{"c":{"dtype":"%s","shape":[%d],"data_offsets":[0,%d]}}', st, #codes, #codes)
  local f = assert(io.open(path, "wb"))
  f:write(string.pack("<I8", #header), header, string.char(table.unpack(codes)))
  f:close()
  local t = tf.safetensors.load(path, cpu).c
  os.remove(path)
  return t
end

-- The codes of an 8-bit tensor, through a safetensors file.
local function codes_of(t)
  local path = os.tmpname()
  tf.safetensors.save(path, { c = t:cpu() })
  local bytes = T.read_file(path)
  os.remove(path)
  return { bytes:byte(#bytes - t:numel() + 1, #bytes) }
end

local function same(a, b) return (a ~= a and b ~= b) or (a == b and 1 / a == 1 / b) or (a == b and a ~= 0) end

T.test("every code of both formats decodes to its value", function()
  local all = {}
  for c = 0, 255 do all[c + 1] = c end
  for dtype in pairs(LAYOUT) do
    local t = codes_tensor(dtype, all)
    T.eq(t.dtype, dtype)
    for _, d in ipairs({ "f32", "f64", "f16", "bf16" }) do
      local got = t:to(d):tolist()
      for c = 0, 255 do
        local want = value(dtype, c)
        T.ok(same(got[c + 1], want), string.format("%s 0x%02x to %s: %s, want %s", dtype, c, d, got[c + 1], want))
      end
    end
    T.eq(codes_of(t), all, dtype .. " codes survive a file")
  end
end)

T.test("casts at the edges: ties to even, overflow, subnormals, NaN and -0", function()
  local x = tf.tensor({ 448, 464, 464.0001, 480, inf, -inf, nan, -0.0, 0.3, 2 ^ -10, 2 ^ -10 * 1.0001, 3 * 2 ^ -10,
    57344, 61439.99, 61440, 1e-30 }, cpu)
  T.eq(codes_of(x:to("f8e4m3")), { 0x7e, 0x7e, 0x7f, 0x7f, 0x7f, 0xff, 0x7f, 0x80, 0x2a, 0x00, 0x01, 0x02,
    0x7f, 0x7f, 0x7f, 0x00 })
  T.eq(codes_of(x:to("f8e5m2")), { 0x5f, 0x5f, 0x5f, 0x60, 0x7c, 0xfc, 0x7f, 0x80, 0x35, 0x14, 0x14, 0x1a,
    0x7b, 0x7b, 0x7c, 0x00 })
  T.eq(codes_of(tf.cast(x, "f8e4m3", { saturate = true })), { 0x7e, 0x7e, 0x7e, 0x7e, 0x7e, 0xfe, 0x7f, 0x80, 0x2a,
    0x00, 0x01, 0x02, 0x7e, 0x7e, 0x7e, 0x00 })
  T.eq(codes_of(tf.cast(x, "f8e5m2", { saturate = true })), { 0x5f, 0x5f, 0x5f, 0x60, 0x7b, 0xfb, 0x7f, 0x80, 0x35,
    0x14, 0x14, 0x1a, 0x7b, 0x7b, 0x7b, 0x00 })
  T.eq(codes_of(tf.tensor({ -nan }, cpu):to("f8e4m3")), { 0xff }, "NaN keeps its sign")
  T.eq(codes_of(tf.tensor({ -nan }, cpu):to("f8e5m2")), { 0xff }, "NaN keeps its sign")
  -- an e5m2 infinity saturated into e5m2 itself, and into e4m3
  local e5 = codes_tensor("f8e5m2", { 0x7c, 0xfc, 0x7d })
  T.eq(codes_of(tf.cast(e5, "f8e5m2", { saturate = true })), { 0x7b, 0xfb, 0x7f })
  T.eq(codes_of(tf.cast(e5, "f8e4m3", { saturate = true })), { 0x7e, 0xfe, 0x7f })
  -- from bf16, f16 and f64 as PyTorch does, through f32
  T.eq(tf.tensor({ 0.3, 500 }, { device = "cpu", dtype = "bf16" }):to("f8e4m3"):to("f32"):tolist()[1], 0.3125)
  T.eq(codes_of(tf.tensor({ 464, 60000, 65504 }, { device = "cpu", dtype = "f16" }):to("f8e5m2")), { 0x5f, 0x7b, 0x7c })
  T.eq(codes_of(tf.tensor({ 464 * (1 + 2 ^ -30) }, { device = "cpu", dtype = "f64" }):to("f8e4m3")), { 0x7e })
end)

T.test("tf.cast: options and errors", function()
  local x = tf.tensor({ 1.5, 2 }, cpu)
  T.ok(rawequal(tf.cast(x, "f32"), x), "a cast to the same dtype is the tensor itself")
  T.eq(tf.cast(x, "bf16").dtype, "bf16")
  T.eq(tf.cast(x, "float8_e4m3fn").dtype, "f8e4m3")
  T.raises(function() tf.cast(x, "f16", { saturate = true }) end, "a saturating cast goes into f8e4m3 or f8e5m2, not f16")
  T.raises(function() tf.cast(x, "f8e4m3", { saturat = true }) end, "unknown option 'saturat'")
  T.raises(function() tf.cast(x, "f8e4m3", { saturate = 1 }) end, "saturate must be a boolean")
  T.raises(function() tf.cast(x, "f7") end, "unknown dtype 'f7'")
end)

T.test("creation, views, copies and comparisons", function()
  T.eq(tf.zeros({ 2, 2 }, { device = "cpu", dtype = "f8e4m3" }):to("f32"):tolist(), { { 0.0, 0.0 }, { 0.0, 0.0 } })
  T.eq(tf.full({ 3 }, 1000, { device = "cpu", dtype = "f8e5m2" }):to("f32"):tolist(), { 1024.0, 1024.0, 1024.0 })
  T.eq(tf.full({ 1 }, 1000, { device = "cpu", dtype = "f8e4m3" }):isnan():tolist(), { true }) -- as torch.full
  local a = tf.arange(0, 4, 0.5, { device = "cpu", dtype = "f8e4m3" })
  T.eq(a:tolist(), { 0.0, 0.5, 1.0, 1.5, 2.0, 2.5, 3.0, 3.5 })
  T.eq(a:element_size(), 1)
  T.eq(a:reshape({ 2, 4 }):t():contiguous():to("f32"):tolist(), { { 0.0, 2.0 }, { 0.5, 2.5 }, { 1.0, 3.0 }, { 1.5, 3.5 } })
  local b = tf.empty({ 8 }, { device = "cpu", dtype = "f8e4m3" })
  b:copy_(a)
  T.eq(b:tolist(), a:tolist())
  T.eq(tf.ones(1, { device = "cpu", dtype = "f8e5m2" }):item(), 1.0)
  T.eq(a:eq(b):tolist(), { true, true, true, true, true, true, true, true })
  T.eq((a:gt(2)):tolist(), { false, false, false, false, false, true, true, true })
  T.eq(a:le(b):tolist()[1], true)
  local n = tf.tensor({ nan, inf, 1 }, cpu)
  T.eq(n:to("f8e4m3"):isnan():tolist(), { true, true, false })
  T.eq(n:to("f8e5m2"):isfinite():tolist(), { false, false, true })
  T.raises(function() return a:eq(a:to("f8e5m2")) end, "eq: f8e4m3 and f8e5m2 operands")
  T.raises(function() return a:lt(a:to("f32")) end, "lt: f8e4m3 and f32 operands")
end)

T.test("printing", function()
  local x = tf.tensor({ 0.3, -500, 448, 1e-3 }, cpu)
  T.eq(tostring(x:to("f8e4m3")), "tensor([  0.3125,      nan, 448.0000,   0.0020], shape=(4,), dtype=f8e4m3, device=cpu)")
  T.eq(tostring(tf.tensor({ 1, 2, inf }, cpu):to("f8e5m2")), "tensor([ 1.,  2., inf], shape=(3,), dtype=f8e5m2, device=cpu)")
end)

T.test("safetensors: both formats round-trip, beside other dtypes", function()
  local path = os.tmpname()
  local x = tf.tensor({ { 0.3, -2, 448 }, { 1e-3, nan, -0.0 } }, cpu)
  local tensors = { a = x:to("f8e4m3"), b = x:to("f8e5m2"), c = x }
  tf.safetensors.save(path, tensors)
  local h = tf.safetensors.read_header(path)
  T.eq(h.a.dtype, "F8_E4M3")
  T.eq(h.b.dtype, "F8_E5M2")
  T.eq(h.a.offsets[2] - h.a.offsets[1], 6)
  local back = tf.safetensors.load(path, cpu)
  for name, t in pairs(tensors) do
    T.eq(back[name].dtype, t.dtype, name)
    T.eq(codes_of(back[name]:to(t.dtype == "f32" and "f8e4m3" or t.dtype)), codes_of(t:to(t.dtype == "f32" and
      "f8e4m3" or t.dtype)), name)
  end
  local into = { a = tf.empty({ 2, 3 }, { device = "cpu", dtype = "f8e4m3" }) }
  tf.safetensors.load_into(path, into)
  T.eq(codes_of(into.a), codes_of(tensors.a))
  T.raises(function() tf.safetensors.load_into(path, { a = tf.empty({ 2, 3 }, { device = "cpu", dtype = "f8e5m2" }) }) end,
    "tensor 'a' is F8_E4M3, not F8_E5M2")
  os.remove(path)
end)

T.test("tf.finfo of every float dtype", function()
  local want = {
    f64 = { 64, 1.7976931348623157e308, 2.2250738585072014e-308, 4.9406564584124654e-324, 2.220446049250313e-16 },
    f32 = { 32, 3.4028234663852886e38, 1.1754943508222875e-38, 1.401298464324817e-45, 1.1920928955078125e-07 },
    f16 = { 16, 65504, 6.103515625e-05, 5.960464477539063e-08, 0.0009765625 },
    bf16 = { 16, 3.3895313892515355e38, 1.1754943508222875e-38, 9.183549615799121e-41, 0.0078125 },
    f8e4m3 = { 8, 448, 0.015625, 0.001953125, 0.125 },
    f8e5m2 = { 8, 57344, 6.103515625e-05, 1.52587890625e-05, 0.25 },
  }
  for d, w in pairs(want) do
    local fi = tf.finfo(d)
    T.eq({ fi.bits, fi.max, fi.smallest_normal, fi.smallest_subnormal, fi.eps }, { w[1], w[2] + 0.0, w[3], w[4], w[5] }, d)
    T.eq(fi.min, -fi.max, d)
    T.eq(fi.tiny, fi.smallest_normal, d)
    T.eq(fi.dtype, d)
    T.eq(fi.has_inf, d ~= "f8e4m3", d)
  end
  T.eq(tf.finfo("float8_e5m2").mantissa_bits, 2)
  T.eq(tf.finfo(tf.zeros(1, { device = "cpu", dtype = "f8e4m3" })).exponent_bits, 4)
  -- each format's largest value and smallest subnormal are what a cast gives back
  for _, d in ipairs({ "f16", "bf16", "f8e4m3", "f8e5m2" }) do
    local fi = tf.finfo(d)
    T.eq(tf.tensor({ fi.max, fi.smallest_subnormal }, { device = "cpu", dtype = "f64" }):to(d):to("f64"):tolist(),
      { fi.max, fi.smallest_subnormal }, d)
  end
  T.raises(function() tf.finfo("i32") end, "finfo: i32 is not a float dtype")
end)

T.test("the ops that compute refuse 8-bit floats, saying to cast first", function()
  local a = tf.ones({ 2, 2 }, { device = "cpu", dtype = "f8e4m3" })
  local msg = "does not take f8e4m3 tensors: cast first"
  T.raises(function() return tf.matmul(a, a) end, "matmul " .. msg)
  T.raises(function() return a + a end, "add " .. msg)
  T.raises(function() return a * 2 end, "mul " .. msg)
  T.raises(function() return a:exp() end, "exp " .. msg)
  T.raises(function() return a:sum() end, "sum " .. msg)
  T.raises(function() return a:max() end, "max " .. msg)
  T.raises(function() return tf.softmax(a, -1) end, "does not take f8e4m3 tensors")
  T.raises(function() return a:requires_grad(true) end, "f8e4m3 tensors cannot require gradients")
  T.raises(function() return tf.randn(2, { device = "cpu", dtype = "f8e5m2" }) end,
    "random numbers are not drawn in f8e5m2: draw f32 and cast")
  -- a cast into an 8-bit float ends the graph
  local w = tf.ones(2, cpu):requires_grad(true)
  T.ok(w:to("bf16").grad_fn ~= nil, "a cast into bf16 is differentiable")
  T.eq(w:to("f8e4m3").grad_fn, nil)
end)

T.run()
