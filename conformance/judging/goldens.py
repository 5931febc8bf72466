"""Golden files, owned by one GoldenStore: where they live, how they are read (an unreadable
one is an invalid golden), which are orphans, when regeneration keeps one, and how one is
written (atomically, by a pinned oracle only). Nothing outside this module opens them.

goldens/<scenario name>/vllm-<release>.json holds the trace of pinned release <release> on
that scenario. Only a pinned vLLM release may write one; a candidate never does.

The one golden lifecycle is `GoldenStore.regenerate`: an oracle's trace (of ORACLE_RUNS runs)
becomes its golden, or says why there is none (the pin does not serve the scenario here, the
run failed), whoever asks (`parity goldens`, which `make goldens` calls, from the oracle's runs
or a gate's results folder; the goldens suite, parity/test_goldens.py). A golden a CPU can
write is never written with a GPU's provenance (`GoldenStore.written_here`).

Whether a regenerated trace still holds its golden (`check_golden`, the one rule, by which
`GoldenStore.update` decides):
  - on the machine that wrote it (same build, CPU model, ISA level and CPU flags): byte for byte;
  - on another machine or ISA level: every integer fact exactly (config, steps, engine_steps,
    token ids, finish reasons) and the engine layers' logprobs within the scenario's calibrated
    tolerance (conformance/judging/numerics.py); a golden that holds is not rewritten, so goldens do
    not churn from machine to machine;
  - on another build (the CUDA wheel against a CPU rebuild's golden): by the numerics rules,
    where a near-tie resolved the other way is reported, not failed.
Regeneration keeps a golden that holds (`keeps`), unless its provenance does not yet name the
CPU that wrote it.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

from conformance.formats.kinds import Kind
from conformance.formats.errors import ParityError
from conformance.formats import precision
from conformance.formats.digest import check_form
from conformance.formats.files import InputFileError, read_bytes, read_text, write_text_atomic
from conformance.formats.gpu import golden_written_here
from conformance.formats.pins import REPO_ROOT, Pins, load_pins, pin_label
from conformance.formats.record_schema import (Field, Flag, Int, ListOf, Nullable, Number, Record,
                                               RecordError, Text, check_layers)
from conformance.formats.trace import SCHEMA, TraceError, checked, dumps, load_trace, loads_trace

GOLDEN_DIR = REPO_ROOT / "goldens"
# An oracle runs each unit this many times in its warm engine (the gate's oracle, `parity
# goldens`): records that differ make a `nondeterministic` failure, never a golden.
ORACLE_RUNS = 2
# What regeneration does to a golden (GoldenUpdate.action)
KEEP, NEW, REWRITE = "keep", "new", "rewrite"


class GoldenRefused(ParityError, PermissionError):
    """Someone asked a candidate engine, or a failed run, to write a golden."""


@dataclass(frozen=True)
class Golden:
    """A golden looked up: its trace, or why there is none to judge against (`kind`:
    missing_golden or invalid_golden, and a message naming the file)."""

    path: Path
    trace: dict | None = None
    kind: str = ""
    message: str = ""

    def only(self, layers) -> dict | None:
        """The golden restricted to `layers` (all of it with None)."""
        if self.trace is None or layers is None:
            return self.trace
        return dict(self.trace, layers={k: v for k, v in self.trace["layers"].items() if k in layers},
                    digests={k: v for k, v in self.trace.get("digests", {}).items() if k in layers})


@dataclass(frozen=True)
class GoldenCheck:
    """Whether a regenerated trace holds its golden, by which rule, and the verdict behind it."""

    holds: bool
    rule: str  # "bytes" (the writer's machine), "tolerance" (another machine), "numerics" (another build)
    verdict: object = None  # the gate.verdict.Verdict of a judged check
    reason: str = ""


@dataclass(frozen=True)
class GoldenUpdate:
    """What regenerating one golden does: KEEP it (it holds), write it NEW, or REWRITE it (it
    does not hold, or is unreadable); `summary` says what changes, `reason` why it is rewritten."""

    path: Path
    action: str
    text: str  # the regenerated golden's text (trace.dumps)
    check: GoldenCheck | None = None  # how the old golden was judged (None: new or unreadable)
    summary: str = ""
    reason: str = ""
    release: str = ""  # the pin whose golden it is

    @property
    def changes(self) -> bool:
        return self.action != KEEP

    def explain(self) -> str:
        """Why the golden does not hold, in goldens-check's words: per layer, what the golden
        (its path from the repository root) says and what the oracle run now gives."""
        shown = shown_path(self.path)
        rule = f" ({self.check.rule} rule)" if self.check else ""
        verdict = self.check.verdict if self.check else None
        differing = [c for c in (verdict.comparisons if verdict else []) if not c.equal and c.first]
        if not differing:
            detail = f": {verdict.message}" if verdict is not None and verdict.message else ""
            return f"{shown} does not hold{rule}: {self.reason}{detail}"
        lines = [f"{shown} does not hold{rule}: {self.reason}"]
        lines += [f"  {c.layer} {c.where}, {said(c.first.path, c.first.expected, c.first.actual, shown)}"
                  + (f" ({len(c.fields)} fields differ there)" if len(c.fields) > 1 else "")
                  + (f"; {c.evidence}" if c.evidence else "") for c in differing]
        return "\n".join(lines)


@dataclass(frozen=True)
class GoldenOutcome:
    """What regenerating one golden came to (GoldenStore.regenerate): its update, or why the
    oracle's run gave none."""

    path: Path
    update: GoldenUpdate | None = None  # None: no golden from this run
    unsupported: str = ""  # the pin does not serve the scenario's layers here: its own words
    failure: str = ""  # the run failed ("kind: message"): nothing written
    written: bool = False

    @property
    def changes(self) -> bool:
        return self.update is not None and self.update.changes


