"""Where the server's data messages come from: the encoded messages of one epoch after
another, in the order the seed fixes.

:mod:`.producer` draws from the streamer in this process and encodes (:mod:`.owning`
makes each drawn item the server's own, :mod:`.seeding` reseeds every epoch);
:mod:`.shards` splits the source into the run's shards, :mod:`.workers` runs them in
forked processes (:mod:`.runner`, :mod:`.assignment`: which worker runs which shard),
:mod:`.merge` fixes the order in which their messages are taken and :mod:`.scaling` /
:mod:`.autoscale` change the workers live (the server's forwarding loop,
:mod:`feedmux.server._forward`, passes their messages on). A source decides nothing
about who receives a message: it pushes into the data path (:mod:`.._delivery`) and
never imports the control core or the shell.
"""
