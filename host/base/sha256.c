/* SHA-256 as FIPS 180-4 specifies it, streaming over 64-byte blocks: with
 * the x86 SHA extensions where the CPU has them (hashing the binary for a
 * results file, several times faster), else in plain C.
 * TF_SHA256=portable takes the plain C path (for its tests). */
#include "sha256.h"

#include <errno.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#include <immintrin.h>
#define TF_SHA256_X86 1
#endif

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

#ifdef TF_SHA256_X86
/* The blocks through SHA256RNDS2 (two rounds an instruction) and SHA256MSG1/2
 * (the message schedule, four words at a time). The instructions keep the
 * state as ABEF and CDGH; the words go in byte-swapped, four rounds' worth
 * with their constants added. */
__attribute__((target("sha,sse4.1"))) static void tf_sha256_blocks_x86(uint32_t state[8], const unsigned char *p,
                                                                        size_t blocks) {
  const __m128i swap = _mm_set_epi64x(0x0c0d0e0f08090a0bll, 0x0405060700010203ll);
  __m128i dcba = _mm_shuffle_epi32(_mm_loadu_si128((const __m128i *)&state[0]), 0xB1); /* CDAB */
  __m128i hgfe = _mm_shuffle_epi32(_mm_loadu_si128((const __m128i *)&state[4]), 0x1B); /* EFGH */
  __m128i abef = _mm_alignr_epi8(dcba, hgfe, 8), cdgh = _mm_blend_epi16(hgfe, dcba, 0xF0);
  for (; blocks > 0; blocks--, p += 64) {
    const __m128i abef0 = abef, cdgh0 = cdgh;
    __m128i m[4]; /* words 4k .. 4k + 3 of the schedule, k mod 4 */
    for (int k = 0; k < 16; k++) {
      if (k < 4) {
        m[k] = _mm_shuffle_epi8(_mm_loadu_si128((const __m128i *)(p + 16 * k)), swap);
      } else {
        /* W[t] = s1(W[t-2]) + W[t-7] + s0(W[t-15]) + W[t-16], four at a time */
        __m128i w = _mm_add_epi32(_mm_sha256msg1_epu32(m[k & 3], m[(k + 1) & 3]),
                                  _mm_alignr_epi8(m[(k + 3) & 3], m[(k + 2) & 3], 4));
        m[k & 3] = _mm_sha256msg2_epu32(w, m[(k + 3) & 3]);
      }
      __m128i wk = _mm_add_epi32(m[k & 3], _mm_loadu_si128((const __m128i *)&tf_sha256_k[4 * k]));
      cdgh = _mm_sha256rnds2_epu32(cdgh, abef, wk);
      abef = _mm_sha256rnds2_epu32(abef, cdgh, _mm_shuffle_epi32(wk, 0x0E));
    }
    abef = _mm_add_epi32(abef, abef0);
    cdgh = _mm_add_epi32(cdgh, cdgh0);
  }
  __m128i feba = _mm_shuffle_epi32(abef, 0x1B), dchg = _mm_shuffle_epi32(cdgh, 0xB1);
  _mm_storeu_si128((__m128i *)&state[0], _mm_blend_epi16(feba, dchg, 0xF0)); /* DCBA */
  _mm_storeu_si128((__m128i *)&state[4], _mm_alignr_epi8(dchg, feba, 8));    /* HGFE */
}

/* Whether the CPU has the SHA extensions (and SSSE3, SSE4.1 beside them). */
static bool tf_sha256_x86_usable(void) {
  unsigned a, b, c, d;
  if (!__get_cpuid(1, &a, &b, &c, &d) || !(c & bit_SSSE3) || !(c & bit_SSE4_1)) return false;
  return __get_cpuid_count(7, 0, &a, &b, &c, &d) && (b & bit_SHA);
}
#endif

/* Whole blocks at p into the state, through the SHA extensions when usable. */
static void tf_sha256_blocks(uint32_t state[8], const unsigned char *p, size_t blocks) {
#ifdef TF_SHA256_X86
  static atomic_int usable = -1; /* decided on first use (threads that race decide alike) */
  int use = atomic_load_explicit(&usable, memory_order_relaxed);
  if (use < 0) {
    const char *how = getenv("TF_SHA256");
    use = !(how && strcmp(how, "portable") == 0) && tf_sha256_x86_usable();
    atomic_store_explicit(&usable, use, memory_order_relaxed);
  }
  if (use) {
    tf_sha256_blocks_x86(state, p, blocks);
    return;
  }
#endif
  for (; blocks > 0; blocks--, p += 64) tf_sha256_block(state, p);
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
    if (h->used == 0 && n >= 64) { /* whole blocks straight from the input */
      const size_t blocks = n / 64;
      tf_sha256_blocks(h->state, p, blocks);
      p += 64 * blocks;
      n -= 64 * blocks;
      continue;
    }
    size_t take = 64 - h->used < n ? 64 - h->used : n;
    memcpy(h->block + h->used, p, take);
    h->used += take;
    p += take;
    n -= take;
    if (h->used == 64) {
      tf_sha256_blocks(h->state, h->block, 1);
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
