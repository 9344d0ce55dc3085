"""Tunix rollout engine: speculative decoding for Tunix RL (GRPO and friends).

    from dsd_jax.integrations.tunix import SpecRollout
    cluster_config = rl_cluster_lib.ClusterConfig(
        rollout_engine=functools.partial(SpecRollout, draft=my_draft, max_batch_size=32), ...)

Tunix builds it as `cls(rollout_actor=, tokenizer=, mesh=, rollout_config=)`; with a custom
engine `rollout_actor` is the trainer's own policy module (`tunix.models.llama3` or
`tunix.models.qwen3`). The policy is converted once into our `Transformer` by the family's
declared mapping (`dsd_jax.param_mapping`), and `update_params` maps every weight sync
the same way, device to device, onto the engine's compiled layout.

Conventions, as Tunix 0.1.7's own `VanillaRollout` (tunix/generate/sampler.py):
- prompts are tokenized with the tokenizer's BOS prepended (deduplicated) and left-padded
  with `pad_id` to `max_prompt_length`, or to the next power of two of the longest prompt
  when that is longer;
- completions are unpadded int32 numpy arrays of at most `max_tokens_to_generate` tokens,
  cut before the first of `eos_tokens` (default: the tokenizer's EOS), which is excluded;
- greedy when `top_p` is None (vanilla's sampler then ignores temperature and top_k) or
  the temperature is 0; otherwise temperature -> top_k (None/<=0: off) -> top_p;
- `logprobs` (when `return_logprobs`): for each completion token, `log_softmax(logits / T)`
  of the unfiltered logits (raw logits when greedy), what `common.compute_per_token_logps`
  recomputes with the rollout temperature;
- `get_per_token_logps` is `compute_per_token_logps` at temperature 1, as vanilla's.

GRPO repeats each prompt `num_generations` times back to back: each run of equal prompts
becomes one request with `SamplingParams(n=run length)`, one prefill for the group.
Where the model generates `pad_id` inside a completion, Tunix masks that position out of
the recomputation (its masks come from the pad id), so logprobs after it differ there, as
they do for Tunix's own sampler.
"""

from __future__ import annotations

import numbers
import threading

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec

from tunix.rl.rollout import base_rollout

from dsd_jax import drafters, lora, param_mapping
from dsd_jax.config import SpecConfig
from dsd_jax.distill import DraftDistiller, token_logps
from dsd_jax.engine import SpecEngine
from dsd_jax.models.config import ModelConfig
from dsd_jax.models.eagle3 import Eagle3Head
from dsd_jax.models.transformer import Transformer
from dsd_jax.rollout_memory import RolloutMemory
from dsd_jax.sampling import GREEDY_BELOW, SamplingParams
from dsd_jax.sharding import make_mesh
from dsd_jax.state import MAX_STOP_IDS
from dsd_jax.threaded import ThreadedEngine

# Tunix 0.1.7's Llama3 and Qwen3 attention call `apply_rope` without the config's
# rope_theta, so the model runs at that function's default whatever the config says.
# `from_tunix` checks the converted model's logits against Tunix's own forward.
TUNIX_APPLIED_ROPE_THETA = 1_000_000.0
ADAPTERS_ATTRIBUTE = "lora_adapters"  # where `SpecRollout.model()` carries a LoRA policy's adapters


def family(module) -> tuple[str, param_mapping.ParamMapping]:
    """("llama3" | "qwen3", its mapping) of a Tunix policy module."""
    from tunix.models.llama3 import model as llama3
    from tunix.models.qwen3 import model as qwen3
    if isinstance(module, llama3.Llama3):
        return "llama3", param_mapping.TUNIX_LLAMA3
    if isinstance(module, qwen3.Qwen3):
        if module.config.num_experts is not None:
            raise ValueError("Tunix Qwen3 mixture-of-experts models are not supported (dense only)")
        return "qwen3", param_mapping.TUNIX_QWEN3
    raise ValueError(f"unsupported Tunix model class {type(module).__name__}: SpecRollout maps "
                     "tunix.models.llama3.Llama3 and tunix.models.qwen3.Qwen3 (or give target= "
                     "and mapping= yourself)")


