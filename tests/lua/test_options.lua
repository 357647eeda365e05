-- tf.options: declared script options, parsed from an explicit argv here
-- (the CLI tests run real scripts with --help and bad options).
local T = require "harness"

local decl = {
  description = "test script",
  { "size", "model sizes", default = "small", type = "list", choices = { "small", "medium", "large" } },
  { "context", "context lengths", default = "128,256", type = "list:int" },
  { "steps", "timed steps", default = 10 },
  { "lr", "learning rate", default = 1e-3 },
  { "json", "results file", type = "string" },
  { "verbose", "print more", type = "bool" },
}

T.test("defaults are typed", function()
  local o = tf.options(decl, {})
  T.eq(o.size, { "small" })
  T.eq(o.context, { 128, 256 })
  T.eq(o.steps, 10)
  T.eq(o.lr, 1e-3)
  T.eq(o.json, nil)
  T.eq(o.verbose, false)
  T.eq(o.args, {})
end)

T.test("values in every spelling", function()
  local o = tf.options(decl, { "--size=small,large", "--context", "512", "--steps", "3", "--verbose", "--lr=0.5",
    "extra", "--json", "out.json" })
  T.eq(o.size, { "small", "large" })
  T.eq(o.context, { 512 })
  T.eq(o.steps, 3)
  T.eq(o.lr, 0.5)
  T.eq(o.verbose, true)
  T.eq(o.json, "out.json")
  T.eq(o.args, { "extra" })
  T.eq(tf.options(decl, { "--no-verbose" }).verbose, false)
  T.eq(tf.options(decl, { "--verbose=false" }).verbose, false)
  T.eq(tf.options(decl, { "--", "--steps" }).args, { "--steps" })
  T.eq(require("tf.options").current().args, { "--steps" })
end)

local function usage(argv)
  local ok, err = pcall(tf.options, decl, argv)
  T.eq(ok, false)
  return tostring(err)
end

T.test("bad options are usage errors (exit code 2)", function()
  T.eq(usage({ "--nope" }), "tf.exit(2)")
  T.eq(usage({ "--steps", "abc" }), "tf.exit(2)")
  T.eq(usage({ "--size", "huge" }), "tf.exit(2)")
  T.eq(usage({ "--context", "1,x" }), "tf.exit(2)")
  T.eq(usage({ "--steps" }), "tf.exit(2)")
  T.eq(usage({ "--help" }), "tf.exit(0)")
end)

T.test("declaration errors", function()
  T.raises(function() tf.options({ { "a b", "bad name" } }, {}) end, "needs a name")
  T.raises(function() tf.options({ { "a", "x", type = "complex" } }, {}) end, "unknown type 'complex'")
  T.raises(function() tf.options({ { "a" }, { "a" } }, {}) end, "declared twice")
  T.raises(function() tf.options({ { "n", "x", default = "abc", type = "int" } }, {}) end, "the default of 'n'")
end)

T.run()
