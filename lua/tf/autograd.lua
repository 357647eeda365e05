--- tf.autograd: differentiable ops written in Lua (as torch.autograd.Function) and
-- the finite-difference check of any op's gradients.
--
--   local Square = tf.autograd.Function {
--     name = "square",
--     forward = function(ctx, x) ctx:save(x); return x * x end,
--     backward = function(ctx, g) local x = ctx:saved(); return 2 * x * g end,
--   }
--   local y = Square(x)
--   tf.autograd.gradcheck(Square, { tf.randn(3, { dtype = "f64" }) })
--
-- The node a call records and the context it saves into are C's
-- (host/bind/l_function.c); this file makes the call: the autocast of
-- cast_inputs, forward with grad mode off, then the record.
local check = require "tf.check"

local M = {}
local F, tf, grad_scope, autocast_scope -- bound by M.bind

local CASTABLE = { f32 = true, f16 = true, bf16 = true } -- floating, but never f64 (as custom_fwd)
local FLOATING = { f64 = true, f32 = true, f16 = true, bf16 = true }

local Function = {}
Function.__index = Function
Function.__name = "tf.autograd.Function"

--- f(...) = f:apply(...): runs forward on the arguments and records the
-- node whose backward is the function's.
function Function:apply(...)
  local args = table.pack(...)
  local cast = self.cast_inputs
  if cast and tf.autocast_dtype() then
    for i = 1, args.n do
      local a = args[i]
      if tf.is_tensor(a) and CASTABLE[a.dtype] and a.dtype ~= cast then args[i] = a:to(cast) end
    end
  else
    cast = nil
  end
  local ctx <close> = F.ctx(self, args, cast ~= nil)
  local results
  do
    local _ <close> = grad_scope(false)
    local _ac <close> = cast and autocast_scope(nil) or nil
    results = table.pack(self.forward(ctx, table.unpack(args, 1, args.n)))
  end
  return F.record(ctx, args, results)
end

Function.__call = Function.apply
function Function:__tostring() return "tf.autograd.Function(" .. self.name .. ")" end

--- tf.autograd.Function{name, forward = fn(ctx, ...), backward = fn(ctx, grads...),
-- cast_inputs = dtype, materialize_grads = bool}
function M.Function(spec)
  local fname = "tf.autograd.Function"
  check.arg(spec, fname, "the definition", "table")
  check.keys(spec, fname, { "name", "forward", "backward", "cast_inputs", "materialize_grads" })
  check.arg(spec.name, fname, "name", "string", true)
  check.arg(spec.forward, fname, "forward", "function")
  check.arg(spec.backward, fname, "backward", "function")
  check.choice(spec.cast_inputs, fname, "cast_inputs", { "f32", "bf16", "f16" })
  if spec.materialize_grads ~= nil and type(spec.materialize_grads) ~= "boolean" then
    error(fname .. ": materialize_grads must be a boolean, not " .. check.what_is(spec.materialize_grads), 2)
  end
  return setmetatable({
    name = spec.name or "function",
    forward = spec.forward,
    backward = spec.backward,
    cast_inputs = spec.cast_inputs,
    materialize_grads = spec.materialize_grads ~= false,
  }, Function)
end

-- ---- gradcheck ---------------------------------------------------------------------------

