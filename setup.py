"""Build and install hetsync: the Python package plus one compiled TensorFlow op library.

Every ``tf_ops/*.cc`` is compiled into ``hetsync/_hetsync_ops_tf<version>*.so`` (e.g.
``_hetsync_ops_tf2_18_1.cpython-311-x86_64-linux-gnu.so``) with the compile and link flags of the
TensorFlow that is *installed* in the target environment (``tf.sysconfig``). The name carries the
TensorFlow version, so environments with different TensorFlow versions can share one checkout
(editable installs build in place). A small ``_hetsync_ops_tf<version>_build.json`` beside the
library records that version so ``hetsync.ops`` can refuse a stale build with instructions.

Works with ``pip install .`` (build isolation on: TensorFlow's flags are then read by a
second interpreter run in isolated mode, ``python -I``, which sees the target
environment's site-packages) and with ``pip install -e .``.
"""
import glob
import itertools
import json
import os
import subprocess
import sys

from setuptools import Extension, find_packages, setup
from setuptools.command.build_ext import build_ext

HERE = os.path.dirname(os.path.abspath(__file__))

_TF_QUERY = (
    "import json, tensorflow as tf;"
    "print(json.dumps({'version': tf.__version__,"
    " 'include': tf.sysconfig.get_include(),"
    " 'cflags': tf.sysconfig.get_compile_flags(),"
    " 'lflags': tf.sysconfig.get_link_flags()}))"
)


def tensorflow_build_config():
    """Return ``{'version', 'cflags', 'lflags'}`` of the installed TensorFlow.

    Raises:
        RuntimeError: TensorFlow is not importable in the target environment.
    """
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    errors = []
    for args in ([sys.executable, "-c", _TF_QUERY], [sys.executable, "-I", "-c", _TF_QUERY]):
        proc = subprocess.run(args, capture_output=True, text=True, env=env)
        if proc.returncode == 0:
            return json.loads(proc.stdout.strip().splitlines()[-1])
        errors.append(proc.stderr.strip().splitlines()[-1:] or ["(no output)"])
    raise RuntimeError(
        "hetsync's op library needs TensorFlow installed in the environment it is built for "
        f"({sys.executable}); importing it failed: {errors}. Run `make deps`, or "
        "`pip install tensorflow-cpu==2.21.0` first."
    )


def release_version_defines(cfg):
    """``-D`` flags TensorFlow's ``release_version.h`` needs, or ``[]`` where it does not exist.

    TensorFlow 2.21 moved ``TF_VERSION_STRING`` from ``version.h`` to ``release_version.h``, which
    builds it from ``TF_MAJOR_VERSION``, ``TF_MINOR_VERSION``, ``TF_PATCH_VERSION`` and
    ``TF_VERSION_SUFFIX``; TensorFlow's own build passes those on the command line, the wheel's
    headers do not define them. They are taken here from the installed TensorFlow's version
    (``"2.21.0"`` -> 2, 21, 0, ``""``; ``"2.21.0rc1"`` -> suffix ``"-rc1"``).
    """
    header = os.path.join(cfg["include"], "tensorflow", "core", "public", "release_version.h")
    if not os.path.exists(header):
        return []
    major, minor, rest = cfg["version"].split(".", 2)
    patch = "".join(itertools.takewhile(str.isdigit, rest)) or "0"
    suffix = rest[len(patch):]
    if suffix and not suffix.startswith("-"):
        suffix = "-" + suffix
    return [f"-DTF_MAJOR_VERSION={int(major)}", f"-DTF_MINOR_VERSION={int(minor)}",
            f"-DTF_PATCH_VERSION={int(patch)}", f'-DTF_VERSION_SUFFIX="{suffix}"']


def library_tag(tf_version):
    """``"2.18.1"`` -> ``"tf2_18_1"``: the TensorFlow part of the op library's module name."""
    return "tf" + "".join(c if c.isalnum() else "_" for c in tf_version)


class BuildTFOps(build_ext):
    """build_ext that compiles against the installed TensorFlow and records its version.

    The extension ``hetsync._hetsync_ops`` is renamed ``hetsync._hetsync_ops_<library_tag>`` before
    it is built, once the installed TensorFlow version is known.
    """

    def build_extensions(self):
        cfg = tensorflow_build_config()
        tag = library_tag(cfg["version"])
        for ext in self.extensions:
            if ext.name == "hetsync._hetsync_ops":
                ext.name = f"hetsync._hetsync_ops_{tag}"
        for ext in self.extensions:
            ext.extra_compile_args = ["-O2", "-fPIC", "-std=c++17", "-Wno-sign-compare"] + [
                f for f in cfg["cflags"] if not f.startswith("-std=")
            ] + release_version_defines(cfg)
            ext.extra_link_args = list(cfg["lflags"])
        # setuptools' default compiler driver is gcc; the ops are C++.
        cxx = os.environ.get("CXX", "g++")
        self.compiler.set_executable("compiler_so", [cxx])
        self.compiler.set_executable("linker_so", [cxx, "-shared"])
        self.compiler.compiler_so = [cxx]
        super().build_extensions()
        for ext in self.extensions:
            with open(self._info_path(ext), "w") as f:
                json.dump({"tf_version": cfg["version"], "library": os.path.basename(self.get_ext_filename(ext.name))}, f)

    def _info_path(self, ext):
        # Beside the library as built (setuptools builds into build_lib, then copies in place).
        built = os.path.join(self.build_lib, self.get_ext_filename(self.get_ext_fullname(ext.name)))
        return os.path.join(os.path.dirname(built), _info_name(ext))

    def get_outputs(self):
        return super().get_outputs() + [self._info_path(ext) for ext in self.extensions]

    def copy_extensions_to_source(self):
        # In-place and editable builds: the version record goes where the library goes.
        super().copy_extensions_to_source()
        build_py = self.get_finalized_command("build_py")
        for ext in self.extensions:
            inplace_file, _ = self._get_inplace_equivalent(build_py, ext)
            self.copy_file(self._info_path(ext), os.path.join(os.path.dirname(inplace_file), _info_name(ext)))


def _info_name(ext):
    """The build record's file name for extension ``ext``: ``<module name>_build.json``."""
    return ext.name.rsplit(".", 1)[-1] + "_build.json"


setup(
    name="hetsync",
    version="0.1.0",
    description="Data-parallel training on heterogeneous clusters for TensorFlow/Keras 3 (RNA, SHAT, SelSync, Hop, task allocation).",
    long_description=open(os.path.join(HERE, "README.md")).read() if os.path.exists(os.path.join(HERE, "README.md")) else "",
    long_description_content_type="text/markdown",
    license="Apache-2.0",
    python_requires=">=3.9",
    packages=find_packages(include=["hetsync", "hetsync.*"]),
    package_data={"hetsync": ["_hetsync_ops*_build.json"]},
    ext_modules=[
        Extension(
            "hetsync._hetsync_ops",
            sources=sorted(glob.glob("tf_ops/*.cc")),
            include_dirs=["tf_ops"],
            depends=sorted(glob.glob("tf_ops/*.h")),
            language="c++",
        )
    ],
    cmdclass={"build_ext": BuildTFOps},
    install_requires=["numpy", "scikit-learn", "tqdm", "tabulate"],
    extras_require={"bench": ["matplotlib"]},
    entry_points={"console_scripts": ["hetsync-bench = hetsync.bench.__main__:main",
                                     "hetsync-cluster = hetsync.emulation.cluster.__main__:main"]},
)
