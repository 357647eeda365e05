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
    return tf_cuda_error(err, "cudaStreamEndCapture");
  }
  cudaGraphExec_t exec = NULL;
  err = cudaGraphInstantiate(&exec, graph, 0);
  tf_cuda_report(cudaGraphDestroy(graph), "cudaGraphDestroy"); /* the instance keeps what it needs */
  if (err != cudaSuccess) return tf_cuda_error(err, "cudaGraphInstantiate");
  tf_graph *g = (tf_graph *)malloc(sizeof *g);
  if (!g) {
    tf_cuda_report(cudaGraphExecDestroy(exec), "cudaGraphExecDestroy");
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
