-- Error messages count dimensions as the API does: from 0, negative from the
-- end, and a dimension the user passed is named as it was passed. Every op of
-- the C registry that broadcasts or takes a dimension (tf._op_table()) and
-- every view, shape query and nn function that takes one is made to fail, and
-- the dimension number in its message is checked.
local T = require "harness"

-- The message of f's error (f must fail).
local function failure(what, f, ...)
  local ok, err = pcall(f, ...)
  T.ok(not ok, what .. ": expected an error")
  return tostring(err)
end

-- The numbers that follow "dimension" in msg.
local function dims_named(msg)
  local out = {}
  for d in msg:gmatch("dimension (%-?%d+)") do out[#out + 1] = tonumber(d) end
  return out
end

local function names_dim(what, msg, want)
  local got = dims_named(msg)
  T.ok(#got > 0, what .. ": the message names no dimension: " .. msg)
  T.eq(got[1], want, what .. ": " .. msg)
end

local covered = {}

T.test("broadcasting ops name the result's dimension, from 0", function()
  local a3, a4, m23 = tf.ones(3), tf.ones(4), tf.ones(2, 3)
  for _, op in ipairs(tf._op_table()) do
    if op.family == "binary" then
      names_dim(op.name .. " (3,) with (4,)", failure(op.name, tf[op.name], a3, a4), 0)
      names_dim(op.name .. " (2, 3) with (4,)", failure(op.name, tf[op.name], m23, a4), 1)
      names_dim("x:" .. op.name, failure(op.name, m23[op.name], m23, tf.ones(4, 3)), 0)
      covered[op.name] = true
    end
  end
  names_dim("+", failure("+", function() return a3 + a4 end), 0)
  names_dim("*", failure("*", function() return m23 * tf.ones(5, 1) end), 0)
  local msg = failure("expand", m23.expand, m23, 2, 4)
  names_dim("expand", msg, 1)
  T.ok(msg:find("(2, 3)", 1, true) and msg:find("(2, 4)", 1, true), "expand names both shapes: " .. msg)
  names_dim("expand with a new leading dimension", failure("expand", m23.expand, m23, 5, 4, 3), 1)
  names_dim("masked_fill", failure("masked_fill", tf.masked_fill, m23, tf.ones(4):eq(1), 0), 1)
end)

T.test("matmul names the batch dimension of the result", function()
  local msg = failure("matmul", tf.matmul, tf.ones(2, 3, 4, 5), tf.ones(3, 3, 5, 6))
  names_dim("matmul batch", msg, 0)
  T.ok(msg:find("(2, 3, 4, 5)", 1, true), "matmul names its shapes: " .. msg)
  names_dim("matmul second batch dim", failure("matmul", tf.matmul, tf.ones(2, 3, 4, 5), tf.ones(2, 4, 5, 6)), 1)
  covered.matmul = true
end)

T.test("reductions name the dimension they were given", function()
  local m = tf.ones(2, 3)
  for _, op in ipairs(tf._op_table()) do
    if op.family == "reduce" then
      local msg = failure(op.name, m[op.name], m, 2)
      names_dim(op.name .. "(2)", msg, 2)
      T.ok(msg:find("0..1", 1, true) and msg:find("-2..-1", 1, true), op.name .. " says the range: " .. msg)
      names_dim(op.name .. "(-3)", failure(op.name, m[op.name], m, -3), -3)
      covered[op.name] = true
    end
  end
end)

T.test("every op of the table that can fail on a dimension was tried", function()
  for _, op in ipairs(tf._op_table()) do
    if op.family ~= "unary" then T.ok(covered[op.name], op.name .. " (" .. op.family .. ") is not tested here") end
  end
end)

T.test("views and shape queries count from 0", function()
  local m = tf.ones(2, 3)
  -- the issue's own examples
  names_dim("narrow(0, 1, 5)", failure("narrow", m.narrow, m, 0, 1, 5), 0)
  names_dim("select(1, 5)", failure("select", m.select, m, 1, 5), 1)
  names_dim("narrow(-1, 2, 2)", failure("narrow", m.narrow, m, -1, 2, 2), -1)
  names_dim("select(-2, 7)", failure("select", m.select, m, -2, 7), -2)
  T.ok(failure("narrow", m.narrow, m, 0, 1, 5):find("of size 2", 1, true), "narrow says the size of dimension 0")
  T.ok(failure("select", m.select, m, 1, 5):find("of size 3", 1, true), "select says the size of dimension 1")
  names_dim("narrow(2, ...)", failure("narrow", m.narrow, m, 2, 0, 1), 2)
  names_dim("select(5, 0)", failure("select", m.select, m, 5, 0), 5)
  names_dim("transpose(0, 2)", failure("transpose", m.transpose, m, 0, 2), 2)
  names_dim("transpose(-3, 0)", failure("transpose", m.transpose, m, -3, 0), -3)
  names_dim("unsqueeze(4)", failure("unsqueeze", m.unsqueeze, m, 4), 4)
  names_dim("squeeze(2)", failure("squeeze", m.squeeze, m, 2), 2)
  names_dim("size(2)", failure("size", m.size, m, 2), 2)
  names_dim("stride(-3)", failure("stride", m.stride, m, -3), -3)
  T.eq(m:size(0), 2, "size(0) is the first dimension")
  T.eq(m:size(-1), 3, "size(-1) the last")
  -- a huge dimension is reported as given, not cut to 32 bits
  local msg = failure("transpose huge", m.transpose, m, 0, 4294967296)
  T.ok(msg:find("4294967296", 1, true), "the dimension as given: " .. msg)
end)

T.test("nn functions with a dimension count from 0", function()
  local m = tf.ones(2, 3)
  names_dim("softmax(2)", failure("softmax", tf.softmax, m, 2), 2)
  names_dim("log_softmax(-3)", failure("log_softmax", tf.log_softmax, m, -3), -3)
end)

T.test("shapes given as sizes name their dimension from 0", function()
  names_dim("zeros(2, -3)", failure("zeros", tf.zeros, 2, -3), 1)
  names_dim("zeros({-1})", failure("zeros", tf.zeros, { -1 }), 0)
  names_dim("ones({2, 'x'})", failure("ones", tf.ones, { 2, "x" }), 1)
  names_dim("reshape(-2, 3)", failure("reshape", tf.ones(6).reshape, tf.ones(6), 3, -2), 1)
end)

T.run()
