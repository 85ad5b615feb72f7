"""Models for the advisor's probe tests: ``--model advise_models:small`` builds; ``advise_models:hang_on_rank1``
never returns on rank 1 (a rank stuck before the probe starts)."""
import os
import time


def small():
    """A 2-layer MLP on 8x8 inputs (10 classes), built with keras.Input."""
    import keras

    return keras.Sequential([keras.Input((8, 8, 1)), keras.layers.Flatten(), keras.layers.Dense(32, activation="relu"),
                             keras.layers.Dense(10, activation="softmax")])


def hang_on_rank1():
    """Rank 1 sleeps for 10 minutes before returning; other ranks get :func:`small`."""
    if os.environ.get("OMPI_COMM_WORLD_RANK") == "1":
        time.sleep(600)
    return small()
