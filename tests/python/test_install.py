"""How the core installs: without TensorFlow, and per platform."""

import json
import os
import pathlib
import subprocess
import sys

import pytest
import tomllib
from packaging.requirements import Requirement

ROOT = pathlib.Path(__file__).resolve().parents[2]


def _import_without_tensorflow():
    # `None` in sys.modules makes `import tensorflow` fail as if it were not
    # installed (ModuleNotFoundError, name "tensorflow").
    code = (
        "import sys\n"
        "sys.modules['tensorflow'] = None\n"
        "try:\n"
        "    import multigpu\n"
        "except ModuleNotFoundError as error:\n"
        "    print(type(error).__name__, error.name, str(error), sep='|')\n"
    )
    env = dict(os.environ, PYTHONPATH=str(ROOT / "python"))
    return subprocess.run([sys.executable, "-c", code], env=env,
                          capture_output=True, text=True, check=True,
                          timeout=600).stdout.strip()


def test_import_without_tensorflow_names_the_extras():
    kind, name, message = _import_without_tensorflow().split("|")
    assert (kind, name) == ("ModuleNotFoundError", "tensorflow")
    assert "multigpu needs TensorFlow 2.21, which is not installed" in message
    assert 'pip install "multigpu[cpu]"' in message
    assert 'pip install "multigpu[gpu]"' in message


def test_the_jax_extra_and_the_core_install_no_tensorflow():
    # On JAX multigpu runs without TensorFlow
    # (engines/jax/test_jax_without_tensorflow.py): `pip install
    # "multigpu[jax]"` must not bring it, directly or through the core.
    with open(ROOT / "pyproject.toml", "rb") as f:
        project = tomllib.load(f)["project"]
    required = project["dependencies"] + project["optional-dependencies"]["jax"]
    names = [Requirement(line).name for line in required]
    assert "jax" in names
    assert not [n for n in names if n.startswith("tensorflow")], names


def _tensorflow_requirement(extra, environment):
    """The TensorFlow requirement `extra` selects on a platform."""
    with open(ROOT / "pyproject.toml", "rb") as f:
        extras = tomllib.load(f)["project"]["optional-dependencies"]
    chosen = []
    for line in extras[extra]:
        requirement = Requirement(line)
        if requirement.marker is None or requirement.marker.evaluate(
                dict(environment, extra="")):
            chosen.append(requirement)
    tensorflow = [r for r in chosen if r.name.startswith("tensorflow")]
    assert len(tensorflow) == 1, (environment, [str(r) for r in chosen])
    return tensorflow[0]


def _wheel_on_index(requirement, platform_tag, tmp_path):
    """The wheel the package index has for `requirement` on a platform, or
    None. Asks pip to resolve it as `pip download --platform ...
    --only-binary=:all: --no-deps` would, without downloading the wheel."""
    report = tmp_path / f"{platform_tag}.json"
    python_version = f"{sys.version_info.major}.{sys.version_info.minor}"
    result = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--dry-run", "--quiet",
         "--ignore-installed", "--target", str(tmp_path / "target"),
         "--platform", platform_tag, "--python-version", python_version,
         "--only-binary=:all:", "--no-deps", "--report", str(report),
         f"{requirement.name}{requirement.specifier}"],
        capture_output=True, text=True, timeout=300)
    if result.returncode != 0:
        assert "No matching distribution found" in result.stderr, result.stderr
        return None
    installs = json.loads(report.read_text())["install"]
    return installs[0]["download_info"]["url"].rsplit("/", 1)[-1]


# (pip platform tag, the PEP 508 environment there, the distribution the
# `cpu` extra must choose). TensorFlow 2.21 needs macOS 12 or later.
PLATFORMS = [
    ("manylinux_2_27_x86_64", {"sys_platform": "linux", "platform_machine": "x86_64"}, "tensorflow-cpu"),
    ("manylinux_2_27_aarch64", {"sys_platform": "linux", "platform_machine": "aarch64"}, "tensorflow"),
    ("win_amd64", {"sys_platform": "win32", "platform_machine": "AMD64"}, "tensorflow-cpu"),
    ("macosx_12_0_arm64", {"sys_platform": "darwin", "platform_machine": "arm64"}, "tensorflow"),
]


