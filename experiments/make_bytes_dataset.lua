--- A dataset on every machine, offline: text files turned into byte-level tokens (vocabulary 256,
-- no tokenizer), split into train.bin and val.bin (raw little-endian uint16, as nanoGPT and the CS336
-- course write them; tf.data.tokens and np.memmap(path, dtype=np.uint16) read them) and meta.json.
-- The files are read in sorted order of their paths and joined with one newline between two files;
-- the last --val_fraction of the tokens is the validation split. Nothing is downloaded.
--
--   tfhost experiments/make_bytes_dataset.lua                  (Python's standard library, *.py, into data/bytes)
--   tfhost experiments/make_bytes_dataset.lua --from ~/notes --ext txt,md --out data/notes
--   tfhost experiments/make_bytes_dataset.lua --from /usr/lib/python3*/    (a shell pattern: each folder it names)
--
-- Without --from the source is the newest /usr/lib/python3.N/ (site-packages and dist-packages left
-- out); where there is none, name a folder. The results file lists one row per part of the sources
-- (the progress line's steps), and meta.json the counts and the SHA-256 of the source list.
local opt = tf.options{
  description = "Text files into byte-level train/validation token files (uint16), offline.",
  usage = "tfhost experiments/make_bytes_dataset.lua [--from FOLDER,...] [FOLDER ...] [--out DIR] [options]",
  { "from", "source folders, comma-separated (default: the Python standard library's folder)", type = "string" },
  { "ext", "the file name endings read (no dot; *: every file)", default = "py,txt,md,rst", type = "list" },
  { "out", "the folder written: train.bin, val.bin, meta.json", default = "data/bytes", type = "string" },
  { "val_fraction", "the share of the tokens, at the end, that is the validation split", default = 0.1, min = 0,
    max = 0.9 },
  { "parts", "how many steps the progress line counts (parts of the sources, by size)", default = 10, min = 1 },
  { "json", "write the parts (as each is done) and the environment to this file", type = "string" },
}

-- The newest Python standard library of the machine: /usr/lib/python3.N/ with its os.py; nil and
-- whether --safe refused to look.
local function python_library()
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

local folders, from_python = {}, false
for f in (opt.from or ""):gmatch("[^,]+") do folders[#folders + 1] = f end
for _, f in ipairs(opt.args) do folders[#folders + 1] = f end
if #folders == 0 then
  local lib, refused = python_library()
  if not lib then
    tf.exit(2, "make_bytes_dataset.lua: " .. (refused and "--safe may not read /usr/lib/python3.N/" or
      "no Python standard library in /usr/lib/python3.N/") .. "; name the text files' folder with --from\n")
  end
  folders, from_python = { lib }, true
end

-- Every source file: its path, its name relative to its folder (what the list's hash covers) and size.
local wanted = {}
for _, e in ipairs(opt.ext) do
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

local sources, total_bytes = {}, 0
for _, folder in ipairs(folders) do
  local root = folder:gsub("/+$", "")
  local ok, paths = pcall(tf.data.files, root)
  if not ok then tf.exit(2, "make_bytes_dataset.lua: " .. tostring(paths):gsub("^[^\n]-:%d+: ", "") .. "\n") end
  for _, path in ipairs(paths) do
    if chosen(path) then
      local f = io.open(path, "rb")
      if f then -- a file that went away or cannot be read is left out
        local size = f:seek("end")
        f:close()
        sources[#sources + 1] = { path = path, name = path:sub(#root + 2), size = size }
        total_bytes = total_bytes + size
      end
    end
  end
end
if #sources == 0 then
  tf.exit(2, "make_bytes_dataset.lua: no files ending in " .. table.concat(opt.ext, ", ") .. " under " ..
    table.concat(folders, ", ") .. "\n")
end

-- The tokens: every file's bytes, a newline between two files; the last val_fraction are validation.
local total_tokens = total_bytes + #sources - 1
local val_tokens = math.floor(total_tokens * opt.val_fraction)
local train_tokens = total_tokens - val_tokens

-- The parts the progress line counts: runs of files of about equal size.
local parts, part_bytes = {}, total_bytes / math.min(opt.parts, #sources)
do
  local current, acc = nil, 0
  for i, s in ipairs(sources) do
    if not current then
      current = { first = i, bytes = 0 }
      parts[#parts + 1] = current
    end
    current.last, current.bytes = i, current.bytes + s.size
    acc = acc + s.size
    if acc >= part_bytes * #parts and #parts < opt.parts then current = nil end
  end
end

tf.mkdir(opt.out)
local train_path, val_path = opt.out .. "/train.bin", opt.out .. "/val.bin"
-- written under temporary names, renamed when whole: a stopped run never leaves a short dataset
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

local rows = {}
local sweep = tf.report.sweep{ total = #parts, json = opt.json, results = rows, extra = { options = opt },
  costs = (function()
    local c = {}
    for i, p in ipairs(parts) do c[i] = p.bytes + 1 end
    return c
  end)() }
for k, part in ipairs(parts) do
  sweep:start("%s .. %s", sources[part.first].name, sources[part.last].name)
  local tokens = 0
  for i = part.first, part.last do
    if i > 1 then emit("\n") end
    local f = assert(io.open(sources[i].path, "rb"))
    local text = f:read("a") or ""
    f:close()
    emit(text)
    tokens = tokens + #text + (i > 1 and 1 or 0)
  end
  rows[#rows + 1] = { part = k, first = sources[part.first].name, last = sources[part.last].name,
    files = part.last - part.first + 1, tokens = tokens }
  sweep:done()
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
  val_fraction = opt.val_fraction,
  files = #sources,
  sources = folders,
  -- the sorted list of "name<TAB>bytes" lines, one per file, names relative to their folder
  sources_sha256 = tf.sha256(table.concat(list, "\n")),
  train_sha256 = tf.sha256_file(train_path),
  val_sha256 = tf.sha256_file(val_path),
}
tf.json.write(opt.out .. "/meta.json", meta)
print(string.format("%d files, %d tokens: %s (%d), %s (%d), %s", #sources, total_tokens, train_path, train_tokens,
  val_path, val_tokens, opt.out .. "/meta.json"))
sweep:finish{ dataset = meta }
