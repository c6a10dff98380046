"""A framework's own checkpoints, the script's output: a Hugging Face Trainer's `save_strategy`
saves (with `load_best_model_at_end`), a Lightning `ModelCheckpoint`.

They are written where the script asks (`output_dir`, `dirpath`) and are never resumed from:
mpjob's checkpoints (spec.checkpoint) are the attempt's only resume point, and the adapters
name them to the framework themselves. The one rule here: the script's folder must not be mpjob's
checkpoint folder or lie below it, where the framework's files (its `checkpoint-N` folders, its
`.ckpt` files, its rotation deleting them) would mix with the store's checkpoints and staging.
"""

from __future__ import annotations

import os

from mpjob_contract.launch import inside_checkpoint_dir
from mpjob_contract.storage import is_bucket_url
from mpjob_trainer.errors import ConfigError
from mpjob_trainer.session import Session


def outside_store(run: Session, folder: str, field: str) -> None:
    """A ConfigError naming `field` when `folder` (the framework's own checkpoints) is mpjob's
    checkpoint folder or lies below it; both compared with links resolved. A bucket store keeps
    no local folder the framework could write into."""
    store = run.launch.checkpoint_dir
    if is_bucket_url(store):
        return
    mine, its = os.path.realpath(folder), os.path.realpath(store)
    if mine == its or inside_checkpoint_dir(mine, its):
        raise ConfigError(
            f"{field}={folder!r} is inside mpjob's checkpoint folder {store} (spec.checkpoint): the framework's own "
            "checkpoints are your output and must not mix with mpjob's; write them to another folder"
        )
