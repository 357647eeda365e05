/* Token files mapped read-only (tokens.h). The mapping is the only copy the
 * process holds: a batch reads its windows from it, so a file larger than
 * memory costs the pages the windows touch. */
#define _GNU_SOURCE
#include "tokens.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

static const struct {
  const char *name;
  const char *npy; /* the .npy descr, byte order included */
  int bytes;
} tf_token_types[] = {
    [TF_TOK_U8] = {"u8", "|u1", 1},  [TF_TOK_U16] = {"u16", "<u2", 2}, [TF_TOK_U32] = {"u32", "<u4", 4},
    [TF_TOK_I16] = {"i16", "<i2", 2}, [TF_TOK_I32] = {"i32", "<i4", 4}, [TF_TOK_I64] = {"i64", "<i8", 8},
};
#define TF_TOKEN_TYPES_N ((int)(sizeof tf_token_types / sizeof tf_token_types[0]))
#define TF_TOKEN_NAMES "u8, u16, u32, i16, i32, i64"
#define TF_TOKEN_NPY_NAMES "|u1, <u2, <u4, <i2, <i4, <i8"

const char *tf_token_type_name(tf_token_type type) {
  return (int)type >= 0 && (int)type < TF_TOKEN_TYPES_N ? tf_token_types[type].name : NULL;
}

tf_status tf_token_type_parse(const char *name, tf_token_type *out) {
  for (int i = 0; i < TF_TOKEN_TYPES_N; i++) {
    if (strcmp(name, tf_token_types[i].name) == 0) {
      *out = (tf_token_type)i;
      return TF_OK;
    }
  }
  return tf_fail(TF_ERR_ARG, "unknown token dtype '%s' (one of " TF_TOKEN_NAMES ")", name);
}

/* ---- the .npy header ---------------------------------------------------------- */

/* A cursor over the header's Python dict literal. */
typedef struct tf_npy_text {
  const char *p, *end;
} tf_npy_text;

static void tf_npy_space(tf_npy_text *t) {
  while (t->p < t->end && (*t->p == ' ' || *t->p == '\t' || *t->p == '\n' || *t->p == '\r')) t->p++;
}

static bool tf_npy_eat(tf_npy_text *t, char c) {
  tf_npy_space(t);
  if (t->p < t->end && *t->p == c) {
    t->p++;
    return true;
  }
  return false;
}

/* A quoted string ('...' or "...", no escapes: numpy writes none) into buf. */
static bool tf_npy_string(tf_npy_text *t, char *buf, size_t n) {
  tf_npy_space(t);
  if (t->p >= t->end || (*t->p != '\'' && *t->p != '"')) return false;
  char quote = *t->p++;
  size_t k = 0;
  while (t->p < t->end && *t->p != quote) {
    if (*t->p == '\\' || k + 1 >= n) return false;
    buf[k++] = *t->p++;
  }
  if (t->p >= t->end) return false;
  t->p++;
  buf[k] = '\0';
  return true;
}

static bool tf_npy_word(tf_npy_text *t, const char *word) {
  tf_npy_space(t);
  size_t n = strlen(word);
  if ((size_t)(t->end - t->p) < n || memcmp(t->p, word, n) != 0) return false;
  t->p += n;
  return true;
}

/* The shape tuple: "(n,)", "()", "(a, b)"; dims counted into *ndim, the
 * first two kept. */
static bool tf_npy_shape(tf_npy_text *t, int *ndim, uint64_t dims[2]) {
  if (!tf_npy_eat(t, '(')) return false;
  *ndim = 0;
  for (;;) {
    if (tf_npy_eat(t, ')')) return true;
    tf_npy_space(t);
    if (t->p >= t->end || *t->p < '0' || *t->p > '9') return false;
    uint64_t v = 0;
    while (t->p < t->end && *t->p >= '0' && *t->p <= '9') {
      if (v > (UINT64_MAX - 9) / 10) return false;
      v = v * 10 + (uint64_t)(*t->p++ - '0');
    }
    if (t->p < t->end && *t->p == 'L') t->p++; /* Python 2's longs */
    if (*ndim < 2) dims[*ndim] = v;
    (*ndim)++;
    if (!tf_npy_eat(t, ',')) {
      if (!tf_npy_eat(t, ')')) return false;
      return true;
    }
  }
}

