"""Local-update family: local SGD and FedAvg (periodic parameter averaging), SelSync (selective
synchronization, with its data injection). Modules: ``periodic`` (the shared skeleton), ``localsgd``,
``fedavg``, ``selsync``, ``selsync_data``."""
