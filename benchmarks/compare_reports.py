"""Reports before and after a change that must not change them (a move of modules, say): each
case's reports, stdout and exit status captured from one checkout into a folder, and two such
folders compared.

    .venv/bin/python benchmarks/compare_reports.py capture OUT [--repo DIR] [--quick]
    .venv/bin/python benchmarks/compare_reports.py compare BEFORE AFTER

`capture` runs DIR's own `.venv/bin/parity` (default: this checkout) with DIR as the working
folder, so each checkout is measured with its own code; the C++ reference engine is built
there first (`make cpp`) when it is missing. The cases, one gate run each (the oracle's warm
worker shared by the run's scenarios):

    default   `parity gate`: the oracle, the other pins standing in
    mutant    a pin's TEST DEVICE mutant as the candidate (ORACLE+mutant:no-draft-reservation)
    cpp       the C++ reference engine, on the layers it serves (config, steps, outputs)
    layered   a TEST DOUBLE replaying the oracle's goldens, serving config, steps and outputs
    shards    the default engines on SHARD_SCENARIOS in 2 shards (--results), then `parity
              merge` of both, without and with --drift

Each case's folder holds `status` (the exit status), `stdout.txt`, the reports (`reports/`)
and, for the shards, each shard's results folder and stdout. stderr (progress, timings,
engine logs) is kept as `stderr.txt` and never compared. --quick runs every case on
QUICK_SCENARIOS only (for iterating; a real check runs them all).

`compare` masks only what differs between two captures of unchanged code: timestamps, pids
(a reports or results folder's lock file holds the pid that claimed it), the checkout's and the capture's
own paths, a results folder's `created` time and the digest of the harness's sources
(`tool.sources`, which any change of the code changes); then lists every file that differs,
with the first lines where it does. Exit 0 when none does, 1 otherwise.
"""

from __future__ import annotations

import argparse
import difflib
import json
import os
import re
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parents[1]
CPP = "engines/cpp/build/reference_engine"
DOUBLE = "tests/doubles/double_engine.py"
SHARD_SCENARIOS = ("steady_decode", "dflash_27b_gate", "method_matrix", "kv_pressure", "engine_ngram")
QUICK_SCENARIOS = ("steady_decode", "dflash_27b_gate", "engine_dflash_gate", "engine_draft_model_self")
MASKS = [  # (pattern, replacement): only what two captures of unchanged code differ in
    (re.compile(r"\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}:\d{2}(?:\.\d+)?(?:Z|[+-]\d{2}:?\d{2})?"), "<time>"),
    (re.compile(r"\b\d{2}-\d{2} \d{2}:\d{2}:\d{2}(?:\.\d+)?"), "<time>"),  # vLLM's log lines
    (re.compile(r"\b(pid[ =:]\s*)\d+"), r"\1<pid>"),
    (re.compile(r"\b(pids? )\d+(?:, \d+)*"), r"\1<pid>"),
    (re.compile(r"(\(EngineCore[^ )]* pid=)\d+"), r"\1<pid>"),
]
JSON_MASKS = {"created": "<time>", "sources": "<sources digest>"}  # keys masked in a results folder's JSON
# a folder's claim file (formats/files.py, `.parity-<purpose>.lock`: reports, results): it holds
# the pid that claimed the folder and nothing else
PID_FILE = re.compile(r"\.parity-[a-z]+\.lock")


def run(argv: list[str], repo: Path, folder: Path, name: str = "") -> int:
    """Run one command of a case; its stdout, stderr and status into `folder`."""
    folder.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(argv, cwd=repo, capture_output=True, stdin=subprocess.DEVNULL)
    prefix = f"{name}." if name else ""
    (folder / f"{prefix}stdout.txt").write_bytes(done.stdout)
    (folder / f"{prefix}stderr.txt").write_bytes(done.stderr)
    (folder / f"{prefix}status").write_text(f"{done.returncode}\n", encoding="utf-8")
    print(f"  {' '.join(argv[1:3])} ... -> {done.returncode}", file=sys.stderr)
    return done.returncode


def oracle_of(repo: Path) -> str:
    text = (repo / "pyproject.toml").read_text(encoding="utf-8")
    return re.search(r'^oracle = "([^"]+)"', text, re.M)[1]