static tf_status tf_npy_bad(const char *path, const char *why) {
  return tf_fail(TF_ERR_IO, "%s: not a valid .npy file: %s", path, why);
}

/* Reads the .npy preamble and header at the start of fd: the type, the
 * token count and where the data begin. */
static tf_status tf_npy_read_header(const char *path, int fd, uint64_t file_bytes, tf_token_type *type,
                                    uint64_t *count, uint64_t *data_offset) {
  unsigned char pre[12];
  if (file_bytes < 10 || pread(fd, pre, sizeof pre, 0) < 10 || memcmp(pre, "\x93NUMPY", 6) != 0)
    return tf_npy_bad(path, "it does not start with the magic bytes \\x93NUMPY");
  int major = pre[6];
  uint64_t header_bytes, start;
  if (major == 1) {
    header_bytes = (uint64_t)pre[8] | (uint64_t)pre[9] << 8;
    start = 10;
  } else if (major == 2 || major == 3) {
    if (file_bytes < 12) return tf_npy_bad(path, "the file ends inside its preamble");
    header_bytes = (uint64_t)pre[8] | (uint64_t)pre[9] << 8 | (uint64_t)pre[10] << 16 | (uint64_t)pre[11] << 24;
    start = 12;
  } else {
    return tf_fail(TF_ERR_IO, "%s: .npy format version %d.%d is not one tfhost reads (1, 2 or 3)", path, major,
                   pre[7]);
  }
  if (header_bytes > (1u << 20) || start + header_bytes > file_bytes)
    return tf_npy_bad(path, "its header length runs past the end of the file");
  char *text = malloc(header_bytes + 1);
  if (!text) return tf_fail(TF_ERR_OOM, "out of memory: reading the header of %s", path);
  tf_status st = TF_OK;
  if (pread(fd, text, header_bytes, (off_t)start) != (ssize_t)header_bytes) {
    st = tf_fail(TF_ERR_IO, "%s: cannot read the .npy header: %s", path, strerror(errno));
    goto done;
  }
  text[header_bytes] = '\0';

  tf_npy_text t = {text, text + header_bytes};
  char key[32], descr[32] = "";
  bool have_descr = false, have_order = false, have_shape = false, fortran = false;
  int ndim = 0;
  uint64_t dims[2] = {0, 0};
  if (!tf_npy_eat(&t, '{')) {
    st = tf_npy_bad(path, "its header is not a dict");
    goto done;
  }
  while (!tf_npy_eat(&t, '}')) {
    if (!tf_npy_string(&t, key, sizeof key) || !tf_npy_eat(&t, ':')) {
      st = tf_npy_bad(path, "its header is not a dict of 'descr', 'fortran_order' and 'shape'");
      goto done;
    }
    bool ok;
    if (strcmp(key, "descr") == 0) {
      ok = have_descr = tf_npy_string(&t, descr, sizeof descr);
      if (!ok) {
        st = tf_fail(TF_ERR_ARG, "%s: the array's dtype is not a plain integer type (tf.data.tokens reads "
                                 TF_TOKEN_NPY_NAMES ")", path);
        goto done;
      }
    } else if (strcmp(key, "fortran_order") == 0) {
      fortran = tf_npy_word(&t, "True");
      ok = have_order = fortran || tf_npy_word(&t, "False");
    } else if (strcmp(key, "shape") == 0) {
      ok = have_shape = tf_npy_shape(&t, &ndim, dims);
    } else {
      st = tf_fail(TF_ERR_IO, "%s: not a valid .npy file: unknown header key '%s'", path, key);
      goto done;
    }
    if (!ok) {
      st = tf_fail(TF_ERR_IO, "%s: not a valid .npy file: cannot read the header's '%s'", path, key);
      goto done;
    }
    if (tf_npy_eat(&t, ',')) continue; /* the loop's test takes a closing brace after it */
    if (tf_npy_eat(&t, '}')) break;
    st = tf_npy_bad(path, "its header's entries are not separated by commas");
    goto done;
  }
  if (!have_descr || !have_order || !have_shape) {
    st = tf_npy_bad(path, "its header lacks 'descr', 'fortran_order' or 'shape'");
    goto done;
  }
  (void)fortran; /* a 1-D array has the same bytes in either order */
  int found = -1;
  for (int i = 0; i < TF_TOKEN_TYPES_N; i++) {
    const char *want = tf_token_types[i].npy;
    /* '|' and '<' (and '=' on this little-endian host) mean the same for one byte */
    if (strcmp(descr, want) == 0 || (descr[0] == '=' && strcmp(descr + 1, want + 1) == 0) ||
        (tf_token_types[i].bytes == 1 && (descr[0] == '<' || descr[0] == '=') && strcmp(descr + 1, want + 1) == 0))
      found = i;
  }
  if (found < 0) {
    st = tf_fail(TF_ERR_ARG, "%s: the array's dtype '%s' is not a token dtype tfhost reads (" TF_TOKEN_NPY_NAMES
                             "%s)", path, descr, descr[0] == '>' ? "; this one is big-endian" : "");
    goto done;
  }
  if (ndim != 1) {
    st = tf_fail(TF_ERR_ARG, "%s: the array has %d dimensions; tf.data.tokens reads 1-D arrays of tokens "
                             "(flatten it with a.reshape(-1) first)", path, ndim);
    goto done;
  }
  uint64_t data_bytes = file_bytes - start - header_bytes;
  uint64_t item = (uint64_t)tf_token_types[found].bytes;
  if (dims[0] > data_bytes / item || dims[0] * item != data_bytes) {
    st = tf_fail(TF_ERR_IO, "%s: the header says %llu tokens (%llu bytes) but the file holds %llu bytes of data",
                 path, (unsigned long long)dims[0], (unsigned long long)(dims[0] * item),
                 (unsigned long long)data_bytes);
    goto done;
  }
  *type = (tf_token_type)found;
  *count = dims[0];
  *data_offset = start + header_bytes;
done:
  free(text);
  return st;
}

