"""Hop family: decentralized training over a graph with update and token queues (Hop sections 3-6).
Modules: ``protocol`` (Hop), ``notifyack`` (the NOTIFY-ACK baseline), ``graph`` (graphs and their checks;
TF-free, used by the simulator)."""
