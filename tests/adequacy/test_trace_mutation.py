"""The trace-mutation catalog (conformance/adequacy/trace_catalog.py): the oracle's own goldens,
mutated and served back as candidates through the gate's judging path, must each be `diverged`
or `protocol`, or pass as an intended exception with its reason.

The seeded sample below caught both holes of issue 40 on the code before their fix: a request
added to a step's `requests` as `ghost_text` passed (keys ending `_text` were skipped at every
depth, in the comparison and in the digests), and a production golden served back unchanged was
`unsupported` (the gate's assemble dropped the digests of the steps+outputs piece)."""

import copy
import random


from conformance import cli
from conformance.adequacy.trace_catalog import Received, Target, judge_run, render_catalog, run_catalog, targets
from conformance.adequacy.trace_mutants import EXCEPTIONS, Known, mutants, site_mutants, sites, top_k_edge
from conformance.formats.pins import load_pins
from conformance.formats.scenario import load_scenario
from conformance.judging.goldens import GOLDENS
from tests.helpers import REPO

PINS = load_pins()
SEED = 13
SCENARIOS = [load_scenario(p) for p in sorted((REPO / "scenarios").glob("*.json"))]


def _size(scenario) -> int:
    path = GOLDENS.path(scenario.name, PINS.oracle)
    return path.stat().st_size if path.exists() else 1 << 40


def sample(seed: int = SEED) -> list:
    """A scenario of each comparator's family, drawn by `seed` among those whose oracle golden is
    small enough for `make test`: one with the stand-in's steps and outputs (judged in its records
    and in its digest form), one with the engine layers, one production scenario (its digests):
    four goldens, every mutant of each."""
    small = [s for s in SCENARIOS if _size(s) < (100_000 if s.scale == "production" else 40_000)]
    rng = random.Random(seed)
    return [rng.choice([s for s in small if s.scale == "library" and "steps" in s.layers]),
            rng.choice([s for s in small if any(layer.startswith("engine_") for layer in s.layers)]),
            rng.choice([s for s in small if s.scale == "production"])]


def test_a_seeded_sample_of_the_library_is_caught_whole():
    chosen = sample()
    run = run_catalog(chosen, (PINS.oracle,), SEED, log=lambda line: None)
    assert run.unjudged == [], run.unjudged  # every golden served back unchanged passes
    assert run.survivors == [], render_catalog(run)
    assert (run.goldens, run.twins) == (3, 1) and run.mutants > 1000
    assert run.caught + sum(run.excepted.values()) == run.mutants
    assert set(run.excepted) <= set(EXCEPTIONS)
    # the sample holds the mutants that found the holes: a request 'ghost_text' added to a step's
    # requests, in the records form and in the digest form, and a production golden's records
    names = [(t.name, m.name) for t in targets(chosen, (PINS.oracle,)) for m in mutants(t.layers, SEED, t.name)]
    assert any("(digest form)" in t and "requests entry 'ghost_text' added" in m for t, m in names)
    assert any("(digest form)" not in t and "requests entry 'ghost_text' added" in m for t, m in names)
    assert any(t.startswith("prod_") for t, _ in names)


def _target(name: str) -> Target:
    scenario = next(s for s in SCENARIOS if s.name == name)
    return next(t for t in targets([scenario], (PINS.oracle,)) if isinstance(t, Target) and "digest" not in t.name)


