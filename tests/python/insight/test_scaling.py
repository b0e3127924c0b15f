"""The scaling model: step time and speed-up from bytes and compute time."""

import pytest

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
