/* CUDA graphs for the Transformer engine (model_kernels.h): a phase of a
 * training step is captured from the device's stream once and replayed
 * with one launch, which saves the per-kernel launch cost of small shapes.
 *
 * Capture runs in thread-local mode: a call on this thread that cannot be
 * recorded (cudaMalloc, a synchronize, a copy to pageable host memory)
 * returns an error and spoils the capture instead of running, so a phase
 * that is not capturable fails here and the engine runs it eagerly. */
#include "cuda_common.cuh"

#include <stdio.h>
#include <stdlib.h>

struct tf_graph {
  cudaGraphExec_t exec;
};

tf_status tf_cuda_capture_begin(tf_device_ctx *ctx) {
  TF_TRY(tf_cuda_use_device(ctx));
  TF_CUDA_CHECK(cudaStreamBeginCapture(tf_cuda_state_of(ctx)->stream, cudaStreamCaptureModeThreadLocal));
  tf_cuda_traffic_hold();
  return TF_OK;
}

/* Ends the capture whatever happened during it (a spoiled capture ends
 * with an error and no graph), then instantiates; the device is the one
 * capture_begin made current. The errors are reported through
 * tf_cuda_error, which also clears them, so the stream and the runtime's
 * error state are clean for the eager run that follows. */
tf_status tf_cuda_capture_end(tf_device_ctx *ctx, tf_graph **out) {
  *out = NULL;
  cudaGraph_t graph = NULL;
  cudaError_t err = cudaStreamEndCapture(tf_cuda_state_of(ctx)->stream, &graph);
  if (err != cudaSuccess) {
    if (graph) tf_cuda_report(cudaGraphDestroy(graph), "cudaGraphDestroy");
    tf_cuda_traffic_restore();
    return tf_cuda_error(err, "cudaStreamEndCapture");
  }
  cudaGraphExec_t exec = NULL;
  /* Each kernel keeps the priority of the stream it was captured from: the
   * optimizer's kernels on the low-priority side stream then yield the SMs
   * to the backward pass's as they do eagerly. Without the flag every node
   * runs at the priority of the stream the graph is launched into, and an
   * AdamW grid queued first held every SM until it was done: the
   * optimizer hardly overlapped the backward pass at all. */
  err = cudaGraphInstantiate(&exec, graph, cudaGraphInstantiateFlagUseNodePriority);
  tf_cuda_report(cudaGraphDestroy(graph), "cudaGraphDestroy"); /* the instance keeps what it needs */
  if (err != cudaSuccess) {
    tf_cuda_traffic_restore();
    return tf_cuda_error(err, "cudaGraphInstantiate");
  }
  tf_graph *g = (tf_graph *)malloc(sizeof *g);
  if (!g) {
    tf_cuda_report(cudaGraphExecDestroy(exec), "cudaGraphExecDestroy");
    tf_cuda_traffic_restore();
    return tf_fail(TF_ERR_OOM, "out of memory: no host memory for a CUDA graph");
  }
  g->exec = exec;
  *out = g;
  return TF_OK;
}

tf_status tf_cuda_graph_launch(tf_device_ctx *ctx, tf_graph *g) {
  TF_TRY(tf_cuda_use_device(ctx));
  TF_CUDA_CHECK(cudaGraphLaunch(g->exec, tf_cuda_state_of(ctx)->stream));
  return TF_OK;
}

/* A replay still running completes first: the driver frees it afterwards. */
void tf_cuda_graph_destroy(tf_device_ctx *ctx, tf_graph *g) {
  if (!g) return;
  if (tf_cuda_use_device(ctx) != TF_OK) fprintf(stderr, "tfhost: %s\n", tf_last_error());
  tf_cuda_report(cudaGraphExecDestroy(g->exec), "cudaGraphExecDestroy");
  free(g);
}

/* ---- the side stream ---------------------------------------------------------------------- */

/* Made outside any capture (adamw_constants calls this before the phase). */
tf_status tf_cuda_side_ready(tf_cuda_state *st) {
  if (st->side) return TF_OK;
  TF_CUDA_CHECK(cudaEventCreateWithFlags(&st->fork, cudaEventDisableTiming));
  TF_CUDA_CHECK(cudaEventCreateWithFlags(&st->join, cudaEventDisableTiming));
  for (int i = 0; i < TF_SIDE_MARKS; i++) TF_CUDA_CHECK(cudaEventCreateWithFlags(&st->marks[i], cudaEventDisableTiming));
  int least = 0, greatest = 0;
  TF_CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&least, &greatest));
  TF_CUDA_CHECK(cudaStreamCreateWithPriority(&st->side, cudaStreamNonBlocking, least));
  return TF_OK;
}

