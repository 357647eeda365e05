#include "intern.h"

#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

/* Strings by id, and an open-addressing table of id + 1 (0: empty slot),
 * its size a power of two at least twice the count. */
static struct {
  pthread_mutex_t lock;
  char **strings;
  uint32_t count, cap;
  uint32_t *slots;
  uint32_t nslots;
} tf_interned = {.lock = PTHREAD_MUTEX_INITIALIZER};

static uint32_t tf_hash(const char *s) {
  uint32_t h = 2166136261u; /* FNV-1a */
  for (; *s; s++) h = (h ^ (unsigned char)*s) * 16777619u;
  return h;
}

static bool tf_intern_grow(void) {
  uint32_t nslots = tf_interned.nslots ? tf_interned.nslots * 2 : 1024;
  uint32_t *slots = calloc(nslots, sizeof *slots);
  if (!slots) return false;
  for (uint32_t id = 0; id < tf_interned.count; id++) {
    uint32_t i = tf_hash(tf_interned.strings[id]) & (nslots - 1);
    while (slots[i]) i = (i + 1) & (nslots - 1);
    slots[i] = id + 1;
  }
  free(tf_interned.slots);
  tf_interned.slots = slots;
  tf_interned.nslots = nslots;
  return true;
}

/* The table holds "" as id 0 from the first call on. */
static bool tf_intern_ready(void) {
  if (tf_interned.count) return true;
  tf_interned.strings = malloc(64 * sizeof *tf_interned.strings);
  if (!tf_interned.strings || !(tf_interned.strings[0] = calloc(1, 1))) return false;
  tf_interned.cap = 64;
  if (!tf_intern_grow()) return false;
  tf_interned.count = 1;
  tf_interned.slots[tf_hash("") & (tf_interned.nslots - 1)] = 1;
  return true;
}

/* Under the lock: the id of s, adding it when new; false when out of memory. */
static bool tf_intern_locked(const char *s, uint32_t *id) {
  if (!tf_intern_ready()) return false;
  if (2 * (tf_interned.count + 1) > tf_interned.nslots && !tf_intern_grow()) return false;
  uint32_t mask = tf_interned.nslots - 1, i = tf_hash(s) & mask;
  for (; tf_interned.slots[i]; i = (i + 1) & mask) {
    if (strcmp(tf_interned.strings[tf_interned.slots[i] - 1], s) == 0) {
      *id = tf_interned.slots[i] - 1;
      return true;
    }
  }
  if (tf_interned.count == tf_interned.cap) {
    char **grown = realloc(tf_interned.strings, 2 * (size_t)tf_interned.cap * sizeof *grown);
    if (!grown) return false;
    tf_interned.strings = grown;
    tf_interned.cap *= 2;
  }
  size_t n = strlen(s) + 1;
  char *copy = malloc(n);
  if (!copy) return false;
  memcpy(copy, s, n);
  *id = tf_interned.count++;
  tf_interned.strings[*id] = copy;
  tf_interned.slots[i] = *id + 1;
  return true;
}

uint32_t tf_intern_id(const char *s) {
  if (!s || !*s) return 0;
  uint32_t id = 0;
  pthread_mutex_lock(&tf_interned.lock);
  if (!tf_intern_locked(s, &id)) id = 0;
  pthread_mutex_unlock(&tf_interned.lock);
  return id;
}

const char *tf_intern_string(uint32_t id) {
  pthread_mutex_lock(&tf_interned.lock);
  const char *s = id < tf_interned.count ? tf_interned.strings[id] : "";
  pthread_mutex_unlock(&tf_interned.lock);
  return s;
}

const char *tf_intern(const char *s) {
  uint32_t id;
  const char *out = NULL;
  pthread_mutex_lock(&tf_interned.lock);
  if (tf_intern_locked(s, &id)) out = tf_interned.strings[id];
  pthread_mutex_unlock(&tf_interned.lock);
  return out;
}
