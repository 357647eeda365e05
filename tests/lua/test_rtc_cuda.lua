-- tf.cuda.compile on a GPU: launches on tensors and numbers against the CPU, templates, tf::view,
-- dynamic shared memory past 48 KiB, every argument and limit check (before anything is launched),
-- the profiler's view of user kernels (by name, in their ranges, in their class, in the trace), and
-- tf.bench timing them. Faults are tested in a child process (tests/cli/test_kernels.py).
local T = require "harness"
T.require_cuda()
local seed = T.fresh_seed()
tf.seed(seed)

local SRC = [[
#include <tfhost.cuh>
extern "C" __global__ void axpy(float *y, const float *x, float a, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] += a * x[i];
}
template <int BLOCK, typename T>
__global__ void __launch_bounds__(BLOCK) row_sum(const T *x, float *out, int cols) {
  __shared__ float part[BLOCK];
  float s = 0.f;
  for (int c = threadIdx.x; c < cols; c += BLOCK) s += tf::to_float(x[(long long)blockIdx.x * cols + c]);
  part[threadIdx.x] = s;
  __syncthreads();
  for (int w = BLOCK / 2; w > 0; w /= 2) {
    if (threadIdx.x < w) part[threadIdx.x] += part[threadIdx.x + w];
    __syncthreads();
  }
  if (threadIdx.x == 0) out[blockIdx.x] = part[0];
}
// a strided 2-d copy through tf::view: works on transposed tensors
extern "C" __global__ void view_copy(tf::view<float, 2> x, float *y) {
  long long i = blockIdx.x, j = threadIdx.x;
  if (i < x.size[0] && j < x.size[1]) y[i * x.size[1] + j] = x(i, j);
}
// dynamic shared memory: fills it, then reads it back in reverse
extern "C" __global__ void big_shared(float *y, int n) {
  extern __shared__ float buf[];
  for (int i = threadIdx.x; i < n; i += blockDim.x) buf[i] = (float)i;
  __syncthreads();
  for (int i = threadIdx.x; i < n; i += blockDim.x) y[i] = buf[n - 1 - i];
}
extern "C" __global__ void scalars(double *out, unsigned char b, short s, unsigned u, long long l, double d,
                                   bool flag) {
  out[0] = b; out[1] = s; out[2] = u; out[3] = (double)l; out[4] = d; out[5] = flag ? 1.0 : 0.0;
}
]]

local mod = tf.cuda.compile(SRC, { cache = false, device = "cuda" })

