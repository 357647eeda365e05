/* The caching allocator: rounding, pools, splitting, reuse, merging,
 * statistics, limits and the out-of-memory path, on a fake device. */
#include <stdlib.h>
#include <string.h>

#include "alloc.h"
#include "check.h"

/* A fake device that counts raw allocations and can refuse them. */
typedef struct {
  int live;
  size_t capacity, used;
} fake_device;

static tf_status fake_alloc(void *ctx, size_t bytes, void **ptr) {
  fake_device *d = ctx;
  if (d->capacity && d->used + bytes > d->capacity) return tf_fail(TF_ERR_OOM, "out of memory: fake device full");
  *ptr = malloc(bytes);
  d->live++;
  d->used += bytes;
  return TF_OK;
}

static size_t fake_sizes[64];
static void *fake_ptrs[64];
static void fake_free(void *ctx, void *ptr) {
  fake_device *d = ctx;
  for (int i = 0; i < 64; i++)
    if (fake_ptrs[i] == ptr) {
      d->used -= fake_sizes[i];
      fake_ptrs[i] = NULL;
    }
  d->live--;
  free(ptr);
}

static tf_status fake_alloc_tracked(void *ctx, size_t bytes, void **ptr) {
  tf_status st = fake_alloc(ctx, bytes, ptr);
  if (st == TF_OK)
    for (int i = 0; i < 64; i++)
      if (!fake_ptrs[i]) {
        fake_ptrs[i] = *ptr;
        fake_sizes[i] = bytes;
        break;
      }
  return st;
}

static int reclaim_calls;
static void count_reclaim(void *ud) {
  (void)ud;
  reclaim_calls++;
}

static void test_rounding(void) {
  CHECK_INT(tf_alloc_round(1), 512);
  CHECK_INT(tf_alloc_round(512), 512);
  CHECK_INT(tf_alloc_round(513), 1024);
  CHECK_INT(tf_alloc_segment_size(512), 2 << 20);
  CHECK_INT(tf_alloc_segment_size(1 << 20), 2 << 20);
  CHECK_INT(tf_alloc_segment_size((1 << 20) + 512), 20 << 20);
  CHECK_INT(tf_alloc_segment_size(10 << 20), 10 << 20);
  CHECK_INT(tf_alloc_segment_size((10 << 20) + 512), 12 << 20);
}

static void test_small_pool_reuse_and_merge(void) {
  fake_device dev = {0};
  tf_allocator a;
  tf_alloc_init(&a, "fake", (tf_alloc_backend){fake_alloc_tracked, fake_free, &dev});
  tf_block *b1, *b2, *b3;
  CHECK_OK(tf_alloc(&a, 1000, &b1));
  CHECK_OK(tf_alloc(&a, 1000, &b2));
  CHECK_OK(tf_alloc(&a, 1000, &b3));
  CHECK_INT(dev.live, 1); /* one 2 MiB segment serves all three */
  CHECK_INT(a.stats.allocated, 3 * 1024);
  CHECK_INT(a.stats.requested, 3000);
  CHECK_INT(a.stats.reserved, 2 << 20);
  CHECK((char *)b2->ptr == (char *)b1->ptr + 1024);
  void *p2 = b2->ptr;
  tf_alloc_free(&a, b2);
  tf_block *b4;
  CHECK_OK(tf_alloc(&a, 700, &b4)); /* best fit reuses the freed hole */
  CHECK(b4->ptr == p2);
  tf_alloc_free(&a, b4);
  tf_alloc_free(&a, b1);
  tf_alloc_free(&a, b3);
  CHECK_INT(a.stats.allocated, 0);
  CHECK_INT(a.stats.active_blocks, 0);
  /* everything merged back: the segment is one free block and can be released */
  tf_alloc_empty_cache(&a);
  CHECK_INT(dev.live, 0);
  CHECK_INT(a.stats.reserved, 0);
  CHECK_INT(a.stats.num_segment_frees, 1);
  CHECK_INT(a.stats.peak_allocated, 3 * 1024);
  CHECK_INT(a.stats.num_allocs, 4);
  CHECK_INT(a.stats.num_frees, 4);
  CHECK_INT(tf_alloc_destroy(&a), 0);
}

