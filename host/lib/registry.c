/*
 * Plugin discovery: choose the plugin path, list its .so files, load each
 * one and check its descriptor before anything else in it runs.
 */
#include "registry.h"
#include "log.h"
#include "progress.h"
#include "secure.h"

#include <dirent.h>
#include <dlfcn.h>
#include <elf.h>
#include <ctype.h>
#include <errno.h>
#include <link.h>
#include <pthread.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

/* The smallest legal descriptor: every field of ABI 1.0, up to `kernel`. */
#define DESC_V1_0_SIZE \
	(offsetof(struct q4kh_plugin_desc, kernel) + sizeof(const void *))

/* 1 when descriptor D is long enough to hold FIELD. */
#define DESC_HAS(d, field)                                                   \
	((d)->struct_size >= offsetof(struct q4kh_plugin_desc, field) +       \
	                             sizeof((d)->field))

/* The smallest legal backend table: ABI 1.0's, up to native_device. */
#define BACKEND_V1_0_SIZE \
	(offsetof(struct q4kh_backend_v1, native_device) + sizeof(void (*)(void)))

/*
 * The backend table of each minor the host knows, in bytes: a plugin that
 * claims minor m has at least table_size[m] (docs/plugin-abi.md, V2).
 */
static const size_t backend_table_size[Q4KH_ABI_MINOR + 1] = {
	BACKEND_V1_0_SIZE,
	offsetof(struct q4kh_backend_v1, get_rows_ext),
	offsetof(struct q4kh_backend_v1, delta_net) + sizeof(void (*)(void)),
	/* 1.3 appended to the descriptor and the native handles only */
	offsetof(struct q4kh_backend_v1, delta_net) + sizeof(void (*)(void)),
	offsetof(struct q4kh_backend_v1, rope_store) + sizeof(void (*)(void)),
	offsetof(struct q4kh_backend_v1, norm_add_rms_norm) + sizeof(void (*)(void)),
	offsetof(struct q4kh_backend_v1, reserved_1_6) + sizeof(uint32_t),
	offsetof(struct q4kh_backend_v1, mul_mat_id) + sizeof(void (*)(void)),
	offsetof(struct q4kh_backend_v1, attention_paged) + sizeof(void (*)(void)),
	/* 1.9 appended to the native handles only */
	offsetof(struct q4kh_backend_v1, attention_paged) + sizeof(void (*)(void)),
};

/* The smallest legal kernel table: ABI 1.0's, up to release. */
#define KERNEL_V1_0_SIZE \
	(offsetof(struct q4kh_kernel_v1, release) + sizeof(void (*)(void)))

/* The kernel table of each minor the host knows, as backend_table_size. */
static const size_t kernel_table_size[Q4KH_ABI_MINOR + 1] = {
	KERNEL_V1_0_SIZE,
	KERNEL_V1_0_SIZE,
	KERNEL_V1_0_SIZE,
	KERNEL_V1_0_SIZE,
	offsetof(struct q4kh_kernel_v1, gemv_glu) + sizeof(void (*)(void)),
	/* 1.5 appended to the backend table only */
	offsetof(struct q4kh_kernel_v1, gemv_glu) + sizeof(void (*)(void)),
	offsetof(struct q4kh_kernel_v1, reserved_1_6) + sizeof(uint32_t),
	/* 1.7 and 1.8 appended to the backend table only, 1.9 to the native
	 * handles */
	offsetof(struct q4kh_kernel_v1, reserved_1_6) + sizeof(uint32_t),
	offsetof(struct q4kh_kernel_v1, reserved_1_6) + sizeof(uint32_t),
	offsetof(struct q4kh_kernel_v1, reserved_1_6) + sizeof(uint32_t),
};

#define NAME_MAX_LEN 63

/* A required function pointer inside a plugin's table. */
struct fn_slot {
	const char *name;
	size_t offset;
};

#define BACKEND_FN(f) { #f, offsetof(struct q4kh_backend_v1, f) }
#define KERNEL_FN(f) { #f, offsetof(struct q4kh_kernel_v1, f) }

/* Every backend function but native_device, which is optional. */
static const struct fn_slot backend_fns[] = {
	BACKEND_FN(init), BACKEND_FN(shutdown), BACKEND_FN(last_error),
	BACKEND_FN(device_count), BACKEND_FN(device_info),
	BACKEND_FN(device_open), BACKEND_FN(device_close),
	BACKEND_FN(supports_type), BACKEND_FN(buffer_alloc),
	BACKEND_FN(buffer_free), BACKEND_FN(buffer_upload),
	BACKEND_FN(buffer_download), BACKEND_FN(get_rows), BACKEND_FN(mul_mat),
	BACKEND_FN(rms_norm), BACKEND_FN(rope), BACKEND_FN(add), BACKEND_FN(mul),
	BACKEND_FN(scale), BACKEND_FN(glu), BACKEND_FN(copy),
	BACKEND_FN(attention), BACKEND_FN(synchronize),
};

static const struct fn_slot kernel_fns[] = {
	KERNEL_FN(init), KERNEL_FN(shutdown), KERNEL_FN(last_error),
	KERNEL_FN(score), KERNEL_FN(prepare), KERNEL_FN(gemv), KERNEL_FN(gemm),
	KERNEL_FN(release),
};

#define N_OF(a) (sizeof(a) / sizeof((a)[0]))

/* Format a reason into WHY and return -1. */
__attribute__((format(printf, 3, 4)))
static int say(char *why, size_t size, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(why, size, fmt, ap);
	va_end(ap);
	return -1;
}

/*
 * The folders above DIR, as q4kh_secure_untrusted judges a plugin's own
 * folder: one that someone else could write lets them rename DIR and put
 * another in its place. A folder with the sticky bit (/tmp) is safe: there, only an
 * entry's owner may rename it. 0 when all may be trusted.
 */
