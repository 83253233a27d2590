/*
 * Weight types q4khost does not run, through the real CLI: a file holding
 * one is refused when it is opened (run, serve, validate: exit 3, one
 * line naming the tensor, its type, the supported list and what to do),
 * info marks it and lists its tensors, a type id no GGUF type has is
 * named with its tensor, and a backend without one of a model's types is
 * passed over for it with a line saying so, before anything runs.
 * The files are the tiny llama fixture with one tensor retyped.
 */
#include <criterion/criterion.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli_rig.h"
#include "gguf.h"
#include "helpers.h"
#include "q4khost/quant.h"

#define SUPPORTED "it runs F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, " \
	"Q4_K, Q5_K, Q6_K, IQ4_NL and IQ4_XS: re-quantize the model to one of them with " \
	"llama.cpp's llama-quantize"

/*
 * A copy of the tiny llama fixture whose tensor TENSOR (NULL: the last in
 * the data section) has type TYPE, the file grown (zeros) where that
 * type's data runs past its end; the tensor's name into NAME. A tensor
 * info is its name (u64 length, bytes), n_dims (u32), ne (u64 each), then
 * the type (u32): the name lies in the mapping.
 */
static char *retyped(const char *tensor, uint32_t type, char *name, size_t cap)
{
	struct q4kh_error err = { { 0 } };
	struct q4kh_gguf *g;
	const struct q4kh_gguf_tensor *last = NULL;
	char *path;
	uint8_t *bytes;
	uint64_t size, at, values;
	uint32_t bb = q4kh_type_block_bytes(type) ? q4kh_type_block_bytes(type) : 1;
	uint32_t be = q4kh_type_block_elems(type) ? q4kh_type_block_elems(type) : 1;
	FILE *f;

	cr_assert_eq(q4kh_gguf_open(tiny_model(), &g, &err), 0, "%s", err.msg);
	for (uint64_t i = 0; i < g->n_tensors; i++)
		if (tensor ? !strncmp(g->tensors[i].name.data, tensor, g->tensors[i].name.len) &&
		                     strlen(tensor) == g->tensors[i].name.len
		           : !last || g->tensors[i].offset > last->offset)
			last = &g->tensors[i];
	cr_assert_not_null(last, "no tensor %s in %s", tensor, tiny_model());
	snprintf(name, cap, "%.*s", (int)last->name.len, last->name.data);
	at = (uint64_t)((const uint8_t *)last->name.data - g->map) + last->name.len + 4 +
	     8 * last->n_dims;
	values = (uint64_t)(last->ne[0] * last->ne[1] * last->ne[2] * last->ne[3]);
	size = last->offset + values / be * bb;
	size = size > g->size ? size : g->size;
	bytes = calloc(1, size);
	cr_assert_not_null(bytes);
	memcpy(bytes, g->map, g->size);
	for (int i = 0; i < 4; i++)
		bytes[at + i] = (uint8_t)(type >> 8 * i);
	q4kh_gguf_close(g);
	cr_assert_geq(asprintf(&path, "%s/retyped-%s-%u.gguf", test_tmpdir(), name, type), 0);
	f = fopen(path, "wb");
	cr_assert_not_null(f, "%s", path);
	cr_assert_eq(fwrite(bytes, 1, size, f), size);
	cr_assert_eq(fclose(f), 0);
	free(bytes);
	return path;
}

/*
 * q4khost COMMAND (ENV before it) on the fixture with a Q8_K tensor: exit
 * 3, and the refusal, naming that tensor, is all it prints.
 */
static void expect_refusal(const char *env, const char *command)
{
	char name[256], want[2048], *out;
	char *model = retyped(NULL, Q4KH_TYPE_Q8_K, name, sizeof(name));
	const char *plugins = test_plugin_dir((const char *const[]){ NULL });

	cr_expect_eq(q4khost_with(env, command, model, plugins, "", &out), 3, "%s", out);
	snprintf(want, sizeof(want),
	         "q4khost %.*s: %s: tensor %s has type Q8_K (GGUF type 15), which q4khost does "
	         "not run; " SUPPORTED " (llama-quantize --allow-requantize IN.gguf OUT.gguf "
	         "Q4_K_M)\n",
	         (int)strcspn(command, " "), command, model, name);
	cr_expect_str_eq(out, want);
	free(out);
	free(model);
}

