"""The adequacy measures: the scope rules, the mutation operators, the result cache, and a
small fixed sample of the generated catalog served as candidates (each must be caught)."""

import json
import textwrap

import pytest

from conformance.adequacy.measure import MutantRun, ResultCache, sample, scenario_set_hash
from conformance.adequacy.mutation import generate
from conformance.adequacy.report import kill_figures
from conformance.adequacy.scope import (SCOPE_FILE, Scope, ScopeError, function_scopes, load_scope,
                                        out_of_scope_lines)
from conformance.formats.mutant import Mutant

SOURCE = textwrap.dedent('''\
    class Scheduler:
        def schedule(self, budget, running):
            if self.connector is not None:
                self.connector.start()
            else:
                budget -= 1
            while running and budget > 0:
                request = running.pop()
                budget = min(budget, request.n + 1)
            if budget == 0:
                return None
            return budget

        def stats(self):
            return 3
    ''')
RULES = """
[[measure]]
file = "vllm/v1/core/sched/scheduler.py"
functions = ["Scheduler.*"]
[[out_of_scope]]
function = "Scheduler.stats"
reason = "metrics"
[[out_of_scope]]
line = "connector"
reason = "KV connectors"
[[out_of_scope]]
branch = "^if budget == 0:$"
taken = "true"
reason = "test: the true direction only"
"""
FILE = "vllm/v1/core/sched/scheduler.py"


def scope(tmp_path, text=RULES) -> Scope:
    path = tmp_path / "scope.toml"
    path.write_text(text)
    return load_scope(path)


def test_the_projects_scope_file_loads():
    s = load_scope(SCOPE_FILE)
    assert s.measure and s.rules and all(r.reason for r in s.rules)


@pytest.mark.parametrize("text, message", [
    ("[[out_of_scope]]\nline = 'x'\n", "a reason"),
    ("[[out_of_scope]]\nline = '('\nreason = 'r'\n", "bad regex"),
    ("[[out_of_scope]]\nbranch = 'x'\nreason = 'r'\n", "taken"),
    ("[[measure]]\nfile = 'x'\n", "measure[0]"),
    ("[[measure]]\nfile = 'x'\nfunctions = ['*']\ncallee = 'yes'\n", "measure[0]"),
    ("[[equivalent]]\nid = 'nope'\nreason = 'r'\n", "equivalent[0]"),
    ("surprise = 1\n", "unknown top-level"),
])
def test_a_malformed_scope_file_is_refused_naming_the_entry(tmp_path, text, message):
    with pytest.raises(ScopeError, match=message.replace("[", r"\[").replace("]", r"\]")):
        scope(tmp_path, text)


def test_a_line_rule_takes_the_if_body_but_not_its_else(tmp_path):
    out = out_of_scope_lines(SOURCE, scope(tmp_path))
    # the `if self.connector` header and its body (its `else` stays), and the body of the
    # direction the branch rule names
    assert sorted(out) == [3, 4, 11]
    assert out[3].reason == "KV connectors" and out[11].reason == "test: the true direction only"


def report(executed_lines, missing_lines, executed_arcs, missing_arcs, qualname="Scheduler.schedule"):
    fn = {"executed_lines": executed_lines, "missing_lines": missing_lines,
          "executed_branches": executed_arcs, "missing_branches": missing_arcs}
    return {"files": {f"/env/site-packages/{FILE}": {"functions": {qualname: fn, "Scheduler.stats": {
        "executed_lines": [], "missing_lines": [15], "executed_branches": [], "missing_branches": []}}}}}


def test_function_scopes_count_in_scope_code_and_list_the_rest_by_rule(tmp_path):
    r = report([3, 6, 7, 8, 9, 10, 12], [4, 11], [[3, 6], [7, 8], [7, 10], [10, 12]], [[3, 4], [10, 11]])
    [f, stats] = function_scopes(r, {f"/env/site-packages/{FILE}": SOURCE}, scope(tmp_path))
    assert f.qualname == "Scheduler.schedule" and f.file == FILE
    assert 4 not in f.statements and 11 not in f.statements and 12 in f.covered
    assert f.branches == {(7, 8), (7, 10), (10, 12)}  # 3->x by the line rule, 10->11 by the branch rule
    assert f.missing_branches == []
    assert {arc: rule.reason for arc, rule in f.missing_out_branches.items()} == {
        (3, 4): "KV connectors", (10, 11): "test: the true direction only"}
    assert not stats.statements and 15 in stats.out_lines  # a whole function, still listed


