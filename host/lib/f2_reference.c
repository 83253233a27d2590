#include "f2_reference.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "hash.h"

#define MAGIC "q4khost-f2-reference-logits 1\n"
#define TRAILER_LEN (7 + 64 + 1) /* "sha256 " HEX "\n" */
#define HEADER_MAX 8192

void q4kh_f2_ref_live(struct q4kh_f2_ref *r, struct q4kh_session *s)
{
	memset(r, 0, sizeof(*r));
	r->s = s;
	r->n_vocab = s->m->hp.n_vocab;
}

static const char *byte_order(void)
{
	const uint16_t one = 1;

	return *(const uint8_t *)&one ? "little-endian" : "big-endian";
}

/* The header SHAPE's rows have under R's identity, into BUF. */
static void header(const struct q4kh_f2_ref *r, const struct q4kh_f2_ref_shape *shape,
                   char *buf, size_t cap)
{
	char tokens[Q4KH_SHA256_HEX], judged[Q4KH_SHA256_HEX + 32] = "all";
	int64_t n_judged = 0;

	q4kh_sha256_bytes(shape->tokens, sizeof(int32_t) * (size_t)shape->n_tokens, tokens);
	if (shape->judged) {
		for (int64_t i = 0; i < shape->n_tokens; i++)
			n_judged += shape->judged[i] != 0;
		q4kh_sha256_bytes(shape->judged, (size_t)shape->n_tokens, judged);
		snprintf(judged + strlen(judged), sizeof(judged) - strlen(judged), " %lld",
		         (long long)n_judged);
	}
	snprintf(buf, cap,
	         MAGIC "%s"
	         "run %s\ntokens %lld %s\njudged %s\ndecode_steps %u\nchunk %lld\n"
	         "narrow %lld\nn_vocab %lld\nrows %lld\nfloat binary32 %s\nend\n",
	         r->identity ? r->identity : "", shape->run, (long long)shape->n_tokens, tokens,
	         judged, shape->decode_steps, (long long)shape->chunk, (long long)shape->narrow,
	         (long long)r->n_vocab, (long long)shape->rows, byte_order());
}

/* Why the header HAVE (LEN bytes) is not WANT: its first line that differs. */
static void header_diff(const char *have, size_t len, const char *want, char *why, size_t cap)
{
	size_t i = 0, line = 0, end_have, end_want;

	if (len < strlen(want) && !memcmp(have, want, len)) {
		snprintf(why, cap, "it ends after %zu bytes, inside its header (short)", len);
		return;
	}
	while (i < len && have[i] == want[i]) {
		if (have[i] == '\n')
			line = i + 1;
		i++;
	}
	end_have = line;
	while (end_have < len && have[end_have] != '\n')
		end_have++;
	end_want = strcspn(want + line, "\n") + line;
	snprintf(why, cap, "its header differs: '%.*s' where this measurement has '%.*s'",
	         (int)(end_have - line > 200 ? 200 : end_have - line), have + line,
	         (int)(end_want - line > 200 ? 200 : end_want - line), want + line);
	for (char *c = why; *c; c++)
		if ((unsigned char)*c < ' ')
			*c = '?'; /* untrusted bytes stay on one line */
}

/*
 * Whether the file at R->path holds exactly WANT's rows: its header, size
 * and hash. 0 with R->f positioned at the first row; -1 with R->why.
 */
