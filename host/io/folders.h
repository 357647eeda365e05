/* A folder's entries, for scripts that walk a tree of files (Lua's own
 * library cannot list a folder). */
#ifndef TF_FOLDERS_H
#define TF_FOLDERS_H

#include <stdbool.h>

#include "status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct tf_folder_entry {
  char *name;
  bool is_folder; /* a link counts as what it names; a broken link is a file */
} tf_folder_entry;

typedef struct tf_folder {
  int n;
  tf_folder_entry *entries; /* but "." and "..", in the order the system gives */
} tf_folder;

tf_status tf_folder_read(const char *path, tf_folder **out);
void tf_folder_free(tf_folder *f); /* NULL is fine */

#ifdef __cplusplus
}
#endif
#endif