static int untrusted_above(const char *dir, char *why, size_t size)
{
	char *real = realpath(dir, NULL), *slash, one[400];
	struct stat st;
	int rc = 0;

	if (!real)
		return 0; /* the folder's own checks report what is wrong */
	while (!rc && (slash = strrchr(real, '/')) != NULL) {
		*(slash == real ? slash + 1 : slash) = 0;
		if (stat(real, &st) != 0)
			break;
		if (!(st.st_mode & S_ISVTX) &&
		    q4kh_secure_untrusted(&st, "folder", real, one, sizeof(one)))
			rc = say(why, size, "%s, above %s", one, dir);
		if (slash == real)
			break;
	}
	free(real);
	return rc;
}

static int is_identifier(const char *s)
{
	size_t len;

	if (!s)
		return 0;
	len = strnlen(s, NAME_MAX_LEN + 1);
	if (len == 0 || len > NAME_MAX_LEN || s[0] == '-' || s[0] == '_')
		return 0;
	for (size_t i = 0; i < len; i++)
		if (!((s[i] >= 'a' && s[i] <= 'z') || (s[i] >= '0' && s[i] <= '9') ||
		      s[i] == '-' || s[i] == '_'))
			return 0;
	return 1;
}

/* A bounded, printable copy of a string a plugin handed us. */
static void printable(char *out, size_t size, const char *s)
{
	size_t i = 0;

	for (; s && s[i] && i + 1 < size; i++)
		out[i] = (s[i] >= 0x20 && s[i] < 0x7f) ? s[i] : '?';
	out[i] = 0;
}

static int check_fns(const void *table, const char *what,
                     const struct fn_slot *fns, size_t n, char *why,
                     size_t size)
{
	for (size_t i = 0; i < n; i++) {
		void (*fn)(void);

		memcpy(&fn, (const char *)table + fns[i].offset, sizeof(fn));
		if (!fn)
			return say(why, size, "%s table: required function %s is NULL",
			           what, fns[i].name);
	}
	return 0;
}

static int check_backend(const struct q4kh_backend_v1 *b, uint32_t minor, char *why,
                         size_t size)
{
	/* a minor newer than the host's is held to the newest the host knows */
	uint32_t m = minor < Q4KH_ABI_MINOR ? minor : Q4KH_ABI_MINOR;

	if (!b)
		return say(why, size, "kind is backend but the backend table is NULL");
	if (b->struct_size < backend_table_size[m])
		return say(why, size,
		           "backend table struct_size %u is smaller than the %zu bytes of ABI %d.%u, which its descriptor claims",
		           b->struct_size, backend_table_size[m], Q4KH_ABI_MAJOR, m);
	if ((Q4KH_BACKEND_HAS(b, graph_prepare) || Q4KH_BACKEND_HAS(b, graph_compute) ||
	     Q4KH_BACKEND_HAS(b, graph_release)) &&
	    !(Q4KH_BACKEND_HAS(b, graph_prepare) && Q4KH_BACKEND_HAS(b, graph_compute) &&
	      Q4KH_BACKEND_HAS(b, graph_release)))
		return say(why, size,
		           "backend table has some of graph_prepare, graph_compute and graph_release but not all three (ABI 1.6: all or none)");
	if (Q4KH_BACKEND_HAS(b, moe_route) != Q4KH_BACKEND_HAS(b, mul_mat_id))
		return say(why, size,
		           "backend table has one of moe_route and mul_mat_id but not the other (ABI 1.7: both or neither)");
	return check_fns(b, "backend", backend_fns, N_OF(backend_fns), why, size);
}

static int check_kernel(const struct q4kh_kernel_v1 *k, uint32_t minor, char *why,
                        size_t size)
{
	uint32_t m = minor < Q4KH_ABI_MINOR ? minor : Q4KH_ABI_MINOR;

	if (!k)
		return say(why, size, "kind is kernel but the kernel table is NULL");
	if (k->struct_size < KERNEL_V1_0_SIZE)
		return say(why, size,
		           "kernel table struct_size %u is smaller than the %zu bytes of ABI %d.0",
		           k->struct_size, (size_t)KERNEL_V1_0_SIZE, Q4KH_ABI_MAJOR);
	if (k->struct_size < kernel_table_size[m])
		return say(why, size,
		           "kernel table struct_size %u is smaller than the %zu bytes of ABI %d.%u, which its descriptor claims",
		           k->struct_size, kernel_table_size[m], Q4KH_ABI_MAJOR, m);
	if (!k->backend || !k->backend[0])
		return say(why, size, "kernel table names no target backend");
	if (k->n_types == 0 || !k->types)
		return say(why, size, "kernel table lists no tensor types");
	if (k->max_gemv_columns == 0)
		return say(why, size, "kernel table max_gemv_columns is 0, expected >= 1");
	return check_fns(k, "kernel", kernel_fns, N_OF(kernel_fns), why, size);
}

/* Everything the host checks before it calls anything else in a plugin. */
static int check_desc(const struct q4kh_plugin_desc *d, char *why, size_t size)
{
	char shown[NAME_MAX_LEN + 2];

	if (!d)
		return say(why, size, "%s returned NULL", Q4KH_ENTRY_SYMBOL);
	if (d->struct_size < DESC_V1_0_SIZE)
		return say(why, size,
		           "descriptor struct_size %u is smaller than the %zu bytes of ABI %d.0",
		           d->struct_size, (size_t)DESC_V1_0_SIZE, Q4KH_ABI_MAJOR);
	if (d->kind != Q4KH_KIND_BACKEND && d->kind != Q4KH_KIND_KERNEL)
		return say(why, size, "unknown plugin kind %u (expected 1 backend or 2 kernel)",
		           d->kind);
	if (!is_identifier(d->name)) {
		printable(shown, sizeof(shown), d->name);
		return say(why, size,
		           "plugin name \"%s\" is not an identifier (1 to %d of a-z 0-9 - _, not starting with - or _)",
		           shown, NAME_MAX_LEN);
	}
	if (d->kind == Q4KH_KIND_KERNEL)
		return check_kernel(d->kernel, d->abi_minor, why, size);
	if (DESC_HAS(d, backend_kind) && d->backend_kind &&
	    !is_identifier(d->backend_kind)) {
		printable(shown, sizeof(shown), d->backend_kind);
		return say(why, size,
		           "backend kind \"%s\" is not an identifier (1 to %d of a-z 0-9 - _, not starting with - or _)",
		           shown, NAME_MAX_LEN);
	}
	return check_backend(d->backend, d->abi_minor, why, size);
}

