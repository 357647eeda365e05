-- tf.cuda.compile without a GPU: NVRTC compiles, templates, the cache (hit, miss, damaged entry,
-- a folder that cannot be written), errors at the script's lines, the declarations read from the
-- source, option checks. Launches are tested on a GPU (test_rtc_cuda.lua).
local T = require "harness"
local decl = require "tf.cuda_decl"

if not tf.cuda.compiled() then T.skip("this tfhost was built without CUDA: there is no NVRTC to test") end

local tmp = os.getenv("TMPDIR") or "/tmp"
local root = string.format("%s/tfhost_rtc_test_%d_%d", tmp, os.time(), math.random(1, 1 << 30))
tf.mkdir(root)
local _ <close> = setmetatable({}, { __close = function() os.execute("rm -rf '" .. root .. "'") end })
local n_dirs = 0
local function fresh_dir()
  n_dirs = n_dirs + 1
  return root .. "/cache" .. n_dirs
end
local function files_in(dir)
  local p = io.popen("ls -1 '" .. dir .. "' 2>/dev/null")
  local out = {}
  for l in p:lines() do out[#out + 1] = l end
  p:close()
  return out
end

local SCALE = [[
extern "C" __global__ void scale(float *x, float a, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) x[i] *= a;
}
template <int BLOCK, typename T>
__global__ void __launch_bounds__(BLOCK) row_copy(const T *__restrict__ x, T *y, long long n) {
  long long i = (long long)blockIdx.x * BLOCK + threadIdx.x;
  if (i < n) y[i] = x[i];
}
]]

T.test("compiles for sm_90a without a GPU, and reports the time and NVRTC's version", function()
  local mod = tf.cuda.compile(SCALE, { cache = false, target = "sm_90a" })
  T.eq(mod.target, "sm_90a")
  T.eq(mod.cubin, true, "a real target gives a CUBIN")
  T.eq(mod.code:sub(1, 4), "\127ELF", "mod.code: the CUBIN itself, an ELF image")
  T.ok(mod.compile_ms > 0, "the compile time is reported")
  T.eq(mod.cached, nil, "compiled, not from a cache")
  T.eq(mod:kernels(), { "row_copy<...>", "scale" })
  T.ok(tf.cuda.nvrtc_version():match("^%d+%.%d+$"), "NVRTC's version: " .. tf.cuda.nvrtc_version())
  local ptx = tf.cuda.compile(SCALE, { cache = false, target = "compute_90" })
  T.eq(ptx.cubin, false, "a virtual target gives PTX")
  T.ok(ptx.code:find(".target sm_90", 1, true), "mod.code: the PTX text")
end)

T.test("CUDA's own headers and tfhost's compile: fp16, bf16, fp8, cuda/std, cub", function()
  local src = [[
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include <cuda/std/limits>
#include <cub/warp/warp_reduce.cuh>
#include <tfhost.cuh>
extern "C" __global__ void k(const __nv_bfloat16 *x, __half *y, __nv_fp8_e4m3 *z, float *s) {
  using R = cub::WarpReduce<float>;
  __shared__ typename R::TempStorage tmp;
  float v = __bfloat162float(x[threadIdx.x]);
  float t = R(tmp).Sum(v);
  y[threadIdx.x] = __float2half(v);
  z[threadIdx.x] = __nv_fp8_e4m3(v);
  if (threadIdx.x == 0) s[0] = t + cuda::std::numeric_limits<float>::epsilon();
}
]]
  local mod = tf.cuda.compile(src, { cache = false })
  T.eq(mod:kernels(), { "k" })
end)

