/*
 * Host settings that several commands share, each resolved with where its
 * value came from (docs/architecture.md section 5: the command line, then the
 * environment, then the config files, then the built-in default), for
 * reports and `q4khost plugins --explain`. Plugin path: registry.h;
 * receipt folder: receipt.h; kernels: policy.h; F2 floors: guard.h.
 * Thread-safe (reads only).
 */
#ifndef Q4KH_SETTINGS_H
#define Q4KH_SETTINGS_H

#include <stddef.h>

#include "config.h"
#include "error.h"
#include "guard.h"

/*
 * The F2 mode: CLI (the --f2 value, NULL when not given), else Q4KHOST_F2,
 * else [f2] mode, else auto. ORIGIN gets "--f2", "Q4KHOST_F2",
 * "FILE:LINE [f2]" or "default". A value that is not one of auto, fresh,
 * off, require is an error naming where it was set; *bad_input says
 * whether it came from a setting, a file or the environment (1, exit 3),
 * or the command line (0, exit 2).
 */
int q4kh_settings_f2_mode(const struct q4kh_config *c, const char *cli,
                          enum q4kh_f2_mode *mode, char *origin, size_t cap,
                          int *bad_input, struct q4kh_error *err);

/*
 * Where MODE (its name: "off", "fresh") was set, for a report: "--f2 MODE",
 * "Q4KHOST_F2=MODE" or "mode = MODE at ORIGIN" (ORIGIN as
 * q4kh_settings_f2_mode wrote it; NULL counts as --f2).
 */
void q4kh_settings_f2_source(const char *origin, const char *mode, char *buf, size_t cap);

/*
 * What F2 judges on (guard.h): CLI (the --f2-probe value, NULL when not
 * given), else [f2] probe, else builtin. ORIGIN gets "--f2-probe",
 * "FILE:LINE [f2]" or "default". A value other than builtin or prompt is
 * an error naming where it was set; *bad_input as for the mode.
 */
int q4kh_settings_f2_probe(const struct q4kh_config *c, const char *cli,
                           enum q4kh_f2_probe_kind *kind, char *origin, size_t cap,
                           int *bad_input, struct q4kh_error *err);

/*
 * Whether run and serve accept deep receipts only (guard.h's
 * Q4KH_F2_PROBE_DEEP; docs/f2.md): Q4KHOST_F2_REQUIRE_DEEP, else [f2]
 * require_deep, each an on/off word (q4kh_parse_bool); default off. ORIGIN gets
 * "Q4KHOST_F2_REQUIRE_DEEP", "FILE:LINE [f2]" or "default". Another value
 * is an error naming where it was set; *bad_input as for the mode.
 */
int q4kh_settings_f2_require_deep(const struct q4kh_config *c, int *on, char *origin,
                                  size_t cap, int *bad_input, struct q4kh_error *err);

/*
 * The same for a command that judges candidates (run, serve, validate,
 * bench): when it is on, F2 judges on the deep probe, and WHY gets what a
 * report says of it, "require_deep = true at ORIGIN".
 */
int q4kh_settings_f2_deep_probe(const struct q4kh_config *c, int *on, char *why, size_t cap,
                                int *bad_input, struct q4kh_error *err);

/*
 * The backend asked for: CLI (--backend, or NULL), else Q4KHOST_BACKEND,
 * else NULL (automatic). ORIGIN gets "--backend", "Q4KHOST_BACKEND" or
 * "default".
 */
const char *q4kh_settings_backend(const char *cli, char *origin, size_t cap);

#endif
