/*
 * q4khost conformance: every op of a backend against the cpu reference
 * (host/lib/conformance.h), one table or one JSON object.
 */
#include <getopt.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "cli.h"
#include "conformance.h"

struct opts {
	const char *backend, *plugin_path, *config_file;
	long device, seed;
	int json, device_set;
};

static void usage(FILE *out)
{
	fprintf(out,
	        "usage: q4khost conformance [--backend NAME] [OPTIONS]\n\n"
	        "Run every op a backend offers on the same random inputs as the cpu\n"
	        "reference and compare: shapes that are no tile multiple, strided views,\n"
	        "outputs poisoned with NaN, guard bytes around every tensor, a NaN input.\n"
	        "Each case passes when its normalised mean squared error against the\n"
	        "reference is within the op's limit (1e-7 for f32 arithmetic, 5e-4 for\n"
	        "quantized products and attention).\n\n"
	        "  -b, --backend NAME    the backend to check (default: every accepted\n"
	        "                        backend but the reference)\n"
	        "      --device N        device index within the backend (default: all)\n"
	        "      --seed N          inputs' random seed (default 1)\n"
	        "      --plugin-path P   ':'-separated plugin folders\n"
	        "      --config FILE     extra INI configuration file\n"
	        "      --json            one JSON object\n"
	        "  -h, --help            this help\n\n"
	        "exit codes: 0 every case passed, 1 a case failed, 2 usage, 3 bad\n"
	        "            config file, 4 no such backend or device, or no reference\n");
}

static int parse(int argc, char **argv, struct opts *o)
{
	enum { O_PATH = 256, O_CONFIG, O_JSON, O_DEVICE, O_SEED };
	static const struct option longopts[] = {
		{ "backend", required_argument, 0, 'b' },
		{ "device", required_argument, 0, O_DEVICE },
		{ "seed", required_argument, 0, O_SEED },
		{ "plugin-path", required_argument, 0, O_PATH },
		{ "config", required_argument, 0, O_CONFIG },
		{ "json", no_argument, 0, O_JSON },
		{ "help", no_argument, 0, 'h' },
		{ 0, 0, 0, 0 },
	};
	int c;

	memset(o, 0, sizeof(*o));
	o->seed = 1;
	opterr = 0;
	while ((c = getopt_long(argc, argv, ":b:h", longopts, NULL)) != -1) {
		switch (c) {
		case 'b': o->backend = optarg; break;
		case O_DEVICE:
			if (q4kh_cli_parse_long("conformance", optarg, "--device", 0, 1023, &o->device))
				return -1;
			o->device_set = 1;
			break;
		case O_SEED:
			if (q4kh_cli_parse_long("conformance", optarg, "--seed", 0, 2147483647L, &o->seed))
				return -1;
			break;
		case O_PATH: o->plugin_path = optarg; break;
		case O_CONFIG: o->config_file = optarg; break;
		case O_JSON: o->json = 1; break;
		case 'h': usage(stdout); return 1;
		default: q4kh_cli_bad_option("conformance", argv, c); return -1;
		}
	}
	if (q4kh_cli_given_check("conformance",
	                         &(struct q4kh_cli_given){ NULL, o->config_file, o->plugin_path,
	                                                   o->backend, NULL, NULL }))
		return -1;
	if (optind < argc) {
		q4kh_cli_extra_argument("conformance", argv[optind]);
		return -1;
	}
	return 0;
}

/* What the cases report goes here: printed, or gathered into JSON. */
struct sink {
	int json;
	json_t *cases;
	int passed, failed, skipped;
};

static void on_case(void *data, const struct q4kh_conf_result *r)
{
	struct sink *s = data;
	const char *result = r->skipped ? "skip" : r->ok ? "pass" : "FAIL";
	char nmse[16] = "-";

	s->skipped += r->skipped;
	s->passed += !r->skipped && r->ok;
	s->failed += !r->ok;
	if (s->json) {
		json_array_append_new(
			s->cases,
			json_pack("{s:s, s:s, s:s, s:o, s:f, s:s}", "op", r->op, "case", r->what,
			          "result", result, "nmse",
			          isnan(r->nmse) ? json_null() : json_real(r->nmse), "limit",
			          r->limit, "message", r->message));
		return;
	}
	if (!isnan(r->nmse))
		snprintf(nmse, sizeof(nmse), "%.2e", r->nmse);
	printf("%-14s %-62.62s %-5s %10s  %s\n", r->op, r->what, result, nmse, r->message);
}

/* Check device D of backend plugin P against the reference REF. */
static int check_device(const struct q4kh_plugin *p, uint32_t d, const struct q4kh_backend *ref,
                        const struct opts *o, struct sink *s, json_t *devices,
                        struct q4kh_error *err)
{
	struct q4kh_backend b;
	int before = s->failed, rc;

