--- help: one-line signatures and summaries of tf's functions, for the REPL
-- and scripts. help() lists the namespaces; help(tf.matmul) or
-- help("tf.matmul") prints a function's signature and what it does;
-- help(tf.nn) lists a namespace's entries. docs/api.md is the full
-- reference: tests/lua/test_help.lua checks every entry here is documented
-- there and names a function that exists.
local M = {}

-- name, signature, summary
M.entries = {
  -- tensors
  { "tf.tensor", "tf.tensor(values [, opts])", "a tensor from nested Lua tables or a number" },
  { "tf.zeros", "tf.zeros(shape... [, opts])", "a tensor of zeros (opts: dtype, device)" },
  { "tf.ones", "tf.ones(shape... [, opts])", "a tensor of ones" },
  { "tf.full", "tf.full(shape, value [, opts])", "a tensor filled with value" },
  { "tf.empty", "tf.empty(shape... [, opts])", "an uninitialised tensor" },
  { "tf.arange", "tf.arange([start,] stop [, step])", "evenly spaced values, like torch.arange" },
  { "tf.rand", "tf.rand(shape... [, opts])", "uniform random numbers in [0, 1)" },
  { "tf.randn", "tf.randn(shape... [, opts])", "standard normal random numbers" },
  { "tf.randint", "tf.randint(low, high, shape [, opts])", "random integers in [low, high)" },
  { "tf.seed", "tf.seed(n)", "reseeds every device's random numbers" },
  { "tf.is_tensor", "tf.is_tensor(v)", "whether v is a tensor" },
  { "tf.initial_seed", "tf.initial_seed()", "the seed the random numbers started from" },
  { "tf.trunc_normal", "tf.trunc_normal(shape, std [, cut])", "normal(0, std) values cut at cut (3) standard deviations" },
  -- elementwise ops (also methods: x:exp())
  { "tf.neg", "tf.neg(x)", "-x" },
  { "tf.abs", "tf.abs(x)", "|x|" },
  { "tf.relu", "tf.relu(x)", "max(x, 0)" },
  { "tf.square", "tf.square(x)", "x * x" },
  { "tf.sign", "tf.sign(x)", "-1, 0 or 1 by the sign of x" },
  { "tf.exp", "tf.exp(x)", "e^x (f32 under autocast)" },
  { "tf.log", "tf.log(x)", "natural logarithm (f32 under autocast)" },
  { "tf.sqrt", "tf.sqrt(x)", "square root" },
  { "tf.rsqrt", "tf.rsqrt(x)", "1 / sqrt(x) (f32 under autocast)" },
  { "tf.sigmoid", "tf.sigmoid(x)", "1 / (1 + e^-x)" },
  { "tf.silu", "tf.silu(x)", "x * sigmoid(x)" },
  { "tf.gelu", "tf.gelu(x)", "x * Phi(x), the exact (erf) GELU" },
  { "tf.erf", "tf.erf(x)", "the error function" },
  { "tf.tanh", "tf.tanh(x)", "hyperbolic tangent" },
  { "tf.sin", "tf.sin(x)", "sine" },
  { "tf.cos", "tf.cos(x)", "cosine" },
  { "tf.add", "tf.add(a, b)", "a + b, broadcast (either may be a number)" },
  { "tf.sub", "tf.sub(a, b)", "a - b, broadcast" },
  { "tf.mul", "tf.mul(a, b)", "a * b, broadcast" },
  { "tf.div", "tf.div(a, b)", "a / b, broadcast (integers compute in f32)" },
  { "tf.pow", "tf.pow(a, b)", "a ^ b, broadcast (f32 under autocast)" },
  { "tf.maximum", "tf.maximum(a, b)", "elementwise larger of a and b, broadcast" },
  { "tf.minimum", "tf.minimum(a, b)", "elementwise smaller of a and b, broadcast" },
  { "tf.eq", "tf.eq(a, b)", "a == b elementwise: a bool tensor" },
  { "tf.ne", "tf.ne(a, b)", "a ~= b elementwise: a bool tensor" },
  { "tf.lt", "tf.lt(a, b)", "a < b elementwise: a bool tensor" },
  { "tf.le", "tf.le(a, b)", "a <= b elementwise: a bool tensor" },
  { "tf.gt", "tf.gt(a, b)", "a > b elementwise: a bool tensor" },
  { "tf.ge", "tf.ge(a, b)", "a >= b elementwise: a bool tensor" },
  { "tf.isnan", "tf.isnan(x)", "where x is NaN: a bool tensor" },
  { "tf.isfinite", "tf.isfinite(x)", "where x is neither infinite nor NaN: a bool tensor" },
  -- reductions
  { "tf.sum", "tf.sum(x [, dim [, keepdim]])", "sum of all elements, or along dim (f32 under autocast)" },
  { "tf.mean", "tf.mean(x [, dim [, keepdim]])", "mean of all elements, or along dim (floating dtypes)" },
  { "tf.max", "tf.max(x [, dim [, keepdim]])", "largest element, or along dim (NaN propagates)" },
  { "tf.min", "tf.min(x [, dim [, keepdim]])", "smallest element, or along dim (NaN propagates)" },
  -- ops
  { "tf.matmul", "tf.matmul(a, b)", "matrix product, batched and broadcast over leading dims" },
  { "tf.linear", "tf.linear(x, w [, b])", "x @ w^T + b, w of shape (out, in)" },
  { "tf.log_softmax", "tf.log_softmax(x [, dim])", "log of softmax along dim (default the last)" },
  { "tf.layer_norm", "tf.layer_norm(x [, w [, b [, eps]]])", "layer norm over the last dim (eps 1e-5)" },
  { "tf.rms_norm", "tf.rms_norm(x [, gain [, eps]])", "x / sqrt(mean(x^2) + eps) * gain, statistics in f32" },
  { "tf.rope", "tf.rope(x [, theta [, positions]])", "rotary embedding of the last dim's interleaved pairs" },
  { "tf.embedding", "tf.embedding(weight, ids)", "rows of weight (V, D) for integer ids of any shape" },
  { "tf.masked_fill", "tf.masked_fill(x, mask, value)", "value where the bool mask (broadcast) is true" },
  { "tf.causal_mask", "tf.causal_mask(n [, m] [, opts])", "the (n, m) bool mask that is true where j <= i" },
  { "tf.attention", "tf.attention(q, k, v [, opts])", "scaled dot-product attention: FlashAttention-2 or naive" },
  { "tf.softmax", "tf.softmax(x [, dim])", "softmax along dim (default the last)" },
  { "tf.cross_entropy", "tf.cross_entropy(logits, targets)", "mean cross-entropy of logits against integer targets" },
  { "tf.autocast", "tf.autocast(dtype, fn)", "runs fn with mixed precision (bf16 or f16), as torch.autocast" },
  { "tf.autocast_dtype", "tf.autocast_dtype()", "the dtype of the autocast region in force, or nil" },
  { "tf.no_grad", "tf.no_grad(fn)", "runs fn without recording autograd history" },
  { "tf.enable_grad", "tf.enable_grad([fn])", "records autograd history again inside a no_grad region" },
  { "tf.is_grad_enabled", "tf.is_grad_enabled()", "whether ops record autograd history now" },
  { "tf.allow_tf32", "tf.allow_tf32(on [, dev])", "lets f32 matmuls use TF32; returns the previous setting" },
  -- devices and the host
  { "tf.device", "tf.device([dev])", "the current (or dev's) device name" },
  { "tf.set_device", "tf.set_device(dev)", "changes the default device (cpu, cuda, cuda:N)" },
  { "tf.default_device", "tf.default_device()", "the short name of the default device" },
  { "tf.cuda.is_available", "tf.cuda.is_available()", "whether a GPU can be used" },
  { "tf.cuda.device_count", "tf.cuda.device_count()", "the number of GPUs" },
  { "tf.cuda.compiled", "tf.cuda.compiled()", "whether this build has the CUDA backend" },
  { "tf.cuda.gemm_tuning", "tf.cuda.gemm_tuning([dev])", "what the GEMMs' timed choice of algorithm did so far" },
  { "tf.cuda.traffic", "tf.cuda.traffic(fn [, dev])", "the calls and bytes of each memory-bound kernel fn launched" },
  { "tf.timer", "tf.timer()", "a started timer (CUDA events on a GPU): t:stop(), t:ms()" },
  { "tf.device_info", "tf.device_info([dev])", "name, memory, compute capability, driver of a device" },
  { "tf.sync", "tf.sync()", "waits for every device to finish its work" },
  { "tf.now", "tf.now()", "a monotonic clock in milliseconds" },
  { "tf.threads", "tf.threads([n])", "the CPU backend's thread count (sets it to n)" },
  { "tf.sysinfo", "tf.sysinfo()", "the host: OS, CPU, cores, threads, BLAS, Lua heap" },
  { "tf.exit", "tf.exit([code [, message]])", "leaves tfhost cleanly with an exit code" },
  { "tf.mkdir", "tf.mkdir(path)", "makes a folder and its missing parents (as mkdir -p)" },
  { "tf.executable", "tf.executable()", "the path of the running tfhost binary" },
  { "tf.safe_run", "tf.safe_run(script [, opts])", "runs a script you were sent under tfhost --safe; ok, exit code" },
  -- tensor methods (the ops above are methods too: x:sum(), x:exp(), a:matmul(b))
  { "tf.Tensor.reshape", "x:reshape(shape...)", "the same values in a new shape (one size may be -1); a view when it can" },
  { "tf.Tensor.view", "x:view(shape...)", "a view in a new shape (x must be contiguous)" },
  { "tf.Tensor.transpose", "x:transpose(dim0, dim1)", "a view with two dims swapped" },
  { "tf.Tensor.t", "x:t()", "a matrix's transpose (a view)" },
  { "tf.Tensor.narrow", "x:narrow(dim, start, length)", "a view of elements start .. start + length - 1 of dim" },
  { "tf.Tensor.select", "x:select(dim, index)", "a view at one index of dim, without that dim" },
  { "tf.Tensor.unsqueeze", "x:unsqueeze(dim)", "a view with a new dim of size 1" },
  { "tf.Tensor.squeeze", "x:squeeze([dim])", "a view without dims of size 1 (or only dim)" },
  { "tf.Tensor.expand", "x:expand(shape...)", "a broadcast view: size-1 dims repeat with stride 0" },
  { "tf.Tensor.contiguous", "x:contiguous()", "x, or a contiguous copy of it" },
  { "tf.Tensor.clone", "x:clone()", "a copy with its own storage" },
  { "tf.Tensor.to", "x:to(dtype or device [, dtype])", "x converted (x:to{dtype = ..., device = ...}); x itself when nothing changes" },
  { "tf.Tensor.cpu", "x:cpu()", "x on the CPU" },
  { "tf.Tensor.cuda", "x:cuda([index])", "x on a GPU" },
  { "tf.Tensor.copy_", "x:copy_(src)", "copies src's values into x (same shape and device)" },
  { "tf.Tensor.fill_", "x:fill_(value)", "sets every element of x to value" },
  { "tf.Tensor.tolist", "x:tolist()", "the values as nested Lua tables" },
  { "tf.Tensor.item", "x:item()", "the value of a one-element tensor" },
  { "tf.Tensor.size", "x:size([dim])", "the shape, or the size of dim" },
  { "tf.Tensor.stride", "x:stride([dim])", "the strides in elements, or dim's" },
  { "tf.Tensor.numel", "x:numel()", "the number of elements" },
  { "tf.Tensor.dim", "x:dim()", "the number of dims (x.ndim)" },
  { "tf.Tensor.element_size", "x:element_size()", "bytes per element" },
  { "tf.Tensor.data_ptr", "x:data_ptr()", "the address of x's first element (to find it in snapshots)" },
  { "tf.Tensor.requires_grad", "x:requires_grad([on])", "marks a leaf that takes a gradient (returns x); without on, tells" },
  { "tf.Tensor.backward", "x:backward([grad] [, opts])", "gradients of x into the leaves' .grad (opts: retain_graph, on_grad)" },
  { "tf.Tensor.detach", "x:detach()", "the same values without autograd history" },
  { "tf.Tensor.zero_grad", "x:zero_grad()", "drops x.grad" },
  { "tf.Tensor.free", "x:free()", "releases x's memory now (as <close> and the collector do)" },
  { "tf.Tensor.is_freed", "x:is_freed()", "whether x was released" },
  -- namespaces' main entries
  { "tf.nn.Linear", "tf.nn.Linear(in, out [, opts])", "a linear layer (module)" },
  { "tf.nn.Sequential", "tf.nn.Sequential(m1, m2, ...)", "modules applied in order" },
  { "tf.nn.LayerNorm", "tf.nn.LayerNorm(d [, opts])", "layer norm over the last dim (opts: eps, affine)" },
  { "tf.nn.RMSNorm", "tf.nn.RMSNorm(d [, opts])", "RMS norm with a learned gain (opts: eps)" },
  { "tf.nn.Embedding", "tf.nn.Embedding(num, dim [, opts])", "a lookup table of num vectors of size dim" },
  { "tf.nn.ReLU", "tf.nn.ReLU()", "the module form of x:relu()" },
  { "tf.nn.SiLU", "tf.nn.SiLU()", "the module form of x:silu()" },
  { "tf.nn.GELU", "tf.nn.GELU()", "the module form of x:gelu()" },
  { "tf.nn.Tanh", "tf.nn.Tanh()", "the module form of x:tanh()" },
  { "tf.nn.Sigmoid", "tf.nn.Sigmoid()", "the module form of x:sigmoid()" },
  { "tf.nn.init.trunc_normal", "tf.nn.init.trunc_normal(shape, std [, opts])", "a truncated-normal parameter (cut at 3 std)" },
  { "tf.nn.Module.extend", "tf.nn.Module:extend(name)", "a new module class; define its init and forward" },
  { "tf.nn.Module.new", "Class:new(...)", "an instance of a module class (Class(...) does the same)" },
  { "tf.nn.Module.add", "m:add(name, value)", "registers a child module or a parameter tensor, in order" },
  { "tf.nn.Module.forward", "m:forward(...)", "what m(...) runs; each module class defines it" },
  { "tf.nn.Module.parameters", "m:parameters()", "the list of the parameter tensors" },
  { "tf.nn.Module.named_parameters", "m:named_parameters()", "for name, p in m:named_parameters() do ... end" },
  { "tf.nn.Module.state_dict", "m:state_dict()", "the parameters by name: fc1.weight -> tensor" },
  { "tf.nn.Module.zero_grad", "m:zero_grad()", "drops every parameter's grad" },
  { "tf.nn.Module.num_parameters", "m:num_parameters()", "the count of parameter elements" },
  { "tf.optim.AdamW", "tf.optim.AdamW(params [, opts])", "torch.optim.AdamW over a module's or a list's parameters" },
  { "tf.optim.SGD", "tf.optim.SGD(params [, opts])", "torch.optim.SGD" },
  { "tf.optim.adamw", "tf.optim.adamw(model [, opts])", "the fused model's own AdamW over all its parameters" },
  { "tf.amp.GradScaler", "tf.amp.GradScaler([opts])", "loss scaling for f16 training" },
  { "tf.model.new", "tf.model.new{preset = ..., ...}", "the CS336 Transformer LM (fused C engine or eager)" },
  { "tf.model.load", "tf.model.load(path [, opts])", "a model saved by m:save, with its configuration" },
  { "tf.model.config", "tf.model.config(spec)", "the full, checked configuration of a preset and its overrides" },
  { "tf.model.num_parameters", "tf.model.num_parameters(cfg)", "the parameter count of a configuration" },
  { "tf.model.step_flops", "tf.model.step_flops(cfg, batch, seq)", "the FLOPs of one training step" },
  { "tf.dist.rank", "tf.dist.rank()", "this process's rank (0 without a launcher; tfhost --nproc N starts N)" },
  { "tf.dist.world_size", "tf.dist.world_size()", "the number of ranks in the run" },
  { "tf.dist.local_rank", "tf.dist.local_rank()", "this process's rank on its machine" },
  { "tf.dist.is_distributed", "tf.dist.is_distributed()", "whether the run has more than one rank" },
  { "tf.dist.info", "tf.dist.info()", "ranks, launcher, MPI, NCCL, checks and timeout" },
  { "tf.dist.env", "tf.dist.env()", "what results files record of the ranks (nil for one rank)" },
  { "tf.dist.set_checks", "tf.dist.set_checks(on)", "whether ranks compare their calls before each collective" },
  { "tf.dist.set_timeout", "tf.dist.set_timeout(s)", "how long a rank waits for the others, in seconds" },
  { "tf.dist.send", "tf.dist.send(t, peer)", "sends t to rank peer" },
  { "tf.dist.recv", "tf.dist.recv(t, peer)", "receives into t from rank peer" },
  { "tf.dist.all_reduce_async", "tf.dist.all_reduce_async(t [, op])", "starts all_reduce; returns a work: w:wait()" },
  { "tf.dist.broadcast_async", "tf.dist.broadcast_async(t, root)", "starts broadcast; returns a work" },
  { "tf.dist.all_gather_async", "tf.dist.all_gather_async(out, t)", "starts all_gather; returns a work" },
  { "tf.dist.reduce_scatter_async", "tf.dist.reduce_scatter_async(out, t [, op])", "starts reduce_scatter; returns a work" },
  { "tf.dist.send_async", "tf.dist.send_async(t, peer)", "starts send; returns a work" },
  { "tf.dist.recv_async", "tf.dist.recv_async(t, peer)", "starts recv; returns a work" },
  { "tf.dist.all_reduce", "tf.dist.all_reduce(t [, op])", "t = sum (avg, max, min) over the ranks, in place; _async: a work" },
  { "tf.dist.broadcast", "tf.dist.broadcast(t, root)", "t = root's t on every rank" },
  { "tf.dist.all_gather", "tf.dist.all_gather(out, t)", "out = every rank's t, in rank order" },
  { "tf.dist.reduce_scatter", "tf.dist.reduce_scatter(out, t [, op])", "out = this rank's part of the sum over ranks" },
  { "tf.dist.barrier", "tf.dist.barrier()", "waits until every rank has arrived" },
  { "tf.mem.stats", "tf.mem.stats([dev])", "the caching allocator's counters" },
  { "tf.mem.snapshot", "tf.mem.snapshot([dev])", "segments, blocks and the recorded history" },
  { "tf.mem.record", "tf.mem.record{max_entries = ...}", "starts (false: stops) recording allocator events" },
  { "tf.mem.dump", "tf.mem.dump(path, snapshot)", "writes a snapshot as PyTorch's pickle or as JSON" },
  { "tf.mem.plot", "tf.mem.plot(path, opts)", "a self-contained HTML memory timeline" },
  { "tf.mem.set_limit", "tf.mem.set_limit(bytes)", "caps the memory tfhost may reserve (nil: no cap)" },
  { "tf.mem.reset_peak", "tf.mem.reset_peak([dev])", "peaks restart from the current values" },
  { "tf.mem.empty_cache", "tf.mem.empty_cache([dev])", "collects garbage tensors, returns unused segments" },
  { "tf.mem.collect", "tf.mem.collect()", "a full Lua garbage collection" },
  { "tf.mem.scope", "tf.mem.scope(tag [, what] [, fn, ...])", "tags the allocations inside (parameter, activation, ...)" },
  { "tf.mem.summary", "tf.mem.summary([snapshot])", "bytes live per tag at the recorded peak" },
  { "tf.mem.is_oom", "tf.mem.is_oom(err)", "whether an error is an out-of-memory error" },
  { "tf.range", "tf.range(name [, fn, ...])", "a named range (NVTX and the profiler), closed at scope end" },
  { "tf.prof.start", "tf.prof.start([opts])", "starts the kernel profiler; p:kernels{}, p:ranges()" },
  { "tf.prof.stack", "tf.prof.stack()", "the names of the open ranges, outermost first" },
  { "tf.prof.available", "tf.prof.available()", "true, or false and why GPU kernel records are off" },
  { "tf.prof.classify", "tf.prof.classify(short_name [, full_name [, cache]])", "a kernel's class: gemm, attention, softmax, ..." },
  { "tf.bench", "tf.bench(fn [, opts])", "times fn: warm-up, then timed calls between synchronisations" },
  { "tf.bench.backward", "tf.bench.backward(forward, dout, leaves [, opts])", "times backward passes alone" },
  { "tf.bench.summarize", "tf.bench.summarize(samples)", "mean, std, median, min, max of a list of times" },
  { "tf.report.table", "tf.report.table(rows [, opts])", "prints rows as a Markdown (CSV, JSON) table" },
  { "tf.report.cell", "tf.report.cell(v)", "a value as a table cell shows it" },
  { "tf.report.progress", "tf.report.progress(fmt, ...)", "a progress note on stderr (stdout keeps the tables)" },
  { "tf.report.formats.markdown", "tf.report.formats.markdown(rows, opts)", "the Markdown reporter (replaceable)" },
  { "tf.report.formats.csv", "tf.report.formats.csv(rows, opts)", "the CSV reporter (replaceable)" },
  { "tf.report.formats.json", "tf.report.formats.json(rows, opts)", "the JSON reporter (replaceable)" },
  { "tf.results.write", "tf.results.write(path, rows [, extra])", "writes rows with the run's environment as JSON" },
  { "tf.results.env", "tf.results.env()", "the environment of this run (device, commit, options, ...)" },
  { "tf.results.read", "tf.results.read(path [, opts])", "a results file's rows, and the whole document" },
  { "tf.results.command", "tf.results.command()", "the whole command line of this run, as a list" },
  { "tf.results.note_script", "tf.results.note_script()", "hashes the script's source now (tf.options does it)" },
  { "tf.plot.chart", "tf.plot.chart(rows, opts)", "one SVG chart: opts.y against opts.x, a line per series" },
  { "tf.plot.write", "tf.plot.write(path, charts [, opts])", "writes charts as an .svg or a self-contained .html" },
  { "tf.plot.sweep", "tf.plot.sweep(path, rows, opts)", "a chart per metric of a sweep, into an .svg or .html" },
  { "tf.plot.page", "tf.plot.page(charts [, opts])", "a self-contained HTML page of charts" },
  { "tf.plot.tick_text", "tf.plot.tick_text(v)", "a number as an axis shows it: 16384 -> 16k" },
  { "tf.plot.series_columns", "tf.plot.series_columns(rows, x, y [, ignore])", "the columns that tell a chart's lines apart" },
  { "tf.units.of", "tf.units.of(name)", "what a column measures: {kind, unit, better}" },
  { "tf.units.label", "tf.units.label(name)", "a column's axis label: fwd (ms), tokens/s, ..." },
  { "tf.units.add", "tf.units.add(pattern, spec)", "teaches tf.units a new column name" },
  { "tf.sha256", "tf.sha256(text)", "the SHA-256 of a string, as 64 hex digits" },
  { "tf.sha256_file", "tf.sha256_file(path)", "the SHA-256 of a file's bytes" },
  { "tf.options", "tf.options(spec [, args])", "declares a script's command-line options" },
  { "tf.safetensors.save", "tf.safetensors.save(path, tensors [, metadata])", "writes tensors as safetensors" },
  { "tf.safetensors.load", "tf.safetensors.load(path [, opts])", "reads a safetensors file: tensors, metadata" },
  { "tf.safetensors.read_header", "tf.safetensors.read_header(path)", "a safetensors file's names, dtypes, shapes, metadata" },
  { "tf.json.read", "tf.json.read(path)", "reads a JSON file into Lua tables" },
  { "tf.json.write", "tf.json.write(path, value [, opts])", "writes value as JSON (options as tf.json.encode)" },
  { "tf.json.encode", "tf.json.encode(value [, opts])", "JSON text (opts: indent, sort_keys, nan)" },
  { "tf.json.decode", "tf.json.decode(text)", "Lua values from JSON text" },
  { "tf.json.array", "tf.json.array([t])", "marks t to be written as a JSON array even when empty" },
  { "tf.help", "tf.help([x])", "this help: namespaces, or one function's signature" },
}

