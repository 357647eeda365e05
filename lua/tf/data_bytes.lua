--- tf.data.make_bytes: text files turned into byte-level token files (vocabulary 256, no
-- tokenizer), offline: train.bin and val.bin (raw little-endian uint16) and meta.json. The files
-- are read in the sorted order of their paths, one newline between two files; the last
-- val_fraction of the tokens is the validation split. experiments/make_bytes_dataset.lua is its
-- command; experiments/train.lua calls it when its default dataset is missing.
local check = require "tf.check"

local M = {}

local function tf() return require "tf" end

--- The newest Python standard library of the machine, /usr/lib/python3.N/ with its os.py; nil and
-- whether --safe refused to look.
function M.python_library()
  local refused = false
  for minor = 40, 0, -1 do
    local folder = string.format("/usr/lib/python3.%d", minor)
    local ok, f = pcall(io.open, folder .. "/os.py", "rb")
    if ok and f then
      f:close()
      return folder
    end
    refused = refused or not ok
  end
  return nil, refused
end

-- Every source file under folders: its path, its name relative to its folder (what the list's
-- hash covers) and size.
local function sources_of(folders, ext, from_python)
  local wanted = {}
  for _, e in ipairs(ext) do
    if e == "*" then
      wanted = {}
      break
    end
    wanted[#wanted + 1] = "%." .. e:gsub("^%.", ""):gsub("%p", "%%%0") .. "$"
  end
  local function chosen(path)
    if from_python and (path:find("/site-packages/", 1, true) or path:find("/dist-packages/", 1, true)) then
      return false
    end
    if #wanted == 0 then return true end
    for _, pattern in ipairs(wanted) do
      if path:find(pattern) then return true end
    end
    return false
  end
  local sources, total = {}, 0
  for _, folder in ipairs(folders) do
    local root = folder:gsub("/+$", "")
    local ok, paths = pcall(tf().data.files, root)
    if not ok then error(tostring(paths):gsub("^[^\n]-:%d+: ", ""), 0) end
    for _, path in ipairs(paths) do
      if chosen(path) then
        local f = io.open(path, "rb")
        if f then -- a file that went away or cannot be read is left out
          local size = f:seek("end")
          f:close()
          sources[#sources + 1] = { path = path, name = path:sub(#root + 2), size = size }
          total = total + size
        end
      end
    end
  end
  return sources, total
end

-- Runs of sources of about equal size, at most n of them: the steps a progress line counts.
local function split_parts(sources, total, n)
  local parts, part_bytes = {}, total / math.min(n, #sources)
  local current, acc = nil, 0
  for i, s in ipairs(sources) do
    if not current then
      current = { first = i, bytes = 0 }
      parts[#parts + 1] = current
    end
    current.last, current.bytes = i, current.bytes + s.size
    acc = acc + s.size
    if acc >= part_bytes * #parts and #parts < n then current = nil end
  end
  return parts
end

--- tf.data.make_bytes{from = {folders}, out, ext = {"py", ...}, val_fraction = 0.1, parts = 10,
-- python = (from is Python's library: site-packages left out), on_part = fn} -> meta (the table
-- written to out/meta.json), and the parts. on_part(k, parts) is called before part k of the list
-- parts (each {first, last, files, bytes, first_name, last_name}) and on_part(k, parts, tokens)
-- after it: a progress line's steps. The token files are written under temporary names and renamed when whole.
function M.make_bytes(opts)
  local fname = "tf.data.make_bytes"
  check.arg(opts, fname, "the options", "table")
  opts = check.keys(opts, fname, { "from", "out", "ext", "val_fraction", "parts", "python", "on_part" })
  check.arg(opts.from, fname, "from", "table")
  check.arg(opts.out, fname, "out", "string")
  local ext = opts.ext or { "py", "txt", "md", "rst" }
  local val_fraction = opts.val_fraction or 0.1
  local sources, total_bytes = sources_of(opts.from, ext, opts.python)
  if #sources == 0 then
    error(string.format("no files ending in %s under %s", table.concat(ext, ", "), table.concat(opts.from, ", ")), 0)
  end
  local total_tokens = total_bytes + #sources - 1
  local val_tokens = math.floor(total_tokens * val_fraction)
  local train_tokens = total_tokens - val_tokens
  local parts = split_parts(sources, total_bytes, opts.parts or 10)

  local t = tf()
  t.mkdir(opts.out)
  local train_path, val_path = opts.out .. "/train.bin", opts.out .. "/val.bin"
  local train = assert(io.open(train_path .. ".partial", "wb"))
  local val = assert(io.open(val_path .. ".partial", "wb"))
  local written = 0 -- tokens so far
  -- Writes the bytes of s as uint16 tokens, into train until train_tokens are written, then into val.
  local function emit(s)
    local n = #s
    local into_train = math.max(0, math.min(n, train_tokens - written))
    if into_train > 0 then train:write((s:sub(1, into_train):gsub(".", "%0\0"))) end
    if into_train < n then val:write((s:sub(into_train + 1):gsub(".", "%0\0"))) end
    written = written + n
  end
  local on_part = opts.on_part or function() end
  for _, part in ipairs(parts) do
    part.files, part.first_name, part.last_name = part.last - part.first + 1, sources[part.first].name,
      sources[part.last].name
  end
  for k, part in ipairs(parts) do
    on_part(k, parts)
    local tokens = 0
    for i = part.first, part.last do
      if i > 1 then emit("\n") end
      local f = assert(io.open(sources[i].path, "rb"))
      local text = f:read("a") or ""
      f:close()
      emit(text)
      tokens = tokens + #text + (i > 1 and 1 or 0)
    end
    on_part(k, parts, tokens)
  end
  train:close()
  val:close()
  assert(os.rename(train_path .. ".partial", train_path))
  assert(os.rename(val_path .. ".partial", val_path))

  local list = {}
  for i, s in ipairs(sources) do list[i] = s.name .. "\t" .. s.size end
  local meta = {
    format = "raw little-endian uint16, one token per byte",
    vocab_size = 256,
    dtype = "u16",
    separator = "\n",
    train_tokens = train_tokens,
    val_tokens = val_tokens,
    val_fraction = val_fraction,
    files = #sources,
    sources = opts.from,
    -- the sorted list of "name<TAB>bytes" lines, one per file, names relative to their folder
    sources_sha256 = t.sha256(table.concat(list, "\n")),
    train_sha256 = t.sha256_file(train_path),
    val_sha256 = t.sha256_file(val_path),
  }
  t.json.write(opts.out .. "/meta.json", meta)
  return meta, parts
end

return M
