#!/usr/bin/env python3
"""Write tests/fixtures/chat-templates.json: llama.cpp's chat formatting of
every family it recognises, the oracle of tests/test_chat.c.

For each family: a template text that llama.cpp detects as that family (a
snippet with the family's markers, as the family's own templates carry
them, or the family's name where no template text leads to it), and the
text llama_chat_apply_template (llama-cpp-python's low-level binding,
through ctypes) makes of a set of conversations, with and without the
assistant's opener. The generator checks that the snippet and the family's
name give the same text for every conversation, so each snippet is known
to be detected as its family. It also records templates llama.cpp does
not recognise, and, when the DeepSeek-R1-Distill-Qwen-7B vocabulary is
there (scripts/fetch-deepseek-vocab.py), that file's own template.

Usage: scripts/gen-chat-fixture.py [OUT.json]
"""
import ctypes
import json
import os
import sys

from scripthelp import answer_help
answer_help(__doc__)  # before what may be missing

import llama_cpp

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import synthgguf  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_OUT = os.path.join(HERE, "..", "tests", "fixtures", "chat-templates.json")
DEEPSEEK_VOCAB = os.path.expanduser(
    "~/.cache/q4khost/vocab/deepseek-r1-distill-qwen-7b.vocab.gguf")

# (family name, template text detected as it; None: the name itself)
FAMILIES = [
    ("chatml", "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + "
               "message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}"
               "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"),
    ("llama2", "{% for message in messages %}{% if message['role'] == 'user' %}"
               "{{ '[INST] ' + message['content'] + ' [/INST]' }}{% else %}"
               "{{ message['content'] + eos_token }}{% endif %}{% endfor %}"),
    ("llama2-sys", "{{ '[INST] ' }}{% if message['role'] == 'system' %}"
                   "{{ '<<SYS>>\\n' + message['content'] + '\\n<</SYS>>\\n\\n' }}{% endif %}"),
    ("llama2-sys-bos", "{{ bos_token + '[INST] ' + message['content'] }}"
                       "{{ '<<SYS>>\\n' + system_message + '\\n<</SYS>>\\n\\n' }}"),
    ("llama2-sys-strip", "{{ '[INST] ' + message['content'].strip() + ' [/INST]' }}"
                         "{% set content = message.content.strip() %}{{ '<<SYS>>' }}"),
    ("mistral-v1", "{{ bos_token }}{% if system_message %}{{ ' [INST] ' + system_message + "
                   "'\\n\\n' }}{% endif %}{{ ' [INST] ' + message['content'] + ' [/INST]' }}"),
    ("mistral-v3", "{%- if tools %}{{- '[AVAILABLE_TOOLS] [' }}{%- endif %}"
                   "{{- '[INST] ' + message['content'] + '[/INST]' }}"),
    ("mistral-v3-tekken", "{%- if tools %}{{- \"[AVAILABLE_TOOLS][\" }}{%- endif %}"
                          "{{- \"[INST]\" + message[\"content\"] + \"[/INST]\" }}"),
    ("mistral-v7", "{%- if message['role'] == 'system' %}{{- '[SYSTEM_PROMPT] ' + "
                   "message['content'] + '[/SYSTEM_PROMPT]' }}{%- else %}{{- '[INST] ' + "
                   "message['content'] + '[/INST]' }}{%- endif %}"),
    ("mistral-v7-tekken", None),
    ("phi3", "{% for message in messages %}{{'<|' + message['role'] + '|>' + '\\n' + "
             "message['content'] + '<|end|>\\n'}}{% endfor %}{% if add_generation_prompt %}"
             "{{ '<|assistant|>\\n' }}{% endif %}"),
    ("phi4", "{% for message in messages %}{{'<|im_start|>' + message['role'] + '<|im_sep|>' + "
             "message['content'] + '<|im_end|>'}}{% endfor %}{% if add_generation_prompt %}"
             "{{ '<|im_start|>assistant<|im_sep|>' }}{% endif %}"),
    ("falcon3", "{{ '<|user|>\\n' + message['content'] + '\\n' }}{{ '<|assistant|>\\n' + "
                "message['content'] + '</s>' }}"),
    ("zephyr", "{% for message in messages %}{{ '<|user|>\\n' + message['content'] + "
               "'<|endoftext|>\\n' }}{% endfor %}"),
    ("monarch", "{% for message in messages %}{{bos_token + message['role'] + '\\n' + "
                "message['content'] + eos_token + '\\n'}}{% endfor %}"),
    ("gemma", "{{ bos_token }}{% for message in messages %}{{ '<start_of_turn>' + role + '\\n' + "
              "message['content'] | trim + '<end_of_turn>\\n' }}{% endfor %}"),
    ("orion", "{% if message['role'] == 'user' %}{{ 'Human: ' + message['content'] + "
              "'\\n\\nAssistant: ' + eos_token }}{% endif %}"),
    ("openchat", "{{ 'GPT4 Correct ' + message['role'].title() + ': ' + message['content'] + "
                 "'<|end_of_turn|>'}}"),
    ("vicuna", "{% if message['role'] == 'user' %}{{ 'USER: ' + message['content'] + '\\n' }}"
               "{% else %}{{ 'ASSISTANT: ' + message['content'] + '</s>\\n' }}{% endif %}"),
    ("vicuna-orca", "{% if message['role'] == 'system' %}{{ 'SYSTEM: ' + message['content'] }}"
                    "{% elif message['role'] == 'user' %}{{ 'USER: ' + message['content'] }}"
                    "{% else %}{{ 'ASSISTANT: ' + message['content'] }}{% endif %}"),
    ("deepseek", "{{'### Instruction:\\n' + message['content'] + '\\n'}}"
                 "{{'### Response:\\n' + message['content'] + '\\n<|EOT|>\\n'}}"),
    ("deepseek2", "{{ 'User: ' + message['content'] + '\\n\\n' }}"
                  "{{ 'Assistant: ' + message['content'] + eos_token }}"),
    ("deepseek3", "{{'<｜User｜>' + message['content']}}{{'<｜Assistant｜>' + "
                  "message['content'] + '<｜end▁of▁sentence｜>'}}"),
    ("deepseek-ocr", None),
    ("command-r", "{{ '<|START_OF_TURN_TOKEN|><|USER_TOKEN|>' + message['content'] + "
                  "'<|END_OF_TURN_TOKEN|>' }}"),
    ("llama3", "{{ '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' + "
               "message['content'] | trim + '<|eot_id|>' }}"),
    ("chatglm3", "{% for message in messages %}{% if loop.first %}[gMASK]sop<|{{ message['role'] "
                 "}}|>\\n {{ message['content'] }}{% endif %}{% endfor %}"),
    ("chatglm4", "[gMASK]<sop>{% for item in messages %}<|{{ item['role'] }}|>\\n"
                 "{{ item['content'] }}{% endfor %}"),
    ("glmedge", "{% for item in messages %}<|{{ item['role'] }}|>\\n{{ item['content'] }}"
                "{% endfor %}<|user|><|assistant|>"),
    ("minicpm", "{% for message in messages %}{% if message['role'] == 'user' %}"
                "{{'<用户>' + message['content'].strip() + '<AI>'}}{% else %}"
                "{{message['content'].strip()}}{% endif %}{% endfor %}"),
    ("exaone3", "{{ '[|system|]' + message['content'] + '[|endofturn|]\\n' }}"
                "{{ '[|assistant|]' + message['content'] + '[|endofturn|]\\n' }}"),
    ("exaone4", "{{ '[|system|]' }}{{ '[|assistant|]' }}{{ '[|tool|]' }}{{ '[|endofturn|]' }}"),
    ("exaone-moe", "{{ '<|system|>\\n' }}{{ '<|user|>\\n' }}{{ '<|assistant|>\\n' }}"
                   "{{ '<|tool_declare|>' }}{{ '<|endofturn|>' }}"),
    ("rwkv-world", "{%- for message in messages %}"
                   "{{- 'User: ' + message['content']|trim + '\\n\\n' -}}{%- endfor %}"),
    ("granite", "{%- for message in messages %}{{- '<|start_of_role|>' + message['role'] + "
                "'<|end_of_role|>' + message['content'] + '<|end_of_text|>\\n' }}{%- endfor %}"),
    ("granite-4.0", "{%- set g4_default_system_message = 'You are a helpful assistant.' %}"
                    "{{- '<|start_of_role|>' }}{{- '<tool_call>' }}"),
    ("granite-4.1", "{{- '<|start_of_role|>system<|end_of_role|>' }}{{- '<tools>' }}"),
    ("gigachat", "{{ message['role'] + additional_special_tokens[0] + message['content'] + "
                 "additional_special_tokens[1] }}"),
    ("megrez", "{{ '<|role_start|>' + message['role'] + '<|role_end|>' + message['content'] + "
               "'<|turn_end|>' }}"),
    ("yandex", "{{' Пользователь: ' + message['content'] + '\\n\\n'}}{{' Ассистент:'}}"),
    ("bailing", "{{ '<role>' + ('HUMAN' if message['role'] == 'user' else 'ASSISTANT') + "
                "'</role>' }}{{ '<role>ASSISTANT</role>' }}"),
    ("bailing-think", "{{ \"<role>HUMAN</role>\" if role == \"HUMAN\" }}"
                      "{{ '<role>ASSISTANT</role>' + '<think>' }}"),
    ("bailing2", "{{ '<role>HUMAN</role>' + message['content'] + '<|role_end|>' }}"
                 "{{ '<role>ASSISTANT</role>' }}"),
    ("llama4", "{{- '<|header_start|>' + message['role'] + '<|header_end|>\\n\\n' }}"),
    ("smolvlm", "<|im_start|>{% for message in messages %}{{message['role'] | capitalize}}: "
                "{{ message['content'] }}<end_of_utterance>\\n{% endfor %}"),
    ("dots1", "{{ '<|userprompt|>' + message['content'] + '<|endofuserprompt|>' }}"),
    ("hunyuan-moe", "{{ '<|startoftext|>' + message['content'] + '<|extra_0|>' }}"
                    "{{ '<|startoftext|>' + system + '<|extra_4|>' }}"),
    ("gpt-oss", "{{- '<|start|>' + message.role + '<|channel|>' + message.channel + "
                "'<|message|>' }}"),
    ("hunyuan-dense", "{{ '<｜hy_User｜>' + content + '<｜hy_Assistant｜>' }}"
                      "{{ system + '<｜hy_place▁holder▁no▁3｜>' }}"),
    ("hunyuan-vl", "{{ '<｜hy_begin▁of▁sentence｜>' }}{{ content + '<｜hy_Assistant｜>' }}"),
    ("kimi-k2", "{{ '<|im_user|>user<|im_middle|>' }}"
                "{{ '<|im_assistant|>assistant<|im_middle|>' }}"),
    ("seed_oss", "{{ '<seed:bos>' + message['role'] + '\\n' + message['content'] + "
                 "'<seed:eos>' }}"),
    ("grok-2", "{{ 'Assistant: '  + message['content'] + '<|separator|>\\n\\n' }}"),
    ("pangu-embedded", "{{ '[unused9]系统：[unused10]' }}"),
    ("solar-open", "{{ '<|begin|>' + message['role'] + '<|content|>' + message['content'] + "
                   "'<|end|>' }}"),
]

