#!/usr/bin/env python3
"""bench/run_bench_transformers.py — a transformers model with attn_implementation="fusedattn" beside
the same model with its own "sdpa", in one process, on the same weights and inputs: a training step
(forward, loss and backward; eager and under torch.compile) and generate() from prompts of 512 and
8k tokens at batch 1 and 16, for a Llama-style and a Gemma-2-style configuration of about 1B
parameters with random weights (nothing is downloaded). Writes results/bench-transformers.{json,md}.

    python bench/run_bench_transformers.py --build build                  # everything
    python bench/run_bench_transformers.py --build build --parts generate --models llama

Generation is greedy with transformers' default cache (DynamicCache: its length grows every step).
"repeated" is the median of --repeats calls after one at the same prompt length, whose plans are
then built; "first" is that first call, after calls at other lengths, as a server meets a new
prompt length. "same tokens" is the share of generated tokens both implementations agree on
(random weights in BF16 make near ties, so a few may differ). The model's own "sdpa" computes no
attention softcap (transformers leaves it to "eager"), where fusedattn applies Gemma 2's: the
Gemma-2 rows time the model as each implementation runs it.
"""
import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch
import transformers

from harness import cuda_median_ms, short, write_results

IMPLEMENTATIONS = ("fusedattn", "sdpa")
DEVICE = "cuda"
TARGET = 1.15  # on the compiled training step and on generation from 8k prompts; never below 1.0


def config(name):
    """About 1B parameters: 16 layers of hidden 2048, GQA 32/8 at head dim 64 (Llama 3.2 1B's
    attention), or 8/4 at head dim 256 with Gemma 2's softcaps and sliding layers."""
    common = dict(vocab_size=32000, hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
                  max_position_embeddings=16384, attention_dropout=0.0)
    if name == "llama":
        return transformers.LlamaConfig(**common, num_attention_heads=32, num_key_value_heads=8, head_dim=64)
    if name == "gemma2":
        return transformers.Gemma2Config(**common, num_attention_heads=8, num_key_value_heads=4, head_dim=256,
                                          sliding_window=4096, attn_logit_softcapping=50.0,
                                          final_logit_softcapping=30.0, query_pre_attn_scalar=256)
    raise ValueError(name)


def build_model(name):
    torch.manual_seed(0)
    with torch.device(DEVICE):
        model = transformers.AutoModelForCausalLM.from_config(config(name), dtype=torch.bfloat16)
    model.generation_config.eos_token_id = None  # every row generates every token asked for
    model.generation_config.pad_token_id = 0
    return model


def parameters_b(model):
    return sum(p.numel() for p in model.parameters()) / 1e9


def train_ms(model, implementation, *, compiled, batch, length, warmup, iters):
    """Median GPU ms of a training step (forward, loss, backward) with `implementation`."""
    model.train()
    model.set_attn_implementation(implementation)
    torch._dynamo.reset()
    run = torch.compile(model) if compiled else model
    generator = torch.Generator(device=DEVICE).manual_seed(1)
    ids = torch.randint(0, model.config.vocab_size, (batch, length), device=DEVICE, generator=generator)

    def step():
        model.zero_grad(set_to_none=True)
        run(input_ids=ids, labels=ids).loss.backward()
    return cuda_median_ms(step, warmup, iters)


def generate_s(model, ids, new_tokens):
    """Seconds of one greedy generate() call, and the tokens it generated."""
    torch.cuda.synchronize()
    begin = time.perf_counter()
    out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new_tokens,
                         min_new_tokens=new_tokens, do_sample=False)
    torch.cuda.synchronize()
    return time.perf_counter() - begin, out[:, ids.shape[1]:]


