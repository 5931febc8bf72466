"""The goldens suite: each pinned oracle, on each scenario, must reproduce its committed golden,
through the golden front door that `parity goldens` (make goldens) runs too
(conformance/regenerate/lifecycle.py, GoldenStore.regenerate, once per golden): byte for byte on
the machine that wrote it; elsewhere integer facts exactly and logprobs within the scenario's
calibrated tolerance. With `--snapshot-update` the front door writes a golden that does not
hold (or is unreadable), and only such a one; `make goldens` is the usual way."""

import pytest

from conformance.formats.pins import load_pins
from conformance.formats.scenario import at_scale, load_scenario
from conformance.judging.goldens import GOLDENS, NEW
from conformance.regenerate.lifecycle import golden_trace
from tests.helpers import REPO
from parity.golden_extension import GoldenExtension

pytestmark = pytest.mark.oracle
PINS = load_pins()
LIBRARY = [load_scenario(p) for p in sorted(REPO.glob("scenarios/*.json"))]
# The library only: production-scale scenarios take minutes of oracle time each, so their goldens
# go through the same front door by `parity goldens --scale production` (--check to check them).
SCENARIOS = at_scale(LIBRARY, "library")


@pytest.mark.parametrize("release", PINS.releases)
@pytest.mark.parametrize("scenario", SCENARIOS, ids=[s.name for s in SCENARIOS])
def test_oracle_reproduces_its_golden(request, snapshot, warm_sessions, scenario, release):
    updating = request.config.option.update_snapshots
    plugins = request.config.pluginmanager
    reporter, capture = plugins.get_plugin("terminalreporter"), plugins.get_plugin("capturemanager")

    def say(summary: str) -> None:  # what a rewrite changes, shown before it is written
        if updating and reporter and capture:  # as the run goes, not captured with the test's output
            with capture.global_and_fixture_disabled():
                reporter.write_line(summary)

    outcome = GOLDENS.regenerate(golden_trace(warm_sessions(release), scenario), release, updating, say)
    if outcome.unsupported:  # 0.33.0 on CPU: no CPU build runs its engine; the reason is the engine's own
        pytest.skip(f"vllm {release}: {outcome.unsupported.split('unsupported: ', 1)[-1]}")
    # a nondeterministic oracle is named as such and never becomes a golden
    assert not outcome.failure, f"vllm {release} on {scenario.name}: {outcome.failure}"
    update = outcome.update
    if update.changes and update.action != NEW and not updating:
        pytest.fail(update.explain())  # golden (its path) says X, the oracle run now gives Y
    assert outcome == snapshot(extension_class=GoldenExtension.of(outcome))


def test_every_golden_has_a_scenario_and_a_pin():
    stray = GOLDENS.orphans({s.name for s in LIBRARY}, PINS.declared)
    assert not stray, (f"files in goldens/ that are not the golden of a scenario and a pin (a golden of "
                       f"neither, or a killed write's temporary file): {[str(p) for p in stray]}")
