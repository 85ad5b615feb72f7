"""Which protocol for this cluster: a probe, predictions from :mod:`hetsync.sim`, a recommendation.

``python -m hetsync.advise --predict --scenario SPEC --np N ...`` predicts without a probe and without
TensorFlow (:mod:`hetsync.advise.predict`); ``horovodrun -np N python -m hetsync.advise`` probes the
cluster it runs on first (:mod:`hetsync.advise.probe`: per-rank step times of the model, allreduce and
point-to-point times at the model's gradient size, the hosts) and predicts from what it measured.
Importing this package loads no TensorFlow.
"""
