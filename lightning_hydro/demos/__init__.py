"""Small, self-contained tasks that ship with the package (no downloads): used by examples, tests, benchmarks."""

from lightning_hydro.demos.digits import DigitsDataModule, DigitsMLP, load_digits_tensors

__all__ = ["DigitsDataModule", "DigitsMLP", "load_digits_tensors"]
