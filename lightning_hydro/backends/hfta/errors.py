"""The two ways hfta fusion can fail: a model it cannot convert, and a fused operator called wrongly."""


class ConversionError(ValueError):
    """Trial modules cannot be converted to hfta fused operators.

    The message names each offending module (path and type), what differs or is unsupported, and the
    backend to use instead.

    Example::

        >>> error = ConversionError("module 'fc' (Linear): trials differ in in_features; use backend='loop'")
        >>> isinstance(error, ValueError)
        True
    """


class FusedCallError(RuntimeError):
    """A fused operator was called in a way it cannot honour.

    For example outside ``torch.func.vmap``, over a different number of trials than it was converted
    for, or with a vmap randomness mode it cannot reproduce.

    Example::

        >>> error = FusedCallError("FusedLinear at 'fc' was converted for 4 trials but vmap runs over 3")
        >>> isinstance(error, RuntimeError)
        True
    """
