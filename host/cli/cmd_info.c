/* q4khost info: a GGUF file's header, metadata and tensor types. */
#include <getopt.h>
#include <inttypes.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <q4khost/quant.h>

#include "cli.h"
#include "gguf.h"
#include "weight_types.h"

#define SHOWN_ELEMS 8    /* array elements shown without --all */
#define SHOWN_BYTES 120  /* string bytes shown as text without --all */
#define KEY_COLUMN 44

struct type_total {
	uint64_t count, bytes;
};

/* Per-type counts and bytes, and the parameter count. No overflow: tensors
 * lie inside the file without overlap, and no type holds more than 2
 * values per byte. */
struct totals {
	struct type_total type[Q4KH_TYPE_COUNT];
	uint64_t params;
};

static void usage(FILE *out)
{
	fprintf(out,
	        "usage: q4khost info [--json] [--all] [-m FILE | FILE]\n\n"
	        "Print a GGUF file's header (size, version, alignment, tensor count),\n"
	        "every metadata key with its type and value, a table of tensor types\n"
	        "with their counts and bytes, and the total parameter count. FILE\n"
	        "defaults to the model q4khost run uses ($Q4KHOST_MODEL, else the\n"
	        "default model that fetch-model.sh fetches into the cache folder).\n\n"
	        "  -m, --model FILE  the same as FILE, as every other command takes it\n"
	        "      --all         print every array element and whole strings (by\n"
	        "                    default arrays show their first %d elements and\n"
	        "                    text output cuts strings at %d bytes)\n"
	        "      --json        print one JSON object with the same content; an\n"
	        "                    error is one object too, {\"error\": MESSAGE},\n"
	        "                    with its line on stderr\n"
	        "  -h, --help        this help\n\n"
	        "A tensor type q4khost does not run is marked \"unsupported\" in the\n"
	        "table, and the tensors of such types are listed (q4khost run and serve\n"
	        "refuse the file); the file is still described, exit code 0.\n\n"
	        "exit codes: 0 ok, 2 usage, 3 the file is not a valid GGUF file\n",
	        SHOWN_ELEMS, SHOWN_BYTES);
}

/* A string KV's value: a u64 little-endian length, then the bytes. */
static struct q4kh_gguf_str kv_string(const struct q4kh_gguf_kv *kv)
{
	struct q4kh_gguf_str s = { 0, (const char *)kv->data + 8 };

	for (int i = 7; i >= 0; i--)
		s.len = s.len << 8 | kv->data[i];
	return s;
}

/* The strings of a string-array KV (malloc()ed), or NULL with err set. */
static struct q4kh_gguf_str *kv_strings(const struct q4kh_gguf *g,
                                        const struct q4kh_gguf_kv *kv,
                                        struct q4kh_error *err)
{
	struct q4kh_gguf_str *v = malloc((kv->count ? kv->count : 1) * sizeof(*v));

	if (!v) {
		q4kh_fail(err, "%s: out of memory for %" PRIu64 " strings", g->path,
		          kv->count);
		return NULL;
	}
	if (q4kh_gguf_array_strings(g, kv, v, err)) {
		free(v);
		return NULL;
	}
	return v;
}

static const char *type_name(uint32_t t)
{
	const char *name = q4kh_type_name(t);

	return name ? name : "unknown";
}

static void tally(const struct q4kh_gguf *g, struct totals *t)
{
	memset(t, 0, sizeof(*t));
	for (uint64_t i = 0; i < g->n_tensors; i++) {
		const struct q4kh_gguf_tensor *x = &g->tensors[i];

		/* the reader accepts only known types, all below COUNT */
		t->type[x->type].count++;
		t->type[x->type].bytes += x->size;
		t->params += (uint64_t)(x->ne[0] * x->ne[1] * x->ne[2] * x->ne[3]);
	}
}

/* --- text ------------------------------------------------------------------ */

/* N bytes of S on one line: quotes, backslashes and control bytes escaped.
 * Returns the characters written. */
