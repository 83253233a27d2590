/*
 * The plugin loader and the layered configuration, through the real
 * q4kh_registry_scan and q4kh_config_load on files in fresh folders.
 * Expected texts are the contract of registry.c and config.c; the dlopen
 * text comes from glibc, the symbol table from binutils' nm.
 */
#include <criterion/criterion.h>
#include <criterion/redirect.h>
#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "helpers.h"
#include "registry.h"

/* Each test runs in its own process; these are its temporary folders. */
static const char *roots[4];
static int n_roots;

static int remove_entry(const char *path, const struct stat *st, int flag,
                        struct FTW *ftw)
{
	(void)st;
	(void)flag;
	(void)ftw;
	chmod(path, 0700);
	return remove(path);
}

static void remove_roots(void)
{
	for (int i = 0; i < n_roots; i++)
		nftw(roots[i], remove_entry, 16, FTW_DEPTH | FTW_PHYS);
}

TestSuite(loader, .fini = remove_roots);

/* A fresh private folder, removed when the test ends. */
static const char *fresh_dir(void)
{
	cr_assert_lt(n_roots, 4);
	roots[n_roots] = test_tmpdir();
	return roots[n_roots++];
}

static char *path_of(const char *dir, const char *name)
{
	char *p;

	cr_assert_geq(asprintf(&p, "%s/%s", dir, name), 0);
	return p;
}

/* A fresh folder (mode 0700) under the test's own temporary folder. */
static char *subdir(const char *parent, const char *name)
{
	char *d = path_of(parent, name);

	cr_assert_eq(mkdir(d, 0700), 0, "mkdir %s", d);
	return d;
}

static void copy_file(const char *src, const char *dst)
{
	size_t len;
	void *data = test_read_file(src, &len);

	cr_assert_not_null(data, "cannot read %s (run make check to build it)", src);
	test_write_file(dst, data, len);
	free(data);
}

/* Copy test plugin NAME (built by make check) into DIR as AS; its path. */
static char *put_test_plugin(const char *dir, const char *name, const char *as)
{
	char src[4096];
	char *dst = path_of(dir, as);

	snprintf(src, sizeof(src), "%s/tests/plugins/.libs/%s.so", test_builddir(),
	         name);
	copy_file(src, dst);
	return dst;
}

static char *cpu_plugin_path(void)
{
	char *p;

	cr_assert_geq(asprintf(&p, "%s/plugins/cpu/.libs/cpu.so", test_builddir()), 0);
	cr_assert_eq(access(p, R_OK), 0, "%s missing (make plugins/cpu/cpu.la)", p);
	return p;
}

static void write_text(const char *path, const char *text)
{
	test_write_file(path, text, strlen(text));
}

static struct q4kh_registry *scan(const char *path,
                                  const struct q4kh_config *config)
{
	struct q4kh_registry *r = NULL;
	struct q4kh_error err = { "" };

	cr_assert_eq(q4kh_registry_scan(path, config, &r, &err), 0, "%s", err.msg);
	cr_assert_not_null(r);
	return r;
}

/* Scan DIR, which holds one plugin, and return that plugin's record. */
static const struct q4kh_plugin *scan_one(const char *dir,
                                          struct q4kh_registry **r)
{
	*r = scan(dir, NULL);
	cr_assert_eq((*r)->n_plugins, 1, "found %zu plugins in %s",
	             (*r)->n_plugins, dir);
	return &(*r)->plugins[0];
}

static void assert_rejected(const struct q4kh_plugin *p, const char *reason)
{
	cr_assert_eq(p->state, Q4KH_PLUGIN_REJECTED, "%s: state %d", p->path,
	             p->state);
	cr_assert_str_eq(p->reason, reason);
	cr_assert_null(p->dl, "a rejected plugin stays loaded");
	cr_assert_null(p->desc);
}

/* Scan a folder holding only test plugin NAME; check the rejection text. */
static void expect_rejection(const char *name, const char *reason)
{
	const char *dir = fresh_dir();
	struct q4kh_registry *r;

	free(put_test_plugin(dir, name, "p.so"));
	assert_rejected(scan_one(dir, &r), reason);
	q4kh_registry_free(r);
}

Test(loader, wrong_major_names_both_versions)
{
	expect_rejection("bad_major", "built for plugin ABI 2; this host speaks ABI 1");
}

Test(loader, truncated_descriptor)
{
	/* 56 = offsetof(backend); 72 = every ABI 1.0 field, up to kernel. */
	expect_rejection("truncated",
	                 "descriptor struct_size 56 is smaller than the 72 bytes of ABI 1.0");
}

/* ABI 1.3: a backend kind follows the rules of a name. */
Test(loader, backend_kind_that_is_no_identifier)
{
	expect_rejection("bad_backend_kind",
	                 "backend kind \"CPU (fast)\" is not an identifier (1 to 63 of "
	                 "a-z 0-9 - _, not starting with - or _)");
}

