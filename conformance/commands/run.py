"""`parity run`: one engine on one scenario, its trace written."""

from __future__ import annotations

from pathlib import Path

from conformance.formats.engine_ref import EngineRef
from conformance.formats.files import check_output_file, remove_dead_writers_temporaries, write_text_atomic
from conformance.formats.log import log
from conformance.formats.pins import load_pins
from conformance.formats.scenario import load_scenario
from conformance.formats.trace import dumps
from conformance.gate.execute import golden_sinks
from conformance.gate.options import parse_layers
from conformance.process.launch import prepare_engine
from conformance.process.progress import EngineProgress, Progress
from conformance.process.session import EngineSession


def register(sub) -> None:
    p = sub.add_parser("run", help="run one engine on one scenario and write its trace")
    p.add_argument("--engine", required=True, help="a pin (0.28.0, vllm==0.28.0) or an engine command line")
    p.add_argument("--scenario", required=True, type=Path)
    p.add_argument("--out", required=True, type=Path)
    p.add_argument("--layers", help="comma-separated layers (default: every layer the scenario has)")
    p.set_defaults(handler=run)


def run(args) -> int:
    scenario = load_scenario(args.scenario)  # validated before any engine starts
    check_output_file(args.out, "--out")  # and where the trace goes
    pins = load_pins()
    spec = prepare_engine(EngineRef.parse(args.engine, pins), pins, log)
    layers = parse_layers(args.layers) or scenario.layers
    with Progress(2.0, log) as progress:  # a cold start and one scenario, said while they last
        with EngineSession(spec, progress=EngineProgress(progress, "run", spec.label,
                                                         [(scenario.name, layers, 1.0)], 1.0),
                           sinks=golden_sinks(pins.oracle)) as session:
            trace = session.trace(scenario, layers)
    remove_dead_writers_temporaries(args.out)  # what an earlier run killed while writing it left
    write_text_atomic(args.out, dumps(trace))
    if trace.failure is not None:
        log(f"parity run: {trace.failure.kind}: {trace.failure.message}\n"
            f"partial trace kept in {args.out}")
        return 2
    log(f"parity run: trace written to {args.out}")
    return 0
