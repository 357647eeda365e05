-- The kernels tests/reference/ncu_compare.py counts twice, once under ncu and once under tfhost's own
-- counters: a bf16 GEMM, FlashAttention forward and backward, RMSNorm, SwiGLU (the eager model's
-- form: silu(a) * b), an AdamW step and a cross-entropy, on bf16 GPU tensors (f32 where the op
-- takes f32: AdamW's parameters, the logits). The same work runs once untimed first (cuBLAS's plans,
-- the optimizer's moments, autograd's gradients made), then once inside the range "ncu kernels":
-- ncu is told to count only there (--nvtx --nvtx-include "ncu kernels/"), and with "--counters FILE"
-- this script counts the same pass with metrics = "roofline" and writes what it got: by passes
-- (tf.prof.count: the pass run once per counting pass, and once more replaying each kernel for the
-- SASS metrics, sass = true) unless --replay kernel (tf.prof.start, each
-- kernel replayed).
--
--   tfhost tests/gpu/ncu_kernels.lua                             (under ncu)
--   tfhost tests/gpu/ncu_kernels.lua --counters counted.json     (tfhost's counters)
local opt = tf.options{
  description = "A GEMM, FlashAttention, RMSNorm, SwiGLU, AdamW and cross-entropy, for ncu_compare.py.",
  { "counters", "count the pass with tf.prof.start{metrics = \"roofline\"} and write the kernels to this JSON file",
    type = "string" },
  { "gemm", "the GEMM's M, N and K (one number: a square product)", default = 4096 },
  { "replay", "how the counters' passes are made: run the pass once each, or replay each kernel",
    default = "pass", choices = { "pass", "kernel" } },
}
if not tf.cuda.is_available() then tf.exit(77, "ncu_kernels.lua: needs a CUDA device\n") end
tf.seed(0)
local n = opt.gemm
local a, b = tf.randn({ n, n }):to("bf16"), tf.randn({ n, n }):to("bf16")
-- attention: batch 4, 16 heads, 8192 positions, head dim 64: each tensor 64 MiB, past the L2 cache, so that
-- what one kernel leaves dirty in the L2 for the next to write back is small beside what each moves
local function leaf() return tf.randn({ 4, 16, 8192, 64 }):to("bf16"):requires_grad(true) end
local q, k, v = leaf(), leaf(), leaf()
local dout = tf.randn({ 4, 16, 8192, 64 }):to("bf16")
local x, gain = tf.randn({ 16384, 4096 }):to("bf16"), tf.ones(4096):to("bf16")     -- 128 MiB
local up, gate = tf.randn({ 16384, 4096 }):to("bf16"), tf.randn({ 16384, 4096 }):to("bf16")
local param = tf.randn(1 << 26):requires_grad(true)                                  -- 256 MiB of f32
param.grad = tf.randn(1 << 26)
local adamw = tf.optim.AdamW({ param }, { lr = 1e-3 })
local logits, targets = tf.randn({ 8192, 32768 }), tf.randint(0, 32768, { 8192 })    -- 1 GiB of f32
-- Read before each op (the range "clear"), 4x the L2 cache: every op starts from an L2 holding clean lines
-- of this buffer only, whatever ran before it and however the counting passes are made. Without it an
-- op's DRAM writes include the write-backs of dirty lines its predecessor left in the L2, which differ
-- between ncu's application replay (a new process a pass) and counting passes run back to back.
local clear_buf = tf.randn(1 << 26)                                                   -- 256 MiB of f32
local function clear() tf.range("clear", function() tf.sum(clear_buf):free() end) end

-- One pass, each op in a range of its own (the comparison's labels); nothing kept.
local function pass()
  clear()
  tf.range("gemm", function() tf.matmul(a, b):free() end)
  clear()
  tf.range("flash attention", function()
    local o = tf.attention(q, k, v, { impl = "flash", causal = true })
    o:backward(dout)
    o:free(); q:zero_grad(); k:zero_grad(); v:zero_grad()
  end)
  clear()
  tf.range("rmsnorm", function() tf.rms_norm(x, gain):free() end)
  clear()
  tf.range("swiglu", function() (tf.silu(gate) * up):free() end)
  clear()
  tf.range("adamw", function() adamw:step() end)
  clear()
  tf.range("cross-entropy", function() tf.cross_entropy(logits, targets):free() end)
  clear()
end

pass() -- untimed, uncounted: first-use work stays out of the counted pass
tf.sync()
collectgarbage()
if not opt.counters then
  tf.range("ncu kernels", function()
    pass()
    tf.sync()
  end)
  print("ncu_kernels.lua: one pass launched in the range \"ncu kernels\"")
  tf.exit(0)
end

local function counted_pass()
  tf.range("ncu kernels", function()
    pass()
    tf.sync()
  end)
end
local p
if opt.replay == "pass" then
  p = tf.prof.count(counted_pass, { metrics = "roofline", sass = true }) -- the CUDA cores' FLOPs too
else
  p = tf.prof.start{ metrics = "roofline" }
  counted_pass()
  p:stop()
end
local rec = p:records()
local range_name = {}
for _, r in ipairs(rec.ranges or {}) do range_name[r.id] = r end
-- the op's range of a kernel: the range below "ncu kernels" it was launched in
local function label(id)
  local r = range_name[id]
  while r do
    local parent = range_name[r.parent]
    if parent and parent.name == "ncu kernels" then return r.name end
    r = parent
  end
  return nil
end
local kernels = {}
for _, kr in ipairs(rec.kernels) do kernels[#kernels + 1] = kr end
table.sort(kernels, function(x1, x2) return x1.start_ns < x2.start_ns end)
local out = {}
for i, kr in ipairs(kernels) do
  out[i] = { name = kr.name, short_name = kr.short_name, op = label(kr.range), counters = kr.counters,
    class = tf.prof.classify(kr.short_name or kr.name, kr.name) }
end
local by_name = {}
for _, r in ipairs(p:kernels{ range = "ncu kernels", by = "name" }) do
  by_name[#by_name + 1] = { name = r.name, instances = r.instances, flops = r.flops, flops_by = r.flops_by,
    dram_read = r.dram_read, dram_write = r.dram_write }
end
tf.json.write(opt.counters, { kernels = tf.json.array(out), rows = tf.json.array(by_name), gemm = { m = n, n = n, k = n },
  replay = opt.replay, device = tf.device() }, { indent = true })
print(string.format("ncu_kernels.lua: %d kernels counted (%s replay), written to %s", #out, opt.replay, opt.counters))