Test(loader, table_smaller_than_abi_1_0)
{
	/* 96 = 32 bytes of fields before init, then 8 function pointers. */
	expect_rejection("short_table",
	                 "kernel table struct_size 16 is smaller than the 96 bytes of ABI 1.0");
}

Test(loader, table_smaller_than_its_claimed_minor)
{
	char want[160];

	/* 200 = ABI 1.0's backend table, up to native_device. */
	snprintf(want, sizeof(want),
	         "backend table struct_size 200 is smaller than the %zu bytes of ABI 1.%d, which its descriptor claims",
	         sizeof(struct q4kh_backend_v1), Q4KH_ABI_MINOR);
	expect_rejection("old_table", want);
}

/* ABI 1.4 appended gemv_multi: a kernel table that claims 1.4 must hold it. */
Test(loader, kernel_table_smaller_than_its_claimed_minor)
{
	char want[160];

	snprintf(want, sizeof(want),
	         "kernel table struct_size 96 is smaller than the %zu bytes of ABI 1.%d, which its descriptor claims",
	         sizeof(struct q4kh_kernel_v1), Q4KH_ABI_MINOR);
	expect_rejection("old_kernel_table", want);
}

/*
 * Every function behind a lying descriptor leaves evidence when called
 * (tests/plugins/liar.c): after the loader, and after the real CLI listing
 * plugins and devices, there must be none.
 */
Test(loader, lying_descriptors_are_refused_before_any_call)
{
	static const char *const liars[] = { "truncated", "bad_major", "short_table" };
	const char *dir = fresh_dir();
	char *evidence = path_of(fresh_dir(), "evidence"), *cpu = cpu_plugin_path();
	char *cpu_copy = path_of(dir, "cpu.so"), cmd[12288], *out;
	struct q4kh_registry *r;

	cr_assert_eq(setenv("Q4KH_TEST_EVIDENCE", evidence, 1), 0);
	copy_file(cpu, cpu_copy);
	for (size_t i = 0; i < 3; i++) {
		char as[64];

		snprintf(as, sizeof(as), "%s.so", liars[i]);
		free(put_test_plugin(dir, liars[i], as));
	}
	r = scan(dir, NULL);
	cr_assert_eq(r->n_plugins, 4);
	cr_expect_str_eq(r->plugins[0].reason,
	                 "built for plugin ABI 2; this host speaks ABI 1");
	cr_expect_eq(r->plugins[1].state, Q4KH_PLUGIN_ACCEPTED, "cpu: %s", r->plugins[1].reason);
	cr_expect(strstr(r->plugins[2].reason, "kernel table struct_size 16") != NULL);
	cr_expect(strstr(r->plugins[3].reason, "descriptor struct_size 56") != NULL);
	q4kh_registry_free(r);
	cr_expect_neq(access(evidence, F_OK), 0, "the loader called into a liar");

	snprintf(cmd, sizeof(cmd), "%s/host/cli/q4khost plugins --plugin-path %s",
	         test_builddir(), dir);
	cr_expect_eq(test_shell(cmd, &out), 0, "%s", out);
	cr_expect(strstr(out, "REJECTED: built for plugin ABI 2") != NULL, "%s", out);
	cr_expect(strstr(out, "REJECTED: kernel table struct_size 16") != NULL, "%s", out);
	cr_expect(strstr(out, "REJECTED: descriptor struct_size 56") != NULL, "%s", out);
	cr_expect(strstr(out, "backend cpu: 1 device") != NULL, "%s", out);
	cr_expect_neq(access(evidence, F_OK), 0, "the CLI called into a liar: %s", out);
	free(out);
	free(evidence);
	free(cpu);
	free(cpu_copy);
}

Test(loader, missing_entry_symbol)
{
	expect_rejection("no_entry", "no entry symbol q4kh_plugin_entry_v1");
}

Test(loader, entry_returning_null)
{
	expect_rejection("null_desc", "q4kh_plugin_entry_v1 returned NULL");
}

Test(loader, unknown_kind)
{
	expect_rejection("bad_kind", "unknown plugin kind 7 (expected 1 backend or 2 kernel)");
}

Test(loader, name_not_an_identifier)
{
	expect_rejection("bad_name",
	                 "plugin name \"../Evil Name\" is not an identifier "
	                 "(1 to 63 of a-z 0-9 - _, not starting with - or _)");
}

Test(loader, null_required_function)
{
	expect_rejection("null_func", "backend table: required function mul_mat is NULL");
}

Test(loader, rejected_plugin_keeps_file_stem_as_name)
{
	const char *dir = fresh_dir();
	struct q4kh_registry *r;

	free(put_test_plugin(dir, "no_entry", "vendor-x.so"));
	cr_assert_str_eq(scan_one(dir, &r)->name, "vendor-x");
	cr_assert_null(q4kh_registry_find(r, "vendor-x"));
	q4kh_registry_free(r);
}

