"""The gate: engines, units of work, traces judged against goldens, verdicts by engine-matrix
row with waivers, and the reports rendered from them (docs/architecture.md)."""