-- what tfhost's own Hopper kernels are built from, offered to scripts (sm_90a)
local HOPPER = [[
#include <tfhost_sm90.cuh>
extern "C" __global__ void __launch_bounds__(384) hopper(const __nv_bfloat16 *a, float *out, float *sum,
                                                        const void *map) {
  __shared__ __align__(1024) unsigned char tile[64 * 128];
  __shared__ __align__(8) unsigned long long bar;
  const unsigned t = tf::smem_addr(tile), b = tf::smem_addr(&bar);
  if (threadIdx.x / 128 == 0) tf::setmaxnreg_dec<40>(); else tf::setmaxnreg_inc<232>();
  if (threadIdx.x == 0) { tf::mbar_init(b, 1); tf::mbar_init_fence(); }
  __syncthreads();
  if (threadIdx.x == 0) {
    tf::mbar_arrive_expect_tx(b, 64 * 128);
    tf::tma_load_3d(t, map, 0, 0, 0, b);
  }
  tf::mbar_wait(b, 0);
  float d[32] = {};
  const unsigned long long desc = tf::wgmma_desc(t, 16, 1024);
  tf::wgmma_fence();
  tf::wgmma_ss<__nv_bfloat16, 0, 0>(d, desc, tf::wgmma_desc_add(desc, 32), false);
  tf::wgmma_commit();
  tf::wgmma_wait<0>();
  tf::wgmma_hold(d);
  tf::fence_proxy_async();
  if (threadIdx.x == 0) { tf::bulk_reduce_add_f32(sum, t, 128); tf::bulk_commit(); tf::bulk_wait<0>(); }
  out[threadIdx.x] = d[threadIdx.x % 32];
}
]]

T.test("<tfhost_sm90.cuh>: wgmma, mbarrier, TMA, bulk reductions and setmaxnreg compile for sm_90a, not below", function()
  local mod = tf.cuda.compile(HOPPER, { cache = false, target = "sm_90a" })
  T.eq(mod:kernels(), { "hopper" })
  local ok, err = pcall(tf.cuda.compile, HOPPER, { cache = false, target = "sm_90" })
  T.ok(not ok and tostring(err):find("tfhost_sm90.cuh needs the target sm_90a", 1, true), tostring(err))
end)

T.test("templates: instantiated by name, at compile time or on first use; parameters read per instance", function()
  local mod = tf.cuda.compile(SCALE, { cache = false, instantiate = { "row_copy<256, float>" } })
  T.ok(mod._builds["row_copy<256, float>"].lowered:find("row_copy"), "the lowered name is kept")
  local kernels = decl.parse(SCALE)
  local k, params = decl.instance(kernels, "row_copy<128, __nv_bfloat16>")
  T.eq(k.name, "row_copy")
  T.eq(params[1].kind, "pointer")
  T.eq(params[1].dtype, "bf16")
  T.eq(params[3].kind, "int")
  T.eq(params[3].bytes, 8)
  local _, why = decl.instance(kernels, "row_copy")
  T.ok(why:find("is a template: name an instantiation, e.g. row_copy<BLOCK, T>", 1, true), why)
  _, why = decl.instance(kernels, "row_copy<1, float, int>")
  T.ok(why:find("2 template parameters", 1, true), why)
  _, why = decl.instance(kernels, "nothing")
  T.ok(why:find("no __global__ function named nothing", 1, true), why)
  T.raises(function() tf.cuda.compile(SCALE, { cache = false, instantiate = { "row_copy" } }) end,
    "instantiate: row_copy: row_copy is a template")
end)

