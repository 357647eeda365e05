-- Autograd functions written in Lua (tf.autograd.Function) and tf.autograd.gradcheck, on the CPU:
-- saved tensors and attributes, several inputs and outputs, needs_input_grad, composition with the
-- ops' autograd, autocast (cast_inputs), no_grad, what is freed after backward, and the errors.
local T = require "harness"
tf.seed(T.fresh_seed())

local Function, gradcheck = tf.autograd.Function, tf.autograd.gradcheck
local function r(...) return tf.randn({ ... }, { device = "cpu", dtype = "f64" }) end

-- x * y * scale, with the gradient of both inputs written by hand
local Mul = Function {
  name = "scaled_mul",
  forward = function(ctx, x, y, scale)
    ctx:save(x, y)
    ctx.scale = scale
    return x * y * scale
  end,
  backward = function(ctx, g)
    local x, y = ctx:saved()
    return g * y * ctx.scale, g * x * ctx.scale, nil
  end,
}

T.test("a function's gradients agree with finite differences", function()
  T.ok(gradcheck(Mul, { r(3, 4), r(3, 4), 1.5 }), "gradcheck returns true")
  local x, y = r(2, 3):requires_grad(true), r(2, 3)
  local out = Mul(x, y, 2.0)
  T.eq(out.grad_fn, "scaled_mul")
  T.near(out, x * y * 2.0, 1e-12)
  out:sum():backward()
  T.near(x.grad, y * 2.0, 1e-12)
  T.eq(tostring(Mul), "tf.autograd.Function(scaled_mul)")
end)

T.test("gradcheck finds a wrong backward and names the element", function()
  local Wrong = Function {
    name = "wrong",
    forward = function(_, x) return x:exp() end,
    backward = function(_, g) return g * 1.01 end,
  }
  local ok, msg = gradcheck(Wrong, { r(3) }, { raise = false })
  T.eq(ok, false)
  T.ok(msg:find("input 1 element 1 {0}: autograd gives", 1, true), msg)
  T.raises(function() gradcheck(Wrong, { r(2, 2) }, { name = "exp" }) end, "exp: input 1 element 1 {0, 0}")
  -- any op, not only functions: the built-in ones pass
  T.ok(gradcheck(tf.matmul, { r(3, 4), r(4, 2) }))
  T.ok(gradcheck(function(a) return a:tanh(), a:sum() end, { r(3) }), "several outputs")
  -- an f32 input is checked in f64
  T.ok(gradcheck(function(a) return a * a end, { tf.randn(3, { device = "cpu" }) }))
  T.raises(function() gradcheck(Mul, { 1, 2 }) end, "no floating tensor among the inputs")
  T.raises(function() gradcheck(Mul, { r(2), r(2), 1 }, { check = { 3 } }) end, "check names input 3")
  T.raises(function() gradcheck(Mul, { r(2), r(2), 1 }, { eps = -1 }) end, "eps must be a number >= 0")
  T.raises(function() gradcheck(Mul, { r(2), r(2), 1 }, { tolerance = 1 }) end, "unknown option 'tolerance'")
  T.raises(function() gradcheck(function() return 1 end, { r(2) }) end, "fn returned no floating tensor")
end)

T.test("several inputs and outputs; outputs the loss does not use get zeros", function()
  local seen = {}
  local SinCos = Function {
    name = "sincos",
    forward = function(ctx, x, w)
      ctx:save(x, w)
      return x:sin() * w, x:cos() * w, "a label", tf.tensor({ 1, 2 }, { device = "cpu" })
    end,
    backward = function(ctx, gs, gc, glabel, gint)
      local x, w = ctx:saved()
      seen = { gs = gs and gs:tolist(), gc = gc and gc:tolist(), glabel = glabel, gint = gint }
      return gs * x:cos() * w - gc * x:sin() * w, (gs * x:sin() + gc * x:cos()):sum(0)
    end,
  }
  T.ok(gradcheck(SinCos, { r(2, 3), r(3) }))
  local x = r(2, 3):requires_grad(true)
  local s, c, label, ints = SinCos(x, tf.ones(3, { device = "cpu", dtype = "f64" }))
  T.eq({ s.grad_fn, c.grad_fn, label, ints.grad_fn }, { "sincos", "sincos", "a label", nil })
  s:sum():backward()
  T.eq(seen.gc, { { 0.0, 0.0, 0.0 }, { 0.0, 0.0, 0.0 } }, "the unused output's gradient is zeros")
  T.eq({ seen.glabel, seen.gint }, { nil, nil }, "nil for outputs that are not differentiable")
  T.near(x.grad, x:cos(), 1e-12)
  -- materialize_grads = false: nil instead of zeros
  local got
  local Two = Function {
    name = "two", materialize_grads = false,
    forward = function(_, x) return x * 2, x * 3 end,
    backward = function(_, ga, gb) got = { ga ~= nil, gb ~= nil }; return (ga or 0) * 2 + (gb or 0) * 3 end,
  }
  local a, b = Two(x)
  b:sum():backward()
  T.eq(got, { false, true })
  -- one output used twice, and both outputs in one loss
  x:zero_grad()
  a, b = Two(x)
  local both = (a + a) * 1 + b
  both:sum():backward()
  T.near(x.grad, tf.full(x:size(), 7, { device = "cpu", dtype = "f64" }), 1e-12)
end)

