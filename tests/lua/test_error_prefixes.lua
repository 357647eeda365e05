-- Error messages say the function's name once: "tf.matmul: shapes ... do not
-- fit", never "tf.matmul: matmul: shapes ...". Every function of tf (and the
-- fused engine's methods) is called with arguments it refuses, and each
-- message is checked: the words of its second segment must not repeat the
-- end of the first (the function's name). Functions that change the
-- process (exit, options, set_device, seed, allow_tf32) are left out.
local T = require "harness"

local skip = { exit = true, options = true, set_device = true, seed = true, allow_tf32 = true, range = true,
  no_grad = true, enable_grad = true, autocast = true }

-- The words of s, split at spaces, '.', ':' and '_'.
local function words(s)
  local w = {}
  for x in s:gmatch("[^%s%.:_]+") do w[#w + 1] = x end
  return w
end

-- Whether message repeats its first segment's last words as its second segment.
local function doubled(message)
  local body = message:gsub("^[^\n]-%.lua:%d+: ", "") -- a location in front
  local first, second = body:match("^([^:]-[%w_]): ([%w_ ]+): ")
  if not first then first, second = body:match("^([%w_.]+:[%w_]+): ([%w_ ]+): ") end
  if not first then return false end
  local a, b = words(first), words(second)
  if #b == 0 or #b > #a then return false end
  for i = 1, #b do
    if a[#a - #b + i] ~= b[i] then return false end
  end
  return true
end

T.test("the check itself finds a doubled prefix", function()
  T.ok(doubled("tf.matmul: matmul: shapes (2, 3) and (2, 3) do not fit"))
  T.ok(doubled("x.lua:3: model:forward: model forward: token id 9 is out of range"))
  T.ok(not doubled("tf.matmul: shapes (2, 3) and (2, 3) do not fit"))
  T.ok(not doubled("tf.linear: matmul: shapes do not fit"))
end)

T.test("no function of tf repeats its name in its errors", function()
  local a, b = tf.ones({ 2, 3 }), tf.ones({ 4 })
  local argsets = { { a, b }, { "junk" }, { a, "junk" }, { a, 99 }, { tf.tensor({ 1, 2 }), a }, {} }
  local messages, names = 0, {}
  for name, f in pairs(tf) do
    if type(f) == "function" and not skip[name] and not name:match("^_") then names[#names + 1] = name end
  end
  table.sort(names)
  for _, name in ipairs(names) do
    for _, args in ipairs(argsets) do
      local ok, err = pcall(tf[name], table.unpack(args))
      if not ok then
        messages = messages + 1
        T.ok(not doubled(tostring(err)), "tf." .. name .. ": " .. tostring(err))
      end
    end
  end
  os.remove("junk") -- tf.mkdir("junk") made it: an empty folder, left in the working folder otherwise
  print(string.format("%d functions, %d error messages checked", #names, messages))
  T.ok(messages > 100, "enough calls were refused to say something")
end)

T.test("the engine's methods do not repeat their names either", function()
  local m = tf.model.new{ preset = "tiny" }
  local bad = tf.tensor({ { 1, 2, 99999 } })
  for _, call in ipairs({
    function() return m:forward(bad) end,
    function() return m:loss(bad, bad) end,
    function() return m.engine:backward() end,
    function() return m.engine:adamw_step({ step = 0 }) end,
    function() return m.engine:backward_adamw({ step = 1 }) end,
  }) do
    local ok, err = pcall(call)
    T.ok(not ok and not doubled(tostring(err)), tostring(err))
  end
end)

T.run()
