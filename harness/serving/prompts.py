"""Prompts of a true token length when no local tokenizer is given: calibrated with the server's own.

Three sources, best first (`calibrate` picks one, `method` forces one):

- ``tokenizer``: a local tokenizer (--tokenizer DIR, or --model as a directory): exact, offline
  (workload.PromptTokenizer).
- ``server-tokenize``: the server's ``POST /tokenize`` (vLLM). Words that are one token each are
  found by asking it, and every prompt is counted by it before it is sent: exact.
- ``server-vocab``: the server's own token ids (token_prompts.py), for a tokenizer with too few
  one-token English words; ``auto`` falls back to it from ``server-tokenize``. Exact for any
  tokenizer: id prompts on completions, detokenized ids counted by /tokenize on chat.
- ``usage-probes``: any OpenAI-compatible server. Short probe requests (``max_tokens`` 1) of known
  words give, through ``usage.prompt_tokens``, the tokens the server adds to a prompt and which
  words cost one token; prompts are then built blind from those words, and the run's usage says
  whether they came out right (runs.py marks a run invalid otherwise).

Prompts are made of whole words, each written with its leading space (" cache"), so that the count
of a text is the sum of its words' counts on any tokenizer that splits on whitespace first. In
chat mode the server wraps the message in its chat template: that overhead is measured the same
ways (tokenize the messages, or a probe) and taken off the message, so that ``--input-len`` is the
prompt the model sees in both APIs.
"""

from __future__ import annotations

import asyncio
import random
from functools import partial
from dataclasses import dataclass, field, asdict
from typing import Awaitable, Callable

import aiohttp

from ..errors import CheckFailed, UsageError
from .client import RequestSpec, Target
from . import token_prompts
from .token_prompts import post_json as _post_json
from .workload import PromptTokenizer, Workload

METHODS = ("auto", "tokenizer", "server-tokenize", "server-vocab", "usage-probes")

# Common English words, and the words of the harness's own tiny models' corpus (which a tiny
# tokenizer does know as whole tokens). Only those the server counts as one token are used.
WORDS = """
the model server cache layer batch memory weights report driver token tokens prompt adapter user
small long every four heads loads measures predicts streams merges checks serves trains fits
writes reads compares allocates file context window mask rate learning gradients parameters
again before after without within budget quickly twice times question answer why one two three
five six seven eight nine ten time year people way day man thing woman life child world school
state family student group country problem hand part place case week company system program work
government number night point home water room mother area money story fact month lot right study
book eye job word business issue side kind head house service friend father power hour game line
end member law car city community name president team minute idea kid body information back parent
face others level office door health person art war history party result change morning reason
research girl guy moment air teacher force education foot boy age policy process music market sense
nation plan college interest death experience effect use class control care field development role
effort rate heart drug show leader light voice wife police mind price son hope view blue red green
and of to in for on with as at by from up about into over after new good high old great big other
make get go know take see come think look want give find tell ask feel try leave call keep let
begin seem help talk turn start might run move like live believe hold bring happen must write
provide sit stand lose pay meet include continue set learn lead understand watch follow stop create
speak read allow add spend grow open walk win offer remember love consider appear buy wait serve die
send expect build stay fall cut reach kill remain suggest raise pass sell require decide pull
""".split()


@dataclass
class Calibration:
    """How prompts of a given length are built for one server and API, and what that cost."""

    method: str  # tokenizer | server-tokenize | usage-probes | uncalibrated (the probes failed)
    api: str
    specials: int = 0  # tokens the server adds to a completion prompt (a BOS, say)
    chat_overhead: int | None = None  # tokens the chat template adds around one user message
    words: list[str] = field(default_factory=list)  # " word" units of exactly one token
    token_ids: list[int] = field(default_factory=list)  # server-vocab: the ids prompts are drawn from
    requests: int = 0  # calibration requests sent (/tokenize or probes)
    exact: bool = False  # every prompt was counted before it was sent
    note: str | None = None

    @property
    def overhead(self) -> int:
        """Tokens of a prompt that are not the text we wrote."""
        return (self.chat_overhead or 0) if self.api == "chat" else self.specials

    @property
    def tolerance(self) -> int:
        """How far a request's actual prompt tokens may miss the requested length (issue rule:
        1 token for completions; the measured chat-template overhead for chat)."""
        return max(1, self.chat_overhead or 0) if self.api == "chat" else 1

    def to_json(self) -> dict:
        data = asdict(self)
        data["words"] = len(self.words)
        data["token_ids"] = len(self.token_ids)
        data["tolerance"] = self.tolerance
        return data


