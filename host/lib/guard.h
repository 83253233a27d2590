/*
 * The F2 guard as the host applies it (docs/architecture.md section 4): for a candidate
 * (backend plugin, device, kernel variant or the backend's built-in
 * kernels) decide from a valid receipt, or measure it (in an isolated child
 * process, so a plugin that crashes or hangs rejects itself instead of
 * taking the host down), and record the verdict as a receipt.
 */
#ifndef Q4KH_GUARD_H
#define Q4KH_GUARD_H

#include <stddef.h>
#include <stdint.h>

#include "candidate.h"
#include "config.h"
#include "deep.h"
#include "error.h"
#include "f2.h"
#include "host.h"
#include "receipt.h"
#include "registry.h"

enum q4kh_f2_mode {
	Q4KH_F2_AUTO = 0, /* a valid receipt, else measure */
	Q4KH_F2_FRESH,    /* always measure */
	Q4KH_F2_OFF,      /* do not guard: reported loudly */
	Q4KH_F2_REQUIRE   /* as auto, but a failure is an error, not a fall-back */
};

/* "auto", "fresh", "off", "require" -> mode; -1 for anything else. */
int q4kh_f2_mode_parse(const char *s, enum q4kh_f2_mode *out);
const char *q4kh_f2_mode_name(enum q4kh_f2_mode m);

/* The built-in validation text; the probe is its last tokens. */
extern const char q4kh_f2_probe_text[];

/*
 * What F2 judges a candidate on: the last f2_probe_tokens tokens of the
 * built-in text, or of the prompt of the run it guards (--f2-probe prompt,
 * [f2] probe): docs/f2.md, "Which probe".
 */
enum q4kh_f2_probe_kind {
	Q4KH_F2_PROBE_BUILTIN = 0,
	Q4KH_F2_PROBE_PROMPT,
	Q4KH_F2_PROBE_DEEP /* deep.h: validate --deep, [f2] require_deep */
};

/* "builtin", "prompt" -> kind (the values of [f2] probe and --f2-probe);
 * -1 for anything else. */
int q4kh_f2_probe_parse(const char *s, enum q4kh_f2_probe_kind *out);
/* "builtin", "prompt" or "deep", as receipts and JSON write it. */
const char *q4kh_f2_probe_name(enum q4kh_f2_probe_kind k);

/*
 * The fewest tokens a prompt probe may have: below it too few positions
 * are judged to mean much (position 0 never is), and a prefill of so few
 * columns may run on a variant's decode (gemv) kernels, leaving its
 * batched ones unjudged. A run falls back to the built-in probe, saying
 * why.
 */
#define Q4KH_F2_PROMPT_MIN_TOKENS 8
/* The most token ids a probe file may hold (q4kh_guard_probe_load). */
#define Q4KH_F2_PROBE_FILE_MAX (1u << 24)

/*
 * A prompt probe for a validation child: IDS[0..n) into a new file only
 * this user can read (mode 0600) in $TMPDIR, else /tmp, so that the
 * prompt stays out of the child's command line (which every user can read
 * through ps) and the child judges exactly these ids, without tokenizing
 * again. PATH (CAP bytes) gets its name; the caller unlinks it. The file
 * is text: "q4khost-f2-probe 1 N", then the N ids, one a line.
 */
int q4kh_guard_probe_save(const int32_t *ids, size_t n, char *path, size_t cap,
                          struct q4kh_error *err);

/*
 * Read a file of q4kh_guard_probe_save into *ids (malloc()ed): every id
 * must be a token of the model at MODEL_PATH. -1 with err naming the file,
 * the line and what was expected.
 */
int q4kh_guard_probe_load(const char *path, const char *model_path, int32_t **ids,
                          size_t *n, struct q4kh_error *err);

/*
 * The probe's tokens for the model at MODEL_PATH: TEXT (the built-in probe
 * when NULL) as serving tokenizes a prompt (prompt.h: the file's chat
 * layout, BOS, special tokens parsed). *ids is malloc()ed. The file is
 * shared with this process's other holds on it (gguf_shared.h).
 */
int q4kh_guard_probe(const char *model_path, const char *text, int32_t **ids,
                     size_t *n, struct q4kh_error *err);
/* q4kh_guard_probe for model file G with its tokenizer TOK (a host
 * context's, host.h): nothing is opened or built again. */
int q4kh_guard_probe_with(const struct q4kh_gguf *g, const struct q4kh_tokenizer *tok,
                          const char *text, int32_t **ids, size_t *n,
                          struct q4kh_error *err);