def _params(module) -> tuple[dict, dict]:
    """({name: leaf} of the plain leaves, of the LoRA adapters' leaves) of a Tunix module's
    `nnx.Param`s (qwix's `nnx.LoRAParam`s are Params too)."""
    named, _ = param_mapping.flatten(nnx.state(module, nnx.Param))
    plain, _ = lora.split(named)  # every adapter whole
    return plain, {n: x for n, x in named.items() if n not in plain}


def config_from_tunix(module) -> ModelConfig:
    """Our `ModelConfig` for a Tunix Llama3 / Qwen3 module (dtype from its parameters)."""
    name, _ = family(module)
    c = module.config
    plain, _ = _params(module)
    dtypes = {np.dtype(x.dtype) for x in plain.values()}
    if len(dtypes) != 1 or dtypes.pop() not in (np.dtype(jnp.float32), np.dtype(jnp.bfloat16)):
        raise ValueError("the Tunix model's parameters must all be float32 or all bfloat16")
    dtype = str(next(iter(plain.values())).dtype)
    tied = c.weight_tying if name == "llama3" else c.use_tied_embedding
    return ModelConfig(
        vocab_size=c.vocab_size, hidden_size=c.embed_dim, intermediate_size=c.hidden_dim,
        num_layers=c.num_layers, num_heads=c.num_heads, num_kv_heads=c.num_kv_heads,
        head_dim=c.head_dim, model_type="llama" if name == "llama3" else "qwen3",
        rope_theta=TUNIX_APPLIED_ROPE_THETA, rms_norm_eps=c.norm_eps, tie_word_embeddings=tied,
        qk_norm=name == "qwen3", dtype=dtype)


def _lora_alpha_needed() -> ValueError:
    return ValueError("the Tunix policy has LoRA adapters (qwix's LoraProvider): give lora_alpha=, the "
                      "provider's alpha (each adapter adds x.a.b * alpha / rank, and alpha is not in the "
                      "weights)")


def from_tunix(module, check: bool = True, lora_alpha: float | None = None) -> Transformer:
    """Our `Transformer` holding a Tunix policy's weights (copied on its devices); a LoRA
    policy's adapters merged in (`dsd_jax.lora`; `lora_alpha`: its provider's alpha).
    `check`: compare both forwards' logits on a short sequence, so a layout or convention
    we do not reproduce is an error here rather than silently wrong rollouts."""
    _, mapping = family(module)
    cfg = config_from_tunix(module)
    graph, abstract = nnx.split(nnx.eval_shape(lambda: Transformer(cfg, rngs=nnx.Rngs(0))))
    like = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), abstract)
    plain, adapters = _params(module)
    params = param_mapping.map_params(mapping, plain, like)
    if adapters:
        if lora_alpha is None:
            raise _lora_alpha_needed()
        params = lora.LoraWeights(mapping, lora_alpha, adapters, params).merged(adapters, params)
    ours = nnx.merge(graph, params)
    if check:
        tokens = (np.arange(12, dtype=np.int32) * 7 + 1) % cfg.vocab_size
        prompt, completion = jnp.asarray(tokens[None, :4]), jnp.asarray(tokens[None, 4:])
        from tunix.rl import common
        theirs = common.compute_per_token_logps(*nnx.split(module), prompt_tokens=prompt,
                                                completion_tokens=completion, pad_id=-1, eos_id=-1)
        mine = token_logps(ours, prompt, completion, pad_id=-1)
        err = float(jnp.max(jnp.abs(theirs - mine)))
        # bfloat16: each forward rounds its own way; merged, W + (alpha/rank) a.b rounds
        # once where qwix rounds x.W and x.a.b apart (0.064 against 0.030 without adapters
        # on the tests' tiny Llama; a wrong alpha, 7 for 8, gave 0.74)
        tol = 1e-4 if cfg.dtype == "float32" else 1.5e-1 if adapters else 5e-2
        if not err <= tol:
            raise ValueError(f"the converted {cfg.model_type} model's log-probabilities differ from "
                             f"Tunix's by {err:.3g} (> {tol}): this Tunix version's forward is not the "
                             "one the mapping reproduces" + (" (or lora_alpha is not the provider's)"
                                                             if adapters else ""))
    return ours


