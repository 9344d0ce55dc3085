"""Agentic GRPO with Tunix on a tiny Llama3 policy, multi-turn, its rollouts by SpecRollout (CPU).

    python examples/agentic_tunix.py --steps 2

Tunix's agentic learner (`tunix.rl.agentic.agentic_grpo_learner.GRPOLearner`) runs up to
`max_concurrency` episodes at once, each in the asyncio loop's executor threads, and every
turn of every episode calls `rl_cluster.generate` from its own thread: the calls reach
`SpecRollout.generate` concurrently and share one running batch (`dsd_jax.threaded`).

The toy task: an environment (`SayJaxEnv`, a Tunix `BaseTaskEnv`) asks the policy to say
"jax", replies with an observation computed from the answer, and rewards each "jax" said,
for `--turns` turns per episode. The conversation is rendered by a chat template in the
words of the toy vocabulary (`WordChatParser`), so a turn's prompt is the previous turn's
prompt, its completion and the environment's message, token for token: the engine takes
the earlier turns from the slot the episode's last request left (`shared_prefix_tokens`).

Everything else is `examples/grpo_tunix.py`'s: Tunix's Llama3 as the policy and the
reference, a one-layer draft of ours, the trainer on one CPU device and the rollout engine
on another, so Tunix syncs weights through `SpecRollout.update_params` after every step.
With `--distill-steps N` the draft is refreshed on the last step's completions before the
first call after each sync, the other episodes' calls waiting for it.

The run checks, and prints as JSON (`--json FILE` writes it):
- after every sync the engine's weights equal the trainer's, leaf by leaf, exactly
  (`grpo_tunix.CheckedSpecRollout`), and no sync compiles anything;
- rollout calls of different episodes overlapped in one engine run: an engine run opens
  with one call, and an episode's next call starts a new run when it found none under
  way, so `generate_calls - engine_runs` calls joined a run another episode's call was in;
- every later turn's prompt extends the previous turn's prompt and completion, and the
  engine took shared prefix tokens from kept slots (no first-turn prompt is long enough
  to share `MIN_SHARED_PREFIX` tokens, so they are all later turns');
- the rollout logprobs equal Tunix's `compute_per_token_logps` of the trainer on the whole
  flattened conversation (first prompt, then replies and environment messages), as the
  learner trains on it.
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # examples/ is no package
import grpo_tunix  # noqa: E402  (first: it gives the process three CPU devices before JAX starts)

import argparse  # noqa: E402
import functools  # noqa: E402
import math  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402

import jax  # noqa: E402
import numpy as np  # noqa: E402
from grain import python as grain  # noqa: E402
from jax.sharding import Mesh  # noqa: E402
from tunix.rl import rl_cluster as rl_cluster_lib  # noqa: E402
from tunix.rl.agentic import agentic_grpo_learner  # noqa: E402
from tunix.rl.agentic.agents import agent_types  # noqa: E402
from tunix.rl.agentic.environments import base_environment  # noqa: E402
from tunix.rl.agentic.parser.chat_template_parser import parser as chat_parser_lib  # noqa: E402
from tunix.rl.rollout import base_rollout  # noqa: E402

from dsd_jax import SpecConfig, models  # noqa: E402
from dsd_jax.integrations.tunix import SpecRollout  # noqa: E402
from dsd_jax.prefix_sharing import MIN_SHARED_PREFIX  # noqa: E402

# grpo_tunix's vocabulary and the chat template's markers, each a word of its own
MARKERS = {"system": "<system>", "user": "<user>", "assistant": "<assistant>", "end": "<end>"}
CHAT_WORDS = grpo_tunix.WORDS + list(MARKERS.values())
# 20 words: a first-turn prompt (template and prompt included) stays under MIN_SHARED_PREFIX
SYSTEM_PROMPT = "the policy learns to say jax . we train the policy with a rollout step and a draft model ."
MAX_PROMPT_LENGTH = 32
PRAISE, ASK = "good . say jax more", "say jax now"  # the environment's observations
# an environment message as the template renders it ("<user> ... <end> <assistant>"), at most
ENV_MESSAGE_TOKENS = max(len(PRAISE.split()), len(ASK.split())) + 3


class ChatWordTokenizer(grpo_tunix.WordTokenizer):
    """grpo_tunix's whitespace tokenizer over `CHAT_WORDS` (its ids, plus the markers)."""

    def __init__(self):
        self.ids = {w: i for i, w in enumerate(CHAT_WORDS)}

    def decode(self, ids, **kwargs) -> str:
        return " ".join(CHAT_WORDS[i] for i in ids)


