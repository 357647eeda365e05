--- tfhost's side of hf_generate.py: a model of --size (tfhost's initialisation, --seed), its weights
-- (m:save), a random prompt, greedy generation through the KV cache, and the logits of the prefill
-- and of every decode step, written into --out for the reference to check.
--
--   tfhost tests/reference/generate_dump.lua --size small --precision bf16 --out /tmp/gen_check
local opt = tf.options{
  description = "Writes a model, a prompt, its greedy continuation and each step's logits for hf_generate.py.",
  { "size", "the model preset", default = "small", cpu = "tiny", type = "string" },
  { "precision", "f32, bf16 or f16", default = "bf16", type = "string", choices = { "f32", "bf16", "f16" } },
  { "batch", "rows", default = 2, min = 1 },
  { "prompt", "prompt tokens a row", default = 16, min = 1 },
  { "new_tokens", "greedy tokens a row", default = 32, min = 1 },
  { "seed", "the model's and the prompt's seed", default = 1 },
  { "out", "the folder written", default = "gen_check", type = "string" },
}
tf.mkdir(opt.out)
tf.seed(opt.seed)
local m = tf.model.new{ preset = opt.size, context_length = opt.prompt + opt.new_tokens, precision = opt.precision }
m:save(opt.out .. "/weights.safetensors")
local B, T, n, V = opt.batch, opt.prompt, opt.new_tokens, m.config.vocab_size
local prompt = tf.randint(0, V, { B, T }, { dtype = "i64" })
local logits = m.engine:prefill(prompt, T + n)
local steps, tokens = {}, {}
for b = 1, B do tokens[b] = {} end
for s = 1, n do
  local rows = logits:to("cpu", "f32")
  steps[s] = rows
  local next = {}
  for b = 1, B do
    local row = rows:select(0, b - 1):tolist()
    local best = 1
    for i = 2, V do if row[i] > row[best] then best = i end end
    next[b] = best - 1
    tokens[b][s] = best - 1
  end
  if s < n then logits = m.engine:decode_step(next) end
end
local _, stats = m:generate(prompt, { max_new_tokens = n })
local out = { prompt = prompt, tokens = tf.tensor(tokens, { dtype = "i64" }) }
for s, rows in ipairs(steps) do out[string.format("logits.%d", s - 1)] = rows end -- (batch, V) of new token s
tf.safetensors.save(opt.out .. "/outputs.safetensors", out, { precision = opt.precision, size = opt.size, decode_tokens_per_s = tostring(stats.decode_tokens_per_s) })
print(string.format("wrote %s: %s %s, batch %d, prompt %d, %d greedy tokens", opt.out, opt.size, opt.precision, B, T, n))
