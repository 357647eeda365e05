/* safetensors files: a hardened reader and an atomic writer.
 *
 * The reader trusts nothing in the file. Sizes are checked against the
 * file's real size before anything is allocated, every JSON field is checked
 * for presence and type, integers must be exact, each tensor's byte count
 * must follow from its shape and dtype, and the byte ranges, sorted, must
 * tile the data buffer with no gap, overlap or trailing byte (the rules of
 * the reference implementation). Only then is data read. */
#ifdef __linux__
#define _GNU_SOURCE /* sync_file_range */
#endif
#include "safetensors.h"

#include <cjson/cJSON.h>
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

#include "backend.h"
#include "device.h"
#include "hex.h"
#include "ops.h"
#include "xxh64.h"

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "safetensors data is little-endian and is copied as is: a little-endian host is required"
#endif

/* Every dtype of the format with its size in bits; tf is the tfhost dtype, or
 * -1 where tfhost has none (the header can still be inspected). */
static const struct {
  const char *name;
  unsigned bits;
  int tf;
} tf_st_dtypes[] = {
    {"F32", 32, TF_F32},   {"F16", 16, TF_F16},   {"BF16", 16, TF_BF16},  {"F64", 64, TF_F64},
    {"I64", 64, TF_I64},   {"I32", 32, TF_I32},   {"BOOL", 8, TF_BOOL},   {"I16", 16, -1},
    {"I8", 8, -1},         {"U8", 8, -1},         {"U16", 16, -1},        {"U32", 32, -1},
    {"U64", 64, -1},       {"F8_E5M2", 8, TF_F8E5M2}, {"F8_E4M3", 8, TF_F8E4M3},     {"F8_E8M0", 8, -1},
    {"F6_E2M3", 6, -1},    {"F6_E3M2", 6, -1},    {"F4", 4, -1},          {"C64", 64, -1},
};
enum { TF_ST_NDTYPES = sizeof tf_st_dtypes / sizeof tf_st_dtypes[0] };
#define TF_ST_SUPPORTED "F32, F16, BF16, F64, I64, I32, BOOL, F8_E4M3 and F8_E5M2"

/* Integers in the header travel as JSON numbers (doubles in cJSON): exact up to 2^53. */
#define TF_ST_MAX_INT 9007199254740992.0

const char *tf_safetensors_dtype_name(tf_dtype d) {
  for (int i = 0; i < TF_ST_NDTYPES; i++)
    if (tf_st_dtypes[i].tf == (int)d) return tf_st_dtypes[i].name;
  return "?";
}

/* ---- messages ------------------------------------------------------------ */

/* Fails with "path: message". */
__attribute__((format(printf, 3, 4))) static tf_status tf_st_fail(tf_status code, const char *path, const char *fmt,
                                                                   ...) {
  char msg[768];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  return tf_fail(code, "%s: %s", path, msg);
}

/* A name from the file, fit for a message: at most 64 bytes shown, control
 * bytes escaped, so a hostile name cannot flood or garble the terminal. */
static const char *tf_st_show(const char *s, char *buf, size_t n) {
  size_t used = 0, shown = 0;
  for (; *s && used + 8 < n; s++, shown++) {
    unsigned char c = (unsigned char)*s;
    if (shown == 64) {
      used += (size_t)snprintf(buf + used, n - used, "...");
      break;
    }
    if (c < 32 || c == 127)
      used += (size_t)snprintf(buf + used, n - used, "\\x%02x", c);
    else
      buf[used++] = (char)c;
  }
  buf[used] = '\0';
  return buf;
}

/* What a JSON value is, for "expected X, found Y" messages. */
static const char *tf_st_describe(const cJSON *v, char *buf, size_t n) {
  if (!v) return "nothing";
  if (cJSON_IsNumber(v)) {
    snprintf(buf, n, "%.17g", v->valuedouble);
    return buf;
  }
  if (cJSON_IsString(v)) return "a string";
  if (cJSON_IsBool(v)) return "a boolean";
  if (cJSON_IsNull(v)) return "null";
  if (cJSON_IsArray(v)) return "an array";
  if (cJSON_IsObject(v)) return "an object";
  return "an unknown value";
}

/* Offset of the first byte that breaks UTF-8 in s[0..n), or n. */
static size_t tf_st_utf8_error(const unsigned char *s, size_t n) {
  size_t i = 0;
  while (i < n) {
    unsigned c = s[i], cp, min;
    size_t len;
    if (c < 0x80) {
      i++;
      continue;
    }
    if ((c & 0xE0) == 0xC0) len = 2, cp = c & 0x1F, min = 0x80;
    else if ((c & 0xF0) == 0xE0) len = 3, cp = c & 0x0F, min = 0x800;
    else if ((c & 0xF8) == 0xF0) len = 4, cp = c & 0x07, min = 0x10000;
    else return i;
    if (n - i < len) return i;
    for (size_t k = 1; k < len; k++) {
      if ((s[i + k] & 0xC0) != 0x80) return i;
      cp = (cp << 6) | (s[i + k] & 0x3F);
    }
    if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return i;
    i += len;
  }
  return n;
}

static bool tf_st_valid_utf8(const char *s) {
  size_t n = strlen(s);
  return tf_st_utf8_error((const unsigned char *)s, n) == n;
}

/* ---- the file's structure -------------------------------------------------- */

void tf_safetensors_free(tf_safetensors_file *f) {
  if (!f) return;
  for (int i = 0; i < f->ntensors; i++) {
    free(f->tensors[i].name);
    tf_tensor_release(f->tensors[i].tensor);
  }
  free(f->tensors);
  for (int i = 0; i < f->nmeta; i++) {
    free(f->meta_keys[i]);
    free(f->meta_values[i]);
  }
  free(f->meta_keys);
  free(f->meta_values);
  free(f);
}

static char *tf_st_strdup(const char *s) {
  size_t n = strlen(s) + 1;
  char *c = malloc(n);
  if (c) memcpy(c, s, n);
  return c;
}

/* A JSON number that is an exact non-negative integer within 2^53. */
static bool tf_st_uint(const cJSON *v, uint64_t *out) {
  if (!cJSON_IsNumber(v)) return false;
  double d = v->valuedouble;
  if (!isfinite(d) || d < 0 || d > TF_ST_MAX_INT || d != floor(d)) return false;
  *out = (uint64_t)d;
  return true;
}

