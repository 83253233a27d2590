/*
 * A receipt cannot lie, tried as a careful user would, through the real
 * CLI:
 *  - every field of a broken variant's receipt, forged in turn (its
 *    verdict, its points' marks, cosines and decode steps, its summary,
 *    its message, how many points it holds, every part of its key), reads
 *    as no receipt: the report names what disagrees, a fresh measurement
 *    starts, and the variant does not serve; the forgery a reviewer made
 *    (the verdict and message of a pass, every mark blanked) is measured
 *    to the end and found broken again (docs/f2.md, "Receipts");
 *  - a deep receipt edited by hand decides neither for the deep probe nor
 *    for the built-in one;
 *  - a plugin overwritten in place by another build of the same size,
 *    its modification time restored, is hashed again (the hash cache also
 *    keys on the change time, which cannot be set back), so its old pass
 *    does not vouch for the new bytes.
 */
#include <criterion/criterion.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "helpers.h"

/*
 * q4khost COMMAND ... on the tiny llama fixture with plugins from PLUGINS
 * and receipts in RECEIPTS; the output and status. Receipts, not the
 * model, are under test here: a measurement on it takes a second (the
 * planted defects act on its LM head as on the default model's).
 */
static int q4k(const char *receipts, const char *plugins, const char *args, char **out)
{
	char *cmd = NULL;
	int rc;

	if (asprintf(&cmd, "%s --plugin-path %s -m %s/tests/fixtures/tiny-llama.gguf", args,
	             plugins, test_srcdir()) < 0)
		cr_assert_fail("out of memory");
	rc = test_q4khost("", receipts, cmd, out);
	free(cmd);
	return rc;
}

/* The receipt file in DIR whose name `ls` lists first of those matching
 * GLOB (its path, malloc()ed); there must be COUNT of them. */
static char *receipt_file(const char *dir, const char *glob, int count)
{
	char *cmd = NULL, *out = NULL;
	int n = 0;

	if (asprintf(&cmd, "ls -tr %s/%s", dir, glob) < 0)
		cr_assert_fail("out of memory");
	cr_assert_eq(test_shell(cmd, &out), 0, "no receipt in %s", dir);
	for (const char *p = out; (p = strchr(p, '\n')); p++)
		n++;
	cr_assert_eq(n, count, "%d receipts, not %d: %s", n, count, out);
	*strchr(out, '\n') = 0;
	free(cmd);
	return out;
}

static char *only_receipt(const char *dir)
{
	return receipt_file(dir, "*.json", 1);
}

/*
 * One edit of a receipt: the value at PATH ("verdict", "key/floor",
 * "points/5/2": object keys and array indexes; "*" for every element of
 * an array, "+" to append to it) becomes the JSON text VALUE, or is
 * removed when VALUE is NULL ("points/-1": the last element).
 */
struct edit {
	const char *path, *value;
};

static void apply(json_t *at, const char *path, const char *value)
{
	const char *slash = strchr(path, '/');
	char step[64];
	size_t len = slash ? (size_t)(slash - path) : strlen(path);
	json_t *v = NULL;

	snprintf(step, sizeof(step), "%.*s", (int)len, path);
	if (value && !slash) {
		v = json_loads(value, JSON_DECODE_ANY, NULL);
		cr_assert_not_null(v, "not JSON: %s", value);
	}
	if (json_is_array(at) && !strcmp(step, "*")) {
		cr_assert_not_null(slash, "'*' takes a path after it");
		for (size_t i = 0; i < json_array_size(at); i++)
			apply(json_array_get(at, i), slash + 1, value);
	} else if (json_is_array(at) && !strcmp(step, "+")) {
		json_array_append_new(at, v);
	} else if (json_is_array(at)) {
		long i = strtol(step, NULL, 10);
		size_t at_i = (size_t)(i < 0 ? (long)json_array_size(at) + i : i);

		cr_assert_lt(at_i, json_array_size(at), "no element %s", step);
		if (slash)
			apply(json_array_get(at, at_i), slash + 1, value);
		else if (v)
			json_array_set_new(at, at_i, v);
		else
			json_array_remove(at, at_i);
	} else if (slash) {
		cr_assert_not_null(json_object_get(at, step), "no key %s", step);
		apply(json_object_get(at, step), slash + 1, value);
	} else if (v) {
		json_object_set_new(at, step, v);
	} else {
		json_object_del(at, step);
	}
}

/* R, which holds no "mac", into the file PATH, sealed with KEY. */
static void seal_with(const unsigned char *key, json_t *r, const char *path)
{
	/* the default precision writes every double back as it was read */
	cr_assert_eq(json_dump_file(r, path, JSON_INDENT(1)), 0, "cannot write %s", path);
	test_receipt_seal(key, path);
}

/*
 * ORIGINAL with the edits E (ending in one of NULL path) into the file
 * PATH, sealed with the key of RECEIPTS' q4khost: an edit by someone who
 * holds the key, which the checks of what a receipt claims still catch.
 */
