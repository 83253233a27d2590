/*
 * q4khost plugins: the plugin path and where it came from, every plugin
 * file with its verdict, and the devices of every accepted backend (or
 * why it has none); with
 * --explain, what would be chosen and why (cmd_plugins_explain.c).
 */
#include "buildconf.h"

#include <getopt.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "cli.h"
#include "config.h"
#include "enumerate.h"
#include "f2.h"
#include "registry.h"
#include "settings.h"
#include <q4khost/quant.h>

struct plugins_opts {
	const char *plugin_path, *config_file, *kernel, *backend;
	int json, explain;
};

/* What one accepted backend said when asked for its devices. */
struct probe {
	const struct q4kh_plugin *plugin;
	char error[768]; /* "" when the listing worked */
	char why_none[768]; /* no device: why, in the backend's words ("": it does not say) */
	uint32_t n_devices;
	struct q4kh_device_record *devices;
};

static void usage(FILE *out)
{
	fprintf(out,
	        "usage: q4khost plugins [--explain [--kernel LIST] [--backend NAME]]\n"
	        "                       [--plugin-path P] [--config FILE] [--json]\n\n"
	        "List the plugin path and where it came from, every plugin file found\n"
	        "(ACCEPTED, REJECTED with the reason, SHADOWED by an earlier file of\n"
	        "the same name, or REFUSED: a backend whose init or device enumeration\n"
	        "crashed or hung in a helper process, remembered until its file\n"
	        "changes), and the devices of every accepted backend (for one with none,\n"
	        "why, in the backend's words).\n\n"
	        "With --explain: for every device of every backend, the kernel chain that\n"
	        "q4khost run tries (each candidate must still pass F2), the first choice\n"
	        "and the runner-up per tensor type, the F2 rules of each candidate, and\n"
	        "for every setting its value and where it came from (a flag, a variable,\n"
	        "FILE:LINE of a config file, or the default).\n\n"
	        "      --explain         explain the choices instead of listing plugins\n"
	        "      --kernel LIST     as q4khost run --kernel (with --explain)\n"
	        "      --backend NAME    as q4khost run --backend (with --explain)\n"
	        "      --plugin-path P   ':'-separated plugin folders (default:\n"
	        "                        $Q4KHOST_PLUGIN_PATH, else [plugins] path in\n"
	        "                        the config, else the built-in folder)\n"
	        "      --config FILE     extra INI configuration file\n"
	        "      --json            print one JSON object\n"
	        "  -h, --help            this help\n\n"
	        "exit codes: 0 listed (even when plugins were rejected), 1 failure,\n"
	        "            2 usage, 3 bad config file, 4 a kernel setting names an\n"
	        "            unknown variant\n");
}

/* 0 to go on, 1 after --help, -1 on a usage error. */
static int parse(int argc, char **argv, struct plugins_opts *o)
{
	enum { O_PPATH = 256, O_CONFIG, O_JSON, O_EXPLAIN, O_KERNEL, O_BACKEND };
	static const struct option longs[] = {
		{ "explain", no_argument, 0, O_EXPLAIN },
		{ "kernel", required_argument, 0, O_KERNEL },
		{ "backend", required_argument, 0, O_BACKEND },
		{ "plugin-path", required_argument, 0, O_PPATH },
		{ "config", required_argument, 0, O_CONFIG },
		{ "json", no_argument, 0, O_JSON },
		{ "help", no_argument, 0, 'h' },
		{ 0, 0, 0, 0 },
	};
	int c;

	memset(o, 0, sizeof(*o));
	optind = 1;
	opterr = 0;
	while ((c = getopt_long(argc, argv, ":h", longs, NULL)) != -1) {
		switch (c) {
		case O_PPATH: o->plugin_path = optarg; break;
		case O_CONFIG: o->config_file = optarg; break;
		case O_JSON: o->json = 1; break;
		case O_EXPLAIN: o->explain = 1; break;
		case O_KERNEL: o->kernel = optarg; break;
		case O_BACKEND: o->backend = optarg; break;
		case 'h': usage(stdout); return 1;
		default: q4kh_cli_bad_option("plugins", argv, c); return -1;
		}
	}
	if (q4kh_cli_given_check("plugins", &(struct q4kh_cli_given){ NULL, o->config_file,
	                                                    o->plugin_path, o->backend,
	                                                    "--kernel", o->kernel }))
		return -1;
	if (optind < argc) {
		q4kh_cli_extra_argument("plugins", argv[optind]);
		return -1;
	}
	if ((o->kernel || o->backend) && !o->explain) {
		fprintf(stderr, "q4khost plugins: --kernel and --backend need --explain\n");
		return -1;
	}
	return 0;
}