M.namespaces = {
  { "tf", "tensors, ops, devices (tf.zeros, tf.matmul, tf.attention, ...)" },
  { "tf.Tensor", "a tensor's methods (x:sum(), x:reshape(2, 3), ...) and fields (x.shape, x.grad, ...)" },
  { "tf.nn", "modules and functions for networks (Linear, Sequential, ...)" },
  { "tf.nn.Module", "what every module has: parameters, state_dict, zero_grad, ..." },
  { "tf.optim", "optimizers (AdamW, SGD)" },
  { "tf.amp", "mixed-precision helpers (GradScaler)" },
  { "tf.model", "the Transformer LM (new, load)" },
  { "tf.dist", "several processes: ranks and collectives (all_reduce, broadcast, ...)" },
  { "tf.mem", "the caching allocator: stats, snapshots, history, timelines" },
  { "tf.cuda", "GPUs: presence, count, the GEMMs' tuning, kernel traffic" },
  { "tf.prof", "ranges and the kernel profiler" },
  { "tf.bench", "timing" },
  { "tf.report", "tables" },
  { "tf.results", "results files with their environment and provenance" },
  { "tf.plot", "SVG and HTML plots of result rows" },
  { "tf.units", "what a results column measures: unit, kind, which way is better" },
  { "tf.safetensors", "safetensors files" },
  { "tf.json", "JSON" },
}