def capture(out: Path, repo: Path, quick: bool) -> None:
    parity = str(repo / ".venv" / "bin" / "parity")
    if not (repo / CPP).exists():
        subprocess.run(["make", "cpp"], cwd=repo, check=True)
    oracle = oracle_of(repo)

    def scenarios(names) -> list[str]:
        return [a for n in names for a in ("--scenario", f"scenarios/{n}.json")]

    every = scenarios(QUICK_SCENARIOS) if quick else []
    cases = {
        "default": [],
        "mutant": ["--candidate", f"{oracle}+mutant:no-draft-reservation"],
        "cpp": ["--candidate", CPP, "--layers", "config,steps,outputs"],
        "layered": ["--candidate", f"port=python3 {DOUBLE} --replay {oracle} --serve config,steps,outputs"],
    }
    for case, options in cases.items():
        print(f"{case}:", file=sys.stderr)
        run([parity, "gate", *options, *every, "--reports", str(out / case / "reports")], repo, out / case)
    print("shards:", file=sys.stderr)
    folder = out / "shards"
    chosen = scenarios(QUICK_SCENARIOS if quick else SHARD_SCENARIOS)
    for i in (1, 2):
        run([parity, "gate", *chosen, "--shard", f"{i}/2", "--results", str(folder / f"results-{i}")],
            repo, folder, f"shard-{i}")
    shards = [str(folder / f"results-{i}") for i in (1, 2)]
    run([parity, "merge", *shards, "--reports", str(folder / "reports")], repo, folder, "merge")
    run([parity, "merge", *shards, "--drift", "--reports", str(folder / "reports-drift")], repo, folder,
        "merge-drift")
    (out / "captured-from").write_text(f"{repo}\n{out}\n", encoding="utf-8")


def masked(path: Path, root: str, out: str) -> str:
    text = path.read_text(encoding="utf-8", errors="replace")
    if PID_FILE.fullmatch(path.name):
        return re.sub(r"\d+", "<pid>", text)
    if path.suffix == ".json":
        try:
            text = json.dumps(_mask_json(json.loads(text)), indent=1, sort_keys=True)
        except ValueError:
            pass
    text = text.replace(out, "<capture>").replace(root, "<repo>")
    for pattern, replacement in MASKS:
        text = pattern.sub(replacement, text)
    return text


def _mask_json(value):
    if isinstance(value, dict):
        return {k: JSON_MASKS[k] if k in JSON_MASKS else _mask_json(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_mask_json(v) for v in value]
    return value


def compare(before: Path, after: Path) -> int:
    roots = [(f / "captured-from").read_text(encoding="utf-8").split("\n")[:2] for f in (before, after)]
    names = {p.relative_to(f) for f in (before, after) for p in f.rglob("*")
             if p.is_file() and p.name != "captured-from" and not p.name.endswith("stderr.txt")}
    differ = 0
    for name in sorted(names):
        a, b = before / name, after / name
        if not a.exists() or not b.exists():
            print(f"{name}: only in {'AFTER' if not a.exists() else 'BEFORE'}")
            differ += 1
            continue
        left, right = masked(a, *roots[0]), masked(b, *roots[1])
        if left != right:
            differ += 1
            lines = list(difflib.unified_diff(left.splitlines(), right.splitlines(), "before", "after", n=1,
                                              lineterm=""))
            print(f"{name}: differs\n" + "\n".join(lines[:30]))
    compared = len(names)
    print(f"{compared} files compared (stderr left out), {differ} differ")
    return 1 if differ else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("capture", help="run every case with a checkout's parity; write OUT")
    p.add_argument("out", type=Path)
    p.add_argument("--repo", type=Path, default=HERE, help="the checkout whose .venv/bin/parity runs")
    p.add_argument("--quick", action="store_true", help=f"every case on {', '.join(QUICK_SCENARIOS)} only")
    p = sub.add_parser("compare", help="compare two captures")
    p.add_argument("before", type=Path)
    p.add_argument("after", type=Path)
    args = parser.parse_args(argv)
    if args.command == "capture":
        if args.out.exists() and any(args.out.iterdir()):
            parser.error(f"{args.out} is not empty: capture into a new folder")
        capture(args.out.resolve(), args.repo.resolve(), args.quick)
        return 0
    return compare(args.before, args.after)


if __name__ == "__main__":
    os.environ.setdefault("PYTHONHASHSEED", "0")  # every capture's runs iterate sets in one order
    sys.exit(main())
