-- Results files carry the environment needed to reproduce a run.
local T = require "harness"

T.test("env records version, device, seed, options and date", function()
  tf.seed(99)
  tf.options({ { "steps", "timed steps", default = 4 } }, { "--steps", "6" })
  local env = tf.results.env()
  T.eq(env.tfhost.version, tf.version)
  T.eq(env.tfhost.commit, tf.commit)
  T.eq(env.seed, 99)
  T.eq(env.options.steps, 6)
  T.ok(env.date:match("^%d%d%d%d%-%d%d%-%d%dT"), env.date)
  T.ok(type(env.device) == "string" and #env.device > 0)
  T.ok(env.host.lua:find("Lua 5.4", 1, true))
  if tf.cuda.is_available() then
    T.ok(env.driver_version > 0 and env.cuda_runtime_version > 0)
  end
end)

T.test("write produces JSON with env and results", function()
  local path = os.tmpname()
  tf.results.write(path, { { a = 1, b = 0 / 0 } }, { summary = "ok" })
  local doc = tf.json.read(path)
  os.remove(path)
  T.eq(doc.results[1].a, 1)
  T.eq(doc.results[1].b, tf.json.null)
  T.eq(doc.summary, "ok")
  T.eq(doc.env.tfhost.version, tf.version)
end)


T.test("sha256 gives the FIPS 180-4 digests, across block boundaries", function()
  T.eq(tf.sha256(""), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855")
  T.eq(tf.sha256("abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad")
  T.eq(tf.sha256("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq"),
    "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1")
  T.eq(tf.sha256(string.rep("a", 1000000)), "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0")
  -- a file hashes as its bytes do, whatever their length around the 56- and 64-byte edges
  local path = os.tmpname()
  for _, n in ipairs({ 0, 55, 56, 63, 64, 65, 119, 120, 70000 }) do
    local text = string.rep("x", n)
    local f = assert(io.open(path, "wb"))
    f:write(text)
    f:close()
    T.eq(tf.sha256_file(path), tf.sha256(text), "length " .. n)
  end
  os.remove(path)
  T.raises(function() tf.sha256_file(path) end, path)
end)

T.test("env says where the results came from: script, binary, command, start and duration", function()
  local env = tf.results.env()
  T.eq(env.script, arg[0])
  T.eq(env.script_sha256, tf.sha256_file(arg[0]))
  T.ok(env.tfhost.binary and env.tfhost.binary:find("tfhost", 1, true), tostring(env.tfhost.binary))
  T.eq(env.tfhost.binary_sha256, tf.sha256_file(tf.executable()))
  T.eq(env.tfhost.build, tf.build_options)
  T.eq(env.command[#env.command - #arg], arg[0])
  local first = 0
  while arg[first - 1] ~= nil do first = first - 1 end
  T.eq(#env.command, #arg - first + 1)
  T.eq(env.command[1], arg[first])
  T.ok(env.started:match("^%d%d%d%d%-%d%d%-%d%dT%d%d:%d%d:%d%dZ$"), env.started)
  T.ok(env.started <= env.date, env.started .. " <= " .. env.date)
  T.ok(type(env.duration_s) == "number" and env.duration_s >= 0, tostring(env.duration_s))
end)

T.test("the script's hash is the source as it started, not as edited later", function()
  local dir = os.tmpname()
  os.remove(dir)
  local script = dir .. ".lua"
  local function put(text)
    local f = assert(io.open(script, "w"))
    f:write(text)
    f:close()
  end
  put([[
local opt = tf.options{ { "out", "results file", type = "string" } }
local f = assert(io.open(arg[0], "a"))
f:write("-- edited while running\n")
f:close()
tf.results.write(opt.out, { { a = 1 } })
]])
  local first = tf.sha256_file(script)
  local out = dir .. ".json"
  local exe = tf.executable()
  T.ok(os.execute(string.format("'%s' '%s' --out '%s'", exe, script, out)), "the script ran")
  local _, doc = tf.results.read(out)
  T.eq(doc.env.script_sha256, first)
  T.ok(tf.sha256_file(script) ~= first, "the file did change")
  os.remove(script)
  os.remove(out)
end)

T.test("read gives the rows back, NaN as nil, with the document", function()
  local path = os.tmpname()
  tf.results.write(path, { { size = "small", ms = 1.5, n = 3 }, { size = "large", ms = 0 / 0, n = 4 } },
    { key = { "size" }, metrics = { "ms" } })
  local rows, doc = tf.results.read(path)
  os.remove(path)
  T.eq(rows, { { size = "small", ms = 1.5, n = 3 }, { size = "large", n = 4 } })
  T.eq(doc.key, { "size" })
  T.eq(doc.metrics, { "ms" })
  T.eq(doc.env.script_sha256, tf.sha256_file(arg[0]))
end)

T.test("read names the file and what is missing in a file that is not a results file", function()
  local path = os.tmpname()
  local function with(text, part)
    local f = assert(io.open(path, "w"))
    f:write(text)
    f:close()
    return function() return tf.results.read(path, part and { part = part } or nil) end
  end
  T.raises(with("{\"results\": [1"), path .. ": not JSON")
  T.raises(with("[1, 2]"), path .. ": not a results file: the top level is a list")
  T.raises(with("3"), path .. ": not a results file: the top level is a number")
  T.raises(with("{\"env\": {}, \"rows\": []}"), path .. ": not a results file: no \"results\" field (it has env, rows)")
  T.raises(with("{\"results\": 7}"), "\"results\" is a number, not a list of rows")
  T.raises(with("{\"results\": [{\"a\": 1}, 5]}"), "results[2] is a number, not a row")
  T.raises(with("{\"results\": {\"x\": [], \"y\": []}}"), "\"results\" holds named parts (x, y)")
  T.raises(with("{\"results\": {\"x\": [], \"y\": []}}", "z"), "\"results\" has no part \"z\" (it has x, y)")
  T.eq(with("{\"results\": {\"x\": [{\"a\": 1}]}}", "x")(), { { a = 1 } })
  os.remove(path)
  T.raises(function() tf.results.read(path) end, path)
  T.raises(function() tf.results.read(42) end, "tf.results.read: expects a file path")
end)

T.run()