/* Parses one tensor's entry {"dtype", "shape", "data_offsets"} into e. */
static tf_status tf_st_parse_entry(const char *path, const cJSON *item, tf_safetensors_entry *e) {
  char nb[300], vb[64];
  const char *name = tf_st_show(item->string, nb, sizeof nb);
  if (!cJSON_IsObject(item))
    return tf_st_fail(TF_ERR_IO, path, "tensor '%s': expected an object with dtype, shape and data_offsets, found %s",
                      name, tf_st_describe(item, vb, sizeof vb));
  const cJSON *dtype = NULL, *shape = NULL, *offsets = NULL;
  for (const cJSON *f = item->child; f; f = f->next) {
    const cJSON **slot = strcmp(f->string, "dtype") == 0          ? &dtype
                         : strcmp(f->string, "shape") == 0        ? &shape
                         : strcmp(f->string, "data_offsets") == 0 ? &offsets
                                                                  : NULL;
    if (!slot) continue; /* unknown fields are ignored, as by the reference reader */
    if (*slot) return tf_st_fail(TF_ERR_IO, path, "tensor '%s' has two \"%s\" fields", name, f->string);
    *slot = f;
  }
  if (!dtype) return tf_st_fail(TF_ERR_IO, path, "tensor '%s' has no \"dtype\"", name);
  if (!shape) return tf_st_fail(TF_ERR_IO, path, "tensor '%s' has no \"shape\"", name);
  if (!offsets) return tf_st_fail(TF_ERR_IO, path, "tensor '%s' has no \"data_offsets\"", name);

  if (!cJSON_IsString(dtype))
    return tf_st_fail(TF_ERR_IO, path, "tensor '%s': \"dtype\" must be a string, found %s", name,
                      tf_st_describe(dtype, vb, sizeof vb));
  int di = -1;
  for (int i = 0; i < TF_ST_NDTYPES && di < 0; i++)
    if (strcmp(dtype->valuestring, tf_st_dtypes[i].name) == 0) di = i;
  if (di < 0) {
    char db[300];
    return tf_st_fail(TF_ERR_IO, path, "tensor '%s' has unknown dtype '%s'", name,
                      tf_st_show(dtype->valuestring, db, sizeof db));
  }
  e->file_dtype = tf_st_dtypes[di].name;
  e->supported = tf_st_dtypes[di].tf >= 0;
  e->dtype = e->supported ? (tf_dtype)tf_st_dtypes[di].tf : TF_F32;

  if (!cJSON_IsArray(shape))
    return tf_st_fail(TF_ERR_IO, path, "tensor '%s': \"shape\" must be an array, found %s", name,
                      tf_st_describe(shape, vb, sizeof vb));
  int ndim = cJSON_GetArraySize(shape);
  if (ndim > TF_MAX_DIMS)
    return tf_st_fail(TF_ERR_IO, path, "tensor '%s' has %d dimensions; tfhost supports at most %d", name, ndim,
                      TF_MAX_DIMS);
  e->shape.ndim = 0;
  uint64_t numel = 1;
  bool overflow = false;
  for (const cJSON *d = shape->child; d; d = d->next) {
    uint64_t v;
    if (!tf_st_uint(d, &v))
      return tf_st_fail(TF_ERR_IO, path, "tensor '%s': dimension %d of its shape is %s, not a non-negative integer",
                        name, e->shape.ndim, tf_st_describe(d, vb, sizeof vb));
    e->shape.dims[e->shape.ndim++] = (int64_t)v;
    if (v && numel > (UINT64_MAX / 64) / v) overflow = true;
    numel *= v;
  }
  char sb[256];
  tf_shape_format(&e->shape, sb, sizeof sb);
  if (overflow || tf_shape_check(&e->shape) != TF_OK)
    return tf_st_fail(TF_ERR_IO, path, "tensor '%s': shape %s has too many elements", name, sb);

  if (!cJSON_IsArray(offsets) || cJSON_GetArraySize(offsets) != 2)
    return tf_st_fail(TF_ERR_IO, path, "tensor '%s': \"data_offsets\" must be an array [begin, end], found %s", name,
                      cJSON_IsArray(offsets) ? "an array of another length" : tf_st_describe(offsets, vb, sizeof vb));
  const cJSON *ob = offsets->child, *oe = ob->next;
  if (!tf_st_uint(ob, &e->begin))
    return tf_st_fail(TF_ERR_IO, path, "tensor '%s': data_offsets begin is %s, not a non-negative integer", name,
                      tf_st_describe(ob, vb, sizeof vb));
  if (!tf_st_uint(oe, &e->end))
    return tf_st_fail(TF_ERR_IO, path, "tensor '%s': data_offsets end is %s, not a non-negative integer", name,
                      tf_st_describe(oe, vb, sizeof vb));
  if (e->begin > e->end)
    return tf_st_fail(TF_ERR_IO, path, "tensor '%s': data_offsets [%llu, %llu] end before they begin", name,
                      (unsigned long long)e->begin, (unsigned long long)e->end);
  uint64_t bits = numel * tf_st_dtypes[di].bits;
  if (bits % 8)
    return tf_st_fail(TF_ERR_IO, path, "tensor '%s': shape %s of %s is not a whole number of bytes", name, sb,
                      e->file_dtype);
  if (bits / 8 != e->end - e->begin)
    return tf_st_fail(TF_ERR_IO, path,
                      "tensor '%s': shape %s of %s needs %llu bytes, but data_offsets [%llu, %llu] hold %llu", name, sb,
                      e->file_dtype, (unsigned long long)(bits / 8), (unsigned long long)e->begin,
                      (unsigned long long)e->end, (unsigned long long)(e->end - e->begin));
  return TF_OK;
}

