/* XXH64, from its specification (xxhash's doc/xxhash_spec.md): 32-byte
 * stripes into four lanes, the lanes merged, the tail folded in 8, 4 and 1
 * bytes at a time, then the avalanche. Words are read little-endian. */
#include "xxh64.h"

#include <string.h>

enum {
  TF_XXH_STRIPE = 32
};

static const uint64_t TF_XXH_P1 = 0x9E3779B185EBCA87ull;
static const uint64_t TF_XXH_P2 = 0xC2B2AE3D27D4EB4Full;
static const uint64_t TF_XXH_P3 = 0x165667B19E3779F9ull;
static const uint64_t TF_XXH_P4 = 0x85EBCA77C2B2AE63ull;
static const uint64_t TF_XXH_P5 = 0x27D4EB2F165667C5ull;

static uint64_t tf_xxh_rotl(uint64_t x, int r) { return (x << r) | (x >> (64 - r)); }

static uint64_t tf_xxh_read64(const unsigned char *p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; i--) v = v << 8 | p[i];
  return v;
}

static uint64_t tf_xxh_read32(const unsigned char *p) {
  return (uint64_t)p[0] | (uint64_t)p[1] << 8 | (uint64_t)p[2] << 16 | (uint64_t)p[3] << 24;
}

static uint64_t tf_xxh_round(uint64_t acc, uint64_t lane) {
  acc += lane * TF_XXH_P2;
  return tf_xxh_rotl(acc, 31) * TF_XXH_P1;
}

static uint64_t tf_xxh_merge(uint64_t acc, uint64_t v) {
  acc ^= tf_xxh_round(0, v);
  return acc * TF_XXH_P1 + TF_XXH_P4;
}

/* Whole stripes of p into the lanes; returns the bytes consumed. */
static size_t tf_xxh_stripes(uint64_t v[4], const unsigned char *p, size_t n) {
  size_t done = 0;
  for (; done + TF_XXH_STRIPE <= n; done += TF_XXH_STRIPE)
    for (int i = 0; i < 4; i++) v[i] = tf_xxh_round(v[i], tf_xxh_read64(p + done + 8 * i));
  return done;
}

void tf_xxh64_init(tf_xxh64_state *s, uint64_t seed) {
  memset(s, 0, sizeof *s);
  s->seed = seed;
  s->v[0] = seed + TF_XXH_P1 + TF_XXH_P2;
  s->v[1] = seed + TF_XXH_P2;
  s->v[2] = seed;
  s->v[3] = seed - TF_XXH_P1;
}

void tf_xxh64_update(tf_xxh64_state *s, const void *data, size_t n) {
  const unsigned char *p = data;
  s->total += n;
  if (s->used) { /* fill the waiting stripe first */
    size_t take = TF_XXH_STRIPE - s->used < n ? TF_XXH_STRIPE - s->used : n;
    memcpy(s->buf + s->used, p, take);
    s->used += take;
    p += take;
    n -= take;
    if (s->used < TF_XXH_STRIPE) return;
    tf_xxh_stripes(s->v, s->buf, TF_XXH_STRIPE);
    s->used = 0;
  }
  size_t done = tf_xxh_stripes(s->v, p, n);
  memcpy(s->buf, p + done, n - done);
  s->used = n - done;
}

uint64_t tf_xxh64_digest(const tf_xxh64_state *s) {
  uint64_t h;
  if (s->total >= TF_XXH_STRIPE) {
    const uint64_t *v = s->v;
    h = tf_xxh_rotl(v[0], 1) + tf_xxh_rotl(v[1], 7) + tf_xxh_rotl(v[2], 12) + tf_xxh_rotl(v[3], 18);
    for (int i = 0; i < 4; i++) h = tf_xxh_merge(h, v[i]);
  } else {
    h = s->seed + TF_XXH_P5;
  }
  h += s->total;
  const unsigned char *p = s->buf;
  size_t n = s->used;
  for (; n >= 8; p += 8, n -= 8) h = tf_xxh_rotl(h ^ tf_xxh_round(0, tf_xxh_read64(p)), 27) * TF_XXH_P1 + TF_XXH_P4;
  if (n >= 4) {
    h = tf_xxh_rotl(h ^ tf_xxh_read32(p) * TF_XXH_P1, 23) * TF_XXH_P2 + TF_XXH_P3;
    p += 4;
    n -= 4;
  }
  for (; n > 0; p++, n--) h = tf_xxh_rotl(h ^ *p * TF_XXH_P5, 11) * TF_XXH_P1;
  h ^= h >> 33;
  h *= TF_XXH_P2;
  h ^= h >> 29;
  h *= TF_XXH_P3;
  h ^= h >> 32;
  return h;
}

uint64_t tf_xxh64(const void *data, size_t n, uint64_t seed) {
  tf_xxh64_state s;
  tf_xxh64_init(&s, seed);
  tf_xxh64_update(&s, data, n);
  return tf_xxh64_digest(&s);
}