T.test("needs_input_grad, attributes and mark_non_differentiable", function()
  local needs
  local F = Function {
    forward = function(ctx, x, y, n)
      needs = ctx.needs_input_grad
      ctx.n = n
      ctx.table = { 1, 2 }
      local idx = tf.tensor({ 0.0, 1.0 }, { device = "cpu", dtype = "f64" })
      ctx:mark_non_differentiable(idx)
      return x + y * n, idx
    end,
    backward = function(ctx, g, gidx)
      T.eq(ctx.n, 3)
      T.eq(ctx.table, { 1, 2 })
      T.eq(gidx, nil, "a marked output gets no gradient")
      return g, g * ctx.n
    end,
  }
  local x, y = r(2):requires_grad(true), r(2)
  local out, idx = F(x, y, 3)
  T.eq(needs, { true, false, false })
  T.eq(idx.grad_fn, nil)
  out:sum():backward()
  T.near(x.grad, tf.ones(2, { device = "cpu", dtype = "f64" }), 0)
  tf.no_grad(function() F(x, y, 3) end)
  T.eq(needs, { false, false, false }, "nothing needs a gradient under no_grad")
  T.eq(tostring(F):match("%((.-)%)"), "function", "the default name")
end)

T.test("composes with the ops' autograd on both sides", function()
  local Cube = Function {
    name = "cube",
    forward = function(ctx, x) ctx:save(x); return x * x * x end,
    backward = function(ctx, g) local x = ctx:saved(); return g * 3 * x * x end,
  }
  T.ok(gradcheck(function(a, b) return Cube(tf.matmul(a, b):tanh()):sum(1) + Mul(a, a, 0.5):sum(1) end,
    { r(3, 4), r(4, 4) }))
  -- a function of a function
  T.ok(gradcheck(function(a) return Cube(Cube(a)) end, { r(3) }))
  -- an output that is an input comes back as an alias with the node
  local Id = Function { forward = function(_, x) return x end, backward = function(_, g) return g * 2 end }
  local x = r(3):requires_grad(true)
  local y = Id(x)
  T.ok(y.grad_fn == "function" and x.is_leaf, "the input keeps being a leaf")
  y:sum():backward()
  T.near(x.grad, tf.full({ 3 }, 2, { device = "cpu", dtype = "f64" }), 0)
end)

T.test("no_grad records nothing and keeps nothing", function()
  collectgarbage()
  local x = r(64, 64)
  local before = tf.mem.stats("cpu").allocated
  local y = tf.no_grad(function() return Mul(x:requires_grad(true), x, 1) end)
  T.eq(y.grad_fn, nil)
  collectgarbage()
  T.eq(tf.mem.stats("cpu").allocated, before + y.nbytes, "only the output stays")
  x:requires_grad(false)
end)

T.test("backward frees what the forward saved; a second backward is an error", function()
  local kept
  local Exp = Function {
    name = "exp_keeping",
    forward = function(ctx, x)
      local e <close> = x:exp() -- only the context holds it after forward
      ctx:save(e)
      return x:exp()
    end,
    backward = function(ctx, g)
      kept = ctx:saved()
      return g * kept
    end,
  }
  collectgarbage()
  local x = r(128, 128):requires_grad(true)
  local before = tf.mem.stats("cpu").allocated
  local y = Exp(x)
  local mid = tf.mem.stats("cpu").allocated
  T.eq(mid, before + 2 * y.nbytes, "the output and the saved tensor")
  y:sum():backward()
  T.ok(kept:is_freed(), "the saved tensor's handle is freed when backward returns")
  collectgarbage()
  T.eq(tf.mem.stats("cpu").allocated, before + y.nbytes + x.grad.nbytes, "the output and the gradient remain")
  T.raises(function() y:sum():backward() end, "backward through exp_keeping a second time")
  -- retain_graph keeps them for another pass
  x:zero_grad()
  local z = Exp(x)
  z:sum():backward { retain_graph = true }
  T.ok(not kept:is_freed(), "kept for the next pass")
  z:sum():backward()
  T.near(x.grad, x:exp() * 2, 1e-12)
end)