Test(weight_types, run_refuses_an_unsupported_type_before_anything_runs)
{
	expect_refusal("", "run -n 4 -p hello");
}

/* A serve that started would run until the timeout (exit 124). */
Test(weight_types, serve_refuses_to_start_on_it)
{
	expect_refusal("timeout 60", "serve --port 0");
}

Test(weight_types, validate_refuses_it_as_input)
{
	char name[256], *out;
	char *model = retyped(NULL, Q4KH_TYPE_Q8_K, name, sizeof(name));
	const char *plugins = test_plugin_dir((const char *const[]){ NULL });

	cr_expect_eq(q4khost_with("", "validate", model, plugins, "", &out), 3, "%s", out);
	cr_expect(strstr(out, "has type Q8_K (GGUF type 15), which q4khost does not run") != NULL,
	          "%s", out);
	free(out);
	free(model);
}

Test(weight_types, info_marks_unsupported_tensors)
{
	char name[256], line[512], args[4096], *out;
	char *model = retyped(NULL, Q4KH_TYPE_Q8_K, name, sizeof(name));
	json_t *o, *types, *bad;
	size_t i;
	json_t *v;

	snprintf(args, sizeof(args), "info %s", model);
	cr_assert_eq(test_q4khost("", test_tmpdir(), args, &out), 0, "%s", out);
	cr_expect(strstr(out, "  Q8_K            1 ") != NULL, "%s", out);
	cr_expect(strstr(out, "  unsupported\n") != NULL, "%s", out);
	cr_expect_eq(count(out, "unsupported"), 2, "%s", out); /* the mark and the heading */
	cr_expect(strstr(out, "unsupported:   1 tensor of types q4khost does not run (it runs "
	                      "F32, F16, BF16,") != NULL,
	          "%s", out);
	snprintf(line, sizeof(line), "\n  %s  Q8_K (GGUF type 15)\n", name);
	cr_expect(strstr(out, line) != NULL, "%s", out);
	free(out);
	snprintf(args, sizeof(args), "info --json %s", model);
	cr_assert_eq(test_q4khost("", test_tmpdir(), args, &out), 0, "%s", out);
	o = parse_json(out);
	types = json_object_get(o, "tensor_types");
	json_array_foreach(types, i, v)
		cr_expect_eq(json_is_true(json_object_get(v, "supported")),
		             strcmp(json_string_value(json_object_get(v, "type")), "Q8_K") != 0,
		             "%s", json_string_value(json_object_get(v, "type")));
	bad = json_object_get(o, "unsupported_tensors");
	cr_assert_eq(json_array_size(bad), 1, "%s", out);
	cr_expect_str_eq(json_string_value(json_object_get(json_array_get(bad, 0), "name")), name);
	cr_expect_str_eq(json_string_value(json_object_get(json_array_get(bad, 0), "type")), "Q8_K");
	cr_expect_eq(json_integer_value(json_object_get(json_array_get(bad, 0), "type_id")), 15);
	json_decref(o);
	free(out);
	/* The fixture itself has nothing to mark. */
	snprintf(args, sizeof(args), "info %s", tiny_model());
	cr_assert_eq(test_q4khost("", test_tmpdir(), args, &out), 0, "%s", out);
	cr_expect_eq(count(out, "unsupported"), 0, "%s", out);
	free(out);
	free(model);
}

/*
 * Q8_1 (GGUF type 9, gguf-py's GGMLQuantizationType.Q8_1: 32 values in
 * 36 bytes), a type q4khost does not run: the file parses, info marks the
 * tensor, and run refuses it with the re-quantize hint, as for Q8_K.
 */
Test(weight_types, q8_1_is_named_and_marked_not_unknown)
{
	char name[256], line[512], args[4096], *out;
	char *model = retyped(NULL, 9, name, sizeof(name));
	const char *plugins = test_plugin_dir((const char *const[]){ NULL });

	snprintf(args, sizeof(args), "info %s", model);
	cr_assert_eq(test_q4khost("", test_tmpdir(), args, &out), 0, "%s", out);
	snprintf(line, sizeof(line), "\n  %s  Q8_1 (GGUF type 9)\n", name);
	cr_expect(strstr(out, line) != NULL, "%s", out);
	free(out);
	cr_expect_eq(q4khost_with("", "run -n 4 -p hello", model, plugins, "", &out), 3, "%s",
	             out);
	snprintf(line, sizeof(line), "tensor %s has type Q8_1 (GGUF type 9), which q4khost does "
	         "not run; ", name);
	cr_expect(strstr(out, line) != NULL && strstr(out, "re-quantize") != NULL, "%s", out);
	free(out);
	free(model);
}