/* ---- opening ----------------------------------------------------------------- */

tf_status tf_token_file_open(const char *path, bool npy, tf_token_type raw_type, tf_token_file **out) {
  *out = NULL;
  if (!npy && !tf_token_type_name(raw_type)) return tf_fail(TF_ERR_ARG, "%s: no such token dtype", path);
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return tf_fail(TF_ERR_IO, "%s: %s", path, strerror(errno));
  struct stat sb;
  tf_status st = TF_OK;
  if (fstat(fd, &sb) != 0) {
    st = tf_fail(TF_ERR_IO, "%s: %s", path, strerror(errno));
    goto fail;
  }
  if (!S_ISREG(sb.st_mode)) {
    st = tf_fail(TF_ERR_IO, "%s: not a regular file%s", path, S_ISDIR(sb.st_mode) ? " (a folder)" : "");
    goto fail;
  }
  uint64_t bytes = (uint64_t)sb.st_size, count = 0, offset = 0;
  tf_token_type type = raw_type;
  if (npy) {
    st = tf_npy_read_header(path, fd, bytes, &type, &count, &offset);
    if (st != TF_OK) goto fail;
  } else {
    int item = tf_token_types[type].bytes;
    if (bytes % (uint64_t)item != 0) {
      st = tf_fail(TF_ERR_IO, "%s: %llu bytes is not a whole number of %s tokens (%d bytes each): another dtype, "
                              "or a file cut short?", path, (unsigned long long)bytes, tf_token_types[type].name,
                   item);
      goto fail;
    }
    count = bytes / (uint64_t)item;
  }
  tf_token_file *f = calloc(1, sizeof *f);
  char *name = strdup(path);
  if (!f || !name) {
    free(f);
    free(name);
    st = tf_fail(TF_ERR_OOM, "out of memory: opening %s", path);
    goto fail;
  }
  f->path = name;
  f->type = type;
  f->item_bytes = tf_token_types[type].bytes;
  f->count = (int64_t)count;
  f->data_offset = offset;
  if (bytes > 0) {
    void *map = mmap(NULL, (size_t)bytes, PROT_READ, MAP_SHARED, fd, 0);
    if (map == MAP_FAILED) {
      st = tf_fail(TF_ERR_IO, "%s: cannot map the file: %s", path, strerror(errno));
      tf_token_file_close(f);
      goto fail;
    }
    /* batches read windows at random places: read-ahead would fetch pages no window wants */
    (void)madvise(map, (size_t)bytes, MADV_RANDOM);
    f->map = map;
    f->map_bytes = bytes;
  }
  close(fd); /* the mapping keeps the file */
  *out = f;
  return TF_OK;
fail:
  close(fd);
  return st;
}