static void forge(const char *receipts, const json_t *original, const struct edit *e,
                  const char *path)
{
	json_t *r = json_deep_copy(original);
	unsigned char key[32];

	for (; e->path; e++)
		apply(r, e->path, e->value);
	json_object_del(r, "mac");
	test_receipt_key(receipts, key);
	seal_with(key, r, path);
	json_decref(r);
}

/* Each forged field of a receipt of defect-biased on the tiny llama model
 * (88 points: position 0 not judged, 1 to 63 in prefill, 64 to 71 the
 * decode steps 0 to 7, 72 to 87 the batched steps': 4 steps of sequences
 * 0 to 3 at lengths 60, 41, 22 and 3, so point 80 is sequence 0's
 * position 62, its decode step 2; broken everywhere, decided at
 * position 1), and
 * what the report says of it: a void receipt's field (after "receipt
 * FILE: "), or the part of the key that changed. The plugin declares f32
 * arithmetic, so its floor is 0.99999 (docs/f2.md, "Floors that follow the
 * arithmetic"). */
static const struct forgery {
	const char *what;
	struct edit edits[4];
	const char *why[2];
	int void_receipt;
} forgeries[] = {
	{ "the verdict",
	  { { "verdict", "\"pass\"" } },
	  { "verdict \"pass\" but its points' verdict is \"broken\", decided at position 1 (prefill): ignored]" },
	  1 },
	{ "the verdict, to a rejection",
	  { { "verdict", "\"reject\"" } },
	  { "verdict \"reject\" but its points' verdict is \"broken\"" },
	  1 },
	{ "the verdict, the message of a pass and every mark blanked (a reviewer's forgery)",
	  { { "verdict", "\"pass\"" },
	    { "message", "\"pass over 71 judged positions, 0 near-ties; lowest at position 6 (prefill): argmax 625 (agrees), cosine 0.7062\"" },
	    { "points/*/2", "\"unjudged\"" } },
	  { "point 1 is marked \"unjudged\" but its probe plan judges position 1 (prefill): ignored]" },
	  1 },
	{ "a decode step's mark blanked",
	  { { "points/70/2", "\"unjudged\"" } },
	  { "point 70 is marked \"unjudged\" but its probe plan judges position 70 (decode step 6)" },
	  1 },
	{ "a mark to skipped",
	  { { "points/5/2", "\"skipped\"" }, { "points/5/0", "null" } },
	  { "point 5 is marked \"skipped\" but its probe plan judges position 5 (prefill)" },
	  1 },
	{ "a mark to pass",
	  { { "points/5/2", "\"pass\"" } },
	  { "point 5 is marked \"pass\" but its cosine 0.", " makes it \"broken\" (floors 0.99999 and 0.90)" },
	  1 },
	{ "a mark to near-tie",
	  { { "points/5/2", "\"near-tie\"" } },
	  { "point 5 is marked \"near-tie\" but its cosine 0.", " makes it \"broken\"" },
	  1 },
	{ "a mark to reject",
	  { { "points/5/2", "\"reject\"" } },
	  { "point 5 is marked \"reject\" but its cosine 0.", " makes it \"broken\"" },
	  1 },
	{ "position 0 judged",
	  { { "points/0/2", "\"broken\"" } },
	  { "point 0 is marked \"broken\" but its probe plan compares without judging (\"unjudged\") position 0 (prefill)" },
	  1 },
	{ "a point's decode step",
	  { { "points/70/1", "5" } },
	  { "point 70 has decode step 5 but its probe plan has position 70 (decode step 6)" },
	  1 },
	{ "every cosine, to 1",
	  { { "points/*/0", "1" } },
	  { "point 1 is marked \"broken\" but its cosine 1.0000000 is not below the 0.90 catastrophic floor" },
	  1 },
	{ "every cosine, to 0.8 (still broken)",
	  { { "points/*/0", "0.8" } },
	  { "min_cosine 0.", " but its points' lowest judged cosine is 0.8000" },
	  1 },
	{ "min_cosine",
	  { { "min_cosine", "0.999" } },
	  { "min_cosine 0.9990 but its points' lowest judged cosine is 0." },
	  1 },
	{ "min_cosine, to null",
	  { { "min_cosine", "null" } },
	  { "min_cosine null but its points' lowest judged cosine is 0." },
	  1 },
	{ "worst_position",
	  { { "worst_position", "6" } },
	  { "worst_position 6 but its points decide at position 1 (prefill)" },
	  1 },
	{ "worst_decode_step",
	  { { "worst_decode_step", "3" } },
	  { "worst_decode_step 3 but its points decide at position 1 (prefill)" },
	  1 },
	{ "near_ties",
	  { { "near_ties", "2" } },
	  { "near_ties 2 but its points hold 0" },
	  1 },
	{ "the message, to a pass's",
	  { { "message", "\"pass over 71 judged positions, 0 near-ties; lowest at position 6 (prefill): argmax 625 (agrees), cosine 0.7062\"" } },
	  { "message \"pass over 71 judged positions, 0 near-ties; lowest at positi...\" but its points "
	    "give \"broken\" at position 1 (prefill), cosine 0." },
	  1 },
	{ "the message's position",
	  { { "message", "\"position 2 (prefill): argmax 625 (agrees), cosine 0.7068 < 0.90 catastrophic floor\"" } },
	  { "message \"position 2 (prefill): argmax 625 (agrees), cosine 0.7068 < 0...\" but its "
	    "points give \"broken\" at position 1 (prefill)" },
	  1 },
	{ "the message's cosine",
	  { { "message", "\"position 1 (prefill): argmax 625 (agrees), cosine 0.9068 < 0.90 catastrophic floor\"" } },
	  { "message \"position 1 (prefill): argmax 625 (agrees), cosine 0.9068 < 0...\" but its "
	    "points give \"broken\" at position 1 (prefill)" },
	  1 },
	{ "the last point removed",
	  { { "points/-1", NULL } },
	  { "87 points but its probe plan has 88 (64 prefill positions, 8 decode steps, "
	    "16 in batched steps)" },
	  1 },
	{ "a point added",
	  { { "points/+", "[0.7062, 8, \"broken\"]" } },
	  { "89 points but its probe plan has 88 (64 prefill positions, 8 decode steps, "
	    "16 in batched steps)" },
	  1 },
	{ "a batched point's decode step",
	  { { "points/80/1", "0" } },
	  { "point 80 has decode step 0 but its probe plan has position 62 (batched step of 4 "
	    "sequences, sequence 0, its decode step 2)" },
	  1 },
	{ "a batched point blanked",
	  { { "points/80/2", "\"unjudged\"" } },
	  { "point 80 is marked \"unjudged\" but its probe plan judges position 62 (batched "
	    "step of 4 sequences, sequence 0, its decode step 2)" },
	  1 },
	{ "every point removed",
	  { { "points", "[]" } },
	  { "min_cosine 0.", " but it holds no measured position" },
	  1 },
	{ "the model's hash",
	  { { "key/model_sha256", "\"00000000000000000000000000000000000000000000000000000000000000aa\"" } },
	  { "[fresh: the model file changed (sha256 00000000… -> " },
	  0 },
	{ "the variant's hash",
	  { { "key/plugins/2/sha256", "\"00000000000000000000000000000000000000000000000000000000000000bb\"" } },
	  { "[fresh: the plugin file of defect-biased changed (sha256 00000000… -> " },
	  0 },
	{ "the variant's settings",
	  { { "key/plugins/2/settings", "\"threads=1\"" } },
	  { "[fresh: the settings of defect-biased changed ([plugin.defect-biased] \"threads=1\" -> \"\")]" },
	  0 },
	{ "the device",
	  { { "key/device_uuid", "\"GPU-forged\"" } },
	  { "[fresh: the device changed (GPU-forged -> cpu)]" },
	  0 },
	{ "the floor",
	  { { "key/floor", "0.9" } },
	  { "[fresh: the F2 settings changed (floor 0.99999, f32, 8 decode steps, 64 probe tokens)]" },
	  0 },
	{ "the decode steps",
	  { { "key/decode_steps", "4" } },
	  { "[fresh: the F2 settings changed (floor 0.99999, f32, 8 decode steps, 64 probe tokens)]" },
	  0 },
	{ "the rule set",
	  { { "key/ruleset", "1" } },
	  { "[fresh: the F2 rule set changed (1 -> " },
	  0 },
	{ "the probe's kind",
	  { { "key/probe", "\"prompt\"" } },
	  { "[fresh: the probe changed (prompt -> builtin)]" },
	  0 },
	{ "the probe's hash",
	  { { "key/probe_sha256", "\"00000000000000000000000000000000000000000000000000000000000000cc\"" } },
	  { "[fresh: the probe's tokens changed (sha256 00000000… -> " },
	  0 },
};

