"""The paired A/B decision: its error rates in simulation, drift, and the rounds' bookkeeping."""

from __future__ import annotations

import math

import numpy as np
import pytest

from harness.ab.rounds import PairConfig, PairedCase, Round, run_rounds, status_verdict
from harness.ab.sequential import SequentialPlan, cautious_sigma, chi_square_quantile, weigh
from harness.bench.workloads import get_workload

CASES = 10  # a run's cases: alpha is split over them


def _verdict(log_ratios: np.ndarray, plan: SequentialPlan) -> tuple[str, int]:
    """What a case with these rounds (drawn in advance) ends as, and after how many rounds."""
    for n in range(1, plan.max_rounds + 1):
        evidence = weigh(list(log_ratios[:n]), plan, CASES)
        if evidence.decision is not None:
            return evidence.decision, n
    raise AssertionError("weigh must decide by max_rounds")


def _rates(slowdown: float, sigma: float, noise: str, reps: int = 1500) -> dict[str, float]:
    plan = SequentialPlan()
    rng = np.random.default_rng(7)
    counts = dict.fromkeys(("FAIL", "IMPROVED", "PASS", "INCONCLUSIVE"), 0)
    for _ in range(reps):
        if noise == "normal":
            draws = rng.normal(0.0, sigma, plan.max_rounds)
        else:  # Student's t with 3 degrees of freedom, scaled to the same spread
            draws = sigma * rng.standard_t(3, plan.max_rounds) / math.sqrt(3)
        counts[_verdict(math.log1p(slowdown) + draws, plan)[0]] += 1
    return {k: v / reps for k, v in counts.items()}


@pytest.mark.parametrize("noise", ["normal", "heavy-tailed"])
def test_unchanged_code_fails_a_case_at_most_at_its_share_of_alpha(noise: str) -> None:
    rates = _rates(0.0, 0.08, noise)
    share = SequentialPlan().alpha / CASES  # 0.005 per case: 5% over a run of 10
    assert rates["FAIL"] <= 1.5 * share, rates  # slack for 1500 draws
    assert rates["PASS"] >= 0.9, rates


@pytest.mark.parametrize("noise", ["normal", "heavy-tailed"])
def test_a_slowdown_of_the_threshold_fails_at_least_one_minus_beta(noise: str) -> None:
    rates = _rates(0.10, 0.08, noise)
    assert rates["FAIL"] >= 1 - SequentialPlan().beta, rates


def test_a_speedup_of_the_threshold_is_improved() -> None:
    rates = _rates(1 / 1.1 - 1, 0.05, "normal", reps=300)
    assert rates["IMPROVED"] >= 0.95, rates
    assert rates["FAIL"] == 0.0, rates


def test_the_plain_spread_would_false_alarm_more_than_the_cautious_one() -> None:
    """Why ``cautious_sigma``: with the plain estimate, small samples decide too early."""
    rng = np.random.default_rng(3)
    small = [rng.normal(0, 0.1, 6) for _ in range(400)]
    plain = sum(float(np.std(x, ddof=1)) < 0.07 for x in small)
    cautious = sum(cautious_sigma(list(x), 0.005) < 0.07 for x in small)
    assert cautious < plain / 3


def test_chi_square_quantile_is_close_to_the_tables() -> None:
    assert chi_square_quantile(0.10, 5) == pytest.approx(1.6103, rel=0.01)
    assert chi_square_quantile(0.10, 30) == pytest.approx(20.599, rel=0.005)


def test_no_decision_before_min_rounds_and_inconclusive_at_max() -> None:
    plan = SequentialPlan(min_rounds=6, max_rounds=8)
    assert weigh([0.5] * 5, plan, 1).decision is None  # 65% slower, but only 5 rounds
    assert weigh([0.5, 0.51, 0.49, 0.5, 0.5, 0.52], plan, 1).decision == "FAIL"
    noisy = [0.3, -0.3, 0.25, -0.2, 0.28, -0.31, 0.3, -0.25]
    assert weigh(noisy, plan, 1).decision == "INCONCLUSIVE"


