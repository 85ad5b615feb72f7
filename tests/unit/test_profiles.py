"""Device and link profiles (hetsync.emulation.profiles): step times derived from the published figures,
scenario parts that parse, and clear errors for unknown names."""
import pytest

from hetsync.emulation import profiles
from hetsync.emulation.cluster.spec import parse_rate
from hetsync.emulation.scenario import parse_spec


def test_step_times_follow_from_the_published_throughput():
    v100 = profiles.device("v100-16g-resnet50-fp32")
    assert v100.step_ms == pytest.approx(1000 * 128 / 412)  # 310.68 ms per 128-image step
    assert v100.scaling_efficiency == pytest.approx(3170 / (8 * 412))
    assert profiles.device_spec("a100-40g-resnet50-amp") == "device:107.789"
    for p in profiles.DEVICES.values():
        assert parse_spec(profiles.device_spec(p.name)).device_ms == pytest.approx(p.step_ms, abs=1e-3)
        assert p.source.startswith("https://") and 0 < p.scaling_efficiency <= 1
    for p in profiles.LINKS.values():
        assert parse_rate(p.rate) > 0 and p.source.startswith("https://")
    assert profiles.HOROVOD_SCALING["efficiency"]["ResNet101"] == 0.90


def test_unknown_profiles_are_refused_naming_the_known_ones():
    with pytest.raises(ValueError, match="unknown device profile 'h100'.*v100-16g-resnet50-fp32"):
        profiles.device("h100")
    with pytest.raises(ValueError, match="unknown link profile 'ib'.*10gbe"):
        profiles.link("ib")
