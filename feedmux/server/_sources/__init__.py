"""Where the server's data messages come from: the encoded messages of one epoch after
another, in the order the seed fixes.

:mod:`.producer` draws from the streamer in this process and encodes (:mod:`.owning`
makes each drawn item the server's own, :mod:`.seeding` reseeds every epoch);
:mod:`.workers` runs shards of the streamer in forked processes, :mod:`.merge` fixes
the order in which their messages are taken and :mod:`.forward` passes them on. A
source decides nothing about who receives a message.
"""
