"""The allocator-history summary (harness.memory.tracking.snapshot) on hand-built traces shaped like
torch.cuda.memory._snapshot()'s: categories from stacks, the peak, frees, the window."""

from __future__ import annotations

from harness.memory.tracking.snapshot import LineRange, category, logits_ranges, summarise

MODELING = ".../transformers/models/gemma2/modeling_gemma2.py"
CAUSAL = [LineRange("gemma2/modeling_gemma2.py", 500, 560)]


def fr(*frames):
    return [{"filename": f, "line": line, "name": name} for f, line, name in frames]


def alloc(addr, size, frames):
    return {"action": "alloc", "addr": addr, "size": size, "frames": frames}


def free(addr, size, action="free_requested"):
    return {"action": action, "addr": addr, "size": size, "frames": []}


STEP = ("bench.py", 10, "optimizer_steps")
LOAD = fr(("x/modeling_utils.py", 4000, "from_pretrained"), ("harness/models.py", 350, "load_model"))
ATTN = fr(("torch/nn/functional.py", 1, "softmax"), (MODELING, 200, "eager_attention_forward"), STEP)
LM_HEAD = fr(("torch/nn/modules/linear.py", 125, "forward"), (MODELING, 530, "forward"), STEP)
LOSS = fr(("transformers/loss/loss_utils.py", 40, "ForCausalLMLoss"), (MODELING, 540, "forward"), STEP)
OPT = fr(("torch/optim/adamw.py", 99, "_init_group"), STEP)
PEFT = fr(("peft/tuners/lora/layer.py", 120, "update_layer"), ("peft/mapping.py", 20, "get_peft_model"))


def test_categories_follow_the_stack():
    assert category([], CAUSAL) == "backward"  # autograd's device thread has no Python stack
    assert category(LOAD, CAUSAL) == "weights"
    loader_thread = fr(("transformers/core_model_loading.py", 1465, "_materialize_copy"),
                       ("transformers/core_model_loading.py", 1486, "_job"))
    assert category(loader_thread, CAUSAL) == "weights"
    assert category(PEFT, CAUSAL) == "lora_weights"
    assert category(OPT, CAUSAL) == "optimizer"
    assert category(LM_HEAD, CAUSAL) == "logits_loss"
    assert category(LOSS, CAUSAL) == "logits_loss"
    assert category(ATTN, CAUSAL) == "activations"
    # the decoder's call sits on a line of the CausalLM forward too: only the innermost modeling
    # frame decides, so a layer's activation is not logits
    layer = fr(("torch/nn/functional.py", 1, "linear"), (MODELING, 300, "forward"), (MODELING, 520, "forward"), STEP)
    assert category(layer, CAUSAL) == "activations"
    assert category(fr(("cache_utils.py", 80, "update"), (MODELING, 250, "forward")), CAUSAL) == "kv_cache"
    assert category(fr(("generation/utils.py", 2600, "_sample")), CAUSAL) == "logits_loss"
    assert category(fr(("somewhere.py", 1, "f")), CAUSAL) == "other"


def test_peak_is_the_largest_live_total_inside_the_window():
    events = [alloc(1, 1000, LOAD),  # weights, before the step
              alloc(2, 5000, LOAD),  # a load-time spike: outside the window, so not the step's peak
              free(2, 5000), free(2, 5000, "free_completed"),
              alloc(3, 100, ATTN), alloc(4, 400, LM_HEAD), alloc(5, 300, []),
              free(4, 400), alloc(6, 50, OPT)]
    s = summarise({"device_traces": [events]}, CAUSAL, window="optimizer_steps", points=4)
    assert s["window_start"] == 4  # the first allocation under optimizer_steps
    assert s["peak_bytes"] == 1000 + 100 + 400 + 300
    assert s["peak_by_category"] == {"weights": 1000, "activations": 100, "logits_loss": 400, "backward": 300}
    assert s["unmatched_frees"] == 0  # the second free of addr 2 is its completion, not a stranger
    assert s["timeline"][0]["event"] == 4 and s["timeline"][-1]["total"] == 1000 + 100 + 300 + 50
    whole = summarise({"device_traces": [events]}, CAUSAL, window=None)
    assert whole["peak_bytes"] == 6000 and whole["window_start"] == 0


def test_the_largest_blocks_live_at_the_peak_name_their_code():
    events = [alloc(1, 1000, LOAD), alloc(3, 100, ATTN), alloc(4, 400, LM_HEAD), alloc(5, 300, []),
              free(4, 400), alloc(6, 50, OPT)]
    s = summarise({"device_traces": [events]}, CAUSAL, window="optimizer_steps")
    blocks = s["peak_blocks"]
    assert [b["size"] for b in blocks] == [1000, 400, 300, 100]  # live at the peak, made when they were
    assert blocks[1]["category"] == "logits_loss" and blocks[1]["where"].endswith(":530 forward")
    assert blocks[2]["category"] == "backward" and blocks[2]["where"] == ""


def test_the_peak_groups_hold_everything_but_the_weights_by_size_and_stack():
    grad = fr(("torch/autograd/graph.py", 1, "_engine_run_backward"))
    events = [alloc(1, 1000, LOAD), alloc(2, 1000, LOAD),
              alloc(3, 64, grad), alloc(4, 64, grad), alloc(5, 64, grad),  # three LoRA gradients of one size
              alloc(6, 100, ATTN), alloc(7, 100, ATTN), free(7, 100),
              alloc(8, 400, LM_HEAD), alloc(9, 500, [])]
    groups = summarise({"device_traces": [events]}, CAUSAL, window="optimizer_steps")["peak_groups"]
    assert all(g["category"] != "weights" for g in groups)  # the model is peak_by_category's, not a group
    by = {(g["category"], g["size"]): g for g in groups}
    assert by[("backward", 64)]["count"] == 3 and by[("backward", 64)]["first_event"] == 2
    assert by[("activations", 100)]["count"] == 1  # the freed one is not live at the peak
    assert by[("activations", 100)]["stack"].startswith("softmax < eager_attention_forward")
    assert [g["size"] * g["count"] for g in groups] == [500, 400, 192, 100]  # largest share first
    assert sum(g["size"] * g["count"] for g in groups) == 1192


def test_a_trace_that_lost_its_beginning_says_so():
    events = [free(99, 512), alloc(1, 512, ATTN)]
    s = summarise({"device_traces": [events]}, CAUSAL)
    assert s["unmatched_frees"] == 1 and not s["first_event_is_alloc"]
    assert s["peak_bytes"] == 512


def test_no_trace_no_peak():
    s = summarise({"device_traces": []})
    assert s["peak_bytes"] == 0 and s["events"] == 0


def test_logits_ranges_point_at_the_causal_lm_forward():
    (r,) = logits_ranges("gemma2")
    assert r.file_suffix.endswith("gemma2/modeling_gemma2.py") and r.last > r.first
    text = open(__import__("transformers").models.gemma2.modeling_gemma2.__file__).read().splitlines()
    body = "\n".join(text[r.first - 1:r.last])
    assert "final_logit_softcapping" in body and "lm_head" in body
    assert logits_ranges("no-such-family") == []
