/*
 * SentencePiece-style fragments (tokenizer.ggml.model = "llama"), as
 * llama.cpp's llm_tokenizer_spm_session encodes them: spaces become U+2581,
 * adjacent pieces merge by the highest score of the token they form, and a
 * character with no token becomes its <0xXX> byte tokens.
 */
#include "tokenizer_impl.h"

#include <string.h>


/* Two pieces merge when their concatenation is a token; its score ranks. */
static int spm_pair(struct enc *e, const struct sym *left,
                    const struct sym *right, float *score)
{
	int32_t id = q4kh_tok_find(e->t, e->buf + left->off, left->n + right->n);

	if (id < 0)
		return 0;
	*score = e->t->tok[id].score;
	return 1;
}

/*
 * Emit one final piece: its token, or its bytes as byte tokens. Merges only
 * ever form vocabulary tokens, so a piece without a token is a single
 * unmerged character, and llama.cpp's resegment along recorded merges
 * reduces to exactly this.
 */
static int emit_piece(struct enc *e, const struct sym *s,
                      struct q4kh_error *err)
{
	const struct q4kh_tokenizer *t = e->t;
	int32_t id = q4kh_tok_find(t, e->buf + s->off, s->n);

	for (uint32_t j = 0; id < 0 && j < s->n; j++) {
		uint8_t b = (uint8_t)e->buf[s->off + j];
		if (t->byte_tok[b] < 0)
			return q4kh_fail(err, "tokenizer: no token for byte 0x%02X "
			                 "(expected <0x%02X> in the vocabulary)",
			                 b, b);
		if (q4kh_tok_push(e, t->byte_tok[b]) < 0)
			return q4kh_fail(err, "tokenizer: out of memory");
	}
	if (id >= 0 && q4kh_tok_push(e, id) < 0)
		return q4kh_fail(err, "tokenizer: out of memory");
	return 0;
}

int q4kh_tok_spm_encode(struct enc *e, const char *s, size_t len, int prefix,
                        struct q4kh_error *err)
{
	char *buf = q4kh_tok_grow(e->buf, &e->cap_buf, 3 * len + 3, 1);
	size_t n = 0;

	if (!buf)
		return q4kh_fail(err, "tokenizer: out of memory");
	e->buf = buf;
	if (prefix) {
		memcpy(e->buf, SPACE_MARK, SPACE_MARK_LEN);
		n = SPACE_MARK_LEN;
	}
	for (size_t i = 0; i < len; i++) {
		if (s[i] == ' ') {
			memcpy(e->buf + n, SPACE_MARK, SPACE_MARK_LEN);
			n += SPACE_MARK_LEN;
		} else {
			e->buf[n++] = s[i];
		}
	}
	if (q4kh_tok_merge(e, n, spm_pair) < 0)
		return q4kh_fail(err, "tokenizer: out of memory");
	for (int32_t i = 0; n && i >= 0; i = e->sym[i].next)
		if (emit_piece(e, &e->sym[i], err) < 0)
			return -1;
	return 0;
}
