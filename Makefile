# vllm-parity. Everything a fresh machine needs is installed by these targets.
#   make parity   set up, then run every configured engine on the scenarios and print verdicts
#   make test     set up, then run the harness's self-tests and the real-oracle integration tests
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-$(shell cksum < pyproject.toml | cut -d' ' -f1)
# A port to judge, as its command line, e.g. CANDIDATE='./build/port-engine --parity'
CANDIDATE ?=
# The layers to judge, e.g. LAYERS=config,steps,outputs (default: every layer of each scenario);
# the layers a candidate must serve to pass (default: those judged); the features it must declare
# to pass, e.g. REQUIRE_FEATURES=priority_policy,spec:dflash, all or none (default: those the gate
# configuration's own scenarios need, dflash_27b_gate*: spec:dflash, async_scheduling); DRIFT=1
# prints the drift across pins and the per-pin tables beside a candidate's verdicts.
LAYERS ?=
REQUIRE_LAYERS ?=
REQUIRE_FEATURES ?=
DRIFT ?=
# With no CANDIDATE, the other pins stand in as informational candidates, read from their
# committed goldens (STAND_INS=goldens, the default: the first run builds the oracle's
# environment alone) or run live (STAND_INS=live; the default with SCALE=production or all,
# whose goldens hold digests, not the records a report shows at a first difference).
STAND_INS ?=
# The scenarios' scale: library (default), production (the generated production-scale
# scenarios, minutes of oracle time each) or all; `make goldens` too (the library's by default).
SCALE ?=
# The options the gate's plan is made of: `parity envs` given them builds only the pins that
# plan runs (the oracle's alone, unless STAND_INS=live), so a first run waits for one build.
PLAN_OPTIONS = $(strip $(if $(CANDIDATE),--candidate '$(CANDIDATE)',--stand-ins '$(or $(STAND_INS),$(if $(filter-out library,$(SCALE)),live,goldens))') \
	$(if $(LAYERS),--layers '$(LAYERS)') $(if $(SCALE),--scale '$(SCALE)'))
GATE_OPTIONS = $(strip $(PLAN_OPTIONS) $(if $(REQUIRE_LAYERS),--require-layers '$(REQUIRE_LAYERS)') \
	$(if $(REQUIRE_FEATURES),--require-features '$(REQUIRE_FEATURES)') $(if $(DRIFT),--drift))

.PHONY: setup envs plan-envs parity gate test bench goldens goldens-check clean cpp report-check adequacy fuzz bump duplicates \
	commit-fixture bisect

# GNU make exits 0 when every command succeeds and 2 when any fails, whatever the command's own
# status (1 only under `make -q`; the GNU make manual, "How to Run make"). So a gate that
# diverged (parity's status 1) and one that could not compare (2) both make `make` exit 2. The
# targets whose status has a meaning end by printing the command's own status; CI that tells
# 1 from 2 calls .venv/bin/parity itself. $(call SAY_STATUS,what ran,its statuses' meanings)
SAY_STATUS = status=$$?; [ $$status = 0 ] || echo "make $@: $(1) exited with status $$status \
	($(2)); make exits 2 on any failure, so CI that needs this status calls .venv/bin/$(1)" >&2; exit $$status
# The command a target runs, said on stderr (appended: a redirected stderr is never truncated),
# so `make parity > report.txt` leaves the report alone in the file: the gate's progress goes
# to stderr too.
SAY = $(file >>/dev/stderr,$(1))
GATE_STATUSES = 1: a gating engine diverged, 2: a gating run could not be compared or bad input, 3: a bug of the harness (traceback above)
FUZZ_STATUSES = 1: a confirmed finding, 2: bad input, an engine that cannot start, or a finding that did not repeat, 3: a bug of the harness (traceback above)

# The harness's packages are installed by uv (measured: 5 s, against pip's 21 s on a fresh
# machine), itself installed by the venv's pip at the version pyproject.toml pins.
$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --disable-pip-version-check "$$(sed -n 's/^ *"\(uv==[0-9.]*\)".*/\1/p' pyproject.toml)"
	$(BIN)/uv pip install -q --python $(BIN)/python -e '.[test]'
	rm -f $(VENV)/.installed-* && touch $@

setup: $(STAMP)

# One isolated environment per pinned vLLM release, cached outside the clone.
envs: setup
	$(BIN)/parity envs

# Only the environments the gate's plan runs (PLAN_OPTIONS above).
plan-envs: setup
	$(BIN)/parity envs $(PLAN_OPTIONS)

