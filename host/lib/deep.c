#include "deep.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gguf.h"
#include "model.h"
#include "prompt.h"
#include "tokenizer.h"

/*
 * The lengths where a backend's kernels or the model change behaviour, in
 * positions: the prefill chunks of docs/architecture.md section 6
 * (session.h's n_batch), the tiles and split ranges of the CUDA attention
 * kernels (plugins/cuda/cuda_flash.cu, cuda_attention.cu) and the lengths
 * issue 16 names. The model's sliding window is added from its file.
 */
static const uint32_t deep_lengths[] = {
	/* cuda: flash-decoding's shortest key range (SPLIT_MIN_KEYS), the key
	 * tile of 256-dimension heads (flash_tile) */
	32,
	/* cuda: a flash-attention block's queries (FLASH_BM) and key tile,
	 * the older kernel's ATTN_CHUNK (the reference's chunks do not
	 * matter: its logits are the same bits for any chunking) */
	64,
	128,  /* cpu-fast's prefill chunk (n_batch) */
	512,  /* a GPU backend's prefill chunk (n_batch) */
	1024, /* two GPU prefill chunks; issue 16's 1,024 */
	/* cuda: flash-decoding's ranges grow past 32 keys times its ranges
	 * (plan_split: 1,056 keys for the 8B shape on 132 multiprocessors,
	 * 2,112 for Qwen3-30B-A3B's), so a deep probe crosses the edge;
	 * a run's default context */
	4096,
};

/* Every position is judged up to here, then every DEEP_STRIDE-th. */
#define DEEP_DENSE 128
#define DEEP_STRIDE 8
#define DEEP_EDGE 2 /* each length is judged +-2 */

/* A chat turn, laid out by the model's template: the suite's first text. */
static const struct q4kh_chat_msg deep_chat[] = {
	{ "user", "I have a small balcony that faces north. Which herbs could I grow there, "
	          "and how often should I water them?" },
	{ "assistant", "A north-facing balcony gets little direct sun, so choose herbs that "
	               "tolerate shade: mint, parsley, chives, chervil and lemon balm all do "
	               "well. Water when the top two centimetres of soil feel dry, which in "
	               "cool weather may be only once a week; pots in wind dry out faster." },
	{ "user", "Thanks. Mint spreads a lot, doesn't it? Should it get its own pot?" },
};

/* The rest of the suite, read as plain text after the chat turn. */
static const char *const deep_texts[] = {
	/* prose */
	"Yes, give mint a pot of its own: its runners creep under the soil and "
	"choke slower neighbours within a season.\n\n"
	"The lighthouse keeper kept two logs. The first recorded the weather at "
	"six, noon and six again: wind in knots, the height of the swell, whether "
	"the lamp's glass had salted over. The second was private, a ledger of "
	"small kindnesses and small failures, written in pencil so that nothing "
	"in it felt final. When the station was automated the inspectors took the "
	"first book to the archive in the county town and never asked about the "
	"second. She kept it in a biscuit tin until the winter the roof leaked, "
	"and then, for reasons she could not explain to her nephew, she read it "
	"aloud to him over three evenings, skipping nothing.\n\n",
	/* code */
	"```python\n"
	"def merge_intervals(intervals):\n"
	"    \"\"\"Merge overlapping [start, end) intervals; returns a sorted list.\"\"\"\n"
	"    merged = []\n"
	"    for start, end in sorted(intervals):\n"
	"        if merged and start <= merged[-1][1]:\n"
	"            merged[-1][1] = max(merged[-1][1], end)\n"
	"        else:\n"
	"            merged.append([start, end])\n"
	"    return merged\n\n"
	"assert merge_intervals([(5, 8), (1, 3), (2, 4)]) == [[1, 4], [5, 8]]\n"
	"```\n\n"
	"```c\n"
	"static size_t count_words(const char *s)\n"
	"{\n"
	"\tsize_t n = 0;\n"
	"\tint in_word = 0;\n\n"
	"\tfor (; *s; s++) {\n"
	"\t\tif (isspace((unsigned char)*s))\n"
	"\t\t\tin_word = 0;\n"
	"\t\telse if (!in_word) {\n"
	"\t\t\tin_word = 1;\n"
	"\t\t\tn++;\n"
	"\t\t}\n"
	"\t}\n"
	"\treturn n;\n"
	"}\n"
	"```\n\n",
	/* other languages */
	"Le marché du samedi ouvre à sept heures. Les maraîchers arrivent avant "
	"l'aube, déchargent les cageots de poireaux et de pommes, et boivent un café "
	"brûlant en attendant les premiers clients.\n"
	"Im Herbst sammeln die Kinder Kastanien im Park und bauen daraus kleine "
	"Tiere mit Streichhölzern als Beinen; die schönsten stehen dann wochenlang "
	"auf der Fensterbank.\n"
	"El tren nocturno cruza la meseta sin prisa: a las tres de la madrugada "
	"se detiene en una estación vacía, y solo se oye el viento en los cables.\n"
	"雨の日の図書館は静かで、窓の外の木々がゆっくり揺れている。"
	"子どもたちは絵本を広げ、大人は新聞をめくる。\n"
	"Зимой озеро замерзает так крепко, что по льду можно дойти до острова "
	"за двадцать минут.\n\n",
	/* numbers */
	"Quarterly figures (thousands): Q1 1,284.6; Q2 1,309.2; Q3 1,151.8; "
	"Q4 1,427.0. Total 5,172.6, up 3.9% on the year before. The median lead "
	"time fell from 11.5 to 9.25 days; returns were 0.82% of units shipped. "
	"Pi to twenty places is 3.14159265358979323846, and 2^32 = 4294967296.\n\n",
};

