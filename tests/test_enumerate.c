/*
 * Backends that take down whoever enumerates them, through the real CLI
 * (enumerate.h): one whose init aborts, one whose device_count hangs, one
 * whose device_info dies of SIGSEGV (tests/plugins/backend_v1_0.c) sit on
 * the plugin path with the reference cpu plugin. `q4khost plugins` lists
 * each as refused with its signal or its time limit, `run` serves on cpu
 * and names them; the verdicts are cached, so a second command starts no
 * helper (each plugin logs every init it gets), until a plugin file
 * changes or its record is one this process may not trust.
 */
#include <criterion/criterion.h>
#include <jansson.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli_rig.h"
#include "helpers.h"

/* The rig of one test: plugins, receipts, a config with a short limit, a log. */
struct rig {
	const char *plugins, *receipts;
	char config[4200], env[4200];
};

static void rig_init(struct rig *r)
{
	char *config;

	r->plugins = test_plugin_dir((const char *const[]){ "enum_abort", "enum_hang",
		                                              "enum_describe", NULL });
	r->receipts = test_tmpdir();
	config = file_with("q4khost.ini", "[plugins]\nenumerate_timeout_s = 1\n");
	snprintf(r->config, sizeof(r->config), "%s", config);
	free(config);
	snprintf(r->env, sizeof(r->env), "Q4KH_TEST_ENUM_LOG=%s/init.log", r->receipts);
}

/* q4khost COMMAND ... on the rig: its exit status, its output in *out. */
static int q4khost_on(const struct rig *r, const char *command, char **out)
{
	char args[16384];

	snprintf(args, sizeof(args), "%s --plugin-path %s --config %s", command, r->plugins,
	         r->config);
	return test_q4khost(r->env, r->receipts, args, out);
}

/* How many inits plugin NAME has had, from its log. */
static int inits(const struct rig *r, const char *name)
{
	char path[4200], line[128];
	size_t len = 0;
	char *log;
	int n;

	snprintf(path, sizeof(path), "%s/init.log", r->receipts);
	if (access(path, F_OK) != 0)
		return 0;
	log = test_read_file(path, &len);
	snprintf(line, sizeof(line), "%s init\n", name);
	n = count(log, line);
	free(log);
	return n;
}

/* The "plugins" entry of the plugin named NAME in `plugins --json` output. */
static json_t *plugin_entry(json_t *root, const char *name)
{
	json_t *p;
	size_t i;

	json_array_foreach(json_object_get(root, "plugins"), i, p)
		if (!strcmp(json_string_value(json_object_get(p, "name")), name))
			return p;
	cr_assert_fail("no plugin %s in the listing", name);
	return NULL;
}

/* Plugin NAME is listed as refused, its reason holding WHY. */
static void expect_refused(json_t *root, const char *name, const char *why)
{
	json_t *p = plugin_entry(root, name);
	const char *reason = json_string_value(json_object_get(p, "reason"));

	cr_expect_str_eq(json_string_value(json_object_get(p, "state")), "refused", "%s", name);
	cr_expect(reason && strstr(reason, why), "%s: '%s' lacks '%s'", name,
	          reason ? reason : "(none)", why);
}

/* The reasons, from the C library's own names of the signals. */
static void expect_all_refused(json_t *root)
{
	char aborted[128], segv[128];

	snprintf(aborted, sizeof(aborted), "its init or device enumeration (in a helper process) "
	         "crashed: killed by signal %d (%s); the command went on without it",
	         SIGABRT, strsignal(SIGABRT));
	snprintf(segv, sizeof(segv), "its init or device enumeration (in a helper process) "
	         "crashed: killed by signal %d (%s)", SIGSEGV, strsignal(SIGSEGV));
	expect_refused(root, "enum-abort", aborted);
	expect_refused(root, "enum-hang", "its init or device enumeration (in a helper process) "
	               "timed out after 1 s and was killed");
	expect_refused(root, "enum-describe", segv);
	cr_expect_str_eq(json_string_value(json_object_get(plugin_entry(root, "cpu"), "state")),
	                 "accepted");
	/* only cpu is asked for its devices */
	cr_expect_eq(json_array_size(json_object_get(root, "backends")), 1);
}