-- A tensor's fields, read through its __index (only grad can be assigned):
-- name, summary. The REPL's Tab offers them after "x.".
M.tensor_fields = {
  { "shape", "the sizes of the dims, a table that prints as (2, 3)" },
  { "dtype", "the element type: f32, f16, bf16, f64, i32, i64, bool" },
  { "device", "where the elements are: cpu or cuda:N" },
  { "ndim", "the number of dims" },
  { "nbytes", "the bytes of the elements" },
  { "is_contiguous", "whether the elements are dense, in row-major order" },
  { "grad", "the gradient backward accumulated (nil before it); assignable" },
  { "grad_fn", "the name of the op that made x (nil for a leaf)" },
  { "is_leaf", "whether x was made by no recorded op" },
}

local by_name = {}
for _, e in ipairs(M.entries) do by_name[e[1]] = e end

-- The value at a dotted name ("tf.nn.Linear") from the globals, or nil.
function M.resolve(name)
  local v = _G
  for part in name:gmatch("[^.]+") do
    if type(v) ~= "table" and getmetatable(v) == nil then return nil end
    local ok, nv = pcall(function() return v[part] end)
    if not ok then return nil end
    v = nv
  end
  return v
end

local function is_tensor(v) return type(v) == "userdata" and tf and tf.is_tensor(v) end

