/*
 * The F2 guard: its rules on constructed logit vectors (every number below
 * is computed here from the vectors, never taken from a run), the floors
 * of the arithmetic classes (docs/f2.md, "Floors that follow the
 * arithmetic": the figures there), and whole runs of the reference
 * against real kernel variants for the cpu backend, one correct and
 * several with planted defects (tests/plugins).
 */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "f2.h"
#include "guard.h"
#include "helpers.h"
#include "kernel.h"
#include "model.h"
#include "policy.h"
#include "session.h"
#include "tokenizer.h"

#define N 4096

static void rules(struct q4kh_f2_rules *r)
{
	q4kh_f2_rules_default(r);
}

/* A reference vector with a clear winner at index 7 (margin 3). */
static void reference(float *v)
{
	for (int i = 0; i < N; i++)
		v[i] = (float)sin(i * 0.37) * 2.0f;
	v[7] = 9.0f;
	v[8] = 6.0f;
}

/* cand = ref + e * u, u orthogonal to ref with |u| = |ref|: cosine 1/sqrt(1+e^2). */
static void at_cosine(const float *ref, float *cand, double cosine)
{
	double e = sqrt(1.0 / (cosine * cosine) - 1.0), rr = 0, ru = 0, uu = 0;
	float *u = malloc(sizeof(float) * N);

	for (int i = 0; i < N; i++) {
		u[i] = (float)cos(i * 1.91 + 0.3);
		rr += (double)ref[i] * ref[i];
		ru += (double)ref[i] * u[i];
	}
	for (int i = 0; i < N; i++) {
		u[i] -= (float)(ru / rr) * ref[i];
		uu += (double)u[i] * u[i];
	}
	for (int i = 0; i < N; i++)
		cand[i] = ref[i] + (float)(e * sqrt(rr / uu)) * u[i];
	free(u);
}

static struct q4kh_f2_point judge(const float *ref, const float *cand)
{
	struct q4kh_f2_rules r;
	struct q4kh_f2_point pt = { .position = 5, .decode_step = -1, .judged = 1 };

	rules(&r);
	q4kh_f2_judge(ref, cand, N, &r, &pt);
	return pt;
}

static void describe(const struct q4kh_f2_point *pt, char *buf, size_t cap)
{
	struct q4kh_f2_rules r;
	rules(&r);
	q4kh_f2_describe(pt, &r, buf, cap);
}

Test(f2_rules, identical_vectors_pass)
{
	float ref[N];
	struct q4kh_f2_point pt;

	reference(ref);
	pt = judge(ref, ref);
	cr_expect_eq(pt.verdict, Q4KH_F2_PASS);
	cr_expect_float_eq(pt.cosine, 1.0, 1e-12);
	cr_expect_eq(pt.ref_argmax, 7);
	cr_expect_float_eq(pt.ref_margin, 3.0, 1e-6);
}

Test(f2_rules, nan_inf_and_zero_norm_always_reject)
{
	float ref[N], cand[N];
	struct q4kh_f2_point pt;
	char msg[512];

	reference(ref);
	memcpy(cand, ref, sizeof(cand));
	cand[100] = NAN; /* every other logit identical: a '<' on NaN must not pass it */
	pt = judge(ref, cand);
	cr_expect_eq(pt.verdict, Q4KH_F2_REJECT);
	cr_expect_str_eq(pt.rule, "F2.1");
	describe(&pt, msg, sizeof(msg));
	cr_expect_str_eq(msg, "position 5 (prefill): argmax 7 (agrees), candidate logits hold NaN or Inf (F2.1)");
	cand[100] = INFINITY;
	cr_expect_eq(judge(ref, cand).verdict, Q4KH_F2_REJECT);
	memcpy(cand, ref, sizeof(cand));
	ref[3] = -INFINITY;
	pt = judge(ref, cand);
	cr_expect_eq(pt.nonfinite, 2, "the reference side is named");
	reference(ref);
	memset(cand, 0, sizeof(cand));
	pt = judge(ref, cand);
	cr_expect_eq(pt.verdict, Q4KH_F2_REJECT);
	cr_expect(pt.zero_norm);
}

