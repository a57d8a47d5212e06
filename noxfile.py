"""Developer sessions. They run in the current environment (install with `pip install -e ".[dev]"` first):
torch alone is several GB, so a fresh virtualenv per session would cost minutes for nothing.

    nox -s lint typecheck tests      # what CI runs
    nox -s slow                      # long tests: whole models, real multi-process sweeps, submitit's local mode
    nox -s gpu                       # tests that need a CUDA device (pytest -m gpu)
    nox -s compat                    # the default suite under the GPU machines' torch (2.11), own venv
    nox -s examples                  # every example, end to end
    nox -s bench                     # every benchmark (long); `nox -s bench -- fusion` runs the matching ones
"""

import nox

nox.options.default_venv_backend = "none"
nox.options.sessions = ["lint", "typecheck", "tests"]

BENCHMARKS = {
    "fusion": [
        ["python", "benchmarks/fusion_throughput.py"],
        ["python", "benchmarks/fusion_throughput.py", "--model", "resnet18", "--trials", "1", "4", "16"],
        ["python", "benchmarks/fusion_throughput.py", "--model", "transformer"],
        ["python", "benchmarks/fusion_throughput.py", "--model", "compile", "--steps", "40"],
        ["python", "benchmarks/fusion_throughput.py", "--model", "template_mnist"],
    ],
    "hfta_ops": [["python", "benchmarks/hfta_ops.py"]],
    "early_stopping": [["python", "benchmarks/early_stopping.py"]],
    "sweep": [["python", "benchmarks/sweep_vs_basic.py"]],
    "sweep_vs_peers": [
        ["python", "benchmarks/sweep_vs_peers.py"],
        [
            "python",
            "benchmarks/sweep_vs_peers.py",
            "--n-trials",
            "128",
            "--output",
            "benchmarks/results/sweep_vs_peers_128.md",
        ],
        ["python", "benchmarks/sweep_profile.py"],
    ],
    "fidelity": [["python", "benchmarks/fidelity.py"]],
    "width_padding": [
        ["python", "benchmarks/width_padding.py", "--repeats", "2"],
        ["python", "benchmarks/width_padding.py", "--repeats", "2", "--model", "tensors"],
    ],
    "first_batch_check": [["python", "benchmarks/first_batch_check.py"]],
    "batch_hooks": [["python", "benchmarks/batch_hooks_overhead.py", "--repeats", "3"]],
    "trial_rules": [
        ["python", "benchmarks/trial_rules.py"],
        ["python", "benchmarks/trial_rules.py", "--precision", "bf16-mixed"],
    ],
    "compile_checks": [
        ["python", "benchmarks/whole_step_check.py"],
        ["python", "benchmarks/whole_step_check.py", "--models", "cnn-adam", "densenet-adam", "--no-left-out"],
        ["python", "benchmarks/compiled_update_check.py", "--small"],
    ],
}


@nox.session
def lint(session: nox.Session) -> None:
    session.run("ruff", "check", ".")
    session.run("ruff", "format", "--check", ".")


@nox.session
def typecheck(session: nox.Session) -> None:
    session.run("mypy")


@nox.session
def tests(session: nox.Session) -> None:
    """The default suite (no `slow` tests, doctests included): what CI runs."""
    session.run("pytest", *session.posargs)


@nox.session
def slow(session: nox.Session) -> None:
    """Long-running tests: whole-model exactness, ResNet-18 fused, DDP ranks, submitit's local launcher."""
    session.run("pytest", "-m", "slow", *session.posargs)


@nox.session
def gpu(session: nox.Session) -> None:
    """Tests that need a CUDA device (skipped without one): attention kernels, precisions, exactness, compile,
    checkpoints across devices, host syncs. Not part of CI, which has no GPU."""
    session.run("pytest", "-m", "gpu", "-p", "no:cacheprovider", *session.posargs)


#: the oldest torch and Lightning pyproject.toml allows; the torch is the GPU machines' (their image holds torch 2.11
#: and Lightning 2.6.6), with its torchvision
COMPAT = ("torch==2.11.0", "torchvision==0.26.0", "lightning==2.6.0")


@nox.session(venv_backend="venv")
def compat(session: nox.Session) -> None:
    """The default suite and the step's slow tests under the oldest torch and Lightning this project supports.

    The torch is the GPU machines', whose inductor compiled three of the step's patterns otherwise than eager
    torch (issue 22; each test named in docs/fused.md): the current torch passes them either way. A virtualenv of
    its own (minutes: torch is several GB), the project's other packages as ``.[dev]`` resolves them.
    """
    session.install(*COMPAT)
    session.install("-e", ".[dev]")
    session.run("python", "-c", "import torch; assert torch.__version__.startswith('2.11.'), torch.__version__")
    session.run("python", "-c", "import lightning as L; assert L.__version__ == '2.6.0', L.__version__")
    if session.posargs:
        session.run("pytest", "-p", "no:cacheprovider", *session.posargs)
        return
    session.run("pytest", "-p", "no:cacheprovider")  # the default suite, as the tests session runs it
    session.run("pytest", "-m", "slow", "-p", "no:cacheprovider", "tests/fused/step")  # and the step's slow ones


@nox.session
def examples(session: nox.Session) -> None:
    """Run every example end to end (the default tests run reduced versions of them)."""
    sweep_dir = session.create_tmp()
    session.run("python", "examples/fused_digits.py", "--epochs", "5")
    session.run("python", "examples/train.py", "trainer.max_epochs=2", f"hydra.run.dir={sweep_dir}/run")
    session.run("python", "examples/train.py", "-m", f"hydra.sweep.dir={sweep_dir}/sweep")


@nox.session
def bench(session: nox.Session) -> None:
    """Measured comparisons; each prints a markdown table and writes it under benchmarks/results/."""
    selected = [name for name in BENCHMARKS if not session.posargs or any(arg in name for arg in session.posargs)]
    for name in selected:
        for command in BENCHMARKS[name]:
            session.run(*command)