Test(enumerate, plugins_lists_each_broken_backend_as_refused_once, .timeout = 120)
{
	struct rig r;
	char *out, cmd[8400];
	json_t *root;

	rig_init(&r);
	cr_assert_eq(q4khost_on(&r, "plugins --json", &out), 0, "%s", out);
	root = parse_json(out);
	expect_all_refused(root);
	json_decref(root);
	free(out);
	cr_expect_eq(inits(&r, "enum-abort"), 1);
	cr_expect_eq(inits(&r, "enum-hang"), 1);
	cr_expect_eq(inits(&r, "enum-describe"), 1);

	/* the second listing reads the cache: no helper, no init */
	cr_assert_eq(q4khost_on(&r, "plugins --json", &out), 0, "%s", out);
	root = parse_json(out);
	expect_all_refused(root);
	json_decref(root);
	free(out);
	cr_expect_eq(inits(&r, "enum-abort") + inits(&r, "enum-hang") +
	             inits(&r, "enum-describe"), 3, "a cached verdict started a helper");

	/* a changed file is tried again, and only it */
	snprintf(cmd, sizeof(cmd), "touch %s/enum_abort.so", r.plugins);
	cr_assert_eq(system(cmd), 0);
	cr_assert_eq(q4khost_on(&r, "plugins", &out), 0, "%s", out);
	cr_expect(strstr(out, "REFUSED: its init or device enumeration (in a helper process) crashed") != NULL, "%s", out);
	free(out);
	cr_expect_eq(inits(&r, "enum-abort"), 2);
	cr_expect_eq(inits(&r, "enum-hang"), 1);
	cr_expect_eq(inits(&r, "enum-describe"), 1);
}

Test(enumerate, run_serves_on_cpu_and_names_the_refused, .timeout = 120)
{
	struct rig r;
	char *out, command[4400];
	json_t *root, *refused;

	rig_init(&r);
	snprintf(command, sizeof(command), "run -n 1 -m %s", tiny_model());
	cr_assert_eq(q4khost_on(&r, command, &out), 0, "%s", out);
	cr_expect(strstr(out, "q4khost: backend cpu ") != NULL, "%s", out);
	cr_expect(strstr(out, "q4khost: refused backend enum-abort (") != NULL, "%s", out);
	cr_expect(strstr(out, "q4khost: refused backend enum-hang (") != NULL, "%s", out);
	cr_expect(strstr(out, "q4khost: refused backend enum-describe (") != NULL, "%s", out);
	free(out);

	/* the second run reads the cache, and still names them */
	cr_assert_eq(q4khost_on(&r, command, &out), 0, "%s", out);
	cr_expect_eq(count(out, "q4khost: refused backend enum-"), 3, "%s", out);
	free(out);

	/* and so does its JSON report, which says what served */
	snprintf(command, sizeof(command), "run -n 1 --json -m %s", tiny_model());
	cr_assert_eq(q4khost_on(&r, command, &out), 0, "%s", out);
	root = parse_json(out);
	refused = json_object_get(root, "refused_backends");
	cr_expect_str_eq(json_string_value(json_object_get(json_object_get(root, "backend"),
	                                                   "name")), "cpu");
	cr_assert_eq(json_array_size(refused), 3, "%s", out);
	cr_expect_str_eq(json_string_value(json_object_get(json_array_get(refused, 0), "name")),
	                 "enum-abort");
	/* in the path's order: file names sorted */
	cr_expect_str_eq(json_string_value(json_object_get(json_array_get(refused, 2), "name")),
	                 "enum-hang");
	cr_expect(strstr(json_string_value(json_object_get(json_array_get(refused, 2), "reason")),
	                 "timed out after 1 s") != NULL, "%s", out);
	json_decref(root);
	free(out);
	cr_expect_eq(inits(&r, "enum-abort") + inits(&r, "enum-hang") +
	             inits(&r, "enum-describe"), 3, "a cached verdict started a helper");
}

Test(enumerate, a_record_others_may_write_is_not_trusted, .timeout = 120)
{
	struct rig r;
	char *out, cmd[8400];

	rig_init(&r);
	cr_assert_eq(q4khost_on(&r, "plugins", &out), 0, "%s", out);
	free(out);
	cr_assert_eq(inits(&r, "enum-abort"), 1);
	/* a record others may write could have been edited by anyone */
	snprintf(cmd, sizeof(cmd), "chmod o+w %s/backends/*.enum", r.receipts);
	cr_assert_eq(system(cmd), 0);
	cr_assert_eq(q4khost_on(&r, "plugins", &out), 0, "%s", out);
	free(out);
	cr_expect_eq(inits(&r, "enum-abort"), 2);
	cr_expect_eq(inits(&r, "enum-describe"), 2);
}
