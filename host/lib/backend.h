/*
 * An opened backend plugin on one device: the plugin's table, its context,
 * the device context and record. Every call through it that fails is
 * turned into one error line naming the plugin, the call and the plugin's
 * own last_error() text. One struct q4kh_backend is used from one thread
 * at a time (the plugin ABI's rule).
 */
#ifndef Q4KH_BACKEND_H
#define Q4KH_BACKEND_H

#include "error.h"
#include "q4khost/plugin.h"
#include "registry.h"

struct q4kh_kernel_cache;

struct q4kh_backend {
	const struct q4kh_plugin *plugin;
	const struct q4kh_backend_v1 *v;
	q4kh_backend_ctx *ctx;
	q4kh_device_ctx *dev;
	struct q4kh_device_record record;
	/* ctx and dev are a host context's (host.h), which closes them */
	int borrowed;
	/* the device's kernel variants, opened once each (kernel.h); NULL:
	 * each q4kh_kernel_open opens its own */
	struct q4kh_kernel_cache *kernels;
};

/*
 * Initialise PLUGIN (a backend) and open device INDEX. -1 with err when the
 * plugin is no backend, has no such device, or init/open fails.
 */
int q4kh_backend_open(const struct q4kh_plugin *plugin, uint32_t index,
                      struct q4kh_backend *out, struct q4kh_error *err);
/*
 * Device INDEX's record from B's context (device_info), its strings
 * terminated whatever the plugin wrote. -1 with err as q4kh_backend_check.
 */
int q4kh_backend_record(const struct q4kh_backend *b, uint32_t index,
                        struct q4kh_device_record *rec, struct q4kh_error *err);

/*
 * Why backend PLUGIN, which counts no device, has none, in its own words:
 * what its device_info refuses device 0 with (the cuda plugin names a
 * missing driver or GPU), into BUF; "" when it cannot start or says nothing.
 */
void q4kh_backend_why_no_device(const struct q4kh_plugin *plugin, char *buf, size_t cap);
/*
 * The same from backend V's context CTX (initialised, counting no
 * device): the line its device_info refuses device 0 with (docs/plugin-abi.md
 * L6), into BUF; "" when device_info(0) succeeds or says nothing.
 */
void q4kh_backend_why_none(const struct q4kh_backend_v1 *v, q4kh_backend_ctx *ctx, char *buf,
                           size_t cap);

/*
 * How many devices backend PLUGIN has: init, device_count, shutdown. -1
 * with err (and *n = 0) when the plugin is no backend or a call fails.
 */
int q4kh_backend_devices(const struct q4kh_plugin *plugin, uint32_t *n,
                         struct q4kh_error *err);
/*
 * 0 when backend B (open) implements each of the N weight TYPES (its
 * supports_type), else -1 with err naming the first it lacks and those it
 * has: "backend cuda does not implement Q4_1 (GGUF type 3), a weight type
 * of this model (it implements F32, F16, ...)". A backend passed over for a
 * model says so with this line before anything runs.
 */
int q4kh_backend_check_types(const struct q4kh_backend *b, const uint32_t *types, size_t n,
                             struct q4kh_error *err);

/* Close the device and shut the plugin down (neither when B borrows them
 * from a host context); safe on a zeroed struct. */
void q4kh_backend_close(struct q4kh_backend *b);

/*
 * PLUGIN's init, counted (q4kh_plugin_inits): every backend context this
 * process's library creates goes through it (the enumeration helper's
 * process aside). -1 with err as q4kh_backend_check words it; *ctx is
 * NULL then, and *status (NULL: not wanted) the status init returned.
 */
int q4kh_backend_init(const struct q4kh_plugin *plugin, q4kh_backend_ctx **ctx,
                      q4kh_status *status, struct q4kh_error *err);

/*
 * Turn a plugin status into the host's convention: 0 when st is Q4KH_OK,
 * else -1 with err = "PLUGIN: WHAT failed (status): last_error".
 */
int q4kh_backend_check(const struct q4kh_backend *b, q4kh_status st,
                       const char *what, struct q4kh_error *err);

/* Name of a status code ("invalid argument"). */
const char *q4kh_status_name(q4kh_status st);

#endif
