/*
 * Fuzz target: the layered INI configuration and the settings read from it
 * and from the environment. The input is NUL-separated parts:
 *   0  $(sysconfdir)/q4khost.ini      5  the --kernel value
 *   1  $(sysconfdir)/conf.d/50-a.ini  6  Q4KHOST_F2
 *   2  the user's q4khost.ini         7  the --f2 value
 *   3  the --config file              8  Q4KHOST_BACKEND
 *   4  Q4KHOST_Q4K_KERNEL             9  Q4KHOST_F2_RECEIPT_DIR
 * (a missing part: no such file or variable). Every layer is loaded, the
 * unknown-key check run, every key's origin looked up, and the F2 mode,
 * backend, F2 rules, receipt folder and the kernel choice (policy.c's
 * list parsing) resolved for a CPU and a GPU device against a registry of
 * stand-in plugins, as `q4khost plugins --explain` resolves them.
 */
#include "fuzz.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "config.h"
#include "config_keys.h"
#include "guard.h"
#include "policy.h"
#include "receipt.h"
#include "registry.h"
#include "settings.h"

enum { SYS_INI, CONF_D_INI, USER_INI, CLI_INI, ENV_KERNEL, CLI_KERNEL,
       ENV_F2, CLI_F2, ENV_BACKEND, ENV_RECEIPTS, N_PARTS };

/* Stand-ins for what a plugin scan finds: only what policy.c reads. */
static const struct q4kh_kernel_v1 for_cuda = { .backend = "cuda" };
static const struct q4kh_kernel_v1 for_cpu = { .backend = "cpu" };
static const struct q4kh_plugin_desc descs[] = {
	{ .kind = Q4KH_KIND_BACKEND, .name = "cpu" },
	{ .kind = Q4KH_KIND_BACKEND, .name = "cuda" },
	{ .kind = Q4KH_KIND_KERNEL, .name = "cuda-mwv", .kernel = &for_cuda },
	{ .kind = Q4KH_KIND_KERNEL, .name = "cuda-dp4a", .kernel = &for_cuda },
	{ .kind = Q4KH_KIND_KERNEL, .name = "cpu-q8act", .kernel = &for_cpu },
};
#define N_PLUGINS (sizeof(descs) / sizeof(descs[0]))

static const struct q4kh_device_record devices[] = {
	{ .index = 0, .name = "cpu (x86_64, 2 threads)", .uuid = "cpu", .arch = "x86_64" },
	{ .index = 1, .name = "NVIDIA H200", .uuid = "GPU-5c7a", .arch = "sm_90" },
};
static const char *const backends[] = { "cpu", "cuda" };

static struct q4kh_registry *stand_in_registry(void)
{
	static struct q4kh_plugin plugins[N_PLUGINS];
	static struct q4kh_registry r = { .path = "/fuzz/plugins",
	                                  .path_origin = "built-in" };

	for (size_t i = 0; i < N_PLUGINS; i++) {
		plugins[i].state = Q4KH_PLUGIN_ACCEPTED;
		plugins[i].desc = &descs[i];
		plugins[i].name = (char *)descs[i].name;
	}
	r.plugins = plugins;
	r.n_plugins = N_PLUGINS;
	return &r;
}

static void set_env(const char *name, const char *value)
{
	if (value)
		setenv(name, value, 1);
	else
		unsetenv(name);
}

static void one_line(void *data, const char *line)
{
	(void)data;
	if (!*line || strchr(line, '\n'))
		fuzz_violation("a config warning is not one line: %s", line);
}

struct keys {
	char section[8][256], key[8][256];
	size_t n;
};

static void collect(void *data, const char *file, unsigned line,
                    const char *section, const char *key)
{
	struct keys *k = data;

	(void)file;
	(void)line;
	if (k->n < 8) {
		snprintf(k->section[k->n], sizeof(k->section[0]), "%s", section);
		snprintf(k->key[k->n], sizeof(k->key[0]), "%s", key);
		k->n++;
	}
}

static void check_choice(const struct q4kh_registry *r,
                         const struct q4kh_kernel_choice *ch)
{
	if (ch->n > Q4KH_KERNEL_LIST)
		fuzz_violation("a kernel choice of %zu entries", ch->n);
	for (size_t i = 0; i < ch->n; i++)
		if (ch->names[i] && !q4kh_registry_find(r, ch->names[i]))
			fuzz_violation("the kernel choice names '%s', no plugin",
			               ch->names[i]);
}

