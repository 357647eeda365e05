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

local folders, from_python = {}, false
for f in (opt.from or ""):gmatch("[^,]+") do folders[#folders + 1] = f end
for _, f in ipairs(opt.args) do folders[#folders + 1] = f end
if #folders == 0 then
  local lib, refused = tf.data.python_library()
  if not lib then
    tf.exit(2, "make_bytes_dataset.lua: " .. (refused and "--safe may not read /usr/lib/python3.N/" or
      "no Python standard library in /usr/lib/python3.N/") .. "; name the text files' folder with --from\n")
  end
  folders, from_python = { lib }, true
end

local rows, sweep = {}, nil
local function on_part(k, parts, tokens)
  local part = parts[k]
  if not tokens then
    if not sweep then
      local costs = {}
      for i, p in ipairs(parts) do costs[i] = p.bytes + 1 end
      sweep = tf.report.sweep{ total = #parts, json = opt.json, results = rows, extra = { options = opt }, costs = costs }
    end
    sweep:start("%s .. %s", part.first_name, part.last_name)
    return
  end
  rows[#rows + 1] = { part = k, first = part.first_name, last = part.last_name, files = part.files, tokens = tokens }
  sweep:done()
end
local ok, meta = pcall(tf.data.make_bytes, { from = folders, out = opt.out, ext = opt.ext,
  val_fraction = opt.val_fraction, parts = opt.parts, python = from_python, on_part = on_part })
if not ok then tf.exit(2, "make_bytes_dataset.lua: " .. tostring(meta) .. "\n") end
print(string.format("%d files, %d tokens: %s (%d), %s (%d), %s", meta.files, meta.train_tokens + meta.val_tokens,
  opt.out .. "/train.bin", meta.train_tokens, opt.out .. "/val.bin", meta.val_tokens, opt.out .. "/meta.json"))
sweep:finish{ dataset = meta }