static int replay_open(struct q4kh_f2_ref *r, const char *want, int64_t rows)
{
	const size_t hlen = strlen(want);
	unsigned char buf[1 << 16];
	char have[HEADER_MAX], hex[Q4KH_SHA256_HEX], trailer[TRAILER_LEN + 1];
	struct q4kh_sha256 *h = NULL;
	struct stat st;
	uint64_t payload, left;
	int fd, ok = 0;

	fd = open(r->path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
	if (fd < 0) {
		snprintf(r->why, sizeof(r->why), "%s", strerror(errno));
		return -1;
	}
	r->f = fdopen(fd, "rb");
	if (!r->f) {
		close(fd);
		snprintf(r->why, sizeof(r->why), "%s", strerror(errno));
		return -1;
	}
	if (rows <= 0 || r->n_vocab <= 0 ||
	    (uint64_t)rows > (UINT64_MAX / 2) / sizeof(float) / (uint64_t)r->n_vocab) {
		snprintf(r->why, sizeof(r->why), "%lld rows of %lld logits cannot be a file",
		         (long long)rows, (long long)r->n_vocab);
		goto out;
	}
	payload = (uint64_t)rows * (uint64_t)r->n_vocab * sizeof(float);
	if (fstat(fd, &st) || !S_ISREG(st.st_mode)) {
		snprintf(r->why, sizeof(r->why), "not a regular file");
		goto out;
	}
	if (fread(have, 1, hlen, r->f) != hlen || memcmp(have, want, hlen)) {
		size_t got = st.st_size < (off_t)hlen ? (size_t)st.st_size : hlen;
		header_diff(have, got, want, r->why, sizeof(r->why));
		goto out;
	}
	if ((uint64_t)st.st_size != hlen + payload + TRAILER_LEN) {
		snprintf(r->why, sizeof(r->why),
		         "%lld bytes where %lld rows of %lld logits make %llu (short, or more than "
		         "its header says)",
		         (long long)st.st_size, (long long)rows, (long long)r->n_vocab,
		         (unsigned long long)(hlen + payload + TRAILER_LEN));
		goto out;
	}
	if (!(h = q4kh_sha256_new())) {
		snprintf(r->why, sizeof(r->why), "cannot hash it: out of memory");
		goto out;
	}
	for (left = payload; left > 0;) {
		size_t want_n = left < sizeof(buf) ? (size_t)left : sizeof(buf);

		if (fread(buf, 1, want_n, r->f) != want_n || q4kh_sha256_add(h, buf, want_n)) {
			snprintf(r->why, sizeof(r->why), "cannot read its rows: %s",
			         ferror(r->f) ? strerror(errno) : "end of file");
			goto out;
		}
		left -= want_n;
	}
	if (q4kh_sha256_hex(h, hex) || fread(trailer, 1, TRAILER_LEN, r->f) != TRAILER_LEN ||
	    memcmp(trailer, "sha256 ", 7) || memcmp(trailer + 7, hex, 64) ||
	    trailer[TRAILER_LEN - 1] != '\n') {
		snprintf(r->why, sizeof(r->why), "its rows do not match their SHA-256 (corrupt)");
		goto out;
	}
	ok = fseeko(r->f, (off_t)hlen, SEEK_SET) == 0;
	if (!ok)
		snprintf(r->why, sizeof(r->why), "cannot seek in it: %s", strerror(errno));
out:
	q4kh_sha256_free(h);
	if (ok)
		return 0;
	fclose(r->f);
	r->f = NULL;
	return -1;
}

/* Start recording HEADER into R->path.part; on failure R->why says why. */
static void record_open(struct q4kh_f2_ref *r, const char *head)
{
	char part[4200];

	snprintf(part, sizeof(part), "%s.part", r->path);
	unlink(part); /* a writer killed before it finished */
	r->f = fopen(part, "wbxe");
	if (!r->f) {
		snprintf(r->unwritten, sizeof(r->unwritten), "cannot create %.200s: %s", part, strerror(errno));
		return;
	}
	r->md = q4kh_sha256_new();
	if (!r->md || fputs(head, r->f) == EOF) {
		snprintf(r->unwritten, sizeof(r->unwritten), "cannot write %.200s: %s", part, strerror(errno));
		fclose(r->f);
		r->f = NULL;
		unlink(part);
	}
}

int q4kh_f2_ref_begin(struct q4kh_f2_ref *r, const struct q4kh_f2_ref_shape *shape,
                      struct q4kh_error *err)
{
	char *head;

	r->n_past = 0;
	r->rows_done = 0;
	r->rows_total = shape->rows;
	r->replaying = r->recorded = 0;
	r->unwritten[0] = 0;
	if (!r->path)
		return 0;
	if (!(head = malloc(HEADER_MAX)))
		return q4kh_fail(err, "F2: out of memory");
	header(r, shape, head, HEADER_MAX);
	if (!r->refused && replay_open(r, head, shape->rows) == 0) {
		r->replaying = 1;
	} else {
		r->refused = 1;
		if (r->s)
			record_open(r, head);
	}
	free(head);
	return r->replaying || r->s ? 0 : 1;
}

/* COUNT rows of the reference's logits into or out of the file. */
static int rows_io(struct q4kh_f2_ref *r, float *rows, int64_t count, struct q4kh_error *e)
{
	const size_t n = (size_t)(count * r->n_vocab);

	if (r->rows_done + count > r->rows_total) {
		r->replay_failed = r->replaying;
		if (r->f && !r->replaying) {
			snprintf(r->unwritten, sizeof(r->unwritten), "more rows than its header says");
			fclose(r->f);
			r->f = NULL;
		}
		if (!r->replaying)
			return 0;
		q4kh_fail(e, "the shared reference file %s has no row %lld", r->path,
		          (long long)r->rows_done);
		snprintf(r->why, sizeof(r->why), "%.600s", e->msg);
		return -1;
	}
	r->rows_done += count;
	if (r->replaying) {
		if (fread(rows, sizeof(float), n, r->f) == n)
			return 0;
		r->replay_failed = 1;
		q4kh_fail(e, "cannot read the shared reference file %s: %s", r->path,
		          ferror(r->f) ? strerror(errno) : "end of file");
		snprintf(r->why, sizeof(r->why), "%.600s", e->msg);
		return -1;
	}
	if (r->f && (fwrite(rows, sizeof(float), n, r->f) != n ||
	             q4kh_sha256_add(r->md, rows, n * sizeof(float)))) {
		/* the measurement goes on; only the sharing is lost */
		snprintf(r->unwritten, sizeof(r->unwritten), "cannot write it: %s", strerror(errno));
		fclose(r->f);
		r->f = NULL;
	}
	return 0;
}

int q4kh_f2_ref_eval(struct q4kh_f2_ref *r, const int32_t *ids, int64_t n, float *logits,
                     const uint8_t *rows, struct q4kh_error *e)
{
	int64_t wanted = 0;

	for (int64_t i = 0; i < n; i++)
		wanted += !rows || rows[i];
	if (!r->replaying &&
	    (rows ? q4kh_session_eval_rows(r->s, ids, n, logits, rows, 1, e)
	          : q4kh_session_eval(r->s, ids, n, logits, 1, e)))
		return -1;
	r->n_past += n;
	return r->path && wanted ? rows_io(r, logits, wanted, e) : 0;
}

void q4kh_f2_ref_reset(struct q4kh_f2_ref *r)
{
	if (r->s)
		q4kh_session_reset(r->s);
	r->n_past = 0;
}

void q4kh_f2_ref_end(struct q4kh_f2_ref *r)
{
	char part[4200], hex[Q4KH_SHA256_HEX];
	int ok;

	if (r->replaying || !r->path) {
		if (r->f)
			fclose(r->f);
		r->f = NULL;
		return;
	}
	snprintf(part, sizeof(part), "%s.part", r->path);
	if (r->f) {
		ok = r->rows_done == r->rows_total && !q4kh_sha256_hex(r->md, hex) &&
		     fprintf(r->f, "sha256 %s\n", hex) == TRAILER_LEN;
		ok = fclose(r->f) == 0 && ok;
		r->f = NULL;
		if (!ok && !r->unwritten[0])
			snprintf(r->unwritten, sizeof(r->unwritten),
			         r->rows_done == r->rows_total ? "cannot write it: %s"
			                                       : "the run ended before every row%.0s",
			         strerror(errno));
		if (ok && rename(part, r->path) != 0)
			snprintf(r->unwritten, sizeof(r->unwritten), "cannot rename %.200s: %s", part,
			         strerror(errno));
		else
			r->recorded = ok;
	}
	if (!r->recorded)
		unlink(part); /* half a file, or one that failed: no reader sees it */
	q4kh_sha256_free(r->md);
	r->md = NULL;
}

void q4kh_f2_ref_note(const char *path, const char *what)
{
	char log[4200];
	int fd;
	ssize_t w;

	snprintf(log, sizeof(log), "%s.log", path);
	fd = open(log, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
	if (fd < 0)
		return;
	/* one short write with O_APPEND: lines of two children never mix */
	w = dprintf(fd, "%s\n", what);
	(void)w; /* a count is not worth failing a measurement for */
	close(fd);
}

void q4kh_f2_ref_counts(const char *path, int *computed, int *read)
{
	char log[4200], line[64];
	FILE *f;

	*computed = *read = 0;
	snprintf(log, sizeof(log), "%s.log", path);
	if (!(f = fopen(log, "re")))
		return;
	while (fgets(line, sizeof(line), f)) {
		*computed += !strcmp(line, "computed\n");
		*read += !strcmp(line, "read\n");
	}
	fclose(f);
}
