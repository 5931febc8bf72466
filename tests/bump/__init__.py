"""Tests of conformance/bump/."""
