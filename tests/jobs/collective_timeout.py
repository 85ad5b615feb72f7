"""Run under mpirun -np 2: rank 1 never joins an allreduce (it sleeps 5 timeouts); rank 0 must fail within the timeout."""
import sys
import time

import tensorflow as tf

import hetsync

timeout_s = float(sys.argv[1])
hetsync.init(collective_timeout_s=timeout_s)
t = time.time()
if hetsync.rank() == 0:
    try:
        hetsync.transport.allreduce_mean([tf.ones([3])], name="never_joined")
        print("RESULT no-error", flush=True)
    except Exception as exc:  # horovod raises UnknownError after its stall shutdown
        print(f"RESULT error {time.time() - t:.1f} {type(exc).__name__}: {exc}".replace("\n", " "), flush=True)
        sys.exit(3)
else:
    time.sleep(5 * timeout_s)