def _mesh_for(mesh):
    """A ("data", "model") engine mesh over the rollout mesh's devices (tensor parallel)."""
    if mesh is None:
        return None
    devices = list(np.asarray(mesh.devices).flat)
    return make_mesh(1, len(devices), devices=devices)


def _group_runs(prompts: list[list[int]]) -> list[tuple[int, int]]:
    """(start, length) of each run of identical consecutive prompts."""
    runs = []
    for i, p in enumerate(prompts):
        if runs and prompts[runs[-1][0]] == p:
            runs[-1] = (runs[-1][0], runs[-1][1] + 1)
        else:
            runs.append((i, 1))
    return runs


def _greedy(cfg) -> bool:
    """Tunix's sampler is greedy unless top_p is given (temperature 0: greedy as well)."""
    return cfg.top_p is None or float(cfg.temperature) == 0.0


DISTILL_OUTPUTS = 4096  # the newest completions a draft refresh learns from, at most

SEED_MODULUS = 2 ** 31  # completion r draws from seed + r: room for 2**31 of them below 2**32


def _seed_int(seed) -> int | None:
    """An int in [0, 2**31) from Tunix's `RolloutConfig.seed` (None, any int, or a JAX PRNG
    key), reduced modulo 2**31 (a seed already in range is kept): Tunix's sampler takes any
    integer, the engine's seeds are uint32 and seed + r must stay below 2**32."""
    if seed is None:
        return None
    if isinstance(seed, (int, np.integer)):
        return int(seed) % SEED_MODULUS
    arr = seed
    if jnp.issubdtype(getattr(seed, "dtype", np.int32), jax.dtypes.prng_key):
        arr = jax.random.key_data(seed)
    words = np.asarray(arr, dtype=np.uint64).ravel()
    return int(sum(int(w) << (32 * i) for i, w in enumerate(words[::-1])) % SEED_MODULUS)