static int print_escaped(const char *s, uint64_t n)
{
	int w = 0;

	for (uint64_t i = 0; i < n; i++) {
		unsigned char c = (unsigned char)s[i];

		if (c == '"' || c == '\\')
			w += printf("\\%c", c);
		else if (c == '\n')
			w += printf("\\n");
		else if (c == '\t')
			w += printf("\\t");
		else if (c < 0x20 || c == 0x7f)
			w += printf("\\x%02x", c);
		else
			w += putchar(c) != EOF;
	}
	return w;
}

static void print_quoted(const char *s, uint64_t len, int all)
{
	uint64_t n = all || len <= SHOWN_BYTES ? len : SHOWN_BYTES;

	putchar('"');
	print_escaped(s, n);
	putchar('"');
	if (n < len)
		printf("... (%" PRIu64 " bytes)", len);
}

static void print_scalar(const struct q4kh_gguf_scalar *s)
{
	switch (s->type) {
	case Q4KH_GGUF_FLOAT32:
		printf("%.9g", s->v.f);
		break;
	case Q4KH_GGUF_FLOAT64:
		printf("%.17g", s->v.f);
		break;
	case Q4KH_GGUF_BOOL:
		fputs(s->v.u ? "true" : "false", stdout);
		break;
	case Q4KH_GGUF_INT8:
	case Q4KH_GGUF_INT16:
	case Q4KH_GGUF_INT32:
	case Q4KH_GGUF_INT64:
		printf("%" PRId64, s->v.i);
		break;
	default:
		printf("%" PRIu64, s->v.u);
	}
}

static int print_array(const struct q4kh_gguf *g, const struct q4kh_gguf_kv *kv,
                       int all, struct q4kh_error *err)
{
	uint64_t n = all || kv->count <= SHOWN_ELEMS ? kv->count : SHOWN_ELEMS;
	struct q4kh_gguf_str *strs = NULL;
	struct q4kh_gguf_scalar s;

	printf("%" PRIu64 " x %s", kv->count, q4kh_gguf_vtype_name(kv->elem_type));
	if (kv->elem_type == Q4KH_GGUF_ARRAY || kv->count == 0)
		return 0;
	if (kv->elem_type == Q4KH_GGUF_STRING && !(strs = kv_strings(g, kv, err)))
		return -1;
	fputs(": ", stdout);
	for (uint64_t i = 0; i < n; i++) {
		if (i)
			fputs(", ", stdout);
		if (strs)
			print_quoted(strs[i].data, strs[i].len, all);
		else if (!q4kh_gguf_scalar_at(kv, i, &s))
			print_scalar(&s);
	}
	if (n < kv->count)
		printf(", ... (%" PRIu64 " more)", kv->count - n);
	free(strs);
	return 0;
}

static int print_kv(const struct q4kh_gguf *g, const struct q4kh_gguf_kv *kv,
                    int all, struct q4kh_error *err)
{
	struct q4kh_gguf_scalar s;
	int w;

	fputs("  ", stdout);
	w = print_escaped(kv->key.data, kv->key.len);
	printf("%*s ", w < KEY_COLUMN ? KEY_COLUMN - w : 0, "");
	if (kv->type == Q4KH_GGUF_ARRAY) {
		printf("%-8s ", "array");
		if (print_array(g, kv, all, err))
			return -1;
	} else if (kv->type == Q4KH_GGUF_STRING) {
		struct q4kh_gguf_str str = kv_string(kv);

		printf("%-8s ", "string");
		print_quoted(str.data, str.len, all);
	} else {
		printf("%-8s ", q4kh_gguf_vtype_name(kv->type));
		q4kh_gguf_scalar_at(kv, 0, &s);
		print_scalar(&s);
	}
	putchar('\n');
	return 0;
}

/*
 * The tensors of types q4khost does not run (the first SHOWN_ELEMS without
 * ALL), and what that means, after the table.
 */
