"""An offline wheel bundle for a GPU cluster node that has JAX but no internet.

    python .ci/gpu-bundle.py --python-version 3.12 --out out/gpu-bundle [--with-jax]

Puts into one folder, for the CPython minor version `--python-version`
names on manylinux x86_64, the wheels that `pip install multigpu` needs
beyond what a GPU image with JAX already holds (IMAGE: jax, jaxlib,
numpy, ml_dtypes, opt_einsum, scipy; the CUDA plugins): multigpu itself,
built from this checkout, then Keras and its dependencies. It writes
`requirements.txt` beside them, the pins the bundle was resolved to, so
that on the node

    pip install --no-index --find-links DIR multigpu

resolves from the folder and the image alone (`-r DIR/requirements.txt` or
`-c DIR/requirements.txt` holds it to those pins). No version is written
here: the wheel built from the checkout carries pyproject.toml's ranges and
pip resolves them, as it will on the node. `--with-jax` adds the image's
packages too (CPU JAX, from the `jax` extra's range), for a node without
them; the CUDA plugins and NVIDIA's libraries (GiBs) it does not add.

Prints every file with its size and the total; exits 1 when the bundle
(without the `--with-jax` wheels) is over `--max-mib` (32 MiB), or when
pip fails (it needs the package index). Runs on any Python with pip, for
any target version: pip downloads with `--python-version` and
`--platform`. Only the standard library and pip.
"""

import argparse
import email.parser
import pathlib
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile

ROOT = pathlib.Path(__file__).resolve().parents[1]
# What the GPU image with JAX already holds (normalized names): jax and
# what jax and jaxlib require. The bundle leaves them out.
IMAGE = ("jax", "jaxlib", "numpy", "ml-dtypes", "opt-einsum", "scipy")
MAX_MIB = 32
# jaxlib's wheels (0.10 on) are manylinux_2_27: a node that runs the
# image's jaxlib has glibc 2.27 or newer, so wheels up to that tag run
# there (optree's newest, for one, has no manylinux2014 wheel).
GLIBC = "2.27"


def normalized(name):
    """A distribution's name as PEP 503 compares names."""
    return re.sub(r"[-_.]+", "-", name).lower()


def platforms(glibc):
    """pip's `--platform` tags for manylinux x86_64 up to glibc `glibc`.

    pip does not widen a `manylinux_2_X` tag to the older ones a wheel may
    carry, so each is named, down to manylinux2014 (glibc 2.17).
    """
    major, minor = (int(part) for part in glibc.split("."))
    tags = [f"manylinux_{major}_{m}_x86_64" for m in range(minor, 16, -1)]
    return tags + ["manylinux2014_x86_64"]


def target_options(python_version, glibc):
    """pip options that choose wheels for the node, not for this machine."""
    options = ["--python-version", python_version, "--only-binary=:all:"]
    for tag in platforms(glibc):
        options += ["--platform", tag]
    return options


def pip(*arguments):
    """Runs pip of this Python; on failure exits 1 with pip's message.

    pip's output is kept back unless it fails: the bundle's listing is the
    script's output.
    """
    command = [sys.executable, "-m", "pip", "--disable-pip-version-check", *arguments]
    result = subprocess.run(command, capture_output=True, text=True)
    if result.returncode != 0:
        sys.exit(f"gpu-bundle: `pip {' '.join(arguments[:1])}` failed (exit "
                 f"{result.returncode}); it needs the package index (PyPI or "
                 f"pip's configured index):\n{result.stderr[-4000:]}")
    return result.stdout


