/* SHA-256 (FIPS 180-4): the fingerprint results files give a script's
 * source and the tfhost binary, so two results can say whether they ran
 * the same code. */
#ifndef TF_SHA256_H
#define TF_SHA256_H

#include <stddef.h>
#include <stdint.h>

#include "status.h"

typedef struct tf_sha256 {
  uint32_t state[8];
  uint64_t length; /* bytes hashed so far */
  unsigned char block[64];
  size_t used; /* bytes waiting in block */
} tf_sha256;

void tf_sha256_init(tf_sha256 *h);
void tf_sha256_update(tf_sha256 *h, const void *data, size_t n);
/* Writes the digest as 64 lowercase hex digits and a NUL into hex. */
void tf_sha256_hex(tf_sha256 *h, char hex[65]);
/* The hex digest of a file's bytes; TF_ERR_IO (with the reason) when it cannot be read. */
tf_status tf_sha256_file(const char *path, char hex[65]);

#endif
