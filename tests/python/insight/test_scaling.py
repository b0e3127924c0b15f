"""The scaling model: step time and speed-up from bytes and compute time."""

import pytest

from multigpu.engines import choice as choice_lib
from multigpu.insight import scaling


def test_busiest_device_sets_the_communication_time():
    traffic = {"/device:GPU:0": (3e9, 1e9), "/device:GPU:1": (1e9, 2e9)}
    assert scaling.busiest_bytes(traffic) == 3e9
    assert scaling.busiest_bytes({}) == 0
    link = scaling.Link("test link", 1e9, "1 GB/s")
    p = scaling.predict_step(traffic, 1.0, link, devices=2)
    # 3 GB through a 1 GB/s port: 3 s after 1 s of compute.
    assert p.comm_seconds == pytest.approx(3.0)
    assert p.step_seconds == pytest.approx(4.0)
    assert p.speedup == pytest.approx(2 * 1.0 / 4.0)
    overlapped = scaling.predict_step(traffic, 1.0, link, devices=2,
                                      overlap=True)
    assert overlapped.step_seconds == pytest.approx(3.0)


def test_no_traffic_scales_linearly_and_links_are_named():
    p = scaling.predict_step({}, 0.05, "nvlink4", devices=8)
    assert p.speedup == pytest.approx(8.0) and p.link == "NVLink 4 (H100)"
    assert scaling.LINKS["pcie4"].bandwidth == 31.5e9
    assert scaling.LINKS["nvlink3"].bandwidth == 300e9


def test_a_report_is_traffic():
    rows = [{"device": "a", "sent_bytes": 10, "received_bytes": 40},
            {"device": "b", "sent_bytes": None, "received_bytes": None}]
    assert scaling.busiest_bytes(rows) == 40


def test_bad_arguments_name_the_value():
    with pytest.raises(ValueError, match=r"Invalid `link`.*'nvlink9'"):
        scaling.predict_step({}, 1.0, "nvlink9", devices=2)
    with pytest.raises(ValueError, match=r"Invalid `compute_seconds`"):
        scaling.predict_step({}, 0, "pcie4", devices=2)
    with pytest.raises(ValueError, match=r"Invalid `compute_seconds`"):
        scaling.predict_step({}, True, "pcie4", devices=2)


def test_choose_engine_follows_the_byte_counts():
    gpus = [f"/device:GPU:{i}" for i in range(8)]
    assert choice_lib.choose_engine(gpus).engine == "mirrored"
    assert "7 copies" in choice_lib.choose_engine(gpus).reason
    assert choice_lib.choose_engine(gpus[:4]).engine == "mirrored"
    assert choice_lib.choose_engine(gpus[:2]).engine == "replicate"
    cpus = [f"/device:CPU:{i}" for i in range(4)]
    assert choice_lib.choose_engine(cpus).engine == "replicate"


def test_auto_engine_on_gpu_names_follows_choose_engine():
    # The decision only: which engine is faster on real GPUs only a GPU run
    # can confirm (docs/benchmarks.md gives the prediction and its basis).
    gpus = [f"/device:GPU:{i}" for i in range(8)]
    for n, engine in ((2, "replicate"), (3, "mirrored"), (4, "mirrored"),
                      (8, "mirrored")):
        choice = choice_lib.auto_engine(gpus[:n])
        assert (choice.engine, choice.fallback) == (engine, None)
    cpus = [f"/device:CPU:{i}" for i in range(8)]
    assert choice_lib.auto_engine(cpus).engine == "replicate"
    assert "logical CPU devices" in choice_lib.auto_engine(cpus).reason


def test_auto_engine_falls_back_when_cpu_merge_is_false():
    gpus = [f"/device:GPU:{i}" for i in range(4)]
    choice = choice_lib.auto_engine(gpus, cpu_merge=False)
    assert choice.engine == "replicate"
    assert "cpu_merge=False" in choice.fallback
    message = choice_lib.fallback_message(choice)
    assert message.startswith("engine='auto' would pick the mirrored engine")
    assert "using engine='replicate'" in message
    # On 2 GPUs auto picks the replicate engine anyway: nothing to fall from.
    assert choice_lib.auto_engine(gpus[:2], cpu_merge=False).fallback is None
