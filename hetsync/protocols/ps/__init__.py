"""Parameter-server family: ASP, SHAT, SHAT-root and ENSEMBLE (SHAT paper) and SSP. Modules:
``worker`` (the worker side every variant shares), ``server`` (the server loop and the sharding plan),
``shat`` (the mixing rules), ``ssp`` (bounded staleness)."""
