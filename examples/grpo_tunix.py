"""GRPO with Tunix on a tiny Llama3 policy, its rollouts by dsd_jax's SpecRollout (CPU).

    python examples/grpo_tunix.py --steps 3

A real `tunix.rl.grpo.GRPOLearner`: Tunix's own Llama3 class as the policy (and as the
frozen reference), a word-level toy vocabulary, a reward for saying "jax", and
`ClusterConfig(rollout_engine=functools.partial(SpecRollout, draft=...))`: every rollout
is speculative (a one-layer draft of ours, K chosen per step), every GRPO group of
`num_generations` completions one request with `SamplingParams(n=G)` (one prefill).

With `--lora RANK` the policy is a qwix LoRA model (`LoraProvider` on every projection):
Tunix trains its adapters only and syncs just those (`update_params(state, (nnx.LoRAParam,))`),
which the rollout merges into the base weights it keeps (`SpecRollout(lora_alpha=...)`).

The process gets three CPU devices: the trainer on one, the rollout engine on the next
(`--rollout-devices 2`: tensor-parallel over the other two), so after each training step Tunix syncs weights through `SpecRollout.update_params`
(device to device, under its transfer guards). With `--distill-steps N` the draft is
refreshed from the last rollouts against the updated policy before each generation.

The run checks, and prints as JSON (`--json FILE` writes it):
- after every sync the engine's weights equal the trainer's (leaf by leaf, exactly; with
  LoRA, base + (alpha / rank) a.b computed here by hand: exactly on one rollout device, to a
  float32 ulp when the merge runs sharded);
- no sync compiles anything, and a rollout compiles only (K, batch bucket) programs it
  runs for the first time (programs compile on first use; `engine.warmup()` compiles them
  all up front): never a program twice, whatever the weights;
- the rollout logprobs equal Tunix's `compute_per_token_logps` on the synced weights.
"""

from __future__ import annotations

import os

# three CPU devices (the trainer's, and up to two for the rollout); must precede the first
# JAX import
os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") +
                           " --xla_force_host_platform_device_count=3").strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import argparse  # noqa: E402
import functools  # noqa: E402
import json  # noqa: E402
import time  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402
import qwix  # noqa: E402
from flax import nnx  # noqa: E402
from grain import python as grain  # noqa: E402
from jax.sharding import Mesh  # noqa: E402
from tunix.models.llama3 import model as llama3  # noqa: E402
from tunix.rl import common  # noqa: E402
from tunix.rl import rl_cluster as rl_cluster_lib  # noqa: E402
from tunix.rl.grpo import grpo_learner  # noqa: E402
from tunix.rl.rollout import base_rollout  # noqa: E402

from dsd_jax import SpecConfig, models  # noqa: E402
from dsd_jax.compilation import compilation_count  # noqa: E402
from dsd_jax.integrations.tunix import SpecRollout  # noqa: E402
from dsd_jax.param_mapping import flatten  # noqa: E402

WORDS = ["<pad>", "<s>", "</s>", "the", "a", "jax", "model", "is", "fast", "slow", "and", "we",
         "train", "decode", "tokens", "with", "draft", "target", "speculative", "step", "good",
         "very", "rollout", "policy", "learns", "to", "say", "more", "words", "here", "now", "."]
PROMPTS = ["we train the model", "the draft is fast", "speculative decode with jax",
           "the policy learns", "we decode tokens now", "a rollout step"]
REWARD_WORD = "jax"


class WordTokenizer:
    """Whitespace tokenizer over `WORDS` (pad 0, bos 1, eos 2): Tunix's tokenizer protocol."""

    def __init__(self):
        self.ids = {w: i for i, w in enumerate(WORDS)}

    def encode(self, text: str, **kwargs) -> list[int]:
        return [self.ids[w] for w in text.split() if w in self.ids]

    def decode(self, ids, **kwargs) -> str:
        return " ".join(WORDS[i] for i in ids)

    def bos_id(self) -> int:
        return 1

    def eos_id(self) -> int:
        return 2

    def pad_id(self) -> int:
        return 0


REWARDS: list[float] = []  # mean reward of each training batch, in order


def reward_jax(prompts, completions, **kwargs):
    """GRPO's reward: how often the completion says REWARD_WORD."""
    rewards = [float(c.split().count(REWARD_WORD)) for c in completions]
    REWARDS.append(float(np.mean(rewards)))
    return rewards


