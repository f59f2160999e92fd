-- The history file's schema: tables, their comments, and the views shipped for people and tools.
--
-- Run on every open (trainvigil.daemon.store), after any migration of an older file, so it must
-- stay idempotent: CREATE TABLE IF NOT EXISTS, COMMENT ON (replaces), CREATE OR REPLACE VIEW.
-- A column added here only reaches files that do not have the table yet: an existing file needs
-- a migration in store/schema.py (migrate) and a new SCHEMA_VERSION.
--
-- Times are TIMESTAMPTZ (instants, shown in the reader's time zone; the daemon's is UTC). Keep the
-- views to SQL that DuckDB 1.4 binds: the file is read by CLIs older than the daemon's DuckDB.
-- The columns of `steps` are in the order of store._arrow.STEP_COLUMNS (the wire's KNOWN_METRICS); rows are
-- inserted by column name, from the wire structs' fields (tests/unit/test_store_columns.py checks they match).

CREATE TABLE IF NOT EXISTS schema_info (version INTEGER);
CREATE TABLE IF NOT EXISTS runs (
    run_id VARCHAR PRIMARY KEY,
    first_seen TIMESTAMPTZ,
    last_seen TIMESTAMPTZ,
    world_size INTEGER,
    status VARCHAR,
    ended_at TIMESTAMPTZ,
    argv JSON
);
CREATE TABLE IF NOT EXISTS steps (
    run_id VARCHAR NOT NULL,
    rank INTEGER NOT NULL,
    step BIGINT NOT NULL,
    time TIMESTAMPTZ,
    loss DOUBLE,
    grad_norm DOUBLE,
    lr DOUBLE,
    step_time DOUBLE,
    samples DOUBLE,
    tokens DOUBLE,
    reward DOUBLE,
    entropy DOUBLE,
    kl DOUBLE,
    extra MAP(VARCHAR, DOUBLE)
);
CREATE TABLE IF NOT EXISTS events (
    run_id VARCHAR, rank INTEGER, time TIMESTAMPTZ, kind VARCHAR, step BIGINT, fields JSON
);
CREATE TABLE IF NOT EXISTS heartbeats (
    run_id VARCHAR, rank INTEGER, host VARCHAR, pid INTEGER, time TIMESTAMPTZ, last_step BIGINT,
    buffered BIGINT, spilled_bytes BIGINT, connected BOOLEAN, dropped JSON
);
CREATE TABLE IF NOT EXISTS gil_samples (
    run_id VARCHAR, rank INTEGER, time TIMESTAMPTZ, period DOUBLE, samples INTEGER,
    wait_p50 DOUBLE, wait_p90 DOUBLE, wait_p99 DOUBLE, wait_max DOUBLE,
    busy_share DOUBLE, wait_share DOUBLE, held DOUBLE, switch_interval DOUBLE, gil_enabled BOOLEAN,
    threads JSON
);
CREATE TABLE IF NOT EXISTS checkpoints (
    run_id VARCHAR, rank INTEGER, time TIMESTAMPTZ, step BIGINT, origin VARCHAR, path VARCHAR,
    algo VARCHAR, root VARCHAR, ok BOOLEAN, tensors JSON
);
CREATE TABLE IF NOT EXISTS anomalies (
    run_id VARCHAR, rank INTEGER, step BIGINT, time TIMESTAMPTZ, detector VARCHAR, severity VARCHAR,
    state VARCHAR, value DOUBLE, baseline DOUBLE, threshold DOUBLE, message VARCHAR,
    episode VARCHAR, last_step BIGINT, updated_at TIMESTAMPTZ
);
-- The columns from workload on were added in schema version 3 (store.schema.migrate adds them to older files).
CREATE TABLE IF NOT EXISTS canary_results (
    time TIMESTAMPTZ, name VARCHAR, fault VARCHAR, passed BOOLEAN, expected_detector VARCHAR,
    fault_step BIGINT, fired_step BIGINT, latency_steps BIGINT, detail VARCHAR,
    workload VARCHAR, verdict VARCHAR, fired_detector VARCHAR, latency_s DOUBLE, exit_code INTEGER, duration_s DOUBLE
);
-- Added in schema version 4; rows come from optim_result events (store/_optim.py keeps the column order).
CREATE TABLE IF NOT EXISTS optim_results (
    time TIMESTAMPTZ, bench_id VARCHAR, run_id VARCHAR, optimizer VARCHAR, spec VARCHAR, kwargs JSON,
    workload VARCHAR, seed INTEGER, lr DOUBLE, steps BIGINT, initial_loss DOUBLE, final_loss DOUBLE,
    steps_to_half BIGINT, step_time_mean_s DOUBLE, step_time_p95_s DOUBLE, state_bytes BIGINT, peak_bytes BIGINT,
    unstable_run_id VARCHAR, unstable_lr_factor DOUBLE, stable BOOLEAN, unstable_reason VARCHAR
);
CREATE TABLE IF NOT EXISTS dead_letters (
    time TIMESTAMPTZ, subject VARCHAR, stream_seq BIGINT, reason VARCHAR, error VARCHAR, raw BLOB
);
CREATE TABLE IF NOT EXISTS data_loss (
    time TIMESTAMPTZ, stream VARCHAR, first_seq BIGINT, last_seq BIGINT, count BIGINT, reason VARCHAR
);
CREATE TABLE IF NOT EXISTS ingest_offsets (
    consumer VARCHAR PRIMARY KEY, stream VARCHAR, last_seq BIGINT, updated_at TIMESTAMPTZ
);

COMMENT ON TABLE schema_info IS 'Schema version of this file; trainvigil migrates older files when it opens them.';
COMMENT ON COLUMN schema_info.version IS 'schema version (trainvigil.daemon.store.SCHEMA_VERSION)';

COMMENT ON TABLE runs IS 'One row per training run seen, from every record of every rank.';
COMMENT ON COLUMN runs.run_id IS 'run id the agents were started with';
COMMENT ON COLUMN runs.first_seen IS 'time of the earliest record of the run (producer clock)';
COMMENT ON COLUMN runs.last_seen IS 'time of the latest record of the run (producer clock)';
COMMENT ON COLUMN runs.world_size IS 'processes in the run (ranks), the largest any rank reported';
COMMENT ON COLUMN runs.status IS 'running until a rank ends; then the status of the latest run_end: ok or error';
COMMENT ON COLUMN runs.ended_at IS 'time of the latest run_end; NULL while running';
COMMENT ON COLUMN runs.argv IS 'command line of the first run_start (JSON list of strings)';

COMMENT ON TABLE steps IS 'One row per (run_id, rank, step): the metrics logged at that step; NULL = not logged.';
COMMENT ON COLUMN steps.run_id IS 'run id';
COMMENT ON COLUMN steps.rank IS 'process rank in the run, from 0';
COMMENT ON COLUMN steps.step IS 'training step as logged';
COMMENT ON COLUMN steps.time IS 'when the step was logged (producer clock; the latest log() call of the step)';
COMMENT ON COLUMN steps.loss IS 'training loss, as logged';
COMMENT ON COLUMN steps.grad_norm IS 'gradient norm, as logged';
COMMENT ON COLUMN steps.lr IS 'learning rate';
COMMENT ON COLUMN steps.step_time IS 'duration of the step, seconds';
COMMENT ON COLUMN steps.samples IS 'samples, a count as logged';
COMMENT ON COLUMN steps.tokens IS 'tokens, a count as logged';
COMMENT ON COLUMN steps.reward IS 'reward (reinforcement learning), as logged';
COMMENT ON COLUMN steps.entropy IS 'policy entropy, as logged';
COMMENT ON COLUMN steps.kl IS 'KL divergence, as logged';
COMMENT ON COLUMN steps.extra IS 'custom metrics logged at the step: name -> value';

COMMENT ON TABLE events IS 'Run events: agent.event(kind, **fields), and each rank''s run_start and run_end.';
COMMENT ON COLUMN events.run_id IS 'run id';
COMMENT ON COLUMN events.rank IS 'process rank in the run, from 0';
COMMENT ON COLUMN events.time IS 'when the event happened (producer clock)';
COMMENT ON COLUMN events.kind IS 'event kind; run_start and run_end are written by the agent';
COMMENT ON COLUMN events.step IS 'training step the event belongs to, if any';
COMMENT ON COLUMN events.fields IS 'event fields (JSON); run_start: argv and config, run_end: status and dropped';

COMMENT ON TABLE heartbeats IS 'Agent liveness and health, one row per rank every few seconds.';
COMMENT ON COLUMN heartbeats.run_id IS 'run id';
COMMENT ON COLUMN heartbeats.rank IS 'process rank in the run, from 0';
COMMENT ON COLUMN heartbeats.host IS 'host name of the agent';
COMMENT ON COLUMN heartbeats.pid IS 'process id of the agent';
COMMENT ON COLUMN heartbeats.time IS 'when the heartbeat was sent (producer clock)';
COMMENT ON COLUMN heartbeats.last_step IS 'latest step the agent logged';
COMMENT ON COLUMN heartbeats.buffered IS 'steps and events the agent holds, not yet sent, a count';
COMMENT ON COLUMN heartbeats.spilled_bytes IS 'data spilled to the agent''s local disk and not yet sent, bytes';
COMMENT ON COLUMN heartbeats.connected IS 'whether the agent was connected to the broker';
COMMENT ON COLUMN heartbeats.dropped IS 'records the agent dropped since it started, by reason (JSON object of counts)';

COMMENT ON TABLE gil_samples IS 'GIL contention of one rank over one sampling period.';
COMMENT ON COLUMN gil_samples.run_id IS 'run id';
COMMENT ON COLUMN gil_samples.rank IS 'process rank in the run, from 0';
COMMENT ON COLUMN gil_samples.time IS 'when the sample was made (producer clock)';
COMMENT ON COLUMN gil_samples.period IS 'length of the sampling period, seconds';
COMMENT ON COLUMN gil_samples.samples IS 'probes taken in the period, a count';
COMMENT ON COLUMN gil_samples.wait_p50 IS 'median wait of a probe for the GIL, seconds';
COMMENT ON COLUMN gil_samples.wait_p90 IS '90th percentile wait for the GIL, seconds';
COMMENT ON COLUMN gil_samples.wait_p99 IS '99th percentile wait for the GIL, seconds';
COMMENT ON COLUMN gil_samples.wait_max IS 'longest wait for the GIL, seconds';
COMMENT ON COLUMN gil_samples.busy_share IS 'share of probes that found the GIL held, 0 to 1';
COMMENT ON COLUMN gil_samples.wait_share IS 'share of the period probes spent waiting, 0 to 1';
COMMENT ON COLUMN gil_samples.held IS 'estimated share of the period the GIL was held, 0 to 1';
COMMENT ON COLUMN gil_samples.switch_interval IS 'the interpreter''s switch interval (sys.getswitchinterval), seconds';
COMMENT ON COLUMN gil_samples.gil_enabled IS 'false on a free-threaded interpreter running without the GIL';
COMMENT ON COLUMN gil_samples.threads IS 'threads and their share of the held time (JSON list)';

COMMENT ON TABLE checkpoints IS 'Digests of checkpoints saved, loaded or compared for parity across ranks.';
COMMENT ON COLUMN checkpoints.run_id IS 'run id';
COMMENT ON COLUMN checkpoints.rank IS 'process rank in the run, from 0';
COMMENT ON COLUMN checkpoints.time IS 'when the digest was made (producer clock)';
COMMENT ON COLUMN checkpoints.step IS 'training step of the checkpoint, if known';
COMMENT ON COLUMN checkpoints.origin IS 'why it was digested: save, load or parity';
COMMENT ON COLUMN checkpoints.path IS 'checkpoint file, if any';
COMMENT ON COLUMN checkpoints.algo IS 'digest algorithm';
COMMENT ON COLUMN checkpoints.root IS 'digest over all tensors';
COMMENT ON COLUMN checkpoints.ok IS 'false when a load did not match the manifest';
COMMENT ON COLUMN checkpoints.tensors IS 'digest per tensor (JSON object: name -> digest)';

COMMENT ON TABLE anomalies IS 'Alerts: one row per episode (its latest state), or per alert without an episode.';
COMMENT ON COLUMN anomalies.run_id IS 'run id';
COMMENT ON COLUMN anomalies.rank IS 'process rank in the run, from 0';
COMMENT ON COLUMN anomalies.step IS 'step that opened the episode';
COMMENT ON COLUMN anomalies.time IS 'when the episode opened';
COMMENT ON COLUMN anomalies.detector IS 'detector that raised it';
COMMENT ON COLUMN anomalies.severity IS 'warn or page';
COMMENT ON COLUMN anomalies.state IS 'open, escalated or cleared';
COMMENT ON COLUMN anomalies.value IS 'observed value, in the unit of the metric the detector watches';
COMMENT ON COLUMN anomalies.baseline IS 'expected value, same unit as value';
COMMENT ON COLUMN anomalies.threshold IS 'limit that value crossed, same unit as value';
COMMENT ON COLUMN anomalies.message IS 'what happened and what to do next';
COMMENT ON COLUMN anomalies.episode IS 'id shared by every update of one incident; NULL for one-off alerts';
COMMENT ON COLUMN anomalies.last_step IS 'latest step flagged in the episode';
COMMENT ON COLUMN anomalies.updated_at IS 'when the episode last changed';

COMMENT ON TABLE canary_results IS 'Verdicts of fault-injection canary jobs, one row per canary run.';
COMMENT ON COLUMN canary_results.time IS 'when the verdict was made (daemon clock)';
COMMENT ON COLUMN canary_results.name IS 'the canary''s run id (canary-<id>): its rows in steps, events and anomalies';
COMMENT ON COLUMN canary_results.fault IS 'fault kind injected (VIGIL_FAULT), or none for a clean twin';
COMMENT ON COLUMN canary_results.passed IS 'verdict = pass';
COMMENT ON COLUMN canary_results.expected_detector IS 'detector that should catch the fault; empty for a clean twin';
COMMENT ON COLUMN canary_results.fault_step IS 'step the fault was injected at (its fault_injected event), else the step planned';
COMMENT ON COLUMN canary_results.fired_step IS 'step of the expected detector''s episode (else of another detector''s alert); NULL if none';
COMMENT ON COLUMN canary_results.latency_steps IS 'fired_step - fault_step, steps';
COMMENT ON COLUMN canary_results.detail IS 'why the verdict: what fired, what was late, the job''s last output line on an error';
COMMENT ON COLUMN canary_results.workload IS 'workload (trainvigil.canary) or [[canary.jobs]] name that ran';
COMMENT ON COLUMN canary_results.verdict IS 'pass, fail (missed, late or another detector paged; a clean twin alerted), error (crashed, timed out, fault never injected) or aborted (the daemon stopped)';
COMMENT ON COLUMN canary_results.fired_detector IS 'detector whose episode fired_step belongs to; empty if none';
COMMENT ON COLUMN canary_results.latency_s IS 'time from the injection to that episode, seconds';
COMMENT ON COLUMN canary_results.exit_code IS 'exit status of the job (negative: killed by that signal); NULL if it was still running';
COMMENT ON COLUMN canary_results.duration_s IS 'wall time of the job, seconds';

COMMENT ON TABLE optim_results IS 'vigil bench-optim: one row per (optimizer, workload, seed), from its optim_result event.';
COMMENT ON COLUMN optim_results.time IS 'when the result was published (producer clock)';
COMMENT ON COLUMN optim_results.bench_id IS 'the benchmark (one vigil bench-optim) that ran it: the run that published the event';
COMMENT ON COLUMN optim_results.run_id IS 'the measured run (optim-<optimizer>-<workload>-s<seed>): its rows in steps and anomalies';
COMMENT ON COLUMN optim_results.optimizer IS 'optimizer name as in the table (adamw, lion, adan, sophia, muon, or a class name)';
COMMENT ON COLUMN optim_results.spec IS 'module:Class that was built';
COMMENT ON COLUMN optim_results.kwargs IS 'keyword arguments it was given besides lr (JSON object)';
COMMENT ON COLUMN optim_results.workload IS 'supervised, rl or quadratic';
COMMENT ON COLUMN optim_results.seed IS 'seed: the same data order for every optimizer';
COMMENT ON COLUMN optim_results.lr IS 'peak learning rate of the shared warm-up/cosine schedule';
COMMENT ON COLUMN optim_results.steps IS 'optimizer steps run, a count';
COMMENT ON COLUMN optim_results.initial_loss IS 'loss of the first step (RL: 1 - success rate; quadratic: the objective)';
COMMENT ON COLUMN optim_results.final_loss IS 'mean loss over the last 5% of steps, the workload''s loss unit';
COMMENT ON COLUMN optim_results.steps_to_half IS 'first step whose loss is at most half the first step''s, steps; NULL if never';
COMMENT ON COLUMN optim_results.step_time_mean_s IS 'mean wall time of a training step (forward, backward, clip, step), seconds';
COMMENT ON COLUMN optim_results.step_time_p95_s IS '95th percentile of that step time, seconds';
COMMENT ON COLUMN optim_results.state_bytes IS 'optimizer state tensors after training, bytes';
COMMENT ON COLUMN optim_results.peak_bytes IS 'peak memory over the first 10 steps above the level at the run''s start, bytes: Python allocations of the whole process (tracemalloc); torch''s CPU tensors are not tracked (see state_bytes); NULL if not traced';
COMMENT ON COLUMN optim_results.unstable_run_id IS 'the same run at unstable_lr_factor x the LR, judged by the detectors';
COMMENT ON COLUMN optim_results.unstable_lr_factor IS 'LR multiplier of the stability run (10 by default)';
COMMENT ON COLUMN optim_results.stable IS 'no non_finite or loss_spike page on the stability run; NULL if not judged';
COMMENT ON COLUMN optim_results.unstable_reason IS 'the page that made it unstable (detector at step); empty when stable';

COMMENT ON TABLE dead_letters IS 'Messages that could not be read or stored, kept whole for inspection.';
COMMENT ON COLUMN dead_letters.time IS 'when the daemon refused the message';
COMMENT ON COLUMN dead_letters.subject IS 'NATS subject: vigil.v1.<run token>.<kind>';
COMMENT ON COLUMN dead_letters.stream_seq IS 'JetStream sequence of the message';
COMMENT ON COLUMN dead_letters.reason IS 'short machine-readable reason';
COMMENT ON COLUMN dead_letters.error IS 'the error, for a person';
COMMENT ON COLUMN dead_letters.raw IS 'message payload as received, bytes';

COMMENT ON TABLE data_loss IS 'Gaps in the stream: messages the broker no longer had when the daemon asked.';
COMMENT ON COLUMN data_loss.time IS 'when the daemon noticed the gap';
COMMENT ON COLUMN data_loss.stream IS 'JetStream stream name';
COMMENT ON COLUMN data_loss.first_seq IS 'first missing stream sequence';
COMMENT ON COLUMN data_loss.last_seq IS 'last missing stream sequence';
COMMENT ON COLUMN data_loss.count IS 'messages lost, a count';
COMMENT ON COLUMN data_loss.reason IS 'why they were lost';

COMMENT ON TABLE ingest_offsets IS 'Highest stream sequence committed per consumer: ingest resumes after it.';
COMMENT ON COLUMN ingest_offsets.consumer IS 'JetStream consumer name';
COMMENT ON COLUMN ingest_offsets.stream IS 'JetStream stream name';
COMMENT ON COLUMN ingest_offsets.last_seq IS 'highest stream sequence stored';
COMMENT ON COLUMN ingest_offsets.updated_at IS 'when it was last committed (daemon clock)';

CREATE OR REPLACE VIEW open_alerts AS
SELECT run_id, rank, detector, severity, state, step, last_step, value, baseline, threshold, message, episode,
       time, updated_at
FROM anomalies
WHERE state IS DISTINCT FROM 'cleared';
COMMENT ON VIEW open_alerts IS 'Alerts not cleared (open or escalated): rows of anomalies.';

-- Dead letters carry no run id that could be read, only their subject: they are matched to a run
-- by its subject token (schemas.subjects.run_token), a lossy mapping two run ids can share.
CREATE OR REPLACE VIEW run_summary AS
WITH tokens AS (
    SELECT run_id,
           coalesce(nullif(left(regexp_replace(run_id, '[^A-Za-z0-9_-]', '_', 'g'), 128), ''), '_') AS token
    FROM runs
)
SELECT r.run_id, r.status, r.world_size, r.first_seen, r.last_seen, r.ended_at,
       coalesce(s.steps, 0) AS steps,
       s.last_step,
       coalesce(a.open_alerts, 0) AS open_alerts,
       coalesce(d.dead_letters, 0) AS dead_letters
FROM runs r
JOIN tokens t USING (run_id)
LEFT JOIN (SELECT run_id, count(*) AS steps, max(step) AS last_step FROM steps GROUP BY run_id) s USING (run_id)
LEFT JOIN (SELECT run_id, count(*) AS open_alerts FROM open_alerts GROUP BY run_id) a USING (run_id)
LEFT JOIN (SELECT split_part(subject, '.', 3) AS token, count(*) AS dead_letters FROM dead_letters GROUP BY 1) d
    ON d.token = CASE
        WHEN t.token IN ('alerts', 'ctl', 'metrics', 'gil', 'ckpt', 'run', 'hb') THEN '_' || t.token
        ELSE t.token
    END;
COMMENT ON VIEW run_summary IS 'One row per run: status, times, steps stored, open alerts and dead letters.';
COMMENT ON COLUMN run_summary.steps IS 'rows in steps: one per rank and step';
COMMENT ON COLUMN run_summary.last_step IS 'highest step stored, any rank';
COMMENT ON COLUMN run_summary.open_alerts IS 'alerts not cleared (rows of open_alerts)';
COMMENT ON COLUMN run_summary.dead_letters IS 'dead letters whose subject carries the run''s subject token';
