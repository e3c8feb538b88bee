"""Thin command modules over the bonsai_launch library, one per command.

Each module imports only typer at the top; heavy libraries (gguf/numpy, httpx,
huggingface_hub, psutil) are imported inside the command so `bonsai --help` stays fast.
"""