def policy(seed: int, vocab_size: int = len(WORDS)) -> llama3.Llama3:
    """A tiny Tunix Llama3 (its MLP kernels start at zero: give every weight some noise)."""
    cfg = llama3.ModelConfig(num_layers=2, vocab_size=vocab_size, embed_dim=32, hidden_dim=64,
                             num_heads=4, head_dim=8, num_kv_heads=2, rope_theta=10000,
                             norm_eps=1e-5)
    model = llama3.Llama3(cfg, rngs=nnx.Rngs(seed))
    state = nnx.state(model, nnx.Param)
    keys = iter(jax.random.split(jax.random.key(seed), len(jax.tree.leaves(state))))
    nnx.update(model, jax.tree.map(
        lambda x: x + 0.2 * jax.random.normal(next(keys), x.shape) if x.ndim > 1 else x, state))
    return model


LORA_ALPHA = 8.0


def lora_policy(model: llama3.Llama3, rank: int) -> llama3.Llama3:
    """The policy with qwix LoRA adapters on every projection (lora_b starts at zero)."""
    provider = qwix.LoraProvider(module_path=".*_proj", rank=rank, alpha=LORA_ALPHA)
    tokens = jnp.ones((1, 4), jnp.int32)
    return qwix.apply_lora_to_model(model, provider, tokens, jnp.arange(4)[None], None,
                                    jnp.ones((1, 4, 4), bool), rngs=nnx.Rngs(0))


@jax.jit  # under Tunix's transfer guards: the scale must not be an eager host scalar
def lora_delta(a, b):
    """What a qwix adapter adds to its weight: (alpha / rank) a.b."""
    return LORA_ALPHA / a.shape[-1] * jnp.tensordot(a, b, 1)


def expected_leaves(trainer_state) -> dict:
    """Our leaves as they must be after a sync, written out by hand from Tunix's layout
    (independent of `dsd_jax.param_mapping` and `dsd_jax.lora`): a weight with LoRA
    adapters is W + (alpha / rank) a.b."""
    s = trainer_state

    def weight(module, name):
        w = module[name][...]
        if name + "_lora_a" not in module:
            return w
        return w + lora_delta(module[name + "_lora_a"][...], module[name + "_lora_b"][...])

    out = {"embed": s["embedder"]["input_embedding"][...], "final_norm": s["final_norm"]["w"][...],
           "lm_head": s["lm_head"]["w"][...]}
    for i, layer in s["layers"].items():
        a, m = layer["attn"], layer["mlp"]
        d = a["q_proj"]["w"][...].shape[0]
        out.update({
            f"layers.{i}.attn_norm": layer["input_layernorm"]["w"][...],
            f"layers.{i}.mlp_norm": layer["post_attention_layernorm"]["w"][...],
            f"layers.{i}.wq": weight(a["q_proj"], "w").reshape(d, -1),
            f"layers.{i}.wk": weight(a["k_proj"], "w").reshape(d, -1),
            f"layers.{i}.wv": weight(a["v_proj"], "w").reshape(d, -1),
            f"layers.{i}.wo": weight(a["o_proj"], "w").reshape(-1, d),
            f"layers.{i}.w_gate": weight(m["gate_proj"], "kernel"),
            f"layers.{i}.w_up": weight(m["up_proj"], "kernel"),
            f"layers.{i}.w_down": weight(m["down_proj"], "kernel")})
    return out