def test_code_the_scheduler_calls_is_measured_and_reported_apart_with_its_own_goal(tmp_path):
    from conformance.adequacy.measure import PinCoverage
    from conformance.adequacy.report import render_coverage, render_goals
    from conformance.adequacy.scope import FunctionScope

    text = RULES + '[[measure]]\nfile = "vllm/v1/core/block_pool.py"\nfunctions = ["*"]\ncallee = true\n'
    s = scope(tmp_path, text)
    assert s.callees == ("vllm/v1/core/block_pool.py",)
    assert s.callee("vllm/v1/core/block_pool.py") and not s.callee(FILE)
    assert s.measured("vllm/v1/core/block_pool.py", "BlockPool.touch")
    assert load_scope(SCOPE_FILE).callee("vllm/v1/core/kv_cache_manager.py")  # the project's scope
    own = FunctionScope(FILE, "Scheduler.schedule", {1, 2}, {1, 2}, {(1, 2)}, {(1, 2)})
    called = FunctionScope("vllm/v1/core/block_pool.py", "BlockPool.touch", {5, 6}, {5}, {(5, 6), (5, 7)}, set())
    cov = PinCoverage("0.27.1", [own, called], {FILE: ["a"] * 9, called.file: ["b"] * 9}, 1.0, s.callees)
    assert cov.totals() == (2, 2, 1, 1) and cov.totals(callees=True) == (1, 2, 0, 2)
    text = render_coverage(cov)
    assert "TOTAL the scheduler (in scope)" in text and "TOTAL what it calls (in scope)" in text
    assert "block_pool.py:5 -> line 6" in text  # the callee's gaps are listed too
    goals, ok = render_goals([cov], [], {})
    # each part has its goal: the scheduler's code meets it, what it calls (0 of 2) misses it
    assert "met  branch coverage in scope >= 90% on vllm 0.27.1: 1/1 = 100.0%" in goals
    assert "MISS branch coverage in scope of what the scheduler calls >= 90% on vllm 0.27.1: 0/2 = 0.0%" in goals
    assert not ok
    called.covered_branches = {(5, 6), (5, 7)}
    assert render_goals([cov], [], {})[1]


def test_all_measured_figures_are_given_per_file_and_ignore_the_rules(tmp_path):
    from conformance.adequacy.measure import PinCoverage
    from conformance.adequacy.report import render_coverage
    from conformance.adequacy.scope import FunctionScope

    rule = load_scope(SCOPE_FILE).rules[0]
    pool = FunctionScope("vllm/v1/core/block_pool.py", "BlockPool.touch", {5, 6}, {5}, {(5, 6)}, {(5, 6)},
                         out_lines={7: rule}, out_branches={(6, 7): rule, (6, 8): rule},
                         missing_out_branches={(6, 8): rule}, executed_out={7})
    queue = FunctionScope("vllm/v1/core/kv_cache_utils.py", "FreeKVCacheBlockQueue.popleft", {3}, set(),
                          {(3, 4)}, set())
    cov = PinCoverage("0.27.1", [pool, queue], {pool.file: ["b"] * 9, queue.file: ["q"] * 9}, 1.0,
                      ("vllm/v1/core/block_pool.py", "vllm/v1/core/kv_cache_utils.py"))
    text = render_coverage(cov).splitlines()
    total = next(i for i, line in enumerate(text) if "TOTAL what it calls (in scope)" in line)
    assert text[total].split()[-4:] == ["1/3", "33.3%", "1/2", "50.0%"]  # in scope
    # out of scope included: line 7 ran, arc 6->7 was taken, 6->8 was not; then each file
    assert text[total + 1].split()[-4:] == ["2/4", "50.0%", "2/4", "50.0%"]
    assert text[total + 2].split() == ["v1/core/block_pool.py", "2/3", "66.7%", "2/3", "66.7%"]
    assert text[total + 3].split() == ["v1/core/kv_cache_utils.py", "0/1", "0.0%", "0/1", "0.0%"]
    # the out-of-scope gaps say which part they are in
    assert "uncovered branches out of scope: 1 (the scheduler 0, what it calls 1), by rule" in "\n".join(text)


def mutants_by_operator(tmp_path):
    found = {}
    for m in generate(SOURCE, FILE, scope(tmp_path)):
        found.setdefault(m.operator, []).append(m)
    return found


