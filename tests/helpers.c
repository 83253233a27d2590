#include "helpers.h"
#include "backend.h"
#include "gguf.h"
#include "model.h"
#include "registry.h"
#include "session.h"

#include <criterion/criterion.h>
#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <float.h>
#include <ftw.h>
#include <math.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <termios.h>
#include <time.h>
#include <unistd.h>

static const char *env_or(const char *name, const char *fallback)
{
	const char *v = getenv(name);
	return v && *v ? v : fallback;
}

const char *test_srcdir(void) { return env_or("Q4KH_TEST_SRCDIR", "."); }
const char *test_builddir(void) { return env_or("Q4KH_TEST_BUILDDIR", "."); }

const char *test_model_path(void)
{
	static char path[4096];

	test_skip_under_sanitizers("a test on the default model (the ordinary build runs "
	                           "each; here the tiny fixtures run the same host code, "
	                           "and scripts/valgrind-run.sh runs the default model "
	                           "under memcheck)");
	q4kh_default_model_path(path, sizeof(path));
	if (access(path, R_OK) != 0) {
		const char *req = getenv("Q4KH_REQUIRE_MODEL");
		if (req && strcmp(req, "1") == 0)
			cr_assert_fail("default model missing at %s (run scripts/fetch-model.sh)",
			         path);
		cr_skip_test("default model missing at %s (run scripts/fetch-model.sh)",
		             path);
	}
	return path;
}

static char *tmpdirs[64];
static size_t n_tmpdirs;

static int remove_entry(const char *path, const struct stat *st, int flag,
                        struct FTW *ftw)
{
	(void)st;
	(void)flag;
	(void)ftw;
	remove(path);
	return 0;
}

/* Each test runs in its own process; its folders go when it exits. */
static void remove_tmpdirs(void)
{
	for (size_t i = 0; i < n_tmpdirs; i++) {
		nftw(tmpdirs[i], remove_entry, 16, FTW_DEPTH | FTW_PHYS);
		free(tmpdirs[i]);
	}
}

/* Does the system show an NVIDIA GPU: a device node, or a GPU entry of
 * the kernel driver? */
static int system_shows_nvidia_gpu(void)
{
	DIR *d = opendir("/proc/driver/nvidia/gpus");
	struct dirent *e;
	int found = access("/dev/nvidia0", F_OK) == 0;

	while (d && !found && (e = readdir(d)))
		found = e->d_name[0] != '.';
	if (d)
		closedir(d);
	return found;
}

void test_no_cuda_device(const char *what, const char *why)
{
	if (system_shows_nvidia_gpu())
		cr_assert_fail("%s: this machine shows an NVIDIA GPU (/dev/nvidia0 or "
		               "/proc/driver/nvidia/gpus) but the cuda plugin reports "
		               "no device: %s",
		               what, why);
	cr_skip_test("no CUDA device, so %s cannot run here: %s", what, why);
}

void test_need_cuda_device(const char *what)
{
	struct q4kh_registry *reg = NULL;
	struct q4kh_error err = { { 0 } };
	uint32_t n = 0;

	cr_assert_eq(q4kh_registry_scan(NULL, NULL, &reg, &err), 0, "%s", err.msg);
	cr_assert_not_null(q4kh_registry_find(reg, "cuda"),
	                   "the cuda plugin is not on the plugin path %s", reg->path);
	if (q4kh_backend_devices(q4kh_registry_find(reg, "cuda"), &n, &err) || n == 0) {
		q4kh_registry_free(reg);
		test_no_cuda_device(what, err.msg[0] ? err.msg : "the cuda backend has 0 devices");
	}
	q4kh_registry_free(reg);
}

void test_need_cpu_fast(void)
{
	char so[4200];

	snprintf(so, sizeof(so), "%s/plugins/cpu-fast/.libs/cpu-fast.so", test_builddir());
	if (access(so, R_OK) != 0)
		cr_skip_test("cpu-fast and cpu-simd were not built here (configure: HAVE_CPU_SIMD)");
	__builtin_cpu_init();
	if (!__builtin_cpu_supports("avx2") || !__builtin_cpu_supports("fma"))
		cr_skip_test("this CPU runs neither cpu-fast nor cpu-simd (they need AVX2 and FMA)");
}