# Qwen3.5's template is ChatML to llama.cpp; a snippet of its shape.
EXTRA_DETECT = [
    ("chatml", "qwen3.5",
     "{%- if messages[0].role == 'system' %}{{- '<|im_start|>system\\n' + messages[0].content "
     "+ '<|im_end|>\\n' }}{%- endif %}{%- if add_generation_prompt %}"
     "{{- '<|im_start|>assistant\\n<think>\\n' }}{%- endif %}"),
]

UNKNOWN = [
    "{{ messages }}",
    "{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}",
    "",
    "mistra",
]

CONVERSATIONS = [
    ("one", [("user", "What is the capital of France?")], (True, False)),
    ("padded", [("user", "  spaced out \n\n")], (True,)),
    ("system", [("system", "You are terse."), ("user", "Hi!")], (True, False)),
    ("multi", [("user", "Hi"), ("assistant", " Hello. "), ("user", "Write a haiku.")],
     (True, False)),
    ("two_systems", [("system", " Be brief.\n"), ("user", "Q1"), ("assistant", "A1"),
                     ("system", "Now be verbose."), ("system", "\tAnd kind."),
                     ("user", "Q2")], (True,)),
    ("system_late", [("user", "Q1"), ("system", "Rules."), ("assistant", "A1"),
                     ("user", "Q2")], (True,)),
    ("tools", [("system", "You have tools."), ("user", "Call it."),
               ("assistant_tool_call", "{\"name\": \"f\"}"), ("tool", "42"),
               ("function", "f()"), ("assistant", "It is 42.")], (True, False)),
    ("ends_assistant", [("user", "Hello"), ("assistant", "Hi there")], (True, False)),
    ("empty", [], (True, False)),
    ("unicode", [("user", "Größe? 你好 🍕 ıi")], (True,)),
    ("specials", [("user", "<|im_start|>x<｜User｜>[INST]")], (True,)),
    ("lowercase_roles", [("model", "m"), ("other", "o"), ("", "empty role")], (True,)),
]


