"""The parity suite's golden lifecycle: each pinned oracle, on each scenario, must reproduce its
committed golden, by the golden store's one lifecycle (conformance/judging/goldens.py
GoldenStore.update, which `parity goldens` runs too): byte for byte on the machine that wrote
it; elsewhere integer facts exactly and logprobs within the scenario's calibrated tolerance.
`pytest parity --snapshot-update` (make goldens) rewrites a golden that does not hold (or is
unreadable), and only such a one."""

import os

import pytest

from conformance.formats.engine_ref import EngineRef
from conformance.formats.pins import load_pins
from conformance.formats.scenario import at_scale, load_scenario
from conformance.formats.trace import make_trace
from conformance.judging.goldens import GOLDENS, NEW
from conformance.process.client import EngineFailure
from conformance.report.render_text import render_verdict
from conftest import REPO
from parity.golden_extension import GoldenExtension

pytestmark = pytest.mark.oracle
PINS = load_pins()
LIBRARY = [load_scenario(p) for p in sorted(REPO.glob("scenarios/*.json"))]
# Production-scale scenarios (minutes of oracle time each) run here only when asked:
# `make goldens` sets VLLM_PARITY_SCALE=all, a production CI job VLLM_PARITY_SCALE=production;
# `make test` and `make goldens-check` keep to the library.
SCENARIOS = at_scale(LIBRARY, os.environ.get("VLLM_PARITY_SCALE") or "library")


@pytest.mark.parametrize("release", PINS.releases)
@pytest.mark.parametrize("scenario", SCENARIOS, ids=[s.name for s in SCENARIOS])
def test_oracle_reproduces_its_golden(request, snapshot, warm_workers, scenario, release):
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
    trace = make_trace(EngineRef.pin(release).label, proc.hello, scenario, records)
    update = GOLDENS.update(trace, release)
    updating = request.config.option.update_snapshots
    if update.changes and update.action != NEW and not updating:
        check = update.check
        detail = render_verdict(check.verdict, release) if check and check.verdict else ""
        rule = f" ({check.rule} rule)" if check else ""
        pytest.fail(f"{update.path.name} does not hold{rule}: {update.reason}\n{detail}")
    if updating and update.changes:  # what the rewrite changes, before it is written
        summary = update.summary
        plugins = request.config.pluginmanager
        reporter, capture = plugins.get_plugin("terminalreporter"), plugins.get_plugin("capturemanager")
        if reporter and capture:  # shown as the run goes, not captured with the test's output
            with capture.global_and_fixture_disabled():
                reporter.write_line(summary)
    assert trace == snapshot(extension_class=GoldenExtension.for_golden(scenario.name, release))


def test_every_golden_has_a_scenario_and_a_pin():
    stray = GOLDENS.orphans({s.name for s in LIBRARY}, PINS.releases)
    assert not stray, (f"files in goldens/ that are not the golden of a scenario and a pin (a golden of "
                       f"neither, or a killed write's temporary file): {[str(p) for p in stray]}")