-- The names of values: entries first, then namespaces, then every table
-- reached from tf (so help(tf.report.formats) can list it).
local function names_by_value()
  local names = {}
  local function name(v, n)
    if v ~= nil and names[v] == nil then names[v] = n end
  end
  for _, e in ipairs(M.entries) do name(M.resolve(e[1]), e[1]) end
  for _, n in ipairs(M.namespaces) do name(M.resolve(n[1]), n[1]) end
  local walked = {}
  local function walk(t, prefix)
    walked[t] = true
    for k, v in pairs(t) do
      if type(k) == "string" and k:sub(1, 1) ~= "_" and type(v) == "table" and not walked[v] then
        name(v, prefix .. "." .. k)
        walk(v, prefix .. "." .. k)
      end
    end
  end
  if type(rawget(_G, "tf")) == "table" then walk(tf, "tf") end
  return names
end

-- "tf.sum(x [, dim])" -> "x:sum([dim])": an op's form as a tensor method.
local function method_form(sig)
  local op, first, rest = sig:match("^tf%.([%w_]+)%(([%w_]+)(.*)$")
  if not op then return nil end
  if rest:sub(1, 2) == ", " then
    rest = rest:sub(3)
  elseif rest:sub(1, 4) == " [, " then
    rest = "[" .. rest:sub(5)
  end
  return first .. ":" .. op .. "(" .. rest
