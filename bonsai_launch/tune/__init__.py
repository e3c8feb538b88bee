"""`BONSAI_SPECULATIVE=auto`: measure on this machine and model, speculate only where it pays.

identity.py    what a decision depends on: machine, build, model/drafter sha256, prompt set
store.py       decisions on disk, keyed by those inputs; a decision whose inputs changed is stale
candidates.py  the configurations worth trying with this build and model (pure)
decide.py      the decision rule over a bench summary: plain unless a gain beyond noise (pure)
session.py     the bounded measurement (`bonsai tune`), built on the bench's runner
auto.py        turning BONSAI_SPECULATIVE=auto into concrete settings for the launch plan
"""
