#include "policy.h"

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#define ENV_KERNEL "Q4KHOST_Q4K_KERNEL"
/* Bytes of a kernel list or name quoted in a message. */
#define VALUE_SHOWN 200

static int means_builtin(const char *v)
{
	return !strcmp(v, "none") || !strcmp(v, "0") || !strcmp(v, "built-in");
}

void q4kh_policy_list_variants(const struct q4kh_registry *r, char *buf, size_t cap)
{
	size_t used = 0;

	buf[0] = 0;
	for (size_t i = 0; i < r->n_plugins && used < cap; i++) {
		const struct q4kh_plugin *p = &r->plugins[i];
		if (p->state != Q4KH_PLUGIN_ACCEPTED || p->desc->kind != Q4KH_KIND_KERNEL)
			continue;
		used += (size_t)snprintf(buf + used, cap - used, "%s%s (for %s)",
		                         used ? ", " : "", p->name, p->desc->kernel->backend);
	}
	if (!buf[0])
		snprintf(buf, cap, "none");
}

/* The accepted kernel-variant plugin called NAME, or NULL. */
static const struct q4kh_plugin *find_variant(const struct q4kh_registry *r,
                                              const char *name)
{
	const struct q4kh_plugin *p = q4kh_registry_find(r, name);

	return p && p->desc->kind == Q4KH_KIND_KERNEL ? p : NULL;
}

/* One entry of a setting: SELECTOR=NAME, selector "" for every device. */
struct entry {
	char sel[128];
	const struct q4kh_plugin *variant; /* NULL: the built-in kernels */
};

static char *trim(char *s)
{
	char *end = s + strlen(s);

	while (isspace((unsigned char)*s))
		s++;
	while (end > s && isspace((unsigned char)end[-1]))
		end--;
	*end = 0;
	return s;
}

/*
 * Split VALUE (set at WHERE) into entries; selectors only when SELECTORS.
 * -1 with err on an empty part, an unknown name or too many entries. R
 * NULL: the form alone, names not looked up (E's variants left unset).
 */
static int parse_list(const struct q4kh_registry *r, const char *value,
                      const char *where, int selectors, struct entry *e,
                      size_t *n, struct q4kh_error *err)
{
	char buf[1024], *save = NULL, *part;
	char valid[512], shown[4 * VALUE_SHOWN + 8], shown_name[4 * VALUE_SHOWN + 8], why[700];

	*n = 0;
	/* Values come from users: quoted so a message stays one line. */
	q4kh_show(shown, sizeof(shown), value, strlen(value), VALUE_SHOWN, 0);
	if ((size_t)snprintf(buf, sizeof(buf), "%s", value) >= sizeof(buf))
		return q4kh_fail(err, "%s: the kernel list is longer than %zu bytes", where,
		                 sizeof(buf) - 1);
	/* strtok would skip empty parts; an empty entry is a mistake to name. */
	for (part = buf; part; part = save) {
		char *eq, *name;

		save = strchr(part, ',');
		if (save)
			*save++ = 0;
		name = trim(part);
		eq = strchr(name, '=');
		if (*n == Q4KH_KERNEL_LIST)
			return q4kh_fail(err, "%s: more than %d kernel entries in \"%s\"", where,
			                 Q4KH_KERNEL_LIST, shown);
		e[*n].sel[0] = 0;
		if (eq && !selectors)
			return q4kh_fail(err, "%s: \"%s\": a config value lists kernel names only (the [gpu.DEVICE] section is the selector)",
			                 where, shown);
		if (eq) {
			*eq = 0;
			snprintf(e[*n].sel, sizeof(e[*n].sel), "%s", trim(name));
			name = trim(eq + 1);
			if (!e[*n].sel[0])
				return q4kh_fail(err, "%s: \"%s\": an entry has '=' but no device before it (expected SELECTOR=NAME, SELECTOR a device's index, UUID, name or architecture)",
				                 where, shown);
		}
		if (!*name)
			return q4kh_fail(err, "%s: \"%s\": an empty kernel name (expected a kernel variant, or none or built-in for the built-in kernels)",
			                 where, shown);
		if (!r || means_builtin(name)) {
			e[*n].variant = NULL;
		} else if (!(e[*n].variant = find_variant(r, name))) {
			int some;

			q4kh_policy_list_variants(r, valid, sizeof(valid));
			/* the list's own "none" would name the built-in twice */
			some = strcmp(valid, "none") != 0;
			q4kh_registry_why_absent(r, name, why, sizeof(why));
			return q4kh_fail(err, "%s: '%s' is not a kernel variant on plugin path %s (%s)%s%s; valid: none, built-in%s%s",
			                 where,
			                 q4kh_show(shown_name, sizeof(shown_name), name,
			                           strlen(name), VALUE_SHOWN, 0),
			                 r->path, r->path_origin, why[0] ? ": " : "", why,
			                 some ? ", " : "", some ? valid : "");
		}
		(*n)++;
	}
	return 0;
}