class GoldenStore:
    """goldens/ (or another root, in tests): every read and write of a golden file. A golden of
    the store is held to the most: its records as their tables declare them, every field named
    (`check_layers` strict), its provenance as `GOLDEN` declares it and naming its pin's build
    (`check_provenance`), so no edit of a golden can choose a laxer rule to be judged by."""

    def __init__(self, root: Path = GOLDEN_DIR, pins: Pins | None = None):
        self.root = Path(root)
        self._pins = pins

    @property
    def pins(self) -> Pins:
        if self._pins is None:
            self._pins = load_pins()
        return self._pins

    def path(self, scenario: str, release: str) -> Path:
        return self.root / scenario / f"{pin_label(release)}.json"

    def exists(self, scenario: str, release: str) -> bool:
        return self.path(scenario, release).exists()

    def load(self, scenario: str, release: str) -> dict:
        """The golden's trace; a TraceError naming the file when it is missing or invalid."""
        path = self.path(scenario, release)
        return self.check(load_trace(path), release, path)

    def lookup(self, scenario: str, release: str) -> Golden:
        """The golden, or why there is none to judge against (never raises for a bad file)."""
        path = self.path(scenario, release)
        if not path.exists():
            return lookup(path)
        try:
            return Golden(path, self.load(scenario, release))
        except TraceError as exc:
            return Golden(path, kind=Kind.INVALID_GOLDEN, message=str(exc))

    def check(self, golden: dict, release: str, path) -> dict:
        """The golden of pin `release` if it is one (see the class); TraceError naming `path`."""
        finished(golden, path)
        try:
            check_provenance(golden, release, self.pins)
        except RecordError as exc:
            raise TraceError(f"{path}: not a golden of vllm {release}: {exc}") from None
        layers, problem = check_layers(golden["layers"], strict=True)
        if problem is not None:
            raise TraceError(f"{path}: {problem}")
        for layer, form in golden.get("digests", {}).items():  # checkpoints strict, no run's windows
            problem = check_form(layer, form, strict=True) or next(
                (f"digests.{layer}.{key}: a golden holds no run's window" for key in WINDOWS if key in form), None)
            if problem is not None:
                raise TraceError(f"{path}: {problem}")
        return dict(golden, layers=layers)

    def digest(self, names: list[str], releases: tuple[str, ...]) -> str:
        """Every golden of these scenarios and pins, by content (absent ones too)."""
        h = hashlib.sha256()
        for name in sorted(names):
            for release in releases:
                path = self.path(name, release)
                h.update(f"{name}/{release}\0".encode())
                h.update(_content_digest(path))
        return h.hexdigest()[:16]

    def content(self, scenario: str, release: str) -> bytes:
        """The golden's bytes, for what depends on it exactly (adequacy's result cache)."""
        return read_bytes(self.path(scenario, release), "trace")

    def orphans(self, scenario_names: set[str], releases: tuple[str, ...]) -> list[Path]:
        """Every file in the store that is not a golden of a scenario and a pinned release: a
        golden of neither, and anything else (the temporary file a killed write left behind)."""
        expected = {self.path(s, r) for s in scenario_names for r in releases}
        return sorted(p for p in self.root.glob("**/*") if not p.is_dir() and p not in expected)

    def update(self, trace: dict, release: str | None, old_text: str | None = None) -> GoldenUpdate:
        """The one golden lifecycle: what regenerating the golden of `trace` (a run of pinned
        `release`) does, by `keeps`. A bad writer (a candidate, a failed run, another release's
        trace) is refused. `old_text`: the golden's current text when the caller has read it."""
        path = self.path(trace["scenario"]["name"], release) if release else None
        refuse_writer(path, trace, release)
        trace = without_windows(trace)  # the records a run kept around a difference are its own
        text = dumps(trace)
        if old_text is None and path.exists():
            try:
                old_text = read_text(path, "trace")
            except InputFileError as exc:
                return GoldenUpdate(path, REWRITE, text, summary=change_summary(path, "", trace),
                                    reason=f"unreadable: {exc}", release=release)
        if old_text is None:
            return GoldenUpdate(path, NEW, text, summary=change_summary(path, None, trace), release=release)
        try:
            golden = self.check(loads_trace(old_text, path), release, path)
        except TraceError as exc:
            return GoldenUpdate(path, REWRITE, text, summary=change_summary(path, old_text, trace),
                                reason=f"unreadable: {exc}", release=release)
        check = keeps(trace, golden)
        if check.holds:
            return GoldenUpdate(path, KEEP, text, check, release=release)
        return GoldenUpdate(path, REWRITE, text, check, change_summary(path, old_text, trace), check.reason,
                            release=release)

    def regenerate(self, trace: dict, release: str, write: bool = False, say=None) -> GoldenOutcome:
        """The one golden lifecycle entry point: the oracle's trace of a scenario (every layer,
        ORACLE_RUNS runs) against the golden of pin `release`, by `update`; when it changes,
        `say` is told what changes, then, with `write`, it is written. A run the pin refused as
        unsupported here, or that failed, leaves the golden as it is and says why."""
        path = self.path(trace["scenario"]["name"], release)
        failure = trace.get("failure")
        if failure is not None and failure["kind"] == Kind.UNSUPPORTED:
            return GoldenOutcome(path, unsupported=failure["message"])
        if failure is not None:
            return GoldenOutcome(path, failure=f"{failure['kind']}: {failure['message']}")
        update = self.update(trace, release)
        if update.changes and say is not None:  # checked only: golden (path) says X, the run now gives Y
            say(update.summary if write or update.action == NEW else update.explain())
        return GoldenOutcome(path, update, written=write and self.write(update))

    def written_here(self, layers, release: str, device: str) -> bool:
        """Whether a golden of a scenario with `layers` for pin `release` is written on `device`:
        on a GPU only those no CPU can write (formats/gpu.py golden_written_here)."""
        return golden_written_here(layers, release, device, self.pins.cpu_engine_build(release))

    def write(self, update: GoldenUpdate) -> bool:
        """Write a regenerated golden atomically (old file or new file, never half); True when
        the bytes changed. A kept golden is left as it is; one a CPU writes is never written
        from a GPU's run (its provenance says `device: gpu`)."""
        if not update.changes:
            return False
        try:  # what is written must read back as a golden of its pin
            golden = self.check(loads_trace(update.text, update.path), update.release, update.path)
        except TraceError as exc:
            raise GoldenRefused(f"refusing to write {update.path}: {exc}") from None
        device = golden["provenance"]["environment"].get("device", "cpu")
        if not self.written_here(golden["layers"], update.release, device):
            raise GoldenRefused(f"refusing to write {update.path} from a run on a GPU: it is a golden a CPU "
                                "writes (a GPU run is judged against it by the numerics rules); on a GPU "
                                "only the engine goldens of pins without a CPU engine build are written: "
                                "`make goldens PINS=0.33.0 LAYERS=engine`")
        return write_text_atomic(update.path, update.text)


