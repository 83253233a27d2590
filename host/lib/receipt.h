/*
 * F2 receipts (docs/architecture.md section 4): one small JSON file per candidate
 * (model, backend, kernel variant, device) holding its last verdict and
 * the key it was measured under. A receipt is valid only while every part
 * of its key is unchanged: the model file's SHA-256, the SHA-256 of every
 * plugin file involved (reference, backend, variant) and its settings, the
 * device UUID and
 * driver version, the F2 rule set and the rules' values, and the probe (its
 * kind and its token ids).
 * Files are written atomically (temporary file, fsync, rename). A receipt
 * also keeps every measured position (cosine, decode step, verdict), so a
 * plot can be drawn from receipts alone, and so that what it claims can be
 * checked against them when it is read (receipt_check.h; this file only
 * reads and writes). The file format carries a schema number
 * (RECEIPT_SCHEMA in receipt.c); a file of another schema counts as no
 * receipt. Each file ends in an HMAC-SHA256 of its content under this
 * user's receipt key (receipt_mac.h): one without a MAC of that key, edited
 * or written with another, counts as no receipt either (docs/f2.md, R.1).
 * Functions are thread-safe for distinct receipts.
 */
#ifndef Q4KH_RECEIPT_H
#define Q4KH_RECEIPT_H

#include <stdint.h>

#include "config.h"
#include "error.h"
#include "f2.h"
#include "hash.h"
#include "receipt_mac.h"

#define Q4KH_RECEIPT_PLUGINS 3
/* A receipt's "created", for strftime and strptime: UTC, ISO 8601,
 * "2026-11-30T06:01:24Z". */
#define Q4KH_RECEIPT_TIME_FORMAT "%Y-%m-%dT%H:%M:%SZ" /* reference, backend, kernel variant */

struct q4kh_receipt_plugin {
	char role[16];  /* "reference", "backend", "variant" */
	char name[64];
	char sha256[Q4KH_SHA256_HEX];
	/* its effective [plugin.NAME] settings, "key=value; ..." (config.h's
	 * q4kh_config_section_text): a setting can change what it computes */
	char settings[256];
};

struct q4kh_receipt_key {
	char model_sha256[Q4KH_SHA256_HEX];
	struct q4kh_receipt_plugin plugins[Q4KH_RECEIPT_PLUGINS];
	int n_plugins;
	char device_uuid[64];
	char driver_version[64];
	int ruleset;
	double floor;
	/* what chose the floor (f2.h): the path's arithmetic class
	 * (q4kh_arith; "arith" in the file, by name) and whether f2_floor set
	 * it instead ("floor_set"); a file without them: UNDECLARED, 0 */
	uint32_t arith;
	int floor_set;
	uint32_t decode_steps, probe_tokens;
	char probe_sha256[Q4KH_SHA256_HEX]; /* of the probe's token ids */
	/* what the probe was: "builtin" (F2's own text), "prompt" (a run's
	 * prompt, --f2-probe prompt) or "deep" (deep.h); a file without it was
	 * made with the built-in probe */
	char probe[16];
};

/*
 * What one position of the measurement showed, as a receipt keeps it for
 * plots; the position is the index in the receipt's array.
 */
struct q4kh_receipt_point {
	double cosine;       /* NaN when not computable (F2.1) */
	int32_t decode_step; /* -1 in prefill */
	enum q4kh_f2_verdict verdict; /* PASS, REJECT or BROKEN */
	int judged;          /* 0 for position 0 and between the deep bands */
	int computed;        /* 0 between the deep probe's bands: no cosine */
	int near_tie;        /* a tolerated argmax disagreement */
};

struct q4kh_receipt {
	struct q4kh_receipt_key key;
	enum q4kh_f2_verdict verdict;
	double min_cosine;
	int64_t worst_position;
	int32_t worst_decode_step;
	int near_ties;
	double seconds;
	char message[512];
	char created[32];      /* UTC, ISO 8601 */
	char host_version[32];
	/* A verdict that came from hitting a limit of F2's, not from the
	 * plugin's output: "time" (LIMIT_VALUE seconds) or "memory"
	 * (LIMIT_VALUE MiB); "" otherwise. A larger limit later makes the
	 * receipt stale (q4kh_guard_limit_raised). */
	char limit[8];
	uint64_t limit_value;
	/* Every position measured, in order; NULL and 0 when the measurement
	 * did not finish (a crash, a timeout, F2.4). malloc()ed: see
	 * q4kh_receipt_free. */
	struct q4kh_receipt_point *points;
	int64_t n_points;
};

/*
 * The mark a receipt file gives point P: "unjudged" (compared, not judged:
 * position 0), "pass", "near-tie" (a tolerated argmax disagreement),
 * "reject", "broken", or "skipped" (between the deep probe's bands: not
 * compared, its cosine null).
 */
