"""A golden's provenance and the keep rule: who may write a golden (a finished run of a pinned
vLLM release, at full float32), what its every part but its records must be (`GOLDEN`, checked
by `check_provenance`), and whether a regenerated trace still holds it (`check_golden`, the one
rule, by which regeneration `keeps` one):
  - on the machine that wrote it (same build, CPU model, ISA level and CPU flags): byte for byte;
  - on another machine or ISA level: every integer fact exactly (config, steps, engine_steps,
    token ids, finish reasons) and the engine layers' logprobs within the scenario's calibrated
    tolerance (conformance/judging/numerics.py); a golden that holds is not rewritten, so goldens do
    not churn from machine to machine;
  - on another build (the CUDA wheel against a CPU rebuild's golden): by the numerics rules,
    where a near-tie resolved the other way is reported, not failed.
Regeneration keeps a golden that holds, unless its provenance does not yet name the CPU that
wrote it.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

from conformance.formats import precision
from conformance.formats.errors import ParityError
from conformance.formats.pins import Pins, pin_label
from conformance.formats.record_schema import Field, Flag, Int, ListOf, Nullable, Number, Record, RecordError, Text
from conformance.formats.trace import SCHEMA, Trace, dumps
from conformance.judging.verdict import NUMERICS, ORACLE, PASS, judge


class GoldenRefused(ParityError, PermissionError):
    """Someone asked a candidate engine, or a failed run, to write a golden."""


@dataclass(frozen=True)
class GoldenCheck:
    """Whether a regenerated trace holds its golden, by which rule, and the verdict behind it."""

    holds: bool
    rule: str  # "bytes" (the writer's machine), "tolerance" (another machine), "numerics" (another build)
    verdict: object = None  # the gate.verdict.Verdict of a judged check
    reason: str = ""


def refuse_writer(path: Path | None, trace: Trace, release: str | None) -> None:
    """Only a finished run of a pinned vLLM release writes that release's golden."""
    where = path or f"the golden of {trace.scenario_name}"
    if release is None:
        raise GoldenRefused(f"refusing to write {where}: goldens are written only by a pinned "
                            "vLLM oracle, never by a candidate engine")
    if trace.failure is not None:
        raise GoldenRefused(f"refusing to write {where}: the run failed ({trace.failure.kind})")
    env = trace.environment
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


def check_provenance(golden: Trace, release: str, pins: Pins) -> None:
    """A golden of pin `release`: every part as GOLDEN declares it, written by that release
    (engine and environment.vllm) and by its pin's build (Pins.golden_build): the build decides
    which rule a golden holds by, so it may name no other. RecordError otherwise."""
    # the layers are checked by their tables, a production golden's digests by digest.check_form
    GOLDEN.check({k: v for k, v in golden.to_json().items() if k not in ("layers", "digests")}, strict=True)
    env = golden.environment
    for path, value, expected in (("engine.version", golden.engine["version"], release),
                                  ("engine.label", golden.label, pin_label(release)),
                                  ("provenance.environment.vllm", env["vllm"], release),
                                  ("provenance.environment.build", env["build"], pins.golden_build(release))):
        if value != expected:
            raise RecordError(f"{expected!r} (the pin's)", value, tuple(path.split(".")))
    # a CPU rebuild whose sources differ from the official wheel's outside the allowlist is not
    # the release it names: its runs are no oracle's words (process/fidelity.py)
    fidelity = env["fidelity"]
    if fidelity is not None and fidelity["equal"] is not True:
        raise RecordError(f"true (written by a build whose sources are {fidelity['official']}'s but for "
                          "allowed differences)", fidelity["equal"], ("provenance", "environment", "fidelity", "equal"))


def writer(trace: Trace) -> dict:
    """What wrote a trace: the build, and the CPU's model, ISA level and flags (provenance)."""
    env = trace.environment
    return {"build": env.get("build"), "cpu": env.get("cpu")}


def as_written(trace: Trace, golden: Trace) -> Trace:
    """`trace` as a harness of the golden's day would have recorded it: without the
    LATER_ENVIRONMENT_KEYS the golden's provenance lacks (only those: any other difference
    still fails the byte rule)."""
    env, known = trace.environment, golden.environment
    later = [key for key in LATER_ENVIRONMENT_KEYS if key in env and key not in known]
    if not later:
        return trace
    kept = {key: value for key, value in env.items() if key not in later}
    return replace(trace, provenance=dict(trace.provenance, environment=kept))


def check_golden(trace: Trace, golden: Trace) -> GoldenCheck:
    """The one rule by which a trace holds its golden (module doc)."""
    theirs, ours = writer(golden), writer(trace)
    if theirs == ours and theirs["cpu"] is not None:
        same = dumps(as_written(trace, golden)) == dumps(golden)
        return GoldenCheck(same, "bytes", reason="" if same else "on the machine that wrote it, "
                           "the golden must regenerate byte for byte")
    rule = "tolerance" if theirs["build"] == ours["build"] else "numerics"
    for key in ("engine", "scenario"):
        if getattr(trace, key) != getattr(golden, key):
            return GoldenCheck(False, rule, reason=f"{key} differs: golden {getattr(golden, key)}, "
                               f"run {getattr(trace, key)}")
    verdict = judge(trace, golden, ORACLE)
    holds = verdict.kind == PASS or (rule == "numerics" and verdict.kind == NUMERICS)
    return GoldenCheck(holds, rule, verdict, reason="" if holds else (
        f"the golden was written by {theirs}, the oracle run now by {ours}: judged {verdict.kind}, "
        + ("integer facts exact and logprobs within the tolerance required" if rule == "tolerance"
           else "within the numerics rules required")))


def keeps(trace: Trace, golden: Trace) -> GoldenCheck:
    """Whether regeneration keeps a golden (both lifecycles): it holds, and its provenance
    names the CPU that wrote it (a golden from before that was recorded is rewritten once)."""
    check = check_golden(trace, golden)
    if check.holds and writer(golden)["cpu"] is None:
        return GoldenCheck(False, check.rule, check.verdict, "its provenance does not name the CPU "
                           "that wrote it (environment.cpu)")
    return check
