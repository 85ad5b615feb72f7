"""The compiled op library (``tf_ops/`` -> ``hetsync/_hetsync_ops_tf<version>*.so``) and its Python wrappers.

One module per op family, every name offered here as ``hetsync.ops.<name>``:

* :mod:`hetsync.ops.library`: find and load the library built for the running TensorFlow
  (:func:`load_library`, :func:`build_info`, :func:`library_tag`, :class:`OpLibraryError`); a build
  for another TensorFlow is refused with the command that rebuilds it.
* :mod:`hetsync.ops.delay`: :func:`delay`, the emulated-device delay inside the training step.
* :mod:`hetsync.ops.grad_cache`: RNA's gradient cache (``grad_cache_*``; RNA sections 3.3 and 6).
* :mod:`hetsync.ops.hop_queues`: Hop's update and token queues (``hop_update_queue_*``,
  ``hop_token_*``; Hop sections 4.1, 4.2, 6.1).

The library is loaded on the first op used, not on import. ``hetsync.ops.delay`` is the function;
the module defining it is reached as ``importlib.import_module("hetsync.ops.delay")``.
"""
from hetsync.ops.library import OpLibraryError, build_info, library_tag, load_library
from hetsync.ops.delay import delay
from hetsync.ops.grad_cache import (GRAD_CACHE_COUNTERS, grad_cache_create, grad_cache_destroy, grad_cache_publish,
                                    grad_cache_read, grad_cache_set_released, grad_cache_status, grad_cache_take,
                                    grad_cache_wait, grad_cache_wait_published, grad_cache_write)
from hetsync.ops.hop_queues import (HOP_UPDATE_QUEUE_COUNTERS, hop_token_cancel, hop_token_close, hop_token_put,
                                    hop_token_queue_create, hop_token_queue_destroy, hop_token_size, hop_token_take,
                                    hop_update_queue_close, hop_update_queue_counters, hop_update_queue_create,
                                    hop_update_queue_dequeue, hop_update_queue_dequeue_newest,
                                    hop_update_queue_destroy, hop_update_queue_enqueue, hop_update_queue_size,
                                    hop_update_queue_status)

__all__ = ["load_library", "build_info", "library_tag", "delay", "OpLibraryError",
           "GRAD_CACHE_COUNTERS", "grad_cache_create", "grad_cache_write", "grad_cache_read", "grad_cache_take",
           "grad_cache_publish", "grad_cache_wait", "grad_cache_wait_published", "grad_cache_set_released",
           "grad_cache_status", "grad_cache_destroy",
           "HOP_UPDATE_QUEUE_COUNTERS", "hop_update_queue_create", "hop_update_queue_enqueue",
           "hop_update_queue_dequeue", "hop_update_queue_size", "hop_update_queue_dequeue_newest",
           "hop_update_queue_status", "hop_update_queue_counters", "hop_update_queue_close",
           "hop_update_queue_destroy", "hop_token_queue_create", "hop_token_take", "hop_token_put",
           "hop_token_size", "hop_token_close", "hop_token_cancel", "hop_token_queue_destroy"]