T.test("declarations: pointers, views, numbers; comments and strings ignored", function()
  local src = [[
// __global__ void commented(int x) {}
/* __global__ void also_commented(int x) {} */
#include <tfhost.cuh>
extern "C" __global__ void a(const float *__restrict__ x, double *y, tf::view<__half, 3> v, unsigned n,
                             size_t m, bool flag, long long big, const void *raw, float4 *vec) {
  const char *s = "__global__ void in_a_string(int)";
}
]]
  local k = decl.parse(src)
  T.eq(k.commented, nil)
  T.eq(k.also_commented, nil)
  T.eq(k.in_a_string, nil)
  local _, p = decl.instance(k, "a")
  T.eq(#p, 9)
  T.eq({ p[1].kind, p[1].dtype }, { "pointer", "f32" })
  T.eq({ p[2].kind, p[2].dtype }, { "pointer", "f64" })
  T.eq({ p[3].kind, p[3].dtype, p[3].ndim }, { "view", "f16", 3 })
  T.eq({ p[4].kind, p[4].bytes }, { "uint", 4 })
  T.eq({ p[5].kind, p[5].bytes }, { "uint", 8 })
  T.eq({ p[6].kind, p[6].bytes }, { "bool", 1 })
  T.eq({ p[7].kind, p[7].bytes }, { "int", 8 })
  T.eq({ p[8].kind, p[8].dtype }, { "pointer", nil })
  T.eq({ p[9].kind, p[9].dtype }, { "pointer", "f32" })
  local _, why = decl.param("__nv_bfloat16", "x")
  T.ok(why:find("take a float and convert it", 1, true), why)
  _, why = decl.param("float &", "x")
  T.ok(why:find("reference", 1, true), why)
  _, why = decl.param("my_struct", "x")
  T.ok(why:find("params = {...}", 1, true), why)
end)

T.test("tensor maps: declared const __grid_constant__ tf::tensor_map, a TMA kernel compiles for sm_90a", function()
  local path = debug.getinfo(1, "S").source:match("^@(.*/)[^/]*$") .. "tma_tile.cu"
  local f = assert(io.open(path))
  local _, p = decl.instance(decl.parse(f:read("a")), "tma_tile")
  f:close()
  T.eq({ p[1].kind, p[1].bytes }, { "tensor_map", 128 })
  T.eq(p[2].kind, "pointer")
  T.eq({ p[6].kind, p[7].kind }, { "tensor_map", "bool" })
  local q = decl.param("const __grid_constant__ CUtensorMap", "m")
  T.eq(q.kind, "tensor_map")
  local _, why = decl.param("tf::tensor_map", "m")
  T.ok(why and why:find("const __grid_constant__", 1, true), tostring(why))
  local mod = tf.cuda.compile_file("tma_tile.cu", { cache = false, target = "sm_90a" })
  T.eq(mod:kernels(), { "tma_tile" })
end)

T.test("tensor maps: the plan reverses to innermost first and refuses what the driver would", function()
  local plan = tf.cuda.tensor_map_plan
  local s = plan({ 100, 200 }, { 200, 1 }, "f32", { box = { 32, 16 } })
  T.eq(s.rank, 2)
  T.eq(s.dims, { 200, 100 })
  T.eq(s.box, { 16, 32 })
  T.eq(s.strides, { 800 })
  T.eq(s.element_strides, { 1, 1 })
  T.eq(s.bytes, 32 * 16 * 4)
  T.eq(s.swizzle, 0)
  s = plan({ 4, 8, 64, 64 }, { 8 * 64 * 64, 64 * 64, 64, 1 }, "bf16", { box = { 1, 1, 64, 64 }, swizzle = "128B",
    l2_promotion = "256B", oob = "nan" })
  T.eq(s.dims, { 64, 64, 8, 4 })
  T.eq(s.strides, { 128, 64 * 128, 8 * 64 * 128 })
  T.eq({ s.swizzle, s.l2_promotion, s.oob_nan }, { 128, 256, true })
  local function refused(shape, strides, dtype, opts, text)
    T.raises(function() plan(shape, strides, dtype, opts) end, text)
  end
  refused({ 100, 200 }, { 1, 100 }, "f32", { box = { 8, 8 } }, "innermost dimension must be contiguous")
  refused({ 100, 3 }, { 3, 1 }, "f32", { box = { 8, 4 } }, "stride is 12 bytes")
  refused({ 100, 200 }, { 200, 1 }, "f32", { box = { 8, 3 } }, "innermost box is 12 bytes")
  refused({ 100, 200 }, { 200, 1 }, "f32", { box = { 8, 300 } }, "1 to 256 elements")
  refused({ 100, 256 }, { 256, 1 }, "f32", { box = { 8, 64 }, swizzle = "128B" }, "at most 128 bytes, not 256")
  refused({ 100, 200 }, { 200, 1 }, "f32", { box = { 8 } }, "box must list 2 sizes")
  refused({ 100, 200 }, { 200, 1 }, "f32", { box = { 8, 8 }, swizzle = "16B" }, "have none, 32B, 64B, 128B")
  refused({ 100, 200 }, { 200, 1 }, "i32", { box = { 8, 8 }, oob = "nan" }, "needs a floating-point tensor")
  refused({ 100, 200 }, { 200, 1 }, "f32", { box = { 8, 8 }, tile = 1 }, "unknown option 'tile'")
  refused({ 2, 2, 2, 2, 2, 2 }, { 32, 16, 8, 4, 2, 1 }, "f32", { box = { 1, 1, 1, 1, 1, 4 } }, "6 dimensions")
  T.raises(function() tf.cuda.tensor_map(tf.zeros({ 16, 16 }, { device = "cpu" }), { box = { 8, 8 } }) end,
    "the tensor must be on a GPU")
end)

T.test("errors are at the script's lines: a long string's third line", function()
  local line0 = debug.getinfo(1, "l").currentline
  local src = [[
extern "C" __global__ void broken(float *x) {
  x[0] = no_such_name;
}]]
  local err = T.raises(function() tf.cuda.compile(src, { cache = false }) end,
    "test_rtc.lua:" .. (line0 + 3) .. ": tf.cuda.compile: ")
  T.ok(err:find('identifier "no_such_name" is undefined', 1, true), err)
  -- a source made at run time is named after the line that compiled it
  local made = "extern \"C\" __global__ void k() { undefined_call(); }" .. string.rep(" ", 1)
  local line1 = debug.getinfo(1, "l").currentline
  err = T.raises(function() tf.cuda.compile(made, { cache = false }) end, "(the source given to tf.cuda.compile)")
  T.ok(err:find("test_rtc.lua:" .. (line1 + 1), 1, true), err)
  -- file and line given by the script
  err = T.raises(function() tf.cuda.compile("\n\nint x = ;", { cache = false, file = "mine.cu", line = 10 }) end,
    "mine.cu:12: tf.cuda.compile: ")
end)

T.test("warnings are kept in mod.log", function()
  local mod = tf.cuda.compile([[
extern "C" __global__ void w(float *x) { int unused = 3; x[0] = 1.0f; }
]], { cache = false, quiet = true })
  T.ok(mod.log:find("unused", 1, true), "the log: " .. mod.log)
end)

T.test("the cache: a miss writes one entry, a hit reads it back, templates are cached too", function()
  local dir = fresh_dir()
  local src = SCALE .. "// cache test " .. dir .. "\n"
  -- a source made at run time is named after the line that compiles it: file = fixes the name
  local first = tf.cuda.compile(src, { cache_dir = dir, file = "scale.cu" })
  T.eq(first.cached, nil)
  T.eq(#files_in(dir), 1, "one entry written")
  local second = tf.cuda.compile(src, { cache_dir = dir, file = "scale.cu" })
  T.eq(second.cached, "memory", "the same process: the memory cache")
  -- the disk: another process
  local script = root .. "/again.lua"
  local f = assert(io.open(script, "w"))
  f:write(string.format("local m = tf.cuda.compile(%q, {cache_dir = %q, file = 'scale.cu'}); print(m.cached)\n" ..
    "local t = m:_build('row_copy<64, float>'); print(t.entry.cached)", src, dir))
  f:close()
  local p = io.popen(string.format("'%s' '%s' 2>&1", tf.executable(), script))
  local out = p:read("a")
  p:close()
  T.eq(out, "disk\nnil\n", "the second run reads the disk; a new instantiation compiles")
  T.eq(#files_in(dir), 2, "the instantiation has its own entry")
  p = io.popen(string.format("'%s' '%s' 2>&1", tf.executable(), script))
  out = p:read("a")
  p:close()
  T.eq(out, "disk\ndisk\n", "and comes from the disk the next time")
  -- another option is another entry
  local other = tf.cuda.compile(src, { cache_dir = dir, file = "scale.cu", defines = { X = 1 } })
  T.eq(other.cached, nil, "defines are part of the key")
  local fm = tf.cuda.compile(src, { cache_dir = dir, file = "scale.cu", fast_math = true })
  T.eq(fm.cached, nil, "fast_math is part of the key")
end)

T.test("the cache: a damaged entry is noted, compiled again and replaced", function()
  local dir = fresh_dir()
  local src = SCALE .. "// damaged " .. dir .. "\n"
  tf.cuda.compile(src, { cache_dir = dir, file = "scale.cu" })
  local name = files_in(dir)[1]
  local f = assert(io.open(dir .. "/" .. name, "r+b"))
  f:seek("set", 200)
  f:write("garbage garbage garbage")
  f:close()
  local script = root .. "/damaged.lua"
  f = assert(io.open(script, "w"))
  f:write(string.format("local m = tf.cuda.compile(%q, {cache_dir = %q, file = 'scale.cu'}); print(m.cached)", src, dir))
  f:close()
  local p = io.popen(string.format("'%s' '%s' 2>&1", tf.executable(), script))
  local out = p:read("a")
  p:close()
  T.ok(out:find("is damaged or of another format: compiling again and replacing it", 1, true), out)
  T.ok(out:find("nil\n$"), "compiled again: " .. out)
  p = io.popen(string.format("'%s' '%s' 2>&1", tf.executable(), script))
  out = p:read("a")
  p:close()
  T.eq(out, "disk\n", "the replaced entry is good")
end)

T.test("the cache: a folder that cannot be made or written is skipped with a note", function()
  local blocker = root .. "/a_file"
  local f = assert(io.open(blocker, "w"))
  f:write("x")
  f:close()
  local script = root .. "/ro.lua"
  f = assert(io.open(script, "w"))
  f:write(string.format("local m = tf.cuda.compile(%q, {cache_dir = %q}); print(m.cached, #m:kernels())",
    SCALE .. "// ro\n", blocker .. "/kernels"))
  f:close()
  local p = io.popen(string.format("'%s' '%s' 2>&1", tf.executable(), script))
  local out = p:read("a")
  local ok = p:close()
  T.ok(ok, "the compile still succeeds: " .. out)
  T.ok(out:find("cannot be made", 1, true) and out:find("not kept for the next run", 1, true), out)
  T.ok(out:find("nil\t2\n", 1, true), out)
  -- TFHOST_KERNEL_CACHE=none: no disk cache at all
  p = io.popen(string.format("TFHOST_KERNEL_CACHE=none '%s' -e 'print(tf.cuda.cache_dir())'", tf.executable()))
  T.eq(p:read("a"), "nil\n")
  p:close()
end)

T.test("options: unknown keys, wrong types and targets are errors that say what is accepted", function()
  T.raises(function() tf.cuda.compile(SCALE, { arch = "sm_90" }) end, "did you mean target")
  T.raises(function() tf.cuda.compile(SCALE, { fast_math = 1 }) end, "fast_math must be true or false")
  T.raises(function() tf.cuda.compile(SCALE, { target = "hopper" }) end, "target must be like")
  T.raises(function() tf.cuda.compile(42) end, "tf.cuda.compile")
  T.raises(function() tf.cuda.compile(SCALE, { defines = 3 }) end, "defines must be a table")
  T.raises(function() tf.cuda.compile(SCALE, { include = { 1 } }) end, "include[1] must be a string")
end)

T.test("defines and include folders reach NVRTC", function()
  local dir = root .. "/inc"
  tf.mkdir(dir)
  local f = assert(io.open(dir .. "/mine.cuh", "w"))
  f:write("#define MY_VALUE 7\n")
  f:close()
  local src = [[
#include "mine.cuh"
#if MY_VALUE != 7 || WIDTH != 64
#error "not seen"
#endif
extern "C" __global__ void k(float *x) { x[0] = WIDTH; }
]]
  local mod = tf.cuda.compile(src, { cache = false, include = { dir }, defines = { WIDTH = 64 } })
  T.eq(mod:kernels(), { "k" })
  T.raises(function() tf.cuda.compile(src, { cache = false, include = { dir }, defines = { WIDTH = 32 } }) end,
    "not seen")
end)

T.test("without a GPU a compiled kernel cannot be loaded, and says so", function()
  if tf.cuda.is_available() then T.ok(true, "a GPU is present: test_rtc_cuda.lua loads") return end
  local mod = tf.cuda.compile(SCALE, { cache = false })
  T.raises(function() mod:kernel("scale") end, "cannot be loaded: this machine has no CUDA device")
  T.raises(function() mod:kernel("nope") end, "the module has: row_copy<...>, scale")
end)

T.run()