def test_each_family_is_judged_by_the_gates_path():
    target = _target("core_admission")
    assert judge_run(target, target.layers).kind == "pass"
    steps = copy.deepcopy(target.layers["steps"])
    record = next(r for r in steps if r["requests"])
    rid = next(iter(record["requests"]))
    record["requests"]["ghost"] = copy.deepcopy(record["requests"][rid])  # a request the oracle never had
    assert judge_run(target, dict(target.layers, steps=steps)).kind == "diverged"
    record["requests"].pop("ghost")
    record["ghost"] = 0  # a field no table names: ignored, as PROTOCOL.md says
    assert judge_run(target, dict(target.layers, steps=steps)).kind == "pass"
    record["requests"][rid]["tokens"] = "7"  # another type
    assert judge_run(target, dict(target.layers, steps=steps)).kind == "protocol"
    found = mutants(target.layers, SEED, target.name)
    kinds = {m.kind for m in found}
    assert {"field changed", "type changed", "record dropped", "record duplicated", "records reordered",
            "request added", "request removed", "request renamed", "list element added",
            "list element removed", "key added", "field removed"} <= kinds
    # seeded: the same seed draws the same mutants, another seed other occurrences
    assert [m.name for m in found] == [m.name for m in mutants(target.layers, SEED, target.name)]
    assert [m.name for m in found] != [m.name for m in mutants(target.layers, SEED + 1, target.name)]


def test_a_production_golden_served_back_is_its_own_digest_form():
    scenario = next(s for s in sample() if s.scale == "production")
    [target] = [t for t in targets([scenario], (PINS.oracle,))]
    form = target.golden.digests["steps"]
    assert any(not isinstance(x, Known) for x in target.layers["steps"])  # its checkpoints, whole
    sink = Received("steps", form)
    for item in target.layers["steps"]:
        sink.feed(item)
    out = sink.to_json()
    assert out["records"] == form["records"] and out["context"] == form["context"] and "window" not in out
    sink = Received("steps", form)  # a record dropped: the window holds only records held whole
    for item in target.layers["steps"][:3] + target.layers["steps"][4:]:
        sink.feed(item)
    window = sink.to_json()["window"]
    assert window["at"] == 3 and all(isinstance(r, dict) for r in window["records"])
    assert judge_run(target, dict(target.layers, steps=target.layers["steps"][:3] + target.layers["steps"][4:])
                     ).kind == "diverged"


def test_the_command_runs_the_catalog_and_refuses_bad_options(capsys):
    # as docs/adequacy.md shows it
    assert cli.main(["adequacy", "--catalog", "traces", "--trace-scenario", "core_admission",
                     "--pin", "0.27.1", "--trace-sample", "2", "--seed", "13"]) == 0
    out = capsys.readouterr()
    assert "-- trace mutations: 1 golden served back as candidates (1 of them again in the digest form)" in out.out
    assert "caught (diverged or protocol)" in out.out and "NOT CAUGHT" not in out.out
    assert "[adequacy] traces: 2/2 goldens and digest forms" in out.err
    for bad in (["--trace-scenario", "no_such_scenario"], ["--trace-sample", "0"], ["--pin", "9.9.9"]):
        assert cli.main(["adequacy", "--catalog", "traces", *bad]) == 2
        assert "error" in capsys.readouterr().err


def test_the_intended_exceptions_are_named_and_only_where_they_hold():
    target = _target("engine_ngram")
    found = mutants(target.layers, SEED, target.name)
    assert all(m.kind == "key added" for m in found if m.exception == "unknown field")
    assert all(m.exception is None for m in found if m.kind not in ("key added", "field changed"))
    # a top-k list's last token made another, its logprob kept: a near-tie at the list's edge
    record = target.layers["engine_outputs"][0]
    last = len(record["logprobs"][0]) - 1
    by_path = {site.path: site for site in sites("engine_outputs", 0, record)}
    edge, sampled = by_path[("logprobs", 0, last, 0)], by_path[("logprobs", 0, 0, 0)]
    assert top_k_edge(edge, record) and not top_k_edge(sampled, record)
    for site, kind in ((edge, "pass"), (sampled, "diverged")):
        [plus] = [m for m in site_mutants(site, [], [], record) if m.name.endswith(" +1")]
        assert plus.exception == ("top-k edge" if site is edge else None)
        assert judge_run(target, plus.apply(target.layers)).kind == kind
