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

T.run()