Test(loader, non_elf_file_gives_dlopen_text)
{
	const char *dir = fresh_dir();
	char *file = path_of(dir, "x.so");
	char text[256], expected[4400];
	struct q4kh_registry *r;

	memset(text, 'q', sizeof(text));
	test_write_file(file, text, sizeof(text));
	snprintf(expected, sizeof(expected), "%s: invalid ELF header", file);
	assert_rejected(scan_one(dir, &r), expected);
	q4kh_registry_free(r);
	free(file);
}

/* A plugin cut short (an interrupted copy or install) is refused before
 * dlopen, which would die of SIGBUS touching the pages past its end: a
 * crash of every command, with nothing said. The rest still load. */
Test(loader, a_plugin_cut_short_is_refused_not_a_crash)
{
	const char *dir = fresh_dir();
	char *cut = put_test_plugin(dir, "kernel_ok", "a.so"), *cpu = cpu_plugin_path();
	char *cpu_copy = path_of(dir, "cpu.so"), expected[4400], cmd[8192], *out;
	struct q4kh_registry *r;
	size_t len;
	void *data = test_read_file(cut, &len);

	/* 2000 bytes: the ELF and program headers, not all of the first segment. */
	cr_assert_gt(len, 2000);
	test_write_file(cut, data, 2000);
	copy_file(cpu, cpu_copy);
	r = scan(dir, NULL);
	cr_assert_eq(r->n_plugins, 2);
	snprintf(expected, sizeof(expected), "%s: cut short: 2000 bytes, but its ELF headers need ",
	         cut);
	cr_expect(!strncmp(r->plugins[0].reason, expected, strlen(expected)), "%s",
	          r->plugins[0].reason);
	cr_expect(strstr(r->plugins[0].reason, "(a copy or an install that did not finish?); "
	                                       "not loaded") != NULL, "%s", r->plugins[0].reason);
	assert_rejected(&r->plugins[0], r->plugins[0].reason);
	cr_expect_eq(r->plugins[1].state, Q4KH_PLUGIN_ACCEPTED, "%s", r->plugins[1].reason);
	q4kh_registry_free(r);

	snprintf(cmd, sizeof(cmd), "%s/host/cli/q4khost plugins --plugin-path %s",
	         test_builddir(), dir);
	cr_expect_eq(test_shell(cmd, &out), 0, "%s", out);
	cr_expect(strstr(out, "REJECTED: ") != NULL && strstr(out, expected) != NULL, "%s", out);
	cr_expect(strstr(out, "backend cpu: 1 device") != NULL, "%s", out);
	free(out);
	free(data);
	free(cut);
	free(cpu);
	free(cpu_copy);
}

/*
 * A group this process may give its files that holds someone besides
 * it (nobody's group, for root; else one of our groups with another
 * member), its name into NAME, as getent(1) lists the databases; -1 when
 * there is none.
 */
static long shared_group(char *name, size_t cap)
{
	char cmd[512], *out;
	long gid = -1;

	snprintf(cmd, sizeof(cmd),
	         "if [ $(id -u) = 0 ]; then set -- $(id -g nobody); else set -- $(id -G); fi; "
	         "for g in \"$@\"; do others=$(getent passwd | awk -F: -v g=$g -v u=$(id -u) "
	         "'$4 == g && $3 != u' | wc -l); m=$(getent group $g | cut -d: -f4 | "
	         "tr , '\\n' | grep -vx \"$(id -un)\" | grep -c .); "
	         "[ $((others + m)) -gt 0 ] && { getent group $g | cut -d: -f1,3; exit 0; }; done; "
	         "exit 1");
	if (test_shell(cmd, &out) == 0 && strchr(out, ':')) {
		*strchr(out, ':') = 0;
		snprintf(name, cap, "%s", out);
		gid = strtol(out + strlen(out) + 1, NULL, 10);
	}
	free(out);
	return gid;
}

/* Whether our primary group holds us alone (a user-private group), as
 * getent(1) lists the databases. */
static int own_group_is_private(void)
{
	char *out;
	int rc = test_shell("g=$(id -g); u=$(id -u); "
	                    "[ -z \"$(getent group $g | cut -d: -f4 | tr , '\\n' | "
	                    "grep -vx \"$(id -un)\")\" ] && "
	                    "[ -z \"$(getent passwd | awk -F: -v g=$g -v u=$u '$4 == g && $3 != u')\" ]",
	                    &out);

	free(out);
	return rc == 0;
}

