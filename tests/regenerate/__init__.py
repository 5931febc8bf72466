"""Tests of conformance/regenerate/."""
