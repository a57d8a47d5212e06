"""Developer sessions. They run in the current environment (install with `pip install -e ".[dev]"` first):
torch alone is several GB, so a fresh virtualenv per session would cost minutes for nothing.
"""

import nox

nox.options.default_venv_backend = "none"
nox.options.sessions = ["lint", "typecheck", "tests"]


@nox.session
def lint(session: nox.Session) -> None:
    session.run("ruff", "check", ".")
    session.run("ruff", "format", "--check", ".")


@nox.session
def typecheck(session: nox.Session) -> None:
    session.run("mypy")


@nox.session
def tests(session: nox.Session) -> None:
    """The default suite (no `slow` tests): what CI runs."""
    session.run("pytest", *session.posargs)


@nox.session
def slow(session: nox.Session) -> None:
    """Long-running tests: whole-model exactness, real multi-group sweeps, submitit's local launcher."""
    session.run("pytest", "-m", "slow", *session.posargs)


@nox.session
def examples(session: nox.Session) -> None:
    """Run every example end to end (the tests also run them, in reduced form)."""
    session.run("python", "examples/fused_digits.py")


@nox.session
def bench(session: nox.Session) -> None:
    """Measured comparisons; each writes a markdown table under benchmarks/results/."""
    session.run("python", "benchmarks/fusion_throughput.py", *session.posargs)
