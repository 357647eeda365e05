-- 200 training steps of the small model in bf16 on one fixed batch, three
-- ways: m:step as it runs by default (AdamW beside the backward pass, the
-- gradients in the ring, CUDA graphs), the same with the update after each
-- layer on one stream (m:set_overlap(false)), and the step written out as
-- loss, backward, the optimizer's own step and zero_grad (the flat gradient
-- buffer, one AdamW kernel over every parameter, as before the update moved
-- into the backward pass). The three loss curves must be the same bits at
-- every step, and the loss must fall as the model learns the batch. Skipped
-- (77) without a GPU, where the step has no second stream.
local T = require "harness"
T.require_cuda()

local STEPS = tonumber(os.getenv("TF_LONG_RUN_STEPS") or "200")

local function curve(how)
  tf.seed(11)
  local m = tf.model.new{ preset = "small", context_length = 128, precision = "bf16" }
  local ids = tf.randint(0, 10000, { 4, 128 })
  local targets = tf.randint(0, 10000, { 4, 128 })
  local losses = {}
  local opt = m:optimizer()
  if how == "serial" then m:set_overlap(false) end
  for i = 1, STEPS do
    local loss
    if how == "separate" then
      loss = m:loss(ids, targets)
      m:backward()
      opt:step()
      opt:zero_grad()
    else
      loss = m:step(ids, targets)
    end
    losses[i] = loss:item()
    loss:free()
  end
  m = nil
  collectgarbage()
  tf.mem.empty_cache()
  return losses
end

T.test("the step's loss curve: overlapped, serial and separate give the same bits", function()
  local beside, serial, separate = curve("beside"), curve("serial"), curve("separate")
  local first
  for i = STEPS, 1, -1 do
    if beside[i] ~= serial[i] or beside[i] ~= separate[i] then first = i end
  end
  T.eq(first, nil, first and string.format("step %d: losses %.9g (beside), %.9g (serial), %.9g (separate)", first,
    beside[first], serial[first], separate[first]))
  -- a fixed batch is learnt: the loss starts near log(10000) and falls well below it
  T.near(beside[1], math.log(10000), 0.05, 0, "first loss")
  T.ok(beside[STEPS] < 0.5 * beside[1],
    string.format("loss after %d steps %.4f, from %.4f", STEPS, beside[STEPS], beside[1]))
end)

T.run()
