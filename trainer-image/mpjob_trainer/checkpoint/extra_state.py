"""A run's own modules that keep an extra state, checked before any checkpoint loads into them
(both formats: the single file's restore, DCP's `shards`): code that cannot take back its own
extra state is the script's fault whatever the checkpoint, not the checkpoint's."""

from __future__ import annotations

from torch import nn

from mpjob_trainer.errors import ConfigError


def check_extra_states(module: nn.Module, name: str) -> None:
    """A ConfigError when a submodule of this run's `module` (registered as `name`) cannot take back
    its own extra state (its set_extra_state raises on what its get_extra_state gives): the
    script's fault whatever the checkpoint, told before anything loads; before, set_state_dict's
    failure passed every checkpoint over. One that takes its own and refuses the checkpoint's (a
    format version it does not know) tells the checkpoint's value apart: the checkpoint's fault."""
    own = (pair for pair in module.named_modules() if _keeps_extra_state(type(pair[1])))
    for path, sub in own:
        try:
            sub.set_extra_state(sub.get_extra_state())
        except Exception as exc:
            raise ConfigError(
                f"this run's {'.'.join(filter(None, (name, path)))} ({type(sub).__name__}) cannot take back its own "
                f"extra state: its set_extra_state raised {type(exc).__name__}: {str(exc)[:200]}; fix the script, "
                "whatever the checkpoint it loads"
            ) from exc


def _keeps_extra_state(kind: type[nn.Module]) -> bool:
    """Does a module of `kind` write and read an extra state (torch's test: both overridden)?"""
    return (
        kind.get_extra_state is not nn.Module.get_extra_state and kind.set_extra_state is not nn.Module.set_extra_state
    )