const char *q4kh_backend_kind(const struct q4kh_plugin *p)
{
	const struct q4kh_plugin_desc *d = p->desc;

	return DESC_HAS(d, backend_kind) && d->backend_kind ? d->backend_kind
	                                                   : p->name;
}

uint32_t q4kh_plugin_arith(const struct q4kh_plugin *p)
{
	const struct q4kh_plugin_desc *d = p->desc;
	/* a table too short for the field (before ABI 1.6) declares nothing */
	const size_t b_end = offsetof(struct q4kh_backend_v1, arith) + sizeof(uint32_t);
	const size_t k_end = offsetof(struct q4kh_kernel_v1, arith) + sizeof(uint32_t);

	if (p->state != Q4KH_PLUGIN_ACCEPTED || !d)
		return Q4KH_ARITH_UNDECLARED;
	if (d->kind == Q4KH_KIND_BACKEND)
		return d->backend->struct_size >= b_end ? d->backend->arith : Q4KH_ARITH_UNDECLARED;
	return d->kernel->struct_size >= k_end ? d->kernel->arith : Q4KH_ARITH_UNDECLARED;
}

/* Word the rejection of a file that lacks our entry symbol. */
static void explain_missing_entry(void *dl, char *why, size_t size)
{
	char sym[32];

	/* Only to name the plugin's ABI; nothing found here is called. */
	for (int major = 0; major <= 9; major++) {
		if (major == Q4KH_ABI_MAJOR)
			continue;
		snprintf(sym, sizeof(sym), "q4kh_plugin_entry_v%d", major);
		if (dlsym(dl, sym)) {
			say(why, size, "built for plugin ABI %d; this host speaks ABI %d",
			    major, Q4KH_ABI_MAJOR);
			return;
		}
	}
	say(why, size, "no entry symbol %s", Q4KH_ENTRY_SYMBOL);
}

static void unload(struct q4kh_plugin *p)
{
	if (p->dl)
		dlclose(p->dl);
	if (p->fd >= 0)
		close(p->fd);
	p->dl = NULL;
	p->desc = NULL;
	p->fd = -1;
}

static const struct q4kh_plugin *find_accepted(const struct q4kh_registry *r,
                                               const char *name)
{
	for (size_t i = 0; i < r->n_plugins; i++) {
		const struct q4kh_plugin *p = &r->plugins[i];
		if (p->state == Q4KH_PLUGIN_ACCEPTED && !strcmp(p->name, name))
			return p;
	}
	return NULL;
}

/*
 * Whether FD, an ELF file of this machine's class, ends before what its
 * program headers say it holds (a copy or an install cut short): the
 * loader would map the missing pages and die of SIGBUS on touching them,
 * taking the whole command down, so such a file is refused first, WHY
 * saying so. Any other file is left to dlopen, which names its fault.
 */
static int cut_short(int fd, const char *path, char *why, size_t size)
{
	ElfW(Ehdr) eh;
	ElfW(Phdr) ph;
	struct stat st;
	uint64_t need;

	if (fstat(fd, &st) != 0 || pread(fd, &eh, sizeof(eh), 0) != (ssize_t)sizeof(eh) ||
	    memcmp(eh.e_ident, ELFMAG, SELFMAG) != 0 ||
	    eh.e_ident[EI_CLASS] != (sizeof(void *) == 8 ? ELFCLASS64 : ELFCLASS32) ||
	    eh.e_phentsize != sizeof(ph))
		return 0;
	/* Headers past the end stop the loop with NEED already too large. */
	need = (uint64_t)eh.e_phoff + (uint64_t)eh.e_phnum * sizeof(ph);
	for (unsigned i = 0; i < eh.e_phnum && pread(fd, &ph, sizeof(ph),
	                                             (off_t)(eh.e_phoff + i * sizeof(ph))) ==
	                                       (ssize_t)sizeof(ph); i++)
		if (ph.p_type == PT_LOAD && ph.p_offset + ph.p_filesz > need)
			need = ph.p_filesz > UINT64_MAX - ph.p_offset ? UINT64_MAX
			                                              : ph.p_offset + ph.p_filesz;
	if (need <= (uint64_t)st.st_size)
		return 0;
	say(why, size, "%s: cut short: %lld bytes, but its ELF headers need %llu (a copy or "
	    "an install that did not finish?); not loaded", path, (long long)st.st_size,
	    (unsigned long long)need);
	return 1;
}

/*
 * dlopen P from p->fd, the file whose status was checked, run its entry
 * and check what it returns; P ends ACCEPTED (the fd stays open while it
 * is loaded: the loader tells objects apart by that name), REJECTED or
 * SHADOWED. Loading through /proc/self/fd/FD loads the very file that
 * was checked: a file swapped in at P's path after the checks is not what
 * runs. Without /proc, the path is loaded. -1 only when out of memory.
 */
