"""A multi-turn rollout: each turn's prompt is the last prompt, its completion and a new message.

A rollout: 8 episodes, each a 256-token first prompt of its own, then 4 turns; a turn is one
`generate` of the 8 prompts (greedy, max_tokens 32, ignore_eos), and the next turn's prompt
is the prompt, its completion and 16 new tokens (an environment's reply), as an agentic RL
rollout calls its engine. The built-in pair at K = 2 in an engine of 8 slots.
Variants: "whole" (`share_prefixes=False`: every turn prefills its whole prompt) and
"kept" (the default: each turn's prompts take prompt and completion from the slots the
previous turn's requests finished in, and prefill the 16 new tokens and their last one).
Each rollout starts cold (`reset_prefix_cache`). Outputs compared token for token.
Usage: python multi_turn_ab.py [repeats]"""
import random
import sys
import time

import numpy as np

import dsd_jax as dsd
from dsd_jax.models.builtin import builtin
from dsd_jax.stats import format_ratio, paired_ratio

REPEATS = int(sys.argv[1]) if len(sys.argv) > 1 else 10
EPISODES, TURNS, FIRST, REPLY, OUT = 8, 4, 256, 16, 32
target, draft, tok = builtin()
engines = {name: dsd.SpecEngine(target, draft, dsd.SpecConfig(num_speculative_tokens=2), max_batch_size=EPISODES,
                                max_seq_len=1024, share_prefixes=name == "kept")
           for name in ("whole", "kept")}
for eng in engines.values():
    eng.warmup()
rng = np.random.default_rng(0)
firsts = [rng.integers(10, 4000, FIRST).tolist() for _ in range(EPISODES)]
replies = rng.integers(10, 4000, (TURNS, EPISODES, REPLY)).tolist()
params = dsd.SamplingParams(temperature=0.0, max_tokens=OUT, ignore_eos=True)


def rollout(name):
    """Seconds for the whole rollout, every turn's tokens, positions shared over it."""
    engine = engines[name]
    engine.reset_prefix_cache()
    engine.reset_metrics()
    prompts, tokens = list(firsts), []
    t0 = time.perf_counter()
    for turn in range(TURNS):
        outs = [o.token_ids for o in engine.generate(prompts, params)]
        tokens.append(outs)
        prompts = [p + list(o) + replies[turn][i] for i, (p, o) in enumerate(zip(prompts, outs))]
    return time.perf_counter() - t0, tokens, engine.metrics()


(_, whole_tokens, whole_m), (_, kept_tokens, kept_m) = rollout("whole"), rollout("kept")
times = {v: [] for v in engines}
order = list(engines)
for r in range(REPEATS):
    random.Random(r).shuffle(order)
    for v in order:
        times[v].append(rollout(v)[0])
print(f"{REPEATS} pairs; {EPISODES} episodes x {TURNS} turns: a {FIRST}-token first prompt, then prompt + "
      f"{OUT} generated + {REPLY} new tokens each turn, greedy, built-in pair, K = 2, {EPISODES} slots; "
      "ratio: dsd_jax.stats.paired_ratio (geometric mean, 95% interval)")
print(f"same tokens: {whole_tokens == kept_tokens}; prefill tokens a rollout: whole {whole_m['prefill_tokens']}, "
      f"kept {kept_m['prefill_tokens']} (shared {kept_m['shared_prefix_tokens']})")
print(f"whole {1e3 * np.median(times['whole']):.1f} ms, kept {1e3 * np.median(times['kept']):.1f} ms, "
      f"kept/whole {format_ratio(paired_ratio(times['kept'], times['whole']), digits=3)}")