Test(loader, file_writable_by_others_or_a_shared_group_is_refused)
{
	const char *dir = fresh_dir();
	const char *names[] = { "a.so", "b.so", "c.so" };
	const mode_t modes[] = { 0664, 0646, 0666 };
	char group[256], reason[4400];
	struct q4kh_registry *r;
	long gid = shared_group(group, sizeof(group));

	if (gid < 0)
		cr_skip_test("no group with another member that this user may give a file");
	for (int i = 0; i < 3; i++) {
		char *p = put_test_plugin(dir, "kernel_ok", names[i]);
		cr_assert_eq(chown(p, (uid_t)-1, (gid_t)gid), 0, "chgrp %s %s", group, p);
		cr_assert_eq(chmod(p, modes[i]), 0);
		free(p);
	}
	r = scan(dir, NULL);
	cr_assert_eq(r->n_plugins, 3);
	snprintf(reason, sizeof(reason),
	         "refused: the file %s/a.so is writable by group %s (mode 0664; fix: chmod g-w %s/a.so)",
	         dir, group, dir);
	assert_rejected(&r->plugins[0], reason);
	snprintf(reason, sizeof(reason),
	         "refused: the file %s/b.so is writable by others (mode 0646; fix: chmod o-w %s/b.so)",
	         dir, dir);
	assert_rejected(&r->plugins[1], reason);
	snprintf(reason, sizeof(reason),
	         "refused: the file %s/c.so is writable by group %s and others (mode 0666; fix: chmod go-w %s/c.so)",
	         dir, group, dir);
	assert_rejected(&r->plugins[2], reason);
	q4kh_registry_free(r);
}

/*
 * What make install gives under umask 002 where each user has a group of
 * their own (Debian, Ubuntu, Fedora): a folder and a file writable by the
 * owner's private group, which lets nobody else write them. Accepted; the
 * same modes with a group that holds others are refused above.
 */
Test(loader, writable_by_the_owners_private_group_is_accepted)
{
	const char *top = fresh_dir();
	char *dir = subdir(top, "upg"), *cpu = cpu_plugin_path(), *copy = path_of(dir, "cpu.so");
	struct q4kh_registry *r;

	if (!own_group_is_private())
		cr_skip_test("this user's primary group holds others too: no user-private group "
		             "to test with");
	copy_file(cpu, copy);
	cr_assert_eq(chmod(copy, 0664), 0);
	cr_assert_eq(chmod(dir, 0775), 0);
	cr_assert_eq(chmod(top, 0775), 0);
	cr_expect_eq(scan_one(dir, &r)->state, Q4KH_PLUGIN_ACCEPTED, "%s", r->plugins[0].reason);
	q4kh_registry_free(r);
	free(copy);
	free(cpu);
	free(dir);
}

Test(loader, folder_writable_by_others_is_refused)
{
	const char *top = fresh_dir();
	char *dir = subdir(top, "open");
	char expected[4400];
	struct q4kh_registry *r;

	free(put_test_plugin(dir, "kernel_ok", "k.so"));
	cr_assert_eq(chmod(dir, 0757), 0);
	snprintf(expected, sizeof(expected),
	         "refused: the folder %s is writable by others (mode 0757; fix: chmod o-w %s)",
	         dir, dir);
	assert_rejected(scan_one(dir, &r), expected);
	q4kh_registry_free(r);
	free(dir);
}

/* Someone who can write a folder above the plugin folder can rename the
 * plugin folder and put another in its place; a sticky one (/tmp) is safe. */
Test(loader, folder_above_writable_by_others_is_refused)
{
	const char *top = fresh_dir();
	char *open = subdir(top, "open"), *dir = subdir(open, "plugins");
	char expected[4400];
	struct q4kh_registry *r;

	free(put_test_plugin(dir, "kernel_ok", "k.so"));
	cr_assert_eq(chmod(open, 0757), 0);
	snprintf(expected, sizeof(expected),
	         "refused: the folder %s is writable by others (mode 0757; fix: chmod o-w %s), above %s",
	         open, open, dir);
	assert_rejected(scan_one(dir, &r), expected);
	q4kh_registry_free(r);
	cr_assert_eq(chmod(open, 01777), 0);
	cr_assert_eq(scan_one(dir, &r)->state, Q4KH_PLUGIN_ACCEPTED, "a sticky folder above refused it");
	q4kh_registry_free(r);
	free(dir);
	free(open);
}