/* Everything a guard decision needs besides the candidate. */
/* Command-line and environment settings a validation child gets (--set). */
#define Q4KH_GUARD_OVERRIDES 16

/* The command line of a `q4khost validate` child for one candidate. */
struct q4kh_guard_args {
	const char *argv[32 + 2 * Q4KH_GUARD_OVERRIDES]; /* NULL-terminated */
	int n;
	char device[16], ctx[16];
	char set[Q4KH_GUARD_OVERRIDES][600];
	int n_set;
};

struct q4kh_guard {
	const struct q4kh_registry *registry;
	const struct q4kh_config *config;
	const char *model_path;
	char model_sha256[Q4KH_SHA256_HEX];
	char receipt_dir[4096];
	const char *receipt_dir_origin;
	struct q4kh_receipt_mac mac; /* the key receipts are sealed with */
	const int32_t *probe; /* owned by the caller */
	size_t n_probe;
	char probe_sha256[Q4KH_SHA256_HEX];
	/* what PROBE is (BUILTIN after q4kh_guard_init); a PROMPT probe reaches
	 * a validation child in a file (q4kh_guard_probe_save), and its
	 * receipts are kept apart from the built-in probe's */
	enum q4kh_f2_probe_kind probe_kind;
	/* a DEEP probe's plan (q4kh_guard_use_deep), owned by the caller, and
	 * the context that capped it (0: the model's), handed to the child */
	const struct q4kh_deep_plan *deep;
	uint32_t deep_ctx;
	unsigned timeout_seconds; /* for a measurement in a child process */
	uint64_t memory_limit_mib; /* the child's private resident memory; 0 = none */
	const char *config_file;  /* --config, handed to the child; may be NULL */
	const char *self_exe;     /* the q4khost binary that measures */
	const char *fresh_source; /* where mode fresh was set, for a decision's
	                             source (settings.h); NULL: "--f2 fresh" */
	/* In a validation child: the file its parent names, into which a DEEP
	 * measurement writes the positions done ("DONE TOTAL"), for the
	 * parent's status line; NULL: none. */
	const char *progress_file;
	/* The file through which the measurements of one command share the
	 * reference's logits (f2_reference.h), in a folder of the parent's:
	 * the parent hands it to each child (--reference-logits), a child
	 * replays it, or computes and writes it. NULL: each measurement
	 * computes the reference. */
	const char *reference_logits;
	/* The command's host context (host.h), whose reference backend tells
	 * whether it can start; NULL: start it to see. */
	struct q4kh_host *host;
};

/* The largest f2_memory_limit_mb: 1 PiB, far above any machine. */
#define Q4KH_MEMORY_LIMIT_MAX_MIB (1ull << 30)
/* The most seconds one measurement may be given (f2_timeout_s, --timeout). */
#define Q4KH_TIMEOUT_MAX_S 86400

/*
 * Fill G for MODEL_PATH: hash the model (cached by file identity), find
 * the receipt folder, hash the probe, take the child's limits
 * (q4kh_guard_limits_where).
 * PROBE stays owned by the caller. A bad limit is an error naming the file
 * and line.
 */
int q4kh_guard_init(struct q4kh_guard *g, const struct q4kh_registry *r,
                    const struct q4kh_config *c, const char *model_path,
                    const int32_t *probe, size_t n_probe,
                    struct q4kh_error *err);

/*
 * Make G's probe the deep one: PLAN over G's probe tokens (q4kh_deep_probe
 * with context CTX), both owned by the caller. Its receipts are keyed on
 * the tokens and the positions judged, and kept apart from the others.
 * -1 with err on out of memory.
 */
int q4kh_guard_use_deep(struct q4kh_guard *g, const struct q4kh_deep_plan *plan,
                        uint32_t ctx, struct q4kh_error *err);

/*
 * The plan of G's probe under RULES (f2.h): the deep probe's when G judges
 * on it (q4kh_guard_use_deep), else that of q4kh_f2_run on G's tokens
 * (q4kh_f2_probe_plan: their last rules->probe_tokens, then
 * rules->decode_steps decode steps, then the batched steps' points). What
 * q4kh_guard_measure runs, and, under
 * a receipt's own rules (q4kh_receipt_rules), the points a receipt of G
 * must hold. Points into G's deep plan.
 */
struct q4kh_f2_plan q4kh_guard_plan(const struct q4kh_guard *g, const struct q4kh_f2_rules *rules);

/*
 * The arithmetic class of candidate C's path (plugin.h, q4kh_arith;
 * docs/f2.md, "Floors that follow the arithmetic"): the coarsest of what
 * its backend and its kernel variant declare (q4kh_f2_arith_coarsest).
 * UNDECLARED when either declares nothing, declares a class this host
 * does not know (a newer plugin's), or is not accepted in R.
 */