void tf_token_file_close(tf_token_file *f) {
  if (!f) return;
  if (f->map) munmap(f->map, (size_t)f->map_bytes);
  free(f->path);
  free(f);
}

/* ---- reading ----------------------------------------------------------------- */

/* Little-endian loads (the host is little-endian: x86-64, aarch64), through
 * memcpy so that a .npy header of any length leaves no load misaligned. */
#define TF_TOKEN_LOADER(name, ctype)            \
  static inline int64_t name(const void *p) {   \
    ctype v;                                    \
    memcpy(&v, p, sizeof v);                    \
    return (int64_t)v;                          \
  }
TF_TOKEN_LOADER(tf_load_u16, uint16_t)
TF_TOKEN_LOADER(tf_load_u32, uint32_t)
TF_TOKEN_LOADER(tf_load_i16, int16_t)
TF_TOKEN_LOADER(tf_load_i32, int32_t)
TF_TOKEN_LOADER(tf_load_i64, int64_t)

int64_t tf_token_file_at(const tf_token_file *f, int64_t i) {
  const unsigned char *p = (const unsigned char *)f->map + f->data_offset + (uint64_t)i * (uint64_t)f->item_bytes;
  switch (f->type) {
  case TF_TOK_U8: return *p;
  case TF_TOK_U16: return tf_load_u16(p);
  case TF_TOK_U32: return tf_load_u32(p);
  case TF_TOK_I16: return tf_load_i16(p);
  case TF_TOK_I32: return tf_load_i32(p);
  case TF_TOK_I64: return tf_load_i64(p);
  }
  return -1;
}

tf_status tf_token_file_bad_token(const tf_token_file *f, int64_t i, int64_t vocab_size) {
  int64_t v = tf_token_file_at(f, i);
  unsigned long long byte = (unsigned long long)(f->data_offset + (uint64_t)i * (uint64_t)f->item_bytes);
  if (v < 0)
    return tf_fail(TF_ERR_ARG, "%s: token %lld at position %lld (byte %llu) is negative", f->path, (long long)v,
                   (long long)i, byte);
  return tf_fail(TF_ERR_ARG, "%s: token %lld at position %lld (byte %llu) is not below vocab_size %lld", f->path,
                 (long long)v, (long long)i, byte, (long long)vocab_size);
}

/* Tokens from..from+n-1 into dst as i64; returns the position of the first
 * bad one (see tf_token_file_windows), or -1. */
