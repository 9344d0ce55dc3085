"""What callers hand the engine, checked and normalised before anything runs.

Prompts, token ids, references, SamplingParams lists and the engine's sizes arrive from
notebooks, RL loops and scripts in many shapes (lists, numpy or JAX arrays, numpy
integers). Each function here accepts the sensible ones and refuses the rest with an
error naming the argument, so that a bad value fails at the call, not deep inside JAX
after other requests' work (and never by silent casting: int() would run [1.7, 2.9] as
[1, 2]).
"""

from __future__ import annotations

import collections.abc

import numpy as np

from dsd_jax.sampling import SamplingParams, is_integer


def token_id_list(ids, what: str) -> list[int]:
    """Token ids from a list/tuple of integers or a 1-D integer array (numpy or JAX). A float,
    string, bool or None is refused, not cast: int() would run [1.7, 2.9] as [1, 2]."""
    if hasattr(ids, "dtype") and hasattr(ids, "shape"):  # an array: its dtype says it all
        arr = np.asarray(ids)
        if arr.ndim != 1 or arr.dtype.kind not in "iu":
            raise ValueError(f"{what} must be a 1-D integer array of token ids, got a "
                             f"{arr.ndim}-D {arr.dtype} array")
        return arr.tolist()
    if isinstance(ids, (str, bytes)) or not isinstance(ids, collections.abc.Iterable):
        raise ValueError(f"{what} must be a sequence of token ids, got {ids!r}")
    ids = list(ids)
    if all(type(t) is int for t in ids):  # the common case, 10x cheaper than the checks below
        return ids
    for j, t in enumerate(ids):
        if not is_integer(t):
            raise ValueError(f"{what} has a non-integer token id {t!r} ({type(t).__name__}) "
                             f"at position {j}")
    return [int(t) for t in ids]


def encode_text(tokenizer, text: str) -> list[int]:
    """Token ids of `text` (a `tokenizers.Tokenizer` or a transformers tokenizer), with the
    special tokens the tokenizer adds to any text (a BOS) unless the text already begins with
    them: a chat-templated prompt ("<|begin_of_text|><|start_header_id|>...") would otherwise
    carry two, which Llama-3 was never trained on."""
    ids = lambda enc: list(enc.ids if hasattr(enc, "ids") else enc)  # noqa: E731
    full = ids(tokenizer.encode(text))
    added = ids(tokenizer.encode(""))  # what the tokenizer puts around any text
    if added:
        try:
            plain = ids(tokenizer.encode(text, add_special_tokens=False))
        except TypeError:  # a tokenizer of another kind, without the switch: as it encodes
            return full
        if plain[:len(added)] == added:
            return plain
    return full


# end-of-text tokens, by name, of the tokenizers we know (GPT-2/Qwen base, Llama-3 base and
# Instruct, Qwen chat, Llama-2/Mistral)
EOS_CANDIDATES = ("<|endoftext|>", "<|end_of_text|>", "<|eot_id|>", "<|im_end|>", "</s>")


def tokenizer_eos_ids(tokenizer) -> list[int]:
    """The end-of-text ids a tokenizer knows: a transformers tokenizer's `eos_token_id`, then
    the ids of the `EOS_CANDIDATES` it has (`token_to_id` of a `tokenizers.Tokenizer`,
    `convert_tokens_to_ids` of a transformers one, which maps an unknown name to its unk id).
    None: no ids."""
    out: list[int] = []

    def add(tid):
        if is_integer(tid) and not isinstance(tid, bool) and int(tid) >= 0 and int(tid) not in out:
            out.append(int(tid))

    if tokenizer is None:
        return out
    own = getattr(tokenizer, "eos_token_id", None)
    for tid in own if isinstance(own, (list, tuple)) else (own,):
        add(tid)
    unk = getattr(tokenizer, "unk_token_id", None)
    for name in EOS_CANDIDATES:
        for lookup in ("token_to_id", "convert_tokens_to_ids"):
            if not callable(getattr(tokenizer, lookup, None)):
                continue
            try:
                tid = getattr(tokenizer, lookup)(name)
            except Exception:  # noqa: BLE001  (a tokenizer of another kind: no id by that name)
                tid = None
            if tid is not None and tid != unk:
                add(tid)
            break
    return out