@pytest.mark.parametrize(
    ("field", "value"),
    [("threshold", 0.0), ("alpha", 0.6), ("beta", 0.0), ("min_rounds", 2), ("max_rounds", 4)],
)
def test_a_bad_plan_is_refused(field: str, value: float) -> None:
    with pytest.raises(ValueError, match=field):
        SequentialPlan(**{field: value})


# -- the rounds, with sides whose times follow a model of a shared machine ------------


class ModelSide:
    """A side's worker stand-in: each forward takes ``base_ns * slowdown * machine()``."""

    def __init__(self, label: str, machine, slowdown: float, rng: np.random.Generator) -> None:
        self.label, self.machine, self.slowdown, self.rng = label, machine, slowdown, rng
        self.timed = 0

    def request(self, op: str, **fields):
        if op == "drop":
            return {}
        if op == "load":
            self.loaded = getattr(self, "loaded", 0) + 1
            return {"key": "k", "status": "PASSED", "error": None}
        assert op == "time"
        self.timed += 1
        samples = []
        for _ in range(fields["samples"]):
            noise = math.exp(self.rng.normal(0.0, 0.03))
            samples.append(int(1e6 * self.slowdown * self.machine() * noise))
        return {"samples_ns": samples}


class Machine:
    """A shared machine a noisy neighbour halves the speed of, for the case-rounds in ``slow``
    (both sides of a case's round run in one case-round: ``calls // 2``)."""

    def __init__(self, slow: range, factor: float = 2.0) -> None:
        self.slow, self.factor, self.calls = slow, factor, 0

    def tick(self) -> None:
        self.calls += 1

    def __call__(self) -> float:
        return self.factor if self.calls // 2 in self.slow else 1.0


def _pair(slowdown: float, machine: Machine, plan: SequentialPlan, seed: int = 0):
    rng = np.random.default_rng(seed)
    workload = get_workload("decode-sweep")
    cases = [
        PairedCase(workload, spec, base_status="PASSED", candidate_status="PASSED")
        for spec in workload.cases("cpu")
    ]
    base = ModelSide("base", machine, 1.0, rng)
    candidate = ModelSide("candidate", machine, 1.0 + slowdown, rng)
    sides = {"base": base, "candidate": candidate}

    class Ticking:
        def __init__(self, side):
            self.side = side

        def request(self, op, **fields):
            reply = self.side.request(op, **fields)
            if op == "time":
                machine.tick()
            return reply

    run_rounds({k: Ticking(v) for k, v in sides.items()}, cases, PairConfig(plan=plan), print)
    return cases


def test_a_neighbour_slowing_the_machine_for_half_the_rounds_moves_no_verdict() -> None:
    """Machine-wide drift hits both sides of a round alike: A/A passes, 10% slower fails."""
    plan = SequentialPlan(min_rounds=6, max_rounds=40)
    drift = range(0, 10_000, 2)  # every other pair of forwards runs at half speed
    for slowdown, expected in ((0.0, "PASS"), (0.10, "FAIL"), (0.30, "FAIL")):
        cases = _pair(slowdown, Machine(drift), plan)
        assert {c.verdict for c in cases} == {expected}, [(c.key, c.detail) for c in cases]


def test_unpaired_medians_of_the_same_drifting_rounds_would_call_a_change() -> None:
    """The same A/A samples compared side against side, not round by round: drift that
    came while the candidate ran looks like a regression."""
    plan = SequentialPlan(min_rounds=6, max_rounds=12)
    machine = Machine(range(12, 24))  # the neighbour comes for rounds 4-6 (4 cases a round)
    cases = _pair(0.0, machine, plan)
    first_half = [r for c in cases for r in c.rounds[:3]]
    second_half = [r for c in cases for r in c.rounds[-3:]]
    early = np.median([np.median(r.base_ns) for r in first_half])
    late = np.median([np.median(r.candidate_ns) for r in second_half])
    assert late / early > 1.5  # an unpaired view: "50% slower"
    assert {c.verdict for c in cases} == {"PASS"}  # the paired one