GOLDENS = GoldenStore()
WINDOWS = ("window", "context_window", "oracle_window")  # a run's, never a golden's


def without_windows(trace: dict) -> dict:
    """The trace without the records a run kept around its difference from a golden."""
    if "digests" not in trace:
        return trace
    return dict(trace, digests={layer: {k: v for k, v in form.items() if k not in WINDOWS}
                                for layer, form in trace["digests"].items()})


def _content_digest(path: Path) -> bytes:
    """A golden's part of the digest: its content, or that it is absent or unreadable (the
    verdict then says invalid_golden; the digest only has to differ)."""
    try:
        return hashlib.sha256(read_bytes(path, "trace")).digest()
    except FileNotFoundError:
        return b"absent"
    except (InputFileError, OSError) as exc:
        return f"unreadable: {exc}".encode("utf-8", "replace")


def read_golden(path: Path) -> dict:
    """A golden file's trace (any path: `parity compare --golden`), its records judged as a
    candidate's are; TraceError when invalid."""
    return checked_golden(load_trace(path), path)


def checked_golden(trace: dict, path) -> dict:
    """The trace as a golden to judge against: a finished run, every record as its layer
    declares it (fields no table names left out); TraceError naming `path` otherwise."""
    finished(trace, path)
    trace = checked(trace)
    if "failure" in trace:
        raise TraceError(f"{path}: {trace['failure']['message']}")
    return trace