static const char *state_word(enum q4kh_plugin_state s)
{
	switch (s) {
	case Q4KH_PLUGIN_ACCEPTED: return "accepted";
	case Q4KH_PLUGIN_REJECTED: return "rejected";
	case Q4KH_PLUGIN_SHADOWED: return "shadowed";
	case Q4KH_PLUGIN_REFUSED: return "refused";
	}
	return "unknown";
}

static const char *kind_word(uint32_t kind)
{
	return kind == Q4KH_KIND_BACKEND ? "backend" :
	       kind == Q4KH_KIND_KERNEL ? "kernel" : "unknown";
}

static int is_backend(const struct q4kh_plugin *p)
{
	return p->state == Q4KH_PLUGIN_ACCEPTED &&
	       p->desc->kind == Q4KH_KIND_BACKEND;
}

static void terminate_strings(struct q4kh_device_record *d)
{
	/* A plugin's strings are fixed arrays: never trust them to end. */
	d->name[sizeof(d->name) - 1] = 0;
	d->uuid[sizeof(d->uuid) - 1] = 0;
	d->arch[sizeof(d->arch) - 1] = 0;
	d->driver_version[sizeof(d->driver_version) - 1] = 0;
}

/* Ask an initialised backend for its devices; the text of a failure in pr. */
static void list_devices(const struct q4kh_backend_v1 *v, q4kh_backend_ctx *ctx,
                         struct probe *pr)
{
	q4kh_status st = v->device_count(ctx, &pr->n_devices);

	if (st != Q4KH_OK) {
		snprintf(pr->error, sizeof(pr->error), "device_count failed (%s): %s",
		         q4kh_status_name(st), v->last_error(ctx));
		pr->n_devices = 0;
		return;
	}
	if (pr->n_devices == 0)
		q4kh_backend_why_none(v, ctx, pr->why_none, sizeof(pr->why_none));
	pr->devices = calloc(pr->n_devices ? pr->n_devices : 1, sizeof(*pr->devices));
	if (!pr->devices) {
		snprintf(pr->error, sizeof(pr->error), "out of memory for %u devices",
		         pr->n_devices);
		pr->n_devices = 0;
		return;
	}
	for (uint32_t i = 0; i < pr->n_devices; i++) {
		struct q4kh_device_record *d = &pr->devices[i];

		d->struct_size = sizeof(*d);
		st = v->device_info(ctx, i, d);
		if (st != Q4KH_OK) {
			snprintf(pr->error, sizeof(pr->error),
			         "device_info(%u) failed (%s): %s", i,
			         q4kh_status_name(st), v->last_error(ctx));
			pr->n_devices = i;
			return;
		}
		terminate_strings(d);
	}
}

/* init, list devices, shutdown: the only plugin code this command runs. */
static void probe_backend(const struct q4kh_plugin *p, struct probe *pr)
{
	const struct q4kh_backend_v1 *v = p->desc->backend;
	q4kh_backend_ctx *ctx = NULL;
	q4kh_status st;

	memset(pr, 0, sizeof(*pr));
	pr->plugin = p;
	st = v->init(&p->api, &ctx);
	if (st != Q4KH_OK) {
		/* plugin.h: last_error(NULL) says why init failed. */
		snprintf(pr->error, sizeof(pr->error), "init failed (%s): %s",
		         q4kh_status_name(st), v->last_error(NULL));
		return;
	}
	list_devices(v, ctx, pr);
	v->shutdown(ctx);
}

