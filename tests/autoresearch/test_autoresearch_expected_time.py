"""A study's expected time is said before it starts, for the machine it runs on, with the
reason where it runs over its target."""

from __future__ import annotations

from pathlib import Path

from autoresearch.study.expected_time import (
    ExpectedTime,
    Machine,
    MeasuredTime,
    expected_time_lines,
)
from autoresearch.study.spec import Study

DEMO = Path(__file__).resolve().parents[2] / "autoresearch" / "configs" / "demo_study.yaml"
FP32_2 = MeasuredTime(dtype="float32", cores=2, minutes=33, keep_minutes=50, source="log.md")
BF16_2 = MeasuredTime(dtype="bfloat16", cores=2, minutes=18, source="log.md")
EXPECTED = ExpectedTime(target_minutes=20, measured=[FP32_2, BF16_2],
                        over_target="Cutting it further would leave nothing to learn.")
NO_BF16 = "CPU has no bf16 matmul instructions"


def test_a_cpu_without_bf16_is_told_its_time_and_why_it_is_over_the_target():
    lines = expected_time_lines(EXPECTED, Machine("cpu", "float32", 2, NO_BF16))
    assert lines[0].startswith("Expected time on this machine (cpu, float32, 2 thread(s)): "
                               "about 33 minutes, about 50 if a change is kept")
    assert "measured on 2 cores, log.md" in lines[0]
    assert lines[1] == ("That is over the study's 20-minute target: the engine runs float32 "
                        f"here ({NO_BF16}); this machine has 2 thread(s). Cutting it further "
                        "would leave nothing to learn.")


def test_within_the_target_nothing_more_is_said_and_more_cores_scale_within_a_bound():
    assert expected_time_lines(EXPECTED, Machine("cpu", "bfloat16", 2)) == [
        "Expected time on this machine (cpu, bfloat16, 2 thread(s)): about 18 minutes "
        "(measured on 2 cores, log.md)."]
    many = expected_time_lines(EXPECTED, Machine("cpu", "float32", 64, NO_BF16))
    assert "about 16 minutes, about 25 if a change is kept (scaled from 2 cores" in many[0]
    assert len(many) == 1


def test_a_machine_nothing_was_measured_on_is_told_so():
    lines = expected_time_lines(EXPECTED, Machine("cuda", "bfloat16", 16))
    assert lines == ["Expected time: nothing measured on a machine like this one (cuda, "
                     "bfloat16, 16 thread(s)). Measured: cpu float32 on 2 cores: 33 min; cpu "
                     "bfloat16 on 2 cores: 18 min."]
    assert expected_time_lines(None, Machine("cpu", "float32", 2)) == []
    assert expected_time_lines(EXPECTED, None) == []


def test_the_demo_declares_what_it_was_measured_to_take():
    expected = Study.from_file(DEMO).expected_time
    assert expected is not None and expected.target_minutes == 20 and expected.measured
    for measured in expected.measured:
        assert (DEMO.parents[2] / measured.source.split("#")[0]).is_file()


def test_what_a_study_is_expected_to_cost_does_not_change_its_evidence_seeds():
    from autoresearch.study.journal import evidence_key

    bare = Study(name="costs")
    priced = Study(name="costs", expected_time=EXPECTED)
    assert (evidence_key(bare.model_dump(mode="json"))
            == evidence_key(priced.model_dump(mode="json")))
    assert (evidence_key(bare.model_dump(mode="json"))
            != evidence_key(Study(name="costs", seed=1).model_dump(mode="json")))
