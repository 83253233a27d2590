/*
 * What one command holds for its lifetime (docs/architecture.md section
 * 7): the registry and config it was given, the model file parsed once
 * (gguf_shared.h: every later open of it in this process shares the
 * mapping) with its tokenizer and weight types, and each backend plugin
 * initialised once, its devices counted and described once and opened
 * once, with the kernel variants opened once per device (kernel.h's
 * cache), their scores asked of that one context. Selection (select.h)
 * and F2's decisions (guard.h) take what they need from it instead of
 * opening again; a validation child (isolate.c) is another process and
 * opens its own.
 *
 * A backend device handed out by q4kh_host_backend_open shares the
 * host's contexts: it is used from the command's thread, as the plugin
 * ABI's one-thread-per-context rule asks; a part of a command that runs
 * a backend on another thread (serve's paths, its shadow reference)
 * opens its own with q4kh_backend_open. Not thread-safe.
 */
#ifndef Q4KH_HOST_H
#define Q4KH_HOST_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

#include "backend.h"
#include "config.h"
#include "error.h"
#include "kernel.h"
#include "model.h"
#include "registry.h"
#include "tokenizer.h"

/* One backend plugin as the host started it. */
struct q4kh_host_backend {
	const struct q4kh_plugin *plugin;
	int tried;                  /* started, or failed to, once */
	q4kh_backend_ctx *ctx;      /* NULL when it could not start */
	char why[1024];             /* why it could not start: the error line */
	q4kh_status status;         /* what its init returned */
	char detail[512];           /* its last_error after a failed init, or "" */
	uint32_t n_devices;
	struct q4kh_device_record *records; /* n_devices of them */
	/* each device opened at its first use, with its variants' contexts */
	q4kh_device_ctx **devs;
	struct q4kh_kernel_cache *kernels;
};

struct q4kh_host {
	const struct q4kh_registry *registry; /* the caller's */
	const struct q4kh_config *config;     /* the caller's */
	const char *model_path;               /* path_copy; NULL: no model */
	char *path_copy;                      /* the model's path, owned */
	struct q4kh_model *model;   /* parsed once, on no backend */
	struct q4kh_tokenizer *tok; /* the model's */
	uint32_t types[Q4KH_TYPE_COUNT]; /* its matrix weight types */
	size_t n_types;
	struct q4kh_host_backend *backends; /* one per registry plugin, by index */
	/* variants the settings check started, for their first device */
	struct q4kh_kernel_spares spares;
};

/*
 * Fill H for a command on registry R under config C (both the caller's,
 * outliving H) and the model at MODEL_PATH (NULL: none, for a command
 * without one): the file is opened and parsed, its tokenizer built and
 * its weight types listed; backends start at their first use. -1 with
 * err when the model does not open as one (q4kh_model_open's line, a bad
 * input), or its tokenizer cannot be built; H is then closed.
 */
int q4kh_host_open(struct q4kh_host *h, const struct q4kh_registry *r,
                   const struct q4kh_config *c, const char *model_path,
                   struct q4kh_error *err);

/*
 * The model of q4kh_host_open, for H opened without one: a command that
 * checks its plugins' settings through H (q4kh_host_start_status) before
 * it opens the model. H keeps a copy of MODEL_PATH. -1
 * with err as q4kh_host_open (H stays open, without a model), or when H
 * holds a model already.
 */
int q4kh_host_open_model(struct q4kh_host *h, const char *model_path, struct q4kh_error *err);

/* Close every device, variant and backend, then the model. Every backend
 * device of q4kh_host_backend_open must be closed first. Safe on a zeroed
 * or closed struct. */
void q4kh_host_close(struct q4kh_host *h);

/*
 * Backend plugin P of H's registry, started at the first call (init,
 * device_count, device_info of each device) and kept. NULL when P is no
 * accepted backend of H's registry; otherwise the entry, whose ctx is
 * NULL and why says why (the error line of q4kh_backend_devices) when it
 * could not start.
 */
const struct q4kh_host_backend *q4kh_host_backend(struct q4kh_host *h,
                                                  const struct q4kh_plugin *p);

/*
 * How many devices backend P has (q4kh_host_backend); 0 when it could not
 * start, and then its reason is appended to SKIPPED (CAP bytes, a line
 * ending in a newline) unless SKIPPED is NULL.
 */
uint32_t q4kh_host_devices(struct q4kh_host *h, const struct q4kh_plugin *p, char *skipped,
                           size_t cap);

/*
 * Device INDEX of backend P into *out, as q4kh_backend_open fills it, but
 * on H's context and H's device, opened at the first call: *out borrows
 * them (q4kh_backend_close on it closes neither) and carries the
 * device's variant cache, so that q4kh_kernel_open on it opens each
 * variant once. -1 with err as q4kh_backend_open.
 */
int q4kh_host_backend_open(struct q4kh_host *h, const struct q4kh_plugin *p, uint32_t index,
                           struct q4kh_backend *out, struct q4kh_error *err);

/*
 * The settings check's way to start plugin P (registry.h,
 * q4kh_registry_check_settings; HOST a struct q4kh_host): a backend
 * started in the host context (q4kh_host_backend), a kernel variant's
 * context kept for the first device that opens it (kernel.h, spares),
 * so that the check is P's one init. Returns what P's init returned,
 * with its last_error into WHY (CAP bytes; "" when it started).
 */
q4kh_status q4kh_host_start_status(void *host, const struct q4kh_plugin *p, char *why,
                                   size_t cap);

/*
 * What this process opened, for the commands' --json "host" (run,
 * validate, bench, qa): {"model_opens": N (q4kh_gguf_opens: files opened
 * and mapped), "backend_inits": {"NAME": N, ...}, "variant_inits":
 * {"NAME": N, ...}} (q4kh_plugin_inits of each accepted backend and
 * kernel variant of H's registry; a variant is opened once per device it
 * runs on). A new reference; NULL on out of memory.
 */
json_t *q4kh_host_json(const struct q4kh_host *h);

#endif