Test(loader, duplicate_name_is_shadowed_with_both_paths)
{
	const char *top = fresh_dir();
	char *a = subdir(top, "a"), *b = subdir(top, "b");
	char *cpu = cpu_plugin_path();
	char *pa = path_of(a, "cpu.so"), *pb = path_of(b, "cpu.so");
	char *path;
	struct q4kh_registry *r;

	copy_file(cpu, pa);
	copy_file(cpu, pb);
	cr_assert_geq(asprintf(&path, "%s:%s", a, b), 0);
	r = scan(path, NULL);
	cr_assert_eq(r->n_plugins, 2);
	cr_assert_eq(r->plugins[0].state, Q4KH_PLUGIN_ACCEPTED, "%s",
	             r->plugins[0].reason);
	cr_assert_str_eq(r->plugins[0].path, pa);
	cr_assert_str_eq(r->plugins[0].name, "cpu");
	cr_assert_not_null(r->plugins[0].dl);
	cr_assert_eq(r->plugins[0].desc->kind, Q4KH_KIND_BACKEND);
	cr_assert_eq(r->plugins[1].state, Q4KH_PLUGIN_SHADOWED);
	cr_assert_str_eq(r->plugins[1].path, pb);
	cr_assert_str_eq(r->plugins[1].shadowed_by, pa);
	cr_assert_str_eq(r->plugins[1].name, "cpu");
	cr_assert_null(r->plugins[1].dl);
	cr_assert_eq(q4kh_registry_find(r, "cpu"), &r->plugins[0]);
	q4kh_registry_free(r);
	free(path);
	free(pa);
	free(pb);
	free(cpu);
	free(a);
	free(b);
}

/* plugin.h rule 2: a 1.0 backend keeps loading under a 1.1 host, and the
 * entries 1.1 appended count as absent. */
Test(loader, abi_1_0_backend_is_accepted_without_the_1_1_entries)
{
	const char *dir = fresh_dir();
	struct q4kh_registry *r;
	const struct q4kh_plugin *p;

	free(put_test_plugin(dir, "backend_v1_0", "old.so"));
	p = scan_one(dir, &r);
	cr_assert_eq(p->state, Q4KH_PLUGIN_ACCEPTED, "%s", p->reason);
	cr_assert_eq(p->desc->abi_minor, 0);
	cr_assert(Q4KH_BACKEND_HAS(p->desc->backend, native_device));
	cr_assert_not(Q4KH_BACKEND_HAS(p->desc->backend, read_pass));
	cr_assert_not(Q4KH_BACKEND_HAS(p->desc->backend, graph_free));
	/* its table holds a class past its struct_size: never read */
	cr_assert_eq(q4kh_plugin_arith(p), Q4KH_ARITH_UNDECLARED);
	q4kh_registry_free(r);
}

/* A variant built for ABI 1.3 keeps loading; gemv_multi counts as absent. */
Test(loader, abi_1_3_kernel_is_accepted_without_gemv_multi)
{
	const char *dir = fresh_dir();
	struct q4kh_registry *r;
	const struct q4kh_plugin *p;

	free(put_test_plugin(dir, "kernel_v1_3", "old.so"));
	p = scan_one(dir, &r);
	cr_assert_eq(p->state, Q4KH_PLUGIN_ACCEPTED, "%s", p->reason);
	cr_assert_eq(p->desc->abi_minor, 3);
	cr_assert(Q4KH_KERNEL_HAS(p->desc->kernel, release));
	cr_assert_not(Q4KH_KERNEL_HAS(p->desc->kernel, gemv_multi));
	cr_assert_eq(q4kh_plugin_arith(p), Q4KH_ARITH_UNDECLARED);
	q4kh_registry_free(r);
}

Test(loader, newer_minor_kernel_is_accepted_and_recorded)
{
	const char *dir = fresh_dir();
	struct q4kh_registry *r;
	const struct q4kh_plugin *p;

	free(put_test_plugin(dir, "kernel_ok", "kernel_ok.so"));
	p = scan_one(dir, &r);
	cr_assert_eq(p->state, Q4KH_PLUGIN_ACCEPTED, "%s", p->reason);
	cr_assert_str_eq(p->name, "kernel-ok");
	cr_assert_eq(p->desc->abi_minor, Q4KH_ABI_MINOR + 1);
	cr_assert_eq(p->desc->kind, Q4KH_KIND_KERNEL);
	cr_assert_str_eq(p->desc->kernel->backend, "cuda");
	/* its class as written, one this host does not know (guard.h judges) */
	cr_assert_eq(q4kh_plugin_arith(p), Q4KH_ARITH_INT8 + 1);
	cr_assert_eq(q4kh_registry_find(r, "kernel-ok"), p);
	cr_assert_null(q4kh_registry_find(r, "cpu"));
	q4kh_registry_free(r);
}

Test(loader, files_sorted_and_others_ignored)
{
	const char *dir = fresh_dir();
	char *sub;
	char *txt = path_of(dir, "notes.txt");
	struct q4kh_registry *r;

	free(put_test_plugin(dir, "no_entry", "c.so"));
	free(put_test_plugin(dir, "no_entry", "a.so"));
	free(put_test_plugin(dir, "no_entry", "b.so"));
	free(put_test_plugin(dir, "no_entry", "b.so.1"));
	write_text(txt, "not a plugin\n");
	sub = subdir(dir, "d.so");
	r = scan(dir, NULL);
	cr_assert_eq(r->n_plugins, 3);
	cr_assert_str_eq(r->plugins[0].name, "a");
	cr_assert_str_eq(r->plugins[1].name, "b");
	cr_assert_str_eq(r->plugins[2].name, "c");
	q4kh_registry_free(r);
	free(sub);
	free(txt);
}