Test(f2_rules, floors_and_their_messages)
{
	float ref[N], cand[N];
	struct q4kh_f2_point pt;
	char msg[512], want[512];

	reference(ref);
	at_cosine(ref, cand, 0.85);
	pt = judge(ref, cand);
	cr_expect_eq(pt.verdict, Q4KH_F2_BROKEN);
	cr_expect_float_eq(pt.cosine, 0.85, 1e-4);
	describe(&pt, msg, sizeof(msg));
	snprintf(want, sizeof(want), "position 5 (prefill): argmax %d%s, cosine %.4f < 0.90 catastrophic floor",
	         pt.ref_argmax, pt.ref_argmax == pt.cand_argmax ? " (agrees)" : "", pt.cosine);
	if (pt.ref_argmax == pt.cand_argmax)
		cr_expect_str_eq(msg, want);
	at_cosine(ref, cand, 0.93);
	pt = judge(ref, cand);
	cr_expect_eq(pt.verdict, Q4KH_F2_REJECT);
	describe(&pt, msg, sizeof(msg));
	cr_expect(strstr(msg, "< 0.95 acceptance floor") != NULL, "%s", msg);
	at_cosine(ref, cand, 0.97);
	cr_expect_eq(judge(ref, cand).verdict, Q4KH_F2_PASS);
}

/* docs/f2.md's table of floors, class by class. */
static const struct {
	uint32_t arith;
	const char *floor; /* as docs/f2.md writes it */
	const char *source;
} class_floors[] = {
	{ Q4KH_ARITH_EXACT, "0.999999", "exact arithmetic" },
	{ Q4KH_ARITH_F32, "0.99999", "f32 arithmetic" },
	{ Q4KH_ARITH_F16, "0.9999", "f16 arithmetic" },
	{ Q4KH_ARITH_INT16, "0.9999", "int16 arithmetic" },
	{ Q4KH_ARITH_INT8, "0.99", "int8 arithmetic" },
	{ Q4KH_ARITH_UNDECLARED, "0.95", "no arithmetic class declared" },
};

/*
 * A candidate a twentieth of its class's distance from 1 under the floor
 * is rejected, naming the floor and the class; as far above it passes.
 * The floor is docs/f2.md's, read back as text, not the host's constant.
 */
Test(f2_rules, each_class_rejects_just_under_its_floor_and_passes_just_above)
{
	float ref[N], cand[N];

	reference(ref);
	for (size_t i = 0; i < sizeof(class_floors) / sizeof(class_floors[0]); i++) {
		const double floor = strtod(class_floors[i].floor, NULL), room = (1 - floor) / 20;
		struct q4kh_f2_rules r;
		struct q4kh_f2_point pt = { .position = 5, .decode_step = -1, .judged = 1 };
		char msg[512], want[160];

		q4kh_f2_rules_default(&r);
		q4kh_f2_rules_class(&r, class_floors[i].arith);
		cr_expect_eq(r.floor, floor, "%s: floor %.9g", class_floors[i].source, r.floor);
		at_cosine(ref, cand, floor - room);
		q4kh_f2_judge(ref, cand, N, &r, &pt);
		cr_assert_float_eq(pt.cosine, floor - room, room / 10, "the vectors are built as meant");
		cr_expect_eq(pt.verdict, Q4KH_F2_REJECT, "%s at %.9f", class_floors[i].source,
		             pt.cosine);
		q4kh_f2_describe(&pt, &r, msg, sizeof(msg));
		snprintf(want, sizeof(want), " < %s acceptance floor (%s)", class_floors[i].floor,
		         class_floors[i].source);
		cr_expect(strstr(msg, want) != NULL, "'%s' lacks '%s'", msg, want);
		at_cosine(ref, cand, floor + room);
		q4kh_f2_judge(ref, cand, N, &r, &pt);
		cr_expect_eq(pt.verdict, Q4KH_F2_PASS, "%s at %.9f", class_floors[i].source,
		             pt.cosine);
	}
}