/* Parses __metadata__: an object of strings (or null). */
static tf_status tf_st_parse_metadata(const char *path, const cJSON *item, tf_safetensors_file *f) {
  char vb[64], kb[300];
  if (cJSON_IsNull(item)) return TF_OK;
  if (!cJSON_IsObject(item))
    return tf_st_fail(TF_ERR_IO, path, "__metadata__ must be an object of strings, found %s",
                      tf_st_describe(item, vb, sizeof vb));
  int n = cJSON_GetArraySize(item);
  f->meta_keys = calloc((size_t)n + 1, sizeof *f->meta_keys);
  f->meta_values = calloc((size_t)n + 1, sizeof *f->meta_values);
  if (!f->meta_keys || !f->meta_values) return tf_fail(TF_ERR_OOM, "out of memory: reading %s", path);
  for (const cJSON *m = item->child; m; m = m->next) {
    if (!cJSON_IsString(m))
      return tf_st_fail(TF_ERR_IO, path, "__metadata__ value of '%s' must be a string, found %s",
                        tf_st_show(m->string, kb, sizeof kb), tf_st_describe(m, vb, sizeof vb));
    for (int i = 0; i < f->nmeta; i++)
      if (strcmp(f->meta_keys[i], m->string) == 0)
        return tf_st_fail(TF_ERR_IO, path, "__metadata__ key '%s' appears twice", tf_st_show(m->string, kb, sizeof kb));
    f->meta_keys[f->nmeta] = tf_st_strdup(m->string);
    f->meta_values[f->nmeta] = tf_st_strdup(m->valuestring);
    if (!f->meta_keys[f->nmeta++] || !f->meta_values[f->nmeta - 1])
      return tf_fail(TF_ERR_OOM, "out of memory: reading %s", path);
  }
  return TF_OK;
}

static int tf_st_cmp_name(const void *a, const void *b) {
  const tf_safetensors_entry *x = a, *y = b;
  return strcmp(x->name, y->name);
}

/* Data order; names (unique by then) order empty tensors at one offset. */
static int tf_st_cmp_offsets(const void *a, const void *b) {
  const tf_safetensors_entry *x = a, *y = b;
  if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
  if (x->end != y->end) return x->end < y->end ? -1 : 1;
  return strcmp(x->name, y->name);
}

/* Fills f's entries from the parsed header and checks that the byte ranges
 * tile a data buffer of data_len bytes. */
static tf_status tf_st_parse_header(const char *path, const cJSON *root, uint64_t data_len, tf_safetensors_file *f) {
  int count = cJSON_GetArraySize(root);
  f->tensors = calloc((size_t)count + 1, sizeof *f->tensors);
  if (!f->tensors) return tf_fail(TF_ERR_OOM, "out of memory: reading %s", path);
  bool seen_meta = false;
  for (const cJSON *item = root->child; item; item = item->next) {
    if (strcmp(item->string, "__metadata__") == 0) {
      if (seen_meta) return tf_st_fail(TF_ERR_IO, path, "__metadata__ appears twice in the header");
      seen_meta = true;
      TF_TRY(tf_st_parse_metadata(path, item, f));
      continue;
    }
    tf_safetensors_entry *e = &f->tensors[f->ntensors];
    if (!(e->name = tf_st_strdup(item->string))) return tf_fail(TF_ERR_OOM, "out of memory: reading %s", path);
    f->ntensors++;
    TF_TRY(tf_st_parse_entry(path, item, e));
  }
  char nb[300], nb2[300];
  if (f->ntensors > 1) {
    qsort(f->tensors, (size_t)f->ntensors, sizeof *f->tensors, tf_st_cmp_name);
    for (int i = 1; i < f->ntensors; i++)
      if (strcmp(f->tensors[i - 1].name, f->tensors[i].name) == 0)
        return tf_st_fail(TF_ERR_IO, path, "tensor '%s' appears twice in the header",
                          tf_st_show(f->tensors[i].name, nb, sizeof nb));
  }
  qsort(f->tensors, (size_t)f->ntensors, sizeof *f->tensors, tf_st_cmp_offsets);
  uint64_t pos = 0;
  for (int i = 0; i < f->ntensors; i++) {
    const tf_safetensors_entry *e = &f->tensors[i];
    const char *name = tf_st_show(e->name, nb, sizeof nb);
    if (e->end > data_len)
      return tf_st_fail(TF_ERR_IO, path,
                        "tensor '%s': data_offsets [%llu, %llu] go past the end of the data "
                        "(%llu bytes; truncated file?)",
                        name, (unsigned long long)e->begin, (unsigned long long)e->end, (unsigned long long)data_len);
    if (e->begin < pos)
      return tf_st_fail(TF_ERR_IO, path,
                        "tensor '%s': data_offsets [%llu, %llu] overlap tensor '%s' (which ends at %llu)",
                        name, (unsigned long long)e->begin, (unsigned long long)e->end,
                        tf_st_show(f->tensors[i - 1].name, nb2, sizeof nb2), (unsigned long long)pos);
    if (e->begin > pos)
      return tf_st_fail(TF_ERR_IO, path, "data bytes [%llu, %llu) belong to no tensor (a gap before tensor '%s')",
                        (unsigned long long)pos, (unsigned long long)e->begin, name);
    pos = e->end;
  }
  if (pos != data_len)
    return tf_st_fail(TF_ERR_IO, path, "%llu trailing bytes after the last tensor's data",
                      (unsigned long long)(data_len - pos));
  return TF_OK;
}

/* ---- checksums ------------------------------------------------------------------ */

/* tfhost writes, under this metadata key, the XXH64 of each tensor's bytes
 * as 16 hex digits, comma-separated, in the order of the data; a reader
 * checks every tensor it reads against it. Other writers leave it out (and
 * nothing is checked); Python's readers carry it as any metadata. */
#define TF_ST_CHECKSUM_KEY "tfhost.xxh64"
enum { TF_ST_HEX = 16 };

/* Reads the checksums of the metadata into f's entries (data order). */
static tf_status tf_st_parse_checksums(const char *path, tf_safetensors_file *f) {
  const char *v = NULL;
  for (int i = 0; i < f->nmeta; i++)
    if (strcmp(f->meta_keys[i], TF_ST_CHECKSUM_KEY) == 0) v = f->meta_values[i];
  if (!v) return TF_OK;
  const size_t want = f->ntensors ? (size_t)f->ntensors * (TF_ST_HEX + 1) - 1 : 0;
  if (strlen(v) != want)
    return tf_st_fail(TF_ERR_IO, path, "the metadata's " TF_ST_CHECKSUM_KEY " holds %zu characters where %d tensors "
                      "need %zu (a damaged header)", strlen(v), f->ntensors, want);
  for (int i = 0; i < f->ntensors; i++) {
    const char *h = v + (size_t)i * (TF_ST_HEX + 1);
    uint64_t x = 0;
    if (!tf_hex16_parse(h, &x))
      return tf_st_fail(TF_ERR_IO, path, "the metadata's " TF_ST_CHECKSUM_KEY " is not hex digits (a damaged header)");
    if (i + 1 < f->ntensors && h[TF_ST_HEX] != ',')
      return tf_st_fail(TF_ERR_IO, path, "the metadata's " TF_ST_CHECKSUM_KEY " is not comma-separated (a damaged header)");
    f->tensors[i].checksum = x;
    f->tensors[i].has_checksum = true;
  }
  return TF_OK;
}

