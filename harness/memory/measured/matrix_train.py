"""The GPU matrix's training cases: LoRA on each precision of TRAIN_PRECISIONS, every rank and length,
checkpointing on and off, each case TRAIN_STEPS optimizer steps on one batch. The functions taking a
`worker` run them on matrix.Worker (its allocator cap, case recording and deadline)."""

from __future__ import annotations

TRAIN_PRECISIONS = ("bf16", "nf4-dq")
TRAIN_RANKS = (8, 64)
TRAIN_LENS = (512, 2048)
TRAIN_STEPS = 3


def optimizer_steps(model, opt, ids, steps: int) -> list[float]:
    """`steps` training steps on one batch (labels = input ids); the losses. Each step's outputs
    are dropped before the next so its logits do not overlap the next forward."""
    losses = []
    for _ in range(steps):
        out = model(input_ids=ids, labels=ids)
        out.loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(float(out.loss.detach()))
        del out
    return losses


def train_cases(arch: str, precision: str) -> list[dict]:
    return [dict(arch=arch, precision=precision, mode="train", seq_len=seq, batch=1, lora_r=r,
                 grad_checkpointing=gc_on)
            for gc_on in (True, False) for r in TRAIN_RANKS for seq in TRAIN_LENS]


def train_step_fn(worker, base, precision: str, r: int, seq: int, gc_on: bool):
    t = worker.torch
    from peft import LoraConfig, get_peft_model

    from ..fit.lora import DEFAULT_LORA_TARGETS

    ids = worker.ids(base, 1, seq)

    def fn():
        cfg = LoraConfig(r=r, lora_alpha=2 * r, lora_dropout=0.05, target_modules=list(DEFAULT_LORA_TARGETS),
                         task_type="CAUSAL_LM")
        if gc_on:
            base.gradient_checkpointing_enable()
            base.enable_input_require_grads()
        else:
            base.gradient_checkpointing_disable()
        base.config.use_cache = False
        model = get_peft_model(base, cfg)
        opt = None
        try:
            model.train()
            opt = t.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4)
            return optimizer_steps(model, opt, ids, TRAIN_STEPS)
        finally:
            del opt
            model.unload()
            if gc_on:
                base.gradient_checkpointing_disable()
    return fn


def load_for_training(worker, precision: str):
    from ...models import load_model

    base = load_model(worker.model_dir(), precision, worker.device)
    if precision != "bf16":
        from peft import prepare_model_for_kbit_training

        base = prepare_model_for_kbit_training(base, use_gradient_checkpointing=False)
    return base


def run_train(worker, precision: str) -> None:
    cases = worker.todo(train_cases(worker.arch, precision))
    if not cases or worker.out_of_time():
        return
    worker.cap(True)
    base, loaded = None, True
    try:
        base = load_for_training(worker, precision)
    except Exception as exc:
        if not (isinstance(exc, worker.torch.OutOfMemoryError) or "out of memory" in str(exc).lower()):
            raise
        base, loaded = None, False
    if base is None:
        worker.cap(False)
        base = load_for_training(worker, precision)
    worker.cap(False)
    for case in cases:
        if worker.out_of_time():
            break
        fn = train_step_fn(worker, base, precision, case["lora_r"], case["seq_len"], case["grad_checkpointing"])
        worker.record(case, fn, fits_under_budget=None if loaded else False)
    worker.unload(base)
