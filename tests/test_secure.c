/*
 * A set-uid q4khost, for real: a copy of the built binary owned by an
 * unprivileged user (nobody) with mode 4755, run by root, so the real and
 * effective user ids differ and the kernel sets AT_SECURE. The environment
 * must then be ignored (and said to be, once) and only root-owned plugin
 * files in root-owned folders may load. The same command through the
 * ordinary binary is the control: there the environment and the other
 * owners count. Skipped, with the reason, when not run as root, without a
 * user called nobody, where the folder is mounted nosuid, or where a folder
 * above the test's (TMPDIR: make distcheck nests it in a private one) keeps
 * nobody out, and in the sanitizer build. The same rule covers what the
 * host caches about a plugin: a set-uid command trusts no enumeration
 * record (enumerate.h) that root does not own.
 */
#include <criterion/criterion.h>
#include <dirent.h>
#include <grp.h>
#include <pwd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include "helpers.h"

/* A world-readable folder holding the cpu plugin and test plugin NAME. */
static const char *plugin_folder(const char *name)
{
	const char *const names[] = { name, NULL };
	const char *dir = test_plugin_dir(names);

	cr_assert_eq(chmod(dir, 0755), 0);
	return dir;
}

/* BIN plugins [ARGS] with ENV, stderr merged; its exit status. */
static int plugins(const char *env, const char *bin, const char *args, char **out)
{
	char cmd[32768];

	snprintf(cmd, sizeof(cmd), "env %s %s plugins %s", env, bin, args);
	return test_shell(cmd, out);
}

/* The first folder above DIR that others may not search, or NULL. */
static const char *closed_ancestor(const char *dir)
{
	static char path[4096];
	struct stat st;
	char *slash;

	snprintf(path, sizeof(path), "%s", dir);
	while ((slash = strrchr(path, '/')) != NULL) {
		*slash = 0;
		if (!path[0])
			return NULL;
		if (stat(path, &st) != 0 || !(st.st_mode & S_IXOTH))
			return path;
	}
	return NULL;
}

/* A set-uid copy of the built q4khost, owned by UID, in a fresh folder. */
static char *setuid_copy(uid_t uid)
{
	char src[4096], *dst = malloc(4200);
	const char *dir = test_tmpdir();
	size_t len;
	char *data;
	struct statvfs vfs;

	snprintf(src, sizeof(src), "%s/host/cli/q4khost", test_builddir());
	data = test_read_file(src, &len);
	cr_assert_not_null(data, "cannot read %s", src);
	if (len < 4 || memcmp(data, "\177ELF", 4))
		cr_skip_test("%s is not the program itself (a libtool wrapper?)", src);
	cr_assert_eq(statvfs(dir, &vfs), 0);
	if (vfs.f_flag & ST_NOSUID)
		cr_skip_test("%s is on a file system mounted nosuid", dir);
	if (closed_ancestor(dir))
		cr_skip_test("%s is not searchable by others: the set-uid copy could not "
		             "reach the plugins below it", closed_ancestor(dir));
	cr_assert_eq(chmod(dir, 0755), 0);
	snprintf(dst, 4200, "%s/q4khost", dir);
	test_write_file(dst, data, len);
	free(data);
	/* chown clears the set-uid bit: the mode comes after. */
	cr_assert_eq(chown(dst, uid, (gid_t)-1), 0);
	cr_assert_eq(chmod(dst, 04755), 0);
	return dst;
}

/*
 * A set-uid copy of q4khost owned by nobody (*NOBODY), or the test skipped
 * saying why it cannot be made here.
 */
static char *setuid_nobody(const struct passwd **nobody)
{
#ifdef __SANITIZE_ADDRESS__
	/* The set-uid copy is not dumpable, so its LeakSanitizer cannot stop
	 * its threads and fails at exit; the ordinary build runs these tests. */
	cr_skip_test("a set-uid process cannot run LeakSanitizer (sanitizer build)");
#endif
	if (geteuid() != 0)
		cr_skip_test("needs root to make a set-uid copy owned by another user");
	*nobody = getpwnam("nobody");
	if (!*nobody || (*nobody)->pw_uid == 0)
		cr_skip_test("no unprivileged user called nobody");
	return setuid_copy((*nobody)->pw_uid);
}

