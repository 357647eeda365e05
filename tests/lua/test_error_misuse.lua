-- Misuse that used to pass silently: x[1] on a tensor returned nil, an
-- unknown field returned nil, and empty ids gave the eager model a
-- (1, 0, vocab) tensor where the fused one refused them. Each is now an
-- error at the caller's line that says what to do instead.
local T = require "harness"

local here = debug.getinfo(1, "S").short_src

local function failure(f)
  local ok, err = pcall(f)
  T.ok(not ok, "expected an error")
  err = tostring(err)
  T.ok(err:sub(1, #here + 1) == here .. ":", "the position is the caller's: " .. err)
  return err
end

T.test("x[i] is an error that points at select, item and tolist", function()
  local x = tf.tensor({ 10, 20, 30 })
  for _, key in ipairs({ 1, 0, -1, 1.5, true }) do
    local err = failure(function() return x[key] end)
    T.ok(err:find("x[" .. tostring(key) .. "]", 1, true), err)
    for _, hint in ipairs({ "x:select", "x:item()", "x:tolist()" }) do T.ok(err:find(hint, 1, true), hint .. ": " .. err) end
  end
  -- what the message suggests works
  T.eq(x:select(0, 1):item(), 20)
  T.eq(x:tolist()[1], 10)
end)

T.test("an unknown field is an error naming it; fields that may be absent stay nil", function()
  local x = tf.ones(2)
  local err = failure(function() return x.nope end)
  T.ok(err:find("tf.Tensor has no field 'nope'", 1, true), err)
  T.ok(err:find("shape", 1, true) and err:find("grad", 1, true), "the fields are listed: " .. err)
  failure(function() return x.lenght end)
  -- probing that scripts rely on
  T.eq(x.grad, nil, "no gradient yet")
  T.eq(x.grad_fn, nil, "a leaf has no grad_fn")
  T.eq(x.is_leaf, true)
  local y = (x:requires_grad(true) * 2):sum()
  T.eq(y.grad_fn ~= nil, true, "an op's result has one")
  y:backward()
  T.ok(tf.is_tensor(x.grad), "and a gradient after backward")
  T.eq(type(x.sum), "function", "methods are found as before")
  T.eq(tostring(x.shape), "(2,)")
end)

T.test("empty ids: the same error from the eager and the fused model, naming the shape", function()
  local impls = { "eager" }
  if tf._model then impls[#impls + 1] = "fused" end
  local messages = {}
  for _, impl in ipairs(impls) do
    local m = tf.model.new{ preset = "tiny", context_length = 8, impl = impl, device = "cpu" }
    for _, shape in ipairs({ { 1, 0 }, { 0, 4 } }) do
      local ids = tf.zeros(shape, { dtype = "i64", device = "cpu" })
      local err = failure(function() return m:forward(ids) end)
      T.ok(err:find("model:forward: ids must not be empty (shape " .. tostring(ids.shape) .. ")", 1, true),
        impl .. ": " .. err)
      err = failure(function() return m:loss(ids, ids) end)
      T.ok(err:find("model:loss: ids must not be empty", 1, true), impl .. ": " .. err)
      messages[impl .. tostring(ids.shape)] = err:gsub("^[^:]+:%d+: ", "")
    end
  end
  if tf._model then
    T.eq(messages["eager(1, 0)"], messages["fused(1, 0)"], "one behaviour")
  end
end)

T.run()