end

local function show_entry(e)
  local text = e[2] .. "\n  " .. e[3]
  local op = e[1]:match("^tf%.([%w_]+)$")
  local methods = tf and tf.Tensor
  if op and methods and rawget(methods, op) ~= nil and rawget(methods, op) == M.resolve(e[1]) then
    text = text .. "\n  also a tensor method: " .. method_form(e[2])
  end
  return text
end

-- Words joined into lines of at most width characters, each indented.
local function wrap(words, indent, width)
  local lines, line = {}, indent
  for _, w in ipairs(words) do
    if #line > #indent and #line + 1 + #w > width then
      lines[#lines + 1] = line
      line = indent
    end
    line = line .. (#line > #indent and " " or "") .. w
  end
  if #line > #indent then lines[#lines + 1] = line end
  return table.concat(lines, "\n")
end

-- What a tensor offers: its own methods, the ops that are methods too, its fields.
local function show_tensor()
  local lines = { "tf.Tensor (x below is a tensor):" }
  for _, e in ipairs(M.entries) do
    if e[1]:match("^tf%.Tensor%.") then lines[#lines + 1] = string.format("  %-42s %s", e[2], e[3]) end
  end
  local ops = {}
  for k, v in pairs(tf.Tensor) do
    if type(k) == "string" and rawget(tf, k) == v then ops[#ops + 1] = k end
  end
  table.sort(ops)
  lines[#lines + 1] = "ops, also methods (x:sum(), a:matmul(b); help(tf.sum) for one):"
  lines[#lines + 1] = wrap(ops, "  ", 100)
  lines[#lines + 1] = "fields:"
  for _, f in ipairs(M.tensor_fields) do lines[#lines + 1] = string.format("  %-42s %s", "x." .. f[1], f[2]) end
  return table.concat(lines, "\n")
end

-- The entries under a table's name, and the tables in it.
local function show_namespace(ns, t)
  if ns == "tf.Tensor" then return show_tensor() end
  local lines = { ns .. ":" }
  for _, e in ipairs(M.entries) do
    local prefix = e[1]:match("^(.*)%.[^.]+$")
    if prefix == ns then lines[#lines + 1] = string.format("  %-42s %s", e[2], e[3]) end
  end
  local inner = {}
  for k, v in pairs(t) do
    if type(k) == "string" and k:sub(1, 1) ~= "_" and type(v) == "table" and not by_name[ns .. "." .. k] then
      inner[#inner + 1] = ns .. "." .. k
    end
  end
  table.sort(inner)
  for _, n in ipairs(inner) do lines[#lines + 1] = string.format("  %-42s %s", n, "(a table: help(" .. n .. "))") end
  return table.concat(lines, "\n")
end

--- The help text for x (nil: the overview), or nil and why. x is a value
--- (a function, a table, a tensor: help(x.sum), help(tf.nn)) or its name.
function M.text(x)
  if x == nil then
    local lines = { "tfhost " .. (tf and tf.version or "") .. ": help(name or function) for one entry, e.g. help(tf.matmul);",
      "docs/api.md is the full reference. Namespaces:" }
    for _, n in ipairs(M.namespaces) do lines[#lines + 1] = string.format("  %-16s %s", n[1], n[2]) end
    return table.concat(lines, "\n")
  end
  local why = "no help for " .. (type(x) == "string" and ("'" .. x .. "'") or tostring(x)) ..
    " (help() lists the namespaces; docs/api.md has everything)"
  if type(x) == "string" and by_name[x] then return show_entry(by_name[x]) end
  local v = x
  if type(x) == "string" then v = M.resolve(x) end
  if is_tensor(v) then return show_tensor() end
  if v == nil then return nil, why end
  local names = names_by_value()
  local name = names[v]
  if not name and type(v) == "table" and getmetatable(v) ~= nil then
    name = names[getmetatable(v)] -- a module's class: help(model) is help(tf.nn.Linear)
  end
  if name and by_name[name] then return show_entry(by_name[name]) end
  if name and type(v) == "table" then return show_namespace(name, v) end
  return nil, why
end

-- The names a value offers after "." (every field) or ":" (its methods):
-- a table's string keys and its metatable's __index table's, a tensor's
-- methods and (after ".") its fields.
local function fields(v, methods_only)
  local out, seen = {}, {}
  local function add(k, x)
    if type(k) == "string" and k:match("^[%a_][%w_]*$") and not seen[k]
        and (not methods_only or type(x) == "function") then
      seen[k] = true
      out[#out + 1] = k
    end
  end
  local function add_all(t)
    if type(t) ~= "table" then return end
    for k, x in pairs(t) do add(k, x) end
  end
  if type(v) == "table" then add_all(v) end
  if is_tensor(v) then
    add_all(tf.Tensor)
    if not methods_only then
      for _, f in ipairs(M.tensor_fields) do add(f[1], true) end
    end
  end
  local mt = getmetatable(v)
  if type(mt) == "table" and type(rawget(mt, "__index")) == "table" then add_all(mt.__index) end
  return out
end

--- complete(text): the completions of a partial name, sorted: globals,
--- "tf.ma" -> "tf.matmul", "tf.max", ..., "x:su" -> "x:sum", ..., "w.gr" ->
--- "w.grad", "w.grad_fn" (the REPL's Tab).
function M.complete(text)
  local head, sep, partial = text:match("^(.*)([.:])([%w_]*)$")
  local candidates
  if head then
    if not head:match("^[%a_][%w_.]*$") then return {} end
    local v = M.resolve(head)
    if v == nil then return {} end
    candidates = fields(v, sep == ":")
  else
    head, sep, partial = "", "", text
    candidates = fields(_G)
  end
  local out = {}
  for _, k in ipairs(candidates) do
    if k:sub(1, #partial) == partial then out[#out + 1] = head .. sep .. k end
  end
  table.sort(out)
  return out
end

--- help([x]): prints the help text (or why there is none).
function M.help(x)
  local text, why = M.text(x)
  print(text or why)
end

return M