def test_every_operator_the_code_allows_is_generated_and_compiles(tmp_path):
    found = mutants_by_operator(tmp_path)
    assert set(found) == {"ror", "cmp-off", "arith-off", "aor", "minmax", "pop", "const", "negate", "remove"}
    for ms in found.values():
        for m in ms:
            compile(m.apply(SOURCE), FILE, "exec")
            assert m.line not in (3, 4, 15)  # never in out-of-scope code
    replacements = {(m.operator, m.original, m.replacement) for ms in found.values() for m in ms}
    assert ("ror", ">", ">=") in replacements
    assert ("ror", "==", "!=") in replacements
    assert ("minmax", "min", "max") in replacements
    assert ("pop", "running.pop()", "running.pop(0)") in replacements
    assert ("negate", "budget == 0", "not (budget == 0)") in replacements
    assert ("remove", "budget -= 1", "pass") in replacements
    assert ("aor", "+", "-") in replacements


def test_a_mutant_has_a_stable_id_a_diff_and_refuses_another_source(tmp_path):
    m = next(m for m in generate(SOURCE, FILE, scope(tmp_path)) if m.operator == "minmax")
    again = next(x for x in generate(SOURCE, FILE, scope(tmp_path)) if x.operator == "minmax")
    assert m == again and m.id.startswith("m") and len(m.id) == 11
    diff = m.diff(SOURCE)
    assert "-            budget = min(budget, request.n + 1)" in diff
    assert "+            budget = max(budget, request.n + 1)" in diff
    assert Mutant.from_json(json.loads(json.dumps(m.to_json()))) == m
    with pytest.raises(ValueError, match="another source"):
        m.apply(SOURCE.replace("min(", "mim("))


def test_the_sample_is_deterministic_and_says_nothing_when_whole(tmp_path):
    ms = generate(SOURCE, FILE, scope(tmp_path))
    assert sample(ms, 5, 1) == sample(ms, 5, 1) and len(sample(ms, 5, 1)) == 5
    assert sample(ms, 5, 1) != sample(ms, 5, 2) or len(ms) <= 5
    assert sample(ms, None, 1) == ms


def test_results_are_cached_by_pin_mutant_and_scenario(tmp_path):
    a, b = generate(SOURCE, FILE, scope(tmp_path))[:2]
    cache = ResultCache(tmp_path / "results.json")
    ka, kb = ResultCache.key("0.27.1", a), ResultCache.key("0.27.1", b)
    hashes = {"s1": "h1", "s2": "h2"}
    assert cache.lookup(ka, hashes) == (None, set())
    cache.record(ka, hashes, {"s1"}, {"killed": True, "kind": "diverged", "scenario": "s2", "where": "x"})
    cache.record(kb, hashes, {"s1", "s2"}, {"killed": False, "kind": "pass"})
    again = ResultCache(tmp_path / "results.json")
    assert again.lookup(ka, hashes)[0] == {"killed": True, "kind": "diverged", "scenario": "s2", "where": "x"}
    assert again.lookup(kb, hashes)[0] == {"killed": False, "kind": "pass"}
    # a changed golden behind s2: the catch is forgotten, the s1 pass is kept
    assert again.lookup(ka, {"s1": "h1", "s2": "h2b"}) == (None, {"s1"})
    # a new scenario: a survivor runs only that one
    assert again.lookup(kb, dict(hashes, s3="h3")) == (None, {"s1", "s2"})


def test_the_scenario_set_hash_follows_the_scenarios():
    from conformance.formats.scenario import load_scenario
    from tests.helpers import REPO

    a = load_scenario(REPO / "scenarios" / "dflash_27b_gate.json")
    b = load_scenario(REPO / "scenarios" / "steady_decode.json")
    assert scenario_set_hash("0.27.1", [a, b]) == scenario_set_hash("0.27.1", [b, a])
    assert scenario_set_hash("0.27.1", [a]) != scenario_set_hash("0.27.1", [a, b])


def test_the_kill_rate_leaves_out_equivalent_mutants(tmp_path):
    ms = generate(SOURCE, FILE, scope(tmp_path))[:4]
    run = MutantRun("0.27.1", 10, [(ms[0], {"killed": True, "kind": "diverged"}),
                                   (ms[1], {"killed": False, "kind": "pass"}),
                                   (ms[2], {"killed": False, "kind": "pass"}),
                                   (ms[3], {"killed": True, "kind": "crash"})])
    killed, counted, equivalent, survivors = kill_figures(run, {ms[1].id: "same result"})
    assert (killed, counted, equivalent) == (2, 3, 1) and [m for m, _ in survivors] == [ms[2]]


