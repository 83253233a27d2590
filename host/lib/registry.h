/*
 * Plugin discovery and loading (docs/architecture.md section 3).
 *
 * The plugin path is a ':'-separated list of folders taken from the first
 * of: the CLI (--plugin-path), Q4KHOST_PLUGIN_PATH, the config key
 * [plugins] path, the built-in $(pkglibdir)/plugins. Every regular file
 * ending in ".so" in those folders (in path order, names sorted within a
 * folder) is dlopen()ed with RTLD_NOW | RTLD_LOCAL; the entry symbol
 * Q4KH_ENTRY_SYMBOL is resolved and called, and the descriptor is checked
 * (struct_size, abi_minor, kind, required table entries) before any other
 * plugin code runs. A plugin whose name was already accepted from an
 * earlier file is "shadowed" and unloaded; both paths are kept for the
 * report. A file of the same file name as an accepted plugin's, or the
 * very file again (same device and inode, through a link), is shadowed
 * without being loaded, so that its constructors never run. A folder
 * listed twice, however spelt (a trailing slash, a symbolic link), is
 * scanned once. A file or folder writable by group or others is refused.
 */
#ifndef Q4KH_REGISTRY_H
#define Q4KH_REGISTRY_H

#include <stddef.h>
#include <sys/types.h>

#include "config.h"
#include "error.h"
#include "q4khost/plugin.h"

enum q4kh_plugin_state {
	Q4KH_PLUGIN_ACCEPTED = 0,
	Q4KH_PLUGIN_REJECTED = 1, /* reason says why */
	Q4KH_PLUGIN_SHADOWED = 2, /* shadowed_by names the file that won */
	/* A backend whose init or device enumeration crashed or hung in a
	 * helper process (enumerate.h); reason says how. Still loaded, desc
	 * valid, but nothing in it is called again. */
	Q4KH_PLUGIN_REFUSED = 3
};

struct q4kh_plugin {
	char *path;                          /* as found on the plugin path */
	dev_t dev;                           /* the file's identity */
	ino_t ino;
	enum q4kh_plugin_state state;
	char reason[512];                    /* one line, when rejected */
	char *shadowed_by;                   /* path of the winner, when shadowed */
	void *dl;                            /* dlopen handle while accepted */
	int fd;                              /* the file it was loaded from, open
	                                        while loaded; -1 otherwise */
	const struct q4kh_plugin_desc *desc; /* while accepted */
	/*
	 * Copied, valid for every state: the descriptor's name once the
	 * descriptor passed its checks, else the file name without ".so".
	 */
	char *name;
	struct q4kh_host_api api;            /* what init() receives */
	const struct q4kh_config *config;
	/* The keys of [plugin.NAME] the plugin asked for (config_get), each
	 * followed by a NUL, so that an error can say where they were set. */
	char keys_read[256];
	/* 1 once an init that ran to the end has asked for every key it reads
	 * (q4kh_registry_check_settings): keys_read is then the whole list. */
	int keys_all_read;
};

struct q4kh_registry {
	char *path;          /* the plugin path used */
	const char *path_origin; /* "--plugin-path", "Q4KHOST_PLUGIN_PATH", file, "built-in" */
	struct q4kh_plugin *plugins;
	size_t n_plugins;
	/* Entries of the path that were skipped and why, one per line
	 * ("/x: skipped: does not exist"): empty entries, missing and
	 * relative folders (they would depend on the current directory),
	 * folders listed before, and names ending in .so that are no regular
	 * file ("/x/gone.so: skipped: a symbolic link to ..., which does not
	 * exist"). */
	char notes[2048];
	const struct q4kh_config *config; /* q4kh_registry_scan's; may be NULL */
};

/*
 * Scan the plugin path and load every plugin found. cli_path may be NULL;
 * config may be NULL. A file, or its folder, writable by group or others
 * is refused, and so, when running set-uid or set-gid (secure.h), is one
 * not owned by root; nothing in a refused plugin is called. Rejections are
 * recorded, not errors; -1 only on out of memory. The registry keeps a
 * pointer to config: free it first.
 */
int q4kh_registry_scan(const char *cli_path, const struct q4kh_config *config,
                       struct q4kh_registry **out, struct q4kh_error *err);
void q4kh_registry_free(struct q4kh_registry *r);

/*
 * Count one init of plugin P (a backend's or a kernel variant's) in this
 * process: whoever calls a plugin's init calls this first, so that
 * q4kh_plugin_inits tells how often the command started it. Thread-safe.
 */
void q4kh_plugin_count_init(const struct q4kh_plugin *p);
/* How many times P was initialised in this process (q4kh_plugin_count_init;
 * for the commands' "host" in --json and the tests that hold each plugin
 * to one). Thread-safe. */
unsigned q4kh_plugin_inits(const struct q4kh_plugin *p);

/*
 * The settings plugin P read through config_get that are set, with where,
 * into BUF: "threads = \"0\" (/etc/q4khost/q4khost.ini:7 [plugin.cpu])",
 * or without VALUES "threads from /etc/q4khost/q4khost.ini:7
 * [plugin.cpu]" (for a message that quotes the value already), several
 * joined by "; "; "" when none. For an error the plugin reports: it knows
 * its key, the host knows the file and line. Returns BUF.
 */
const char *q4kh_plugin_settings_read(const struct q4kh_plugin *p, int values, char *buf,
                                      size_t cap);

/*
 * Whether every accepted plugin of R (backends and kernel variants) takes
 * the values of its settings, before any work: each whose [plugin.NAME]
 * section sets anything is initialised: through START (with START_DATA;
 * host.h's q4kh_host_start_status keeps it started in the command's host
 * context, so that this is its one init), or, with START NULL,
 * initialised and shut down here. START returns the status of the
 * plugin's init and its last_error in WHY, as the init here does. -1
 * with err when an
 * init fails with Q4KH_ERR_INVALID having read a setting that is set (how
 * plugin.h says a value is malformed or out of range): "plugin NAME
 * refuses its settings: REASON [its settings: KEY = "VALUE" (FILE:LINE
 * [plugin.NAME])]", a bad configuration as a bad value the host checks
 * is. Any other init failure, a value this machine cannot run
 * (Q4KH_ERR_UNSUPPORTED) among them, is no configuration error: the
 * selection falls back past the plugin and says why. After an init that
 * succeeded, WARN (NULL: none) gets a line for every key line of the
 * config files in [plugin.NAME] that the plugin never asked for
 * (config_get), F2 keys aside: "FILE:LINE: key 'threds' in section
 * [plugin.cpu] is not read by plugin cpu (it reads: threads); ignored;
 * did you mean 'threads'?" (q4kh_plugin_key_unread).
 * WARN also gets a line for the first key line of every [plugin.NAME]
 * section whose NAME is no plugin of R's path, with the names that are
 * and the nearest when it is a slip away: "FILE:LINE: section
 * [plugin.cpu_fast] names no plugin on the plugin path P, so its keys
 * are not read here (plugins there: cpu, cpu-fast); did you mean
 * [plugin.cpu-fast]?". Never an error: a file shared by machines may set plugins that
 * only some of their paths have.
 */
/*
 * Whether KEY, set in plugin P's [plugin.NAME], is one P does not read: 1
 * when an init of P that ran to the end (q4kh_registry_check_settings)
 * never asked for it and it is no F2 key (those are the host's), with
 * the key P reads that is a character or two away in NEAR (CAP bytes;
 * what "did you mean" names), else "". 0 (NEAR "") when P reads it or
 * P's keys are not known.
 */
int q4kh_plugin_key_unread(const struct q4kh_plugin *p, const char *key, char *near,
                           size_t cap);

typedef q4kh_status (*q4kh_registry_start)(void *data, const struct q4kh_plugin *p,
                                           char *why, size_t cap);
int q4kh_registry_check_settings(const struct q4kh_registry *r, q4kh_registry_start start,
                                 void *start_data,
                                 void (*warn)(void *data, const char *line), void *data,
                                 struct q4kh_error *err);

/*
 * The kind of accepted backend plugin P (plugin.h, backend_kind): what
 * the kernel variants that bind to it name as their backend. Its name
 * when the descriptor says none.
 */
const char *q4kh_backend_kind(const struct q4kh_plugin *p);

/*
 * The arithmetic class accepted plugin P declares in its table (plugin.h,
 * q4kh_arith: the backend table's arith for a backend, the kernel
 * table's for a kernel variant), as the plugin wrote it: a value this
 * host may not know. UNDECLARED when the table is too short to hold the
 * field (a plugin before ABI 1.6) or P is not accepted.
 */
uint32_t q4kh_plugin_arith(const struct q4kh_plugin *p);

/* The first accepted backend of kind KIND (q4kh_backend_kind), or NULL. */
const struct q4kh_plugin *q4kh_registry_backend_of_kind(const struct q4kh_registry *r,
                                                        const char *kind);

/* The accepted plugin called NAME, or NULL. */
const struct q4kh_plugin *q4kh_registry_find(const struct q4kh_registry *r,
                                             const char *name);

/*
 * Why no accepted plugin of R is called NAME, for a message that says it
 * is missing: "FILE was rejected: REASON" (or "was refused: REASON")
 * when a file of that name on the path was not accepted (a mode that
 * lets others write it, a descriptor it refused, ...), so that the
 * message carries the reason and its fix; "" when no file of that name
 * is there, or one is accepted. Into BUF (CAP bytes); returns BUF.
 */
const char *q4kh_registry_why_absent(const struct q4kh_registry *r, const char *name, char *buf,
                                     size_t cap);

/*
 * The names of R's accepted backend plugins, ", "-separated, into BUF
 * ("none" when there is none); returns BUF.
 */
const char *q4kh_registry_backend_names(const struct q4kh_registry *r, char *buf, size_t cap);

/*
 * 0 when NAME, the backend asked for (NULL: none) from ORIGIN
 * ("--backend" or "Q4KHOST_BACKEND", as q4kh_settings_backend says), is an
 * accepted backend plugin of R; else -1 with err naming ORIGIN, the value,
 * the plugin path and the backends accepted there. NAME is never empty:
 * the commands refuse an empty --backend as they parse it, and an empty
 * Q4KHOST_BACKEND is unset.
 */
int q4kh_registry_check_backend(const struct q4kh_registry *r, const char *name,
                                const char *origin, struct q4kh_error *err);

#endif