Test(weight_types, a_type_id_no_gguf_type_has_is_named_with_its_tensor)
{
	char name[256], want[512], *out;
	char *model = retyped(NULL, 99, name, sizeof(name));
	const char *plugins = test_plugin_dir((const char *const[]){ NULL });

	cr_expect_eq(q4khost_with("", "run -n 4 -p hello", model, plugins, "", &out), 3, "%s",
	             out);
	snprintf(want, sizeof(want), "expected a known tensor type for tensor '%s', found type "
	         "id 99", name);
	cr_expect(strstr(out, want) != NULL, "%s", out);
	cr_expect_eq(count(out, "\n"), 1, "%s", out);
	free(out);
	free(model);
}

/* A vector (a norm) of a type q4khost runs, but not F32, which the ops
 * that read vectors take alone: refused when the file is opened. */
Test(weight_types, a_vector_other_than_f32_is_refused_when_opened)
{
	char name[256], *out;
	char *model = retyped("output_norm.weight", Q4KH_TYPE_F16, name, sizeof(name));
	const char *plugins = test_plugin_dir((const char *const[]){ NULL });
	char want[4096];

	cr_expect_eq(q4khost_with("", "run -n 2 -p hello", model, plugins, "", &out), 3, "%s",
	             out);
	snprintf(want, sizeof(want), "q4khost run: %s: tensor output_norm.weight is a vector of "
	         "type F16, expected F32\n", model);
	cr_expect_str_eq(out, want);
	free(out);
	free(model);
}

/*
 * replay-no-q8-0 (tests/plugins/replay.c), of kind cpu, says it lacks
 * Q8_0, which the fixture's output.weight has: run passes it over and the
 * reference serves; asked for by name it is refused with the same line;
 * serve says it left it out; validate lists it as passed over, with
 * nothing measured.
 */
Test(weight_types, a_backend_without_a_type_is_passed_over_before_anything_runs)
{
	const char *plugins = test_plugin_dir((const char *const[]){ "replay_no_q8_0", NULL });
	const char *why = "passed over for this model: backend replay-no-q8-0 does not implement "
	                  "Q8_0 (GGUF type 8), a weight type of this model (it implements F32, "
	                  "F16, Q4_0, Q4_1, Q5_0, Q5_1, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_NL, "
	                  "IQ4_XS, BF16)";
	char *out;

	cr_expect_eq(q4khost_with("", "run -n 2 -p hello", NULL, plugins, "", &out), 0, "%s", out);
	cr_expect(strstr(out, why) != NULL, "%s", out);
	cr_expect(strstr(out, "q4khost: backend cpu ") != NULL, "%s", out);
	cr_expect(strstr(out, "not implemented") == NULL, "%s", out);
	free(out);
	cr_expect_eq(q4khost_with("", "run -n 2 -p hello --backend replay-no-q8-0", NULL, plugins,
	                          "", &out),
	             4, "%s", out);
	cr_expect(strstr(out, why) != NULL, "%s", out);
	free(out);
	/* serve names it among what its plan left out, and serves (SIGTERM:
	 * drained, exit 0). */
	cr_expect_eq(q4khost_with("timeout --preserve-status -s TERM 20", "serve --port 0", NULL,
	                          plugins, "", &out),
	             0, "%s", out);
	cr_expect(strstr(out, "q4khost serve: left out: replay-no-q8-0: ") != NULL, "%s", out);
	cr_expect(strstr(out, why) != NULL, "%s", out);
	free(out);
	cr_expect_eq(q4khost_with("", "validate", NULL, plugins, "", &out), 0, "%s", out);
	cr_expect(strstr(out, "passed over for this model:\n    backend replay-no-q8-0 does not "
	                      "implement Q8_0") != NULL,
	          "%s", out);
	cr_expect(strstr(out, "replay-no-q8-0/built-in") == NULL, "%s", out);
	free(out);
}