def test_parity_adequacy_refuses_a_bad_sample_before_any_engine_starts(capsys):
    from conformance.cli import main

    assert main(["adequacy", "--sample", "0"]) == 2
    assert "--sample 0: expected a positive number of mutants" in capsys.readouterr().err
    assert main(["adequacy", "--engine-sample", "-1"]) == 2
    assert "--engine-sample -1: expected a positive number of mutants" in capsys.readouterr().err


# -- a fixed sample of the generated catalog, served as candidates --------------------------
# (function, operator, original, replacement, text of the mutated line, the scenario that must
# catch it): by release, the seed's bug class (the drafting slots: 0.27.1 reserves them in the
# config, 0.28.0 on charges them per step in the scheduler) and the budget of the running queue
# (0.28.0's input budget binds where 0.27.1's token budget did: removing the token budget's
# decrement changes nothing there); for every release, the preemption victim, the max_tokens stop,
# the priority heap rebuilt after an abort (filtering its list keeps the order, not the heap),
# the min_tokens gate and the repetition check.
BY_RELEASE = {
    "0.27.1": [("VllmConfig._set_max_num_scheduled_tokens", "aor", "-", "+",
                "max_num_batched_tokens - scheduled_token_delta", "dflash_27b_gate"),
               ("Scheduler.schedule", "remove", "token_budget -= num_new_tokens", "pass",
                "token_budget -= num_new_tokens", "prefill_budget_binds")],
    "0.28.0": [("Scheduler.schedule", "aor", "-", "+",
                "request_token_budget = min(token_budget, input_budget - draft_slots)", "prefill_budget_binds"),
               ("Scheduler.schedule", "remove", "input_budget -= num_new_tokens + draft_slots", "pass",
                "input_budget -= num_new_tokens + draft_slots", "prefill_budget_binds")],
}
FIXED_SAMPLE = [
    ("Scheduler.schedule", "pop", "self.running.pop()", "self.running.pop(0)", "self.running.pop()", "kv_pressure"),
    ("check_stop", "ror", ">=", ">", "num_output_tokens >= request.max_tokens", "stop_conditions"),
    ("PriorityRequestQueue.remove_requests", "remove", "heapq.heapify(self._heap)", "pass",
     "heapq.heapify(self._heap)", "abort_priority_heap"),
    # the stops a request asks for: the min_tokens gate one output late, a pattern's tokens
    # compared the wrong way
    ("check_stop", "ror", "<", "<=", "num_output_tokens < sampling_params.min_tokens", "stop_min_tokens"),
    ("_has_repeating_pattern", "ror", "!=", "==", "!= target_token", "stop_repetition"),
]


@pytest.mark.oracle
def test_a_fixed_sample_of_generated_mutants_is_caught():
    from conformance.adequacy.measure import catalog, judge_mutant, mutant_launcher
    from conformance.formats.pins import load_pins
    from conformance.formats.scenario import load_scenario
    from conformance.judging.goldens import GOLDENS
    from tests.helpers import REPO

    pins = load_pins()
    assert pins.oracle in BY_RELEASE, f"choose the budget mutants of vLLM {pins.oracle}'s catalog (BY_RELEASE)"
    mutants, sources = catalog(pins.oracle, load_scope(), log=lambda m: None)
    assert not any(load_scope().callee(m.file) for m in mutants)  # the callees are not mutated
    with mutant_launcher(mutants, log=lambda m: None) as launcher:
        for function, operator, original, replacement, line, name in [*BY_RELEASE[pins.oracle], *FIXED_SAMPLE]:
            chosen = [m for m in mutants if (m.function, m.operator, m.original, m.replacement)
                      == (function, operator, original, replacement)
                      and line in sources[m.file].splitlines()[m.line - 1]]
            assert chosen, f"the catalog has no {operator} mutant {original!r} -> {replacement!r} in {function}"
            scenario = load_scenario(REPO / "scenarios" / f"{name}.json")
            golden = GOLDENS.load(name, pins.oracle)
            result = judge_mutant(launcher, pins.oracle, chosen[0], [scenario], {name: golden})
            assert result["killed"], f"{chosen[0].name} survived {name}: {result}"


