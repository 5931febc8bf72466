"""The production-scale workload generator: a scenario's `generate` parameters expanded into a
workload (conformance/formats/workload.py's schema), seeded and deterministic.

Standard library only, one pure function, `expand(params, source, engine_args)`. A scenario file
holds the parameters (a few hundred bytes), never the 500 requests they expand to; the scenario
loader expands them and validates the result like a hand-written workload, and the scenario
hash covers the expanded workload and the generator's version, so a generator change that moves
a workload makes its goldens invalid (`make goldens` writes them again). Engines receive the
expanded workload in the `run` message: a worker or a port never runs the generator.

Randomness is the generator's own, not `random`'s (whose distribution methods are not a
cross-version contract): draw i of stream S is BLAKE2b (8-byte digest, person b"parity-gen")
over the seed (8 bytes little-endian), S's UTF-8 bytes, a zero byte and i (8 bytes
little-endian), its top 53 bits read as u in [0, 1). Each field of each group draws from its own
stream ("<group>.prompt", "<group>.arrival", ...), so adding a field moves no other. Lengths
are log-normal (`exp(ln median + sigma * NormalDist().inv_cdf(u))`, u taken at the middle of its
1/2^53 slot so it is never 0) or uniform integers, clipped to their bounds. These are IEEE-754
computations of one platform; should another libm ever round one differently, the expanded
workload, and so the scenario hash, changes: a loud `invalid_golden`, never a silent
divergence.

The parameters (every key below; an unknown key, a missing one or a bad value is a
ScenarioError naming the field, e.g. `generate.groups[1].prompt_len.lognormal`):

    {"generator": "production/1",
     "seed": int,
     "vocab_size": int,
     "groups": [                        # requests of one kind; ids are <name><index>
        {"name": "r",                   # ^[a-z]{1,8}$, unique
         "arrivals": {...},             # one of the three forms below
         "prompt_len": LENGTH,          # the request's own prompt tokens
         "max_tokens": LENGTH,          # clipped so prompt + max_tokens <= max_model_len
         "acceptance": {"length": [lo, hi], "values": [lo, hi]},   # optional (default [0])
         "stop": {"share": float, "ids": [int, ...]}}],            # optional
     "shared_prefixes": {"count": int, "len": [lo, hi], "share": float},   # optional
     "aborts": {"share": float, "after": [lo, hi]}}                         # optional

    arrivals: {"bursts": [[first step, span, count], ...]}   count instants uniform in each span
              {"poisson": {"from": step, "until": step, "count": n}}   n arrivals of a Poisson
                  process over [from, until): n uniform instants, sorted
              {"every": {"first": step, "period": steps, "count": n}}  first + i * period
    LENGTH:   {"lognormal": [median, sigma], "min": int, "max": int} or {"uniform": [lo, hi]}

Requests are listed by arrival step, then group order, then index; `max_steps` is the last
arrival + 8 x (all tokens / the token budget) + 4 x the longest output + 2000, at most 100,000.
`shared_prefixes` writes the workload's `prefixes` (named p0, p1, ...) and each chosen request's
`prefix` (its prompt_len and max_tokens leave the prefix room within max_model_len); `aborts`
writes `abort_step`, its arrival plus a uniform draw from `after` (engines/PROTOCOL.md, `steps`).
"""

from __future__ import annotations

import hashlib
import math
import re
from statistics import NormalDist

from conformance.formats import workload as workload_schema
from conformance.formats.fields import type_name

VERSION = "production/1"
PERSON = b"parity-gen"
GROUP_NAME = re.compile(r"^[a-z]{1,8}$")
MAX_GROUPS = 16
MAX_LENGTH = 1 << 20  # far above any max_model_len a scenario may state
_NORMAL = NormalDist()

TOP_LEVEL = {"generator": True, "seed": True, "vocab_size": True, "groups": True,
             "shared_prefixes": False, "aborts": False}
GROUP = {"name": True, "arrivals": True, "prompt_len": True, "max_tokens": True,
         "acceptance": False, "stop": False}


