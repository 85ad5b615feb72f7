"""The ResNet-50 throughput cell (examples/benchmarks/resnet_throughput.py): the ring allreduce's time, and the
figures from the two reports of examples/keras_applications.py in the device profile's terms. The launches
themselves run on the emulated cluster (the script's command line)."""
import importlib.util
import os

import pytest

from hetsync.emulation import profiles

_PATH = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "examples",
                     "benchmarks", "resnet_throughput.py")
_spec = importlib.util.spec_from_file_location("resnet_throughput", _PATH)
throughput = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(throughput)


def test_ring_allreduce_time():
    assert throughput.ring_allreduce_s(100_000_000, 4, 25e9) == pytest.approx(2 * 3 / 4 * 8e8 / 25e9)
    assert throughput.ring_allreduce_s(100, 1, 1e9) == 0.0
    with pytest.raises(ValueError, match="need hosts >= 1"):
        throughput.ring_allreduce_s(1, 0, 1e9)


def _report(n, step_ms, dilation=40.0, overruns=0):
    return {"world_size": n, "step_ms_median_per_rank": [step_ms] * n, "params": 23_608_202,
            "emulated_steps": 8 * n, "overrun_steps": overruns, "dilation": dilation}


def test_figures_in_the_profiles_terms():
    v100 = profiles.device("v100-16g-resnet50-fp32")
    one, many = _report(1, 40 * v100.step_ms), _report(8, 40 * v100.step_ms / 0.8, overruns=1)
    f = throughput.figures(one, many, v100, 4, 25e9)
    assert f["scaling_efficiency"] == pytest.approx(0.8)
    assert f["images_per_s_one"] == pytest.approx(412.0)  # the profile's own figure: one device, no links
    assert f["images_per_s"] == pytest.approx(8 * 412.0 * 0.8)
    assert f["overrun_fraction"] == pytest.approx(1 / 64)
    assert f["compute_to_comm"] == pytest.approx(v100.step_ms / 1e3 / throughput.ring_allreduce_s(4 * 23_608_202, 4, 25e9))
    with pytest.raises(ValueError, match="dilations differ"):
        throughput.figures(one, _report(8, 1.0, dilation=20.0), v100, 4, 25e9)