def finished(trace: dict, path) -> None:
    if "failure" in trace:
        raise TraceError(f"{path}: a golden must come from a finished oracle run, this one records "
                         f"a failure ({trace['failure'].get('kind')})")
    if trace.get("unsupported_features"):
        raise TraceError(f"{path}: a golden must come from a run the engine was sent; this one was not "
                         f"(it lacks {', '.join(map(str, trace['unsupported_features']))})")


def lookup(path: Path) -> Golden:
    if not path.exists():
        return Golden(path, kind=Kind.MISSING_GOLDEN, message=f"no golden at {path}; write it with `make goldens`")
    try:
        return Golden(path, read_golden(path))
    except TraceError as exc:
        return Golden(path, kind=Kind.INVALID_GOLDEN, message=str(exc))


def refuse_writer(path: Path | None, trace: dict, release: str | None) -> None:
    """Only a finished run of a pinned vLLM release writes that release's golden."""
    where = path or f"the golden of {trace.get('scenario', {}).get('name')}"
    if release is None:
        raise GoldenRefused(f"refusing to write {where}: goldens are written only by a pinned "
                            "vLLM oracle, never by a candidate engine")
    if "failure" in trace:
        raise GoldenRefused(f"refusing to write {where}: the run failed ({trace['failure']['kind']})")
    env = trace.get("provenance", {}).get("environment", {})
    if env.get("vllm") != release:
        raise GoldenRefused(f"refusing to write {where}: it is not the trace of vLLM {release}")
    # a golden is written at full float32 only (formats/precision.py); a trace from before the
    # precision was recorded says nothing, and its engine ran at vLLM's default, `highest`
    lower = precision.refusal(env.get("float32_matmul_precision"), "provenance.environment.float32_matmul_precision")
    if lower:
        raise GoldenRefused(f"refusing to write {where}: {lower}")


# A golden's every part but its layers, field by field: nothing else may ride along in a golden
# (a field no rule reads today could be read by one tomorrow).
CPU = Record("cpu", {"model": Field(Text()), "isa": Field(Text()), "flags_sha256": Field(Text()),
                     "onednn_max_isa": Field(Text(), optional=True)})
FIDELITY = Record("fidelity", {"official": Field(Text()), "compared_files": Field(Int(0)),
                               "allowed_differences": Field(ListOf(Text())), "equal": Field(Flag())})
