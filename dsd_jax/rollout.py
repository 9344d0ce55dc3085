"""Padded arrays for RL trainers (Tunix / vLLM conventions).

`generate` returns unpadded completions with same-length logprobs; trainers usually
want a left-padded prompt block and a right-padded completion block with masks, so
that prompt + completion is contiguous per row. Masks, not the pad id, say which
entries are real: a pad id that is also a real token stays unambiguous.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np


def to_padded_arrays(outputs: Sequence, pad_id: int, prompt_len: int | None = None,
                     completion_len: int | None = None) -> dict[str, np.ndarray]:
    """outputs: `RequestOutput`s. Returns int32 `prompt_tokens` [N, P] (left-padded),
    `prompt_mask`, `completion_tokens` [N, C] (right-padded), `completion_mask`, and
    float32 `completion_logprobs` [N, C] (0 at padding) when the outputs carry logprobs.
    A prompt or completion longer than the requested width is an error, never cut."""
    if not outputs:
        raise ValueError("no outputs to pad")
    longest_prompt = max(len(o.prompt_token_ids) for o in outputs)
    longest_completion = max(len(o.token_ids) for o in outputs)
    P = longest_prompt if prompt_len is None else prompt_len
    C = longest_completion if completion_len is None else completion_len
    if P < longest_prompt or C < longest_completion:
        raise ValueError(f"widths ({P}, {C}) are shorter than the longest prompt/completion "
                         f"({longest_prompt}, {longest_completion})")
    n = len(outputs)
    arrays = {
        "prompt_tokens": np.full((n, P), pad_id, np.int32),
        "prompt_mask": np.zeros((n, P), bool),
        "completion_tokens": np.full((n, C), pad_id, np.int32),
        "completion_mask": np.zeros((n, C), bool),
    }
    carry = [o.logprobs is not None for o in outputs]
    if any(carry) and not all(carry):  # mixed calls: dropping the key would fail later, far away
        raise ValueError(f"outputs {[i for i, c in enumerate(carry) if not c][:5]} carry no logprobs "
                         "while others do: generate them all with return_logprobs=True")
    with_logprobs = all(carry)
    if with_logprobs:
        arrays["completion_logprobs"] = np.zeros((n, C), np.float32)
    for i, o in enumerate(outputs):
        p, c = len(o.prompt_token_ids), len(o.token_ids)
        arrays["prompt_tokens"][i, P - p:] = o.prompt_token_ids
        arrays["prompt_mask"][i, P - p:] = True
        arrays["completion_tokens"][i, :c] = o.token_ids
        arrays["completion_mask"][i, :c] = True
        if with_logprobs:
            arrays["completion_logprobs"][i, :c] = o.logprobs
    return arrays
