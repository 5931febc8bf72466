"""Tests of conformance/process/."""