class WordChatParser(chat_parser_lib.BaseChatTemplateParser):
    """A chat template in the toy vocabulary's words:
    "<system> ... <end> <user> ... <end> <assistant> reply <user> ... <end> <assistant> ...".

    Markers are separate words, so a conversation rendered whole tokenizes as its messages
    rendered one by one (which Tunix's trajectory engine concatenates for training). A reply
    has no end marker: it ends with the </s> that rollouts drop (real templates' end-of-turn
    token is their stop token), so the flattened trajectory is, token for token, the prompt
    each turn was generated from."""

    def _init_tokens(self) -> chat_parser_lib.TokenConfig:
        return chat_parser_lib.TokenConfig(
            system_token=MARKERS["system"] + " ", user_token=MARKERS["user"] + " ",
            assistant_token=MARKERS["assistant"] + " ", eot_token=" " + MARKERS["end"],
            message_separator=" ")

    def _init_generation_prompt(self) -> str:
        return self.tokens.assistant_token

    def _parse_assistant(self, content: str) -> str:
        return self.tokens.assistant_token + content

    def _parse_message(self, message: dict) -> str:
        # Tunix's parser strips the template's markers from every message's content (a guard
        # against prompt injection); here they are ordinary words the policy may say, and a
        # reply must render back to the very tokens it was sampled as
        render = {"system": self._parse_system, "user": self._parse_user,
                  "assistant": self._parse_assistant}.get(message["role"])
        if render is None:
            raise NotImplementedError(f"WordChatParser renders system, user and assistant messages, "
                                      f"not {message['role']!r}")
        return render(message["content"])


EPISODES: list[dict] = []  # one record per finished episode, in the order they closed
_EPISODES_LOCK = threading.Lock()


class SayJaxEnv(base_environment.BaseTaskEnv):
    """The prompt as the first observation; then, for `turns` turns, a reward for each
    REWARD_WORD in the reply and an observation computed from it."""

    def __init__(self, single_example: dict, *, turns: int = 3, **kwargs):
        super().__init__(task=single_example, max_steps=turns, **kwargs)
        self.rewards: list[float] = []

    def _initial_observation(self) -> str:
        # the learner hands each example's fields as one-element arrays
        return str(np.asarray(self.task["prompts"]).reshape(-1)[0])

    def _step_impl(self, action) -> base_environment.EnvStepResult:
        reply = action.action if isinstance(action, agent_types.Action) else action
        said = reply.split().count(grpo_tunix.REWARD_WORD)
        self.rewards.append(float(said))
        observation = PRAISE if said else ASK
        return base_environment.EnvStepResult(observation=observation, reward=float(said),
                                              done=False, info={"said": said})

    def close(self):
        with _EPISODES_LOCK:
            EPISODES.append({"turns": self.step_count, "reward": float(sum(self.rewards))})


def _unpadded(row: np.ndarray, pad_id: int) -> list[int]:
    """A left-padded prompt row without its padding (prompts start with BOS, never pad)."""
    start = int(np.argmax(row != pad_id)) if (row != pad_id).any() else len(row)
    return row[start:].tolist()