def build_package(out):
    """Builds multigpu's wheel from the checkout into `out`; returns its path.

    From a copy of the sources, so that the build's `build/` and
    `*.egg-info` folders land in a temporary folder, not in the checkout
    that others are using.
    """
    with tempfile.TemporaryDirectory(prefix="gpu-bundle-src-") as source:
        source = pathlib.Path(source)
        for name in ("pyproject.toml", "README.md"):
            shutil.copy2(ROOT / name, source / name)
        for license_file in ROOT.glob("LICENSE*"):
            shutil.copy2(license_file, source / license_file.name)
        shutil.copytree(ROOT / "python", source / "python", ignore=shutil.ignore_patterns(
            "__pycache__", "*.egg-info", "*.pyc"))
        pip("wheel", "--quiet", "--no-deps", "--wheel-dir", str(out), str(source))
    (wheel,) = out.glob("multigpu-*.whl")
    return wheel


def fetch(wheel, extras, options, out):
    """Downloads into `out` the wheels `pip install WHEEL[extras]` installs
    on the node.

    `pip download`, not `pip install --dry-run --target`: the latter checks
    `Requires-Python` against the Python it runs on, so from a 3.11 host it
    would fall back to an older JAX than a 3.12 node can take.

    Returns:
        {normalized name: version} of the downloaded wheels, multigpu left out.
    """
    target = f"{wheel}[{','.join(extras)}]" if extras else str(wheel)
    pip("download", "--quiet", "--dest", str(out), *options, target)
    pins = {}
    for path in out.glob("*.whl"):
        name, version = path.name.split("-")[:2]
        pins[normalized(name)] = version
    pins.pop("multigpu")
    return pins


def target_environment(python_version):
    """PEP 508 marker values of CPython `python_version` on Linux x86_64."""
    # pip's own copy of `packaging` (the script uses only the standard
    # library and pip, which it needs anyway).
    from pip._vendor.packaging.markers import default_environment

    environment = default_environment()
    environment.update(
        python_version=python_version, python_full_version=f"{python_version}.0",
        implementation_name="cpython", implementation_version=f"{python_version}.0",
        platform_python_implementation="CPython", sys_platform="linux",
        platform_system="Linux", platform_machine="x86_64", os_name="posix")
    return environment


def wheel_metadata(wheel):
    """A wheel's name, version and `Requires-Dist` lines, from its METADATA."""
    with zipfile.ZipFile(wheel) as archive:
        (path,) = [name for name in archive.namelist()
                   if name.endswith(".dist-info/METADATA") and name.count("/") == 1]
        metadata = email.parser.BytesParser().parsebytes(archive.read(path))
    return (normalized(metadata["Name"]), metadata["Version"],
            metadata.get_all("Requires-Dist") or [])


def unmet_requirements(wheels, extras, python_version, provided):
    """What the wheels require on the node that neither they nor the image hold.

    pip evaluates dependencies' markers for the Python it runs on, not for
    `--python-version` (pypa/pip#11010), so the resolution is checked here
    against the target's markers.

    Returns:
        One line per unmet requirement (empty when the bundle is closed).
    """
    from pip._vendor.packaging.requirements import Requirement

    environment = target_environment(python_version)
    versions, requirements = {}, []
    for wheel in wheels:
        name, version, lines = wheel_metadata(wheel)
        versions[name] = version
        chosen = extras if name == "multigpu" else ()
        for line in lines:
            requirement = Requirement(line)
            if requirement.marker is None or any(
                    requirement.marker.evaluate(dict(environment, extra=extra))
                    for extra in ("", *chosen)):
                requirements.append((name, requirement))
    unmet = []
    for owner, requirement in requirements:
        name = normalized(requirement.name)
        if name in provided:
            continue
        if name not in versions:
            unmet.append(f"{owner} requires {requirement}: not in the bundle")
        elif not requirement.specifier.contains(versions[name], prereleases=True):
            unmet.append(f"{owner} requires {requirement}: the bundle has "
                         f"{name} {versions[name]}")
    return unmet


def write_requirements(out, package, pins, python_version, image):
    """Writes DIR/requirements.txt: every bundled distribution, pinned
    (usable as `-r` or as `-c`)."""
    name, version, _ = wheel_metadata(package)
    lines = [f"# The offline bundle for CPython {python_version}, manylinux x86_64 "
             "(.ci/gpu-bundle.py).",
             "# pip install --no-index --find-links DIR multigpu; these pins "
             "exactly: -r DIR/requirements.txt"]
    if image:
        lines.append(f"# From the image, not bundled: {', '.join(image)}")
    lines.append(f"{name}=={version}")
    lines += [f"{n}=={v}" for n, v in sorted(pins.items())]
    (out / "requirements.txt").write_text("\n".join(lines) + "\n")


