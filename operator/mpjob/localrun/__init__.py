"""`mpjob run`: a MixedPrecisionJob on this machine, no cluster, same planner as the operator."""
