#include "settings.h"

#include <stdio.h>
#include <string.h>

#include "q4khost/backend_base.h"

/* Bytes of a bad value quoted in a message. */
#define VALUE_SHOWN 80

/*
 * The value of an F2 setting: CLI (ORIGIN "CLI_NAME"), else the variable
 * ENV when not NULL and set (*bad_input 1), else [f2] KEY ("FILE:LINE
 * [f2]"; *bad_input 1); NULL for none of them (ORIGIN "default"). A
 * variable is a setting, as a file is: not command-line usage.
 */
static const char *f2_setting(const struct q4kh_config *c, const char *cli,
                              const char *cli_name, const char *env, const char *key,
                              char *origin, size_t cap, int *bad_input)
{
	const char *e = env ? q4kh_env(env) : NULL, *v;

	*bad_input = 0;
	if (cli) {
		snprintf(origin, cap, "%s", cli_name);
		return cli;
	}
	if (e && *e) {
		snprintf(origin, cap, "%s", env);
		*bad_input = 1;
		return e;
	}
	if ((v = q4kh_config_where(c, "f2", key, origin, cap)) && *v) {
		*bad_input = 1;
		return v;
	}
	snprintf(origin, cap, "default");
	return NULL;
}

int q4kh_settings_f2_mode(const struct q4kh_config *c, const char *cli,
                          enum q4kh_f2_mode *mode, char *origin, size_t cap,
                          int *bad_input, struct q4kh_error *err)
{
	const char *v = f2_setting(c, cli, "--f2", "Q4KHOST_F2", "mode", origin, cap, bad_input);
	char shown[VALUE_SHOWN * 4 + 8];

	*mode = Q4KH_F2_AUTO;
	if (v && q4kh_f2_mode_parse(v, mode))
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

int q4kh_settings_f2_probe(const struct q4kh_config *c, const char *cli,
                           enum q4kh_f2_probe_kind *kind, char *origin, size_t cap,
                           int *bad_input, struct q4kh_error *err)
{
	const char *v = f2_setting(c, cli, "--f2-probe", NULL, "probe", origin, cap, bad_input);
	char shown[VALUE_SHOWN * 4 + 8];

	*kind = Q4KH_F2_PROBE_BUILTIN;
	if (v && q4kh_f2_probe_parse(v, kind))
		return q4kh_fail(err, "%s: probe '%s' is not one of builtin (F2's own text), prompt (the run's prompt)",
		                 origin, q4kh_show(shown, sizeof(shown), v, strlen(v), VALUE_SHOWN, 0));
	return 0;
}

int q4kh_settings_f2_require_deep(const struct q4kh_config *c, int *on, char *origin,
                                  size_t cap, int *bad_input, struct q4kh_error *err)
{
	const char *v = f2_setting(c, NULL, NULL, "Q4KHOST_F2_REQUIRE_DEEP", "require_deep",
	                           origin, cap, bad_input);
	char shown[VALUE_SHOWN * 4 + 8];
	unsigned b = 0;

	*on = 0;
	if (v && q4kh_parse_bool(v, &b))
		return q4kh_fail(err, "%s: require_deep '%s': expected " Q4KH_BOOL_WORDS
		                 " (on: run and serve accept deep receipts only, made by q4khost "
		                 "validate --deep)",
		                 origin, q4kh_show(shown, sizeof(shown), v, strlen(v), VALUE_SHOWN, 0));
	*on = (int)b;
	return 0;
}

int q4kh_settings_f2_deep_probe(const struct q4kh_config *c, int *on, char *why, size_t cap,
                                int *bad_input, struct q4kh_error *err)
{
	char origin[700];

	if (q4kh_settings_f2_require_deep(c, on, origin, sizeof(origin), bad_input, err))
		return -1;
	if (*on)
		snprintf(why, cap, "require_deep = true at %.600s", origin);
	return 0;
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