/* ---- moving tensors' bytes, several at a time ------------------------------------------ */

/* Tensors move between the file and their memory in chunks, one tensor per
 * worker at a time and several workers at once, so that the disk sees
 * several requests, the checksums are worked out on several cores, and a
 * GPU tensor's chunks go through a page-locked buffer of the worker's own
 * (the bus's full rate) while other workers read or write. Each tensor's
 * checksum is its bytes hashed in order, whatever worker moves it. */
enum { TF_ST_CHUNK = 32u << 20, TF_ST_WORKERS = 8 };

typedef struct tf_st_pool tf_st_pool;
/* Moves item i; buf is the worker's page-locked chunk (NULL when no item is on a device). */
typedef tf_status (*tf_st_task)(tf_st_pool *p, int i, unsigned char *buf);
struct tf_st_pool {
  int items, next;
  tf_st_task task;
  void *job;
  bool staged;          /* some item is on a device: every worker gets a chunk of page-locked memory */
  tf_device device;     /* the device whose backend makes it */
  pthread_mutex_t lock;
  tf_status status;     /* the first failure, and its message */
  char message[1024];
};

static void tf_st_pool_fail(tf_st_pool *p, tf_status st) {
  pthread_mutex_lock(&p->lock);
  if (p->status == TF_OK) {
    p->status = st;
    snprintf(p->message, sizeof p->message, "%s", tf_last_error());
  }
  pthread_mutex_unlock(&p->lock);
}

static void *tf_st_worker(void *arg) {
  tf_st_pool *p = arg;
  unsigned char *buf = NULL;
  tf_status st = p->staged ? tf_device_host_alloc(p->device, TF_ST_CHUNK, (void **)&buf) : TF_OK;
  while (st == TF_OK) {
    pthread_mutex_lock(&p->lock);
    int i = p->status == TF_OK && p->next < p->items ? p->next++ : -1;
    pthread_mutex_unlock(&p->lock);
    if (i < 0) break;
    st = p->task(p, i, buf);
  }
  if (st != TF_OK) tf_st_pool_fail(p, st);
  if (buf) tf_device_host_free(p->device, buf);
  return NULL;
}

/* Runs the pool's items on up to TF_ST_WORKERS threads (this one among them). */
static tf_status tf_st_pool_run(tf_st_pool *p) {
  pthread_mutex_init(&p->lock, NULL);
  p->status = TF_OK;
  int n = p->items < TF_ST_WORKERS ? p->items : TF_ST_WORKERS;
  pthread_t threads[TF_ST_WORKERS];
  int started = 0;
  for (; started < n - 1; started++)
    if (pthread_create(&threads[started], NULL, tf_st_worker, p) != 0) break; /* fewer workers, then */
  tf_st_worker(p);
  for (int i = 0; i < started; i++) pthread_join(threads[i], NULL);
  pthread_mutex_destroy(&p->lock);
  return p->status == TF_OK ? TF_OK : tf_fail(p->status, "%s", p->message);
}

/* The device of the first item not on the CPU, if any (for the page-locked chunks). */
static void tf_st_pool_device(tf_st_pool *p, tf_tensor *const *tensors, int n) {
  for (int i = 0; i < n && !p->staged; i++)
    if (tensors[i] && tensors[i]->device.type != TF_DEV_CPU) {
      p->staged = true;
      p->device = tensors[i]->device;
    }
}

/* Copies len bytes between the memory of tensor t's device and the host, as backend.h's copy does. */
static tf_status tf_st_device_copy(const tf_tensor *t, void *dst, const void *src, size_t len, tf_copy_dir dir) {
  tf_device_ctx *ctx;
  TF_TRY(tf_device_ctx_get(t->device, &ctx));
  return ctx->backend->copy(ctx, dst, src, len, dir);
}

/* Reading: the entries from[i] of the file into the tensors dsts[i]. */
typedef struct tf_st_read_job {
  const char *path;
  int fd;
  uint64_t data_start;
  const tf_safetensors_entry *const *from;
  tf_tensor *const *dsts;
} tf_st_read_job;

static tf_status tf_st_pread(const char *path, int fd, void *dst, size_t len, uint64_t at, const char *name) {
  char nb[300];
  for (size_t done = 0; done < len;) {
    ssize_t got = pread(fd, (char *)dst + done, len - done, (off_t)(at + done));
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0)
      return tf_st_fail(TF_ERR_IO, path, "cannot read the data of tensor '%s': %s", tf_st_show(name, nb, sizeof nb),
                        got < 0 ? strerror(errno) : "unexpected end of file (was the file changed while reading?)");
    done += (size_t)got;
  }
  return TF_OK;
}

static tf_status tf_st_read_task(tf_st_pool *p, int i, unsigned char *buf) {
  const tf_st_read_job *j = p->job;
  const tf_safetensors_entry *e = j->from[i];
  tf_tensor *dst = j->dsts[i];
  const size_t n = (size_t)(e->end - e->begin);
  unsigned char *mem = tf_tensor_data(dst);
  const bool on_cpu = dst->device.type == TF_DEV_CPU;
  tf_xxh64_state h;
  tf_xxh64_init(&h, 0);
  /* the kernel reads the whole tensor ahead while the chunks are hashed and copied */
  (void)posix_fadvise(j->fd, (off_t)(j->data_start + e->begin), (off_t)n, POSIX_FADV_WILLNEED);
  for (size_t off = 0; off < n; off += TF_ST_CHUNK) {
    const size_t len = n - off < TF_ST_CHUNK ? n - off : TF_ST_CHUNK;
    unsigned char *into = on_cpu ? mem + off : buf;
    TF_TRY(tf_st_pread(j->path, j->fd, into, len, j->data_start + e->begin + off, e->name));
    if (e->has_checksum) tf_xxh64_update(&h, into, len);
    if (!on_cpu) TF_TRY(tf_st_device_copy(dst, mem + off, buf, len, TF_COPY_H2D));
  }
  char nb[300];
  if (e->has_checksum && tf_xxh64_digest(&h) != e->checksum)
    return tf_st_fail(TF_ERR_IO, j->path,
                      "tensor '%s': its %zu bytes do not match the checksum written with them (the file is damaged)",
                      tf_st_show(e->name, nb, sizeof nb), n);
  return TF_OK;
}

