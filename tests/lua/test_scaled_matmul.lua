-- tf.scaled_matmul, FP8 products: the CPU's against the same product of the
-- decoded values in f32 (tensorwise and rowwise scales, every dtype pair
-- and output, amax), the layouts and arguments it refuses; on a GPU the
-- cuBLASLt product against the CPU twin on fresh random inputs (skipped,
-- said so, without one).
local T = require "harness"
local seed = T.fresh_seed()
tf.seed(seed)
tf.set_device("cpu") -- the CPU product is the reference; the GPU's case moves its operands itself

-- a (m, k) and w (n, k) in 8-bit floats, values spread over the format's range by scale.
local function operands(m, n, k, da, db, device)
  local a = tf.cast(tf.randn({ m, k }, { device = device }) * 40, da or "f8e4m3", { saturate = true })
  local w = tf.cast(tf.randn({ n, k }, { device = device }) * 40, db or "f8e4m3", { saturate = true })
  return a, w
end

-- The product from the decoded values, in f32, scaled as scaled_matmul scales it.
local function reference(a, w, sa, sb)
  local c = a:to("f32"):matmul(w:to("f32"):t())
  if tf.is_tensor(sa) then return c * sa * sb end
  return c * (sa * sb)
end

T.test("tensorwise scales: the product of the decoded values", function()
  for _, pair in ipairs({ { "f8e4m3", "f8e4m3" }, { "f8e4m3", "f8e5m2" }, { "f8e5m2", "f8e4m3" } }) do
    local a, w = operands(37, 48, 64, pair[1], pair[2])
    local c = tf.scaled_matmul(a, w:t(), { scale_a = 0.5, scale_b = 0.25, out_dtype = "f32" })
    T.eq(c.dtype, "f32")
    T.eq(c.shape, { 37, 48 })
    T.ok(T.relerr(c, reference(a, w, 0.5, 0.25)) < 1e-6, pair[1] .. " x " .. pair[2])
  end
end)

T.test("bf16 and f16 outputs are the f32 product rounded once", function()
  local a, w = operands(16, 32, 96)
  local s = { scale_a = tf.tensor({ 2.0 }), scale_b = tf.tensor(0.125) }
  local c32 = tf.scaled_matmul(a, w:t(), { scale_a = s.scale_a, scale_b = s.scale_b, out_dtype = "f32" })
  for _, d in ipairs({ "bf16", "f16" }) do
    local c = tf.scaled_matmul(a, w:t(), { scale_a = s.scale_a, scale_b = s.scale_b, out_dtype = d })
    T.eq(c.dtype, d)
    T.eq((c:to("f32") - c32:to(d):to("f32")):abs():max():item(), 0.0, d .. " rounding")
  end
  -- bf16 is the default output
  T.eq(tf.scaled_matmul(a, w:t(), { scale_a = 1, scale_b = 1 }).dtype, "bf16")
end)

T.test("rowwise scales: one a row, one a column", function()
  local m, n = 24, 32
  local a, w = operands(m, n, 48)
  local sa, sb = tf.rand({ m, 1 }) + 0.5, tf.rand({ 1, n }) + 0.5
  local c = tf.scaled_matmul(a, w:t(), { scale_a = sa, scale_b = sb, out_dtype = "f32" })
  T.ok(T.relerr(c, reference(a, w, sa, sb)) < 1e-6, "rowwise")
  -- vectors of m and n values are the same scales
  local c2 = tf.scaled_matmul(a, w:t(), { scale_a = sa:reshape({ m }), scale_b = sb:reshape({ n }), out_dtype = "f32" })
  T.eq((c2 - c):abs():max():item(), 0.0, "(m,) and (n,) scales")
end)

T.test("amax is the largest magnitude of the result", function()
  local a, w = operands(40, 64, 32)
  local c, amax = tf.scaled_matmul(a, w:t(), { scale_a = 0.75, scale_b = 0.5, out_dtype = "f32", amax = true })
  T.eq(amax.shape, {})
  T.eq(amax.dtype, "f32")
  T.eq(amax:item(), c:abs():max():item())
  local _, none = tf.scaled_matmul(a, w:t(), { scale_a = 1, scale_b = 1 })
  T.eq(none, nil, "no amax unless asked")
end)

T.test("empty and one-row products", function()
  local a, w = operands(1, 16, 16)
  T.ok(T.relerr(tf.scaled_matmul(a, w:t(), { scale_a = 1, scale_b = 1, out_dtype = "f32" }), reference(a, w, 1, 1))
    < 1e-6, "m = 1")
  local e = tf.zeros({ 0, 16 }):to("f8e4m3")
  local c, amax = tf.scaled_matmul(e, w:t(), { scale_a = 1, scale_b = 1, amax = true })
  T.eq(c.shape, { 0, 16 })
  T.eq(amax:item(), 0.0)
end)