def test_asserts_parameter_defaults_and_dead_stores_are_not_mutated(tmp_path):
    source = textwrap.dedent('''\
        class Scheduler:
            def schedule(self, budget, flag=False):
                assert budget >= 0
                self.kv_state = {}
                self.steps = 1
                if self.connector is not None:
                    self.connector.save(self.kv_state)
                return budget + self.steps
        ''')
    found = {(m.line, m.operator) for m in generate(source, FILE, scope(tmp_path))}
    assert not any(line in (2, 3, 4) for line, _ in found)  # default, assert, a store only connectors read
    assert (5, "remove") in found and (8, "aor") in found


# -- the engine path's catalog (conformance/adequacy/engine_path.py) ------------------------------

ENGINE_SOURCE = textwrap.dedent('''\
    class RMSNorm:
        def __init__(self, eps):
            self.variance_epsilon = eps
            if eps > 1:
                self.big = True

        def again(self, eps):
            self.variance_epsilon = eps
    ''')


def test_a_hand_written_edit_lands_once_in_its_function_or_is_refused():
    from conformance.adequacy.mutation import hand_edit
    from conformance.adequacy.scope import Edit

    m = hand_edit(ENGINE_SOURCE, "vllm/x.py", Edit("vllm/x.py", "RMSNorm.__init__", "self.variance_epsilon = eps",
                                                   "self.variance_epsilon = eps * 10", "eps x10"))
    assert (m.operator, m.line, m.function) == ("edit", 3, "RMSNorm.__init__")
    assert "self.variance_epsilon = eps * 10" in m.apply(ENGINE_SOURCE).splitlines()[2]
    assert m.apply(ENGINE_SOURCE).splitlines()[7].strip() == "self.variance_epsilon = eps"  # not in `again`
    with pytest.raises(ValueError, match="no function RMSNorm.nope"):
        hand_edit(ENGINE_SOURCE, "vllm/x.py", Edit("vllm/x.py", "RMSNorm.nope", "eps", "1", "r"))
    with pytest.raises(ValueError, match="occurs 4 times"):
        hand_edit(ENGINE_SOURCE, "vllm/x.py", Edit("vllm/x.py", "RMSNorm.__init__", "eps", "1", "r"))


def test_a_malformed_edit_is_refused_naming_the_entry(tmp_path):
    text = "[[edit]]\nfile = 'a.py'\nfunction = 'f'\noriginal = 'x'\nreplacement = 'x'\nreason = 'r'\n"
    with pytest.raises(ScopeError, match=r"edit\[0\]"):
        scope(tmp_path, text)


def test_a_mutant_in_a_packages_init_is_installed_into_the_package_itself():
    from engines.vllm.mutant_catalog import module_name

    assert module_name("vllm/model_executor/layers/rotary_embedding/__init__.py") == \
        "vllm.model_executor.layers.rotary_embedding"
    assert module_name("vllm/v1/sample/sampler.py") == "vllm.v1.sample.sampler"


def test_run_lines_take_a_statement_whole_and_a_compound_header_only():
    from conformance.adequacy.mutation import run_lines

    source = "x = f(\n    1)\nif x:\n    y = 2\nelse:\n    y = 3\n"
    assert run_lines(source, {1, 3, 4}) == {1, 2, 3, 4}  # line 6 never ran


def test_the_engine_scope_file_loads_and_orders_the_engine_scenarios():
    from conformance.adequacy.engine_path import ENGINE_ORDER, ENGINE_SCOPE_FILE, engine_scenarios
    from conformance.formats.scenario import load_scenario
    from tests.helpers import REPO

    s = load_scope(ENGINE_SCOPE_FILE)
    assert s.measure and len(s.edits) >= 4 and all(e.reason for e in s.edits)
    library = [load_scenario(p) for p in sorted((REPO / "scenarios").glob("*.json"))]
    names = [x.name for x in engine_scenarios(library)]
    assert names[:len(ENGINE_ORDER)] == [n for n in ENGINE_ORDER if n in names]
    assert all(x.engine is not None for x in engine_scenarios(library))


def test_the_engine_path_goal_is_its_own_line_and_can_be_missed(tmp_path):
    from conformance.adequacy.report import render_goals

    ms = generate(SOURCE, FILE, scope(tmp_path))[:10]
    run = MutantRun("0.27.1", 10, [(m, {"killed": i < 8, "kind": "diverged" if i < 8 else "pass"})
                                   for i, m in enumerate(ms)], what="engine path")
    text, ok = render_goals([], [], {}, run, {})
    assert not ok and "MISS non-equivalent engine-path mutants" in text and "8/10 = 80.0%" in text
    text, ok = render_goals([], [], {}, run, {ms[8].id: "r", ms[9].id: "r"})
    assert ok and "8/8 = 100.0%" in text


