"""The contract between the mpjob operator and the mpjob trainer.

Small and free of heavy imports (pydantic only) so that both the operator image (no torch)
and the trainer image (no kopf/kubernetes) install it. One source of truth for:
the MixedPrecisionJob API models (`api`), trainer exit codes (`codes`), the termination
report (`report`), the attempt launch description (`launch`) and metric names (`metrics`).
"""
