"""bonsai: build, pull and launch llama.cpp servers for Bonsai and other GGUF models."""

__version__ = "0.1.0"