/* Reads n entries of an open file into their tensors, several at a time. */
static tf_status tf_st_read_all(const char *path, FILE *fh, uint64_t data_start, const tf_safetensors_entry *const *from,
                                tf_tensor *const *dsts, int n) {
  tf_st_read_job job = {path, fileno(fh), data_start, from, dsts};
  (void)posix_fadvise(job.fd, 0, 0, POSIX_FADV_SEQUENTIAL);
  tf_st_pool pool = {.items = n, .task = tf_st_read_task, .job = &job};
  tf_st_pool_device(&pool, dsts, n);
  return tf_st_pool_run(&pool);
}

/* ---- reading ------------------------------------------------------------------ */

/* Opens path and checks its header; on success *fp is positioned anywhere and
 * *data_start is the file offset of the data buffer. */
static tf_status tf_st_open(const char *path, FILE **fp, tf_safetensors_file **out, uint64_t *data_start) {
  *fp = NULL;
  *out = NULL;
  FILE *fh = fopen(path, "rb");
  if (!fh) return tf_st_fail(TF_ERR_IO, path, "cannot open: %s", strerror(errno));
  struct stat sb;
  if (fstat(fileno(fh), &sb) != 0) {
    int err = errno;
    fclose(fh);
    return tf_st_fail(TF_ERR_IO, path, "cannot stat: %s", strerror(err));
  }
  if (!S_ISREG(sb.st_mode)) {
    fclose(fh);
    return tf_st_fail(TF_ERR_IO, path, "not a regular file");
  }
  uint64_t size = (uint64_t)sb.st_size;
  unsigned char lenbuf[8];
  if (size < 8 || fread(lenbuf, 1, 8, fh) != 8) {
    fclose(fh);
    return tf_st_fail(TF_ERR_IO, path, "file is %llu bytes, too short for a safetensors file (truncated?)",
                      (unsigned long long)size);
  }
  uint64_t hlen = 0;
  for (int i = 7; i >= 0; i--) hlen = hlen << 8 | lenbuf[i];
  tf_status st = TF_OK;
  if (hlen > TF_SAFETENSORS_MAX_HEADER)
    st = tf_st_fail(TF_ERR_IO, path, "header length %llu is larger than the %u-byte limit (not a safetensors file?)",
                    (unsigned long long)hlen, TF_SAFETENSORS_MAX_HEADER);
  else if (hlen > size - 8)
    st = tf_st_fail(TF_ERR_IO, path,
                    "header length %llu is larger than the %llu bytes that follow it (truncated file?)",
                    (unsigned long long)hlen, (unsigned long long)(size - 8));
  else if (hlen < 2)
    st = tf_st_fail(TF_ERR_IO, path, "header length %llu is too small for a JSON object", (unsigned long long)hlen);
  if (st != TF_OK) {
    fclose(fh);
    return st;
  }
  /* One byte more, zeroed: the parser never sees unterminated text. */
  char *text = calloc(hlen + 1, 1);
  cJSON *root = NULL;
  tf_safetensors_file *f = NULL;
  if (!text) {
    st = tf_fail(TF_ERR_OOM, "out of memory: no room for the %llu-byte header of %s", (unsigned long long)hlen, path);
    goto done;
  }
  if (fread(text, 1, hlen, fh) != hlen) {
    st = tf_st_fail(TF_ERR_IO, path, "cannot read the header: %s",
                    ferror(fh) ? strerror(errno) : "unexpected end of file");
    goto done;
  }
  size_t bad = tf_st_utf8_error((const unsigned char *)text, hlen);
  if (bad != hlen) {
    st = tf_st_fail(TF_ERR_IO, path, "header is not valid UTF-8 (byte %zu of the header)", bad + 1);
    goto done;
  }
  const char *end = NULL;
  root = cJSON_ParseWithLengthOpts(text, hlen, &end, 0);
  if (!root) {
    const char *at = cJSON_GetErrorPtr();
    size_t off = at && at >= text && at <= text + hlen ? (size_t)(at - text) : 0;
    char near[40];
    tf_st_show(text + off, near, 24);
    st = tf_st_fail(TF_ERR_IO, path, "header is not valid JSON (at byte %zu of the header, near '%s')", off + 1, near);
    goto done;
  }
  while (end && end < text + hlen && *end && strchr(" \t\r\n", *end)) end++;
  if (end && end < text + hlen) {
    char near[40];
    st = tf_st_fail(TF_ERR_IO, path, "header has bytes after its JSON object (at byte %zu of the header, near '%s')",
                    (size_t)(end - text) + 1, tf_st_show(end, near, 24));
    goto done;
  }
  if (!cJSON_IsObject(root)) {
    char vb[64];
    st = tf_st_fail(TF_ERR_IO, path, "header must be a JSON object, found %s", tf_st_describe(root, vb, sizeof vb));
    goto done;
  }
  if (!(f = calloc(1, sizeof *f))) {
    st = tf_fail(TF_ERR_OOM, "out of memory: reading %s", path);
    goto done;
  }
  st = tf_st_parse_header(path, root, size - 8 - hlen, f);
  if (st == TF_OK) st = tf_st_parse_checksums(path, f);
done:
  cJSON_Delete(root);
  free(text);
  if (st != TF_OK) {
    tf_safetensors_free(f);
    fclose(fh);
    return st;
  }
  *fp = fh;
  *out = f;
  *data_start = 8 + hlen;
  return TF_OK;
}

tf_status tf_safetensors_read_header(const char *path, tf_safetensors_file **out) {
  FILE *fh;
  uint64_t data_start;
  TF_TRY(tf_st_open(path, &fh, out, &data_start));
  fclose(fh);
  return TF_OK;
}