/* Bytes of the generated ledger of one pass through the suite. */
#define LEDGER_BYTES 2048

/*
 * Numbers that do not repeat from one pass through the suite to the next:
 * ledger lines drawn from a fixed linear congruential sequence seeded by
 * the pass, so every pass reads new digits.
 */
static void ledger(unsigned pass, char *buf, size_t cap)
{
	uint32_t x = 2654435761u * (pass + 1);
	size_t used = 0;
	long balance = 100000;

	buf[0] = 0;
	for (int line = 0; line < 16 && used < cap; line++) {
		unsigned qty, cents;

		x = x * 1664525u + 1013904223u;
		qty = 1 + (x >> 24) % 90;
		x = x * 1664525u + 1013904223u;
		cents = 100 + (x >> 12) % 4900;
		balance += (x >> 31) ? (long)(qty * cents) : -(long)(qty * cents);
		used += (size_t)snprintf(buf + used, cap - used,
		                         "Entry %u-%02d: %u crates at %u.%02u each, %s %u.%02u; balance %ld.%02ld\n",
		                         pass + 1, line + 1, qty, cents / 100, cents % 100,
		                         (x >> 31) ? "received" : "paid", qty * cents / 100,
		                         qty * cents % 100, balance / 100, labs(balance % 100));
	}
}

/* Append IDS[0..n) to *out (*n_out of them, *cap room), growing it. */
static int append(int32_t **out, size_t *n_out, size_t *cap, const int32_t *ids, size_t n,
                  struct q4kh_error *err)
{
	if (*n_out + n > *cap) {
		size_t want = (*n_out + n) * 2;
		int32_t *p = realloc(*out, want * sizeof(*p));

		if (!p)
			return q4kh_fail(err, "deep probe: out of memory for %zu tokens", want);
		*out = p;
		*cap = want;
	}
	memcpy(*out + *n_out, ids, n * sizeof(*ids));
	*n_out += n;
	return 0;
}

/* TEXT's tokens, without BOS, appended to *out. */
static int append_text(const struct q4kh_tokenizer *tok, const char *text, int32_t **out,
                       size_t *n_out, size_t *cap, struct q4kh_error *err)
{
	int32_t *ids;
	size_t n;
	int rc;

	if (q4kh_tokenize(tok, text, strlen(text), 0, 0, &ids, &n, err))
		return -1;
	rc = append(out, n_out, cap, ids, n, err);
	free(ids);
	return rc;
}

/* The suite's tokens until there are WANT: the chat turn, then the texts
 * and a new ledger, pass after pass. */