int q4kh_policy_kernel_env_check(struct q4kh_error *err)
{
	const char *env = q4kh_env(ENV_KERNEL);
	struct entry e[Q4KH_KERNEL_LIST];
	size_t n;

	return env && *env ? parse_list(NULL, env, ENV_KERNEL, 1, e, &n, err) : 0;
}

/* How specifically SEL names DEV: 0 not at all, 1 (every device) .. 5. */
static int rank(const char *sel, const struct q4kh_device_record *dev)
{
	size_t digits = strspn(sel, "0123456789");

	if (!*sel)
		return 1;
	if (dev->uuid[0] && !strcasecmp(sel, dev->uuid))
		return 5;
	if (digits && !sel[digits] && strtoul(sel, NULL, 10) == dev->index)
		return 4;
	if (dev->name[0] && !strcasecmp(sel, dev->name))
		return 3;
	if (dev->arch[0] && !strcasecmp(sel, dev->arch))
		return 2;
	return 0;
}

/* Append P to SET (*N of CAP) unless it is there. */
static void add_once(const struct q4kh_plugin *p, const struct q4kh_plugin **set, size_t *n,
                     size_t cap)
{
	for (size_t i = 0; i < *n; i++)
		if (set[i] == p)
			return;
	if (*n < cap)
		set[(*n)++] = p;
}

void q4kh_policy_others_add(const struct q4kh_kernel_choice *ch,
                            const struct q4kh_plugin **set, size_t *n, size_t cap)
{
	for (size_t i = 0; i < ch->n_others; i++)
		add_once(ch->others[i], set, n, cap);
}

const char *q4kh_policy_others_text(const struct q4kh_kernel_choice *ch, char *buf, size_t cap)
{
	size_t used = 0;

	buf[0] = 0;
	for (size_t i = 0; i < ch->n_others && used < cap; i++)
		used += (size_t)snprintf(buf + used, cap - used, "%s%s (for %s)", i ? ", " : "",
		                         ch->others[i]->name, ch->others[i]->desc->kernel->backend);
	return buf;
}

/*
 * Keep in OUT the entries of E whose selector holds for DEV and that name
 * the built-in kernels or a variant for BACKEND, of the most specific
 * selector kind among those; the variants of the others that hold, for
 * other backends, in out->others.
 * 1 when any entry's selector holds for DEV, whatever its backend.
 */
static int pick(const struct entry *e, size_t n, const char *backend,
                const struct q4kh_device_record *dev, struct q4kh_kernel_choice *out)
{
	int best = 0, held = 0;

	out->n = 0;
	out->n_others = 0;
	for (size_t i = 0; i < n; i++) {
		int rk = rank(e[i].sel, dev);
		held |= rk > 0;
		if (e[i].variant && strcmp(e[i].variant->desc->kernel->backend, backend)) {
			if (rk)
				add_once(e[i].variant, out->others, &out->n_others, Q4KH_KERNEL_LIST);
			continue;
		}
		best = rk > best ? rk : best;
	}
	for (size_t i = 0; best && i < n; i++)
		if (rank(e[i].sel, dev) == best &&
		    (!e[i].variant || !strcmp(e[i].variant->desc->kernel->backend, backend)))
			out->names[out->n++] = e[i].variant ? e[i].variant->name : NULL;
	return held;
}

/* The config sections of a device, most specific first. */
static int from_config(const struct q4kh_registry *r, const struct q4kh_config *c,
                       const char *backend, const struct q4kh_device_record *dev,
                       struct q4kh_kernel_choice *out, struct q4kh_error *err)
{
	char sections[5][192];
	const char *sel[4] = { dev->uuid, NULL, dev->name, dev->arch };
	char index[16];

