"""The agent's background thread and its edge to the broker: the worker (:mod:`.worker`) wakes on its schedule
(:mod:`._schedule`, :mod:`._alarm`), packs what the training thread appended into columnar step batches and
wire messages (:mod:`.columnar`, :mod:`.batcher`), and publishes them in order to JetStream, acknowledged in an
inbox of its own (:mod:`.publisher`, :mod:`.acks`), giving the GIL back between slices of work
(:mod:`._pacing`). What waits for the broker is held by :mod:`trainvigil.agents.spill`."""
