"""The trace-mutation catalog's mutants: small edits of an oracle's own records, each one a
candidate that must not pass (conformance/adequacy/trace_catalog.py judges them).

A candidate's records are walked beside their layer's table (formats/record_schema.py), so each
value is known by its field and kind: a field of a record (`Record`), an entry of an object
keyed by the engine's own names (`MapOf`: request ids, a probe's arguments), a list element.
Every field of every record kind is one *site* per layer: the occurrences of `steps /
requests{} / tokens` in every record are one site, and a seeded draw picks the occurrence
mutated. At each site:

  an integer +1 and -1; a number -1 and +1; a flag flipped; null made 0 or a string; a string
  made another value the same field holds elsewhere, another request's id, a new id (`ghost`
  and `ghost_text`: the informational suffix), or the same string extended; any value given
  another JSON type;
  a list: an element added (another id, a new id, a copy) or removed;
  a record's object: a key added (`ghost`, `ghost_text`) or a field removed;
  an object of request ids: a request added, removed or renamed (to another id, `ghost`,
  `ghost_text`).

and per layer, a record dropped, duplicated and swapped with its neighbour (first, last and a
drawn one): a request removed from or added to `outputs` is its record dropped, or a copy
renamed.

Two kinds of mutant may pass, each an intended exception with its reason (EXCEPTIONS): a key
added to an object whose table names its fields (PROTOCOL.md: fields no table names are
ignored; the record's table check leaves it out before anything compares it), and a string
changed in a `*_text` field a table names (an engine's own wording: shown, never compared).
Everything else must be `diverged` or `protocol`.

A layer may hold placeholders for records not held whole (a production golden's digests):
`Known` items, which mutants move, drop and copy but never edit.
"""

from __future__ import annotations

import copy
import random
from dataclasses import dataclass
from typing import Callable

from conformance.formats.record_schema import (LAYERS, Either, Exactly, Int, ListOf, MapOf, Number, Pair, Record,
                                               RequestId, Text)

NEW_IDS = ("ghost", "ghost_text")  # a new request, and one named with the informational suffix
UNKNOWN_FIELD = ("a key no table names, added to an object whose table names its fields: the "
                 "protocol ignores it (engines/PROTOCOL.md: fields no table names are ignored)")
WORDING = ("an engine's own wording, in a field its table declares informational: shown, never compared "
           "(parity is about what an engine decides, not how it phrases it)")
TOP_K_EDGE = ("the token at a top-k list's last place made another, its logprob kept: a token one side "
              "lists alone, within the tolerance of the other side's k-th logprob, is a near-tie at the "
              "list's edge that arithmetic resolves either way (engines/PROTOCOL.md, engine_outputs)")
EXCEPTIONS = {"unknown field": UNKNOWN_FIELD, "wording": WORDING, "top-k edge": TOP_K_EDGE}


@dataclass(frozen=True)
class Known:
    """A record not held whole: its entry in the golden's digest form and its context (the
    budgets a step repeats), as formats/digest.py keeps them."""

    entry: object
    context: dict


@dataclass(frozen=True)
class Mutant:
    """One edit of a candidate's layers. `name` says where and what (stable, for listing);
    `kind` is the edit's family; `exception` the key of EXCEPTIONS when it may pass."""

    name: str
    kind: str
    apply: Callable[[dict], dict]
    exception: str | None = None


@dataclass(frozen=True)
class Site:
    layer: str
    index: int  # the record
    path: tuple  # the keys and list positions from the record to the value
    value: object
    kind: object  # its table's type
    shape: str  # the site's name: layer, record kind, the path with [] and {} for positions and ids
    informational: bool  # a field its table declares an engine's wording (Field.informational)


def sites(layer: str, index: int, record: dict):
    """Every value of a record, with its type from the layer's table."""
    shape = LAYERS[layer].shape(record)
    yield from _walk(layer, index, record, shape, (), f"{layer}/{shape.name}", False)


def _walk(layer, index, value, kind, path, shape, informational):
    kind = _resolved(kind, value)
    yield Site(layer, index, path, value, kind, shape, informational)
    if isinstance(kind, Record) and isinstance(value, dict):
        for key, spec in kind.fields.items():
            if key in value:
                yield from _walk(layer, index, value[key], spec.type, path + (key,), f"{shape}/{key}",
                                 spec.informational)
    elif isinstance(kind, MapOf) and isinstance(value, dict):
        for key, item in value.items():
            yield from _walk(layer, index, item, kind.of, path + (key,), f"{shape}{{}}", False)
    elif isinstance(kind, (ListOf, Pair)) and isinstance(value, list):
        for i, item in enumerate(value):
            of = kind.of if isinstance(kind, ListOf) else (kind.first, kind.second)[min(i, 1)]
            yield from _walk(layer, index, item, of, path + (i,), f"{shape}[]", False)


