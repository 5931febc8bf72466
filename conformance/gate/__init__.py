"""A gate run put together: its engines, the plan and its units, each engine's share run
on one warm process, results folders for shards and merges; judged and reported by the floors
below (docs/architecture.md).
"""
