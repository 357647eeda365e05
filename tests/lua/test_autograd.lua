-- Autograd on the CPU: every differentiable op's backward against finite
-- differences in f64, accumulation, the graph's lifetime, grad mode, and
-- errors. (The GPU's backward is compared with these in test_cuda_grad.lua.)
local T = require "harness"
tf.seed(T.fresh_seed())

local function r(...) return tf.randn({ ... }, { device = "cpu", dtype = "f64" }) end
local function pos(...) return tf.rand({ ... }, { device = "cpu", dtype = "f64" }) + 0.5 end

T.test("unary ops", function()
  local domain = { log = pos, sqrt = pos, rsqrt = pos }
  for _, name in ipairs({ "neg", "abs", "relu", "square", "exp", "log", "sqrt", "rsqrt", "sigmoid", "silu", "gelu",
    "tanh", "sin", "cos", "erf", "sign" }) do
    local make = domain[name] or r
    T.gradcheck(function(x) return tf[name](x) end, { make(2, 3) }, { name = name })
  end
end)

T.test("binary ops with broadcasting, in both orders", function()
  for _, name in ipairs({ "add", "sub", "mul", "div", "maximum", "minimum", "pow" }) do
    T.gradcheck(function(a, b) return tf[name](a, b) end, { pos(2, 1, 3), pos(4, 3) }, { name = name })
    T.gradcheck(function(a, b) return tf[name](a, b) end, { pos(3), pos(2, 3) }, { name = name .. " reversed" })
  end
end)

T.test("scalar operands on either side", function()
  for _, name in ipairs({ "add", "sub", "mul", "div", "maximum", "minimum", "pow" }) do
    T.gradcheck(function(a) return tf[name](a, 1.3) end, { pos(2, 3) }, { name = name .. " right" })
    T.gradcheck(function(a) return tf[name](0.7, a) end, { pos(2, 3) }, { name = name .. " left" })
  end
  T.gradcheck(function(a) return (2 - a) * 3 / 4 + -a end, { r(3) }, { name = "metamethods" })
end)

T.test("reductions over a dim, all dims, keepdim", function()
  for _, name in ipairs({ "sum", "mean", "max", "min" }) do
    T.gradcheck(function(x) return x[name](x) end, { r(3, 4) }, { name = name .. " all" })
    T.gradcheck(function(x) return x[name](x, 1) end, { r(3, 4, 2) }, { name = name .. " dim 1" })
    T.gradcheck(function(x) return x[name](x, -1, true) end, { r(3, 4) }, { name = name .. " keepdim" })
  end
  -- ties share the gradient evenly, as PyTorch's amax does
  local x = tf.tensor({ 1, 3, 3 }, { device = "cpu", dtype = "f64" }):requires_grad(true)
  x:max():backward()
  T.eq(x.grad:tolist(), { 0.0, 0.5, 0.5 })
end)

T.test("matmul and linear", function()
  T.gradcheck(tf.matmul, { r(3, 4), r(4, 2) }, { name = "2-D" })
  T.gradcheck(tf.matmul, { r(2, 1, 3, 4), r(5, 4, 2) }, { name = "broadcast batch" })
  T.gradcheck(tf.matmul, { r(4), r(4, 2) }, { name = "vector @ matrix" })
  T.gradcheck(tf.matmul, { r(3, 4), r(4) }, { name = "matrix @ vector" })
  T.gradcheck(tf.matmul, { r(4), r(4) }, { name = "dot" })
  T.gradcheck(function(a, b) return tf.matmul(a:t(), b) end, { r(4, 3), r(4, 2) }, { name = "transposed" })
  T.gradcheck(tf.linear, { r(2, 3, 4), r(5, 4), r(5) }, { name = "linear with bias" })
  T.gradcheck(tf.linear, { r(3, 4), r(5, 4) }, { name = "linear without bias" })
end)

T.test("views and copies", function()
  T.gradcheck(function(x) return x:reshape(3, 2) end, { r(2, 3) }, { name = "reshape" })
  T.gradcheck(function(x) return x:t():reshape(6) end, { r(2, 3) }, { name = "reshape of a transpose" })
  T.gradcheck(function(x) return x:transpose(0, 2) end, { r(2, 3, 4) }, { name = "transpose" })
  T.gradcheck(function(x) return x:narrow(1, 1, 2) end, { r(2, 4) }, { name = "narrow" })
  T.gradcheck(function(x) return x:select(0, -1) end, { r(3, 2) }, { name = "select" })
  T.gradcheck(function(x) return x:unsqueeze(1):squeeze() end, { r(2, 3) }, { name = "unsqueeze, squeeze" })
  T.gradcheck(function(x) return x:expand(4, 2, 3) end, { r(2, 1) }, { name = "expand" })
  T.gradcheck(function(x) return x:t():contiguous() end, { r(2, 3) }, { name = "contiguous" })
  T.gradcheck(function(x) return x:clone() * x end, { r(3) }, { name = "clone" })
  -- casts: the gradient comes back in the input's dtype
  local x = r(3):requires_grad(true)
  local y = x:to("f32")
  T.eq(y.dtype, "f32")
  ;(y * 2):sum():backward()
  T.eq(x.grad.dtype, "f64")
  T.eq(x.grad:tolist(), { 2.0, 2.0, 2.0 })
end)

T.test("gradients accumulate; zero_grad and assigning grad", function()
  local x = tf.tensor({ 1, 2 }, { device = "cpu", dtype = "f64" }):requires_grad(true)
  ;(x * x):sum():backward()
  T.eq(x.grad:tolist(), { 2.0, 4.0 })
  ;(x * 3):sum():backward()
  T.eq(x.grad:tolist(), { 5.0, 7.0 })
  x:zero_grad()
  T.eq(x.grad, nil)
  x.grad = tf.ones(2, { device = "cpu", dtype = "f64" })
  ;(x * 1):sum():backward()
  T.eq(x.grad:tolist(), { 2.0, 2.0 })
  x.grad = nil
  T.eq(x.grad, nil)
  T.raises(function() x.grad = tf.ones(3, { device = "cpu" }) end, "must have the tensor's shape")
  -- one leaf used on several paths
  local a = tf.tensor({ 3 }, { device = "cpu", dtype = "f64" }):requires_grad(true)
  local b = a * 2
  ;((b * a) + b + a):sum():backward() -- 2a^2 + 3a: 4a + 3 = 15
  T.eq(a.grad:tolist(), { 15.0 })
end)

T.test("backward(g) reads the caller's gradient, and leaves keep their own copies of it", function()
  local x = tf.tensor({ 1, 2, 3 }, { device = "cpu", dtype = "f64" }):requires_grad(true)
  local g = tf.tensor({ 0.5, -1, 2 }, { device = "cpu", dtype = "f64" })
  ;(x + 0):backward(g) -- add passes the gradient through to the leaf unchanged
  T.eq(x.grad:tolist(), { 0.5, -1.0, 2.0 })
  g:fill_(7)
  T.eq(x.grad:tolist(), { 0.5, -1.0, 2.0 }, "the leaf's gradient is not the caller's tensor")
  x:backward(g) -- a leaf as the root
  T.eq(x.grad:tolist(), { 7.5, 6.0, 9.0 })
  g:fill_(0)
  T.eq(x.grad:tolist(), { 7.5, 6.0, 9.0 })
  -- a gradient of another dtype or a strided view still works
  local y = tf.tensor({ 1, 2 }, { device = "cpu", dtype = "f32" }):requires_grad(true)
  ;(y * 2):backward(tf.tensor({ 1, 1 }, { device = "cpu", dtype = "f64" }))
  T.eq(y.grad:tolist(), { 2.0, 2.0 })
  local w = tf.zeros({ 2, 2 }, { device = "cpu", dtype = "f32" }):requires_grad(true)
  local m = tf.tensor({ { 1, 2 }, { 3, 4 } }, { device = "cpu", dtype = "f32" })
  ;(w * 1):backward(m:t())
  T.eq(w.grad:tolist(), { { 1.0, 3.0 }, { 2.0, 4.0 } })
  -- one gradient passed through to two leaves: each keeps its own
  local a = tf.tensor({ 1, 2 }, { device = "cpu", dtype = "f64" }):requires_grad(true)
  local b = tf.tensor({ 3, 4 }, { device = "cpu", dtype = "f64" }):requires_grad(true)
  ;(a + b):backward(tf.tensor({ 1, -1 }, { device = "cpu", dtype = "f64" }))
  a.grad:fill_(0)
  T.eq(b.grad:tolist(), { 1.0, -1.0 })
end)

T.test("backward's on_grad: each leaf told after its gradient is added, errors stop the pass", function()
  local a, b = tf.randn(3):requires_grad(true), tf.randn(3):requires_grad(true)
  local told = {}
  local y = (a * b):sum() + (a * 2):sum() -- a reached by two paths, b by one
  y:backward({ retain_graph = true, on_grad = function(leaf)
    local name = leaf:data_ptr() == a:data_ptr() and "a" or leaf:data_ptr() == b:data_ptr() and "b" or "?"
    told[#told + 1] = name
    T.ok(leaf.grad ~= nil, name .. ": the gradient is there when the hook runs")
  end })
  table.sort(told)
  T.eq(told, { "a", "a", "b" }, "a leaf reached twice is told twice")
  T.near(a.grad, b + 2, 1e-6, 1e-6, "the gradients are unchanged by the hook")
  local ok, err = pcall(function()
    y:backward({ on_grad = function() error("stop here", 0) end })
  end)
  T.ok(not ok and tostring(err):find("on_grad: stop here", 1, true), tostring(err))
  T.raises(function() y:backward({ on_grad = 3 }) end, "on_grad must be a function")
end)

T.test("the graph: grad_fn, is_leaf, retain_graph, backward twice", function()
  local x = tf.ones(2, { device = "cpu", dtype = "f64" }):requires_grad(true)
  local y = (x * 2):exp():sum()
  T.eq(y.grad_fn, "sum")
  T.eq(x.is_leaf, true)
  T.eq(y.is_leaf, false)
  T.eq(x.grad_fn, nil)
  T.eq(y:requires_grad(), true)
  y:backward({ retain_graph = true })
  y:backward()
  T.near(x.grad, { 4 * math.exp(2), 4 * math.exp(2) }, 1e-12)
  T.raises(function() y:backward() end, "a second time: its saved tensors were freed")
  local z = (x * x):sum(0, true)
  T.raises(function() (x * x):backward() end, "a gradient can be implied only for a one-element tensor")
  ;(x * x):backward(tf.tensor({ 1, 10 }, { device = "cpu", dtype = "f64" }))
  T.ok(z ~= nil)
  T.raises(function() tf.ones(2, { device = "cpu" }):sum():backward() end, "does not require grad")
  T.raises(function() (x * x):backward(tf.ones(3, { device = "cpu", dtype = "f64" })) end,
    "the gradient has shape (3,) but the tensor has shape (2,)")
end)

T.test("grad mode: no_grad, enable_grad, detach", function()
  local x = tf.ones(2, { device = "cpu" }):requires_grad(true)
  T.eq(tf.is_grad_enabled(), true)
  local y = tf.no_grad(function()
    T.eq(tf.is_grad_enabled(), false)
    local inner = tf.enable_grad(function() return x * 2 end)
    T.eq(inner.grad_fn, "mul")
    return x * 2
  end)
  T.eq(tf.is_grad_enabled(), true)
  T.eq(y.grad_fn, nil)
  do
    local _ <close> = tf.no_grad()
    T.eq((x + 1).grad_fn, nil)
  end
  T.eq((x + 1).grad_fn, "add")
  local ok = pcall(tf.no_grad, function() error("boom") end)
  T.eq(ok, false)
  T.eq(tf.is_grad_enabled(), true, "an error inside no_grad restores grad mode")
  local d = (x * 3):detach()
  T.eq(d.grad_fn, nil)
  T.eq(d:requires_grad(), false)
  T.eq(d:tolist(), { 3.0, 3.0 })
end)

T.test("in-place writes and requires_grad errors", function()
  local w = tf.ones(2, { device = "cpu" }):requires_grad(true)
  T.raises(function() w:fill_(0) end, "in-place write to a tensor that requires grad")
  tf.no_grad(function() w:fill_(2) end) -- an optimizer's update
  T.eq(w:tolist(), { 2.0, 2.0 })
  local x = tf.ones(2, { device = "cpu" })
  local y = (x * w):sum()
  x:fill_(5) -- x was saved for mul's backward
  T.raises(function() y:backward() end, "modified in place afterwards")
  T.raises(function() tf.ones(2, { device = "cpu", dtype = "i64" }):requires_grad(true) end,
    "only floating tensors can require gradients")
  T.raises(function() (w * 2):requires_grad(false) end, "can only be changed on a leaf tensor")
end)

T.test("memory returns to the pre-forward level plus gradients", function()
  collectgarbage()
  local w = tf.randn(256, 256, { device = "cpu" }):requires_grad(true)
  local x = tf.randn(64, 256, { device = "cpu" })
  collectgarbage()
  local before = tf.mem.stats("cpu").allocated
  local loss = tf.matmul(tf.matmul(x, w):relu(), w):tanh():sum()
  T.ok(tf.mem.stats("cpu").allocated > before, "the forward pass holds activations")
  loss:backward()
  loss = nil
  collectgarbage()
  T.eq(tf.mem.stats("cpu").allocated, before + w.grad.nbytes)
end)

T.test("dtype and device mismatches are clear errors", function()
  local a = tf.ones(2, 2, { device = "cpu" }):requires_grad(true)
  T.raises(function() tf.matmul(a, tf.ones(2, 2, { device = "cpu", dtype = "f16" })) end, "different dtypes")
  if tf.cuda.is_available() then
    T.raises(function() return a + tf.ones(2, 2, { device = "cuda" }) end, "operands are on different devices")
  else
    T.raises(function() return a:to("cuda") end, "no CUDA device")
  end
end)

T.run()