static int load_one(struct q4kh_registry *r, struct q4kh_plugin *p)
{
	q4kh_plugin_entry_fn entry;
	const struct q4kh_plugin_desc *d;
	const struct q4kh_plugin *winner;
	char *name, proc[64];
	const char *msg;
	size_t len;

	if (cut_short(p->fd, p->path, p->reason, sizeof(p->reason))) {
		unload(p);
		return 0;
	}
	len = (size_t)snprintf(proc, sizeof(proc), "/proc/self/fd/%d", p->fd);
	p->dl = dlopen(access(proc, F_OK) == 0 ? proc : p->path, RTLD_NOW | RTLD_LOCAL);
	if (!p->dl) {
		/* the loader names the file as it opened it: name it as found */
		msg = dlerror();
		if (!strncmp(msg, proc, len))
			say(p->reason, sizeof(p->reason), "%s%s", p->path, msg + len);
		else
			say(p->reason, sizeof(p->reason), "%s", msg);
		unload(p);
		return 0;
	}
	entry = (q4kh_plugin_entry_fn)dlsym(p->dl, Q4KH_ENTRY_SYMBOL);
	if (!entry) {
		explain_missing_entry(p->dl, p->reason, sizeof(p->reason));
		unload(p);
		return 0;
	}
	d = entry();
	if (check_desc(d, p->reason, sizeof(p->reason)) != 0) {
		unload(p);
		return 0;
	}
	name = strdup(d->name);
	if (!name) {
		unload(p);
		return -1;
	}
	free(p->name);
	p->name = name;
	winner = find_accepted(r, name);
	if (winner) {
		p->shadowed_by = strdup(winner->path);
		p->state = Q4KH_PLUGIN_SHADOWED;
		unload(p);
		return p->shadowed_by ? 0 : -1;
	}
	p->desc = d;
	p->state = Q4KH_PLUGIN_ACCEPTED;
	return 0;
}

/* The file name without folder and ".so", until the descriptor names it. */
static char *file_stem(const char *file)
{
	return strndup(file, strlen(file) - 3);
}

/* Append a plugin record for PATH (taken over, freed on failure). */
static struct q4kh_plugin *add_plugin(struct q4kh_registry *r, size_t *cap,
                                      char *path, const char *file)
{
	struct q4kh_plugin *p;

	if (r->n_plugins == *cap) {
		size_t n = *cap ? *cap * 2 : 8;
		struct q4kh_plugin *grown = realloc(r->plugins, n * sizeof(*grown));
		if (!grown) {
			free(path);
			return NULL;
		}
		r->plugins = grown;
		*cap = n;
	}
	p = &r->plugins[r->n_plugins];
	memset(p, 0, sizeof(*p));
	p->state = Q4KH_PLUGIN_REJECTED;
	p->fd = -1;
	p->path = path;
	p->name = file_stem(file);
	if (!p->name) {
		free(path);
		return NULL;
	}
	r->n_plugins++;
	return p;
}

static int is_so_name(const struct dirent *e)
{
	size_t len = strlen(e->d_name);

	return e->d_name[0] != '.' && len > 3 &&
	       strcmp(e->d_name + len - 3, ".so") == 0;
}

/* Byte order, not the locale's: which plugin wins must not depend on LANG. */
static int by_name(const struct dirent **a, const struct dirent **b)
{
	return strcmp((*a)->d_name, (*b)->d_name);
}

/* The file name of PATH, after its last '/'. */
static const char *base_name(const char *path)
{
	const char *slash = strrchr(path, '/');

	return slash ? slash + 1 : path;
}

/*
 * The earlier plugin that makes P a copy not to load: the very same file
 * (device and inode: a link, or a folder listed twice), or an accepted
 * plugin of the same file name. dlopen would run a copy's constructors
 * only to unload it. NULL when P must be loaded to learn its name.
 */
static const struct q4kh_plugin *earlier_copy(const struct q4kh_registry *r,
                                              const struct q4kh_plugin *p)
{
	for (const struct q4kh_plugin *q = r->plugins; q < p; q++)
		if ((q->dev == p->dev && q->ino == p->ino) ||
		    (q->state == Q4KH_PLUGIN_ACCEPTED &&
		     !strcmp(base_name(q->path), base_name(p->path))))
			return q;
	return NULL;
}

/* Record P as a copy of Q, never loaded. -1 only when out of memory. */
static int shadow(struct q4kh_plugin *p, const struct q4kh_plugin *q)
{
	if (q->state != Q4KH_PLUGIN_ACCEPTED) {
		say(p->reason, sizeof(p->reason), "the same file as %s: %s", q->path, q->reason);
		return 0;
	}
	p->state = Q4KH_PLUGIN_SHADOWED;
	p->shadowed_by = strdup(q->path);
	return p->shadowed_by ? 0 : -1;
}

/* A line of r->notes: ENTRY (a folder of the path, or a file) and why it
 * was skipped. */
static int note(struct q4kh_registry *r, const char *entry, const char *why)
{
	size_t used = strlen(r->notes);

	snprintf(r->notes + used, sizeof(r->notes) - used, "%s: %s\n", entry, why);
	return 0;
}

/* Why PATH, a name ending in .so that could not be opened as a regular file
 * (ERRNO_OPEN from open, 0 when it opened as something else), is no
 * plugin: a note for `q4khost plugins`, as a skipped folder has. */
static int note_not_a_file(struct q4kh_registry *r, const char *path, int errno_open)
{
	char why[4200], target[4096];
	struct stat st;
	ssize_t n;

	if (errno_open == ENOENT && lstat(path, &st) == 0 && S_ISLNK(st.st_mode) &&
	    (n = readlink(path, target, sizeof(target) - 1)) >= 0) {
		target[n] = 0;
		snprintf(why, sizeof(why), "skipped: a symbolic link to %s, which does not exist",
		         target);
	} else if (errno_open) {
		snprintf(why, sizeof(why), "skipped: cannot be opened: %s", strerror(errno_open));
	} else {
		snprintf(why, sizeof(why), "skipped: not a regular file");
	}
	return note(r, path, why);
}