static const char *or_dash(const char *s)
{
	return s && *s ? s : "-";
}

/* A kernel variant's table, once the loader has checked it; else NULL. */
static const struct q4kh_kernel_v1 *kernel_table(const struct q4kh_plugin *p)
{
	if (p->state != Q4KH_PLUGIN_ACCEPTED || !p->desc || p->desc->kind != Q4KH_KIND_KERNEL)
		return NULL;
	return p->desc->kernel;
}

/* The arithmetic class an accepted plugin declares (plugin.h, q4kh_arith),
 * which sets F2's floor for its paths; NULL for any other. */
static const char *arith_word(const struct q4kh_plugin *p)
{
	return p->state == Q4KH_PLUGIN_ACCEPTED ? q4kh_f2_arith_name(q4kh_plugin_arith(p)) : NULL;
}

static void print_plugin(const struct q4kh_plugin *p)
{
	const struct q4kh_plugin_desc *d = p->desc;

	printf("\n%s\n", p->path);
	if (p->state == Q4KH_PLUGIN_REJECTED)
		printf("  REJECTED: %s\n", p->reason);
	else if (p->state == Q4KH_PLUGIN_SHADOWED)
		printf("  SHADOWED by %s\n", p->shadowed_by);
	else if (p->state == Q4KH_PLUGIN_REFUSED)
		printf("  REFUSED: %s\n", p->reason);
	else
		printf("  ACCEPTED\n");
	printf("  name:      %s\n", p->name);
	if (!d)
		return;
	printf("  kind:      %s\n", kind_word(d->kind));
	printf("  version:   %s\n", or_dash(d->version));
	printf("  vendor:    %s\n", or_dash(d->vendor));
	printf("  license:   %s\n", or_dash(d->license));
	printf("  build id:  %s\n", or_dash(d->build_id));
	printf("  ABI:       %d.%u\n", Q4KH_ABI_MAJOR, d->abi_minor);
	if (arith_word(p))
		printf("  arith:     %s\n", arith_word(p));
	if (kernel_table(p)) {
		const struct q4kh_kernel_v1 *k = d->kernel;

		printf("  for:       %s, types", k->backend);
		for (uint32_t i = 0; i < k->n_types; i++)
			printf(" %s", q4kh_type_name(k->types[i]));
		putchar('\n');
	}
}

static void print_probe(const struct probe *pr)
{
	if (pr->error[0] && pr->n_devices == 0) {
		printf("\nbackend %s: %s\n", pr->plugin->name, pr->error);
		return;
	}
	printf("\nbackend %s: %u device%s\n", pr->plugin->name, pr->n_devices,
	       pr->n_devices == 1 ? "" : "s");
	if (pr->n_devices == 0)
		printf("  why none: %s\n", pr->why_none[0] ? pr->why_none : "(the backend does not say)");
	for (uint32_t i = 0; i < pr->n_devices; i++) {
		const struct q4kh_device_record *d = &pr->devices[i];

		printf("  device %u: %s\n", d->index, d->name);
		printf("    uuid:            %s\n", or_dash(d->uuid));
		printf("    arch:            %s\n", or_dash(d->arch));
		printf("    memory:          %llu bytes (%.2f GiB)\n",
		       (unsigned long long)d->memory_bytes,
		       (double)d->memory_bytes / (1024.0 * 1024 * 1024));
		printf("    driver:          %s\n", or_dash(d->driver_version));
		printf("    multiprocessors: %u\n", d->multiprocessors);
	}
	if (pr->error[0])
		printf("  error: %s\n", pr->error);
}

static void print_text(const struct q4kh_registry *r, const struct probe *probes,
                       size_t n_probes)
{
	printf("plugin path: %s\n", r->path);
	printf("  from:      %s\n", r->path_origin);
	for (const char *line = r->notes; *line;) {
		size_t len = strcspn(line, "\n");
		printf("  note:      %.*s\n", (int)len, line);
		line += len + (line[len] == '\n');
	}
	if (r->n_plugins == 0)
		printf("\nno plugin files found\n");
	for (size_t i = 0; i < r->n_plugins; i++)
		print_plugin(&r->plugins[i]);
	for (size_t i = 0; i < n_probes; i++)
		print_probe(&probes[i]);
}

