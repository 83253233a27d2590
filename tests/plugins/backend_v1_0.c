/*
 * Test plugin: a backend built against ABI 1.0, whose table ends at
 * native_device (the entries that 1.1 appended are beyond its
 * struct_size). The host must accept it and never read past its size; it
 * calls nothing in it, so every entry points at one function that aborts.
 *
 * Built again with -DNO_DEVICE as no_device.so: a backend that starts but
 * has no device, as the cuda plugin on a machine without a GPU, and says
 * why when asked for device 0; the host must name it as loaded but
 * without a device, with that reason. Its op entries are never called.
 *
 * Built again with -DENUM_NAME='"NAME"' and one of -DENUM_ABORT (init
 * aborts), -DENUM_HANG (device_count never returns), -DENUM_DESCRIBE
 * (device_info, asked why there is no device 0, dies of SIGSEGV): a
 * backend that takes down whoever enumerates it, which a host must try in
 * a helper process, refuse, and serve without. Each init of these appends
 * "NAME init" as a line to the file $Q4KH_TEST_ENUM_LOG names (when set),
 * so a test can count who called it: a command that reads its cached
 * verdict adds none.
 */
#include <fcntl.h>
#include <signal.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "q4khost/plugin.h"

const struct q4kh_plugin_desc *q4kh_plugin_entry_v1(void);

static void never_called(void)
{
	abort();
}

#define FN(f) .f = (__typeof__(((struct q4kh_backend_v1 *)0)->f))never_called

#if defined(NO_DEVICE) || defined(ENUM_NAME)
struct q4kh_backend_ctx {
	int unused;
};

static struct q4kh_backend_ctx the_ctx;

/* One line per init into $Q4KH_TEST_ENUM_LOG: O_APPEND keeps lines whole. */
static void log_init(void)
{
#ifdef ENUM_NAME
	static const char line[] = ENUM_NAME " init\n";
	const char *path = getenv("Q4KH_TEST_ENUM_LOG");
	int fd = path ? open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600) : -1;

	if (fd < 0)
		return;
	if (write(fd, line, strlen(line)) != (ssize_t)strlen(line))
		abort(); /* a count that silently misses would mislead the test */
	close(fd);
#endif
}

static q4kh_status nd_init(const struct q4kh_host_api *host, q4kh_backend_ctx **out)
{
	(void)host;
	log_init();
#ifdef ENUM_ABORT
	abort();
#endif
	*out = &the_ctx;
	return Q4KH_OK;
}

static void nd_shutdown(q4kh_backend_ctx *ctx)
{
	(void)ctx;
}

static const char *nd_last_error(q4kh_backend_ctx *ctx)
{
	return ctx ? "device_info: no device 0 (no-device has 0: this test backend never has one)"
	           : "";
}

static q4kh_status nd_device_count(q4kh_backend_ctx *ctx, uint32_t *count)
{
	(void)ctx;
#ifdef ENUM_HANG
	for (;;)
		pause();
#endif
	*count = 0;
	return Q4KH_OK;
}

static q4kh_status nd_device_info(q4kh_backend_ctx *ctx, uint32_t index,
                                  struct q4kh_device_record *out)
{
	(void)ctx, (void)index, (void)out;
#ifdef ENUM_DESCRIBE
	/* the default action, which a sanitizer's handler would replace with
	 * its report and exit status 1: the host must see a real crash */
	signal(SIGSEGV, SIG_DFL);
	raise(SIGSEGV);
#endif
	return Q4KH_ERR_INVALID;
}

#ifdef ENUM_NAME
#define NAME ENUM_NAME
#else
#define NAME "no-device"
#endif
#define FIRST_ENTRIES .init = nd_init, .shutdown = nd_shutdown, .last_error = nd_last_error, \
	.device_count = nd_device_count, .device_info = nd_device_info
#else
#define NAME "backend-v1-0"
#define FIRST_ENTRIES FN(init), FN(shutdown), FN(last_error), FN(device_count), FN(device_info)
#endif

/* The 1.1 entries hold never_called too, and arith (1.6) a class: a host
 * that read them would find them set, so only the struct_size check keeps
 * them unread. */
static const struct q4kh_backend_v1 table = {
	.struct_size = offsetof(struct q4kh_backend_v1, native_device) +
	               sizeof(table.native_device),
	FIRST_ENTRIES, FN(device_open), FN(device_close), FN(supports_type),
	FN(buffer_alloc), FN(buffer_free), FN(buffer_upload),
	FN(buffer_download), FN(get_rows), FN(mul_mat), FN(rms_norm),
	FN(rope), FN(add), FN(mul), FN(scale), FN(glu), FN(copy),
	FN(attention), FN(synchronize), FN(native_device), FN(read_pass),
	FN(timer_start), FN(timer_stop), FN(graph_begin), FN(graph_end),
	FN(graph_launch), FN(graph_free), .arith = Q4KH_ARITH_EXACT,
};

static const struct q4kh_plugin_desc desc = {
	.struct_size = sizeof(desc),
	.abi_minor = 0,
	.kind = Q4KH_KIND_BACKEND,
	.name = NAME,
	.version = "1.0",
	.vendor = "q4khost tests",
	.license = "MIT",
	.build_id = "test",
	.backend = &table,
};

const struct q4kh_plugin_desc *q4kh_plugin_entry_v1(void)
{
	return &desc;
}
