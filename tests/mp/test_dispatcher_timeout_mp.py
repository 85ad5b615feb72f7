"""The point-to-point dispatcher's creation (a collective duplication of the communicator) fails with an error
naming the rank and the world when a rank never comes (2-rank mpirun), and completes once the late rank arrives."""
import json

from conftest import launch


def test_dispatcher_creation_times_out_naming_the_rank_when_a_rank_never_comes(tmp_path):
    """The first dispatcher() call (collective) had no timeout: a rank that never made it hung the
    others. Now rank 0 fails after 2 s with an error naming itself and the world size; when rank 1
    comes later, rank 0's next call completes the same duplication and messages flow."""
    out = tmp_path / "out.json"
    launch(2, ["tests/jobs/dispatcher_create_timeout.py", str(out)], timeout=180)
    res = json.loads(out.read_text())
    assert res["error"] is not None
    assert res["error"].startswith("rank 0: timed out after 2 s creating the point-to-point dispatcher")
    assert "world of 2 ranks" in res["error"] and "hetsync.transport.dispatcher()" in res["error"]
    assert res["waited_s"] >= 2.0
    assert res["hello"] == 1
