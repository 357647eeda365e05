/* Runs a fuzzing harness over the files of its corpus folders once, without
 * libFuzzer: every seed and every past finding is a regression test in each
 * ctest build (the ASan+UBSan one included). The harness aborts on a
 * failure; this prints how many inputs passed. */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const unsigned char *data, size_t size);

/* The whole file in a malloc'd buffer of exactly its size (ASan sees reads past it). */
static unsigned char *tf_read_all(const char *path, size_t *size) {
  FILE *f = fopen(path, "rb");
  if (!f) return NULL;
  unsigned char *buf = NULL;
  size_t n = 0, cap = 0;
  for (;;) {
    if (n == cap && !(buf = realloc(buf, cap = cap * 2 + 4096))) break;
    size_t got = fread(buf + n, 1, cap - n, f);
    if (got == 0) break;
    n += got;
  }
  fclose(f);
  unsigned char *exact = buf ? malloc(n ? n : 1) : NULL;
  if (exact) memcpy(exact, buf, n);
  free(buf);
  *size = n;
  return exact;
}

int main(int argc, char **argv) {
  int count = 0;
  for (int i = 1; i < argc; i++) {
    DIR *d = opendir(argv[i]);
    if (!d) {
      fprintf(stderr, "replay: cannot open %s\n", argv[i]);
      return 1;
    }
    for (struct dirent *e; (e = readdir(d));) {
      if (e->d_name[0] == '.') continue;
      char path[4096];
      snprintf(path, sizeof path, "%s/%s", argv[i], e->d_name);
      size_t size;
      unsigned char *data = tf_read_all(path, &size);
      if (!data) {
        fprintf(stderr, "replay: cannot read %s\n", path);
        return 1;
      }
      LLVMFuzzerTestOneInput(data, size);
      free(data);
      count++;
    }
    closedir(d);
  }
  printf("replay: %d inputs, no failure\n", count);
  return count > 0 ? 0 : 1;
}
