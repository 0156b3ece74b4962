"""kvctl: configure, start, check and hard-reset vLLM servers that offload KV cache to Mooncake.

Importing kvctl is cheap: no vllm, torch, mooncake, typer or rich.
"""

__version__ = "0.1.0"
