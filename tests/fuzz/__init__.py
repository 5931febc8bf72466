"""Tests of conformance/fuzz/."""