char *test_fast_plugin_path(void)
{
	const char *b = test_builddir();
	char *path = NULL;

	test_need_cpu_fast();
	cr_assert_geq(asprintf(&path, "%s/plugins/cpu/.libs:%s/plugins/cpu-fast/.libs:"
	                              "%s/plugins/cpu-simd/.libs",
	                       b, b, b), 0);
	return path;
}

void test_skip_under_sanitizers(const char *why)
{
#ifdef __SANITIZE_ADDRESS__
	cr_skip_test("sanitizer build: %s; the ordinary build runs this test", why);
#else
	(void)why;
#endif
}

const char *test_tmpdir(void)
{
	char tmpl[4096];

	snprintf(tmpl, sizeof(tmpl), "%s/q4kh-test-XXXXXX", env_or("TMPDIR", "/tmp"));
	cr_assert_not_null(mkdtemp(tmpl), "mkdtemp %s", tmpl);
	cr_assert_lt(n_tmpdirs, sizeof(tmpdirs) / sizeof(tmpdirs[0]));
	if (n_tmpdirs == 0)
		atexit(remove_tmpdirs);
	tmpdirs[n_tmpdirs] = strdup(tmpl);
	cr_assert_not_null(tmpdirs[n_tmpdirs]);
	return tmpdirs[n_tmpdirs++];
}

void test_write_file(const char *path, const void *data, size_t len)
{
	FILE *f = fopen(path, "wb");
	cr_assert_not_null(f, "cannot create %s", path);
	cr_assert_eq(fwrite(data, 1, len, f), len, "short write to %s", path);
	cr_assert_eq(fclose(f), 0);
	chmod(path, 0644);
}

void *test_read_file(const char *path, size_t *len)
{
	FILE *f = fopen(path, "rb");
	char *buf;
	long n;

	if (!f)
		return NULL;
	fseek(f, 0, SEEK_END);
	n = ftell(f);
	fseek(f, 0, SEEK_SET);
	buf = malloc((size_t)n + 1);
	if (buf && fread(buf, 1, (size_t)n, f) != (size_t)n) {
		free(buf);
		buf = NULL;
	}
	fclose(f);
	if (buf) {
		buf[n] = 0;
		*len = (size_t)n;
	}
	return buf;
}

void test_receipt_key(const char *receipts, unsigned char key[32])
{
	char path[4200];
	FILE *f;

	snprintf(path, sizeof(path), "%s/q4khost/receipt.key", receipts);
	f = fopen(path, "r");
	cr_assert_not_null(f, "no receipt key %s", path);
	for (int i = 0; i < 32; i++)
		cr_assert_eq(fscanf(f, "%2hhx", &key[i]), 1, "%s: not 64 hex digits", path);
	fclose(f);
}

void test_receipt_seal(const unsigned char key[32], const char *path)
{
	size_t len, body;
	char *text = test_read_file(path, &len);
	unsigned char md[32];
	unsigned int md_len = 0;
	FILE *f;

	cr_assert_not_null(text, "%s", path);
	body = len;
	while (body && (text[body - 1] == '\n' || text[body - 1] == ' '))
		body--;
	cr_assert(body && text[body - 1] == '}', "%s: not a JSON object", path);
	body--;
	while (body && (text[body - 1] == '\n' || text[body - 1] == ' '))
		body--;
	HMAC(EVP_sha256(), key, 32, (const unsigned char *)text, body, md, &md_len);
	f = fopen(path, "w");
	cr_assert_not_null(f, "%s", path);
	fprintf(f, "%.*s,\n \"mac\": \"hmac-sha256:", (int)body, text);
	for (unsigned i = 0; i < md_len; i++)
		fprintf(f, "%02x", md[i]);
	fprintf(f, "\"\n}\n");
	cr_assert_eq(fclose(f), 0, "%s", path);
	free(text);
}

double test_cosine(const float *a, const float *b, int64_t n)
{
	double ab = 0, aa = 0, bb = 0;

	for (int64_t i = 0; i < n; i++) {
		ab += (double)a[i] * b[i];
		aa += (double)a[i] * a[i];
		bb += (double)b[i] * b[i];
	}
	return ab / sqrt(aa * bb);
}