parity: plan-envs
	$(call SAY,$(BIN)/parity gate $(GATE_OPTIONS))@$(BIN)/parity gate $(GATE_OPTIONS); \
		$(call SAY_STATUS,parity gate,$(GATE_STATUSES))

# The release gate: verdicts by engine-matrix row, waivers.toml applied, and three reports
# (junit.xml, summary.md, report.html) in out/gate/.
gate: plan-envs
	$(call SAY,$(BIN)/parity gate --reports out/gate --waivers waivers.toml $(GATE_OPTIONS))@$(BIN)/parity gate \
		--reports out/gate --waivers waivers.toml $(GATE_OPTIONS); \
		$(call SAY_STATUS,parity gate,$(GATE_STATUSES))

# No two places in conformance/, nor two in tests/, share six or more lines of the same shape
# (the `duplicates` command of the developers' tool library, where installed; its rows marked
# `boilerplate`, a small class's or table's shape, pass): the code has one piece for one job, and
# the test files share their helpers (tests/helpers.py) instead of copying them. Fails on any
# other row.
DUPLICATES_IN = conformance tests
duplicates:
	@command -v duplicates >/dev/null || { echo "make duplicates: the duplicates command is not installed here" >&2; exit 2; }
	@for tree in $(DUPLICATES_IN); do echo "$$tree/:"; duplicates --repo $$tree --most 40 --seconds 120; done | tee /dev/stderr \
		| grep -E '^D[0-9]+ ' | grep -v ' boilerplate' >/dev/null \
		&& { echo "make duplicates: places above share six or more lines: make one piece of code serve both" >&2; exit 1; } || true

# The HTML report as a reader sees it: installs chromium with apt-get where it is missing (root
# only), gates the no-draft-reservation mutant (a TEST DEVICE) on the default scenarios, and
# renders its report in headless Chromium in a 1366x768 window (tests/report/test_report_html.py):
# the first screen shows every verdict that did not pass, before the folded grid and the layers
# table; no script error, both budget lines (4036 and 4096) labelled apart, the difference
# panel, the zoom with its per-request table scrolling in its box, the capacity table. The gate
# exits 1 or 2 (the mutant diverges, and its engine crashes on a scenario it overruns): the
# check needs the report it wrote (claiming the folder removed any earlier one).
ORACLE_PIN = from conformance.formats.pins import load_pins; print(load_pins().oracle)
report-check: envs
	@command -v chromium >/dev/null || { [ "$$(id -u)" = 0 ] && apt-get update -qq && \
		DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; } || \
		echo "report-check: chromium is missing and this is not root: the check will skip"
	@mkdir -p out/report-check
	$(BIN)/parity gate --waivers /dev/null \
		--candidate "$$($(BIN)/python -c "$(ORACLE_PIN)")+mutant:no-draft-reservation" \
		--reports out/report-check > out/report-check/report.txt; \
		test $$? -le 2 && test -s out/report-check/report.html  # the mutant diverges, and crashes where it overruns
	VLLM_PARITY_REPORT=out/report-check/report.html $(BIN)/python -m pytest -q tests/report/test_report_html.py

# The C++ adapter kit and its reference engine (engines/cpp/build/): installs g++, make,
# nlohmann-json3-dev and libb2-dev with apt-get where they are missing (root only), then
# builds. Without them it says so in one line and the kit's tests skip.
cpp:
	@sh engines/cpp/build.sh

# Two pytest processes (pytest-xdist), one per core of the project's 2-core machine; tests that
# drive the same warm engine run in the same process (conftest.py), so no engine starts twice.
TEST_WORKERS ?= 2

test: envs cpp
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist loadgroup

