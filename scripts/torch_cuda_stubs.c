/* Stand-ins for the CUDA half of torch (libc10_cuda.so, libtorch_cuda.so), for PyPI's torchvision
 * beside the CPU torch in the vLLM venvs (scripts/lib.sh: ensure_vllm_torchvision).
 *
 * PyPI's torchvision 0.28.0 (the release that pins torch 2.13.0) is a CUDA build: its _C.so and
 * image.so link against libc10_cuda.so / libtorch_cuda.so, which a CPU torch does not have, so the
 * extension does not load and `import torchvision` fails ("operator torchvision::nms does not
 * exist"). vLLM 0.32 imports torchvision for Qwen3.5 (through transformers' Qwen2-VL image
 * processor). Its CPU kernels need none of these symbols: they are only reached with a CUDA tensor,
 * which a CPU torch cannot make. Each stub aborts with its name if it is ever called.
 * The list is the undefined c10::cuda / at::cuda symbols of torchvision 0.28.0's _C.so and image.so
 * (nm -D --undefined-only); a torchvision needing one more fails its import check at setup. */
#include <stdio.h>
#include <stdlib.h>

static void no_cuda(const char *what) {
    fprintf(stderr, "torchvision called %s: this torch is a CPU build, there is no CUDA\n", what);
    abort();
}

#define STUB(sym) void sym(void) { no_cuda(#sym); }
STUB(_ZN2at4cuda26getCurrentDevicePropertiesEv)
STUB(_ZN3c104cuda12device_countEv)
STUB(_ZN3c104cuda14ExchangeDeviceEa)
STUB(_ZN3c104cuda14MaybeSetDeviceEa)
STUB(_ZN3c104cuda14current_deviceEv)
STUB(_ZN3c104cuda17getStreamFromPoolEba)
STUB(_ZN3c104cuda17getStreamFromPoolEia)
STUB(_ZN3c104cuda20getCurrentCUDAStreamEa)
STUB(_ZN3c104cuda20getDefaultCUDAStreamEa)
STUB(_ZN3c104cuda20setCurrentCUDAStreamENS0_10CUDAStreamE)
STUB(_ZN3c104cuda29c10_cuda_check_implementationEiPKcS2_jb)
STUB(_ZN3c104cuda9GetDeviceEPa)
STUB(_ZN3c104cuda9SetDeviceEab)
STUB(_ZNK3c104cuda10CUDAStream11synchronizeEv)
STUB(_ZNK3c104cuda10CUDAStream5queryEv)
STUB(_ZNK3c104cuda10CUDAStream6streamEv)
/* c10::cuda::CUDACachingAllocator::allocator: an atomic pointer, null (no CUDA allocator) */
void *_ZN3c104cuda20CUDACachingAllocator9allocatorE = 0;