def apply(tmpl, msgs, add):
    arr = (llama_cpp.llama_chat_message * max(len(msgs), 1))(
        *[llama_cpp.llama_chat_message(r.encode(), c.encode()) for r, c in msgs])
    buf = ctypes.create_string_buffer(16384)
    n = llama_cpp.llama_chat_apply_template(tmpl.encode(), arr, len(msgs), add, buf, len(buf))
    if n < 0:
        return None
    if n > len(buf):
        raise RuntimeError("%r: %d bytes" % (tmpl[:40], n))
    return buf.raw[:n].decode("utf-8")


def family_doc(name, tmpl):
    text = tmpl if tmpl is not None else name
    cases = []
    for label, msgs, adds in CONVERSATIONS:
        for add in adds:
            out = apply(text, msgs, add)
            if out is None:
                raise RuntimeError("%s: llama.cpp does not recognise %r" % (name, text[:60]))
            # dots1 has no name in llama.cpp; the others must agree with theirs
            if name != "dots1" and apply(name, msgs, add) != out:
                raise RuntimeError("%s: the snippet is detected as another family" % name)
            cases.append({"name": label, "messages": [list(m) for m in msgs],
                          "add_assistant": add, "text": out})
    return {"family": name, "template": text, "cases": cases}


def gguf_template(path):
    """tokenizer.chat_template of a GGUF file, read from its header."""
    with open(path, "rb") as f:
        kvs = dict(synthgguf.read_header_kvs(f.read()))
    raw = kvs["tokenizer.chat_template"]
    # key (8-byte length + name), type (4 bytes), string (8-byte length + bytes)
    return raw[8 + len("tokenizer.chat_template") + 4 + 8:].decode("utf-8")


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else DEFAULT_OUT
    doc = {"generator": "scripts/gen-chat-fixture.py",
           "oracle": "llama.cpp llama_chat_apply_template via llama-cpp-python %s"
                     % llama_cpp.__version__,
           "families": [family_doc(n, t) for n, t in FAMILIES],
           "detect": [], "unknown": []}
    extra = list(EXTRA_DETECT)
    if os.path.exists(DEEPSEEK_VOCAB):
        extra.append(("deepseek3", "deepseek-r1-distill-qwen-7b", gguf_template(DEEPSEEK_VOCAB)))
    else:
        print("gen-chat-fixture: %s absent: its template is not recorded" % DEEPSEEK_VOCAB,
              file=sys.stderr)
    for family, label, text in extra:
        msgs = CONVERSATIONS[3][1]
        if apply(text, msgs, True) != apply(family, msgs, True):
            raise RuntimeError("%s is not detected as %s" % (label, family))
        doc["detect"].append({"name": label, "family": family, "template": text})
    for text in UNKNOWN:
        if apply(text, CONVERSATIONS[0][1], True) is not None:
            raise RuntimeError("%r is recognised" % text)
        doc["unknown"].append(text)
    with open(out, "w", encoding="utf-8") as f:
        json.dump(doc, f, ensure_ascii=False, indent=0)
        f.write("\n")
    print("%s: %d families, %d cases" % (out, len(doc["families"]),
                                         sum(len(f["cases"]) for f in doc["families"])))


if __name__ == "__main__":
    main()
