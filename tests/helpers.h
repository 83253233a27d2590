/* Shared helpers for the Criterion suites. */
#ifndef Q4KH_TEST_HELPERS_H
#define Q4KH_TEST_HELPERS_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "q4khost/plugin.h"

/* Source and build roots (set by make check; "." when run by hand). */
const char *test_srcdir(void);
const char *test_builddir(void);

/*
 * Path of the default model (Q4KHOST_MODEL, else the cache folder that
 * scripts/fetch-model.sh fills). When it is missing, the calling test is
 * skipped, or fails when Q4KH_REQUIRE_MODEL=1 (scripts/test.sh sets it so CI
 * can never pass by skipping). Skipped in the sanitizer build, whose stage
 * would otherwise take most of CI's time on tests the ordinary build runs
 * (test_skip_under_sanitizers).
 */
const char *test_model_path(void);

/*
 * The cuda plugin reported no device, WHY its error: skip the calling test
 * on a machine where the system shows no NVIDIA GPU (no /dev/nvidia0 and
 * nothing under /proc/driver/nvidia/gpus: CI, hosts without a GPU or
 * driver); fail it where the system shows one that the plugin cannot use
 * (a driver too old for the runtime, a broken install), so a GPU machine
 * can never pass its GPU suites by skipping them. WHAT names the tests.
 */
void test_no_cuda_device(const char *what, const char *why);

/*
 * The tests WHAT need a CUDA device: fail where the cuda plugin is not
 * on the test's plugin path (a build with the CUDA plugins has it), skip
 * or fail as test_no_cuda_device says where it reports no device.
 */
void test_need_cuda_device(const char *what);

/*
 * Skip the calling test in the sanitizer build (scripts/test-sanitizers.sh)
 * only, WHY saying why: for the few tests whose minutes of arithmetic
 * under AddressSanitizer add no code path that the other suites do not
 * already check for memory errors. The ordinary build runs them.
 */
void test_skip_under_sanitizers(const char *why);

/*
 * Skip the calling test unless cpu-fast and cpu-simd were built here
 * (configure builds both where it finds x86-64 SIMD: HAVE_CPU_SIMD) and
 * this CPU runs them (AVX2 and FMA). A gate on the build and the CPU,
 * never on what the plugins do, which the test then asserts.
 */
void test_need_cpu_fast(void);

/* The plugin path of the fast cpu path (the reference, cpu-fast,
 * cpu-simd), malloc()ed; a skip (test_need_cpu_fast) where this build or
 * CPU has no cpu-fast. */
char *test_fast_plugin_path(void);

/* A fresh private folder under $TMPDIR, removed with its contents when the
 * test process exits. The string belongs to the helpers (freed at exit). */
const char *test_tmpdir(void);

/* Write LEN bytes to PATH (created 0644); aborts the test on failure. */
void test_write_file(const char *path, const void *data, size_t len);

/* Read a whole file; *len gets its size. NULL when unreadable. */
void *test_read_file(const char *path, size_t *len);

/*
 * The receipt key of a test's q4khost (XDG_CONFIG_HOME is RECEIPTS,
 * test_q4khost_command): the 64 hex digits of RECEIPTS/q4khost/receipt.key
 * into KEY's 32 bytes.
 */
void test_receipt_key(const char *receipts, unsigned char key[32]);

/*
 * Seal the receipt file PATH, a JSON object without "mac" (as
 * json_dump_file writes it), as docs/f2.md (R.1) says, with OpenSSL's
 * HMAC: its text up to the last member, then ",\n \"mac\": \"hmac-sha256:",
 * the HMAC-SHA256 of that text under KEY in hex, "\"\n}\n". What a user
 * who holds the key could write.
 */
void test_receipt_seal(const unsigned char key[32], const char *path);

/* Cosine similarity of two vectors of N floats, accumulated in double. */
double test_cosine(const float *a, const float *b, int64_t n);

/*
 * Logits from hidden states, as an oracle rebuilds them: out[r * V + v] =
 * sum_k W[v][k] h[r * K + k] in double, for r < rows, W the Q8_0 matrix w
 * {K, V} (an LM head) dequantized here independently of the cpu plugin
 * (x = fp16 d * q per 32-value block). Fails the test for another type.
 */
struct q4kh_gguf_tensor;
void test_q8_0_logits(const struct q4kh_gguf_tensor *w, const float *h,
                      int64_t rows, float *out);

/* The bytes of a hex string (malloc()ed); *n gets their count. */
char *test_unhex(const char *hex, size_t *n);

/*
 * A copy of GGUF file SRC in a test_tmpdir() folder with the string value
 * of metadata KEY (now FROM) replaced by TO of the same length, or, with
 * FROM NULL, the key's own name replaced by TO (same length). Returns the
 * copy's path (malloc()ed); fails the test when KEY or FROM is not there.
 */
char *test_patch_gguf(const char *src, const char *key, const char *from,
                      const char *to);

/*
 * A copy of the tensorless GGUF file SRC (a vocabulary) in a test_tmpdir()
 * folder with the metadata KEY set to the string VALUE, of any length.
 * Returns the copy's path (malloc()ed); fails the test when SRC has
 * tensors or no KEY.
 */