def _resolved(kind, value):
    """The branch of an Either the value is."""
    while isinstance(kind, Either):
        try:
            kind.first.check(value)
            kind = kind.first
        except ValueError:
            kind = kind.second
    return kind


def mutants(layers: dict[str, list], seed: int, salt: str) -> list[Mutant]:
    """Every mutant of a candidate's layers (records, or Known placeholders), in a stable order;
    `seed` and `salt` (the golden's name) draw the occurrence of each site edited."""
    ids = _request_ids(layers)
    out: list[Mutant] = []
    for layer, items in layers.items():
        rng = random.Random(f"{seed}/{salt}/{layer}")
        out += _record_mutants(layer, items, rng)
        by_shape: dict[str, list[Site]] = {}
        for index, item in enumerate(items):
            if isinstance(item, dict):
                for site in sites(layer, index, item):
                    by_shape.setdefault(site.shape, []).append(site)
        values = {shape: sorted({s.value for s in found if isinstance(s.value, str)})
                  for shape, found in by_shape.items()}
        for shape, found in by_shape.items():
            site = found[random.Random(f"{seed}/{salt}/{shape}").randrange(len(found))]
            others = [v for v in values[shape] if v != site.value]
            out += site_mutants(site, ids, others, items[site.index])
    return out


def _record_mutants(layer: str, items: list, rng: random.Random) -> list[Mutant]:
    n = len(items)
    if not n:
        return []
    out = []
    for i in sorted({0, n - 1, rng.randrange(n)}):
        where = f"{layer}[{i}]"
        out.append(Mutant(f"{where} dropped", "record dropped",
                          _edit_layer(layer, lambda xs, i=i: xs[:i] + xs[i + 1:])))
        out.append(Mutant(f"{where} duplicated", "record duplicated",
                          _edit_layer(layer, lambda xs, i=i: xs[:i + 1] + [copy.deepcopy(xs[i])] + xs[i + 1:])))
        j = i + 1 if i + 1 < n else i - 1
        if j >= 0 and items[j] != items[i]:
            lo, hi = min(i, j), max(i, j)
            out.append(Mutant(f"{layer}[{lo}] and [{hi}] swapped", "records reordered",
                              _edit_layer(layer, lambda xs, lo=lo, hi=hi: xs[:lo] + [xs[hi], xs[lo]] + xs[hi + 1:])))
        if layer.endswith("outputs") and isinstance(items[i], dict) and isinstance(items[i].get("id"), str):
            for new in NEW_IDS:  # a request the oracle never had, added to the outputs
                renamed = lambda xs, i=i, new=new: xs + [dict(copy.deepcopy(xs[i]), id=new)]  # noqa: E731
                out.append(Mutant(f"{where} copied as request {new!r}", "request added", _edit_layer(layer, renamed)))
    return out


def _edit_layer(layer: str, edit) -> Callable[[dict], dict]:
    return lambda layers: dict(layers, **{layer: edit(list(layers[layer]))})


def site_mutants(site: Site, ids: list[str], others: list[str], record: dict) -> list[Mutant]:
    where = f"{site.layer}[{site.index}]." + ".".join(str(p) for p in site.path) if site.path \
        else f"{site.layer}[{site.index}]"
    value, kind = site.value, site.kind
    edits: list[tuple[str, str, object, str | None]] = []  # (what, family, new value or an edit, exception)
    wording = site.informational
    if isinstance(value, bool):
        edits += [("flipped", "field changed", not value, None), ("made an int", "type changed", int(value), None)]
    elif isinstance(value, int):
        edge = "top-k edge" if top_k_edge(site, record) else None
        edits += [("+1", "field changed", value + 1, edge), ("-1", "field changed", value - 1, edge),
                  ("made a string", "type changed", str(value), None)]
    elif isinstance(value, float):
        edits += [("-1", "field changed", value - 1.0, None), ("+1", "field changed", value + 1.0, None),
                  ("made a string", "type changed", repr(value), None)]
    elif value is None:
        edits += [("null made 0", "field changed", 0, None),
                  ("null made a string", "type changed", "x", "wording" if wording else None)]
    elif isinstance(value, str):
        exception = "wording" if wording else None
        for other in others[:1]:
            edits.append((f"made {other!r}", "field changed", other, exception))
        for other in [x for x in ids if x != value][:1] + list(NEW_IDS):
            edits.append((f"made id {other!r}", "request renamed", other, exception))
        edits += [("extended", "field changed", value + "x", exception), ("made an int", "type changed", 0, None)]
    elif isinstance(value, list):
        edits.append(("made an object", "type changed", {}, None))
        edits += _list_edits(site, ids)
    elif isinstance(value, dict):
        edits.append(("made a list", "type changed", [], None))
        edits += _object_edits(site, ids)
    return [Mutant(f"{where} {what}", family, _at(site, new), exception)
            for what, family, new, exception in edits]


