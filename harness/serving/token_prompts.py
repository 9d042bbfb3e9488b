"""Prompts of an exact token length for ANY tokenizer, without a local one: the server's own ids.

Word prompts (prompts.py) need whole words that cost one token each; a tokenizer trained on other
languages, a character- or byte-level one, has none. vLLM's `POST /tokenize` and `/detokenize`
give the server's vocabulary instead:

- ``/v1/completions``: the prompt is a list of token ids (the OpenAI API and vLLM accept one),
  drawn from ids the server produced for ordinary text: its length is the prompt's length by
  construction, plus what the server adds to an id prompt (measured with one probe), and usage
  checks it after the run;
- ``/v1/chat/completions``: a message must be text, so the text is the detokenized ids, counted
  with `/tokenize` (template included) and trimmed or extended id by id until it is exact.
"""

from __future__ import annotations

import asyncio
import random

import aiohttp

from ..errors import CheckFailed
from .client import RequestSpec, Target

# Text whose pieces are ordinary ids in most vocabularies: letters of several scripts, digits,
# punctuation, the common words; a byte-level tokenizer of any language yields its byte ids.
_SEED_TEXT = ("the model server cache layer batch memory tokens prompt 0123456789 , . ; : ! ? ( ) - "
              "abcdefghijklmnopqrstuvwxyz ABCDEFGHIJKLMNOPQRSTUVWXYZ αβγδεζηθικλμνξοπρστυφχψω "
              "абвгдежзийклмнопрстуфхцчшщыэюя")
MIN_POOL = 8


async def post_json(session: aiohttp.ClientSession, url: str, body: dict, timeout_s: float = 30.0) -> tuple[int, dict | None]:
    try:
        async with asyncio.timeout(timeout_s):
            async with session.post(url, json=body) as resp:
                try:
                    data = await resp.json(content_type=None)
                except (ValueError, aiohttp.ContentTypeError):
                    data = None
                return resp.status, data if isinstance(data, dict) else None
    except TimeoutError:
        raise CheckFailed(f"{url} did not answer within {timeout_s:g} s while calibrating prompt lengths") from None
    except (aiohttp.ClientError, OSError) as exc:
        raise CheckFailed(f"cannot reach {url} while calibrating prompt lengths: {type(exc).__name__}: {exc}") from None


async def _post(session: aiohttp.ClientSession, url: str, body: dict) -> dict:
    status, data = await post_json(session, url, body)
    if status != 200 or data is None:
        raise CheckFailed(f"POST {url} answered {status} while building prompts from the server's vocabulary")
    return data


async def id_pool(session: aiohttp.ClientSession, target: Target) -> list[int]:
    """Distinct ids the server's tokenizer gives ordinary text (its specials not added)."""
    data = await _post(session, target.base_url + "/tokenize",
                       {"model": target.model, "prompt": _SEED_TEXT, "add_special_tokens": False})
    ids = sorted({t for t in data.get("tokens") or [] if isinstance(t, int) and t >= 0})
    if len(ids) < MIN_POOL:
        raise CheckFailed(f"{target.base_url}/tokenize gave only {len(ids)} distinct ids for ordinary text: "
                          "cannot build prompts from its vocabulary")
    return ids


async def detokenize(session: aiohttp.ClientSession, target: Target, ids: list[int]) -> str:
    data = await _post(session, target.base_url + "/detokenize", {"model": target.model, "tokens": ids})
    return str(data.get("prompt", ""))


async def count_text(session: aiohttp.ClientSession, target: Target, text: str) -> int:
    """Tokens of `text` alone (no specials added)."""
    data = await _post(session, target.base_url + "/tokenize",
                       {"model": target.model, "prompt": text, "add_special_tokens": False})
    return int(data["count"])


async def id_prompt_specials(session: aiohttp.ClientSession, target: Target, pool: list[int]) -> int:
    """Tokens the server adds to a prompt given as ids (0 on vLLM), from one 1-token probe."""
    ids = pool[:8]
    body = {"model": target.model, "prompt": ids, "max_tokens": 1, "temperature": 0.0, "stream": False}
    status, data = await post_json(session, target.base_url + "/v1/completions", body, timeout_s=target.timeout_s)
    usage = (data or {}).get("usage") or {}
    if status != 200 or not isinstance(usage.get("prompt_tokens"), int):
        raise CheckFailed(f"{target.base_url}/v1/completions refused a prompt of token ids ({status}): cannot "
                          "build exact prompts from its vocabulary")
    return usage["prompt_tokens"] - len(ids)


def completion_specs(pool: list[int], specials: int, n: int, out: int, num: int, prefix_len: int,
                     seed: int) -> list[RequestSpec]:
    """`num` id prompts of exactly `n` tokens as the server counts them, sharing `prefix_len`."""
    rng = random.Random(seed)
    body = n - specials
    if body < 1:
        raise CheckFailed(f"--input-len {n} leaves no room: the server adds {specials} tokens to an id prompt")
    prefix = [rng.choice(pool) for _ in range(min(prefix_len, body - 1) if prefix_len else 0)]
    return [RequestSpec(prompt=prefix + [rng.choice(pool) for _ in range(body - len(prefix))], input_tokens=n,
                        output_tokens=out, requested_input_tokens=n) for _ in range(num)]


async def chat_specs(session: aiohttp.ClientSession, target: Target, pool: list[int], overhead: int, n: int,
                     out: int, num: int, prefix_len: int, seed: int, concurrency: int = 8) -> list[RequestSpec]:
    """Chat messages whose text is detokenized ids, exact by `/tokenize` of the whole message."""
    rng = random.Random(seed)
    body = n - overhead
    if body < 1:
        raise CheckFailed(f"--input-len {n} leaves no room for text: the chat template adds {overhead} tokens")
    prefix = [rng.choice(pool) for _ in range(min(max(0, prefix_len - overhead), body - 1))]
    sem = asyncio.Semaphore(concurrency)

    async def detok(ids: list[int]) -> str:
        return await detokenize(session, target, ids)

    async def count(text: str) -> int:
        data = await _post(session, target.base_url + "/tokenize",
                           {"model": target.model, "messages": [{"role": "user", "content": text}]})
        return int(data["count"])

    async def one(k: int) -> RequestSpec:
        local = random.Random(seed * 1_000_003 + k)
        ids = prefix + [local.choice(pool) for _ in range(body - len(prefix))]
        async with sem:
            text = await detok(ids)
            got = await count(text)
            for _ in range(12):  # ids that merge or split when the text is tokenized again
                if got == n:
                    break
                if got < n:
                    ids = ids + [local.choice(pool) for _ in range(n - got)]
                elif len(ids) - (got - n) > len(prefix):
                    ids = ids[:len(ids) - (got - n)]
                else:
                    ids = ids[:-1]
                text = await detok(ids)
                got = await count(text)
        return RequestSpec(prompt=text, input_tokens=got, output_tokens=out, requested_input_tokens=n)

    return list(await asyncio.gather(*(one(k) for k in range(num))))
