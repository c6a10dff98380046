"""mpjob_trainer: the PyTorch AMP trainer that mpjob attempts run.

Reads an AttemptLaunch (mpjob_contract.launch), trains in the attempt's precision with fp32
master weights, guards against numeric trouble, checkpoints for exact resume, serves
Prometheus metrics, and ends with an exit code and termination report per
mpjob_contract.codes / mpjob_contract.report.
"""
