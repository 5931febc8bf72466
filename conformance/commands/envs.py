"""`parity envs`: build (or reuse) the isolated environment of each pin, every pin's, --pin's,
or those a share of the gate's plan runs."""

from __future__ import annotations

from conformance.formats.errors import InputError
from conformance.formats.log import log
from conformance.formats.pins import load_pins
from conformance.gate.options import plan_options
from conformance.gate.plan import share_pins
from conformance.process.envs import build_envs, env_cache_key, lock_gpu


def register(sub) -> None:
    p = sub.add_parser("envs", help="build (or reuse) the isolated environment of each pin")
    p.add_argument("--pin", action="append", help="only these releases (default: all pins)")
    p.add_argument("--lock-gpu", action="store_true",
                   help="write each pin's locked GPU requirements (engines/vllm/requirements-gpu-X.txt) "
                        "with uv from package metadata, and build nothing")
    p.add_argument("--key", action="store_true", help="print the cache key of the environments these "
                   "options select (one line, from each one's env key: a CI cache step's key), and build nothing")
    # the gate's plan options: with any of them, only the pins that plan's share runs are selected
    p.add_argument("--shard", metavar="I/N", help="only the pins shard I of N of the gate runs (with the "
                   "same --candidate, --scenario, --scale and --layers as its `parity gate --shard`)")
    plan_options(p)
    p.set_defaults(handler=envs)


def envs(args) -> int:
    """Build the pins' environments side by side (envs.build_envs): every pin's, --pin's, or,
    given the gate's plan options, only those the plan's share runs; --key prints their cache key."""
    pins = load_pins()
    planned = (args.shard or args.candidate or args.scenario or args.layers or args.scale != "library"
               or args.stand_ins is not None)
    if planned and args.pin:
        raise InputError("--pin: give either --pin or the gate's plan options (--shard, --candidate, "
                         "--stand-ins, --scenario, --scale, --layers), not both")
    releases = share_pins(args, pins, log) if planned else args.pin or list(pins.releases)
    if args.key:
        print(env_cache_key(releases, pins))
        return 0
    if planned:
        log(f"[envs] the plan's share runs {', '.join(releases) or 'no pin'}: building only "
            f"{'those' if releases else 'nothing'}")
    if args.lock_gpu:
        for release in releases:
            lock_gpu(release, pins, log)
        return 0
    build_envs(releases, pins, log)
    return 0
