#include "memrec.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "clock.h"
#include "intern.h"
#include "prof.h"

static const char *const tf_tag_names[TF_TAG_COUNT] = {
    "auto", "parameter", "gradient", "optimizer state", "activation", "workspace", "temporary",
};

const char *tf_mem_tag_name(int tag) { return tag >= 0 && tag < TF_TAG_COUNT ? tf_tag_names[tag] : "unknown"; }

int tf_mem_tag_parse(const char *name) {
  for (int i = 0; i < TF_TAG_COUNT; i++)
    if (strcmp(name, tf_tag_names[i]) == 0) return i;
  return -1;
}

static const char *const tf_action_names[TF_MEM_ACTION_COUNT] = {
    "alloc", "free_completed", "segment_alloc", "segment_free", "oom",
};

const char *tf_mem_action_name(int action) {
  return action >= 0 && action < TF_MEM_ACTION_COUNT ? tf_action_names[action] : "unknown";
}

/* ---- scopes ---------------------------------------------------------------------------- */

static tf_mem_scope tf_scope_now = {TF_TAG_AUTO, NULL};

tf_mem_scope tf_mem_scope_enter(int tag, const char *what) {
  tf_mem_scope previous = tf_scope_now;
  tf_scope_now.tag = tag;
  tf_scope_now.what = what ? what : previous.what;
  return previous;
}

void tf_mem_scope_leave(tf_mem_scope previous) { tf_scope_now = previous; }

tf_mem_scope tf_mem_scope_current(void) { return tf_scope_now; }

/* Autograd's grad mode as autograd last reported it (on unless turned off),
 * per thread like the mode itself. */
static _Thread_local bool tf_mem_grad_off;

void tf_mem_set_grad_mode(bool on) { tf_mem_grad_off = !on; }

/* ---- origins ----------------------------------------------------------------------------- */

static tf_mem_site_fn tf_site_hook;
static void *tf_site_ud;

void tf_mem_set_site_hook(tf_mem_site_fn fn, void *ud) {
  tf_site_hook = fn;
  tf_site_ud = ud;
}

/* "forward/layer 3/attention" from the open ranges; the last answer is
 * kept for the innermost range instance (ids are never reused). */
static uint32_t tf_ranges_now(void) {
  static uint64_t last_instance;
  static uint32_t last_path;
  uint64_t instance = tf_range_current();
  if (instance == last_instance) return last_path;
  last_instance = instance;
  last_path = 0;
  const char *names[32];
  int n = tf_range_stack(names, 32);
  if (n <= 0) return 0;
  char path[512];
  size_t at = 0;
  for (int i = 0; i < n && i < 32 && at < sizeof path - 1; i++)
    at += (size_t)snprintf(path + at, sizeof path - at, "%s%s", i ? "/" : "", names[i]);
  last_path = tf_intern_id(path);
  return last_path;
}

void tf_mem_origin_now(tf_mem_origin *o, bool full) {
  int tag = tf_scope_now.tag;
  if (tag == TF_TAG_AUTO) tag = !tf_mem_grad_off ? TF_TAG_ACTIVATION : TF_TAG_TEMPORARY;
  *o = (tf_mem_origin){.tag = (uint8_t)tag};
  if (full && tf_site_hook) tf_site_hook(tf_site_ud, o);
  if (tf_scope_now.what || !o->what) {
    static const char *last; /* scope names are literals or interned: stable */
    static uint32_t last_id;
    if (tf_scope_now.what != last) {
      last = tf_scope_now.what;
      last_id = tf_intern_id(last);
    }
    o->what = last_id;
  }
  if (full) o->ranges = tf_ranges_now();
}

/* ---- the recorder ------------------------------------------------------------------------ */


/* A restart keeps nothing of the previous history. */
tf_status tf_mem_recorder_start(tf_mem_recorder *r, size_t max_entries) {
  if (max_entries == 0) return tf_fail(TF_ERR_ARG, "max_entries must be at least 1");
  tf_mem_event *events = malloc(max_entries * sizeof *events);
  if (!events) return tf_fail(TF_ERR_OOM, "out of memory: no host memory for %zu history entries", max_entries);
  free(r->events);
  *r = (tf_mem_recorder){.events = events, .cap = max_entries, .on = true};
  return TF_OK;
}

void tf_mem_recorder_stop(tf_mem_recorder *r) { r->on = false; }

void tf_mem_recorder_free(tf_mem_recorder *r) {
  free(r->events);
  *r = (tf_mem_recorder){0};
}

void tf_mem_record(tf_mem_recorder *r, tf_mem_action action, uint64_t addr, uint64_t size, uint64_t requested,
                   const tf_mem_origin *origin, uint64_t device_free) {
  if (!r || !r->on) return;
  tf_mem_event *e = &r->events[r->head];
  *e = (tf_mem_event){.addr = addr, .size = size, .requested = requested, .time_us = (uint64_t)(tf_clock_ns() / 1000),
                      .device_free = device_free, .seq = r->seq++, .action = (uint8_t)action};
  if (origin) e->origin = *origin;
  r->head = (r->head + 1) % r->cap;
  if (r->count < r->cap) r->count++;
  if (action == TF_MEM_ALLOC) {
    r->live += size;
    if (r->live > r->peak) {
      r->peak = r->live;
      r->peak_seq = e->seq;
      r->peak_time_us = e->time_us;
    }
  } else if (action == TF_MEM_FREE) {
    r->live = r->live > size ? r->live - size : 0;
  }
}

const tf_mem_event *tf_mem_event_at(const tf_mem_recorder *r, size_t i) {
  size_t first = (r->head + r->cap - r->count) % r->cap;
  return &r->events[(first + i) % r->cap];
}
