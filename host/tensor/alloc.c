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

struct tf_alloc_parts {
  const void *base;
  int n;
  tf_mem_region *regions; /* names interned: region.name is tf_intern_string(id) */
  uint32_t *what;
  tf_alloc_parts *next;
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
  if (a->history.on) {
    tf_mem_origin o;
    tf_mem_origin_now(&o, false);
    tf_mem_record(&a->history, TF_MEM_SEGMENT_ALLOC, (uintptr_t)s->ptr, seg_size, seg_size, &o, 0);
  }
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
  tf_mem_record(&a->history, TF_MEM_SEGMENT_FREE, (uintptr_t)s->ptr, s->size, s->size, NULL, 0);
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
  if (a->history.on) {
    tf_mem_origin o;
    tf_mem_origin_now(&o, true);
    uint64_t left = a->limit > a->stats.reserved ? a->limit - a->stats.reserved : 0;
    tf_mem_record(&a->history, TF_MEM_OOM, 0, bytes, bytes, &o, left);
  }
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
  tf_mem_origin_now(&b->origin, a->history.on);
  tf_mem_record(&a->history, TF_MEM_ALLOC, (uintptr_t)b->ptr, b->size, bytes, &b->origin, 0);
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

static void tf_parts_drop(tf_alloc_parts *p) {
  free(p->regions);
  free(p->what);
  free(p);
}

/* The description of the block at base, unlinked from the list (or NULL). */
static tf_alloc_parts *tf_parts_take(tf_allocator *a, const void *base) {
  for (tf_alloc_parts **link = &a->parts; *link; link = &(*link)->next)
    if ((*link)->base == base) {
      tf_alloc_parts *p = *link;
      *link = p->next;
      return p;
    }
  return NULL;
}

static void tf_parts_origin(const tf_alloc_parts *p, int i, tf_mem_origin *o, const tf_mem_origin *block) {
  *o = *block;
  o->tag = (uint8_t)p->regions[i].tag;
  o->what = p->what[i];
}

/* Each part as its own event, so histories show the engine's buffers. */
static void tf_parts_record(tf_allocator *a, const tf_alloc_parts *p, tf_mem_action action, const tf_block *b) {
  for (int i = 0; i < p->n; i++) {
    tf_mem_origin o;
    tf_parts_origin(p, i, &o, &b->origin);
    tf_mem_record(&a->history, action, (uintptr_t)b->ptr + p->regions[i].offset, p->regions[i].size,
                  p->regions[i].size, &o, 0);
  }
}

void tf_alloc_free(tf_allocator *a, tf_block *b) {
  tf_pool *pool = tf_pool_of(a, b->segment);
  tf_alloc_parts *parts = a->parts ? tf_parts_take(a, b->ptr) : NULL;
  if (parts) {
    tf_parts_record(a, parts, TF_MEM_FREE, b);
    tf_parts_drop(parts);
  } else {
    tf_mem_record(&a->history, TF_MEM_FREE, (uintptr_t)b->ptr, b->size, b->requested, &b->origin, 0);
  }
  b->origin = (tf_mem_origin){0};
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
  while (a->parts) {
    tf_alloc_parts *p = a->parts;
    a->parts = p->next;
    tf_parts_drop(p);
  }
  tf_mem_recorder_free(&a->history);
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

/* ---- history and descriptions ------------------------------------------------------------ */

tf_status tf_alloc_record(tf_allocator *a, bool on, size_t max_entries) {
  if (!on) {
    tf_mem_recorder_stop(&a->history);
    return TF_OK;
  }
  TF_TRY(tf_mem_recorder_start(&a->history, max_entries));
  a->history.live = a->history.peak = a->stats.allocated; /* what was live before counts */
  a->history.peak_time_us = (uint64_t)(tf_clock_ns() / 1000);
  return TF_OK;
}

static tf_block *tf_find_live(const tf_allocator *a, const void *ptr) {
  for (tf_segment *s = a->segments; s; s = s->next) {
    if ((const char *)ptr < (const char *)s->ptr || (const char *)ptr >= (const char *)s->ptr + s->size) continue;
    for (tf_block *b = s->first; b; b = b->next)
      if (b->ptr == ptr && b->allocated) return b;
  }
  return NULL;
}

/* When the block's own alloc event is the latest one, it is taken back
 * and replaced by one per part; otherwise the block is shown freed and its
 * parts allocated in its place. */
tf_status tf_alloc_describe(tf_allocator *a, const void *base, int n, const tf_mem_region *regions) {
  tf_block *b = tf_find_live(a, base);
  if (!b) return tf_fail(TF_ERR_ARG, "no live block at %p to describe", base);
  tf_alloc_parts *p = calloc(1, sizeof *p);
  if (p) p->regions = calloc((size_t)n, sizeof *p->regions);
  if (p) p->what = calloc((size_t)n, sizeof *p->what);
  if (!p || !p->regions || !p->what) {
    if (p) tf_parts_drop(p);
    return tf_fail(TF_ERR_OOM, "out of memory: no host memory for a block description");
  }
  p->base = base;
  p->n = n;
  for (int i = 0; i < n; i++) {
    if (regions[i].offset + regions[i].size > b->size) {
      tf_parts_drop(p);
      return tf_fail(TF_ERR_ARG, "part %s lies outside its block", regions[i].name);
    }
    p->regions[i] = regions[i];
    p->what[i] = tf_intern_id(regions[i].name);
    p->regions[i].name = tf_intern_string(p->what[i]);
  }
  for (int i = 1; i < n; i++) /* in address order (insertion sort: descriptions are short and nearly sorted) */
    for (int j = i; j > 0 && p->regions[j].offset < p->regions[j - 1].offset; j--) {
      tf_mem_region r = p->regions[j];
      uint32_t w = p->what[j];
      p->regions[j] = p->regions[j - 1];
      p->what[j] = p->what[j - 1];
      p->regions[j - 1] = r;
      p->what[j - 1] = w;
    }
  tf_alloc_parts *old = tf_parts_take(a, base);
  tf_mem_recorder *h = &a->history;
  if (h->on) {
    const tf_mem_event *last = h->count ? tf_mem_event_at(h, h->count - 1) : NULL;
    if (!old && last && last->action == TF_MEM_ALLOC && last->addr == (uintptr_t)base) {
      h->head = (h->head + h->cap - 1) % h->cap;
      h->count--;
      h->seq--;
      h->live -= b->size;
    } else if (old) {
      tf_parts_record(a, old, TF_MEM_FREE, b);
    } else {
      tf_mem_record(h, TF_MEM_FREE, (uintptr_t)b->ptr, b->size, b->requested, &b->origin, 0);
    }
    tf_parts_record(a, p, TF_MEM_ALLOC, b);
  }
  if (old) tf_parts_drop(old);
  p->next = a->parts;
  a->parts = p;
  return TF_OK;
}

void tf_alloc_retag(tf_allocator *a, tf_block *b, int tag) {
  b->origin.tag = (uint8_t)tag;
  tf_mem_recorder *h = &a->history;
  for (size_t back = 0; back < h->count && back < 4096; back++) {
    tf_mem_event *e = (tf_mem_event *)tf_mem_event_at(h, h->count - 1 - back);
    if (e->addr != (uintptr_t)b->ptr) continue;
    if (e->action == TF_MEM_ALLOC) e->origin.tag = (uint8_t)tag;
    break;
  }
}

static int tf_segment_order(const void *x, const void *y) {
  uintptr_t a = (uintptr_t)(*(tf_segment *const *)x)->ptr, b = (uintptr_t)(*(tf_segment *const *)y)->ptr;
  return a < b ? -1 : a > b;
}

void tf_alloc_walk(const tf_allocator *a, tf_alloc_visit_fn fn, void *ud) {
  size_t n = 0;
  for (tf_segment *s = a->segments; s; s = s->next) n++;
  tf_segment **order = malloc((n ? n : 1) * sizeof *order);
  if (!order) return;
  n = 0;
  for (tf_segment *s = a->segments; s; s = s->next) order[n++] = s;
  qsort(order, n, sizeof *order, tf_segment_order);
  for (size_t i = 0; i < n; i++) {
    const tf_segment *s = order[i];
    for (const tf_block *b = s->first; b; b = b->next) {
      tf_alloc_visit v = {.segment = s->ptr, .segment_size = s->size, .small = s->small, .ptr = b->ptr,
                          .size = b->size, .requested = b->requested, .allocated = b->allocated,
                          .origin = b->origin};
      const tf_alloc_parts *p = NULL;
      for (const tf_alloc_parts *q = b->allocated ? a->parts : NULL; q && !p; q = q->next)
        if (q->base == b->ptr) p = q;
      if (!p) {
        fn(ud, &v);
        continue;
      }
      /* The parts, and the bytes no part names (alignment between parts, the
       * block's rounding after them) as blocks of their own, so that the
       * visits still tile the segment. */
      size_t at = 0;
      for (int k = 0; k <= p->n; k++) {
        const size_t start = k < p->n ? p->regions[k].offset : b->size;
        if (start > at) {
          v.ptr = (const char *)b->ptr + at;
          v.size = start - at;
          v.requested = 0;
          v.origin = b->origin;
          fn(ud, &v);
        }
        if (k == p->n) break;
        v.ptr = (const char *)b->ptr + start;
        v.size = v.requested = p->regions[k].size;
        tf_parts_origin(p, k, &v.origin, &b->origin);
        fn(ud, &v);
        if (start + p->regions[k].size > at) at = start + p->regions[k].size;
      }
    }
  }
  free(order);
}
