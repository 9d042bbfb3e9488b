"""The same request through the official openai SDK: a second client to hold the harness's own
against (greedy decoding: the same tokens whoever asks). Its body carries what the harness's
client sends (client.request_body): exactly n_out tokens (vLLM's ignore_eos and min_tokens) and
special tokens as text, so the two texts compare one for one."""

from __future__ import annotations


def sdk_text(base_url: str, model: str, api: str, prompt: str, n_out: int, timeout_s: float = 120.0) -> str:
    """The text of one greedy n_out-token answer from /v1/completions (api "completions") or
    /v1/chat/completions ("chat", the prompt as one user message), asked with the openai SDK."""
    import openai

    client = openai.OpenAI(base_url=base_url + "/v1", api_key="EMPTY", max_retries=0, timeout=timeout_s)
    extra = {"ignore_eos": True, "min_tokens": n_out, "skip_special_tokens": False}
    with client:
        if api == "chat":
            r = client.chat.completions.create(model=model, messages=[{"role": "user", "content": prompt}],
                                               max_tokens=n_out, temperature=0.0, extra_body=extra)
            return r.choices[0].message.content or ""
        r = client.completions.create(model=model, prompt=prompt, max_tokens=n_out, temperature=0.0, extra_body=extra)
        return r.choices[0].text or ""
