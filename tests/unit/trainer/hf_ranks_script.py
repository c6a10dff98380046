"""A Hugging Face Trainer job on every process of its attempt (`python hf_ranks_script.py`): each
rank saves its own RNG state beside rank 0's weights at every checkpoint, as the Trainer does
under DDP. The data and model are hf_items_script.py's (this folder is the script's sys.path[0])."""

from __future__ import annotations

from hf_items_script import Data, Net
from transformers import Trainer

from mpjob_trainer import session as mpjob
from mpjob_trainer.adapters import hf as mpjob_hf


def main() -> None:
    with mpjob.start() as run:
        args = mpjob_hf.training_arguments(run, remove_unused_columns=False, dataloader_num_workers=0)
        mpjob_hf.train(run, Trainer(model=Net(), args=args, train_dataset=Data()))


if __name__ == "__main__":
    main()
