"""The verdict's vocabulary: the key of a public record, one difference, the tallies of a
topic and the report replay returns (identical iff no difference)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Final

#: How many differences a report describes (all are counted).
DESCRIBED: Final = 5
#: The cut in one sentence (the JSON verdict carries it; the package docstring explains it).
CUT_DEFINITION: Final = (
    "a recomputed release is due when its timeline record is below the worker's committed "
    "offset or its tick is at most the highest published tick of its counter; a recomputed "
    "ledger entry is due when its record is committed; published records must all be "
    "recomputed, byte for byte; what is not due is pending (counted, not flagged)")

#: (counter, tick, kind) of a release; (counter, creation, fingerprint) of a ledger entry.
RecordKey = tuple[str, int | str, str]


@dataclass(frozen=True)
class Difference:
    """One difference: which topic, which record, what is wrong."""

    topic: str  # "counts" (the private-count topic) or "ledger"
    key: RecordKey
    problem: str  # missing, unexpected, different, conflicting, malformed, inconsistent,
    # unexplained, understated (the package docstring)
    detail: str

    def describe(self) -> str:
        return f"{self.topic} {self.key}: {self.problem}: {self.detail}"

    def to_json(self) -> dict[str, Any]:
        return {"topic": self.topic, "key": list(self.key), "problem": self.problem,
                "detail": self.detail}


@dataclass
class Tally:
    """Record counts of one public topic: recomputed (distinct keys), committed (those of
    committed timeline records), due, published (distinct keys in the snapshot), pending
    (recomputed, not due, not published)."""

    recomputed: int = 0
    committed: int = 0
    due: int = 0
    published: int = 0
    pending: int = 0


@dataclass
class ReplayReport:
    """The verdict: identical iff no difference; the cut per timeline partition."""

    timeline_records: int
    duplicates_dropped: int
    releases: Tally
    ledger: Tally
    #: timeline partition -> (committed offset C_p, end E_p) of the cut.
    cut: dict[int, tuple[int, int]]
    differences: list[Difference] = field(default_factory=list)
    #: What the configuration and key replay was given contradict on the ledger
    #: (configured.ledger_mismatch). Non-empty: nothing was recomputed (every count
    #: above is 0), and the verdict is about the configuration, not the topics.
    configuration: list[str] = field(default_factory=list)

    @property
    def identical(self) -> bool:
        return not self.differences and not self.configuration

    @property
    def configuration_differs(self) -> bool:
        """Replay was given a configuration or key other than the ledger's: a
        recomputation would say nothing about the published topics."""
        return bool(self.configuration)

    @property
    def recomputed(self) -> int:
        """Releases recomputed from committed timeline records (all published)."""
        return self.releases.committed

    def summary(self) -> str:
        r, g = self.releases, self.ledger
        counts = (f"releases: {r.published} published, {r.due} due, {r.pending} pending; "
                  f"ledger entries: {g.published} published, {g.due} due, {g.pending} pending; "
                  f"{self.timeline_records} timeline records")
        if self.identical:
            return f"identical ({counts})"
        if self.configuration_differs:
            return ("CONFIGURATION DIFFERS from the ledger's: " + "; ".join(self.configuration)
                    + ". Nothing was recomputed: run replay with the configuration (DPC_* "
                    "variables included) and key the worker ran")
        first = "; ".join(d.describe() for d in self.differences[:DESCRIBED])
        return f"DIFFERENT ({len(self.differences)} differences; {counts}): first: {first}"

    def to_json(self) -> dict[str, Any]:
        return {
            "verdict": ("identical" if self.identical else "configuration_differs"
                        if self.configuration_differs else "different"),
            "configuration": self.configuration,
            "identical": self.identical,
            "cut": {"definition": CUT_DEFINITION,
                    "timeline": {str(p): {"committed": c, "end": e}
                                 for p, (c, e) in sorted(self.cut.items())}},
            "counts": {"timeline_records": self.timeline_records,
                       "duplicates_dropped": self.duplicates_dropped,
                       "releases": vars(self.releases), "ledger": vars(self.ledger)},
            "differences": {"total": len(self.differences),
                            "first": [d.to_json() for d in self.differences[:DESCRIBED]]},
        }


