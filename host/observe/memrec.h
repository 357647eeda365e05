/* Memory history: what each allocation is for, and a record of allocator
 * events (the data behind tf.mem.record, tf.mem.snapshot, tf.mem.dump and
 * tf.mem.plot).
 *
 * Every block handed out carries a tag (parameter, gradient, optimizer
 * state, activation, workspace, temporary) and the op or model component
 * that asked for it, taken from the innermost tf_mem_scope open at the time
 * (the engine, the optimizer, autograd and scripts open them). While a
 * device's recorder is on, each alloc, free, segment alloc/free and
 * out-of-memory is also appended to a ring of the last max_entries events,
 * with the time, the open ranges (prof.h) and the script location that the
 * host's origin hook reports. Strings (what, sources, range paths, frames)
 * are interned once per process and referred to by id. */
#ifndef TF_MEMREC_H
#define TF_MEMREC_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "clock.h"
#include "intern.h"
#include "status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum tf_mem_tag {
  TF_TAG_AUTO = 0, /* decided at allocation: activation while autograd records, else temporary */
  TF_TAG_PARAMETER,
  TF_TAG_GRADIENT,
  TF_TAG_OPTIMIZER,
  TF_TAG_ACTIVATION,
  TF_TAG_WORKSPACE,
  TF_TAG_TEMPORARY,
  TF_TAG_COUNT
} tf_mem_tag;

/* "parameter", "gradient", "optimizer state", "activation", "workspace",
 * "temporary" (and "auto"); parse returns -1 for an unknown name. */
const char *tf_mem_tag_name(int tag);
int tf_mem_tag_parse(const char *name);

/* The purpose of the allocations made until the matching leave: enter
 * returns the scope it replaces. what must outlive the scope (a literal, or
 * a string the caller keeps). */
typedef struct tf_mem_scope {
  int tag;
  const char *what;
} tf_mem_scope;
tf_mem_scope tf_mem_scope_enter(int tag, const char *what);
void tf_mem_scope_leave(tf_mem_scope previous);
tf_mem_scope tf_mem_scope_current(void);

/* Autograd reports its grad mode here whenever it changes (on until told
 * otherwise): TF_TAG_AUTO allocations are activations while it records and
 * temporaries while it does not. Pushed from above, so that the recorder
 * calls nothing of the layers that use it. */
void tf_mem_set_grad_mode(bool on);

typedef enum tf_mem_action {
  TF_MEM_ALLOC,
  TF_MEM_FREE,
  TF_MEM_SEGMENT_ALLOC,
  TF_MEM_SEGMENT_FREE,
  TF_MEM_OOM,
  TF_MEM_ACTION_COUNT
} tf_mem_action;
/* PyTorch's names: "alloc", "free_completed", "segment_alloc", "segment_free", "oom". */
const char *tf_mem_action_name(int action);

/* What an allocation is for and where it came from: string ids (0: none). */
typedef struct tf_mem_origin {
  uint8_t tag;
  uint32_t what, source, ranges, frames;
} tf_mem_origin;

typedef struct tf_mem_event {
  uint64_t addr, size, requested;
  uint64_t time_us;     /* the process's clock (clock.h), in microseconds */
  uint64_t device_free; /* oom: bytes the device (or the limit) still had */
  uint64_t seq;         /* position in the whole history, 0-based */
  tf_mem_origin origin;
  uint8_t action;
} tf_mem_event;

typedef struct tf_mem_recorder {
  tf_mem_event *events; /* ring of cap events; the oldest at (head - count) */
  size_t cap, count, head;
  uint64_t seq;          /* events ever appended */
  uint64_t live, peak;   /* bytes in live blocks as recorded, and its maximum */
  uint64_t peak_seq, peak_time_us;
  bool on;
} tf_mem_recorder;

/* Strings in origins are ids of the process's interner (intern.h). */

/* The host's view of the running script: sets o->source ("file:line" of
 * the script's statement), o->frames ("file\tline\tname" lines, innermost
 * first) and, when the caller of the allocating function is known, o->what
 * (e.g. "matmul"), all interned. Called only while recording. */
typedef void (*tf_mem_site_fn)(void *ud, tf_mem_origin *o);
void tf_mem_set_site_hook(tf_mem_site_fn fn, void *ud);

/* The origin of an allocation made now: tag and what from the scope (or
 * the hook's what); source, frames and ranges only when full (recording). */
void tf_mem_origin_now(tf_mem_origin *o, bool full);

tf_status tf_mem_recorder_start(tf_mem_recorder *r, size_t max_entries);
void tf_mem_recorder_stop(tf_mem_recorder *r);
void tf_mem_recorder_free(tf_mem_recorder *r);
void tf_mem_record(tf_mem_recorder *r, tf_mem_action action, uint64_t addr, uint64_t size, uint64_t requested,
                   const tf_mem_origin *origin, uint64_t device_free);
/* The i-th retained event, oldest first (i < r->count). */
const tf_mem_event *tf_mem_event_at(const tf_mem_recorder *r, size_t i);

#ifdef __cplusplus
}
#endif
#endif