class AgenticSpecRollout(grpo_tunix.CheckedSpecRollout):
    """grpo_tunix's weight check after every sync; instead of its per-call checks (which
    swap the engine front's methods and reset its metrics around each call: one call at a
    time), thread-safe bookkeeping of the concurrent calls: how many were in flight at once,
    each call's turn, and whether a later turn's prompt extends its previous turn."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self._calls_lock = threading.Lock()
        self.in_flight = 0
        self.calls = {"count": 0, "max_in_flight": 0, "first_turns": 0, "later_turns": 0,
                      "first_turn_prompt_tokens_max": 0, "prompt_tokens": 0,
                      "later_turn_reusable_tokens": 0}
        self._ends: dict[tuple, int] = {}  # a call's prompt + completion -> its turn

    def generate(self, prompts, rollout_config, **kwargs):
        # (Tunix 0.1.7's agentic learner passes one prompt string, not a list:
        # agentic_rl_learner.AgenticRLLearner._model_call; SpecRollout takes either)
        with self._calls_lock:
            self.in_flight += 1
            self.calls["max_in_flight"] = max(self.calls["max_in_flight"], self.in_flight)
        try:  # SpecRollout's own generate, not CheckedSpecRollout's
            out = SpecRollout.generate(self, prompts, rollout_config, **kwargs)
        finally:
            with self._calls_lock:
                self.in_flight -= 1
        with self._calls_lock:
            for row, completion in zip(out.left_padded_prompt_tokens, out.tokens):
                self._record(_unpadded(row, self.pad_id()), completion.tolist())
        return out

    def _record(self, prompt: list[int], completion: list[int]) -> None:
        """A call's turn: one more than the call whose prompt + completion its prompt
        extends (the longest such), else 1."""
        c = self.calls
        extended = max((n for n in range(len(prompt)) if tuple(prompt[:n]) in self._ends), default=0)
        turn = self._ends[tuple(prompt[:extended])] + 1 if extended else 1
        self._ends[tuple(prompt + completion)] = turn
        c["count"] += 1
        c["prompt_tokens"] += len(prompt)
        if turn == 1:
            c["first_turns"] += 1
            c["first_turn_prompt_tokens_max"] = max(c["first_turn_prompt_tokens_max"], len(prompt))
        else:
            c["later_turns"] += 1
            c["later_turn_reusable_tokens"] += extended  # what the kept slot holds


class CheckedAgenticLearner(agentic_grpo_learner.GRPOLearner):
    """Tunix's agentic GRPO learner with a per-turn token budget, recording each group's
    rewards and comparing its rollout logprobs with the trainer's recomputation."""

    def __init__(self, *args, turn_tokens: int, **kwargs):
        super().__init__(*args, **kwargs)
        self.turn_tokens = turn_tokens
        self.group_rewards: list[tuple[int, list[float]]] = []  # (step, rewards of its G episodes)
        self.logprob_max_abs_diff: list[float] = []  # per group
        self.logprob_tokens_compared = 0

    def _model_call(self, chat_lists, env=None, max_generation_steps=None):
        # Tunix 0.1.7 budgets tokens per episode only (max_response_length), which the first
        # turn may spend whole: the untrained toy policy rarely says </s>, so each turn is capped
        cap = self.turn_tokens
        if max_generation_steps is not None:
            cap = min(cap, max_generation_steps)
        return super()._model_call(chat_lists, env, max_generation_steps=cap)

    def _process_results(self, trajectories, mode=rl_cluster_lib.Mode.TRAIN, expected_step=None):
        examples = super()._process_results(trajectories, mode, expected_step)
        if mode == rl_cluster_lib.Mode.TRAIN:
            rewards = [float(item.traj["trajectory_reward"]) for item in trajectories]
            self.group_rewards.append((int(expected_step or 0), rewards))
        for example in examples:
            self._compare_logprobs(example)
        return examples

    def _compare_logprobs(self, example) -> None:
        """Rollout logprobs (each turn's, from its own prompt) against Tunix's recomputation
        on the trainer over the flattened conversation, at the reply tokens. Tunix drops a
        generated pad id from the context of what follows it (its masks come from the pad
        id), the engine keeps it: each row is compared up to and including that token."""
        pad = self.rl_cluster.rollout.pad_id()
        theirs = np.asarray(self.rl_cluster.get_actor_per_token_logps(
            prompt_tokens=example.prompt_ids, completion_tokens=example.completion_ids,
            pad_id=pad, eos_id=self.rl_cluster.rollout.eos_id()))
        ours = np.asarray(example.old_per_token_logps)
        tokens, mask = np.asarray(example.completion_ids), np.asarray(example.completion_mask).astype(bool)
        worst = 0.0
        for i in range(len(tokens)):
            pads = np.flatnonzero(mask[i] & (tokens[i] == pad))
            keep = mask[i].copy()
            if pads.size:
                keep[pads[0] + 1:] = False
            if keep.any():
                worst = max(worst, float(np.max(np.abs(theirs[i][keep] - ours[i][keep]))))
                self.logprob_tokens_compared += int(keep.sum())
        self.logprob_max_abs_diff.append(worst)