/* That OUT says BEFORE "receipt FILE: " WHY in one piece: a void receipt
 * FILE and the field that voids it, named where BEFORE puts it. */
static void expect_void(const char *out, const char *before, const char *file, const char *why,
                        const char *what)
{
	char *want = NULL;

	cr_assert(asprintf(&want, "%sreceipt %s: %s", before, file, why) > 0);
	cr_expect(strstr(out, want) != NULL, "%s: the report lacks '%s': %s", what, want, out);
	free(want);
}

#define RUN_BIASED "run -p 'The sky is' -n 4 --kernel defect-biased"

/*
 * run --kernel defect-biased: a receipt decides at once, a fresh
 * measurement (a second on the tiny model) finds it broken again. Its
 * output; the variant must not have served.
 */
static char *run_biased(const char *receipts, const char *plugins)
{
	char *out = NULL;

	cr_expect_neq(q4k(receipts, plugins, RUN_BIASED, &out), 0, "the variant served: %s", out);
	cr_expect(strstr(out, "F2: pass") == NULL, "%s", out);
	cr_expect(strstr(out, "F2 broken: position 1 (prefill): argmax ") != NULL, "%s", out);
	return out;
}

Test(receipt_trust, every_forged_field_reads_as_no_receipt, .timeout = 300)
{
	static const char *const names[] = { "defect_biased", NULL };
	const char *plugins, *receipts = test_tmpdir();
	char *out = NULL, *path;
	json_t *original, *again;

	plugins = test_plugin_dir(names);
	cr_assert_eq(q4k(receipts, plugins, "validate --kernel defect-biased", &out), 1, "%s", out);
	cr_assert(strstr(out, "broken") != NULL, "%s", out);
	free(out);
	path = only_receipt(receipts);
	original = json_load_file(path, 0, NULL);
	cr_assert_not_null(original, "%s", path);
	cr_assert_eq(json_array_size(json_object_get(original, "points")), 88);

	/* As written, the receipt decides: no measurement. */
	out = run_biased(receipts, plugins);
	cr_expect(strstr(out, "[receipt of ") != NULL,
	          "the receipt as written did not decide: %s", out);
	free(out);

	for (size_t i = 0; i < sizeof(forgeries) / sizeof(forgeries[0]); i++) {
		const struct forgery *f = &forgeries[i];

		forge(receipts, original, f->edits, path);
		out = run_biased(receipts, plugins);
		cr_expect(strstr(out, "[receipt of ") == NULL, "%s: not measured again: %s", f->what,
		          out);
		if (f->void_receipt) {
			expect_void(out, "[fresh: ", path, f->why[0], f->what);
		} else {
			cr_expect(strstr(out, f->why[0]) != NULL, "%s: the report lacks '%s': %s",
			          f->what, f->why[0], out);
		}
		if (f->why[1])
			cr_expect(strstr(out, f->why[1]) != NULL, "%s: the report lacks '%s': %s",
			          f->what, f->why[1], out);
		free(out);
	}

	/* The reviewer's forgery, measured to the end: broken again. */
	forge(receipts, original, forgeries[2].edits, path);
	out = run_biased(receipts, plugins);
	expect_void(out, "[fresh: ", path, forgeries[2].why[0], forgeries[2].what);
	free(out);
	again = json_load_file(path, 0, NULL);
	cr_assert_not_null(again);
	cr_expect_str_eq(json_string_value(json_object_get(again, "verdict")), "broken");
	json_decref(again);
	json_decref(original);
	free(path);
}

