"""hetsync.world's choice of what horovod's collectives run on: the slot plan of the Gloo rendezvous made
through MPI, and the clear errors for a bad choice or a missing interface."""
import pytest

from hetsync import rendezvous, world


def _plan(hosts):
    return [(s.hostname, s.rank, s.local_rank, s.local_size, s.cross_rank, s.cross_size) for s in
            rendezvous.gloo_slots(hosts)]


def test_gloo_slots_on_two_hosts_of_two():
    assert _plan(["h0", "h0", "h1", "h1"]) == [("h0", 0, 0, 2, 0, 2), ("h0", 1, 1, 2, 0, 2),
                                               ("h1", 2, 0, 2, 1, 2), ("h1", 3, 1, 2, 1, 2)]


def test_gloo_slots_on_uneven_interleaved_hosts():
    # local rank 1 exists on h0 only: its cross communicator has one member
    assert _plan(["h0", "h1", "h0"]) == [("h0", 0, 0, 2, 0, 2), ("h1", 1, 0, 1, 1, 2), ("h0", 2, 1, 2, 0, 1)]


def test_gloo_slots_refuses_an_empty_host_name():
    with pytest.raises(ValueError, match="non-empty host name"):
        rendezvous.gloo_slots(["h0", ""])


def test_a_bad_collectives_choice_is_refused_naming_the_allowed_values(monkeypatch):
    monkeypatch.setenv(world.COLLECTIVES_ENV, "nccl")
    with pytest.raises(ValueError, match=r"HETSYNC_COLLECTIVES='nccl': allowed values are mpi, gloo"):
        world._chosen_collectives()
    monkeypatch.setenv(world.COLLECTIVES_ENV, " GLOO ")
    assert world._chosen_collectives() == "gloo"
    monkeypatch.delenv(world.COLLECTIVES_ENV)
    assert world._chosen_collectives() == "mpi"


def test_the_gloo_interface_comes_from_the_launch_or_is_asked_for(monkeypatch):
    monkeypatch.delenv("HOROVOD_GLOO_IFACE", raising=False)
    monkeypatch.setenv("OMPI_MCA_btl_tcp_if_include", "eth0")
    assert rendezvous.gloo_iface(single_host=False) == "eth0"
    monkeypatch.setenv("OMPI_MCA_btl_tcp_if_include", "198.18.0.0/15")  # a network, not an interface
    assert rendezvous.gloo_iface(single_host=True) == "lo"
    with pytest.raises(RuntimeError, match="set HOROVOD_GLOO_IFACE"):
        rendezvous.gloo_iface(single_host=False)
    monkeypatch.setenv("HOROVOD_GLOO_IFACE", "ib0")
    assert rendezvous.gloo_iface(single_host=False) == "ib0"
    assert rendezvous.iface_address("lo") == "127.0.0.1"
    with pytest.raises(RuntimeError, match="no IPv4 address"):
        rendezvous.iface_address("nosuchif0")
