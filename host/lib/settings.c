#include "settings.h"

#include <stdio.h>
#include <string.h>

/* Bytes of a bad value quoted in a message. */
#define VALUE_SHOWN 80

int q4kh_settings_f2_mode(const struct q4kh_config *c, const char *cli,
                          enum q4kh_f2_mode *mode, char *origin, size_t cap,
                          int *bad_input, struct q4kh_error *err)
{
	const char *env = q4kh_env("Q4KHOST_F2"), *v;
	char shown[VALUE_SHOWN * 4 + 8];

	*bad_input = 0;
	if (cli) {
		v = cli;
		snprintf(origin, cap, "--f2");
	} else if (env && *env) {
		v = env;
		snprintf(origin, cap, "Q4KHOST_F2");
	} else if ((v = q4kh_config_where(c, "f2", "mode", origin, cap)) && *v) {
		*bad_input = 1;
	} else {
		*mode = Q4KH_F2_AUTO;
		snprintf(origin, cap, "default");
		return 0;
	}
	if (q4kh_f2_mode_parse(v, mode))
		return q4kh_fail(err, "%s: '%s' is not one of auto, fresh, off, require", origin,
		                 q4kh_show(shown, sizeof(shown), v, strlen(v), VALUE_SHOWN, 0));
	return 0;
}

void q4kh_settings_f2_source(const char *origin, const char *mode, char *buf, size_t cap)
{
	if (!origin || !strcmp(origin, "--f2"))
		snprintf(buf, cap, "--f2 %s", mode);
	else if (!strcmp(origin, "Q4KHOST_F2"))
		snprintf(buf, cap, "Q4KHOST_F2=%s", mode);
	else
		snprintf(buf, cap, "mode = %s at %s", mode, origin);
}

const char *q4kh_settings_backend(const char *cli, char *origin, size_t cap)
{
	const char *env = q4kh_env("Q4KHOST_BACKEND");

	if (cli) {
		snprintf(origin, cap, "--backend");
		return cli;
	}
	if (env && *env) {
		snprintf(origin, cap, "Q4KHOST_BACKEND");
		return env;
	}
	snprintf(origin, cap, "default");
	return NULL;
}