	snprintf(index, sizeof(index), "%u", dev->index);
	sel[1] = index;
	for (int i = 0; i < 5; i++) {
		struct entry e[Q4KH_KERNEL_LIST];
		const char *v;
		size_t n;

		if (i < 4 && !sel[i][0])
			continue;
		if (i < 4)
			snprintf(sections[i], sizeof(sections[i]), "gpu.%s", sel[i]);
		else
			snprintf(sections[i], sizeof(sections[i]), "gpu");
		v = q4kh_config_where(c, sections[i], "q4k_kernel", out->origin,
		                      sizeof(out->origin));
		if (!v || !*v)
			continue;
		if (parse_list(r, v, out->origin, 0, e, &n, err))
			return -1;
		pick(e, n, backend, dev, out);
		if (out->n) {
			out->source = Q4KH_KERNEL_CONFIG;
			return 1;
		}
	}
	return 0;
}

int q4kh_policy_kernel_choice(const struct q4kh_registry *r,
                              const struct q4kh_config *c, const char *cli,
                              const char *flag, const char *backend,
                              const struct q4kh_device_record *dev,
                              struct q4kh_kernel_choice *out,
                              struct q4kh_error *err)
{
	const char *env = q4kh_env(ENV_KERNEL);
	const char *values[2] = { cli, env && *env ? env : NULL };
	const char *names[2] = { flag ? flag : "--kernel", ENV_KERNEL };
	int rc;

	memset(out, 0, sizeof(*out));
	for (int i = 0; i < 2; i++) {
		struct entry e[Q4KH_KERNEL_LIST];
		size_t n;

		if (!values[i])
			continue;
		if (parse_list(r, values[i], names[i], 1, e, &n, err))
			return -1;
		/* A request that holds for the device claims it, even when it
		 * names only other backends' variants: it is never overruled. */
		if (pick(e, n, backend, dev, out)) {
			out->source = i == 0 ? Q4KH_KERNEL_CLI : Q4KH_KERNEL_ENV;
			snprintf(out->origin, sizeof(out->origin), "%s", names[i]);
			return 0;
		}
	}
	rc = c ? from_config(r, c, backend, dev, out, err) : 0;
	if (rc < 0)
		return -1;
	if (rc == 0) {
		out->source = Q4KH_KERNEL_DEFAULT;
		out->n = 0;
		snprintf(out->origin, sizeof(out->origin), "default");
	}
	return 0;
}

/* The record of every device of every backend R accepted; *n of them (malloc()ed). */
static struct q4kh_device_record *all_devices(const struct q4kh_registry *r, size_t *n)
{
	struct q4kh_device_record *devs = NULL;

	*n = 0;
	for (size_t i = 0; i < r->n_plugins; i++) {
		const struct q4kh_plugin *p = &r->plugins[i];
		uint32_t count = 0;

		if (p->state != Q4KH_PLUGIN_ACCEPTED || p->desc->kind != Q4KH_KIND_BACKEND ||
		    q4kh_backend_devices(p, &count, NULL))
			continue;
		for (uint32_t d = 0; d < count; d++) {
			struct q4kh_device_record *grown = realloc(devs, (*n + 1) * sizeof(*devs));
			struct q4kh_backend b;

			if (!grown)
				return devs;
			devs = grown;
			if (q4kh_backend_open(p, d, &b, NULL))
				continue;
			devs[*n] = b.record;
			devs[(*n)++].index = d;
			q4kh_backend_close(&b);
		}
	}
	return devs;
}