/* Record and load one .so file of DIR; dir_refusal set if DIR is unsafe. */
static int scan_file(struct q4kh_registry *r, size_t *cap, const char *dir,
                     const char *file, const char *dir_refusal)
{
	const struct q4kh_plugin *copy;
	struct q4kh_plugin *p;
	struct stat st;
	char *path;
	int fd, rc = 0;

	if (asprintf(&path, "%s/%s", dir, file) < 0)
		return -1;
	fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0 || fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
		rc = note_not_a_file(r, path, fd < 0 ? errno : 0);
		if (fd >= 0)
			close(fd);
		free(path);
		return rc;
	}
	p = add_plugin(r, cap, path, file);
	if (!p) {
		close(fd);
		return -1;
	}
	p->dev = st.st_dev;
	p->ino = st.st_ino;
	p->fd = fd;
	if (dir_refusal)
		say(p->reason, sizeof(p->reason), "%s", dir_refusal);
	else if (!q4kh_secure_untrusted(&st, "file", path, p->reason, sizeof(p->reason))) {
		copy = earlier_copy(r, p);
		rc = copy ? shadow(p, copy) : load_one(r, p);
	}
	if (!p->dl)
		unload(p);
	return rc;
}

/* A folder already scanned, by identity, not by spelling. */
struct seen_dir {
	dev_t dev;
	ino_t ino;
	char *path;
};

struct scan_state {
	size_t cap; /* of r->plugins */
	struct seen_dir *seen;
	size_t n_seen;
};

/* The earlier entry of the path that is the folder ST, or NULL. */
static const char *seen_before(const struct scan_state *ss, const struct stat *st)
{
	for (size_t i = 0; i < ss->n_seen; i++)
		if (ss->seen[i].dev == st->st_dev && ss->seen[i].ino == st->st_ino)
			return ss->seen[i].path;
	return NULL;
}

static int remember_dir(struct scan_state *ss, const char *dir, const struct stat *st)
{
	struct seen_dir *grown = realloc(ss->seen, (ss->n_seen + 1) * sizeof(*grown));

	if (!grown)
		return -1;
	ss->seen = grown;
	grown[ss->n_seen].dev = st->st_dev;
	grown[ss->n_seen].ino = st->st_ino;
	grown[ss->n_seen].path = strdup(dir);
	return grown[ss->n_seen++].path ? 0 : -1;
}

/* Every .so in DIR, names sorted. A folder that cannot be used adds a note, not plugins. */
static int scan_dir(struct q4kh_registry *r, struct scan_state *ss, const char *dir)
{
	struct dirent **names;
	struct stat st;
	char refusal[sizeof(r->plugins->reason)], why[4200];
	const char *earlier;
	int n, rc = 0, refused;

	if (dir[0] != '/')
		return note(r, dir, "skipped: a relative folder would depend on the current directory");
	if (stat(dir, &st) != 0)
		return note(r, dir, "skipped: does not exist");
	if (!S_ISDIR(st.st_mode))
		return note(r, dir, "skipped: not a folder");
	earlier = seen_before(ss, &st);
	if (earlier && !strcmp(earlier, dir))
		return note(r, dir, "skipped: listed earlier in the path");
	if (earlier) {
		snprintf(why, sizeof(why), "skipped: the same folder as %s, listed earlier in the path",
		         earlier);
		return note(r, dir, why);
	}
	if (remember_dir(ss, dir, &st))
		return -1;
	refused = q4kh_secure_untrusted(&st, "folder", dir, refusal, sizeof(refusal)) ||
	          untrusted_above(dir, refusal, sizeof(refusal));
	n = scandir(dir, &names, is_so_name, by_name);
	if (n < 0)
		return 0;
	for (int i = 0; i < n; i++) {
		if (rc == 0)
			rc = scan_file(r, &ss->cap, dir, names[i]->d_name,
			               refused ? refusal : NULL);
		free(names[i]);
	}
	free(names);
	return rc;
}

static int choose_path(struct q4kh_registry *r, const char *cli_path,
                       const struct q4kh_config *config)
{
	const char *path = Q4KH_PLUGINDIR, *origin = "built-in";
	const char *env = q4kh_env("Q4KHOST_PLUGIN_PATH");
	const char *file, *conf = q4kh_config_get(config, "plugins", "path", &file);

	/* An empty variable or key counts as unset; an empty --plugin-path does not. */
	if (cli_path) {
		path = cli_path;
		origin = "--plugin-path";
	} else if (env && *env) {
		path = env;
		origin = "Q4KHOST_PLUGIN_PATH";
	} else if (conf && *conf) {
		path = conf;
		origin = file;
	}
	r->path = strdup(path);
	r->path_origin = origin;
	return r->path ? 0 : -1;
}

/* Walk the ':'-separated path; empty entries are skipped, not ".". */
static int scan_path(struct q4kh_registry *r)
{
	struct scan_state ss = { 0 };
	const char *s = r->path;
	unsigned entry = 0;
	int rc = 0;

	/* An empty path is no entry at all; "a:" has an empty second one. */
	while (*r->path && rc == 0) {
		size_t len = strcspn(s, ":");
		char *dir = strndup(s, len), label[32];

		entry++;
		if (!dir) {
			rc = -1;
		} else if (len == 0) {
			snprintf(label, sizeof(label), "entry %u (empty)", entry);
			rc = note(r, label, "skipped: an empty entry never means the current folder");
		} else {
			rc = scan_dir(r, &ss, dir);
		}
		free(dir);
		s += len;
		if (!*s)
			break;
		s++; /* the ':' */
	}
	for (size_t i = 0; i < ss.n_seen; i++)
		free(ss.seen[i].path);
	free(ss.seen);
	return rc;
}

