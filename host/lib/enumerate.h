/*
 * A backend's init and device enumeration, tried in a helper process
 * before this process calls them (docs/architecture.md section 3,
 * docs/plugin-abi.md rule L6), as GStreamer's registry scanner tries its
 * plugins: a backend that crashes or hangs there is refused, and the
 * command serves with the rest. The helper is `q4khost validate
 * --enumerate FILE`, run and watched as F2's measurement is (isolate.h).
 * Each verdict, fine or refused, is kept in a small file in the folder
 * "backends" of the receipt folder (receipt.h), keyed on the plugin
 * file's identity (device, inode, size, modification and change times),
 * its build id, its effective [plugin.NAME] settings and the time limit:
 * one helper per changed file, then one small read per backend and
 * command.
 */
#ifndef Q4KH_ENUMERATE_H
#define Q4KH_ENUMERATE_H

#include "config.h"
#include "error.h"
#include "registry.h"

/* Seconds a helper may take when [plugins] enumerate_timeout_s is unset:
 * a GPU driver's first start can take several. */
#define Q4KH_ENUMERATE_TIMEOUT_S 60
/* The most [plugins] enumerate_timeout_s may be. */
#define Q4KH_ENUMERATE_TIMEOUT_MAX_S 3600

/*
 * The helper's time limit under config C (may be NULL): [plugins]
 * enumerate_timeout_s, 1 to Q4KH_ENUMERATE_TIMEOUT_MAX_S, else
 * Q4KH_ENUMERATE_TIMEOUT_S. A bad value is an error naming the file and
 * line.
 */
int q4kh_enumerate_timeout(const struct q4kh_config *c, unsigned *seconds,
                           struct q4kh_error *err);

/*
 * Vet every accepted backend plugin of R, scanned under config C (may be
 * NULL), before this process calls it:
 * from its cached verdict, else by a helper process under
 * q4kh_enumerate_timeout, whose verdict is then cached. A backend whose
 * helper was killed by a signal, exited non-zero or ran out of time
 * becomes Q4KH_PLUGIN_REFUSED, its reason saying how ("its init or device
 * enumeration (in a helper process) crashed: killed by signal 6
 * (Aborted); ..." or "... timed out after 60 s and was killed; ..."); it
 * stays loaded, so its descriptor can be listed, but
 * nothing in it is called again. A cache record that is stale, unreadable,
 * or in a file or folder q4kh_secure_untrusted refuses counts as none; a
 * cache that cannot be written only costs a helper per command. -1 with
 * err when a helper could not be started, when we were asked to stop
 * (interrupt.h) while one ran, or on a bad time limit. Not thread-safe
 * (isolate.h).
 */
int q4kh_enumerate_vet(struct q4kh_registry *r, const struct q4kh_config *c,
                       struct q4kh_error *err);

/*
 * The helper's own work on accepted backend P, in this process: init;
 * device_count; device_info of every device (of device 0 when it counts
 * none, as a command asks why); last_error after each failure; shutdown:
 * everything a command asks a backend before it serves. Statuses are not
 * judged: a backend that returns is fine here, and the command reports
 * its errors as it always does.
 */
void q4kh_enumerate_here(const struct q4kh_plugin *p);

#endif
