"""Tests of conformance/adequacy/."""
