#!/usr/bin/env python3
"""Write tests/fixtures/tokenizer-pre.json: llama.cpp's token ids for the
byte-level BPE pre-tokenizers beyond Llama 3's, Qwen 2's and GPT-2's
(those are in tokenizer-bpe.json), the oracle of tests/test_bpe.c; and,
when scripts/fetch-deepseek-vocab.py has fetched it, llama.cpp's ids for
the real DeepSeek-R1-Distill-Qwen-7B vocabulary (152,064 tokens).

A pre-tokenizer is the split of the text before merges, and that split is
what differs between families, so one vocabulary serves them all. It must
show the split in its ids: tiny-qwen2.gguf's (Qwen 2.5's first 4096
tokens) rarely has a token across a word boundary, so the generator adds
"glue": for every two tokens that stand side by side in llama.cpp's output
for the corpus under any of the families, a merge of the two (ranked after
all of Qwen's) and its token, which then form exactly where a family keeps
the two in one word. That vocabulary is tests/fixtures/vocab-pre.gguf
(vocab-only: the qwen2 header of tiny-qwen2.gguf, the glued vocabulary;
committed); the fixture has llama.cpp's ids for it with tokenizer.ggml.pre
set to each family's name (tests/helpers.c builds the same file for the C
side). llama.cpp loads it with vocab_only=True; to be sure it applied the
name given, the generator checks that each family's ids differ from Qwen
2's on some case (and equal them everywhere for "deepseek-r1-qwen", an
alias of "qwen2").

The corpus: the cases of tokenizer-bpe.json (scripts/gen-arch-fixtures.py)
plus cases aimed at these splits: digit grouping, CJK, kana and Hangul
runs, Greek and Cyrillic, full-width punctuation, trailing white space,
capitals inside words, combining marks, white space beyond ASCII.

Usage: scripts/gen-pretokenizer-fixture.py [FIXTURES_DIR]
"""
import importlib.util
import json
import struct
import os
import sys
import tempfile

from scripthelp import answer_help
answer_help(__doc__)  # before what may be missing

import llama_cpp

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import synthgguf  # noqa: E402

PRES = ["qwen2", "deepseek-r1-qwen", "deepseek-llm", "deepseek-v3", "qwen35", "smollm",
        "tekken", "gpt-4o", "llama4"]
DEEPSEEK_VOCAB = os.path.expanduser(
    "~/.cache/q4khost/vocab/deepseek-r1-distill-qwen-7b.vocab.gguf")