def generation(model, implementation, *, batch, prompt, new_tokens, repeats):
    """{'first_s', 'repeated_s', 'tokens_per_s', 'decode_ms', 'tokens'} of greedy generation."""
    model.eval()
    model.set_attn_implementation(implementation)
    generator = torch.Generator(device=DEVICE).manual_seed(2)
    ids = torch.randint(0, model.config.vocab_size, (batch, prompt), device=DEVICE, generator=generator)
    with torch.no_grad():
        generate_s(model, ids[:, : prompt // 2 + 3], 4)  # other lengths first: the process's own start-up
        first, tokens = generate_s(model, ids, new_tokens)
        times = [generate_s(model, ids, new_tokens)[0] for _ in range(repeats)]
        prefill = statistics.median(generate_s(model, ids, 1)[0] for _ in range(repeats))
    repeated = statistics.median(times)
    return {"first_s": first, "repeated_s": repeated, "tokens_per_s": batch * new_tokens / repeated,
            "decode_ms": 1e3 * (repeated - prefill) / (new_tokens - 1), "tokens": tokens}


def measured(fn):
    try:
        return fn()
    except Exception as error:  # noqa: BLE001 - a failing row says why and hides no other
        torch.cuda.empty_cache()
        return short(error)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--build", default="build")
    parser.add_argument("--out", default="results", help="folder of the results (default: results)")
    parser.add_argument("--models", default="llama,gemma2")
    parser.add_argument("--parts", default="train,generate")
    parser.add_argument("--train-shape", default="4,2048", help="batch,length of the training step")
    parser.add_argument("--batches", default="1,16")
    parser.add_argument("--prompts", default="512,8192")
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--iters", type=int, default=10)
    args = parser.parse_args()
    sys.path.insert(0, str(Path(args.build) / "python"))
    import fusedattn
    import fusedattn.transformers
    fusedattn.transformers.register()
    parts = args.parts.split(",")

    rows = []
    for name in args.models.split(","):
        rows.extend(model_rows(name, args, parts))
        torch.cuda.empty_cache()  # the model of this name is gone: room for the next
    write(rows, Path(args.out), fusedattn.build_info())


def model_rows(name, args, parts):
    """The rows of one model: its training steps and its generation cases."""
    model = build_model(name)
    size = f"{parameters_b(model):.2f}B"
    rows = []
    if "train" in parts:
        batch, length = (int(x) for x in args.train_shape.split(","))
        for compiled in (False, True):
            row = {"model": name, "params": size, "case": f"train {batch}x{length}",
                   "road": "compiled" if compiled else "eager", "unit": "ms"}
            for implementation in IMPLEMENTATIONS:
                row[implementation] = measured(lambda: train_ms(
                    model, implementation, compiled=compiled, batch=batch, length=length, warmup=args.warmup,
                    iters=args.iters))
            rows.append(finish(row, higher_is_better=False, targeted=compiled))
    if "generate" in parts:
        for prompt in (int(x) for x in args.prompts.split(",")):
            for batch in (int(x) for x in args.batches.split(",")):
                result = {implementation: measured(lambda: generation(
                    model, implementation, batch=batch, prompt=prompt, new_tokens=args.new_tokens,
                    repeats=args.repeats)) for implementation in IMPLEMENTATIONS}
                rows.extend(generation_rows(name, size, batch, prompt, args.new_tokens, result))
    return rows


def generation_rows(name, size, batch, prompt, new_tokens, result):
    """The rows of one generation case: tokens a second (repeated), the first call's seconds, the
    decode step's ms, and the share of tokens both implementations generated alike."""
    case = f"generate b={batch} prompt={prompt} +{new_tokens}"
    ok = all(isinstance(result[i], dict) for i in IMPLEMENTATIONS)
    same = ""
    if ok:
        a, b = (result[i]["tokens"] for i in IMPLEMENTATIONS)
        same = f"{100.0 * (a == b).float().mean().item():.0f}%"
    rows = []
    measures = (("repeated", "tokens_per_s", "tokens/s", True), ("first call", "first_s", "s", False),
                ("decode step", "decode_ms", "ms", False))
    for road, key, unit, higher in measures:
        row = {"model": name, "params": size, "case": case, "road": road, "unit": unit, "same tokens": same}
        for implementation in IMPLEMENTATIONS:
            value = result[implementation]
            row[implementation] = value[key] if isinstance(value, dict) else value
        rows.append(finish(row, higher_is_better=higher, targeted=road == "repeated" and prompt >= 8192))
    return rows


def finish(row, *, higher_is_better, targeted):
    """The row with fusedattn's speedup over sdpa and the target it is held to."""
    ours, theirs = row["fusedattn"], row["sdpa"]
    if isinstance(ours, float) and isinstance(theirs, float):
        row["speedup"] = ours / theirs if higher_is_better else theirs / ours
    row["target"] = TARGET if targeted else 1.0
    print(json.dumps(row), flush=True)
    return row


def write(rows, out, info):
    cell = lambda x: f"{x:.3f}" if isinstance(x, float) else str(x)  # noqa: E731
    lines = [f"# transformers models: fusedattn beside sdpa ({torch.cuda.get_device_name()}, "
             f"torch {torch.__version__}, transformers {transformers.__version__})", "",
             "| model | case | road | unit | fusedattn | sdpa | fusedattn speedup | target | same tokens |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        speedup = r.get("speedup")
        mark = "" if speedup is None else (" ✓" if speedup >= r["target"] else " ✗")
        lines.append(f"| {r['model']} ({r['params']}) | {r['case']} | {r['road']} | {r['unit']} | "
                     f"{cell(r['fusedattn'])} | {cell(r['sdpa'])} | {'-' if speedup is None else f'{speedup:.2f}x'} | "
                     f"≥ {r['target']:.2f}x{mark} | {r.get('same tokens', '')} |")
    record = {"gpu": torch.cuda.get_device_name(), "build": info, "torch": torch.__version__,
              "transformers": transformers.__version__, "rows": rows}
    write_results(out, "bench-transformers", record, lines)  # one name, overwritten each run

if __name__ == "__main__":
    main()
