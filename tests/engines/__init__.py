"""Tests of the engines: the vLLM worker and its stand-in (engines/vllm/), the C++ kit (engines/cpp/), the protocol (engines/PROTOCOL.md)."""