char *test_vocab_gguf(const char *src, const char *key, const char *value);

/*
 * A fresh plugin folder (test_tmpdir) holding the reference cpu plugin and
 * the test plugins NAMES (NULL-terminated; module names under
 * tests/plugins/.libs without ".so"). The string is test_tmpdir()'s.
 */
const char *test_plugin_dir(const char *const *names);

/*
 * The descriptor of the built plugin module REL (a path under the build
 * root: "plugins/cpu/.libs/cpu.so"), loaded as the host loads one: dlopen
 * (RTLD_NOW | RTLD_LOCAL) into *DL, then its entry symbol. Fails the test
 * when the module, its entry or its descriptor is missing.
 */
const struct q4kh_plugin_desc *test_plugin_load(const char *rel, void **dl);

/* A host API of this build's ABI for HOST_DATA, with settings read
 * through CONFIG_GET (NULL: none) and no log. */
struct q4kh_host_api test_host_api(void *host_data,
                                   const char *(*config_get)(void *host_data, const char *key));

/*
 * Run shell command CMD with its stderr merged into stdout; *out gets all
 * it printed (malloc()ed, NUL-terminated). Returns its exit status, or -1
 * when it did not exit normally.
 */
int test_shell(const char *cmd, char **out);

/* S as one word of the shell, in single quotes (malloc()ed). */
char *test_shell_quote(const char *s);

/*
 * The dynamic symbols shared object SO defines (binutils' nm -D
 * --defined-only): their number, the first one's name into FIRST (CAP
 * bytes). Fails the test when nm does.
 */
int test_exported_symbols(const char *so, char *first, size_t cap);

/*
 * The shell command that runs the built q4khost with ARGS as a user who
 * set nothing would: no Q4KHOST_Q4K_KERNEL, _F2, _F2_REQUIRE_DEEP, _BACKEND
 * or _LOG, no user config file (XDG_CONFIG_HOME=RECEIPTS), receipts in
 * RECEIPTS; ENV
 * (more VAR=VALUE words, or "") goes before it. Into BUF; returns BUF.
 */
const char *test_q4khost_command(const char *env, const char *receipts, const char *args,
                                 char *buf, size_t cap);

/* Run that command (test_shell): its exit status, all it printed in *out. */
int test_q4khost(const char *env, const char *receipts, const char *args, char **out);

/*
 * Start shell command CMD in the background as `exec CMD`, so that the
 * pid returned is the command's own, with its stdout into OUT_PATH and
 * its stderr into ERR_PATH (created). Fails the test when it cannot.
 */
pid_t test_spawn(const char *cmd, const char *out_path, const char *err_path);

/* Wait for PID, started by test_spawn, to end; its wait status. */
int test_reap(pid_t pid);

/* What a program wrote on its terminal (test_spawn_tty), read so far. */
struct test_tty {
	int fd;     /* the terminal's other end */
	char *text; /* NUL-terminated */
	size_t len;
};

/*
 * test_spawn with stderr on a terminal (a pseudo-terminal in raw mode, so
 * its text is the program's bytes, 1000 columns wide, so its status lines
 * are whole): what a program shows only on a
 * terminal, its status lines, can be waited for. *TTY gets the other end:
 * read it with test_tty_wait_for, and test_tty_close it before test_reap
 * (a program blocks while its terminal is full).
 */
pid_t test_spawn_tty(const char *cmd, const char *out_path, struct test_tty *tty);

/*
 * Read TTY until its text past offset FROM holds NEEDLE: the offset just
 * past NEEDLE, or -1 when the program closed its terminal first. The
 * test's .timeout bounds the wait.
 */
long test_tty_wait_for(struct test_tty *tty, size_t from, const char *needle);

/* Read TTY to its end (the program closed it) and close it: the whole
 * text, malloc()ed. */
char *test_tty_close(struct test_tty *tty);

/*
 * Wait until the file PATH holds NEEDLE (NULL: anything at all), polling;
 * the test's .timeout bounds the wait, nothing here is timed.
 */
void test_wait_for(const char *path, const char *needle);

/* The pid of a process whose parent is PARENT and whose command line
 * holds NEEDLE; 0 when there is none. */
pid_t test_child_of(pid_t parent, const char *needle);

/* 1 while PID runs (a zombie counts as gone). */
int test_alive(pid_t pid);

/*
 * Column KIND (0 .. TEST_TOP2_KINDS - 1) of a top2 test, N values into X
 * (random from SEED where random): random values, ties of the maximum and
 * of the runner-up far apart, every value NaN, +-Inf around the finite
 * ones, a single finite value, -0 and +0 mixed, and more. Returns the
 * kind's name for messages.
 */
#define TEST_TOP2_KINDS 11
const char *test_top2_column(int kind, float *x, int64_t n, uint64_t seed);

/*
 * A backend's top2 of column X[0..n) (IDX, VAL[2]) against the host's
 * q4kh_top2: the same index and the same bits in both values. WHAT names
 * the case in the message.
 */
void test_expect_top2(const float *x, int64_t n, int32_t idx, const float val[2],
                      const char *what);

#endif
