/* The caching allocator, one per device.
 *
 * Memory is obtained from the device in segments (one raw allocation each),
 * carved into blocks, and blocks are cached for reuse when freed: the same
 * scheme as PyTorch's CUDA caching allocator (512-byte rounding; a small pool
 * of 2 MiB segments for requests up to 1 MiB; a large pool of 20 MiB segments
 * or exact 2 MiB multiples; best-fit with splitting; neighbours merge on
 * free). The CPU backend uses it too, so its accounting is tested everywhere.
 *
 * On a failed raw allocation the allocator first asks its owner to reclaim
 * (the Lua host runs a full garbage collection there, which may free
 * tensors), then releases its cached segments, retries once, and only then
 * reports "out of memory". */
#ifndef TF_ALLOC_H
#define TF_ALLOC_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "memrec.h"
#include "status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct tf_segment tf_segment;

typedef struct tf_block {
  void *ptr;
  size_t size;      /* bytes this block spans (rounded) */
  size_t requested; /* bytes asked for, while allocated */
  bool allocated;
  tf_mem_origin origin;   /* what it is for, while allocated */
  tf_segment *segment;
  struct tf_block *prev, *next;           /* neighbours in the segment, by address */
  struct tf_block *free_prev, *free_next; /* position in the pool's free list */
} tf_block;

typedef struct tf_alloc_stats {
  size_t allocated;      /* bytes in live blocks (rounded sizes) */
  size_t requested;      /* bytes asked for by live blocks */
  size_t reserved;       /* bytes in segments obtained from the device */
  size_t peak_allocated;
  size_t peak_reserved;
  uint64_t num_allocs;   /* blocks handed out, ever */
  uint64_t num_frees;    /* blocks returned, ever */
  uint64_t num_segments; /* segments held now */
  uint64_t num_segment_allocs;
  uint64_t num_segment_frees;
  uint64_t num_ooms;
  uint64_t active_blocks; /* blocks allocated now */
} tf_alloc_stats;

typedef struct tf_alloc_backend {
  /* Raw device allocation: TF_ERR_OOM when the device has no room. */
  tf_status (*alloc)(void *ctx, size_t bytes, void **ptr);
  void (*free)(void *ctx, void *ptr);
  void *ctx;
} tf_alloc_backend;

typedef struct tf_pool {
  tf_block *free_head; /* free blocks sorted by (size, address) */
} tf_pool;

/* Named parts of one block (the engine's planned buffers): shown in
 * snapshots and histories in place of the block itself. */
typedef struct tf_mem_region {
  const char *name;
  int tag; /* tf_mem_tag */
  size_t offset, size;
} tf_mem_region;

typedef struct tf_alloc_parts tf_alloc_parts;

typedef struct tf_allocator {
  const char *device_name;
  tf_alloc_backend raw;
  tf_pool small, large;
  tf_segment *segments;
  size_t limit; /* 0: no limit besides the device's own */
  tf_alloc_stats stats;
  tf_mem_recorder history;
  tf_alloc_parts *parts; /* blocks described by tf_alloc_describe */
} tf_allocator;

/* Called before a failed allocation is reported, so the owner can free
 * memory it holds indirectly (garbage tensors); process-wide. */
typedef void (*tf_reclaim_fn)(void *ud);
void tf_alloc_set_reclaim_hook(tf_reclaim_fn fn, void *ud);

void tf_alloc_init(tf_allocator *a, const char *device_name, tf_alloc_backend raw);
/* Releases every segment; blocks still allocated are leaked to the device
 * (reported by the return value: the number of live blocks). */
uint64_t tf_alloc_destroy(tf_allocator *a);

tf_status tf_alloc(tf_allocator *a, size_t bytes, tf_block **out);
void tf_alloc_free(tf_allocator *a, tf_block *b);

/* Returns cached segments that hold no live block to the device. */
void tf_alloc_empty_cache(tf_allocator *a);
void tf_alloc_reset_peak(tf_allocator *a);
/* Caps reserved memory (bytes, 0 for none): lets tests and users provoke
 * and study out-of-memory without filling a whole device. */
void tf_alloc_set_limit(tf_allocator *a, size_t limit);

/* Starts (again) or stops recording this allocator's events. */
tf_status tf_alloc_record(tf_allocator *a, bool on, size_t max_entries);

/* Names the parts of the live block at base (regions by offset, within the
 * block, in address order); replaces an earlier description. */
tf_status tf_alloc_describe(tf_allocator *a, const void *base, int n, const tf_mem_region *regions);

/* Changes what a live block is for (a gradient that autograd keeps), in
 * the block and in its recent alloc event. */
void tf_alloc_retag(tf_allocator *a, tf_block *b, int tag);

/* Walks segments (by address) and their blocks; a described block is
 * visited once per named part (origin from the part) and once per run of
 * bytes between and after the parts (the block's origin, requested 0), so
 * the visits of a segment always tile it exactly. */
typedef struct tf_alloc_visit {
  const void *segment;      /* segment start */
  size_t segment_size;
  bool small;
  const void *ptr;          /* block or part */
  size_t size, requested;
  bool allocated;
  tf_mem_origin origin;
} tf_alloc_visit;
typedef void (*tf_alloc_visit_fn)(void *ud, const tf_alloc_visit *v);
void tf_alloc_walk(const tf_allocator *a, tf_alloc_visit_fn fn, void *ud);

/* Size-rounding and segment-size rules, exposed for tests. */
size_t tf_alloc_round(size_t bytes);
size_t tf_alloc_segment_size(size_t rounded);

/* Human-readable bytes ("1.50 GiB") into buf. */
const char *tf_format_bytes(size_t bytes, char *buf, size_t n);

#ifdef __cplusplus
}
#endif
#endif