static void print_unsupported(const struct q4kh_gguf *g, int all)
{
	uint64_t n, shown = 0;
	char list[256];

	if (!q4kh_weight_types_unsupported(g, &n))
		return;
	printf("unsupported:   %" PRIu64 " tensor%s of types q4khost does not run (it runs %s; "
	       "run and serve refuse this file: re-quantize it with llama.cpp's "
	       "llama-quantize):\n", n, n == 1 ? "" : "s",
	       q4kh_weight_types_list(list, sizeof(list)));
	for (uint64_t i = 0; i < g->n_tensors && (all || shown < SHOWN_ELEMS); i++) {
		const struct q4kh_gguf_tensor *x = &g->tensors[i];

		if (q4kh_weight_type_supported(x->type))
			continue;
		fputs("  ", stdout);
		print_escaped(x->name.data, x->name.len);
		printf("  %s (GGUF type %" PRIu32 ")\n", type_name(x->type), x->type);
		shown++;
	}
	if (shown < n)
		printf("  ... (%" PRIu64 " more; --all lists them)\n", n - shown);
}

static int print_text(const struct q4kh_gguf *g, int all, struct q4kh_error *err)
{
	struct totals t;
	uint64_t bytes = 0;

	printf("path:          %s\n", g->path);
	printf("file size:     %" PRIu64 " bytes\n", g->size);
	printf("GGUF version:  %" PRIu32 "\n", g->version);
	printf("alignment:     %" PRIu64 "\n", g->alignment);
	printf("data offset:   %" PRIu64 "\n", g->data_offset);
	printf("tensors:       %" PRIu64 "\n", g->n_tensors);
	printf("metadata:      %" PRIu64 " keys\n", g->n_kv);
	for (uint64_t i = 0; i < g->n_kv; i++)
		if (print_kv(g, &g->kv[i], all, err))
			return -1;
	tally(g, &t);
	printf("tensor types:\n  %-8s %8s %16s\n", "type", "count", "bytes");
	for (uint32_t k = 0; k < Q4KH_TYPE_COUNT; k++) {
		if (!t.type[k].count)
			continue;
		printf("  %-8s %8" PRIu64 " %16" PRIu64 "%s\n", type_name(k),
		       t.type[k].count, t.type[k].bytes,
		       q4kh_weight_type_supported(k) ? "" : "  unsupported");
		bytes += t.type[k].bytes;
	}
	printf("  %-8s %8" PRIu64 " %16" PRIu64 "\n", "total", g->n_tensors, bytes);
	printf("parameters:    %" PRIu64 "\n", t.params);
	print_unsupported(g, all);
	return 0;
}

/* --- JSON ------------------------------------------------------------------ */

static json_t *json_scalar(const struct q4kh_gguf_scalar *s)
{
	switch (s->type) {
	case Q4KH_GGUF_FLOAT32:
	case Q4KH_GGUF_FLOAT64:
		/* JSON has no NaN or infinity */
		if (isnan(s->v.f))
			return json_string("nan");
		if (isinf(s->v.f))
			return json_string(s->v.f > 0 ? "inf" : "-inf");
		return json_real(s->v.f);
	case Q4KH_GGUF_BOOL:
		return json_boolean(s->v.u);
	case Q4KH_GGUF_INT8:
	case Q4KH_GGUF_INT16:
	case Q4KH_GGUF_INT32:
	case Q4KH_GGUF_INT64:
		return json_integer(s->v.i);
	default:
		if (s->v.u > INT64_MAX) { /* beyond json_int_t: keep it exact */
			char num[24];
			snprintf(num, sizeof(num), "%" PRIu64, s->v.u);
			return json_string(num);
		}
		return json_integer((json_int_t)s->v.u);
	}
}

/* Element I of an array KV as JSON; STRS holds its strings, if any. */
static json_t *json_elem(const struct q4kh_gguf_kv *kv,
                         const struct q4kh_gguf_str *strs, uint64_t i)
{
	struct q4kh_gguf_scalar s;

	if (strs)
		return q4kh_cli_json_text(strs[i].data, strs[i].len);
	if (q4kh_gguf_scalar_at(kv, i, &s))
		return json_null();
	return json_scalar(&s);
}