size_t q4kh_policy_unmatched_selectors(const struct q4kh_registry *r, const char *cli,
                                       const char *flag, char *buf, size_t cap)
{
	const char *env = q4kh_env(ENV_KERNEL);
	const char *values[2] = { cli, env && *env ? env : NULL };
	const char *names[2] = { flag ? flag : "--kernel", ENV_KERNEL };
	struct q4kh_device_record *devs = NULL;
	size_t n_devs = 0, found = 0, used = 0;
	char shown[4 * 128 + 8];
	int listed = 0;

	buf[0] = 0;
	for (int i = 0; i < 2; i++) {
		struct entry e[Q4KH_KERNEL_LIST];
		size_t n;

		if (!values[i] || !strchr(values[i], '=') ||
		    parse_list(r, values[i], names[i], 1, e, &n, NULL))
			continue; /* no selector, or an error reported where it is used */
		if (!listed) {
			devs = all_devices(r, &n_devs);
			listed = 1;
		}
		for (size_t j = 0; j < n && used < cap; j++) {
			size_t d = 0;

			while (d < n_devs && (!e[j].sel[0] || !rank(e[j].sel, &devs[d])))
				d++;
			if (!e[j].sel[0] || d < n_devs)
				continue;
			used += (size_t)snprintf(buf + used, cap - used, "%s%s: '%s'", found ? ", " : "",
			                         names[i],
			                         q4kh_show(shown, sizeof(shown), e[j].sel,
			                                   strlen(e[j].sel), 128, 0));
			found++;
		}
	}
	free(devs);
	return found;
}

/* Append a step for VARIANT (NULL: built-in) with its scores on B. */
static void add_step(struct q4kh_policy_order *o, const struct q4kh_registry *r,
                     const struct q4kh_backend *b, const char *variant, int named)
{
	struct q4kh_policy_step *s = &o->steps[o->n];
	struct q4kh_kernel k;
	struct q4kh_error err = { { 0 } };

	for (size_t i = 0; i < o->n; i++)
		if (o->steps[i].variant == variant ||
		    (variant && o->steps[i].variant && !strcmp(o->steps[i].variant, variant)))
			return; /* listed once, where it was first named */
	if (o->n == Q4KH_POLICY_STEPS)
		return;
	memset(s, 0, sizeof(*s));
	s->variant = variant;
	s->named = named;
	if (!variant) {
		for (uint32_t t = 0; t < Q4KH_TYPE_COUNT; t++)
			s->scores[t] = b->v->supports_type(b->ctx, t) ? 1 : 0;
	} else if (q4kh_kernel_open(find_variant(r, variant), b, &k, &err) == 0) {
		for (uint32_t i = 0; i < k.v->n_types; i++) {
			uint32_t t = k.v->types[i];
			if (t >= Q4KH_TYPE_COUNT)
				continue;
			s->scores[t] = k.v->score(k.ctx, &b->record, t);
			s->score = s->scores[t] > s->score ? s->scores[t] : s->score;
		}
		q4kh_kernel_close(&k);
	} else {
		s->init_failed = 1;
		snprintf(s->why_not, sizeof(s->why_not), "%.500s", err.msg);
	}
	o->n++;
}

int q4kh_policy_order(const struct q4kh_registry *r, const struct q4kh_config *c,
                      const char *cli, const char *flag, const struct q4kh_backend *b,
                      struct q4kh_policy_order *out, struct q4kh_error *err)
{
	const char *backend = q4kh_backend_kind(b->plugin);
	int names_builtin = 0;
	size_t first;

	memset(out, 0, sizeof(*out));
	if (q4kh_policy_kernel_choice(r, c, cli, flag, backend, &b->record, &out->choice, err))
		return -1;
	out->explicit_request = out->choice.source == Q4KH_KERNEL_CLI ||
	                        out->choice.source == Q4KH_KERNEL_ENV;
	for (size_t i = 0; i < out->choice.n; i++) {
		add_step(out, r, b, out->choice.names[i], 1);
		names_builtin |= !out->choice.names[i];
	}
	if (out->explicit_request || names_builtin)
		return 0;
	first = out->n;
	for (size_t i = 0; i < r->n_plugins; i++) {
		const struct q4kh_plugin *p = &r->plugins[i];
		size_t before = out->n;

		if (p->state != Q4KH_PLUGIN_ACCEPTED || p->desc->kind != Q4KH_KIND_KERNEL ||
		    strcmp(p->desc->kernel->backend, backend))
			continue;
		add_step(out, r, b, p->name, 0);
		if (out->n == before)
			continue;
		if (out->steps[before].score == 0 && !out->steps[before].init_failed) {
			out->n--; /* cannot run on this device */
			continue;
		}
		/* Insertion keeps the highest score first, path order on ties. */
		for (size_t j = before; j > first && out->steps[j].score > out->steps[j - 1].score; j--) {
			struct q4kh_policy_step t = out->steps[j];
			out->steps[j] = out->steps[j - 1];
			out->steps[j - 1] = t;
		}
	}
	add_step(out, r, b, NULL, 0);
	return 0;
}

