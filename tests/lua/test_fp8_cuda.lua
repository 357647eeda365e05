-- The 8-bit float casts on the GPU are twins of the CPU's: the same bytes
-- for every f16 and bf16 bit pattern, for random f32 bit patterns and for
-- every code decoded, into and out of both formats, plain and saturating,
-- contiguous and strided. Skips without a GPU.
local T = require "harness"
T.require_cuda()
local seed = T.fresh_seed()

-- A tensor of raw little-endian bytes as dtype (safetensors name st), through a file.
local function from_bytes(st, n, bytes)
  local path = os.tmpname()
  local header = string.format('{"x":{"dtype":"%s","shape":[%d],"data_offsets":[0,%d]}}', st, n, #bytes)
  local f = assert(io.open(path, "wb"))
  f:write(string.pack("<I8", #header), header, bytes)
  f:close()
  local t = tf.safetensors.load(path, { device = "cpu" }).x
  os.remove(path)
  return t
end

-- The bytes of a tensor, through a file.
local function bytes_of(t)
  local path = os.tmpname()
  tf.safetensors.save(path, { x = t:cpu():contiguous() })
  local s = T.read_file(path)
  os.remove(path)
  return s:sub(#s - t.nbytes + 1)
end

local function patterns16()
  local parts = {}
  for i = 0, 65535 do parts[#parts + 1] = string.pack("<I2", i) end
  return table.concat(parts)
end

local function random32(n)
  local parts = {}
  math.randomseed(seed)
  for i = 1, n do parts[i] = string.pack("<I4", math.random(0, 0xffffffff)) end
  -- the edges: ties, overflow thresholds, NaNs, infinities, zeros
  for _, v in ipairs({ 448, 464, 480, 57344, 61440, 65536, 2 ^ -10, 2 ^ -17, 0.0, -0.0, math.huge, -math.huge }) do
    parts[#parts + 1] = string.pack("<f", v)
  end
  parts[#parts + 1] = string.pack("<I4", 0x7fc00000) .. string.pack("<I4", 0xffa00001)
  return table.concat(parts), n + 14
end

local function sources()
  local r, n = random32(100000)
  return {
    f16 = from_bytes("F16", 65536, patterns16()),
    bf16 = from_bytes("BF16", 65536, patterns16()),
    f32 = from_bytes("F32", n, r),
  }
end

T.test("casts into both formats give the CPU's bytes", function()
  for name, x in pairs(sources()) do
    local g = x:cuda()
    for _, f in ipairs({ "f8e4m3", "f8e5m2" }) do
      T.ok(bytes_of(g:to(f)) == bytes_of(x:to(f)), name .. " to " .. f)
      T.ok(bytes_of(tf.cast(g, f, { saturate = true })) == bytes_of(tf.cast(x, f, { saturate = true })),
        name .. " to " .. f .. " saturating")
      -- strided: every other element of a transposed view
      local v, gv = x:reshape({ -1, 2 }):t(), g:reshape({ -1, 2 }):t()
      T.ok(bytes_of(gv:to(f)) == bytes_of(v:to(f)), name .. " strided to " .. f)
    end
  end
end)

T.test("every code decodes to the CPU's bytes", function()
  local all = {}
  for c = 0, 255 do all[c + 1] = string.char(c) end
  all = table.concat(all)
  for f, st in pairs({ f8e4m3 = "F8_E4M3", f8e5m2 = "F8_E5M2" }) do
    local x = from_bytes(st, 256, all)
    local g = x:cuda()
    T.ok(bytes_of(g) == all, f .. " to the GPU and back")
    for _, d in ipairs({ "f32", "f16", "bf16", "f64", "f8e4m3", "f8e5m2", "i32", "bool" }) do
      T.ok(bytes_of(g:to(d)) == bytes_of(x:to(d)), f .. " to " .. d)
    end
    T.ok(bytes_of(tf.cast(g, "f8e5m2", { saturate = true })) == bytes_of(tf.cast(x, "f8e5m2", { saturate = true })),
      f .. " saturating into e5m2")
  end
end)

T.test("creation and comparisons on the GPU", function()
  local dev = { device = "cuda", dtype = "f8e4m3" }
  T.eq(tf.full({ 4 }, 1000, dev):to("f32"):tolist(), { 0 / 0, 0 / 0, 0 / 0, 0 / 0 })
  local a = tf.arange(0, 4, 0.5, dev)
  T.eq(a:cpu():tolist(), { 0.0, 0.5, 1.0, 1.5, 2.0, 2.5, 3.0, 3.5 })
  T.eq((a:gt(2)):cpu():tolist(), { false, false, false, false, false, true, true, true })
  T.eq(bytes_of(tf.zeros(5, dev)), string.rep("\0", 5))
end)

T.run()
