"""What `bonsai tune` decided, stored; `BONSAI_SPECULATIVE=auto` reads it before a launch.

identity.py  what a decision depends on: machine, build, model/drafter sha256, server settings
store.py     decisions on disk, keyed by those inputs; a decision whose inputs changed is stale
auto.py      the stored decision as concrete speculative settings for the launch plan
estimate.py  a draft-free candidate's speed from its replayed acceptance and the measured verify cost
traffic.py   re-deciding from a running server's replayed traffic: the verdict and the decision it makes

The measuring itself (`bonsai tune`) is the tune/ wing, above bench/: it runs servers.
"""