class SpecRollout(base_rollout.BaseRollout):
    """A Tunix `BaseRollout` backed by a `SpecEngine`.

    Extra keyword arguments (bind them with `functools.partial`):
    draft: our `Transformer` sharing the policy's vocabulary (or a Tunix Llama3/Qwen3 module,
        converted the same way), for method "draft_model"; or an EAGLE-3 head
        (`dsd_jax.models.load_eagle3`), for method "eagle3";
    spec: `SpecConfig` or a vLLM-style dict of its fields (default: "draft_model" with a
        draft model, "eagle3" with a head, else "suffix": siblings of a GRPO group draft
        for each other);
    memory: a `dsd_jax.rollout_memory.RolloutMemory` (or True for a default one): each
        prompt's earlier rollouts become method "suffix"'s references, so the prompts a
        GRPO loop revisits every epoch draft from last epoch's completions (`memory`
        attribute; sampling stays exact, see `SamplingParams`);
    target: our `Transformer` to serve instead of converting `rollout_actor`;
    lora_alpha: for a LoRA policy (qwix's `LoraProvider` on the Tunix module), the
        provider's alpha. The engine serves the merged weights W + (alpha / rank) a.b, so its
        programs and their cost are the plain ones; it keeps the adapted weights' base
        copies (device memory of those leaves once more), and each LoRA sync
        (`update_params(state, (nnx.LoRAParam,))`, Tunix's with a LoRA actor) remerges them
        from the base and the new adapters on the engine's devices (`dsd_jax.lora`);
    mapping: the `ParamMapping` for `update_params` (default: the policy family's);
    max_batch_size: engine slots (default 64; more requests queue);
    max_seq_len: prompt + completion room (default: `rollout_config.kv_cache_size`, as
        vanilla's cache);
    distill_steps: when > 0 (needs a draft model), before each rollout that follows a
        weight sync the draft takes that many optax steps toward the new policy on the
        previous rollout's completions (`dsd_jax.distill.DraftDistiller`; its keyword
        arguments in `distill=`); `distill_log` keeps the losses, one entry per sync:
        `{"skipped": "no completed tokens"}` when those completions were all empty (the
        round is skipped, the draft kept), `{"error": ...}` when distillation raised (the
        error propagates from that one `generate`; the next call generates, and the next
        sync tries again);
    everything else goes to `SpecEngine` (batch_buckets, prefill_chunk, profile, controller,
    backend, seed, ...).

    With a seed (reduced modulo 2**31, as Tunix takes any integer), completion r of a call
    draws from seed + r. Whether a GRPO group member then equals the single request with its
    seed depends on the acceptance rule: always under
    `SpecConfig(acceptance="drafter_invariant")` (every output is token-identical to plain
    sampling with its seed); under the default "rejection" only when the drafter reads each
    row alone and K does not depend on the batch, which the default method without a draft
    ("suffix": siblings draft for each other) does not do, so a group's tokens differ from
    the single requests' (each still an exact sample from the policy). For reproducible
    groups use acceptance "drafter_invariant".
    """

    def __init__(self, rollout_actor=None, tokenizer=None, mesh=None, rollout_config=None, *,
                 draft=None, spec: SpecConfig | dict | None = None, target: Transformer | None = None,
                 mapping: param_mapping.ParamMapping | None = None, max_batch_size: int = 64,
                 max_seq_len: int | None = None, check: bool = True, distill_steps: int = 0,
                 distill: dict | None = None, memory: RolloutMemory | bool = False,
                 lora_alpha: float | None = None, **engine_kwargs):
        if tokenizer is None:
            raise ValueError("SpecRollout needs Tunix's tokenizer (tokenizer=)")
        if rollout_actor is None and (target is None or mapping is None):
            raise ValueError("SpecRollout needs rollout_actor (a Tunix policy), or target= and mapping=")
        if mapping is None:
            _, mapping = family(rollout_actor)
        plain, adapters = _params(rollout_actor) if rollout_actor is not None else ({}, {})
        if adapters and lora_alpha is None:
            raise _lora_alpha_needed()
        if lora_alpha is not None and not adapters:
            raise ValueError("lora_alpha is given but the policy has no LoRA adapters (qwix's "
                             "'*_lora_a' / '*_lora_b' leaves): wrap it with qwix.apply_lora_to_model first")
        if target is None:
            target = from_tunix(rollout_actor, check=check, lora_alpha=lora_alpha)
        if draft is not None and not isinstance(draft, (Transformer, Eagle3Head)):
            draft = from_tunix(draft, check=check)  # a Tunix draft policy; our models pass as is
        if spec is None:
            method = "suffix" if draft is None else "eagle3" if isinstance(draft, Eagle3Head) else "draft_model"
            spec = SpecConfig(method=method)
        elif isinstance(spec, dict):  # vLLM's speculative_config, as SpecEngine takes it
            spec = SpecConfig.from_dict(spec)
        if memory is True:
            memory = RolloutMemory()
        elif memory is False:
            memory = None
        elif not isinstance(memory, RolloutMemory):  # (an empty RolloutMemory is falsy: len 0)
            raise ValueError(f"memory must be a RolloutMemory, True or False, got {type(memory).__name__}")
        if memory is not None and not drafters.get(spec.method).reads_references:
            raise ValueError(f"memory feeds a drafter its references (method 'suffix'); method "
                             f"{spec.method!r} does not read them")
        self.memory = memory
        self.distill_steps = int(distill_steps)
        if self.distill_steps > 0 and (draft is None or spec.method != "draft_model"):
            raise ValueError("distill_steps needs a draft model (method 'draft_model', got "
                             f"{spec.method!r})")
        if max_seq_len is None:
            max_seq_len = rollout_config.kv_cache_size if rollout_config is not None else 1024
        self._tokenizer = tokenizer
        self._mapping = mapping
        self.mesh = mesh  # Tunix reads `rollout.mesh` back as the rollout role's mesh
        self._graph = nnx.graphdef(target)
        self.engine = SpecEngine(target, draft, spec, max_batch_size=max_batch_size,
                                 max_seq_len=max_seq_len, mesh=_mesh_for(mesh), **engine_kwargs)
        self._replicated = (None if self.engine.placement.mesh is None else
                            NamedSharding(self.engine.placement.mesh, PartitionSpec()))
        self._lora = None
        if adapters:  # base copies on the engine's layout; merging now compiles what syncs run
            base = param_mapping.map_params(mapping, plain, self.engine._target_params)
            self._lora = lora.LoraWeights(mapping, lora_alpha, adapters, base)
            self._lora.sync(self.engine, adapters)
        self.distill_log: list[dict] = []
        self._distiller = None
        if self.distill_steps > 0:
            temperature = rollout_config.temperature if rollout_config is not None else 1.0
            self._distiller = DraftDistiller(target, draft, **{"temperature": temperature,
                                                               **(distill or {})})
        # Tunix's agentic learner calls `generate` from a thread per episode: every call goes
        # through this thread-safe front, and calls that overlap share one running batch
        self.front = ThreadedEngine(self.engine)
        self._lock = threading.Lock()  # the distillation and its data, between calls
        self._last_outputs: list = []  # RequestOutputs of the calls since the last refresh (distillation data)
        self._synced = False  # weights changed since the draft was last refreshed
        # With a custom engine Tunix passes the trainer's own module as rollout_actor:
        # converting it above compiled the mapping program every later sync reuses.
        self._logps = jax.jit(_token_logps_split, static_argnums=(0,))

    # ---- generation --------------------------------------------------------------------
    def _tokenize(self, text: str) -> list[int]:
        ids = list(self._tokenizer.encode(text))
        bos = self._tokenizer.bos_id()
        return [int(t) for t in self._tokenizer.dedup_bos_ids(([bos] if bos else []) + ids)]

    def _check_prompts(self, ids: list[list[int]]) -> None:
        """Each prompt checked under the caller's index: the engine sees one prompt per run of
        equal ones (`_group_runs`), so its messages would count runs."""
        vocab = self.engine.target_config.vocab_size
        for i, p in enumerate(ids):
            if not p:
                raise ValueError(f"prompt {i} is empty (no tokens)")
            if min(p) < 0 or max(p) >= vocab:
                raise ValueError(f"prompt {i} has token ids outside the policy's vocabulary [0, {vocab})")

    def _check_config(self, cfg) -> None:
        """The RolloutConfig fields the engine reads, checked under their own names (the
        engine's messages would name its fields, and a grouped run's index for a prompt's)."""
        budget = cfg.max_tokens_to_generate
        if isinstance(budget, bool) or not isinstance(budget, numbers.Integral) or budget < 1:
            raise ValueError(f"rollout_config.max_tokens_to_generate must be an integer >= 1, got {budget!r}")
        vocab = self.engine.target_config.vocab_size
        for t in cfg.eos_tokens or ():
            if isinstance(t, bool) or not isinstance(t, numbers.Integral) or not 0 <= t < vocab:
                raise ValueError(f"rollout_config.eos_tokens holds {t!r}, not a token id of the policy's "
                                 f"vocabulary [0, {vocab})")

    def _sampling(self, cfg, n: int, seed: int | None) -> SamplingParams:
        stop = tuple(cfg.eos_tokens) if cfg.eos_tokens else (self.eos_id(),)
        if len(set(stop)) > MAX_STOP_IDS:  # the engine's message would name stop_token_ids
            raise ValueError(f"rollout_config.eos_tokens has {len(set(stop))} distinct ids; at most "
                             f"{MAX_STOP_IDS} are supported (they are the engine's stop ids)")
        common = dict(max_tokens=int(cfg.max_tokens_to_generate), stop_token_ids=stop, ignore_eos=True,
                      include_stop_token=False, seed=seed, n=n)  # exactly these stops
        if _greedy(cfg):
            return SamplingParams(temperature=0.0, **common)
        top_k = 0 if cfg.top_k is None or cfg.top_k <= 0 else int(cfg.top_k)
        return SamplingParams(temperature=float(cfg.temperature), top_k=top_k,
                              top_p=float(cfg.top_p), **common)

    def generate(self, prompts: list[str], rollout_config: base_rollout.RolloutConfig,
                 **kwargs) -> base_rollout.RolloutOutput:
        if isinstance(prompts, str):  # one prompt: Tunix's agentic learner passes it so, its samplers take it
            prompts = [prompts]
        if not prompts:
            raise ValueError("no prompts to generate from")
        cfg = rollout_config
        self._check_config(cfg)
        ids = [self._tokenize(p) for p in prompts]
        self._check_prompts(ids)
        longest = max(len(p) for p in ids)
        width = cfg.max_prompt_length
        if width is None or width < longest:  # vanilla's rule: no truncation, a wider block
            width = 1 << max(longest - 1, 0).bit_length()
        if longest + cfg.max_tokens_to_generate > self.engine.max_seq_len:
            raise ValueError(f"a {longest}-token prompt plus max_tokens_to_generate "
                             f"{cfg.max_tokens_to_generate} exceeds the engine's max_seq_len "
                             f"{self.engine.max_seq_len} (SpecRollout(max_seq_len=...))")
        runs = _group_runs(ids)
        base = _seed_int(cfg.seed)
        # completion r of the call draws from seed base + r (siblings: base + start + g)
        sampling = [self._sampling(cfg, n, None if base is None else base + start)
                    for start, n in runs]
        with self._lock:  # the first call after a sync refreshes the draft, the others wait
            if self._distiller is not None and self._synced and self._last_outputs:
                # not in update_params: Tunix runs it under guards against host->device copies
                self._distill()
        outs = self.front.generate([ids[start] for start, _ in runs], sampling,
                                    return_logprobs=cfg.return_logprobs, memory=self.memory)
        if self._distiller is not None:
            with self._lock:
                self._last_outputs = (self._last_outputs + outs)[-DISTILL_OUTPUTS:]
        tokens = [np.asarray(o.token_ids, np.int32) for o in outs]
        padded = np.full((len(ids), width), self.pad_id(), np.int32)
        for i, p in enumerate(ids):
            padded[i, width - len(p):] = p
        logprobs = None
        if cfg.return_logprobs:
            logprobs = self._rollout_logprobs(outs, padded, tokens, cfg)
        return base_rollout.RolloutOutput(
            text=[self._tokenizer.decode(t.tolist()) for t in tokens], logits=[],
            tokens=tokens, left_padded_prompt_tokens=padded, logprobs=logprobs)

    def _distill(self) -> None:
        """One distillation round on the rollouts since the last one, once per sync: `_synced` is
        cleared first, so a round that fails raises from this call only (the engine keeps
        its draft; the next sync tries again) instead of from every later call."""
        self._synced = False
        if not any(len(o.token_ids) for o in self._last_outputs):  # every completion empty
            self.distill_log.append({"skipped": "no completed tokens"})
            return
        try:
            metrics = self._distiller.refresh(self.engine, self._last_outputs, self.distill_steps)
            self._last_outputs = []
        except Exception as e:
            self.distill_log.append({"error": f"{type(e).__name__}: {e}"})
            raise
        self.distill_log.append(metrics)

    def _rollout_logprobs(self, outs, padded, tokens, cfg) -> list[np.ndarray]:
        """Tunix's convention: log_softmax(logits / T), unfiltered, of each sampled token."""
        if _greedy(cfg):  # log_softmax of the raw logits
            return [np.asarray(o.raw_logprobs, np.float32) for o in outs]
        T = float(cfg.temperature)
        filtered = (cfg.top_k is not None and cfg.top_k > 0) or cfg.top_p < 1.0
        if not filtered and T >= GREEDY_BELOW:  # the engine's processed logprobs are exactly that
            return [np.asarray(o.logprobs, np.float32) for o in outs]
        # top-k / top-p change the engine's distribution, and below GREEDY_BELOW the engine
        # samples greedily (its logprobs are the raw ones): rescore at T without the filters
        width = max(cfg.max_tokens_to_generate, 1)
        comp = np.full((len(tokens), width), self.pad_id(), np.int32)
        for i, t in enumerate(tokens):
            comp[i, :len(t)] = t
        scores = np.asarray(self.get_per_token_logps(padded, comp, temperature=T))
        return [scores[i, :len(t)].astype(np.float32) for i, t in enumerate(tokens)]

    def get_per_token_logps(self, prompt_tokens, completion_tokens, temperature: float = 1.0):
        """`common.compute_per_token_logps` on the rollout weights (vanilla: temperature 1)."""
        place = (lambda x: jax.device_put(x, self._replicated)) if self._replicated else jnp.asarray
        return self._logps(self._graph, self.engine._target_params, place(prompt_tokens),
                           place(completion_tokens), self.pad_id(), jnp.float32(temperature))

    # ---- weights -----------------------------------------------------------------------
    def update_params(self, params, filter_types=None) -> None:
        """Maps the trainer's state (Tunix's own model classes, or our own tree, e.g. the
        `model()` Tunix hands back when offloading) onto the engine, device to device. A
        LoRA policy's sync brings its adapters only (`filter_types` (nnx.LoRAParam,)): they
        are merged into the kept base weights (`lora_alpha`)."""
        if self._lora is not None and ADAPTERS_ATTRIBUTE in params:  # our model()'s state
            params = nnx.State({k: v for k, v in params.items() if k != ADAPTERS_ATTRIBUTE})
        names, _ = param_mapping.flatten(params)
        if self._lora is not None and lora.has_adapters(names):
            self._lora.sync(self.engine, params)
        elif lora.has_adapters(names) or _only_lora(filter_types):
            raise ValueError("a LoRA sync, but this SpecRollout was built from a policy without LoRA "
                             "adapters: build it from the LoRA-wrapped policy (qwix.apply_lora_to_model) "
                             "with lora_alpha=")
        else:
            ours, _ = param_mapping.flatten(self.engine._target_params)
            if set(names) == set(ours):  # already our tree: nothing to convert
                self.engine.set_params(target=params)
            else:
                param_mapping.set_params_from(self.engine, self._mapping, params)
        self._synced = True

    # ---- the rest of BaseRollout -------------------------------------------------------
    def pad_id(self) -> int:
        return self._tokenizer.pad_id()

    def eos_id(self) -> int:
        return self._tokenizer.eos_id()

    def model(self) -> Transformer:
        """Our `Transformer` on the current rollout weights (never the trainer's module, so
        Tunix sees separate weights and syncs them every step). A LoRA policy's carries the
        adapters merged into it (attribute `lora_adapters`, {trainer leaf name: LoRAParam}):
        Tunix 0.1.7 compares this state's leaves with the trainer's one by one
        (`rl_utils.is_sharing_weights`), which fails on a different leaf count."""
        model = nnx.merge(self._graph, self.engine._target_params)
        if self._lora is not None:
            setattr(model, ADAPTERS_ATTRIBUTE,
                    nnx.Dict({n: nnx.LoRAParam(x) for n, x in self._lora.adapters.items()}))
        return model


def _only_lora(filter_types) -> bool:
    """Whether Tunix's `filter_types` select LoRA adapters only."""
    return bool(filter_types) and all(isinstance(t, type) and issubclass(t, nnx.LoRAParam)
                                      for t in filter_types)


def _token_logps_split(graph, params, prompt_tokens, completion_tokens, pad_id, temperature):
    return token_logps(nnx.merge(graph, params), prompt_tokens, completion_tokens, pad_id,
                       temperature)