const char *q4kh_receipt_point_mark(const struct q4kh_receipt_point *p);

/* Free R's points (R itself stays usable, with none). */
void q4kh_receipt_free(struct q4kh_receipt *r);

/* Replace R's points by a copy of the N points of an F2 run. -1 with err on
 * out of memory. */
int q4kh_receipt_set_points(struct q4kh_receipt *r, const struct q4kh_f2_point *pts,
                            int64_t n, struct q4kh_error *err);

/*
 * The receipt folder: Q4KHOST_F2_RECEIPT_DIR, else [f2] receipt_dir, else
 * q4kh_cache_home()/q4khost/f2 (a relative XDG_CACHE_HOME ignored, with a
 * warning). *origin says which.
 */
void q4kh_receipt_dir(const struct q4kh_config *c, char *buf, size_t cap,
                      const char **origin);

/*
 * Whether receipts can be kept in the receipt folder of C (the one
 * q4kh_receipt_dir gives), checked before any work by making it: created
 * with the folders above it that are missing (mkdir -p, each new one
 * 0700), it must be a folder this process may write and nobody else may
 * (q4kh_secure_untrusted, the plugin folders' rule: whoever else can write
 * it could plant receipts), and this user's receipt key must load
 * (q4kh_receipt_mac_load, which makes it at first use) into *MAC (NULL:
 * only checked). -1 with err in one line that names where the folder was set
 * (Q4KHOST_F2_RECEIPT_DIR=..., [f2] receipt_dir with its file and line, or
 * the default), the path and why ("Not a directory", "Permission denied",
 * "cannot create it: No such file or directory" under /proc, a relative
 * path: it would depend on the current directory, "refused: the receipt
 * folder PATH is writable by others (mode 0777; fix: chmod o-w PATH)"),
 * or the key file and why it is refused.
 */
int q4kh_receipt_dir_check(const struct q4kh_config *c, struct q4kh_receipt_mac *mac,
                           struct q4kh_error *err);

/*
 * The folder alone, as q4kh_receipt_dir_check checks it, without the key:
 * for what the folder keeps beside the receipts that no MAC seals
 * (enumerate.c's records of each backend's start, trusted by their
 * owner, secure.c's rule). 0, or -1 with err as q4kh_receipt_dir_check's.
 */
int q4kh_receipt_folder_check(const struct q4kh_config *c, struct q4kh_error *err);

/*
 * The file of candidate ID's receipt in DIR into BUF (CAP bytes):
 * DIR/<the first 32 hex digits of the SHA-256 of ID>.json, so that any
 * identity maps to a safe file name.
 */
void q4kh_receipt_path(const char *dir, const char *id, char *buf, size_t cap);

/*
 * Read the receipt of candidate ID (any printable identity string, e.g.
 * "MODEL-SHA cuda cuda-mwv GPU-…") from DIR into *out, which is
 * overwritten (free its points first). The file is opened without
 * following a symbolic link and read only when it is a regular file, and
 * believed only when it ends in K's MAC of its content and names ID.
 * 0 on success; 1 with err in one line naming the file when there is
 * none, when it is a symbolic link ("receipt PATH is a symbolic link: not
 * followed; measuring again") or not a regular file, of another schema
 * ("receipt PATH is of schema 4 (an earlier version's, unsigned); ...:
 * measuring again"), when it fails its integrity check ("receipt PATH
 * fails its integrity check: edited, or written with another key;
 * measuring again": nothing of its content is quoted) or is another
 * candidate's; -1 with err for a file that cannot be read or a sealed one
 * that does not parse. Either way the caller treats it as absent, and the
 * next receipt written replaces it. It
 * reads what the file says: whether that may be believed is
 * q4kh_receipt_check's to say.
 */
int q4kh_receipt_load(const char *dir, const char *id, const struct q4kh_receipt_mac *k,
                      struct q4kh_receipt *out, struct q4kh_error *err);

/* Write R, sealed with K's MAC, as the receipt of ID into DIR (created if
 * missing): into a new file, renamed over the receipt (a symbolic link of
 * its name is replaced, never followed). */
int q4kh_receipt_save(const char *dir, const char *id, const struct q4kh_receipt_mac *k,
                      const struct q4kh_receipt *r, struct q4kh_error *err);

/*
 * NULL when OLD and CUR are the same key; else BUF, naming the first part
 * that changed, e.g. "plugin file of cuda-mwv changed (sha256 1a2b… ->
 * 9f8e…)".
 */
const char *q4kh_receipt_key_diff(const struct q4kh_receipt_key *old,
                                  const struct q4kh_receipt_key *cur, char *buf,
                                  size_t cap);

#endif
