"""fusedattn.transformers without a GPU, through the real operators' fake implementations: a model of
each family trains under torch.compile(fullgraph=True) on meta tensors (padded batches in the
general form compiled code takes, packed batches by the flash keywords), a static cache's decode
step compiles in one graph, the decode step's bias shapes that the core takes at s_q = 1 ([b, 1, 1,
s_kv], [b, h, 1, s_kv]), and `import fusedattn` stays free of transformers."""
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch", reason="PyTorch not installed")
transformers = pytest.importorskip("transformers", reason="transformers not installed")
ft = pytest.importorskip("fusedattn.transformers")
fat = pytest.importorskip("fusedattn.torch")

from fusedattn import InvalidArgumentError  # noqa: E402
from meta_tensors import meta  # noqa: E402
from transformers_tiny import FAMILIES, config  # noqa: E402

# Meta tensors' loss has no autograd kernel of its own; PyTorch says so on every backward.
pytestmark = pytest.mark.filterwarnings("ignore:.*an autograd kernel was not registered")


@pytest.fixture(autouse=True)
def registered():
    ft.register()
    torch._dynamo.reset()


def meta_model(family):
    with torch.device("meta"):
        made = transformers.AutoModelForCausalLM.from_config(config(family)).to(torch.bfloat16)
    made.set_attn_implementation("fusedattn")
    return made


@pytest.mark.parametrize("family", FAMILIES)
def test_a_training_step_compiles_in_one_graph(family):
    net = meta_model(family)
    step = torch.compile(net, fullgraph=True, backend="aot_eager")
    ids = torch.zeros(2, 64, dtype=torch.long, device="meta")
    padding = torch.ones(2, 64, dtype=torch.long, device="meta")
    out = step(ids, attention_mask=padding, labels=ids, use_cache=False)  # padded: the general form
    out.loss.backward()
    assert out.logits.shape == (2, 64, 97)
    assert net.model.embed_tokens.weight.grad is not None


@pytest.mark.parametrize("family", ["llama", "gemma2"])
def test_a_packed_batch_by_the_flash_keywords_compiles_in_one_graph(family):
    step = torch.compile(meta_model(family), fullgraph=True, backend="aot_eager")
    ids = torch.zeros(1, 96, dtype=torch.long, device="meta")
    cu = torch.empty(4, dtype=torch.int32, device="meta")
    out = step(ids, labels=ids, use_cache=False, cu_seq_lens_q=cu, cu_seq_lens_k=cu, max_length_q=48,
               max_length_k=48, position_ids=torch.zeros(1, 96, dtype=torch.long, device="meta"))
    out.loss.backward()
    assert out.logits.shape == (1, 96, 97)


@pytest.mark.filterwarnings("ignore:.*past_key_values")  # its name before transformers 5.25: both take it
def test_a_static_caches_decode_step_compiles_in_one_graph():
    net = meta_model("llama").eval()
    cache = transformers.StaticCache(config=net.config, max_cache_len=32)
    ids = torch.zeros(2, 10, dtype=torch.long, device="meta")
    with torch.no_grad():
        net(ids, attention_mask=torch.ones(2, 10, dtype=torch.long, device="meta"), past_key_values=cache)
        step = torch.compile(net, fullgraph=True, backend="aot_eager")
        out = step(ids[:, :1], attention_mask=torch.ones(2, 11, dtype=torch.long, device="meta"), past_key_values=cache,
                   position_ids=torch.full((2, 1), 10, device="meta"))
    assert out.logits.shape == (2, 1, 97)


@pytest.mark.parametrize("bias_shape", [(3, 1, 1, 40), (3, 8, 1, 40), (1, 8, 1, 40), (1, 1, 1, 40)])
def test_a_decode_step_takes_a_bias_per_entry_and_per_head(bias_shape):
    q, k = meta(3, 8, 1, 64), meta(3, 2, 40, 64)
    out = fat.attention(q, k, k, layout="bhsd", bias=meta(*bias_shape, grad=False))
    assert out.shape == (3, 8, 1, 64)


def test_a_broadcast_query_row_beside_a_batch_axis_names_the_shapes_taken():
    q, k = meta(3, 8, 5, 64), meta(3, 2, 40, 64)
    with pytest.raises(InvalidArgumentError) as caught:
        fat.attention(q, k, k, layout="bhsd", bias=meta(3, 1, 1, 40, grad=False))
    message = str(caught.value)
    assert caught.value.field == "bias.shape" and "[3,1,1,40]" in message
    assert "one of [3,8,5,40], [3,1,5,40], [1,8,5,40], [1,1,5,40], [1,1,1,40]" in message


def test_import_fusedattn_does_not_import_transformers():
    code = "import sys, fusedattn; assert 'transformers' not in sys.modules, 'imported'"
    subprocess.run([sys.executable, "-c", code], check=True, env={"PYTHONPATH": ":".join(sys.path)})
