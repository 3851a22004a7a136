"""Delivery: which trainer gets each data message, what is kept until it is handed
out, and how it travels.

:mod:`.dealer` deals each message to one audience (the free trainers of the server or
of a group, or the ranks of either), :mod:`.dealing` deals an epoch to the ranks of a
job and :mod:`.ranking` wraps that rule into the one ranked stage every source uses,
:mod:`.batches` cuts training batches per destination, :mod:`.groups` and
:mod:`.fanout` give every consumer group the whole stream, :mod:`.ledger` keeps what a
trainer was sent until it handed it out (a rank's successor gets the rest;
:mod:`.reliable` is the policy that re-deals a dead trainer's share within its
audience), :mod:`.ranksend` sends a rank its messages, and :mod:`.pool` puts large
arrays in the shared-memory pool for trainers on this host; :mod:`.carrier` chooses
socket or pool references per trainer, and :mod:`.outbox` sends them all. What they
ask of the control core is stated in :mod:`.registry`: none of them imports it.
"""
