import lightning as L
import pytest

from lightning_hydro.backends.trial_logging import capture_logs


def test_positional_options_are_named():
    module = L.LightningModule()
    with capture_logs(module) as calls:
        module.log("loss", 1.0, True, False)
    assert calls[0].options == {"prog_bar": True, "logger": False}


def _log_then_fail(module: L.LightningModule, inner: list) -> None:
    with capture_logs(module) as calls:
        inner.extend([calls])
        module.log("a", 1)
        raise RuntimeError("boom")


def test_nested_captures_and_restore_on_error():
    module = L.LightningModule()
    holder: list = []
    with capture_logs(module) as outer:
        with pytest.raises(RuntimeError, match="boom"):
            _log_then_fail(module, holder)
        module.log("b", 2)
    inner = holder[0]
    assert [c.name for c in inner] == ["a"]
    assert [c.name for c in outer] == ["b"]
    assert "log" not in vars(module)
