/*
 * Test plugins whose descriptor lies, built once per lie (the Makefile
 * passes -DLIE_x and -DLIE_NAME):
 *   truncated:   the descriptor's struct_size (56) ends before the function
 *                tables, as a plugin built against a broken header would
 *                declare; ABI 1.0 needs 72 bytes;
 *   bad_major:   built for a future ABI 2: exports q4kh_plugin_entry_v2 only;
 *   short_table: a kernel variant whose table declares 16 bytes, fewer than
 *                ABI 1.0's kernel table;
 *   old_table:   a backend whose descriptor claims this minor but whose
 *                table declares ABI 1.0's size;
 *   bad_backend_kind: a backend whose ABI 1.3 backend_kind is no
 *                identifier;
 *   old_kernel_table: a kernel variant whose descriptor claims this minor
 *                but whose table declares ABI 1.3's size.
 * Behind each lie stand complete backend and kernel tables, each declaring
 * the finest arithmetic class, exact: a declaration must not save a plugin
 * the loader refuses. Every function
 * in them, and the v2 entry, leaves evidence: it appends a line to the file
 * named by Q4KH_TEST_EVIDENCE and aborts. The host must refuse each plugin
 * having called nothing but q4kh_plugin_entry_v1.
 */
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "q4khost/plugin.h"

static void evidence(void)
{
	static const char line[] = LIE_NAME ": a function was called\n";
	const char *file = getenv("Q4KH_TEST_EVIDENCE");
	int fd = file ? open(file, O_WRONLY | O_CREAT | O_APPEND, 0644) : -1;

	if (fd >= 0) {
		ssize_t n = write(fd, line, strlen(line));
		(void)n;
		close(fd);
	}
	abort();
}

/* Every slot points at evidence(): none may ever be called. */
#define BFN(f) .f = (__typeof__(((struct q4kh_backend_v1 *)0)->f))evidence
#define KFN(f) .f = (__typeof__(((struct q4kh_kernel_v1 *)0)->f))evidence

static const struct q4kh_backend_v1 backend = {
#if defined(LIE_OLD_TABLE)
	.struct_size = offsetof(struct q4kh_backend_v1, native_device) + sizeof(void *),
#else
	.struct_size = sizeof(backend),
#endif
	BFN(init), BFN(shutdown), BFN(last_error), BFN(device_count),
	BFN(device_info), BFN(device_open), BFN(device_close), BFN(supports_type),
	BFN(buffer_alloc), BFN(buffer_free), BFN(buffer_upload),
	BFN(buffer_download), BFN(get_rows), BFN(mul_mat), BFN(rms_norm),
	BFN(rope), BFN(add), BFN(mul), BFN(scale), BFN(glu), BFN(copy),
	BFN(attention), BFN(synchronize), BFN(native_device),
	.arith = Q4KH_ARITH_EXACT,
};

static const uint32_t types[] = { Q4KH_TYPE_Q4_K };

static const struct q4kh_kernel_v1 kernel = {
#if defined(LIE_SHORT_TABLE)
	.struct_size = 16,
#elif defined(LIE_OLD_KERNEL_TABLE)
	.struct_size = offsetof(struct q4kh_kernel_v1, gemv_multi),
#else
	.struct_size = sizeof(kernel),
#endif
	.n_types = 1,
	.backend = "cpu",
	.types = types,
	.max_gemv_columns = 8,
	KFN(init), KFN(shutdown), KFN(last_error), KFN(score), KFN(prepare),
	KFN(gemv), KFN(gemm), KFN(release),
	.arith = Q4KH_ARITH_EXACT,
};

static const struct q4kh_plugin_desc desc = {
#if defined(LIE_TRUNCATED)
	.struct_size = offsetof(struct q4kh_plugin_desc, backend),
#else
	.struct_size = sizeof(desc),
#endif
	.abi_minor = Q4KH_ABI_MINOR,
#if defined(LIE_SHORT_TABLE) || defined(LIE_OLD_KERNEL_TABLE)
	.kind = Q4KH_KIND_KERNEL,
#else
	.kind = Q4KH_KIND_BACKEND,
#endif
	.name = LIE_NAME,
	.version = "1.0",
	.vendor = "q4khost tests",
	.license = "MIT",
	.build_id = "test",
	.backend = &backend,
	.kernel = &kernel,
#if defined(LIE_BAD_BACKEND_KIND)
	.backend_kind = "CPU (fast)",
#endif
};

#if defined(LIE_BAD_MAJOR)
const struct q4kh_plugin_desc *q4kh_plugin_entry_v2(void);

const struct q4kh_plugin_desc *q4kh_plugin_entry_v2(void)
{
	evidence();
	return &desc;
}
#else
const struct q4kh_plugin_desc *q4kh_plugin_entry_v1(void);

const struct q4kh_plugin_desc *q4kh_plugin_entry_v1(void)
{
	return &desc;
}
#endif
