"""TEST FIXTURE: a local vLLM repository with a known history, for commit pins and `parity bisect`
without a network (tests/bisect/test_commit_pins.py; docs/porting.md's worked example).

Built from the pins' built CPU environments, never downloaded. Every commit has a fixed author
and date, so the same environments give the same shas on every machine:

  base         vLLM 0.27.1's Python tree (vllm/, from the 0.27.1 environment; tagged v0.27.1)
  docs         a docstring of vllm/benchmarks/__init__.py: touches no scheduling file
  reservation  the drafting-slot reservation of vllm#51725 / vllm#51256, taken from 0.28.0's
               sources of the three files it lives in (RESERVATION): the changes of 0.28.0
               inside the functions named there, only those naming the budget in the scheduler
  prefill      a scheduling change of the fixture's own (PREFILL): chunked prefill gets a default
               long-prefill threshold, so a long prompt is scheduled in smaller chunks
  kernel       a file under csrc/: a compiled input, so its engine layers are `unsupported`

`python -m conformance.process.commit_fixture DIR` builds it into DIR (replacing what is there:
about 3 s) and prints the commits, one `NAME SHA` line each.
"""

from __future__ import annotations

import ast
import difflib
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

# vllm#51725 (the per-step input budget in the scheduler) and vllm#51256 (the property it charges,
# SpeculativeConfig.max_num_new_slots_for_drafting; the config no longer subtracts it). Whole
# files of 0.28.0 carry other changes that need more of 0.28.0 (its config reads ModelConfig
# fields 0.27.1 has not), so the smallest consistent set is 0.28.0's changes inside these
# functions; in the scheduler's, only those that name the per-step budget (not 0.28.0's Mamba,
# prefill-lookahead and preemption-cursor changes beside them).
RESERVATION = (
    ("vllm/config/speculative.py", "SpeculativeConfig.max_num_new_slots_for_drafting", None),
    ("vllm/config/vllm.py", "VllmConfig._set_max_num_scheduled_tokens", None),
    ("vllm/v1/core/sched/scheduler.py", "Scheduler.schedule",
     re.compile(r"input_budget|draft_slots|request_token_budget|spec = self\.vllm_config\.speculative_config")),
)
# the fixture's own scheduling change: SchedulerConfig.__post_init__ gives chunked prefill a
# long-prefill threshold of 1/8 of the model length where none was set (vLLM leaves it 0: off)
PREFILL = ("vllm/config/scheduler.py",
           "        self.encoder_cache_size = self.max_num_batched_tokens\n",
           "        self.encoder_cache_size = self.max_num_batched_tokens\n"
           "        if self.enable_chunked_prefill and not self.long_prefill_token_threshold:\n"
           "            self.long_prefill_token_threshold = max(1, int(max_model_len * 0.125))\n")
SKIPPED = ("__pycache__",)
ENV = {"GIT_AUTHOR_NAME": "vllm-parity fixture", "GIT_AUTHOR_EMAIL": "fixture@vllm-parity.invalid",
       "GIT_COMMITTER_NAME": "vllm-parity fixture", "GIT_COMMITTER_EMAIL": "fixture@vllm-parity.invalid",
       "GIT_CONFIG_GLOBAL": os.devnull, "GIT_CONFIG_SYSTEM": os.devnull, "TZ": "UTC"}
COMMITS = ("base", "docs", "reservation", "prefill", "kernel")


def package(python: Path) -> Path:
    return next(python.parent.parent.glob("lib/python*/site-packages")) / "vllm"


def _copy_tree(src: Path, dest: Path) -> None:
    from conformance.process.commit_env import BUILT, GENERATED

    for path in sorted(src.rglob("*")):
        rel = path.relative_to(src.parent).as_posix()
        if path.is_dir() or SKIPPED[0] in path.parts or rel in GENERATED or rel.endswith(BUILT):
            continue
        out = dest / rel
        out.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, out)


def _commit(repo: Path, number: int, message: str) -> str:
    env = {**os.environ, **ENV, "GIT_AUTHOR_DATE": f"2026-11-0{number + 1}T12:00:00Z",
           "GIT_COMMITTER_DATE": f"2026-11-0{number + 1}T12:00:00Z"}
    for argv in (["add", "-A"], ["commit", "-q", "--no-gpg-sign", "-m", message]):
        subprocess.run(["git", "-C", str(repo), *argv], check=True, env=env, stdin=subprocess.DEVNULL)
    return subprocess.run(["git", "-C", str(repo), "rev-parse", "HEAD"], check=True, capture_output=True,
                          text=True, encoding="utf-8").stdout.strip()


def _edit(path: Path, old: str, new: str) -> None:
    text = path.read_text(encoding="utf-8")
    if text.count(old) != 1:
        raise RuntimeError(f"fixture: {path} holds {old!r} {text.count(old)} times, not once")
    path.write_text(text.replace(old, new), encoding="utf-8")