def mean_reward_per_step(group_rewards: list[tuple[int, list[float]]]) -> list[float]:
    """The mean episode reward of each training step, in step order."""
    by_step: dict[int, list[float]] = {}
    for step, rewards in group_rewards:
        by_step.setdefault(step, []).extend(rewards)
    return [float(np.mean(by_step[s])) for s in sorted(by_step)]


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=2, help="agentic GRPO training steps")
    ap.add_argument("--generations", type=int, default=2, help="GRPO group size G (episodes per prompt)")
    ap.add_argument("--batch", type=int, default=2, help="prompts per step")
    ap.add_argument("--turns", type=int, default=3, help="turns per episode (>= 2)")
    ap.add_argument("--turn-tokens", type=int, default=8, help="most tokens the policy says per turn")
    ap.add_argument("--concurrency", type=int, default=None,
                    help="episodes in flight (Tunix's max_concurrency; default: batch x G, all of a step)")
    ap.add_argument("--k", type=int, default=3, help="max draft tokens per step")
    ap.add_argument("--distill-steps", type=int, default=0,
                    help="refresh the draft on the rollouts since the last sync, N optimizer steps, before the "
                         "first call after each sync (SpecRollout(distill_steps=N))")
    ap.add_argument("--json", default=None, help="write the checks here")
    args = ap.parse_args(argv)
    EPISODES.clear()
    if args.turns < 2:
        raise SystemExit("--turns must be at least 2 (a multi-turn environment)")
    concurrency = args.concurrency or args.batch * args.generations
    if concurrency < 2:
        raise SystemExit("--concurrency must be at least 2 for rollout calls to overlap")
    t0 = time.perf_counter()

    devices = jax.devices()
    if len(devices) < 2:
        raise SystemExit("needs 2 devices (XLA_FLAGS --xla_force_host_platform_device_count)")
    actor_mesh = Mesh(np.array(devices[:1]).reshape(1, 1), ("fsdp", "tp"))
    rollout_mesh = Mesh(np.array(devices[1:2]).reshape(1, 1), ("fsdp", "tp"))

    # an episode's token budget: every turn's reply and every environment message but the
    # last, and one token more (Tunix ends an episode whose count reaches the budget right
    # after the model call, skipping that turn's environment step)
    max_response = args.turns * args.turn_tokens + (args.turns - 1) * ENV_MESSAGE_TOKENS + 1
    rollout_config = base_rollout.RolloutConfig(
        max_tokens_to_generate=max_response, max_prompt_length=MAX_PROMPT_LENGTH,
        kv_cache_size=MAX_PROMPT_LENGTH + max_response, temperature=0.9, top_p=1.0,
        return_logprobs=True)
    draft = models.init_model(models.ModelConfig(
        vocab_size=len(CHAT_WORDS), hidden_size=16, intermediate_size=32, num_layers=1, num_heads=2,
        num_kv_heads=1, head_dim=8), seed=1)
    # a slot per episode in flight: each keeps its episode's last turn for the next
    engine = functools.partial(
        AgenticSpecRollout, draft=draft, max_batch_size=concurrency, prefill_chunk=16,
        spec=SpecConfig(method="draft_model", num_speculative_tokens=args.k), distill_steps=args.distill_steps)
    cluster = grpo_tunix.rl_cluster(
        grpo_tunix.policy(0, len(CHAT_WORDS)), grpo_tunix.policy(0, len(CHAT_WORDS)), ChatWordTokenizer(),
        engine, (actor_mesh, rollout_mesh), rollout_config, args.steps)
    learner = CheckedAgenticLearner(
        rl_cluster=cluster, chat_parser=WordChatParser(cluster.tokenizer),
        algo_config=agentic_grpo_learner.GRPOConfig(
            num_generations=args.generations, num_iterations=1, beta=0.04,
            max_response_length=max_response, max_concurrency=concurrency,
            system_prompt=SYSTEM_PROMPT),
        env_class=SayJaxEnv, env_kwargs={"turns": args.turns}, turn_tokens=args.turn_tokens)
    data = (grain.MapDataset.source(grpo_tunix.PROMPTS * args.steps).batch(args.batch)
            .map(lambda x: {"prompts": x}))
    learner.train(data)

    rollout = cluster.rollout
    calls = rollout.calls
    rewards = [e["reward"] for e in EPISODES]
    result = {
        "steps": args.steps, "steps_trained": int(cluster.global_steps),
        "seconds": time.perf_counter() - t0,
        "concurrency": concurrency, "turns": args.turns, "turn_tokens": args.turn_tokens,
        "episodes": len(EPISODES),
        "turns_per_episode": [e["turns"] for e in EPISODES],
        "mean_reward_per_step": mean_reward_per_step(learner.group_rewards),
        "episode_rewards": rewards,
        "rewards_finite": all(math.isfinite(r) for r in rewards),
        "syncs": len(rollout.log["sync_compiles"]),
        "sync_max_abs_diff": [float(x) for x in jax.device_get(rollout.log["sync_max_abs_diff"])],
        "sync_compiles": rollout.log["sync_compiles"],
        "generate_calls": calls["count"],
        "engine_runs": rollout.front.runs,
        "calls_joining_a_run": calls["count"] - rollout.front.runs,
        "max_calls_in_flight": calls["max_in_flight"],
        "first_turn_calls": calls["first_turns"],
        "later_turn_calls": calls["later_turns"],
        "first_turn_prompt_tokens_max": calls["first_turn_prompt_tokens_max"],
        "min_shared_prefix": MIN_SHARED_PREFIX,
        "prompt_tokens": calls["prompt_tokens"],
        "later_turn_reusable_tokens": calls["later_turn_reusable_tokens"],
        "engine_metrics": rollout.engine.metrics(),
        "logprob_max_abs_diff": learner.logprob_max_abs_diff,
        "logprob_tokens_compared": learner.logprob_tokens_compared,
        "distill": rollout.distill_log,
    }
    return grpo_tunix.report(result, args.json)


if __name__ == "__main__":
    main()
