/*
 * Tokenizer built from a GGUF vocabulary (tokenizer.ggml.*), computing
 * what llama.cpp computes for the same file and text (src/llama-vocab.cpp).
 *
 * Special tokens are split out first (user-defined always, control and
 * unknown only with parse_special), longest text first. The rest goes to
 * the model's encoder, by tokenizer.ggml.model:
 *  - "llama": SentencePiece-style BPE over scores with byte fallback
 *    (llm_tokenizer_spm): spaces become U+2581 (and a leading U+2581 when
 *    tokenizer.ggml.add_space_prefix is true), adjacent pieces merge by
 *    highest score, leftmost first; a character with no token becomes its
 *    <0xXX> byte tokens.
 *  - "gpt2": byte-level BPE (llm_tokenizer_bpe): the pre-tokenizer named by
 *    tokenizer.ggml.pre ("llama-bpe", "qwen2", "qwen35", "gpt-2",
 *    "smollm", "tekken", "gpt-4o", "deepseek-llm", "deepseek-v3" and their
 *    aliases) splits the text with its regular expressions (PCRE2), each
 *    word's bytes become GPT-2's printable stand-ins, and adjacent pieces
 *    merge by lowest rank in tokenizer.ggml.merges.
 * A loaded tokenizer is read-only and thread-safe.
 */
#ifndef Q4KH_TOKENIZER_H
#define Q4KH_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>

#include "error.h"
#include "gguf.h"

struct q4kh_tokenizer;

/* Build the tokenizer from G's metadata. Copies what it needs; G may be
 * closed afterwards. -1 with err when a key is missing or inconsistent, or
 * names a tokenizer or pre-tokenizer we lack (the message names the key and
 * its value). */
int q4kh_tokenizer_load(const struct q4kh_gguf *g, struct q4kh_tokenizer **out,
                        struct q4kh_error *err);
void q4kh_tokenizer_free(struct q4kh_tokenizer *t);

/*
 * Encode LEN bytes of UTF-8 TEXT. add_bos: prepend BOS when the vocabulary
 * asks for it (tokenizer.ggml.add_bos_token), and append EOS when it asks
 * for that (add_eos_token), as llama.cpp's add_special does. parse_special:
 * match control tokens such as <start_of_turn> in the text. *ids is
 * malloc()ed and owned by the caller. Invalid UTF-8 bytes are encoded as
 * byte tokens.
 */
int q4kh_tokenize(const struct q4kh_tokenizer *t, const char *text, size_t len,
                  int add_bos, int parse_special, int32_t **ids, size_t *n,
                  struct q4kh_error *err);

/*
 * The text of token ID as it should be printed: U+2581 becomes a space and
 * <0xXX> that byte (SentencePiece), byte stand-ins their bytes (BPE),
 * control tokens become "" unless show_special.
 * Writes at most cap bytes (no NUL) and returns the full length, so a
 * return above cap means the piece was cut; buf may be NULL when cap is 0
 * (a call for the length alone). Returns 0 for an unknown id.
 */
size_t q4kh_token_to_piece(const struct q4kh_tokenizer *t, int32_t id,
                           int show_special, char *buf, size_t cap);

int32_t q4kh_tokenizer_n_vocab(const struct q4kh_tokenizer *t);
int32_t q4kh_tokenizer_bos(const struct q4kh_tokenizer *t);
int32_t q4kh_tokenizer_eos(const struct q4kh_tokenizer *t);
/* Token id whose text is exactly TEXT, or -1. */
int32_t q4kh_tokenizer_find(const struct q4kh_tokenizer *t, const char *text);
/* 1 when generation must stop at ID: EOS, end-of-turn (<end_of_turn>,
 * <|im_end|>, <|eot_id|>) or any token the vocabulary marks as such. */
int q4kh_tokenizer_is_eog(const struct q4kh_tokenizer *t, int32_t id);

#endif