static int suite_tokens(const struct q4kh_gguf *g, const struct q4kh_tokenizer *tok,
                        size_t want, int32_t **out, struct q4kh_error *err)
{
	struct q4kh_prompt p;
	char numbers[LEDGER_BYTES];
	size_t n = 0, cap = 0;
	int32_t *ids;

	*out = NULL;
	if (q4kh_prompt_init(&p, g, NULL, 1, err) ||
	    q4kh_prompt_tokenize_msgs(&p, tok, deep_chat, sizeof(deep_chat) / sizeof(deep_chat[0]),
	                              &ids, &n, err))
		return -1;
	*out = ids;
	cap = n;
	for (unsigned pass = 0; n < want; pass++) {
		for (size_t i = 0; i < sizeof(deep_texts) / sizeof(deep_texts[0]); i++)
			if (append_text(tok, deep_texts[i], out, &n, &cap, err))
				goto fail;
		ledger(pass, numbers, sizeof(numbers));
		if (append_text(tok, numbers, out, &n, &cap, err))
			goto fail;
	}
	return 0;
fail:
	free(*out);
	*out = NULL;
	return -1;
}

/* Judge length AT +-DEEP_EDGE when it fits below the prefill's end, and
 * name it in plan->lengths (*used bytes so far) with SUFFIX. */
static void add_length(struct q4kh_deep_plan *plan, uint32_t at, const char *suffix,
                       size_t *used)
{
	if ((int64_t)at + DEEP_EDGE >= plan->prefill)
		return;
	for (int64_t p = (int64_t)at - DEEP_EDGE; p <= (int64_t)at + DEEP_EDGE; p++)
		if (p >= 1)
			plan->judged[p] = 1;
	*used += (size_t)snprintf(plan->lengths + *used, sizeof(plan->lengths) - *used, "%s%u%s",
	                          *used ? " " : "", at, suffix);
}

/* The table's lengths and the model's sliding window SWA (0: none), in
 * order, into PLAN. */
static void mark_lengths(struct q4kh_deep_plan *plan, uint32_t swa)
{
	size_t used = 0;

	for (size_t i = 0; i < sizeof(deep_lengths) / sizeof(deep_lengths[0]); i++) {
		if (swa && swa <= deep_lengths[i]) {
			add_length(plan, swa, " (sliding window)", &used);
			if (swa == deep_lengths[i]) {
				swa = 0;
				continue;
			}
			swa = 0;
		}
		add_length(plan, deep_lengths[i], "", &used);
	}
	if (swa)
		add_length(plan, swa, " (sliding window)", &used);
}

/* The multiply-adds of M's positions (struct q4kh_deep_cost). Every 2-D
 * and 3-D tensor of a layer ("blk.") is a weight matrix applied to each
 * position; of an expert tensor only the experts a position goes through. */
static struct q4kh_deep_cost deep_cost(const struct q4kh_model *m)
{
	const struct q4kh_hparams *hp = &m->hp;
	struct q4kh_deep_cost c = { 0 };

	for (uint64_t i = 0; i < m->gguf->n_tensors; i++) {
		const struct q4kh_gguf_tensor *t = &m->gguf->tensors[i];
		double n = (double)t->ne[0] * (double)t->ne[1];

		if (t->n_dims < 2 || t->name.len < 4 || memcmp(t->name.data, "blk.", 4))
			continue;
		c.weights += t->n_dims == 3 && hp->n_expert ? n * hp->n_expert_used : n * t->ne[2];
	}
	c.output = (double)hp->n_vocab * hp->n_embd;
	/* q . k and the weighted sum of v, per head, per key */
	for (uint32_t l = 0; l < hp->n_layer; l++)
		if (!m->layers[l].recurrent)
			*(m->layers[l].swa && hp->n_swa ? &c.attn_swa : &c.attn_full) +=
				2.0 * hp->n_head * hp->head_dim;
	c.swa = hp->n_swa;
	return c;
}

