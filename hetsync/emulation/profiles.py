"""Device and link profiles named from public figures: what real cluster an emulated run stands for.

An emulated device (scenario part ``device:MS``, :mod:`hetsync.emulation.scenario`) pads every step to MS
milliseconds; a profile says where an MS comes from. Each :class:`DeviceProfile` is one published
training-throughput figure (images/s of one accelerator at a batch size and precision), so its step time
is ``1000 * batch / images_per_s`` milliseconds. The communication volume of a step depends on the
parameter count only, not on the input size, so a run may do its real math on a smaller input (ResNet-50
at 32x32 on this machine's CPU) and be padded to the profile's step: the links then carry exactly the
gradients of the profiled step. Link profiles name the network of a cluster the same way (``tc`` units).

Sources (read 2026-11): NVIDIA DeepLearningExamples, TensorFlow ResNet-50 v1.5 README, "Training
performance results" (TensorFlow 20.06-tf1-py3 NGC container, XLA, averaged over an epoch), commit
729963dd47e7c8bd462ad10bfac7a7b0b604e6dd of https://github.com/NVIDIA/DeepLearningExamples, file
``TensorFlow/Classification/ConvNets/resnet50v1.5/README.md``; horovod's README (scaling efficiency);
the AWS EC2 P3 instance table (network bandwidth per instance size).
"""
import dataclasses

__all__ = ["DeviceProfile", "LinkProfile", "DEVICES", "LINKS", "device", "link", "device_spec",
           "HOROVOD_SCALING"]

_DLE = ("https://github.com/NVIDIA/DeepLearningExamples/blob/729963dd47e7c8bd462ad10bfac7a7b0b604e6dd/"
        "TensorFlow/Classification/ConvNets/resnet50v1.5/README.md")


@dataclasses.dataclass(frozen=True)
class DeviceProfile:
    """One accelerator's published training throughput.

    Attributes:
        name: str, the profile's name. accelerator: str. model: str (a ``keras.applications`` name).
        image_size: int pixels (height = width) of the published figure. batch: int images per step
            per accelerator. precision: str. images_per_s: float images per second of one accelerator.
        images_per_s_n: float images per second of ``n`` accelerators in one server (weak scaling), or None.
        n: int accelerators of ``images_per_s_n``. source: str URL. quote: str, the row as published.
    """

    name: str
    accelerator: str
    model: str
    image_size: int
    batch: int
    precision: str
    images_per_s: float
    images_per_s_n: float
    n: int
    source: str
    quote: str

    @property
    def step_ms(self):
        """Milliseconds per step of one accelerator: 1000 x batch / images_per_s (float)."""
        return 1000.0 * self.batch / self.images_per_s

    @property
    def scaling_efficiency(self):
        """Published throughput of n accelerators over n x one's (float in (0, 1]), or None."""
        return self.images_per_s_n / (self.n * self.images_per_s) if self.images_per_s_n else None


@dataclasses.dataclass(frozen=True)
class LinkProfile:
    """A cluster network's link rate per server.

    Attributes:
        name: str. rate: str in ``tc`` units (``hetsync-cluster --link``). what: str. source: str URL.
    """

    name: str
    rate: str
    what: str
    source: str


#: the device profiles by name (ResNet-50 v1.5 at 224x224, ImageNet, XLA, NVIDIA DeepLearningExamples).
DEVICES = {p.name: p for p in (
    DeviceProfile("v100-16g-resnet50-fp32", "NVIDIA V100 16 GB (DGX-1)", "ResNet50", 224, 128, "FP32+XLA",
                  412.0, 3170.0, 8, _DLE, "| 1  | 128 (FP32) / 256 (AMP) | 412 img/s  | 1270 img/s | 3.08x | 1.00x "
                  "| 1.00x | and | 8  | 128 (FP32) / 256 (AMP) | 3170 img/s | 9510 img/s | 3.00x | 7.69x | 7.48x |"),
    DeviceProfile("v100-16g-resnet50-amp", "NVIDIA V100 16 GB (DGX-1)", "ResNet50", 224, 256, "AMP+XLA",
                  1270.0, 9510.0, 8, _DLE, "as v100-16g-resnet50-fp32, the AMP column"),
    DeviceProfile("a100-40g-resnet50-tf32", "NVIDIA A100 40 GB (DGX A100)", "ResNet50", 224, 256, "TF32+XLA",
                  909.0, 7000.0, 8, _DLE, "| 1  | 256 | 909 img/s  | 2375 img/s    | 2.60x | 1.00x | 1.00x | and "
                  "| 8  | 256 | 7000 img/s | 17400 img/s   | 2.48x | 7.70x | 7.32x |"),
    DeviceProfile("a100-40g-resnet50-amp", "NVIDIA A100 40 GB (DGX A100)", "ResNet50", 224, 256, "AMP+XLA",
                  2375.0, 17400.0, 8, _DLE, "as a100-40g-resnet50-tf32, the AMP column"),
)}

#: the link profiles by name.
LINKS = {p.name: p for p in (
    LinkProfile("10gbe", "10gbit", "commodity 10 Gbit/s Ethernet (AWS p3.8xlarge: 10 Gbps)",
                "https://aws.amazon.com/ec2/instance-types/p3/"),
    LinkProfile("25gbe", "25gbit", "25 Gbit/s Ethernet (AWS p3.16xlarge, 8 x V100: 25 Gbps; horovod's benchmark: "
                "RoCE-capable 25 Gbit/s)", "https://aws.amazon.com/ec2/instance-types/p3/"),
)}

#: horovod's published scaling efficiency, verbatim, with its source.
HOROVOD_SCALING = {
    "text": "Below is a chart representing the benchmark that was done on 128 servers with 4 Pascal GPUs each "
            "connected by RoCE-capable 25 Gbit/s network: [...] Horovod achieves 90% scaling efficiency for both "
            "Inception V3 and ResNet-101, and 68% scaling efficiency for VGG-16.",
    "efficiency": {"InceptionV3": 0.90, "ResNet101": 0.90, "VGG16": 0.68},
    "gpus": 512,
    "source": "https://github.com/horovod/horovod/blob/master/README.rst",
}


def device(name):
    """The :class:`DeviceProfile` called ``name``.

    Raises:
        ValueError: an unknown name (lists the known ones).
    """
    if name not in DEVICES:
        raise ValueError(f"unknown device profile {name!r}; known: {', '.join(sorted(DEVICES))}")
    return DEVICES[name]


def link(name):
    """The :class:`LinkProfile` called ``name``.

    Raises:
        ValueError: an unknown name (lists the known ones).
    """
    if name not in LINKS:
        raise ValueError(f"unknown link profile {name!r}; known: {', '.join(sorted(LINKS))}")
    return LINKS[name]


def device_spec(name):
    """The scenario part (str) of device profile ``name``: ``device:MS`` with MS its step time in
    milliseconds (three decimals), e.g. ``"device:310.680"`` for ``v100-16g-resnet50-fp32``.

    Raises:
        ValueError: an unknown name.
    """
    return f"device:{device(name).step_ms:.3f}"