/*
 * The deep probe: cpu-q8act passes the deep probe of 300 positions, 180
 * of them judged.
 * That deep receipt decides for the built-in probe too. Edited, it
 * decides for neither: validate --deep measures again, naming what
 * disagrees, and a run on the built-in probe warns about it and measures
 * its own probe.
 */
#define RUN "run -p 'The sky is' -n 2 --kernel cpu-q8act"

Test(receipt_trust, an_edited_deep_receipt_decides_for_no_probe, .timeout = 300)
{
	static const char *const names[] = { "cpu_q8act", NULL };
	/* what each forgery's report says, after "receipt FILE: " */
	static const struct forgery deep[] = {
		{ "a skipped position judged",
		  { { "points/201/0", "1.0" }, { "points/201/2", "\"pass\"" } },
		  { "point 201 is marked \"pass\" but its probe plan skips (\"skipped\") position 201 (prefill)" },
		  1 },
		{ "a judged position skipped",
		  { { "points/136/0", "null" }, { "points/136/2", "\"skipped\"" } },
		  { "point 136 is marked \"skipped\" but its probe plan judges position 136 (prefill)" },
		  1 },
		{ "the last decode step removed",
		  { { "points/-1", NULL } },
		  { "299 points but its probe plan has 300 (268 prefill positions, 32 decode steps)",
		    "probe_sha256 " },
		  1 },
	};
	const char *plugins, *receipts = test_tmpdir();
	char *out = NULL, *path, *cmd = NULL;
	json_t *original;

	plugins = test_plugin_dir(names);
	cr_assert_eq(q4k(receipts, plugins,
	                    "validate --deep --ctx 300 --kernel cpu-q8act", &out),
	             0, "%s", out);
	free(out);
	path = only_receipt(receipts);
	original = json_load_file(path, 0, NULL);
	cr_assert_not_null(original, "%s", path);
	cr_assert_eq(json_array_size(json_object_get(original, "points")), 300);
	cr_assert_str_eq(json_string_value(json_array_get(
	                         json_array_get(json_object_get(original, "points"), 201), 2)),
	                 "skipped", "position 201 is between the bands");
	/* as written, it decides for the built-in probe: no measurement */
	cr_expect_eq(q4k(receipts, plugins, RUN, &out), 0, "%s", out);
	cr_expect(strstr(out, "F2: pass (deep receipt of ") != NULL, "%s", out);
	free(out);

	for (size_t i = 0; i < sizeof(deep) / sizeof(deep[0]); i++) {
		const struct forgery *f = &deep[i];

		/* the deep probe's own receipt: measured again */
		forge(receipts, original, f->edits, path);
		cr_expect_eq(q4k(receipts, plugins,
		                    "validate --deep --ctx 300 --kernel cpu-q8act", &out),
		             0, "%s", out);
		expect_void(out, "fresh: ", path, f->why[0], f->what);
		free(out);

		/* for the built-in probe, whichever deep probe it ran: its hash
		 * must be that of the deep probe of as many points */
		forge(receipts, original, f->edits, path);
		cr_expect_eq(q4k(receipts, plugins, RUN, &out), 0, "%s", out);
		expect_void(out, "q4khost: warning: ", path, f->why[1] ? f->why[1] : f->why[0],
		            f->what);
		cr_expect(strstr(out, "deep receipt of") == NULL, "%s: it decided: %s", f->what, out);
		cr_expect(strstr(out, "F2: pass (fresh: no receipt)") != NULL, "%s: %s", f->what, out);
		free(out);
		/* the built-in probe's receipt that run wrote goes: the next
		 * run must find no other receipt that could decide */
		cr_assert(asprintf(&cmd, "find %s -maxdepth 1 -name '*.json' ! -path %s -delete",
		                   receipts, path) > 0);
		cr_assert_eq(test_shell(cmd, &out), 0, "%s", out);
		free(cmd);
		free(out);
	}
	json_decref(original);
	free(path);
}