/* One fprintf per line: stdio's lock keeps lines of threads apart. */
static void host_log(void *host_data, q4kh_log_level level, const char *msg)
{
	const struct q4kh_plugin *p = host_data;
	int len;

	if (level < q4kh_log_threshold())
		return;
	msg = msg ? msg : "";
	len = (int)strlen(msg);
	q4kh_progress_clear();
	while (len > 0 && msg[len - 1] == '\n')
		len--;
	fprintf(stderr, "q4khost: [plugin %s] %s: %.*s\n", p->name,
	        q4kh_log_word(level), len, msg);
}

/* config_get is thread-safe (plugin.h, T3): so is the list of keys read. */
static pthread_mutex_t keys_lock = PTHREAD_MUTEX_INITIALIZER;

/* Note KEY among the keys P read, once. */
static void remember_key(struct q4kh_plugin *p, const char *key)
{
	char *k = p->keys_read;
	size_t len = strlen(key);

	pthread_mutex_lock(&keys_lock);
	while (*k && strcmp(k, key))
		k += strlen(k) + 1;
	/* Room for the key, its NUL and the NUL that ends the list. */
	if (!*k && (size_t)(k - p->keys_read) + len + 2 <= sizeof(p->keys_read)) {
		memcpy(k, key, len + 1);
		k[len + 1] = 0;
	}
	pthread_mutex_unlock(&keys_lock);
}

/* An empty value ("isa =") counts as unset, as docs/config.md says of every
 * key: the plugin gets NULL and its default, never "" to refuse. */
static const char *host_config_get(void *host_data, const char *key)
{
	struct q4kh_plugin *p = host_data;
	char section[sizeof("plugin.") + NAME_MAX_LEN];
	const char *v;

	if (!key)
		return NULL;
	remember_key(p, key);
	snprintf(section, sizeof(section), "plugin.%s", p->name);
	v = q4kh_config_get(p->config, section, key, NULL);
	return v && *v ? v : NULL;
}

const char *q4kh_plugin_settings_read(const struct q4kh_plugin *p, int values, char *buf,
                                      size_t cap)
{
	char section[sizeof("plugin.") + NAME_MAX_LEN], where[700], shown[4 * 80 + 8];
	size_t used = 0;

	buf[0] = 0;
	snprintf(section, sizeof(section), "plugin.%s", p->name);
	pthread_mutex_lock(&keys_lock);
	for (const char *k = p->keys_read; *k && used < cap; k += strlen(k) + 1) {
		const char *v = q4kh_config_where(p->config, section, k, where, sizeof(where));

		if (!v)
			continue;
		if (values)
			used += (size_t)snprintf(buf + used, cap - used, "%s%s = \"%s\" (%s)",
			                         used ? "; " : "", k,
			                         q4kh_show(shown, sizeof(shown), v, strlen(v), 80, 0),
			                         where);
		else
			used += (size_t)snprintf(buf + used, cap - used, "%s%s from %s",
			                         used ? "; " : "", k, where);
	}
	pthread_mutex_unlock(&keys_lock);
	return buf;
}

/* Inits per plugin (q4kh_plugin_inits): a plugin path holds far fewer
 * plugins than this; one past it is not counted. */
#define COUNTED 64
static pthread_mutex_t counts_lock = PTHREAD_MUTEX_INITIALIZER;
static struct {
	const struct q4kh_plugin *plugin;
	unsigned inits;
} counts[COUNTED];

void q4kh_plugin_count_init(const struct q4kh_plugin *p)
{
	size_t i;

	pthread_mutex_lock(&counts_lock);
	for (i = 0; i < COUNTED && counts[i].plugin && counts[i].plugin != p; i++)
		;
	if (i < COUNTED) {
		counts[i].plugin = p;
		counts[i].inits++;
	}
	pthread_mutex_unlock(&counts_lock);
}

unsigned q4kh_plugin_inits(const struct q4kh_plugin *p)
{
	unsigned n = 0;

	pthread_mutex_lock(&counts_lock);
	for (size_t i = 0; i < COUNTED && counts[i].plugin; i++)
		if (counts[i].plugin == p)
			n = counts[i].inits;
	pthread_mutex_unlock(&counts_lock);
	return n;
}

/* Init P and shut it down: the status, and why into WHY when it failed. */
static q4kh_status try_init(const struct q4kh_plugin *p, char *why, size_t cap)
{
	const char *detail = NULL;
	q4kh_status st;

	q4kh_plugin_count_init(p);
	if (p->desc->kind == Q4KH_KIND_BACKEND) {
		const struct q4kh_backend_v1 *v = p->desc->backend;
		q4kh_backend_ctx *ctx = NULL;

		if ((st = v->init(&p->api, &ctx)) == Q4KH_OK)
			v->shutdown(ctx);
		else
			detail = v->last_error(NULL);
	} else {
		const struct q4kh_kernel_v1 *v = p->desc->kernel;
		q4kh_kernel_ctx *ctx = NULL;

		if ((st = v->init(&p->api, &ctx)) == Q4KH_OK)
			v->shutdown(ctx);
		else
			detail = v->last_error(NULL);
	}
	snprintf(why, cap, "%s", detail ? detail : "");
	return st;
}

/* WHY without the "NAME: " a plugin may start its message with, which the
 * host's own message has said already. */
static const char *without_name(const struct q4kh_plugin *p, const char *why)
{
	size_t n = strlen(p->name);

	return !strncmp(why, p->name, n) && !strncmp(why + n, ": ", 2) ? why + n + 2 : why;
}

/* The plugin whose keys were read, and who hears of a key it did not read. */
struct unread {
	const struct q4kh_plugin *p;
	void (*warn)(void *data, const char *line);
	void *data;
};