Count = Callable[[str], Awaitable[int]]  # text -> prompt tokens the server sees for it


# what a bench user passes to give a local tokenizer (the serving suite names its own --model DIR)
BENCH_TOKENIZER_OPTION = "--tokenizer DIR (or --model as a local directory)"

def _tokenize_counter(session: aiohttp.ClientSession, target: Target, chat: bool, stats: Calibration) -> Count:
    async def count(text: str) -> int:
        body: dict = {"model": target.model}
        if chat:
            body["messages"] = [{"role": "user", "content": text}]
        else:
            body["prompt"] = text
        stats.requests += 1
        status, data = await _post_json(session, target.base_url + "/tokenize", body)
        if status != 200 or not data or not isinstance(data.get("count"), int):
            raise CheckFailed(f"POST {target.base_url}/tokenize answered {status} while calibrating prompt lengths")
        return data["count"]

    return count


def _probe_counter(session: aiohttp.ClientSession, target: Target, chat: bool, stats: Calibration,
                   option: str = "--tokenizer DIR") -> Count:
    """usage.prompt_tokens of a one-token request: what the server counted for `text`; `option` is
    what the caller's user passes to give a local tokenizer instead (said in the error)."""

    async def count(text: str) -> int:
        body: dict = {"model": target.model, "max_tokens": 1, "temperature": 0.0, "stream": False}
        if chat:
            path, body["messages"] = "/v1/chat/completions", [{"role": "user", "content": text}]
        else:
            path, body["prompt"] = "/v1/completions", text
        stats.requests += 1
        status, data = await _post_json(session, target.base_url + path, body, timeout_s=target.timeout_s)
        usage = (data or {}).get("usage") or {}
        if status != 200 or not isinstance(usage.get("prompt_tokens"), int):
            raise CheckFailed(f"a calibration probe to {target.base_url}{path} answered {status} without "
                              f"usage.prompt_tokens: cannot measure prompt lengths (give {option})")
        return usage["prompt_tokens"]

    return count


async def has_tokenize(session: aiohttp.ClientSession, target: Target) -> bool:
    status, data = await _post_json(session, target.base_url + "/tokenize", {"model": target.model, "prompt": " the"})
    return status == 200 and bool(data) and isinstance(data.get("count"), int)


async def _one_token_words(count: Count, specials: int, candidates: list[str], want: int = 64,
                           limit: int = 4) -> list[str]:
    """Up to `want` candidates that cost exactly one token, found by counting groups of 8 (a group
    of k words that costs k tokens is k one-token words) and each word of a group that costs more."""
    sem = asyncio.Semaphore(limit)

    async def cost(words: list[str]) -> int:
        async with sem:
            return await count("".join(words)) - specials

    async def search(words: list[str]) -> list[str]:
        if await cost(words) == len(words):
            return words
        costs = await asyncio.gather(*(cost([w]) for w in words))
        return [w for w, c in zip(words, costs) if c == 1]

    groups = [candidates[i:i + 8] for i in range(0, len(candidates), 8)]
    found: list[str] = []
    for start in range(0, len(groups), limit):
        for words in await asyncio.gather(*(search(g) for g in groups[start:start + limit])):
            found += words
        if len(found) >= want:
            break
    return found


