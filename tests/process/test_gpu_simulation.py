"""The GPU runner path, proven on CPU by simulation: every GPU-only decision, driven with a fake
`nvidia-smi` (a TEST DOUBLE on PATH) and, inside a pin's environment, the oracle's own GPU
branches with only vLLM's platform answer and torch.cuda's memory answer faked
(tests/doubles/gpu_branch_probe.py, a TEST DEVICE). None of these tests needs a GPU or skips.
What only a real GPU can settle is listed in the README (GPU runners)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests import warm_engines
from conformance.formats import gpu, precision, settings
from conformance.formats.engine_ref import EngineRef
from conformance.formats.pins import load_pins
from conformance.formats.protocol import ENGINE_LAYERS
from conformance.formats.scenario import load_scenario
from conformance.gate.engines import refused
from conformance.gate.execute import default_parallel
from conformance.process import envs
from conformance.process.client import EngineProcess
from conformance.process.launch import prepare_engine
from conformance.process.session import EngineSession
from tests.helpers import REPO

PINS = load_pins()
GiB = 1 << 30
FAKE_SMI = """#!{python}
# TEST DOUBLE of nvidia-smi: one GPU, its memory read from FAKE_GPU_FREE_MIB / FAKE_GPU_TOTAL_MIB
import os, sys
with open(os.environ["FAKE_GPU_CALLS"], "a") as calls:
    calls.write(" ".join(sys.argv[1:]) + "\\n")
if os.environ.get("FAKE_GPU_BROKEN"):
    sys.exit(9)  # a driver that does not answer
if "-L" in sys.argv:
    print("GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-00000000-fake)")
elif any(a.startswith("--query-gpu=") for a in sys.argv):
    print(os.environ.get("FAKE_GPU_ANSWER") or
          f"{{os.environ['FAKE_GPU_FREE_MIB']}}, {{os.environ['FAKE_GPU_TOTAL_MIB']}}")
"""


@pytest.fixture
def fake_gpu(tmp_path, monkeypatch):
    """A fake `nvidia-smi` first on PATH, no $VLLM_PARITY_DEVICE; returns a function that sets
    the GPU's free and total memory (GiB) and the file logging each call."""
    bin_dir = tmp_path / "fake-bin"
    bin_dir.mkdir()
    smi = bin_dir / "nvidia-smi"
    smi.write_text(FAKE_SMI.format(python=sys.executable))
    smi.chmod(0o755)
    calls = tmp_path / "calls.log"
    calls.touch()
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_GPU_CALLS", str(calls))
    monkeypatch.delenv("VLLM_PARITY_DEVICE", raising=False)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)

    def memory(free_gib: float, total_gib: float = 80) -> Path:
        monkeypatch.setenv("FAKE_GPU_FREE_MIB", str(int(free_gib * 1024)))
        monkeypatch.setenv("FAKE_GPU_TOTAL_MIB", str(int(total_gib * 1024)))
        return calls

    memory(79)
    return memory


def _no_gpu(monkeypatch, tmp_path):
    empty = tmp_path / "empty-bin"
    empty.mkdir(exist_ok=True)
    monkeypatch.setenv("PATH", str(empty) + os.pathsep + "/usr/bin" + os.pathsep + "/bin")
    monkeypatch.delenv("VLLM_PARITY_DEVICE", raising=False)


# --- one device decision, made once ------------------------------------------------------


def test_a_working_nvidia_smi_means_gpu_and_is_asked_once(fake_gpu):
    calls = fake_gpu(79)
    assert [settings.device_mode() for _ in range(3)] == ["gpu"] * 3
    assert calls.read_text().splitlines() == ["-L"]


def test_a_failing_or_missing_nvidia_smi_means_cpu(fake_gpu, monkeypatch, tmp_path):
    monkeypatch.setenv("FAKE_GPU_BROKEN", "1")
    assert settings.device_mode() == "cpu"
    _no_gpu(monkeypatch, tmp_path)
    assert settings.device_mode() == "cpu"


def test_the_setting_wins_over_nvidia_smi_and_a_bad_one_is_refused(fake_gpu, monkeypatch):
    monkeypatch.setenv("VLLM_PARITY_DEVICE", "cpu")
    assert settings.device_mode() == "cpu"
    monkeypatch.setenv("VLLM_PARITY_DEVICE", "cuda")
    with pytest.raises(settings.SettingError, match="VLLM_PARITY_DEVICE must be 'cpu' or 'gpu', not 'cuda'"):
        settings.device_mode()