class Draws:
    """The generator's random numbers: u(stream, i) in [0, 1), a pure function of the seed."""

    def __init__(self, seed: int):
        self.seed = seed.to_bytes(8, "little")

    def u(self, stream: str, i: int) -> float:
        h = hashlib.blake2b(digest_size=8, person=PERSON)
        h.update(self.seed + stream.encode() + b"\0" + i.to_bytes(8, "little"))
        return ((int.from_bytes(h.digest(), "little") >> 11) + 0.5) / (1 << 53)

    def integer(self, stream: str, i: int, low: int, high: int) -> int:
        """Uniform in [low, high]."""
        return low + min(int(self.u(stream, i) * (high - low + 1)), high - low)

    def length(self, stream: str, i: int, spec: dict) -> int:
        if "uniform" in spec:
            return self.integer(stream, i, *spec["uniform"])
        median, sigma = spec["lognormal"]
        value = math.exp(math.log(median) + sigma * _NORMAL.inv_cdf(self.u(stream, i)))
        return max(spec["min"], min(spec["max"], round(value)))

    def chance(self, stream: str, i: int, share: float) -> bool:
        return self.u(stream, i) < share


def expand(params: object, source: str, engine_args: dict) -> dict:
    """The workload `params` describe (not yet validated: the scenario loader validates it
    like any workload); ScenarioError naming the field when a parameter is wrong."""
    check = _Checker(source)
    params = check.object("generate", params, TOP_LEVEL)
    if params["generator"] != VERSION:
        check.fail("generate.generator", f"must be {VERSION!r}, got {params['generator']!r}")
    seed = check.integer("generate.seed", params["seed"], 0, workload_schema.MAX_SEED)
    vocab = check.integer("generate.vocab_size", params["vocab_size"], 2, workload_schema.MAX_VOCAB_SIZE)
    groups = check.array("generate.groups", params["groups"], 1, MAX_GROUPS)
    max_model_len = engine_args.get("max_model_len", MAX_LENGTH)
    draws = Draws(seed)
    prefixes = _prefixes(check, draws, params.get("shared_prefixes"), max_model_len)
    aborts = _aborts(check, params.get("aborts"))
    requests, names = [], set()
    for g, raw in enumerate(groups):
        where = f"generate.groups[{g}]"
        group = check.object(where, raw, GROUP)
        name = group["name"]
        if not isinstance(name, str) or not GROUP_NAME.fullmatch(name) or name in names:
            check.fail(f"{where}.name", f"must be 1-8 letters a-z, unique among the groups, got {name!r}")
        names.add(name)
        arrivals = _arrivals(check, draws, f"{where}.arrivals", group["arrivals"], name)
        if len(requests) + len(arrivals) > workload_schema.MAX_REQUESTS:
            check.fail(f"{where}.arrivals", f"the groups hold more than {workload_schema.MAX_REQUESTS} "
                       "requests, the workload's limit")
        prompt = check.length(f"{where}.prompt_len", group["prompt_len"])
        output = check.length(f"{where}.max_tokens", group["max_tokens"])
        accept = _acceptance(check, f"{where}.acceptance", group.get("acceptance"))
        stop = _stop(check, f"{where}.stop", group.get("stop"), vocab)
        for i, arrival in enumerate(arrivals):
            rid = f"{name}{i}"
            req = {"id": rid, "arrival_step": arrival, "prompt_len": draws.length(f"{name}.prompt", i, prompt)}
            shared = 0
            if prefixes and draws.chance(f"{name}.prefix", i, params["shared_prefixes"]["share"]):
                chosen = prefixes[draws.integer(f"{name}.prefix_pick", i, 0, len(prefixes) - 1)]
                req["prefix"], shared = chosen["name"], chosen["len"]
            # the whole prompt leaves room for at least one output token
            req["prompt_len"] = max(1, min(req["prompt_len"], max_model_len - 1 - shared))
            room = max_model_len - shared - req["prompt_len"]
            req["max_tokens"] = max(1, min(draws.length(f"{name}.output", i, output), room))
            if accept is not None:
                length = draws.integer(f"{name}.accept_len", i, *accept["length"])
                req["acceptance"] = [draws.integer(f"{name}.accept", i * 64 + j, *accept["values"])
                                     for j in range(length)]
            if stop is not None and draws.chance(f"{name}.stop", i, stop["share"]):
                req["stop_token_ids"] = list(stop["ids"])
            if aborts is not None and draws.chance(f"{name}.abort", i, aborts["share"]):
                req["abort_step"] = arrival + draws.integer(f"{name}.abort_after", i, *aborts["after"])
            requests.append((arrival, g, i, req))
    return _workload(requests, prefixes, seed, vocab, engine_args.get("max_num_batched_tokens", 1))


