/* Token files: the training data of a language model as one long array of
 * token ids, mapped read-only so that a file larger than memory is read a
 * window at a time and never copied whole.
 *
 * Two layouts are read: raw little-endian integers with no header (what
 * nanoGPT's prepare.py and the CS336 course write with np.memmap; the
 * caller names the type), and NumPy's .npy (version 1, 2 or 3; a 1-D
 * little-endian integer array, its type taken from the header). Every
 * error message starts with the file's path. */
#ifndef TF_TOKENS_H
#define TF_TOKENS_H

#include <stdbool.h>
#include <stdint.h>

#include "tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum tf_token_type { TF_TOK_U8, TF_TOK_U16, TF_TOK_U32, TF_TOK_I16, TF_TOK_I32, TF_TOK_I64 } tf_token_type;

typedef struct tf_token_file {
  char *path;
  tf_token_type type;
  int item_bytes;
  int64_t count;          /* tokens */
  uint64_t data_offset;   /* bytes before the first token (the .npy header) */
  void *map;              /* the whole file, read-only; NULL for an empty one */
  uint64_t map_bytes;
} tf_token_file;

/* "u16", "i64", ...; NULL for a value outside the enum. */
const char *tf_token_type_name(tf_token_type type);
/* The type named name; TF_ERR_ARG listing the names for any other. */
tf_status tf_token_type_parse(const char *name, tf_token_type *out);

/* Maps path. npy false: raw tokens of raw_type; npy true: the header gives
 * the type (raw_type is unused). */
tf_status tf_token_file_open(const char *path, bool npy, tf_token_type raw_type, tf_token_file **out);
/* Unmaps and frees; NULL is fine. */
void tf_token_file_close(tf_token_file *f);

/* Token i (0 <= i < count) as a signed 64-bit value. */
int64_t tf_token_file_at(const tf_token_file *f, int64_t i);

/* rows windows of length+1 tokens, window r starting at token starts[r],
 * as two (rows, length) i64 tensors on device: inputs = tokens s..s+length-1,
 * targets = s+1..s+length. The windows are converted straight from the
 * mapping into the host buffer (the tensor's own on the CPU, one staging
 * buffer copied over for another device). A token below 0 or, with
 * vocab_size > 0, not below vocab_size is a TF_ERR_ARG naming its position. */
tf_status tf_token_file_windows(const tf_token_file *f, const int64_t *starts, int64_t rows, int64_t length,
                                int64_t vocab_size, tf_device device, tf_tensor **inputs, tf_tensor **targets);

/* Scans every token once: *bad is the position of the first token below 0
 * or not below vocab_size (vocab_size > 0), or -1 when there is none. */
tf_status tf_token_file_check(const tf_token_file *f, int64_t vocab_size, int64_t *bad);

/* The message for a bad token at position i (as the windows' errors say it). */
tf_status tf_token_file_bad_token(const tf_token_file *f, int64_t i, int64_t vocab_size);

#ifdef __cplusplus
}
#endif
#endif
