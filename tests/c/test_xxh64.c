/* XXH64: the published answers (the empty input, short inputs, one past a
 * 32-byte stripe), and the streaming form against the one-shot form for
 * every way of cutting a buffer in two and in many small pieces. */
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "xxh64.h"

int main(void) {
  CHECK(tf_xxh64("", 0, 0) == 0xEF46DB3751D8E999ull);
  CHECK(tf_xxh64("a", 1, 0) == 0xD24EC4F1A98C6E5Bull);
  CHECK(tf_xxh64("abc", 3, 0) == 0x44BC2CF5AD770999ull);
  const char *spam = "Nobody inspects the spammish repetition"; /* 39 bytes: a stripe, then 8, 4 and 1-byte tails */
  CHECK(tf_xxh64(spam, strlen(spam), 0) == 0xFBCEA83C8A378BF1ull);
  CHECK(tf_xxh64("abc", 3, 1) != tf_xxh64("abc", 3, 0));

  enum { N = 300 };
  unsigned char buf[N];
  uint64_t x = 12345;
  for (int i = 0; i < N; i++) {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    buf[i] = (unsigned char)(x >> 56);
  }
  for (int n = 0; n <= N; n += 7) {
    const uint64_t whole = tf_xxh64(buf, (size_t)n, 0);
    for (int cut = 0; cut <= n; cut++) {
      tf_xxh64_state s;
      tf_xxh64_init(&s, 0);
      tf_xxh64_update(&s, buf, (size_t)cut);
      tf_xxh64_update(&s, buf + cut, (size_t)(n - cut));
      CHECK(tf_xxh64_digest(&s) == whole);
    }
    tf_xxh64_state s;
    tf_xxh64_init(&s, 0);
    for (int i = 0; i < n; i += 3) tf_xxh64_update(&s, buf + i, (size_t)(n - i < 3 ? n - i : 3));
    CHECK(tf_xxh64_digest(&s) == whole);
  }
  /* one changed bit changes the hash */
  uint64_t h = tf_xxh64(buf, N, 0);
  buf[N / 2] ^= 1;
  CHECK(tf_xxh64(buf, N, 0) != h);
  return tf_check_done();
}
