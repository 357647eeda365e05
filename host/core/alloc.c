#include "alloc.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum {
  TF_MIN_BLOCK = 512,                   /* every size rounds up to this */
  TF_SMALL_SIZE = 1 << 20,              /* largest request served by the small pool */
  TF_SMALL_SEGMENT = 2 << 20,           /* small-pool segment size */
  TF_LARGE_SEGMENT = 20 << 20,          /* large-pool segment for requests < 10 MiB */
  TF_MIN_LARGE_ALLOC = 10 << 20,
  TF_ROUND_LARGE = 2 << 20              /* larger requests get their own 2 MiB multiple */
};

struct tf_segment {
  void *ptr;
  size_t size;
  bool small;
  tf_block *first;
  tf_segment *prev, *next;
};

static tf_reclaim_fn tf_reclaim_hook;
static void *tf_reclaim_ud;

void tf_alloc_set_reclaim_hook(tf_reclaim_fn fn, void *ud) {
  tf_reclaim_hook = fn;
  tf_reclaim_ud = ud;
}

size_t tf_alloc_round(size_t bytes) {
  if (bytes < TF_MIN_BLOCK) return TF_MIN_BLOCK;
  return (bytes + TF_MIN_BLOCK - 1) / TF_MIN_BLOCK * TF_MIN_BLOCK;
}

size_t tf_alloc_segment_size(size_t rounded) {
  if (rounded <= TF_SMALL_SIZE) return TF_SMALL_SEGMENT;
  if (rounded < TF_MIN_LARGE_ALLOC) return TF_LARGE_SEGMENT;
  return (rounded + TF_ROUND_LARGE - 1) / TF_ROUND_LARGE * TF_ROUND_LARGE;
}

const char *tf_format_bytes(size_t bytes, char *buf, size_t n) {
  static const char *units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = (double)bytes;
  int u = 0;
  while (v >= 1024.0 && u < 4) {
    v /= 1024.0;
    u++;
  }
  if (u == 0)
    snprintf(buf, n, "%zu B", bytes);
  else
    snprintf(buf, n, "%.2f %s", v, units[u]);
  return buf;
}

void tf_alloc_init(tf_allocator *a, const char *device_name, tf_alloc_backend raw) {
  *a = (tf_allocator){0};
  a->device_name = device_name;
  a->raw = raw;
}

static tf_pool *tf_pool_of(tf_allocator *a, const tf_segment *s) { return s->small ? &a->small : &a->large; }

static bool tf_block_before(const tf_block *x, const tf_block *y) {
  return x->size < y->size || (x->size == y->size && (uintptr_t)x->ptr < (uintptr_t)y->ptr);
}

static void tf_free_list_insert(tf_pool *p, tf_block *b) {
  tf_block **link = &p->free_head, *prev = NULL;
  while (*link && tf_block_before(*link, b)) {
    prev = *link;
    link = &(*link)->free_next;
  }
  b->free_next = *link;
  b->free_prev = prev;
  if (*link) (*link)->free_prev = b;
  *link = b;
}

static void tf_free_list_remove(tf_pool *p, tf_block *b) {
  if (b->free_prev)
    b->free_prev->free_next = b->free_next;
  else
    p->free_head = b->free_next;
  if (b->free_next) b->free_next->free_prev = b->free_prev;
  b->free_prev = b->free_next = NULL;
}

/* Smallest free block that fits (best fit; ties go to the lowest address). */
static tf_block *tf_find_free(tf_pool *p, size_t size) {
  for (tf_block *b = p->free_head; b; b = b->free_next)
    if (b->size >= size) return b;
  return NULL;
}

static void tf_note_peaks(tf_alloc_stats *s) {
  if (s->allocated > s->peak_allocated) s->peak_allocated = s->allocated;
  if (s->reserved > s->peak_reserved) s->peak_reserved = s->reserved;
}

/* Obtains a segment big enough for `size` and returns its single free block
 * (already in the free list). */
static tf_status tf_new_segment(tf_allocator *a, size_t size, tf_block **out) {
  size_t seg_size = tf_alloc_segment_size(size);
  if (a->limit && a->stats.reserved + seg_size > a->limit)
    return tf_fail(TF_ERR_OOM, "out of memory: the memory limit is reached");
  tf_segment *s = calloc(1, sizeof *s);
  tf_block *b = calloc(1, sizeof *b);
  if (!s || !b) {
    free(s);
    free(b);
    return tf_fail(TF_ERR_OOM, "out of memory: no host memory for allocator bookkeeping");
  }
  tf_status st = a->raw.alloc(a->raw.ctx, seg_size, &s->ptr);
  if (st != TF_OK) {
    free(s);
    free(b);
    return st;
  }
  s->size = seg_size;
  s->small = size <= TF_SMALL_SIZE;
  s->first = b;
  s->next = a->segments;
  if (a->segments) a->segments->prev = s;
  a->segments = s;
  b->ptr = s->ptr;
  b->size = seg_size;
  b->segment = s;
  tf_free_list_insert(tf_pool_of(a, s), b);
  a->stats.reserved += seg_size;
  a->stats.num_segments++;
  a->stats.num_segment_allocs++;
  tf_note_peaks(&a->stats);
  *out = b;
  return TF_OK;
}

