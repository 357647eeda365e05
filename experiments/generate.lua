--- Text in, text out: a byte-level model (vocabulary >= 256, one token a byte, as
-- experiments/make_bytes_dataset.lua and train.lua make them) continues a prompt through
-- m:generate (the fused engine's KV cache: a prefill, then a decode step a token).
--
--   tfhost experiments/generate.lua --weights runs/train/checkpoints/step_00002000.safetensors \
--     --prompt "def main(" --max_new_tokens 200 --temperature 0.8 --top_k 50
--   tfhost experiments/generate.lua --weights runs/train        (a run folder: its newest checkpoint)
--   tfhost experiments/generate.lua --preset tiny --prompt "hello"   (random weights: noise, for a try)
--
-- --weights is a tf.model.save file or a tf.checkpoint (file or folder). Tokens >= 256 (a model
-- with a larger vocabulary) print as <id>.
local opt = tf.options{
  description = "Continue a text prompt with a byte-level Transformer LM (m:generate).",
  { "weights", "a tf.model.save file, a checkpoint file or a checkpoint folder (default: random weights of --preset)",
    type = "string" },
  { "preset", "with no --weights: the random model's size (vocabulary 256)", default = "small", cpu = "tiny",
    type = "string" },
  { "context", "with no --weights: its context length", default = 256, min = 2 },
  { "precision", "with no --weights: f32, bf16 or f16", default = "bf16", cpu = "f32", type = "string",
    choices = { "f32", "bf16", "f16" } },
  { "prompt", "the prompt text", default = "Once upon a time", type = "string" },
  { "file", "read the prompt from this file instead", type = "string" },
  { "max_new_tokens", "bytes to generate (cut to what the context leaves)", default = 200, cpu = 32, min = 1 },
  { "temperature", "0: greedy", default = 0.8, min = 0 },
  { "top_k", "keep the k most likely (0: all)", default = 0, min = 0 },
  { "top_p", "nucleus: the smallest set of probability >= top_p", default = 1.0, min = 0, max = 1 },
  { "seed", "the sampler's seed", default = 0 },
  { "batch", "continuations of the same prompt", default = 1, min = 1 },
  { "stop", "stop a continuation at this byte (a character, e.g. a newline as \\n)", type = "string" },
  { "raw", "write the bytes as they are (default: bytes outside valid UTF-8 as \\xNN)", default = false },
  { "json", "also write the text and the timings (with the environment) to this file", type = "string" },
}

local function die(msg) tf.exit(2, "generate.lua: " .. msg .. "\n") end

-- The model: a saved model, a checkpoint (file or folder) or a random one.
local function load_model()
  local path = opt.weights
  if not path then
    return tf.model.new{ preset = opt.preset, vocab_size = 256, context_length = opt.context, precision = opt.precision }
  end
  local ok, latest = pcall(function() return tf.checkpoint.folder(path):latest() end)
  if ok and latest then path = latest end
  local is_checkpoint = pcall(tf.checkpoint.info, path)
  if is_checkpoint then return (tf.checkpoint.load(path)) end
  return tf.model.load(path)
end

local text = opt.prompt
if opt.file then
  local f = io.open(opt.file, "rb") or die("cannot read " .. opt.file)
  text = f:read("a")
  f:close()
end
if not text or #text == 0 then die("give a prompt: --prompt TEXT or --file PATH") end

local m = load_model()
if m.config.vocab_size < 256 then die(string.format("the model's vocabulary (%d) is not byte-level", m.config.vocab_size)) end
local ctx = m.config.context_length
if #text >= ctx then text = text:sub(#text - ctx + 2) end -- the prompt's end, leaving room for one new byte
local n = math.min(opt.max_new_tokens, ctx - #text)
local row = { string.byte(text, 1, -1) }
local rows = {}
for b = 1, opt.batch do rows[b] = row end
local stop = nil
if opt.stop then stop = string.byte((opt.stop:gsub("\\n", "\n"):gsub("\\t", "\t"))) end

local ids, stats = m:generate(tf.tensor(rows, { dtype = "i64", device = m.device }), {
  max_new_tokens = n, temperature = opt.temperature, top_k = opt.top_k, top_p = opt.top_p, seed = opt.seed,
  stop = stop })

-- s with every byte that is not part of valid UTF-8 written as \xNN (unless --raw).
local function shown(s)
  if opt.raw then return s end
  local parts, at = {}, 1
  while at <= #s do
    local ok, bad = utf8.len(s, at)
    if ok then
      parts[#parts + 1] = s:sub(at)
      break
    end
    parts[#parts + 1] = s:sub(at, bad - 1) .. string.format("\\x%02x", s:byte(bad))
    at = bad + 1
  end
  return table.concat(parts)
end

local outs = {}
for b, r in ipairs(ids:tolist()) do
  local parts = {}
  for _, id in ipairs(r) do
    if id < 0 then break end
    parts[#parts + 1] = id < 256 and string.char(id) or string.format("<%d>", id)
  end
  outs[b] = table.concat(parts)
  if opt.batch > 1 then io.write(string.format("---- %d\n", b)) end
  io.write(shown(text .. outs[b]), "\n")
end
io.stderr:write(string.format("generate.lua: %d x %d bytes; prefill %.2f ms, decode %.1f tokens/s (%s, %s)\n",
  opt.batch, ids:size(1), stats.prefill_ms, stats.decode_tokens_per_s, m.precision, tf.device()))
if opt.json then
  tf.results.write(opt.json, { { prompt = shown(text), text = shown(outs[1]), batch = opt.batch, new_tokens = ids:size(1),
    prefill_ms = stats.prefill_ms, decode_tokens_per_s = stats.decode_tokens_per_s } })
  print("wrote " .. opt.json)
end