Test(receipt_trust, a_plugin_rewritten_in_place_is_hashed_again, .timeout = 300)
{
	static const char *const names[] = { "cpu_q8act", NULL };
	const char *plugins, *receipts = test_tmpdir();
	char *out = NULL, *so = NULL, *bytes, *at;
	struct stat before, after;
	struct timespec times[2];
	size_t len;

	plugins = test_plugin_dir(names);
	cr_assert_eq(q4k(receipts, plugins, "validate --kernel cpu-q8act", &out), 0, "%s", out);
	free(out);
	cr_assert_eq(q4k(receipts, plugins, "validate --kernel cpu-q8act", &out), 0, "%s", out);
	cr_assert(strstr(out, "receipt of ") != NULL, "the second run did not use the receipt: %s", out);
	free(out);

	/* Another build of the same size: one byte of its build id changed,
	 * written in place, the modification time put back. */
	cr_assert(asprintf(&so, "%s/cpu_q8act.so", plugins) > 0);
	cr_assert_eq(stat(so, &before), 0);
	bytes = test_read_file(so, &len);
	cr_assert_not_null(bytes);
	at = memmem(bytes, len, "q4khost tests", 13);
	cr_assert_not_null(at, "no vendor string to change in %s", so);
	at[0] = 'Q';
	{
		FILE *f = fopen(so, "r+b");

		cr_assert_not_null(f);
		cr_assert_eq(fwrite(bytes, 1, len, f), len);
		fclose(f);
	}
	times[0] = before.st_atim;
	times[1] = before.st_mtim;
	cr_assert_eq(utimensat(AT_FDCWD, so, times, 0), 0);
	cr_assert_eq(stat(so, &after), 0);
	cr_assert_eq(after.st_size, before.st_size);
	cr_assert_eq(after.st_mtim.tv_sec, before.st_mtim.tv_sec);

	cr_assert_eq(q4k(receipts, plugins, "validate --kernel cpu-q8act", &out), 0, "%s", out);
	cr_expect(strstr(out, "receipt of ") == NULL,
	          "the old receipt vouched for the rewritten plugin: %s", out);
	cr_expect(strstr(out, "changed") != NULL, "the reason does not name the change: %s", out);
	free(out);
	free(bytes);
	free(so);
}

/*
 * A receipt knows every setting: one made under [plugin.cpu] threads = 1
 * does not vouch for threads = 2, which is measured into a receipt of its
 * own, so going back to threads = 1 finds the first one again (docs/f2.md,
 * "Receipts"); a receipt made with --threads is found again by the next
 * run with it (the validation child gets the command line's settings),
 * and the same settings find it again.
 */
/* A run of cpu-q8act with the config file CFG, whose report says WANT. */
static void run_with_config(const char *receipts, const char *plugins, const char *cfg,
                            const char *want, const char *what)
{
	char *args, *out;

	cr_assert(asprintf(&args, "run -p 'The sky is' -n 2 --kernel cpu-q8act --config %s", cfg) > 0);
	cr_assert_eq(q4k(receipts, plugins, args, &out), 0, "%s", out);
	cr_expect(strstr(out, want) != NULL, "%s: %s", what, out);
	free(out);
	free(args);
}