def mib(size):
    """Bytes in MiB."""
    return size / 2**20


def listing(out, jax_names):
    """Prints the bundle's files and sizes; returns the MiB that count.

    The wheels of `jax_names` (`--with-jax`) are summed apart: the limit
    is on what goes beside the image.
    """
    counted = extra = 0
    for path in sorted(out.iterdir()):
        size = path.stat().st_size
        is_jax = path.suffix == ".whl" and normalized(path.name.split("-")[0]) in jax_names
        extra += size if is_jax else 0
        counted += 0 if is_jax else size
        print(f"{mib(size):8.2f} MiB  {path.name}{'  (--with-jax)' if is_jax else ''}")
    print(f"{mib(counted):8.2f} MiB  in all" + (
        f", and {mib(extra):.2f} MiB of --with-jax wheels" if extra else ""))
    return mib(counted)


def clear(out):
    """Empties what an earlier run wrote (its wheels and pins) from `out`:
    a wheel for another Python version left there would be a second
    candidate for the node's pip."""
    out.mkdir(parents=True, exist_ok=True)
    for path in [*out.glob("*.whl"), out / "requirements.txt"]:
        path.unlink(missing_ok=True)


def main(argv=None):
    """Builds the bundle the command line asks for; returns the exit status."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--python-version", required=True,
                        help="the node's CPython minor version, e.g. 3.12")
    parser.add_argument("--out", required=True, type=pathlib.Path,
                        help="the bundle's folder (its wheels are replaced)")
    parser.add_argument("--with-jax", action="store_true",
                        help="bundle CPU JAX, jaxlib, NumPy and their dependencies too")
    parser.add_argument("--glibc", default=GLIBC,
                        help=f"the node's oldest glibc to target (default {GLIBC})")
    parser.add_argument("--max-mib", type=float, default=MAX_MIB,
                        help=f"the limit, without --with-jax wheels (default {MAX_MIB})")
    options = parser.parse_args(argv)
    if not re.fullmatch(r"3\.\d+", options.python_version):
        parser.error(f"--python-version {options.python_version!r}: expected 3.N")
    out = options.out.resolve()
    clear(out)
    target = target_options(options.python_version, options.glibc)
    package = build_package(out)
    extras = ("jax",) if options.with_jax else ()
    pins = fetch(package, extras, target, out)
    # What the image holds comes along with Keras's requirements (numpy,
    # ml_dtypes): out of the bundle, so that the node's pip keeps the
    # image's builds.
    image = () if options.with_jax else tuple(n for n in IMAGE if n in pins)
    for path in out.glob("*.whl"):
        if normalized(path.name.split("-")[0]) in image:
            path.unlink()
    bundled = {n: v for n, v in pins.items() if n not in image}
    write_requirements(out, package, bundled, options.python_version, image)
    unmet = unmet_requirements(sorted(out.glob("*.whl")), extras,
                               options.python_version, set(IMAGE) - set(bundled))
    total = listing(out, set(IMAGE) if options.with_jax else set())
    if unmet:
        sys.exit("gpu-bundle: the bundle is not closed for CPython "
                 f"{options.python_version}:\n  " + "\n  ".join(unmet))
    if total > options.max_mib:
        sys.exit(f"gpu-bundle: the bundle is {total:.2f} MiB, over the limit of "
                 f"{options.max_mib:g} MiB")
    if options.with_jax:
        print(f"On the node: pip install --no-index --find-links {out} 'multigpu[jax]'")
    else:
        print(f"On the node: pip install --no-index --find-links {out} multigpu "
              f"(beside the image's {', '.join(IMAGE)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
