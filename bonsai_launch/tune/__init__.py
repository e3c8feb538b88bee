"""`BONSAI_SPECULATIVE=auto`: measure on this machine and model, speculate only where it pays.

candidates.py  the configurations worth trying with this build and model (pure)
decide.py      the decision rule over a bench summary: plain unless a gain beyond noise (pure)
subject.py     what a session measures (model, drafter, build, server settings) and the Decision it stores
session.py     the bounded measurement (`bonsai tune`), built on the bench's servers and requests
rounds.py      its rounds against the budget: plain, screening, the finalists' paired runs
screen.py      screening the draft-free candidates by replaying plain's tokens; who gets full repeats
draft_head.py  whether a draft model is also measured with the whole LM head: plain's tokens past the cut

What a decision depends on, where it is stored and how a launch reads it: decisions/ (below
server/, which reads it before every launch).
"""