Test(loader, empty_and_missing_path_components)
{
	const char *dir = fresh_dir();
	char *path;
	struct q4kh_registry *r;

	free(put_test_plugin(dir, "kernel_ok", "k.so"));
	cr_assert_geq(asprintf(&path, ":%s/none::%s:", dir, dir), 0);
	r = scan(path, NULL);
	cr_assert_str_eq(r->path, path);
	cr_assert_eq(r->n_plugins, 1);
	cr_assert_eq(r->plugins[0].state, Q4KH_PLUGIN_ACCEPTED);
	q4kh_registry_free(r);
	r = scan("", NULL);
	cr_assert_eq(r->n_plugins, 0);
	q4kh_registry_free(r);
	free(path);
}

/* A config whose only layer is FILE, the user's own layer kept empty. */
static struct q4kh_config *config_from(const char *top, const char *text)
{
	char *sys = subdir(top, "etc");
	char *file = path_of(top, "cli.ini");
	struct q4kh_config *c = NULL;
	struct q4kh_error err = { "" };

	cr_assert_eq(setenv("XDG_CONFIG_HOME", sys, 1), 0);
	write_text(file, text);
	cr_assert_eq(q4kh_config_load(sys, file, &c, &err), 0, "%s", err.msg);
	free(file);
	free(sys);
	return c;
}

Test(loader, path_precedence)
{
	const char *top = fresh_dir();
	struct q4kh_config *c = config_from(top, "[plugins]\npath = /from/config\n");
	char *file = path_of(top, "cli.ini");
	struct q4kh_registry *r;

	cr_assert_eq(setenv("Q4KHOST_PLUGIN_PATH", "/from/env", 1), 0);
	r = scan("/from/cli", c);
	cr_assert_str_eq(r->path, "/from/cli");
	cr_assert_str_eq(r->path_origin, "--plugin-path");
	q4kh_registry_free(r);

	r = scan(NULL, c);
	cr_assert_str_eq(r->path, "/from/env");
	cr_assert_str_eq(r->path_origin, "Q4KHOST_PLUGIN_PATH");
	q4kh_registry_free(r);

	cr_assert_eq(unsetenv("Q4KHOST_PLUGIN_PATH"), 0);
	r = scan(NULL, c);
	cr_assert_str_eq(r->path, "/from/config");
	cr_assert_str_eq(r->path_origin, file);
	q4kh_registry_free(r);

	r = scan(NULL, NULL);
	cr_assert_str_eq(r->path, Q4KH_PLUGINDIR);
	cr_assert_str_eq(r->path_origin, "built-in");
	q4kh_registry_free(r);
	q4kh_config_free(c);
	free(file);
}

Test(loader, host_api_config_and_log, .init = cr_redirect_stderr)
{
	const char *top = fresh_dir();
	char *dir = subdir(top, "plugins");
	struct q4kh_config *c =
		config_from(top, "[plugin.kernel-ok]\nTile = 64\nwarps =\n[plugin.cpu]\nthreads = 2\n");
	struct q4kh_registry *r;
	const struct q4kh_plugin *p;

	free(put_test_plugin(dir, "kernel_ok", "k.so"));
	r = scan(dir, c);
	p = q4kh_registry_find(r, "kernel-ok");
	cr_assert_not_null(p);
	cr_assert_eq(p->api.struct_size, sizeof(struct q4kh_host_api));
	cr_assert_eq(p->api.abi_major, 1);
	cr_assert_eq(p->api.abi_minor, Q4KH_ABI_MINOR);
	cr_assert_str_eq(p->api.config_get(p->api.host_data, "tile"), "64");
	cr_assert_null(p->api.config_get(p->api.host_data, "threads"));
	/* Set to nothing: unset, as every empty value (docs/config.md). */
	cr_assert_null(p->api.config_get(p->api.host_data, "warps"));
	p->api.log(p->api.host_data, Q4KH_LOG_WARN, "slow path\n");
	p->api.log(p->api.host_data, Q4KH_LOG_INFO, "ready");
	fflush(stderr);
	cr_assert_stderr_eq_str("q4khost: [plugin kernel-ok] warning: slow path\n"
	                        "q4khost: [plugin kernel-ok] info: ready\n");
	q4kh_registry_free(r);

	r = scan(dir, NULL);
	p = q4kh_registry_find(r, "kernel-ok");
	cr_assert_null(p->api.config_get(p->api.host_data, "tile"));
	q4kh_registry_free(r);
	q4kh_config_free(c);
	free(dir);
}

