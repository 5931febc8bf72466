"""`parity bump X`: the gate oracle moved to release X in one reviewable step (the edits of
[tool.vllm-parity], the checks of X's CPU rebuild and dependencies, its GPU lock, its
environment, its goldens and the pull request's text)."""
