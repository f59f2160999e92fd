"""The agent's disk side: what is not yet acknowledged waits in memory, then in an append-only spill file
(:mod:`.outbox`, locked while its agent lives: :mod:`._livelock`), and what is left at exit is sealed into a
file for the next agent on the machine or ``vigil push`` to deliver (:mod:`.push`, which refuses a file with a
frame off its run's data subjects: :mod:`._spill_check`). The spill files of agents that were killed are
adopted as sealed files (:mod:`._orphans`)."""