double q4kh_deep_work(const struct q4kh_deep_plan *plan, int64_t from, int64_t to,
                      int all_rows, double logits_row)
{
	const struct q4kh_deep_cost *c = &plan->cost;
	const double row = logits_row < 0 ? c->output : logits_row;
	double w = 0;

	for (int64_t p = from; p < to; p++) {
		const double keys = (double)(p + 1);

		w += c->weights + c->attn_full * keys +
		     c->attn_swa * (c->swa && keys > c->swa ? c->swa : keys) +
		     (all_rows || plan->judged[p] ? row : 0);
	}
	return w;
}

int q4kh_deep_probe(const char *model_path, uint32_t ctx, int32_t **ids,
                    struct q4kh_deep_plan *plan, struct q4kh_error *err)
{
	const size_t n_lengths = sizeof(deep_lengths) / sizeof(deep_lengths[0]);
	struct q4kh_model *m = NULL;
	struct q4kh_tokenizer *tok = NULL;
	uint32_t cap, swa, longest = 0;
	int64_t rows;
	int rc = -1;

	memset(plan, 0, sizeof(*plan));
	*ids = NULL;
	if (q4kh_model_open(model_path, &m, err) || q4kh_tokenizer_load(m->gguf, &tok, err))
		goto out;
	cap = m->hp.n_ctx_train;
	if (ctx && (!cap || ctx < cap))
		cap = ctx;
	swa = m->hp.n_swa;
	/* past the longest length and its edge, else as far as the context
	 * lets the prefill go before the decode steps */
	for (size_t i = 0; i < n_lengths; i++)
		longest = deep_lengths[i] > longest ? deep_lengths[i] : longest;
	longest = swa > longest ? swa : longest;
	plan->decode_steps = Q4KH_DEEP_DECODE_STEPS;
	plan->prefill = (int64_t)longest + Q4KH_DEEP_PAST;
	if (cap && plan->prefill + Q4KH_DEEP_DECODE_STEPS > (int64_t)cap)
		plan->prefill = (int64_t)cap - Q4KH_DEEP_DECODE_STEPS;
	if (plan->prefill < Q4KH_DEEP_MIN_PREFILL) {
		q4kh_fail(err, "a context of %u positions (the smaller of --ctx and the model's %u) leaves %lld for the deep probe's prefill, fewer than %d: give --ctx %d or more",
		          cap, m->hp.n_ctx_train, (long long)plan->prefill, Q4KH_DEEP_MIN_PREFILL,
		          Q4KH_DEEP_MIN_PREFILL + Q4KH_DEEP_DECODE_STEPS);
		goto out;
	}
	rows = plan->prefill + plan->decode_steps;
	if (!(plan->judged = calloc((size_t)rows, 1))) {
		q4kh_fail(err, "deep probe: out of memory for %lld positions", (long long)rows);
		goto out;
	}
	for (int64_t p = 1; p < plan->prefill; p++)
		plan->judged[p] = p <= DEEP_DENSE || p % DEEP_STRIDE == 0;
	mark_lengths(plan, swa);
	plan->judged[plan->prefill - 1] = 1; /* its argmax feeds the first step */
	for (int64_t p = plan->prefill; p < rows; p++)
		plan->judged[p] = 1;
	for (int64_t p = 0; p < rows; p++)
		plan->n_judged += plan->judged[p];
	plan->cost = deep_cost(m);
	rc = suite_tokens(m->gguf, tok, (size_t)plan->prefill, ids, err);
out:
	if (rc)
		q4kh_deep_plan_free(plan);
	q4kh_tokenizer_free(tok);
	q4kh_model_free(m);
	return rc;
}

void q4kh_deep_plan_free(struct q4kh_deep_plan *plan)
{
	free(plan->judged);
	plan->judged = NULL;
	plan->n_judged = 0;
}

void q4kh_deep_describe(const struct q4kh_deep_plan *plan, char *buf, size_t cap)
{
	snprintf(buf, cap,
	         "deep probe: %lld positions judged of %lld, up to position %lld, %u decode steps (lengths crossed: %s)",
	         (long long)plan->n_judged, (long long)(plan->prefill + plan->decode_steps),
	         (long long)(plan->prefill + plan->decode_steps - 1), plan->decode_steps,
	         plan->lengths);
}