async def calibrate(session: aiohttp.ClientSession, target: Target, tokenizer: PromptTokenizer | None,
                    method: str = "auto", tokenizer_option: str = BENCH_TOKENIZER_OPTION) -> Calibration:
    """Find out how to build prompts of an exact length for this server (see the module doc).
    `tokenizer_option` is what the caller's user passes to give a local tokenizer (said in errors)."""
    if method not in METHODS:
        raise UsageError(f"--prompt-calibration: {method!r} is not one of {', '.join(METHODS)}")
    chat = target.api == "chat"
    auto = method == "auto"  # may fall back to the server's vocabulary when words do not work
    if method == "tokenizer" and tokenizer is None:
        raise UsageError(f"--prompt-calibration tokenizer needs {tokenizer_option}")
    if method == "auto":
        if tokenizer is not None:
            method = "tokenizer"
        else:
            method = "server-tokenize" if await has_tokenize(session, target) else "usage-probes"
    cal = Calibration(method=method, api=target.api)
    if method in ("server-tokenize", "server-vocab") and not await has_tokenize(session, target):
        raise CheckFailed(f"{target.base_url} has no POST /tokenize (not vLLM?): use --prompt-calibration usage-probes")
    if method == "server-vocab":
        return await _vocab_calibration(session, target)
    counter = _tokenize_counter if method == "server-tokenize" else partial(_probe_counter, option=tokenizer_option)
    plain = counter(session, target, False, cal)
    if method == "tokenizer":
        cal.specials, cal.exact = tokenizer._specials, True
    elif method == "usage-probes":
        try:
            await _measure_words(cal, plain, target, tokenizer_option)
        except CheckFailed as exc:
            # A server that fails every request: build word prompts anyway, so that the bench
            # records and classifies its failures; should requests succeed after all, their
            # usage still checks the lengths (stats.prompt_lengths).
            return Calibration(method="uncalibrated", api=target.api, words=[" " + w for w in dict.fromkeys(WORDS)],
                               requests=cal.requests, note=str(exc))
    else:
        try:
            await _measure_words(cal, plain, target, tokenizer_option)
        except TooFewWords:
            if not auto:
                raise
            return await _vocab_calibration(session, target, requests=cal.requests)
    if chat:
        chat_count = counter(session, target, True, cal)
        probe = cal.words[:8] if cal.words else None
        if probe is None:  # local tokenizer: one whole-word text of known length
            text, _ = tokenizer.text_of_length(tokenizer._specials + 8, random.Random(0))
            cal.chat_overhead = await chat_count(text) - 8
        else:
            cal.chat_overhead = await chat_count("".join(probe)) - len(probe)
        if cal.chat_overhead < 0:
            raise CheckFailed(f"{target.base_url}: a chat message counted fewer tokens than its text; cannot "
                              "calibrate chat prompt lengths")
    return cal


class TooFewWords(CheckFailed):
    """The server's tokenizer has too few common English words as single tokens."""


async def _vocab_calibration(session: aiohttp.ClientSession, target: Target, requests: int = 0) -> Calibration:
    """server-vocab: the ids to draw prompts from, and what the server adds around them."""
    cal = Calibration(method="server-vocab", api=target.api, requests=requests, exact=True)
    cal.token_ids = await token_prompts.id_pool(session, target)
    cal.requests += 1
    if target.api == "chat":
        text = await token_prompts.detokenize(session, target, cal.token_ids[:8])
        bare = await token_prompts.count_text(session, target, text)
        cal.chat_overhead = await _tokenize_counter(session, target, True, cal)(text) - bare
        cal.requests += 2
    else:
        cal.specials = await token_prompts.id_prompt_specials(session, target, cal.token_ids)
        cal.requests += 1
    cal.note = "prompts drawn from the server's own token ids (too few one-token English words)" if requests else None
    return cal


async def _measure_words(cal: Calibration, plain: Count, target: Target, option: str = "--tokenizer DIR") -> None:
    """The tokens the server adds to a prompt, and the candidate words that cost one token."""
    # A word repeated 9 times against once: 8 words' cost apart.
    for word in WORDS[:8]:
        once, nine = await plain(" " + word), await plain((" " + word) * 9)
        if (nine - once) == 8:
            cal.specials = once - 1
            break
    else:
        raise TooFewWords(f"{target.base_url}: no common English word counts as one token; give {option}")
    cal.words = await _one_token_words(plain, cal.specials, [" " + w for w in dict.fromkeys(WORDS)])
    if len(cal.words) < 16:
        raise TooFewWords(f"{target.base_url}: only {len(cal.words)} common words count as one token; "
                          f"give {option}")
    cal.exact = cal.method == "server-tokenize"


async def build_specs(session: aiohttp.ClientSession, target: Target, workload: Workload, cal: Calibration,
                      tokenizer: PromptTokenizer | None = None, concurrency: int = 8) -> list[RequestSpec]:
    """`workload.num_prompts` distinct prompts of `workload.input_len` prompt tokens as the server
    counts them (template included in chat), sharing `prefix_len` tokens when asked; with a length
    distribution, each prompt of its own drawn length (and output length), built length by length."""
    if not workload.varied:
        return await _fixed_specs(session, target, workload, cal, tokenizer, concurrency)
    plan = workload.lengths()
    by_input: dict[int, list[int]] = {}
    for k, (n_in, _) in enumerate(plan):
        by_input.setdefault(n_in, []).append(k)
    specs: list[RequestSpec | None] = [None] * len(plan)
    if min(by_input) - cal.overhead < 1:
        raise UsageError(f"--input-dist {workload.input_dist} drew a prompt of {min(by_input)} tokens, no room for "
                         f"text beside the {cal.overhead} the server adds: use a smaller --len-spread")
    for n_in, ks in sorted(by_input.items()):
        part = Workload(input_len=n_in, output_len=workload.output_len, num_prompts=len(ks),
                        prefix_len=workload.prefix_len, api=workload.api, seed=workload.seed * 100_003 + n_in)
        # the shared prefix drawn with the workload's own seed, so that every length shares it
        specs_n = await _fixed_specs(session, target, part, cal, tokenizer, concurrency, prefix_seed=workload.seed)
        for k, spec in zip(ks, specs_n):
            spec.output_tokens = plan[k][1]
            specs[k] = spec
    return specs  # type: ignore[return-value]