static int was_read(const struct q4kh_plugin *p, const char *key)
{
	for (const char *k = p->keys_read; *k; k += strlen(k) + 1)
		if (!strcasecmp(k, key))
			return 1;
	return 0;
}

/* Levenshtein distance of A and B, case aside, for the nearest name. */
static size_t name_distance(const char *a, const char *b)
{
	size_t la = strlen(a), lb = strlen(b), row[NAME_MAX_LEN + 1];

	if (lb > NAME_MAX_LEN)
		return SIZE_MAX;
	for (size_t j = 0; j <= lb; j++)
		row[j] = j;
	for (size_t i = 1; i <= la; i++) {
		size_t diag = row[0];

		row[0] = i;
		for (size_t j = 1; j <= lb; j++) {
			size_t up = row[j], best = diag + (tolower((unsigned char)a[i - 1]) !=
			                                  tolower((unsigned char)b[j - 1]));
			if (up + 1 < best)
				best = up + 1;
			if (row[j - 1] + 1 < best)
				best = row[j - 1] + 1;
			diag = up;
			row[j] = best;
		}
	}
	return row[lb];
}

/* Whether a name at distance D from NAME is a slip of a character or two
 * (worth a "did you mean"), not a different name. */
static int near_enough(const char *name, size_t d)
{
	return d <= 2 && d < strlen(name);
}

int q4kh_plugin_key_unread(const struct q4kh_plugin *p, const char *key, char *near,
                           size_t cap)
{
	const char *nearest = NULL;
	size_t best = SIZE_MAX;

	near[0] = 0;
	if (!p->keys_all_read || !strncmp(key, "f2_", 3) || was_read(p, key))
		return 0;
	for (const char *k = p->keys_read; *k; k += strlen(k) + 1) {
		size_t d = name_distance(key, k);

		if (d < best) {
			best = d;
			nearest = k;
		}
	}
	if (nearest && near_enough(key, best))
		snprintf(near, cap, "%s", nearest);
	return 1;
}

/* A key line of [plugin.NAME] that plugin NAME never asked for: a typo
 * would otherwise leave its setting at the default without a word. The
 * F2 keys are the host's, checked by name (config_keys.h). */
static void unread_key(void *data, const char *file, unsigned line, const char *section,
                       const char *key)
{
	const struct unread *u = data;
	char reads[sizeof(u->p->keys_read) + 16], msg[2048], near[128];
	size_t used = 0;

	if (strncmp(section, "plugin.", 7) || strcasecmp(section + 7, u->p->name) ||
	    !q4kh_plugin_key_unread(u->p, key, near, sizeof(near)))
		return;
	snprintf(reads, sizeof(reads), "no key");
	for (const char *k = u->p->keys_read; *k; k += strlen(k) + 1)
		used += (size_t)snprintf(reads + used, sizeof(reads) - used, "%s%s",
		                         used ? ", " : "", k);
	snprintf(msg, sizeof(msg), "%s:%u: key '%s' in section [%s] is not read by plugin %s "
	         "(it reads: %s); ignored%s%s%s", file, line, key, section, u->p->name, reads,
	         near[0] ? "; did you mean '" : "", near, near[0] ? "'?" : "");
	u->warn(u->data, msg);
}

/* Whether plugin I's name is that of one before it (a plugin in two folders). */
static int listed_before(const struct q4kh_registry *r, size_t i)
{
	for (size_t j = 0; j < i; j++)
		if (!strcmp(r->plugins[j].name, r->plugins[i].name))
			return 1;
	return 0;
}

/* What an unknown [plugin.NAME] section is checked against. */
struct sections {
	const struct q4kh_registry *r;
	void (*warn)(void *data, const char *line);
	void *data;
	char last[4200]; /* "FILE\n[SECTION]" of the last one warned about */
};

/* The first key line of a [plugin.NAME] section whose NAME is no plugin
 * of the path: a misspelt name would otherwise leave its settings unread
 * without a word. A plugin missing here may be on another machine's path
 * (a shared file), so a warning, not an error. */
static void unknown_section(void *data, const char *file, unsigned line, const char *section,
                            const char *key)
{
	struct sections *s = data;
	const struct q4kh_registry *r = s->r;
	const char *name = section + 7, *nearest = NULL;
	char names[1024] = "", msg[2400], hint[NAME_MAX_LEN + 32] = "", here[sizeof(s->last)];
	size_t used = 0, best = SIZE_MAX;

	(void)key;
	snprintf(here, sizeof(here), "%s\n[%s]", file, section);
	if (strncmp(section, "plugin.", 7) || !strcmp(s->last, here))
		return;
	for (size_t i = 0; i < r->n_plugins; i++) {
		size_t d = name_distance(name, r->plugins[i].name);

		if (!strcasecmp(name, r->plugins[i].name))
			return;
		if (d < best) {
			best = d;
			nearest = r->plugins[i].name;
		}
		if (used < sizeof(names) && !listed_before(r, i))
			used += (size_t)snprintf(names + used, sizeof(names) - used, "%s%s",
			                         used ? ", " : "", r->plugins[i].name);
	}
	memcpy(s->last, here, sizeof(here));
	if (nearest && near_enough(name, best))
		snprintf(hint, sizeof(hint), "; did you mean [plugin.%s]?", nearest);
	snprintf(msg, sizeof(msg), "%s:%u: section [%s] names no plugin on the plugin path %s, "
	         "so its keys are not read here (plugins there: %s)%s", file, line, section,
	         r->path, names[0] ? names : "none", hint);
	s->warn(s->data, msg);
}

int q4kh_registry_check_settings(const struct q4kh_registry *r, q4kh_registry_start start,
                                 void *start_data,
                                 void (*warn)(void *data, const char *line), void *data,
                                 struct q4kh_error *err)
{
	struct sections s = { r, warn, data, "" };

	char section[sizeof("plugin.") + NAME_MAX_LEN], set[1024], why[512], settings[512];

