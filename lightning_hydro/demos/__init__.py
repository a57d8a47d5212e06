"""Small, self-contained tasks that ship with the package (no downloads): used by examples, tests, benchmarks."""

from lightning_hydro.demos.char_lm import CharDataModule, CharTransformer
from lightning_hydro.demos.digits import DigitsDataModule, DigitsMLP, EpochShuffleSampler, load_digits_tensors

__all__ = [
    "CharDataModule",
    "CharTransformer",
    "DigitsDataModule",
    "DigitsMLP",
    "EpochShuffleSampler",
    "load_digits_tensors",
]