Test(secure, setuid_ignores_the_environment_and_takes_root_owned_plugins_only)
{
	const struct passwd *nobody;
	const char *root_dir, *user_file_dir, *user_dir;
	char *bin, user_file[4300], args[16384], env[8192], want[12288], *out;
	char ordinary[4096];

	bin = setuid_nobody(&nobody);

	/* Root's plugins; a plugin owned by nobody; a folder owned by nobody. */
	root_dir = plugin_folder("kernel_ok");
	user_file_dir = plugin_folder("cpu_q8act");
	snprintf(user_file, sizeof(user_file), "%s/cpu_q8act.so", user_file_dir);
	cr_assert_eq(chown(user_file, nobody->pw_uid, (gid_t)-1), 0);
	user_dir = plugin_folder("defect_nan");
	cr_assert_eq(chown(user_dir, nobody->pw_uid, (gid_t)-1), 0);
	snprintf(args, sizeof(args), "--plugin-path %s:%s:%s", root_dir, user_file_dir, user_dir);
	snprintf(env, sizeof(env),
	         "Q4KHOST_PLUGIN_PATH=%s Q4KHOST_CONFIG=%s/missing.ini", user_dir, user_dir);

	/* The control: the ordinary binary heeds the variable, and the owners pass. */
	snprintf(ordinary, sizeof(ordinary), "%s/host/cli/q4khost", test_builddir());
	cr_expect_eq(plugins(env, ordinary, args, &out), 3, "%s", out);
	cr_expect(strstr(out, "missing.ini") != NULL, "%s", out);
	free(out);
	cr_expect_eq(plugins("", ordinary, args, &out), 0, "%s", out);
	cr_expect_null(strstr(out, "REJECTED"), "%s", out);
	free(out);

	cr_assert_eq(plugins(env, bin, args, &out), 0, "%s", out);
	cr_expect(strstr(out, "q4khost plugins: running set-uid or set-gid: ignoring the environment variables ") != NULL,
	          "%s", out);
	cr_expect(strstr(out, "Q4KHOST_PLUGIN_PATH") != NULL, "%s", out);
	cr_expect(strstr(out, "Q4KHOST_CONFIG") != NULL, "%s", out);
	snprintf(want, sizeof(want), "%s/kernel_ok.so\n  ACCEPTED\n", root_dir);
	cr_expect(strstr(out, want) != NULL, "%s", out);
	snprintf(want, sizeof(want), "%s/cpu.so\n  ACCEPTED\n", root_dir);
	cr_expect(strstr(out, want) != NULL, "%s", out);
	snprintf(want, sizeof(want),
	         "%s\n  REJECTED: refused: the file %s is owned by uid %u, not root (required when running set-uid or set-gid)\n",
	         user_file, user_file, (unsigned)nobody->pw_uid);
	cr_expect(strstr(out, want) != NULL, "%s", out);
	snprintf(want, sizeof(want),
	         "%s/defect_nan.so\n  REJECTED: refused: the folder %s is owned by uid %u, not root (required when running set-uid or set-gid)\n",
	         user_dir, user_dir, (unsigned)nobody->pw_uid);
	cr_expect(strstr(out, want) != NULL, "%s", out);
	free(out);

	/* Set-uid keeps sudo's rule: no group may write, its owner's own included. */
	cr_assert_eq(chmod(root_dir, 0775), 0);
	snprintf(args, sizeof(args), "--plugin-path %s", root_dir);
	cr_assert_eq(plugins("", bin, args, &out), 0, "%s", out);
	snprintf(want, sizeof(want),
	         "%s/kernel_ok.so\n  REJECTED: refused: the folder %s is writable by group %s (mode 0775; fix: chmod g-w %s)\n",
	         root_dir, root_dir, getgrgid(getegid())->gr_name, root_dir);
	cr_expect(strstr(out, want) != NULL, "%s", out);
	free(out);

	/* Without --plugin-path the variable is not taken: the built-in path is. */
	cr_assert_eq(plugins(env, bin, "", &out), 0, "%s", out);
	cr_expect(strstr(out, "  from:      built-in\n") != NULL, "%s", out);
	cr_expect_null(strstr(out, user_dir), "%s", out);
	free(out);
	free(bin);
}