tf_status tf_safetensors_read(const char *path, tf_device device, tf_safetensors_file **out) {
  *out = NULL;
  tf_device_ctx *ctx;
  tf_status st = tf_device_ctx_get(device, &ctx);
  if (st != TF_OK) {
    tf_fail_context("%s", path);
    return st;
  }
  FILE *fh;
  tf_safetensors_file *f;
  uint64_t data_start;
  TF_TRY(tf_st_open(path, &fh, &f, &data_start));
  char nb[300];
  for (int i = 0; i < f->ntensors && st == TF_OK; i++) {
    const tf_safetensors_entry *e = &f->tensors[i];
    if (!e->supported) {
      char lower[16];
      size_t k = 0;
      for (; e->file_dtype[k] && k + 1 < sizeof lower; k++) lower[k] = (char)tolower((unsigned char)e->file_dtype[k]);
      lower[k] = '\0';
      st = tf_st_fail(TF_ERR_ARG, path,
                      "tensor '%s' has dtype %s, which tfhost cannot load (it has no %s dtype; it reads %s)",
                      tf_st_show(e->name, nb, sizeof nb), e->file_dtype, lower, TF_ST_SUPPORTED);
    }
  }
  for (int i = 0; i < f->ntensors && st == TF_OK; i++)
    st = tf_tensor_empty(&f->tensors[i].shape, f->tensors[i].dtype, device, &f->tensors[i].tensor);
  const tf_safetensors_entry **from = st == TF_OK ? calloc((size_t)f->ntensors + 1, sizeof *from) : NULL;
  tf_tensor **dsts = from ? calloc((size_t)f->ntensors + 1, sizeof *dsts) : NULL;
  if (st == TF_OK && !dsts) st = tf_fail(TF_ERR_OOM, "out of memory: reading %s", path);
  for (int i = 0; st == TF_OK && i < f->ntensors; i++) {
    from[i] = &f->tensors[i];
    dsts[i] = f->tensors[i].tensor;
  }
  if (st == TF_OK) st = tf_st_read_all(path, fh, data_start, from, dsts, f->ntensors);
  free(from);
  free(dsts);
  fclose(fh);
  if (st != TF_OK) {
    tf_safetensors_free(f);
    return st;
  }
  *out = f;
  return TF_OK;
}

/* The entry of f named name, or NULL. */
static const tf_safetensors_entry *tf_st_entry(const tf_safetensors_file *f, const char *name) {
  for (int i = 0; i < f->ntensors; i++)
    if (strcmp(f->tensors[i].name, name) == 0) return &f->tensors[i];
  return NULL;
}

/* Checks that tensor name of the file fits dst (dtype, shape, contiguous). */
static tf_status tf_st_fits(const char *path, const tf_safetensors_entry *e, const char *name, const tf_tensor *dst) {
  char nb[300], a[128], b[128];
  if (!e) return tf_st_fail(TF_ERR_ARG, path, "has no tensor '%s'", tf_st_show(name, nb, sizeof nb));
  if (!e->supported || e->dtype != dst->dtype)
    return tf_st_fail(TF_ERR_ARG, path, "tensor '%s' is %s, not %s", tf_st_show(name, nb, sizeof nb), e->file_dtype,
                      tf_safetensors_dtype_name(dst->dtype));
  tf_shape want = tf_tensor_shape(dst);
  bool same = want.ndim == e->shape.ndim;
  for (int d = 0; same && d < want.ndim; d++) same = want.dims[d] == e->shape.dims[d];
  if (!same)
    return tf_st_fail(TF_ERR_ARG, path, "tensor '%s' has shape %s, not %s", tf_st_show(name, nb, sizeof nb),
                      tf_shape_format(&e->shape, a, sizeof a), tf_shape_format(&want, b, sizeof b));
  if (!tf_tensor_is_contiguous(dst))
    return tf_st_fail(TF_ERR_ARG, path, "tensor '%s': the tensor to read it into is not contiguous",
                      tf_st_show(name, nb, sizeof nb));
  return TF_OK;
}

tf_status tf_safetensors_read_into(const char *path, const char *const *names, tf_tensor *const *dsts, int n,
                                   tf_safetensors_file **header) {
  if (header) *header = NULL;
  FILE *fh;
  tf_safetensors_file *f;
  uint64_t data_start;
  TF_TRY(tf_st_open(path, &fh, &f, &data_start));
  tf_status st = TF_OK;
  const tf_safetensors_entry **from = calloc((size_t)n + 1, sizeof *from);
  if (!from) st = tf_fail(TF_ERR_OOM, "out of memory: reading %s", path);
  for (int i = 0; st == TF_OK && i < n; i++) {
    from[i] = tf_st_entry(f, names[i]);
    st = tf_st_fits(path, from[i], names[i], dsts[i]);
  }
  if (st == TF_OK) st = tf_st_read_all(path, fh, data_start, from, dsts, n);
  for (int i = 0; st == TF_OK && i < n; i++) dsts[i]->storage->version++; /* written in place */
  free(from);
  fclose(fh);
  if (st == TF_OK && header) {
    *header = f;
    return TF_OK;
  }
  tf_safetensors_free(f);
  return st;
}

/* ---- writing ------------------------------------------------------------------ */