T.test("NaN in an operand makes amax NaN", function()
  local _, w = operands(16, 16, 16)
  local rows = {}
  for i = 1, 16 do
    rows[i] = {}
    for j = 1, 16 do rows[i][j] = (i == 7 and j == 3) and 0 / 0 or (i - j) / 4 end
  end
  local a = tf.tensor(rows):to("f8e4m3")
  local _, amax = tf.scaled_matmul(a, w:t(), { scale_a = 1, scale_b = 1, amax = true })
  T.ok(amax:item() ~= amax:item(), "amax NaN")
end)

T.test("bad arguments are named errors", function()
  local a, w = operands(16, 48, 32)
  local ok = { scale_a = 1, scale_b = 1 }
  T.raises(function() return tf.scaled_matmul(a:to("bf16"), w:t(), ok) end, "a and b must be f8e4m3 or f8e5m2")
  T.raises(function() return tf.scaled_matmul(a:to("f8e5m2"), w:to("f8e5m2"):t(), ok) end, "cannot both be f8e5m2")
  T.raises(function() return tf.scaled_matmul(a, w, ok) end, "a must be (m, k) and b (k, n)")
  T.raises(function() return tf.scaled_matmul(a, w:t():contiguous(), ok) end, "b column-major")
  T.raises(function() return tf.scaled_matmul(a:t():contiguous():t(), w:t(), ok) end, "a must be row-major")
  local a2, w2 = operands(16, 24, 32)
  T.raises(function() return tf.scaled_matmul(a2, w2:t(), ok) end, "multiples of 16")
  T.raises(function() return tf.scaled_matmul(a, w:t(), { scale_a = 1 }) end, "scale_b must be a number or an f32 tensor")
  T.raises(function() return tf.scaled_matmul(a, w:t(), { scale_a = tf.tensor(1.0, { dtype = "f64" }), scale_b = 1 }) end,
    "scale_a must be f32")
  T.raises(function() return tf.scaled_matmul(a, w:t(), { scale_a = tf.ones({ 16, 1 }), scale_b = 1 }) end,
    "scale_b has shape ()")
  T.raises(function() return tf.scaled_matmul(a, w:t(), { scale_a = tf.ones({ 8, 1 }), scale_b = tf.ones({ 1, 48 }) }) end,
    "rowwise scales have 16 values")
  T.raises(function() return tf.scaled_matmul(a, w:t(), { scale_a = 1, scale_b = 1, out_dtype = "f8e4m3" }) end,
    "out_dtype must be bf16, f16 or f32")
  T.raises(function() return tf.scaled_matmul(a, w:t(), { scale_a = 1, scale_b = 1, scales = 2 }) end,
    "unknown option")
  T.raises(function() return tf.scaled_matmul(a, w:t(), { scale_a = 1, scale_b = 1, amax = "yes" }) end,
    "amax must be a boolean")
end)

T.test("PyTorch's torch._scaled_mm on the same operands (its oracle file)", function()
  local path = "tests/reference/oracles/scaled_mm.safetensors"
  if not io.open(path, "rb") then T.skip_test(path .. " is not here (tests/reference/torch_gemm.py --oracle writes it)") end
  local o = tf.safetensors.load(path, { device = "cpu" })
  local function check(name, got, tol)
    local e = T.relerr(got, o[name])
    print(string.format("  %s on %s: rel. error %.3g from torch's", name, got.device, e))
    T.ok(e <= tol, string.format("%s on %s: rel. error %.3g against torch (at most %g)", name, got.device, e, tol))
  end
  if tf.cuda.is_available() then -- the GPU's product beside torch's, both cuBLASLt's
    local g = {}
    for k, v in pairs(o) do g[k] = v:cuda() end
    check("tensorwise_f32", tf.scaled_matmul(g.a, g.w:t(), { scale_a = g.scale_a, scale_b = g.scale_b,
      out_dtype = "f32" }), 1e-3)
    check("rowwise_bf16", tf.scaled_matmul(g.a, g.w:t(), { scale_a = g.row_a, scale_b = g.row_b }), 1e-2)
  end
  -- torch's is the GPU's product, whose sums are narrower than f32 (the GPU case below)
  check("tensorwise_f32", tf.scaled_matmul(o.a, o.w:t(), { scale_a = o.scale_a, scale_b = o.scale_b, out_dtype = "f32" }),
    1e-3)
  check("tensorwise_bf16", tf.scaled_matmul(o.a, o.w:t(), { scale_a = o.scale_a, scale_b = o.scale_b }), 1e-2)
  check("rowwise_bf16", tf.scaled_matmul(o.a, o.w:t(), { scale_a = o.row_a, scale_b = o.row_b }), 1e-2)
  if o.e4m3_e5m2_f32 then
    check("e4m3_e5m2_f32", tf.scaled_matmul(o.a, o.w5:t(), { scale_a = o.scale_a, scale_b = o.scale_b,
      out_dtype = "f32" }), 1e-3)
  end
end)

