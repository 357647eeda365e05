/* 64-bit values as the 16 lowercase hex digits tfhost writes them with
 * ("%016llx": safetensors checksums, tf.rng_state), read back. */
#ifndef TF_HEX_H
#define TF_HEX_H

#include <stdbool.h>
#include <stdint.h>

/* The first 16 characters of s as a value into *out; false (out unset) when
 * one is not a lowercase hex digit (a shorter string fails at its NUL). */
static inline bool tf_hex16_parse(const char *s, uint64_t *out) {
  uint64_t x = 0;
  for (int i = 0; i < 16; i++) {
    const char c = s[i];
    const int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
    if (d < 0) return false;
    x = x << 4 | (uint64_t)d;
  }
  *out = x;
  return true;
}

#endif