class CheckedSpecRollout(SpecRollout):
    """SpecRollout recording what the run checks: compilations inside each call, the
    weights after each sync and the rollout logprobs against Tunix's recomputation."""

    def __init__(self, rollout_actor=None, **kwargs):
        super().__init__(rollout_actor=rollout_actor, **kwargs)
        self.tunix_graph = nnx.graphdef(rollout_actor)
        self.synced = jax.tree.map(jnp.copy, nnx.state(rollout_actor, nnx.Param))
        self.log = {"generate_compiles": [], "generate_new_programs": [], "sync_compiles": [], "sync_max_abs_diff": [], "lora_max_abs_delta": [],
                    "logprob_max_abs_diff": [], "logprob_tokens_compared": 0, "groups": [],
                    "acceptance": []}

    def update_params(self, params, filter_types=None):
        before = compilation_count()
        super().update_params(params, filter_types)
        self.log["sync_compiles"].append(compilation_count() - before)
        # still under Tunix's transfer guards: device-side comparisons and copies only.
        # A LoRA sync brings the adapters: the rest of the trainer's state is what it was
        params = nnx.merge_state(self.synced, params)
        want = expected_leaves(params)
        if filter_types == (nnx.LoRAParam,):  # what the adapters add: the check is not vacuous
            named, _ = flatten(params)
            self.log["lora_max_abs_delta"].append(functools.reduce(jnp.maximum, [
                jnp.max(jnp.abs(lora_delta(named[n], named[n[:-1] + "b"])))
                for n in named if n.endswith("_lora_a")]))
        ours, _ = flatten(self.engine._target_params)
        diffs = [jnp.max(jnp.abs(jax.device_put(want[n], x.sharding) - x)) for n, x in ours.items()]
        self.log["sync_max_abs_diff"].append(functools.reduce(jnp.maximum, diffs))
        self.synced = jax.tree.map(jnp.copy, params)

    def generate(self, prompts, rollout_config, **kwargs):
        runs, compiles = [], []
        inner = self.front.generate  # what every SpecRollout.generate goes through

        def spy(ps, sampling, **kw):  # how the prompts were grouped; what the engine compiled
            runs.append([sp.n for sp in sampling])
            before, programs = compilation_count(), len(self.engine.programs._compiled)
            out = inner(ps, sampling, **kw)
            compiles.append((compilation_count() - before,
                             len(self.engine.programs._compiled) - programs))
            return out
        self.front.generate = spy
        try:
            self.engine.reset_metrics()
            out = super().generate(prompts, rollout_config, **kwargs)
        finally:
            del self.front.generate
        self.log["generate_compiles"].append(compiles[0][0])
        self.log["generate_new_programs"].append(compiles[0][1])
        self.log["groups"].append(runs[0])
        self.log["acceptance"].append(self.engine.metrics()["mean_accepted_len"])
        if out.logprobs is not None:
            self._check_logprobs(out, rollout_config)
        return out

    def _check_logprobs(self, out, cfg):
        width = cfg.max_tokens_to_generate
        comp = np.zeros((len(out.tokens), width), np.int32)
        for i, t in enumerate(out.tokens):
            comp[i, :len(t)] = t
        theirs = np.asarray(common.compute_per_token_logps(
            self.tunix_graph, self.synced, prompt_tokens=jnp.asarray(out.left_padded_prompt_tokens),
            completion_tokens=jnp.asarray(comp), pad_id=self.pad_id(), eos_id=self.eos_id(),
            temperature=cfg.temperature))
        worst = 0.0
        for i, t in enumerate(out.tokens):
            # Tunix drops a generated pad id from the context of what follows it (its masks
            # come from the pad id); we keep it: compare up to and including that token
            n = int(np.argmax(t == self.pad_id())) + 1 if (t == self.pad_id()).any() else len(t)
            if n:
                worst = max(worst, float(np.max(np.abs(theirs[i, :n] - out.logprobs[i][:n]))))
                self.log["logprob_tokens_compared"] += n
        self.log["logprob_max_abs_diff"].append(worst)


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=3, help="GRPO training steps")
    ap.add_argument("--generations", type=int, default=4, help="GRPO group size G")
    ap.add_argument("--batch", type=int, default=2, help="prompts per step")
    ap.add_argument("--max-tokens", type=int, default=12)
    ap.add_argument("--k", type=int, default=3, help="max draft tokens per step")
    ap.add_argument("--distill-steps", type=int, default=0,
                    help="draft refresh (optax steps on the last rollouts) before each rollout")
    ap.add_argument("--lora", type=int, default=0, metavar="RANK",
                    help="train qwix LoRA adapters of this rank (0: every weight)")
    ap.add_argument("--rollout-devices", type=int, default=1, choices=(1, 2),
                    help="devices of the rollout mesh (2: the engine tensor-parallel over them)")
    ap.add_argument("--json", default=None, help="write the checks here")
    args = ap.parse_args(argv)
    t0 = time.perf_counter()

    devices = jax.devices()
    if len(devices) < 1 + args.rollout_devices:
        raise SystemExit(f"needs {1 + args.rollout_devices} devices (XLA_FLAGS "
                         "--xla_force_host_platform_device_count)")
    actor_mesh = Mesh(np.array(devices[:1]).reshape(1, 1), ("fsdp", "tp"))
    rollout_mesh = Mesh(np.array(devices[1:1 + args.rollout_devices]).reshape(1, -1), ("fsdp", "tp"))

    actor, reference = policy(0), policy(0)
    if args.lora:
        actor = lora_policy(actor, args.lora)
    draft = models.init_model(models.ModelConfig(
        vocab_size=len(WORDS), hidden_size=16, intermediate_size=32, num_layers=1, num_heads=2,
        num_kv_heads=1, head_dim=8), seed=1)
    rollout_config = base_rollout.RolloutConfig(
        max_tokens_to_generate=args.max_tokens, max_prompt_length=8, kv_cache_size=32,
        temperature=0.9, top_p=1.0, return_logprobs=True)
    batch_slots = args.batch * args.generations
    engine = functools.partial(
        CheckedSpecRollout, draft=draft, max_batch_size=batch_slots, prefill_chunk=16,
        spec=SpecConfig(method="draft_model", num_speculative_tokens=args.k),
        distill_steps=args.distill_steps, lora_alpha=LORA_ALPHA if args.lora else None)
    cluster = rl_cluster(actor, reference, WordTokenizer(), engine, (actor_mesh, rollout_mesh), rollout_config,
                         args.steps)
    learner = grpo_learner.GRPOLearner(
        rl_cluster=cluster, reward_fns=reward_jax,
        algo_config=grpo_learner.GRPOConfig(num_generations=args.generations, num_iterations=1,
                                            beta=0.04))
    data = (grain.MapDataset.source(PROMPTS * args.steps).batch(args.batch)
            .map(lambda x: {"prompts": x}))
    learner.train(data)

    rollout = cluster.rollout
    log = rollout.log
    result = {
        "steps": args.steps, "lora_rank": args.lora, "rollout_devices": args.rollout_devices, "seconds": time.perf_counter() - t0,
        "syncs": len(log["sync_compiles"]),
        "sync_max_abs_diff": [float(x) for x in jax.device_get(log["sync_max_abs_diff"])],
        "sync_compiles": log["sync_compiles"],
        "lora_max_abs_delta": [float(x) for x in jax.device_get(log["lora_max_abs_delta"])],
        "generate_compiles": log["generate_compiles"],
        "generate_new_programs": log["generate_new_programs"],
        "groups": log["groups"],
        "logprob_max_abs_diff": log["logprob_max_abs_diff"],
        "logprob_tokens_compared": log["logprob_tokens_compared"],
        "mean_accepted_len": log["acceptance"],
        "mean_reward_per_step": REWARDS,
        "distill": rollout.distill_log,
    }
    return report(result, args.json)