async def _fixed_specs(session: aiohttp.ClientSession, target: Target, workload: Workload, cal: Calibration,
                       tokenizer: PromptTokenizer | None, concurrency: int,
                       prefix_seed: int | None = None) -> list[RequestSpec]:
    n, overhead = workload.input_len, cal.overhead
    if n - overhead < 1:
        what = "the chat template adds" if cal.api == "chat" else "the server adds"
        raise UsageError(f"--input-len {n} leaves no room for text: {what} {overhead} tokens (measured with {cal.method})")
    if workload.prefix_len and workload.prefix_len - overhead < 1 and cal.api == "chat":
        raise UsageError(f"--prefix-len {workload.prefix_len} is within the chat template's {overhead} tokens")
    rng = random.Random(workload.seed)
    if cal.method == "tokenizer":
        return _local_specs(workload, cal, tokenizer, rng)
    if cal.method == "server-vocab":
        if cal.api == "chat":
            return await token_prompts.chat_specs(session, target, cal.token_ids, cal.overhead, n, workload.output_len,
                                                  workload.num_prompts, workload.prefix_len, workload.seed)
        return token_prompts.completion_specs(cal.token_ids, cal.specials, n, workload.output_len,
                                              workload.num_prompts, workload.prefix_len, workload.seed)
    prefix_rng = rng if prefix_seed is None else random.Random(prefix_seed)
    prefix = [prefix_rng.choice(cal.words) for _ in range(max(0, workload.prefix_len - overhead))]
    bodies = [prefix + [rng.choice(cal.words) for _ in range(n - overhead - len(prefix))]
              for _ in range(workload.num_prompts)]
    if not cal.exact:
        return [RequestSpec(prompt="".join(b), input_tokens=0, output_tokens=workload.output_len,
                            requested_input_tokens=n) for b in bodies]
    count = _tokenize_counter(session, target, cal.api == "chat", cal)
    sem = asyncio.Semaphore(concurrency)

    async def exact(words: list[str], seed: int) -> RequestSpec:
        local = random.Random(seed)
        async with sem:
            got = await count("".join(words))
            for _ in range(8):  # a word that merged with its neighbour: add or drop words
                if got == n:
                    break
                if got < n:
                    words = words + [local.choice(cal.words) for _ in range(n - got)]
                elif len(words) - (got - n) > len(prefix):
                    words = words[:len(words) - (got - n)]
                else:
                    break
                got = await count("".join(words))
        return RequestSpec(prompt="".join(words), input_tokens=got, output_tokens=workload.output_len,
                           requested_input_tokens=n)

    return list(await asyncio.gather(*(exact(b, workload.seed * 1_000_003 + i) for i, b in enumerate(bodies))))


def _local_specs(workload: Workload, cal: Calibration, tokenizer: PromptTokenizer, rng: random.Random) -> list[RequestSpec]:
    from .workload import build_specs as local_build

    if cal.api != "chat":
        specs = local_build(workload, tokenizer)
        for spec in specs:
            spec.requested_input_tokens = workload.input_len
        return specs
    # Chat: the message's text is input_len - template overhead tokens (its own specials aside).
    body = workload.input_len - cal.overhead
    prefix = min(workload.prefix_len, body - 1) if workload.prefix_len else 0
    inner = Workload(input_len=body + tokenizer._specials, output_len=workload.output_len,
                     num_prompts=workload.num_prompts, prefix_len=prefix, seed=workload.seed)
    specs = local_build(inner, tokenizer)
    for spec in specs:
        spec.input_tokens = workload.input_len
        spec.requested_input_tokens = workload.input_len
    return specs


def make_specs(target: Target, workload: Workload, tokenizer: PromptTokenizer | None = None,
               calibration: Calibration | None = None,
               tokenizer_option: str = BENCH_TOKENIZER_OPTION) -> tuple[list[RequestSpec], Calibration]:
    """Synchronous `calibrate` (unless given) + `build_specs`, for callers outside an event loop."""
    from .client import make_session

    async def run():
        session = make_session()
        try:
            cal = calibration or await calibrate(session, target, tokenizer, tokenizer_option=tokenizer_option)
            return await build_specs(session, target, workload, cal, tokenizer), cal
        finally:
            await session.close()

    return asyncio.run(run())
