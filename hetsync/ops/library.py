"""Find and load the compiled op library built for the running TensorFlow.

``setup.py`` compiles every ``tf_ops/*.cc`` into ``hetsync/_hetsync_ops_<tag>*.so`` (``<tag>``:
:func:`library_tag` of the TensorFlow it was built against, e.g. ``tf2_21_0``) and writes
``_hetsync_ops_<tag>_build.json`` beside it, so environments with different TensorFlow versions
share one checkout. :func:`load_library` loads the library once per process with
:func:`tf.load_op_library`. A custom-op library built for another TensorFlow can crash the process,
so the version is checked twice: in the build record before loading, and by the library's own
``HetsyncBuildInfo`` op after; a mismatch is refused with the command that rebuilds it.

This is the only module of :mod:`hetsync.ops` that imports another hetsync module
(:mod:`hetsync.errors`, for :class:`~hetsync.errors.OpLibraryError`).
"""
import glob
import json
import os
import threading

import tensorflow as tf

from hetsync.errors import OpLibraryError

__all__ = ["OpLibraryError", "library_tag", "load_library", "build_info"]

#: the folder the library is built into: the ``hetsync`` package, one level above this one.
_LIBRARY_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_REBUILD = "rebuild it with `make build` (another venv: `make build VENV=... TF_VERSION=...`; or `pip install --no-build-isolation -e .` in the repository)"
_lock = threading.Lock()
_library = None


def library_tag(tf_version=None):
    """The TensorFlow part of the op library's name: ``"2.18.1"`` -> ``"tf2_18_1"`` (str).

    ``setup.py`` builds ``_hetsync_ops_<tag>*.so`` for the installed TensorFlow, so environments
    with different TensorFlow versions share one checkout.

    Args:
        tf_version: str, a TensorFlow version; defaults to the running one (``tf.__version__``).
    """
    v = tf.__version__ if tf_version is None else tf_version
    return "tf" + "".join(c if c.isalnum() else "_" for c in v)


def _library_path():
    """Path of the library built for the running TensorFlow; OpLibraryError (naming the builds found) if none."""
    pattern = os.path.join(_LIBRARY_DIR, f"_hetsync_ops_{library_tag()}.*so")
    candidates = sorted(glob.glob(pattern))
    if not candidates:
        others = sorted(os.path.basename(p) for p in glob.glob(os.path.join(_LIBRARY_DIR, "_hetsync_ops*.so")))
        found = f" (found builds for other TensorFlow versions: {', '.join(others)})" if others else ""
        raise OpLibraryError(f"hetsync's op library is not built for TensorFlow {tf.__version__} (no "
                             f"{os.path.basename(pattern)} in {_LIBRARY_DIR}){found}; {_REBUILD}.")
    return candidates[0]


def _info_path(library):
    """The build record beside ``library``: ``_hetsync_ops_<tag>_build.json``."""
    name = os.path.basename(library).split(".", 1)[0]
    return os.path.join(os.path.dirname(library), f"{name}_build.json")


def load_library():
    """Load the op library once and return the module object of its generated op wrappers.

    Thread-safe; later calls return the same module. Every wrapper of :mod:`hetsync.ops` calls it,
    so the library loads on the first op used.

    Returns:
        The module returned by ``tf.load_op_library`` (ops ``hetsync_delay``, ``hetsync_build_info``...).

    Raises:
        OpLibraryError: the library is missing, was built for another TensorFlow version than
            the running one (message names both versions and how to rebuild), or fails to load.
    """
    global _library
    with _lock:
        if _library is not None:
            return _library
        path = _library_path()
        info_path = _info_path(path)
        if os.path.exists(info_path):
            with open(info_path) as f:
                built_for = json.load(f).get("tf_version")
            if built_for != tf.__version__:
                raise OpLibraryError(
                    f"hetsync's op library {path} was built for TensorFlow {built_for}, but TensorFlow "
                    f"{tf.__version__} is running; {_REBUILD}."
                )
        try:
            lib = tf.load_op_library(path)
        except (tf.errors.NotFoundError, OSError) as exc:
            raise OpLibraryError(f"hetsync's op library {path} failed to load ({exc}); {_REBUILD}.") from exc
        with tf.init_scope():  # eager even when first loaded while a step is being traced
            built_for = lib.hetsync_build_info().numpy().decode()
        if built_for != tf.__version__:
            raise OpLibraryError(
                f"hetsync's op library {path} reports TensorFlow {built_for}, running {tf.__version__}; {_REBUILD}."
            )
        _library = lib
        return lib


def build_info():
    """The TensorFlow version string (str, e.g. ``"2.21.0"``) the loaded op library was compiled against
    (op ``HetsyncBuildInfo``).

    Raises:
        OpLibraryError: as :func:`load_library`.
    """
    lib = load_library()
    with tf.init_scope():
        return lib.hetsync_build_info().numpy().decode()
