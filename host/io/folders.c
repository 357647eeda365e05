/* Listing a folder (folders.h), with POSIX's dirent. */
#define _GNU_SOURCE
#include "folders.h"

#include <dirent.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

void tf_folder_free(tf_folder *f) {
  if (!f) return;
  for (int i = 0; i < f->n; i++) free(f->entries[i].name);
  free(f->entries);
  free(f);
}

tf_status tf_folder_read(const char *path, tf_folder **out) {
  *out = NULL;
  DIR *dir = opendir(path);
  if (!dir) return tf_fail(TF_ERR_IO, "%s: %s", path, strerror(errno));
  tf_folder *f = calloc(1, sizeof *f);
  int cap = 0;
  tf_status st = f ? TF_OK : tf_fail(TF_ERR_OOM, "out of memory: listing %s", path);
  struct dirent *e;
  while (st == TF_OK && (e = readdir(dir)) != NULL) {
    if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0) continue;
    if (f->n == cap) {
      int grown = cap ? 2 * cap : 64;
      tf_folder_entry *more = realloc(f->entries, sizeof *more * (size_t)grown);
      if (!more) {
        st = tf_fail(TF_ERR_OOM, "out of memory: listing %s", path);
        break;
      }
      f->entries = more;
      cap = grown;
    }
    struct stat sb;
    tf_folder_entry *entry = &f->entries[f->n];
    entry->is_folder = fstatat(dirfd(dir), e->d_name, &sb, 0) == 0 && S_ISDIR(sb.st_mode);
    if (!(entry->name = strdup(e->d_name))) st = tf_fail(TF_ERR_OOM, "out of memory: listing %s", path);
    else f->n++;
  }
  closedir(dir);
  if (st != TF_OK) {
    tf_folder_free(f);
    return st;
  }
  *out = f;
  return TF_OK;
}
