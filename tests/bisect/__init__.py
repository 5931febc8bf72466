"""Tests of conformance/bisect/."""