# (function, operator, original, replacement, text of the mutated line, the scenario that must
# catch it): the model runner's spec-decode metadata, the CPU wrapper of the greedy rejection
# kernel, and a logit scale (every greedy token kept, the top-k logprobs moved).
ENGINE_FIXED_SAMPLE = [
    ("GPUModelRunner._calc_spec_decode_metadata", "aor", "-", "+",
     "bonus_logits_indices = cu_num_sampled_tokens - 1", "engine_ngram"),
    ("_rejection_greedy_sample_kernel_impl", "remove", None, "pass",
     "output_token_ids.copy_(output_token_ids_i64.to(orig_dtype))", "engine_ngram"),
    ("LogitsProcessor.__init__", "edit", "self.scale = scale", "self.scale = scale * 1.05",
     "self.scale = scale", "engine_ngram"),
]


@pytest.mark.oracle
def test_a_fixed_sample_of_engine_path_mutants_is_caught():
    from conformance.adequacy.engine_path import ENGINE_SCOPE_FILE, engine_catalog
    from conformance.adequacy.measure import judge_mutant, mutant_launcher
    from conformance.formats.pins import load_pins
    from conformance.formats.scenario import load_scenario
    from conformance.judging.goldens import GOLDENS
    from tests.helpers import REPO

    pins = load_pins()
    engine_scope = load_scope(ENGINE_SCOPE_FILE)
    # every line counts as run here: the fixed sample names lines the engine scenarios run
    every = {f: set(range(1, 20000)) for f, _ in engine_scope.measure}
    mutants, sources, _ = engine_catalog(pins.oracle, engine_scope, every, log=lambda m: None)
    with mutant_launcher(mutants, log=lambda m: None) as launcher:
        for function, operator, original, replacement, line, name in ENGINE_FIXED_SAMPLE:
            chosen = [m for m in mutants if (m.function, m.operator, m.replacement) == (function, operator, replacement)
                      and original in (None, m.original) and line in sources[m.file].splitlines()[m.line - 1]]
            assert chosen, f"the engine catalog has no {operator} mutant -> {replacement!r} in {function}"
            scenario = load_scenario(REPO / "scenarios" / f"{name}.json")
            result = judge_mutant(launcher, pins.oracle, chosen[0], [scenario], {name: GOLDENS.load(name, pins.oracle)})
            assert result["killed"], f"{chosen[0].name} survived {name}: {result}"


# -- the catalogs: the scheduler's, and the KV cache manager's and block pool's -----------------

POOL_SOURCE = textwrap.dedent('''\
    class BlockPool:
        def get_new_blocks(self, n):
            if n > self.free:
                raise ValueError(n)
            return self.queue.popleft_n(n)
    ''')


def test_the_catalogs_split_the_measured_files_between_the_scheduler_and_what_it_calls(tmp_path, monkeypatch):
    from conformance.adequacy import measure

    site = tmp_path / "site"
    for rel, text in ((FILE, SOURCE), ("vllm/v1/core/block_pool.py", POOL_SOURCE)):
        (site / rel).parent.mkdir(parents=True, exist_ok=True)
        (site / rel).write_text(text, encoding="utf-8")
    monkeypatch.setattr(measure, "ensure_env", lambda release, log=None: tmp_path / "python")
    monkeypatch.setattr(measure, "site_packages", lambda python: site)
    monkeypatch.setattr(measure, "MEASURED", ("*/vllm/v1/core/sched/*.py", "*/vllm/v1/core/block_pool.py"))
    s = scope(tmp_path, RULES + '[[measure]]\nfile = "vllm/v1/core/block_pool.py"\nfunctions = ["*"]\ncallee = true\n')
    own, own_sources = measure.catalog("0.27.1", s, lambda m: None, "scheduler")
    kv, kv_sources = measure.catalog("0.27.1", s, lambda m: None, "kv")
    assert {m.file for m in own} == set(own_sources) == {FILE}
    assert {m.file for m in kv} == set(kv_sources) == {"vllm/v1/core/block_pool.py"}
    assert {m.function for m in kv} == {"BlockPool.get_new_blocks"}
    assert not {m.id for m in own} & {m.id for m in kv}
    with pytest.raises(ValueError, match="expected one of scheduler, kv"):
        measure.catalog("0.27.1", s, lambda m: None, "both")