/* Rules without a class are the floor F2 had before classes: 0.95. */
Test(f2_rules, an_undeclared_path_keeps_the_default_floor)
{
	struct q4kh_f2_rules r;

	q4kh_f2_rules_default(&r);
	cr_expect_eq(r.arith, Q4KH_ARITH_UNDECLARED);
	cr_expect_eq(r.floor, 0.95);
	cr_expect_str_eq(q4kh_f2_floor_source(&r), "no arithmetic class declared");
	r.floor_set = 1;
	cr_expect_str_eq(q4kh_f2_floor_source(&r), "set by f2_floor");
}

/* A path's class is its coarser part's; a part that declares nothing, or
 * a class this host does not know, makes the path undeclared. */
Test(f2_rules, a_path_takes_the_coarser_class_of_its_parts)
{
	cr_expect_eq(q4kh_f2_arith_coarsest(Q4KH_ARITH_EXACT, Q4KH_ARITH_INT16), Q4KH_ARITH_INT16);
	cr_expect_eq(q4kh_f2_arith_coarsest(Q4KH_ARITH_F16, Q4KH_ARITH_INT16), Q4KH_ARITH_INT16);
	cr_expect_eq(q4kh_f2_arith_coarsest(Q4KH_ARITH_F16, Q4KH_ARITH_F32), Q4KH_ARITH_F16);
	cr_expect_eq(q4kh_f2_arith_coarsest(Q4KH_ARITH_INT8, Q4KH_ARITH_F16), Q4KH_ARITH_INT8);
	cr_expect_eq(q4kh_f2_arith_coarsest(Q4KH_ARITH_EXACT, Q4KH_ARITH_UNDECLARED),
	             Q4KH_ARITH_UNDECLARED);
	cr_expect_eq(q4kh_f2_arith_coarsest(Q4KH_ARITH_UNDECLARED, Q4KH_ARITH_INT8),
	             Q4KH_ARITH_UNDECLARED);
	cr_expect_not(q4kh_f2_arith_known(Q4KH_ARITH_INT8 + 1));
	cr_expect_eq(q4kh_f2_arith_floor(Q4KH_ARITH_INT8 + 1), 0.95);
	/* a coarser class never has a tighter floor than a finer one */
	for (uint32_t a = Q4KH_ARITH_EXACT; a < Q4KH_ARITH_INT8; a++)
		cr_expect_geq(q4kh_f2_arith_floor(a), q4kh_f2_arith_floor(a + 1), "%s", q4kh_f2_arith_name(a));
}

Test(f2_rules, the_example_line_of_the_design)
{
	struct q4kh_f2_rules r;
	struct q4kh_f2_point pt = {
		.position = 64, .decode_step = 0, .judged = 1, .cosine = 0.8675,
		.ref_argmax = 74455, .cand_argmax = 74455, .verdict = Q4KH_F2_BROKEN,
	};
	char msg[512];

	rules(&r);
	q4kh_f2_describe(&pt, &r, msg, sizeof(msg));
	cr_expect_str_eq(msg, "position 64 (decode step 0): argmax 74455 (agrees), cosine 0.8675 < 0.90 catastrophic floor");
}

Test(f2_rules, agreeing_argmaxes_are_never_printed_as_different)
{
	float ref[N], cand[N];
	const double cosines[] = { 0.5, 0.89, 0.9, 0.94, 0.951, 0.99, 1.0 };

	reference(ref);
	for (size_t i = 0; i < sizeof(cosines) / sizeof(cosines[0]); i++) {
		struct q4kh_f2_point pt;
		char msg[512], ne[64];

		at_cosine(ref, cand, cosines[i]);
		pt = judge(ref, cand);
		describe(&pt, msg, sizeof(msg));
		snprintf(ne, sizeof(ne), "%d != %d", pt.ref_argmax, pt.cand_argmax);
		cr_expect_null(strstr(msg, "!="), "%s", msg);
		if (pt.ref_argmax == pt.cand_argmax)
			cr_expect(strstr(msg, "(agrees)") != NULL, "%s", msg);
		else
			cr_expect(strstr(msg, "(reference) vs") != NULL, "%s", msg);
		(void)ne;
	}
}