void test_q8_0_logits(const struct q4kh_gguf_tensor *w, const float *h,
                      int64_t rows, float *out)
{
	const int64_t k = w->ne[0], nb = k / 32, v = w->ne[1];
	const uint8_t *base = w->data;
	double *row = malloc(sizeof(double) * k);

	cr_assert_eq(w->type, Q4KH_TYPE_Q8_0, "the LM head is %s, expected Q8_0",
	             q4kh_type_name(w->type));
	for (int64_t r = 0; r < v; r++) {
		const uint8_t *blk = base + r * nb * 34;
		for (int64_t b = 0; b < nb; b++, blk += 34) {
			uint16_t d16;
			memcpy(&d16, blk, 2);
			double d = q4kh_fp16_to_f32(d16);
			for (int j = 0; j < 32; j++)
				row[b * 32 + j] = d * (int8_t)blk[2 + j];
		}
		for (int64_t t = 0; t < rows; t++) {
			const float *ht = h + t * k;
			double acc[4] = { 0 };
			for (int64_t j = 0; j < k; j += 4)
				for (int l = 0; l < 4; l++)
					acc[l] += row[j + l] * ht[j + l];
			out[t * v + r] = (float)((acc[0] + acc[1]) + (acc[2] + acc[3]));
		}
	}
	free(row);
}

char *test_unhex(const char *hex, size_t *n)
{
	size_t len = strlen(hex);
	char *out = malloc(len / 2 + 1);

	cr_assert_not_null(out);
	for (size_t i = 0; i + 1 < len; i += 2) {
		unsigned v;
		cr_assert_eq(sscanf(hex + i, "%2x", &v), 1, "bad hex %s", hex);
		out[i / 2] = (char)v;
	}
	*n = len / 2;
	return out;
}

char *test_patch_gguf(const char *src, const char *key, const char *from,
                      const char *to)
{
	const char *dir = test_tmpdir();
	char *path, *p;
	size_t len, klen = strlen(key);
	char *data = test_read_file(src, &len);

	cr_assert_not_null(data, "cannot read %s", src);
	p = memmem(data, len, key, klen);
	cr_assert_not_null(p, "%s: no key %s", src, key);
	if (from) {
		/* the key, its type (4 bytes), the string's length (8), the string */
		char *v = p + klen + 12;
		cr_assert_eq(strlen(from), strlen(to));
		cr_assert(v + strlen(from) <= data + len && !memcmp(v, from, strlen(from)),
		          "%s: %s is not \"%s\"", src, key, from);
		memcpy(v, to, strlen(to));
	} else {
		cr_assert_eq(strlen(to), klen);
		memcpy(p, to, klen);
	}
	cr_assert_geq(asprintf(&path, "%s/patched.gguf", dir), 0);
	test_write_file(path, data, len);
	free(data);
	return path;
}

/* Where the last string of the string array KV ends in G's file. */
static uint64_t strings_end(const struct q4kh_gguf *g, const struct q4kh_gguf_kv *kv)
{
	struct q4kh_gguf_str *s = malloc(kv->count * sizeof(*s));
	struct q4kh_error err;
	uint64_t end;

	cr_assert_not_null(s);
	cr_assert_eq(q4kh_gguf_array_strings(g, kv, s, &err), 0, "%s", err.msg);
	end = (uint64_t)((const uint8_t *)s[kv->count - 1].data - g->map) + s[kv->count - 1].len;
	free(s);
	return end;
}

/* Where the stored bytes of pair KV end in G's file. */
static uint64_t kv_end(const struct q4kh_gguf *g, const struct q4kh_gguf_kv *kv)
{
	static const uint8_t size[] = { 1, 1, 2, 2, 4, 4, 4, 1, 0, 0, 8, 8, 8 };
	uint64_t len;

	if (kv->type == Q4KH_GGUF_STRING) {
		memcpy(&len, g->map + kv->offset, 8);
		return kv->offset + 8 + len;
	}
	if (kv->type != Q4KH_GGUF_ARRAY)
		return kv->offset + size[kv->type];
	if (kv->elem_type == Q4KH_GGUF_STRING)
		return kv->count ? strings_end(g, kv) : kv->offset;
	return kv->offset + kv->count * size[kv->elem_type];
}

