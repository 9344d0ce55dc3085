"""Adapters that plug the engine into other frameworks (each imports its framework lazily)."""