Test(f2_rules, argmax_flips_are_tolerated_only_as_near_ties)
{
	float ref[N], cand[N];
	struct q4kh_f2_point pt;
	char msg[512];

	reference(ref);
	ref[8] = 8.7f; /* reference gap 0.3: a near-tie */
	memcpy(cand, ref, sizeof(cand));
	cand[8] = 9.2f;
	pt = judge(ref, cand);
	cr_expect_eq(pt.verdict, Q4KH_F2_PASS);
	cr_expect(pt.near_tie);
	cr_expect_float_eq(pt.ref_gap, 0.3, 1e-5);
	ref[8] = 6.0f; /* gap 3: the same flip now rejects */
	memcpy(cand, ref, sizeof(cand));
	cand[8] = 9.2f;
	pt = judge(ref, cand);
	cr_expect_geq(pt.cosine, 0.98);
	cr_expect_eq(pt.verdict, Q4KH_F2_REJECT);
	cr_expect_str_eq(pt.rule, "F2.3");
	describe(&pt, msg, sizeof(msg));
	cr_expect(strstr(msg, "argmax 7 (reference) vs 8 (candidate), reference gap 3.000") != NULL,
	          "%s", msg);
}

Test(f2_rules, position_zero_is_reported_but_not_judged)
{
	float ref[N], cand[N];
	struct q4kh_f2_rules r;
	struct q4kh_f2_point pt = { .position = 0, .decode_step = -1, .judged = 0 };

	rules(&r);
	reference(ref);
	at_cosine(ref, cand, 0.5);
	q4kh_f2_judge(ref, cand, N, &r, &pt);
	cr_expect_eq(pt.verdict, Q4KH_F2_PASS);
	cr_expect_float_eq(pt.cosine, 0.5, 1e-4, "still measured for the report");
}

/* What a receipt keeps of P (receipt.h): its cosine, decode step,
 * verdict, near-tie and whether it was judged; nothing else. */
static struct q4kh_f2_point as_kept(const struct q4kh_f2_point *p)
{
	return (struct q4kh_f2_point){ .position = p->position, .decode_step = p->decode_step,
		                       .cosine = p->cosine, .judged = p->judged,
		                       .computed = p->computed, .near_tie = p->near_tie,
		                       .verdict = p->verdict };
}

/* The deciding point of each case below: CAND, from REF, as the case
 * says; REF itself may change (a NaN on the reference's side). */
static void make_case(int c, float *ref, float *cand)
{
	reference(ref);
	memcpy(cand, ref, sizeof(float) * N);
	switch (c) {
	case 0: /* a tolerated near-tie, the lowest cosine of a pass */
		ref[8] = 8.7f;
		memcpy(cand, ref, sizeof(float) * N);
		cand[8] = 9.2f;
		break;
	case 1: /* F2.3 */
		cand[8] = 9.2f;
		break;
	case 2: /* F2.1, candidate */
		cand[100] = NAN;
		break;
	case 3: /* F2.1, reference */
		ref[100] = INFINITY;
		break;
	case 4: /* F2.1, zeros */
		memset(cand, 0, sizeof(float) * N);
		break;
	case 5: /* F2.2 */
		at_cosine(ref, cand, 0.93);
		break;
	default: /* broken */
		at_cosine(ref, cand, 0.5);
	}
}

/* MSG with the digit after AFTER changed (when MSG has AFTER): a number
 * the points decide, which must then not match RES. */
static void expect_altered(const char *msg, const char *after, const struct q4kh_f2_result *res,
                           const struct q4kh_f2_rules *r, int c, const char *site)
{
	char altered[512], *d;

	snprintf(altered, sizeof(altered), "%s", msg);
	if (!(d = strstr(altered, after)))
		return;
	d += strlen(after);
	cr_assert(*d >= '0' && *d <= '9', "case %d: no digit after '%s': %s", c, after, msg);
	*d = *d == '9' ? '8' : (char)(*d + 1);
	cr_expect(!q4kh_f2_message_matches(altered, res, r), "case %d, %s: '%s' changed, matched: %s",
	          c, site, after, altered);
}

/*
 * A receipt keeps of each point its cosine, decode step, verdict and
 * near-tie: q4kh_f2_message_matches must find the message q4kh_f2_conclude
 * wrote in what that leaves, whatever decided (a pass's lowest near-tie,
 * F2.3, each F2.1, F2.2, broken; in prefill, in a narrow step, in a decode
 * step), and must not once a number the points decide changes in it (the
 * position, the decode step, the cosine, a pass's counts).
 */
