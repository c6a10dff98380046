"""Framework adapters: the mpjob SDK under code written for a training framework.

`hf` (extra `mpjob-trainer[hf]`) for `transformers.Trainer`, `lightning` (extra
`mpjob-trainer[lightning]`) for `lightning.Trainer`. Each is a callback plus a helper that
turns the attempt into the framework's settings; everything mpjob promises (precision,
guard, checkpoints, resume, progress, preemption, the ending) stays the SDK's one
implementation (mpjob_trainer.session, reached through session.framework.FrameworkRun).
docs/frameworks.md tells the story. Import the submodule you need: each imports its
framework, which this package does not.
"""
