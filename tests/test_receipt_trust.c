/*
 * A receipt cannot lie, tried as a careful user would, through the real
 * CLI:
 *  - a broken variant's receipt with its verdict edited to "pass" is not
 *    believed: the verdict is derived again from the receipt's own points,
 *    the candidate is measured again and does not serve;
 *  - a plugin overwritten in place by another build of the same size,
 *    its modification time restored, is hashed again (the hash cache also
 *    keys on the change time, which cannot be set back), so its old pass
 *    does not vouch for the new bytes.
 */
#include <criterion/criterion.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "helpers.h"

/* q4khost COMMAND ... with receipts in RECEIPTS; the output and status. */
static int q4k(const char *receipts, const char *plugins, const char *args, char **out)
{
	char *cmd = NULL;
	int rc;

	if (asprintf(&cmd, "Q4KHOST_F2_RECEIPT_DIR=%s %s/host/cli/q4khost %s --plugin-path %s -m %s",
	             receipts, test_builddir(), args, plugins, test_model_path()) < 0)
		cr_assert_fail("out of memory");
	rc = test_shell(cmd, out);
	free(cmd);
	return rc;
}

/* The one receipt file in DIR (its path, malloc()ed). */
static char *only_receipt(const char *dir)
{
	char *cmd = NULL, *out = NULL;

	if (asprintf(&cmd, "ls %s/*.json", dir) < 0)
		cr_assert_fail("out of memory");
	cr_assert_eq(test_shell(cmd, &out), 0, "no receipt in %s", dir);
	cr_assert_eq(strchr(out, '\n'), strrchr(out, '\n'), "more than one receipt: %s", out);
	*strchr(out, '\n') = 0;
	free(cmd);
	return out;
}

Test(receipt_trust, an_edited_verdict_is_not_believed, .timeout = 900)
{
	static const char *const names[] = { "defect_biased", NULL };
	const char *plugins, *receipts = test_tmpdir();
	char *out = NULL, *path, *text, *at;
	size_t len;

	test_model_path();
	plugins = test_plugin_dir(names);
	cr_assert_eq(q4k(receipts, plugins, "validate --kernel defect-biased", &out), 1, "%s", out);
	cr_assert(strstr(out, "broken") != NULL, "%s", out);
	free(out);

	path = only_receipt(receipts);
	text = test_read_file(path, &len);
	cr_assert_not_null(text);
	at = strstr(text, "\"verdict\": \"broken\"");
	cr_assert_not_null(at, "no verdict line in %s", path);
	/* the same length: "broken" -> "pass  " would not parse; rewrite */
	{
		char *edited = NULL;

		*at = 0;
		cr_assert(asprintf(&edited, "%s\"verdict\": \"pass\"%s", text,
		                   at + strlen("\"verdict\": \"broken\"")) > 0);
		test_write_file(path, edited, strlen(edited));
		free(edited);
	}

	cr_expect_neq(q4k(receipts, plugins, "run -p 'The sky is' -n 4 --kernel defect-biased", &out),
	              0, "an edited receipt made a broken variant serve: %s", out);
	cr_expect(strstr(out, "says \"pass\" but its own measurements say \"broken\"") != NULL,
	          "the report does not say why the receipt was ignored: %s", out);
	cr_expect(strstr(out, "F2: pass") == NULL, "%s", out);
	free(out);
	free(text);
	free(path);
}

Test(receipt_trust, a_plugin_rewritten_in_place_is_hashed_again, .timeout = 900)
{
	static const char *const names[] = { "cpu_q8act", NULL };
	const char *plugins, *receipts = test_tmpdir();
	char *out = NULL, *so = NULL, *bytes, *at;
	struct stat before, after;
	struct timespec times[2];
	size_t len;

	test_model_path();
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

Test(receipt_trust, a_changed_plugin_setting_measures_again, .timeout = 900)
{
	static const char *const names[] = { "cpu_q8act", NULL };
	const char *plugins, *receipts = test_tmpdir();
	char *out = NULL, *one = NULL, *two = NULL;

	test_skip_under_sanitizers("three F2 measurements on the default model; the receipt "
	                           "reading it tests runs in the two tests above");
	test_model_path();
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