void tf_cuda_side_release(tf_cuda_state *st) {
  if (st->side) tf_cuda_report(cudaStreamDestroy(st->side), "cudaStreamDestroy");
  if (st->fork) tf_cuda_report(cudaEventDestroy(st->fork), "cudaEventDestroy");
  if (st->join) tf_cuda_report(cudaEventDestroy(st->join), "cudaEventDestroy");
  for (int i = 0; i < TF_SIDE_MARKS; i++) {
    if (st->marks[i]) tf_cuda_report(cudaEventDestroy(st->marks[i]), "cudaEventDestroy");
    st->marks[i] = NULL;
  }
  st->side = NULL;
  st->fork = st->join = NULL;
}

/* The side stream waits for the main one's work so far; launches go to it. */
tf_status tf_cuda_side_enter(tf_device_ctx *ctx) {
  TF_TRY(tf_cuda_use_device(ctx));
  tf_cuda_state *st = tf_cuda_state_of(ctx);
  if (!st->side) return tf_fail(TF_ERR_STATE, "side stream used before adamw_constants made it");
  if (st->main_stream) return tf_fail(TF_ERR_STATE, "side_enter inside side_enter");
  TF_CUDA_CHECK(cudaEventRecord(st->fork, st->stream));
  TF_CUDA_CHECK(cudaStreamWaitEvent(st->side, st->fork, 0));
  st->main_stream = st->stream;
  st->stream = st->side;
  return TF_OK;
}

tf_status tf_cuda_side_leave(tf_device_ctx *ctx) {
  tf_cuda_state *st = tf_cuda_state_of(ctx);
  if (st->main_stream) st->stream = st->main_stream;
  st->main_stream = NULL;
  return TF_OK;
}

/* A kernel that does nothing, queued on the main stream right after it
 * waits for the side stream, so that the next kernel's only predecessor
 * is one of ours. Some of cuBLASLt's Hopper kernels are launched so that
 * they may start before the kernel queued ahead of them ends (programmatic
 * dependent launch). Eagerly, a stream's wait for an event holds them
 * back; captured into a graph, the wait becomes an edge from the side
 * stream's last kernel, and what the runs below show fits a product that
 * starts writing its ring slot while AdamW still reads the slot's previous
 * gradient. With the GEMMs' timed choice on (other algorithms than the
 * heuristic's first), tests/lua/test_model_long_run.lua's overlapped step
 * parted from the serial one, with graphs only and with the chosen
 * algorithms only; with this kernel after each wait it does not (the runs:
 * docs/performance.md, "an ordering fault in the overlapped step's
 * graph"). The heuristic's first algorithms never showed it, but nothing
 * promises that they never will. */
__global__ void tf_cuda_order_kernel(void) {}

static tf_status tf_cuda_order_after_wait(tf_cuda_state *st) {
  tf_cuda_order_kernel<<<1, 32, 0, st->stream>>>();
  return tf_cuda_launched("order kernel after a wait for the side stream");
}

/* The main stream waits for everything queued on the side one. */
tf_status tf_cuda_side_join(tf_device_ctx *ctx) {
  TF_TRY(tf_cuda_use_device(ctx));
  tf_cuda_state *st = tf_cuda_state_of(ctx);
  if (!st->side) return TF_OK;
  TF_CUDA_CHECK(cudaEventRecord(st->join, st->side));
  TF_CUDA_CHECK(cudaStreamWaitEvent(st->stream, st->join, 0));
  return tf_cuda_order_after_wait(st);
}

tf_status tf_cuda_side_mark(tf_device_ctx *ctx, int i) {
  TF_TRY(tf_cuda_use_device(ctx));
  tf_cuda_state *st = tf_cuda_state_of(ctx);
  if (!st->side || i < 0 || i >= TF_SIDE_MARKS) return tf_fail(TF_ERR_STATE, "side_mark %d without a side stream", i);
  TF_CUDA_CHECK(cudaEventRecord(st->marks[i], st->side));
  return TF_OK;
}

tf_status tf_cuda_main_wait(tf_device_ctx *ctx, int i) {
  TF_TRY(tf_cuda_use_device(ctx));
  tf_cuda_state *st = tf_cuda_state_of(ctx);
  if (!st->side || i < 0 || i >= TF_SIDE_MARKS) return tf_fail(TF_ERR_STATE, "main_wait %d without a side stream", i);
  TF_CUDA_CHECK(cudaStreamWaitEvent(st->stream, st->marks[i], 0));
  return tf_cuda_order_after_wait(st);
}
