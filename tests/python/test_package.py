"""The package without PyTorch or JAX: import, errors, specs, support answers."""
import subprocess
import sys

import pytest

import fusedattn


def test_imports_without_torch_or_jax():
    code = "import sys, fusedattn; fusedattn.Spec; assert 'torch' not in sys.modules and 'jax' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True, env={"PYTHONPATH": ":".join(sys.path)})


def test_error_classes_form_one_hierarchy():
    for name in ("InvalidArgumentError", "NotSupportedError", "CudnnError", "CudaError", "SetupError"):
        assert issubclass(getattr(fusedattn, name), fusedattn.FusedAttnError)
    assert issubclass(fusedattn.InvalidArgumentError, ValueError)


def test_spec_string_round_trips():
    text = "layout=thd_thd_thd dtype=bf16 b=3 s_q=100 s_kv=200 h_q=8 h_kv=2 d_qk=128 d_v=128 window=-1,0"
    spec = fusedattn.Spec.parse(text)
    assert str(spec) == text
    assert fusedattn.Spec.parse(str(spec)) == spec
    assert (spec.batch, spec.heads_q, spec.heads_kv, spec.seq_q, spec.seq_kv) == (3, 8, 2, 100, 200)
    assert hash(spec) == hash(fusedattn.Spec.parse(text))


def test_invalid_input_names_field_value_and_requirement():
    with pytest.raises(fusedattn.InvalidArgumentError) as caught:
        fusedattn.Spec.parse("layout=bshd b=1 s=64 h=4 d=60").validate()
    error = caught.value
    assert (error.field, error.value) == ("d_qk", "60")
    assert "multiple of 8" in error.requirement
    with pytest.raises(fusedattn.InvalidArgumentError) as caught:
        fusedattn.Spec.parse("layout=nope b=1 s=64 h=4 d=64")
    assert caught.value.field == "layout"


def test_check_support_answers_or_says_there_is_no_gpu():
    try:
        ok, reasons = fusedattn.check_support("layout=bshd b=1 s_q=64 s_kv=32 h=2 d=512 causal align=bottom_right",
                                              "backward")
    except fusedattn.CudaError as error:  # no GPU here: the CUDA runtime says why
        assert "cudaGetDevice" in str(error)
        return
    assert not ok
    assert {field for field, *_ in reasons} >= {"d_qk", "d_v"}


def test_plan_folder_setting_round_trips(tmp_path):
    was = fusedattn.plan_dir()
    try:
        fusedattn.set_plan_dir(str(tmp_path / "plans"))
        assert fusedattn.plan_dir() == str(tmp_path / "plans")
        fusedattn.set_plan_dir("")
        assert fusedattn.plan_dir() == ""
    finally:
        fusedattn.set_plan_dir(was)
    assert fusedattn.default_plan_dir().endswith("fusedattn/plans")
    assert set(fusedattn.disk_cache_stats()) >= {"loaded", "missing", "rejected", "stored", "store_failures"}


def test_ragged_buckets_of_a_training_configuration():
    buckets = fusedattn.ragged_buckets("layout=thd_thd_thd b=4 s=256 h=4 d=64 causal padding=1")
    assert len(buckets) == 3 * 3  # batches 1, 2, 4 times sequences 64, 128, 256
    assert all(fusedattn.Spec.parse(b) for b in buckets)


def test_warm_up_builds_or_says_there_is_no_gpu():
    try:
        results = fusedattn.warm_up(["layout=bshd b=1 s=128 h=2 d=64 causal"], ["forward"], threads=1)
    except fusedattn.CudaError as error:  # no GPU here
        assert "cudaGetDevice" in str(error)
        return
    ((spec, pass_, ok, message, ms),) = results
    assert ok, message
    assert pass_ == "forward" and ms > 0
