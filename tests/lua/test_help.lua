-- help / tf.help: the REPL's one-line reference. Every public function of tf
-- and of the tables in it (found by walking them, so a new function without
-- an entry fails here) and every tensor method has an entry; every entry
-- names a function that exists and that docs/api.md (docs/distributed.md
-- for tf.dist, docs/kernels.md, docs/training.md for tf.data, or README.md) documents. Also the REPL's Tab completion and its printing of tables.
local T = require "harness"
local H = require "tf.help"
local show = require "tf.show"

local read = T.read_file

local function printed(fn)
  local out, saved = {}, print
  print = function(...)
    local args = table.pack(...)
    for i = 1, args.n do args[i] = tostring(args[i]) end
    out[#out + 1] = table.concat(args, "\t", 1, args.n)
  end
  local ok, err = pcall(fn)
  print = saved
  if not ok then error(err, 0) end
  return table.concat(out, "\n")
end

local function callable(v)
  local mt = getmetatable(v)
  return type(v) == "function" or (type(v) == "table" and type(mt) == "table" and mt.__call ~= nil)
end

-- A module class (tf.nn.Linear) is its own __index. Its init is the
-- constructor (the class's entry says how to call it), and a method it shares
-- with the class it extends (forward) is that method's entry.
local function covered_by_class(t, k)
  if rawget(t, "__index") ~= t then return false end
  local base = getmetatable(t) and getmetatable(t).__index
  return k == "init" or (type(base) == "table" and base[k] ~= nil)
end

-- Every public function reachable from tf: name -> value.
local function public_functions()
  local found, walked = {}, {}
  local function walk(t, prefix)
    walked[t] = true
    for k, v in pairs(t) do
      if type(k) == "string" and k:sub(1, 1) ~= "_" then
        local name = prefix .. "." .. k
        if callable(v) and not covered_by_class(t, k) then found[name] = v end
        if type(v) == "table" and not walked[v] then walk(v, name) end
      end
    end
  end
  walk(tf, "tf")
  return found
end

-- Where the docs name a function: its full name; a method's form (x:sum(,
-- m:zero_grad(); for an op, its bare name in a code span (the op tables:
-- `exp log sqrt ...`); a collective's _async form, as the docs give them all
-- (`tf.dist.<collective>_async(...)`).
local function documented(docs, name)
  if docs:find(name, 1, true) then return true end
  local blocking = name:match("^(tf%.dist%.[%w_]+)_async$")
  if blocking then return docs:find("tf.dist.<collective>_async", 1, true) ~= nil and documented(docs, blocking) end
  local short = name:match("([%w_]+)$")
  if docs:find(":" .. short .. "(", 1, true) then return true end
  for span in docs:gmatch("`([^`\n]+)`") do
    if span:find("%f[%w_]" .. short .. "%f[^%w_]") then return true end
  end
  return false
end

T.test("every entry exists and is documented", function()
  local docs = read("docs/api.md") .. read("docs/distributed.md") .. read("docs/kernels.md") .. read("docs/training.md")
    .. read("README.md")
  T.ok(#H.entries >= 150, "entries: " .. #H.entries)
  local names, undocumented = {}, {}
  for _, e in ipairs(H.entries) do
    local name, sig, summary = e[1], e[2], e[3]
    T.ok(not names[name], name .. " has two entries")
    names[name] = true
    T.ok(callable(H.resolve(name)), name .. " is not a function of this tfhost")
    local short = name:match("([%w_]+)$")
    local colon = name:gsub("%.([%w_]+)$", ":%1")
    T.ok(sig:match("^" .. name:gsub("%p", "%%%0") .. "[({]") or sig:sub(1, #colon + 1) == colon .. "("
      or sig:match("^[%a_][%w_]*:" .. short .. "%("), name .. ": the signature starts with the name: " .. sig)
    T.ok(#summary > 0 and #summary <= 100, name .. ": a one-line summary")
    if not documented(docs, name) then undocumented[#undocumented + 1] = name end
  end
  T.eq(undocumented, {}, "entries that docs/api.md and README.md do not name")
  for _, n in ipairs(H.namespaces) do T.ok(type(H.resolve(n[1])) == "table", n[1]) end
end)

T.test("every public function of tf, its tables and tensors has an entry", function()
  local by_value = {}
  for _, e in ipairs(H.entries) do by_value[H.resolve(e[1])] = e[1] end
  local found, missing = public_functions(), {}
  for name, v in pairs(found) do
    if not by_value[v] then missing[#missing + 1] = name end
  end
  table.sort(missing)
  T.eq(missing, {}, "functions without a help entry")
  T.ok(found["tf.sum"] and found["tf.Tensor.reshape"] and found["tf.nn.GELU"] and found["tf.report.formats.csv"],
    "the walk reaches ops, tensor methods, tf.nn's classes and nested tables")
  T.ok(not found["tf.nn.Linear.forward"] and not found["tf.nn.Linear.init"] and found["tf.nn.Module.forward"],
    "a class's own init and forward are its entry's and the base class's")
  for name, v in pairs(found) do
    T.ok(not printed(function() help(v) end):find("^no help"), "help(" .. name .. ")")
  end
end)

T.test("help() lists the namespaces; help(f) and help(\"name\") print one entry", function()
  T.eq(help, tf.help)
  local overview = printed(function() help() end)
  for _, n in ipairs(H.namespaces) do T.ok(overview:find("\n  " .. n[1] .. " ", 1, true), n[1] .. " listed") end
  T.eq(printed(function() help(tf.matmul) end),
    "tf.matmul(a, b)\n  matrix product, batched and broadcast over leading dims\n  also a tensor method: a:matmul(b)")
  T.eq(printed(function() help("tf.matmul") end), printed(function() tf.help(tf.matmul) end))
  T.ok(printed(function() help(print) end):find("^no help for function"))
  T.ok(printed(function() help("nothing") end):find("no help for 'nothing'", 1, true))
end)

T.test("help(tf.nn) lists every module and table of tf.nn", function()
  local text = printed(function() help(tf.nn) end)
  local n = 0
  for k in pairs(tf.nn) do
    n = n + 1
    T.ok(text:find("tf.nn." .. k, 1, true), "help(tf.nn) lists tf.nn." .. k)
  end
  T.ok(n >= 12, "tf.nn has its modules")
  T.ok(text:find("tf.nn.GELU()", 1, true))
  T.ok(printed(function() help(tf.nn.Module) end):find("m:zero_grad()", 1, true))
  T.eq(printed(function() help(tf.nn.Linear(2, 3)) end), printed(function() help(tf.nn.Linear) end))
  T.ok(printed(function() help(tf.report.formats) end):find("tf.report.formats.csv(rows, opts)", 1, true))
end)

T.test("a tensor's methods resolve to their entries", function()
  local x = tf.ones(2, 3, { device = "cpu" })
  T.eq(printed(function() help(x.sum) end),
    "tf.sum(x [, dim [, keepdim]])\n  sum of all elements, or along dim (f32 under autocast)\n" ..
    "  also a tensor method: x:sum([dim [, keepdim]])")
  T.ok(printed(function() help(x.reshape) end):find("^x:reshape%(shape%.%.%.%)"))
  T.eq(printed(function() help("tf.Tensor.reshape") end), printed(function() help(x.reshape) end))
  local listing = printed(function() help(x) end)
  T.eq(listing, printed(function() help(tf.Tensor) end))
  for _, f in ipairs(H.tensor_fields) do T.ok(listing:find("x." .. f[1], 1, true), "help(x) lists x." .. f[1]) end
  T.ok(listing:find(" sum ", 1, true) and listing:find("x:backward(", 1, true))
end)

T.test("the tensor fields help lists are the ones a tensor has", function()
  local w = tf.ones(3, { device = "cpu" }):requires_grad(true)
  local y = (w * 2):sum()
  y:backward()
  for _, f in ipairs(H.tensor_fields) do
    local holder = f[1] == "grad_fn" and y or w
    T.ok(holder[f[1]] ~= nil, "x." .. f[1] .. " reads as a field")
  end
end)

T.test("Tab completes globals, fields, a tensor's methods and fields", function()
  local saved = rawget(_G, "w")
  rawset(_G, "w", tf.ones(2, { device = "cpu" }):requires_grad(true))
  local ok, err = pcall(function()
    T.eq(H.complete("w.gr"), { "w.grad", "w.grad_fn" })
    local dot = table.concat(H.complete("w."), " ")
    for _, f in ipairs({ "w.shape", "w.dtype", "w.device", "w.ndim", "w.sum", "w.reshape" }) do
      T.ok((" " .. dot .. " "):find(" " .. f .. " ", 1, true), f .. " is offered after w.")
    end
    local colon = table.concat(H.complete("w:"), " ")
    T.ok(colon:find("w:sum", 1, true) and not colon:find("w:shape", 1, true), "after ':' only methods")
    T.eq(H.complete("w:resh"), { "w:reshape" })
    T.eq(H.complete("tf.nn.GE"), { "tf.nn.GELU" })
    T.eq(H.complete("tf.matm"), { "tf.matmul" })
    T.eq(H.complete("(1"), {})
  end)
  rawset(_G, "w", saved)
  if not ok then error(err, 0) end
end)

T.test("the REPL prints tables as Lua tables", function()
  local stats = tf.mem.stats("cpu")
  local text = show.text(stats)
  T.ok(text:find("^{\n  active_blocks = %d+,\n"), text)
  T.eq(load("return " .. text)(), stats, "the text reads back as the table")
  T.eq(show.text({ 1, 2, { a = 1, ["b c"] = "x\ny" }, [10] = true }),
    '{ 1, 2, { a = 1, ["b c"] = "x\\ny" }, [10] = true }')
  T.eq(show.text({}), "{}")
  T.eq(show.text({ a = { b = { c = { d = { e = 1 } } } } }), "{ a = { b = { c = { d = {...} } } } }")
  local cyclic = {}
  cyclic.self = cyclic
  T.ok(show.text(cyclic):find("^{ self = <cycle: table: "))
  local big = {}
  for i = 1, 1000 do big[i] = i end
  local long = show.text(big)
  T.ok(long:find("... (950 more),", 1, true) and #long < 1000, "a long table is cut short")
  local x = tf.ones(2, { device = "cpu" })
  T.eq(show.text({ x = x, shape = x.shape }), "{ shape = (2,), x = tensor(shape=(2,), dtype=f32, device=cpu) }")
  T.eq(show.text(x), tostring(x), "a tensor alone prints with its values")
  T.eq(show.text("s"), "s")
  T.eq(printed(function() show.print(1, { 2 }, "s", nil) end), "1\t{ 2 }\ts\tnil")
end)

T.run()