def test_every_worker_is_told_the_device(fake_gpu, monkeypatch, tmp_path):
    """The defect: environments were built for a GPU but the worker, started without
    --device, booted vLLM on CpuPlatform and refused every engine layer."""
    from conformance.process import coverage_run

    monkeypatch.setattr(envs, "ensure_env", lambda release, log=print, pins=None, say_cached=False: Path("/env/bin/python"))
    for text in ("0.27.1", "0.33.0", f"{PINS.oracle}+mutant:no-draft-reservation"):
        argv = prepare_engine(EngineRef.parse(text, PINS), PINS).argv
        assert argv[argv.index("--device") + 1] == "gpu", argv
    measured = coverage_run.measured_worker("0.28.0", Path("/env/bin/python"), tmp_path, tmp_path / "rc", tmp_path / "d")
    assert measured.argv[measured.argv.index("--device") + 1] == "gpu"
    _no_gpu(monkeypatch, tmp_path)
    argv = prepare_engine(EngineRef.pin("0.27.1"), PINS).argv
    assert argv[argv.index("--device") + 1] == "cpu"


def test_a_worker_started_without_a_device_refuses_to_guess():
    worker = REPO / "engines" / "vllm" / "worker.py"
    result = subprocess.run([sys.executable, str(worker), "--release", PINS.oracle],
                            capture_output=True, text=True, stdin=subprocess.DEVNULL)
    assert result.returncode == 2 and "--device" in result.stderr, result.stderr


def test_on_a_gpu_the_gate_refuses_no_engine_layer_up_front(fake_gpu, monkeypatch, tmp_path):
    engines = [EngineRef.pin(r).with_role("stand-in") for r in PINS.releases]
    assert refused(engines, PINS, settings.device_mode()) == frozenset()
    _no_gpu(monkeypatch, tmp_path)
    without = [r for r in PINS.releases if not PINS.cpu_engine_build(r)]
    assert refused(engines, PINS, settings.device_mode()) == frozenset((f"vllm-{r}", "engine") for r in without)
    # a mutant is its pin's build; a command line says what it serves through its hello
    others = [EngineRef.test_device(without[0], "m"), EngineRef.parse("./port", PINS)]
    assert refused(others, PINS, "cpu") == frozenset({(others[0].key, "engine")})


@pytest.mark.oracle
def test_a_gpu_worker_serves_the_engine_layers_and_records_its_runner(fake_gpu, monkeypatch):
    """The whole harness-to-worker path: the device decided from the fake nvidia-smi, the
    worker started with it, booted as on a GPU. The pin is 0.33.0, whose engine layers a CPU
    worker refuses; its CPU environment stands in for the GPU one (same vLLM sources)."""
    monkeypatch.setenv("VLLM_PARITY_DEVICE", "cpu")
    python = envs.ensure_env("0.33.0", log=lambda m: None)
    monkeypatch.delenv("VLLM_PARITY_DEVICE")
    monkeypatch.setattr(envs, "ensure_env", lambda release, log=print, pins=None, say_cached=False: python)
    with EngineProcess(prepare_engine(EngineRef.pin("0.33.0"), PINS)) as proc:
        hello = proc.hello
    assert set(ENGINE_LAYERS) <= set(hello["capabilities"]), hello["capabilities"]
    assert hello["environment"]["device"] == "gpu"
    assert hello["environment"]["model_runner"].startswith("v1 (VLLM_USE_V2_MODEL_RUNNER=0")
    # what decides the floats, in every trace's provenance (a CPU torch stands in here: no CUDA)
    assert {k: hello["environment"][k] for k in ("float32_matmul_precision", "batch_invariant", "cuda")} == {
        "float32_matmul_precision": "highest", "batch_invariant": False, "cuda": None}


# --- float32 matmul precision: full float32, or refused ------------------------------------


@pytest.mark.parametrize("value", ["high", "medium", "tf32"])
def test_only_full_float32_is_judged_and_another_precision_is_named(value):
    assert precision.refusal(None) is None and precision.refusal("highest") is None
    reason = precision.refusal(value)
    assert reason.startswith(f"VLLM_FLOAT32_MATMUL_PRECISION={value!r}: ")
    assert "far past the goldens' 0.001 logprob tolerance" in reason and "refused, not judged" in reason
    assert {"high": "TF32", "medium": "bfloat16"}.get(value, "is not 'highest'") in reason
    assert "about 1.5e-2" in precision.refusal("high")


