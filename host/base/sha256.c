/* SHA-256 as FIPS 180-4 specifies it, streaming over 64-byte blocks. */
#include "sha256.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

static const uint32_t tf_sha256_k[64] = {
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
    0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
    0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
    0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
    0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
    0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
    0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
    0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2,
};

static uint32_t tf_rotr(uint32_t x, int n) { return (x >> n) | (x << (32 - n)); }

/* One 64-byte block into the state: the message schedule, then 64 rounds. */
static void tf_sha256_block(uint32_t state[8], const unsigned char *p) {
  uint32_t w[64];
  for (int i = 0; i < 16; i++)
    w[i] = (uint32_t)p[4 * i] << 24 | (uint32_t)p[4 * i + 1] << 16 | (uint32_t)p[4 * i + 2] << 8 | p[4 * i + 3];
  for (int i = 16; i < 64; i++) {
    uint32_t s0 = tf_rotr(w[i - 15], 7) ^ tf_rotr(w[i - 15], 18) ^ (w[i - 15] >> 3);
    uint32_t s1 = tf_rotr(w[i - 2], 17) ^ tf_rotr(w[i - 2], 19) ^ (w[i - 2] >> 10);
    w[i] = w[i - 16] + s0 + w[i - 7] + s1;
  }
  uint32_t a = state[0], b = state[1], c = state[2], d = state[3];
  uint32_t e = state[4], f = state[5], g = state[6], h = state[7];
  for (int i = 0; i < 64; i++) {
    uint32_t t1 = h + (tf_rotr(e, 6) ^ tf_rotr(e, 11) ^ tf_rotr(e, 25)) + ((e & f) ^ (~e & g)) + tf_sha256_k[i] + w[i];
    uint32_t t2 = (tf_rotr(a, 2) ^ tf_rotr(a, 13) ^ tf_rotr(a, 22)) + ((a & b) ^ (a & c) ^ (b & c));
    h = g;
    g = f;
    f = e;
    e = d + t1;
    d = c;
    c = b;
    b = a;
    a = t1 + t2;
  }
  state[0] += a;
  state[1] += b;
  state[2] += c;
  state[3] += d;
  state[4] += e;
  state[5] += f;
  state[6] += g;
  state[7] += h;
}

void tf_sha256_init(tf_sha256 *h) {
  static const uint32_t iv[8] = {0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a,
                                 0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};
  memcpy(h->state, iv, sizeof iv);
  h->length = 0;
  h->used = 0;
}

void tf_sha256_update(tf_sha256 *h, const void *data, size_t n) {
  const unsigned char *p = data;
  h->length += n;
  while (n > 0) {
    size_t take = 64 - h->used < n ? 64 - h->used : n;
    memcpy(h->block + h->used, p, take);
    h->used += take;
    p += take;
    n -= take;
    if (h->used == 64) {
      tf_sha256_block(h->state, h->block);
      h->used = 0;
    }
  }
}

/* Pads with 0x80, zeros and the bit length, then prints the state. */
void tf_sha256_hex(tf_sha256 *h, char hex[65]) {
  uint64_t bits = h->length * 8;
  unsigned char pad[72] = {0x80};
  size_t npad = (h->used < 56 ? 56 : 120) - h->used;
  for (int i = 0; i < 8; i++) pad[npad + (size_t)i] = (unsigned char)(bits >> (56 - 8 * i));
  tf_sha256_update(h, pad, npad + 8);
  static const char digits[] = "0123456789abcdef";
  for (int i = 0; i < 32; i++) {
    unsigned byte = (h->state[i / 4] >> (24 - 8 * (i % 4))) & 0xff;
    hex[2 * i] = digits[byte >> 4];
    hex[2 * i + 1] = digits[byte & 15];
  }
  hex[64] = '\0';
}

tf_status tf_sha256_file(const char *path, char hex[65]) {
  FILE *f = fopen(path, "rb");
  if (!f) return tf_fail(TF_ERR_IO, "%s: %s", path, strerror(errno));
  tf_sha256 h;
  tf_sha256_init(&h);
  unsigned char buf[1 << 16];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, f)) > 0) tf_sha256_update(&h, buf, n);
  int failed = ferror(f);
  fclose(f);
  if (failed) return tf_fail(TF_ERR_IO, "%s: read error", path);
  tf_sha256_hex(&h, hex);
  return TF_OK;
}
