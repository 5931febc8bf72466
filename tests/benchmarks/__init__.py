"""Tests of the scripts in benchmarks/ that other checks rely on."""
