/*
 * The keys q4khost reads from its INI files (docs/config.md, section 3)
 * and the variables it reads (section 4), and the checks that name every
 * other key or Q4KHOST_ variable, so a typo does not silently leave a
 * setting at its default. Thread-safe.
 *
 * Known sections and keys:
 *   [plugins]      path
 *   [f2]           mode, probe, require_deep, receipt_dir, f2_floor,
 *                  f2_decode_steps, f2_probe_tokens, f2_timeout_s,
 *                  f2_memory_limit_mb
 *   [gpu], [gpu.SELECTOR]  q4k_kernel (SELECTOR: a device's UUID, index,
 *                  name or architecture)
 *   [plugin.NAME]  any key (the plugin reads its own), except that a key
 *                  starting with "f2_" must be one of the F2 keys above
 */
#ifndef Q4KH_CONFIG_KEYS_H
#define Q4KH_CONFIG_KEYS_H

#include <stddef.h>

#include "config.h"

/*
 * Call WARN once for every key line of C's files that q4khost does not
 * know, with one line naming the file, line, section and key, e.g.
 * "/etc/q4khost/q4khost.ini:7: unknown key 'q4k_kernal' in section
 * [gpu.0] (known there: q4k_kernel); ignored", and once for every key
 * a file sets again in the same section, naming both lines ("... is set
 * again (first on line 3); this later line wins", as iniparser keeps the
 * last). Returns how many.
 */
size_t q4kh_config_check(const struct q4kh_config *c,
                         void (*warn)(void *data, const char *line), void *data);

/*
 * Whether q4khost does not know KEY of SECTION (a key outside any section
 * included), as q4kh_config_check judges a file's keys: 1 with the reason
 * in MSG ("unknown key 'x' in section [f2] (known there: ...); ignored"),
 * else 0. For settings made on the command line (validate --set).
 */
int q4kh_config_key_unknown(const char *section, const char *key, char *msg, size_t cap);

/*
 * Call WARN once for every variable of the environment that starts with
 * Q4KHOST_ but is none q4khost reads, so that a misspelt one is not
 * silently without effect: "unknown environment variable Q4KHOST_KERNEL
 * (known: Q4KHOST_API_KEY, ...); ignored". Returns how many.
 */
size_t q4kh_env_check(void (*warn)(void *data, const char *line), void *data);

#endif