def test_a_side_slowed_alone_for_half_the_rounds_is_not_passed() -> None:
    """A slowdown that hits only the candidate, for half the rounds, is a real difference
    in what was measured: the test never calls it PASS."""
    plan = SequentialPlan(min_rounds=6, max_rounds=30)
    rng = np.random.default_rng(5)
    log_ratios = [
        math.log(1.3 if i % 2 else 1.0) + rng.normal(0, 0.02) for i in range(plan.max_rounds)
    ]
    assert _verdict(np.asarray(log_ratios), plan)[0] in ("FAIL", "INCONCLUSIVE")


def _aa_with_process_bias(fresh: bool, seed: int) -> list[PairedCase]:
    """Unchanged code whose every worker process runs some 8% faster or slower than another
    for its whole life (one draw per process): the bias measured on the AMD EPYC machine."""
    rng = np.random.default_rng(seed)
    machine = Machine(range(0))
    workload = get_workload("decode-sweep")
    cases = [
        PairedCase(workload, spec, base_status="PASSED", candidate_status="PASSED")
        for spec in workload.cases("cpu")
    ]
    started = []

    def start():
        pair = {
            label: ModelSide(label, machine, math.exp(rng.normal(0.0, 0.08)), rng)
            for label in ("base", "candidate")
        }
        started.append(pair)
        return pair

    plan = SequentialPlan(min_rounds=6, max_rounds=60)
    renew = (start, "cpu") if fresh else None
    run_rounds(start(), cases, PairConfig(plan=plan), lambda line: None, renew=renew)
    if fresh:  # a pair per round, and each rebuilt the cases still open
        assert len(started) == max(len(c.rounds) for c in cases)
        assert all(side.loaded for pair in started[1:] for side in pair.values())
    else:
        assert len(started) == 1
    return cases


def test_a_bias_a_process_keeps_for_life_fails_unchanged_code_unless_rounds_are_fresh() -> None:
    """Reused workers turn a per-process bias into a "change"; a fresh pair per round turns
    it into spread, and unchanged code then FAILs no more often than alpha allows."""
    runs = range(20)
    reused = sum(
        any(c.verdict in ("FAIL", "IMPROVED") for c in _aa_with_process_bias(False, s))
        for s in runs
    )
    fresh = sum(any(c.verdict == "FAIL" for c in _aa_with_process_bias(True, s)) for s in runs)
    assert reused >= 8, reused  # most runs: the two processes differ by more than the noise
    assert fresh <= 2, fresh  # alpha = 0.05 a run: about 1 in 20


def test_the_first_side_alternates_between_rounds_and_cases() -> None:
    cases = _pair(0.0, Machine(range(0)), SequentialPlan(min_rounds=6, max_rounds=6))
    assert [r.first for r in cases[0].rounds] == ["base", "candidate"] * 3
    assert [r.first for r in cases[1].rounds] == ["candidate", "base"] * 3


def test_a_round_is_the_log_of_the_ratio_of_medians() -> None:
    round_ = Round("base", [100, 300, 200], [440, 400, 10_000])
    assert round_.log_ratio == pytest.approx(math.log(440 / 200))


def test_a_case_only_one_side_can_run_gets_a_status_verdict() -> None:
    workload = get_workload("decode-sweep")
    spec = workload.cases("cpu")[0]
    wrong = PairedCase(workload, spec, "PASSED", "INCORRECT_NUMERICAL", {"candidate": "off"})
    assert status_verdict(wrong) == ("FAIL", "candidate INCORRECT_NUMERICAL: off")
    lost = PairedCase(workload, spec, "PASSED", "UNSUPPORTED")
    assert status_verdict(lost)[0] == "FAIL"
    neither = PairedCase(workload, spec, "UNSUPPORTED", "UNSUPPORTED")
    assert status_verdict(neither)[0] == "UNSUPPORTED"
    base_broken = PairedCase(workload, spec, "RUNTIME_ERROR", "PASSED")
    assert status_verdict(base_broken)[0] == "UNCOMPARED"
    assert status_verdict(PairedCase(workload, spec, "PASSED", "PASSED")) is None