/* How many lines of LOG read "NAME init" (tests/plugins/backend_v1_0.c). */
static int inits(const char *log, const char *name)
{
	char line[128];
	size_t len;
	char *text = access(log, F_OK) == 0 ? test_read_file(log, &len) : NULL;
	int n = 0;

	snprintf(line, sizeof(line), "%s init\n", name);
	for (const char *s = text; s && (s = strstr(s, line)) != NULL; s += strlen(line))
		n++;
	free(text);
	return n;
}

/* How many enumeration records RECEIPTS/backends holds, all owned by UID. */
static int nobody_records(const char *receipts, uid_t uid)
{
	char dir[4200], path[4500];
	struct dirent *e;
	struct stat st;
	DIR *d;
	int n = 0;

	snprintf(dir, sizeof(dir), "%s/backends", receipts);
	d = opendir(dir);
	cr_assert_not_null(d, "no %s", dir);
	while ((e = readdir(d)) != NULL) {
		if (!strstr(e->d_name, ".enum"))
			continue;
		snprintf(path, sizeof(path), "%s/%s", dir, e->d_name);
		cr_assert_eq(stat(path, &st), 0);
		cr_expect_eq(st.st_uid, uid, "%s", path);
		n++;
	}
	closedir(d);
	return n;
}

Test(secure, setuid_trusts_no_enumeration_record_root_does_not_own)
{
	const struct passwd *nobody;
	const char *plugins_dir, *receipts, *config_dir;
	char *bin, ordinary[4096], config[4200], log[4200], env[4400], args[12288], *out;
	FILE *f;

	bin = setuid_nobody(&nobody);
	plugins_dir = plugin_folder("enum_abort");
	/* the receipts are nobody's, as a set-uid nobody's own would be */
	receipts = test_tmpdir();
	cr_assert_eq(chown(receipts, nobody->pw_uid, (gid_t)-1), 0);
	config_dir = test_tmpdir();
	cr_assert_eq(chmod(config_dir, 0755), 0);
	snprintf(config, sizeof(config), "%s/q4khost.ini", config_dir);
	f = fopen(config, "w");
	cr_assert_not_null(f);
	fprintf(f, "[f2]\nreceipt_dir = %s\n", receipts);
	cr_assert_eq(fclose(f), 0);
	cr_assert_eq(chmod(config, 0644), 0);
	snprintf(log, sizeof(log), "%s/init.log", receipts);
	snprintf(env, sizeof(env), "Q4KH_TEST_ENUM_LOG=%s", log);
	snprintf(args, sizeof(args), "--plugin-path %s --config %s", plugins_dir, config);

	/* every set-uid command tries the backend again: its records are nobody's */
	for (int i = 1; i <= 2; i++) {
		cr_assert_eq(plugins(env, bin, args, &out), 0, "%s", out);
		cr_expect(strstr(out, "REFUSED: its init or device enumeration (in a helper "
		                      "process) crashed: killed by signal 6") != NULL, "%s", out);
		free(out);
		cr_expect_eq(inits(log, "enum-abort"), i, "set-uid command %d", i);
	}
	/* a record was kept, as nobody's: the set-uid commands read it, and refused it */
	cr_expect_eq(nobody_records(receipts, nobody->pw_uid), 2, "cpu's and enum-abort's");
	/* the control: the ordinary binary takes the record as it is */
	snprintf(ordinary, sizeof(ordinary), "%s/host/cli/q4khost", test_builddir());
	cr_assert_eq(plugins(env, ordinary, args, &out), 0, "%s", out);
	cr_expect(strstr(out, "REFUSED: its init or device enumeration") != NULL, "%s", out);
	free(out);
	cr_expect_eq(inits(log, "enum-abort"), 2, "the ordinary binary started a helper");
	free(bin);
}