static int tf_st_cmp_str(const void *a, const void *b) {
  return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* First duplicate among n strings, or NULL. */
static const char *tf_st_find_duplicate(const char *const *s, int n, tf_status *st) {
  *st = TF_OK;
  if (n < 2) return NULL;
  const char **sorted = malloc(sizeof *sorted * (size_t)n);
  if (!sorted) {
    *st = tf_fail(TF_ERR_OOM, "out of memory: checking names");
    return NULL;
  }
  memcpy(sorted, s, sizeof *sorted * (size_t)n);
  qsort(sorted, (size_t)n, sizeof *sorted, tf_st_cmp_str);
  const char *dup = NULL;
  for (int i = 1; i < n && !dup; i++)
    if (strcmp(sorted[i - 1], sorted[i]) == 0) dup = sorted[i];
  free(sorted);
  return dup;
}

static tf_status tf_st_check_write_args(const char *path, const char *const *names, tf_tensor *const *tensors, int n,
                                        const char *const *meta_keys, const char *const *meta_values, int nmeta) {
  char nb[300];
  if (n < 0 || nmeta < 0 || (n > 0 && (!names || !tensors)) || (nmeta > 0 && (!meta_keys || !meta_values)))
    return tf_st_fail(TF_ERR_ARG, path, "invalid tensor or metadata lists");
  for (int i = 0; i < n; i++) {
    if (!names[i] || !tensors[i]) return tf_st_fail(TF_ERR_ARG, path, "tensor %d has no name or no tensor", i + 1);
    if (!tf_st_valid_utf8(names[i]))
      return tf_st_fail(TF_ERR_ARG, path, "tensor name '%s' is not valid UTF-8", tf_st_show(names[i], nb, sizeof nb));
    if (strcmp(names[i], "__metadata__") == 0)
      return tf_st_fail(TF_ERR_ARG, path, "a tensor cannot be named __metadata__ (the format reserves it)");
    if ((unsigned)tensors[i]->dtype >= TF_NDTYPES)
      return tf_st_fail(TF_ERR_ARG, path, "tensor '%s' has an invalid dtype", tf_st_show(names[i], nb, sizeof nb));
  }
  for (int i = 0; i < nmeta; i++) {
    if (!meta_keys[i] || !meta_values[i]) return tf_st_fail(TF_ERR_ARG, path, "metadata entry %d is missing", i + 1);
    if (!tf_st_valid_utf8(meta_keys[i]) || !tf_st_valid_utf8(meta_values[i]))
      return tf_st_fail(TF_ERR_ARG, path, "metadata '%s' is not valid UTF-8", tf_st_show(meta_keys[i], nb, sizeof nb));
  }
  tf_status st;
  const char *dup = tf_st_find_duplicate(names, n, &st);
  TF_TRY(st);
  if (dup) return tf_st_fail(TF_ERR_ARG, path, "tensor name '%s' is given twice", tf_st_show(dup, nb, sizeof nb));
  dup = tf_st_find_duplicate(meta_keys, nmeta, &st);
  TF_TRY(st);
  if (dup) return tf_st_fail(TF_ERR_ARG, path, "metadata key '%s' is given twice", tf_st_show(dup, nb, sizeof nb));
  return TF_OK;
}

static cJSON *tf_st_json_uint(uint64_t v) {
  char buf[32];
  snprintf(buf, sizeof buf, "%llu", (unsigned long long)v);
  return cJSON_CreateRaw(buf);
}

/* The header's JSON text (compact, like the Python library's), or NULL when
 * out of memory. */
static char *tf_st_header_json(const char *const *names, tf_tensor *const *tensors, const uint64_t *offsets, int n,
                               const char *const *meta_keys, const char *const *meta_values, int nmeta,
                               bool checksums) {
  cJSON *root = cJSON_CreateObject();
  bool ok = root != NULL;
  const bool sums = checksums && n > 0;
  /* The checksums' place, zeros until the data is written (tf_st_put_checksums). */
  char *zeros = sums ? calloc((size_t)n * (TF_ST_HEX + 1) + 1, 1) : NULL;
  ok = ok && (zeros || !sums);
  for (int i = 0; ok && sums && i < n; i++) {
    memset(zeros + (size_t)i * (TF_ST_HEX + 1), '0', TF_ST_HEX);
    if (i + 1 < n) zeros[(size_t)i * (TF_ST_HEX + 1) + TF_ST_HEX] = ',';
  }
  if (ok && (sums || nmeta > 0)) {
    cJSON *meta = cJSON_CreateObject();
    ok = cJSON_AddItemToObject(root, "__metadata__", meta);
    if (!ok) cJSON_Delete(meta);
    for (int i = 0; ok && i < nmeta; i++) /* checksums given (from a file read before) make way for the new ones */
      if (strcmp(meta_keys[i], TF_ST_CHECKSUM_KEY) != 0)
        ok = cJSON_AddStringToObject(meta, meta_keys[i], meta_values[i]) != NULL;
    if (ok && sums) ok = cJSON_AddStringToObject(meta, TF_ST_CHECKSUM_KEY, zeros) != NULL;
  }
  free(zeros);
  for (int i = 0; ok && i < n; i++) {
    const tf_tensor *t = tensors[i];
    cJSON *entry = cJSON_CreateObject();
    if (!(ok = cJSON_AddItemToObject(root, names[i], entry))) {
      cJSON_Delete(entry);
      break;
    }
    ok = cJSON_AddStringToObject(entry, "dtype", tf_safetensors_dtype_name(t->dtype)) != NULL;
    cJSON *shape = ok ? cJSON_AddArrayToObject(entry, "shape") : NULL;
    cJSON *range = shape ? cJSON_AddArrayToObject(entry, "data_offsets") : NULL;
    ok = range != NULL;
    for (int d = 0; ok && d < t->ndim; d++) ok = cJSON_AddItemToArray(shape, tf_st_json_uint((uint64_t)t->shape[d]));
    if (ok) ok = cJSON_AddItemToArray(range, tf_st_json_uint(offsets[i]));
    if (ok) ok = cJSON_AddItemToArray(range, tf_st_json_uint(offsets[i] + tf_tensor_nbytes(t)));
  }
  char *text = ok ? cJSON_PrintUnformatted(root) : NULL;
  cJSON_Delete(root);
  return text;
}

/* The n checksums written into their place in the header text (the digits
 * the zeros held: the header's length stays the same). */
static void tf_st_put_checksums(char *json, const uint64_t *sums, int n) {
  if (n == 0) return;
  char *at = strstr(json, "\"" TF_ST_CHECKSUM_KEY "\":\"");
  if (!at) return; /* not reached: tf_st_header_json wrote the key */
  at += strlen("\"" TF_ST_CHECKSUM_KEY "\":\"");
  for (int i = 0; i < n; i++) {
    char hex[TF_ST_HEX + 1];
    snprintf(hex, sizeof hex, "%016llx", (unsigned long long)sums[i]);
    memcpy(at + (size_t)i * (TF_ST_HEX + 1), hex, TF_ST_HEX);
  }
}

/* Writing: the tensors (contiguous) at their offsets of the data, their checksums into sums. */
typedef struct tf_st_write_job {
  const char *path;
  int fd;
  uint64_t data_start;
  tf_tensor *const *tensors;
  const char *const *names;
  const uint64_t *offsets;
  uint64_t *sums;
} tf_st_write_job;

/* Writes len bytes at offset at: those of tensor name (NULL: the header). */
static tf_status tf_st_pwrite(const char *path, int fd, const void *src, size_t len, uint64_t at, const char *name) {
  char nb[300];
  for (size_t done = 0; done < len;) {
    ssize_t put = pwrite(fd, (const char *)src + done, len - done, (off_t)(at + done));
    if (put < 0 && errno == EINTR) continue;
    if (put <= 0 && !name)
      return tf_st_fail(TF_ERR_IO, path, "cannot write the header: %s", put < 0 ? strerror(errno) : "nothing written");
    if (put <= 0)
      return tf_st_fail(TF_ERR_IO, path, "cannot write tensor '%s': %s", tf_st_show(name, nb, sizeof nb),
                        put < 0 ? strerror(errno) : "nothing written");
    done += (size_t)put;
  }
#ifdef __linux__
  /* the disk starts on it now rather than at the final fsync, while the next chunks are made */
  (void)sync_file_range(fd, (off_t)at, (off_t)len, SYNC_FILE_RANGE_WRITE);
#endif
  return TF_OK;
}

static tf_status tf_st_write_task(tf_st_pool *p, int i, unsigned char *buf) {
  const tf_st_write_job *j = p->job;
  const tf_tensor *t = j->tensors[i];
  const size_t n = tf_tensor_nbytes(t);
  const unsigned char *mem = n ? tf_tensor_data(t) : NULL;
  const bool on_cpu = t->device.type == TF_DEV_CPU;
  tf_xxh64_state h;
  tf_xxh64_init(&h, 0);
  for (size_t off = 0; off < n; off += TF_ST_CHUNK) {
    const size_t len = n - off < TF_ST_CHUNK ? n - off : TF_ST_CHUNK;
    const unsigned char *from = on_cpu ? mem + off : buf;
    if (!on_cpu) TF_TRY(tf_st_device_copy(t, buf, mem + off, len, TF_COPY_D2H));
    tf_xxh64_update(&h, from, len);
    TF_TRY(tf_st_pwrite(j->path, j->fd, from, len, j->data_start + j->offsets[i] + off, j->names[i]));
  }
  j->sums[i] = tf_xxh64_digest(&h);
  return TF_OK;
}

/* Makes a rename into path's folder durable (its entry on disk): a folder
 * that cannot be opened or synced (some file systems) is left as it is,
 * since the file itself is whole either way. */
static void tf_st_sync_folder(const char *path) {
  const char *slash = strrchr(path, '/');
  char *dir = slash ? strndup(path, slash == path ? 1 : (size_t)(slash - path)) : strdup(".");
  if (!dir) return;
  int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd >= 0) {
    (void)fsync(fd);
    close(fd);
  }
  free(dir);
}

