"""The parity suite's golden lifecycle: each pinned oracle, on each scenario, must reproduce its
committed golden byte for byte. `pytest parity --snapshot-update` (make goldens) rewrites them."""

import pytest

from conformance.engine import EngineFailure
from conformance.goldens import golden_path, load_golden
from conformance.report import render_verdict
from conformance.verdict import NUMERICS, PASS, judge
from conformance.pins import load_pins
from conformance.scenario import load_scenario
from conformance.trace import make_trace
from conftest import REPO
from parity.golden_extension import GoldenExtension

pytestmark = pytest.mark.oracle
PINS = load_pins()
SCENARIOS = [load_scenario(p) for p in sorted(REPO.glob("scenarios/*.json"))]


@pytest.mark.parametrize("release", PINS.releases)
@pytest.mark.parametrize("scenario", SCENARIOS, ids=[s.name for s in SCENARIOS])
def test_oracle_reproduces_its_golden(snapshot, warm_workers, scenario, release):
    proc = warm_workers(release)
    missing = [layer for layer in scenario.layers if layer not in proc.hello["capabilities"]]
    if missing:  # 0.33.0 on CPU: no CPU build runs its engine; the reason is the engine's own
        with pytest.raises(EngineFailure, match="unsupported") as refused:
            proc.run(scenario, scenario.layers)
        pytest.skip(f"vllm {release}: {str(refused.value).split('unsupported: ', 1)[-1]}")
    records = proc.run(scenario, scenario.layers)
    again = proc.run(scenario, scenario.layers)
    # a nondeterministic oracle is named as such and never becomes a golden
    assert again == records, f"vllm {release} is nondeterministic on {scenario.name}"
    trace = make_trace(f"vllm-{release}", proc.hello, scenario, records)
    path = golden_path(scenario.name, release)
    golden = load_golden(path) if path.exists() else None
    built = golden and golden["provenance"]["environment"].get("build")
    if scenario.engine is not None and built and built != proc.hello["environment"].get("build"):
        # The engine layers' numbers depend on the build (CPU kernels vs CUDA): on another
        # build than the one that wrote the golden, the run is judged within tolerance.
        verdict = judge(trace, golden, "oracle")
        assert verdict.kind in (PASS, NUMERICS), render_verdict(verdict, release)
        pytest.skip(f"{path.name} was written by {built}: judged within tolerance ({verdict.kind}), "
                    "not byte for byte")
    assert trace == snapshot(extension_class=GoldenExtension.for_golden(scenario.name, release))


def test_every_golden_has_a_scenario_and_a_pin():
    from conformance.goldens import orphans

    stray = orphans({s.name for s in SCENARIOS}, PINS.releases)
    assert not stray, f"golden files with no scenario or pin behind them: {[str(p) for p in stray]}"