Test(f2_rules, a_conclusion_is_found_again_in_what_a_receipt_keeps)
{
	static const char *const sites[] = { "prefill", "narrow", "decode" };
	static const char *const numbers[] = { "position ", "decode step ", "cosine 0.",
		                               "pass over ", "positions, " };
	struct q4kh_f2_rules r;

	rules(&r);
	for (int c = 0; c < 7; c++)
		for (int s = 0; s < 3; s++) {
			float ref[N], cand[N], same[N];
			struct q4kh_f2_point pts[4], kept[4];
			struct q4kh_f2_result res = { .points = pts, .n_points = 4 };
			struct q4kh_f2_result from_receipt = { .points = kept, .n_points = 4 };
			const int at = s == 2 ? 3 : 1;

			reference(same);
			make_case(c, ref, cand);
			for (int i = 0; i < 4; i++) {
				pts[i] = (struct q4kh_f2_point){ .position = i,
					                         .decode_step = i < 3 ? -1 : 0,
					                         .judged = i >= 1 };
				if (i == at)
					q4kh_f2_judge(ref, cand, N, &r, &pts[i]);
				else
					q4kh_f2_judge(same, same, N, &r, &pts[i]);
			}
			pts[at].narrow = s == 1 ? 3 : 0;
			q4kh_f2_conclude(&res, &r);
			cr_assert_eq(res.worst, at, "case %d: decided at %lld", c, (long long)res.worst);
			for (int i = 0; i < 4; i++)
				kept[i] = as_kept(&pts[i]);
			q4kh_f2_conclude(&from_receipt, &r);
			cr_expect(q4kh_f2_message_matches(res.message, &from_receipt, &r),
			          "case %d, %s: not found again: %s", c, sites[s], res.message);
			for (size_t k = 0; k < sizeof(numbers) / sizeof(numbers[0]); k++)
				expect_altered(res.message, numbers[k], &from_receipt, &r, c, sites[s]);
		}
}

/* --- the class of a path, from its plugins' tables ---------------------- */

static struct q4kh_registry *class_reg;

static void setup_classes(void)
{
	char path[8192];
	struct q4kh_error err = { { 0 } };

	snprintf(path, sizeof(path), "%s/plugins/cpu/.libs:%s/plugins/cpu-fast/.libs:"
	         "%s/plugins/cpu-simd/.libs:%s/tests/plugins/.libs", test_builddir(),
	         test_builddir(), test_builddir(), test_builddir());
	cr_assert_eq(q4kh_registry_scan(path, NULL, &class_reg, &err), 0, "%s", err.msg);
}

static void teardown_classes(void)
{
	q4kh_registry_free(class_reg);
}

TestSuite(f2_classes, .init = setup_classes, .fini = teardown_classes);

static uint32_t path_class(const char *backend, const char *variant)
{
	const struct q4kh_candidate c = { .backend = backend, .variant = variant };

	cr_assert_not_null(q4kh_registry_find(class_reg, backend), "%s", backend);
	cr_assert(!variant || q4kh_registry_find(class_reg, variant), "%s", variant);
	return q4kh_guard_arith(class_reg, &c);
}

/* What each in-tree path declares (docs/f2.md's table of classes). */
Test(f2_classes, each_path_is_judged_at_the_class_its_plugins_declare)
{
	cr_expect_eq(path_class("cpu", NULL), Q4KH_ARITH_EXACT);
	cr_expect_eq(path_class("cpu", "cpu-simd"), Q4KH_ARITH_INT16);
	cr_expect_eq(path_class("cpu", "cpu-q8act"), Q4KH_ARITH_INT8);
	cr_expect_eq(path_class("cpu-fast", NULL), Q4KH_ARITH_F16);
	cr_expect_eq(path_class("cpu-fast", "cpu-simd"), Q4KH_ARITH_INT16);
	cr_expect_eq(path_class("cpu-fast", "cpu-q8act"), Q4KH_ARITH_INT8);
	cr_expect_eq(path_class("replay-ok", NULL), Q4KH_ARITH_F16);
	/* the planted defects claim what they compute with, and get its floor */
	cr_expect_eq(path_class("cpu", "defect-noisy"), Q4KH_ARITH_F32);
	cr_expect_eq(path_class("replay-prompt-gate", NULL), Q4KH_ARITH_F16);
}

