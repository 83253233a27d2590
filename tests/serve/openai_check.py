"""q4khost serve through the openai Python client, as applications talk to
it: chat and completions, streamed and not, each greedy answer identical
to q4khost run's for the same prompt and settings; usage counts; another
model name, answered by the one model loaded. Exit 0 when every check passed.
Usage: openai_check.py URL Q4KHOST MODEL PLUGIN_PATH N PROMPT..."""
import sys

import openai

from common import model_id, run_answer


def main():
    url, q4khost, model, plugin_path, n = sys.argv[1:6]
    prompts, n = sys.argv[6:], int(n)
    client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)
    mid = model_id(model)
    checks = 0

    assert [m.id for m in client.models.list().data] == [mid]
    checks += 1
    for prompt in prompts:
        chat, chat_tokens = run_answer(q4khost, model, plugin_path, prompt, n, True)
        raw, raw_tokens = run_answer(q4khost, model, plugin_path, prompt, n, False)
        messages = [{"role": "user", "content": prompt}]

        r = client.chat.completions.create(model=mid, messages=messages,
                                           max_tokens=n, temperature=0)
        assert r.choices[0].message.content == chat, (prompt, r.choices[0].message.content, chat)
        assert r.choices[0].finish_reason in ("stop", "length")
        assert r.usage.prompt_tokens == chat_tokens, (r.usage, chat_tokens)
        assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens
        assert r.usage.completion_tokens <= n

        parts, usage, token_events = [], None, 0
        for c in client.chat.completions.create(model=mid, messages=messages, max_tokens=n,
                                                temperature=0, stream=True,
                                                stream_options={"include_usage": True}):
            if c.choices:
                parts.append(c.choices[0].delta.content or "")
                token_events += c.choices[0].delta.role is None and \
                    c.choices[0].finish_reason is None
            if c.usage:
                usage = c.usage
        assert "".join(parts) == chat, (prompt, "".join(parts), chat)
        assert usage and usage.prompt_tokens == chat_tokens
        # events as tokens are made (tokens made between two reads share
        # one), also while their bytes are held back
        assert 0 < token_events <= usage.completion_tokens, (token_events, usage)

        r = client.completions.create(model=mid, prompt=prompt, max_tokens=n, temperature=0)
        assert r.choices[0].text == raw, (prompt, r.choices[0].text, raw)
        assert r.usage.prompt_tokens == raw_tokens

        parts = [c.choices[0].text for c in client.completions.create(
            model=mid, prompt=prompt, max_tokens=n, temperature=0, stream=True) if c.choices]
        assert "".join(parts) == raw, (prompt, "".join(parts), raw)
        checks += 4

    # a client's fixed model name is served by the one model loaded, as
    # llama-server does, the served id in the response
    r = client.chat.completions.create(model="gpt-4", max_tokens=n, temperature=0,
                                       messages=[{"role": "user", "content": prompts[0]}])
    assert r.model == mid, (r.model, mid)
    assert r.choices[0].message.content == run_answer(q4khost, model, plugin_path, prompts[0],
                                                      n, True)[0]
    checks += 1
    print("openai client: %d checks passed" % checks)


if __name__ == "__main__":
    main()
