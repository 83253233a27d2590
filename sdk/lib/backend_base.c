/*
 * A backend's errors, init() checks, settings and device records
 * (q4khost/backend_base.h).
 */
#include <stdio.h>
#include <string.h>
#include <strings.h>
#include <sys/utsname.h>
#include <unistd.h>

#include "q4khost/backend_base.h"

/* init() has no context to hold its error: last_error(NULL) reads this. */
static _Thread_local char init_error[1024];

q4kh_status q4kh_backend_vfail(char *line, size_t cap, q4kh_status st, const char *fmt,
                               va_list ap)
{
	if (line && cap)
		vsnprintf(line, cap, fmt, ap);
	return st;
}

q4kh_status q4kh_backend_vinit_fail(q4kh_status st, const char *fmt, va_list ap)
{
	return q4kh_backend_vfail(init_error, sizeof(init_error), st, fmt, ap);
}

static q4kh_status init_fail(q4kh_status st, const char *fmt, ...)
	__attribute__((format(printf, 2, 3)));

static q4kh_status init_fail(q4kh_status st, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	st = q4kh_backend_vinit_fail(st, fmt, ap);
	va_end(ap);
	return st;
}

q4kh_status q4kh_backend_fail(char *line, size_t cap, q4kh_status st, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	st = q4kh_backend_vfail(line, cap, st, fmt, ap);
	va_end(ap);
	return st;
}

const char *q4kh_backend_init_error(void)
{
	return init_error;
}

q4kh_status q4kh_backend_init_check(const char *name, const struct q4kh_host_api *host,
                                    q4kh_backend_ctx **out)
{
	if (!out)
		return init_fail(Q4KH_ERR_INVALID, "%s: init: out is NULL", name);
	*out = NULL;
	if (!host)
		return init_fail(Q4KH_ERR_INVALID, "%s: init: host API is NULL", name);
	if (host->abi_major != Q4KH_ABI_MAJOR)
		return init_fail(Q4KH_ERR_UNSUPPORTED,
		                 "%s: init: host ABI major %u, plugin built for %d", name,
		                 host->abi_major, Q4KH_ABI_MAJOR);
	return Q4KH_OK;
}

int q4kh_parse_uint(const char *s, unsigned lo, unsigned hi, unsigned *out)
{
	unsigned long v = 0;

	if (!*s)
		return -1;
	for (const char *p = s; *p; p++) {
		if (*p < '0' || *p > '9')
			return -1;
		v = v * 10 + (unsigned long)(*p - '0');
		if (v > hi)
			return -1;
	}
	if (v < lo)
		return -1;
	*out = (unsigned)v;
	return 0;
}

/* KEY of the plugin's section through config_get, NULL when unset or set to
 * nothing ("key =": as if unset, docs/plugin-abi.md section 8). */
static const char *setting(const struct q4kh_host_api *host, const char *key)
{
	const char *s = Q4KH_HOST_HAS(host, config_get) ? host->config_get(host->host_data, key)
	                                                : NULL;

	return s && *s ? s : NULL;
}

int q4kh_parse_bool(const char *s, unsigned *out)
{
	static const char *const words[][2] = {
		{ "0", "1" }, { "off", "on" }, { "false", "true" }, { "no", "yes" },
	};

	for (size_t i = 0; i < sizeof(words) / sizeof(words[0]); i++)
		for (unsigned v = 0; v < 2; v++)
			if (!strcasecmp(s, words[i][v])) {
				*out = v;
				return 0;
			}
	return -1;
}

q4kh_status q4kh_backend_setting_uint(const struct q4kh_host_api *host, const char *name,
                                      const char *key, unsigned lo, unsigned hi,
                                      unsigned *value)
{
	const char *s = setting(host, key);

	if (!s || !q4kh_parse_uint(s, lo, hi, value))
		return Q4KH_OK;
	return init_fail(Q4KH_ERR_INVALID,
	                 "[plugin.%s] %s = \"%s\": expected an integer from %u to %u", name, key,
	                 s, lo, hi);
}

q4kh_status q4kh_backend_setting_bool(const struct q4kh_host_api *host, const char *name,
                                      const char *key, unsigned *value)
{
	const char *s = setting(host, key);

	if (!s || !q4kh_parse_bool(s, value))
		return Q4KH_OK;
	return init_fail(Q4KH_ERR_INVALID, "[plugin.%s] %s = \"%s\": expected " Q4KH_BOOL_WORDS,
	                 name, key, s);
}

q4kh_status q4kh_backend_put_record(const struct q4kh_device_record *rec,
                                    struct q4kh_device_record *out, char *line, size_t cap)
{
	uint32_t size;

	if (!out)
		return q4kh_backend_fail(line, cap, Q4KH_ERR_INVALID, "device_info: out is NULL");
	if (out->struct_size < sizeof(out->struct_size))
		return q4kh_backend_fail(line, cap, Q4KH_ERR_INVALID,
		                         "device_info: out->struct_size %u is too small",
		                         out->struct_size);
	size = out->struct_size < sizeof(*rec) ? out->struct_size : (uint32_t)sizeof(*rec);
	memcpy(out, rec, size);
	out->struct_size = size;
	return Q4KH_OK;
}

void q4kh_backend_cpu_record(unsigned threads, struct q4kh_device_record *rec)
{
	long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
	struct utsname u;

	memset(rec, 0, sizeof(*rec));
	rec->struct_size = sizeof(*rec);
	snprintf(rec->uuid, sizeof(rec->uuid), "cpu");
	snprintf(rec->arch, sizeof(rec->arch), "%.31s", uname(&u) == 0 ? u.machine : "unknown");
	rec->memory_bytes = pages > 0 && page > 0 ? (uint64_t)pages * (uint64_t)page : 0;
	rec->multiprocessors = threads;
}
