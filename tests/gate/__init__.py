"""Tests of conformance/gate/."""
