"""ECC and SimECC with calibration="tight": construction, state, registry, and the
empirical audit (processor/audit/) with an under-noised control.

False-alarm rate: the audit verdicts are tests at alpha = 0.05 (assumption-free
Clopper-Pearson bound, thresholds chosen on a held-out half): a correct (eps, delta)-DP
mechanism FAILS with probability at most 0.05. Seeds are fixed, so each outcome is
deterministic. Control: the same tight SimECC with CC noise 100 times smaller than its
plan (the released values then reveal the inserted event); it must FAIL. The empirical
audit cannot tell a factor of a few (docs/tight-calibration.md, section "The empirical
audit"): that is the exact accounting's job (test_tight_accounting.py).
"""

from __future__ import annotations

from typing import Any

import pytest

from processor.audit.plans import make_streams, plan_for
from processor.audit.runs import audit
from processor.core import registry, tight
from processor.core.cc import UnboundedCC
from processor.core.ecc import ECC, SimECC
from processor.core.errors import InvalidParameterError, StateFormatError
from processor.core.rng import NoiseKey
from processor.core.state import pack, unpack

KEY = NoiseKey.from_seed(7)


def _feed(c: ECC | SimECC, n: int) -> list[float]:
    return [c.update(1.0 if t % 3 else None) for t in range(n)]


@pytest.mark.parametrize("cls", [ECC, SimECC])
def test_tight_counter_runs_restores_and_continues(cls: type[ECC] | type[SimECC]) -> None:
    c = cls(10.0, 1e-6, KEY, "a", calibration="tight")
    assert c.calibration == "tight"
    _feed(c, 400)
    data = c.to_bytes()
    r = cls.from_bytes(data, KEY)
    assert r.calibration == "tight" and r.to_bytes() == data
    assert _feed(r, 600) == _feed(c, 600)
    assert c.error_bound(0.05) > 0


@pytest.mark.parametrize("cls", [ECC, SimECC])
def test_paper_stays_the_default_and_its_state_is_unchanged(
        cls: type[ECC] | type[SimECC]) -> None:
    a = cls(10.0, 1e-6, KEY, "a")
    b = cls(10.0, 1e-6, KEY, "a", calibration="paper")
    assert a.calibration == "paper"
    assert _feed(a, 300) == _feed(b, 300)
    assert "cal" not in unpack(a.to_bytes(), cls.mechanism, cls.state_version)
    t = cls(10.0, 1e-6, KEY, "a", calibration="tight")
    assert _feed(t, 300) != _feed(cls(10.0, 1e-6, KEY, "a"), 300)


def test_state_with_an_unknown_calibration_is_refused() -> None:
    c = SimECC(10.0, 1e-6, KEY, "a", calibration="tight")
    st = unpack(c.to_bytes(), "simecc", SimECC.state_version)
    st["cal"] = "loose"
    with pytest.raises(StateFormatError, match="calibration"):
        SimECC.from_bytes(pack("simecc", SimECC.state_version, st), KEY)


def test_registry_passes_the_calibration_and_others_refuse_it() -> None:
    c = registry.make("simecc", 150.0, 1e-5, KEY, "x", calibration="tight")
    assert isinstance(c, SimECC) and c.calibration == "tight"
    assert isinstance(registry.restore(c.to_bytes(), KEY), SimECC)
    with pytest.raises(InvalidParameterError):
        registry.make("gaussiancc", 1.0, 1e-5, KEY, "x", calibration="tight")


# --------------------------------------------------------------------- the empirical audit

EPS, DELTA, RUNS = 3.0, 1e-3, 300


class QuietCCSimECC(SimECC):
    """Control: a tight SimECC whose CC has a hundredth of its planned noise."""

    def _setup(self, eps: float, delta: float, key: NoiseKey, counter_id: str,
               st: dict[str, Any] | None, calibration: str = "paper") -> None:
        super()._setup(eps, delta, key, counter_id, st, calibration)
        p = self._sparams
        e, d = tight._cc_for(100 * tight.cc_mu(p.cc_eps, p.cc_delta), p.cc_delta)
        self._cc = UnboundedCC(e, d, key, f"{counter_id}/simecc/cc")


@pytest.mark.parametrize(("cls", "passes"), [(SimECC, True), (QuietCCSimECC, False)])
def test_audit_of_tight_simecc(cls: type[SimECC], passes: bool) -> None:
    """eps = 3, delta = 1e-3, 300 runs per stream on one event against none then 300 + 150
    ticks (several SimPart blocks and BCC's delay): the tight SimECC PASSES, the control
    FAILS (its bound reaches the run-count limit, 3.52 > 3)."""
    x0, x1 = make_streams("empty", 300, 150)
    plan = plan_for("simecc", EPS, DELTA, x0, x1, "values")

    def factory(cid: str) -> SimECC:
        return cls(EPS, DELTA, NoiseKey.from_seed(16), cid, calibration="tight")

    res = audit(factory, plan.x0, plan.x1, RUNS, eps=EPS, delta=DELTA, score=plan.score,
                alpha=0.05)
    assert res.passed is passes, res
    if not passes:
        assert res.eps_lb > EPS


# --------------------------------------------------------------------- command line


def test_count_and_audit_take_the_calibration() -> None:
    import io

    from processor.commands.audit import main_audit
    from processor.commands.count import cmd_count

    ticks = "1\n_\n" * 200
    outs = {}
    for cal in ("paper", "tight"):
        out, err = io.StringIO(), io.StringIO()
        rc = cmd_count(["--mechanism", "simecc", "--epsilon", "150", "--delta", "1e-5",
                        "--seed", "3", "--calibration", cal], io.StringIO(ticks), out, err)
        assert rc == 0, err.getvalue()
        outs[cal] = out.getvalue()
    assert outs["paper"] != outs["tight"]
    # the tight stream is the core's tight counter, tick for tick
    c = SimECC(150.0, 1e-5, NoiseKey.from_seed(3), "offline", calibration="tight")
    ys = [c.update(1.0 if t % 2 == 0 else None) for t in range(400)]
    assert [float(line.split('"y":')[1].rstrip("}")) for line in
            outs["tight"].splitlines()] == ys
    with pytest.raises(SystemExit) as exc:
        main_audit(["--mechanism", "gaussiancc", "--epsilon", "1", "--delta", "1e-6",
                    "--calibration", "tight"])
    assert exc.value.code == 2
