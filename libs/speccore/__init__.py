"""speccore: a lossless speculative-decoding engine for Hugging Face causal LMs."""

from speccore.errors import SpecError

__version__ = "0.1.0"

__all__ = ["SpecError", "__version__"]