	if (q4kh_backend_open(p, d, &b, err))
		return -1;
	if (!s->json)
		printf("%s device %u: %s\n%-14s %-62s %-5s %10s\n", p->name, d, b.record.name, "op",
		       "case", "", "NMSE");
	s->cases = json_array();
	rc = q4kh_conformance_run(ref, &b, (uint64_t)o->seed, on_case, s, err);
	if (s->json)
		json_array_append_new(devices, json_pack("{s:s, s:i, s:s, s:o}", "backend", p->name,
		                                         "device", (int)d, "name", b.record.name,
		                                         "cases", s->cases));
	else
		json_decref(s->cases);
	q4kh_backend_close(&b);
	if (rc < 0)
		return -1;
	if (!s->json)
		printf("%s device %u: %d of the cases failed\n\n", p->name, d, s->failed - before);
	return 0;
}

/* The backend named with -b is loaded, but has no device to check. */
static int no_device(const struct q4kh_plugin *p, struct q4kh_error *err)
{
	char why[512];

	q4kh_backend_why_no_device(p, why, sizeof(why));
	q4kh_fail(err, "backend %s (%s) is loaded but has no device, so there is nothing to check%s%s",
	          p->name, p->path, why[0] ? "; it says: " : " (it does not say why)", why);
	return Q4KH_EXIT_PLUGIN;
}

int q4kh_cmd_conformance(int argc, char **argv)
{
	struct opts o;
	struct q4kh_error err = { { 0 } };
	struct q4kh_config *config = NULL;
	struct q4kh_registry *r = NULL;
	const struct q4kh_plugin *cpu;
	struct q4kh_backend ref = { 0 };
	struct sink s = { 0 };
	json_t *devices;
	char why[700];
	int rc = parse(argc, argv, &o), checked = 0;

	if (rc)
		return rc > 0 ? Q4KH_EXIT_OK : Q4KH_EXIT_USAGE;
	devices = json_array(); /* after the usage checks: they return at once */
	s.json = o.json;
	rc = q4kh_cli_config("conformance", o.config_file, o.json, &config, &err);
	if (rc == 0)
		rc = q4kh_cli_plugins("conformance", o.plugin_path, config, o.json, NULL, &r, &err);
	else
		rc = Q4KH_EXIT_INPUT;
	if (rc)
		goto out;
	if (q4kh_registry_check_backend(r, o.backend, "--backend", &err)) {
		rc = Q4KH_EXIT_PLUGIN;
		goto out;
	}
	cpu = q4kh_registry_find(r, "cpu");
	if (!cpu || cpu->state != Q4KH_PLUGIN_ACCEPTED || q4kh_backend_open(cpu, 0, &ref, &err)) {
		if (!err.msg[0]) {
			q4kh_registry_why_absent(r, "cpu", why, sizeof(why));
			q4kh_fail(&err, "the reference cpu plugin is not on the plugin path %s%s%s",
			          r->path, why[0] ? ": " : "", why);
		}
		rc = Q4KH_EXIT_PLUGIN;
		goto out;
	}
	for (size_t i = 0; i < r->n_plugins; i++) {
		const struct q4kh_plugin *p = &r->plugins[i];
		uint32_t n = 0;

		if (p->state != Q4KH_PLUGIN_ACCEPTED || p->desc->kind != Q4KH_KIND_BACKEND ||
		    (o.backend ? strcmp(p->name, o.backend) : !strcmp(p->name, "cpu")))
			continue;
		if (q4kh_backend_devices(p, &n, &err)) {
			rc = Q4KH_EXIT_FAIL;
			goto out;
		}
		if (n == 0 && o.backend) {
			rc = no_device(p, &err);
			goto out;
		}
		for (uint32_t d = 0; d < n; d++) {
			if (o.device_set && d != (uint32_t)o.device)
				continue;
			if (check_device(p, d, &ref, &o, &s, devices, &err)) {
				rc = Q4KH_EXIT_FAIL;
				goto out;
			}
			checked++;
		}
	}
	if (!checked) {
		char dev[48] = "";

		if (o.device_set)
			snprintf(dev, sizeof(dev), " with a device %ld (--device)", o.device);
		q4kh_fail(&err, "no backend %s%s on the plugin path %s",
		          o.backend ? o.backend : "but the reference", dev, r->path);
		rc = Q4KH_EXIT_PLUGIN;
		goto out;
	}
	if (o.json) {
		json_t *root = json_pack("{s:o, s:i, s:i, s:i}", "devices", devices, "passed",
		                         s.passed, "failed", s.failed, "skipped", s.skipped);
		json_dumpf(root, stdout, JSON_INDENT(2));
		putchar('\n');
		json_decref(root);
		devices = NULL;
	} else {
		printf("%d passed, %d failed, %d skipped\n", s.passed, s.failed, s.skipped);
	}
	rc = s.failed ? Q4KH_EXIT_FAIL : Q4KH_EXIT_OK;
out:
	if (rc && err.msg[0])
		fprintf(stderr, "q4khost conformance: %s\n", err.msg);
	json_decref(devices);
	q4kh_backend_close(&ref);
	q4kh_registry_free(r);
	q4kh_config_free(config);
	return rc;
}