Test(loader, config_layers)
{
	const char *top = fresh_dir();
	char *sys = subdir(top, "etc"), *confd = subdir(sys, "conf.d");
	char *xdg = subdir(top, "xdg"), *xq = subdir(xdg, "q4khost");
	char *base = path_of(sys, "q4khost.ini");
	char *d10 = path_of(confd, "10-one.ini"), *d20 = path_of(confd, "20-two.ini");
	char *ignored = path_of(confd, "30-three.ini.disabled");
	char *user = path_of(xq, "q4khost.ini"), *cli = path_of(top, "cli.ini");
	struct q4kh_config *c;
	struct q4kh_error err = { "" };
	const char *origin;

	write_text(base, "[a]\nx = base\ny = base\nz = base\nMixed = Case\n");
	write_text(d20, "[a]\ny = two\nz = two\n");
	write_text(d10, "[a]\ny = one\nu = one\n");
	write_text(ignored, "[a]\nx = ignored\n");
	write_text(user, "[a]\nu = user\n");
	write_text(cli, "[a]\nz = cli\n");
	cr_assert_eq(setenv("XDG_CONFIG_HOME", xdg, 1), 0);
	cr_assert_eq(q4kh_config_load(sys, cli, &c, &err), 0, "%s", err.msg);

	cr_assert_str_eq(q4kh_config_get(c, "a", "x", &origin), "base");
	cr_assert_str_eq(origin, base);
	cr_assert_str_eq(q4kh_config_get(c, "a", "y", &origin), "two");
	cr_assert_str_eq(origin, d20);
	cr_assert_str_eq(q4kh_config_get(c, "a", "z", &origin), "cli");
	cr_assert_str_eq(origin, cli);
	cr_assert_str_eq(q4kh_config_get(c, "a", "u", &origin), "user");
	cr_assert_str_eq(origin, user);
	cr_assert_str_eq(q4kh_config_get(c, "a", "mixed", NULL), "Case");
	cr_assert_null(q4kh_config_get(c, "a", "nothing", &origin));
	cr_assert_null(origin);
	q4kh_config_free(c);
	free(base);
	free(d10);
	free(d20);
	free(ignored);
	free(user);
	free(cli);
	free(xq);
	free(xdg);
	free(confd);
	free(sys);
}

Test(loader, user_file_under_home_without_xdg)
{
	const char *top = fresh_dir();
	char *cfg = subdir(top, ".config"), *q = subdir(cfg, "q4khost");
	char *user = path_of(q, "q4khost.ini");
	char *sys = subdir(top, "etc");
	struct q4kh_config *c;
	struct q4kh_error err = { "" };

	write_text(user, "[plugins]\npath = /home/plugins\n");
	cr_assert_eq(unsetenv("XDG_CONFIG_HOME"), 0);
	cr_assert_eq(setenv("HOME", top, 1), 0);
	cr_assert_eq(q4kh_config_load(sys, NULL, &c, &err), 0, "%s", err.msg);
	cr_assert_str_eq(q4kh_config_get(c, "plugins", "path", NULL), "/home/plugins");
	q4kh_config_free(c);
	free(user);
	free(sys);
	free(q);
	free(cfg);
}

Test(loader, q4khost_config_names_the_extra_file_and_config_outranks_it)
{
	const char *top = fresh_dir();
	char *sys = subdir(top, "etc");
	char *env = path_of(top, "env.ini"), *cli = path_of(top, "cli.ini");
	struct q4kh_config *c;
	struct q4kh_error err = { "" };
	const char *origin;

	write_text(env, "[plugins]\npath = /from/env\n");
	write_text(cli, "[plugins]\npath = /from/cli\n");
	cr_assert_eq(setenv("Q4KHOST_CONFIG", env, 1), 0);
	cr_assert_eq(q4kh_config_load(sys, NULL, &c, &err), 0, "%s", err.msg);
	cr_expect_str_eq(q4kh_config_get(c, "plugins", "path", &origin), "/from/env");
	cr_expect_str_eq(origin, env);
	q4kh_config_free(c);
	cr_assert_eq(q4kh_config_load(sys, cli, &c, &err), 0, "%s", err.msg);
	cr_expect_str_eq(q4kh_config_get(c, "plugins", "path", NULL), "/from/cli");
	q4kh_config_free(c);
	cr_assert_eq(setenv("Q4KHOST_CONFIG", "/no/such.ini", 1), 0);
	cr_expect_eq(q4kh_config_load(sys, NULL, &c, &err), -1, "it must exist, like --config");
	cr_expect_str_eq(err.msg, "/no/such.ini: No such file or directory (from Q4KHOST_CONFIG)");
	unsetenv("Q4KHOST_CONFIG");
	free(env);
	free(cli);
	free(sys);
}