def load(name):
    spec = importlib.util.spec_from_file_location(name.replace("-", "_"),
                                                  os.path.join(HERE, name + ".py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def split_corpus():
    c = []

    def add(name, text, add_bos=True, special=False):
        c.append((name, text.encode("utf-8") if isinstance(text, str) else text, add_bos, special))

    add("digits_groups", "7 42 123 1234 12345 123456 1234567 12345678 x1y22z333 ٣٤٥٦")
    add("cjk_kana_hangul", "日本語のテキスト、カタカナ。中文字符串龘 한국어 문장입니다")
    add("greek_cyrillic", "Ελληνικά κείμενα και Русский текст, ǅemal ǈ ﬁne ﬀ Ꭰ")
    add("fullwidth_punct", "Ｈｅｌｌｏ！　世界？（ｔｅｓｔ）「引用」‘quote’ “double”…")
    add("trailing_ws", "end of line   ")
    add("trailing_ws_nl", "end  \n  next\t\t\n")
    add("only_trailing", "   \t ")
    add("camel_case", "HTTPServer getURLFor iPhone McDonald's XMLHttpRequest ABCdef aBC")
    add("caps_contractions", "DON'T YOU'LL It's I'M we'RE They'Ve")
    add("combining_marks", "e\u0301te\u0301 n\u0303 a\u0308\u0304 \u0915\u093f\u0924\u093e\u092c")
    add("slashes", "path/to/file//x a/ b /c\n/\n")
    add("punct_letters", "!hello ?World .net #tag @user $var (x)y [a]b")
    add("wide_space", "a\u3000b\u00a0c\u2003d\u0085e\u2028f\u202fg \u3000 h")
    add("wide_space_edges", "\u3000\u3000lead trail\u00a0\u00a0")
    add("symbols", "x+y=z <tag> a|b ~c ^d `e` 5% $3 € £ © ™ → ∑")
    add("mixed_lines", "line1\r\nline2\rline3\n\n\nline4\r\n\r\n")
    add("specials_qwen", "<|im_start|>user\n123<|im_end|>\n", special=True)
    return c


def vocab_with_pre(base_kvs, pre):
    """A temporary vocab-only copy of the vocabulary BASE_KVS with PRE."""
    kvs = [(k, synthgguf.kv_raw(k, pre) if k == "tokenizer.ggml.pre" else raw)
           for k, raw in base_kvs]
    fd, path = tempfile.mkstemp(suffix=".gguf")
    os.close(fd)
    synthgguf.write_header_only(path, kvs)
    return path


def array_value(raw, key):
    """The elements of a stored array pair (strings, or int32 values)."""
    at = 8 + len(key.encode()) + 4
    et, n = struct.unpack_from("<IQ", raw, at)
    at += 12
    if et == 5:
        return list(struct.unpack_from("<%di" % n, raw, at))
    out = []
    for _ in range(n):
        k, = struct.unpack_from("<Q", raw, at)
        out.append(raw[at + 8:at + 8 + k].decode("utf-8"))
        at += 8 + k
    return out


def glued(base_kvs, corpus):
    """BASE_KVS with a merge and a token for every pair of normal tokens
    side by side in llama.cpp's output for CORPUS under any family."""
    kv = dict(base_kvs)
    tokens = array_value(kv["tokenizer.ggml.tokens"], "tokenizer.ggml.tokens")
    types = array_value(kv["tokenizer.ggml.token_type"], "tokenizer.ggml.token_type")
    merges = array_value(kv["tokenizer.ggml.merges"], "tokenizer.ggml.merges")
    have, pairs = set(merges), set()
    for pre in PRES:
        path = vocab_with_pre(base_kvs, pre)
        try:
            for ids in ids_for(path, corpus):
                pairs.update((a, b) for a, b in zip(ids, ids[1:])
                             if types[a] == synthgguf.NORMAL and types[b] == synthgguf.NORMAL)
        finally:
            os.remove(path)
    known = set(tokens)
    for a, b in sorted(pairs):
        merge = tokens[a] + " " + tokens[b]
        if merge in have:
            continue
        merges.append(merge)
        have.add(merge)
        if tokens[a] + tokens[b] not in known:
            known.add(tokens[a] + tokens[b])
            tokens.append(tokens[a] + tokens[b])
            types.append(synthgguf.NORMAL)
    new = {"tokenizer.ggml.tokens": tokens, "tokenizer.ggml.token_type": types,
           "tokenizer.ggml.merges": merges}
    return [(k, synthgguf.kv_raw(k, new[k]) if k in new else raw) for k, raw in base_kvs]


def case_list(gemma, corpus):
    out = []
    for name, text, add_bos, special in corpus:
        case = {"name": name}
        case.update(gemma.text_fields("text", text))
        case.update({"add_bos": add_bos, "parse_special": special})
        out.append(case)
    return out


def ids_for(path, corpus):
    llm = llama_cpp.Llama(model_path=path, vocab_only=True, verbose=False)
    return [llm.tokenize(text, add_bos=add_bos, special=special)
            for _, text, add_bos, special in corpus]


def deepseek_corpus(gemma, arch):
    c = gemma.corpus() + arch.bpe_corpus() + split_corpus()

    def add(name, text, add_bos=True, special=True):
        c.append((name, text.encode("utf-8"), add_bos, special))

    add("r1_chat", "<｜User｜>Hello<｜Assistant｜>")
    add("r1_chat_plain", "<｜User｜>Hello<｜Assistant｜>", special=False)
    add("r1_chat_nobos", "<｜User｜>Hello<｜Assistant｜>", add_bos=False)
    add("r1_think", "<｜User｜>What is 7 * 6?<｜Assistant｜><think>\nSeven sixes.\n</think>\n\n42"
                    "<｜end▁of▁sentence｜>")
    add("r1_bos_in_text", "<｜begin▁of▁sentence｜>text")
    add("r1_fim", "<｜fim▁begin｜>a<｜fim▁hole｜>b<｜fim▁end｜>")
    add("r1_tools", "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>f"
                    "<｜tool▁call▁end｜><｜tool▁calls▁end｜>")
    add("r1_near_special", "<｜User <｜Assistant| ｜User｜>")
    return c + gemma.random_corpus(200)


def main():
    fixtures = sys.argv[1] if len(sys.argv) > 1 else os.path.join(HERE, "..", "tests", "fixtures")
    gemma = load("gen-tokenizer-fixture")
    arch = load("gen-arch-fixtures")
    corpus = gemma.corpus() + arch.bpe_corpus() + split_corpus() + gemma.random_corpus(200)
    with open(os.path.join(fixtures, "tiny-qwen2.gguf"), "rb") as f:
        base = glued(synthgguf.read_header_kvs(f.read()), corpus)
    synthgguf.write_header_only(os.path.join(fixtures, "vocab-pre.gguf"), base)
    doc = {"generator": "scripts/gen-pretokenizer-fixture.py",
           "oracle": "llama.cpp via llama-cpp-python %s" % llama_cpp.__version__,
           "vocabulary": "vocab-pre.gguf, tokenizer.ggml.pre replaced",
           "cases": case_list(gemma, corpus), "ids": {}}
    for pre in PRES:
        path = vocab_with_pre(base, pre)
        try:
            doc["ids"][pre] = ids_for(path, corpus)
        finally:
            os.remove(path)
        differ = sum(a != b for a, b in zip(doc["ids"][pre], doc["ids"]["qwen2"]))
        if pre != "qwen2" and (pre == "deepseek-r1-qwen") != (differ == 0):
            raise RuntimeError("%s: %d cases differ from qwen2: is the name applied?" % (pre, differ))
        print("%s: %d cases, %d differ from qwen2" % (pre, len(corpus), differ), file=sys.stderr)
    with open(os.path.join(fixtures, "tokenizer-pre.json"), "w", encoding="utf-8") as f:
        json.dump(doc, f, ensure_ascii=False, indent=0, separators=(",", ":"))
        f.write("\n")
    if not os.path.exists(DEEPSEEK_VOCAB):
        print("%s absent: no DeepSeek fixture (scripts/fetch-deepseek-vocab.py)" % DEEPSEEK_VOCAB,
              file=sys.stderr)
        return
    ds = deepseek_corpus(gemma, arch)
    llm = llama_cpp.Llama(model_path=DEEPSEEK_VOCAB, vocab_only=True, verbose=False)
    vocab = llama_cpp.llama_model_get_vocab(llm.model)
    n_vocab = llama_cpp.llama_vocab_n_tokens(vocab)
    cases = case_list(gemma, ds)
    for case, (_, text, add_bos, special) in zip(cases, ds):
        case["ids"] = llm.tokenize(text, add_bos=add_bos, special=special)
    with open(os.path.join(fixtures, "tokenizer-deepseek-r1.json"), "w", encoding="utf-8") as f:
        json.dump({"generator": "scripts/gen-pretokenizer-fixture.py",
                   "oracle": doc["oracle"], "vocabulary": os.path.basename(DEEPSEEK_VOCAB),
                   "n_vocab": n_vocab, "bos": llama_cpp.llama_vocab_bos(vocab),
                   "eos": llama_cpp.llama_vocab_eos(vocab),
                   "eog": [t for t in range(n_vocab) if llama_cpp.llama_vocab_is_eog(vocab, t)],
                   "cases": cases}, f, ensure_ascii=False, indent=0, separators=(",", ":"))
        f.write("\n")
    print("deepseek-r1: %d cases" % len(cases), file=sys.stderr)


if __name__ == "__main__":
    main()
