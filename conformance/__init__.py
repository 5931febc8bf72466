"""vllm-parity: does a ported engine schedule exactly what the pinned vLLM oracle does?

Data flows one way: scenario -> engine -> trace -> compare -> verdict -> report.
"""

__version__ = "0.1.0"
