"""Tests of conformance/report/."""
