--- Rendering tensors as text, in the manner of PyTorch: values aligned in
-- nested brackets, large tensors summarised with "...", then shape, dtype
-- and device.
local M = {}

local EDGE = 3          -- items shown at each end of a summarised dim
local THRESHOLD = 1000  -- tensors with more elements are summarised
local GAP = setmetatable({}, { __name = "gap" }) -- marks the elided middle of a dim
local FLOAT_DTYPES = { f32 = true, f16 = true, bf16 = true, f64 = true, f8e4m3 = true, f8e5m2 = true }

-- Values of t as a nested Lua table, summarised dims marked by a GAP
-- entry between the two edges. Only the shown elements are copied back.
local function gather(t, summarise)
  if t.ndim == 0 then return t:item() end
  local n = t:size(0)
  if not summarise or n <= 2 * EDGE then
    if t.ndim == 1 then return t:tolist() end
    local out = {}
    for i = 0, n - 1 do out[#out + 1] = gather(t:select(0, i), summarise) end
    return out
  end
  local out = {}
  if t.ndim == 1 then
    for _, v in ipairs(t:narrow(0, 0, EDGE):tolist()) do out[#out + 1] = v end
    out[#out + 1] = GAP
    for _, v in ipairs(t:narrow(0, n - EDGE, EDGE):tolist()) do out[#out + 1] = v end
    return out
  end
  for i = 0, EDGE - 1 do out[#out + 1] = gather(t:select(0, i), summarise) end
  out[#out + 1] = GAP
  for i = n - EDGE, n - 1 do out[#out + 1] = gather(t:select(0, i), summarise) end
  return out
end

local function leaves(v, acc)
  if type(v) == "table" then
    for _, x in ipairs(v) do if x ~= GAP then leaves(x, acc) end end
  else
    acc[#acc + 1] = v
  end
  return acc
end

-- A formatter for numbers of this tensor: fixed or scientific like PyTorch.
local function number_format(values, is_float)
  if not is_float then return function(v) return tostring(math.tointeger(v) or v) end end
  local maxabs, minabs, integral = 0, math.huge, true
  for _, v in ipairs(values) do
    if v == v and v ~= math.huge and v ~= -math.huge then
      local a = math.abs(v)
      if a > maxabs then maxabs = a end
      if a > 0 and a < minabs then minabs = a end
      if v ~= math.floor(v) then integral = false end
    end
  end
  local sci = maxabs >= 1e8 or (minabs < 1e-4 and minabs > 0) or (maxabs / (minabs == math.huge and 1 or minabs) > 1e6 and not integral)
  return function(v)
    if v ~= v then return "nan" end
    if v == math.huge then return "inf" end
    if v == -math.huge then return "-inf" end
    if sci then return string.format("%.4e", v) end
    if integral then return string.format("%.0f.", v) end
    return string.format("%.4f", v)
  end
end

local function render(v, fmt, width, indent)
  if type(v) ~= "table" or v == GAP then
    local s = type(v) == "boolean" and tostring(v) or fmt(v)
    return string.rep(" ", width - #s) .. s
  end
  local parts, nested = {}, type(v[1]) == "table"
  for _, x in ipairs(v) do
    parts[#parts + 1] = x == GAP and "..." or render(x, fmt, width, indent .. " ")
  end
  if not nested then return "[" .. table.concat(parts, ", ") .. "]" end
  return "[" .. table.concat(parts, ",\n" .. indent .. " ") .. "]"
end

--- The text of a tensor: values, shape, dtype and device.
function M.tensor(t)
  if t:is_freed() then return "tensor(freed)" end
  local numel = t:numel()
  local meta = string.format("shape=%s, dtype=%s, device=%s", tostring(t.shape), t.dtype, t.device)
  if numel == 0 then return "tensor([], " .. meta .. ")" end
  local values = gather(t, numel > THRESHOLD)
  local flat = leaves(values, {})
  local fmt = number_format(flat, FLOAT_DTYPES[t.dtype])
  local width = 0
  for _, x in ipairs(flat) do
    local s = type(x) == "boolean" and tostring(x) or fmt(x)
    if #s > width then width = #s end
  end
  return "tensor(" .. render(values, fmt, width, "       ") .. ", " .. meta .. ")"
end

return M