@pytest.mark.oracle
def test_a_gpu_worker_set_to_tf32_refuses_the_engine_layers_by_name(fake_gpu, monkeypatch):
    """A runner whose environment asks vLLM for TF32 matmuls: the worker, booted as on a GPU,
    serves no engine layer and says why; nothing is judged. The stand-in layers, which run no
    model, are still served. The pin is 0.33.0, its CPU environment standing in for the GPU one."""
    monkeypatch.setenv("VLLM_PARITY_DEVICE", "cpu")
    python = envs.ensure_env("0.33.0", log=lambda m: None)
    monkeypatch.delenv("VLLM_PARITY_DEVICE")
    monkeypatch.setattr(envs, "ensure_env", lambda release, log=print, pins=None, say_cached=False: python)
    monkeypatch.setenv("VLLM_FLOAT32_MATMUL_PRECISION", "high")
    scenario = load_scenario(REPO / "scenarios/engine_ngram.json")
    with EngineSession(prepare_engine(EngineRef.pin("0.33.0"), PINS)) as session:
        trace = session.trace(scenario, ["engine_config", "engine_steps", "engine_outputs"])
        hello = session.hello
        config = session.trace(scenario, ["config"])
    assert not set(ENGINE_LAYERS) & set(hello["capabilities"]) and "config" in hello["capabilities"]
    assert hello["environment"]["float32_matmul_precision"] == "high"  # the provenance says what was asked
    assert trace.failure.kind == "unsupported", trace.failure
    assert precision.refusal("high") in trace.failure.message
    assert not any(trace.layers.get(layer) for layer in ENGINE_LAYERS)
    assert config.failure is None and config.layers["config"]


# --- GPU memory: a budget per engine, engines side by side from free memory ---------------


def test_the_free_memory_decides_how_many_engines_run_side_by_side(fake_gpu, monkeypatch):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(64)))
    fake_gpu(79)
    assert gpu.memory() == (79 * GiB, 80 * GiB)
    assert default_parallel("gpu") == 79 // 4 == 19
    fake_gpu(9)  # another job holds most of the GPU
    assert default_parallel("gpu") == 2
    fake_gpu(3)  # not even one budget: one engine, which fails with vLLM's own message
    assert default_parallel("gpu") == 1
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1})
    fake_gpu(79)
    assert default_parallel("gpu") == 2  # one engine per core
    assert default_parallel("cpu") == 2


def test_warm_engines_per_pytest_process_follow_free_memory(fake_gpu):
    fake_gpu(79)
    assert warm_engines.max_warm("gpu", 2, 3) == warm_engines.MAX_WARM == 3
    fake_gpu(17)  # four budgets, two processes
    assert warm_engines.max_warm("gpu", 2, 3) == 2
    fake_gpu(5)
    assert warm_engines.max_warm("gpu", 2, 3) == 1
    assert warm_engines.max_warm("cpu", 2, 3) == warm_engines.MAX_WARM


def test_warm_engines_scale_with_the_pins(fake_gpu):
    """With more pins than MAX_WARM, the goldens suite (every scenario on every pin in turn) keeps
    one engine per pin warm instead of cold-starting one for nearly every test."""
    assert warm_engines.max_warm("cpu", 1, 5) == 5
    assert warm_engines.max_warm("cpu", 1, 1) == warm_engines.MAX_WARM
    fake_gpu(79)
    assert warm_engines.max_warm("gpu", 1, 5) == 5
    fake_gpu(17)  # four budgets: the GPU's memory still caps it
    assert warm_engines.max_warm("gpu", 1, 5) == 4


def test_the_gpu_named_by_cuda_visible_devices_is_read(fake_gpu, monkeypatch):
    calls = fake_gpu(79)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,1")
    gpu.memory()
    assert calls.read_text().splitlines()[-1].endswith("-i 3")


def test_an_answer_nvidia_smi_does_not_give_in_mib_is_named(fake_gpu, monkeypatch):
    monkeypatch.setenv("FAKE_GPU_ANSWER", "[N/A], [N/A]")
    with pytest.raises(gpu.GpuError, match=r"answered '\[N/A\], \[N/A\]'.*not 'FREE, TOTAL' in MiB"):
        gpu.memory()


