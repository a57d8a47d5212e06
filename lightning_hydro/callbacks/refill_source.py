"""Where new trials for freed slots come from: an iterable of modules, or a factory, drawn resumably."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

import lightning as L

__all__ = ["NewTrial", "RefillSource", "RefillSpec"]

NewTrial = L.LightningModule | tuple[int, L.LightningModule]
"""A new trial: its module, or ``(trial_id, module)`` to give it that id in the group (e.g. a sweep's id)."""

RefillSpec = Iterable[NewTrial] | Callable[..., NewTrial | None]
"""New trials for freed slots: an iterable of modules or ``(trial_id, module)`` pairs (e.g. a list, or a
generator over the rest of a search space), or a factory called with the number of trials drawn so far (or with
no argument) that returns one, or None when there are no more."""


class RefillSource:
    """Draws new trial modules, one per freed slot, and remembers how many it drew (for resuming).

    Args:
        spec: An iterable of LightningModules, or a factory ``factory(index)`` (or ``factory()``) returning
            the next module or None when the search space is exhausted.
        owner: The callback's name, used in error messages.

    Raises:
        TypeError: If ``spec`` is neither iterable nor callable, or is itself a module.

    Example::

        >>> from lightning_hydro.demos import DigitsMLP
        >>> source = RefillSource([DigitsMLP(lr=0.1), DigitsMLP(lr=0.2)], owner="ASHA")
        >>> source.draw().hparams["lr"], source.draw().hparams["lr"], source.draw()
        (0.1, 0.2, None)
        >>> source.state_dict()
        {'drawn': 2, 'exhausted': True}
        >>> by_index = RefillSource(lambda i: DigitsMLP(lr=[0.1, 0.2, 0.3][i]) if i < 3 else None, owner="ASHA")
        >>> by_index.load_state_dict({"drawn": 2, "exhausted": False})   # resumed: two were drawn before
        >>> by_index.draw().hparams["lr"], by_index.draw()
        (0.3, None)
    """

    def __init__(self, spec: RefillSpec, *, owner: str) -> None:
        if isinstance(spec, L.LightningModule) or not (callable(spec) or isinstance(spec, Iterable)):
            raise TypeError(
                f"{owner}: refill must be an iterable of LightningModules (e.g. a list, or a generator over "
                f"the rest of the search space) or a factory returning one, got {type(spec).__name__}. "
                "Wrap a single module in a list: refill=[module]."
            )
        self.owner = owner
        self.drawn = 0
        self.exhausted = False
        self._factory: Callable[..., NewTrial | None] | None = None
        self._iterable: Iterable[NewTrial] | None = None
        self._iterator: Iterator[NewTrial] | None = None
        self._factory_takes_index = False
        if isinstance(spec, Iterable):
            self._iterable = spec
        else:
            self._factory = spec
            self._factory_takes_index = _accepts_one_argument(spec)

    def draw(self) -> NewTrial | None:
        """The next new trial (a module, or a ``(trial_id, module)`` pair), or None when the source is exhausted.

        Raises:
            TypeError: If the source produced something other than a LightningModule.
        """
        if self.exhausted:
            return None
        module = self._next()
        if module is None:
            self.exhausted = True
            return None
        candidate = (
            module[1] if isinstance(module, tuple) and len(module) == 2 and isinstance(module[0], int) else module
        )
        if not isinstance(candidate, L.LightningModule):
            raise TypeError(
                f"{self.owner}: refill produced a {type(module).__name__} for new trial {self.drawn}, expected a "
                "LightningModule of the group's architecture (build the module from the configuration first)."
            )
        self.drawn += 1
        return module

    def state_dict(self) -> dict[str, Any]:
        """How many trials were drawn, and whether the source ran out."""
        return {"drawn": self.drawn, "exhausted": self.exhausted}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Skip the trials a previous run already drew, so that the next draw is the one it would have made.

        An iterable is restarted and advanced past them (a one-shot generator passed again at resume is
        advanced the same way); a factory is next called with the index that follows them.
        """
        self.drawn = int(state["drawn"])
        self.exhausted = bool(state["exhausted"])
        self._iterator = None
        if self._iterable is not None and not self.exhausted:
            self._iterator = iter(self._iterable)
            for _ in range(self.drawn):
                if next(self._iterator, None) is None:
                    self.exhausted = True
                    break

    def _next(self) -> NewTrial | None:
        if self._factory is not None:
            return self._factory(self.drawn) if self._factory_takes_index else self._factory()
        if self._iterator is None:
            assert self._iterable is not None
            self._iterator = iter(self._iterable)
        return next(self._iterator, None)


def _accepts_one_argument(factory: Callable[..., Any]) -> bool:
    try:
        inspect.signature(factory).bind(0)
    except TypeError:
        return False
    except ValueError:  # no signature (some builtins): call it without arguments
        return False
    return True