def build(repo: Path, base_python: Path, next_python: Path) -> dict[str, str]:
    """Build the fixture repository in `repo` from the 0.27.1 (`base_python`) and 0.28.0
    (`next_python`) environments; returns each commit's sha by name (COMMITS)."""
    shutil.rmtree(repo, ignore_errors=True)
    repo.mkdir(parents=True)
    subprocess.run(["git", "init", "-q", "-b", "main", str(repo)], check=True, env={**os.environ, **ENV})
    shas = {}
    _copy_tree(package(base_python), repo)
    shas["base"] = _commit(repo, 0, "vLLM 0.27.1's Python tree\n\nvllm/ as the built 0.27.1 CPU environment holds it "
                                    "(its compiled *.so and generated _version.py left out).")
    subprocess.run(["git", "-C", str(repo), "tag", "v0.27.1"], check=True, env={**os.environ, **ENV})
    bench = repo / "vllm/benchmarks/__init__.py"
    bench.write_text('"""vLLM\'s benchmarks (fixture: a change that touches no scheduling file)."""\n'
                     + bench.read_text(encoding="utf-8"), encoding="utf-8")
    shas["docs"] = _commit(repo, 1, "[Doc] Say what the benchmarks package holds (#90001)")
    for name, function, only in RESERVATION:
        taken = take_changes((repo / name).read_text(encoding="utf-8"),
                             (package(next_python).parent / name).read_text(encoding="utf-8"), function, only)
        (repo / name).write_text(taken, encoding="utf-8")
    shas["reservation"] = _commit(
        repo, 2, "[Spec Decode] Reserve drafting slots per step against an input budget (#51725)\n\n"
                 "Fixture: vllm#51725 (the scheduler's per-step input_budget) with vllm#51256 (the property it "
                 "charges, SpeculativeConfig.max_num_new_slots_for_drafting; VllmConfig no longer subtracts it "
                 "from max_num_scheduled_tokens), taken from vLLM 0.28.0's sources: "
                 + "; ".join(f"{f} ({name}{': the changes naming the per-step budget' if only else ''})"
                             for name, f, only in RESERVATION)
                 + ". Whole files of 0.28.0 need more of 0.28.0 than these changes do.")
    _edit(repo / PREFILL[0], *PREFILL[1:])
    shas["prefill"] = _commit(repo, 3, "[Scheduler] Chunk long prefills at 1/8 of the model length by default (#90002)\n\n"
                                       "Fixture: a scheduling change of the fixture's own, in vllm/config/scheduler.py "
                                       "(SchedulerConfig.__post_init__).")
    kernel = repo / "csrc/cpu/fixture_kernel.cpp"
    kernel.parent.mkdir(parents=True)
    kernel.write_text("// fixture: a compiled input changed since v0.27.1\nint fixture_kernel() { return 0; }\n",
                      encoding="utf-8")
    shas["kernel"] = _commit(repo, 4, "[Kernel] Add a CPU kernel (#90003)")
    return shas


def take_changes(old: str, new: str, function: str, only=None) -> str:
    """`old` with `new`'s line changes that fall inside `function` (Class.method, found in
    `new`) applied; with `only` (a regex), just the changes whose lines it matches."""
    start, end = _span(new, function)
    a, b = old.splitlines(keepends=True), new.splitlines(keepends=True)
    out, taken = [], 0
    for tag, i1, i2, j1, j2 in difflib.SequenceMatcher(None, a, b, autojunk=False).get_opcodes():
        inside = tag != "equal" and start <= j1 + 1 and j2 <= end and (j1 < j2 or start <= j1 <= end)
        if inside and (only is None or any(only.search(line) for line in a[i1:i2] + b[j1:j2])):
            out += b[j1:j2]
            taken += 1
        else:
            out += a[i1:i2]
    if not taken:
        raise RuntimeError(f"fixture: no change of {function} to take")
    return "".join(out)


def _span(source: str, function: str) -> tuple[int, int]:
    """The 1-based line range of Class.method in `source`, decorators included."""
    owner, name = function.split(".")
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ClassDef) and node.name == owner:
            for item in node.body:
                if isinstance(item, ast.FunctionDef) and item.name == name:
                    first = min([item.lineno] + [d.lineno for d in item.decorator_list])
                    return first, item.end_lineno
    raise RuntimeError(f"fixture: no {function} in the source")


def main(argv: list[str]) -> int:
    from conformance.formats.pins import load_pins
    from conformance.process.envs import ensure_env

    if len(argv) != 1:
        print("usage: python -m conformance.process.commit_fixture DIR", file=sys.stderr)
        return 2
    pins = load_pins()
    shas = build(Path(argv[0]).resolve(), ensure_env("0.27.1", pins=pins), ensure_env("0.28.0", pins=pins))
    for name in COMMITS:
        print(name, shas[name])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
