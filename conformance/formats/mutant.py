"""A generated mutant as the harness and a pin's worker both read it: one source edit (a
span of a file's UTF-8 bytes and the text put there), its diff and its JSON. Standard library
only: engines/vllm/mutant_catalog.py installs one in the pin's environment. The operators that
generate the catalog are in adequacy/mutation.py.
"""

from __future__ import annotations

import difflib
from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class Mutant:
    id: str  # m + 10 hex digits of (file, span, replacement): stable across runs
    file: str  # relative to site-packages, e.g. vllm/v1/core/sched/scheduler.py
    function: str  # qualname of the outermost function holding the edit (what gets replaced)
    operator: str
    line: int
    start: int  # byte offsets into the file's UTF-8 text
    end: int
    original: str
    replacement: str

    @property
    def name(self) -> str:
        return f"{self.id} {self.file.rsplit('/', 1)[-1]}:{self.line} {self.function} {self.operator}"

    def apply(self, source: str) -> str:
        data = source.encode()
        if data[self.start:self.end].decode() != self.original:
            raise ValueError(f"mutant {self.id}: {self.file} does not hold {self.original!r} at "
                             f"line {self.line}; the catalog was made from another source")
        return (data[:self.start] + self.replacement.encode() + data[self.end:]).decode()

    def diff(self, source: str) -> str:
        return "".join(difflib.unified_diff(
            source.splitlines(keepends=True), self.apply(source).splitlines(keepends=True),
            f"a/{self.file}", f"b/{self.file}", n=2))

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict) -> "Mutant":
        return cls(**{k: data[k] for k in cls.__dataclass_fields__})