Test(receipt_trust, a_changed_plugin_setting_measures_again, .timeout = 300)
{
	static const char *const names[] = { "cpu_q8act", NULL };
	const char *plugins, *receipts = test_tmpdir();
	char *out = NULL, *one = NULL, *two = NULL;

	plugins = test_plugin_dir(names);
	cr_assert(asprintf(&one, "%s/one.ini", receipts) > 0 &&
	          asprintf(&two, "%s/two.ini", receipts) > 0);
	test_write_file(one, "[plugin.cpu]\nthreads = 1\n", 25);
	test_write_file(two, "[plugin.cpu]\nthreads = 2\n", 25);
	run_with_config(receipts, plugins, one, "F2: pass (fresh", "the first");
	run_with_config(receipts, plugins, two, "F2: pass (fresh: no receipt)", "threads = 2");
	run_with_config(receipts, plugins, two, "F2: pass (receipt of ",
	                "the same settings measured again");
	run_with_config(receipts, plugins, one, "F2: pass (receipt of ", "threads = 1 again");

	cr_assert_eq(q4k(receipts, plugins, "run -p 'The sky is' -n 2 --kernel cpu-q8act --threads 1", &out),
	             0, "%s", out);
	free(out);
	cr_assert_eq(q4k(receipts, plugins, "run -p 'The sky is' -n 2 --kernel cpu-q8act --threads 1", &out),
	             0, "%s", out);
	cr_expect(strstr(out, "F2: pass (receipt of ") != NULL,
	          "a --threads run did not find its own receipt: %s", out);
	free(out);
	free(one);
	free(two);
}

/*
 * The trial's forgery (docs/f2.md, R.1): a broken variant's receipt
 * edited consistently into a pass, every point 0.9999999 and marked
 * "pass", verdict, min_cosine and the exact message written to match,
 * which the checks of what a receipt claims accept (sealed with the
 * user's key, it decides: they alone cannot tell it from a measurement).
 * Edited without the key, or sealed with another, it is refused by its
 * MAC: the report names the file and why, F2 measures again, and the
 * broken variant does not serve.
 */
Test(receipt_trust, a_consistent_edit_without_the_key_is_measured_again, .timeout = 300)
{
	static const char *const names[] = { "defect_biased", NULL };
	const char *plugins = test_plugin_dir(names), *receipts = test_tmpdir();
	char *out = NULL, *path, *message = NULL, *want = NULL;
	const char *argmax;
	unsigned char other[32];
	json_t *r, *points, *p;
	size_t i;
	FILE *f;

	cr_assert_eq(q4k(receipts, plugins, RUN_BIASED " --backend cpu", &out), 4, "%s", out);
	cr_assert(strstr(out, "F2 broken: position 1 (prefill): argmax ") != NULL, "%s", out);
	free(out);
	path = only_receipt(receipts);
	r = json_load_file(path, 0, NULL);
	cr_assert_not_null(r, "%s", path);
	argmax = strstr(json_string_value(json_object_get(r, "message")), "argmax ");
	cr_assert_not_null(argmax);
	points = json_object_get(r, "points");
	json_array_foreach(points, i, p) {
		json_array_set_new(p, 0, json_real(0.9999999));
		json_array_set_new(p, 2, json_string(i ? "pass" : "unjudged"));
	}
	cr_assert(asprintf(&message, "pass over %zu judged positions at the 0.99999 acceptance floor "
	                             "(f32 arithmetic), 0 near-ties; lowest at position 1 (prefill): "
	                             "argmax %d (agrees), cosine 0.9999999",
	                   json_array_size(points) - 1, atoi(argmax + 7)) > 0);
	json_object_set_new(r, "verdict", json_string("pass"));
	json_object_set_new(r, "min_cosine", json_real(0.9999999));
	json_object_set_new(r, "message", json_string(message));

	/* edited in place, the old MAC kept: the user's edit */
	f = fopen(path, "w");
	cr_assert_not_null(f);
	cr_assert_eq(json_dumpf(r, f, JSON_INDENT(1)), 0);
	fclose(f);
	cr_expect_eq(q4k(receipts, plugins, RUN_BIASED " --backend cpu", &out), 4,
	             "the edited receipt was trusted: %s", out);
	cr_assert(asprintf(&want, "[fresh: receipt %s fails its integrity check: edited, or written "
	                          "with another key; measuring again]",
	                   path) > 0);
	cr_expect(strstr(out, want) != NULL, "%s", out);
	cr_expect(strstr(out, "F2 broken: position 1 (prefill)") != NULL, "%s", out);
	cr_expect(strstr(out, "F2: pass") == NULL, "%s", out);
	free(out);

	/* sealed with another key (another user's, or another machine's) */
	json_object_del(r, "mac");
	memset(other, 0x5a, sizeof(other));
	seal_with(other, r, path);
	cr_expect_eq(q4k(receipts, plugins, RUN_BIASED " --backend cpu", &out), 4, "%s", out);
	cr_expect(strstr(out, want) != NULL, "%s", out);
	free(out);

	/* consistent: with the user's own key the checks accept it, so the
	 * MAC is what refused it above */
	forge(receipts, r, (const struct edit[]){ { NULL, NULL } }, path);
	cr_expect_eq(q4k(receipts, plugins, RUN_BIASED " --backend cpu", &out), 0, "%s", out);
	cr_expect(strstr(out, "F2: pass (receipt of ") != NULL, "%s", out);
	free(out);
	json_decref(r);
	free(want);
	free(message);
	free(path);
}

