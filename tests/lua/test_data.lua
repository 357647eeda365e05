-- tf.data.tokens: raw and .npy token files written here byte by byte, batches checked against the
-- files' own bytes, the generator's reproducibility and state, sequential windows, every error.
local T = require "harness"

local files = {}
local function tmpfile(suffix)
  local path = os.tmpname() .. (suffix or "")
  files[#files + 1] = path
  return path
end

local function write(path, bytes)
  local f = assert(io.open(path, "wb"))
  f:write(bytes)
  f:close()
  return path
end

-- tokens as raw little-endian integers of string.pack's format fmt ("<I2", "<I4", "<i8", ...)
local function raw(tokens, fmt)
  local parts = {}
  for i, v in ipairs(tokens) do parts[i] = string.pack(fmt, v) end
  return table.concat(parts)
end

-- A .npy file (format 1.0) as np.save writes it: magic, version, header length, the dict padded with
-- spaces to a multiple of 64 bytes and ended by a newline, then the data.
local function npy(descr, shape, data, opts)
  opts = opts or {}
  local dict = opts.dict or string.format("{'descr': '%s', 'fortran_order': False, 'shape': %s, }", descr, shape)
  local major = opts.major or 1
  local pre = 6 + 2 + (major == 1 and 2 or 4)
  local pad = (64 - (pre + #dict + 1) % 64) % 64
  local header = dict .. string.rep(" ", pad) .. "\n"
  local len = major == 1 and string.pack("<I2", #header) or string.pack("<I4", #header)
  return "\x93NUMPY" .. string.char(major, 0) .. len .. header .. data
end

local function range(n, f)
  local t = {}
  for i = 1, n do t[i] = f(i - 1) end
  return t
end

-- a file's tokens, with a pattern that no window repeats (so a row says where it came from)
local TOKENS = range(3000, function(i) return (i * 7919) % 60000 end)

local function file_u16() return write(tmpfile(".bin"), raw(TOKENS, "<I2")) end

-- Every row of inputs and targets is the file's tokens at start .. start+T (targets one further).
local function check_rows(inputs, targets, starts, tokens)
  local x, y = inputs:tolist(), targets:tolist()
  T.eq(#x, #starts, "one row per start")
  for r, s in ipairs(starts) do
    local want_x, want_y = {}, {}
    for t = 1, #x[r] do
      want_x[t] = tokens[s + t]
      want_y[t] = tokens[s + t + 1]
    end
    T.eq(x[r], want_x, "row " .. r .. " inputs at offset " .. s)
    T.eq(y[r], want_y, "row " .. r .. " targets at offset " .. s)
  end
end

T.test("a raw u16 file: fields, shapes, dtypes, targets shifted by one", function()
  local path = file_u16()
  local ds <close> = tf.data.tokens(path, { seed = 1, device = "cpu" })
  T.eq(#ds, #TOKENS)
  T.eq(ds:size(), #TOKENS)
  T.eq(ds.dtype, "u16")
  T.eq(ds.path, path)
  local x, y = ds:batch(4, 16)
  T.eq({ x.shape[1], x.shape[2], y.shape[1], y.shape[2] }, { 4, 16, 4, 16 })
  T.eq({ x.dtype, y.dtype, x.device }, { "i64", "i64", "cpu" })
  local xl, yl = x:tolist(), y:tolist()
  for r = 1, 4 do
    for t = 1, 15 do T.eq(yl[r][t], xl[r][t + 1]) end
  end
end)

T.test("batches come from the file at the offsets the generator draws, uniform over [0, n - T - 1]", function()
  local path = file_u16()
  local a <close> = tf.data.tokens(path, { seed = 5 })
  local b <close> = tf.data.tokens(path, { seed = 5, device = "cpu" })
  local seen_low, seen_high = false, false
  for _ = 1, 20 do
    local starts = a:offsets(8, 32)
    local x, y = b:batch(8, 32)
    check_rows(x, y, starts, TOKENS)
    for _, s in ipairs(starts) do
      T.ok(s >= 0 and s <= #TOKENS - 32 - 1, "offset " .. s .. " in range")
      if s < 500 then seen_low = true end
      if s > #TOKENS - 600 then seen_high = true end
    end
  end
  T.ok(seen_low and seen_high, "offsets spread over the file")
  -- a file of exactly T + 1 tokens has one window, at 0
  local tiny <close> = tf.data.tokens(write(tmpfile(".bin"), raw({ 1, 2, 3, 4 }, "<I2")))
  T.eq(tiny:offsets(3, 3), { 0, 0, 0 })
  T.eq(select(2, tiny:batch(1, 3)):tolist(), { { 2, 3, 4 } })
end)

T.test("the same seed gives the same batches; state() and set_state() resume the sequence", function()
  local path = file_u16()
  local a <close> = tf.data.tokens(path, { seed = 42 })
  local b <close> = tf.data.tokens(path, { seed = 42 })
  local c <close> = tf.data.tokens(path, { seed = 43 })
  T.eq(a:batch(4, 8):tolist(), b:batch(4, 8):tolist())
  T.ok(not (a:offsets(4, 8)[1] == c:offsets(4, 8)[1] and a:offsets(4, 8)[2] == c:offsets(4, 8)[2]),
    "another seed, other offsets")
  local saved = a:state()
  T.eq(type(saved.state), "string")
  T.eq(saved.generator, "splitmix64")
  local next1 = a:batch(4, 8):tolist()
  local next2 = a:batch(4, 8):tolist()
  a:set_state(saved)
  T.eq(a:batch(4, 8):tolist(), next1, "resumed")
  -- through JSON, onto another dataset, as a checkpoint would
  b:set_state(tf.json.decode(tf.json.encode(a:state())))
  T.eq(b:batch(4, 8):tolist(), next2, "restored on another dataset")
  -- the dataset's generator is its own: tf.seed and tf.randn change nothing
  local d <close> = tf.data.tokens(path, { seed = 42 })
  tf.seed(1)
  tf.randn(10)
  local e <close> = tf.data.tokens(path, { seed = 42 })
  tf.seed(2)
  T.eq(d:offsets(6, 8), e:offsets(6, 8))
  -- splitmix64's first outputs for seed 0 (the published test vector: 0xe220a8397b1dcdaf, ...)
  local z <close> = tf.data.tokens(path, { seed = 0 })
  z:set_state({ generator = "splitmix64", state = "0000000000000000" })
  T.eq(z:offsets(1, 1), { ((0xe220a8397b1dcdaf >> 1) % (#TOKENS - 1)) })
  T.raises(function() a:set_state("x") end, "ds:set_state: expects a table")
  T.raises(function() a:set_state({ generator = "pcg", state = "00" }) end, "generator pcg")
  T.raises(function() a:set_state({ generator = "splitmix64", state = "xyz" }) end, "hex digits")
end)

T.test("u32 raw files, .npy files of each dtype, format 1.0 and 2.0 headers", function()
  local big = range(300, function(i) return 70000 + i * 13 end)
  local ds <close> = tf.data.tokens(write(tmpfile(".bin"), raw(big, "<I4")), { dtype = "u32" })
  T.eq(ds.dtype, "u32")
  local bx, by = ds:gather({ 0, 17, 297 }, 2)
  check_rows(bx, by, { 0, 17, 297 }, big)
  local cases = {
    { "<u2", "<I2", "u16" }, { "<u4", "<I4", "u32" }, { "<i4", "<i4", "i32" }, { "<i8", "<i8", "i64" },
    { "|u1", "B", "u8" }, { "<i2", "<i2", "i16" },
  }
  local small = range(100, function(i) return (i * 37) % 250 end)
  for _, c in ipairs(cases) do
    for _, major in ipairs { 1, 2 } do
      local path = write(tmpfile(".npy"), npy(c[1], "(100,)", raw(small, c[2]), { major = major }))
      local n <close> = tf.data.tokens(path, { vocab_size = 250 })
      T.eq({ n.dtype, #n, n.format }, { c[3], 100, "npy" }, c[1])
      local x, y = n:gather({ 0, 50, 98 }, 1)
      check_rows(x, y, { 0, 50, 98 }, small)
      T.eq(n:check(), true)
    end
  end
  -- a .npy header is found by the name or by format = "npy"
  local other = write(tmpfile(".data"), npy("<u2", "(100,)", raw(small, "<I2")))
  local o <close> = tf.data.tokens(other, { format = "npy" })
  T.eq(#o, 100)
end)

T.test("windows: sequential, non-overlapping, covering the file; the last partial batch", function()
  local path = file_u16()
  local ds <close> = tf.data.tokens(path)
  local T_ = 64
  local count = (#TOKENS - 1) // T_
  T.eq(ds:num_windows(T_), count)
  local next_start, rows = 0, {}
  for x, y in ds:windows(10, T_) do
    local starts = {}
    for r = 1, x.shape[1] do starts[r] = next_start + (r - 1) * T_ end
    check_rows(x, y, starts, TOKENS)
    next_start = next_start + x.shape[1] * T_
    rows[#rows + 1] = x.shape[1]
  end
  T.eq(next_start, count * T_, "every whole window once")
  T.eq(#rows, (count + 9) // 10)
  T.eq(rows[#rows], count % 10, "the last batch holds what is left")
  local full = 0
  for x in ds:windows(10, T_, { drop_last = true }) do
    T.eq(x.shape[1], 10)
    full = full + 1
  end
  T.eq(full, count // 10)
  T.raises(function() ds:windows(10, T_, { droplast = true }) end, "unknown option 'droplast'")
end)

T.test("vocab_size: a token at or past it is an error naming its position; ds:check scans the file", function()
  local tokens = range(200, function(i) return i % 50 end)
  tokens[151] = 50 -- position 150
  local path = write(tmpfile(".bin"), raw(tokens, "<I2"))
  local ds <close> = tf.data.tokens(path, { vocab_size = 50 })
  local ok, msg, pos = ds:check()
  T.eq({ ok, pos }, { false, 150 })
  T.ok(msg:find(path, 1, true) and msg:find("position 150", 1, true) and msg:find("vocab_size 50", 1, true), msg)
  T.eq(ds:check(51), true)
  T.raises(function() ds:gather({ 140 }, 10) end, "token 50 at position 150 (byte 300) is not below vocab_size 50")
  T.raises(function() ds:gather({ 141 }, 9) end, "position 150") -- the target's last token
  T.eq(#ds:gather({ 0 }, 100):tolist()[1], 100, "windows before it pass")
  local signed = write(tmpfile(".npy"), npy("<i4", "(4,)", raw({ 1, 2, -3, 4 }, "<i4")))
  local s <close> = tf.data.tokens(signed)
  T.raises(function() s:batch(1, 3) end, "token -3 at position 2")
  T.eq(select(3, s:check()), 2)
end)

T.test("errors name the file: missing, size, short, bad headers, dtypes, arguments", function()
  T.raises(function() tf.data.tokens("/nonexistent/tokens.bin") end, "/nonexistent/tokens.bin: No such file")
  local folder = os.tmpname()
  os.remove(folder)
  tf.mkdir(folder)
  T.raises(function() tf.data.tokens(folder) end, "not a regular file (a folder)")
  os.remove(folder)
  local odd = write(tmpfile(".bin"), "abc")
  T.raises(function() tf.data.tokens(odd) end, odd .. ": 3 bytes is not a whole number of u16 tokens")
  T.raises(function() tf.data.tokens(write(tmpfile(".bin"), "abcdef"), { dtype = "u32" }) end, "of u32 tokens")
  local short <close> = tf.data.tokens(write(tmpfile(".bin"), raw({ 1, 2, 3 }, "<I2")))
  T.raises(function() short:batch(1, 3) end, "has 3 tokens, fewer than context_length + 1 = 4")
  T.raises(function() short:windows(1, 3) end, "fewer than context_length + 1")
  local empty <close> = tf.data.tokens(write(tmpfile(".bin"), ""))
  T.eq(#empty, 0)
  T.raises(function() empty:batch(1, 1) end, "has 0 tokens")
  T.eq(empty:check(), true)

  local data = raw({ 1, 2, 3, 4 }, "<I2")
  local function bad(bytes, pattern)
    local path = write(tmpfile(".npy"), bytes)
    local err = T.raises(function() tf.data.tokens(path) end, pattern)
    T.ok(err:find(path, 1, true), "names the file: " .. err)
  end
  bad("not a numpy file", "does not start with the magic bytes")
  bad("\x93NUMPY\1\0\200\0{", "header length runs past the end")
  bad(npy(nil, nil, data, { major = 4 }), "format version 4.0")
  bad(npy(nil, nil, data, { dict = "['descr']" }), "its header is not a dict")
  bad(npy(nil, nil, data, { dict = "{'descr': '<u2', 'shape': (4,), }" }), "lacks 'descr', 'fortran_order' or 'shape'")
  bad(npy(nil, nil, data, { dict = "{'descr': '<u2', 'fortran_order': False, 'shape': (4,), 'x': 1}" }),
    "unknown header key 'x'")
  bad(npy(nil, nil, data, { dict = "{'descr': '<u2' 'fortran_order': False}" }), "not separated by commas")
  bad(npy(nil, nil, data, { dict = "{'descr': '<u2', 'fortran_order': Maybe, 'shape': (4,)}" }),
    "cannot read the header's 'fortran_order'")
  bad(npy("<f4", "(2,)", data), "dtype '<f4' is not a token dtype tfhost reads")
  bad(npy(">u2", "(4,)", data), "this one is big-endian")
  bad(npy(nil, nil, data, { dict = "{'descr': [('a', '<u2')], 'fortran_order': False, 'shape': (4,)}" }),
    "not a plain integer type")
  bad(npy("<u2", "(2, 2)", data), "the array has 2 dimensions")
  bad(npy("<u2", "()", data), "the array has 0 dimensions")
  bad(npy("<u2", "(5,)", data), "the header says 5 tokens (10 bytes) but the file holds 8 bytes")
  bad(npy("<u2", "(3,)", data), "the header says 3 tokens")

  local ok = file_u16()
  T.raises(function() tf.data.tokens(42) end, "tf.data.tokens: the path must be a string, not a number")
  T.raises(function() tf.data.tokens(ok, { dtype = "f32" }) end, 'dtype must be "u16", "u32"')
  T.raises(function() tf.data.tokens(ok, { vocab = 5 }) end, "unknown option 'vocab' (did you mean vocab_size?)")
  T.raises(function() tf.data.tokens(ok, { vocab_size = 0 }) end, "vocab_size must be at least 1")
  T.raises(function() tf.data.tokens(ok, { vocab_size = 2.5 }) end, "vocab_size must be an integer")
  T.raises(function() tf.data.tokens(ok, { seed = "x" }) end, "seed must be an integer")
  T.raises(function() tf.data.tokens(ok, { format = "csv" }) end, 'format must be "raw", "npy"')
  T.raises(function() tf.data.tokens(ok, { device = 0 }) end, "device must be a string")
  local npy_path = write(tmpfile(".npy"), npy("<u2", "(4,)", data))
  T.raises(function() tf.data.tokens(npy_path, { dtype = "u32" }) end, "the .npy header says u16 tokens, not u32")
  local ds = tf.data.tokens(ok)
  T.raises(function() ds:batch(0, 4) end, "ds:batch: batch_size must be at least 1, not 0")
  T.raises(function() ds:batch(2, "4") end, "ds:batch: context_length must be an integer")
  T.raises(function() ds:gather({ -1 }, 4) end, "cannot start at -1")
  T.raises(function() ds:gather({ #TOKENS - 4 }, 4) end, "cannot start at " .. (#TOKENS - 4))
  T.raises(function() ds:gather({ "a" }, 4) end, "window start 1 is not an integer")
  T.raises(function() ds:check(1.5) end, "vocab_size must be an integer")
  local bad_device = tf.data.tokens(ok, { device = "tpu:0" })
  T.raises(function() bad_device:batch(1, 2) end, "tpu")
  ds:close()
  ds:close() -- harmless the second time
  T.raises(function() ds:batch(1, 2) end, "closed")
end)

T.test("tf.data.files lists a tree's files, sorted, by pattern", function()
  local top = os.tmpname()
  os.remove(top)
  tf.mkdir(top .. "/b/c")
  write(top .. "/b/c/z.py", "z")
  write(top .. "/a.py", "a")
  write(top .. "/b/y.txt", "y")
  T.eq(tf.data.files(top, "%.py$"), { top .. "/a.py", top .. "/b/c/z.py" })
  T.eq(#tf.data.files(top .. "/"), 3)
  T.raises(function() tf.data.files(top .. "/missing") end, "missing: No such file")
  for _, p in ipairs { "/b/c/z.py", "/a.py", "/b/y.txt", "/b/c", "/b", "" } do os.remove(top .. p) end
end)

T.test("a dataset is collected with its mapping", function()
  local path = file_u16()
  for _ = 1, 200 do tf.data.tokens(path) end
  collectgarbage()
  collectgarbage()
  T.eq(#tf.data.tokens(path), #TOKENS)
end)

T.test("the files written here are removed", function()
  for _, p in ipairs(files) do os.remove(p) end
  T.eq(io.open(files[1]), nil)
end)

T.run()
