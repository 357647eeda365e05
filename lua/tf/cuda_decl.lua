--- The declarations of a CUDA source's kernels, read by tf.cuda.compile so that a launch can be
-- checked before it is made: each __global__ function's name, its template parameters, and its
-- parameter list, with the types turned into what the launcher packs (a tensor's data pointer, a
-- tf::view, or a number of so many bytes).
--
--   local decl = require "tf.cuda_decl"
--   local kernels = decl.parse(source)           -- name -> {name, template, params}
--   local params = decl.instance(kernels, "row_softmax<256, float>")
local M = {}

-- Comments, string and character literals become spaces (newlines kept), so that what follows
-- reads only code.
local function strip(src)
  local out, i, n = {}, 1, #src
  while i <= n do
    local j = src:find("[/\"']", i)
    if not j then
      out[#out + 1] = src:sub(i)
      break
    end
    out[#out + 1] = src:sub(i, j - 1)
    local c, d = src:sub(j, j), src:sub(j + 1, j + 1)
    if c == "/" and d == "/" then
      local e = src:find("\n", j, true) or n + 1
      out[#out + 1] = string.rep(" ", e - j)
      i = e
    elseif c == "/" and d == "*" then
      local _, e = src:find("*/", j + 2, true)
      e = e or n
      out[#out + 1] = (src:sub(j, e):gsub("[^\n]+", function(run) return string.rep(" ", #run) end))
      i = e + 1
    elseif c == "/" then
      out[#out + 1] = c
      i = j + 1
    else -- a string or character literal, to its closing quote (escapes skipped)
      local k = j + 1
      while k <= n do
        k = src:find(c == '"' and '[\\"]' or "[\\']", k) or n + 1
        if k > n or src:sub(k, k) == c then break end
        k = k + 2
      end
      out[#out + 1] = c .. string.rep(" ", k - j - 1) .. c
      i = k + 1
    end
  end
  return table.concat(out)
end
M.strip = strip

-- Splits s at top-level commas (outside <>, (), [] and {}); pieces trimmed.
local function split_top(s)
  local parts, depth, start, i = {}, 0, 1, 1
  while true do -- from bracket to bracket: a character at a time costs milliseconds on a long source
    i = s:find("[<>%(%)%[%]{},]", i)
    if not i then break end
    local c = s:sub(i, i)
    if c == "<" or c == "(" or c == "[" or c == "{" then
      depth = depth + 1
    elseif c == ">" or c == ")" or c == "]" or c == "}" then
      depth = depth - 1
    elseif depth == 0 then
      parts[#parts + 1] = s:sub(start, i - 1)
      start = i + 1
    end
    i = i + 1
  end
  parts[#parts + 1] = s:sub(start)
  for i, p in ipairs(parts) do parts[i] = p:match("^%s*(.-)%s*$") end
  if #parts == 1 and parts[1] == "" then return {} end
  return parts
end
M.split_top = split_top

-- The index just past the bracket that closes the one at i (open/close: "(" ")" or "<" ">").
local function closing(s, i, open, close)
  local depth, pattern, j = 0, "[%" .. open .. "%" .. close .. "]", i
  while true do
    j = s:find(pattern, j)
    if not j then return nil end
    if s:sub(j, j) == open then
      depth = depth + 1
    else
      depth = depth - 1
      if depth == 0 then return j end
    end
    j = j + 1
  end
end

-- A template parameter list's entries: {kind = "type" | "value", name, default}
local function template_params(text)
  local out = {}
  for _, p in ipairs(split_top(text)) do
    local decl, default = p:match("^(.-)%s*=%s*(.+)$")
    decl = decl or p
    local name = decl:match("([%w_]+)%s*$")
    local kind = (decl:match("^typename%f[^%w_]") or decl:match("^class%f[^%w_]")) and "type" or "value"
    out[#out + 1] = { kind = kind, name = name, default = default }
  end
  return out
end

--- parse(source) -> {[name] = {name, template = {...} | nil, params = {{type, name}, ...}, line}}
-- Every __global__ function of the source (its first declaration when it is declared twice).
function M.parse(source)
  local code = strip(source)
  local kernels = {}
  local pos, line, counted = 1, 1, 1 -- the line of code:sub(counted, counted): strip keeps the newlines
  while true do
    -- a plain search, then the word's boundaries (a pattern tried at every position costs ms)
    local s, e = code:find("__global__", pos, true)
    if not s then break end
    pos = e + 1
    if s > 1 and code:sub(s - 1, s - 1):find("[%w_]") or code:sub(e + 1, e + 1):find("[%w_]") then goto next end
    -- the name: the identifier before the parameter list's "(", past attributes such as
    -- __launch_bounds__(256) and the return type
    local j = e + 1
    local name, open
    while true do
      local a, b, word = code:find("^%s*([%w_:]+)", j)
      if not a then break end
      local after = code:find("^%s*%(", b + 1)
      if after then
        if word:match("^__launch_bounds__$") or word:match("^__attribute__$") or word:match("^__cluster_dims__$")
            or word:match("^__maxnreg__$") then
          local p = code:find("%(", b + 1)
          j = closing(code, p, "(", ")") + 1
        else
          name, open = word, code:find("%(", b + 1)
          break
        end
      else
        j = b + 1
      end
    end
    if name and open then
      local close = closing(code, open, "(", ")")
      if close then
        local params = {}
        for _, p in ipairs(split_top(code:sub(open + 1, close - 1))) do
          if p ~= "void" then
            p = p:gsub("%s*=.*$", "")
            local pname = p:match("([%w_]+)%s*$")
            local ptype = p:sub(1, #p - #pname):match("^%s*(.-)%s*$")
            if ptype == "" then ptype, pname = pname, "?" end
            params[#params + 1] = { type = ptype, name = pname }
          end
        end
        -- a template: "template <...>" just before (extern "C" and static may stand between)
        local before = code:sub(math.max(1, s - 2000), s - 1)
        local template
        local ts, from = nil, 1
        while true do -- the last "template <" before the kernel
          local a, b = before:find("template", from, true)
          if not a then break end
          if before:find("^%s*<", b + 1) then ts = a end
          from = b + 1
        end
        if ts then
          local lt = before:find("<", ts)
          local gt = closing(before, lt, "<", ">")
          if gt and before:sub(gt + 1):match("^[%s%w_\"]*$") and not before:sub(gt + 1):find(";", 1, true) then
            template = template_params(before:sub(lt + 1, gt - 1))
          end
        end
        for _ in code:sub(counted, s - 1):gmatch("\n") do line = line + 1 end -- lines up to the kernel
        counted = s
        kernels[name] = kernels[name] or { name = name, template = template, params = params, line = line }
        pos = close + 1
      end
    end
    ::next::
  end
  return kernels
end

-- ---- types --------------------------------------------------------------------------------------

-- The dtype a pointer's element type is read as (nil: any tensor is accepted).
local ELEMENT = {
  float = "f32", float2 = "f32", float4 = "f32", double = "f64", double2 = "f64",
  __half = "f16", half = "f16", __half2 = "f16", half2 = "f16",
  __nv_bfloat16 = "bf16", nv_bfloat16 = "bf16", __nv_bfloat162 = "bf16", nv_bfloat162 = "bf16",
  int = "i32", int32_t = "i32", ["signed int"] = "i32", int2 = "i32", int4 = "i32",
  ["long long"] = "i64", ["long long int"] = "i64", int64_t = "i64", longlong2 = "i64",
  bool = "bool",
}

-- Numbers passed by value: kind and bytes.
local SCALAR = {
  float = { "float", 4 }, double = { "float", 8 },
  bool = { "bool", 1 },
  char = { "int", 1 }, ["signed char"] = { "int", 1 }, int8_t = { "int", 1 },
  ["unsigned char"] = { "uint", 1 }, uint8_t = { "uint", 1 },
  short = { "int", 2 }, int16_t = { "int", 2 }, ["unsigned short"] = { "uint", 2 }, uint16_t = { "uint", 2 },
  int = { "int", 4 }, int32_t = { "int", 4 }, signed = { "int", 4 }, ["signed int"] = { "int", 4 },
  unsigned = { "uint", 4 }, ["unsigned int"] = { "uint", 4 }, uint32_t = { "uint", 4 },
  long = { "int", 8 }, ["long int"] = { "int", 8 }, ["long long"] = { "int", 8 }, ["long long int"] = { "int", 8 },
  int64_t = { "int", 8 }, ptrdiff_t = { "int", 8 },
  ["unsigned long"] = { "uint", 8 }, ["unsigned long long"] = { "uint", 8 }, uint64_t = { "uint", 8 },
  size_t = { "uint", 8 },
}

local function normalise(t)
  t = " " .. t .. " "
  for _, q in ipairs { "const", "volatile", "__restrict__", "__restrict", "struct", "__grid_constant__" } do
    if t:find(q, 1, true) then t = t:gsub("%f[%w_]" .. q .. "%f[^%w_]", " ") end -- a plain look first: cheap
  end
  t = t:gsub("std::", ""):gsub("::", "\1"):gsub("%s*%*%s*", "*"):gsub("%s+", " "):gsub("\1", "::")
  return (t:match("^%s*(.-)%s*$"))
end

--- param(type_text, name) -> {kind, bytes, dtype, ndim, name} for the launcher, or nil, why.
function M.param(text, name)
  local t = normalise(text)
  if t == "tf::tensor_map" or t == "CUtensorMap" or t == "CUtensorMap_st" then
    -- TMA reads the map where the kernel's parameters are: a copy in registers or local memory
    -- would not do
    if not text:find("__grid_constant__", 1, true) then
      return nil, "a tensor map (" .. t .. ") is declared const __grid_constant__ " .. t .. " " .. tostring(name)
        .. " (TMA reads it in the parameter space)"
    end
    return { kind = "tensor_map", bytes = 128, name = name }
  end
  local ptr = t:match("^(.-)%*+$")
  if t:find("&", 1, true) then return nil, "a reference cannot be passed to a kernel" end
  if ptr then
    return { kind = "pointer", dtype = ELEMENT[ptr], name = name, element = ptr }
  end
  local elem, ndim = t:match("^tf::view%s*<%s*(.-)%s*,%s*(%d+)%s*>$")
  if elem then
    local dtype = ELEMENT[normalise(elem)]
    if not dtype then return nil, "tf::view of " .. elem .. " (not a tensor dtype)" end
    return { kind = "view", dtype = dtype, ndim = tonumber(ndim), name = name }
  end
  local s = SCALAR[t]
  if s then return { kind = s[1], bytes = s[2], name = name } end
  if t == "__half" or t == "half" or t == "__nv_bfloat16" or t == "nv_bfloat16" then
    return nil, "a " .. t .. " by value: take a float and convert it in the kernel"
  end
  return nil, "type " .. text .. " (tfhost passes tensors as pointers or tf::view<T, N>, tensor maps as "
    .. "const __grid_constant__ tf::tensor_map, and numbers as int, unsigned, long long, float, double or bool; "
    .. "declare the parameters with params = {...} for others)"
end

--- The parameter types of an instantiation: the kernel's own with its template parameters
-- replaced by the arguments of expr ("row_softmax<256, float>"). Returns kernel, params or nil, why.
function M.instance(kernels, expr)
  local base, args = expr:match("^%s*([%w_:]+)%s*<(.*)>%s*$")
  base = base or expr:match("^%s*([%w_:]+)%s*$")
  local k = base and kernels[base]
  if not k then return nil, "no __global__ function named " .. tostring(base or expr) end
  local subst = {}
  if k.template then
    if not args then
      return nil, base .. " is a template: name an instantiation, e.g. " .. base .. "<" ..
        table.concat((function()
          local names = {}
          for _, p in ipairs(k.template) do names[#names + 1] = p.name end
          return names
        end)(), ", ") .. ">"
    end
    local given = split_top(args)
    if #given > #k.template then
      return nil, string.format("%s has %d template parameters, %s gives %d", base, #k.template, expr, #given)
    end
    for i, p in ipairs(k.template) do
      local v = given[i] or p.default
      if not v then return nil, string.format("%s: template parameter %s has no value", expr, p.name) end
      subst[p.name] = v
    end
  elseif args then
    return nil, base .. " is not a template"
  end
  local out = {}
  for i, p in ipairs(k.params) do
    local t = p.type:gsub("[%w_]+", function(w) return subst[w] end)
    local spec, why = M.param(t, p.name)
    if not spec then return nil, string.format("parameter %d (%s): %s", i, p.name, why) end
    out[i] = spec
  end
  return k, out
end

return M