uint32_t q4kh_guard_arith(const struct q4kh_registry *r, const struct q4kh_candidate *c);

/*
 * The F2 rules for a candidate: the defaults with the floor of its path's
 * class (q4kh_guard_arith), then [f2] and [plugin.NAME] keys f2_floor,
 * f2_decode_steps, f2_probe_tokens (NAME the variant, else the backend):
 * a floor set there wins over the class's. A floor under the catastrophic
 * floor or a bad number is an error naming the key and where it was set.
 */
int q4kh_guard_rules(const struct q4kh_guard *g, const struct q4kh_candidate *c,
                     struct q4kh_f2_rules *rules, struct q4kh_error *err);

/*
 * Every F2 setting of C, checked before any work: [f2] f2_timeout_s and
 * f2_memory_limit_mb, and the rules (f2_floor, f2_decode_steps,
 * f2_probe_tokens) of [f2] and of [plugin.NAME] for every plugin R
 * accepted (R may be NULL). -1 with err naming the file, line, key and
 * the range: a bad config file, to be refused, never a candidate that
 * quietly "could not be decided". The receipt folder and key are the
 * commands' to check, where they may need a receipt
 * (q4kh_receipt_dir_check; q4kh_guard_init checks them too).
 */
int q4kh_guard_config_check(const struct q4kh_config *c, const struct q4kh_registry *r,
                            struct q4kh_error *err);

/* Where the limits of a measurement's child came from: "FILE:LINE
 * [f2]" (an override's flag for validate --set) or "default". */
struct q4kh_f2_limit_origins {
	char timeout[640], memory[640];
};

/*
 * The limits of q4kh_guard_init under config C (may be NULL): [f2]
 * f2_timeout_s into *TIMEOUT_S (default 600) and f2_memory_limit_mb into
 * *MEMORY_MIB (default: isolate.h), and, when O is not NULL, where each
 * came from. A bad value is an error naming the file and line.
 */
int q4kh_guard_limits_where(const struct q4kh_config *c, unsigned *timeout_s,
                            uint64_t *memory_mib, struct q4kh_f2_limit_origins *o,
                            struct q4kh_error *err);

/* Where each configurable F2 rule came from: "FILE:LINE [SECTION]" or
 * "default"; for the floor also "the int8 arithmetic class" or "default
 * (no arithmetic class declared)". */
struct q4kh_f2_rule_origins {
	char floor[640], decode_steps[640], probe_tokens[640];
};

/*
 * The rules of q4kh_guard_rules for the plugin called PLUGIN (the variant,
 * else the backend; NULL: [f2] and the defaults alone) on a path of class
 * ARITH (q4kh_guard_arith) under config C (may be NULL), and, when O is
 * not NULL, where each came from.
 */
int q4kh_guard_rules_where(const struct q4kh_config *c, const char *plugin, uint32_t arith,
                           struct q4kh_f2_rules *rules,
                           struct q4kh_f2_rule_origins *o, struct q4kh_error *err);

/*
 * The receipt key and file identity of candidate C on the device described
 * by DEV (uuid and driver version). A prompt probe's receipt has an
 * identity of its own (one per candidate, whichever prompt measured it
 * last), so that it never replaces the built-in probe's.
 */
int q4kh_guard_key(const struct q4kh_guard *g, const struct q4kh_candidate *c,
                   const struct q4kh_device_record *dev,
                   struct q4kh_receipt_key *key, char *id, size_t id_cap,
                   struct q4kh_error *err);

/*
 * Measure C in this process: the reference cpu plugin and the candidate
 * side by side (f2.h), and write the receipt. Used by the child process
 * (q4khost validate --one) and by tests. out->points are the caller's
 * (q4kh_receipt_free), also on error.
 */
int q4kh_guard_measure(const struct q4kh_guard *g, const struct q4kh_candidate *c,
                       struct q4kh_receipt *out, struct q4kh_error *err);

