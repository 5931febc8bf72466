"""Tests of conformance/formats/."""
