/* cuBLAS is opened on the first use of a GPU (kernels/cuda/cublas_load.cu),
 * not at start: a process that never touches a GPU does not map it (its
 * start-up code costs ~60 ms). Checked without a GPU: nothing of cuBLAS is
 * mapped at start; tf_cublas_load finds every function the backend calls in
 * the toolkit's libraries (a name that is not there fails here, not on the
 * first GPU run); after it, libcublas and libcublasLt are mapped, a call
 * through the table reaches cuBLAS (its name for a status), and a second
 * call returns the first one's outcome. Exits 77 in a CPU-only build or
 * where /proc/self/maps cannot be read. */
#include <stdio.h>
#include <string.h>

#include "check.h"
#include "status.h"

#ifdef TF_WITH_CUDA
#include <cublas_api.h>

#include "cuda_backend.h"

/* Whether a file whose path holds `name` is mapped into this process. */
static bool tf_mapped(const char *name) {
  FILE *f = fopen("/proc/self/maps", "r");
  if (!f) tf_check_skip("/proc/self/maps cannot be read");
  char line[1024];
  bool found = false;
  while (!found && fgets(line, sizeof line, f)) found = strstr(line, name) != NULL;
  fclose(f);
  return found;
}

int main(void) {
  CHECK(!tf_mapped("libcublas"));
  CHECK(strcmp(tf_cublas_status(CUBLAS_STATUS_ALLOC_FAILED), "cuBLAS status 3") == 0);
  tf_status s = tf_cublas_load();
  if (!CHECK_OK(s)) printf("tf_cublas_load: %s\n", tf_last_error());
  CHECK(tf_mapped("libcublas.so"));
  CHECK(tf_mapped("libcublasLt.so"));
  const char *name = tf_cublas_status(CUBLAS_STATUS_ALLOC_FAILED);
  CHECK(name[0] && strcmp(name, "cuBLAS status 3") != 0);
  printf("cuBLAS's name for status 3: %s\n", name);
  CHECK_OK(tf_cublas_load());
  return tf_check_done();
}
#else
int main(void) {
  tf_check_skip("built without the CUDA backend");
  return 77;
}
#endif
