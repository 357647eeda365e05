--- The CS336 "basics" Transformer LM written with tf's differentiable ops:
-- the readable, PyTorch-like reference (the "eager" model) that the fused
-- engine is checked against.
--
-- token embedding -> num_layers pre-norm blocks
--   [x += attn(rms_norm(x)); x += swiglu(rms_norm(x))] -> rms_norm -> lm_head
-- Attention: separate q/k/v/output projections without biases, RoPE on q
-- and k (interleaved pairs), causal mask, softmax(Q K^T / sqrt(d_k)) V.
-- SwiGLU: w2(silu(w1 x) * w3 x). Parameter names are CS336's state dict.
local nn = require "tf.nn"

local M = {}

--- Several modules as children "0", "1", ... with no forward of their own.
local ModuleList = nn.Module:extend("ModuleList")
function ModuleList:init(modules)
  for i, m in ipairs(modules) do self:add(tostring(i - 1), m) end
end
M.ModuleList = ModuleList

local Attention = nn.Module:extend("CausalMultiHeadSelfAttention")
function Attention:init(cfg, opts)
  local d = cfg.d_model
  self.num_heads, self.head_dim, self.theta = cfg.num_heads, d // cfg.num_heads, cfg.rope_theta
  self.attend_fn = opts.attention -- a function(q, k, v) of the script's in place of attend's own ops
  for _, name in ipairs({ "q_proj", "k_proj", "v_proj", "output_proj" }) do
    self:add(name, nn.Linear(d, d, { bias = false, device = opts.device }))
  end
end

-- (B, T, d) -> (B, H, T, dh)
function Attention:split(x)
  local b, t = x:size(0), x:size(1)
  return x:reshape(b, t, self.num_heads, self.head_dim):transpose(1, 2)
end

-- True above the diagonal: key j is in query i's future. Cached per length.
function Attention:future_mask(t, device)
  local cache = rawget(self, "_mask")
  if not cache or cache:size(0) ~= t or cache.device ~= device then
    local idx = tf.arange(t, { device = device })
    cache = tf.gt(idx:unsqueeze(0), idx:unsqueeze(1))
    rawset(self, "_mask", cache)
  end
  return cache
end

-- softmax(Q K^T / sqrt(d_k)) V under a causal mask, in the ranges CS336's
-- annotated attention uses.
function Attention:attend(q, k, v, t, device)
  if self.attend_fn then
    local out = self.attend_fn(q, k, v)
    if not tf.is_tensor(out) or tostring(out.shape) ~= tostring(q.shape) then
      error(string.format("tf.model: the attention function must return a tensor of q's shape %s, got %s",
        tostring(q.shape), tf.is_tensor(out) and tostring(out.shape) or type(out)), 0)
    end
    return out
  end
  local scores = tf.range("computing attention scores", function()
    return tf.matmul(q, k:transpose(-1, -2)) / math.sqrt(self.head_dim)
  end)
  local probs = tf.range("computing softmax", function()
    return scores:masked_fill(self:future_mask(t, device), -math.huge):softmax(-1)
  end)
  local _ <close> = tf.range("final matmul")
  return tf.matmul(probs, v)
end

function Attention:forward(x)
  local b, t, d = x:size(0), x:size(1), x:size(2)
  local q = tf.rope(self:split(self.q_proj(x)), self.theta)
  local k = tf.rope(self:split(self.k_proj(x)), self.theta)
  local v = self:split(self.v_proj(x))
  local out = tf.range("scaled dot product attention", self.attend, self, q, k, v, t, x.device)
  return self.output_proj(out:transpose(1, 2):reshape(b, t, d))
end

local SwiGLU = nn.Module:extend("SwiGLU")
function SwiGLU:init(cfg, opts)
  self:add("w1", nn.Linear(cfg.d_model, cfg.d_ff, { bias = false, device = opts.device }))
  self:add("w2", nn.Linear(cfg.d_ff, cfg.d_model, { bias = false, device = opts.device }))
  self:add("w3", nn.Linear(cfg.d_model, cfg.d_ff, { bias = false, device = opts.device }))
end
function SwiGLU:forward(x) return self.w2(self.w1(x):silu() * self.w3(x)) end

local Block = nn.Module:extend("TransformerBlock")
function Block:init(cfg, opts)
  self:add("ln1", nn.RMSNorm(cfg.d_model, { device = opts.device }))
  self:add("attn", Attention(cfg, opts))
  self:add("ln2", nn.RMSNorm(cfg.d_model, { device = opts.device }))
  self:add("ffn", SwiGLU(cfg, opts))
end
function Block:forward(x)
  x = x + self.attn(self.ln1(x))
  return x + self.ffn(self.ln2(x))
end

local LM = nn.Module:extend("TransformerLM")
M.TransformerLM = LM

--- TransformerLM(cfg, {device}): cfg has vocab_size, context_length,
-- d_model, num_layers, num_heads, d_ff, rope_theta.
function LM:init(cfg, opts)
  opts = opts or {}
  self.config = cfg
  self:add("token_embeddings", nn.Embedding(cfg.vocab_size, cfg.d_model, { device = opts.device }))
  local blocks = {}
  for i = 1, cfg.num_layers do blocks[i] = Block(cfg, opts) end
  self:add("layers", ModuleList(blocks))
  self:add("ln_final", nn.RMSNorm(cfg.d_model, { device = opts.device }))
  self:add("lm_head", nn.Linear(cfg.d_model, cfg.vocab_size, { bias = false, device = opts.device }))
end

--- Logits (B, T, vocab) for token ids (B, T).
function LM:forward(ids)
  local t = ids:size(-1)
  if t > self.config.context_length then
    error(string.format("TransformerLM: sequence length %d is longer than the context length %d", t,
      self.config.context_length), 2)
  end
  local x = self.token_embeddings(ids)
  for _, name in ipairs(self.layers._names) do x = tf.range("layer " .. name, self.layers[name], x) end
  return self.lm_head(self.ln_final(x))
end

return M
