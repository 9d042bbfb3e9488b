"""Is the quantized model what the merged model was, and will vLLM serve it?

The step after the merge: quantize with llm-compressor (GPTQ or AWQ, W4A16 compressed-tensors)
in its own venv (`run_quantize`), then measure the drift against the unquantized model on the
same tokens (`drift`: mean KL of the next-token distributions, top-1 agreement, perplexity) with a
threshold. check-dir (harness.modeldir) verifies the quantized directory's tensors against its
config; estimate/plan (harness.memory) predict its memory.
"""

from .drift import DEFAULT_MAX_MEAN_KL, Drift, drift
from .quantize import QuantizeError, QuantizeJob, QuantizeResult, llmcompressor_problem, run_quantize, worker_logits

__all__ = ["DEFAULT_MAX_MEAN_KL", "Drift", "drift", "QuantizeError", "QuantizeJob", "QuantizeResult",
           "llmcompressor_problem", "run_quantize", "worker_logits"]