static void tf_release_segment(tf_allocator *a, tf_segment *s) {
  tf_free_list_remove(tf_pool_of(a, s), s->first);
  if (s->prev)
    s->prev->next = s->next;
  else
    a->segments = s->next;
  if (s->next) s->next->prev = s->prev;
  a->raw.free(a->raw.ctx, s->ptr);
  a->stats.reserved -= s->size;
  a->stats.num_segments--;
  a->stats.num_segment_frees++;
  free(s->first);
  free(s);
}

void tf_alloc_empty_cache(tf_allocator *a) {
  tf_segment *s = a->segments;
  while (s) {
    tf_segment *next = s->next;
    if (!s->first->allocated && !s->first->next) tf_release_segment(a, s);
    s = next;
  }
}

static tf_status tf_out_of_memory(tf_allocator *a, size_t bytes) {
  char req[32], alloc[32], res[32], lim[32];
  a->stats.num_ooms++;
  char why[256];
  const char *cause = tf_last_error();
  if (strncmp(cause, "out of memory: ", 15) == 0) cause += 15; /* said once is enough */
  snprintf(why, sizeof why, "%s", cause);
  return tf_fail(TF_ERR_OOM,
                 "out of memory: tried to allocate %s on %s (%s allocated, %s reserved, limit %s; %s)",
                 tf_format_bytes(bytes, req, sizeof req), a->device_name,
                 tf_format_bytes(a->stats.allocated, alloc, sizeof alloc),
                 tf_format_bytes(a->stats.reserved, res, sizeof res),
                 a->limit ? tf_format_bytes(a->limit, lim, sizeof lim) : "none", why);
}

tf_status tf_alloc(tf_allocator *a, size_t bytes, tf_block **out) {
  size_t size = tf_alloc_round(bytes);
  tf_pool *pool = size <= TF_SMALL_SIZE ? &a->small : &a->large;
  tf_block *b = tf_find_free(pool, size);
  if (!b) {
    tf_status st = tf_new_segment(a, size, &b);
    if (st == TF_ERR_OOM) {
      if (tf_reclaim_hook) {
        tf_reclaim_hook(tf_reclaim_ud); /* may free blocks of this allocator */
        b = tf_find_free(pool, size);
      }
      if (!b) {
        tf_alloc_empty_cache(a);
        st = tf_new_segment(a, size, &b);
        if (st == TF_ERR_OOM) return tf_out_of_memory(a, bytes);
      }
    }
    if (st != TF_OK && !b) return st;
  }
  tf_free_list_remove(pool, b);
  size_t remaining = b->size - size;
  bool split = b->segment->small ? remaining >= TF_MIN_BLOCK : remaining > TF_SMALL_SIZE;
  if (split) {
    tf_block *rest = calloc(1, sizeof *rest);
    if (rest) {
      rest->ptr = (char *)b->ptr + size;
      rest->size = remaining;
      rest->segment = b->segment;
      rest->prev = b;
      rest->next = b->next;
      if (b->next) b->next->prev = rest;
      b->next = rest;
      b->size = size;
      tf_free_list_insert(pool, rest);
    }
  }
  b->allocated = true;
  b->requested = bytes;
  a->stats.allocated += b->size;
  a->stats.requested += bytes;
  a->stats.num_allocs++;
  a->stats.active_blocks++;
  tf_note_peaks(&a->stats);
  *out = b;
  return TF_OK;
}

/* Absorbs y, the free neighbour right after x, into x. */
static void tf_absorb(tf_block *x, tf_block *y) {
  x->size += y->size;
  x->next = y->next;
  if (y->next) y->next->prev = x;
  free(y);
}

void tf_alloc_free(tf_allocator *a, tf_block *b) {
  tf_pool *pool = tf_pool_of(a, b->segment);
  a->stats.allocated -= b->size;
  a->stats.requested -= b->requested;
  a->stats.num_frees++;
  a->stats.active_blocks--;
  b->allocated = false;
  b->requested = 0;
  if (b->next && !b->next->allocated) {
    tf_free_list_remove(pool, b->next);
    tf_absorb(b, b->next);
  }
  if (b->prev && !b->prev->allocated) {
    tf_block *p = b->prev;
    tf_free_list_remove(pool, p);
    tf_absorb(p, b);
    b = p;
  }
  tf_free_list_insert(pool, b);
}

void tf_alloc_reset_peak(tf_allocator *a) {
  a->stats.peak_allocated = a->stats.allocated;
  a->stats.peak_reserved = a->stats.reserved;
}

void tf_alloc_set_limit(tf_allocator *a, size_t limit) { a->limit = limit; }

uint64_t tf_alloc_destroy(tf_allocator *a) {
  uint64_t live = a->stats.active_blocks;
  while (a->segments) {
    tf_segment *s = a->segments;
    a->segments = s->next;
    a->raw.free(a->raw.ctx, s->ptr);
    for (tf_block *b = s->first; b;) {
      tf_block *n = b->next;
      free(b);
      b = n;
    }
    free(s);
  }
  a->small.free_head = a->large.free_head = NULL;
  a->stats.reserved = 0;
  a->stats.num_segments = 0;
  return live;
}
