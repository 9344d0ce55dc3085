"""Tunix's agentic GRPO learner end to end with SpecRollout (examples/agentic_tunix.py):
episodes of several turns running concurrently, their rollout calls sharing engine runs,
later turns taking earlier turns from kept slots, weights synced exactly."""

import json
import os
import subprocess
import sys

from xla_flags import fast_compile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STEPS, BATCH, GENERATIONS, TURNS = 2, 2, 2, 3


def test_agentic_grpo_learner_end_to_end(tmp_path):
    """2 steps of 2 prompts x 2 episodes, 3 turns each, all 4 episodes of a step in flight:
    every step trains and syncs the engine to the trainer's weights exactly (compiling
    nothing); calls of different episodes join one engine run; every later turn's prompt
    extends its previous turn's prompt and completion, and the engine takes shared tokens
    from kept slots (only later turns can: no first-turn prompt reaches MIN_SHARED_PREFIX
    tokens); the rollout logprobs equal Tunix's recomputation on the flattened conversation;
    the draft is refreshed from the rollouts between steps."""
    out = tmp_path / "agentic.json"
    env = dict(os.environ, XLA_FLAGS=fast_compile())
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "examples", "agentic_tunix.py"),
                           "--steps", str(STEPS), "--batch", str(BATCH), "--generations", str(GENERATIONS),
                           "--turns", str(TURNS), "--distill-steps", "2", "--json", str(out)],
                          env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    r = json.loads(out.read_text())

    episodes = STEPS * BATCH * GENERATIONS
    assert r["steps_trained"] == STEPS and r["syncs"] == STEPS
    assert r["sync_max_abs_diff"] == [0.0] * STEPS and r["sync_compiles"] == [0] * STEPS
    assert r["episodes"] == episodes and r["turns_per_episode"] == [TURNS] * episodes
    assert r["rewards_finite"] and len(r["mean_reward_per_step"]) == STEPS

    # an engine run opens with one call; the others joined it while it ran
    assert r["generate_calls"] == episodes * TURNS
    assert r["calls_joining_a_run"] >= 1 and r["max_calls_in_flight"] >= 2

    # each episode's first call is the only one that extends no earlier call
    assert r["first_turn_calls"] == episodes
    assert r["later_turn_calls"] == episodes * (TURNS - 1)
    assert r["first_turn_prompt_tokens_max"] <= r["min_shared_prefix"]
    m = r["engine_metrics"]
    assert 0 < m["shared_prefix_tokens"] <= r["later_turn_reusable_tokens"]
    assert m["prefill_tokens"] <= r["prompt_tokens"] - m["shared_prefix_tokens"]

    assert max(r["logprob_max_abs_diff"]) < 1e-5 and r["logprob_tokens_compared"] > 50
    # the draft refreshed once (before the second step's calls, on the first step's
    # completions) while the calls came from several threads
    assert len(r["distill"]) == STEPS - 1 and r["distill"][0]["loss_after"] < r["distill"][0]["loss_before"]