static void test_large_pool(void) {
  fake_device dev = {0};
  tf_allocator a;
  tf_alloc_init(&a, "fake", (tf_alloc_backend){fake_alloc_tracked, fake_free, &dev});
  tf_block *big, *mid1, *mid2;
  CHECK_OK(tf_alloc(&a, 30 << 20, &big));
  CHECK_INT(a.stats.reserved, 30 << 20);
  CHECK_OK(tf_alloc(&a, 3 << 20, &mid1));
  CHECK_INT(a.stats.reserved, 50 << 20); /* a 20 MiB segment */
  CHECK_OK(tf_alloc(&a, 3 << 20, &mid2)); /* split from it */
  CHECK_INT(dev.live, 2);
  tf_alloc_free(&a, big);
  tf_block *again;
  CHECK_OK(tf_alloc(&a, 25 << 20, &again)); /* served by the cached 30 MiB block */
  CHECK_INT(dev.live, 2);
  CHECK_INT(a.stats.allocated, (25 << 20) + (6 << 20)); /* remainder 5 MiB > 1 MiB is split off */
  tf_alloc_free(&a, again);
  tf_alloc_free(&a, mid1);
  tf_alloc_free(&a, mid2);
  tf_alloc_empty_cache(&a);
  CHECK_INT(dev.live, 0);
  tf_alloc_destroy(&a);
}

static void test_limit_and_oom(void) {
  fake_device dev = {0};
  tf_allocator a;
  tf_alloc_init(&a, "fake", (tf_alloc_backend){fake_alloc_tracked, fake_free, &dev});
  tf_alloc_set_reclaim_hook(count_reclaim, NULL);
  tf_alloc_set_limit(&a, 32 << 20);
  tf_block *b1, *b2, *b3;
  CHECK_OK(tf_alloc(&a, 20 << 20, &b1));
  reclaim_calls = 0;
  tf_status st = tf_alloc(&a, 20 << 20, &b2);
  CHECK_INT(st, TF_ERR_OOM);
  CHECK(strncmp(tf_last_error(), "out of memory", 13) == 0);
  CHECK(strstr(tf_last_error(), "20.00 MiB") != NULL);
  CHECK_INT(reclaim_calls, 1);
  CHECK_INT(a.stats.num_ooms, 1);
  CHECK_INT(a.stats.allocated, 20 << 20); /* unchanged by the failure */
  /* a cached free segment is released to make room */
  tf_alloc_free(&a, b1);
  CHECK_OK(tf_alloc(&a, 4 << 20, &b3)); /* new 20 MiB segment: 40 MiB reserved > limit -> release cache */
  CHECK_INT(a.stats.reserved, 20 << 20);
  tf_alloc_free(&a, b3);
  /* a device that refuses: the same path without a limit */
  tf_alloc_set_limit(&a, 0);
  dev.capacity = dev.used + (1 << 20);
  st = tf_alloc(&a, 64 << 20, &b2);
  CHECK_INT(st, TF_ERR_OOM);
  CHECK(strstr(tf_last_error(), "fake device full") != NULL);
  tf_alloc_set_reclaim_hook(NULL, NULL);
  tf_alloc_destroy(&a);
  CHECK_INT(dev.live, 0);
}

/* Random alloc/free sequences keep the books balanced. */
static void test_random_sequences(void) {
  fake_device dev = {0};
  tf_allocator a;
  tf_alloc_init(&a, "fake", (tf_alloc_backend){fake_alloc, fake_free, &dev});
  tf_block *live[200] = {0};
  size_t sizes[200] = {0}, expect = 0;
  srand(1234);
  for (int step = 0; step < 20000; step++) {
    int i = rand() % 200;
    if (live[i]) {
      expect -= tf_alloc_round(sizes[i]);
      tf_alloc_free(&a, live[i]);
      live[i] = NULL;
    } else {
      sizes[i] = (size_t)(rand() % 4 == 0 ? rand() % (24 << 20) : rand() % 100000) + 1;
      if (tf_alloc(&a, sizes[i], &live[i]) != TF_OK) break;
      expect += live[i]->size;
      sizes[i] = live[i]->size;
    }
  }
  CHECK_INT(a.stats.allocated, expect);
  for (int i = 0; i < 200; i++)
    if (live[i]) tf_alloc_free(&a, live[i]);
  CHECK_INT(a.stats.allocated, 0);
  tf_alloc_empty_cache(&a);
  CHECK_INT(a.stats.reserved, 0);
  CHECK_INT(dev.live, 0);
  tf_alloc_destroy(&a);
}

int main(void) {
  test_rounding();
  test_small_pool_reuse_and_merge();
  test_large_pool();
  test_limit_and_oom();
  test_random_sequences();
  return tf_check_done();
}
