import logging
from collections.abc import Mapping
from typing import Any

from lightning.pytorch.utilities import rank_zero_only


class RankedLogger(logging.LoggerAdapter):
    """A logger that prefixes each record with the process's rank, and may log on rank zero only."""

    def __init__(self, name: str = __name__, rank_zero_only: bool = False, extra: Mapping[str, Any] | None = None):
        super().__init__(logger=logging.getLogger(name), extra=extra)
        self.rank_zero_only = rank_zero_only

    def log(self, level: int, msg: object, *args: Any, rank: int | None = None, **kwargs: Any) -> None:
        if not self.isEnabledFor(level):
            return
        msg, kwargs = self.process(msg, kwargs)
        current = getattr(rank_zero_only, "rank", None)
        if current is None:
            raise RuntimeError("rank_zero_only.rank must be set before the first log call")
        msg = f"[rank: {current}] {msg}"
        if self.rank_zero_only:
            if current == 0:
                self.logger.log(level, msg, *args, **kwargs)
        elif rank is None or current == rank:
            self.logger.log(level, msg, *args, **kwargs)
