"""Verdicts: one per engine and scenario, each of a named kind. A run with any kind other than
`pass` can never read as green."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from conformance.formats.kinds import FAILURE_KINDS, PARTIAL_KINDS, Kind
from conformance.formats.trace import Trace
from conformance.judging.comparators import DIGEST, RECORDS, Basis, compare
from conformance.judging.compare import LayerComparison
from conformance.judging.digest_compare import truncated
from conformance.judging.numerics import NUMERICS_CAUSES, capacity_excess

# The kinds are one enum (formats/kinds.py); these names are its members. NUMERICS: real engines
# that differ only where arithmetic explains it (conformance/judging/numerics.py): a near-tie
# resolved the other way, or drafts accepted differently. Reported, never failing, as vLLM's own
# check_logprobs_close passes such sequences.
PASS, DIVERGED, NUMERICS = Kind.PASS, Kind.DIVERGED, Kind.NUMERICS
PROTOCOL, INVALID_GOLDEN, MISSING_GOLDEN = Kind.PROTOCOL, Kind.INVALID_GOLDEN, Kind.MISSING_GOLDEN
UNSUPPORTED = Kind.UNSUPPORTED
KINDS = tuple(Kind)
# The oracle is judged against its own golden (it must reproduce it); candidates gate; stand-ins
# (the other pins, when no port is configured) are shown but never set the exit status.
ORACLE, CANDIDATE, STAND_IN = "oracle", "candidate", "stand-in"
ROLES = (ORACLE, CANDIDATE, STAND_IN)
# Why a layer of a scenario was not judged (Verdict.not_judged): not asked for (--layers), not
# served (the engine's hello does not declare it), or required and not served (a failure).
NOT_ASKED, NOT_SERVED, MISSING = "not asked", "not served", "required, not served"


@dataclass(frozen=True)
class Verdict:
    """Made once, by `judge` (the gate adds the layers judged with dataclasses.replace)."""

    engine: str
    scenario: str
    kind: str
    role: str  # ORACLE, CANDIDATE, or STAND_IN (other pins shown when no port is configured)
    comparisons: list[LayerComparison] = field(default_factory=list)
    message: str = ""
    expected_lines: list[str] = field(default_factory=list)
    actual_lines: list[str] = field(default_factory=list)
    # engine layers: each forward of the candidate's worker above max_num_batched_tokens, and
    # the oracle's for comparison (conformance/judging/numerics.py capacity_excess)
    capacity: list[dict] = field(default_factory=list)
    oracle_capacity: list[dict] = field(default_factory=list)
    # the run and the golden come from the same build of the release (provenance
    # environment.build): only then must the oracle reproduce its golden byte for byte
    same_build: bool = True
    # a run that diverged and then failed: the failure's kind (crash, timeout, ...); such a
    # verdict is DIVERGED at the first difference before the failure and is never waived
    failure: str = ""
    # the gate: the layers this verdict was judged on, and each layer of the scenario it was
    # not judged on with the reason (NOT_ASKED, NOT_SERVED)
    judged: list[str] = field(default_factory=list)
    not_judged: dict[str, str] = field(default_factory=dict)
    # an `unsupported` scenario that was not run: the features it needs that the engine's hello
    # does not declare (formats/features.py), and those of them the gate requires
    missing_features: tuple[str, ...] = ()
    required_features: tuple[str, ...] = ()

    def __post_init__(self):
        assert self.kind in KINDS and self.role in ROLES, (self.kind, self.role)

    @property
    def key(self) -> tuple[str, str]:
        """What names a verdict in a gate: one per engine (by its label) and scenario."""
        return (self.engine, self.scenario)

    @property
    def gating(self) -> bool:
        return self.role != STAND_IN

    @property
    def declined(self) -> bool:
        """Not run, for features the engine does not declare and the gate does not require: said,
        never failing (a port's progress, feature by feature)."""
        return self.kind == UNSUPPORTED and bool(self.missing_features) and not self.required_features


def exit_status(verdicts: list[Verdict], waived: frozenset[tuple[str, str]] = frozenset(),
                expired_waiver: bool = False) -> int:
    """0: every gating verdict passed (or its divergence is waived: its key in `waived`; a
    candidate's `numerics` passes, and so does the oracle's on another build than the one that
    wrote the golden: the CUDA wheel on a GPU runner against a CPU rebuild's golden); 1: a
    gating engine diverged unwaived, the oracle did not reproduce its golden byte for byte on
    the same build (even within tolerance: a golden must regenerate exactly), or a waiver
    expired; 2: a gating run could not be compared (engine failure, even one that diverged
    first, missing or invalid golden), or a candidate has no verdict but scenarios it declined
    (it needs features the candidate does not declare and the gate does not require: such a
    verdict alone sets no status, but declaring nothing cannot pass). Stand-ins never set the
    status."""
    gating = [v for v in verdicts if v.gating and not v.declined]
    declined = {v.engine for v in verdicts if v.gating and v.declined}
    if declined - {v.engine for v in gating}:  # nothing judged
        return 2
    if any(v.kind in FAILURE_KINDS or v.failure for v in gating):  # diverged, then failed: 2
        return 2
    if expired_waiver or any(v.kind == DIVERGED and v.key not in waived for v in gating):
        return 1
    if any(v.kind == NUMERICS and v.role == ORACLE and v.same_build for v in gating):
        return 1
    return 0


def judge(trace: Trace, golden: Trace, role: str) -> Verdict:
    """Compare one trace with the oracle's golden for the same scenario."""

    engine, scenario = trace.label, trace.scenario_name
    if trace.failure is not None:
        return _judge_failure(trace, golden, role)
    if trace.sha256 != golden.sha256:
        return Verdict(engine, scenario, INVALID_GOLDEN, role, message=(
            f"the golden was written for another version of scenario {scenario} "
            f"(sha256 {golden.sha256[:12]} vs {trace.sha256[:12]}); "
            "regenerate it with `make goldens`"))
    stated, asked = golden.scenario.get("logprob_atol"), trace.scenario.get("logprob_atol")
    if asked is not None and stated != asked:
        # the tolerance is the scenario file's: a golden stating another cannot loosen the judging
        return Verdict(engine, scenario, INVALID_GOLDEN, role, message=(
            f"the golden states the tolerance logprob_atol {stated!r}, the scenario {asked!r}; "
            "regenerate it with `make goldens`"))
    written, speaks = golden.engine.get("protocol"), trace.engine.get("protocol")
    if isinstance(written, int) and isinstance(speaks, int) and written != speaks:
        # records change shape between protocol versions (2 added the state after each step)
        return Verdict(engine, scenario, INVALID_GOLDEN, role, message=(
            f"the golden was written under protocol {written}, the run speaks protocol {speaks}, "
            "whose records have another shape; regenerate it with `make goldens`"))
    from conformance.formats.protocol import LAYERS

    digests = golden.forms  # a production scenario's steps and outputs, in the digest form
    order = sorted(golden.layers, key=lambda name: LAYERS.index(name) if name in LAYERS else len(LAYERS))
    missing = next((layer for layer in order if layer not in trace.layers), None) or next(
        (layer for layer in digests if layer not in trace.forms), None)
    if missing is not None:
        return Verdict(engine, scenario, UNSUPPORTED, role, message=f"the engine produced no {missing!r} layer")
    comparisons = compared(golden, {layer: trace.layers[layer] for layer in order},
                           {layer: trace.forms[layer] for layer in digests})
    differing = [c for c in comparisons if not c.equal]
    kind = (PASS if not differing else
            NUMERICS if all(c.cause in NUMERICS_CAUSES for c in differing) else DIVERGED)
    expected_config, actual_config = golden.layers.get("config"), trace.layers.get("config")
    lines = bool(expected_config and actual_config)
    return Verdict(engine, scenario, kind, role, comparisons,
                   expected_lines=expected_config[0].get("budget_log_lines", []) if lines else [],
                   actual_lines=actual_config[0].get("budget_log_lines", []) if lines else [],
                   capacity=capacity_excess(trace.layers.get("engine_steps", [])),
                   oracle_capacity=capacity_excess(golden.layers.get("engine_steps", [])),
                   same_build=trace.environment.get("build") == golden.environment.get("build"))


# Failures after which the records the engine did send are compared with the golden: a port
# that diverged at step 3 and crashed at step 40 is reported at step 3.


def _judge_failure(trace: Trace, golden: Trace | None, role: str) -> Verdict:
    """A run that did not finish. Its partial records are compared with the golden's first
    records; a difference there is the verdict (DIVERGED, naming the failure that followed),
    otherwise the failure is, with how far the engine agreed before it."""
    engine, scenario = trace.label, trace.scenario_name
    failure = trace.failure
    kind = Kind(failure.kind) if failure.kind in FAILURE_KINDS else Kind.ENGINE_ERROR
    verdict = Verdict(engine, scenario, kind, role, message=failure.message)
    sent = {layer: records for layer, records in trace.layers.items() if records}
    sent_digests = any(form["count"] for form in trace.forms.values())
    if (kind not in PARTIAL_KINDS or not golden or not (sent or sent_digests)
            or trace.sha256 != golden.sha256):
        return verdict
    comparisons = compared(golden, {layer: records for layer, records in sent.items() if layer in golden.layers},
                           {layer: form for layer, form in trace.forms.items()
                            if form["count"] and layer in golden.forms}, partial=True)
    differing = [c for c in comparisons if not c.equal]
    if differing and not all(c.cause in NUMERICS_CAUSES for c in differing):
        return replace(verdict, kind=DIVERGED, failure=kind, comparisons=comparisons, message=(
            f"then the engine failed ({kind}); the divergence below is in the "
            f"records it sent before that:\n{failure.message}"))
    agreed = ", ".join(f"{c.layer}: {c.actual_count} records" for c in comparisons)
    return replace(verdict, message=(f"{failure.message}\nbefore it failed, every record it "
                                     f"sent agreed with the golden ({agreed or 'none comparable'})"))


def compared(golden: Trace, layers: dict[str, list], digests: dict[str, dict] | None = None,
             partial: bool = False) -> list[LayerComparison]:
    """Each of `layers` (a run's records) and of `digests` (a run's layers in the digest form)
    compared with the golden's by the layer's comparator (judging/comparators.py), in layer
    order; `partial`: a failed run's records against as many of the golden's first records."""
    from conformance.formats.protocol import LAYERS

    basis = Basis(logprob_atol(golden), golden.layers)
    sides = [(layer, golden.layers[layer][:len(records)] if partial else golden.layers[layer], records, RECORDS)
             for layer, records in layers.items()]
    sides += [(layer, truncated(golden.forms[layer], form["count"]) if partial else golden.forms[layer],
               form, DIGEST) for layer, form in (digests or {}).items()]
    sides.sort(key=lambda side: LAYERS.index(side[0]) if side[0] in LAYERS else len(LAYERS))
    return [compare(layer, expected, actual, basis, how) for layer, expected, actual, how in sides]


def logprob_atol(golden: Trace) -> float:
    """The tolerance the scenario states for engine-layer logprobs (kept in its traces)."""
    from conformance.formats.scenario import DEFAULT_ATOL

    value = golden.scenario.get("logprob_atol")
    return float(value) if isinstance(value, (int, float)) else DEFAULT_ATOL["float32"]