@pytest.mark.parametrize("total_gib", [8, 24, 80, 141])
def test_a_tiny_engine_asks_for_its_budget_and_an_explicit_kv_cache(total_gib):
    total = total_gib * GiB
    memory = gpu.engine_memory(total, tiny=True)
    assert memory["kv_cache_memory_bytes"] == 256 << 20
    # vLLM starts an engine only when free memory >= gpu_memory_utilization x total
    asked = memory["gpu_memory_utilization"] * total
    assert gpu.ENGINE_BYTES <= asked < gpu.ENGINE_BYTES + total / 1000 + 1
    assert gpu.engine_memory(total, tiny=False) == {}  # a real checkpoint: vLLM's default, alone


# --- the oracle's own GPU branches inside a pin's environment (real vLLM) ------------------


@pytest.fixture(scope="module")
def probe(tmp_path_factory):
    """What the oracle's GPU branches decide, read in the gate oracle's environment."""
    real = tmp_path_factory.mktemp("real-weights")
    (real / "config.json").write_text((REPO / "scenarios/models/tiny-qwen3/config.json").read_text())
    (real / "model.safetensors").write_bytes(b"")  # a checkpoint folder: weights present
    python = envs.ensure_env(PINS.oracle, log=lambda m: None)
    result = subprocess.run(
        [str(python), str(REPO / "tests/doubles/gpu_branch_probe.py"),
         str(REPO / "scenarios/models/tiny-qwen3"), str(real)],
        capture_output=True, text=True, stdin=subprocess.DEVNULL,
        env={**{k: v for k, v in os.environ.items() if k != precision.SETTING}, "VLLM_PARITY_DEVICE": "gpu"})
    lines = [line for line in result.stdout.splitlines() if line.startswith("PROBE ")]
    assert result.returncode == 0 and lines, result.stderr[-3000:]
    return json.loads(lines[-1][len("PROBE "):])


@pytest.mark.oracle
def test_a_gpu_worker_pins_the_v1_model_runner_and_records_it(probe):
    assert probe["runner_setting"] == "0" and probe["runner_read_by_vllm"] is False
    env = probe["environment"]
    assert env["device"] == "gpu" and env["model_runner"].startswith("v1")
    assert probe["engine_layers_served"] == sorted(ENGINE_LAYERS)


@pytest.mark.oracle
def test_the_methods_layer_still_reports_an_unpinned_gpu_hosts_runner(probe):
    assert probe["runner_read_by_methods_layer"] is None  # vLLM's own choice, as with no pin
    assert probe["runner_read_after_methods_layer"] is False  # the pin is back for the others


@pytest.mark.oracle
def test_a_gpu_engine_gets_the_memory_budget_and_its_cache_is_emptied(probe):
    assert probe["tiny_engine"] == {**gpu.engine_memory(80 * GiB, tiny=True), "enforce_eager": True}
    assert probe["real_weights_engine"] == {"enforce_eager": True}
    assert probe["cuda_cache_emptied"] == 1


@pytest.mark.oracle
def test_a_gpu_engine_records_with_the_async_scheduler_where_the_gpu_rule_is_async(probe):
    assert probe["scheduler_cls_async_True"] == ["engines.vllm.recorder.EngineRecordingAsyncScheduler", True]
    assert probe["scheduler_cls_async_False"] == ["engines.vllm.recorder.EngineRecordingScheduler", False]


@pytest.mark.oracle
def test_the_oracle_pins_full_float32_and_refuses_an_engine_torch_runs_below_it(probe):
    """boot sets VLLM_FLOAT32_MATMUL_PRECISION where a runner left it unset, and vLLM reads it;
    whatever else lowers torch's precision, an engine built under it is refused after the fact."""
    assert probe["precision_setting"] == probe["precision_read_by_vllm"] == "highest"
    assert probe["environment"]["float32_matmul_precision"] == "highest"
    assert probe["precision_in_effect"] is None
    assert probe["precision_in_effect_tf32"] == precision.refusal("high", "torch.get_float32_matmul_precision()")


@pytest.mark.oracle
def test_a_v2_model_runner_is_refused_by_the_drafter_counts_not_counted_silently(probe):
    assert "Model Runner V2" in probe["v2_runner_counted"]
    assert "VLLM_USE_V2_MODEL_RUNNER=0" in probe["v2_runner_counted"]


# --- locked GPU dependency sets -----------------------------------------------------------


