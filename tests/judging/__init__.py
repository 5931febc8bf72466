"""Tests of conformance/judging/."""