T.test("a kernel on tensors and numbers gives the CPU's result", function()
  local n = 1000 + math.random(0, 100)
  local x, y = tf.randn(n), tf.randn(n)
  local want = (y + x * 2.5):tolist()
  local gx, gy = x:to("cuda"), y:to("cuda")
  mod:kernel("axpy"):launch({ grid = (n + 255) // 256, block = 256 }, gy, gx, 2.5, n)
  T.near(gy, want, 1e-6, 1e-6)
  T.ok(tostring(mod:kernel("axpy")):find("tf.CudaKernel(axpy, cuda:0", 1, true))
  local a = mod:kernel("axpy"):attributes()
  T.ok(a.registers > 0 and a.max_threads >= 256, "attributes: " .. a.registers .. " registers")
end)

T.test("a template instantiated on first use, on bf16 and f32 rows", function()
  local rows, cols = 37, 1000 + math.random(0, 50)
  for _, dt in ipairs { { "f32", "float", 1e-5 }, { "bf16", "__nv_bfloat16", 1e-5 } } do
    local x = tf.randn(rows, cols):to(dt[1])
    local want = x:to("f32"):sum(1)
    local out = tf.zeros(rows, { device = "cuda" })
    mod:kernel("row_sum<256, " .. dt[2] .. ">"):launch({ grid = rows, block = 256 }, x:to("cuda"), out, cols)
    T.ok(T.relerr(out, want) <= dt[3], dt[1] .. ": relative error " .. T.relerr(out, want))
  end
end)

T.test("tf::view passes sizes and strides: a transposed tensor reads as itself", function()
  local x = tf.randn(24, 40):to("cuda")
  local xt = x:t() -- (40, 24), strides (1, 40)
  local y = tf.zeros(40 * 24, { device = "cuda" })
  mod:kernel("view_copy"):launch({ grid = 40, block = 24 }, xt, y)
  T.eq(y:reshape(40, 24):tolist(), xt:contiguous():tolist())
end)

T.test("dynamic shared memory past 48 KiB: the opt-in is set for the script", function()
  local n = 160 * 1024 // 4 -- 160 KiB of floats
  local y = tf.zeros(n, { device = "cuda" })
  mod:kernel("big_shared"):launch({ grid = 1, block = 1024, shared = n * 4 }, y, n)
  local got = y:tolist()
  T.eq(got[1], n - 1.0) -- float tensors read back as floats
  T.eq(got[n], 0.0)
  T.eq(got[n // 2], n - n // 2 + 0.0)
end)

T.test("numbers of every width arrive as given", function()
  local out = tf.zeros(6, { device = "cuda", dtype = "f64" })
  mod:kernel("scalars"):launch({ grid = 1, block = 1 }, out, 255, -32768, 4294967295, -(1 << 40), 0.1, true)
  T.eq(out:tolist(), { 255.0, -32768.0, 4294967295.0, -(1 << 40) + 0.0, 0.1, 1.0 })
end)

T.test("wrong arguments are errors naming the kernel and the parameter, before anything runs", function()
  local k = mod:kernel("axpy")
  local y = tf.zeros(8, { device = "cuda" })
  local cfg = { grid = 1, block = 8 }
  T.raises(function() k:launch(cfg, y, y, 1.0) end, "kernel axpy takes 4 arguments, got 3")
  T.raises(function() k:launch(cfg, y, 3, 1.0, 8) end, "kernel axpy: parameter 2 (x) takes a tensor, got number")
  T.raises(function() k:launch(cfg, y, y:to("bf16"), 1.0, 8) end, "parameter 2 (x) is declared f32, the tensor is bf16")
  T.raises(function() k:launch(cfg, y, tf.zeros(8, { device = "cpu" }), 1.0, 8) end, "parameter 2 (x): the tensor is on cpu, the kernel on cuda:0")
  T.raises(function() k:launch(cfg, y, y, "a", 8) end, "parameter 3 (a) takes a number, got string")
  T.raises(function() k:launch(cfg, y, y, 1.0, 8.5) end, "parameter 4 (n) takes an integer")
  T.raises(function() k:launch(cfg, y, y, 1.0, 1 << 40) end, "parameter 4 (n) is a 32-bit signed integer")
  local freed = tf.zeros(8, { device = "cuda" })
  freed:free()
  T.raises(function() k:launch(cfg, y, freed, 1.0, 8) end, "parameter 2 (x): the tensor has been freed")
  local m = tf.zeros(8, 8, { device = "cuda" })
  T.raises(function() k:launch(cfg, y, m:t(), 1.0, 8) end, "is a pointer, so the tensor must be contiguous")
  T.raises(function() mod:kernel("view_copy"):launch(cfg, y, y) end, "is a view of 2 dimensions, the tensor has 1")
  T.raises(function() k:launch(5, y, y, 1.0, 8) end, "launch takes {grid = ..., block = ...")
  T.raises(function() k:launch({ grid = 1 }, y, y, 1.0, 8) end, "the launch needs block = n or {x, y, z}")
  T.raises(function() k:launch({ grid = 1, block = 8, shard = 0 }, y, y, 1.0, 8) end, "unknown option 'shard'")
  T.raises(function() mod:kernel("scalars"):launch(cfg, tf.zeros(6, { device = "cuda", dtype = "f64" }), 256, 0, 0, 0, 0, true) end,
    "parameter 2 (b) is a 8-bit unsigned integer: 256 does not fit")
  T.raises(function() mod:kernel("scalars"):launch(cfg, tf.zeros(6, { device = "cuda", dtype = "f64" }), 0, 0, 0, 0, 0, 1) end,
    "parameter 7 (flag) takes a boolean")
  T.eq(y:sum():item(), 0.0, "nothing was launched")
end)

T.test("limits: grid, block and shared memory over the device's are errors that name the limit", function()
  local k = mod:kernel("axpy")
  local y = tf.zeros(8, { device = "cuda" })
  T.raises(function() k:launch({ grid = 1, block = 2048 }, y, y, 1.0, 8) end, "block.x = 2048 is outside 1..1024")
  T.raises(function() k:launch({ grid = { 1, 70000 }, block = 1 }, y, y, 1.0, 8) end, "grid.y = 70000 is outside 1..65535")
  T.raises(function() k:launch({ grid = 0, block = 1 }, y, y, 1.0, 8) end, "grid.x = 0 is outside")
  T.raises(function() k:launch({ grid = 1, block = { 32, 32, 2 } }, y, y, 1.0, 8) end, "a block of 2048 threads is over")
  T.raises(function() k:launch({ grid = 1, block = 1, shared = 1 << 30 }, y, y, 1.0, 8) end,
    "bytes of dynamic shared memory is over the device's limit")
  T.raises(function() mod:kernel("row_sum<256, float>"):launch({ grid = 1, block = 512 }, y, y, 8) end,
    "a block of 512 threads is over the kernel's limit of 256")
  T.raises(function() mod:kernel("axpy", { params = { "float *", "int" } }) end,
    "declared with 2 parameters but its compiled code has 4")
  T.raises(function() mod:kernel("axpy", { params = { "float *", "float *", "double", "int" } }) end,
    "parameter 3 (arg3) is read as 8 bytes but the compiled code takes 4")
end)

T.test("parameters declared by the script are checked against the driver's and used", function()
  local k = mod:kernel("axpy", { params = { "float *", "const float *", "float", "int" } })
  local y, x = tf.ones(16, { device = "cuda" }), tf.ones(16, { device = "cuda" })
  k:launch({ grid = 1, block = 16 }, y, x, 3.0, 16)
  T.eq(y:sum():item(), 64.0)
end)

-- a warpgroup's product on Hopper's tensor cores from <tfhost_sm90.cuh>: D = A B^T (64 x 64 x 64,
-- bf16 in, f32 out), tiles staged in the 128-byte swizzle wgmma reads, an mbarrier in place of
-- __syncthreads
local WGMMA = [[
#include <tfhost_sm90.cuh>
extern "C" __global__ void __launch_bounds__(128) wg_product(const __nv_bfloat16 *a, const __nv_bfloat16 *b,
                                                            float *d) {
  __shared__ __align__(1024) unsigned char sa[64 * 128], sb[64 * 128];
  __shared__ __align__(8) unsigned long long bar;
  typedef tf::vec<__nv_bfloat16, 8> chunk;
  const int tid = threadIdx.x;
  if (tid == 0) { tf::mbar_init(tf::smem_addr(&bar), 128); tf::mbar_init_fence(); }
  __syncthreads();
  for (int i = tid; i < 64 * 8; i += 128) {   // 16-byte chunk c of row r goes to chunk c ^ (r % 8)
    const int r = i / 8, c = i % 8, at = r * 128 + ((c ^ (r & 7)) << 4);
    *reinterpret_cast<chunk *>(sa + at) = *reinterpret_cast<const chunk *>(a + r * 64 + c * 8);
    *reinterpret_cast<chunk *>(sb + at) = *reinterpret_cast<const chunk *>(b + r * 64 + c * 8);
  }
  tf::fence_proxy_async();
  tf::mbar_arrive(tf::smem_addr(&bar));
  tf::mbar_wait(tf::smem_addr(&bar), 0);
  float acc[32];
  const unsigned long long da = tf::wgmma_desc(tf::smem_addr(sa), 16, 1024);
  const unsigned long long db = tf::wgmma_desc(tf::smem_addr(sb), 16, 1024);
  tf::wgmma_fence();
  for (int kk = 0; kk < 4; kk++)
    tf::wgmma_ss<__nv_bfloat16, 0, 0>(acc, tf::wgmma_desc_add(da, kk * 32), tf::wgmma_desc_add(db, kk * 32), kk > 0);
  tf::wgmma_commit();
  tf::wgmma_wait<0>();
  tf::wgmma_hold(acc);
  const int warp = tid / 32, g = (tid % 32) / 4, t = tid % 4;
  for (int j = 0; j < 8; j++)
    for (int h = 0; h < 2; h++) {
      const int row = 16 * warp + g + 8 * h, col = 8 * j + 2 * t;
      d[row * 64 + col] = acc[4 * j + 2 * h];
      d[row * 64 + col + 1] = acc[4 * j + 2 * h + 1];
    }
}
]]

T.test("<tfhost_sm90.cuh>: a wgmma product from the script equals tf.matmul", function()
  local major = tonumber((tf.device_info("cuda").compute_capability or "0"):match("^(%d+)"))
  if major ~= 9 then return T.skip_test("wgmma needs a 9.0 (Hopper) GPU") end
  local k = tf.cuda.compile(WGMMA, { cache = false, device = "cuda" }):kernel("wg_product")
  local a = tf.randn(64, 64):to("cuda", "bf16")
  local b = tf.randn(64, 64):to("cuda", "bf16")
  local d = tf.zeros(64, 64):to("cuda")
  k:launch({ grid = 1, block = 128 }, a, b, d)
  local want = tf.matmul(a:to("f32"), b:to("f32"):t())
  T.near(d, want, 1e-4, 1e-4)
end)


T.test("tensor maps: a TMA tile copy from the script, edges filled with zeros, loads and stores", function()
  local major = tonumber((tf.device_info("cuda").compute_capability or "0"):match("^(%d+)"))
  if major < 9 then return T.skip_test("TMA needs a 9.0 (Hopper) GPU or later") end
  local k = tf.cuda.compile_file("tma_tile.cu", { cache = false, device = "cuda" }):kernel("tma_tile")
  local rows, cols = 100, 72 -- neither a multiple of 32: the last tiles hang over the edges
  local x = tf.randn(rows, cols):to("cuda")
  local out = tf.zeros(rows, cols):to("cuda")
  local map, bytes = tf.cuda.tensor_map(x, { box = { 32, 32 } })
  T.eq(bytes, 32 * 32 * 4)
  T.ok(tostring(map):find("f32 box 32x32 of 100x72", 1, true), tostring(map))
  local out_map = tf.cuda.tensor_map(out, { box = { 32, 32 } })
  local grid = { (cols + 31) // 32, (rows + 31) // 32 }
  k:launch({ grid = grid, block = 128 }, map, out, rows, cols, bytes, out_map, false)
  T.near(out, x + 1, 0, 0)
  local stored = tf.zeros(rows, cols):to("cuda")
  local stored_map = tf.cuda.tensor_map(stored, { box = { 32, 32 } })
  k:launch({ grid = grid, block = 128 }, map, out, rows, cols, bytes, stored_map, true)
  T.near(stored, x + 1, 0, 0) -- TMA stores write the box inside the tensor only
  -- the zeros past the edge: a map of a 100 x 72 view read as its top-left 32 x 32 tiles of a 40 x 40
  local small = tf.randn(40, 40):to("cuda")
  local small_map = tf.cuda.tensor_map(small, { box = { 32, 32 } })
  local seen = tf.zeros(64, 64):to("cuda")
  k:launch({ grid = { 2, 2 }, block = 128 }, small_map, seen, 64, 64, bytes, out_map, false)
  local s = seen:to("cpu")
  T.near(s:narrow(0, 0, 40):narrow(1, 0, 40), (small + 1):to("cpu"), 0, 0)
  T.near(s:narrow(0, 40, 24), tf.ones(24, 64), 0, 0) -- rows past the tensor read as zeros (+1)
  -- the checks before launching
  T.raises(function() k:launch({ grid = 1, block = 128 }, x, out, rows, cols, bytes, out_map, false) end,
    "parameter 1 (in) takes a tensor map (tf.cuda.tensor_map), got tf.Tensor")
  local gone = tf.randn(64, 64):to("cuda")
  local gone_map = tf.cuda.tensor_map(gone, { box = { 32, 32 } })
  gone:free()
  T.raises(function() k:launch({ grid = 1, block = 128 }, gone_map, out, rows, cols, bytes, out_map, false) end,
    "the tensor of the map has been freed")
  T.raises(function() tf.cuda.tensor_map(x:t(), { box = { 32, 32 } }) end, "innermost dimension must be contiguous")
end)

T.test("the profiler shows user kernels by name, inside their range, in the class user, in the trace", function()
  local n = 1 << 20
  local x, y = tf.randn(n, { device = "cuda" }), tf.zeros(n, { device = "cuda" })
  local k = mod:kernel("axpy")
  local row = mod:kernel("row_sum<128, float>")
  local out = tf.zeros(64, { device = "cuda" })
  local p = tf.prof.start()
  for _ = 1, 3 do
    tf.range("mine", function()
      k:launch({ grid = n // 256, block = 256 }, y, x, 1.0, n)
      row:launch({ grid = 64, block = 128 }, x, out, n // 64)
    end)
  end
  p:stop()
  local rows = p:kernels { range = "mine" }
  local by = {}
  for _, r in ipairs(rows) do by[r.name] = r end
  T.ok(by.axpy, "axpy is in the range's table")
  T.eq(by.axpy.instances, 3)
  T.eq(by.axpy.class, "user")
  local rs
  for name, r in pairs(by) do if name:find("^row_sum") then rs = r end end
  T.ok(rs and rs.instances == 3 and rs.class == "user", "row_sum<128, float> is there too")
  local classes = p:kernels { range = "mine", by = "class" }
  T.eq(#classes, 1)
  T.eq(classes[1].class, "user")
  -- the range's kernel time is these kernels' time
  local sum = 0
  for _, r in ipairs(rows) do sum = sum + r.total_ms end
  T.near(classes[1].total_ms, sum, 1e-9)
  local path = os.tmpname()
  p:trace(path)
  local text = T.read_file(path)
  os.remove(path)
  T.ok(text:find('"axpy"', 1, true), "the trace names axpy")
end)

T.test("tf.bench times a user kernel", function()
  local n = 1 << 24
  local x, y = tf.randn(n, { device = "cuda" }), tf.zeros(n, { device = "cuda" })
  local k = mod:kernel("axpy")
  local s = tf.bench(function() k:launch({ grid = n // 256, block = 256 }, y, x, 1.0, n) end, { iters = 5 })
  T.ok(s.median > 0 and s.median < 1000, "median " .. s.median .. " ms")
  -- 12 bytes an element: at least 10 GB/s on any GPU
  T.ok(12 * n / (s.median * 1e6) > 10, "bandwidth")
end)

T.test("a module is loaded once per device, and a kernel handle is reused", function()
  T.ok(rawequal(mod:kernel("axpy"), mod:kernel("axpy")), "the same handle")
  local again = tf.cuda.compile(SRC, { device = "cuda" })
  T.ok(again.cached == "memory" or again.cached == nil, "compiled or from memory")
end)

T.test("tf.cuda.graph: a user kernel captured once, replayed; what cannot be captured is refused", function()
  local n = 4096
  local x, y = tf.ones(n, { device = "cuda" }), tf.zeros(n, { device = "cuda" })
  local k = mod:kernel("axpy")
  local g = tf.cuda.graph(function()
    k:launch({ grid = n // 256, block = 256 }, y, x, 1.0, n)
    k:launch({ grid = n // 256, block = 256 }, y, x, 2.0, n)
  end)
  T.eq(y:sum():item(), 0.0, "capturing runs nothing")
  for _ = 1, 5 do g:replay() end
  T.eq(y:sum():item(), 15.0 * n, "each replay adds 3")
  -- the profiler sees a replay's kernels inside the range open at the replay
  local p = tf.prof.start()
  tf.range("replays", function() g:replay() end)
  p:stop()
  local rows = p:kernels { range = "replays" }
  T.eq(#rows, 1)
  T.eq(rows[1].instances, 2)
  T.raises(function() tf.cuda.graph(function() local _ = tf.zeros(8, { device = "cuda" }) + 1 end) end,
    "tf.cuda.graph: ")
  T.raises(function() tf.cuda.graph(function() return y:sum():item() end) end, "could not be captured")
  T.raises(function() tf.cuda.graph(function() error("mine") end) end, "mine")
  -- the device works after a refused capture
  k:launch({ grid = n // 256, block = 256 }, y, x, 1.0, n)
  T.eq(y:sum():item(), 19.0 * n, "six replays of 3 (five, then the profiled one) and this launch's 1")
end)

T.run()