/* A plugin that declares nothing, or a class this host does not know,
 * leaves its path undeclared: F2's default floor. */
Test(f2_classes, an_undeclared_part_leaves_the_path_at_the_default_floor)
{
	struct q4kh_f2_rules r;
	struct q4kh_error err = { { 0 } };

	/* ABI 1.1: its table ends before arith */
	cr_expect_eq(path_class("replay-v1-1", NULL), Q4KH_ARITH_UNDECLARED);
	/* kernel-ok declares a class past INT8, a later minor's */
	cr_expect_eq(path_class("cpu", "kernel-ok"), Q4KH_ARITH_UNDECLARED);
	cr_assert_eq(q4kh_guard_rules_where(NULL, "replay-v1-1",
	                                    path_class("replay-v1-1", NULL), &r, NULL, &err),
	             0, "%s", err.msg);
	cr_expect_eq(r.floor, 0.95);
}

/*
 * --- whole runs ----------------------------------------------------------
 * On the tiny llama model (f2_runs), where the planted defects act on its
 * LM head as on the default model's and a run takes a second; on the
 * default model (f2_runs_gemma) the two whose point is that model: the
 * flip, whose wide margin at a cosine above 0.98 the default model's
 * logits give (the tiny model's flip costs more cosine, under 0.98), and
 * the KV defect, which spoils Q8_0 value projections that the tiny model
 * lacks.
 */

#define PROBE "The quick brown fox jumps over the lazy dog. Water boils at one hundred degrees Celsius at sea level, and"

struct side {
	struct q4kh_backend be;
	struct q4kh_model *m;
	struct q4kh_session *s;
	struct q4kh_kernel k;
};

static struct q4kh_registry *reg;
static const char *model_path; /* the suite's model */
static struct side ref_side;
static int32_t *probe;
static size_t n_probe;

static void side_open(struct side *sd, const char *variant)
{
	struct q4kh_error err = { { 0 } };
	struct q4kh_session_params sp = { .n_ctx = 96 };

	memset(sd, 0, sizeof(*sd));
	cr_assert_eq(q4kh_backend_open(q4kh_registry_find(reg, "cpu"), 0, &sd->be, &err), 0,
	             "%s", err.msg);
	cr_assert_eq(q4kh_model_open(model_path, &sd->m, &err), 0, "%s", err.msg);
	cr_assert_eq(q4kh_model_upload(sd->m, &sd->be, &err), 0, "%s", err.msg);
	if (variant)
		cr_assert_eq(q4kh_policy_use_kernel(reg, &sd->be, sd->m, variant, &sd->k, &err),
		             0, "%s", err.msg);
	cr_assert_eq(q4kh_session_new(sd->m, &sp, &sd->s, &err), 0, "%s", err.msg);
}

static void side_close(struct side *sd)
{
	q4kh_session_free(sd->s);
	q4kh_model_free(sd->m);
	q4kh_kernel_close(&sd->k);
	q4kh_backend_close(&sd->be);
}

/* The reference side on MODEL, the registry and the probe's tokens. */
static void setup_runs_on(const char *model)
{
	char path[8192];
	struct q4kh_error err = { { 0 } };
	struct q4kh_tokenizer *tok;

	snprintf(path, sizeof(path), "%s/plugins/cpu/.libs:%s/tests/plugins/.libs",
	         test_builddir(), test_builddir());
	cr_assert_eq(q4kh_registry_scan(path, NULL, &reg, &err), 0, "%s", err.msg);
	model_path = model;
	side_open(&ref_side, NULL);
	cr_assert_eq(q4kh_tokenizer_load(ref_side.m->gguf, &tok, &err), 0, "%s", err.msg);
	cr_assert_eq(q4kh_tokenize(tok, PROBE, strlen(PROBE), 1, 0, &probe, &n_probe, &err), 0,
	             "%s", err.msg);
	q4kh_tokenizer_free(tok);
}

