"""How many drafts the draft model gets right at every position of the bench's prompts
(greedy): the input of `sim.py`, written as JSON.

    python agreement.py sweep.json                                  # the sweep's prompts
    python agreement.py rollout.json --prompt-len 64 --max-tokens 227  # the rollout's

For each of the first `--prompts` held-out prompts (truncated as the bench does), the
target's greedy continuation (max_tokens + max_k tokens), then at every position p of
the first max_tokens the draft model's greedy max_k tokens from prompt +
continuation[:p]: m[p] = how many of them match the continuation from p. With greedy
drafting a draft does not depend on K, so a step at position p with K drafts accepts
min(m[p], K).
"""
import argparse
import json

from dsd_jax.bench.commands import _builtin_prompts
from dsd_jax.config import SpecConfig
from dsd_jax.engine import SpecEngine
from dsd_jax.loading import encode_prompts
from dsd_jax.models import builtin
from dsd_jax.sampling import SamplingParams

MAX_K = 6


def greedy(model, tokenizer, prompts, n, max_seq_len):
    engine = SpecEngine(model, None, SpecConfig(method="none"), max_batch_size=64, max_seq_len=max_seq_len,
                        tokenizer=tokenizer)
    outs = engine.generate(prompts, SamplingParams(temperature=0.0, max_tokens=n))
    return [list(o.token_ids) for o in outs]


def agreement(drafts, continuation):
    n = 0
    while n < min(len(drafts), len(continuation)) and drafts[n] == continuation[n]:
        n += 1
    return n


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--prompts", type=int, default=64)
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--max-tokens", type=int, default=64)
    args = ap.parse_args()
    target, draft, tok = builtin()
    ids = [p[:args.prompt_len] for p in encode_prompts(_builtin_prompts(args.prompts), tok, target.config.vocab_size)]
    seq_len = args.prompt_len + args.max_tokens + 2 * MAX_K + 8
    conts = greedy(target, tok, ids, args.max_tokens + MAX_K, seq_len)
    m = []
    for i in range(len(ids)):  # one prompt's positions at a time: 64 rows a generate at most
        contexts = [ids[i] + conts[i][:p] for p in range(args.max_tokens)]
        drafts = [d for s in range(0, len(contexts), 64)
                  for d in greedy(draft, tok, contexts[s:s + 64], MAX_K, seq_len)]
        m.append([agreement(drafts[p], conts[i][p:p + MAX_K]) for p in range(args.max_tokens)])
        print(i, ids[i][:3], "".join(str(x) for x in m[-1]), flush=True)
    with open(args.out, "w") as f:
        json.dump({"prompts": [p[:8] for p in ids], "prompt_lens": [len(p) for p in ids], "agreement": m,
                   "max_tokens": args.max_tokens, "max_k": MAX_K}, f)


if __name__ == "__main__":
    main()