/* Loading a --config file of TEXT fails with "FILE" + AFTER_FILE. */
static void expect_config_error(const char *text, const char *after_file)
{
	const char *top = fresh_dir();
	char *sys = subdir(top, "etc");
	char *file = path_of(top, "bad.ini");
	char expected[8192];
	struct q4kh_config *c = (struct q4kh_config *)1;
	struct q4kh_error err = { "" };

	write_text(file, text);
	cr_assert_eq(setenv("XDG_CONFIG_HOME", sys, 1), 0);
	cr_assert_eq(q4kh_config_load(sys, file, &c, &err), -1);
	cr_assert_null(c);
	snprintf(expected, sizeof(expected), "%s%s (from --config)", file, after_file);
	cr_assert_str_eq(err.msg, expected);
	free(file);
	free(sys);
}

Test(loader, malformed_config_names_file_and_line)
{
	expect_config_error("[ok]\nkey = v\n; fine\n\nthis is not ini\n",
	                    ":5: expected [section], key = value, a comment or a "
	                    "blank line; found \"this is not ini\"");
	expect_config_error("[ok\nkey = v\n",
	                    ":1: expected [section], key = value, a comment or a "
	                    "blank line; found \"[ok\"");
}

/* "[s]" and then "k = vvv...", LEN bytes before its newline. */
static char *long_line_ini(size_t len)
{
	char *text = malloc(len + 6);

	cr_assert_not_null(text);
	memcpy(text, "[s]\nk = ", 8);
	memset(text + 8, 'v', len - 4);
	memcpy(text + 4 + len, "\n", 2);
	return text;
}

/* iniparser 4.1 reads 1022 bytes and a newline into its 1024-byte buffer. */
Test(loader, overlong_config_line_names_file_and_line)
{
	const char *top = fresh_dir();
	char *longest = long_line_ini(1022), *over = long_line_ini(1023);
	struct q4kh_config *c = config_from(top, longest);

	cr_assert_eq(strlen(q4kh_config_get(c, "s", "k", NULL)), 1018);
	q4kh_config_free(c);
	expect_config_error(over, ":2: line of 1023 bytes is longer than the 1022 "
	                          "that iniparser reads");
	free(over);
	free(longest);
}

Test(loader, missing_cli_config_is_an_error)
{
	const char *top = fresh_dir();
	char *file = path_of(top, "absent.ini");
	char expected[4400];
	struct q4kh_config *c;
	struct q4kh_error err = { "" };

	cr_assert_eq(setenv("XDG_CONFIG_HOME", top, 1), 0);
	cr_assert_eq(q4kh_config_load(top, file, &c, &err), -1);
	snprintf(expected, sizeof(expected), "%s: No such file or directory (from --config)", file);
	cr_assert_str_eq(err.msg, expected);
	free(file);
}

Test(loader, malformed_conf_d_file_is_an_error)
{
	const char *top = fresh_dir();
	char *sys = subdir(top, "etc"), *confd = subdir(sys, "conf.d");
	char *bad = path_of(confd, "50-bad.ini");
	char expected[4400];
	struct q4kh_config *c;
	struct q4kh_error err = { "" };

	write_text(bad, "[x]\n= no key\n");
	cr_assert_eq(setenv("XDG_CONFIG_HOME", top, 1), 0);
	cr_assert_eq(q4kh_config_load(sys, NULL, &c, &err), -1);
	snprintf(expected, sizeof(expected),
	         "%s:2: expected [section], key = value, a comment or a blank "
	         "line; found \"= no key\"", bad);
	cr_assert_str_eq(err.msg, expected);
	free(bad);
	free(confd);
	free(sys);
}

Test(loader, key_naming_a_section_yields_null)
{
	const char *top = fresh_dir();
	struct q4kh_config *c = config_from(top, "[plugins:path]\n[gpu:0]\nx = 1\n");
	struct q4kh_registry *r;

	cr_assert_null(q4kh_config_get(c, "plugins", "path", NULL));
	cr_assert_null(q4kh_config_get(c, "gpu", "0", NULL));
	cr_assert_str_eq(q4kh_config_get(c, "gpu:0", "x", NULL), "1");
	cr_assert_eq(unsetenv("Q4KHOST_PLUGIN_PATH"), 0);
	r = scan(NULL, c);
	cr_assert_str_eq(r->path_origin, "built-in");
	q4kh_registry_free(r);
	q4kh_config_free(c);
	cr_assert_null(q4kh_config_get(NULL, "plugins", "path", NULL));
}

Test(loader, cpu_plugin_exports_exactly_one_symbol)
{
	char *cpu = cpu_plugin_path();
	char first[256];
	int n = test_exported_symbols(cpu, first, sizeof(first));

	cr_assert_eq(n, 1, "cpu.so exports %d symbols", n);
	cr_assert_str_eq(first, "q4kh_plugin_entry_v1");
	free(cpu);
}