# The gate resolves one platform of each distribution (tensorflow-cpu on
# Linux x86_64, tensorflow on macOS); the full tier every platform.
GATE_PLATFORMS = ("manylinux_2_27_x86_64", "macosx_12_0_arm64")


@pytest.mark.parametrize("platform_tag,environment,distribution", [
    pytest.param(*p, id=p[0], marks=() if p[0] in GATE_PLATFORMS else pytest.mark.full)
    for p in PLATFORMS])
def test_cpu_extra_resolves_to_a_wheel_on_each_platform(
        platform_tag, environment, distribution, tmp_path):
    requirement = _tensorflow_requirement("cpu", environment)
    assert requirement.name == distribution
    wheel = _wheel_on_index(requirement, platform_tag, tmp_path)
    assert wheel is not None, f"no {requirement} wheel for {platform_tag}"
    assert wheel.startswith(distribution.replace("-", "_") + "-2.21.")


def test_macos_x86_64_has_no_tensorflow_2_21_as_the_readme_says(tmp_path):
    """docs/install.md and install_multigpu() say Intel Macs cannot have TensorFlow
    2.21; this fails when a wheel appears, so that both can be updated."""
    environment = {"sys_platform": "darwin", "platform_machine": "x86_64"}
    requirement = _tensorflow_requirement("cpu", environment)
    assert requirement.name == "tensorflow"
    assert _wheel_on_index(requirement, "macosx_12_0_x86_64", tmp_path) is None


def _pyproject():
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def test_r_package_python_range_is_pyprojects():
    # R/python.R writes the supported Pythons once, for py_require().
    r_source = (ROOT / "R" / "python.R").read_text()
    declared = r_source.split('supported_python <- "', 1)[1].split('"', 1)[0]
    assert declared == _pyproject()["project"]["requires-python"]


def test_r_package_constraints_pin_what_pyproject_requires():
    # inst/python/constraints.txt pins, for uv and pip, the releases that
    # pyproject.toml's dependencies and TensorFlow extras require.
    lines = (ROOT / "inst" / "python" / "constraints.txt").read_text().splitlines()
    constraints = {Requirement(line).name: Requirement(line).specifier
                   for line in lines if line.strip() and not line.startswith("#")}
    project = _pyproject()["project"]
    required = [Requirement(r) for r in project["dependencies"]]
    extras = project["optional-dependencies"]
    required += [Requirement(r) for r in extras["cpu"] + extras["gpu"]]
    for requirement in required:
        assert requirement.name in constraints, requirement.name
        assert constraints[requirement.name] == requirement.specifier, requirement.name
    assert set(constraints) == {r.name for r in required}


def test_the_jax_range_is_the_jax_versions_the_suite_runs_on():
    # The `jax` extra's range is the tested one: the Makefile's JAX_VERSIONS
    # (a JAX suite environment each, every one in make test-full), no more.
    with open(ROOT / "pyproject.toml", "rb") as f:
        extra = tomllib.load(f)["project"]["optional-dependencies"]["jax"]
    (specifier,) = [Requirement(line).specifier for line in extra
                    if Requirement(line).name == "jax"]
    makefile = (ROOT / "Makefile").read_text()
    (line,) = [line for line in makefile.splitlines()
               if line.startswith("JAX_VERSIONS :=")]
    tested = line.split(":=")[1].split()
    minors = sorted(int(version.split(".")[1]) for version in tested)
    assert minors == list(range(minors[0], minors[-1] + 1)), tested
    for minor in minors:
        assert specifier.contains(f"0.{minor}.0"), (specifier, minor)
    assert not specifier.contains(f"0.{minors[0] - 1}.9"), specifier
    assert not specifier.contains(f"0.{minors[-1] + 1}.0"), specifier