def _workload(requests: list, prefixes: list, seed: int, vocab: int, budget: int) -> dict:
    """The requests drawn, (arrival, group, index, request) each, in that order, and a step
    limit every request can finish within, however the engine schedules them."""
    requests.sort(key=lambda item: item[:3])
    out = [req for *_, req in requests]
    last = max(req["arrival_step"] for req in out)
    tokens = sum(req["prompt_len"] + req["max_tokens"] for req in out) + sum(p["len"] for p in prefixes)
    longest = max(req["max_tokens"] for req in out)
    max_steps = min(workload_schema.MAX_STEPS, last + 8 * math.ceil(tokens / budget) + 4 * longest + 2000)
    for req in out:
        if "abort_step" in req:
            req["abort_step"] = min(req["abort_step"], max_steps - 1)
    workload = {"seed": seed, "vocab_size": vocab, "max_steps": max_steps, "requests": out}
    if prefixes:
        workload["prefixes"] = prefixes
    return workload


def _arrivals(check: "_Checker", draws: Draws, where: str, raw: object, group: str) -> list[int]:
    forms = {"bursts": False, "poisson": False, "every": False}
    spec = check.object(where, raw, forms)
    if len(spec) != 1:
        check.fail(where, f"must hold exactly one of {sorted(forms)}, got {sorted(spec)}")
    most = workload_schema.MAX_STEPS - 1
    if "bursts" in spec:
        bursts = check.array(f"{where}.bursts", spec["bursts"], 1, 64)
        steps = []
        for b, burst in enumerate(bursts):
            first, span, count = check.triple(f"{where}.bursts[{b}]", burst, (0, most), (1, most), (1, 4096))
            steps += [first + draws.integer(f"{group}.arrival.{b}", i, 0, span - 1) for i in range(count)]
        return sorted(steps)
    if "poisson" in spec:
        keys = {"from": True, "until": True, "count": True}
        p = check.object(f"{where}.poisson", spec["poisson"], keys)
        start = check.integer(f"{where}.poisson.from", p["from"], 0, most)
        until = check.integer(f"{where}.poisson.until", p["until"], start + 1, most + 1)
        count = check.integer(f"{where}.poisson.count", p["count"], 1, 4096)
        return sorted(start + min(int(draws.u(f"{group}.arrival", i) * (until - start)), until - start - 1)
                      for i in range(count))
    keys = {"first": True, "period": True, "count": True}
    e = check.object(f"{where}.every", spec["every"], keys)
    first = check.integer(f"{where}.every.first", e["first"], 0, most)
    period = check.integer(f"{where}.every.period", e["period"], 1, most)
    count = check.integer(f"{where}.every.count", e["count"], 1, 4096)
    if first + period * (count - 1) > most:
        check.fail(f"{where}.every", f"its last arrival, {first + period * (count - 1)}, is past step {most}")
    return [first + period * i for i in range(count)]


def _acceptance(check: "_Checker", where: str, raw: object) -> dict | None:
    if raw is None:
        return None
    spec = check.object(where, raw, {"length": True, "values": True})
    return {"length": check.pair(f"{where}.length", spec["length"], 1, 64),
            "values": check.pair(f"{where}.values", spec["values"], 0, workload_schema.MAX_ACCEPT)}


