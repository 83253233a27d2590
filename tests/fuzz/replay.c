/*
 * The fuzz target FUZZ_TARGET (a -D of the build) as a Criterion suite:
 * every committed seed (tests/fuzz/seeds/TARGET) and every input that once
 * crashed it (tests/fuzz/regressions/TARGET) goes through the target's
 * LLVMFuzzerTestOneInput, here an ordinary function built by the normal
 * compiler, so each CI run checks them without clang. A broken promise
 * aborts, which Criterion reports as a crash of the test.
 */
#include <criterion/criterion.h>
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>

#include "../helpers.h"
#include "fuzz.h"

static int plain_name(const struct dirent *e)
{
	return e->d_name[0] != '.';
}

/* Replay every file of DIR in name order; returns how many. */
static size_t replay_dir(const char *dir)
{
	struct dirent **names;
	int n = scandir(dir, &names, plain_name, alphasort);
	size_t done = 0;

	cr_assert(n >= 0, "%s: cannot list", dir);
	for (int i = 0; i < n; i++) {
		char path[4096];
		size_t len;
		void *data;

		snprintf(path, sizeof(path), "%s/%s", dir, names[i]->d_name);
		free(names[i]);
		data = test_read_file(path, &len);
		cr_assert(data, "%s: cannot read", path);
		/* Named before the run, so a crash report says which input. */
		fprintf(stderr, "replaying %s (%zu bytes)\n", path, len);
		LLVMFuzzerTestOneInput(data, len);
		free(data);
		done++;
	}
	free(names);
	return done;
}

Test(fuzz, seeds)
{
	char dir[4096];
	size_t n;

	snprintf(dir, sizeof(dir), "%s/tests/fuzz/seeds/%s", test_srcdir(), FUZZ_TARGET);
	n = replay_dir(dir);
	cr_log_info("%s: %zu seeds replayed", FUZZ_TARGET, n);
	cr_assert_gt(n, 0, "%s holds no seeds", dir);
}

Test(fuzz, regressions)
{
	char dir[4096];
	DIR *d;

	snprintf(dir, sizeof(dir), "%s/tests/fuzz/regressions/%s", test_srcdir(),
	         FUZZ_TARGET);
	d = opendir(dir);
	if (!d)
		cr_skip_test("%s: no regression inputs (none found yet)", dir);
	closedir(d);
	cr_log_info("%s: %zu regression inputs replayed", FUZZ_TARGET,
	            replay_dir(dir));
}
