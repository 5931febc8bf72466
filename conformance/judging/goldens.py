"""Golden files, owned by one GoldenStore: where they live, how they are read (an unreadable
one is an invalid golden), which are orphans, and how one is written (atomically, by a pinned
oracle only). Nothing outside this module opens them. Who may write one, what its provenance
must be and when regeneration keeps one: judging/provenance.py; what a regeneration changes, in
words: judging/golden_changes.py.

goldens/<scenario name>/vllm-<release>.json holds the trace of pinned release <release> on
that scenario. Only a pinned vLLM release may write one; a candidate never does.

The one golden lifecycle is `GoldenStore.regenerate`: an oracle's trace (of ORACLE_RUNS runs)
becomes its golden, or says why there is none (the pin does not serve the scenario here, the
run failed), whoever asks (`parity goldens`, which `make goldens` calls, from the oracle's runs
or a gate's results folder; the goldens suite, parity/test_goldens.py). A golden a CPU can
write is never written with a GPU's provenance (`GoldenStore.written_here`).

Whether a regenerated trace still holds its golden: `check_golden` (judging/provenance.py), by
which `GoldenStore.update` decides.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, replace
from pathlib import Path

from conformance.formats.kinds import Kind
from conformance.formats.digest import check_form
from conformance.formats.files import InputFileError, read_bytes, read_text, write_text_atomic
from conformance.formats.gpu import golden_written_here
from conformance.formats.pins import REPO_ROOT, Pins, load_pins, pin_label
from conformance.formats.record_schema import RecordError, check_layers
from conformance.formats.trace import Trace, TraceError, checked, dumps, load_trace, loads_trace
from conformance.judging.golden_changes import change_summary, explain
from conformance.judging.provenance import GoldenCheck, GoldenRefused, check_provenance, keeps, refuse_writer

GOLDEN_DIR = REPO_ROOT / "goldens"
# An oracle runs each unit this many times in its warm engine (the gate's oracle, `parity
# goldens`): records that differ make a `nondeterministic` failure, never a golden.
ORACLE_RUNS = 2
# What regeneration does to a golden (GoldenUpdate.action)
KEEP, NEW, REWRITE = "keep", "new", "rewrite"


@dataclass(frozen=True)
class Golden:
    """A golden looked up: its trace, or why there is none to judge against (`kind`:
    missing_golden or invalid_golden, and a message naming the file)."""

    path: Path
    trace: Trace | None = None
    kind: str = ""
    message: str = ""

    def only(self, layers) -> Trace | None:
        """The golden restricted to `layers` (all of it with None)."""
        return None if self.trace is None else self.trace.only(layers)


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
        """Why the golden does not hold (golden_changes.explain)."""
        return explain(self)


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

    def load(self, scenario: str, release: str) -> Trace:
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

    def check(self, golden: Trace, release: str, path) -> Trace:
        """The golden of pin `release` if it is one (see the class); TraceError naming `path`."""
        finished(golden, path)
        try:
            check_provenance(golden, release, self.pins)
        except RecordError as exc:
            raise TraceError(f"{path}: not a golden of vllm {release}: {exc}") from None
        layers, problem = check_layers(golden.layers, strict=True)
        if problem is not None:
            raise TraceError(f"{path}: {problem}")
        for layer, form in golden.forms.items():  # checkpoints strict, no run's windows
            problem = check_form(layer, form, strict=True) or next(
                (f"digests.{layer}.{key}: a golden holds no run's window" for key in WINDOWS if key in form), None)
            if problem is not None:
                raise TraceError(f"{path}: {problem}")
        return replace(golden, layers=layers)

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

    def update(self, trace: Trace, release: str | None, old_text: str | None = None) -> GoldenUpdate:
        """The one golden lifecycle: what regenerating the golden of `trace` (a run of pinned
        `release`) does, by `keeps`. A bad writer (a candidate, a failed run, another release's
        trace) is refused. `old_text`: the golden's current text when the caller has read it."""
        path = self.path(trace.scenario_name, release) if release else None
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

    def regenerate(self, trace: Trace, release: str, write: bool = False, say=None) -> GoldenOutcome:
        """The one golden lifecycle entry point: the oracle's trace of a scenario (every layer,
        ORACLE_RUNS runs) against the golden of pin `release`, by `update`; when it changes,
        `say` is told what changes, then, with `write`, it is written. A run the pin refused as
        unsupported here, or that failed, leaves the golden as it is and says why."""
        path = self.path(trace.scenario_name, release)
        failure = trace.failure
        if failure is not None and failure.kind == Kind.UNSUPPORTED:
            return GoldenOutcome(path, unsupported=failure.message)
        if failure is not None:
            return GoldenOutcome(path, failure=f"{failure.kind}: {failure.message}")
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
        device = golden.environment.get("device", "cpu")
        if not self.written_here(golden.layers, update.release, device):
            raise GoldenRefused(f"refusing to write {update.path} from a run on a GPU: it is a golden a CPU "
                                "writes (a GPU run is judged against it by the numerics rules); on a GPU "
                                "only the engine goldens of pins without a CPU engine build are written: "
                                "`make goldens PINS=0.33.0 LAYERS=engine`")
        return write_text_atomic(update.path, update.text)


GOLDENS = GoldenStore()
WINDOWS = ("window", "context_window", "oracle_window")  # a run's, never a golden's


def without_windows(trace: Trace) -> Trace:
    """The trace without the records a run kept around its difference from a golden."""
    if trace.digests is None:
        return trace
    return replace(trace, digests={layer: {k: v for k, v in form.items() if k not in WINDOWS}
                                   for layer, form in trace.digests.items()})


def _content_digest(path: Path) -> bytes:
    """A golden's part of the digest: its content, or that it is absent or unreadable (the
    verdict then says invalid_golden; the digest only has to differ)."""
    try:
        return hashlib.sha256(read_bytes(path, "trace")).digest()
    except FileNotFoundError:
        return b"absent"
    except (InputFileError, OSError) as exc:
        return f"unreadable: {exc}".encode("utf-8", "replace")


def read_golden(path: Path) -> Trace:
    """A golden file's trace (any path: `parity compare --golden`), its records judged as a
    candidate's are; TraceError when invalid."""
    return checked_golden(load_trace(path), path)


def checked_golden(trace: Trace, path) -> Trace:
    """The trace as a golden to judge against: a finished run, every record as its layer
    declares it (fields no table names left out); TraceError naming `path` otherwise."""
    finished(trace, path)
    trace = checked(trace)
    if trace.failure is not None:
        raise TraceError(f"{path}: {trace.failure.message}")
    return trace


def finished(trace: Trace, path) -> None:
    if trace.failure is not None:
        raise TraceError(f"{path}: a golden must come from a finished oracle run, this one records "
                         f"a failure ({trace.failure.kind})")
    if not trace.sent:
        raise TraceError(f"{path}: a golden must come from a run the engine was sent; this one was not "
                         f"(it lacks {', '.join(trace.unsupported_features)})")


def lookup(path: Path) -> Golden:
    if not path.exists():
        return Golden(path, kind=Kind.MISSING_GOLDEN, message=f"no golden at {path}; write it with `make goldens`")
    try:
        return Golden(path, read_golden(path))
    except TraceError as exc:
        return Golden(path, kind=Kind.INVALID_GOLDEN, message=str(exc))