def check_text(text: str, what: str) -> None:
    """A ValueError naming `what` for a string that is not UTF-8 text: a lone surrogate (a
    JSON "\\ud800", or a byte of stdin that is not UTF-8) is no text a tokenizer takes (it
    raises a TypeError)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise ValueError(f"{what}: not valid UTF-8 text (a lone surrogate {text[e.start]!r} at "
                         f"character {e.start})") from None


def prompt_list(prompts) -> list:
    """The prompts of a call as a list (a 2-D integer array is one prompt a row). One prompt
    (a string or a flat list of ids) is refused: it needs wrapping in a list."""
    if isinstance(prompts, (str, bytes)) or not isinstance(prompts, collections.abc.Iterable):
        raise ValueError(f"prompts must be a list of prompts (token-id lists or strings), got "
                         f"{type(prompts).__name__}")
    prompts = list(prompts)
    if prompts and is_integer(prompts[0]):
        raise ValueError("prompts must be a list of prompts (token-id lists or strings), got one "
                         "flat list of token ids: wrap a single prompt in a list")
    return prompts


def sampling_list(sampling, n: int) -> list[SamplingParams]:
    """One SamplingParams per prompt: one given for all, or a list of n."""
    if sampling is None:
        sampling = SamplingParams()
    if isinstance(sampling, SamplingParams):
        return [sampling] * n
    if not isinstance(sampling, (list, tuple)):
        raise ValueError(f"sampling must be a SamplingParams or a list of them (one per prompt), "
                         f"got {type(sampling).__name__}")
    if len(sampling) != n:
        raise ValueError(f"got {len(sampling)} SamplingParams for {n} prompts")
    for i, sp in enumerate(sampling):
        if not isinstance(sp, SamplingParams):
            raise ValueError(f"sampling[{i}] (for prompt {i}) must be a SamplingParams, got "
                             f"{type(sp).__name__}")
    return list(sampling)


def check_batch_buckets(buckets, per_shard: int) -> tuple[int, ...]:
    """batch_buckets as ints, refused unless they are strictly increasing integers in
    1..per_shard ending at per_shard: a bucket is a program over the first B slots of a
    data shard, so a larger one cannot be traced and a smaller last one serves no full
    shard (both used to fail deep inside JAX, after the prompts were prefilled)."""
    try:
        buckets = list(buckets)
    except TypeError:
        raise ValueError(f"batch_buckets must be a sequence of batch sizes, got {buckets!r}") \
            from None
    bad = [b for b in buckets if not is_integer(b) or not 1 <= b <= per_shard]
    if bad or not buckets:
        got = f"got {bad[0]!r}" if bad else "none given"
        raise ValueError(f"batch_buckets {tuple(buckets)} must be integers in 1..{per_shard} (the "
                         f"slots of one data shard: max_batch_size / the 'data' axis); {got}")
    buckets = [int(b) for b in buckets]
    if buckets != sorted(set(buckets)) or buckets[-1] != per_shard:
        raise ValueError(f"batch_buckets {tuple(buckets)} must be strictly increasing and end at "
                         f"{per_shard} (the slots of one data shard)")
    return tuple(buckets)


def check_size(name: str, value, low: int, high: int | None = None) -> int:
    """An engine size argument as an int in [low, high] (a float such as 16.5 is refused,
    not truncated; a value past `high` is refused, not wrapped)."""
    if not is_integer(value) or value < low or (high is not None and value > high):
        bound = f">= {low}" if high is None else f"in [{low}, {high}]"
        raise ValueError(f"{name} must be an integer {bound}, got {value!r}")
    return int(value)


def reference_lists(references, n: int) -> list[list]:
    """references[i]: the continuations (token-id lists, strings or `RequestOutput`s) prompt
    i's lookup drafter may copy from, for each of the n prompts. One continuation given bare (a flat id list, or
    a string, whose characters would each become a one-token reference) is refused."""
    if references is None:
        return [[] for _ in range(n)]
    if isinstance(references, (str, bytes)) or not isinstance(references, collections.abc.Sequence):
        raise ValueError(f"references must be a list with one list of continuations per prompt, "
                         f"got {type(references).__name__}")
    if len(references) != n:
        raise ValueError(f"got references for {len(references)} prompts, expected {n}")
    out = []
    for i, given in enumerate(references):
        if not isinstance(given, (list, tuple)):
            raise ValueError(f"references[{i}] must be a list of continuations (token-id lists, "
                             f"strings or RequestOutputs) for prompt {i}, got {type(given).__name__}")
        if given and is_integer(given[0]):
            raise ValueError(f"references[{i}] is one flat list of token ids; give a list of "
                             f"continuations (wrap it in a list)")
        out.append(list(given))
    return out


def params_like(given, old, role: str, config=None):
    """`given` (a model, its `nnx.state`, or that state as a pure dict) as a tree like
    `old`, the engine's `role` params: the same leaf names, shapes and dtypes, else a
    ValueError naming the first difference. A model must also have the engine's `config`
    (dtype aside): the engine keeps running its own graph, so another rope_theta or norm
    epsilon with equal shapes would silently compute another function. The leaves are
    `given`'s, not yet placed."""
    import dataclasses

    import jax
    from flax import nnx

    from dsd_jax.param_mapping import flatten
    if isinstance(given, nnx.Module):
        theirs = getattr(given, "config", None)
        if config is not None and theirs is not None:
            if type(theirs) is not type(config):
                raise ValueError(f"new {role} model has a {type(theirs).__name__}; the engine's "
                                 f"{role} has a {type(config).__name__}")
            differ = [f"{f.name} {getattr(theirs, f.name)!r} (engine: {getattr(config, f.name)!r})"
                      for f in dataclasses.fields(config)
                      if f.name != "dtype" and getattr(theirs, f.name) != getattr(config, f.name)]
            if differ:
                raise ValueError(f"new {role} model's config differs from the engine's: "
                                 f"{'; '.join(differ)}; build a new SpecEngine for another architecture")
        given = nnx.state(given)  # every variable, as the engine split it
    theirs, _ = flatten(given)
    ours, treedef = flatten(old)
    missing = [n for n in ours if n not in theirs]
    extra = [n for n in theirs if n not in ours]
    if missing or extra:
        parts = [f"{what} {names[:3]}{' ...' if len(names) > 3 else ''}"
                 for what, names in (("missing", missing), ("unexpected", extra)) if names]
        raise ValueError(f"new {role} params do not have the engine's leaves: {'; '.join(parts)} "
                         "(give the model, its nnx.state, or nnx.to_pure_dict of that state)")
    for name, ref in ours.items():
        x = theirs[name]
        if not (hasattr(x, "shape") and hasattr(x, "dtype")):
            raise ValueError(f"new {role} param {name!r} is a {type(x).__name__}, not an array")
        if tuple(x.shape) != tuple(ref.shape) or np.dtype(x.dtype) != np.dtype(ref.dtype):
            raise ValueError(f"new {role} param {name!r} is {np.dtype(x.dtype).name}"
                             f"{list(x.shape)}; the engine's is {np.dtype(ref.dtype).name}"
                             f"{list(ref.shape)}")
    return jax.tree_util.tree_unflatten(treedef, [theirs[n] for n in ours])