static void put_bytes(FILE *f, const void *p, size_t n)
{
	cr_assert_eq(fwrite(p, 1, n, f), n);
}

char *test_vocab_gguf(const char *src, const char *key, const char *value)
{
	struct q4kh_error err = { { 0 } };
	struct q4kh_gguf *g = NULL;
	uint64_t zero = 0, len = strlen(value), n_kv;
	uint32_t version = 3, type = Q4KH_GGUF_STRING;
	char *path;
	FILE *f;

	cr_assert_eq(q4kh_gguf_open(src, &g, &err), 0, "%s", err.msg);
	cr_assert_eq(g->n_tensors, 0, "%s has tensors", src);
	cr_assert_not_null(q4kh_gguf_find(g, key), "%s: no %s", src, key);
	cr_assert_geq(asprintf(&path, "%s/vocab.gguf", test_tmpdir()), 0);
	f = fopen(path, "wb");
	cr_assert_not_null(f, "%s", path);
	n_kv = g->n_kv;
	put_bytes(f, "GGUF", 4);
	put_bytes(f, &version, 4);
	put_bytes(f, &zero, 8);
	put_bytes(f, &n_kv, 8);
	for (uint64_t i = 0; i < g->n_kv; i++) {
		const struct q4kh_gguf_kv *kv = &g->kv[i];
		const uint8_t *start = (const uint8_t *)kv->key.data - 8;
		if (kv->key.len == strlen(key) && !memcmp(kv->key.data, key, kv->key.len)) {
			put_bytes(f, start, 8 + kv->key.len);
			put_bytes(f, &type, 4);
			put_bytes(f, &len, 8);
			put_bytes(f, value, len);
			continue;
		}
		put_bytes(f, start, (size_t)(g->map + kv_end(g, kv) - start));
	}
	while (ftell(f) % 32)
		put_bytes(f, "", 1);
	cr_assert_eq(fclose(f), 0);
	q4kh_gguf_close(g);
	return path;
}

const char *test_plugin_dir(const char *const *names)
{
	const char *dir = test_tmpdir();
	char cmd[8192];

	snprintf(cmd, sizeof(cmd), "cp %s/plugins/cpu/.libs/cpu.so %s/", test_builddir(), dir);
	cr_assert_eq(system(cmd), 0, "%s", cmd);
	for (; *names; names++) {
		snprintf(cmd, sizeof(cmd), "cp %s/tests/plugins/.libs/%s.so %s/", test_builddir(),
		         *names, dir);
		cr_assert_eq(system(cmd), 0, "%s", cmd);
	}
	return dir;
}

const struct q4kh_plugin_desc *test_plugin_load(const char *rel, void **dl)
{
	const struct q4kh_plugin_desc *desc;
	q4kh_plugin_entry_fn entry;
	char path[4096];

	snprintf(path, sizeof(path), "%s/%s", test_builddir(), rel);
	*dl = dlopen(path, RTLD_NOW | RTLD_LOCAL);
	cr_assert_not_null(*dl, "dlopen %s: %s", path, dlerror());
	entry = (q4kh_plugin_entry_fn)dlsym(*dl, Q4KH_ENTRY_SYMBOL);
	cr_assert_not_null(entry, "%s has no %s", path, Q4KH_ENTRY_SYMBOL);
	desc = entry();
	cr_assert_not_null(desc, "%s: its entry returned no descriptor", path);
	return desc;
}

struct q4kh_host_api test_host_api(void *host_data,
                                   const char *(*config_get)(void *host_data, const char *key))
{
	return (struct q4kh_host_api){
		.struct_size = sizeof(struct q4kh_host_api),
		.abi_major = Q4KH_ABI_MAJOR,
		.abi_minor = Q4KH_ABI_MINOR,
		.host_data = host_data,
		.config_get = config_get,
	};
}

char *test_shell_quote(const char *s)
{
	char *q = malloc(4 * strlen(s) + 3), *w = q;

	cr_assert_not_null(q);
	*w++ = '\'';
	for (; *s; s++)
		if (*s == '\'') {
			memcpy(w, "'\\''", 4); /* close, an escaped quote, open */
			w += 4;
		} else {
			*w++ = *s;
		}
	*w++ = '\'';
	*w = 0;
	return q;
}

