"""The kopf operator, by role: `handlers` (kopf wiring), `reconciler` (one job: observe, decide
with mpjob.planning, act), `actions` (its acts: an attempt's children made and deleted),
`cluster` (API calls), `cache` (attempt Jobs and pods), `workqueue`, `ticker`, `progress` (the
trainer's metrics), `peering`, `config`, `metrics`; `main` is `mpjob operator`."""
