-- tf.safetensors: round trips of every dtype and shape, metadata, the file
-- layout, reproducible bytes, header inspection, and a table of corrupt files
-- that must each fail with their own message. Interoperability with the
-- Python library is checked in tests/cli/test_safetensors_python.py.
local T = require "harness"
local st = tf.safetensors
local cpu = { device = "cpu" }

local tmpfile = os.tmpname

local read_bytes = T.read_file

local function write_bytes(path, s)
  local f = assert(io.open(path, "wb"))
  f:write(s)
  f:close()
end

-- A file image: header length, header, data.
local function image(header, data)
  return string.pack("<I8", #header) .. header .. (data or "")
end

local function entry(dtype, shape, b, e)
  local dims = {}
  for i, d in ipairs(shape) do dims[i] = tostring(d) end
  return string.format('{"dtype":"%s","shape":[%s],"data_offsets":[%d,%d]}', dtype, table.concat(dims, ","), b, e)
end

T.test("every dtype round-trips with its values", function()
  local path = tmpfile()
  local inf, nan = math.huge, 0 / 0
  local tensors = {
    f32 = tf.tensor({ 1.5, -0.0, inf, -inf, nan, 1e-40, 3.4e38 }, { device = "cpu", dtype = "f32" }),
    f16 = tf.tensor({ 1.5, -2, 65504, 6e-8, inf, nan }, { device = "cpu", dtype = "f16" }),
    bf16 = tf.tensor({ 1.5, -2, 3e38, 1e-39, -inf, nan }, { device = "cpu", dtype = "bf16" }),
    f64 = tf.tensor({ 0.1, 1 / 3, 5e-324, -1e308, nan }, { device = "cpu", dtype = "f64" }),
    i64 = tf.tensor({ math.mininteger, -1, 0, math.maxinteger, 9007199254740993 }, cpu),
    i32 = tf.tensor({ -2147483648, -1, 0, 2147483647 }, { device = "cpu", dtype = "i32" }),
    bool = tf.tensor({ true, false, true }, cpu),
  }
  st.save(path, tensors)
  local back, meta = st.load(path, cpu)
  T.eq(meta, {})
  for name, t in pairs(tensors) do
    T.eq(back[name].dtype, t.dtype, name)
    T.eq(back[name].device, "cpu", name)
    T.eq(back[name]:tolist(), t:tolist(), name)
  end
  local n = 0
  for _ in pairs(back) do n = n + 1 end
  T.eq(n, 7)
  os.remove(path)
end)

T.test("shapes: 0-d, empty, 8-d, non-contiguous", function()
  local path = tmpfile()
  local eight = tf.arange(256, { device = "cpu", dtype = "f32" }):reshape({ 2, 2, 2, 2, 2, 2, 2, 2 })
  local m = tf.arange(6, cpu):reshape({ 2, 3 })
  local tensors = {
    scalar = tf.tensor(7.25, cpu),
    empty = tf.zeros({ 0 }, cpu),
    empty3 = tf.zeros({ 2, 0, 3 }, { device = "cpu", dtype = "i32" }),
    eight = eight,
    transposed = m:t(),
  }
  st.save(path, tensors)
  local back = st.load(path, { device = "cpu" })
  T.eq(back.scalar.ndim, 0)
  T.eq(back.scalar:item(), 7.25)
  T.eq(tostring(back.empty.shape), "(0,)")
  T.eq(tostring(back.empty3.shape), "(2, 0, 3)")
  T.eq(back.empty3.dtype, "i32")
  T.eq(tostring(back.eight.shape), "(2, 2, 2, 2, 2, 2, 2, 2)")
  T.eq(back.eight:tolist(), eight:tolist())
  T.eq(back.transposed:tolist(), { { 0, 3 }, { 1, 4 }, { 2, 5 } })
  T.ok(back.transposed.is_contiguous)
  local h = st.read_header(path)
  T.eq(#h.scalar.shape, 0)
  T.eq(h.eight.offsets[2] - h.eight.offsets[1], 256 * 4)
  T.eq(h.empty.offsets[1], h.empty.offsets[2])
  os.remove(path)
end)

T.test("metadata: strings, numbers converted, read back", function()
  local path = tmpfile()
  st.save(path, { x = tf.ones({ 2 }, cpu) }, { format = "pt", step = 12, lr = 0.5, note = "é ✓" })
  local _, meta = st.load(path, cpu)
  T.eq(meta, { format = "pt", step = "12", lr = "0.5", note = "é ✓" })
  local _, meta2 = st.read_header(path)
  T.eq(meta2, meta)
  T.raises(function() st.save(path, { x = tf.ones({ 2 }, cpu) }, { bad = {} }) end,
    "metadata value of 'bad' must be a string or a number, not table")
  T.raises(function() st.save(path, { x = tf.ones({ 2 }, cpu) }, { true }) end, "metadata keys must be strings")
  T.raises(function() st.save(path, { x = tf.ones({ 2 }, cpu) }, { k = "a\0b" }) end, "must not contain NUL")
  os.remove(path)
end)

T.test("the file layout: 8-byte aligned header padded with spaces, sorted names, consecutive data", function()
  local path = tmpfile()
  st.save(path, { b = tf.tensor({ 1, 2 }, { device = "cpu", dtype = "i32" }), a = tf.tensor({ 0.5 }, cpu) })
  local bytes = read_bytes(path)
  local n = string.unpack("<I8", bytes)
  T.eq((8 + n) % 8, 0)
  local header = bytes:sub(9, 8 + n)
  T.eq(header:gsub(" +$", ""), '{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},'
    .. '"b":{"dtype":"I32","shape":[2],"data_offsets":[4,12]}}')
  T.ok(header:match("^[^ ]*( *)$") ~= nil, "only trailing spaces pad the header")
  T.eq(#bytes, 8 + n + 12)
  T.eq(bytes:sub(9 + n), string.pack("<f<i4<i4", 0.5, 1, 2))
  -- with checksums, the metadata holds the XXH64 of each tensor's bytes, in the order of the data
  st.save(path, { b = tf.tensor({ 1, 2 }, { device = "cpu", dtype = "i32" }), a = tf.tensor({ 0.5 }, cpu) }, nil,
    { checksums = true })
  bytes = read_bytes(path)
  n = string.unpack("<I8", bytes)
  header = bytes:sub(9, 8 + n)
  local sums = header:match('^{"__metadata__":{"tfhost.xxh64":"(%x+,%x+)"},')
  T.ok(sums and #sums == 33, "the checksums lead the header: " .. header)
  T.eq(header:gsub(" +$", ""), '{"__metadata__":{"tfhost.xxh64":"' .. sums .. '"},'
    .. '"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},'
    .. '"b":{"dtype":"I32","shape":[2],"data_offsets":[4,12]}}')
  local info = st.read_header(path)
  T.eq(info.a.xxh64 .. "," .. info.b.xxh64, sums)
  T.ok(info.a.xxh64 ~= info.b.xxh64)
  T.eq(bytes:sub(9 + n), string.pack("<f<i4<i4", 0.5, 1, 2))
  T.raises(function() st.save(path, {}, nil, { checksum = true }) end, "checksum")
  os.remove(path)
end)

T.test("a file written by tfhost reads back bit-identical and saves to the same bytes", function()
  local p1, p2 = tmpfile(), tmpfile()
  local tensors = {
    w = tf.randn(3, 5, cpu),
    h = tf.randn(4, { device = "cpu", dtype = "bf16" }),
    n = tf.tensor({ 0 / 0, -0.0, math.huge }, { device = "cpu", dtype = "f16" }),
    k = tf.randint(-100, 100, { 7 }, cpu),
  }
  st.save(p1, tensors, { epoch = 3 })
  local back, meta = st.load(p1, cpu)
  st.save(p2, back, meta)
  T.eq(read_bytes(p2), read_bytes(p1))
  for name, t in pairs(tensors) do T.eq(back[name]:tolist(), t:tolist(), name) end
  st.save(p2, tensors, { epoch = 3 })
  T.eq(read_bytes(p2), read_bytes(p1), "saving the same tensors twice gives the same bytes")
  os.remove(p1)
  os.remove(p2)
end)

T.test("a damaged tensor is an error naming it; load_into reads into given tensors", function()
  local path = tmpfile()
  local w, k = tf.randn(4, 8, cpu), tf.randint(0, 9, { 5 }, cpu)
  st.save(path, { w = w, k = k }, { note = "x" }, { checksums = true })
  local _, meta = st.load(path, cpu)
  T.eq(meta, { note = "x" }, "the checksums are not part of the metadata a script sees")
  -- read_into: the named tensors only, into tensors of their dtype and shape
  local w2, k2 = tf.zeros({ 4, 8 }, cpu), tf.zeros({ 5 }, { device = "cpu", dtype = "i64" })
  T.eq(st.load_into(path, { w = w2, k = k2 }), { note = "x" })
  T.eq(w2:tolist(), w:tolist())
  T.eq(k2:tolist(), k:tolist())
  local only = tf.zeros({ 5 }, { device = "cpu", dtype = "i64" })
  st.load_into(path, { k = only })
  T.eq(only:tolist(), k:tolist())
  T.raises(function() st.load_into(path, { q = only }) end, "has no tensor 'q'")
  T.raises(function() st.load_into(path, { w = tf.zeros({ 8, 4 }, cpu) }) end, "tensor 'w' has shape (4, 8), not (8, 4)")
  T.raises(function() st.load_into(path, { w = tf.zeros({ 4, 8 }, { device = "cpu", dtype = "bf16" }) }) end,
    "tensor 'w' is F32, not BF16")
  T.raises(function() st.load_into(path, { w = tf.zeros({ 8, 4 }, cpu):t() }) end, "not contiguous")
  -- one flipped bit in w's data
  local bytes = read_bytes(path)
  local n = string.unpack("<I8", bytes)
  local info = st.read_header(path)
  local at = 8 + n + info.w.offsets[1] + 5
  write_bytes(path, bytes:sub(1, at) .. string.char(bytes:byte(at + 1) ~ 4) .. bytes:sub(at + 2))
  T.raises(function() st.load(path, cpu) end, "tensor 'w': its 128 bytes do not match the checksum written with them (the file is damaged)")
  T.raises(function() st.load_into(path, { w = w2 }) end, "do not match the checksum")
  st.load_into(path, { k = k2 }) -- the other tensor is whole
  -- a damaged checksum list
  write_bytes(path, bytes:gsub('"tfhost.xxh64":"(%x+),', '"tfhost.xxh64":"%1;', 1))
  T.raises(function() st.load(path, cpu) end, "is not comma-separated (a damaged header)")
  os.remove(path)
end)

T.test("tensors larger than a transfer chunk (32 MB) and many at once, moved by several workers", function()
  local path = tmpfile()
  local tensors = { big = tf.randn(9 * 2 ^ 20 + 3, cpu), strided = tf.randn(300, 7, cpu):t() }
  for i = 1, 20 do tensors["t" .. i] = tf.randn(i, 5, cpu) end
  local devices = { "cpu" }
  if tf.cuda.is_available() then
    devices[2] = "cuda"
    tensors.gpu_big = tf.randn(9 * 2 ^ 20 + 1, { device = "cuda" })
  end
  st.save(path, tensors, nil, { checksums = true })
  for _, d in ipairs(devices) do
    local back = st.load(path, { device = d })
    for name, t in pairs(tensors) do T.eq((back[name]:to("cpu") - t:to("cpu")):abs():max():item(), 0.0, name .. " on " .. d) end
    local into = {}
    for name, t in pairs(tensors) do into[name] = tf.zeros(t.shape, { device = d }) end
    st.load_into(path, into)
    for name, t in pairs(tensors) do T.eq((into[name]:to("cpu") - t:to("cpu")):abs():max():item(), 0.0, name .. " into " .. d) end
  end
  -- a changed byte past the first chunk of the big tensor
  local info = st.read_header(path)
  local f = assert(io.open(path, "r+b"))
  local n = string.unpack("<I8", f:read(8))
  local at = 8 + n + info.big.offsets[1] + 33 * 2 ^ 20 + 7
  f:seek("set", at)
  local b = f:read(1)
  f:seek("set", at)
  f:write(string.char(b:byte() ~ 8))
  f:close()
  T.raises(function() st.load(path, cpu) end, "tensor 'big': its 37748748 bytes do not match the checksum")
  os.remove(path)
end)

T.test("saving nothing, overwriting, and argument errors", function()
  local path = tmpfile()
  st.save(path, {})
  local back, meta = st.load(path)
  T.eq(back, {})
  T.eq(meta, {})
  T.eq(#read_bytes(path), 16)
  st.save(path, { x = tf.ones({ 3 }, cpu) })
  T.eq(st.load(path, cpu).x:tolist(), { 1.0, 1.0, 1.0 })
  local freed = tf.ones({ 1 }, cpu)
  freed:free()
  T.raises(function() st.save(path, { x = freed }) end, "'x' is a freed tensor")
  T.raises(function() st.save(path, { x = 3 }) end, "'x' is number")
  T.raises(function() st.save(path, { tf.ones({ 1 }, cpu) }) end, "tensor names must be strings, not number")
  T.raises(function() st.save(path, { __metadata__ = tf.ones({ 1 }, cpu) }) end, "cannot be named __metadata__")
  T.raises(function() st.save(path, { ["\255"] = tf.ones({ 1 }, cpu) }) end, "is not valid UTF-8")
  T.raises(function() st.save("/nonexistent-dir/x.safetensors", {}) end,
    "tf.safetensors.save: /nonexistent-dir/x.safetensors: cannot create")
  T.raises(function() st.load(path, { dtype = "f32" }) end, "unknown option 'dtype'")
  T.raises(function() st.load(path, { device = "tpu" }) end, "tpu")
  T.eq(st.load(path, cpu).x:tolist(), { 1.0, 1.0, 1.0 }, "a failed save leaves the old file")
  if not tf.cuda.is_available() then
    T.raises(function() st.load(path, { device = "cuda" }) end, "tf.safetensors.load: " .. path .. ": no CUDA device")
  end
  os.remove(path)
end)

T.test("files from other writers: any JSON order, unknown fields, padding, empty tensors", function()
  local path = tmpfile()
  local header = '{"b":' .. entry("I32", { 1 }, 8, 12) .. ',"e1":' .. entry("F32", { 0 }, 8, 8)
    .. ',"__metadata__":{"k":"v"},"a":{"shape":[2],"extra":[1],"data_offsets":[0,8],"dtype":"F32"},"e0":'
    .. entry("F64", { 3, 0 }, 0, 0) .. "}    \n"
  write_bytes(path, image(header, string.pack("<f<f<i4", 1.5, 2.5, 42)))
  local t, meta = st.load(path, cpu)
  T.eq(t.a:tolist(), { 1.5, 2.5 })
  T.eq(t.b:tolist(), { 42 })
  T.eq(tostring(t.e0.shape), "(3, 0)")
  T.eq(t.e1:numel(), 0)
  T.eq(meta, { k = "v" })
  write_bytes(path, image('{"__metadata__":null}'))
  T.eq(st.load(path), {})
  os.remove(path)
end)

T.test("read_header inspects without loading, including dtypes tfhost lacks", function()
  local path = tmpfile()
  write_bytes(path, image('{"q":' .. entry("U8", { 2, 2 }, 0, 4) .. ',"r":' .. entry("F8_E4M3", { 4 }, 4, 8)
    .. ',"f":' .. entry("F4", { 4 }, 8, 10) .. '}', "\1\2\3\4\5\6\7\8\9\10"))
  local h, meta = st.read_header(path)
  T.eq(h.q.dtype, "U8")
  T.eq(tostring(h.q.shape), "(2, 2)")
  T.eq(h.q.offsets, { 0, 4 })
  T.eq(h.r.dtype, "F8_E4M3")
  T.eq(h.f.offsets, { 8, 10 })
  T.eq(meta, {})
  T.raises(function() st.load(path) end,
    "tensor 'q' has dtype U8, which tfhost cannot load (it has no u8 dtype; it reads F32, F16, BF16, F64, I64, I32, BOOL, F8_E4M3 and F8_E5M2)")
  write_bytes(path, image('{"s":' .. entry("I8", { 2 }, 0, 2) .. '}', "\1\2"))
  T.raises(function() st.load(path) end, "tensor 's' has dtype I8, which tfhost cannot load (it has no i8 dtype")
  os.remove(path)
end)

-- Each corrupt file and the message it must give. {name, bytes, message [, header_ok]}
local F32x2 = string.pack("<f<f", 1, 2)
local function one(e, data) return image('{"a":' .. e .. '}', data or F32x2) end
local corrupt = {
  { "empty file", "", "file is 0 bytes, too short for a safetensors file (truncated?)" },
  { "five bytes", "\1\0\0\0\0", "file is 5 bytes, too short" },
  { "absurd header length", string.pack("<I8", 200000000) .. "{}",
    "header length 200000000 is larger than the 100000000-byte limit" },
  { "huge header length", string.pack("<I8", -1) .. "{}", "header length 18446744073709551615 is larger than the" },
  { "header length past the end", string.pack("<I8", 100) .. '{"a":1}',
    "header length 100 is larger than the 7 bytes that follow it (truncated file?)" },
  { "header length too small", string.pack("<I8", 1) .. "{", "header length 1 is too small for a JSON object" },
  { "truncated JSON", image('{"a":{"dtype":'), "header is not valid JSON (at byte" },
  { "not JSON at all", image("hello world"), "header is not valid JSON (at byte 1 of the header, near 'hello" },
  { "invalid UTF-8", image('{"\255":1}'), "header is not valid UTF-8 (byte 3 of the header)" },
  { "NUL padding", image('{}\0\0\0\0\0\0'), "header has bytes after its JSON object (at byte 3 of the header" },
  { "garbage after the JSON", image('{} x'), "header has bytes after its JSON object (at byte 4 of the header, near 'x')" },
  { "header is an array", image("[1, 2]"), "header must be a JSON object, found an array" },
  { "entry not an object", image('{"a":5}'), "tensor 'a': expected an object with dtype, shape and data_offsets, found 5" },
  { "missing dtype", one('{"shape":[2],"data_offsets":[0,8]}'), "tensor 'a' has no \"dtype\"" },
  { "missing shape", one('{"dtype":"F32","data_offsets":[0,8]}'), "tensor 'a' has no \"shape\"" },
  { "missing data_offsets", one('{"dtype":"F32","shape":[2]}'), "tensor 'a' has no \"data_offsets\"" },
  { "dtype twice", one('{"dtype":"F32","dtype":"F32","shape":[2],"data_offsets":[0,8]}'),
    "tensor 'a' has two \"dtype\" fields" },
  { "dtype not a string", one('{"dtype":5,"shape":[2],"data_offsets":[0,8]}'),
    "tensor 'a': \"dtype\" must be a string, found 5" },
  { "unknown dtype", one(entry("Q7", { 2 }, 0, 8)), "tensor 'a' has unknown dtype 'Q7'" },
  { "lowercase dtype", one(entry("f32", { 2 }, 0, 8)), "tensor 'a' has unknown dtype 'f32'" },
  { "shape not an array", one('{"dtype":"F32","shape":2,"data_offsets":[0,8]}'),
    "tensor 'a': \"shape\" must be an array, found 2" },
  { "negative dimension", one(entry("F32", { -2 }, 0, 8)),
    "tensor 'a': dimension 0 of its shape is -2, not a non-negative integer" },
  { "fractional dimension", one(entry("F32", { 1, 2.5 }, 0, 8)), "tensor 'a': dimension 1 of its shape is 2.5, not a non-negative integer" },
  { "string dimension", one('{"dtype":"F32","shape":["2"],"data_offsets":[0,8]}'), "dimension 0 of its shape is a string" },
  { "infinite dimension", one('{"dtype":"F32","shape":[1e400],"data_offsets":[0,8]}'), "dimension 0 of its shape is inf" },
  { "dimension beyond 2^53", one(entry("F32", { "18014398509481984" }, 0, 8)), "dimension 0 of its shape is 18014398509481984" },
  { "nine dimensions", one(entry("F32", { 1, 1, 1, 1, 1, 1, 1, 1, 2 }, 0, 8)),
    "tensor 'a' has 9 dimensions; tfhost supports at most 8" },
  { "element count overflows", one(entry("F32", { 4294967296, 4294967296, 4294967296 }, 0, 8)),
    "tensor 'a': shape (4294967296, 4294967296, 4294967296) has too many elements" },
  { "data_offsets not a pair", one('{"dtype":"F32","shape":[2],"data_offsets":[0]}'),
    "tensor 'a': \"data_offsets\" must be an array [begin, end], found an array of another length" },
  { "data_offsets not an array", one('{"dtype":"F32","shape":[2],"data_offsets":"0-8"}'),
    "\"data_offsets\" must be an array [begin, end], found a string" },
  { "negative offset", one(entry("F32", { 2 }, -8, 0)), "tensor 'a': data_offsets begin is -8, not a non-negative integer" },
  { "fractional offset", one('{"dtype":"F32","shape":[2],"data_offsets":[0,8.5]}'), "data_offsets end is 8.5" },
  { "reversed offsets", one(entry("F32", { 0 }, 8, 0)), "tensor 'a': data_offsets [8, 0] end before they begin" },
  { "size does not match shape", one(entry("F32", { 2, 3 }, 0, 8)),
    "tensor 'a': shape (2, 3) of F32 needs 24 bytes, but data_offsets [0, 8] hold 8" },
  { "sub-byte size", one(entry("F4", { 3 }, 0, 2)), "tensor 'a': shape (3,) of F4 is not a whole number of bytes" },
  { "data past the end (truncated)", one(entry("F32", { 2 }, 0, 8), "\0\0\0\0"),
    "tensor 'a': data_offsets [0, 8] go past the end of the data (4 bytes; truncated file?)" },
  { "overlapping tensors", image('{"a":' .. entry("F32", { 2 }, 0, 8) .. ',"b":' .. entry("F32", { 2 }, 4, 12) .. "}",
    string.rep("\0", 12)), "tensor 'b': data_offsets [4, 12] overlap tensor 'a' (which ends at 8)" },
  { "identical ranges", image('{"a":' .. entry("F32", { 2 }, 0, 8) .. ',"b":' .. entry("F32", { 2 }, 0, 8) .. "}",
    F32x2), "data_offsets [0, 8] overlap tensor 'a'" },
  { "empty tensor inside another", image('{"a":' .. entry("F32", { 2 }, 0, 8) .. ',"b":' .. entry("F32", { 0 }, 4, 4) .. "}",
    F32x2), "tensor 'b': data_offsets [4, 4] overlap tensor 'a'" },
  { "gap between tensors", image('{"a":' .. entry("F32", { 1 }, 0, 4) .. ',"b":' .. entry("F32", { 1 }, 8, 12) .. "}",
    string.rep("\0", 12)), "data bytes [4, 8) belong to no tensor (a gap before tensor 'b')" },
  { "gap at the start", one(entry("F32", { 1 }, 4, 8)), "data bytes [0, 4) belong to no tensor (a gap before tensor 'a')" },
  { "trailing bytes", one(entry("F32", { 2 }, 0, 8), F32x2 .. "xyz"), "3 trailing bytes after the last tensor's data" },
  { "data without tensors", image("{}", "x"), "1 trailing bytes after the last tensor's data" },
  { "duplicate names", image('{"a":' .. entry("F32", { 1 }, 0, 4) .. ',"a":' .. entry("F32", { 1 }, 4, 8) .. "}", F32x2),
    "tensor 'a' appears twice in the header" },
  { "metadata twice", image('{"__metadata__":{},"__metadata__":{}}'), "__metadata__ appears twice in the header" },
  { "metadata not an object", image('{"__metadata__":[1]}'), "__metadata__ must be an object of strings, found an array" },
  { "metadata value not a string", image('{"__metadata__":{"epoch":3}}'),
    "__metadata__ value of 'epoch' must be a string, found 3" },
  { "metadata key twice", image('{"__metadata__":{"k":"1","k":"2"}}'), "__metadata__ key 'k' appears twice" },
  { "hostile name is escaped", image('{"\\u001b[31m' .. string.rep("x", 100) .. '":5}'),
    "tensor '\\x1b[31m" .. string.rep("x", 59) .. "...': expected an object" },
}

T.test("corrupt files each fail with their own message, naming the function and the file", function()
  local path = tmpfile()
  for _, case in ipairs(corrupt) do
    local name, bytes, message = case[1], case[2], case[3]
    write_bytes(path, bytes)
    local err = T.raises(function() st.load(path, cpu) end, message, name)
    T.ok(err:find("tf.safetensors.load: " .. path .. ": ", 1, true), name .. ": names the function and file: " .. err)
    err = T.raises(function() st.read_header(path) end, message, name .. " (read_header)")
    T.ok(err:find("tf.safetensors.read_header: " .. path, 1, true), name)
  end
  os.remove(path)
end)

T.test("paths that are not files", function()
  T.raises(function() st.load("/nonexistent/x.safetensors") end,
    "tf.safetensors.load: /nonexistent/x.safetensors: cannot open: No such file or directory")
  T.raises(function() st.read_header("/") end, "tf.safetensors.read_header: /: not a regular file")
  T.raises(function() st.load() end, "bad argument #1")
end)

if tf.cuda.is_available() then
  T.test("load onto and save from a GPU", function()
    local path = tmpfile()
    local x = tf.randn(3, 4, cpu)
    st.save(path, { x = x:cuda(), xt = x:cuda():t() })
    local back = st.load(path, { device = "cuda" })
    T.eq(back.x.device, "cuda:0")
    T.eq(back.x:cpu():tolist(), x:tolist())
    T.eq(back.xt:cpu():tolist(), x:t():tolist())
    os.remove(path)
  end)
end

T.run()
