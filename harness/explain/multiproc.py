"""CUDA initialised in a process that then forks (or spawns without a main guard).

Messages: torch's "Cannot re-initialize CUDA in forked subprocess. To use CUDA with
multiprocessing, you must use the 'spawn' start method", vLLM's "CUDA was previously initialized.
We must use the `spawn` multiprocessing start method", Python's "An attempt has been made to start
a new process before the current process has finished its bootstrapping phase".
"""

from __future__ import annotations

from .kinds import declare
from .model import Cause, Context, Finding
from .text import Log

declare("cuda_multiprocessing", "CUDA and multiprocessing",
        "use the spawn start method (multiprocessing.set_start_method('spawn'), VLLM_WORKER_MULTIPROC_METHOD=spawn) "
        "and do not touch CUDA in the parent before workers start; guard the script with if __name__ == '__main__'")

_FORK = (r"Cannot re-initialize CUDA in forked subprocess|CUDA was previously initialized\. We must use the `spawn`|"
         r"must use the 'spawn' start method|CUDA initialization error.{0,40}fork")
_BOOTSTRAP = r"An attempt has been made to start a new process before the\s+current process has finished its bootstrapping"


def recognise_multiprocessing(log: Log, ctx: Context) -> list[Finding]:
    m, b = log.search(_FORK), log.search(_BOOTSTRAP)
    if b and not m:
        return [Finding("cuda_multiprocessing", "a spawned process re-ran the script's top level",
                        [Cause("with the spawn start method (the default on Windows and macOS, and vLLM's when CUDA "
                               "is initialised) every worker imports the main script: code outside an "
                               "if __name__ == '__main__' guard starts processes again", log.line_of(b))],
                        "put the script's top-level code under if __name__ == '__main__': (vLLM's LLM(...) and "
                        "DataLoader(num_workers>0) included).", score=80, position=b.end())]
    if not m:
        return []
    vllm = log.from_vllm()
    causes = [Cause("CUDA was initialised in the parent (a torch.cuda call, a tensor moved to the GPU, a model "
                    "loaded) before it forked workers; a forked child cannot use that CUDA context", log.line_of(m))]
    if log.has(r"DataLoader|num_workers|worker"):
        causes.append(Cause("DataLoader workers (num_workers > 0) fork: a Dataset that returns CUDA tensors or "
                            "calls the model touches CUDA inside them", log.evidence(r"DataLoader|num_workers") or ""))
    fix = ("set the spawn start method before anything touches CUDA (multiprocessing.set_start_method('spawn', "
           "force=True); torch.multiprocessing likewise" + ("; for vLLM export VLLM_WORKER_MULTIPROC_METHOD=spawn"
                                                             if vllm else "")
           + "), keep CUDA work out of the parent and of Dataset.__getitem__ (move tensors to the GPU in the "
           "training loop), and guard the script with if __name__ == '__main__'.")
    return [Finding("cuda_multiprocessing", "CUDA was used in a forked subprocess", causes, fix, score=85,
                    position=m.end())]


RECOGNISERS = (recognise_multiprocessing,)