# Ratios measured in one run: (a) first divergence vs DeepDiff, (b) driver overhead,
# (c) cold starts per `make parity` run, (d) the engine layers' cost per pin, (h) parity fuzz's
# examples per second, (i) its time to find and shrink a planted divergence, (l) the branches
# it reaches with and without --guide coverage, (m) its time on the engine layers and (n) the
# production-scale scenarios: receive and judge per 10k steps, golden bytes, a deep divergence; then the
# times: (e) make test, (f) make test on a fresh machine, (g) make parity without and with the
# engine layers, (j) make parity on a fresh machine and its cold gate against the warm one
# (BENCH_FRESH=0 leaves (f) and (j) out); (k) the engine layers' logprob noise across ISA
# caps, thread counts and batch layouts, against each scenario's tolerance. A bench that fails
# stops the target with the end of its stderr (all of it in out/bench/). BENCH_QUICK=1 runs each
# bench's smallest case (--quick: a check that every one runs, its figures meaningless; the
# self-tests run it).
BENCH_QUICK ?=
QUICK = $(if $(BENCH_QUICK),--quick)
# $(call bench_step,NAME,COMMAND): COMMAND's figures on stdout; its stderr (progress, engine logs)
# kept in out/bench/NAME.log and, when it fails, its last lines shown with its status
bench_step = { $(2) 2>out/bench/$(1).log || { status=$$?; tail -n 30 out/bench/$(1).log >&2; \
	echo "make bench: $(1) failed with status $$status (the end of its stderr above, all of it in out/bench/$(1).log)" >&2; \
	exit $$status; }; }
bench: envs
	@mkdir -p out/bench
	@$(call bench_step,bench_compare,$(BIN)/python benchmarks/bench_compare.py $(QUICK))
	@$(call bench_step,bench_driver,$(BIN)/python benchmarks/bench_driver.py scenarios/steady_decode.json $(QUICK) \
		>out/bench/bench_driver.out) && grep '^(b)' out/bench/bench_driver.out
	@$(call bench_step,gate,$(BIN)/parity gate $(if $(BENCH_QUICK),--scenario scenarios/steady_decode.json) \
		>out/bench/gate.out) && grep 'cold starts' out/bench/gate.log | sed 's/^\[gate\]/(c) make parity:/'
	@$(call bench_step,bench_engine,$(BIN)/python benchmarks/bench_engine.py $(QUICK))
	@$(call bench_step,bench_scale,$(BIN)/python benchmarks/bench_scale.py --real $(QUICK))
	@$(call bench_step,bench_fuzz,$(BIN)/python benchmarks/bench_fuzz.py $(QUICK))
	@$(call bench_step,bench_times,$(BIN)/python benchmarks/bench_times.py $(QUICK))
	@$(call bench_step,bench_noise,$(BIN)/python benchmarks/bench_noise.py $(QUICK))

# Goldens are written only by the pinned oracles, through `parity goldens` (conformance/regenerate/):
# a summary of each change is printed before the file is replaced atomically. PINS= (releases),
# LAYERS= (the scenarios with any of these layers; `engine`: the engine layers) and SCENARIOS=
# (scenario names) narrow it, each comma-separated; SCALE= (library, production, all; default
# library: a production scenario costs minutes of oracle CPU per pin) picks the scale's scenarios; RESULTS=DIR takes the oracle's traces from a
# gate's results folder (`parity gate --results DIR`) instead of running it again. On a GPU
# runner the only form allowed is the one for the engine goldens no CPU can write:
# `make goldens PINS=0.33.0 LAYERS=engine` (README, GPU runners).
PINS ?=
SCENARIOS ?=
RESULTS ?=
comma := ,
GOLDEN_OPTIONS = $(foreach pin,$(subst $(comma), ,$(PINS)),--engine '$(pin)') $(if $(LAYERS),--layers '$(LAYERS)') \
	$(foreach name,$(subst $(comma), ,$(SCENARIOS)),--scenario 'scenarios/$(name).json') \
	$(if $(RESULTS),--from-results '$(RESULTS)') --scale '$(or $(SCALE),library)'
GOLDEN_STATUSES = 1: an orphan in goldens/, 2: a run failed or bad input
goldens: envs
	$(info $(BIN)/parity goldens $(strip $(GOLDEN_OPTIONS)))@$(BIN)/parity goldens $(GOLDEN_OPTIONS); \
		$(call SAY_STATUS,parity goldens,$(GOLDEN_STATUSES))

# Make release PIN the gate oracle in one reviewable step (parity bump; docs/release-gate.md,
# "Bumping the oracle pin"): checks its CPU rebuild and dependencies (refused: every problem named,
# nothing changed, status 2), edits [tool.vllm-parity], locks its GPU set, builds it, writes the
# goldens it lacks and the pull request's text (out/bump/pull-request.md).
PIN ?=
# $(call shell_quoted,TEXT): TEXT as one shell word, whatever it holds (a ' closes and reopens)
shell_quoted = '$(subst ','\'',$(1))'
BUMP_STATUSES = 2: refused (the checkout unchanged) or stopped, with every reason named
bump: setup
	@test -n $(call shell_quoted,$(PIN)) || { echo "make bump: set PIN, e.g. make bump PIN=0.28.0"; exit 2; }
	$(info $(BIN)/parity bump $(call shell_quoted,$(PIN)))@$(BIN)/parity bump $(call shell_quoted,$(PIN)); \
		$(call SAY_STATUS,parity bump,$(BUMP_STATUSES))

