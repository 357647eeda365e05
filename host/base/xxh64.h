/* XXH64 (Yann Collet's xxHash, 64-bit form): the checksum tfhost writes
 * beside every tensor of a safetensors file and checks when it reads one
 * back, so that a file damaged on disk is an error rather than wrong
 * weights. It reads some 10 GB/s on one core, far faster than a disk. */
#ifndef TF_XXH64_H
#define TF_XXH64_H

#include <stddef.h>
#include <stdint.h>

/* The hash of n bytes at data with seed (0 for tfhost's files). */
uint64_t tf_xxh64(const void *data, size_t n, uint64_t seed);

/* The same hash fed in pieces: init, then update with the bytes in order
 * (any split gives the hash of the whole), then digest. */
typedef struct tf_xxh64_state {
  uint64_t v[4];
  uint64_t total; /* bytes fed so far */
  uint64_t seed;
  unsigned char buf[32];
  size_t used; /* bytes waiting in buf */
} tf_xxh64_state;

void tf_xxh64_init(tf_xxh64_state *s, uint64_t seed);
void tf_xxh64_update(tf_xxh64_state *s, const void *data, size_t n);
uint64_t tf_xxh64_digest(const tf_xxh64_state *s);

#endif
