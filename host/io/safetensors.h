/* Reading and writing safetensors files (https://huggingface.co/docs/safetensors).
 *
 * A file is an 8-byte little-endian header length N, N bytes of JSON
 * describing each tensor (dtype, shape, byte range) plus optional string
 * metadata, then the tensors' bytes. The reader treats every file as
 * untrusted: each field is checked, the byte ranges must tile the data
 * buffer exactly, and any problem is a TF_ERR_IO (a corrupt file) or
 * TF_ERR_ARG (a valid file tfhost cannot hold, such as a U8 tensor) whose
 * message starts with the file's path. */
#ifndef TF_SAFETENSORS_H
#define TF_SAFETENSORS_H

#include <stdbool.h>
#include <stdint.h>

#include "tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The largest header tfhost (and the reference implementation) accepts. */
#define TF_SAFETENSORS_MAX_HEADER 100000000u

typedef struct tf_safetensors_entry {
  char *name;
  const char *file_dtype; /* as spelled in the file: "F32", "BF16", "U8", ... */
  bool supported;         /* whether dtype below is meaningful (tfhost has it) */
  tf_dtype dtype;
  tf_shape shape;
  uint64_t begin, end;    /* data_offsets, relative to the data buffer */
  tf_tensor *tensor;      /* owned; NULL when only the header was read */
  bool has_checksum;      /* the file carries the XXH64 of this tensor's bytes (tfhost wrote it) */
  uint64_t checksum;
} tf_safetensors_entry;

typedef struct tf_safetensors_file {
  int ntensors;
  tf_safetensors_entry *tensors; /* in the order of their data in the file */
  int nmeta;
  char **meta_keys, **meta_values; /* __metadata__, in header order */
} tf_safetensors_file;

/* Reads every tensor of the file onto device. Tensors of a dtype tfhost lacks
 * (U8, I8, F8_*, ...) make the whole read fail, naming the tensor. */
tf_status tf_safetensors_read(const char *path, tf_device device, tf_safetensors_file **out);

/* Reads and checks the header only (tensor fields are NULL); every dtype of
 * the format is accepted, so a file can be inspected before it is loaded. */
tf_status tf_safetensors_read_header(const char *path, tf_safetensors_file **out);

/* Reads the file's tensors names[i] into dsts[i] (contiguous tensors on any
 * device, each of the file tensor's dtype and shape), checking each against
 * its checksum; the file may hold other tensors, which are not read. A
 * tensor missing or not fitting is an error naming it, before any is read.
 * With header, *header is the file's header (tensor fields NULL), to free. */
tf_status tf_safetensors_read_into(const char *path, const char *const *names, tf_tensor *const *dsts, int n,
                                   tf_safetensors_file **header);

/* Frees the file and drops its references to the tensors; NULL is fine. */
void tf_safetensors_free(tf_safetensors_file *f);

/* Writes tensors (on any device, any strides) under names, in the order
 * given, with nmeta metadata pairs, and with checksums the XXH64 of each
 * tensor's bytes (metadata key "tfhost.xxh64", which replaces one given;
 * readers check every tensor against it; without, the bytes are those
 * Python's library writes). The header is
 * padded with spaces to a multiple of 8 bytes, as the Python library does.
 * The file is written beside path under a temporary name and renamed into
 * place, so path never holds a partial file. */
tf_status tf_safetensors_write(const char *path, const char *const *names, tf_tensor *const *tensors, int n,
                               const char *const *meta_keys, const char *const *meta_values, int nmeta,
                               bool checksums);

/* "F32", "BF16", ... for a tfhost dtype. */
const char *tf_safetensors_dtype_name(tf_dtype d);

#ifdef __cplusplus
}
#endif
#endif
