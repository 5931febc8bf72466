"""The pin's worker (worker.py) under coverage.py, telling which branches each run reached.

`parity fuzz --guide coverage` starts the oracle this way (conformance/process/coverage_run.py
guided_worker): coverage.py measures the files given by --include (the scheduling code of
adequacy_scope.toml) with branch coverage, in this process, and after every run, before the
worker sends the run's last message (`done`, or an `error` naming the run), the branch arcs
reached for the first time in this process are appended to --arcs as one JSON line, with the
number of distinct branch arcs the run reached (each run is a dynamic context of coverage.py):

    {"id": RUN_ID, "reached": N,
     "branches": {"vllm/v1/core/sched/scheduler.py": [[from, to], ...], ...}}

A branch arc is coverage.py's: an arc out of a line with more than one possible exit, by its
static analysis of the file (the measure `parity adequacy` counts). The worker itself serves
the protocol as always; nothing of this goes on the wire.

Runs inside the pin's environment, with coverage.py on PYTHONPATH (coverage_run.ensure_coverage).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


class BranchLog:
    """The measured files' branch arcs reached so far, and the file the new ones go to."""

    def __init__(self, cov, path: Path):
        self.cov, self.path = cov, path
        self.seen: dict[str, set] = {}
        self.parsers: dict[str, tuple] = {}  # file -> (parser, its branch arcs)
        self.runs = 0
        cov.switch_context("run 0")  # what runs until the first run ends, then one per run

    def _branches(self, filename: str):
        if filename not in self.parsers:
            from coverage.parser import PythonParser

            parser = PythonParser(filename=filename)
            parser.parse_source()
            exits = parser.exit_counts()
            self.parsers[filename] = (parser, {a for a in parser.arcs() if exits.get(a[0], 0) > 1})
        return self.parsers[filename]

    def dump(self, run_id) -> None:
        context = f"run {self.runs}"
        self.runs += 1
        self.cov.switch_context(f"run {self.runs}")  # flushes this run's data under its context
        data = self.cov.get_data()
        data.set_query_contexts([f"^{context}$"])
        new, count = {}, 0
        try:
            for filename in data.measured_files():
                parser, branches = self._branches(filename)
                reached = parser.translate_arcs(data.arcs(filename) or ()) & branches
                count += len(reached)
                seen = self.seen.setdefault(filename, set())
                fresh = reached - seen
                if fresh:
                    seen |= fresh
                    new["vllm/" + filename.replace(os.sep, "/").split("/vllm/", 1)[-1]] = sorted(fresh)
        finally:
            data.set_query_contexts(None)
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(json.dumps({"id": run_id, "reached": count, "branches": new}) + "\n")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--arcs", type=Path, required=True, help="the file new branch arcs are appended to")
    parser.add_argument("--include", required=True, help="comma-separated file patterns to measure")
    args, worker_argv = parser.parse_known_args()

    import coverage

    cov = coverage.Coverage(branch=True, include=args.include.split(","), data_file=None)
    cov.start()
    from conformance.formats import protocol
    from engines.vllm import worker

    log = BranchLog(cov, args.arcs)
    encode = protocol.encode

    def encode_after_measuring(message: dict) -> bytes:
        # a run's last message: what it reached is written before the harness reads the answer
        if message.get("type") in ("done", "error") and message.get("id") is not None:
            log.dump(message["id"])
        return encode(message)

    protocol.encode = encode_after_measuring
    status = worker.main(worker_argv)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)  # nothing to save: every run's branches are already written


if __name__ == "__main__":
    main()
