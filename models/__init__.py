"""The decoder model family, its loaders and the built-in model pair."""

from .builtin import builtin, heldout_prompts
from .checkpoint import restore, save
from .eagle3 import Eagle3Config, Eagle3Head, init_eagle3, load_eagle3, save_eagle3
from .config import ModelConfig, SUPPORTED_MODEL_TYPES
from .hf import load_hf, load_tokenizer, save_hf
from .synthetic import synthetic
from .transformer import KVCache, Transformer, forward, init_kv_cache, init_model, num_params

__all__ = ["ModelConfig", "SUPPORTED_MODEL_TYPES", "KVCache", "Transformer", "forward",
           "init_kv_cache", "init_model", "num_params", "load_hf", "load_tokenizer", "save_hf",
           "save", "restore", "builtin", "heldout_prompts", "Eagle3Config", "Eagle3Head",
           "init_eagle3", "load_eagle3", "save_eagle3", "synthetic"]
