"""Preparing a model through the cache: the hit, miss and no-cache flows, the two stages
of an entry and their background upgrade, native plans per input shape, direct-mode
lookups and the remote tier's read-through and write-back.

It returns a verified Plan with what it was prepared from (nncc/preparing/outcome.py);
nncc/model.py builds the runnable model from it. The store underneath (nncc/cache) keeps
bytes by token and knows nothing of plans or models.
"""