static void setup_runs(void)
{
	static char tiny[4200];

	snprintf(tiny, sizeof(tiny), "%s/tests/fixtures/tiny-llama.gguf", test_srcdir());
	setup_runs_on(tiny);
}

static void setup_runs_gemma(void)
{
	setup_runs_on(test_model_path());
}

static void teardown_runs(void)
{
	side_close(&ref_side);
	q4kh_registry_free(reg);
	free(probe);
}

/* Run F2 for VARIANT at acceptance FLOOR; the result is the caller's. */
static struct q4kh_f2_result guard(const char *variant, double floor)
{
	struct side cand;
	struct q4kh_f2_rules r;
	struct q4kh_f2_result res;
	struct q4kh_error err = { { 0 } };
	struct q4kh_f2_ref ref;

	q4kh_f2_rules_default(&r);
	r.floor = floor;
	side_open(&cand, variant);
	q4kh_f2_ref_live(&ref, ref_side.s);
	cr_assert_eq(q4kh_f2_run(&ref, cand.s, probe, n_probe, &r, &res, &err), 0,
	             "%s", err.msg);
	fprintf(stderr, "F2 %s (floor %.2f): %s, min cosine %.4f: %s\n", variant, floor,
	        q4kh_f2_verdict_name(res.verdict), res.min_cosine, res.message);
	side_close(&cand);
	return res;
}

TestSuite(f2_runs, .init = setup_runs, .fini = teardown_runs, .timeout = 120);
TestSuite(f2_runs_gemma, .init = setup_runs_gemma, .fini = teardown_runs, .timeout = 600);

Test(f2_runs, a_correct_int8_activation_variant_passes)
{
	struct q4kh_f2_result res = guard("cpu-q8act", 0.95);

	cr_expect_eq(res.verdict, Q4KH_F2_PASS, "%s", res.message);
	cr_expect_eq(res.n_points, (int64_t)n_probe + 8 + 4 * 4,
	             "prefill positions, 8 decode steps, 4 batched steps of 4 sequences");
	cr_expect_geq(res.min_cosine, 0.99);
	q4kh_f2_result_free(&res);
}

Test(f2_runs, a_biased_variant_is_broken)
{
	struct q4kh_f2_result res = guard("defect-biased", 0.95);

	cr_expect_eq(res.verdict, Q4KH_F2_BROKEN, "%s", res.message);
	cr_expect(strstr(res.message, "< 0.90 catastrophic floor") != NULL, "%s", res.message);
	cr_expect_eq(res.points[res.worst].position, 1, "the first judged position fires");
	q4kh_f2_result_free(&res);
}

Test(f2_runs, a_noisy_variant_fails_the_default_floor_and_passes_a_lowered_one)
{
	struct q4kh_f2_result res = guard("defect-noisy", 0.95);
	cr_expect_eq(res.verdict, Q4KH_F2_REJECT, "%s", res.message);
	cr_expect(strstr(res.message, "< 0.95 acceptance floor") != NULL, "%s", res.message);
	cr_expect(res.min_cosine > 0.90 && res.min_cosine < 0.95, "min cosine %.4f", res.min_cosine);
	q4kh_f2_result_free(&res);
	res = guard("defect-noisy", 0.92);
	cr_expect_eq(res.verdict, Q4KH_F2_PASS, "%s", res.message);
	q4kh_f2_result_free(&res);
}

Test(f2_runs, a_nan_is_caught)
{
	struct q4kh_f2_result res = guard("defect-nan", 0.95);

	cr_expect_eq(res.verdict, Q4KH_F2_REJECT, "%s", res.message);
	cr_expect(strstr(res.message, "NaN or Inf (F2.1)") != NULL, "%s", res.message);
	cr_expect(isnan(res.min_cosine));
	q4kh_f2_result_free(&res);
}

Test(f2_runs_gemma, a_wide_margin_argmax_flip_at_high_cosine_is_caught)
{
	struct q4kh_f2_result res = guard("defect-flip", 0.95);

	cr_expect_eq(res.verdict, Q4KH_F2_REJECT, "%s", res.message);
	cr_expect_str_eq(res.points[res.worst].rule, "F2.3");
	cr_expect_geq(res.points[res.worst].cosine, 0.98, "a cosine-only guard would pass it");
	q4kh_f2_result_free(&res);
}

