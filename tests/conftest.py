import os

# Tests share 2 cores with whatever else runs; keep torch from oversubscribing them.
os.environ.setdefault("OMP_NUM_THREADS", "2")

# Prepared vLLM model directories go to the user cache unless GLM5LIB_CACHE says otherwise (glm5lib.paths); tests
# keep everything they build in the checkout's .cache instead of the home directory.
os.environ.setdefault("GLM5LIB_CACHE", os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                                    ".cache"))

# Triton decides when it is imported whether its own language functions (tl.zeros, ...) run in the interpreter.
# Test collection can import vLLM, which imports Triton, before any glm5lib kernel module sets the switch
# (glm5lib.kernels.common): set it here first on machines without a CUDA GPU.
import torch  # noqa: E402

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