static int json_array_values(const struct q4kh_gguf *g,
                             const struct q4kh_gguf_kv *kv, int all, json_t *o,
                             struct q4kh_error *err)
{
	uint64_t n = all || kv->count <= SHOWN_ELEMS ? kv->count : SHOWN_ELEMS;
	struct q4kh_gguf_str *strs = NULL;
	json_t *values = json_array();

	json_object_set_new(o, "element_type",
	                    json_string(q4kh_gguf_vtype_name(kv->elem_type)));
	json_object_set_new(o, "count", json_integer((json_int_t)kv->count));
	json_object_set_new(o, "values", values);
	if (kv->elem_type == Q4KH_GGUF_ARRAY || kv->count == 0)
		return values ? 0 : -1;
	if (kv->elem_type == Q4KH_GGUF_STRING && !(strs = kv_strings(g, kv, err)))
		return -1;
	for (uint64_t i = 0; i < n; i++)
		json_array_append_new(values, json_elem(kv, strs, i));
	free(strs);
	json_object_set_new(o, "truncated", json_boolean(n < kv->count));
	return 0;
}

static json_t *json_kv(const struct q4kh_gguf *g, const struct q4kh_gguf_kv *kv,
                       int all, struct q4kh_error *err)
{
	json_t *o = json_object();
	struct q4kh_gguf_scalar s;
	struct q4kh_gguf_str str;

	if (!o)
		return NULL;
	json_object_set_new(o, "key", q4kh_cli_json_text(kv->key.data, kv->key.len));
	json_object_set_new(o, "type", json_string(q4kh_gguf_vtype_name(kv->type)));
	if (kv->type == Q4KH_GGUF_ARRAY) {
		if (json_array_values(g, kv, all, o, err)) {
			json_decref(o);
			return NULL;
		}
	} else if (kv->type == Q4KH_GGUF_STRING) {
		str = kv_string(kv);
		json_object_set_new(o, "value", q4kh_cli_json_text(str.data, str.len));
	} else {
		q4kh_gguf_scalar_at(kv, 0, &s);
		json_object_set_new(o, "value", json_scalar(&s));
	}
	return o;
}

static json_t *json_types(const struct totals *t)
{
	json_t *a = json_array();

	for (uint32_t k = 0; a && k < Q4KH_TYPE_COUNT; k++) {
		if (!t->type[k].count)
			continue;
		json_array_append_new(a, json_pack("{s:s, s:I, s:I, s:b}", "type",
		                                   type_name(k), "count",
		                                   (json_int_t)t->type[k].count, "bytes",
		                                   (json_int_t)t->type[k].bytes, "supported",
		                                   q4kh_weight_type_supported(k)));
	}
	return a;
}

/* Every tensor of a type q4khost does not run: {"name", "type", "type_id"}. */
static json_t *json_unsupported(const struct q4kh_gguf *g)
{
	json_t *a = json_array();

	for (uint64_t i = 0; a && i < g->n_tensors; i++) {
		const struct q4kh_gguf_tensor *x = &g->tensors[i];

		if (q4kh_weight_type_supported(x->type))
			continue;
		json_array_append_new(a, json_pack("{s:o, s:s, s:I}", "name",
		                                   q4kh_cli_json_text(x->name.data, x->name.len),
		                                   "type", type_name(x->type), "type_id",
		                                   (json_int_t)x->type));
	}
	return a;
}

static json_t *json_info(const struct q4kh_gguf *g, int all,
                         struct q4kh_error *err)
{
	json_t *root, *meta = json_array();
	struct totals t;

	for (uint64_t i = 0; meta && i < g->n_kv; i++) {
		json_t *kv = json_kv(g, &g->kv[i], all, err);
		if (!kv) {
			json_decref(meta);
			return NULL;
		}
		json_array_append_new(meta, kv);
	}
	tally(g, &t);
	root = json_pack("{s:o, s:I, s:I, s:I, s:I, s:I, s:I, s:o, s:o, s:o, s:I}",
	                 "path", q4kh_cli_json_text(g->path, strlen(g->path)),
	                 "file_size", (json_int_t)g->size,
	                 "version", (json_int_t)g->version,
	                 "alignment", (json_int_t)g->alignment,
	                 "data_offset", (json_int_t)g->data_offset,
	                 "tensor_count", (json_int_t)g->n_tensors,
	                 "kv_count", (json_int_t)g->n_kv,
	                 "metadata", meta,
	                 "tensor_types", json_types(&t),
	                 "unsupported_tensors", json_unsupported(g),
	                 "parameters", (json_int_t)t.params);
	if (!root)
		q4kh_fail(err, "%s: out of memory for the JSON report", g->path);
	return root;
}

