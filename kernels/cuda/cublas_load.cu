/* cuBLAS and cuBLASLt opened at run time (dlopen) on the first use of a GPU.
 * Linked the usual way, their start-up code runs in every process before
 * main, on a machine without a GPU too, paid by every short script, the
 * REPL's start and each of the test suite's thousand runs of tfhost.
 * Opened here, only a process that uses a GPU pays.
 *
 * libcublas is looked for as the dynamic loader looks for a linked library
 * (LD_LIBRARY_PATH, the binary's run path: the bundle's folder, the
 * system's folders), then by its full path in the toolkit's folder found at
 * build time and in /usr/local/cuda/lib64; it brings libcublasLt, and the
 * Lt functions are found through it. */
#include "cuda_common.cuh"
#include "cuda_backend.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

/* libcublas.so.<major>: the version of the headers this file was compiled with */
#define TF_CUBLAS_NUMBER(n) #n
#define TF_CUBLAS_SONAME_OF(n) "libcublas.so." TF_CUBLAS_NUMBER(n)
#define TF_CUBLAS_SONAME TF_CUBLAS_SONAME_OF(CUBLAS_VER_MAJOR)

tf_cublas_api tf_cublas;

static pthread_once_t tf_cublas_once = PTHREAD_ONCE_INIT;
static char tf_cublas_failure[768]; /* empty once every function was found */

/* libcublas by its soname, else from the toolkit's folder found at build time, else from the
 * usual toolkit folder; NULL with the reason in tf_cublas_failure. */
static void *tf_cublas_open(void) {
  static const char *const where[] = {TF_CUBLAS_SONAME, TF_CUDA_LIBDIR "/" TF_CUBLAS_SONAME,
                                      "/usr/local/cuda/lib64/" TF_CUBLAS_SONAME};
  char first[384] = "";
  for (size_t i = 0; i < sizeof where / sizeof where[0]; i++) {
    void *lib = dlopen(where[i], RTLD_NOW | RTLD_LOCAL);
    if (lib) return lib;
    if (i == 0) snprintf(first, sizeof first, "%s", dlerror());
  }
  snprintf(tf_cublas_failure, sizeof tf_cublas_failure,
           "the CUDA backend could not load cuBLAS (%s; not in " TF_CUDA_LIBDIR " or /usr/local/cuda/lib64 "
           "either): install the CUDA Toolkit's cuBLAS %d, or name its folder in LD_LIBRARY_PATH",
           first, CUBLAS_VER_MAJOR);
  return NULL;
}

static void tf_cublas_open_all(void) {
  void *lib = tf_cublas_open();
  if (!lib) return;
#define TF_CUBLAS_FIND(name)                                                                                  \
  tf_cublas.name = (decltype(tf_cublas.name))dlsym(lib, #name);                                              \
  if (!tf_cublas.name && !tf_cublas_failure[0])                                                              \
    snprintf(tf_cublas_failure, sizeof tf_cublas_failure,                                                    \
             "the CUDA backend found no %s in " TF_CUBLAS_SONAME ": it is not the cuBLAS tfhost was built with " \
             "(%d.%d)", #name, CUBLAS_VER_MAJOR, CUBLAS_VER_MINOR);
  TF_CUBLAS_FUNCTIONS(TF_CUBLAS_FIND)
  TF_CUBLAS_FIND(cublasGemmStridedBatchedEx)
#undef TF_CUBLAS_FIND
  /* half a table is no table (the library stays open: dlclose gains nothing here) */
  if (tf_cublas_failure[0]) memset(&tf_cublas, 0, sizeof tf_cublas);
}

tf_status tf_cublas_load(void) {
  pthread_once(&tf_cublas_once, tf_cublas_open_all);
  if (tf_cublas_failure[0]) return tf_fail(TF_ERR_BACKEND, "%s", tf_cublas_failure);
  return TF_OK;
}