def test_each_catalog_is_reported_in_its_own_block_with_its_own_goal(tmp_path):
    from conformance.adequacy.measure import GOAL_KILLED
    from conformance.adequacy.report import render_goals, render_mutants

    assert GOAL_KILLED == 97.0
    ms = generate(SOURCE, FILE, scope(tmp_path))
    assert len(ms) == 18
    own = MutantRun("0.27.1", 18, [(m, {"killed": True, "kind": "diverged"}) for m in ms], scenarios=3, tier=2)
    kv = MutantRun("0.27.1", 18, [(m, {"killed": i > 0, "kind": "diverged" if i else "pass"})
                                  for i, m in enumerate(ms)], scenarios=3, what="kv")
    sources = {FILE: SOURCE}
    assert render_mutants(own, sources, {}).startswith("== generated mutants of the scheduler: vllm 0.27.1")
    assert "then for a survivor the engine-layer tier" in render_mutants(own, sources, {})
    kv_text = render_mutants(kv, sources, {})
    assert kv_text.startswith("== generated mutants of the KV cache manager and the block pool: vllm 0.27.1")
    assert "engine-layer tier" not in kv_text and f"SURVIVED {ms[0].name}" in kv_text
    text, ok = render_goals([], [own, kv], {})
    assert "met  non-equivalent mutants of the scheduler caught >= 97% on vllm 0.27.1: 18/18 = 100.0%" in text
    assert "MISS non-equivalent mutants of the KV cache manager and the block pool caught >= 97% on " \
           "vllm 0.27.1: 17/18 = 94.4%" in text and not ok
    text, ok = render_goals([], [own, kv], {ms[0].id: "equivalent, with its reason"})
    assert "met  non-equivalent mutants of the KV cache manager and the block pool caught >= 97% on " \
           "vllm 0.27.1: 17/17 = 100.0%" in text and ok


def test_parity_adequacy_offers_the_kv_catalog_and_refuses_a_bad_kv_sample(capsys):
    from conformance.cli import main

    assert main(["adequacy", "--kv-sample", "0", "--catalog", "kv"]) == 2
    assert "--kv-sample 0: expected a positive number of mutants" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["adequacy", "--catalog", "both"])  # the old name: scheduler, kv, engine or all
    assert "invalid choice: 'both'" in capsys.readouterr().err


# -- the project's scope: prefix caching and aborts in, what only other families reach out ------

def _function_rule(s: Scope, qualname: str):
    import fnmatch

    return next((r for r in s.rules if r.function and fnmatch.fnmatchcase(qualname, r.function)), None)


@pytest.mark.parametrize("qualname", [
    "BlockPool.get_cached_block", "BlockPool.cache_full_blocks", "BlockPool.touch",
    "BlockPool._maybe_evict_cached_block", "BlockPool._insert_block_hash", "BlockPool._remove_cached_block_hashes",
    "BlockHashToBlockMap.insert", "BlockHashToBlockMap.pop", "FullAttentionManager.find_longest_cache_hit",
    "UnitaryKVCacheCoordinator.find_longest_cache_hit", "KVCacheCoordinator.allocate_new_computed_blocks",
    "SingleTypeKVCacheManager.add_local_computed_blocks", "SingleTypeKVCacheManager.cache_blocks",
    "KVCacheCoordinator.cache_blocks", "Scheduler.finish_requests", "FCFSRequestQueue.remove_requests",
    "PriorityRequestQueue.remove_requests", "FreeKVCacheBlockQueue.popleft_n", "KVCacheBlock.reset_hash",
])
def test_prefix_caching_and_aborts_are_in_scope(qualname):
    assert _function_rule(load_scope(SCOPE_FILE), qualname) is None


@pytest.mark.parametrize("qualname, because", [
    ("BlockPool.cache_partial_block", "fine-grained prefix hashing"),
    ("BlockPool._get_partial_block_hash", "fine-grained prefix hashing"),
    ("BlockPool.move_block_hashes", "fine-grained prefix hashing"),
    ("FullAttentionManager._cache_partial_tail_block", "fine-grained prefix hashing"),
    ("SingleTypeKVCacheManager._apply_cow", "partial prefix-cache hits"),
    ("SingleTypeKVCacheManager._remove_blocks_in_range", "full attention frees no block"),
    ("SingleTypeKVCacheManager.remove_skipped_blocks", "full attention skips no token"),
    ("KVCacheManager.estimate_cached_tokens", "metrics"),
    ("KVCacheManager.cache_blocks", "KV connectors"),
    ("FCFSRequestQueue.remove_request", "through remove_requests"),
    ("FreeKVCacheBlockQueue.iter_blocks_after", "KV connectors"),
    ("MambaManager.find_longest_cache_hit", "mamba"),
])
def test_what_only_other_families_reach_stays_out_of_scope_with_its_reason(qualname, because):
    rule = _function_rule(load_scope(SCOPE_FILE), qualname)
    assert rule is not None and because in rule.reason, rule


