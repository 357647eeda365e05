-- tf.json: round trips, exact integers, floats, NaN policy, nulls, errors.
local T = require "harness"
local json = tf.json

T.test("encode: integers stay integers, floats look like floats, keys sorted", function()
  T.eq(json.encode(3), "3")
  T.eq(json.encode(3.0), "3.0")
  T.eq(json.encode(0.1), "0.1")
  T.eq(json.encode(9007199254740993), "9007199254740993")
  T.eq(json.encode(-1e300), "-1e+300")
  T.eq(json.encode({ b = 1, a = { 1, 2, 3 }, c = "x\"y" }), '{"a":[1,2,3],"b":1,"c":"x\\"y"}')
  T.eq(json.encode({}), "{}")
  T.eq(json.encode(json.array()), "[]")
  T.eq(json.encode({ true, false, json.null }), "[true,false,null]")
  T.eq(json.encode({ [1] = "a", [3] = "c" }), '{"1":"a","3":"c"}')
  local pretty = json.encode({ a = 1 }, { indent = true })
  T.ok(pretty:find("\n"), "indent gives several lines")
end)

T.test("floats read back bit-identical", function()
  for _, v in ipairs({ 0.1, 1 / 3, 1e-310, 123456.789e200, -2.5, 5e-324 }) do
    T.eq(json.decode(json.encode(v)), v)
  end
end)

T.test("NaN and infinity follow the nan option", function()
  T.eq(json.encode({ 0 / 0 }), "[null]")
  T.eq(json.encode({ math.huge, -math.huge, 0 / 0 }, { nan = "string" }), '["Infinity","-Infinity","NaN"]')
  T.raises(function() json.encode(math.huge, { nan = "error" }) end, "infinity cannot be written as JSON")
  T.raises(function() json.encode(1, { nan = "maybe" }) end, "invalid option 'maybe'")
end)

T.test("decode", function()
  local v = json.decode(' {"a": [1, 2.5, null, "s"], "b": {"c": true}, "big": 12345678901} ')
  T.eq(v.a[1], 1)
  T.eq(v.a[2], 2.5)
  T.eq(v.a[3], json.null)
  T.eq(#v.a, 4)
  T.eq(v.b.c, true)
  T.eq(v.big, 12345678901)
  T.eq(math.type(json.decode("7")), "integer")
  T.eq(json.decode('"\\u00e9"'), "é")
  T.raises(function() json.decode("{") end, "invalid JSON")
  T.raises(function() json.decode('{"a": 1} x') end, "invalid JSON at byte 10 near 'x'")
  T.raises(function() json.decode("") end, "invalid JSON")
end)

T.test("encode errors", function()
  T.raises(function() json.encode(print) end, "cannot encode a function")
  T.raises(function() json.encode({ [true] = 1 }) end, "object keys must be strings or integers")
  local cyc = {}
  cyc.self = cyc
  T.raises(function() json.encode(cyc) end, "nested too deeply")
end)

T.test("files", function()
  local path = os.tmpname()
  json.write(path, { x = { 1, 2 }, y = "z" })
  T.eq(json.read(path), { x = { 1, 2 }, y = "z" })
  os.remove(path)
  T.raises(function() json.read("/nonexistent/x.json") end, "tf.json.read")
end)

T.run()
