#include "config_keys.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define F2_KEYS "f2_floor", "f2_decode_steps", "f2_probe_tokens"

/* A section NAME, or every section starting with NAME when prefix is set. */
struct section {
	const char *name;
	int prefix;
	const char *const keys[10]; /* NULL-terminated; NULL first: any key */
	const char *shown;         /* how docs and warnings write the section */
};

static const struct section sections[] = {
	{ "plugins", 0, { "path", "enumerate_timeout_s", NULL }, "plugins" },
	{ "f2", 0, { "mode", "probe", "require_deep", "receipt_dir", F2_KEYS, "f2_timeout_s", "f2_memory_limit_mb", NULL }, "f2" },
	{ "serve", 0, { "kv_pages", NULL }, "serve" },
	{ "gpu", 0, { "q4k_kernel", NULL }, "gpu" },
	{ "gpu.", 1, { "q4k_kernel", NULL }, "gpu.DEVICE" },
	{ "plugin.", 1, { NULL }, "plugin.NAME" },
};

static const char *const plugin_f2_keys[] = { F2_KEYS, NULL };

static const struct section *find_section(const char *name)
{
	for (size_t i = 0; i < sizeof(sections) / sizeof(sections[0]); i++) {
		const struct section *s = &sections[i];
		if (s->prefix ? !strncmp(name, s->name, strlen(s->name)) &&
		                        name[strlen(s->name)]
		              : !strcmp(name, s->name))
			return s;
	}
	return NULL;
}

static int listed(const char *const *keys, const char *key)
{
	for (; *keys; keys++)
		if (!strcmp(*keys, key))
			return 1;
	return 0;
}

/* "a, b, c" of a NULL-terminated list. */
static void join(const char *const *keys, char *buf, size_t cap)
{
	size_t used = 0;

	buf[0] = 0;
	for (; *keys && used < cap; keys++)
		used += (size_t)snprintf(buf + used, cap - used, "%s%s", used ? ", " : "", *keys);
}

/* A key line already seen in the file being checked. */
struct seen {
	char section[128], key[128];
	unsigned line;
};

struct check {
	void (*warn)(void *data, const char *line);
	void *data;
	size_t count;
	const char *file; /* the file SEEN holds the keys of */
	struct seen *seen;
	size_t n_seen, cap_seen;
};

/*
 * The line KEY of SECTION was first set on in the current file, 0 when
 * this is the first time; FILE's keys are remembered from here on.
 */
static unsigned first_set(struct check *ck, const char *file, unsigned line,
                          const char *section, const char *key)
{
	struct seen *grown;

	if (!ck->file || strcmp(ck->file, file)) {
		ck->file = file;
		ck->n_seen = 0;
	}
	for (size_t i = 0; i < ck->n_seen; i++)
		if (!strcmp(ck->seen[i].section, section) && !strcmp(ck->seen[i].key, key))
			return ck->seen[i].line;
	if (ck->n_seen == ck->cap_seen) {
		grown = realloc(ck->seen, (ck->cap_seen * 2 + 16) * sizeof(*grown));
		if (!grown)
			return 0; /* out of memory: a repeat may go unwarned, nothing worse */
		ck->seen = grown;
		ck->cap_seen = ck->cap_seen * 2 + 16;
	}
	snprintf(ck->seen[ck->n_seen].section, sizeof(ck->seen[0].section), "%s", section);
	snprintf(ck->seen[ck->n_seen].key, sizeof(ck->seen[0].key), "%s", key);
	ck->seen[ck->n_seen++].line = line;
	return 0;
}

int q4kh_config_key_unknown(const char *section, const char *key, char *msg, size_t cap)
{
	const struct section *s = find_section(section);
	char known[256];

	if (!*section) {
		snprintf(msg, cap, "key '%s' is outside any [section]; ignored", key);
	} else if (!s) {
		char names[256];
		const char *all[sizeof(sections) / sizeof(sections[0]) + 1];
		for (size_t i = 0; i < sizeof(sections) / sizeof(sections[0]); i++)
			all[i] = sections[i].shown;
		all[sizeof(sections) / sizeof(sections[0])] = NULL;
		join(all, names, sizeof(names));
		snprintf(msg, cap, "unknown section [%s] (known: %s); key '%s' ignored", section,
		         names, key);
	} else if (s->keys[0] && !listed(s->keys, key)) {
		join(s->keys, known, sizeof(known));
		snprintf(msg, cap, "unknown key '%s' in section [%s] (known there: %s); ignored",
		         key, section, known);
	} else if (!s->keys[0] && !strncmp(key, "f2_", 3) && !listed(plugin_f2_keys, key)) {
		join(plugin_f2_keys, known, sizeof(known));
		snprintf(msg, cap, "unknown F2 key '%s' in section [%s] (F2 keys: %s); ignored", key,
		         section, known);
	} else {
		return 0;
	}
	return 1;
}

static void check_key(void *data, const char *file, unsigned line,
                      const char *section, const char *key)
{
	struct check *ck = data;
	char msg[2048], why[1536];
	unsigned first = first_set(ck, file, line, section, key);

	if (first)
		snprintf(msg, sizeof(msg), "%s:%u: key '%s' in section [%s] is set again (first on line %u); this later line wins",
		         file, line, key, section, first);
	else if (q4kh_config_key_unknown(section, key, why, sizeof(why)))
		snprintf(msg, sizeof(msg), "%s:%u: %s", file, line, why);
	else
		return;
	ck->count++;
	ck->warn(ck->data, msg);
}

size_t q4kh_config_check(const struct q4kh_config *c,
                         void (*warn)(void *data, const char *line), void *data)
{
	struct check ck = { warn, data, 0, NULL, NULL, 0, 0 };

	q4kh_config_each(c, check_key, &ck);
	free(ck.seen);
	return ck.count;
}

extern char **environ;

/* The variables q4khost reads (docs/config.md, section 4). */
static const char *const env_names[] = {
	"Q4KHOST_API_KEY", "Q4KHOST_BACKEND", "Q4KHOST_CONFIG", "Q4KHOST_F2",
	"Q4KHOST_F2_RECEIPT_DIR", "Q4KHOST_F2_REQUIRE_DEEP", "Q4KHOST_LOG", "Q4KHOST_MODEL",
	"Q4KHOST_PLUGIN_PATH", "Q4KHOST_Q4K_KERNEL", "Q4KHOST_RECEIPT_KEY", NULL
};

size_t q4kh_env_check(void (*warn)(void *data, const char *line), void *data)
{
	char msg[1024], known[256], name[101];
	size_t count = 0;

	join(env_names, known, sizeof(known));
	for (char **e = environ; e && *e; e++) {
		size_t len = strcspn(*e, "=");

		if (strncmp(*e, "Q4KHOST_", 8))
			continue;
		snprintf(name, sizeof(name), "%.*s", (int)len, *e);
		if (listed(env_names, name))
			continue;
		snprintf(msg, sizeof(msg), "unknown environment variable %s%s (known: %s); ignored",
		         name, len >= sizeof(name) ? "..." : "", known);
		count++;
		warn(data, msg);
	}
	return count;
}
