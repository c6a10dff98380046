"""Warm starts of the trainer processes the tests run: see client.py and server.py."""

from tests.warm.client import DEVNULL, PIPE, STDOUT, Popen, for_ranks, run

__all__ = ["DEVNULL", "PIPE", "STDOUT", "Popen", "for_ranks", "run"]
