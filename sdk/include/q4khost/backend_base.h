/*
 * What every backend's plugin code repeats around its ops, in the SDK's
 * static library (libq4khost_sdk.a, pkg-config q4khost-plugin;
 * backend_base.c): its errors (last_error(), with no context in init()),
 * init()'s first checks (V5), whole-number settings (section 8), and its
 * device records (V2). The in-tree backends cpu, cpu-fast and cuda and
 * the SDK's backend example use it; the ops' argument checks are
 * contract.h's.
 *
 * Errors follow plugin.h's rule: a failing call leaves ONE line, which
 * last_error(ctx) returns until the next call on that context fails;
 * init(), which has no context yet, leaves it where last_error(NULL)
 * finds it: a buffer of the calling thread's (thread-local, one per
 * module that links this library).
 *
 * Threads: every function is thread-safe for different contexts and
 * records (T1 allows one thread per context at a time).
 */
#ifndef Q4KHOST_BACKEND_BASE_H
#define Q4KHOST_BACKEND_BASE_H

#include <stdarg.h>
#include <stddef.h>

#include "q4khost/plugin.h"

#ifdef __cplusplus
extern "C" {
#endif

/*
 * Write the message FMT, ... (printf's rules, cut to CAP - 1 bytes and
 * NUL-terminated) into LINE (NULL or CAP 0: nowhere) and return ST
 * unchanged: "return q4kh_backend_fail(ctx->error, sizeof(ctx->error),
 * Q4KH_ERR_X, ...)".
 */
q4kh_status q4kh_backend_fail(char *line, size_t cap, q4kh_status st, const char *fmt, ...)
#if defined(__GNUC__)
	__attribute__((format(printf, 4, 5)))
#endif
	;

/* q4kh_backend_fail with the arguments as a va_list, which it consumes. */
q4kh_status q4kh_backend_vfail(char *line, size_t cap, q4kh_status st, const char *fmt,
                               va_list ap);

/* q4kh_backend_vfail into this thread's init() error (below). */
q4kh_status q4kh_backend_vinit_fail(q4kh_status st, const char *fmt, va_list ap);

/*
 * Why the last init() on this thread failed, as q4kh_backend_vinit_fail
 * or a function below left it: what last_error(NULL) returns; "" before
 * any failure. Owned by the library; valid until the thread's next
 * failing init() or its end.
 */
const char *q4kh_backend_init_error(void);

/*
 * Define a backend's error functions over the member "char error[N]" of
 * its struct q4kh_backend_ctx (the in-tree backends keep 1024 bytes):
 *   q4kh_status FAIL(q4kh_backend_ctx *ctx, q4kh_status st, const char *fmt, ...)
 *     keeps the message as CTX's last error (CTX NULL: this thread's
 *     init() error) and returns ST; external, for the backend's other
 *     files to declare (with __attribute__((format(printf, 3, 4))));
 *   static const char *LAST_ERROR(q4kh_backend_ctx *ctx)
 *     the table's last_error: CTX's line, or with CTX NULL init()'s.
 * Use it once, at file scope, where struct q4kh_backend_ctx is complete.
 */
#define Q4KH_BACKEND_ERRORS(FAIL, LAST_ERROR)                                          \
	q4kh_status FAIL(q4kh_backend_ctx *ctx, q4kh_status st, const char *fmt, ...)  \
	{                                                                              \
		va_list ap;                                                            \
                                                                                       \
		va_start(ap, fmt);                                                     \
		st = ctx ? q4kh_backend_vfail(ctx->error, sizeof(ctx->error), st, fmt, ap) \
		         : q4kh_backend_vinit_fail(st, fmt, ap);                       \
		va_end(ap);                                                            \
		return st;                                                             \
	}                                                                              \
	static const char *LAST_ERROR(q4kh_backend_ctx *ctx)                           \
	{                                                                              \
		return ctx ? ctx->error : q4kh_backend_init_error();                   \
	}

/*
 * init()'s checks before it reads anything (docs/plugin-abi.md V5), for
 * the backend NAME (its descriptor's name): OUT not NULL (then *OUT =
 * NULL), HOST not NULL, and HOST's abi_major this SDK's Q4KH_ABI_MAJOR.
 * Returns Q4KH_OK; else Q4KH_ERR_INVALID ("NAME: init: out is NULL",
 * "NAME: init: host API is NULL") or Q4KH_ERR_UNSUPPORTED ("NAME: init:
 * host ABI major 2, plugin built for 1"), the line as init()'s error.
 */
q4kh_status q4kh_backend_init_check(const char *name, const struct q4kh_host_api *host,
                                    q4kh_backend_ctx **out);

/*
 * A whole number LO .. HI in S (a NUL-terminated string, not NULL):
 * decimal digits only, no sign or space. Returns 0 with *OUT set; -1
 * (with *OUT kept) for anything else, the empty string included.
 */
int q4kh_parse_uint(const char *s, unsigned lo, unsigned hi, unsigned *out);

/*
 * The words every on/off setting takes, host's and plugins' alike
 * (docs/config.md, "On and off"), as a message lists them.
 */
#define Q4KH_BOOL_WORDS "1, on, true, yes or 0, off, false, no (any case)"

/*
 * An on/off value in S (a NUL-terminated string, not NULL): 1, on, true
 * or yes sets *OUT to 1, 0, off, false or no to 0, in any case. Returns
 * 0 with *OUT set; -1 (with *OUT kept) for anything else, the empty
 * string included. The one parser of every on/off setting.
 */
int q4kh_parse_bool(const char *s, unsigned *out);

/*
 * The setting KEY of the backend NAME's own section ([plugin.NAME],
 * docs/plugin-abi.md section 8), read in init() through
 * host->config_get where the host has it: a whole number LO .. HI into
 * *VALUE. Unset, or set to nothing, keeps *VALUE (the caller's default).
 * Returns Q4KH_OK; or Q4KH_ERR_INVALID with init()'s error
 * "[plugin.NAME] KEY = "VALUE": expected an integer from LO to HI".
 */
q4kh_status q4kh_backend_setting_uint(const struct q4kh_host_api *host, const char *name,
                                      const char *key, unsigned lo, unsigned hi,
                                      unsigned *value);

/*
 * The on/off setting KEY of NAME's own section, read in init() as
 * q4kh_backend_setting_uint reads its whole number: 1 or 0 into *VALUE
 * (q4kh_parse_bool's words). Unset, or set to nothing, keeps *VALUE.
 * Returns Q4KH_OK; or Q4KH_ERR_INVALID with init()'s error
 * "[plugin.NAME] KEY = "VALUE": expected " Q4KH_BOOL_WORDS.
 */
q4kh_status q4kh_backend_setting_bool(const struct q4kh_host_api *host, const char *name,
                                      const char *key, unsigned *value);

/*
 * device_info()'s answer: copy REC (its struct_size ignored) into the
 * host's record OUT, no byte past OUT->struct_size (V2: an older host's
 * record is shorter), with OUT->struct_size the bytes written. Returns
 * Q4KH_OK; or Q4KH_ERR_INVALID, writing nothing to OUT, with
 * "device_info: out is NULL" or "device_info: out->struct_size N is too
 * small" in LINE (CAP bytes: the backend's last error).
 */
q4kh_status q4kh_backend_put_record(const struct q4kh_device_record *rec,
                                    struct q4kh_device_record *out, char *line, size_t cap);

/*
 * *REC = the host's cores as one device run on THREADS threads, less its
 * name, which the caller writes ("cpu (2 threads)"): zeroed, then uuid
 * "cpu" (what F2's receipts key a CPU device on), arch the machine
 * uname() names ("x86_64"; "unknown" if it fails), memory_bytes the
 * physical memory (0 where sysconf cannot tell) and multiprocessors
 * THREADS. Cannot fail.
 */
void q4kh_backend_cpu_record(unsigned threads, struct q4kh_device_record *rec);

#ifdef __cplusplus
}
#endif

#endif
