"""The GPU tests' skip for a case the support policy refuses only for a known fault of the loaded
cuDNN (every reason's field "cudnn", docs/reliability.md), as when the GPU tiers run under another
cuDNN than the pinned one (scripts/gpu_run.sh's cudnn part): the C++ tier's
refused_for_the_loaded_cudnn (tests/gpu/gpu_skip.h)."""
import pytest

import fusedattn


def skip_if_refused_for_the_loaded_cudnn(spec, passes=("forward",)):
    """Skips the calling test, with the reasons, where the policy refuses `spec` (a spec string) in
    one of `passes` for the loaded cuDNN alone; any other refusal is left to the test to meet."""
    for pass_ in passes:
        answer = fusedattn.check_support(spec, pass_)
        if not answer.ok and all(reason[0] == "cudnn" for reason in answer.reasons):
            pytest.skip(f"{pass_}: {answer}")
