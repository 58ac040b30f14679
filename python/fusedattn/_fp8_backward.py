"""fp8_attention's backward="auto", for both adapters: which backward follows the FP8 forward of a
shape, decided once per shape when the call is traced or first run, so that the program carries the
answer as a constant. With a GPU the core times both on stand-in data (fusedattn/fp8_backward_choice.h:
cuDNN's FP8 backward with dO's quantization and the gradients' dequantization, against the backward
in the model's dtype), once per machine thanks to its memo and the disk cache. Without one (meta
tensors, a trace on a machine with no GPU) "auto" takes the FP8 backward unless the support policy
refuses it for the shape (on Hopper: head dim 128 only), then the model's. Framework-free."""
import functools

from . import _config
from . import _core as core
from .errors import invalid_argument

BACKWARDS = ("auto", "fp8", "model")

# The core's names of the models' dtypes, from the frameworks' names.
_MODEL_DTYPES = {"bfloat16": "bf16", "float16": "f16"}


def require_backward(backward):
    if backward not in BACKWARDS:
        raise invalid_argument("backward", backward, '"auto", "fp8" or "model"')


@functools.lru_cache(maxsize=1024)  # per shape: a training program meets a handful
def chooses_model(config, q, k, v, model_dtype, device):
    """Whether "auto" takes the model-precision backward after the FP8 forward of `config` (printed,
    with the FP8 backward's fp8_grads) on q, k, v: views (dtype name, sizes, strides) of the FP8
    tensors the forward makes. `model_dtype`: the inputs' dtype name ("bfloat16" or "float16").
    `device`: the ordinal of the current GPU the choice is measured on, or None to let the policy
    decide."""
    spec = _config.parse(config).spec(q, k, v, 0, 0, 0)
    if device is None:
        return not core.check_support(spec, _config.BACKWARD)[0]
    if model_dtype not in _MODEL_DTYPES:
        raise invalid_argument("q.dtype", model_dtype, "bfloat16 or float16 (the model's dtype)")
    chosen, _, _ = core.choose_fp8_backward(spec, _MODEL_DTYPES[model_dtype])
    return chosen == "model"
