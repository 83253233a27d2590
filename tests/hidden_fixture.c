/* Hidden-state fixtures: tests/hidden_fixture.h. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>

#include "helpers.h"
#include "hidden_fixture.h"

char *fixture(const char *name)
{
	char *path;

	cr_assert_geq(asprintf(&path, "%s/tests/fixtures/%s", test_srcdir(), name), 0);
	return path;
}

void hidden_fixture_load(const char *name, struct hidden_fixture *o)
{
	char file[256];
	char *path;
	json_error_t jerr;
	size_t len;

	snprintf(file, sizeof(file), "%s.json", name);
	path = fixture(file);
	o->root = json_load_file(path, 0, &jerr);
	cr_assert_not_null(o->root, "%s:%d: %s", path, jerr.line, jerr.text);
	o->n_embd = json_integer_value(json_object_get(o->root, "n_embd"));
	o->n_vocab = json_integer_value(json_object_get(o->root, "n_vocab"));
	o->rows = (size_t)json_integer_value(json_object_get(o->root, "hidden_rows"));
	free(path);
	snprintf(file, sizeof(file), "%s.bin", name);
	path = fixture(file);
	o->hidden = test_read_file(path, &len);
	cr_assert_not_null(o->hidden, "cannot read %s", path);
	cr_assert_eq(len, o->rows * o->n_embd * sizeof(float),
	             "%s: size %zu, expected %zu rows of %lld floats", path, len, o->rows,
	             (long long)o->n_embd);
	free(path);
}

void hidden_fixture_free(struct hidden_fixture *o)
{
	json_decref(o->root);
	free(o->hidden);
}