def _stop(check: "_Checker", where: str, raw: object, vocab: int) -> dict | None:
    if raw is None:
        return None
    spec = check.object(where, raw, {"share": True, "ids": True})
    ids = check.array(f"{where}.ids", spec["ids"], 1, 16)
    for j, token in enumerate(ids):
        check.integer(f"{where}.ids[{j}]", token, 0, vocab - 1)
    return {"share": check.share(f"{where}.share", spec["share"]), "ids": ids}


def _prefixes(check: "_Checker", draws: Draws, raw: object, max_model_len: int) -> list[dict]:
    if raw is None:
        return []
    where = "generate.shared_prefixes"
    spec = check.object(where, raw, {"count": True, "len": True, "share": True})
    count = check.integer(f"{where}.count", spec["count"], 1, 64)
    low, high = check.pair(f"{where}.len", spec["len"], 1, max(1, max_model_len - 2))
    check.share(f"{where}.share", spec["share"])
    return [{"name": f"p{j}", "len": draws.integer("prefix.len", j, low, high)} for j in range(count)]


def _aborts(check: "_Checker", raw: object) -> dict | None:
    if raw is None:
        return None
    where = "generate.aborts"
    spec = check.object(where, raw, {"share": True, "after": True})
    return {"share": check.share(f"{where}.share", spec["share"]),
            "after": check.pair(f"{where}.after", spec["after"], 0, workload_schema.MAX_STEPS - 1)}


class _Checker(workload_schema.FieldChecker):
    """Each parameter checked where it is read, every error naming the field."""

    def object(self, where: str, raw: object, keys: dict[str, bool]) -> dict:
        if not isinstance(raw, dict):
            self.fail(where, f"must be an object, got {type_name(raw)}")
        for key in raw:
            if key not in keys:
                self.fail(f"{where}.{key}", f"unknown key; allowed: {sorted(keys)}")
        for key, required in keys.items():
            if required and key not in raw:
                self.fail(f"{where}.{key}", "is required")
        return raw

    def array(self, where: str, value: object, low: int, high: int) -> list:
        if not isinstance(value, list):
            self.fail(where, f"must be an array, got {type_name(value)}")
        if not low <= len(value) <= high:
            self.fail(where, f"must hold {low} to {high} entries, got {len(value)}")
        return value

    def pair(self, where: str, value: object, low: int, high: int) -> tuple[int, int]:
        self.array(where, value, 2, 2)
        first = self.integer(f"{where}[0]", value[0], low, high)
        second = self.integer(f"{where}[1]", value[1], first, high)
        return first, second

    def triple(self, where: str, value: object, *bounds: tuple[int, int]) -> tuple[int, ...]:
        self.array(where, value, 3, 3)
        return tuple(self.integer(f"{where}[{k}]", v, *b) for k, (v, b) in enumerate(zip(value, bounds)))

    def share(self, where: str, value: object) -> float:
        if not isinstance(value, (int, float)) or isinstance(value, bool) or not 0 <= value <= 1:
            self.fail(where, f"must be a number from 0 to 1, got {value!r}")
        return float(value)

    def length(self, where: str, raw: object) -> dict:
        if isinstance(raw, dict) and "uniform" in raw:
            spec = self.object(where, raw, {"uniform": True})
            return {"uniform": self.pair(f"{where}.uniform", spec["uniform"], 1, MAX_LENGTH)}
        spec = self.object(where, raw, {"lognormal": True, "min": True, "max": True})
        self.array(f"{where}.lognormal", spec["lognormal"], 2, 2)
        median, sigma = spec["lognormal"]
        for k, (value, low, high) in enumerate(((median, 1, MAX_LENGTH), (sigma, 0, 4))):
            if not isinstance(value, (int, float)) or isinstance(value, bool) or not low <= value <= high:
                self.fail(f"{where}.lognormal[{k}]", f"must be a number from {low} to {high}, got {value!r}")
        low = self.integer(f"{where}.min", spec["min"], 1, MAX_LENGTH)
        high = self.integer(f"{where}.max", spec["max"], low, MAX_LENGTH)
        return {"lognormal": (float(median), float(sigma)), "min": low, "max": high}
