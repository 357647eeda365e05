-- help / tf.help: the REPL's one-line reference. Every entry names a function
-- that exists and that docs/api.md (or README.md) documents.
local T = require "harness"
local H = require "tf.help"

local read = T.read_file

local function printed(fn)
  local out, saved = {}, print
  print = function(...) out[#out + 1] = table.concat({ ... }, "\t") end
  local ok, err = pcall(fn)
  print = saved
  if not ok then error(err, 0) end
  return table.concat(out, "\n")
end

T.test("every entry exists and is documented", function()
  local docs = read("docs/api.md") .. read("README.md")
  T.ok(#H.entries >= 40, "entries: " .. #H.entries)
  for _, e in ipairs(H.entries) do
    local name, sig, summary = e[1], e[2], e[3]
    local v = H.resolve(name)
    T.ok(type(v) == "function" or (type(v) == "table" and getmetatable(v) and getmetatable(v).__call),
      name .. " is not a function of this tfhost")
    T.ok(sig:sub(1, #name) == name, name .. ": the signature starts with the name: " .. sig)
    T.ok(#summary > 0 and #summary <= 100, name .. ": a one-line summary")
    T.ok(docs:find(name, 1, true), name .. " is not in docs/api.md or README.md")
  end
  for _, n in ipairs(H.namespaces) do T.ok(type(H.resolve(n[1])) == "table", n[1]) end
end)

T.test("help() lists the namespaces; help(f) and help(\"name\") print one entry", function()
  T.eq(help, tf.help)
  local overview = printed(function() help() end)
  for _, n in ipairs(H.namespaces) do T.ok(overview:find("\n  " .. n[1] .. " ", 1, true), n[1] .. " listed") end
  T.eq(printed(function() help(tf.matmul) end),
    "tf.matmul(a, b)\n  matrix product, batched and broadcast over leading dims")
  T.eq(printed(function() help("tf.matmul") end), printed(function() tf.help(tf.matmul) end))
  T.ok(printed(function() help(tf.nn) end):find("tf.nn.Linear(in, out [, opts])", 1, true))
  T.ok(printed(function() help(print) end):find("^no help for function"))
  T.ok(printed(function() help("nothing") end):find("no help for 'nothing'", 1, true))
end)

T.run()