/* A receipt as written is used: no measurement, however often it is read. */
Test(receipt_trust, a_sealed_receipt_decides_without_measuring, .timeout = 300)
{
	static const char *const names[] = { "cpu_q8act", NULL };
	const char *plugins = test_plugin_dir(names), *receipts = test_tmpdir();
	char *out = NULL, *path, *text;
	size_t len;

	cr_assert_eq(q4k(receipts, plugins, RUN, &out), 0, "%s", out);
	cr_expect(strstr(out, "F2: pass (fresh: no receipt)") != NULL, "%s", out);
	free(out);
	path = only_receipt(receipts);
	text = test_read_file(path, &len);
	cr_assert_not_null(text);
	for (int i = 0; i < 2; i++) {
		char *again;

		cr_assert_eq(q4k(receipts, plugins, RUN, &out), 0, "%s", out);
		cr_expect(strstr(out, "F2: pass (receipt of ") != NULL, "%s", out);
		free(out);
		again = test_read_file(path, &len);
		cr_expect(!memcmp(again, text, len), "the receipt was written again");
		free(again);
	}
	free(text);
	free(path);
}

/*
 * The receipt folder and the key are judged as plugin folders are: a
 * folder others may write is refused before any work (exit 3), as is a
 * key others may read or one of another user's; the message says how to
 * fix it.
 */
Test(receipt_trust, an_untrusted_folder_or_key_is_refused, .timeout = 120)
{
	static const char *const names[] = { "cpu_q8act", NULL };
	const char *plugins = test_plugin_dir(names), *receipts = test_tmpdir();
	char *out = NULL, *want = NULL, *dir = NULL, *key = NULL, *env = NULL, *cmd = NULL;
	struct stat st;

	cr_assert(asprintf(&dir, "%s/ww", receipts) > 0 && asprintf(&key, "%s/k/receipt.key", receipts) > 0);
	cr_assert_eq(mkdir(dir, 0700), 0);
	cr_assert_eq(chmod(dir, 0777), 0);
	cr_assert(asprintf(&env, "Q4KHOST_F2_RECEIPT_DIR=%s", dir) > 0);
	cr_assert(asprintf(&cmd, "%s --plugin-path %s -m %s/tests/fixtures/tiny-llama.gguf", RUN,
	                   plugins, test_srcdir()) > 0);
	cr_expect_eq(test_q4khost(env, receipts, cmd, &out), 3, "%s", out);
	cr_assert(asprintf(&want, "q4khost run: Q4KHOST_F2_RECEIPT_DIR=%s: F2 cannot keep its "
	                          "receipts there: refused: the receipt folder %s is writable by "
	                          "others (mode 0777; fix: chmod o-w %s)\n",
	                   dir, dir, dir) > 0);
	cr_expect_str_eq(out, want);
	free(out);
	free(want);
	free(env);

	/* the key: made 0600 at first use, refused once others may read it */
	cr_assert(asprintf(&env, "Q4KHOST_RECEIPT_KEY=%s", key) > 0);
	cr_expect_eq(test_q4khost(env, receipts, cmd, &out), 0, "%s", out);
	free(out);
	cr_assert_eq(stat(key, &st), 0, "the key was not made");
	cr_expect_eq(st.st_mode & 07777, 0600);
	cr_expect_eq(st.st_uid, geteuid());
	cr_assert_eq(chmod(key, 0640), 0);
	cr_expect_eq(test_q4khost(env, receipts, cmd, &out), 3, "%s", out);
	cr_assert(asprintf(&want, "q4khost run: refused: the receipt key %s may be read or written "
	                          "by others (mode 0640; fix: chmod 600 %s)\n",
	                   key, key) > 0);
	cr_expect_str_eq(out, want);
	free(out);
	free(want);
	cr_assert_eq(chmod(key, 0600), 0);
	if (geteuid() == 0) { /* only root can give a file away */
		cr_assert_eq(chown(key, 65534, (gid_t)-1), 0);
		cr_expect_eq(test_q4khost(env, receipts, cmd, &out), 3, "%s", out);
		cr_expect(strstr(out, "is owned by uid 65534, not by this user (uid 0); each user keeps "
		                      "a key of their own") != NULL, "%s", out);
		free(out);
	}
	free(env);
	free(cmd);
	free(dir);
	free(key);
}

/*
 * A receipt that is a symbolic link is not followed: its target is not
 * read (nothing of it reaches the report), F2 measures again, and the
 * receipt it writes replaces the link, leaving the target as it was.
 */