def test_no_rule_says_prefix_caching_is_off_or_that_nothing_aborts():
    reasons = [r.reason for r in load_scope(SCOPE_FILE).rules] + list(load_scope(SCOPE_FILE).equivalent.values())
    assert not [r for r in reasons if "enable_prefix_caching false" in r or "prefix caching off" in r]
    assert not [r for r in reasons if "has no aborts" in r or "never aborts" in r]


def test_the_kv_cache_utils_functions_of_the_block_pool_are_measured_as_callees():
    s = load_scope(SCOPE_FILE)
    utils = "vllm/v1/core/kv_cache_utils.py"
    assert s.callee(utils)
    for qualname in ("FreeKVCacheBlockQueue.popleft_n", "KVCacheBlock.reset_hash", "hash_block_tokens",
                     "get_request_block_hasher.request_block_hasher"):
        assert s.measured(utils, qualname), qualname
    assert not s.measured(utils, "get_kv_cache_configs")  # start-up sizing: not the block pool


KV_SOURCE = textwrap.dedent('''\
    class FullAttentionManager:
        def find_longest_cache_hit(cls, block_hashes, fine_grained, drop_eagle_block, hit_length):
            if fine_grained:
                hit_length = 1
            if drop_eagle_block and hit_length > 0:
                hit_length -= 16
            return hit_length

    class BlockPool:
        def get_new_blocks(self, num_blocks):
            if num_blocks > self.get_num_free_blocks():
                raise ValueError(num_blocks)
            if self.metrics_collector:
                self.metrics_collector.on_block_allocated()
            return num_blocks

    class Scheduler:
        def finish_requests(self, request_ids):
            if isinstance(request_ids, str):
                request_ids = (request_ids,)
            elif request_ids is not None:
                request_ids = set(request_ids)
            return request_ids
    ''')


def test_the_new_branch_rules_take_only_the_direction_other_families_reach():
    out = out_of_scope_lines(KV_SOURCE, load_scope(SCOPE_FILE))
    assert 4 in out and "fine-grained" in out[4].reason  # the fine-grained hit
    assert 5 not in out and 6 not in out  # EAGLE's dropped block: in scope with prefix caching on
    assert 12 in out and "defensive" in out[12].reason  # the pool is asked only for blocks that fit
    assert 14 in out and "metrics" in out[14].reason
    assert 19 not in out and 20 not in out  # one id per finish_requests call: in scope
    assert {21, 22} <= set(out) and "one request each" in out[21].reason  # a collection of ids: out


def test_a_mutant_that_removes_the_only_super_call_is_installed(tmp_path, monkeypatch):
    """Removing `super().__init__(...)` drops the code's `__class__` cell, so its code object
    cannot go into the existing method (a ValueError: closure of length 1, not 0): the mutant
    was never installed, counted as a survivor. It replaces the method on its class instead."""
    import sys

    from engines.vllm import mutant_catalog

    source = textwrap.dedent('''\
        class Base:
            def __init__(self):
                self.pool = "blocks"

        class Coordinator(Base):
            def __init__(self):
                super().__init__()
                self.ready = True
        ''')
    package = tmp_path / "parity_test_pkg"
    package.mkdir()
    (package / "__init__.py").write_text("", encoding="utf-8")
    (package / "coordinator.py").write_text(source, encoding="utf-8")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(mutant_catalog, "INSTALLED", None)
    import parity_test_pkg.coordinator as module

    a = source.index("super().__init__()")
    mutant = Mutant("m0000000001", "parity_test_pkg/coordinator.py", "Coordinator.__init__", "remove", 7,
                    a, a + len("super().__init__()"), "super().__init__()", "pass")
    try:
        assert module.Coordinator().pool == "blocks"
        mutant_catalog.install(mutant)
        made = module.Coordinator()
        assert made.ready and not hasattr(made, "pool")  # the edit is in, the rest of the method too
        assert mutant_catalog.INSTALLED == mutant.id
    finally:
        sys.modules.pop("parity_test_pkg.coordinator", None)
        sys.modules.pop("parity_test_pkg", None)