local function flatten(list, out)
  out = out or {}
  if type(list) ~= "table" then
    out[#out + 1] = list
    return out
  end
  for _, v in ipairs(list) do flatten(v, out) end
  return out
end

-- The indices of element j (from 1) of a tensor of shape dims, as "{1, 0, 2}" (from 0).
local function index_of(j, dims)
  local idx, rest = {}, j - 1
  for d = #dims, 1, -1 do
    idx[d] = rest % dims[d]
    rest = rest // dims[d]
  end
  return "{" .. table.concat(idx, ", ") .. "}"
end

-- Fixed weights in [0.5, 1.5) for output k (a small LCG: the check leaves tf.seed's stream alone).
local function weights(out, k)
  local n, state, v = out:numel(), 12345 + 7919 * k, {}
  for i = 1, n do
    state = (state * 1103515245 + 12345) % 2147483648
    v[i] = 0.5 + state / 2147483648
  end
  return tf.tensor(v, { dtype = "f64", device = out.device }):reshape(out:size())
end

--- tf.autograd.gradcheck(fn, inputs [, opts]): the gradients autograd gives
-- for fn(inputs...) against central finite differences in f64. Returns true,
-- or raises an error naming the first element out of tolerance (opts.raise =
-- false: returns false and the message).
function M.gradcheck(fn, inputs, opts)
  local fname = "tf.autograd.gradcheck"
  check.arg(fn, fname, "fn", "function")
  check.arg(inputs, fname, "inputs", "table")
  opts = check.keys(opts, fname, { "eps", "atol", "rtol", "raise", "check", "name" })
  local eps, atol, rtol = opts.eps or 1e-6, opts.atol or 1e-5, opts.rtol or 1e-3
  for _, k in ipairs { "eps", "atol", "rtol" } do
    if opts[k] ~= nil and (type(opts[k]) ~= "number" or not (opts[k] >= 0)) then
      error(string.format("%s: %s must be a number >= 0, not %s", fname, k, check.what_is(opts[k])), 2)
    end
  end
  local n = inputs.n or #inputs
  local checked = {}
  if opts.check then
    for _, i in ipairs(opts.check) do
      if not (tf.is_tensor(inputs[i]) and FLOATING[inputs[i].dtype]) then
        error(string.format("%s: check names input %s, which is not a floating tensor", fname, tostring(i)), 2)
      end
      checked[i] = true
    end
  else
    for i = 1, n do checked[i] = tf.is_tensor(inputs[i]) and FLOATING[inputs[i].dtype] or nil end
  end
  if next(checked) == nil then error(fname .. ": no floating tensor among the inputs to check", 2) end
  local prefix = opts.name and (opts.name .. ": ") or ""
  -- the checked inputs as f64 leaves
  local leaves = {}
  for i = 1, n do
    local x = inputs[i]
    leaves[i] = checked[i] and x:detach():to("f64"):clone():requires_grad(true) or x
  end
  local w
  local function objective(args)
    local outs = table.pack(fn(table.unpack(args, 1, n)))
    if not w then
      w = {}
      for k = 1, outs.n do
        local o = outs[k]
        if tf.is_tensor(o) and FLOATING[o.dtype] then w[k] = weights(o, k) end
      end
      if next(w) == nil then error(fname .. ": " .. prefix .. "fn returned no floating tensor", 3) end
    end
    local total
    for k, wk in pairs(w) do
      local term = (outs[k]:to("f64") * wk):sum()
      total = total and total + term or term
    end
    return total
  end
  tf.enable_grad(function() objective(leaves):backward() end)
  for i = 1, n do
    if checked[i] then
      local x = leaves[i]
      local shape, device = x:size(), x.device
      local flat = flatten(x:detach():tolist())
      local analytic = x.grad and flatten(x.grad:tolist()) or {}
      for j = 1, #flat do
        local function at(delta)
          local v = table.move(flat, 1, #flat, 1, {})
          v[j] = v[j] + delta
          local args = table.move(leaves, 1, n, 1, {})
          args[i] = tf.tensor(v, { dtype = "f64", device = device }):reshape(shape)
          return tf.no_grad(function() return objective(args):item() end)
        end
        local numeric = (at(eps) - at(-eps)) / (2 * eps)
        local got = analytic[j] or 0
        local diff = math.abs(numeric - got)
        if not (diff <= atol + rtol * math.abs(numeric)) then
          local msg = string.format("%s%sinput %d element %d %s: autograd gives %.10g, finite differences %.10g "
            .. "(|difference| %.3g > atol %g + rtol %g x |finite difference|)", fname .. ": ", prefix, i, j,
            index_of(j, shape), got, numeric, diff, atol, rtol)
          if opts.raise == false then return false, msg end
          error(msg, 2)
        end
      end
    end
  end
  return true
end

function M.bind(tf_, core)
  tf, F, grad_scope, autocast_scope = tf_, core._function, core._grad_scope, core._autocast_scope
  return M
end

return M