# a pinned commit's environment (conformance/process/commit_env.py): the commit, its base, the overlay
COMMIT = Record("commit", {
    "commit": Field(Text()), "base": Field(Text()),
    "overlay": Field(Nullable(Record("overlay", {"files": Field(Int(0)), "tree": Field(Text()),
                                                 "compared_files": Field(Int(0)), "equal": Field(Flag())}))),
    "compiled_inputs_changed": Field(ListOf(Text())), "dependencies": Field(ListOf(Text())),
})
ENVIRONMENT = Record("environment", {
    "python": Field(Text()), "torch": Field(Text()), "vllm": Field(Text()), "machine": Field(Text()),
    "build": Field(Text()), "fidelity": Field(Nullable(FIDELITY)), "cpu": Field(Nullable(CPU)),
    "device": Field(Text(("gpu",)), optional=True), "model_runner": Field(Text(), optional=True),
    # recorded since the float32 precision was pinned (runtime.numerics): optional, so every golden
    # written before holds as it is (LATER_ENVIRONMENT_KEYS); a golden is written at full float32 only
    "float32_matmul_precision": Field(Text((precision.FULL_FLOAT32,)), optional=True),
    "batch_invariant": Field(Flag(), optional=True), "cuda": Field(Nullable(Text()), optional=True),
    "commit": Field(COMMIT, optional=True),
})
# provenance.environment's keys a golden written before them lacks: on the machine that wrote
# it, such a golden is compared byte for byte with a run's trace without them (`as_written`)
LATER_ENVIRONMENT_KEYS = ("float32_matmul_precision", "batch_invariant", "cuda")
GOLDEN = Record("golden", {
    "schema": Field(Text((SCHEMA,))),
    "engine": Field(Record("engine", {"label": Field(Text()), "name": Field(Text(("vllm",))),
                                      "version": Field(Text()), "protocol": Field(Int(0))})),
    "scenario": Field(Record("scenario", {"name": Field(Text()), "sha256": Field(Text()),
                                          "logprob_atol": Field(Number(minimum=0), optional=True),
                                          "logprob_noise": Field(Number(minimum=0), optional=True)})),
    "provenance": Field(Record("provenance", {"harness": Field(Text()), "environment": Field(ENVIRONMENT)})),
})


def check_provenance(golden: dict, release: str, pins: Pins) -> None:
    """A golden of pin `release`: every part as GOLDEN declares it, written by that release
    (engine and environment.vllm) and by its pin's build (Pins.golden_build): the build decides
    which rule a golden holds by, so it may name no other. RecordError otherwise."""
    # the layers are checked by their tables, a production golden's digests by digest.check_form
    GOLDEN.check({k: v for k, v in golden.items() if k not in ("layers", "digests")}, strict=True)
    for path, value, expected in (("engine.version", golden["engine"]["version"], release),
                                  ("engine.label", golden["engine"]["label"], pin_label(release)),
                                  ("provenance.environment.vllm", golden["provenance"]["environment"]["vllm"], release),
                                  ("provenance.environment.build", golden["provenance"]["environment"]["build"],
                                   pins.golden_build(release))):
        if value != expected:
            raise RecordError(f"{expected!r} (the pin's)", value, tuple(path.split(".")))
    # a CPU rebuild whose sources differ from the official wheel's outside the allowlist is not
    # the release it names: its runs are no oracle's words (process/fidelity.py)
    fidelity = golden["provenance"]["environment"]["fidelity"]
    if fidelity is not None and fidelity["equal"] is not True:
        raise RecordError(f"true (written by a build whose sources are {fidelity['official']}'s but for "
                          "allowed differences)", fidelity["equal"], ("provenance", "environment", "fidelity", "equal"))


def writer(trace: dict) -> dict:
    """What wrote a trace: the build, and the CPU's model, ISA level and flags (provenance)."""
    env = trace.get("provenance", {}).get("environment", {})
    return {"build": env.get("build"), "cpu": env.get("cpu")}


def as_written(trace: dict, golden: dict) -> dict:
    """`trace` as a harness of the golden's day would have recorded it: without the
    LATER_ENVIRONMENT_KEYS the golden's provenance lacks (only those: any other difference
    still fails the byte rule)."""
    env = trace.get("provenance", {}).get("environment", {})
    known = golden.get("provenance", {}).get("environment", {})
    later = [key for key in LATER_ENVIRONMENT_KEYS if key in env and key not in known]
    if not later:
        return trace
    kept = {key: value for key, value in env.items() if key not in later}
    return {**trace, "provenance": {**trace["provenance"], "environment": kept}}