# The TEST FIXTURE upstream repository (conformance/process/commit_fixture.py) in out/vllm-fixture,
# built from the 0.27.1 and 0.28.0 environments with the same shas on every machine: the source of
# the commits pyproject.toml declares. `VLLM_PARITY_ORACLE=aa8f6dc6e67f make parity` then gates
# with the fixture's base commit as the oracle (docs/release-gate.md).
commit-fixture: setup
	$(BIN)/parity envs --pin 0.27.1 --pin 0.28.0
	$(BIN)/python -m conformance.process.commit_fixture out/vllm-fixture

# The port queue of an upstream range (parity bisect; docs/porting.md, "The port queue"):
# FROM= and TO= (commits of the declared commits' source), SCENARIOS= as for goldens.
FROM ?=
TO ?=
bisect: setup
	@test -n '$(FROM)' -a -n '$(TO)' || { echo "make bisect: set FROM and TO, e.g. make bisect FROM=aa8f6dc6e67f TO=cb6196a6fcf4"; exit 2; }
	$(BIN)/parity bisect --from '$(FROM)' --to '$(TO)' $(foreach name,$(subst $(comma), ,$(SCENARIOS)),--scenario 'scenarios/$(name).json') \
		--markdown out/bisect/port-queue.md

# The goldens suite (parity/test_goldens.py, syrupy): every pin on every scenario through the same
# front door, in memory; fails if any golden would change or has no scenario or pin behind it.
# The library's; SCALE=production (or all) checks the production-scale goldens too.
goldens-check: envs
	$(BIN)/python -m pytest -q parity
	$(if $(filter production all,$(SCALE)),$(BIN)/parity goldens --check --scale production)

# The suite's power: coverage of vLLM's scheduling code by the scenarios (every pin) and the
# generated mutant catalogs (the scheduler's; the KV cache manager's and block pool's) judged
# against the gate oracle's goldens (results cached). A cold run of a whole catalog takes over
# 15 min here, so a deterministic sample by default; `make adequacy ADEQUACY_SAMPLE= KV_SAMPLE=`
# runs all of both. The engine path's catalog (sampler, drafters, model runner, numerics)
# starts a whole engine per mutant and scenario: a sample of it too, `ENGINE_SAMPLE=` for all.
# The judge's own catalog runs alone: `.venv/bin/parity adequacy --catalog traces` (docs/adequacy.md).
ADEQUACY_SAMPLE ?= 250
KV_SAMPLE ?= 150
ENGINE_SAMPLE ?= 40
adequacy: envs
	$(BIN)/parity adequacy $(if $(ADEQUACY_SAMPLE),--sample $(ADEQUACY_SAMPLE)) \
		$(if $(KV_SAMPLE),--kv-sample $(KV_SAMPLE)) --seed 13 \
		$(if $(ENGINE_SAMPLE),--engine-sample $(ENGINE_SAMPLE))

# Differential fuzzing: scenarios generated until CANDIDATE first differs from the gate oracle
# (or FUZZ_BUDGET runs out), shrunk to a minimal scenario file in out/fuzz/ and confirmed.
# FUZZ_ARGS adds options, e.g. FUZZ_ARGS='--seed 3 --findings 2 --out scenarios'; the whole engine
# on the tiny models: FUZZ_ARGS='--layers engine_steps,engine_outputs'; guided by the branches
# of the scheduling code the oracle reaches: FUZZ_ARGS='--guide coverage'.
FUZZ_BUDGET ?= 5m
fuzz: envs
	@test -n '$(CANDIDATE)' || { echo "make fuzz: set CANDIDATE, e.g. CANDIDATE='./build/port --parity'"; exit 2; }
	$(info $(BIN)/parity fuzz --candidate '$(CANDIDATE)' --budget $(FUZZ_BUDGET) $(FUZZ_ARGS))@$(BIN)/parity \
		fuzz --candidate '$(CANDIDATE)' --budget $(FUZZ_BUDGET) $(FUZZ_ARGS); $(call SAY_STATUS,parity fuzz,$(FUZZ_STATUSES))

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis
