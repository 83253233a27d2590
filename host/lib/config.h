/*
 * Layered configuration (docs/config.md), read with iniparser:
 *   $(sysconfdir)/q4khost/q4khost.ini < $(sysconfdir)/q4khost/conf.d/NAME.ini
 *   (sorted by name) < $XDG_CONFIG_HOME/q4khost/q4khost.ini (or
 *   ~/.config/...) < the --config file.
 * A later layer overrides a key of an earlier one. Keys are "section:key",
 * lower-cased, as iniparser stores them. Environment variables and CLI flags
 * rank above all files; their callers apply them.
 * A loaded config is read-only and thread-safe.
 */
#ifndef Q4KH_CONFIG_H
#define Q4KH_CONFIG_H

#include <stddef.h>
#include <stdint.h>

#include "error.h"

struct q4kh_config;

/*
 * Load every layer that exists. sysconfdir: the folder holding q4khost.ini
 * and conf.d (NULL: the built-in one). cli_file: the --config file, or
 * NULL for $Q4KHOST_CONFIG (if set) or none; unlike the others it must
 * exist. -1 with err naming the file (and line,
 * when known) on a file that cannot be read or parsed; for the extra file
 * it ends in "(from --config)", or "(from Q4KHOST_CONFIG)" when that
 * variable named it.
 */
int q4kh_config_load(const char *sysconfdir, const char *cli_file,
                     struct q4kh_config **out, struct q4kh_error *err);
void q4kh_config_free(struct q4kh_config *c);

/*
 * The value of SECTION:KEY from the highest layer that sets it, or NULL.
 * When origin is not NULL it receives the file (or override origin) that
 * set it. The strings
 * stay valid until q4kh_config_free(). A key that names a section yields
 * NULL (CVE-2023-33461 cannot reach us: iniparser_getstring only).
 */
const char *q4kh_config_get(const struct q4kh_config *c, const char *section,
                            const char *key, const char **origin);

/*
 * As q4kh_config_get, with where the value came from written into ORIGIN:
 * "FILE:LINE [SECTION]" for a file (the last line that sets the key in
 * that section, as iniparser keeps the last), or the name an override was
 * set with ("--threads"). NULL, ORIGIN untouched, when no layer sets it.
 */
const char *q4kh_config_where(const struct q4kh_config *c, const char *section,
                              const char *key, char *origin, size_t cap);

/*
 * Called for every key line of every file layer (lowest layer first, in
 * file order): the file, the line number, and the section and key as
 * iniparser stores them (trimmed, lower-cased; section "" before the first
 * header).
 */
typedef void (*q4kh_config_key_fn)(void *data, const char *file, unsigned line,
                                   const char *section, const char *key);
void q4kh_config_each(const struct q4kh_config *c, q4kh_config_key_fn fn,
                      void *data);

/*
 * Set SECTION:KEY to VALUE above every file layer, for a CLI flag or an
 * environment variable; ORIGIN ("--threads") is what q4kh_config_get
 * reports as its origin. Copies every string. -1 with err on out of memory.
 */
int q4kh_config_set(struct q4kh_config *c, const char *section,
                    const char *key, const char *value, const char *origin,
                    struct q4kh_error *err);

/*
 * The keys of SECTION that any layer sets, each once, sorted, leaving out
 * those that start with SKIP (NULL: none), into KEYS (at most CAP; the
 * strings are C's, valid until q4kh_config_free): how many.
 */
size_t q4kh_config_section_keys(const struct q4kh_config *c, const char *section,
                                const char *skip, const char **keys, size_t cap);

/*
 * The effective settings of SECTION, every layer's keys with the value
 * that wins, sorted by key, as "key=value; key=value" into BUF ("" when
 * none), leaving out the keys that start with SKIP (NULL: none): what a
 * receipt keys on for a plugin's [plugin.NAME]. -1 when they do not fit
 * in CAP bytes.
 */
int q4kh_config_section_text(const struct q4kh_config *c, const char *section,
                             const char *skip, char *buf, size_t cap);

/*
 * The whole number SECTION:KEY into *V when some layer sets it, and where
 * ("FILE:LINE [SECTION]", or an override's origin) into ORIGIN (CAP
 * bytes); both left alone when none does. A value that is not a decimal
 * whole number from LO to HI is an error naming where it was set, the
 * key, the value and the range.
 */
int q4kh_config_whole(const struct q4kh_config *c, const char *section, const char *key,
                      uint64_t lo, uint64_t hi, uint64_t *v, char *origin, size_t cap,
                      struct q4kh_error *err);

/* Called for every key set above the file layers (q4kh_config_set). */
typedef void (*q4kh_config_set_fn)(void *data, const char *section, const char *key,
                                   const char *value, const char *origin);
void q4kh_config_each_set(const struct q4kh_config *c, q4kh_config_set_fn fn,
                          void *data);

/*
 * The home folder of the effective user: $HOME when it is an absolute
 * path (and not ignored: set-uid programs ignore it, q4kh_env), else the
 * password database's entry for geteuid(), else "" . For the user's
 * config, cache and receipt folders.
 */
const char *q4kh_home(void);

/*
 * The user's cache folder, into BUF: $XDG_CACHE_HOME when it is an
 * absolute path, else q4kh_home()/.cache. A relative XDG_CACHE_HOME is
 * ignored, as the XDG base directory spec says (the commands warn about
 * it once, as they read their configuration). For the default model and
 * the receipts.
 */
const char *q4kh_cache_home(char *buf, size_t cap);

/*
 * The user's configuration folder, into BUF: $XDG_CONFIG_HOME when it is
 * an absolute path, else q4kh_home()/.config (a relative XDG_CONFIG_HOME
 * ignored, as for q4kh_cache_home). For the user's q4khost.ini and receipt
 * key.
 */
const char *q4kh_config_home(char *buf, size_t cap);

/*
 * DIR and every folder above it that is missing, as mkdir -p makes them,
 * each new one 0700 (the user's receipts and key are theirs alone);
 * folders that exist are left as they are. 0, or -1 with errno.
 */
int q4kh_mkdirs_private(const char *dir);

/*
 * Read environment variable NAME, ignoring it in set-uid/set-gid programs
 * (secure_getenv), so an unprivileged user cannot steer a privileged host.
 */
const char *q4kh_env(const char *name);

#endif