T.test("a saved tensor changed in place is caught at backward", function()
  local w = r(3)
  local x = r(3):requires_grad(true)
  local y = Mul(x, w, 1)
  w:fill_(0)
  T.raises(function() y:sum():backward() end, "saved tensor 2 was modified in place after ctx:save")
end)

T.test("autocast: cast_inputs casts and runs forward and backward with autocast off", function()
  local inside = {}
  local F32 = Function {
    name = "in_f32", cast_inputs = "f32",
    forward = function(_, x, w)
      inside.fwd = { x.dtype, w.dtype, tf.autocast_dtype() }
      return tf.matmul(x, w)
    end,
    backward = function(_, g)
      inside.bwd = { g.dtype, tf.autocast_dtype() }
      return g, g
    end,
  }
  local Plain = Function {
    forward = function(_, x) inside.plain = { tf.autocast_dtype(), tf.matmul(x, x).dtype }; return x * 1 end,
    backward = function(_, g) inside.plain_bwd = tf.autocast_dtype(); return g end,
  }
  local x = tf.randn(2, 2, { device = "cpu", dtype = "bf16" }):requires_grad(true)
  local w = tf.randn(2, 2, { device = "cpu" }):requires_grad(true)
  local y, p
  tf.autocast("bf16", function()
    y = F32(x, w)
    p = Plain(w)
  end)
  T.eq(inside.fwd, { "f32", "f32", nil })
  T.eq(y.dtype, "f32")
  y:sum():backward()
  T.eq(inside.bwd, { "f32", nil })
  T.eq(x.grad.dtype, "bf16", "the gradient reaches the bf16 leaf in its dtype")
  T.eq(inside.plain, { "bf16", "bf16" }, "without cast_inputs forward sees the region")
  p:sum():backward()
  T.eq(inside.plain_bwd, "bf16", "and so does backward")
  -- outside a region nothing is cast
  F32(x, x)
  T.eq(inside.fwd, { "bf16", "bf16", nil })
end)

T.test("errors name the function and what is wrong", function()
  T.raises(function() Function { forward = function() end } end, "backward must be a function")
  T.raises(function() Function { forward = 1, backward = function() end } end, "forward must be a function")
  T.raises(function() Function { forward = print, backward = print, fwd = 1 } end, "unknown option 'fwd'")
  T.raises(function() Function { forward = print, backward = print, cast_inputs = "f8" } end,
    'cast_inputs must be "f32", "bf16", "f16"')
  local function bad(backward, forward)
    return Function { name = "bad", forward = forward or function(_, x, _) return x * 2 end, backward = backward }
  end
  local x = r(2, 3):requires_grad(true)
  T.raises(function() bad(function(_, g) return g:sum() end)(x, 1):sum():backward() end,
    "gradient of shape () for an input of shape (2, 3)")
  T.raises(function() bad(function() return "oops" end)(x, 1):sum():backward() end,
    "backward of bad returned a string for argument 1; a gradient is a tensor or nil")
  T.raises(function() bad(function(_, g) return g, g end)(x, 1):sum():backward() end,
    "returned a tensor for argument 2 of forward, which is not a tensor")
  T.raises(function() bad(function(_, g) return g, nil, g end)(x, 1):sum():backward() end,
    "returned 3 values for a forward of 2 arguments")
  local line = debug.getinfo(1, "l").currentline + 1
  local err = T.raises(function() bad(function() error("no gradient today") end)(x, 1):sum():backward() end,
    "backward of bad: ")
  T.ok(err:find("test_autograd_function.lua:" .. line .. ": no gradient today", 1, true), err)
  T.raises(function() bad(nil, function() end) end, "backward must be a function")
  T.raises(function() bad(print, function() end)(x, 1) end, "bad: forward returned nothing")
  T.raises(function() bad(print, function(ctx, a) ctx:save(a, 3) return a end)(x, 1) end,
    "ctx:save takes tensors (and nil), not a number as argument 2")
  T.raises(function() bad(print, function(ctx, a) ctx.save = 1 return a end)(x, 1) end, "ctx.save is tfhost's")
  T.raises(function() bad(function(ctx, g) ctx:save(g) return g end)(x, 1):sum():backward() end,
    "ctx:save belongs in forward")
  T.raises(function() bad(function(_, g) return g:to("i64") end)(x, 1):sum():backward() end,
    "returned a i64 gradient for argument 1")
  -- the engine keeps working after each of these
  local y = Mul(x, x, 1)
  y:sum():backward()
  T.ok(x.grad ~= nil)
end)

T.run()