static void resolve(const struct q4kh_config *c, char **parts)
{
	const struct q4kh_registry *r = stand_in_registry();
	struct q4kh_f2_rule_origins origins;
	struct q4kh_kernel_choice choice;
	struct q4kh_f2_rules rules;
	struct q4kh_error err;
	enum q4kh_f2_mode mode;
	char origin[700], dir[4096];
	const char *where;
	int bad_input;

	if (q4kh_settings_f2_mode(c, parts[CLI_F2], &mode, origin, sizeof(origin),
	                          &bad_input, &err))
		fuzz_check_error(&err, "q4kh_settings_f2_mode");
	q4kh_settings_backend(NULL, origin, sizeof(origin));
	for (size_t i = 0; i < N_PLUGINS; i++) {
		if (q4kh_guard_rules_where(c, descs[i].name, Q4KH_ARITH_UNDECLARED, &rules, &origins,
		                           &err)) {
			fuzz_check_error(&err, "q4kh_guard_rules_where");
			continue;
		}
		if (!(rules.floor >= Q4KH_F2_CATASTROPHIC && rules.floor <= 1.0) ||
		    rules.decode_steps < 8 || rules.probe_tokens < 2)
			fuzz_violation("F2 rules out of range: floor %g, %u steps, %u tokens",
			               rules.floor, rules.decode_steps, rules.probe_tokens);
	}
	q4kh_receipt_dir(c, dir, sizeof(dir), &where);
	for (size_t b = 0; b < 2; b++) {
		if (q4kh_policy_kernel_choice(r, c, parts[CLI_KERNEL], NULL, backends[b],
		                              &devices[b], &choice, &err))
			fuzz_check_error(&err, "q4kh_policy_kernel_choice");
		else
			check_choice(r, &choice);
	}
}

/* Write the file parts into their places under the private folder and
 * point the environment at them. Returns the --config file or NULL. */
static const char *lay_out(char **parts, char *sys, size_t cap)
{
	static const char *const dirs[] = { "etc", "etc/conf.d", "xdg", "xdg/q4khost" };
	static const struct {
		const char *file;
		int part;
	} files[] = {
		{ "etc/q4khost.ini", SYS_INI },
		{ "etc/conf.d/50-a.ini", CONF_D_INI },
		{ "xdg/q4khost/q4khost.ini", USER_INI },
		{ "cli.ini", CLI_INI },
	};
	static char cli[4200];
	const char *tmp = fuzz_tmpdir();
	char path[4300];

	for (size_t i = 0; i < sizeof(dirs) / sizeof(dirs[0]); i++) {
		snprintf(path, sizeof(path), "%s/%s", tmp, dirs[i]);
		mkdir(path, 0700);
	}
	for (size_t i = 0; i < sizeof(files) / sizeof(files[0]); i++) {
		snprintf(path, sizeof(path), "%s/%s", tmp, files[i].file);
		fuzz_put_file(path, parts[files[i].part]);
	}
	snprintf(sys, cap, "%s/etc", tmp);
	snprintf(path, sizeof(path), "%s/xdg", tmp);
	set_env("XDG_CONFIG_HOME", path);
	snprintf(cli, sizeof(cli), "%s/cli.ini", tmp);
	unsetenv("Q4KHOST_CONFIG");
	set_env("Q4KHOST_Q4K_KERNEL", parts[ENV_KERNEL]);
	set_env("Q4KHOST_F2", parts[ENV_F2]);
	set_env("Q4KHOST_BACKEND", parts[ENV_BACKEND]);
	set_env("Q4KHOST_F2_RECEIPT_DIR", parts[ENV_RECEIPTS]);
	return parts[CLI_INI] ? cli : NULL;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	char *parts[N_PARTS], sys[4200], origin[700];
	struct q4kh_config *c = NULL;
	struct q4kh_error err;
	struct keys keys = { .n = 0 };
	const char *cli;

	fuzz_split(data, size, parts, N_PARTS);
	cli = lay_out(parts, sys, sizeof(sys));
	if (q4kh_config_load(sys, cli, &c, &err)) {
		fuzz_check_error(&err, "q4kh_config_load");
	} else {
		q4kh_config_check(c, one_line, NULL);
		q4kh_config_each(c, collect, &keys);
		for (size_t i = 0; i < keys.n; i++)
			q4kh_config_where(c, keys.section[i], keys.key[i], origin,
			                  sizeof(origin));
		if (parts[CLI_F2] &&
		    q4kh_config_set(c, "f2", "mode", parts[CLI_F2], "--f2", &err))
			fuzz_check_error(&err, "q4kh_config_set");
	}
	/* With no config (a file refused) the environment still counts. */
	resolve(c, parts);
	q4kh_config_free(c);
	fuzz_free_parts(parts, N_PARTS);
	return 0;
}
