"""The harness's self-tests, laid out like the code: tests/PACKAGE/ tests conformance/PACKAGE/."""