/* A JSON string, null for NULL; a plugin's bytes need not be UTF-8. */
static json_t *jstr(const char *s)
{
	json_t *j;

	if (!s)
		return json_null();
	j = json_string(s);
	return j ? j : json_string("(not valid UTF-8)");
}

static json_t *plugin_json(const struct q4kh_plugin *p)
{
	const struct q4kh_plugin_desc *d = p->desc;
	json_t *o = json_object();

	json_object_set_new(o, "path", jstr(p->path));
	json_object_set_new(o, "state", json_string(state_word(p->state)));
	json_object_set_new(o, "name", jstr(p->name));
	if (p->state == Q4KH_PLUGIN_REJECTED || p->state == Q4KH_PLUGIN_REFUSED)
		json_object_set_new(o, "reason", jstr(p->reason));
	if (p->state == Q4KH_PLUGIN_SHADOWED)
		json_object_set_new(o, "shadowed_by", jstr(p->shadowed_by));
	if (!d)
		return o;
	json_object_set_new(o, "kind", json_string(kind_word(d->kind)));
	json_object_set_new(o, "version", jstr(d->version));
	json_object_set_new(o, "vendor", jstr(d->vendor));
	json_object_set_new(o, "license", jstr(d->license));
	json_object_set_new(o, "build_id", jstr(d->build_id));
	json_object_set_new(o, "abi_major", json_integer(Q4KH_ABI_MAJOR));
	json_object_set_new(o, "abi_minor", json_integer(d->abi_minor));
	if (arith_word(p))
		json_object_set_new(o, "arith", json_string(arith_word(p)));
	if (kernel_table(p)) {
		const struct q4kh_kernel_v1 *k = d->kernel;
		json_t *types = json_array();

		for (uint32_t i = 0; i < k->n_types; i++)
			json_array_append_new(types, json_string(q4kh_type_name(k->types[i])));
		json_object_set_new(o, "backend", jstr(k->backend));
		json_object_set_new(o, "types", types);
	}
	return o;
}

static json_t *device_json(const struct q4kh_device_record *d)
{
	json_t *o = json_object();

	json_object_set_new(o, "index", json_integer(d->index));
	json_object_set_new(o, "name", jstr(d->name));
	json_object_set_new(o, "uuid", jstr(d->uuid));
	json_object_set_new(o, "arch", jstr(d->arch));
	json_object_set_new(o, "memory_bytes", json_integer((json_int_t)d->memory_bytes));
	json_object_set_new(o, "driver_version", jstr(d->driver_version));
	json_object_set_new(o, "multiprocessors", json_integer(d->multiprocessors));
	return o;
}

static json_t *probe_json(const struct probe *pr)
{
	json_t *o = json_object(), *devs = json_array();

	json_object_set_new(o, "name", jstr(pr->plugin->name));
	json_object_set_new(o, "path", jstr(pr->plugin->path));
	for (uint32_t i = 0; i < pr->n_devices; i++)
		json_array_append_new(devs, device_json(&pr->devices[i]));
	json_object_set_new(o, "devices", devs);
	if (!pr->error[0] && pr->n_devices == 0)
		json_object_set_new(o, "why_no_devices", pr->why_none[0] ? jstr(pr->why_none) : json_null());
	if (pr->error[0])
		json_object_set_new(o, "error", jstr(pr->error));
	return o;
}

static int print_json(const struct q4kh_registry *r, const struct probe *probes,
                      size_t n_probes)
{
	json_t *root = json_object(), *plugins = json_array(), *backends = json_array();
	int rc;

	json_object_set_new(root, "plugin_path", jstr(r->path));
	json_object_set_new(root, "path_origin", jstr(r->path_origin));
	json_object_set_new(root, "path_notes", jstr(r->notes));
	for (size_t i = 0; i < r->n_plugins; i++)
		json_array_append_new(plugins, plugin_json(&r->plugins[i]));
	json_object_set_new(root, "plugins", plugins);
	for (size_t i = 0; i < n_probes; i++)
		json_array_append_new(backends, probe_json(&probes[i]));
	json_object_set_new(root, "backends", backends);
	rc = json_dumpf(root, stdout, JSON_INDENT(2));
	json_decref(root);
	if (rc != 0)
		return -1;
	putchar('\n');
	return 0;
}

