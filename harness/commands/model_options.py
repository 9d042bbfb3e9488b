"""The options `estimate` and `plan` share, declared once and read once: --config, --precision,
--new-tokens, --lora-r, --lora-targets, --optimizer, --[no-]grad-checkpointing, --budget,
--context-bytes, --[no-]replay and --json (docs/architecture.md's estimate contract: `--new-tokens K`, `--lora-r R`, one
value each). Values stay strings for argparse, so every bad one is a one-line UsageError naming its
option (exit 2), the same in both commands.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from ..errors import UsageError
from ..memory.fit.budget import DEFAULT_CONTEXT_BYTES
from ..memory.fit.estimate import DEFAULT_NEW_TOKENS
from ..units import comma_list, format_size, int_list, parse_bytes

DEFAULT_LORA_R = 16


def add_shared_options(parser: argparse.ArgumentParser, *, precision_help: str, budget_help: str,
                       replay_help: str, config_repeats: bool = False) -> None:
    """Declare the shared options on one command's parser; the two help texts differ by command.
    `config_repeats`: --config may be given more than once (a list; plan's two models on one card)."""
    parser.add_argument("--config", required=True, metavar="DIR|config.json|NAME",
                        action="append" if config_repeats else "store",
                        help="model directory, config.json, a .gguf file, or a reference name (harness/configs)"
                             + ("; twice: two models on one card" if config_repeats else ""))
    parser.add_argument("--precision", default=None, help=precision_help)
    parser.add_argument("--new-tokens", default=str(DEFAULT_NEW_TOKENS),
                        help=f"tokens generated after the prompt (default {DEFAULT_NEW_TOKENS}; "
                             "plan counts them in the context)")
    parser.add_argument("--lora-r", default=str(DEFAULT_LORA_R), help=f"training: LoRA rank (default {DEFAULT_LORA_R})")
    parser.add_argument("--lora-targets", default=None,
                        help="training: comma list of module names, or all-linear (default: all attention and "
                             "MLP projections)")
    parser.add_argument("--optimizer", default="adamw_torch",
                        help="training: adamw_torch (default), adamw_8bit, paged_adamw_32bit or paged_adamw_8bit")
    gc = parser.add_mutually_exclusive_group()
    gc.add_argument("--grad-checkpointing", dest="grad_checkpointing", action="store_true", default=True,
                    help="training with gradient checkpointing (default)")
    gc.add_argument("--no-grad-checkpointing", dest="grad_checkpointing", action="store_false")
    parser.add_argument("--budget", default=None, help=budget_help)
    parser.add_argument("--context-bytes", default=None,
                        help="CUDA context + driver reservation the card loses "
                             f"(default {format_size(DEFAULT_CONTEXT_BYTES).replace(' ', '')})")
    parser.add_argument("--replay", action=argparse.BooleanOptionalAction, default=None,
                        help=replay_help + " (harness.memory.replay.step_trace: nf4-dq / fp4-dq QLoRA, traced on the meta "
                                           "device, about 10 s a setting; needs transformers, peft and bitsandbytes)")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")


@dataclass(frozen=True)
class SharedOptions:
    """The shared options, parsed and checked."""

    new_tokens: int
    lora_r: int
    lora_targets: tuple[str, ...]
    optimizer: str
    grad_checkpointing: bool
    budget_bytes: int | None
    context_bytes: int


def one_int(text: str, flag: str, minimum: int) -> int:
    """A single integer option (a comma list is refused, not cut to its first item)."""
    values = int_list(text, flag, minimum)
    if len(values) != 1:
        raise UsageError(f"{flag}: {text!r} is a list; give one value")
    return values[0]


def read_shared_options(args: argparse.Namespace) -> SharedOptions:
    from ..memory.fit.lora import DEFAULT_LORA_TARGETS, optimizer_name

    targets = comma_list(args.lora_targets, "--lora-targets") if args.lora_targets is not None else DEFAULT_LORA_TARGETS
    try:
        optimizer = optimizer_name(args.optimizer)
    except UsageError as exc:
        raise UsageError(f"--optimizer: {exc}") from None
    budget = parse_bytes(args.budget, "--budget") if args.budget else None
    context = parse_bytes(args.context_bytes, "--context-bytes") if args.context_bytes else DEFAULT_CONTEXT_BYTES
    if budget is not None and budget <= context:  # e.g. 6MB for 6GB: the same words in estimate and plan
        raise UsageError(f"--budget: {args.budget} leaves nothing after the {format_size(context)} CUDA context "
                         "(--context-bytes); a card's VRAM is GiB (6GiB)")
    return SharedOptions(
        new_tokens=one_int(args.new_tokens, "--new-tokens", 0),
        lora_r=one_int(args.lora_r, "--lora-r", 1),
        lora_targets=targets,
        optimizer=optimizer,
        grad_checkpointing=args.grad_checkpointing,
        budget_bytes=budget,
        context_bytes=context,
    )


def read_precisions(text: str | None, default: tuple[str, ...], allowed: tuple[str, ...]) -> tuple[str, ...]:
    """--precision: a comma list of `allowed`, or `default` when not given."""
    return comma_list(text, "--precision", choices=allowed, lower=True) if text else default
