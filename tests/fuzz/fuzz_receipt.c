/*
 * Fuzz target: the F2 receipt reader (receipt.c, JSON through jansson) and
 * its check (receipt_check.c). The input is the receipt file of one
 * candidate. A receipt that loads is compared with a key of our own (as
 * the guard does), checked against the plan of the built-in probe its key
 * names (its probe tokens, then its decode steps), written again and read
 * back: the second reading must equal the first, field by field (a
 * point's cosine to the last bit, which receipts keep), and must be as
 * believable as the first, since the guard trusts a receipt it wrote
 * itself. The input is the receipt's content (the JSON object up to its
 * last member, without its closing brace: the seeds): it is sealed with a
 * key of the target's before it is read (receipt_mac.h), so that the
 * parser, not the MAC, is what is fuzzed; the unsealed input is read too,
 * and must be refused.
 */
#include "fuzz.h"

#include <math.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "hash.h"
#include "receipt.h"
#include "receipt_check.h"

#define ID "0123abcd cuda cuda-mwv GPU-5c7a"

/* The file q4kh_receipt_load reads for ID in DIR (receipt.h: the first
 * 32 hex digits of the SHA-256 of the identity). */
static void receipt_file(const char *dir, char *buf, size_t cap)
{
	char hex[Q4KH_SHA256_HEX];

	q4kh_sha256_bytes(ID, strlen(ID), hex);
	snprintf(buf, cap, "%s/%.32s.json", dir, hex);
}

static int same_double(double a, double b)
{
	return a == b || (isnan(a) && isnan(b));
}

static void check_same(const struct q4kh_receipt *a, const struct q4kh_receipt *b)
{
	char why[256];

	if (q4kh_receipt_key_diff(&a->key, &b->key, why, sizeof(why)))
		fuzz_violation("a rewritten receipt's key differs: %s", why);
	if (a->verdict != b->verdict || !same_double(a->min_cosine, b->min_cosine) ||
	    a->worst_position != b->worst_position ||
	    a->worst_decode_step != b->worst_decode_step ||
	    a->near_ties != b->near_ties || !same_double(a->seconds, b->seconds) ||
	    strcmp(a->message, b->message) || a->n_points != b->n_points)
		fuzz_violation("a rewritten receipt reads back differently");
	for (int64_t i = 0; i < a->n_points; i++) {
		const struct q4kh_receipt_point *p = &a->points[i], *q = &b->points[i];
		if (!same_double(p->cosine, q->cosine) || p->decode_step != q->decode_step ||
		    p->verdict != q->verdict || p->judged != q->judged ||
		    p->near_tie != q->near_tie)
			fuzz_violation("point %lld of a rewritten receipt differs",
			               (long long)i);
	}
}

/* Whether R is believable on the built-in probe's plan of its own key;
 * a void one must say why in one line. */
static int believed(const char *path, const struct q4kh_receipt *r)
{
	const struct q4kh_f2_plan plan = { .prefill = r->key.probe_tokens,
	                                   .decode_steps = r->key.decode_steps };
	struct q4kh_error err = { { 0 } };
	int rc = q4kh_receipt_check(path, r, &plan, &err);

	if (rc)
		fuzz_check_error(&err, "q4kh_receipt_check");
	return rc == 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static const struct q4kh_receipt_mac key = { "fuzz key, 32 bytes, not secret", "" };
	char in[4200], out[4200], path[4300], why[256], mac[Q4KH_RECEIPT_MAC_HEX];
	struct q4kh_receipt r, again;
	struct q4kh_receipt_key mine;
	struct q4kh_error err;
	FILE *f;
	int rc, trusted;

	snprintf(in, sizeof(in), "%s/in", fuzz_tmpdir());
	snprintf(out, sizeof(out), "%s/out", fuzz_tmpdir());
	mkdir(in, 0700);
	receipt_file(in, path, sizeof(path));
	f = fopen(path, "wb");
	if (!f || fwrite(data, 1, size, f) != size || fclose(f) != 0)
		fuzz_violation("cannot write %s", path);
	if (q4kh_receipt_load(in, ID, &key, &r, &err) == 0)
		fuzz_violation("an unsealed receipt was read");
	fuzz_check_error(&err, "q4kh_receipt_load");
	q4kh_receipt_mac_of(&key, data, size, mac);
	f = fopen(path, "ab");
	if (!f || fprintf(f, "%s%s%s", Q4KH_RECEIPT_MAC_START, mac, Q4KH_RECEIPT_MAC_END) < 0 ||
	    fclose(f) != 0)
		fuzz_violation("cannot seal %s", path);
	rc = q4kh_receipt_load(in, ID, &key, &r, &err);
	if (rc != 0) {
		fuzz_check_error(&err, "q4kh_receipt_load");
		return 0;
	}
	memset(&mine, 0, sizeof(mine));
	snprintf(mine.model_sha256, sizeof(mine.model_sha256), "%064d", 0);
	q4kh_receipt_key_diff(&r.key, &mine, why, sizeof(why));
	q4kh_receipt_key_diff(&mine, &r.key, why, sizeof(why));
	if (q4kh_receipt_save(out, ID, &key, &r, &err))
		fuzz_violation("a receipt that loaded cannot be written: %s", err.msg);
	trusted = believed(path, &r);
	if (q4kh_receipt_load(out, ID, &key, &again, &err) != 0)
		fuzz_violation("a receipt we wrote does not load: %s", err.msg);
	check_same(&r, &again);
	if (trusted && !believed(path, &again))
		fuzz_violation("a believable receipt, written again, is void");
	q4kh_receipt_free(&r);
	q4kh_receipt_free(&again);
	return 0;
}
