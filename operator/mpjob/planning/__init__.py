"""Pure decisions shared by the operator and `mpjob run`: how an attempt ended
(classify), what to do next (planner) and the status that follows (status). No I/O."""