const char *q4kh_policy_step_why(const struct q4kh_policy_order *o,
                                 const struct q4kh_policy_step *s, char *buf,
                                 size_t cap)
{
	if (s->variant && s->named)
		snprintf(buf, cap, "named by %s", o->choice.origin);
	else if (s->variant && s->init_failed)
		snprintf(buf, cap, "would not start: %s", s->why_not);
	else if (s->variant)
		snprintf(buf, cap, "by score (%u)", s->score);
	else if (s->named)
		snprintf(buf, cap, "the built-in kernels, named by %s", o->choice.origin);
	else
		snprintf(buf, cap, "the built-in kernels");
	return buf;
}

static int model_has_type(const struct q4kh_model *m, uint32_t type)
{
	uint32_t types[Q4KH_TYPE_COUNT];
	size_t n = q4kh_model_matrix_types(m, types, Q4KH_TYPE_COUNT);

	for (size_t i = 0; i < n; i++)
		if (types[i] == type)
			return 1;
	return 0;
}

/*
 * Open variant NAME on B into K, and *N_TYPES = the TYPES (Q4KH_TYPE_COUNT
 * at most) of M it takes: those it scores above 0 on B. -1 with ERR when
 * it cannot be opened, or when it takes none (then K is closed and M's
 * weights are back on the built-in kernels).
 */
static int open_variant(const struct q4kh_registry *r, const struct q4kh_backend *b,
                        struct q4kh_model *m, const char *name,
                        struct q4kh_kernel *k, uint32_t *types, size_t *n_types,
                        struct q4kh_error *err)
{
	const struct q4kh_plugin *p = q4kh_registry_find(r, name);
	char list[512], why[700];

	*n_types = 0;
	if (!p || p->desc->kind != Q4KH_KIND_KERNEL) {
		q4kh_policy_list_variants(r, list, sizeof(list));
		q4kh_registry_why_absent(r, name, why, sizeof(why));
		return q4kh_fail(err, "kernel variant '%s' was not found on plugin path %s (%s)%s%s; found: %s",
		                 name, r->path, r->path_origin, why[0] ? ": " : "", why, list);
	}
	if (q4kh_kernel_open(p, b, k, err))
		return -1;
	for (uint32_t i = 0; i < k->v->n_types && *n_types < Q4KH_TYPE_COUNT; i++) {
		uint32_t t = k->v->types[i];

		if (model_has_type(m, t) && k->v->score(k->ctx, &b->record, t) > 0)
			types[(*n_types)++] = t;
	}
	if (!*n_types) {
		q4kh_fail(err, "kernel variant %s cannot serve this request: the model has none of its types, or it scores 0 for them on %s (%s)",
		          name, b->record.name, b->record.arch);
		q4kh_model_release_kernels(m);
		q4kh_kernel_close(k);
		return -1;
	}
	return 0;
}

int q4kh_policy_use_kernel(const struct q4kh_registry *r,
                           const struct q4kh_backend *b, struct q4kh_model *m,
                           const char *name, struct q4kh_kernel *k,
                           struct q4kh_error *err)
{
	uint32_t types[Q4KH_TYPE_COUNT];
	size_t n;

	if (open_variant(r, b, m, name, k, types, &n, err))
		return -1;
	for (size_t i = 0; i < n; i++)
		if (q4kh_model_use_kernel(m, k, types[i], err))
			goto fail;
	return 0;
fail:
	q4kh_model_release_kernels(m);
	q4kh_kernel_close(k);
	return -1;
}

int q4kh_policy_upload(const struct q4kh_registry *r, struct q4kh_backend *b,
                       struct q4kh_model *m, const char *name,
                       struct q4kh_kernel *k, struct q4kh_error *err)
{
	uint32_t types[Q4KH_TYPE_COUNT];
	size_t n;

	if (!name)
		return q4kh_model_upload(m, b, err);
	if (open_variant(r, b, m, name, k, types, &n, err))
		return -1;
	if (q4kh_model_upload_for(m, b, k, types, n, err)) {
		q4kh_model_release_kernels(m);
		q4kh_kernel_close(k);
		return -1;
	}
	return 0;
}