def top_k_edge(site: Site, record: dict) -> bool:
    """The token of an engine_outputs top-k list's last entry, where that is not the sampled token."""
    path = site.path
    if not (site.layer == "engine_outputs" and len(path) == 4 and path[0] == "logprobs" and path[3] == 0):
        return False
    listed = record["logprobs"][path[1]]
    return 0 < path[2] == len(listed) - 1 and listed[-1][0] != record["output_token_ids"][path[1]]


def _list_edits(site: Site, ids: list[str]) -> list:
    value, out = site.value, []
    of = site.kind.of if isinstance(site.kind, ListOf) else None
    if value:
        out.append(("first element removed", "list element removed", _Edit(lambda v: v[1:]), None))
        out.append(("last element removed", "list element removed", _Edit(lambda v: v[:-1]), None))
        out.append(("last element copied", "list element added", _Edit(lambda v: v + [copy.deepcopy(v[-1])]), None))
    if isinstance(_resolved(of, ""), (Text, RequestId)) or (value and all(isinstance(v, str) for v in value)):
        for new in [x for x in ids if x not in value][:1] + list(NEW_IDS):
            out.append((f"{new!r} added", "request added", _Edit(lambda v, new=new: v + [new]), None))
    elif not value:
        out.append(("an element added", "list element added", _Edit(lambda v: v + [_sample_of(of)]), None))
    return out


def _object_edits(site: Site, ids: list[str]) -> list:
    value, out = site.value, []
    if isinstance(site.kind, MapOf):
        sibling = next(iter(value.values()), 0)
        for new in [x for x in ids if x not in value][:1] + list(NEW_IDS):
            out.append((f"entry {new!r} added", "request added",
                        _Edit(lambda v, new=new: dict(v, **{new: copy.deepcopy(sibling)})), None))
        if value:
            first = next(iter(value))
            out.append((f"entry {first!r} removed", "request removed",
                        _Edit(lambda v, k=first: {x: y for x, y in v.items() if x != k}), None))
            for new in [x for x in ids if x not in value][:1] + list(NEW_IDS):
                out.append((f"entry {first!r} renamed {new!r}", "request renamed",
                            _Edit(lambda v, k=first, new=new: {(new if x == k else x): y for x, y in v.items()}), None))
        return out
    for new in NEW_IDS:
        out.append((f"key {new!r} added", "key added", _Edit(lambda v, new=new: dict(v, **{new: 0})), "unknown field"))
    if value:
        last = sorted(value)[-1]
        out.append((f"field {last!r} removed", "field removed",
                    _Edit(lambda v, k=last: {x: y for x, y in v.items() if x != k}), None))
    return out


def _sample_of(kind):
    kind = _resolved(kind, 0)
    if isinstance(kind, (ListOf, Pair)):
        return []
    if isinstance(kind, (Text, RequestId)):
        return kind.choices[0] if getattr(kind, "choices", ()) else "x"
    if isinstance(kind, (Record, MapOf)):
        return {}
    if isinstance(kind, Exactly):
        return False if kind.kind is bool else None
    return 0 if isinstance(kind, (Int, Number)) or kind is None else None


@dataclass(frozen=True)
class _Edit:
    """A new value made from the old one."""

    make: Callable


def _at(site: Site, new) -> Callable[[dict], dict]:
    """The layers with the site's value replaced (a copy of the one record edited)."""
    def apply(layers: dict) -> dict:
        items = list(layers[site.layer])
        record = copy.deepcopy(items[site.index])
        value = new.make(copy.deepcopy(site.value)) if isinstance(new, _Edit) else new
        if not site.path:
            record = value
        else:
            parent = record
            for part in site.path[:-1]:
                parent = parent[part]
            parent[site.path[-1]] = value
        items[site.index] = record
        return dict(layers, **{site.layer: items})
    return apply


def _request_ids(layers: dict[str, list]) -> list[str]:
    """The trace's request ids, in a stable order: another id a mutant may use."""
    found: set[str] = set()
    for layer, items in layers.items():
        for item in items:
            if not isinstance(item, dict):
                continue
            if layer.endswith("outputs") and isinstance(item.get("id"), str):
                found.add(item["id"])
            if isinstance(item.get("requests"), dict):
                found.update(item["requests"])
    return sorted(found)
