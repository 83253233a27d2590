/*
 * An opened kernel-variant plugin, bound to one backend device: the
 * plugin's table and context, and the native handles (device ordinal,
 * stream, buffer addresses) that the backend lends it. Used from the thread
 * that uses the backend.
 */
#ifndef Q4KH_KERNEL_H
#define Q4KH_KERNEL_H

#include "backend.h"
#include "error.h"
#include "q4khost/plugin.h"
#include "registry.h"

struct q4kh_kernel {
	const struct q4kh_plugin *plugin;
	const struct q4kh_kernel_v1 *v;
	q4kh_kernel_ctx *ctx;
	struct q4kh_native_device native;
	int borrowed; /* ctx is a kernel cache's, which shuts it down */
};

/*
 * The kernel variants opened on one backend device, each once: a host
 * context keeps one per device (host.h) and lends it through the
 * backend's kernels, so that asking a variant's scores and routing
 * weights through it use one context. An init that failed is kept too,
 * with its error line.
 */
#define Q4KH_KERNEL_CACHE 32
/*
 * Kernel-variant contexts initialised before any device asked for one
 * (the settings check, registry.h, through a host context): the first
 * device that opens the plugin takes its context instead of
 * initialising it again (a variant's context is bound to no device: the
 * device comes with each call, plugin.h).
 */
struct q4kh_kernel_spares {
	const struct q4kh_plugin *plugin[Q4KH_KERNEL_CACHE];
	q4kh_kernel_ctx *ctx[Q4KH_KERNEL_CACHE];
	size_t n;
};
struct q4kh_kernel_cache {
	struct q4kh_kernel k[Q4KH_KERNEL_CACHE];
	char why[Q4KH_KERNEL_CACHE][1024]; /* "" when it opened */
	size_t n;
	struct q4kh_kernel_spares *spares; /* taken from first; NULL: none */
};

/*
 * Initialise kernel-variant plugin P (counted, q4kh_plugin_inits) and
 * keep its context in S for the first device that opens it. Returns the
 * status of P's init, with its last_error in WHY (CAP bytes; "" when it
 * started). Not thread-safe.
 */
q4kh_status q4kh_kernel_spare_init(struct q4kh_kernel_spares *s, const struct q4kh_plugin *p,
                                   char *why, size_t cap);
/* Shut down every context S still holds. Safe on a zeroed struct. */
void q4kh_kernel_spares_close(struct q4kh_kernel_spares *s);
/* Shut down every variant of C; every prepared weight must be released
 * first. Safe on a zeroed cache. */
void q4kh_kernel_cache_close(struct q4kh_kernel_cache *c);

/*
 * Initialise kernel-variant PLUGIN for backend B's device. -1 with err when
 * the plugin is no kernel variant, targets another backend, the backend
 * lends no native handles, or init fails. When B carries a kernel cache,
 * the variant is opened there once and *out borrows it (a failure is
 * kept and said again).
 */
int q4kh_kernel_open(const struct q4kh_plugin *plugin,
                     const struct q4kh_backend *b, struct q4kh_kernel *out,
                     struct q4kh_error *err);
/* Shut the plugin down (not when borrowed from a cache); every prepared
 * weight must be released first. Safe on a zeroed struct. */
void q4kh_kernel_close(struct q4kh_kernel *k);

/* 1 when the variant lists TYPE among its types. */
int q4kh_kernel_implements(const struct q4kh_kernel *k, uint32_t type);

/*
 * 0 when st is Q4KH_OK, else -1 with err =
 * "PLUGIN: WHAT failed (status): last_error".
 */
int q4kh_kernel_check(const struct q4kh_kernel *k, q4kh_status st,
                      const char *what, struct q4kh_error *err);

#endif