static int64_t tf_token_convert(const tf_token_file *f, int64_t from, int64_t n, int64_t vocab_size, int64_t *dst) {
  uint64_t limit = vocab_size > 0 ? (uint64_t)vocab_size : (uint64_t)INT64_MAX + 1;
  int64_t bad = -1;
  for (int64_t k = 0; k < n; k++) {
    int64_t v = tf_token_file_at(f, from + k);
    dst[k] = v;
    /* a negative value is huge as unsigned: one compare finds both */
    if ((uint64_t)v >= limit && bad < 0) bad = from + k;
  }
  return bad;
}

tf_status tf_token_file_windows(const tf_token_file *f, const int64_t *starts, int64_t rows, int64_t length,
                                int64_t vocab_size, tf_device device, tf_tensor **inputs, tf_tensor **targets) {
  *inputs = *targets = NULL;
  if (rows < 1 || length < 1) return tf_fail(TF_ERR_ARG, "%s: windows need rows >= 1 and length >= 1", f->path);
  for (int64_t r = 0; r < rows; r++) {
    if (starts[r] < 0 || starts[r] > f->count - length - 1)
      return tf_fail(TF_ERR_ARG, "%s: a window of %lld tokens and its target cannot start at %lld: the file has %lld "
                                 "tokens", f->path, (long long)length, (long long)starts[r], (long long)f->count);
  }
  tf_shape shape = {2, {rows, length}};
  TF_TRY(tf_shape_check(&shape));
  bool on_cpu = device.type == TF_DEV_CPU;
  tf_status st = TF_OK;
  int64_t *staging = NULL;
  size_t bytes = sizeof(int64_t) * (size_t)rows * (size_t)length;
  if (!(on_cpu || (staging = malloc(2 * bytes))))
    return tf_fail(TF_ERR_OOM, "out of memory: no %zu-byte host buffer for a batch of %s", 2 * bytes, f->path);
  st = tf_tensor_empty(&shape, TF_I64, device, inputs);
  if (st == TF_OK) st = tf_tensor_empty(&shape, TF_I64, device, targets);
  if (st == TF_OK) {
    int64_t *in = on_cpu ? tf_tensor_data(*inputs) : staging;
    int64_t *tg = on_cpu ? tf_tensor_data(*targets) : staging + rows * length;
    for (int64_t r = 0; r < rows && st == TF_OK; r++) {
      int64_t bad = tf_token_convert(f, starts[r], length, vocab_size, in + r * length);
      memcpy(tg + r * length, in + r * length + 1, sizeof(int64_t) * (size_t)(length - 1));
      int64_t last = tf_token_convert(f, starts[r] + length, 1, vocab_size, tg + r * length + length - 1);
      if (bad < 0) bad = last;
      if (bad >= 0) st = tf_token_file_bad_token(f, bad, vocab_size);
    }
    if (st == TF_OK && !on_cpu) {
      st = tf_tensor_write(*inputs, in, bytes);
      if (st == TF_OK) st = tf_tensor_write(*targets, tg, bytes);
    }
  }
  free(staging);
  if (st != TF_OK) {
    tf_tensor_release(*inputs);
    tf_tensor_release(*targets);
    *inputs = *targets = NULL;
  }
  return st;
}

tf_status tf_token_file_check(const tf_token_file *f, int64_t vocab_size, int64_t *bad) {
  *bad = -1;
  if (f->count == 0) return TF_OK;
  (void)madvise(f->map, (size_t)f->map_bytes, MADV_SEQUENTIAL);
  int64_t chunk[4096];
  for (int64_t from = 0; from < f->count && *bad < 0; from += 4096) {
    int64_t n = f->count - from < 4096 ? f->count - from : 4096;
    *bad = tf_token_convert(f, from, n, vocab_size, chunk);
  }
  (void)madvise(f->map, (size_t)f->map_bytes, MADV_RANDOM);
  return TF_OK;
}