@pytest.mark.parametrize("release", PINS.releases)
def test_each_pin_has_a_checked_in_gpu_lock_that_the_env_installs_and_keys(release, fake_gpu):
    lock = envs.gpu_lock(release)
    pinned, cpu = _pinned(lock), _pinned(PINS.cpu_requirements)
    assert pinned["vllm"] == release and pinned["torch"]
    assert all(line.startswith("#") or "==" in line for line in lock.read_text().splitlines() if line)
    for name in envs.GPU_LOCK_SHARED:  # a model folder is read the same way on both devices
        assert pinned[_norm(name)] == cpu[_norm(name)], name
    steps = envs.install_steps(release, "gpu", PINS)
    assert steps == [["pip", "install", "--no-progress", "-r", str(lock)]]  # no find-links: no CPU torch
    assert envs.env_dir(release, "gpu", PINS).name.startswith(f"vllm-{release}-gpu-")


def _norm(name: str) -> str:
    return name.strip().lower().replace("_", "-")


def _pinned(path: Path) -> dict[str, str]:
    lines = (line.split("#")[0].strip() for line in path.read_text().splitlines())
    return {_norm(line.split("==")[0]): line.split("==")[1].split()[0] for line in lines if "==" in line}


def test_the_gpu_env_key_records_the_locked_torch_and_requirements(monkeypatch, tmp_path):
    release = PINS.oracle
    key = envs.env_key(release, "gpu", PINS)
    changed = tmp_path / "lock.txt"
    changed.write_text(envs.gpu_lock(release).read_text().replace("\nnumpy==", "\nnumpy==0.0.1\n#"))
    monkeypatch.setattr(envs, "gpu_lock", lambda r: changed)
    assert envs.env_key(release, "gpu", PINS) != key
    changed.write_text("vllm==" + release + "\n")
    with pytest.raises(envs.EnvError, match="pins no torch"):
        envs.env_key(release, "gpu", PINS)
    monkeypatch.setattr(envs, "gpu_lock", lambda r: tmp_path / "missing.txt")
    with pytest.raises(envs.EnvError, match=f"parity envs --lock-gpu --pin {release}"):
        envs.install_steps(release, "gpu", PINS)


# --- goldens: a GPU writes only what no CPU can -------------------------------------------


def test_a_gpu_writes_only_the_engine_goldens_of_pins_without_a_cpu_engine():
    engine = load_scenario(REPO / "scenarios/engine_ngram.json").layers
    steps = load_scenario(REPO / "scenarios/steady_decode.json").layers
    for release in PINS.releases:
        build = PINS.cpu_engine_build(release)
        assert gpu.golden_written_here(steps, release, "cpu", build)
        assert gpu.golden_written_here(engine, release, "cpu", build)
        assert not gpu.golden_written_here(steps, release, "gpu", build)
        assert gpu.golden_written_here(engine, release, "gpu", build) == (build is None)
    assert gpu.selected_for_goldens(engine, "0.33.0", "0.33.0", "engine")
    assert not gpu.selected_for_goldens(steps, "0.33.0", "0.33.0", "engine")
    assert not gpu.selected_for_goldens(engine, "0.27.1", "0.33.0", "engine")
    assert gpu.selected_for_goldens(steps, "0.27.1", "", "steps,outputs")


def test_parity_goldens_on_a_gpu_refuses_to_rewrite_cpu_goldens_before_any_engine_starts(fake_gpu, monkeypatch,
                                                                                          capsys):
    from conformance import cli
    from conformance.regenerate import lifecycle

    started = []
    monkeypatch.setattr(lifecycle, "prepare_engine", lambda ref, pins, log: started.append(ref) or 1 / 0)
    assert cli.main(["goldens"]) == 2
    assert "make goldens PINS=0.33.0 LAYERS=engine" in capsys.readouterr().err and started == []
    # the engine goldens of 0.33.0 are the GPU's to write: its engine is prepared (and this
    # stand-in's ZeroDivisionError is a harness bug to the CLI: exit 3, with its traceback)
    assert cli.main(["goldens", "--engine", "0.33.0", "--layers", "engine"]) == 3
    assert "ZeroDivisionError" in capsys.readouterr().err
    assert started == [EngineRef.pin("0.33.0")]


# --- CI examples --------------------------------------------------------------------------


@pytest.mark.parametrize("example", sorted((REPO / "ci-examples").glob("*.yml")), ids=lambda p: p.name)
def test_the_ci_examples_run_make_test_and_the_27b_gate_with_cached_weights(example):
    text = example.read_text()
    assert "make test" in text
    assert "VLLM_PARITY_GATE_MODELS" in text  # the 27B gate test runs instead of skipping
    assert "VLLM_PARITY_CACHE" in text  # environments and weights kept by the runner
