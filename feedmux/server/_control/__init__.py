"""The server's control: who is connected and what they are owed, as a state machine.

:mod:`.core` takes events (a hello, a heartbeat, an epoch's end) with the time and
returns the messages to send; :mod:`.ranks` admits ranked trainers, :mod:`.resume`
agrees where a restarted job starts, :mod:`.report` and :mod:`.metrics` say what the
server does, :mod:`.meters` counts where its time goes. Nothing here owns a socket.
"""