/* A write that fails leaves stdout's error flag set: the dispatcher says
 * so once, or nothing when the reader went away (| head), as for text. */
static int print_json(const struct q4kh_gguf *g, int all, struct q4kh_error *err)
{
	json_t *root = json_info(g, all, err);

	if (!root)
		return -1;
	if (json_dumpf(root, stdout, JSON_INDENT(2)) == 0)
		putchar('\n');
	json_decref(root);
	return 0;
}

/* --- the command --------------------------------------------------------- */

/*
 * info reads no setting, but what is wrong with them is said here as by
 * every command (a Q4KHOST_CONFIG file that is not there, an unknown
 * Q4KHOST_ variable or key), as warnings: the work goes on.
 */
static void warn_config(void)
{
	struct q4kh_error err = { { 0 } };
	struct q4kh_config *c = NULL;

	if (q4kh_cli_config("info", NULL, 0, &c, &err))
		fprintf(stderr, "q4khost info: warning: %s (info reads no setting, so it goes on; "
		        "every other command stops here)\n", err.msg);
	q4kh_config_free(c);
}

/* A usage error, said on stderr; with --json among ARGV also as one JSON
 * object on stdout. Q4KH_EXIT_USAGE. */
static int usage_error(int argc, char **argv, const struct option *opts)
{
	if (q4kh_cli_json_asked(argc, argv, ":m:h", opts, 'j'))
		q4kh_cli_json_error(q4kh_cli_usage_said());
	return Q4KH_EXIT_USAGE;
}

int q4kh_cmd_info(int argc, char **argv)
{
	static const struct option opts[] = {
		{ "model", required_argument, NULL, 'm' },
		{ "json", no_argument, NULL, 'j' },
		{ "all", no_argument, NULL, 'a' },
		{ "help", no_argument, NULL, 'h' },
		{ NULL, 0, NULL, 0 },
	};
	struct q4kh_error err = { { 0 } };
	struct q4kh_gguf *g;
	char model_path[4096];
	const char *file = NULL;
	int json = 0, all = 0, c, rc;

	optind = 1;
	opterr = 0; /* our own message below names the command */
	while ((c = getopt_long(argc, argv, ":m:h", opts, NULL)) != -1) {
		switch (c) {
		case 'm':
			file = optarg;
			break;
		case 'j':
			json = 1;
			break;
		case 'a':
			all = 1;
			break;
		case 'h':
			usage(stdout);
			return Q4KH_EXIT_OK;
		default:
			q4kh_cli_bad_option("info", argv, c);
			return usage_error(argc, argv, opts);
		}
	}
	if (argc - optind > (file ? 0 : 1)) {
		q4kh_cli_usage("info", "expected one model file, as FILE or -m FILE, found %d "
		               "(try q4khost info --help)", argc - optind + (file != NULL));
		return usage_error(argc, argv, opts);
	}
	if (!file && optind < argc)
		file = argv[optind];
	if (q4kh_cli_given_check("info", &(struct q4kh_cli_given){ .model = file }))
		return usage_error(argc, argv, opts);
	warn_config();
	file = q4kh_cli_model(file, model_path, sizeof(model_path), &err);
	if (!file || q4kh_gguf_open(file, &g, &err))
		return q4kh_cli_error("info", json, Q4KH_EXIT_INPUT, err.msg);
	rc = json ? print_json(g, all, &err) : print_text(g, all, &err);
	q4kh_gguf_close(g);
	if (rc)
		return q4kh_cli_error("info", json, Q4KH_EXIT_FAIL, err.msg);
	return Q4KH_EXIT_OK;
}