Test(receipt_trust, a_symlinked_receipt_is_not_followed, .timeout = 300)
{
	static const char *const names[] = { "cpu_q8act", NULL };
	const char *plugins = test_plugin_dir(names), *receipts = test_tmpdir();
	static const char secret[] = "hunter2secret:$6$salt$hash:19000:0:99999:7:::\n";
	char *out = NULL, *path, *target = NULL, *want = NULL, *text;
	struct stat st;
	size_t len;

	cr_assert_eq(q4k(receipts, plugins, RUN, &out), 0, "%s", out);
	free(out);
	path = only_receipt(receipts);
	cr_assert(asprintf(&target, "%s/secret", receipts) > 0);
	test_write_file(target, secret, strlen(secret));
	cr_assert_eq(unlink(path), 0);
	cr_assert_eq(symlink(target, path), 0);
	cr_expect_eq(q4k(receipts, plugins, RUN, &out), 0, "%s", out);
	cr_assert(asprintf(&want, "F2: pass (fresh: receipt %s is a symbolic link: not followed; "
	                          "measuring again)",
	                   path) > 0);
	cr_expect(strstr(out, want) != NULL, "%s", out);
	cr_expect(strstr(out, "hunter2") == NULL, "the target was read: %s", out);
	free(out);
	cr_assert_eq(lstat(path, &st), 0);
	cr_expect(S_ISREG(st.st_mode), "the link was not replaced by a receipt");
	text = test_read_file(target, &len);
	cr_expect(len == strlen(secret) && !memcmp(text, secret, len), "the target was written");
	free(text);
	free(want);
	free(target);
	free(path);
}

/*
 * A receipt's time must be one: "created": "garbage", sealed with the
 * user's key (what only the key holder could write), is void, named.
 * A receipt of schema 4 (before receipts were sealed) is another
 * version's: measured again, saying so.
 */
Test(receipt_trust, a_bad_time_or_an_unsealed_old_receipt_is_measured_again, .timeout = 300)
{
	static const char *const names[] = { "cpu_q8act", NULL };
	const char *plugins = test_plugin_dir(names), *receipts = test_tmpdir();
	char *out = NULL, *path, *want = NULL;
	json_t *original;
	FILE *f;

	cr_assert_eq(q4k(receipts, plugins, RUN, &out), 0, "%s", out);
	free(out);
	path = only_receipt(receipts);
	original = json_load_file(path, 0, NULL);
	cr_assert_not_null(original);
	forge(receipts, original, (const struct edit[]){ { "created", "\"garbage\"" }, { NULL, NULL } },
	      path);
	cr_expect_eq(q4k(receipts, plugins, RUN, &out), 0, "%s", out);
	cr_assert(asprintf(&want, "F2: pass (fresh: receipt %s: created \"garbage\" but a receipt's "
	                          "time is UTC as 2026-11-30T06:01:24Z: ignored)",
	                   path) > 0);
	cr_expect(strstr(out, want) != NULL, "%s", out);
	cr_expect(strstr(out, "receipt of garbage") == NULL, "%s", out);
	free(out);
	free(want);

	json_object_set_new(original, "schema", json_integer(4));
	json_object_del(original, "mac");
	f = fopen(path, "w");
	cr_assert_not_null(f);
	cr_assert_eq(json_dumpf(original, f, JSON_INDENT(1)), 0);
	fclose(f);
	cr_expect_eq(q4k(receipts, plugins, RUN, &out), 0, "%s", out);
	cr_assert(asprintf(&want, "F2: pass (fresh: receipt %s is of schema 4 (an earlier version's, "
	                          "unsigned); this host reads sealed receipts of schema 5: measuring "
	                          "again)",
	                   path) > 0);
	cr_expect(strstr(out, want) != NULL, "%s", out);
	free(out);
	free(want);
	json_decref(original);
	free(path);
}

/*
 * A run that never needs a receipt needs neither the receipt folder nor
 * the key: F2 off, or only the reference to serve (--backend cpu
 * --kernel none), with a folder that cannot be made and a key that
 * cannot be either; a run that may judge a variant is still refused
 * before any work.
 */
Test(receipt_trust, a_run_that_needs_no_receipt_needs_no_folder, .timeout = 120)
{
	static const char *const names[] = { "cpu_q8act", NULL };
	const char *plugins = test_plugin_dir(names), *tmp = test_tmpdir();
	static const char *const runs[] = { "run -p 'The sky is' -n 2 --f2 off",
		                            "run -p 'The sky is' -n 2 --backend cpu --kernel none" };
	char *file = NULL, *env = NULL, *args = NULL, *out = NULL;

	cr_assert(asprintf(&file, "%s/a-file", tmp) > 0);
	test_write_file(file, "x\n", 2);
	/* under a file: neither can be made, whoever runs it */
	cr_assert(asprintf(&env, "Q4KHOST_F2_RECEIPT_DIR=%s/f2 Q4KHOST_RECEIPT_KEY=%s/receipt.key",
	                   file, file) > 0);
	for (int i = 0; i < 3; i++) {
		cr_assert(asprintf(&args, "%s --plugin-path %s -m %s/tests/fixtures/tiny-llama.gguf",
		                   i < 2 ? runs[i] : RUN, plugins, test_srcdir()) > 0);
		if (i < 2) {
			cr_expect_eq(test_q4khost(env, tmp, args, &out), 0, "%s: %s", args, out);
		} else {
			cr_expect_eq(test_q4khost(env, tmp, args, &out), 3, "%s: %s", args, out);
			cr_expect(strstr(out, "F2 cannot keep its receipts there: cannot create it: Not a "
			                      "directory") != NULL, "%s", out);
		}
		free(out);
		free(args);
	}
	free(env);
	free(file);
}
