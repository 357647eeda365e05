/* The safetensors reader against mutated files: a valid image written by
 * tf_safetensors_write is damaged many thousands of ways (byte flips,
 * truncations, header length changes, JSON edits, appended bytes) with a
 * fixed seed, and edited through a JSON parser so that damage also gets past
 * the syntax checks to the semantic ones (offsets, sizes, names). Every read
 * must either succeed with a consistent result or fail with a message that
 * names the file. Crashes, out-of-bounds reads and leaks are for the
 * ASan+UBSan build (-DTF_SANITIZE=ON) to catch.
 * TF_FUZZ_ITERS overrides the number of mutations. */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backends.h"
#include "check.h"
#include "ops.h"
#include "safetensors.h"

static uint64_t rng_state = 0x5eed5afe7e2505ull;

/* splitmix64: a fixed, portable sequence. */
static uint64_t rng(void) {
  uint64_t z = (rng_state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}
static size_t rng_below(size_t n) { return n ? (size_t)(rng() % n) : 0; }

typedef struct {
  unsigned char *data;
  size_t len, cap;
} image;

static void image_reserve(image *im, size_t n) {
  if (n <= im->cap) return;
  im->cap = n * 2;
  im->data = realloc(im->data, im->cap);
  if (!im->data) abort();
}

static void image_set(image *im, const unsigned char *src, size_t n) {
  image_reserve(im, n + 1);
  memcpy(im->data, src, n);
  im->len = n;
}

static uint64_t header_len(const image *im) {
  uint64_t n = 0;
  for (int i = 7; i >= 0 && im->len >= 8; i--) n = n << 8 | im->data[i];
  return n;
}

static void set_header_len(image *im, uint64_t n) {
  for (int i = 0; i < 8 && (size_t)i < im->len; i++) im->data[i] = (unsigned char)(n >> (8 * i));
}

/* Replaces len bytes at at with the n bytes of s. */
static void splice(image *im, size_t at, size_t len, const char *s, size_t n) {
  if (at > im->len) at = im->len;
  if (len > im->len - at) len = im->len - at;
  image_reserve(im, im->len - len + n + 1);
  memmove(im->data + at + n, im->data + at + len, im->len - at - len);
  memcpy(im->data + at, s, n);
  im->len = im->len - len + n;
}

/* Tokens a JSON edit may put into the header. */
static const char *const tokens[] = {
    "-1", "0", "1", "2.5", "1e400", "9007199254740993", "18446744073709551616", "null", "true", "\"\"",
    "\"F32\"", "\"U8\"", "\"BF16\"", "\"BOOL\"", "\"Q\"", "[]", "[0]", "[0,0]", "[1,1,1,1,1,1,1,1,1]", "{}",
    "{", "}", "[", "]", ",", ":", "\"", "\\", "\\u0000", "\"__metadata__\"", "\"dtype\"", "\"shape\"",
    "\"data_offsets\"", ",\"x\":{\"dtype\":\"F32\",\"shape\":[],\"data_offsets\":[0,4]}", "\xff", "\xc3", " ",
};
enum { NTOKENS = sizeof tokens / sizeof tokens[0] };

static const char *const dtypes[] = {"F32", "F16", "BF16", "F64", "I64", "I32", "BOOL", "U8", "I8", "F4", "C64", "X"};

/* A well-formed header with one field changed: data_offsets shifted or
 * copied from another tensor, a name reused, a dtype, shape or metadata
 * value replaced, a field or entry removed. */
static const char *mutate_json(image *im) {
  uint64_t hlen = header_len(im);
  if (im->len < 8 || hlen > im->len - 8) return "nothing";
  cJSON *root = cJSON_ParseWithLength((const char *)im->data + 8, (size_t)hlen);
  int n = cJSON_GetArraySize(root);
  if (!cJSON_IsObject(root) || n < 2) {
    cJSON_Delete(root);
    return "nothing";
  }
  cJSON *item = cJSON_GetArrayItem(root, (int)rng_below((size_t)n));
  cJSON *other = cJSON_GetArrayItem(root, (int)rng_below((size_t)n));
  cJSON *offsets = cJSON_GetObjectItem(item, "data_offsets"), *shape = cJSON_GetObjectItem(item, "shape");
  const char *what = "JSON field";
  switch (rng_below(7)) {
    case 0:
      what = "offsets shifted";
      for (cJSON *o = offsets ? offsets->child : NULL; o; o = o->next)
        cJSON_SetNumberValue(o, o->valuedouble + (double)rng_below(17) - 8);
      break;
    case 1:
      what = "offsets copied";
      if (offsets && cJSON_GetObjectItem(other, "data_offsets"))
        cJSON_ReplaceItemInObject(item, "data_offsets", cJSON_Duplicate(cJSON_GetObjectItem(other, "data_offsets"), 1));
      break;
    case 2:
      what = "name reused";
      cJSON_AddItemToObject(root, other->string, cJSON_Duplicate(item, 1));
      break;
    case 3:
      what = "dtype replaced";
      if (cJSON_GetObjectItem(item, "dtype"))
        cJSON_ReplaceItemInObject(item, "dtype", cJSON_CreateString(dtypes[rng_below(sizeof dtypes / sizeof *dtypes)]));
      break;
    case 4: {
      what = "shape edited";
      static const double dims[] = {0, 1, 2, 3, 4, 6, -1, 2.5, 1e20};
      if (!shape) break;
      if (rng_below(2) && shape->child)
        cJSON_SetNumberValue(shape->child, dims[rng_below(sizeof dims / sizeof *dims)]);
      else if (rng_below(2))
        cJSON_AddItemToArray(shape, cJSON_CreateNumber(dims[rng_below(sizeof dims / sizeof *dims)]));
      else
        cJSON_DeleteItemFromArray(shape, 0);
      break;
    }
    case 5:
      what = "field removed";
      if (rng_below(2) && item->child)
        cJSON_DeleteItemFromObject(item, item->child->string);
      else
        cJSON_DeleteItemFromObject(root, item->string);
      break;
    default:
      what = "metadata edited";
      cJSON_AddItemToObject(root, "__metadata__", rng_below(2) ? cJSON_CreateNumber(1) : cJSON_CreateObject());
      break;
  }
  char *text = cJSON_PrintUnformatted(root);
  cJSON_Delete(root);
  if (!text) return "nothing";
  size_t tlen = strlen(text);
  splice(im, 8, (size_t)hlen, text, tlen);
  set_header_len(im, tlen);
  cJSON_free(text);
  return what;
}

/* One random damage; returns a short name of what was done. */
static const char *mutate(image *im) {
  uint64_t hlen = header_len(im);
  size_t hend = hlen <= im->len - 8 ? (size_t)hlen + 8 : im->len;
  switch (rng_below(10)) {
    case 0: { /* flip random bytes anywhere */
      for (size_t k = 1 + rng_below(4); k > 0 && im->len; k--)
        im->data[rng_below(im->len)] ^= (unsigned char)(1 + rng_below(255));
      return "byte flips";
    }
    case 1: { /* flip bytes in the header, where they matter most; mostly ASCII, to get past UTF-8 */
      for (size_t k = 1 + rng_below(3); k > 0 && hend > 8; k--)
        im->data[8 + rng_below(hend - 8)] = (unsigned char)(rng_below(8) ? 32 + rng_below(95) : rng());
      return "header byte flips";
    }
    case 2: im->len = rng_below(im->len); return "truncation";
    case 3: { /* a new header length: near the true one, tiny, huge or random */
      uint64_t choices[] = {hlen + rng_below(17) - 8,     rng_below(16),         hlen + im->len,
                            rng(),    TF_SAFETENSORS_MAX_HEADER + 1, (uint64_t)im->len - 8, (uint64_t)im->len - 7};
      set_header_len(im, choices[rng_below(sizeof choices / sizeof choices[0])]);
      return "header length";
    }
    case 4: case 5: { /* replace a span of the header with a token; keep the length field honest */
      if (hend <= 8) return "nothing";
      size_t at = 8 + rng_below(hend - 8), len = rng_below(6);
      if (len > hend - at) len = hend - at;
      const char *tok = tokens[rng_below(NTOKENS)];
      splice(im, at, len, tok, strlen(tok));
      if (rng_below(4)) set_header_len(im, hlen - len + strlen(tok));
      return "JSON edit";
    }
    case 6: { /* change a digit of the header (shapes, offsets) */
      for (int tries = 0; tries < 64 && hend > 8; tries++) {
        size_t at = 8 + rng_below(hend - 8);
        if (im->data[at] >= '0' && im->data[at] <= '9') {
          im->data[at] = (unsigned char)("0123456789-."[rng_below(12)]);
          return "digit edit";
        }
      }
      return "nothing";
    }
    case 8: case 9: return mutate_json(im);
    default: { /* bytes appended to, or removed from, the data */
      if (rng_below(2)) {
        size_t n = 1 + rng_below(16);
        image_reserve(im, im->len + n);
        for (size_t k = 0; k < n; k++) im->data[im->len++] = (unsigned char)rng();
      } else if (im->len > hend) {
        im->len -= 1 + rng_below(im->len - hend);
      }
      return "data length";
    }
  }
}

static bool write_file(const char *path, const image *im) {
  FILE *f = fopen(path, "wb");
  if (!f) return false;
  bool ok = fwrite(im->data, 1, im->len, f) == im->len;
  return fclose(f) == 0 && ok;
}

/* A successful read must describe a tiling of the data buffer. */
static bool consistent(const tf_safetensors_file *f, bool loaded) {
  uint64_t pos = 0;
  for (int i = 0; i < f->ntensors; i++) {
    const tf_safetensors_entry *e = &f->tensors[i];
    if (e->begin != pos || e->end < e->begin || !e->name) return false;
    pos = e->end;
    if (!loaded) continue;
    if (!e->tensor || tf_tensor_nbytes(e->tensor) != e->end - e->begin || e->tensor->ndim != e->shape.ndim)
      return false;
  }
  for (int i = 0; i < f->nmeta; i++)
    if (!f->meta_keys[i] || !f->meta_values[i]) return false;
  return true;
}

/* The valid starting point: several dtypes and shapes, and metadata. */
static void make_seed_image(const char *path, image *im) {
  tf_tensor *t[6];
  tf_shape s23 = {2, {2, 3}}, s4 = {1, {4}}, s0 = {0, {0}}, s02 = {2, {0, 2}}, s5 = {1, {5}}, s3 = {1, {3}};
  CHECK_OK(tf_arange(0, 6, 1, TF_F32, tf_cpu(), &t[0]));
  CHECK_OK(tf_reshape(t[0], &s23, &t[1]));
  tf_tensor_release(t[0]);
  t[0] = t[1];
  CHECK_OK(tf_full(&s4, 1.5, TF_BF16, tf_cpu(), &t[1]));
  CHECK_OK(tf_full(&s0, 2.25, TF_F64, tf_cpu(), &t[2]));
  CHECK_OK(tf_full(&s02, 0, TF_I32, tf_cpu(), &t[3]));
  CHECK_OK(tf_full(&s5, 1, TF_BOOL, tf_cpu(), &t[4]));
  CHECK_OK(tf_full(&s3, -7, TF_I64, tf_cpu(), &t[5]));
  const char *names[6] = {"weight", "bias.bf16", "scalar", "empty", "mask", "ids"};
  const char *keys[2] = {"format", "note"}, *values[2] = {"pt", "fuzz seed"};
  CHECK_OK(tf_safetensors_write(path, names, t, 6, keys, values, 2, true));
  for (int i = 0; i < 6; i++) tf_tensor_release(t[i]);
  FILE *f = fopen(path, "rb");
  CHECK(f != NULL);
  unsigned char buf[4096];
  size_t n = f ? fread(buf, 1, sizeof buf, f) : 0;
  if (f) fclose(f);
  image_set(im, buf, n);
}

int main(void) {
  tf_backends_init();
  char path[] = "/tmp/tf_safetensors_fuzz_XXXXXX";
  int fd = mkstemp(path);
  if (fd < 0) tf_check_skip("cannot create a temporary file");
  close(fd);

  image seed = {0}, im = {0};
  make_seed_image(path, &seed);
  tf_safetensors_file *f = NULL;
  CHECK_OK(tf_safetensors_read(path, tf_cpu(), &f));
  CHECK(f && f->ntensors == 6 && f->nmeta == 3 && consistent(f, true)); /* the two given and the checksums */
  tf_safetensors_free(f);

  long iters = getenv("TF_FUZZ_ITERS") ? atol(getenv("TF_FUZZ_ITERS")) : 30000;
  long accepted = 0, rejected = 0, bad = 0;
  size_t pathlen = strlen(path);
  for (long it = 0; it < iters; it++) {
    image_set(&im, seed.data, seed.len);
    const char *what = "";
    for (size_t k = 1 + rng_below(3); k > 0; k--) what = mutate(&im);
    if (!write_file(path, &im)) {
      CHECK(!"cannot write the mutated file");
      break;
    }
    bool header_only = it % 4 == 3;
    f = NULL;
    tf_status st = header_only ? tf_safetensors_read_header(path, &f) : tf_safetensors_read(path, tf_cpu(), &f);
    bool ok;
    if (st == TF_OK) {
      ok = f && consistent(f, !header_only);
      accepted++;
    } else {
      const char *msg = tf_last_error();
      ok = !f && (st == TF_ERR_IO || st == TF_ERR_ARG) && strncmp(msg, path, pathlen) == 0 && strlen(msg) > pathlen + 2;
      rejected++;
    }
    tf_safetensors_free(f);
    if (!ok && ++bad <= 10)
      fprintf(stderr, "iteration %ld (%s): status %d, message: %s\n", it, what, (int)st, tf_last_error());
  }
  printf("%ld mutations: %ld read, %ld refused, %ld wrong\n", iters, accepted, rejected, bad);
  CHECK_INT(bad, 0);
  CHECK(rejected > iters / 2);
  CHECK(accepted > 0);
  unlink(path);
  free(seed.data);
  free(im.data);
  return tf_check_done();
}