/* Probe every accepted backend, print the listing, free the probes. */
static int report(const struct q4kh_registry *r, int json)
{
	struct probe *probes = calloc(r->n_plugins + 1, sizeof(*probes));
	size_t n = 0;
	int rc;

	if (!probes) {
		fprintf(stderr, "q4khost plugins: out of memory\n");
		return Q4KH_EXIT_FAIL;
	}
	for (size_t i = 0; i < r->n_plugins; i++)
		if (is_backend(&r->plugins[i]))
			probe_backend(&r->plugins[i], &probes[n++]);
	if (json) {
		rc = print_json(r, probes, n) == 0 ? Q4KH_EXIT_OK : Q4KH_EXIT_FAIL;
	} else {
		print_text(r, probes, n);
		rc = Q4KH_EXIT_OK;
	}
	for (size_t i = 0; i < n; i++)
		free(probes[i].devices);
	free(probes);
	if (fflush(stdout) != 0)
		rc = Q4KH_EXIT_FAIL;
	return rc;
}

/*
 * The listing does not use the F2 mode, but a bad Q4KHOST_F2 or [f2] mode
 * is said here too (--explain and every command that runs refuse it).
 */
static void warn_f2_mode(const struct q4kh_config *c)
{
	struct q4kh_error err = { "" };
	enum q4kh_f2_mode mode;
	char origin[700];
	int bad_file;

	if (q4kh_settings_f2_mode(c, NULL, &mode, origin, sizeof(origin), &bad_file, &err))
		fprintf(stderr, "q4khost plugins: warning: %s; run, bench and plugins --explain "
		        "refuse it (exit %d)\n", err.msg,
		        bad_file ? Q4KH_EXIT_INPUT : Q4KH_EXIT_USAGE);
}

int q4kh_cmd_plugins(int argc, char **argv)
{
	struct plugins_opts o;
	struct q4kh_config *config = NULL;
	struct q4kh_registry *registry = NULL;
	struct q4kh_error err = { "" };
	int rc = parse(argc, argv, &o);

	if (rc != 0)
		return rc > 0 ? Q4KH_EXIT_OK : Q4KH_EXIT_USAGE;
	if (q4kh_cli_config("plugins", o.config_file, 0, &config, &err) != 0 ||
	    q4kh_enumerate_timeout(config, &(unsigned){ 0 }, &err) != 0) {
		fprintf(stderr, "q4khost plugins: %s\n", err.msg);
		q4kh_config_free(config);
		return Q4KH_EXIT_INPUT;
	}
	if (q4kh_registry_scan(o.plugin_path, config, &registry, &err) != 0 ||
	    q4kh_enumerate_vet(registry, config, &err) != 0) {
		fprintf(stderr, "q4khost plugins: %s\n", err.msg);
		q4kh_registry_free(registry);
		q4kh_config_free(config);
		return Q4KH_EXIT_FAIL;
	}
	if (!o.explain)
		warn_f2_mode(config);
	/* A plan needs the plugin settings run takes: refuse what run refuses
	 * (F2's own settings are explained below, a bad receipt folder with
	 * its consequence). */
	if (o.explain &&
	    q4kh_registry_check_settings(registry, NULL, NULL, q4kh_cli_warn_line, (void *)"plugins", &err)) {
		fprintf(stderr, "q4khost plugins: %s\n", err.msg);
		q4kh_registry_free(registry);
		q4kh_config_free(config);
		return Q4KH_EXIT_INPUT;
	}
	rc = o.explain ? q4kh_plugins_explain(registry, config, o.kernel, o.backend, o.json)
	               : report(registry, o.json);
	q4kh_registry_free(registry);
	q4kh_config_free(config);
	return rc;
}