Test(f2_runs_gemma, a_kv_cache_defect_is_caught_in_decode_only)
{
	struct q4kh_f2_result res = guard("defect-kv", 0.95);

	cr_expect_neq(res.verdict, Q4KH_F2_PASS, "%s", res.message);
	cr_expect_geq(res.points[res.worst].decode_step, 4, "%s", res.message);
	for (int64_t i = 1; i < (int64_t)n_probe; i++)
		cr_expect_eq(res.points[i].verdict, Q4KH_F2_PASS,
		             "prefill position %lld must pass: a prefill-only probe cannot see it",
		             (long long)i);
	q4kh_f2_result_free(&res);
}

/* Thresholds read back as set: two decimals, or the digits they need. */
Test(f2, a_threshold_is_printed_as_set)
{
	cr_expect_str_eq(q4kh_f2_threshold(0.95).s, "0.95");
	cr_expect_str_eq(q4kh_f2_threshold(0.9).s, "0.90");
	cr_expect_str_eq(q4kh_f2_threshold(0.995).s, "0.995");
	cr_expect_str_eq(q4kh_f2_threshold(0.9999).s, "0.9999");
	cr_expect_str_eq(q4kh_f2_threshold(0.5).s, "0.50");
}

/*
 * The batched steps' points in the probe plan (f2.h): 4 sequences at
 * staggered lengths within the probe's first 64 tokens, 4 steps each,
 * step by step after the decode steps. The lengths worked by hand from
 * the rule: the longest leaves its 4 steps within the reach (64 - 4 =
 * 60), the others step down by (60 - 1) / 3 = 19; a probe of 8 tokens
 * has 4, 3, 2 and 1; one of 7 has no batched steps.
 */
Test(f2, the_batched_steps_are_in_the_probe_plan)
{
	struct q4kh_f2_rules r;
	struct q4kh_f2_plan plan;
	struct q4kh_f2_point pt;
	char msg[512];
	static const int64_t lengths[4] = { 60, 41, 22, 3 };

	rules(&r);
	plan = q4kh_f2_probe_plan(100, &r);
	cr_expect_eq(plan.prefill, 64);
	cr_expect_eq(plan.batched, 16);
	cr_expect_eq(q4kh_f2_plan_points(&plan), 64 + 8 + 16);
	for (int32_t s = 0; s < 4; s++)
		cr_expect_eq(q4kh_f2_batch_length(64, s), lengths[s], "sequence %d", s);
	for (int64_t j = 0; j < 16; j++) {
		q4kh_f2_plan_point(&plan, 72 + j, &pt);
		cr_expect_eq(pt.batch, 4);
		cr_expect_eq(pt.seq, j % 4, "point %lld", (long long)(72 + j));
		cr_expect_eq(pt.decode_step, j / 4, "point %lld", (long long)(72 + j));
		cr_expect_eq(pt.position, lengths[j % 4] + j / 4, "point %lld", (long long)(72 + j));
		cr_expect(pt.judged && pt.computed);
	}
	q4kh_f2_plan_point(&plan, 71, &pt);
	cr_expect(pt.batch == 0 && pt.decode_step == 7 && pt.position == 71);
	for (int32_t s = 0; s < 4; s++)
		cr_expect_eq(q4kh_f2_batch_length(8, s), 4 - s, "sequence %d", s);
	r.probe_tokens = 7;
	cr_expect_eq(q4kh_f2_probe_plan(100, &r).batched, 0);
	cr_expect_eq(q4kh_f2_batch_length(7, 0), 0);
	r.probe_tokens = 8;
	cr_expect_eq(q4kh_f2_probe_plan(100, &r).batched, 16);

	/* the message names the step, the sequence and its position */
	q4kh_f2_plan_point(&plan, 77, &pt);
	pt.cosine = 0.5;
	pt.ref_argmax = pt.cand_argmax = 3;
	describe(&pt, msg, sizeof(msg));
	cr_expect_str_eq(msg, "batched step of 4 sequences, sequence 1, position 42 (its decode "
	                      "step 1): argmax 3 (agrees), cosine 0.5000 < 0.90 catastrophic floor");
}