/*
 * The receipt ID of G's folder that may decide for key KEY (q4kh_guard_key)
 * now, into *OUT (overwritten; free its points with q4kh_receipt_free):
 * read (q4kh_receipt_load), its key the same as KEY, what it claims true of
 * its points on the probe plan of its key (q4kh_guard_plan under
 * q4kh_receipt_rules; q4kh_receipt_check), and no limit of G's raised
 * since a limit stopped it (q4kh_guard_limit_raised). 0 when it may;
 * else OUT is empty and WHY (CAP bytes) says why not: 1 for none, another
 * schema, a file that cannot be parsed, the first part of the key that
 * changed or a raised limit; 2 for a void receipt (current, but it claims
 * what its points do not say), naming the field ("receipt PATH:
 * min_cosine 0.9990 but its points' lowest judged cosine is 0.7060:
 * ignored"). Either way the receipt is treated as none: the candidate is
 * measured again. KEY of probe "deep" for a G of another probe asks for a
 * deep receipt of whichever reach (its context): its plan is the deep
 * probe of G's model with as many points, whose tokens and flags must
 * hash to the receipt's probe_sha256.
 */
int q4kh_guard_receipt(const struct q4kh_guard *g, const struct q4kh_receipt_key *key,
                       const char *id, struct q4kh_receipt *out, char *why, size_t cap);

/* The outcome of q4kh_guard_check; free receipt.points with
 * q4kh_receipt_free. */
struct q4kh_guard_decision {
	enum q4kh_f2_verdict verdict;
	char source[256];  /* "receipt", "fresh (reason: ...)", "off" */
	struct q4kh_receipt receipt;
};

/*
 * The decision a receipt makes for candidate C on device DEV (its
 * record) without measuring, the one rule for every command and serve:
 * with G's built-in probe, a valid deep receipt of C that measured every
 * position decides (the wider measurement; a deep rejection is not
 * outvoted by a pass of the built-in probe), else G's own receipt of C
 * (q4kh_guard_receipt). 0 with OUT's verdict, source ("receipt of DATE",
 * "deep receipt of DATE") and receipt (free its points with q4kh_receipt_free); 1 when none may
 * decide, WHY (CAP bytes) saying why G's own may not, OUT empty; -1 with
 * err when the key cannot be computed (a plugin file cannot be hashed).
 * KEY and ID (ID_CAP bytes; both may be NULL) get C's receipt key and
 * identity (q4kh_guard_key), for a measurement that follows.
 */
int q4kh_guard_receipt_decision(const struct q4kh_guard *g, const struct q4kh_candidate *c,
                                const struct q4kh_device_record *dev,
                                struct q4kh_guard_decision *out, char *why, size_t cap,
                                struct q4kh_receipt_key *key, char *id, size_t id_cap,
                                struct q4kh_error *err);

/*
 * Why receipt R is stale under G's limits: it records a verdict of a
 * limit (a time or memory limit that stopped the measurement) and G's is
 * larger, so the measurement may finish now ("the memory limit was raised
 * (10 -> 512 MiB)", in BUF). NULL while the same or a smaller limit holds.
 */
const char *q4kh_guard_limit_raised(const struct q4kh_guard *g,
                                    const struct q4kh_receipt *r, char *buf, size_t cap);

/*
 * Decide on C under MODE: use a valid receipt (auto, require), else
 * measure it in a child process (g->self_exe validate --one ...) under
 * g->timeout_seconds and g->memory_limit_mib (isolate.h); a child that
 * crashes, is killed, times out or exceeds the memory limit gives a
 * recorded rejection naming the signal or the limit (a limit's receipt
 * keeps the limit: a larger one later measures again); when the reference
 * cpu backend cannot start, no child is started and the verdict is not
 * measured, the message giving the reference's reason. DEV is the
 * candidate's device record. While a child measures, a terminal shows
 * progress (progress.h). -1 with err only when no decision can be made
 * at all (hashing or the child could not start), or when we were asked to
 * stop (interrupt.h; the child is stopped and no receipt is written).
 */
int q4kh_guard_check(const struct q4kh_guard *g, const struct q4kh_candidate *c,
                     const struct q4kh_device_record *dev, enum q4kh_f2_mode mode,
                     struct q4kh_guard_decision *out, struct q4kh_error *err);

/*
 * Into A: "q4khost validate" for candidate C of G: its backend, device,
 * kernel, G's model, plugin path and config file, and every setting made
 * above the config files (--set), so that the child keys its receipt as
 * the parent does. A prompt probe is not among them: q4kh_guard_check hands
 * it over as --probe-ids FILE. The caller appends its own options (a->argv[a->n++])
 * and the final NULL. Points into G, C and A.
 */
void q4kh_guard_child_args(const struct q4kh_guard *g, const struct q4kh_candidate *c,
                           struct q4kh_guard_args *a);

/*
 * Append to A the probe of G's that a validate child cannot know by
 * itself: --deep (and --ctx N) when G judges on the deep probe, so that
 * the child reads and writes the deep receipt, not the built-in one.
 */
void q4kh_guard_deep_args(const struct q4kh_guard *g, struct q4kh_guard_args *a);

#endif