int test_shell(const char *cmd, char **out)
{
	char *full = malloc(strlen(cmd) + 16), *buf = NULL;
	size_t len = 0, cap = 0, got;
	int status;
	FILE *p;

	cr_assert_not_null(full);
	sprintf(full, "(%s) 2>&1", cmd);
	p = popen(full, "r");
	free(full);
	cr_assert_not_null(p, "popen %s", cmd);
	do {
		if (len + 4096 + 1 > cap) {
			cap = (len + 4096 + 1) * 2;
			buf = realloc(buf, cap);
			cr_assert_not_null(buf);
		}
		got = fread(buf + len, 1, cap - len - 1, p);
		len += got;
	} while (got > 0);
	buf[len] = 0;
	status = pclose(p);
	*out = buf;
	return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

int test_exported_symbols(const char *so, char *first, size_t cap)
{
	char cmd[4200], line[512], name[256];
	int n = 0;
	FILE *f;

	snprintf(cmd, sizeof(cmd), "nm -D --defined-only '%s'", so);
	f = popen(cmd, "r");
	cr_assert_not_null(f, "%s", cmd);
	first[0] = 0;
	while (fgets(line, sizeof(line), f)) {
		char kind;

		if (sscanf(line, "%*s %c %255s", &kind, name) != 2)
			continue;
		if (n++ == 0)
			snprintf(first, cap, "%s", name);
	}
	cr_assert_eq(pclose(f), 0, "%s failed", cmd);
	return n;
}

const char *test_q4khost_command(const char *env, const char *receipts, const char *args,
                                 char *buf, size_t cap)
{
	int n = snprintf(buf, cap,
	                 "env -u Q4KHOST_Q4K_KERNEL -u Q4KHOST_F2 -u Q4KHOST_F2_REQUIRE_DEEP "
	                 "-u Q4KHOST_BACKEND -u Q4KHOST_LOG "
	                 "XDG_CONFIG_HOME=%s Q4KHOST_F2_RECEIPT_DIR=%s %s %s/host/cli/q4khost %s",
	                 receipts, receipts, env, test_builddir(), args);

	cr_assert(n >= 0 && (size_t)n < cap, "the command is longer than %zu bytes", cap);
	return buf;
}

int test_q4khost(const char *env, const char *receipts, const char *args, char **out)
{
	char *cmd = malloc(strlen(env) + strlen(receipts) * 2 + strlen(args) + 8192);
	int rc;

	cr_assert_not_null(cmd);
	test_q4khost_command(env, receipts, args, cmd,
	                     strlen(env) + strlen(receipts) * 2 + strlen(args) + 8192);
	rc = test_shell(cmd, out);
	free(cmd);
	return rc;
}

/* `exec CMD` with stdout into OUT_PATH and stderr on ERR_FD, or into
 * ERR_PATH when ERR_FD is -1. */
static pid_t spawn(const char *cmd, const char *out_path, const char *err_path, int err_fd)
{
	char *full;
	pid_t pid;

	cr_assert_geq(asprintf(&full, "exec %s", cmd), 0);
	pid = fork();
	cr_assert_geq(pid, 0, "fork");
	if (pid == 0) {
		int out = open(out_path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
		int err = err_fd >= 0 ? err_fd : open(err_path, O_WRONLY | O_CREAT | O_TRUNC, 0644);

		if (out < 0 || err < 0 || dup2(out, 1) < 0 || dup2(err, 2) < 0)
			_exit(127);
		execl("/bin/sh", "sh", "-c", full, (char *)NULL);
		_exit(127);
	}
	free(full);
	return pid;
}

pid_t test_spawn(const char *cmd, const char *out_path, const char *err_path)
{
	return spawn(cmd, out_path, err_path, -1);
}

pid_t test_spawn_tty(const char *cmd, const char *out_path, struct test_tty *tty)
{
	struct termios raw;
	int slave;
	pid_t pid;

	tty->fd = posix_openpt(O_RDWR | O_NOCTTY | O_CLOEXEC);
	cr_assert_geq(tty->fd, 0, "posix_openpt: %s", strerror(errno));
	cr_assert(!grantpt(tty->fd) && !unlockpt(tty->fd), "grantpt: %s", strerror(errno));
	/* Open here, so the terminal has a writer from the start: a read of
	 * the master before the child opened it would see its end. */
	slave = open(ptsname(tty->fd), O_RDWR | O_NOCTTY);
	cr_assert_geq(slave, 0, "%s: %s", ptsname(tty->fd), strerror(errno));
	cr_assert_eq(tcgetattr(slave, &raw), 0);
	cfmakeraw(&raw);
	cr_assert_eq(tcsetattr(slave, TCSANOW, &raw), 0);
	/* Wide, so that no status line is cut to the terminal's width. */
	cr_assert_eq(ioctl(slave, TIOCSWINSZ, &(struct winsize){ .ws_row = 50, .ws_col = 1000 }), 0);
	tty->text = calloc(1, 1);
	tty->len = 0;
	cr_assert_not_null(tty->text);
	pid = spawn(cmd, out_path, NULL, slave);
	close(slave);
	return pid;
}

/* Append what TTY has now (waiting for some); 0 at its end. */
static int tty_read(struct test_tty *tty)
{
	char buf[4096];
	ssize_t n;

	while ((n = read(tty->fd, buf, sizeof(buf))) < 0 && errno == EINTR)
		;
	if (n <= 0) /* EIO: the program closed its side */
		return 0;
	tty->text = realloc(tty->text, tty->len + (size_t)n + 1);
	cr_assert_not_null(tty->text);
	memcpy(tty->text + tty->len, buf, (size_t)n);
	tty->len += (size_t)n;
	tty->text[tty->len] = 0;
	return 1;
}

long test_tty_wait_for(struct test_tty *tty, size_t from, const char *needle)
{
	for (;;) {
		const char *at = from <= tty->len ? strstr(tty->text + from, needle) : NULL;

		if (at)
			return (long)(at - tty->text + (long)strlen(needle));
		if (!tty_read(tty))
			return -1;
	}
}

char *test_tty_close(struct test_tty *tty)
{
	char *text;

	while (tty_read(tty))
		;
	close(tty->fd);
	text = tty->text;
	tty->text = NULL;
	tty->fd = -1;
	return text;
}

int test_reap(pid_t pid)
{
	int status;

	while (waitpid(pid, &status, 0) < 0)
		cr_assert_eq(errno, EINTR, "waitpid %ld", (long)pid);
	return status;
}

static void pause_a_little(void)
{
	nanosleep(&(struct timespec){ .tv_nsec = 20 * 1000 * 1000 }, NULL);
}

void test_wait_for(const char *path, const char *needle)
{
	for (;;) {
		size_t len = 0;
		char *text = test_read_file(path, &len);
		int found = text && (needle ? strstr(text, needle) != NULL : len > 0);

		free(text);
		if (found)
			return;
		pause_a_little();
	}
}

/* A /proc file (its size reads as 0) into BUF; its length, -1 when gone. */
static ssize_t read_proc(const char *path, char *buf, size_t cap)
{
	FILE *f = fopen(path, "r");
	size_t len;

	if (!f)
		return -1;
	len = fread(buf, 1, cap - 1, f);
	fclose(f);
	buf[len] = 0;
	return (ssize_t)len;
}

/* Field 3 (state) and 4 (parent) of /proc/PID/stat; 0 when it is gone. */
static int proc_stat(pid_t pid, char *state, pid_t *ppid)
{
	char path[64], buf[1024], *paren;
	long parent;

	snprintf(path, sizeof(path), "/proc/%ld/stat", (long)pid);
	if (read_proc(path, buf, sizeof(buf)) < 0)
		return 0;
	/* The command name may hold spaces: read after its closing ')'. */
	paren = strrchr(buf, ')');
	if (!paren || sscanf(paren + 1, " %c %ld", state, &parent) != 2)
		return 0;
	*ppid = (pid_t)parent;
	return 1;
}

pid_t test_child_of(pid_t parent, const char *needle)
{
	DIR *d = opendir("/proc");
	struct dirent *e;
	pid_t found = 0;

	cr_assert_not_null(d, "/proc");
	while (!found && (e = readdir(d))) {
		pid_t pid = (pid_t)strtol(e->d_name, NULL, 10), ppid;
		char path[64], state, cmdline[8192];
		ssize_t len;

		if (pid <= 0 || !proc_stat(pid, &state, &ppid) || ppid != parent)
			continue;
		snprintf(path, sizeof(path), "/proc/%ld/cmdline", (long)pid);
		len = read_proc(path, cmdline, sizeof(cmdline));
		/* Arguments are separated by NULs: make them one line. */
		for (ssize_t i = 0; i < len; i++)
			if (!cmdline[i])
				cmdline[i] = ' ';
		if (len > 0 && strstr(cmdline, needle))
			found = pid;
	}
	closedir(d);
	return found;
}

int test_alive(pid_t pid)
{
	pid_t ppid;
	char state;

	return proc_stat(pid, &state, &ppid) && state != 'Z' && state != 'X';
}

static float top2_random(uint64_t *r) /* [-8, 8) */
{
	*r ^= *r << 13;
	*r ^= *r >> 7;
	*r ^= *r << 17;
	return (float)((double)(*r >> 11) / (double)(1ull << 53) * 16.0 - 8.0);
}

const char *test_top2_column(int kind, float *x, int64_t n, uint64_t seed)
{
	uint64_t r = seed | 1;

	for (int64_t i = 0; i < n; i++)
		x[i] = top2_random(&r);
	switch (kind) {
	case 0:
		return "random";
	case 1: /* the maximum at two places, the runner-up at two more */
		x[n / 3] = x[n - 1] = 100.0f;
		x[n / 5] = x[n / 2] = 50.0f;
		return "tied maximum and runner-up";
	case 2:
		for (int64_t i = 0; i < n; i++)
			x[i] = NAN;
		return "all NaN";
	case 3: /* +-Inf and NaN everywhere but at a few finite values */
		for (int64_t i = 0; i < n; i++)
			x[i] = i % 3 == 0 ? INFINITY : i % 3 == 1 ? -INFINITY : NAN;
		x[n - 1] = 3.0f;
		x[n / 2] = 2.0f;
		x[0] = -FLT_MAX;
		return "infinities around finite values";
	case 4:
		for (int64_t i = 0; i < n; i++)
			x[i] = i % 2 ? NAN : -INFINITY;
		x[n - 1 - n / 3] = -1.0f;
		return "a single finite value";
	case 5: /* zeros of both signs: the lowest index's bits win */
		for (int64_t i = 0; i < n; i++)
			x[i] = i % 3 == 1 ? 0.0f : i % 3 == 2 ? NAN : -0.0f;
		return "-0 and +0";
	case 6:
		for (int64_t i = 0; i < n; i++)
			x[i] = 1.5f;
		return "all equal";
	case 7: /* a few levels: ties everywhere */
		for (int64_t i = 0; i < n; i++)
			x[i] = floorf(x[i] / 4.0f);
		return "a few levels";
	case 8: /* rising: the maximum in the last slice */
		for (int64_t i = 0; i < n; i++)
			x[i] = (float)i * 0x1p-10f;
		return "rising";
	case 9: /* the extremes of float */
		x[n / 4] = FLT_MAX;
		x[n - 1] = FLT_MAX;
		x[0] = INFINITY;
		x[n / 2] = -FLT_MAX;
		return "FLT_MAX ties beside +Inf";
	default: /* the maximum first, the runner-up last, subnormals between */
		for (int64_t i = 0; i < n; i++)
			x[i] = x[i] * 0x1p-140f;
		x[0] = 0x1p-126f;
		x[n - 1] = 0x1p-127f;
		return "subnormals";
	}
}

void test_expect_top2(const float *x, int64_t n, int32_t idx, const float val[2],
                      const char *what)
{
	float want[2];
	int32_t best = q4kh_top2(x, n, want);

	cr_expect_eq(idx, best, "%s: index %d, the host's %d", what, idx, best);
	cr_expect(!memcmp(&val[0], &want[0], sizeof(float)),
	          "%s: value %a, the host's %a", what, (double)val[0], (double)want[0]);
	cr_expect(!memcmp(&val[1], &want[1], sizeof(float)),
	          "%s: runner-up %a, the host's %a", what, (double)val[1],
	          (double)want[1]);
}
