"""What the parts say to each other: the protocol and the one serve loop, scenarios,
traces, pins, what names an engine, the settings. Standard library only: a pin's worker
imports these in vLLM's own environment (docs/architecture.md, "Floors").
"""
