"""Hydra plugin of lightning_hydro: ``hydra/sweeper=lightning_hydro`` (see ``docs/sweeper.md``)."""
