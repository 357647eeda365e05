/* libFuzzer harness: the safetensors reader on any bytes. The file is read
 * header-only and onto the CPU; each read must succeed with entries that lie
 * inside the data, or fail with a message that names the file. */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "backends.h"
#include "safetensors.h"
#include "status.h"

static void tf_fuzz_fail(const char *what, const char *detail) {
  fprintf(stderr, "fuzz: %s: %s\n", what, detail ? detail : "(no message)");
  abort();
}

/* One read; checks what it returns against the file's size. */
static void tf_fuzz_read(const char *path, size_t size, int with_data) {
  tf_safetensors_file *f = NULL;
  tf_status st = with_data ? tf_safetensors_read(path, tf_cpu(), &f) : tf_safetensors_read_header(path, &f);
  if (st != TF_OK) {
    if (f) tf_fuzz_fail("failed read", "returned a file");
    if (!strstr(tf_last_error(), path)) tf_fuzz_fail("message does not name the file", tf_last_error());
    return;
  }
  for (int i = 0; i < f->ntensors; i++) {
    const tf_safetensors_entry *e = &f->tensors[i];
    if (e->begin > e->end || e->end > size) tf_fuzz_fail("entry", "byte range past the file");
    if (with_data && !e->tensor) tf_fuzz_fail("entry", "no tensor after a full read");
  }
  tf_safetensors_free(f);
}

int LLVMFuzzerTestOneInput(const unsigned char *data, size_t size) {
  static int fd = -1;
  static char path[64];
  if (fd < 0) {
    tf_backends_init();
    fd = memfd_create("fuzz.safetensors", 0);
    if (fd < 0) tf_fuzz_fail("memfd_create", "failed");
    snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
  }
  if (ftruncate(fd, 0) != 0 || pwrite(fd, data, size, 0) != (ssize_t)size) tf_fuzz_fail("write", path);
  tf_fuzz_read(path, size, 0);
  tf_fuzz_read(path, size, 1);
  return 0;
}