def rl_cluster(actor, reference, tokenizer, engine, meshes, rollout_config, steps: int):
    """Tunix's RLCluster for these examples: trainer and reference on meshes[0], the rollout
    engine (a SpecRollout factory) on meshes[1], AdamW at 3e-3 for `steps` steps."""
    actor_mesh, rollout_mesh = meshes
    return rl_cluster_lib.RLCluster(
        actor=actor, reference=reference, tokenizer=tokenizer,
        cluster_config=rl_cluster_lib.ClusterConfig(
            role_to_mesh={rl_cluster_lib.Role.ACTOR: actor_mesh,
                          rl_cluster_lib.Role.REFERENCE: actor_mesh,
                          rl_cluster_lib.Role.ROLLOUT: rollout_mesh},
            rollout_engine=engine, offload_to_cpu=False,
            training_config=rl_cluster_lib.RLTrainingConfig(
                actor_optimizer=optax.adamw(3e-3), eval_every_n_steps=1000, max_steps=steps),
            rollout_config=rollout_config))


def report(result: dict, path: str | None) -> dict:
    """Prints the run's checks as JSON, and writes them to `path` when one is given."""
    print(json.dumps(result, indent=1))
    if path:
        with open(path, "w") as f:
            json.dump(result, f, indent=1)
    return result


if __name__ == "__main__":
    main()
