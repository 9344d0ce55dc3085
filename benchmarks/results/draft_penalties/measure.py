"""Acceptance under penalties with the drafter penalising its proposals (as the target does)
against a drafter blind to them, on the built-in pair, at a fixed K.

    python benchmarks/results/draft_penalties/measure.py [rows] [max_tokens] [K] [method]

method: "draft_model" (default) or "eagle3" (the built-in head).

Two engines in one process, the same requests: "penalising" is the library as it is;
"blind" builds its programs with `penalties.penalised_draft_logits` replaced by the
identity (the drafter before this change). Each setting runs on both engines, in
alternating order; acceptance is counted over every round (`EngineStats`).
"""

import sys
import time

import numpy as np

from dsd_jax import SamplingParams, SpecConfig, SpecEngine, models, penalties
from dsd_jax.bench.side_by_side import builtin_prompts

ROWS, MAX_TOKENS, K = (int(a) for a in (sys.argv[1:4] + ["32", "64", "3"][len(sys.argv[1:4]):]))
METHOD = sys.argv[4] if len(sys.argv) > 4 else "draft_model"
SETTINGS = {
    "off, greedy": dict(temperature=0.0),
    "repetition 1.05, greedy (Qwen2.5's default)": dict(temperature=0.0, repetition_penalty=1.05),
    "repetition 1.2, greedy": dict(temperature=0.0, repetition_penalty=1.2),
    "presence 0.5 + frequency 0.5, greedy": dict(temperature=0.0, presence_penalty=0.5, frequency_penalty=0.5),
    "off, T=0.7": dict(temperature=0.7),
    "repetition 1.05, T=0.7": dict(temperature=0.7, repetition_penalty=1.05),
    "repetition 1.2, T=0.7": dict(temperature=0.7, repetition_penalty=1.2),
    "presence 0.5 + frequency 0.5, T=0.7": dict(temperature=0.7, presence_penalty=0.5, frequency_penalty=0.5),
}


class FixedK:
    def choose_k(self, batch_size, context_len=None, request_ids=None):
        return K

    def observe(self, *args, **kw):
        pass


def engine(target, draft, prompts):
    e = SpecEngine(target, draft, SpecConfig(method=METHOD, num_speculative_tokens=K),
                   max_batch_size=ROWS, max_seq_len=512, batch_buckets=(ROWS,), controller=FixedK())
    e.generate(prompts[:ROWS], SamplingParams(temperature=0.0, max_tokens=4, repetition_penalty=1.1))
    e.generate(prompts[:ROWS], SamplingParams(temperature=0.7, max_tokens=4, repetition_penalty=1.1))
    return e  # every program this run needs is compiled now (the blind one while patched)


def main():
    target, draft, tokenizer = models.builtin()
    if METHOD == "eagle3":
        draft = models.load_eagle3("builtin")
    prompts, _ = builtin_prompts(ROWS, 0, tokenizer)
    engines = {"penalising": engine(target, draft, prompts)}
    real = penalties.penalised_draft_logits
    penalties.penalised_draft_logits = lambda logits, *a: logits.astype("float32")
    try:
        engines["blind"] = engine(target, draft, prompts)
    finally:
        penalties.penalised_draft_logits = real
    print(f"built-in {METHOD}, {ROWS} rows, max_tokens {MAX_TOKENS}, K = {K}; acceptance per position, "
          f"tokens per row-round, wall s")
    for i, (name, s) in enumerate(SETTINGS.items()):
        params = [SamplingParams(max_tokens=MAX_TOKENS, seed=1000 + r, **s) for r in range(ROWS)]
        outs = {}
        for which in (["penalising", "blind"] if i % 2 == 0 else ["blind", "penalising"]):
            e = engines[which]
            e.stats.reset()
            t = time.perf_counter()
            outs[which] = [o.token_ids for o in e.generate(prompts, params)]
            wall = time.perf_counter() - t
            d = e.stats.to_dict()
            outs[which + "_row"] = (d["acceptance_per_position"], d["mean_accepted_len"], wall)
        # greedy output is the penalised greedy path either way; sampled output is exact either
        # way but drawn differently (the drafts differ)
        same = f" (outputs identical: {outs['penalising'] == outs['blind']})" if s["temperature"] == 0 else ""
        print(f"{name}{same}")
        for which in ("penalising", "blind"):
            acc, mal, wall = outs[which + "_row"]
            print(f"  {which:>10}: acceptance {np.round(acc, 3).tolist()}  tokens/row-round {mal:.3f}  "
                  f"wall {wall:.1f} s")


if __name__ == "__main__":
    main()
