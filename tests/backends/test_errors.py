from lightning_hydro.backends.errors import explain_vmap_error


def test_other_errors_are_left_alone():
    assert explain_vmap_error(ValueError("shapes do not match"), method="training_step", module_name="M") is None


def test_vmap_errors_get_advice():
    err = RuntimeError("vmap: It looks like you're calling .item() on a Tensor. We don't support vmap over ...")
    explained = explain_vmap_error(err, method="training_step", module_name="Net")
    assert explained is not None
    assert str(explained).startswith("backend='vmap' cannot fuse Net.training_step: it calls .item()")
    assert "Use backend='loop'" in str(explained)