tf_status tf_safetensors_write(const char *path, const char *const *names, tf_tensor *const *tensors, int n,
                               const char *const *meta_keys, const char *const *meta_values, int nmeta,
                               bool checksums) {
  TF_TRY(tf_st_check_write_args(path, names, tensors, n, meta_keys, meta_values, nmeta));
  /* where each tensor's data goes: one after the other, in the order given */
  uint64_t *offsets = calloc((size_t)n + 1, sizeof *offsets);
  if (!offsets) return tf_fail(TF_ERR_OOM, "out of memory: writing %s", path);
  for (int i = 1; i < n; i++) offsets[i] = offsets[i - 1] + tf_tensor_nbytes(tensors[i - 1]);
  char *json = tf_st_header_json(names, tensors, offsets, n, meta_keys, meta_values, nmeta, checksums);
  if (!json) {
    free(offsets);
    return tf_fail(TF_ERR_OOM, "out of memory: building the header of %s", path);
  }
  size_t jlen = strlen(json), hlen = (jlen + 7) / 8 * 8;

  /* A fresh name beside path, so the rename below stays on one file system. */
  static unsigned tf_st_counter;
  size_t tlen = strlen(path) + 64;
  char *tmp = malloc(tlen);
  int fd = -1;
  tf_status st = TF_OK;
  if (!tmp) st = tf_fail(TF_ERR_OOM, "out of memory: writing %s", path);
  for (int attempt = 0; st == TF_OK && fd < 0; attempt++) {
    snprintf(tmp, tlen, "%s.tmp-%ld-%u", path, (long)getpid(), tf_st_counter++);
    fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
    if (fd < 0 && (errno != EEXIST || attempt == 100))
      st = tf_st_fail(TF_ERR_IO, path, "cannot create %s: %s", tmp, strerror(errno));
  }
  /* the tensors contiguous (copies of strided ones) */
  tf_tensor **flat = calloc((size_t)n + 1, sizeof *flat);
  uint64_t *sums = calloc((size_t)n + 1, sizeof *sums);
  if (st == TF_OK && (!flat || !sums)) st = tf_fail(TF_ERR_OOM, "out of memory: writing %s", path);
  for (int i = 0; st == TF_OK && i < n; i++) {
    if (tf_tensor_is_contiguous(tensors[i]))
      flat[i] = tf_tensor_retain(tensors[i]);
    else
      st = tf_contiguous(tensors[i], &flat[i]);
  }
  unsigned char lenbuf[8];
  for (int i = 0; i < 8; i++) lenbuf[i] = (unsigned char)((uint64_t)hlen >> (8 * i));
  char *padded = st == TF_OK ? malloc(hlen) : NULL;
  if (st == TF_OK && !padded) st = tf_fail(TF_ERR_OOM, "out of memory: writing %s", path);
  if (padded) {
    memset(padded, ' ', hlen);
    memcpy(padded, json, jlen);
  }
  if (st == TF_OK) st = tf_st_pwrite(path, fd, lenbuf, 8, 0, NULL);
  if (st == TF_OK) st = tf_st_pwrite(path, fd, padded, hlen, 8, NULL);
  if (st == TF_OK) {
    tf_st_write_job job = {path, fd, 8 + hlen, flat, names, offsets, sums};
    tf_st_pool pool = {.items = n, .task = tf_st_write_task, .job = &job};
    tf_st_pool_device(&pool, flat, n);
    st = tf_st_pool_run(&pool);
  }
  if (st == TF_OK && checksums && n > 0) { /* the header again, now with the checksums */
    tf_st_put_checksums(json, sums, n);
    st = tf_st_pwrite(path, fd, json, jlen, 8, NULL);
  }
  for (int i = 0; flat && i < n; i++) tf_tensor_release(flat[i]);
  free(flat);
  free(offsets);
  free(sums);
  free(padded);
  if (st == TF_OK && fsync(fd) != 0) st = tf_st_fail(TF_ERR_IO, path, "cannot write %s: %s", tmp, strerror(errno));
  if (fd >= 0 && close(fd) != 0 && st == TF_OK)
    st = tf_st_fail(TF_ERR_IO, path, "cannot close %s: %s", tmp, strerror(errno));
  if (st == TF_OK && rename(tmp, path) != 0)
    st = tf_st_fail(TF_ERR_IO, path, "cannot rename %s into place: %s", tmp, strerror(errno));
  if (st == TF_OK) tf_st_sync_folder(path);
  if (st != TF_OK && fd >= 0) unlink(tmp);
  free(tmp);
  cJSON_free(json);
  return st;
}