T.test("on the GPU: cuBLASLt's product is the CPU's twin", function()
  if not tf.cuda.is_available() then T.skip_test("no GPU is present") end
  local cases = {
    { 128, 256, 512, "f8e4m3", "f8e4m3" }, { 77, 64, 1024, "f8e4m3", "f8e5m2" }, { 256, 128, 64, "f8e5m2", "f8e4m3" },
    { 1, 48, 256, "f8e4m3", "f8e4m3" }, { 1000, 2048, 2560, "f8e4m3", "f8e4m3" },
  }
  for _, cs in ipairs(cases) do
    local m, n, k = cs[1], cs[2], cs[3]
    local a, w = operands(m, n, k, cs[4], cs[5])
    local ga, gw = a:cuda(), w:cuda()
    local name = string.format("(%d, %d, %d) %s x %s", m, n, k, cs[4], cs[5])
    for _, out in ipairs({ "f32", "bf16" }) do
      -- Hopper's tensor cores sum FP8 products in fewer bits than f32 (cuBLASLt promotes the sums to f32
      -- now and then, unless fast_accum): torch._scaled_mm's f32 results are 1.3e-4 from the exact
      -- product at k = 128 (the oracle case above), so f32 results get 1e-3
      local tol = 1e-3 if out == "bf16" then tol = 1e-2 end
      local want, want_amax = tf.scaled_matmul(a, w:t(), { scale_a = 0.5, scale_b = 0.25, out_dtype = out, amax = true })
      local got, got_amax = tf.scaled_matmul(ga, gw:t(), { scale_a = 0.5, scale_b = 0.25, out_dtype = out, amax = true })
      T.eq(got.device, "cuda:0")
      local e = T.relerr(got, want)
      print(string.format("  %s into %s: rel. error %.3g from the CPU's", name, out, e))
      T.ok(e <= tol, string.format("%s into %s: rel. error %.3g", name, out, e))
      T.near(got_amax:item(), want_amax:item(), tol, 0, name .. " amax into " .. out)
      -- rowwise
      local sa, sb = tf.rand({ m, 1 }) + 0.5, tf.rand({ 1, n }) + 0.5
      local wr = tf.scaled_matmul(a, w:t(), { scale_a = sa, scale_b = sb, out_dtype = out })
      local gr = tf.scaled_matmul(ga, gw:t(), { scale_a = sa:cuda(), scale_b = sb:cuda(), out_dtype = out })
      e = T.relerr(gr, wr)
      T.ok(e <= tol, string.format("%s rowwise into %s: rel. error %.3g", name, out, e))
    end
    local fast = tf.scaled_matmul(ga, gw:t(), { scale_a = 1, scale_b = 1, out_dtype = "f32", fast_accum = true })
    local e = T.relerr(fast, tf.scaled_matmul(a, w:t(), { scale_a = 1, scale_b = 1, out_dtype = "f32" }))
    T.ok(e <= 1e-2, string.format("%s fast accumulation: rel. error %.3g", name, e))
  end
  local a, w = operands(16, 16, 16)
  T.raises(function() return tf.scaled_matmul(a:cuda(), w:t(), { scale_a = 1, scale_b = 1 }) end, "is on cpu")
  T.raises(function() return tf.scaled_matmul(a:cuda(), w:cuda():t(), { scale_a = tf.tensor(1.0), scale_b = 1 }) end,
    "scale_a is on cpu")
  -- a scale inside another tensor, off a 16-byte boundary: refused before cuBLASLt refuses it at launch
  local s = tf.ones({ 8 }, { device = "cuda" })
  T.raises(function() return tf.scaled_matmul(a:cuda(), w:cuda():t(), { scale_a = s:narrow(0, 1, 1), scale_b = 1 }) end,
    "16-byte boundary")
  T.eq(tf.scaled_matmul(a:cuda(), w:cuda():t(), { scale_a = s:narrow(0, 4, 1), scale_b = 1 }).shape, { 16, 16 },
    "16 bytes in is a boundary")
end)

T.run()