def check_golden(trace: dict, golden: dict) -> GoldenCheck:
    """The one rule by which a trace holds its golden (module doc)."""
    # the comparison core; judging/judging.py builds on this module
    from conformance.judging.verdict import NUMERICS, PASS, judge

    theirs, ours = writer(golden), writer(trace)
    if theirs == ours and theirs["cpu"] is not None:
        same = dumps(as_written(trace, golden)) == dumps(golden)
        return GoldenCheck(same, "bytes", reason="" if same else "on the machine that wrote it, "
                           "the golden must regenerate byte for byte")
    rule = "tolerance" if theirs["build"] == ours["build"] else "numerics"
    for key in ("engine", "scenario"):
        if trace.get(key) != golden.get(key):
            return GoldenCheck(False, rule, reason=f"{key} differs: golden {golden.get(key)}, "
                               f"run {trace.get(key)}")
    verdict = judge(trace, golden, "oracle")
    holds = verdict.kind == PASS or (rule == "numerics" and verdict.kind == NUMERICS)
    return GoldenCheck(holds, rule, verdict, reason="" if holds else (
        f"the golden was written by {theirs}, the oracle run now by {ours}: judged {verdict.kind}, "
        + ("integer facts exact and logprobs within the tolerance required" if rule == "tolerance"
           else "within the numerics rules required")))


def keeps(trace: dict, golden: dict) -> GoldenCheck:
    """Whether regeneration keeps a golden (both lifecycles): it holds, and its provenance
    names the CPU that wrote it (a golden from before that was recorded is rewritten once)."""
    check = check_golden(trace, golden)
    if check.holds and writer(golden)["cpu"] is None:
        return GoldenCheck(False, check.rule, check.verdict, "its provenance does not name the CPU "
                           "that wrote it (environment.cpu)")
    return check


def change_summary(path: Path, old_text: str | None, trace: dict) -> str:
    """One line saying what regenerating `path` changes, shown before it is written."""
    from conformance.judging.compare import compare_layer
    from conformance.judging.digest_compare import compare_digest_layer

    rel = shown_path(path)
    if old_text is None:
        held = ", ".join(f"{layer} {len(records)} record(s)" for layer, records in trace["layers"].items())
        return f"[goldens] new: {rel}: {held or 'no layer'}"
    try:
        old = json.loads(old_text)
        parts = []
        for layer, form in trace.get("digests", {}).items():
            c = compare_digest_layer(layer, old.get("digests", {}).get(layer) or {"records": []}, form)
            if not c.equal:
                parts.append(f"{layer} record {c.index} (by its digest; {c.expected_count} -> {c.actual_count} "
                             f"records{_checkpoint_change(layer, old.get('digests', {}).get(layer) or {}, form)})")
        for layer, records in trace["layers"].items():
            c = compare_layer(layer, old.get("layers", {}).get(layer, []), records)
            if not c.equal:
                f = c.first
                parts.append(f"{layer} {c.where}, {said(f.path, f.expected, f.actual)}"
                             f" ({len(c.fields)} field(s))")
        return f"[goldens] changed: {rel}: " + ("; ".join(parts) or "metadata only (engine or provenance)")
    except (ValueError, AttributeError, TypeError, KeyError):
        return f"[goldens] changed: {rel} (the old file was unreadable)"


def _checkpoint_change(layer: str, old: dict, new: dict) -> str:
    """The first checkpoint kept in both forms that changed, and its first field."""
    from conformance.judging.compare import field_diffs

    old_points, new_points = old.get("checkpoints", {}), new.get("checkpoints", {})
    for key in sorted(set(old_points) & set(new_points), key=int):
        diffs = field_diffs(old_points[key], new_points[key])
        if diffs:
            return f"; checkpoint {key}: {diffs[0].path}: {diffs[0].expected!r} -> {diffs[0].actual!r}"
    return ""


def said(field_path: str, golden, run, shown: str = "") -> str:
    """A field as goldens-check words it: the golden's value, then the fresh oracle run's."""
    where = f" ({shown})" if shown else ""
    return (f"{field_path}: golden{where} says {_value(golden)}, "
            f"the oracle run now gives {_value(run)}")


def shown_path(path: Path) -> str:
    """A golden's path as a reader finds it: from the repository root."""
    path = Path(path)
    return str(path.relative_to(REPO_ROOT)) if path.is_relative_to(REPO_ROOT) else str(path)


def _value(value) -> str:
    text = json.dumps(value, sort_keys=True)  # control characters escaped: shown, never obeyed
    return text if len(text) <= 200 else text[:197] + "..."