	for (size_t i = 0; i < r->n_plugins; i++) {
		struct q4kh_plugin *p = &r->plugins[i];
		struct unread u = { p, warn, data };
		q4kh_status st;

		if (p->state != Q4KH_PLUGIN_ACCEPTED)
			continue;
		snprintf(section, sizeof(section), "plugin.%s", p->name);
		if (q4kh_config_section_text(p->config, section, NULL, set, sizeof(set)) == 0 &&
		    !set[0])
			continue; /* nothing set: nothing to refuse */
		st = start ? start(start_data, p, why, sizeof(why)) : try_init(p, why, sizeof(why));
		if (st == Q4KH_ERR_INVALID &&
		    q4kh_plugin_settings_read(p, 0, settings, sizeof(settings))[0])
			return q4kh_fail(err, "plugin %s refuses its settings: %s (%s)", p->name,
			                 without_name(p, why), settings);
		/* Only an init that ran to the end has asked for every key. */
		p->keys_all_read = st == Q4KH_OK;
		if (st == Q4KH_OK && warn)
			q4kh_config_each(p->config, unread_key, &u);
	}
	if (warn && r->config)
		q4kh_config_each(r->config, unknown_section, &s);
	return 0;
}

/* Only once the array stops moving may host_data point into it. */
static void give_host_api(struct q4kh_registry *r,
                          const struct q4kh_config *config)
{
	for (size_t i = 0; i < r->n_plugins; i++) {
		struct q4kh_plugin *p = &r->plugins[i];

		p->config = config;
		p->api.struct_size = sizeof(p->api);
		p->api.abi_major = Q4KH_ABI_MAJOR;
		p->api.abi_minor = Q4KH_ABI_MINOR;
		p->api.host_data = p;
		p->api.log = host_log;
		p->api.config_get = host_config_get;
	}
}

int q4kh_registry_scan(const char *cli_path, const struct q4kh_config *config,
                       struct q4kh_registry **out, struct q4kh_error *err)
{
	struct q4kh_registry *r = calloc(1, sizeof(*r));

	*out = NULL;
	if (!r || choose_path(r, cli_path, config) != 0 || scan_path(r) != 0) {
		q4kh_registry_free(r);
		return q4kh_fail(err, "plugin scan: out of memory");
	}
	give_host_api(r, config);
	r->config = config;
	*out = r;
	return 0;
}

void q4kh_registry_free(struct q4kh_registry *r)
{
	if (!r)
		return;
	for (size_t i = r->n_plugins; i-- > 0;) {
		struct q4kh_plugin *p = &r->plugins[i];

		unload(p);
		free(p->path);
		free(p->shadowed_by);
		free(p->name);
	}
	free(r->plugins);
	free(r->path);
	free(r);
}

const struct q4kh_plugin *q4kh_registry_find(const struct q4kh_registry *r,
                                             const char *name)
{
	return r && name ? find_accepted(r, name) : NULL;
}

const struct q4kh_plugin *q4kh_registry_backend_of_kind(const struct q4kh_registry *r,
                                                        const char *kind)
{
	for (size_t i = 0; i < r->n_plugins; i++)
		if (r->plugins[i].state == Q4KH_PLUGIN_ACCEPTED &&
		    r->plugins[i].desc->kind == Q4KH_KIND_BACKEND &&
		    !strcmp(q4kh_backend_kind(&r->plugins[i]), kind))
			return &r->plugins[i];
	return NULL;
}

const char *q4kh_registry_why_absent(const struct q4kh_registry *r, const char *name, char *buf,
                                     size_t cap)
{
	buf[0] = 0;
	if (!r || !name || find_accepted(r, name))
		return buf;
	for (size_t i = 0; i < r->n_plugins; i++) {
		const struct q4kh_plugin *p = &r->plugins[i];

		if ((p->state == Q4KH_PLUGIN_REJECTED || p->state == Q4KH_PLUGIN_REFUSED) &&
		    !strcmp(p->name, name)) {
			snprintf(buf, cap, "%s was %s: %s", p->path,
			         p->state == Q4KH_PLUGIN_REJECTED ? "rejected" : "refused", p->reason);
			break;
		}
	}
	return buf;
}

const char *q4kh_registry_backend_names(const struct q4kh_registry *r, char *buf, size_t cap)
{
	size_t used = 0;

	snprintf(buf, cap, "none");
	for (size_t i = 0; i < r->n_plugins && used < cap; i++)
		if (r->plugins[i].state == Q4KH_PLUGIN_ACCEPTED &&
		    r->plugins[i].desc->kind == Q4KH_KIND_BACKEND)
			used += (size_t)snprintf(buf + used, cap - used, "%s%s", used ? ", " : "",
			                         r->plugins[i].name);
	return buf;
}

int q4kh_registry_check_backend(const struct q4kh_registry *r, const char *name,
                                const char *origin, struct q4kh_error *err)
{
	const struct q4kh_plugin *p = q4kh_registry_find(r, name);
	char known[1024], shown[96], why[700];

	if (!name || (p && p->desc->kind == Q4KH_KIND_BACKEND))
		return 0;
	q4kh_registry_backend_names(r, known, sizeof(known));
	q4kh_registry_why_absent(r, name, why, sizeof(why));
	q4kh_show(shown, sizeof(shown), name, strlen(name), 64, 0);
	return q4kh_fail(err, "%s%s%s: %s on the plugin path %s (from %s)%s%s; the backends there: "
	                 "%s (q4khost plugins lists every plugin and why)",
	                 origin, strcmp(origin, "--backend") ? "=" : " ", shown,
	                 p ? "that plugin is a kernel variant, not a backend"
	                   : "no backend plugin of that name",
	                 r->path, r->path_origin, why[0] ? ": " : "", why, known);
}
